/* The loader's device stage (zbatch_cuda.h). Windows are read into page-locked blocks of a pool
 * of the stage's own (reused like the dataset's pool: blocks come back when every batch of a
 * window is freed, so a steady loader allocates nothing). With placement DEVICE the
 * worker then issues each batch's copies: a device block is taken from the stage's free list
 * (a new one only when none is big enough), the copy stream waits on the GPU for the block's
 * previous consumer, the fields and a small page-locked "aux" buffer (segment pointers, index,
 * dataset ids, packed) go over with cudaMemcpyAsync, and an event is recorded. Nothing on this
 * path waits on the host.
 *
 * Release order: a released batch records `ready` on its consumer stream (the device block is
 * free for the GPU after it) and joins the retired list; its host copy and its block return
 * only once cudaEventQuery says its fence completed (polled on each release and each batch
 * handed out, on the consumer's thread, which alone frees batches). Closing the stage waits
 * for what is left. The fence of a DEVICE batch is its copy's event. A PINNED batch has no
 * copy of ours, but the consumer may have queued its own asynchronous copy out of the host
 * memory (torch's `.to(device, non_blocking=True)`): its release records a fence on the
 * consumer stream, so the window block is reused only after the work queued there so far
 * (as torch's caching host allocator does for the memory it pins). Fences come from the
 * stage's event pool. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/batch.h"
#include "loader/cuda.h"
#include "loader/device.h"
#include "util/status.h"

#define ALIGN 256 /* device sub-buffers start on CUDA's allocation alignment */

static size_t
align_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* A device block and the page-locked aux buffer that travels with it. */
typedef struct dblock {
    void *dev;
    size_t cap;
    void *aux;
    size_t aux_cap;
    cu_event ready; /* recorded on the consumer stream at release */
    bool used;      /* ready was recorded: a copy into the block waits on it */
    struct dblock *next;
} dblock;

typedef struct event_item {
    cu_event ev;
    struct event_item *next;
} event_item;

struct zb_device_batch {
    zb__devq *q; /* NULL: a host batch without a stage */
    zb_batch *host;
    dblock *blk;        /* NULL without a device copy */
    event_item *fence;  /* the host copy returns once it completed: the copy's event (DEVICE) or
                           the one recorded on the consumer stream at release (PINNED) */
    cu_stream consumer; /* set by zb_device_batch_wait (NULL: the legacy default stream) */
    size_t nfields, nsegs;
    struct zb_device_batch *next; /* the retired list */
    const void *ptr[];            /* fields, segments, index, dataset */
};

struct zb__devq {
    _Atomic int refs;
    zb_cuda *cuda;
    bool device;
    zb__arena_pool *pool;
    size_t nstreams;
    cu_stream *streams;
    pthread_mutex_t mu; /* the lists and counters below */
    dblock *free_blocks;
    event_item *free_events;
    zb_device_batch *retired;
    bool closed; /* the loader is gone: releases wait for their copy themselves */
    zb_device_stats stats;
};

/* ---- page-locked arena blocks ---------------------------------------------------------- */

static void *
pinned_alloc(size_t nbytes, void *user)
{
    zb__devq *q = user;
    void *p = NULL;
    /* page-locked memory is bound to the calling thread's device; workers are ours to set */
    if (q->cuda->cudaSetDevice(q->cuda->device) != CU_SUCCESS) return NULL;
    if (q->cuda->cudaHostAlloc(&p, nbytes, CU_HOST_ALLOC_PORTABLE) != CU_SUCCESS) return NULL;
    pthread_mutex_lock(&q->mu);
    q->stats.host_blocks++;
    q->stats.host_bytes += nbytes;
    pthread_mutex_unlock(&q->mu);
    return p;
}

static void
pinned_free(void *block, void *user)
{
    zb__devq *q = user;
    q->cuda->cudaFreeHost(block);
}

static void devq_unref(zb__devq *q);

static void
pinned_release(void *user)
{
    devq_unref(user); /* the pool held a reference on the stage (its runtime and counters) */
}

/* ---- open and close --------------------------------------------------------------------- */

