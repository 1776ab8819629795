/* CPU kernels of the elementwise operations: add, scale, axpy, fill, cast,
 * sum_rows, SwiGLU and GELU (see ops/ops.h for the math; arguments are checked by
 * the dispatcher). f32/bf16/f16 are converted to f32 in chunks on load and
 * rounded to nearest even on store. */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>
#include "device/cpu/cpu_simd.h"

/* Every kernel here walks its tensors in chunks of AT_CPU_CHUNK elements of
 * one row (rows = the tensor, or the rows of a broadcast add), converting each
 * chunk to f32 on the stack, so no allocation and no failure path. */

static int64_t nchunks(int64_t cols) { return (cols + AT_CPU_CHUNK - 1) / AT_CPU_CHUNK; }

/* Whether n f32 values at a and at b share any byte (a's dtype may be
 * narrower: counting 4 bytes a value only makes the test safer). */
static int overlaps(const void *a, const void *b, int64_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, len = (uintptr_t)n * sizeof(float);
    return x < y + len && y < x + len;
}

/* y = a + b, b of a's size or one row broadcast over a's rows. */
at_status at_cpu_add(at_tensor *y, const at_tensor *a, const at_tensor *b)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(a);
    int bcast = at_tensor_numel(b) != n;
    int64_t cols = bcast ? at_tensor_numel(b) : n, rows = cols ? n / cols : 0, cpr = nchunks(cols);
    const void *pa = at_tensor_data(a), *pb = at_tensor_data(b);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN)
    for (int64_t u = 0; u < rows * cpr; u++) {
        float ba[AT_CPU_CHUNK], bb[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t r = u / cpr, c0 = (u % cpr) * AT_CPU_CHUNK;
        int64_t len = cols - c0 < AT_CPU_CHUNK ? cols - c0 : AT_CPU_CHUNK, off = r * cols + c0;
        const float *xa = at_cpu_in(v, ba, pa, a->dtype, off, len);
        const float *xb = at_cpu_in(v, bb, pb, b->dtype, bcast ? c0 : off, len);
        float *o = at_cpu_out(by, py, y->dtype, off);
        v->add(o, xa, xb, len);
        at_cpu_out_done(v, o, py, y->dtype, off, len);
    }
    return AT_OK;
}

/* y = s·x (accumulate 0) or y += s·x (accumulate 1). */
static at_status scaled(at_tensor *y, const at_tensor *x, float s, int accumulate)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(x), nc = nchunks(n);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN)
    for (int64_t u = 0; u < nc; u++) {
        float bx[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t off = u * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *xi = at_cpu_in(v, bx, px, x->dtype, off, len);
        float *o = at_cpu_out(by, py, y->dtype, off);
        if (!accumulate) {
            v->scale(o, xi, s, len);
        } else {
            if (y->dtype != AT_F32) v->load(o, at_cpu_elem(py, y->dtype, off), y->dtype, len);
            v->axpy(o, s, xi, len);
        }
        at_cpu_out_done(v, o, py, y->dtype, off, len);
    }
    return AT_OK;
}

at_status at_cpu_scale(at_tensor *y, const at_tensor *x, float s) { return scaled(y, x, s, 0); }

at_status at_cpu_axpy(at_tensor *y, float alpha, const at_tensor *x) { return scaled(y, x, alpha, 1); }

at_status at_cpu_fill(at_tensor *y, float value)
{
    int64_t n = at_tensor_numel(y);
    void *py = at_tensor_data(y);
    if (y->dtype == AT_F32 || y->dtype == AT_I32) {
        uint32_t bits;
        if (y->dtype == AT_F32) {
            memcpy(&bits, &value, 4);
        } else {
            if (!(value >= -2147483648.0f && value < 2147483648.0f)) /* the cast would be undefined */
                return at_error(AT_ERR_INVALID, "fill: %g does not fit i32 tensor %s", (double)value, y->name);
            int32_t iv = (int32_t)value;
            memcpy(&bits, &iv, 4);
        }
        uint32_t *d = py;
        if (bits == 0) {
            memset(d, 0, (size_t)n * 4);
            return AT_OK;
        }
#pragma omp parallel for schedule(static) if (n >= 8 * AT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = bits;
    } else {
        uint16_t h = y->dtype == AT_BF16 ? at_f32_to_bf16(value) : at_f32_to_f16(value);
        uint16_t *d = py;
#pragma omp parallel for schedule(static) if (n >= 8 * AT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = h;
    }
    return AT_OK;
}

