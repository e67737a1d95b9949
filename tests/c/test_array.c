/* Array reads on hand-built stores in memory: v2 and v3, edge and missing chunks, F order,
 * big-endian, strings, sharding (any inner order, empty entries, index at start or end,
 * range-read counts) and every bad input the read path must refuse with its own status. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "zarr/codec.h"

static zb__codec
blosc_lz4(void)
{
    zb__codec c;
    memset(&c, 0, sizeof c);
    c.id = ZB_CODEC_BLOSC;
    snprintf(c.cname, sizeof c.cname, "lz4");
    c.level = 5;
    c.shuffle = ZB_SHUFFLE_BYTE;
    return c;
}

/* Encodes `n` bytes with codec (NULL = raw) and stores them under key. */
static void
put_encoded(zb_store *s, const char *key, const zb__codec *c, const void *src, size_t n,
            size_t itemsize)
{
    if (!c) {
        ZB_ASSERT_OK(zb_store_put(s, key, src, n));
        return;
    }
    zb__buf out = {0};
    ZB_ASSERT_OK(zb__codec_encode(c, NULL, src, n, itemsize, &out));
    ZB_ASSERT_OK(zb_store_put(s, key, out.data, out.len));
    zb__buf_free(&out);
}

/* The 5x6 float32 array of FORMATS.md §1.5 (values r*6+c, chunks 2x4, fill -1) as v2. */
static zb_store *
make_5x6_v2(const char *compressor_json, const zb__codec *c, const char *order)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    char zarray[512];
    snprintf(zarray, sizeof zarray,
             "{\"chunks\":[2,4],\"compressor\":%s,\"dtype\":\"<f4\",\"fill_value\":-1.0,"
             "\"filters\":null,\"order\":\"%s\",\"shape\":[5,6],\"zarr_format\":2}",
             compressor_json, order);
    zbt_put_str(s, "a/.zarray", zarray);
    zbt_put_str(s, "a/.zattrs", "{\"m\": NaN}");
    for (int ci = 0; ci < 3; ci++)
        for (int cj = 0; cj < 2; cj++) {
            float chunk[8];
            for (int r = 0; r < 2; r++)
                for (int q = 0; q < 4; q++) {
                    int gr = ci * 2 + r, gc = cj * 4 + q;
                    float v = gr < 5 && gc < 6 ? (float)(gr * 6 + gc) : -1.0f;
                    /* F order: the chunk is column-major */
                    if (order[0] == 'F')
                        chunk[q * 2 + r] = v;
                    else
                        chunk[r * 4 + q] = v;
                }
            char key[64];
            snprintf(key, sizeof key, "a/%d.%d", ci, cj);
            put_encoded(s, key, c, chunk, sizeof chunk, 4);
        }
    return s;
}

static void
check_5x6(zb_store *s, uint64_t r0, uint64_t r1)
{
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    float got[30];
    for (int i = 0; i < 30; i++) got[i] = 12345.0f;
    ZB_ASSERT_OK(zb_array_read_rows(a, r0, r1, got, sizeof got, NULL));
    for (uint64_t r = r0; r < r1; r++)
        for (int q = 0; q < 6; q++)
            assert_float_equal(got[(r - r0) * 6 + q], (double)(r * 6 + q), 0);
    if ((r1 - r0) * 6 < 30) /* nothing written past the rows */
        assert_float_equal(got[(r1 - r0) * 6], 12345.0f, 0);
    zb_array_close(a);
}