static void
devq_free(zb__devq *q)
{
    zb_cuda *c = q->cuda;
    /* (retired batches hold references: none is left here) */
    for (size_t i = 0; i < q->nstreams; i++) {
        if (!q->streams[i]) continue;
        c->cudaStreamSynchronize(q->streams[i]);
        c->cudaStreamDestroy(q->streams[i]);
    }
    free(q->streams);
    dblock *b = q->free_blocks;
    while (b) {
        dblock *n = b->next;
        if (b->ready) c->cudaEventSynchronize(b->ready);
        if (b->ready) c->cudaEventDestroy(b->ready);
        c->cudaFree(b->dev);
        c->cudaFreeHost(b->aux);
        free(b);
        b = n;
    }
    event_item *e = q->free_events;
    while (e) {
        event_item *n = e->next;
        c->cudaEventDestroy(e->ev);
        free(e);
        e = n;
    }
    pthread_mutex_destroy(&q->mu);
    zb_cuda_close(c);
    free(q);
}

static void
devq_unref(zb__devq *q)
{
    if (q && atomic_fetch_sub(&q->refs, 1) == 1) devq_free(q);
}

static void drain(zb__devq *q);

void
zb__devq_unref(zb__devq *q)
{
    if (!q) return;
    zb__arena_pool *pool = q->pool;
    q->pool = NULL;
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_mutex_unlock(&q->mu);
    drain(q);
    devq_unref(q);
    zb__arena_pool_unref(pool); /* its blocks held by live batches keep it (and the stage) */
}

zb_status
zb__devq_open(const zb_loader_opts *o, zb__devq **out)
{
    *out = NULL;
    zb_cuda *cuda = NULL;
    ZB_TRY(zb_cuda_open(o->cuda_library, o->cuda_device, &cuda));
    zb__devq *q = calloc(1, sizeof *q);
    if (!q) {
        zb_cuda_close(cuda);
        return zb__err(ZB_E_NOMEM, "device stage: out of memory");
    }
    atomic_init(&q->refs, 1);
    q->cuda = cuda;
    q->device = o->placement == ZB_PLACE_DEVICE;
    pthread_mutex_init(&q->mu, NULL);
    zb_status st = ZB_OK;
    if (q->device) {
        q->nstreams = o->num_streams ? o->num_streams : 2;
        /* made by the workers on first use: a stream belongs to the current device of the
         * thread that creates it, and the opening thread's (PyTorch's) is not ours to set */
        q->streams = calloc(q->nstreams, sizeof *q->streams);
        if (!q->streams) st = zb__err(ZB_E_NOMEM, "device stage: out of memory");
    }
    zb__arena_alloc a = {pinned_alloc, pinned_free, pinned_release, q};
    if (st == ZB_OK) {
        atomic_fetch_add(&q->refs, 1); /* the pool's */
        st = zb__arena_pool_new_with(&a, &q->pool);
        if (st != ZB_OK) atomic_fetch_sub(&q->refs, 1);
    }
    if (st != ZB_OK) {
        devq_unref(q);
        return st;
    }
    *out = q;
    return ZB_OK;
}

zb__arena_pool *
zb__devq_pool(zb__devq *q)
{
    return q ? q->pool : NULL;
}

bool
zb__devq_on_device(const zb__devq *q)
{
    return q && q->device;
}

void
zb__devq_stats(const zb__devq *q, zb_device_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    if (!q) return;
    pthread_mutex_lock((pthread_mutex_t *)&q->mu);
    *stats = q->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&q->mu);
}

/* ---- copies ----------------------------------------------------------------------------- */

/* A free block with room for `need` device and `aux` page-locked bytes (the smallest that
 * fits), else a new one with some headroom, so batches of slightly varying size reuse it. */
