/* The blosc codec: c-blosc1 buffers (FORMATS §2.2), v2 `blosc` and v3 `blosc`.
 *
 * c-blosc1's decompressor takes no source length and trusts the header's cbytes, so every
 * header field is checked against the object length and the expected size before it runs. */
#include <blosc.h>
#include <limits.h>

#include "zarr/codecs/codecs.h"
#include "util/status.h"
#include "zarr/codec.h"

/* Header offsets (FORMATS §2.2). */
enum { OFF_VERSION = 0, OFF_FLAGS = 2, OFF_TYPESIZE = 3, OFF_NBYTES = 4, OFF_CBYTES = 12 };

static uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Checks the 16-byte header against the object and returns the declared decoded size. */
static zb_status
check_header(const uint8_t *src, size_t src_len, size_t *nbytes_out, const char *where)
{
    if (src_len < BLOSC_MIN_HEADER_LENGTH)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: blosc buffer of %zu bytes is shorter than the %d-byte header", where,
                       src_len, BLOSC_MIN_HEADER_LENGTH);
    unsigned version = src[OFF_VERSION];
    uint32_t nbytes = load_le32(src + OFF_NBYTES);
    uint32_t cbytes = load_le32(src + OFF_CBYTES);
    /* c-blosc1 writes versions 1 and 2; c-blosc2 writes 3..5 (its own chunk formats, which
     * c-blosc1 cannot read); anything else was never a blosc buffer. */
    if (version >= 3 && version <= 5)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: blosc header version %u (offset 0) is a c-blosc2 chunk; c-blosc1 reads "
                       "versions 1..%d",
                       where, version, BLOSC_VERSION_FORMAT);
    if (version == 0 || version > BLOSC_VERSION_FORMAT)
        return zb__err(ZB_E_CORRUPT,
                       "%s: blosc header version %u (offset 0) is not a blosc format version",
                       where, version);
    if (cbytes < BLOSC_MIN_HEADER_LENGTH)
        return zb__err(ZB_E_CORRUPT, "%s: blosc header cbytes %u < %d (offset %d)", where, cbytes,
                       BLOSC_MIN_HEADER_LENGTH, OFF_CBYTES);
    if (cbytes != src_len)
        return zb__err(cbytes > src_len ? ZB_E_TRUNCATED : ZB_E_CORRUPT,
                       "%s: blosc header cbytes %u != object length %zu (offset %d)", where, cbytes,
                       src_len, OFF_CBYTES);
    if (nbytes > BLOSC_MAX_BUFFERSIZE)
        return zb__err(ZB_E_CORRUPT,
                       "%s: blosc header nbytes %u exceeds the c-blosc1 limit %d (offset %d)",
                       where, nbytes, BLOSC_MAX_BUFFERSIZE, OFF_NBYTES);
    /* The library's own check, in case it knows more than the fields above. */
    size_t validated = 0;
    if (blosc_cbuffer_validate(src, src_len, &validated) != 0 || validated != nbytes)
        return zb__err(
            ZB_E_CORRUPT,
            "%s: blosc_cbuffer_validate rejects the header (version %u, nbytes %u, cbytes %u)",
            where, version, nbytes, cbytes);
    *nbytes_out = nbytes;
    return ZB_OK;
}

zb_status
zb__blosc_decoded_size(const uint8_t *src, size_t src_len, size_t *size, const char *where)
{
    return check_header(src, src_len, size, where);
}

zb_status
zb__blosc_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                 uint8_t *dst, size_t cap, size_t expected, size_t *out_len, const char *where)
{
    (void)codec; /* everything blosc needs to decode is in its header */
    (void)ctx;   /* blosc_decompress_ctx keeps no state between calls */
    size_t nbytes = 0;
    ZB_TRY(check_header(src, src_len, &nbytes, where));
    if (expected != SIZE_MAX && nbytes != expected)
        return zb__err(ZB_E_CORRUPT, "%s: blosc header nbytes %zu != expected %zu (offset %d)",
                       where, nbytes, expected, OFF_NBYTES);
    if (nbytes > cap)
        return zb__err(ZB_E_CORRUPT,
                       "%s: blosc header nbytes %zu exceeds the %zu-byte buffer (offset %d)", where,
                       nbytes, cap, OFF_NBYTES);
    if (nbytes == 0) {
        *out_len = 0;
        return ZB_OK;
    }
    /* One internal thread: parallelism comes from decoding many chunks at once, and the
     * library's own pool would oversubscribe the cores. */
    int r = blosc_decompress_ctx(src, dst, nbytes, 1);
    if (r < 0 || (size_t)r != nbytes)
        return zb__err(ZB_E_CORRUPT,
                       "%s: blosc decompression failed (result %d, flags 0x%02x, typesize %u, "
                       "nbytes %zu, cbytes %zu)",
                       where, r, src[OFF_FLAGS], src[OFF_TYPESIZE], nbytes, src_len);
    *out_len = nbytes;
    return ZB_OK;
}

