/* Datasets: open (layout detection, collections), fields, length, categories. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "store/store.h"
#include "util/json.h"
#include "util/status.h"
#include "zarr/meta.h"
#include "zarr/tree.h"

/* Shard indexes kept decoded: 64 MiB holds ~1,000 Tahoe-sized (65,540-byte) indexes. */
#define INDEX_CACHE_BYTES ((size_t)64 << 20)

static void
field_free(zb__field *f)
{
    free(f->name);
    free(f->mask);
    free(f->cats_path);
    zb_array_close(f->cats_arr);
    zb__cattab_free(&f->cats);
    zb_array_close(f->arr);
}

static void
maps_free(zb_dataset *ds)
{
    size_t nf = ds->nchildren ? ds->children[0]->nfields : 0;
    for (size_t f = 0; ds->maps && f < nf; f++) {
        for (size_t c = 0; ds->maps[f].lut && c < ds->nchildren; c++) free(ds->maps[f].lut[c]);
        free(ds->maps[f].lut);
        free(ds->maps[f].nlut);
        zb__cattab_free(&ds->maps[f].cats);
    }
    free(ds->maps);
    for (size_t c = 0; ds->vars.lut && c < ds->nchildren; c++) free(ds->vars.lut[c]);
    free(ds->vars.lut);
}

void
zb_dataset_close(zb_dataset *ds)
{
    if (!ds) return;
    maps_free(ds);
    for (size_t i = 0; i < ds->nfields; i++) field_free(&ds->fields[i]);
    for (size_t i = 0; i < ds->ncols; i++) {
        free(ds->cols[i].name);
        zb_array_close(ds->cols[i].values);
        zb_array_close(ds->cols[i].mask);
    }
    free(ds->cols);
    free(ds->var_index);
    free(ds->var_frame);
    zb_strings_free(&ds->var_names);
    pthread_mutex_destroy(&ds->var_mu);
    pthread_mutex_destroy(&ds->fetch_mu);
    for (size_t i = 0; i < ds->nsegs; i++) {
        zb__segment *s = &ds->segs[i];
        for (uint64_t b = 0; s->blocks && b < s->nblocks; b++) free(s->blocks[b]);
        free(s->blocks);
        zb_array_close(s->ptr);
        pthread_mutex_destroy(&s->mu);
    }
    for (size_t i = 0; i < ds->nchildren && !ds->borrowed; i++) zb_dataset_close(ds->children[i]);
    free(ds->children);
    free(ds->child_start);
    zb_array_close(ds->mask.arr);
    free(ds->mask.bits);
    free(ds->mask.rank);
    pthread_mutex_destroy(&ds->mask.mu);
    zb__pool_free(ds->pool);
    zb__cache_free(ds->cache);
    zb__cache_free(ds->index_cache);
    zb__cache_free(ds->fetch_cache);
    zb__arena_pool_unref(ds->arenas);
    zb__plan_mem_release_all(ds);
    pthread_mutex_destroy(&ds->plan_mu);
    pthread_mutex_destroy(&ds->pool_mu);
    free(ds->layer);
    free(ds->name);
    free(ds->path);
    free(ds);
}

static const char *
root_encoding(const zb__tree *tree, const char *base)
{
    const zb__tree_node *root = zb__tree_find(tree, base);
    json_object *v = root ? zb__json_get(root->attrs, "encoding-type") : NULL;
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
}

/* A dataset named `name` (zb_dataset_name), or the store's name and `path`. */
static zb_dataset *
dataset_alloc(zb_store *store, const char *path, const zb_dataset_opts *opts, const char *name)
{
    zb_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->store = store;
    ds->path = strdup(path);
    zb_dataset_opts d = ZB_DATASET_OPTS_DEFAULT;
    ds->opts = opts ? *opts : d;
    pthread_mutex_init(&ds->mask.mu, NULL);
    pthread_mutex_init(&ds->pool_mu, NULL);
    pthread_mutex_init(&ds->plan_mu, NULL);
    pthread_mutex_init(&ds->var_mu, NULL);
    pthread_mutex_init(&ds->fetch_mu, NULL);
    if (name) {
        ds->name = strdup(name);
    } else {
        const char *sn = zb_store_name(store);
        size_t n = strlen(sn) + strlen(path) + 2;
        ds->name = malloc(n);
        bool slash = sn[0] && sn[strlen(sn) - 1] == '/';
        if (ds->name) snprintf(ds->name, n, "%s%s%s", sn, path[0] && !slash ? "/" : "", path);
    }
    /* the layer name is the caller's: keep a copy (children and in-memory copies reuse opts) */
    if (ds->opts.layer) ds->layer = strdup(ds->opts.layer);
    ds->opts.layer = ds->layer;
    /* the dtype names are read by want_dtypes (zb_dataset_open), children take their parent's */
    ds->x_want = ds->index_want = ZB_WANT_AUTO;
    ds->opts.x_dtype = ds->opts.index_dtype = NULL;
    if (!ds->path || !ds->name || (opts && opts->layer && !ds->layer)) {
        zb_dataset_close(ds);
        return NULL;
    }
    return ds;
}

