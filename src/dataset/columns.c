/* Datasets as data frames: category tables, var names, obs columns and whole-column reads
 * (zb_dataset_category_table, zb_dataset_var_names, zb_dataset_column, zb_dataset_read_field,
 * zb_dataset_read_strings). Batches go through the reader; these read one column for every
 * sample of a range, for class-balanced sampling and for data frames. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/status.h"

void
zb__cattab_free(zb__cattab *t)
{
    if (!t) return;
    zb_strings_free(&t->strings);
    free(t->values);
    memset(t, 0, sizeof *t);
}

/* The dataset whose fields and columns describe every sample (a collection's first child). */
static const zb_dataset *
proto(const zb_dataset *ds)
{
    return ds->nchildren ? ds->children[0] : ds;
}

/* Reads the table of f's categories into t (no lock held: two fields load at once). */
static zb_status
read_categories(zb_dataset *ds, const zb__field *f, zb__cattab *t)
{
    zb_array *a = f->cats_arr, *own = NULL;
    zb_status st = ZB_OK;
    if (!a) {
        st = zb_array_open(ds->store, f->cats_path, &own);
        a = own;
    }
    if (st == ZB_OK && a->meta.ndim != 1)
        st = zb__err(ZB_E_CORRUPT, "%s: categories must be 1-d", f->cats_path);
    if (st == ZB_OK) {
        t->dtype = a->meta.dtype;
        t->n = a->meta.shape[0];
        t->ordered = f->cats_ordered;
    }
    if (st == ZB_OK && t->dtype == ZB_DT_STRING) {
        st = zb_array_read_strings(a, 0, t->n, &t->strings, NULL);
    } else if (st == ZB_OK) {
        size_t bytes = (size_t)t->n * a->meta.itemsize;
        t->values = malloc(bytes ? bytes : 1);
        st = t->values ? zb_array_read_rows(a, 0, t->n, t->values, bytes, NULL)
                       : zb__err(ZB_E_NOMEM, "%s: out of memory", f->cats_path);
    }
    zb_array_close(own);
    if (st != ZB_OK) zb__cattab_free(t);
    return st;
}

zb_status
zb__field_load_categories(zb_dataset *ds, zb__field *f)
{
    pthread_mutex_lock(&ds->var_mu);
    bool loaded = f->cats_loaded;
    pthread_mutex_unlock(&ds->var_mu);
    if (loaded) return ZB_OK;
    zb__cattab t = {0};
    zb_status st = read_categories(ds, f, &t);
    pthread_mutex_lock(&ds->var_mu);
    if (st == ZB_OK && !f->cats_loaded) { /* the first of two threads that read it wins */
        f->cats = t;
        f->cats_loaded = true;
    } else if (st == ZB_OK) {
        zb__cattab_free(&t);
    }
    pthread_mutex_unlock(&ds->var_mu);
    return st;
}

typedef struct cat_load {
    zb_dataset *ds;
    zb__field *f;
    zb_status st;
    char msg[512];
} cat_load;

static void *
cat_load_run(void *arg)
{
    cat_load *c = arg;
    c->st = zb__field_load_categories(c->ds, c->f);
    if (c->st != ZB_OK) snprintf(c->msg, sizeof c->msg, "%s", zb_last_error());
    return NULL;
}

