/* The lz4 codec in numcodecs framing (FORMATS §2.4): a u32le uncompressed-size prefix, then one
 * raw LZ4 block. This is neither the LZ4 frame format nor z5's prefix-less block. */
#include <limits.h>
#include <lz4.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

#define PREFIX_BYTES 4
/* The LZ4 frame magic 04 22 4D 18, read as the u32le prefix. */
#define LZ4_FRAME_MAGIC 0x184D2204u

static uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads and sanity-checks the prefix; a frame magic gets its own message because writing
 * lz4.frame output (or cramjam's) under the numcodecs id is the usual mistake. */
static zb_status
read_prefix(const uint8_t *src, size_t src_len, uint32_t *prefix, const char *where)
{
    if (src_len < PREFIX_BYTES)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: lz4 buffer of %zu bytes is shorter than the 4-byte size prefix", where,
                       src_len);
    uint32_t n = load_le32(src);
    if (n == LZ4_FRAME_MAGIC)
        return zb__err(ZB_E_CORRUPT,
                       "%s: lz4 data is an LZ4 frame (magic 04 22 4d 18 at offset 0), not the "
                       "numcodecs size prefix + raw block",
                       where);
    if (n > LZ4_MAX_INPUT_SIZE)
        return zb__err(ZB_E_CORRUPT,
                       "%s: lz4 size prefix %u exceeds LZ4_MAX_INPUT_SIZE %d (offset 0)", where, n,
                       LZ4_MAX_INPUT_SIZE);
    *prefix = n;
    return ZB_OK;
}

zb_status
zb__lz4_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    uint32_t n = 0;
    ZB_TRY(read_prefix(src, src_len, &n, where));
    *size = n;
    return ZB_OK;
}

zb_status
zb__lz4_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
               uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec;
    (void)ctx;
    uint32_t n = 0;
    ZB_TRY(read_prefix(src, src_len, &n, where));
    if (expected != SIZE_MAX && n != expected)
        return zb__err(ZB_E_CORRUPT, "%s: lz4 size prefix %u != expected %zu (offset 0)", where, n,
                       expected);
    if (n > cap)
        return zb__err(ZB_E_CORRUPT,
                       "%s: lz4 size prefix %u exceeds the %zu-byte buffer (offset 0)", where, n,
                       cap);
    size_t block_len = src_len - PREFIX_BYTES;
    if (block_len == 0)
        return zb__err(ZB_E_TRUNCATED, "%s: lz4 buffer has a size prefix but no block", where);
    if (block_len > INT_MAX)
        return zb__err(ZB_E_CORRUPT, "%s: lz4 block of %zu bytes is larger than LZ4 accepts", where,
                       block_len);
    /* The safe decoder never writes more than dstCapacity (here exactly n) nor reads past
     * compressedSize; any negative result means a malformed or cut-off block. */
    int r =
        LZ4_decompress_safe((const char *)src + PREFIX_BYTES, (char *)dst, (int)block_len, (int)n);
    if (r < 0)
        return zb__err(ZB_E_CORRUPT,
                       "%s: lz4 block at offset 4 (%zu bytes) is malformed or truncated "
                       "(LZ4_decompress_safe returned %d)",
                       where, block_len, r);
    if ((uint32_t)r != n)
        return zb__err(ZB_E_CORRUPT, "%s: lz4 block decodes to %d bytes, prefix says %u", where, r,
                       n);
    *out_len = n;
    return ZB_OK;
}

zb_status
zb__lz4_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
               size_t itemsize, zb__buf *out)
{
    (void)ctx;
    (void)itemsize;
    if (src_len > LZ4_MAX_INPUT_SIZE)
        return zb__err(ZB_E_OVERFLOW, "lz4 encode: %zu bytes exceed LZ4_MAX_INPUT_SIZE %d", src_len,
                       LZ4_MAX_INPUT_SIZE);
    int bound = LZ4_compressBound((int)src_len);
    if (bound <= 0) return zb__err(ZB_E_OVERFLOW, "lz4 encode: %zu bytes is too large", src_len);
    out->len = 0;
    ZB_TRY(zb__buf_reserve(out, PREFIX_BYTES + (size_t)bound));
    uint8_t *p = out->data;
    p[0] = (uint8_t)src_len;
    p[1] = (uint8_t)(src_len >> 8);
    p[2] = (uint8_t)(src_len >> 16);
    p[3] = (uint8_t)(src_len >> 24);
    /* numcodecs' default acceleration is 1; LZ4 itself maps values below 1 to 1. */
    int accel = codec->acceleration > 0 ? codec->acceleration : 1;
    int r =
        LZ4_compress_fast((const char *)src, (char *)p + PREFIX_BYTES, (int)src_len, bound, accel);
    if (r <= 0) return zb__err(ZB_E_INVALID, "lz4 encode of %zu bytes failed (%d)", src_len, r);
    out->len = PREFIX_BYTES + (size_t)r;
    return ZB_OK;
}