static void
test_v2_5x6_codecs(void **state)
{
    (void)state;
    zb__codec c = blosc_lz4();
    zb_store *s = make_5x6_v2("{\"id\":\"blosc\",\"cname\":\"lz4\",\"clevel\":5,\"shuffle\":1,"
                              "\"blocksize\":0}",
                              &c, "C");
    check_5x6(s, 0, 5);
    check_5x6(s, 1, 4);
    check_5x6(s, 4, 5);
    zb_store_close(s);

    zb__codec z = {.id = ZB_CODEC_ZSTD, .level = 3};
    s = make_5x6_v2("{\"id\":\"zstd\",\"level\":3}", &z, "C");
    check_5x6(s, 0, 5);
    zb_store_close(s);

    zb__codec l = {.id = ZB_CODEC_LZ4, .acceleration = 1};
    s = make_5x6_v2("{\"id\":\"lz4\",\"acceleration\":1}", &l, "C");
    check_5x6(s, 2, 5);
    zb_store_close(s);

    zb__codec g = {.id = ZB_CODEC_GZIP, .level = 1};
    s = make_5x6_v2("{\"id\":\"gzip\",\"level\":1}", &g, "C");
    check_5x6(s, 0, 5);
    zb_store_close(s);

    zb__codec zl = {.id = ZB_CODEC_ZLIB, .level = 1};
    s = make_5x6_v2("{\"id\":\"zlib\",\"level\":1}", &zl, "C");
    check_5x6(s, 0, 3);
    zb_store_close(s);

    s = make_5x6_v2("null", NULL, "C");
    check_5x6(s, 0, 5);
    zb_store_close(s);

    /* F order equals its C twin */
    s = make_5x6_v2("null", NULL, "F");
    check_5x6(s, 0, 5);
    check_5x6(s, 3, 5);
    zb_store_close(s);
}

static void
test_v2_missing_chunk_is_fill(void **state)
{
    (void)state;
    zb_store *s = make_5x6_v2("null", NULL, "C");
    ZB_ASSERT_OK(zb_store_erase(s, "a/1.1"));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    float got[30];
    zb_ctx *ctx = NULL;
    ZB_ASSERT_OK(zb_ctx_new(&ctx));
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 5, got, sizeof got, ctx));
    for (int r = 0; r < 5; r++)
        for (int q = 0; q < 6; q++) {
            float want = (r == 2 || r == 3) && q >= 4 ? -1.0f : (float)(r * 6 + q);
            assert_float_equal(got[r * 6 + q], want, 0);
        }
    zb_ctx_stats st;
    zb_ctx_get_stats(ctx, &st);
    assert_int_equal(st.chunks_decoded, 5);
    assert_int_equal(st.chunks_filled, 1);
    zb_ctx_free(ctx);
    zb_array_close(a);
    zb_store_close(s);
}

static void
test_v2_big_endian_and_zero_dim(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zbt_put_str(s, "b/.zarray",
                "{\"chunks\":[3],\"compressor\":null,\"dtype\":\">i4\",\"fill_value\":0,"
                "\"filters\":null,\"order\":\"C\",\"shape\":[5],\"zarr_format\":2,"
                "\"dimension_separator\":\"/\"}");
    uint8_t c0[12] = {0, 0, 0, 1, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xfe};
    uint8_t c1[12] = {0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 0};
    ZB_ASSERT_OK(zb_store_put(s, "b/0", c0, 12));
    ZB_ASSERT_OK(zb_store_put(s, "b/1", c1, 12));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "b", &a));
    int32_t got[5];
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 5, got, sizeof got, NULL));
    int32_t want[5] = {1, 256, -2, 4, 5};
    assert_memory_equal(got, want, sizeof want);
    zb_array_close(a);

    /* a 0-d v3 array: key "c", and a missing one reads as the fill */
    zbt_put_str(s, "z/zarr.json",
                "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[],\"data_type\":"
                "\"float64\",\"chunk_grid\":{\"name\":\"regular\",\"configuration\":"
                "{\"chunk_shape\":[]}},\"chunk_key_encoding\":{\"name\":\"default\"},"
                "\"fill_value\":\"-Infinity\",\"codecs\":[{\"name\":\"bytes\","
                "\"configuration\":{\"endian\":\"little\"}}]}");
    ZB_ASSERT_OK(zb_array_open(s, "z", &a));
    double d = 0;
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 1, &d, sizeof d, NULL));
    assert_true(d < -1e308);
    double pi = 3.25;
    ZB_ASSERT_OK(zb_store_put(s, "z/c", &pi, sizeof pi));
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 1, &d, sizeof d, NULL));
    assert_float_equal(d, 3.25, 0);
    zb_array_close(a);
    zb_store_close(s);
}

