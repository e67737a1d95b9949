/* CRC32C (Castagnoli) through ISA-L, and the v3 `crc32c` bytes->bytes codec (FORMATS §3.4):
 * the encoded form is the input followed by the u32le CRC32C of the input. */
#include <isa-l/crc.h>
#include <string.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

#define CRC_BYTES 4

/* crc32_iscsi takes an int length, so long inputs go through in pieces. */
#define ISAL_CHUNK ((size_t)1 << 30)

uint32_t
zb__crc32c(const void *data, size_t len)
{
    /* ISA-L's crc32_iscsi neither inverts the seed nor the result: it is the raw reflected
     * register update. The standard CRC32C (init and xorout 0xFFFFFFFF) is therefore
     * ~crc32_iscsi(p, n, 0xFFFFFFFF), and chaining pieces passes the raw register along.
     * The casts drop const only because ISA-L's prototype lacks it; it does not write. */
    unsigned char *p = (unsigned char *)(uintptr_t)data;
    unsigned int crc = 0xFFFFFFFFu;
    while (len > 0) {
        size_t n = len < ISAL_CHUNK ? len : ISAL_CHUNK;
        crc = crc32_iscsi(p, (int)n, crc);
        p += n;
        len -= n;
    }
    return (uint32_t)~crc;
}

static uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

zb_status
zb__crc32c_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    (void)src;
    if (src_len < CRC_BYTES)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: crc32c input of %zu bytes is shorter than the 4-byte checksum", where,
                       src_len);
    *size = src_len - CRC_BYTES;
    return ZB_OK;
}

zb_status
zb__crc32c_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                  uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec;
    (void)ctx;
    size_t n = 0;
    ZB_TRY(zb__crc32c_decoded_size(src, src_len, &n, where));
    if (expected != SIZE_MAX && n != expected)
        return zb__err(ZB_E_CORRUPT, "%s: crc32c payload is %zu bytes, expected %zu", where, n,
                       expected);
    if (n > cap)
        return zb__err(ZB_E_CORRUPT, "%s: crc32c payload of %zu bytes exceeds the %zu-byte buffer",
                       where, n, cap);
    uint32_t stored = load_le32(src + n);
    uint32_t computed = zb__crc32c(src, n);
    if (stored != computed)
        return zb__err(
            ZB_E_CHECKSUM,
            "%s: crc32c mismatch: stored 0x%08x (offset %zu), computed 0x%08x over %zu bytes",
            where, stored, n, computed, n);
    /* memmove: the array layer may decode in place (dst == src). */
    if (n > 0 && dst != src) memmove(dst, src, n);
    *out_len = n;
    return ZB_OK;
}

zb_status
zb__crc32c_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                  size_t itemsize, zb__buf *out)
{
    (void)codec;
    (void)ctx;
    (void)itemsize;
    if (src_len > SIZE_MAX - CRC_BYTES)
        return zb__err(ZB_E_OVERFLOW, "crc32c: input of %zu bytes is too large", src_len);
    uint32_t crc = zb__crc32c(src, src_len);
    uint8_t tail[CRC_BYTES] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16),
                               (uint8_t)(crc >> 24)};
    out->len = 0;
    ZB_TRY(zb__buf_reserve(out, src_len + CRC_BYTES));
    ZB_TRY(zb__buf_append(out, src, src_len));
    return zb__buf_append(out, tail, sizeof tail);
}
