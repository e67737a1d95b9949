/* Read accounting and the decode-only limit of `zbatch bench` (see bench_decode.h). The unit
 * planning follows the reader (src/dataset/reader.c) and bench/read_many.c, extended to
 * collections and to arrays chunked along more than axis 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_decode.h"
#include "dataset/dataset.h"
#include "util/pool.h"
#include "util/stream.h"
#include "util/status.h"
#include "zarr/array.h"
#include "zarr/shard.h"

#define KEY_CAP 4600 /* the reader's bound on a chunk key */
#define TASKS_PER_THREAD 8

double
zb_bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- planning ------------------------------------------------------------------------------ */

static uint64_t
grid_len(const zb_array *a, int d)
{
    return (a->meta.shape[d] + a->inner[d] - 1) / a->inner[d];
}

/* Units of the other axes (1..ndim-1) per axis-0 unit. */
static uint64_t
other_units(const zb_array *a)
{
    uint64_t n = 1;
    for (int d = 1; d < a->meta.ndim; d++) n *= grid_len(a, d);
    return n;
}

/* The reader serves these arrays by row bands, not by unit (reader.c, path_of). */
static bool
read_by_rows(const zb_array *a)
{
    if (a->meta.chain.ab != ZB_AB_SHARDING) return false;
    if (zb_array_whole_shard(a)) return true;
    for (int d = 1; d < a->meta.ndim; d++)
        if (a->meta.chunks[d] < a->meta.shape[d]) return true;
    return false;
}

static zb_status
push(zb_bench_units *s, const zb_array *a, uint64_t g0, uint64_t other)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        zb_bench_unit *u = realloc(s->u, cap * sizeof *u);
        if (!u) return zb_err(ZB_E_NOMEM, "bench: out of memory for the unit list");
        s->u = u;
        s->cap = cap;
    }
    s->u[s->n++] = (zb_bench_unit){.arr = a, .g0 = g0, .other = other};
    return ZB_OK;
}

/* Adds every unit of rows [r0, r1) of `a` (all of its other axes). `last` remembers the last
 * axis-0 unit added for this array, so runs of neighbouring samples add each unit once. */
static zb_status
add_rows(zb_bench_units *s, const zb_array *a, uint64_t r0, uint64_t r1, uint64_t *last)
{
    if (r1 <= r0) return ZB_OK;
    uint64_t U = a->inner[0], no = other_units(a);
    for (uint64_t u = r0 / U; u <= (r1 - 1) / U; u++) {
        if (u == *last) continue;
        *last = u;
        for (uint64_t o = 0; o < no; o++) ZB_TRY(push(s, a, u, o));
    }
    return ZB_OK;
}

/* The child (its number in *child) and the physical row of logical id `id` (the reader's
 * locate()). */
static zb_dataset *
locate(zb_dataset *ds, uint64_t id, size_t *child, uint64_t *phys)
{
    *child = 0;
    if (!ds->nchildren) {
        *phys = zb_mask_select(&ds->mask, id);
        return ds;
    }
    size_t lo = 0, hi = ds->nchildren;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (ds->child_start[mid] <= id)
            lo = mid;
        else
            hi = mid;
    }
    zb_dataset *ch = ds->children[lo];
    *child = lo;
    *phys = zb_mask_select(&ch->mask, id - ds->child_start[lo]);
    return ch;
}

