/* The CUDA emulator's cuBLAS (see cuda_emu.h): handles, and GEMMs computed
 * naively with cuBLAS's documented column-major semantics and argument
 * checks, f32 accumulation, the output rounded to C's type. */
#include "device/cuda/emu/cuda_emu.h"
#include "device/cuda/emu/cuda_emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <mutex>
#include <set>
#include <vector>

static thread_local cublasStatus_t g_blas_detail_code = CUBLAS_STATUS_SUCCESS;
static thread_local char g_blas_detail[1024];

__attribute__((format(printf, 2, 3))) static cublasStatus_t blas_fail(cublasStatus_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_blas_detail, sizeof g_blas_detail, fmt, ap);
    va_end(ap);
    g_blas_detail_code = s;
    return s;
}

const char *at_emu_blas_error_detail(cublasStatus_t s)
{
    return s != CUBLAS_STATUS_SUCCESS && s == g_blas_detail_code ? g_blas_detail : "";
}

/* ------------------------------------------------------------------------ */
/* cuBLAS                                                                     */
/* ------------------------------------------------------------------------ */

struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math;
    cublasPointerMode_t pointer_mode;
};
static std::set<cublasHandle_t> g_handles;

static const struct {
    cublasStatus_t s;
    const char *name, *text;
} BLAS_STATUS[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "license error"},
};

const char *cublasGetStatusName(cublasStatus_t s)
{
    for (const auto &x : BLAS_STATUS)
        if (x.s == s) return x.name;
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    for (const auto &x : BLAS_STATUS)
        if (x.s == s) return x.text;
    return "unknown status";
}

static bool handle_ok(cublasHandle_t h) { return h && g_handles.count(h); }

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: handle is NULL");
    *handle = new cublasContext{NULL, CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST};
    g_handles.insert(*handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!g_handles.erase(handle))
        return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy(%p): not a live handle", (void *)handle);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream: not a live handle");
    if (!at_emu_stream_ok(stream))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream: %p is not a live stream", (void *)stream);
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetStream: not a live handle");
    if (!stream) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream: stream is NULL");
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode: not a live handle");
    int base = (int)mode & 0xf, flags = (int)mode & ~0xf;
    if (base > 3 || (flags & ~16))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: %d is not a cublasMath_t", (int)mode);
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetMathMode: not a live handle");
    if (!mode) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode: mode is NULL");
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetPointerMode: not a live handle");
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetPointerMode: %d", (int)mode);
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(handle)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace: not a live handle");
    if (bytes && (!workspace || !at_emu_is_device(workspace, bytes)))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasSetWorkspace: [%p, +%zu bytes) is not inside one device allocation", workspace, bytes);
    if ((uintptr_t)workspace % 256)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: %p is not 256-byte aligned", workspace);
    return CUBLAS_STATUS_SUCCESS;
}

/* Element conversions: cuda_half.h's, the kernels' own (bit-exact with device/dtype.h). */
static float load_elem(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? at_cu_bf16_to_f32(h) : at_cu_f16_to_f32(h);
}

static void store_elem(void *p, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else if (t == CUDA_R_16BF) ((uint16_t *)p)[i] = at_cu_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = at_cu_f32_to_f16(v);
}

/* f rounded to bf16 or f16 and back. */
static float round_to(float f, cudaDataType t)
{
    uint16_t h = t == CUDA_R_16BF ? at_cu_f32_to_bf16(f) : at_cu_f32_to_f16(f);
    return load_elem(&h, t, 0);
}

/* Input rounding of the reduced-precision compute types (tensor cores):
 * TF32 keeps 10 mantissa bits (round to nearest, ties away, as cvt.rna.tf32). */
static float round_tf32(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u = (u + 0x1000u) & 0xffffe000u;
    return __uint_as_float(u);
}

static size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
static const char *type_name(cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_8U: return "CUDA_R_8U";
    case CUDA_R_32I: return "CUDA_R_32I";
    }
    return "an unknown cudaDataType";
}

