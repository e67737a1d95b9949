/* The anndata writer: CSR and dense X streamed in blocks, obs/var columns of every kind, the
 * element attributes of FORMATS.md §6, consolidated metadata, the incomplete-marker protocol,
 * and every bad input it must refuse. Each store is read back array by array with the read
 * engine and compared with the values that were written. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static bool
has_key(zb_store *s, const char *key)
{
    uint64_t size;
    zb_status st = zb_store_size(s, key, &size);
    if (st != ZB_OK && st != ZB_E_NOTFOUND) fail_msg("size %s: %s", key, zb_last_error());
    return st == ZB_OK;
}

static json_object *
read_json(zb_store *s, const char *key)
{
    uint8_t *text = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, key, &text, &len));
    json_object *doc = json_tokener_parse((const char *)text);
    free(text);
    if (!doc) fail_msg("%s is not JSON", key);
    return doc;
}

static const char *
jstr(json_object *obj, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(obj, key, &v)) fail_msg("no key '%s'", key);
    return json_object_get_string(v);
}

/* The attributes of node `path`: v3 zarr.json "attributes", v2 .zattrs. Caller puts *doc. */
static json_object *
node_attrs(zb_store *s, int fmt, const char *path, json_object **doc)
{
    char key[512];
    if (fmt == 3) {
        snprintf(key, sizeof key, "%s/zarr.json", path);
        *doc = read_json(s, key);
        json_object *a = NULL;
        assert_true(json_object_object_get_ex(*doc, "attributes", &a));
        return a;
    }
    snprintf(key, sizeof key, "%s/.zattrs", path);
    *doc = read_json(s, key);
    return *doc;
}

static void
assert_encoding(zb_store *s, int fmt, const char *path, const char *type, const char *version)
{
    json_object *doc = NULL;
    json_object *a = node_attrs(s, fmt, path, &doc);
    assert_string_equal(jstr(a, "encoding-type"), type);
    assert_string_equal(jstr(a, "encoding-version"), version);
    json_object_put(doc);
}

static zb_array *
open_array(zb_store *s, const char *path, zb_dtype want_dtype, uint64_t want_rows)
{
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    if (info.dtype != want_dtype)
        fail_msg("%s: dtype %s, want %s", path, zb_dtype_name(info.dtype),
                 zb_dtype_name(want_dtype));
    assert_int_equal(info.shape[0], want_rows);
    return a;
}

/* Reads a whole fixed-size 1-d or 2-d array and compares it with `want`. */
static void
assert_array(zb_store *s, const char *path, zb_dtype dtype, uint64_t rows, const void *want,
             size_t nbytes)
{
    zb_array *a = open_array(s, path, dtype, rows);
    void *got = malloc(nbytes ? nbytes : 1);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, rows, got, nbytes, NULL));
    if (memcmp(got, want, nbytes) != 0) fail_msg("%s: values differ", path);
    free(got);
    zb_array_close(a);
}

static void
assert_strings(zb_store *s, const char *path, const char *const *want, uint64_t n)
{
    zb_array *a = open_array(s, path, ZB_DT_STRING, n);
    zb_strings got;
    ZB_ASSERT_OK(zb_array_read_strings(a, 0, n, &got, NULL));
    assert_int_equal(got.n, n);
    for (uint64_t i = 0; i < n; i++) {
        size_t len = (size_t)(got.offsets[i + 1] - got.offsets[i]);
        if (len != strlen(want[i]) || memcmp(got.data + got.offsets[i], want[i], len) != 0)
            fail_msg("%s[%llu] = '%.*s', want '%s'", path, (unsigned long long)i, (int)len,
                     got.data + got.offsets[i], want[i]);
    }
    zb_strings_free(&got);
    zb_array_close(a);
}

/* Packs n C strings into data + offsets[n+1] (caller frees both). */
static void
pack(const char *const *v, uint64_t n, char **data, uint64_t **offsets)
{
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += strlen(v[i]);
    *data = malloc(total + 1);
    *offsets = malloc((n + 1) * sizeof **offsets);
    (*offsets)[0] = 0;
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        memcpy(*data + pos, v[i], len);
        pos += len;
        (*offsets)[i + 1] = pos;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* A 5 x 7 CSR matrix with obs and var columns of every kind                                  */
/* ------------------------------------------------------------------------------------------ */

enum { NOBS = 5, NVARS = 7, NNZ = 9 };
/* rows: {0:1, 3:2}, {}, {6:3}, {1:4, 2:5, 5:6}, {0:7, 4:8, 6:9} */
static const int64_t INDPTR[NOBS + 1] = {0, 2, 2, 3, 6, 9};
static const int32_t INDICES[NNZ] = {0, 3, 6, 1, 2, 5, 0, 4, 6};
static const float DATA[NNZ] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const char *const OBS_NAMES[NOBS] = {"cell_0", "cell_1", "cell_2", "cell_3", "cell_é"};
static const char *const VAR_NAMES[NVARS] = {"g0", "g1", "g2", "g3", "g4", "g5", "g6"};
static const int32_t N_GENES[NOBS] = {2, 0, 1, 3, 3};
static const double SCORE[NOBS] = {0.5, -1.25, 3.0, 1e300, -0.0};
static const uint8_t FLAG[NOBS] = {1, 0, 0, 1, 1};
static const char *const DRUG[NOBS] = {"x", "", "yy", "x", "z"};
static const char *const CATS[3] = {"A549", "HeLa", "MCF7"};
static const int32_t CODES32[NOBS] = {2, 0, -1, 1, 2};
static const int8_t CODES8[NOBS] = {2, 0, -1, 1, 2};
static const float VAR_MEAN[NVARS] = {0, 1, 2, 3, 4, 5, 6};

/* Writes the 5 x 7 store at `path` of `s` with `opts`: X in blocks of {2, 0, 3} rows whose
 * indptr slices start where they lie in INDPTR (not at 0), obs columns in pieces, one
 * categorical with int32 codes (narrowed to int8 on the way). Checks the marker protocol. */
static void
write_small(zb_store *s, const char *path, const zb_anndata_write_opts *opts)
{
    char marker[256], root[256];
    snprintf(marker, sizeof marker, "%s%s" ZB_INCOMPLETE_MARKER, path, *path ? "/" : "");
    snprintf(root, sizeof root, "%s%s%s", path, *path ? "/" : "",
             opts->zarr_format == 3 ? "zarr.json" : ".zgroup");
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, path, NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, opts, &w));
    assert_true(has_key(s, marker));
    json_object *m = read_json(s, marker);
    assert_non_null(strstr(jstr(m, "writer"), "zbatch"));
    json_object_put(m);

    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, INDPTR, INDICES, DATA));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 0, INDPTR + 2, NULL, NULL));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 3, INDPTR + 2, INDICES + 2, DATA + 2));
    assert_int_equal(zb_anndata_writer_rows(w), NOBS);
    assert_int_equal(zb_anndata_writer_nnz(w), NNZ);

    char *d;
    uint64_t *o;
    pack(OBS_NAMES, NOBS, &d, &o);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, d, o, 3));
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, d, o + 3, 2));
    free(d);
    free(o);
    pack(VAR_NAMES, NVARS, &d, &o);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, d, o, NVARS));
    free(d);
    free(o);

    pack(CATS, 3, &d, &o);
    ZB_ASSERT_OK(
        zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "cell_line", d, o, 3, false));
    free(d);
    free(o);
    ZB_ASSERT_OK(
        zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "cell_line", ZB_DT_INT32, CODES32, 4));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "n_genes", ZB_DT_INT32, N_GENES, NOBS));
    ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "cell_line", ZB_DT_INT32,
                                                CODES32 + 4, 1));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "score", ZB_DT_FLOAT64, SCORE, 2));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "score", ZB_DT_FLOAT64, SCORE + 2, 3));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "flag", ZB_DT_BOOL, FLAG, NOBS));
    pack(DRUG, NOBS, &d, &o);
    ZB_ASSERT_OK(zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, "drug", d, o, NOBS));
    free(d);
    free(o);
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_VAR, "mean", ZB_DT_FLOAT32, VAR_MEAN, NVARS));

    /* nothing a reader would take for a store before the commit */
    assert_false(has_key(s, root));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    assert_true(has_key(s, root));
    assert_false(has_key(s, marker));
    /* a committed writer takes nothing more */
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 1, INDPTR, INDICES, DATA), ZB_E_INVALID,
                  "committed");
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "committed");
    zb_anndata_writer_close(w);
}

