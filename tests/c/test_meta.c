/* Array metadata: v2 .zarray and v3 zarr.json into zb__array_meta (FORMATS.md §1, §3, §4.1;
 * checklist rows 3, 8, 9, 11, 20, 21, 23, 25, 26, 27). Fill values are compared byte for byte
 * against the IEEE / two's complement encodings written out by hand. */
#include <stdio.h>
#include <string.h>

#include "support/testutil.h"
#include "zarr/meta.h"

/* ---- helpers -------------------------------------------------------------------------- */

static zb_status
v2(const char *zarray, zb__array_meta *m)
{
    return zb__meta_parse_v2(zarray, strlen(zarray), NULL, 0, "arr", m);
}

static void
v2_ok(const char *zarray, zb__array_meta *m)
{
    zb_status st = v2(zarray, m);
    if (st != ZB_OK) fail_msg("%s: %s", zb_status_name(st), zb_last_error());
}

static zb_status
v3(const char *json, zb__array_meta *m)
{
    return zb__meta_parse_v3(json, strlen(json), "arr", m);
}

static void
v3_ok(const char *json, zb__array_meta *m)
{
    zb_status st = v3(json, m);
    if (st != ZB_OK) fail_msg("%s: %s", zb_status_name(st), zb_last_error());
}

/* A v2 document with the given dtype, fill_value and extra members. */
static void
zarray_doc(char *buf, size_t cap, const char *dtype, const char *fill, const char *extra)
{
    snprintf(buf, cap,
             "{\"zarr_format\": 2, \"shape\": [5, 6], \"chunks\": [2, 4], \"dtype\": \"%s\", "
             "\"compressor\": null, \"fill_value\": %s, \"filters\": null, \"order\": \"C\"%s}",
             dtype, fill, extra ? extra : "");
}

static zb_status
v2_with(const char *dtype, const char *fill, const char *extra, zb__array_meta *m)
{
    char doc[2048];
    zarray_doc(doc, sizeof doc, dtype, fill, extra);
    return v2(doc, m);
}

/* A v3 array with data_type, fill_value and codecs (JSON text of the list). */
static zb_status
v3_with(const char *dtype, const char *fill, const char *codecs, zb__array_meta *m)
{
    char doc[4096];
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [64, 64], "
             "\"data_type\": \"%s\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": "
             "{\"chunk_shape\": [64, 64]}}, \"chunk_key_encoding\": {\"name\": \"default\"}, "
             "\"fill_value\": %s, \"codecs\": %s}",
             dtype, fill, codecs);
    return v3(doc, m);
}

static void
fill_v2(const char *dtype, const char *fill, const uint8_t *want, size_t n)
{
    zb__array_meta m;
    zb_status st = v2_with(dtype, fill, NULL, &m);
    if (st != ZB_OK) fail_msg("%s %s: %s", dtype, fill, zb_last_error());
    assert_int_equal(m.itemsize, n);
    assert_memory_equal(m.fill, want, n);
    zb__meta_free(&m);
}

static void
fill_v3(const char *dtype, const char *fill, const uint8_t *want, size_t n)
{
    zb__array_meta m;
    const char *codecs = n > 1 ? "[{\"name\": \"bytes\", \"configuration\": {\"endian\": "
                                 "\"little\"}}]"
                               : "[\"bytes\"]";
    zb_status st = v3_with(dtype, fill, codecs, &m);
    if (st != ZB_OK) fail_msg("%s %s: %s", dtype, fill, zb_last_error());
    assert_int_equal(m.itemsize, n);
    assert_memory_equal(m.fill, want, n);
    zb__meta_free(&m);
}

static void
key_of(const zb__array_meta *m, const char *path, const uint64_t *idx, const char *want)
{
    char buf[256];
    assert_int_equal(zb__meta_chunk_key(m, path, idx, buf, sizeof buf), ZB_OK);
    assert_string_equal(buf, want);
}

/* ---- v2 ------------------------------------------------------------------------------- */

static void
test_v2_formats_example(void **state)
{
    (void)state;
    zb__array_meta m;
    v2_ok("{\n    \"chunks\": [2, 4],\n    \"compressor\": {\"blocksize\": 0, \"clevel\": 5, "
          "\"cname\": \"lz4\", \"id\": \"blosc\", \"shuffle\": 1},\n    \"dtype\": \"<f4\",\n"
          "    \"fill_value\": -1.0,\n    \"filters\": null,\n    \"order\": \"C\",\n"
          "    \"shape\": [5, 6],\n    \"zarr_format\": 2\n}",
          &m);
    assert_int_equal(m.zarr_format, 2);
    assert_int_equal(m.ndim, 2);
    assert_true(m.shape[0] == 5 && m.shape[1] == 6);
    assert_true(m.chunks[0] == 2 && m.chunks[1] == 4);
    assert_int_equal(m.dtype, ZB_DT_FLOAT32);
    assert_int_equal(m.itemsize, 4);
    const uint8_t minus_one[4] = {0x00, 0x00, 0x80, 0xbf};
    assert_memory_equal(m.fill, minus_one, 4);
    assert_false(m.fill_null);
    assert_int_equal(m.chain.ab, ZB_AB_BYTES);
    assert_false(m.chain.big_endian);
    assert_false(m.chain.has_transpose);
    assert_int_equal(m.chain.nbb, 1);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_BLOSC);
    assert_string_equal(m.chain.bb[0].cname, "lz4");
    assert_int_equal(m.chain.bb[0].level, 5);
    assert_int_equal(m.chain.bb[0].shuffle, ZB_SHUFFLE_BYTE);
    assert_int_equal(m.chain.bb[0].blocksize, 0);
    assert_int_equal(m.chain.bb[0].typesize, 0);
    assert_string_equal(m.codecs_desc, "blosc(lz4,5,shuffle)");
    assert_string_equal(m.attrs_json, "{}");
    const uint64_t edge[2] = {2, 1};
    key_of(&m, "arr", edge, "arr/2.1");
    key_of(&m, "", edge, "2.1");
    zb__meta_free(&m);
    assert_null(m.attrs_json);
}

