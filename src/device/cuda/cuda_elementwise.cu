/* Elementwise kernels of the CUDA backend: add, scale, axpy, fill, cast,
 * sum_rows, SwiGLU and GELU forward/backward, dropout.
 *
 * Every kernel reads its inputs by a dtype code (f32/bf16/f16) that is
 * uniform over the launch, so the branch costs nothing next to the memory
 * traffic, computes in f32 with the CPU kernels' formulas in the same order,
 * and rounds once on store. Grid-stride loops over the flat index, 8
 * elements a step in 16-byte accesses where every pointer is 16-byte aligned
 * (cuda_vec.h; the elements past the last whole group one at a time):
 * consecutive threads touch consecutive memory, and a grid capped at a few
 * waves keeps launch sizes sane for any n.
 *
 * Outputs may alias inputs (in-place calls): each element is read before it
 * is written, by the same thread, and no thread touches another's element. */
#include <math.h>
#include <string.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

#define EW_THREADS 256

/* Blocks for a grid-stride loop over n elements (cu_grid). */
static unsigned ew_grid(const cuda_ctx *c, int64_t n) { return cu_grid(c, n, EW_THREADS); }

/* ---- add / scale / axpy ---- */

/* Whether every pointer allows the 16-byte path. */
static int vec_ok(const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL,
                  const void *e = NULL)
{
    return cu_aligned16(a) && (!b || cu_aligned16(b)) && (!c || cu_aligned16(c)) && (!d || cu_aligned16(d)) &&
           (!e || cu_aligned16(e));
}

/* y = a + b; b is a's size or one row of `cols` broadcast over a's rows
 * (with vec, cols is a multiple of 8, so a group never straddles rows). */
static __global__ void k_add(void *y, int ty, const void *a, int ta, const void *b, int tb, int64_t n, int64_t cols,
                             int bcast, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float va[AT_VEC], vb[AT_VEC];
        at_cu_loadw(a, ta, i, va, w);
        at_cu_loadw(b, tb, bcast ? i % cols : i, vb, w);
        for (int k = 0; k < w; k++) va[k] += vb[k];
        at_cu_storew(y, ty, i, va, w);
    });
}

at_status cu_add(at_tensor *y, const at_tensor *a, const at_tensor *b)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(a), nb = cu_numel(b);
    if (n == 0) return AT_OK;
    int bcast = nb != n;
    int vec = vec_ok(cu_ptr(y), cu_ptr(a), cu_ptr(b)) && (!bcast || nb % AT_VEC == 0);
    AT_LAUNCH(k_add, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(a), (int)a->dtype, cu_ptr(b), (int)b->dtype, n, bcast ? nb : n, bcast, vec);
    return cu_launched(c, "add");
}

/* y = s · x */
static __global__ void k_scale(void *y, int ty, const void *x, int tx, float s, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, i, v, w);
        for (int k = 0; k < w; k++) v[k] *= s;
        at_cu_storew(y, ty, i, v, w);
    });
}

at_status cu_scale(at_tensor *y, const at_tensor *x, float s)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(x);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(y), cu_ptr(x));
    AT_LAUNCH(k_scale, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(x), (int)x->dtype, s, n, vec);
    return cu_launched(c, "scale");
}

/* y += alpha · x (one fused multiply-add, as the CPU's FMA path) */
static __global__ void k_axpy(void *y, int ty, float alpha, const void *x, int tx, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float vx[AT_VEC], vy[AT_VEC];
        at_cu_loadw(x, tx, i, vx, w);
        at_cu_loadw(y, ty, i, vy, w);
        for (int k = 0; k < w; k++) vy[k] = fmaf(alpha, vx[k], vy[k]);
        at_cu_storew(y, ty, i, vy, w);
    });
}

at_status cu_axpy(at_tensor *y, float alpha, const at_tensor *x)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(x);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(y), cu_ptr(x));
    AT_LAUNCH(k_axpy, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype, alpha,
              cu_ptr(x), (int)x->dtype, n, vec);
    return cu_launched(c, "axpy");
}

