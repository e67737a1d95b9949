/* Executing a plan (DESIGN.md §3, step 3): its tasks run on the dataset's pool (inline when
 * the work is small), each serving the copies of its units: a unit is found (cache, shard
 * index), fetched (a view, or a read), decoded once through the zarr unit API (straight into
 * the batch when it maps onto one contiguous run of it, else into the thread's `unit`
 * workspace) and copied out, converted and re-based as the rows land.
 *
 * Two ways to fetch. A store served in place (file, memory: zb__unit_lists_ranges false) keeps
 * each task's reads on the thread that decodes them: a view of a mapped file, or pread. A store
 * that reads lists itself (a remote backend) gets the window's reads in one zb_store_get_ranges
 * call on the calling thread (listed path, below): each task first serves what needs no fetch
 * and lists the rest, and as each range completes its units go to the pool to be decoded, so
 * decoding starts with the first bytes, not after the slowest range. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/read_int.h"
#include "store/remote.h"
#include "util/status.h"
#include "util/stream.h"
#include "zarr/shard.h"

/* ---- execution ---------------------------------------------------------------------------- */

static zb_status
task_fail(task *t, zb_status st)
{
    t->st = st;
    t->msg = strdup(zb_last_error()); /* NULL when out of memory: the status alone is told */
    return st;
}

/* Copy c's rows have landed in the batch: their values checked against vb (off for a copy
 * checked as it was converted, rows_convert) where they are hottest, in `vals` (the bytes the
 * copy was made from, just read) or, when NULL, in the batch (decoded or read straight into
 * it); then re-based when `reb` (the tasks re-base the field; columns [c0, c1) of each row). */
static inline zb_status
landed(const plan *p, const copy *c, vbound vb, const uint8_t *vals, bool reb, uint64_t c0,
       uint64_t c1)
{
    if (vb.on) ZB_TRY(zb__rows_check(p, c, vb, vals));
    if (reb) ZB_TRY(zb__rows_rebase(p, c->field, c->dst_row, c->nrows, c0, c1));
    return ZB_OK;
}

/* Checked as they convert: nothing left to check once landed. */
static const vbound NO_CHECK = {false, 0, 0};

/* Whether the unit at g spans every other axis exactly, so its rows are whole batch rows. */
static bool
unit_spans_rows(const zb__unit_geom *u, const uint64_t *g)
{
    for (int d = 1; d < u->ndim; d++)
        if (u->inner[d] != u->shape[d] || g[d] != 0) return false;
    return true;
}

/* Unit g of array a decoded into `target` (unit_bytes), or fill when `missing`, from `enc`
 * (fetched here when NULL: the cache evicted it since unit_cached() was asked; `entry` is then
 * its (offset, nbytes) in the shard object `key`, or NULL when `key` is the unit's own object),
 * and put in the decoded-chunk cache. */
static zb_status
unit_into(exec *x, const zb_array *a, const uint64_t *g, const uint8_t *enc, size_t enc_len,
          bool missing, const char *key, const uint64_t *entry, uint8_t *target)
{
    const zb__unit_geom *u = zb__array_units(a);
    void *tok = NULL;
    if (!enc && !missing) {
        if (entry) {
            ZB_TRY(zb__unit_fetch(a, key, entry[0], entry[1], &x->ctx->ws.fetch, &enc, &tok,
                                  &x->t->stats));
            enc_len = (size_t)entry[1];
        } else {
            ZB_TRY(zb__unit_fetch_whole(a, key, &x->ctx->ws.fetch, &enc, &enc_len, &missing, &tok,
                                        &x->t->stats));
        }
    }
    if (missing) {
        zb__array_fill_unit(a, target);
        x->t->stats.chunks_filled++;
        return ZB_OK;
    }
    uint64_t before = x->ctx->stats.bytes_decoded;
    zb_status st = zb__array_decode_unit(a, x->ctx, enc, enc_len, target, key);
    zb_store_release(u->store, tok);
    if (st != ZB_OK) return st;
    x->t->stats.chunks_decoded++;
    x->t->stats.bytes_decoded += x->ctx->stats.bytes_decoded - before;
    zb__cache *cache = x->p->ds->cache;
    if (cache) zb__cache_put(cache, a, zb__unit_linear(u, g), target, (size_t)u->unit_bytes);
    return ZB_OK;
}

/* Copies the rows of copies [c0, c1) out of decoded unit g (in `unit`, not the batch) into the
 * batch, converted when `conv`, re-based when the tasks re-base the field; *rows: rows
 * delivered. */
static zb_status
copy_out(exec *x, size_t c0, size_t c1, const uint64_t *g, const uint8_t *unit, bool conv,
         const int64_t *lut, uint64_t nlut, uint64_t row_bytes, uint64_t *rows)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb__field *f = &child_of(p->ds, cp->child)->fields[cp->field];
    const zb__unit_geom *u = zb__array_units(f->arr);
    bfield *bf = &p->b->fields[cp->field];
    vbound vb = value_bound(p, cp->field, cp->child);
    bool reb = rebased_here(p, cp->field);
    /* the unit's columns of each row (re-based here only when 2-d, plan_rebase) */
    bool whole = unit_spans_rows(u, g);
    uint64_t lo1 = 0, hi1 = bf->row_elems;
    if (!conv && !whole) {
        lo1 = u->ndim == 2 ? g[1] * u->inner[1] : 0;
        hi1 = lo1 + (u->ndim == 2 ? u->inner[1] : 0);
        if (hi1 > bf->row_elems) hi1 = bf->row_elems;
    }
    for (size_t i = c0; i < c1; i++) {
        const copy *c = &p->copies[i];
        const uint8_t *vals = NULL; /* the values' source, for landed() */
        if (conv) {
            /* values converted in the copy (1-d fields only: units hold whole rows) */
            ZB_TRY(rows_convert(p, c, vb, unit + c->src_row * f->itemsize, f->dtype, lut, nlut,
                                u->path));
        } else if (whole) {
            /* the unit holds whole batch rows: one move per copy, fixed-size for short rows */
            size_t rb = (size_t)row_bytes;
            uint8_t *o = bf->data + c->dst_row * rb;
            const uint8_t *src = unit + c->src_row * rb;
            vals = src;
            if (c->nrows == 1)
                copy_lines(o, 0, src, 0, 1, rb);
            else
                put_bytes(p, c->field, o, src, (size_t)c->nrows * rb);
        } else {
            zb__rows_copy_box(u, bf, unit, g, c->src_row, c->dst_row, c->nrows);
        }
        *rows += c->nrows;
        ZB_TRY(landed(p, c, conv ? NO_CHECK : vb, vals, reb, lo1, hi1));
    }
    return ZB_OK;
}

/* Serves the copies [c0, c1) — all of one unit row of one field and child — from the unit at
 * coordinates g (g[0] = the row). `enc` holds its encoded bytes, or NULL when the unit is
 * missing (fill) or found in the decoded-chunk cache (see unit_into for `entry`). A cached unit
 * is read where the cache holds it (pinned): copying a whole cached unit to serve a few of its
 * rows cost as much as the rows' share of a window is small (PERFORMANCE.md, "nvalchemi's own
 * layout"). A unit that one copy covers whole and unpadded is decoded straight into the batch.
 * A blosc frame holding a plain copy (zb__array_unit_plain) is not decoded: its copies are read
 * (and widened) straight from `enc`, the fetched bytes or the store's view. */
