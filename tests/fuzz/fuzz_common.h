/* Helpers shared by the fuzz targets (tests/fuzz/README.md). */
#ifndef ZB_FUZZ_COMMON_H
#define ZB_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A memory store filled from a serialised one: records of
 *     u8 key_len (0 ends the list) | key | u32le value_len | value
 * until the input or the list ends (a value cut short by the input's end keeps what is there).
 * scripts/fuzz-seeds.py writes real stores in this form. *consumed gets the bytes used; NULL
 * when the memory store cannot be made. */
zb_store *fuzz_store_from(const uint8_t *data, size_t size, size_t *consumed);

/* Reads up to 8 bytes little-endian from data[*pos..] (fewer at the end: zero-padded). */
uint64_t fuzz_take(const uint8_t *data, size_t size, size_t *pos, int nbytes);

#endif