static void
test_v2_fill_values(void **state)
{
    (void)state;
    const uint8_t f4_nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    const uint8_t f4_ninf[4] = {0x00, 0x00, 0x80, 0xff};
    const uint8_t f8_inf[8] = {0, 0, 0, 0, 0, 0, 0xf0, 0x7f};
    const uint8_t f8_nan[8] = {0, 0, 0, 0, 0, 0, 0xf8, 0x7f};
    const uint8_t u8_max[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const uint8_t i8_min[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    const uint8_t i2_m5[2] = {0xfb, 0xff};
    const uint8_t one[1] = {1};
    const uint8_t f2_one[2] = {0x00, 0x3c};
    fill_v2("<f4", "\"NaN\"", f4_nan, 4);
    fill_v2("<f4", "NaN", f4_nan, 4); /* bare token (FORMATS.md §5) */
    fill_v2("<f4", "\"-Infinity\"", f4_ninf, 4);
    fill_v2("<f4", "-Infinity", f4_ninf, 4);
    fill_v2("<f8", "\"Infinity\"", f8_inf, 8);
    fill_v2("<f8", "\"NaN\"", f8_nan, 8);
    fill_v2("<u8", "18446744073709551615", u8_max, 8);
    fill_v2("<i8", "-9223372036854775808", i8_min, 8);
    fill_v2("<i2", "-5", i2_m5, 2);
    fill_v2("|b1", "true", one, 1);
    fill_v2("<f2", "1", f2_one, 2);
    /* a big-endian dtype still keeps the fill in native order */
    fill_v2(">i2", "-5", i2_m5, 2);

    zb__array_meta m;
    assert_int_equal(v2_with("<f8", "null", NULL, &m), ZB_OK);
    const uint8_t zeros[16] = {0};
    assert_true(m.fill_null);
    assert_memory_equal(m.fill, zeros, 16);
    zb__meta_free(&m);

    assert_int_equal(v2_with("<u8", "-1", NULL, &m), ZB_E_METADATA);
    assert_int_equal(v2_with("|u1", "256", NULL, &m), ZB_E_METADATA);
    assert_int_equal(v2_with("<i8", "18446744073709551615", NULL, &m), ZB_E_METADATA);
    assert_int_equal(v2_with("<i4", "1.5", NULL, &m), ZB_E_METADATA);
    assert_int_equal(v2_with("<f4", "\"nan\"", NULL, &m), ZB_E_METADATA);
    assert_int_equal(v2_with("|b1", "\"yes\"", NULL, &m), ZB_E_METADATA);
    /* exact integers never go through a double: 2^53+1 as int64 */
    const uint8_t big[8] = {0x01, 0, 0, 0, 0, 0, 0x20, 0};
    fill_v2("<i8", "9007199254740993", big, 8);
    /* the fill of a complex or bytes dtype is never reached: the dtype is unsupported */
    assert_int_equal(v2_with("<c8", "[1.0, \"Infinity\"]", NULL, &m), ZB_E_UNSUPPORTED);
    assert_int_equal(v2_with("|S3", "\"YWI=\"", NULL, &m), ZB_E_UNSUPPORTED);
}

static void
test_v2_invalid_shapes(void **state)
{
    (void)state;
    zb__array_meta m;
    const char *shape_double = "{\"zarr_format\": 2, \"shape\": [10.0], \"chunks\": [5], "
                               "\"dtype\": \"<f4\", \"compressor\": null, \"fill_value\": 0, "
                               "\"filters\": null, \"order\": \"C\"}";
    assert_int_equal(
        zb__meta_parse_v2(shape_double, strlen(shape_double), NULL, 0, "obs/ct/codes", &m),
        ZB_E_METADATA);
    assert_string_equal(zb_last_error(), "obs/ct/codes/.zarray: shape[0] is 10.0, not an integer");
    assert_null(m.attrs_json);
    assert_null(m.codecs_desc);
    assert_int_equal(v2("{\"zarr_format\": 2, \"shape\": [-3], \"chunks\": [5], \"dtype\": "
                        "\"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}",
                        &m),
                     ZB_E_METADATA);
    assert_int_equal(v2("{\"zarr_format\": 2, \"shape\": [3], \"chunks\": [0], \"dtype\": "
                        "\"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}",
                        &m),
                     ZB_E_METADATA);
    assert_int_equal(v2("{\"zarr_format\": 2, \"shape\": [3], \"chunks\": [1, 1], \"dtype\": "
                        "\"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}",
                        &m),
                     ZB_E_METADATA);
    assert_int_equal(v2("{\"zarr_format\": 2, \"shape\": [3], \"chunks\": [1], \"dtype\": "
                        "\"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"} x",
                        &m),
                     ZB_E_JSON);
    assert_int_equal(v2("{\"zarr_format\": 3, \"shape\": [3], \"chunks\": [1], \"dtype\": "
                        "\"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}",
                        &m),
                     ZB_E_METADATA);
    assert_int_equal(v2("[1, 2]", &m), ZB_E_METADATA);
    char doc[1024];
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 2, \"shape\": [4294967296, 4294967296, 16], \"chunks\": [1, 1, "
             "1], \"dtype\": \"|u1\", \"compressor\": null, \"fill_value\": 0, \"order\": "
             "\"C\"}");
    assert_int_equal(v2(doc, &m), ZB_E_OVERFLOW);
    /* 2^62 float64 elements: the count fits, the byte size does not */
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 2, \"shape\": [4611686018427387904], \"chunks\": [1], "
             "\"dtype\": \"<f8\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}");
    assert_int_equal(v2(doc, &m), ZB_E_OVERFLOW);
    /* a chunk larger than memory is an overflow too */
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 2, \"shape\": [1, 1], \"chunks\": [4294967296, 4294967296], "
             "\"dtype\": \"<f4\", \"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}");
    assert_int_equal(v2(doc, &m), ZB_E_OVERFLOW);
    /* more dimensions than ZB_MAX_DIMS */
    char shape[200] = "[", *p = shape + 1;
    for (int i = 0; i < ZB_MAX_DIMS + 1; i++) p += sprintf(p, i ? ",1" : "1");
    strcpy(p, "]");
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 2, \"shape\": %s, \"chunks\": %s, \"dtype\": \"<f4\", "
             "\"compressor\": null, \"fill_value\": 0, \"order\": \"C\"}",
             shape, shape);
    assert_int_equal(v2(doc, &m), ZB_E_UNSUPPORTED);
}

