/* The array writer, its codec strings and the worker pool: every codec in v2 and v3, every
 * dtype, sharding with the index at either end, streaming appends over several commits,
 * reopening to append, strings, write_empty_chunks, worker errors, and the golden facts of
 * shared FORMATS.md §2.1 (numcodecs 0.11 key sets, zstd content size) and §4.5 (shard layout).
 * Values are checked against the source rows through the independent read path
 * (zb_array_read_rows / zb_array_read_strings); byte layouts against the format text. */
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "support/testutil.h"
#include "util/pool.h"
#include "util/status.h"
#include "write/codec_spec.h"
#include "write/write.h"
#include "zarr/codec.h"

#define MAX64 UINT64_MAX

/* ---- helpers -------------------------------------------------------------------------- */

/* Deterministic float rows: value = row * 100 + column (exact in float32 for these sizes). */
static float *
make_rows(uint64_t nrows, uint64_t width, uint64_t first_row)
{
    float *d = malloc((size_t)(nrows * width) * sizeof *d + 1);
    assert_non_null(d);
    for (uint64_t r = 0; r < nrows; r++)
        for (uint64_t c = 0; c < width; c++) d[r * width + c] = (float)((first_row + r) * 100 + c);
    return d;
}

/* Reads rows [0, nrows) of `path` and compares them with make_rows(nrows, width, 0). */
static void
check_float_rows(zb_store *s, const char *path, uint64_t nrows, uint64_t width)
{
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_int_equal(info.shape[0], nrows);
    float *want = make_rows(nrows, width, 0);
    float *got = malloc((size_t)(nrows * width) * sizeof *got + 1);
    assert_non_null(got);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, nrows, got, (size_t)(nrows * width) * sizeof *got, NULL));
    assert_memory_equal(got, want, (size_t)(nrows * width) * sizeof *got);
    free(got);
    free(want);
    zb_array_close(a);
}

static uint8_t *
get_all(zb_store *s, const char *key, uint64_t *len)
{
    uint8_t *data = NULL;
    ZB_ASSERT_OK(zb_store_read_all(s, key, &data, len));
    return data;
}

static bool
has_key(zb_store *s, const char *key)
{
    uint64_t size;
    zb_status st = zb_store_size(s, key, &size);
    if (st == ZB_OK) return true;
    assert_int_equal(st, ZB_E_NOTFOUND);
    return false;
}

static json_object *
load_json(zb_store *s, const char *key)
{
    uint64_t len;
    uint8_t *text = get_all(s, key, &len);
    json_object *obj = json_tokener_parse((const char *)text);
    free(text);
    assert_non_null(obj);
    return obj;
}

/* The keys of an object, sorted and joined with ',' into buf. */
static const char *
key_set(json_object *obj, char *buf, size_t cap)
{
    const char *names[32];
    size_t n = 0;
    json_object_object_foreach(obj, k, v)
    {
        (void)v;
        if (n < 32) names[n++] = k;
    }
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strncat(buf, names[i], cap - strlen(buf) - 1);
        if (i + 1 < n) strncat(buf, ",", cap - strlen(buf) - 1);
    }
    return buf;
}

/* Compact JSON text, '/' unescaped (lives as long as the object). */
static const char *
plain(json_object *obj)
{
    return json_object_to_json_string_ext(obj,
                                          JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

static uint64_t
le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes make_rows(nrows, width) as a float32 array in one append + commit. */
static void
write_floats(zb_store *s, const char *path, const zb_array_write_opts *o, uint64_t nrows,
             uint64_t width)
{
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, path, ZB_DT_FLOAT32, width > 1 ? 2 : 1, &width, o, &w));
    float *d = make_rows(nrows, width, 0);
    ZB_ASSERT_OK(zb_array_writer_append(w, d, nrows));
    assert_int_equal(zb_array_writer_rows(w), nrows);
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    free(d);
}

/* ---- codec strings -------------------------------------------------------------------- */

static void
test_codec_spec_parse(void **state)
{
    (void)state;
    zb__codec c;
    bool has;
    /* the default (docs/PERFORMANCE.md: fastest decode at a better ratio than zstd:3) */
    ZB_ASSERT_OK(zb__codec_spec_parse(NULL, 3, &c, &has));
    assert_true(has);
    assert_int_equal(c.id, ZB_CODEC_BLOSC);
    assert_string_equal(c.cname, "lz4");
    assert_int_equal(c.level, 5);
    assert_int_equal(c.shuffle, ZB_SHUFFLE_BYTE);
    ZB_ASSERT_OK(zb__codec_spec_parse("none", 2, &c, &has));
    assert_false(has);
    ZB_ASSERT_OK(zb__codec_spec_parse("zstd:-5", 2, &c, &has));
    assert_int_equal(c.level, -5);
    assert_false(c.checksum);
    ZB_ASSERT_OK(zb__codec_spec_parse("zstd:7:checksum", 3, &c, &has));
    assert_int_equal(c.level, 7);
    assert_true(c.checksum);
    ZB_ASSERT_OK(zb__codec_spec_parse("lz4:3", 2, &c, &has));
    assert_int_equal(c.id, ZB_CODEC_LZ4);
    assert_int_equal(c.acceleration, 3);
    ZB_ASSERT_OK(zb__codec_spec_parse("gzip:9", 3, &c, &has));
    assert_int_equal(c.id, ZB_CODEC_GZIP);
    assert_int_equal(c.level, 9);
    ZB_ASSERT_OK(zb__codec_spec_parse("zlib", 2, &c, &has));
    assert_int_equal(c.id, ZB_CODEC_ZLIB);
    assert_int_equal(c.level, 1);
    ZB_ASSERT_OK(zb__codec_spec_parse("blosc", 2, &c, &has));
    assert_string_equal(c.cname, "lz4");
    assert_int_equal(c.level, 5);
    assert_int_equal(c.shuffle, ZB_SHUFFLE_BYTE);
    ZB_ASSERT_OK(zb__codec_spec_parse("blosc:zstd:3:bitshuffle", 3, &c, &has));
    assert_string_equal(c.cname, "zstd");
    assert_int_equal(c.level, 3);
    assert_int_equal(c.shuffle, ZB_SHUFFLE_BIT);

    ZB_ASSERT_ERR(zb__codec_spec_parse("zstd:3:checksum", 2, &c, &has), ZB_E_INVALID, "checksum");
    ZB_ASSERT_ERR(zb__codec_spec_parse("zstd:99", 3, &c, &has), ZB_E_INVALID, "zstd level");
    ZB_ASSERT_ERR(zb__codec_spec_parse("zstd:x", 3, &c, &has), ZB_E_INVALID, "not an integer");
    ZB_ASSERT_ERR(zb__codec_spec_parse("zstd:3:crc", 3, &c, &has), ZB_E_INVALID, "\"crc\"");
    ZB_ASSERT_ERR(zb__codec_spec_parse("brotli", 3, &c, &has), ZB_E_INVALID, "brotli");
    ZB_ASSERT_ERR(zb__codec_spec_parse("gzip:10", 3, &c, &has), ZB_E_INVALID, "gzip level");
    ZB_ASSERT_ERR(zb__codec_spec_parse("gzip:1:2", 3, &c, &has), ZB_E_INVALID, "at most 1");
    ZB_ASSERT_ERR(zb__codec_spec_parse("lz4:0", 3, &c, &has), ZB_E_INVALID, "acceleration");
    ZB_ASSERT_ERR(zb__codec_spec_parse("blosc:lzma", 3, &c, &has), ZB_E_INVALID, "lzma");
    ZB_ASSERT_ERR(zb__codec_spec_parse("blosc:lz4:5:byte", 3, &c, &has), ZB_E_INVALID, "shuffle");
    ZB_ASSERT_ERR(zb__codec_spec_parse("zstd:", 3, &c, &has), ZB_E_INVALID, "empty");
    ZB_ASSERT_ERR(zb__codec_spec_parse("none:1", 3, &c, &has), ZB_E_INVALID, "none");
}