zb_status
zb__fields_load_categories(zb_dataset **ds, zb__field **f, size_t n, bool at_once)
{
    cat_load *c = calloc(n + 1, sizeof *c);
    pthread_t *th = calloc(n + 1, sizeof *th);
    bool *started = calloc(n + 1, sizeof *started);
    if (!c || !th || !started) at_once = false;
    zb_status st = ZB_OK;
    size_t m = 0; /* the fields not loaded yet, first */
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&ds[i]->var_mu);
        bool loaded = f[i]->cats_loaded;
        pthread_mutex_unlock(&ds[i]->var_mu);
        if (loaded) continue;
        ds[m] = ds[i];
        f[m++] = f[i];
    }
    n = m;
    for (size_t i = 0; i < n; i++) {
        if (!at_once || n < 2) { /* one after another */
            st = zb__field_load_categories(ds[i], f[i]);
            if (st != ZB_OK) break;
            continue;
        }
        c[i] = (cat_load){.ds = ds[i], .f = f[i]};
        started[i] = pthread_create(&th[i], NULL, cat_load_run, &c[i]) == 0;
        if (!started[i]) cat_load_run(&c[i]); /* no thread: here */
    }
    for (size_t i = 0; at_once && n >= 2 && i < n; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        if (c[i].st != ZB_OK && st == ZB_OK) st = zb__err(c[i].st, "%s", c[i].msg);
    }
    free(c);
    free(th);
    free(started);
    return st;
}

zb_status
zb_dataset_category_table(zb_dataset *ds, const char *field, zb_category_table *out)
{
    if (!ds || !field || !out) return zb__err(ZB_E_INVALID, "zb_dataset_category_table: null");
    memset(out, 0, sizeof *out);
    size_t i;
    ZB_TRY(zb_dataset_find_field(ds, field, &i));
    zb_dataset *p = ds->nchildren ? ds->children[0] : ds;
    zb__field *f = &p->fields[i];
    if (!f->categorical)
        return zb__err(ZB_E_TYPE, "%s: %s is not categorical", zb_dataset_name(ds), field);
    const zb__cattab *t;
    bool ordered;
    if (ds->maps) {
        t = ds->maps[i].table; /* merged at open (merge.c) */
        ordered = ds->maps[i].ordered;
    } else {
        ZB_TRY(zb__field_load_categories(p, f));
        t = &f->cats;
        ordered = t->ordered;
    }
    out->dtype = t->dtype;
    out->n = t->n;
    out->strings = t->dtype == ZB_DT_STRING ? &t->strings : NULL;
    out->values = t->dtype == ZB_DT_STRING ? NULL : t->values;
    out->ordered = ordered;
    return ZB_OK;
}

zb_status
zb_dataset_categories(zb_dataset *ds, const char *field, const zb_strings **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_dataset_categories: null out");
    *out = NULL;
    zb_category_table t;
    ZB_TRY(zb_dataset_category_table(ds, field, &t));
    if (t.dtype != ZB_DT_STRING)
        return zb__err(ZB_E_TYPE,
                       "%s: the categories of %s are %s, not strings "
                       "(zb_dataset_category_table)",
                       zb_dataset_name(ds), field, zb_dtype_name(t.dtype));
    *out = t.strings;
    return ZB_OK;
}

zb_status
zb_dataset_var_names(zb_dataset *ds, const zb_strings **out)
{
    if (!ds || !out) return zb__err(ZB_E_INVALID, "zb_dataset_var_names: null argument");
    *out = NULL;
    if (ds->nchildren) return zb_dataset_var_names(ds->children[0], out); /* merge.c: agreed */
    if (!ds->var_index) return zb__err(ZB_E_NOTFOUND, "%s: no var names", zb_dataset_name(ds));
    zb_status st = ZB_OK;
    pthread_mutex_lock(&ds->var_mu);
    if (!ds->var_loaded) {
        zb_array *a = NULL;
        st = zb_array_open(ds->store, ds->var_index, &a);
        if (st == ZB_OK && (a->meta.dtype != ZB_DT_STRING || a->meta.ndim != 1))
            st = zb__err(ZB_E_CORRUPT, "%s: var names must be a 1-d string array", ds->var_index);
        if (st == ZB_OK && a->meta.shape[0] != ds->n_vars)
            st = zb__err(ZB_E_CORRUPT, "%s: %llu var names for %llu columns of X", ds->var_index,
                         (unsigned long long)a->meta.shape[0], (unsigned long long)ds->n_vars);
        if (st == ZB_OK) st = zb_array_read_strings(a, 0, ds->n_vars, &ds->var_names, NULL);
        zb_array_close(a);
        ds->var_loaded = st == ZB_OK;
    }
    pthread_mutex_unlock(&ds->var_mu);
    if (st == ZB_OK) *out = &ds->var_names;
    return st;
}

