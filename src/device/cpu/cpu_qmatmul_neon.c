/* Advanced SIMD (NEON) dequantizers and decode kernels of the quantized
 * matmul (see cpu_qmatmul.h), aarch64 only; the same contract and the same
 * arithmetic as cpu_qmatmul_avx2.c: each weight value is made with one
 * rounding, value = q · d (Q8_0 / Q4_0) or code[i] · absmax (NF4), so the
 * dequantized rows are bit-identical to device/quant.c's; the int8 decode
 * multiplies bytes with SMULL/SMLAL (SDOT in cpu_qmatmul_neon_dotprod.c). */
#include <arm_neon.h>

/* Σ x_i·w_i over a block of 32 int8 pairs, in four int32 lanes: products
 * widened to int16 two at a time (|x| <= 127, |w| <= 128: at most 32512,
 * below int16's limit), then pairwise into int32. */
static inline int32x4_t smull_dot32(int8x16_t x0, int8x16_t x1, int8x16_t w0, int8x16_t w1)
{
    int16x8_t p0 = vmlal_s8(vmull_s8(vget_low_s8(x0), vget_low_s8(w0)), vget_high_s8(x0), vget_high_s8(w0));
    int16x8_t p1 = vmlal_s8(vmull_s8(vget_low_s8(x1), vget_low_s8(w1)), vget_high_s8(x1), vget_high_s8(w1));
    return vpadalq_s16(vpaddlq_s16(p0), p1);
}

#define AT_NEON_DOT32 smull_dot32
#include "device/cpu/cpu_qmatmul_neon_inl.h"
#include "device/cpu/gemm_neon_inl.h"

/* Values 4i..4i+3 of a block (i < 8) as f32 times d. */
static inline void block_values(int8x16_t q0, int8x16_t q1, float32x4_t d, float32x4_t v[8])
{
    int16x8_t h[4] = {vmovl_s8(vget_low_s8(q0)), vmovl_s8(vget_high_s8(q0)), vmovl_s8(vget_low_s8(q1)),
                      vmovl_s8(vget_high_s8(q1))};
    for (int j = 0; j < 4; j++) {
        v[2 * j] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h[j]))), d);
        v[2 * j + 1] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(h[j]))), d);
    }
}

static inline void dequant_blocks(const int fmt, float *y, const uint8_t *blk, int64_t nblk)
{
    size_t bytes = fmt == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    for (int64_t b = 0; b < nblk; b++, blk += bytes, y += 32) {
        int8x16_t q0, q1;
        float32x4_t v[8];
        block_bytes(fmt, blk, &q0, &q1);
        block_values(q0, q1, vdupq_n_f32(f16_scale(blk)), v);
        for (int i = 0; i < 8; i++) vst1q_f32(y + 4 * i, v[i]);
    }
}

static void q8_0(float *y, const uint8_t *blk, int64_t nblk) { dequant_blocks(AT_Q8_0, y, blk, nblk); }
static void q4_0(float *y, const uint8_t *blk, int64_t nblk) { dequant_blocks(AT_Q4_0, y, blk, nblk); }

/* NF4: byte i holds value 2i (high nibble) and 2i+1 (low nibble). The code
 * book lookup is four TBLs, one per byte of the 16 f32 codes (byte planes),
 * whose results are zipped back into floats: ~1.4 instructions a value
 * against ~5 for the compiler's lane-by-lane loads. In decode every NF4 row
 * is dequantized once per token, so this is on the hot path. */
static inline void nf4_16(float *y, uint8x16_t idx, const uint8x16_t pl[4], float s)
{
    uint8x16_t b0 = vqtbl1q_u8(pl[0], idx), b1 = vqtbl1q_u8(pl[1], idx);
    uint8x16_t b2 = vqtbl1q_u8(pl[2], idx), b3 = vqtbl1q_u8(pl[3], idx);
    uint16x8_t l0 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1)), l1 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1));
    uint16x8_t h0 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3)), h1 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    vst1q_f32(y, vmulq_n_f32(vreinterpretq_f32_u16(vzip1q_u16(l0, h0)), s));
    vst1q_f32(y + 4, vmulq_n_f32(vreinterpretq_f32_u16(vzip2q_u16(l0, h0)), s));
    vst1q_f32(y + 8, vmulq_n_f32(vreinterpretq_f32_u16(vzip1q_u16(l1, h1)), s));
    vst1q_f32(y + 12, vmulq_n_f32(vreinterpretq_f32_u16(vzip2q_u16(l1, h1)), s));
}