at_status at_cpu_cast(at_tensor *y, const at_tensor *x)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(x), nc = nchunks(n);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
    if (x->dtype == y->dtype) {
        if (px != py) memmove(py, px, at_tensor_nbytes(x));
        return AT_OK;
    }
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN)
    for (int64_t u = 0; u < nc; u++) {
        float bx[AT_CPU_CHUNK];
        int64_t off = u * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *xi = at_cpu_in(v, bx, px, x->dtype, off, len);
        v->store(at_cpu_elem(py, y->dtype, off), y->dtype, xi, len);
    }
    return AT_OK;
}

/* y[j] = beta·y[j] + Σ_r x[r, j]: threads own column chunks and walk all
 * rows, so each column's sum is formed by one thread in row order (the
 * result does not depend on the thread count). */
at_status at_cpu_sum_rows(at_tensor *y, const at_tensor *x, float beta)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t cols = at_tensor_cols(x), rows = at_tensor_rows(x), cpr = nchunks(cols);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (rows * cols >= AT_CPU_PAR_MIN && cpr > 1)
    for (int64_t u = 0; u < cpr; u++) {
        float acc[AT_CPU_CHUNK], bx[AT_CPU_CHUNK];
        int64_t c0 = u * AT_CPU_CHUNK, len = cols - c0 < AT_CPU_CHUNK ? cols - c0 : AT_CPU_CHUNK;
        if (beta != 0) {
            v->load(acc, at_cpu_elem(py, y->dtype, c0), y->dtype, len);
            v->scale(acc, acc, beta, len);
        } else {
            memset(acc, 0, (size_t)len * sizeof(float)); /* beta = 0 ignores y, even NaN */
        }
        for (int64_t r = 0; r < rows; r++) v->add(acc, acc, at_cpu_in(v, bx, px, x->dtype, r * cols + c0, len), len);
        v->store(at_cpu_elem(py, y->dtype, c0), y->dtype, acc, len);
    }
    return AT_OK;
}

/* SwiGLU: y = silu(g)·u, silu(g) = g·σ(g).
 *   dg = dy·u·σ(g)·(1 + g·(1 − σ(g))),  du = dy·silu(g) */
at_status at_cpu_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(gate), nc = nchunks(n);
    const void *pg = at_tensor_data(gate), *pu = at_tensor_data(up);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t c = 0; c < nc; c++) {
        float bg[AT_CPU_CHUNK], bu[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t off = c * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *g = at_cpu_in(v, bg, pg, gate->dtype, off, len);
        const float *u = at_cpu_in(v, bu, pu, up->dtype, off, len);
        float *o = at_cpu_out(by, py, y->dtype, off);
        v->swiglu_fwd(o, g, u, len);
        at_cpu_out_done(v, o, py, y->dtype, off, len);
    }
    return AT_OK;
}

