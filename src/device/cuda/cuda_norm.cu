/* RMSNorm and LayerNorm (forward, backward) and rotary embedding kernels of
 * the CUDA backend.
 *
 * RMSNorm over the last dimension D, one block per row (rows spread over the
 * grid), f32 accumulation:
 *   forward:  r = 1/sqrt(mean(x²) + eps),  y = x · r · w
 *   backward: with g = dy · w and x̂ = x · r,
 *             dx = r · (g − x̂ · mean(g · x̂)),   dw += Σ_rows dy · x̂
 * The backward's dw is deterministic without atomics: each block sums its
 * rows' dy · x̂ per column (each column owned by one thread, in shared memory
 * or, for very wide rows, in the block's own scratch row), writes that
 * partial row to scratch, and a second kernel adds the partial rows in block
 * order to dw. The block count depends only on the row count and the device.
 *
 * LayerNorm (biased variance) the same way, with the mean and the variance
 * around it as two block sums, and db beside dw:
 *   forward:  μ = mean(x),  r = 1/sqrt(mean((x − μ)²) + eps),  x̂ = (x − μ)·r,  y = x̂·w + b
 *   backward: with g = dy·w,
 *             dx = r·(g − mean(g) − x̂·mean(g·x̂)),  dw += Σ_rows dy·x̂,  db += Σ_rows dy
 *
 * RoPE (Hugging Face rotate_half), with a_i = pos · inv_freq[i] (an f32
 * product, as HF forms it), for i < D/2:
 *   y[i]       = x[i] · cos a_i − x[i + D/2] · sin a_i
 *   y[i + D/2] = x[i + D/2] · cos a_i + x[i] · sin a_i
 * inverse negates sin (the backward: dx = rope⁻¹(dy)). A row of threads per
 * token (several tokens a block): cos/sin once in shared memory, then every
 * (head, i) pair of the token.
 *
 * Rows are walked 8 elements a step in 16-byte accesses when the row length
 * is a multiple of 8 and the pointers are 16-byte aligned (cuda_vec.h). */
#include <math.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

/* Threads for a block that walks one row of D values, per_thread of them a
 * thread: a multiple of 32, between 32 and 1024. */
static int row_threads(int64_t D, int64_t per_thread)
{
    int64_t t = (D + per_thread - 1) / per_thread;
    t = (t + AT_WARP - 1) / AT_WARP * AT_WARP;
    if (t < AT_WARP) t = AT_WARP;
    if (t > 1024) t = 1024;
    return (int)t;
}

/* Blocks for `rows` rows walked grid-stride: a few per SM, at most rows. */
static unsigned row_grid(const cuda_ctx *c, int64_t rows, int per_sm)
{
    int64_t g = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * per_sm;
    if (g > rows) g = rows;
    return (unsigned)(g < 1 ? 1 : g);
}

/* ---- forward ---- */

static __global__ void k_rmsnorm_fwd(void *y, int ty, float *rstd, const void *x, int tx, const void *w, int tw,
                                     int64_t rows, int64_t D, float eps, int vec)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * D;
        float ss = 0.0f;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float v[AT_VEC];
            at_cu_loadw(x, tx, off + i, v, n);
            for (int k = 0; k < n; k++) ss += v[k] * v[k];
        });
        ss = at_cu_block_sum(ss, red);
        float rs = 1.0f / sqrtf(ss / (float)D + eps);
        if (rstd && threadIdx.x == 0) rstd[r] = rs;
        /* y may alias x: element i is read and written by the same thread */
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float v[AT_VEC], wv[AT_VEC];
            at_cu_loadw(x, tx, off + i, v, n);
            at_cu_loadw(w, tw, i, wv, n);
            for (int k = 0; k < n; k++) v[k] = v[k] * rs * wv[k];
            at_cu_storew(y, ty, off + i, v, n);
        });
    }
}

