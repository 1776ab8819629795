/* The host side of the CUDA backend: opening a device (stream, cuBLAS
 * handle, code books), memory and copies, and the helpers every operation
 * uses to report errors and borrow scratch memory.
 *
 * One at_backend per device index, created on first open and kept until the
 * process ends (the core holds pointers to it in every tensor buffer). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device/cuda/cuda_internal.h"

#ifdef AT_CUDA_EMULATE
#define CU_BACKEND_PREFIX "cuda-emu"
#else
#define CU_BACKEND_PREFIX "cuda"
#endif

#define CU_MAX_DEVICES 16

/* cuda_ctx first, so the backend's ctx pointer is also the device's. */
typedef struct cu_device {
    cuda_ctx ctx;
    void *scratch2; /* cu_scratch2's area */
    size_t scratch2_size;
    at_backend be;
    int open;
} cu_device;

static cu_device g_devices[CU_MAX_DEVICES];
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- error reporting ---- */

at_status cu_check(cuda_ctx *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return AT_OK;
    /* reported here, so a later cudaGetLastError (cu_launched) does not see it again */
    (void)cudaGetLastError();
    at_status code = e == cudaErrorMemoryAllocation ? AT_ERR_DEVICE_OOM : AT_ERR_DEVICE;
#ifdef AT_CUDA_EMULATE
    const char *detail = at_emu_error_detail(e);
    return c->host->error(code, "%s: CUDA error %s (%s)%s%s", what, cudaGetErrorName(e), cudaGetErrorString(e),
                          *detail ? ": " : "", detail);
#else
    return c->host->error(code, "%s: CUDA error %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
#endif
}

at_status cu_check_blas(cuda_ctx *c, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return AT_OK;
    at_status code = s == CUBLAS_STATUS_ALLOC_FAILED ? AT_ERR_DEVICE_OOM
                     : s == CUBLAS_STATUS_NOT_SUPPORTED ? AT_ERR_UNSUPPORTED
                                                        : AT_ERR_DEVICE;
#ifdef AT_CUDA_EMULATE
    const char *detail = at_emu_blas_error_detail(s);
    return c->host->error(code, "%s: cuBLAS error %s (%s)%s%s", what, cublasGetStatusName(s),
                          cublasGetStatusString(s), *detail ? ": " : "", detail);
#else
    return c->host->error(code, "%s: cuBLAS error %s (%s)", what, cublasGetStatusName(s), cublasGetStatusString(s));
#endif
}

at_status cu_launched(cuda_ctx *c, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return AT_OK;
    char buf[160];
    snprintf(buf, sizeof buf, "%s (kernel launch)", what);
    return cu_check(c, e, buf);
}

/* ---- memory ---- */

/* cudaMalloc with the out-of-memory message a user can act on. */
static at_status device_alloc(cuda_ctx *c, size_t size, const char *what, void **out)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, size);
    if (e == cudaSuccess) return AT_OK;
    (void)cudaGetLastError();
    *out = NULL;
    if (e != cudaErrorMemoryAllocation) return cu_check(c, e, what);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0, (void)cudaGetLastError();
    return c->host->error(AT_ERR_DEVICE_OOM,
                          "%s: out of GPU memory on " CU_BACKEND_PREFIX ":%d allocating %zu bytes (%.1f MiB); "
                          "%.1f MiB free of %.1f MiB. Lower --per_device_train_batch_size or --max_length, or use "
                          "--train_type qlora",
                          what, c->device, size, size / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
}

/* Grows one scratch area to at least `bytes` (by half again, so that slowly
 * growing requests do not reallocate every time). cudaFree waits for the
 * work that may still use the old area. */
static at_status grow(cuda_ctx *c, void **area, size_t *size, size_t bytes, const char *what)
{
    if (*area && *size >= bytes) return AT_OK;
    size_t want = bytes + bytes / 2;
    if (want < 65536) want = 65536;
    if (*area) {
        at_status st = cu_check(c, cudaFree(*area), what);
        *area = NULL;
        *size = 0;
        if (st != AT_OK) return st;
    }
    at_status st = device_alloc(c, want, what, area);
    if (st == AT_ERR_DEVICE_OOM) { /* the exact size may still fit */
        want = bytes;
        st = device_alloc(c, want, what, area);
    }
    if (st != AT_OK) return st;
    *size = want;
    return AT_OK;
}

at_status cu_scratch(cuda_ctx *c, size_t bytes, void **out)
{
    at_status st = grow(c, &c->scratch, &c->scratch_size, bytes, "CUDA scratch memory");
    *out = st == AT_OK ? c->scratch : NULL;
    return st;
}

at_status cu_scratch2(cuda_ctx *c, size_t bytes, void **out)
{
    cu_device *d = (cu_device *)c;
    at_status st = grow(c, &d->scratch2, &d->scratch2_size, bytes, "CUDA scratch memory (second area)");
    *out = st == AT_OK ? d->scratch2 : NULL;
    return st;
}

/* ---- the backend's memory entries ---- */

static at_status be_alloc(at_backend *be, size_t size, void **out)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice"));
    return device_alloc(c, size, "allocating a tensor", out);
}

static void be_free(at_backend *be, void *ptr)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (!ptr) return;
    (void)cudaSetDevice(c->device);
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c->host->log(0, "%s: cudaFree(%p): %s (%s)", be->name, ptr, cudaGetErrorName(e), cudaGetErrorString(e));
    }
}

/* Host -> device, on the stream (ordered after the kernels queued before it).
 * The caller may free or reuse its buffer as soon as this returns, so wait
 * for the copy (pageable memory would be staged anyway). */
