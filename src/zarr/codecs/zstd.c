/* The zstd codec: one or more RFC 8878 frames (FORMATS §2.3), v2 `zstd`, v3 `zstd`,
 * `numcodecs.zstd`.
 *
 * Decoding is one-shot into exactly the expected size: ZSTD_decompressDCtx handles frames that
 * do not declare their content size and concatenated frames, writes no more than the capacity
 * it is given, and verifies frame checksums where they are present. Only the stable zstd API is
 * used. */
#include <zstd.h>
#include <zstd_errors.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

#define ZSTD_MAGIC 0xFD2FB528u
/* Skippable frames: magic 0x184D2A50..0x184D2A5F; they carry no content. */
#define ZSTD_SKIPPABLE_MASK 0xFFFFFFF0u
#define ZSTD_SKIPPABLE_START 0x184D2A50u

static uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Walks the frames of src without decoding them (zstd reads block headers only) and sums the
 * content sizes they declare. *known is false when some frame does not declare its size.
 * Reports the first frame that is truncated or malformed, with its offset. */
static zb_status
walk_frames(const uint8_t *src, size_t src_len, uint64_t *total, bool *known, const char *where)
{
    uint64_t sum = 0;
    bool all_known = true;
    size_t off = 0;
    if (src_len == 0) return zb__err(ZB_E_TRUNCATED, "%s: zstd input is empty (no frame)", where);
    while (off < src_len) {
        const uint8_t *p = src + off;
        size_t left = src_len - off;
        if (left < 4)
            return zb__err(ZB_E_TRUNCATED,
                           "%s: zstd: %zu stray bytes at offset %zu, too short for a frame magic",
                           where, left, off);
        uint32_t magic = load_le32(p);
        bool skippable = (magic & ZSTD_SKIPPABLE_MASK) == ZSTD_SKIPPABLE_START;
        if (magic != ZSTD_MAGIC && !skippable)
            return zb__err(
                ZB_E_CORRUPT,
                "%s: zstd: bad frame magic %02x%02x%02x%02x at offset %zu (want 28b52ffd)", where,
                p[0], p[1], p[2], p[3], off);
        size_t fsize = ZSTD_findFrameCompressedSize(p, left);
        if (ZSTD_isError(fsize))
            return zb__err(ZSTD_getErrorCode(fsize) == ZSTD_error_srcSize_wrong ? ZB_E_TRUNCATED
                                                                                : ZB_E_CORRUPT,
                           "%s: zstd frame at offset %zu: %s", where, off,
                           ZSTD_getErrorName(fsize));
        if (!skippable) {
            unsigned long long fcs = ZSTD_getFrameContentSize(p, left);
            if (fcs == ZSTD_CONTENTSIZE_ERROR)
                return zb__err(ZB_E_CORRUPT, "%s: zstd frame header at offset %zu is malformed",
                               where, off);
            if (fcs == ZSTD_CONTENTSIZE_UNKNOWN)
                all_known = false;
            else if (!zb__add_u64(sum, fcs, &sum))
                return zb__err(ZB_E_CORRUPT,
                               "%s: zstd frame content sizes overflow (frame at offset %zu)", where,
                               off);
        }
        off += fsize;
    }
    *total = sum;
    *known = all_known;
    return ZB_OK;
}

zb_status
zb__zstd_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    uint64_t total = 0;
    bool known = false;
    ZB_TRY(walk_frames(src, src_len, &total, &known, where));
    if (!known)
        return zb__err(ZB_E_UNSUPPORTED, "%s: a zstd frame does not declare its content size",
                       where);
    if (total > SIZE_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: zstd frames declare %llu bytes", where,
                       (unsigned long long)total);
    *size = (size_t)total;
    return ZB_OK;
}

static zb_status
dctx_get(zb_ctx *ctx, ZSTD_DCtx **out)
{
    if (!ctx->zstd_dctx) {
        ctx->zstd_dctx = ZSTD_createDCtx();
        if (!ctx->zstd_dctx) return zb__err(ZB_E_NOMEM, "cannot allocate a zstd context");
    }
    *out = ctx->zstd_dctx;
    return ZB_OK;
}

