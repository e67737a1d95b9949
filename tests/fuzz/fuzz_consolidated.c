/* Consolidated metadata: byte 0 picks v2 (.zmetadata beside a .zgroup) or v3 (a root zarr.json
 * with inline consolidated_metadata); the rest is the document. The tree is loaded from it, the
 * layout detected, every array node opened from its entry, and the tree described as
 * zb_info_json describes it (what `zbatch info` prints; zb_info_json itself would load the
 * same tree a second time, which was a third of a run). */
#include <stdlib.h>

#include "fuzz_common.h"
#include "zarr/tree.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    zb_store *s = NULL;
    if (zb_store_open_memory(&s) != ZB_OK) return 0;
    if (data[0] & 1) {
        (void)zb_store_put(s, ".zgroup", "{\"zarr_format\":2}", 17);
        (void)zb_store_put(s, ".zmetadata", data + 1, size - 1);
    } else {
        (void)zb_store_put(s, "zarr.json", data + 1, size - 1);
    }
    zb__tree *t = NULL;
    if (zb__tree_load(s, "", true, &t) == ZB_OK) {
        (void)zb__tree_layout(t);
        for (size_t i = 0; i < t->n; i++) {
            zb_array *a = NULL;
            if (t->nodes[i].is_array && zb__tree_node_open_array(s, &t->nodes[i], &a) == ZB_OK)
                zb_array_close(a);
        }
        char *json = NULL;
        if (zb__tree_info_json(s, t, &json) == ZB_OK) free(json);
        zb__tree_free(t);
    }
    zb_store_close(s);
    return 0;
}
