/* The CUDA emulator's runtime (see cuda_emu.h): errors, the device, host
 * memory with guard zones standing for device memory, synchronous copies,
 * streams and events. Kernel launches are in cuda_emu_launch.cpp, cuBLAS in
 * cuda_emu_blas.cpp.
 *
 * Everything runs under one lock (at_emu_lock): launches, copies and GEMMs of
 * several host threads are serialized (blocks run one after another anyway). */
#include "device/cuda/emu/cuda_emu.h"
#include "device/cuda/emu/cuda_emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <map>
#include <mutex>
#include <set>

/* ------------------------------------------------------------------------ */
/* errors                                                                     */
/* ------------------------------------------------------------------------ */

static thread_local cudaError_t g_last_error = cudaSuccess;
static thread_local cudaError_t g_detail_code = cudaSuccess;
static thread_local char g_detail[1024];

/* Records e as the last error with a detailed message; returns e. */
cudaError_t at_emu_fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_detail, sizeof g_detail, fmt, ap);
    va_end(ap);
    g_detail_code = e;
    g_last_error = e;
    return e;
}

const char *at_emu_error_detail(cudaError_t e) { return e != cudaSuccess && e == g_detail_code ? g_detail : ""; }

static const struct {
    cudaError_t e;
    const char *name, *text;
} ERRORS[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t e)
{
    for (const auto &x : ERRORS)
        if (x.e == e) return x.name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    for (const auto &x : ERRORS)
        if (x.e == e) return x.text;
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

/* ------------------------------------------------------------------------ */
/* device                                                                     */
/* ------------------------------------------------------------------------ */

std::recursive_mutex at_emu_lock;
static thread_local int g_device = 0;
static const int SM_COUNT = 8;

/* ANYTUNE_CUDA_EMU_MEMORY: bytes, optional K/M/G suffix; default 16 GiB. */
static size_t memory_cap(void)
{
    static size_t cap = 0;
    if (cap) return cap;
    cap = (size_t)16 << 30;
    const char *s = getenv("ANYTUNE_CUDA_EMU_MEMORY");
    if (s && *s) {
        char *end = NULL;
        unsigned long long v = strtoull(s, &end, 10);
        if (end && (*end == 'k' || *end == 'K')) v <<= 10;
        else if (end && (*end == 'm' || *end == 'M')) v <<= 20;
        else if (end && (*end == 'g' || *end == 'G')) v <<= 30;
        if (v) cap = (size_t)v;
    }
    return cap;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return at_emu_fail(cudaErrorInvalidValue, "cudaGetDeviceCount: count is NULL");
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device != 0) return at_emu_fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulator has one device, 0", device);
    g_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return at_emu_fail(cudaErrorInvalidValue, "cudaGetDevice: device is NULL");
    *device = g_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (!p) return at_emu_fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: prop is NULL");
    if (device != 0) return at_emu_fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): no such device", device);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "anytune CUDA emulator");
    p->totalGlobalMem = memory_cap();
    p->sharedMemPerBlock = AT_EMU_SHARED_DEFAULT;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = SM_COUNT;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 233472;
    p->sharedMemPerBlockOptin = AT_EMU_SHARED_OPTIN;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!value) return at_emu_fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: value is NULL");
    if (device != 0) return at_emu_fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: no device %d", device);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)AT_EMU_SHARED_DEFAULT; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = SM_COUNT; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)AT_EMU_SHARED_OPTIN; break;
    default: return at_emu_fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
    }
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return at_emu_fail(cudaErrorInvalidValue, "cudaDriverGetVersion: NULL");
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return at_emu_fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: NULL");
    *v = 13000;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* memory: host memory between guard zones                                    */
/* ------------------------------------------------------------------------ */

static const size_t GUARD = 256; /* bytes before and after each allocation (keeps 256-byte alignment) */
static const unsigned char GUARD_BYTE = 0xa5;

struct emu_alloc {
    size_t size;
    unsigned char *raw;
};
static std::map<uintptr_t, emu_alloc> g_allocs; /* by user address */
static std::set<void *> g_pinned;
static size_t g_used;

/* Rounded size charged against the cap (cudaMalloc's 256-byte granularity). */
static size_t charged(size_t n) { return (n + 255) & ~(size_t)255; }

/* The allocation holding [p, p + n), or NULL. */
static const std::pair<const uintptr_t, emu_alloc> *find_alloc(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return NULL;
    --it;
    if (a < it->first || a - it->first > it->second.size || n > it->second.size - (a - it->first)) return NULL;
    return &*it;
}

bool at_emu_is_device(const void *p, size_t n) { return find_alloc(p, n) != NULL; }

/* Whether any byte of [p, p + n) lies in device memory (a host pointer that is not). */
bool at_emu_touches_device(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a + (n ? n - 1 : 0));
    if (it == g_allocs.begin()) return false;
    --it;
    return it->first + it->second.size + GUARD > a && it->first < a + (n ? n : 1) + GUARD;
}

