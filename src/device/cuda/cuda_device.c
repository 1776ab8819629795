/* NVIDIA GPUs as a device kind of the registry (device/registry.h). This
 * file is part of the core (C, no CUDA headers), unlike the .cu files beside
 * it, which nvcc builds into the backend library: probing asks the NVIDIA
 * driver library (loaded with dlopen, so one binary runs with or without the
 * GPU stack) for its devices; opening one loads the backend library through
 * device/cuda_loader.h. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device/cuda_loader.h"
#include "device/registry.h"

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_dev_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_ctx_retain_fn)(void **, int);
typedef int (*cu_ctx_release_fn)(int);
typedef int (*cu_ctx_set_fn)(void *);
typedef int (*cu_meminfo_fn)(size_t *, size_t *);

/* ANYTUNE_CUDA_EMULATE=LIBRARY (tests): one CUDA device served by the
 * emulator build of the backend (device/cuda/emu), which runs the CUDA
 * kernels on the CPU; the whole program then runs "on CUDA" without a GPU. */
static int probe_emulated(at_device_list *list)
{
    const char *lib = getenv("ANYTUNE_CUDA_EMULATE");
    if (!lib || !*lib) return 0;
    at_device_info *d = at_device_list_add(list, AT_DEVICE_CUDA, "cuda:0");
    if (!d) return 1;
    d->present = d->usable = 1;
    snprintf(d->model, sizeof d->model, "CUDA emulator on the CPU (%.80s)", lib);
    snprintf(d->driver, sizeof d->driver, "emulated");
    int limited = 0;
    at_host_memory(&d->mem_total, &d->mem_free, &limited);
    d->cc_major = 9;
    d->fast_bf16 = d->fast_f16 = d->tf32 = 1;
    return 1;
}

static void cuda_probe(at_device_list *list)
{
    if (probe_emulated(list)) return;
    char note[sizeof ((at_device_info *)0)->note];
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(note, sizeof note,
                 "no NVIDIA driver library (libcuda.so.1) found: install the NVIDIA driver to use a GPU");
        goto absent;
    }
    cu_init_fn cuInit = (cu_init_fn)dlsym(lib, "cuInit");
    cu_int_fn cuDriverGetVersion = (cu_int_fn)dlsym(lib, "cuDriverGetVersion");
    cu_int_fn cuDeviceGetCount = (cu_int_fn)dlsym(lib, "cuDeviceGetCount");
    cu_dev_get_fn cuDeviceGet = (cu_dev_get_fn)dlsym(lib, "cuDeviceGet");
    cu_name_fn cuDeviceGetName = (cu_name_fn)dlsym(lib, "cuDeviceGetName");
    cu_mem_fn cuDeviceTotalMem = (cu_mem_fn)dlsym(lib, "cuDeviceTotalMem_v2");
    cu_attr_fn cuDeviceGetAttribute = (cu_attr_fn)dlsym(lib, "cuDeviceGetAttribute");
    cu_ctx_retain_fn cuDevicePrimaryCtxRetain = (cu_ctx_retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu_ctx_release_fn cuDevicePrimaryCtxRelease = (cu_ctx_release_fn)dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    cu_ctx_set_fn cuCtxSetCurrent = (cu_ctx_set_fn)dlsym(lib, "cuCtxSetCurrent");
    cu_meminfo_fn cuMemGetInfo = (cu_meminfo_fn)dlsym(lib, "cuMemGetInfo_v2");
    if (!cuInit || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName || !cuDeviceTotalMem ||
        !cuDeviceGetAttribute) {
        snprintf(note, sizeof note, "the NVIDIA driver library is too old (missing entry points)");
        goto absent_close;
    }
    int rc = cuInit(0);
    if (rc != 0) {
        snprintf(note, sizeof note,
                 "NVIDIA driver found but cuInit failed (error %d): no usable GPU, or the driver and kernel "
                 "module versions differ",
                 rc);
        goto absent_close;
    }
    int version = 0, count = 0;
    if (cuDriverGetVersion) cuDriverGetVersion(&version);
    cuDeviceGetCount(&count);
    if (count == 0) {
        snprintf(note, sizeof note, "NVIDIA driver %d.%d found but no GPU is visible", version / 1000,
                 (version % 1000) / 10);
        goto absent_close;
    }
    for (int i = 0; i < count; i++) {
        int dev = 0;
        if (cuDeviceGet(&dev, i) != 0) continue;
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", i);
        at_device_info *d = at_device_list_add(list, AT_DEVICE_CUDA, name);
        if (!d) break;
        d->present = 1;
        snprintf(d->driver, sizeof d->driver, "CUDA driver %d.%d", version / 1000, (version % 1000) / 10);
        cuDeviceGetName(d->model, sizeof d->model, dev);
        size_t total = 0;
        cuDeviceTotalMem(&total, dev);
        d->mem_total = (int64_t)total;
        cuDeviceGetAttribute(&d->cc_major, 75, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        cuDeviceGetAttribute(&d->cc_minor, 76, dev); /* ..._MINOR */
        d->fast_bf16 = d->cc_major >= 8;
        d->tf32 = d->cc_major >= 8;
        d->fast_f16 = d->cc_major > 7 || (d->cc_major == 7 && d->cc_minor >= 0);
        if (cuDevicePrimaryCtxRetain && cuCtxSetCurrent && cuMemGetInfo && cuDevicePrimaryCtxRelease) {
            void *ctx = NULL;
            if (cuDevicePrimaryCtxRetain(&ctx, dev) == 0) {
                size_t fr = 0, tot = 0;
                if (cuCtxSetCurrent(ctx) == 0 && cuMemGetInfo(&fr, &tot) == 0) d->mem_free = (int64_t)fr;
                cuDevicePrimaryCtxRelease(dev);
            }
        }
        char lib_path[512];
        if (d->cc_major * 10 + d->cc_minor < 75) {
            /* CUDA 13, which builds the backend, compiles for Turing (7.5) and newer */
            snprintf(d->note, sizeof d->note,
                     "compute capability %d.%d is older than 7.5, the oldest the CUDA backend is built for",
                     d->cc_major, d->cc_minor);
        } else if (at_cuda_library_find(lib_path, sizeof lib_path)) {
            d->usable = 1;
        } else {
            snprintf(d->note, sizeof d->note,
                     "found, but this build has no CUDA backend (%.120s): rebuild on a machine with the CUDA "
                     "toolkit (nvcc, cuBLAS) installed, or set ANYTUNE_CUDA_LIBRARY",
                     lib_path);
        }
    }
    dlclose(lib);
    return;
absent_close:
    dlclose(lib);
absent:;
    /* one entry saying why there is no GPU */
    at_device_info *d = at_device_list_add(list, AT_DEVICE_CUDA, "cuda");
    if (d) snprintf(d->note, sizeof d->note, "%s", note);
}

static int cuda_has_backend(void)
{
    char path[512];
    return at_cuda_library_find(path, sizeof path);
}

/* The emulator's library stands in for the real one when the probe used it. */
static at_status cuda_open(const at_device_info *d, at_backend **out)
{
    const char *emu = getenv("ANYTUNE_CUDA_EMULATE");
    const char *colon = strchr(d->name, ':');
    return at_cuda_backend_load(emu && *emu ? emu : NULL, colon ? atoi(colon + 1) : 0, out);
}

const at_device_driver at_cuda_device_driver = {
    .kind = "cuda",
    .id = AT_DEVICE_CUDA,
    .numbered = 1,
    .probe = cuda_probe,
    .has_backend = cuda_has_backend,
    .open = cuda_open,
};