zb_status
zb_bench_units_add(zb_dataset *ds, const uint64_t *ids, size_t n, zb_ctx *ctx, zb_bench_units *s)
{
    uint64_t nlogical = 0;
    ZB_TRY(zb_dataset_len(ds, &nlogical));
    for (size_t c = 0; c < ds->nchildren; c++) ZB_TRY(zb_mask_load(ds->children[c]));
    const zb_dataset *pr = ds->nchildren ? ds->children[0] : ds;
    size_t nf = pr->nfields, ns = pr->nsegs;
    uint64_t *last = malloc((nf * (ds->nchildren + 1) + 1) * sizeof *last);
    if (!last) return zb_err(ZB_E_NOMEM, "bench: out of memory");
    for (size_t k = 0; k < nf * (ds->nchildren + 1); k++) last[k] = UINT64_MAX;
    zb_status st = ZB_OK;
    for (size_t i = 0; i < n && st == ZB_OK; i++) {
        if (ids[i] >= nlogical) {
            st = zb_err(ZB_E_RANGE, "bench: sample id %llu outside [0, %llu)",
                        (unsigned long long)ids[i], (unsigned long long)nlogical);
            break;
        }
        uint64_t p = 0;
        size_t c = 0;
        zb_dataset *ch = locate(ds, ids[i], &c, &p);
        int64_t r0[ZB_MAX_SEGMENTS], r1[ZB_MAX_SEGMENTS];
        for (size_t g = 0; g < ns && st == ZB_OK; g++) {
            st = zb_segment_get(&ch->segs[g], ctx, p, &r0[g]);
            if (st == ZB_OK) st = zb_segment_get(&ch->segs[g], ctx, p + 1, &r1[g]);
            if (st == ZB_OK && (r0[g] < 0 || r1[g] < r0[g]))
                st = zb_err(ZB_E_CORRUPT, "%s: pointers at sample %llu are not monotone",
                            ch->segs[g].ptr->path, (unsigned long long)p);
        }
        for (size_t f = 0; f < nf && st == ZB_OK; f++) {
            const zb_field *fd = &ch->fields[f];
            if (!fd->itemsize) continue; /* string fields are not read into batches */
            uint64_t a0 = p, a1 = p + 1;
            if (fd->seg >= 0) {
                a0 = (uint64_t)r0[fd->seg];
                a1 = (uint64_t)r1[fd->seg];
            }
            s->bytes_delivered += (a1 - a0) * fd->row_elems * fd->itemsize;
            st = add_rows(s, fd->arr, a0, a1, &last[c * nf + f]);
        }
    }
    free(last);
    return st;
}

/* ---- resolving and fetching ---------------------------------------------------------------- */

static int
cmp_unit(const void *x, const void *y)
{
    const zb_bench_unit *a = x, *b = y;
    if (a->arr != b->arr) return a->arr < b->arr ? -1 : 1;
    if (a->g0 != b->g0) return a->g0 < b->g0 ? -1 : 1;
    return a->other < b->other ? -1 : a->other > b->other;
}

/* The unit's grid coordinates. */
static void
unit_coords(const zb_bench_unit *u, uint64_t *g)
{
    const zb_array *a = u->arr;
    memset(g, 0, sizeof(uint64_t) * ZB_MAX_DIMS);
    g[0] = u->g0;
    uint64_t rest = u->other;
    for (int d = a->meta.ndim - 1; d >= 1; d--) {
        uint64_t len = grid_len(a, d);
        g[d] = rest % len;
        rest /= len;
    }
}

/* The last shard index read, kept while consecutive units fall in the same shard. */
typedef struct shard_memo {
    const zb_array *arr;
    uint64_t shard[ZB_MAX_DIMS];
    uint64_t *entries; /* NULL: the shard does not exist */
    bool valid;
} shard_memo;

static zb_status
locate_unit(zb_bench_unit *u, zb_ctx *ctx, shard_memo *m, char *key)
{
    const zb_array *a = u->arr;
    uint64_t g[ZB_MAX_DIMS], shard[ZB_MAX_DIMS] = {0}, entry = 0;
    unit_coords(u, g);
    ZB_TRY(zb_array_unit_object(a, g, key, KEY_CAP, shard, &entry));
    if (a->meta.chain.ab == ZB_AB_SHARDING) {
        size_t sb = sizeof(uint64_t) * (size_t)a->meta.ndim;
        if (!m->valid || m->arr != a || memcmp(m->shard, shard, sb)) {
            free(m->entries);
            m->entries = NULL;
            m->valid = false;
            uint64_t nn = 0;
            bool missing = false;
            ZB_TRY(zb_array_shard_index(a, ctx, shard, &m->entries, &nn, &missing));
            m->arr = a;
            memcpy(m->shard, shard, sb);
            m->valid = true;
        }
        if (!m->entries || m->entries[2 * entry] == ZB_SHARD_EMPTY) {
            u->missing = true;
            return ZB_OK;
        }
        u->off = m->entries[2 * entry];
        u->len = m->entries[2 * entry + 1];
        return ZB_OK;
    }
    uint64_t size = 0;
    zb_status st = zb_store_size(a->store, key, &size);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        u->missing = true;
        return ZB_OK;
    }
    ZB_TRY(st);
    u->off = 0;
    u->len = size;
    return ZB_OK;
}

