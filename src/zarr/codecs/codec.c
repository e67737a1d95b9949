/* The bytes->bytes codec dispatcher and the per-thread codec context.
 *
 * Each codec lives in its own file (blosc.c, zstd.c, lz4.c, deflate.c, crc32c.c) behind three
 * entry points of one shape; this file checks the caller's arguments once, so the codecs may
 * assume them: src is readable for src_len bytes, dst writable for `cap` bytes, and `expected`
 * is either SIZE_MAX or equal to `cap`. */
#include <libdeflate.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

/* The codec entry points. Each codec file repeats its own three prototypes; the signatures are
 * identical for every codec so that the table below catches a mismatch in this file at least. */
typedef zb_status (*decode_fn)(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src,
                               size_t src_len, uint8_t *dst, size_t cap, size_t expected,
                               size_t *out_len, const char *where);
typedef zb_status (*size_fn)(const uint8_t *src, size_t src_len, size_t *size, const char *where);
typedef zb_status (*encode_fn)(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src,
                               size_t src_len, size_t itemsize, zb__buf *out);

typedef struct codec_ops {
    const char *name;
    decode_fn decode;
    size_fn decoded_size;
    encode_fn encode;
} codec_ops;

/* Indexed by zb__codec_id. */
static const codec_ops ops_table[] = {
    [ZB_CODEC_BLOSC] = {"blosc", zb__blosc_decode, zb__blosc_decoded_size, zb__blosc_encode},
    [ZB_CODEC_ZSTD] = {"zstd", zb__zstd_decode, zb__zstd_decoded_size, zb__zstd_encode},
    [ZB_CODEC_LZ4] = {"lz4", zb__lz4_decode, zb__lz4_decoded_size, zb__lz4_encode},
    [ZB_CODEC_GZIP] = {"gzip", zb__gzip_decode, zb__gzip_decoded_size, zb__gzip_encode},
    [ZB_CODEC_ZLIB] = {"zlib", zb__zlib_decode, zb__zlib_decoded_size, zb__zlib_encode},
    [ZB_CODEC_CRC32C] = {"crc32c", zb__crc32c_decode, zb__crc32c_decoded_size, zb__crc32c_encode},
};

static const codec_ops *
lookup(const zb__codec *codec)
{
    if (!codec || (unsigned)codec->id >= sizeof ops_table / sizeof ops_table[0]) return NULL;
    return &ops_table[codec->id];
}

/* A stand-in for a NULL source of length 0, so no codec library sees a NULL pointer. */
static const uint8_t empty_src[1];

zb_status
zb__codec_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                 uint8_t *dst, size_t dst_cap, size_t expected, size_t *out_len, const char *where)
{
    if (out_len) *out_len = 0;
    if (!where) where = "(chunk)";
    const codec_ops *ops = lookup(codec);
    if (!ops) return zb__err(ZB_E_INVALID, "%s: unknown codec id", where);
    if (!src && src_len > 0)
        return zb__err(ZB_E_INVALID, "%s: %s: NULL source of %zu bytes", where, ops->name, src_len);
    if (!src) src = empty_src;
    if (expected != SIZE_MAX && dst_cap < expected)
        return zb__err(ZB_E_INVALID,
                       "%s: %s: destination of %zu bytes cannot hold the expected %zu", where,
                       ops->name, dst_cap, expected);
    if (!dst && dst_cap > 0)
        return zb__err(ZB_E_INVALID, "%s: %s: NULL destination of %zu bytes", where, ops->name,
                       dst_cap);
    /* With a known size the codec may write exactly that many bytes, even if dst is larger:
     * a frame that would decode to more is already wrong. */
    size_t cap = expected != SIZE_MAX ? expected : dst_cap;
    /* Likewise no codec library sees a NULL destination (it only ever has room 0). */
    uint8_t no_room[1];
    if (!dst) dst = no_room;

    zb_ctx *tmp = NULL;
    if (!ctx) {
        ZB_TRY(zb_ctx_new(&tmp));
        ctx = tmp;
    }
    size_t n = 0;
    zb_status st = ops->decode(codec, ctx, src, src_len, dst, cap, expected, &n, where);
    zb_ctx_free(tmp);
    if (st != ZB_OK) return st;
    if (out_len) *out_len = n;
    return ZB_OK;
}

