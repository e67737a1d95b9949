/* Internal helpers shared by the writers (arrays, groups, layouts). */
#ifndef ZB_WRITE_WRITE_H
#define ZB_WRITE_WRITE_H

#include <json-c/json.h>
#include <stddef.h>

#include "zbatch.h"

/* Writes a group node at `path` ("" = the store root): v2 writes `.zattrs` (only when
 * attributes_json is not NULL) and then `.zgroup` {"zarr_format": 2}; v3 writes one zarr.json
 * {"zarr_format": 3, "node_type": "group", "attributes": {...}}. Each key is put atomically and
 * the node's marker (.zgroup / zarr.json) comes last, so a reader never sees a group without its
 * attributes. attributes_json must be a JSON object (bare NaN/Infinity allowed) or NULL (= {}).
 * An existing group is overwritten. ZB_E_INVALID for a bad format or attributes document. */
zb_status zb__write_group(zb_store *store, const char *path, int zarr_format,
                          const char *attributes_json);

/* The node marker (zarr.json, .zarray or .zgroup, either format) found at `path` ("" = the
 * root), or NULL in *marker when there is none. */
zb_status zb__write_find_node(zb_store *store, const char *path, const char **marker);

/* Writes a group node (no attributes) at the root and at every group above `path` that holds
 * no node yet, the deepest first, so the root, which makes the store openable, comes last. */
zb_status zb__write_groups_above(zb_store *store, const char *path, int zarr_format);

/* Parses attributes_json (NULL gives a new empty object) and requires a JSON object; `what`
 * names the option in messages. Release *out with json_object_put. */
zb_status zb__write_parse_attrs(const char *attributes_json, const char *what, json_object **out);

/* Serialises `doc` (2-space indent, '/' unescaped, integers exact) and puts it under `key`. */
zb_status zb__write_json(zb_store *store, const char *key, json_object *doc);

/* "path/name", or "name" when path is "" (path already normalised). ZB_E_INVALID if it does
 * not fit in cap. */
zb_status zb__write_join_key(char *buf, size_t cap, const char *path, const char *name);

/* The offset of the first byte of s[0..len) that is not strict UTF-8 (overlongs, surrogates
 * and code points above U+10FFFF refused, as every reader decodes what is written), or len. */
size_t zb__write_utf8_check(const uint8_t *s, size_t len);

/* json-c constructors report allocation failure by returning NULL (and object_add by -1); these
 * record the first failure in *ok, so a document is built first and checked once. */
json_object *zb__jw_add(json_object *obj, const char *key, json_object *val, int *ok);
json_object *zb__jw_push(json_object *arr, json_object *val, int *ok);
/* An exact integer: int64 when it fits, else uint64. */
json_object *zb__jw_u64(uint64_t v);

/* Consolidated metadata (FORMATS.md §1.4 for v2, §3.5 for v3). zarr-python rebuilds the
 * nested tree from the flat keys by grouping consecutive keys of one parent after a stable
 * sort by depth (zarr/core/group.py, _flat_to_nested), so entries go in depth order, then by
 * path: zb__write_cmp_consolidated orders two keys so. */
int zb__write_path_depth(const char *path);
int zb__write_cmp_consolidated(const char *a, const char *b);
/* Gives a nested v3 group document the empty consolidated_metadata zarr-python writes. */
void zb__write_mark_nested_group(json_object *doc, int *ok);
/* Writes the group at `path` with its attributes and `meta` (the consolidated entries, keys
 * relative to `path`, in order): v3 inline in zarr.json, v2 as .zmetadata then .zgroup (the
 * commit point). `meta` is borrowed (v2 adds the root's own entries to it). */
zb_status zb__write_consolidated_root(zb_store *store, const char *path, int zarr_format,
                                      const char *attributes_json, json_object *meta);

#endif
