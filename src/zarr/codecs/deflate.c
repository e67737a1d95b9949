/* The gzip (RFC 1952) and zlib (RFC 1950) codecs through libdeflate (FORMATS §2.5).
 *
 * The two are distinct codec ids and neither is ever taken for the other. libdeflate decodes
 * one gzip member per call and skips every optional header field, so the gzip decoder loops
 * over concatenated members. libdeflate reports every failure as "bad data"; when one occurs
 * the member is taken apart here (header fields, raw deflate, trailer) only to say what is
 * wrong and where. */
#include <libdeflate.h>
#include <stdlib.h>
#include <string.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

/* RFC 1952 FLG bits. */
enum { FHCRC = 0x02, FEXTRA = 0x04, FNAME = 0x08, FCOMMENT = 0x10, FRESERVED = 0xE0 };
#define GZIP_FIXED_HEADER 10
#define GZIP_TRAILER 8
/* DEFLATE expands by at most 1032:1 (a 258-byte match per ~2 bits), so no honest member
 * decodes to more than this many bytes per input byte. */
#define DEFLATE_MAX_RATIO 1032u

static uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t
load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static zb_status
decompressor_get(zb_ctx *ctx, struct libdeflate_decompressor **out)
{
    if (!ctx->deflate_d) {
        ctx->deflate_d = libdeflate_alloc_decompressor();
        if (!ctx->deflate_d)
            return zb__err(ZB_E_NOMEM, "cannot allocate a libdeflate decompressor");
    }
    *out = ctx->deflate_d;
    return ZB_OK;
}

/* The length of the gzip member header at p (n bytes left, `off` its offset in the object). */
static zb_status
gzip_header_len(const uint8_t *p, size_t n, size_t off, size_t *hdr, const char *where)
{
    if (n < 2 || p[0] != 0x1f || p[1] != 0x8b) {
        if (n < 2)
            return zb__err(ZB_E_TRUNCATED,
                           "%s: gzip member at offset %zu: %zu bytes, no room for the magic", where,
                           off, n);
        /* A zlib stream begins CMF=0x?8 with (CMF*256+FLG) % 31 == 0. */
        bool zlib_like = (p[0] & 0x0f) == 8 && ((unsigned)p[0] * 256u + p[1]) % 31u == 0;
        return zb__err(
            ZB_E_CORRUPT, "%s: not a gzip member: bytes %02x %02x at offset %zu (want 1f 8b)%s",
            where, p[0], p[1], off,
            zlib_like ? "; this looks like a zlib stream, but the codec id is gzip" : "");
    }
    if (n < GZIP_FIXED_HEADER)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: gzip member at offset %zu: header cut off after %zu bytes", where, off,
                       n);
    if (p[2] != 8)
        return zb__err(ZB_E_CORRUPT, "%s: gzip CM %u at offset %zu is not deflate (8)", where, p[2],
                       off + 2);
    unsigned flg = p[3];
    if (flg & FRESERVED)
        return zb__err(ZB_E_CORRUPT, "%s: gzip FLG 0x%02x at offset %zu has reserved bits set",
                       where, flg, off + 3);
    size_t pos = GZIP_FIXED_HEADER;
    if (flg & FEXTRA) {
        if (n - pos < 2)
            return zb__err(ZB_E_TRUNCATED, "%s: gzip FEXTRA length at offset %zu is cut off", where,
                           off + pos);
        size_t xlen = (size_t)p[pos] | (size_t)p[pos + 1] << 8;
        pos += 2;
        if (n - pos < xlen)
            return zb__err(ZB_E_TRUNCATED,
                           "%s: gzip extra field of %zu bytes at offset %zu is cut off", where,
                           xlen, off + pos);
        pos += xlen;
    }
    for (unsigned bit = FNAME; bit <= FCOMMENT; bit <<= 1) {
        if (!(flg & bit)) continue;
        const uint8_t *nul = memchr(p + pos, 0, n - pos);
        if (!nul)
            return zb__err(ZB_E_TRUNCATED, "%s: gzip %s at offset %zu has no terminating NUL",
                           where, bit == FNAME ? "FNAME" : "FCOMMENT", off + pos);
        pos = (size_t)(nul - p) + 1;
    }
    if (flg & FHCRC) {
        if (n - pos < 2)
            return zb__err(ZB_E_TRUNCATED, "%s: gzip header CRC at offset %zu is cut off", where,
                           off + pos);
        pos += 2;
    }
    *hdr = pos;
    return ZB_OK;
}