static void
test_v2_order_endian_separator(void **state)
{
    (void)state;
    zb__array_meta m;
    v2_ok("{\"zarr_format\": 2, \"shape\": [2, 3, 4], \"chunks\": [2, 3, 4], \"dtype\": "
          "\">f8\", \"compressor\": null, \"fill_value\": 0, \"order\": \"F\", "
          "\"dimension_separator\": \"/\"}",
          &m);
    assert_true(m.chain.has_transpose);
    assert_int_equal(m.chain.perm[0], 2);
    assert_int_equal(m.chain.perm[1], 1);
    assert_int_equal(m.chain.perm[2], 0);
    assert_true(m.chain.big_endian);
    assert_int_equal(m.dtype, ZB_DT_FLOAT64);
    assert_int_equal(m.sep, '/');
    const uint64_t idx[3] = {1, 0, 12};
    key_of(&m, "a/b", idx, "a/b/1/0/12");
    zb__meta_free(&m);

    assert_int_equal(v2_with(">i4", "0", NULL, &m), ZB_OK);
    assert_true(m.chain.big_endian);
    assert_int_equal(m.dtype, ZB_DT_INT32);
    assert_int_equal(m.sep, '.'); /* absent dimension_separator means "." */
    zb__meta_free(&m);
    assert_int_equal(v2_with("|u1", "0", NULL, &m), ZB_OK);
    assert_false(m.chain.big_endian);
    zb__meta_free(&m);
    assert_int_equal(v2_with("|i1", "-1", ", \"order\": \"F\"", &m), ZB_OK);
    assert_int_equal(m.dtype, ZB_DT_INT8);
    assert_true(m.chain.has_transpose); /* last "order" wins; 2-d */
    zb__meta_free(&m);
    assert_int_equal(v2_with("<f4", "0", ", \"order\": \"K\"", &m), ZB_E_METADATA);
    assert_int_equal(v2_with("<f4", "0", ", \"dimension_separator\": \"-\"", &m), ZB_E_METADATA);
    assert_int_equal(v2_with("|f4", "0", NULL, &m), ZB_E_METADATA);

    /* 1-d "F" is the same as "C" */
    v2_ok("{\"zarr_format\": 2, \"shape\": [7], \"chunks\": [3], \"dtype\": \"<i8\", "
          "\"compressor\": null, \"fill_value\": 0, \"order\": \"F\"}",
          &m);
    assert_false(m.chain.has_transpose);
    zb__meta_free(&m);

    /* 0-d */
    v2_ok("{\"zarr_format\": 2, \"shape\": [], \"chunks\": [], \"dtype\": \"<f8\", "
          "\"compressor\": null, \"fill_value\": 1.5, \"order\": \"C\"}",
          &m);
    assert_int_equal(m.ndim, 0);
    key_of(&m, "uns/x", NULL, "uns/x/0");
    key_of(&m, "", NULL, "0");
    zb__meta_free(&m);
}

static void
test_v2_codecs_and_unknown_keys(void **state)
{
    (void)state;
    zb__array_meta m;
    /* unknown top-level and codec keys are ignored (FORMATS.md §1.1, §2.1) */
    assert_int_equal(v2_with("<f4", "0",
                             ", \"compressor\": {\"id\": \"zstd\", \"level\": 3, \"checksum\": "
                             "true, \"future\": [1]}, \"storage\": \"x\"",
                             &m),
                     ZB_OK);
    assert_int_equal(m.chain.nbb, 1);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_ZSTD);
    assert_int_equal(m.chain.bb[0].level, 3);
    assert_true(m.chain.bb[0].checksum);
    zb__meta_free(&m);
    assert_int_equal(
        v2_with("<f4", "0", ", \"compressor\": {\"id\": \"lz4\", \"acceleration\": 2}", &m), ZB_OK);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_LZ4);
    assert_int_equal(m.chain.bb[0].acceleration, 2);
    zb__meta_free(&m);
    assert_int_equal(v2_with("<f4", "0", ", \"compressor\": {\"id\": \"gzip\", \"level\": 6}", &m),
                     ZB_OK);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_GZIP);
    assert_int_equal(m.chain.bb[0].level, 6);
    zb__meta_free(&m);
    assert_int_equal(v2_with("<f4", "0", ", \"compressor\": {\"id\": \"zlib\", \"level\": 1}", &m),
                     ZB_OK);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_ZLIB);
    zb__meta_free(&m);
    assert_int_equal(v2_with("<f4", "0",
                             ", \"compressor\": {\"id\": \"blosc\", \"cname\": \"zstd\", "
                             "\"clevel\": 9, \"shuffle\": -1}",
                             &m),
                     ZB_OK);
    assert_int_equal(m.chain.bb[0].shuffle, ZB_SHUFFLE_AUTO);
    assert_string_equal(m.chain.bb[0].cname, "zstd");
    zb__meta_free(&m);
    assert_int_equal(v2_with("<f4", "0", NULL, &m), ZB_OK);
    assert_int_equal(m.chain.nbb, 0);
    assert_string_equal(m.codecs_desc, "none");
    zb__meta_free(&m);

    assert_int_equal(v2_with("<f4", "0", ", \"compressor\": {\"id\": \"bz2\", \"level\": 1}", &m),
                     ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "bz2"));
    assert_int_equal(
        v2_with("<f4", "0", ", \"compressor\": {\"id\": \"blosc\", \"shuffle\": 3}", &m),
        ZB_E_METADATA);
    assert_int_equal(v2_with("<f4", "0", ", \"compressor\": {\"level\": 1}", &m), ZB_E_METADATA);
    assert_int_equal(
        v2_with("<f4", "0", ", \"filters\": [{\"id\": \"delta\", \"dtype\": \"<f4\"}]", &m),
        ZB_E_UNSUPPORTED);
    assert_int_equal(v2_with("<M8[ns]", "0", NULL, &m), ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "<M8[ns]"));

    /* anndata 0.8 strings: |O + vlen-utf8, fill 0 ignored */
    assert_int_equal(v2_with("|O", "0",
                             ", \"filters\": [{\"id\": \"vlen-utf8\"}], \"compressor\": {\"id\": "
                             "\"blosc\", \"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": 1, "
                             "\"blocksize\": 0}",
                             &m),
                     ZB_OK);
    assert_int_equal(m.dtype, ZB_DT_STRING);
    assert_int_equal(m.itemsize, 0);
    assert_int_equal(m.chain.ab, ZB_AB_VLEN_UTF8);
    assert_string_equal(m.codecs_desc, "vlen-utf8 | blosc(lz4,5,shuffle)");
    zb__meta_free(&m);
    assert_int_equal(v2_with("|O", "0", NULL, &m), ZB_E_UNSUPPORTED);
    assert_int_equal(v2_with("<f4", "0", ", \"filters\": [{\"id\": \"vlen-utf8\"}]", &m),
                     ZB_E_METADATA);
    char doc[512];
    snprintf(doc, sizeof doc,
             "{\"zarr_format\": 2, \"shape\": [2], \"chunks\": [2], \"dtype\": [[\"a\", \"<f4\"]],"
             " \"compressor\": null, \"fill_value\": null, \"order\": \"C\"}");
    assert_int_equal(v2(doc, &m), ZB_E_UNSUPPORTED);
}

