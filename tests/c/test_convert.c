/* The converter's building blocks against independent oracles: numpy's type promotion
 * (np.result_type, table generated with numpy 2.3 and pasted here), numpy's str() of category
 * values, the CRC-64/XZ check value, the string map, and the digest a dataset's files get
 * while written against the same digest read back from disk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "support/testutil.h"
#include "util/buf.h"
#include "util/status.h"
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

/* The stored-type rule for one value, written independently of dtypes.c: an integer in
 * [0, 65535] fits (-0.0 included), anything else (NaN, negative, fractional, larger) is wide. */
static void
oracle_add(cv_value_stats *s, double v)
{
    bool fits = v >= 0 && v <= 65535 && floor(v) == v;
    s->flags |= CV_VALUES_ANY | (fits ? 0 : CV_VALUES_WIDE);
    if (fits && (uint64_t)v > s->max) s->max = (uint64_t)v;
}

static void
test_value_stats_against_the_rule(void **state)
{
    (void)state;
    const double specials[] = {NAN, -1.0, 2.5, 65535.0, 65536.0, -0.0, 1e9, 255.0, 256.0, 0.5};
    uint64_t seed = 12345;
    /* lengths around the fold's 64-value blocks; one special value (or none) per run */
    const uint64_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 1000, 4099};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        for (int sp = -1; sp < (int)(sizeof specials / sizeof *specials); sp++) {
            uint64_t n = lengths[li];
            float *f = malloc((n + 1) * sizeof *f);
            double *d = malloc((n + 1) * sizeof *d);
            int32_t *i32 = malloc((n + 1) * sizeof *i32);
            for (uint64_t i = 0; i < n; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                d[i] = (double)((seed >> 33) % 200);
            }
            if (sp >= 0 && n) d[(seed >> 20) % n] = specials[sp];
            cv_value_stats want = {0, 0}, got_f = {0, 0}, got_d = {0, 0}, got_i = {0, 0};
            for (uint64_t i = 0; i < n; i++) {
                f[i] = (float)d[i];
                oracle_add(&want, d[i]);
            }
            cv_stats_add(&got_f, f, ZB_DT_FLOAT32, n);
            cv_stats_add(&got_d, d, ZB_DT_FLOAT64, n);
            assert_int_equal(got_f.flags, want.flags);
            assert_int_equal(got_d.flags, want.flags);
            if (!(want.flags & CV_VALUES_WIDE)) {
                assert_int_equal(got_f.max, want.max);
                assert_int_equal(got_d.max, want.max);
            }
            bool integral = true;
            for (uint64_t i = 0; i < n; i++) {
                integral &= floor(d[i]) == d[i] && fabs(d[i]) < 2e9;
                i32[i] = integral ? (int32_t)d[i] : 0;
            }
            if (integral) { /* the integer fold, on the same values */
                cv_stats_add(&got_i, i32, ZB_DT_INT32, n);
                assert_int_equal(got_i.flags, want.flags);
                if (!(want.flags & CV_VALUES_WIDE)) assert_int_equal(got_i.max, want.max);
            }
            free(f);
            free(d);
            free(i32);
        }
    }
}

/* cv_file_crc with value extents: the CRC of the whole file (whatever the extents), and each
 * extent's values folded as cv_stats_add folds them from memory; an extent past the end of the
 * file is ZB_E_TRUNCATED. Extents sit at odd places: across the 256 KiB read size, adjacent to
 * each other, at the last bytes. */