at_status cu_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t rows = cu_rows(x), D = cu_cols(x);
    if (rows == 0 || D == 0) return AT_OK;
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(y)) && cu_aligned16(cu_ptr(x)) && cu_aligned16(cu_ptr(w));
    AT_LAUNCH(k_rmsnorm_fwd, row_grid(c, rows, 16), row_threads(D, vec ? 2 * AT_VEC : 4), 0, c->stream, cu_ptr(y),
              (int)y->dtype, rstd ? (float *)cu_ptr(rstd) : (float *)NULL, cu_ptr(x), (int)x->dtype, cu_ptr(w),
              (int)w->dtype, rows, D, eps, vec);
    return cu_launched(c, "rmsnorm_forward");
}

/* ---- backward ---- */

/* Partial dw rows live in shared memory up to this width, else in scratch. */
#define NORM_SHARED_MAX_D 8192

/* part: [gridDim.x, D] f32 partial dw rows (NULL when dw is not wanted).
 * acc: shared (use_shared) or the block's own scratch row. */
static __global__ void k_rmsnorm_bwd(void *dx, int tdx, float *part, int use_shared, const void *dy, int tdy,
                                     const void *x, int tx, const void *w, int tw, const float *rstd, int64_t rows,
                                     int64_t D, int vec)
{
    AT_DYNAMIC_SHARED(float, shm);
    __shared__ float red[32];
    /* acc[i] is only ever touched by the thread at_cu_for_row gives i to
     * (the same mapping in every loop below), so it needs no barrier */
    float *acc = part ? (use_shared ? shm : part + (int64_t)blockIdx.x * D) : (float *)0;
    if (acc)
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            for (int k = 0; k < n; k++) acc[i + k] = 0.0f;
        });
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * D;
        float rs = rstd[r];
        /* s = Σ dy·w·x;  x̂ · mean(g·x̂) = x · c  with c = r²·s/D */
        float s = 0.0f;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float d[AT_VEC], wv[AT_VEC], xv[AT_VEC];
            at_cu_loadw(dy, tdy, off + i, d, n);
            at_cu_loadw(w, tw, i, wv, n);
            at_cu_loadw(x, tx, off + i, xv, n);
            for (int k = 0; k < n; k++) s += d[k] * wv[k] * xv[k];
        });
        s = at_cu_block_sum(s, red); /* its trailing barrier: every read of the row precedes any write */
        float cc = rs * rs * s / (float)D;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float d[AT_VEC], wv[AT_VEC], xv[AT_VEC];
            at_cu_loadw(dy, tdy, off + i, d, n);
            at_cu_loadw(w, tw, i, wv, n);
            at_cu_loadw(x, tx, off + i, xv, n);
            for (int k = 0; k < n; k++) {
                if (acc) acc[i + k] += d[k] * xv[k] * rs;
                d[k] = rs * (d[k] * wv[k] - xv[k] * cc);
            }
            at_cu_storew(dx, tdx, off + i, d, n);
        });
    }
    if (acc && use_shared)
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            for (int k = 0; k < n; k++) part[(int64_t)blockIdx.x * D + i + k] = acc[i + k];
        });
}

/* dw[j] += Σ_b part[b, j], blocks in order (CPU: acc = dw; acc += partials). */
static __global__ void k_rmsnorm_dw(void *dw, int tdw, const float *part, int64_t nparts, int64_t D)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D; j += (int64_t)blockDim.x * gridDim.x) {
        float a = at_cu_load(dw, tdw, j);
        for (int64_t b = 0; b < nparts; b++) a += part[b * D + j];
        at_cu_store(dw, tdw, j, a);
    }
}

at_status cu_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                              const at_tensor *w, const at_tensor *rstd)
{
    cuda_ctx *c = cu_ctx(dx);
    int64_t rows = cu_rows(x), D = cu_cols(x);
    if (rows == 0 || D == 0) return AT_OK;
    unsigned grid = row_grid(c, rows, 8);
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(dx)) && cu_aligned16(cu_ptr(dy)) && cu_aligned16(cu_ptr(x)) &&
              cu_aligned16(cu_ptr(w));
    int threads = row_threads(D, vec ? 2 * AT_VEC : 4);
    float *part = NULL;
    int use_shared = D <= NORM_SHARED_MAX_D;
    if (dw) {
        void *p = NULL;
        CU_TRY(cu_scratch(c, (size_t)grid * (size_t)D * sizeof(float), &p));
        part = (float *)p;
    }
    size_t shmem = dw && use_shared ? (size_t)D * sizeof(float) : 0;
    AT_LAUNCH(k_rmsnorm_bwd, grid, threads, shmem, c->stream, cu_ptr(dx), (int)dx->dtype, part, use_shared,
              cu_ptr(dy), (int)dy->dtype, cu_ptr(x), (int)x->dtype, cu_ptr(w), (int)w->dtype,
              (const float *)cu_ptr(rstd), rows, D, vec);
    CU_TRY(cu_launched(c, "rmsnorm_backward"));
    if (!dw) return AT_OK;
    AT_LAUNCH(k_rmsnorm_dw, cu_blocks(D, 256), 256, 0, c->stream, cu_ptr(dw), (int)dw->dtype, (const float *)part,
              (int64_t)grid, D);
    return cu_launched(c, "rmsnorm_backward (dw)");
}

