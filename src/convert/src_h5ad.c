/* The .h5ad input of a conversion (source.h): an AnnData file as anndata 0.7 to 0.12 writes it,
 * read with libhdf5 through h5ad_io.c (one process-wide lock). This file opens the file and its
 * obs dataframe and reads obs columns and names; h5ad_matrix.c serves X, raw/X and layers.
 *
 * A dataframe (obs, var, raw/var) is a group whose attribute `_index` names the child holding
 * its row names and whose `column-order` lists its columns (FORMATS.md §6). Its columns:
 * - anndata >= 0.8 (dataframe encoding-version 0.2.0): every column carries an encoding-type:
 *   "array" (numbers or h5py's bool enum), "string-array" (variable-length UTF-8), a
 *   "categorical" group (codes + categories, `ordered`), or a "nullable-integer",
 *   "nullable-boolean" or "nullable-string-array" group (values + mask, 1 = missing).
 * - anndata 0.7 (dataframe 0.1.0): columns are bare datasets; a categorical column is its codes,
 *   whose attribute `categories` is an object reference to obs/__categories/NAME, which carries
 *   `ordered`.
 * - before 0.7, obs was one compound dataset: refused (ZB_E_UNSUPPORTED).
 * The index is read like a column (strings; a categorical or numeric index as text). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/h5ad.h"
#include "convert/h5ad_io.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/status.h"

#define KEY_MAX 1024
#define UNKNOWN_ROWS UINT64_MAX

/* A dataframe column (or its index) and the datasets behind it. */
typedef struct h5_col {
    zb__col_info *info;
    zb__h5_ds values; /* numbers; a categorical's codes; a string array's strings */
    zb__h5_ds mask;   /* the nullable kinds */
    uint64_t n_categories;
} h5_col;

typedef struct h5ad_src {
    zb__src base;
    hid_t file;
    h5_col *cols; /* [base.c.n_columns] */
    zb__col_info index_info;
    h5_col index; /* obs names */
} h5ad_src;

static bool
is_integer(zb_dtype t)
{
    return t >= ZB_DT_INT8 && t <= ZB_DT_UINT64;
}

/* h5py's bool is an enum of 0 and 1; anything else stored there still reads as true. */
static void
bools_normalize(uint8_t *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) v[i] = v[i] != 0;
}

static void
col_close(h5_col *c)
{
    zb__h5_ds_close(&c->values);
    zb__h5_ds_close(&c->mask);
}

/* Frees what an index's zb__col_info holds (obs columns' are freed by zb__src_common_free). */
static void
index_info_free(zb__col_info *info)
{
    if (info->categories) {
        zb_strings_free((zb_strings *)info->categories);
        free((zb_strings *)info->categories);
    }
    free((void *)info->category_values);
    info->categories = NULL;
    info->category_values = NULL;
}

/* ---- opening columns (under the lock) -------------------------------------------------------- */

static zb_status
child_key(char *key, const char *parent, const char *name, const char *path)
{
    if (snprintf(key, KEY_MAX, "%s/%s", parent, name) >= KEY_MAX)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s/%s: the name is too long", path, parent, name);
    return ZB_OK;
}

/* Reads a categorical's categories (strings, numbers or bools) into c->info. */
static zb_status
categories_load(h5_col *c, const zb__h5_ds *cats)
{
    zb__col_info *info = c->info;
    uint64_t n = cats->dims[0], bytes;
    if (n > INT32_MAX) /* codes are handed out as int32 */
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu categories", cats->path, cats->key,
                       (unsigned long long)n);
    c->n_categories = n;
    if (cats->dtype == ZB_DT_STRING) {
        zb_strings *s = calloc(1, sizeof *s);
        if (!s) return zb__err(ZB_E_NOMEM, "%s: %s", cats->path, cats->key);
        zb_status st = zb__h5_ds_read_strings(cats, 0, n, s);
        if (st != ZB_OK) {
            free(s);
            return st;
        }
        info->categories = s;
        info->dtype = ZB_DT_STRING;
        return ZB_OK;
    }
    if (!zb__mul_u64(n, cats->item, &bytes) || bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: %s: %llu categories", cats->path, cats->key,
                       (unsigned long long)n);
    void *v = malloc(bytes ? (size_t)bytes : 1);
    if (!v) return zb__err(ZB_E_NOMEM, "%s: %s", cats->path, cats->key);
    zb_status st = zb__h5_ds_read(cats, 0, n, v);
    if (st == ZB_OK && cats->dtype == ZB_DT_BOOL) bools_normalize(v, n);
    if (st == ZB_OK) st = zb__src_set_numeric_categories(info, cats->dtype, v, n);
    free(v);
    return st;
}

