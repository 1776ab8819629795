/* CPU kernels of RMSNorm and LayerNorm, forward and backward (see ops/ops.h). */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_simd.h"

/* RMSNorm over the last dimension D, one row per iteration, rows spread over
 * threads. Rows are converted to f32 in per-thread scratch.
 *   forward:  r = 1/sqrt(mean(x²) + eps),  y = x · r · w
 *   backward: with g = dy · w and x̂ = x · r,
 *             dx = r · (g − x̂ · mean(g · x̂)),   dw += Σ_rows dy · x̂
 * The backward's dw sum goes through per-thread partial rows (f32) added up
 * at the end in thread order, so no atomics and a fixed summation order for a
 * given thread count. */

static int nthreads_for(int64_t work) { return work >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1; }

at_status at_cpu_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    int nt = nthreads_for(rows * D);
    /* per thread: x row + y row; then w as f32 */
    float *scratch = malloc(((size_t)nt * 2 + 1) * (size_t)D * sizeof(float));
    if (!scratch && D) return at_error(AT_ERR_NOMEM, "rmsnorm_forward: no memory for %lld-wide rows", (long long)D);
    float *wf = scratch + (size_t)nt * 2 * D;
    const float *wv = at_cpu_in(v, wf, at_tensor_data(w), w->dtype, 0, D);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
    float *pr = rstd ? at_tensor_data(rstd) : NULL;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *bx = scratch + (size_t)omp_get_thread_num() * 2 * D, *by = bx + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = at_cpu_in(v, bx, px, x->dtype, r * D, D);
            float rs = 1.0f / sqrtf(v->sumsq(xr, D) / (float)D + eps);
            float *o = at_cpu_out(by, py, y->dtype, r * D);
            v->rmsnorm_row(o, xr, wv, rs, D);
            at_cpu_out_done(v, o, py, y->dtype, r * D, D);
            if (pr) pr[r] = rs;
        }
    }
    free(scratch);
    return AT_OK;
}

at_status at_cpu_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                                  const at_tensor *w, const at_tensor *rstd)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    int nt = nthreads_for(rows * D);
    /* per thread: dy, x, dx rows and a dw partial row; then w as f32 */
    size_t per = 4 * (size_t)D;
    float *scratch = malloc(((size_t)nt * per + D) * sizeof(float));
    if (!scratch && D) return at_error(AT_ERR_NOMEM, "rmsnorm_backward: no memory for %lld-wide rows", (long long)D);
    float *wf = scratch + (size_t)nt * per;
    const float *wv = at_cpu_in(v, wf, at_tensor_data(w), w->dtype, 0, D);
    const void *pdy = at_tensor_data(dy), *px = at_tensor_data(x);
    const float *pr = at_tensor_data(rstd);
    void *pdx = at_tensor_data(dx);
    /* zeroed here, not by each thread: the runtime may start fewer threads than asked */
    for (int t = 0; t < nt; t++) memset(scratch + (size_t)t * per + 3 * D, 0, (size_t)D * sizeof(float));
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *bdy = scratch + (size_t)omp_get_thread_num() * per, *bx = bdy + D, *bdx = bx + D, *dwp = bdx + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = at_cpu_in(v, bdy, pdy, dy->dtype, r * D, D);
            const float *xr = at_cpu_in(v, bx, px, x->dtype, r * D, D);
            float *o = at_cpu_out(bdx, pdx, dx->dtype, r * D);
            v->rmsnorm_bwd_row(o, dw ? dwp : NULL, dyr, xr, wv, pr[r], D);
            at_cpu_out_done(v, o, pdx, dx->dtype, r * D, D);
        }
    }
    if (dw) {
        /* dw += Σ_threads partial: the first thread's row doubles as the sum */
        float *acc = scratch + D; /* thread 0's x row is free now */
        v->load(acc, at_tensor_data(dw), dw->dtype, D);
        for (int t = 0; t < nt; t++) v->add(acc, acc, scratch + (size_t)t * per + 3 * D, D);
        v->store(at_tensor_data(dw), dw->dtype, acc, D);
    }
    free(scratch);
    return AT_OK;
}

/* LayerNorm over the last dimension D (biased variance, as torch):
 *   forward:  μ = mean(x),  r = 1/sqrt(mean((x − μ)²) + eps),  x̂ = (x − μ)·r,  y = x̂·w + b
 *   backward: with g = dy·w,
 *             dx = r·(g − mean(g) − x̂·mean(g·x̂)),  dw += Σ_rows dy·x̂,  db += Σ_rows dy
 * Rows spread over threads as RMSNorm's; the variance is taken around the
 * mean in a second pass (E[x²] − μ² cancels for rows far from zero); dw and db
 * through per-thread partial rows added in thread order. */

