/* Reference kernels (see ref_ops.h): every input is read into a double array,
 * the math is done in double in the plainest loop order, and each output is
 * rounded once when stored. Index tensors are read in place. Attention is in
 * ref_attention.c, the conversions in ref_util.c. */
#include "device/ref/ref_ops.h"

#include "base/rng.h"
#include "device/ref/ref_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Product of all dimensions but the last two. */
static int64_t matrix_batch(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++) n *= t->shape[i];
    return n;
}

/* ---- matmul ----
 * C[b] = alpha · op(A[b]) · op(B[b or 0]) + beta · C[b];  op(X)[i,k] = X[k,i] when transposed. */
at_status at_ref_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                        float alpha, float beta)
{
    const char *op = "matmul";
    double *A = NULL, *B = NULL, *C = NULL;
    at_status st = AT_OK;
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
    int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac, N = trans_b ? br : bc;
    int64_t batch = matrix_batch(c), batch_b = matrix_batch(b);
    AT_CHECK(at_ref_load(a, op, &A));
    AT_CHECK(at_ref_load(b, op, &B));
    if (beta != 0.0f) AT_CHECK(at_ref_load(c, op, &C)); /* beta == 0: old C ignored, even NaN */
    else AT_CHECK(at_ref_zeros(at_tensor_numel(c), &C));
    for (int64_t bt = 0; bt < batch; bt++) {
        const double *Ab = A + bt * ar * ac;
        const double *Bb = B + (batch_b == 1 ? 0 : bt) * br * bc;
        double *Cb = C + bt * M * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = trans_a ? Ab[k * ac + i] : Ab[i * ac + k];
                    double y = trans_b ? Bb[j * bc + k] : Bb[k * bc + j];
                    s += x * y;
                }
                Cb[i * N + j] = (double)alpha * s + (beta != 0.0f ? (double)beta * Cb[i * N + j] : 0.0);
            }
    }
    AT_CHECK(at_ref_store(c, C, op));
done:
    free(A);
    free(B);
    free(C);
    return st;
}

/* ---- elementwise ---- */

/* y = a + b, b either a's size or one row broadcast over a's rows. */
at_status at_ref_add(at_tensor *y, const at_tensor *a, const at_tensor *b)
{
    double *A = NULL, *B = NULL;
    at_status st = AT_OK;
    int64_t n = at_tensor_numel(a), nb = at_tensor_numel(b), cols = at_tensor_cols(a);
    AT_CHECK(at_ref_load(a, "add", &A));
    AT_CHECK(at_ref_load(b, "add", &B));
    for (int64_t i = 0; i < n; i++) A[i] += nb == n ? B[i] : B[i % cols];
    AT_CHECK(at_ref_store(y, A, "add"));
done:
    free(A);
    free(B);
    return st;
}

/* y = s · x */
at_status at_ref_scale(at_tensor *y, const at_tensor *x, float s)
{
    double *X = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, "scale", &X));
    for (int64_t i = 0; i < at_tensor_numel(x); i++) X[i] *= (double)s;
    AT_CHECK(at_ref_store(y, X, "scale"));
done:
    free(X);
    return st;
}

/* y += alpha · x */
at_status at_ref_axpy(at_tensor *y, float alpha, const at_tensor *x)
{
    double *X = NULL, *Y = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, "axpy", &X));
    AT_CHECK(at_ref_load(y, "axpy", &Y));
    for (int64_t i = 0; i < at_tensor_numel(y); i++) Y[i] += (double)alpha * X[i];
    AT_CHECK(at_ref_store(y, Y, "axpy"));
done:
    free(X);
    free(Y);
    return st;
}

/* every element = value (i32 tensors get value truncated toward zero) */
at_status at_ref_fill(at_tensor *y, float value)
{
    int64_t n = at_tensor_numel(y);
    if (y->dtype == AT_I32) {
        int32_t *p = (int32_t *)at_ref_host(y, "fill");
        if (!p) return AT_ERR_INVALID;
        if (!(value >= -2147483648.0f && value < 2147483648.0f))
            return at_error(AT_ERR_INVALID, "ref fill: %g does not fit i32 tensor %s", (double)value, y->name);
        for (int64_t i = 0; i < n; i++) p[i] = (int32_t)value;
        return AT_OK;
    }
    double *Y = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_zeros(n, &Y));
    for (int64_t i = 0; i < n; i++) Y[i] = value;
    AT_CHECK(at_ref_store(y, Y, "fill"));