size_t
zb_dataset_ncolumns(const zb_dataset *ds)
{
    return ds ? proto(ds)->ncols : 0;
}

zb_status
zb_dataset_column(const zb_dataset *ds, size_t i, zb_column_info *info)
{
    if (!ds || !info) return zb__err(ZB_E_INVALID, "zb_dataset_column: null argument");
    const zb_dataset *p = proto(ds);
    if (i >= p->ncols) return zb__err(ZB_E_RANGE, "column %zu of %zu", i, p->ncols);
    info->name = p->cols[i].name;
    info->kind = p->cols[i].kind;
    info->dtype = p->cols[i].dtype;
    if (info->kind == ZB_COLUMN_STRINGS)
        for (size_t c = 1; c < ds->nchildren; c++)
            if (ds->children[c]->cols[i].kind == ZB_COLUMN_NULLABLE_STRINGS)
                info->kind = ZB_COLUMN_NULLABLE_STRINGS;
    if (info->kind == ZB_COLUMN_CATEGORICAL) {
        size_t f;
        if (zb_dataset_find_field(ds, info->name, &f) == ZB_OK)
            info->dtype = zb__dataset_field_dtype(ds, f);
    }
    return ZB_OK;
}

/* The column named `name` of `ds` itself (not its children), or NULL. */
static const zb__column *
find_column(const zb_dataset *ds, const char *name)
{
    for (size_t i = 0; i < ds->ncols; i++)
        if (!strcmp(ds->cols[i].name, name)) return &ds->cols[i];
    return NULL;
}

/* Calls fn for each child holding logical samples [start, stop): the child, its index and its
 * own logical range [lo, hi), whose values land at position `at` of the caller's range. */
typedef zb_status (*child_fn)(void *ctx, zb_dataset *ch, size_t c, uint64_t lo, uint64_t hi,
                              uint64_t at);

static zb_status
for_children(zb_dataset *ds, uint64_t start, uint64_t stop, child_fn fn, void *ctx)
{
    uint64_t n = 0;
    ZB_TRY(zb_dataset_len(ds, &n));
    if (start > stop || stop > n)
        return zb__err(ZB_E_RANGE, "%s: samples [%llu, %llu) outside [0, %llu)",
                       zb_dataset_name(ds), (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)n);
    if (!ds->nchildren) return fn(ctx, ds, 0, start, stop, 0);
    for (size_t c = 0; c < ds->nchildren; c++) {
        uint64_t c0 = ds->child_start[c], c1 = ds->child_start[c + 1];
        uint64_t lo = start > c0 ? start : c0, hi = stop < c1 ? stop : c1;
        if (lo >= hi) continue;
        ZB_TRY(fn(ctx, ds->children[c], c, lo - c0, hi - c0, lo - start));
    }
    return ZB_OK;
}

/* Logical rows [lo, hi) of `a` (a field's array, or a column's) into dst, rows of row_bytes:
 * one read of the physical rows they span, compacted past soft-deleted rows. */
