/* zbatch_cuda.h — part of the public C API (included by zbatch_loader.h): batches delivered in
 * page-locked host memory or on a CUDA device.
 *
 * zbatch never links CUDA. A zb_cuda loads the CUDA runtime (libcudart) with dlopen when it is
 * opened and resolves the few functions it uses; where there is no runtime, no driver or no
 * device, opening fails with ZB_E_UNSUPPORTED and a message saying which, and a loader asked
 * for pinned or device batches falls back to host memory and reports it
 * (zb_loader_placement), unless told to fail instead (zb_loader_opts.require_placement).
 *
 * Memory: a loader with ZB_PLACE_PINNED or ZB_PLACE_DEVICE reads its windows into page-locked
 * blocks (cudaHostAlloc) from a pool of its own, reused window after window (never one per
 * batch). With ZB_PLACE_DEVICE its worker then copies each batch into a device block
 * (cudaMalloc, also pooled) with cudaMemcpyAsync on one of `num_streams` copy streams, in
 * turn, and records an event after the copies: the consumer gets device pointers and that
 * event, never a host synchronisation. A device block is reused only after the work the
 * consumer queued on it completes: releasing a batch records an event on its consumer stream,
 * and the next copy into the block waits for that event on the GPU. The host copy of a batch
 * is kept until its device copy completes (polled with cudaEventQuery, never waited for).
 *
 * PINNED batches taken with zb_loader_next_device are protected the same way against the
 * consumer's own asynchronous copies out of them (cudaMemcpyAsync, torch's
 * `.to(device, non_blocking=True)`): releasing one records an event (from a pool) on the
 * consumer stream, and its page-locked memory returns to the loader only once that event
 * completed, so a copy queued on that stream before the release reads the batch's bytes, not
 * a later window's. Batches taken with zb_loader_next return their memory at zb_batch_free:
 * copy out of those synchronously, or wait for the copy before freeing them.
 *
 * Thread-safety: a zb_device_batch is used and released by one thread at a time (the loader's
 * consumer); batches may outlive their loader. */
/* outside the guard: zbatch.h includes this header back (through zbatch_loader.h) */
#include "zbatch.h"

#ifndef ZBATCH_CUDA_H
#define ZBATCH_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded CUDA runtime bound to one device. */
typedef struct zb_cuda zb_cuda;

/* Loads the CUDA runtime `library` (a file name or path; NULL tries a runtime already loaded
 * in the process, then libcudart.so.13, .so.12, .so.11.0 and libcudart.so) and checks that
 * `device` exists. ZB_E_UNSUPPORTED when no runtime loads, a function is missing, no driver
 * or device answers, or `device` is out of range; the message names the library and CUDA's
 * own error text. Thread-safe. */
ZB_API zb_status zb_cuda_open(const char *library, int device, zb_cuda **out);

/* Drops the caller's reference (loaders and batches hold their own). NULL is a no-op. */
ZB_API void zb_cuda_close(zb_cuda *cuda);

/* The library that was loaded (as given to dlopen) and the number of devices it sees. The
 * string lives as long as `cuda`. */
ZB_API const char *zb_cuda_library(const zb_cuda *cuda);
ZB_API int zb_cuda_device_count(const zb_cuda *cuda);

/* Where a loader puts batches. */
typedef enum zb_placement {
    ZB_PLACE_HOST = 0,   /* pageable host memory (the default) */
    ZB_PLACE_PINNED = 1, /* page-locked host memory: host batches a device copies at full speed */
    ZB_PLACE_DEVICE = 2  /* page-locked host batches, each also copied to the device */
} zb_placement;

/* A batch from zb_loader_next_device: its host copy and, when the loader delivers to the
 * device, its device copy. */
typedef struct zb_device_batch zb_device_batch;

/* The host copy (page-locked unless the loader fell back to host memory). Borrowed: valid until
 * zb_device_batch_release; do not zb_batch_free it. */
ZB_API const zb_batch *zb_device_batch_host(const zb_device_batch *db);

/* True when the batch has a device copy (the loader's placement is ZB_PLACE_DEVICE). */
ZB_API bool zb_device_batch_on_device(const zb_device_batch *db);

/* Device pointers, valid until zb_device_batch_release and usable on a stream once it waited
 * for zb_device_batch_event. Field i is zb_batch_field(host, i)'s data (NULL for string fields,
 * which stay on the host); segment i is zb_batch_segment_at(host, i)'s pointer array (int64
 * [B+1]); index is uint64 [B]; dataset is int32 [B] (NULL outside collections). All NULL
 * without a device copy. Bytes are those of the host copy, bit for bit. */
ZB_API const void *zb_device_batch_field(const zb_device_batch *db, size_t i);
ZB_API const void *zb_device_batch_segment(const zb_device_batch *db, size_t i);
ZB_API const void *zb_device_batch_index(const zb_device_batch *db);
ZB_API const void *zb_device_batch_dataset(const zb_device_batch *db);

/* The cudaEvent_t recorded after the batch's copies (NULL without a device copy). */
ZB_API void *zb_device_batch_event(const zb_device_batch *db);

/* Makes `stream` (a cudaStream_t; NULL: the legacy default stream) wait on the GPU for the
 * batch's copies (cudaStreamWaitEvent; the host does not wait) and makes it the batch's
 * consumer stream: its work queued before zb_device_batch_release is what the release waits
 * for. Without a device copy it only sets the consumer stream. ZB_E_IO with CUDA's message on
 * a CUDA error. */
ZB_API zb_status zb_device_batch_wait(zb_device_batch *db, void *stream);

/* Releases the batch: records an event on the consumer stream (the last one given to
 * zb_device_batch_wait, else the legacy default stream), after which the device block may be
 * reused; the host copy returns to the loader once the device copy is complete, and for a
 * PINNED batch once that event completed (work queued on the stream before the release,
 * such as a copy out of the host batch, has run). Never waits on the host while the loader is
 * open (unless CUDA fails to record that event: it then waits for the stream); after
 * zb_loader_close it waits for what is still pending. Pointers taken from the batch are
 * invalid afterwards. NULL is a no-op. */
ZB_API void zb_device_batch_release(zb_device_batch *db);

/* zb_device_batch_release with `stream` (a cudaStream_t; NULL: the legacy default stream) as
 * the consumer stream: the stream the caller's work on the batch was queued on, when that is
 * known only at release (Python: torch's current stream when the last tensor is freed). */
ZB_API void zb_device_batch_release_on(zb_device_batch *db, void *stream);

/* What a device-delivering loader has done so far (zb_loader_device_stats). */
typedef struct zb_device_stats {
    uint64_t batches_copied;  /* batches copied to the device */
    uint64_t bytes_copied;    /* bytes copied host to device */
    uint64_t host_blocks;     /* page-locked blocks allocated (not reused ones) */
    uint64_t host_bytes;      /* bytes of those blocks */
    uint64_t device_blocks;   /* device blocks allocated */
    uint64_t device_bytes;    /* bytes of those blocks */
    uint64_t retired_pending; /* released batches whose device copy (DEVICE) or whose
                                 consumer stream's work (PINNED) was not complete yet */
} zb_device_stats;

#ifdef __cplusplus
}
#endif
#endif
