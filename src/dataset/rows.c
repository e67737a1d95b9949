/* Landing rows in the batch: a decoded unit's box of a row copied line by line, and index
 * fields re-based (a sample's stored values become rows of its batch group) as their rows land
 * or after the tasks. The tasks (exec.c) and the finish (reader.c) call these; the short-row
 * copies, conversion and streaming rules they share are in read_int.h. */
#include <stdio.h>
#include <string.h>

#include "dataset/read_int.h"
#include "util/intload.h"
#include "util/status.h"
#include "util/vecloop.h"

/* Copies rows [src_row, src_row+n) of a decoded unit at unit coordinates g (logical C order,
 * shape u->inner) that covers part of the other axes (serve_unit moves units holding whole
 * rows itself) into the batch rows starting at dst_row. */
void
zb__rows_copy_box(const zb__unit_geom *u, const bfield *bf, const uint8_t *unit, const uint64_t *g,
                  uint64_t src_row, uint64_t dst_row, uint64_t n)
{
    int nd = u->ndim;
    size_t isz = bf->itemsize;
    if (nd == 2) {
        /* a unit of some columns of each row (nvalchemi's column chunks, [rows, 1]): one short
         * line per row, copied with a fixed-size move where the width allows */
        uint64_t lo1 = g[1] * u->inner[1], hi1 = lo1 + u->inner[1];
        if (hi1 > u->shape[1]) hi1 = u->shape[1];
        size_t nb = (size_t)((hi1 - lo1) * isz);
        size_t us = (size_t)(u->inner[1] * isz), os = (size_t)(bf->row_elems * isz);
        copy_lines(bf->data + dst_row * os + lo1 * isz, os, unit + src_row * us, us, n, nb);
        return;
    }
    /* general: the unit covers a box of the other axes; copy it line by line (last axis) */
    uint64_t lo[ZB_MAX_DIMS], ext[ZB_MAX_DIMS], ostride[ZB_MAX_DIMS], ustride[ZB_MAX_DIMS];
    uint64_t s = 1, us = 1; /* us ends as the unit's elements per row */
    for (int d = nd - 1; d >= 1; d--) {
        ostride[d] = s;
        s *= u->shape[d];
        ustride[d] = us;
        us *= u->inner[d];
        lo[d] = g[d] * u->inner[d];
        uint64_t hi = lo[d] + u->inner[d];
        if (hi > u->shape[d]) hi = u->shape[d];
        ext[d] = hi - lo[d];
    }
    for (uint64_t r = 0; r < n; r++) {
        const uint8_t *urow = unit + (src_row + r) * us * isz;
        uint8_t *orow = bf->data + (dst_row + r) * bf->row_elems * isz;
        uint64_t idx[ZB_MAX_DIMS] = {0};
        for (;;) {
            uint64_t ui = 0, oi = 0;
            for (int d = 1; d < nd - 1; d++) {
                ui += idx[d] * ustride[d];
                oi += (lo[d] + idx[d]) * ostride[d];
            }
            oi += lo[nd - 1];
            memcpy(orow + oi * isz, urow + ui * isz, (size_t)(ext[nd - 1] * isz));
            int d = nd - 2;
            for (; d >= 1; d--) {
                if (++idx[d] < ext[d]) break;
                idx[d] = 0;
            }
            if (d < 1) break;
        }
    }
}

/* ---- value checks ------------------------------------------------------------------------ */

/* The largest of (UT)(v[k] + add) over n values of T: one unsigned reduction tells whether every
 * v[k] lies in [-add, span - add) (a value below -add wraps to a huge one). Vectorised
 * (ZB_VECTOR_LOOP): a window's CSR column ids are millions of values. UT is uint64_t but for
 * int32 (half the lanes' work for the commonest case; values_within takes the 64-bit loop
 * when the span needs it). */
#define ZB_UMAX(T, UT)                                                                             \
    ZB_VECTOR_LOOP static uint64_t umax_##T(const void *p, uint64_t n, uint64_t add)               \
    {                                                                                              \
        const T *v = p;                                                                            \
        UT m = 0;                                                                                  \
        for (uint64_t k = 0; k < n; k++) {                                                         \
            UT x = (UT)(int64_t)v[k] + (UT)add;                                                    \
            m = x > m ? x : m;                                                                     \
        }                                                                                          \
        return m;                                                                                  \
    }
