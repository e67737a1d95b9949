/* The anndata writer's dataframes, obs and var: row names, then one child per column, each
 * streamed (the first call naming a column creates it, later calls append). What each column
 * kind becomes is what anndata 0.12.19 writes (FORMATS.md §6, checked against its output):
 *
 *   numeric, bool      array {"encoding-type": "array", "encoding-version": "0.2.0"}
 *   str                string-array (0.2.0)
 *   categorical        group {"encoding-type": "categorical", "encoding-version": "0.2.0",
 *                      "ordered": b}: codes (array, pandas' smallest signed type) and
 *                      categories (string-array, or an array of the categories' numeric type)
 *   nullable           group {"encoding-type": "nullable-integer" | "nullable-boolean" |
 *                      "nullable-string-array", "encoding-version": "0.1.0"}: values (array or
 *                      string-array) and mask (bool array, true = missing); a missing value is
 *                      stored as 0 / false / "" (anndata's na_value), whatever the caller held
 *                      there. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "write/anndata_int.h"
#include "write/write.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static zb_status
check_axis(zb_anndata_axis axis, const char *fn)
{
    if (axis != ZB_ANNDATA_OBS && axis != ZB_ANNDATA_VAR)
        return zb__err(ZB_E_INVALID, "%s: axis %d is neither obs nor var", fn, (int)axis);
    return ZB_OK;
}

/* var columns cannot outgrow n_vars. */
static zb_status
check_room(const zb_anndata_writer *w, zb_anndata_axis axis, uint64_t have, uint64_t add,
           const char *what)
{
    if (axis == ZB_ANNDATA_VAR && (add > w->n_vars || have > w->n_vars - add))
        return zb__err(ZB_E_INVALID,
                       "var/%s: %" PRIu64 " + %" PRIu64 " values exceed n_vars %" PRIu64, what,
                       have, add, w->n_vars);
    return ZB_OK;
}

/* A column name is a key (zb__ad_check_name) and not the dataframe's `_index`. */
static zb_status
check_column_name(const char *frame_name, const char *name)
{
    ZB_TRY(zb__ad_check_name(frame_name, name));
    if (!strcmp(name, "_index"))
        return zb__err(ZB_E_INVALID, "%s: '%s' is not a valid column name", frame_name, name);
    return ZB_OK;
}

static bool
is_integer(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_UINT64;
}

static bool
is_signed(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_INT64;
}

static zb__ad_column *
find_column(zb__ad_frame *f, const char *name)
{
    for (size_t i = 0; i < f->ncols; i++)
        if (!strcmp(f->cols[i].name, name)) return &f->cols[i];
    return NULL;
}

static zb_status
new_column(zb__ad_frame *f, const char *name, zb__ad_col_kind kind, zb_dtype dtype,
           zb__ad_column **out)
{
    if (f->ncols == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        zb__ad_column *p = realloc(f->cols, cap * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "%s/%s: out of memory", f->name, name);
        f->cols = p;
        f->cap = cap;
    }
    zb__ad_column *c = &f->cols[f->ncols];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    if (!c->name) return zb__err(ZB_E_NOMEM, "%s/%s: out of memory", f->name, name);
    c->kind = kind;
    c->dtype = dtype;
    f->ncols++;
    *out = c;
    return ZB_OK;
}

/* Drops the last column (its creation failed half-way). */
static void
drop_last_column(zb__ad_frame *f)
{
    zb__ad_column *c = &f->cols[--f->ncols];
    zb_array_writer_close(c->array);
    zb_array_writer_close(c->mask);
    free(c->name);
}

void
zb__ad_free_frame(zb__ad_frame *f)
{
    zb_array_writer_close(f->index);
    for (size_t i = 0; i < f->ncols; i++) {
        zb_array_writer_close(f->cols[i].array);
        zb_array_writer_close(f->cols[i].mask);
        free(f->cols[i].name);
    }
    free(f->cols);
}

/* "categorical", "nullable int32", "int32", ... for messages. */
static void
describe_column(const zb__ad_column *c, char *buf, size_t cap)
{
    if (c->kind == ZB_AD_COL_CATEGORICAL)
        snprintf(buf, cap, "categorical");
    else
        snprintf(buf, cap, "%s%s", c->kind == ZB_AD_COL_NULLABLE ? "nullable " : "",
                 zb_dtype_name(c->dtype));
}

/* ---------------------------------------------------------------------------------------------
 * Names
 * ------------------------------------------------------------------------------------------- */

