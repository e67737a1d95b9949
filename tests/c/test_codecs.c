/* Tests of the bytes->bytes codecs (src/zarr/codecs/): round trips, golden prefixes from
 * FORMATS §2 and §9 row 6, the hostile-input rules of §2.2-§2.5 (rows 12-16), and the
 * dispatcher and context. Oracles: the codec libraries themselves (LZ4F frames, streamed zstd
 * frames, hand-built gzip members) and a bitwise CRC32C. */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <blosc.h>
#include <libdeflate.h>
#include <lz4.h>
#include <lz4frame.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "util/buf.h"
#include "zarr/codec.h"
#include "zarr/codecs/codecs.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers.
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t
rng(void)
{
    /* xorshift64*: deterministic, so a failure reproduces. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* n float32 values that compress like real measurements: a smooth signal with noise,
 * quantised to 0.01, and a run of zeros (sparse data). */
static uint8_t *
make_floats(size_t n)
{
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) {
        double x = sin((double)i / 50.0) * 1000.0 + (double)(rng() % 1000) / 100.0;
        v[i] = (i % 97) < 20 ? 0.0f : (float)(round(x) / 100.0);
    }
    return (uint8_t *)v;
}

static zb__codec
blosc_codec(const char *cname, int clevel, int shuffle)
{
    zb__codec c = {.id = ZB_CODEC_BLOSC, .level = clevel, .shuffle = shuffle};
    snprintf(c.cname, sizeof c.cname, "%s", cname);
    return c;
}

static zb__codec
simple_codec(zb__codec_id id, int level)
{
    zb__codec c = {.id = id, .level = level, .acceleration = 1};
    return c;
}

static uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Decodes a copy of src held in a heap block of exactly src_len bytes into a heap block of
 * exactly `cap` bytes, so that ASan sees any read or write outside either. */
static zb_status
decode_exact(const zb__codec *c, zb_ctx *ctx, const uint8_t *src, size_t src_len, size_t cap,
             size_t expected, size_t *out_len, uint8_t **out)
{
    uint8_t *s = malloc(src_len ? src_len : 1);
    uint8_t *d = malloc(cap ? cap : 1);
    assert_non_null(s);
    assert_non_null(d);
    if (src_len) memcpy(s, src, src_len);
    size_t n = 12345;
    zb_status st = zb__codec_decode(c, ctx, s, src_len, d, cap, expected, &n, "c/0/3");
    free(s);
    if (out_len) *out_len = n;
    if (out)
        *out = d;
    else
        free(d);
    return st;
}

/* Encodes data, checks that decoding gives it back (with the size known, and with it unknown),
 * and returns the encoded bytes in *enc. */
