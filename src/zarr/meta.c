/* Array metadata: v2 .zarray/.zattrs and v3 zarr.json into one zb__array_meta.
 * Format facts: shared FORMATS.md §1 (v2), §2.1 (v2 codec JSON), §3 (v3), §4.1 (sharding),
 * §5 (JSON). Every document is storage-controlled: each key is type- and range-checked, and a
 * message names the document, the key and what is wrong with it. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "zarr/meta.h"

#define DOC_CAP 512
/* TensorStore's bound on inner chunks per shard (FORMATS.md §4.4). */
#define MAX_SHARD_ENTRIES ((uint64_t)1 << 30)

/* ---- small helpers -------------------------------------------------------------------- */

/* "path/.zarray" (or ".zarray" for the root) for messages. */
static void
doc_name(char *buf, size_t cap, const char *where, const char *suffix)
{
    if (where && *where)
        snprintf(buf, cap, "%s/%s", where, suffix);
    else
        snprintf(buf, cap, "%s", suffix);
}

/* True if `key` is present (its value, possibly NULL for JSON null, goes to *v). */
static bool
has_key(json_object *obj, const char *key, json_object **v)
{
    *v = NULL;
    return json_object_is_type(obj, json_type_object) && json_object_object_get_ex(obj, key, v);
}

/* A short excerpt of a value's JSON text for messages. */
static const char *
excerpt(json_object *v, char *buf, size_t cap)
{
    const char *t = zb__json_text(v);
    size_t n = strlen(t);
    if (n < cap) return t;
    snprintf(buf, cap, "%.*s...", (int)(cap - 4), t);
    return buf;
}

static zb_status
desc_add(zb__buf *d, const char *s)
{
    if (d->len) ZB_TRY(zb__buf_append(d, " | ", 3));
    return zb__buf_append(d, s, strlen(s));
}

static zb_status
desc_finish(zb__buf *d, char **out)
{
    if (!d->len) ZB_TRY(zb__buf_append(d, "none", 4));
    ZB_TRY(zb__buf_append(d, "", 1));
    *out = (char *)d->data;
    d->data = NULL;
    d->len = d->cap = 0;
    return ZB_OK;
}

/* Reads an integer list (shape, chunks, chunk_shape). `positive` requires every element > 0.
 * `want` >= 0 requires that many elements. */
static zb_status
get_dims(json_object *v, const char *doc, const char *key, bool positive, int want, int *ndim,
         uint64_t *out)
{
    char what[DOC_CAP + 64];
    if (!v) return zb__err(ZB_E_METADATA, "%s: %s is missing or null", doc, key);
    if (!json_object_is_type(v, json_type_array))
        return zb__err(ZB_E_METADATA, "%s: %s is not a list", doc, key);
    size_t n = json_object_array_length(v);
    if (n > ZB_MAX_DIMS)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s has %zu dimensions (at most %d supported)", doc,
                       key, n, ZB_MAX_DIMS);
    if (want >= 0 && n != (size_t)want)
        return zb__err(ZB_E_METADATA, "%s: %s has %zu elements, shape has %d", doc, key, n, want);
    for (size_t i = 0; i < n; i++) {
        snprintf(what, sizeof what, "%s: %s[%zu]", doc, key, i);
        ZB_TRY(zb__json_u64(json_object_array_get_idx(v, i), what, &out[i]));
        if (positive && out[i] == 0) return zb__err(ZB_E_METADATA, "%s is 0, must be > 0", what);
    }
    *ndim = (int)n;
    return ZB_OK;
}

/* An optional integer parameter in [lo, hi]; absent or null gives `dflt`. */
static zb_status
int_param(json_object *cfg, const char *key, int dflt, int lo, int hi, const char *doc,
          const char *codec, int *out)
{
    json_object *v;
    *out = dflt;
    if (!has_key(cfg, key, &v) || !v) return ZB_OK;
    char what[DOC_CAP + 64];
    snprintf(what, sizeof what, "%s: %s %s", doc, codec, key);
    int64_t x;
    ZB_TRY(zb__json_i64(v, what, &x));
    if (x < lo || x > hi)
        return zb__err(ZB_E_METADATA, "%s is %lld, must be in [%d, %d]", what, (long long)x, lo,
                       hi);
    *out = (int)x;
    return ZB_OK;
}

static zb_status
bool_param(json_object *cfg, const char *key, const char *doc, const char *codec, bool *out)
{
    json_object *v;
    *out = false;
    if (!has_key(cfg, key, &v) || !v) return ZB_OK;
    if (!json_object_is_type(v, json_type_boolean))
        return zb__err(ZB_E_METADATA, "%s: %s %s is not true or false", doc, codec, key);
    *out = json_object_get_boolean(v);
    return ZB_OK;
}

