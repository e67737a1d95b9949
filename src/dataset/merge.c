/* Collections whose children must agree (zb_dataset_open of a collection, zb_dataset_concat):
 * the same fields and obs columns, the same var names (or, with reorder_vars, the same genes in
 * another order, remapped as batches are built), and one category table per categorical field
 * with each child's codes remapped to it. A code that meant 'B' in one store and 'NK' in
 * another must not reach a batch as one number (issue 19); the remapping is a per-child table
 * that the reader applies as it copies a field's values (reader.c, convert_rows), so a child
 * whose table is the collection's costs nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/status.h"
#include "util/strmap.h"

/* ---- fields and columns ---------------------------------------------------------------------- */

static bool
is_signed_int(zb_dtype t)
{
    return t == ZB_DT_INT8 || t == ZB_DT_INT16 || t == ZB_DT_INT32 || t == ZB_DT_INT64;
}

static bool
is_int(zb_dtype t)
{
    return is_signed_int(t) || t == ZB_DT_UINT8 || t == ZB_DT_UINT16 || t == ZB_DT_UINT32 ||
           t == ZB_DT_UINT64;
}

/* What differs between field a (of the first child) and b, or NULL. Categorical codes may
 * differ in width: the collection delivers them in one (zb__dataset_field_dtype); other values
 * are compared as delivered (a uint8 X/data delivered as float32 joins a float32 one). */
static const char *
field_difference(const zb__field *a, const zb__field *b)
{
    if (strcmp(a->name, b->name)) return "name";
    if (a->kind != b->kind) return "kind";
    if (a->categorical != b->categorical) return "encoding (categorical in one only)";
    if (a->categorical ? a->dtype != b->dtype && !(is_int(a->dtype) && is_int(b->dtype))
                       : a->out_dtype != b->out_dtype)
        return "dtype";
    if (a->ndim != b->ndim ||
        memcmp(a->row_shape, b->row_shape, sizeof(uint64_t) * (size_t)a->ndim))
        return "row shape";
    if ((a->mask == NULL) != (b->mask == NULL)) return "nullability";
    return NULL;
}

static bool
is_string_kind(zb_column_kind k)
{
    return k == ZB_COLUMN_STRINGS || k == ZB_COLUMN_NULLABLE_STRINGS;
}

static const char *
column_kind_name(zb_column_kind k)
{
    switch (k) {
    case ZB_COLUMN_VALUES:
        return "values";
    case ZB_COLUMN_CATEGORICAL:
        return "categorical";
    case ZB_COLUMN_NULLABLE:
        return "nullable";
    case ZB_COLUMN_STRINGS:
        return "strings";
    case ZB_COLUMN_NULLABLE_STRINGS:
        return "nullable strings";
    }
    return "?";
}

/* Every child offers the first child's fields (names, kinds, dtypes, row shapes), segments and
 * obs columns, and the same n_vars. */
