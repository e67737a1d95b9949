/* Pinned and device delivery (zbatch_cuda.h) without a GPU. Without a CUDA runtime (or with
 * one that sees no device) a loader asked for device batches falls back to host memory and
 * says why, or fails when told to. With the fake runtime (tests/c/fake: host memory posing as
 * pinned and device memory, copies that can be held back, counters) device batches equal host
 * batches and read_many's bit for bit; steady epochs allocate no pinned or device memory and
 * wait on the host for nothing; a block whose copy is still in flight is never handed out
 * again; a pinned batch's memory is not reused while a copy the consumer queued out of it
 * before releasing it is still pending; and everything allocated is freed once loader and
 * batches are gone. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake/fake_cudart.h"
#include "support/testutil.h"
#include "write/write.h"

#define N 200

static const char *ATTRS =
    "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {"
    "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", \"segment\": \"seg\"}, "
    "\"lab\": {\"array\": \"lab\", \"kind\": \"per_sample\"}}}}";

static struct {
    void (*reset)(int);
    void (*hold)(int);
    void (*flush)(void);
    void (*counters)(fake_counters *);
    int (*is_pinned)(const void *, size_t);
    void *(*last_record_stream)(void);
    /* the runtime's own functions, for the consumer's copies out of pinned batches */
    int (*dev_malloc)(void **, size_t);
    int (*dev_free)(void *);
    int (*copy_async)(void *, const void *, size_t, int, void *);
} fake;

/* Sample i has (i % 7) + 1 float values (its element numbers, scaled); lab is 5i. */
static zb_store *
build(void)
{
    int64_t ptr[N + 1], lab[N];
    ptr[0] = 0;
    for (int i = 0; i < N; i++) ptr[i + 1] = ptr[i] + (i % 7) + 1;
    float *vals = malloc((size_t)ptr[N] * sizeof *vals);
    for (int64_t r = 0; r < ptr[N]; r++) vals[r] = (float)r * 0.5f;
    for (int i = 0; i < N; i++) lab[i] = 5 * i;
    zb_store *st = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&st));
    ZB_ASSERT_OK(zb__write_group(st, "", 3, ATTRS));
    zbt_put_rows(st, "ptr", ZB_DT_INT64, ptr, N + 1, 64);
    zbt_put_rows(st, "vals", ZB_DT_FLOAT32, vals, (uint64_t)ptr[N], 50);
    zbt_put_rows(st, "lab", ZB_DT_INT64, lab, N, 32);
    free(vals);
    return st;
}

typedef struct fixture {
    zb_store *st;
    zb_dataset *ds;
    zb_sampler *s;
} fixture;

static fixture
setup(uint64_t batch)
{
    fixture f;
    f.st = build();
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = 2;
    ZB_ASSERT_OK(zb_dataset_open(f.st, "", &o, &f.ds));
    zb_sampler_opts so = ZB_SAMPLER_OPTS_DEFAULT;
    so.n = N;
    so.batch_size = batch;
    ZB_ASSERT_OK(zb_sampler_new_sequential(&so, &f.s));
    return f;
}

static void
teardown(fixture *f)
{
    zb_sampler_free(f->s);
    zb_dataset_close(f->ds);
    zb_store_close(f->st);
}

/* Everything the fake runtime handed out was given back: memory, page-locked blocks, events. */
static void
assert_runtime_clean(void)
{
    fake_counters c;
    fake.counters(&c);
    assert_int_equal(c.live_device, 0);
    assert_int_equal(c.live_pinned, 0);
    assert_int_equal(c.events_created, c.events_destroyed);
}

static zb_loader_opts
device_opts(zb_placement where, const char *library)
{
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = 3;
    lo.depth = 1; /* one worker: a steady demand for blocks, so reuse is exact */
    lo.placement = where;
    lo.cuda_library = library;
    lo.num_streams = 3;
    return lo;
}

/* The host batch of `db` equals read_many of its ids, and its device copy (fake device memory,
 * readable here) equals the host batch bit for bit. */
