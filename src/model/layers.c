#include "model/layers.h"

#include <string.h>
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
    L->n[k++] = n * hd;                                          /* attn_norm */
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
    L->n[k++] = n * hd;                                          /* ffn_norm */
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
    /* act [N, I] */
    total += round_up((size_t)n_tokens * (size_t)cfg->intermediate_size);
    return total;
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
    bind(&a->attn_norm, arena, &off, L.n[0], 2, N, hd, 1, 1, "acts.attn_norm");
    bind(&a->attn_rstd, arena, &off, L.n[1], 1, N, 1, 1, 1, "acts.attn_rstd");
    bind(&a->q_raw, arena, &off, L.n[2], 2, N, H * D, 1, 1, "acts.q_raw");
    bind(&a->k_raw, arena, &off, L.n[3], 2, N, Hkv * D, 1, 1, "acts.k_raw");
    bind(&a->q_rstd, arena, &off, L.n[4], 1, N * H, 1, 1, 1, "acts.q_rstd");
    bind(&a->k_rstd, arena, &off, L.n[5], 1, N * Hkv, 1, 1, 1, "acts.k_rstd");
    bind(&a->q, arena, &off, L.n[6], 4, B, T, H, D, "acts.q");
    bind(&a->k, arena, &off, L.n[7], 4, B, T, Hkv, D, "acts.k");
    bind(&a->v, arena, &off, L.n[8], 4, B, T, Hkv, D, "acts.v");
    bind(&a->att, arena, &off, L.n[9], 4, B, T, H, D, "acts.att");
    bind(&a->lse, arena, &off, L.n[10], 3, B, H, T, 1, "acts.lse");
    bind(&a->res_mid, arena, &off, L.n[11], 2, N, hd, 1, 1, "acts.res_mid");
    bind(&a->ffn_norm, arena, &off, L.n[12], 2, N, hd, 1, 1, "acts.ffn_norm");
    bind(&a->ffn_rstd, arena, &off, L.n[13], 1, N, 1, 1, 1, "acts.ffn_rstd");
    bind(&a->gate, arena, &off, L.n[14], 2, N, I, 1, 1, "acts.gate");
    bind(&a->up, arena, &off, L.n[15], 2, N, I, 1, 1, "acts.up");
    bind(&a->act, arena, &off, (size_t)N * (size_t)I, 2, N, I, 1, 1, "acts.act");
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

/* y = x·Wᵀ (+ b): the nn.Linear of PyTorch. x [N, in], W [out, in], y [N, out]. */
static at_status linear(at_tensor *y, const at_tensor *x, const at_tensor *w, const at_tensor *b)
{
    AT_TRY(at_matmul(y, x, w, 0, 1, 1.0f, 0.0f));
    if (b) AT_TRY(at_add(y, y, b));
    return AT_OK;
}

/* y = r + x·Wᵀ (+ b), with y possibly equal to r (accumulate in place). */
static at_status linear_residual(at_tensor *y, const at_tensor *r, const at_tensor *x, const at_tensor *w,
                                 const at_tensor *b)
{
    if (y->buf != r->buf || y->offset != r->offset) AT_TRY(at_cast(y, r));
    AT_TRY(at_matmul(y, x, w, 0, 1, 1.0f, 1.0f));
    if (b) AT_TRY(at_add(y, y, b));
    return AT_OK;
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
    AT_TRY(linear(c->qk_norm ? &a->q_raw : &q2, &a->attn_norm, w->wq, w->bq));
    AT_TRY(linear(c->qk_norm ? &a->k_raw : &k2, &a->attn_norm, w->wk, w->bk));
    AT_TRY(linear(&v2, &a->attn_norm, w->wv, w->bv));
    if (c->qk_norm) {
        /* per-head RMSNorm over D, before RoPE (Qwen3) */
        at_tensor qr = flat2(&a->q_raw, N * H, D), kr = flat2(&a->k_raw, N * Hkv, D);
        at_tensor qo = flat2(&a->q, N * H, D), ko = flat2(&a->k, N * Hkv, D);
        AT_TRY(at_rmsnorm_forward(&qo, &a->q_rstd, &qr, w->q_norm, eps));
        AT_TRY(at_rmsnorm_forward(&ko, &a->k_rstd, &kr, w->k_norm, eps));
    }

    /* rotary position embedding, in place */
    AT_TRY(at_rope(&a->q, &a->q, io->pos, io->inv_freq, 0));
    AT_TRY(at_rope(&a->k, &a->k, io->pos, io->inv_freq, 0));

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
    AT_TRY(linear_residual(&y2, &x2, &att2, w->wo, w->bo));
    return AT_OK;
}

at_status at_mlp_block_forward(const at_model_config *c, const at_layer_weights *w, at_layer_acts *a,
                               at_tensor *y, const at_tensor *h)
{
    int64_t N = at_tensor_numel(h) / c->hidden_size;
    at_tensor h2 = flat2(h, N, c->hidden_size), y2 = flat2(y, N, c->hidden_size);
    AT_TRY(at_rmsnorm_forward(&a->ffn_norm, &a->ffn_rstd, &h2, w->ffn_norm, (float)c->rms_norm_eps));
    AT_TRY(linear(&a->gate, &a->ffn_norm, w->w_gate, NULL));
    AT_TRY(linear(&a->up, &a->ffn_norm, w->w_up, NULL));
    AT_TRY(at_swiglu_forward(&a->act, &a->gate, &a->up));
    AT_TRY(linear_residual(&y2, &h2, &a->act, w->w_down, NULL));
    return AT_OK;
}
