/* Validation on the read path and on_invalid (validate.h).
 *
 * Every check here runs on what one request delivers, as it is assembled: a few integer
 * comparisons per delivered value, never a pass over the store at open. The fast path of each
 * value check is a min/max sweep the compiler vectorises; only when the range is wrong is the
 * offending sample looked up, so a clean batch pays the sweep alone (docs/PERFORMANCE.md has
 * the measured cost). Skipping (ZB_ON_INVALID_SKIP) costs nothing until a request fails: then
 * the request is halved until the bad samples are found, and the rest read again. */
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "dataset.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/status.h"
#include "util/vecloop.h"
#include "zarr/array.h"

static const zb_dataset *
child_ds(const zb_dataset *ds, uint32_t c)
{
    return ds->nchildren ? ds->children[c] : ds;
}

zb_status
zb__request_bytes_add(const zb_dataset *ds, const char *field, uint64_t rows, uint64_t row_elems,
                      size_t itemsize, size_t *need)
{
    uint64_t cap =
        ds->opts.max_request_bytes ? ds->opts.max_request_bytes : ZB_MAX_REQUEST_BYTES_DEFAULT;
    uint64_t bytes, total;
    bool ok = zb__mul_u64(rows, row_elems, &bytes) && zb__mul_u64(bytes, itemsize, &bytes) &&
              zb__add_u64(bytes, 63, &bytes);
    bytes &= ~(uint64_t)63;
    if (!ok || !zb__add_u64(*need, bytes, &total) || total > cap || total > SIZE_MAX - 64)
        return zb__err(ZB_E_INVALID,
                       "%s: a request of %llu rows of %s needs more than the "
                       "%llu-byte cap on one request's memory (zb_dataset_opts.max_request_bytes)",
                       zb_dataset_name(ds), (unsigned long long)rows, field,
                       (unsigned long long)cap);
    *need = (size_t)total;
    return ZB_OK;
}

zb_status
zb__validate_segment(const zb_dataset *ds, size_t s, size_t n, const uint64_t *ids,
                     const uint32_t *child, const uint64_t *phys, const int64_t *start,
                     const int64_t *ptr)
{
    for (size_t i = 0; i < n; i++) {
        const zb_dataset *ch = child_ds(ds, child[i]);
        uint64_t len = (uint64_t)(ptr[i + 1] - ptr[i]), end = (uint64_t)start[i] + len;
        for (size_t f = 0; f < ch->nfields; f++) {
            const zb__field *fd = &ch->fields[f];
            if (fd->seg != (int)s || !fd->arr) continue;
            uint64_t rows = fd->arr->meta.shape[0];
            if (end >= (uint64_t)start[i] && end <= rows) continue;
            return zb__err(ZB_E_CORRUPT,
                           "%s: sample %llu (row %llu): %s: pointers give rows "
                           "[%lld, %lld + %llu), past the %llu rows of field %s (%s)",
                           zb_dataset_name(ch), (unsigned long long)ids[i],
                           (unsigned long long)phys[i], ch->segs[s].ptr->path, (long long)start[i],
                           (long long)start[i], (unsigned long long)len, (unsigned long long)rows,
                           fd->name, fd->arr->path);
        }
    }
    return ZB_OK;
}

/* ---- value ranges ------------------------------------------------------------------------- */

/* The largest of (unsigned)(v[k] + add) over n values: one unsigned reduction tells whether
 * every v[k] lies in [-add, bound - add) (a value below -add wraps to a huge one). Vectorised
 * (ZB_VECTOR_LOOP): the batch's CSR column ids are millions of values per window. */
ZB_VECTOR_LOOP static uint32_t
umax_int32(const int32_t *v, uint64_t n, uint32_t add)
{
    uint32_t m = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint32_t x = (uint32_t)v[k] + add;
        m = x > m ? x : m;
    }
    return m;
}

ZB_VECTOR_LOOP static uint64_t
umax_int64(const int64_t *v, uint64_t n, uint64_t add)
{
    uint64_t m = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t x = (uint64_t)v[k] + add;
        m = x > m ? x : m;
    }
    return m;
}

/* Whether all n integers of dtype dt lie in [lo, hi) (lo is 0 or -1); a dtype that is not an
 * integer passes. */