static zb_status
serve_unit(exec *x, size_t c0, size_t c1, const uint64_t *g, const uint8_t *enc, size_t enc_len,
           bool missing, const char *key, const uint64_t *entry)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    bfield *bf = &p->b->fields[cp->field];
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(p, cp->field, cp->child, &lut, &nlut);
    bool direct =
        !conv && c1 - c0 == 1 && cp->src_row == 0 && cp->nrows == u->inner[0] && u->spans_rows;
    size_t unit_bytes = (size_t)u->unit_bytes;
    zb__cache *cache = p->ds->cache;
    void *pin = NULL;
    const uint8_t *unit = NULL; /* the decoded unit, when not decoded into the batch */
    if (cache && !missing) unit = zb__cache_pin(cache, a, zb__unit_linear(u, g), unit_bytes, &pin);
    const uint8_t *plain = NULL; /* a blosc plain copy: served from `enc` like a raw unit */
    if (!unit && enc && !missing)
        ZB_TRY(zb__array_unit_plain(a, x->ctx, enc, enc_len, key, &plain));
    if (plain) {
        x->t->stats.chunks_decoded++;
        x->t->stats.bytes_decoded += unit_bytes;
        if (cache) zb__cache_put(cache, a, zb__unit_linear(u, g), plain, unit_bytes);
        if (direct)
            memcpy(bf->data + cp->dst_row * bf->row_elems * bf->itemsize, plain, unit_bytes);
        unit = plain;
    } else if (unit) {
        x->t->stats.chunks_cached++;
        if (direct) {
            memcpy(bf->data + cp->dst_row * bf->row_elems * bf->itemsize, unit, unit_bytes);
            zb__cache_unpin(cache, pin);
            pin = NULL;
        }
    } else if (direct) {
        ZB_TRY(unit_into(x, a, g, enc, enc_len, missing, key, entry,
                         bf->data + cp->dst_row * bf->row_elems * bf->itemsize));
    } else {
        ZB_TRY(zb__buf_reserve(&x->ctx->ws.unit, unit_bytes ? unit_bytes : 1));
        ZB_TRY(unit_into(x, a, g, enc, enc_len, missing, key, entry, x->ctx->ws.unit.data));
        unit = x->ctx->ws.unit.data;
    }
    uint64_t row_bytes = bf->itemsize; /* of this unit's part of a row */
    for (int d = 1; d < u->ndim; d++) {
        uint64_t lo = g[d] * u->inner[d], hi = lo + u->inner[d];
        row_bytes *= (hi > u->shape[d] ? u->shape[d] : hi) - lo;
    }
    uint64_t rows = 0;
    zb_status st = ZB_OK;
    if (direct) {
        rows = cp->nrows;
        st = landed(p, cp, value_bound(p, cp->field, cp->child), NULL, rebased_here(p, cp->field),
                    0, bf->row_elems);
    } else {
        st = copy_out(x, c0, c1, g, unit, conv, lut, nlut, row_bytes, &rows);
    }
    zb__cache_unpin(cache, pin);
    x->t->stats.bytes_delivered += rows * row_bytes;
    return st;
}

/* The most units of one unit row served together by serve_columns (nvalchemi's column chunks:
 * 2 or 3; wider rows are served unit by unit). */
#define ZIP_UNITS 8
/* The widest part of a row (bytes) whose uncached units serve_columns decodes side by side:
 * narrow columns are what a unit-by-unit copy lands slowly (one short strided store per row);
 * wider ones copy as long lines and would only hold K decoded units at once for nothing. */
#define ZIP_FETCH_BYTES 16

/* Serves copies [c0, c1) of unit row `row` of a 2-d array chunked by columns (nvalchemi's
 * [rows, 1] chunks) from all the units of the row at once: those in the decoded-chunk cache
 * pinned, and, when `fetch` (a plain array read in place) and the units are narrow
 * (ZIP_FETCH_BYTES), the others fetched and decoded side by side into the thread's `unit`
 * workspace (and cached). Each copy's rows then land whole in one pass (zb__rows_zip) instead
 * of one strided pass per unit and another per unit to re-base (PERFORMANCE.md, "nvalchemi's
 * own layout"). `key`: a buffer of `cap` bytes for unit keys. *done false: not such a row, or a
 * unit neither cached nor to be fetched here; nothing served. */
static zb_status
serve_columns(exec *x, size_t c0, size_t c1, uint64_t row, bool fetch, char *key, size_t cap,
              bool *done)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    zb__cache *cache = p->ds->cache;
    const int64_t *lut;
    uint64_t nlut;
    *done = false;
    fetch = fetch && u->inner[1] * u->itemsize <= ZIP_FETCH_BYTES;
    if ((!cache && !fetch) || u->ndim != 2 || u->grid[1] < 2 || u->grid[1] > ZIP_UNITS ||
        u->raw_rows || converted(p, cp->field, cp->child, &lut, &nlut))
        return ZB_OK;
    size_t K = (size_t)u->grid[1], k = 0, ub = (size_t)u->unit_bytes, missed = 0;
    const uint8_t *cols[ZIP_UNITS];
    void *pins[ZIP_UNITS] = {NULL};
    uint64_t g[ZB_MAX_DIMS] = {row};
    for (; k < K; k++) {
        g[1] = k;
        cols[k] = cache ? zb__cache_pin(cache, a, zb__unit_linear(u, g), ub, &pins[k]) : NULL;
        if (!cols[k] && !fetch) break;
        missed += !cols[k];
    }
    zb_status st = ZB_OK;
    if (k == K) {
        *done = true;
        x->t->stats.chunks_cached += K - missed;
        if (missed) st = zb__buf_reserve(&x->ctx->ws.unit, K * ub);
        for (k = 0; k < K && st == ZB_OK; k++) {
            if (cols[k]) continue;
            uint8_t *t = x->ctx->ws.unit.data + k * ub;
            g[1] = k;
            st = zb__array_unit_object(a, g, key, cap, NULL, NULL);
            if (st == ZB_OK) st = unit_into(x, a, g, NULL, 0, false, key, NULL, t);
            cols[k] = t;
        }
        bfield *bf = &p->b->fields[cp->field];
        vbound vb = value_bound(p, cp->field, cp->child);
        uint64_t rows = 0;
        for (size_t i = c0; i < c1 && st == ZB_OK; i++) {
            const copy *c = &p->copies[i];
            st = zb__rows_zip(p, c, cols, K, u->inner[1]);
            if (st == ZB_OK && vb.on) st = zb__rows_check(p, c, vb, NULL);
            rows += c->nrows;
        }
        x->t->stats.bytes_delivered += rows * bf->row_elems * bf->itemsize;
    }
    for (k = 0; k < K; k++) zb__cache_unpin(cache, pins[k]);
    return st;
}

/* Odometer over the unit coordinates of axes 1..nd-1. */
static bool
next_other(uint64_t *g, const uint64_t *grid, int nd)
{
    for (int d = nd - 1; d >= 1; d--) {
        if (++g[d] < grid[d]) return true;
        g[d] = 0;
    }
    return false;
}

static zb_status
truncated(const char *key, uint64_t got, uint64_t want, uint64_t off)
{
    return zb__err(ZB_E_TRUNCATED, "%s: holds %llu of the %llu bytes at offset %llu", key,
                   (unsigned long long)got, (unsigned long long)want, (unsigned long long)off);
}

/* Copies [c0, c1) of a raw unit of array a out of `src`, which holds the unit's stored bytes
 * from byte s0 on, into the batch (converted as they land for a converted field);
 * *delivered: the bytes delivered. */
static zb_status
raw_copy_out(exec *x, const zb__unit_geom *u, bfield *bf, size_t c0, size_t c1, const uint8_t *src,
             uint64_t s0, uint64_t *delivered)
{
    const copy *cp = &x->p->copies[c0];
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(x->p, cp->field, cp->child, &lut, &nlut);
    uint64_t srb = u->row_elems * u->itemsize, drb = bf->row_elems * bf->itemsize;
    uint64_t total = 0;
    vbound vb = value_bound(x->p, cp->field, cp->child);
    bool reb = rebased_here(x->p, cp->field);
    for (size_t i = c0; i < c1; i++) {
        const copy *c = &x->p->copies[i];
        uint64_t n = c->nrows * drb;
        uint8_t *to = bf->data + c->dst_row * drb;
        const uint8_t *from = src + (c->src_row * srb - s0);
        if (conv)
            ZB_TRY(rows_convert(x->p, c, vb, from, u->dtype, lut, nlut, u->path));
        else
            put_bytes(x->p, c->field, to, from, (size_t)n);
        total += n;
        ZB_TRY(landed(x->p, c, conv ? NO_CHECK : vb, from, reb, 0, bf->row_elems));
    }
    x->t->stats.bytes_delivered += total;
    if (delivered) *delivered = total;
    return ZB_OK;
}

/* Serves the copies [c0, c1) of one raw unit (zb__unit_geom.raw_rows) that starts at byte
 * `base` of the object `key` (0 for a chunk object, the inner chunk's offset in a shard): from
 * `obj` (the caller's view of the whole object) or a view of the store, else with reads merged
 * under ZB_MERGE_RAW_ROWS (copies come sorted by source row) into scratch, a lone copy read
 * straight into the batch. ZB_E_NOTFOUND (error cleared) when a chunk object does not exist. */
