/* The anndata Zarr backend of a conversion source (source.h): a store written by anndata
 * 0.7-0.12 through zarr-python 2 or 3, Zarr v2 or v3, consolidated or not, sharded or not.
 *
 * Opening reads metadata only (zb__tree_load, from consolidated metadata when there is some),
 * plus the category tables of categorical obs columns, which are small and needed by every
 * caller. Reads go straight to the arrays:
 *  - a sparse matrix (a csr_matrix / csc_matrix group) reads indptr[start .. stop] first, then
 *    only the element range [indptr[start], indptr[stop]) of data and indices;
 *  - a dense matrix (a 2-d array) reads its rows and drops the zeros (zb__csr_from_dense);
 *  - an obs column reads its rows of values, codes or mask.
 * Integers come in whatever type the writer chose (uint16 indices from anndata's
 * write_csr_csc_indices_with_min_possible_dtype, int8 codes, uint64 pointers): they are
 * converted on the way out, and a value that does not fit the delivered type is corruption,
 * never a silent wrap.
 *
 * Threads: the zb_array handles are shared by every reader; a read borrows a worker (a codec
 * context and a scratch buffer) from the source's pool and returns it, so concurrent reads never
 * share a context and a steady stream of reads allocates no big buffer. The pool grows to the
 * peak number of concurrent readers and is freed with the source.
 *
 * Format facts: shared FORMATS.md §6. anndata 0.7 wrote two things differently, and both are
 * read: its root group carries no attributes (is_unmarked_anndata), and a categorical column is
 * a codes array whose attribute `categories` names an array under the dataframe's
 * `__categories/`, which carries `ordered` (open_array_column).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/source.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/json.h"
#include "util/status.h"
#include "zarr/array.h"
#include "zarr/tree.h"

#define PATH_CAP 4096

/* What one read borrows from the source. */
typedef struct worker {
    zb_ctx *ctx;
    zb__buf scratch;
    struct worker *next; /* in the idle list */
} worker;

typedef struct zarr_col {
    char *key;        /* "obs/NAME", for messages */
    zb_array *values; /* the values, the strings or the codes */
    zb_array *mask;   /* nullable encodings: 1 = missing */
} zarr_col;

static void
col_release(zarr_col *c)
{
    zb_array_close(c->values);
    zb_array_close(c->mask);
    free(c->key);
    memset(c, 0, sizeof *c);
}

typedef struct zarr_src {
    zb__src base;
    zb_store *store;
    zb__tree *tree;
    zb_array *obs_names;
    zarr_col *cols;     /* [base.c.n_columns] */
    pthread_mutex_t mu; /* guards idle */
    worker *idle;
} zarr_src;

typedef struct zarr_matrix {
    zb__src_matrix base;
    zarr_src *src;
    zb_array *data, *indices, *indptr; /* csr_matrix / csc_matrix */
    zb_array *dense;                   /* a 2-d array */
    const char *var;                   /* the dataframe naming its columns */
} zarr_matrix;

static bool
is_integer(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_UINT64;
}

/* ---- workers ---------------------------------------------------------------------------------- */

static zb_status
worker_take(zarr_src *s, worker **out)
{
    pthread_mutex_lock(&s->mu);
    worker *w = s->idle;
    if (w) s->idle = w->next;
    pthread_mutex_unlock(&s->mu);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) return zb__err(ZB_E_NOMEM, "%s: out of memory for a reader", s->base.c.path);
        zb_status st = zb_ctx_new(&w->ctx);
        if (st != ZB_OK) {
            free(w);
            return st;
        }
    }
    *out = w;
    return ZB_OK;
}

static void
worker_give(zarr_src *s, worker *w)
{
    pthread_mutex_lock(&s->mu);
    w->next = s->idle;
    s->idle = w;
    pthread_mutex_unlock(&s->mu);
}

static void
workers_free(worker *w)
{
    while (w) {
        worker *next = w->next;
        zb_ctx_free(w->ctx);
        zb__buf_free(&w->scratch);
        free(w);
        w = next;
    }
}

/* The worker's scratch buffer, grown to n items of `item` bytes. */
static zb_status
scratch(worker *w, uint64_t n, size_t item, void **out)
{
    uint64_t bytes;
    if (!zb__mul_u64(n, item, &bytes) || bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "a read of %llu elements of %zu bytes is too large",
                       (unsigned long long)n, item);
    ZB_TRY(zb__buf_reserve(&w->scratch, bytes ? (size_t)bytes : 1));
    *out = w->scratch.data;
    return ZB_OK;
}

/* ---- reading arrays --------------------------------------------------------------------------- */

/* Rows [lo, hi) of `a` into dst (which holds them); errors name the store as well. */
static zb_status
read_rows(const zarr_src *s, const zb_array *a, uint64_t lo, uint64_t hi, void *dst, worker *w)
{
    size_t bytes = (size_t)((hi - lo) * a->row_elems * a->meta.itemsize);
    zb_status st = zb_array_read_rows(a, lo, hi, dst, bytes, w->ctx);
    return st == ZB_OK ? st : zb__err_context(st, "%s", s->base.c.path);
}

static void
int_bounds(zb_dtype want, int64_t *min, int64_t *max)
{
    *min = want == ZB_DT_INT64 ? INT64_MIN : want == ZB_DT_INT32 ? INT32_MIN : 0;
    *max = want == ZB_DT_INT64 ? INT64_MAX : want == ZB_DT_INT32 ? INT32_MAX : UINT32_MAX;
}