/* ---- LayerNorm ---- */

static __global__ void k_layernorm_fwd(void *y, int ty, float *mean, float *rstd, const void *x, int tx,
                                       const void *w, int tw, const void *b, int tb, int64_t rows, int64_t D,
                                       float eps, int vec)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * D;
        float s = 0.0f;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float v[AT_VEC];
            at_cu_loadw(x, tx, off + i, v, n);
            for (int k = 0; k < n; k++) s += v[k];
        });
        float mu = at_cu_block_sum(s, red) / (float)D;
        float ss = 0.0f;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float v[AT_VEC];
            at_cu_loadw(x, tx, off + i, v, n);
            for (int k = 0; k < n; k++) ss += (v[k] - mu) * (v[k] - mu);
        });
        float rs = 1.0f / sqrtf(at_cu_block_sum(ss, red) / (float)D + eps);
        if (mean && threadIdx.x == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
        /* y may alias x: element i is read and written by the same thread */
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float v[AT_VEC], wv[AT_VEC], bv[AT_VEC];
            at_cu_loadw(x, tx, off + i, v, n);
            at_cu_loadw(w, tw, i, wv, n);
            if (b) at_cu_loadw(b, tb, i, bv, n);
            for (int k = 0; k < n; k++) v[k] = (v[k] - mu) * rs * wv[k] + (b ? bv[k] : 0.0f);
            at_cu_storew(y, ty, off + i, v, n);
        });
    }
}

at_status cu_layernorm_forward(at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                               const at_tensor *w, const at_tensor *b, float eps)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t rows = cu_rows(x), D = cu_cols(x);
    if (rows == 0 || D == 0) return AT_OK;
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(y)) && cu_aligned16(cu_ptr(x)) && cu_aligned16(cu_ptr(w)) &&
              (!b || cu_aligned16(cu_ptr(b)));
    AT_LAUNCH(k_layernorm_fwd, row_grid(c, rows, 16), row_threads(D, vec ? 2 * AT_VEC : 4), 0, c->stream,
              cu_ptr(y), (int)y->dtype, mean ? (float *)cu_ptr(mean) : (float *)NULL,
              rstd ? (float *)cu_ptr(rstd) : (float *)NULL, cu_ptr(x), (int)x->dtype, cu_ptr(w), (int)w->dtype,
              b ? cu_ptr(b) : (const void *)NULL, b ? (int)b->dtype : 0, rows, D, eps, vec);
    return cu_launched(c, "layernorm_forward");
}

/* part: [gridDim.x, 2, D] f32 partial dw and db rows (NULL when neither is
 * wanted); acc: shared (use_shared) or the block's own scratch rows. */