static zb_status
serve_raw(exec *x, size_t c0, size_t c1, const char *key, uint64_t base, const uint8_t *obj,
          uint64_t obj_len)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb__unit_geom *u = field_units(p, cp->field, cp->child);
    bfield *bf = &p->b->fields[cp->field];
    uint64_t row_bytes = u->row_elems * u->itemsize; /* as stored */
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(p, cp->field, cp->child, &lut, &nlut);
    /* a view of the bytes (a mapped file): every copy straight from it, no read calls */
    uint64_t lo = p->copies[c0].src_row * row_bytes, hi = lo;
    for (size_t i = c0; i < c1; i++) {
        uint64_t e = (p->copies[i].src_row + p->copies[i].nrows) * row_bytes;
        if (e > hi) hi = e;
    }
    const uint8_t *view = NULL;
    uint64_t got = 0;
    void *tok = NULL;
    zb_status vs;
    if (obj) { /* the caller's view of the whole object */
        uint64_t at = base + lo < obj_len ? base + lo : obj_len, left = obj_len - at;
        vs = ZB_OK;
        view = obj + at;
        got = left < hi - lo ? left : hi - lo;
    } else {
        vs = zb_store_view(u->store, key, base + lo, hi - lo, &view, &got, &tok);
    }
    if (vs == ZB_OK) {
        if (got != hi - lo) {
            zb_store_release(u->store, tok);
            return truncated(key, got, hi - lo, base + lo);
        }
        /* only the delivered bytes of a view are touched: they are what is fetched */
        uint64_t n = 0;
        zb_status st = raw_copy_out(x, u, bf, c0, c1, view, lo, &n);
        zb_store_release(u->store, tok);
        if (st != ZB_OK) return st;
        n = n / (bf->row_elems * bf->itemsize) * row_bytes; /* delivered rows, as stored */
        x->t->stats.bytes_fetched += n;
        x->t->stats.bytes_decoded += n;
        x->t->stats.range_reads++;
        x->t->stats.chunks_decoded++;
        return ZB_OK;
    }
    if (vs == ZB_E_NOTFOUND && base == 0) {
        zb_clear_error();
        return ZB_E_NOTFOUND;
    }
    if (vs != ZB_E_UNSUPPORTED) return vs;
    zb_clear_error();
    for (size_t i = c0; i < c1;) {
        uint64_t s0 = p->copies[i].src_row * row_bytes;
        uint64_t e0 = s0 + p->copies[i].nrows * row_bytes;
        size_t k = i + 1;
        for (; k < c1; k++)
            if (!zb__merge_joins(ZB_MERGE_RAW_ROWS, s0, &e0, p->copies[k].src_row * row_bytes,
                                 p->copies[k].nrows * row_bytes))
                break;
        uint64_t off = base + s0, len = e0 - s0;
        uint8_t *to = bf->data + p->copies[i].dst_row * bf->row_elems * bf->itemsize;
        /* a destination a few bytes off the source modulo the page slows the kernel's copy
         * several-fold (zb__buf_for_read): such a lone copy goes through scratch too, as do
         * converted values */
        uintptr_t skew = ((uintptr_t)to - (uintptr_t)off) & 4095;
        bool direct = !conv && k == i + 1 && (skew == 0 || (skew >= 64 && skew <= 4096 - 64));
        if (!direct) ZB_TRY(zb__buf_for_read(&x->ctx->ws.fetch, off, (size_t)len, &to));
        got = 0;
        zb_status st = zb_store_get(u->store, key, off, len, to, &got);
        if (st == ZB_E_NOTFOUND && i == c0 && base == 0) {
            zb_clear_error();
            return ZB_E_NOTFOUND;
        }
        if (st != ZB_OK) return st;
        if (got != len) return truncated(key, got, len, off);
        x->t->stats.range_reads++;
        x->t->stats.bytes_fetched += len;
        x->t->stats.bytes_decoded += len;
        if (!direct) {
            ZB_TRY(raw_copy_out(x, u, bf, i, k, to, s0, NULL));
        } else {
            x->t->stats.bytes_delivered += len;
            const copy *c = &p->copies[i];
            ZB_TRY(landed(p, c, value_bound(p, c->field, c->child), NULL, rebased_here(p, c->field),
                          0, bf->row_elems));
        }
        i = k;
    }
    x->t->stats.chunks_decoded++;
    return ZB_OK;
}

/* A unit already in the decoded-chunk cache needs no fetch (serve_unit copies it out). */
static bool
unit_cached(exec *x, const zb_array *a, const uint64_t *g)
{
    return x->p->ds->cache &&
           zb__cache_contains(x->p->ds->cache, a, zb__unit_linear(zb__array_units(a), g));
}

/* A unit a task must fetch: its bytes in the object, the copies it serves, its coordinates. */
typedef struct want {
    zb__span at; /* first: zb__merge_next reads wants as spans */
    size_t c0, c1;
    uint64_t g[ZB_MAX_DIMS];
    bool kept; /* listed: its bytes are in the fetch cache, pinned there (pin, kept_at) */
    void *pin;
    const uint8_t *kept_at;
} want;

static int
cmp_want(const void *x, const void *y)
{
    const want *a = x, *b = y;
    return a->at.off < b->at.off ? -1 : a->at.off > b->at.off;
}

/* The units of a task still to fetch (sorted by offset for a shard task), their object `key`
 * (a shard task's one shard; a plain task's units are each their own object). */
typedef struct wants {
    want *w;
    size_t n;
    bool now;  /* plain: fetch and serve each unit as it is met instead (nothing listed) */
    char *key; /* a buffer of cap bytes (the caller's, or malloc'd when own) */
    size_t cap;
    bool own;
} wants;

#define KEY_CAP 4600 /* a chunk key's bound (zb__meta_chunk_key) */

/* Fetches plain unit g (its object, whole: a view, or one read) and serves copies [c0, c1). */
static zb_status
plain_one(exec *x, const zb_array *a, const uint64_t *g, size_t c0, size_t c1, char *key,
          size_t cap)
{
    ZB_TRY(zb__array_unit_object(a, g, key, cap, NULL, NULL));
    const uint8_t *data = NULL;
    size_t len = 0;
    bool missing = false;
    void *tok = NULL;
    ZB_TRY(
        zb__unit_fetch_whole(a, key, &x->ctx->ws.fetch, &data, &len, &missing, &tok, &x->t->stats));
    zb_status st = serve_unit(x, c0, c1, g, data, len, missing, key, NULL);
    zb_store_release(zb__array_units(a)->store, tok);
    return st;
}

/* The unit rows [c0, c1) of a plain (unsharded) array: raw rows and cached units are served
 * at once, and so is every unit when ws->now (fetched as met); else the units to fetch are
 * listed in *ws (at: the whole object, up to zb__unit_fetch_bound bytes). */
static zb_status
plain_collect(exec *x, size_t c0, size_t c1, wants *ws)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    ws->n = 0;
    ws->w = NULL;
    if (zb__unit_row_units(u) == 0) return ZB_OK; /* a zero extent across: rows hold nothing */
    if (!ws->now) {
        uint64_t rows = 0;
        for (size_t i = c0; i < c1; i++)
            rows += i == c0 || p->copies[i].unit != p->copies[i - 1].unit;
        ws->w = malloc((size_t)(rows * zb__unit_row_units(u)) * sizeof *ws->w + 1);
        if (!ws->w) return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    }
    for (size_t i = c0, j; i < c1; i = j) {
        for (j = i + 1; j < c1 && p->copies[j].unit == p->copies[i].unit; j++) {}
        uint64_t g[ZB_MAX_DIMS] = {0};
        g[0] = p->copies[i].unit;
        if (u->raw_rows) { /* serve_raw converts as it copies */
            ZB_TRY(zb__array_unit_object(a, g, ws->key, ws->cap, NULL, NULL));
            zb_status st = serve_raw(x, i, j, ws->key, 0, NULL, 0);
            if (st == ZB_E_NOTFOUND) st = serve_unit(x, i, j, g, NULL, 0, true, ws->key, NULL);
            ZB_TRY(st);
            continue;
        }
        bool done = false;
        ZB_TRY(serve_columns(x, i, j, g[0], ws->now, ws->key, ws->cap, &done));
        if (done) continue;
        do {
            if (unit_cached(x, a, g)) {
                ZB_TRY(zb__array_unit_object(a, g, ws->key, ws->cap, NULL, NULL));
                ZB_TRY(serve_unit(x, i, j, g, NULL, 0, false, ws->key, NULL));
                continue;
            }
            if (ws->now) {
                ZB_TRY(plain_one(x, a, g, i, j, ws->key, ws->cap));
                continue;
            }
            want *w = &ws->w[ws->n++];
            *w = (want){.at = {0, zb__unit_fetch_bound(a)}, .c0 = i, .c1 = j};
            memcpy(w->g, g, sizeof g);
        } while (u->ndim > 1 && next_other(g, u->grid, u->ndim));
    }
    return ZB_OK;
}