/* Reads every array of the 5 x 7 store back and checks every attribute anndata needs. */
static void
check_small(zb_store *s, const char *path, int fmt)
{
    char p[256];
#define AT(rel) (snprintf(p, sizeof p, "%s%s%s", path, *path ? "/" : "", rel), p)
    assert_encoding(s, fmt, path, "anndata", "0.1.0");
    assert_encoding(s, fmt, AT("X"), "csr_matrix", "0.1.0");
    json_object *doc = NULL;
    json_object *a = node_attrs(s, fmt, AT("X"), &doc);
    json_object *shape = NULL;
    assert_true(json_object_object_get_ex(a, "shape", &shape));
    assert_int_equal(json_object_array_length(shape), 2);
    assert_int_equal(json_object_get_int64(json_object_array_get_idx(shape, 0)), NOBS);
    assert_int_equal(json_object_get_int64(json_object_array_get_idx(shape, 1)), NVARS);
    json_object_put(doc);

    assert_array(s, AT("X/data"), ZB_DT_FLOAT32, NNZ, DATA, sizeof DATA);
    assert_array(s, AT("X/indices"), ZB_DT_INT32, NNZ, INDICES, sizeof INDICES);
    assert_array(s, AT("X/indptr"), ZB_DT_INT64, NOBS + 1, INDPTR, sizeof INDPTR);

    /* obs: the dataframe attributes, column-order in creation order */
    a = node_attrs(s, fmt, AT("obs"), &doc);
    assert_string_equal(jstr(a, "encoding-type"), "dataframe");
    assert_string_equal(jstr(a, "encoding-version"), "0.2.0");
    assert_string_equal(jstr(a, "_index"), "_index");
    json_object *order = NULL;
    assert_true(json_object_object_get_ex(a, "column-order", &order));
    static const char *const cols[] = {"cell_line", "n_genes", "score", "flag", "drug"};
    assert_int_equal(json_object_array_length(order), 5);
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(json_object_get_string(json_object_array_get_idx(order, i)), cols[i]);
    json_object_put(doc);

    assert_strings(s, AT("obs/_index"), OBS_NAMES, NOBS);
    assert_encoding(s, fmt, AT("obs/_index"), "string-array", "0.2.0");
    assert_array(s, AT("obs/n_genes"), ZB_DT_INT32, NOBS, N_GENES, sizeof N_GENES);
    assert_encoding(s, fmt, AT("obs/n_genes"), "array", "0.2.0");
    assert_array(s, AT("obs/score"), ZB_DT_FLOAT64, NOBS, SCORE, sizeof SCORE);
    assert_array(s, AT("obs/flag"), ZB_DT_BOOL, NOBS, FLAG, sizeof FLAG);
    assert_encoding(s, fmt, AT("obs/flag"), "array", "0.2.0");
    assert_strings(s, AT("obs/drug"), DRUG, NOBS);
    assert_encoding(s, fmt, AT("obs/drug"), "string-array", "0.2.0");

    a = node_attrs(s, fmt, AT("obs/cell_line"), &doc);
    assert_string_equal(jstr(a, "encoding-type"), "categorical");
    assert_string_equal(jstr(a, "encoding-version"), "0.2.0");
    json_object *ordered = NULL;
    assert_true(json_object_object_get_ex(a, "ordered", &ordered));
    assert_true(json_object_is_type(ordered, json_type_boolean));
    assert_false(json_object_get_boolean(ordered));
    json_object_put(doc);
    /* 3 categories: pandas' int8 codes, -1 kept */
    assert_array(s, AT("obs/cell_line/codes"), ZB_DT_INT8, NOBS, CODES8, sizeof CODES8);
    assert_encoding(s, fmt, AT("obs/cell_line/codes"), "array", "0.2.0");
    assert_strings(s, AT("obs/cell_line/categories"), CATS, 3);
    assert_encoding(s, fmt, AT("obs/cell_line/categories"), "string-array", "0.2.0");

    a = node_attrs(s, fmt, AT("var"), &doc);
    assert_string_equal(jstr(a, "encoding-type"), "dataframe");
    assert_true(json_object_object_get_ex(a, "column-order", &order));
    assert_int_equal(json_object_array_length(order), 1);
    json_object_put(doc);
    assert_strings(s, AT("var/_index"), VAR_NAMES, NVARS);
    assert_array(s, AT("var/mean"), ZB_DT_FLOAT32, NVARS, VAR_MEAN, sizeof VAR_MEAN);

    static const char *const dicts[] = {"layers", "obsm", "obsp", "varm", "varp", "uns"};
    for (size_t i = 0; i < 6; i++) assert_encoding(s, fmt, AT(dicts[i]), "dict", "0.1.0");
#undef AT
}

/* X of the 5 x 7 matrix and the marker's absence, for stores written without the columns. */
static void
check_small_x(zb_store *s)
{
    assert_array(s, "X/data", ZB_DT_FLOAT32, NNZ, DATA, sizeof DATA);
    assert_array(s, "X/indices", ZB_DT_INT32, NNZ, INDICES, sizeof INDICES);
    assert_array(s, "X/indptr", ZB_DT_INT64, NOBS + 1, INDPTR, sizeof INDPTR);
    assert_array(s, "obs/c/codes", ZB_DT_INT8, NOBS, CODES8, sizeof CODES8);
    assert_false(has_key(s, ZB_INCOMPLETE_MARKER));
}

/* Consolidated metadata names every node with its full document. */
static void
check_consolidated_v3(zb_store *s, const char *key)
{
    json_object *root = read_json(s, key);
    json_object *cm = NULL, *meta = NULL, *entry = NULL;
    assert_true(json_object_object_get_ex(root, "consolidated_metadata", &cm));
    assert_string_equal(jstr(cm, "kind"), "inline");
    assert_true(json_object_object_get_ex(cm, "metadata", &meta));
    static const char *const arrays[] = {
        "X/data",      "X/indices",           "X/indptr",
        "obs/_index",  "obs/cell_line/codes", "obs/cell_line/categories",
        "obs/n_genes", "obs/score",           "obs/flag",
        "obs/drug",    "var/_index",          "var/mean"};
    static const char *const groups[] = {"X",    "obs",  "var",  "obs/cell_line", "layers",
                                         "obsm", "obsp", "varm", "varp",          "uns"};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) {
        if (!json_object_object_get_ex(meta, arrays[i], &entry)) fail_msg("no %s", arrays[i]);
        assert_string_equal(jstr(entry, "node_type"), "array");
    }
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
        if (!json_object_object_get_ex(meta, groups[i], &entry)) fail_msg("no %s", groups[i]);
        assert_string_equal(jstr(entry, "node_type"), "group");
    }
    assert_int_equal(json_object_object_length(meta),
                     sizeof arrays / sizeof *arrays + sizeof groups / sizeof *groups);
    json_object_object_get_ex(meta, "obs/cell_line/codes", &entry);
    assert_string_equal(jstr(entry, "data_type"), "int8");
    json_object_put(root);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static void
test_csr_v3_memory(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 4; /* several chunks per array, a partial last one */
    write_small(s, "", &o);
    check_small(s, "", 3);
    check_consolidated_v3(s, "zarr.json");
    zb_store_close(s);
}

static void
test_csr_v3_sharded_subpath(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 2;
    o.x_shard = 4;
    o.codec = "blosc:lz4:5:shuffle";
    o.num_threads = 3;
    write_small(s, "coll/dataset_0", &o);
    check_small(s, "coll/dataset_0", 3);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "coll/dataset_0/X/data", &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_non_null(info.shard_shape);
    assert_int_equal(info.shard_shape[0], 4);
    assert_int_equal(info.chunk_shape[0], 2);
    assert_non_null(strstr(info.codecs, "blosc"));
    zb_array_close(a);
    zb_store_close(s);
}

static void
test_csr_v2_file(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("anndata_v2");
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.codec = "blosc:lz4:5:shuffle";
    o.x_chunk = 3;
    write_small(s, "", &o);
    check_small(s, "", 2);
    /* v2 consolidated metadata: keys with their .zarray/.zgroup/.zattrs suffix */
    json_object *zm = read_json(s, ".zmetadata"), *meta = NULL, *e = NULL;
    assert_int_equal(json_object_get_int(json_object_object_get(zm, "zarr_consolidated_format")),
                     1);
    assert_true(json_object_object_get_ex(zm, "metadata", &meta));
    static const char *const keys[] = {".zgroup",
                                       ".zattrs",
                                       "X/.zgroup",
                                       "X/.zattrs",
                                       "X/data/.zarray",
                                       "obs/cell_line/.zattrs",
                                       "obs/cell_line/codes/.zarray",
                                       "obs/_index/.zattrs",
                                       "uns/.zgroup"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!json_object_object_get_ex(meta, keys[i], &e)) fail_msg("no %s", keys[i]);
    json_object_object_get_ex(meta, "obs/cell_line/codes/.zarray", &e);
    assert_string_equal(jstr(e, "dtype"), "|i1");
    json_object_object_get_ex(meta, ".zattrs", &e);
    assert_string_equal(jstr(e, "encoding-type"), "anndata");
    json_object_put(zm);
    zb_store_close(s);
}