static __global__ void k_layernorm_bwd(void *dx, int tdx, float *part, int use_shared, const void *dy, int tdy,
                                       const void *x, int tx, const void *w, int tw, const float *mean,
                                       const float *rstd, int64_t rows, int64_t D, int vec)
{
    AT_DYNAMIC_SHARED(float, shm);
    __shared__ float red[32];
    /* acc[i], acc[D + i]: only touched by the thread at_cu_for_row gives i to */
    float *acc = part ? (use_shared ? shm : part + (int64_t)blockIdx.x * 2 * D) : (float *)0;
    if (acc)
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            for (int k = 0; k < n; k++) acc[i + k] = acc[D + i + k] = 0.0f;
        });
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * D;
        float mu = mean[r], rs = rstd[r], sg = 0.0f, sgx = 0.0f;
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float d[AT_VEC], wv[AT_VEC], xv[AT_VEC];
            at_cu_loadw(dy, tdy, off + i, d, n);
            at_cu_loadw(w, tw, i, wv, n);
            at_cu_loadw(x, tx, off + i, xv, n);
            for (int k = 0; k < n; k++) {
                sg += d[k] * wv[k];
                sgx += d[k] * wv[k] * (xv[k] - mu) * rs;
            }
        });
        float mg = at_cu_block_sum(sg, red) / (float)D;
        float mgx = at_cu_block_sum(sgx, red) / (float)D; /* its trailing barrier: reads precede writes */
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            float d[AT_VEC], wv[AT_VEC], xv[AT_VEC];
            at_cu_loadw(dy, tdy, off + i, d, n);
            at_cu_loadw(w, tw, i, wv, n);
            at_cu_loadw(x, tx, off + i, xv, n);
            for (int k = 0; k < n; k++) {
                float xh = (xv[k] - mu) * rs;
                if (acc) {
                    acc[i + k] += d[k] * xh;
                    acc[D + i + k] += d[k];
                }
                d[k] = rs * (d[k] * wv[k] - mg - xh * mgx);
            }
            at_cu_storew(dx, tdx, off + i, d, n);
        });
    }
    if (acc && use_shared)
        at_cu_for_row(D, vec, [&](int64_t i, int n) {
            for (int k = 0; k < n; k++) {
                part[(int64_t)blockIdx.x * 2 * D + i + k] = acc[i + k];
                part[(int64_t)blockIdx.x * 2 * D + D + i + k] = acc[D + i + k];
            }
        });
}

/* g[j] += Σ_b part[b, which, j], blocks in order (which 0: dw, 1: db). */
static __global__ void k_layernorm_grad(void *g, int tg, const float *part, int which, int64_t nparts, int64_t D)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D; j += (int64_t)blockDim.x * gridDim.x) {
        float a = at_cu_load(g, tg, j);
        for (int64_t b = 0; b < nparts; b++) a += part[(b * 2 + which) * D + j];
        at_cu_store(g, tg, j, a);
    }
}

at_status cu_layernorm_backward(at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy, const at_tensor *x,
                                const at_tensor *w, const at_tensor *mean, const at_tensor *rstd)
{
    cuda_ctx *c = cu_ctx(dx);
    int64_t rows = cu_rows(x), D = cu_cols(x);
    if (rows == 0 || D == 0) return AT_OK;
    unsigned grid = row_grid(c, rows, 8);
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(dx)) && cu_aligned16(cu_ptr(dy)) && cu_aligned16(cu_ptr(x)) &&
              cu_aligned16(cu_ptr(w));
    int threads = row_threads(D, vec ? 2 * AT_VEC : 4);
    float *part = NULL;
    int use_shared = 2 * D <= NORM_SHARED_MAX_D;
    if (dw || db) {
        void *p = NULL;
        CU_TRY(cu_scratch(c, (size_t)grid * 2 * (size_t)D * sizeof(float), &p));
        part = (float *)p;
    }
    size_t shmem = part && use_shared ? 2 * (size_t)D * sizeof(float) : 0;
    AT_LAUNCH(k_layernorm_bwd, grid, threads, shmem, c->stream, cu_ptr(dx), (int)dx->dtype, part, use_shared,
              cu_ptr(dy), (int)dy->dtype, cu_ptr(x), (int)x->dtype, cu_ptr(w), (int)w->dtype,
              (const float *)cu_ptr(mean), (const float *)cu_ptr(rstd), rows, D, vec);
    CU_TRY(cu_launched(c, "layernorm_backward"));
    at_tensor *grads[2] = {dw, db};
    for (int k = 0; k < 2; k++) {
        if (!grads[k]) continue;
        AT_LAUNCH(k_layernorm_grad, cu_blocks(D, 256), 256, 0, c->stream, cu_ptr(grads[k]), (int)grads[k]->dtype,
                  (const float *)part, k, (int64_t)grid, D);
        CU_TRY(cu_launched(c, k ? "layernorm_backward (db)" : "layernorm_backward (dw)"));
    }
    return AT_OK;
}