zb_status
zb__codec_decoded_size(const zb__codec *codec, const uint8_t *src, size_t src_len, size_t *size,
                       const char *where)
{
    if (!where) where = "(chunk)";
    const codec_ops *ops = lookup(codec);
    if (!ops) return zb__err(ZB_E_INVALID, "%s: unknown codec id", where);
    if (!size) return zb__err(ZB_E_INVALID, "%s: %s: NULL size pointer", where, ops->name);
    *size = 0;
    if (!src && src_len > 0)
        return zb__err(ZB_E_INVALID, "%s: %s: NULL source of %zu bytes", where, ops->name, src_len);
    if (!src) src = empty_src;
    ZB_TRY(ops->decoded_size(src, src_len, size, where));
    if (*size > zb__codec_max_decoded(src_len))
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s frame of %zu bytes declares %zu decoded bytes, more than any "
                       "frame of that size decodes to",
                       where, ops->name, src_len, *size);
    return ZB_OK;
}

size_t
zb__codec_max_decoded(size_t src_len)
{
    size_t slack = (size_t)64 << 10;
    if (src_len > (SIZE_MAX - slack) / ZB_MAX_EXPANSION) return SIZE_MAX;
    return src_len * ZB_MAX_EXPANSION + slack;
}

zb_status
zb__codec_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                 size_t itemsize, zb__buf *out)
{
    const codec_ops *ops = lookup(codec);
    if (!ops) return zb__err(ZB_E_INVALID, "encode: unknown codec id");
    if (!out) return zb__err(ZB_E_INVALID, "%s encode: NULL output buffer", ops->name);
    if (!src && src_len > 0)
        return zb__err(ZB_E_INVALID, "%s encode: NULL source of %zu bytes", ops->name, src_len);
    if (!src) src = empty_src;
    zb_ctx *tmp = NULL;
    if (!ctx) {
        ZB_TRY(zb_ctx_new(&tmp));
        ctx = tmp;
    }
    zb_status st = ops->encode(codec, ctx, src, src_len, itemsize, out);
    zb_ctx_free(tmp);
    if (st != ZB_OK) out->len = 0;
    return st;
}

static const char *
shuffle_name(int shuffle)
{
    switch (shuffle) {
    case ZB_SHUFFLE_NONE:
        return "noshuffle";
    case ZB_SHUFFLE_BYTE:
        return "shuffle";
    case ZB_SHUFFLE_BIT:
        return "bitshuffle";
    case ZB_SHUFFLE_AUTO:
        return "auto";
    }
    return "?";
}

void
zb__codec_describe(const zb__codec *codec, char *buf, size_t cap)
{
    if (!buf || cap == 0) return;
    const codec_ops *ops = lookup(codec);
    if (!ops) {
        snprintf(buf, cap, "unknown");
        return;
    }
    switch (codec->id) {
    case ZB_CODEC_BLOSC:
        snprintf(buf, cap, "blosc(%.*s,%d,%s)", (int)sizeof codec->cname, codec->cname,
                 codec->level, shuffle_name(codec->shuffle));
        break;
    case ZB_CODEC_ZSTD:
        snprintf(buf, cap, codec->checksum ? "zstd(%d,checksum)" : "zstd(%d)", codec->level);
        break;
    case ZB_CODEC_LZ4:
        snprintf(buf, cap, "lz4(%d)", codec->acceleration);
        break;
    case ZB_CODEC_GZIP:
    case ZB_CODEC_ZLIB:
        snprintf(buf, cap, "%s(%d)", ops->name, codec->level);
        break;
    case ZB_CODEC_CRC32C:
        snprintf(buf, cap, "crc32c");
        break;
    }
}

zb_status
zb_ctx_new(zb_ctx **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_ctx_new: NULL out");
    /* The library contexts are made on first use: most threads touch one or two codecs. */
    zb_ctx *ctx = calloc(1, sizeof *ctx);
    *out = ctx;
    if (!ctx) return zb__err(ZB_E_NOMEM, "cannot allocate a codec context");
    return ZB_OK;
}

void
zb_ctx_free(zb_ctx *ctx)
{
    if (!ctx) return;
    ZSTD_freeDCtx(ctx->zstd_dctx);
    ZSTD_freeCCtx(ctx->zstd_cctx);
    libdeflate_free_decompressor(ctx->deflate_d);
    zb__workspace *w = &ctx->ws;
    zb__buf *bufs[] = {&w->enc,   &w->stage[0], &w->stage[1], &w->decoded,
                       &w->items, &w->unit,     &w->fetch,    &w->packed};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) zb__buf_free(bufs[i]);
    free(ctx);
}

void
zb_ctx_get_stats(const zb_ctx *ctx, zb_ctx_stats *stats)
{
    if (!stats) return;
    if (!ctx) {
        memset(stats, 0, sizeof *stats);
        return;
    }
    *stats = ctx->stats;
}

void
zb_ctx_reset_stats(zb_ctx *ctx)
{
    if (ctx) memset(&ctx->stats, 0, sizeof ctx->stats);
}