/* numcodecs 0.11 accepts exactly these keys (FORMATS.md §2.1). */
static void
test_codec_v2_json_minimal_keys(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *keys, *json;
    } cases[] = {
        {"blosc:zstd:3:bitshuffle", "blocksize,clevel,cname,id,shuffle",
         "{\"blocksize\":0,\"clevel\":3,\"cname\":\"zstd\",\"id\":\"blosc\",\"shuffle\":2}"},
        {"zstd:5", "id,level", "{\"id\":\"zstd\",\"level\":5}"},
        {"lz4", "acceleration,id", "{\"acceleration\":1,\"id\":\"lz4\"}"},
        {"gzip:4", "id,level", "{\"id\":\"gzip\",\"level\":4}"},
        {"zlib:2", "id,level", "{\"id\":\"zlib\",\"level\":2}"},
    };
    char buf[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zb__codec c;
        bool has;
        json_object *o = NULL;
        ZB_ASSERT_OK(zb__codec_spec_parse(cases[i].spec, 2, &c, &has));
        ZB_ASSERT_OK(zb__codec_v2_json(&c, &o));
        assert_string_equal(key_set(o, buf, sizeof buf), cases[i].keys);
        assert_string_equal(plain(o), cases[i].json);
        json_object_put(o);
    }
    /* a checksum cannot reach v2 JSON even if a codec carries one */
    zb__codec z = {.id = ZB_CODEC_ZSTD, .level = 1, .checksum = true};
    json_object *o = NULL;
    ZB_ASSERT_ERR(zb__codec_v2_json(&z, &o), ZB_E_INVALID, "checksum");
    assert_null(o);
}

static void
test_codec_v3_json(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        size_t itemsize;
        const char *json;
    } cases[] = {
        {"blosc:lz4:3:shuffle", 4,
         "{\"name\":\"blosc\",\"configuration\":{\"cname\":\"lz4\",\"clevel\":3,\"shuffle\":"
         "\"shuffle\",\"typesize\":4,\"blocksize\":0}}"},
        {"blosc:zlib:1:noshuffle", 0,
         "{\"name\":\"blosc\",\"configuration\":{\"cname\":\"zlib\",\"clevel\":1,\"shuffle\":"
         "\"noshuffle\",\"typesize\":1,\"blocksize\":0}}"},
        {"zstd:2", 8, "{\"name\":\"zstd\",\"configuration\":{\"level\":2,\"checksum\":false}}"},
        {"zstd:2:checksum", 8,
         "{\"name\":\"zstd\",\"configuration\":{\"level\":2,\"checksum\":true}}"},
        {"gzip:6", 2, "{\"name\":\"gzip\",\"configuration\":{\"level\":6}}"},
        {"zlib:6", 2, "{\"name\":\"numcodecs.zlib\",\"configuration\":{\"level\":6}}"},
        {"lz4:2", 2, "{\"name\":\"numcodecs.lz4\",\"configuration\":{\"acceleration\":2}}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zb__codec c;
        bool has;
        json_object *o = NULL;
        ZB_ASSERT_OK(zb__codec_spec_parse(cases[i].spec, 3, &c, &has));
        ZB_ASSERT_OK(zb__codec_v3_json(&c, cases[i].itemsize, &o));
        assert_string_equal(plain(o), cases[i].json);
        json_object_put(o);
    }
}

/* ---- round trips ---------------------------------------------------------------------- */

static const char *const all_codecs[] = {
    "none",
    "zstd:1",
    "zstd:-1",
    "lz4",
    "gzip:5",
    "zlib:3",
    "blosc",
    "blosc:zstd:3:bitshuffle",
    "blosc:blosclz:9:noshuffle",
    "blosc:lz4hc:4:shuffle",
    "blosc:zlib:1:shuffle",
};

static void
test_roundtrip_every_codec(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++)
        for (size_t i = 0; i < sizeof all_codecs / sizeof all_codecs[0]; i++) {
            zb_store *s = NULL;
            ZB_ASSERT_OK(zb_store_open_memory(&s));
            zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
            o.zarr_format = fmt;
            o.codec = all_codecs[i];
            o.chunk_rows = 4; /* 11 rows: an edge chunk of 3 */
            write_floats(s, "x/y", &o, 11, 5);
            check_float_rows(s, "x/y", 11, 5);

            zb_array *a = NULL;
            ZB_ASSERT_OK(zb_array_open(s, "x/y", &a));
            zb_array_info info;
            ZB_ASSERT_OK(zb_array_get_info(a, &info));
            assert_int_equal(info.zarr_format, fmt);
            assert_int_equal(info.chunk_shape[0], 4);
            assert_int_equal(info.chunk_shape[1], 5);
            assert_null(info.shard_shape);
            zb_array_close(a);

            /* the edge chunk is stored full-size, padded with the fill (zeros) */
            const char *key = fmt == 2 ? "x/y/2.0" : "x/y/c/2/0";
            assert_true(has_key(s, key));
            assert_false(has_key(s, fmt == 2 ? "x/y/3.0" : "x/y/c/3/0"));
            if (!strcmp(all_codecs[i], "none")) {
                uint64_t len;
                uint8_t *raw = get_all(s, key, &len);
                assert_int_equal(len, 4 * 5 * 4);
                float tail[5];
                memcpy(tail, raw + 3 * 5 * 4, sizeof tail);
                for (int c = 0; c < 5; c++) assert_true(tail[c] == 0.0f);
                free(raw);
            }
            zb_store_close(s);
        }
}

static void
set_item(void *dst, zb_dtype dt, uint64_t i)
{
    switch (dt) {
    case ZB_DT_BOOL:
        *(uint8_t *)dst = (uint8_t)(i % 3 == 0);
        break;
    case ZB_DT_INT8:
        *(int8_t *)dst = (int8_t)((int)(i % 200) - 100);
        break;
    case ZB_DT_INT16:
        *(int16_t *)dst = (int16_t)((int)(i * 37 % 60000) - 30000);
        break;
    case ZB_DT_INT32:
        *(int32_t *)dst = (int32_t)(i * 2654435761u % 2000000000u) - 1000;
        break;
    case ZB_DT_INT64:
        *(int64_t *)dst = (int64_t)(i * 0x9E3779B97F4A7C15ull);
        break;
    case ZB_DT_UINT8:
        *(uint8_t *)dst = (uint8_t)(i * 7);
        break;
    case ZB_DT_UINT16:
        *(uint16_t *)dst = (uint16_t)(i * 1031);
        break;
    case ZB_DT_UINT32:
        *(uint32_t *)dst = (uint32_t)(i * 2654435761u);
        break;
    case ZB_DT_UINT64:
        *(uint64_t *)dst = i * 0x9E3779B97F4A7C15ull;
        break;
    case ZB_DT_FLOAT16:
        *(uint16_t *)dst = (uint16_t)(0x3c00 + i % 1000);
        break;
    case ZB_DT_FLOAT32:
        *(float *)dst = (float)i * 0.5f - 7.0f;
        break;
    case ZB_DT_FLOAT64:
        *(double *)dst = (double)i * 1e-3 - 1e10;
        break;
    default:
        fail();
    }
}