static zb_status
check_same_fields(const zb_dataset *ds, zb_status code)
{
    const zb_dataset *c0 = ds->children[0];
    const char *n0 = zb_dataset_name(c0);
    for (size_t c = 1; c < ds->nchildren; c++) {
        const zb_dataset *ch = ds->children[c];
        const char *nc = zb_dataset_name(ch);
        if (strcmp(ch->layout, c0->layout))
            return zb__err(code, "%s and %s: layouts differ (%s and %s)", n0, nc, c0->layout,
                           ch->layout);
        if (ch->n_vars != c0->n_vars)
            return zb__err(code, "%s and %s: n_vars differ (%llu and %llu)", n0, nc,
                           (unsigned long long)c0->n_vars, (unsigned long long)ch->n_vars);
        size_t nf = c0->nfields < ch->nfields ? c0->nfields : ch->nfields;
        for (size_t f = 0; f < nf; f++) {
            const zb__field *a = &c0->fields[f], *b = &ch->fields[f];
            const char *what = field_difference(a, b);
            if (what)
                return zb__err(code, "%s and %s: field %zu differs in %s: %s (%s%s) and %s (%s%s)",
                               n0, nc, f, what, a->name, a->categorical ? "codes " : "",
                               zb_dtype_name(a->out_dtype), b->name, b->categorical ? "codes " : "",
                               zb_dtype_name(b->out_dtype));
        }
        if (ch->nfields != c0->nfields) {
            const zb_dataset *more = ch->nfields > c0->nfields ? ch : c0;
            return zb__err(code, "%s and %s: only %s has field %s", n0, nc, zb_dataset_name(more),
                           more->fields[nf].name);
        }
        bool same = ch->nsegs == c0->nsegs && ch->ncols == c0->ncols;
        for (size_t s = 0; same && s < c0->nsegs; s++)
            same = !strcmp(c0->segs[s].name, ch->segs[s].name);
        if (!same)
            return zb__err(code,
                           "%s and %s: their segments or obs columns differ (%zu and %zu "
                           "columns)",
                           n0, nc, c0->ncols, ch->ncols);
        for (size_t k = 0; k < c0->ncols; k++) {
            const zb__column *a = &c0->cols[k], *b = &ch->cols[k];
            if (strcmp(a->name, b->name))
                return zb__err(code, "%s and %s: obs column %zu is %s in one and %s in the other",
                               n0, nc, k, a->name, b->name);
            /* a string column with missing values in one child only is nullable in the
             * collection (zb_dataset_column); each child's own flags are read */
            if (a->kind != b->kind && !(is_string_kind(a->kind) && is_string_kind(b->kind)))
                return zb__err(code,
                               "%s and %s: obs column %s is encoded differently (%s and "
                               "%s)",
                               n0, nc, a->name, column_kind_name(a->kind),
                               column_kind_name(b->kind));
        }
    }
    return ZB_OK;
}

/* ---- var names ------------------------------------------------------------------------------- */

static bool
string_at_equal(const zb_strings *a, uint64_t i, const zb_strings *b, uint64_t j)
{
    uint64_t la = a->offsets[i + 1] - a->offsets[i], lb = b->offsets[j + 1] - b->offsets[j];
    return la == lb && !memcmp(a->data + a->offsets[i], b->data + b->offsets[j], (size_t)la);
}

/* String i of s for a message: at most 200 bytes. */
#define STR_ARG(s, i)                                                                              \
    (int)((s)->offsets[(i) + 1] - (s)->offsets[i] > 200                                            \
              ? 200                                                                                \
              : (s)->offsets[(i) + 1] - (s)->offsets[i]),                                          \
        (s)->data + (s)->offsets[i]

/* Child c's genes, which differ from the first child's at position `at`, in the first child's
 * order: ds->vars.lut[c] (reorder_vars), or the refusal naming both. */
static zb_status
reorder_child(zb_dataset *ds, size_t c, const zb__strmap *m0, const zb_strings *v0,
              const zb_strings *vc, uint64_t at, zb_status code)
{
    const char *n0 = zb_dataset_name(ds->children[0]), *nc = zb_dataset_name(ds->children[c]);
    if (!ds->opts.reorder_vars)
        return zb__err(code,
                       "%s and %s: var names differ at position %llu ('%.*s' and '%.*s'); "
                       "reorder_vars delivers the second in the first's gene order",
                       n0, nc, (unsigned long long)at, STR_ARG(v0, at), STR_ARG(vc, at));
    int64_t *lut = malloc((size_t)(vc->n ? vc->n : 1) * sizeof *lut);
    uint8_t *seen = calloc((size_t)vc->n + 1, 1);
    zb_status st = lut && seen ? ZB_OK : zb__err(ZB_E_NOMEM, "%s: out of memory", nc);
    for (uint64_t j = 0; j < vc->n && st == ZB_OK; j++) {
        int64_t k = zb__strmap_find(m0, vc->data + vc->offsets[j],
                                    (size_t)(vc->offsets[j + 1] - vc->offsets[j]));
        if (k < 0)
            st = zb__err(code, "%s: gene '%.*s' (position %llu) is not among the var names of %s",
                         nc, STR_ARG(vc, j), (unsigned long long)j, n0);
        else if (seen[k])
            st = zb__err(code, "%s: gene '%.*s' appears twice (the second at position %llu)", nc,
                         STR_ARG(vc, j), (unsigned long long)j);
        else {
            seen[k] = 1;
            lut[j] = k;
        }
    }
    free(seen);
    if (st != ZB_OK) {
        free(lut);
        return st;
    }
    ds->vars.lut[c] = lut;
    return ZB_OK;
}

