#include "device/cpu/cpu_dropout.h"
#include "device/cpu/cpu_kernels.h"

#include <omp.h>

#include "base/rng.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_simd.h"
#include "device/cpu/gemm.h"

/* ceil(p · 2²⁴) << 8: at_rng_dropout_uniform's value is k · 2⁻²⁴ for the top
 * 24 bits k of the counter's 32-bit word (exact in f32), and k · 2⁻²⁴ >= p ⇔
 * k >= ceil(p · 2²⁴) (p · 2²⁴ is exact in double; below 2²⁴ for p < 1). */
static uint32_t keep_threshold(float p)
{
    double s = (double)p * 16777216.0;
    uint32_t k = (uint32_t)s;
    if ((double)k < s) k++;
    return k << 8;
}

/* How many of the `len` elements from element g on have consecutive
 * counters: all of them, or up to the end of g's run. */
static int64_t span_len(int64_t g, int64_t len, int64_t run)
{
    return run > 0 && run - g % run < len ? run - g % run : len;
}

/* The vector chunk of the current ISA level (cpu_dropout.h), or NULL. */
typedef void (*dropout_chunk_fn)(float *, const float *, int64_t, uint64_t, uint64_t, uint32_t, float);
static dropout_chunk_fn vector_chunk(void)
{
#if defined(__x86_64__)
    if (at_cpu_isa_level() >= AT_ISA_AVX512) return at_cpu_dropout_chunk_avx512;
    if (at_cpu_isa_level() >= AT_ISA_AVX2) return at_cpu_dropout_chunk_avx2;
#endif
    return NULL;
}

/* Elements [i, i + n) of one run, whose counters are consecutive from first
 * (mod 2⁶⁴). A vector chunk's pairs share a hash: it starts at an even
 * counter and does not pass 2⁶⁴, where the pairs' running index would not
 * wrap with the counters. */
static void dropout_span(float *o, const float *xi, int64_t n, uint64_t seed, uint64_t first, float p,
                         uint32_t thresh, float keep, dropout_chunk_fn chunk)
{
    int64_t i = 0;
    if (chunk && n > 0 && (first & 1)) {
        o[0] = at_rng_dropout_uniform(seed, first) >= p ? xi[0] * keep : 0.0f;
        i = 1;
    }
    if (chunk) {
        uint64_t start = first + (uint64_t)i, to_wrap = -start; /* counters left before 2⁶⁴ (0: none) */
        int64_t len = n - i;
        if (to_wrap != 0 && to_wrap < (uint64_t)len) {
            chunk(o + i, xi + i, (int64_t)to_wrap, seed, start, thresh, keep);
            i += (int64_t)to_wrap;
            start = 0;
            len = n - i;
        }
        chunk(o + i, xi + i, len, seed, start, thresh, keep);
        return;
    }
    for (; i < n; i++) o[i] = at_rng_dropout_uniform(seed, first + (uint64_t)i) >= p ? xi[i] * keep : 0.0f;
}

/* y[i] = x[i] / (1 − p) if at_rng_dropout_uniform(seed, counter(i)) >= p, else
 * 0, counter(i) = offset + (i / run)·pitch + i % run (ops.h). Each element's
 * mask bit depends only on its index, so the chunks can be split across
 * threads in any way and the backward regenerates the mask; a chunk is cut
 * where a run ends, the counters being consecutive within a run. */
at_status at_cpu_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                         uint64_t pitch)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    dropout_chunk_fn chunk = vector_chunk();
    int64_t n = at_tensor_numel(x), nc = (n + AT_CPU_CHUNK - 1) / AT_CPU_CHUNK;
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
    float keep = 1.0f / (1.0f - p);
    uint32_t thresh = keep_threshold(p);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t u = 0; u < nc; u++) {
        float bx[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t off = u * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *xi = at_cpu_in(v, bx, px, x->dtype, off, len);
        float *o = at_cpu_out(by, py, y->dtype, off);
        if (p == 0.0f) {
            for (int64_t i = 0; i < len; i++) o[i] = xi[i];
        } else {
            for (int64_t i = 0, k; i < len; i += k) {
                k = span_len(off + i, len - i, run);
                dropout_span(o + i, xi + i, k, seed, at_rng_run_counter(offset, off + i, run, pitch), p, thresh, keep,
                             chunk);
            }
        }
        at_cpu_out_done(v, o, py, y->dtype, off, len);
    }
    return AT_OK;
}