/* Every fixed-size dtype, both formats, a non-zero fill that pads the edge chunk. */
static void
test_roundtrip_every_dtype(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++)
        for (int dti = 0; dti < ZB_DT_STRING; dti++) {
            zb_dtype dt = (zb_dtype)dti;
            size_t isz = zb_dtype_size(dt);
            const uint64_t n = 23;
            uint8_t *src = malloc(n * 3 * isz);
            assert_non_null(src);
            for (uint64_t i = 0; i < n * 3; i++) set_item(src + i * isz, dt, i);
            uint8_t fill[8];
            set_item(fill, dt, 5);
            zb_store *s = NULL;
            ZB_ASSERT_OK(zb_store_open_memory(&s));
            zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
            o.zarr_format = fmt;
            o.codec = "blosc:lz4:5:shuffle";
            o.chunk_rows = 5;
            o.fill_value = fill;
            uint64_t rs = 3;
            zb_array_writer *w = NULL;
            ZB_ASSERT_OK(zb_array_writer_open(s, "a", dt, 2, &rs, &o, &w));
            ZB_ASSERT_OK(zb_array_writer_append(w, src, n));
            ZB_ASSERT_OK(zb_array_writer_commit(w));
            zb_array_writer_close(w);

            zb_array *a = NULL;
            ZB_ASSERT_OK(zb_array_open(s, "a", &a));
            zb_array_info info;
            ZB_ASSERT_OK(zb_array_get_info(a, &info));
            assert_int_equal(info.dtype, dt);
            assert_memory_equal(info.fill_value, fill, isz);
            uint8_t *got = malloc(n * 3 * isz);
            ZB_ASSERT_OK(zb_array_read_rows(a, 0, n, got, n * 3 * isz, NULL));
            assert_memory_equal(got, src, n * 3 * isz);
            free(got);
            zb_array_close(a);

            /* the dtype is named as each format spells it */
            json_object *doc = load_json(s, fmt == 2 ? "a/.zarray" : "a/zarr.json");
            if (fmt == 2)
                assert_string_equal(json_object_get_string(json_object_object_get(doc, "dtype")),
                                    zb_dtype_typestr(dt));
            else
                assert_string_equal(
                    json_object_get_string(json_object_object_get(doc, "data_type")),
                    zb_dtype_name(dt));
            json_object_put(doc);
            zb_store_close(s);
            free(src);
        }
}

/* Fill values: exact integers at the limits, non-finite floats as strings (FORMATS.md §1.3). */
static void
test_fill_value_json(void **state)
{
    (void)state;
    static const struct {
        zb_dtype dt;
        uint64_t bits;
        int fmt;
        const char *json;
    } cases[] = {
        {ZB_DT_UINT64, UINT64_MAX, 2, "18446744073709551615"},
        {ZB_DT_UINT64, UINT64_MAX, 3, "18446744073709551615"},
        {ZB_DT_INT64, 0x8000000000000000ull, 3, "-9223372036854775808"},
        {ZB_DT_INT8, 0x80, 2, "-128"},
        {ZB_DT_FLOAT32, 0x7fc00000u, 2, "\"NaN\""},
        {ZB_DT_FLOAT32, 0x7fc00000u, 3, "\"NaN\""},
        {ZB_DT_FLOAT32, 0x7fc00001u, 3, "\"0x7fc00001\""},
        {ZB_DT_FLOAT32, 0x7f800000u, 2, "\"Infinity\""},
        {ZB_DT_FLOAT64, 0xfff0000000000000ull, 3, "\"-Infinity\""},
        {ZB_DT_FLOAT16, 0x7e00, 3, "\"NaN\""},
        {ZB_DT_FLOAT16, 0xbc00, 3, "-1.0"},
        {ZB_DT_FLOAT32, 0xbf800000u, 2, "-1.0"},
        {ZB_DT_BOOL, 1, 3, "true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        o.zarr_format = cases[i].fmt;
        o.chunk_rows = 2;
        uint8_t fill[8];
        for (int b = 0; b < 8; b++) fill[b] = (uint8_t)(cases[i].bits >> (8 * b));
        o.fill_value = fill;
        zb_array_writer *w = NULL;
        ZB_ASSERT_OK(zb_array_writer_open(s, "f", cases[i].dt, 1, NULL, &o, &w));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        json_object *doc = load_json(s, cases[i].fmt == 2 ? "f/.zarray" : "f/zarr.json");
        assert_string_equal(plain(json_object_object_get(doc, "fill_value")), cases[i].json);
        json_object_put(doc);
        /* and the reader gets the same bits back */
        zb_array *a = NULL;
        ZB_ASSERT_OK(zb_array_open(s, "f", &a));
        zb_array_info info;
        ZB_ASSERT_OK(zb_array_get_info(a, &info));
        assert_memory_equal(info.fill_value, fill, zb_dtype_size(cases[i].dt));
        assert_int_equal(info.shape[0], 0);
        zb_array_close(a);
        zb_store_close(s);
    }
}

/* ---- golden facts --------------------------------------------------------------------- */

static void
test_v2_metadata_and_zstd_frames(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.codec = "zstd:3";
    o.chunk_rows = 8;
    o.attributes_json = "{\"units\": \"m\", \"bad\": NaN}";
    write_floats(s, "g/a", &o, 20, 1);

    /* every chunk is a zstd frame that declares its content size (numcodecs 0.11 needs it) */
    for (int c = 0; c < 3; c++) {
        char key[32];
        snprintf(key, sizeof key, "g/a/%d", c);
        uint64_t len;
        uint8_t *z = get_all(s, key, &len);
        static const uint8_t magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
        assert_memory_equal(z, magic, 4);
        assert_int_equal(ZSTD_getFrameContentSize(z, (size_t)len), 8 * 4);
        free(z);
    }

    json_object *doc = load_json(s, "g/a/.zarray");
    char buf[256];
    assert_string_equal(key_set(doc, buf, sizeof buf),
                        "chunks,compressor,dimension_separator,dtype,fill_value,filters,order,"
                        "shape,zarr_format");
    json_object *comp = json_object_object_get(doc, "compressor");
    assert_string_equal(key_set(comp, buf, sizeof buf), "id,level");
    assert_string_equal(plain(comp), "{\"id\":\"zstd\",\"level\":3}");
    assert_string_equal(json_object_get_string(json_object_object_get(doc, "dtype")), "<f4");
    assert_string_equal(json_object_get_string(json_object_object_get(doc, "order")), "C");
    assert_true(json_object_is_type(json_object_object_get(doc, "filters"), json_type_null));
    assert_string_equal(plain(json_object_object_get(doc, "shape")), "[20]");
    json_object_put(doc);

    /* attributes went to .zattrs, NaN included */
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "g/a", &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_non_null(strstr(info.attributes_json, "\"units\""));
    assert_non_null(strstr(info.attributes_json, "NaN"));
    zb_array_close(a);

    /* blosc in v2: exact key set and shuffle as a number */
    o.codec = "blosc:lz4:5:shuffle";
    o.attributes_json = NULL;
    write_floats(s, "g/b", &o, 3, 1);
    doc = load_json(s, "g/b/.zarray");
    comp = json_object_object_get(doc, "compressor");
    assert_string_equal(key_set(comp, buf, sizeof buf), "blocksize,clevel,cname,id,shuffle");
    assert_int_equal(json_object_get_int(json_object_object_get(comp, "shuffle")), 1);
    json_object_put(doc);
    assert_false(has_key(s, "g/b/.zattrs"));
    /* the blosc header records typesize 4 (FORMATS.md §2.2) */
    uint64_t len;
    uint8_t *b = get_all(s, "g/b/0", &len);
    assert_int_equal(b[3], 4);
    assert_int_equal(le32(b + 4), 8 * 4);
    assert_int_equal(le32(b + 12), len);
    free(b);
    zb_store_close(s);
}

static void
test_v3_metadata(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.codec = "blosc:lz4:3:shuffle";
    o.chunk_rows = 4;
    o.attributes_json = "{\"k\": [1, 2]}";
    uint8_t u8[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "u", ZB_DT_UINT8, 1, NULL, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, u8, 10));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);

    json_object *doc = load_json(s, "u/zarr.json");
    char buf[256];
    assert_string_equal(key_set(doc, buf, sizeof buf),
                        "attributes,chunk_grid,chunk_key_encoding,codecs,data_type,fill_value,"
                        "node_type,shape,zarr_format");
    assert_string_equal(
        plain(json_object_object_get(doc, "codecs")),
        "[{\"name\":\"bytes\"},{\"name\":\"blosc\",\"configuration\":{\"cname\":\"lz4\","
        "\"clevel\":3,\"shuffle\":\"shuffle\",\"typesize\":1,\"blocksize\":0}}]");
    assert_string_equal(plain(json_object_object_get(doc, "chunk_key_encoding")),
                        "{\"name\":\"default\",\"configuration\":{\"separator\":\"/\"}}");
    assert_string_equal(plain(json_object_object_get(doc, "attributes")), "{\"k\":[1,2]}");
    json_object_put(doc);
    assert_true(has_key(s, "u/c/2"));
    zb_store_close(s);
}