/* One task's unit rows of one shard (raw: `obj` a view of the whole shard, or NULL) served
 * from the index entries [e_lo, ...) of the task: empty entries as fill, raw and cached units
 * at once, the rest listed in *ws. */
static zb_status
shard_walk(exec *x, size_t c0, size_t c1, const uint64_t *entries, uint64_t e_lo,
           const uint8_t *obj, uint64_t obj_len, wants *ws)
{
    plan *p = x->p;
    const zb_array *a = child_of(p->ds, p->copies[c0].child)->fields[p->copies[c0].field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    const char *key = ws->key;
    zb_status st = ZB_OK;
    for (size_t i = c0, j; i < c1 && st == ZB_OK; i = j) {
        for (j = i + 1; j < c1 && p->copies[j].unit == p->copies[i].unit; j++) {}
        uint64_t g[ZB_MAX_DIMS] = {0};
        g[0] = p->copies[i].unit;
        bool done = false;
        st = serve_columns(x, i, j, g[0], false, NULL, 0, &done);
        if (st != ZB_OK || done) continue;
        do {
            uint64_t e;
            st = zb__array_unit_object(a, g, NULL, 0, NULL, &e); /* key: the task's shard */
            if (st != ZB_OK) break;
            const uint64_t *ent = &entries[2 * (e - e_lo)]; /* the task's part of the index */
            if (ent[0] == ZB_SHARD_EMPTY) {
                st = serve_unit(x, i, j, g, NULL, 0, true, key, NULL);
            } else if (u->raw_rows) {
                if (ent[1] != u->unit_bytes)
                    st = zb__err(ZB_E_CORRUPT,
                                 "%s: inner chunk at offset %llu holds %llu bytes, "
                                 "expected %llu",
                                 key, (unsigned long long)ent[0], (unsigned long long)ent[1],
                                 (unsigned long long)u->unit_bytes);
                else
                    st = serve_raw(x, i, j, key, ent[0], obj, obj_len);
            } else if (unit_cached(x, a, g)) {
                /* a cached inner chunk needs neither a range read nor a decode */
                st = serve_unit(x, i, j, g, NULL, 0, false, key, ent);
            } else {
                want *w = &ws->w[ws->n++];
                *w = (want){.at = {ent[0], ent[1]}, .c0 = i, .c1 = j};
                memcpy(w->g, g, sizeof g);
            }
        } while (st == ZB_OK && u->ndim > 1 && next_other(g, u->grid, u->ndim));
    }
    return st;
}

/* The units a remote store's request fetches anyway: it joins wanted units of a shard that
 * lie at most its coalesce_gap apart into one request, and the units in such a gap come with
 * them. Listed as wants too (no copies: c0 == c1), their bytes land in the window's buffer and
 * go into the fetch cache with the wanted ones, so a later window does not fetch them again
 * (without this, a random epoch fetched each inner chunk 2.6 times, counting the gaps). Only
 * units of the task's rows (entries [e_lo, e_lo + e_n), the index part it read) that the cache
 * lacks; ws->w stays sorted by offset. */
static void
fill_gaps(exec *x, const zb_array *a, size_t c0, const uint64_t *entries, uint64_t e_lo,
          uint64_t e_n, wants *ws)
{
    zb__cache *fc = x->p->ds->fetch_cache;
    const zb__unit_geom *u = zb__array_units(a);
    uint64_t gap = zb__remote_store_gap(u->store);
    size_t n = ws->n;
    if (!fc || !gap || n < 2) return;
    /* the gaps a request spans: between neighbours to fetch (a cached one is not fetched) at
     * most `gap` apart; none, the usual case once the store is cached, and nothing is filled */
    bool *spanned = malloc(n), any = false;
    if (!spanned) return; /* an optimisation only */
    bool prev_cached = zb__cache_contains(fc, a, zb__unit_linear(u, ws->w[0].g));
    for (size_t k = 1; k < n; k++) {
        bool cached = zb__cache_contains(fc, a, zb__unit_linear(u, ws->w[k].g));
        const zb__span *prev = &ws->w[k - 1].at, *next = &ws->w[k].at;
        spanned[k] = !prev_cached && !cached && next->off >= prev->off + prev->len &&
                     next->off - (prev->off + prev->len) <= gap;
        any = any || spanned[k];
        prev_cached = cached;
    }
    uint64_t cps0 = u->per_shard[0], m_row = u->shard_units / cps0;
    uint64_t row0 = x->p->copies[c0].unit / cps0 * cps0; /* the shard's first unit row */
    for (uint64_t j = 0; any && j < e_n; j++) {
        uint64_t off = entries[2 * j], len = entries[2 * j + 1];
        if (off == ZB_SHARD_EMPTY || !len) continue;
        /* the first wanted unit at or after this one's end: a gap lies before it */
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (ws->w[mid].at.off < off + len)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == 0 || lo == n || !spanned[lo]) continue;
        if (off < ws->w[lo - 1].at.off + ws->w[lo - 1].at.len) continue;
        uint64_t e = e_lo + j, g[ZB_MAX_DIMS] = {0};
        if (row0 + e / m_row >= u->grid[0]) continue;
        zb__unit_coords(u, row0 + e / m_row, e % m_row, g);
        if (zb__cache_contains(fc, a, zb__unit_linear(u, g))) continue;
        want *w = &ws->w[ws->n++];
        *w = (want){.at = {off, len}, .c0 = c0, .c1 = c0};
        memcpy(w->g, g, sizeof g);
    }
    free(spanned);
    if (ws->n > n) qsort(ws->w, ws->n, sizeof *ws->w, cmp_want);
}

/* The unit rows [c0, c1) of one shard of a sharded array whose shards span every other axis:
 * one index lookup (through the dataset's index cache); raw, empty and cached units served at
 * once; the units to fetch listed in *ws, sorted by offset. */
static zb_status
shard_collect(exec *x, size_t c0, size_t c1, wants *ws)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    ws->n = 0;
    ws->w = NULL;
    if (zb__unit_row_units(u) == 0) return ZB_OK; /* a zero extent across: rows hold nothing */
    /* the task's unit rows, and the index entries they cover: the shard's inner chunks are
     * numbered in C order, so rows [r_lo, r_hi] of it hold entries [r_lo * m, (r_hi + 1) * m)
     * with m the inner chunks per row */
    size_t rows_u = 0;
    uint64_t u_lo = UINT64_MAX, u_hi = 0;
    for (size_t i = c0; i < c1; i++) {
        uint64_t r = p->copies[i].unit;
        if (i == c0 || r != p->copies[i - 1].unit) rows_u++;
        if (r < u_lo) u_lo = r;
        if (r > u_hi) u_hi = r;
    }
    uint64_t cps0 = u->per_shard[0], m_row = u->shard_units / cps0;
    uint64_t e_lo = u_lo % cps0 * m_row, e_n = (u_hi - u_lo + 1) * m_row;
    const uint8_t *obj = NULL; /* raw: a view of the whole shard */
    uint64_t obj_len = 0;
    void *obj_tok = NULL;
    uint64_t *entries = malloc((size_t)(2 * e_n * sizeof(uint64_t)));
    ws->n = 0;
    /* room for every unit of the task's rows: the wanted ones, and on the listed path the
     * ones between them that the store's request brings anyway (fill_gaps) */
    size_t cap_w = rows_u * (size_t)zb__unit_row_units(u);
    if (!ws->now && cap_w < e_n) cap_w = (size_t)e_n;
    ws->w = malloc(cap_w * sizeof *ws->w + 1);
    if (!entries || !ws->w) {
        free(entries);
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    }
    uint64_t g[ZB_MAX_DIMS] = {0};
    g[0] = cp->unit;
    zb_status st = zb__array_unit_object(a, g, ws->key, ws->cap, NULL, NULL);
    if (st == ZB_OK)
        st = zb__unit_shard_entries(a, x->ctx, p->ds->index_cache, g, e_lo, e_n, entries,
                                    &x->t->stats);
    /* raw inner chunks: one view of the whole shard serves every unit of the task */
    if (st == ZB_OK && u->raw_rows) {
        zb_status vs = zb_store_view(u->store, ws->key, 0, UINT64_MAX, &obj, &obj_len, &obj_tok);
        if (vs == ZB_OK && !obj) obj = (const uint8_t *)""; /* an empty shard: all truncated */
        if (vs != ZB_OK) {
            obj = NULL;
            if (vs == ZB_E_UNSUPPORTED || vs == ZB_E_NOTFOUND)
                zb_clear_error();
            else
                st = vs;
        }
    }
    if (st == ZB_OK) st = shard_walk(x, c0, c1, entries, e_lo, obj, obj_len, ws);
    zb_store_release(u->store, obj_tok);
    if (st == ZB_OK) qsort(ws->w, ws->n, sizeof *ws->w, cmp_want);
    if (st == ZB_OK && !ws->now) fill_gaps(x, a, c0, entries, e_lo, e_n, ws);
    free(entries);
    return st;
}

