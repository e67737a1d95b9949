/* Built-in per-batch transforms: log1p, normalize_total, densify, cast, and user callbacks.
 * They run on the loader's worker, on one batch at a time, through the public batch API. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/batch.h"
#include "util/status.h"
#include "util/stream.h"

static zb_status
x_data(zb_batch *b, zb_batch_view *v, const char *what)
{
    zb_status st = zb_batch_find(b, "X/data", v);
    if (st != ZB_OK) return zb__err(ZB_E_NOTFOUND, "%s needs a CSR X (no field X/data)", what);
    if (v->dtype != ZB_DT_FLOAT32 && v->dtype != ZB_DT_FLOAT64)
        return zb__err(ZB_E_TYPE, "%s needs float X/data, not %s", what, zb_dtype_name(v->dtype));
    return ZB_OK;
}

static zb_status
do_log1p(zb_batch *b)
{
    zb_batch_view v;
    ZB_TRY(x_data(b, &v, "log1p"));
    if (v.dtype == ZB_DT_FLOAT32) {
        float *p = v.data;
        for (uint64_t i = 0; i < v.nrows; i++) p[i] = log1pf(p[i]);
    } else {
        double *p = v.data;
        for (uint64_t i = 0; i < v.nrows; i++) p[i] = log1p(p[i]);
    }
    return ZB_OK;
}

/* Scales each row to sum to target (scanpy's normalize_total; an all-zero row stays zero). */
static zb_status
do_normalize(zb_batch *b, double target)
{
    zb_batch_view v;
    ZB_TRY(x_data(b, &v, "normalize_total"));
    size_t B = zb_batch_size(b);
    for (size_t r = 0; r < B; r++) {
        int64_t a = v.ptr[r], e = v.ptr[r + 1];
        double sum = 0;
        if (v.dtype == ZB_DT_FLOAT32) {
            float *p = v.data;
            for (int64_t i = a; i < e; i++) sum += p[i];
            if (sum > 0)
                for (int64_t i = a; i < e; i++) p[i] = (float)(p[i] * (target / sum));
        } else {
            double *p = v.data;
            for (int64_t i = a; i < e; i++) sum += p[i];
            if (sum > 0)
                for (int64_t i = a; i < e; i++) p[i] = p[i] * (target / sum);
        }
    }
    return ZB_OK;
}

static int64_t
load_index(const void *p, zb_dtype dt, uint64_t i)
{
    switch (dt) {
    case ZB_DT_INT8:
        return ((const int8_t *)p)[i];
    case ZB_DT_INT16:
        return ((const int16_t *)p)[i];
    case ZB_DT_INT32:
        return ((const int32_t *)p)[i];
    case ZB_DT_INT64:
        return ((const int64_t *)p)[i];
    case ZB_DT_UINT8:
        return ((const uint8_t *)p)[i];
    case ZB_DT_UINT16:
        return ((const uint16_t *)p)[i];
    case ZB_DT_UINT32:
        return ((const uint32_t *)p)[i];
    case ZB_DT_UINT64:
        return (int64_t)((const uint64_t *)p)[i];
    default:
        return -1;
    }
}

static double
load_value(const void *p, zb_dtype dt, uint64_t i)
{
    switch (dt) {
    case ZB_DT_FLOAT32:
        return ((const float *)p)[i];
    case ZB_DT_FLOAT64:
        return ((const double *)p)[i];
    default:
        return (double)load_index(p, dt, i);
    }
}

/* Writes CSR entries [a, e) into the dense `row` (columns through `map` when not NULL).
 * Returns false on an index outside [0, n_vars), stored in *bad. */
static bool
scatter_row(float *row, const zb_batch_view *d, const zb_batch_view *ix, int64_t a, int64_t e,
            const int64_t *map, uint64_t n_vars, int64_t *bad)
{
    if (!map && ix->dtype == ZB_DT_INT32 && d->dtype == ZB_DT_FLOAT32) {
        /* the layout writers' own dtypes, without a per-entry dtype switch */
        const int32_t *cols = ix->data;
        const float *vals = d->data;
        for (int64_t i = a; i < e; i++) {
            if (cols[i] < 0 || (uint64_t)cols[i] >= n_vars) {
                *bad = cols[i];
                return false;
            }
            row[cols[i]] = vals[i];
        }
        return true;
    }
    for (int64_t i = a; i < e; i++) {
        int64_t c = load_index(ix->data, ix->dtype, (uint64_t)i);
        if (c < 0 || (uint64_t)c >= n_vars) {
            *bad = c;
            return false;
        }
        int64_t col = map ? map[c] : c;
        if (col >= 0) row[col] = (float)load_value(d->data, d->dtype, (uint64_t)i);
    }
    return true;
}