static bool
all_within(const void *data, zb_dtype dt, uint64_t n, int64_t lo, uint64_t hi)
{
    uint64_t add = (uint64_t)-lo, span = hi + add; /* values + add must be below span */
    if (n == 0) return true;
    if (dt == ZB_DT_INT32) return (uint64_t)umax_int32(data, n, (uint32_t)add) < span;
    if (dt == ZB_DT_INT64) return umax_int64(data, n, add) < span;
    size_t isz = zb_dtype_size(dt);
    for (uint64_t k = 0; k < n; k++) {
        int64_t x;
        if (!zb__load_int((const uint8_t *)data + k * isz, dt, &x) && x == 0) return true;
        if (x < lo || (uint64_t)(x - lo) >= span) return false;
    }
    return true;
}

static int64_t
value_at(const zb_batch_view *v, uint64_t k)
{
    int64_t x = 0;
    zb__load_int((const uint8_t *)v->data + k * zb_dtype_size(v->dtype), v->dtype, &x);
    return x;
}

/* The error for value k of field f (batch sample i, stored row `row` of the field's array). */
static zb_status
value_error(const zb_dataset *ch, size_t f, uint64_t id, uint64_t row, int64_t x, const char *what,
            uint64_t bound)
{
    const zb__field *fd = &ch->fields[f];
    char key[512];
    uint64_t g[ZB_MAX_DIMS] = {0};
    g[0] = row / fd->arr->inner[0];
    if (zb__array_unit_object(fd->arr, g, key, sizeof key, NULL, NULL) != ZB_OK)
        snprintf(key, sizeof key, "%s", fd->arr->path);
    zb_clear_error();
    return zb__err(ZB_E_CORRUPT,
                   "%s: sample %llu: field %s: %s %lld is outside [%s, %llu) "
                   "(row %llu, chunk %s)",
                   zb_dataset_name(ch), (unsigned long long)id, fd->name, what, (long long)x,
                   strcmp(what, "code") ? "0" : "-1", (unsigned long long)bound,
                   (unsigned long long)row, key);
}

/* CSR column ids of field f (ragged, on segment s) within [0, col_bound). */
static zb_status
check_columns(zb_dataset *ds, const zb_batch *b, size_t f, const uint64_t *phys,
              const int64_t *start)
{
    (void)phys;
    const zb_dataset *pr = child_ds(ds, 0);
    const zb__field *fd = &pr->fields[f];
    zb_batch_view v;
    ZB_TRY(zb_batch_field(b, f, &v));
    if (all_within(v.data, v.dtype, v.nrows * fd->row_elems, 0, fd->col_bound)) return ZB_OK;
    size_t n = zb_batch_size(b);
    const int32_t *dsi = zb_batch_dataset(b);
    for (uint64_t k = 0; k < v.nrows * fd->row_elems; k++) {
        int64_t x = value_at(&v, k);
        uint64_t r = k / fd->row_elems;
        size_t i = zb__sample_of(v.ptr, n, r);
        const zb_dataset *ch = child_ds(ds, dsi ? (uint32_t)dsi[i] : 0);
        uint64_t bound = ch->fields[f].col_bound;
        if (x >= 0 && (uint64_t)x < bound) continue;
        uint64_t row = (uint64_t)start[(size_t)fd->seg * n + i] + (r - (uint64_t)v.ptr[i]);
        return value_error(ch, f, zb_batch_index(b)[i], row, x, "column id", bound);
    }
    return ZB_OK;
}

/* Categorical codes of field f within [-1, categories). A collection's codes that went through
 * its table were checked as they were converted (zb__codes_convert). */
static zb_status
check_codes(zb_dataset *ds, const zb_batch *b, size_t f, const uint64_t *phys)
{
    zb_batch_view v;
    ZB_TRY(zb_batch_field(b, f, &v));
    size_t n = zb_batch_size(b);
    const int32_t *dsi = zb_batch_dataset(b);
    if (!ds->nchildren) {
        zb__field *fd = &ds->fields[f];
        ZB_TRY(zb__field_load_categories(ds, fd));
        if (all_within(v.data, v.dtype, n, -1, fd->cats.n)) return ZB_OK;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t c = dsi ? (uint32_t)dsi[i] : 0;
        uint64_t nlut;
        if (zb__dataset_lut(ds, f, c, &nlut)) continue;
        zb_dataset *ch = (zb_dataset *)child_ds(ds, c);
        zb__field *fd = &ch->fields[f];
        ZB_TRY(zb__field_load_categories(ch, fd));
        int64_t x = value_at(&v, i);
        if (x >= -1 && x < (int64_t)fd->cats.n) continue;
        return value_error(ch, f, zb_batch_index(b)[i], phys[i], x, "code", fd->cats.n);
    }
    return ZB_OK;
}