/* ---- rope ---- */

/* The (head, i..i+W) pairs of token t: both halves read before either is
 * written (y may be x). W is 8 (16-byte accesses) or 1. */
template <int W>
static __device__ __forceinline__ void rope_pairs(void *y, int ty, const void *x, int tx, const float *cs,
                                                  const float *sn, int64_t t, int64_t H, int64_t half)
{
    int64_t groups = half / W, D = 2 * half;
    for (int64_t k = threadIdx.x; k < H * groups; k += blockDim.x) {
        int64_t h = k / groups, i = (k - h * groups) * W, off = (t * H + h) * D;
        float a[AT_VEC], b[AT_VEC];
        at_cu_loadw(x, tx, off + i, a, W);
        at_cu_loadw(x, tx, off + i + half, b, W);
        for (int j = 0; j < W; j++) {
            float c = cs[i + j], s = sn[i + j], aj = a[j];
            a[j] = aj * c - b[j] * s;
            b[j] = b[j] * c + aj * s;
        }
        at_cu_storew(y, ty, off + i, a, W);
        at_cu_storew(y, ty, off + i + half, b, W);
    }
}

/* Block (threads along the pairs, blockDim.y tokens): each row of threads
 * takes one token, its cos/sin in its own slice of shared memory. */
static __global__ void k_rope(void *y, int ty, const void *x, int tx, const int32_t *pos, const float *inv_freq,
                              at_rope_sections sec, int64_t ntok, int64_t H, int64_t half, float sign, int vec)
{
    AT_DYNAMIC_SHARED(float, shm);
    float *cs = shm + (int64_t)threadIdx.y * 2 * half, *sn = cs + half; /* cos [half], then sign·sin [half] */
    for (int64_t t0 = (int64_t)blockIdx.x * blockDim.y; t0 < ntok; t0 += (int64_t)gridDim.x * blockDim.y) {
        int64_t t = t0 + threadIdx.y;
        __syncthreads(); /* the previous token's pairs are done with cs/sn */
        if (t < ntok) {
            for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
                int k = 0; /* the position component of frequency i (at_rope_section_of) */
                if (sec.interleaved) {
                    k = (int)(i % sec.n);
                    if (i >= (int64_t)sec.n * sec.len[k]) k = 0;
                } else {
                    for (int64_t end = sec.len[0]; k < sec.n - 1 && i >= end; end += sec.len[++k]) {}
                }
                float a = (float)pos[t * sec.n + k] * inv_freq[i];
                cs[i] = cosf(a);
                sn[i] = sign * sinf(a);
            }
        }
        __syncthreads();
        if (t >= ntok) continue;
        if (vec) rope_pairs<AT_VEC>(y, ty, x, tx, cs, sn, t, H, half);
        else rope_pairs<1>(y, ty, x, tx, cs, sn, t, H, half);
    }
}

at_status cu_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                  const at_rope_sections *sections, int inverse)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t D = x->shape[x->ndim - 1], H = x->shape[x->ndim - 2], half = D / 2;
    int64_t ntok = H * D > 0 ? cu_numel(x) / (H * D) : 0;
    if (ntok == 0 || half == 0) return AT_OK;
    int vec = half % AT_VEC == 0 && cu_aligned16(cu_ptr(y)) && cu_aligned16(cu_ptr(x));
    at_rope_sections sec = {1, {(int)half, 0, 0, 0}, 0};
    if (sections) sec = *sections;
    /* a warp or more per token along its pairs, tokens stacked up to ~256 threads a block */
    int tx = row_threads(H * half, vec ? AT_VEC : 2), tpb = tx >= 256 ? 1 : 256 / tx;
    int64_t g = (ntok + tpb - 1) / tpb;
    unsigned grid = g < 65536 ? (unsigned)g : 65536u;
    dim3 block((unsigned)tx, (unsigned)tpb);
    AT_LAUNCH(k_rope, grid, block, (size_t)tpb * (size_t)D * sizeof(float), c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(x), (int)x->dtype, (const int32_t *)cu_ptr(pos), (const float *)cu_ptr(inv_freq), sec, ntok, H, half,
              inverse ? -1.0f : 1.0f, vec);
    return cu_launched(c, "rope");
}
