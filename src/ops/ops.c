#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "device/quant.h"

/* ---- argument checks (messages name the tensors) ---- */

static const char *desc(const at_tensor *t, char *buf, size_t n) { return at_tensor_describe(t, buf, n); }

static at_status need(const at_tensor *t, const char *op, const char *role)
{
    if (!t || !t->buf) return at_error(AT_ERR_INVALID, "%s: %s tensor is missing", op, role);
    return AT_OK;
}

static int is_float(at_dtype t) { return t == AT_F32 || t == AT_BF16 || t == AT_F16; }

static at_status need_float(const at_tensor *t, const char *op)
{
    char d[200];
    if (!is_float(t->dtype))
        return at_error(AT_ERR_INVALID, "%s: %s must be f32, bf16 or f16", op, desc(t, d, sizeof d));
    return AT_OK;
}

static at_status need_dtype(const at_tensor *t, at_dtype dt, const char *op)
{
    char d[200];
    if (t->dtype != dt)
        return at_error(AT_ERR_INVALID, "%s: %s must be %s", op, desc(t, d, sizeof d), at_dtype_name(dt));
    return AT_OK;
}

static at_status need_numel(const at_tensor *t, int64_t n, const char *op)
{
    char d[200];
    if (at_tensor_numel(t) != n)
        return at_error(AT_ERR_INVALID, "%s: %s must have %lld elements", op, desc(t, d, sizeof d), (long long)n);
    return AT_OK;
}

static at_status need_same_shape(const at_tensor *a, const at_tensor *b, const char *op)
{
    char d1[200], d2[200];
    if (!at_tensor_same_shape(a, b))
        return at_error(AT_ERR_INVALID, "%s: shapes differ: %s vs %s", op, desc(a, d1, sizeof d1),
                        desc(b, d2, sizeof d2));
    return AT_OK;
}

static at_status need_backend(const at_tensor *t, const at_backend *be, const char *op)
{
    char d[200];
    if (t && t->buf->backend != be)
        return at_error(AT_ERR_INVALID, "%s: %s is on %s, the output is on %s", op, desc(t, d, sizeof d),
                        t->buf->backend->name, be->name);
    return AT_OK;
}

/* ---- backend or fallback: run the CPU kernel on host copies ----
 *
 * run_<op>(be, args) is generated for every operation of device/op_table.h:
 * it calls the backend's entry, or, when the backend has none, copies the
 * tensor arguments to host memory, runs the CPU kernel on the copies, copies
 * the outputs back and warns once per operation and backend. The op's list
 * says which arguments are tensors and which of them are outputs. */

#define FB_MAX 10
typedef struct {
    const at_tensor *dev[FB_MAX];
    at_tensor *host[FB_MAX];
    int is_out[FB_MAX];
    int n;
    at_attn_params attn; /* attention's parameters, their index tensors on the host */
    at_status st;        /* the first failure; later copies are skipped */
} fallback;

/* Makes a host copy of t (nothing for NULL) and remembers whether to copy it back. */
static void fb_add(fallback *f, const at_tensor *t, int is_out)
{
    if (!t || f->st != AT_OK) return;
    for (int i = 0; i < f->n; i++) {
        if (f->dev[i] == t) { /* the same tensor passed twice (in place) */
            f->is_out[i] |= is_out;
            return;
        }
    }
    if (f->n == FB_MAX) {
        f->st = at_error(AT_ERR_INTERNAL, "fallback: too many tensors");
        return;
    }
    at_tensor *h = NULL;
    f->st = at_tensor_new(at_cpu_backend(), t->dtype, t->ndim, t->shape, t->name, &h);
    if (f->st != AT_OK) return;
    f->st = at_tensor_download(t, h->buf->ptr, at_tensor_nbytes(t));
    if (f->st != AT_OK) {
        at_tensor_free(h);
        return;
    }
    f->dev[f->n] = t;
    f->host[f->n] = h;
    f->is_out[f->n] = is_out;
    f->n++;
}

/* Host copies of the index tensors of attention's parameters, into f->attn. */
static void fb_add_attn(fallback *f, const at_attn_params *p)
{
    if (!p) return;
    fb_add(f, p->q_index, 0);
    fb_add(f, p->kv_len, 0);
    fb_add(f, p->segments, 0);
}