/* The categories dataset `cats` (taken over) of the categorical whose codes are c->values;
 * `holder` carries the `ordered` attribute. */
static zb_status
categorical_finish(h5_col *c, zb__h5_ds *cats, hid_t holder)
{
    zb_status st = ZB_OK;
    c->info->kind = ZB_COL_CATEGORICAL;
    if (!is_integer(c->values.dtype))
        st = zb__err(ZB_E_CORRUPT, "%s: %s: codes of type %s, not integers", c->values.path,
                     c->values.key, zb_dtype_name(c->values.dtype));
    if (st == ZB_OK && cats->rank != 1)
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s is %d-d", cats->path, cats->key, cats->rank);
    if (st == ZB_OK && zb__h5_attr_exists(holder, "ordered"))
        st = zb__h5_attr_bool(holder, "ordered", cats->path, cats->key, &c->info->ordered);
    if (st == ZB_OK) st = categories_load(c, cats);
    zb__h5_ds_close(cats);
    return st;
}

static zb_status
categorical_open(h5_col *c, hid_t g, const char *path, const char *key)
{
    zb__h5_ds cats;
    ZB_TRY(zb__h5_part_open(g, key, "codes", path, &c->values));
    ZB_TRY(zb__h5_part_open(g, key, "categories", path, &cats));
    return categorical_finish(c, &cats, g);
}

static zb_status
nullable_open(h5_col *c, hid_t g, const char *path, const char *key, const char *encoding)
{
    ZB_TRY(zb__h5_part_open(g, key, "values", path, &c->values));
    ZB_TRY(zb__h5_part_open(g, key, "mask", path, &c->mask));
    zb_dtype t = c->values.dtype;
    bool fits = !strcmp(encoding, "nullable-integer")   ? is_integer(t)
                : !strcmp(encoding, "nullable-boolean") ? t == ZB_DT_BOOL
                                                        : t == ZB_DT_STRING;
    if (!fits)
        return zb__err(ZB_E_CORRUPT, "%s: %s: a %s holding %s values", path, key, encoding,
                       zb_dtype_name(t));
    if (c->mask.dtype != ZB_DT_BOOL && !is_integer(c->mask.dtype))
        return zb__err(ZB_E_CORRUPT, "%s: %s: a mask of %s", path, key,
                       zb_dtype_name(c->mask.dtype));
    c->info->kind = ZB_COL_NULLABLE;
    c->info->dtype = t;
    return ZB_OK;
}

/* A column stored as a group: categorical or nullable. */
static zb_status
group_col_open(h5_col *c, hid_t g, const char *path, const char *key)
{
    char *enc = NULL;
    zb_status st = zb__h5_attr_text(g, "encoding-type", path, key, &enc);
    if (st == ZB_E_NOTFOUND)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is a group without an encoding-type", path, key);
    if (st != ZB_OK) return st;
    if (!strcmp(enc, "categorical"))
        st = categorical_open(c, g, path, key);
    else if (!strcmp(enc, "nullable-integer") || !strcmp(enc, "nullable-boolean") ||
             !strcmp(enc, "nullable-string-array"))
        st = nullable_open(c, g, path, key, enc);
    else
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: encoding-type '%s' is not a dataframe column", path,
                     key, enc);
    free(enc);
    return st;
}

/* anndata 0.7's categorical: `obj` (the codes) points at its categories. Takes obj over. */
static zb_status
legacy_categorical_open(h5_col *c, hid_t obj, hid_t frame, const char *path, const char *key)
{
    hid_t target = H5I_INVALID_HID;
    zb_status st = zb__h5_attr_deref(obj, "categories", frame, path, key, &target);
    if (st != ZB_OK) {
        H5Oclose(obj);
        return st;
    }
    st = zb__h5_ds_from_id(obj, path, key, &c->values);
    if (st == ZB_OK && H5Iget_type(target) != H5I_DATASET)
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: its categories are not an array", path, key);
    if (st != ZB_OK) {
        H5Oclose(target);
        return st;
    }
    /* messages name the categories by their path in the file ("obs/__categories/NAME") */
    char cat_key[KEY_MAX] = "";
    ssize_t len = H5Iget_name(target, cat_key, sizeof cat_key);
    const char *shown = len > 0 && cat_key[0] == '/' ? cat_key + 1 : key;
    zb__h5_ds cats;
    ZB_TRY(zb__h5_ds_from_id(target, path, shown, &cats));
    return categorical_finish(c, &cats, cats.id);
}