static void
test_dense_default_names(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 2;
    o.x_shard = 4;
    o.consolidate = false;
    enum { R = 9, C = 3 };
    double x[R * C];
    for (int i = 0; i < R * C; i++) x[i] = i * 0.5 - 3;
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "d", C, ZB_ANNDATA_X_DENSE, ZB_DT_FLOAT64, &o, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_dense(w, 4, x));
    ZB_ASSERT_OK(zb_anndata_writer_append_dense(w, 5, x + 4 * C));
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 1, INDPTR, INDICES, DATA), ZB_E_TYPE, "dense");
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);

    assert_encoding(s, 3, "d/X", "array", "0.2.0");
    zb_array *a = open_array(s, "d/X", ZB_DT_FLOAT64, R);
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[1], C);
    assert_int_equal(info.shard_shape[0], 4);
    double got[R * C];
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, R, got, sizeof got, NULL));
    assert_memory_equal(got, x, sizeof x);
    zb_array_close(a);
    /* anndata's default names: the row numbers */
    static const char *const obs[R] = {"0", "1", "2", "3", "4", "5", "6", "7", "8"};
    static const char *const var[C] = {"0", "1", "2"};
    assert_strings(s, "d/obs/_index", obs, R);
    assert_strings(s, "d/var/_index", var, C);
    assert_false(has_key(s, "d/" ZB_INCOMPLETE_MARKER));
    json_object *root = read_json(s, "d/zarr.json");
    assert_false(json_object_object_get_ex(root, "consolidated_metadata", NULL));
    json_object_put(root);
    zb_store_close(s);
}

/* pandas' rule: int8 below 127 categories, int16 from 127, int32 from 32767. */
static void
test_codes_dtype_rule(void **state)
{
    (void)state;
    static const uint64_t ncats[] = {0, 126, 127, 32766, 32767};
    static const zb_dtype want[] = {ZB_DT_INT8, ZB_DT_INT8, ZB_DT_INT16, ZB_DT_INT16, ZB_DT_INT32};
    enum { MAXC = 32767 };
    char *text = malloc(MAXC * 6);
    uint64_t *offs = malloc((MAXC + 1) * sizeof *offs);
    offs[0] = 0;
    for (uint64_t i = 0; i < MAXC; i++)
        offs[i + 1] = offs[i] + (uint64_t)sprintf(text + offs[i], "c%llu", (unsigned long long)i);
    for (size_t k = 0; k < sizeof ncats / sizeof *ncats; k++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_anndata_writer *w = NULL;
        ZB_ASSERT_OK(zb_anndata_writer_open(s, "", 1, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w));
        int64_t ip[3] = {0, 0, 0};
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, ip, NULL, NULL));
        ZB_ASSERT_OK(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "c", text, offs,
                                                          ncats[k], true));
        int64_t codes[2] = {-1, (int64_t)ncats[k] - 1};
        ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT64, codes, 2));
        ZB_ASSERT_OK(zb_anndata_writer_commit(w));
        zb_anndata_writer_close(w);
        zb_array *a = open_array(s, "obs/c/codes", want[k], 2);
        int32_t got32[2] = {0, 0};
        int16_t got16[2] = {0, 0};
        int8_t got8[2] = {0, 0};
        void *dst = want[k] == ZB_DT_INT8    ? (void *)got8
                    : want[k] == ZB_DT_INT16 ? (void *)got16
                                             : (void *)got32;
        ZB_ASSERT_OK(zb_array_read_rows(a, 0, 2, dst, 2 * zb_dtype_size(want[k]), NULL));
        int64_t g0 = want[k] == ZB_DT_INT8 ? got8[0] : want[k] == ZB_DT_INT16 ? got16[0] : got32[0];
        int64_t g1 = want[k] == ZB_DT_INT8 ? got8[1] : want[k] == ZB_DT_INT16 ? got16[1] : got32[1];
        assert_int_equal(g0, -1);
        assert_int_equal(g1, (int64_t)ncats[k] - 1);
        zb_array_close(a);
        json_object *doc = NULL;
        json_object *attrs = node_attrs(s, 3, "obs/c", &doc);
        assert_true(json_object_get_boolean(json_object_object_get(attrs, "ordered")));
        json_object_put(doc);
        zb_store_close(s);
    }
    free(text);
    free(offs);
}

static void
test_bad_inputs(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_writer *w = NULL;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;

    o.zarr_format = 4;
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w),
                  ZB_E_INVALID, "zarr_format");
    assert_null(w);
    o = (zb_anndata_write_opts)ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.x_shard = 64;
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w),
                  ZB_E_INVALID, "shard");
    o = (zb_anndata_write_opts)ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 10;
    o.x_shard = 25;
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w),
                  ZB_E_INVALID, "multiple");
    o = (zb_anndata_write_opts)ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.codec = "snappy:9";
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w),
                  ZB_E_INVALID, NULL);
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_STRING, NULL, &w),
                  ZB_E_INVALID, "fixed-size");
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", (uint64_t)INT32_MAX + 1, ZB_ANNDATA_X_CSR,
                                         ZB_DT_FLOAT32, NULL, &w),
                  ZB_E_INVALID, "int32");
    /* a failed open leaves no marker behind when it fails before writing it */
    assert_false(has_key(s, ZB_INCOMPLETE_MARKER));

    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w));
    int64_t down[3] = {0, 2, 1};
    int32_t idx[3] = {0, 1, 2};
    float val[3] = {1, 2, 3};
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 2, down, idx, val), ZB_E_INVALID,
                  "decreases at row 1");
    int64_t neg[2] = {-1, 1};
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 1, neg, idx, val), ZB_E_INVALID, "negative");
    int64_t ip[3] = {10, 11, 13};
    int32_t wide[3] = {0, 2, 3};
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 2, ip, wide, val), ZB_E_INVALID,
                  "column id 3 of element 2 (row 1");
    int32_t minus[3] = {0, -1, 2};
    ZB_ASSERT_ERR(zb_anndata_writer_append_csr(w, 2, ip, minus, val), ZB_E_INVALID, "column id -1");
    ZB_ASSERT_ERR(zb_anndata_writer_append_dense(w, 1, val), ZB_E_TYPE, "CSR");
    /* the refused blocks left nothing behind */
    assert_int_equal(zb_anndata_writer_rows(w), 0);
    assert_int_equal(zb_anndata_writer_nnz(w), 0);
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, ip, idx, val));

    uint8_t two[2] = {1, 2};
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "b", ZB_DT_BOOL, two, 2),
                  ZB_E_INVALID, "not 0 or 1");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "a/b", ZB_DT_INT8, two, 2),
                  ZB_E_INVALID, "'/'");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "_index", ZB_DT_INT8, two, 2),
                  ZB_E_INVALID, "_index");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "__x", ZB_DT_INT8, two, 2),
                  ZB_E_INVALID, "reserved");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "", ZB_DT_INT8, two, 2),
                  ZB_E_INVALID, "empty");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, (zb_anndata_axis)2, "x", ZB_DT_INT8, two, 2),
                  ZB_E_INVALID, "axis");
    int8_t v4[4] = {1, 2, 3, 4};
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_VAR, "x", ZB_DT_INT8, v4, 4),
                  ZB_E_INVALID, "exceed n_vars 3");
    ZB_ASSERT_OK(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "i8", ZB_DT_INT8, v4, 1));
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "i8", ZB_DT_INT16, v4, 1),
                  ZB_E_TYPE, "int8");

    const char cats[] = "aba";
    uint64_t co[4] = {0, 1, 2, 3};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "ct", cats, co, 3, false),
                  ZB_E_INVALID, "'a' appears more than once");
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "i8", cats, co, 2, false),
                  ZB_E_INVALID, "exists");
    ZB_ASSERT_OK(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "ct", cats, co, 2, false));
    int16_t badc[2] = {1, 2};
    ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT16, badc, 2),
                  ZB_E_INVALID, "code 2 at 1");
    int16_t low[1] = {-2};
    ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT16, low, 1),
                  ZB_E_INVALID, "code -2");
    ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_UINT8, low, 1),
                  ZB_E_TYPE, "int8, int16");
    ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "nope", ZB_DT_INT8, low, 1),
                  ZB_E_NOTFOUND, "nope");
    ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "i8", ZB_DT_INT8, v4, 1),
                  ZB_E_TYPE, "not a categorical");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT8, v4, 1),
                  ZB_E_TYPE, "categorical");
    uint64_t so[3] = {0, 2, 1};
    ZB_ASSERT_ERR(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, "abc", so, 2), ZB_E_INVALID,
                  "offsets decrease at string 1");

    /* short columns refuse the commit, which leaves the writer usable */
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "obs/i8: 1 values, n_obs");
    ZB_ASSERT_OK(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "i8", ZB_DT_INT8, v4 + 1, 1));
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "obs/ct: 0 values");
    int16_t good[2] = {1, -1};
    ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT16, good, 2));
    assert_true(has_key(s, ZB_INCOMPLETE_MARKER));
    assert_false(has_key(s, "zarr.json"));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    assert_false(has_key(s, ZB_INCOMPLETE_MARKER));
    int8_t codes[2];
    zb_array *a = open_array(s, "obs/ct/codes", ZB_DT_INT8, 2);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 2, codes, sizeof codes, NULL));
    assert_int_equal(codes[0], 1);
    assert_int_equal(codes[1], -1);
    zb_array_close(a);

    /* a store is never written over */
    w = (zb_anndata_writer *)&o; /* *out must be reset on failure */
    ZB_ASSERT_ERR(zb_anndata_writer_open(s, "", 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w),
                  ZB_E_INVALID, "already holds");
    assert_null(w);
    zb_anndata_writer_close(NULL);
    assert_int_equal(zb_anndata_writer_rows(NULL), 0);
    zb_store_close(s);
}

