/* The CUDA runtime, loaded at run time (cuda.c): the few functions zbatch calls, resolved with
 * dlsym. Built with the toolkit's headers when CMake finds them (ZB_CUDA_HEADERS): the
 * function types are then the headers' own, so every call is checked against CUDA's
 * prototypes; without them the prototypes below stand in. */
#ifndef ZB_LOADER_CUDA_H
#define ZB_LOADER_CUDA_H

#include <stdatomic.h>

#include "zbatch_cuda.h"

#ifdef ZB_CUDA_HEADERS
#include <cuda_runtime_api.h>
typedef cudaError_t cu_err;
typedef cudaStream_t cu_stream;
typedef cudaEvent_t cu_event;
#define ZB_CU_TYPE(name, ret, args) typedef __typeof__(&name) name##_fn;
#else
typedef int cu_err;
typedef struct cu_stream_st *cu_stream;
typedef struct cu_event_st *cu_event;
#define ZB_CU_TYPE(name, ret, args) typedef ret(*name##_fn) args;
#endif

/* CUDA's values of the constants used (checked against the headers in cuda.c). */
#define CU_SUCCESS 0
#define CU_NOT_READY 600           /* cudaErrorNotReady */
#define CU_H2D 1                   /* cudaMemcpyHostToDevice */
#define CU_HOST_ALLOC_PORTABLE 1u  /* cudaHostAllocPortable */
#define CU_STREAM_NON_BLOCKING 1u  /* cudaStreamNonBlocking */
#define CU_EVENT_DISABLE_TIMING 2u /* cudaEventDisableTiming */

/* name, return type, parameters: one line per runtime function zbatch resolves. */
#define ZB_CU_FUNCS(X)                                                                             \
    X(cudaGetErrorString, const char *, (cu_err))                                                  \
    X(cudaGetDeviceCount, cu_err, (int *))                                                         \
    X(cudaSetDevice, cu_err, (int))                                                                \
    X(cudaHostAlloc, cu_err, (void **, size_t, unsigned int))                                      \
    X(cudaFreeHost, cu_err, (void *))                                                              \
    X(cudaMalloc, cu_err, (void **, size_t))                                                       \
    X(cudaFree, cu_err, (void *))                                                                  \
    X(cudaMemcpyAsync, cu_err, (void *, const void *, size_t, int, cu_stream))                     \
    X(cudaStreamCreateWithFlags, cu_err, (cu_stream *, unsigned int))                              \
    X(cudaStreamDestroy, cu_err, (cu_stream))                                                      \
    X(cudaStreamWaitEvent, cu_err, (cu_stream, cu_event, unsigned int))                            \
    X(cudaStreamSynchronize, cu_err, (cu_stream))                                                  \
    X(cudaEventCreateWithFlags, cu_err, (cu_event *, unsigned int))                                \
    X(cudaEventDestroy, cu_err, (cu_event))                                                        \
    X(cudaEventRecord, cu_err, (cu_event, cu_stream))                                              \
    X(cudaEventQuery, cu_err, (cu_event))                                                          \
    X(cudaEventSynchronize, cu_err, (cu_event))

ZB_CU_FUNCS(ZB_CU_TYPE)

struct zb_cuda {
    _Atomic int refs;
    void *lib;
    char library[256];
    int device;
    int ndevices;
#define ZB_CU_MEMBER(name, ret, args) name##_fn name;
    ZB_CU_FUNCS(ZB_CU_MEMBER)
#undef ZB_CU_MEMBER
};

/* Takes a reference (released with zb_cuda_close). */
zb_cuda *zb__cuda_ref(zb_cuda *cuda);

/* Sets zb__err(ZB_E_IO) to "`what`: CUDA error N (text)" when `e` is not success; returns the
 * status. */
zb_status zb__cuda_check(const zb_cuda *cuda, cu_err e, const char *what);

#endif
