/* The coalesced reader: one call turns a list of sample ids into one batch (DESIGN.md §3).
 *
 * Plan (caller thread): logical -> (child, physical) ids; per segment the element range of
 * every sample and the batch pointer arrays; per field the runs of source rows and their
 * destination rows, split at read-unit boundaries into copies, sorted by unit so that every
 * unit (chunk, or shard inner chunk) the request touches appears once with all the copies it
 * serves. Execute (pool): one task per unit row ("slab"), or per shard for sharded arrays so
 * neighbouring inner chunks are fetched with merged range reads; each unit is fetched, decoded
 * once (straight into the batch when it maps onto one contiguous run of it, else into per-thread
 * scratch) and copied out. Finish (caller): index fields re-based to the batch. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/batch.h"
#include "dataset/dataset.h"
#include "store/store.h"
#include "util/buf.h"
#include "util/status.h"
#include "util/stream.h"
#include "util/vecloop.h"
#include "zarr/codec.h"
#include "zarr/shard.h"

#define SHARD_TASK_UNITS 8
#define MERGE_GAP ((uint64_t)1 << 20)
#define MERGE_MAX ((uint64_t)16 << 20)
enum { SCR_UNIT = 4, SCR_FETCH = 5 };

typedef struct bfield {
    char *name;
    bool owned;         /* data is this batch's (else it lies in the parent's buffers) */
    zb_field_kind kind;
    zb_dtype dtype;
    size_t itemsize;
    int ndim;
    uint64_t row_shape[ZB_MAX_DIMS];
    uint64_t row_elems;
    uint64_t nrows;
    uint8_t *data;
    int seg;
    int target; /* index fields: the segment their values point into, else -1 */
    int64_t *offs; /* strings: byte offsets [B+1] of each sample's string in data, else NULL */
    bool owns_offs;
} bfield;

typedef struct bseg {
    char name[32];
    int64_t *ptr; /* [B+1] */
} bseg;

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
struct zb_arena_pool {
    zb_arena_alloc alloc;
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
zb_arena_pool_new(zb_arena_pool **out)
{
    zb_arena_alloc heap = {heap_alloc, heap_free, NULL, NULL};
    return zb_arena_pool_new_with(&heap, out);
}

zb_status
zb_arena_pool_new_with(const zb_arena_alloc *alloc, zb_arena_pool **out)
{
    zb_arena_pool *p = calloc(1, sizeof *p);
    if (!p) return zb_err(ZB_E_NOMEM, "arena pool: out of memory");
    p->alloc = *alloc;
    pthread_mutex_init(&p->mu, NULL);
    p->refs = 1;
    *out = p;
    return ZB_OK;
}

void
zb_arena_pool_unref(zb_arena_pool *p)
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
arena_out(zb_arena_pool *p, size_t cap)
{
    p->out += cap;
    if (p->out > p->peak) p->peak = p->out;
}

/* A block of at least `need` bytes: the smallest kept one that fits, else a new one. */
static void *
arena_take(zb_arena_pool *p, size_t need, size_t *cap)
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
static void
arena_give(zb_arena_pool *p, void *blk, size_t cap)
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
    zb_arena_pool_unref(p);
}

struct zb_batch {
    size_t B;
    uint64_t *index;
    int32_t *dataset;
    size_t nfields;
    bfield *fields;
    size_t nsegs;
    bseg *segs;
    zb_read_stats stats;
    uint64_t n_vars;
    /* a view (zb_batch_view) borrows index/dataset and non-owned field data from `parent` and
     * holds one of its references; a batch is freed when its last reference goes */
    zb_batch *parent;
    _Atomic int refs;
    zb_arena_pool *arenas; /* where `arena` returns (NULL: malloc'd) */
    void *arena;
    size_t arena_cap;
    /* zb_dataset_read_batches: index fields are re-based to each of these batches,
     * [groups[k], groups[k+1]) for k < ngroups; NULL: to the whole batch */
    size_t *groups;
    size_t ngroups;
};

/* A run of rows of one unit that lands at dst_row of the field's batch buffer. */
typedef struct copy {
    uint32_t field, child;
    uint64_t unit;    /* unit index along axis 0 */
    uint64_t src_row; /* first row inside the unit */
    uint64_t dst_row;
    uint64_t nrows;
} copy;

/* One task: the copies [c0, c1) of one unit row (or of every unit row of one shard row). */
typedef struct task {
    size_t c0, c1;
    zb_status st;
    char *msg; /* the error's message (malloc'd), or NULL */
    zb_read_stats stats;
} task;

static const zb_dataset *child_of(const zb_dataset *ds, uint32_t c);

/* A task as a worker runs it. */
typedef struct plan plan;
typedef struct exec {
    plan *p;
    task *t;
    zb_ctx *ctx;
} exec;

/* A copy's sort key and its place in the plan (sort_field). */
typedef struct keyed {
    uint64_t key;
    size_t i;
} keyed;

/* How an index field's values become batch rows (rebase_rows): sample i's stored values lie in
 * [lo[i], lo[i] + len[i]) (lo: its first target row in the store when stored store-global, else
 * 0) and become value + shift[i] (its first target row in its batch group, less lo[i]). */
typedef struct rebase {
    bool in_tasks;       /* applied by the tasks as each copy lands; else after them (step 5) */
    const int64_t *rows; /* [n+1] the field's batch pointer (its own segment) */
    int64_t *shift, *lo, *len; /* [n] each; NULL: not an index field */
} rebase;

/* The plan's memory, kept by the dataset between requests (dataset.h plan_free). A window's
 * plan is megabytes (copy records, sort keys, tasks, per-sample arrays) that malloc returns to
 * the kernel when freed and faults in again for the next window: 84,000 page faults in 8 s of a
 * block loader were all in the plan. Each kept set is as large as the largest request it
 * served; PLAN_MEM_KEPT of them at most (one per concurrent caller is what a loader needs), and
 * none larger than PLAN_MEM_MAX_BYTES. */
#define PLAN_MEM_KEPT 4
#define PLAN_MEM_MAX_BYTES ((size_t)256 << 20)
struct zb_plan_mem {
    copy *copies;
    size_t copies_cap;
    keyed *keys;
    size_t keys_cap;
    copy *sorted;
    size_t sorted_cap;
    task *tasks;
    size_t tasks_cap;
    exec *xs;
    size_t xs_cap;
    uint32_t *child;
    size_t child_cap;
    uint64_t *phys;
    size_t phys_cap;
    int64_t *seg_start;
    size_t seg_cap;
    size_t *arena_off;
    size_t off_cap;
    rebase *rb;
    size_t rb_cap;
    int64_t *rb_vals;
    size_t rb_vals_cap;
    zb_ctx *ctx;
    pthread_t owner; /* the thread that used it last */
    zb_plan_mem *next;
};

/* Ensures *a holds n elements of `size` bytes (grown by doubling, contents kept). */
static bool
grow_array(void **a, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < n) {
        if (c > SIZE_MAX / 2 / size) return false;
        c *= 2;
    }
    void *q = realloc(*a, c * size);
    if (!q) return false;
    *a = q;
    *cap = c;
    return true;
}

static size_t
plan_mem_bytes(const zb_plan_mem *m)
{
    return m->copies_cap * sizeof *m->copies + m->keys_cap * sizeof *m->keys +
           m->sorted_cap * sizeof *m->sorted + m->tasks_cap * sizeof *m->tasks +
           m->xs_cap * sizeof *m->xs + m->child_cap * sizeof *m->child +
           m->phys_cap * sizeof *m->phys + m->seg_cap * sizeof *m->seg_start +
           m->off_cap * sizeof *m->arena_off + m->rb_cap * sizeof *m->rb +
           m->rb_vals_cap * sizeof *m->rb_vals;
}

static void
plan_mem_free(zb_plan_mem *m)
{
    if (!m) return;
    free(m->copies);
    free(m->keys);
    free(m->sorted);
    free(m->tasks);
    free(m->xs);
    free(m->child);
    free(m->phys);
    free(m->seg_start);
    free(m->arena_off);
    free(m->rb);
    free(m->rb_vals);
    zb_ctx_free(m->ctx);
    free(m);
}

/* A kept plan memory of the dataset, or a new empty one (NULL when out of memory). */
static zb_plan_mem *
plan_mem_take(zb_dataset *ds)
{
    /* the one this thread used last, if kept: its lines may still be in this core's cache */
    pthread_t self = pthread_self();
    pthread_mutex_lock(&ds->plan_mu);
    zb_plan_mem **pp = &ds->plan_free;
    while (*pp && !pthread_equal((*pp)->owner, self)) pp = &(*pp)->next;
    if (!*pp) pp = &ds->plan_free;
    zb_plan_mem *m = *pp;
    if (m) {
        *pp = m->next;
        ds->plan_nfree--;
    }
    pthread_mutex_unlock(&ds->plan_mu);
    if (m) {
        m->next = NULL;
        memset(&m->ctx->stats, 0, sizeof m->ctx->stats);
    } else {
        m = calloc(1, sizeof *m);
        if (m && zb_ctx_new(&m->ctx) != ZB_OK) {
            free(m);
            return NULL;
        }
    }
    if (m) m->owner = self;
    return m;
}

/* Returns a plan memory to the dataset (kept within the bounds above, freed otherwise). */
static void
plan_mem_give(zb_dataset *ds, zb_plan_mem *m)
{
    if (!m) return;
    if (plan_mem_bytes(m) <= PLAN_MEM_MAX_BYTES) {
        pthread_mutex_lock(&ds->plan_mu);
        if (ds->plan_nfree < PLAN_MEM_KEPT) {
            m->next = ds->plan_free;
            ds->plan_free = m;
            ds->plan_nfree++;
            m = NULL;
        }
        pthread_mutex_unlock(&ds->plan_mu);
    }
    plan_mem_free(m);
}

void
zb_plan_mem_release_all(zb_dataset *ds)
{
    zb_plan_mem *m = ds->plan_free;
    while (m) {
        zb_plan_mem *n = m->next;
        plan_mem_free(m);
        m = n;
    }
    ds->plan_free = NULL;
    ds->plan_nfree = 0;
}

struct plan {
    zb_dataset *ds;
    zb_batch *b;
    zb_plan_mem *m; /* where copies, tasks and the sort's scratch live between requests */
    copy *copies;
    size_t ncopies, cap;
    task *tasks;
    size_t ntasks, tasks_cap;
    uint64_t work; /* decoded bytes of the units the tasks serve (make_tasks) */
    bool stream; /* the batch outgrows the cache: long copies into it are streamed (stream.h) */
    size_t n;              /* samples of the request */
    const uint32_t *child; /* [n] each sample's child */
    rebase *rb;            /* [nfields], or NULL when there is no index field */
};

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
    if (b->arena) arena_give(b->arenas, b->arena, b->arena_cap);
    zb_batch *parent = b->parent;
    free(b);
    zb_batch_free(parent);
}