static void
store_int(void *dst, uint64_t i, zb_dtype want, int64_t v)
{
    if (want == ZB_DT_INT64)
        ((int64_t *)dst)[i] = v;
    else if (want == ZB_DT_INT32)
        ((int32_t *)dst)[i] = (int32_t)v;
    else
        ((uint32_t *)dst)[i] = (uint32_t)v;
}

/* uint16 and uint8 are what anndata's smallest-dtype indices use: the common widening, kept to
 * a plain loop. Runs from the back, as the narrow values sit at the front of the same buffer. */
static bool
widen_unsigned(uint32_t *d, uint64_t n, zb_dtype dt)
{
    const uint8_t *p = (const uint8_t *)d;
    if (dt == ZB_DT_UINT16) {
        for (uint64_t i = n; i-- > 0;) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            d[i] = v;
        }
        return true;
    }
    if (dt == ZB_DT_UINT8 || dt == ZB_DT_BOOL) {
        for (uint64_t i = n; i-- > 0;) d[i] = p[i];
        return true;
    }
    return false;
}

/* Elements [lo, hi) of the 1-d integer array `a` into dst as `want` (ZB_DT_INT32, ZB_DT_UINT32
 * or ZB_DT_INT64), whatever integer type they are stored in. A type no wider than `want` is
 * read into dst and converted in place (from the back when widening, so no value is overwritten
 * before it is read); a wider one is read into the worker's scratch. A value outside `want`'s
 * range is ZB_E_CORRUPT naming the store, the array and the element. */
static zb_status
read_ints(const zarr_src *s, const zb_array *a, worker *w, uint64_t lo, uint64_t hi, zb_dtype want,
          void *dst)
{
    uint64_t n = hi - lo;
    zb_dtype dt = a->meta.dtype;
    size_t isz = a->meta.itemsize, osz = zb_dtype_size(want);
    void *src = dst;
    if (isz > osz) ZB_TRY(scratch(w, n, isz, &src));
    ZB_TRY(read_rows(s, a, lo, hi, src, w));
    if (dt == want || (want == ZB_DT_UINT32 && widen_unsigned(dst, n, dt))) return ZB_OK;
    if (dt == ZB_DT_INT32 && want == ZB_DT_UINT32) {
        /* anndata's default int32 indices: the same bits, unless one is negative (then the OR
         * of them all is, and the loop below names it) */
        const int32_t *v = dst;
        int32_t any = 0;
        for (uint64_t i = 0; i < n; i++) any |= v[i];
        if (any >= 0) return ZB_OK;
    }
    int64_t min, max;
    int_bounds(want, &min, &max);
    const uint8_t *p = src;
    bool backwards = isz < osz;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t i = backwards ? n - 1 - k : k;
        int64_t v;
        bool exact = zb__load_int(p + i * isz, dt, &v);
        if (!exact || v < min || v > max)
            return zb__err(ZB_E_CORRUPT, "%s: %s, element %llu: %s%lld is outside the %s range",
                           s->base.c.path, a->path, (unsigned long long)(lo + i),
                           exact ? "" : "above ", (long long)v, zb_dtype_name(want));
        store_int(dst, i, want, v);
    }
    return ZB_OK;
}

/* Elements [lo, hi) of a 1-d array as text into `out` (a new zb_strings): strings as stored,
 * numbers the way zb__src_category_text writes them (an index that pandas kept numeric). */
static zb_status
read_text(const zarr_src *s, const zb_array *a, worker *w, uint64_t lo, uint64_t hi,
          zb_strings *out)
{
    memset(out, 0, sizeof *out);
    if (a->meta.dtype == ZB_DT_STRING) {
        zb_status st = zb_array_read_strings(a, lo, hi, out, w->ctx);
        return st == ZB_OK ? st : zb__err_context(st, "%s", s->base.c.path);
    }
    uint64_t n = hi - lo;
    void *values = NULL;
    ZB_TRY(scratch(w, n, a->meta.itemsize, &values));
    ZB_TRY(read_rows(s, a, lo, hi, values, w));
    out->offsets = malloc((size_t)(n + 1) * sizeof *out->offsets);
    out->data = malloc((size_t)n * 40 + 1);
    if (!out->offsets || !out->data) {
        zb_strings_free(out);
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu names", s->base.c.path, a->path,
                       (unsigned long long)n);
    }
    out->offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *v = (const char *)values + i * a->meta.itemsize;
        out->offsets[i + 1] =
            out->offsets[i] +
            zb__src_category_text(a->meta.dtype, v, out->data + out->offsets[i], 40);
    }
    out->n = n;
    return ZB_OK;
}

/* ---- opening arrays --------------------------------------------------------------------------- */

/* The array at `path`. ZB_E_CORRUPT naming `what` when the store lacks it (the caller knows
 * the layout needs it), ZB_E_UNSUPPORTED when it is a group. */
static zb_status
open_array(const zarr_src *s, const char *path, const char *what, zb_array **out)
{
    *out = NULL;
    const zb__tree_node *nd = zb__tree_find(s->tree, path);
    if (!nd) return zb__err(ZB_E_CORRUPT, "%s: %s: no array %s", s->base.c.path, what, path);
    if (!nd->is_array)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %s is a group where an array belongs",
                       s->base.c.path, what, path);
    zb_status st = zb__tree_node_open_array(s->store, nd, out);
    return st == ZB_OK ? st : zb__err_context(st, "%s", s->base.c.path);
}

