/* The array handle (internal view). */
#ifndef ZB_ZARR_ARRAY_H
#define ZB_ZARR_ARRAY_H

#include "zarr/meta.h"
#include "zbatch.h"

struct zb_array {
    zb_store *store;
    char *path;        /* normalised array path ("" for a root array) */
    zb_array_meta meta;
    uint64_t inner[ZB_MAX_DIMS];   /* read-unit chunk shape (inner chunk when sharded) */
    uint64_t row_elems;            /* prod(shape[1:]) */
    uint64_t total_elems;          /* prod(shape), overflow-checked at open */
};

/* Opens an array from parsed metadata; takes ownership of *meta (zeroed on return, success or
 * not). */
zb_status zb_array_open_meta(zb_store *store, const char *path, zb_array_meta *meta,
                             zb_array **out);

#endif
