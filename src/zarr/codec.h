/* Bytes-to-bytes codecs (compressors and checksums) and the per-thread decode context.
 * Format facts: shared FORMATS.md §2 (v2 ids and byte layouts) and §3.4 (v3 names). */
#ifndef ZB_ZARR_CODEC_H
#define ZB_ZARR_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "zbatch.h"

typedef enum zb__codec_id {
    ZB_CODEC_BLOSC,
    ZB_CODEC_ZSTD,
    ZB_CODEC_LZ4,   /* numcodecs framing: u32le size prefix + one raw LZ4 block */
    ZB_CODEC_GZIP,  /* RFC 1952, one or more members */
    ZB_CODEC_ZLIB,  /* RFC 1950 */
    ZB_CODEC_CRC32C /* input + u32le CRC32C of the input */
} zb__codec_id;

/* Blosc shuffle modes as numcodecs numbers them (v3 strings map onto 0/1/2). */
enum { ZB_SHUFFLE_NONE = 0, ZB_SHUFFLE_BYTE = 1, ZB_SHUFFLE_BIT = 2, ZB_SHUFFLE_AUTO = -1 };

typedef struct zb__codec {
    zb__codec_id id;
    int level;        /* zstd level, gzip/zlib level, blosc clevel */
    char cname[16];   /* blosc: lz4 lz4hc blosclz zstd snappy zlib */
    int shuffle;      /* blosc: ZB_SHUFFLE_* */
    int typesize;     /* blosc: shuffle item size (encode); 0 = use the dtype's */
    int blocksize;    /* blosc: 0 = automatic */
    bool checksum;    /* zstd: write/verify the frame checksum */
    int acceleration; /* lz4 */
} zb__codec;

/* A thread's reused buffers, one per use, so no two layers can ever hand out the same one.
 * Each grows to the largest use seen and lives as long as the context. */
typedef struct zb__workspace {
    zb__buf enc;      /* zarr (array.c): encoded bytes of a unit or merged range being read */
    zb__buf stage[2]; /* zarr (unit.c): bytes->bytes codec stages before the last (ping-pong) */
    zb__buf decoded;  /* zarr: a unit decoded outside the destination (transpose, padding) */
    zb__buf items;    /* zarr: the item table of a vlen-utf8 unit */
    zb__buf unit;     /* reader: a unit decoded for copies that take part of it */
    zb__buf fetch;    /* reader: fetched bytes when the store offers no view */
    zb__buf packed;   /* convert (gather.c): packed rows of one output chunk */
} zb__workspace;

/* Per-thread state: lazily created decompression contexts, named workspaces and counters. */
struct zb_ctx {
    void *zstd_dctx; /* ZSTD_DCtx */
    void *zstd_cctx; /* ZSTD_CCtx */
    void *deflate_d; /* struct libdeflate_decompressor */
    zb__workspace ws;
    zb_ctx_stats stats;
};

/* Decodes `src` (src_len bytes) into dst. If `expected` is not SIZE_MAX the decoded size must
 * equal it exactly (ZB_E_CORRUPT / ZB_E_TRUNCATED otherwise) and dst_cap >= expected;
 * otherwise the decoded size is what the frame says (zb__codec_decoded_size) and must fit
 * dst_cap. *out_len gets the decoded size. `where` names the chunk key for messages.
 * Never reads past src_len or writes past dst_cap, whatever the input. */
zb_status zb__codec_decode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                           uint8_t *dst, size_t dst_cap, size_t expected, size_t *out_len,
                           const char *where);

/* The decoded size that `src` declares (blosc nbytes, zstd frame content sizes, lz4 prefix,
 * gzip ISIZE sum, crc32c src_len-4); ZB_E_UNSUPPORTED when the frame does not say (zstd without
 * content size, zlib), ZB_E_CORRUPT / ZB_E_TRUNCATED when the header is bad. */
zb_status zb__codec_decoded_size(const zb__codec *codec, const uint8_t *src, size_t src_len,
                                 size_t *size, const char *where);

/* The most bytes any supported codec decodes from one encoded byte: zstd's RLE blocks (128 KiB
 * from 4 bytes); gzip gives ~1,032, lz4 255, blosc its inner codec's. A frame declaring more
 * is damaged or hostile (zb__codec_decoded_size refuses it before anything is allocated). */
#define ZB_MAX_EXPANSION 32768

/* src_len * ZB_MAX_EXPANSION + 64 KiB (saturating): an upper bound on what src_len encoded bytes
 * decode to, whatever the codec. */
size_t zb__codec_max_decoded(size_t src_len);

/* Encodes src into out (replacing its contents). `itemsize` is the element size used for
 * blosc shuffling when codec->typesize is 0. Output is what numcodecs 0.11 / zarr-python
 * decode: zstd frames carry their content size, lz4 has its prefix, gzip has MTIME 0. */
zb_status zb__codec_encode(const zb__codec *codec, zb_ctx *ctx, const uint8_t *src, size_t src_len,
                           size_t itemsize, zb__buf *out);

/* A short description ("blosc(lz4,5,shuffle)", "zstd(3)", "crc32c") into buf. */
void zb__codec_describe(const zb__codec *codec, char *buf, size_t cap);

/* CRC32C (Castagnoli), init/xorout 0xFFFFFFFF: crc32c("123456789") == 0xE3069283. */
uint32_t zb__crc32c(const void *data, size_t len);

#endif