static void
roundtrip(const zb__codec *c, zb_ctx *ctx, const uint8_t *data, size_t n, size_t itemsize,
          zb__buf *enc)
{
    enc->len = 0;
    assert_int_equal(zb__codec_encode(c, ctx, data, n, itemsize, enc), ZB_OK);
    assert_true(enc->len > 0);

    size_t got = 0;
    uint8_t *out = NULL;
    assert_int_equal(decode_exact(c, ctx, enc->data, enc->len, n, n, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);

    out = NULL;
    assert_int_equal(decode_exact(c, ctx, enc->data, enc->len, n, SIZE_MAX, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);

    size_t declared = 0;
    zb_status st = zb__codec_decoded_size(c, enc->data, enc->len, &declared, "c/0/3");
    if (c->id == ZB_CODEC_ZLIB) {
        assert_int_equal(st, ZB_E_UNSUPPORTED);
    } else {
        assert_int_equal(st, ZB_OK);
        assert_int_equal(declared, n);
    }
}

static void
assert_error_names(const char *what)
{
    const char *msg = zb_last_error();
    if (!strstr(msg, what)) fail_msg("error message '%s' does not mention '%s'", msg, what);
}

/* ---------------------------------------------------------------------------------------------
 * CRC32C.
 * ------------------------------------------------------------------------------------------- */

/* Bitwise reflected CRC32C, the independent oracle. */
static uint32_t
crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void
test_crc32c_check_value(void **state)
{
    (void)state;
    assert_int_equal(zb__crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(zb__crc32c("", 0), 0u);
    /* RFC 3720 B.4: 32 bytes of zeros and of 0xFF. */
    uint8_t z[32] = {0}, f[32];
    memset(f, 0xFF, sizeof f);
    assert_int_equal(zb__crc32c(z, sizeof z), 0x8A9136AAu);
    assert_int_equal(zb__crc32c(f, sizeof f), 0x62A8AB43u);
}

static void
test_crc32c_matches_bitwise(void **state)
{
    (void)state;
    uint8_t buf[4100];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rng();
    /* Every alignment and the lengths around the SIMD block sizes. */
    size_t lens[] = {1, 3, 7, 8, 15, 16, 31, 63, 64, 65, 255, 256, 257, 1023, 1024, 4096};
    for (size_t off = 0; off < 4; off++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
            assert_int_equal(zb__crc32c(buf + off, lens[i]), crc32c_bitwise(buf + off, lens[i]));
}

/* ---------------------------------------------------------------------------------------------
 * Round trips.
 * ------------------------------------------------------------------------------------------- */

#define NFLOATS 16384 /* 64 KiB, several blosc blocks */

static void
test_roundtrip_blosc(void **state)
{
    (void)state;
    uint8_t *data = make_floats(NFLOATS);
    size_t n = NFLOATS * 4;
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    const char *cnames[] = {"lz4", "zstd", "blosclz", "zlib", "lz4hc"};
    const unsigned codes[] = {1, 4, 0, 3, 1}; /* FORMATS §2.2 compressor codes */
    const int shuffles[] = {ZB_SHUFFLE_NONE, ZB_SHUFFLE_BYTE, ZB_SHUFFLE_BIT, ZB_SHUFFLE_AUTO};
    zb__buf enc = {0};
    for (size_t i = 0; i < sizeof cnames / sizeof cnames[0]; i++) {
        for (size_t s = 0; s < sizeof shuffles / sizeof shuffles[0]; s++) {
            zb__codec c = blosc_codec(cnames[i], 5, shuffles[s]);
            roundtrip(&c, ctx, data, n, 4, &enc);
            const uint8_t *h = enc.data;
            assert_int_equal(h[0], 2);               /* c-blosc1 format version */
            assert_int_equal(h[3], 4);               /* typesize = the dtype's item size */
            assert_int_equal(le32(h + 4), n);        /* nbytes */
            assert_int_equal(le32(h + 12), enc.len); /* cbytes */
            assert_int_equal(h[2] >> 5, codes[i]);
            assert_int_equal(h[2] & 0x02, 0); /* compressed, not memcpyed */
            int want_byte = shuffles[s] == ZB_SHUFFLE_BYTE || shuffles[s] == ZB_SHUFFLE_AUTO;
            assert_int_equal((h[2] & 0x01) != 0, want_byte);
            assert_int_equal((h[2] & 0x04) != 0, shuffles[s] == ZB_SHUFFLE_BIT);
            assert_true(enc.len < n); /* the data is compressible */
        }
    }
    /* Auto shuffle on a 1-byte type is bit shuffle (numcodecs' AUTOSHUFFLE). */
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_AUTO);
    roundtrip(&c, ctx, data, n, 1, &enc);
    assert_int_equal(enc.data[3], 1);
    assert_int_equal(enc.data[2] & 0x05, 0x04);
    /* An explicit blocksize reaches blosc and is recorded. (c-blosc 1.21 takes it as given for
     * codecs whose blocks are not split, like zstd; for split codecs such as lz4 it treats it as
     * a floor and enlarges small ones.) */
    c = blosc_codec("zstd", 5, ZB_SHUFFLE_BYTE);
    c.blocksize = 8192;
    roundtrip(&c, ctx, data, n, 4, &enc);
    assert_int_equal(le32(enc.data + 8), 8192);
    /* clevel 0 stores the data raw. */
    c = blosc_codec("zstd", 0, ZB_SHUFFLE_BYTE);
    roundtrip(&c, ctx, data, n, 4, &enc);
    assert_int_equal(enc.len, n + 16);
    assert_int_equal(enc.data[2] & 0x02, 0x02);
    zb__buf_free(&enc);
    zb_ctx_free(ctx);
    free(data);
}

static void
test_roundtrip_zstd(void **state)
{
    (void)state;
    uint8_t *data = make_floats(NFLOATS);
    size_t n = NFLOATS * 4;
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    const int levels[] = {0, 1, 3, 9, 19, -5};
    zb__buf enc = {0};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        for (int checksum = 0; checksum < 2; checksum++) {
            zb__codec c = simple_codec(ZB_CODEC_ZSTD, levels[i]);
            c.checksum = checksum;
            roundtrip(&c, ctx, data, n, 4, &enc);
            assert_int_equal(le32(enc.data), 0xFD2FB528u);
            /* Frame header descriptor bit 2: content checksum present. */
            assert_int_equal((enc.data[4] & 0x04) != 0, checksum);
            assert_int_equal(ZSTD_getFrameContentSize(enc.data, enc.len), n);
            assert_true(enc.len < n);
        }
    }
    zb__buf_free(&enc);
    zb_ctx_free(ctx);
    free(data);
}

static void
test_roundtrip_lz4_gzip_zlib_crc32c(void **state)
{
    (void)state;
    uint8_t *data = make_floats(NFLOATS);
    size_t n = NFLOATS * 4;
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    zb__buf enc = {0};

    const int accels[] = {1, 8, 0};
    for (size_t i = 0; i < 3; i++) {
        zb__codec c = simple_codec(ZB_CODEC_LZ4, 0);
        c.acceleration = accels[i];
        roundtrip(&c, ctx, data, n, 4, &enc);
        assert_int_equal(le32(enc.data), n);
    }
    const int levels[] = {0, 1, 6, 9, -1};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        zb__codec g = simple_codec(ZB_CODEC_GZIP, levels[i]);
        roundtrip(&g, ctx, data, n, 4, &enc);
        assert_int_equal(enc.data[0], 0x1f);
        assert_int_equal(enc.data[1], 0x8b);
        assert_int_equal(le32(enc.data + enc.len - 4), n); /* ISIZE */
        assert_int_equal(le32(enc.data + enc.len - 8), libdeflate_crc32(0, data, n));
        zb__codec z = simple_codec(ZB_CODEC_ZLIB, levels[i]);
        roundtrip(&z, ctx, data, n, 4, &enc);
        assert_int_equal(enc.data[0], 0x78);
        assert_int_equal((enc.data[0] * 256u + enc.data[1]) % 31u, 0);
    }
    zb__codec k = simple_codec(ZB_CODEC_CRC32C, 0);
    roundtrip(&k, ctx, data, n, 4, &enc);
    assert_int_equal(enc.len, n + 4);
    assert_memory_equal(enc.data, data, n);
    assert_int_equal(le32(enc.data + n), crc32c_bitwise(data, n));

    zb__buf_free(&enc);
    zb_ctx_free(ctx);
    free(data);
}

/* Empty chunks survive every codec. */
static void
test_roundtrip_empty(void **state)
{
    (void)state;
    zb__codec cs[] = {blosc_codec("lz4", 5, 1),       simple_codec(ZB_CODEC_ZSTD, 3),
                      simple_codec(ZB_CODEC_LZ4, 0),  simple_codec(ZB_CODEC_GZIP, 1),
                      simple_codec(ZB_CODEC_ZLIB, 1), simple_codec(ZB_CODEC_CRC32C, 0)};
    zb__buf enc = {0};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        assert_int_equal(zb__codec_encode(&cs[i], NULL, NULL, 0, 4, &enc), ZB_OK);
        size_t got = 99;
        assert_int_equal(zb__codec_decode(&cs[i], NULL, enc.data, enc.len, NULL, 0, 0, &got, "c"),
                         ZB_OK);
        assert_int_equal(got, 0);
    }
    zb__buf_free(&enc);
}

/* ---------------------------------------------------------------------------------------------
 * Golden prefixes (FORMATS §9 row 6) on the 32-byte <f4 chunk [0, 1, ..., 7].
 * ------------------------------------------------------------------------------------------- */

static void
chunk32(uint8_t out[32])
{
    for (int i = 0; i < 8; i++) {
        float f = (float)i;
        memcpy(out + 4 * i, &f, 4);
    }
}

static void
test_golden_blosc(void **state)
{
    (void)state;
    uint8_t raw[32];
    chunk32(raw);
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_BYTE);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, raw, sizeof raw, 4, &enc), ZB_OK);
    /* Flags 0x33: byte shuffle | memcpyed (32 bytes is below blosc's minimum block, so it is
     * stored raw) | blocks not split | lz4 << 5. typesize 4, nbytes 32, blocksize 32, cbytes 48.
     * Byte 1 (versionlz) is 1 for lz4 in c-blosc 1.21, as zarr-python 2.13 writes. */
    const uint8_t want[16] = {0x02, 0x01, 0x33, 0x04, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0x30, 0, 0, 0};
    assert_int_equal(enc.len, 48);
    assert_memory_equal(enc.data, want, sizeof want);
    assert_memory_equal(enc.data + 16, raw, 32);
    zb__buf_free(&enc);
}

static void
test_golden_zstd(void **state)
{
    (void)state;
    uint8_t raw[32];
    chunk32(raw);
    zb__codec c = simple_codec(ZB_CODEC_ZSTD, 1);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, raw, sizeof raw, 4, &enc), ZB_OK);
    /* Magic, then FHD 0x20 (single segment, no checksum, 1-byte content size) and size 32. */
    const uint8_t want[6] = {0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x20};
    assert_true(enc.len > sizeof want);
    assert_memory_equal(enc.data, want, sizeof want);
    assert_int_equal(ZSTD_getFrameContentSize(enc.data, enc.len), 32);
    zb__buf_free(&enc);
}

static void
test_golden_lz4(void **state)
{
    (void)state;
    uint8_t raw[32];
    chunk32(raw);
    zb__codec c = simple_codec(ZB_CODEC_LZ4, 0);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, raw, sizeof raw, 4, &enc), ZB_OK);
    const uint8_t want[4] = {0x20, 0, 0, 0};
    assert_memory_equal(enc.data, want, sizeof want);
    /* The rest is a raw block exactly as LZ4_compress_fast(acceleration 1) makes it. */
    char block[64];
    int bl = LZ4_compress_fast((const char *)raw, block, 32, (int)sizeof block, 1);
    assert_int_equal(enc.len, 4 + (size_t)bl);
    assert_memory_equal(enc.data + 4, block, (size_t)bl);
    zb__buf_free(&enc);
}

