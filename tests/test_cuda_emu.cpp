/* The CUDA emulator (src/device/cuda/emu) that the conformance suite runs
 * the CUDA backend on: its execution model (barriers, warp shuffles as CUDA
 * documents them, deadlocks and misuse reported instead of hanging), its
 * memory checks, its cuBLAS GEMM against a double-precision reference of the
 * documented column-major semantics and cuBLAS's argument validation; then
 * the backend library itself through the core's loader (name, memory, the
 * out-of-memory message).
 *
 * Built only where the emulator is (CMake), with the emulator compiled into
 * this program; the backend library has its own copy. */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "device/cuda/cuda_compat.h"

extern "C" {
#include "device/cuda/cuda_api.h"
#include "device/cuda_loader.h"
#include "device/tensor.h"
#include "testing.h"
}

/* ---- execution model ---- */

__global__ void k_block_sum(const float *x, float *out, int n)
{
    __shared__ float red[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[(int64_t)blockIdx.x * n + i];
    v = at_cu_block_sum(v, red);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

/* Every lane records the results of each kind of shuffle. */
__global__ void k_shuffles(int *out, int arg, int width)
{
    int lane = threadIdx.x % 32, t = threadIdx.x;
    out[t * 5 + 0] = __shfl_sync(0xffffffffu, lane + 100, arg, width);
    out[t * 5 + 1] = __shfl_up_sync(0xffffffffu, lane + 100, arg, width);
    out[t * 5 + 2] = __shfl_down_sync(0xffffffffu, lane + 100, arg, width);
    out[t * 5 + 3] = __shfl_xor_sync(0xffffffffu, lane + 100, arg, width);
    out[t * 5 + 4] = (int)__ballot_sync(0xffffffffu, (lane * 7 + arg) % 3 == 0);
}

/* CUDA's documented source lane (own value when the source is outside the group). */
static int want_shuffle(int kind, int lane, int arg, int width)
{
    int base = lane / width * width;
    switch (kind) {
    case 0: return base + arg % width;
    case 1: return lane % width >= arg ? lane - arg : lane;
    case 2: return lane % width + arg < width ? lane + arg : lane;
    default: return (lane ^ arg) < base + width ? lane ^ arg : lane;
    }
}

/* Threads of block b write b * 1000 + their mirror index through dynamic shared memory. */
__global__ void k_dynamic_shared(float *out)
{
    AT_DYNAMIC_SHARED(float, sm);
    sm[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = sm[blockDim.x - 1 - threadIdx.x] + 1000.0f * blockIdx.x;
}

/* __syncthreads_count / and / or, and a 2-D block's coordinates. */
__global__ void k_votes(int *out)
{
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int c = __syncthreads_count(t % 3 == 0), a = __syncthreads_and(t < 1000), o = __syncthreads_or(t == 77);
    if (t == 0) out[0] = c, out[1] = a, out[2] = o, out[3] = (int)(blockDim.x * blockDim.y);
}

/* Lanes 0-15 shuffle while lanes 16-31 have exited: CUDA leaves this undefined (it hangs). */
__global__ void k_half_warp_shuffle(int *out)
{
    if (threadIdx.x % 32 < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

/* Half a warp at __syncthreads, the other half at __syncwarp: neither can complete. */
__global__ void k_mixed_barriers(int *out)
{
    if (threadIdx.x < 16) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1;
}

__global__ void k_write_at(int *p, int index) { if (threadIdx.x == 0) p[index] = 1; }

static void test_execution(void)
{
    /* block sums over several block sizes and a grid of rows */
    const int rows = 5, n = 3000;
    std::vector<float> hx((size_t)rows * n);
    for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    float *x = NULL, *o = NULL;
    CHECK(cudaMalloc((void **)&x, hx.size() * 4) == cudaSuccess);
    CHECK(cudaMalloc((void **)&o, rows * 4) == cudaSuccess);
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    for (int threads : {32, 96, 256, 1024}) {
        AT_LAUNCH(k_block_sum, rows, threads, 0, 0, x, o, n);
        CHECK(cudaGetLastError() == cudaSuccess);
        float ho[rows];
        CHECK(cudaMemcpy(ho, o, sizeof ho, cudaMemcpyDeviceToHost) == cudaSuccess);
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += hx[(size_t)r * n + i];
            CHECK_NEAR(ho[r], s, 1e-3);
        }
    }

    /* shuffles: every kind, several offsets and group widths, two warps */
    int *io = NULL;
    CHECK(cudaMalloc((void **)&io, 64 * 5 * 4) == cudaSuccess);
    for (int width : {32, 16, 8, 4})
        for (int arg : {0, 1, 3, 5, 16}) {
            if (arg >= 32) continue;
            AT_LAUNCH(k_shuffles, 1, 64, 0, 0, io, arg, width);
            CHECK(cudaGetLastError() == cudaSuccess);
            int h[64 * 5];
            CHECK(cudaMemcpy(h, io, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
            unsigned ballot = 0;
            for (int l = 0; l < 32; l++)
                if ((l * 7 + arg) % 3 == 0) ballot |= 1u << l;
            int bad = 0;
            for (int t = 0; t < 64; t++) {
                int lane = t % 32;
                for (int kind = 0; kind < 4; kind++) bad += h[t * 5 + kind] != 100 + want_shuffle(kind, lane, arg, width);
                bad += (unsigned)h[t * 5 + 4] != ballot;
            }
            CHECK_MSG(bad == 0, "shuffles width %d arg %d: %d wrong values", width, arg, bad);
        }

    /* dynamic shared memory per block */
    float *d = NULL;
    CHECK(cudaMalloc((void **)&d, 3 * 128 * 4) == cudaSuccess);
    AT_LAUNCH(k_dynamic_shared, 3, 128, 128 * 4, 0, d);
    CHECK(cudaGetLastError() == cudaSuccess);
    float hd[3 * 128];
    CHECK(cudaMemcpy(hd, d, sizeof hd, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(hd[0] == 127.0f && hd[127] == 0.0f && hd[2 * 128 + 1] == 2126.0f);

    /* block-wide votes in a 2-D block of 40 x 5 threads */
    AT_LAUNCH(k_votes, 1, dim3(40, 5), 0, 0, io);
    CHECK(cudaGetLastError() == cudaSuccess);
    int hv[4];
    CHECK(cudaMemcpy(hv, io, sizeof hv, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(hv[0] == 67 && hv[1] == 1 && hv[2] == 1 && hv[3] == 200);

    /* misuse fails the launch with a description instead of hanging */
    AT_LAUNCH(k_half_warp_shuffle, 2, 64, 0, 0, io);
    cudaError_t e = cudaGetLastError();
    CHECK(e == cudaErrorLaunchFailure && strstr(at_emu_error_detail(e), "deadlock"));
    AT_LAUNCH(k_mixed_barriers, 1, 64, 0, 0, io);
    e = cudaGetLastError();
    CHECK(e == cudaErrorLaunchFailure && strstr(at_emu_error_detail(e), "deadlock"));
    AT_LAUNCH(k_shuffles, 1, 48, 0, 0, io, 1, 32);
    e = cudaGetLastError();
    CHECK(e == cudaErrorLaunchFailure && strstr(at_emu_error_detail(e), "partial warp"));
    AT_LAUNCH(k_block_sum, 1, 2048, 0, 0, x, o, n);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    AT_LAUNCH(k_dynamic_shared, 1, 32, 64 * 1024, 0, d); /* over 48 KiB without cudaFuncSetAttribute */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    AT_LAUNCH(k_write_at, 1, 32, 0, 0, io, 64 * 5); /* one past the end */
    e = cudaGetLastError();
    CHECK(e == cudaErrorIllegalAddress && strstr(at_emu_error_detail(e), "past the end"));
    AT_LAUNCH(k_write_at, 1, 32, 0, 0, io, -3); /* before the start */
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    /* and the emulator recovers: the same sums again */
    AT_LAUNCH(k_block_sum, rows, 256, 0, 0, x, o, n);
    CHECK(cudaGetLastError() == cudaSuccess);

    /* copies check their device ranges and directions */
    char host[64];
    CHECK(cudaMemcpy(io, host, 64 * 5 * 4 + 1, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host, io, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* kinds swapped */
    CHECK(cudaMemcpy(host, io, 16, cudaMemcpyDefault) == cudaSuccess);
    CHECK(cudaFree(host) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    cudaStream_t s = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    /* while a non-blocking stream lives, work on the default stream is not ordered with its work */
    AT_LAUNCH(k_write_at, 1, 32, 0, s, io, 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    AT_LAUNCH(k_write_at, 1, 32, 0, 0, io, 0);
    e = cudaGetLastError();
    CHECK(e == cudaErrorInvalidResourceHandle && strstr(at_emu_error_detail(e), "not ordered"));
    CHECK(cudaMemcpy(host, io, 16, cudaMemcpyDeviceToHost) == cudaErrorInvalidResourceHandle);
    CHECK(cudaMemcpyAsync(host, io, 16, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    AT_LAUNCH(k_write_at, 1, 32, 0, s, io, 0); /* a destroyed stream */
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);

    /* ANYTUNE_CUDA_EMU_MEMORY (set by main) caps the device */
    size_t fr = 0, total = 0;
    CHECK(cudaMemGetInfo(&fr, &total) == cudaSuccess);
    CHECK(total == (size_t)64 << 20 && fr < total);
    void *big = NULL;
    CHECK(cudaMalloc(&big, (size_t)65 << 20) == cudaErrorMemoryAllocation && big == NULL);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    cudaFree(x), cudaFree(o), cudaFree(io), cudaFree(d);
}

/* ---- cuBLAS ---- */

static float rnd_float(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) % 2001) / 1000.0f - 1.0f;
}

/* Column-major C = alpha op(A) op(B) + beta C in double, for batch `bi`. */
static double ref_elem(const std::vector<float> &A, const std::vector<float> &B, int ta, int tb, int k, int lda,
                       int ldb, long long sA, long long sB, int bi, int i, int j)
{
    double s = 0;
    for (int p = 0; p < k; p++) {
        double a = ta ? A[bi * sA + (size_t)i * lda + p] : A[bi * sA + (size_t)p * lda + i];
        double b = tb ? B[bi * sB + (size_t)p * ldb + j] : B[bi * sB + (size_t)j * ldb + p];
        s += a * b;
    }
    return s;
}

static float to_type_and_back(float v, cudaDataType t)
{
    if (t == CUDA_R_16BF) return at_cu_bf16_to_f32(at_cu_f32_to_bf16(v));
    if (t == CUDA_R_16F) return at_cu_f16_to_f32(at_cu_f32_to_f16(v));
    return v;
}

static void put(void *p, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == CUDA_R_16BF ? at_cu_f32_to_bf16(v) : at_cu_f32_to_f16(v);
}

static float get(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? at_cu_bf16_to_f32(h) : at_cu_f16_to_f32(h);
}

static size_t tsize(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* One (strided batched) GEMM against the reference: padded leading
 * dimensions, gaps between batches, beta 0 over NaN, C rounded to its type. */
static void gemm_case(cublasHandle_t h, cudaDataType ab, cudaDataType ct, int ta, int tb, int m, int n, int k,
                      int batch, float alpha, float beta)
{
    uint64_t seed = (uint64_t)(m * 131 + n * 17 + k * 7 + ta * 3 + tb + batch * 1009);
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = arows + 3, ldb = brows + 1, ldc = m + 2;
    long long sA = (long long)lda * acols + 5, sB = (long long)ldb * bcols + 7, sC = (long long)ldc * n + 1;
    std::vector<float> A(sA * batch), B(sB * batch), C(sC * batch);
    std::vector<char> hA(A.size() * tsize(ab)), hB(B.size() * tsize(ab)), hC(C.size() * tsize(ct));
    for (size_t i = 0; i < A.size(); i++) put(hA.data(), ab, i, rnd_float(&seed)), A[i] = get(hA.data(), ab, i);
    for (size_t i = 0; i < B.size(); i++) put(hB.data(), ab, i, rnd_float(&seed)), B[i] = get(hB.data(), ab, i);
    for (size_t i = 0; i < C.size(); i++) put(hC.data(), ct, i, beta == 0 ? NAN : rnd_float(&seed)), C[i] = get(hC.data(), ct, i);
    void *dA, *dB, *dC;
    cudaMalloc(&dA, hA.size()), cudaMalloc(&dB, hB.size()), cudaMalloc(&dC, hC.size());
    cudaMemcpy(dA, hA.data(), hA.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB.data(), hB.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dC, hC.data(), hC.size(), cudaMemcpyHostToDevice);
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st =
        batch == 1 ? cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA, ab, lda, dB, ab, ldb, &beta, dC, ct, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                   : cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, dA, ab, lda, sA, dB, ab, ldb, sB, &beta,
                                                dC, ct, ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "gemm %dx%dx%d: %s %s", m, n, k, cublasGetStatusName(st),
              at_emu_blas_error_detail(st));
    std::vector<char> got(hC.size());
    cudaMemcpy(got.data(), dC, got.size(), cudaMemcpyDeviceToHost);
    double worst = 0;
    int untouched_bad = 0;
    for (int bi = 0; bi < batch; bi++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < ldc; i++) {
                size_t ci = bi * sC + (size_t)j * ldc + i;
                float g = get(got.data(), ct, ci);
                if (i >= m) { /* padding rows: never written */
                    untouched_bad += !(g == C[ci] || (isnan(g) && isnan(C[ci])));
                    continue;
                }
                double want = alpha * ref_elem(A, B, ta, tb, k, lda, ldb, sA, sB, bi, i, j) +
                              (beta != 0 ? beta * (double)C[ci] : 0.0);
                /* f32 accumulation error, plus rounding of the output to its type */
                double tol = 1e-5 * (k + 1) + fabs(want - to_type_and_back((float)want, ct)) * 1.01;
                double err = fabs(g - want) - tol;
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
    CHECK_MSG(worst <= 0 && untouched_bad == 0, "gemm %s->%s ta%d tb%d %dx%dx%d batch %d: error over tol %g, %d padding changed",
              ab == CUDA_R_32F ? "f32" : ab == CUDA_R_16BF ? "bf16" : "f16", ct == CUDA_R_32F ? "f32" : "16", ta, tb,
              m, n, k, batch, worst, untouched_bad);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
}

static void test_cublas(void)
{
    cublasHandle_t h = NULL;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const cudaDataType combos[][2] = {{CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF},
                                      {CUDA_R_16F, CUDA_R_16F}};
    for (auto &c : combos)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case(h, c[0], c[1], ta, tb, 7, 5, 19, 1, 1.0f, 0.0f);
                gemm_case(h, c[0], c[1], ta, tb, 1, 13, 3, 3, -0.5f, 1.5f);
                gemm_case(h, c[0], c[1], ta, tb, 9, 1, 1, 2, 2.0f, 0.0f);
            }
    gemm_case(h, CUDA_R_32F, CUDA_R_32F, 0, 0, 4, 3, 0, 1, 1.0f, 0.5f); /* k = 0: C = beta C */

    /* argument validation as cuBLAS documents it */
    void *dA, *dC;
    cudaMalloc(&dA, 64 * 64 * 4), cudaMalloc(&dC, 64 * 64 * 4);
    float one = 1.0f, zero = 0.0f;
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_32F, 7, dA, CUDA_R_32F, 8, &zero, dC,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE); /* lda < m */
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 8, 8, 4, &one, dA, CUDA_R_32F, 4, dA, CUDA_R_32F, 3, &zero, dC,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE); /* ldb < k */
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_32F, 8, dA, CUDA_R_32F, 8, &zero, dC,
                       CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE); /* ldc < m */
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 8, 8, &one, dA, CUDA_R_32F, 8, dA, CUDA_R_32F, 8, &zero, dC,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_16BF, 8, dA, CUDA_R_32F, 8, &zero, dC,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED); /* mixed A, B */
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_16BF, 8, dA, CUDA_R_16BF, 8, &zero, dC,
                       CUDA_R_16F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_16BF, 8, dA, CUDA_R_16BF, 8, &zero, dC,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    /* a mapping that reads past the end of A */
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 65, &one, dA, CUDA_R_32F, 64, dA,
                                     CUDA_R_32F, 65, &zero, dC, CUDA_R_32F, 64, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_EXECUTION_FAILED && strstr(at_emu_blas_error_detail(st), "outside"));
    /* batched C matrices that overlap */
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dA, CUDA_R_32F, 8, 64, dA,
                                     CUDA_R_32F, 8, 64, &zero, dC, CUDA_R_32F, 8, 32, 2, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    /* TF32 inputs when the math mode allows them: 1 + 2^-12 rounds to 1 */
    float a1[1] = {1.0f + 0x1p-12f}, r = 0;
    cudaMemcpy(dA, a1, 4, cudaMemcpyHostToDevice);
    CHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, CUDA_R_32F, 1, dA, CUDA_R_32F, 1, &zero, dC,
                 CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(&r, dC, 4, cudaMemcpyDeviceToHost);
    CHECK(r == 1.0f);
    CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, CUDA_R_32F, 1, dA, CUDA_R_32F, 1, &zero, dC,
                 CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(&r, dC, 4, cudaMemcpyDeviceToHost);
    CHECK(r == a1[0] * a1[0]);
    cudaFree(dA), cudaFree(dC);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_NOT_INITIALIZED);
}

/* ---- the backend library through the core's loader ---- */

static void test_backend(void)
{
    at_backend *be = NULL;
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &be));
    if (!be) return;
    CHECK(strcmp(be->name, "cuda-emu:0") == 0);
    CHECK(be->kind == AT_DEVICE_CUDA && !be->is_host && be->fast_bf16);
    for (int i = 0; i < AT_BACKEND_OP_COUNT; i++) CHECK_MSG(((void **)&be->ops)[i] != NULL, "op %s", at_backend_op_name(i));
    at_backend *again = NULL;
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &again));
    CHECK(again == be);
    CHECK_FAILS(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 1, &again), AT_ERR_NOT_FOUND);
    /* a host table of another interface version is refused, not read */
    void *lib = dlopen(AT_CUDA_EMU_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    at_cuda_open_fn open_fn = lib ? (at_cuda_open_fn)dlsym(lib, AT_CUDA_OPEN_SYMBOL) : NULL;
    CHECK(open_fn != NULL);
    if (open_fn) {
        at_cuda_host_api other = {};
        other.version = AT_CUDA_API_VERSION + 1;
        CHECK(open_fn(&other, 0, &again) == AT_ERR_UNSUPPORTED && again == NULL);
        CHECK(open_fn(NULL, 0, &again) == AT_ERR_UNSUPPORTED);
    }

    /* round trip through device memory */
    int64_t shape[1] = {1000};
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_new(be, AT_F32, 1, shape, "t", &t));
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (float)i * 0.5f;
    if (t) {
        CHECK_OK(at_tensor_upload(t, in, sizeof in));
        memset(out, 0, sizeof out);
        CHECK_OK(at_tensor_download(t, out, sizeof out));
        CHECK(memcmp(in, out, sizeof in) == 0);
        CHECK_OK(be->synchronize(be));
    }
    at_tensor_free(t);

    /* out of memory: AT_ERR_DEVICE_OOM with the numbers and what to change */
    int64_t huge[2] = {1 << 20, 100}; /* 400 MiB over the 64 MiB device */
    at_tensor *h = NULL;
    at_status st = at_tensor_new(be, AT_F32, 2, huge, "huge", &h);
    CHECK(st == AT_ERR_DEVICE_OOM && h == NULL);
    const char *msg = at_last_error();
    CHECK_MSG(strstr(msg, "419430400 bytes") && strstr(msg, "free") && strstr(msg, "--per_device_train_batch_size") &&
                  strstr(msg, "qlora"),
              "%s", msg);
    /* the failed allocation leaves nothing behind for the next launch to report */
    CHECK_OK(at_tensor_new(be, AT_F32, 1, shape, "t", &t));
    at_tensor_free(t);
}

int main(void)
{
    setenv("ANYTUNE_CUDA_EMU_MEMORY", "64M", 1);
    test_execution();
    test_cublas();
    test_backend();
    return at_test_result("test_cuda_emu");
}
