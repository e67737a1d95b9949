/* The read unit: one home for everything a reader does with the smallest piece of an array that
 * is fetched and decoded on its own, a chunk, or an inner chunk when the array is sharded.
 *
 *   geometry  what planners need of an array (zb__unit_geom, fixed at open; no reader looks
 *             inside a zb_array);
 *   locate    a unit's object key and its byte range there, through the shard index (kept in
 *             the caller's index cache, so a shard's index is read once);
 *   merge     the one rule that joins nearby byte ranges of one object into one read;
 *   fetch     a view when the store offers one (the file backend's maps), else a read into the
 *             caller's workspace; zb__unit_lists_ranges says when the store wants a whole list
 *             of ranges in one zb_store_get_ranges call instead (remote backends);
 *   decode    the codec chain into the destination or a named per-thread workspace (zb_ctx).
 *
 * zb_array_read_rows (array.c), the dataset reader (src/dataset/exec.c), `zbatch bench`'s
 * decode-only loops (cli/bench_decode.c) and `zbatch verify` all read through these.
 * Thread-safety: a zb_array is immutable and may be shared; a zb_ctx (and its workspaces) is
 * used by one thread at a time. */
#ifndef ZB_ZARR_UNIT_H
#define ZB_ZARR_UNIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/cache.h"
#include "zbatch.h"

/* How a reader serves an array's units. */
typedef enum zb__unit_kind {
    ZB_UNITS_PLAIN, /* unsharded: each unit is its own object */
    ZB_UNITS_SHARD, /* sharded, shards spanning every axis but the first: inner chunks by range */
    ZB_UNITS_ROWS   /* whole-shard codecs, or shards split along other axes: row-band reads */
} zb__unit_kind;

/* An array's unit geometry, fixed at open (zb__array_units). Unit grid coordinates g run over
 * grid[d] = ceil(shape[d] / inner[d]) on each axis. */
typedef struct zb__unit_geom {
    const char *path; /* the array's path (lives with the array) */
    zb_store *store;  /* the store it reads from (borrowed) */
    zb_dtype dtype;
    size_t itemsize; /* 0 for strings */
    int ndim;
    uint64_t shape[ZB_MAX_DIMS];
    uint64_t inner[ZB_MAX_DIMS];      /* the unit's shape */
    uint64_t grid[ZB_MAX_DIMS];       /* units per axis */
    uint64_t per_shard[ZB_MAX_DIMS];  /* units per shard per axis (1 when unsharded) */
    uint64_t shard_grid[ZB_MAX_DIMS]; /* shards (or chunks) per axis */
    uint64_t shard_units;             /* units per shard (1 when unsharded) */
    uint64_t row_elems;               /* prod(shape[1:]) */
    uint64_t unit_bytes;              /* decoded bytes of a fixed-size unit */
    zb__unit_kind kind;
    bool spans_rows; /* inner[d] == shape[d] for every d >= 1: a unit holds whole rows */
    bool raw;        /* stored bytes are the decoded bytes (zb__array_unit_raw) */
    bool raw_rows;   /* raw and spans_rows: rows can be read straight into a batch */
} zb__unit_geom;

/* The geometry of `a` (lives as long as the array). */
const zb__unit_geom *zb__array_units(const zb_array *a);

/* Decoded bytes of one fixed-size unit (zb__unit_geom.unit_bytes). */
uint64_t zb__array_unit_bytes(const zb_array *a);

/* The unit's number in C order over the whole grid (a cache key). */
uint64_t zb__unit_linear(const zb__unit_geom *u, const uint64_t *g);

/* The grid coordinates of unit number `other` (C order over axes 1..) of unit row g0. */
void zb__unit_coords(const zb__unit_geom *u, uint64_t g0, uint64_t other, uint64_t *g);

/* Units of the other axes (1..ndim-1) per unit row. */
uint64_t zb__unit_row_units(const zb__unit_geom *u);

/* ---- locate -------------------------------------------------------------------------------- */

/* The key of the object holding unit g (the chunk, or its shard) and, when sharded, the entry
 * number j of g inside its shard and the shard's grid coordinates. For a sharded array `key`
 * may be NULL (entry and shard only, no formatting). */
zb_status zb__array_unit_object(const zb_array *a, const uint64_t *g, char *key, size_t cap,
                                uint64_t *shard, uint64_t *entry);

