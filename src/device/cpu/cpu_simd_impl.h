/* The body of the vector primitives (see cpu_simd.h), included once per
 * instruction set by cpu_simd.c, cpu_simd_avx2.c, cpu_simd_avx512.c and
 * cpu_simd_neon.c with AT_SIMD_TABLE (the table's name) and AT_SIMD_NAME
 * defined; AT_SIMD_PLAIN (cpu_simd.c on aarch64) keeps it free of vectors.
 *
 * Plain C loops under `omp simd`, which lets the compiler vectorize them
 * (reductions included) for the flags the including file is compiled with.
 * exp is a branch-free polynomial so it vectorizes too. Conversions from and
 * to f16 use F16C / AVX-512 instructions when the file is compiled for them. */
#if !defined(AT_SIMD_TABLE) || !defined(AT_SIMD_NAME)
#error "define AT_SIMD_TABLE and AT_SIMD_NAME before including cpu_simd_impl.h"
#endif

/* `omp simd` asks for vectorization; where clang cannot deliver it (e.g.
 * under the sanitizers) the scalar loop is still correct, so that is not a
 * warning here. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "device/cpu/cpu_simd.h"
#include "device/dtype.h"
#if defined(__SSE2__)
#include <immintrin.h>
#elif defined(__aarch64__) && !defined(AT_SIMD_PLAIN)
#include <arm_neon.h>
#endif

/* Fused multiply-add where the build has it: GCC does not contract a·b + c
 * in ISO C mode, and without FMA hardware fmaf would be a library call. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define FMA(a, b, c) fmaf((a), (b), (c))
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

/* Explicit vectors for the few loops the compiler cannot vectorize by
 * itself (sqrt: libm's errno handling blocks it). */
#if defined(__AVX512F__)
typedef __m512 vf;
#define VL 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VSQRT _mm512_sqrt_ps
#define VFMA _mm512_fmadd_ps
#define VMAX _mm512_max_ps
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vf;
#define VL 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VSQRT _mm256_sqrt_ps
#define VFMA _mm256_fmadd_ps
#define VMAX _mm256_max_ps
#elif defined(__SSE2__)
typedef __m128 vf;
#define VL 4
#define VLOAD _mm_loadu_ps
#define VSTORE _mm_storeu_ps
#define VSET1 _mm_set1_ps
#define VADD _mm_add_ps
#define VSUB _mm_sub_ps
#define VMUL _mm_mul_ps
#define VDIV _mm_div_ps
#define VSQRT _mm_sqrt_ps
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps((a), (b)), (c))
#define VMAX _mm_max_ps
#elif defined(__aarch64__) && !defined(AT_SIMD_PLAIN)
typedef float32x4_t vf;
#define VL 4
#define VLOAD vld1q_f32
#define VSTORE vst1q_f32
#define VSET1 vdupq_n_f32
#define VADD vaddq_f32
#define VSUB vsubq_f32
#define VMUL vmulq_f32
#define VDIV vdivq_f32
#define VSQRT vsqrtq_f32
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))
#define VMAX vmaxnmq_f32 /* the number when one side is NaN, as VMAX's users expect */
#endif

#if defined(VL)
static inline float vhsum(vf v)
{
    float t[VL];
    VSTORE(t, v);
    float s = 0;
    for (int i = 0; i < VL; i++) s += t[i];
    return s;
}

static inline float vhmax(vf v)
{
    float t[VL];
    VSTORE(t, v);
    float m = t[0];
    for (int i = 1; i < VL; i++) m = t[i] > m ? t[i] : m;
    return m;
}
#endif

typedef union {
    float f;
    int32_t i;
    uint32_t u;
} fbits;

/* exp(x) = 2^n · e^r with n = round(x·log2 e), |r| ≤ ln2/2 (Cody–Waite split
 * of ln 2), e^r by the Cephes degree-6 polynomial: about 1 ulp. Inputs below
 * −87 give 0 (exp(−inf) = 0), above 88 saturate near FLT_MAX, NaN stays NaN.
 * Rounding uses the 1.5·2^23 trick so no libm call blocks vectorization. */