ZB_UMAX(int8_t, uint64_t)
ZB_UMAX(uint8_t, uint64_t)
ZB_UMAX(int16_t, uint64_t)
ZB_UMAX(uint16_t, uint64_t)
ZB_UMAX(int32_t, uint32_t)
ZB_UMAX(int64_t, uint64_t)
#undef ZB_UMAX

ZB_VECTOR_LOOP static uint64_t
umax_int32_wide(const void *p, uint64_t n, uint64_t add)
{
    const int32_t *v = p;
    uint64_t m = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t x = (uint64_t)(int64_t)v[k] + add;
        m = x > m ? x : m;
    }
    return m;
}

static bool
values_within(const void *v, zb_dtype dt, uint64_t n, int64_t lo, uint64_t span)
{
    uint64_t add = (uint64_t)-lo;
    if (n == 0) return true;
    switch (dt) {
    case ZB_DT_INT8:
        return umax_int8_t(v, n, add) < span;
    case ZB_DT_UINT8:
        return umax_uint8_t(v, n, add) < span;
    case ZB_DT_INT16:
        return umax_int16_t(v, n, add) < span;
    case ZB_DT_UINT16:
        return umax_uint16_t(v, n, add) < span;
    case ZB_DT_INT32:
        return (span > UINT32_MAX ? umax_int32_wide(v, n, add) : umax_int32_t(v, n, add)) < span;
    case ZB_DT_INT64:
        return umax_int64_t(v, n, add) < span;
    default: { /* uint32, uint64 (which the layouts do not deliver for these fields) */
        size_t isz = zb_dtype_size(dt);
        for (uint64_t k = 0; k < n; k++) {
            int64_t x;
            if (!zb__load_int((const uint8_t *)v + k * isz, dt, &x)) return true;
            if ((uint64_t)x - (uint64_t)lo >= span) return false;
        }
        return true;
    }
    }
}

/* The error for the first value of copy c outside vb: the sample holding it, its stored row
 * and the chunk holding that row. */
static zb_status
value_error(const plan *p, const copy *c, vbound vb)
{
    const bfield *bf = &p->b->fields[c->field];
    const zb_dataset *ch = child_of(p->ds, c->child);
    const zb__field *fd = &ch->fields[c->field];
    uint64_t k = c->dst_row * bf->row_elems, end = (c->dst_row + c->nrows) * bf->row_elems;
    int64_t x = 0;
    for (; k < end; k++) {
        zb__load_int(bf->data + k * bf->itemsize, bf->dtype, &x);
        if ((uint64_t)x - (uint64_t)vb.lo >= vb.span) break;
    }
    uint64_t r = k / bf->row_elems; /* the value's batch row, its sample and stored row */
    size_t i = bf->seg >= 0 ? zb__sample_of(p->b->segs[bf->seg].ptr, p->n, r) : (size_t)r;
    uint64_t row = p->phys[i];
    if (bf->seg >= 0)
        row = (uint64_t)p->seg_start[(size_t)bf->seg * p->n + i] +
              (r - (uint64_t)p->b->segs[bf->seg].ptr[i]);
    char key[512];
    uint64_t g[ZB_MAX_DIMS] = {0};
    g[0] = row / zb__array_units(fd->arr)->inner[0];
    if (zb__array_unit_object(fd->arr, g, key, sizeof key, NULL, NULL) != ZB_OK)
        snprintf(key, sizeof key, "%s", zb__array_units(fd->arr)->path);
    zb_clear_error();
    return zb__err(ZB_E_CORRUPT,
                   "%s: sample %llu: field %s: %s %lld is outside [%lld, %llu) "
                   "(row %llu, chunk %s)",
                   zb_dataset_name(ch), (unsigned long long)p->b->index[i], fd->name,
                   vb.lo < 0 ? "code" : "column id", (long long)x, (long long)vb.lo,
                   (unsigned long long)((uint64_t)vb.lo + vb.span), (unsigned long long)row, key);
}

zb_status
zb__rows_check(const plan *p, const copy *c, vbound vb, const uint8_t *vals)
{
    const bfield *bf = &p->b->fields[c->field];
    const uint8_t *v = vals ? vals : bf->data + c->dst_row * bf->row_elems * bf->itemsize;
    uint64_t n = c->nrows * bf->row_elems;
    if (n == 1) { /* a sample's code: shuffled samples land one by one */
        int64_t x;
        if (!zb__load_int(v, bf->dtype, &x) || (uint64_t)x - (uint64_t)vb.lo < vb.span)
            return ZB_OK;
    } else if (values_within(v, bf->dtype, n, vb.lo, vb.span)) {
        return ZB_OK;
    }
    return value_error(p, c, vb);
}

