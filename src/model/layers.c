#include "model/layers.h"

#include <string.h>
#include "base/rng.h"
#include "device/quant.h"
#include "ops/ops.h"

/* ---- activation layout ---------------------------------------------------- */

#define ALIGN_ELEMS 16 /* 64 bytes of f32 */

static size_t round_up(size_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

/* Sizes in elements of the fields, in the order they are laid out. */
typedef struct {
    size_t n[16];
    int count;
} layout;

static void acts_layout(const at_model_config *c, int64_t N, layout *L)
{
    size_t hd = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t qd = (size_t)c->num_attention_heads * (size_t)c->head_dim;
    size_t kd = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    size_t n = (size_t)N, k = 0;
    L->n[k++] = n;                                               /* attn_rstd */
    L->n[k++] = c->qk_norm ? n * qd : 0;                         /* q_raw */
    L->n[k++] = c->qk_norm ? n * kd : 0;                         /* k_raw */
    L->n[k++] = c->qk_norm ? n * (size_t)c->num_attention_heads : 0;  /* q_rstd */
    L->n[k++] = c->qk_norm ? n * (size_t)c->num_key_value_heads : 0;  /* k_rstd */
    L->n[k++] = n * qd;                                          /* q */
    L->n[k++] = n * kd;                                          /* k */
    L->n[k++] = n * kd;                                          /* v */
    L->n[k++] = n * qd;                                          /* att */
    L->n[k++] = n * (size_t)c->num_attention_heads;              /* lse */
    L->n[k++] = n * hd;                                          /* res_mid */
    L->n[k++] = n;                                               /* ffn_rstd */
    L->n[k++] = n * I;                                           /* gate */
    L->n[k++] = n * I;                                           /* up */
    L->count = k;
}

size_t at_layer_acts_elems(const at_model_config *cfg, int64_t n_tokens)
{
    layout L;
    acts_layout(cfg, n_tokens, &L);
    size_t total = 0;
    for (int i = 0; i < L.count; i++) total += round_up(L.n[i]);
    return total;
}

size_t at_layer_recomputed_elems(const at_model_config *cfg, int64_t n_tokens)
{
    size_t n = (size_t)n_tokens;
    return 2 * round_up(n * (size_t)cfg->hidden_size) + round_up(n * (size_t)cfg->intermediate_size);
}

static void bind(at_tensor *dst, const at_tensor *arena, size_t *off, size_t n, int ndim, int64_t d0, int64_t d1,
                 int64_t d2, int64_t d3, const char *name)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    if (n == 0) {
        memset(dst, 0, sizeof *dst); /* absent: buf NULL */
        return;
    }
    at_tensor_view_inplace(dst, arena, *off, ndim, shape);
    at_tensor_set_name(dst, name);
    *off += round_up(n);
}

void at_layer_acts_bind(at_layer_acts *a, const at_model_config *c, int B, int T, const at_tensor *arena,
                        size_t elem_offset)
{
    layout L;
    int64_t N = (int64_t)B * T;
    acts_layout(c, N, &L);
    int64_t hd = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int64_t H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    size_t off = elem_offset;
    memset(a->lora_u, 0, sizeof a->lora_u); /* LoRA parts are bound apart */
    memset(&a->lora_x, 0, sizeof a->lora_x);
    bind(&a->attn_rstd, arena, &off, L.n[0], 1, N, 1, 1, 1, "acts.attn_rstd");
    bind(&a->q_raw, arena, &off, L.n[1], 2, N, H * D, 1, 1, "acts.q_raw");
    bind(&a->k_raw, arena, &off, L.n[2], 2, N, Hkv * D, 1, 1, "acts.k_raw");
    bind(&a->q_rstd, arena, &off, L.n[3], 1, N * H, 1, 1, 1, "acts.q_rstd");
    bind(&a->k_rstd, arena, &off, L.n[4], 1, N * Hkv, 1, 1, 1, "acts.k_rstd");
    bind(&a->q, arena, &off, L.n[5], 4, B, T, H, D, "acts.q");
    bind(&a->k, arena, &off, L.n[6], 4, B, T, Hkv, D, "acts.k");
    bind(&a->v, arena, &off, L.n[7], 4, B, T, Hkv, D, "acts.v");
    bind(&a->att, arena, &off, L.n[8], 4, B, T, H, D, "acts.att");
    bind(&a->lse, arena, &off, L.n[9], 3, B, H, T, 1, "acts.lse");
    bind(&a->res_mid, arena, &off, L.n[10], 2, N, hd, 1, 1, "acts.res_mid");
    bind(&a->ffn_rstd, arena, &off, L.n[11], 1, N, 1, 1, 1, "acts.ffn_rstd");
    bind(&a->gate, arena, &off, L.n[12], 2, N, I, 1, 1, "acts.gate");
    bind(&a->up, arena, &off, L.n[13], 2, N, I, 1, 1, "acts.up");
}