/* Children of an anndata collection name the same genes in the same order (FORMATS.md §7.1),
 * or, with reorder_vars, in any order. */
static zb_status
check_vars(zb_dataset *ds, zb_status code)
{
    zb_dataset *c0 = ds->children[0];
    if (!c0->var_index) return ZB_OK; /* not anndata, or no var index: nothing to compare */
    const zb_strings *v0 = NULL;
    ZB_TRY(zb_dataset_var_names(c0, &v0));
    zb__strmap m0 = {0};
    zb_status st = ZB_OK;
    for (size_t c = 1; c < ds->nchildren && st == ZB_OK; c++) {
        zb_dataset *ch = ds->children[c];
        const zb_strings *vc = NULL;
        if (!ch->var_index) {
            st = zb__err(code, "%s and %s: only the first has var names", zb_dataset_name(c0),
                         zb_dataset_name(ch));
            break;
        }
        st = zb_dataset_var_names(ch, &vc);
        uint64_t at = 0;
        while (st == ZB_OK && at < v0->n && string_at_equal(v0, at, vc, at)) at++;
        if (st != ZB_OK || at == v0->n) continue;
        if (!ds->vars.lut) {
            uint64_t dup = UINT64_MAX;
            ds->vars.lut = calloc(ds->nchildren, sizeof *ds->vars.lut);
            st = ds->vars.lut ? zb__strmap_build(&m0, v0, &dup)
                              : zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
            if (st == ZB_OK && dup != UINT64_MAX && ds->opts.reorder_vars)
                st = zb__err(code,
                             "%s: gene '%.*s' appears twice (the second at position %llu): "
                             "genes cannot be matched by name",
                             zb_dataset_name(c0), STR_ARG(v0, dup), (unsigned long long)dup);
            if (st != ZB_OK) break;
        }
        st = reorder_child(ds, c, &m0, v0, vc, at, code);
    }
    zb__strmap_free(&m0);
    return st;
}

/* ---- category tables ------------------------------------------------------------------------- */

static bool
tables_equal(const zb__cattab *a, const zb__cattab *b)
{
    if (a->dtype != b->dtype || a->n != b->n) return false;
    if (a->dtype != ZB_DT_STRING)
        return !memcmp(a->values, b->values, (size_t)a->n * zb_dtype_size(a->dtype));
    const zb_strings *x = &a->strings, *y = &b->strings;
    return !memcmp(x->offsets, y->offsets, (size_t)(x->n + 1) * sizeof *x->offsets) &&
           !memcmp(x->data, y->data, (size_t)x->offsets[x->n]);
}

/* One label of any table, for sorting and searching. */
typedef struct label {
    const uint8_t *p;
    uint64_t len; /* strings */
} label;

/* Labels by value: strings by UTF-8 bytes (code point order), then length; numbers by value
 * (NaN last); booleans false first. */
static int
cmp_label(const void *x, const void *y, void *arg)
{
    const label *a = x, *b = y;
    zb_dtype dt = *(const zb_dtype *)arg;
#define ZB_CMP(T)                                                                                  \
    {                                                                                              \
        T u, v;                                                                                    \
        memcpy(&u, a->p, sizeof u);                                                                \
        memcpy(&v, b->p, sizeof v);                                                                \
        if (u != u || v != v) return (u != u) - (v != v); /* NaN last (floats only) */             \
        return u < v ? -1 : u > v;                                                                 \
    }
    switch (dt) {
    case ZB_DT_STRING: {
        uint64_t n = a->len < b->len ? a->len : b->len;
        int r = memcmp(a->p, b->p, (size_t)n);
        return r ? r : (a->len > b->len) - (a->len < b->len);
    }
    case ZB_DT_BOOL:
    case ZB_DT_UINT8:
        ZB_CMP(uint8_t)
    case ZB_DT_INT8:
        ZB_CMP(int8_t)
    case ZB_DT_INT16:
        ZB_CMP(int16_t)
    case ZB_DT_UINT16:
        ZB_CMP(uint16_t)
    case ZB_DT_INT32:
        ZB_CMP(int32_t)
    case ZB_DT_UINT32:
        ZB_CMP(uint32_t)
    case ZB_DT_INT64:
        ZB_CMP(int64_t)
    case ZB_DT_UINT64:
        ZB_CMP(uint64_t)
    case ZB_DT_FLOAT32:
        ZB_CMP(float)
    case ZB_DT_FLOAT64:
        ZB_CMP(double)
    default:
        return memcmp(a->p, b->p, zb_dtype_size(dt)); /* float16: by bits */
    }
#undef ZB_CMP
}