/* Re-bases rows [r0, r1) x columns [c0, c1) of an index field's batch buffer, all of sample i:
 * v + d in one branch-free pass that keeps the range of v; a range outside [lo, lo + len), or
 * a result past INT32_MAX for int32, undoes the shift and returns false. Vectorised
 * (ZB_VECTOR_LOOP: AVX2 where the CPU has it, as SSE2 has no 64-bit compare; 6.4% of an atoms
 * read scalar, 1.8% so). */
#define ZB_SHIFT_SPAN(T, UT)                                                                       \
    ZB_VECTOR_LOOP static bool shift_span_##T(T *base, uint64_t re, uint64_t r0, uint64_t r1,      \
                                              uint64_t c0, uint64_t c1, int64_t d, int64_t lo,     \
                                              int64_t len)                                         \
    {                                                                                              \
        /* w values es apart in each row: whole rows, or one column (strided), are one run */      \
        uint64_t rows = r1 - r0, w = c1 - c0, es = 1;                                              \
        if (c0 == 0 && c1 == re) {                                                                 \
            w *= rows;                                                                             \
            rows = 1;                                                                              \
        } else if (w == 1) {                                                                       \
            w = rows;                                                                              \
            rows = 1;                                                                              \
            es = re;                                                                               \
        }                                                                                          \
        T mn = base[r0 * re + c0], mx = mn;                                                        \
        for (uint64_t r = 0; r < rows; r++) {                                                      \
            T *v = base + (r0 + r) * re + c0;                                                      \
            for (uint64_t k = 0; k < w; k++) {                                                     \
                T x = v[k * es];                                                                   \
                mn = x < mn ? x : mn;                                                              \
                mx = x > mx ? x : mx;                                                              \
                v[k * es] = (T)((UT)x + (UT)d);                                                    \
            }                                                                                      \
        }                                                                                          \
        /* mn >= lo >= 0 first: then mx - lo and mx + d cannot overflow int64 */                   \
        if (mn >= lo && mx - lo < len && (sizeof(T) == 8 || (int64_t)mx + d <= INT32_MAX))         \
            return true;                                                                           \
        for (uint64_t r = 0; r < rows; r++) {                                                      \
            T *v = base + (r0 + r) * re + c0;                                                      \
            for (uint64_t k = 0; k < w; k++) v[k * es] = (T)((UT)v[k * es] - (UT)d);               \
        }                                                                                          \
        return false;                                                                              \
    }
ZB_SHIFT_SPAN(int64_t, uint64_t)
ZB_SHIFT_SPAN(int32_t, uint32_t)
#undef ZB_SHIFT_SPAN

/* The error for the first value of rows [r0, r1) x columns [c0, c1) of sample i (values as
 * stored) that lies outside the sample's target rows, or whose batch row does not fit int32. */
static zb_status
rebase_error(const plan *p, uint32_t f, size_t i, uint64_t r0, uint64_t r1, uint64_t c0,
             uint64_t c1)
{
    const rebase *r = &p->rb[f];
    const bfield *bf = &p->b->fields[f];
    const zb_dataset *ch = child_of(p->ds, p->child[i]);
    const zb__field *fd = &ch->fields[f];
    bool wide = bf->dtype == ZB_DT_INT64;
    for (uint64_t row = r0; row < r1; row++)
        for (uint64_t k = row * bf->row_elems + c0; k < row * bf->row_elems + c1; k++) {
            int64_t x = wide ? ((const int64_t *)(const void *)bf->data)[k]
                             : ((const int32_t *)(const void *)bf->data)[k];
            if (x < r->lo[i] || x - r->lo[i] >= r->len[i]) {
                /* x - lo as the store meant it; reported, never used */
                long long local = (long long)((uint64_t)x - (uint64_t)r->lo[i]);
                return zb__err(ZB_E_CORRUPT,
                               "%s: sample %llu (row %zu of the request): field "
                               "%s: value %lld is outside its %lld atoms (stored %s)",
                               zb_dataset_name(ch), (unsigned long long)p->b->index[i], i, fd->name,
                               local, (long long)r->len[i],
                               fd->global_index ? "store-global" : "local");
            }
            if (!wide && x + r->shift[i] > INT32_MAX)
                return zb__err(ZB_E_OVERFLOW, "%s: batch index %lld does not fit int32", fd->name,
                               (long long)(x + r->shift[i]));
        }
    return zb__err(ZB_E_CORRUPT,
                   "%s: sample %llu (row %zu of the request): field %s: bad "
                   "index values",
                   zb_dataset_name(ch), (unsigned long long)p->b->index[i], i, fd->name);
}