/* ---- sharding ------------------------------------------------------------------------- */

/* Checks the shard layout of FORMATS.md §4.1/§4.5: 16n+4 index bytes at the given end, CRC32C,
 * absolute offsets inside the shard, entries in row order; returns the entries. */
static void
check_shard(zb_store *s, const char *key, uint64_t n, bool at_start, uint64_t *entries)
{
    uint64_t len;
    uint8_t *sh = get_all(s, key, &len);
    uint64_t isz = 16 * n + 4;
    assert_true(len >= isz);
    const uint8_t *idx = at_start ? sh : sh + len - isz;
    assert_int_equal(le32(idx + 16 * n), zb__crc32c(idx, (size_t)(16 * n)));
    uint64_t cursor = at_start ? isz : 0;
    for (uint64_t i = 0; i < n; i++) {
        entries[2 * i] = le64(idx + 16 * i);
        entries[2 * i + 1] = le64(idx + 16 * i + 8);
        if (entries[2 * i] == MAX64) {
            assert_int_equal(entries[2 * i + 1], MAX64);
            continue;
        }
        /* concatenated in row order, no gaps */
        assert_int_equal(entries[2 * i], cursor);
        cursor += entries[2 * i + 1];
    }
    assert_int_equal(cursor + (at_start ? 0 : isz), len);
    free(sh);
}

static void
test_sharded_both_index_locations(void **state)
{
    (void)state;
    for (int at_start = 0; at_start <= 1; at_start++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        o.codec = "zstd:1";
        o.chunk_rows = 3;
        o.shard_rows = 12;
        o.shard_index_at_start = at_start;
        write_floats(s, "sh", &o, 29, 4); /* shards of 12, 12, 5 rows */
        check_float_rows(s, "sh", 29, 4);

        zb_array *a = NULL;
        ZB_ASSERT_OK(zb_array_open(s, "sh", &a));
        zb_array_info info;
        ZB_ASSERT_OK(zb_array_get_info(a, &info));
        assert_non_null(info.shard_shape);
        assert_int_equal(info.shard_shape[0], 12);
        assert_int_equal(info.chunk_shape[0], 3);
        zb_array_close(a);

        uint64_t e[8];
        check_shard(s, "sh/c/0/0", 4, at_start, e);
        for (int i = 0; i < 4; i++) assert_true(e[2 * i] != MAX64);
        /* the last shard holds rows 24..28: inner chunks 0 and 1 (rows 24-26, 27-29); 2 and 3
         * lie past the array and are empty entries */
        check_shard(s, "sh/c/2/0", 4, at_start, e);
        assert_true(e[0] != MAX64);
        assert_true(e[2] != MAX64);
        assert_int_equal(e[4], MAX64);
        assert_int_equal(e[6], MAX64);
        assert_false(has_key(s, "sh/c/3/0"));

        json_object *doc = load_json(s, "sh/zarr.json");
        json_object *codecs = json_object_object_get(doc, "codecs");
        assert_int_equal(json_object_array_length(codecs), 1);
        json_object *cfg =
            json_object_object_get(json_object_array_get_idx(codecs, 0), "configuration");
        assert_string_equal(json_object_get_string(json_object_object_get(cfg, "index_location")),
                            at_start ? "start" : "end");
        assert_string_equal(plain(json_object_object_get(cfg, "index_codecs")),
                            "[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}},"
                            "{\"name\":\"crc32c\"}]");
        json_object_put(doc);
        zb_store_close(s);
    }
}

/* write_empty_chunks = false: all-fill chunks are left out, empty inner chunks get MAX64
 * entries, an all-empty shard is not written at all. */
static void
test_write_empty_chunks_false(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    const uint64_t n = 40, width = 2;
    float fill = -1.0f;
    float *d = malloc(n * width * sizeof *d);
    for (uint64_t i = 0; i < n * width; i++) d[i] = fill;
    for (uint64_t i = 10 * width; i < 15 * width; i++) d[i] = (float)i; /* rows 10..14 */

    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.codec = "lz4";
    o.chunk_rows = 5;
    o.write_empty_chunks = false;
    o.fill_value = &fill;
    o.zarr_format = 2;
    /* a stale chunk where an all-fill one goes must be removed, not read instead of fill */
    zbt_put_str(s, "p/0.0", "stale");
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "p", ZB_DT_FLOAT32, 2, &width, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, d, n));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    for (int c = 0; c < 8; c++) {
        char key[32];
        snprintf(key, sizeof key, "p/%d.0", c);
        assert_int_equal(has_key(s, key), c == 2);
    }
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "p", &a));
    float *got = malloc(n * width * sizeof *got);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, n, got, n * width * sizeof *got, NULL));
    assert_memory_equal(got, d, n * width * sizeof *got);
    zb_array_close(a);

    /* sharded: shard 0 = rows 0..19 holds inner chunk 2 only; shard 1 is all fill */
    o.zarr_format = 3;
    o.shard_rows = 20;
    ZB_ASSERT_OK(zb_array_writer_open(s, "q", ZB_DT_FLOAT32, 2, &width, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, d, n));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    uint64_t e[8];
    check_shard(s, "q/c/0/0", 4, false, e);
    assert_int_equal(e[0], MAX64);
    assert_int_equal(e[2], MAX64);
    assert_int_equal(e[4], 0);
    assert_int_equal(e[6], MAX64);
    assert_false(has_key(s, "q/c/1/0"));
    ZB_ASSERT_OK(zb_array_open(s, "q", &a));
    memset(got, 0, n * width * sizeof *got);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, n, got, n * width * sizeof *got, NULL));
    assert_memory_equal(got, d, n * width * sizeof *got);
    zb_array_close(a);
    free(got);
    free(d);
    zb_store_close(s);
}

/* ---- streaming ------------------------------------------------------------------------ */

/* Appends in odd-sized pieces with a commit after some of them; after each commit the array
 * reads back exactly the rows so far (the partial chunk is rewritten with more rows). */
