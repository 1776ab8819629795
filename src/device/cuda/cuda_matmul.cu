/* Matmul on the GPU: cuBLAS for plain operands, tile-wise dequantization for
 * quantized weights (ops.h at_matmul; the CPU model is cpu_matmul.c and
 * cpu_qmatmul.c).
 *
 *   C = alpha · op(A) · op(B) + beta · C      (row-major, batch over the leading dims)
 *
 * cuBLAS is column-major. A row-major [R, S] matrix is the column-major
 * [S, R] matrix, its transpose, so C = op(A)·op(B) becomes
 *   Cᵀ = op(B)ᵀ · op(A)ᵀ
 * with B as cuBLAS's first operand (m = N, lda = B's row length, transposed
 * when trans_b) and A as its second (n = M, ldb = A's row length, transposed
 * when trans_a); ldc = N. B broadcast over the batch is stride 0. When B is
 * shared and A is not transposed the batch is stacked into M (one GEMM, as
 * the CPU does).
 *
 * Compute format (ops.h): bf16 when either input is bf16 (the other rounded
 * to bf16 first, by a cast into scratch), f32 accumulation; otherwise f32,
 * f16 inputs widened exactly (a cast to f32), or both f16 handed to cuBLAS as
 * they are with f32 compute (the products of two f16 values are exact in
 * f32, so that is the same thing). TF32 tensor cores only when the context
 * allows them (ANYTUNE_ALLOW_TF32). cuBLAS has no f32·f32 -> bf16 GEMM, so a
 * bf16 C with f32 compute goes through an f32 temporary: T = alpha·op(A)op(B),
 * then C = bf16(T + beta·C), the CPU's order of operations.
 *
 * Quantized B (q8_0, q4_0, nf4; layouts in device/quant.h), a matrix W
 * [out, in]:
 *   x · Wᵀ (trans_b 1): a tile of W's rows [r0, r0+R) is dequantized into
 *     scratch and gives C's columns [r0, r0+R) (one GEMM with ldc = out);
 *   dy · W (trans_b 0): a tile of W's columns [c0, c0+CW) (all rows) gives
 *     C's columns [c0, c0+CW). Slicing columns rather than k keeps every
 *     element of C one GEMM (no partial sums rounded through a bf16 C, the
 *     caller's beta applied once).
 * Tiles are bounded (QTILE_BYTES), so the weight is never dequantized whole
 * when it is larger. The dequantized values are those of device/quant.c, bit
 * for bit: the same formulas in the same f32 operations (the NF4 scale is a
 * product then a sum, kept apart from an FMA with __fmul_rn), rounded to bf16
 * when A is bf16.
 *
 * x · Wᵀ with at most QG_MAX_ROWS rows of x (decoding) skips the tile: the
 * fused GEMV of cuda_qgemv.cu reads each weight byte once instead. */
#include <limits.h>
#include <math.h>
#include "device/cuda/cuda_internal.h"

#define MM_THREADS 256
#ifndef QTILE_BYTES /* (a test build sets a small one to exercise the tiling) */
#define QTILE_BYTES ((size_t)64 << 20) /* most scratch a dequantized tile takes */
#endif

static unsigned mm_grid(const cuda_ctx *c, int64_t n) { return cu_grid(c, n, MM_THREADS); }

/* ---- small kernels ---- */

/* dst (f32 or bf16, dtype code td) = src (dtype ts) converted, n elements. */
static __global__ void k_mm_convert(void *dst, int td, const void *src, int ts, int64_t n)
{
    CU_GRID_STRIDE(i, n) at_cu_store(dst, td, i, at_cu_load(src, ts, i));
}

/* C = beta · C, or 0 when beta == 0 (nothing to multiply: K == 0 or alpha == 0). */
static __global__ void k_mm_scale_c(void *c, int tc, float beta, int64_t n)
{
    CU_GRID_STRIDE(i, n) at_cu_store(c, tc, i, beta == 0.0f ? 0.0f : beta * at_cu_load(c, tc, i));
}

/* C (bf16) = bf16(T + beta · C), T = alpha·op(A)op(B) in f32 (beta == 0 ignores C). */
static __global__ void k_mm_epilogue(void *c, int tc, const float *t, float beta, int64_t n)
{
    CU_GRID_STRIDE(i, n)
    {
        float v = t[i];
        if (beta != 0.0f) v += beta * at_cu_load(c, tc, i);
        at_cu_store(c, tc, i, v);
    }
}