uint64_t
zb_batch_n_vars(const zb_batch *b)
{
    return b ? b->n_vars : 0;
}

static zb_status
grow_fields(zb_batch *b)
{
    bfield *n = realloc(b->fields, (b->nfields + 2) * sizeof *n);
    if (!n) return zb_err(ZB_E_NOMEM, "batch: out of memory for a field");
    b->fields = n;
    return ZB_OK;
}

zb_status
zb_batch_add_field(zb_batch *b, const char *name, zb_dtype dtype, int ndim,
                   const uint64_t *row_shape, uint64_t nrows, void *data)
{
    if (!b || !name || ndim < 0 || ndim >= ZB_MAX_DIMS || dtype == ZB_DT_STRING)
        return zb_err(ZB_E_INVALID, "zb_batch_add_field: bad argument");
    for (size_t i = 0; i < b->nfields; i++)
        if (!strcmp(b->fields[i].name, name))
            return zb_err(ZB_E_INVALID, "batch already has a field '%s'", name);
    ZB_TRY(grow_fields(b));
    bfield *f = &b->fields[b->nfields];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    if (!f->name) return zb_err(ZB_E_NOMEM, "batch: out of memory");
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
zb_batch_add_pooled_field(zb_batch *b, const char *name, zb_dtype dtype, int ndim,
                          const uint64_t *row_shape, uint64_t nrows, bool zero, void **data)
{
    *data = NULL;
    if (!b || ndim < 0 || ndim >= ZB_MAX_DIMS || dtype == ZB_DT_STRING)
        return zb_err(ZB_E_INVALID, "zb_batch_add_pooled_field: bad argument");
    uint64_t bytes = nrows * (uint64_t)zb_dtype_size(dtype);
    for (int d = 0; d < ndim; d++)
        if (!zb_mul_u64(bytes, row_shape[d], &bytes) || bytes > ZB_BUF_MAX)
            return zb_err(ZB_E_OVERFLOW, "batch field '%s' is too large", name);
    zb_arena_pool *pool = NULL;
    for (const zb_batch *p = b; p && !pool; p = p->parent) pool = p->arenas;
    void *mem;
    bool pooled = pool && !b->arena;
    if (pooled) {
        size_t cap = 0;
        mem = arena_take(pool, (size_t)bytes + 64, &cap);
        if (!mem) {
            zb_arena_pool_unref(pool);
            return zb_err(ZB_E_NOMEM, "batch field '%s': out of memory for %llu bytes", name,
                          (unsigned long long)bytes);
        }
        uint8_t *data8 = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
        if (zero) memset(data8, 0, (size_t)bytes);
        zb_status st = zb_batch_add_field(b, name, dtype, ndim, row_shape, nrows, data8);
        if (st != ZB_OK) {
            arena_give(pool, mem, cap);
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
        return zb_err(ZB_E_NOMEM, "batch field '%s': out of memory for %llu bytes", name,
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
        return zb_err(ZB_E_INVALID, "zb_batch_replace_field: bad argument");
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
    return zb_err(ZB_E_NOTFOUND, "batch has no field '%s'", name);
}

/* Makes index field `wf`'s values for samples [b0, b1) of `whole` count from the target rows
 * of sample b0. They count from the start of their re-basing group (the whole batch, or each
 * batch of zb_dataset_read_batches), so a view that is one such batch needs nothing, and the
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
zb_batch_slice(zb_batch *whole, size_t b0, size_t b1, zb_batch **out)
{
    *out = NULL;
    if (!whole || b0 > b1 || b1 > whole->B)
        return zb_err(ZB_E_RANGE, "batch view [%zu, %zu) of %zu", b0, b1, whole ? whole->B : 0);
    zb_batch *v = calloc(1, sizeof *v);
    if (!v) return zb_err(ZB_E_NOMEM, "batch view: out of memory");
    v->refs = 1;
    v->B = b1 - b0;
    v->n_vars = whole->n_vars;
    /* the window's read statistics travel with its first batch, so sums over batches add up */
    if (b0 == 0) v->stats = whole->stats;
    v->index = whole->index + b0;
    v->dataset = whole->dataset ? whole->dataset + b0 : NULL;
    v->nsegs = whole->nsegs;
    v->nfields = 0;
    v->segs = calloc(whole->nsegs + 1, sizeof *v->segs);
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
    return zb_err(ZB_E_NOMEM, "batch view: out of memory");
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
    if (!b || !v || i >= b->nfields) return zb_err(ZB_E_RANGE, "batch field %zu", i);
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
    if (!b || !name) return zb_err(ZB_E_INVALID, "zb_batch_find: null argument");
    for (size_t i = 0; i < b->nfields; i++)
        if (!strcmp(b->fields[i].name, name)) return zb_batch_field(b, i, v);
    return zb_err(ZB_E_NOTFOUND, "batch has no field '%s'", name);
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
zb_batch_stats(const zb_batch *b, zb_read_stats *s)
{
    if (b && s) *s = b->stats;
}

/* ---- planning ----------------------------------------------------------------------------- */

static const zb_dataset *
child_of(const zb_dataset *ds, uint32_t c)
{
    return ds->nchildren ? ds->children[c] : ds;
}

static zb_status
push_copy(plan *p, copy c)
{
    if (p->ncopies == p->cap &&
        !grow_array((void **)&p->copies, &p->cap, p->ncopies + 1, sizeof *p->copies))
        return zb_err(ZB_E_NOMEM, "read_many: out of memory for the plan");
    p->copies[p->ncopies++] = c;
    return ZB_OK;
}

/* Splits source rows [src, src+n) of field f of child c, landing at dst_row, at unit bounds. */
static zb_status
add_run(plan *p, uint32_t f, uint32_t c, uint64_t src, uint64_t n, uint64_t dst_row)
{
    const zb_array *a = child_of(p->ds, c)->fields[f].arr;
    uint64_t U = a->inner[0];
    bool pow2 = (U & (U - 1)) == 0; /* the writers' default: shift and mask, no division */
    int sh = pow2 ? __builtin_ctzll(U) : 0;
    while (n > 0) {
        uint64_t u = pow2 ? src >> sh : src / U, off = pow2 ? src & (U - 1) : src % U;
        uint64_t take = U - off < n ? U - off : n;
        ZB_TRY(push_copy(p, (copy){f, c, u, off, dst_row, take}));
        src += take;
        dst_row += take;
        n -= take;
    }
    return ZB_OK;
}

static int
cmp_copy(const void *x, const void *y)
{
    const copy *a = x, *b = y;
    if (a->field != b->field) return a->field < b->field ? -1 : 1;
    if (a->child != b->child) return a->child < b->child ? -1 : 1;
    if (a->unit != b->unit) return a->unit < b->unit ? -1 : 1;
    if (a->src_row != b->src_row) return a->src_row < b->src_row ? -1 : 1;
    return a->dst_row < b->dst_row ? -1 : a->dst_row > b->dst_row;
}

static bool raw_rows(const zb_array *a);

/* Sort key of a copy inside its field: child, then the source row (unit * unit rows + row in
 * the unit) for raw units, whose copies are served in source order (nearby rows share a read),
 * or just the unit for decoded ones, whose copies are served in any order (fewer radix passes;
 * equal keys keep their dst order). `kc` caches what the key needs of the copy's child. False
 * when the key does not fit 64 bits (then the comparison sort takes over). */
typedef struct key_child {
    int64_t child; /* -1: nothing cached yet */
    bool raw;
    uint64_t U, max_unit;
} key_child;

static bool
copy_key(const plan *p, const copy *c, key_child *kc, uint64_t *key)
{
    if (kc->child != (int64_t)c->child) {
        const zb_array *a = child_of(p->ds, c->child)->fields[c->field].arr;
        kc->child = c->child;
        kc->raw = raw_rows(a);
        kc->U = a->inner[0];
        kc->max_unit = ((uint64_t)1 << 40) / kc->U;
    }
    if (c->child >= (1u << 23) || c->unit > kc->max_unit) return false;
    uint64_t row = kc->raw ? c->unit * kc->U + c->src_row : c->unit;
    if (row >= (uint64_t)1 << 40) return false;
    *key = (uint64_t)c->child << 40 | row;
    return true;
}

/* Orders copies [c0, c1) of one field, which arrive with dst_row ascending, by copy_key: a
 * stable LSD radix sort over the key bytes in use, so copies from one source row keep their dst
 * order (cmp_copy's order, without its calls: the plan's sort was 7% of a small-block read). */
static void
sort_field(plan *p, size_t c0, size_t c1, keyed *k, keyed *tmp, copy *out)
{
    size_t n = c1 - c0;
    uint64_t all = 0, prev = 0;
    bool sorted = true;
    key_child kc = {.child = -1};
    for (size_t i = 0; i < n; i++) {
        if (!copy_key(p, &p->copies[c0 + i], &kc, &k[i].key)) {
            qsort(p->copies + c0, n, sizeof *p->copies, cmp_copy);
            return;
        }
        k[i].i = c0 + i;
        all |= k[i].key;
        sorted = sorted && k[i].key >= prev;
        prev = k[i].key;
    }
    if (sorted) return; /* already in key order (one unit, or rows read in order): stable */
    for (int shift = 0; shift < 64 && (all >> shift); shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[((k[i].key >> shift) & 255) + 1]++;
        if (count[((k[0].key >> shift) & 255) + 1] == n) continue; /* one digit value */
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) tmp[count[(k[i].key >> shift) & 255]++] = k[i];
        keyed *t = k;
        k = tmp;
        tmp = t;
    }
    for (size_t i = 0; i < n; i++) out[i] = p->copies[k[i].i];
    memcpy(p->copies + c0, out, n * sizeof *out);
}

/* Groups the plan's copies by field (they are pushed field by field), then orders each field's
 * copies by source (sort_field). */
static zb_status
sort_copies(plan *p)
{
    size_t n = p->ncopies;
    if (n == 0) return ZB_OK;
    bool grouped = true;
    for (size_t i = 1; i < n && grouped; i++) grouped = p->copies[i].field >= p->copies[i - 1].field;
    if (!grouped) {
        qsort(p->copies, n, sizeof *p->copies, cmp_copy);
        return ZB_OK;
    }
    zb_plan_mem *m = p->m;
    if (!grow_array((void **)&m->keys, &m->keys_cap, 2 * n, sizeof *m->keys) ||
        !grow_array((void **)&m->sorted, &m->sorted_cap, n, sizeof *m->sorted))
        return zb_err(ZB_E_NOMEM, "read_many: out of memory sorting the plan");
    for (size_t c0 = 0, c1; c0 < n; c0 = c1) {
        for (c1 = c0 + 1; c1 < n && p->copies[c1].field == p->copies[c0].field; c1++) {}
        sort_field(p, c0, c1, m->keys, m->keys + n, m->sorted);
    }
    return ZB_OK;
}

/* ---- execution ---------------------------------------------------------------------------- */

static zb_status
task_fail(task *t, zb_status st)
{
    t->st = st;
    t->msg = strdup(zb_last_error()); /* NULL when out of memory: the status alone is told */
    return st;
}

/* Whether the unit at g spans every other axis exactly, so its rows are whole batch rows. */
static bool
unit_spans_rows(const zb_array *a, const uint64_t *g)
{
    for (int d = 1; d < a->meta.ndim; d++)
        if (a->inner[d] != a->meta.shape[d] || g[d] != 0) return false;
    return true;
}

/* n lines of nb bytes, line r from u + r*us to o + r*os, with a fixed-size move for the common
 * widths (a call into memcpy per short line was most of the copying of small samples and of
 * nvalchemi's column chunks). */
static inline void
copy_lines(uint8_t *o, size_t os, const uint8_t *u, size_t us, uint64_t n, size_t nb)
{
#define ZB_COPY_LINES(W)                                                                         \
    for (uint64_t r = 0; r < n; r++, u += us, o += os) memcpy(o, u, W);                          \
    break
    switch (nb) {
    case 1: ZB_COPY_LINES(1);
    case 2: ZB_COPY_LINES(2);
    case 4: ZB_COPY_LINES(4);
    case 8: ZB_COPY_LINES(8);
    case 12: ZB_COPY_LINES(12);
    case 16: ZB_COPY_LINES(16);
    case 24: ZB_COPY_LINES(24);
    case 32: ZB_COPY_LINES(32);
    case 48: ZB_COPY_LINES(48);
    case 64: ZB_COPY_LINES(64);
    default: ZB_COPY_LINES(nb);
    }
#undef ZB_COPY_LINES
}

/* Whether the tasks re-base field f's rows as they land. */
static inline bool
rebased_here(const plan *p, uint32_t f)
{
    return p->rb && p->rb[f].in_tasks;
}

/* Whether child c's values of field f are converted as they land (a collection's categorical
 * codes: another width, or through its table, merge.c; narrow stored values widened to the
 * delivered dtype, widen.c), and the table (NULL: none). A converted field loses the paths
 * that land stored bytes in the batch as they are (a unit decoded straight into it, raw rows
 * read into it): its units decode into per-thread scratch and zb_values_convert copies them out
 * while they are hot in cache. */
static inline bool
converted(const plan *p, uint32_t f, uint32_t c, const int64_t **lut, uint64_t *nlut)
{
    *lut = NULL;
    *nlut = 0;
    if (p->ds->maps) *lut = zb_dataset_lut(p->ds, f, c, nlut);
    return *lut || child_of(p->ds, c)->fields[f].dtype != p->b->fields[f].dtype;
}

/* Bytes of rows of field f into the batch: streamed past the cache when the batch outgrows it,
 * unless the task re-bases them next (they are read again at once). */
static inline void
put_bytes(const plan *p, uint32_t f, uint8_t *dst, const uint8_t *src, size_t n)
{
    if (p->stream && !rebased_here(p, f))
        zb_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* Copies rows [src_row, src_row+n) of a decoded unit at unit coordinates g (logical C order,
 * shape a->inner) that covers part of the other axes (serve_unit moves units holding whole
 * rows itself) into the batch rows starting at dst_row. */
static void
copy_rows(const zb_array *a, const bfield *bf, const uint8_t *unit, const uint64_t *g,
          uint64_t src_row, uint64_t dst_row, uint64_t n)
{
    int nd = a->meta.ndim;
    size_t isz = bf->itemsize;
    if (nd == 2) {
        /* a unit of some columns of each row (nvalchemi's column chunks, [rows, 1]): one short
         * line per row, copied with a fixed-size move where the width allows */
        uint64_t lo1 = g[1] * a->inner[1], hi1 = lo1 + a->inner[1];
        if (hi1 > a->meta.shape[1]) hi1 = a->meta.shape[1];
        size_t nb = (size_t)((hi1 - lo1) * isz);
        size_t us = (size_t)(a->inner[1] * isz), os = (size_t)(bf->row_elems * isz);
        copy_lines(bf->data + dst_row * os + lo1 * isz, os, unit + src_row * us, us, n, nb);
        return;
    }
    /* general: the unit covers a box of the other axes; copy it line by line (last axis) */
    uint64_t lo[ZB_MAX_DIMS], ext[ZB_MAX_DIMS], ostride[ZB_MAX_DIMS], ustride[ZB_MAX_DIMS];
    uint64_t s = 1, us = 1; /* us ends as the unit's elements per row */
    for (int d = nd - 1; d >= 1; d--) {
        ostride[d] = s;
        s *= a->meta.shape[d];
        ustride[d] = us;
        us *= a->inner[d];
        lo[d] = g[d] * a->inner[d];
        uint64_t hi = lo[d] + a->inner[d];
        if (hi > a->meta.shape[d]) hi = a->meta.shape[d];
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

/* The largest sample i with rows[i] <= row (rows: a batch pointer of n samples, row < rows[n]):
 * the sample holding batch row `row` (empty samples are skipped over). */
static size_t
sample_of(const int64_t *rows, size_t n, uint64_t row)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)rows[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Re-bases rows [r0, r1) x columns [c0, c1) of an index field's batch buffer, all of sample i:
 * v + d in one branch-free pass that keeps the range of v; a range outside [lo, lo + len), or
 * a result past INT32_MAX for int32, undoes the shift and returns false. Vectorised
 * (ZB_VECTOR_LOOP: AVX2 where the CPU has it, as SSE2 has no 64-bit compare; 6.4% of an atoms
 * read scalar, 1.8% so). */
#define ZB_SHIFT_SPAN(T, UT)                                                                     \
    ZB_VECTOR_LOOP static bool shift_span_##T(T *base, uint64_t re, uint64_t r0, uint64_t r1, uint64_t c0,     \
                               uint64_t c1, int64_t d, int64_t lo, int64_t len)                 \
    {                                                                                            \
        uint64_t rows = r1 - r0, w = c1 - c0;                                                    \
        if (c0 == 0 && c1 == re) { /* whole rows: one run */                                     \
            w *= rows;                                                                           \
            rows = 1;                                                                            \
        }                                                                                        \
        T mn = base[r0 * re + c0], mx = mn;                                                      \
        for (uint64_t r = 0; r < rows; r++) {                                                    \
            T *v = base + (r0 + r) * re + c0;                                                    \
            for (uint64_t k = 0; k < w; k++) {                                                   \
                T x = v[k];                                                                      \
                mn = x < mn ? x : mn;                                                            \
                mx = x > mx ? x : mx;                                                            \
                v[k] = (T)((UT)x + (UT)d);                                                       \
            }                                                                                    \
        }                                                                                        \
        /* mn >= lo >= 0 first: then mx - lo and mx + d cannot overflow int64 */                \
        if (mn >= lo && mx - lo < len && (sizeof(T) == 8 || (int64_t)mx + d <= INT32_MAX))      \
            return true;                                                                         \
        for (uint64_t r = 0; r < rows; r++) {                                                    \
            T *v = base + (r0 + r) * re + c0;                                                    \
            for (uint64_t k = 0; k < w; k++) v[k] = (T)((UT)v[k] - (UT)d);                       \
        }                                                                                        \
        return false;                                                                            \
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
    const zb_field *fd = &ch->fields[f];
    bool wide = bf->dtype == ZB_DT_INT64;
    for (uint64_t row = r0; row < r1; row++)
        for (uint64_t k = row * bf->row_elems + c0; k < row * bf->row_elems + c1; k++) {
            int64_t x = wide ? ((const int64_t *)(const void *)bf->data)[k]
                             : ((const int32_t *)(const void *)bf->data)[k];
            if (x < r->lo[i] || x - r->lo[i] >= r->len[i]) {
                /* x - lo as the store meant it; reported, never used */
                long long local = (long long)((uint64_t)x - (uint64_t)r->lo[i]);
                return zb_err(ZB_E_CORRUPT, "%s: sample %llu (row %zu of the request): field "
                              "%s: value %lld is outside its %lld atoms (stored %s)",
                              zb_dataset_name(ch), (unsigned long long)p->b->index[i], i,
                              fd->name, local, (long long)r->len[i],
                              fd->global_index ? "store-global" : "local");
            }
            if (!wide && x + r->shift[i] > INT32_MAX)
                return zb_err(ZB_E_OVERFLOW, "%s: batch index %lld does not fit int32", fd->name,
                              (long long)(x + r->shift[i]));
        }
    return zb_err(ZB_E_CORRUPT, "%s: sample %llu (row %zu of the request): field %s: bad "
                  "index values", zb_dataset_name(ch), (unsigned long long)p->b->index[i], i,
                  fd->name);
}

/* Re-bases rows [row0, row0 + nrows) x columns [c0, c1) of index field f, sample by sample (a
 * copy may span several): in the tasks, the rows one copy has just written (still in cache);
 * after them, every row of a field the tasks do not re-base. */
static zb_status
rebase_rows(const plan *p, uint32_t f, uint64_t row0, uint64_t nrows, uint64_t c0, uint64_t c1)
{
    const rebase *r = &p->rb[f];
    bfield *bf = &p->b->fields[f];
    uint64_t re = bf->row_elems, end = row0 + nrows;
    for (size_t i = nrows ? sample_of(r->rows, p->n, row0) : p->n; i < p->n; i++) {
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

static zb_status fetch_whole(exec *x, const zb_array *a, const char *key, const uint8_t **data,
                             size_t *len, bool *missing, void **tok);
static zb_status fetch_exact(exec *x, const zb_array *a, const char *key, uint64_t off,
                             uint64_t len, const uint8_t **data, void **tok);

/* The unit's number in C order over the whole grid (the cache key). */
static uint64_t
unit_linear(const zb_array *a, const uint64_t *g)
{
    uint64_t lin = 0;
    for (int d = 0; d < a->meta.ndim; d++)
        lin = lin * ((a->meta.shape[d] + a->inner[d] - 1) / a->inner[d]) + g[d];
    return lin;
}

/* Serves the copies [c0, c1) — all of one unit row u of one field and child — from the unit at
 * coordinates g (g[0] = u). `enc` holds its encoded bytes, or NULL when the unit is missing
 * (fill) or found in the decoded-chunk cache. `entry` is the unit's (offset, nbytes) inside the
 * shard object `key` for a sharded array, NULL when `key` is the unit's own object: it says how
 * to fetch the unit should the cache have evicted it since unit_cached() was asked. */
static zb_status
serve_unit(exec *x, size_t c0, size_t c1, const uint64_t *g, const uint8_t *enc, size_t enc_len,
           bool missing, const char *key, const uint64_t *entry)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_dataset *ch = child_of(p->ds, cp->child);
    const zb_field *f = &ch->fields[cp->field];
    const zb_array *a = f->arr;
    bfield *bf = &p->b->fields[cp->field];
    int nd = a->meta.ndim;
    size_t unit_bytes = (size_t)zb_array_unit_bytes(a);
    uint64_t grid_lin = unit_linear(a, g);

    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(p, cp->field, cp->child, &lut, &nlut);
    /* straight into the batch: one copy covering the whole, unpadded unit */
    bool direct = !conv && c1 - c0 == 1 && cp->src_row == 0 && cp->nrows == a->inner[0];
    for (int d = 1; d < nd && direct; d++) direct = a->inner[d] == a->meta.shape[d];
    uint8_t *target;
    if (direct) {
        target = bf->data + cp->dst_row * bf->row_elems * bf->itemsize;
    } else {
        ZB_TRY(zb_buf_reserve(&x->ctx->scratch[SCR_UNIT], unit_bytes ? unit_bytes : 1));
        target = x->ctx->scratch[SCR_UNIT].data;
    }
    zb_cache *cache = p->ds->cache;
    bool hit = cache && zb_cache_get(cache, a, grid_lin, target, unit_bytes);
    void *tok = NULL;
    if (!hit && !enc && !missing) { /* evicted since unit_cached() said yes: fetch after all */
        if (entry) {
            ZB_TRY(fetch_exact(x, a, key, entry[0], entry[1], &enc, &tok));
            enc_len = (size_t)entry[1];
        } else
            ZB_TRY(fetch_whole(x, a, key, &enc, &enc_len, &missing, &tok));
    }
    if (hit) {
        x->t->stats.chunks_cached++;
    } else if (missing) {
        zb_array_fill_unit(a, target);
        x->t->stats.chunks_filled++;
    } else {
        uint64_t before = x->ctx->stats.bytes_decoded;
        zb_status st = zb_array_decode_unit(a, x->ctx, enc, enc_len, target, key);
        zb_store_release(a->store, tok);
        if (st != ZB_OK) return st;
        x->t->stats.chunks_decoded++;
        x->t->stats.bytes_decoded += x->ctx->stats.bytes_decoded - before;
        if (cache) zb_cache_put(cache, a, grid_lin, target, unit_bytes);
    }
    uint64_t row_bytes = bf->itemsize; /* of this unit's part of a row */
    for (int d = 1; d < nd; d++) {
        uint64_t lo = g[d] * a->inner[d], hi = lo + a->inner[d];
        row_bytes *= (hi > a->meta.shape[d] ? a->meta.shape[d] : hi) - lo;
    }
    uint64_t rows = 0;
    bool reb = rebased_here(p, cp->field);
    if (direct) {
        rows = cp->nrows;
        if (reb) ZB_TRY(rebase_rows(p, cp->field, cp->dst_row, cp->nrows, 0, bf->row_elems));
    } else if (conv) {
        /* values converted in the copy (1-d fields only: units hold whole rows) */
        for (size_t i = c0; i < c1; i++) {
            const copy *c = &p->copies[i];
            ZB_TRY(zb_values_convert(bf->data + c->dst_row * bf->itemsize, bf->dtype,
                                  target + c->src_row * f->itemsize, f->dtype, c->nrows, lut,
                                  nlut, a->path));
            rows += c->nrows;
            if (reb) ZB_TRY(rebase_rows(p, c->field, c->dst_row, c->nrows, 0, bf->row_elems));
        }
    } else if (unit_spans_rows(a, g)) {
        /* the unit holds whole batch rows: one move per copy, fixed-size for short rows */
        size_t rb = (size_t)row_bytes;
        for (size_t i = c0; i < c1; i++) {
            const copy *c = &p->copies[i];
            uint8_t *o = bf->data + c->dst_row * rb;
            const uint8_t *u = target + c->src_row * rb;
            if (c->nrows == 1)
                copy_lines(o, 0, u, 0, 1, rb);
            else
                put_bytes(p, c->field, o, u, (size_t)c->nrows * rb);
            rows += c->nrows;
            if (reb) ZB_TRY(rebase_rows(p, c->field, c->dst_row, c->nrows, 0, bf->row_elems));
        }
    } else {
        /* re-based here only when 2-d (plan_rebase): the unit's columns of each row */
        uint64_t lo1 = nd == 2 ? g[1] * a->inner[1] : 0, hi1 = lo1 + (nd == 2 ? a->inner[1] : 0);
        if (hi1 > bf->row_elems) hi1 = bf->row_elems;
        for (size_t i = c0; i < c1; i++) {
            const copy *c = &p->copies[i];
            copy_rows(a, bf, target, g, c->src_row, c->dst_row, c->nrows);
            rows += c->nrows;
            if (reb) ZB_TRY(rebase_rows(p, c->field, c->dst_row, c->nrows, lo1, hi1));
        }
    }
    x->t->stats.bytes_delivered += rows * row_bytes;
    return ZB_OK;
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

/* A view of bytes [off, off + len) of `key` (len UINT64_MAX: to the end): ZB_OK with *data set
 * (release *tok), ZB_E_UNSUPPORTED (cleared) when the store offers no view of it. */
static zb_status
fetch_view(exec *x, const zb_array *a, const char *key, uint64_t off, uint64_t len,
           const uint8_t **data, uint64_t *got, void **tok)
{
    zb_status st = zb_store_view(a->store, key, off, len, data, got, tok);
    if (st == ZB_E_UNSUPPORTED) {
        zb_clear_error();
        return st;
    }
    if (st == ZB_OK) {
        x->t->stats.range_reads++;
        x->t->stats.bytes_fetched += *got;
    }
    return st;
}

static zb_status
fetch_whole(exec *x, const zb_array *a, const char *key, const uint8_t **data, size_t *len,
            bool *missing, void **tok)
{
    *missing = false;
    *tok = NULL;
    uint64_t vgot = 0;
    zb_status vs = fetch_view(x, a, key, 0, UINT64_MAX, data, &vgot, tok);
    if (vs == ZB_OK) {
        *len = (size_t)vgot;
        return ZB_OK;
    }
    if (vs == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    if (vs != ZB_E_UNSUPPORTED) return vs;
    /* One read of up to a bound no codec's output exceeds for this unit (its decoded size plus
     * framing), so a chunk costs one get instead of a size query and a get; an object that
     * fills the bound (never seen from real codecs) is read again whole. */
    uint64_t unit = zb_array_unit_bytes(a);
    uint64_t guess = unit + unit / 64 + 4096;
    zb_buf *buf = &x->ctx->scratch[SCR_FETCH];
    uint8_t *dst;
    ZB_TRY(zb_buf_for_read(buf, 0, (size_t)guess, &dst));
    uint64_t got = 0;
    zb_status st = zb_store_get(a->store, key, 0, guess, dst, &got);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    x->t->stats.range_reads++;
    if (got == guess) {
        uint64_t size = 0;
        ZB_TRY(zb_store_size(a->store, key, &size));
        ZB_TRY(zb_buf_for_read(buf, 0, (size_t)size, &dst));
        ZB_TRY(zb_store_get(a->store, key, 0, size, dst, &got));
        x->t->stats.range_reads++;
    }
    x->t->stats.bytes_fetched += got;
    *data = dst;
    *len = (size_t)got;
    return ZB_OK;
}

static zb_status
truncated(const char *key, uint64_t got, uint64_t want, uint64_t off)
{
    return zb_err(ZB_E_TRUNCATED, "%s: holds %llu of the %llu bytes at offset %llu", key,
                  (unsigned long long)got, (unsigned long long)want, (unsigned long long)off);
}

/* Exactly the bytes [off, off + len) of `key`: a view when the store offers one (release *tok),
 * else read into scratch congruent to `off`; fewer is ZB_E_TRUNCATED. */
static zb_status
fetch_exact(exec *x, const zb_array *a, const char *key, uint64_t off, uint64_t len,
            const uint8_t **data, void **tok)
{
    *tok = NULL;
    uint64_t got = 0;
    zb_status st = fetch_view(x, a, key, off, len, data, &got, tok);
    if (st == ZB_E_UNSUPPORTED) {
        uint8_t *to = NULL;
        ZB_TRY(zb_buf_for_read(&x->ctx->scratch[SCR_FETCH], off, (size_t)len, &to));
        ZB_TRY(zb_store_get(a->store, key, off, len, to, &got));
        x->t->stats.range_reads++;
        x->t->stats.bytes_fetched += got;
        *data = to;
    } else if (st != ZB_OK) {
        return st;
    }
    if (got != len) {
        zb_store_release(a->store, *tok);
        *tok = NULL;
        return truncated(key, got, len, off);
    }
    return ZB_OK;
}

/* Rows of a raw unit (zb_array_unit_raw) that spans every other axis can be read straight
 * into the batch: only the bytes delivered leave the page cache (or cross the network) and
 * nothing is decoded. */
static bool
raw_rows(const zb_array *a)
{
    if (!zb_array_unit_raw(a)) return false;
    for (int d = 1; d < a->meta.ndim; d++)
        if (a->inner[d] != a->meta.shape[d]) return false;
    return true;
}

/* Serves the copies [c0, c1) of one raw unit (raw_rows) that starts at byte `base` of the
 * object `key` (0 for a chunk object, the inner chunk's offset in a shard). Copies come sorted
 * by source row; those less than RAW_GAP apart share one range read into scratch, a lone copy
 * is read straight into the batch. ZB_E_NOTFOUND (error cleared) when a chunk object does not
 * exist. */
#define RAW_GAP ((uint64_t)32 << 10)
/* Copies [c0, c1) of a raw unit of array a out of `src`, which holds the unit's stored bytes
 * from byte s0 on, into the batch (converted as they land for a converted field);
 * *delivered: the bytes delivered. */
static zb_status
raw_copy_out(exec *x, const zb_array *a, bfield *bf, size_t c0, size_t c1, const uint8_t *src,
             uint64_t s0, uint64_t *delivered)
{
    const copy *cp = &x->p->copies[c0];
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(x->p, cp->field, cp->child, &lut, &nlut);
    uint64_t srb = a->row_elems * a->meta.itemsize, drb = bf->row_elems * bf->itemsize;
    uint64_t total = 0;
    for (size_t i = c0; i < c1; i++) {
        const copy *c = &x->p->copies[i];
        uint64_t n = c->nrows * drb;
        uint8_t *to = bf->data + c->dst_row * drb;
        const uint8_t *from = src + (c->src_row * srb - s0);
        if (conv)
            ZB_TRY(zb_values_convert(to, bf->dtype, from, a->meta.dtype, c->nrows * bf->row_elems,
                                  lut, nlut, a->path));
        else
            put_bytes(x->p, c->field, to, from, (size_t)n);
        total += n;
        if (rebased_here(x->p, c->field))
            ZB_TRY(rebase_rows(x->p, c->field, c->dst_row, c->nrows, 0, bf->row_elems));
    }
    x->t->stats.bytes_delivered += total;
    if (delivered) *delivered = total;
    return ZB_OK;
}

#define RAW_SPAN ((uint64_t)8 << 20)
static zb_status
serve_raw(exec *x, size_t c0, size_t c1, const char *key, uint64_t base, const uint8_t *obj,
          uint64_t obj_len)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    bfield *bf = &p->b->fields[cp->field];
    uint64_t row_bytes = a->row_elems * a->meta.itemsize; /* as stored */
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
        vs = zb_store_view(a->store, key, base + lo, hi - lo, &view, &got, &tok);
    }
    if (vs == ZB_OK) {
        if (got != hi - lo) {
            zb_store_release(a->store, tok);
            return truncated(key, got, hi - lo, base + lo);
        }
        /* only the delivered bytes of a view are touched: they are what is fetched */
        uint64_t n = 0;
        zb_status st = raw_copy_out(x, a, bf, c0, c1, view, lo, &n);
        zb_store_release(a->store, tok);
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
        for (; k < c1; k++) {
            uint64_t s = p->copies[k].src_row * row_bytes, e = s + p->copies[k].nrows * row_bytes;
            if (s > e0 + RAW_GAP || (e > e0 ? e : e0) - s0 > RAW_SPAN) break;
            if (e > e0) e0 = e;
        }
        uint64_t off = base + s0, len = e0 - s0;
        uint8_t *to = bf->data + p->copies[i].dst_row * bf->row_elems * bf->itemsize;
        /* a destination a few bytes off the source modulo the page slows the kernel's copy
         * several-fold (zb_buf_for_read): such a lone copy goes through scratch too, as do
         * converted values */
        uintptr_t skew = ((uintptr_t)to - (uintptr_t)off) & 4095;
        bool direct = !conv && k == i + 1 && (skew == 0 || (skew >= 64 && skew <= 4096 - 64));
        if (!direct) ZB_TRY(zb_buf_for_read(&x->ctx->scratch[SCR_FETCH], off, (size_t)len, &to));
        got = 0;
        zb_status st = zb_store_get(a->store, key, off, len, to, &got);
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
            ZB_TRY(raw_copy_out(x, a, bf, i, k, to, s0, NULL));
        } else {
            x->t->stats.bytes_delivered += len;
            const copy *c = &p->copies[i];
            if (rebased_here(p, c->field))
                ZB_TRY(rebase_rows(p, c->field, c->dst_row, c->nrows, 0, bf->row_elems));
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
    return x->p->ds->cache && zb_cache_contains(x->p->ds->cache, a, unit_linear(a, g));
}

/* A plain (unsharded) unit row: each unit along the other axes is one object. */
static zb_status
run_plain(exec *x, size_t c0, size_t c1)
{
    const copy *cp = &x->p->copies[c0];
    const zb_array *a = child_of(x->p->ds, cp->child)->fields[cp->field].arr;
    int nd = a->meta.ndim;
    uint64_t grid[ZB_MAX_DIMS], g[ZB_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) grid[d] = (a->meta.shape[d] + a->inner[d] - 1) / a->inner[d];
    g[0] = cp->unit;
    char key[4600];
    if (raw_rows(a)) { /* serve_raw converts as it copies */
        ZB_TRY(zb_array_unit_object(a, g, key, sizeof key, NULL, NULL));
        zb_status st = serve_raw(x, c0, c1, key, 0, NULL, 0);
        if (st != ZB_E_NOTFOUND) return st;
        return serve_unit(x, c0, c1, g, NULL, 0, true, key, NULL);
    }
    do {
        ZB_TRY(zb_array_unit_object(a, g, key, sizeof key, NULL, NULL));
        const uint8_t *data = NULL;
        size_t len = 0;
        bool missing = false;
        void *tok = NULL;
        if (!unit_cached(x, a, g)) ZB_TRY(fetch_whole(x, a, key, &data, &len, &missing, &tok));
        zb_status st = serve_unit(x, c0, c1, g, data, len, missing, key, NULL);
        zb_store_release(a->store, tok);
        ZB_TRY(st);
    } while (nd > 1 && next_other(g, grid, nd));
    return ZB_OK;
}

typedef struct want {
    uint64_t off, len;
    size_t c0, c1;
    uint64_t g[ZB_MAX_DIMS];
} want;

static int
cmp_want(const void *x, const void *y)
{
    const want *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* Loads entries [lo, lo + k) of the index (n entries) of the shard holding unit g into
 * `entries` (2k words): from the cache, else from the store. A task needs the entries of its
 * few unit rows only; copying the whole index out of the cache for each task (16 KiB for a
 * shard of 1,024 inner chunks) was 1.7% of a block read. */
static zb_status
shard_entries(exec *x, const zb_array *a, const uint64_t *g, uint64_t lo, uint64_t k,
              uint64_t *entries, uint64_t n)
{
    size_t ibytes = (size_t)(2 * n * sizeof(uint64_t)), off = (size_t)(2 * lo * sizeof(uint64_t));
    size_t part = (size_t)(2 * k * sizeof(uint64_t));
    uint64_t s[ZB_MAX_DIMS], slin = 0;
    char key[4600];
    ZB_TRY(zb_array_unit_object(a, g, key, sizeof key, s, NULL));
    for (int d = 0; d < a->meta.ndim; d++) {
        uint64_t ns = (a->meta.shape[d] + a->meta.chunks[d] - 1) / a->meta.chunks[d];
        slin = slin * ns + s[d];
    }
    /* shard indexes live in the dataset's always-on index cache: a shard row is split into
     * several tasks, and each must not re-read the index */
    const void *owner = (const uint8_t *)a + 1;
    zb_cache *cache = x->p->ds->index_cache;
    if (cache && zb_cache_get_part(cache, owner, slin, ibytes, off, entries, part)) return ZB_OK;
    uint64_t *fresh = NULL, nn = 0;
    bool missing = false;
    uint64_t r0 = x->ctx->stats.range_reads, b0 = x->ctx->stats.bytes_fetched;
    zb_status st = zb_array_shard_index(a, x->ctx, s, &fresh, &nn, &missing);
    x->t->stats.range_reads += x->ctx->stats.range_reads - r0;
    x->t->stats.bytes_fetched += x->ctx->stats.bytes_fetched - b0;
    if (st != ZB_OK) return st;
    if (missing) {
        fresh = malloc(ibytes ? ibytes : 1);
        if (!fresh) return zb_err(ZB_E_NOMEM, "read_many: out of memory for a shard index");
        for (uint64_t e = 0; e < 2 * n; e++) fresh[e] = ZB_SHARD_EMPTY;
    }
    memcpy(entries, (const uint8_t *)fresh + off, part);
    if (cache) zb_cache_put(cache, owner, slin, fresh, ibytes);
    free(fresh);
    return ZB_OK;
}

/* The unit rows [c0, c1) of one shard of a sharded array whose shards span every other axis:
 * one index lookup (cached), then the inner chunks it needs with merged range reads. */
static zb_status
run_shard(exec *x, size_t c0, size_t c1)
{
    plan *p = x->p;
    const copy *cp = &p->copies[c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    int nd = a->meta.ndim;
    uint64_t grid[ZB_MAX_DIMS], n = 1, n_other = 1;
    for (int d = 0; d < nd; d++) {
        grid[d] = (a->meta.shape[d] + a->inner[d] - 1) / a->inner[d];
        n *= a->meta.chunks[d] / a->inner[d];
        if (d > 0) n_other *= grid[d];
    }
    /* the task's unit rows, and the index entries they cover: the shard's inner chunks are
     * numbered in C order, so rows [r_lo, r_hi] of it hold entries [r_lo * m, (r_hi + 1) * m)
     * with m the inner chunks per row */
    size_t rows_u = 0;
    uint64_t u_lo = UINT64_MAX, u_hi = 0;
    for (size_t i = c0; i < c1; i++) {
        uint64_t u = p->copies[i].unit;
        if (i == c0 || u != p->copies[i - 1].unit) rows_u++;
        if (u < u_lo) u_lo = u;
        if (u > u_hi) u_hi = u;
    }
    uint64_t cps0 = a->meta.chunks[0] / a->inner[0], m_row = n / cps0;
    uint64_t e_lo = u_lo % cps0 * m_row, e_n = (u_hi - u_lo + 1) * m_row;
    bool raw = raw_rows(a); /* serve_raw converts as it copies */
    uint64_t unit_bytes = zb_array_unit_bytes(a);
    const uint8_t *obj = NULL; /* raw: a view of the whole shard */
    uint64_t obj_len = 0;
    void *obj_tok = NULL;
    uint64_t *entries = malloc((size_t)(2 * e_n * sizeof(uint64_t)));
    want *w = malloc(rows_u * (size_t)n_other * sizeof *w + 1);
    zb_status st = ZB_OK;
    char key[4600];
    size_t nw = 0;
    if (!entries || !w) {
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
        goto done;
    }
    uint64_t g[ZB_MAX_DIMS] = {0};
    g[0] = cp->unit;
    st = zb_array_unit_object(a, g, key, sizeof key, NULL, NULL);
    if (st == ZB_OK) st = shard_entries(x, a, g, e_lo, e_n, entries, n);
    /* raw inner chunks: one view of the whole shard serves every unit of the task */
    if (st == ZB_OK && raw) {
        zb_status vs = zb_store_view(a->store, key, 0, UINT64_MAX, &obj, &obj_len, &obj_tok);
        if (vs == ZB_OK && !obj) obj = (const uint8_t *)""; /* an empty shard: all truncated */
        if (vs != ZB_OK) {
            obj = NULL;
            if (vs == ZB_E_UNSUPPORTED || vs == ZB_E_NOTFOUND) zb_clear_error();
            else st = vs;
        }
    }
    for (size_t i = c0; i < c1 && st == ZB_OK;) {
        size_t j = i + 1;
        while (j < c1 && p->copies[j].unit == p->copies[i].unit) j++;
        memset(g, 0, sizeof g);
        g[0] = p->copies[i].unit;
        do {
            uint64_t e;
            st = zb_array_unit_object(a, g, NULL, 0, NULL, &e); /* key: the task's shard */
            if (st != ZB_OK) break;
            e -= e_lo; /* the task's part of the index */
            if (entries[2 * e] == ZB_SHARD_EMPTY) {
                st = serve_unit(x, i, j, g, NULL, 0, true, key, NULL);
                continue;
            }
            if (raw) {
                if (entries[2 * e + 1] != unit_bytes)
                    st = zb_err(ZB_E_CORRUPT,
                                "%s: inner chunk at offset %llu holds %llu bytes, expected %llu",
                                key, (unsigned long long)entries[2 * e],
                                (unsigned long long)entries[2 * e + 1],
                                (unsigned long long)unit_bytes);
                else
                    st = serve_raw(x, i, j, key, entries[2 * e], obj, obj_len);
                continue;
            }
            /* a cached inner chunk needs neither a range read nor a decode */
            if (unit_cached(x, a, g)) {
                st = serve_unit(x, i, j, g, NULL, 0, false, key, &entries[2 * e]);
                continue;
            }
            w[nw].off = entries[2 * e];
            w[nw].len = entries[2 * e + 1];
            w[nw].c0 = i;
            w[nw].c1 = j;
            memcpy(w[nw].g, g, sizeof g);
            nw++;
        } while (st == ZB_OK && nd > 1 && next_other(g, grid, nd));
        i = j;
    }
    if (st != ZB_OK) goto done;
    qsort(w, nw, sizeof *w, cmp_want);
    for (size_t i = 0; i < nw && st == ZB_OK;) {
        uint64_t ms = w[i].off, me = w[i].off + w[i].len;
        size_t k = i + 1;
        while (k < nw) {
            uint64_t e = w[k].off + w[k].len, ne = e > me ? e : me;
            if (w[k].off > me + MERGE_GAP || ne - ms > MERGE_MAX) break;
            me = ne;
            k++;
        }
        const uint8_t *dst = NULL;
        void *tok = NULL;
        st = fetch_exact(x, a, key, ms, me - ms, &dst, &tok);
        for (; st == ZB_OK && i < k; i++)
            st = serve_unit(x, w[i].c0, w[i].c1, w[i].g, dst + (w[i].off - ms),
                            (size_t)w[i].len, false, key, NULL);
        zb_store_release(a->store, tok);
    }
done:
    zb_store_release(a->store, obj_tok);
    free(entries);
    free(w);
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
    bfield *bf = &p->b->fields[cp->field];
    const int64_t *lut;
    uint64_t nlut;
    bool conv = converted(p, cp->field, cp->child, &lut, &nlut);
    size_t row_bytes = (size_t)(bf->row_elems * bf->itemsize);
    size_t src_row_bytes = (size_t)(a->row_elems * a->meta.itemsize); /* as stored */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = c0; i < c1; i++) {
        uint64_t r0 = p->copies[i].unit * a->inner[0] + p->copies[i].src_row;
        if (r0 < lo) lo = r0;
        if (r0 + p->copies[i].nrows > hi) hi = r0 + p->copies[i].nrows;
    }
    size_t bytes = (size_t)(hi - lo) * src_row_bytes;
    uint8_t *band;
    if (c1 - c0 == 1 && !conv) {
        band = bf->data + cp->dst_row * row_bytes;
    } else {
        ZB_TRY(zb_buf_reserve(&x->ctx->scratch[SCR_UNIT], bytes ? bytes : 1));
        band = x->ctx->scratch[SCR_UNIT].data;
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
        uint64_t r0 = c->unit * a->inner[0] + c->src_row;
        if (conv)
            ZB_TRY(zb_values_convert(bf->data + c->dst_row * row_bytes, bf->dtype,
                                  band + (r0 - lo) * src_row_bytes, a->meta.dtype,
                                  c->nrows * bf->row_elems, lut, nlut, a->path));
        else if (c1 - c0 > 1)
            memcpy(bf->data + c->dst_row * row_bytes, band + (r0 - lo) * row_bytes,
                   (size_t)c->nrows * row_bytes);
        x->t->stats.bytes_delivered += c->nrows * row_bytes;
        if (rebased_here(p, c->field))
            ZB_TRY(rebase_rows(p, c->field, c->dst_row, c->nrows, 0, bf->row_elems));
    }
    return ZB_OK;
}

typedef enum path_kind { PATH_PLAIN, PATH_SHARD, PATH_ROWS } path_kind;

static path_kind
path_of(const zb_array *a)
{
    if (a->meta.chain.ab != ZB_AB_SHARDING) return PATH_PLAIN;
    if (zb_array_whole_shard(a)) return PATH_ROWS;
    for (int d = 1; d < a->meta.ndim; d++)
        if (a->meta.chunks[d] < a->meta.shape[d]) return PATH_ROWS;
    return PATH_SHARD;
}

static void
run_task(void *arg, zb_ctx *ctx)
{
    exec *x = arg;
    plan *p = x->p;
    x->ctx = ctx;
    const copy *cp = &p->copies[x->t->c0];
    const zb_array *a = child_of(p->ds, cp->child)->fields[cp->field].arr;
    zb_status st;
    switch (path_of(a)) {
    case PATH_PLAIN: {
        /* a plain task may hold several unit rows: serve each */
        st = ZB_OK;
        for (size_t i = x->t->c0; i < x->t->c1 && st == ZB_OK;) {
            size_t j = i + 1;
            while (j < x->t->c1 && p->copies[j].unit == p->copies[i].unit) j++;
            st = run_plain(x, i, j);
            i = j;
        }
    } break;
    case PATH_SHARD: st = run_shard(x, x->t->c0, x->t->c1); break;
    default: st = run_rows(x, x->t->c0, x->t->c1); break;
    }
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
    zb_stream_fence(); /* this worker's streamed rows before the request completes */
}

/* The end of the task that starts at copy i: the copies of one unit row, or of a few unit
 * rows of one shard row. */
static size_t
task_end(const plan *p, size_t i)
{
    const copy *c = &p->copies[i];
    const zb_array *a = child_of(p->ds, c->child)->fields[c->field].arr;
    path_kind pk = path_of(a);
    /* the units [lo, hi) one task may span: c's unit row, or c's shard row */
    uint64_t lo = c->unit, hi = c->unit + 1;
    if (pk == PATH_SHARD) {
        uint64_t cps0 = a->meta.chunks[0] / a->inner[0];
        lo = c->unit / cps0 * cps0;
        hi = lo + cps0;
    }
    size_t j = i + 1, units = 1;
    while (j < p->ncopies) {
        const copy *d = &p->copies[j];
        if (d->field != c->field || d->child != c->child) break;
        if (d->unit < lo || d->unit >= hi) break;
        /* a shard row is cut into tasks of a few unit rows, so the threads share it; each
         * piece still merges its neighbouring inner chunks into one range read */
        if (pk == PATH_SHARD && d->unit != p->copies[j - 1].unit && ++units > SHARD_TASK_UNITS)
            break;
        j++;
    }
    return j;
}

/* Groups the sorted copies into tasks: one per unit row (plain), a few unit rows of one shard
 * row (sharded). */
static zb_status
make_tasks(plan *p)
{
    /* one pass, the array grown by doubling: there are far fewer tasks than copies (a record
     * per copy was 2.5% of a block read) */
    for (size_t i = 0, j; i < p->ncopies; i = j) {
        j = task_end(p, i);
        /* the work estimate: the decoded bytes of the task's unit rows */
        const copy *c = &p->copies[i];
        const zb_array *a = child_of(p->ds, c->child)->fields[c->field].arr;
        uint64_t rows = 1, row_bytes = zb_array_unit_bytes(a);
        for (size_t k = i + 1; k < j; k++) rows += p->copies[k].unit != p->copies[k - 1].unit;
        for (int d = 1; d < a->meta.ndim; d++)
            row_bytes *= (a->meta.shape[d] + a->inner[d] - 1) / a->inner[d];
        p->work += rows * row_bytes;
        if (p->ntasks == p->tasks_cap &&
            !grow_array((void **)&p->tasks, &p->tasks_cap, p->ntasks + 1, sizeof *p->tasks))
            return zb_err(ZB_E_NOMEM, "read_many: out of memory for tasks");
        p->tasks[p->ntasks++] = (task){.c0 = i, .c1 = j};
    }
    return ZB_OK;
}

/* ---- read_many ---------------------------------------------------------------------------- */

/* Hands the plan's memory back to the dataset (the tasks' messages freed). */
static void
plan_end(plan *p)
{
    for (size_t t = 0; t < p->ntasks; t++) free(p->tasks[t].msg);
    zb_plan_mem *m = p->m;
    m->copies = p->copies;
    m->copies_cap = p->cap;
    m->tasks = p->tasks;
    m->tasks_cap = p->tasks_cap;
    plan_mem_give(p->ds, m);
}

static zb_status
locate(zb_dataset *ds, uint64_t id, uint64_t nlogical, uint32_t *child, uint64_t *phys)
{
    if (id >= nlogical)
        return zb_err(ZB_E_RANGE, "%s: sample id %llu outside [0, %llu)",
                      zb_dataset_name(ds), (unsigned long long)id,
                      (unsigned long long)nlogical);
    if (ds->nchildren) {
        size_t lo = 0, hi = ds->nchildren;
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (ds->child_start[mid] <= id)
                lo = mid;
            else
                hi = mid;
        }
        *child = (uint32_t)lo;
        zb_dataset *ch = ds->children[lo];
        *phys = zb_mask_select(&ch->mask, id - ds->child_start[lo]);
        return ZB_OK;
    }
    *child = 0;
    *phys = zb_mask_select(&ds->mask, id);
    return ZB_OK;
}

/* Whether the tasks can re-base index field f as its rows land: every child's array is 1-d or
 * 2-d (a unit covers whole rows or some columns of each) or in units spanning whole rows. (The
 * other reader paths copy boxes of part of a row; such fields are re-based after the tasks.) */
static bool
can_rebase_in_tasks(const zb_dataset *ds, size_t f)
{
    size_t nc = ds->nchildren ? ds->nchildren : 1;
    for (size_t c = 0; c < nc; c++) {
        const zb_array *a = child_of(ds, (uint32_t)c)->fields[f].arr;
        if (a->meta.ndim <= 2) continue;
        for (int d = 1; d < a->meta.ndim; d++)
            if (a->inner[d] != a->meta.shape[d]) return false;
    }
    return true;
}

/* Fills p->rb for the index fields: each sample's stored range and shift, re-based to its group
 * of b->groups (the whole batch without groups), and who applies it. */
static zb_status
plan_rebase(plan *p, const int64_t *seg_start)
{
    const zb_dataset *pr = child_of(p->ds, 0);
    zb_batch *b = p->b;
    zb_plan_mem *m = p->m;
    size_t n = p->n, nidx = 0;
    for (size_t f = 0; f < pr->nfields; f++) nidx += pr->fields[f].kind == ZB_FIELD_INDEX;
    if (!nidx) return ZB_OK;
    if (!grow_array((void **)&m->rb, &m->rb_cap, pr->nfields, sizeof *m->rb) ||
        !grow_array((void **)&m->rb_vals, &m->rb_vals_cap, 3 * nidx * n + 1,
                    sizeof *m->rb_vals))
        return zb_err(ZB_E_NOMEM, "read_many: out of memory");
    p->rb = m->rb;
    int64_t *vals = m->rb_vals;
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb_field *fd = &pr->fields[f];
        rebase *r = &p->rb[f];
        memset(r, 0, sizeof *r);
        if (fd->kind != ZB_FIELD_INDEX) continue;
        r->in_tasks = can_rebase_in_tasks(p->ds, f);
        r->rows = b->segs[fd->seg].ptr;
        r->shift = vals;
        r->lo = vals + n;
        r->len = vals + 2 * n;
        vals += 3 * n;
        const int64_t *tp = b->segs[fd->target].ptr;
        size_t g = 0, g0 = 0; /* the group of sample i and its first sample */
        for (size_t i = 0; i < n; i++) {
            while (b->groups && i >= b->groups[g + 1]) g0 = b->groups[++g];
            const zb_dataset *ch = child_of(p->ds, p->child[i]);
            int64_t sub = ch->fields[f].global_index ? seg_start[(size_t)fd->target * n + i] : 0;
            r->lo[i] = sub;
            r->len[i] = tp[i + 1] - tp[i];
            r->shift[i] = (tp[i] - tp[g0]) - sub;
        }
    }
    return ZB_OK;
}

/* A sample of a string field: where its string lies in its child's array, and where it went
 * (read_strings). */
typedef struct str_req {
    uint32_t child;
    uint64_t row;
    size_t i;            /* the sample */
    uint64_t off, len;   /* its bytes in the gathered buffer */
} str_req;

static int
cmp_str_req(const void *x, const void *y)
{
    const str_req *a = x, *b = y;
    if (a->child != b->child) return a->child < b->child ? -1 : 1;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* String field f of the batch (zb_dataset_opts.load_strings): its samples sorted by child and
 * row, each unit (chunk, or inner chunk) they touch decoded once with the rows they need, then
 * the strings laid out in batch order. Runs on the calling thread after the tasks: strings are
 * delivered on request, not on the fixed-size fields' fast path. */
static zb_status
read_strings(plan *p, uint32_t f, const uint64_t *phys)
{
    size_t n = p->n;
    bfield *bf = &p->b->fields[f];
    str_req *rq = malloc((n + 1) * sizeof *rq);
    zb_buf got = {0};
    zb_status st = rq ? ZB_OK : zb_err(ZB_E_NOMEM, "read_many: out of memory for %s", bf->name);
    for (size_t i = 0; i < n && st == ZB_OK; i++) rq[i] = (str_req){p->child[i], phys[i], i, 0, 0};
    if (st == ZB_OK) qsort(rq, n, sizeof *rq, cmp_str_req);
    for (size_t i = 0, j; i < n && st == ZB_OK; i = j) {
        const zb_array *a = child_of(p->ds, rq[i].child)->fields[f].arr;
        uint64_t U = a->inner[0], unit = rq[i].row / U;
        for (j = i + 1; j < n && rq[j].child == rq[i].child && rq[j].row / U == unit; j++) {}
        zb_strings s = {0};
        st = zb_array_read_strings(a, rq[i].row, rq[j - 1].row + 1, &s, NULL);
        for (size_t k = i; k < j && st == ZB_OK; k++) {
            uint64_t r = rq[k].row - rq[i].row;
            rq[k].off = got.len;
            rq[k].len = s.offsets[r + 1] - s.offsets[r];
            st = zb_buf_append(&got, s.data + s.offsets[r], (size_t)rq[k].len);
        }
        zb_strings_free(&s);
    }
    bf->offs = st == ZB_OK ? malloc((n + 1) * sizeof *bf->offs) : NULL;
    bf->data = st == ZB_OK ? malloc(got.len + 1) : NULL;
    if (st == ZB_OK && (!bf->offs || !bf->data))
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory for %s", bf->name);
    bf->owns_offs = bf->offs != NULL;
    bf->owned = bf->data != NULL;
    if (st == ZB_OK) {
        /* batch order: each sample's length by position, then the bytes */
        for (size_t k = 0; k < n; k++) bf->offs[rq[k].i + 1] = (int64_t)rq[k].len;
        bf->offs[0] = 0;
        for (size_t i = 0; i < n; i++) bf->offs[i + 1] += bf->offs[i];
        for (size_t k = 0; k < n; k++)
            memcpy(bf->data + bf->offs[rq[k].i], got.data + rq[k].off, (size_t)rq[k].len);
        bf->nrows = n;
        p->b->stats.bytes_delivered += got.len;
    }
    free(rq);
    zb_buf_free(&got);
    return st;
}

/* Genes of children whose order is not the collection's (zb_dataset_opts.reorder_vars): dense
 * rows permuted, CSR gene ids mapped and each row re-sorted with its values. */
static zb_status
reorder_vars(plan *p)
{
    zb_dataset *ds = p->ds;
    const zb_dataset *pr = child_of(ds, 0);
    zb_batch *b = p->b;
    zb_buf scratch = {0};
    zb_status st = ZB_OK;
    for (size_t f = 0; f < pr->nfields && st == ZB_OK; f++) {
        const zb_field *fd = &pr->fields[f];
        if (!fd->var_cols) continue;
        bfield *bf = &b->fields[f];
        bfield *vals = NULL; /* CSR: the values sharing the gene ids' segment */
        for (size_t k = 0; fd->seg >= 0 && k < pr->nfields; k++)
            if (k != f && pr->fields[k].seg == fd->seg) vals = &b->fields[k];
        if (fd->seg >= 0 && !vals) continue;
        size_t row_bytes = (size_t)(bf->row_elems * bf->itemsize);
        if (fd->seg < 0) st = zb_buf_reserve(&scratch, row_bytes);
        for (size_t i = 0; i < p->n && st == ZB_OK; i++) {
            const int64_t *lut = ds->vars.lut[p->child[i]];
            if (!lut) continue;
            if (fd->seg < 0) {
                zb_var_reorder_dense(bf->data + i * row_bytes, bf->row_elems, bf->itemsize, lut,
                                     scratch.data);
                continue;
            }
            const int64_t *ptr = b->segs[fd->seg].ptr;
            st = zb_var_reorder_csr(bf->data + (size_t)ptr[i] * bf->itemsize, bf->dtype,
                                    vals->data + (size_t)ptr[i] * vals->itemsize, vals->itemsize,
                                    (uint64_t)(ptr[i + 1] - ptr[i]), lut, ds->n_vars, &scratch,
                                    child_of(ds, p->child[i])->fields[f].arr->path);
        }
    }
    zb_buf_free(&scratch);
    return st;
}

zb_status
zb_dataset_read_many(zb_dataset *ds, const uint64_t *ids, size_t n, zb_batch **out)
{
    return zb_dataset_read_batches(ds, ids, n, NULL, 0, out);
}

zb_status
zb_dataset_read_batches(zb_dataset *ds, const uint64_t *ids, size_t n, const size_t *sizes,
                        size_t nbatches, zb_batch **out)
{
    return zb_dataset_read_batches_in(ds, NULL, ids, n, sizes, nbatches, out);
}

zb_status
zb_dataset_read_batches_in(zb_dataset *ds, zb_arena_pool *pool, const uint64_t *ids, size_t n,
                           const size_t *sizes, size_t nbatches, zb_batch **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "read_many: null out");
    *out = NULL;
    if (!ds || (!ids && n) || (nbatches && !sizes))
        return zb_err(ZB_E_INVALID, "read_many: null argument");
    size_t total = 0;
    for (size_t k = 0; k < nbatches; k++) total += sizes[k];
    if (nbatches && total != n)
        return zb_err(ZB_E_INVALID, "zb_dataset_read_batches: batch sizes add up to %zu, not %zu",
                      total, n);
    uint64_t nlogical;
    ZB_TRY(zb_dataset_len(ds, &nlogical));
    for (size_t c = 0; c < ds->nchildren; c++) ZB_TRY(zb_mask_load(ds->children[c]));

    const zb_dataset *pr = child_of(ds, 0);
    zb_status st = ZB_OK;
    zb_plan_mem *m = plan_mem_take(ds);
    zb_batch *b = m ? calloc(1, sizeof *b) : NULL;
    if (!b) {
        plan_mem_give(ds, m);
        return zb_err(ZB_E_NOMEM, "read_many: out of memory");
    }
    plan p = {.ds = ds, .b = b, .m = m, .copies = m->copies, .cap = m->copies_cap,
              .tasks = m->tasks, .tasks_cap = m->tasks_cap};
    m->copies = NULL; /* the plan owns them until the end (push_copy and make_tasks grow them) */
    m->tasks = NULL;
    uint32_t *child = NULL;
    uint64_t *phys = NULL;
    int64_t *seg_start = NULL; /* [nsegs][n] */
    zb_ctx *ctx = m->ctx;
    exec *xs = NULL;
    size_t *arena_off = NULL;
    b->B = n;
    b->refs = 1;
    b->n_vars = ds->n_vars;
    b->nfields = pr->nfields;
    b->nsegs = pr->nsegs;
    b->fields = calloc(pr->nfields + 1, sizeof *b->fields);
    b->segs = calloc(pr->nsegs + 1, sizeof *b->segs);
    b->index = malloc((n + 1) * sizeof *b->index);
    if (grow_array((void **)&m->child, &m->child_cap, n + 1, sizeof *m->child)) child = m->child;
    if (grow_array((void **)&m->phys, &m->phys_cap, n + 1, sizeof *m->phys)) phys = m->phys;
    if (grow_array((void **)&m->seg_start, &m->seg_cap, pr->nsegs * n + 1, sizeof *seg_start))
        seg_start = m->seg_start;
    if (ds->nchildren) b->dataset = malloc((n + 1) * sizeof *b->dataset);
    if (!b->fields || !b->segs || !b->index || !child || !phys || !seg_start ||
        (ds->nchildren && !b->dataset)) {
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
        goto fail;
    }

    /* 1. ids -> (child, physical) */
    for (size_t i = 0; i < n; i++) {
        st = locate(ds, ids[i], nlogical, &child[i], &phys[i]);
        if (st != ZB_OK) goto fail;
        b->index[i] = ids[i];
        if (b->dataset) b->dataset[i] = (int32_t)child[i];
    }
    p.n = n;
    p.child = child;
    /* 2. segments: element ranges per sample and the batch pointer arrays */
    for (size_t s = 0; s < pr->nsegs; s++) {
        bseg *bs = &b->segs[s];
        snprintf(bs->name, sizeof bs->name, "%s", pr->segs[s].name);
        bs->ptr = malloc((n + 1) * sizeof *bs->ptr);
        if (!bs->ptr) {
            st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
            goto fail;
        }
        bs->ptr[0] = 0;
        for (size_t i = 0; i < n; i++) {
            zb_segment *seg = &((zb_dataset *)child_of(ds, child[i]))->segs[s];
            int64_t a0, a1;
            st = zb_segment_get(seg, ctx, phys[i], &a0);
            if (st == ZB_OK) st = zb_segment_get(seg, ctx, phys[i] + 1, &a1);
            if (st != ZB_OK) goto fail;
            if (a1 < a0 || a0 < 0)
                st = zb_err(ZB_E_CORRUPT, "%s: pointers [%lld, %lld] at sample %llu are not "
                            "monotone", seg->ptr->path, (long long)a0, (long long)a1,
                            (unsigned long long)phys[i]);
            if (st != ZB_OK) goto fail;
            seg_start[s * n + i] = a0;
            bs->ptr[i + 1] = bs->ptr[i] + (a1 - a0);
        }
    }
    /* 3. batch buffers (one arena block, 64-byte aligned fields) and copies */
    if (!grow_array((void **)&m->arena_off, &m->off_cap, pr->nfields + 1, sizeof *arena_off)) {
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
        goto fail;
    }
    arena_off = m->arena_off;
    size_t arena_need = 0;
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb_field *fd = &pr->fields[f];
        uint64_t rows = fd->seg >= 0 ? (uint64_t)b->segs[fd->seg].ptr[n] : n;
        size_t isz = zb_dtype_size(zb_dataset_field_dtype(ds, f)); /* 0 for strings */
        arena_off[f] = arena_need;
        arena_need += ((size_t)(rows * fd->row_elems * isz) + 63) & ~(size_t)63;
    }
    p.stream = arena_need >= ZB_STREAM_MIN_BATCH_BYTES;
    b->arenas = pool ? pool : ds->arenas;
    b->arena = arena_take(b->arenas, arena_need + 64, &b->arena_cap);
    if (!b->arena) {
        zb_arena_pool_unref(b->arenas);
        b->arenas = NULL;
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory for a %zu-byte batch", arena_need);
        goto fail;
    }
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb_field *fd = &pr->fields[f];
        bfield *bf = &b->fields[f];
        bf->name = strdup(fd->name);
        bf->kind = fd->kind;
        bf->dtype = zb_dataset_field_dtype(ds, f);
        bf->itemsize = zb_dtype_size(bf->dtype);
        bf->ndim = fd->ndim;
        memcpy(bf->row_shape, fd->row_shape, sizeof bf->row_shape);
        bf->row_elems = fd->row_elems;
        bf->seg = fd->seg;
        bf->target = fd->target;
        bf->owned = false; /* in the batch's arena */
        bf->nrows = fd->seg >= 0 ? (uint64_t)b->segs[fd->seg].ptr[n] : n;
        uint64_t bytes = bf->nrows * bf->row_elems * bf->itemsize;
        bf->data = b->arena ? (uint8_t *)b->arena + arena_off[f] : NULL;
        if (!bf->name || !bf->data) {
            st = zb_err(ZB_E_NOMEM, "read_many: out of memory for %s (%llu bytes)", fd->name,
                        (unsigned long long)bytes);
            goto fail;
        }
        if (bf->dtype == ZB_DT_STRING) continue; /* read after the tasks (read_strings) */
        /* runs of consecutive source rows from one child coalesce into one run */
        uint64_t run_src = 0, run_n = 0, run_dst = 0;
        uint32_t run_child = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t src, len, dst;
            if (fd->seg >= 0) {
                src = (uint64_t)seg_start[(size_t)fd->seg * n + i];
                len = (uint64_t)(b->segs[fd->seg].ptr[i + 1] - b->segs[fd->seg].ptr[i]);
                dst = (uint64_t)b->segs[fd->seg].ptr[i];
                /* monotone pointers can still run past the values (a pointer larger than the
                 * last one): that is corruption, not rows to read as fill */
                const zb_dataset *ch = child_of(ds, child[i]);
                uint64_t rows = ch->fields[f].arr->meta.shape[0];
                if (src + len > rows) {
                    st = zb_err(ZB_E_CORRUPT, "%s: pointers of sample %llu end at %llu, past the "
                                "%llu rows of %s", ch->segs[fd->seg].ptr->path,
                                (unsigned long long)phys[i], (unsigned long long)(src + len),
                                (unsigned long long)rows, ch->fields[f].arr->path);
                    goto fail;
                }
            } else {
                src = phys[i];
                len = 1;
                dst = i;
            }
            if (run_n && child[i] == run_child && src == run_src + run_n &&
                dst == run_dst + run_n) {
                run_n += len;
                continue;
            }
            if (run_n) {
                st = add_run(&p, (uint32_t)f, run_child, run_src, run_n, run_dst);
                if (st != ZB_OK) goto fail;
            }
            run_src = src;
            run_n = len;
            run_dst = dst;
            run_child = child[i];
        }
        if (run_n) {
            st = add_run(&p, (uint32_t)f, run_child, run_src, run_n, run_dst);
            if (st != ZB_OK) goto fail;
        }
    }
    st = sort_copies(&p);
    if (st == ZB_OK) st = make_tasks(&p);
    if (st != ZB_OK) goto fail;

    /* the caller's batches, which index fields are re-based to */
    if (nbatches) {
        b->groups = malloc((nbatches + 1) * sizeof *b->groups);
        if (!b->groups) {
            st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
            goto fail;
        }
        b->groups[0] = 0;
        for (size_t k = 0; k < nbatches; k++) b->groups[k + 1] = b->groups[k] + sizes[k];
        b->ngroups = nbatches;
    }
    st = plan_rebase(&p, seg_start);
    if (st != ZB_OK) goto fail;

    /* 4. execute on the pool (one read_many drives it at a time) */
    if (!grow_array((void **)&m->xs, &m->xs_cap, p.ntasks + 1, sizeof *xs)) {
        st = zb_err(ZB_E_NOMEM, "read_many: out of memory");
        goto fail;
    }
    xs = m->xs;
    for (size_t t = 0; t < p.ntasks; t++) xs[t] = (exec){&p, &p.tasks[t], NULL};
    /* one drain job per worker, each taking the next task off a shared counter: a request of
     * thousands of small tasks then costs a handful of queue hand-offs, not one (with a
     * thread wake-up) per task */
    drain dr = {xs, p.ntasks, 0};
    if (p.work <= ds->opts.inline_work_bytes) {
        /* too little to share (zb_dataset_opts.inline_work_bytes): waking the pool and waiting
         * for it costs tens of microseconds on a shared machine, what LZ4 takes for ~100 KiB;
         * a loader's two workers still read two windows at once. A window of 4,096 small
         * samples (278 KB decoded) reads 25% faster this way ("What moved the numbers" 22). */
        run_drain(&dr, ctx);
    } else {
        pthread_mutex_lock(&ds->pool_mu);
        size_t jobs = (size_t)zb_pool_threads(ds->pool);
        if (jobs > p.ntasks) jobs = p.ntasks;
        for (size_t j = 0; j < jobs; j++) zb_pool_submit(ds->pool, run_drain, &dr);
        zb_pool_wait(ds->pool);
        pthread_mutex_unlock(&ds->pool_mu);
    }
    for (size_t t = 0; t < p.ntasks; t++) {
        task *tk = &p.tasks[t];
        b->stats.chunks_decoded += tk->stats.chunks_decoded;
        b->stats.chunks_cached += tk->stats.chunks_cached;
        b->stats.chunks_filled += tk->stats.chunks_filled;
        b->stats.bytes_fetched += tk->stats.bytes_fetched;
        b->stats.bytes_decoded += tk->stats.bytes_decoded;
        b->stats.bytes_delivered += tk->stats.bytes_delivered;
        b->stats.range_reads += tk->stats.range_reads;
    }
    for (size_t t = 0; t < p.ntasks; t++)
        if (p.tasks[t].st != ZB_OK) {
            const char *msg = p.tasks[t].msg;
            st = zb_err(p.tasks[t].st, "%s", msg ? msg : "read_many: a read failed");
            goto fail;
        }

    /* 5. index fields the tasks did not re-base (plan_rebase), re-based here */
    for (size_t f = 0; f < pr->nfields && p.rb; f++) {
        const rebase *r = &p.rb[f];
        if (!r->shift || r->in_tasks) continue;
        st = rebase_rows(&p, (uint32_t)f, 0, (uint64_t)r->rows[n], 0, b->fields[f].row_elems);
        if (st != ZB_OK) goto fail;
    }
    /* 6. strings (load_strings), and genes in the collection's order (reorder_vars) */
    for (size_t f = 0; f < pr->nfields && st == ZB_OK; f++)
        if (b->fields[f].dtype == ZB_DT_STRING) st = read_strings(&p, (uint32_t)f, phys);
    if (st == ZB_OK && ds->vars.lut) st = reorder_vars(&p);
    if (st != ZB_OK) goto fail;
    plan_end(&p);
    *out = b;
    return ZB_OK;
fail:
    plan_end(&p);
    zb_batch_free(b);
    return st;
}