/* c = drop(alpha · op(a) · op(b)) (ops.h). For f32 matrices, c in blocks of
 * whole rows of about 256 KB, each block on one thread: its product (our
 * kernels, on that thread) is dropped while it is still in that core's L2,
 * instead of a second pass over all of c from memory (LoRA's dx = drop(dU·A)
 * at 512 x 896, K 8, after the layer's GEMM: 414-438 us as two calls, 199-216
 * so, a Zen 4). The values are those of at_cpu_matmul on our kernels and then
 * at_cpu_dropout: an element of the product does not depend on how the rows
 * are blocked, nor its mask. Other dtypes or batches: those two calls; p 0:
 * the product alone. */
at_status at_cpu_matmul_dropout(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                                float alpha, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch)
{
    if (p == 0.0f) return at_cpu_matmul(c, a, b, trans_a, trans_b, alpha, 0.0f); /* dropout would copy c onto itself */
    if (c->dtype != AT_F32 || a->dtype != AT_F32 || b->dtype != AT_F32 || c->ndim != 2 || a->ndim != 2 ||
        b->ndim != 2) {
        AT_TRY(at_cpu_matmul(c, a, b, trans_a, trans_b, alpha, 0.0f));
        return at_cpu_dropout(c, c, p, seed, offset, run, pitch);
    }
    int64_t M = c->shape[0], N = c->shape[1], K = trans_a ? a->shape[0] : a->shape[1];
    int64_t lda = a->shape[1], ldb = b->shape[1], rows = N > 0 && N < ((int64_t)1 << 16) ? ((int64_t)1 << 16) / N : 1;
    int64_t blocks = (M + rows - 1) / rows;
    const float *pa = at_tensor_data(a), *pb = at_tensor_data(b);
    float *pc = at_tensor_data(c);
    float keep = 1.0f / (1.0f - p);
    uint32_t thresh = keep_threshold(p);
    dropout_chunk_fn chunk = vector_chunk();
    int failed = 0;
    int nt = M * N * (K + 1) >= AT_CPU_PAR_MIN && blocks > 1 ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1) reduction(| : failed)
    for (int64_t i = 0; i < blocks; i++) {
        int64_t r0 = i * rows, rn = M - r0 < rows ? M - r0 : rows, e0 = r0 * N;
        float *blk = pc + e0;
        if (at_cpu_gemm_ours(trans_a, trans_b, rn, N, K, alpha, pa + (trans_a ? r0 : r0 * lda), AT_F32, lda, pb,
                             AT_F32, ldb, 0.0f, blk, AT_F32, N) != AT_OK) {
            failed = 1;
            continue;
        }
        for (int64_t j = 0, k; j < rn * N; j += k) {
            k = span_len(e0 + j, rn * N - j, run);
            dropout_span(blk + j, blk + j, k, seed, at_rng_run_counter(offset, e0 + j, run, pitch), p, thresh, keep,
                         chunk);
        }
    }
    /* the arguments were checked by at_matmul_dropout; a failure is ours */
    if (failed) return at_error(AT_ERR_INTERNAL, "matmul_dropout: the product of %s failed", c->name);
    return AT_OK;
}

/* y[i] += m·(2u − 1) over one run's consecutive counters from first. n is
 * formed in its own statement so no compiler fuses it into the add: the sum
 * is rounded twice, as on every other backend (ops.h). */
static void noise_span(float *o, int64_t n, uint64_t seed, uint64_t first, float m)
{
    for (int64_t i = 0; i < n; i++) {
        float s = 2.0f * at_rng_hash_uniform(seed, first + (uint64_t)i) - 1.0f; /* exact: k·2⁻²³ − 1 */
        float v = m * s;
        o[i] = o[i] + v;
    }
}

/* The noise of each element depends only on its counter, so the chunks may be
 * split across threads in any way; a chunk is cut where a run ends. Scalar:
 * the noise goes on the embeddings only (B·T·hidden elements once a step). */
at_status at_cpu_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                                   uint64_t pitch)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(y), nc = (n + AT_CPU_CHUNK - 1) / AT_CPU_CHUNK;
    void *py = at_tensor_data(y);
    if (magnitude == 0.0f) return AT_OK;
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t u = 0; u < nc; u++) {
        float bx[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t off = u * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *yi = at_cpu_in(v, bx, py, y->dtype, off, len);
        float *o = at_cpu_out(by, py, y->dtype, off);
        if (o != yi)
            for (int64_t i = 0; i < len; i++) o[i] = yi[i];
        for (int64_t i = 0, k; i < len; i += k) {
            k = span_len(off + i, len - i, run);
            noise_span(o + i, k, seed, at_rng_run_counter(offset, off + i, run, pitch), magnitude);
        }
        at_cpu_out_done(v, o, py, y->dtype, off, len);
    }
    return AT_OK;
}
