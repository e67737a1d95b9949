/* Shard index decoding. Every entry comes from storage and is checked before use: a corrupt
 * index is an error naming the shard key and the entry, never an out-of-bounds read. */
#include "zarr/shard.h"

#include <string.h>

#include "zarr/codec.h"
#include "util/status.h"

uint64_t
zb__shard_index_nbytes(const zb__shard_spec *spec, uint64_t n)
{
    return 16 * n + (spec->index_crc ? 4 : 0);
}

static uint64_t
load_u64(const uint8_t *p, bool big)
{
    uint64_t v = 0;
    if (big)
        for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    else
        for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

zb_status
zb__shard_index_decode(const zb__shard_spec *spec, uint64_t n, const uint8_t *raw, size_t raw_len,
                       uint64_t shard_size, const char *key, uint64_t *entries)
{
    if (n == 0 || n > ZB_SHARD_MAX_ENTRIES)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %llu inner chunks per shard", key,
                       (unsigned long long)n);
    uint64_t idx_bytes = zb__shard_index_nbytes(spec, n);
    if (raw_len < idx_bytes || shard_size < idx_bytes)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: shard of %llu bytes is shorter than its %llu-byte index", key,
                       (unsigned long long)shard_size, (unsigned long long)idx_bytes);
    if (spec->index_crc) {
        uint32_t want = (uint32_t)raw[16 * n] | (uint32_t)raw[16 * n + 1] << 8 |
                        (uint32_t)raw[16 * n + 2] << 16 | (uint32_t)raw[16 * n + 3] << 24;
        uint32_t got = zb__crc32c(raw, (size_t)(16 * n));
        if (got != want)
            return zb__err(ZB_E_CHECKSUM,
                           "%s: shard index crc32c is 0x%08x, stored 0x%08x (index at %s)", key,
                           got, want, spec->index_at_start ? "start" : "end");
    }
    /* With the index at the end, data lies in [0, size - idx); at the start, in [idx, size). */
    uint64_t lo = spec->index_at_start ? idx_bytes : 0;
    uint64_t hi = spec->index_at_start ? shard_size : shard_size - idx_bytes;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t off = load_u64(raw + 16 * j, spec->index_big_endian);
        uint64_t len = load_u64(raw + 16 * j + 8, spec->index_big_endian);
        entries[2 * j] = off;
        entries[2 * j + 1] = len;
        if (off == ZB_SHARD_EMPTY && len == ZB_SHARD_EMPTY) continue;
        if (off == ZB_SHARD_EMPTY || len == ZB_SHARD_EMPTY)
            return zb__err(ZB_E_SHARD_RANGE, "%s: index entry %llu is half empty (%llu, %llu)", key,
                           (unsigned long long)j, (unsigned long long)off, (unsigned long long)len);
        uint64_t end;
        if (!zb__add_u64(off, len, &end))
            return zb__err(ZB_E_SHARD_RANGE, "%s: index entry %llu: offset %llu + %llu overflows",
                           key, (unsigned long long)j, (unsigned long long)off,
                           (unsigned long long)len);
        if (end > shard_size)
            return zb__err(ZB_E_SHARD_RANGE,
                           "%s: index entry %llu: range [%llu, %llu) is past the end of the "
                           "%llu-byte shard",
                           key, (unsigned long long)j, (unsigned long long)off,
                           (unsigned long long)end, (unsigned long long)shard_size);
        if (off < lo || end > hi)
            return zb__err(ZB_E_SHARD_RANGE,
                           "%s: index entry %llu: range [%llu, %llu) overlaps the index", key,
                           (unsigned long long)j, (unsigned long long)off, (unsigned long long)end);
    }
    return ZB_OK;
}