/* A 1-d array of `n` elements at `path` (a dataframe column, index, codes or mask). */
static zb_status
open_vector(const zarr_src *s, const char *path, const char *what, uint64_t n, zb_array **out)
{
    ZB_TRY(open_array(s, path, what, out));
    const zb__array_meta *m = &(*out)->meta;
    if (m->ndim == 1 && m->shape[0] == n) return ZB_OK;
    zb_status st = m->ndim != 1 ? zb__err(ZB_E_CORRUPT, "%s: %s: %s is %d-d, not 1-d",
                                          s->base.c.path, what, path, m->ndim)
                                : zb__err(ZB_E_CORRUPT, "%s: %s: %s holds %llu elements, not %llu",
                                          s->base.c.path, what, path,
                                          (unsigned long long)m->shape[0], (unsigned long long)n);
    zb_array_close(*out);
    *out = NULL;
    return st;
}

/* The index array of dataframe `frame` (the child its `_index` attribute names), any length. */
static zb_status
open_frame_index(const zarr_src *s, const char *frame, zb_array **out)
{
    *out = NULL;
    const zb__tree_node *nd = zb__tree_find(s->tree, frame);
    if (!nd) return zb__err(ZB_E_NOTFOUND, "%s: no %s dataframe", s->base.c.path, frame);
    if (nd->is_array)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: %s is an array (a dataframe of anndata < 0.7); "
                       "rewrite the store with a newer anndata",
                       s->base.c.path, frame);
    const char *index = zb__json_string(nd->attrs, "_index");
    if (!index)
        return zb__err(ZB_E_CORRUPT, "%s: %s: the dataframe has no _index attribute",
                       s->base.c.path, frame);
    char path[PATH_CAP];
    ZB_TRY(zb__tree_join(path, sizeof path, frame, index));
    ZB_TRY(open_array(s, path, frame, out));
    if ((*out)->meta.ndim == 1) return ZB_OK;
    zb_array_close(*out);
    *out = NULL;
    return zb__err(ZB_E_CORRUPT, "%s: %s: the index %s is not 1-d", s->base.c.path, frame, path);
}

/* ---- obs columns ------------------------------------------------------------------------------ */

/* Reads the category table at `path` into c (strings, or numbers through
 * zb__src_set_numeric_categories). */
static zb_status
load_categories(zarr_src *s, zb__col_info *c, const char *path, const char *what)
{
    zb_array *a = NULL;
    worker *w = NULL;
    void *values = NULL;
    ZB_TRY(open_array(s, path, what, &a));
    const zb__array_meta *m = &a->meta;
    uint64_t n = m->ndim == 1 ? m->shape[0] : 0;
    zb_status st = ZB_OK;
    if (m->ndim != 1)
        st = zb__err(ZB_E_CORRUPT, "%s: %s: the categories %s are not 1-d", s->base.c.path, what,
                     path);
    else if (m->dtype == ZB_DT_FLOAT16)
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: float16 categories", s->base.c.path, what);
    if (st == ZB_OK) st = worker_take(s, &w);
    if (st == ZB_OK && m->dtype == ZB_DT_STRING) {
        zb_strings *t = calloc(1, sizeof *t);
        st = t ? read_text(s, a, w, 0, n, t) : zb__err(ZB_E_NOMEM, "%s: categories", what);
        if (st == ZB_OK) {
            c->categories = t;
            c->dtype = ZB_DT_STRING;
        } else {
            free(t);
        }
    } else if (st == ZB_OK) {
        st = scratch(w, n, m->itemsize, &values);
        if (st == ZB_OK) st = read_rows(s, a, 0, n, values, w);
        if (st == ZB_OK) st = zb__src_set_numeric_categories(c, m->dtype, values, n);
    }
    if (w) worker_give(s, w);
    zb_array_close(a);
    return st;
}

/* A categorical column: codes at `codes` (any integer type), categories at `cats`. */
static zb_status
open_categorical(zarr_src *s, size_t i, const char *codes, const char *cats, bool ordered)
{
    zb__col_info *c = &s->base.c.columns[i];
    zarr_col *zc = &s->cols[i];
    ZB_TRY(open_vector(s, codes, zc->key, s->base.c.n_obs, &zc->values));
    if (!is_integer(zc->values->meta.dtype))
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: categorical codes of dtype %s", s->base.c.path,
                       zc->key, zb_dtype_name(zc->values->meta.dtype));
    c->kind = ZB_COL_CATEGORICAL;
    c->ordered = ordered;
    return load_categories(s, c, cats, zc->key);
}

static bool
attr_bool(json_object *attrs, const char *key)
{
    json_object *v = zb__json_get(attrs, key);
    return json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);
}

/* A column stored as one array: numbers, bools, strings, or anndata 0.7's categorical codes
 * (their `categories` attribute names the table, relative to the dataframe, and the table
 * carries `ordered`). */
static zb_status
open_array_column(zarr_src *s, size_t i, const zb__tree_node *nd)
{
    zb__col_info *c = &s->base.c.columns[i];
    zarr_col *zc = &s->cols[i];
    const char *legacy = zb__json_string(nd->attrs, "categories");
    if (legacy) {
        char cats[PATH_CAP];
        ZB_TRY(zb__tree_join(cats, sizeof cats, "obs", legacy));
        const zb__tree_node *cn = zb__tree_find(s->tree, cats);
        return open_categorical(s, i, zc->key, cats, cn && attr_bool(cn->attrs, "ordered"));
    }
    const char *enc = zb__json_string(nd->attrs, "encoding-type");
    if (enc && strcmp(enc, "array") && strcmp(enc, "string-array"))
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: %s: an array of encoding-type '%s' is not an obs "
                       "column this reader knows",
                       s->base.c.path, zc->key, enc);
    ZB_TRY(open_vector(s, zc->key, zc->key, s->base.c.n_obs, &zc->values));
    c->dtype = zc->values->meta.dtype;
    c->kind = c->dtype == ZB_DT_STRING ? ZB_COL_STRING : ZB_COL_NUMERIC;
    return ZB_OK;
}