/* ---- dequantization of a tile of W [rows, cols] ----
 * tile[r][c] (row length cw, dtype td: f32 or bf16) = W[r0 + r][c0 + c] for
 * r < nr, c < cw. A block per tile row at a time, its threads along the row:
 * consecutive threads read consecutive bytes (or nibbles) and write
 * consecutive values (coalesced), with no division per value. */

#define DEQ_ROWS(r) for (int64_t r = blockIdx.x; r < nr; r += gridDim.x)
#define DEQ_COLS(c) for (int64_t c = threadIdx.x; c < cw; c += blockDim.x)

/* q8_0 (Q4 0: 34-byte blocks, an f16 scale d then 32 int8 q) and q4_0 (Q4 1:
 * 18-byte blocks, d then 16 bytes: value j < 16 the low nibble of byte j,
 * j >= 16 the high nibble of byte j - 16, q = nibble - 8): value = q · d. */
template <int Q4>
static __global__ void k_deq_q(void *tile, int td, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t c0,
                               int64_t nr, int64_t cw)
{
    DEQ_ROWS(r)
    {
        const uint8_t *row = w + (r0 + r) * row_bytes;
        DEQ_COLS(c)
        {
            int64_t col = c0 + c;
            const uint8_t *blk = row + (col / 32) * (Q4 ? 18 : 34);
            float d = at_cu_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
            int j = (int)(col % 32);
            int q = Q4 ? (j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4)) - 8 : (int8_t)blk[2 + j];
            at_cu_store(tile, td, r * cw + c, (float)q * d);
        }
    }
}

/* NF4: value = nf4[q] · s with s = (dyn8[code] · absmax2[group]) + offset
 * (two roundings); the offset is read from the tensor's header. */
static __global__ void k_deq_nf4(void *tile, int td, const uint8_t *w, int64_t nblocks, int64_t cols, int64_t r0,
                                 int64_t c0, int64_t nr, int64_t cw, const float *nf4_code, const float *dyn8_code)
{
    __shared__ float nf4[16], dyn8[256];
    for (int t = threadIdx.x; t < 256; t += blockDim.x) dyn8[t] = dyn8_code[t];
    for (int t = threadIdx.x; t < 16; t += blockDim.x) nf4[t] = nf4_code[t];
    __syncthreads();
    float offset = *(const float *)(w + 8);
    const uint8_t *nib = w + 16, *codes = w + 16 + 32 * nblocks;
    const float *absmax2 = (const float *)(w + (16 + 33 * nblocks + 3) / 4 * 4);
    DEQ_ROWS(r)
    {
        int64_t base = (r0 + r) * cols + c0;
        DEQ_COLS(c)
        {
            int64_t flat = base + c, b = flat / 64;
            float s = __fmul_rn(dyn8[codes[b]], absmax2[b / 256]) + offset; /* the product never fused with the add */
            uint8_t byte = nib[flat / 2];
            int q = (flat & 1) ? (byte & 15) : (byte >> 4);
            at_cu_store(tile, td, r * cw + c, nf4[q] * s);
        }
    }
}

/* ---- cuBLAS ---- */

