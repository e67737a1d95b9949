/* The tree of groups and arrays below a root: from consolidated metadata when present (v2
 * .zmetadata, FORMATS.md §1.4; v3 inline consolidated_metadata, §3.5), else by listing the
 * store and reading each child's node documents. Node documents are kept parsed; array
 * metadata is interpreted later (zb_meta_from_*_obj), so one odd array does not hide the rest
 * of the tree. Malformed JSON anywhere is an error naming the key. */
#include "zarr/tree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"
#include "util/status.h"
#include "util/utf8.h"
#include "zarr/array.h"

#define KEY_CAP 4096
/* Deeper group nesting than any real store; bounds the listing recursion. */
#define MAX_DEPTH 128

typedef struct tree_build {
    zb__tree *t;
    size_t cap;
} tree_build;

/* "a/b" from "a" and "b"; just one of them when the other is empty. */
static zb_status
join_key(char *buf, size_t cap, const char *a, const char *b)
{
    if (!a) a = "";
    int n = (*a && *b) ? snprintf(buf, cap, "%s/%s", a, b) : snprintf(buf, cap, "%s", *a ? a : b);
    if (n < 0 || (size_t)n >= cap)
        return zb__err(ZB_E_INVALID, "key \"%.64s/%.64s\" is too long", a ? a : "", b);
    return ZB_OK;
}

/* Takes ownership of doc and attrs (references), also on failure. */
static zb_status
add_node(tree_build *b, const char *path, bool is_array, int zarr_format, json_object *doc,
         json_object *attrs)
{
    zb__tree *t = b->t;
    size_t bad;
    if (!zb__utf8_valid(path, &bad)) {
        /* node names are Unicode (Zarr v3 §node names); bytes that are not UTF-8 would reach
         * JSON output and Python strings as they are */
        char shown[256];
        json_object_put(doc);
        json_object_put(attrs);
        return zb__err(ZB_E_BADKEY, "\"%s\": node name is not valid UTF-8 (byte %zu)",
                       zb__escape_bytes(path, shown, sizeof shown), bad);
    }
    if (t->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        zb__tree_node *nodes = realloc(t->nodes, cap * sizeof *nodes);
        if (!nodes) goto nomem;
        t->nodes = nodes;
        b->cap = cap;
    }
    char *p = strdup(path);
    if (!p) goto nomem;
    t->nodes[t->n++] = (zb__tree_node){p, is_array, zarr_format, doc, attrs};
    return ZB_OK;

nomem:
    json_object_put(doc);
    json_object_put(attrs);
    return zb__err(ZB_E_NOMEM, "tree: out of memory");
}

/* Reads and parses `key`; *found false (and *out NULL) if the key does not exist. */
static zb_status
read_json(zb_store *store, const char *key, bool *found, json_object **out)
{
    uint8_t *data = NULL;
    uint64_t len = 0;
    *out = NULL;
    *found = false;
    zb_status st = zb_store_read_all(store, key, &data, &len);
    if (st == ZB_E_NOTFOUND) return ZB_OK;
    if (st != ZB_OK) return st;
    *found = true;
    st = zb__json_parse((const char *)data, (size_t)len, key, out);
    free(data);
    return st;
}

/* The attributes of a node as a new reference: the object, or {} when absent. */
static zb_status
attrs_ref(json_object *attrs, const char *where, json_object **out)
{
    *out = NULL;
    if (attrs && !json_object_is_type(attrs, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: attributes are not a JSON object", where);
    *out = attrs ? json_object_get(attrs) : json_object_new_object();
    if (!*out) return zb__err(ZB_E_NOMEM, "tree: out of memory");
    return ZB_OK;
}

/* A consolidated key must already be a normalised relative path: no "." / ".." segments, no
 * empty segments, no leading or trailing '/'. */
static zb_status
check_rel_path(const char *key, const char *where)
{
    char norm[KEY_CAP];
    zb_status st = zb_key_normalize(key, norm, sizeof norm);
    if (st != ZB_OK || !key[0] || strcmp(norm, key) != 0 || strchr(key, '\\'))
        return zb__err(ZB_E_METADATA, "%s: key \"%.128s\" is not a normalised relative path", where,
                       key);
    return ZB_OK;
}

/* ---- listing -------------------------------------------------------------------------- */

typedef struct name_list {
    char **v;
    size_t n, cap;
    bool nomem;
} name_list;

static int
collect_dir(void *ctx, const char *name, bool is_dir)
{
    name_list *l = ctx;
    if (!is_dir) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->nomem = true;
            return 1;
        }
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(name))) {
        l->nomem = true;
        return 1;
    }
    l->n++;
    return 0;
}