/* nullable-integer / nullable-boolean / nullable-string-array: values + a one-byte mask. */
static zb_status
open_nullable(zarr_src *s, size_t i)
{
    zb__col_info *c = &s->base.c.columns[i];
    zarr_col *zc = &s->cols[i];
    char path[PATH_CAP];
    ZB_TRY(zb__tree_join(path, sizeof path, zc->key, "values"));
    ZB_TRY(open_vector(s, path, zc->key, s->base.c.n_obs, &zc->values));
    ZB_TRY(zb__tree_join(path, sizeof path, zc->key, "mask"));
    ZB_TRY(open_vector(s, path, zc->key, s->base.c.n_obs, &zc->mask));
    if (zc->mask->meta.itemsize != 1)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: a mask of dtype %s (expected bool)",
                       s->base.c.path, zc->key, zb_dtype_name(zc->mask->meta.dtype));
    c->kind = ZB_COL_NULLABLE;
    c->dtype = zc->values->meta.dtype;
    return ZB_OK;
}

static zb_status
open_column(zarr_src *s, size_t i, const char *name)
{
    zb__col_info *c = &s->base.c.columns[i];
    zarr_col *zc = &s->cols[i];
    char key[PATH_CAP];
    ZB_TRY(zb__tree_join(key, sizeof key, "obs", name));
    c->name = strdup(name);
    zc->key = strdup(key);
    if (!c->name || !zc->key) return zb__err(ZB_E_NOMEM, "%s: obs column %s", s->base.c.path, name);
    const zb__tree_node *nd = zb__tree_find(s->tree, key);
    if (!nd)
        return zb__err(ZB_E_CORRUPT, "%s: obs lists the column '%s' but there is no %s",
                       s->base.c.path, name, key);
    if (nd->is_array) return open_array_column(s, i, nd);
    const char *enc = zb__json_string(nd->attrs, "encoding-type");
    if (enc && !strcmp(enc, "categorical")) {
        char codes[PATH_CAP], cats[PATH_CAP];
        ZB_TRY(zb__tree_join(codes, sizeof codes, key, "codes"));
        ZB_TRY(zb__tree_join(cats, sizeof cats, key, "categories"));
        return open_categorical(s, i, codes, cats, attr_bool(nd->attrs, "ordered"));
    }
    if (enc && (!strcmp(enc, "nullable-integer") || !strcmp(enc, "nullable-boolean") ||
                !strcmp(enc, "nullable-string-array")))
        return open_nullable(s, i);
    return zb__err(ZB_E_UNSUPPORTED,
                   "%s: %s: a group of encoding-type '%s' is not an obs column "
                   "this reader knows (categorical, nullable-integer, nullable-boolean, "
                   "nullable-string-array)",
                   s->base.c.path, key, enc ? enc : "(none)");
}

/* obs: its index (n_obs) and every column of its column-order. */
static zb_status
open_obs(zarr_src *s)
{
    ZB_TRY(open_frame_index(s, "obs", &s->obs_names));
    s->base.c.n_obs = s->obs_names->meta.shape[0];
    json_object *order = zb__json_get(zb__tree_find(s->tree, "obs")->attrs, "column-order");
    if (order && !json_object_is_type(order, json_type_array))
        return zb__err(ZB_E_CORRUPT, "%s: obs: column-order is not a list", s->base.c.path);
    size_t n = order ? json_object_array_length(order) : 0;
    s->base.c.columns = calloc(n ? n : 1, sizeof *s->base.c.columns);
    s->cols = calloc(n ? n : 1, sizeof *s->cols);
    if (!s->base.c.columns || !s->cols)
        return zb__err(ZB_E_NOMEM, "%s: %zu obs columns", s->base.c.path, n);
    for (size_t i = 0; i < n; i++) {
        json_object *name = json_object_array_get_idx(order, i);
        if (!json_object_is_type(name, json_type_string))
            return zb__err(ZB_E_CORRUPT, "%s: obs: column-order entry %zu is not a string",
                           s->base.c.path, i);
        size_t k = s->base.c.n_columns++;
        zb_status st = open_column(s, k, json_object_get_string(name));
        if (st != ZB_E_UNSUPPORTED) {
            ZB_TRY(st);
            continue;
        }
        /* a column of an encoding this reader lacks: left out, the others kept */
        ZB_TRY(zb__src_skip_column(&s->base.c, json_object_get_string(name)));
        col_release(&s->cols[k]);
        zb__col_info_free(&s->base.c.columns[k]);
        s->base.c.n_columns--;
    }
    return ZB_OK;
}

/* Blanks the strings under the mask (source.h: a missing string is empty), compacting in place. */
static void
blank_masked(zb_strings *t, const uint8_t *mask)
{
    uint64_t at = 0;
    for (uint64_t i = 0; i < t->n; i++) {
        uint64_t from = t->offsets[i], len = mask[i] ? 0 : t->offsets[i + 1] - from;
        memmove(t->data + at, t->data + from, (size_t)len);
        t->offsets[i] = at;
        at += len;
    }
    t->offsets[t->n] = at;
}

static zb_status
read_codes(zarr_src *s, size_t column, worker *w, uint64_t start, uint64_t stop, zb__col_block *out)
{
    uint64_t n = stop - start, n_cats = s->base.c.columns[column].categories->n;
    ZB_TRY(zb__col_block_reserve(out, n, sizeof(int32_t), false));
    ZB_TRY(read_ints(s, s->cols[column].values, w, start, stop, ZB_DT_INT32, out->values));
    const int32_t *codes = out->values;
    for (uint64_t i = 0; i < n; i++)
        if (codes[i] < -1 || (int64_t)codes[i] >= (int64_t)n_cats)
            return zb__err(ZB_E_CORRUPT, "%s: %s: row %llu: code %d is outside [-1, %llu)",
                           s->base.c.path, s->cols[column].key, (unsigned long long)(start + i),
                           codes[i], (unsigned long long)n_cats);
    return ZB_OK;
}