/* An optional string parameter; NULL when absent or null, an error when not a string. */
static zb_status
str_param(json_object *cfg, const char *key, const char *doc, const char *codec, const char **out)
{
    json_object *v;
    *out = NULL;
    if (!has_key(cfg, key, &v) || !v) return ZB_OK;
    if (!json_object_is_type(v, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: %s %s is not a string", doc, codec, key);
    *out = json_object_get_string(v);
    return ZB_OK;
}

static zb_status
overflow_check(const uint64_t *dims, int ndim, size_t itemsize, const char *doc, const char *key,
               uint64_t *elems)
{
    uint64_t n = 1, bytes;
    for (int i = 0; i < ndim; i++)
        if (!zb__mul_u64(n, dims[i], &n))
            return zb__err(ZB_E_OVERFLOW, "%s: the element count of %s overflows 64 bits", doc,
                           key);
    if (!zb__mul_u64(n, itemsize ? itemsize : 1, &bytes))
        return zb__err(ZB_E_OVERFLOW, "%s: the byte size of %s overflows 64 bits", doc, key);
    if (elems) *elems = n;
    return ZB_OK;
}

/* ---- bytes->bytes codecs -------------------------------------------------------------- */

static const char *const blosc_cnames[] = {"blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"};

static zb_status
blosc_cname(json_object *cfg, const char *doc, const char *codec, zb__codec *c)
{
    const char *cname;
    ZB_TRY(str_param(cfg, "cname", doc, codec, &cname));
    if (!cname) cname = "lz4";
    for (size_t i = 0; i < sizeof blosc_cnames / sizeof blosc_cnames[0]; i++) {
        if (!strcmp(cname, blosc_cnames[i])) {
            snprintf(c->cname, sizeof c->cname, "%s", cname);
            return ZB_OK;
        }
    }
    return zb__err(ZB_E_METADATA, "%s: %s cname \"%.32s\" is not a blosc compressor", doc, codec,
                   cname);
}

/* numcodecs' codec JSON: the v2 compressor object ({"id": ..., params}) and the parameters of
 * the v3 "numcodecs.<id>" codecs share these names (FORMATS.md §2.1). Unknown keys are
 * ignored. */
static zb_status
numcodecs_codec(const char *id, json_object *cfg, const char *doc, zb__codec *c)
{
    memset(c, 0, sizeof *c);
    if (!strcmp(id, "blosc")) {
        c->id = ZB_CODEC_BLOSC;
        ZB_TRY(blosc_cname(cfg, doc, id, c));
        ZB_TRY(int_param(cfg, "clevel", 5, 0, 9, doc, id, &c->level));
        ZB_TRY(int_param(cfg, "shuffle", ZB_SHUFFLE_BYTE, -1, 2, doc, id, &c->shuffle));
        ZB_TRY(int_param(cfg, "blocksize", 0, 0, INT32_MAX, doc, id, &c->blocksize));
        /* numcodecs >= 0.16 accepts typesize; 0 (absent) means the dtype's item size */
        ZB_TRY(int_param(cfg, "typesize", 0, 0, 255, doc, id, &c->typesize));
        return ZB_OK;
    }
    if (!strcmp(id, "zstd")) {
        c->id = ZB_CODEC_ZSTD;
        ZB_TRY(int_param(cfg, "level", 1, -131072, 22, doc, id, &c->level));
        return bool_param(cfg, "checksum", doc, id, &c->checksum);
    }
    if (!strcmp(id, "lz4")) {
        c->id = ZB_CODEC_LZ4;
        return int_param(cfg, "acceleration", 1, INT32_MIN, INT32_MAX, doc, id, &c->acceleration);
    }
    if (!strcmp(id, "gzip") || !strcmp(id, "zlib")) {
        c->id = id[0] == 'g' ? ZB_CODEC_GZIP : ZB_CODEC_ZLIB;
        return int_param(cfg, "level", 1, 0, 9, doc, id, &c->level);
    }
    return zb__err(ZB_E_UNSUPPORTED, "%s: codec \"%.64s\" is not supported", doc, id);
}

/* The v3 blosc codec: shuffle is a string and typesize is explicit (FORMATS.md §3.4). */
static zb_status
v3_blosc(json_object *cfg, size_t itemsize, const char *doc, zb__codec *c)
{
    memset(c, 0, sizeof *c);
    c->id = ZB_CODEC_BLOSC;
    ZB_TRY(blosc_cname(cfg, doc, "blosc", c));
    ZB_TRY(int_param(cfg, "clevel", 5, 0, 9, doc, "blosc", &c->level));
    ZB_TRY(int_param(cfg, "blocksize", 0, 0, INT32_MAX, doc, "blosc", &c->blocksize));
    const char *shuffle;
    ZB_TRY(str_param(cfg, "shuffle", doc, "blosc", &shuffle));
    json_object *ts;
    bool has_ts = has_key(cfg, "typesize", &ts) && ts;
    if (!shuffle) {
        /* zarr-python derives unset values from the dtype: bitshuffle for 1-byte items */
        c->shuffle = itemsize == 1 ? ZB_SHUFFLE_BIT : ZB_SHUFFLE_BYTE;
    } else if (!strcmp(shuffle, "noshuffle")) {
        c->shuffle = ZB_SHUFFLE_NONE;
    } else if (!strcmp(shuffle, "shuffle")) {
        c->shuffle = ZB_SHUFFLE_BYTE;
    } else if (!strcmp(shuffle, "bitshuffle")) {
        c->shuffle = ZB_SHUFFLE_BIT;
    } else {
        return zb__err(ZB_E_METADATA,
                       "%s: blosc shuffle \"%.32s\" is not noshuffle, shuffle or bitshuffle", doc,
                       shuffle);
    }
    if (has_ts) {
        ZB_TRY(int_param(cfg, "typesize", 0, 1, 255, doc, "blosc", &c->typesize));
    } else if (shuffle && c->shuffle != ZB_SHUFFLE_NONE) {
        return zb__err(ZB_E_METADATA, "%s: blosc typesize is required with shuffle \"%s\"", doc,
                       shuffle);
    } else if (!shuffle) {
        c->typesize = itemsize ? (int)itemsize : 1;
    }
    return ZB_OK;
}

/* A v3 bytes->bytes codec by name; ZB_E_NOTFOUND (no message) if `name` is not one. */
static zb_status
v3_bb_codec(const char *name, json_object *cfg, size_t itemsize, const char *doc, zb__codec *c)
{
    memset(c, 0, sizeof *c);
    if (!strcmp(name, "blosc")) return v3_blosc(cfg, itemsize, doc, c);
    if (!strcmp(name, "zstd")) {
        c->id = ZB_CODEC_ZSTD;
        ZB_TRY(int_param(cfg, "level", 0, -131072, 22, doc, name, &c->level));
        return bool_param(cfg, "checksum", doc, name, &c->checksum);
    }
    if (!strcmp(name, "gzip")) {
        c->id = ZB_CODEC_GZIP;
        return int_param(cfg, "level", 1, 0, 9, doc, name, &c->level);
    }
    if (!strcmp(name, "crc32c")) {
        c->id = ZB_CODEC_CRC32C;
        return ZB_OK;
    }
    static const char *const numcodecs[] = {"blosc", "zstd", "lz4", "gzip", "zlib"};
    if (!strncmp(name, "numcodecs.", 10)) {
        for (size_t i = 0; i < sizeof numcodecs / sizeof numcodecs[0]; i++)
            if (!strcmp(name + 10, numcodecs[i])) return numcodecs_codec(name + 10, cfg, doc, c);
    }
    return ZB_E_NOTFOUND;
}

static zb_status
add_bb(zb__chain *chain, const zb__codec *c, const char *doc, zb__buf *desc)
{
    if (chain->nbb >= ZB_MAX_BB)
        return zb__err(ZB_E_UNSUPPORTED, "%s: more than %d bytes->bytes codecs", doc, ZB_MAX_BB);
    chain->bb[chain->nbb++] = *c;
    char d[96];
    zb__codec_describe(c, d, sizeof d);
    return desc_add(desc, d);
}

/* ---- v2 ------------------------------------------------------------------------------- */

static zb_status
v2_filters(json_object *filters, const char *doc, bool *vlen)
{
    *vlen = false;
    if (!filters) return ZB_OK;
    if (!json_object_is_type(filters, json_type_array))
        return zb__err(ZB_E_METADATA, "%s: filters is not a list or null", doc);
    size_t n = json_object_array_length(filters);
    for (size_t i = 0; i < n; i++) {
        json_object *f = json_object_array_get_idx(filters, i);
        json_object *id = zb__json_get(f, "id");
        if (!json_object_is_type(id, json_type_string))
            return zb__err(ZB_E_METADATA, "%s: filters[%zu] has no string \"id\"", doc, i);
        const char *name = json_object_get_string(id);
        /* Only the string filter is supported: a filter runs before the compressor on encode,
         * so vlen-utf8 must be the only one for the array->bytes step to be well defined. */
        if (strcmp(name, "vlen-utf8") != 0 || n != 1)
            return zb__err(ZB_E_UNSUPPORTED, "%s: filter \"%.64s\" is not supported", doc, name);
        *vlen = true;
    }
    return ZB_OK;
}

static zb_status
v2_parse(json_object *za, json_object *zattrs, const char *where, zb__array_meta *m)
{
    char doc[DOC_CAP], adoc[DOC_CAP], ex[64];
    json_object *v;
    zb__buf desc = {0};
    zb_status st;
    doc_name(doc, sizeof doc, where, ".zarray");
    doc_name(adoc, sizeof adoc, where, ".zattrs");
    if (!json_object_is_type(za, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: not a JSON object", doc);
    m->zarr_format = 2;

    int64_t zf;
    char what[DOC_CAP + 32];
    snprintf(what, sizeof what, "%s: zarr_format", doc);
    ZB_TRY(zb__json_i64(zb__json_get(za, "zarr_format"), what, &zf));
    if (zf != 2)
        return zb__err(ZB_E_METADATA, "%s: zarr_format is %lld, not 2", doc, (long long)zf);

    ZB_TRY(get_dims(zb__json_get(za, "shape"), doc, "shape", false, -1, &m->ndim, m->shape));
    int nchunks;
    ZB_TRY(get_dims(zb__json_get(za, "chunks"), doc, "chunks", true, m->ndim, &nchunks, m->chunks));

    v = zb__json_get(za, "dtype");
    if (json_object_is_type(v, json_type_array))
        return zb__err(ZB_E_UNSUPPORTED, "%s: structured dtype %s is not supported", doc,
                       excerpt(v, ex, sizeof ex));
    if (!json_object_is_type(v, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: dtype is missing or not a string", doc);
    bool big = false;
    ZB_TRY(zb__dtype_parse_v2(json_object_get_string(v), doc, &m->dtype, &big));
    m->itemsize = zb_dtype_size(m->dtype);

    bool vlen;
    ZB_TRY(v2_filters(zb__json_get(za, "filters"), doc, &vlen));
    if (vlen && m->dtype != ZB_DT_STRING)
        return zb__err(ZB_E_METADATA, "%s: the vlen-utf8 filter needs dtype |O, not %s", doc,
                       json_object_get_string(v));
    if (!vlen && m->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: dtype |O is only supported with the vlen-utf8 filter",
                       doc);
    m->chain.ab = vlen ? ZB_AB_VLEN_UTF8 : ZB_AB_BYTES;
    m->chain.big_endian = big;

    /* order "F": the chunk is column-major, i.e. a v3 transpose [n-1, ..., 0] (§1.5) */
    const char *order = "C";
    if (has_key(za, "order", &v) && v) {
        if (!json_object_is_type(v, json_type_string))
            return zb__err(ZB_E_METADATA, "%s: order is not a string", doc);
        order = json_object_get_string(v);
    }
    if (!strcmp(order, "F")) {
        if (m->ndim > 1) {
            m->chain.has_transpose = true;
            for (int i = 0; i < m->ndim; i++) m->chain.perm[i] = m->ndim - 1 - i;
        }
    } else if (strcmp(order, "C") != 0) {
        return zb__err(ZB_E_METADATA, "%s: order \"%.16s\" is not \"C\" or \"F\"", doc, order);
    }

    m->sep = '.';
    if (has_key(za, "dimension_separator", &v) && v) {
        const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
        if (strcmp(s, ".") != 0 && strcmp(s, "/") != 0)
            return zb__err(ZB_E_METADATA, "%s: dimension_separator is not \".\" or \"/\"", doc);
        m->sep = s[0];
    }
    m->key_prefix[0] = '\0';
    snprintf(m->zero_dim_key, sizeof m->zero_dim_key, "0");

    /* An absent fill_value reads like null: zeros (§1.3). */
    v = zb__json_get(za, "fill_value");
    ZB_TRY(zb__fill_parse(v, m->dtype, 2, doc, m->fill, &m->fill_null));

    ZB_TRY(overflow_check(m->shape, m->ndim, m->itemsize, doc, "shape", NULL));
    ZB_TRY(overflow_check(m->chunks, m->ndim, m->itemsize, doc, "chunks", NULL));
    if (zattrs && !json_object_is_type(zattrs, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: not a JSON object", adoc);

    zb__codec comp;
    bool has_comp = false;
    v = zb__json_get(za, "compressor");
    if (v) {
        if (!json_object_is_type(v, json_type_object))
            return zb__err(ZB_E_METADATA, "%s: compressor is not an object or null", doc);
        json_object *id = zb__json_get(v, "id");
        if (!json_object_is_type(id, json_type_string))
            return zb__err(ZB_E_METADATA, "%s: compressor has no string \"id\"", doc);
        ZB_TRY(numcodecs_codec(json_object_get_string(id), v, doc, &comp));
        has_comp = true;
    }

    st = ZB_OK;
    if (m->chain.has_transpose) st = desc_add(&desc, "order(F)");
    if (st == ZB_OK && vlen) st = desc_add(&desc, "vlen-utf8");
    if (st == ZB_OK && has_comp) st = add_bb(&m->chain, &comp, doc, &desc);
    if (st != ZB_OK) goto fail;
    m->attrs_json = strdup(zattrs ? zb__json_text(zattrs) : "{}");
    if (!m->attrs_json) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", adoc);
        goto fail;
    }
    st = desc_finish(&desc, &m->codecs_desc);
    if (st != ZB_OK) goto fail;
    return ZB_OK;

fail:
    zb__buf_free(&desc);
    return st;
}

/* ---- v3 ------------------------------------------------------------------------------- */

typedef struct v3_entry {
    const char *name;
    json_object *cfg; /* NULL if none */
} v3_entry;

static zb_status
v3_codec_entry(json_object *e, const char *doc, const char *list, size_t i, v3_entry *out)
{
    out->cfg = NULL;
    /* v3.1 allows a bare name string for a codec without configuration */
    if (json_object_is_type(e, json_type_string)) {
        out->name = json_object_get_string(e);
        return ZB_OK;
    }
    json_object *n = zb__json_get(e, "name");
    if (!json_object_is_type(n, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: %s[%zu] has no string \"name\"", doc, list, i);
    out->name = json_object_get_string(n);
    json_object *cfg;
    if (has_key(e, "configuration", &cfg) && cfg) {
        if (!json_object_is_type(cfg, json_type_object))
            return zb__err(ZB_E_METADATA, "%s: %s[%zu] configuration is not an object", doc, list,
                           i);
        out->cfg = cfg;
    }
    return ZB_OK;
}

/* "little" / "big" of a bytes codec; `required` for multi-byte element types. */
static zb_status
bytes_endian(json_object *cfg, bool required, const char *doc, const char *list, bool *big,
             bool *given)
{
    const char *endian;
    *big = false;
    *given = false;
    ZB_TRY(str_param(cfg, "endian", doc, "bytes", &endian));
    if (!endian) {
        if (required)
            return zb__err(ZB_E_METADATA,
                           "%s: %s: the bytes codec needs \"endian\" for a multi-byte type", doc,
                           list);
        return ZB_OK;
    }
    if (!strcmp(endian, "big"))
        *big = true;
    else if (strcmp(endian, "little") != 0)
        return zb__err(ZB_E_METADATA, "%s: %s: bytes endian \"%.16s\" is not little or big", doc,
                       list, endian);
    *given = true;
    return ZB_OK;
}

static zb_status
v3_transpose(json_object *cfg, int ndim, const char *doc, zb__chain *chain, zb__buf *desc)
{
    int order[ZB_MAX_DIMS];
    json_object *o = zb__json_get(cfg, "order");
    if (json_object_is_type(o, json_type_string)) {
        /* early zarrita wrote "C"/"F" */
        const char *s = json_object_get_string(o);
        if (strcmp(s, "C") != 0 && strcmp(s, "F") != 0)
            return zb__err(ZB_E_METADATA, "%s: transpose order \"%.16s\" is not a permutation", doc,
                           s);
        for (int i = 0; i < ndim; i++) order[i] = s[0] == 'F' ? ndim - 1 - i : i;
    } else {
        if (!json_object_is_type(o, json_type_array) || json_object_array_length(o) != (size_t)ndim)
            return zb__err(ZB_E_METADATA, "%s: transpose order is not a list of %d axes", doc,
                           ndim);
        bool seen[ZB_MAX_DIMS] = {false};
        for (int i = 0; i < ndim; i++) {
            char what[DOC_CAP + 32];
            int64_t x;
            snprintf(what, sizeof what, "%s: transpose order[%d]", doc, i);
            ZB_TRY(zb__json_i64(json_object_array_get_idx(o, (size_t)i), what, &x));
            if (x < 0 || x >= ndim || seen[x])
                return zb__err(ZB_E_METADATA, "%s: transpose order is not a permutation of 0..%d",
                               doc, ndim - 1);
            seen[x] = true;
            order[i] = (int)x;
        }
    }
    /* Composition: after t1, B[i] = A[t1[i]]; t2 then gives C[i] = B[t2[i]] = A[t1[t2[i]]]. */
    int prev[ZB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) prev[i] = chain->has_transpose ? chain->perm[i] : i;
    bool identity = true;
    for (int i = 0; i < ndim; i++) {
        chain->perm[i] = prev[order[i]];
        if (chain->perm[i] != i) identity = false;
    }
    chain->has_transpose = !identity;

    char d[16 + ZB_MAX_DIMS * 4];
    size_t n = (size_t)snprintf(d, sizeof d, "transpose(");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(d + n, sizeof d - n, i ? ",%d" : "%d", order[i]);
    snprintf(d + n, sizeof d - n, ")");
    return desc_add(desc, d);
}

static zb_status v3_chain(json_object *codecs, const char *doc, const char *list, zb_dtype dtype,
                          int ndim, const uint64_t *chunk, bool inner, zb__chain *chain,
                          zb__buf *desc);

static zb_status
v3_index_codecs(json_object *ic, const char *doc, zb__shard_spec *s, char *desc, size_t cap)
{
    const char *list = "sharding_indexed index_codecs";
    if (!ic) {
        /* zarr-python's default: bytes(little) + crc32c */
        s->index_crc = true;
    } else {
        if (!json_object_is_type(ic, json_type_array))
            return zb__err(ZB_E_METADATA, "%s: %s is not a list", doc, list);
        size_t n = json_object_array_length(ic);
        bool ok = n == 1 || n == 2;
        for (size_t i = 0; ok && i < n; i++) {
            v3_entry e;
            ZB_TRY(v3_codec_entry(json_object_array_get_idx(ic, i), doc, list, i, &e));
            if (i == 0 && (!strcmp(e.name, "bytes") || !strcmp(e.name, "endian"))) {
                bool given;
                ZB_TRY(bytes_endian(e.cfg, true, doc, list, &s->index_big_endian, &given));
            } else if (i == 1 && !strcmp(e.name, "crc32c")) {
                s->index_crc = true;
            } else {
                ok = false;
            }
        }
        if (!ok)
            return zb__err(ZB_E_UNSUPPORTED,
                           "%s: %s must be bytes(little|big) with an optional crc32c", doc, list);
    }
    snprintf(desc, cap, "index %s%s%s", s->index_at_start ? "start" : "end",
             s->index_big_endian ? ",big" : "", s->index_crc ? "+crc32c" : "");
    return ZB_OK;
}

static zb_status
v3_sharding(json_object *cfg, const char *doc, zb_dtype dtype, int ndim, const uint64_t *outer,
            zb__chain *chain, zb__buf *desc)
{
    zb_status st;
    zb__buf inner_desc = {0};
    char ex[16 + ZB_MAX_DIMS * 22], idesc[64];
    zb__shard_spec *s = calloc(1, sizeof *s);
    if (!s) return zb__err(ZB_E_NOMEM, "%s: out of memory", doc);
    chain->shard = s;
    chain->ab = ZB_AB_SHARDING;
    s->inner_chain = calloc(1, sizeof *s->inner_chain);
    if (!s->inner_chain) return zb__err(ZB_E_NOMEM, "%s: out of memory", doc);

    int n;
    ZB_TRY(get_dims(zb__json_get(cfg, "chunk_shape"), doc, "sharding_indexed chunk_shape", true,
                    ndim, &n, s->inner));
    uint64_t entries = 1;
    for (int i = 0; i < ndim; i++) {
        if (outer[i] % s->inner[i] != 0)
            return zb__err(ZB_E_METADATA,
                           "%s: sharding_indexed chunk_shape[%d] = %llu does not divide the shard "
                           "shape %llu",
                           doc, i, (unsigned long long)s->inner[i], (unsigned long long)outer[i]);
        if (!zb__mul_u64(entries, outer[i] / s->inner[i], &entries) || entries > MAX_SHARD_ENTRIES)
            return zb__err(ZB_E_UNSUPPORTED, "%s: more than 2^30 inner chunks per shard", doc);
    }
    ZB_TRY(overflow_check(s->inner, ndim, zb_dtype_size(dtype), doc, "sharding_indexed chunk_shape",
                          NULL));

    json_object *v;
    if (has_key(cfg, "index_location", &v) && v) {
        const char *loc = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
        if (!strcmp(loc, "start"))
            s->index_at_start = true;
        else if (strcmp(loc, "end") != 0)
            return zb__err(ZB_E_METADATA, "%s: sharding_indexed index_location is not start or end",
                           doc);
    }
    json_object *ic = NULL;
    (void)has_key(cfg, "index_codecs", &ic);
    ZB_TRY(v3_index_codecs(ic, doc, s, idesc, sizeof idesc));

    json_object *codecs = zb__json_get(cfg, "codecs");
    if (!codecs) return zb__err(ZB_E_METADATA, "%s: sharding_indexed codecs is missing", doc);
    st = v3_chain(codecs, doc, "sharding_indexed codecs", dtype, ndim, s->inner, true,
                  s->inner_chain, &inner_desc);
    if (st != ZB_OK) goto done;

    size_t o = (size_t)snprintf(ex, sizeof ex, "sharding(inner [");
    for (int i = 0; i < ndim; i++)
        o += (size_t)snprintf(ex + o, sizeof ex - o, i ? ",%llu" : "%llu",
                              (unsigned long long)s->inner[i]);
    snprintf(ex + o, sizeof ex - o, "], %s) [", idesc);
    st = desc_add(desc, ex);
    if (st == ZB_OK && inner_desc.len) st = zb__buf_append(desc, inner_desc.data, inner_desc.len);
    if (st == ZB_OK) st = zb__buf_append(desc, "]", 1);
done:
    zb__buf_free(&inner_desc);
    return st;
}

/* Parses a v3 codec list into chain: array->array codecs, exactly one array->bytes codec, then
 * bytes->bytes codecs (FORMATS.md §3.4). `chunk` is the chunk shape the chain encodes (the
 * shard shape at the top level, the inner chunk shape inside sharding). */
static zb_status
v3_chain(json_object *codecs, const char *doc, const char *list, zb_dtype dtype, int ndim,
         const uint64_t *chunk, bool inner, zb__chain *chain, zb__buf *desc)
{
    size_t itemsize = zb_dtype_size(dtype);
    if (!json_object_is_type(codecs, json_type_array))
        return zb__err(ZB_E_METADATA, "%s: %s is not a list", doc, list);
    size_t n = json_object_array_length(codecs);
    bool have_ab = false;
    for (size_t i = 0; i < n; i++) {
        v3_entry e;
        ZB_TRY(v3_codec_entry(json_object_array_get_idx(codecs, i), doc, list, i, &e));
        bool is_ab = !strcmp(e.name, "bytes") || !strcmp(e.name, "endian") ||
                     !strcmp(e.name, "vlen-utf8") || !strcmp(e.name, "sharding_indexed");
        if (!strcmp(e.name, "transpose")) {
            if (have_ab)
                return zb__err(ZB_E_METADATA, "%s: %s: transpose after the array->bytes codec", doc,
                               list);
            ZB_TRY(v3_transpose(e.cfg, ndim, doc, chain, desc));
            continue;
        }
        if (is_ab) {
            if (have_ab)
                return zb__err(ZB_E_METADATA, "%s: %s has more than one array->bytes codec", doc,
                               list);
            have_ab = true;
        }
        if (!strcmp(e.name, "bytes") || !strcmp(e.name, "endian")) {
            if (dtype == ZB_DT_STRING)
                return zb__err(ZB_E_METADATA, "%s: %s: data_type string needs vlen-utf8, not bytes",
                               doc, list);
            bool given;
            chain->ab = ZB_AB_BYTES;
            ZB_TRY(bytes_endian(e.cfg, itemsize > 1, doc, list, &chain->big_endian, &given));
            ZB_TRY(desc_add(desc, !given              ? "bytes"
                                  : chain->big_endian ? "bytes(big)"
                                                      : "bytes(little)"));
            /* one-byte elements have nothing to swap */
            if (itemsize <= 1) chain->big_endian = false;
        } else if (!strcmp(e.name, "vlen-utf8")) {
            if (dtype != ZB_DT_STRING)
                return zb__err(ZB_E_METADATA, "%s: %s: vlen-utf8 needs data_type string, not %s",
                               doc, list, zb_dtype_name(dtype));
            chain->ab = ZB_AB_VLEN_UTF8;
            ZB_TRY(desc_add(desc, "vlen-utf8"));
        } else if (!strcmp(e.name, "sharding_indexed")) {
            if (inner)
                return zb__err(ZB_E_UNSUPPORTED, "%s: nested sharding_indexed is not supported",
                               doc);
            if (!e.cfg)
                return zb__err(ZB_E_METADATA, "%s: sharding_indexed has no configuration", doc);
            /* a transpose before sharding permutes the shard the inner grid divides */
            uint64_t outer[ZB_MAX_DIMS];
            for (int d = 0; d < ndim; d++)
                outer[d] = chain->has_transpose ? chunk[chain->perm[d]] : chunk[d];
            ZB_TRY(v3_sharding(e.cfg, doc, dtype, ndim, outer, chain, desc));
        } else {
            zb__codec c;
            zb_status st = v3_bb_codec(e.name, e.cfg, itemsize, doc, &c);
            if (st == ZB_E_NOTFOUND)
                return zb__err(ZB_E_UNSUPPORTED, "%s: codec \"%.64s\" is not supported", doc,
                               e.name);
            if (st != ZB_OK) return st;
            if (!have_ab)
                return zb__err(ZB_E_METADATA,
                               "%s: %s: bytes->bytes codec %s comes before the array->bytes codec",
                               doc, list, e.name);
            /* A codec after sharding_indexed compresses whole shards: valid, and read by
             * decoding the whole shard first (no range reads into it). */
            ZB_TRY(add_bb(chain, &c, doc, desc));
        }
    }
    if (!have_ab) return zb__err(ZB_E_METADATA, "%s: %s has no array->bytes codec", doc, list);
    return ZB_OK;
}

static const char *const v3_keys[] = {
    "zarr_format",        "node_type",  "shape",  "data_type",  "chunk_grid",
    "chunk_key_encoding", "fill_value", "codecs", "attributes", "storage_transformers",
    "dimension_names",
};

/* Unknown top-level keys: fail unless {"must_understand": false} (FORMATS.md §3.4). */
static zb_status
v3_unknown_keys(json_object *obj, const char *doc)
{
    json_object_object_foreach(obj, key, val)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof v3_keys / sizeof v3_keys[0] && !known; i++)
            known = !strcmp(key, v3_keys[i]);
        if (known) continue;
        json_object *mu = zb__json_get(val, "must_understand");
        if (json_object_is_type(mu, json_type_boolean) && !json_object_get_boolean(mu)) continue;
        return zb__err(ZB_E_UNSUPPORTED, "%s: unknown key \"%.64s\" (not must_understand: false)",
                       doc, key);
    }
    return ZB_OK;
}

static zb_status
v3_key_encoding(json_object *enc, const char *doc, zb__array_meta *m)
{
    if (!json_object_is_type(enc, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: chunk_key_encoding is missing or not an object", doc);
    json_object *n = zb__json_get(enc, "name");
    if (!json_object_is_type(n, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: chunk_key_encoding has no string \"name\"", doc);
    const char *name = json_object_get_string(n);
    bool dflt = !strcmp(name, "default");
    if (!dflt && strcmp(name, "v2") != 0)
        return zb__err(ZB_E_UNSUPPORTED, "%s: chunk_key_encoding \"%.64s\" is not supported", doc,
                       name);
    /* each encoding has its own default separator (FORMATS.md §3.3) */
    m->sep = dflt ? '/' : '.';
    const char *sep;
    ZB_TRY(str_param(zb__json_get(enc, "configuration"), "separator", doc, "chunk_key_encoding",
                     &sep));
    if (sep) {
        if (strcmp(sep, ".") != 0 && strcmp(sep, "/") != 0)
            return zb__err(ZB_E_METADATA, "%s: chunk_key_encoding separator is not \".\" or \"/\"",
                           doc);
        m->sep = sep[0];
    }
    if (dflt) {
        m->key_prefix[0] = 'c';
        m->key_prefix[1] = m->sep;
        m->key_prefix[2] = '\0';
        snprintf(m->zero_dim_key, sizeof m->zero_dim_key, "c");
    } else {
        m->key_prefix[0] = '\0';
        snprintf(m->zero_dim_key, sizeof m->zero_dim_key, "0");
    }
    return ZB_OK;
}

static zb_status
v3_parse(json_object *obj, const char *where, zb__array_meta *m)
{
    char doc[DOC_CAP], what[DOC_CAP + 32], ex[64];
    json_object *v;
    zb__buf desc = {0};
    zb_status st;
    doc_name(doc, sizeof doc, where, "zarr.json");
    if (!json_object_is_type(obj, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: not a JSON object", doc);
    m->zarr_format = 3;

    int64_t zf;
    snprintf(what, sizeof what, "%s: zarr_format", doc);
    ZB_TRY(zb__json_i64(zb__json_get(obj, "zarr_format"), what, &zf));
    if (zf != 3)
        return zb__err(ZB_E_METADATA, "%s: zarr_format is %lld, not 3", doc, (long long)zf);
    v = zb__json_get(obj, "node_type");
    const char *nt = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
    if (nt && !strcmp(nt, "group"))
        return zb__err(ZB_E_METADATA, "%s: is a group, not an array", doc);
    if (!nt || strcmp(nt, "array") != 0)
        return zb__err(ZB_E_METADATA, "%s: node_type is not \"array\"", doc);
    ZB_TRY(v3_unknown_keys(obj, doc));

    ZB_TRY(get_dims(zb__json_get(obj, "shape"), doc, "shape", false, -1, &m->ndim, m->shape));

    v = zb__json_get(obj, "data_type");
    if (json_object_is_type(v, json_type_object))
        return zb__err(ZB_E_UNSUPPORTED, "%s: data_type %s is not supported", doc,
                       excerpt(v, ex, sizeof ex));
    if (!json_object_is_type(v, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: data_type is missing or not a string", doc);
    ZB_TRY(zb__dtype_parse_v3(json_object_get_string(v), doc, &m->dtype));
    m->itemsize = zb_dtype_size(m->dtype);

    v = zb__json_get(obj, "chunk_grid");
    json_object *gn = zb__json_get(v, "name");
    if (!json_object_is_type(gn, json_type_string))
        return zb__err(ZB_E_METADATA, "%s: chunk_grid is missing or has no string \"name\"", doc);
    if (strcmp(json_object_get_string(gn), "regular") != 0)
        return zb__err(ZB_E_UNSUPPORTED, "%s: chunk_grid \"%.64s\" is not supported", doc,
                       json_object_get_string(gn));
    int nchunks;
    ZB_TRY(get_dims(zb__json_get(zb__json_get(v, "configuration"), "chunk_shape"), doc,
                    "chunk_grid chunk_shape", true, m->ndim, &nchunks, m->chunks));

    ZB_TRY(v3_key_encoding(zb__json_get(obj, "chunk_key_encoding"), doc, m));

    if (!has_key(obj, "fill_value", &v))
        return zb__err(ZB_E_METADATA, "%s: fill_value is missing", doc);
    ZB_TRY(zb__fill_parse(v, m->dtype, 3, doc, m->fill, &m->fill_null));

    if (has_key(obj, "storage_transformers", &v) && v) {
        if (!json_object_is_type(v, json_type_array))
            return zb__err(ZB_E_METADATA, "%s: storage_transformers is not a list", doc);
        if (json_object_array_length(v))
            return zb__err(ZB_E_UNSUPPORTED, "%s: storage_transformers are not supported", doc);
    }
    if (has_key(obj, "dimension_names", &v) && v) {
        bool ok = json_object_is_type(v, json_type_array) &&
                  json_object_array_length(v) == (size_t)m->ndim;
        for (int i = 0; ok && i < m->ndim; i++) {
            json_object *d = json_object_array_get_idx(v, (size_t)i);
            ok = !d || json_object_is_type(d, json_type_string);
        }
        if (!ok)
            return zb__err(ZB_E_METADATA,
                           "%s: dimension_names is not a list of %d strings or nulls", doc,
                           m->ndim);
    }
    json_object *attrs = NULL;
    if (has_key(obj, "attributes", &attrs) && attrs &&
        !json_object_is_type(attrs, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: attributes is not an object", doc);

    ZB_TRY(overflow_check(m->shape, m->ndim, m->itemsize, doc, "shape", NULL));
    ZB_TRY(overflow_check(m->chunks, m->ndim, m->itemsize, doc, "chunk_shape", NULL));

    v = zb__json_get(obj, "codecs");
    if (!v) return zb__err(ZB_E_METADATA, "%s: codecs is missing", doc);
    st = v3_chain(v, doc, "codecs", m->dtype, m->ndim, m->chunks, false, &m->chain, &desc);
    if (st != ZB_OK) goto fail;

    m->attrs_json = strdup(attrs ? zb__json_text(attrs) : "{}");
    if (!m->attrs_json) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", doc);
        goto fail;
    }
    st = desc_finish(&desc, &m->codecs_desc);
    if (st != ZB_OK) goto fail;
    return ZB_OK;

fail:
    zb__buf_free(&desc);
    return st;
}

/* ---- public --------------------------------------------------------------------------- */

static void
chain_free(zb__chain *c)
{
    if (!c) return;
    if (c->shard) {
        if (c->shard->inner_chain) {
            chain_free(c->shard->inner_chain);
            free(c->shard->inner_chain);
        }
        free(c->shard);
        c->shard = NULL;
    }
}

void
zb__meta_free(zb__array_meta *m)
{
    if (!m) return;
    chain_free(&m->chain);
    free(m->attrs_json);
    free(m->codecs_desc);
    memset(m, 0, sizeof *m);
}

zb_status
zb__meta_from_v2_obj(void *zarray_obj, void *zattrs_obj, const char *where, zb__array_meta *out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__meta_from_v2_obj: null out");
    memset(out, 0, sizeof *out);
    zb_status st = v2_parse(zarray_obj, zattrs_obj, where, out);
    if (st != ZB_OK) zb__meta_free(out);
    return st;
}

zb_status
zb__meta_from_v3_obj(void *obj, const char *where, zb__array_meta *out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__meta_from_v3_obj: null out");
    memset(out, 0, sizeof *out);
    zb_status st = v3_parse(obj, where, out);
    if (st != ZB_OK) zb__meta_free(out);
    return st;
}

zb_status
zb__meta_parse_v2(const char *zarray, size_t zarray_len, const char *zattrs, size_t zattrs_len,
                  const char *where, zb__array_meta *out)
{
    char doc[DOC_CAP];
    json_object *za = NULL, *at = NULL;
    if (!out) return zb__err(ZB_E_INVALID, "zb__meta_parse_v2: null out");
    memset(out, 0, sizeof *out);
    doc_name(doc, sizeof doc, where, ".zarray");
    zb_status st = zb__json_parse(zarray, zarray_len, doc, &za);
    if (st == ZB_OK && zattrs) {
        doc_name(doc, sizeof doc, where, ".zattrs");
        st = zb__json_parse(zattrs, zattrs_len, doc, &at);
    }
    if (st == ZB_OK) st = zb__meta_from_v2_obj(za, at, where, out);
    json_object_put(za);
    json_object_put(at);
    return st;
}

zb_status
zb__meta_parse_v3(const char *json, size_t len, const char *where, zb__array_meta *out)
{
    char doc[DOC_CAP];
    json_object *obj = NULL;
    if (!out) return zb__err(ZB_E_INVALID, "zb__meta_parse_v3: null out");
    memset(out, 0, sizeof *out);
    doc_name(doc, sizeof doc, where, "zarr.json");
    zb_status st = zb__json_parse(json, len, doc, &obj);
    if (st == ZB_OK) st = zb__meta_from_v3_obj(obj, where, out);
    json_object_put(obj);
    return st;
}

zb_status
zb__meta_chunk_key(const zb__array_meta *m, const char *path, const uint64_t *idx, char *buf,
                   size_t cap)
{
    if (!m || !buf || cap == 0 || (m->ndim && !idx))
        return zb__err(ZB_E_INVALID, "zb__meta_chunk_key: null argument");
    size_t n = 0;
    int w;
    if (path && *path) {
        w = snprintf(buf, cap, "%s/", path);
        if (w < 0 || (size_t)w >= cap) goto too_long;
        n = (size_t)w;
    }
    if (m->ndim == 0) {
        w = snprintf(buf + n, cap - n, "%s", m->zero_dim_key);
        if (w < 0 || (size_t)w >= cap - n) goto too_long;
        return ZB_OK;
    }
    w = snprintf(buf + n, cap - n, "%s", m->key_prefix);
    if (w < 0 || (size_t)w >= cap - n) goto too_long;
    n += (size_t)w;
    for (int i = 0; i < m->ndim; i++) {
        if (i) {
            if (n + 1 >= cap) goto too_long;
            buf[n++] = m->sep;
            buf[n] = '\0';
        }
        w = snprintf(buf + n, cap - n, "%llu", (unsigned long long)idx[i]);
        if (w < 0 || (size_t)w >= cap - n) goto too_long;
        n += (size_t)w;
    }
    return ZB_OK;

too_long:
    buf[0] = '\0';
    return zb__err(ZB_E_INVALID, "chunk key under \"%.64s\" does not fit in %zu bytes",
                   path ? path : "", cap);
}
