/* Fused dequantize-GEMV for decoding: C = alpha · A · Wᵀ + beta · C with a
 * quantized W [N, K] (q8_0, q4_0, nf4; layouts in device/quant.h) and A of
 * at most QG_MAX_ROWS rows (a batch of A stacked into rows).
 *
 * Why: with one to eight rows the matmul is memory-bound. The tile path of
 * cuda_matmul.cu reads W's quantized bytes, writes a dequantized tile (2 or 4
 * bytes a value) and cuBLAS reads it back: ~4-5 bytes moved per weight. Here
 * each weight byte is read once (1.06 bytes a value for q8_0, 0.56 for q4_0,
 * 0.52 for nf4) and the dequantized values live only in registers.
 *
 *   C[m][n] = alpha · Σ_k A[m][k] · w(n, k) + beta · C[m][n]     (beta == 0: C not read)
 *
 * w(n, k) is computed exactly as device/quant.c does (the f32 operations of
 * k_deq_q / k_deq_nf4 in cuda_matmul.cu, the NF4 scale's product kept apart
 * from its sum with __fmul_rn) and rounded to bf16 when A is bf16, as the
 * tile path's bf16 tile and the CPU's packer do; products accumulate in f32.
 * Only the order of the sum differs from the tile path.
 *
 * Work split: a warp computes QG_COLS output columns (rows of W) for all the
 * MR rows of A; its lane l walks W's 32-value units l, l + 32, ... (a q8_0 or
 * q4_0 block, half an nf4 block), so a warp reads a contiguous stretch of
 * each W row at a time (nf4: one 16-byte load per lane and unit; q8_0 / q4_0
 * blocks are 34 / 18 bytes, only 2-byte aligned, so 2-byte loads whose lines
 * the warp's neighbours share). The A values of a unit are loaded once per
 * 8 values and reused for the QG_COLS rows; the warp's partial sums are
 * reduced with shuffles and lane 0 applies alpha / beta. */
#include <stdlib.h>
#include <string.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

#define QG_WARPS 4 /* warps a block */
#define QG_COLS 2  /* output columns a warp */
#define QG_UNIT 32 /* values a lane handles at a time */

enum { QG_Q8_0 = 0, QG_Q4_0 = 1, QG_NF4 = 2 };

/* Fully unrolled loops keep the per-row arrays (acc, av, w) in registers;
 * without it nvcc puts them on the stack (local memory). Device pass only:
 * the host compilers would warn about an unknown pragma. */
#ifdef __CUDA_ARCH__
#define QG_UNROLL _Pragma("unroll")
#else
#define QG_UNROLL
#endif

typedef struct {
    const uint8_t *w;  /* the weight's bytes */
    int64_t row_bytes; /* q8_0 / q4_0: bytes a row of W */
    int64_t nblocks;   /* nf4: blocks of 64 in the tensor */
    const void *a;
    int at, avec; /* A's dtype; whether 8-value vector loads are legal (16-byte aligned) */
    void *c;
    int ct;
    int64_t N, K;
    float alpha, beta;
    int round_bf16; /* A is bf16: the weight is rounded to bf16 before the product */
    const float *nf4_code, *dyn8_code;
} qg_args;

/* w[0..8) = the 8 values [8·c, 8·c + 8) of the 32-value unit whose bytes
 * (q8_0 / q4_0: the block, scale first; nf4: the 16 nibble bytes in raw) are
 * given; d the block's scale (f16 widened; nf4: the two-level scale). */
template <int FMT>
static __device__ __forceinline__ void qg_dequant8(const uint8_t *blk, const uint4 &raw, int c, float d,
                                                   const float *nf4, float *w)
{
    if (FMT == QG_Q8_0) { /* value j = (int8) qs[j] · d */
        const uint16_t *qs = (const uint16_t *)(blk + 2);
        QG_UNROLL
        for (int i = 0; i < 4; i++) {
            uint16_t u = qs[4 * c + i];
            w[2 * i] = (float)(int8_t)(uint8_t)(u & 0xff) * d;
            w[2 * i + 1] = (float)(int8_t)(uint8_t)(u >> 8) * d;
        }
    } else if (FMT == QG_Q4_0) { /* j < 16: (low nibble of qs[j]) − 8; j ≥ 16: (high nibble of qs[j − 16]) − 8 */
        const uint16_t *qs = (const uint16_t *)(blk + 2);
        int shift = c < 2 ? 0 : 4;
        QG_UNROLL
        for (int i = 0; i < 4; i++) {
            uint16_t u = qs[4 * (c & 1) + i];
            w[2 * i] = (float)((int)((u & 0xff) >> shift & 15) - 8) * d;
            w[2 * i + 1] = (float)((int)((u >> 8) >> shift & 15) - 8) * d;
        }
    } else { /* two values a byte, the first in the high nibble */
        uint32_t word = c == 0 ? raw.x : c == 1 ? raw.y : c == 2 ? raw.z : raw.w;
        QG_UNROLL
        for (int i = 0; i < 4; i++) {
            uint32_t byte = word >> (8 * i) & 0xffu;
            w[2 * i] = nf4[byte >> 4] * d;
            w[2 * i + 1] = nf4[byte & 15] * d;
        }
    }
}