static zb_status
block_take(zb__devq *q, size_t need, size_t aux, dblock **out)
{
    pthread_mutex_lock(&q->mu);
    dblock **best = NULL;
    for (dblock **pp = &q->free_blocks; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= need && (*pp)->aux_cap >= aux && (!best || (*pp)->cap < (*best)->cap))
            best = pp;
    dblock *b = best ? *best : NULL;
    if (b) *best = b->next;
    pthread_mutex_unlock(&q->mu);
    if (b) {
        *out = b;
        return ZB_OK;
    }
    zb_cuda *c = q->cuda;
    b = calloc(1, sizeof *b);
    if (!b) return zb__err(ZB_E_NOMEM, "device stage: out of memory");
    b->cap = need + need / 8 + 4096;
    b->aux_cap = aux + aux / 8 + 4096;
    zb_status st = zb__cuda_check(c, c->cudaMalloc(&b->dev, b->cap), "cudaMalloc");
    if (st == ZB_OK)
        st = zb__cuda_check(c, c->cudaHostAlloc(&b->aux, b->aux_cap, CU_HOST_ALLOC_PORTABLE),
                            "cudaHostAlloc");
    if (st == ZB_OK)
        st = zb__cuda_check(c, c->cudaEventCreateWithFlags(&b->ready, CU_EVENT_DISABLE_TIMING),
                            "cudaEventCreateWithFlags");
    if (st != ZB_OK) {
        if (b->dev) c->cudaFree(b->dev);
        if (b->aux) c->cudaFreeHost(b->aux);
        free(b);
        return st;
    }
    pthread_mutex_lock(&q->mu);
    q->stats.device_blocks++;
    q->stats.device_bytes += b->cap;
    pthread_mutex_unlock(&q->mu);
    *out = b;
    return ZB_OK;
}

static zb_status
event_take(zb__devq *q, event_item **out)
{
    pthread_mutex_lock(&q->mu);
    event_item *e = q->free_events;
    if (e) q->free_events = e->next;
    pthread_mutex_unlock(&q->mu);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) return zb__err(ZB_E_NOMEM, "device stage: out of memory");
        zb_status st = zb__cuda_check(
            q->cuda, q->cuda->cudaEventCreateWithFlags(&e->ev, CU_EVENT_DISABLE_TIMING),
            "cudaEventCreateWithFlags");
        if (st != ZB_OK) {
            free(e);
            return st;
        }
    }
    *out = e;
    return ZB_OK;
}

/* Returns a block and an event to the free lists. */
static void
give_back(zb__devq *q, dblock *b, event_item *e)
{
    pthread_mutex_lock(&q->mu);
    if (b) {
        b->next = q->free_blocks;
        q->free_blocks = b;
    }
    if (e) {
        e->next = q->free_events;
        q->free_events = e;
    }
    pthread_mutex_unlock(&q->mu);
}

static uint64_t
field_bytes(const zb_batch_view *v)
{
    if (v->dtype == ZB_DT_STRING || !v->data) return 0;
    uint64_t n = v->nrows * zb_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++) n *= v->row_shape[d];
    return n;
}

/* Lays the batch out in its device block (fields, then the aux part), fills the aux buffer and
 * issues the copies on `s`. */
static zb_status
issue_copies(zb__devq *q, zb_device_batch *db, cu_stream s)
{
    zb_cuda *c = q->cuda;
    const zb_batch *h = db->host;
    size_t B = zb_batch_size(h), need = 0, aux = 0;
    for (size_t i = 0; i < db->nfields; i++) {
        zb_batch_view v;
        ZB_TRY(zb_batch_field(h, i, &v));
        need += align_up((size_t)field_bytes(&v));
    }
    size_t seg_bytes = (B + 1) * sizeof(int64_t);
    aux = align_up(seg_bytes) * db->nsegs + align_up(B * sizeof(uint64_t)) +
          align_up(B * sizeof(int32_t));
    ZB_TRY(block_take(q, need + aux, aux, &db->blk));
    dblock *b = db->blk;
    /* the block's previous batch: its consumer's work must finish before this copy lands */
    if (b->used)
        ZB_TRY(zb__cuda_check(c, c->cudaStreamWaitEvent(s, b->ready, 0), "cudaStreamWaitEvent"));
    uint8_t *dev = b->dev;
    size_t off = 0, bytes = 0;
    for (size_t i = 0; i < db->nfields; i++) {
        zb_batch_view v;
        ZB_TRY(zb_batch_field(h, i, &v));
        size_t n = (size_t)field_bytes(&v);
        db->ptr[i] = v.dtype == ZB_DT_STRING ? NULL : dev + off;
        if (n) {
            ZB_TRY(zb__cuda_check(c, c->cudaMemcpyAsync(dev + off, v.data, n, CU_H2D, s),
                                  "cudaMemcpyAsync"));
            bytes += n;
        }
        off += align_up(n);
    }
    /* the aux part: packed in the page-locked buffer, one copy */
    uint8_t *host = b->aux;
    size_t a = 0;
    for (size_t i = 0; i < db->nsegs; i++) {
        const int64_t *ptr = NULL;
        zb_batch_segment_at(h, i, &ptr);
        memcpy(host + a, ptr, seg_bytes);
        db->ptr[db->nfields + i] = dev + off + a;
        a += align_up(seg_bytes);
    }
    memcpy(host + a, zb_batch_index(h), B * sizeof(uint64_t));
    db->ptr[db->nfields + db->nsegs] = dev + off + a;
    a += align_up(B * sizeof(uint64_t));
    const int32_t *ds = zb_batch_dataset(h);
    if (ds) {
        memcpy(host + a, ds, B * sizeof(int32_t));
        db->ptr[db->nfields + db->nsegs + 1] = dev + off + a;
    }
    a += align_up(B * sizeof(int32_t));
    ZB_TRY(zb__cuda_check(c, c->cudaMemcpyAsync(dev + off, host, a, CU_H2D, s), "cudaMemcpyAsync"));
    bytes += a;
    ZB_TRY(event_take(q, &db->fence));
    ZB_TRY(zb__cuda_check(c, c->cudaEventRecord(db->fence->ev, s), "cudaEventRecord"));
    pthread_mutex_lock(&q->mu);
    q->stats.batches_copied++;
    q->stats.bytes_copied += bytes;
    pthread_mutex_unlock(&q->mu);
    return ZB_OK;
}

