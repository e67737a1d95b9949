/* zb_store_copy (src/convert/copy.c): a tree of groups and arrays copied into another store with
 * a new format, codec and chunking, on compression threads. The oracle is the source: every
 * array reads back row for row, with its dtype, shape, fill value and attributes, each group
 * keeps its attributes, and the new chunking is the one chunk_bytes asks for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "zbatch.h"

#define ROWS 1000

static void
put_array(zb_store *s, const char *path, zb_dtype dt, int ndim, const uint64_t *row_shape,
          const void *rows, uint64_t n, const char *attrs)
{
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.chunk_rows = 128;
    o.codec = "lz4";
    o.attributes_json = attrs;
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, path, dt, ndim, row_shape, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, rows, n));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
}

/* A v2 tree: root {"kind": "root"} / grid [ROWS, 3] int32, sub {"kind": "sub"} / x float64
 * [ROWS], sub / names (strings). */
static zb_store *
source(int32_t *grid, double *x)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    for (int i = 0; i < ROWS * 3; i++) grid[i] = i * 7 - 1000;
    for (int i = 0; i < ROWS; i++) x[i] = i / 8.0 - 3.0;
    zbt_put_str(s, ".zgroup", "{\"zarr_format\": 2}");
    zbt_put_str(s, ".zattrs", "{\"kind\": \"root\"}");
    zbt_put_str(s, "sub/.zgroup", "{\"zarr_format\": 2}");
    zbt_put_str(s, "sub/.zattrs", "{\"kind\": \"sub\", \"n\": [1, 2]}");
    const uint64_t three = 3;
    put_array(s, "grid", ZB_DT_INT32, 2, &three, grid, ROWS, "{\"unit\": \"m\"}");
    put_array(s, "sub/x", ZB_DT_FLOAT64, 1, NULL, x, ROWS, NULL);
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.chunk_rows = 2;
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "sub/names", ZB_DT_STRING, 1, NULL, &o, &w));
    const uint64_t off[4] = {0, 5, 5, 10};
    ZB_ASSERT_OK(zb_array_writer_append_strings(w, "alphaβeta", off, 3));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    return s;
}

static bool
contains(zb_store *s, const char *key, const char *needle)
{
    uint8_t *doc = NULL;
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, key, &doc, &n));
    bool found = strstr((const char *)doc, needle) != NULL;
    free(doc);
    return found;
}

static void
check_copy(zb_store *dst, int format, const int32_t *grid, const double *x)
{
    zb_array *a = NULL;
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_open(dst, "grid", &a));
    zb_array_get_info(a, &info);
    assert_int_equal(info.zarr_format, format);
    assert_int_equal(info.dtype, ZB_DT_INT32);
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[0], ROWS);
    assert_int_equal(info.shape[1], 3);
    assert_int_equal(info.chunk_shape[0], 4096 / 12); /* chunk_bytes / row bytes */
    assert_non_null(strstr(info.codecs, "zstd"));
    assert_non_null(strstr(info.attributes_json, "\"unit\""));
    int32_t *got = malloc(ROWS * 3 * sizeof *got);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, ROWS, got, ROWS * 3 * sizeof *got, NULL));
    assert_memory_equal(got, grid, ROWS * 3 * sizeof *got);
    free(got);
    zb_array_close(a);

    ZB_ASSERT_OK(zb_array_open(dst, "sub/x", &a));
    zb_array_get_info(a, &info);
    assert_int_equal(info.dtype, ZB_DT_FLOAT64);
    assert_int_equal(info.chunk_shape[0], 4096 / 8);
    double *xs = malloc(ROWS * sizeof *xs);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, ROWS, xs, ROWS * sizeof *xs, NULL));
    assert_memory_equal(xs, x, ROWS * sizeof *xs);
    free(xs);
    zb_array_close(a);

    ZB_ASSERT_OK(zb_array_open(dst, "sub/names", &a));
    zb_strings s;
    ZB_ASSERT_OK(zb_array_read_strings(a, 0, 3, &s, NULL));
    assert_int_equal(s.n, 3);
    assert_int_equal(s.offsets[3], 10); /* "β" is two bytes */
    assert_memory_equal(s.data, "alphaβeta", 10);
    assert_int_equal(s.offsets[1], 5);
    assert_int_equal(s.offsets[2], 5);
    zb_strings_free(&s);
    zb_array_close(a);

    const char *root = format == 2 ? ".zattrs" : "zarr.json";
    const char *sub = format == 2 ? "sub/.zattrs" : "sub/zarr.json";
    assert_true(contains(dst, root, "\"kind\""));
    assert_true(contains(dst, root, "\"root\""));
    assert_true(contains(dst, sub, "\"sub\""));
}

