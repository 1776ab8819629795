/* NEON helpers shared by gemm_neon.c, gemm_neon_bf16.c and cpu_qmatmul_neon.c
 * (static inline; aarch64 only). */
#ifndef AT_DEVICE_CPU_GEMM_NEON_INL_H
#define AT_DEVICE_CPU_GEMM_NEON_INL_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "device/dtype.h"

/* Rounds f32 lanes to the nearest bf16 value (ties to even), NaN kept quiet. */
static inline float32x4_t round_bf16(float32x4_t v)
{
    uint32x4_t u = vreinterpretq_u32_f32(v);
    uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), odd));
    r = vbslq_u32(vceqq_f32(v, v), r, vorrq_u32(u, vdupq_n_u32(0x00400000)));
    return vreinterpretq_f32_u32(vandq_u32(r, vdupq_n_u32(0xffff0000u)));
}

/* p[0..4) = alpha·v + beta·p (p not read when beta is 0): a row of a tile of C. */
static inline void store4(float *p, float32x4_t v, float alpha, float beta)
{
    float32x4_t r = vmulq_n_f32(v, alpha);
    if (beta != 0.0f) r = vfmaq_n_f32(r, vld1q_f32(p), beta);
    vst1q_f32(p, r);
}

/* 4 values of type t (f32, bf16 or f16) at p as f32 (all 4 are read). */
static inline __attribute__((always_inline)) float32x4_t load4_full(const char *p, const at_dtype t)
{
    if (t == AT_F32) return vld1q_f32((const float *)p);
    if (t == AT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p), 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}

/* The first `left` (clamped to 0..4) values of type t at p, the rest 0;
 * rounded to bf16 when round. A partial vector goes through a zeroed copy. */
static inline __attribute__((always_inline)) float32x4_t load4(const char *p, const at_dtype t, int64_t left,
                                                               const int round)
{
    float32x4_t v;
    if (left >= 4) v = load4_full(p, t);
    else {
        char tmp[16] = {0};
        if (left > 0) memcpy(tmp, p, (size_t)left * (t == AT_F32 ? 4 : 2));
        v = load4_full(tmp, t);
    }
    return round ? round_bf16(v) : v;
}

#endif
