/* The chunk objects an array has in its store, found by listing (stored.c). */
#ifndef ZB_VERIFY_STORED_H
#define ZB_VERIFY_STORED_H

#include "zbatch.h"

struct zb_array;

/* The grid coordinates of every chunk object of array `a` (each chunk, or each shard of a
 * sharded array) that exists in `store`, ascending in C order: *coords holds *n rows of
 * a->meta.ndim values (free with free(); NULL when none). Found by listing the array's keys,
 * so the work is bounded by what is stored, not by the declared grid (an array of shape
 * [2^62] with one chunk stored costs one listing). Keys that are not this array's chunk keys
 * (metadata documents, stray files, indices outside the grid) are left out.
 * ZB_E_UNSUPPORTED for a store that cannot list (the caller walks the grid instead). */
zb_status zb__stored_chunks(zb_store *store, const struct zb_array *a, uint64_t **coords,
                            size_t *n);

#endif
