/* CPU kernel of the fused cross-entropy (see ops/ops.h). */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>
#include "device/cpu/cpu_simd.h"

/* Rows go to threads; a row (up to a 151936-entry vocabulary) is read chunk
 * by chunk. Without a gradient, or in bf16 / f16, one pass finds m = max and
 * s = Σ exp(x − m) online (when a chunk raises the max, s is rescaled by
 * exp(old − new)) and a second writes the gradient, taking exp again. With
 * f32 logits and gradient (training), the max comes first, then the pass
 * that sums the exponentials stores them in the gradient, and the last one
 * scales them by grad_scale / s: one exp per logit instead of two (the
 * second pass of exponentials was ~0.5% of a Qwen2.5-0.5B LoRA step at AVX2
 * and ~1% of the small shape's). */

/* Online max and sum of exponentials of one row; returns log Σ exp(x). */
static float row_logsumexp(const at_cpu_simd *v, float *buf, const void *px, at_dtype t, int64_t off, int64_t V)
{
    float m = -INFINITY;
    double s = 0;
    for (int64_t c0 = 0; c0 < V; c0 += AT_CPU_CHUNK) {
        int64_t len = V - c0 < AT_CPU_CHUNK ? V - c0 : AT_CPU_CHUNK;
        const float *x = at_cpu_in(v, buf, px, t, off + c0, len);
        float cm = v->max(x, len);
        if (cm == -INFINITY) continue; /* contributes exp(−inf) = 0 */
        if (cm > m) {
            s *= exp((double)m - (double)cm);
            m = cm;
        }
        s += v->sum_exp(NULL, x, m, len);
    }
    if (m == -INFINITY) return -INFINITY;
    return m + (float)log(s);
}

/* One f32 row with its gradient, one exp per logit (see the top): d = x's
 * gradient (d may be x), *loss its loss, xl = x[label] read beforehand.
 * Returns 0 and writes nothing when the max is not finite (the online pass
 * then handles the row). */
static int row_f32(const at_cpu_simd *v, float *d, const float *x, int64_t V, int32_t label, float xl,
                   float grad_scale, float *loss)
{
    float m = v->max(x, V);
    if (!isfinite(m)) return 0;
    double s = 0; /* the chunks' sums added in double, as row_logsumexp does */
    for (int64_t c0 = 0; c0 < V; c0 += AT_CPU_CHUNK)
        s += v->sum_exp(d + c0, x + c0, m, V - c0 < AT_CPU_CHUNK ? V - c0 : AT_CPU_CHUNK);
    float lse = m + (float)log(s);
    *loss = lse - xl;
    v->scale(d, d, (float)(grad_scale / s), V);
    d[label] = grad_scale * (expf(xl - lse) - 1.0f);
    return 1;
}

static float load1(const void *p, at_dtype t, int64_t i)
{
    switch (t) {
    case AT_BF16: return at_bf16_to_f32(((const uint16_t *)p)[i]);
    case AT_F16: return at_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store1(void *p, at_dtype t, int64_t i, float x)
{
    switch (t) {
    case AT_BF16: ((uint16_t *)p)[i] = at_f32_to_bf16(x); break;
    case AT_F16: ((uint16_t *)p)[i] = at_f32_to_f16(x); break;
    default: ((float *)p)[i] = x; break;
    }
}

/*   row_loss[n] = logsumexp(logits[n]) − logits[n, label]
 *   dlogits[n]  = grad_scale · (softmax(logits[n]) − onehot(label))
 * both 0 for an ignored label (< 0). The label's logit is read before pass 2,
 * so dlogits may be the logits tensor itself. */
at_status at_cpu_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                               const at_tensor *labels, float grad_scale)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t rows = at_tensor_rows(logits), V = at_tensor_cols(logits);
    const int32_t *lab = at_tensor_data(labels);
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] >= V)
            return at_error(AT_ERR_INVALID, "cross_entropy: %s[%lld] = %d is not below the vocabulary size %lld",
                            labels->name[0] ? labels->name : "labels", (long long)r, lab[r], (long long)V);
    }
    const void *px = at_tensor_data(logits);
    void *pd = dlogits ? at_tensor_data(dlogits) : NULL;
    float *loss = at_tensor_data(row_loss);
#pragma omp parallel for schedule(static) if (rows > 1 && rows * V >= AT_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float bx[AT_CPU_CHUNK], bd[AT_CPU_CHUNK];
        if (lab[r] < 0) {
            loss[r] = 0;
            /* zero bits are 0.0 in f32, bf16 and f16 alike */
            if (pd) memset(at_cpu_elem(pd, dlogits->dtype, r * V), 0, (size_t)V * (dlogits->dtype == AT_F32 ? 4 : 2));
            continue;
        }
        float xl = load1(px, logits->dtype, r * V + lab[r]);
        if (pd && logits->dtype == AT_F32 && dlogits->dtype == AT_F32 &&
            row_f32(v, (float *)pd + r * V, (const float *)px + r * V, V, lab[r], xl, grad_scale, &loss[r]))
            continue;
        float lse = row_logsumexp(v, bx, px, logits->dtype, r * V, V);
        loss[r] = lse - xl;
        if (!pd) continue;
        for (int64_t c0 = 0; c0 < V; c0 += AT_CPU_CHUNK) {
            int64_t len = V - c0 < AT_CPU_CHUNK ? V - c0 : AT_CPU_CHUNK, off = r * V + c0;
            const float *xi = at_cpu_in(v, bx, px, logits->dtype, off, len);
            float *o = at_cpu_out(bd, pd, dlogits->dtype, off);
            v->exp_scale(o, xi, lse, grad_scale, len);
            at_cpu_out_done(v, o, pd, dlogits->dtype, off, len);
        }
        store1(pd, dlogits->dtype, r * V + lab[r], grad_scale * (expf(xl - lse) - 1.0f));
    }
    return AT_OK;
}