static zb_status
read_logical_rows(zb_dataset *ch, const zb_array *a, uint64_t lo, uint64_t hi, uint8_t *dst,
                  size_t row_bytes)
{
    if (lo == hi) return ZB_OK;
    ZB_TRY(zb__mask_load(ch));
    uint64_t p0 = zb__mask_select(&ch->mask, lo), p1 = zb__mask_select(&ch->mask, hi - 1) + 1;
    if (p1 - p0 == hi - lo)
        return zb_array_read_rows(a, p0, p1, dst, (size_t)(hi - lo) * row_bytes, NULL);
    size_t span = (size_t)(p1 - p0) * row_bytes;
    uint8_t *tmp = malloc(span ? span : 1);
    if (!tmp) return zb__err(ZB_E_NOMEM, "%s: out of memory for %zu bytes", a->path, span);
    zb_status st = zb_array_read_rows(a, p0, p1, tmp, span, NULL);
    for (uint64_t l = lo; st == ZB_OK && l < hi; l++)
        memcpy(dst + (l - lo) * row_bytes, tmp + (zb__mask_select(&ch->mask, l) - p0) * row_bytes,
               row_bytes);
    free(tmp);
    return st;
}

typedef struct field_read {
    zb_dataset *ds;
    size_t f;
    uint8_t *dst;
    size_t row_bytes; /* delivered */
    zb_dtype dtype;   /* delivered */
} field_read;

static zb_status
read_field_child(void *ctx, zb_dataset *ch, size_t c, uint64_t lo, uint64_t hi, uint64_t at)
{
    field_read *r = ctx;
    const zb__field *f = &ch->fields[r->f];
    uint8_t *dst = r->dst + at * r->row_bytes;
    uint64_t nlut = 0;
    const int64_t *lut = zb__dataset_lut(r->ds, r->f, c, &nlut);
    size_t own_bytes = (size_t)(f->row_elems * f->itemsize);
    if (!lut && f->dtype == r->dtype) {
        ZB_TRY(read_logical_rows(ch, f->arr, lo, hi, dst, own_bytes));
    } else {
        /* stored in another type (narrow values, codes of another width) or codes through the
         * collection's table: read, then convert as batches do */
        uint8_t *tmp = malloc((size_t)(hi - lo) * own_bytes + 1);
        if (!tmp) return zb__err(ZB_E_NOMEM, "%s: out of memory", f->arr->path);
        zb_status st = read_logical_rows(ch, f->arr, lo, hi, tmp, own_bytes);
        if (st == ZB_OK)
            st = zb__values_convert(dst, r->dtype, tmp, f->dtype, (hi - lo) * f->row_elems, lut,
                                    nlut, f->arr->path, 0, NULL);
        free(tmp);
        ZB_TRY(st);
    }
    const int64_t *vl = r->ds->vars.lut ? r->ds->vars.lut[c] : NULL;
    if (vl && f->var_cols && f->kind == ZB_FIELD_PER_SAMPLE) {
        uint8_t *scratch = malloc(r->row_bytes ? r->row_bytes : 1);
        if (!scratch) return zb__err(ZB_E_NOMEM, "%s: out of memory", f->arr->path);
        for (uint64_t i = 0; i < hi - lo; i++)
            zb__var_reorder_dense(dst + i * r->row_bytes, f->row_elems, f->itemsize, vl, scratch);
        free(scratch);
    }
    return ZB_OK;
}

zb_status
zb_dataset_read_field(zb_dataset *ds, const char *field, uint64_t start, uint64_t stop, void *dst,
                      size_t dst_size)
{
    if (!ds || !field || (!dst && stop > start))
        return zb__err(ZB_E_INVALID, "zb_dataset_read_field: null argument");
    size_t i;
    ZB_TRY(zb_dataset_find_field(ds, field, &i));
    const zb__field *f = &proto(ds)->fields[i];
    if (f->kind != ZB_FIELD_PER_SAMPLE || f->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: %s is not a per-sample field of fixed-size values%s",
                       zb_dataset_name(ds), field,
                       f->dtype == ZB_DT_STRING ? " (zb_dataset_read_strings)" : "");
    zb_dtype dt = zb__dataset_field_dtype(ds, i);
    field_read r = {ds, i, dst, (size_t)(f->row_elems * zb_dtype_size(dt)), dt};
    if (stop > start && dst_size / r.row_bytes < stop - start)
        return zb__err(ZB_E_INVALID,
                       "zb_dataset_read_field: %zu bytes hold fewer than %llu rows "
                       "of %s",
                       dst_size, (unsigned long long)(stop - start), field);
    return for_children(ds, start, stop, read_field_child, &r);
}