at_status at_cpu_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                                 const at_tensor *up)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(gate), nc = nchunks(n);
    const void *pdy = at_tensor_data(dy), *pg = at_tensor_data(gate), *pu = at_tensor_data(up);
    void *pdg = at_tensor_data(dgate), *pdu = at_tensor_data(dup);
    /* f32 outputs are written in place unless one overlaps an input other
     * than at the same address (the kernel reads every input of an element
     * before writing its outputs, so dgate == gate and the like are fine) */
    const void *ins[3] = {pdy, pg, pu};
    int direct = dgate->dtype == AT_F32 && dup->dtype == AT_F32 && pdg != pdu;
    for (int i = 0; i < 3 && direct; i++)
        direct = (ins[i] == pdg || !overlaps(ins[i], pdg, n)) && (ins[i] == pdu || !overlaps(ins[i], pdu, n));
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t c = 0; c < nc; c++) {
        float bdy[AT_CPU_CHUNK], bg[AT_CPU_CHUNK], bu[AT_CPU_CHUNK], bdg[AT_CPU_CHUNK], bdu[AT_CPU_CHUNK];
        int64_t off = c * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *d = at_cpu_in(v, bdy, pdy, dy->dtype, off, len);
        const float *g = at_cpu_in(v, bg, pg, gate->dtype, off, len);
        const float *u = at_cpu_in(v, bu, pu, up->dtype, off, len);
        if (direct) {
            v->swiglu_bwd((float *)pdg + off, (float *)pdu + off, d, g, u, len);
            continue;
        }
        v->swiglu_bwd(bdg, bdu, d, g, u, len);
        v->store(at_cpu_elem(pdg, dgate->dtype, off), dgate->dtype, bdg, len);
        v->store(at_cpu_elem(pdu, dup->dtype, off), dup->dtype, bdu, len);
    }
    return AT_OK;
}

/* GELU of `kind` (at_gelu_kind; formulas in device/backend.h and ops/ops.h),
 * in f32 with libm's erff/tanhf/expf; the derivative into *dydx when asked. */
static inline float gelu_f32(float x, int kind, float *dydx)
{
    if (kind == AT_GELU_TANH) {
        const float c = 0.7978845608f, a = 0.044715f; /* √(2/π) */
        float t = tanhf(c * (x + a * x * x * x));
        if (dydx) *dydx = 0.5f * (1 + t) + 0.5f * x * (1 - t * t) * c * (1 + 3 * a * x * x);
        return 0.5f * x * (1 + t);
    }
    if (kind == AT_GELU_QUICK) {
        float s = 1.0f / (1.0f + expf(-1.702f * x));
        if (dydx) *dydx = s * (1 + 1.702f * x * (1 - s));
        return x * s;
    }
    float cdf = 0.5f * (1 + erff(x * 0.70710678f));
    if (dydx) *dydx = cdf + x * expf(-0.5f * x * x) * 0.39894228f; /* 1/√(2π) */
    return x * cdf;
}

at_status at_cpu_gelu_forward(at_tensor *y, const at_tensor *x, int kind)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(x), nc = nchunks(n);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t c = 0; c < nc; c++) {
        float bx[AT_CPU_CHUNK], by[AT_CPU_CHUNK];
        int64_t off = c * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *xs = at_cpu_in(v, bx, px, x->dtype, off, len);
        for (int64_t i = 0; i < len; i++) by[i] = gelu_f32(xs[i], kind, NULL);
        v->store(at_cpu_elem(py, y->dtype, off), y->dtype, by, len);
    }
    return AT_OK;
}

at_status at_cpu_gelu_backward(at_tensor *dx, const at_tensor *dy, const at_tensor *x, int kind)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t n = at_tensor_numel(x), nc = nchunks(n);
    const void *pdy = at_tensor_data(dy), *px = at_tensor_data(x);
    void *pdx = at_tensor_data(dx);
#pragma omp parallel for schedule(static) if (n >= AT_CPU_PAR_MIN / 4)
    for (int64_t c = 0; c < nc; c++) {
        float bdy[AT_CPU_CHUNK], bx[AT_CPU_CHUNK], bdx[AT_CPU_CHUNK];
        int64_t off = c * AT_CPU_CHUNK, len = n - off < AT_CPU_CHUNK ? n - off : AT_CPU_CHUNK;
        const float *d = at_cpu_in(v, bdy, pdy, dy->dtype, off, len);
        const float *xs = at_cpu_in(v, bx, px, x->dtype, off, len);
        for (int64_t i = 0; i < len; i++) {
            float g;
            gelu_f32(xs[i], kind, &g);
            bdx[i] = d[i] * g; /* through scratch: dx may alias dy or x */
        }
        v->store(at_cpu_elem(pdx, dx->dtype, off), dx->dtype, bdx, len);
    }
    return AT_OK;
}
