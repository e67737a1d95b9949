/* The worker pool: a ring of queued tasks guarded by one mutex and three condition variables
 * (queue not empty, queue not full, all work done). */
#include "util/pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef struct task {
    zb__pool_fn fn;
    void *arg;
} task;

typedef struct worker {
    zb__pool *pool;
    zb_ctx *ctx;
    pthread_t thread;
} worker;

struct zb__pool {
    int nthreads;    /* 0: inline */
    worker *workers; /* [nthreads] */
    zb_ctx *inline_ctx;
    pthread_mutex_t mu;
    pthread_cond_t not_empty;
    pthread_cond_t not_full;
    pthread_cond_t done;
    task *ring; /* [cap] */
    size_t cap, head, count;
    size_t running; /* tasks taken off the ring and not finished yet */
    bool stop;
};

static void *
worker_main(void *p)
{
    worker *wk = p;
    zb__pool *pool = wk->pool;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->count == 0 && !pool->stop) pthread_cond_wait(&pool->not_empty, &pool->mu);
        /* stop is only set once the ring has drained (zb__pool_free waits first), but finish
         * whatever is queued anyway rather than drop a task */
        if (pool->count == 0) break;
        task t = pool->ring[pool->head];
        pool->head = (pool->head + 1) % pool->cap;
        pool->count--;
        pool->running++;
        pthread_cond_signal(&pool->not_full);
        pthread_mutex_unlock(&pool->mu);

        t.fn(t.arg, wk->ctx);

        pthread_mutex_lock(&pool->mu);
        pool->running--;
        if (pool->count == 0 && pool->running == 0) pthread_cond_broadcast(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* Stops and joins the first `started` workers and frees everything. */
static void
pool_destroy(zb__pool *pool, int started)
{
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->not_empty);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < started; i++) pthread_join(pool->workers[i].thread, NULL);
    for (int i = 0; pool->workers && i < pool->nthreads; i++) zb_ctx_free(pool->workers[i].ctx);
    zb_ctx_free(pool->inline_ctx);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->not_full);
    pthread_cond_destroy(&pool->not_empty);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool->ring);
    free(pool);
}

zb_status
zb__pool_new(int nthreads, zb__pool **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__pool_new: null out");
    *out = NULL;
    if (nthreads > ZB_POOL_MAX_THREADS)
        return zb__err(ZB_E_INVALID, "thread pool: %d threads requested (at most %d)", nthreads,
                       ZB_POOL_MAX_THREADS);
    zb__pool *pool = calloc(1, sizeof *pool);
    if (!pool) return zb__err(ZB_E_NOMEM, "thread pool: out of memory");
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->not_empty, NULL);
    pthread_cond_init(&pool->not_full, NULL);
    pthread_cond_init(&pool->done, NULL);
    zb_status st;
    int started = 0;

    if (nthreads <= 1) {
        st = zb_ctx_new(&pool->inline_ctx);
        if (st != ZB_OK) goto fail;
        *out = pool;
        return ZB_OK;
    }
    pool->nthreads = nthreads;
    pool->cap = 2 * (size_t)nthreads;
    pool->ring = calloc(pool->cap, sizeof *pool->ring);
    pool->workers = calloc((size_t)nthreads, sizeof *pool->workers);
    if (!pool->ring || !pool->workers) {
        st = zb__err(ZB_E_NOMEM, "thread pool: out of memory");
        goto fail;
    }
    for (int i = 0; i < nthreads; i++) {
        pool->workers[i].pool = pool;
        st = zb_ctx_new(&pool->workers[i].ctx);
        if (st != ZB_OK) goto fail;
    }
    for (; started < nthreads; started++) {
        int e = pthread_create(&pool->workers[started].thread, NULL, worker_main,
                               &pool->workers[started]);
        if (e != 0) {
            st = zb__err(ZB_E_IO, "thread pool: cannot start thread %d of %d (%s)", started + 1,
                         nthreads, strerror(e));
            goto fail;
        }
    }
    *out = pool;
    return ZB_OK;

fail:
    pool_destroy(pool, started);
    return st;
}

void
zb__pool_submit(zb__pool *pool, zb__pool_fn fn, void *arg)
{
    if (pool->nthreads == 0) {
        fn(arg, pool->inline_ctx);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    while (pool->count == pool->cap) pthread_cond_wait(&pool->not_full, &pool->mu);
    pool->ring[(pool->head + pool->count) % pool->cap] = (task){fn, arg};
    pool->count++;
    pthread_cond_signal(&pool->not_empty);
    pthread_mutex_unlock(&pool->mu);
}

void
zb__pool_wait(zb__pool *pool)
{
    if (!pool || pool->nthreads == 0) return;
    pthread_mutex_lock(&pool->mu);
    while (pool->count > 0 || pool->running > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

int
zb__pool_threads(const zb__pool *pool)
{
    if (!pool) return 0;
    return pool->nthreads ? pool->nthreads : 1;
}

void
zb__pool_free(zb__pool *pool)
{
    if (!pool) return;
    zb__pool_wait(pool);
    pool_destroy(pool, pool->nthreads);
}