static zb_status
read_nullable(zarr_src *s, size_t column, worker *w, uint64_t start, uint64_t stop,
              zb__col_block *out)
{
    const zarr_col *zc = &s->cols[column];
    zb_dtype dt = s->base.c.columns[column].dtype;
    ZB_TRY(zb__col_block_reserve(out, stop - start, zb_dtype_size(dt), true));
    ZB_TRY(read_rows(s, zc->mask, start, stop, out->mask, w));
    for (uint64_t i = 0; i < out->n; i++) out->mask[i] = out->mask[i] != 0;
    if (dt != ZB_DT_STRING) return read_rows(s, zc->values, start, stop, out->values, w);
    zb_strings_free(&out->strings);
    ZB_TRY(read_text(s, zc->values, w, start, stop, &out->strings));
    blank_masked(&out->strings, out->mask);
    return ZB_OK;
}

static zb_status
read_column_rows(zarr_src *s, size_t column, worker *w, uint64_t start, uint64_t stop,
                 zb__col_block *out)
{
    const zb__col_info *c = &s->base.c.columns[column];
    const zarr_col *zc = &s->cols[column];
    switch (c->kind) {
    case ZB_COL_NUMERIC:
        ZB_TRY(zb__col_block_reserve(out, stop - start, zb_dtype_size(c->dtype), false));
        return read_rows(s, zc->values, start, stop, out->values, w);
    case ZB_COL_CATEGORICAL:
        return read_codes(s, column, w, start, stop, out);
    case ZB_COL_STRING:
        ZB_TRY(zb__col_block_reserve(out, stop - start, 0, false));
        zb_strings_free(&out->strings);
        return read_text(s, zc->values, w, start, stop, &out->strings);
    case ZB_COL_NULLABLE:
        return read_nullable(s, column, w, start, stop, out);
    }
    return zb__err(ZB_E_INVALID, "%s: %s: unknown column kind", s->base.c.path, zc->key);
}

static zb_status
check_rows(const zarr_src *s, const char *what, uint64_t start, uint64_t stop)
{
    if (start <= stop && stop <= s->base.c.n_obs) return ZB_OK;
    return zb__err(ZB_E_RANGE, "%s: %s: rows [%llu, %llu) of %llu", s->base.c.path, what,
                   (unsigned long long)start, (unsigned long long)stop,
                   (unsigned long long)s->base.c.n_obs);
}

static zb_status
src_read_column(zb__src *bs, size_t column, uint64_t start, uint64_t stop, zb__col_block *out)
{
    zarr_src *s = (zarr_src *)bs;
    if (column >= s->base.c.n_columns)
        return zb__err(ZB_E_RANGE, "%s: obs column %zu of %zu", s->base.c.path, column,
                       s->base.c.n_columns);
    ZB_TRY(check_rows(s, s->cols[column].key, start, stop));
    worker *w;
    ZB_TRY(worker_take(s, &w));
    zb_status st = read_column_rows(s, column, w, start, stop, out);
    worker_give(s, w);
    return st;
}

static zb_status
src_read_obs_names(zb__src *bs, uint64_t start, uint64_t stop, zb_strings *out)
{
    zarr_src *s = (zarr_src *)bs;
    memset(out, 0, sizeof *out);
    ZB_TRY(check_rows(s, "obs names", start, stop));
    worker *w;
    ZB_TRY(worker_take(s, &w));
    zb_status st = read_text(s, s->obs_names, w, start, stop, out);
    worker_give(s, w);
    return st;
}

/* ---- matrices --------------------------------------------------------------------------------- */

/* Units served as fill by the reads on w's context so far. */
static uint64_t
fills(const worker *w)
{
    zb_ctx_stats st;
    zb_ctx_get_stats(w->ctx, &st);
    return st.chunks_filled;
}

/* indptr[i], and whether its chunk is missing (read as the fill value). */
static zb_status
pointer_at(zarr_matrix *m, worker *w, uint64_t i, int64_t *v, bool *missing)
{
    uint64_t before = fills(w);
    ZB_TRY(read_ints(m->src, m->indptr, w, i, i + 1, ZB_DT_INT64, v));
    *missing = fills(w) != before;
    return ZB_OK;
}

/* A missing chunk of indptr reads as its fill value (FORMATS.md §1.5), which is right only if
 * every pointer it stood for had that value; zarr-python 3 skips writing such chunks, which for
 * anndata's fill 0 means a run of empty rows at the very start. So the last pointer before a
 * missing chunk (in the nearest chunk that exists) must not exceed the fill: a chunk lost in the
 * middle of indptr is then reported, not read as rows without elements. Runs only when a read
 * met a missing chunk. */
static zb_status
check_missing_pointers(zarr_matrix *m, worker *w, uint64_t start, uint64_t stop)
{
    uint64_t unit = m->indptr->inner[0];
    for (uint64_t c = start / unit; c <= stop / unit; c++) {
        int64_t fill, last;
        bool missing, gone = true;
        ZB_TRY(pointer_at(m, w, c * unit, &fill, &missing));
        uint64_t p = c;
        while (missing && gone && p-- > 0)
            ZB_TRY(pointer_at(m, w, (p + 1) * unit - 1, &last, &gone));
        if (missing && !gone && last > fill)
            return zb__err(ZB_E_CORRUPT,
                           "%s: %s/indptr: the chunk of positions [%llu, %llu) is "
                           "missing; its fill %lld lies below the pointer %lld before it",
                           m->base.path, m->base.key, (unsigned long long)(c * unit),
                           (unsigned long long)((c + 1) * unit), (long long)fill, (long long)last);
    }
    return ZB_OK;
}

