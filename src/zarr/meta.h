/* Array metadata: v2 .zarray/.zattrs and v3 zarr.json parsed into one model.
 * Format facts: shared FORMATS.md §1 (v2), §3 (v3), §4 (sharding), §5 (JSON). */
#ifndef ZB_ZARR_META_H
#define ZB_ZARR_META_H

#include <stdbool.h>
#include <stdint.h>

#include "zarr/codec.h"
#include "zbatch.h"

#define ZB_MAX_BB 8 /* bytes->bytes codecs per chain */

typedef enum zb__ab_kind {
    ZB_AB_BYTES,     /* fixed-size elements, C order, endian below */
    ZB_AB_VLEN_UTF8, /* FORMATS.md §1.6 */
    ZB_AB_SHARDING   /* sharding_indexed: FORMATS.md §4 */
} zb__ab_kind;

typedef struct zb__chain zb__chain;

typedef struct zb__shard_spec {
    uint64_t inner[ZB_MAX_DIMS]; /* inner chunk shape (ndim of the array) */
    zb__chain *inner_chain;      /* owned; never itself sharded */
    bool index_at_start;         /* index_location "start" */
    bool index_big_endian;       /* index bytes codec endian "big" */
    bool index_crc;              /* index_codecs has crc32c */
} zb__shard_spec;

/* A codec chain: array->array (transpose, composed into one permutation), one array->bytes,
 * then bytes->bytes in encode order (decode runs them last to first). */
struct zb__chain {
    bool has_transpose;
    int perm[ZB_MAX_DIMS]; /* v3 transpose semantics: encoded shape B[i] = A[perm[i]] */
    zb__ab_kind ab;
    bool big_endian;       /* ZB_AB_BYTES: stored big-endian (swap on LE hosts) */
    zb__shard_spec *shard; /* ZB_AB_SHARDING only; owned */
    int nbb;
    zb__codec bb[ZB_MAX_BB];
};

typedef struct zb__array_meta {
    int zarr_format;
    int ndim;
    uint64_t shape[ZB_MAX_DIMS];
    uint64_t chunks[ZB_MAX_DIMS]; /* the chunk grid: the shard shape when sharded */
    zb_dtype dtype;
    size_t itemsize;  /* 0 for strings */
    uint8_t fill[16]; /* fill value, itemsize bytes, native (little-endian) order; zeros if null */
    bool fill_null;   /* fill_value was JSON null (reads as zeros, FORMATS.md §1.3) */
    /* chunk keys: key = prefix + (ndim ? sep-joined indices : zero_dim_key) */
    char key_prefix
        [4];  /* "c/" or "c." for v3 default encoding (prefix incl. separator), "" for v2 */
    char sep; /* '.' or '/' */
    char zero_dim_key[4]; /* "c" (v3 default) or "0" (v2, v3 "v2" encoding) */
    zb__chain chain;
    char *attrs_json;  /* attributes as compact JSON text ("{}" when none); owned */
    char *codecs_desc; /* human-readable chain, e.g. "bytes(little) | zstd(0)"; owned */
} zb__array_meta;

/* Parses a v2 .zarray document (and optional .zattrs text, may be NULL). `where` names the
 * array path for messages. On failure *out is left zeroed and owns nothing. */
zb_status zb__meta_parse_v2(const char *zarray, size_t zarray_len, const char *zattrs,
                            size_t zattrs_len, const char *where, zb__array_meta *out);

/* Parses a v3 array zarr.json document. ZB_E_METADATA if it is a group. */
zb_status zb__meta_parse_v3(const char *json, size_t len, const char *where, zb__array_meta *out);

/* Same, from already-parsed json-c objects (consolidated metadata entries). */
zb_status zb__meta_from_v2_obj(void *zarray_obj, void *zattrs_obj, const char *where,
                               zb__array_meta *out);
zb_status zb__meta_from_v3_obj(void *obj, const char *where, zb__array_meta *out);

void zb__meta_free(zb__array_meta *m);

/* Builds the store key of chunk grid coordinates `idx` (ndim of them) under array path `path`
 * ("" for a root array) into buf. */
zb_status zb__meta_chunk_key(const zb__array_meta *m, const char *path, const uint64_t *idx,
                             char *buf, size_t cap);

/* Data types and fill values (dtype.c), shared by the v2 and v3 parsers. */
struct json_object;

/* A v2 NumPy typestr ("<f4", ">i8", "|b1", "|O"). *big_endian is set for '>' on a multi-byte
 * type. "|O" gives ZB_DT_STRING (the caller requires the vlen-utf8 filter). ZB_E_UNSUPPORTED
 * names other kinds (complex, datetime, S, U, V); ZB_E_METADATA for a malformed typestr. */
zb_status zb__dtype_parse_v2(const char *typestr, const char *where, zb_dtype *dtype,
                             bool *big_endian);

/* A v3 data_type name ("bool", "int8".."uint64", "float16/32/64", "string");
 * ZB_E_UNSUPPORTED naming anything else. */
zb_status zb__dtype_parse_v3(const char *name, const char *where, zb_dtype *dtype);

/* Parses a fill_value (`v` NULL for JSON null) for `dtype` into fill: itemsize bytes,
 * little-endian, the rest zero. Null gives zeros and *fill_null. Strings take no fill bytes
 * (the v2 |O fill is meaningless, FORMATS.md §1.3). Forms: FORMATS.md §1.3 (zarr_format 2) and
 * §3.2 (3, which adds "0x..." bit patterns for floats). ZB_E_METADATA naming `where`. */
zb_status zb__fill_parse(struct json_object *v, zb_dtype dtype, int zarr_format, const char *where,
                         uint8_t fill[16], bool *fill_null);

/* IEEE half-precision bits to double (exact). */
double zb__half_to_double(uint16_t bits);
/* Double to IEEE half-precision bits, rounded to nearest even (NaN: NumPy's 0x7e00). */
uint16_t zb__half_from_double(double x);

#endif