done:
    free(Y);
    return st;
}

/* y = x in y's dtype; the same dtype is a byte copy (any dtype). */
at_status at_ref_cast(at_tensor *y, const at_tensor *x)
{
    if (x->dtype == y->dtype) {
        void *dst = (void *)at_ref_host(y, "cast");
        const void *src = at_ref_host(x, "cast");
        if (!dst || !src) return AT_ERR_INVALID;
        memmove(dst, src, at_tensor_nbytes(x));
        return AT_OK;
    }
    double *X = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, "cast", &X));
    AT_CHECK(at_ref_store(y, X, "cast"));
done:
    free(X);
    return st;
}

/* y[j] = beta · y[j] + Σ_r x[r, j]  (beta == 0: old y ignored) */
at_status at_ref_sum_rows(at_tensor *y, const at_tensor *x, float beta)
{
    double *X = NULL, *Y = NULL;
    at_status st = AT_OK;
    int64_t rows = at_tensor_rows(x), cols = at_tensor_cols(x);
    AT_CHECK(at_ref_load(x, "sum_rows", &X));
    if (beta != 0.0f) AT_CHECK(at_ref_load(y, "sum_rows", &Y));
    else AT_CHECK(at_ref_zeros(cols, &Y));
    for (int64_t j = 0; j < cols; j++) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++) s += X[r * cols + j];
        Y[j] = (beta != 0.0f ? (double)beta * Y[j] : 0.0) + s;
    }
    AT_CHECK(at_ref_store(y, Y, "sum_rows"));
done:
    free(X);
    free(Y);
    return st;
}

/* ---- RMSNorm ----
 *   forward:  r = 1/sqrt(mean(x²) + eps),  y = x · r · w
 *   backward: g = dy · w, x̂ = x · r,  dx = r · (g − x̂ · mean(g · x̂)),  dw += Σ_rows dy · x̂ */
at_status at_ref_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps)
{
    const char *op = "rmsnorm_forward";
    double *X = NULL, *W = NULL, *R = NULL;
    at_status st = AT_OK;
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_load(w, op, &W));
    AT_CHECK(at_ref_zeros(rows, &R));
    for (int64_t r = 0; r < rows; r++) {
        double *xr = X + r * D, ss = 0;
        for (int64_t i = 0; i < D; i++) ss += xr[i] * xr[i];
        R[r] = 1.0 / sqrt(ss / (double)D + (double)eps);
        for (int64_t i = 0; i < D; i++) xr[i] = xr[i] * R[r] * W[i];
    }
    AT_CHECK(at_ref_store(y, X, op));
    if (rstd) AT_CHECK(at_ref_store(rstd, R, op));
done:
    free(X);
    free(W);
    free(R);
    return st;
}

at_status at_ref_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                                  const at_tensor *w, const at_tensor *rstd)
{
    const char *op = "rmsnorm_backward";
    double *DY = NULL, *X = NULL, *W = NULL, *R = NULL, *DW = NULL;
    at_status st = AT_OK;
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    AT_CHECK(at_ref_load(dy, op, &DY));
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_load(w, op, &W));
    AT_CHECK(at_ref_load(rstd, op, &R));
    AT_CHECK(at_ref_load(dw, op, &DW)); /* accumulated into */
    for (int64_t r = 0; r < rows; r++) {
        double *xr = X + r * D; /* becomes dx */
        const double *dyr = DY + r * D;
        double m = 0;
        for (int64_t i = 0; i < D; i++) m += dyr[i] * W[i] * xr[i] * R[r];
        m /= (double)D;
        for (int64_t i = 0; i < D; i++) {
            double xh = xr[i] * R[r];
            if (DW) DW[i] += dyr[i] * xh;
            xr[i] = R[r] * (dyr[i] * W[i] - xh * m);
        }
    }
    AT_CHECK(at_ref_store(dx, X, op));
    if (dw) AT_CHECK(at_ref_store(dw, DW, op));
done:
    free(DY);
    free(X);
    free(W);
    free(R);
    free(DW);
    return st;
}

