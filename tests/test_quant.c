/* Quantized formats and the quantized matmul.
 *
 *  - layouts, bit for bit, against tests/data/quant/ (tools/make_quant_goldens.py:
 *    ggml's reference quantizers for q8_0 / q4_0, bitsandbytes' NF4 rules and
 *    tables, restated in numpy / torch);
 *  - NF4 on Gaussian weights: the error is what the format promises (bounds
 *    below, with the reason for each);
 *  - the quantized matmul equals "dequantize, then an f32 matmul" (the
 *    reference kernel, in double) within 1e-5 relative, for the forward
 *    (x · Wᵀ) and the input backward (dy · W), awkward sizes, every ISA level;
 *  - bad input gets a clear error. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/rng.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/quant.h"
#include "device/ref/ref_ops.h"
#include "ops/ops.h"
#include "testing.h"

#define DATA "tests/data/quant/"
#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* The whole file; *n gets its size. NULL (and a failed check) when missing. */
static void *slurp(const char *name, size_t *n)
{
    char path[256];
    snprintf(path, sizeof path, DATA "%s", name);
    char *buf = NULL;
    size_t len = 0;
    at_status st = at_read_file(path, &buf, &len);
    CHECK_MSG(st == AT_OK, "%s: %s", path, at_last_error());
    if (n) *n = len;
    return buf;
}

static at_tensor *tensor(at_dtype t, int ndim, const int64_t *shape, const char *name)
{
    at_tensor *x = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), t, ndim, shape, name, &x));
    return x;
}

static int bytes_equal(const void *a, const void *b, size_t n, const char *what)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            fprintf(stderr, "%s: byte %zu is 0x%02x, expected 0x%02x\n", what, i, x[i], y[i]);
            return 0;
        }
    }
    return 1;
}

/* ---- code books ---- */

static void test_tables(void)
{
    size_t n = 0;
    float *nf4 = slurp("nf4_code.f32", &n);
    CHECK(n == sizeof at_nf4_code && nf4 && bytes_equal(nf4, at_nf4_code, n, "nf4 code book"));
    float *dyn = slurp("dyn8_code.f32", &n);
    CHECK(n == sizeof at_dyn8_code && dyn && bytes_equal(dyn, at_dyn8_code, n, "dynamic 8-bit map"));
    int ascending = 1;
    for (int i = 1; i < 256; i++) ascending &= at_dyn8_code[i] > at_dyn8_code[i - 1];
    for (int i = 1; i < 16; i++) ascending &= at_nf4_code[i] > at_nf4_code[i - 1];
    CHECK(ascending);
    CHECK(at_dyn8_code[127] == 0.0f && at_dyn8_code[255] == 1.0f && at_nf4_code[7] == 0.0f);
    free(nf4);
    free(dyn);
}

/* ---- q8_0 / q4_0: ggml's bytes ---- */

