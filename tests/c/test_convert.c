/* The converter's building blocks against independent oracles: numpy's type promotion
 * (np.result_type, table generated with numpy 2.3 and pasted here), numpy's str() of category
 * values, the CRC-64/XZ check value, the string map, and the digest a dataset's files get
 * while written against the same digest read back from disk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "support/testutil.h"
#include "util/strmap.h"

static const char *const dtype_names[12] = {"bool",   "int8",    "int16",   "int32",
                                            "int64",  "uint8",   "uint16",  "uint32",
                                            "uint64", "float16", "float32", "float64"};

/* np.result_type(np.dtype(a), np.dtype(b)).name for a, b over dtype_names */
static const char *const promoted[12][12] = {
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
     "float32", "float64"},
    {"int8", "int8", "int16", "int32", "int64", "int16", "int32", "int64", "float64", "float16",
     "float32", "float64"},
    {"int16", "int16", "int16", "int32", "int64", "int16", "int32", "int64", "float64", "float32",
     "float32", "float64"},
    {"int32", "int32", "int32", "int32", "int64", "int32", "int32", "int64", "float64", "float64",
     "float64", "float64"},
    {"int64", "int64", "int64", "int64", "int64", "int64", "int64", "int64", "float64", "float64",
     "float64", "float64"},
    {"uint8", "int16", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
     "float32", "float64"},
    {"uint16", "int32", "int32", "int32", "int64", "uint16", "uint16", "uint32", "uint64",
     "float32", "float32", "float64"},
    {"uint32", "int64", "int64", "int64", "int64", "uint32", "uint32", "uint32", "uint64",
     "float64", "float64", "float64"},
    {"uint64", "float64", "float64", "float64", "float64", "uint64", "uint64", "uint64", "uint64",
     "float64", "float64", "float64"},
    {"float16", "float16", "float32", "float64", "float64", "float16", "float32", "float64",
     "float64", "float16", "float32", "float64"},
    {"float32", "float32", "float32", "float64", "float64", "float32", "float32", "float64",
     "float64", "float32", "float32", "float64"},
    {"float64", "float64", "float64", "float64", "float64", "float64", "float64", "float64",
     "float64", "float64", "float64", "float64"},
};

static zb_dtype
dtype_named(const char *name)
{
    for (int t = 0; t < ZB_DT_COUNT_; t++)
        if (!strcmp(zb_dtype_name((zb_dtype)t), name)) return (zb_dtype)t;
    fail_msg("no dtype %s", name);
    return ZB_DT_COUNT_;
}

static void
test_promotion_is_numpys(void **state)
{
    (void)state;
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 12; j++) {
            zb_dtype got = cv_promote(dtype_named(dtype_names[i]), dtype_named(dtype_names[j]));
            if (strcmp(zb_dtype_name(got), promoted[i][j]))
                fail_msg("%s + %s: %s, numpy says %s", dtype_names[i], dtype_names[j],
                         zb_dtype_name(got), promoted[i][j]);
        }
    assert_int_equal(cv_promote(ZB_DT_STRING, ZB_DT_INT32), ZB_DT_COUNT_);
}

static void
test_conversions(void **state)
{
    (void)state;
    int32_t i32[4] = {-7, 0, 2147483647, 12};
    double f64[4];
    cv_convert_values(f64, ZB_DT_FLOAT64, i32, ZB_DT_INT32, 4);
    assert_true(f64[0] == -7.0 && f64[2] == 2147483647.0 && f64[3] == 12.0);
    uint8_t b[3] = {0, 1, 1};
    int64_t i64[3];
    cv_convert_values(i64, ZB_DT_INT64, b, ZB_DT_BOOL, 3);
    assert_true(i64[0] == 0 && i64[1] == 1 && i64[2] == 1);
    /* float16 both ways: 1.5 is 0x3e00, 65504 the largest half */
    double d[2] = {1.5, 65504.0};
    uint16_t h[2];
    cv_convert_values(h, ZB_DT_FLOAT16, d, ZB_DT_FLOAT64, 2);
    assert_int_equal(h[0], 0x3e00);
    assert_int_equal(h[1], 0x7bff);
    float f[2];
    cv_convert_values(f, ZB_DT_FLOAT32, h, ZB_DT_FLOAT16, 2);
    assert_true(f[0] == 1.5f && f[1] == 65504.0f);
    uint16_t u16[2] = {65535, 3};
    int32_t out[2];
    cv_convert_values(out, ZB_DT_INT32, u16, ZB_DT_UINT16, 2);
    assert_true(out[0] == 65535 && out[1] == 3);
}