/* ---- LayerNorm (biased variance) ----
 *   forward:  μ = mean(x), r = 1/sqrt(mean((x − μ)²) + eps), x̂ = (x − μ)·r, y = x̂·w + b
 *   backward: g = dy·w,  dx = r·(g − mean(g) − x̂·mean(g·x̂)),  dw += Σ_rows dy·x̂,  db += Σ_rows dy
 * The variance is taken around the mean (two passes), not as E[x²] − μ². */
at_status at_ref_layernorm_forward(at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                                   const at_tensor *w, const at_tensor *b, float eps)
{
    const char *op = "layernorm_forward";
    double *X = NULL, *W = NULL, *B = NULL, *M = NULL, *R = NULL;
    at_status st = AT_OK;
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_load(w, op, &W));
    AT_CHECK(at_ref_load(b, op, &B));
    AT_CHECK(at_ref_zeros(rows, &M));
    AT_CHECK(at_ref_zeros(rows, &R));
    for (int64_t r = 0; r < rows; r++) {
        double *xr = X + r * D, mu = 0, var = 0;
        for (int64_t i = 0; i < D; i++) mu += xr[i];
        mu /= (double)D;
        for (int64_t i = 0; i < D; i++) var += (xr[i] - mu) * (xr[i] - mu);
        M[r] = mu;
        R[r] = 1.0 / sqrt(var / (double)D + (double)eps);
        for (int64_t i = 0; i < D; i++) xr[i] = (xr[i] - mu) * R[r] * W[i] + (B ? B[i] : 0.0);
    }
    AT_CHECK(at_ref_store(y, X, op));
    if (mean) AT_CHECK(at_ref_store(mean, M, op));
    if (rstd) AT_CHECK(at_ref_store(rstd, R, op));
done:
    free(X);
    free(W);
    free(B);
    free(M);
    free(R);
    return st;
}

at_status at_ref_layernorm_backward(at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy,
                                    const at_tensor *x, const at_tensor *w, const at_tensor *mean,
                                    const at_tensor *rstd)
{
    const char *op = "layernorm_backward";
    double *DY = NULL, *X = NULL, *W = NULL, *M = NULL, *R = NULL, *DW = NULL, *DB = NULL;
    at_status st = AT_OK;
    int64_t rows = at_tensor_rows(x), D = at_tensor_cols(x);
    AT_CHECK(at_ref_load(dy, op, &DY));
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_load(w, op, &W));
    AT_CHECK(at_ref_load(mean, op, &M));
    AT_CHECK(at_ref_load(rstd, op, &R));
    AT_CHECK(at_ref_load(dw, op, &DW)); /* accumulated into */
    AT_CHECK(at_ref_load(db, op, &DB));
    for (int64_t r = 0; r < rows; r++) {
        double *xr = X + r * D; /* becomes dx */
        const double *dyr = DY + r * D;
        double mg = 0, mgx = 0;
        for (int64_t i = 0; i < D; i++) {
            double xh = (xr[i] - M[r]) * R[r];
            mg += dyr[i] * W[i];
            mgx += dyr[i] * W[i] * xh;
        }
        mg /= (double)D;
        mgx /= (double)D;
        for (int64_t i = 0; i < D; i++) {
            double xh = (xr[i] - M[r]) * R[r];
            if (DW) DW[i] += dyr[i] * xh;
            if (DB) DB[i] += dyr[i];
            xr[i] = R[r] * (dyr[i] * W[i] - mg - xh * mgx);
        }
    }
    AT_CHECK(at_ref_store(dx, X, op));
    if (dw) AT_CHECK(at_ref_store(dw, DW, op));
    if (db) AT_CHECK(at_ref_store(db, DB, op));
done:
    free(DY);
    free(X);
    free(W);
    free(M);
    free(R);
    free(DW);
    free(DB);
    return st;
}

/* ---- rotary embedding (HF rotate_half), a_i = pos · inv_freq[i] as an f32 product ----
 *   y[i] = x[i] cos a − x[i+D/2] sin a,   y[i+D/2] = x[i+D/2] cos a + x[i] sin a;  inverse: a → −a */
