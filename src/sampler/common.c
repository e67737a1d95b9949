/* The sampler object every family shares: the split of an epoch's global batches across ranks,
 * the resumable state, and the building blocks (stream keys, the keyed Feistel bijection, the
 * alias method). Written here rather than taken from a library because the samplers are the
 * product: their orders must be pure functions of (seed, epoch, position) and stable across
 * releases, which no general-purpose RNG library promises. */
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

/* ---- hashing --------------------------------------------------------------------------------- */

uint64_t
zb__stream_key(uint64_t seed, uint64_t epoch, uint64_t tag, uint64_t a, uint64_t b)
{
    /* A chain of splitmix64 steps, each absorbing one word; the distinct increments keep
     * (seed, epoch) = (x, y) apart from (y, x). */
    uint64_t h = zb__mix64(seed + 0x9e3779b97f4a7c15ULL);
    h = zb__mix64(h ^ (epoch + 0x6a09e667f3bcc909ULL));
    h = zb__mix64(h ^ (tag + 0xbb67ae8584caa73bULL));
    h = zb__mix64(h ^ (a + 0x3c6ef372fe94f82bULL));
    h = zb__mix64(h ^ (b + 0xa54ff53a5f1d36f1ULL));
    return h;
}

/* ---- keyed bijection ----------------------------------------------------------------------- */

void
zb__perm_init(zb__perm *p, uint64_t n, uint64_t key)
{
    unsigned half = 1;
    /* smallest half with 4^half >= n; half = 32 covers all of uint64 */
    while (half < 32 && (n - 1) >> (2 * half) != 0) half++;
    p->n = n;
    p->half = half;
    p->mask = half == 32 ? 0xffffffffULL : ((1ULL << half) - 1);
    uint64_t x = key;
    for (int i = 0; i < ZB_PERM_ROUNDS; i++) p->keys[i] = zb__splitmix64(&x);
}

static uint64_t
feistel_forward(const zb__perm *p, uint64_t x)
{
    uint64_t l = x >> p->half, r = x & p->mask;
    for (int i = 0; i < ZB_PERM_ROUNDS; i++) {
        uint64_t f = zb__mix64(r ^ p->keys[i]) & p->mask;
        uint64_t t = l ^ f;
        l = r;
        r = t;
    }
    return (l << p->half) | r;
}

static uint64_t
feistel_backward(const zb__perm *p, uint64_t y)
{
    uint64_t l = y >> p->half, r = y & p->mask;
    for (int i = ZB_PERM_ROUNDS - 1; i >= 0; i--) {
        uint64_t f = zb__mix64(l ^ p->keys[i]) & p->mask;
        uint64_t t = r ^ f;
        r = l;
        l = t;
    }
    return (l << p->half) | r;
}

uint64_t
zb__perm_apply(const zb__perm *p, uint64_t x)
{
    if (p->n <= 1) return 0;
    /* Cycle walking: the network permutes [0, 4^half); following x's cycle until it re-enters
     * [0, n) yields a permutation of [0, n). */
    do x = feistel_forward(p, x);
    while (x >= p->n);
    return x;
}

/* Four network passes side by side: independent chains the CPU overlaps (one pass is a
 * chain of 12 dependent multiplies). */
static void
feistel_forward4(const zb__perm *p, uint64_t *v)
{
    uint64_t l0 = v[0] >> p->half, r0 = v[0] & p->mask, l1 = v[1] >> p->half, r1 = v[1] & p->mask;
    uint64_t l2 = v[2] >> p->half, r2 = v[2] & p->mask, l3 = v[3] >> p->half, r3 = v[3] & p->mask;
    for (int i = 0; i < ZB_PERM_ROUNDS; i++) {
        uint64_t key = p->keys[i], m = p->mask;
        uint64_t t0 = l0 ^ (zb__mix64(r0 ^ key) & m), t1 = l1 ^ (zb__mix64(r1 ^ key) & m);
        uint64_t t2 = l2 ^ (zb__mix64(r2 ^ key) & m), t3 = l3 ^ (zb__mix64(r3 ^ key) & m);
        l0 = r0, l1 = r1, l2 = r2, l3 = r3;
        r0 = t0, r1 = t1, r2 = t2, r3 = t3;
    }
    v[0] = (l0 << p->half) | r0;
    v[1] = (l1 << p->half) | r1;
    v[2] = (l2 << p->half) | r2;
    v[3] = (l3 << p->half) | r3;
}

void
zb__perm_apply_run(const zb__perm *p, uint64_t x0, size_t n, uint64_t *out)
{
    size_t i = 0;
    if (p->n > 1)
        for (; i + 4 <= n; i += 4) {
            uint64_t v[4] = {x0 + i, x0 + i + 1, x0 + i + 2, x0 + i + 3};
            feistel_forward4(p, v);
            for (int k = 0; k < 4; k++) {
                while (v[k] >= p->n) v[k] = feistel_forward(p, v[k]); /* the cycle walk */
                out[i + k] = v[k];
            }
        }
    for (; i < n; i++) out[i] = zb__perm_apply(p, x0 + i);
}