typedef struct strings_read {
    const char *name;
    zb_strings parts; /* the children's strings, appended */
    uint64_t cap_data;
    uint8_t *missing;
} strings_read;

static zb_status
read_strings_child(void *ctx, zb_dataset *ch, size_t c, uint64_t lo, uint64_t hi, uint64_t at)
{
    (void)c;
    strings_read *r = ctx;
    const zb__column *col = find_column(ch, r->name);
    if (!col || !col->values)
        return zb__err(ZB_E_NOTFOUND, "%s: no string column '%s'", zb_dataset_name(ch), r->name);
    ZB_TRY(zb__mask_load(ch));
    zb_strings got = {0};
    uint64_t p0 = zb__mask_select(&ch->mask, lo),
             p1 = lo < hi ? zb__mask_select(&ch->mask, hi - 1) + 1 : p0;
    ZB_TRY(zb_array_read_strings(col->values, p0, p1, &got, NULL));
    zb_status st = ZB_OK;
    uint8_t *flags = NULL;
    if (r->missing) {
        if (col->mask) {
            flags = malloc((size_t)(p1 - p0) + 1);
            st = flags ? zb_array_read_rows(col->mask, p0, p1, flags, (size_t)(p1 - p0), NULL)
                       : zb__err(ZB_E_NOMEM, "%s: out of memory", col->mask->path);
        }
    }
    /* append the logical rows: the range, less any soft-deleted rows */
    zb_strings *out = &r->parts;
    uint64_t need = out->offsets[out->n] + got.offsets[got.n];
    if (st == ZB_OK && need > r->cap_data) {
        char *d = realloc(out->data, (size_t)need + 1);
        if (!d)
            st = zb__err(ZB_E_NOMEM, "%s: out of memory for strings", col->values->path);
        else {
            out->data = d;
            r->cap_data = need;
        }
    }
    for (uint64_t l = lo; st == ZB_OK && l < hi; l++) {
        uint64_t p = zb__mask_select(&ch->mask, l) - p0;
        uint64_t len = got.offsets[p + 1] - got.offsets[p], o = out->offsets[out->n];
        memcpy(out->data + o, got.data + got.offsets[p], (size_t)len);
        out->offsets[out->n + 1] = o + len;
        out->n++;
        if (r->missing) r->missing[at + (l - lo)] = flags ? flags[p] != 0 : 0;
    }
    free(flags);
    zb_strings_free(&got);
    return st;
}

zb_status
zb_dataset_read_strings(zb_dataset *ds, const char *column, uint64_t start, uint64_t stop,
                        zb_strings *out, uint8_t *missing)
{
    if (!ds || !column || !out) return zb__err(ZB_E_INVALID, "zb_dataset_read_strings: null");
    memset(out, 0, sizeof *out);
    const zb__column *col = find_column(proto(ds), column);
    if (!col || !col->values)
        return zb__err(ZB_E_NOTFOUND, "%s: no string column '%s'", zb_dataset_name(ds), column);
    strings_read r = {.name = column, .missing = missing};
    uint64_t n = stop > start ? stop - start : 0;
    r.parts.offsets = calloc((size_t)n + 1, sizeof *r.parts.offsets);
    r.parts.data = malloc(1);
    if (!r.parts.offsets || !r.parts.data) {
        zb_strings_free(&r.parts);
        return zb__err(ZB_E_NOMEM, "%s: out of memory for %llu strings", column,
                       (unsigned long long)n);
    }
    zb_status st = for_children(ds, start, stop, read_strings_child, &r);
    if (st != ZB_OK) {
        zb_strings_free(&r.parts);
        return st;
    }
    *out = r.parts;
    return ZB_OK;
}