static void
check_device_batch(zb_dataset *ds, const zb_device_batch *db, bool on_device)
{
    const zb_batch *h = zb_device_batch_host(db);
    size_t B = zb_batch_size(h);
    zb_batch *want = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, zb_batch_index(h), B, &want));
    assert_int_equal(zb_batch_nfields(h), zb_batch_nfields(want));
    assert_int_equal(zb_device_batch_on_device(db), on_device);
    for (size_t i = 0; i < zb_batch_nfields(h); i++) {
        zb_batch_view v, w;
        ZB_ASSERT_OK(zb_batch_field(h, i, &v));
        ZB_ASSERT_OK(zb_batch_find(want, v.name, &w));
        size_t n = (size_t)v.nrows * zb_dtype_size(v.dtype);
        assert_int_equal(v.nrows, w.nrows);
        assert_memory_equal(v.data, w.data, n);
        const void *d = zb_device_batch_field(db, i);
        if (!on_device) {
            assert_null(d);
            continue;
        }
        assert_non_null(d);
        assert_memory_equal(d, v.data, n);
    }
    const int64_t *ptr = NULL;
    const char *name = zb_batch_segment_at(h, 0, &ptr);
    assert_string_equal(name, "seg");
    assert_memory_equal(ptr, zb_batch_segment(want, "seg"), (B + 1) * sizeof *ptr);
    if (on_device) {
        assert_memory_equal(zb_device_batch_segment(db, 0), ptr, (B + 1) * sizeof *ptr);
        assert_memory_equal(zb_device_batch_index(db), zb_batch_index(h), B * sizeof(uint64_t));
        assert_null(zb_device_batch_dataset(db)); /* not a collection */
        assert_non_null(zb_device_batch_event(db));
    }
    zb_batch_free(want);
}

static void
test_no_runtime_falls_back(void **state)
{
    (void)state;
    const char *lib = "/nonexistent/libcudart.so.12";
    zb_cuda *c = (zb_cuda *)1;
    ZB_ASSERT_ERR(zb_cuda_open(lib, 0, &c), ZB_E_UNSUPPORTED, lib);
    assert_null(c);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_DEVICE, lib);
    lo.require_placement = true;
    zb_loader *ld = (zb_loader *)1;
    ZB_ASSERT_ERR(zb_loader_open(f.ds, f.s, &lo, &ld), ZB_E_UNSUPPORTED, lib);
    assert_null(ld);
    /* the documented fallback: host batches, the reason kept */
    lo.require_placement = false;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    const char *why = NULL;
    assert_int_equal(zb_loader_placement(ld, &why), ZB_PLACE_HOST);
    assert_non_null(why);
    assert_non_null(strstr(why, "no CUDA runtime"));
    assert_non_null(strstr(why, lib));
    size_t nb = 0;
    for (;;) {
        zb_device_batch *db = NULL;
        ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
        if (!db) break;
        check_device_batch(f.ds, db, false);
        assert_null(zb_device_batch_event(db));
        ZB_ASSERT_OK(zb_device_batch_wait(db, NULL)); /* a no-op on the host */
        zb_device_batch_release(db);
        nb++;
    }
    assert_int_equal(nb, (N + 15) / 16);
    zb_loader_close(ld);
    /* a host loader hands out through zb_loader_next as ever, and says it is on the host */
    zb_loader_opts host = ZB_LOADER_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_sampler_set_epoch(f.s, 1));
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &host, &ld));
    assert_int_equal(zb_loader_placement(ld, &why), ZB_PLACE_HOST);
    assert_null(why);
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_loader_next(ld, &b));
    assert_int_equal(zb_batch_size(b), 16);
    zb_batch_free(b);
    zb_loader_close(ld);
    teardown(&f);
}