static void
test_v2_vlen_strings(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zbt_put_str(s, "s/.zarray",
                "{\"chunks\":[3],\"compressor\":null,\"dtype\":\"|O\",\"fill_value\":0,"
                "\"filters\":[{\"id\":\"vlen-utf8\"}],\"order\":\"C\",\"shape\":[5],"
                "\"zarr_format\":2}");
    /* chunk 0: "a", "bb", "ccc"; chunk 1 is FORMATS.md §1.6's "dd", "e", "" */
    uint8_t c0[] = {3, 0, 0, 0, 1, 0, 0, 0, 'a', 2, 0, 0, 0, 'b', 'b', 3, 0, 0, 0, 'c', 'c', 'c'};
    uint8_t c1[] = {3, 0, 0, 0, 2, 0, 0, 0, 'd', 'd', 1, 0, 0, 0, 'e', 0, 0, 0, 0};
    ZB_ASSERT_OK(zb_store_put(s, "s/0", c0, sizeof c0));
    ZB_ASSERT_OK(zb_store_put(s, "s/1", c1, sizeof c1));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "s", &a));
    zb_strings out;
    ZB_ASSERT_OK(zb_array_read_strings(a, 1, 5, &out, NULL));
    assert_int_equal(out.n, 4);
    const char *want[4] = {"bb", "ccc", "dd", "e"};
    for (int i = 0; i < 4; i++) {
        size_t len = (size_t)(out.offsets[i + 1] - out.offsets[i]);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(out.data + out.offsets[i], want[i], len);
    }
    zb_strings_free(&out);
    float f;
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 1, &f, sizeof f, NULL), ZB_E_TYPE, "string");

    /* a length field cut off is corruption, not a crash */
    uint8_t bad[] = {3, 0, 0, 0, 2, 0, 0, 0, 'd', 'd', 1, 0};
    ZB_ASSERT_OK(zb_store_put(s, "s/1", bad, sizeof bad));
    ZB_ASSERT_ERR(zb_array_read_strings(a, 0, 5, &out, NULL), ZB_E_TRUNCATED, "s/1");
    zb_array_close(a);
    zb_store_close(s);
}

/* ---- sharding ----------------------------------------------------------------------------- */

static void
put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#define SHARD_META                                                                                 \
    "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[100],\"data_type\":\"int32\","          \
    "\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[40]}},"              \
    "\"chunk_key_encoding\":{\"name\":\"default\",\"configuration\":{\"separator\":\"/\"}},"       \
    "\"fill_value\":-7,\"codecs\":[{\"name\":\"sharding_indexed\",\"configuration\":{"             \
    "\"chunk_shape\":[10],\"codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":"          \
    "\"little\"}},{\"name\":\"blosc\",\"configuration\":{\"cname\":\"lz4\",\"clevel\":5,"          \
    "\"shuffle\":\"shuffle\",\"typesize\":4,\"blocksize\":0}}],\"index_codecs\":[{\"name\":"       \
    "\"bytes\",\"configuration\":{\"endian\":\"little\"}},\"crc32c\"],\"index_location\":"         \
    "\"%s\"}}],\"attributes\":{}}"

/* Builds shard `sh` (4 inner chunks of 10 int32: value = global index) with the inner chunks
 * stored in reverse order, inner chunk `empty` as an empty entry (-1 for none), and the index
 * at the start or the end. Returns the shard bytes (malloc'd). */
