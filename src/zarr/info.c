/* zb_info_json: the tree of groups and arrays of a store as one JSON document, the model of
 * `zbatch info`. Built with json-c so integers stay exact (uint64 shapes and sizes). */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"
#include "util/status.h"
#include "zarr/meta.h"
#include "zarr/tree.h"

#define KEY_CAP 4096

/* json-c calls report allocation failure by returning NULL / non-zero; one flag per document
 * keeps each call site to a line. */
typedef struct builder {
    bool oom;
} builder;

static void
put(builder *b, json_object *obj, const char *key, json_object *val)
{
    if (!val || json_object_object_add(obj, key, val) != 0) {
        json_object_put(val);
        b->oom = true;
    }
}

static void
put_null(builder *b, json_object *obj, const char *key)
{
    if (json_object_object_add(obj, key, NULL) != 0) b->oom = true;
}

static void
append(builder *b, json_object *arr, json_object *val)
{
    if (!val || json_object_array_add(arr, val) != 0) {
        json_object_put(val);
        b->oom = true;
    }
}

static json_object *
dims_json(builder *b, const uint64_t *dims, int ndim)
{
    json_object *a = json_object_new_array();
    if (!a) return NULL;
    for (int i = 0; i < ndim; i++) append(b, a, json_object_new_uint64(dims[i]));
    return a;
}

static json_object *
float_json(double x)
{
    if (isnan(x)) return json_object_new_string("NaN");
    if (isinf(x)) return json_object_new_string(x > 0 ? "Infinity" : "-Infinity");
    return json_object_new_double(x);
}

/* The decoded fill value; NULL with *is_null for JSON null. */
static json_object *
fill_json(const zb__array_meta *m, json_object *doc, bool *is_null)
{
    *is_null = false;
    if (m->dtype == ZB_DT_STRING) {
        /* no fixed-size fill; show what the document says */
        json_object *v = zb__json_get(doc, "fill_value");
        if (!v) *is_null = true;
        return v ? json_object_get(v) : NULL;
    }
    if (m->fill_null) {
        *is_null = true;
        return NULL;
    }
    uint64_t bits = 0;
    for (size_t i = 0; i < m->itemsize; i++) bits |= (uint64_t)m->fill[i] << (8 * i);
    switch (m->dtype) {
    case ZB_DT_BOOL:
        return json_object_new_boolean(bits != 0);
    case ZB_DT_INT8:
    case ZB_DT_INT16:
    case ZB_DT_INT32:
    case ZB_DT_INT64: {
        unsigned shift = (unsigned)(64 - 8 * m->itemsize);
        /* sign-extend through the unsigned top bits, then reinterpret */
        uint64_t ext = shift ? (bits << shift) : bits;
        int64_t s;
        memcpy(&s, &ext, sizeof s);
        return json_object_new_int64(shift ? s / ((int64_t)1 << shift) : s);
    }
    case ZB_DT_FLOAT16:
        return float_json(zb__half_to_double((uint16_t)bits));
    case ZB_DT_FLOAT32: {
        uint32_t u = (uint32_t)bits;
        float f;
        memcpy(&f, &u, sizeof f);
        return float_json(f);
    }
    case ZB_DT_FLOAT64: {
        double d;
        memcpy(&d, &bits, sizeof d);
        return float_json(d);
    }
    default:
        return json_object_new_uint64(bits);
    }
}

/* ---- stored bytes --------------------------------------------------------------------- */

typedef struct entry_list {
    char **name;
    bool *dir;
    size_t n, cap;
    bool nomem;
} entry_list;

static int
collect(void *ctx, const char *name, bool is_dir)
{
    entry_list *l = ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **nm = realloc(l->name, cap * sizeof *nm);
        if (nm) l->name = nm;
        bool *d = nm ? realloc(l->dir, cap * sizeof *d) : NULL;
        if (d) l->dir = d;
        if (!nm || !d) {
            l->nomem = true;
            return 1;
        }
        l->cap = cap;
    }
    if (!(l->name[l->n] = strdup(name))) {
        l->nomem = true;
        return 1;
    }
    l->dir[l->n++] = is_dir;
    return 0;
}

static void
entries_free(entry_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->name[i]);
    free(l->name);
    free(l->dir);
}

static bool
is_metadata_name(const char *name)
{
    return !strcmp(name, ".zarray") || !strcmp(name, ".zattrs") || !strcmp(name, ".zgroup") ||
           !strcmp(name, ".zmetadata") || !strcmp(name, "zarr.json");
}

/* Sums the sizes of the objects below `dir`: the chunks ('.'-separated v2 keys are files in
 * the array directory, '/' keys and v3 "c/..." keys nest), leaving out the metadata documents
 * at the top. `levels` bounds the recursion by the deepest key the array can have. */