/* The host copy of t (NULL for NULL), after fb_add. */
static at_tensor *fb_host(fallback *f, const at_tensor *t)
{
    for (int i = 0; t && i < f->n; i++)
        if (f->dev[i] == t) return f->host[i];
    return NULL;
}

static const at_attn_params *fb_host_attn(fallback *f, const at_attn_params *p)
{
    if (!p) return NULL;
    f->attn = *p;
    f->attn.q_index = fb_host(f, p->q_index);
    f->attn.kv_len = fb_host(f, p->kv_len);
    f->attn.segments = fb_host(f, p->segments);
    return &f->attn;
}

/* Copies the outputs back (when st is AT_OK) and frees the host copies. */
static at_status fb_finish(fallback *f, at_status st)
{
    for (int i = 0; i < f->n; i++) {
        if (st == AT_OK && f->is_out[i])
            st = at_tensor_upload((at_tensor *)f->dev[i], f->host[i]->buf->ptr, at_tensor_nbytes(f->host[i]));
        at_tensor_free(f->host[i]);
    }
    return st;
}

static void fb_warn(at_backend *be, int op)
{
    if (!(be->fallback_warned & (1ull << op))) {
        be->fallback_warned |= 1ull << op;
        at_log_warn("backend %s has no %s kernel: running it on the CPU (slower)", be->name,
                    at_backend_op_name(op));
    }
}

static const at_backend_ops *cpu_ops(void) { return &at_cpu_backend()->ops; }

static at_status no_kernel(const char *op)
{
    return at_error(AT_ERR_UNSUPPORTED, "%s: no CPU kernel in this build", op);
}

/* How the fallback reads an op's list: first every tensor argument is copied
 * (a comma expression, so left to right: the first failure stops the rest);
 * then the CPU kernel is called with the host copies in their places. */
#define FB_COPY_OUT(x) fb_add(&f, x, 1)
#define FB_COPY_IN(x) fb_add(&f, x, 0)
#define FB_COPY_VAL(T, x) (void)(x)
#define FB_COPY_ATTN(x) fb_add_attn(&f, x)
#define FB_HOST(x) fb_host(&f, x)
#define FB_HOST_ATTN(x) fb_host_attn(&f, x)

