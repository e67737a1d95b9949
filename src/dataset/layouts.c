/* Layouts: how a store's conventions map onto fields and segments (DESIGN.md §2).
 * anndata: shared FORMATS.md §6; atomic: §8; generic: docs/FORMATS-zbatch.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/json.h"
#include "util/status.h"
#include "zarr/tree.h"

/* Joins two path parts; paths are bounded by the store layer's key limit, so a cut here would
 * only shorten an already invalid key. */
static void
join(char *buf, size_t cap, const char *a, const char *b)
{
    int n =
        a[0] && b[0] ? snprintf(buf, cap, "%s/%s", a, b) : snprintf(buf, cap, "%s", a[0] ? a : b);
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0';
}

/* Opens the array node at `path` of the tree. */
static zb_status
open_node(zb_dataset *ds, const zb__tree *tree, const char *path, zb_array **out)
{
    *out = NULL;
    const zb__tree_node *nd = zb__tree_find(tree, path);
    if (!nd || !nd->is_array)
        return zb__err(ZB_E_NOTFOUND, "%s: no array '%s'", zb_dataset_name(ds), path);
    return zb__tree_node_open_array(ds->store, nd, out);
}

static zb_status
add_segment(zb_dataset *ds, const zb__tree *tree, const char *name, const char *ptr_path,
            int *index)
{
    if (ds->nsegs == ZB_MAX_SEGMENTS) return zb__err(ZB_E_UNSUPPORTED, "too many segments");
    zb__segment *seg = &ds->segs[ds->nsegs];
    memset(seg, 0, sizeof *seg);
    snprintf(seg->name, sizeof seg->name, "%s", name);
    ZB_TRY(open_node(ds, tree, ptr_path, &seg->ptr));
    if (seg->ptr->meta.ndim != 1 || seg->ptr->meta.shape[0] == 0) {
        zb_array_close(seg->ptr);
        seg->ptr = NULL;
        /* ptr[N+1] has at least ptr[0]; an empty one would make N wrap around */
        return zb__err(ZB_E_CORRUPT, "%s: a pointer array must be 1-d and hold ptr[0]", ptr_path);
    }
    uint64_t rows = seg->ptr->inner[0];
    /* cache blocks of at least 64k pointers, whatever the chunking */
    seg->chunk_rows = rows < 65536 ? ((65536 + rows - 1) / rows) * rows : rows;
    uint64_t total = seg->ptr->meta.shape[0];
    seg->nblocks = (total + seg->chunk_rows - 1) / seg->chunk_rows;
    seg->blocks = calloc((size_t)seg->nblocks + 1, sizeof *seg->blocks);
    if (!seg->blocks) {
        zb_array_close(seg->ptr);
        seg->ptr = NULL;
        return zb__err(ZB_E_NOMEM, "segment %s: out of memory", name);
    }
    pthread_mutex_init(&seg->mu, NULL);
    *index = (int)ds->nsegs++;
    return ZB_OK;
}

/* Adds a field backed by the array at `path`. Takes the name as given. */
static zb_status
add_field(zb_dataset *ds, const zb__tree *tree, const char *name, const char *path,
          zb_field_kind kind, int seg, int target, zb__field **out)
{
    if (ds->nfields == ZB_MAX_FIELDS) return zb__err(ZB_E_UNSUPPORTED, "%s: too many fields", path);
    zb__field *f = &ds->fields[ds->nfields];
    memset(f, 0, sizeof *f);
    ZB_TRY(open_node(ds, tree, path, &f->arr));
    const zb__array_meta *m = &f->arr->meta;
    if (m->dtype == ZB_DT_STRING || m->ndim == 0) {
        zb_array_close(f->arr);
        f->arr = NULL;
        return ZB_E_TYPE; /* silently skipped by callers: strings are not batch fields */
    }
    f->name = strdup(name);
    if (!f->name) {
        zb_array_close(f->arr);
        return zb__err(ZB_E_NOMEM, "out of memory");
    }
    if (kind == ZB_FIELD_INDEX && m->dtype != ZB_DT_INT32 && m->dtype != ZB_DT_INT64) {
        zb_status st = zb__err(ZB_E_METADATA, "%s: index fields must be int32 or int64 (%s is %s)",
                               name, path, zb_dtype_name(m->dtype));
        free(f->name);
        zb_array_close(f->arr);
        f->arr = NULL;
        return st;
    }
    f->kind = kind;
    f->dtype = m->dtype;
    f->out_dtype = m->dtype;
    f->itemsize = m->itemsize;
    f->ndim = m->ndim - 1;
    f->row_elems = 1;
    for (int d = 1; d < m->ndim; d++) {
        f->row_shape[d - 1] = m->shape[d];
        f->row_elems *= m->shape[d];
    }
    f->seg = seg;
    f->target = target;
    ds->nfields++;
    if (out) *out = f;
    return ZB_OK;
}

static zb_status
check_rows(const zb__field *f, uint64_t want, const char *what)
{
    if (f->arr->meta.shape[0] != want)
        return zb__err(ZB_E_CORRUPT, "%s: %llu rows, %s says %llu", f->arr->path,
                       (unsigned long long)f->arr->meta.shape[0], what, (unsigned long long)want);
    return ZB_OK;
}

/* ---- anndata ------------------------------------------------------------------------------ */

/* The dtype a CSR matrix's (X's, a layer's) values or gene ids are delivered in
 * (zb_dataset_opts.x_dtype and index_dtype): `want` as asked, or by default `wide` for
 * integers of up to 16 bits, so a store of narrow counts (docs/PERFORMANCE.md, "Narrow exact
 * storage") reads as its float32/int32 twin. The reader widens them as it copies (widen.c). */
