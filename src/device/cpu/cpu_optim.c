/* CPU kernels of the AdamW step and the sum of squares (gradient norms); see ops/ops.h. */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include "device/cpu/cpu_simd.h"

/* One AdamW step, as torch.optim.AdamW (single-tensor path) computes it:
 *   g = grad_scale · grad
 *   param ← param · (1 − lr · wd)                    (decoupled decay)
 *   m ← m + (1 − β1)(g − m),   v ← β2 v + (1 − β2) g²
 *   param ← param − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
 * The bias corrections are formed in double once per call. */
at_status at_cpu_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                       const at_adamw_params *p)
{
    const at_cpu_simd *s = at_cpu_simd_get();
    double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    at_cpu_adamw_consts c = {
        .grad_scale = p->grad_scale,
        .beta1 = p->beta1,
        .beta2 = p->beta2,
        .eps = p->eps,
        .decay = (float)(1.0 - (double)p->lr * (double)p->weight_decay),
        .step_size = (float)((double)p->lr / bc1),
        .inv_bc2 = (float)(1.0 / sqrt(bc2)),
    };
    int64_t n = at_tensor_numel(param), blk = 8 * AT_CPU_CHUNK, nb = (n + blk - 1) / blk;
    float *pp = at_tensor_data(param), *pm = at_tensor_data(m), *pv = at_tensor_data(v);
    const float *pg = at_tensor_data(grad);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t off = b * blk, len = n - off < blk ? n - off : blk;
        s->adamw(pp + off, pg + off, pm + off, pv + off, len, &c);
    }
    return AT_OK;
}

/* out[0] = Σ x²: f32 sums over chunks, added in double per thread, and the
 * thread partials added in thread order (same result for a given thread count). */
at_status at_cpu_sumsq(at_tensor *out, const at_tensor *x)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(x), nc = (n + AT_CPU_CHUNK - 1) / AT_CPU_CHUNK;
    int nt = n >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1;
    if (nt > 256) nt = 256;
    double part[256] = {0};
    const void *px = at_tensor_data(x);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float buf[AT_CPU_CHUNK];
        double acc = 0;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nc; c++) {
            int64_t off = c * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
            acc += v->sumsq(at_cpu_in(v, buf, px, x->dtype, off, len), len);
        }
        part[omp_get_thread_num()] = acc;
    }
    double total = 0;
    for (int t = 0; t < nt; t++) total += part[t];
    *(float *)at_tensor_data(out) = (float)total;
    return AT_OK;
}
