/* zbatch_loader.h — part of the public C API (included by zbatch.h): the pipelined loader.
 *
 * A loader pulls `prefetch_factor` batches at a time (a window) from a sampler, hands the
 * window to the coalesced reader as one request, keeps up to `depth` windows in flight, and
 * yields the batches strictly in sampler order, whatever the thread timing. Per-batch C
 * transforms run on the loader's worker before a batch is handed out. Memory is bounded by the
 * options (depth windows of prefetch_factor batches), not by the dataset.
 *
 * Thread-safety: one consumer thread calls zb_loader_next / zb_loader_close; the loader runs
 * its own worker thread. Conventions, status codes and ownership rules are those of zbatch.h. */
#ifndef ZBATCH_LOADER_H
#define ZBATCH_LOADER_H

#include "zbatch.h"
#include "zbatch_cuda.h"
#include "zbatch_sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A per-batch transform run on the loader's workers. It may modify the batch's buffers in place
 * or add fields (zb_batch_add_field). The windows in flight (zb_loader_opts.depth) run on their
 * own threads, so `fn` may be called for two batches at once: what it shares through `user`
 * must be thread-safe. A non-OK status ends the epoch: zb_loader_next returns it with the
 * detail message the transform set (or its status' text). */
typedef zb_status (*zb_transform_fn)(zb_batch *batch, void *user);

typedef enum zb_transform_kind {
    ZB_TRANSFORM_LOG1P,           /* X/data = log1p(X/data) in place (float32/float64) */
    ZB_TRANSFORM_NORMALIZE_TOTAL, /* scale each row of X/data to sum to `target_sum` */
    ZB_TRANSFORM_DENSIFY,         /* add "X_dense": float32 [B, n_cols] from the CSR X */
    ZB_TRANSFORM_CAST,            /* replace field `field` by a copy cast to `dtype` */
    ZB_TRANSFORM_CALLBACK         /* fn(batch, user) */
} zb_transform_kind;

typedef struct zb_transform {
    zb_transform_kind kind;
    double target_sum;       /* NORMALIZE_TOTAL */
    const uint64_t *columns; /* DENSIFY: an optional column subset (NULL = all n_vars), in
                                 the output's order, each column once (ZB_E_INVALID else) */
    size_t ncolumns;
    const char *field;  /* CAST */
    zb_dtype dtype;     /* CAST */
    zb_transform_fn fn; /* CALLBACK */
    void *user;         /* CALLBACK */
} zb_transform;

typedef struct zb_loader_opts {
    size_t prefetch_factor;         /* batches per window (>= 1) */
    size_t depth;                   /* windows in flight (>= 1) */
    const zb_transform *transforms; /* run in order on every batch; copied at open */
    size_t ntransforms;
    /* Epochs read on past the sampler's current one (0: the loader ends with it; SIZE_MAX: no
     * end). When an epoch ends, the worker moves the sampler to the next epoch (epoch + 1, or
     * the same epoch again with `same_epoch`, as a loop without set_epoch does) and keeps
     * reading, so the pipeline does not drain and refill at every epoch boundary: a small
     * dataset trained for many epochs keeps both cores busy. zb_loader_next still returns
     * NULL at each epoch end; the call after it returns the next epoch's first batch. An
     * epoch that yields no batch ends the loader. */
    size_t more_epochs;
    bool same_epoch;
    /* Where batches go (zbatch_cuda.h). PINNED and DEVICE load the CUDA runtime
     * `cuda_library` (NULL: see zb_cuda_open) for device `cuda_device`; where it cannot, the
     * loader falls back to host memory and says why (zb_loader_placement), or, with
     * `require_placement`, zb_loader_open fails with ZB_E_UNSUPPORTED. */
    zb_placement placement;
    const char *cuda_library;
    int cuda_device;
    size_t num_streams; /* DEVICE: copy streams, used by batches in turn (0: 2) */
    bool require_placement;
} zb_loader_opts;

#define ZB_LOADER_OPTS_DEFAULT                                                                     \
    {                                                                                              \
        4, 2, NULL, 0, 0, false, ZB_PLACE_HOST, NULL, 0, 2, false                                  \
    }

/* The most samples one window may hold (prefetch_factor x the sampler's largest batch):
 * zb_loader_open refuses more with ZB_E_INVALID before allocating anything. */
#define ZB_LOADER_MAX_WINDOW ((uint64_t)1 << 28)

typedef struct zb_loader zb_loader;

/* Starts a loader over `ds` drawing batches from `sampler` (positioned where it is: the loader
 * continues from the sampler's current state). ZB_E_INVALID for prefetch_factor or depth 0, or a
 * window over ZB_LOADER_MAX_WINDOW samples. The loader borrows both: they must outlive it,
 * and the sampler must not be used by anyone else until zb_loader_close. */
ZB_API zb_status zb_loader_open(zb_dataset *ds, zb_sampler *sampler, const zb_loader_opts *opts,
                                zb_loader **out);

/* The next batch in sampler order: *out is a batch to release with zb_batch_free (its memory
 * returns to the loader's window ring), or NULL at the end of the epoch (with more_epochs, the
 * next call goes on with the following epoch; NULL again once none is left). An I/O, decode
 * or transform error in the worker is returned here with its detail message. */
ZB_API zb_status zb_loader_next(zb_loader *ld, zb_batch **out);

/* The next batch of a loader, as zb_loader_next, with its device copy when the loader's
 * placement is ZB_PLACE_DEVICE (zbatch_cuda.h); works in every placement. *out is released
 * with zb_device_batch_release, or NULL at the end of an epoch. A loader whose placement is
 * DEVICE hands batches out only through this call (zb_loader_next: ZB_E_INVALID). */
ZB_API zb_status zb_loader_next_device(zb_loader *ld, zb_device_batch **out);

/* Where the loader puts batches: the placement asked for, or ZB_PLACE_HOST after a fallback,
 * in which case *why (if not NULL) is the reason (the runtime or device that was missing),
 * else NULL. The string lives as long as the loader. */
ZB_API zb_placement zb_loader_placement(const zb_loader *ld, const char **why);

/* Counters of the device stage (zeros for a host loader). Any thread. */
ZB_API void zb_loader_device_stats(const zb_loader *ld, zb_device_stats *stats);

/* The sampler state after the last batch handed out by zb_loader_next (not the prefetched
 * ones): restoring it into a sampler continues exactly after that batch. At an epoch end
 * (zb_loader_next gave NULL) it is that epoch's end, even while the worker reads the next. */
ZB_API void zb_loader_state(const zb_loader *ld, zb_sampler_state *state);

/* Stops the worker, waits for it, frees every window not handed out. Batches already handed
 * out stay valid until released. NULL is a no-op. */
ZB_API void zb_loader_close(zb_loader *ld);

/* Adds a field to a batch (transforms use it): `data` (nrows * row elements * itemsize bytes,
 * malloc'd) becomes the batch's and is freed with it. */
ZB_API zb_status zb_batch_add_field(zb_batch *batch, const char *name, zb_dtype dtype, int ndim,
                                    const uint64_t *row_shape, uint64_t nrows, void *data);

/* Replaces the buffer of an existing field (CAST): same row count and shape, new dtype. */
ZB_API zb_status zb_batch_replace_field(zb_batch *batch, const char *name, zb_dtype dtype,
                                        void *data);

#ifdef __cplusplus
}
#endif
#endif