static void test_ggml_blocks(at_dtype dt, const char *bin, const char *deq_name)
{
    size_t nin = 0, nbin = 0, ndeq = 0;
    float *x = slurp("q_input.f32", &nin);
    uint8_t *want = slurp(bin, &nbin);
    float *want_deq = slurp(deq_name, &ndeq);
    if (!x || !want || !want_deq) goto done;
    at_tensor *src = tensor(AT_F32, 2, SH(64, 96), "q_input");
    at_tensor *q = tensor(dt, 2, SH(64, 96), "q");
    at_tensor *back = tensor(AT_F32, 2, SH(64, 96), "back");
    memcpy(at_tensor_data(src), x, nin);
    CHECK(at_tensor_nbytes(q) == nbin);
    CHECK_OK(at_quantize(q, src));
    CHECK_MSG(bytes_equal(at_tensor_data(q), want, nbin, bin), "%s blocks differ from ggml's", at_dtype_name(dt));
    CHECK_OK(at_dequantize(back, q));
    CHECK_MSG(bytes_equal(at_tensor_data(back), want_deq, ndeq, deq_name), "%s dequantized values differ",
              at_dtype_name(dt));
    if (dt == AT_Q8_0) {
        /* q = round(x / d) with d = amax/127: |x − q·d| ≤ d/2; d is stored
         * as f16 (relative error ≤ 2^-11), which moves q·d by ≤ 127·d·2^-11
         * more: in all ≤ 0.5625·d per block */
        const float *y = at_tensor_data(back);
        double worst = 0;
        for (int b = 0; b < 64 * 96 / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            double d = amax / 127.0;
            for (int j = 0; j < 32; j++) {
                double e = fabs((double)x[b * 32 + j] - y[b * 32 + j]);
                if (d > 0 && e / d > worst) worst = e / d;
                if (d == 0) CHECK(e == 0);
            }
        }
        CHECK_MSG(worst <= 0.5625, "q8_0 max error %.4f·d", worst);
        printf("q8_0: max error %.4f·d per block (bound 0.5625·d)\n", worst);
    }
    /* bf16 input: the same bytes as the f32 values it holds */
    at_tensor *bf = tensor(AT_BF16, 2, SH(64, 96), "bf");
    at_tensor *rounded = tensor(AT_F32, 2, SH(64, 96), "rounded");
    at_tensor *q2 = tensor(dt, 2, SH(64, 96), "q2");
    for (int i = 0; i < 64 * 96; i++) {
        uint16_t h = at_f32_to_bf16(x[i]);
        ((uint16_t *)at_tensor_data(bf))[i] = h;
        ((float *)at_tensor_data(rounded))[i] = at_bf16_to_f32(h);
    }
    CHECK_OK(at_quantize(q, rounded));
    CHECK_OK(at_quantize(q2, bf));
    CHECK(memcmp(at_tensor_data(q), at_tensor_data(q2), at_tensor_nbytes(q)) == 0);
    at_tensor_free(bf);
    at_tensor_free(rounded);
    at_tensor_free(q2);
    at_tensor_free(src);
    at_tensor_free(q);
    at_tensor_free(back);
done:
    free(x);
    free(want);
    free(want_deq);
}

/* ---- NF4: bitsandbytes' bytes ---- */

