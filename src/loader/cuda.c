/* Loading the CUDA runtime at run time (zbatch_cuda.h). zbatch has no link-time dependency on
 * CUDA: a machine without it runs everything else, and one with it uses the runtime already in
 * the process (PyTorch's) when there is one, so streams and events are shared with it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/cuda.h"
#include "util/status.h"

#ifdef ZB_CUDA_HEADERS
_Static_assert(CU_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady");
_Static_assert(CU_SUCCESS == (int)cudaSuccess, "cudaSuccess");
_Static_assert(CU_H2D == (int)cudaMemcpyHostToDevice, "cudaMemcpyHostToDevice");
_Static_assert(CU_HOST_ALLOC_PORTABLE == cudaHostAllocPortable, "cudaHostAllocPortable");
_Static_assert(CU_STREAM_NON_BLOCKING == cudaStreamNonBlocking, "cudaStreamNonBlocking");
_Static_assert(CU_EVENT_DISABLE_TIMING == cudaEventDisableTiming, "cudaEventDisableTiming");
#endif

/* Tried in order when no library is named: the newest runtime first; a runtime some other
 * library already loaded (RTLD_NOLOAD) wins over all of them. */
static const char *const RUNTIMES[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                       "libcudart.so"};
#define NRUNTIMES (sizeof RUNTIMES / sizeof RUNTIMES[0])

zb_status
zb__cuda_check(const zb_cuda *cuda, cu_err e, const char *what)
{
    if (e == CU_SUCCESS) return ZB_OK;
    const char *text = cuda && cuda->cudaGetErrorString ? cuda->cudaGetErrorString(e) : NULL;
    return zb__err(ZB_E_IO, "%s: CUDA error %d (%s)", what, (int)e, text ? text : "?");
}

/* dlopens the runtime into c->lib; the message lists every name tried and why it failed. */
static zb_status
load_library(zb_cuda *c, const char *library)
{
    if (library) {
        c->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
        if (!c->lib) return zb__err(ZB_E_UNSUPPORTED, "no CUDA runtime: %s", dlerror());
        snprintf(c->library, sizeof c->library, "%s", library);
        return ZB_OK;
    }
    for (size_t i = 0; i < NRUNTIMES && !c->lib; i++) {
        c->lib = dlopen(RUNTIMES[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (c->lib) snprintf(c->library, sizeof c->library, "%s", RUNTIMES[i]);
    }
    char why[768] = "";
    size_t used = 0;
    for (size_t i = 0; i < NRUNTIMES && !c->lib; i++) {
        c->lib = dlopen(RUNTIMES[i], RTLD_NOW | RTLD_LOCAL);
        if (c->lib) {
            snprintf(c->library, sizeof c->library, "%s", RUNTIMES[i]);
        } else if (used < sizeof why) {
            int k = snprintf(why + used, sizeof why - used, "%s%s", used ? "; " : "", dlerror());
            if (k > 0) used += (size_t)k;
        }
    }
    if (!c->lib) return zb__err(ZB_E_UNSUPPORTED, "no CUDA runtime found: %s", why);
    return ZB_OK;
}

static zb_status
resolve(zb_cuda *c)
{
#define ZB_CU_LOAD(name, ret, args)                                                                \
    *(void **)&c->name = dlsym(c->lib, #name);                                                     \
    if (!c->name) return zb__err(ZB_E_UNSUPPORTED, "CUDA runtime %s has no %s", c->library, #name);
    ZB_CU_FUNCS(ZB_CU_LOAD)
#undef ZB_CU_LOAD
    return ZB_OK;
}

zb_status
zb_cuda_open(const char *library, int device, zb_cuda **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_cuda_open: null out");
    *out = NULL;
    if (device < 0) return zb__err(ZB_E_INVALID, "zb_cuda_open: device %d < 0", device);
    zb_cuda *c = calloc(1, sizeof *c);
    if (!c) return zb__err(ZB_E_NOMEM, "zb_cuda_open: out of memory");
    zb_status st = load_library(c, library);
    if (st == ZB_OK) st = resolve(c);
    if (st == ZB_OK) {
        cu_err e = c->cudaGetDeviceCount(&c->ndevices);
        if (e != CU_SUCCESS)
            st = zb__err(ZB_E_UNSUPPORTED,
                         "CUDA runtime %s finds no usable device: "
                         "cudaGetDeviceCount: CUDA error %d (%s)",
                         c->library, (int)e, c->cudaGetErrorString(e));
        else if (device >= c->ndevices)
            st = zb__err(ZB_E_UNSUPPORTED, "CUDA device %d does not exist: runtime %s sees %d",
                         device, c->library, c->ndevices);
    }
    /* no cudaSetDevice here: the calling thread's current device is its own (PyTorch's);
     * the loader's workers set theirs */
    if (st != ZB_OK) {
        if (c->lib) dlclose(c->lib);
        free(c);
        return st;
    }
    c->device = device;
    atomic_init(&c->refs, 1);
    *out = c;
    return ZB_OK;
}

zb_cuda *
zb__cuda_ref(zb_cuda *cuda)
{
    if (cuda) atomic_fetch_add(&cuda->refs, 1);
    return cuda;
}

void
zb_cuda_close(zb_cuda *cuda)
{
    if (!cuda || atomic_fetch_sub(&cuda->refs, 1) > 1) return;
    /* the runtime stays loaded: unloading libcudart while the process runs is not supported
     * by CUDA (its teardown runs at exit), and a runtime shared with PyTorch must stay */
    free(cuda);
}

const char *
zb_cuda_library(const zb_cuda *cuda)
{
    return cuda ? cuda->library : "";
}

int
zb_cuda_device_count(const zb_cuda *cuda)
{
    return cuda ? cuda->ndevices : 0;
}
