/* The shard index: byte 0 holds the spec (bit 0 index at start, bit 1 big-endian, bit 2 with
 * crc32c), bytes 1-2 the entry count (1..4096), bytes 3-10 the shard size; the rest is the raw
 * index. */
#include <stdlib.h>

#include "fuzz_common.h"
#include "zarr/shard.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;
    uint64_t flags = fuzz_take(data, size, &pos, 1);
    uint64_t n = fuzz_take(data, size, &pos, 2) % 4096 + 1;
    uint64_t shard_size = fuzz_take(data, size, &pos, 8);
    zb__shard_spec spec = {.index_at_start = flags & 1,
                           .index_big_endian = (flags >> 1) & 1,
                           .index_crc = (flags >> 2) & 1};
    uint64_t *entries = malloc((size_t)n * 2 * sizeof *entries);
    if (!entries) return 0;
    (void)zb__shard_index_nbytes(&spec, n);
    if (zb__shard_index_decode(&spec, n, data + pos, size - pos, shard_size, "fuzz", entries) ==
        ZB_OK) {
        /* what the decoder accepted must be what it promised: ranges inside the shard */
        for (uint64_t i = 0; i < n; i++) {
            uint64_t off = entries[2 * i], len = entries[2 * i + 1];
            if (off == ZB_SHARD_EMPTY) continue;
            if (off > shard_size || len > shard_size - off) abort();
        }
    }
    free(entries);
    return 0;
}