static void test_nf4_goldens(void)
{
    size_t n = 0, npk = 0, nam = 0, nqa = 0, na2 = 0, noff = 0, nd = 0, ndn = 0;
    float *x = slurp("nf4_input.f32", &n);
    uint8_t *pk = slurp("nf4_packed.u8", &npk);
    float *am = slurp("nf4_absmax.f32", &nam);
    uint8_t *qa = slurp("nf4_dq_qabsmax.u8", &nqa);
    float *a2 = slurp("nf4_dq_absmax2.f32", &na2);
    float *off = slurp("nf4_dq_offset.f32", &noff);
    float *deq = slurp("nf4_deq.f32", &nd);
    float *deq_nodq = slurp("nf4_deq_nodq.f32", &ndn);
    const int64_t N = 20400, NB = 319, NG = 2;
    uint8_t packed[NB * 32], codes[NB];
    float absmax[NB], absmax2[NG], offset = 0, *y = malloc(N * sizeof(float));
    if (!x || !pk || !am || !qa || !a2 || !off || !deq || !deq_nodq || !y) goto done;
    CHECK(n == N * 4 && npk == NB * 32 && nam == NB * 4 && nqa == NB && na2 == NG * 4 && nd == N * 4);

    /* without double quantization: bitsandbytes' quantize_4bit */
    at_nf4_quantize_blocks(x, N, packed, absmax);
    CHECK_MSG(bytes_equal(packed, pk, sizeof packed, "nf4 packed"), "nf4 nibbles differ from bitsandbytes'");
    CHECK(bytes_equal(absmax, am, sizeof absmax, "nf4 absmax"));
    at_nf4_dequantize_blocks(packed, absmax, N, y);
    CHECK(bytes_equal(y, deq_nodq, N * 4, "nf4 dequantized (no double quant)"));
    /* the double quantization of absmax */
    at_nf4_compress_absmax(absmax, NB, codes, absmax2, &offset);
    CHECK(bytes_equal(codes, qa, NB, "absmax codes") && bytes_equal(absmax2, a2, sizeof absmax2, "absmax2"));
    CHECK(memcmp(&offset, off, 4) == 0);

    /* the tensor: header + the same arrays; dequantizes to the golden values */
    at_tensor *src = tensor(AT_F32, 2, SH(17, 1200), "nf4_input");
    at_tensor *q = tensor(AT_NF4, 2, SH(17, 1200), "w.nf4");
    at_tensor *back = tensor(AT_F32, 2, SH(17, 1200), "back");
    memcpy(at_tensor_data(src), x, n);
    CHECK(at_tensor_nbytes(q) == at_nf4_nbytes(N) && at_nf4_nbytes(N) == 16 + 33 * 319 + 1 + 4 * 2);
    CHECK_OK(at_quantize(q, src));
    at_nf4_parts parts;
    CHECK_OK(at_nf4_parts_of(q, &parts));
    CHECK(parts.nblocks == NB && memcmp(&parts.offset, off, 4) == 0);
    CHECK(bytes_equal(parts.nibbles, pk, sizeof packed, "tensor nibbles") &&
          bytes_equal(parts.codes, qa, NB, "tensor codes") &&
          bytes_equal(parts.absmax2, a2, sizeof absmax2, "tensor absmax2"));
    CHECK(((uintptr_t)parts.absmax2 - (uintptr_t)at_tensor_data(q)) % 4 == 0);
    CHECK_OK(at_dequantize(back, q));
    CHECK_MSG(bytes_equal(at_tensor_data(back), deq, nd, "nf4 dequantized"), "nf4 dequantization differs");
    at_tensor_free(src);
    at_tensor_free(q);
    at_tensor_free(back);
done:
    free(x), free(pk), free(am), free(qa), free(a2), free(off), free(deq), free(deq_nodq), free(y);
}

/* ---- NF4 on Gaussian weights ---- */