void at_layer_acts_bind_recomputed(at_layer_acts *a, const at_model_config *c, int64_t N, const at_tensor *arena,
                                   size_t elem_offset)
{
    size_t off = elem_offset, nh = (size_t)N * (size_t)c->hidden_size;
    bind(&a->attn_norm, arena, &off, nh, 2, N, c->hidden_size, 1, 1, "acts.attn_norm");
    bind(&a->ffn_norm, arena, &off, nh, 2, N, c->hidden_size, 1, 1, "acts.ffn_norm");
    bind(&a->act, arena, &off, (size_t)N * (size_t)c->intermediate_size, 2, N, c->intermediate_size, 1, 1,
         "acts.act");
}

size_t at_layer_lora_elems(int64_t n_tokens, int rank, unsigned target_mask)
{
    size_t total = 0;
    if (rank <= 0) return 0;
    for (int m = 0; m < AT_MOD_COUNT; m++)
        if (target_mask & (1u << m)) total += round_up((size_t)n_tokens * (size_t)rank);
    return total;
}

void at_layer_acts_bind_lora(at_layer_acts *a, int64_t n_tokens, int rank, unsigned target_mask, int shared,
                             const at_tensor *arena, size_t elem_offset)
{
    size_t off = elem_offset;
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        if (rank <= 0 || !(target_mask & (1u << m))) {
            memset(&a->lora_u[m], 0, sizeof a->lora_u[m]);
            continue;
        }
        bind(&a->lora_u[m], arena, &off, (size_t)n_tokens * (size_t)rank, 2, n_tokens, rank, 1, 1, "acts.lora_u");
        if (shared) off = elem_offset;
    }
}

/* ---- helpers ---------------------------------------------------------------- */

/* A 2-D view [rows, cols] of t (same elements). */
static at_tensor flat2(const at_tensor *t, int64_t rows, int64_t cols)
{
    at_tensor v;
    int64_t shape[2] = {rows, cols};
    at_tensor_view_inplace(&v, t, 0, 2, shape);
    return v;
}

/* The LoRA pair of module m when the layer has one, else NULL. */
static const at_lora_pair *lora_of(const at_layer_io *io, at_module m)
{
    if (!io || !io->lora || !io->lora->pairs || !io->lora->pairs[m].A) return NULL;
    return &io->lora->pairs[m];
}

/* The dropout counters of module m over an input of `in` columns (layers.h):
 * token n of the batch is token n % row_tokens of row first_row + n /
 * row_tokens, and its features are a run of `in` counters of that row's pitch. */
typedef struct {
    uint64_t seed, offset, pitch;
    int64_t run;
} lora_mask;

static lora_mask mask_of(const at_layer_lora *l, at_module m, int64_t in)
{
    uint64_t pitch = (uint64_t)AT_DROPOUT_ROW_PITCH * (uint64_t)in;
    return (lora_mask){at_rng_mix(l->seed, (uint64_t)m), (uint64_t)l->first_row * pitch, pitch, l->row_tokens * in};
}