/* Checks every allocation's guard zones; the first damaged one becomes a
 * cudaErrorIllegalAddress naming `who` (the guard is restored so the next
 * check does not report it again). */
cudaError_t at_emu_check_guards(const char *who)
{
    for (auto &kv : g_allocs) {
        unsigned char *before = kv.second.raw, *after = (unsigned char *)kv.first + kv.second.size;
        for (int side = 0; side < 2; side++) {
            unsigned char *g = side ? after : before;
            for (size_t i = 0; i < GUARD; i++)
                if (g[i] != GUARD_BYTE) {
                    size_t last = i;
                    for (size_t j = i; j < GUARD; j++)
                        if (g[j] != GUARD_BYTE) last = j;
                    memset(g, GUARD_BYTE, GUARD);
                    if (side)
                        return at_emu_fail(cudaErrorIllegalAddress,
                                    "%s wrote past the end of the %zu-byte allocation at %p (bytes %zu..%zu after "
                                    "its end)",
                                    who, kv.second.size, (void *)kv.first, i, last);
                    return at_emu_fail(cudaErrorIllegalAddress,
                                "%s wrote before the start of the %zu-byte allocation at %p (bytes %zu..%zu before "
                                "its start)",
                                who, kv.second.size, (void *)kv.first, GUARD - last, GUARD - i);
                }
        }
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!free_bytes || !total_bytes) return at_emu_fail(cudaErrorInvalidValue, "cudaMemGetInfo: NULL argument");
    *total_bytes = memory_cap();
    *free_bytes = g_used < *total_bytes ? *total_bytes - g_used : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!ptr) return at_emu_fail(cudaErrorInvalidValue, "cudaMalloc: devPtr is NULL");
    *ptr = NULL;
    if (size == 0) return cudaSuccess;
    size_t cap = memory_cap();
    if (size > cap || charged(size) > cap - g_used)
        return at_emu_fail(cudaErrorMemoryAllocation,
                    "cudaMalloc(%zu bytes): the emulated device has %zu of %zu bytes free (ANYTUNE_CUDA_EMU_MEMORY)",
                    size, cap - g_used, cap);
    if (size > SIZE_MAX - 2 * GUARD - 256) return at_emu_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes)", size);
    size_t total = (GUARD + size + GUARD + 255) & ~(size_t)255;
    unsigned char *raw = (unsigned char *)aligned_alloc(256, total);
    if (!raw) return at_emu_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): host memory exhausted", size);
    unsigned char *user = raw + GUARD;
    memset(raw, GUARD_BYTE, GUARD);
    memset(user, 0xff, size); /* uninitialized device memory reads as NaN / -1 */
    memset(user + size, GUARD_BYTE, GUARD);
    g_allocs[(uintptr_t)user] = emu_alloc{size, raw};
    g_used += charged(size);
    *ptr = user;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!ptr) return cudaSuccess;
    auto it = g_allocs.find((uintptr_t)ptr);
    if (it == g_allocs.end())
        return at_emu_fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live device allocation", ptr);
    cudaError_t e = at_emu_check_guards("a kernel or copy before cudaFree");
    g_used -= charged(it->second.size);
    free(it->second.raw);
    g_allocs.erase(it);
    return e;
}

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    (void)stream;
    return cudaMalloc(ptr, size);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    (void)stream;
    return cudaFree(ptr);
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!ptr) return at_emu_fail(cudaErrorInvalidValue, "cudaMallocHost: ptr is NULL");
    *ptr = malloc(size ? size : 1);
    if (!*ptr) return at_emu_fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu bytes)", size);
    g_pinned.insert(*ptr);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!ptr) return cudaSuccess;
    if (!g_pinned.erase(ptr)) return at_emu_fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not from cudaMallocHost", ptr);
    free(ptr);
    return cudaSuccess;
}

static const char *KIND_NAMES[] = {"host->host", "host->device", "device->host", "device->device", "default"};

/* Checks one side of a copy: device memory must lie inside one allocation,
 * host memory must not touch device memory. */
static cudaError_t check_side(const char *fn, const char *side, const void *p, size_t n, bool device, int kind)
{
    if (!p) return at_emu_fail(cudaErrorInvalidValue, "%s %s: %s pointer is NULL", fn, KIND_NAMES[kind], side);
    if (device && !find_alloc(p, n))
        return at_emu_fail(cudaErrorInvalidValue, "%s %s: %s [%p, +%zu bytes) is not inside one device allocation", fn,
                    KIND_NAMES[kind], side, p, n);
    if (!device && at_emu_touches_device(p, n))
        return at_emu_fail(cudaErrorInvalidValue, "%s %s: %s %p is device memory but the kind says host", fn,
                    KIND_NAMES[kind], side, p);
    return cudaSuccess;
}

struct CUstream_st {
    unsigned int flags;
};
static std::set<cudaStream_t> g_streams;

bool at_emu_stream_ok(cudaStream_t s)
{
    return s == NULL || s == (cudaStream_t)0x1 || s == (cudaStream_t)0x2 || g_streams.count(s);
}