static void test_nf4_gaussian(void)
{
    /* 2^16 values of N(0, 1) (1024 blocks, 4 absmax groups).
     * - Per value, the nearest code is at most half the widest gap of the
     *   code book away: (1 − 0.7229568)/2 ... the widest is −1 → −0.6961928,
     *   0.3038/2 = 0.1519 of the block's absmax (no double quantization).
     * - Mean |error| / σ: NF4 puts the 16 codes at quantiles of a normal, so
     *   for Gaussian weights with 64-value blocks (absmax ≈ 2.4σ) it is
     *   ≈ 0.073 (bitsandbytes' own test accepts < 0.1 for absolute error at
     *   σ = 1); we require 0.06..0.08, which a broken quantizer (wrong code,
     *   wrong nibble, wrong scale) leaves and an exact copy falls below.
     * - Double quantization of the scales costs < 0.5 % more error (QLoRA
     *   reports no loss in quality). */
    const int64_t N = 1 << 16;
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *packed = malloc(N / 2);
    float *absmax = malloc(N / 64 * sizeof(float));
    at_rng r;
    at_rng_seed(&r, 7);
    for (int64_t i = 0; i < N; i++) x[i] = (float)at_rng_normal(&r);
    at_nf4_quantize_blocks(x, N, packed, absmax);
    at_nf4_dequantize_blocks(packed, absmax, N, y);
    double sum = 0, sum2 = 0, worst = 0, mean_x = 0;
    for (int64_t i = 0; i < N; i++) mean_x += x[i];
    mean_x /= N;
    for (int64_t i = 0; i < N; i++) {
        double e = fabs((double)x[i] - y[i]);
        sum += e;
        sum2 += (x[i] - mean_x) * (x[i] - mean_x);
        if (e / absmax[i / 64] > worst) worst = e / absmax[i / 64];
    }
    double sigma = sqrt(sum2 / N), rel = sum / N / sigma;
    CHECK_MSG(worst <= 0.1520, "nf4 max error %.4f·absmax", worst);
    CHECK_MSG(rel >= 0.06 && rel <= 0.08, "nf4 mean |error| / sigma = %.4f", rel);

    at_tensor *src = NULL, *q = NULL, *back = NULL;
    CHECK_OK(at_tensor_wrap(x, AT_F32, 2, SH(64, 1024), "gauss", &src));
    q = tensor(AT_NF4, 2, SH(64, 1024), "gauss.nf4");
    back = tensor(AT_F32, 2, SH(64, 1024), "gauss.back");
    CHECK_OK(at_quantize(q, src));
    CHECK_OK(at_dequantize(back, q));
    double sum_dq = 0;
    const float *z = at_tensor_data(back);
    for (int64_t i = 0; i < N; i++) sum_dq += fabs((double)x[i] - z[i]);
    CHECK_MSG(sum_dq / sum < 1.005, "double quantization raises the error by %.3f%%", 100 * (sum_dq / sum - 1));
    printf("nf4 on N(0,1): mean |err|/sigma %.4f (%.4f with double quant), max %.4f·absmax\n", rel,
           sum_dq / N / sigma, worst);

    /* bytes per parameter: Qwen2.5-0.5B's MLP weight */
    double bpp = (double)at_dtype_bytes(AT_NF4, 896 * 4864) / (896.0 * 4864);
    CHECK_MSG(bpp < 0.52, "nf4 bytes per parameter %.4f", bpp);
    printf("nf4 bytes per parameter (896x4864): %.5f\n", bpp);

    /* an all-zero block dequantizes to exactly 0, with double quantization */
    memset(x, 0, 64 * sizeof(float));
    CHECK_OK(at_quantize(q, src));
    CHECK_OK(at_dequantize(back, q));
    int zeros = 1;
    for (int i = 0; i < 64; i++) zeros &= z[i] == 0.0f;
    CHECK(zeros);
    at_tensor_free(src);
    at_tensor_free(q);
    at_tensor_free(back);
    free(x), free(y), free(packed), free(absmax);
}

/* ---- errors ---- */

