/* Inside the CUDA backend library: the per-device context, the helpers every
 * source file uses, and the operation entries each file defines (their
 * signatures are those of device/op_table.h, their math that of ops/ops.h).
 *
 * The dispatcher of ops/ has already checked shapes, dtypes and that every
 * tensor lives on this backend; an entry checks only what is particular to
 * the device (a dtype combination it has no kernel for returns
 * AT_ERR_UNSUPPORTED with a message) and reports CUDA / cuBLAS failures as
 * AT_ERR_DEVICE (AT_ERR_DEVICE_OOM for allocations) naming the operation.
 *
 * Work is queued on the context's stream; nothing waits for the GPU except
 * download, synchronize, and the operations that return a value to the host
 * (none of the entries do: at_read_scalar downloads). */
#ifndef AT_DEVICE_CUDA_INTERNAL_H
#define AT_DEVICE_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "device/cuda/cuda_compat.h"

extern "C" {
#include "device/backend.h"
#include "device/cuda/cuda_api.h"
}

/* dtype codes as device/dtype.h (at_cu_load / at_cu_store take the first three). */
enum { CU_F32 = AT_F32, CU_BF16 = AT_BF16, CU_F16 = AT_F16, CU_I32 = AT_I32 };

/* One deferred index check (cuda_check.cu, below). */
#define CU_CHK_MAX 64
enum { CU_CHK_BELOW = 0, /* label: must be < limit (negatives are ignored) */
       CU_CHK_RANGE = 1  /* id: must lie in [0, limit) */ };
typedef struct cu_pending_check {
    const char *op;  /* a string literal: "cross_entropy", "embedding_forward", ... */
    int kind;        /* CU_CHK_* */
    int64_t limit;
    char name[96];   /* the index tensor's name (AT_NAME_MAX) */
    char table[200]; /* CU_CHK_RANGE: the table's description, "name [V, D] dtype" */
} cu_pending_check;

typedef struct cuda_ctx {
    int device;
    const at_cuda_host_api *host;
    cudaStream_t stream;
    cublasHandle_t cublas;
    int cc_major, cc_minor, sm_count;
    int allow_tf32;     /* ANYTUNE_ALLOW_TF32=1: f32 matmuls may use TF32 tensor cores */
    void *scratch;      /* grown on demand by cu_scratch; one user at a time (stream order) */
    size_t scratch_size;
    float *nf4_code;    /* device copies of the code books (16 and 256 floats) */
    float *dyn8_code;
    /* deferred index checks (cuda_check.cu): one device word per pending
     * check, and on the host what its error message needs */
    unsigned long long *chk_dev;          /* CU_CHK_MAX words, ~0 = no bad index seen */
    unsigned long long chk_host[CU_CHK_MAX]; /* their values, read back at the next sync */
    cu_pending_check chk_pending[CU_CHK_MAX];
    int chk_n;                               /* checks queued since the last report */
} cuda_ctx;

/* The context of the backend a tensor lives on, its device made the calling
 * thread's current one (every operation entry starts here). CUDA keeps the
 * current device per host thread and sends launches, cuBLAS calls and
 * cudaMalloc to it; a launch on another device's stream fails. The serve
 * engine runs the model on a thread of its own, where device 0 is current
 * until set, so without this a model on cuda:1 would fail there. A failed
 * switch is reported by the launch that follows (cudaGetLastError). */
static inline cuda_ctx *cu_ctx(const at_tensor *t)
{
    cuda_ctx *c = (cuda_ctx *)t->buf->backend->ctx;
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device) (void)cudaSetDevice(c->device);
    return c;
}

/* Device address of the tensor's first element. */
static inline void *cu_ptr(const at_tensor *t) { return (char *)t->buf->ptr + t->offset; }