static void
names_free(name_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

/* The subdirectories of `dir`; names are collected before any other store call, so backends
 * that hold a lock or a directory handle during list() are not re-entered. */
static zb_status
list_dirs(zb_store *store, const char *dir, name_list *out)
{
    memset(out, 0, sizeof *out);
    zb_status st = zb_store_list(store, dir, collect_dir, out);
    if (st == ZB_OK && out->nomem) st = zb__err(ZB_E_NOMEM, "tree: out of memory listing");
    if (st != ZB_OK) {
        names_free(out);
        memset(out, 0, sizeof *out);
    }
    return st;
}

static zb_status
v2_walk(tree_build *b, zb_store *store, const char *dir, int depth)
{
    char key[KEY_CAP], path[KEY_CAP];
    name_list kids;
    if (depth > MAX_DEPTH)
        return zb__err(ZB_E_UNSUPPORTED, "%s: groups nested deeper than %d levels", dir, MAX_DEPTH);
    ZB_TRY(list_dirs(store, dir, &kids));
    zb_status st = ZB_OK;
    for (size_t i = 0; i < kids.n && st == ZB_OK; i++) {
        json_object *doc = NULL, *za = NULL, *attrs = NULL;
        bool found, is_array = true;
        st = join_key(path, sizeof path, dir, kids.v[i]);
        if (st == ZB_OK) st = join_key(key, sizeof key, path, ".zarray");
        if (st == ZB_OK) st = read_json(store, key, &found, &doc);
        if (st == ZB_OK && !found) {
            is_array = false;
            st = join_key(key, sizeof key, path, ".zgroup");
            if (st == ZB_OK) st = read_json(store, key, &found, &doc);
        }
        if (st != ZB_OK || !found) continue; /* not a node: ignore the directory */
        st = join_key(key, sizeof key, path, ".zattrs");
        if (st == ZB_OK) st = read_json(store, key, &found, &za);
        if (st == ZB_OK) st = attrs_ref(za, key, &attrs);
        json_object_put(za);
        if (st != ZB_OK) {
            json_object_put(doc);
            continue;
        }
        st = add_node(b, path, is_array, 2, doc, attrs);
        /* an array's subdirectories are its chunks (dimension_separator "/") */
        if (st == ZB_OK && !is_array) st = v2_walk(b, store, path, depth + 1);
    }
    names_free(&kids);
    return st;
}

static zb_status
v3_node_type(json_object *doc, const char *where, bool *is_array)
{
    if (!json_object_is_type(doc, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: not a JSON object", where);
    json_object *zf = zb__json_get(doc, "zarr_format");
    if (!json_object_is_type(zf, json_type_int) || json_object_get_int64(zf) != 3)
        return zb__err(ZB_E_METADATA, "%s: zarr_format is not 3", where);
    json_object *nt = zb__json_get(doc, "node_type");
    const char *s = json_object_is_type(nt, json_type_string) ? json_object_get_string(nt) : "";
    if (!strcmp(s, "array"))
        *is_array = true;
    else if (!strcmp(s, "group"))
        *is_array = false;
    else
        return zb__err(ZB_E_METADATA, "%s: node_type is not \"array\" or \"group\"", where);
    return ZB_OK;
}

/* Adds a v3 node from its zarr.json document (a new reference is taken). */
static zb_status
v3_add(tree_build *b, const char *path, json_object *doc, const char *where, bool *is_array)
{
    json_object *attrs;
    ZB_TRY(v3_node_type(doc, where, is_array));
    ZB_TRY(attrs_ref(zb__json_get(doc, "attributes"), where, &attrs));
    return add_node(b, path, *is_array, 3, json_object_get(doc), attrs);
}

static zb_status
v3_walk(tree_build *b, zb_store *store, const char *dir, int depth)
{
    char key[KEY_CAP], path[KEY_CAP];
    name_list kids;
    if (depth > MAX_DEPTH)
        return zb__err(ZB_E_UNSUPPORTED, "%s: groups nested deeper than %d levels", dir, MAX_DEPTH);
    ZB_TRY(list_dirs(store, dir, &kids));
    zb_status st = ZB_OK;
    for (size_t i = 0; i < kids.n && st == ZB_OK; i++) {
        json_object *doc = NULL;
        bool found, is_array = false;
        st = join_key(path, sizeof path, dir, kids.v[i]);
        if (st == ZB_OK) st = join_key(key, sizeof key, path, "zarr.json");
        if (st == ZB_OK) st = read_json(store, key, &found, &doc);
        if (st != ZB_OK || !found) continue; /* not a node (e.g. an array's "c" directory) */
        st = v3_add(b, path, doc, key, &is_array);
        json_object_put(doc);
        if (st == ZB_OK && !is_array) st = v3_walk(b, store, path, depth + 1);
    }
    names_free(&kids);
    return st;
}

/* ---- consolidated metadata ------------------------------------------------------------ */

static bool
has_path(const tree_build *b, const char *path)
{
    for (size_t i = 0; i < b->t->n; i++)
        if (!strcmp(b->t->nodes[i].path, path)) return true;
    return false;
}

/* Adds the entries of a v3 consolidated_metadata object below `base`. zarr-python writes the
 * keys flattened into the root ("a", "a/b", "a/b/arr") and leaves nested groups with an empty
 * consolidated_metadata; early zarr-python 3 releases nested them instead, so a non-empty
 * nested one is merged too (entries already seen win). */
static zb_status
v3_consolidated(tree_build *b, json_object *cm, const char *base, const char *where, int depth,
                bool top)
{
    char path[KEY_CAP], what[KEY_CAP + 64];
    if (depth > MAX_DEPTH)
        return zb__err(ZB_E_UNSUPPORTED, "%s: consolidated metadata nested too deep", where);
    if (!json_object_is_type(cm, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: consolidated_metadata is not an object", where);
    json_object *kind = zb__json_get(cm, "kind");
    if (!json_object_is_type(kind, json_type_string) ||
        strcmp(json_object_get_string(kind), "inline") != 0)
        return zb__err(ZB_E_METADATA, "%s: consolidated_metadata kind is not \"inline\"", where);
    json_object *md = zb__json_get(cm, "metadata");
    if (!json_object_is_type(md, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: consolidated_metadata has no \"metadata\" object",
                       where);
    json_object_object_foreach(md, key, val)
    {
        ZB_TRY(check_rel_path(key, where));
        ZB_TRY(join_key(path, sizeof path, base, key));
        if (!top && has_path(b, path)) continue;
        snprintf(what, sizeof what, "%s: consolidated entry \"%s\"", where, key);
        bool is_array;
        ZB_TRY(v3_add(b, path, val, what, &is_array));
        json_object *sub = zb__json_get(val, "consolidated_metadata");
        if (!is_array && sub) {
            json_object *smd = zb__json_get(sub, "metadata");
            if (json_object_is_type(smd, json_type_object) && json_object_object_length(smd))
                ZB_TRY(v3_consolidated(b, sub, path, what, depth + 1, false));
        }
    }
    return ZB_OK;
}

/* One .zmetadata key split into its node directory (the first `dlen` bytes of `key`, which
 * lives in the parsed document) and document kind. */
typedef struct zm_entry {
    const char *key;
    size_t dlen;
    int kind; /* 0 .zgroup, 1 .zarray, 2 .zattrs */
    json_object *val;
} zm_entry;

/* Orders directories as strcmp would order them as separate strings, then by kind. */
static int
zm_cmp(const void *a, const void *b)
{
    const zm_entry *x = a, *y = b;
    size_t n = x->dlen < y->dlen ? x->dlen : y->dlen;
    int c = memcmp(x->key, y->key, n);
    if (!c) c = (x->dlen > y->dlen) - (x->dlen < y->dlen);
    return c ? c : x->kind - y->kind;
}

static bool
same_dir(const zm_entry *x, const zm_entry *y)
{
    return x->dlen == y->dlen && !memcmp(x->key, y->key, x->dlen);
}

/* v2 .zmetadata: {"metadata": {"sub/arr/.zarray": {...}, ...}, "zarr_consolidated_format": 1}.
 * Entries are sorted by node directory so each node's documents sit together. */
static zb_status
v2_consolidated(tree_build *b, json_object *zm, const char *base, const char *where)
{
    static const char *const suffix[] = {".zgroup", ".zarray", ".zattrs"};
    char dir[KEY_CAP], path[KEY_CAP];
    zm_entry *e = NULL;
    size_t n = 0;
    zb_status st = ZB_OK;
    json_object *md = zb__json_get(zm, "metadata");
    if (!json_object_is_type(md, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: no \"metadata\" object", where);
    json_object *cf = zb__json_get(zm, "zarr_consolidated_format");
    if (cf && (!json_object_is_type(cf, json_type_int) || json_object_get_int64(cf) != 1))
        return zb__err(ZB_E_METADATA, "%s: zarr_consolidated_format is not 1", where);
    size_t total = (size_t)json_object_object_length(md);
    e = calloc(total ? total : 1, sizeof *e);
    if (!e) return zb__err(ZB_E_NOMEM, "%s: out of memory", where);
    json_object_object_foreach(md, key, val)
    {
        const char *slash = strrchr(key, '/');
        const char *last = slash ? slash + 1 : key;
        int kind = -1;
        for (int k = 0; k < 3; k++)
            if (!strcmp(last, suffix[k])) kind = k;
        if (kind < 0) continue; /* not a node document */
        size_t dlen = slash ? (size_t)(slash - key) : 0;
        if (dlen >= KEY_CAP) {
            st = zb__err(ZB_E_METADATA, "%s: key \"%.64s...\" is too long", where, key);
            goto done;
        }
        memcpy(dir, key, dlen);
        dir[dlen] = '\0';
        if (dlen && (st = check_rel_path(dir, where)) != ZB_OK) goto done;
        if (kind < 2 && !json_object_is_type(val, json_type_object)) {
            st = zb__err(ZB_E_METADATA, "%s: entry \"%s\" is not an object", where, key);
            goto done;
        }
        e[n++] = (zm_entry){key, dlen, kind, val};
    }
    qsort(e, n, sizeof *e, zm_cmp);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        json_object *grp = NULL, *arr = NULL, *za = NULL;
        for (; j < n && same_dir(&e[i], &e[j]); j++) {
            if (e[j].kind == 0) grp = e[j].val;
            if (e[j].kind == 1) arr = e[j].val;
            if (e[j].kind == 2) za = e[j].val;
        }
        memcpy(dir, e[i].key, e[i].dlen);
        dir[e[i].dlen] = '\0';
        i = j;
        if (!grp && !arr) continue; /* .zattrs without a node */
        if (grp && arr) {
            st = zb__err(ZB_E_METADATA, "%s: \"%s\" is both a group and an array", where, dir);
            goto done;
        }
        json_object *attrs;
        if ((st = join_key(path, sizeof path, base, dir)) != ZB_OK) goto done;
        if ((st = attrs_ref(za, where, &attrs)) != ZB_OK) goto done;
        st = add_node(b, path, arr != NULL, 2, json_object_get(arr ? arr : grp), attrs);
        if (st != ZB_OK) goto done;
    }
done:
    free(e);
    return st;
}

/* ---- the tree ------------------------------------------------------------------------- */

static int
node_cmp(const void *a, const void *b)
{
    return strcmp(((const zb__tree_node *)a)->path, ((const zb__tree_node *)b)->path);
}

static void
node_clear(zb__tree_node *n)
{
    free(n->path);
    json_object_put(n->doc);
    json_object_put(n->attrs);
}

/* Sorts the nodes, drops duplicates (the first kept) and nodes below an array (consolidated
 * metadata may list them; an array has no children). */
static void
tree_finish(zb__tree *t)
{
    qsort(t->nodes, t->n, sizeof *t->nodes, node_cmp);
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++) {
        zb__tree_node *nd = &t->nodes[i];
        bool drop = w > 0 && !strcmp(t->nodes[w - 1].path, nd->path);
        for (char *s = strchr(nd->path, '/'); s && !drop; s = strchr(s + 1, '/')) {
            *s = '\0';
            const zb__tree_node *anc = zb__tree_find(&(zb__tree){0, false, w, t->nodes}, nd->path);
            *s = '/';
            drop = anc && anc->is_array;
        }
        if (drop)
            node_clear(nd);
        else
            t->nodes[w++] = *nd;
    }
    t->n = w;
}

static zb_status
load_v3(tree_build *b, zb_store *store, const char *root, json_object *doc, const char *key,
        bool use_consolidated)
{
    bool is_array;
    ZB_TRY(v3_add(b, root, doc, key, &is_array));
    if (is_array) return ZB_OK;
    json_object *cm = zb__json_get(doc, "consolidated_metadata");
    /* zarr-python writes "consolidated_metadata": null in unconsolidated groups */
    if (use_consolidated && cm) {
        b->t->consolidated = true;
        return v3_consolidated(b, cm, root, key, 0, true);
    }
    return v3_walk(b, store, root, 0);
}

static zb_status
load_v2(tree_build *b, zb_store *store, const char *root, json_object *doc, const char *doc_key,
        bool is_array, bool use_consolidated)
{
    char key[KEY_CAP];
    json_object *za = NULL, *attrs = NULL, *zm = NULL;
    bool found;
    zb_status st;
    if (!json_object_is_type(doc, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: not a JSON object", doc_key);
    if (use_consolidated && !is_array) {
        ZB_TRY(join_key(key, sizeof key, root, ".zmetadata"));
        ZB_TRY(read_json(store, key, &found, &zm));
        if (found) {
            b->t->consolidated = true;
            st = v2_consolidated(b, zm, root, key);
            json_object_put(zm);
            if (st != ZB_OK) return st;
            /* A .zmetadata without the root's own entries still describes the children. */
            if (has_path(b, root)) return ZB_OK;
        }
    }
    ZB_TRY(join_key(key, sizeof key, root, ".zattrs"));
    ZB_TRY(read_json(store, key, &found, &za));
    st = attrs_ref(za, key, &attrs);
    json_object_put(za);
    if (st != ZB_OK) return st;
    ZB_TRY(add_node(b, root, is_array, 2, json_object_get(doc), attrs));
    if (is_array || b->t->consolidated) return ZB_OK;
    return v2_walk(b, store, root, 0);
}

zb_status
zb__tree_load(zb_store *store, const char *root, bool use_consolidated, zb__tree **out)
{
    char rk[KEY_CAP], key[KEY_CAP];
    json_object *doc = NULL;
    bool found;
    zb_status st;
    if (!out) return zb__err(ZB_E_INVALID, "zb__tree_load: null out");
    *out = NULL;
    if (!store) return zb__err(ZB_E_INVALID, "zb__tree_load: null store");
    ZB_TRY(zb_key_normalize(root ? root : "", rk, sizeof rk));
    /* A writer's marker (include/zbatch_anndata.h) means a write began and never committed:
     * whatever documents are there may describe a half-written store. */
    uint64_t marker_size;
    ZB_TRY(join_key(key, sizeof key, rk, ZB_INCOMPLETE_MARKER));
    st = zb_store_size(store, key, &marker_size);
    if (st == ZB_OK)
        return zb__err(ZB_E_INCOMPLETE, "%s%s%s: incomplete: a write was not committed (%s)",
                       rk[0] ? "\"" : "the store root", rk, rk[0] ? "\"" : "", key);
    if (st != ZB_E_NOTFOUND) return st;
    tree_build b = {calloc(1, sizeof(zb__tree)), 0};
    if (!b.t) return zb__err(ZB_E_NOMEM, "tree: out of memory");

    /* A zarr.json means v3 even if v2 documents sit beside it (FORMATS.md §1.1). */
    st = join_key(key, sizeof key, rk, "zarr.json");
    if (st == ZB_OK) st = read_json(store, key, &found, &doc);
    if (st != ZB_OK) goto fail;
    if (found) {
        b.t->zarr_format = 3;
        st = load_v3(&b, store, rk, doc, key, use_consolidated);
    } else {
        bool is_array = false;
        st = join_key(key, sizeof key, rk, ".zgroup");
        if (st == ZB_OK) st = read_json(store, key, &found, &doc);
        if (st == ZB_OK && !found) {
            is_array = true;
            st = join_key(key, sizeof key, rk, ".zarray");
            if (st == ZB_OK) st = read_json(store, key, &found, &doc);
        }
        if (st != ZB_OK) goto fail;
        if (!found) {
            st = zb__err(ZB_E_NOTFOUND, "%s%s%s: no zarr.json, .zgroup or .zarray",
                         rk[0] ? "\"" : "the store root", rk, rk[0] ? "\"" : "");
            goto fail;
        }
        b.t->zarr_format = 2;
        st = load_v2(&b, store, rk, doc, key, is_array, use_consolidated);
    }
    if (st != ZB_OK) goto fail;
    json_object_put(doc);
    tree_finish(b.t);
    *out = b.t;
    return ZB_OK;

fail:
    json_object_put(doc);
    zb__tree_free(b.t);
    return st;
}

void
zb__tree_free(zb__tree *tree)
{
    if (!tree) return;
    for (size_t i = 0; i < tree->n; i++) node_clear(&tree->nodes[i]);
    free(tree->nodes);
    free(tree);
}

const zb__tree_node *
zb__tree_find(const zb__tree *tree, const char *path)
{
    if (!tree || !path) return NULL;
    size_t lo = 0, hi = tree->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(tree->nodes[mid].path, path);
        if (c == 0) return &tree->nodes[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

zb_status
zb__tree_join(char *buf, size_t cap, const char *a, const char *b)
{
    return join_key(buf, cap, a, b);
}

zb_status
zb__tree_node_open_array(zb_store *store, const zb__tree_node *nd, zb_array **out)
{
    *out = NULL;
    if (!nd->is_array) return zb__err(ZB_E_TYPE, "\"%s\" is a group, not an array", nd->path);
    zb__array_meta m;
    zb_status st = nd->zarr_format == 2 ? zb__meta_from_v2_obj(nd->doc, nd->attrs, nd->path, &m)
                                        : zb__meta_from_v3_obj(nd->doc, nd->path, &m);
    if (st != ZB_OK) return st;
    return zb__array_open_meta(store, nd->path, &m, out);
}

const char *
zb__tree_layout(const zb__tree *tree)
{
    if (!tree || tree->n == 0) return "plain";
    const zb__tree_node *root = &tree->nodes[0];
    const char *et = zb__json_string(root->attrs, "encoding-type");
    if (et && !strcmp(et, "anndata")) return "anndata";
    if (et && !strcmp(et, "annbatch-preshuffled")) return "annbatch-collection";
    char p[KEY_CAP];
    if (join_key(p, sizeof p, root->path, "meta/atoms_ptr") != ZB_OK) return "plain";
    const zb__tree_node *ptr = zb__tree_find(tree, p);
    if (join_key(p, sizeof p, root->path, "core") != ZB_OK) return "plain";
    const zb__tree_node *core = zb__tree_find(tree, p);
    if (ptr && ptr->is_array && core && !core->is_array && zb__json_get(root->attrs, "fields"))
        return "atomic";
    return "plain";
}