static void
test_no_device(void **state)
{
    (void)state;
    zb_cuda *c = NULL;
    fake.reset(0);
    ZB_ASSERT_ERR(zb_cuda_open(ZB_FAKE_CUDART, 0, &c), ZB_E_UNSUPPORTED, "no CUDA-capable device");
    fake.reset(1);
    ZB_ASSERT_ERR(zb_cuda_open(ZB_FAKE_CUDART, 1, &c), ZB_E_UNSUPPORTED, "device 1 does not exist");
    ZB_ASSERT_OK(zb_cuda_open(ZB_FAKE_CUDART, 0, &c));
    assert_string_equal(zb_cuda_library(c), ZB_FAKE_CUDART);
    assert_int_equal(zb_cuda_device_count(c), 1);
    zb_cuda_close(c);
    fake.reset(0);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_PINNED, ZB_FAKE_CUDART);
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    const char *why = NULL;
    assert_int_equal(zb_loader_placement(ld, &why), ZB_PLACE_HOST);
    assert_non_null(strstr(why, "no CUDA-capable device"));
    zb_loader_close(ld);
    teardown(&f);
    fake.reset(1);
}

/* Every batch's device copy equals its host copy and read_many; the consumer waits on the GPU
 * only; after two warm-up epochs an epoch allocates nothing and synchronises nothing. */
static void
test_device_batches(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_DEVICE, ZB_FAKE_CUDART);
    lo.more_epochs = 3;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    const char *why = "";
    assert_int_equal(zb_loader_placement(ld, &why), ZB_PLACE_DEVICE);
    assert_null(why);
    zb_batch *hb = NULL;
    ZB_ASSERT_ERR(zb_loader_next(ld, &hb), ZB_E_INVALID, "zb_loader_next_device");
    fake_counters at[4];
    memset(at, 0, sizeof at);
    size_t per_epoch = (N + 15) / 16;
    for (int epoch = 0; epoch < 4; epoch++) {
        size_t nb = 0;
        for (;;) {
            zb_device_batch *db = NULL;
            ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
            if (!db) break;
            ZB_ASSERT_OK(zb_device_batch_wait(db, NULL));
            check_device_batch(f.ds, db, true);
            /* the host copy sits in page-locked memory */
            zb_batch_view v;
            ZB_ASSERT_OK(zb_batch_find(zb_device_batch_host(db), "vals", &v));
            assert_true(fake.is_pinned(v.data, v.nrows * sizeof(float)));
            zb_device_batch_release(db);
            nb++;
        }
        assert_int_equal(nb, per_epoch);
        fake.counters(&at[epoch]);
    }
    /* the worker has met the end of the last epoch: the counters are still */
    fake_counters *c = &at[3];
    zb_device_stats ds;
    zb_loader_device_stats(ld, &ds);
    assert_int_equal(ds.batches_copied, 4 * per_epoch);
    assert_int_equal(c->consumer_waits, 4 * per_epoch);
    assert_int_equal(c->bad_copies, 0);
    assert_int_equal(c->pageable_copies, 0);
    assert_int_equal(c->syncs, 0); /* nothing waited on the host */
    /* one copy per field and one for the aux part of every batch */
    assert_int_equal(c->copies, 3 * 4 * per_epoch);
    /* memory for what is in flight, not per batch: the window handed out and the one read
     * ahead (3 batches each), one device block and one aux buffer per batch, one page-locked
     * block per window */
    assert_int_equal(ds.device_blocks, c->device_allocs);
    assert_int_equal(ds.host_blocks + ds.device_blocks, c->host_allocs);
    assert_true(ds.device_blocks <= 6);
    assert_true(ds.host_blocks <= 2);
    assert_true(c->events_created <= 6 + 6);
    /* every copy into a block used before waits (on the GPU) for its previous consumer */
    assert_int_equal(c->copy_stream_waits, ds.batches_copied - ds.device_blocks);
    zb_loader_close(ld);
    teardown(&f);
    fake_counters end;
    fake.counters(&end);
    assert_int_equal(end.live_device, 0);
    assert_int_equal(end.live_pinned, 0);
    assert_int_equal(end.events_created, end.events_destroyed);
    assert_int_equal(end.streams_created, 3);
    assert_int_equal(end.streams_destroyed, 3);
}

/* Copies held back: a batch's device copy is not there until the copy runs; a batch released
 * before its copy completed keeps its host copy and its device block until it has (the next
 * batches get other blocks); batches held across the flush are then all equal to the host. */
