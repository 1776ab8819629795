/* The CUDA emulator (src/device/cuda/emu) that the conformance suite runs
 * the CUDA backend on: its execution model (barriers, warp shuffles as CUDA
 * documents them, deadlocks and misuse reported instead of hanging), its
 * memory checks, its cuBLAS GEMM against a double-precision reference of the
 * documented column-major semantics and cuBLAS's argument validation, its
 * WMMA (tensor core) tiles against a double-precision product (layouts,
 * padded ldm, misuse); then the backend library itself through the core's
 * loader (name, memory, the out-of-memory message) and its tensor-core
 * attention (bf16 / f16, head_dim 64..256, masks) against device/ref, next
 * to the scalar kernels' errors.
 *
 * Built only where the emulator is (CMake), with the emulator compiled into
 * this program; the backend library has its own copy. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "device/cuda/cuda_compat.h"

extern "C" {
#include "device/cuda/cuda_api.h"
#include "device/cpu/cpu_backend.h"
#include "device/cuda_loader.h"
#include "device/dtype.h"
#include "device/ref/ref_ops.h"
#include "device/tensor.h"
#include "ops/ops.h"
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

/* ---- WMMA (tensor core) emulation ---- */

using namespace nvcuda;

/* Each warp w: D = 2·(A·B + C) on its own matrices (offset w·stride), with
 * the given layouts; the doubling is the elementwise access kernels may make. */
template <class T, class LA, class LB>
__global__ void k_wmma(const T *a, const T *b, const float *c, float *d, unsigned lda, unsigned ldb, unsigned ldc,
                       int ccol, int dcol, int stride16, int stride32)
{
    int w = threadIdx.x / 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a + w * stride16, lda);
    wmma::load_matrix_sync(fb, b + w * stride16, ldb);
    wmma::load_matrix_sync(fc, c + w * stride32, ldc, ccol ? wmma::mem_col_major : wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= 2.0f;
    wmma::store_matrix_sync(d + w * stride32, fc, ldc, dcol ? wmma::mem_col_major : wmma::mem_row_major);
}

/* Misuse: mode 0 lanes pass different pointers, 1 a misaligned pointer, 2 an
 * ldm that is not a multiple of 16 bytes, 3 half the warp reaches mma_sync. */
__global__ void k_wmma_misuse(const __nv_bfloat16 *a, int mode)
{
    int lane = threadIdx.x % 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    if (mode == 0) wmma::load_matrix_sync(fa, a + (lane < 16 ? 0 : 16), 32);
    if (mode == 1) wmma::load_matrix_sync(fa, a + 1, 32);
    if (mode == 2) wmma::load_matrix_sync(fa, a, 20);
    if (mode == 3) {
        wmma::load_matrix_sync(fa, a, 32);
        wmma::load_matrix_sync(fb, a, 32);
        if (lane < 16) wmma::mma_sync(fc, fa, fb, fc);
    }
}

template <class T> static float rt16(float v) { return (float)T(v); } /* rounded to T */