/* ---- fill ---- */

/* The bit pattern is formed on the host (the same conversion as the CPU's),
 * the kernel only stores it: 4-byte or 2-byte words. */
static __global__ void k_fill32(uint32_t *y, uint32_t bits, int64_t n)
{
    CU_GRID_STRIDE(i, n) y[i] = bits;
}

static __global__ void k_fill16(uint16_t *y, uint16_t bits, int64_t n)
{
    CU_GRID_STRIDE(i, n) y[i] = bits;
}

at_status cu_fill(at_tensor *y, float value)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(y);
    if (y->dtype == AT_F32 || y->dtype == AT_I32) {
        uint32_t bits;
        if (y->dtype == AT_F32) {
            memcpy(&bits, &value, 4);
        } else {
            if (!(value >= -2147483648.0f && value < 2147483648.0f)) /* the cast would be undefined */
                return c->host->error(AT_ERR_INVALID, "fill: %g does not fit i32 tensor %s", (double)value, y->name);
            int32_t iv = (int32_t)value;
            memcpy(&bits, &iv, 4);
        }
        if (n == 0) return AT_OK;
        AT_LAUNCH(k_fill32, ew_grid(c, n), EW_THREADS, 0, c->stream, (uint32_t *)cu_ptr(y), bits, n);
    } else if (y->dtype == AT_BF16 || y->dtype == AT_F16) {
        uint16_t h = y->dtype == AT_BF16 ? at_cu_f32_to_bf16(value) : at_cu_f32_to_f16(value);
        if (n == 0) return AT_OK;
        AT_LAUNCH(k_fill16, ew_grid(c, n), EW_THREADS, 0, c->stream, (uint16_t *)cu_ptr(y), h, n);
    } else {
        return c->host->error(AT_ERR_UNSUPPORTED, "fill: tensor %s has a dtype (%d) the CUDA backend cannot fill",
                              y->name, (int)y->dtype);
    }
    return cu_launched(c, "fill");
}

/* ---- cast ---- */

/* Bytes of n elements of dtype t (device/dtype.h's at_dtype_bytes, which the
 * library cannot call: it does not link the core). 0 for an unknown dtype. */
static size_t dtype_bytes(at_dtype t, int64_t n)
{
    switch (t) {
    case AT_F32:
    case AT_I32: return (size_t)n * 4;
    case AT_BF16:
    case AT_F16: return (size_t)n * 2;
    case AT_Q8_0: return (size_t)((n + 31) / 32) * 34;
    case AT_Q4_0: return (size_t)((n + 31) / 32) * 18;
    case AT_NF4: { /* device/quant.h: header, 33 bytes a block, f32 per 256 blocks, 4-aligned */
        size_t nb = (size_t)((n + 63) / 64), ng = (nb + 255) / 256;
        size_t a = (16 + 33 * nb + 3) / 4 * 4;
        return a + 4 * ng;
    }
    default: return 0;
    }
}

static __global__ void k_cast(void *y, int ty, const void *x, int tx, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, i, v, w);
        at_cu_storew(y, ty, i, v, w);
    });
}

at_status cu_cast(at_tensor *y, const at_tensor *x)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(x);
    if (x->dtype == y->dtype) { /* a byte copy, any dtype (i32 and quantized included) */
        size_t nb = dtype_bytes(x->dtype, n);
        if (nb == 0 || cu_ptr(x) == cu_ptr(y)) return AT_OK;
        return cu_check(c, cudaMemcpyAsync(cu_ptr(y), cu_ptr(x), nb, cudaMemcpyDeviceToDevice, c->stream), "cast");
    }
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(y), cu_ptr(x));
    AT_LAUNCH(k_cast, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(x), (int)x->dtype, n, vec);
    return cu_launched(c, "cast");
}