static cudaDataType mm_cuda_type(int dt)
{
    return dt == CU_BF16 ? CUDA_R_16BF : dt == CU_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* One strided-batched GEMM, row-major terms: C[M,N] (ldc) = alpha·op(A)[M,K]·op(B)[K,N] + beta·C,
 * A with row length lda (stored [M,K], or [K,M] when ta), B with row length ldb. */
typedef struct {
    int ta, tb;
    int64_t M, N, K;
    const void *A;
    int at;
    int64_t lda, sa;
    const void *B;
    int bt;
    int64_t ldb, sb;
    void *C;
    int ct;
    int64_t ldc, sc;
    int64_t batch;
    float alpha, beta;
} mm_gemm;

static at_status mm_run_gemm(cuda_ctx *c, const mm_gemm *g)
{
    if (g->M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
        g->ldc > INT_MAX || g->batch > INT_MAX)
        return c->host->error(AT_ERR_UNSUPPORTED,
                              "matmul: %lld x %lld x %lld (batch %lld) exceeds cuBLAS's 32-bit sizes",
                              (long long)g->M, (long long)g->N, (long long)g->K, (long long)g->batch);
    cublasComputeType_t ctype = CUBLAS_COMPUTE_32F;
    if (g->at == CU_F32 && g->bt == CU_F32 && c->allow_tf32) ctype = CUBLAS_COMPUTE_32F_FAST_TF32;
    /* Cᵀ = op(B)ᵀ · op(A)ᵀ in column-major terms */
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        c->cublas, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->N, (int)g->M,
        (int)g->K, &g->alpha, g->B, mm_cuda_type(g->bt), (int)g->ldb, (long long)g->sb, g->A, mm_cuda_type(g->at),
        (int)g->lda, (long long)g->sa, &g->beta, g->C, mm_cuda_type(g->ct), (int)g->ldc, (long long)g->sc,
        (int)g->batch, ctype, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
    return cu_check_blas(c, s, "matmul (cublasGemmStridedBatchedEx)");
}

static int64_t mm_batch_of(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++) n *= t->shape[i];
    return n;
}

static size_t mm_align(size_t n) { return (n + 255) / 256 * 256; }

static at_status mm_convert(cuda_ctx *c, void *dst, int td, const void *src, int ts, int64_t n)
{
    if (n == 0) return AT_OK;
    AT_LAUNCH(k_mm_convert, mm_grid(c, n), MM_THREADS, 0, c->stream, dst, td, src, ts, n);
    return cu_launched(c, "matmul (operand cast)");
}

static at_status mm_scale_c(cuda_ctx *c, at_tensor *ct, float beta)
{
    int64_t n = cu_numel(ct);
    if (n == 0) return AT_OK;
    AT_LAUNCH(k_mm_scale_c, mm_grid(c, n), MM_THREADS, 0, c->stream, cu_ptr(ct), (int)ct->dtype, beta, n);
    return cu_launched(c, "matmul (beta · C)");
}

static at_status mm_epilogue(cuda_ctx *c, at_tensor *ct, const float *t, float beta)
{
    int64_t n = cu_numel(ct);
    AT_LAUNCH(k_mm_epilogue, mm_grid(c, n), MM_THREADS, 0, c->stream, cu_ptr(ct), (int)ct->dtype, t, beta, n);
    return cu_launched(c, "matmul (bf16 output)");
}

/* ---- quantized B ---- */

static at_status mm_dequant(cuda_ctx *c, const at_tensor *w, void *tile, int td, int64_t r0, int64_t c0, int64_t nr,
                            int64_t cw)
{
    int64_t rows = w->shape[w->ndim - 2], cols = w->shape[w->ndim - 1];
    const uint8_t *p = (const uint8_t *)cu_ptr(w);
    unsigned grid = cu_grid(c, nr, 1); /* a block per tile row, up to the cap */
    if (w->dtype == AT_Q8_0) {
        AT_LAUNCH(k_deq_q<0>, grid, MM_THREADS, 0, c->stream, tile, td, p, cols / 32 * 34, r0, c0, nr, cw);
    } else if (w->dtype == AT_Q4_0) {
        AT_LAUNCH(k_deq_q<1>, grid, MM_THREADS, 0, c->stream, tile, td, p, cols / 32 * 18, r0, c0, nr, cw);
    } else {
        int64_t nblocks = (rows * cols + 63) / 64;
        AT_LAUNCH(k_deq_nf4, grid, MM_THREADS, 0, c->stream, tile, td, p, nblocks, cols, r0, c0, nr, cw, c->nf4_code,
                  c->dyn8_code);
    }
    return cu_launched(c, "matmul (dequantize)");
}