static void
test_golden_gzip_zlib(void **state)
{
    (void)state;
    uint8_t raw[32];
    chunk32(raw);
    zb__buf enc = {0};
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 1);
    assert_int_equal(zb__codec_encode(&g, NULL, raw, sizeof raw, 4, &enc), ZB_OK);
    const uint8_t want_gz[4] = {0x1f, 0x8b, 0x08, 0x00};
    assert_memory_equal(enc.data, want_gz, 4);
    /* Golden tests mask MTIME (bytes 4..7); this writer promises 0 there for reproducibility. */
    assert_int_equal(le32(enc.data + 4), 0);
    assert_int_equal(enc.data[8], 0x04); /* XFL: fastest, as Python's gzip at level 1 */
    assert_int_equal(enc.data[9], 0xff); /* OS unknown */

    const int levels[] = {1, 6, 9};
    const uint8_t flg[] = {0x01, 0x9c, 0xda}; /* what zlib.compress(buf, level) writes */
    for (int i = 0; i < 3; i++) {
        zb__codec z = simple_codec(ZB_CODEC_ZLIB, levels[i]);
        assert_int_equal(zb__codec_encode(&z, NULL, raw, sizeof raw, 4, &enc), ZB_OK);
        assert_int_equal(enc.data[0], 0x78);
        assert_int_equal(enc.data[1], flg[i]);
    }
    zb__buf_free(&enc);
}

/* ---------------------------------------------------------------------------------------------
 * zstd (FORMATS §2.3, §9 rows 12 and 24).
 * ------------------------------------------------------------------------------------------- */

/* A frame without a content size, as the zstd CLI writes through a pipe. */
static size_t
zstd_frame_unknown_size(const uint8_t *src, size_t n, uint8_t *dst, size_t cap, int checksum)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    assert_non_null(c);
    assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0)));
    assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum)));
    ZSTD_outBuffer out = {dst, cap, 0};
    ZSTD_inBuffer in = {src, n, 0};
    size_t r = ZSTD_compressStream2(c, &out, &in, ZSTD_e_end);
    assert_int_equal(r, 0);
    ZSTD_freeCCtx(c);
    assert_int_equal(ZSTD_getFrameContentSize(dst, out.pos), ZSTD_CONTENTSIZE_UNKNOWN);
    return out.pos;
}

static void
test_zstd_frame_without_content_size(void **state)
{
    (void)state;
    size_t n = 4000 * 4;
    uint8_t *data = make_floats(4000);
    size_t cap = ZSTD_compressBound(n);
    uint8_t *frame = malloc(cap);
    size_t len = zstd_frame_unknown_size(data, n, frame, cap, 1);
    zb__codec c = simple_codec(ZB_CODEC_ZSTD, 3);
    uint8_t *out = NULL;
    size_t got = 0;
    assert_int_equal(decode_exact(&c, NULL, frame, len, n, n, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);
    /* Without an expected size it decodes into whatever room there is. */
    assert_int_equal(decode_exact(&c, NULL, frame, len, n + 100, SIZE_MAX, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);
    /* The frame does not say, so its size cannot be asked for. */
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&c, frame, len, &declared, "k"), ZB_E_UNSUPPORTED);
    /* Expecting more or less than the frame holds is corruption. */
    assert_int_equal(decode_exact(&c, NULL, frame, len, n + 4, n + 4, NULL, NULL), ZB_E_CORRUPT);
    assert_int_equal(decode_exact(&c, NULL, frame, len, n - 4, n - 4, NULL, NULL), ZB_E_CORRUPT);
    /* Too little room without an expected size is an error too. */
    assert_int_not_equal(decode_exact(&c, NULL, frame, len, n - 1, SIZE_MAX, NULL, NULL), ZB_OK);
    free(frame);
    free(data);
}

static void
test_zstd_concatenated_frames(void **state)
{
    (void)state;
    size_t n = 3000 * 4;
    uint8_t *data = make_floats(3000);
    zb__codec c = simple_codec(ZB_CODEC_ZSTD, 3);
    zb__buf a = {0}, b = {0};
    size_t half = 1000 * 4;
    assert_int_equal(zb__codec_encode(&c, NULL, data, half, 4, &a), ZB_OK);
    assert_int_equal(zb__codec_encode(&c, NULL, data + half, n - half, 4, &b), ZB_OK);
    assert_int_equal(zb__buf_append(&a, b.data, b.len), ZB_OK);
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&c, a.data, a.len, &declared, "k"), ZB_OK);
    assert_int_equal(declared, n);
    uint8_t *out = NULL;
    size_t got = 0;
    assert_int_equal(decode_exact(&c, NULL, a.data, a.len, n, n, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);
    /* A declared frame followed by one without a size. */
    uint8_t tail[8192];
    size_t tl = zstd_frame_unknown_size(data + half, n - half, tail, sizeof tail, 0);
    a.len -= b.len;
    assert_int_equal(zb__buf_append(&a, tail, tl), ZB_OK);
    assert_int_equal(decode_exact(&c, NULL, a.data, a.len, n, n, &got, &out), ZB_OK);
    assert_memory_equal(out, data, n);
    free(out);
    /* A skippable frame in between carries no content. */
    uint8_t skip[12] = {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 'z', 'b', 'a', 't'};
    a.len -= tl;
    size_t first_len = a.len;
    assert_int_equal(zb__buf_append(&a, skip, sizeof skip), ZB_OK);
    assert_int_equal(zb__buf_append(&a, b.data, b.len), ZB_OK);
    assert_int_equal(zb__codec_decoded_size(&c, a.data, a.len, &declared, "k"), ZB_OK);
    assert_int_equal(declared, n);
    assert_int_equal(decode_exact(&c, NULL, a.data, a.len, n, n, &got, &out), ZB_OK);
    assert_memory_equal(out, data, n);
    free(out);
    /* Garbage after the last frame is not ignored. */
    a.len = first_len;
    assert_int_equal(zb__buf_append(&a, "junk", 4), ZB_OK);
    assert_int_equal(decode_exact(&c, NULL, a.data, a.len, half, half, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("offset");
    zb__buf_free(&a);
    zb__buf_free(&b);
    free(data);
}

static void
test_zstd_size_mismatch_and_checksum(void **state)
{
    (void)state;
    size_t n = 2000 * 4;
    uint8_t *data = make_floats(2000);
    zb__codec c = simple_codec(ZB_CODEC_ZSTD, 3);
    c.checksum = true;
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, data, n, 4, &enc), ZB_OK);
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n + 1, n + 1, NULL, NULL),
                     ZB_E_CORRUPT);
    assert_error_names("c/0/3");
    assert_error_names("expected");
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n - 1, n - 1, NULL, NULL),
                     ZB_E_CORRUPT);
    /* Too small a buffer for what the frame declares, with no expected size. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n - 1, SIZE_MAX, NULL, NULL),
                     ZB_E_CORRUPT);
    /* The last 4 bytes of the frame are the checksum (XXH64, low 32 bits). */
    enc.data[enc.len - 1] ^= 0x40;
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n, n, NULL, NULL), ZB_E_CHECKSUM);
    assert_error_names("zstd");
    assert_error_names("c/0/3");
    /* The same corruption in a frame of unknown size. */
    size_t cap = ZSTD_compressBound(n);
    uint8_t *frame = malloc(cap);
    size_t len = zstd_frame_unknown_size(data, n, frame, cap, 1);
    frame[len - 2] ^= 0x01;
    assert_int_equal(decode_exact(&c, NULL, frame, len, n, n, NULL, NULL), ZB_E_CHECKSUM);
    free(frame);
    /* Not a zstd frame at all. */
    assert_int_equal(decode_exact(&c, NULL, (const uint8_t *)"hello world", 11, n, n, NULL, NULL),
                     ZB_E_CORRUPT);
    assert_error_names("magic");
    zb__buf_free(&enc);
    free(data);
}