static void
stream_case(const zb_array_write_opts *o, const char *path)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    const uint64_t width = 3, total = 101;
    float *d = make_rows(total, width, 0);
    static const uint64_t pieces[] = {1, 7, 0, 13, 2, 29, 5, 11, 33};
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, path, ZB_DT_FLOAT32, 2, &width, o, &w));
    uint64_t done = 0;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        ZB_ASSERT_OK(zb_array_writer_append(w, d + done * width, pieces[i]));
        done += pieces[i];
        assert_int_equal(zb_array_writer_rows(w), done);
        if (i % 2 == 0) {
            ZB_ASSERT_OK(zb_array_writer_commit(w));
            check_float_rows(s, path, done, width);
        }
    }
    assert_int_equal(done, total);
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    ZB_ASSERT_OK(zb_array_writer_commit(w)); /* a commit with nothing new is harmless */
    check_float_rows(s, path, total, width);
    zb_array_writer_close(w);
    free(d);
    zb_store_close(s);
}

static void
test_streaming_appends(void **state)
{
    (void)state;
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = 4;
    o.codec = "gzip:1";
    stream_case(&o, "plain3");
    o.zarr_format = 2;
    o.num_threads = 3;
    stream_case(&o, "plain2");
    o.zarr_format = 3;
    o.shard_rows = 12;
    o.shard_index_at_start = true;
    stream_case(&o, "sharded");
    o.write_empty_chunks = false;
    o.num_threads = 1;
    stream_case(&o, "sharded_skip");
}

/* Rows appended after the last commit are not part of the array. */
static void
test_uncommitted_rows_are_invisible(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    const uint64_t width = 2;
    float *d = make_rows(30, width, 0);
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = 4;
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "t", ZB_DT_FLOAT32, 2, &width, &o, &w));
    /* before the first commit there is no array at all */
    ZB_ASSERT_OK(zb_array_writer_append(w, d, 9));
    zb_array *a = NULL;
    ZB_ASSERT_ERR(zb_array_open(s, "t", &a), ZB_E_NOTFOUND, "t");
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    ZB_ASSERT_OK(zb_array_writer_append(w, d + 9 * width, 21));
    zb_array_writer_close(w);
    check_float_rows(s, "t", 9, width);
    free(d);
    zb_store_close(s);
}

/* ---- reopening ------------------------------------------------------------------------ */

static void
reopen_case(const zb_array_write_opts *o, const char *path, uint64_t first)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    const uint64_t width = 3, total = 50;
    float *d = make_rows(total, width, 0);
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, path, ZB_DT_FLOAT32, 2, &width, o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, d, first));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);

    char attrs_before[256];
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    snprintf(attrs_before, sizeof attrs_before, "%s", info.attributes_json);
    zb_array_close(a);

    uint64_t at = first;
    for (uint64_t step = 7; at < total; step += 4) {
        uint64_t k = step < total - at ? step : total - at;
        zb_array_write_opts ao = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        ao.num_threads = (int)(step % 3) + 1;
        ZB_ASSERT_OK(zb_array_writer_open_append(s, path, step % 2 ? &ao : NULL, &w));
        assert_int_equal(zb_array_writer_rows(w), at);
        ZB_ASSERT_OK(zb_array_writer_append(w, d + at * width, k));
        at += k;
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        check_float_rows(s, path, at, width);
    }
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_string_equal(info.attributes_json, attrs_before);
    zb_array_close(a);
    free(d);
    zb_store_close(s);
}

static void
test_reopen_append(void **state)
{
    (void)state;
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = 4;
    o.codec = "blosc:zstd:2:bitshuffle";
    o.attributes_json = "{\"a\": 1}";
    reopen_case(&o, "r3", 10);
    reopen_case(&o, "r3b", 0);
    o.zarr_format = 2;
    o.codec = "zlib:1";
    reopen_case(&o, "r2", 13);
    o.zarr_format = 3;
    o.shard_rows = 8;
    o.codec = "zstd:1:checksum";
    reopen_case(&o, "rs", 5);
    o.shard_index_at_start = true;
    reopen_case(&o, "rs_start", 16);
}

/* Appending to an array zbatch did not write: v2 with '/' separators and a big-endian dtype,
 * and a v3 array using the "v2" key encoding. */
static void
test_append_foreign_arrays(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zbt_put_str(s, "b/.zarray",
                "{\"chunks\":[3],\"compressor\":{\"id\":\"zstd\",\"level\":1},\"dtype\":\">i4\","
                "\"fill_value\":7,\"filters\":null,\"order\":\"C\",\"shape\":[4],"
                "\"zarr_format\":2,\"dimension_separator\":\"/\"}");
    zbt_put_str(s, "b/.zattrs", "{\"keep\": true}");
    zb__codec z = {.id = ZB_CODEC_ZSTD, .level = 1};
    uint8_t c0[12] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3};
    uint8_t c1[12] = {0, 0, 0, 4, 0, 0, 0, 7, 0, 0, 0, 7};
    zb__buf enc = {0};
    ZB_ASSERT_OK(zb__codec_encode(&z, NULL, c0, 12, 4, &enc));
    ZB_ASSERT_OK(zb_store_put(s, "b/0", enc.data, enc.len));
    ZB_ASSERT_OK(zb__codec_encode(&z, NULL, c1, 12, 4, &enc));
    ZB_ASSERT_OK(zb_store_put(s, "b/1", enc.data, enc.len));
    zb__buf_free(&enc);

    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open_append(s, "b", NULL, &w));
    int32_t more[3] = {5, -6, 1 << 20};
    ZB_ASSERT_OK(zb_array_writer_append(w, more, 3));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "b", &a));
    int32_t got[7], want[7] = {1, 2, 3, 4, 5, -6, 1 << 20};
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 7, got, sizeof got, NULL));
    assert_memory_equal(got, want, sizeof want);
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_string_equal(info.attributes_json, "{\"keep\":true}");
    zb_array_close(a);
    /* the stored chunk stays big-endian, padded with the fill 7 */
    uint64_t len;
    uint8_t *raw = get_all(s, "b/2", &len);
    uint8_t dec[12];
    ZB_ASSERT_OK(zb__codec_decode(&z, NULL, raw, (size_t)len, dec, 12, 12, NULL, "b/2"));
    static const uint8_t want2[12] = {0, 0x10, 0, 0, 0, 0, 0, 7, 0, 0, 0, 7};
    assert_memory_equal(dec, want2, 12);
    free(raw);
    json_object *doc = load_json(s, "b/.zarray");
    assert_string_equal(json_object_get_string(json_object_object_get(doc, "dimension_separator")),
                        "/");
    json_object_put(doc);

    zbt_put_str(s, "v/zarr.json",
                "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[0,2],\"data_type\":"
                "\"int16\",\"chunk_grid\":{\"name\":\"regular\",\"configuration\":"
                "{\"chunk_shape\":[2,2]}},\"chunk_key_encoding\":{\"name\":\"v2\"},"
                "\"fill_value\":0,\"codecs\":[{\"name\":\"bytes\",\"configuration\":"
                "{\"endian\":\"little\"}}],\"dimension_names\":[\"x\",null],"
                "\"future\":{\"must_understand\":false}}");
    ZB_ASSERT_OK(zb_array_writer_open_append(s, "v", NULL, &w));
    int16_t v[6] = {1, 2, 3, 4, 5, 6};
    ZB_ASSERT_OK(zb_array_writer_append(w, v, 3));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    assert_true(has_key(s, "v/0.0"));
    assert_true(has_key(s, "v/1.0"));
    ZB_ASSERT_OK(zb_array_open(s, "v", &a));
    int16_t vg[6];
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 3, vg, sizeof vg, NULL));
    assert_memory_equal(vg, v, sizeof v);
    zb_array_close(a);
    doc = load_json(s, "v/zarr.json");
    assert_non_null(json_object_object_get(doc, "future"));
    assert_non_null(json_object_object_get(doc, "dimension_names"));
    json_object_put(doc);

    /* chunked along axis 1: not appendable */
    zbt_put_str(s, "c/zarr.json",
                "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[4,6],\"data_type\":"
                "\"int16\",\"chunk_grid\":{\"name\":\"regular\",\"configuration\":"
                "{\"chunk_shape\":[2,3]}},\"chunk_key_encoding\":{\"name\":\"default\"},"
                "\"fill_value\":0,\"codecs\":[{\"name\":\"bytes\",\"configuration\":"
                "{\"endian\":\"little\"}}]}");
    ZB_ASSERT_ERR(zb_array_writer_open_append(s, "c", NULL, &w), ZB_E_UNSUPPORTED, "axis 1");
    assert_null(w);
    ZB_ASSERT_ERR(zb_array_writer_open_append(s, "nothing", NULL, &w), ZB_E_NOTFOUND, "nothing");
    zb_store_close(s);
}