/* Reads and validates the index of the shard at grid coordinates `shard` into a new array of
 * 2n uint64 (offset, nbytes) pairs (free with free()); *missing is set (and *entries NULL) when
 * the shard does not exist. */
zb_status zb__array_shard_index(const zb_array *a, zb_ctx *ctx, const uint64_t *shard,
                                uint64_t **entries, uint64_t *n, bool *missing);

/* Entries [lo, lo + k) (2k words: offset, nbytes) of the index of the shard holding unit g,
 * from `cache` (may be NULL) when it holds that shard's index, else read, validated and put
 * there (a missing shard reads as all-empty entries). Reads are counted in `rs` (may be NULL). */
zb_status zb__unit_shard_entries(const zb_array *a, zb_ctx *ctx, zb__cache *cache,
                                 const uint64_t *g, uint64_t lo, uint64_t k, uint64_t *entries,
                                 zb_read_stats *rs);

/* Reads the indexes of the shards holding unit rows rows[i] of arrays[i] (n pairs; sharded
 * arrays of kind ZB_UNITS_SHARD with the index at the end, others are skipped) that `cache`
 * does not hold, all at once: one zb_store_get_ranges call per store, one suffix range per
 * shard (over HTTP one request each, all in flight together, instead of a size query and a
 * read per shard as each is first needed). Each index read is validated and put into `cache`
 * (a missing shard as all-empty entries); one that fails is left out, to be read again and
 * reported by zb__unit_shard_entries where it is used. Reads are counted in `rs` (may be
 * NULL). */
zb_status zb__unit_index_prefetch(zb__cache *cache, const zb_array *const *arrays,
                                  const uint64_t *rows, size_t n, zb_read_stats *rs);

/* Where unit g's encoded bytes are: in the object `key` (cap bytes), bytes [*off, *off + *len)
 * (a plain unit: its whole object, one size query). *missing (and ZB_OK) when the object, or
 * the unit's shard entry, does not exist. Shard indexes go through `cache` (may be NULL). */
zb_status zb__unit_locate(const zb_array *a, zb_ctx *ctx, zb__cache *cache, const uint64_t *g,
                          char *key, size_t cap, uint64_t *off, uint64_t *len, bool *missing,
                          zb_read_stats *rs);

/* ---- merge --------------------------------------------------------------------------------- */

/* When neighbouring byte ranges of one object are read together: a range joins the read
 * [start, end) when it starts at most `gap` bytes past its end and the read stays within `max`
 * bytes. */
typedef struct zb__merge_rule {
    uint64_t gap, max;
} zb__merge_rule;

/* Encoded units (zarr-python's coalescing defaults): 1 MiB gaps, 16 MiB reads. */
#define ZB_MERGE_UNITS ((zb__merge_rule){(uint64_t)1 << 20, (uint64_t)16 << 20})
/* Rows of raw units read straight into a batch: every byte read is copied, so short gaps. */
#define ZB_MERGE_RAW_ROWS ((zb__merge_rule){(uint64_t)32 << 10, (uint64_t)8 << 20})
/* Units handed to a store that reads lists of ranges itself (a remote store): only touching
 * units join, so no byte between them is fetched for nothing at this level; the store joins
 * nearby ranges into one request under its own options (zb_remote_opts.coalesce_gap) without
 * copying the gaps' bytes anywhere. */
#define ZB_MERGE_LISTED ((zb__merge_rule){0, (uint64_t)16 << 20})

/* Whether [off, off + len) joins the read [*start, *end) under `r` (then *end grows to hold
 * it). */
static inline bool
zb__merge_joins(zb__merge_rule r, uint64_t start, uint64_t *end, uint64_t off, uint64_t len)
{
    uint64_t e = off + len, ne = e > *end ? e : *end;
    if (off > *end + r.gap || ne - start > r.max) return false;
    *end = ne;
    return true;
}

/* A byte range of an object; arrays passed to zb__merge_next hold elements of `size` bytes
 * that begin with one, sorted by offset. */
typedef struct zb__span {
    uint64_t off, len;
} zb__span;

/* The read that starts at element i of `spans` (n elements of `size` bytes): returns k, the
 * end of the elements [i, k) it covers, and the read's bytes [*start, *end). */
size_t zb__merge_next(const void *spans, size_t size, size_t i, size_t n, zb__merge_rule r,
                      uint64_t *start, uint64_t *end);

/* ---- fetch --------------------------------------------------------------------------------- */

