/* zbatch_sampler.h — part of the public C API (included by zbatch.h): samplers.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_SAMPLER_H
#define ZBATCH_SAMPLER_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Samplers: which samples, in which batches, for which rank and epoch (DESIGN.md §4).
 *
 * Purity. Every sampler's output is a pure function of (seed, epoch, rank, world_size,
 * position): there is no hidden random state, so the state a checkpoint needs is three numbers
 * (zb_sampler_state) and a restored sampler continues exactly where the saved one stopped.
 *
 * Global batches. Each epoch a sampler defines one sequence of GLOBAL batches
 * g = 0, 1, ..., G-1 (zb_sampler_epoch_batches), the same for every world size. Batches hold
 * logical sample ids in [0, n). Every batch holds at most zb_sampler_max_batch ids; all but the
 * epoch's last hold exactly batch_size unless the sampler says otherwise (size-aware).
 *
 * Ranks. Rank r of W takes global batches r, r+W, r+2W, ... Every rank yields the same number
 * of batches per epoch:
 * - ZB_SAMPLER_PAD (default): ceil(G / W) batches each; the global indices g >= G that the
 *   last ranks would take are replaced by (g - G) mod G, i.e. they repeat batches from the
 *   start of the epoch. Padding is the only source of duplicates.
 * - ZB_SAMPLER_DROP: floor(G / W) batches each; the last G mod W global batches are dropped.
 * zb_sampler_state.position counts GLOBAL batches consumed (local batches x W, plus the
 * position the sampler was restored at). Restoring that state on another world size W'
 * continues the same global sequence at that position: rank r' takes position + r',
 * position + r' + W', ... and the remaining G - position global batches are split as above,
 * so no batch of the epoch is repeated or skipped across the switch (padding aside).
 *
 * Memory. Sequential, random and block samplers use O(1) memory at any n (the random order is
 * a keyed bijection, never an n-sized array). Weighted samplers hold an O(n) alias table
 * (O(classes) + per-class index lists when class-balanced), size-aware samplers O(n) sizes,
 * multi-dataset samplers O(children).
 *
 * Thread-safety. A zb_sampler is used by one thread at a time (zb_sampler_next, set_epoch,
 * restore and request_replacement modify it). The const getters may run concurrently with each
 * other but not with a modifying call.
 *
 * Errors. Constructors return ZB_E_INVALID (with a detail message naming the option, and for
 * per-sample problems the sample id) for bad options, ZB_E_NOMEM when a table cannot be
 * allocated and ZB_E_OVERFLOW when a count does not fit 64 bits. On failure *out is NULL.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_sampler zb_sampler;

/* How the ranks even out their batch counts when W does not divide G. */
typedef enum zb_sampler_uneven {
    ZB_SAMPLER_PAD = 0,  /* ceil(G/W) per rank; the tail repeats batches from the epoch start */
    ZB_SAMPLER_DROP = 1, /* floor(G/W) per rank; the last G mod W global batches are dropped */
} zb_sampler_uneven;

/* Options every sampler takes. */
typedef struct zb_sampler_opts {
    uint64_t n;                    /* dataset length (logical samples) */
    uint64_t batch_size;           /* samples per batch, >= 1 */
    bool drop_last;                /* drop the epoch's last, short batch */
    uint64_t seed;                 /* the random key; any value */
    uint32_t rank;                 /* this process's rank, < world_size */
    uint32_t world_size;           /* number of ranks, >= 1 */
    zb_sampler_uneven pad_or_drop; /* how ranks get equal batch counts */
} zb_sampler_opts;

#define ZB_SAMPLER_OPTS_DEFAULT                                                                    \
    {                                                                                              \
        .n = 0, .batch_size = 1, .drop_last = false, .seed = 0, .rank = 0, .world_size = 1,        \
        .pad_or_drop = ZB_SAMPLER_PAD                                                              \
    }

/* A resumable position: the seed, the epoch and the GLOBAL batches consumed in it. */
typedef struct zb_sampler_state {
    uint64_t seed, epoch, position;
} zb_sampler_state;

/* ---- the interface every sampler implements ------------------------------------------------ */

