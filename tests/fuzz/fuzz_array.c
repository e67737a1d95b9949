/* One array in a memory store built from the input (fuzz_store_from: its metadata document and
 * its chunk or shard objects): opened as v2 or v3, described, and read whole when it holds at
 * most 1 MiB (else its first rows) — every codec chain (bytes endianness, transpose, sharding
 * with its index, the compressors, crc32c, vlen-utf8 strings) over hostile bytes. */
#include <stdlib.h>

#include "fuzz_common.h"

#define MAX_READ ((uint64_t)1 << 20)

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zb_store *s = fuzz_store_from(data, size, NULL);
    if (!s) return 0;
    zb_array *a = NULL;
    zb_array_info info;
    if (zb_array_open(s, "", &a) == ZB_OK && zb_array_get_info(a, &info) == ZB_OK) {
        uint64_t rows = info.ndim ? info.shape[0] : 1;
        uint64_t row_elems = zb_array_row_elems(a);
        uint64_t item = info.itemsize ? info.itemsize : 16; /* strings: a guess per item */
        uint64_t row_bytes = row_elems * item;
        if (row_elems && row_bytes / row_elems == item && row_bytes <= MAX_READ) {
            uint64_t stop = rows < MAX_READ / row_bytes ? rows : MAX_READ / row_bytes;
            if (info.itemsize == 0) {
                zb_strings str;
                if (zb_array_read_strings(a, 0, stop, &str, NULL) == ZB_OK) zb_strings_free(&str);
            } else {
                size_t n = (size_t)(stop * row_bytes);
                uint8_t *dst = malloc(n ? n : 1);
                if (dst) (void)zb_array_read_rows(a, 0, stop, dst, n, NULL);
                free(dst);
            }
        }
    }
    zb_array_close(a);
    zb_store_close(s);
    return 0;
}
