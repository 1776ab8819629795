/* AVX-512 helpers shared by gemm_avx512.c and gemm_avx512bf16.c (static
 * inline; include only from files compiled with the AVX-512 flags). */
#ifndef AT_DEVICE_CPU_GEMM_AVX512_INL_H
#define AT_DEVICE_CPU_GEMM_AVX512_INL_H

#include <immintrin.h>
#include <stdint.h>
#include "device/cpu/gemm_kernels.h"
#include "device/dtype.h"

static inline __mmask16 mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Rounds f32 lanes to the nearest bf16 value (ties to even), NaN kept. */
static inline __m512 round_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 16 values of type t at p (masked lanes read as 0) as f32. */
static inline __m512 load16(const void *p, at_dtype t, __mmask16 m)
{
    if (t == AT_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (t == AT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __m512 load16r(const void *p, at_dtype t, __mmask16 m, int round)
{
    __m512 v = load16(p, t, m);
    return round ? round_bf16(v) : v;
}

/* In-register transpose of 16 rows of 16 32-bit values. */
static inline void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Stores one row of a tile: c[0..n) = alpha*acc + beta*c (c f32 or bf16). */
static inline void store_row(void *c, at_dtype ct, __m512 a0, __m512 a1, __mmask16 m0, __mmask16 m1, __m512 va,
                             float beta)
{
    a0 = _mm512_mul_ps(a0, va);
    a1 = _mm512_mul_ps(a1, va);
    if (ct == AT_F32) {
        float *p = c;
        if (beta != 0.0f) {
            __m512 vb = _mm512_set1_ps(beta);
            a0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, p), a0);
            a1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, p + 16), a1);
        }
        _mm512_mask_storeu_ps(p, m0, a0);
        _mm512_mask_storeu_ps(p + 16, m1, a1);
    } else {
        uint16_t *p = c;
        if (beta != 0.0f) {
            __m512 vb = _mm512_set1_ps(beta);
            a0 = _mm512_fmadd_ps(vb, load16(p, AT_BF16, m0), a0);
            a1 = _mm512_fmadd_ps(vb, load16(p + 16, AT_BF16, m1), a1);
        }
        __m256i h0 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_bf16(a0)), 16));
        __m256i h1 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_bf16(a1)), 16));
        _mm256_mask_storeu_epi16(p, m0, h0);
        _mm256_mask_storeu_epi16(p + 16, m1, h1);
    }
}

/* Lists of the row / column indices that the tiles of gemm_avx512*.c spell
 * out: accumulators are named variables (c<r><s>), not arrays, since
 * compilers keep an array of 16+ zmm in memory and reload it every step. */
#define AT_S8(M, r) M(r, 0) M(r, 1) M(r, 2) M(r, 3) M(r, 4) M(r, 5) M(r, 6) M(r, 7)
#define AT_R4(M) M(0) M(1) M(2) M(3)
#define AT_R4S8(M) AT_S8(M, 0) AT_S8(M, 1) AT_S8(M, 2) AT_S8(M, 3)
#define AT_R14(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)

/* The 14x32 microkernels' frame: row i accumulates in c<i>0 and c<i>1.
 * AT_TILE_BEGIN prefetches C's lines first, so that the write-back does not
 * wait on them, and zeroes the accumulators; AT_TILE_END stores rows 0..m
 * of c = alpha*acc + beta*c (kernel arguments c, ct, ldc, m, n, alpha, beta). */
