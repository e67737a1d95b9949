/* The loader's device stage (device.c): page-locked window arenas, per-batch copies to the
 * device on copy streams, and the device batches handed to the consumer (zbatch_cuda.h). */
#ifndef ZB_LOADER_DEVICE_H
#define ZB_LOADER_DEVICE_H

#include "dataset/dataset.h"
#include "zbatch_loader.h"

typedef struct zb__devq zb__devq;

/* Opens the stage for opts->placement (PINNED or DEVICE): loads the runtime, makes the
 * page-locked arena pool and, for DEVICE, the copy streams. ZB_E_UNSUPPORTED (with the
 * reason as message) where CUDA cannot be used; the loader then falls back. */
zb_status zb__devq_open(const zb_loader_opts *opts, zb__devq **out);

/* The page-locked pool windows are read into. Borrowed. */
zb__arena_pool *zb__devq_pool(zb__devq *q);

/* True when batches are copied to the device. */
bool zb__devq_on_device(const zb__devq *q);

/* Wraps the host batch `host` (taken over, also on failure) into a device batch; with a
 * device stage (q not NULL, placement DEVICE) its copy to the device is issued on copy
 * stream number `k` modulo num_streams. Runs on a loader worker. */
zb_status zb__devq_deliver(zb__devq *q, zb_batch *host, size_t k, zb_device_batch **out);

/* Frees the released batches whose fences completed (the consumer's thread). */
void zb__devq_poll(zb__devq *q);

void zb__devq_stats(const zb__devq *q, zb_device_stats *stats);

/* Drops the loader's reference; the stage lives on while device batches do. NULL: no-op. */
void zb__devq_unref(zb__devq *q);

#endif