#define RUN_OP(name)                                                                               \
    static at_status run_##name(at_backend *be, AT_OP_PARAMS(name))                                \
    {                                                                                              \
        if (be->ops.name) return be->ops.name(AT_OP_ARGS(name));                                   \
        if (!cpu_ops()->name) return no_kernel(#name);                                             \
        fb_warn(be, AT_OP_INDEX_##name);                                                           \
        fallback f = {0};                                                                          \
        (void)(AT_OP_##name(FB_COPY_OUT, FB_COPY_IN, FB_COPY_VAL, FB_COPY_ATTN));                  \
        at_status st = f.st;                                                                       \
        if (st == AT_OK) st = cpu_ops()->name(AT_OP_##name(FB_HOST, FB_HOST, AT_OP_ARG_VAL, FB_HOST_ATTN)); \
        return fb_finish(&f, st);                                                                  \
    }
AT_BACKEND_OPS(RUN_OP)
#undef RUN_OP

/* ops.h declares every at_<op> by hand, with its documentation; this
 * redeclaration from the list makes a signature that differs from the
 * backend entry's a compile error. */
#define PUBLIC_DECLARE(name) at_status at_##name(AT_OP_PARAMS(name));
AT_BACKEND_OPS(PUBLIC_DECLARE)
#undef PUBLIC_DECLARE

/* ---- operations ---- */

/* Product of all dimensions but the last two. */
static int64_t matrix_batch(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++) n *= t->shape[i];
    return n;
}

/* at_matmul's checks (op names the caller in messages); *be: c's backend. */
static at_status matmul_checks(const char *op, const at_tensor *c, const at_tensor *a, const at_tensor *b,
                               int trans_a, int trans_b, at_backend **be_out)
{
    AT_TRY(need(c, op, "output"));
    AT_TRY(need(a, op, "A"));
    AT_TRY(need(b, op, "B"));
    AT_TRY(need_float(a, op));
    if (!at_dtype_is_quantized(b->dtype)) AT_TRY(need_float(b, op));
    char d1[200], d2[200], d3[200];
    if (at_dtype_is_quantized(b->dtype) && (matrix_batch(b) != 1 || b->ndim < 2 ||
                                            b->shape[b->ndim - 1] % at_quant_row_block(b->dtype)))
        return at_error(AT_ERR_INVALID, "%s: quantized weight %s must be one matrix whose rows are a multiple "
                        "of %lld values", op, desc(b, d1, sizeof d1), (long long)at_quant_row_block(b->dtype));
    if (c->dtype != AT_F32 && c->dtype != AT_BF16)
        return at_error(AT_ERR_INVALID, "%s: output %s must be f32 or bf16", op, desc(c, d1, sizeof d1));
    if (a->ndim < 2 || b->ndim < 2 || c->ndim < 2)
        return at_error(AT_ERR_INVALID, "%s: operands need at least 2 dimensions", op);
    int64_t am = a->shape[a->ndim - 2], ak = a->shape[a->ndim - 1];
    if (trans_a) { int64_t t = am; am = ak; ak = t; }
    int64_t bk = b->shape[b->ndim - 2], bn = b->shape[b->ndim - 1];
    if (trans_b) { int64_t t = bk; bk = bn; bn = t; }
    int64_t cm = c->shape[c->ndim - 2], cn = c->shape[c->ndim - 1];
    int64_t batch_a = matrix_batch(a), batch_b = matrix_batch(b), batch_c = matrix_batch(c);
    if (ak != bk || am != cm || bn != cn || batch_a != batch_c || (batch_b != batch_a && batch_b != 1))
        return at_error(AT_ERR_INVALID, "%s: shapes do not match: %s%s · %s%s -> %s", op, desc(a, d1, sizeof d1),
                        trans_a ? "ᵀ" : "", desc(b, d2, sizeof d2), trans_b ? "ᵀ" : "", desc(c, d3, sizeof d3));
    at_backend *be = c->buf->backend;
    AT_TRY(need_backend(a, be, op));
    AT_TRY(need_backend(b, be, op));
    *be_out = be;
    return AT_OK;
}

at_status at_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b, float alpha,
                    float beta)
{
    at_backend *be;
    AT_TRY(matmul_checks("matmul", c, a, b, trans_a, trans_b, &be));
    return run_matmul(be, c, a, b, trans_a, trans_b, alpha, beta);
}

at_status at_matmul_lowrank(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float beta, const at_tensor *u, const at_tensor *v, float s)
{
    const char *op = "matmul_lowrank";
    at_backend *be;
    AT_TRY(matmul_checks(op, c, a, b, trans_a, trans_b, &be));
    AT_TRY(need(u, op, "u"));
    AT_TRY(need(v, op, "v"));
    AT_TRY(need_backend(u, be, op));
    AT_TRY(need_backend(v, be, op));
    char d1[200], d2[200], d3[200];
    int64_t M = c->shape[c->ndim - 2], N = c->shape[c->ndim - 1];
    if (matrix_batch(a) != 1 || matrix_batch(c) != 1)
        return at_error(AT_ERR_INVALID, "%s: a %s and c %s must be single matrices", op, desc(a, d1, sizeof d1),
                        desc(c, d2, sizeof d2));
    if (u->dtype != AT_F32 || v->dtype != AT_F32 || u->ndim != 2 || v->ndim != 2 || u->shape[0] != M ||
        v->shape[0] != N || u->shape[1] != v->shape[1])
        return at_error(AT_ERR_INVALID, "%s: u %s and v %s must be f32 [%lld, r] and [%lld, r] for c %s", op,
                        desc(u, d1, sizeof d1), desc(v, d2, sizeof d2), (long long)M, (long long)N,
                        desc(c, d3, sizeof d3));
    if ((c->buf == u->buf && c->offset == u->offset) || (c->buf == v->buf && c->offset == v->offset))
        return at_error(AT_ERR_INVALID, "%s: the output %s is also u or v", op, c->name);
    return run_matmul_lowrank(be, c, a, b, trans_a, trans_b, alpha, beta, u, v, s);
}

/* at_dropout's checks of p and the runs. */
static at_status dropout_checks(const char *op, float p, int64_t run, uint64_t pitch)
{
    if (!(p >= 0.0f && p < 1.0f)) return at_error(AT_ERR_INVALID, "%s: p = %g must be in [0, 1)", op, (double)p);
    if (run < 0 || (run > 0 && pitch < (uint64_t)run))
        return at_error(AT_ERR_INVALID, "%s: runs of %lld elements %llu apart overlap", op, (long long)run,
                        (unsigned long long)pitch);
    return AT_OK;
}

at_status at_matmul_dropout(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch)
{
    const char *op = "matmul_dropout";
    at_backend *be;
    AT_TRY(matmul_checks(op, c, a, b, trans_a, trans_b, &be));
    AT_TRY(dropout_checks(op, p, run, pitch));
    if ((c->buf == a->buf && c->offset == a->offset) || (c->buf == b->buf && c->offset == b->offset))
        return at_error(AT_ERR_INVALID, "matmul_dropout: the output %s is also an operand", c->name);
    return run_matmul_dropout(be, c, a, b, trans_a, trans_b, alpha, p, seed, offset, run, pitch);
}

at_status at_add(at_tensor *y, const at_tensor *a, const at_tensor *b)
{
    const char *op = "add";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(a, op, "a"));
    AT_TRY(need(b, op, "b"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(a, op));
    AT_TRY(need_float(b, op));
    AT_TRY(need_numel(y, at_tensor_numel(a), op));
    if (!(at_tensor_numel(b) == at_tensor_numel(a) || (b->ndim == 1 && b->shape[0] == at_tensor_cols(a)))) {
        char d1[200], d2[200];
        return at_error(AT_ERR_INVALID, "add: %s cannot be added to %s", desc(b, d1, sizeof d1),
                        desc(a, d2, sizeof d2));
    }
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(a, be, op));
    AT_TRY(need_backend(b, be, op));
    return run_add(be, y, a, b);
}

at_status at_scale(at_tensor *y, const at_tensor *x, float s)
{
    const char *op = "scale";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_scale(be, y, x, s);
}

at_status at_axpy(at_tensor *y, float alpha, const at_tensor *x)
{
    const char *op = "axpy";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_axpy(be, y, alpha, x);
}

at_status at_fill(at_tensor *y, float value)
{
    const char *op = "fill";
    AT_TRY(need(y, op, "output"));
    if (!is_float(y->dtype) && y->dtype != AT_I32) return need_float(y, op);
    at_backend *be = y->buf->backend;
    return run_fill(be, y, value);
}

at_status at_cast(at_tensor *y, const at_tensor *x)
{
    const char *op = "cast";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    if (x->dtype != y->dtype) {
        AT_TRY(need_float(y, op));
        AT_TRY(need_float(x, op));
    }
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_cast(be, y, x);
}

at_status at_sum_rows(at_tensor *y, const at_tensor *x, float beta)
{
    const char *op = "sum_rows";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_cols(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_sum_rows(be, y, x, beta);
}

at_status at_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps)
{
    const char *op = "rmsnorm_forward";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need(w, op, "weight"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_float(w, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    AT_TRY(need_numel(w, at_tensor_cols(x), op));
    at_backend *be = y->buf->backend;
    if (rstd) {
        AT_TRY(need_dtype(rstd, AT_F32, op));
        AT_TRY(need_numel(rstd, at_tensor_rows(x), op));
        AT_TRY(need_backend(rstd, be, op));
    }
    AT_TRY(need_backend(x, be, op));
    AT_TRY(need_backend(w, be, op));
    return run_rmsnorm_forward(be, y, rstd, x, w, eps);
}

at_status at_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                              const at_tensor *w, const at_tensor *rstd)
{
    const char *op = "rmsnorm_backward";
    AT_TRY(need(dx, op, "dx"));
    AT_TRY(need(dy, op, "dy"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need(w, op, "weight"));
    AT_TRY(need(rstd, op, "rstd"));
    AT_TRY(need_float(dx, op));
    AT_TRY(need_float(dy, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_float(w, op));
    AT_TRY(need_dtype(rstd, AT_F32, op));
    AT_TRY(need_numel(dx, at_tensor_numel(x), op));
    AT_TRY(need_numel(dy, at_tensor_numel(x), op));
    AT_TRY(need_numel(w, at_tensor_cols(x), op));
    AT_TRY(need_numel(rstd, at_tensor_rows(x), op));
    at_backend *be = dx->buf->backend;
    if (dw) {
        AT_TRY(need_float(dw, op));
        AT_TRY(need_numel(dw, at_tensor_cols(x), op));
        AT_TRY(need_backend(dw, be, op));
    }
    AT_TRY(need_backend(dy, be, op));
    AT_TRY(need_backend(x, be, op));
    AT_TRY(need_backend(w, be, op));
    AT_TRY(need_backend(rstd, be, op));
    return run_rmsnorm_backward(be, dx, dw, dy, x, w, rstd);
}

/* Each of the n tensors: float, numel elements, on backend be (an op's
 * same-sized operands, e.g. a backward's dy, x and dx). */
static at_status need_floats_like(const at_tensor *const *ts, int n, int64_t numel, const at_backend *be,
                                  const char *op)
{
    for (int i = 0; i < n; i++) {
        AT_TRY(need_float(ts[i], op));
        AT_TRY(need_numel(ts[i], numel, op));
        AT_TRY(need_backend(ts[i], be, op));
    }
    return AT_OK;
}

/* The per-row statistics of a norm: f32 [rows]. */
static at_status need_row_stat(const at_tensor *t, const at_tensor *x, const at_backend *be, const char *op)
{
    AT_TRY(need_dtype(t, AT_F32, op));
    AT_TRY(need_numel(t, at_tensor_rows(x), op));
    return need_backend(t, be, op);
}

/* A per-column vector of a norm (weight, bias, their gradients): float [D]. */
static at_status need_col_vec(const at_tensor *t, const at_tensor *x, const at_backend *be, const char *op)
{
    AT_TRY(need_float(t, op));
    AT_TRY(need_numel(t, at_tensor_cols(x), op));
    return need_backend(t, be, op);
}

at_status at_layernorm_forward(at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                               const at_tensor *w, const at_tensor *b, float eps)
{
    const char *op = "layernorm_forward";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need(w, op, "weight"));
    if (!mean != !rstd) return at_error(AT_ERR_INVALID, "%s: mean and rstd are saved together (both or neither)", op);
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    AT_TRY(need_col_vec(w, x, be, op));
    if (b) AT_TRY(need_col_vec(b, x, be, op));
    if (mean) {
        AT_TRY(need_row_stat(mean, x, be, op));
        AT_TRY(need_row_stat(rstd, x, be, op));
    }
    return run_layernorm_forward(be, y, mean, rstd, x, w, b, eps);
}

at_status at_layernorm_backward(at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy, const at_tensor *x,
                                const at_tensor *w, const at_tensor *mean, const at_tensor *rstd)
{
    const char *op = "layernorm_backward";
    AT_TRY(need(dx, op, "dx"));
    AT_TRY(need(dy, op, "dy"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need(w, op, "weight"));
    AT_TRY(need(mean, op, "mean"));
    AT_TRY(need(rstd, op, "rstd"));
    at_backend *be = dx->buf->backend;
    const at_tensor *rows[] = {dx, dy, x};
    AT_TRY(need_floats_like(rows, 3, at_tensor_numel(x), be, op));
    AT_TRY(need_col_vec(w, x, be, op));
    if (dw) AT_TRY(need_col_vec(dw, x, be, op));
    if (db) AT_TRY(need_col_vec(db, x, be, op));
    AT_TRY(need_row_stat(mean, x, be, op));
    AT_TRY(need_row_stat(rstd, x, be, op));
    return run_layernorm_backward(be, dx, dw, db, dy, x, w, mean, rstd);
}

at_status at_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                  const at_rope_sections *sections, int inverse)
{
    const char *op = "rope";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need(pos, op, "positions"));
    AT_TRY(need(inv_freq, op, "inv_freq"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_dtype(pos, AT_I32, op));
    AT_TRY(need_dtype(inv_freq, AT_F32, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    char d[200];
    if (x->ndim < 3 || (x->shape[x->ndim - 1] % 2) != 0)
        return at_error(AT_ERR_INVALID, "rope: %s must be [tokens, heads, even head_dim]", desc(x, d, sizeof d));
    int64_t hd = x->shape[x->ndim - 1] * x->shape[x->ndim - 2], half = x->shape[x->ndim - 1] / 2;
    int ncomp = 1;
    if (sections) {
        int64_t sum = 0;
        ncomp = sections->n;
        if (ncomp < 1 || ncomp > AT_ROPE_MAX_SECTIONS)
            return at_error(AT_ERR_INVALID, "rope: %d position components (1 to %d)", ncomp, AT_ROPE_MAX_SECTIONS);
        for (int k = 0; k < ncomp; k++) {
            if (sections->len[k] < 0) return at_error(AT_ERR_INVALID, "rope: section %d has a negative length", k);
            sum += sections->len[k];
        }
        if (sum != half)
            return at_error(AT_ERR_INVALID, "rope: the sections cover %lld frequencies, %s has %lld", (long long)sum,
                            desc(x, d, sizeof d), (long long)half);
    }
    AT_TRY(need_numel(pos, at_tensor_numel(x) / hd * ncomp, op));
    AT_TRY(need_numel(inv_freq, x->shape[x->ndim - 1] / 2, op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    AT_TRY(need_backend(pos, be, op));
    AT_TRY(need_backend(inv_freq, be, op));
    return run_rope(be, y, x, pos, inv_freq, sections, inverse);
}

static at_status check_attention(const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                 const at_attn_params *p, const at_backend *be, const char *op)
{
    char d1[200], d2[200];
    AT_TRY(need(q, op, "q"));
    AT_TRY(need(k, op, "k"));
    AT_TRY(need(v, op, "v"));
    if (!p) return at_error(AT_ERR_INVALID, "%s: parameters missing", op);
    AT_TRY(need_float(q, op));
    AT_TRY(need_float(k, op));
    AT_TRY(need_float(v, op));
    if (q->ndim != 4 || k->ndim != 4 || !at_tensor_same_shape(k, v))
        return at_error(AT_ERR_INVALID, "%s: q %s and k/v %s must be [B, T, heads, head_dim]", op,
                        desc(q, d1, sizeof d1), desc(k, d2, sizeof d2));
    if (q->shape[0] != k->shape[0] || q->shape[3] != k->shape[3] || k->shape[2] == 0 ||
        q->shape[2] % k->shape[2] != 0)
        return at_error(AT_ERR_INVALID, "%s: q %s does not fit k %s (batch, head_dim, heads multiple)", op,
                        desc(q, d1, sizeof d1), desc(k, d2, sizeof d2));
    int64_t B = q->shape[0], Tq = q->shape[1], Tk = k->shape[1];
    if (p->q_index) {
        AT_TRY(need_dtype(p->q_index, AT_I32, op));
        AT_TRY(need_numel(p->q_index, B * Tq, op));
        AT_TRY(need_backend(p->q_index, be, op));
    }
    if (p->kv_len) {
        AT_TRY(need_dtype(p->kv_len, AT_I32, op));
        AT_TRY(need_numel(p->kv_len, B, op));
        AT_TRY(need_backend(p->kv_len, be, op));
    }
    if (p->segments) {
        if (Tq != Tk) return at_error(AT_ERR_INVALID, "%s: segments need as many queries as keys", op);
        AT_TRY(need_dtype(p->segments, AT_I32, op));
        AT_TRY(need_numel(p->segments, B * Tq, op));
        AT_TRY(need_backend(p->segments, be, op));
    }
    AT_TRY(need_backend(q, be, op));
    AT_TRY(need_backend(k, be, op));
    AT_TRY(need_backend(v, be, op));
    return AT_OK;
}

at_status at_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                               const at_tensor *v, const at_attn_params *p)
{
    const char *op = "attention_forward";
    AT_TRY(need(out, op, "output"));
    at_backend *be = out->buf->backend;
    AT_TRY(check_attention(q, k, v, p, be, op));
    AT_TRY(need_float(out, op));
    AT_TRY(need_same_shape(out, q, op));
    if (lse) {
        AT_TRY(need_dtype(lse, AT_F32, op));
        AT_TRY(need_numel(lse, q->shape[0] * q->shape[1] * q->shape[2], op));
        AT_TRY(need_backend(lse, be, op));
    }
    return run_attention_forward(be, out, lse, q, k, v, p);
}

at_status at_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                const at_tensor *q, const at_tensor *k, const at_tensor *v, const at_tensor *out,
                                const at_tensor *lse, const at_attn_params *p)
{
    const char *op = "attention_backward";
    AT_TRY(need(dq, op, "dq"));
    AT_TRY(need(dk, op, "dk"));
    AT_TRY(need(dv, op, "dv"));
    AT_TRY(need(dout, op, "dout"));
    AT_TRY(need(out, op, "out"));
    AT_TRY(need(lse, op, "lse"));
    at_backend *be = dq->buf->backend;
    AT_TRY(check_attention(q, k, v, p, be, op));
    AT_TRY(need_same_shape(dq, q, op));
    AT_TRY(need_same_shape(dout, q, op));
    AT_TRY(need_same_shape(out, q, op));
    AT_TRY(need_same_shape(dk, k, op));
    AT_TRY(need_same_shape(dv, v, op));
    AT_TRY(need_dtype(lse, AT_F32, op));
    AT_TRY(need_numel(lse, q->shape[0] * q->shape[1] * q->shape[2], op));
    const at_tensor *all[] = {dk, dv, dout, out, lse};
    for (int i = 0; i < 5; i++) AT_TRY(need_backend(all[i], be, op));
    return run_attention_backward(be, dq, dk, dv, dout, q, k, v, out, lse, p);
}

at_status at_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up)
{
    const char *op = "swiglu_forward";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(gate, op, "gate"));
    AT_TRY(need(up, op, "up"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(gate, op));
    AT_TRY(need_float(up, op));
    AT_TRY(need_numel(y, at_tensor_numel(gate), op));
    AT_TRY(need_numel(up, at_tensor_numel(gate), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(gate, be, op));
    AT_TRY(need_backend(up, be, op));
    return run_swiglu_forward(be, y, gate, up);
}

at_status at_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                             const at_tensor *up)
{
    const char *op = "swiglu_backward";
    AT_TRY(need(dgate, op, "dgate"));
    AT_TRY(need(dup, op, "dup"));
    AT_TRY(need(dy, op, "dy"));
    AT_TRY(need(gate, op, "gate"));
    AT_TRY(need(up, op, "up"));
    const at_tensor *all[] = {dgate, dup, dy, gate, up};
    at_backend *be = dgate->buf->backend;
    AT_TRY(need_floats_like(all, 5, at_tensor_numel(gate), be, op));
    return run_swiglu_backward(be, dgate, dup, dy, gate, up);
}

static at_status need_gelu_kind(int kind, const char *op)
{
    if (kind == AT_GELU_ERF || kind == AT_GELU_TANH || kind == AT_GELU_QUICK) return AT_OK;
    return at_error(AT_ERR_INVALID, "%s: unknown GELU kind %d", op, kind);
}

at_status at_gelu_forward(at_tensor *y, const at_tensor *x, int kind)
{
    const char *op = "gelu_forward";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_gelu_kind(kind, op));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_gelu_forward(be, y, x, kind);
}

at_status at_gelu_backward(at_tensor *dx, const at_tensor *dy, const at_tensor *x, int kind)
{
    const char *op = "gelu_backward";
    AT_TRY(need(dx, op, "dx"));
    AT_TRY(need(dy, op, "dy"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_gelu_kind(kind, op));
    const at_tensor *all[] = {dx, dy, x};
    at_backend *be = dx->buf->backend;
    AT_TRY(need_floats_like(all, 3, at_tensor_numel(x), be, op));
    return run_gelu_backward(be, dx, dy, x, kind);
}

at_status at_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table)
{
    const char *op = "embedding_forward";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(ids, op, "ids"));
    AT_TRY(need(table, op, "table"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(table, op));
    AT_TRY(need_dtype(ids, AT_I32, op));
    if (table->ndim != 2) {
        char d[200];
        return at_error(AT_ERR_INVALID, "%s: table %s must be [vocab, dim]", op, desc(table, d, sizeof d));
    }
    AT_TRY(need_numel(y, at_tensor_numel(ids) * table->shape[1], op));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(ids, be, op));
    AT_TRY(need_backend(table, be, op));
    return run_embedding_forward(be, y, ids, table);
}

at_status at_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids)
{
    const char *op = "embedding_backward";
    AT_TRY(need(dtable, op, "dtable"));
    AT_TRY(need(dy, op, "dy"));
    AT_TRY(need(ids, op, "ids"));
    AT_TRY(need_float(dtable, op));
    AT_TRY(need_float(dy, op));
    AT_TRY(need_dtype(ids, AT_I32, op));
    if (dtable->ndim != 2) {
        char d[200];
        return at_error(AT_ERR_INVALID, "%s: %s must be [vocab, dim]", op, desc(dtable, d, sizeof d));
    }
    AT_TRY(need_numel(dy, at_tensor_numel(ids) * dtable->shape[1], op));
    at_backend *be = dtable->buf->backend;
    AT_TRY(need_backend(dy, be, op));
    AT_TRY(need_backend(ids, be, op));
    return run_embedding_backward(be, dtable, dy, ids);
}

at_status at_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                           const at_tensor *labels, float grad_scale)
{
    const char *op = "cross_entropy";
    AT_TRY(need(row_loss, op, "row_loss"));
    AT_TRY(need(logits, op, "logits"));
    AT_TRY(need(labels, op, "labels"));
    AT_TRY(need_dtype(row_loss, AT_F32, op));
    AT_TRY(need_float(logits, op));
    AT_TRY(need_dtype(labels, AT_I32, op));
    int64_t n = at_tensor_rows(logits);
    AT_TRY(need_numel(row_loss, n, op));
    AT_TRY(need_numel(labels, n, op));
    at_backend *be = row_loss->buf->backend;
    if (dlogits) {
        AT_TRY(need_float(dlogits, op));
        AT_TRY(need_numel(dlogits, at_tensor_numel(logits), op));
        AT_TRY(need_backend(dlogits, be, op));
    }
    AT_TRY(need_backend(logits, be, op));
    AT_TRY(need_backend(labels, be, op));
    return run_cross_entropy(be, row_loss, dlogits, logits, labels, grad_scale);
}