template <class T, class LA, class LB> static void wmma_case(const char *name)
{
    const int acol = std::is_same<LA, wmma::col_major>::value, bcol = std::is_same<LB, wmma::col_major>::value;
    const unsigned lda = 24, ldb = 40, ldc = 20; /* padded leading dimensions */
    const int s16 = 16 * 40, s32 = 16 * 20, warps = 2;
    std::vector<T> ha((size_t)warps * s16), hb((size_t)warps * s16);
    std::vector<float> hc((size_t)warps * s32), hd((size_t)warps * s32);
    uint64_t seed = 12345;
    for (auto &x : ha) x = T(rnd_float(&seed));
    for (auto &x : hb) x = T(rnd_float(&seed) * 4.0f);
    for (auto &x : hc) x = rnd_float(&seed);
    T *a, *b;
    float *c, *d;
    cudaMalloc((void **)&a, ha.size() * sizeof(T)), cudaMalloc((void **)&b, hb.size() * sizeof(T));
    cudaMalloc((void **)&c, hc.size() * 4), cudaMalloc((void **)&d, hd.size() * 4);
    cudaMemcpy(a, ha.data(), ha.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(c, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice);
    for (int ccol = 0; ccol < 2; ccol++)
        for (int dcol = 0; dcol < 2; dcol++) {
            cudaMemset(d, 0xff, hd.size() * 4);
            AT_LAUNCH((k_wmma<T, LA, LB>), 1, 32 * warps, 0, 0, a, b, c, d, lda, ldb, ldc, ccol, dcol, s16, s32);
            cudaError_t e = cudaGetLastError();
            CHECK_MSG(e == cudaSuccess, "wmma %s: %s", name, at_emu_error_detail(e));
            cudaMemcpy(hd.data(), d, hd.size() * 4, cudaMemcpyDeviceToHost);
            double worst = 0;
            int pad_bad = 0;
            for (int w = 0; w < warps; w++) {
                const T *A = ha.data() + w * s16, *B = hb.data() + w * s16;
                const float *C = hc.data() + w * s32, *Dv = hd.data() + w * s32;
                for (int r = 0; r < 16; r++)
                    for (int n = 0; n < 16; n++) {
                        double s = ccol ? C[n * ldc + r] : C[r * ldc + n];
                        for (int k = 0; k < 16; k++)
                            s += (double)(float)(acol ? A[k * lda + r] : A[r * lda + k]) *
                                 (double)(float)(bcol ? B[n * ldb + k] : B[k * ldb + n]);
                        double got = dcol ? Dv[n * ldc + r] : Dv[r * ldc + n];
                        double err = fabs(got - 2 * s);
                        if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
                    }
                for (int r = 0; r < 16; r++) /* ldm padding: never written */
                    for (int p = 16; p < (int)ldc; p++) pad_bad += !isnan(Dv[r * ldc + p]);
            }
            CHECK_MSG(worst <= 1e-5 && pad_bad == 0, "wmma %s c%s d%s: error %g, %d padding elements written", name,
                      ccol ? "col" : "row", dcol ? "col" : "row", worst, pad_bad);
        }
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(d);
}

static void test_wmma(void)
{
    /* the 16-bit types convert as device/dtype.h: round to nearest even */
    CHECK(__bfloat16_as_ushort(__float2bfloat16(1.0f + 0x1p-8f)) == 0x3f80);             /* tie to even */
    CHECK(__bfloat16_as_ushort(__float2bfloat16(1.0f + 0x1p-8f + 0x1p-12f)) == 0x3f81);  /* above the tie */
    CHECK(__bfloat162float(__ushort_as_bfloat16(0xc040)) == -3.0f);
    CHECK(__half_as_ushort(__float2half(65504.0f)) == 0x7bff && __half_as_ushort(__float2half(1e6f)) == 0x7c00);
    CHECK(__half2float(__float2half(0x1p-24f)) == 0x1p-24f); /* smallest subnormal */
    CHECK(__half2float(__ushort_as_half(0x3c01)) == 1.0f + 0x1p-10f);

    wmma_case<__nv_bfloat16, wmma::row_major, wmma::row_major>("bf16 a row b row");
    wmma_case<__nv_bfloat16, wmma::row_major, wmma::col_major>("bf16 a row b col");
    wmma_case<__nv_bfloat16, wmma::col_major, wmma::row_major>("bf16 a col b row");
    wmma_case<__nv_bfloat16, wmma::col_major, wmma::col_major>("bf16 a col b col");
    wmma_case<__half, wmma::row_major, wmma::col_major>("f16 a row b col");
    wmma_case<__half, wmma::col_major, wmma::row_major>("f16 a col b row");

    /* misuse fails the launch with a description */
    __nv_bfloat16 *a;
    cudaMalloc((void **)&a, 64 * 32 * 2);
    cudaMemset(a, 0, 64 * 32 * 2);
    const char *want[] = {"different pointers", "aligned", "ldm", "deadlock"};
    for (int mode = 0; mode < 4; mode++) {
        AT_LAUNCH(k_wmma_misuse, 1, 64, 0, 0, a, mode);
        cudaError_t e = cudaGetLastError();
        CHECK_MSG(e == cudaErrorLaunchFailure && strstr(at_emu_error_detail(e), want[mode]), "misuse %d: %s", mode,
                  at_emu_error_detail(e));
    }
    AT_LAUNCH(k_wmma_misuse, 1, 48, 0, 0, a, 3); /* a partial warp */
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    cudaFree(a);
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

/* ---- tensor-core attention of the backend against the reference ---- */

typedef struct {
    const char *name;
    at_dtype dt;
    int64_t B, Tq, Tk, Hq, Hkv, D;
    int q_index, kv_len, segments;
} tc_case;

static at_tensor *att_tensor(at_backend *be, at_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, const char *n)
{
    int64_t sh[4] = {a, b, c, d};
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_new(be, dt, d ? 4 : b ? 2 : 1, sh, n, &t));
    return t;
}

/* Host tensor (dtype dt) of random values in [lo, hi) and its device copy. */
static void att_rand(at_backend *be, at_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, const char *n,
                     float lo, float hi, uint64_t *seed, at_tensor **h, at_tensor **dv)
{
    *h = att_tensor(at_cpu_backend(), dt, a, b, c, d, n);
    *dv = att_tensor(be, dt, a, b, c, d, n);
    if (!*h || !*dv) return;
    int64_t ne = a * b * c * d;
    uint16_t *p = (uint16_t *)at_tensor_data(*h);
    for (int64_t i = 0; i < ne; i++) {
        float v = lo + (hi - lo) * (rnd_float(seed) + 1.0f) * 0.5f;
        p[i] = dt == AT_BF16 ? at_f32_to_bf16(v) : at_f32_to_f16(v);
    }
    CHECK_OK(at_tensor_upload(*dv, p, at_tensor_nbytes(*h)));
}

/* max |device − reference| / max |reference| (the conformance measure; inf where the device has a NaN). */
static double att_err(const at_tensor *dev, const at_tensor *ref)
{
    int64_t n = at_tensor_numel(ref);
    std::vector<uint16_t> raw((size_t)n * 2);
    CHECK_OK(at_tensor_download(dev, raw.data(), at_tensor_nbytes(dev)));
    const float *r = (const float *)at_tensor_data(ref);
    double worst = 0, big = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double g = dev->dtype == AT_F32    ? ((const float *)raw.data())[i]
                   : dev->dtype == AT_BF16 ? at_bf16_to_f32(raw[i])
                                           : at_f16_to_f32(raw[i]);
        if (isinf(r[i]) && g == r[i]) continue; /* lse −inf of a query that sees nothing */
        double e = fabs(g - r[i]);
        if (!(e <= worst)) worst = isnan(e) || isinf(e) ? INFINITY : e;
        if (isfinite(r[i]) && fabs(r[i]) > big) big = fabs(r[i]);
    }
    return worst / big;
}