/* y = drop(x) for module m. */
static at_status lora_dropout(at_tensor *y, const at_tensor *x, const at_layer_io *io, at_module m, int64_t in)
{
    lora_mask k = mask_of(io->lora, m, in);
    return at_dropout(y, x, io->lora->dropout, k.seed, k.offset, k.run, k.pitch);
}

/* y = drop(dU·A) for module m, the mask of lora_dropout: the input gradient
 * of the adapter, y [N, in]. */
static at_status lora_input_grad(at_tensor *y, const at_tensor *du, const at_tensor *A, const at_layer_io *io,
                                 at_module m)
{
    lora_mask k = mask_of(io->lora, m, A->shape[1]);
    return at_matmul_dropout(y, du, A, 0, 0, 1.0f, io->lora->dropout, k.seed, k.offset, k.run, k.pitch);
}

/* drop(x) for module m: x itself without dropout, else the dropped copy in
 * scratch (a view [N, in] of `buf`). */
static at_status lora_input(const at_tensor **xin, at_tensor *tmp, const at_tensor *x, const at_tensor *buf,
                            const at_layer_io *io, at_module m)
{
    *xin = x;
    if (io->lora->dropout <= 0.0f) return AT_OK;
    if (!buf || !buf->buf)
        return at_error(AT_ERR_INVALID, "layer: LoRA dropout %g needs the training buffers (AT_ACTS_TRAIN)",
                        (double)io->lora->dropout);
    int64_t shape[2] = {x->shape[0], x->shape[1]};
    at_tensor_view_inplace(tmp, buf, 0, 2, shape);
    AT_TRY(lora_dropout(tmp, x, io, m, x->shape[1]));
    *xin = tmp;
    return AT_OK;
}

/* u = drop(x)·Aᵀ [N, r] for the adapter p of module m, kept in acts for
 * the backward (*u_out); x [N, in]. */
static at_status lora_down(const at_tensor **u_out, const at_tensor *x, at_layer_acts *a, const at_layer_io *io,
                           at_module m, const at_lora_pair *p)
{
    char buf[200];
    at_tensor *u = &a->lora_u[m];
    if (!u->buf || u->shape[0] != x->shape[0] || u->shape[1] != p->A->shape[0])
        return at_error(AT_ERR_INVALID, "layer: no LoRA buffer for %s (rank %lld) in the activations %s: allocate "
                        "them after setting the adapter", at_module_name(m), (long long)p->A->shape[0],
                        u->buf ? at_tensor_describe(u, buf, sizeof buf) : "(none)");
    const at_tensor *xin;
    at_tensor tmp;
    AT_TRY(lora_input(&xin, &tmp, x, &a->lora_x, io, m));
    AT_TRY(at_matmul(u, xin, p->A, 0, 1, 1.0f, 0.0f));
    *u_out = u;
    return AT_OK;
}

/* The left operand of a product with weight w: x itself, or (QLoRA with a
 * bf16 compute format, io->qact) x rounded to bf16 in the scratch `view`. */
static at_status matmul_input(const at_tensor **out, at_tensor *view, const at_tensor *x, const at_tensor *w,
                              const at_layer_io *io)
{
    *out = x;
    if (!io->qact || !at_dtype_is_quantized(w->dtype)) return AT_OK;
    if (at_tensor_numel(x) > at_tensor_numel(io->qact))
        return at_error(AT_ERR_INTERNAL, "layer: bf16 scratch too small for %s", x->name);
    at_tensor_view_inplace(view, io->qact, 0, x->ndim, x->shape);
    AT_TRY(at_cast(view, x));
    *out = view;
    return AT_OK;
}