/* ---- sum_rows ----
 * y[j] = beta·y[j] + Σ_r x[r, j], deterministic in two stages:
 *   1. block (tile of 32 columns, chunk of rows): its 32×8 threads sum rows
 *      ty, ty + 8, ... of the chunk for column tx, the 8 partials are added in
 *      shared memory in a fixed order, and the chunk's sum goes to
 *      part[chunk, j];
 *   2. one thread per column adds the chunks' sums in chunk order to beta·y.
 * The chunk count depends only on the shape, so the result is the same on
 * every run. */

#define SR_COLS 32
#define SR_ROWS 8
#define SR_CHUNK_ROWS 256 /* rows per chunk (at least) */
#define SR_MAX_CHUNKS 1024

static __global__ void k_sum_rows_part(float *part, const void *x, int tx, int64_t rows, int64_t cols,
                                       int64_t chunk_rows)
{
    __shared__ float acc[SR_ROWS][SR_COLS];
    int64_t j = (int64_t)blockIdx.x * SR_COLS + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    float s = 0.0f;
    if (j < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += SR_ROWS) s += at_cu_load(x, tx, r * cols + j);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        float t = acc[0][threadIdx.x];
        for (int k = 1; k < SR_ROWS; k++) t += acc[k][threadIdx.x];
        part[(int64_t)blockIdx.y * cols + j] = t;
    }
}

static __global__ void k_sum_rows_final(void *y, int ty, const float *part, int64_t nchunks, int64_t cols, float beta)
{
    CU_GRID_STRIDE(j, cols)
    {
        float s = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) s += part[k * cols + j];
        /* beta == 0 ignores y, even NaN */
        float old = beta != 0.0f ? beta * at_cu_load(y, ty, j) : 0.0f;
        at_cu_store(y, ty, j, old + s);
    }
}

at_status cu_sum_rows(at_tensor *y, const at_tensor *x, float beta)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t cols = cu_cols(x), rows = cu_rows(x);
    if (cols == 0) return AT_OK;
    int64_t nchunks = (rows + SR_CHUNK_ROWS - 1) / SR_CHUNK_ROWS;
    if (nchunks > SR_MAX_CHUNKS) nchunks = SR_MAX_CHUNKS;
    if (nchunks < 1) nchunks = 1;
    int64_t chunk_rows = (rows + nchunks - 1) / nchunks;
    if (chunk_rows < 1) chunk_rows = 1;
    void *part = NULL;
    CU_TRY(cu_scratch(c, (size_t)nchunks * (size_t)cols * sizeof(float), &part));
    dim3 grid((unsigned)((cols + SR_COLS - 1) / SR_COLS), (unsigned)nchunks), block(SR_COLS, SR_ROWS);
    AT_LAUNCH(k_sum_rows_part, grid, block, 0, c->stream, (float *)part, cu_ptr(x), (int)x->dtype, rows, cols,
              chunk_rows);
    CU_TRY(cu_launched(c, "sum_rows (partial sums)"));
    AT_LAUNCH(k_sum_rows_final, ew_grid(c, cols), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              (const float *)part, nchunks, cols, beta);
    return cu_launched(c, "sum_rows");
}

/* ---- SwiGLU ----
 *   forward:  y = silu(g)·u,  silu(g) = g·σ(g),  σ(g) = 1/(1 + e^−g)
 *   backward: dg = dy·u·σ(g)·(1 + g·(1 − σ(g))),  du = dy·silu(g) */

static __device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

static __global__ void k_swiglu_fwd(void *y, int ty, const void *gate, int tg, const void *up, int tu, int64_t n,
                                    int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float g[AT_VEC], u[AT_VEC];
        at_cu_loadw(gate, tg, i, g, w);
        at_cu_loadw(up, tu, i, u, w);
        for (int k = 0; k < w; k++) u[k] = g[k] * sigmoidf(g[k]) * u[k];
        at_cu_storew(y, ty, i, u, w);
    });
}

at_status cu_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(gate);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(y), cu_ptr(gate), cu_ptr(up));
    AT_LAUNCH(k_swiglu_fwd, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(gate), (int)gate->dtype, cu_ptr(up), (int)up->dtype, n, vec);
    return cu_launched(c, "swiglu_forward");
}