/* A column stored as a dataset (takes obj over). */
static zb_status
array_col_open(h5_col *c, hid_t obj, hid_t frame, const char *path, const char *key)
{
    if (zb__h5_attr_exists(obj, "categories"))
        return legacy_categorical_open(c, obj, frame, path, key);
    char *enc = NULL;
    zb_status st = ZB_OK;
    if (zb__h5_attr_exists(obj, "encoding-type")) {
        st = zb__h5_attr_text(obj, "encoding-type", path, key, &enc);
        if (st == ZB_OK && strcmp(enc, "array") && strcmp(enc, "string-array"))
            st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: encoding-type '%s' is not a dataframe column",
                         path, key, enc);
        free(enc);
    }
    if (st != ZB_OK) {
        H5Oclose(obj);
        return st;
    }
    ZB_TRY(zb__h5_ds_from_id(obj, path, key, &c->values));
    if (c->values.rank != 1)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is %d-d, not a column", path, key, c->values.rank);
    c->info->kind = c->values.dtype == ZB_DT_STRING ? ZB_COL_STRING : ZB_COL_NUMERIC;
    c->info->dtype = c->values.dtype;
    return ZB_OK;
}

/* Under the lock: the column `name` of the dataframe `frame` (named frame_key) into c, whose
 * info is c->info. Its length must be *n_rows, or sets it when that is UNKNOWN_ROWS. */
static zb_status
col_open(hid_t frame, const char *frame_key, const char *name, const char *path, uint64_t *n_rows,
         h5_col *c)
{
    char key[KEY_MAX];
    ZB_TRY(child_key(key, frame_key, name, path));
    if (!zb__h5_exists(frame, name))
        return zb__err(ZB_E_CORRUPT, "%s: %s is named by %s's attributes but does not exist", path,
                       key, frame_key);
    hid_t obj = H5Oopen(frame, name, H5P_DEFAULT);
    if (obj < 0) return zb__h5_fail(ZB_E_CORRUPT, path, key, "opening it");
    zb_status st;
    if (H5Iget_type(obj) == H5I_GROUP) {
        st = group_col_open(c, obj, path, key);
        H5Oclose(obj);
    } else {
        st = array_col_open(c, obj, frame, path, key);
    }
    if (st != ZB_OK) return st;
    uint64_t n = c->values.dims[0];
    if (c->info->kind == ZB_COL_NULLABLE && c->mask.dims[0] != n)
        return zb__err(ZB_E_CORRUPT, "%s: %s: %llu values but %llu mask entries", path, key,
                       (unsigned long long)n, (unsigned long long)c->mask.dims[0]);
    if (*n_rows == UNKNOWN_ROWS) *n_rows = n;
    if (n != *n_rows)
        return zb__err(ZB_E_CORRUPT, "%s: %s holds %llu rows, the dataframe %llu", path, key,
                       (unsigned long long)n, (unsigned long long)*n_rows);
    return ZB_OK;
}

/* Under the lock: opens the dataframe group `frame_key` and its index column into c; *n_rows as
 * for col_open. *frame is the open group (close with H5Oclose). */
static zb_status
frame_open(hid_t file, const char *frame_key, const char *path, uint64_t *n_rows, hid_t *frame,
           h5_col *index)
{
    *frame = H5I_INVALID_HID;
    if (!zb__h5_exists(file, frame_key))
        return zb__err(ZB_E_UNSUPPORTED, "%s: no %s dataframe (not an AnnData file?)", path,
                       frame_key);
    hid_t g = H5Oopen(file, frame_key, H5P_DEFAULT);
    if (g < 0) return zb__h5_fail(ZB_E_CORRUPT, path, frame_key, "opening it");
    *frame = g;
    if (H5Iget_type(g) != H5I_GROUP)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: %s is a structured array, the dataframe form of anndata before 0.7",
                       path, frame_key);
    char *idx = NULL;
    zb_status st = zb__h5_attr_text(g, "_index", path, frame_key, &idx);
    if (st == ZB_OK) st = col_open(g, frame_key, idx, path, n_rows, index);
    if (st == ZB_OK && index->info->kind == ZB_COL_NULLABLE)
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s/%s: a nullable index", path, frame_key, idx);
    free(idx);
    return st;
}