/* The fetch cache (zb_dataset_opts.fetch_cache_bytes), made only when some store the dataset
 * reads lists ranges itself: reads of a local store hit the page cache instead. */
static zb_status
fetch_cache_new(zb_dataset *ds)
{
    bool lists = ds->store->m->get_ranges != NULL;
    for (size_t c = 0; c < ds->nchildren; c++)
        lists = lists || ds->children[c]->store->m->get_ranges != NULL;
    if (!lists || !ds->opts.fetch_cache_bytes) return ZB_OK;
    return zb__cache_new(ds->opts.fetch_cache_bytes, &ds->fetch_cache);
}

const char *
zb_dataset_name(const zb_dataset *ds)
{
    /* a root dataset of a store without a name (a memory store) is named for what it is, so a
     * message never starts with an empty name (": no array ...") */
    return ds && ds->name && ds->name[0] ? ds->name : "the store root";
}

/* Orders dataset_<k> children numerically (FORMATS.md §7.1). */
typedef struct child_name {
    unsigned long long k;
    const char *path;
} child_name;

static int
cmp_child(const void *a, const void *b)
{
    const child_name *x = a, *y = b;
    return x->k < y->k ? -1 : x->k > y->k;
}

static zb_status open_layout(zb_dataset *ds, const zb__tree *tree, const char *base);