/* A writer closed without commit leaves its marker and no root document. */
static void
test_uncommitted_leaves_marker(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "a", 7, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NOBS, INDPTR, INDICES, DATA));
    zb_anndata_writer_close(w);
    assert_true(has_key(s, "a/" ZB_INCOMPLETE_MARKER));
    assert_false(has_key(s, "a/zarr.json"));
    assert_false(has_key(s, "a/X/zarr.json"));
    /* the reader refuses the path with the marker; nothing else is affected */
    char *json = NULL;
    ZB_ASSERT_ERR(zb_info_json(s, "a", &json), ZB_E_INCOMPLETE, "incomplete: a write was not");
    assert_null(json);
    zb_store_close(s);
}

/* A committed store with a marker put back is refused until the marker goes. */
static void
test_reader_refuses_marker(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    write_small(s, "d", &o);
    char *json = NULL;
    ZB_ASSERT_OK(zb_info_json(s, "d", &json));
    assert_non_null(strstr(json, "\"anndata\""));
    free(json);
    json = NULL;
    zbt_put_str(s, "d/" ZB_INCOMPLETE_MARKER, "{}");
    ZB_ASSERT_ERR(zb_info_json(s, "d", &json), ZB_E_INCOMPLETE, "d/" ZB_INCOMPLETE_MARKER);
    ZB_ASSERT_OK(zb_store_erase(s, "d/" ZB_INCOMPLETE_MARKER));
    ZB_ASSERT_OK(zb_info_json(s, "d", &json));
    free(json);
    zb_store_close(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Nullable columns                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* The masked values of a nullable column as the caller holds them: garbage under the mask,
 * which the store must not keep (anndata stores 0 / false / ""). NA at the first, a middle
 * and the last row. */
static const int32_t NI_IN[NOBS] = {99, 7, -5, 77, 1234};
static const uint8_t NI_MASK[NOBS] = {1, 0, 0, 1, 1};
static const int32_t NI_WANT[NOBS] = {0, 7, -5, 0, 0};
static const uint8_t NB_IN[NOBS] = {7, 1, 0, 1, 2}; /* 7 and 2 lie under the mask */
static const uint8_t NB_MASK[NOBS] = {1, 0, 0, 0, 1};
static const uint8_t NB_WANT[NOBS] = {0, 1, 0, 1, 0};
static const char *const NS_IN[NOBS] = {"\xff\xfe", "b", "", "\xc3\xa9t\xc3\xa9", "junk"};
static const uint8_t NS_MASK[NOBS] = {1, 0, 0, 0, 1};
static const char *const NS_WANT[NOBS] = {"", "b", "", "été", ""};
static const uint16_t NV_IN[NVARS] = {1, 2, 3, 4, 5, 6, 65535};

/* A 5 x 7 store with nullable obs columns streamed in two blocks and one var column without a
 * mask. */
static void
write_nullable(zb_store *s, int fmt)
{
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = fmt;
    o.column_chunk = 2; /* several chunks per column */
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NOBS, INDPTR, INDICES, DATA));
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32,
                                                          NI_IN, 2, NI_MASK, 2));
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32,
                                                          NI_IN + 2, 3, NI_MASK + 2, 3));
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nb", ZB_DT_BOOL,
                                                          NB_IN, NOBS, NB_MASK, NOBS));
    char *d;
    uint64_t *off;
    pack(NS_IN, NOBS, &d, &off);
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", d, off, 1,
                                                                 NS_MASK, 1));
    /* offsets of the second block start where they lie in the first call's buffer */
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", d,
                                                                 off + 1, 4, NS_MASK + 1, 4));
    free(d);
    free(off);
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_VAR, "nv", ZB_DT_UINT16,
                                                          NV_IN, NVARS, NULL, 0));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
}

static void
check_nullable(zb_store *s, int fmt)
{
    assert_encoding(s, fmt, "obs/ni", "nullable-integer", "0.1.0");
    assert_encoding(s, fmt, "obs/nb", "nullable-boolean", "0.1.0");
    assert_encoding(s, fmt, "obs/ns", "nullable-string-array", "0.1.0");
    assert_encoding(s, fmt, "var/nv", "nullable-integer", "0.1.0");
    assert_encoding(s, fmt, "obs/ni/values", "array", "0.2.0");
    assert_encoding(s, fmt, "obs/ni/mask", "array", "0.2.0");
    assert_encoding(s, fmt, "obs/ns/values", "string-array", "0.2.0");
    assert_array(s, "obs/ni/values", ZB_DT_INT32, NOBS, NI_WANT, sizeof NI_WANT);
    assert_array(s, "obs/ni/mask", ZB_DT_BOOL, NOBS, NI_MASK, sizeof NI_MASK);
    assert_array(s, "obs/nb/values", ZB_DT_BOOL, NOBS, NB_WANT, sizeof NB_WANT);
    assert_array(s, "obs/nb/mask", ZB_DT_BOOL, NOBS, NB_MASK, sizeof NB_MASK);
    assert_strings(s, "obs/ns/values", NS_WANT, NOBS);
    assert_array(s, "obs/ns/mask", ZB_DT_BOOL, NOBS, NS_MASK, sizeof NS_MASK);
    static const uint8_t none[NVARS] = {0};
    assert_array(s, "var/nv/values", ZB_DT_UINT16, NVARS, NV_IN, sizeof NV_IN);
    assert_array(s, "var/nv/mask", ZB_DT_BOOL, NVARS, none, sizeof none);
    json_object *doc = NULL;
    json_object *a = node_attrs(s, fmt, "obs", &doc);
    json_object *order = json_object_object_get(a, "column-order");
    assert_int_equal(json_object_array_length(order), 3);
    assert_string_equal(json_object_get_string(json_object_array_get_idx(order, 2)), "ns");
    json_object_put(doc);
}

static void
test_nullable_columns(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        write_nullable(s, fmt);
        check_nullable(s, fmt);
        if (fmt == 3) {
            /* the groups and both arrays of each are in the consolidated metadata */
            json_object *root = read_json(s, "zarr.json");
            json_object *meta = json_object_object_get(
                json_object_object_get(root, "consolidated_metadata"), "metadata");
            static const char *const keys[] = {"obs/ns", "obs/ns/values", "obs/ns/mask", "var/nv",
                                               "var/nv/mask"};
            for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
                if (!json_object_object_get_ex(meta, keys[i], NULL)) fail_msg("no %s", keys[i]);
            assert_string_equal(jstr(json_object_object_get(meta, "obs/ns"), "node_type"), "group");
            json_object_put(root);
        } else {
            json_object *zm = read_json(s, ".zmetadata");
            json_object *meta = json_object_object_get(zm, "metadata");
            assert_true(json_object_object_get_ex(meta, "obs/nb/.zgroup", NULL));
            assert_true(json_object_object_get_ex(meta, "obs/nb/.zattrs", NULL));
            assert_true(json_object_object_get_ex(meta, "obs/nb/mask/.zarray", NULL));
            json_object_put(zm);
        }
        zb_store_close(s);
    }
}