static void
test_v2_attributes(void **state)
{
    (void)state;
    zb__array_meta m;
    char doc[1024];
    zarray_doc(doc, sizeof doc, "<f4", "0", NULL);
    const char *attrs = "{\"m\": NaN, \"units\": \"m/s\", \"l\": [1, 2]}";
    assert_int_equal(zb__meta_parse_v2(doc, strlen(doc), attrs, strlen(attrs), "x", &m), ZB_OK);
    assert_string_equal(m.attrs_json, "{\"m\":NaN,\"units\":\"m/s\",\"l\":[1,2]}");
    zb__meta_free(&m);
    assert_int_equal(zb__meta_parse_v2(doc, strlen(doc), "[1]", 3, "x", &m), ZB_E_METADATA);
    assert_int_equal(zb__meta_parse_v2(doc, strlen(doc), "{\"a\": }", 7, "x", &m), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), "x/.zattrs"));
}

/* ---- v3 ------------------------------------------------------------------------------- */

static const char *const spec_example =
    "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [1024, 1024], \"data_type\": "
    "\"uint16\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": "
    "[256, 256]}}, \"chunk_key_encoding\": {\"name\": \"default\"}, \"fill_value\": 0, "
    "\"codecs\": [{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [64, 64],"
    " \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}, {\"name\":"
    " \"gzip\", \"configuration\": {\"level\": 1}}], \"index_codecs\": [{\"name\": \"bytes\", "
    "\"configuration\": {\"endian\": \"little\"}}, {\"name\": \"crc32c\"}], \"index_location\": "
    "\"end\"}}], \"attributes\": {}}";

static void
test_v3_sharded_spec_example(void **state)
{
    (void)state;
    zb__array_meta m;
    v3_ok(spec_example, &m);
    assert_int_equal(m.zarr_format, 3);
    assert_int_equal(m.dtype, ZB_DT_UINT16);
    assert_true(m.chunks[0] == 256 && m.chunks[1] == 256);
    assert_int_equal(m.chain.ab, ZB_AB_SHARDING);
    assert_non_null(m.chain.shard);
    assert_true(m.chain.shard->inner[0] == 64 && m.chain.shard->inner[1] == 64);
    assert_false(m.chain.shard->index_at_start);
    assert_false(m.chain.shard->index_big_endian);
    assert_true(m.chain.shard->index_crc);
    zb__chain *in = m.chain.shard->inner_chain;
    assert_non_null(in);
    assert_int_equal(in->ab, ZB_AB_BYTES);
    assert_null(in->shard);
    assert_int_equal(in->nbb, 1);
    assert_int_equal(in->bb[0].id, ZB_CODEC_GZIP);
    assert_int_equal(in->bb[0].level, 1);
    assert_int_equal(m.chain.nbb, 0);
    assert_string_equal(m.codecs_desc,
                        "sharding(inner [64,64], index end+crc32c) [bytes(little) | gzip(1)]");
    const uint64_t idx[2] = {3, 0};
    key_of(&m, "X/data", idx, "X/data/c/3/0");
    zb__meta_free(&m);
    assert_null(m.chain.shard);
}

static void
test_v3_tahoe_layout(void **state)
{
    (void)state;
    zb__array_meta m;
    v3_ok("{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [3019898880], "
          "\"data_type\": \"float32\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\":"
          " {\"chunk_shape\": [134217728]}}, \"chunk_key_encoding\": {\"name\": \"default\", "
          "\"configuration\": {\"separator\": \"/\"}}, \"fill_value\": 0.0, \"codecs\": "
          "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32768], "
          "\"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}, "
          "{\"name\": \"blosc\", \"configuration\": {\"cname\": \"lz4\", \"clevel\": 3, "
          "\"shuffle\": \"shuffle\", \"typesize\": 4, \"blocksize\": 0}}], \"index_codecs\": "
          "[{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}, {\"name\": "
          "\"crc32c\"}], \"index_location\": \"end\"}}], \"attributes\": {}}",
          &m);
    assert_true(m.shape[0] == 3019898880u);
    assert_string_equal(m.codecs_desc, "sharding(inner [32768], index end+crc32c) "
                                       "[bytes(little) | blosc(lz4,3,shuffle)]");
    zb__codec *b = &m.chain.shard->inner_chain->bb[0];
    assert_int_equal(b->id, ZB_CODEC_BLOSC);
    assert_int_equal(b->typesize, 4);
    assert_int_equal(b->shuffle, ZB_SHUFFLE_BYTE);
    zb__meta_free(&m);
}