zb_status
zb__zstd_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec; /* frames say whether they carry a checksum; zstd verifies those that do */
    uint64_t declared = 0;
    bool known = false;
    ZB_TRY(walk_frames(src, src_len, &declared, &known, where));
    /* With every size declared, a mismatch is caught before any work and reported exactly. */
    if (known && expected != SIZE_MAX && declared != expected)
        return zb__err(ZB_E_CORRUPT, "%s: zstd frames declare %llu bytes, expected %zu", where,
                       (unsigned long long)declared, expected);
    if (known && declared > cap)
        return zb__err(ZB_E_CORRUPT,
                       "%s: zstd frames declare %llu bytes, more than the %zu-byte buffer", where,
                       (unsigned long long)declared, cap);
    size_t room = known ? (size_t)declared : cap;

    ZSTD_DCtx *dctx = NULL;
    ZB_TRY(dctx_get(ctx, &dctx));
    size_t r = ZSTD_decompressDCtx(dctx, dst, room, src, src_len);
    if (ZSTD_isError(r)) {
        ZSTD_ErrorCode code = ZSTD_getErrorCode(r);
        zb_status st = ZB_E_CORRUPT;
        if (code == ZSTD_error_checksum_wrong)
            st = ZB_E_CHECKSUM;
        else if (code == ZSTD_error_srcSize_wrong)
            st = ZB_E_TRUNCATED;
        if (code == ZSTD_error_dstSize_tooSmall)
            return zb__err(st, "%s: zstd data decodes to more than %zu bytes", where, room);
        return zb__err(st, "%s: zstd decompression of %zu bytes failed: %s", where, src_len,
                       ZSTD_getErrorName(r));
    }
    if (expected != SIZE_MAX && r != expected)
        return zb__err(ZB_E_CORRUPT, "%s: zstd data decodes to %zu bytes, expected %zu", where, r,
                       expected);
    /* frames that end short of the content size they declare are cut (libzstd reports this
     * itself in the versions tested; the check does not depend on it) */
    if (known && r != declared)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: zstd frames decode to %zu bytes, short of the %llu "
                       "they declare",
                       where, r, (unsigned long long)declared);
    *out_len = r;
    return ZB_OK;
}

zb_status
zb__zstd_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                size_t itemsize, zb__buf *out)
{
    (void)itemsize;
    if (codec->level < ZSTD_minCLevel() || codec->level > ZSTD_maxCLevel())
        return zb__err(ZB_E_INVALID, "zstd encode: level %d is outside %d..%d", codec->level,
                       ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (!ctx->zstd_cctx) {
        ctx->zstd_cctx = ZSTD_createCCtx();
        if (!ctx->zstd_cctx) return zb__err(ZB_E_NOMEM, "cannot allocate a zstd context");
    }
    ZSTD_CCtx *cctx = ctx->zstd_cctx;
    /* The parameterised call: the level-only one ignores the checksum flag. The content size
     * flag is explicit because numcodecs 0.11 cannot decode frames without it (§2.1). */
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, codec->level);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, codec->checksum ? 1 : 0);
    if (ZSTD_isError(r))
        return zb__err(ZB_E_INVALID, "zstd encode: cannot set parameters: %s",
                       ZSTD_getErrorName(r));
    size_t bound = ZSTD_compressBound(src_len);
    if (ZSTD_isError(bound) || bound == 0)
        return zb__err(ZB_E_OVERFLOW, "zstd encode: %zu bytes is too large", src_len);
    out->len = 0;
    ZB_TRY(zb__buf_reserve(out, bound));
    r = ZSTD_compress2(cctx, out->data, bound, src, src_len);
    if (ZSTD_isError(r))
        return zb__err(ZB_E_INVALID, "zstd encode of %zu bytes failed: %s", src_len,
                       ZSTD_getErrorName(r));
    out->len = r;
    return ZB_OK;
}