static at_status mm_quantized(cuda_ctx *c, at_tensor *ct, const at_tensor *a, const at_tensor *w, int ta, int tb,
                              float alpha, float beta)
{
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t wr = w->shape[w->ndim - 2], wc = w->shape[w->ndim - 1];
    int64_t M = ta ? ac : ar, K = ta ? ar : ac, N = tb ? wr : wc, batch = mm_batch_of(a);
    if (w->dtype != AT_Q8_0 && w->dtype != AT_Q4_0 && w->dtype != AT_NF4)
        return c->host->error(AT_ERR_UNSUPPORTED, "matmul: no CUDA kernel for weight %s of this dtype", w->name);
    if (wc % (w->dtype == AT_NF4 ? 64 : 32))
        return c->host->error(AT_ERR_INVALID, "matmul: quantized weight %s: rows of %lld values are not whole blocks",
                              w->name, (long long)wc);
    if (tb && !ta && M * batch <= QG_MAX_ROWS) { /* decoding: the fused GEMV of cuda_qgemv.cu, when it fits */
        int done = 0;
        CU_TRY(cu_qgemv(c, ct, a, w, ta, tb, alpha, beta, &done));
        if (done) return AT_OK;
    }
    int abf = a->dtype == AT_BF16;
    int td = abf ? CU_BF16 : CU_F32; /* the compute format, and the tile's dtype */
    size_t te = abf ? 2 : 4;
    int need_a = !abf && a->dtype != AT_F32; /* f16 A widened to f32 */
    int need_t = !abf && ct->dtype != AT_F32; /* bf16 C with f32 compute */
    /* the tile: rows of W (forward) or columns of W (input backward), bounded */
    int64_t budget = (int64_t)(QTILE_BYTES / te);
    int64_t span;
    if (tb) {
        span = budget / (K > 0 ? K : 1);
        if (span < 1) span = 1;
    } else {
        span = budget / (K > 0 ? K : 1) / 64 * 64;
        if (span < 64) span = 64;
    }
    if (span > N) span = N;
    size_t tile_b = mm_align((size_t)(tb ? span * K : K * span) * te);
    size_t a_b = need_a ? mm_align((size_t)cu_numel(a) * 4) : 0, t_b = need_t ? mm_align((size_t)cu_numel(ct) * 4) : 0;
    void *scr;
    CU_TRY(cu_scratch(c, tile_b + a_b + t_b, &scr));
    char *tile = (char *)scr;
    const void *A = cu_ptr(a);
    int at = a->dtype;
    if (need_a) {
        CU_TRY(mm_convert(c, tile + tile_b, CU_F32, A, at, cu_numel(a)));
        A = tile + tile_b;
        at = CU_F32;
    }
    float *T = need_t ? (float *)(tile + tile_b + a_b) : NULL;
    mm_gemm g = {};
    g.ta = ta;
    g.A = A;
    g.at = at;
    g.lda = ac;
    g.sa = ar * ac;
    g.bt = td;
    g.sb = 0;
    g.C = T ? (void *)T : cu_ptr(ct);
    g.ct = T ? CU_F32 : (int)ct->dtype;
    g.ldc = N;
    g.alpha = alpha;
    g.beta = T ? 0.0f : beta;
    g.M = M;
    g.K = K;
    g.batch = batch;
    g.sc = M * N;
    if (!ta && (int64_t)M * batch <= INT_MAX) { /* one weight for all: the batch stacked into rows */
        g.M = M * batch;
        g.batch = 1;
    }
    size_t ce = g.ct == CU_F32 ? 4 : 2;
    for (int64_t s0 = 0; s0 < N; s0 += span) {
        int64_t n = N - s0 < span ? N - s0 : span;
        if (tb) { /* C[:, s0:s0+n] = op(A) · W[s0:s0+n, :]ᵀ */
            CU_TRY(mm_dequant(c, w, tile, td, s0, 0, n, K));
            g.tb = 1;
            g.ldb = K;
        } else { /* C[:, s0:s0+n] = op(A) · W[:, s0:s0+n] */
            CU_TRY(mm_dequant(c, w, tile, td, 0, s0, K, n));
            g.tb = 0;
            g.ldb = n;
        }
        g.B = tile;
        g.N = n;
        g.C = (char *)(T ? (void *)T : cu_ptr(ct)) + (size_t)s0 * ce;
        CU_TRY(mm_run_gemm(c, &g));
    }
    if (T) CU_TRY(mm_epilogue(c, ct, T, beta));
    return AT_OK;
}

/* ---- entry ---- */

