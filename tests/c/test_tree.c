/* The group tree (consolidated v2 .zmetadata and v3 inline metadata, or listing), layout
 * detection and zb_info_json, over the memory store (checklist rows 1, 11, 29). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "util/json.h"
#include "util/status.h"
#include "util/utf8.h"
#include "zarr/tree.h"
#include "zbatch.h"

static void
put(zb_store *s, const char *key, const char *text)
{
    if (zb_store_put(s, key, text, strlen(text)) != ZB_OK)
        fail_msg("put %s: %s", key, zb_last_error());
}

static void
put_bytes(zb_store *s, const char *key, size_t n)
{
    uint8_t *b = calloc(1, n ? n : 1);
    assert_non_null(b);
    assert_int_equal(zb_store_put(s, key, b, n), ZB_OK);
    free(b);
}

static zb_store *
memstore(void)
{
    zb_store *s = NULL;
    assert_int_equal(zb_store_open_memory(&s), ZB_OK);
    return s;
}

static zb__tree *
load(zb_store *s, const char *root, bool consolidated)
{
    zb__tree *t = NULL;
    zb_status st = zb__tree_load(s, root, consolidated, &t);
    if (st != ZB_OK) fail_msg("tree load: %s: %s", zb_status_name(st), zb_last_error());
    return t;
}

static void
expect_paths(const zb__tree *t, const char *const *paths, size_t n)
{
    if (t->n != n) {
        for (size_t i = 0; i < t->n; i++) print_message("node %zu: '%s'\n", i, t->nodes[i].path);
        fail_msg("%zu nodes, expected %zu", t->n, n);
    }
    for (size_t i = 0; i < n; i++) assert_string_equal(t->nodes[i].path, paths[i]);
}

static const char *
attr_str(const zb__tree_node *n, const char *key)
{
    json_object *v = zb__json_get(n->attrs, key);
    return v ? json_object_get_string(v) : NULL;
}

#define F4(shape, chunks)                                                                          \
    "{\"zarr_format\": 2, \"shape\": " shape ", \"chunks\": " chunks ", \"dtype\": \"<f4\", "      \
    "\"compressor\": null, \"fill_value\": -1.0, \"filters\": null, \"order\": \"C\"}"
#define I4(shape)                                                                                  \
    "{\"zarr_format\": 2, \"shape\": " shape ", \"chunks\": " shape ", \"dtype\": \"<i4\", "       \
    "\"compressor\": {\"id\": \"blosc\", \"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": 1, "      \
    "\"blocksize\": 0}, \"fill_value\": 0, \"filters\": null, \"order\": \"C\"}"
#define STR(shape)                                                                                 \
    "{\"zarr_format\": 2, \"shape\": " shape ", \"chunks\": " shape ", \"dtype\": \"|O\", "        \
    "\"compressor\": null, \"fill_value\": 0, \"filters\": [{\"id\": \"vlen-utf8\"}], "            \
    "\"order\": \"C\"}"

/* ---- v2 ------------------------------------------------------------------------------- */

static const char *const anndata_zmetadata =
    "{\n \"metadata\": {\n"
    "  \".zattrs\": {\"encoding-type\": \"anndata\", \"encoding-version\": \"0.1.0\", \"m\": NaN,"
    " \"p\": Infinity, \"n\": -Infinity},\n"
    "  \".zgroup\": {\"zarr_format\": 2},\n"
    "  \"X/.zattrs\": {\"encoding-type\": \"csr_matrix\", \"encoding-version\": \"0.1.0\", "
    "\"shape\": [4, 3]},\n"
    "  \"X/.zgroup\": {\"zarr_format\": 2},\n"
    "  \"X/data/.zarray\": " F4(
        "[6]",
        "[6]") ",\n"
               "  \"X/indices/.zarray\": " I4(
                   "[6]") ",\n"
                          "  \"X/indptr/.zarray\": " I4(
                              "[5]") ",\n"
                                     "  \"obs/.zattrs\": {\"_index\": \"_index\", "
                                     "\"column-order\": [\"ct\"], \"encoding-type\": "
                                     "\"dataframe\", \"encoding-version\": \"0.2.0\"},\n"
                                     "  \"obs/.zgroup\": {\"zarr_format\": 2},\n"
                                     "  \"obs/_index/.zarray\": " STR(
                                         "[4]") ",\n"
                                                "  \"obs/_index/.zattrs\": {\"encoding-type\": "
                                                "\"string-array\", \"encoding-version\": "
                                                "\"0.2.0\"},\n"
                                                "  \"obs/ct/.zgroup\": {\"zarr_format\": 2, "
                                                "\"consolidated_metadata\": {\"metadata\": {}, "
                                                "\"must_understand\": false, \"kind\": "
                                                "\"inline\"}},\n"
                                                "  \"obs/ct/codes/.zarray\": {\"zarr_format\": 2, "
                                                "\"shape\": [4], \"chunks\": [4], \"dtype\":"
                                                " \"|i1\", \"compressor\": null, \"fill_value\": "
                                                "null, \"filters\": null, \"order\": \"C\"},\n"
                                                "  \"obs/ct/categories/.zarray\": " STR(
                                                    "[3]") ",\n"
                                                           "  \"var/.zgroup\": {\"zarr_format\": "
                                                           "2},\n"
                                                           "  \"var/.zattrs\": {\"_index\": "
                                                           "\"_index\", \"column-order\": [], "
                                                           "\"encoding-type\": "
                                                           "\"dataframe\", \"encoding-version\": "
                                                           "\"0.2.0\"}\n"
                                                           " },\n \"zarr_consolidated_format\": "
                                                           "1\n}";