/* indptr[start .. stop] as int64 into out, checked: within [0, nnz], no decrease, no chunk
 * missing where pointers must have been. */
static zb_status
read_indptr(zarr_matrix *m, worker *w, uint64_t start, uint64_t stop, int64_t *out)
{
    const zarr_src *s = m->src;
    uint64_t before = fills(w);
    ZB_TRY(read_ints(s, m->indptr, w, start, stop + 1, ZB_DT_INT64, out));
    if (fills(w) != before) ZB_TRY(check_missing_pointers(m, w, start, stop));
    for (uint64_t i = 0; i <= stop - start; i++) {
        if (out[i] < 0 || (uint64_t)out[i] > m->base.info.nnz)
            return zb__err(ZB_E_CORRUPT, "%s: %s/indptr, position %llu: %lld is outside [0, %llu]",
                           s->base.c.path, m->base.key, (unsigned long long)(start + i),
                           (long long)out[i], (unsigned long long)m->base.info.nnz);
        if (i && out[i] < out[i - 1])
            return zb__err(ZB_E_CORRUPT,
                           "%s: %s/indptr decreases at position %llu (%lld after "
                           "%lld)",
                           s->base.c.path, m->base.key, (unsigned long long)(start + i),
                           (long long)out[i], (long long)out[i - 1]);
    }
    return ZB_OK;
}

static zb_status
read_sparse(zarr_matrix *m, worker *w, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    uint64_t n = stop - start;
    zb_dtype dt = m->base.info.dtype;
    ZB_TRY(zb__csr_block_reserve(out, n, 0, dt));
    ZB_TRY(read_indptr(m, w, start, stop, out->indptr));
    uint64_t lo = (uint64_t)out->indptr[0], hi = (uint64_t)out->indptr[n];
    ZB_TRY(zb__csr_block_reserve(out, n, hi - lo, dt));
    ZB_TRY(read_rows(m->src, m->data, lo, hi, out->data, w));
    ZB_TRY(read_ints(m->src, m->indices, w, lo, hi, ZB_DT_UINT32, out->indices));
    for (uint64_t r = 0; r <= n; r++) out->indptr[r] -= (int64_t)lo;
    out->n_rows = n;
    out->nnz = hi - lo;
    return ZB_OK;
}

static zb_status
read_dense(zarr_matrix *m, worker *w, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    uint64_t n_cols = m->base.info.n_cols, elems;
    if (!zb__mul_u64(stop - start, n_cols, &elems))
        return zb__err(ZB_E_OVERFLOW, "%s: %s: %llu rows of %llu", m->base.path, m->base.key,
                       (unsigned long long)(stop - start), (unsigned long long)n_cols);
    void *rows = NULL;
    ZB_TRY(scratch(w, elems, m->dense->meta.itemsize, &rows));
    ZB_TRY(read_rows(m->src, m->dense, start, stop, rows, w));
    return zb__csr_from_dense(rows, stop - start, n_cols, m->base.info.dtype, out);
}

static zb_status
matrix_read(zb__src_matrix *bm, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    zarr_matrix *m = (zarr_matrix *)bm;
    worker *w;
    ZB_TRY(worker_take(m->src, &w));
    zb_status st =
        m->dense ? read_dense(m, w, start, stop, out) : read_sparse(m, w, start, stop, out);
    worker_give(m->src, w);
    return st;
}

static zb_status
matrix_indptr(zb__src_matrix *bm, uint64_t start, uint64_t stop, int64_t *out)
{
    zarr_matrix *m = (zarr_matrix *)bm;
    worker *w;
    ZB_TRY(worker_take(m->src, &w));
    zb_status st = read_indptr(m, w, start, stop, out);
    worker_give(m->src, w);
    return st;
}

static zb_status
matrix_var_names(zb__src_matrix *bm, zb_strings *out)
{
    zarr_matrix *m = (zarr_matrix *)bm;
    zarr_src *s = m->src;
    memset(out, 0, sizeof *out);
    zb_array *index = NULL;
    worker *w = NULL;
    ZB_TRY(open_frame_index(s, m->var, &index));
    zb_status st = ZB_OK;
    if (index->meta.shape[0] != m->base.info.n_cols)
        st = zb__err(ZB_E_CORRUPT, "%s: %s names %llu columns, %s has %llu", s->base.c.path, m->var,
                     (unsigned long long)index->meta.shape[0], m->base.key,
                     (unsigned long long)m->base.info.n_cols);
    if (st == ZB_OK) st = worker_take(s, &w);
    if (st == ZB_OK) st = read_text(s, index, w, 0, m->base.info.n_cols, out);
    if (w) worker_give(s, w);
    zb_array_close(index);
    return st;
}

static void
matrix_close(zb__src_matrix *bm)
{
    zarr_matrix *m = (zarr_matrix *)bm;
    zb_array_close(m->data);
    zb_array_close(m->indices);
    zb_array_close(m->indptr);
    zb_array_close(m->dense);
    free(m->base.key);
    free(m);
}

static const zb__src_matrix_methods matrix_methods = {
    matrix_indptr, matrix_read, matrix_var_names,
    matrix_close,  NULL, /* no raw rows: chunks are compressed */
};

