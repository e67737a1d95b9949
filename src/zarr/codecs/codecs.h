/* Per-codec entry points behind zb_codec_*; one shape for every codec. */
#ifndef ZB_ZARR_CODECS_CODECS_H
#define ZB_ZARR_CODECS_CODECS_H

#include "zarr/codec.h"

#define ZB_CODEC_PROTOS_(name)                                                                     \
    zb_status zb__##name##_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src,         \
                                  size_t src_len, uint8_t *dst, size_t cap, size_t expected,       \
                                  size_t *out_len, const char *where);                             \
    zb_status zb__##name##_decoded_size(const uint8_t *src, size_t src_len, size_t *size,          \
                                        const char *where);                                        \
    zb_status zb__##name##_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src,         \
                                  size_t src_len, size_t itemsize, zb__buf *out);
ZB_CODEC_PROTOS_(blosc)
ZB_CODEC_PROTOS_(zstd)
ZB_CODEC_PROTOS_(lz4)
ZB_CODEC_PROTOS_(gzip)
ZB_CODEC_PROTOS_(zlib)
ZB_CODEC_PROTOS_(crc32c)
#undef ZB_CODEC_PROTOS_

/* A blosc frame that holds a plain copy (BLOSC_MEMCPYED, as blosc stores data it cannot
 * compress): *plain points at its `expected` bytes inside `src`; any other valid frame: *plain
 * NULL, for zb__blosc_decode. The header is checked exactly as zb__blosc_decode checks it. */
zb_status zb__blosc_plain(const uint8_t *src, size_t src_len, size_t expected,
                          const uint8_t **plain, const char *where);

#endif