static void
test_v3_chunk_key_encodings(void **state)
{
    (void)state;
    static const struct {
        const char *enc;
        const char *key;
        const char *zero_d;
    } cases[] = {
        {"{\"name\": \"default\"}", "a/c/1/23", "a/c"},
        {"{\"name\": \"default\", \"configuration\": {\"separator\": \".\"}}", "a/c.1.23", "a/c"},
        {"{\"name\": \"v2\"}", "a/1.23", "a/0"},
        {"{\"name\": \"v2\", \"configuration\": {\"separator\": \"/\"}}", "a/1/23", "a/0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char doc[1024];
        zb__array_meta m;
        snprintf(doc, sizeof doc,
                 "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [100, 100], "
                 "\"data_type\": \"int8\", \"chunk_grid\": {\"name\": \"regular\", "
                 "\"configuration\": {\"chunk_shape\": [10, 10]}}, \"chunk_key_encoding\": %s, "
                 "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\"}]}",
                 cases[i].enc);
        v3_ok(doc, &m);
        const uint64_t idx[2] = {1, 23};
        key_of(&m, "a", idx, cases[i].key);
        zb__meta_free(&m);
        snprintf(doc, sizeof doc,
                 "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [], "
                 "\"data_type\": \"int8\", \"chunk_grid\": {\"name\": \"regular\", "
                 "\"configuration\": {\"chunk_shape\": []}}, \"chunk_key_encoding\": %s, "
                 "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\"}]}",
                 cases[i].enc);
        v3_ok(doc, &m);
        key_of(&m, "a", NULL, cases[i].zero_d);
        zb__meta_free(&m);
    }
    char buf[8];
    zb__array_meta m;
    v3_ok(spec_example, &m);
    const uint64_t idx[2] = {3, 0};
    assert_int_equal(zb__meta_chunk_key(&m, "X/data", idx, buf, sizeof buf), ZB_E_INVALID);
    zb__meta_free(&m);
}

static void
test_v3_fill_values(void **state)
{
    (void)state;
    const uint8_t f4_nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    const uint8_t f4_payload[4] = {0x01, 0x00, 0xc0, 0x7f};
    const uint8_t f4_ninf[4] = {0x00, 0x00, 0x80, 0xff};
    const uint8_t f8_nan[8] = {0, 0, 0, 0, 0, 0, 0xf8, 0x7f};
    const uint8_t f8_bits[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0xf2, 0x7f};
    const uint8_t u8_max[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const uint8_t i2_m5[2] = {0xfb, 0xff};
    const uint8_t one[1] = {1};
    fill_v3("float32", "\"0x7fc00000\"", f4_nan, 4);
    fill_v3("float32", "\"0x7FC00001\"", f4_payload, 4); /* the NaN payload survives */
    fill_v3("float32", "\"NaN\"", f4_nan, 4);
    fill_v3("float32", "NaN", f4_nan, 4);
    fill_v3("float32", "\"-Infinity\"", f4_ninf, 4);
    fill_v3("float64", "\"NaN\"", f8_nan, 8);
    fill_v3("float64", "\"0x7ff2030405060708\"", f8_bits, 8);
    fill_v3("uint64", "18446744073709551615", u8_max, 8);
    fill_v3("int16", "-5", i2_m5, 2);
    fill_v3("bool", "true", one, 1);

    /* float16 stores the half bits, rounded to nearest even */
    const uint8_t h_one[2] = {0x00, 0x3c}, h_nan[2] = {0x00, 0x7e}, h_max[2] = {0xff, 0x7b},
                  h_inf[2] = {0x00, 0x7c}, h_m2[2] = {0x00, 0xc0}, h_sub[2] = {0x01, 0x00},
                  h_hex[2] = {0x01, 0x7e}, h_third[2] = {0x55, 0x35};
    fill_v3("float16", "1.0", h_one, 2);
    fill_v3("float16", "\"NaN\"", h_nan, 2);
    fill_v3("float16", "65504", h_max, 2);
    fill_v3("float16", "65520", h_inf, 2); /* the tie above the largest half rounds up */
    fill_v3("float16", "-2", h_m2, 2);
    fill_v3("float16", "5.960464477539063e-08", h_sub, 2); /* 2^-24 */
    fill_v3("float16", "\"0x7e01\"", h_hex, 2);
    fill_v3("float16", "0.3333333333333333", h_third, 2);

    zb__array_meta m;
    assert_int_equal(v3_with("float32", "\"0x7fc0\"",
                             "[{\"name\": \"bytes\", "
                             "\"configuration\": {\"endian\": "
                             "\"little\"}}]",
                             &m),
                     ZB_E_METADATA);
    assert_int_equal(v3_with("int32", "\"0x00000001\"",
                             "[{\"name\": \"bytes\", "
                             "\"configuration\": {\"endian\": "
                             "\"little\"}}]",
                             &m),
                     ZB_E_METADATA);
    assert_int_equal(v3_with("bool", "1", "[\"bytes\"]", &m), ZB_E_METADATA);
    /* r16 [1, 2] and complex data types are reported as unsupported */
    assert_int_equal(v3_with("r16", "[1, 2]", "[\"bytes\"]", &m), ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "r16"));
    assert_int_equal(v3_with("complex64", "[1.0, \"NaN\"]", "[\"bytes\"]", &m), ZB_E_UNSUPPORTED);
    /* fill_value is mandatory in v3 */
    assert_int_equal(v3("{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [4], "
                        "\"data_type\": \"uint8\", \"chunk_grid\": {\"name\": \"regular\", "
                        "\"configuration\": {\"chunk_shape\": [4]}}, \"chunk_key_encoding\": "
                        "{\"name\": \"default\"}, \"codecs\": [\"bytes\"]}",
                        &m),
                     ZB_E_METADATA);
}

static void
test_v3_bytes_endian(void **state)
{
    (void)state;
    zb__array_meta m;
    assert_int_equal(v3_with("float32", "0", "[{\"name\": \"bytes\"}]", &m), ZB_E_METADATA);
    assert_non_null(strstr(zb_last_error(), "endian"));
    assert_int_equal(v3_with("float32", "0", "[{\"name\": \"bytes\", \"configuration\": {}}]", &m),
                     ZB_E_METADATA);
    assert_int_equal(v3_with("float64", "0",
                             "[{\"name\": \"bytes\", \"configuration\": "
                             "{\"endian\": \"big\"}}]",
                             &m),
                     ZB_OK);
    assert_true(m.chain.big_endian);
    assert_string_equal(m.codecs_desc, "bytes(big)");
    zb__meta_free(&m);
    /* legacy alias */
    assert_int_equal(v3_with("int32", "0",
                             "[{\"name\": \"endian\", \"configuration\": "
                             "{\"endian\": \"little\"}}]",
                             &m),
                     ZB_OK);
    assert_false(m.chain.big_endian);
    zb__meta_free(&m);
    assert_int_equal(v3_with("uint8", "0", "[{\"name\": \"bytes\"}]", &m), ZB_OK);
    assert_string_equal(m.codecs_desc, "bytes");
    zb__meta_free(&m);
    assert_int_equal(v3_with("bool", "false", "[{\"name\": \"bytes\"}]", &m), ZB_OK);
    zb__meta_free(&m);
    assert_int_equal(v3_with("int8", "0",
                             "[{\"name\": \"bytes\", \"configuration\": "
                             "{\"endian\": \"big\"}}]",
                             &m),
                     ZB_OK);
    assert_false(m.chain.big_endian); /* one byte: nothing to swap */
    zb__meta_free(&m);
    assert_int_equal(v3_with("int16", "0",
                             "[{\"name\": \"bytes\", \"configuration\": "
                             "{\"endian\": \"middle\"}}]",
                             &m),
                     ZB_E_METADATA);
    assert_int_equal(v3_with("int16", "0", "[]", &m), ZB_E_METADATA);
    assert_int_equal(v3_with("uint8", "0", "[\"bytes\", \"bytes\"]", &m), ZB_E_METADATA);
    assert_int_equal(v3_with("uint8", "0", "[\"crc32c\", \"bytes\"]", &m), ZB_E_METADATA);
}

static void
test_v3_codec_chain(void **state)
{
    (void)state;
    zb__array_meta m;
    /* zarr-python 3's default chain and a bare-string crc32c (rows 26) */
    assert_int_equal(v3_with("float32", "0",
                             "[{\"name\": \"bytes\", \"configuration\": {\"endian\": "
                             "\"little\"}}, {\"name\": \"zstd\", \"configuration\": {\"level\": "
                             "0, \"checksum\": false}}, \"crc32c\"]",
                             &m),
                     ZB_OK);
    assert_int_equal(m.chain.nbb, 2);
    assert_int_equal(m.chain.bb[0].id, ZB_CODEC_ZSTD);
    assert_int_equal(m.chain.bb[0].level, 0);
    assert_false(m.chain.bb[0].checksum);
    assert_int_equal(m.chain.bb[1].id, ZB_CODEC_CRC32C);
    assert_string_equal(m.codecs_desc, "bytes(little) | zstd(0) | crc32c");
    zb__meta_free(&m);

    const char *le = "{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}";
    char codecs[1024];
    static const struct {
        const char *codec;
        zb__codec_id id;
    } nc[] = {
        {"{\"name\": \"numcodecs.lz4\", \"configuration\": {\"acceleration\": 1}}", ZB_CODEC_LZ4},
        {"{\"name\": \"numcodecs.zstd\", \"configuration\": {\"level\": 5}}", ZB_CODEC_ZSTD},
        {"{\"name\": \"numcodecs.zlib\", \"configuration\": {\"level\": 1}}", ZB_CODEC_ZLIB},
        {"{\"name\": \"numcodecs.gzip\", \"configuration\": {\"level\": 1}}", ZB_CODEC_GZIP},
        {"{\"name\": \"numcodecs.blosc\", \"configuration\": {\"cname\": \"lz4\", \"clevel\": 5,"
         " \"shuffle\": 2, \"blocksize\": 0}}",
         ZB_CODEC_BLOSC},
        {"{\"name\": \"gzip\", \"configuration\": {\"level\": 9}}", ZB_CODEC_GZIP},
    };
    for (size_t i = 0; i < sizeof nc / sizeof nc[0]; i++) {
        snprintf(codecs, sizeof codecs, "[%s, %s]", le, nc[i].codec);
        assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_OK);
        assert_int_equal(m.chain.nbb, 1);
        assert_int_equal(m.chain.bb[0].id, nc[i].id);
        zb__meta_free(&m);
    }

    /* blosc shuffle variants; typesize is required unless noshuffle (row 23) */
    static const struct {
        const char *cfg;
        zb_status st;
        int shuffle;
    } bl[] = {
        {"\"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": \"noshuffle\", \"blocksize\": 0", ZB_OK,
         ZB_SHUFFLE_NONE},
        {"\"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": \"shuffle\", \"typesize\": 4", ZB_OK,
         ZB_SHUFFLE_BYTE},
        {"\"cname\": \"zstd\", \"clevel\": 1, \"shuffle\": \"bitshuffle\", \"typesize\": 4", ZB_OK,
         ZB_SHUFFLE_BIT},
        {"\"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": \"shuffle\"", ZB_E_METADATA, 0},
        {"\"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": \"bitshuffle\"", ZB_E_METADATA, 0},
        {"\"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": \"byte\", \"typesize\": 4", ZB_E_METADATA,
         0},
        {"\"cname\": \"lz5\", \"clevel\": 5, \"shuffle\": \"noshuffle\"", ZB_E_METADATA, 0},
        {"\"cname\": \"lz4\", \"clevel\": 10, \"shuffle\": \"noshuffle\"", ZB_E_METADATA, 0},
    };
    for (size_t i = 0; i < sizeof bl / sizeof bl[0]; i++) {
        snprintf(codecs, sizeof codecs, "[%s, {\"name\": \"blosc\", \"configuration\": {%s}}]", le,
                 bl[i].cfg);
        zb_status st = v3_with("float32", "0", codecs, &m);
        if (st != bl[i].st) fail_msg("case %zu: %s: %s", i, zb_status_name(st), zb_last_error());
        if (st == ZB_OK) {
            assert_int_equal(m.chain.bb[0].shuffle, bl[i].shuffle);
            zb__meta_free(&m);
        }
    }

    /* unknown codecs name themselves (row 25) */
    snprintf(codecs, sizeof codecs, "[%s, {\"name\": \"lzma\"}]", le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "\"lzma\""));
    assert_int_equal(v3_with("float32", "0", "[{\"name\": \"fancy_serializer\"}]", &m),
                     ZB_E_UNSUPPORTED);
    snprintf(codecs, sizeof codecs, "[%s, {\"name\": \"numcodecs.bz2\"}]", le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_UNSUPPORTED);
    assert_int_equal(v3_with("float32", "0", "[42]", &m), ZB_E_METADATA);
    assert_int_equal(v3_with("float32", "0", "{\"name\": \"bytes\"}", &m), ZB_E_METADATA);
}