/* Live streams created with cudaStreamNonBlocking. */
static int g_nonblocking;

const char *at_emu_stream_problem(cudaStream_t s)
{
    if (!at_emu_stream_ok(s)) return "is not a live stream";
    if ((s == NULL || s == (cudaStream_t)0x1 || s == (cudaStream_t)0x2) && g_nonblocking)
        return "is a default stream, which is not ordered with the work queued on the non-blocking stream(s) alive "
               "(queue it on that stream)";
    return NULL;
}

static cudaError_t copy(const char *fn, void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                        cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if ((int)kind < 0 || (int)kind > 4)
        return at_emu_fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d is not a cudaMemcpyKind", fn, (int)kind);
    if (const char *why = at_emu_stream_problem(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "%s: stream %p %s", fn, (void *)stream, why);
    if (count == 0) return cudaSuccess;
    bool ddev, sdev;
    if (kind == cudaMemcpyDefault) ddev = find_alloc(dst, 1) != NULL, sdev = find_alloc(src, 1) != NULL;
    else ddev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice,
    sdev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    cudaError_t e = check_side(fn, "destination", dst, count, ddev, kind);
    if (e == cudaSuccess) e = check_side(fn, "source", src, count, sdev, kind);
    if (e != cudaSuccess) return e;
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind)
{
    cudaError_t e = copy("cudaMemcpy", dst, src, count, kind, NULL);
    if (e == cudaSuccess) e = at_emu_check_guards("a kernel before cudaMemcpy");
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy("cudaMemcpyAsync", dst, src, count, kind, stream);
}

static cudaError_t set(const char *fn, void *ptr, int value, size_t count, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (const char *why = at_emu_stream_problem(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "%s: stream %p %s", fn, (void *)stream, why);
    if (count == 0) return cudaSuccess;
    if (!ptr || !find_alloc(ptr, count))
        return at_emu_fail(cudaErrorInvalidValue, "%s: [%p, +%zu bytes) is not inside one device allocation", fn, ptr, count);
    memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) { return set("cudaMemset", ptr, value, count, NULL); }
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    return set("cudaMemsetAsync", ptr, value, count, stream);
}

/* ------------------------------------------------------------------------ */
/* streams and events (everything runs at once, so they only check handles)   */
/* ------------------------------------------------------------------------ */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!stream) return at_emu_fail(cudaErrorInvalidValue, "cudaStreamCreate: pStream is NULL");
    if (flags > 1) return at_emu_fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: flags %#x", flags);
    *stream = new CUstream_st{flags};
    g_streams.insert(*stream);
    g_nonblocking += flags == cudaStreamNonBlocking;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!g_streams.erase(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream", (void *)stream);
    g_nonblocking -= stream->flags == cudaStreamNonBlocking;
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!at_emu_stream_ok(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize(%p): not a live stream", (void *)stream);
    return at_emu_check_guards("a kernel");
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!at_emu_stream_ok(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p): not a live stream", (void *)stream);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    return at_emu_check_guards("a kernel");
}

struct CUevent_st {
    unsigned int flags;
    double t;
};
static std::set<cudaEvent_t> g_events;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!event) return at_emu_fail(cudaErrorInvalidValue, "cudaEventCreate: event is NULL");
    *event = new CUevent_st{flags, -1.0};
    g_events.insert(*event);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!g_events.erase(event))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", (void *)event);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!g_events.count(event) || !at_emu_stream_ok(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p, %p): bad handle", (void *)event,
                    (void *)stream);
    event->t = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!g_events.count(event))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(%p): not a live event", (void *)event);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!ms) return at_emu_fail(cudaErrorInvalidValue, "cudaEventElapsedTime: ms is NULL");
    if (!g_events.count(start) || !g_events.count(end))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: bad event");
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event created with cudaEventDisableTiming");
    if (start->t < 0 || end->t < 0) return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event not recorded");
    *ms = (float)(end->t - start->t);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    (void)flags;
    if (!g_events.count(event) || !at_emu_stream_ok(stream))
        return at_emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: bad handle");
    return cudaSuccess;
}

/* The largest dynamic shared memory any kernel was allowed (cudaFuncSetAttribute). */
size_t at_emu_shared_optin = AT_EMU_SHARED_DEFAULT;

cudaError_t at_emu_func_set_attribute(cudaFuncAttribute attr, int value)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > AT_EMU_SHARED_OPTIN)
            return at_emu_fail(cudaErrorInvalidValue,
                        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): the device allows at most %zu", value,
                        AT_EMU_SHARED_OPTIN);
        if ((size_t)value > at_emu_shared_optin) at_emu_shared_optin = (size_t)value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return at_emu_fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
}

cudaError_t at_emu_func_get_attributes(cudaFuncAttributes *attr)
{
    if (!attr) return at_emu_fail(cudaErrorInvalidValue, "cudaFuncGetAttributes: attr is NULL");
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = (int)at_emu_shared_optin;
    attr->preferredShmemCarveout = -1;
    return cudaSuccess;
}
