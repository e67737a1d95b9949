/* Read accounting and the decode-only limit of `zbatch bench` (see bench_decode.h). The units
 * are the reader's own plan (zb__dataset_plan_units), located, fetched and decoded through the
 * zarr unit API (src/zarr/unit.h): this file plans nothing of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_decode.h"
#include "dataset/dataset.h"
#include "util/pool.h"
#include "util/stream.h"
#include "util/status.h"
#include "zarr/unit.h"

#define KEY_CAP 4600 /* the reader's bound on a chunk key */
#define TASKS_PER_THREAD 8

double
zb__bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the units of a request ---------------------------------------------------------------- */

static zb_status
push(zb__bench_units *s, const zb_array *a, uint64_t g0, uint64_t other)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        zb__bench_unit *u = realloc(s->u, cap * sizeof *u);
        if (!u) return zb__err(ZB_E_NOMEM, "bench: out of memory for the unit list");
        s->u = u;
        s->cap = cap;
    }
    s->u[s->n++] = (zb__bench_unit){.arr = a, .g0 = g0, .other = other};
    return ZB_OK;
}

zb_status
zb__bench_units_add(zb_dataset *ds, const uint64_t *ids, size_t n, zb_ctx *ctx, zb__bench_units *s)
{
    (void)ctx; /* the plan reads pointers with its own context */
    zb__plan_unit *rows = NULL;
    size_t nrows = 0;
    uint64_t delivered = 0;
    ZB_TRY(zb__dataset_plan_units(ds, ids, n, &rows, &nrows, &delivered));
    s->bytes_delivered += delivered;
    zb_status st = ZB_OK;
    for (size_t i = 0; i < nrows && st == ZB_OK; i++) {
        uint64_t no = zb__unit_row_units(zb__array_units(rows[i].arr));
        for (uint64_t o = 0; o < no && st == ZB_OK; o++) st = push(s, rows[i].arr, rows[i].g0, o);
    }
    free(rows);
    return st;
}

/* ---- resolving and fetching ---------------------------------------------------------------- */

static int
cmp_unit(const void *x, const void *y)
{
    const zb__bench_unit *a = x, *b = y;
    if (a->arr != b->arr) return a->arr < b->arr ? -1 : 1;
    if (a->g0 != b->g0) return a->g0 < b->g0 ? -1 : 1;
    return a->other < b->other ? -1 : a->other > b->other;
}

zb_status
zb__bench_units_resolve(zb__bench_units *s, zb_ctx *ctx)
{
    if (s->n) qsort(s->u, s->n, sizeof *s->u, cmp_unit);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (k == 0 || cmp_unit(&s->u[k - 1], &s->u[i])) s->u[k++] = s->u[i];
    s->n = k;
    char *key = malloc(KEY_CAP);
    zb__cache *index_cache = NULL; /* shard indexes, read once per shard */
    zb_status st = key ? zb__cache_new((size_t)64 << 20, &index_cache)
                       : zb__err(ZB_E_NOMEM, "bench: out of memory");
    for (size_t i = 0; i < s->n && st == ZB_OK; i++) {
        zb__bench_unit *u = &s->u[i];
        const zb__unit_geom *geom = zb__array_units(u->arr);
        if (geom->kind == ZB_UNITS_ROWS) {
            /* estimated by unit; the reader reads row bands of these */
            u->skip = true;
            s->skipped++;
            s->bytes_decoded += geom->unit_bytes;
            continue;
        }
        uint64_t g[ZB_MAX_DIMS];
        zb__unit_coords(geom, u->g0, u->other, g);
        st = zb__unit_locate(u->arr, ctx, index_cache, g, key, KEY_CAP, &u->off, &u->len,
                             &u->missing, NULL);
        if (st == ZB_OK && !u->missing) {
            s->bytes_decoded += geom->unit_bytes;
            s->bytes_encoded += u->len;
            s->ndecoded++;
        }
    }
    zb__cache_free(index_cache);
    free(key);
    return st;
}