static label
label_at(const zb__cattab *t, uint64_t i)
{
    if (t->dtype == ZB_DT_STRING)
        return (label){(const uint8_t *)t->strings.data + t->strings.offsets[i],
                       t->strings.offsets[i + 1] - t->strings.offsets[i]};
    return (label){t->values + i * zb_dtype_size(t->dtype), 0};
}

/* The smallest signed integer type holding codes -1 .. n-1. */
static zb_dtype
codes_dtype(uint64_t n)
{
    return n <= 128           ? ZB_DT_INT8
           : n <= 32768       ? ZB_DT_INT16
           : n <= 2147483648u ? ZB_DT_INT32
                              : ZB_DT_INT64;
}

static zb_dtype
wider(zb_dtype a, zb_dtype b)
{
    /* signed codes: the wider of two signed types, unsigned ones as the next signed width */
    size_t sa = zb_dtype_size(a) * (is_signed_int(a) ? 1 : 2);
    size_t sb = zb_dtype_size(b) * (is_signed_int(b) ? 1 : 2);
    size_t s = sa > sb ? sa : sb;
    return s <= 1 ? ZB_DT_INT8 : s <= 2 ? ZB_DT_INT16 : s <= 4 ? ZB_DT_INT32 : ZB_DT_INT64;
}

/* The sorted union of every child's table of field f into `out` (anndata.concat's table for
 * categoricals that differ). */
static zb_status
union_tables(zb_dataset *ds, size_t f, zb__cattab *out)
{
    zb_dtype dt = ds->children[0]->fields[f].cats.dtype;
    uint64_t total = 0;
    for (size_t c = 0; c < ds->nchildren; c++) total += ds->children[c]->fields[f].cats.n;
    label *all = malloc((size_t)(total ? total : 1) * sizeof *all);
    if (!all) return zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
    uint64_t n = 0;
    for (size_t c = 0; c < ds->nchildren; c++) {
        const zb__cattab *t = &ds->children[c]->fields[f].cats;
        for (uint64_t i = 0; i < t->n; i++) all[n++] = label_at(t, i);
    }
    qsort_r(all, (size_t)n, sizeof *all, cmp_label, &dt);
    uint64_t m = 0, bytes = 0;
    for (uint64_t i = 0; i < n; i++)
        if (i == 0 || cmp_label(&all[i - 1], &all[i], &dt)) {
            all[m++] = all[i];
            bytes += all[i].len;
        }
    size_t isz = zb_dtype_size(dt);
    zb_status st = ZB_OK;
    out->dtype = dt;
    out->n = m;
    if (dt == ZB_DT_STRING) {
        out->strings.offsets = malloc((size_t)(m + 1) * sizeof(uint64_t));
        out->strings.data = malloc((size_t)bytes + 1);
        if (!out->strings.offsets || !out->strings.data) {
            st = zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
        } else {
            out->strings.n = m;
            out->strings.offsets[0] = 0;
            for (uint64_t i = 0; i < m; i++) {
                memcpy(out->strings.data + out->strings.offsets[i], all[i].p, (size_t)all[i].len);
                out->strings.offsets[i + 1] = out->strings.offsets[i] + all[i].len;
            }
        }
    } else {
        out->values = malloc((size_t)(m ? m : 1) * isz);
        if (!out->values) st = zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
        for (uint64_t i = 0; st == ZB_OK && i < m; i++)
            memcpy(out->values + i * isz, all[i].p, isz);
    }
    free(all);
    if (st != ZB_OK) zb__cattab_free(out);
    return st;
}

/* The position of `l` among the n sorted labels, or -1. */
static int64_t
find_label(const label *l, const label *sorted, uint64_t n, zb_dtype *dt)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = cmp_label(&sorted[mid], l, dt);
        if (r == 0) return (int64_t)mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Child c's table of field f as positions in the collection's table `to` (sorted). */