/* Serves the listed units of a shard task with one fetch (a view, or a read) per merged read. */
static zb_status
shard_serve(exec *x, const zb_array *a, const wants *ws)
{
    zb_status st = ZB_OK;
    for (size_t i = 0, k; i < ws->n && st == ZB_OK; i = k) {
        uint64_t ms, me;
        k = zb__merge_next(ws->w, sizeof *ws->w, i, ws->n, ZB_MERGE_UNITS, &ms, &me);
        const uint8_t *dst = NULL;
        void *tok = NULL;
        st = zb__unit_fetch(a, ws->key, ms, me - ms, &x->ctx->ws.fetch, &dst, &tok, &x->t->stats);
        for (size_t j = i; st == ZB_OK && j < k; j++) {
            const want *w = &ws->w[j];
            st = serve_unit(x, w->c0, w->c1, w->g, dst + (w->at.off - ms), (size_t)w->at.len, false,
                            ws->key, NULL);
        }
        zb_store_release(zb__array_units(a)->store, tok);
    }
    return st;
}

/* A plain or shard task on a store served in place: collect, then fetch and serve. */
static zb_status
run_units(exec *x, size_t c0, size_t c1)
{
    const copy *cp = &x->p->copies[c0];
    const zb_array *a = child_of(x->p->ds, cp->child)->fields[cp->field].arr;
    char key[KEY_CAP];
    wants ws = {.now = true, .key = key, .cap = sizeof key};
    if (zb__array_units(a)->kind == ZB_UNITS_PLAIN) return plain_collect(x, c0, c1, &ws);
    zb_status st = shard_collect(x, c0, c1, &ws);
    if (st == ZB_OK) st = shard_serve(x, a, &ws);
    free(ws.w);
    return st;
}

/* Arrays the unit path does not cover (whole-shard codecs, shards split along other axes).
 * A task holds every copy of one unit row: the rows they need are read once with a plain
 * row-range read (straight into the batch for a single copy, else into scratch) and the copies
 * are served from there, so duplicates and neighbours in one unit row cost one decode. */
static zb_status
run_rows(exec *x, size_t c0, size_t c1)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    const zb__unit_geom *u = zb__array_units(a);
    bfield *bf = &p->b->fields[cp->field];
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(p, cp->field, cp->child, &lut, &nlut);
    size_t row_bytes = (size_t)(bf->row_elems * bf->itemsize);
    size_t src_row_bytes = (size_t)(u->row_elems * u->itemsize); /* as stored */
    vbound vb = value_bound(p, cp->field, cp->child);
    bool reb = rebased_here(p, cp->field);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = c0; i < c1; i++) {
        uint64_t r0 = p->copies[i].unit * u->inner[0] + p->copies[i].src_row;
        if (r0 < lo) lo = r0;
        if (r0 + p->copies[i].nrows > hi) hi = r0 + p->copies[i].nrows;
    }
    size_t bytes = (size_t)(hi - lo) * src_row_bytes;
    uint8_t *band;
    if (c1 - c0 == 1 && !conv) {
        band = bf->data + cp->dst_row * row_bytes;
    } else {
        ZB_TRY(zb__buf_reserve(&x->ctx->ws.unit, bytes ? bytes : 1));
        band = x->ctx->ws.unit.data;
    }
    zb_ctx_stats before = x->ctx->stats;
    ZB_TRY(zb_array_read_rows(a, lo, hi, band, bytes, x->ctx));
    x->t->stats.chunks_decoded += x->ctx->stats.chunks_decoded - before.chunks_decoded;
    x->t->stats.chunks_filled += x->ctx->stats.chunks_filled - before.chunks_filled;
    x->t->stats.bytes_decoded += x->ctx->stats.bytes_decoded - before.bytes_decoded;
    x->t->stats.bytes_fetched += x->ctx->stats.bytes_fetched - before.bytes_fetched;
    x->t->stats.range_reads += x->ctx->stats.range_reads - before.range_reads;
    for (size_t i = c0; i < c1; i++) {
        const copy *c = &p->copies[i];
        uint64_t r0 = c->unit * u->inner[0] + c->src_row;
        if (conv)
            ZB_TRY(rows_convert(p, c, vb, band + (r0 - lo) * src_row_bytes, u->dtype, lut, nlut,
                                u->path));
        else if (c1 - c0 > 1)
            memcpy(bf->data + c->dst_row * row_bytes, band + (r0 - lo) * row_bytes,
                   (size_t)c->nrows * row_bytes);
        x->t->stats.bytes_delivered += c->nrows * row_bytes;
        ZB_TRY(landed(p, c, conv ? NO_CHECK : vb, band + (r0 - lo) * row_bytes, reb, 0,
                      bf->row_elems));
    }
    return ZB_OK;
}

/* The array a task reads. */
static const zb_array *
task_array(const plan *p, const task *t)
{
    const copy *cp = &p->copies[t->c0];
    return child_of(p->ds, cp->child)->fields[cp->field].arr;
}

/* Whether a task's reads go into the window's list read (its store reads lists itself). */
static bool
task_listed(const plan *p, const task *t)
{
    const zb_array *a = task_array(p, t);
    return zb__array_units(a)->kind != ZB_UNITS_ROWS && zb__unit_lists_ranges(a);
}

/* Runs one task of the in-place path (listed tasks are left to run_listed). */
static void
run_task(void *arg, zb_ctx *ctx)
{
    exec *x = arg;
    plan *p = x->p;
    x->ctx = ctx;
    const zb_array *a = task_array(p, x->t);
    if (zb__unit_lists_ranges(a) && zb__array_units(a)->kind != ZB_UNITS_ROWS) return;
    zb_status st;
    if (zb__array_units(a)->kind == ZB_UNITS_ROWS)
        st = run_rows(x, x->t->c0, x->t->c1);
    else
        st = run_units(x, x->t->c0, x->t->c1);
    if (st != ZB_OK) task_fail(x->t, st);
}

typedef struct drain {
    exec *xs;
    size_t n;
    _Atomic size_t next;
} drain;

static void
run_drain(void *arg, zb_ctx *ctx)
{
    drain *d = arg;
    for (size_t t; (t = atomic_fetch_add(&d->next, 1)) < d->n;) run_task(&d->xs[t], ctx);
    zb__stream_fence(); /* this worker's streamed rows before the request completes */
}

/* ---- the listed path ------------------------------------------------------------------------ */

/* One range of the window's list read and the units it holds, served as it arrives on a
 * thread of the pool, with its own statistics and failure (its `t`). */