static void
test_file_crc_folds_extents(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("filecrc");
    char path[4200];
    snprintf(path, sizeof path, "%s/input.bin", dir);
    size_t size = (1u << 20) + 12;
    unsigned char *bytes = malloc(size);
    uint64_t seed = 7;
    for (size_t i = 0; i < size; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        bytes[i] = (unsigned char)(seed >> 56);
    }
    /* float32 counts in [0, 300) at the extents, one 2.5 in the second matrix's */
    struct {
        uint64_t at, len;
        int mat;
    } ext[] = {{1000, 4000, 0},
               {(256u << 10) - 400, 4000, 1},
               {(256u << 10) + 3600, 800, 1},
               {size - 4092, 4092, 0}};
    for (size_t e = 0; e < 4; e++)
        for (uint64_t b = 0; b < ext[e].len; b += 4) {
            float v = (float)((ext[e].at + b) % 300);
            if (e == 2 && b == 400) v = 2.5f;
            memcpy(bytes + ext[e].at + b, &v, 4);
        }
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(bytes, 1, size, fp), size);
    fclose(fp);
    cv_value_stats got[2] = {{0, 0}, {0, 0}}, want[2] = {{0, 0}, {0, 0}};
    cv_fold folds[4];
    for (size_t e = 0; e < 4; e++) {
        folds[e] = (cv_fold){ext[e].at, ext[e].len, ZB_DT_FLOAT32, &got[ext[e].mat]};
        float *vals = malloc(ext[e].len);
        memcpy(vals, bytes + ext[e].at, ext[e].len);
        cv_stats_add(&want[ext[e].mat], vals, ZB_DT_FLOAT32, ext[e].len / 4);
        free(vals);
    }
    uint64_t crc = 0;
    ZB_ASSERT_OK(cv_file_crc(path, folds, 4, &crc));
    assert_true(crc == cv_crc64(0, bytes, size));
    for (int m = 0; m < 2; m++) assert_int_equal(got[m].flags, want[m].flags);
    assert_int_equal(got[0].flags, CV_VALUES_ANY);
    assert_int_equal(got[0].max, want[0].max);
    assert_int_equal(got[1].flags, CV_VALUES_ANY | CV_VALUES_WIDE);
    /* without extents: the same CRC */
    ZB_ASSERT_OK(cv_file_crc(path, NULL, 0, &crc));
    assert_true(crc == cv_crc64(0, bytes, size));
    /* an extent that the file ends inside */
    cv_value_stats s = {0, 0};
    cv_fold past = {size - 8, 16, ZB_DT_FLOAT32, &s};
    assert_int_equal(cv_file_crc(path, &past, 1, &crc), ZB_E_TRUNCATED);
    assert_true(zbt_mentions("input.bin"));
    free(bytes);
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
digest_some(zb_store *inner, zb_convert *cv, uint64_t *files, uint64_t *bytes, uint64_t *crc)
{
    cv_digest *dg;
    zb_store *s;
    ZB_ASSERT_OK(cv_digest_open(inner, "ds", cv != NULL, &dg, &s));
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
    /* a large object put twice: the second put's bytes are the ones read back */
    ZB_ASSERT_OK(zb_store_put(s, "ds/X/twice", block + 1, (size_t)70000));
    ZB_ASSERT_OK(zb_store_put(s, "ds/X/twice", block + 2, (size_t)70000));
    free(block);
    ZB_ASSERT_OK(cv_digest_result(dg, files, bytes, crc));
    if (cv) ZB_ASSERT_OK(cv_digest_remember(dg, cv));
    zb_store_close(s);
    cv_digest_free(dg);
}

/* A store over a memory store whose reads of keys holding "bad" come back with a byte
 * changed: what a device that lost a write would give. */
static zb_status
lying_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    ZB_TRY(zb_store_get(self, key, offset, length, dst, nread));
    if (strstr(key, "bad") && *nread) ((uint8_t *)dst)[0] ^= 1;
    return ZB_OK;
}

static zb_status
lying_put(void *self, const char *key, const void *data, uint64_t length)
{
    return zb_store_put(self, key, data, length);
}

static zb_status
lying_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(self, key, size);
}

static void
lying_close(void *self)
{
    zb_store_close(self);
}

/* The digest's read-back of large objects as they are put: an object read back with other
 * bytes than were put fails cv_digest_result naming it; small objects are not read early. */
static void
test_digest_reads_back_what_it_put(void **state)
{
    (void)state;
    static const zb_store_methods lying = {.scheme = "memory",
                                           .get = lying_get,
                                           .size = lying_size,
                                           .put = lying_put,
                                           .close = lying_close};
    size_t big = 100000;
    uint8_t *data = malloc(big);
    assert_non_null(data);
    for (size_t i = 0; i < big; i++) data[i] = (uint8_t)(i * 13 + 1);
    for (int bad = 0; bad < 2; bad++) {
        zb_store *mem, *inner, *s;
        ZB_ASSERT_OK(zb_store_open_memory(&mem));
        ZB_ASSERT_OK(zb_store_new(&lying, mem, &inner));
        cv_digest *dg;
        ZB_ASSERT_OK(cv_digest_open(inner, "ds", true, &dg, &s));
        ZB_ASSERT_OK(zb_store_put(s, "ds/small-bad", data, 100)); /* below the read-back size */
        ZB_ASSERT_OK(zb_store_put(s, "ds/c/0", data, big));
        ZB_ASSERT_OK(zb_store_put(s, bad ? "ds/c/1-bad" : "ds/c/1", data, big));
        uint64_t files, bytes, crc;
        if (bad)
            ZB_ASSERT_ERR(cv_digest_result(dg, &files, &bytes, &crc), ZB_E_CHECKSUM,
                          "ds/c/1-bad: read back 100000 bytes");
        else
            ZB_ASSERT_OK(cv_digest_result(dg, &files, &bytes, &crc));
        zb_store_close(s);
        cv_digest_free(dg);
        zb_store_close(inner);
    }
    free(data);
}

/* zb__src_raw_view against zb__src_raw_read (pread, the oracle): a run inside one chunk is a
 * pointer into the mapping, one across chunks the same bytes in the spill buffer, an empty
 * run at the array's end reads no table entry, and an extent past the file's end is
 * ZB_E_TRUNCATED naming the file (never a fault). A file above the limit is not mapped. */