static zb_status
open_collection(zb_dataset *ds, const zb__tree *tree, const char *base)
{
    size_t plen = strlen(base);
    child_name *names = calloc(tree->n + 1, sizeof *names);
    if (!names) return zb__err(ZB_E_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < tree->n; i++) {
        const zb__tree_node *nd = &tree->nodes[i];
        const char *rel = nd->path + plen + (plen ? 1 : 0);
        if (nd->is_array || (plen && (strncmp(nd->path, base, plen) || nd->path[plen] != '/')) ||
            strchr(rel, '/') || strncmp(rel, "dataset_", 8) || !rel[8])
            continue;
        bool digits = true;
        for (const char *p = rel + 8; *p; p++) digits = digits && isdigit((unsigned char)*p);
        if (!digits) continue;
        names[n].k = strtoull(rel + 8, NULL, 10);
        names[n].path = nd->path;
        n++;
    }
    zb_status st = ZB_OK;
    if (n == 0) {
        st = zb__err(ZB_E_CORRUPT, "%s: a collection without dataset_<k> children",
                     zb_dataset_name(ds));
        goto done;
    }
    qsort(names, n, sizeof *names, cmp_child);
    ds->children = calloc(n, sizeof *ds->children);
    ds->child_start = calloc(n + 1, sizeof *ds->child_start);
    if (!ds->children || !ds->child_start) {
        st = zb__err(ZB_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t c = 0; c < n; c++) {
        zb_dataset *ch = dataset_alloc(ds->store, names[c].path, &ds->opts, NULL);
        if (!ch) {
            st = zb__err(ZB_E_NOMEM, "out of memory");
            goto done;
        }
        ch->is_child = true;
        ch->x_want = ds->x_want;
        ch->index_want = ds->index_want;
        ds->children[ds->nchildren++] = ch;
        st = open_layout(ch, tree, names[c].path);
        if (st != ZB_OK) goto done;
        if (ch->nchildren) {
            st = zb__err(ZB_E_UNSUPPORTED, "%s: nested collections", names[c].path);
            goto done;
        }
    }
    snprintf(ds->layout, sizeof ds->layout, "collection");
    ds->n_vars = ds->children[0]->n_vars;
    st = zb__collection_merge(ds, ZB_E_CORRUPT);
done:
    free(names);
    return st;
}

static zb_status
open_layout(zb_dataset *ds, const zb__tree *tree, const char *base)
{
    const char *enc = root_encoding(tree, base);
    const zb__tree_node *root = zb__tree_find(tree, base);
    char p[4200];
    snprintf(p, sizeof p, "%s%smeta/atoms_ptr", base, base[0] ? "/" : "");
    if (!strcmp(enc, "anndata")) {
        snprintf(ds->layout, sizeof ds->layout, "anndata");
        return zb__layout_anndata(ds, tree, base);
    }
    if (!strcmp(enc, "annbatch-preshuffled") || !strcmp(enc, "zbatch-collection"))
        return open_collection(ds, tree, base);
    if (zb__tree_find(tree, p)) {
        snprintf(ds->layout, sizeof ds->layout, "atomic");
        return zb__layout_atomistic(ds, tree, base);
    }
    if (root && zb__json_get(root->attrs, "zbatch")) {
        snprintf(ds->layout, sizeof ds->layout, "generic");
        return zb__layout_generic(ds, tree, base);
    }
    return zb__err(ZB_E_UNSUPPORTED,
                   "%s: no dataset layout recognised (anndata, atomic, "
                   "collection, or a 'zbatch' attribute)",
                   zb_dataset_name(ds));
}

/* An x_dtype/index_dtype option: NULL (the default rule), "stored", or a dtype name among
 * `allowed` (NULL-terminated; `listed` names them for the error). */
static zb_status
want_dtype(const char *name, const char *opt, const char *const *allowed, const char *listed,
           int *out)
{
    *out = ZB_WANT_AUTO;
    if (!name) return ZB_OK;
    if (!strcmp(name, "stored")) {
        *out = ZB_WANT_STORED;
        return ZB_OK;
    }
    for (size_t i = 0; allowed[i]; i++) {
        if (strcmp(name, allowed[i])) continue;
        zb_dtype dt;
        ZB_TRY(zb__dtype_parse_v3(name, opt, &dt));
        *out = (int)dt;
        return ZB_OK;
    }
    return zb__err(ZB_E_INVALID, "%s \"%.40s\": expected \"stored\", %s", opt, name, listed);
}

static zb_status
want_dtypes(zb_dataset *ds, const zb_dataset_opts *opts)
{
    static const char *const values[] = {"float32", "float64", "int32", "int64", NULL};
    static const char *const ids[] = {"int32", "int64", NULL};
    if (!opts) return ZB_OK;
    ZB_TRY(want_dtype(opts->x_dtype, "x_dtype", values, "float32, float64, int32 or int64",
                      &ds->x_want));
    return want_dtype(opts->index_dtype, "index_dtype", ids, "int32 or int64", &ds->index_want);
}

zb_status
zb_dataset_open(zb_store *store, const char *path, const zb_dataset_opts *opts, zb_dataset **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_dataset_open: null out");
    *out = NULL;
    if (!store) return zb__err(ZB_E_INVALID, "zb_dataset_open: null store");
    char norm[4096];
    ZB_TRY(zb_key_normalize(path ? path : "", norm, sizeof norm));
    return zb__dataset_open_tree(store, norm, NULL, opts, out);
}

zb_status
zb__dataset_open_tree(zb_store *store, const char *norm, const zb__tree *given,
                      const zb_dataset_opts *opts, zb_dataset **out)
{
    *out = NULL;
    zb_dataset *ds = dataset_alloc(store, norm, opts, NULL);
    if (!ds) return zb__err(ZB_E_NOMEM, "zb_dataset_open: out of memory");
    zb__tree *tree = NULL;
    zb_status st = want_dtypes(ds, opts);
    if (st == ZB_OK && !given) st = zb__tree_load(store, norm, ds->opts.use_consolidated, &tree);
    if (st == ZB_OK) {
        const zb__tree *t = given ? given : tree;
        st = open_layout(ds, t, t->nodes[0].path);
    }
    zb__tree_free(tree);
    if (st == ZB_OK && ds->opts.cache_bytes) st = zb__cache_new(ds->opts.cache_bytes, &ds->cache);
    if (st == ZB_OK) st = zb__pool_new(ds->opts.num_threads, &ds->pool);
    if (st == ZB_OK) st = zb__arena_pool_new(&ds->arenas);
    if (st == ZB_OK) st = zb__cache_new(INDEX_CACHE_BYTES, &ds->index_cache);
    if (st == ZB_OK) st = fetch_cache_new(ds);
    if (st == ZB_OK && ds->nchildren) {
        uint64_t total = 0;
        for (size_t c = 0; c < ds->nchildren && st == ZB_OK; c++) {
            uint64_t n = 0;
            st = zb_dataset_len(ds->children[c], &n);
            ds->child_start[c] = total;
            total += n;
        }
        ds->child_start[ds->nchildren] = total;
        ds->nphys = total;
    }
    if (st != ZB_OK) {
        zb_dataset_close(ds);
        return st;
    }
    *out = ds;
    return ZB_OK;
}

const char *
zb_dataset_layout(const zb_dataset *ds)
{
    return ds ? ds->layout : "";
}

/* The dataset whose fields describe every sample (the first child of a collection). */
static const zb_dataset *
proto(const zb_dataset *ds)
{
    return ds->nchildren ? ds->children[0] : ds;
}

zb_status
zb_dataset_len(zb_dataset *ds, uint64_t *n)
{
    if (!ds || !n) return zb__err(ZB_E_INVALID, "zb_dataset_len: null argument");
    if (ds->nchildren) {
        *n = ds->child_start[ds->nchildren];
        return ZB_OK;
    }
    if (ds->mask.arr) {
        ZB_TRY(zb__mask_load(ds));
        *n = ds->mask.nlogical;
        return ZB_OK;
    }
    *n = ds->nphys;
    return ZB_OK;
}

size_t
zb_dataset_nfields(const zb_dataset *ds)
{
    return ds ? proto(ds)->nfields : 0;
}

uint64_t
zb_dataset_n_vars(const zb_dataset *ds)
{
    return ds ? ds->n_vars : 0;
}

size_t
zb_dataset_nchildren(const zb_dataset *ds)
{
    return ds && ds->nchildren ? ds->nchildren : 1;
}

zb_status
zb_dataset_field(const zb_dataset *ds, size_t i, zb_field_info *info)
{
    if (!ds || !info) return zb__err(ZB_E_INVALID, "zb_dataset_field: null argument");
    const zb_dataset *p = proto(ds);
    if (i >= p->nfields) return zb__err(ZB_E_RANGE, "field %zu of %zu", i, p->nfields);
    const zb__field *f = &p->fields[i];
    info->name = f->name;
    info->kind = f->kind;
    info->dtype = zb__dataset_field_dtype(ds, i);
    info->ndim = f->ndim;
    info->row_shape = f->row_shape;
    info->segment = f->seg >= 0 ? p->segs[f->seg].name : NULL;
    info->target = f->target >= 0 ? p->segs[f->target].name : NULL;
    info->categorical = f->categorical;
    info->array = f->arr->path;
    info->mask = f->mask;
    return ZB_OK;
}

zb_status
zb_dataset_find_field(const zb_dataset *ds, const char *name, size_t *index)
{
    if (!ds || !name || !index) return zb__err(ZB_E_INVALID, "zb_dataset_find_field: null");
    const zb_dataset *p = proto(ds);
    for (size_t i = 0; i < p->nfields; i++)
        if (!strcmp(p->fields[i].name, name)) {
            *index = i;
            return ZB_OK;
        }
    return zb__err(ZB_E_NOTFOUND, "%s: no field '%s'", zb_dataset_name(ds), name);
}

zb_status
zb_dataset_set_threads(zb_dataset *ds, int num_threads)
{
    if (!ds) return zb__err(ZB_E_INVALID, "zb_dataset_set_threads: null dataset");
    zb__pool *p = NULL;
    ZB_TRY(zb__pool_new(num_threads, &p));
    pthread_mutex_lock(&ds->pool_mu);
    zb__pool *old = ds->pool;
    ds->pool = p;
    ds->opts.num_threads = num_threads;
    pthread_mutex_unlock(&ds->pool_mu);
    zb__pool_free(old);
    return ZB_OK;
}

static zb_status
child_lengths(zb_dataset *ds, const char *segment, uint64_t *out)
{
    size_t s = 0;
    while (s < ds->nsegs && strcmp(ds->segs[s].name, segment)) s++;
    if (s == ds->nsegs)
        return zb__err(ZB_E_NOTFOUND, "%s: no segment '%s'", zb_dataset_name(ds), segment);
    ZB_TRY(zb__mask_load(ds));
    uint64_t n = 0;
    ZB_TRY(zb_dataset_len(ds, &n));
    zb_ctx *ctx = NULL;
    ZB_TRY(zb_ctx_new(&ctx));
    zb_status st = ZB_OK;
    int64_t prev = 0;
    uint64_t prev_p = UINT64_MAX;
    for (uint64_t i = 0; i < n && st == ZB_OK; i++) {
        uint64_t p = zb__mask_select(&ds->mask, i);
        int64_t a0 = 0, a1 = 0;
        if (p == prev_p + 1) {
            a0 = prev; /* consecutive rows share a pointer */
        } else {
            st = zb__segment_get(&ds->segs[s], ctx, p, &a0);
        }
        if (st == ZB_OK) st = zb__segment_get(&ds->segs[s], ctx, p + 1, &a1);
        if (st == ZB_OK && a1 < a0)
            st = zb__err(ZB_E_CORRUPT, "%s: pointers decrease at row %llu", ds->segs[s].ptr->path,
                         (unsigned long long)p);
        if (st != ZB_OK) break;
        out[i] = (uint64_t)a1 - (uint64_t)a0; /* a1 >= a0: no wrap, even from a0 < 0 */
        prev = a1;
        prev_p = p;
    }
    zb_ctx_free(ctx);
    return st;
}

zb_status
zb_dataset_segment_lengths(zb_dataset *ds, const char *segment, uint64_t *out)
{
    if (!ds || !segment || !out) return zb__err(ZB_E_INVALID, "zb_dataset_segment_lengths: null");
    if (!ds->nchildren) return child_lengths(ds, segment, out);
    for (size_t c = 0; c < ds->nchildren; c++)
        ZB_TRY(child_lengths(ds->children[c], segment, out + ds->child_start[c]));
    return ZB_OK;
}

zb_status
zb_dataset_concat(zb_dataset *const *children, size_t n, const zb_dataset_opts *opts,
                  zb_dataset **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_dataset_concat: null out");
    *out = NULL;
    if (!children || n == 0) return zb__err(ZB_E_INVALID, "zb_dataset_concat: no datasets");
    for (size_t c = 0; c < n; c++) {
        if (!children[c]) return zb__err(ZB_E_INVALID, "zb_dataset_concat: dataset %zu is null", c);
        if (children[c]->nchildren)
            return zb__err(ZB_E_UNSUPPORTED, "zb_dataset_concat: dataset %zu is a collection", c);
    }
    char name[4200];
    snprintf(name, sizeof name, "%s", zb_dataset_name(children[0]));
    if (n > 1) snprintf(name + strlen(name), sizeof name - strlen(name), "+%zu", n - 1);
    zb_dataset *ds = dataset_alloc(children[0]->store, "", opts, name);
    if (!ds) return zb__err(ZB_E_NOMEM, "zb_dataset_concat: out of memory");
    ds->borrowed = true;
    snprintf(ds->layout, sizeof ds->layout, "%s", children[0]->layout);
    ds->children = calloc(n, sizeof *ds->children);
    ds->child_start = calloc(n + 1, sizeof *ds->child_start);
    zb_status st =
        ds->children && ds->child_start ? ZB_OK : zb__err(ZB_E_NOMEM, "zb_dataset_concat: oom");
    if (st == ZB_OK) {
        memcpy(ds->children, children, n * sizeof *children);
        ds->nchildren = n;
        ds->n_vars = children[0]->n_vars;
        st = zb__collection_merge(ds, ZB_E_INVALID);
    }
    uint64_t total = 0;
    for (size_t c = 0; c < n && st == ZB_OK; c++) {
        uint64_t len = 0;
        st = zb_dataset_len(children[c], &len);
        ds->child_start[c] = total;
        total += len;
    }
    if (st == ZB_OK) {
        ds->child_start[n] = total;
        ds->nphys = total;
        if (ds->opts.cache_bytes) st = zb__cache_new(ds->opts.cache_bytes, &ds->cache);
    }
    if (st == ZB_OK) st = zb__pool_new(ds->opts.num_threads, &ds->pool);
    if (st == ZB_OK) st = zb__arena_pool_new(&ds->arenas);
    if (st == ZB_OK) st = zb__cache_new(INDEX_CACHE_BYTES, &ds->index_cache);
    if (st == ZB_OK) st = fetch_cache_new(ds);
    if (st != ZB_OK) {
        zb_dataset_close(ds);
        return st;
    }
    *out = ds;
    return ZB_OK;
}