uint64_t
zb__perm_invert(const zb__perm *p, uint64_t y)
{
    if (p->n <= 1) return 0;
    do y = feistel_backward(p, y);
    while (y >= p->n);
    return y;
}

/* ---- alias method ---------------------------------------------------------------------------- */

void
zb__alias_build_into(double *prob, uint64_t *alias, uint64_t *scratch, const double *w, uint64_t k)
{
    double total = 0;
    for (uint64_t i = 0; i < k; i++) total += w[i];
    if (!(total > 0)) {
        /* a block without weight is never drawn; keep its table well-formed */
        for (uint64_t i = 0; i < k; i++) {
            prob[i] = 1.0;
            alias[i] = i;
        }
        return;
    }
    /* Vose: prob[] first holds the scaled weights k w_i / W; `small` grows up from the front
     * of scratch, `large` down from the back (each index sits in at most one of them). */
    uint64_t ns = 0, nl = 0;
    double scale = (double)k / total;
    for (uint64_t i = 0; i < k; i++) {
        prob[i] = w[i] * scale;
        alias[i] = i;
        if (prob[i] < 1.0)
            scratch[ns++] = i;
        else
            scratch[k - 1 - nl++] = i;
    }
    while (ns > 0 && nl > 0) {
        uint64_t s = scratch[--ns];
        uint64_t g = scratch[k - nl];
        nl--;
        alias[s] = g; /* prob[s] keeps its scaled weight */
        prob[g] = (prob[g] + prob[s]) - 1.0;
        if (prob[g] < 1.0)
            scratch[ns++] = g;
        else
            scratch[k - 1 - nl++] = g;
    }
    /* leftovers are 1 up to rounding */
    while (nl > 0) prob[scratch[k - nl--]] = 1.0;
    while (ns > 0) prob[scratch[--ns]] = 1.0;
}

zb_status
zb__alias_build(zb__alias *a, const double *w, uint64_t k)
{
    memset(a, 0, sizeof *a);
    if (k == 0 || k > SIZE_MAX / sizeof(double))
        return zb__err(ZB_E_OVERFLOW, "alias table of %llu entries", (unsigned long long)k);
    uint64_t *scratch = malloc((size_t)k * sizeof *scratch);
    a->prob = malloc((size_t)k * sizeof *a->prob);
    a->alias = malloc((size_t)k * sizeof *a->alias);
    if (!scratch || !a->prob || !a->alias) {
        free(scratch);
        zb__alias_free(a);
        return zb__err(ZB_E_NOMEM, "alias table of %llu entries", (unsigned long long)k);
    }
    a->k = k;
    zb__alias_build_into(a->prob, a->alias, scratch, w, k);
    free(scratch);
    return ZB_OK;
}

void
zb__alias_free(zb__alias *a)
{
    free(a->prob);
    free(a->alias);
    memset(a, 0, sizeof *a);
}

/* ---- the sampler object ---------------------------------------------------------------------- */

uint64_t
zb__sampler_batches_for(uint64_t total, uint64_t b, bool drop_last)
{
    return drop_last ? total / b : total / b + (total % b != 0);
}

zb_status
zb__sampler_create(const zb_sampler_opts *opts, const zb__sampler_ops *ops, void *impl,
                   uint64_t global_batches, size_t max_batch, zb_sampler **out)
{
    zb_status st;
    zb_sampler *s = NULL;
    *out = NULL;
    if (opts->world_size < 1) {
        st = zb__err(ZB_E_INVALID, "%s sampler: world_size must be >= 1", ops->name);
        goto fail;
    }
    if (opts->rank >= opts->world_size) {
        st = zb__err(ZB_E_INVALID, "%s sampler: rank %u is not below world_size %u", ops->name,
                     opts->rank, opts->world_size);
        goto fail;
    }
    if (opts->pad_or_drop != ZB_SAMPLER_PAD && opts->pad_or_drop != ZB_SAMPLER_DROP) {
        st = zb__err(ZB_E_INVALID, "%s sampler: pad_or_drop %d is neither PAD nor DROP", ops->name,
                     (int)opts->pad_or_drop);
        goto fail;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        st = zb__err(ZB_E_NOMEM, "%s sampler", ops->name);
        goto fail;
    }
    s->ops = ops;
    s->impl = impl;
    s->n = opts->n;
    s->batch_size = opts->batch_size;
    s->drop_last = opts->drop_last;
    s->seed = opts->seed;
    s->rank = opts->rank;
    s->world = opts->world_size;
    s->uneven = opts->pad_or_drop;
    s->global_batches = global_batches;
    s->max_batch = max_batch;
    if (ops->plan_epoch && (st = ops->plan_epoch(s)) != ZB_OK) {
        s->impl = NULL;
        free(s);
        goto fail;
    }
    *out = s;
    return ZB_OK;
fail:
    if (impl && ops->destroy) ops->destroy(impl);
    return st;
}