/* y = beta·y + x·Wᵀ (+ b) (+ s·(drop(x)·Aᵀ)·Bᵀ, the LoRA of module m),
 * beta 0 or 1: the nn.Linear of PyTorch (peft's lora.Linear when adapted),
 * the adapter's term added by the frozen product (at_matmul_lowrank).
 * x [N, in], W [out, in], y [N, out]. */
static at_status linear(at_tensor *y, float beta, const at_tensor *x, const at_tensor *w, const at_tensor *b,
                        at_layer_acts *a, const at_layer_io *io, at_module m)
{
    const at_tensor *xm, *u = NULL;
    at_tensor view;
    const at_lora_pair *p = lora_of(io, m);
    AT_TRY(matmul_input(&xm, &view, x, w, io));
    if (p) {
        AT_TRY(lora_down(&u, x, a, io, m, p));
        AT_TRY(at_matmul_lowrank(y, xm, w, 0, 1, 1.0f, beta, u, p->B, io->lora->scale));
    } else {
        AT_TRY(at_matmul(y, xm, w, 0, 1, 1.0f, beta));
    }
    if (b) AT_TRY(at_add(y, y, b));
    return AT_OK;
}

/* y = r + x·Wᵀ (+ b) (+ LoRA), with y possibly equal to r (accumulate in place). */
static at_status linear_residual(at_tensor *y, const at_tensor *r, const at_tensor *x, const at_tensor *w,
                                 const at_tensor *b, at_layer_acts *a, const at_layer_io *io, at_module m)
{
    if (y->buf != r->buf || y->offset != r->offset) AT_TRY(at_cast(y, r));
    return linear(y, 1.0f, x, w, b, a, io, m);
}

/* Backward of y = x·Wᵀ + b + s·(drop(x)·Aᵀ)·Bᵀ for the gradient dy [N, out]:
 *   dx  = dy·W + drop(dU·A)  with dU = s·dy·B     (dx_beta 1: added to dx; dx NULL: not needed)
 *   dW += dyᵀ·x,  db += Σ_rows dy                  (full fine-tuning; NULL: frozen)
 *   dB += s·dyᵀ·u,  dA += dUᵀ·drop(x)             (LoRA training; NULL: frozen)
 * drop(x) and the mask of drop(dU·A) are regenerated from the seed. When dx
 * starts here (dx_beta 0), drop(dU·A) is formed in dx itself and dy·W added
 * to it by the GEMM (beta 1); else it goes through the scratch and is added
 * (one more pass over [N, in] and its own parallel region: 4 of a layer's 7
 * adapted products start their dx). */
static at_status linear_backward(at_tensor *dx, float dx_beta, const at_tensor *dy, const at_tensor *x,
                                 const at_tensor *w, at_tensor *dw, at_tensor *db, const at_layer_acts *a,
                                 const at_layer_grads *g, const at_layer_io *io, at_module m,
                                 at_layer_bwd_scratch *s)
{
    const at_lora_pair *p = lora_of(io, m);
    int lora_first = dx && dx_beta == 0.0f && p;
    at_tensor du, tmp;
    if (p) {
        const at_lora_pair *gp = g && g->lora && g->lora[m].A ? &g->lora[m] : NULL;
        float sc = io->lora->scale;
        int64_t shu[2] = {dy->shape[0], p->A->shape[0]};
        if (!s->lora_du.buf) return at_error(AT_ERR_INTERNAL, "layer backward: no LoRA scratch");
        at_tensor_view_inplace(&du, &s->lora_du, 0, 2, shu);
        if (gp) AT_TRY(at_matmul(gp->B, dy, &a->lora_u[m], 1, 0, sc, 1.0f));
        AT_TRY(at_matmul(&du, dy, p->B, 0, 0, sc, 0.0f));
        if (gp) {
            const at_tensor *xin;
            AT_TRY(lora_input(&xin, &tmp, x, &s->lora_x, io, m));
            AT_TRY(at_matmul(gp->A, &du, xin, 1, 0, 1.0f, 1.0f));
        }
        if (lora_first) AT_TRY(lora_input_grad(dx, &du, p->A, io, m));
    }
    if (dx) {
        const at_tensor *dym;
        at_tensor view;
        AT_TRY(matmul_input(&dym, &view, dy, w, io));
        AT_TRY(at_matmul(dx, dym, w, 0, 0, 1.0f, lora_first ? 1.0f : dx_beta));
    }
    if (dw) AT_TRY(at_matmul(dw, dy, x, 1, 0, 1.0f, 1.0f));
    if (db) AT_TRY(at_sum_rows(db, dy, 1.0f));
    if (!p || !dx || lora_first) return AT_OK;
    if (io->lora->dropout <= 0.0f) return at_matmul(dx, &du, p->A, 0, 0, 1.0f, 1.0f);
    int64_t shx[2] = {dy->shape[0], p->A->shape[1]};
    at_tensor_view_inplace(&tmp, &s->lora_x, 0, 2, shx);
    AT_TRY(lora_input_grad(&tmp, &du, p->A, io, m));
    return at_axpy(dx, 1.0f, &tmp);
}