at_status at_cpu_layernorm_forward(at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                                   const at_tensor *w, const at_tensor *b, float eps)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    int nt = nthreads_for(rows * D);
    /* per thread: x row + y row; then w and b as f32 */
    float *scratch = malloc(((size_t)nt * 2 + 2) * (size_t)D * sizeof(float));
    if (!scratch && D) return at_error(AT_ERR_NOMEM, "layernorm_forward: no memory for %lld-wide rows", (long long)D);
    float *wf = scratch + (size_t)nt * 2 * D, *bf = wf + D;
    const float *wv = at_cpu_in(v, wf, at_tensor_data(w), w->dtype, 0, D);
    const float *bv = b ? at_cpu_in(v, bf, at_tensor_data(b), b->dtype, 0, D) : NULL;
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
    float *pm = mean ? at_tensor_data(mean) : NULL, *pr = rstd ? at_tensor_data(rstd) : NULL;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *bx = scratch + (size_t)omp_get_thread_num() * 2 * D, *by = bx + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = at_cpu_in(v, bx, px, x->dtype, r * D, D);
            float mu = 0, var = 0;
            for (int64_t i = 0; i < D; i++) mu += xr[i];
            mu /= (float)D;
            for (int64_t i = 0; i < D; i++) var += (xr[i] - mu) * (xr[i] - mu);
            float rs = 1.0f / sqrtf(var / (float)D + eps);
            float *o = at_cpu_out(by, py, y->dtype, r * D);
            for (int64_t i = 0; i < D; i++) o[i] = (xr[i] - mu) * rs * wv[i] + (bv ? bv[i] : 0.0f);
            at_cpu_out_done(v, o, py, y->dtype, r * D, D);
            if (pm) pm[r] = mu;
            if (pr) pr[r] = rs;
        }
    }
    free(scratch);
    return AT_OK;
}

at_status at_cpu_layernorm_backward(at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy,
                                    const at_tensor *x, const at_tensor *w, const at_tensor *mean,
                                    const at_tensor *rstd)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    int nt = nthreads_for(rows * D);
    /* per thread: dy, x, dx rows and dw, db partial rows; then w as f32 */
    size_t per = 5 * (size_t)D;
    float *scratch = malloc(((size_t)nt * per + D) * sizeof(float));
    if (!scratch && D) return at_error(AT_ERR_NOMEM, "layernorm_backward: no memory for %lld-wide rows", (long long)D);
    float *wf = scratch + (size_t)nt * per;
    const float *wv = at_cpu_in(v, wf, at_tensor_data(w), w->dtype, 0, D);
    const void *pdy = at_tensor_data(dy), *px = at_tensor_data(x);
    const float *pm = at_tensor_data(mean), *pr = at_tensor_data(rstd);
    void *pdx = at_tensor_data(dx);
    /* zeroed here, not by each thread: the runtime may start fewer threads than asked */
    for (int t = 0; t < nt; t++) memset(scratch + (size_t)t * per + 3 * D, 0, 2 * (size_t)D * sizeof(float));
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *bdy = scratch + (size_t)omp_get_thread_num() * per, *bx = bdy + D, *bdx = bx + D, *dwp = bdx + D,
              *dbp = dwp + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = at_cpu_in(v, bdy, pdy, dy->dtype, r * D, D);
            const float *xr = at_cpu_in(v, bx, px, x->dtype, r * D, D);
            float mu = pm[r], rs = pr[r], mg = 0, mgx = 0;
            for (int64_t i = 0; i < D; i++) {
                float g = dyr[i] * wv[i];
                mg += g;
                mgx += g * (xr[i] - mu) * rs;
            }
            mg /= (float)D;
            mgx /= (float)D;
            /* dx goes through scratch: dx may alias dy or x */
            for (int64_t i = 0; i < D; i++) {
                float xh = (xr[i] - mu) * rs;
                dwp[i] += dyr[i] * xh;
                dbp[i] += dyr[i];
                bdx[i] = rs * (dyr[i] * wv[i] - mg - xh * mgx);
            }
            v->store(at_cpu_elem(pdx, dx->dtype, r * D), dx->dtype, bdx, D);
        }
    }
    /* dw += Σ_threads partial, db likewise: thread 0's dy and x rows hold the sums */
    at_tensor *grads[2] = {dw, db};
    for (int k = 0; k < 2; k++) {
        if (!grads[k]) continue;
        float *acc = scratch + (size_t)k * D;
        v->load(acc, at_tensor_data(grads[k]), grads[k]->dtype, D);
        for (int t = 0; t < nt; t++) v->add(acc, acc, scratch + (size_t)t * per + (size_t)(3 + k) * D, D);
        v->store(at_tensor_data(grads[k]), grads[k]->dtype, acc, D);
    }
    free(scratch);
    return AT_OK;
}