static void
test_nullable_bad_inputs(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NOBS, INDPTR, INDICES, DATA));
    int32_t v[3] = {1, 2, 3};
    uint8_t m[3] = {0, 1, 0};
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v, 3, m, 2),
        ZB_E_INVALID, "mask has 2 entries for 3 values");
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v, 2, m, 3),
        ZB_E_INVALID, "mask has 3 entries for 2 values");
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v,
                                                           3, NULL, 3),
                  ZB_E_INVALID, "null mask");
    uint8_t m2[3] = {0, 2, 0};
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v, 3, m2, 3),
        ZB_E_INVALID, "mask byte 2 at 1");
    double f[3] = {1, 2, 3};
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nf", ZB_DT_FLOAT64,
                                                           f, 3, m, 3),
                  ZB_E_TYPE, "integers or bools");
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nf", ZB_DT_STRING, f, 3, m, 3),
        ZB_E_TYPE, "append_nullable_string_column");
    uint8_t b[3] = {1, 2, 0};
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nb", ZB_DT_BOOL, b,
                                                           3, NULL, 0),
                  ZB_E_INVALID, "bool value 2 at 1");
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "_index", ZB_DT_INT32,
                                                           v, 3, m, 3),
                  ZB_E_INVALID, "_index");
    int32_t v8[8] = {0};
    uint8_t m8[8] = {0};
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_VAR, "nv", ZB_DT_INT32, v8,
                                                           8, m8, 8),
                  ZB_E_INVALID, "exceed n_vars 7");
    /* a present string that is not UTF-8 is refused; the same bytes under the mask are not */
    const char bad[] = "a\xff";
    uint64_t bo[3] = {0, 1, 2};
    uint8_t present[2] = {0, 0}, masked[2] = {0, 1};
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", bad, bo,
                                                                  2, present, 2),
                  ZB_E_INVALID, "string 1 is not valid UTF-8");
    uint64_t down[3] = {0, 2, 1};
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", bad,
                                                                  down, 2, masked, 2),
                  ZB_E_INVALID, "offsets decrease");
    ZB_ASSERT_ERR(zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, "plain", bad, bo, 2),
                  ZB_E_INVALID, "string 1 is not valid UTF-8");
    /* every refusal left the writer usable and created no column */
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", bad, bo,
                                                                 2, masked, 2));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v, 3, m, 3));
    /* a bool under the mask may hold anything: it is stored as false */
    ZB_ASSERT_OK(
        zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nb", ZB_DT_BOOL, b, 3, m, 3));
    ZB_ASSERT_ERR(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT64, v,
                                                           1, NULL, 0),
                  ZB_E_TYPE, "exists as a nullable int32 column");
    ZB_ASSERT_ERR(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v, 1),
                  ZB_E_TYPE, "nullable int32");
    ZB_ASSERT_ERR(zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, "ns", bad, bo, 1),
                  ZB_E_TYPE, "nullable string");
    /* short columns refuse the commit, naming the column */
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "obs/ns: 2 values, n_obs");
    const char s3[] = "xyz";
    uint64_t o3[4] = {0, 1, 2, 3};
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, "ns", s3, o3, 3,
                                                                 NULL, 0));
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "obs/ni: 3 values, n_obs");
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, v,
                                                          2, NULL, 0));
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "nb", ZB_DT_BOOL,
                                                          b + 1, 2, m + 1, 2));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    static const char *const ns[NOBS] = {"a", "", "x", "y", "z"};
    assert_strings(s, "obs/ns/values", ns, NOBS);
    static const uint8_t nsm[NOBS] = {0, 1, 0, 0, 0};
    assert_array(s, "obs/ns/mask", ZB_DT_BOOL, NOBS, nsm, sizeof nsm);
    static const int32_t ni[NOBS] = {1, 0, 3, 1, 2};
    assert_array(s, "obs/ni/values", ZB_DT_INT32, NOBS, ni, sizeof ni);
    static const uint8_t nb[NOBS] = {1, 0, 0, 0, 0}, nbm[NOBS] = {0, 1, 0, 1, 0};
    assert_array(s, "obs/nb/values", ZB_DT_BOOL, NOBS, nb, sizeof nb);
    assert_array(s, "obs/nb/mask", ZB_DT_BOOL, NOBS, nbm, sizeof nbm);
    assert_false(has_key(s, "obs/nf/zarr.json"));
    assert_false(has_key(s, "var/nv/zarr.json"));
    zb_store_close(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Categoricals with numeric categories                                                        */
/* ------------------------------------------------------------------------------------------ */

static void
test_numeric_categories(void **state)
{
    (void)state;
    static const int64_t LEIDEN[4] = {3, 0, 12, -1}; /* leiden cluster ids */
    static const double FLOATS[3] = {0.5, -1e300, 1.0 / 0.0};
    static const uint8_t BOOLS[2] = {1, 0};
    static const uint16_t U16[3] = {65535, 0, 7};
    static const int8_t CODES[NOBS] = {3, -1, 0, 2, 1};
    static const int8_t FCODES[NOBS] = {2, 1, 0, -1, 0};
    static const int8_t BCODES[NOBS] = {0, 1, 1, -1, 0};
    for (int fmt = 2; fmt <= 3; fmt++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
        o.zarr_format = fmt;
        zb_anndata_writer *w = NULL;
        ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NOBS, INDPTR, INDICES, DATA));
        ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "leiden",
                                                                 ZB_DT_INT64, LEIDEN, 4, false));
        ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "f",
                                                                 ZB_DT_FLOAT64, FLOATS, 3, true));
        ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "b", ZB_DT_BOOL,
                                                                 BOOLS, 2, false));
        ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_VAR, "u",
                                                                 ZB_DT_UINT16, U16, 3, false));
        ZB_ASSERT_OK(
            zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "leiden", ZB_DT_INT8, CODES, NOBS));
        ZB_ASSERT_OK(
            zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "f", ZB_DT_INT8, FCODES, NOBS));
        ZB_ASSERT_OK(
            zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "b", ZB_DT_INT8, BCODES, NOBS));
        ZB_ASSERT_ERR(zb_anndata_writer_append_codes(w, ZB_ANNDATA_VAR, "u", ZB_DT_INT8, CODES, 1),
                      ZB_E_INVALID, "code 3 at 0 is outside [-1, 3)");
        ZB_ASSERT_OK(
            zb_anndata_writer_append_codes(w, ZB_ANNDATA_VAR, "u", ZB_DT_INT8, FCODES, NOBS));
        ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_VAR, "u", ZB_DT_INT8, BCODES, 2));
        ZB_ASSERT_OK(zb_anndata_writer_commit(w));
        zb_anndata_writer_close(w);

        assert_encoding(s, fmt, "obs/leiden", "categorical", "0.2.0");
        assert_encoding(s, fmt, "obs/leiden/categories", "array", "0.2.0");
        assert_array(s, "obs/leiden/categories", ZB_DT_INT64, 4, LEIDEN, sizeof LEIDEN);
        assert_array(s, "obs/leiden/codes", ZB_DT_INT8, NOBS, CODES, sizeof CODES);
        assert_array(s, "obs/f/categories", ZB_DT_FLOAT64, 3, FLOATS, sizeof FLOATS);
        assert_array(s, "obs/f/codes", ZB_DT_INT8, NOBS, FCODES, sizeof FCODES);
        assert_array(s, "obs/b/categories", ZB_DT_BOOL, 2, BOOLS, sizeof BOOLS);
        assert_array(s, "var/u/categories", ZB_DT_UINT16, 3, U16, sizeof U16);
        json_object *doc = NULL;
        json_object *a = node_attrs(s, fmt, "obs/f", &doc);
        assert_true(json_object_get_boolean(json_object_object_get(a, "ordered")));
        json_object_put(doc);
        zb_store_close(s);
    }
}