/* Appends this batch's new keys (or values) to a layer's cache: sequence b's
 * n_new[b] rows go after its cache_start[b] rows. One copy per sequence. */
static at_status cache_append(at_tensor *cache, const at_tensor *src, const at_layer_io *io)
{
    int64_t row = cache->shape[2] * cache->shape[3]; /* Hkv·D */
    int64_t max_seq = cache->shape[1];
    for (int b = 0; b < io->B; b++) {
        int n = io->n_new[b];
        if (n <= 0) continue;
        at_tensor s, d;
        int64_t shape[2] = {n, row};
        at_tensor_view_inplace(&s, src, (size_t)((int64_t)b * io->T * row), 2, shape);
        at_tensor_view_inplace(&d, cache, (size_t)(((int64_t)b * max_seq + io->cache_start[b]) * row), 2, shape);
        AT_TRY(at_cast(&d, &s));
    }
    return AT_OK;
}

/* ---- the blocks --------------------------------------------------------------- */

at_status at_attention_block_forward(const at_model_config *c, const at_layer_weights *w, at_layer_acts *a,
                                     at_tensor *y, const at_tensor *x, const at_layer_io *io)
{
    int64_t N = (int64_t)io->B * io->T;
    int64_t hd = c->hidden_size, D = c->head_dim, H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    float eps = (float)c->rms_norm_eps;
    at_tensor x2 = flat2(x, N, hd), y2 = flat2(y, N, hd);
    at_tensor q2 = flat2(&a->q, N, H * D), k2 = flat2(&a->k, N, Hkv * D), v2 = flat2(&a->v, N, Hkv * D);

    /* a = rmsnorm(x) · w */
    AT_TRY(at_rmsnorm_forward(&a->attn_norm, &a->attn_rstd, &x2, w->attn_norm, eps));

    /* projections; with q/k norm the projections land in q_raw/k_raw first */
    AT_TRY(linear(c->qk_norm ? &a->q_raw : &q2, 0.0f, &a->attn_norm, w->wq, w->bq, a, io, AT_MOD_Q));
    AT_TRY(linear(c->qk_norm ? &a->k_raw : &k2, 0.0f, &a->attn_norm, w->wk, w->bk, a, io, AT_MOD_K));
    AT_TRY(linear(&v2, 0.0f, &a->attn_norm, w->wv, w->bv, a, io, AT_MOD_V));
    if (c->qk_norm) {
        /* per-head RMSNorm over D, before RoPE (Qwen3) */
        at_tensor qr = flat2(&a->q_raw, N * H, D), kr = flat2(&a->k_raw, N * Hkv, D);
        at_tensor qo = flat2(&a->q, N * H, D), ko = flat2(&a->k, N * Hkv, D);
        AT_TRY(at_rmsnorm_forward(&qo, &a->q_rstd, &qr, w->q_norm, eps));
        AT_TRY(at_rmsnorm_forward(&ko, &a->k_rstd, &kr, w->k_norm, eps));
    }

    /* rotary position embedding, in place */
    AT_TRY(at_rope(&a->q, &a->q, io->pos, io->inv_freq, io->sections, 0));
    AT_TRY(at_rope(&a->k, &a->k, io->pos, io->inv_freq, io->sections, 0));

    /* attention over this batch's keys, or over the cache after appending */
    const at_tensor *K = &a->k, *V = &a->v;
    if (io->k_cache) {
        AT_TRY(cache_append(io->k_cache, &a->k, io));
        AT_TRY(cache_append(io->v_cache, &a->v, io));
        K = io->k_cache;
        V = io->v_cache;
    }
    AT_TRY(at_attention_forward(&a->att, io->save_lse ? &a->lse : NULL, &a->q, K, V, &io->attn));

    /* y = x + o·Woᵀ + bo */
    at_tensor att2 = flat2(&a->att, N, H * D);
    AT_TRY(linear_residual(&y2, &x2, &att2, w->wo, w->bo, a, io, AT_MOD_O));
    return AT_OK;
}