/* Says why libdeflate rejected the gzip member at p (n bytes left, at object offset `off`),
 * decoding its parts into out (room bytes) to find out. */
static zb_status
gzip_diagnose(struct libdeflate_decompressor *d, const uint8_t *p, size_t n, size_t off,
              uint8_t *out, size_t room, const char *where)
{
    size_t hdr = 0;
    ZB_TRY(gzip_header_len(p, n, off, &hdr, where));
    size_t in_used = 0, got = 0;
    enum libdeflate_result res =
        libdeflate_deflate_decompress_ex(d, p + hdr, n - hdr, out, room, &in_used, &got);
    if (res == LIBDEFLATE_INSUFFICIENT_SPACE)
        return zb__err(
            ZB_E_CORRUPT,
            "%s: gzip member at offset %zu decodes to more than the %zu bytes left for it", where,
            off, room);
    if (res != LIBDEFLATE_SUCCESS)
        return zb__err(
            ZB_E_CORRUPT,
            "%s: gzip member at offset %zu: invalid or truncated deflate data (from offset %zu)",
            where, off, off + hdr);
    size_t tpos = hdr + in_used;
    if (n - tpos < GZIP_TRAILER)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: gzip member at offset %zu: trailer at offset %zu is cut off", where,
                       off, off + tpos);
    uint32_t stored = load_le32(p + tpos);
    uint32_t computed = libdeflate_crc32(0, out, got);
    if (stored != computed)
        return zb__err(ZB_E_CHECKSUM,
                       "%s: gzip CRC-32 mismatch at offset %zu: stored 0x%08x, computed 0x%08x",
                       where, off + tpos, stored, computed);
    uint32_t isize = load_le32(p + tpos + 4);
    if (isize != (uint32_t)got)
        return zb__err(ZB_E_CORRUPT, "%s: gzip ISIZE %u at offset %zu != %zu decoded bytes", where,
                       isize, off + tpos + 4, got);
    return zb__err(ZB_E_CORRUPT, "%s: libdeflate rejects the gzip member at offset %zu", where,
                   off);
}

/* Decodes every member of src into dst (cap bytes); *total gets the bytes written. When
 * `grow` is set, running out of room returns ZB_E_OVERFLOW without a message, so that the
 * caller can retry with more. */
static zb_status
gzip_members(struct libdeflate_decompressor *d, const uint8_t *src, size_t src_len, uint8_t *dst,
             size_t cap, size_t *total, bool grow, const char *where)
{
    size_t in_off = 0, out_off = 0;
    if (src_len == 0) return zb__err(ZB_E_TRUNCATED, "%s: gzip input is empty", where);
    for (unsigned member = 0; in_off < src_len; member++) {
        size_t in_used = 0, got = 0;
        enum libdeflate_result res = libdeflate_gzip_decompress_ex(
            d, src + in_off, src_len - in_off, dst + out_off, cap - out_off, &in_used, &got);
        if (res == LIBDEFLATE_INSUFFICIENT_SPACE) {
            if (grow) return ZB_E_OVERFLOW;
            return zb__err(ZB_E_CORRUPT,
                           "%s: gzip member %u at offset %zu decodes past the %zu bytes expected",
                           where, member, in_off, cap);
        }
        if (res != LIBDEFLATE_SUCCESS)
            return gzip_diagnose(d, src + in_off, src_len - in_off, in_off, dst + out_off,
                                 cap - out_off, where);
        if (in_used == 0) /* cannot happen (a member is >= 18 bytes); never loop forever */
            return zb__err(ZB_E_CORRUPT, "%s: gzip member at offset %zu consumed no input", where,
                           in_off);
        in_off += in_used;
        out_off += got;
    }
    *total = out_off;
    return ZB_OK;
}

zb_status
zb__gzip_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec;
    struct libdeflate_decompressor *d = NULL;
    ZB_TRY(decompressor_get(ctx, &d));
    size_t total = 0;
    ZB_TRY(gzip_members(d, src, src_len, dst, cap, &total, false, where));
    if (expected != SIZE_MAX && total != expected)
        return zb__err(ZB_E_CORRUPT, "%s: gzip members decode to %zu bytes, expected %zu", where,
                       total, expected);
    *out_len = total;
    return ZB_OK;
}