/* Re-bases rows [row0, row0 + nrows) x columns [c0, c1) of index field f, sample by sample (a
 * copy may span several): in the tasks, the rows one copy has just written (still in cache);
 * after them, every row of a field the tasks do not re-base. */
zb_status
zb__rows_rebase(const plan *p, uint32_t f, uint64_t row0, uint64_t nrows, uint64_t c0, uint64_t c1)
{
    const rebase *r = &p->rb[f];
    bfield *bf = &p->b->fields[f];
    uint64_t re = bf->row_elems, end = row0 + nrows;
    for (size_t i = nrows ? zb__sample_of(r->rows, p->n, row0) : p->n; i < p->n; i++) {
        uint64_t a = (uint64_t)r->rows[i] > row0 ? (uint64_t)r->rows[i] : row0;
        uint64_t e = (uint64_t)r->rows[i + 1] < end ? (uint64_t)r->rows[i + 1] : end;
        if (a >= end) break;
        if (a >= e) continue;
        bool ok = bf->dtype == ZB_DT_INT64
                      ? shift_span_int64_t((int64_t *)(void *)bf->data, re, a, e, c0, c1,
                                           r->shift[i], r->lo[i], r->len[i])
                      : shift_span_int32_t((int32_t *)(void *)bf->data, re, a, e, c0, c1,
                                           r->shift[i], r->lo[i], r->len[i]);
        if (!ok) return rebase_error(p, f, i, a, e, c0, c1);
    }
    return ZB_OK;
}

/* ---- a unit row chunked by columns, landed whole -------------------------------------------- */

/* Row r of the batch from one column per unit: o[r * K + k] = col k's value r, bits as they are
 * (4- and 8-byte items of any type). Vectorised (ZB_VECTOR_LOOP): an interleaving store of K
 * streams. */
#define ZB_ZIP(T)                                                                                  \
    ZB_VECTOR_LOOP static void zip2_##T(T *restrict o, const T *restrict a, const T *restrict b,   \
                                        uint64_t n)                                                \
    {                                                                                              \
        for (uint64_t r = 0; r < n; r++) {                                                         \
            o[2 * r] = a[r];                                                                       \
            o[2 * r + 1] = b[r];                                                                   \
        }                                                                                          \
    }                                                                                              \
    ZB_VECTOR_LOOP static void zip3_##T(T *restrict o, const T *restrict a, const T *restrict b,   \
                                        const T *restrict c, uint64_t n)                           \
    {                                                                                              \
        for (uint64_t r = 0; r < n; r++) {                                                         \
            o[3 * r] = a[r];                                                                       \
            o[3 * r + 1] = b[r];                                                                   \
            o[3 * r + 2] = c[r];                                                                   \
        }                                                                                          \
    }
ZB_ZIP(uint32_t)
ZB_ZIP(uint64_t)
#undef ZB_ZIP

/* zip2 of an index field's two columns re-based in the same pass: v + d, true when every v lies
 * in [lo, lo + len) and, for int32, v + d fits (shift_span's rule, below). The caller re-copies
 * the rows unshifted to name the bad value. */
#define ZB_ZIP2_SHIFT(T, UT)                                                                       \
    ZB_VECTOR_LOOP static bool zip2_shift_##T(T *restrict o, const T *restrict a,                  \
                                              const T *restrict b, uint64_t n, int64_t d,          \
                                              int64_t lo, int64_t len)                             \
    {                                                                                              \
        T mn = a[0], mx = a[0];                                                                    \
        for (uint64_t r = 0; r < n; r++) {                                                         \
            T x = a[r], y = b[r];                                                                  \
            T lo2 = x < y ? x : y, hi2 = x < y ? y : x;                                            \
            mn = lo2 < mn ? lo2 : mn;                                                              \
            mx = hi2 > mx ? hi2 : mx;                                                              \
            o[2 * r] = (T)((UT)x + (UT)d);                                                         \
            o[2 * r + 1] = (T)((UT)y + (UT)d);                                                     \
        }                                                                                          \
        /* mn >= lo >= 0 first: then mx - lo and mx + d cannot overflow int64 */                   \
        return mn >= lo && mx - lo < len && (sizeof(T) == 8 || (int64_t)mx + d <= INT32_MAX);      \
    }