/* ---------------------------------------------------------------------------------------------
 * lz4 (FORMATS §2.4, §9 row 13).
 * ------------------------------------------------------------------------------------------- */

static void
test_lz4_framing_errors(void **state)
{
    (void)state;
    size_t n = 1500 * 4;
    uint8_t *data = make_floats(1500);
    zb__codec c = simple_codec(ZB_CODEC_LZ4, 0);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, data, n, 4, &enc), ZB_OK);

    /* Prefix != expected. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n + 4, n + 4, NULL, NULL),
                     ZB_E_CORRUPT);
    assert_error_names("prefix");
    assert_error_names("c/0/3");
    /* A prefix that agrees with expected but not with the block. */
    put_le32(enc.data, (uint32_t)(n + 8));
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n + 8, n + 8, NULL, NULL),
                     ZB_E_CORRUPT);
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n + 8, SIZE_MAX, NULL, NULL),
                     ZB_E_CORRUPT);
    put_le32(enc.data, (uint32_t)n);

    /* An LZ4 frame, as lz4.frame and cramjam write. */
    size_t fcap = LZ4F_compressFrameBound(n, NULL);
    uint8_t *frame = malloc(fcap);
    size_t flen = LZ4F_compressFrame(frame, fcap, data, n, NULL);
    assert_false(LZ4F_isError(flen));
    const uint8_t magic[4] = {0x04, 0x22, 0x4d, 0x18};
    assert_memory_equal(frame, magic, 4);
    assert_int_equal(decode_exact(&c, NULL, frame, flen, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("frame");
    assert_error_names("c/0/3");
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&c, frame, flen, &declared, "k"), ZB_E_CORRUPT);
    assert_error_names("frame");
    free(frame);

    /* A prefix-less raw block (z5's zarr lz4). */
    int bcap = LZ4_compressBound((int)n);
    char *block = malloc((size_t)bcap);
    int blen = LZ4_compress_default((const char *)data, block, (int)n, bcap);
    assert_true(blen > 0);
    assert_int_not_equal(decode_exact(&c, NULL, (uint8_t *)block, (size_t)blen, n, n, NULL, NULL),
                         ZB_OK);
    free(block);

    /* Shorter than the prefix. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, 3, n, n, NULL, NULL), ZB_E_TRUNCATED);
    /* A prefix and no block. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, 4, n, n, NULL, NULL), ZB_E_TRUNCATED);
    zb__buf_free(&enc);
    free(data);
}

/* ---------------------------------------------------------------------------------------------
 * blosc (FORMATS §2.2, §9 row 14).
 * ------------------------------------------------------------------------------------------- */

static void
test_blosc_header_checks(void **state)
{
    (void)state;
    size_t n = 2048 * 4;
    uint8_t *data = make_floats(2048);
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_BYTE);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, data, n, 4, &enc), ZB_OK);

    /* cbytes != object length: one byte more in the object, one byte less. */
    assert_int_equal(zb__buf_append(&enc, "\0", 1), ZB_OK);
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("cbytes");
    assert_error_names("c/0/3");
    assert_error_names("offset 12");
    enc.len--;
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len - 1, n, n, NULL, NULL),
                     ZB_E_TRUNCATED);
    assert_error_names("cbytes");
    /* nbytes != expected. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n + 4, n + 4, NULL, NULL),
                     ZB_E_CORRUPT);
    assert_error_names("nbytes");
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n - 4, n - 4, NULL, NULL),
                     ZB_E_CORRUPT);
    /* nbytes larger than the room when no size is expected. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, enc.len, n - 1, SIZE_MAX, NULL, NULL),
                     ZB_E_CORRUPT);
    /* Shorter than the header. */
    assert_int_equal(decode_exact(&c, NULL, enc.data, 15, n, n, NULL, NULL), ZB_E_TRUNCATED);
    assert_int_equal(decode_exact(&c, NULL, enc.data, 0, n, n, NULL, NULL), ZB_E_TRUNCATED);
    /* A c-blosc2 version byte. */
    uint8_t *copy = malloc(enc.len);
    memcpy(copy, enc.data, enc.len);
    copy[0] = 4;
    assert_int_equal(decode_exact(&c, NULL, copy, enc.len, n, n, NULL, NULL), ZB_E_UNSUPPORTED);
    assert_error_names("c-blosc2");
    copy[0] = 0;
    assert_int_equal(decode_exact(&c, NULL, copy, enc.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    copy[0] = 0x99;
    assert_int_equal(decode_exact(&c, NULL, copy, enc.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("offset 0");
    /* nbytes beyond c-blosc1's limit. */
    memcpy(copy, enc.data, enc.len);
    put_le32(copy + 4, 0x7FFFFFF0u);
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&c, copy, enc.len, &declared, "k"), ZB_E_CORRUPT);
    /* cbytes below the header size. */
    memcpy(copy, enc.data, enc.len);
    put_le32(copy + 12, 8);
    assert_int_equal(decode_exact(&c, NULL, copy, enc.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    free(copy);
    assert_int_equal(zb__codec_decoded_size(&c, enc.data, enc.len, &declared, "k"), ZB_OK);
    assert_int_equal(declared, n);
    zb__buf_free(&enc);
    free(data);
}

/* zb__blosc_plain: a frame blosc stored as a plain copy (BLOSC_MEMCPYED: uniformly spread uint16
 * ids under lz4 without shuffle) is its input 16 bytes in; a compressed one is left to the
 * decoder; a plain-copy header that lies fails as zb__codec_decode fails on it. */
static void
test_blosc_plain_copy(void **state)
{
    (void)state;
    size_t n = 4096 * 2;
    uint16_t *ids = malloc(n);
    assert_non_null(ids);
    for (size_t i = 0; i < n / 2; i++) ids[i] = (uint16_t)(rng() % 62710);
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_NONE);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, (const uint8_t *)ids, n, 2, &enc), ZB_OK);
    assert_true(enc.data[2] & BLOSC_MEMCPYED);
    assert_int_equal(enc.len, n + BLOSC_MAX_OVERHEAD);
    const uint8_t *plain = NULL;
    assert_int_equal(zb__blosc_plain(enc.data, enc.len, n, &plain, "X/indices/c/7"), ZB_OK);
    assert_ptr_equal(plain, enc.data + 16);
    assert_memory_equal(plain, ids, n);

    /* A compressed frame: not a plain copy, decoded by blosc as before. */
    uint8_t *floats = make_floats(2048);
    zb__buf comp = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, floats, 2048 * 4, 4, &comp), ZB_OK);
    assert_false(comp.data[2] & BLOSC_MEMCPYED);
    plain = (const uint8_t *)1;
    assert_int_equal(zb__blosc_plain(comp.data, comp.len, 2048 * 4, &plain, "k"), ZB_OK);
    assert_null(plain);

    /* Lies, each failing here and in the decoder alike. */
    uint8_t *copy = malloc(enc.len);
    assert_non_null(copy);
    struct {
        size_t at, len; /* the frame's bytes [at, at + len) from `copy` */
        zb_status want;
        const char *names;
    } lies[] = {
        {0, enc.len, ZB_E_CORRUPT, "nbytes"},         /* nbytes 2 short of the unit's */
        {0, enc.len, ZB_E_CORRUPT, "cbytes"},         /* cbytes 2 short of the length */
        {0, enc.len, ZB_E_TRUNCATED, "cbytes"},       /* cbytes 100 past the length */
        {0, enc.len - 2, ZB_E_CORRUPT, "plain-copy"}, /* cut by 2, cbytes saying so */
    };
    for (size_t k = 0; k < sizeof lies / sizeof lies[0]; k++) {
        memcpy(copy, enc.data, enc.len);
        if (k == 0) put_le32(copy + 4, (uint32_t)n - 2);
        if (k == 1) put_le32(copy + 12, (uint32_t)enc.len - 2);
        if (k == 2) put_le32(copy + 12, (uint32_t)enc.len + 100);
        if (k == 3) put_le32(copy + 12, (uint32_t)enc.len - 2);
        plain = NULL;
        assert_int_equal(zb__blosc_plain(copy, lies[k].len, n, &plain, "X/indices/c/7"),
                         lies[k].want);
        assert_null(plain);
        assert_error_names("X/indices/c/7");
        assert_error_names(lies[k].names);
        assert_int_equal(decode_exact(&c, NULL, copy, lies[k].len, n, n, NULL, NULL), lies[k].want);
    }
    /* A compressed frame flagged as a plain copy: its length is not nbytes + 16. */
    comp.data[2] |= BLOSC_MEMCPYED;
    assert_int_equal(zb__blosc_plain(comp.data, comp.len, 2048 * 4, &plain, "k"), ZB_E_CORRUPT);
    assert_int_equal(decode_exact(&c, NULL, comp.data, comp.len, 2048 * 4, 2048 * 4, NULL, NULL),
                     ZB_E_CORRUPT);
    free(copy);
    free(floats);
    free(ids);
    zb__buf_free(&comp);
    zb__buf_free(&enc);
}