static void test_errors(void)
{
    at_tensor *f = tensor(AT_F32, 2, SH(3, 48), "w48");
    at_tensor *q8 = tensor(AT_Q8_0, 2, SH(3, 48), "w48.q8_0");
    float *v = at_tensor_data(f);
    for (int i = 0; i < 3 * 48; i++) v[i] = (float)i;
    CHECK_FAILS(at_quantize(q8, f), AT_ERR_INVALID); /* 48 is not a multiple of 32 */
    CHECK(strstr(at_last_error(), "multiple of 32") != NULL);

    at_tensor *g = tensor(AT_F32, 2, SH(2, 64), "wnan");
    at_tensor *q4 = tensor(AT_Q4_0, 2, SH(2, 64), "wnan.q4_0");
    v = at_tensor_data(g);
    for (int i = 0; i < 128; i++) v[i] = 1.0f;
    v[77] = NAN;
    CHECK_FAILS(at_quantize(q4, g), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "element 77") != NULL && strstr(at_last_error(), "wnan") != NULL);

    /* an NF4 tensor never quantized has no header */
    at_tensor *nf = NULL, *back = tensor(AT_F32, 2, SH(2, 64), "back");
    CHECK_OK(at_tensor_zeros(at_cpu_backend(), AT_NF4, 2, SH(2, 64), "fresh.nf4", &nf));
    CHECK_FAILS(at_dequantize(back, nf), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "fresh.nf4") != NULL);
    at_tensor *x = tensor(AT_F32, 2, SH(4, 64), "x"), *y = tensor(AT_F32, 2, SH(4, 2), "y");
    memset(at_tensor_data(x), 0, at_tensor_nbytes(x));
    CHECK_FAILS(at_matmul(y, x, nf, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID);
    /* sizes and dtypes */
    CHECK_FAILS(at_quantize(back, g), AT_ERR_INVALID); /* dst not quantized */
    CHECK_FAILS(at_dequantize(q4, nf), AT_ERR_INVALID);
    at_tensor *q4b = tensor(AT_Q4_0, 2, SH(1, 64), "small.q4_0");
    CHECK_FAILS(at_quantize(q4b, g), AT_ERR_INVALID); /* sizes differ */

    /* matmul: rows not a multiple of the block, a batch of weights */
    at_tensor *w96 = tensor(AT_F32, 2, SH(2, 96), "w96"), *n96 = tensor(AT_NF4, 2, SH(2, 96), "w96.nf4");
    memset(at_tensor_data(w96), 0, at_tensor_nbytes(w96));
    CHECK_OK(at_quantize(n96, w96)); /* NF4 blocks run over the flattened tensor: fine */
    at_tensor *x96 = tensor(AT_F32, 2, SH(4, 96), "x96");
    memset(at_tensor_data(x96), 0, at_tensor_nbytes(x96));
    CHECK_FAILS(at_matmul(y, x96, n96, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "multiple of 64") != NULL);
    CHECK_FAILS(at_matmul(y, x, q8, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID); /* shapes: 48 vs 64 */
    at_tensor *wb = tensor(AT_Q8_0, 3, SH(2, 2, 64), "batch.q8_0");
    at_tensor *xb = tensor(AT_F32, 3, SH(2, 4, 64), "xb"), *yb = tensor(AT_F32, 3, SH(2, 4, 2), "yb");
    CHECK_FAILS(at_matmul(yb, xb, wb, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "one matrix") != NULL);
    at_tensor *qa = tensor(AT_Q8_0, 2, SH(4, 64), "a.q8_0");
    at_tensor *wf = tensor(AT_F32, 2, SH(2, 64), "wf");
    CHECK_FAILS(at_matmul(y, qa, wf, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID); /* only B may be quantized */

    at_tensor *all[] = {f, q8, g, q4, nf, back, x, y, q4b, w96, n96, x96, wb, xb, yb, qa, wf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) at_tensor_free(all[i]);
}

/* ---- quantized matmul = dequantize, then matmul ---- */

static float frand(at_rng *r) { return at_rng_uniform(r) * 2.0f - 1.0f; }

static void fill(at_tensor *t, at_rng *r, float scale)
{
    int64_t n = at_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        float v = frand(r) * scale;
        if (t->dtype == AT_BF16) ((uint16_t *)at_tensor_data(t))[i] = at_f32_to_bf16(v);
        else ((float *)at_tensor_data(t))[i] = v;
    }
}

typedef struct {
    double worst[4]; /* per ISA level */
    double worst_i8; /* the int8 paths: error / bound */
    int cases;
} qm_stats;

/* The bound on |decode kernel − reference| of the int8-activation decode
 * path (cpu_qmatmul.h), per element of C: each block b of 32 values of a
 * row x of A becomes d_b·q_i with d_b = max|x| / 127 and q_i = rint(x_i ·
 * fl(1/d_b)); |x_i · fl(1/d_b) − x_i / d_b| <= 127·2u (u = 2^-24), so
 * |x_i − d_b·q_i| <= d_b·(1/2 + 254u). The integer dot of a block is exact
 * (|sum| <= 32·127² < 2^24, so its f32 conversion too); each of the K/32
 * terms d_w·d_b·sum is rounded twice and accumulated in 8 lanes then summed
 * (at most K/32 + 5 roundings on the way), each term at most
 * sum |w_i|·(|x_i| + d_b). When A is bf16 the reference's weight is rounded
 * to bf16 and the kernel's is not: sum |x_i|·|w_i − bf16(w_i)| more. Then
 * alpha·dot and + beta·c round once each, and the reference rounds to f32.
 * w32: row of the dequantized weight in f32, wr: as the reference has it. */
static double int8_bound(const float *x, const float *w32, const float *wr, int64_t K, float alpha, float beta,
                         float c0, float want)
{
    const double u = 0x1p-24;
    double quant = 0, terms = 0, wround = 0;
    for (int64_t b = 0; b < K; b += 32) {
        double amax = 0, sw = 0;
        for (int64_t i = b; i < b + 32; i++) /* not fmax: aarch64 gcc 12 crashes vectorizing that reduction */
            amax = fabs((double)x[i]) > amax ? fabs((double)x[i]) : amax;
        double d = amax / 127.0;
        for (int64_t i = b; i < b + 32; i++) {
            sw += fabs((double)w32[i]);
            terms += fabs((double)w32[i]) * (fabs((double)x[i]) + d);
            wround += fabs((double)x[i]) * fabs((double)w32[i] - (double)wr[i]);
        }
        quant += d * (0.5 + 254 * u) * sw;
    }
    double dot = quant + (double)(K / 32 + 5) * 2 * u * terms + wround;
    return fabs(alpha) * dot * (1 + u) + 2 * u * (fabs(alpha) * terms + fabs(beta * c0)) + 2 * u * fabs(want);
}

/* One shape: W [out, in] quantized as dt; A = x [.., N, in] (forward) or
 * dy [.., N, out] (backward), f32 or bf16. The reference multiplies the
 * dequantized weight (rounded to bf16 when A is bf16, as at_matmul says) in
 * double; every ISA level must agree within 1e-5 relative, except the
 * forward with Q8_0 / Q4_0 weights on int8 activations (up to 8 rows at
 * AVX2 and above; more rows of f32 A at the AVX2 level: cpu_qmatmul.h),
 * held to int8_bound. */
static void qm_case(qm_stats *s, at_rng *r, at_dtype dt, at_dtype adt, int64_t batch, int64_t N, int64_t out,
                    int64_t in, int trans_b, float alpha, float beta)
{
    at_tensor *wf = tensor(AT_F32, 2, SH(out, in), "w"), *wq = tensor(dt, 2, SH(out, in), "w.q");
    fill(wf, r, 0.05f);
    CHECK_OK(at_quantize(wq, wf));
    at_tensor *wd = tensor(adt == AT_BF16 ? AT_BF16 : AT_F32, 2, SH(out, in), "w.deq");
    CHECK_OK(at_dequantize(wd, wq));
    int64_t k = trans_b ? in : out, n = trans_b ? out : in;
    at_tensor *a = batch > 1 ? tensor(adt, 3, SH(batch, N, k), "a") : tensor(adt, 2, SH(N, k), "a");
    at_tensor *want = batch > 1 ? tensor(AT_F32, 3, SH(batch, N, n), "want") : tensor(AT_F32, 2, SH(N, n), "want");
    at_tensor *c0 = batch > 1 ? tensor(AT_F32, 3, SH(batch, N, n), "c0") : tensor(AT_F32, 2, SH(N, n), "c0");
    at_tensor *got = batch > 1 ? tensor(AT_F32, 3, SH(batch, N, n), "got") : tensor(AT_F32, 2, SH(N, n), "got");
    fill(a, r, 1.0f);
    fill(c0, r, 1.0f);
    memcpy(at_tensor_data(want), at_tensor_data(c0), at_tensor_nbytes(c0));
    CHECK_OK(at_ref_matmul(want, a, wd, 0, trans_b, alpha, beta));
    size_t cnt = (size_t)at_tensor_numel(want);
    /* the int8 paths (decode; prefill with f32 A): their bound per element of C */
    int64_t M = batch * N;
    double *bound = NULL;
    if (trans_b && (M <= 8 || adt == AT_F32) && dt != AT_NF4) {
        at_tensor *w32 = tensor(AT_F32, 2, SH(out, in), "w.f32");
        CHECK_OK(at_dequantize(w32, wq));
        float *xf = malloc(sizeof(float) * (size_t)(M * in)), *wrf = malloc(sizeof(float) * (size_t)(out * in));
        bound = malloc(sizeof(double) * cnt);
        for (int64_t i = 0; i < M * in; i++)
            xf[i] = adt == AT_BF16 ? at_bf16_to_f32(((uint16_t *)at_tensor_data(a))[i]) : ((float *)at_tensor_data(a))[i];
        for (int64_t i = 0; i < out * in; i++)
            wrf[i] = adt == AT_BF16 ? at_bf16_to_f32(((uint16_t *)at_tensor_data(wd))[i]) : ((float *)at_tensor_data(wd))[i];
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < out; j++)
                bound[m * out + j] =
                    int8_bound(xf + m * in, (float *)at_tensor_data(w32) + j * in, wrf + j * in, in, alpha, beta,
                               ((float *)at_tensor_data(c0))[m * out + j], ((float *)at_tensor_data(want))[m * out + j]);
        free(xf);
        free(wrf);
        at_tensor_free(w32);
    }
    at_cpu_isa prev = at_cpu_isa_force(AT_ISA_TOP);
    at_cpu_isa top = at_cpu_isa_level();
    for (int lvl = AT_ISA_SCALAR; lvl <= (int)top; lvl++) {
        at_cpu_isa_force((at_cpu_isa)lvl);
        memcpy(at_tensor_data(got), at_tensor_data(c0), at_tensor_nbytes(c0));
        if (beta == 0.0f) /* old contents must be ignored, even NaN */
            for (size_t i = 0; i < cnt; i++) ((float *)at_tensor_data(got))[i] = NAN;
        at_status st = at_matmul(got, a, wq, 0, trans_b, alpha, beta);
        CHECK_MSG(st == AT_OK, "%s", at_last_error());
        if (bound && (M <= 8 ? at_cpu_qmatmul_int8_decode() : at_cpu_qmatmul_int8_prefill(adt))) {
            const float *g = at_tensor_data(got), *wv = at_tensor_data(want);
            double worst = 0; /* error / bound */
            for (size_t i = 0; i < cnt; i++) { /* a NaN stays (fmax would drop it) */
                double q = fabs((double)g[i] - (double)wv[i]) / bound[i];
                if (q > worst || q != q) worst = q;
            }
            if (!(worst <= 1.0))
                fprintf(stderr, "qmatmul int8 %s A=%s isa=%s N=%lld out=%lld in=%lld: error %.3g of the bound\n",
                        at_dtype_name(dt), at_dtype_name(adt), at_cpu_isa_name((at_cpu_isa)lvl), (long long)N,
                        (long long)out, (long long)in, worst);
            CHECK(worst <= 1.0);
            if (!(worst <= s->worst_i8)) s->worst_i8 = worst;
            continue;
        }
        double e = at_test_max_rel_err(at_tensor_data(got), at_tensor_data(want), cnt, 1e-6);
        if (!(e <= 1e-5))
            fprintf(stderr, "qmatmul %s A=%s isa=%s batch=%lld N=%lld out=%lld in=%lld trans_b=%d: rel err %g\n",
                    at_dtype_name(dt), at_dtype_name(adt), at_cpu_isa_name((at_cpu_isa)lvl), (long long)batch,
                    (long long)N, (long long)out, (long long)in, trans_b, e);
        CHECK(e <= 1e-5);
        if (!(e <= s->worst[lvl])) s->worst[lvl] = e;
    }
    at_cpu_isa_force(prev);
    free(bound);
    s->cases++;
    at_tensor *all[] = {wf, wq, wd, a, want, c0, got};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) at_tensor_free(all[i]);
}