static zb_status
table_lut(zb_dataset *ds, size_t f, size_t c, const zb__cattab *to, int64_t **lut)
{
    const zb__cattab *t = &ds->children[c]->fields[f].cats;
    zb_dtype dt = to->dtype;
    label *sorted = malloc((size_t)(to->n ? to->n : 1) * sizeof *sorted);
    *lut = malloc((size_t)(t->n ? t->n : 1) * sizeof **lut);
    if (!sorted || !*lut) {
        free(sorted);
        free(*lut);
        *lut = NULL;
        return zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
    }
    for (uint64_t i = 0; i < to->n; i++) sorted[i] = label_at(to, i);
    bool identity = t->n == to->n;
    for (uint64_t i = 0; i < t->n; i++) {
        label l = label_at(t, i);
        (*lut)[i] = find_label(&l, sorted, to->n, &dt); /* every label is in the union */
        identity = identity && (*lut)[i] == (int64_t)i;
    }
    free(sorted);
    if (identity) { /* this child's table is the collection's: codes go through unchanged */
        free(*lut);
        *lut = NULL;
    }
    return ZB_OK;
}

/* Field f of a collection: its dtype, and for a categorical one table with each child's codes
 * mapped onto it. */
static zb_status
merge_field(zb_dataset *ds, size_t f, zb_status code)
{
    zb__fieldmap *m = &ds->maps[f];
    zb_dataset *c0 = ds->children[0];
    const zb__field *f0 = &c0->fields[f];
    m->dtype = f0->out_dtype;
    if (!f0->categorical) return ZB_OK;
    bool same = true, ordered = true;
    for (size_t c = 0; c < ds->nchildren; c++) {
        zb_dataset *ch = ds->children[c];
        zb__field *fc = &ch->fields[f];
        ZB_TRY(zb__field_load_categories(ch, fc));
        ordered = ordered && fc->cats.ordered;
        if (fc->cats.dtype != f0->cats.dtype)
            return zb__err(code, "%s and %s: the categories of %s are %s and %s",
                           zb_dataset_name(c0), zb_dataset_name(ch), f0->name,
                           zb_dtype_name(f0->cats.dtype), zb_dtype_name(fc->cats.dtype));
        same = same && tables_equal(&f0->cats, &fc->cats);
        m->dtype = wider(m->dtype, fc->dtype);
    }
    if (same) {
        m->table = &f0->cats;
    } else {
        ZB_TRY(union_tables(ds, f, &m->cats));
        m->cats.ordered = false; /* an order of labels some children lack is no order */
        m->table = &m->cats;
        ordered = false;
        m->dtype = wider(m->dtype, codes_dtype(m->cats.n));
    }
    m->ordered = ordered;
    m->lut = calloc(ds->nchildren, sizeof *m->lut);
    m->nlut = calloc(ds->nchildren, sizeof *m->nlut);
    if (!m->lut || !m->nlut) return zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
    for (size_t c = 0; c < ds->nchildren && !same; c++) {
        ZB_TRY(table_lut(ds, f, c, m->table, &m->lut[c]));
        m->nlut[c] = ds->children[c]->fields[f].cats.n;
    }
    return ZB_OK;
}

zb_status
zb__collection_merge(zb_dataset *ds, zb_status code)
{
    ZB_TRY(check_same_fields(ds, code));
    ZB_TRY(check_vars(ds, code));
    size_t nf = ds->children[0]->nfields;
    ds->maps = calloc(nf + 1, sizeof *ds->maps);
    if (!ds->maps) return zb__err(ZB_E_NOMEM, "%s: out of memory", zb_dataset_name(ds));
    for (size_t f = 0; f < nf; f++) ZB_TRY(merge_field(ds, f, code));
    return ZB_OK;
}

zb_dtype
zb__dataset_field_dtype(const zb_dataset *ds, size_t f)
{
    if (ds->maps) return ds->maps[f].dtype;
    return (ds->nchildren ? ds->children[0] : ds)->fields[f].out_dtype;
}

/* ---- applying the tables --------------------------------------------------------------------- */