/* Checks what every sampler whose batches are cut from an n-long stream needs. */
zb_status
zb__sampler_check_stream(const char *name, const zb_sampler_opts *opts)
{
    if (!opts) return zb__err(ZB_E_INVALID, "%s sampler: NULL options", name);
    if (opts->batch_size < 1)
        return zb__err(ZB_E_INVALID, "%s sampler: batch_size must be >= 1", name);
    if (opts->batch_size > SIZE_MAX / sizeof(uint64_t))
        return zb__err(ZB_E_OVERFLOW, "%s sampler: batch_size %llu is too large", name,
                       (unsigned long long)opts->batch_size);
    return ZB_OK;
}

static uint64_t
per_rank(const zb_sampler *s, uint64_t global)
{
    return s->uneven == ZB_SAMPLER_DROP ? global / s->world
                                        : global / s->world + (global % s->world != 0);
}

size_t
zb_sampler_max_batch(const zb_sampler *s)
{
    return s ? s->max_batch : 0;
}

uint64_t
zb_sampler_num_batches(const zb_sampler *s)
{
    return s ? per_rank(s, s->global_batches) : 0;
}

uint64_t
zb_sampler_remaining(const zb_sampler *s)
{
    if (!s || s->base >= s->global_batches) return 0;
    uint64_t total = per_rank(s, s->global_batches - s->base);
    return total > s->done ? total - s->done : 0;
}

uint64_t
zb_sampler_epoch_batches(const zb_sampler *s)
{
    return s ? s->global_batches : 0;
}

uint64_t
zb_sampler_len(const zb_sampler *s)
{
    return s ? s->n : 0;
}

zb_status
zb_sampler_next(zb_sampler *s, uint64_t *ids, size_t cap, size_t *n)
{
    if (n) *n = 0;
    if (!s || !ids || !n) return zb__err(ZB_E_INVALID, "zb_sampler_next: NULL argument");
    if (cap < s->max_batch)
        return zb__err(ZB_E_INVALID, "zb_sampler_next: cap %zu is below max_batch %zu", cap,
                       s->max_batch);
    while (zb_sampler_remaining(s) > 0) {
        /* this rank's done-th batch since base; past the end, pad from the epoch start */
        uint64_t g = s->base + s->rank + s->done * s->world;
        if (g >= s->global_batches) g = (g - s->global_batches) % s->global_batches;
        size_t got = 0;
        ZB_TRY(s->ops->batch(s, g, ids, &got));
        s->done++;
        if (s->ops->filter) got = s->ops->filter(s, ids, got);
        if (got > 0) {
            *n = got;
            return ZB_OK;
        }
        /* every id of the batch went out as a replacement: skip it */
    }
    return ZB_OK;
}

static zb_status
restart(zb_sampler *s, uint64_t seed, uint64_t epoch, uint64_t position)
{
    uint64_t old_seed = s->seed, old_epoch = s->epoch;
    s->seed = seed;
    s->epoch = epoch;
    if (s->ops->plan_epoch) {
        zb_status st = s->ops->plan_epoch(s);
        if (st != ZB_OK) {
            /* keep the old epoch usable: plan it again (its memory was already there) */
            s->seed = old_seed;
            s->epoch = old_epoch;
            (void)s->ops->plan_epoch(s);
            return st;
        }
    }
    if (s->ops->reset) s->ops->reset(s);
    s->base = position;
    s->done = 0;
    return ZB_OK;
}

zb_status
zb_sampler_set_epoch(zb_sampler *s, uint64_t epoch)
{
    if (!s) return zb__err(ZB_E_INVALID, "zb_sampler_set_epoch: NULL sampler");
    return restart(s, s->seed, epoch, 0);
}

void
zb_sampler_get_state(const zb_sampler *s, zb_sampler_state *st)
{
    if (!s || !st) return;
    st->seed = s->seed;
    st->epoch = s->epoch;
    st->position = s->base + s->done * s->world;
}

zb_status
zb_sampler_restore(zb_sampler *s, const zb_sampler_state *st)
{
    if (!s || !st) return zb__err(ZB_E_INVALID, "zb_sampler_restore: NULL argument");
    return restart(s, st->seed, st->epoch, st->position);
}

void
zb_sampler_free(zb_sampler *s)
{
    if (!s) return;
    if (s->ops->destroy) s->ops->destroy(s->impl);
    free(s);
}