/* One array of a sparse group: 1-d, of an integer type when `integer`, else numeric. */
static zb_status
open_sparse_part(zarr_matrix *m, const char *name, bool integer, zb_array **out)
{
    char path[PATH_CAP];
    ZB_TRY(zb__tree_join(path, sizeof path, m->base.key, name));
    ZB_TRY(open_array(m->src, path, m->base.key, out));
    const zb__array_meta *a = &(*out)->meta;
    if (a->ndim != 1)
        return zb__err(ZB_E_CORRUPT, "%s: %s is %d-d, not 1-d", m->base.path, path, a->ndim);
    if (integer ? !is_integer(a->dtype) : a->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s of dtype %s", m->base.path, path,
                       zb_dtype_name(a->dtype));
    return ZB_OK;
}

/* The [rows, cols] shape attribute of a sparse group. */
static zb_status
sparse_shape(const zarr_matrix *m, const zb__tree_node *nd, uint64_t *rows, uint64_t *cols)
{
    json_object *shape = zb__json_get(nd->attrs, "shape");
    if (!json_object_is_type(shape, json_type_array) || json_object_array_length(shape) != 2 ||
        zb__json_u64(json_object_array_get_idx(shape, 0), "shape", rows) != ZB_OK ||
        zb__json_u64(json_object_array_get_idx(shape, 1), "shape", cols) != ZB_OK)
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s: the sparse matrix has no [rows, cols] shape "
                       "attribute",
                       m->base.path, m->base.key);
    return ZB_OK;
}

/* A csr_matrix / csc_matrix group: its three arrays, their lengths, and indptr's two ends
 * (0 and nnz, FORMATS.md §6). */
static zb_status
open_sparse(zarr_matrix *m, const zb__tree_node *nd, bool csc)
{
    zb__src_matrix_info *info = &m->base.info;
    ZB_TRY(sparse_shape(m, nd, &info->n_rows, &info->n_cols));
    ZB_TRY(open_sparse_part(m, "data", false, &m->data));
    ZB_TRY(open_sparse_part(m, "indices", true, &m->indices));
    ZB_TRY(open_sparse_part(m, "indptr", true, &m->indptr));
    info->layout = csc ? ZB_SRC_CSC : ZB_SRC_CSR;
    info->dtype = m->data->meta.dtype;
    info->nnz = m->data->meta.shape[0];
    uint64_t major = csc ? info->n_cols : info->n_rows, minor = csc ? info->n_rows : info->n_cols;
    if (m->indices->meta.shape[0] != info->nnz)
        return zb__err(ZB_E_CORRUPT, "%s: %s: data holds %llu elements, indices %llu", m->base.path,
                       m->base.key, (unsigned long long)info->nnz,
                       (unsigned long long)m->indices->meta.shape[0]);
    if (m->indptr->meta.shape[0] != major + 1)
        return zb__err(ZB_E_CORRUPT, "%s: %s: indptr holds %llu pointers for %llu %s", m->base.path,
                       m->base.key, (unsigned long long)m->indptr->meta.shape[0],
                       (unsigned long long)major, csc ? "columns" : "rows");
    if (minor > UINT32_MAX)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu %s do not fit 32-bit indices", m->base.path,
                       m->base.key, (unsigned long long)minor, csc ? "rows" : "columns");
    int64_t ends[2];
    worker *w;
    ZB_TRY(worker_take(m->src, &w));
    zb_status st = read_indptr(m, w, 0, 0, &ends[0]);
    if (st == ZB_OK) st = read_indptr(m, w, major, major, &ends[1]);
    worker_give(m->src, w);
    if (st == ZB_OK && (ends[0] != 0 || (uint64_t)ends[1] != info->nnz))
        st = zb__err(ZB_E_CORRUPT,
                     "%s: %s/indptr runs from %lld to %lld, not from 0 to the %llu "
                     "elements of data",
                     m->base.path, m->base.key, (long long)ends[0], (long long)ends[1],
                     (unsigned long long)info->nnz);
    return st;
}

static zb_status
open_dense(zarr_matrix *m, const zb__tree_node *nd)
{
    ZB_TRY(open_array(m->src, nd->path, m->base.key, &m->dense));
    const zb__array_meta *a = &m->dense->meta;
    zb__src_matrix_info *info = &m->base.info;
    if (a->ndim != 2 || a->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is a %d-d array of %s, not a matrix", m->base.path,
                       m->base.key, a->ndim, zb_dtype_name(a->dtype));
    if (a->shape[1] > UINT32_MAX)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu columns do not fit 32-bit indices",
                       m->base.path, m->base.key, (unsigned long long)a->shape[1]);
    info->layout = ZB_SRC_DENSE;
    info->dtype = a->dtype;
    info->n_rows = a->shape[0];
    info->n_cols = a->shape[1];
    info->nnz = m->dense->total_elems;
    return ZB_OK;
}

/* The dataframe naming the columns of matrix `key`; refuses keys that are not matrices. */
static zb_status
var_frame_of(const zarr_src *s, const char *key, const char **var)
{
    if (!strcmp(key, "X") || (!strncmp(key, "layers/", 7) && key[7] && !strchr(key + 7, '/')))
        *var = "var";
    else if (!strcmp(key, "raw/X"))
        *var = "raw/var";
    else
        return zb__err(ZB_E_INVALID, "%s: '%s' is not a matrix key (X, raw/X or layers/NAME)",
                       s->base.c.path, key);
    return ZB_OK;
}