static inline float vexp(float x)
{
    float xc = x > -87.0f ? x : -87.0f; /* also maps NaN to a finite value: the cast below is defined */
    xc = xc < 88.0f ? xc : 88.0f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = FMA(n, -0.693359375f, xc);
    r = FMA(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = FMA(p, r, 1.3981999507e-3f);
    p = FMA(p, r, 8.3334519073e-3f);
    p = FMA(p, r, 4.1665795894e-2f);
    p = FMA(p, r, 1.6666665459e-1f);
    p = FMA(p, r, 5.0000001201e-1f);
    p = FMA(p * r, r, r + 1.0f);
    fbits s;
    s.i = ((int32_t)n + 127) << 23;
    float y = p * s.f;
    y = x < -87.0f ? 0.0f : y;
    return x != x ? x : y;
}

static inline float vsigmoid(float x) { return 1.0f / (1.0f + vexp(-x)); }

#if defined(VL)
/* vexp on a vector: the same steps, with the ISA's rounding and selects
 * (compilers turn the scalar selects into slow predicated code). */
static inline vf vexpv(vf x)
{
#if defined(__AVX512F__)
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)); /* NaN → −87 */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX2__)
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__aarch64__)
    float32x4_t xc = vminnmq_f32(vmaxnmq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f)); /* NaN → −87 */
    float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));
#else
    __m128 xc = _mm_min_ps(_mm_max_ps(x, _mm_set1_ps(-87.0f)), _mm_set1_ps(88.0f));
    __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(1.44269504088896341f)), _mm_set1_ps(12582912.0f)),
                          _mm_set1_ps(12582912.0f));
#endif
    vf r = VFMA(n, VSET1(-0.693359375f), xc);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    vf p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VFMA(VMUL(p, r), r, VADD(r, VSET1(1.0f)));
#if defined(__AVX512F__)
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ), y); /* underflow → 0 */
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);                 /* NaN stays */
#elif defined(__AVX2__)
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
#elif defined(__aarch64__)
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    y = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), vcgeq_f32(x, vdupq_n_f32(-87.0f))));
    return vbslq_f32(vceqq_f32(x, x), y, x); /* NaN stays */
#else
    __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
    __m128 y = _mm_mul_ps(p, _mm_castsi128_ps(e));
    y = _mm_and_ps(y, _mm_cmpge_ps(x, _mm_set1_ps(-87.0f)));
    __m128 nan = _mm_cmpunord_ps(x, x);
    return _mm_or_ps(_mm_andnot_ps(nan, y), _mm_and_ps(nan, x));
#endif
}

static inline vf vsigmoidv(vf x)
{
    vf one = VSET1(1.0f);
    return VDIV(one, VADD(one, vexpv(VSUB(VSET1(0.0f), x))));
}
#endif

static inline uint16_t vbf16(float f)
{
    fbits b;
    b.f = f;
    uint32_t u = b.u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static void load_f32(float *dst, const void *src, at_dtype t, int64_t n)
{
    if (t == AT_F32) {
        if (dst != src) memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (t == AT_BF16) {
        const uint16_t *s = src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            fbits b;
            b.u = (uint32_t)s[i] << 16;
            dst[i] = b.f;
        }
    } else {
        const uint16_t *s = src;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
        for (; i < n; i++) dst[i] = at_f16_to_f32(s[i]);
    }
}

static void store_f32(void *dst, at_dtype t, const float *src, int64_t n)
{
    if (t == AT_F32) {
        if (dst != src) memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (t == AT_BF16) {
        uint16_t *d = dst;
        int64_t i = 0;
        /* round to nearest even: u + 0x7fff + lsb, NaN kept quiet */
#if defined(__AVX512F__)
        const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), q = _mm512_set1_epi32(0x40);
        for (; i + 16 <= n; i += 16) {
            __m512 x = _mm512_loadu_ps(src + i);
            __m512i u = _mm512_castps_si512(x);
            __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            r = _mm512_srli_epi32(r, 16);
            r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_or_si512(_mm512_srli_epi32(u, 16), q));
            _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r));
        }
#elif defined(__AVX2__)
        const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), q = _mm256_set1_epi32(0x40);
        for (; i + 16 <= n; i += 16) {
            __m256i rr[2];
            for (int h = 0; h < 2; h++) {
                __m256 x = _mm256_loadu_ps(src + i + 8 * h);
                __m256i u = _mm256_castps_si256(x);
                __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
                r = _mm256_srli_epi32(r, 16);
                __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
                rr[h] = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), q), nan);
            }
            /* packus works within 128-bit lanes: put the quadwords back in order */
            __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(rr[0], rr[1]), 0xd8);
            _mm256_storeu_si256((__m256i *)(d + i), pk);
        }