zb_status
zb__validate_batch(zb_dataset *ds, const zb_batch *b, const uint64_t *phys, const int64_t *start)
{
    const zb_dataset *pr = child_ds(ds, 0);
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb__field *fd = &pr->fields[f];
        if (fd->col_bound && fd->seg >= 0) ZB_TRY(check_columns(ds, b, f, phys, start));
        if (fd->categorical && fd->kind == ZB_FIELD_PER_SAMPLE) ZB_TRY(check_codes(ds, b, f, phys));
    }
    return ZB_OK;
}

/* ---- on_invalid = skip -------------------------------------------------------------------- */

/* Marks in bad[] the samples of ids[0..n) that make a read fail with ZB_E_CORRUPT, knowing
 * that reading all n fails: halves are read until the failing ones are single samples. */
static zb_status
find_bad(zb_dataset *ds, const uint64_t *ids, size_t n, uint8_t *bad)
{
    if (n == 1) {
        bad[0] = 1;
        return ZB_OK;
    }
    size_t h = n / 2;
    for (int part = 0; part < 2; part++) {
        const uint64_t *pi = part ? ids + h : ids;
        size_t pn = part ? n - h : h;
        zb_batch *b = NULL;
        zb_status st = zb__reader_read_batches(ds, NULL, pi, pn, NULL, 0, &b);
        zb_batch_free(b);
        if (st == ZB_E_CORRUPT) st = find_bad(ds, pi, pn, part ? bad + h : bad);
        if (st != ZB_OK) return st;
    }
    return ZB_OK;
}

zb_status
zb__dataset_read_window(zb_dataset *ds, zb__arena_pool *pool, const uint64_t *ids, size_t n,
                        size_t *sizes, size_t nbatches, zb_batch **out)
{
    zb_status st = zb__reader_read_batches(ds, pool, ids, n, sizes, nbatches, out);
    if (st != ZB_E_CORRUPT || ds->opts.on_invalid != ZB_ON_INVALID_SKIP || n == 0) return st;
    uint8_t *bad = calloc(n, 1);
    uint64_t *keep = malloc(n * sizeof *keep);
    if (!bad || !keep) {
        st = zb__err(ZB_E_NOMEM, "read_many: out of memory to skip invalid samples");
        goto out;
    }
    st = find_bad(ds, ids, n, bad);
    if (st != ZB_OK) goto out;
    size_t m = 0, k = 0, left = nbatches ? sizes[0] : n;
    for (size_t i = 0; i < n; i++) {
        while (nbatches && left == 0) left = sizes[++k]; /* the batch sample i belongs to */
        left--;
        if (bad[i]) {
            if (nbatches) sizes[k]--;
            continue;
        }
        keep[m++] = ids[i];
    }
    zb_clear_error();
    st = zb__reader_read_batches(ds, pool, keep, m, sizes, nbatches, out);
    if (st == ZB_OK) zb__batch_count_skipped(*out, n - m);
out:
    free(bad);
    free(keep);
    return st;
}

zb_status
zb__dataset_read_batches(zb_dataset *ds, const uint64_t *ids, size_t n, const size_t *sizes,
                         size_t nbatches, zb_batch **out)
{
    if (!ds || ds->opts.on_invalid != ZB_ON_INVALID_SKIP || (nbatches && !sizes))
        return zb__reader_read_batches(ds, NULL, ids, n, sizes, nbatches, out);
    size_t *own = malloc((nbatches + 1) * sizeof *own);
    if (!own) {
        if (out) *out = NULL;
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    }
    if (nbatches) memcpy(own, sizes, nbatches * sizeof *own);
    zb_status st = zb__dataset_read_window(ds, NULL, ids, n, nbatches ? own : NULL, nbatches, out);
    free(own);
    return st;
}