/* Stores v as an integer of dtype dt (its low bytes: the value fits, signed or not). */
static inline void
store_int(void *p, zb_dtype dt, int64_t v)
{
    switch (zb_dtype_size(dt)) {
    case 1:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case 2: {
        uint16_t t = (uint16_t)v;
        memcpy(p, &t, 2);
    } break;
    case 4: {
        uint32_t t = (uint32_t)v;
        memcpy(p, &t, 4);
    } break;
    default:
        memcpy(p, &v, 8);
        break;
    }
}

zb_status
zb__codes_convert(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n,
                  const int64_t *lut, uint64_t nlut, const char *what)
{
    size_t si = zb_dtype_size(from), di = zb_dtype_size(to);
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (uint64_t i = 0; i < n; i++, s += si, d += di) {
        int64_t v;
        zb__load_int(s, from, &v);
        if (lut && v != -1) {
            if (v < 0 || (uint64_t)v >= nlut)
                return zb__err(ZB_E_CORRUPT, "%s: code %lld outside its %llu categories", what,
                               (long long)v, (unsigned long long)nlut);
            v = lut[v];
        }
        store_int(d, to, v);
    }
    return ZB_OK;
}

void
zb__var_reorder_dense(uint8_t *row, uint64_t n_vars, size_t itemsize, const int64_t *lut,
                      uint8_t *scratch)
{
    for (uint64_t j = 0; j < n_vars; j++)
        memcpy(scratch + (size_t)lut[j] * itemsize, row + j * itemsize, itemsize);
    memcpy(row, scratch, (size_t)n_vars * itemsize);
}

/* A row's (gene, position) pairs sorted by gene: an LSD radix sort over the key bytes in use
 * (a row holds ~1,500 genes of tens of thousands: three passes of counting, no comparisons). */
typedef struct gene_pos {
    uint32_t gene, pos;
} gene_pos;

static gene_pos *
sort_genes(gene_pos *a, gene_pos *tmp, uint64_t n, uint64_t n_vars)
{
    for (int shift = 0; shift < 32 && (n_vars - 1) >> shift; shift += 8) {
        size_t count[257] = {0};
        for (uint64_t i = 0; i < n; i++) count[((a[i].gene >> shift) & 255) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (uint64_t i = 0; i < n; i++) tmp[count[(a[i].gene >> shift) & 255]++] = a[i];
        gene_pos *t = a;
        a = tmp;
        tmp = t;
    }
    return a;
}

zb_status
zb__var_reorder_csr(void *idx, zb_dtype idx_dtype, uint8_t *vals, size_t itemsize, uint64_t nnz,
                    const int64_t *lut, uint64_t n_vars, zb__buf *scratch, const char *what)
{
    if (nnz == 0) return ZB_OK;
    if (n_vars > UINT32_MAX || nnz > UINT32_MAX)
        return zb__err(ZB_E_UNSUPPORTED, "%s: reorder_vars handles rows of up to 2^32 genes", what);
    size_t isz = zb_dtype_size(idx_dtype);
    size_t pairs = (size_t)nnz * sizeof(gene_pos);
    ZB_TRY(zb__buf_reserve(scratch, 2 * pairs + (size_t)nnz * itemsize));
    gene_pos *a = (gene_pos *)(void *)scratch->data, *tmp = a + nnz;
    uint8_t *v = scratch->data + 2 * pairs;
    uint8_t *ix = idx;
    for (uint64_t k = 0; k < nnz; k++) {
        int64_t g;
        if (!zb__load_int(ix + k * isz, idx_dtype, &g) || g < 0 || (uint64_t)g >= n_vars)
            return zb__err(ZB_E_CORRUPT, "%s: gene id %lld outside [0, %llu)", what, (long long)g,
                           (unsigned long long)n_vars);
        a[k] = (gene_pos){(uint32_t)lut[g], (uint32_t)k};
    }
    gene_pos *s = sort_genes(a, tmp, nnz, n_vars);
    memcpy(v, vals, (size_t)nnz * itemsize);
    for (uint64_t k = 0; k < nnz; k++) {
        store_int(ix + k * isz, idx_dtype, s[k].gene);
        memcpy(vals + k * itemsize, v + (size_t)s[k].pos * itemsize, itemsize);
    }
    return ZB_OK;
}