/* ---- reading --------------------------------------------------------------------------------- */

/* Codes of rows [start, stop) as int32, each checked against the number of categories. */
static zb_status
codes_read(const h5_col *c, uint64_t start, uint64_t stop, int32_t *out)
{
    const zb__h5_ds *d = &c->values;
    uint64_t n = stop - start;
    /* 4-byte codes are read in place and checked there; others through a scratch buffer */
    void *raw = d->item == sizeof(int32_t) ? (void *)out : malloc(n ? (size_t)(n * d->item) : 1);
    if (!raw)
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu codes", d->path, d->key, (unsigned long long)n);
    zb_status st = zb__h5_ds_read(d, start, stop, raw);
    for (uint64_t i = 0; st == ZB_OK && i < n; i++) {
        int64_t v;
        bool ok = zb__load_int((const uint8_t *)raw + i * d->item, d->dtype, &v);
        if (!ok || v < -1 || v >= (int64_t)c->n_categories) {
            st = zb__err(ZB_E_CORRUPT, "%s: %s: row %llu: code %lld is outside [-1, %llu)", d->path,
                         d->key, (unsigned long long)(start + i), (long long)v,
                         (unsigned long long)c->n_categories);
            break;
        }
        out[i] = (int32_t)v;
    }
    if (raw != out) free(raw);
    return st;
}

/* Shapes the block for `n` rows of one kind: values of value_bytes each (0: none, freed so that
 * values is NULL), a mask or none. */
static zb_status
block_shape(zb__col_block *b, uint64_t n, size_t value_bytes, bool mask)
{
    if (!value_bytes) {
        free(b->values);
        b->values = NULL;
        b->cap_values_bytes = 0;
    }
    if (!mask) {
        free(b->mask);
        b->mask = NULL;
        b->cap_mask = 0;
    }
    zb_strings_free(&b->strings);
    b->cap_strings = b->cap_string_bytes = 0;
    /* room for one value at least, so that values is never NULL for the kinds that have them */
    ZB_TRY(zb__col_block_reserve(b, n ? n : 1, value_bytes, mask));
    b->n = n;
    return ZB_OK;
}

/* Strings of rows [start, stop) into b->strings. */
static zb_status
strings_into(const zb__h5_ds *d, uint64_t start, uint64_t stop, zb__col_block *b)
{
    ZB_TRY(zb__h5_ds_read_strings(d, start, stop, &b->strings));
    b->cap_strings = b->strings.n;
    b->cap_string_bytes = b->strings.offsets[b->strings.n];
    return ZB_OK;
}

/* The strings under the mask become empty (source.h: "a missing one is empty"). */
static void
strings_blank_masked(zb_strings *s, const uint8_t *mask)
{
    uint64_t at = 0, a = 0; /* a: where string i starts before the move */
    for (uint64_t i = 0; i < s->n; i++) {
        uint64_t e = s->offsets[i + 1];
        if (!mask[i]) {
            if (at != a) memmove(s->data + at, s->data + a, (size_t)(e - a));
            at += e - a;
        }
        s->offsets[i + 1] = at;
        a = e;
    }
}

static zb_status
nullable_read(const h5_col *c, uint64_t start, uint64_t stop, zb__col_block *out)
{
    uint64_t n = stop - start;
    bool strings = c->values.dtype == ZB_DT_STRING;
    ZB_TRY(block_shape(out, n, strings ? 0 : c->values.item, true));
    if (strings)
        ZB_TRY(strings_into(&c->values, start, stop, out));
    else
        ZB_TRY(zb__h5_ds_read(&c->values, start, stop, out->values));
    if (!strings && c->values.dtype == ZB_DT_BOOL) bools_normalize(out->values, n);
    if (c->mask.item == 1) {
        ZB_TRY(zb__h5_ds_read(&c->mask, start, stop, out->mask));
    } else {
        void *raw = malloc(n ? (size_t)(n * c->mask.item) : 1);
        if (!raw) return zb__err(ZB_E_NOMEM, "%s: %s", c->mask.path, c->mask.key);
        zb_status st = zb__h5_ds_read(&c->mask, start, stop, raw);
        for (uint64_t i = 0; st == ZB_OK && i < n; i++) {
            int64_t v;
            zb__load_int((const uint8_t *)raw + i * c->mask.item, c->mask.dtype, &v);
            out->mask[i] = v != 0;
        }
        free(raw);
        ZB_TRY(st);
    }
    bools_normalize(out->mask, n);
    if (strings) strings_blank_masked(&out->strings, out->mask);
    return ZB_OK;
}