at_status at_ref_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                      const at_rope_sections *sections, int inverse)
{
    const char *op = "rope";
    double *X = NULL, *Y = NULL;
    const int32_t *P = NULL;
    const float *invf = NULL;
    at_status st = AT_OK;
    int64_t D = x->shape[x->ndim - 1], H = x->shape[x->ndim - 2], half = D / 2;
    int64_t N = H * D > 0 ? at_tensor_numel(x) / (H * D) : 0;
    AT_CHECK(at_ref_index(pos, op, &P));
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_zeros(at_tensor_numel(x), &Y));
    if (inv_freq->dtype != AT_F32) {
        st = at_error(AT_ERR_INVALID, "ref rope: inv_freq %s must be f32", inv_freq->name);
        goto done;
    }
    invf = at_ref_host(inv_freq, op);
    if (!invf) {
        st = AT_ERR_INVALID;
        goto done;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++) {
            const double *xr = X + (n * H + h) * D;
            double *yr = Y + (n * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                int ncomp = sections ? sections->n : 1;
                float af = (float)P[n * ncomp + at_rope_section_of(sections, i)] * invf[i]; /* f32 like HF */
                double a = inverse ? -(double)af : (double)af;
                double c = cos(a), s = sin(a);
                yr[i] = xr[i] * c - xr[i + half] * s;
                yr[i + half] = xr[i + half] * c + xr[i] * s;
            }
        }
    AT_CHECK(at_ref_store(y, Y, op));
done:
    free(X);
    free(Y);
    return st;
}

/* ---- SwiGLU ----  y = silu(g) · u,  silu(g) = g σ(g)
 *   dg = dy · u · σ(g) · (1 + g (1 − σ(g))),  du = dy · silu(g) */
static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

at_status at_ref_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up)
{
    const char *op = "swiglu_forward";
    double *G = NULL, *U = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(gate, op, &G));
    AT_CHECK(at_ref_load(up, op, &U));
    for (int64_t i = 0; i < at_tensor_numel(gate); i++) G[i] = G[i] * sigmoid(G[i]) * U[i];
    AT_CHECK(at_ref_store(y, G, op));
done:
    free(G);
    free(U);
    return st;
}

at_status at_ref_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                                 const at_tensor *up)
{
    const char *op = "swiglu_backward";
    double *G = NULL, *U = NULL, *DY = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(gate, op, &G));
    AT_CHECK(at_ref_load(up, op, &U));
    AT_CHECK(at_ref_load(dy, op, &DY));
    for (int64_t i = 0; i < at_tensor_numel(gate); i++) {
        double g = G[i], sg = sigmoid(g);
        G[i] = DY[i] * U[i] * sg * (1.0 + g * (1.0 - sg)); /* dgate */
        U[i] = DY[i] * g * sg;                              /* dup */
    }
    AT_CHECK(at_ref_store(dgate, G, op));
    AT_CHECK(at_ref_store(dup, U, op));
done:
    free(G);
    free(U);
    free(DY);
    return st;
}

/* ---- GELU (the three kinds of at_gelu_kind, formulas in ops/ops.h) ---- */

#define GELU_TANH_C 0.7978845608028654 /* √(2/π) */
#define GELU_TANH_A 0.044715
#define GELU_QUICK_K 1.702

/* gelu(x) of `kind`, and its derivative into *dydx. */
static double gelu(double x, int kind, double *dydx)
{
    if (kind == AT_GELU_TANH) {
        double t = tanh(GELU_TANH_C * (x + GELU_TANH_A * x * x * x));
        *dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_TANH_C * (1 + 3 * GELU_TANH_A * x * x);
        return 0.5 * x * (1 + t);
    }
    if (kind == AT_GELU_QUICK) {
        double s = sigmoid(GELU_QUICK_K * x);
        *dydx = s * (1 + GELU_QUICK_K * x * (1 - s));
        return x * s;
    }
    double cdf = 0.5 * (1 + erf(x / sqrt(2.0)));
    *dydx = cdf + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    return x * cdf;
}

at_status at_ref_gelu_forward(at_tensor *y, const at_tensor *x, int kind)
{
    const char *op = "gelu_forward";
    double *X = NULL, d;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, op, &X));
    for (int64_t i = 0; i < at_tensor_numel(x); i++) X[i] = gelu(X[i], kind, &d);
    AT_CHECK(at_ref_store(y, X, op));
done:
    free(X);
    return st;
}

at_status at_ref_gelu_backward(at_tensor *dx, const at_tensor *dy, const at_tensor *x, int kind)
{
    const char *op = "gelu_backward";
    double *X = NULL, *DY = NULL, d;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, op, &X));
    AT_CHECK(at_ref_load(dy, op, &DY));
    for (int64_t i = 0; i < at_tensor_numel(x); i++) {
        gelu(X[i], kind, &d);
        X[i] = DY[i] * d;
    }
    AT_CHECK(at_ref_store(dx, X, op));