/* ---- strings -------------------------------------------------------------------------- */

static const char *const words[] = {"",
                                    "a",
                                    "zbatch",
                                    "h\xc3\xa9llo",
                                    "\xe6\x97\xa5\xe6\x9c\xac",
                                    "emoji \xf0\x9f\x8e\x89",
                                    "tab\tnl\n",
                                    "0"};
#define NWORDS (sizeof words / sizeof words[0])

static void
make_strings(uint64_t n, uint64_t first, char **data, uint64_t **offsets)
{
    *offsets = calloc(n + 1, sizeof **offsets);
    size_t cap = 64 * n + 1, len = 0;
    *data = malloc(cap);
    for (uint64_t i = 0; i < n; i++) {
        int k = snprintf(*data + len, cap - len, "%s%llu", words[(first + i) % NWORDS],
                         (unsigned long long)(first + i));
        /* every 5th string is empty */
        if ((first + i) % 5 == 0) k = 0;
        len += (size_t)k;
        (*offsets)[i + 1] = len;
    }
}

static void
check_strings(zb_store *s, const char *path, uint64_t n)
{
    char *data;
    uint64_t *off;
    make_strings(n, 0, &data, &off);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_strings got;
    ZB_ASSERT_OK(zb_array_read_strings(a, 0, n, &got, NULL));
    assert_int_equal(got.n, n);
    for (uint64_t i = 0; i <= n; i++) assert_int_equal(got.offsets[i], off[i]);
    assert_memory_equal(got.data, data, off[n] ? off[n] : 1);
    zb_strings_free(&got);
    zb_array_close(a);
    free(data);
    free(off);
}

static void
test_strings(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&s));
        zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        o.zarr_format = fmt;
        o.chunk_rows = 3;
        o.codec = fmt == 2 ? "blosc" : "zstd:1";
        o.num_threads = 2;
        char *data;
        uint64_t *off;
        make_strings(40, 0, &data, &off);
        zb_array_writer *w = NULL;
        ZB_ASSERT_OK(zb_array_writer_open(s, "s", ZB_DT_STRING, 1, NULL, &o, &w));
        int32_t x = 0;
        ZB_ASSERT_ERR(zb_array_writer_append(w, &x, 1), ZB_E_TYPE, "append_strings");
        /* in pieces, with a commit in between */
        ZB_ASSERT_OK(zb_array_writer_append_strings(w, data, off, 5));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        check_strings(s, "s", 5);
        ZB_ASSERT_OK(zb_array_writer_append_strings(w, data, off + 5, 12));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        check_strings(s, "s", 17);

        /* the edge chunk (rows 15, 16) has n_items 3 with "" in the overhang (§1.6) */
        zb_array *a = NULL;
        ZB_ASSERT_OK(zb_array_open(s, "s", &a));
        zb_array_close(a);
        uint64_t len;
        uint8_t *raw = get_all(s, fmt == 2 ? "s/5" : "s/c/5", &len);
        zb__codec c;
        bool has;
        ZB_ASSERT_OK(zb__codec_spec_parse(o.codec, fmt, &c, &has));
        uint8_t dec[256];
        size_t dlen;
        ZB_ASSERT_OK(
            zb__codec_decode(&c, NULL, raw, (size_t)len, dec, sizeof dec, SIZE_MAX, &dlen, "edge"));
        free(raw);
        assert_int_equal(le32(dec), 3);
        size_t l15 = (size_t)(off[16] - off[15]), l16 = (size_t)(off[17] - off[16]);
        assert_int_equal(le32(dec + 4), l15); /* row 15 is a multiple of 5: "" */
        assert_int_equal(l15, 0);
        assert_int_equal(le32(dec + 8), l16);
        assert_memory_equal(dec + 12, data + off[16], l16);
        assert_int_equal(le32(dec + 12 + l16), 0);
        assert_int_equal(dlen, 16 + l16);

        /* reopen and append the rest; then the metadata */
        ZB_ASSERT_OK(zb_array_writer_open_append(s, "s", NULL, &w));
        ZB_ASSERT_OK(zb_array_writer_append_strings(w, data, off + 17, 23));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        check_strings(s, "s", 40);
        json_object *doc = load_json(s, fmt == 2 ? "s/.zarray" : "s/zarr.json");
        if (fmt == 2) {
            assert_string_equal(json_object_get_string(json_object_object_get(doc, "dtype")), "|O");
            assert_string_equal(plain(json_object_object_get(doc, "filters")),
                                "[{\"id\":\"vlen-utf8\"}]");
        } else {
            assert_string_equal(json_object_get_string(json_object_object_get(doc, "data_type")),
                                "string");
            assert_string_equal(plain(json_object_object_get(doc, "codecs")),
                                "[{\"name\":\"vlen-utf8\",\"configuration\":{}},{\"name\":\"zstd\","
                                "\"configuration\":{\"level\":1,\"checksum\":false}}]");
        }
        assert_string_equal(json_object_get_string(json_object_object_get(doc, "fill_value")), "");
        json_object_put(doc);
        free(data);
        free(off);
        zb_store_close(s);
    }
}

static void
test_strings_bad_input(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "s", ZB_DT_STRING, 1, NULL, NULL, &w));
    const char *bad = "ok\xc3\x28";
    uint64_t off[3] = {0, 2, 4};
    ZB_ASSERT_ERR(zb_array_writer_append_strings(w, bad, off, 2), ZB_E_INVALID, "UTF-8");
    const char *sur = "\xed\xa0\x80"; /* a UTF-16 surrogate */
    uint64_t off2[2] = {0, 3};
    ZB_ASSERT_ERR(zb_array_writer_append_strings(w, sur, off2, 1), ZB_E_INVALID, "UTF-8");
    uint64_t back[3] = {0, 2, 1};
    ZB_ASSERT_ERR(zb_array_writer_append_strings(w, "abc", back, 2), ZB_E_INVALID, "offsets");
    /* a refused call appends nothing and the writer stays usable */
    assert_int_equal(zb_array_writer_rows(w), 0);
    ZB_ASSERT_OK(zb_array_writer_append_strings(w, bad, off, 1));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "s", &a));
    zb_strings got;
    ZB_ASSERT_OK(zb_array_read_strings(a, 0, 1, &got, NULL));
    assert_int_equal(got.offsets[1], 2);
    assert_memory_equal(got.data, "ok", 2);
    zb_strings_free(&got);
    zb_array_close(a);
    zb_store_close(s);
}

/* ---- options and errors --------------------------------------------------------------- */