typedef struct lread {
    exec x;
    task t;
    const zb_array *a;
    want *w; /* its units [w, w + nw), sorted by offset */
    size_t nw;
    char *key; /* the object (a shard task's wants.key, or the plain unit's own, malloc'd) */
    bool own_key;
    uint64_t off, len; /* its bytes of the object */
    zb_range *r;       /* its range in the list read */
    bool kept;         /* its units' bytes come from the fetch cache, not the store */
} lread;

typedef struct listed {
    plan *p;
    wants *ws; /* [ntasks]: each listed task's units to fetch */
    lread *reads;
    size_t nreads;
    zb_range *ranges; /* [nreads], grouped by store */
    size_t *order;    /* [nreads] the read behind each range */
    uint8_t *buf;     /* every range's bytes (the plan memory's, reused) */
    bool pooled;      /* decode on the pool (else on the calling thread, the work is small) */
    bool have_pool;   /* pooled: this read drives the pool now (it holds the dataset's pool_mu) */
    lread **waiting;  /* pooled: reads whose bytes are in, to serve (the queue of run_waiting) */
    _Atomic size_t nwaiting;     /* ... in the queue so far (the thread that receives adds) */
    _Atomic size_t waiting_next; /* the next of them a pool thread takes */
    _Atomic size_t drainers;     /* run_waiting jobs submitted and not yet ended */
    char keybuf[KEY_CAP];
    size_t base;  /* the current list read: ranges [base, base + n) */
    size_t ndone; /* ... of which completed */
    size_t nkept; /* reads served from the fetch cache: ranges and order [nreads - nkept, nreads) */
    _Atomic size_t kept_next; /* the next of them a pool thread takes */
} listed;

/* The fetch cache (zb_dataset_opts.fetch_cache_bytes) holds the encoded bytes of each unit
 * fetched, keyed by its array and its number in the unit grid: a unit that several windows need
 * is fetched once, as a local store's reads of it would hit the page cache. */

/* Whether unit w of array a is in the fetch cache: then it is pinned there until its read is
 * served (unkeep), so that the window does not find it evicted (by the other window's units,
 * over a store bigger than the cache) and fetch it alone, one round trip at a time on a decode
 * thread. A plain unit's length becomes its object's. */
static bool
keep(zb__cache *fc, const zb_array *a, want *w)
{
    const zb__unit_geom *u = zb__array_units(a);
    uint64_t unit = zb__unit_linear(u, w->g);
    size_t len = (size_t)w->at.len;
    if (!fc || (u->kind == ZB_UNITS_PLAIN && !zb__cache_length(fc, a, unit, &len))) return false;
    w->kept_at = zb__cache_pin(fc, a, unit, len, &w->pin);
    if (!w->kept_at) return false;
    w->at.len = len;
    w->kept = true;
    return true;
}

static void
unkeep(zb__cache *fc, want *w, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        zb__cache_unpin(fc, w[j].pin);
        w[j].pin = NULL;
        w[j].kept_at = NULL;
    }
}

static void
kept_put(const lread *rd)
{
    zb__cache *fc = rd->x.p->ds->fetch_cache;
    const zb__unit_geom *u = zb__array_units(rd->a);
    for (size_t j = 0; fc && j < rd->nw; j++) {
        const want *w = &rd->w[j];
        size_t len = rd->nw == 1 ? (size_t)rd->r->nread : (size_t)w->at.len;
        zb__cache_put(fc, rd->a, zb__unit_linear(u, w->g),
                      (const uint8_t *)rd->r->dst + (w->at.off - rd->off), len);
    }
}

/* Serves a kept read's units where the fetch cache holds them, pinned (no copy into the
 * window's range buffer, which holds no room for them), then unpins them. */
static zb_status
kept_serve(lread *rd)
{
    zb_status st = ZB_OK;
    for (size_t j = 0; j < rd->nw && st == ZB_OK; j++) {
        const want *w = &rd->w[j];
        if (w->c0 == w->c1) continue; /* a unit in a gap, kept for the fetch cache only */
        st = serve_unit(&rd->x, w->c0, w->c1, w->g, w->kept_at, (size_t)w->at.len, false, rd->key,
                        NULL);
    }
    unkeep(rd->x.p->ds->fetch_cache, rd->w, rd->nw);
    return st;
}

/* Serves the units of one completed range (a task of the pool). */
static void
serve_read(void *arg, zb_ctx *ctx)
{
    lread *rd = arg;
    rd->x.ctx = ctx;
    zb_range *r = rd->r;
    zb_status st = ZB_OK;
    bool plain = zb__array_units(rd->a)->kind == ZB_UNITS_PLAIN;
    if (rd->kept) {
        st = kept_serve(rd);
        if (st != ZB_OK) task_fail(&rd->t, st);
        zb__stream_fence();
        return;
    }
    /* fetched units go into the fetch cache (a plain unit when the object was read whole: it
     * ended within the bound) */
    if (r->status == ZB_OK && (plain ? r->nread < r->length : r->nread == r->length)) kept_put(rd);
    if (plain) {
        /* a missing object is fill; one that filled the bound is fetched again whole */
        const want *w = rd->w;
        bool missing = r->status == ZB_E_NOTFOUND, whole = r->nread < r->length;
        st = serve_unit(&rd->x, w->c0, w->c1, w->g, whole ? r->dst : NULL, (size_t)r->nread,
                        missing, rd->key, NULL);
    } else if (r->nread != r->length) {
        st = truncated(rd->key, r->nread, r->length, r->offset);
    }
    for (size_t j = 0; !plain && j < rd->nw && st == ZB_OK; j++) {
        const want *w = &rd->w[j];
        if (w->c0 == w->c1) continue; /* fetched for the fetch cache only (fill_gaps) */
        st = serve_unit(&rd->x, w->c0, w->c1, w->g,
                        (const uint8_t *)r->dst + (w->at.off - r->offset), (size_t)w->at.len, false,
                        rd->key, NULL);
    }
    if (st != ZB_OK) task_fail(&rd->t, st);
    zb__stream_fence();
}

/* Whether every unit of a shard read is in the fetch cache now: put there by a window read
 * since this one was listed (two windows that need the same units, read one after the other);
 * then they are pinned there. */
static bool
kept_now(listed *l, lread *rd)
{
    zb__cache *fc = l->p->ds->fetch_cache;
    const zb__unit_geom *u = zb__array_units(rd->a);
    if (!fc || u->kind == ZB_UNITS_PLAIN) return false; /* a plain read's length is a bound */
    want *w = rd->w;
    for (size_t j = 0; j < rd->nw; j++)
        if (!keep(fc, rd->a, &w[j])) {
            unkeep(fc, w, j);
            for (size_t k = 0; k < j; k++) w[k].kept = false;
            return false;
        }
    return true;
}

/* Serves the kept reads, each thread taking the next off a shared counter: one hand-off per
 * thread, not one wake-up per read (a window's kept reads are thousands of units). */
static void
run_kept(void *arg, zb_ctx *ctx)
{
    listed *l = arg;
    for (size_t k; (k = atomic_fetch_add(&l->kept_next, 1)) < l->nkept;)
        serve_read(&l->reads[l->order[l->nreads - 1 - k]], ctx);
}

/* The next read of the waiting queue, or NULL when it is empty now. */
static lread *
take_waiting(listed *l)
{
    size_t k = atomic_load(&l->waiting_next);
    while (k < atomic_load(&l->nwaiting))
        if (atomic_compare_exchange_weak(&l->waiting_next, &k, k + 1)) return l->waiting[k];
    return NULL;
}

/* Serves the waiting queue until it is empty (a drain job): the reads that arrived while
 * another read drove the pool, and those that arrive while it runs. One wake-up of a pool thread
 * serves every range that arrives while it is busy, not one each (a random window receives
 * thousands of ranges). Whoever adds to the queue starts a job when fewer than the pool's
 * threads run one (serve_now, start_drainer); a job that found the queue empty leaves, then
 * looks again: with both sides' steps sequentially consistent, either the adder saw it gone and
 * started another, or it sees the read added and goes on with it. */
static void
run_waiting(void *arg, zb_ctx *ctx)
{
    listed *l = arg;
    size_t jobs = (size_t)zb__pool_threads(l->p->ds->pool);
    for (;;) {
        for (lread *rd; (rd = take_waiting(l));) serve_read(rd, ctx);
        atomic_fetch_sub(&l->drainers, 1);
        if (atomic_load(&l->waiting_next) >= atomic_load(&l->nwaiting)) return;
        size_t d = atomic_load(&l->drainers);
        do
            if (d >= jobs) return; /* the running ones take it */
        while (!atomic_compare_exchange_weak(&l->drainers, &d, d + 1));
    }
}