static inline int64_t cu_numel(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
static inline int64_t cu_cols(const at_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
static inline int64_t cu_rows(const at_tensor *t) { return cu_cols(t) ? cu_numel(t) / cu_cols(t) : 0; }

/* Blocks of `threads` to cover n elements (at least 1). */
static inline unsigned cu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Blocks for a grid-stride loop over n items: enough to fill the device a few
 * times over (16 an SM), no more (each thread then handles several items). */
static inline unsigned cu_grid(const cuda_ctx *c, int64_t n, int threads)
{
    unsigned b = cu_blocks(n, threads);
    unsigned cap = (unsigned)(c->sm_count > 0 ? c->sm_count : 1) * 16u;
    return b < cap ? b : cap;
}

/* A grid-stride loop: i runs over [0, n), a thread's items a grid apart. */
#define CU_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

/* Reports a CUDA runtime error (AT_OK when e == cudaSuccess): "what: CUDA error
 * cudaErrorX (text)". cudaErrorMemoryAllocation becomes AT_ERR_DEVICE_OOM. */
at_status cu_check(cuda_ctx *c, cudaError_t e, const char *what);
/* The same for a cuBLAS status. */
at_status cu_check_blas(cuda_ctx *c, cublasStatus_t s, const char *what);
/* After AT_LAUNCH: reports a launch failure of kernel `what`. */
at_status cu_launched(cuda_ctx *c, const char *what);
/* A device buffer of at least `bytes`, valid until the next cu_scratch call
 * (operations on the one stream run in order, so reuse is safe). */
at_status cu_scratch(cuda_ctx *c, size_t bytes, void **out);
/* A second, independent scratch area for operations that need two. */
at_status cu_scratch2(cuda_ctx *c, size_t bytes, void **out);

/* ---- deferred index checks (cuda_check.cu) ----
 * Kernels that index with caller data (embedding ids, cross-entropy labels)
 * do not make the host wait for a check. A call takes a slot with
 * cu_check_defer, its kernel records the first bad index in it
 * (cu_record_bad) and treats that row as ignored, never reading or writing
 * out of bounds; the error is raised, with the CPU kernel's message, at the
 * next download or synchronize (cu_sync_report), which waits anyway. */
/* A device word for one more check of index tensor `idx` against `limit`
 * (`table`: the table described in the message, or NULL), owned by the
 * context. With CU_CHK_MAX checks already pending it first waits for and
 * reports them (so an earlier call's bad index may be this call's error). */
at_status cu_check_defer(cuda_ctx *c, const char *op, int kind, const at_tensor *idx, const at_tensor *table,
                         int64_t limit, unsigned long long **slot);
/* Waits for the stream (after the caller queued its copies) and reports the
 * first pending check that saw a bad index, as AT_ERR_INVALID with the CPU
 * kernel's message; resets the pending checks either way. A CUDA error of
 * the wait comes first. `what` names the wait in a CUDA error. */
at_status cu_sync_report(cuda_ctx *c, const char *what);

/* Records bad index value v at position i in `slot`, keeping the lowest
 * position: the key is (i << 32 | v) and the word keeps the smallest key. */
static __device__ __forceinline__ void cu_record_bad(unsigned long long *slot, int64_t i, int32_t v)
{
    unsigned long long pos = (unsigned long long)(i < 0xFFFFFFFELL ? i : 0xFFFFFFFELL);
    unsigned long long key = pos << 32 | (unsigned long long)(uint32_t)v, old = *(volatile unsigned long long *)slot;
    while (key < old) {
        unsigned long long seen = atomicCAS(slot, old, key);
        if (seen == old) break;
        old = seen;
    }
}

#define CU_TRY(expr)                               \
    do {                                           \
        at_status cu_try_s_ = (expr);              \
        if (cu_try_s_ != AT_OK) return cu_try_s_;  \
    } while (0)

/* ---- operation entries ----
 * cu_<op> for each operation of device/op_table.h, with the signature listed
 * there, defined in the file of its family: cuda_matmul.cu (cuBLAS for
 * f32/bf16/f16, dequantizing tiles for q8_0, q4_0, nf4), cuda_elementwise.cu
 * (add ... cast, sum_rows, swiglu, gelu, dropout, uniform noise), cuda_norm.cu
 * (rmsnorm, layernorm, rope), cuda_attention.cu (tiled, online softmax: FlashAttention's
 * scheme), cuda_embedding.cu, cuda_loss.cu (cross-entropy fused with the
 * softmax over the vocabulary), cuda_optim.cu (adamw, sumsq). */
#define CU_KERNEL_DECLARE_(name) at_status cu_##name(AT_OP_PARAMS(name));
AT_BACKEND_OPS(CU_KERNEL_DECLARE_)
#undef CU_KERNEL_DECLARE_

/* cuda_qgemv.cu: fused dequantize-GEMV, C = alpha · A · Wᵀ + beta · C for a
 * quantized W [N, K] and A of at most QG_MAX_ROWS rows (batch stacked), when
 * !ta and tb; sets *done = 0 (and does nothing) when the call does not fit
 * it or ANYTUNE_CUDA_NO_QGEMV=1, so the caller takes the tile path. */
#define QG_MAX_ROWS 8
at_status cu_qgemv(cuda_ctx *c, at_tensor *ct, const at_tensor *a, const at_tensor *w, int ta, int tb, float alpha,
                   float beta, int *done);

/* cuda_nccl.cu: the backend's collectives (at_backend comm_id, comm_init,
 * allreduce_sum; device/comm.h), NCCL loaded with dlopen. */
at_status cu_comm_id(at_backend *be, void *id);
at_status cu_comm_init(at_backend *be, const void *id, int rank, int world);
at_status cu_allreduce_sum(at_backend *be, at_tensor *const *ts, int n);

#endif