/* Fetches units [i0, i1) (one store) with one list read. */
static zb_status
fetch_list(zb__bench_units *s, size_t i0, size_t i1)
{
    size_t n = 0;
    for (size_t i = i0; i < i1; i++) n += !s->u[i].missing && !s->u[i].skip && !s->u[i].enc;
    zb_range *r = calloc(n + 1, sizeof *r);
    char *key = malloc(KEY_CAP);
    zb_status st = r && key ? ZB_OK : zb__err(ZB_E_NOMEM, "bench: out of memory");
    size_t k = 0;
    for (size_t i = i0; i < i1 && st == ZB_OK; i++) {
        zb__bench_unit *u = &s->u[i];
        if (u->missing || u->skip || u->enc) continue;
        uint64_t g[ZB_MAX_DIMS];
        zb__unit_coords(zb__array_units(u->arr), u->g0, u->other, g);
        st = zb__array_unit_object(u->arr, g, key, KEY_CAP, NULL, NULL);
        char *own = st == ZB_OK ? strdup(key) : NULL;
        u->enc = own ? malloc((size_t)u->len + 1) : NULL;
        if (st == ZB_OK && !u->enc) {
            free(own);
            st = zb__err(ZB_E_NOMEM, "bench: out of memory for %llu encoded bytes of %s",
                         (unsigned long long)u->len, key);
            break;
        }
        r[k++] = (zb_range){.key = own, .offset = u->off, .length = u->len, .dst = u->enc};
    }
    if (st == ZB_OK && k)
        st = zb_store_get_ranges(zb__array_units(s->u[i0].arr)->store, r, k, NULL, NULL);
    for (size_t j = 0; j < k && st == ZB_OK; j++)
        if (r[j].nread != r[j].length)
            st = zb__err(ZB_E_TRUNCATED, "%s: read %llu of %llu bytes", r[j].key,
                         (unsigned long long)r[j].nread, (unsigned long long)r[j].length);
    for (size_t j = 0; j < k; j++) free((char *)r[j].key);
    free(r);
    free(key);
    return st;
}

zb_status
zb__bench_units_fetch(zb__bench_units *s)
{
    /* units come sorted by array: each run of one store is one list read */
    zb_status st = ZB_OK;
    for (size_t i = 0, j; i < s->n && st == ZB_OK; i = j) {
        zb_store *store = zb__array_units(s->u[i].arr)->store;
        for (j = i + 1; j < s->n && zb__array_units(s->u[j].arr)->store == store; j++) {}
        st = fetch_list(s, i, j);
    }
    return st;
}

void
zb__bench_units_clear(zb__bench_units *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->u[i].enc);
    s->n = 0;
    s->bytes_delivered = s->bytes_decoded = s->bytes_encoded = 0;
    s->ndecoded = s->skipped = 0;
}

void
zb__bench_units_free(zb__bench_units *s)
{
    zb__bench_units_clear(s);
    free(s->u);
    memset(s, 0, sizeof *s);
}

/* ---- the decode-only loop ------------------------------------------------------------------ */

typedef struct dec_task {
    const zb__bench_unit *u;
    size_t n;
    uint8_t *out; /* one unit's decoded bytes, reused across the task's units */
    size_t off;   /* decode + write: the task's first byte in the arena */
    uint8_t *dst; /* ... and its address (NULL: decode only) */
    double share; /* decode + write: the part of each unit's bytes written (delivered/decoded) */
    bool stream;  /* decode + write: with streamed stores (the reader's rule, util/stream.h) */
    uint64_t bytes, written;
    zb_status st;
    char msg[512];
} dec_task;

struct zb__bench_decoder {
    zb__pool *pool;
    size_t ntasks;
    dec_task *tasks;
    uint8_t *arena; /* decode + write: every unit's share in its own place, request-sized */
    size_t arena_cap;
};

/* The bytes of a decoded unit of `ub` bytes that decode + write stores: its share of the
 * request's delivered bytes. */
static size_t
unit_share(size_t ub, double share)
{
    size_t n = (size_t)((double)ub * share);
    return n < ub ? n : ub;
}

static void
decode_task(void *arg, zb_ctx *ctx)
{
    dec_task *t = arg;
    for (size_t i = 0; i < t->n && t->st == ZB_OK; i++) {
        const zb__bench_unit *u = &t->u[i];
        if (!u->enc) continue;
        t->st = zb__array_decode_unit(u->arr, ctx, u->enc, (size_t)u->len, t->out, "bench");
        if (t->st != ZB_OK) {
            snprintf(t->msg, sizeof t->msg, "%s", zb_last_error());
            break;
        }
        size_t ub = (size_t)zb__array_units(u->arr)->unit_bytes;
        if (t->dst) {
            size_t w = unit_share(ub, t->share);
            if (t->stream)
                zb__stream_copy(t->dst, t->out, w);
            else
                memcpy(t->dst, t->out, w);
            t->dst += w;
            t->written += w;
        }
        t->bytes += ub;
    }
    if (t->dst && t->stream) zb__stream_fence();
}