static void
test_numeric_categories_bad(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, NULL, &w));
    int64_t dup[4] = {5, -2, 9, -2};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT64,
                                                              dup, 4, false),
                  ZB_E_INVALID, "category -2 appears more than once");
    uint64_t udup[3] = {UINT64_MAX, 1, UINT64_MAX};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_UINT64,
                                                              udup, 3, false),
                  ZB_E_INVALID, "category 18446744073709551615 appears");
    /* pandas: pd.Index([0.0, -0.0]) is not unique */
    double zeros[3] = {1.5, 0.0, -0.0};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_FLOAT64,
                                                              zeros, 3, false),
                  ZB_E_INVALID, "0 appears more than once");
    float nan32[3] = {1.0f, 2.0f, 0.0f};
    nan32[2] = nan32[2] / nan32[2];
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_FLOAT32,
                                                              nan32, 3, false),
                  ZB_E_INVALID, "category 2 is NaN");
    uint8_t b2[2] = {0, 2};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_BOOL,
                                                              b2, 2, false),
                  ZB_E_INVALID, "bool value 2 at 1");
    uint8_t b11[2] = {1, 1};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_BOOL,
                                                              b11, 2, false),
                  ZB_E_INVALID, "category 1 appears");
    uint16_t half[2] = {0x3c00, 0x4000};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_FLOAT16,
                                                              half, 2, false),
                  ZB_E_TYPE, "float16");
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_STRING,
                                                              half, 2, false),
                  ZB_E_TYPE, "define_categorical takes strings");
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT64,
                                                              NULL, 2, false),
                  ZB_E_INVALID, "null categories");
    /* string categories whose offsets do not start at 0 are compared where they lie */
    const char text[] = "xxab";
    uint64_t offs[3] = {2, 3, 4};
    ZB_ASSERT_OK(
        zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "s", text, offs, 2, false));
    const char bad[] = "a\xc0";
    uint64_t boff[3] = {0, 1, 2};
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "t", bad, boff, 2, false),
                  ZB_E_INVALID, "not valid UTF-8");
    /* nothing was created by the refusals; the name is still free */
    int32_t ok[3] = {10, -3, 4};
    ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT32,
                                                             ok, 3, false));
    ZB_ASSERT_ERR(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT32,
                                                              ok, 3, false),
                  ZB_E_INVALID, "exists");
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    assert_array(s, "obs/c/categories", ZB_DT_INT32, 3, ok, sizeof ok);
    static const char *const st[2] = {"a", "b"};
    assert_strings(s, "obs/s/categories", st, 2);
    zb_store_close(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Layers                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* The counts layer: int32 values, other elements than X. */
enum { LNNZ = 6 };
static const int64_t LINDPTR[NOBS + 1] = {0, 1, 3, 3, 3, 6};
static const int32_t LINDICES[LNNZ] = {6, 0, 5, 1, 2, 3};
static const int32_t LDATA[LNNZ] = {10, 20, 30, 40, 50, -60};

static void
check_layer(zb_store *s, int fmt, zb_dtype index_dtype)
{
    assert_encoding(s, fmt, "layers", "dict", "0.1.0");
    assert_encoding(s, fmt, "layers/counts", "csr_matrix", "0.1.0");
    json_object *doc = NULL;
    json_object *a = node_attrs(s, fmt, "layers/counts", &doc);
    json_object *shape = json_object_object_get(a, "shape");
    assert_int_equal(json_object_get_int64(json_object_array_get_idx(shape, 0)), NOBS);
    assert_int_equal(json_object_get_int64(json_object_array_get_idx(shape, 1)), NVARS);
    json_object_put(doc);
    assert_array(s, "layers/counts/data", ZB_DT_INT32, LNNZ, LDATA, sizeof LDATA);
    assert_array(s, "layers/counts/indptr", ZB_DT_INT64, NOBS + 1, LINDPTR, sizeof LINDPTR);
    if (index_dtype == ZB_DT_INT32) {
        assert_array(s, "layers/counts/indices", ZB_DT_INT32, LNNZ, LINDICES, sizeof LINDICES);
    } else {
        uint8_t want[LNNZ];
        for (int i = 0; i < LNNZ; i++) want[i] = (uint8_t)LINDICES[i];
        assert_array(s, "layers/counts/indices", ZB_DT_UINT8, LNNZ, want, sizeof want);
    }
}

static void
test_layers(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
        o.zarr_format = fmt;
        o.x_chunk = 2;
        o.x_shard = fmt == 3 ? 4 : 0;
        o.num_threads = 2;
        zb_anndata_writer *w = NULL;
        ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
        /* a layer streamed in other blocks than X, interleaved with it */
        ZB_ASSERT_OK(
            zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, 0, LINDPTR, NULL, NULL));
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, INDPTR, INDICES, DATA));
        ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, 3, LINDPTR,
                                                        LINDICES, LDATA));
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 3, INDPTR + 2, INDICES + 2, DATA + 2));
        ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID,
                      "layers/counts: 3 rows, n_obs (rows of X) is 5");
        ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, 2, LINDPTR + 3,
                                                        LINDICES + 3, LDATA + 3));
        ZB_ASSERT_OK(zb_anndata_writer_commit(w));
        zb_anndata_writer_close(w);
        check_layer(s, fmt, ZB_DT_INT32);
        assert_array(s, "X/data", ZB_DT_FLOAT32, NNZ, DATA, sizeof DATA);
        zb_array *a = NULL;
        zb_array_info info;
        ZB_ASSERT_OK(zb_array_open(s, "layers/counts/data", &a));
        ZB_ASSERT_OK(zb_array_get_info(a, &info));
        assert_int_equal(info.chunk_shape[0], 2); /* X's chunking */
        if (fmt == 3) assert_int_equal(info.shard_shape[0], 4);
        zb_array_close(a);
        if (fmt == 3) {
            json_object *root = read_json(s, "zarr.json");
            json_object *meta = json_object_object_get(
                json_object_object_get(root, "consolidated_metadata"), "metadata");
            static const char *const keys[] = {"layers", "layers/counts", "layers/counts/data",
                                               "layers/counts/indices", "layers/counts/indptr"};
            for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
                if (!json_object_object_get_ex(meta, keys[i], NULL)) fail_msg("no %s", keys[i]);
            json_object_put(root);
        } else {
            json_object *zm = read_json(s, ".zmetadata");
            json_object *meta = json_object_object_get(zm, "metadata");
            assert_true(json_object_object_get_ex(meta, "layers/counts/.zattrs", NULL));
            assert_true(json_object_object_get_ex(meta, "layers/counts/indices/.zarray", NULL));
            json_object_put(zm);
        }
        zb_store_close(s);
    }
}

static void
test_layers_dense_x_and_bad_inputs(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.narrow_indices = true;
    o.x_chunk = 2; /* rows of the dense X: the layer keeps the default element chunk */
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_DENSE, ZB_DT_FLOAT32, &o, &w));
    float x[NOBS * NVARS] = {0};
    ZB_ASSERT_OK(zb_anndata_writer_append_dense(w, NOBS, x));
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "a/b", ZB_DT_INT32, 1, LINDPTR, LINDICES, LDATA),
        ZB_E_INVALID, "'/'");
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "", ZB_DT_INT32, 1, LINDPTR, LINDICES, LDATA),
        ZB_E_INVALID, "empty");
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "__x", ZB_DT_INT32, 1, LINDPTR, LINDICES, LDATA),
        ZB_E_INVALID, "reserved");
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_STRING, 1, LINDPTR, LINDICES, LDATA),
        ZB_E_INVALID, "fixed-size");
    int32_t wide[2] = {0, 7};
    int64_t ip[2] = {4, 6};
    ZB_ASSERT_ERR(zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, 1, ip, wide, LDATA),
                  ZB_E_INVALID, "layers/counts: column id 7 of element 1 (row 0");
    int64_t down[3] = {0, 2, 1};
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, 2, down, LINDICES, LDATA),
        ZB_E_INVALID, "layers/counts: indptr decreases at row 1");
    /* the refused first blocks created no layer: the commit does not ask for its rows */
    ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, NOBS, LINDPTR,
                                                    LINDICES, LDATA));
    ZB_ASSERT_ERR(
        zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_FLOAT32, 0, LINDPTR, NULL, NULL),
        ZB_E_TYPE, "exists with dtype int32, not float32");
    ZB_ASSERT_OK(
        zb_anndata_writer_append_layer_csr(w, "empty", ZB_DT_FLOAT64, 0, LINDPTR, NULL, NULL));
    ZB_ASSERT_ERR(zb_anndata_writer_commit(w), ZB_E_INVALID, "layers/empty: 0 rows");
    int64_t zeros[NOBS + 1] = {0};
    ZB_ASSERT_OK(
        zb_anndata_writer_append_layer_csr(w, "empty", ZB_DT_FLOAT64, NOBS, zeros, NULL, NULL));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    check_layer(s, 3, ZB_DT_UINT8); /* 7 columns, narrow: uint8 */
    assert_array(s, "layers/empty/indptr", ZB_DT_INT64, NOBS + 1, zeros, sizeof zeros);
    zb_array_close(open_array(s, "layers/empty/data", ZB_DT_FLOAT64, 0));
    zb_array *a = NULL;
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_open(s, "layers/counts/indices", &a));
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_int_equal(info.chunk_shape[0], ZB_ANNDATA_DEFAULT_X_CHUNK);
    assert_null(info.shard_shape);
    zb_array_close(a);
    zb_store_close(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Narrow indices                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* anndata 0.12.19's rule: uint8 up to 255 columns, uint16 up to 65,535, else uint32; int32
 * without the option. Each matrix has one row holding the first and the last column. */
static void
test_narrow_indices(void **state)
{
    (void)state;
    static const struct {
        uint64_t n_vars;
        bool narrow;
        zb_dtype want;
    } cases[] = {{1, true, ZB_DT_UINT8},      {255, true, ZB_DT_UINT8},
                 {256, true, ZB_DT_UINT16},   {65535, true, ZB_DT_UINT16},
                 {65536, true, ZB_DT_UINT32}, {(uint64_t)INT32_MAX, true, ZB_DT_UINT32},
                 {65536, false, ZB_DT_INT32}, {7, false, ZB_DT_INT32}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
        o.narrow_indices = cases[k].narrow;
        o.consolidate = false;
        zb_anndata_writer *w = NULL;
        ZB_ASSERT_OK(zb_anndata_writer_open(s, "", cases[k].n_vars, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32,
                                            &o, &w));
        int64_t ip[3] = {0, 0, 2};
        int32_t idx[2] = {(int32_t)(cases[k].n_vars - 1), 0};
        float v[2] = {1, 2};
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, ip, idx, v));
        ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "l", ZB_DT_FLOAT32, 2, ip, idx, v));
        /* the var side is left to its default names, which n_vars this large would make slow */
        if (cases[k].n_vars > 65536) {
            zb_anndata_writer_close(w);
            zb_store_close(s);
            continue;
        }
        ZB_ASSERT_OK(zb_anndata_writer_commit(w));
        zb_anndata_writer_close(w);
        uint64_t last = cases[k].n_vars - 1;
        const char *paths[2] = {"X/indices", "layers/l/indices"};
        for (int p = 0; p < 2; p++) {
            zb_array *a = open_array(s, paths[p], cases[k].want, 2);
            uint64_t got[2] = {0, 0};
            uint8_t raw[8];
            ZB_ASSERT_OK(zb_array_read_rows(a, 0, 2, raw, 2 * zb_dtype_size(cases[k].want), NULL));
            for (int i = 0; i < 2; i++) {
                switch (cases[k].want) {
                case ZB_DT_UINT8:
                    got[i] = raw[i];
                    break;
                case ZB_DT_UINT16:
                    got[i] = ((uint16_t *)(void *)raw)[i];
                    break;
                case ZB_DT_UINT32:
                    got[i] = ((uint32_t *)(void *)raw)[i];
                    break;
                default:
                    got[i] = (uint64_t)((int32_t *)(void *)raw)[i];
                    break;
                }
            }
            assert_int_equal(got[0], last);
            assert_int_equal(got[1], 0);
            zb_array_close(a);
        }
        zb_store_close(s);
    }
}