static zb_status
deliver_as(zb__field *f, int want, zb_dtype wide, const char *opt)
{
    if (want == ZB_WANT_STORED) return ZB_OK;
    zb_dtype to = (zb_dtype)want;
    if (want == ZB_WANT_AUTO) {
        bool narrow_int = f->dtype == ZB_DT_UINT8 || f->dtype == ZB_DT_INT8 ||
                          f->dtype == ZB_DT_UINT16 || f->dtype == ZB_DT_INT16;
        if (!narrow_int) return ZB_OK;
        to = wide;
    }
    if (f->ndim != 0 || !zb__widen_exact(f->dtype, to))
        return zb__err(ZB_E_INVALID, "%s: %s=%s does not hold every stored %s value exactly",
                       f->arr->path, opt, zb_dtype_name(to), zb_dtype_name(f->dtype));
    f->out_dtype = to;
    return ZB_OK;
}

/* Adds the 1-d string array at `path` as a string field `name` (load_strings): a per-sample
 * field of dtype ZB_DT_STRING that the reader fills after the fixed-size fields. */
static zb_status
add_string_field(zb_dataset *ds, const zb__tree *tree, const char *name, const char *path)
{
    if (ds->nfields == ZB_MAX_FIELDS) return zb__err(ZB_E_UNSUPPORTED, "%s: too many fields", name);
    zb__field *f = &ds->fields[ds->nfields];
    memset(f, 0, sizeof *f);
    ZB_TRY(open_node(ds, tree, path, &f->arr));
    f->name = strdup(name);
    if (!f->name) {
        zb_array_close(f->arr);
        f->arr = NULL;
        return zb__err(ZB_E_NOMEM, "out of memory");
    }
    f->kind = ZB_FIELD_PER_SAMPLE;
    f->dtype = ZB_DT_STRING;
    f->out_dtype = ZB_DT_STRING;
    f->row_elems = 1;
    f->seg = -1;
    f->target = -1;
    ds->nfields++;
    return ZB_OK;
}

/* Records obs column `name` (zb_dataset_column). String columns keep their arrays (taken from
 * *values and *mask, which are then NULL); the others are read through their fields. */
static zb_status
add_column(zb_dataset *ds, const char *name, zb_column_kind kind, zb_dtype dtype, zb_array **values,
           zb_array **mask)
{
    zb__column *c = realloc(ds->cols, (ds->ncols + 1) * sizeof *c);
    if (!c) return zb__err(ZB_E_NOMEM, "out of memory");
    ds->cols = c;
    c = &ds->cols[ds->ncols];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    if (!c->name) return zb__err(ZB_E_NOMEM, "out of memory");
    c->kind = kind;
    c->dtype = dtype;
    if (values) {
        c->values = *values;
        *values = NULL;
    }
    if (mask) {
        c->mask = *mask;
        *mask = NULL;
    }
    ds->ncols++;
    return ZB_OK;
}