static uint8_t *
build_shard(int sh, int nchunks, int empty, bool at_start, size_t *len)
{
    zb__codec c = blosc_lz4();
    zb__buf enc[4] = {{0}};
    size_t idx = 16 * 4 + 4, total = idx;
    for (int j = 0; j < nchunks; j++) {
        int32_t v[10];
        for (int i = 0; i < 10; i++) v[i] = sh * 40 + j * 10 + i;
        ZB_ASSERT_OK(zb__codec_encode(&c, NULL, (uint8_t *)v, sizeof v, 4, &enc[j]));
        total += enc[j].len;
    }
    uint8_t *out = calloc(1, total);
    uint8_t index[68];
    size_t pos = at_start ? idx : 0;
    for (int j = 0; j < 4; j++) {
        put_u64le(index + 16 * j, UINT64_MAX);
        put_u64le(index + 16 * j + 8, UINT64_MAX);
    }
    for (int j = nchunks - 1; j >= 0; j--) { /* reversed storage order */
        if (j == empty) continue;
        memcpy(out + pos, enc[j].data, enc[j].len);
        put_u64le(index + 16 * j, pos);
        put_u64le(index + 16 * j + 8, enc[j].len);
        pos += enc[j].len;
    }
    uint32_t crc = zb__crc32c(index, 64);
    for (int i = 0; i < 4; i++) index[64 + i] = (uint8_t)(crc >> (8 * i));
    memcpy(out + (at_start ? 0 : pos), index, idx);
    *len = at_start ? pos : pos + idx;
    for (int j = 0; j < 4; j++) zb__buf_free(&enc[j]);
    return out;
}

static zb_store *
make_sharded(bool at_start)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    char meta[2048];
    snprintf(meta, sizeof meta, SHARD_META, at_start ? "start" : "end");
    zbt_put_str(s, "x/zarr.json", meta);
    size_t len;
    uint8_t *b = build_shard(0, 4, 2, at_start, &len);
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", b, len));
    free(b);
    /* shard 1 is missing; shard 2 covers rows 80..99: only 2 inner chunks exist */
    b = build_shard(2, 2, -1, at_start, &len);
    ZB_ASSERT_OK(zb_store_put(s, "x/c/2", b, len));
    free(b);
    return s;
}

static void
check_sharded(zb_store *s)
{
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "x", &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    assert_int_equal(info.chunk_shape[0], 10);
    assert_non_null(info.shard_shape);
    assert_int_equal(info.shard_shape[0], 40);
    int32_t got[100];
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 100, got, sizeof got, NULL));
    for (int i = 0; i < 100; i++) {
        bool fill = (i >= 20 && i < 30) || (i >= 40 && i < 80);
        assert_int_equal(got[i], fill ? -7 : i);
    }
    ZB_ASSERT_OK(zb_array_read_rows(a, 13, 87, got, sizeof got, NULL));
    for (int i = 13; i < 87; i++) {
        bool fill = (i >= 20 && i < 30) || (i >= 40 && i < 80);
        assert_int_equal(got[i - 13], fill ? -7 : i);
    }
    /* one inner chunk costs exactly two range reads: the index, then the data */
    zb_ctx *ctx = NULL;
    ZB_ASSERT_OK(zb_ctx_new(&ctx));
    ZB_ASSERT_OK(zb_array_read_rows(a, 31, 35, got, sizeof got, ctx));
    zb_ctx_stats st;
    zb_ctx_get_stats(ctx, &st);
    assert_int_equal(st.range_reads, 2);
    assert_int_equal(st.chunks_decoded, 1);
    for (int i = 31; i < 35; i++) assert_int_equal(got[i - 31], i);
    /* three neighbouring inner chunks are fetched with one coalesced read */
    zb_ctx_reset_stats(ctx);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 40, got, sizeof got, ctx));
    zb_ctx_get_stats(ctx, &st);
    assert_int_equal(st.range_reads, 2);
    assert_int_equal(st.chunks_decoded, 3);
    assert_int_equal(st.chunks_filled, 1);
    zb_ctx_free(ctx);
    zb_array_close(a);
}

static void
test_sharded_index_end(void **state)
{
    (void)state;
    zb_store *s = make_sharded(false);
    check_sharded(s);
    zb_store_close(s);
}

static void
test_sharded_index_start(void **state)
{
    (void)state;
    zb_store *s = make_sharded(true);
    check_sharded(s);
    zb_store_close(s);
}

typedef struct thread_arg {
    const zb_array *a;
    int bad;
} thread_arg;

