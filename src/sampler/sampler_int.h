/* Internals shared by the sampler families: the sampler object, the hashing and keyed
 * bijection every family builds on, and the alias method. */
#ifndef ZB_SAMPLER_INT_H
#define ZB_SAMPLER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"
#include "zbatch_sampler.h"

/* Stream tags: every random quantity is keyed by (seed, epoch, tag, ...) so that two uses never
 * share a stream. Values are part of the output contract (changing one changes orders). */
enum {
    ZB_TAG_RANDOM = 1,    /* random sampler's permutation */
    ZB_TAG_BLOCKS = 2,    /* block order */
    ZB_TAG_WINDOW = 3,    /* rows inside a block window */
    ZB_TAG_DRAW = 4,      /* weighted draws */
    ZB_TAG_COIN = 5,      /* alias coin flips */
    ZB_TAG_RUN = 6,       /* weighted block-run choice */
    ZB_TAG_PACK = 7,      /* size-aware sample order */
    ZB_TAG_BINS = 8,      /* size-aware batch order inside a window */
    ZB_TAG_CHILD = 9,     /* multi-dataset child permutations */
    ZB_TAG_CHILDRAW = 10, /* multi-dataset draws with replacement */
    ZB_TAG_BATCH = 11,    /* multi-dataset shuffle inside a batch */
    ZB_TAG_CONVERT = 12,  /* zbatch convert: the cells' positions in the output */
    ZB_TAG_MIX = 13,      /* multi-dataset per-sample mixing: stream order, child draws */
    ZB_TAG_PACKWIN = 14,  /* size-aware with blocks: samples inside a window */
};

typedef struct zb__sampler_ops {
    const char *name;
    /* Recomputes per-epoch data after seed/epoch changed (and updates s->global_batches when
     * it depends on the epoch); NULL when nothing depends on them. */
    zb_status (*plan_epoch)(zb_sampler *s);
    /* Fills ids with global batch g (< s->global_batches); *n its size. Pure in (seed, epoch,
     * g) apart from caches. */
    zb_status (*batch)(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n);
    /* Optional: removes ids that were used otherwise (replacements); returns the new count. */
    size_t (*filter)(zb_sampler *s, uint64_t *ids, size_t n);
    /* Optional: forgets per-epoch extras (replacement index) on set_epoch / restore. */
    void (*reset)(zb_sampler *s);
    void (*destroy)(void *impl);
} zb__sampler_ops;

struct zb_sampler {
    const zb__sampler_ops *ops;
    void *impl;
    uint64_t n;
    uint64_t batch_size;
    bool drop_last;
    uint64_t seed;
    uint64_t epoch;
    uint32_t rank, world;
    zb_sampler_uneven uneven;
    uint64_t global_batches; /* G of the current epoch */
    size_t max_batch;
    uint64_t base; /* global position the epoch was (re)started at */
    uint64_t done; /* local batches taken since base */
};

/* Validates the common options, allocates the sampler around `impl` and plans epoch 0. On
 * failure destroys impl (ops->destroy) and sets *out = NULL. */
zb_status zb__sampler_create(const zb_sampler_opts *opts, const zb__sampler_ops *ops, void *impl,
                             uint64_t global_batches, size_t max_batch, zb_sampler **out);

/* Checks the options of a sampler whose batches are cut from a stream (batch_size >= 1 and
 * small enough for size_t arrays). */
zb_status zb__sampler_check_stream(const char *name, const zb_sampler_opts *opts);

/* ceil(total / b), or floor with drop_last. */
uint64_t zb__sampler_batches_for(uint64_t total, uint64_t b, bool drop_last);

/* ---- hashing --------------------------------------------------------------------------------- */

/* The splitmix64 finaliser: a bijective 64-bit mixer. */
static inline uint64_t
zb__mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

/* The next output of a splitmix64 generator with state *x. */
static inline uint64_t
zb__splitmix64(uint64_t *x)
{
    *x += 0x9e3779b97f4a7c15ULL;
    return zb__mix64(*x);
}

/* A key for stream (seed, epoch, tag, a, b): every argument changes it. */
uint64_t zb__stream_key(uint64_t seed, uint64_t epoch, uint64_t tag, uint64_t a, uint64_t b);

/* A 64-bit hash of (key, x), for per-position draws. */
static inline uint64_t
zb__hash2(uint64_t key, uint64_t x)
{
    return zb__mix64(zb__mix64(key ^ (x * 0x9e3779b97f4a7c15ULL)) + x);
}

/* floor(u * n / 2^64): maps a uniform 64-bit word onto [0, n) (bias <= n / 2^64). */
static inline uint64_t
zb__bounded(uint64_t u, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)u * n) >> 64);
}

/* A uniform double in [0, 1) from the top 53 bits. */
static inline double
zb__unit(uint64_t u)
{
    return (double)(u >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- keyed bijection ----------------------------------------------------------------------- */

#define ZB_PERM_ROUNDS 6

/* A permutation of [0, n): a balanced Feistel network over [0, 4^half) (the smallest power of
 * 4 >= n, at least 4) with cycle walking. O(1) memory, expected < 4 network passes per call. */
typedef struct zb__perm {
    uint64_t n;
    unsigned half; /* bits per half, 1..32 */
    uint64_t mask;
    uint64_t keys[ZB_PERM_ROUNDS];
} zb__perm;

void zb__perm_init(zb__perm *p, uint64_t n, uint64_t key);
/* The image of x (< n). */
uint64_t zb__perm_apply(const zb__perm *p, uint64_t x);
/* out[i] = zb__perm_apply(p, x0 + i) for i < n, a few at a time (x0 + n <= p->n). */
void zb__perm_apply_run(const zb__perm *p, uint64_t x0, size_t n, uint64_t *out);
/* The preimage of y (< n): zb__perm_invert(p, zb__perm_apply(p, x)) == x. */
uint64_t zb__perm_invert(const zb__perm *p, uint64_t y);

/* ---- alias method ---------------------------------------------------------------------------- */

/* Vose's alias table over k outcomes. */
typedef struct zb__alias {
    uint64_t k;
    double *prob;    /* [k] acceptance probability of column j */
    uint64_t *alias; /* [k] the other outcome of column j */
} zb__alias;

/* Builds the table for weights w[0..k) (finite, >= 0, positive sum: checked by the caller).
 * ZB_E_NOMEM on failure. */
zb_status zb__alias_build(zb__alias *a, const double *w, uint64_t k);
/* Builds into caller storage prob/alias of k entries (no allocation besides a scratch
 * stack); used for per-block tables. `scratch` has room for k entries. */
void zb__alias_build_into(double *prob, uint64_t *alias, uint64_t *scratch, const double *w,
                          uint64_t k);
/* Draws an outcome from two independent uniform words. */
static inline uint64_t
zb__alias_draw(const double *prob, const uint64_t *alias, uint64_t k, uint64_t u1, uint64_t u2)
{
    uint64_t j = zb__bounded(u1, k);
    return zb__unit(u2) < prob[j] ? j : alias[j];
}
void zb__alias_free(zb__alias *a);

#endif