/* Zeros again what scatter_row wrote for entries [a, e) (their indices were checked then). */
static void
clear_row(float *row, const zb_batch_view *ix, int64_t a, int64_t e, const int64_t *map)
{
    if (!map && ix->dtype == ZB_DT_INT32) {
        const int32_t *cols = ix->data;
        for (int64_t i = a; i < e; i++) row[cols[i]] = 0.0f;
        return;
    }
    for (int64_t i = a; i < e; i++) {
        int64_t c = load_index(ix->data, ix->dtype, (uint64_t)i);
        int64_t col = map ? map[c] : c;
        if (col >= 0) row[col] = 0.0f;
    }
}

/* CSR -> dense float32 rows, optionally keeping only `columns` (in that order). */
static zb_status
do_densify(zb_batch *b, const uint64_t *columns, size_t ncolumns)
{
    zb_batch_view d, ix;
    if (zb_batch_find(b, "X/data", &d) != ZB_OK || zb_batch_find(b, "X/indices", &ix) != ZB_OK)
        return zb__err(ZB_E_NOTFOUND, "densify needs a CSR X (X/data and X/indices)");
    uint64_t n_vars = zb__batch_n_vars(b);
    uint64_t ncols = columns ? ncolumns : n_vars;
    int64_t *map = NULL;
    if (columns) {
        map = malloc((size_t)(n_vars ? n_vars : 1) * sizeof *map);
        if (!map) return zb__err(ZB_E_NOMEM, "densify: out of memory");
        for (uint64_t c = 0; c < n_vars; c++) map[c] = -1;
        for (size_t k = 0; k < ncolumns; k++) {
            if (columns[k] >= n_vars) {
                free(map);
                return zb__err(ZB_E_RANGE, "densify: column %llu outside [0, %llu)",
                               (unsigned long long)columns[k], (unsigned long long)n_vars);
            }
            if (map[columns[k]] >= 0) {
                /* one output place per column: a second would stay zero */
                zb_status st = zb__err(
                    ZB_E_INVALID, "densify: column %llu is given twice (positions %lld and %zu)",
                    (unsigned long long)columns[k], (long long)map[columns[k]], k);
                free(map);
                return st;
            }
            map[columns[k]] = (int64_t)k;
        }
    }
    size_t B = zb_batch_size(b);
    /* the output joins the batch before it is filled (pooled memory, zeroed): on a corrupt
     * index the batch, and with it the half-filled field, is dropped by the caller */
    uint64_t shape[1] = {ncols};
    void *mem = NULL;
    zb_status st =
        zb__batch_add_pooled_field(b, "X_dense", ZB_DT_FLOAT32, 1, shape, B, false, &mem);
    if (st != ZB_OK) {
        free(map);
        return st;
    }
    float *out = mem;
    size_t row_bytes = (size_t)ncols * sizeof *out;
    /* A batch that outgrows the cache is assembled row by row in a scratch row that stays in
     * cache and then streamed out (util/stream.h), so its lines are never read before being
     * written (a memset + scatter in place reads every one of them). Smaller batches are
     * written in place and stay in cache for the consumer. */
    float *scratch = NULL; /* all zeros between rows */
    if (ZB_HAVE_STREAM && ncols && B * row_bytes >= ZB_STREAM_MIN_BATCH_BYTES)
        scratch = calloc(ncols, sizeof *scratch); /* without it: the in-place path */
    st = ZB_OK;
    for (size_t r = 0; r < B; r++) {
        float *dst = out + r * ncols;
        /* in place, the row is zeroed just before its values land: it is still in cache when
         * they do, where zeroing the whole batch first would leave every value a cache miss */
        float *row = scratch ? scratch : dst;
        if (!scratch) memset(dst, 0, row_bytes);
        int64_t bad = 0;
        if (!scatter_row(row, &d, &ix, d.ptr[r], d.ptr[r + 1], map, n_vars, &bad)) {
            /* never leave unwritten rows behind, even in a batch about to be dropped */
            memset(dst, 0, (B - r) * row_bytes);
            st = zb__err(ZB_E_CORRUPT, "densify: X/indices value %lld outside [0, %llu)",
                         (long long)bad, (unsigned long long)n_vars);
            break;
        }
        if (scratch) {
            zb__stream_copy(dst, scratch, row_bytes);
            clear_row(scratch, &ix, d.ptr[r], d.ptr[r + 1], map);
        }
    }
    if (scratch) zb__stream_fence();
    free(scratch);
    free(map);
    return st;
}