static void
test_copies_in_flight(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_DEVICE, ZB_FAKE_CUDART);
    zb_loader *ld = NULL;
    fake.hold(1);
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    zb_device_batch *first = NULL, *held[6] = {0};
    ZB_ASSERT_OK(zb_loader_next_device(ld, &first));
    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(zb_device_batch_host(first), "lab", &v));
    const void *d0 = zb_device_batch_field(first, 1);
    assert_memory_not_equal(d0, v.data, v.nrows * sizeof(int64_t)); /* not copied yet */
    ZB_ASSERT_OK(zb_device_batch_wait(first, NULL));
    zb_device_batch_release(first);
    zb_device_stats ds;
    zb_loader_device_stats(ld, &ds);
    assert_int_equal(ds.retired_pending, 1);
    for (int k = 0; k < 6; k++) {
        ZB_ASSERT_OK(zb_loader_next_device(ld, &held[k]));
        assert_ptr_not_equal(zb_device_batch_field(held[k], 1), d0);
    }
    fake_counters c;
    fake.counters(&c);
    assert_int_equal(c.syncs, 0);
    fake.flush();
    fake.hold(0);
    for (int k = 0; k < 6; k++) {
        check_device_batch(f.ds, held[k], true);
        zb_device_batch_release(held[k]);
    }
    zb_loader_close(ld);
    teardown(&f);
    fake.counters(&c);
    assert_int_equal(c.live_device, 0);
    assert_int_equal(c.live_pinned, 0);
}

/* Batches outlive their loader: a release after close still waits for its copy (there is no
 * loader to poll) and frees everything. */
static void
test_batches_outlive_the_loader(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(100); /* one window of two batches: closing leaves none to drain */
    zb_loader_opts lo = device_opts(ZB_PLACE_DEVICE, ZB_FAKE_CUDART);
    zb_loader *ld = NULL;
    fake.hold(1);
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    zb_device_batch *a = NULL, *b = NULL;
    ZB_ASSERT_OK(zb_loader_next_device(ld, &a));
    ZB_ASSERT_OK(zb_loader_next_device(ld, &b));
    zb_loader_close(ld);
    fake_counters c;
    fake.counters(&c);
    uint64_t syncs = c.syncs;
    zb_device_batch_release(a); /* copy still held: this release waits for it */
    fake.counters(&c);
    assert_true(c.syncs > syncs);
    fake.hold(0);
    check_device_batch(f.ds, b, true);
    zb_device_batch_release(b);
    teardown(&f);
    assert_runtime_clean();
}

/* PINNED: host batches from page-locked memory, handed out by zb_loader_next as ever. */
static void
test_pinned_host_batches(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_PINNED, ZB_FAKE_CUDART);
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    assert_int_equal(zb_loader_placement(ld, NULL), ZB_PLACE_PINNED);
    size_t nb = 0;
    for (;; nb++) {
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        if (!b) break;
        zb_batch_view v;
        ZB_ASSERT_OK(zb_batch_find(b, "vals", &v));
        assert_true(fake.is_pinned(v.data, v.nrows * sizeof(float)));
        zb_batch_free(b);
    }
    assert_int_equal(nb, (N + 15) / 16);
    zb_loader_close(ld);
    teardown(&f);
    fake_counters c;
    fake.counters(&c);
    assert_int_equal(c.copies, 0);
    assert_true(c.host_allocs > 0);
    assert_int_equal(c.live_pinned, 0);
}

/* ---- PINNED batches and the consumer's own asynchronous copies -------------------------- */

#define STREAM ((void *)0x51) /* a consumer stream (the fake never dereferences one) */

/* What a training script does with a pinned batch: queues a copy of its "vals" to fresh
 * device memory on STREAM (cudaMemcpyAsync; torch's .to(device, non_blocking=True)). */
static void *
copy_out(const zb_device_batch *db)
{
    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(zb_device_batch_host(db), "vals", &v));
    void *d = NULL;
    assert_int_equal(fake.dev_malloc(&d, v.nrows * sizeof(float)), 0);
    assert_int_equal(fake.copy_async(d, v.data, v.nrows * sizeof(float), 1, STREAM), 0);
    return d;
}