/* True when the array's store reads a whole list of ranges itself (its backend implements
 * get_ranges: a remote store): a reader then hands a window's ranges to zb_store_get_ranges in
 * one call. False for the file and memory stores, whose reads a reader spreads over its
 * threads (views or pread). */
bool zb__unit_lists_ranges(const zb_array *a);

/* Exactly the bytes [off, off + len) of `key`: a view when the store offers one (release *tok
 * with zb_store_release), else read into `buf` congruent to `off`; fewer is ZB_E_TRUNCATED.
 * Counted in `rs` (may be NULL). */
zb_status zb__unit_fetch(const zb_array *a, const char *key, uint64_t off, uint64_t len,
                         zb__buf *buf, const uint8_t **data, void **tok, zb_read_stats *rs);

/* Exactly the bytes [off, off + len) of `key`, always read into `buf` (congruent to `off`),
 * never a view: for readers that must see an object rewritten a moment ago through the same
 * store (the file backend notices a replaced file within a second, zb_store_view). Fewer is
 * ZB_E_TRUNCATED. Counted in `rs` (may be NULL). */
zb_status zb__unit_read(const zb_array *a, const char *key, uint64_t off, uint64_t len,
                        zb__buf *buf, const uint8_t **data, zb_read_stats *rs);

/* A bound on the encoded size of one of `a`'s unit objects that no codec's output exceeds (its
 * decoded size plus framing): one read of this many bytes gets a whole chunk object. */
uint64_t zb__unit_fetch_bound(const zb_array *a);

/* The whole object `key` (a plain unit): a view when the store offers one, else one read of up
 * to zb__unit_fetch_bound bytes into `buf` (an object that fills it is read again whole).
 * *missing (and ZB_OK) when the object does not exist. */
zb_status zb__unit_fetch_whole(const zb_array *a, const char *key, zb__buf *buf,
                               const uint8_t **data, size_t *len, bool *missing, void **tok,
                               zb_read_stats *rs);

/* ---- decode -------------------------------------------------------------------------------- */

/* Decodes the encoded bytes of one fixed-size unit into dst (unit_bytes bytes) in logical C
 * order of the unit, native byte order (transpose and byte swap undone). */
zb_status zb__array_decode_unit(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                                uint8_t *dst, const char *key);

/* Decodes one fixed-size unit in its stored element order (transposed when the chain has a
 * transpose), byte order undone, into target (unit_bytes bytes). */
zb_status zb__unit_decode_stored(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                                 uint8_t *target, const char *key);

/* A string element: its bytes at `off` of some buffer. */
typedef struct zb__str_span {
    uint64_t off, len;
} zb__str_span;

/* Decodes one vlen-utf8 unit of n elements: *base holds its bytes (a workspace of ctx, or
 * enc) and *items (ctx->ws.items) one span per element, relative to *base. */
zb_status zb__unit_decode_strings(const zb_array *a, zb_ctx *ctx, const uint8_t *enc,
                                  size_t enc_len, uint64_t n, const char *key, const uint8_t **base,
                                  const zb__str_span **items);

/* Runs the bytes->bytes codecs that apply to whole shards (codecs after sharding_indexed) over
 * `enc`: *res points at the decoded shard (a workspace of ctx, or enc). */
zb_status zb__unit_decode_shard(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                                const char *key, const uint8_t **res, size_t *res_len);

/* True when the array is sharded with bytes->bytes codecs on whole shards (no range reads). */
bool zb__array_whole_shard(const zb_array *a);

/* True when a unit's stored bytes are its decoded bytes (bytes codec in native order, no
 * transpose, no bytes->bytes codec): any row range of a unit can then be read straight from
 * the object at its byte offset. */
bool zb__array_unit_raw(const zb_array *a);

/* A unit whose chain is `bytes` (native order) and one blosc codec, stored as a blosc plain
 * copy (zb__blosc_plain): *plain points at its decoded bytes inside `enc`, counted as decoded,
 * so a reader serves it like a raw unit; *plain NULL: decode it (zb__array_decode_unit). A frame
 * whose header is wrong fails here as it would in the decode. */
zb_status zb__array_unit_plain(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                               const char *key, const uint8_t **plain);

/* Writes the fill value over one unit's bytes. */
void zb__array_fill_unit(const zb_array *a, uint8_t *dst);

/* The fill value's bytes (itemsize of them). */
const uint8_t *zb__array_fill(const zb_array *a);

#endif
