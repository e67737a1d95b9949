/* The batch object and its memory pool: zb_batch (fields in batch order, segment pointers,
 * index, views of batches sharing one buffer, with index fields re-based per view) and the
 * pool its buffers come from, so a loader in steady state reuses memory it touched before.
 * Filled by the plan (plan.c) and the tasks (exec.c); read through zbatch.h's zb_batch_*. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/read_int.h"
#include "dataset/validate.h"
#include "util/status.h"

/* Reused batch memory. Multi-megabyte batch buffers that are mapped and unmapped on every
 * batch cost thousands of page faults each (DESIGN.md §6); a read_many takes its field
 * buffers as one block from this pool and its last release returns the block, so a loader in
 * steady state touches only memory it touched before. The pool is shared by the dataset and
 * every batch still alive (refcounted), so batches may outlive their dataset.
 *
 * What it keeps is bounded by what was ever in use at once: returned blocks stay while the
 * bytes kept do not exceed the peak of the bytes taken out together (the smallest go first),
 * so a loader of depth windows of prefetch dense batches keeps exactly its working set however
 * many blocks that is, and a pool never holds more than its busiest moment needed. */
#define ARENA_MAX 1024
struct zb__arena_pool {
    zb__arena_alloc alloc;
    pthread_mutex_t mu;
    int refs;
    size_t n;
    size_t kept, out, peak; /* bytes: in the pool, taken out now, taken out at most at once */
    void *blk[ARENA_MAX];
    size_t cap[ARENA_MAX];
};

static void *
heap_alloc(size_t nbytes, void *user)
{
    (void)user;
    return malloc(nbytes);
}

static void
heap_free(void *block, void *user)
{
    (void)user;
    free(block);
}

zb_status
zb__arena_pool_new(zb__arena_pool **out)
{
    zb__arena_alloc heap = {heap_alloc, heap_free, NULL, NULL};
    return zb__arena_pool_new_with(&heap, out);
}

zb_status
zb__arena_pool_new_with(const zb__arena_alloc *alloc, zb__arena_pool **out)
{
    zb__arena_pool *p = calloc(1, sizeof *p);
    if (!p) return zb__err(ZB_E_NOMEM, "arena pool: out of memory");
    p->alloc = *alloc;
    pthread_mutex_init(&p->mu, NULL);
    p->refs = 1;
    *out = p;
    return ZB_OK;
}

void
zb__arena_pool_unref(zb__arena_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    int left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left > 0) return;
    for (size_t i = 0; i < p->n; i++) p->alloc.free(p->blk[i], p->alloc.user);
    if (p->alloc.release) p->alloc.release(p->alloc.user);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Counts `cap` bytes as taken out (pool lock held). */
static void
arena_out(zb__arena_pool *p, size_t cap)
{
    p->out += cap;
    if (p->out > p->peak) p->peak = p->out;
}

