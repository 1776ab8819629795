/* Vector primitives of the CPU kernels, one table per instruction set.
 *
 * The kernels (cpu_elementwise.c, cpu_norm.c, ...) split tensors into rows or
 * chunks, convert them to f32 and call these primitives on f32 arrays. The
 * primitives are written once as plain C loops (cpu_simd_impl.h) and compiled
 * once per instruction set: baseline (cpu_simd.c), AVX2+FMA+F16C
 * (cpu_simd_avx2.c) and AVX-512 (cpu_simd_avx512.c) on x86-64, Advanced SIMD
 * (cpu_simd_neon.c) on aarch64; at_cpu_simd_get() picks the table from
 * at_cpu_isa_level() at each call, so tests can force every path.
 * Unless said otherwise arrays may not overlap, except y == x where noted. */
#ifndef AT_DEVICE_CPU_CPU_SIMD_H
#define AT_DEVICE_CPU_CPU_SIMD_H

#include <stdint.h>
#include "device/dtype.h"

/* Constants of one AdamW step, computed once per call (see cpu_optim.c). */
typedef struct {
    float grad_scale, beta1, beta2, eps;
    float decay;     /* 1 − lr · weight_decay */
    float step_size; /* lr / (1 − β1^t) */
    float inv_bc2;   /* 1 / sqrt(1 − β2^t) */
} at_cpu_adamw_consts;

typedef struct {
    const char *name;
    /* dst[i] = src[i] converted to f32 (src is f32, bf16 or f16). */
    void (*load)(float *dst, const void *src, at_dtype t, int64_t n);
    /* dst[i] = src[i] converted to t (round to nearest even). */
    void (*store)(void *dst, at_dtype t, const float *src, int64_t n);
    /* y = a + b (y may be a or b) */
    void (*add)(float *y, const float *a, const float *b, int64_t n);
    /* y = s · x (y may be x) */
    void (*scale)(float *y, const float *x, float s, int64_t n);
    /* y += a · x */
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    /* Σ x² and Σ a·b (f32 lanes, then a horizontal sum) */
    float (*sumsq)(const float *x, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);
    /* max x (−inf for n == 0; NaN ignored) */
    float (*max)(const float *x, int64_t n);
    /* Σ exp(x − m); stores exp(x − m) in y when y is not NULL (y may be x). */
    float (*sum_exp)(float *y, const float *x, float m, int64_t n);
    /* y = mul · exp(x − sub) (y may be x) */
    void (*exp_scale)(float *y, const float *x, float sub, float mul, int64_t n);
    /* y = x · r · w (y may be x) */
    void (*rmsnorm_row)(float *y, const float *x, const float *w, float r, int64_t n);
    /* RMSNorm backward of one row: dx = r·(g − x̂·mean(g·x̂)) with g = dy·w,
     * x̂ = x·r; dw_acc += dy·x̂ (dw_acc may be NULL). dx may be dy or x. */
    void (*rmsnorm_bwd_row)(float *dx, float *dw_acc, const float *dy, const float *x, const float *w,
                            float r, int64_t n);
    /* y = silu(g) · u;  dg = dy·u·σ(g)·(1 + g(1 − σ(g))), du = dy·silu(g) (outputs may alias inputs) */
    void (*swiglu_fwd)(float *y, const float *g, const float *u, int64_t n);
    void (*swiglu_bwd)(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n);
    /* One AdamW step on n f32 elements. */
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, const at_cpu_adamw_consts *c);
    /* Rotate one head (rotate_half layout): y[i] = x[i]c − x[i+h]s, y[i+h] = x[i+h]c + x[i]s,
     * with c = cs[i], s = sn[i], h = half. y may be x. */
    void (*rope_row)(float *y, const float *x, const float *cs, const float *sn, int64_t half);
    /* C[m, :N] += Σ_k A(m, k) · B[k, :N] for m < M, k < K, where
     * A(m, k) = a[m·a_rs + k·a_cs] (a transposed A has a_rs = 1) and B's rows are ldb apart. */
    void (*gemm_acc)(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                     int64_t ldb, int64_t M, int64_t N, int64_t K);
} at_cpu_simd;

/* n f32 values rounded to bf16 precision (nearest even), from src into dst
 * (dst may be src): through the table's store and load, 64 at a time. */
static inline void at_cpu_round_bf16(const at_cpu_simd *v, float *dst, const float *src, int64_t n)
{
    uint16_t h[64];
    for (int64_t i = 0; i < n; i += 64) {
        int64_t len = n - i < 64 ? n - i : 64;
        v->store(h, AT_BF16, src + i, len);
        v->load(dst + i, h, AT_BF16, len);
    }
}

/* Address of element i of an array of dtype t (f32, bf16, f16 or i32). */
static inline void *at_cpu_elem(const void *base, at_dtype t, int64_t i)
{
    return (char *)base + i * (int64_t)(t == AT_BF16 || t == AT_F16 ? 2 : 4);
}

/* Elements [off, off + n) of an input as f32: the data itself when it is f32,
 * otherwise converted into buf (n floats). */
static inline const float *at_cpu_in(const at_cpu_simd *v, float *buf, const void *base, at_dtype t, int64_t off,
                                     int64_t n)
{
    if (t == AT_F32) return (const float *)base + off;
    v->load(buf, at_cpu_elem(base, t, off), t, n);
    return buf;
}

/* Where to compute elements [off, off + n) of an output: in place when it is
 * f32, otherwise in buf, written back by at_cpu_out_done. */
static inline float *at_cpu_out(float *buf, void *base, at_dtype t, int64_t off)
{
    return t == AT_F32 ? (float *)base + off : buf;
}

static inline void at_cpu_out_done(const at_cpu_simd *v, const float *buf, void *base, at_dtype t, int64_t off,
                                   int64_t n)
{
    if (t != AT_F32) v->store(at_cpu_elem(base, t, off), t, buf, n);
}

/* Work below this many elements runs on one thread (a parallel region costs
 * microseconds). */
#define AT_CPU_PAR_MIN 32768
/* Elements per chunk of the elementwise kernels (fits L1 several times over). */
#define AT_CPU_CHUNK 2048

/* The table for the current ISA level (static storage). */
const at_cpu_simd *at_cpu_simd_get(void);

/* The tables themselves (for the dispatcher; the AVX ones exist on x86-64 only). */
extern const at_cpu_simd at_cpu_simd_scalar;
extern const at_cpu_simd at_cpu_simd_avx2;
extern const at_cpu_simd at_cpu_simd_avx512;
extern const at_cpu_simd at_cpu_simd_neon; /* aarch64 only */

#endif
