/* AdamW and the sum of squares (gradient norms) on the CUDA backend.
 *
 * AdamW follows the CPU kernel (torch.optim.AdamW, single-tensor path) in
 * the same order of f32 operations, with the bias corrections formed on the
 * host in double once per call:
 *   g = grad_scale · grad
 *   m ← m + (1 − β1)(g − m),   v ← β2 v + (1 − β2) g²
 *   param ← param · (1 − lr · wd) − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
 *
 * sumsq: out[0] = Σ x², deterministic in two stages: a grid whose size
 * depends only on n writes one f32 partial per block (block tree sum of the
 * threads' grid-stride sums), then one block adds the partials in a fixed
 * order. */
#include <math.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

#define OPT_THREADS 256

typedef struct {
    float grad_scale, beta1, beta2, eps, decay, step_size, inv_bc2;
} adamw_consts;

/* Elements i..i+w of the four arrays (w 8 or 1; cuda_vec.h's f32 access). */
static __global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, adamw_consts c, int vec)
{
    const float b1c = 1.0f - c.beta1, b2c = 1.0f - c.beta2;
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float pv[AT_VEC], gv[AT_VEC], mv[AT_VEC], vv[AT_VEC];
        at_cu_loadw(p, 0, i, pv, w);
        at_cu_loadw(g, 0, i, gv, w);
        at_cu_loadw(m, 0, i, mv, w);
        at_cu_loadw(v, 0, i, vv, w);
        for (int k = 0; k < w; k++) {
            float gi = c.grad_scale * gv[k];
            float mi = fmaf(b1c, gi - mv[k], mv[k]);
            float vi = fmaf(b2c, gi * gi, c.beta2 * vv[k]);
            mv[k] = mi;
            vv[k] = vi;
            float denom = fmaf(sqrtf(vi), c.inv_bc2, c.eps);
            pv[k] = pv[k] * c.decay - c.step_size * mi / denom;
        }
        at_cu_storew(m, 0, i, mv, w);
        at_cu_storew(v, 0, i, vv, w);
        at_cu_storew(p, 0, i, pv, w);
    });
}

at_status cu_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v, const at_adamw_params *p)
{
    cuda_ctx *c = cu_ctx(param);
    int64_t n = cu_numel(param);
    if (n == 0) return AT_OK;
    double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    adamw_consts k;
    k.grad_scale = p->grad_scale;
    k.beta1 = p->beta1;
    k.beta2 = p->beta2;
    k.eps = p->eps;
    k.decay = (float)(1.0 - (double)p->lr * (double)p->weight_decay);
    k.step_size = (float)((double)p->lr / bc1);
    k.inv_bc2 = (float)(1.0 / sqrt(bc2));
    int vec = cu_aligned16(cu_ptr(param)) && cu_aligned16(cu_ptr(grad)) && cu_aligned16(cu_ptr(m)) &&
              cu_aligned16(cu_ptr(v));
    unsigned grid = cu_grid(c, vec ? n / AT_VEC : n, OPT_THREADS);
    AT_LAUNCH(k_adamw, grid, OPT_THREADS, 0, c->stream, (float *)cu_ptr(param), (const float *)cu_ptr(grad),
              (float *)cu_ptr(m), (float *)cu_ptr(v), n, k, vec);
    return cu_launched(c, "adamw");
}

/* ---- sumsq ---- */

#define SUMSQ_PER_BLOCK 8192 /* elements a block (at least) before the grid stops growing */
#define SUMSQ_MAX_BLOCKS 1024

static __global__ void k_sumsq_part(float *part, const void *x, int tx, int64_t n, int vec)
{
    __shared__ float red[32];
    float s = 0.0f;
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, i, v, w);
        for (int k = 0; k < w; k++) s = fmaf(v[k], v[k], s);
    });
    s = at_cu_block_sum(s, red);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void k_sumsq_final(float *out, const float *part, int64_t nparts)
{
    __shared__ float red[32];
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = at_cu_block_sum(s, red);
    if (threadIdx.x == 0) out[0] = s;
}

at_status cu_sumsq(at_tensor *out, const at_tensor *x)
{
    cuda_ctx *c = cu_ctx(out);
    int64_t n = cu_numel(x);
    int64_t nparts = (n + SUMSQ_PER_BLOCK - 1) / SUMSQ_PER_BLOCK;
    if (nparts > SUMSQ_MAX_BLOCKS) nparts = SUMSQ_MAX_BLOCKS;
    if (nparts < 1) nparts = 1;
    void *part = NULL;
    CU_TRY(cu_scratch(c, (size_t)nparts * sizeof(float), &part));
    AT_LAUNCH(k_sumsq_part, (unsigned)nparts, OPT_THREADS, 0, c->stream, (float *)part, cu_ptr(x), (int)x->dtype, n,
              cu_aligned16(cu_ptr(x)));
    CU_TRY(cu_launched(c, "sumsq (partial sums)"));
    AT_LAUNCH(k_sumsq_final, 1, 1024, 0, c->stream, (float *)cu_ptr(out), (const float *)part, nparts);
    return cu_launched(c, "sumsq");
}