/* Checks that a rows × cols column-major matrix (leading dimension ld) of
 * each of `batch` matrices `stride` elements apart lies inside one device
 * allocation. */
static cublasStatus_t check_matrix(const char *fn, const char *name, const void *p, cudaDataType t, int64_t rows,
                                   int64_t cols, int64_t ld, int64_t stride, int64_t batch)
{
    if (!p) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s is NULL", fn, name);
    int64_t last = (cols - 1) * ld + rows - 1, lo = 0;
    if (batch > 1) {
        if (stride >= 0) last += (batch - 1) * stride;
        else lo = (batch - 1) * stride;
    }
    size_t es = type_size(t);
    const char *start = (const char *)p + lo * (int64_t)es;
    size_t bytes = (size_t)(last - lo + 1) * es;
    if (!at_emu_is_device(start, bytes))
        return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED,
                         "%s: %s (%lld x %lld, ld %lld, stride %lld, batch %lld of %s at %p) reaches outside its "
                         "device allocation (%zu bytes from %p)",
                         fn, name, (long long)rows, (long long)cols, (long long)ld, (long long)stride,
                         (long long)batch, type_name(t), p, bytes, (const void *)start);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const void *alpha, const void *A, cudaDataType At, int lda, long long sA,
                           const void *B, cudaDataType Bt, int ldb, long long sB, const void *beta, void *C,
                           cudaDataType Ct, int ldc, long long sC, int batch, cublasComputeType_t ct, int algo)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    if (!handle_ok(h)) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle %p is not live", fn, (void *)h);
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T && ta != CUBLAS_OP_C) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T && tb != CUBLAS_OP_C))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: transa %d / transb %d", fn, (int)ta, (int)tb);
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: m %d, n %d, k %d, batchCount %d (negative)", fn, m, n, k,
                         batch);
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "%s: lda %d / ldb %d / ldc %d below the rows of A (%d), B (%d), C (%d) as stored "
                         "(column-major, transa %d, transb %d)",
                         fn, lda, ldb, ldc, arows, brows, m, (int)ta, (int)tb);
    if (!(algo == -1 || (algo >= 0 && algo <= 23) || (algo >= 99 && algo <= 115)))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: algo %d", fn, algo);
    /* the type combinations cublasGemmEx documents for these compute types */
    bool ok = false;
    if (ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC)
        ok = At == Bt && ((At == CUDA_R_32F && Ct == CUDA_R_32F) ||
                          ((At == CUDA_R_16BF || At == CUDA_R_16F) && (Ct == At || Ct == CUDA_R_32F)));
    else if (ct == CUBLAS_COMPUTE_32F_FAST_16F || ct == CUBLAS_COMPUTE_32F_FAST_16BF ||
             ct == CUBLAS_COMPUTE_32F_FAST_TF32)
        ok = At == CUDA_R_32F && Bt == CUDA_R_32F && Ct == CUDA_R_32F;
    if (!ok)
        return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED,
                         "%s: A %s, B %s, C %s with compute type %d is not a supported (or emulated) combination "
                         "(A and B must have the same type; see cublasGemmEx)",
                         fn, type_name(At), type_name(Bt), type_name(Ct), (int)ct);
    if (!alpha || !beta) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is NULL", fn);
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE && (!at_emu_is_device(alpha, 4) || !at_emu_is_device(beta, 4)))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: pointer mode device but alpha/beta are not device memory",
                         fn);
    if (h->pointer_mode == CUBLAS_POINTER_MODE_HOST && (at_emu_touches_device(alpha, 4) || at_emu_touches_device(beta, 4)))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "%s: alpha/beta are device memory but the pointer mode is host (the GPU would not read them)",
                         fn);
    if (const char *why = at_emu_stream_problem(h->stream))
        return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s: the handle's stream %p %s (cublasSetStream)", fn,
                         (void *)h->stream, why);
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    float a = *(const float *)alpha, b = *(const float *)beta;
    bool reads_ab = k > 0 && a != 0.0f;
    cublasStatus_t s = check_matrix(fn, "C", C, Ct, m, n, ldc, sC, batch);
    if (s == CUBLAS_STATUS_SUCCESS && reads_ab) s = check_matrix(fn, "A", A, At, arows, ta == CUBLAS_OP_N ? k : m, lda, sA, batch);
    if (s == CUBLAS_STATUS_SUCCESS && reads_ab) s = check_matrix(fn, "B", B, Bt, brows, tb == CUBLAS_OP_N ? n : k, ldb, sB, batch);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    /* C matrices of one batch that overlap are written by several GEMMs at once */
    if (batch > 1 && (sC < 0 ? -sC : sC) < (long long)(n - 1) * ldc + m)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: strideC %lld makes the %d C matrices (%d x %d, ldc %d) overlap",
                         fn, sC, batch, m, n, ldc);
    /* reduced-precision inputs where the compute type or the math mode allows them */
    int rounding = 0; /* 1 tf32, 2 bf16, 3 f16 */
    if (ct == CUBLAS_COMPUTE_32F_FAST_TF32) rounding = 1;
    else if (ct == CUBLAS_COMPUTE_32F_FAST_16BF) rounding = 2;
    else if (ct == CUBLAS_COMPUTE_32F_FAST_16F) rounding = 3;
    else if (ct == CUBLAS_COMPUTE_32F && At == CUDA_R_32F && ((int)h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH)
        rounding = 1;
    std::vector<float> ar((size_t)m * k), br((size_t)n * k); /* op(A) rows, op(B) columns, k contiguous */
    for (int64_t bi = 0; bi < batch; bi++) {
        const char *Ab = (const char *)A + bi * sA * (int64_t)type_size(At);
        const char *Bb = (const char *)B + bi * sB * (int64_t)type_size(Bt);
        char *Cb = (char *)C + bi * sC * (int64_t)type_size(Ct);
        if (reads_ab) {
            for (int i = 0; i < m; i++)
                for (int p = 0; p < k; p++)
                    ar[(size_t)i * k + p] = load_elem(Ab, At, ta == CUBLAS_OP_N ? (size_t)p * lda + i : (size_t)i * lda + p);
            for (int j = 0; j < n; j++)
                for (int p = 0; p < k; p++)
                    br[(size_t)j * k + p] = load_elem(Bb, Bt, tb == CUBLAS_OP_N ? (size_t)j * ldb + p : (size_t)p * ldb + j);
            if (rounding)
                for (std::vector<float> *v : {&ar, &br})
                    for (float &x : *v)
                        x = rounding == 1 ? round_tf32(x) : rounding == 2 ? round_to(x, CUDA_R_16BF) : round_to(x, CUDA_R_16F);
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                if (reads_ab) {
                    /* eight partial sums, as a tiled kernel would keep, in f32 */
                    const float *x = &ar[(size_t)i * k], *y = &br[(size_t)j * k];
                    float s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    int p = 0;
                    for (; p + 8 <= k; p += 8)
                        for (int q = 0; q < 8; q++) s8[q] += x[p + q] * y[p + q];
                    for (; p < k; p++) s8[p & 7] += x[p] * y[p];
                    acc = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
                }
                size_t ci = (size_t)j * ldc + i;
                float v = a * acc;
                if (b != 0.0f) v += b * load_elem(Cb, Ct, ci); /* beta 0: C is not read (NaN stays out) */
                store_elem(Cb, Ct, ci, v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                Ctype, ldc, 0, 1, computeType, (int)algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype,
                ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, (int)algo);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc)
{
    return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0,
                beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, -1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb, long long int strideB,
                                         const float *beta, float *C, int ldc, long long int strideC,
                                         int batchCount)
{
    return gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B,
                CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount, CUBLAS_COMPUTE_32F, -1);
}