/* Starts a drain job when the queue has reads and fewer than the pool's threads run one. */
static void
start_drainer(listed *l)
{
    zb__pool *pool = l->p->ds->pool;
    if (atomic_load(&l->drainers) >= (size_t)zb__pool_threads(pool)) return;
    atomic_fetch_add(&l->drainers, 1);
    zb__pool_submit(pool, run_waiting, l);
}

/* Makes this read the pool's driver (one read_many at a time drives it: pool_mu), blocking when
 * `wait`, else only when the pool is free; then hands it what was held back (the kept reads and
 * the ranges that arrived meanwhile), one drain job per thread. Until then the store's requests
 * run on: the loader's next window fetches while the window before it is decoded, instead of
 * starting its round trips only once that one is done. */
static bool
take_pool(listed *l, bool wait)
{
    pthread_mutex_t *mu = &l->p->ds->pool_mu;
    if (wait)
        pthread_mutex_lock(mu);
    else if (pthread_mutex_trylock(mu) != 0)
        return false;
    l->have_pool = true;
    zb__pool *pool = l->p->ds->pool;
    size_t jobs = (size_t)zb__pool_threads(pool);
    for (size_t j = 0; j < jobs && j < l->nkept; j++) zb__pool_submit(pool, run_kept, l);
    for (size_t j = 0; j < jobs && j < atomic_load(&l->nwaiting); j++) start_drainer(l);
    return true;
}

/* The units of a read whose bytes are in: decoded on the pool (held back while another read
 * drives it), or here when the work is small. */
static void
serve_now(listed *l, lread *rd)
{
    if (!l->pooled) {
        serve_read(rd, l->p->ctx);
        return;
    }
    size_t n = atomic_load(&l->nwaiting);
    l->waiting[n] = rd;
    atomic_store(&l->nwaiting, n + 1);
    if (l->have_pool || take_pool(l, false)) start_drainer(l);
}

/* A range completed (on the calling thread): its units go to the pool. */
static int
read_done(void *arg, size_t i)
{
    listed *l = arg;
    lread *rd = &l->reads[l->order[l->base + i]];
    const zb_range *r = rd->r;
    l->ndone++;
    bool plain = zb__array_units(rd->a)->kind == ZB_UNITS_PLAIN;
    if (r->status != ZB_OK && !(plain && r->status == ZB_E_NOTFOUND)) {
        task_fail(&rd->t, r->status); /* the message describes range i during this call */
        return 0;
    }
    if (r->status == ZB_OK) {
        rd->t.stats.range_reads++;
        rd->t.stats.bytes_fetched += r->nread;
    }
    serve_now(l, rd); /* kept there (serve_read), off the thread that receives */
    return 0;
}

/* Lists task t's reads: one per merged read of a shard task, one per unit of a plain task. */
static zb_status
list_task(listed *l, size_t t, size_t *nr, uint64_t *bytes)
{
    wants *ws = &l->ws[t];
    const zb_array *a = task_array(l->p, &l->p->tasks[t]);
    bool plain = zb__array_units(a)->kind == ZB_UNITS_PLAIN;
    for (size_t i = 0, k; i < ws->n; i = k) {
        uint64_t ms = ws->w[i].at.off, me = ms + ws->w[i].at.len;
        bool kept = ws->w[i].kept;
        /* a read joins touching units, all kept or all to fetch */
        for (k = i + 1; !plain && k < ws->n && ws->w[k].kept == kept; k++)
            if (!zb__merge_joins(ZB_MERGE_LISTED, ms, &me, ws->w[k].at.off, ws->w[k].at.len)) break;
        if (l->reads) {
            lread *rd = &l->reads[*nr];
            *rd = (lread){.x = {l->p, &rd->t, NULL},
                          .a = a,
                          .w = &ws->w[i],
                          .nw = k - i,
                          .key = ws->key,
                          .off = ms,
                          .len = me - ms,
                          .kept = kept};
            if (plain) {
                ZB_TRY(zb__array_unit_object(a, ws->w[i].g, ws->key, ws->cap, NULL, NULL));
                rd->key = strdup(ws->key);
                rd->own_key = true;
                if (!rd->key) return zb__err(ZB_E_NOMEM, "read_many: out of memory");
            }
        }
        (*nr)++;
        if (!kept) *bytes += me - ms; /* a kept read is served from the fetch cache */
    }
    return ZB_OK;
}

/* Collects every listed task (on the calling thread: what needs no fetch is served now) and
 * lists their reads (l->reads, in task order). */
/* The shard indexes the window's listed tasks need and the index cache lacks, read before any
 * task is collected: all in one round of requests, not one shard after another as each task
 * first needs its own (two round trips each in the window's critical path). */
static zb_status
prefetch_indexes(plan *p)
{
    const zb_array **arrays = malloc((p->ntasks + 1) * sizeof *arrays);
    uint64_t *rows = malloc((p->ntasks + 1) * sizeof *rows);
    size_t n = 0;
    zb_read_stats *rs = NULL;
    zb_status st = arrays && rows ? ZB_OK : zb__err(ZB_E_NOMEM, "read_many: out of memory");
    for (size_t t = 0; st == ZB_OK && t < p->ntasks; t++) {
        if (!task_listed(p, &p->tasks[t])) continue;
        arrays[n] = task_array(p, &p->tasks[t]);
        rows[n++] = p->copies[p->tasks[t].c0].unit;
        if (!rs) rs = &p->tasks[t].stats;
    }
    if (st == ZB_OK && n) {
        pthread_mutex_lock(&p->ds->fetch_mu);
        st = zb__unit_index_prefetch(p->ds->index_cache, arrays, rows, n, rs);
        pthread_mutex_unlock(&p->ds->fetch_mu);
    }
    free(arrays);
    free(rows);
    return st;
}

static zb_status
collect_listed(listed *l)
{
    plan *p = l->p;
    size_t nr = 0;
    uint64_t bytes = 0;
    ZB_TRY(prefetch_indexes(p));
    for (size_t t = 0; t < p->ntasks; t++) {
        if (!task_listed(p, &p->tasks[t])) continue;
        exec x = {p, &p->tasks[t], p->ctx};
        const zb_array *a = task_array(p, &p->tasks[t]);
        bool plain = zb__array_units(a)->kind == ZB_UNITS_PLAIN;
        wants *ws = &l->ws[t];
        ws->key = l->keybuf; /* plain tasks keep it as scratch (each read has its own key) */
        ws->cap = sizeof l->keybuf;
        zb_status st = plain ? plain_collect(&x, p->tasks[t].c0, p->tasks[t].c1, ws)
                             : shard_collect(&x, p->tasks[t].c0, p->tasks[t].c1, ws);
        if (st == ZB_OK && !plain) { /* the shard's key, for its reads */
            ws->key = strdup(l->keybuf);
            ws->cap = strlen(l->keybuf) + 1;
            ws->own = ws->key != NULL;
            if (!ws->key) st = zb__err(ZB_E_NOMEM, "read_many: out of memory");
        }
        if (st != ZB_OK) return task_fail(&p->tasks[t], st);
        for (size_t i = 0; p->ds->fetch_cache && i < ws->n; i++)
            if (ws->w[i].c0 < ws->w[i].c1) keep(p->ds->fetch_cache, a, &ws->w[i]);
        ZB_TRY(list_task(l, t, &nr, &bytes));
    }
    l->nreads = nr;
    l->reads = calloc(nr + 1, sizeof *l->reads);
    l->waiting = calloc(nr + 1, sizeof *l->waiting);
    l->ranges = calloc(nr + 1, sizeof *l->ranges);
    l->order = calloc(nr + 1, sizeof *l->order);
    /* a window's range bytes are megabytes: memory reused across reads, not mapped and
     * faulted in anew for each (DESIGN.md, performance model); grow_scratch, not doubled: a
     * doubled buffer of a large window passed PLAN_MEM_MAX_BYTES, so its plan memory was freed
     * after the read and the next window faulted in a new one (docs/PERFORMANCE.md, issue 17) */
    if (bytes < SIZE_MAX && grow_scratch(&p->m->fetched, &p->m->fetched_cap, (size_t)bytes + 1))
        l->buf = p->m->fetched;
    if (!l->reads || !l->waiting || !l->ranges || !l->order || !l->buf)
        return zb__err(ZB_E_NOMEM, "read_many: out of memory for %llu bytes of range reads",
                       (unsigned long long)bytes);
    nr = 0;
    bytes = 0;
    for (size_t t = 0; t < p->ntasks; t++)
        if (task_listed(p, &p->tasks[t])) ZB_TRY(list_task(l, t, &nr, &bytes));
    return ZB_OK;
}