/* The device copy `d` of batch k (samples 16k.., sequential) equals read_many's "vals". */
static void
check_copied(zb_dataset *ds, const void *d, size_t k)
{
    uint64_t ids[16];
    size_t B = 0;
    for (uint64_t i = 16 * k; i < N && B < 16; i++) ids[B++] = i;
    zb_batch *want = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, B, &want));
    zb_batch_view w;
    ZB_ASSERT_OK(zb_batch_find(want, "vals", &w));
    assert_memory_equal(d, w.data, w.nrows * sizeof(float));
    zb_batch_free(want);
}

/* The GPU lags: every batch's copy out of its pinned memory is still queued when the script
 * drops the batch and takes the next. No window block is handed out again until the release
 * fences recorded behind those copies completed (the loader takes new blocks meanwhile and
 * waits on the host for nothing), so each copy reads its own batch's bytes, not a later
 * window's; once the fences completed the blocks are reused. */
static void
test_pinned_release_fences_copies(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_PINNED, ZB_FAKE_CUDART);
    lo.more_epochs = 1;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    assert_int_equal(zb_loader_placement(ld, NULL), ZB_PLACE_PINNED);
    enum { K = 9 }; /* three windows of three batches */
    void *dev[K];
    fake.hold(1);
    for (size_t k = 0; k < K; k++) {
        zb_device_batch *db = NULL;
        ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
        assert_false(zb_device_batch_on_device(db));
        assert_int_equal(zb_batch_index(zb_device_batch_host(db))[0], 16 * k);
        dev[k] = copy_out(db);
        zb_device_batch_release_on(db, STREAM);
        assert_ptr_equal(fake.last_record_stream(), STREAM);
    }
    zb_device_stats ds;
    zb_loader_device_stats(ld, &ds);
    assert_int_equal(ds.retired_pending, K);
    assert_true(ds.host_blocks >= K / 3); /* a new block per window: none came back */
    fake_counters c;
    fake.counters(&c);
    assert_int_equal(c.syncs, 0);
    assert_int_equal(c.copies, K);
    assert_int_equal(c.records, K); /* one fence per batch, recorded behind its copy */
    fake.flush();                   /* the GPU catches up: each copy, then its fence */
    fake.hold(0);
    for (size_t k = 0; k < K; k++) check_copied(f.ds, dev[k], k);
    /* the rest of the epoch and the next one, released at once: the blocks come back */
    size_t per_epoch = (N + 15) / 16, k = K, end_blocks = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        for (;; k++) {
            zb_device_batch *db = NULL;
            ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
            if (!db) break;
            void *d = copy_out(db);
            zb_device_batch_release_on(db, STREAM);
            check_copied(f.ds, d, k % per_epoch);
            fake.dev_free(d);
        }
        assert_int_equal(k, (size_t)(epoch + 1) * per_epoch);
        zb_loader_device_stats(ld, &ds);
        if (epoch == 0) end_blocks = ds.host_blocks;
    }
    assert_int_equal(ds.host_blocks, end_blocks); /* the second epoch reused every block */
    for (size_t i = 0; i < K; i++) fake.dev_free(dev[i]);
    zb_loader_close(ld);
    teardown(&f);
    assert_runtime_clean();
}

/* A steady epoch of pinned batches: one fence recorded per batch on the consumer stream (the
 * one given to zb_device_batch_wait, or to zb_device_batch_release_on), events from the pool
 * (none created), no page-locked block allocated, nothing waited for on the host. */