/* The sum of the members' sizes is only known by finding where each member ends, which takes
 * decoding them: this decodes into a temporary buffer, grown from the last member's ISIZE up to
 * the deflate expansion bound. Meant for the rare chunk whose size metadata does not give. */
zb_status
zb__gzip_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    zb_status st;
    uint8_t *buf = NULL;
    struct libdeflate_decompressor *d = NULL;
    if (src_len < GZIP_FIXED_HEADER + GZIP_TRAILER) {
        size_t hdr = 0;
        ZB_TRY(gzip_header_len(src, src_len, 0, &hdr, where));
        return zb__err(ZB_E_TRUNCATED, "%s: gzip input of %zu bytes is shorter than a member",
                       where, src_len);
    }
    uint64_t bound64;
    if (!zb__mul_u64(src_len, DEFLATE_MAX_RATIO, &bound64) || bound64 > ZB_BUF_MAX)
        bound64 = ZB_BUF_MAX;
    size_t bound = (size_t)bound64;
    size_t cap = load_le32(src + src_len - 4);
    if (cap < 4096) cap = 4096;
    if (cap > bound) cap = bound;
    d = libdeflate_alloc_decompressor();
    if (!d) {
        st = zb__err(ZB_E_NOMEM, "cannot allocate a libdeflate decompressor");
        goto fail;
    }
    for (;;) {
        uint8_t *p = realloc(buf, cap);
        if (!p) {
            st = zb__err(ZB_E_NOMEM, "%s: cannot allocate %zu bytes to size a gzip chunk", where,
                         cap);
            goto fail;
        }
        buf = p;
        size_t total = 0;
        st = gzip_members(d, src, src_len, buf, cap, &total, true, where);
        if (st == ZB_OK) {
            *size = total;
            break;
        }
        if (st != ZB_E_OVERFLOW) goto fail;
        if (cap == bound) {
            st =
                zb__err(ZB_E_CORRUPT, "%s: gzip data decodes to more than %zu bytes", where, bound);
            goto fail;
        }
        cap = cap > bound / 2 ? bound : cap * 2;
    }
fail:
    free(buf);
    libdeflate_free_decompressor(d);
    return st;
}

/* Says why libdeflate rejected the zlib stream. */
static zb_status
zlib_diagnose(struct libdeflate_decompressor *d, const uint8_t *src, size_t src_len, uint8_t *dst,
              size_t cap, const char *where)
{
    if (src_len < 2)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: zlib stream of %zu bytes is shorter than its 2-byte header", where,
                       src_len);
    unsigned cmf = src[0], flg = src[1];
    if (cmf == 0x1f && flg == 0x8b)
        return zb__err(
            ZB_E_CORRUPT,
            "%s: zlib: bytes 1f 8b at offset 0 begin a gzip member, but the codec id is zlib",
            where);
    if ((cmf & 0x0f) != 8 || (cmf >> 4) > 7)
        return zb__err(ZB_E_CORRUPT,
                       "%s: zlib CMF 0x%02x at offset 0 is not deflate with a window <= 32 KiB",
                       where, cmf);
    if ((cmf * 256u + flg) % 31u != 0)
        return zb__err(ZB_E_CORRUPT,
                       "%s: zlib header check fails (CMF 0x%02x, FLG 0x%02x at offset 0)", where,
                       cmf, flg);
    if (flg & 0x20)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: zlib stream needs a preset dictionary (FDICT, offset 1)", where);
    size_t in_used = 0, got = 0;
    enum libdeflate_result res =
        libdeflate_deflate_decompress_ex(d, src + 2, src_len - 2, dst, cap, &in_used, &got);
    if (res == LIBDEFLATE_INSUFFICIENT_SPACE)
        return zb__err(ZB_E_CORRUPT, "%s: zlib stream decodes to more than %zu bytes", where, cap);
    if (res != LIBDEFLATE_SUCCESS)
        return zb__err(ZB_E_CORRUPT, "%s: zlib: invalid or truncated deflate data (from offset 2)",
                       where);
    size_t tpos = 2 + in_used;
    if (src_len - tpos < 4)
        return zb__err(ZB_E_TRUNCATED, "%s: zlib Adler-32 at offset %zu is cut off", where, tpos);
    uint32_t stored = load_be32(src + tpos);
    uint32_t computed = libdeflate_adler32(1, dst, got);
    if (stored != computed)
        return zb__err(ZB_E_CHECKSUM,
                       "%s: zlib Adler-32 mismatch at offset %zu: stored 0x%08x, computed 0x%08x",
                       where, tpos, stored, computed);
    return zb__err(ZB_E_CORRUPT, "%s: libdeflate rejects the zlib stream", where);
}