static void test_qmatmul(void)
{
    at_cpu_qmatmul_inference(1); /* the prefill's int8 path too (cpu_qmatmul.h) */
    at_rng r;
    at_rng_seed(&r, 11);
    const at_dtype dts[] = {AT_Q8_0, AT_Q4_0, AT_NF4};
    const int64_t outs[] = {1, 3, 17, 1000}, ns[] = {1, 3, 8, 65};
    for (int d = 0; d < 3; d++) {
        qm_stats s = {{0}, 0, 0};
        int64_t in_a = dts[d] == AT_NF4 ? 64 : 32, in_b = dts[d] == AT_NF4 ? 320 : 96;
        for (int oi = 0; oi < 4; oi++)
            for (int ni = 0; ni < 4; ni++)
                for (int tb = 0; tb < 2; tb++) {
                    qm_case(&s, &r, dts[d], AT_F32, 1, ns[ni], outs[oi], in_a, tb, 1.0f, 0.0f);
                    qm_case(&s, &r, dts[d], AT_F32, 1, ns[ni], outs[oi], in_b, tb, 1.0f, 0.0f);
                }
        /* K larger than one cache block of k (1024 for the bf16 engine), bf16 A,
         * alpha/beta, a batch of A stacked over one weight */
        for (int tb = 0; tb < 2; tb++) {
            qm_case(&s, &r, dts[d], AT_F32, 1, 37, 1100, 1088, tb, 0.5f, 0.25f);
            qm_case(&s, &r, dts[d], AT_BF16, 1, 65, 200, 1152, tb, 1.0f, 0.0f);
            qm_case(&s, &r, dts[d], AT_BF16, 1, 3, 17, 128, tb, 1.0f, 1.0f);
            qm_case(&s, &r, dts[d], AT_F32, 2, 5, 130, 192, tb, 1.0f, 0.0f);
        }
        printf("qmatmul %s: %d cases, max rel err", at_dtype_name(dts[d]), s.cases);
        for (int l = 0; l < 4; l++) printf(" %s %.2g", at_cpu_isa_name((at_cpu_isa)l), s.worst[l]);
        if (dts[d] != AT_NF4) printf("; int8 paths: error at most %.3g of their bound", s.worst_i8);
        printf("\n");
    }
}

