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

/* ---- unit-level access for the coalesced reader --------------------------------------------
 * A unit is the read unit: a chunk, or an inner chunk when sharded. Unit grid coordinates g
 * run over ceil(shape / inner) per axis. */

/* Decoded bytes of one fixed-size unit: prod(inner) * itemsize. */
uint64_t zb_array_unit_bytes(const zb_array *a);

/* The key of the object holding unit g (the chunk, or its shard) and, when sharded, the entry
 * number j of g inside its shard and the shard's grid coordinates. For a sharded array `key`
 * may be NULL (entry and shard only, no formatting). */
zb_status zb_array_unit_object(const zb_array *a, const uint64_t *g, char *key, size_t cap,
                               uint64_t *shard, uint64_t *entry);

/* Reads and validates the index of the shard at grid coordinates `shard` into a new array of
 * 2n uint64 (offset, nbytes) pairs (free with free()); *missing is set (and *entries NULL) when
 * the shard does not exist. */
zb_status zb_array_shard_index(const zb_array *a, zb_ctx *ctx, const uint64_t *shard,
                               uint64_t **entries, uint64_t *n, bool *missing);

/* True when the array is sharded with bytes->bytes codecs on whole shards (no range reads). */
bool zb_array_whole_shard(const zb_array *a);

/* Decodes the encoded bytes of one fixed-size unit into dst (zb_array_unit_bytes bytes) in
 * logical C order of the unit, native byte order (transpose and byte swap undone). */
zb_status zb_array_decode_unit(const zb_array *a, zb_ctx *ctx, const uint8_t *enc,
                               size_t enc_len, uint8_t *dst, const char *key);

/* True when a unit's stored bytes are its decoded bytes (bytes codec in native order, no
 * transpose, no bytes->bytes codec): any row range of a unit can then be read straight from
 * the object at its byte offset. */
bool zb_array_unit_raw(const zb_array *a);

/* Writes the fill value over one unit's bytes. */
void zb_array_fill_unit(const zb_array *a, uint8_t *dst);

#endif