at_status at_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v, const at_adamw_params *p)
{
    const char *op = "adamw";
    AT_TRY(need(param, op, "param"));
    AT_TRY(need(grad, op, "grad"));
    AT_TRY(need(m, op, "m"));
    AT_TRY(need(v, op, "v"));
    if (!p) return at_error(AT_ERR_INVALID, "adamw: parameters missing");
    if (p->step < 1) return at_error(AT_ERR_INVALID, "adamw: step must be >= 1");
    const at_tensor *all[] = {param, grad, m, v};
    at_backend *be = param->buf->backend;
    for (int i = 0; i < 4; i++) {
        AT_TRY(need_dtype(all[i], AT_F32, op));
        AT_TRY(need_numel(all[i], at_tensor_numel(param), op));
        AT_TRY(need_backend(all[i], be, op));
    }
    return run_adamw(be, param, grad, m, v, p);
}

at_status at_sumsq(at_tensor *out, const at_tensor *x)
{
    const char *op = "sumsq";
    AT_TRY(need(out, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_dtype(out, AT_F32, op));
    AT_TRY(need_numel(out, 1, op));
    AT_TRY(need_float(x, op));
    at_backend *be = out->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_sumsq(be, out, x);
}

at_status at_read_scalar(const at_tensor *t, float *out)
{
    if (t->dtype != AT_F32 || at_tensor_numel(t) < 1)
        return at_error(AT_ERR_INVALID, "read_scalar: %s must be f32", t->name);
    return t->buf->backend->download(t->buf->backend, out, (char *)t->buf->ptr + t->offset, sizeof(float));
}

at_status at_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                     uint64_t pitch)
{
    const char *op = "dropout";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need(x, op, "x"));
    AT_TRY(need_float(y, op));
    AT_TRY(need_float(x, op));
    AT_TRY(need_numel(y, at_tensor_numel(x), op));
    AT_TRY(dropout_checks(op, p, run, pitch));
    at_backend *be = y->buf->backend;
    AT_TRY(need_backend(x, be, op));
    return run_dropout(be, y, x, p, seed, offset, run, pitch);
}

at_status at_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                               uint64_t pitch)
{
    const char *op = "add_uniform_noise";
    AT_TRY(need(y, op, "output"));
    AT_TRY(need_float(y, op));
    if (!(magnitude >= 0.0f && isfinite(magnitude)))
        return at_error(AT_ERR_INVALID, "add_uniform_noise: magnitude %g of %s must be finite and >= 0",
                        (double)magnitude, y->name);
    if (run < 0 || (run > 0 && pitch < (uint64_t)run))
        return at_error(AT_ERR_INVALID, "add_uniform_noise: runs of %lld elements %llu apart overlap",
                        (long long)run, (unsigned long long)pitch);
    if (magnitude == 0.0f) return AT_OK;
    at_backend *be = y->buf->backend;
    return run_add_uniform_noise(be, y, magnitude, seed, offset, run, pitch);
}
