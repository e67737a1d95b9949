/* Group nodes and the small JSON/key helpers every writer shares.
 * Format facts: shared FORMATS.md §1.4 (v2 .zgroup/.zattrs), §3.1 (v3 group zarr.json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"
#include "util/status.h"
#include "write/write.h"

json_object *
zb__jw_add(json_object *obj, const char *key, json_object *val, int *ok)
{
    if (!obj || !val) {
        json_object_put(val);
        *ok = 0;
        return NULL;
    }
    if (json_object_object_add(obj, key, val) != 0) {
        json_object_put(val);
        *ok = 0;
        return NULL;
    }
    return val;
}

json_object *
zb__jw_push(json_object *arr, json_object *val, int *ok)
{
    if (!arr || !val) {
        json_object_put(val);
        *ok = 0;
        return NULL;
    }
    if (json_object_array_add(arr, val) != 0) {
        json_object_put(val);
        *ok = 0;
        return NULL;
    }
    return val;
}

json_object *
zb__jw_u64(uint64_t v)
{
    /* json-c prints a uint64 object exactly; int64 for the common case keeps the type plain */
    return v <= (uint64_t)INT64_MAX ? json_object_new_int64((int64_t)v) : json_object_new_uint64(v);
}

zb_status
zb__write_join_key(char *buf, size_t cap, const char *path, const char *name)
{
    int n = snprintf(buf, cap, "%s%s%s", path, path[0] ? "/" : "", name);
    if (n < 0 || (size_t)n >= cap)
        return zb__err(ZB_E_INVALID, "'%.64s...': path too long for a key", path);
    return ZB_OK;
}

zb_status
zb__write_parse_attrs(const char *attributes_json, const char *what, json_object **out)
{
    *out = NULL;
    if (!attributes_json) {
        *out = json_object_new_object();
        return *out ? ZB_OK : zb__err(ZB_E_NOMEM, "%s: out of memory", what);
    }
    json_object *obj = NULL;
    zb_status st = zb__json_parse(attributes_json, strlen(attributes_json), what, &obj);
    /* a malformed document is a bad argument here, not bad storage */
    if (st != ZB_OK) return zb__err_context(ZB_E_INVALID, "%s", what);
    if (!json_object_is_type(obj, json_type_object)) {
        json_object_put(obj);
        return zb__err(ZB_E_INVALID, "%s: not a JSON object", what);
    }
    *out = obj;
    return ZB_OK;
}

zb_status
zb__write_json(zb_store *store, const char *key, json_object *doc)
{
    /* json-c escapes '/' as "\/" by default; legal JSON, but keys and paths read better plain */
    const char *text = json_object_to_json_string_ext(
        doc, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (!text) return zb__err(ZB_E_NOMEM, "%s: cannot serialise the document", key);
    size_t n = strlen(text);
    /* a trailing newline, as zarr-python's files end */
    char *buf = malloc(n + 2);
    if (!buf) return zb__err(ZB_E_NOMEM, "%s: out of memory", key);
    memcpy(buf, text, n);
    buf[n] = '\n';
    zb_status st = zb_store_put(store, key, buf, n + 1);
    free(buf);
    return st;
}

zb_status
zb__write_group(zb_store *store, const char *path, int zarr_format, const char *attributes_json)
{
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb__write_group: null argument");
    if (zarr_format != 2 && zarr_format != 3)
        return zb__err(ZB_E_INVALID, "group '%.64s': zarr_format %d is not 2 or 3", path,
                       zarr_format);
    char norm[4096], key[4200];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));
    json_object *attrs = NULL, *doc = NULL;
    ZB_TRY(zb__write_parse_attrs(attributes_json, "group attributes_json", &attrs));
    zb_status st = ZB_OK;
    int ok = 1;

    doc = json_object_new_object();
    zb__jw_add(doc, "zarr_format", json_object_new_int(zarr_format), &ok);
    if (zarr_format == 3) {
        zb__jw_add(doc, "node_type", json_object_new_string("group"), &ok);
        zb__jw_add(doc, "attributes", json_object_get(attrs), &ok);
    }
    if (!ok) {
        st = zb__err(ZB_E_NOMEM, "group '%s': out of memory", norm);
        goto done;
    }
    if (zarr_format == 2 && attributes_json) {
        st = zb__write_join_key(key, sizeof key, norm, ".zattrs");
        if (st == ZB_OK) st = zb__write_json(store, key, attrs);
        if (st != ZB_OK) goto done;
    }
    st = zb__write_join_key(key, sizeof key, norm, zarr_format == 2 ? ".zgroup" : "zarr.json");
    if (st == ZB_OK) st = zb__write_json(store, key, doc);