/* A block of at least `need` bytes: the smallest kept one that fits, else a new one. */
void *
zb__arena_take(zb__arena_pool *p, size_t need, size_t *cap)
{
    pthread_mutex_lock(&p->mu);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < p->n; i++)
        if (p->cap[i] >= need && (best == SIZE_MAX || p->cap[i] < p->cap[best])) best = i;
    void *blk = NULL;
    if (best != SIZE_MAX) {
        blk = p->blk[best];
        *cap = p->cap[best];
        p->kept -= *cap;
        arena_out(p, *cap);
        p->n--;
        p->blk[best] = p->blk[p->n];
        p->cap[best] = p->cap[p->n];
    }
    p->refs++;
    pthread_mutex_unlock(&p->mu);
    if (!blk) {
        /* a little headroom, so windows of slightly varying size reuse one block */
        size_t c = need + need / 8 + 4096;
        blk = p->alloc.alloc(c, p->alloc.user);
        *cap = c;
        if (blk) {
            pthread_mutex_lock(&p->mu);
            arena_out(p, c);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return blk;
}

/* Returns a block (kept while the pool's bound allows, smallest freed first) and drops the
 * batch's reference. */
void
zb__arena_give(zb__arena_pool *p, void *blk, size_t cap)
{
    void *drop[8];
    size_t ndrop = 0;
    pthread_mutex_lock(&p->mu);
    p->out -= cap;
    if (p->n < ARENA_MAX) {
        p->blk[p->n] = blk;
        p->cap[p->n++] = cap;
        p->kept += cap;
        blk = NULL;
    }
    while (p->kept > p->peak && p->n > 0 && ndrop < 8) {
        size_t small = 0;
        for (size_t i = 1; i < p->n; i++)
            if (p->cap[i] < p->cap[small]) small = i;
        drop[ndrop++] = p->blk[small];
        p->kept -= p->cap[small];
        p->n--;
        p->blk[small] = p->blk[p->n];
        p->cap[small] = p->cap[p->n];
    }
    pthread_mutex_unlock(&p->mu);
    if (blk) p->alloc.free(blk, p->alloc.user);
    for (size_t i = 0; i < ndrop; i++) p->alloc.free(drop[i], p->alloc.user);
    zb__arena_pool_unref(p);
}

/* ------------------------------------------------------------------------------------------- */

void
zb_batch_free(zb_batch *b)
{
    if (!b) return;
    if (--b->refs > 0) return;
    for (size_t i = 0; i < b->nfields; i++) {
        free(b->fields[i].name);
        if (b->fields[i].owned) free(b->fields[i].data);
        if (b->fields[i].owns_offs) free(b->fields[i].offs);
    }
    for (size_t i = 0; i < b->nsegs; i++) free(b->segs[i].ptr);
    free(b->fields);
    free(b->segs);
    if (!b->parent) {
        free(b->index);
        free(b->dataset);
    }
    free(b->groups);
    if (b->arena) zb__arena_give(b->arenas, b->arena, b->arena_cap);
    zb_batch *parent = b->parent;
    free(b);
    zb_batch_free(parent);
}

uint64_t
zb__batch_n_vars(const zb_batch *b)
{
    return b ? b->n_vars : 0;
}

static zb_status
grow_fields(zb_batch *b)
{
    bfield *n = realloc(b->fields, (b->nfields + 2) * sizeof *n);
    if (!n) return zb__err(ZB_E_NOMEM, "batch: out of memory for a field");
    b->fields = n;
    return ZB_OK;
}

zb_status
zb_batch_add_field(zb_batch *b, const char *name, zb_dtype dtype, int ndim,
                   const uint64_t *row_shape, uint64_t nrows, void *data)
{
    if (!b || !name || ndim < 0 || ndim >= ZB_MAX_DIMS || dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "zb_batch_add_field: bad argument");
    for (size_t i = 0; i < b->nfields; i++)
        if (!strcmp(b->fields[i].name, name))
            return zb__err(ZB_E_INVALID, "batch already has a field '%s'", name);
    ZB_TRY(grow_fields(b));
    bfield *f = &b->fields[b->nfields];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    if (!f->name) return zb__err(ZB_E_NOMEM, "batch: out of memory");
    f->owned = true;
    f->kind = ZB_FIELD_PER_SAMPLE;
    f->dtype = dtype;
    f->itemsize = zb_dtype_size(dtype);
    f->ndim = ndim;
    f->row_elems = 1;
    for (int d = 0; d < ndim; d++) {
        f->row_shape[d] = row_shape[d];
        f->row_elems *= row_shape[d];
    }
    f->nrows = nrows;
    f->data = data;
    f->seg = -1;
    b->nfields++;
    return ZB_OK;
}

zb_status
zb__batch_add_pooled_field(zb_batch *b, const char *name, zb_dtype dtype, int ndim,
                           const uint64_t *row_shape, uint64_t nrows, bool zero, void **data)
{
    *data = NULL;
    if (!b || ndim < 0 || ndim >= ZB_MAX_DIMS || dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "zb__batch_add_pooled_field: bad argument");
    uint64_t bytes = nrows * (uint64_t)zb_dtype_size(dtype);
    for (int d = 0; d < ndim; d++)
        if (!zb__mul_u64(bytes, row_shape[d], &bytes) || bytes > ZB_BUF_MAX)
            return zb__err(ZB_E_OVERFLOW, "batch field '%s' is too large", name);
    zb__arena_pool *pool = NULL;
    for (const zb_batch *p = b; p && !pool; p = p->parent) pool = p->arenas;
    void *mem;
    bool pooled = pool && !b->arena;
    if (pooled) {
        size_t cap = 0;
        mem = zb__arena_take(pool, (size_t)bytes + 64, &cap);
        if (!mem) {
            zb__arena_pool_unref(pool);
            return zb__err(ZB_E_NOMEM, "batch field '%s': out of memory for %llu bytes", name,
                           (unsigned long long)bytes);
        }
        uint8_t *data8 = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
        if (zero) memset(data8, 0, (size_t)bytes);
        zb_status st = zb_batch_add_field(b, name, dtype, ndim, row_shape, nrows, data8);
        if (st != ZB_OK) {
            zb__arena_give(pool, mem, cap);
            return st;
        }
        b->fields[b->nfields - 1].owned = false; /* in the batch's arena */
        b->arenas = pool;
        b->arena = mem;
        b->arena_cap = cap;
        *data = data8;
        return ZB_OK;
    }
    mem = calloc((size_t)bytes + 1, 1);
    if (!mem)
        return zb__err(ZB_E_NOMEM, "batch field '%s': out of memory for %llu bytes", name,
                       (unsigned long long)bytes);
    zb_status st = zb_batch_add_field(b, name, dtype, ndim, row_shape, nrows, mem);
    if (st != ZB_OK) {
        free(mem);
        return st;
    }
    *data = mem;
    return ZB_OK;
}

zb_status
zb_batch_replace_field(zb_batch *b, const char *name, zb_dtype dtype, void *data)
{
    if (!b || !name || dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "zb_batch_replace_field: bad argument");
    for (size_t i = 0; i < b->nfields; i++) {
        bfield *f = &b->fields[i];
        if (strcmp(f->name, name)) continue;
        if (f->owned) free(f->data);
        f->data = data;
        f->owned = true;
        f->dtype = dtype;
        f->itemsize = zb_dtype_size(dtype);
        return ZB_OK;
    }
    return zb__err(ZB_E_NOTFOUND, "batch has no field '%s'", name);
}

/* Makes index field `wf`'s values for samples [b0, b1) of `whole` count from the target rows
 * of sample b0. They count from the start of their re-basing group (the whole batch, or each
 * batch of zb__dataset_read_batches), so a view that is one such batch needs nothing, and the
 * loader's views never do: only a view starting inside a group is shifted. */
static void
rebase_view(zb_batch *whole, const bfield *wf, size_t b0, size_t b1)
{
    const int64_t *tp = whole->segs[wf->target].ptr, *sp = whole->segs[wf->seg].ptr;
    size_t whole_group[2] = {0, whole->B};
    const size_t *g = whole->groups ? whole->groups : whole_group;
    size_t ng = whole->groups ? whole->ngroups : 1;
    for (size_t k = 0; k < ng; k++) {
        size_t s0 = g[k] > b0 ? g[k] : b0, s1 = g[k + 1] < b1 ? g[k + 1] : b1;
        int64_t delta = tp[g[k]] - tp[b0];
        if (s0 >= s1 || delta == 0) continue;
        uint64_t r0 = (uint64_t)sp[s0] * wf->row_elems, r1 = (uint64_t)sp[s1] * wf->row_elems;
        if (wf->dtype == ZB_DT_INT64) {
            int64_t *x = (int64_t *)(void *)wf->data;
            for (uint64_t r = r0; r < r1; r++) x[r] += delta;
        } else if (wf->dtype == ZB_DT_INT32) {
            int32_t *x = (int32_t *)(void *)wf->data;
            for (uint64_t r = r0; r < r1; r++) x[r] = (int32_t)(x[r] + delta);
        }
    }
}

zb_status
zb__batch_slice(zb_batch *whole, size_t b0, size_t b1, zb_batch **out)
{
    *out = NULL;
    if (!whole || b0 > b1 || b1 > whole->B)
        return zb__err(ZB_E_RANGE, "batch view [%zu, %zu) of %zu", b0, b1, whole ? whole->B : 0);
    zb_batch *v = calloc(1, sizeof *v);
    if (!v) return zb__err(ZB_E_NOMEM, "batch view: out of memory");
    v->refs = 1;
    v->B = b1 - b0;
    v->n_vars = whole->n_vars;
    /* the window's read statistics travel with its first batch, so sums over batches add up */
    if (b0 == 0) v->stats = whole->stats;
    v->index = whole->index + b0;
    v->dataset = whole->dataset ? whole->dataset + b0 : NULL;
    v->nfields = 0;
    v->segs = calloc(whole->nsegs + 1, sizeof *v->segs);
    v->nsegs = v->segs ? whole->nsegs : 0; /* zb_batch_free walks them on the way out */
    v->fields = calloc(whole->nfields + 1, sizeof *v->fields);
    v->parent = whole;
    whole->refs++;
    if (!v->segs || !v->fields) goto oom;
    for (size_t s = 0; s < whole->nsegs; s++) {
        memcpy(v->segs[s].name, whole->segs[s].name, sizeof v->segs[s].name);
        v->segs[s].ptr = malloc((v->B + 1) * sizeof(int64_t));
        if (!v->segs[s].ptr) goto oom;
        const int64_t *p = whole->segs[s].ptr;
        for (size_t i = 0; i <= v->B; i++) v->segs[s].ptr[i] = p[b0 + i] - p[b0];
    }
    for (size_t f = 0; f < whole->nfields; f++) {
        const bfield *wf = &whole->fields[f];
        bfield *vf = &v->fields[f];
        *vf = *wf;
        vf->owned = false;
        vf->name = strdup(wf->name);
        if (!vf->name) goto oom;
        v->nfields++;
        vf->owns_offs = false;
        if (wf->offs) { /* strings: the view's own offsets, counted from its first string */
            vf->offs = malloc((v->B + 1) * sizeof *vf->offs);
            if (!vf->offs) goto oom;
            vf->owns_offs = true;
            for (size_t i = 0; i <= v->B; i++) vf->offs[i] = wf->offs[b0 + i] - wf->offs[b0];
            vf->data = wf->data + wf->offs[b0];
            vf->nrows = v->B;
            continue;
        }
        uint64_t r0 = wf->seg >= 0 ? (uint64_t)whole->segs[wf->seg].ptr[b0] : b0;
        uint64_t r1 = wf->seg >= 0 ? (uint64_t)whole->segs[wf->seg].ptr[b1] : b1;
        vf->data = wf->data + r0 * wf->row_elems * wf->itemsize;
        vf->nrows = r1 - r0;
        if (wf->kind == ZB_FIELD_INDEX && wf->target >= 0 && wf->seg >= 0)
            rebase_view(whole, wf, b0, b1);
    }
    *out = v;
    return ZB_OK;
oom:
    zb_batch_free(v);
    return zb__err(ZB_E_NOMEM, "batch view: out of memory");
}

size_t
zb_batch_size(const zb_batch *b)
{
    return b ? b->B : 0;
}

size_t
zb_batch_nfields(const zb_batch *b)
{
    return b ? b->nfields : 0;
}

zb_status
zb_batch_field(const zb_batch *b, size_t i, zb_batch_view *v)
{
    if (!b || !v || i >= b->nfields) return zb__err(ZB_E_RANGE, "batch field %zu", i);
    const bfield *f = &b->fields[i];
    v->name = f->name;
    v->kind = f->kind;
    v->dtype = f->dtype;
    v->data = f->data;
    v->nrows = f->nrows;
    v->ndim = f->ndim;
    v->row_shape = f->row_shape;
    v->ptr = f->offs ? f->offs : f->seg >= 0 ? b->segs[f->seg].ptr : NULL;
    return ZB_OK;
}

zb_status
zb_batch_find(const zb_batch *b, const char *name, zb_batch_view *v)
{
    if (!b || !name) return zb__err(ZB_E_INVALID, "zb_batch_find: null argument");
    for (size_t i = 0; i < b->nfields; i++)
        if (!strcmp(b->fields[i].name, name)) return zb_batch_field(b, i, v);
    return zb__err(ZB_E_NOTFOUND, "batch has no field '%s'", name);
}

const uint64_t *
zb_batch_index(const zb_batch *b)
{
    return b ? b->index : NULL;
}

const int32_t *
zb_batch_dataset(const zb_batch *b)
{
    return b ? b->dataset : NULL;
}

const int64_t *
zb_batch_segment(const zb_batch *b, const char *name)
{
    if (!b || !name) return NULL;
    for (size_t i = 0; i < b->nsegs; i++)
        if (!strcmp(b->segs[i].name, name)) return b->segs[i].ptr;
    return NULL;
}

size_t
zb_batch_nsegments(const zb_batch *b)
{
    return b ? b->nsegs : 0;
}

const char *
zb_batch_segment_at(const zb_batch *b, size_t i, const int64_t **ptr)
{
    if (!b || i >= b->nsegs) return NULL;
    if (ptr) *ptr = b->segs[i].ptr;
    return b->segs[i].name;
}

void
zb__batch_count_skipped(zb_batch *b, uint64_t n)
{
    b->stats.samples_skipped += n;
}

void
zb_batch_stats(const zb_batch *b, zb_read_stats *s)
{
    if (b && s) *s = b->stats;
}