/* CFG = FMT · 16 + MR (one template argument: AT_LAUNCH is a macro, a comma
 * would split it); MR the rows of A, 1..QG_MAX_ROWS. */
template <int CFG>
static __global__ void __launch_bounds__(QG_WARPS * AT_WARP) k_qgemv(qg_args p)
{
    constexpr int FMT = CFG / 16, MR = CFG % 16;
    __shared__ float nf4[16], dyn8[256];
    if (FMT == QG_NF4) {
        for (int t = threadIdx.x; t < 256; t += blockDim.x) dyn8[t] = p.dyn8_code[t];
        for (int t = threadIdx.x; t < 16; t += blockDim.x) nf4[t] = p.nf4_code[t];
        __syncthreads();
    }
    const int lane = threadIdx.x % AT_WARP, warp = threadIdx.x / AT_WARP;
    const int64_t n0 = ((int64_t)blockIdx.x * QG_WARPS + warp) * QG_COLS;
    if (n0 >= p.N) return; /* the whole warp: no barrier follows */
    int64_t row[QG_COLS];
    QG_UNROLL
    for (int r = 0; r < QG_COLS; r++) row[r] = n0 + r < p.N ? n0 + r : p.N - 1; /* past N: computed, not stored */
    float offset = 0.0f;
    const uint8_t *nib = p.w + 16, *codes = p.w + 16 + 32 * p.nblocks;
    const float *absmax2 = (const float *)(p.w + (16 + 33 * p.nblocks + 3) / 4 * 4);
    if (FMT == QG_NF4) offset = *(const float *)(p.w + 8);
    float acc[QG_COLS][MR];
    QG_UNROLL
    for (int r = 0; r < QG_COLS; r++)
        QG_UNROLL
        for (int m = 0; m < MR; m++) acc[r][m] = 0.0f;
    const int64_t units = p.K / QG_UNIT;
    for (int64_t u = lane; u < units; u += AT_WARP) {
        const int64_t k0 = u * QG_UNIT;
        const uint8_t *blk[QG_COLS];
        uint4 raw[QG_COLS];
        float d[QG_COLS];
        QG_UNROLL
        for (int r = 0; r < QG_COLS; r++) {
            if (FMT == QG_NF4) {
                int64_t flat = row[r] * p.K + k0, b = flat / 64;
                blk[r] = nib + flat / 2;
                raw[r] = *(const uint4 *)blk[r]; /* 16-byte aligned: flat is a multiple of 32 */
                d[r] = __fmul_rn(dyn8[codes[b]], absmax2[b / 256]) + offset; /* the product never fused with the add */
            } else {
                blk[r] = p.w + row[r] * p.row_bytes + u * (FMT == QG_Q8_0 ? 34 : 18);
                raw[r] = make_uint4(0, 0, 0, 0);
                d[r] = at_cu_f16_to_f32(*(const uint16_t *)blk[r]);
            }
        }
        QG_UNROLL
        for (int c = 0; c < QG_UNIT / 8; c++) {
            float av[MR][8];
            QG_UNROLL
            for (int m = 0; m < MR; m++) {
                int64_t i0 = m * p.K + k0 + 8 * c;
                if (p.avec) {
                    at_cu_load8(p.a, p.at, i0, av[m]);
                } else {
                    QG_UNROLL
                    for (int i = 0; i < 8; i++) av[m][i] = at_cu_load(p.a, p.at, i0 + i);
                }
            }
            QG_UNROLL
            for (int r = 0; r < QG_COLS; r++) {
                float w[8];
                qg_dequant8<FMT>(blk[r], raw[r], c, d[r], nf4, w);
                if (p.round_bf16) {
                    QG_UNROLL
                    for (int i = 0; i < 8; i++) w[i] = at_cu_bf16_to_f32(at_cu_f32_to_bf16(w[i]));
                }
                QG_UNROLL
                for (int m = 0; m < MR; m++)
                    QG_UNROLL
                    for (int i = 0; i < 8; i++) acc[r][m] += w[i] * av[m][i];
            }
        }
    }
    QG_UNROLL
    for (int r = 0; r < QG_COLS; r++)
        QG_UNROLL
        for (int m = 0; m < MR; m++) acc[r][m] = at_cu_warp_sum(acc[r][m]);
    if (lane == 0)
        QG_UNROLL
        for (int r = 0; r < QG_COLS; r++) {
            int64_t n = n0 + r;
            if (n >= p.N) break;
            QG_UNROLL
            for (int m = 0; m < MR; m++) {
                float v = p.alpha * acc[r][m];
                if (p.beta != 0.0f) v += p.beta * at_cu_load(p.c, p.ct, m * p.N + n);
                at_cu_store(p.c, p.ct, m * p.N + n, v);
            }
        }
}