static uint64_t
max_unit_bytes(const zb_dataset *ds)
{
    uint64_t m = 0;
    if (ds->nchildren) {
        for (size_t c = 0; c < ds->nchildren; c++) {
            uint64_t x = max_unit_bytes(ds->children[c]);
            if (x > m) m = x;
        }
        return m;
    }
    for (size_t f = 0; f < ds->nfields; f++) {
        const zb__field *fd = &ds->fields[f];
        uint64_t x = fd->itemsize ? zb__array_units(fd->arr)->unit_bytes : 0;
        if (x > m) m = x;
    }
    return m;
}

zb_status
zb__bench_decoder_new(zb_dataset *ds, int threads, zb__bench_decoder **out)
{
    *out = NULL;
    zb__bench_decoder *d = calloc(1, sizeof *d);
    if (!d) return zb__err(ZB_E_NOMEM, "bench: out of memory");
    d->ntasks = (size_t)(threads > 1 ? threads : 1) * TASKS_PER_THREAD;
    d->tasks = calloc(d->ntasks, sizeof *d->tasks);
    zb_status st = d->tasks ? ZB_OK : zb__err(ZB_E_NOMEM, "bench: out of memory");
    size_t maxb = (size_t)max_unit_bytes(ds);
    for (size_t k = 0; k < d->ntasks && st == ZB_OK; k++) {
        /* touched once here so that page faults of fresh buffers stay out of the timed loop */
        d->tasks[k].out = malloc(maxb + 1);
        if (d->tasks[k].out)
            memset(d->tasks[k].out, 0, maxb + 1);
        else
            st = zb__err(ZB_E_NOMEM, "bench: out of memory for decode buffers");
    }
    if (st == ZB_OK) st = zb__pool_new(threads, &d->pool);
    if (st != ZB_OK) {
        zb__bench_decoder_free(d);
        return st;
    }
    *out = d;
    return ZB_OK;
}

/* Makes the arena hold `need` bytes, every page touched (page faults stay out of the loop). */
static zb_status
arena_reserve(zb__bench_decoder *d, size_t need)
{
    if (need <= d->arena_cap) return ZB_OK;
    free(d->arena);
    d->arena_cap = 0;
    d->arena = malloc(need);
    if (!d->arena) return zb__err(ZB_E_NOMEM, "bench: out of memory for %zu decoded bytes", need);
    memset(d->arena, 0, need);
    d->arena_cap = need;
    return ZB_OK;
}

zb_status
zb__bench_decoder_run(zb__bench_decoder *d, const zb__bench_units *s, bool write,
                      zb__bench_decode_result *res)
{
    memset(res, 0, sizeof *res);
    if (!s->n) return ZB_OK;
    size_t nt = d->ntasks < s->n ? d->ntasks : s->n;
    size_t per = (s->n + nt - 1) / nt;
    double share = s->bytes_decoded ? (double)s->bytes_delivered / (double)s->bytes_decoded : 0;
    size_t at = 0;
    for (size_t k = 0; k < nt; k++) {
        size_t lo = k * per, hi = lo + per > s->n ? s->n : lo + per;
        dec_task *t = &d->tasks[k];
        t->u = s->u + (lo < s->n ? lo : s->n);
        t->n = hi > lo ? hi - lo : 0;
        t->share = share;
        t->bytes = t->written = 0;
        t->st = ZB_OK;
        t->msg[0] = '\0';
        t->off = at;
        for (size_t i = 0; write && i < t->n; i++)
            if (t->u[i].enc)
                at += unit_share((size_t)zb__array_units(t->u[i].arr)->unit_bytes, share);
    }
    if (write) ZB_TRY(arena_reserve(d, at ? at : 1)); /* every unit's share, at its place */
    res->streamed = write && at >= ZB_STREAM_MIN_BATCH_BYTES;
    for (size_t k = 0; k < nt; k++) {
        d->tasks[k].dst = write ? d->arena + d->tasks[k].off : NULL;
        d->tasks[k].stream = res->streamed;
    }
    double t0 = zb__bench_now();
    for (size_t k = 0; k < nt; k++) zb__pool_submit(d->pool, decode_task, &d->tasks[k]);
    zb__pool_wait(d->pool);
    res->seconds = zb__bench_now() - t0;
    for (size_t k = 0; k < nt; k++) {
        if (d->tasks[k].st != ZB_OK) return zb__err(d->tasks[k].st, "%s", d->tasks[k].msg);
        res->bytes_decoded += d->tasks[k].bytes;
        res->bytes_written += d->tasks[k].written;
    }
    return ZB_OK;
}

void
zb__bench_decoder_free(zb__bench_decoder *d)
{
    if (!d) return;
    zb__pool_free(d->pool);
    for (size_t k = 0; d->tasks && k < d->ntasks; k++) free(d->tasks[k].out);
    free(d->tasks);
    free(d->arena);
    free(d);
}