/* The last codec of the chain an array was written with, as zb_array_info reports it. */
static void
assert_codecs(zb_store *s, const char *path, const char *want)
{
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    const char *last = strrchr(info.codecs, '|');
    if (!last || strcmp(last + 2, want))
        fail_msg("%s: codecs \"%s\", want \"%s\"", path, info.codecs, want);
    zb_array_close(a);
}

/* Without a codec option a CSR matrix's data / indices of 1- and 2-byte integers are written
 * without byte shuffle, every other array with it; a codec option is used for every array. */
static void
test_csr_codec_defaults(void **state)
{
    (void)state;
    static const struct {
        zb_dtype dtype;
        const char *want;
    } table[] = {{ZB_DT_UINT8, "blosc:lz4:5:noshuffle"},  {ZB_DT_INT8, "blosc:lz4:5:noshuffle"},
                 {ZB_DT_UINT16, "blosc:lz4:5:noshuffle"}, {ZB_DT_INT16, "blosc:lz4:5:noshuffle"},
                 {ZB_DT_UINT32, "blosc:lz4:5:shuffle"},   {ZB_DT_INT32, "blosc:lz4:5:shuffle"},
                 {ZB_DT_FLOAT32, "blosc:lz4:5:shuffle"},  {ZB_DT_FLOAT16, "blosc:lz4:5:shuffle"},
                 {ZB_DT_BOOL, "blosc:lz4:5:shuffle"},     {ZB_DT_INT64, "blosc:lz4:5:shuffle"}};
    for (size_t k = 0; k < sizeof table / sizeof *table; k++) {
        assert_string_equal(zb_anndata_csr_codec(NULL, table[k].dtype), table[k].want);
        assert_string_equal(zb_anndata_csr_codec("zstd:3", table[k].dtype), "zstd:3");
    }
    static const char *const sh = "blosc(lz4,5,shuffle)";
    static const char *const nosh = "blosc(lz4,5,noshuffle)";
    for (int explicit = 0; explicit < 2; explicit ++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
        o.narrow_indices = true; /* 300 columns: uint16 */
        o.codec = explicit ? "blosc:lz4:5:shuffle" : NULL;
        zb_anndata_writer *w = NULL;
        ZB_ASSERT_OK(zb_anndata_writer_open(s, "", 300, ZB_ANNDATA_X_CSR, ZB_DT_UINT8, &o, &w));
        int64_t ip[3] = {0, 1, 3};
        int32_t idx[3] = {299, 0, 7};
        uint8_t v[3] = {1, 2, 250};
        float f[3] = {0.5f, 1, 2};
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, 2, ip, idx, v));
        ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "f", ZB_DT_FLOAT32, 2, ip, idx, f));
        int8_t codes[2] = {0, 1};
        ZB_ASSERT_OK(
            zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "small", ZB_DT_INT8, codes, 2));
        ZB_ASSERT_OK(zb_anndata_writer_commit(w));
        zb_anndata_writer_close(w);
        assert_codecs(s, "X/data", explicit ? sh : nosh);
        assert_codecs(s, "X/indices", explicit ? sh : nosh);
        assert_codecs(s, "layers/f/indices", explicit ? sh : nosh);
        assert_codecs(s, "layers/f/data", sh);
        assert_codecs(s, "X/indptr", sh);
        assert_codecs(s, "obs/small", sh); /* obs columns keep the writer's default */
        assert_array(s, "X/data", ZB_DT_UINT8, 3, v, sizeof v);
        uint16_t ids[3] = {299, 0, 7};
        assert_array(s, "X/indices", ZB_DT_UINT16, 3, ids, sizeof ids);
        zb_store_close(s);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Determinism                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Every object of a store: keys sorted, with their bytes. */
typedef struct obj {
    char *key;
    uint8_t *bytes;
    uint64_t len;
} obj;

typedef struct objs {
    zb_store *s;
    obj *v;
    size_t n, cap;
    char prefix[512];
} objs;

static int
collect_child(void *ctx, const char *name, bool is_dir)
{
    objs *o = ctx;
    size_t lp = strlen(o->prefix), ln = strlen(name);
    assert_true(lp + ln + 2 <= sizeof o->prefix);
    char key[sizeof o->prefix];
    memcpy(key, o->prefix, lp);
    if (lp) key[lp++] = '/';
    memcpy(key + lp, name, ln + 1);
    if (is_dir) {
        char saved[sizeof o->prefix];
        memcpy(saved, o->prefix, sizeof saved);
        memcpy(o->prefix, key, sizeof key);
        ZB_ASSERT_OK(zb_store_list(o->s, key, collect_child, o));
        memcpy(o->prefix, saved, sizeof saved);
        return 0;
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 64;
        o->v = realloc(o->v, o->cap * sizeof *o->v);
    }
    obj *e = &o->v[o->n++];
    e->key = strdup(key);
    ZB_ASSERT_OK(zb_store_read_all(o->s, key, &e->bytes, &e->len));
    return 0;
}

static int
cmp_obj(const void *a, const void *b)
{
    return strcmp(((const obj *)a)->key, ((const obj *)b)->key);
}

static objs
collect(zb_store *s)
{
    objs o = {s, NULL, 0, 0, ""};
    ZB_ASSERT_OK(zb_store_list(s, "", collect_child, &o));
    qsort(o.v, o.n, sizeof *o.v, cmp_obj);
    return o;
}

static void
objs_free(objs *o)
{
    for (size_t i = 0; i < o->n; i++) {
        free(o->v[i].key);
        free(o->v[i].bytes);
    }
    free(o->v);
}

static void
assert_same_objects(const objs *a, const objs *b, const char *what)
{
    if (a->n != b->n) fail_msg("%s: %zu objects, then %zu", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->v[i].key, b->v[i].key))
            fail_msg("%s: key %s, then %s", what, a->v[i].key, b->v[i].key);
        if (a->v[i].len != b->v[i].len || memcmp(a->v[i].bytes, b->v[i].bytes, a->v[i].len))
            fail_msg("%s: %s differs", what, a->v[i].key);
    }
}

enum { DROWS = 600, DVARS = 300 };

/* A store of DROWS x DVARS with every element kind, its rows appended in blocks of `block`
 * rows (X, the layer and the columns each in their own call sequence). */