done:
    json_object_put(doc);
    json_object_put(attrs);
    return st;
}

zb_status
zb__write_find_node(zb_store *store, const char *path, const char **marker)
{
    static const char *const markers[] = {"zarr.json", ".zarray", ".zgroup"};
    char key[4200];
    *marker = NULL;
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        ZB_TRY(zb__write_join_key(key, sizeof key, path, markers[i]));
        uint64_t size;
        zb_status st = zb_store_size(store, key, &size);
        if (st == ZB_OK) {
            *marker = markers[i];
            return ZB_OK;
        }
        if (st != ZB_E_NOTFOUND) return st;
    }
    zb_clear_error();
    return ZB_OK;
}

zb_status
zb__write_groups_above(zb_store *store, const char *path, int zarr_format)
{
    char norm[4096];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));
    const char *marker;
    for (size_t end = strlen(norm); end-- > 0;) {
        if (norm[end] != '/') continue;
        norm[end] = '\0';
        ZB_TRY(zb__write_find_node(store, norm, &marker));
        if (!marker) ZB_TRY(zb__write_group(store, norm, zarr_format, NULL));
    }
    ZB_TRY(zb__write_find_node(store, "", &marker));
    return marker ? ZB_OK : zb__write_group(store, "", zarr_format, NULL);
}

/* ---- consolidated metadata (FORMATS.md §1.4 v2, §3.5 v3) ------------------------------------ */

int
zb__write_path_depth(const char *path)
{
    int d = 0;
    for (; *path; path++) d += *path == '/';
    return d;
}

int
zb__write_cmp_consolidated(const char *a, const char *b)
{
    int da = zb__write_path_depth(a), db = zb__write_path_depth(b);
    if (da != db) return da < db ? -1 : 1;
    return strcmp(a, b);
}

void
zb__write_mark_nested_group(json_object *doc, int *ok)
{
    json_object_object_del(doc, "consolidated_metadata");
    json_object *cm = zb__jw_add(doc, "consolidated_metadata", json_object_new_object(), ok);
    zb__jw_add(cm, "kind", json_object_new_string("inline"), ok);
    zb__jw_add(cm, "must_understand", json_object_new_boolean(0), ok);
    zb__jw_add(cm, "metadata", json_object_new_object(), ok);
}

zb_status
zb__write_consolidated_root(zb_store *store, const char *path, int zarr_format,
                            const char *attributes_json, json_object *meta)
{
    json_object *attrs = NULL, *doc = NULL;
    ZB_TRY(zb__write_parse_attrs(attributes_json, "root attributes", &attrs));
    int ok = 1;
    zb_status st = ZB_OK;
    char key[4200];
    if (zarr_format == 3) {
        doc = json_object_new_object();
        zb__jw_add(doc, "zarr_format", json_object_new_int(3), &ok);
        zb__jw_add(doc, "node_type", json_object_new_string("group"), &ok);
        zb__jw_add(doc, "attributes", json_object_get(attrs), &ok);
        json_object *cm = zb__jw_add(doc, "consolidated_metadata", json_object_new_object(), &ok);
        zb__jw_add(cm, "kind", json_object_new_string("inline"), &ok);
        zb__jw_add(cm, "must_understand", json_object_new_boolean(0), &ok);
        zb__jw_add(cm, "metadata", json_object_get(meta), &ok);
        st = ok ? zb__write_join_key(key, sizeof key, path, "zarr.json")
                : zb__err(ZB_E_NOMEM, "root group: out of memory");
        if (st == ZB_OK) st = zb__write_json(store, key, doc);
    } else {
        /* .zmetadata is written before the root .zgroup, which stays the commit point */
        json_object *zgroup = json_object_new_object();
        zb__jw_add(zgroup, "zarr_format", json_object_new_int(2), &ok);
        zb__jw_add(meta, ".zgroup", zgroup, &ok);
        zb__jw_add(meta, ".zattrs", json_object_get(attrs), &ok);
        doc = json_object_new_object();
        zb__jw_add(doc, "metadata", json_object_get(meta), &ok);
        zb__jw_add(doc, "zarr_consolidated_format", json_object_new_int(1), &ok);
        st = ok ? zb__write_join_key(key, sizeof key, path, ".zmetadata")
                : zb__err(ZB_E_NOMEM, "consolidated metadata: out of memory");
        if (st == ZB_OK) st = zb__write_json(store, key, doc);
        if (st == ZB_OK) st = zb__write_group(store, path, 2, attributes_json);
    }
    json_object_put(doc);
    json_object_put(attrs);
    return st;
}