/* Fills ids[0..*n) with the logical sample ids of this rank's next batch, in order, and
 * advances. *n = 0 (and ZB_OK) at the end of the epoch; call zb_sampler_set_epoch to start the
 * next one. `cap` must be >= zb_sampler_max_batch(s) (ZB_E_INVALID otherwise). On error
 * nothing advances. Not thread-safe. */
ZB_API zb_status zb_sampler_next(zb_sampler *s, uint64_t *ids, size_t cap, size_t *n);

/* The largest batch zb_sampler_next can return. */
ZB_API size_t zb_sampler_max_batch(const zb_sampler *s);

/* The batches this rank yields in a whole epoch (ceil or floor of G / world_size). */
ZB_API uint64_t zb_sampler_num_batches(const zb_sampler *s);

/* The batches this rank still yields in the current epoch (after a restore: those left of the
 * resumed epoch). */
ZB_API uint64_t zb_sampler_remaining(const zb_sampler *s);

/* G: the global batches of the current epoch (all ranks together, before padding/dropping). */
ZB_API uint64_t zb_sampler_epoch_batches(const zb_sampler *s);

/* The dataset length n the sampler draws ids from (ids are < n). */
ZB_API uint64_t zb_sampler_len(const zb_sampler *s);

/* Starts `epoch` from its beginning (position 0); any epoch number, also an earlier one.
 * Size-aware samplers pack the epoch here (O(n) time); the others do O(1) work. Errors:
 * ZB_E_NOMEM. Not thread-safe. */
ZB_API zb_status zb_sampler_set_epoch(zb_sampler *s, uint64_t epoch);

/* The current seed, epoch and global position. */
ZB_API void zb_sampler_get_state(const zb_sampler *s, zb_sampler_state *st);

/* Continues from a saved state: adopts its seed and epoch and resumes at its global position
 * (which may come from a run with another world size). A position at or past the epoch's end
 * leaves nothing to yield in this epoch. Errors: ZB_E_INVALID for a NULL state, ZB_E_NOMEM.
 * Not thread-safe. */
ZB_API zb_status zb_sampler_restore(zb_sampler *s, const zb_sampler_state *st);

/* Frees the sampler; NULL is a no-op. */
ZB_API void zb_sampler_free(zb_sampler *s);

/* ---- sequential and random ------------------------------------------------------------------ */

/* Ids 0..n-1 in order, cut into batches of batch_size. O(1) memory. */
ZB_API zb_status zb_sampler_new_sequential(const zb_sampler_opts *opts, zb_sampler **out);

/* A full permutation of 0..n-1 per epoch, different for every (seed, epoch), in O(1) memory
 * for any n up to 2^64-1: a 6-round balanced Feistel network over the smallest power of 4
 * >= n, with cycle walking back into [0, n), round keys derived from (seed, epoch) with
 * splitmix64. Construction is O(1). */
ZB_API zb_status zb_sampler_new_random(const zb_sampler_opts *opts, zb_sampler **out);

/* ---- block (annbatch / scDataset style) ---------------------------------------------------- */

/* Rows are cut into contiguous blocks of block_size (the last one may be short); the block
 * order is a random permutation per epoch (the same Feistel bijection as the random sampler)
 * of the full blocks, with a short block always last, so every window but the last is exactly
 * blocks_per_window * block_size rows (aligned with a loader reading that many per window);
 * consecutive runs of blocks_per_window blocks in that order form a window, whose rows are
 * permuted (a bijection keyed by (seed, epoch, window index)); batches are cut in order from
 * the concatenated window stream (a batch may span two windows). Every window therefore holds
 * whole blocks, and read amplification stays near 1 when block_size matches the chunking.
 *
 * Mapping from the peers:
 * - annbatch Loader(chunk_size=c, preload_nchunks=p, batch_size=B):
 *       block_size = c, blocks_per_window = p.
 * - scDataset(strategy=BlockShuffling(block_size=b), batch_size=B, fetch_factor=f):
 *       block_size = b, blocks_per_window = ceil(f * B / b) (scDataset fetches f * B rows of
 *       shuffled blocks at a time and shuffles them).
 * O(1) memory. */