static void
test_v2_consolidated_anndata(void **state)
{
    (void)state;
    zb_store *s = memstore();
    put(s, ".zgroup", "{\"zarr_format\": 2}");
    put(s, ".zattrs", "{\"encoding-type\": \"anndata\", \"encoding-version\": \"0.1.0\"}");
    put(s, ".zmetadata", anndata_zmetadata);
    /* only chunks besides the root documents: every node comes from .zmetadata */
    put_bytes(s, "X/data/0", 24);

    zb__tree *t = load(s, "", true);
    static const char *const paths[] = {
        "",    "X",          "X/data", "X/indices",         "X/indptr",
        "obs", "obs/_index", "obs/ct", "obs/ct/categories", "obs/ct/codes",
        "var"};
    expect_paths(t, paths, sizeof paths / sizeof paths[0]);
    /* each node got its own documents: kind and encoding-type per path */
    static const struct {
        bool is_array;
        const char *et;
    } want[] = {{false, "anndata"}, {false, "csr_matrix"}, {true, NULL},           {true, NULL},
                {true, NULL},       {false, "dataframe"},  {true, "string-array"}, {false, NULL},
                {true, NULL},       {true, NULL},          {false, "dataframe"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (t->nodes[i].is_array != want[i].is_array) fail_msg("%s: kind", paths[i]);
        const char *et = attr_str(&t->nodes[i], "encoding-type");
        if (want[i].et ? !et || strcmp(et, want[i].et) : et != NULL)
            fail_msg("%s: encoding-type %s", paths[i], et ? et : "(none)");
    }
    assert_string_equal(zb__json_text(zb__json_get(zb__tree_find(t, "X/indptr")->doc, "shape")),
                        "[5]");
    assert_string_equal(zb__json_text(zb__json_get(zb__tree_find(t, "obs/ct/codes")->doc, "dtype")),
                        "\"|i1\"");
    assert_int_equal(t->zarr_format, 2);
    assert_true(t->consolidated);
    assert_string_equal(zb__tree_layout(t), "anndata");
    /* bare non-finite tokens inside .zmetadata (row 1) */
    assert_true(isnan(json_object_get_double(zb__json_get(t->nodes[0].attrs, "m"))));
    assert_true(isinf(json_object_get_double(zb__json_get(t->nodes[0].attrs, "n"))));
    const zb__tree_node *x = zb__tree_find(t, "X");
    assert_non_null(x);
    assert_false(x->is_array);
    assert_string_equal(attr_str(x, "encoding-type"), "csr_matrix");
    const zb__tree_node *d = zb__tree_find(t, "X/data");
    assert_non_null(d);
    assert_true(d->is_array);
    assert_int_equal(d->zarr_format, 2);
    assert_non_null(zb__json_get(d->doc, "shape"));
    assert_int_equal(json_object_object_length(d->attrs), 0);
    assert_string_equal(attr_str(zb__tree_find(t, "obs/_index"), "encoding-type"), "string-array");
    assert_null(zb__tree_find(t, "X/data/0"));
    assert_null(zb__tree_find(t, "nope"));
    zb__tree_free(t);

    /* ignored on request: the listing finds no node documents below the root (row 11) */
    t = load(s, "", false);
    assert_false(t->consolidated);
    assert_int_equal(t->n, 1);
    assert_string_equal(t->nodes[0].path, "");
    assert_string_equal(zb__tree_layout(t), "anndata");
    zb__tree_free(t);
    zb_store_close(s);
}

static void
build_v2_listed(zb_store *s)
{
    put(s, ".zgroup", "{\"zarr_format\": 2}");
    put(s, ".zattrs", "{\"m\": NaN}");
    put(s, "a/.zgroup", "{\"zarr_format\": 2}");
    put(s, "a/.zattrs", "{\"k\": 1}");
    put(s, "a/arr/.zarray", F4("[5, 6]", "[2, 4]"));
    put_bytes(s, "a/arr/0.0", 32);
    put_bytes(s, "a/arr/2.1", 17);
    put(s, "a/nested/.zarray",
        "{\"zarr_format\": 2, \"shape\": [4, 4], \"chunks\": [2, 4], \"dtype\": \"<u8\", "
        "\"compressor\": null, \"fill_value\": 18446744073709551615, \"order\": \"F\", "
        "\"dimension_separator\": \"/\"}");
    put(s, "a/nested/.zattrs", "{\"encoding-type\": \"array\"}");
    put_bytes(s, "a/nested/0/0", 64);
    put_bytes(s, "a/nested/1/0", 60);
    put(s, "a/bad/.zarray",
        "{\"zarr_format\": 2, \"shape\": [3], \"chunks\": [3], \"dtype\": \"<c8\", "
        "\"compressor\": null, \"fill_value\": [1.0, \"Infinity\"], \"order\": \"C\"}");
    put(s, "a/huge/.zarray",
        "{\"zarr_format\": 2, \"shape\": [18446744073709551615], \"chunks\": [1048576], "
        "\"dtype\": \"|u1\", \"compressor\": {\"id\": \"zstd\", \"level\": 1}, \"fill_value\": 7,"
        " \"order\": \"C\"}");
    put(s, "a/names/.zarray", STR("[3]"));
    put(s, "junk/readme.txt", "not zarr");
}

static void
test_v2_listing(void **state)
{
    (void)state;
    zb_store *s = memstore();
    build_v2_listed(s);
    zb__tree *t = load(s, "", true);
    static const char *const paths[] = {"", "a", "a/arr", "a/bad", "a/huge", "a/names", "a/nested"};
    expect_paths(t, paths, sizeof paths / sizeof paths[0]);
    assert_false(t->consolidated);
    assert_string_equal(zb__tree_layout(t), "plain");
    assert_true(isnan(json_object_get_double(zb__json_get(t->nodes[0].attrs, "m"))));
    assert_int_equal(json_object_get_int(zb__json_get(zb__tree_find(t, "a")->attrs, "k")), 1);
    assert_true(zb__tree_find(t, "a/nested")->is_array);
    zb__tree_free(t);

    /* a sub-tree keeps store-relative paths; the root is normalised */
    t = load(s, "/a//", true);
    static const char *const sub[] = {"a", "a/arr", "a/bad", "a/huge", "a/names", "a/nested"};
    expect_paths(t, sub, sizeof sub / sizeof sub[0]);
    zb__tree_free(t);

    /* an array as the root */
    t = load(s, "a/arr", true);
    assert_int_equal(t->n, 1);
    assert_true(t->nodes[0].is_array);
    zb__tree_free(t);

    zb__tree *none = (zb__tree *)1;
    assert_int_equal(zb__tree_load(s, "junk", true, &none), ZB_E_NOTFOUND);
    assert_null(none);
    assert_int_equal(zb__tree_load(s, "a/../x", true, &none), ZB_E_BADKEY);
    zb_store_close(s);
}

static void
test_v2_errors(void **state)
{
    (void)state;
    zb__tree *t = NULL;
    zb_store *s = memstore();
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_NOTFOUND);
    put(s, ".zgroup", "{\"zarr_format\": 2} trailing");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), ".zgroup"));
    put(s, ".zgroup", "{\"zarr_format\": 2}");
    put(s, ".zmetadata", "{\"metadata\": {\"a/.zgroup\": {\"zarr_format\": 2},}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), ".zmetadata"));
    put(s, ".zmetadata", "{\"metadata\": [], \"zarr_consolidated_format\": 1}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    put(s, ".zmetadata", "{\"metadata\": {}, \"zarr_consolidated_format\": 2}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    put(s, ".zmetadata", "{\"metadata\": {\"../up/.zgroup\": {\"zarr_format\": 2}}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    put(s, ".zmetadata", "{\"metadata\": {\"a/.zgroup\": {}, \"a/.zarray\": {}}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    assert_null(t);
    /* a .zmetadata without the root's own entries still lists the children */
    put(s, ".zmetadata",
        "{\"metadata\": {\"a/.zgroup\": {\"zarr_format\": 2}, "
        "\"a/x/.zarray\": " F4("[2]", "[2]") ", \"a/x/sub/.zgroup\": {}}}");
    t = load(s, "", true);
    static const char *const paths[] = {"", "a", "a/x"}; /* nothing below an array */
    expect_paths(t, paths, 3);
    zb__tree_free(t);
    /* listing: a malformed child document fails the load, naming the key */
    put(s, ".zmetadata", "{}");
    put(s, "b/.zarray", "{\"zarr_format\": 2,");
    assert_int_equal(zb__tree_load(s, "", false, &t), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), "b/.zarray"));
    zb_store_close(s);
}

/* ---- v3 ------------------------------------------------------------------------------- */

#define V3_ARRF(dtype, shape, fill)                                                                \
    "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": " shape ", \"data_type\": \"" dtype \
    "\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": " shape      \
    "}}, \"chunk_key_encoding\": {\"name\": \"default\"}, \"fill_value\": " fill                   \
    ", \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}], "         \
    "\"attributes\": {}}"