static zb_status
col_read(const h5_col *c, uint64_t start, uint64_t stop, zb__col_block *out)
{
    uint64_t n = stop - start;
    switch (c->info->kind) {
    case ZB_COL_NUMERIC:
        ZB_TRY(block_shape(out, n, c->values.item, false));
        ZB_TRY(zb__h5_ds_read(&c->values, start, stop, out->values));
        if (c->values.dtype == ZB_DT_BOOL) bools_normalize(out->values, n);
        return ZB_OK;
    case ZB_COL_CATEGORICAL:
        ZB_TRY(block_shape(out, n, sizeof(int32_t), false));
        return codes_read(c, start, stop, out->values);
    case ZB_COL_STRING:
        ZB_TRY(block_shape(out, n, 0, false));
        return strings_into(&c->values, start, stop, out);
    case ZB_COL_NULLABLE:
        return nullable_read(c, start, stop, out);
    }
    return zb__err(ZB_E_INVALID, "column kind %d", (int)c->info->kind);
}

/* Rows [start, stop) of an index as text: strings as they are, a categorical's labels (a missing
 * one empty), numbers as Python's str() writes them. */
static zb_status
col_strings(const h5_col *c, uint64_t start, uint64_t stop, zb_strings *out)
{
    if (c->info->kind == ZB_COL_STRING) return zb__h5_ds_read_strings(&c->values, start, stop, out);
    memset(out, 0, sizeof *out);
    zb__col_block b = {0};
    zb_status st = col_read(c, start, stop, &b);
    uint64_t n = stop - start, total = 0;
    const zb_strings *cats = c->info->categories;
    bool labels = c->info->kind == ZB_COL_CATEGORICAL;
    const int32_t *codes = b.values;
    if (st == ZB_OK) {
        for (uint64_t i = 0; labels && i < n; i++)
            if (codes[i] >= 0) total += cats->offsets[codes[i] + 1] - cats->offsets[codes[i]];
        if (!labels) total = n * 40; /* zb__src_category_text writes under 40 bytes */
        out->offsets = malloc((size_t)(n + 1) * sizeof *out->offsets);
        out->data = malloc(total ? (size_t)total : 1);
        if (!out->offsets || !out->data)
            st = zb__err(ZB_E_NOMEM, "%s: %s: %llu names", c->values.path, c->values.key,
                         (unsigned long long)n);
    }
    uint64_t at = 0;
    for (uint64_t i = 0; st == ZB_OK && i < n; i++) {
        out->offsets[i] = at;
        if (labels && codes[i] >= 0) {
            uint64_t a = cats->offsets[codes[i]], e = cats->offsets[codes[i] + 1];
            memcpy(out->data + at, cats->data + a, (size_t)(e - a));
            at += e - a;
        } else if (!labels) {
            const uint8_t *v = (const uint8_t *)b.values + i * c->values.item;
            at += zb__src_category_text(c->values.dtype, v, out->data + at, 40);
        }
    }
    if (st == ZB_OK) {
        out->offsets[n] = at;
        out->n = n;
    } else {
        zb_strings_free(out);
    }
    zb__col_block_free(&b);
    return st;
}

/* ---- the source methods ---------------------------------------------------------------------- */

static zb_status
range_check(const h5ad_src *s, uint64_t start, uint64_t stop)
{
    if (start > stop || stop > s->base.c.n_obs)
        return zb__err(ZB_E_RANGE, "%s: obs rows [%llu, %llu) of %llu", s->base.c.path,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)s->base.c.n_obs);
    return ZB_OK;
}

static zb_status
h5ad_read_column(zb__src *src, size_t column, uint64_t start, uint64_t stop, zb__col_block *out)
{
    h5ad_src *s = (h5ad_src *)src;
    if (column >= src->c.n_columns)
        return zb__err(ZB_E_RANGE, "%s: obs column %zu of %zu", src->c.path, column,
                       src->c.n_columns);
    ZB_TRY(range_check(s, start, stop));
    return col_read(&s->cols[column], start, stop, out);
}

static zb_status
h5ad_read_obs_names(zb__src *src, uint64_t start, uint64_t stop, zb_strings *out)
{
    h5ad_src *s = (h5ad_src *)src;
    memset(out, 0, sizeof *out);
    ZB_TRY(range_check(s, start, stop));
    return col_strings(&s->index, start, stop, out);
}