ZB_ZIP2_SHIFT(int64_t, uint64_t)
ZB_ZIP2_SHIFT(int32_t, uint32_t)
#undef ZB_ZIP2_SHIFT

/* Rows [s, s + n) of the unit row's columns (cols[k]: unit k, w columns of each of its rows,
 * the last unit cut at the row's end) into batch rows from `dst` on, whole. */
static void
zip_rows(const bfield *bf, const uint8_t *const *cols, size_t K, uint64_t w, uint64_t s,
         uint64_t dst, uint64_t n)
{
    size_t isz = bf->itemsize, os = (size_t)(bf->row_elems * isz);
    uint8_t *o = bf->data + dst * os;
    if (w == 1 && (K == 2 || K == 3) && (isz == 4 || isz == 8)) {
        /* nvalchemi's [rows, 1] chunks of [N, 2] and [N, 3] arrays */
        void *t = o;
        const void *a = cols[0] + s * isz, *b = cols[1] + s * isz;
        const void *c = K == 3 ? cols[2] + s * isz : NULL;
        if (K == 2 && isz == 8)
            zip2_uint64_t(t, a, b, n);
        else if (K == 2)
            zip2_uint32_t(t, a, b, n);
        else if (isz == 8)
            zip3_uint64_t(t, a, b, c, n);
        else
            zip3_uint32_t(t, a, b, c, n);
        return;
    }
    for (size_t k = 0; k < K; k++) { /* any other width: one unit's lines at a time */
        uint64_t lo1 = k * w, hi1 = lo1 + w < bf->row_elems ? lo1 + w : bf->row_elems;
        size_t us = (size_t)(w * isz);
        copy_lines(o + lo1 * isz, os, cols[k] + s * us, us, n, (size_t)((hi1 - lo1) * isz));
    }
}

zb_status
zb__rows_zip(const plan *p, const copy *c, const uint8_t *const *cols, size_t K, uint64_t w)
{
    const bfield *bf = &p->b->fields[c->field];
    bool pair = w == 1 && K == 2 && (bf->itemsize == 4 || bf->itemsize == 8);
    if (!rebased_here(p, c->field) || !pair) {
        zip_rows(bf, cols, K, w, c->src_row, c->dst_row, c->nrows);
        if (!rebased_here(p, c->field)) return ZB_OK;
        /* whole rows now: one contiguous run per sample */
        return zb__rows_rebase(p, c->field, c->dst_row, c->nrows, 0, bf->row_elems);
    }
    /* an [N, 2] index field (neighbor_list): interleaved and re-based in one pass, sample by
     * sample (a copy may span several) */
    const rebase *r = &p->rb[c->field];
    uint64_t end = c->dst_row + c->nrows;
    size_t isz = bf->itemsize;
    for (size_t i = c->nrows ? zb__sample_of(r->rows, p->n, c->dst_row) : p->n; i < p->n; i++) {
        uint64_t a = (uint64_t)r->rows[i] > c->dst_row ? (uint64_t)r->rows[i] : c->dst_row;
        uint64_t e = (uint64_t)r->rows[i + 1] < end ? (uint64_t)r->rows[i + 1] : end;
        if (a >= end) break;
        if (a >= e) continue;
        uint64_t s = c->src_row + (a - c->dst_row);
        void *o = bf->data + a * 2 * isz;
        const void *x = cols[0] + s * isz, *y = cols[1] + s * isz;
        bool ok = isz == 8 ? zip2_shift_int64_t(o, x, y, e - a, r->shift[i], r->lo[i], r->len[i])
                           : zip2_shift_int32_t(o, x, y, e - a, r->shift[i], r->lo[i], r->len[i]);
        if (!ok) {
            zip_rows(bf, cols, K, w, s, a, e - a); /* the values as stored, for the error */
            return rebase_error(p, c->field, i, a, e, 0, 2);
        }
    }
    return ZB_OK;
}