#define V3_ARR(dtype, shape) V3_ARRF(dtype, shape, "0")
#define V3_GROUP(attrs) "{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": " attrs "}"

static const char *const collection_root =
    "{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": {\"encoding-type\": "
    "\"annbatch-preshuffled\", \"encoding-version\": \"0.1.0\", \"x\": NaN},\n"
    " \"consolidated_metadata\": {\"kind\": \"inline\", \"must_understand\": false, "
    "\"metadata\": {\n"
    "  \"dataset_0\": {\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": "
    "{\"encoding-type\": \"anndata\"}, \"consolidated_metadata\": {\"kind\": \"inline\", "
    "\"must_understand\": false, \"metadata\": {}}},\n"
    "  \"dataset_0/X\": " V3_GROUP(
        "{\"encoding-type\": \"csr_matrix\", \"shape\": [10, 5], "
        "\"m\": -Infinity}") ",\n"
                             "  \"dataset_0/X/data\": " V3_ARR(
                                 "float32", "[30]") ",\n"
                                                    "  \"dataset_10\": {\"zarr_format\": 3, "
                                                    "\"node_type\": \"group\"},\n"
                                                    "  \"dataset_1\": " V3_GROUP("{}") "\n"
                                                                                       " }}}";

static void
test_v3_consolidated_collection(void **state)
{
    (void)state;
    zb_store *s = memstore();
    put(s, "zarr.json", collection_root);
    zb__tree *t = load(s, "", true);
    static const char *const paths[] = {"",          "dataset_0", "dataset_0/X", "dataset_0/X/data",
                                        "dataset_1", "dataset_10"};
    expect_paths(t, paths, sizeof paths / sizeof paths[0]);
    assert_int_equal(t->zarr_format, 3);
    assert_true(t->consolidated);
    assert_string_equal(zb__tree_layout(t), "annbatch-collection");
    assert_true(isnan(json_object_get_double(zb__json_get(t->nodes[0].attrs, "x"))));
    const zb__tree_node *x = zb__tree_find(t, "dataset_0/X");
    assert_true(isinf(json_object_get_double(zb__json_get(x->attrs, "m"))));
    assert_true(zb__tree_find(t, "dataset_0/X/data")->is_array);
    assert_int_equal(json_object_object_length(zb__tree_find(t, "dataset_10")->attrs), 0);
    zb__tree_free(t);

    /* kind other than inline (row 29) */
    put(s, "zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", "
        "\"consolidated_metadata\": {\"kind\": \"chunked\", \"metadata\": {}}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    assert_non_null(strstr(zb_last_error(), "inline"));
    /* ...but ignored when consolidated metadata is not used */
    t = load(s, "", false);
    assert_int_equal(t->n, 1);
    zb__tree_free(t);
    put(s, "zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", "
        "\"consolidated_metadata\": {\"kind\": \"inline\", \"metadata\": "
        "{\"a/../b\": " V3_GROUP("{}") "}}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    put(s, "zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", "
        "\"consolidated_metadata\": {\"kind\": \"inline\", \"metadata\": "
        "{\"a\": {\"zarr_format\": 3, \"node_type\": \"table\"}}}}");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_METADATA);
    put(s, "zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": {\"a\": "
        "NaN} x");
    assert_int_equal(zb__tree_load(s, "", true, &t), ZB_E_JSON);

    /* early zarr-python 3: consolidated metadata nested per group, merged */
    put(s, "zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", \"consolidated_metadata\": {\"kind\": "
        "\"inline\", \"metadata\": {\"g\": {\"zarr_format\": 3, \"node_type\": \"group\", "
        "\"consolidated_metadata\": {\"kind\": \"inline\", \"metadata\": {\"arr\": " V3_ARR(
            "int8", "[4]") "}}}}}}");
    t = load(s, "", true);
    static const char *const nested[] = {"", "g", "g/arr"};
    expect_paths(t, nested, 3);
    zb__tree_free(t);
    zb_store_close(s);
}

static void
build_atomic(zb_store *s, bool with_fields)
{
    put(s, "zarr.json",
        with_fields ? "{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": "
                      "{\"num_samples\": 3, \"fields\": {\"core\": {\"positions\": \"atom\"}}}, "
                      "\"consolidated_metadata\": null}"
                    : V3_GROUP("{\"num_samples\": 3}"));
    put(s, "meta/zarr.json", V3_GROUP("{}"));
    put(s, "meta/atoms_ptr/zarr.json", V3_ARR("int64", "[4]"));
    put_bytes(s, "meta/atoms_ptr/c/0", 32);
    put(s, "meta/samples_mask/zarr.json", V3_ARRF("bool", "[3]", "false"));
    put_bytes(s, "meta/samples_mask/c/0", 3);
    put(s, "core/zarr.json", V3_GROUP("{}"));
    put(s, "core/positions/zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [9, 3], \"data_type\": "
        "\"float32\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": "
        "{\"chunk_shape\": [4, 3]}}, \"chunk_key_encoding\": {\"name\": \"default\"}, "
        "\"fill_value\": \"NaN\", \"codecs\": [{\"name\": \"sharding_indexed\", "
        "\"configuration\": {\"chunk_shape\": [2, 3], \"codecs\": [{\"name\": \"bytes\", "
        "\"configuration\": {\"endian\": \"little\"}}, {\"name\": \"zstd\", \"configuration\": "
        "{\"level\": 0, \"checksum\": false}}], \"index_codecs\": [{\"name\": \"bytes\", "
        "\"configuration\": {\"endian\": \"little\"}}, {\"name\": \"crc32c\"}]}}]}");
    put_bytes(s, "core/positions/c/0/0", 100);
    put_bytes(s, "core/positions/c/1/0", 90);
    put_bytes(s, "core/positions/c/2/0", 36);
}

static void
test_v3_listing_atomic(void **state)
{
    (void)state;
    zb_store *s = memstore();
    build_atomic(s, true);
    zb__tree *t = load(s, "", true);
    static const char *const paths[] = {"",     "core",           "core/positions",
                                        "meta", "meta/atoms_ptr", "meta/samples_mask"};
    expect_paths(t, paths, sizeof paths / sizeof paths[0]);
    assert_false(t->consolidated);
    assert_int_equal(t->zarr_format, 3);
    assert_string_equal(zb__tree_layout(t), "atomic");
    zb__tree_free(t);
    zb_store_close(s);

    s = memstore();
    build_atomic(s, false);
    t = load(s, "", true);
    assert_string_equal(zb__tree_layout(t), "plain");
    zb__tree_free(t);
    zb_store_close(s);
}

/* ---- zb_info_json --------------------------------------------------------------------- */

static json_object *
info(zb_store *s, const char *path, char **text)
{
    zb_status st = zb_info_json(s, path, text);
    if (st != ZB_OK) fail_msg("info: %s: %s", zb_status_name(st), zb_last_error());
    json_object *o = NULL;
    assert_int_equal(zb__json_parse(*text, strlen(*text), "info", &o), ZB_OK);
    return o;
}

static const char *
str_of(json_object *o, const char *key)
{
    json_object *v = zb__json_get(o, key);
    if (!json_object_is_type(v, json_type_string))
        fail_msg("%s is not a string in %s", key, zb__json_text(o));
    return json_object_get_string(v);
}

static json_object *
node_of(json_object *doc, const char *path)
{
    json_object *nodes = zb__json_get(doc, "nodes");
    for (size_t i = 0; i < json_object_array_length(nodes); i++) {
        json_object *n = json_object_array_get_idx(nodes, i);
        if (!strcmp(str_of(n, "path"), path)) return n;
    }
    fail_msg("no node %s", path);
    return NULL;
}

static int64_t
int_of(json_object *o, const char *key)
{
    json_object *v = zb__json_get(o, key);
    if (!json_object_is_type(v, json_type_int)) fail_msg("%s is not an integer", key);
    return json_object_get_int64(v);
}

static void
test_info_v2(void **state)
{
    (void)state;
    zb_store *s = memstore();
    build_v2_listed(s);
    char *text = NULL;
    json_object *doc = info(s, "", &text);
    assert_string_equal(str_of(doc, "path"), "");
    assert_int_equal(int_of(doc, "zarr_format"), 2);
    assert_string_equal(str_of(doc, "layout"), "plain");
    assert_false(json_object_get_boolean(zb__json_get(doc, "consolidated")));
    assert_int_equal(json_object_array_length(zb__json_get(doc, "nodes")), 7);

    json_object *g = node_of(doc, "a");
    assert_string_equal(str_of(g, "type"), "group");
    assert_int_equal(int_of(zb__json_get(g, "attributes"), "k"), 1);
    assert_null(zb__json_get(g, "shape"));

    json_object *a = node_of(doc, "a/arr");
    assert_string_equal(str_of(a, "type"), "array");
    assert_string_equal(zb__json_text(zb__json_get(a, "shape")), "[5,6]");
    assert_string_equal(zb__json_text(zb__json_get(a, "chunks")), "[2,4]");
    assert_true(json_object_is_type(zb__json_get(a, "shards"), json_type_null));
    assert_string_equal(str_of(a, "dtype"), "float32");
    assert_string_equal(str_of(a, "codecs"), "none");
    assert_true(json_object_get_double(zb__json_get(a, "fill_value")) == -1.0);
    assert_int_equal(int_of(a, "stored_bytes"), 32 + 17);
    assert_int_equal(int_of(a, "logical_bytes"), 5 * 6 * 4);

    /* '/'-separated chunks nest in directories; metadata files are not counted */
    json_object *n = node_of(doc, "a/nested");
    assert_int_equal(int_of(n, "stored_bytes"), 64 + 60);
    assert_int_equal(int_of(n, "logical_bytes"), 16 * 8);
    assert_string_equal(str_of(n, "codecs"), "order(F)");
    assert_true(zb__json_is_big_uint(zb__json_get(n, "fill_value")));
    assert_true(json_object_get_uint64(zb__json_get(n, "fill_value")) == UINT64_MAX);
    assert_string_equal(
        json_object_get_string(zb__json_get(zb__json_get(n, "attributes"), "encoding-type")),
        "array");

    /* an array of an unsupported dtype is reported in place, the rest is still described */
    json_object *bad = node_of(doc, "a/bad");
    assert_non_null(strstr(str_of(bad, "error"), "<c8"));
    assert_null(zb__json_get(bad, "shape"));

    /* uint64 sizes stay exact */
    json_object *h = node_of(doc, "a/huge");
    assert_true(json_object_get_uint64(json_object_array_get_idx(zb__json_get(h, "shape"), 0)) ==
                UINT64_MAX);
    assert_true(json_object_get_uint64(zb__json_get(h, "logical_bytes")) == UINT64_MAX);
    assert_int_equal(int_of(h, "stored_bytes"), 0);
    assert_int_equal(int_of(h, "fill_value"), 7);
    assert_string_equal(str_of(h, "codecs"), "zstd(1)");
    assert_non_null(strstr(text, "\"shape\":[18446744073709551615]"));

    json_object *names = node_of(doc, "a/names");
    assert_string_equal(str_of(names, "dtype"), "string");
    assert_true(json_object_is_type(zb__json_get(names, "logical_bytes"), json_type_null));
    assert_non_null(strstr(text, "\"logical_bytes\":null"));
    json_object_put(doc);
    free(text);

    /* a path below the root */
    doc = info(s, "a", &text);
    assert_string_equal(str_of(doc, "path"), "a");
    assert_int_equal(json_object_array_length(zb__json_get(doc, "nodes")), 6);
    json_object_put(doc);
    free(text);

    char *none = (char *)1;
    assert_int_equal(zb_info_json(s, "junk", &none), ZB_E_NOTFOUND);
    assert_null(none);
    zb_store_close(s);
}

static void
test_info_v3(void **state)
{
    (void)state;
    zb_store *s = memstore();
    build_atomic(s, true);
    char *text = NULL;
    json_object *doc = info(s, "", &text);
    assert_int_equal(int_of(doc, "zarr_format"), 3);
    assert_string_equal(str_of(doc, "layout"), "atomic");
    json_object *p = node_of(doc, "core/positions");
    /* chunks is the read unit (inner chunk), shards the grid */
    assert_string_equal(zb__json_text(zb__json_get(p, "chunks")), "[2,3]");
    assert_string_equal(zb__json_text(zb__json_get(p, "shards")), "[4,3]");
    assert_string_equal(str_of(p, "codecs"),
                        "sharding(inner [2,3], index end+crc32c) [bytes(little) | zstd(0)]");
    assert_string_equal(str_of(p, "fill_value"), "NaN");
    assert_int_equal(int_of(p, "stored_bytes"), 100 + 90 + 36);
    assert_int_equal(int_of(p, "logical_bytes"), 9 * 3 * 4);
    json_object *m = node_of(doc, "meta/samples_mask");
    assert_string_equal(str_of(m, "dtype"), "bool");
    assert_true(json_object_is_type(zb__json_get(m, "fill_value"), json_type_boolean));
    assert_int_equal(int_of(m, "stored_bytes"), 3);
    assert_int_equal(int_of(node_of(doc, "meta/atoms_ptr"), "stored_bytes"), 32);
    json_object_put(doc);
    free(text);
    zb_store_close(s);

    s = memstore();
    put(s, "zarr.json", collection_root);
    doc = info(s, "", &text);
    assert_true(json_object_get_boolean(zb__json_get(doc, "consolidated")));
    assert_string_equal(str_of(doc, "layout"), "annbatch-collection");
    assert_int_equal(json_object_array_length(zb__json_get(doc, "nodes")), 6);
    json_object_put(doc);
    free(text);
    zb_store_close(s);
}

/* A detail message is well-formed UTF-8 whatever it quotes: bytes of a damaged name that are not
 * UTF-8 are written \xNN, well-formed sequences are kept, and a sequence the message's cap cuts
 * is escaped, not left half. */
static void
test_messages_are_utf8(void **state)
{
    (void)state;
    assert_int_equal(zb__err(ZB_E_CORRUPT, "name '%s' (%d)",
                             "a\xff\xfe"
                             "b\xc3\xa9\xed\xa0\x80",
                             7),
                     ZB_E_CORRUPT);
    assert_string_equal(zb_last_error(), "name 'a\\xff\\xfeb\xc3\xa9\\xed\\xa0\\x80' (7)");
    zb__err(ZB_E_CORRUPT, "plain ascii \\x41 stays");
    assert_string_equal(zb_last_error(), "plain ascii \\x41 stays");
    zb__err_context(ZB_E_CORRUPT, "in \xf0\x9f\x98\x80 %s", "x\x80");
    assert_string_equal(zb_last_error(), "in \xf0\x9f\x98\x80 x\\x80: plain ascii \\x41 stays");
    char big[1100];
    memset(big, 'a', sizeof big);
    big[1022] = (char)0xc3, big[1023] = (char)0xa9, big[1030] = '\0'; /* the cap cuts the é */
    zb__err(ZB_E_CORRUPT, "%s", big);
    size_t n = strlen(zb_last_error()), bad;
    assert_true(n == 1022 && zb__utf8_valid(zb_last_error(), &bad)); /* no room for \xc3 */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v2_consolidated_anndata),
        cmocka_unit_test(test_v2_listing),
        cmocka_unit_test(test_v2_errors),
        cmocka_unit_test(test_v3_consolidated_collection),
        cmocka_unit_test(test_v3_listing_atomic),
        cmocka_unit_test(test_info_v2),
        cmocka_unit_test(test_info_v3),
        cmocka_unit_test(test_messages_are_utf8),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
