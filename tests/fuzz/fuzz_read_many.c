/* A whole dataset in a memory store built from the input (fuzz_store_from; the seeds are real
 * anndata and atomistic stores, scripts/fuzz-seeds.py): opened (layout detection, every
 * field), described, and read with read_many for the first and last samples and a few picked
 * by the input's tail. */
#include <stdlib.h>

#include "fuzz_common.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t used = 0;
    zb_store *s = fuzz_store_from(data, size, &used);
    if (!s) return 0;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    uint64_t n = 0;
    if (zb_dataset_open(s, "", &o, &ds) == ZB_OK && zb_dataset_len(ds, &n) == ZB_OK && n > 0) {
        uint64_t ids[8] = {0, n - 1, n / 2};
        size_t k = 3;
        while (k < 8 && used < size) ids[k++] = fuzz_take(data, size, &used, 2) % n;
        zb_batch *b = NULL;
        if (zb_dataset_read_many(ds, ids, k, &b) == ZB_OK) zb_batch_free(b);
    }
    zb_dataset_close(ds);
    char *json = NULL;
    if (zb_info_json(s, "", &json) == ZB_OK) free(json);
    zb_store_close(s);
    return 0;
}