static zb_status
open_index(zb_anndata_writer *w, zb_anndata_axis axis)
{
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    if (f->index) return ZB_OK;
    char rel[64], attrs[128];
    snprintf(rel, sizeof rel, "%s/_index", f->name);
    zb__ad_encoding_attrs(attrs, sizeof attrs, "string-array", "0.2.0");
    return zb__ad_open_array(w, rel, w->codec, ZB_DT_STRING, 1, NULL, zb__ad_column_chunk(w, axis),
                             0, 1, attrs, &f->index);
}

zb_status
zb_anndata_writer_append_names(zb_anndata_writer *w, zb_anndata_axis axis, const char *data,
                               const uint64_t *offsets, uint64_t n)
{
    ZB_TRY(zb__ad_usable(w, "append_names"));
    ZB_TRY(check_axis(axis, "append_names"));
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    ZB_TRY(check_room(w, axis, f->n_index, n, "_index"));
    if (n == 0) return ZB_OK;
    char what[64];
    snprintf(what, sizeof what, "%s/_index", f->name);
    ZB_TRY(zb__ad_check_strings(what, data, offsets, n, NULL));
    ZB_TRY(zb__ad_broken(w, open_index(w, axis)));
    ZB_TRY(zb__ad_broken(w, zb_array_writer_append_strings(f->index, data, offsets, n)));
    f->n_index += n;
    return ZB_OK;
}

/* anndata's default row names for a frame written without them: "0", "1", ... */
static zb_status
write_default_index(zb_anndata_writer *w, zb_anndata_axis axis, uint64_t n)
{
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    ZB_TRY(open_index(w, axis));
    enum { BLOCK = 4096 };
    char *text = malloc(BLOCK * 21);
    uint64_t *offs = malloc((BLOCK + 1) * sizeof *offs);
    zb_status st = text && offs ? ZB_OK : zb__err(ZB_E_NOMEM, "%s/_index: out of memory", f->name);
    for (uint64_t i0 = 0; st == ZB_OK && i0 < n; i0 += BLOCK) {
        uint64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        uint64_t pos = 0;
        offs[0] = 0;
        for (uint64_t i = 0; i < m; i++) {
            pos += (uint64_t)snprintf(text + pos, 21, "%" PRIu64, i0 + i);
            offs[i + 1] = pos;
        }
        st = zb_array_writer_append_strings(f->index, text, offs, m);
    }
    free(text);
    free(offs);
    if (st == ZB_OK) f->n_index = n;
    return st;
}

zb_status
zb__ad_write_default_names(zb_anndata_writer *w)
{
    if (!w->frames[ZB_ANNDATA_OBS].index) ZB_TRY(write_default_index(w, ZB_ANNDATA_OBS, w->rows));
    if (!w->frames[ZB_ANNDATA_VAR].index) ZB_TRY(write_default_index(w, ZB_ANNDATA_VAR, w->n_vars));
    return ZB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Plain and nullable columns
 * ------------------------------------------------------------------------------------------- */

/* Opens the arrays of a new column `c` of kind numeric, string or nullable. */
static zb_status
open_column(zb_anndata_writer *w, zb_anndata_axis axis, zb__ad_column *c)
{
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    uint64_t chunk = zb__ad_column_chunk(w, axis);
    char rel[ZB_AD_REL_CAP], attrs[128];
    const char *values_enc = c->dtype == ZB_DT_STRING ? "string-array" : "array";
    if (c->kind != ZB_AD_COL_NULLABLE) {
        snprintf(rel, sizeof rel, "%s/%s", f->name, c->name);
        zb__ad_encoding_attrs(attrs, sizeof attrs, values_enc, "0.2.0");
        return zb__ad_open_array(w, rel, w->codec, c->dtype, 1, NULL, chunk, 0, 1, attrs,
                                 &c->array);
    }
    /* the group's document is written at commit (zb__ad_write_frame_groups) */
    snprintf(rel, sizeof rel, "%s/%s", f->name, c->name);
    ZB_TRY(zb__ad_add_node(w, rel, false));
    snprintf(rel, sizeof rel, "%s/%s/values", f->name, c->name);
    zb__ad_encoding_attrs(attrs, sizeof attrs, values_enc, "0.2.0");
    ZB_TRY(zb__ad_open_array(w, rel, w->codec, c->dtype, 1, NULL, chunk, 0, 1, attrs, &c->array));
    snprintf(rel, sizeof rel, "%s/%s/mask", f->name, c->name);
    zb__ad_encoding_attrs(attrs, sizeof attrs, "array", "0.2.0");
    return zb__ad_open_array(w, rel, w->codec, ZB_DT_BOOL, 1, NULL, chunk, 0, 1, attrs, &c->mask);
}

/* The column `name`, created as `kind`/`dtype` if it does not exist yet; ZB_E_TYPE when it
 * exists with another kind or dtype. */
static zb_status
get_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, zb__ad_col_kind kind,
           zb_dtype dtype, zb__ad_column **out)
{
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    zb__ad_column *c = find_column(f, name);
    if (c) {
        if (c->kind != kind || c->dtype != dtype) {
            char have[64];
            describe_column(c, have, sizeof have);
            return zb__err(ZB_E_TYPE, "%s/%s: the column exists as a %s column", f->name, name,
                           have);
        }
        *out = c;
        return ZB_OK;
    }
    ZB_TRY(new_column(f, name, kind, dtype, &c));
    zb_status st = open_column(w, axis, c);
    if (st != ZB_OK) {
        /* a node may be recorded already: the writer cannot commit consistently */
        drop_last_column(f);
        return zb__ad_broken(w, st);
    }
    *out = c;
    return ZB_OK;
}