/* One case, forward and backward, on the tensor-core kernels (scalar = 0) or
 * the scalar ones; errors[5]: out, lse, dq, dk, dv. */
static void tc_attention_case(at_backend *be, const tc_case *c, int scalar, double *errors)
{
    if (scalar) setenv("ANYTUNE_CUDA_ATTENTION_SCALAR", "1", 1);
    else unsetenv("ANYTUNE_CUDA_ATTENTION_SCALAR");
    uint64_t seed = (uint64_t)(c->D * 7919 + c->Tq * 31 + c->Tk);
    at_tensor *qh, *qd, *kh, *kd, *vh, *vd, *doh, *dod;
    att_rand(be, c->dt, c->B, c->Tq, c->Hq, c->D, "q", -2, 2, &seed, &qh, &qd);
    att_rand(be, c->dt, c->B, c->Tk, c->Hkv, c->D, "k", -2, 2, &seed, &kh, &kd);
    att_rand(be, c->dt, c->B, c->Tk, c->Hkv, c->D, "v", -1, 1, &seed, &vh, &vd);
    att_rand(be, c->dt, c->B, c->Tq, c->Hq, c->D, "dout", -1, 1, &seed, &doh, &dod);
    at_attn_params ph = {}, pd = {};
    ph.scale = pd.scale = (float)(1.0 / sqrt((double)c->D));
    at_tensor *ih[3] = {NULL, NULL, NULL}, *id[3] = {NULL, NULL, NULL};
    const char *names[3] = {"q_index", "kv_len", "segments"};
    const int want[3] = {c->q_index, c->kv_len, c->segments};
    at_attn_params *pp[2] = {&ph, &pd};
    for (int i = 0; i < 3; i++) {
        if (!want[i]) continue;
        std::vector<int32_t> v;
        int64_t s0 = c->B, s1 = i == 0 ? c->Tq : i == 2 ? c->Tk : 0;
        if (i == 0) { /* limits anywhere, one query (the second) that sees nothing */
            v.resize((size_t)(c->B * c->Tq));
            for (size_t j = 0; j < v.size(); j++) v[j] = j == 1 ? -1 : (int32_t)((j * 2654435761u) % c->Tk);
        } else if (i == 1) { /* trailing padding */
            v.resize((size_t)c->B);
            for (int64_t b = 0; b < c->B; b++) v[b] = (int32_t)(c->Tk - 3 - 17 * b);
        } else { /* packed samples of 1..40 tokens */
            v.resize((size_t)(c->B * c->Tk));
            for (int64_t b = 0; b < c->B; b++) {
                int sid = 0, left = 7;
                for (int64_t t = 0; t < c->Tk; t++) {
                    if (left-- == 0) sid++, left = (int)((t * 7 + b) % 40);
                    v[b * c->Tk + t] = sid;
                }
            }
        }
        ih[i] = att_tensor(at_cpu_backend(), AT_I32, s0, s1, 0, 0, names[i]);
        id[i] = att_tensor(be, AT_I32, s0, s1, 0, 0, names[i]);
        if (!ih[i] || !id[i]) continue;
        memcpy(at_tensor_data(ih[i]), v.data(), v.size() * 4);
        CHECK_OK(at_tensor_upload(id[i], v.data(), v.size() * 4));
        for (int j = 0; j < 2; j++) {
            const at_tensor *t = j == 0 ? ih[i] : id[i];
            if (i == 0) pp[j]->q_index = t;
            else if (i == 1) pp[j]->kv_len = t;
            else pp[j]->segments = t;
        }
    }
    int64_t nl = c->B * c->Hq * c->Tq;
    /* forward: reference in f32; the device writes the 16-bit dtype */
    at_tensor *oref = att_tensor(at_cpu_backend(), AT_F32, c->B, c->Tq, c->Hq, c->D, "out");
    at_tensor *lref = att_tensor(at_cpu_backend(), AT_F32, nl, 0, 0, 0, "lse");
    at_tensor *od = att_tensor(be, c->dt, c->B, c->Tq, c->Hq, c->D, "out");
    at_tensor *ld = att_tensor(be, AT_F32, nl, 0, 0, 0, "lse");
    CHECK_OK(at_ref_attention_forward(oref, lref, qh, kh, vh, &ph));
    CHECK_OK(at_attention_forward(od, ld, qd, kd, vd, &pd));
    errors[0] = att_err(od, oref);
    errors[1] = att_err(ld, lref);
    /* backward from the reference's out (in the 16-bit dtype) and lse */
    at_tensor *o16 = att_tensor(at_cpu_backend(), c->dt, c->B, c->Tq, c->Hq, c->D, "out");
    CHECK_OK(at_ref_attention_forward(o16, lref, qh, kh, vh, &ph));
    CHECK_OK(at_tensor_upload(od, at_tensor_data(o16), at_tensor_nbytes(o16)));
    CHECK_OK(at_tensor_upload(ld, at_tensor_data(lref), at_tensor_nbytes(lref)));
    at_tensor *g[3], *gd[3];
    const int64_t *shq = qh->shape, *shk = kh->shape;
    for (int i = 0; i < 3; i++) {
        const int64_t *s = i == 0 ? shq : shk;
        g[i] = att_tensor(at_cpu_backend(), AT_F32, s[0], s[1], s[2], s[3], i == 0 ? "dq" : i == 1 ? "dk" : "dv");
        gd[i] = att_tensor(be, c->dt, s[0], s[1], s[2], s[3], i == 0 ? "dq" : i == 1 ? "dk" : "dv");
    }
    CHECK_OK(at_ref_attention_backward(g[0], g[1], g[2], doh, qh, kh, vh, o16, lref, &ph));
    CHECK_OK(at_attention_backward(gd[0], gd[1], gd[2], dod, qd, kd, vd, od, ld, &pd));
    for (int i = 0; i < 3; i++) errors[2 + i] = att_err(gd[i], g[i]);
    at_tensor *all[] = {qh, qd, kh, kd, vh, vd, doh, dod, oref, lref, od, ld, o16, g[0], g[1], g[2], gd[0], gd[1],
                        gd[2], ih[0], ih[1], ih[2], id[0], id[1], id[2]};
    for (at_tensor *t : all) at_tensor_free(t);
    unsetenv("ANYTUNE_CUDA_ATTENTION_SCALAR");
}

