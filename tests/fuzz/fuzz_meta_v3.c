/* Zarr v3 array metadata (zarr.json) through the parser (codec chains, sharding, transpose,
 * chunk-key encodings, fill values) and the chunk-key builder. */
#include "fuzz_common.h"
#include "zarr/meta.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zb__array_meta m;
    if (zb__meta_parse_v3((const char *)data, size, "fuzz", &m) != ZB_OK) return 0;
    uint64_t idx[ZB_MAX_DIMS] = {0};
    char key[512];
    (void)zb__meta_chunk_key(&m, "a/b", idx, key, sizeof key);
    for (int d = 0; d < m.ndim; d++)
        idx[d] = m.chunks[d] ? (m.shape[d] + m.chunks[d] - 1) / m.chunks[d] : 0;
    (void)zb__meta_chunk_key(&m, "", idx, key, sizeof key);
    zb__meta_free(&m);
    return 0;
}