/* ANYTUNE_CUDA_NO_QGEMV=1 turns the fused path off (read at every call, so a
 * benchmark can time both paths in one process). */
static int qg_disabled(void)
{
    const char *e = getenv("ANYTUNE_CUDA_NO_QGEMV");
    return e && *e && strcmp(e, "0") != 0;
}

template <int FMT> static void qg_launch(cuda_ctx *c, unsigned grid, int64_t rows, const qg_args &p)
{
    switch (rows) {
#define QG_CASE(MR) \
    case MR: AT_LAUNCH(k_qgemv<FMT * 16 + MR>, grid, QG_WARPS * AT_WARP, 0, c->stream, p); break;
        QG_CASE(1) QG_CASE(2) QG_CASE(3) QG_CASE(4) QG_CASE(5) QG_CASE(6) QG_CASE(7) QG_CASE(8)
#undef QG_CASE
    default: break;
    }
}

at_status cu_qgemv(cuda_ctx *c, at_tensor *ct, const at_tensor *a, const at_tensor *w, int ta, int tb, float alpha,
                   float beta, int *done)
{
    *done = 0;
    if (ta || !tb || qg_disabled()) return AT_OK;
    int64_t rows = cu_rows(a), K = cu_cols(a), N = w->shape[w->ndim - 2];
    if (rows < 1 || rows > QG_MAX_ROWS || K % QG_UNIT || N < 1 || cu_numel(ct) != rows * N) return AT_OK;
    if (a->dtype != AT_F32 && a->dtype != AT_BF16 && a->dtype != AT_F16) return AT_OK;
    if (ct->dtype != AT_F32 && ct->dtype != AT_BF16 && ct->dtype != AT_F16) return AT_OK;
    const uint8_t *wp = (const uint8_t *)cu_ptr(w);
    int fmt = w->dtype == AT_Q8_0 ? QG_Q8_0 : w->dtype == AT_Q4_0 ? QG_Q4_0 : w->dtype == AT_NF4 ? QG_NF4 : -1;
    if (fmt < 0 || ((uintptr_t)wp & (fmt == QG_NF4 ? 15u : 1u))) return AT_OK; /* the loads' alignment */
    int64_t blocks = (N + QG_WARPS * QG_COLS - 1) / (QG_WARPS * QG_COLS);
    if (blocks > 0x7fffffff) return AT_OK;
    qg_args p;
    memset(&p, 0, sizeof p);
    p.w = wp;
    p.row_bytes = K / 32 * (fmt == QG_Q8_0 ? 34 : 18);
    p.nblocks = (cu_numel(w) + 63) / 64;
    p.a = cu_ptr(a);
    p.at = (int)a->dtype;
    p.avec = cu_aligned16(p.a);
    p.c = cu_ptr(ct);
    p.ct = (int)ct->dtype;
    p.N = N;
    p.K = K;
    p.alpha = alpha;
    p.beta = beta;
    p.round_bf16 = a->dtype == AT_BF16;
    p.nf4_code = c->nf4_code;
    p.dyn8_code = c->dyn8_code;
    unsigned grid = (unsigned)blocks;
    if (fmt == QG_Q8_0) qg_launch<QG_Q8_0>(c, grid, rows, p);
    else if (fmt == QG_Q4_0) qg_launch<QG_Q4_0>(c, grid, rows, p);
    else qg_launch<QG_NF4>(c, grid, rows, p);
    *done = 1;
    return cu_launched(c, "matmul (fused dequantize-GEMV)");
}