static void *
read_many_times(void *p)
{
    thread_arg *t = p;
    zb_ctx *ctx = NULL;
    if (zb_ctx_new(&ctx) != ZB_OK) {
        t->bad++;
        return NULL;
    }
    int32_t got[100];
    for (int k = 0; k < 200; k++) {
        uint64_t r0 = (uint64_t)(k * 7) % 60, r1 = r0 + 40;
        if (zb_array_read_rows(t->a, r0, r1, got, sizeof got, ctx) != ZB_OK) {
            t->bad++;
            continue;
        }
        for (uint64_t i = r0; i < r1; i++) {
            bool fill = (i >= 20 && i < 30) || (i >= 40 && i < 80);
            if (got[i - r0] != (fill ? -7 : (int32_t)i)) t->bad++;
        }
    }
    zb_ctx_free(ctx);
    return NULL;
}

static void
test_shared_array_threads(void **state)
{
    (void)state;
    zb_store *s = make_sharded(false);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "x", &a));
    pthread_t t[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){a, 0};
        pthread_create(&t[i], NULL, read_many_times, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    zb_array_close(a);
    zb_store_close(s);
}

/* ---- bad input: each gets its own status and a message naming the key --------------------- */

static void
test_bad_truncated_and_corrupt_chunks(void **state)
{
    (void)state;
    /* uncompressed chunk cut short */
    zb_store *s = make_5x6_v2("null", NULL, "C");
    float part[3] = {0, 1, 2};
    ZB_ASSERT_OK(zb_store_put(s, "a/0.0", part, sizeof part));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    float got[30];
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 5, got, sizeof got, NULL), ZB_E_TRUNCATED, "a/0.0");
    zb_array_close(a);
    zb_store_close(s);

    /* blosc: a corrupt header (nbytes disagrees with the chunk size), and a cut chunk */
    zb__codec c = blosc_lz4();
    s = make_5x6_v2("{\"id\":\"blosc\",\"cname\":\"lz4\",\"clevel\":5,\"shuffle\":1,"
                    "\"blocksize\":0}",
                    &c, "C");
    uint8_t *chunk = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, "a/1.0", &chunk, &len));
    chunk[4] ^= 0x40; /* nbytes */
    ZB_ASSERT_OK(zb_store_put(s, "a/1.0", chunk, len));
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 5, got, sizeof got, NULL), ZB_E_CORRUPT, "a/1.0");
    chunk[4] ^= 0x40;
    ZB_ASSERT_OK(zb_store_put(s, "a/1.0", chunk, len - 5));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 5, got, sizeof got, NULL), ZB_E_TRUNCATED, "a/1.0");
    /* rows that avoid the bad chunk still read */
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 2, got, sizeof got, NULL));
    assert_float_equal(got[7], 7.0f, 0);
    zb_array_close(a);
    free(chunk);
    zb_store_close(s);
}

static void
test_bad_shards(void **state)
{
    (void)state;
    zb_store *s = make_sharded(false);
    uint8_t *shard = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, "x/c/0", &shard, &len));
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "x", &a));
    int32_t got[100];
    uint8_t *bad = malloc(len);

    /* a flipped index byte: the CRC no longer matches */
    memcpy(bad, shard, len);
    bad[len - 68] ^= 1;
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_CHECKSUM, "x/c/0");

    /* an entry past the end of the shard (CRC fixed up so only the range is wrong) */
    memcpy(bad, shard, len);
    put_u64le(bad + len - 68, len + 100);
    uint32_t crc = zb__crc32c(bad + len - 68, 64);
    for (int i = 0; i < 4; i++) bad[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_SHARD_RANGE,
                  "past the end");

    /* an entry overlapping the index */
    memcpy(bad, shard, len);
    put_u64le(bad + len - 68, len - 70);
    put_u64le(bad + len - 60, 10);
    crc = zb__crc32c(bad + len - 68, 64);
    for (int i = 0; i < 4; i++) bad[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_SHARD_RANGE,
                  "overlaps the index");

    /* a half-empty entry */
    memcpy(bad, shard, len);
    put_u64le(bad + len - 68, UINT64_MAX);
    crc = zb__crc32c(bad + len - 68, 64);
    for (int i = 0; i < 4; i++) bad[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_SHARD_RANGE,
                  "half empty");

    /* offset + nbytes overflows */
    memcpy(bad, shard, len);
    put_u64le(bad + len - 68, UINT64_MAX - 5);
    put_u64le(bad + len - 60, 10);
    crc = zb__crc32c(bad + len - 68, 64);
    for (int i = 0; i < 4; i++) bad[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_SHARD_RANGE,
                  "overflows");

    /* a shard shorter than its index */
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", shard, 50));
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 10, got, sizeof got, NULL), ZB_E_TRUNCATED, "x/c/0");

    /* garbage where an inner chunk should be: the entry is in range, the blosc data is not */
    memcpy(bad, shard, len);
    memset(bad, 0xAB, 20);
    ZB_ASSERT_OK(zb_store_put(s, "x/c/0", bad, len));
    zb_status st = zb_array_read_rows(a, 0, 40, got, sizeof got, NULL);
    if (st != ZB_E_CORRUPT && st != ZB_E_TRUNCATED)
        fail_msg("garbage inner chunk gave %s: %s", zb_status_name(st), zb_last_error());
    assert_true(zbt_mentions("x/c/0"));

    free(bad);
    free(shard);
    zb_array_close(a);
    zb_store_close(s);
}