typedef struct zb_block_sampler_opts {
    zb_sampler_opts base;
    uint64_t block_size;        /* contiguous rows per block, >= 1 */
    uint64_t blocks_per_window; /* blocks loaded (and shuffled) together, >= 1 */
} zb_block_sampler_opts;

#define ZB_BLOCK_SAMPLER_OPTS_DEFAULT                                                              \
    {                                                                                              \
        .base = ZB_SAMPLER_OPTS_DEFAULT, .block_size = 256, .blocks_per_window = 16                \
    }

ZB_API zb_status zb_sampler_new_block(const zb_block_sampler_opts *opts, zb_sampler **out);

/* ---- weighted, with replacement ------------------------------------------------------------- */

/* num_samples independent draws per epoch, with replacement; draw p is a pure function of
 * (seed, epoch, p). Exactly one of:
 * - weights[n]: P(i) = weights[i] / sum (finite, >= 0, positive sum). Vose's alias method:
 *   an O(n) table (16 bytes per sample), O(1) per draw.
 * - class_codes[n]: categorical codes (a negative code excludes the sample). Class c gets
 *   weight class_weights[c] (default 1) and its members share it equally, i.e. sample i has
 *   weight class_weights[c] / count(c): with the default, class-balanced sampling. An alias
 *   table over classes (O(classes)) picks the class, then a uniform member of its index list.
 * With block_size > 0 (block locality), the draws come in runs of block_draws consecutive
 * positions from one block: a run picks a block b with probability W_b / W (W_b the block's
 * total weight), then each draw of the run picks a row inside b with probability
 * w_i / W_b, so each draw's marginal is still w_i / W. (Uses per-block alias tables, O(n).)
 * The arrays are copied; the caller keeps ownership. Batches: ceil(num_samples / batch_size)
 * (floor with drop_last). */
typedef struct zb_weighted_sampler_opts {
    zb_sampler_opts base;        /* base.n = length of weights / class_codes */
    const double *weights;       /* [n] per-sample weights, or NULL */
    const int64_t *class_codes;  /* [n] per-sample class codes, or NULL */
    const double *class_weights; /* [num_class_weights] weight per class, or NULL (all 1) */
    size_t num_class_weights;    /* must cover every code used when class_weights is set */
    uint64_t num_samples;        /* draws per epoch; 0 = n */
    uint64_t block_size;         /* 0 = no block locality */
    uint64_t block_draws;        /* consecutive draws from one block; 0 = block_size */
} zb_weighted_sampler_opts;

#define ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT                                                           \
    {                                                                                              \
        .base = ZB_SAMPLER_OPTS_DEFAULT, .weights = NULL, .class_codes = NULL,                     \
        .class_weights = NULL, .num_class_weights = 0, .num_samples = 0, .block_size = 0,          \
        .block_draws = 0                                                                           \
    }

ZB_API zb_status zb_sampler_new_weighted(const zb_weighted_sampler_opts *opts, zb_sampler **out);

/* ---- size-aware (bin packing) --------------------------------------------------------------- */

/* Batches packed under per-batch limits, as a GUARANTEE: a batch never holds more than
 * base.batch_size samples (max_batch_size), and for every limit that is set (> 0) the sum of
 * its per-sample sizes over the batch never exceeds it. A sample whose size alone exceeds a
 * limit fails construction with ZB_E_INVALID naming the sample id, its size and the limit.
 *
 * Order: each epoch, the samples are permuted (the random sampler's bijection; identity with
 * shuffle = false) and the permuted stream is cut into windows of window_size samples. Each
 * window is packed twice by first fit (each sample goes to the first of the 64 most recently
 * opened batches of the window that has room, else opens a new batch): once in the permuted
 * order and once in decreasing size (a sample's largest size relative to its limit, ties by
 * id: first-fit decreasing); the packing with fewer batches is kept (ties: the permuted one).
 * The permuted order mixes large and small samples and wins when max_batch_size binds, FFD
 * wins when a size limit binds. The window's batches are then put in a random order keyed by
 * (seed, epoch, window). So batches are pure functions of
 * (seed, epoch, window) and only windows, never the whole epoch, are held in memory; the
 * epoch's batch count is found when the epoch is set (O(n) time). Every sample appears in
 * exactly one batch per epoch. base.drop_last is ignored.
 *
 * The size arrays are copied (8 bytes per sample per limit that is set); the caller keeps
 * ownership. An array may be NULL only when its limit is 0 (not set). */