static void
test_bad_options(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array_writer *w = NULL;
    uint64_t rs[2] = {3, 0};
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = 4;
    o.shard_rows = 10;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "shard_rows 10 is not a multiple of chunk_rows 4");
    assert_null(w);
    o.shard_rows = 8;
    o.zarr_format = 2;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "shard_rows");
    o = (zb_array_write_opts)ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = 4;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "zarr_format");
    o.zarr_format = 2;
    o.codec = "zstd:1:checksum";
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "checksum");
    o.codec = NULL;
    o.attributes_json = "[1]";
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "attributes_json");
    o.attributes_json = "{\"a\": ";
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "attributes_json");
    o.attributes_json = NULL;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 3, rs, &o, &w), ZB_E_INVALID,
                  "row_shape[1] is 0");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 2, NULL, &o, &w), ZB_E_INVALID,
                  "row_shape");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_STRING, 2, rs, &o, &w), ZB_E_INVALID, "1-d");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_COUNT_, 1, NULL, &o, &w), ZB_E_INVALID,
                  "dtype");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 0, NULL, &o, &w), ZB_E_INVALID, "ndim");
    o.num_threads = -1;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "num_threads");
    o.num_threads = 1;
    uint8_t two = 2;
    o.fill_value = &two;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_BOOL, 1, NULL, &o, &w), ZB_E_INVALID,
                  "fill_value");
    o.fill_value = NULL;
    o.chunk_rows = (uint64_t)1 << 40;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "chunk_rows");
    o.chunk_rows = (uint64_t)1 << 30;
    o.codec = "blosc";
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "blosc limit");
    o.codec = NULL;
    o.chunk_rows = 0;
    o.zarr_format = 3;
    o.shard_rows = 4;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_STRING, 1, NULL, &o, &w), ZB_E_UNSUPPORTED,
                  "string");
    o.shard_rows = 0;
    o.shard_index_at_start = true;
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, &o, &w), ZB_E_INVALID,
                  "shard_index_at_start");

    /* a path that already holds a node */
    zbt_put_str(s, "grp/.zgroup", "{\"zarr_format\": 2}");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "grp", ZB_DT_INT32, 1, NULL, NULL, &w), ZB_E_INVALID,
                  "already holds");
    ZB_ASSERT_OK(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, NULL, &w));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    ZB_ASSERT_ERR(zb_array_writer_open(s, "a", ZB_DT_INT32, 1, NULL, NULL, &w), ZB_E_INVALID,
                  "already holds");
    ZB_ASSERT_ERR(zb_array_writer_open(s, "../a", ZB_DT_INT32, 1, NULL, NULL, &w), ZB_E_BADKEY,
                  NULL);
    ZB_ASSERT_ERR(zb_array_writer_append(NULL, NULL, 0), ZB_E_INVALID, NULL);
    ZB_ASSERT_ERR(zb_array_writer_commit(NULL), ZB_E_INVALID, NULL);
    assert_int_equal(zb_array_writer_rows(NULL), 0);
    zb_array_writer_close(NULL);
    zb_store_close(s);
}

/* Automatic chunking: about 1 MiB of rows, a divisor of shard_rows when sharded. */
static void
test_auto_chunk_rows(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array_writer *w = NULL;
    uint64_t rs = 64;
    ZB_ASSERT_OK(zb_array_writer_open(s, "a", ZB_DT_FLOAT32, 2, &rs, NULL, &w));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.shard_rows = 3000;
    ZB_ASSERT_OK(zb_array_writer_open(s, "b", ZB_DT_FLOAT32, 2, &rs, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    o.shard_rows = 12000;
    ZB_ASSERT_OK(zb_array_writer_open(s, "c", ZB_DT_FLOAT32, 2, &rs, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    static const struct {
        const char *path;
        uint64_t chunk;
    } want[] = {{"a", 4096}, {"b", 3000}, {"c", 4000}};
    for (size_t i = 0; i < 3; i++) {
        zb_array *a = NULL;
        ZB_ASSERT_OK(zb_array_open(s, want[i].path, &a));
        zb_array_info info;
        ZB_ASSERT_OK(zb_array_get_info(a, &info));
        assert_int_equal(info.chunk_shape[0], want[i].chunk);
        zb_array_close(a);
    }
    zb_store_close(s);
}

/* A store whose put fails for keys containing `fail`, and that records the order of puts. */
typedef struct flaky {
    zb_store *inner;
    const char *fail;
    char order[64][64];
    atomic_int nputs;
} flaky;

static zb_status
fl_get(void *self, const char *key, uint64_t off, uint64_t len, void *dst, uint64_t *nread)
{
    return zb_store_get(((flaky *)self)->inner, key, off, len, dst, nread);
}
static zb_status
fl_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(((flaky *)self)->inner, key, size);
}
static zb_status
fl_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((flaky *)self)->inner, prefix, fn, ctx);
}
static zb_status
fl_put(void *self, const char *key, const void *data, uint64_t len)
{
    flaky *f = self;
    if (f->fail && strstr(key, f->fail))
        return zb__err(ZB_E_IO, "flaky:%s: disk full (injected)", key);
    int i = atomic_fetch_add(&f->nputs, 1);
    if (i < 64) snprintf(f->order[i], sizeof f->order[i], "%s", key);
    return zb_store_put(f->inner, key, data, len);
}
static zb_status
fl_erase(void *self, const char *key)
{
    return zb_store_erase(((flaky *)self)->inner, key);
}
static void
fl_close(void *self)
{
    (void)self;
}
static const zb_store_methods flaky_methods = {
    .scheme = "flaky",
    .get = fl_get,
    .size = fl_size,
    .list = fl_list,
    .put = fl_put,
    .erase = fl_erase,
    .close = fl_close,
};

static void
test_worker_errors_propagate(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 4; threads += 3) {
        flaky f;
        memset(&f, 0, sizeof f);
        ZB_ASSERT_OK(zb_store_open_memory(&f.inner));
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_new(&flaky_methods, &f, &s));
        const uint64_t width = 2;
        float *d = make_rows(40, width, 0);
        zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        o.chunk_rows = 4;
        o.num_threads = threads;

        /* the metadata goes last */
        zb_array_writer *w = NULL;
        ZB_ASSERT_OK(zb_array_writer_open(s, "ok", ZB_DT_FLOAT32, 2, &width, &o, &w));
        ZB_ASSERT_OK(zb_array_writer_append(w, d, 10));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        int n = atomic_load(&f.nputs);
        assert_int_equal(n, 4);
        assert_string_equal(f.order[n - 1], "ok/zarr.json");

        /* a failing chunk put: the worker's message reaches the caller, no metadata */
        f.fail = "c/2/";
        ZB_ASSERT_OK(zb_array_writer_open(s, "bad", ZB_DT_FLOAT32, 2, &width, &o, &w));
        zb_status st = zb_array_writer_append(w, d, 40);
        if (st == ZB_OK) st = zb_array_writer_commit(w);
        assert_int_equal(st, ZB_E_IO);
        assert_true(zbt_mentions("bad/c/2/0: disk full (injected)"));
        /* sticky: the writer refuses to go on */
        ZB_ASSERT_ERR(zb_array_writer_commit(w), ZB_E_IO, "failed earlier");
        ZB_ASSERT_ERR(zb_array_writer_append(w, d, 1), ZB_E_IO, "disk full");
        zb_array_writer_close(w);
        assert_false(has_key(s, "bad/zarr.json"));

        /* a failing metadata put keeps the writer usable and the commit may be retried */
        f.fail = "m/zarr.json";
        ZB_ASSERT_OK(zb_array_writer_open(s, "m", ZB_DT_FLOAT32, 2, &width, &o, &w));
        ZB_ASSERT_OK(zb_array_writer_append(w, d, 6));
        ZB_ASSERT_ERR(zb_array_writer_commit(w), ZB_E_IO, "injected");
        f.fail = NULL;
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        check_float_rows(s, "m", 6, width);

        free(d);
        zb_store_close(s);
        zb_store_close(f.inner);
    }
}