/* Adds X-like element `path` (CSR group or dense array) as fields named `name`... */
static zb_status
add_matrix(zb_dataset *ds, const zb__tree *tree, const char *name, const char *path, bool is_x)
{
    const zb__tree_node *nd = zb__tree_find(tree, path);
    if (!nd) return ZB_OK;
    const char *enc = zb__json_string(nd->attrs, "encoding-type");
    char sub[4200], fname[300];
    if (!nd->is_array && enc && !strcmp(enc, "csr_matrix")) {
        json_object *shape = zb__json_get(nd->attrs, "shape");
        uint64_t rows = 0, cols = 0;
        if (!json_object_is_type(shape, json_type_array) || json_object_array_length(shape) != 2 ||
            zb__json_u64(json_object_array_get_idx(shape, 0), "shape", &rows) != ZB_OK ||
            zb__json_u64(json_object_array_get_idx(shape, 1), "shape", &cols) != ZB_OK)
            return zb__err(ZB_E_METADATA, "%s: csr_matrix attributes lack a [rows, cols] shape",
                           path);
        int seg;
        join(sub, sizeof sub, path, "indptr");
        ZB_TRY(add_segment(ds, tree, name, sub, &seg));
        if (ds->segs[seg].ptr->meta.shape[0] != rows + 1)
            return zb__err(ZB_E_CORRUPT, "%s: %llu pointers for %llu rows", sub,
                           (unsigned long long)ds->segs[seg].ptr->meta.shape[0],
                           (unsigned long long)rows);
        if (is_x) {
            ds->nphys = rows;
            ds->n_vars = cols;
        } else if (rows != ds->nphys) {
            return zb__err(ZB_E_CORRUPT, "%s: %llu rows, X has %llu", path,
                           (unsigned long long)rows, (unsigned long long)ds->nphys);
        }
        zb__field *fd, *fi;
        join(sub, sizeof sub, path, "data");
        snprintf(fname, sizeof fname, "%s/data", name);
        ZB_TRY(add_field(ds, tree, fname, sub, ZB_FIELD_RAGGED, seg, -1, &fd));
        join(sub, sizeof sub, path, "indices");
        snprintf(fname, sizeof fname, "%s/indices", name);
        ZB_TRY(add_field(ds, tree, fname, sub, ZB_FIELD_RAGGED, seg, -1, &fi));
        if (fi->ndim != 0)
            return zb__err(ZB_E_CORRUPT, "%s: CSR indices must be 1-d", fi->arr->path);
        fi->var_cols = is_x;
        fi->col_bound = cols; /* checked as rows land (value_bound in read_int.h) */
        ZB_TRY(deliver_as(fd, ds->x_want, ZB_DT_FLOAT32, "x_dtype"));
        ZB_TRY(deliver_as(fi, ds->index_want, ZB_DT_INT32, "index_dtype"));
        if (fd->arr->meta.shape[0] != fi->arr->meta.shape[0])
            return zb__err(ZB_E_CORRUPT, "%s: data has %llu values, indices %llu", path,
                           (unsigned long long)fd->arr->meta.shape[0],
                           (unsigned long long)fi->arr->meta.shape[0]);
        /* indptr must start at 0 and end at len(data) (shared FORMATS.md §6) */
        int64_t first = 0, last = 0;
        ZB_TRY(zb__segment_get(&ds->segs[seg], NULL, 0, &first));
        ZB_TRY(zb__segment_get(&ds->segs[seg], NULL, rows, &last));
        if (first != 0 || last < 0 || (uint64_t)last != fd->arr->meta.shape[0])
            return zb__err(ZB_E_CORRUPT, "%s/indptr: runs from %lld to %lld, data has %llu values",
                           path, (long long)first, (long long)last,
                           (unsigned long long)fd->arr->meta.shape[0]);
        return ZB_OK;
    }
    /* `zbatch convert` transposes a CSC matrix out of core (docs/CONVERT.md) */
    if (!nd->is_array && enc && !strcmp(enc, "csc_matrix"))
        return is_x ? zb__err(ZB_E_UNSUPPORTED,
                              "%s: a CSC matrix cannot be read by rows; "
                              "`zbatch convert %s -o OUT` writes it as CSR",
                              path, zb_dataset_name(ds))
                    : ZB_OK;
    if (nd->is_array) {
        zb__field *f;
        zb_status st = add_field(ds, tree, name, path, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
        if (st == ZB_E_TYPE) return ZB_OK;
        if (st != ZB_OK) return st;
        if (is_x) {
            ds->nphys = f->arr->meta.shape[0];
            ds->n_vars = f->ndim >= 1 ? f->row_shape[0] : 1;
            f->var_cols = f->ndim == 1;
        }
        return ZB_OK;
    }
    return ZB_OK;
}

/* Opens the string array at `path` (1-d, one string per sample); ZB_E_TYPE when it is not one
 * (the caller skips such a column). */
static zb_status
open_strings(zb_dataset *ds, const zb__tree *tree, const char *path, zb_array **out)
{
    ZB_TRY(open_node(ds, tree, path, out));
    if ((*out)->meta.dtype != ZB_DT_STRING || (*out)->meta.ndim != 1) {
        zb_array_close(*out);
        *out = NULL;
        return ZB_E_TYPE;
    }
    if ((*out)->meta.shape[0] != ds->nphys) {
        zb_status st =
            zb__err(ZB_E_CORRUPT, "%s: %llu rows, X has %llu", path,
                    (unsigned long long)(*out)->meta.shape[0], (unsigned long long)ds->nphys);
        zb_array_close(*out);
        *out = NULL;
        return st;
    }
    return ZB_OK;
}

/* A nullable column's mask "NAME/mask" (bool per sample) as a field beside its values. */
static zb_status
add_mask_field(zb_dataset *ds, const zb__tree *tree, const char *name, const char *path,
               zb__field *values)
{
    char mname[620];
    snprintf(mname, sizeof mname, "%s/mask", name);
    zb__field *m = NULL;
    zb_status st = add_field(ds, tree, mname, path, ZB_FIELD_PER_SAMPLE, -1, -1, &m);
    if (st == ZB_E_TYPE || (st == ZB_OK && (m->dtype != ZB_DT_BOOL || m->ndim != 0)))
        return zb__err(ZB_E_CORRUPT, "%s: a nullable column's mask must be 1-d bool", path);
    if (st != ZB_OK) return st;
    ZB_TRY(check_rows(m, ds->nphys, "X"));
    if (values) {
        values->mask = strdup(mname);
        if (!values->mask) return zb__err(ZB_E_NOMEM, "out of memory");
    }
    return ZB_OK;
}

/* One obs column (shared FORMATS.md §6): a field (numbers, categorical codes, nullable values
 * and mask; strings with load_strings) and its entry in ds->cols. */
static zb_status
add_obs_column(zb_dataset *ds, const zb__tree *tree, const zb__tree_node *cn, const char *path,
               const char *name)
{
    zb_status st;
    zb__field *f = NULL;
    const char *enc = zb__json_string(cn->attrs, "encoding-type");
    json_object *enc_attr = zb__json_get(cn->attrs, "encoding-type");
    if (enc_attr && !enc) /* a number, a list: no encoding (unknown ones are names, left out) */
        return zb__err(ZB_E_METADATA, "%s: its encoding-type attribute must be a string", path);
    if (!cn->is_array && !enc_attr) /* a group column is an encoding's (anndata >= 0.8) */
        return zb__err(ZB_E_METADATA, "%s: a column group without an encoding-type attribute",
                       path);
    char sub[4300];
    zb_array *strs = NULL, *mask = NULL;
    if (cn->is_array) {
        st = add_field(ds, tree, name, path, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
        if (st == ZB_E_TYPE) { /* a string-array (0-d and other odd arrays are left out) */
            st = open_strings(ds, tree, path, &strs);
            if (st == ZB_E_TYPE) return ZB_OK;
            if (st == ZB_OK && ds->opts.load_strings) st = add_string_field(ds, tree, name, path);
            if (st == ZB_OK)
                st = add_column(ds, name, ZB_COLUMN_STRINGS, ZB_DT_STRING, &strs, NULL);
            zb_array_close(strs);
            return st;
        }
        if (st != ZB_OK) return st;
        ZB_TRY(check_rows(f, ds->nphys, "X"));
        if (f->ndim != 0) return ZB_OK; /* a 2-d column: a field, not a data-frame column */
        return add_column(ds, name, ZB_COLUMN_VALUES, f->dtype, NULL, NULL);
    }
    if (enc && !strcmp(enc, "categorical")) {
        join(sub, sizeof sub, path, "codes");
        st = add_field(ds, tree, name, sub, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
        if (st == ZB_E_TYPE) return ZB_OK;
        if (st != ZB_OK) return st;
        ZB_TRY(check_rows(f, ds->nphys, "X"));
        if (f->dtype == ZB_DT_BOOL || f->dtype == ZB_DT_FLOAT16 || f->dtype == ZB_DT_FLOAT32 ||
            f->dtype == ZB_DT_FLOAT64 || f->ndim != 0)
            return zb__err(ZB_E_CORRUPT, "%s: categorical codes must be 1-d integers", sub);
        f->categorical = true;
        json_object *ord = zb__json_get(cn->attrs, "ordered");
        f->cats_ordered = ord && json_object_get_boolean(ord);
        join(sub, sizeof sub, path, "categories");
        f->cats_path = strdup(sub);
        if (!f->cats_path) return zb__err(ZB_E_NOMEM, "out of memory");
        /* their metadata from the tree, as every other array's (not their own document when
         * the dataset reads a consolidated snapshot); a missing node fails when loaded */
        const zb__tree_node *cats = zb__tree_find(tree, sub);
        if (cats && cats->is_array) ZB_TRY(zb__tree_node_open_array(ds->store, cats, &f->cats_arr));
        return add_column(ds, name, ZB_COLUMN_CATEGORICAL, f->dtype, NULL, NULL);
    }
    if (enc && (!strcmp(enc, "nullable-integer") || !strcmp(enc, "nullable-boolean"))) {
        join(sub, sizeof sub, path, "values");
        st = add_field(ds, tree, name, sub, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
        if (st == ZB_E_TYPE) return ZB_OK;
        if (st != ZB_OK) return st;
        ZB_TRY(check_rows(f, ds->nphys, "X"));
        join(sub, sizeof sub, path, "mask");
        ZB_TRY(add_mask_field(ds, tree, name, sub, f));
        return add_column(ds, name, ZB_COLUMN_NULLABLE, f->dtype, NULL, NULL);
    }
    if (enc && !strcmp(enc, "nullable-string-array")) {
        char mpath[4300];
        join(sub, sizeof sub, path, "values");
        join(mpath, sizeof mpath, path, "mask");
        st = open_strings(ds, tree, sub, &strs);
        if (st == ZB_E_TYPE) return ZB_OK;
        if (st == ZB_OK) st = open_node(ds, tree, mpath, &mask);
        if (st == ZB_OK && (mask->meta.dtype != ZB_DT_BOOL || mask->meta.ndim != 1 ||
                            mask->meta.shape[0] != ds->nphys))
            st = zb__err(ZB_E_CORRUPT,
                         "%s: a nullable column's mask must be 1-d bool with a row "
                         "per sample",
                         mpath);
        if (st == ZB_OK && ds->opts.load_strings) {
            st = add_string_field(ds, tree, name, sub);
            if (st == ZB_OK)
                st = add_mask_field(ds, tree, name, mpath, &ds->fields[ds->nfields - 1]);
        }
        if (st == ZB_OK)
            st = add_column(ds, name, ZB_COLUMN_NULLABLE_STRINGS, ZB_DT_STRING, &strs, &mask);
        zb_array_close(strs);
        zb_array_close(mask);
        return st;
    }
    return ZB_OK; /* other encodings (awkward arrays, ...) are not columns zbatch reads */
}

/* obs (shared FORMATS.md §6): the index as "obs_names", then column-order. */
static zb_status
add_obs(zb_dataset *ds, const zb__tree *tree, const char *df)
{
    const zb__tree_node *nd = zb__tree_find(tree, df);
    if (!nd || nd->is_array) return ZB_OK;
    char path[4200], name[600];
    const char *index = zb__json_string(nd->attrs, "_index");
    if (index) {
        /* a string-array, or (anndata >= 0.13 with pandas 3) a nullable-string-array group */
        zb_array *strs = NULL, *mask = NULL;
        join(path, sizeof path, df, index);
        const zb__tree_node *in = zb__tree_find(tree, path);
        const char *enc = in ? zb__json_string(in->attrs, "encoding-type") : NULL;
        bool nullable = in && !in->is_array && enc && !strcmp(enc, "nullable-string-array");
        char mpath[4300];
        join(mpath, sizeof mpath, path, "mask");
        if (nullable) strncat(path, "/values", sizeof path - strlen(path) - 1);
        zb_status st = in ? open_strings(ds, tree, path, &strs) : ZB_E_TYPE;
        if (st == ZB_OK && nullable) st = open_node(ds, tree, mpath, &mask);
        if (st == ZB_OK && ds->opts.load_strings)
            st = add_string_field(ds, tree, "obs_names", path);
        if (st == ZB_OK)
            st = add_column(ds, "obs_names",
                            nullable ? ZB_COLUMN_NULLABLE_STRINGS : ZB_COLUMN_STRINGS, ZB_DT_STRING,
                            &strs, &mask);
        zb_array_close(strs);
        zb_array_close(mask);
        if (st != ZB_OK && st != ZB_E_TYPE) return st;
    }
    json_object *order = zb__json_get(nd->attrs, "column-order");
    if (order && !json_object_is_type(order, json_type_array))
        return zb__err(ZB_E_METADATA, "%s: column-order must be a list of column names", df);
    size_t n = order ? json_object_array_length(order) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(order, i);
        if (!json_object_is_type(c, json_type_string))
            return zb__err(ZB_E_METADATA, "%s: column-order entry %zu is not a column name", df, i);
        const char *col = json_object_get_string(c);
        join(path, sizeof path, df, col);
        snprintf(name, sizeof name, "obs/%s", col);
        const zb__tree_node *cn = zb__tree_find(tree, path);
        if (!cn) return zb__err(ZB_E_CORRUPT, "%s: column '%s' is listed but missing", df, col);
        ZB_TRY(add_obs_column(ds, tree, cn, path, name));
    }
    return ZB_OK;
}

/* The path of `df`'s index array (its `_index` attribute), or NULL. */
static char *
index_path(const zb__tree *tree, const char *df)
{
    const zb__tree_node *nd = zb__tree_find(tree, df);
    const char *index = nd && !nd->is_array ? zb__json_string(nd->attrs, "_index") : NULL;
    if (!index) return NULL;
    char path[4200];
    join(path, sizeof path, df, index);
    const zb__tree_node *in = zb__tree_find(tree, path);
    if (in && !in->is_array) /* nullable strings */
        strncat(path, "/values", sizeof path - strlen(path) - 1);
    return in ? strdup(path) : NULL;
}

zb_status
zb__layout_anndata(zb_dataset *ds, const zb__tree *tree, const char *base)
{
    /* the matrix delivered as X (zb_dataset_opts.layer) and the var frame naming its columns */
    const char *layer = ds->opts.layer && ds->opts.layer[0] ? ds->opts.layer : "X";
    char path[4200], var[4200], lay[600];
    if (!strcmp(layer, "X")) {
        join(path, sizeof path, base, "X");
        join(var, sizeof var, base, "var");
    } else if (!strcmp(layer, "raw")) {
        join(path, sizeof path, base, "raw/X");
        join(var, sizeof var, base, "raw/var");
    } else {
        snprintf(lay, sizeof lay, "layers/%s", layer);
        join(path, sizeof path, base, lay);
        join(var, sizeof var, base, "var");
    }
    if (!zb__tree_find(tree, path))
        return !strcmp(layer, "X") ? zb__err(ZB_E_UNSUPPORTED, "%s: an anndata store without X",
                                             zb_dataset_name(ds))
                                   : zb__err(ZB_E_NOTFOUND, "%s: no matrix %s (layer '%s')",
                                             zb_dataset_name(ds), path, layer);
    ZB_TRY(add_matrix(ds, tree, "X", path, true));
    if (!ds->nfields)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is neither a CSR nor a dense matrix",
                       zb_dataset_name(ds), path);
    ds->var_index = index_path(tree, var);
    if (ds->var_index && !(ds->var_frame = strdup(var)))
        return zb__err(ZB_E_NOMEM, "out of memory");
    join(path, sizeof path, base, "obs");
    ZB_TRY(add_obs(ds, tree, path));
    char name[600];
    if (ds->opts.load_obsm) {
        join(path, sizeof path, base, "obsm");
        size_t plen = strlen(path);
        for (size_t i = 0; i < tree->n; i++) {
            const zb__tree_node *nd = &tree->nodes[i];
            if (!nd->is_array || strncmp(nd->path, path, plen) || nd->path[plen] != '/' ||
                strchr(nd->path + plen + 1, '/'))
                continue;
            snprintf(name, sizeof name, "obsm/%s", nd->path + plen + 1);
            zb__field *f;
            zb_status st = add_field(ds, tree, name, nd->path, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
            if (st == ZB_E_TYPE) continue;
            if (st != ZB_OK) return st;
            ZB_TRY(check_rows(f, ds->nphys, "X"));
        }
    }
    if (ds->opts.load_layers) {
        join(path, sizeof path, base, "layers");
        size_t plen = strlen(path);
        for (size_t i = 0; i < tree->n; i++) {
            const zb__tree_node *nd = &tree->nodes[i];
            if (strncmp(nd->path, path, plen) || nd->path[plen] != '/' ||
                strchr(nd->path + plen + 1, '/'))
                continue;
            snprintf(name, sizeof name, "layers/%s", nd->path + plen + 1);
            ZB_TRY(add_matrix(ds, tree, name, nd->path, false));
        }
    }
    return ZB_OK;
}

/* ---- atomic (nvalchemi) ------------------------------------------------------------------- */

/* FORMATS.md §8.2 key sets; anything else in core is atom-level. */
static const char *const EDGE_KEYS[] = {"shifts", "neighbor_list_shifts", "neighbor_list",
                                        "edge_embeddings", NULL};
static const char *const SYSTEM_KEYS[] = {
    "energy",           "stress", "virial", "dipole", "charge",
    "graph_embeddings", "cell",   "pbc",    "spin",   NULL};

static bool
in_set(const char *const *set, const char *name)
{
    for (; *set; set++)
        if (!strcmp(*set, name)) return true;
    return false;
}

/* FORMATS.md §8.1: the fields attribute; else, in core, the key sets and then "atom"; in custom,
 * "system". */
const char *
zb__atomistic_array_level(json_object *fields, const char *group, const char *name)
{
    const char *lv = zb__json_string(zb__json_get(fields, group), name);
    if (lv) return !strcmp(lv, "node") ? "atom" : lv;
    if (!strcmp(group, "custom")) return "system";
    if (in_set(EDGE_KEYS, name)) return "edge";
    if (in_set(SYSTEM_KEYS, name)) return "system";
    return "atom";
}

static bool
is_float(zb_dtype dt)
{
    return dt == ZB_DT_FLOAT16 || dt == ZB_DT_FLOAT32 || dt == ZB_DT_FLOAT64;
}

static bool
is_int(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_UINT64;
}

zb_status
zb__atomistic_check_fields_attr(const char *store, json_object *fields)
{
    if (!fields) return ZB_OK; /* nvalchemi reads a missing one as empty (FORMATS.md §8.1) */
    if (!json_object_is_type(fields, json_type_object))
        return zb__err(ZB_E_METADATA,
                       "%s: the root attribute 'fields' is not an object of "
                       "groups ({\"core\": {name: level}, \"custom\": {...}})",
                       store);
    json_object_object_foreach(fields, group, names)
    {
        if (!json_object_is_type(names, json_type_object))
            return zb__err(ZB_E_METADATA, "%s: fields.%s is not an object of name: level", store,
                           group);
        json_object_object_foreach(names, name, level)
        {
            const char *lv =
                json_object_is_type(level, json_type_string) ? json_object_get_string(level) : NULL;
            if (!lv || (strcmp(lv, "atom") && strcmp(lv, "node") && strcmp(lv, "edge") &&
                        strcmp(lv, "system")))
                return zb__err(ZB_E_METADATA,
                               "%s: fields.%s.%s is %s, not \"atom\", \"edge\" "
                               "or \"system\"",
                               store, group, name, json_object_to_json_string(level));
        }
    }
    return ZB_OK;
}

/* One required core array: present, at the atom level, of the right dtype kind and row shape. */
static zb_status
check_required(const char *store, json_object *fields, const char *name, const zb__array_meta *m,
               bool floats, int ndim)
{
    const char *want = floats ? "[atoms, 3] floats" : "[atoms] integers";
    if (!m)
        return zb__err(ZB_E_CORRUPT,
                       "%s: core/%s is missing: every AtomicData store holds "
                       "core/%s (%s)",
                       store, name, name, want);
    const char *lv = zb__atomistic_array_level(fields, "core", name);
    if (strcmp(lv, "atom"))
        return zb__err(ZB_E_CORRUPT,
                       "%s: core/%s: the fields attribute gives level '%s'; %s "
                       "are per atom",
                       store, name, lv, name);
    bool kind_ok = floats ? is_float(m->dtype) : is_int(m->dtype);
    bool shape_ok = m->ndim == ndim && (ndim == 1 || m->shape[1] == 3);
    if (kind_ok && shape_ok) return ZB_OK;
    char shape[96] = "[";
    for (int d = 0; d < m->ndim; d++) {
        size_t k = strlen(shape);
        snprintf(shape + k, sizeof shape - k, "%s%llu", d ? ", " : "",
                 (unsigned long long)m->shape[d]);
    }
    strncat(shape, "]", sizeof shape - strlen(shape) - 1);
    return zb__err(ZB_E_CORRUPT, "%s: core/%s is %s of shape %s; it must be %s", store, name,
                   zb_dtype_name(m->dtype), shape, want);
}

zb_status
zb__atomistic_check_required(const char *store, json_object *fields,
                             const zb__array_meta *positions, const zb__array_meta *atomic_numbers)
{
    ZB_TRY(check_required(store, fields, "positions", positions, true, 2));
    return check_required(store, fields, "atomic_numbers", atomic_numbers, false, 1);
}

/* Arrays may be longer than the committed samples need: an append writes data arrays before
 * the pointer arrays and the root num_samples (the commit point), so an interrupted one leaves
 * tails that readers ignore. Shorter is corruption (FORMATS.md §8.5, hazard 3). */
static zb_status
check_min_rows(const zb__field *f, uint64_t want, const char *what)
{
    if (f->arr->meta.shape[0] < want)
        return zb__err(ZB_E_CORRUPT, "%s: %llu rows, %s needs %llu", f->arr->path,
                       (unsigned long long)f->arr->meta.shape[0], what, (unsigned long long)want);
    return ZB_OK;
}

/* The physical sample count N, as nvalchemi's AtomicDataZarrReader reads it: the length of
 * meta/samples_mask (it never reads num_samples; docs/ERRORS.md, "Atomic stores"). The root
 * num_samples is zbatch's commit point: pointer and data arrays longer than it needs are an
 * uncommitted tail. A mask longer than num_samples is an append interrupted after its mask
 * was extended (zb_atomic_recover rolls num_samples forward to it) or a num_samples that lags:
 * both readers then take the mask's count, and every array must hold its samples. A mask
 * shorter than num_samples is corruption. `why` receives what N stands for, for messages. */
static zb_status
atomic_count(zb_dataset *ds, const zb__tree *tree, const zb__tree_node *root, const char *base,
             char *why, size_t why_cap)
{
    char path[4200];
    join(path, sizeof path, base, "meta/samples_mask");
    if (!zb__tree_find(tree, path))
        return zb__err(ZB_E_CORRUPT,
                       "%s: meta/samples_mask is missing: every AtomicData store "
                       "holds one (nvalchemi's reader refuses the store too)",
                       zb_dataset_name(ds));
    ZB_TRY(open_node(ds, tree, path, &ds->mask.arr));
    const zb__array_meta *mm = &ds->mask.arr->meta;
    if (mm->ndim != 1 || mm->dtype != ZB_DT_BOOL)
        return zb__err(ZB_E_CORRUPT, "%s: meta/samples_mask must be a 1-d bool array (%s, %d-d)",
                       zb_dataset_name(ds), zb_dtype_name(mm->dtype), mm->ndim);
    ds->nphys = mm->shape[0];
    snprintf(why, why_cap, "num_samples");
    json_object *ns = root ? zb__json_get(root->attrs, "num_samples") : NULL;
    uint64_t num_samples;
    if (ns && zb__json_u64(ns, "num_samples", &num_samples) == ZB_OK) {
        if (num_samples > ds->nphys)
            return zb__err(ZB_E_CORRUPT,
                           "%s: num_samples is %llu, meta/samples_mask holds %llu "
                           "(nvalchemi would read %llu samples)",
                           zb_dataset_name(ds), (unsigned long long)num_samples,
                           (unsigned long long)ds->nphys, (unsigned long long)ds->nphys);
        if (num_samples < ds->nphys)
            snprintf(why, why_cap,
                     "the %llu samples of meta/samples_mask (num_samples says "
                     "%llu)",
                     (unsigned long long)ds->nphys, (unsigned long long)num_samples);
    } else {
        zb_clear_error();
        snprintf(why, why_cap, "meta/samples_mask");
    }
    return ZB_OK;
}

zb_status
zb__layout_atomistic(zb_dataset *ds, const zb__tree *tree, const char *base)
{
    const zb__tree_node *root = zb__tree_find(tree, base);
    json_object *fields = root ? zb__json_get(root->attrs, "fields") : NULL;
    ZB_TRY(zb__atomistic_check_fields_attr(zb_dataset_name(ds), fields));
    char path[4200], why[200], need[300];
    int atoms, edges;
    join(path, sizeof path, base, "meta/atoms_ptr");
    ZB_TRY(add_segment(ds, tree, "atoms", path, &atoms));
    join(path, sizeof path, base, "meta/edges_ptr");
    ZB_TRY(add_segment(ds, tree, "edges", path, &edges));
    ZB_TRY(atomic_count(ds, tree, root, base, why, sizeof why));
    uint64_t n = ds->nphys + 1;
    for (int s = 0; s < 2; s++) {
        int k = s ? edges : atoms;
        if (ds->segs[k].ptr->meta.shape[0] < n)
            return zb__err(ZB_E_CORRUPT, "%s: meta/%s_ptr has %llu entries, %s needs %llu",
                           zb_dataset_name(ds), s ? "edges" : "atoms",
                           (unsigned long long)ds->segs[k].ptr->meta.shape[0], why,
                           (unsigned long long)n);
    }
    /* the ends of the pointer arrays bound the atom- and edge-level arrays */
    int64_t v_total = 0, e_total = 0, first = 0;
    zb_ctx *ctx = NULL;
    ZB_TRY(zb_ctx_new(&ctx));
    zb_status st = zb__segment_get(&ds->segs[atoms], ctx, n - 1, &v_total);
    if (st == ZB_OK) st = zb__segment_get(&ds->segs[edges], ctx, n - 1, &e_total);
    if (st == ZB_OK) st = zb__segment_get(&ds->segs[atoms], ctx, 0, &first);
    if (st == ZB_OK && first != 0)
        st = zb__err(ZB_E_CORRUPT, "%s: meta/atoms_ptr starts at %lld, not 0", zb_dataset_name(ds),
                     (long long)first);
    zb_ctx_free(ctx);
    if (st != ZB_OK) return st;

    const zb__array_meta *positions = NULL, *numbers = NULL;
    static const char *const groups[] = {"core", "custom"};
    for (int gi = 0; gi < 2; gi++) {
        char gpath[4200];
        join(gpath, sizeof gpath, base, groups[gi]);
        size_t plen = strlen(gpath);
        for (size_t i = 0; i < tree->n; i++) {
            const zb__tree_node *nd = &tree->nodes[i];
            if (!nd->is_array || strncmp(nd->path, gpath, plen) || nd->path[plen] != '/' ||
                strchr(nd->path + plen + 1, '/'))
                continue;
            const char *name = nd->path + plen + 1;
            const char *lv = zb__atomistic_array_level(fields, groups[gi], name);
            char fname[600];
            bool clash = false;
            for (size_t k = 0; k < ds->nfields; k++)
                clash = clash || !strcmp(ds->fields[k].name, name);
            snprintf(fname, sizeof fname, "%s%s", clash ? "custom/" : "", name);
            zb__field *f = NULL;
            if (!strcmp(lv, "atom")) {
                snprintf(need, sizeof need, "meta/atoms_ptr (for %s)", why);
                st = add_field(ds, tree, fname, nd->path, ZB_FIELD_RAGGED, atoms, -1, &f);
                if (st == ZB_OK) st = check_min_rows(f, (uint64_t)v_total, need);
            } else if (!strcmp(lv, "edge")) {
                snprintf(need, sizeof need, "meta/edges_ptr (for %s)", why);
                bool idx = !strcmp(name, "neighbor_list");
                st = add_field(ds, tree, fname, nd->path, idx ? ZB_FIELD_INDEX : ZB_FIELD_RAGGED,
                               edges, idx ? atoms : -1, &f);
                if (st == ZB_OK) {
                    f->global_index = idx; /* nvalchemi stores store-global atom indices */
                    st = check_min_rows(f, (uint64_t)e_total, need);
                }
            } else {
                st = add_field(ds, tree, fname, nd->path, ZB_FIELD_PER_SAMPLE, -1, -1, &f);
                if (st == ZB_OK) st = check_min_rows(f, ds->nphys, why);
            }
            if (st == ZB_E_TYPE) continue;
            if (st != ZB_OK) return st;
            if (gi == 0 && !strcmp(name, "positions")) positions = &f->arr->meta;
            if (gi == 0 && !strcmp(name, "atomic_numbers")) numbers = &f->arr->meta;
        }
    }
    return zb__atomistic_check_required(zb_dataset_name(ds), fields, positions, numbers);
}

/* ---- generic ------------------------------------------------------------------------------ */

zb_status
zb__layout_generic(zb_dataset *ds, const zb__tree *tree, const char *base)
{
    const zb__tree_node *root = zb__tree_find(tree, base);
    json_object *spec = root ? zb__json_get(root->attrs, "zbatch") : NULL;
    if (!spec || !json_object_is_type(spec, json_type_object))
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: not a dataset: no anndata, atomic or 'zbatch' attributes", ds->path);
    char path[4200];
    json_object *segs = zb__json_get(spec, "segments");
    if (segs && json_object_is_type(segs, json_type_object)) {
        json_object_object_foreach(segs, sname, sval)
        {
            if (!json_object_is_type(sval, json_type_string))
                return zb__err(ZB_E_METADATA, "%s: zbatch.segments.%s must be an array path",
                               zb_dataset_name(ds), sname);
            /* fields find their segment by name: a name cut to fit would never match */
            if (strlen(sname) >= sizeof ds->segs[0].name)
                return zb__err(ZB_E_UNSUPPORTED,
                               "%s: zbatch.segments.%s: segment names are "
                               "limited to %zu bytes",
                               zb_dataset_name(ds), sname, sizeof ds->segs[0].name - 1);
            int idx;
            join(path, sizeof path, base, json_object_get_string(sval));
            ZB_TRY(add_segment(ds, tree, sname, path, &idx));
        }
    }
    json_object *n = zb__json_get(spec, "num_samples");
    bool have_n = n && zb__json_u64(n, "zbatch.num_samples", &ds->nphys) == ZB_OK;
    if (!have_n && ds->nsegs) ds->nphys = ds->segs[0].ptr->meta.shape[0] - 1;
    json_object *flds = zb__json_get(spec, "fields");
    if (!flds || !json_object_is_type(flds, json_type_object))
        return zb__err(ZB_E_METADATA, "%s: zbatch.fields must be an object", zb_dataset_name(ds));
    json_object_object_foreach(flds, fname, fval)
    {
        const char *arr = zb__json_string(fval, "array");
        const char *kind = zb__json_string(fval, "kind");
        const char *segname = zb__json_string(fval, "segment");
        const char *target = zb__json_string(fval, "target");
        if (!arr || !kind)
            return zb__err(ZB_E_METADATA, "%s: zbatch.fields.%s needs 'array' and 'kind'",
                           zb_dataset_name(ds), fname);
        int seg = -1, tgt = -1;
        for (size_t i = 0; i < ds->nsegs; i++) {
            if (segname && !strcmp(ds->segs[i].name, segname)) seg = (int)i;
            if (target && !strcmp(ds->segs[i].name, target)) tgt = (int)i;
        }
        zb_field_kind k;
        if (!strcmp(kind, "per_sample")) {
            k = ZB_FIELD_PER_SAMPLE;
        } else if (!strcmp(kind, "ragged") || !strcmp(kind, "index")) {
            k = !strcmp(kind, "index") ? ZB_FIELD_INDEX : ZB_FIELD_RAGGED;
            if (seg < 0 || (k == ZB_FIELD_INDEX && tgt < 0))
                return zb__err(ZB_E_METADATA, "%s: zbatch.fields.%s names an unknown segment",
                               zb_dataset_name(ds), fname);
        } else {
            return zb__err(ZB_E_METADATA,
                           "%s: zbatch.fields.%s: kind '%s' is not per_sample, "
                           "ragged or index",
                           zb_dataset_name(ds), fname, kind);
        }
        join(path, sizeof path, base, arr);
        zb__field *f;
        zb_status st = add_field(ds, tree, fname, path, k, seg, tgt, &f);
        if (st == ZB_E_TYPE)
            return zb__err(ZB_E_TYPE, "%s: field %s: strings and 0-d arrays are not fields",
                           zb_dataset_name(ds), fname);
        if (st != ZB_OK) return st;
        json_object *gi = zb__json_get(fval, "global");
        f->global_index = gi && json_object_get_boolean(gi);
        if (k == ZB_FIELD_PER_SAMPLE) {
            if (!have_n && !ds->nsegs && ds->nfields == 1) ds->nphys = f->arr->meta.shape[0];
            ZB_TRY(check_rows(f, ds->nphys, "the dataset"));
        } else {
            int64_t end = 0;
            zb_ctx *ctx = NULL;
            ZB_TRY(zb_ctx_new(&ctx));
            st = zb__segment_get(&ds->segs[seg], ctx, ds->segs[seg].ptr->meta.shape[0] - 1, &end);
            zb_ctx_free(ctx);
            if (st != ZB_OK) return st;
            ZB_TRY(check_rows(f, (uint64_t)end, ds->segs[seg].name));
        }
    }
    for (size_t i = 0; i < ds->nsegs; i++)
        if (ds->segs[i].ptr->meta.shape[0] != ds->nphys + 1)
            return zb__err(ZB_E_CORRUPT, "%s: segment %s has %llu pointers for %llu samples",
                           zb_dataset_name(ds), ds->segs[i].name,
                           (unsigned long long)ds->segs[i].ptr->meta.shape[0],
                           (unsigned long long)ds->nphys);
    return ZB_OK;
}