/* Hands the reads of each store to it in one zb_store_get_ranges call; their units are served
 * as each range completes (read_done), then the pool is waited for. */
static zb_status
fetch_listed(listed *l)
{
    uint64_t at = 0;
    size_t done = 0, nkept = 0;
    zb_status st = ZB_OK;
    /* reads the fetch cache holds (ranges and order from the end) go to the pool first: the
     * thread that decodes one decodes it where the cache holds it (no bytes in l->buf) */
    for (size_t i = 0; i < l->nreads; i++) {
        lread *rd = &l->reads[i];
        if (!rd->kept) rd->kept = kept_now(l, rd);
        if (!rd->kept) continue;
        rd->r = &l->ranges[l->nreads - 1 - nkept];
        *rd->r = (zb_range){.key = rd->key, .offset = rd->off, .length = rd->len};
        l->order[l->nreads - 1 - nkept++] = i;
    }
    l->nkept = nkept;
    if (!l->pooled)
        run_kept(l, l->p->ctx);
    else
        take_pool(l, false); /* else they wait with the ranges that arrive */
    while (done < l->nreads - nkept && st == ZB_OK) {
        zb_store *store = NULL;
        size_t n0 = done;
        for (size_t i = 0; i < l->nreads; i++) {
            lread *rd = &l->reads[i];
            if (rd->r || (store && zb__array_units(rd->a)->store != store)) continue;
            store = zb__array_units(rd->a)->store;
            rd->r = &l->ranges[done];
            *rd->r = (zb_range){
                .key = rd->key, .offset = rd->off, .length = rd->len, .dst = l->buf + at};
            l->order[done++] = i;
            at += rd->len;
        }
        /* a range's failure (or a missing object) is its read's, told by read_done: the call
         * fails on its own only when some range never completed */
        l->base = n0;
        l->ndone = 0;
        st = zb_store_get_ranges(store, l->ranges + n0, done - n0, read_done, l);
        if (st != ZB_OK && l->ndone == done - n0) {
            zb_clear_error();
            st = ZB_OK;
        }
    }
    return st;
}

static void
free_listed(listed *l)
{
    for (size_t i = 0; l->reads && i < l->nreads; i++) {
        if (l->reads[i].own_key) free(l->reads[i].key);
        free(l->reads[i].t.msg);
    }
    for (size_t t = 0; l->ws && t < l->p->ntasks; t++) {
        if (l->ws[t].w) unkeep(l->p->ds->fetch_cache, l->ws[t].w, l->ws[t].n); /* unserved */
        free(l->ws[t].w);
        if (l->ws[t].own) free(l->ws[t].key);
    }
    free(l->ws);
    free(l->reads);
    free(l->waiting);
    free(l->ranges);
    free(l->order);
}

/* Fails the plan's first listed task with the first failure of a read, and adds the reads'
 * statistics to it. */
static void
settle_listed(listed *l)
{
    task *first = NULL;
    for (size_t t = 0; t < l->p->ntasks && !first; t++)
        if (task_listed(l->p, &l->p->tasks[t])) first = &l->p->tasks[t];
    for (size_t i = 0; first && i < l->nreads; i++) {
        const task *rt = &l->reads[i].t;
        zb_read_stats *s = &first->stats;
        s->chunks_decoded += rt->stats.chunks_decoded;
        s->chunks_cached += rt->stats.chunks_cached;
        s->chunks_filled += rt->stats.chunks_filled;
        s->bytes_fetched += rt->stats.bytes_fetched;
        s->bytes_decoded += rt->stats.bytes_decoded;
        s->bytes_delivered += rt->stats.bytes_delivered;
        s->range_reads += rt->stats.range_reads;
        if (rt->st != ZB_OK && first->st == ZB_OK) {
            first->st = rt->st;
            first->msg = rt->msg;
            l->reads[i].t.msg = NULL;
        }
    }
}

/* The listed path: the reads of every task whose store reads lists itself, in one list read
 * per store, decoded on the pool as they arrive. */
static void
run_listed(plan *p)
{
    listed l = {.p = p, .pooled = p->work > p->ds->opts.inline_work_bytes};
    l.ws = calloc(p->ntasks + 1, sizeof *l.ws);
    zb_status st = l.ws ? collect_listed(&l) : zb__err(ZB_E_NOMEM, "read_many: out of memory");
    if (st == ZB_OK) {
        st = fetch_listed(&l); /* takes the pool when it is free (take_pool) */
        if (l.pooled) {
            if (!l.have_pool) take_pool(&l, true);
            zb__pool_wait(p->ds->pool);
            pthread_mutex_unlock(&p->ds->pool_mu);
        }
    }
    settle_listed(&l);
    if (st != ZB_OK)
        for (size_t t = 0; t < p->ntasks; t++)
            if (task_listed(p, &p->tasks[t]) && p->tasks[t].st == ZB_OK) {
                task_fail(&p->tasks[t], st);
                break;
            }
    free_listed(&l);
}

/* ---- running a plan ------------------------------------------------------------------------ */

/* Runs the in-place tasks: one drain job per worker, each taking the next task off a shared
 * counter, so a request of thousands of small tasks costs a handful of queue hand-offs, not
 * one (with a thread wake-up) per task. */
static void
run_in_place(plan *p, exec *xs)
{
    drain dr = {xs, p->ntasks, 0};
    if (p->work <= p->ds->opts.inline_work_bytes) {
        /* too little to share (zb_dataset_opts.inline_work_bytes): waking the pool and waiting
         * for it costs more than decoding this little on the calling thread (PERFORMANCE.md,
         * "What moved the numbers" 22); a loader's two workers still read two windows at once */
        run_drain(&dr, p->ctx);
        return;
    }
    pthread_mutex_lock(&p->ds->pool_mu);
    size_t jobs = (size_t)zb__pool_threads(p->ds->pool);
    if (jobs > p->ntasks) jobs = p->ntasks;
    for (size_t j = 0; j < jobs; j++) zb__pool_submit(p->ds->pool, run_drain, &dr);
    zb__pool_wait(p->ds->pool);
    pthread_mutex_unlock(&p->ds->pool_mu);
}

zb_status
zb__exec_run(plan *p)
{
    zb__plan_mem *m = p->m;
    if (!grow_array((void **)&m->xs, &m->xs_cap, p->ntasks + 1, sizeof *m->xs))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    bool any_listed = false, any_in_place = false;
    for (size_t t = 0; t < p->ntasks; t++) {
        m->xs[t] = (exec){p, &p->tasks[t], NULL};
        bool lists = task_listed(p, &p->tasks[t]);
        any_listed = any_listed || lists;
        any_in_place = any_in_place || !lists;
    }
    /* (a remote store's read has no task in place: it does not wait for the pool here) */
    if (any_in_place) run_in_place(p, m->xs);
    if (any_listed) run_listed(p);
    zb_read_stats *s = &p->b->stats;
    for (size_t t = 0; t < p->ntasks; t++) {
        const task *tk = &p->tasks[t];
        s->chunks_decoded += tk->stats.chunks_decoded;
        s->chunks_cached += tk->stats.chunks_cached;
        s->chunks_filled += tk->stats.chunks_filled;
        s->bytes_fetched += tk->stats.bytes_fetched;
        s->bytes_decoded += tk->stats.bytes_decoded;
        s->bytes_delivered += tk->stats.bytes_delivered;
        s->range_reads += tk->stats.range_reads;
    }
    for (size_t t = 0; t < p->ntasks; t++)
        if (p->tasks[t].st != ZB_OK) {
            const char *msg = p->tasks[t].msg;
            return zb__err(p->tasks[t].st, "%s", msg ? msg : "read_many: a read failed");
        }
    return ZB_OK;
}