zb_status
zb__devq_deliver(zb__devq *q, zb_batch *host, size_t k, zb_device_batch **out)
{
    *out = NULL;
    size_t nf = zb_batch_nfields(host), ns = zb_batch_nsegments(host);
    zb_device_batch *db = calloc(1, sizeof *db + (nf + ns + 2) * sizeof db->ptr[0]);
    if (!db) {
        zb_batch_free(host);
        return zb__err(ZB_E_NOMEM, "device batch: out of memory");
    }
    db->host = host;
    db->nfields = nf;
    db->nsegs = ns;
    if (q) {
        atomic_fetch_add(&q->refs, 1);
        db->q = q;
    }
    if (!q || !q->device) {
        *out = db;
        return ZB_OK;
    }
    zb_cuda *c = q->cuda;
    cu_stream *s = &q->streams[k % q->nstreams];
    zb_status st = zb__cuda_check(c, c->cudaSetDevice(c->device), "cudaSetDevice");
    if (st == ZB_OK) {
        pthread_mutex_lock(&q->mu);
        if (!*s)
            st = zb__cuda_check(c, c->cudaStreamCreateWithFlags(s, CU_STREAM_NON_BLOCKING),
                                "cudaStreamCreateWithFlags");
        pthread_mutex_unlock(&q->mu);
    }
    if (st == ZB_OK) st = issue_copies(q, db, *s);
    if (st != ZB_OK) {
        /* nothing was recorded on the block: it goes back as it was; copies already issued
         * read the host batch, so it is kept until the stream drains */
        if (*s) c->cudaStreamSynchronize(*s);
        give_back(q, db->blk, db->fence);
        zb_batch_free(host);
        devq_unref(q);
        free(db);
        return st;
    }
    *out = db;
    return ZB_OK;
}

/* ---- the consumer's side ---------------------------------------------------------------- */

/* Frees one retired batch (its fence completed). */
static void
retire(zb__devq *q, zb_device_batch *r)
{
    zb_batch_free(r->host);
    give_back(q, r->blk, r->fence);
    free(r);
    devq_unref(q);
}

/* Waits for the fences of every retired batch and frees them (the loader closes). */
static void
drain(zb__devq *q)
{
    pthread_mutex_lock(&q->mu);
    zb_device_batch *r = q->retired;
    q->retired = NULL;
    pthread_mutex_unlock(&q->mu);
    while (r) {
        zb_device_batch *n = r->next;
        q->cuda->cudaEventSynchronize(r->fence->ev);
        retire(q, r);
        r = n;
    }
}