at_status cu_matmul(at_tensor *ct, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b, float alpha,
                    float beta)
{
    cuda_ctx *c = cu_ctx(ct);
    int ta = !!trans_a, tb = !!trans_b;
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
    int64_t M = ta ? ac : ar, K = ta ? ar : ac, N = tb ? br : bc;
    int64_t batch = mm_batch_of(a), bb = mm_batch_of(b);
    if (ct->dtype != AT_F32 && ct->dtype != AT_BF16)
        return c->host->error(AT_ERR_UNSUPPORTED, "matmul: output %s must be f32 or bf16", ct->name);
    if (M == 0 || N == 0 || batch == 0) return AT_OK;
    if (K == 0 || alpha == 0.0f) return mm_scale_c(c, ct, beta); /* A and B are not read */
    if (b->dtype == AT_Q8_0 || b->dtype == AT_Q4_0 || b->dtype == AT_NF4)
        return mm_quantized(c, ct, a, b, ta, tb, alpha, beta);
    int at = a->dtype, bt = b->dtype;
    if (at > CU_F16 || bt > CU_F16)
        return c->host->error(AT_ERR_UNSUPPORTED, "matmul: no CUDA kernel for %s · %s of these dtypes", a->name,
                              b->name);
    /* the operand to convert (at most one: see the file comment) and its target */
    int conv_a = 0, conv_b = 0, target = CU_F32;
    if (at == CU_BF16 || bt == CU_BF16) {
        target = CU_BF16;
        conv_a = at != CU_BF16;
        conv_b = bt != CU_BF16;
    } else if (at != bt) { /* f16 with f32: widen the f16 one */
        conv_a = at == CU_F16;
        conv_b = bt == CU_F16;
    }
    int compute_f32 = target == CU_F32;
    int need_t = compute_f32 && ct->dtype != AT_F32;
    size_t te = target == CU_BF16 ? 2 : 4;
    size_t conv_bytes = conv_a ? mm_align((size_t)cu_numel(a) * te) : conv_b ? mm_align((size_t)cu_numel(b) * te) : 0;
    size_t t_bytes = need_t ? mm_align((size_t)cu_numel(ct) * 4) : 0;
    char *scr = NULL;
    if (conv_bytes + t_bytes) {
        void *p;
        CU_TRY(cu_scratch(c, conv_bytes + t_bytes, &p));
        scr = (char *)p;
    }
    const void *A = cu_ptr(a), *B = cu_ptr(b);
    if (conv_a) {
        CU_TRY(mm_convert(c, scr, target, A, at, cu_numel(a)));
        A = scr;
        at = target;
    }
    if (conv_b) {
        CU_TRY(mm_convert(c, scr, target, B, bt, cu_numel(b)));
        B = scr;
        bt = target;
    }
    float *T = need_t ? (float *)(scr + conv_bytes) : NULL;
    mm_gemm g = {};
    g.ta = ta;
    g.tb = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.at = at;
    g.lda = ac;
    g.sa = ar * ac;
    g.B = B;
    g.bt = bt;
    g.ldb = bc;
    g.sb = bb == 1 ? 0 : br * bc;
    g.C = T ? (void *)T : cu_ptr(ct);
    g.ct = T ? CU_F32 : (int)ct->dtype;
    g.ldc = N;
    g.sc = M * N;
    g.batch = batch;
    g.alpha = alpha;
    g.beta = T ? 0.0f : beta;
    if (bb == 1 && !ta && M * batch <= INT_MAX) { /* the batch of A stacked into the rows of one GEMM */
        g.M = M * batch;
        g.batch = 1;
    }
    CU_TRY(mm_run_gemm(c, &g));
    if (T) CU_TRY(mm_epilogue(c, ct, T, beta));
    return AT_OK;
}

/* The product, then the low-rank term added by a second one (ops.h). */
at_status cu_matmul_lowrank(at_tensor *ct, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float beta, const at_tensor *u, const at_tensor *v, float s)
{
    at_status st = cu_matmul(ct, a, b, trans_a, trans_b, alpha, beta);
    if (st != AT_OK) return st;
    return cu_matmul(ct, u, v, 0, 1, s, 1.0f);
}

/* The product (beta 0), then the dropout in place (ops.h); p 0: the product alone. */
at_status cu_matmul_dropout(at_tensor *ct, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch)
{
    at_status st = cu_matmul(ct, a, b, trans_a, trans_b, alpha, 0.0f);
    if (st != AT_OK || p == 0.0f) return st;
    return cu_dropout(ct, ct, p, seed, offset, run, pitch);
}