static zb_status
do_cast(zb_batch *b, const char *field, zb_dtype to)
{
    zb_batch_view v;
    ZB_TRY(zb_batch_find(b, field, &v));
    if (v.dtype == ZB_DT_STRING || to == ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "cast: strings cannot be cast");
    uint64_t n = v.nrows;
    for (int d = 0; d < v.ndim; d++) n *= v.row_shape[d];
    size_t osz = zb_dtype_size(to);
    uint8_t *out = malloc((size_t)(n * osz) + 1);
    if (!out) return zb__err(ZB_E_NOMEM, "cast: out of memory");
    for (uint64_t i = 0; i < n; i++) {
        double x = load_value(v.data, v.dtype, i);
        int64_t k = v.dtype == ZB_DT_FLOAT32 || v.dtype == ZB_DT_FLOAT64
                        ? (int64_t)x
                        : load_index(v.data, v.dtype, i);
        uint8_t *o = out + i * osz;
        switch (to) {
        case ZB_DT_BOOL:
            *o = x != 0;
            break;
        case ZB_DT_INT8:
            *(int8_t *)o = (int8_t)k;
            break;
        case ZB_DT_INT16: {
            int16_t t = (int16_t)k;
            memcpy(o, &t, 2);
        } break;
        case ZB_DT_INT32: {
            int32_t t = (int32_t)k;
            memcpy(o, &t, 4);
        } break;
        case ZB_DT_INT64:
            memcpy(o, &k, 8);
            break;
        case ZB_DT_UINT8:
            *o = (uint8_t)k;
            break;
        case ZB_DT_UINT16: {
            uint16_t t = (uint16_t)k;
            memcpy(o, &t, 2);
        } break;
        case ZB_DT_UINT32: {
            uint32_t t = (uint32_t)k;
            memcpy(o, &t, 4);
        } break;
        case ZB_DT_UINT64: {
            uint64_t t = (uint64_t)k;
            memcpy(o, &t, 8);
        } break;
        case ZB_DT_FLOAT32: {
            float t = (float)x;
            memcpy(o, &t, 4);
        } break;
        case ZB_DT_FLOAT64:
            memcpy(o, &x, 8);
            break;
        default:
            free(out);
            return zb__err(ZB_E_UNSUPPORTED, "cast to %s is not supported", zb_dtype_name(to));
        }
    }
    zb_status st = zb_batch_replace_field(b, field, to, out);
    if (st != ZB_OK) free(out);
    return st;
}

zb_status
zb__transform_apply(const zb_transform *t, zb_batch *b)
{
    switch (t->kind) {
    case ZB_TRANSFORM_LOG1P:
        return do_log1p(b);
    case ZB_TRANSFORM_NORMALIZE_TOTAL:
        return do_normalize(b, t->target_sum);
    case ZB_TRANSFORM_DENSIFY:
        return do_densify(b, t->columns, t->ncolumns);
    case ZB_TRANSFORM_CAST:
        return do_cast(b, t->field, t->dtype);
    case ZB_TRANSFORM_CALLBACK: {
        if (!t->fn) return zb__err(ZB_E_INVALID, "callback transform without a function");
        zb_clear_error();
        zb_status st = t->fn(b, t->user);
        if (st != ZB_OK && !zb_last_error()[0])
            zb__err(st, "transform callback: %s", zb_strerror(st));
        return st;
    }
    }
    return zb__err(ZB_E_INVALID, "unknown transform kind %d", (int)t->kind);
}