static zb_status
h5ad_matrix_open(zb__src *src, const char *key, zb__src_matrix **out)
{
    h5ad_src *s = (h5ad_src *)src;
    return zb__h5ad_matrix_open(s->file, src->c.path, src->c.n_obs, key, out);
}

static void
h5ad_close(zb__src *src)
{
    h5ad_src *s = (h5ad_src *)src;
    for (size_t i = 0; s->cols && i < src->c.n_columns; i++) col_close(&s->cols[i]);
    free(s->cols);
    col_close(&s->index);
    index_info_free(&s->index_info);
    if (s->file > 0) {
        zb__h5_lock();
        H5Fclose(s->file);
        zb__h5_unlock();
    }
    zb__src_common_free(&src->c);
    free(s);
}

static const zb__src_methods h5ad_methods = {
    .matrix_open = h5ad_matrix_open,
    .read_column = h5ad_read_column,
    .read_obs_names = h5ad_read_obs_names,
    .close = h5ad_close,
};

/* Under the lock: obs, its index and every column in column-order. */
static zb_status
obs_open(h5ad_src *s)
{
    zb__src_common *c = &s->base.c;
    hid_t obs = H5I_INVALID_HID;
    char **names = NULL;
    size_t n_names = 0;
    uint64_t n_obs = UNKNOWN_ROWS;
    zb_status st = frame_open(s->file, "obs", c->path, &n_obs, &obs, &s->index);
    if (st == ZB_OK) st = zb__h5_attr_texts(obs, "column-order", c->path, "obs", &names, &n_names);
    if (st == ZB_OK) {
        c->n_obs = n_obs;
        c->columns = calloc(n_names ? n_names : 1, sizeof *c->columns);
        s->cols = calloc(n_names ? n_names : 1, sizeof *s->cols);
        if (!c->columns || !s->cols)
            st = zb__err(ZB_E_NOMEM, "%s: %zu obs columns", c->path, n_names);
    }
    for (size_t i = 0; st == ZB_OK && i < n_names; i++) {
        size_t k = c->n_columns++;
        c->columns[k].name = names[i];
        names[i] = NULL;
        s->cols[k].info = &c->columns[k];
        st = col_open(obs, "obs", c->columns[k].name, c->path, &n_obs, &s->cols[k]);
        if (st != ZB_E_UNSUPPORTED) continue;
        /* a column of an encoding this reader lacks: left out, the others kept */
        st = zb__src_skip_column(c, c->columns[k].name);
        col_close(&s->cols[k]);
        memset(&s->cols[k], 0, sizeof s->cols[k]);
        zb__col_info_free(&c->columns[k]);
        c->n_columns--;
    }
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    if (obs > 0) H5Oclose(obs);
    return st;
}

zb_status
zb__src_open_h5ad(const char *path, zb__src **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    h5ad_src *s = calloc(1, sizeof *s);
    if (!s) return zb__err(ZB_E_NOMEM, "%s: opening", path);
    s->base.methods = &h5ad_methods;
    s->base.c.format = "h5ad";
    s->file = H5I_INVALID_HID;
    s->index_info.name = "_index";
    s->index.info = &s->index_info;
    s->base.c.path = strdup(path);
    if (!s->base.c.path) {
        free(s);
        return zb__err(ZB_E_NOMEM, "%s: opening", path);
    }
    zb__h5_lock();
    zb_status st = zb__h5_file_open(path, &s->file);
    if (st == ZB_OK) st = obs_open(s);
    zb__h5_unlock();
    if (st != ZB_OK) {
        h5ad_close(&s->base);
        return st;
    }
    *out = &s->base;
    return ZB_OK;
}

zb_status
zb__h5ad_frame_names(hid_t file, const char *path, const char *frame, uint64_t n, zb_strings *out)
{
    memset(out, 0, sizeof *out);
    zb__col_info info = {.name = "_index"};
    h5_col index = {.info = &info};
    hid_t g = H5I_INVALID_HID;
    uint64_t rows = n;
    zb__h5_lock();
    zb_status st = frame_open(file, frame, path, &rows, &g, &index);
    if (st == ZB_OK) st = col_strings(&index, 0, n, out);
    col_close(&index);
    if (g > 0) H5Oclose(g);
    zb__h5_unlock();
    index_info_free(&info);
    return st;
}