static void
test_raw_view_is_pread_without_the_copy(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("rawview");
    char path[4200];
    snprintf(path, sizeof path, "%s/input.bin", dir);
    uint32_t words[64];
    for (uint32_t i = 0; i < 64; i++) words[i] = 1000 + i;
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(words, 4, 64, fp), 64);
    fclose(fp);
    /* 4 chunks of 8 elements, stored in the file in reverse order from byte 64 */
    uint64_t table[4] = {64 + 3 * 32, 64 + 2 * 32, 64 + 32, 64};
    zb__src_raw_array a = {0, 8, table};
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    zb__src_map m;
    ZB_ASSERT_OK(zb__src_map_open(fd, path, 255, &m));
    assert_null(m.base); /* 256 bytes: above the limit */
    ZB_ASSERT_OK(zb__src_map_open(fd, path, 256, &m));
    assert_non_null(m.base);
    assert_int_equal(m.len, 256);
    zb__buf spill = {0};
    const uint8_t *got;
    uint32_t want[32];
    struct {
        uint64_t first, n;
        bool inside;
    } runs[] = {{3, 4, true}, {8, 8, true}, {6, 5, false}, {1, 30, false}, {0, 32, false}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        ZB_ASSERT_OK(zb__src_raw_view(&m, path, &a, 4, runs[i].first, runs[i].n, &spill, &got));
        ZB_ASSERT_OK(zb__src_raw_read(fd, path, &a, 4, runs[i].first, runs[i].n, want));
        assert_memory_equal(got, want, runs[i].n * 4);
        uint64_t run, at = zb__src_raw_at(&a, 4, runs[i].first, &run);
        assert_true((got == m.base + at) == runs[i].inside);
    }
    ZB_ASSERT_OK(zb__src_raw_view(&m, path, &a, 4, 32, 0, &spill, &got)); /* past the table */
    /* a chunk the table places past the file's end, and one that the end cuts */
    uint64_t bad[2] = {256, 256 - 16};
    zb__src_raw_array b = {0, 8, bad};
    ZB_ASSERT_ERR(zb__src_raw_view(&m, path, &b, 4, 0, 1, &spill, &got), ZB_E_TRUNCATED,
                  "input.bin");
    ZB_ASSERT_ERR(zb__src_raw_view(&m, path, &b, 4, 8, 8, &spill, &got), ZB_E_TRUNCATED,
                  "input.bin");
    ZB_ASSERT_ERR(zb__src_raw_view(&m, path, &b, 4, 6, 4, &spill, &got), ZB_E_TRUNCATED,
                  "input.bin");
    zb__buf_free(&spill);
    zb__src_map_close(&m);
    assert_null(m.base);
    close(fd);
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
    digest_some(inner, NULL, &files, &bytes, &crc);
    char path[4200];
    snprintf(path, sizeof path, "%s/ds", dir);
    ZB_ASSERT_OK(cv_fingerprint(path, &size, &mtime, &fcrc));
    uint64_t want = 10 + ((uint64_t)4 << 20) + 70000;
    assert_int_equal(files, 6);
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

    /* with the read-back as objects are put: the same digest, and the fingerprint takes the
     * large objects' CRCs from it while their sizes hold (a byte changed on disk behind it goes
     * unseen), and reads an object again once its size differs */
    const char *dir2 = zbt_tempdir("digest-check");
    ZB_ASSERT_OK(zb_store_open_file(dir2, &inner));
    cv.out = inner;
    cv.output = (char *)dir2;
    uint64_t cfiles, cbytes, ccrc;
    digest_some(inner, &cv, &cfiles, &cbytes, &ccrc);
    assert_true(ccrc == crc && cfiles == 6 && cbytes == want);
    assert_int_equal(cv.n_checked, 2); /* ds/X/block and ds/X/twice */
    snprintf(path, sizeof path, "%s/ds/X/block", dir2);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "!", 1, 12345), 1);
    ZB_ASSERT_OK(cv_output_fingerprint(&cv, "ds", &ssize, &scrc));
    assert_true(scrc == crc && ssize == want);
    assert_int_equal(pwrite(fd, "!", 1, (off_t)4 << 20), 1);
    close(fd);
    ZB_ASSERT_OK(cv_output_fingerprint(&cv, "ds", &ssize, &scrc));
    assert_true(scrc != crc && ssize == want + 1);
    cv_output_forget_all(&cv);
    zb_store_close(inner);

    ZB_ASSERT_OK(zb_store_open_memory(&inner));
    uint64_t mfiles, mbytes, mcrc;
    digest_some(inner, NULL, &mfiles, &mbytes, &mcrc);
    assert_true(mcrc == crc && mfiles == 6 && mbytes == want);
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
        cmocka_unit_test(test_value_stats_against_the_rule),
        cmocka_unit_test(test_file_crc_folds_extents),
        cmocka_unit_test(test_raw_view_is_pread_without_the_copy),
        cmocka_unit_test(test_strmap),
        cmocka_unit_test(test_digest_equals_fingerprint),
        cmocka_unit_test(test_digest_reads_back_what_it_put),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