static void
test_v3_transpose(void **state)
{
    (void)state;
    zb__array_meta m;
    const char *le = "{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}";
    char codecs[512];
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"transpose\", \"configuration\": {\"order\": [1, 0]}}, %s]", le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_OK);
    assert_true(m.chain.has_transpose);
    assert_int_equal(m.chain.perm[0], 1);
    assert_int_equal(m.chain.perm[1], 0);
    assert_string_equal(m.codecs_desc, "transpose(1,0) | bytes(little)");
    zb__meta_free(&m);
    /* two transposes [1,0] cancel */
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"transpose\", \"configuration\": {\"order\": [1, 0]}}, "
             "{\"name\": \"transpose\", \"configuration\": {\"order\": [1, 0]}}, %s]",
             le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_OK);
    assert_false(m.chain.has_transpose);
    zb__meta_free(&m);
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"transpose\", \"configuration\": {\"order\": [0, 0]}}, %s]", le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);
    snprintf(codecs, sizeof codecs,
             "[%s, {\"name\": \"transpose\", \"configuration\": {\"order\": [1, 0]}}]", le);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);

    /* three dimensions: t1 = [1,2,0] twice composes to perm[i] = t1[t1[i]] = [2,0,1] */
    v3_ok("{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [2, 3, 4], \"data_type\": "
          "\"int32\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": "
          "{\"chunk_shape\": [2, 3, 4]}}, \"chunk_key_encoding\": {\"name\": \"default\"}, "
          "\"fill_value\": 0, \"codecs\": [{\"name\": \"transpose\", \"configuration\": "
          "{\"order\": [1, 2, 0]}}, {\"name\": \"transpose\", \"configuration\": {\"order\": "
          "[1, 2, 0]}}, {\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}]}",
          &m);
    assert_true(m.chain.has_transpose);
    assert_int_equal(m.chain.perm[0], 2);
    assert_int_equal(m.chain.perm[1], 0);
    assert_int_equal(m.chain.perm[2], 1);
    zb__meta_free(&m);
}