static at_status be_upload(at_backend *be, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (!n) return AT_OK;
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice"));
    CU_TRY(cu_check(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream), "upload (cudaMemcpyAsync)"));
    return cu_check(c, cudaStreamSynchronize(c->stream), "upload (cudaStreamSynchronize)");
}

/* Device -> host; the wait also reports the deferred index checks of the
 * operations queued before it (cuda_check.cu): a bad label or id becomes the
 * error of the first download or synchronize after it (at_read_scalar and
 * the dispatcher's CPU fallback download too). The data is copied either way. */
static at_status be_download(at_backend *be, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (!n) return AT_OK;
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice"));
    CU_TRY(cu_check(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream), "download (cudaMemcpyAsync)"));
    return cu_sync_report(c, "download (cudaStreamSynchronize)");
}

static at_status be_synchronize(at_backend *be)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice"));
    return cu_sync_report(c, "synchronize");
}

/* ---- open ---- */

static void release(cu_device *d)
{
    cuda_ctx *c = &d->ctx;
    if (c->nf4_code) (void)cudaFree(c->nf4_code);
    if (c->dyn8_code) (void)cudaFree(c->dyn8_code);
    if (c->chk_dev) (void)cudaFree(c->chk_dev);
    if (c->scratch) (void)cudaFree(c->scratch);
    if (d->scratch2) (void)cudaFree(d->scratch2);
    if (c->cublas) (void)cublasDestroy(c->cublas);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    memset(d, 0, sizeof *d);
}

static at_status open_device(const at_cuda_host_api *host, int index, cu_device *d)
{
    at_status st = AT_OK;
    cuda_ctx *c = &d->ctx;
    memset(d, 0, sizeof *d);
    c->device = index;
    c->host = host;
    cudaDeviceProp prop;
    const char *tf32 = getenv("ANYTUNE_ALLOW_TF32");
    AT_CHECK(cu_check(c, cudaSetDevice(index), "cudaSetDevice"));
    AT_CHECK(cu_check(c, cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties"));
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    c->sm_count = prop.multiProcessorCount;
    /* non-blocking: never serialized with the legacy default stream of other libraries */
    AT_CHECK(cu_check(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    AT_CHECK(cu_check_blas(c, cublasCreate(&c->cublas), "cublasCreate"));
    AT_CHECK(cu_check_blas(c, cublasSetStream(c->cublas, c->stream), "cublasSetStream"));
    c->allow_tf32 = tf32 && atoi(tf32) != 0;
    AT_CHECK(cu_check_blas(c, cublasSetMathMode(c->cublas, c->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                           "cublasSetMathMode"));
    AT_CHECK(device_alloc(c, 16 * sizeof(float), "NF4 code book", (void **)&c->nf4_code));
    AT_CHECK(device_alloc(c, 256 * sizeof(float), "dyn8 code book", (void **)&c->dyn8_code));
    /* on the stream: the legacy default stream is not ordered with a non-blocking one */
    AT_CHECK(cu_check(c, cudaMemcpyAsync(c->nf4_code, host->nf4_code, 16 * sizeof(float), cudaMemcpyHostToDevice,
                                         c->stream), "NF4 code book upload"));
    AT_CHECK(cu_check(c, cudaMemcpyAsync(c->dyn8_code, host->dyn8_code, 256 * sizeof(float), cudaMemcpyHostToDevice,
                                         c->stream), "dyn8 code book upload"));
    AT_CHECK(cu_check(c, cudaStreamSynchronize(c->stream), "code book upload"));

    {
        at_backend *be = &d->be;
        snprintf(be->name, sizeof be->name, CU_BACKEND_PREFIX ":%d", index);
        be->kind = AT_DEVICE_CUDA;
        be->is_host = 0;
        be->fast_bf16 = c->cc_major >= 8;
        be->ctx = c;
        be->alloc = be_alloc;
        be->free = be_free;
        be->upload = be_upload;
        be->download = be_download;
        be->synchronize = be_synchronize;
        /* every operation of device/op_table.h has its cu_<op> */
#define SET_ENTRY(name) be->ops.name = cu_##name;
        AT_BACKEND_OPS(SET_ENTRY)
#undef SET_ENTRY
#ifndef AT_CUDA_EMULATE
        /* the emulator has no NCCL: NULL lets the core reduce through host memory and MPI */
        be->comm_id = cu_comm_id;
        be->comm_init = cu_comm_init;
        be->allreduce_sum = cu_allreduce_sum;
#endif
    }
    d->open = 1;
done:
    if (st != AT_OK) release(d);
    return st;
}

extern "C" __attribute__((visibility("default"))) at_status at_cuda_backend_open(const at_cuda_host_api *host,
                                                                                  int device_index, at_backend **out)
{
    if (!out) return AT_ERR_INVALID;
    *out = NULL;
    /* the host table's layout is only known for our own version */
    if (!host || host->version != AT_CUDA_API_VERSION || !host->error || !host->log) return AT_ERR_UNSUPPORTED;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return host->error(e == cudaErrorNoDevice ? AT_ERR_NOT_FOUND : AT_ERR_DEVICE,
                           "cudaGetDeviceCount: CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (device_index < 0 || device_index >= count || device_index >= CU_MAX_DEVICES)
        return host->error(AT_ERR_NOT_FOUND, "no CUDA device %d (%d device%s present)", device_index, count,
                           count == 1 ? "" : "s");
    pthread_mutex_lock(&g_open_lock);
    cu_device *d = &g_devices[device_index];
    at_status st = d->open ? AT_OK : open_device(host, device_index, d);
    if (st == AT_OK) *out = &d->be;
    pthread_mutex_unlock(&g_open_lock);
    return st;
}
