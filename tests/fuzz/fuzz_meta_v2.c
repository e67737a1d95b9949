/* Zarr v2 array metadata: a .zarray document, then (after a NUL byte, when there is one) a
 * .zattrs document, through the parser and the chunk-key builder. */
#include <string.h>

#include "fuzz_common.h"
#include "zarr/meta.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t zlen = nul ? (size_t)(nul - data) : size;
    const char *attrs = nul ? text + zlen + 1 : NULL;
    size_t alen = nul ? size - zlen - 1 : 0;
    zb__array_meta m;
    if (zb__meta_parse_v2(text, zlen, attrs, alen, "fuzz", &m) != ZB_OK) return 0;
    uint64_t idx[ZB_MAX_DIMS] = {0};
    char key[512];
    (void)zb__meta_chunk_key(&m, "a/b", idx, key, sizeof key);
    for (int d = 0; d < m.ndim; d++)
        idx[d] = m.chunks[d] ? (m.shape[d] + m.chunks[d] - 1) / m.chunks[d] : 0;
    (void)zb__meta_chunk_key(&m, "", idx, key, sizeof key);
    zb__meta_free(&m);
    return 0;
}