static void
test_v3_sharding_errors(void **state)
{
    (void)state;
    zb__array_meta m;
    char codecs[2048];
    const char *inner = "[{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}]";
    /* 64 is not a multiple of 48 */
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [48, 32], "
             "\"codecs\": %s}}]",
             inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);
    assert_non_null(strstr(zb_last_error(), "does not divide"));
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32], "
             "\"codecs\": %s}}]",
             inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);
    /* nested sharding */
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32, 32], "
             "\"codecs\": [{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": "
             "[16, 16], \"codecs\": %s}}]}}]",
             inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_UNSUPPORTED);
    /* index codecs other than bytes [+ crc32c] */
    snprintf(
        codecs, sizeof codecs,
        "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32, 32], "
        "\"codecs\": %s, \"index_codecs\": [{\"name\": \"bytes\", \"configuration\": "
        "{\"endian\": \"little\"}}, {\"name\": \"gzip\", \"configuration\": {\"level\": 1}}]}}]",
        inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_UNSUPPORTED);
    /* a big-endian index at the start, no crc */
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32, 16], "
             "\"codecs\": %s, \"index_codecs\": [{\"name\": \"bytes\", \"configuration\": "
             "{\"endian\": \"big\"}}], \"index_location\": \"start\"}}]",
             inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_OK);
    assert_true(m.chain.shard->index_at_start);
    assert_true(m.chain.shard->index_big_endian);
    assert_false(m.chain.shard->index_crc);
    assert_string_equal(m.codecs_desc, "sharding(inner [32,16], index start,big) [bytes(little)]");
    zb__meta_free(&m);
    /* inner chain errors propagate: missing endian on float32 */
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32, 32], "
             "\"codecs\": [\"bytes\"]}}]");
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);
    snprintf(codecs, sizeof codecs,
             "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [32, 32], "
             "\"codecs\": %s, \"index_location\": \"middle\"}}]",
             inner);
    assert_int_equal(v3_with("float32", "0", codecs, &m), ZB_E_METADATA);
}

static const char *const v3_head =
    "\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [8], \"data_type\": \"uint8\", "
    "\"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": [4]}}, "
    "\"chunk_key_encoding\": {\"name\": \"default\"}, \"fill_value\": 0, \"codecs\": "
    "[\"bytes\"]";

static zb_status
v3_extra(const char *extra, zb__array_meta *m)
{
    char doc[2048];
    snprintf(doc, sizeof doc, "{%s%s}", v3_head, extra);
    return v3(doc, m);
}