/* Frees the retired batches whose fences completed. */
void
zb__devq_poll(zb__devq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    zb_device_batch *done = NULL;
    for (zb_device_batch **pp = &q->retired; *pp;) {
        zb_device_batch *r = *pp;
        if (q->cuda->cudaEventQuery(r->fence->ev) == CU_NOT_READY) {
            pp = &r->next;
            continue;
        }
        /* complete (or failed, which leaves nothing in flight either) */
        *pp = r->next;
        r->next = done;
        done = r;
    }
    pthread_mutex_unlock(&q->mu);
    while (done) {
        zb_device_batch *n = done->next;
        retire(q, done);
        done = n;
    }
}

const zb_batch *
zb_device_batch_host(const zb_device_batch *db)
{
    return db ? db->host : NULL;
}

bool
zb_device_batch_on_device(const zb_device_batch *db)
{
    return db && db->blk;
}

const void *
zb_device_batch_field(const zb_device_batch *db, size_t i)
{
    return db && db->blk && i < db->nfields ? db->ptr[i] : NULL;
}

const void *
zb_device_batch_segment(const zb_device_batch *db, size_t i)
{
    return db && db->blk && i < db->nsegs ? db->ptr[db->nfields + i] : NULL;
}

const void *
zb_device_batch_index(const zb_device_batch *db)
{
    return db && db->blk ? db->ptr[db->nfields + db->nsegs] : NULL;
}

const void *
zb_device_batch_dataset(const zb_device_batch *db)
{
    return db && db->blk ? db->ptr[db->nfields + db->nsegs + 1] : NULL;
}

void *
zb_device_batch_event(const zb_device_batch *db)
{
    return db && db->blk ? (void *)db->fence->ev : NULL;
}

zb_status
zb_device_batch_wait(zb_device_batch *db, void *stream)
{
    if (!db) return zb__err(ZB_E_INVALID, "zb_device_batch_wait: null batch");
    db->consumer = (cu_stream)stream; /* a pinned batch's release fences this stream */
    if (!db->blk) return ZB_OK;
    zb_cuda *c = db->q->cuda;
    return zb__cuda_check(c, c->cudaStreamWaitEvent(db->consumer, db->fence->ev, 0),
                          "zb_device_batch_wait: cudaStreamWaitEvent");
}

/* A PINNED batch's fence: an event of the pool recorded on `stream`. False when none could be
 * taken or recorded (the context is then broken: the caller waits for the stream instead). */
static bool
fence_on(zb__devq *q, zb_device_batch *db, cu_stream stream)
{
    if (event_take(q, &db->fence) != ZB_OK) return false;
    if (q->cuda->cudaEventRecord(db->fence->ev, stream) == CU_SUCCESS) return true;
    give_back(q, NULL, db->fence);
    db->fence = NULL;
    return false;
}

void
zb_device_batch_release_on(zb_device_batch *db, void *stream)
{
    if (!db) return;
    zb__devq *q = db->q;
    cu_stream s = (cu_stream)stream;
    bool fenced = false;
    if (q && db->blk) {
        /* the block is free for the GPU once the consumer's work queued so far is done; a
         * failed record leaves `used` unset, so the next copy does not wait on a stale event
         * (the consumer's stream is then broken and so is its context) */
        db->blk->used = q->cuda->cudaEventRecord(db->blk->ready, s) == CU_SUCCESS;
        fenced = true;
    } else if (q) {
        fenced = fence_on(q, db, s);
        if (!fenced) q->cuda->cudaStreamSynchronize(s);
    }
    if (!fenced) {
        /* a host batch, or a pinned one whose fence failed (its stream was waited for) */
        zb_batch_free(db->host);
        free(db);
        devq_unref(q);
        return;
    }
    pthread_mutex_lock(&q->mu);
    bool closed = q->closed;
    bool pending = q->cuda->cudaEventQuery(db->fence->ev) == CU_NOT_READY;
    if (pending) q->stats.retired_pending++;
    if (!closed) {
        db->next = q->retired;
        q->retired = db;
    }
    pthread_mutex_unlock(&q->mu);
    if (closed) {
        /* no loader polls any more: this one release waits, if its fence is still pending */
        if (pending) q->cuda->cudaEventSynchronize(db->fence->ev);
        retire(q, db);
        return;
    }
    zb__devq_poll(q);
}

void
zb_device_batch_release(zb_device_batch *db)
{
    if (db) zb_device_batch_release_on(db, db->consumer);
}