/* The SIMD dequantizers are bit-identical to quant.c's. */
static void test_dequant_isa(void)
{
    at_rng r;
    at_rng_seed(&r, 5);
    at_tensor *f = tensor(AT_F32, 2, SH(8, 256), "f");
    fill(f, &r, 3.0f);
    const at_dtype dts[] = {AT_Q8_0, AT_Q4_0, AT_NF4};
    for (int d = 0; d < 3; d++) {
        at_tensor *q = tensor(dts[d], 2, SH(8, 256), "q"), *want = tensor(AT_F32, 2, SH(8, 256), "want");
        CHECK_OK(at_quantize(q, f));
        CHECK_OK(at_dequantize(want, q));
        at_cpu_isa prev = at_cpu_isa_force(AT_ISA_TOP);
        at_cpu_isa top = at_cpu_isa_level();
        for (int lvl = AT_ISA_SCALAR; lvl <= (int)top; lvl++) {
            at_cpu_isa_force((at_cpu_isa)lvl);
            const at_cpu_qdeq *dq = at_cpu_qdeq_get();
            float got[8 * 256];
            if (dts[d] == AT_NF4) {
                at_nf4_parts p;
                CHECK_OK(at_nf4_parts_of(q, &p));
                float amax[32];
                at_nf4_absmax(&p, 0, 32, amax);
                dq->nf4(got, p.nibbles, amax, 32);
            } else {
                const uint8_t *b = at_tensor_data(q);
                (dts[d] == AT_Q8_0 ? dq->q8_0 : dq->q4_0)(got, b, 64);
            }
            CHECK_MSG(memcmp(got, at_tensor_data(want), sizeof got) == 0, "%s dequantizer %s differs",
                      at_dtype_name(dts[d]), dq->name);
        }
        at_cpu_isa_force(prev);
        at_tensor_free(q);
        at_tensor_free(want);
    }
    at_tensor_free(f);
}

int main(void)
{
    test_tables();
    test_ggml_blocks(AT_Q8_0, "q8_0.bin", "q8_0_deq.f32");
    test_ggml_blocks(AT_Q4_0, "q4_0.bin", "q4_0_deq.f32");
    test_nf4_goldens();
    test_nf4_gaussian();
    test_errors();
    test_dequant_isa();
    test_qmatmul();
    return at_test_result("test_quant");
}