/* Compares every key of a list in two stores. */
static void
assert_same_objects(zb_store *a, zb_store *b, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t la, lb;
        uint8_t *da = get_all(a, keys[i], &la);
        uint8_t *db = get_all(b, keys[i], &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(da, db, (size_t)la);
        free(da);
        free(db);
    }
}

/* The thread count never changes the bytes on disk. */
static void
test_threads_give_identical_bytes(void **state)
{
    (void)state;
    const uint64_t width = 16, n = 1000;
    float *d = make_rows(n, width, 0);
    zb_store *st[2] = {NULL, NULL};
    char dirs[2][1100];
    for (int t = 0; t < 2; t++) {
        snprintf(dirs[t], sizeof dirs[t], "%s", zbt_tempdir(t ? "writer_t4" : "writer_t1"));
        ZB_ASSERT_OK(zb_store_open_file(dirs[t], &st[t]));
        zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
        o.num_threads = t ? 4 : 1;
        o.chunk_rows = 30;
        o.codec = "blosc:zstd:5:shuffle";
        zb_array_writer *w = NULL;
        ZB_ASSERT_OK(zb_array_writer_open(st[t], "p", ZB_DT_FLOAT32, 2, &width, &o, &w));
        for (uint64_t at = 0; at < n; at += 77) {
            uint64_t k = n - at < 77 ? n - at : 77;
            ZB_ASSERT_OK(zb_array_writer_append(w, d + at * width, k));
        }
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
        o.shard_rows = 120;
        o.codec = "gzip:6";
        o.shard_index_at_start = true;
        ZB_ASSERT_OK(zb_array_writer_open(st[t], "s", ZB_DT_FLOAT32, 2, &width, &o, &w));
        ZB_ASSERT_OK(zb_array_writer_append(w, d, n));
        ZB_ASSERT_OK(zb_array_writer_commit(w));
        zb_array_writer_close(w);
    }
    char keys[64][32];
    const char *kp[64];
    size_t nk = 0;
    snprintf(keys[nk++], 32, "p/zarr.json");
    snprintf(keys[nk++], 32, "s/zarr.json");
    for (int c = 0; c < 34; c++) snprintf(keys[nk++], 32, "p/c/%d/0", c);
    for (int c = 0; c < 9; c++) snprintf(keys[nk++], 32, "s/c/%d/0", c);
    for (size_t i = 0; i < nk; i++) kp[i] = keys[i];
    assert_same_objects(st[0], st[1], kp, nk);
    assert_false(has_key(st[0], "p/c/34/0"));
    check_float_rows(st[1], "p", n, width);
    check_float_rows(st[1], "s", n, width);
    zb_store_close(st[0]);
    zb_store_close(st[1]);
    free(d);
}

/* ---- groups --------------------------------------------------------------------------- */

static void
test_write_group(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    ZB_ASSERT_OK(zb__write_group(s, "", 3, "{\"encoding-type\": \"anndata\"}"));
    json_object *doc = load_json(s, "zarr.json");
    assert_string_equal(plain(doc), "{\"zarr_format\":3,\"node_type\":\"group\",\"attributes\":"
                                    "{\"encoding-type\":\"anndata\"}}");
    json_object_put(doc);
    ZB_ASSERT_OK(zb__write_group(s, "/obs/", 2, NULL));
    doc = load_json(s, "obs/.zgroup");
    assert_string_equal(plain(doc), "{\"zarr_format\":2}");
    json_object_put(doc);
    assert_false(has_key(s, "obs/.zattrs"));
    ZB_ASSERT_OK(zb__write_group(s, "var", 2, "{\"x\": Infinity}"));
    assert_true(has_key(s, "var/.zattrs"));
    ZB_ASSERT_OK(zb__write_group(s, "empty3", 3, NULL));
    doc = load_json(s, "empty3/zarr.json");
    assert_string_equal(plain(doc),
                        "{\"zarr_format\":3,\"node_type\":\"group\",\"attributes\":{}}");
    json_object_put(doc);
    ZB_ASSERT_ERR(zb__write_group(s, "g", 1, NULL), ZB_E_INVALID, "zarr_format");
    ZB_ASSERT_ERR(zb__write_group(s, "g", 3, "7"), ZB_E_INVALID, "not a JSON object");
    assert_false(has_key(s, "g/zarr.json"));
    zb_store_close(s);
}

/* ---- pool ----------------------------------------------------------------------------- */

typedef struct pool_job {
    atomic_int *counter;
    zb_ctx *ctx_seen;
    uint64_t value;
} pool_job;

static void
pool_task(void *arg, zb_ctx *ctx)
{
    pool_job *j = arg;
    j->ctx_seen = ctx;
    uint64_t x = j->value;
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ull + 1;
    j->value = x;
    atomic_fetch_add(j->counter, 1);
}

static void
test_pool(void **state)
{
    (void)state;
    static const int threads[] = {0, 1, 4};
    for (size_t t = 0; t < 3; t++) {
        zb__pool *p = NULL;
        ZB_ASSERT_OK(zb__pool_new(threads[t], &p));
        assert_int_equal(zb__pool_threads(p), threads[t] > 1 ? threads[t] : 1);
        atomic_int counter;
        atomic_init(&counter, 0);
        pool_job jobs[100];
        for (int i = 0; i < 100; i++) {
            jobs[i] = (pool_job){&counter, NULL, (uint64_t)i};
            zb__pool_submit(p, pool_task, &jobs[i]);
        }
        zb__pool_wait(p);
        assert_int_equal(atomic_load(&counter), 100);
        /* every task got a context, and no more distinct ones than threads */
        zb_ctx *seen[8];
        int nseen = 0;
        for (int i = 0; i < 100; i++) {
            assert_non_null(jobs[i].ctx_seen);
            bool known = false;
            for (int k = 0; k < nseen; k++) known = known || seen[k] == jobs[i].ctx_seen;
            if (!known) {
                assert_true(nseen < zb__pool_threads(p));
                seen[nseen++] = jobs[i].ctx_seen;
            }
        }
        /* a second round after a wait works the same */
        for (int i = 0; i < 10; i++) zb__pool_submit(p, pool_task, &jobs[i]);
        zb__pool_free(p); /* runs what is queued first */
        assert_int_equal(atomic_load(&counter), 110);
    }
    zb__pool *p = NULL;
    ZB_ASSERT_ERR(zb__pool_new(ZB_POOL_MAX_THREADS + 1, &p), ZB_E_INVALID, "threads");
    assert_null(p);
    zb__pool_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_spec_parse),
        cmocka_unit_test(test_codec_v2_json_minimal_keys),
        cmocka_unit_test(test_codec_v3_json),
        cmocka_unit_test(test_roundtrip_every_codec),
        cmocka_unit_test(test_roundtrip_every_dtype),
        cmocka_unit_test(test_fill_value_json),
        cmocka_unit_test(test_v2_metadata_and_zstd_frames),
        cmocka_unit_test(test_v3_metadata),
        cmocka_unit_test(test_sharded_both_index_locations),
        cmocka_unit_test(test_write_empty_chunks_false),
        cmocka_unit_test(test_streaming_appends),
        cmocka_unit_test(test_uncommitted_rows_are_invisible),
        cmocka_unit_test(test_reopen_append),
        cmocka_unit_test(test_append_foreign_arrays),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_strings_bad_input),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_auto_chunk_rows),
        cmocka_unit_test(test_worker_errors_propagate),
        cmocka_unit_test(test_threads_give_identical_bytes),
        cmocka_unit_test(test_write_group),
        cmocka_unit_test(test_pool),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