at_status at_mlp_block_forward(const at_model_config *c, const at_layer_weights *w, at_layer_acts *a,
                               at_tensor *y, const at_tensor *h, const at_layer_io *io)
{
    int64_t N = at_tensor_numel(h) / c->hidden_size;
    at_tensor h2 = flat2(h, N, c->hidden_size), y2 = flat2(y, N, c->hidden_size);
    AT_TRY(at_rmsnorm_forward(&a->ffn_norm, &a->ffn_rstd, &h2, w->ffn_norm, (float)c->rms_norm_eps));
    AT_TRY(linear(&a->gate, 0.0f, &a->ffn_norm, w->w_gate, NULL, a, io, AT_MOD_GATE));
    AT_TRY(linear(&a->up, 0.0f, &a->ffn_norm, w->w_up, NULL, a, io, AT_MOD_UP));
    AT_TRY(at_swiglu_forward(&a->act, &a->gate, &a->up));
    AT_TRY(linear_residual(&y2, &h2, &a->act, w->w_down, NULL, a, io, AT_MOD_DOWN));
    return AT_OK;
}

at_status at_layer_recompute_shared(const at_model_config *c, const at_layer_weights *w, at_layer_acts *a,
                                    const at_tensor *x)
{
    int64_t hd = c->hidden_size, N = at_tensor_numel(x) / hd;
    at_tensor x2 = flat2(x, N, hd), h2 = flat2(&a->res_mid, N, hd);
    float eps = (float)c->rms_norm_eps;
    AT_TRY(at_rmsnorm_forward(&a->attn_norm, &a->attn_rstd, &x2, w->attn_norm, eps));
    AT_TRY(at_rmsnorm_forward(&a->ffn_norm, &a->ffn_rstd, &h2, w->ffn_norm, eps));
    return at_swiglu_forward(&a->act, &a->gate, &a->up);
}

/* Gradient of one weight of layer gradients g (NULL when frozen). */
#define GW(g, field) ((g) && (g)->w ? (g)->w->field : NULL)

/* MLP backward (math in layers.h):
 *   dz = dy·Wd,  dg, du = swiglu_backward(dz),  dm = dg·Wg + du·Wu,
 *   dh = dy + rmsnorm_backward(dm) */