static zb_status
sum_sizes(zb_store *store, const char *dir, bool top, int levels, uint64_t *total)
{
    entry_list l = {0};
    char key[KEY_CAP];
    zb_status st = zb_store_list(store, dir, collect, &l);
    if (st == ZB_OK && l.nomem) st = zb__err(ZB_E_NOMEM, "%s: out of memory listing", dir);
    for (size_t i = 0; i < l.n && st == ZB_OK; i++) {
        if (top && is_metadata_name(l.name[i])) continue;
        int w = snprintf(key, sizeof key, "%s%s%s", dir, *dir ? "/" : "", l.name[i]);
        if (w < 0 || (size_t)w >= sizeof key) {
            st = zb__err(ZB_E_INVALID, "%s: key too long", dir);
            break;
        }
        if (l.dir[i]) {
            if (levels > 0) st = sum_sizes(store, key, false, levels - 1, total);
            continue;
        }
        uint64_t size;
        st = zb_store_size(store, key, &size);
        if (st == ZB_E_NOTFOUND) { /* removed while listing */
            st = ZB_OK;
            continue;
        }
        if (st == ZB_OK && !zb__add_u64(*total, size, total))
            st = zb__err(ZB_E_OVERFLOW, "%s: stored bytes overflow", dir);
    }
    entries_free(&l);
    return st;
}

/* ---- nodes ---------------------------------------------------------------------------- */

/* Invalid array metadata fails the whole description: a store whose metadata is wrong is not
 * described as if it were fine. A valid array zbatch cannot read (an unsupported dtype or codec,
 * common in anndata's uns) is reported in place with "error", and the rest is still described. */
static zb_status
array_fields(builder *b, zb_store *store, const zb__tree_node *nd, json_object *o)
{
    zb__array_meta m;
    zb_status st = nd->zarr_format == 2 ? zb__meta_from_v2_obj(nd->doc, nd->attrs, nd->path, &m)
                                        : zb__meta_from_v3_obj(nd->doc, nd->path, &m);
    if (st == ZB_E_UNSUPPORTED) {
        put(b, o, "error", json_object_new_string(zb_last_error()));
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    put(b, o, "shape", dims_json(b, m.shape, m.ndim));
    put(b, o, "dtype", json_object_new_string(zb_dtype_name(m.dtype)));
    if (m.chain.ab == ZB_AB_SHARDING) {
        put(b, o, "chunks", dims_json(b, m.chain.shard->inner, m.ndim));
        put(b, o, "shards", dims_json(b, m.chunks, m.ndim));
    } else {
        put(b, o, "chunks", dims_json(b, m.chunks, m.ndim));
        put_null(b, o, "shards");
    }
    put(b, o, "codecs", json_object_new_string(m.codecs_desc));
    bool is_null;
    json_object *fill = fill_json(&m, nd->doc, &is_null);
    if (is_null)
        put_null(b, o, "fill_value");
    else
        put(b, o, "fill_value", fill);

    uint64_t stored = 0;
    /* deepest chunk key: "c" plus one level per dimension */
    if (sum_sizes(store, nd->path, true, m.ndim + 1, &stored) == ZB_OK)
        put(b, o, "stored_bytes", json_object_new_uint64(stored));
    else
        put_null(b, o, "stored_bytes");

    uint64_t logical = 1;
    for (int i = 0; i < m.ndim; i++) logical *= m.shape[i]; /* checked when parsed */
    if (m.dtype == ZB_DT_STRING)
        put_null(b, o, "logical_bytes");
    else
        put(b, o, "logical_bytes", json_object_new_uint64(logical * m.itemsize));
    zb__meta_free(&m);
    return ZB_OK;
}

zb_status
zb_info_json(zb_store *store, const char *path, char **json_out)
{
    if (!json_out) return zb__err(ZB_E_INVALID, "zb_info_json: null json_out");
    *json_out = NULL;
    zb__tree *tree = NULL;
    ZB_TRY(zb__tree_load(store, path ? path : "", true, &tree));
    zb_status st = zb__tree_info_json(store, tree, json_out);
    zb__tree_free(tree);
    return st;
}

zb_status
zb__tree_info_json(zb_store *store, const zb__tree *tree, char **json_out)
{
    *json_out = NULL;
    builder b = {false};
    zb_status st = ZB_OK;
    json_object *root = json_object_new_object();
    json_object *nodes = json_object_new_array();
    if (!root || !nodes) b.oom = true;
    for (size_t i = 0; i < tree->n && !b.oom && st == ZB_OK; i++) {
        const zb__tree_node *nd = &tree->nodes[i];
        json_object *o = json_object_new_object();
        if (!o) {
            b.oom = true;
            break;
        }
        put(&b, o, "path", json_object_new_string(nd->path));
        put(&b, o, "type", json_object_new_string(nd->is_array ? "array" : "group"));
        put(&b, o, "attributes", json_object_get(nd->attrs));
        if (nd->is_array) st = array_fields(&b, store, nd, o);
        append(&b, nodes, o);
    }
    if (root && !b.oom && st == ZB_OK) {
        put(&b, root, "path", json_object_new_string(tree->nodes[0].path));
        put(&b, root, "zarr_format", json_object_new_int(tree->zarr_format));
        put(&b, root, "layout", json_object_new_string(zb__tree_layout(tree)));
        put(&b, root, "consolidated", json_object_new_boolean(tree->consolidated));
        put(&b, root, "nodes", nodes);
        nodes = NULL;
    }
    char *text = NULL;
    if (!b.oom && st == ZB_OK) {
        text = strdup(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE));
    }
    json_object_put(nodes);
    json_object_put(root);
    if (st != ZB_OK) return st;
    if (!text) return zb__err(ZB_E_NOMEM, "zb_info_json: out of memory");
    *json_out = text;
    return ZB_OK;
}