/* Into a file store as v3 and as v2, with zstd and 4 KiB chunks on two threads. */
static void
test_copy_formats(void **state)
{
    (void)state;
    int32_t *grid = malloc(ROWS * 3 * sizeof *grid);
    double *x = malloc(ROWS * sizeof *x);
    zb_store *src = source(grid, x);
    for (int format = 2; format <= 3; format++) {
        char name[32];
        snprintf(name, sizeof name, "copy_v%d", format);
        zb_store *dst = NULL;
        ZB_ASSERT_OK(zb_store_open_file(zbt_tempdir(name), &dst));
        zb_copy_opts o = ZB_COPY_OPTS_DEFAULT;
        o.zarr_format = format;
        o.codec = "zstd:3";
        o.chunk_bytes = 4096;
        o.num_threads = 2;
        ZB_ASSERT_OK(zb_store_copy(src, "", dst, "", &o));
        check_copy(dst, format, grid, x);
        zb_store_close(dst);
    }
    /* a subtree lands under another path */
    zb_store *dst = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&dst));
    zb_copy_opts o = ZB_COPY_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_store_copy(src, "sub", dst, "deep/er", &o));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(dst, "deep/er/x", &a));
    double first[2];
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 2, first, sizeof first, NULL));
    assert_true(first[0] == x[0] && first[1] == x[1]);
    zb_array_close(a);
    uint64_t n = 0;
    ZB_ASSERT_ERR(zb_store_size(dst, "deep/er/grid/zarr.json", &n), ZB_E_NOTFOUND, NULL);
    zb_store_close(dst);
    zb_store_close(src);
    free(grid);
    free(x);
}

/* A 0-d array is skipped with skip_unsupported, else refused naming it; a bad codec is refused
 * naming the codec. */
static void
test_copy_refusals(void **state)
{
    (void)state;
    int32_t *grid = malloc(ROWS * 3 * sizeof *grid);
    double *x = malloc(ROWS * sizeof *x);
    zb_store *src = source(grid, x);
    zbt_put_str(src, "scalar/.zarray",
                "{\"zarr_format\": 2, \"shape\": [], \"chunks\": [], \"dtype\": \"<i4\", "
                "\"compressor\": null, \"fill_value\": 0, \"order\": \"C\", \"filters\": null}");
    zb_store *dst = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&dst));
    zb_copy_opts o = ZB_COPY_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_store_copy(src, "", dst, "", &o));
    uint64_t n = 0;
    ZB_ASSERT_ERR(zb_store_size(dst, "scalar/zarr.json", &n), ZB_E_NOTFOUND, NULL);
    ZB_ASSERT_OK(zb_store_size(dst, "grid/zarr.json", &n));
    zb_store_close(dst);

    ZB_ASSERT_OK(zb_store_open_memory(&dst));
    o.skip_unsupported = false;
    ZB_ASSERT_ERR(zb_store_copy(src, "", dst, "", &o), ZB_E_UNSUPPORTED, "scalar");
    zb_store_close(dst);

    ZB_ASSERT_OK(zb_store_open_memory(&dst));
    o = (zb_copy_opts)ZB_COPY_OPTS_DEFAULT;
    o.codec = "zstd:banana";
    ZB_ASSERT_ERR(zb_store_copy(src, "", dst, "", &o), ZB_E_INVALID, "banana");
    zb_store_close(dst);
    zb_store_close(src);
    free(grid);
    free(x);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_formats),
        cmocka_unit_test(test_copy_refusals),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