zb_status
zb__blosc_plain(const uint8_t *src, size_t src_len, size_t expected, const uint8_t **plain,
                const char *where)
{
    size_t nbytes = 0;
    *plain = NULL;
    ZB_TRY(check_header(src, src_len, &nbytes, where));
    if (nbytes != expected)
        return zb__err(ZB_E_CORRUPT, "%s: blosc header nbytes %zu != expected %zu (offset %d)",
                       where, nbytes, expected, OFF_NBYTES);
    int flags = 0;
    size_t typesize = 0;
    blosc_cbuffer_metainfo(src, &typesize, &flags);
    if (!(flags & BLOSC_MEMCPYED)) return ZB_OK;
    /* what blosc_decompress_ctx itself requires of a plain copy */
    if (src_len != nbytes + BLOSC_MAX_OVERHEAD)
        return zb__err(ZB_E_CORRUPT,
                       "%s: blosc plain-copy frame (flags 0x%02x) of %zu bytes does not hold the "
                       "%zu-byte header and its nbytes %zu",
                       where, (unsigned)flags, src_len, (size_t)BLOSC_MAX_OVERHEAD, nbytes);
    *plain = src + BLOSC_MAX_OVERHEAD;
    return ZB_OK;
}

zb_status
zb__blosc_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                 size_t itemsize, zb__buf *out)
{
    (void)ctx;
    char cname[sizeof codec->cname + 1];
    size_t k = 0;
    for (; k < sizeof codec->cname && codec->cname[k]; k++) cname[k] = codec->cname[k];
    cname[k] = '\0';
    if (blosc_compname_to_compcode(cname) < 0)
        return zb__err(ZB_E_UNSUPPORTED,
                       "blosc encode: compressor '%s' is not in this libblosc (%s)", cname,
                       blosc_list_compressors());
    if (codec->level < 0 || codec->level > 9)
        return zb__err(ZB_E_INVALID, "blosc encode: clevel %d is outside 0..9", codec->level);
    if (codec->blocksize < 0)
        return zb__err(ZB_E_INVALID, "blosc encode: blocksize %d is negative", codec->blocksize);
    if (src_len > BLOSC_MAX_BUFFERSIZE)
        return zb__err(ZB_E_OVERFLOW, "blosc encode: %zu bytes exceed the c-blosc1 limit %d",
                       src_len, BLOSC_MAX_BUFFERSIZE);
    size_t typesize = codec->typesize > 0 ? (size_t)codec->typesize : itemsize;
    if (typesize == 0) typesize = 1;
    int shuffle;
    switch (codec->shuffle) {
    case ZB_SHUFFLE_NONE:
        shuffle = BLOSC_NOSHUFFLE;
        break;
    case ZB_SHUFFLE_BYTE:
        shuffle = BLOSC_SHUFFLE;
        break;
    case ZB_SHUFFLE_BIT:
        shuffle = BLOSC_BITSHUFFLE;
        break;
    case ZB_SHUFFLE_AUTO:
        /* numcodecs' AUTOSHUFFLE: byte shuffling a 1-byte type is a no-op, so use bits. */
        shuffle = typesize == 1 ? BLOSC_BITSHUFFLE : BLOSC_SHUFFLE;
        break;
    default:
        return zb__err(ZB_E_INVALID, "blosc encode: shuffle %d is not -1, 0, 1 or 2",
                       codec->shuffle);
    }
    /* nbytes + BLOSC_MAX_OVERHEAD always suffices: blosc falls back to a raw copy. */
    size_t destsize = src_len + BLOSC_MAX_OVERHEAD;
    out->len = 0;
    ZB_TRY(zb__buf_reserve(out, destsize));
    int r = blosc_compress_ctx(codec->level, shuffle, typesize, src_len, src, out->data, destsize,
                               cname, (size_t)codec->blocksize, 1);
    if (r <= 0)
        return zb__err(ZB_E_INVALID,
                       "blosc encode: blosc_compress_ctx failed (%d) for %zu bytes with %s", r,
                       src_len, cname);
    out->len = (size_t)r;
    return ZB_OK;
}