done:
    free(X);
    free(DY);
    return st;
}

/* ---- embedding ----  y[n] = table[ids[n]];  backward: dtable[ids[n]] += dy[n] */

/* The ids of an embedding op, each checked to lie in [0, V) of table (rows)
 * before anything is written. */
static at_status load_ids(const at_tensor *idt, const at_tensor *table, const char *op, const int32_t **out)
{
    const int32_t *ids;
    int64_t n = at_tensor_numel(idt), V = table->shape[0];
    AT_TRY(at_ref_index(idt, op, &ids));
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return at_error(AT_ERR_INVALID, "ref %s: %s[%lld] = %d is outside [0, %lld) of %s", op, idt->name,
                            (long long)i, (int)ids[i], (long long)V, table->name);
    *out = ids;
    return AT_OK;
}

at_status at_ref_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table)
{
    const char *op = "embedding_forward";
    const int32_t *I = NULL;
    double *T = NULL, *Y = NULL;
    at_status st = AT_OK;
    int64_t n = at_tensor_numel(ids), D = table->shape[1];
    AT_CHECK(load_ids(ids, table, op, &I));
    AT_CHECK(at_ref_load(table, op, &T));
    AT_CHECK(at_ref_zeros(n * D, &Y));
    for (int64_t i = 0; i < n; i++) memcpy(Y + i * D, T + (int64_t)I[i] * D, (size_t)D * sizeof(double));
    AT_CHECK(at_ref_store(y, Y, op));
done:
    free(T);
    free(Y);
    return st;
}

at_status at_ref_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids)
{
    const char *op = "embedding_backward";
    const int32_t *I = NULL;
    double *T = NULL, *DY = NULL;
    at_status st = AT_OK;
    int64_t n = at_tensor_numel(ids), D = dtable->shape[1];
    AT_CHECK(load_ids(ids, dtable, op, &I));
    AT_CHECK(at_ref_load(dtable, op, &T));
    AT_CHECK(at_ref_load(dy, op, &DY));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < D; e++) T[(int64_t)I[i] * D + e] += DY[i * D + e];
    AT_CHECK(at_ref_store(dtable, T, op));
done:
    free(T);
    free(DY);
    return st;
}

/* ---- cross-entropy ----
 *   row_loss[n] = logsumexp(x[n]) − x[n, label]            (0 when label < 0)
 *   dlogits[n]  = grad_scale · (softmax(x[n]) − onehot(label)) (0 when label < 0)
 * The logits are read whole before anything is written, so dlogits may be logits. */
at_status at_ref_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                               const at_tensor *labels, float grad_scale)
{
    const char *op = "cross_entropy";
    const int32_t *Lab = NULL;
    double *X = NULL, *R = NULL;
    at_status st = AT_OK;
    int64_t N = at_tensor_rows(logits), V = at_tensor_cols(logits);
    AT_CHECK(at_ref_index(labels, op, &Lab));
    for (int64_t n = 0; n < N; n++)
        if (Lab[n] >= V) {
            st = at_error(AT_ERR_INVALID, "ref %s: %s[%lld] = %d is not below the vocabulary size %lld of %s", op,
                          labels->name, (long long)n, (int)Lab[n], (long long)V, logits->name);
            goto done;
        }
    AT_CHECK(at_ref_load(logits, op, &X));
    AT_CHECK(at_ref_zeros(N, &R));
    for (int64_t n = 0; n < N; n++) {
        double *xr = X + n * V; /* becomes dlogits */
        if (Lab[n] < 0) {
            R[n] = 0;
            for (int64_t i = 0; i < V; i++) xr[i] = 0;
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < V; i++) mx = xr[i] > mx ? xr[i] : mx;
        for (int64_t i = 0; i < V; i++) sum += exp(xr[i] - mx);
        double lse = mx + log(sum);
        R[n] = lse - xr[Lab[n]];
        for (int64_t i = 0; i < V; i++) xr[i] = (double)grad_scale * (exp(xr[i] - lse) - (i == Lab[n] ? 1.0 : 0.0));
    }
    AT_CHECK(at_ref_store(row_loss, R, op));
    if (dlogits) AT_CHECK(at_ref_store(dlogits, X, op));
done:
    free(X);
    free(R);
    return st;
}

