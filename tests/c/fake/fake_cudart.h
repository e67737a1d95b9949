/* The fake CUDA runtime's controls (fake_cudart.c), resolved by the tests with dlsym. */
#ifndef ZB_FAKE_CUDART_H
#define ZB_FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

typedef struct fake_counters {
    uint64_t host_allocs, host_frees;     /* cudaHostAlloc / cudaFreeHost */
    uint64_t device_allocs, device_frees; /* cudaMalloc / cudaFree */
    uint64_t copies, bytes, pageable_copies, bad_copies;
    uint64_t streams_created, streams_destroyed, events_created, events_destroyed;
    uint64_t records, copy_stream_waits, consumer_waits;
    uint64_t syncs;                    /* anything that waits on the host */
    uint64_t live_device, live_pinned; /* allocations not freed */
} fake_counters;

void fake_cuda_reset(int devices);
void fake_cuda_hold(int on);
void fake_cuda_flush(void);
void fake_cuda_counters(fake_counters *out);
int fake_cuda_is_pinned(const void *p, size_t n);
void *fake_cuda_last_record_stream(void); /* the stream of the last cudaEventRecord */

#endif