static void
test_v3_top_level_keys(void **state)
{
    (void)state;
    zb__array_meta m;
    assert_int_equal(v3_extra("", &m), ZB_OK);
    assert_string_equal(m.attrs_json, "{}");
    zb__meta_free(&m);
    assert_int_equal(v3_extra(", \"attributes\": {\"encoding-type\": \"array\", \"x\": Infinity},"
                              " \"dimension_names\": [\"obs\"], \"storage_transformers\": []",
                              &m),
                     ZB_OK);
    assert_string_equal(m.attrs_json, "{\"encoding-type\":\"array\",\"x\":Infinity}");
    zb__meta_free(&m);
    assert_int_equal(v3_extra(", \"future\": {\"must_understand\": false, \"x\": 1}", &m), ZB_OK);
    zb__meta_free(&m);
    assert_int_equal(v3_extra(", \"future\": {\"x\": 1}", &m), ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "future"));
    assert_int_equal(v3_extra(", \"future\": {\"must_understand\": true}", &m), ZB_E_UNSUPPORTED);
    assert_int_equal(v3_extra(", \"future\": 1", &m), ZB_E_UNSUPPORTED);
    assert_int_equal(v3_extra(", \"storage_transformers\": [{\"name\": \"x\"}]", &m),
                     ZB_E_UNSUPPORTED);
    assert_int_equal(v3_extra(", \"attributes\": []", &m), ZB_E_METADATA);
    assert_int_equal(v3_extra(", \"dimension_names\": [\"a\", \"b\"]", &m), ZB_E_METADATA);

    assert_int_equal(v3("{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [8], "
                        "\"data_type\": \"uint8\", \"chunk_grid\": {\"name\": \"rectilinear\", "
                        "\"configuration\": {\"chunk_shapes\": [[4, 4]]}}, "
                        "\"chunk_key_encoding\": {\"name\": \"default\"}, \"fill_value\": 0, "
                        "\"codecs\": [\"bytes\"]}",
                        &m),
                     ZB_E_UNSUPPORTED);
    assert_non_null(strstr(zb_last_error(), "rectilinear"));
    assert_int_equal(v3("{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": {}}", &m),
                     ZB_E_METADATA);
    assert_non_null(strstr(zb_last_error(), "is a group"));
    assert_int_equal(v3("{\"zarr_format\": 2, \"node_type\": \"array\"}", &m), ZB_E_METADATA);
    assert_int_equal(v3_extra(", \"shape\": [8.0]", &m), ZB_E_METADATA);
    assert_int_equal(v3_extra(", \"chunk_key_encoding\": {\"name\": \"fancy\"}", &m),
                     ZB_E_UNSUPPORTED);
    assert_int_equal(v3_extra(", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": "
                              "{\"chunk_shape\": [0]}}",
                              &m),
                     ZB_E_METADATA);
    assert_int_equal(v3_extra(", \"shape\": [4294967296, 4294967296, 16], \"chunk_grid\": "
                              "{\"name\": \"regular\", \"configuration\": {\"chunk_shape\": [1, "
                              "1, 1]}}",
                              &m),
                     ZB_E_OVERFLOW);
    assert_int_equal(v3_extra(", \"data_type\": {\"name\": \"numpy.datetime64\"}", &m),
                     ZB_E_UNSUPPORTED);
}

static void
test_v3_strings(void **state)
{
    (void)state;
    zb__array_meta m;
    assert_int_equal(v3_with("string", "\"\"",
                             "[{\"name\": \"vlen-utf8\"}, {\"name\": \"zstd\", "
                             "\"configuration\": {\"level\": 0}}]",
                             &m),
                     ZB_OK);
    assert_int_equal(m.dtype, ZB_DT_STRING);
    assert_int_equal(m.itemsize, 0);
    assert_int_equal(m.chain.ab, ZB_AB_VLEN_UTF8);
    assert_string_equal(m.codecs_desc, "vlen-utf8 | zstd(0)");
    zb__meta_free(&m);
    assert_int_equal(v3_with("string", "\"\"", "[\"bytes\"]", &m), ZB_E_METADATA);
    assert_int_equal(v3_with("int32", "0", "[\"vlen-utf8\"]", &m), ZB_E_METADATA);
}

static void
test_dtype_tables(void **state)
{
    (void)state;
    assert_int_equal(zb_dtype_size(ZB_DT_FLOAT64), 8);
    assert_int_equal(zb_dtype_size(ZB_DT_FLOAT16), 2);
    assert_int_equal(zb_dtype_size(ZB_DT_BOOL), 1);
    assert_int_equal(zb_dtype_size(ZB_DT_STRING), 0);
    assert_string_equal(zb_dtype_name(ZB_DT_UINT16), "uint16");
    assert_string_equal(zb_dtype_name(ZB_DT_STRING), "string");
    assert_string_equal(zb_dtype_typestr(ZB_DT_FLOAT32), "<f4");
    assert_string_equal(zb_dtype_typestr(ZB_DT_BOOL), "|b1");
    assert_string_equal(zb_dtype_typestr(ZB_DT_INT8), "|i1");
    assert_string_equal(zb_dtype_typestr(ZB_DT_STRING), "|O");
    assert_string_equal(zb_dtype_name(ZB_DT_COUNT_), "unknown");
    for (int i = 0; i < ZB_DT_COUNT_; i++) {
        zb_dtype d;
        assert_int_equal(zb__dtype_parse_v3(zb_dtype_name((zb_dtype)i), "t", &d), ZB_OK);
        assert_int_equal(d, i);
        bool big;
        assert_int_equal(zb__dtype_parse_v2(zb_dtype_typestr((zb_dtype)i), "t", &d, &big), ZB_OK);
        assert_int_equal(d, i);
        assert_false(big);
    }
    assert_true(zb__half_to_double(0x3c00) == 1.0);
    assert_true(zb__half_to_double(0xc000) == -2.0);
    assert_true(zb__half_to_double(0x0001) == 0x1p-24);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v2_formats_example),
        cmocka_unit_test(test_v2_fill_values),
        cmocka_unit_test(test_v2_invalid_shapes),
        cmocka_unit_test(test_v2_order_endian_separator),
        cmocka_unit_test(test_v2_codecs_and_unknown_keys),
        cmocka_unit_test(test_v2_attributes),
        cmocka_unit_test(test_v3_sharded_spec_example),
        cmocka_unit_test(test_v3_tahoe_layout),
        cmocka_unit_test(test_v3_chunk_key_encodings),
        cmocka_unit_test(test_v3_fill_values),
        cmocka_unit_test(test_v3_bytes_endian),
        cmocka_unit_test(test_v3_codec_chain),
        cmocka_unit_test(test_v3_transpose),
        cmocka_unit_test(test_v3_sharding_errors),
        cmocka_unit_test(test_v3_top_level_keys),
        cmocka_unit_test(test_v3_strings),
        cmocka_unit_test(test_dtype_tables),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