static void
test_pinned_steady_epoch(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_PINNED, ZB_FAKE_CUDART);
    lo.more_epochs = 3;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    size_t per_epoch = (N + 15) / 16;
    fake_counters at[4];
    zb_device_stats st[4];
    for (int epoch = 0; epoch < 4; epoch++) {
        size_t nb = 0;
        for (;; nb++) {
            zb_device_batch *db = NULL;
            ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
            if (!db) break;
            check_device_batch(f.ds, db, false);
            zb_batch_view v;
            ZB_ASSERT_OK(zb_batch_find(zb_device_batch_host(db), "vals", &v));
            assert_true(fake.is_pinned(v.data, v.nrows * sizeof(float)));
            void *s = (void *)(uintptr_t)(0x100 + nb);
            if (nb % 2) {
                zb_device_batch_release_on(db, s);
            } else {
                ZB_ASSERT_OK(zb_device_batch_wait(db, s)); /* no copy: sets the stream */
                zb_device_batch_release(db);
            }
            assert_ptr_equal(fake.last_record_stream(), s);
        }
        assert_int_equal(nb, per_epoch);
        fake.counters(&at[epoch]);
        zb_loader_device_stats(ld, &st[epoch]);
    }
    assert_int_equal(at[3].records, 4 * per_epoch);
    assert_int_equal(at[3].events_created, at[1].events_created); /* the pool's, reused */
    assert_true(at[3].events_created <= 2);
    assert_int_equal(at[3].host_allocs, at[1].host_allocs);
    assert_int_equal(st[3].host_blocks, st[1].host_blocks);
    assert_int_equal(at[3].syncs, 0);
    assert_int_equal(at[3].copies, 0);
    assert_int_equal(at[3].consumer_waits, 0);
    assert_int_equal(st[3].retired_pending, 0); /* the fake's events complete at once */
    zb_loader_close(ld);
    teardown(&f);
    assert_runtime_clean();
}

/* Closing with fences pending: the loader's close waits for the released batches' fences,
 * a batch released after the close waits for its own, and everything is freed. */
static void
test_pinned_close_with_fences_pending(void **state)
{
    (void)state;
    fake.reset(1);
    fixture f = setup(16);
    zb_loader_opts lo = device_opts(ZB_PLACE_PINNED, ZB_FAKE_CUDART);
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f.ds, f.s, &lo, &ld));
    fake.hold(1);
    zb_device_batch *kept = NULL;
    void *dev[4];
    for (size_t k = 0; k < 4; k++) {
        zb_device_batch *db = NULL;
        ZB_ASSERT_OK(zb_loader_next_device(ld, &db));
        dev[k] = copy_out(db);
        if (k == 3)
            kept = db;
        else
            zb_device_batch_release_on(db, STREAM);
    }
    fake_counters c;
    fake.counters(&c);
    assert_int_equal(c.syncs, 0);
    zb_loader_close(ld); /* waits for the three fences (the fake runs what was held) */
    fake.counters(&c);
    assert_true(c.syncs > 0);
    for (size_t k = 0; k < 3; k++) check_copied(f.ds, dev[k], k);
    zb_device_batch_release_on(kept, STREAM); /* its fence is held: this release waits */
    check_copied(f.ds, dev[3], 3);
    fake.hold(0);
    for (size_t k = 0; k < 4; k++) fake.dev_free(dev[k]);
    teardown(&f);
    assert_runtime_clean();
}

int
main(void)
{
    void *lib = dlopen(ZB_FAKE_CUDART, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cannot load the fake runtime: %s\n", dlerror());
        return 1;
    }
    *(void **)&fake.reset = dlsym(lib, "fake_cuda_reset");
    *(void **)&fake.hold = dlsym(lib, "fake_cuda_hold");
    *(void **)&fake.flush = dlsym(lib, "fake_cuda_flush");
    *(void **)&fake.counters = dlsym(lib, "fake_cuda_counters");
    *(void **)&fake.is_pinned = dlsym(lib, "fake_cuda_is_pinned");
    *(void **)&fake.last_record_stream = dlsym(lib, "fake_cuda_last_record_stream");
    *(void **)&fake.dev_malloc = dlsym(lib, "cudaMalloc");
    *(void **)&fake.dev_free = dlsym(lib, "cudaFree");
    *(void **)&fake.copy_async = dlsym(lib, "cudaMemcpyAsync");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_runtime_falls_back),
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_device_batches),
        cmocka_unit_test(test_copies_in_flight),
        cmocka_unit_test(test_batches_outlive_the_loader),
        cmocka_unit_test(test_pinned_host_batches),
        cmocka_unit_test(test_pinned_release_fences_copies),
        cmocka_unit_test(test_pinned_steady_epoch),
        cmocka_unit_test(test_pinned_close_with_fences_pending),
    };
    int rc = ZBT_RUN_GROUP(tests, NULL, NULL);
    dlclose(lib);
    return rc;
}
