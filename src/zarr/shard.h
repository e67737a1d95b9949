/* The sharding_indexed container: index decoding and validation (shared FORMATS.md §4). */
#ifndef ZB_ZARR_SHARD_H
#define ZB_ZARR_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "zarr/meta.h"
#include "zbatch.h"

#define ZB_SHARD_EMPTY UINT64_MAX
/* TensorStore's bound on inner chunks per shard. */
#define ZB_SHARD_MAX_ENTRIES ((uint64_t)1 << 30)

/* Encoded index size: 16 n, plus 4 with a crc32c. */
uint64_t zb__shard_index_nbytes(const zb__shard_spec *spec, uint64_t n);

/* Decodes and validates an index of `n` entries read from a shard of `shard_size` bytes into
 * entries[2n] as (offset, nbytes) pairs; an empty entry is (ZB_SHARD_EMPTY, ZB_SHARD_EMPTY).
 * Errors name `key`: ZB_E_TRUNCATED if raw_len is short, ZB_E_CHECKSUM on a CRC mismatch,
 * ZB_E_SHARD_RANGE for a half-empty entry, an overflowing range, a range past the end of the
 * shard or one overlapping the index. */
zb_status zb__shard_index_decode(const zb__shard_spec *spec, uint64_t n, const uint8_t *raw,
                                 size_t raw_len, uint64_t shard_size, const char *key,
                                 uint64_t *entries);

#endif