static void
test_bad_metadata(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_array *a = NULL;
    zbt_put_str(s, "j/.zarray", "{\"chunks\": [2], \"shape\": [4");
    ZB_ASSERT_ERR(zb_array_open(s, "j", &a), ZB_E_JSON, "j/.zarray");
    assert_null(a);
    zbt_put_str(s, "u/zarr.json",
                "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[4],\"data_type\":"
                "\"int32\",\"chunk_grid\":{\"name\":\"regular\",\"configuration\":"
                "{\"chunk_shape\":[2]}},\"chunk_key_encoding\":{\"name\":\"default\"},"
                "\"fill_value\":0,\"codecs\":[{\"name\":\"bytes\",\"configuration\":"
                "{\"endian\":\"little\"}},{\"name\":\"snappy9\"}]}");
    ZB_ASSERT_ERR(zb_array_open(s, "u", &a), ZB_E_UNSUPPORTED, "snappy9");
    zbt_put_str(s, "o/.zarray",
                "{\"chunks\":[1,1,1],\"compressor\":null,\"dtype\":\"<f8\",\"fill_value\":0,"
                "\"filters\":null,\"order\":\"C\",\"shape\":[4294967296,4294967296,16],"
                "\"zarr_format\":2}");
    ZB_ASSERT_ERR(zb_array_open(s, "o", &a), ZB_E_OVERFLOW, "o/.zarray");
    ZB_ASSERT_ERR(zb_array_open(s, "../o", &a), ZB_E_BADKEY, "..");
    ZB_ASSERT_ERR(zb_array_open(s, "nothing", &a), ZB_E_NOTFOUND, "nothing");
    assert_null(a);
    zb_store_close(s);
}

static void
test_bad_ranges(void **state)
{
    (void)state;
    zb_store *s = make_5x6_v2("null", NULL, "C");
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    float got[30];
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 6, got, sizeof got, NULL), ZB_E_RANGE, "[0, 6)");
    ZB_ASSERT_ERR(zb_array_read_rows(a, 3, 2, got, sizeof got, NULL), ZB_E_RANGE, NULL);
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 5, got, 10, NULL), ZB_E_INVALID, "destination");
    ZB_ASSERT_OK(zb_array_read_rows(a, 2, 2, got, 0, NULL));
    zb_array_close(a);
    zb_store_close(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v2_5x6_codecs),
        cmocka_unit_test(test_v2_missing_chunk_is_fill),
        cmocka_unit_test(test_v2_big_endian_and_zero_dim),
        cmocka_unit_test(test_v2_vlen_strings),
        cmocka_unit_test(test_sharded_index_end),
        cmocka_unit_test(test_sharded_index_start),
        cmocka_unit_test(test_shared_array_threads),
        cmocka_unit_test(test_bad_truncated_and_corrupt_chunks),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_ranges),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