static void
write_everything(zb_store *s, const zb_anndata_write_opts *o, uint64_t block)
{
    static int64_t ip[DROWS + 1];
    static int32_t idx[DROWS * 8];
    static float val[DROWS * 8];
    static int64_t num[DROWS];
    static uint8_t mask[DROWS];
    static int8_t codes[DROWS];
    uint64_t seed = 12345;
    ip[0] = 0;
    for (uint64_t r = 0; r < DROWS; r++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = (seed >> 33) % 8;
        for (uint64_t e = 0; e < k; e++) {
            idx[ip[r] + (int64_t)e] = (int32_t)((r * 37 + e * 53) % DVARS);
            val[ip[r] + (int64_t)e] = (float)((seed >> (e + 3)) % 1000) * 0.25f;
        }
        ip[r + 1] = ip[r] + (int64_t)k;
        num[r] = (int64_t)(seed >> 20) - (int64_t)(1ull << 43);
        mask[r] = (seed >> 7) % 5 == 0;
        codes[r] = (int8_t)((int64_t)((seed >> 11) % 4) - 1);
    }
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", DVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, o, &w));
    static const int64_t leiden[3] = {4, 0, 17};
    ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "leiden",
                                                             ZB_DT_INT64, leiden, 3, false));
    for (uint64_t r0 = 0; r0 < DROWS; r0 += block) {
        uint64_t n = DROWS - r0 < block ? DROWS - r0 : block;
        ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, n, ip + r0, idx + ip[r0], val + ip[r0]));
        ZB_ASSERT_OK(zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_FLOAT32, n, ip + r0,
                                                        idx + ip[r0], val + ip[r0]));
        ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "n", ZB_DT_INT64,
                                                              num + r0, n, mask + r0, n));
        ZB_ASSERT_OK(
            zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "leiden", ZB_DT_INT8, codes + r0, n));
        ZB_ASSERT_OK(
            zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "v", ZB_DT_FLOAT32, val + r0, n));
    }
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
}

/* The same rows give the same bytes in every object, whatever the thread count and the block
 * split: v2, v3, and v3 sharded (many inner chunks per shard, so threads finish out of order). */
static void
test_deterministic_bytes(void **state)
{
    (void)state;
    static const struct {
        int fmt;
        uint64_t shard;
    } configs[] = {{2, 0}, {3, 0}, {3, 64}};
    static const struct {
        int threads;
        uint64_t block;
    } runs[] = {{1, DROWS}, {4, DROWS}, {4, 7}, {1, 1}, {3, 128}};
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        objs ref = {0};
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
            o.zarr_format = configs[c].fmt;
            o.x_chunk = 4;
            o.x_shard = configs[c].shard;
            o.column_chunk = 50;
            o.num_threads = runs[r].threads;
            o.narrow_indices = true;
            zb_store *s = NULL;
            ZB_ASSERT_OK(zb_store_open_memory(&s));
            write_everything(s, &o, runs[r].block);
            objs got = collect(s);
            assert_true(got.n > 50);
            if (r == 0) {
                ref = got;
            } else {
                char what[96];
                snprintf(what, sizeof what, "v%d shard %llu, %d threads, blocks of %llu",
                         configs[c].fmt, (unsigned long long)configs[c].shard, runs[r].threads,
                         (unsigned long long)runs[r].block);
                assert_same_objects(&ref, &got, what);
                objs_free(&got);
            }
            zb_store_close(s);
        }
        objs_free(&ref);
    }
}

/* A memory store whose put number `fail_at` (0-based) and every later put fail with ZB_E_IO. */
typedef struct flaky {
    zb_store *inner;
    int puts, fail_at;
} flaky;

static zb_status
flaky_get(void *self, const char *key, uint64_t off, uint64_t len, void *dst, uint64_t *nread)
{
    return zb_store_get(((flaky *)self)->inner, key, off, len, dst, nread);
}
static zb_status
flaky_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(((flaky *)self)->inner, key, size);
}
static zb_status
flaky_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((flaky *)self)->inner, prefix, fn, ctx);
}
static zb_status
flaky_put(void *self, const char *key, const void *data, uint64_t len)
{
    flaky *f = self;
    if (f->puts++ >= f->fail_at) return ZB_E_IO;
    return zb_store_put(f->inner, key, data, len);
}
static zb_status
flaky_erase(void *self, const char *key)
{
    flaky *f = self;
    if (f->puts++ >= f->fail_at) return ZB_E_IO;
    return zb_store_erase(f->inner, key);
}
static zb_status
flaky_rename(void *self, const char *from, const char *to)
{
    flaky *f = self;
    if (f->puts++ >= f->fail_at) return ZB_E_IO;
    return zb_store_rename(f->inner, from, to);
}
static void
flaky_close(void *self)
{
    (void)self;
}

static const zb_store_methods flaky_methods = {.scheme = "flaky",
                                               .get = flaky_get,
                                               .size = flaky_size,
                                               .list = flaky_list,
                                               .put = flaky_put,
                                               .erase = flaky_erase,
                                               .rename = flaky_rename,
                                               .close = flaky_close};

/* Every write failing in turn: each run either commits a complete store or fails with the
 * store's error and leaves no root document or still has its marker (nothing a reader takes
 * for a store); later calls
 * on a broken writer fail too. Run under ASan, this is also the leak check of every path. */
static void
test_each_store_write_failing(void **state)
{
    (void)state;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 4;
    for (int fmt = 2; fmt <= 3; fmt++) {
        o.zarr_format = fmt;
        bool committed = false;
        for (int n = 0; !committed; n++) {
            flaky f = {NULL, 0, n};
            ZB_ASSERT_OK(zb_store_open_memory(&f.inner));
            zb_store *s = NULL;
            ZB_ASSERT_OK(zb_store_new(&flaky_methods, &f, &s));
            zb_anndata_writer *w = NULL;
            zb_status st =
                zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w);
            if (st == ZB_OK) st = zb_anndata_writer_append_csr(w, 3, INDPTR, INDICES, DATA);
            char *d;
            uint64_t *off;
            pack(CATS, 3, &d, &off);
            if (st == ZB_OK)
                st = zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "c", d, off, 3, false);
            free(d);
            free(off);
            if (st == ZB_OK)
                st =
                    zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT32, CODES32, 3);
            /* a layer, a nullable column and numeric categories, each in two blocks */
            static const int64_t leiden[2] = {4, -9};
            static const int8_t lcodes[NOBS] = {1, 0, -1, 1, 0};
            for (int half = 0; half < 2 && st == ZB_OK; half++) {
                uint64_t r0 = half ? 3 : 0, rows = half ? 2 : 3;
                st =
                    zb_anndata_writer_append_layer_csr(w, "counts", ZB_DT_INT32, rows, LINDPTR + r0,
                                                       LINDICES + LINDPTR[r0], LDATA + LINDPTR[r0]);
                if (st == ZB_OK)
                    st = zb_anndata_writer_append_nullable_column(
                        w, ZB_ANNDATA_OBS, "ni", ZB_DT_INT32, NI_IN + r0, rows, NI_MASK + r0, rows);
                if (st == ZB_OK && !half)
                    st = zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "leiden",
                                                                     ZB_DT_INT64, leiden, 2, false);
                if (st == ZB_OK)
                    st = zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "leiden", ZB_DT_INT8,
                                                        lcodes + r0, rows);
            }
            if (st == ZB_OK)
                st = zb_anndata_writer_append_csr(w, 2, INDPTR + 3, INDICES + 3, DATA + 3);
            if (st == ZB_OK)
                st = zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "c", ZB_DT_INT32,
                                                    CODES32 + 3, 2);
            if (st == ZB_OK) st = zb_anndata_writer_commit(w);
            if (st == ZB_OK) {
                committed = true;
                check_small_x(f.inner);
                check_layer(f.inner, fmt, ZB_DT_INT32);
                assert_array(f.inner, "obs/ni/values", ZB_DT_INT32, NOBS, NI_WANT, sizeof NI_WANT);
                assert_array(f.inner, "obs/leiden/categories", ZB_DT_INT64, 2, leiden,
                             sizeof leiden);
            } else {
                assert_int_equal(st, ZB_E_IO);
                /* no root document, or (the marker's erase failed) the marker still there */
                assert_true(!has_key(f.inner, fmt == 3 ? "zarr.json" : ".zgroup") ||
                            has_key(f.inner, ZB_INCOMPLETE_MARKER));
                if (w) {
                    /* broken for good */
                    assert_int_equal(zb_anndata_writer_commit(w), ZB_E_IO);
                    assert_int_equal(zb_anndata_writer_append_csr(w, 1, INDPTR, INDICES, DATA),
                                     ZB_E_IO);
                }
            }
            zb_anndata_writer_close(w);
            zb_store_close(s);
            zb_store_close(f.inner);
            assert_true(n < 1000);
        }
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csr_v3_memory),
        cmocka_unit_test(test_csr_v3_sharded_subpath),
        cmocka_unit_test(test_csr_v2_file),
        cmocka_unit_test(test_dense_default_names),
        cmocka_unit_test(test_codes_dtype_rule),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_uncommitted_leaves_marker),
        cmocka_unit_test(test_reader_refuses_marker),
        cmocka_unit_test(test_each_store_write_failing),
        cmocka_unit_test(test_nullable_columns),
        cmocka_unit_test(test_nullable_bad_inputs),
        cmocka_unit_test(test_numeric_categories),
        cmocka_unit_test(test_numeric_categories_bad),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_layers_dense_x_and_bad_inputs),
        cmocka_unit_test(test_narrow_indices),
        cmocka_unit_test(test_csr_codec_defaults),
        cmocka_unit_test(test_deterministic_bytes),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