static void nf4(float *y, const uint8_t *nib, const float *absmax, int64_t nblk)
{
    uint8_t planes[4][16];
    for (int i = 0; i < 16; i++) {
        uint32_t u;
        memcpy(&u, &at_nf4_code[i], 4);
        for (int j = 0; j < 4; j++) planes[j][i] = (uint8_t)(u >> 8 * j); /* little-endian bytes */
    }
    const uint8x16_t pl[4] = {vld1q_u8(planes[0]), vld1q_u8(planes[1]), vld1q_u8(planes[2]), vld1q_u8(planes[3])};
    for (int64_t b = 0; b < nblk; b++, nib += AT_NF4_BLOCK / 2, y += AT_NF4_BLOCK) {
        float s = absmax[b];
        for (int i = 0; i < AT_NF4_BLOCK / 2; i += 16) {
            uint8x16_t v = vld1q_u8(nib + i), hi = vshrq_n_u8(v, 4), lo = vandq_u8(v, vdupq_n_u8(15));
            nf4_16(y + 2 * i, vzip1q_u8(hi, lo), pl, s); /* values 2i .. 2i+15 */
            nf4_16(y + 2 * i + 16, vzip2q_u8(hi, lo), pl, s);
        }
    }
}

const at_cpu_qdeq at_cpu_qdeq_neon = {.name = "neon", .q8_0 = q8_0, .q4_0 = q4_0, .nf4 = nf4};

/* ---- decode: M (<= 8) rows of x against one row of W, W streamed once ----
 * A block of 32 is eight vectors: even ones accumulate in acc[m][0], odd in [1]. */
static inline __attribute__((always_inline)) void gemv_fma(const int MM, const float *const *xs, int64_t k,
                                                           const float32x4_t v[8], float32x4_t acc[8][2])
{
    for (int m = 0; m < MM; m++)
        for (int i = 0; i < 8; i++) acc[m][i & 1] = vfmaq_f32(acc[m][i & 1], vld1q_f32(xs[m] + k + 4 * i), v[i]);
}

static inline __attribute__((always_inline)) void gemv_body(const int MM, const int fmt, const int round, int64_t K,
                                                            const float *x, const uint8_t *blk, float *out)
{
    float32x4_t acc[8][2];
    const float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = vdupq_n_f32(0.0f);
        xs[m] = x + m * K;
    }
    size_t bytes = fmt == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    for (int64_t k = 0; k < K; k += 32, blk += bytes) {
        int8x16_t q0, q1;
        float32x4_t v[8];
        block_bytes(fmt, blk, &q0, &q1);
        block_values(q0, q1, vdupq_n_f32(f16_scale(blk)), v);
        if (round)
            for (int i = 0; i < 8; i++) v[i] = round_bf16(v[i]);
        gemv_fma(MM, xs, k, v, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = vaddvq_f32(vaddq_f32(acc[m][0], acc[m][1]));
}

/* x rows of a row already dequantized to f32 (NF4). */
static inline __attribute__((always_inline)) void dotm_body(const int MM, const int round, int64_t K, const float *x,
                                                            const float *row, float *out)
{
    float32x4_t acc[8][2];
    const float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = vdupq_n_f32(0.0f);
        xs[m] = x + m * K;
    }
    for (int64_t k = 0; k < K; k += 32) {
        float32x4_t v[8];
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(row + k + 4 * i);
            if (round) v[i] = round_bf16(v[i]);
        }
        gemv_fma(MM, xs, k, v, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = vaddvq_f32(vaddq_f32(acc[m][0], acc[m][1]));
}

void at_cpu_gemv_f32_neon(int M, int64_t K, const float *x, at_dtype t, const uint8_t *blocks, int round, float *out)
{
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) round ? gemv_body(MM, AT_Q8_0, 1, K, x, blocks, out) : gemv_body(MM, AT_Q8_0, 0, K, x, blocks, out); \
    else round ? gemv_body(MM, AT_Q4_0, 1, K, x, blocks, out) : gemv_body(MM, AT_Q4_0, 0, K, x, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

void at_cpu_dotm_neon(int M, int64_t K, const float *x, const float *row, int round, float *out)
{
#define D(MM) round ? dotm_body(MM, 1, K, x, row, out) : dotm_body(MM, 0, K, x, row, out);
    AT_QGEMV_BY_M(D)
#undef D
}

/* ---- decode with int8 activations (see cpu_qmatmul.h) ---- */

void at_cpu_quant_x_neon(int64_t n, const float *x, int8_t *q, float *d)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32, q += 32) {
        float32x4_t v[8], mx = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(x + 4 * i);
            mx = vmaxq_f32(mx, vabsq_f32(v[i]));
        }
        float amax = vmaxvq_f32(mx), db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        int16x8_t h[4];
        for (int i = 0; i < 4; i++) /* rint(x / d), |x / d| <= 127 so the narrowing saturates nothing */
            h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i], id))),
                                vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i + 1], id))));
        vst1q_s8(q, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
        vst1q_s8(q + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
    }
}

const at_cpu_qgemv at_cpu_qgemv_neon = {
    .gemv = at_cpu_gemv_f32_neon, .dotm = at_cpu_dotm_neon, .quant_x = at_cpu_quant_x_neon, .gemv_i8 = neon_gemv_i8};