/* Values beyond n_vars on the var axis, and the number already in the column. */
static zb_status
check_append(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, uint64_t n)
{
    zb__ad_column *c = find_column(zb__ad_frame_of(w, axis), name);
    return check_room(w, axis, c ? c->n : 0, n, name);
}

/* Bool bytes must be 0 or 1, except where mask says the value is missing. */
static zb_status
check_bools(const char *fname, const char *name, const uint8_t *b, const uint8_t *mask, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1 && !(mask && mask[i]))
            return zb__err(ZB_E_INVALID, "%s/%s: bool value %u at %" PRIu64 " is not 0 or 1", fname,
                           name, b[i], i);
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                zb_dtype dtype, const void *values, uint64_t n)
{
    ZB_TRY(zb__ad_usable(w, "append_column"));
    ZB_TRY(check_axis(axis, "append_column"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    if ((int)dtype < 0 || dtype >= ZB_DT_COUNT_ || dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID,
                       "%s/%s: a numeric column needs a fixed-size dtype "
                       "(append_string_column takes strings)",
                       fname, name ? name : "");
    ZB_TRY(check_column_name(fname, name));
    if (n && !values) return zb__err(ZB_E_INVALID, "%s/%s: null values", fname, name);
    if (dtype == ZB_DT_BOOL) ZB_TRY(check_bools(fname, name, values, NULL, n));
    ZB_TRY(check_append(w, axis, name, n));
    zb__ad_column *c;
    ZB_TRY(get_column(w, axis, name, ZB_AD_COL_NUMERIC, dtype, &c));
    if (n) ZB_TRY(zb__ad_broken(w, zb_array_writer_append(c->array, values, n)));
    c->n += n;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_string_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                       const char *data, const uint64_t *offsets, uint64_t n)
{
    ZB_TRY(zb__ad_usable(w, "append_string_column"));
    ZB_TRY(check_axis(axis, "append_string_column"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    ZB_TRY(check_column_name(fname, name));
    ZB_TRY(zb__ad_check_strings(name, data, offsets, n, NULL));
    ZB_TRY(check_append(w, axis, name, n));
    zb__ad_column *c;
    ZB_TRY(get_column(w, axis, name, ZB_AD_COL_STRING, ZB_DT_STRING, &c));
    if (n) ZB_TRY(zb__ad_broken(w, zb_array_writer_append_strings(c->array, data, offsets, n)));
    c->n += n;
    return ZB_OK;
}

/* A mask of n_mask bytes for n values: NULL with n_mask 0 (nothing missing), or n bytes, each
 * 0 or 1. */
static zb_status
check_mask(const char *fname, const char *name, const uint8_t *mask, uint64_t n_mask, uint64_t n)
{
    if (!mask) {
        if (n_mask)
            return zb__err(ZB_E_INVALID, "%s/%s: null mask of %" PRIu64 " entries", fname, name,
                           n_mask);
        return ZB_OK;
    }
    if (n_mask != n)
        return zb__err(ZB_E_INVALID,
                       "%s/%s: the mask has %" PRIu64 " entries for %" PRIu64 " values", fname,
                       name, n_mask, n);
    for (uint64_t i = 0; i < n; i++)
        if (mask[i] > 1)
            return zb__err(ZB_E_INVALID, "%s/%s: mask byte %u at %" PRIu64 " is not 0 or 1", fname,
                           name, mask[i], i);
    return ZB_OK;
}

static bool
any_set(const uint8_t *mask, uint64_t n)
{
    if (!mask) return false;
    for (uint64_t i = 0; i < n; i++)
        if (mask[i]) return true;
    return false;
}

/* Appends the mask of a block (zeros when it is NULL). */
static zb_status
append_mask(zb_anndata_writer *w, zb__ad_column *c, const uint8_t *mask, uint64_t n)
{
    if (mask) return zb_array_writer_append(c->mask, mask, n);
    memset(w->scratch, 0, ZB_AD_STEP);
    for (uint64_t i0 = 0; i0 < n; i0 += ZB_AD_STEP)
        ZB_TRY(
            zb_array_writer_append(c->mask, w->scratch, n - i0 < ZB_AD_STEP ? n - i0 : ZB_AD_STEP));
    return ZB_OK;
}

/* Appends values with the missing ones stored as 0 (anndata's na_value), ZB_AD_STEP at a
 * time through the scratch buffer; straight through when none is missing. */
static zb_status
append_masked_values(zb_anndata_writer *w, zb__ad_column *c, const void *values,
                     const uint8_t *mask, uint64_t n)
{
    if (!any_set(mask, n)) return zb_array_writer_append(c->array, values, n);
    size_t isz = zb_dtype_size(c->dtype);
    const uint8_t *src = values;
    uint8_t *dst = (uint8_t *)w->scratch;
    for (uint64_t i0 = 0; i0 < n; i0 += ZB_AD_STEP) {
        uint64_t m = n - i0 < ZB_AD_STEP ? n - i0 : ZB_AD_STEP;
        memcpy(dst, src + i0 * isz, (size_t)m * isz);
        for (uint64_t i = 0; i < m; i++)
            if (mask[i0 + i]) memset(dst + i * isz, 0, isz);
        ZB_TRY(zb_array_writer_append(c->array, dst, m));
    }
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_nullable_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                         const char *name, zb_dtype dtype, const void *values,
                                         uint64_t n, const uint8_t *mask, uint64_t n_mask)
{
    ZB_TRY(zb__ad_usable(w, "append_nullable_column"));
    ZB_TRY(check_axis(axis, "append_nullable_column"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    ZB_TRY(check_column_name(fname, name));
    /* anndata 0.12 writes pandas' IntegerArray and BooleanArray with a mask; it has no
     * nullable float encoding (a float column carries NaN instead) */
    if (!is_integer(dtype) && dtype != ZB_DT_BOOL)
        return zb__err(ZB_E_TYPE,
                       "%s/%s: a nullable column holds integers or bools, not %s "
                       "(append_nullable_string_column takes strings)",
                       fname, name,
                       (int)dtype >= 0 && dtype < ZB_DT_COUNT_ ? zb_dtype_name(dtype) : "?");
    if (n && !values) return zb__err(ZB_E_INVALID, "%s/%s: null values", fname, name);
    ZB_TRY(check_mask(fname, name, mask, n_mask, n));
    if (dtype == ZB_DT_BOOL) ZB_TRY(check_bools(fname, name, values, mask, n));
    ZB_TRY(check_append(w, axis, name, n));
    zb__ad_column *c;
    ZB_TRY(get_column(w, axis, name, ZB_AD_COL_NULLABLE, dtype, &c));
    if (n) {
        ZB_TRY(zb__ad_broken(w, append_masked_values(w, c, values, mask, n)));
        ZB_TRY(zb__ad_broken(w, append_mask(w, c, mask, n)));
    }
    c->n += n;
    return ZB_OK;
}

/* Appends strings with the missing ones stored as "" (anndata's na_value): runs of present
 * strings go straight through, runs of missing ones as empty strings. */
static zb_status
append_masked_strings(zb_anndata_writer *w, zb__ad_column *c, const char *data,
                      const uint64_t *offsets, const uint8_t *mask, uint64_t n)
{
    uint64_t *zeros = (uint64_t *)w->scratch;
    memset(zeros, 0, ZB_AD_STEP * sizeof *zeros);
    for (uint64_t i = 0; i < n;) {
        bool missing = mask && mask[i];
        uint64_t j = i + 1;
        while (j < n && (mask && mask[j]) == missing) j++;
        if (!missing) {
            ZB_TRY(zb_array_writer_append_strings(c->array, data, offsets + i, j - i));
        } else {
            for (uint64_t k = i; k < j; k += ZB_AD_STEP - 1) {
                uint64_t m = j - k < ZB_AD_STEP - 1 ? j - k : ZB_AD_STEP - 1;
                ZB_TRY(zb_array_writer_append_strings(c->array, "", zeros, m));
            }
        }
        i = j;
    }
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_nullable_string_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                                const char *name, const char *data,
                                                const uint64_t *offsets, uint64_t n,
                                                const uint8_t *mask, uint64_t n_mask)
{
    ZB_TRY(zb__ad_usable(w, "append_nullable_string_column"));
    ZB_TRY(check_axis(axis, "append_nullable_string_column"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    ZB_TRY(check_column_name(fname, name));
    ZB_TRY(check_mask(fname, name, mask, n_mask, n));
    ZB_TRY(zb__ad_check_strings(name, data, offsets, n, mask));
    ZB_TRY(check_append(w, axis, name, n));
    zb__ad_column *c;
    ZB_TRY(get_column(w, axis, name, ZB_AD_COL_NULLABLE, ZB_DT_STRING, &c));
    if (n) {
        ZB_TRY(zb__ad_broken(w, append_masked_strings(w, c, data, offsets, mask, n)));
        ZB_TRY(zb__ad_broken(w, append_mask(w, c, mask, n)));
    }
    c->n += n;
    return ZB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Categoricals
 * ------------------------------------------------------------------------------------------- */

/* One string category, for the distinctness check. */
typedef struct strref {
    const char *p;
    uint64_t len;
} strref;

static int
cmp_strref(const void *a, const void *b)
{
    const strref *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->len ? memcmp(x->p, y->p, x->len) : 0;
}

/* pandas gives codes the smallest signed type with max > n_categories
 * (pandas.core.dtypes.cast.coerce_indexer_dtype: int8 below 127, int16 below 32767, ...). */
static zb_dtype
codes_dtype_for(uint64_t n_categories)
{
    if (n_categories < INT8_MAX) return ZB_DT_INT8;
    if (n_categories < INT16_MAX) return ZB_DT_INT16;
    return ZB_DT_INT32;
}

static zb_status
check_distinct_strings(const char *fname, const char *name, const char *data,
                       const uint64_t *offsets, uint64_t n)
{
    if (n < 2) return ZB_OK;
    strref *v = malloc(n * sizeof *v);
    if (!v) return zb__err(ZB_E_NOMEM, "%s/%s: out of memory", fname, name);
    for (uint64_t i = 0; i < n; i++) {
        v[i].p = data + offsets[i]; /* offsets index data directly, whatever offsets[0] is */
        v[i].len = offsets[i + 1] - offsets[i];
    }
    qsort(v, n, sizeof *v, cmp_strref);
    zb_status st = ZB_OK;
    for (uint64_t i = 1; i < n && st == ZB_OK; i++)
        if (!cmp_strref(&v[i - 1], &v[i]))
            st = zb__err(ZB_E_INVALID, "%s/%s: category '%.*s' appears more than once", fname, name,
                         (int)(v[i].len > 64 ? 64 : v[i].len), v[i].p);
    free(v);
    return st;
}

/* A numeric category widened for comparison: signed integers as int64, unsigned integers and
 * bools as uint64, floats as double (float32 widens exactly). */
typedef union num {
    int64_t i;
    uint64_t u;
    double d;
} num;

static num
num_at(const void *values, zb_dtype dt, uint64_t i)
{
    num v = {0};
    switch (dt) {
    case ZB_DT_INT8:
        v.i = ((const int8_t *)values)[i];
        break;
    case ZB_DT_INT16:
        v.i = ((const int16_t *)values)[i];
        break;
    case ZB_DT_INT32:
        v.i = ((const int32_t *)values)[i];
        break;
    case ZB_DT_INT64:
        v.i = ((const int64_t *)values)[i];
        break;
    case ZB_DT_BOOL:
    case ZB_DT_UINT8:
        v.u = ((const uint8_t *)values)[i];
        break;
    case ZB_DT_UINT16:
        v.u = ((const uint16_t *)values)[i];
        break;
    case ZB_DT_UINT32:
        v.u = ((const uint32_t *)values)[i];
        break;
    case ZB_DT_UINT64:
        v.u = ((const uint64_t *)values)[i];
        break;
    case ZB_DT_FLOAT32:
        v.d = (double)((const float *)values)[i];
        break;
    default:
        v.d = ((const double *)values)[i];
        break;
    }
    return v;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = ((const num *)a)->i, y = ((const num *)b)->i;
    return (x > y) - (x < y);
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = ((const num *)a)->u, y = ((const num *)b)->u;
    return (x > y) - (x < y);
}

/* NaN was refused before sorting, so < and > order every pair; -0.0 equals 0.0, as in pandas
 * (pd.Index([0.0, -0.0]) is not unique). */
static int
cmp_f64(const void *a, const void *b)
{
    double x = ((const num *)a)->d, y = ((const num *)b)->d;
    return (x > y) - (x < y);
}

/* Numeric categories as pandas accepts them: bools 0 or 1, no NaN (pandas: "Categorical
 * categories cannot be null"), no two equal values ("must be unique"). */
static zb_status
check_distinct_values(const char *fname, const char *name, zb_dtype dt, const void *values,
                      uint64_t n)
{
    bool flt = dt == ZB_DT_FLOAT32 || dt == ZB_DT_FLOAT64;
    if (dt == ZB_DT_BOOL) ZB_TRY(check_bools(fname, name, values, NULL, n));
    if (flt)
        for (uint64_t i = 0; i < n; i++)
            if (isnan(num_at(values, dt, i).d))
                return zb__err(ZB_E_INVALID,
                               "%s/%s: category %" PRIu64 " is NaN (pandas refuses null "
                               "categories; code -1 marks a missing value)",
                               fname, name, i);
    if (n < 2) return ZB_OK;
    num *v = malloc(n * sizeof *v);
    if (!v) return zb__err(ZB_E_NOMEM, "%s/%s: out of memory", fname, name);
    for (uint64_t i = 0; i < n; i++) v[i] = num_at(values, dt, i);
    int (*cmp)(const void *, const void *) = flt ? cmp_f64 : is_signed(dt) ? cmp_i64 : cmp_u64;
    qsort(v, n, sizeof *v, cmp);
    zb_status st = ZB_OK;
    for (uint64_t i = 1; i < n && st == ZB_OK; i++) {
        if (cmp(&v[i - 1], &v[i])) continue;
        if (flt)
            st = zb__err(ZB_E_INVALID, "%s/%s: category %.17g appears more than once", fname, name,
                         v[i].d);
        else if (is_signed(dt))
            st = zb__err(ZB_E_INVALID, "%s/%s: category %" PRId64 " appears more than once", fname,
                         name, v[i].i);
        else
            st = zb__err(ZB_E_INVALID, "%s/%s: category %" PRIu64 " appears more than once", fname,
                         name, v[i].u);
    }
    free(v);
    return st;
}

/* The categories of a new categorical column: strings, or values of a numeric dtype. */
typedef struct cats {
    zb_dtype dtype; /* ZB_DT_STRING for strings */
    const char *data;
    const uint64_t *offsets;
    const void *values;
    uint64_t n;
} cats;

/* Writes the categories array of a categorical column whole and commits it. */
static zb_status
write_categories(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, const cats *k)
{
    char rel[ZB_AD_REL_CAP], attrs[128];
    snprintf(rel, sizeof rel, "%s/%s/categories", zb__ad_frame_of(w, axis)->name, name);
    zb__ad_encoding_attrs(attrs, sizeof attrs, k->dtype == ZB_DT_STRING ? "string-array" : "array",
                          "0.2.0");
    uint64_t chunk = w->column_chunk ? w->column_chunk : ZB_AD_DEFAULT_COLUMN_CHUNK;
    if (k->n && chunk > k->n) chunk = k->n;
    zb_array_writer *a = NULL;
    ZB_TRY(zb__ad_open_array(w, rel, w->codec, k->dtype, 1, NULL, chunk, 0, 1, attrs, &a));
    zb_status st = ZB_OK;
    if (k->n && k->dtype == ZB_DT_STRING)
        st = zb_array_writer_append_strings(a, k->data, k->offsets, k->n);
    else if (k->n)
        st = zb_array_writer_append(a, k->values, k->n);
    if (st == ZB_OK) st = zb_array_writer_commit(a);
    zb_array_writer_close(a);
    return st;
}

/* Creates categorical column `name` once its categories are checked. */
static zb_status
define_categorical(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, const cats *k,
                   bool ordered)
{
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    zb__ad_column *c;
    zb_dtype dt = codes_dtype_for(k->n);
    ZB_TRY(new_column(f, name, ZB_AD_COL_CATEGORICAL, dt, &c));
    c->n_categories = k->n;
    c->ordered = ordered;
    char rel[ZB_AD_REL_CAP], attrs[128];
    snprintf(rel, sizeof rel, "%s/%s", f->name, name);
    /* from the categories' put on, a failure has touched the store: the writer is broken */
    zb_status st = write_categories(w, axis, name, k);
    if (st == ZB_OK) st = zb__ad_add_node(w, rel, false);
    if (st == ZB_OK) {
        snprintf(rel, sizeof rel, "%s/%s/codes", f->name, name);
        zb__ad_encoding_attrs(attrs, sizeof attrs, "array", "0.2.0");
        st = zb__ad_open_array(w, rel, w->codec, dt, 1, NULL, zb__ad_column_chunk(w, axis), 0, 1,
                               attrs, &c->array);
    }
    if (st != ZB_OK) {
        drop_last_column(f);
        return zb__ad_broken(w, st);
    }
    return ZB_OK;
}

/* What both define calls check first: usable, axis, a new valid name, a count in range. */
static zb_status
check_define(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, uint64_t n_categories,
             const char *fn)
{
    ZB_TRY(zb__ad_usable(w, fn));
    ZB_TRY(check_axis(axis, fn));
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    ZB_TRY(check_column_name(f->name, name));
    if (find_column(f, name))
        return zb__err(ZB_E_INVALID, "%s/%s: a column of that name exists", f->name, name);
    if (n_categories >= INT32_MAX)
        return zb__err(ZB_E_INVALID, "%s/%s: %" PRIu64 " categories are too many", f->name, name,
                       n_categories);
    return ZB_OK;
}

zb_status
zb_anndata_writer_define_categorical(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                     const char *categories, const uint64_t *offsets,
                                     uint64_t n_categories, bool ordered)
{
    ZB_TRY(check_define(w, axis, name, n_categories, "define_categorical"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    ZB_TRY(zb__ad_check_strings(name, categories, offsets, n_categories, NULL));
    ZB_TRY(check_distinct_strings(fname, name, categories, offsets, n_categories));
    cats k = {ZB_DT_STRING, categories, offsets, NULL, n_categories};
    return define_categorical(w, axis, name, &k, ordered);
}

zb_status
zb_anndata_writer_define_categorical_values(zb_anndata_writer *w, zb_anndata_axis axis,
                                            const char *name, zb_dtype dtype,
                                            const void *categories, uint64_t n_categories,
                                            bool ordered)
{
    ZB_TRY(check_define(w, axis, name, n_categories, "define_categorical_values"));
    const char *fname = zb__ad_frame_of(w, axis)->name;
    /* pandas has no float16 index ("float16 indexes are not supported") */
    if (!is_integer(dtype) && dtype != ZB_DT_BOOL && dtype != ZB_DT_FLOAT32 &&
        dtype != ZB_DT_FLOAT64)
        return zb__err(ZB_E_TYPE,
                       "%s/%s: categories of dtype %s are not supported (integers, bools, float32 "
                       "and float64 are; define_categorical takes strings)",
                       fname, name,
                       (int)dtype >= 0 && dtype < ZB_DT_COUNT_ ? zb_dtype_name(dtype) : "?");
    if (n_categories && !categories)
        return zb__err(ZB_E_INVALID, "%s/%s: null categories", fname, name);
    ZB_TRY(check_distinct_values(fname, name, dtype, categories, n_categories));
    cats k = {dtype, NULL, NULL, categories, n_categories};
    return define_categorical(w, axis, name, &k, ordered);
}

/* Code i of a block of `dtype` as int64. */
static int64_t
code_at(const void *codes, zb_dtype dtype, uint64_t i)
{
    switch (dtype) {
    case ZB_DT_INT8:
        return ((const int8_t *)codes)[i];
    case ZB_DT_INT16:
        return ((const int16_t *)codes)[i];
    case ZB_DT_INT32:
        return ((const int32_t *)codes)[i];
    default:
        return ((const int64_t *)codes)[i];
    }
}

zb_status
zb_anndata_writer_append_codes(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                               zb_dtype codes_dtype, const void *codes, uint64_t n)
{
    ZB_TRY(zb__ad_usable(w, "append_codes"));
    ZB_TRY(check_axis(axis, "append_codes"));
    zb__ad_frame *f = zb__ad_frame_of(w, axis);
    if (!name) return zb__err(ZB_E_INVALID, "append_codes: null name");
    zb__ad_column *c = find_column(f, name);
    if (!c) return zb__err(ZB_E_NOTFOUND, "%s/%s: no such categorical column", f->name, name);
    if (c->kind != ZB_AD_COL_CATEGORICAL)
        return zb__err(ZB_E_TYPE, "%s/%s: not a categorical column", f->name, name);
    if (codes_dtype != ZB_DT_INT8 && codes_dtype != ZB_DT_INT16 && codes_dtype != ZB_DT_INT32 &&
        codes_dtype != ZB_DT_INT64)
        return zb__err(ZB_E_TYPE, "%s/%s: codes must be int8, int16, int32 or int64", f->name,
                       name);
    ZB_TRY(check_room(w, axis, c->n, n, name));
    if (n && !codes) return zb__err(ZB_E_INVALID, "%s/%s: null codes", f->name, name);
    int64_t ncat = (int64_t)c->n_categories;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = code_at(codes, codes_dtype, i);
        if (v < -1 || v >= ncat)
            return zb__err(ZB_E_INVALID,
                           "%s/%s: code %" PRId64 " at %" PRIu64 " is outside [-1, %" PRId64 ")",
                           f->name, name, v, i, ncat);
    }
    if (codes_dtype == c->dtype) {
        if (n) ZB_TRY(zb__ad_broken(w, zb_array_writer_append(c->array, codes, n)));
    } else {
        /* narrow (or widen) to the stored type, ZB_AD_STEP codes at a time; values are in
         * range */
        for (uint64_t i0 = 0; i0 < n; i0 += ZB_AD_STEP) {
            uint64_t m = n - i0 < ZB_AD_STEP ? n - i0 : ZB_AD_STEP;
            void *dst = w->scratch;
            for (uint64_t i = 0; i < m; i++) {
                int64_t v = code_at(codes, codes_dtype, i0 + i);
                switch (c->dtype) {
                case ZB_DT_INT8:
                    ((int8_t *)dst)[i] = (int8_t)v;
                    break;
                case ZB_DT_INT16:
                    ((int16_t *)dst)[i] = (int16_t)v;
                    break;
                default:
                    ((int32_t *)dst)[i] = (int32_t)v;
                    break;
                }
            }
            ZB_TRY(zb__ad_broken(w, zb_array_writer_append(c->array, dst, m)));
        }
    }
    c->n += n;
    return ZB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Commit
 * ------------------------------------------------------------------------------------------- */

zb_status
zb__ad_check_frames(const zb_anndata_writer *w)
{
    for (int a = 0; a < 2; a++) {
        const zb__ad_frame *f = &w->frames[a];
        uint64_t want = a == ZB_ANNDATA_OBS ? w->rows : w->n_vars;
        const char *what = a == ZB_ANNDATA_OBS ? "n_obs (rows of X)" : "n_vars";
        if (f->index && f->n_index != want)
            return zb__err(ZB_E_INVALID, "%s/_index: %" PRIu64 " names, %s is %" PRIu64, f->name,
                           f->n_index, what, want);
        for (size_t i = 0; i < f->ncols; i++)
            if (f->cols[i].n != want)
                return zb__err(ZB_E_INVALID, "%s/%s: %" PRIu64 " values, %s is %" PRIu64, f->name,
                               f->cols[i].name, f->cols[i].n, what, want);
    }
    return ZB_OK;
}

zb_status
zb__ad_commit_frames(zb_anndata_writer *w)
{
    for (int a = 0; a < 2; a++) {
        zb__ad_frame *f = &w->frames[a];
        ZB_TRY(zb_array_writer_commit(f->index));
        for (size_t i = 0; i < f->ncols; i++) {
            ZB_TRY(zb_array_writer_commit(f->cols[i].array));
            if (f->cols[i].mask) ZB_TRY(zb_array_writer_commit(f->cols[i].mask));
        }
    }
    return ZB_OK;
}

/* {"_index": "_index", "column-order": [...], "encoding-type": "dataframe", ...} */
static zb_status
write_dataframe_group(zb_anndata_writer *w, const zb__ad_frame *f)
{
    int ok = 1;
    json_object *attrs = json_object_new_object();
    zb__jw_add(attrs, "_index", json_object_new_string("_index"), &ok);
    json_object *order = zb__jw_add(attrs, "column-order", json_object_new_array(), &ok);
    for (size_t i = 0; i < f->ncols && ok; i++)
        zb__jw_push(order, json_object_new_string(f->cols[i].name), &ok);
    zb__jw_add(attrs, "encoding-type", json_object_new_string("dataframe"), &ok);
    zb__jw_add(attrs, "encoding-version", json_object_new_string("0.2.0"), &ok);
    zb_status st = ok ? zb__ad_write_group(w, f->name, zb__json_text(attrs))
                      : zb__err(ZB_E_NOMEM, "%s: out of memory", f->name);
    json_object_put(attrs);
    return st;
}

/* The attributes of a categorical or nullable column's group. */
static void
column_group_attrs(const zb__ad_column *c, char *buf, size_t cap)
{
    if (c->kind == ZB_AD_COL_CATEGORICAL) {
        snprintf(buf, cap,
                 "{\"encoding-type\": \"categorical\", \"encoding-version\": \"0.2.0\", "
                 "\"ordered\": %s}",
                 c->ordered ? "true" : "false");
        return;
    }
    const char *type = c->dtype == ZB_DT_STRING ? "nullable-string-array"
                       : c->dtype == ZB_DT_BOOL ? "nullable-boolean"
                                                : "nullable-integer";
    zb__ad_encoding_attrs(buf, cap, type, "0.1.0");
}

zb_status
zb__ad_write_frame_groups(zb_anndata_writer *w)
{
    for (int a = 0; a < 2; a++) {
        const zb__ad_frame *f = &w->frames[a];
        for (size_t i = 0; i < f->ncols; i++) {
            const zb__ad_column *c = &f->cols[i];
            if (c->kind != ZB_AD_COL_CATEGORICAL && c->kind != ZB_AD_COL_NULLABLE) continue;
            char rel[ZB_AD_REL_CAP], key[ZB_AD_KEY_CAP], attrs[256];
            snprintf(rel, sizeof rel, "%s/%s", f->name, c->name);
            column_group_attrs(c, attrs, sizeof attrs);
            ZB_TRY(zb__ad_key_of(w, key, sizeof key, rel));
            /* the node was recorded when the column was created */
            ZB_TRY(zb__write_group(w->store, key, w->zarr_format, attrs));
        }
        ZB_TRY(write_dataframe_group(w, f));
    }
    return ZB_OK;
}