static void test_tc_attention(void)
{
    at_backend *be = NULL;
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &be));
    if (!be) return;
    static const tc_case cases[] = {
        {"bf16 D64 GQA causal", AT_BF16, 2, 130, 130, 4, 2, 64, 0, 0, 0},
        {"bf16 D128 segments+kv_len", AT_BF16, 2, 100, 100, 2, 1, 128, 0, 1, 1},
        {"bf16 D128 q_index+kv_len Tq<Tk", AT_BF16, 2, 7, 90, 2, 2, 128, 1, 1, 0},
        {"bf16 D64 chunk Tq<Tk", AT_BF16, 1, 20, 75, 2, 1, 64, 0, 0, 0},
        {"bf16 D256", AT_BF16, 1, 40, 40, 2, 1, 256, 0, 0, 0},
        {"f16 D80 (5 fragments)", AT_F16, 1, 50, 50, 2, 2, 80, 0, 0, 0},
        {"f16 D128 segments", AT_F16, 1, 70, 70, 2, 1, 128, 0, 0, 1},
    };
    const char *what[5] = {"out", "lse", "dq", "dk", "dv"};
    for (const tc_case &c : cases) {
        double tc[5], sc[5];
        tc_attention_case(be, &c, 0, tc);
        tc_attention_case(be, &c, 1, sc);
        double tol = c.dt == AT_BF16 ? 1e-2 : 2e-3;
        printf("  attention %-32s tensor cores: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e | scalar: out %.2e dq %.2e "
               "dk %.2e dv %.2e\n",
               c.name, tc[0], tc[1], tc[2], tc[3], tc[4], sc[0], sc[2], sc[3], sc[4]);
        CHECK_MSG(memcmp(tc, sc, sizeof tc) != 0, "%s: the same errors both ways: tensor-core path not taken?",
                  c.name);
        for (int i = 0; i < 5; i++) {
            double t = i == 1 ? 1e-5 : tol; /* lse is f32 */
            CHECK_MSG(tc[i] <= t, "%s: %s error %g over %g (tensor cores)", c.name, what[i], tc[i], t);
            CHECK_MSG(sc[i] <= t, "%s: %s error %g over %g (scalar)", c.name, what[i], sc[i], t);
        }
    }
}

int main(void)
{
    setenv("ANYTUNE_CUDA_EMU_MEMORY", "64M", 1);
    test_execution();
    test_cublas();
    test_wmma();
    test_backend();
    test_tc_attention();
    return at_test_result("test_cuda_emu");
}