zb_status
zb__zlib_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec;
    struct libdeflate_decompressor *d = NULL;
    ZB_TRY(decompressor_get(ctx, &d));
    size_t in_used = 0, got = 0;
    enum libdeflate_result res =
        libdeflate_zlib_decompress_ex(d, src, src_len, dst, cap, &in_used, &got);
    if (res == LIBDEFLATE_INSUFFICIENT_SPACE)
        return zb__err(ZB_E_CORRUPT, "%s: zlib stream decodes to more than %zu bytes", where, cap);
    if (res != LIBDEFLATE_SUCCESS) return zlib_diagnose(d, src, src_len, dst, cap, where);
    /* Python's zlib ignores bytes after the stream; nothing honest writes them, so they are
     * treated as damage rather than silently dropped. */
    if (in_used != src_len)
        return zb__err(ZB_E_CORRUPT, "%s: %zu trailing bytes after the zlib stream (offset %zu)",
                       where, src_len - in_used, in_used);
    if (expected != SIZE_MAX && got != expected)
        return zb__err(ZB_E_CORRUPT, "%s: zlib stream decodes to %zu bytes, expected %zu", where,
                       got, expected);
    *out_len = got;
    return ZB_OK;
}

zb_status
zb__zlib_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    (void)src;
    (void)src_len;
    (void)size;
    return zb__err(ZB_E_UNSUPPORTED, "%s: a zlib stream does not record its decoded size", where);
}

/* Compresses with a fresh libdeflate compressor: encoding is the write path, where its
 * allocation is small next to the work, and zb_ctx has no slot to keep one. */
static zb_status
deflate_encode(const zb__codec *codec, const uint8_t *src, size_t src_len, zb__buf *out)
{
    bool gzip = codec->id == ZB_CODEC_GZIP;
    const char *name = gzip ? "gzip" : "zlib";
    /* -1 is zlib's "default level", 6. libdeflate accepts 0..12, but the codecs' JSON is the
     * zlib scale 0..9, so 10..12 are refused rather than silently used. */
    int level = codec->level == -1 ? 6 : codec->level;
    if (level < 0 || level > 9)
        return zb__err(ZB_E_INVALID, "%s encode: level %d is outside 0..9", name, codec->level);
    zb_status st = ZB_OK;
    struct libdeflate_compressor *c = libdeflate_alloc_compressor(level);
    if (!c) return zb__err(ZB_E_NOMEM, "%s encode: cannot allocate a libdeflate compressor", name);
    size_t bound = gzip ? libdeflate_gzip_compress_bound(c, src_len)
                        : libdeflate_zlib_compress_bound(c, src_len);
    out->len = 0;
    st = zb__buf_reserve(out, bound);
    if (st != ZB_OK) goto fail;
    /* libdeflate writes MTIME 0, XFL from the level and OS 255: reproducible output. */
    size_t n = gzip ? libdeflate_gzip_compress(c, src, src_len, out->data, bound)
                    : libdeflate_zlib_compress(c, src, src_len, out->data, bound);
    if (n == 0) {
        st = zb__err(ZB_E_INVALID, "%s encode of %zu bytes did not fit its bound", name, src_len);
        goto fail;
    }
    out->len = n;
fail:
    libdeflate_free_compressor(c);
    return st;
}

zb_status
zb__gzip_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                size_t itemsize, zb__buf *out)
{
    (void)ctx;
    (void)itemsize;
    return deflate_encode(codec, src, src_len, out);
}

zb_status
zb__zlib_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                size_t itemsize, zb__buf *out)
{
    (void)ctx;
    (void)itemsize;
    return deflate_encode(codec, src, src_len, out);
}