/* All three inputs are read before either output is written: dgate/dup may
 * alias gate/up/dy. */
static __global__ void k_swiglu_bwd(void *dg, int tdg, void *du, int tdu, const void *dy, int tdy, const void *gate,
                                    int tg, const void *up, int tu, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float d[AT_VEC], g[AT_VEC], u[AT_VEC];
        at_cu_loadw(dy, tdy, i, d, w);
        at_cu_loadw(gate, tg, i, g, w);
        at_cu_loadw(up, tu, i, u, w);
        for (int k = 0; k < w; k++) {
            float sg = sigmoidf(g[k]);
            float a = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
            float b = d[k] * g[k] * sg;
            g[k] = a;
            u[k] = b;
        }
        at_cu_storew(dg, tdg, i, g, w);
        at_cu_storew(du, tdu, i, u, w);
    });
}

at_status cu_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                             const at_tensor *up)
{
    cuda_ctx *c = cu_ctx(dgate);
    int64_t n = cu_numel(gate);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(dgate), cu_ptr(dup), cu_ptr(dy), cu_ptr(gate), cu_ptr(up));
    AT_LAUNCH(k_swiglu_bwd, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(dgate),
              (int)dgate->dtype, cu_ptr(dup), (int)dup->dtype, cu_ptr(dy), (int)dy->dtype, cu_ptr(gate),
              (int)gate->dtype, cu_ptr(up), (int)up->dtype, n, vec);
    return cu_launched(c, "swiglu_backward");
}

/* ---- GELU (the kinds of at_gelu_kind; the CPU kernel's f32 formulas) ---- */

static __device__ __forceinline__ float gelu_f(float x, int kind, float *dydx)
{
    if (kind == AT_GELU_TANH) {
        const float c = 0.7978845608f, a = 0.044715f; /* √(2/π) */
        float t = tanhf(c * (x + a * x * x * x));
        if (dydx) *dydx = 0.5f * (1 + t) + 0.5f * x * (1 - t * t) * c * (1 + 3 * a * x * x);
        return 0.5f * x * (1 + t);
    }
    if (kind == AT_GELU_QUICK) {
        float s = sigmoidf(1.702f * x);
        if (dydx) *dydx = s * (1 + 1.702f * x * (1 - s));
        return x * s;
    }
    float cdf = 0.5f * (1 + erff(x * 0.70710678f));
    if (dydx) *dydx = cdf + x * expf(-0.5f * x * x) * 0.39894228f; /* 1/√(2π) */
    return x * cdf;
}

static __global__ void k_gelu_fwd(void *y, int ty, const void *x, int tx, int kind, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, i, v, w);
        for (int k = 0; k < w; k++) v[k] = gelu_f(v[k], kind, (float *)0);
        at_cu_storew(y, ty, i, v, w);
    });
}

at_status cu_gelu_forward(at_tensor *y, const at_tensor *x, int kind)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(x);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(y), cu_ptr(x));
    AT_LAUNCH(k_gelu_fwd, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(x), (int)x->dtype, kind, n, vec);
    return cu_launched(c, "gelu_forward");
}

/* Both inputs are read before dx is written: dx may alias dy or x. */
static __global__ void k_gelu_bwd(void *dx, int tdx, const void *dy, int tdy, const void *x, int tx, int kind,
                                  int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float d[AT_VEC], v[AT_VEC];
        at_cu_loadw(dy, tdy, i, d, w);
        at_cu_loadw(x, tx, i, v, w);
        for (int k = 0; k < w; k++) {
            float g;
            gelu_f(v[k], kind, &g);
            d[k] *= g;
        }
        at_cu_storew(dx, tdx, i, d, w);
    });
}

