/* The tree of groups and arrays of a store: from consolidated metadata when present (v2
 * .zmetadata, v3 inline consolidated_metadata), else by reading node documents and listing. */
#ifndef ZB_ZARR_TREE_H
#define ZB_ZARR_TREE_H

#include <json-c/json.h>
#include <stdbool.h>

#include "zbatch.h"

typedef struct zb__tree_node {
    char *path; /* relative to the store root, "" for the root */
    bool is_array;
    int zarr_format;    /* 2 or 3 */
    json_object *doc;   /* .zarray / .zgroup (v2) or zarr.json (v3) document; owned ref */
    json_object *attrs; /* attributes object (v2 .zattrs, v3 "attributes"); owned ref, never NULL */
} zb__tree_node;

typedef struct zb__tree {
    int zarr_format;
    bool consolidated; /* nodes came from consolidated metadata */
    size_t n;
    zb__tree_node *nodes; /* sorted by path; nodes[0] is `root` itself */
} zb__tree;

/* Loads the tree below `root` ("" = store root). `use_consolidated` false ignores consolidated
 * metadata. ZB_E_NOTFOUND if `root` is neither a group nor an array. */
zb_status zb__tree_load(zb_store *store, const char *root, bool use_consolidated, zb__tree **out);
void zb__tree_free(zb__tree *tree);

/* The node with this exact path, or NULL. */
const zb__tree_node *zb__tree_find(const zb__tree *tree, const char *path);

/* "a/b" into buf from "a" and "b"; just one of them when the other is empty (a NULL `a` is
 * empty). ZB_E_INVALID, naming both, when it does not fit `cap`. */
zb_status zb__tree_join(char *buf, size_t cap, const char *a, const char *b);

/* Opens the array of node `nd` (an is_array node of a loaded tree) from its parsed document, without
 * reading the store. The array keeps a reference to `store`, which must outlive it. */
zb_status zb__tree_node_open_array(zb_store *store, const zb__tree_node *nd, zb_array **out);

/* zb_info_json of a loaded tree (what zb_info_json prints after loading it). */
zb_status zb__tree_info_json(zb_store *store, const zb__tree *tree, char **json_out);

/* Detected layout of the tree: "anndata", "atomic", "annbatch-collection" or "plain". */
const char *zb__tree_layout(const zb__tree *tree);

#endif