static void
test_category_text_matches_numpy_str(void **state)
{
    (void)state;
    /* str(np.float64(v)) / str(np.float32(v)) / str(np.int64(v)) / str(np.bool_(v)) */
    struct {
        zb_dtype t;
        double v;
        const char *want;
    } cases[] = {
        {ZB_DT_FLOAT64, 0.5, "0.5"},
        {ZB_DT_FLOAT64, 100.0, "100.0"},
        {ZB_DT_FLOAT64, 1e-05, "1e-05"},
        {ZB_DT_FLOAT64, 1e16, "1e+16"},
        {ZB_DT_FLOAT32, 0.1, "0.1"},
        {ZB_DT_FLOAT64, 123456789.0, "123456789.0"},
        {ZB_DT_FLOAT32, 1.5e-7, "1.5e-07"},
        {ZB_DT_FLOAT32, 3.0, "3.0"},
        {ZB_DT_FLOAT64, -2.5e300, "-2.5e+300"},
        {ZB_DT_FLOAT64, NAN, "nan"},
        {ZB_DT_FLOAT64, -INFINITY, "-inf"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char v[8];
        cv_convert_values(v, cases[i].t, &cases[i].v, ZB_DT_FLOAT64, 1);
        zb__src_category_text(cases[i].t, v, buf, sizeof buf);
        if (strcmp(buf, cases[i].want))
            fail_msg("%g: '%s', numpy '%s'", cases[i].v, buf, cases[i].want);
    }
    int64_t big = -9223372036854775807LL - 1;
    zb__src_category_text(ZB_DT_INT64, &big, buf, sizeof buf);
    assert_string_equal(buf, "-9223372036854775808");
    uint8_t t = 1;
    zb__src_category_text(ZB_DT_BOOL, &t, buf, sizeof buf);
    assert_string_equal(buf, "True");
}

static void
test_crc64_is_xz(void **state)
{
    (void)state;
    /* the CRC-64/XZ check value */
    assert_true(cv_crc64(0, "123456789", 9) == 0x995DC9BBDF1939FAull);
    assert_true(cv_crc64(cv_crc64(0, "1234", 4), "56789", 5) == 0x995DC9BBDF1939FAull);
}

static void
test_strmap(void **state)
{
    (void)state;
    cv_strbuf b = {0};
    const char *names[] = {"TP53", "GAPDH", "", "ACTB", "GAPDH"};
    for (size_t i = 0; i < 5; i++) ZB_ASSERT_OK(cv_strbuf_push(&b, names[i], strlen(names[i])));
    zb__strmap m;
    uint64_t dup;
    ZB_ASSERT_OK(zb__strmap_build(&m, &b.s, &dup));
    assert_int_equal(dup, 4);
    assert_int_equal(zb__strmap_find(&m, "ACTB", 4), 3);
    assert_int_equal(zb__strmap_find(&m, "GAPDH", 5), 1);
    assert_int_equal(zb__strmap_find(&m, "", 0), 2);
    assert_int_equal(zb__strmap_find(&m, "ACT", 3), -1);
    zb__strmap_free(&m);
    zb_strings_free(&b.s);
}

/* Objects put through the digest store, renamed and erased: the digest equals the fingerprint
 * of the files on disk (walk order: "X" before "X.bak" though '.' sorts before '/'), and the
 * fingerprint read back through the store (cv_output_fingerprint), on disk and in a store
 * without directories (memory, as S3). */
static void
digest_some(zb_store *inner, uint64_t *files, uint64_t *bytes, uint64_t *crc)
{
    cv_digest *dg;
    zb_store *s;
    ZB_ASSERT_OK(cv_digest_open(inner, "ds", &dg, &s));
    ZB_ASSERT_OK(zb_store_put(s, "ds/X/data/c/0", "abc", 3));
    ZB_ASSERT_OK(zb_store_put(s, "ds/X.bak", "zz", 2));
    ZB_ASSERT_OK(zb_store_put(s, "ds/tmp1", "hello", 5));
    ZB_ASSERT_OK(zb_store_rename(s, "ds/tmp1", "ds/zarr.json"));
    ZB_ASSERT_OK(zb_store_put(s, "ds/gone", "x", 1));
    ZB_ASSERT_OK(zb_store_erase(s, "ds/gone"));
    ZB_ASSERT_OK(zb_store_put(s, "other/file", "not counted", 11));
    /* an empty object, and one of exactly the read-back block (4 MiB): both end on a short read */
    ZB_ASSERT_OK(zb_store_put(s, "ds/X/empty", "", 0));
    size_t big = (size_t)4 << 20;
    char *block = malloc(big);
    assert_non_null(block);
    for (size_t i = 0; i < big; i++) block[i] = (char)(i * 7 + 3);
    ZB_ASSERT_OK(zb_store_put(s, "ds/X/block", block, big));
    free(block);
    ZB_ASSERT_OK(cv_digest_result(dg, files, bytes, crc));
    zb_store_close(s);
    cv_digest_free(dg);
}

static void
test_digest_equals_fingerprint(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("digest");
    zb_store *inner;
    ZB_ASSERT_OK(zb_store_open_file(dir, &inner));
    uint64_t files, bytes, crc, size, fcrc, ssize, scrc;
    int64_t mtime;
    digest_some(inner, &files, &bytes, &crc);
    char path[4200];
    snprintf(path, sizeof path, "%s/ds", dir);
    ZB_ASSERT_OK(cv_fingerprint(path, &size, &mtime, &fcrc));
    uint64_t want = 10 + ((uint64_t)4 << 20);
    assert_int_equal(files, 5);
    assert_int_equal(bytes, want);
    assert_int_equal(size, want);
    assert_true(crc == fcrc);
    zb_convert cv;
    memset(&cv, 0, sizeof cv);
    cv.out = inner;
    cv.output = (char *)dir;
    ZB_ASSERT_OK(cv_output_fingerprint(&cv, "ds", &ssize, &scrc));
    assert_int_equal(ssize, want);
    assert_true(scrc == crc);
    zb_store_close(inner);

    ZB_ASSERT_OK(zb_store_open_memory(&inner));
    uint64_t mfiles, mbytes, mcrc;
    digest_some(inner, &mfiles, &mbytes, &mcrc);
    assert_true(mcrc == crc && mfiles == 5 && mbytes == want);
    cv.out = inner;
    ZB_ASSERT_OK(cv_output_fingerprint(&cv, "ds", &ssize, &scrc));
    assert_true(scrc == crc && ssize == want);
    /* a changed object changes the fingerprint */
    ZB_ASSERT_OK(zb_store_put(inner, "ds/X.bak", "zy", 2));
    ZB_ASSERT_OK(cv_output_fingerprint(&cv, "ds", &ssize, &scrc));
    assert_true(scrc != crc && ssize == want);
    assert_int_equal(cv_output_fingerprint(&cv, "nothing", &ssize, &scrc), ZB_E_NOTFOUND);
    zb_store_close(inner);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_promotion_is_numpys),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_category_text_matches_numpy_str),
        cmocka_unit_test(test_crc64_is_xz),
        cmocka_unit_test(test_strmap),
        cmocka_unit_test(test_digest_equals_fingerprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
