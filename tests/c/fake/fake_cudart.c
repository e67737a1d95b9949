/* A fake CUDA runtime for the tests (test_cuda.c): the functions zbatch resolves from
 * libcudart, implemented on host memory, with counters. "Device" memory is malloc'd and tracked,
 * so a copy to anything else is caught; copies and event records can be held back
 * (fake_cuda_hold) and run later in issue order (fake_cuda_flush), which lets a test see what
 * happens while copies are still in flight. Streams are FIFO queues in one global issue order,
 * which keeps each stream's order (all a correct caller may rely on). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart.h"

typedef struct fake_event {
    uint64_t recorded, done; /* generations: recorded by calls, done by execution */
} fake_event;

typedef struct op {
    int kind; /* 0 copy, 1 record */
    void *dst;
    const void *src;
    size_t n;
    fake_event *ev;
    uint64_t gen;
} op;

typedef struct region {
    uint8_t *p;
    size_t n;
} region;

#define MAX_REGIONS 4096
#define MAX_OPS 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ndevices = 1;
static int hold;
static op ops[MAX_OPS];
static size_t nops;
static region dev[MAX_REGIONS], pinned[MAX_REGIONS];
static size_t ndev, npinned;
static fake_counters cnt;
static void *last_record_stream;

static int
find(const region *r, size_t n, const void *p, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if ((const uint8_t *)p >= r[i].p && (const uint8_t *)p + len <= r[i].p + r[i].n)
            return (int)i;
    return -1;
}

static void
run(const op *o)
{
    if (o->kind == 0)
        memcpy(o->dst, o->src, o->n);
    else if (o->ev->done < o->gen)
        o->ev->done = o->gen;
}

static void
flush_locked(void)
{
    for (size_t i = 0; i < nops; i++) run(&ops[i]);
    nops = 0;
}

static void
submit(op o)
{
    if (!hold || nops == MAX_OPS) {
        run(&o);
        return;
    }
    ops[nops++] = o;
}

void
fake_cuda_reset(int devices)
{
    pthread_mutex_lock(&mu);
    flush_locked();
    ndevices = devices;
    hold = 0;
    memset(&cnt, 0, sizeof cnt);
    last_record_stream = NULL;
    pthread_mutex_unlock(&mu);
}

void
fake_cuda_hold(int on)
{
    pthread_mutex_lock(&mu);
    hold = on;
    pthread_mutex_unlock(&mu);
}

void
fake_cuda_flush(void)
{
    pthread_mutex_lock(&mu);
    flush_locked();
    pthread_mutex_unlock(&mu);
}

void
fake_cuda_counters(fake_counters *out)
{
    pthread_mutex_lock(&mu);
    *out = cnt;
    out->live_device = ndev;
    out->live_pinned = npinned;
    pthread_mutex_unlock(&mu);
}

void *
fake_cuda_last_record_stream(void)
{
    pthread_mutex_lock(&mu);
    void *s = last_record_stream;
    pthread_mutex_unlock(&mu);
    return s;
}

int
fake_cuda_is_pinned(const void *p, size_t n)
{
    pthread_mutex_lock(&mu);
    int r = find(pinned, npinned, p, n) >= 0;
    pthread_mutex_unlock(&mu);
    return r;
}

const char *
cudaGetErrorString(int e)
{
    return e == 100   ? "no CUDA-capable device is detected"
           : e == 600 ? "device not ready"
                      : "fake CUDA error";
}

int
cudaGetDeviceCount(int *n)
{
    *n = ndevices;
    return ndevices ? 0 : 100;
}

int
cudaSetDevice(int d)
{
    return d >= 0 && d < ndevices ? 0 : 101;
}

static int
alloc_region(region *r, size_t *n, void **p, size_t size, uint64_t *counter)
{
    pthread_mutex_lock(&mu);
    int e = 2;
    if (*n < MAX_REGIONS && (*p = malloc(size ? size : 1))) {
        memset(*p, 0xAB, size); /* not zero: a copy that did not run shows */
        r[(*n)++] = (region){*p, size};
        (*counter)++;
        e = 0;
    }
    pthread_mutex_unlock(&mu);
    return e;
}