static void
test_blosc_typesize_differs_from_dtype(void **state)
{
    (void)state;
    /* A typesize of 8 on a <f4 array (newer numcodecs accepts one), including a length that is
     * not a multiple of 8: the header carries the typesize, so decoding needs nothing else. */
    const size_t counts[] = {1000, 1001};
    for (size_t i = 0; i < 2; i++) {
        size_t n = counts[i] * 4;
        uint8_t *data = make_floats(counts[i]);
        zb__codec c = blosc_codec("zstd", 5, ZB_SHUFFLE_BYTE);
        c.typesize = 8;
        zb__buf enc = {0};
        roundtrip(&c, NULL, data, n, 4, &enc);
        assert_int_equal(enc.data[3], 8);
        /* Decoding with a codec that says nothing about typesize. */
        zb__codec plain = blosc_codec("lz4", 5, ZB_SHUFFLE_NONE);
        uint8_t *out = NULL;
        assert_int_equal(decode_exact(&plain, NULL, enc.data, enc.len, n, n, NULL, &out), ZB_OK);
        assert_memory_equal(out, data, n);
        free(out);
        zb__buf_free(&enc);
        free(data);
    }
}

static void
test_blosc_random_garbage(void **state)
{
    (void)state;
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_BYTE);
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    uint8_t buf[600];
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = rng() % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rng();
        size_t expected = rng() % 2048;
        if (len >= 16 && (iter & 1)) {
            /* A header that passes the length checks, so the decompressor itself is reached. */
            buf[0] = (uint8_t)(1 + rng() % 2);
            put_le32(buf + 4, (uint32_t)expected);
            if (iter & 2) put_le32(buf + 8, rng() % 4096);
            put_le32(buf + 12, (uint32_t)len);
        }
        size_t got = 0;
        zb_status st = decode_exact(&c, ctx, buf, len, expected, expected, &got, NULL);
        if (st == ZB_OK) assert_int_equal(got, expected);
    }
    zb_ctx_free(ctx);
}

/* ---------------------------------------------------------------------------------------------
 * gzip and zlib (FORMATS §2.5, §9 row 15).
 * ------------------------------------------------------------------------------------------- */