at_status cu_gelu_backward(at_tensor *dx, const at_tensor *dy, const at_tensor *x, int kind)
{
    cuda_ctx *c = cu_ctx(dx);
    int64_t n = cu_numel(x);
    if (n == 0) return AT_OK;
    int vec = vec_ok(cu_ptr(dx), cu_ptr(dy), cu_ptr(x));
    AT_LAUNCH(k_gelu_bwd, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(dx), (int)dx->dtype,
              cu_ptr(dy), (int)dy->dtype, cu_ptr(x), (int)x->dtype, kind, n, vec);
    return cu_launched(c, "gelu_backward");
}

/* ---- dropout ----
 * y[i] = x[i]·keep if at_cu_dropout_uniform(seed, counter(i)) >= p, else 0,
 * counter(i) = offset + (i / run)·pitch + i % run (ops.h; run 0: offset + i),
 * with keep = 1/(1 − p) formed on the host in f32 as the CPU does: the mask
 * and the values equal the CPU's bit for bit. p == 0 copies (converting dtype). */
static __global__ void k_dropout(void *y, int ty, const void *x, int tx, float p, float keep, uint64_t seed,
                                 uint64_t offset, int64_t run, uint64_t pitch, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, i, v, w);
        if (p != 0.0f) {
            /* one division per vector: the counter then steps, jumping at a run's end */
            int64_t in_run = run > 0 ? i % run : i;
            uint64_t row = run > 0 ? (uint64_t)(i / run) : 0;
            for (int k = 0; k < w; k++) {
                uint64_t counter = offset + row * pitch + (uint64_t)in_run;
                v[k] = at_cu_dropout_uniform(seed, counter) >= p ? v[k] * keep : 0.0f;
                if (++in_run == run) in_run = 0, row++;
            }
        }
        at_cu_storew(y, ty, i, v, w);
    });
}

at_status cu_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                     uint64_t pitch)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(x);
    if (n == 0) return AT_OK;
    if (p == 0.0f && x->dtype == y->dtype) return cu_cast(y, x);
    float keep = 1.0f / (1.0f - p);
    int vec = vec_ok(cu_ptr(y), cu_ptr(x));
    AT_LAUNCH(k_dropout, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y), (int)y->dtype,
              cu_ptr(x), (int)x->dtype, p, keep, seed, offset, run, pitch, n, vec);
    return cu_launched(c, "dropout");
}

/* ---- uniform noise (NEFTune) ----
 * y[i] += m·(2u − 1), u = at_cu_hash_uniform(seed, counter(i)), counters as
 * in dropout. __fmul_rn/__fadd_rn keep nvcc from fusing them into one fma:
 * two roundings, as the CPU does, so the noise equals the CPU's bit for bit. */
static __global__ void k_add_uniform_noise(void *y, int ty, float m, uint64_t seed, uint64_t offset, int64_t run,
                                           uint64_t pitch, int64_t n, int vec)
{
    at_cu_for_each(n, vec, [&](int64_t i, int w) {
        float v[AT_VEC];
        at_cu_loadw(y, ty, i, v, w);
        int64_t in_run = run > 0 ? i % run : i;
        uint64_t row = run > 0 ? (uint64_t)(i / run) : 0;
        for (int k = 0; k < w; k++) {
            uint64_t counter = offset + row * pitch + (uint64_t)in_run;
            float s = 2.0f * at_cu_hash_uniform(seed, counter) - 1.0f; /* exact */
            v[k] = __fadd_rn(v[k], __fmul_rn(m, s));
            if (++in_run == run) in_run = 0, row++;
        }
        at_cu_storew(y, ty, i, v, w);
    });
}

at_status cu_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                               uint64_t pitch)
{
    cuda_ctx *c = cu_ctx(y);
    int64_t n = cu_numel(y);
    if (n == 0 || magnitude == 0.0f) return AT_OK;
    int vec = vec_ok(cu_ptr(y));
    AT_LAUNCH(k_add_uniform_noise, ew_grid(c, n / (vec ? AT_VEC : 1)), EW_THREADS, 0, c->stream, cu_ptr(y),
              (int)y->dtype, magnitude, seed, offset, run, pitch, n, vec);
    return cu_launched(c, "add_uniform_noise");
}
