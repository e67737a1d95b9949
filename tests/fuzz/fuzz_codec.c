/* Each bytes-to-bytes codec's decode path: byte 0 picks the codec (blosc, zstd, lz4, gzip,
 * zlib, crc32c), byte 1 whether the expected size is known (bytes 2-4 give it, up to 4 MiB)
 * or taken from the frame; the rest is the encoded chunk. Whatever the input, the decoder must
 * stay inside its buffers and, when it succeeds with a known size, deliver exactly that size. */
#include <stdlib.h>

#include "fuzz_common.h"
#include "zarr/codec.h"

#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define FUZZ_ASAN 1
#elif defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define FUZZ_ASAN 1
#endif
#endif
#ifdef FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#define MAX_OUT ((size_t)4 << 20)
#define UNSAID_CAP ((size_t)64 << 10) /* the buffer when the frame does not say its size */
#define GUARD 64                      /* poisoned bytes before the decoder's buffer */

static zb_ctx *ctx;
/* One block of MAX_OUT + GUARD bytes for every run (a fresh block of up to 4 MiB per run was
 * most of the target's time: page faults and clearing; docs/RELIABILITY.md). The decoder gets
 * its last `cap` bytes, so a byte written past them lands in ASan's redzone after the block
 * exactly as it would after a block of `cap` bytes, and the GUARD bytes before them are
 * poisoned for the run. */
static uint8_t *out;

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const zb__codec_id ids[] = {ZB_CODEC_BLOSC, ZB_CODEC_ZSTD, ZB_CODEC_LZ4,
                                       ZB_CODEC_GZIP,  ZB_CODEC_ZLIB, ZB_CODEC_CRC32C};
    if (size < 5) return 0;
    if (!ctx && zb_ctx_new(&ctx) != ZB_OK) return 0;
    if (!out && !(out = malloc(MAX_OUT + GUARD))) return 0;
    zb__codec c = {.id = ids[data[0] % 6]};
    bool known = data[1] & 1;
    size_t pos = 2;
    size_t expected = (size_t)fuzz_take(data, size, &pos, 3) % (MAX_OUT + 1);
    const uint8_t *src = data + pos;
    size_t src_len = size - pos;
    size_t cap = expected;
    if (!known) {
        zb_status st = zb__codec_decoded_size(&c, src, src_len, &cap, "fuzz");
        if (st == ZB_OK && cap > MAX_OUT) return 0; /* the reader refuses these before decoding */
        if (st != ZB_OK) cap = UNSAID_CAP;
    }
    /* exactly the capacity promised to the decoder, so ASan sees one byte written past it */
    uint8_t *dst = out + GUARD + MAX_OUT - cap;
    ASAN_POISON_MEMORY_REGION(dst - GUARD, GUARD);
    size_t got = 0;
    zb_status st = zb__codec_decode(&c, ctx, src, src_len, dst, cap, known ? expected : SIZE_MAX,
                                    &got, "fuzz");
    ASAN_UNPOISON_MEMORY_REGION(dst - GUARD, GUARD);
    if (st == ZB_OK && (got > cap || (known && got != expected))) abort();
    return 0;
}
