/* Batch internals shared by the reader and the loader. */
#ifndef ZB_DATASET_BATCH_H
#define ZB_DATASET_BATCH_H

#include "zbatch.h"
#include "zbatch_loader.h"

/* A slice (view) of batches [b0, b1) of `whole` (a read_many result): its fields point into whole's
 * buffers, its segment pointers and index fields are re-based to start at 0, and it holds a
 * reference to whole's buffers, which live until whole and every view of it are freed. Index
 * field values are re-based in place (views of one batch cover disjoint rows). */
zb_status zb__batch_slice(zb_batch *whole, size_t b0, size_t b1, zb_batch **out);

/* zb_dataset_read_many of ids[0..n), read as `nbatches` consecutive batches of sizes[k]
 * samples (adding up to n; nbatches 0 = one batch): index fields are re-based to each batch,
 * so zb__batch_slice of exactly those batches leaves their values as they are (the loader's
 * windows: one pass over the index values instead of two). */
zb_status zb__dataset_read_batches(zb_dataset *ds, const uint64_t *ids, size_t n,
                                   const size_t *sizes, size_t nbatches, zb_batch **out);

/* The largest sample i with ptr[i] <= row (ptr: a batch pointer of n samples, ascending, row <
 * ptr[n]): the sample holding batch row `row` (empty samples are skipped over). */
static inline size_t
zb__sample_of(const int64_t *ptr, size_t n, uint64_t row)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)ptr[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Columns of the anndata X behind the batch (0 if none). */
uint64_t zb__batch_n_vars(const zb_batch *b);

/* Adds a per-sample field of `nrows` rows of `row_shape` whose buffer (64-byte aligned; zeroed
 * when `zero`, else left as found: the caller writes every byte) comes from the batch memory
 * pool of the dataset the batch was read from, so a transform that
 * makes a new multi-megabyte field per batch reuses memory touched before instead of faulting
 * in fresh pages every batch (one pooled buffer per batch; later ones are calloc'd). *data is
 * the buffer, owned by the batch. */
zb_status zb__batch_add_pooled_field(zb_batch *b, const char *name, zb_dtype dtype, int ndim,
                                     const uint64_t *row_shape, uint64_t nrows, bool zero,
                                     void **data);

/* Runs one transform on a batch (transforms.c). */
zb_status zb__transform_apply(const zb_transform *t, zb_batch *b);

#endif