at_status at_mlp_block_backward(const at_model_config *c, const at_layer_weights *w, const at_layer_acts *a,
                                at_layer_grads *g, at_tensor *dres, const at_tensor *h, const at_layer_io *io,
                                at_layer_bwd_scratch *s)
{
    int64_t hd = c->hidden_size, I = c->intermediate_size, N = at_tensor_numel(dres) / hd;
    at_tensor dy = flat2(dres, N, hd), h2 = flat2(h, N, hd);
    at_tensor dz = flat2(&s->big[0], N, I), dg = flat2(&s->big[1], N, I), du = flat2(&s->big[2], N, I);
    at_tensor dm = flat2(&s->hd[0], N, hd), dn = flat2(&s->hd[1], N, hd);
    AT_TRY(linear_backward(&dz, 0.0f, &dy, &a->act, w->w_down, GW(g, w_down), NULL, a, g, io, AT_MOD_DOWN, s));
    AT_TRY(at_swiglu_backward(&dg, &du, &dz, &a->gate, &a->up));
    AT_TRY(linear_backward(&dm, 0.0f, &dg, &a->ffn_norm, w->w_gate, GW(g, w_gate), NULL, a, g, io, AT_MOD_GATE, s));
    AT_TRY(linear_backward(&dm, 1.0f, &du, &a->ffn_norm, w->w_up, GW(g, w_up), NULL, a, g, io, AT_MOD_UP, s));
    AT_TRY(at_rmsnorm_backward(&dn, GW(g, ffn_norm), &dm, &h2, w->ffn_norm, &a->ffn_rstd));
    return at_axpy(&dy, 1.0f, &dn);
}

/* Attention backward (math in layers.h): o_proj, attention, RoPE⁻¹, q/k norm,
 * q/k/v projections, input norm, residual. */
at_status at_attention_block_backward(const at_model_config *c, const at_layer_weights *w,
                                      const at_layer_acts *a, at_layer_grads *g, at_tensor *dres,
                                      const at_tensor *x, const at_layer_io *io, at_layer_bwd_scratch *s)
{
    int64_t B = io->B, T = io->T, N = B * T;
    int64_t hd = c->hidden_size, D = c->head_dim, H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    int64_t sq[4] = {B, T, H, D}, skv[4] = {B, T, Hkv, D};
    at_tensor dy = flat2(dres, N, hd), x2 = flat2(x, N, hd);
    at_tensor datt, dq, dk, dv;
    at_tensor_view_inplace(&datt, &s->big[0], 0, 4, sq);
    at_tensor_view_inplace(&dq, &s->big[1], 0, 4, sq);
    at_tensor_view_inplace(&dk, &s->kv[0], 0, 4, skv);
    at_tensor_view_inplace(&dv, &s->kv[1], 0, 4, skv);
    at_tensor datt2 = flat2(&datt, N, H * D), att2 = flat2(&a->att, N, H * D);
    at_tensor dq2 = flat2(&dq, N, H * D), dk2 = flat2(&dk, N, Hkv * D), dv2 = flat2(&dv, N, Hkv * D);
    at_tensor da = flat2(&s->hd[0], N, hd), dn = flat2(&s->hd[1], N, hd);

    /* y = x + o·Woᵀ + bo */
    AT_TRY(linear_backward(&datt2, 0.0f, &dy, &att2, w->wo, GW(g, wo), GW(g, bo), a, g, io, AT_MOD_O, s));
    /* o = softmax(scale·q·kᵀ)·v, from the saved log-sum-exp */
    AT_TRY(at_attention_backward(&dq, &dk, &dv, &datt, &a->q, &a->k, &a->v, &a->att, &a->lse, &io->attn));
    /* q, k were rotated in place: rotate the gradients back */
    AT_TRY(at_rope(&dq, &dq, io->pos, io->inv_freq, io->sections, 1));
    AT_TRY(at_rope(&dk, &dk, io->pos, io->inv_freq, io->sections, 1));
    const at_tensor *gq = &dq2, *gk = &dk2;
    at_tensor dqr, dkr;
    if (c->qk_norm) {
        /* per-head RMSNorm over D */
        at_tensor dqh = flat2(&dq, N * H, D), dkh = flat2(&dk, N * Hkv, D);
        at_tensor qr = flat2(&a->q_raw, N * H, D), kr = flat2(&a->k_raw, N * Hkv, D);
        at_tensor dqrh = flat2(&s->big[2], N * H, D), dkrh = flat2(&s->kv[2], N * Hkv, D);
        AT_TRY(at_rmsnorm_backward(&dqrh, GW(g, q_norm), &dqh, &qr, w->q_norm, &a->q_rstd));
        AT_TRY(at_rmsnorm_backward(&dkrh, GW(g, k_norm), &dkh, &kr, w->k_norm, &a->k_rstd));
        dqr = flat2(&s->big[2], N, H * D);
        dkr = flat2(&s->kv[2], N, Hkv * D);
        gq = &dqr;
        gk = &dkr;
    }
    /* a = rmsnorm(x)·w feeds q, k, v: their gradients add up */
    AT_TRY(linear_backward(&da, 0.0f, gq, &a->attn_norm, w->wq, GW(g, wq), GW(g, bq), a, g, io, AT_MOD_Q, s));
    AT_TRY(linear_backward(&da, 1.0f, gk, &a->attn_norm, w->wk, GW(g, wk), GW(g, bk), a, g, io, AT_MOD_K, s));
    AT_TRY(linear_backward(&da, 1.0f, &dv2, &a->attn_norm, w->wv, GW(g, wv), GW(g, bv), a, g, io, AT_MOD_V, s));
    AT_TRY(at_rmsnorm_backward(&dn, GW(g, attn_norm), &da, &x2, w->attn_norm, &a->attn_rstd));
    return at_axpy(&dy, 1.0f, &dn);
}