/* ---- AdamW (torch.optim.AdamW) ----
 *   g = grad_scale · grad;  m = β1 m + (1−β1) g;  v = β2 v + (1−β2) g²
 *   param = param · (1 − lr·wd) − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps) */
at_status at_ref_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                       const at_adamw_params *p)
{
    const char *op = "adamw";
    double *P = NULL, *G = NULL, *M = NULL, *V = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(param, op, &P));
    AT_CHECK(at_ref_load(grad, op, &G));
    AT_CHECK(at_ref_load(m, op, &M));
    AT_CHECK(at_ref_load(v, op, &V));
    double b1 = p->beta1, b2 = p->beta2, lr = p->lr;
    double bc1 = 1.0 - pow(b1, (double)p->step), bc2 = 1.0 - pow(b2, (double)p->step);
    for (int64_t i = 0; i < at_tensor_numel(param); i++) {
        double g = (double)p->grad_scale * G[i];
        M[i] = b1 * M[i] + (1.0 - b1) * g;
        V[i] = b2 * V[i] + (1.0 - b2) * g * g;
        P[i] *= 1.0 - lr * (double)p->weight_decay;
        P[i] -= lr * (M[i] / bc1) / (sqrt(V[i] / bc2) + (double)p->eps);
    }
    AT_CHECK(at_ref_store(param, P, op));
    AT_CHECK(at_ref_store(m, M, op));
    AT_CHECK(at_ref_store(v, V, op));
done:
    free(P);
    free(G);
    free(M);
    free(V);
    return st;
}

/* out[0] = Σ x² */
at_status at_ref_sumsq(at_tensor *out, const at_tensor *x)
{
    double *X = NULL, s = 0;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, "sumsq", &X));
    for (int64_t i = 0; i < at_tensor_numel(x); i++) s += X[i] * X[i];
    AT_CHECK(at_ref_store(out, &s, "sumsq"));
done:
    free(X);
    return st;
}

/* y[i] = x[i] / (1 − p) where the counter-based uniform of (seed, counter(i))
 * is >= p, else 0, counter(i) = offset + (i / run)·pitch + i % run (ops.h).
 * The mask is the definition in base/rng.h. */
at_status at_ref_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                         uint64_t pitch)
{
    double *X = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(x, "dropout", &X));
    for (int64_t i = 0; i < at_tensor_numel(x); i++) {
        int keep = at_rng_dropout_uniform(seed, at_rng_run_counter(offset, i, run, pitch)) >= p;
        X[i] = keep ? X[i] / (1.0 - (double)p) : 0.0;
    }
    AT_CHECK(at_ref_store(y, X, "dropout"));
done:
    free(X);
    return st;
}

/* The product, then the low-rank term added by a second one. */
at_status at_ref_matmul_lowrank(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                                float alpha, float beta, const at_tensor *u, const at_tensor *v, float s)
{
    AT_TRY(at_ref_matmul(c, a, b, trans_a, trans_b, alpha, beta));
    return at_ref_matmul(c, u, v, 0, 1, s, 1.0f);
}

/* The product (beta 0), then the dropout in place. */
at_status at_ref_matmul_dropout(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                                float alpha, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch)
{
    AT_TRY(at_ref_matmul(c, a, b, trans_a, trans_b, alpha, 0.0f));
    return at_ref_dropout(c, c, p, seed, offset, run, pitch);
}

/* y[i] += m·(2u − 1), u the counter-based uniform of (seed, counter(i)) of
 * base/rng.h, counter(i) as in dropout. In double: the backends' f32 sum is
 * within an ulp or two of it. */
at_status at_ref_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                                   uint64_t pitch)
{
    double *Y = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_ref_load(y, "add_uniform_noise", &Y));
    for (int64_t i = 0; i < at_tensor_numel(y); i++) {
        Y[i] += (double)magnitude * (2.0 * (double)at_rng_hash_uniform(seed, at_rng_run_counter(offset, i, run, pitch)) -
                                     1.0);
    }
    AT_CHECK(at_ref_store(y, Y, "add_uniform_noise"));
done:
    free(Y);
    return st;
}

#define ENTRY(name) .name = at_ref_##name,
static const at_backend_ops ref_ops = {AT_BACKEND_OPS(ENTRY)};
#undef ENTRY

const at_backend_ops *at_ref_ops(void) { return &ref_ops; }