static void
test_gzip_members_and_mtime(void **state)
{
    (void)state;
    size_t n = 5000 * 4;
    uint8_t *data = make_floats(5000);
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 1);
    zb__buf a = {0}, b = {0};
    size_t split = 1234 * 4;
    assert_int_equal(zb__codec_encode(&g, NULL, data, split, 4, &a), ZB_OK);
    assert_int_equal(zb__codec_encode(&g, NULL, data + split, n - split, 4, &b), ZB_OK);
    /* Python's gzip writes the wall clock as MTIME; the CRC covers data only. */
    put_le32(a.data + 4, 0x6b0e6467u);
    put_le32(b.data + 4, 0x6b0e6468u);
    assert_int_equal(zb__buf_append(&a, b.data, b.len), ZB_OK);

    uint8_t *out = NULL;
    size_t got = 0;
    assert_int_equal(decode_exact(&g, NULL, a.data, a.len, n, n, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    assert_memory_equal(out, data, n);
    free(out);
    assert_int_equal(decode_exact(&g, NULL, a.data, a.len, n + 10, SIZE_MAX, &got, &out), ZB_OK);
    assert_int_equal(got, n);
    free(out);
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&g, a.data, a.len, &declared, "k"), ZB_OK);
    assert_int_equal(declared, n);
    /* The first member alone is short of the expected size. */
    assert_int_equal(decode_exact(&g, NULL, a.data, a.len - b.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    /* Expecting less than the members hold. */
    assert_int_equal(decode_exact(&g, NULL, a.data, a.len, n - 1, n - 1, NULL, NULL), ZB_E_CORRUPT);
    /* Garbage after the last member. */
    assert_int_equal(zb__buf_append(&a, "xy", 2), ZB_OK);
    assert_int_not_equal(decode_exact(&g, NULL, a.data, a.len, n, n, NULL, NULL), ZB_OK);
    assert_error_names("offset");
    zb__buf_free(&a);
    zb__buf_free(&b);
    free(data);
}

static void
test_gzip_bad_crc_and_isize(void **state)
{
    (void)state;
    size_t n = 3000 * 4;
    uint8_t *data = make_floats(3000);
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 6);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&g, NULL, data, n, 4, &enc), ZB_OK);
    enc.data[enc.len - 8] ^= 0x01; /* CRC-32, first byte */
    assert_int_equal(decode_exact(&g, NULL, enc.data, enc.len, n, n, NULL, NULL), ZB_E_CHECKSUM);
    assert_error_names("CRC-32");
    assert_error_names("c/0/3");
    enc.data[enc.len - 8] ^= 0x01;
    enc.data[enc.len - 1] ^= 0x80; /* ISIZE, last byte */
    assert_int_equal(decode_exact(&g, NULL, enc.data, enc.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("ISIZE");
    enc.data[enc.len - 1] ^= 0x80;
    assert_int_equal(decode_exact(&g, NULL, enc.data, enc.len, n, n, NULL, NULL), ZB_OK);
    zb__buf_free(&enc);
    free(data);
}

static void
test_gzip_zlib_never_confused(void **state)
{
    (void)state;
    size_t n = 1000 * 4;
    uint8_t *data = make_floats(1000);
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 1);
    zb__codec z = simple_codec(ZB_CODEC_ZLIB, 1);
    zb__buf gz = {0}, zl = {0};
    assert_int_equal(zb__codec_encode(&g, NULL, data, n, 4, &gz), ZB_OK);
    assert_int_equal(zb__codec_encode(&z, NULL, data, n, 4, &zl), ZB_OK);
    assert_int_equal(decode_exact(&z, NULL, gz.data, gz.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("gzip");
    assert_error_names("c/0/3");
    assert_int_equal(decode_exact(&g, NULL, zl.data, zl.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("zlib");
    /* zlib's own checks: Adler-32 and trailing bytes. */
    zl.data[zl.len - 1] ^= 0x01;
    assert_int_equal(decode_exact(&z, NULL, zl.data, zl.len, n, n, NULL, NULL), ZB_E_CHECKSUM);
    assert_error_names("Adler-32");
    zl.data[zl.len - 1] ^= 0x01;
    assert_int_equal(zb__buf_append(&zl, "\0", 1), ZB_OK);
    assert_int_equal(decode_exact(&z, NULL, zl.data, zl.len, n, n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("trailing");
    zb__buf_free(&gz);
    zb__buf_free(&zl);
    free(data);
}

/* Appends one gzip member with every optional header field, built by hand (RFC 1952 §2.3). */
static void
append_gzip_member_all_flags(zb__buf *out, const uint8_t *data, size_t n)
{
    uint8_t hdr[64];
    size_t h = 0;
    const uint8_t fixed[10] = {0x1f, 0x8b, 0x08, 0x04 | 0x08 | 0x10 | 0x02, 0x67, 0x64, 0x0e,
                               0x6b, 0x00, 0x03};
    memcpy(hdr, fixed, sizeof fixed);
    h = sizeof fixed;
    const uint8_t extra[] = {6, 0, 'Z', 'B', 2, 0, 0xAA, 0x55}; /* XLEN 6: one subfield */
    memcpy(hdr + h, extra, sizeof extra);
    h += sizeof extra;
    memcpy(hdr + h, "chunk.bin", 10); /* FNAME with its NUL */
    h += 10;
    memcpy(hdr + h, "by hand", 8); /* FCOMMENT */
    h += 8;
    uint32_t hcrc = libdeflate_crc32(0, hdr, h); /* FHCRC: low 16 bits of the header CRC */
    hdr[h++] = (uint8_t)hcrc;
    hdr[h++] = (uint8_t)(hcrc >> 8);
    assert_int_equal(zb__buf_append(out, hdr, h), ZB_OK);

    struct libdeflate_compressor *c = libdeflate_alloc_compressor(6);
    size_t bound = libdeflate_deflate_compress_bound(c, n);
    uint8_t *defl = malloc(bound);
    size_t dl = libdeflate_deflate_compress(c, data, n, defl, bound);
    assert_true(dl > 0);
    libdeflate_free_compressor(c);
    assert_int_equal(zb__buf_append(out, defl, dl), ZB_OK);
    free(defl);
    uint8_t trailer[8];
    put_le32(trailer, libdeflate_crc32(0, data, n));
    put_le32(trailer + 4, (uint32_t)n);
    assert_int_equal(zb__buf_append(out, trailer, sizeof trailer), ZB_OK);
}

static void
test_gzip_optional_header_fields(void **state)
{
    (void)state;
    size_t n = 2500 * 4;
    uint8_t *data = make_floats(2500);
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 1);
    zb__buf m = {0};
    append_gzip_member_all_flags(&m, data, n);
    uint8_t *out = NULL;
    size_t got = 0;
    assert_int_equal(decode_exact(&g, NULL, m.data, m.len, n, n, &got, &out), ZB_OK);
    assert_memory_equal(out, data, n);
    free(out);
    /* Followed by a plain member. */
    zb__buf plain = {0};
    assert_int_equal(zb__codec_encode(&g, NULL, data, n, 4, &plain), ZB_OK);
    assert_int_equal(zb__buf_append(&m, plain.data, plain.len), ZB_OK);
    assert_int_equal(decode_exact(&g, NULL, m.data, m.len, 2 * n, 2 * n, &got, &out), ZB_OK);
    assert_memory_equal(out, data, n);
    assert_memory_equal(out + n, data, n);
    free(out);
    /* Reserved FLG bits are refused. */
    m.data[3] |= 0x20;
    assert_int_equal(decode_exact(&g, NULL, m.data, m.len, 2 * n, 2 * n, NULL, NULL), ZB_E_CORRUPT);
    assert_error_names("FLG");
    /* An FNAME without its NUL: the header runs off the end. */
    zb__buf cut = {0};
    assert_int_equal(zb__buf_append(&cut, m.data, 10 + 8 + 4), ZB_OK);
    cut.data[3] &= (uint8_t)~0x20;
    assert_int_equal(decode_exact(&g, NULL, cut.data, cut.len, n, n, NULL, NULL), ZB_E_TRUNCATED);
    assert_error_names("FNAME");
    zb__buf_free(&cut);
    zb__buf_free(&plain);
    zb__buf_free(&m);
    free(data);
}

/* ---------------------------------------------------------------------------------------------
 * Every decoder against truncation and damage (§9 row 16).
 * ------------------------------------------------------------------------------------------- */

static zb__codec
all_codecs(size_t i)
{
    switch (i) {
    case 0:
        return blosc_codec("lz4", 5, ZB_SHUFFLE_BYTE);
    case 1:
        return blosc_codec("zstd", 3, ZB_SHUFFLE_BIT);
    case 2: {
        zb__codec c = simple_codec(ZB_CODEC_ZSTD, 3);
        c.checksum = true;
        return c;
    }
    case 3:
        return simple_codec(ZB_CODEC_ZSTD, 1);
    case 4:
        return simple_codec(ZB_CODEC_LZ4, 0);
    case 5:
        return simple_codec(ZB_CODEC_GZIP, 1);
    case 6:
        return simple_codec(ZB_CODEC_ZLIB, 6);
    default:
        return simple_codec(ZB_CODEC_CRC32C, 0);
    }
}
#define N_ALL_CODECS 8

static void
test_every_prefix_is_an_error(void **state)
{
    (void)state;
    /* Small enough to try every prefix; blosc gets one real (non-memcpyed) block. */
    size_t n = 300 * 4;
    uint8_t *data = make_floats(300);
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    zb__buf enc = {0};
    for (size_t i = 0; i < N_ALL_CODECS; i++) {
        zb__codec c = all_codecs(i);
        assert_int_equal(zb__codec_encode(&c, ctx, data, n, 4, &enc), ZB_OK);
        for (size_t k = 0; k < enc.len; k++) {
            zb_status st = decode_exact(&c, ctx, enc.data, k, n, n, NULL, NULL);
            if (st == ZB_OK) fail_msg("codec %zu: a %zu-byte prefix of %zu decoded", i, k, enc.len);
            assert_true(st == ZB_E_TRUNCATED || st == ZB_E_CORRUPT || st == ZB_E_CHECKSUM);
            assert_error_names("c/0/3");
            st = decode_exact(&c, ctx, enc.data, k, n, SIZE_MAX, NULL, NULL);
            /* Without a size, crc32c has no way to tell: any prefix whose last 4 bytes are the
             * CRC of the bytes before is a valid encoding (4 zero bytes encode the empty chunk,
             * and this data starts with zeros). */
            if (st == ZB_OK && c.id != ZB_CODEC_CRC32C)
                fail_msg("codec %zu: a %zu-byte prefix decoded without a size", i, k);
        }
        assert_int_equal(decode_exact(&c, ctx, enc.data, enc.len, n, n, NULL, NULL), ZB_OK);
    }
    zb__buf_free(&enc);
    zb_ctx_free(ctx);
    free(data);
}

static void
test_mutated_buffers_never_crash(void **state)
{
    (void)state;
    size_t n = 700 * 4;
    uint8_t *data = make_floats(700);
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    zb__buf enc = {0};
    for (size_t i = 0; i < N_ALL_CODECS; i++) {
        zb__codec c = all_codecs(i);
        assert_int_equal(zb__codec_encode(&c, ctx, data, n, 4, &enc), ZB_OK);
        uint8_t *m = malloc(enc.len);
        for (int iter = 0; iter < 3000; iter++) {
            memcpy(m, enc.data, enc.len);
            int flips = 1 + (int)(rng() % 4);
            for (int f = 0; f < flips; f++) m[rng() % enc.len] ^= (uint8_t)(1 + rng() % 255);
            size_t got = 0;
            zb_status st = decode_exact(&c, ctx, m, enc.len, n, n, &got, NULL);
            if (st == ZB_OK)
                assert_int_equal(got, n);
            else
                assert_error_names("c/0/3");
            st = decode_exact(&c, ctx, m, enc.len, n, SIZE_MAX, &got, NULL);
            if (st == ZB_OK) assert_true(got <= n);
        }
        free(m);
    }
    zb__buf_free(&enc);
    zb_ctx_free(ctx);
    free(data);
}

/* A frame declaring more than ZB_MAX_EXPANSION times its size is refused before anything is
 * allocated (a 36-byte chunk once declared 1.6 GB); the most compressible real frames, zeros
 * through zstd (~32,500x) and LZ4 (255x), stay below the bound and decode. */
static void
test_declared_size_is_bounded_by_frame_size(void **state)
{
    (void)state;
    size_t n = (size_t)16 << 20;
    uint8_t *zeros = calloc(n, 1);
    assert_non_null(zeros);
    zb__codec codecs[] = {simple_codec(ZB_CODEC_ZSTD, 3), simple_codec(ZB_CODEC_LZ4, 1),
                          simple_codec(ZB_CODEC_GZIP, 9)};
    for (size_t k = 0; k < sizeof codecs / sizeof codecs[0]; k++) {
        zb__buf enc = {0};
        assert_int_equal(zb__codec_encode(&codecs[k], NULL, zeros, n, 1, &enc), ZB_OK);
        size_t declared = 0;
        assert_int_equal(zb__codec_decoded_size(&codecs[k], enc.data, enc.len, &declared, "z/0"),
                         ZB_OK);
        assert_int_equal(declared, n);
        assert_true(declared <= zb__codec_max_decoded(enc.len));
        zb__buf_free(&enc);
    }
    free(zeros);
    /* numcodecs' LZ4 framing: a u32le size prefix, then the block; 12 bytes declaring 1 GiB */
    uint8_t lz4[12] = {0, 0, 0, 0x40, 0x1f, 0, 1, 0, 0, 0, 0, 0};
    zb__codec c = simple_codec(ZB_CODEC_LZ4, 1);
    size_t declared = 0;
    assert_int_equal(zb__codec_decoded_size(&c, lz4, sizeof lz4, &declared, "obs/ct/0"),
                     ZB_E_CORRUPT);
    assert_error_names("obs/ct/0");
    assert_error_names("declares 1073741824 decoded bytes");
    assert_int_equal(zb__codec_max_decoded(SIZE_MAX / 2), SIZE_MAX);
}

static void
test_error_messages_name_where(void **state)
{
    (void)state;
    const char *names[N_ALL_CODECS] = {"blosc", "blosc", "zstd", "zstd",
                                       "lz4",   "gzip",  "zlib", "crc32c"};
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(0x5A ^ i);
    for (size_t i = 0; i < N_ALL_CODECS; i++) {
        zb__codec c = all_codecs(i);
        uint8_t out[128];
        size_t got = 0;
        zb_clear_error();
        zb_status st = zb__codec_decode(&c, NULL, junk, sizeof junk, out, sizeof out, sizeof out,
                                        &got, "arr/c/7/1");
        assert_int_not_equal(st, ZB_OK);
        assert_error_names("arr/c/7/1");
        assert_error_names(names[i]);
    }
    /* The crc32c codec's own statuses. */
    zb__codec k = simple_codec(ZB_CODEC_CRC32C, 0);
    uint8_t out[64];
    assert_int_equal(zb__codec_decode(&k, NULL, junk, 3, out, sizeof out, SIZE_MAX, NULL, "x/0"),
                     ZB_E_TRUNCATED);
    assert_error_names("x/0");
    assert_int_equal(zb__codec_decode(&k, NULL, junk, 20, out, 16, 16, NULL, "x/1"), ZB_E_CHECKSUM);
    assert_error_names("x/1");
    assert_error_names("offset 16");
}

/* ---------------------------------------------------------------------------------------------
 * Dispatcher, encoder arguments, context.
 * ------------------------------------------------------------------------------------------- */

static void
test_dispatcher_arguments(void **state)
{
    (void)state;
    uint8_t raw[32], out[32];
    chunk32(raw);
    zb__codec c = simple_codec(ZB_CODEC_CRC32C, 0);
    zb__buf enc = {0};
    assert_int_equal(zb__codec_encode(&c, NULL, raw, 32, 4, &enc), ZB_OK);
    size_t got = 0;
    /* Room below the expected size is the caller's mistake. */
    assert_int_equal(zb__codec_decode(&c, NULL, enc.data, enc.len, out, 31, 32, &got, "k"),
                     ZB_E_INVALID);
    assert_int_equal(zb__codec_decode(&c, NULL, NULL, 5, out, 32, 32, &got, "k"), ZB_E_INVALID);
    zb__codec bad = {.id = (zb__codec_id)99};
    assert_int_equal(zb__codec_decode(&bad, NULL, enc.data, enc.len, out, 32, 32, &got, "k"),
                     ZB_E_INVALID);
    assert_int_equal(zb__codec_encode(&bad, NULL, raw, 32, 4, &enc), ZB_E_INVALID);
    /* In-place decoding of crc32c (dst == src). */
    assert_int_equal(
        zb__codec_decode(&c, NULL, enc.data, enc.len, enc.data, enc.len, 32, &got, "k"), ZB_OK);
    assert_memory_equal(enc.data, raw, 32);

    /* Encoder parameters outside their ranges. */
    zb__codec b = blosc_codec("nope", 5, 1);
    assert_int_equal(zb__codec_encode(&b, NULL, raw, 32, 4, &enc), ZB_E_UNSUPPORTED);
    b = blosc_codec("lz4", 10, 1);
    assert_int_equal(zb__codec_encode(&b, NULL, raw, 32, 4, &enc), ZB_E_INVALID);
    b = blosc_codec("lz4", 5, 7);
    assert_int_equal(zb__codec_encode(&b, NULL, raw, 32, 4, &enc), ZB_E_INVALID);
    zb__codec z = simple_codec(ZB_CODEC_ZSTD, 1000);
    assert_int_equal(zb__codec_encode(&z, NULL, raw, 32, 4, &enc), ZB_E_INVALID);
    zb__codec g = simple_codec(ZB_CODEC_GZIP, 10);
    assert_int_equal(zb__codec_encode(&g, NULL, raw, 32, 4, &enc), ZB_E_INVALID);
    assert_int_equal(enc.len, 0);
    zb__buf_free(&enc);
}

static void
test_describe(void **state)
{
    (void)state;
    char buf[64];
    zb__codec c = blosc_codec("lz4", 5, ZB_SHUFFLE_BYTE);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "blosc(lz4,5,shuffle)");
    c = blosc_codec("zstd", 3, ZB_SHUFFLE_BIT);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "blosc(zstd,3,bitshuffle)");
    c = simple_codec(ZB_CODEC_ZSTD, 3);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "zstd(3)");
    c.checksum = true;
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "zstd(3,checksum)");
    c = simple_codec(ZB_CODEC_GZIP, 1);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "gzip(1)");
    c = simple_codec(ZB_CODEC_ZLIB, 9);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "zlib(9)");
    c = simple_codec(ZB_CODEC_LZ4, 0);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "lz4(1)");
    c = simple_codec(ZB_CODEC_CRC32C, 0);
    zb__codec_describe(&c, buf, sizeof buf);
    assert_string_equal(buf, "crc32c");
    /* Truncates rather than overflows. */
    c = blosc_codec("blosclz", 9, ZB_SHUFFLE_NONE);
    zb__codec_describe(&c, buf, 8);
    assert_string_equal(buf, "blosc(b");
}