#define AT_TILE_ZERO_(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define AT_TILE_STORE_(i)                                                                                              \
    if (i < m) store_row(cr + (size_t)(i * ldc) * es, ct, c##i##0, c##i##1, m0, m1, va, beta);
#define AT_TILE_BEGIN                                                                                                  \
    size_t es = ct == AT_F32 ? 4 : 2;                                                                                  \
    for (int i = 0; i < m; i++) {                                                                                      \
        _mm_prefetch((const char *)c + (size_t)(i * ldc) * es, _MM_HINT_T0);                                           \
        _mm_prefetch((const char *)c + (size_t)(i * ldc) * es + 64, _MM_HINT_T0);                                      \
    }                                                                                                                  \
    AT_R14(AT_TILE_ZERO_)
#define AT_TILE_END                                                                                                    \
    {                                                                                                                  \
        __m512 va = _mm512_set1_ps(alpha);                                                                             \
        __mmask16 m0 = mask16(n), m1 = mask16(n - 16);                                                                 \
        char *cr = c;                                                                                                  \
        AT_R14(AT_TILE_STORE_)                                                                                         \
    }

/* The k-contiguous case of the packers: panels of w lanes (x), each stored
 * as nu k units of w 32-bit values (a unit is one f32, or one bf16 pair).
 * load(p, t, left, round) reads 16 units of one source row (left: the
 * source values from p on) as 16 32-bit lanes; rows past n are zero. 16 x
 * 16 blocks are transposed in registers. */
typedef __m512 (*at_row16_fn)(const char *p, at_dtype t, int64_t left, int round);
static inline __attribute__((always_inline)) void pack_transposed(float *dst, const char *src, at_dtype t, int64_t sx,
                                                                  int w, int64_t n, int64_t kc, int64_t nu, int upk,
                                                                  int round, at_row16_fn load)
{
    size_t es = t == AT_F32 ? 4 : 2;
    int64_t np = (n + w - 1) / w, pstride = nu * w;
    for (int64_t pi = 0; pi < np; pi++, dst += pstride) {
        int64_t x0 = pi * w;
        for (int g = 0; g < w; g += 16) {
            __mmask16 wm = mask16(w - g);
            int step = w - g < 16 ? w - g : 16; /* to the next group of rows */
            for (int64_t u0 = 0; u0 < nu; u0 += 16) {
                int64_t k0 = upk * u0;
                __m512 r[16];
                for (int i = 0; i < 16; i++) {
                    const char *row = src + (size_t)((x0 + g + i) * sx + k0) * es;
                    r[i] = x0 + g + i < n ? load(row, t, kc - k0, round) : _mm512_setzero_ps();
                    /* 16 rows read side by side are 16 short streams that
                     * the hardware prefetchers miss: 4 lines along each
                     * row, and the next 16 rows' same line, a whole pass
                     * over k ahead (at_gemm_prefetch_row says why). The
                     * lines along took packing f32 activations into bf16
                     * pairs (2 lines per row and step) on a Zen 5 from 0.8
                     * to 0.5 cycles of the 2.1 GHz TSC per value */
                    at_gemm_prefetch_row(row, 16 * upk * (int)es, 256, 0);
                    if (x0 + g + i + step < n) _mm_prefetch(row + (size_t)(step * sx) * es, _MM_HINT_T2);
                }
                transpose16(r);
                int ul = nu - u0 < 16 ? (int)(nu - u0) : 16;
                for (int i = 0; i < ul; i++) _mm512_mask_storeu_ps(dst + (u0 + i) * w + g, wm, r[i]);
            }
        }
    }
}

/* The low-rank term of a tile (gemm_kernels.h, at_gemm_lowrank_fn): 16
 * columns at a time, each row's term summed in a register from 0, then
 * added to C. */
static inline void at_gemm_lowrank_avx512(float *c, int64_t ldc, int m, int n, const float *u, int64_t ldu,
                                          const float *vt, int64_t ldvt, int r)
{
    if (r <= 8 && n <= 32) {
        /* a microkernel's tile at LoRA's ranks: vᵀ's 32 columns x r rows
         * stay in registers for all the rows (each row's sums as below) */
        __mmask16 m0 = mask16(n), m1 = mask16(n - 16);
        __m512 v0[8], v1[8];
        for (int k = 0; k < 8; k++) {
            v0[k] = k < r ? _mm512_maskz_loadu_ps(m0, vt + k * ldvt) : _mm512_setzero_ps();
            v1[k] = k < r ? _mm512_maskz_loadu_ps(m1, vt + k * ldvt + 16) : _mm512_setzero_ps();
        }
        for (int i = 0; i < m; i++) {
            __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
            for (int k = 0; k < r; k++) {
                __m512 uk = _mm512_set1_ps(u[i * ldu + k]);
                t0 = _mm512_fmadd_ps(uk, v0[k], t0);
                t1 = _mm512_fmadd_ps(uk, v1[k], t1);
            }
            float *ci = c + i * ldc;
            _mm512_mask_storeu_ps(ci, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, ci), t0));
            _mm512_mask_storeu_ps(ci + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), t1));
        }
        return;
    }
    for (int j = 0; j < n; j += 16) {
        __mmask16 mk = mask16(n - j);
        for (int i = 0; i < m; i++) {
            __m512 t = _mm512_setzero_ps();
            for (int k = 0; k < r; k++)
                t = _mm512_fmadd_ps(_mm512_set1_ps(u[i * ldu + k]), _mm512_maskz_loadu_ps(mk, vt + k * ldvt + j), t);
            _mm512_mask_storeu_ps(c + i * ldc + j, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, c + i * ldc + j), t));
        }
    }
}

#endif
