/* The array handle (internal view): the zarr layer's own. Readers outside src/zarr see an
 * array through zb__array_units and the unit API (unit.h). */
#ifndef ZB_ZARR_ARRAY_H
#define ZB_ZARR_ARRAY_H

#include "zarr/meta.h"
#include "zarr/unit.h"
#include "zbatch.h"

struct zb_array {
    zb_store *store;
    char *path; /* normalised array path ("" for a root array) */
    zb__array_meta meta;
    uint64_t inner[ZB_MAX_DIMS]; /* read-unit chunk shape (inner chunk when sharded) */
    uint64_t row_elems;          /* prod(shape[1:]) */
    uint64_t total_elems;        /* prod(shape), overflow-checked at open */
    zb__unit_geom units;         /* what readers see of it (zb__array_units) */
};

/* Opens an array from parsed metadata; takes ownership of *meta (zeroed on return, success or
 * not). */
zb_status zb__array_open_meta(zb_store *store, const char *path, zb__array_meta *meta,
                              zb_array **out);

/* Fills a->units from the opened array (unit.c). */
void zb__unit_geom_init(zb_array *a);

/* Strides (in elements) of each logical axis inside a unit buffer in its stored order: C order
 * of the unit, or of its transposed form when the chain has a transpose (unit.c). */
void zb__unit_strides(const zb_array *a, uint64_t *s);

#endif