typedef struct zb_size_sampler_opts {
    zb_sampler_opts base;      /* base.batch_size is max_batch_size */
    const uint64_t *num_atoms; /* [n] or NULL */
    uint64_t max_atoms;        /* 0 = no limit */
    const uint64_t *num_edges; /* [n] or NULL */
    uint64_t max_edges;        /* 0 = no limit */
    const uint64_t *nnz;       /* [n] or NULL */
    uint64_t max_nnz;          /* 0 = no limit */
    uint64_t window_size;      /* samples packed together, >= 1 */
    bool shuffle;              /* permute the samples each epoch */
    /* 0: the samples are permuted one by one. K >= 1 (chunk-aware): the epoch permutes blocks
     * of K consecutive ids (a short last block always goes last), windows hold whole blocks
     * (window_size rounded up to a multiple of K) and the samples of a window are permuted
     * before packing. With K the samples per stored chunk, each window touches about
     * window_size / K + 1 chunks per field, so a loader window holding a sampler window decodes
     * each chunk about once: the trade annbatch's block shuffling makes (docs/SAMPLERS.md). */
    uint64_t block_size;
} zb_size_sampler_opts;

#define ZB_SIZE_SAMPLER_OPTS_DEFAULT                                                               \
    {                                                                                              \
        .base = ZB_SAMPLER_OPTS_DEFAULT, .num_atoms = NULL, .max_atoms = 0, .num_edges = NULL,     \
        .max_edges = 0, .nnz = NULL, .max_nnz = 0, .window_size = 8192, .shuffle = true,           \
        .block_size = 0                                                                            \
    }

ZB_API zb_status zb_sampler_new_size_aware(const zb_size_sampler_opts *opts, zb_sampler **out);

/* Inflight batching for dynamics loops (nvalchemi's SizeAwareSampler.request_replacement):
 * finds a sample of this epoch that this rank has not yet used and that fits the room, i.e.
 * num_atoms <= room_atoms and num_edges <= room_edges (a dimension the sampler has no sizes
 * for is not checked; nnz is not checked). Among the fitting samples it returns one with the
 * most atoms (then edges). "Not yet used" means: in one of this rank's batches of the epoch
 * that zb_sampler_next has not yet returned, and not returned by an earlier replacement; a
 * sample taken here is then left out of the batch zb_sampler_next would have returned it in
 * (a batch left empty is skipped), so every sample is still used at most once per epoch per
 * rank. The first call of an epoch builds an index of the rank's remaining samples (O(m log m)
 * time, 16 bytes per remaining sample plus n/4 bytes). Replacements are not part of
 * zb_sampler_state: set_epoch and restore forget them. *found = false (ZB_OK) when nothing fits.
 * ZB_E_TYPE if `s` is not a size-aware sampler. Not thread-safe. */
ZB_API zb_status zb_sampler_request_replacement(zb_sampler *s, uint64_t room_atoms,
                                                uint64_t room_edges, uint64_t *id, bool *found);

/* ---- multi-dataset -------------------------------------------------------------------------- */

/* How many batches an epoch of a multi-dataset sampler in BATCH mode has when num_batches is
 * 0 (nvalchemi's MultiDatasetBatchSampler). Over the children with c_i > 0 (the samples per
 * batch of child i, below), m_i = ceil(n_i / c_i) with replacement, floor(n_i / c_i) without:
 * - DATASET_SIZE: ceil(sum of n_i / batch_size) with replacement, min m_i without;
 * - MIN_SIZE:     min m_i (the epoch ends when the first child is used up);
 * - MAX_SIZE:     max m_i, oversampling the smaller children; without replacement an error
 *                 (ZB_E_INVALID) unless every m_i is equal.
 * Without replacement an epoch of more than min m_i batches (given or derived) is an error, and
 * so is an epoch of 0 batches (a child holds fewer samples than its c_i). */