static void
test_ctx_lifecycle_and_stats(void **state)
{
    (void)state;
    zb_ctx_free(NULL);
    zb_ctx *ctx = NULL;
    assert_int_equal(zb_ctx_new(&ctx), ZB_OK);
    assert_non_null(ctx);
    zb_ctx_stats s;
    memset(&s, 0xFF, sizeof s);
    zb_ctx_get_stats(ctx, &s);
    assert_int_equal(s.chunks_decoded, 0);
    assert_int_equal(s.bytes_decoded, 0);
    /* Use every lazily made context and scratch buffer, so that free has them all to release. */
    uint8_t raw[32], out[32];
    chunk32(raw);
    zb__buf enc = {0};
    for (size_t i = 0; i < N_ALL_CODECS; i++) {
        zb__codec c = all_codecs(i);
        assert_int_equal(zb__codec_encode(&c, ctx, raw, 32, 4, &enc), ZB_OK);
        assert_int_equal(zb__codec_decode(&c, ctx, enc.data, enc.len, out, 32, 32, NULL, "k"),
                         ZB_OK);
        assert_memory_equal(out, raw, 32);
    }
    assert_non_null(ctx->zstd_dctx);
    assert_non_null(ctx->zstd_cctx);
    assert_non_null(ctx->deflate_d);
    /* every named workspace is freed with the context (the ASan tier checks the leak) */
    zb__buf *ws[] = {&ctx->ws.enc,   &ctx->ws.stage[0], &ctx->ws.stage[1], &ctx->ws.decoded,
                     &ctx->ws.items, &ctx->ws.unit,     &ctx->ws.fetch,    &ctx->ws.packed};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        assert_int_equal(zb__buf_reserve(ws[i], 1000), ZB_OK);
    /* The codec layer leaves statistics to the array layer. */
    zb_ctx_get_stats(ctx, &s);
    assert_int_equal(s.bytes_decoded, 0);
    assert_int_equal(s.chunks_decoded, 0);
    ctx->stats.bytes_decoded = 7;
    ctx->stats.range_reads = 3;
    zb_ctx_get_stats(ctx, &s);
    assert_int_equal(s.bytes_decoded, 7);
    assert_int_equal(s.range_reads, 3);
    zb_ctx_reset_stats(ctx);
    zb_ctx_get_stats(ctx, &s);
    assert_int_equal(s.bytes_decoded, 0);
    assert_int_equal(s.range_reads, 0);
    zb_ctx_reset_stats(NULL);
    zb__buf_free(&enc);
    zb_ctx_free(ctx);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_check_value),
        cmocka_unit_test(test_crc32c_matches_bitwise),
        cmocka_unit_test(test_roundtrip_blosc),
        cmocka_unit_test(test_roundtrip_zstd),
        cmocka_unit_test(test_roundtrip_lz4_gzip_zlib_crc32c),
        cmocka_unit_test(test_roundtrip_empty),
        cmocka_unit_test(test_golden_blosc),
        cmocka_unit_test(test_golden_zstd),
        cmocka_unit_test(test_golden_lz4),
        cmocka_unit_test(test_golden_gzip_zlib),
        cmocka_unit_test(test_zstd_frame_without_content_size),
        cmocka_unit_test(test_zstd_concatenated_frames),
        cmocka_unit_test(test_zstd_size_mismatch_and_checksum),
        cmocka_unit_test(test_lz4_framing_errors),
        cmocka_unit_test(test_blosc_header_checks),
        cmocka_unit_test(test_blosc_plain_copy),
        cmocka_unit_test(test_blosc_typesize_differs_from_dtype),
        cmocka_unit_test(test_blosc_random_garbage),
        cmocka_unit_test(test_gzip_members_and_mtime),
        cmocka_unit_test(test_gzip_bad_crc_and_isize),
        cmocka_unit_test(test_gzip_zlib_never_confused),
        cmocka_unit_test(test_gzip_optional_header_fields),
        cmocka_unit_test(test_every_prefix_is_an_error),
        cmocka_unit_test(test_mutated_buffers_never_crash),
        cmocka_unit_test(test_error_messages_name_where),
        cmocka_unit_test(test_declared_size_is_bounded_by_frame_size),
        cmocka_unit_test(test_dispatcher_arguments),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_ctx_lifecycle_and_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