/* ---- backward scratch --------------------------------------------------------- */

static int64_t max_in_features(const at_model_config *c)
{
    int64_t m = c->hidden_size, q = (int64_t)c->num_attention_heads * c->head_dim;
    if (q > m) m = q;
    if (c->intermediate_size > m) m = c->intermediate_size;
    return m;
}

static void bwd_sizes(const at_model_config *c, int64_t N, int rank, size_t n[10])
{
    size_t W = (size_t)c->intermediate_size, q = (size_t)c->num_attention_heads * (size_t)c->head_dim;
    if (q > W) W = q;
    size_t kv = (size_t)c->num_key_value_heads * (size_t)c->head_dim, hd = (size_t)c->hidden_size;
    for (int i = 0; i < 3; i++) n[i] = (size_t)N * W;
    for (int i = 3; i < 6; i++) n[i] = (size_t)N * kv;
    n[6] = n[7] = (size_t)N * hd;
    n[8] = rank > 0 ? (size_t)N * (size_t)rank : 0;
    n[9] = rank > 0 ? (size_t)N * (size_t)max_in_features(c) : 0;
}

size_t at_layer_bwd_elems(const at_model_config *cfg, int64_t n_tokens, int lora_rank)
{
    size_t n[10], total = 0;
    bwd_sizes(cfg, n_tokens, lora_rank, n);
    for (int i = 0; i < 10; i++) total += round_up(n[i]);
    return total;
}

void at_layer_bwd_bind(at_layer_bwd_scratch *s, const at_model_config *cfg, int64_t N, int lora_rank,
                       const at_tensor *arena, size_t elem_offset)
{
    size_t n[10], off = elem_offset;
    bwd_sizes(cfg, N, lora_rank, n);
    at_tensor *slot[10] = {&s->big[0], &s->big[1], &s->big[2], &s->kv[0], &s->kv[1],
                           &s->kv[2],  &s->hd[0],  &s->hd[1],  &s->lora_du, &s->lora_x};
    for (int i = 0; i < 10; i++) {
        int64_t cols = (int64_t)(n[i] / (size_t)(N > 0 ? N : 1));
        bind(slot[i], arena, &off, n[i], 2, N, cols, 1, 1, "acts.grad_scratch");
    }
}