#endif
        for (; i < n; i++) d[i] = vbf16(src[i]);
    } else {
        uint16_t *d = dst;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i),
                                _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
        for (; i < n; i++) d[i] = at_f32_to_f16(src[i]);
    }
}

static void add_f32(float *y, const float *a, const float *b, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static void scale_f32(float *y, const float *x, float s, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = s * x[i];
}

static void axpy_f32(float *restrict y, float a, const float *restrict x, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = FMA(a, x[i], y[i]);
}

/* Reductions by hand with four vector accumulators: compilers do not all
 * vectorize fmaf or max reductions on their own. VMAX(x, m) keeps m when x
 * is NaN. */
static float sumsq_f32(const float *x, int64_t n)
{
    int64_t i = 0;
    float s = 0;
#if defined(VL)
    vf a0 = VSET1(0), a1 = VSET1(0), a2 = VSET1(0), a3 = VSET1(0);
    for (; i + 4 * VL <= n; i += 4 * VL) {
        vf x0 = VLOAD(x + i), x1 = VLOAD(x + i + VL), x2 = VLOAD(x + i + 2 * VL), x3 = VLOAD(x + i + 3 * VL);
        a0 = VFMA(x0, x0, a0);
        a1 = VFMA(x1, x1, a1);
        a2 = VFMA(x2, x2, a2);
        a3 = VFMA(x3, x3, a3);
    }
    for (; i + VL <= n; i += VL) {
        vf x0 = VLOAD(x + i);
        a0 = VFMA(x0, x0, a0);
    }
    s = vhsum(VADD(VADD(a0, a1), VADD(a2, a3)));
#endif
    for (; i < n; i++) s = FMA(x[i], x[i], s);
    return s;
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
    float s = 0;
#if defined(VL)
    vf a0 = VSET1(0), a1 = VSET1(0), a2 = VSET1(0), a3 = VSET1(0);
    for (; i + 4 * VL <= n; i += 4 * VL) {
        a0 = VFMA(VLOAD(a + i), VLOAD(b + i), a0);
        a1 = VFMA(VLOAD(a + i + VL), VLOAD(b + i + VL), a1);
        a2 = VFMA(VLOAD(a + i + 2 * VL), VLOAD(b + i + 2 * VL), a2);
        a3 = VFMA(VLOAD(a + i + 3 * VL), VLOAD(b + i + 3 * VL), a3);
    }
    for (; i + VL <= n; i += VL) a0 = VFMA(VLOAD(a + i), VLOAD(b + i), a0);
    s = vhsum(VADD(VADD(a0, a1), VADD(a2, a3)));
#endif
    for (; i < n; i++) s = FMA(a[i], b[i], s);
    return s;
}

static float max_f32(const float *x, int64_t n)
{
    int64_t i = 0;
    float m = -INFINITY;
#if defined(VL)
    vf m0 = VSET1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 4 * VL <= n; i += 4 * VL) {
        m0 = VMAX(VLOAD(x + i), m0);
        m1 = VMAX(VLOAD(x + i + VL), m1);
        m2 = VMAX(VLOAD(x + i + 2 * VL), m2);
        m3 = VMAX(VLOAD(x + i + 3 * VL), m3);
    }
    for (; i + VL <= n; i += VL) m0 = VMAX(VLOAD(x + i), m0);
    m = vhmax(VMAX(VMAX(m0, m1), VMAX(m2, m3)));
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static float sum_exp_f32(float *y, const float *x, float m, int64_t n)
{
    int64_t i = 0;
    float s = 0;
#if defined(VL)
    vf acc = VSET1(0.0f), vm = VSET1(m);
    for (; i + VL <= n; i += VL) {
        vf e = vexpv(VSUB(VLOAD(x + i), vm));
        if (y) VSTORE(y + i, e);
        acc = VADD(acc, e);
    }
    s = vhsum(acc);
#endif
    for (; i < n; i++) {
        float e = vexp(x[i] - m);
        if (y) y[i] = e;
        s += e;
    }
    return s;
}

static void exp_scale_f32(float *y, const float *x, float sub, float mul, int64_t n)
{
    int64_t i = 0;
#if defined(VL)
    vf vs = VSET1(sub), vmul = VSET1(mul);
    for (; i + VL <= n; i += VL) VSTORE(y + i, VMUL(vmul, vexpv(VSUB(VLOAD(x + i), vs))));
#endif
    for (; i < n; i++) y[i] = mul * vexp(x[i] - sub);
}

static void rmsnorm_row_f32(float *y, const float *x, const float *w, float r, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void rmsnorm_bwd_row_f32(float *dx, float *dw_acc, const float *dy, const float *x, const float *w,
                                float r, int64_t n)
{
    /* mean(g·x̂) = r · Σ dy·w·x / n */
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += dy[i] * w[i] * x[i];
    float c = r * r * s / (float)n; /* x̂ · mean(g·x̂) = x · c */
    if (dw_acc) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dw_acc[i] += dy[i] * x[i] * r;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dx[i] = r * (dy[i] * w[i] - x[i] * c);
}

/* Prefetch of a stream 1 KiB ahead, for loops with enough arithmetic per
 * value (sigmoid) that the hardware prefetchers fall behind on rows that
 * come from memory (swiglu over 512 x 4864 f32: 10 MB a stream). Never
 * faults, past the end included. */
#define AHEAD(p) __builtin_prefetch((const char *)(p) + 1024)

static void swiglu_fwd_f32(float *y, const float *g, const float *u, int64_t n)
{
    int64_t i = 0;
#if defined(VL)
    for (; i + VL <= n; i += VL) {
        AHEAD(g + i);
        AHEAD(u + i);
        AHEAD(y + i);
        vf gi = VLOAD(g + i);
        VSTORE(y + i, VMUL(VMUL(gi, vsigmoidv(gi)), VLOAD(u + i)));
    }
#endif
    for (; i < n; i++) y[i] = g[i] * vsigmoid(g[i]) * u[i];
}

static void swiglu_bwd_f32(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n)
{
    int64_t i = 0;
#if defined(VL)
    const vf one = VSET1(1.0f);
    for (; i + VL <= n; i += VL) {
        AHEAD(g + i);
        AHEAD(u + i);
        AHEAD(dy + i);
        AHEAD(dg + i);
        AHEAD(du + i);
        vf gi = VLOAD(g + i), ui = VLOAD(u + i), d = VLOAD(dy + i);
        vf sg = vsigmoidv(gi);
        vf a = VMUL(VMUL(VMUL(d, ui), sg), VFMA(gi, VSUB(one, sg), one));
        vf b = VMUL(VMUL(d, gi), sg);
        VSTORE(dg + i, a);
        VSTORE(du + i, b);
    }
#endif
    for (; i < n; i++) {
        float gi = g[i], ui = u[i], d = dy[i];
        float sg = vsigmoid(gi);
        float a = d * ui * sg * (1.0f + gi * (1.0f - sg));
        float b = d * gi * sg;
        dg[i] = a;
        du[i] = b;
    }
}

/* As torch.optim.AdamW (single tensor): p ← p(1 − lr·wd); m ← lerp(m, g, 1 − β1);
 * v ← β2 v + (1 − β2) g²; p ← p − step_size · m / (sqrt(v)/sqrt(bc2) + eps). */
static void adamw_f32(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, int64_t n,
                      const at_cpu_adamw_consts *c)
{
    const float gs = c->grad_scale, b1 = c->beta1, b2 = c->beta2, eps = c->eps;
    const float decay = c->decay, step = c->step_size, ibc2 = c->inv_bc2;
    int64_t i = 0;
#if defined(VL)
    const vf vgs = VSET1(gs), vb1c = VSET1(1.0f - b1), vb2 = VSET1(b2), vb2c = VSET1(1.0f - b2);
    const vf veps = VSET1(eps), vdecay = VSET1(decay), vstep = VSET1(step), vibc2 = VSET1(ibc2);
    for (; i + VL <= n; i += VL) {
        vf gi = VMUL(vgs, VLOAD(g + i));
        vf mo = VLOAD(m + i), vo = VLOAD(v + i);
        vf mi = VFMA(vb1c, VSUB(gi, mo), mo);
        vf vi = VFMA(vb2c, VMUL(gi, gi), VMUL(vb2, vo));
        VSTORE(m + i, mi);
        VSTORE(v + i, vi);
        vf denom = VFMA(VSQRT(vi), vibc2, veps);
        VSTORE(p + i, VSUB(VMUL(VLOAD(p + i), vdecay), VDIV(VMUL(vstep, mi), denom)));
    }
#endif
    for (; i < n; i++) {
        float gi = gs * g[i];
        float mi = FMA(1.0f - b1, gi - m[i], m[i]);
        float vi = FMA(1.0f - b2, gi * gi, b2 * v[i]);
        m[i] = mi;
        v[i] = vi;
        float denom = FMA(sqrtf(vi), ibc2, eps);
        p[i] = p[i] * decay - step * mi / denom;
    }
}

static void rope_row_f32(float *y, const float *x, const float *cs, const float *sn, int64_t half)
{
    /* y may be x: read both halves before writing either. */
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        y[i] = a * cs[i] - b * sn[i];
        y[i + half] = b * cs[i] + a * sn[i];
    }
}

#if defined(VL)
/* A register-blocked micro-kernel: a 4-row × 2-vector tile of C stays in
 * registers over all of K (per k: two loads of B, four broadcasts of A,
 * eight multiply-adds); with 32 vector registers (AVX-512) 8 rows first,
 * sixteen multiply-adds per two loads of B (attention's 64 x 64 tiles ran
 * bound by the loads). Each element still adds its products in k order,
 * whatever the blocking. Edges: single rows, single vectors, then scalar
 * columns. */
static void gemm_acc_f32(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                         int64_t ldb, int64_t M, int64_t N, int64_t K)
{
    int64_t n0 = 0;
    for (; n0 + 2 * VL <= N; n0 += 2 * VL) {
        int64_t m = 0;
#if VL >= 16
        for (; m + 8 <= M; m += 8) {
#define GA_LOAD(r) vf x##r##0 = VLOAD(c + (m + r) * ldc + n0), x##r##1 = VLOAD(c + (m + r) * ldc + n0 + VL);
#define GA_FMA(r)                                                                                                      \
    s = VSET1(a[(m + r) * a_rs + ka]);                                                                                 \
    x##r##0 = VFMA(s, b0, x##r##0);                                                                                    \
    x##r##1 = VFMA(s, b1, x##r##1);
#define GA_STORE(r)                                                                                                    \
    VSTORE(c + (m + r) * ldc + n0, x##r##0);                                                                           \
    VSTORE(c + (m + r) * ldc + n0 + VL, x##r##1);
#define GA_ROWS(M_) M_(0) M_(1) M_(2) M_(3) M_(4) M_(5) M_(6) M_(7)
            GA_ROWS(GA_LOAD)
            for (int64_t k = 0; k < K; k++) {
                const float *bk = b + k * ldb + n0;
                vf b0 = VLOAD(bk), b1 = VLOAD(bk + VL), s;
                int64_t ka = k * a_cs;
                GA_ROWS(GA_FMA)
            }
            GA_ROWS(GA_STORE)
#undef GA_ROWS
#undef GA_STORE
#undef GA_FMA
#undef GA_LOAD
        }
#endif
        for (; m + 4 <= M; m += 4) {
            float *c0 = c + m * ldc + n0, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
            const float *a0 = a + m * a_rs, *a1 = a0 + a_rs, *a2 = a1 + a_rs, *a3 = a2 + a_rs;
            vf x00 = VLOAD(c0), x01 = VLOAD(c0 + VL), x10 = VLOAD(c1), x11 = VLOAD(c1 + VL);
            vf x20 = VLOAD(c2), x21 = VLOAD(c2 + VL), x30 = VLOAD(c3), x31 = VLOAD(c3 + VL);
            for (int64_t k = 0; k < K; k++) {
                const float *bk = b + k * ldb + n0;
                vf b0 = VLOAD(bk), b1 = VLOAD(bk + VL), s;
                int64_t ka = k * a_cs;
                s = VSET1(a0[ka]);
                x00 = VFMA(s, b0, x00);
                x01 = VFMA(s, b1, x01);
                s = VSET1(a1[ka]);
                x10 = VFMA(s, b0, x10);
                x11 = VFMA(s, b1, x11);
                s = VSET1(a2[ka]);
                x20 = VFMA(s, b0, x20);
                x21 = VFMA(s, b1, x21);
                s = VSET1(a3[ka]);
                x30 = VFMA(s, b0, x30);
                x31 = VFMA(s, b1, x31);
            }
            VSTORE(c0, x00);
            VSTORE(c0 + VL, x01);
            VSTORE(c1, x10);
            VSTORE(c1 + VL, x11);
            VSTORE(c2, x20);
            VSTORE(c2 + VL, x21);
            VSTORE(c3, x30);
            VSTORE(c3 + VL, x31);
        }
        for (; m < M; m++) {
            float *c0 = c + m * ldc + n0;
            const float *a0 = a + m * a_rs;
            vf x00 = VLOAD(c0), x01 = VLOAD(c0 + VL);
            for (int64_t k = 0; k < K; k++) {
                const float *bk = b + k * ldb + n0;
                vf s = VSET1(a0[k * a_cs]);
                x00 = VFMA(s, VLOAD(bk), x00);
                x01 = VFMA(s, VLOAD(bk + VL), x01);
            }
            VSTORE(c0, x00);
            VSTORE(c0 + VL, x01);
        }
    }
    for (; n0 + VL <= N; n0 += VL) {
        for (int64_t m = 0; m < M; m++) {
            float *c0 = c + m * ldc + n0;
            const float *a0 = a + m * a_rs;
            vf x00 = VLOAD(c0);
            for (int64_t k = 0; k < K; k++) x00 = VFMA(VSET1(a0[k * a_cs]), VLOAD(b + k * ldb + n0), x00);
            VSTORE(c0, x00);
        }
    }
    if (n0 < N) {
        for (int64_t m = 0; m < M; m++) {
            float *cr = c + m * ldc;
            const float *ar = a + m * a_rs;
            for (int64_t k = 0; k < K; k++) {
                float ak = ar[k * a_cs];
                const float *bk = b + k * ldb;
                for (int64_t n = n0; n < N; n++) cr[n] = FMA(ak, bk[n], cr[n]);
            }
        }
    }
}
#else
/* Row by row: C[m, :] += Σ_k A(m, k) B[k, :], four k at a time so each pass
 * over the C row does four multiply-adds per element. */
static void gemm_acc_f32(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                         int64_t ldb, int64_t M, int64_t N, int64_t K)
{
    for (int64_t m = 0; m < M; m++) {
        float *restrict cr = c + m * ldc;
        const float *ar = a + m * a_rs;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
            float a0 = ar[k * a_cs], a1 = ar[(k + 1) * a_cs], a2 = ar[(k + 2) * a_cs], a3 = ar[(k + 3) * a_cs];
            const float *restrict b0 = b + k * ldb, *restrict b1 = b0 + ldb, *restrict b2 = b1 + ldb,
                                  *restrict b3 = b2 + ldb;
#pragma omp simd
            for (int64_t n = 0; n < N; n++) cr[n] = FMA(a3, b3[n], FMA(a2, b2[n], FMA(a1, b1[n], FMA(a0, b0[n], cr[n]))));
        }
        for (; k < K; k++) {
            float a0 = ar[k * a_cs];
            const float *restrict b0 = b + k * ldb;
#pragma omp simd
            for (int64_t n = 0; n < N; n++) cr[n] = FMA(a0, b0[n], cr[n]);
        }
    }
}
#endif

const at_cpu_simd AT_SIMD_TABLE = {
    .name = AT_SIMD_NAME,
    .load = load_f32,
    .store = store_f32,
    .add = add_f32,
    .scale = scale_f32,
    .axpy = axpy_f32,
    .sumsq = sumsq_f32,
    .dot = dot_f32,
    .max = max_f32,
    .sum_exp = sum_exp_f32,
    .exp_scale = exp_scale_f32,
    .rmsnorm_row = rmsnorm_row_f32,
    .rmsnorm_bwd_row = rmsnorm_bwd_row_f32,
    .swiglu_fwd = swiglu_fwd_f32,
    .swiglu_bwd = swiglu_bwd_f32,
    .adamw = adamw_f32,
    .rope_row = rope_row_f32,
    .gemm_acc = gemm_acc_f32,
};