static zb_status
open_matrix(zarr_src *s, zarr_matrix *m, const zb__tree_node *nd)
{
    if (nd->is_array) {
        const char *enc = zb__json_string(nd->attrs, "encoding-type");
        if (enc && strcmp(enc, "array"))
            return zb__err(ZB_E_UNSUPPORTED,
                           "%s: %s is an array of encoding-type '%s', not a "
                           "matrix",
                           s->base.c.path, m->base.key, enc);
        ZB_TRY(open_dense(m, nd));
    } else {
        const char *enc = zb__json_string(nd->attrs, "encoding-type");
        bool csr = enc && !strcmp(enc, "csr_matrix"), csc = enc && !strcmp(enc, "csc_matrix");
        if (!csr && !csc)
            return zb__err(ZB_E_UNSUPPORTED,
                           "%s: %s is a group of encoding-type '%s', not a "
                           "matrix (csr_matrix, csc_matrix or a 2-d array)",
                           s->base.c.path, m->base.key, enc ? enc : "(none)");
        ZB_TRY(open_sparse(m, nd, csc));
    }
    if (m->base.info.n_rows != s->base.c.n_obs)
        return zb__err(ZB_E_CORRUPT, "%s: %s has %llu rows, obs has %llu", s->base.c.path,
                       m->base.key, (unsigned long long)m->base.info.n_rows,
                       (unsigned long long)s->base.c.n_obs);
    return ZB_OK;
}

static zb_status
src_matrix_open(zb__src *bs, const char *key, zb__src_matrix **out)
{
    zarr_src *s = (zarr_src *)bs;
    *out = NULL;
    const char *var = NULL;
    ZB_TRY(var_frame_of(s, key, &var));
    const zb__tree_node *nd = zb__tree_find(s->tree, key);
    if (!nd) return zb__err(ZB_E_NOTFOUND, "%s: no matrix '%s'", s->base.c.path, key);
    zarr_matrix *m = calloc(1, sizeof *m);
    if (m) m->base.key = strdup(key);
    if (!m || !m->base.key) {
        free(m);
        return zb__err(ZB_E_NOMEM, "%s: %s", s->base.c.path, key);
    }
    m->base.methods = &matrix_methods;
    m->base.path = s->base.c.path;
    m->src = s;
    m->var = var;
    zb_status st = open_matrix(s, m, nd);
    if (st != ZB_OK) {
        matrix_close(&m->base);
        return st;
    }
    *out = &m->base;
    return ZB_OK;
}

/* ---- the source ------------------------------------------------------------------------------- */

static void
src_close(zb__src *bs)
{
    zarr_src *s = (zarr_src *)bs;
    for (size_t i = 0; s->cols && i < s->base.c.n_columns; i++) col_release(&s->cols[i]);
    free(s->cols);
    zb_array_close(s->obs_names);
    zb__tree_free(s->tree);
    zb_store_close(s->store);
    workers_free(s->idle);
    pthread_mutex_destroy(&s->mu);
    zb__src_common_free(&s->base.c);
    free(s);
}

static const zb__src_methods src_methods = {
    src_matrix_open,
    src_read_column,
    src_read_obs_names,
    src_close,
};

/* anndata 0.7's write_zarr left the root group without attributes; its obs is a dataframe
 * group all the same (encoding-version 0.1.0), and anndata still reads such stores. */
static bool
is_unmarked_anndata(const zb__tree *tree)
{
    const zb__tree_node *root = &tree->nodes[0], *obs = zb__tree_find(tree, "obs");
    const char *enc = obs ? zb__json_string(obs->attrs, "encoding-type") : NULL;
    return !root->is_array && !zb__json_get(root->attrs, "encoding-type") && obs &&
           !obs->is_array && enc && !strcmp(enc, "dataframe");
}

/* The store and its tree; anything but an AnnData group is refused, saying what it is. */
static zb_status
open_tree(zarr_src *s)
{
    const char *path = s->base.c.path;
    zb_status st = zb_store_open_file(path, &s->store);
    if (st == ZB_OK) st = zb__tree_load(s->store, "", true, &s->tree);
    if (st == ZB_E_NOTFOUND)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: a directory without zarr.json, .zgroup or .zarray: "
                       "not a Zarr store",
                       path);
    if (st != ZB_OK) return zb__err_context(st, "%s", path);
    const zb__tree_node *root = &s->tree->nodes[0];
    const char *layout = zb__tree_layout(s->tree),
               *enc = zb__json_string(root->attrs, "encoding-type");
    if (!strcmp(layout, "anndata") || is_unmarked_anndata(s->tree)) return ZB_OK;
    if (root->is_array)
        return zb__err(ZB_E_UNSUPPORTED, "%s: a Zarr array, not an AnnData store", path);
    if (enc)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: not an AnnData store: the root group's encoding-type "
                       "is '%s', not 'anndata'",
                       path, enc);
    return zb__err(ZB_E_UNSUPPORTED,
                   "%s: not an AnnData store: the root group has no "
                   "encoding-type attribute (zbatch sees the layout '%s')",
                   path, layout);
}

zb_status
zb__src_open_zarr(const char *path, zb__src **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__src_open_zarr: NULL out");
    *out = NULL;
    if (!path || !*path) return zb__err(ZB_E_INVALID, "zb__src_open_zarr: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return zb__err(ZB_E_UNSUPPORTED, "%s: not a directory, so not a Zarr store", path);
    zarr_src *s = calloc(1, sizeof *s);
    if (!s) return zb__err(ZB_E_NOMEM, "%s: out of memory", path);
    pthread_mutex_init(&s->mu, NULL);
    s->base.methods = &src_methods;
    s->base.c.format = "zarr";
    s->base.c.path = strdup(path);
    zb_status st = s->base.c.path ? open_tree(s) : zb__err(ZB_E_NOMEM, "%s: out of memory", path);
    if (st == ZB_OK) st = open_obs(s);
    if (st != ZB_OK) {
        src_close(&s->base);
        return st;
    }
    *out = &s->base;
    return ZB_OK;
}