typedef enum zb_epoch_policy {
    ZB_EPOCH_DATASET_SIZE = 0,
    ZB_EPOCH_MIN_SIZE = 1,
    ZB_EPOCH_MAX_SIZE = 2,
} zb_epoch_policy;

/* The two semantics of nvalchemi's multi-dataset samplers. */
typedef enum zb_multi_mode {
    ZB_MULTI_BATCH = 0,  /* MultiDatasetBatchSampler: a fixed composition in every batch */
    ZB_MULTI_SAMPLE = 1, /* MultiDatasetSampler: the child chosen per sample */
} zb_multi_mode;

/* Several datasets ("children", of lengths child_sizes[i]) behind one id space: ids are
 * global, child offset + local id, with the children concatenated in order.
 *
 * Rates: ratios[i] (finite, >= 0, positive sum), balanced (1 for every child), or neither
 * (rates proportional to child_sizes, nvalchemi's default); a child with a positive rate and no
 * samples is an error. Rates become integer counts by largest remainder (floor, then one more
 * to the largest fractional parts, ties to the lower child index).
 *
 * ZB_MULTI_BATCH: every batch has c_i samples from child i, sum c_i = batch_size: counts[i]
 * exactly (which must sum to batch_size), or the rates apportioned over batch_size. The epoch
 * has num_batches batches, or as epoch_policy says (above); every batch is full. Batch g takes
 * positions [g c_i, (g+1) c_i) of child i's stream: with replacement and shuffle independent
 * uniform draws; without replacement one permutation of the child per epoch (keyed by seed,
 * epoch, child), never exhausted; without shuffle 0, 1, ... (cycled with replacement). With
 * shuffle the samples of each batch are shuffled.
 *
 * ZB_MULTI_SAMPLE: an epoch of S = num_samples ids (0: the sum of child_sizes), cut into batches
 * of batch_size (the last one short, dropped with drop_last); counts must be NULL. With
 * replacement and shuffle each id draws its child by rate and a uniform local id. Otherwise
 * the epoch holds exactly S_i ids of child i (the rates apportioned over S) in random order,
 * distinct without replacement (S_i > n_i is then an error), the local ids 0, 1, ... cycled
 * without shuffle (nvalchemi's order exactly: all of child 0, then child 1, ...).
 *
 * Any batch is computed directly from (seed, epoch, batch): O(children) memory, exact resume.
 * The arrays are copied. */
typedef struct zb_multi_sampler_opts {
    zb_sampler_opts base;         /* base.n is ignored (the sum of child_sizes) */
    size_t num_children;          /* >= 1 */
    const uint64_t *child_sizes;  /* [num_children] */
    zb_multi_mode mode;           /* BATCH or SAMPLE */
    const uint64_t *counts;       /* BATCH: [num_children] samples per batch, or NULL */
    const double *ratios;         /* [num_children] or NULL */
    bool balanced;                /* equal rates */
    zb_epoch_policy epoch_policy; /* BATCH: used when num_batches is 0 */
    uint64_t num_batches;         /* BATCH: batches per epoch; 0 = from epoch_policy */
    uint64_t num_samples;         /* SAMPLE: ids per epoch; 0 = sum of child_sizes */
    bool replacement;             /* local samples may repeat within an epoch */
    bool shuffle;                 /* random local order (and batch order) */
} zb_multi_sampler_opts;

#define ZB_MULTI_SAMPLER_OPTS_DEFAULT                                                              \
    {                                                                                              \
        .base = ZB_SAMPLER_OPTS_DEFAULT, .num_children = 0, .child_sizes = NULL,                   \
        .mode = ZB_MULTI_BATCH, .counts = NULL, .ratios = NULL, .balanced = false,                 \
        .epoch_policy = ZB_EPOCH_DATASET_SIZE, .num_batches = 0, .num_samples = 0,                 \
        .replacement = true, .shuffle = true                                                       \
    }

ZB_API zb_status zb_sampler_new_multi(const zb_multi_sampler_opts *opts, zb_sampler **out);

/* The per-batch sample counts c_i of a multi-dataset sampler: writes min(cap, children) of them
 * to counts and returns the number of children (0 if `s` is not a multi-dataset sampler). */
ZB_API size_t zb_sampler_child_counts(const zb_sampler *s, uint64_t *counts, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