zb_status
zb_bench_units_resolve(zb_bench_units *s, zb_ctx *ctx)
{
    if (s->n) qsort(s->u, s->n, sizeof *s->u, cmp_unit);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (k == 0 || cmp_unit(&s->u[k - 1], &s->u[i])) s->u[k++] = s->u[i];
    s->n = k;
    char *key = malloc(KEY_CAP);
    if (!key) return zb_err(ZB_E_NOMEM, "bench: out of memory");
    shard_memo memo = {0};
    zb_status st = ZB_OK;
    for (size_t i = 0; i < s->n && st == ZB_OK; i++) {
        zb_bench_unit *u = &s->u[i];
        if (read_by_rows(u->arr)) {
            /* estimated by unit; the reader reads row bands of these */
            u->skip = true;
            s->skipped++;
            s->bytes_decoded += zb_array_unit_bytes(u->arr);
            continue;
        }
        st = locate_unit(u, ctx, &memo, key);
        if (st == ZB_OK && !u->missing) {
            s->bytes_decoded += zb_array_unit_bytes(u->arr);
            s->bytes_encoded += u->len;
            s->ndecoded++;
        }
    }
    free(memo.entries);
    free(key);
    return st;
}

zb_status
zb_bench_units_fetch(zb_bench_units *s)
{
    char *key = malloc(KEY_CAP);
    if (!key) return zb_err(ZB_E_NOMEM, "bench: out of memory");
    zb_status st = ZB_OK;
    for (size_t i = 0; i < s->n && st == ZB_OK; i++) {
        zb_bench_unit *u = &s->u[i];
        if (u->missing || u->skip || u->enc) continue;
        uint64_t g[ZB_MAX_DIMS];
        unit_coords(u, g);
        st = zb_array_unit_object(u->arr, g, key, KEY_CAP, NULL, NULL);
        if (st != ZB_OK) break;
        u->enc = malloc((size_t)u->len + 1);
        if (!u->enc) {
            st = zb_err(ZB_E_NOMEM, "bench: out of memory for %llu encoded bytes of %s",
                        (unsigned long long)u->len, key);
            break;
        }
        uint64_t got = 0;
        st = zb_store_get(u->arr->store, key, u->off, u->len, u->enc, &got);
        if (st == ZB_OK && got != u->len)
            st = zb_err(ZB_E_TRUNCATED, "%s: read %llu of %llu bytes", key, (unsigned long long)got,
                        (unsigned long long)u->len);
    }
    free(key);
    return st;
}

void
zb_bench_units_clear(zb_bench_units *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->u[i].enc);
    s->n = 0;
    s->bytes_delivered = s->bytes_decoded = s->bytes_encoded = 0;
    s->ndecoded = s->skipped = 0;
}

void
zb_bench_units_free(zb_bench_units *s)
{
    zb_bench_units_clear(s);
    free(s->u);
    memset(s, 0, sizeof *s);
}

/* ---- the decode-only loop ------------------------------------------------------------------ */