static int
free_region(region *r, size_t *n, void *p, uint64_t *counter)
{
    if (!p) return 0;
    pthread_mutex_lock(&mu);
    flush_locked(); /* freeing synchronises, as CUDA's does */
    cnt.syncs++;
    int e = 1;
    for (size_t i = 0; i < *n; i++)
        if (r[i].p == p) {
            r[i] = r[--*n];
            free(p);
            (*counter)++;
            e = 0;
            break;
        }
    pthread_mutex_unlock(&mu);
    return e;
}

int
cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    (void)flags;
    return alloc_region(pinned, &npinned, p, size, &cnt.host_allocs);
}

int
cudaFreeHost(void *p)
{
    return free_region(pinned, &npinned, p, &cnt.host_frees);
}

int
cudaMalloc(void **p, size_t size)
{
    return alloc_region(dev, &ndev, p, size, &cnt.device_allocs);
}

int
cudaFree(void *p)
{
    return free_region(dev, &ndev, p, &cnt.device_frees);
}

int
cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
    (void)stream;
    pthread_mutex_lock(&mu);
    int e = 0;
    if (kind != 1 || find(dev, ndev, dst, n) < 0 || find(dev, ndev, src, n) >= 0) {
        cnt.bad_copies++;
        e = 1;
    } else {
        cnt.copies++;
        cnt.bytes += n;
        if (find(pinned, npinned, src, n) < 0) cnt.pageable_copies++;
        submit((op){0, dst, src, n, NULL, 0});
    }
    pthread_mutex_unlock(&mu);
    return e;
}

int
cudaStreamCreateWithFlags(void **s, unsigned int flags)
{
    (void)flags;
    *s = malloc(1);
    pthread_mutex_lock(&mu);
    cnt.streams_created++;
    pthread_mutex_unlock(&mu);
    return *s ? 0 : 2;
}

int
cudaStreamDestroy(void *s)
{
    free(s);
    pthread_mutex_lock(&mu);
    cnt.streams_destroyed++;
    pthread_mutex_unlock(&mu);
    return 0;
}

int
cudaStreamWaitEvent(void *s, void *ev, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    if (s)
        cnt.copy_stream_waits++; /* the tests' consumers use the default stream (NULL) */
    else
        cnt.consumer_waits++;
    (void)ev;
    pthread_mutex_unlock(&mu);
    return 0;
}

int
cudaStreamSynchronize(void *s)
{
    (void)s;
    pthread_mutex_lock(&mu);
    flush_locked();
    cnt.syncs++;
    pthread_mutex_unlock(&mu);
    return 0;
}

int
cudaEventCreateWithFlags(void **ev, unsigned int flags)
{
    (void)flags;
    *ev = calloc(1, sizeof(fake_event));
    pthread_mutex_lock(&mu);
    cnt.events_created++;
    pthread_mutex_unlock(&mu);
    return *ev ? 0 : 2;
}

int
cudaEventDestroy(void *ev)
{
    free(ev);
    pthread_mutex_lock(&mu);
    cnt.events_destroyed++;
    pthread_mutex_unlock(&mu);
    return 0;
}

int
cudaEventRecord(void *ev, void *s)
{
    fake_event *e = ev;
    pthread_mutex_lock(&mu);
    cnt.records++;
    last_record_stream = s;
    submit((op){1, NULL, NULL, 0, e, ++e->recorded});
    pthread_mutex_unlock(&mu);
    return 0;
}

int
cudaEventQuery(void *ev)
{
    fake_event *e = ev;
    pthread_mutex_lock(&mu);
    int r = e->done == e->recorded ? 0 : 600;
    pthread_mutex_unlock(&mu);
    return r;
}

int
cudaEventSynchronize(void *ev)
{
    (void)ev;
    pthread_mutex_lock(&mu);
    flush_locked();
    cnt.syncs++;
    pthread_mutex_unlock(&mu);
    return 0;
}
