/* Validation on the read path (validate.c): what a request checks of the stored values it
 * delivers, lazily, as each batch is assembled (never a scan at open), and the skipping of bad
 * samples (zb_dataset_opts.on_invalid). docs/ERRORS.md "Invalid data" is the user's view. */
#ifndef ZB_DATASET_VALIDATE_H
#define ZB_DATASET_VALIDATE_H

#include "zbatch.h"

typedef struct zb__arena_pool zb__arena_pool; /* dataset.h */

/* Adds the bytes of one field of a request (rows x row_elems values of itemsize bytes, rounded
 * up to 64) to *need, refusing a request over the dataset's per-request cap
 * (zb_dataset_opts.max_request_bytes; ZB_E_INVALID naming the field and the cap) before any of
 * it is allocated; the products are overflow-checked. */
zb_status zb__request_bytes_add(const zb_dataset *ds, const char *field, uint64_t rows,
                                uint64_t row_elems, size_t itemsize, size_t *need);

/* Segment s of a request of n samples: sample i (logical id ids[i], physical phys[i] of child
 * child[i]) starts at stored row start[i] and has ptr[i+1] - ptr[i] rows. Each sample's rows
 * must lie inside every field on the segment (a pointer past the values is corruption, not
 * rows to read as fill): ZB_E_CORRUPT naming the sample id, the pointer array and the field.
 * Called before the batch memory is allocated, so a pointer claiming 2^40 rows costs nothing. */
zb_status zb__validate_segment(const zb_dataset *ds, size_t s, size_t n, const uint64_t *ids,
                               const uint32_t *child, const uint64_t *phys, const int64_t *start,
                               const int64_t *ptr);

/* The values a request delivers (CSR column ids within [0, n_vars), categorical codes within
 * their categories, edge indices within their structure) are checked by the reader's tasks as
 * they land (rows.c), not here: ZB_E_CORRUPT naming the sample id, the field, the value and
 * the chunk. */

/* zb__dataset_read_batches with zb_dataset_opts.on_invalid applied: `sizes` (nbatches of them,
 * or NULL for one batch) are updated to the batch sizes delivered, less the samples skipped.
 * With ZB_ON_INVALID_SKIP, a request failing with ZB_E_CORRUPT is split in halves until the
 * bad samples are found (only a failing request pays this), then the others are read as one
 * request whose zb_read_stats.samples_skipped counts the samples left out. */
zb_status zb__dataset_read_window(zb_dataset *ds, zb__arena_pool *pool, const uint64_t *ids,
                                  size_t n, size_t *sizes, size_t nbatches, zb_batch **out);

/* The reader proper (reader.c): zb__dataset_read_batches without on_invalid, the batch's
 * memory taken from `pool` (a device loader's page-locked pool; NULL: the dataset's). */
zb_status zb__reader_read_batches(zb_dataset *ds, zb__arena_pool *pool, const uint64_t *ids,
                                  size_t n, const size_t *sizes, size_t nbatches, zb_batch **out);

/* Adds to the batch's zb_read_stats.samples_skipped (reader.c owns the batch). */
void zb__batch_count_skipped(zb_batch *b, uint64_t n);

#endif
