/* A whole dataset in a memory store built from the input (fuzz_store_from; the seeds are real
 * anndata and atomistic stores, scripts/fuzz-seeds.py): its tree loaded once, the dataset opened
 * from it (layout detection, every field), read with read_many for the first and last samples
 * and a few picked by the input's tail, and the tree described as zb_info_json describes it
 * (zb_dataset_open and zb_info_json would each load the same tree again, which was a third of
 * a run). */
#include <stdlib.h>

#include "dataset/dataset.h"
#include "fuzz_common.h"
#include "zarr/tree.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t used = 0;
    zb_store *s = fuzz_store_from(data, size, &used);
    if (!s) return 0;
    zb__tree *t = NULL;
    if (zb__tree_load(s, "", true, &t) != ZB_OK) {
        zb_store_close(s);
        return 0;
    }
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    uint64_t n = 0;
    if (zb__dataset_open_tree(s, "", t, &o, &ds) == ZB_OK && zb_dataset_len(ds, &n) == ZB_OK &&
        n > 0) {
        uint64_t ids[8] = {0, n - 1, n / 2};
        size_t k = 3;
        while (k < 8 && used < size) ids[k++] = fuzz_take(data, size, &used, 2) % n;
        zb_batch *b = NULL;
        if (zb_dataset_read_many(ds, ids, k, &b) == ZB_OK) zb_batch_free(b);
    }
    zb_dataset_close(ds);
    char *json = NULL;
    if (zb__tree_info_json(s, t, &json) == ZB_OK) free(json);
    zb__tree_free(t);
    zb_store_close(s);
    return 0;
}
