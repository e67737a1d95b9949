/* A fixed-size pthread worker pool with a bounded queue.
 *
 * Each worker owns one zb_ctx (codec contexts and scratch), handed to every task it runs, so a
 * task never shares a context with another thread. The queue is bounded: zb__pool_submit blocks
 * while it is full, which keeps the memory held by queued tasks bounded too (a producer cannot
 * run ahead of the workers by more than the queue's capacity).
 *
 * Tasks report failure through their own result fields (the pool knows nothing of statuses):
 * zb__err's detail message is thread-local, so a task that fails must copy zb_last_error() into
 * its result for the submitting thread to re-raise.
 *
 * Thread-safety: one thread (the owner) submits, waits and frees. Tasks must not submit to or
 * wait on their own pool (a full queue would deadlock).
 */
#ifndef ZB_UTIL_POOL_H
#define ZB_UTIL_POOL_H

#include <stddef.h>

#include "zbatch.h"

typedef struct zb__pool zb__pool;

/* A task: `arg` is what was submitted, `ctx` the running worker's own context. */
typedef void (*zb__pool_fn)(void *arg, zb_ctx *ctx);

/* Most worker threads one pool starts. */
#define ZB_POOL_MAX_THREADS 256

/* Starts `nthreads` workers with a queue of 2 * nthreads tasks. nthreads <= 1 starts no thread:
 * zb__pool_submit then runs each task at once on the caller, with one context the pool owns.
 * ZB_E_INVALID above ZB_POOL_MAX_THREADS; ZB_E_NOMEM / ZB_E_IO (thread creation) otherwise. */
zb_status zb__pool_new(int nthreads, zb__pool **out);

/* Queues fn(arg, ctx); blocks while the queue is full. Inline pools run the task before
 * returning. Never fails: the queue is preallocated. */
void zb__pool_submit(zb__pool *pool, zb__pool_fn fn, void *arg);

/* Blocks until every task submitted so far has finished running. */
void zb__pool_wait(zb__pool *pool);

/* Worker threads (1 for an inline pool). */
int zb__pool_threads(const zb__pool *pool);

/* Runs the queued tasks to the end, stops the workers and frees the pool. NULL is a no-op. */
void zb__pool_free(zb__pool *pool);

#endif