typedef struct dec_task {
    const zb_bench_unit *u;
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

struct zb_bench_decoder {
    zb_pool *pool;
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
        const zb_bench_unit *u = &t->u[i];
        if (!u->enc) continue;
        t->st = zb_array_decode_unit(u->arr, ctx, u->enc, (size_t)u->len, t->out, "bench");
        if (t->st != ZB_OK) {
            snprintf(t->msg, sizeof t->msg, "%s", zb_last_error());
            break;
        }
        size_t ub = (size_t)zb_array_unit_bytes(u->arr);
        if (t->dst) {
            size_t w = unit_share(ub, t->share);
            if (t->stream)
                zb_stream_copy(t->dst, t->out, w);
            else
                memcpy(t->dst, t->out, w);
            t->dst += w;
            t->written += w;
        }
        t->bytes += ub;
    }
    if (t->dst && t->stream) zb_stream_fence();
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
        uint64_t x = ds->fields[f].itemsize ? zb_array_unit_bytes(ds->fields[f].arr) : 0;
        if (x > m) m = x;
    }
    return m;
}

zb_status
zb_bench_decoder_new(zb_dataset *ds, int threads, zb_bench_decoder **out)
{
    *out = NULL;
    zb_bench_decoder *d = calloc(1, sizeof *d);
    if (!d) return zb_err(ZB_E_NOMEM, "bench: out of memory");
    d->ntasks = (size_t)(threads > 1 ? threads : 1) * TASKS_PER_THREAD;
    d->tasks = calloc(d->ntasks, sizeof *d->tasks);
    zb_status st = d->tasks ? ZB_OK : zb_err(ZB_E_NOMEM, "bench: out of memory");
    size_t maxb = (size_t)max_unit_bytes(ds);
    for (size_t k = 0; k < d->ntasks && st == ZB_OK; k++) {
        /* touched once here so that page faults of fresh buffers stay out of the timed loop */
        d->tasks[k].out = malloc(maxb + 1);
        if (d->tasks[k].out)
            memset(d->tasks[k].out, 0, maxb + 1);
        else
            st = zb_err(ZB_E_NOMEM, "bench: out of memory for decode buffers");
    }
    if (st == ZB_OK) st = zb_pool_new(threads, &d->pool);
    if (st != ZB_OK) {
        zb_bench_decoder_free(d);
        return st;
    }
    *out = d;
    return ZB_OK;
}

/* Makes the arena hold `need` bytes, every page touched (page faults stay out of the loop). */
static zb_status
arena_reserve(zb_bench_decoder *d, size_t need)
{
    if (need <= d->arena_cap) return ZB_OK;
    free(d->arena);
    d->arena_cap = 0;
    d->arena = malloc(need);
    if (!d->arena) return zb_err(ZB_E_NOMEM, "bench: out of memory for %zu decoded bytes", need);
    memset(d->arena, 0, need);
    d->arena_cap = need;
    return ZB_OK;
}

zb_status
zb_bench_decoder_run(zb_bench_decoder *d, const zb_bench_units *s, bool write,
                     zb_bench_decode_result *res)
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
            if (t->u[i].enc) at += unit_share((size_t)zb_array_unit_bytes(t->u[i].arr), share);
    }
    if (write) ZB_TRY(arena_reserve(d, at ? at : 1)); /* every unit's share, at its place */
    res->streamed = write && at >= ZB_STREAM_MIN_BATCH_BYTES;
    for (size_t k = 0; k < nt; k++) {
        d->tasks[k].dst = write ? d->arena + d->tasks[k].off : NULL;
        d->tasks[k].stream = res->streamed;
    }
    double t0 = zb_bench_now();
    for (size_t k = 0; k < nt; k++) zb_pool_submit(d->pool, decode_task, &d->tasks[k]);
    zb_pool_wait(d->pool);
    res->seconds = zb_bench_now() - t0;
    for (size_t k = 0; k < nt; k++) {
        if (d->tasks[k].st != ZB_OK) return zb_err(d->tasks[k].st, "%s", d->tasks[k].msg);
        res->bytes_decoded += d->tasks[k].bytes;
        res->bytes_written += d->tasks[k].written;
    }
    return ZB_OK;
}

void
zb_bench_decoder_free(zb_bench_decoder *d)
{
    if (!d) return;
    zb_pool_free(d->pool);
    for (size_t k = 0; d->tasks && k < d->ntasks; k++) free(d->tasks[k].out);
    free(d->tasks);
    free(d->arena);
    free(d);
}
