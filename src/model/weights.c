#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_backend.h"
#include "device/quant.h"

at_status at_decoder_weights_alloc(const at_model_config *cfg, at_backend *be, at_decoder_weights **out)
{
    *out = NULL;
    if (cfg->num_hidden_layers <= 0)
        return at_error(AT_ERR_INVALID, "decoder weights: num_hidden_layers %d", cfg->num_hidden_layers);
    at_decoder_weights *w = calloc(1, sizeof *w);
    if (!w) return at_error(AT_ERR_NOMEM, "decoder weights: out of memory");
    w->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *w->layers);
    if (!w->layers) {
        free(w);
        return at_error(AT_ERR_NOMEM, "decoder weights: out of memory");
    }
    w->cfg = *cfg;
    w->backend = be ? be : at_cpu_backend();
    *out = w;
    return AT_OK;
}

static void free_layer(at_layer_weights *l)
{
    at_tensor *all[] = {l->attn_norm, l->wq, l->wk, l->wv, l->wo, l->bq, l->bk, l->bv, l->bo,
                        l->q_norm, l->k_norm, l->ffn_norm, l->w_gate, l->w_up, l->w_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) at_tensor_free(all[i]);
}

void at_decoder_weights_free(at_decoder_weights *w)
{
    if (!w) return;
    if (w->layers)
        for (int l = 0; l < w->cfg.num_hidden_layers; l++) free_layer(&w->layers[l]);
    free(w->layers);
    if (w->lm_head != w->embed) at_tensor_free(w->lm_head);
    at_tensor_free(w->embed);
    at_tensor_free(w->final_norm);
    at_tensor_free(w->score);
    if (w->source_close) w->source_close(w->source);
    free(w);
}

/* ---- checking ----------------------------------------------------------- */

/* quant_ok: the layers' linear matrices may be quantized (QLoRA, loader.h) */
static at_status check_one(const at_decoder_weights *w, const at_tensor *t, const char *name, int ndim, int64_t d0,
                           int64_t d1, int quant_ok)
{
    if (!t) return at_error(AT_ERR_NOT_FOUND, "decoder weights: %s is missing", name);
    char d[200];
    int64_t want[2] = {d0, d1};
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        if (ndim == 1)
            return at_error(AT_ERR_FORMAT, "decoder weights: %s is %s, expected [%lld]", name,
                            at_tensor_describe(t, d, sizeof d), (long long)d0);
        return at_error(AT_ERR_FORMAT, "decoder weights: %s is %s, expected [%lld, %lld]", name,
                        at_tensor_describe(t, d, sizeof d), (long long)d0, (long long)d1);
    }
    if (t->dtype != AT_F32 && t->dtype != AT_BF16 && t->dtype != AT_F16 &&
        !(quant_ok && at_dtype_is_quantized(t->dtype) && d1 % at_quant_row_block(t->dtype) == 0))
        return at_error(AT_ERR_UNSUPPORTED, "decoder weights: %s has dtype %s (f32, bf16, f16 supported%s)", name,
                        at_dtype_name(t->dtype), quant_ok ? "; nf4, q8_0, q4_0 with rows of whole blocks" : "");
    if (!t->buf || t->buf->backend != w->backend)
        return at_error(AT_ERR_INVALID, "decoder weights: %s is not on backend %s", name, w->backend->name);
    return AT_OK;
}

static at_status check_absent(const at_tensor *t, const char *name)
{
    if (t) return at_error(AT_ERR_FORMAT, "decoder weights: %s is present but the config does not use it", name);
    return AT_OK;
}

at_status at_decoder_weights_check(const at_decoder_weights *w)
{
    const at_model_config *c = &w->cfg;
    int64_t hd = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, D = c->head_dim;
    int64_t qd = (int64_t)c->num_attention_heads * D, kd = (int64_t)c->num_key_value_heads * D;
    AT_TRY(check_one(w, w->embed, "model.embed_tokens.weight", 2, V, hd, 0));
    AT_TRY(check_one(w, w->final_norm, "model.norm.weight", 1, hd, 0, 0));
    /* a sequence-classification folder has its score head instead of the LM head */
    if (w->score) AT_TRY(check_one(w, w->score, "score.weight", 2, w->score->shape[0], hd, 0));
    if (!w->score || w->lm_head) AT_TRY(check_one(w, w->lm_head, "lm_head.weight", 2, V, hd, 1));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const at_layer_weights *L = &w->layers[l];
        char n[128];
#define CHK(field, label, nd, a, b)                                          \
    do {                                                                     \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, label);               \
        AT_TRY(check_one(w, L->field, n, nd, a, b, (nd) == 2));              \
    } while (0)
#define ABSENT(field, label)                                                 \
    do {                                                                     \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, label);               \
        AT_TRY(check_absent(L->field, n));                                   \
    } while (0)
        CHK(attn_norm, "input_layernorm.weight", 1, hd, 0);
        CHK(wq, "self_attn.q_proj.weight", 2, qd, hd);
        CHK(wk, "self_attn.k_proj.weight", 2, kd, hd);
        CHK(wv, "self_attn.v_proj.weight", 2, kd, hd);
        CHK(wo, "self_attn.o_proj.weight", 2, hd, qd);
        if (c->attn_qkv_bias) {
            CHK(bq, "self_attn.q_proj.bias", 1, qd, 0);
            CHK(bk, "self_attn.k_proj.bias", 1, kd, 0);
            CHK(bv, "self_attn.v_proj.bias", 1, kd, 0);
        } else {
            ABSENT(bq, "self_attn.q_proj.bias");
            ABSENT(bk, "self_attn.k_proj.bias");
            ABSENT(bv, "self_attn.v_proj.bias");
        }
        if (c->attn_o_bias) CHK(bo, "self_attn.o_proj.bias", 1, hd, 0);
        else ABSENT(bo, "self_attn.o_proj.bias");
        if (c->qk_norm) {
            CHK(q_norm, "self_attn.q_norm.weight", 1, D, 0);
            CHK(k_norm, "self_attn.k_norm.weight", 1, D, 0);
        } else {
            ABSENT(q_norm, "self_attn.q_norm.weight");
            ABSENT(k_norm, "self_attn.k_norm.weight");
        }
        CHK(ffn_norm, "post_attention_layernorm.weight", 1, hd, 0);
        CHK(w_gate, "mlp.gate_proj.weight", 2, I, hd);
        CHK(w_up, "mlp.up_proj.weight", 2, I, hd);
        CHK(w_down, "mlp.down_proj.weight", 2, hd, I);
#undef CHK
#undef ABSENT
    }
    return AT_OK;
}

int64_t at_decoder_weights_count(const at_decoder_weights *w)
{
    int64_t n = 0;
    if (w->embed) n += at_tensor_numel(w->embed);
    if (w->final_norm) n += at_tensor_numel(w->final_norm);
    /* a tied lm_head may be a second (quantized) view of the embedding */
    if (w->lm_head && w->lm_head != w->embed && !w->cfg.tie_word_embeddings) n += at_tensor_numel(w->lm_head);
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) {
        const at_layer_weights *L = &w->layers[l];
        const at_tensor *all[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv,
                                  L->bo, L->q_norm, L->k_norm, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) n += at_tensor_numel(all[i]);
    }
    return n;
}

/* ---- random weights ----------------------------------------------------- */

/* splitmix64: a fast generator good enough for benchmark weights. Its state
 * only adds a constant per draw, so draw i after state s is mix(s + (i+1)·γ):
 * the fill below runs in parallel and gives the sequential values. */
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull
static uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A tensor of `dtype` with values center + uniform(-range, range), or
 * center + range·N(0, 1) when normal (Box-Muller: elements 2p and 2p+1 are
 * the cosine and the sine of the pair of draws 2p, 2p+1). Filled on the host
 * in chunks and uploaded, so it works on any backend. */
static at_status random_tensor(at_backend *be, at_dtype dtype, int ndim, const int64_t *shape, const char *name,
                               float center, float range, int normal, uint64_t *seed, at_tensor **out)
{
    AT_TRY(at_tensor_new(be, dtype, ndim, shape, name, out));
    int64_t n = at_tensor_numel(*out);
    size_t esz = at_dtype_bytes(dtype, 1);
    void *host = be->is_host ? at_tensor_data(*out) : malloc((size_t)n * esz);
    if (!host) {
        at_tensor_free(*out);
        *out = NULL;
        return at_error(AT_ERR_NOMEM, "random weights: out of memory for %s", name);
    }
    const uint64_t s0 = *seed;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float x;
        if (normal) {
            uint64_t j = (uint64_t)i & ~(uint64_t)1;
            float u1 = (float)(splitmix_mix(s0 + (j + 1) * SPLITMIX_GAMMA) >> 40) * 0x1p-24f; /* [0, 1) */
            float u2 = (float)(splitmix_mix(s0 + (j + 2) * SPLITMIX_GAMMA) >> 40) * 0x1p-24f;
            float rad = sqrtf(-2.0f * logf(1.0f - u1)), ang = 6.2831853f * u2; /* 1 - u1 in (0, 1] */
            x = center + range * rad * (i & 1 ? sinf(ang) : cosf(ang));
        } else {
            double u = (double)(splitmix_mix(s0 + (uint64_t)(i + 1) * SPLITMIX_GAMMA) >> 11) * (1.0 / 9007199254740992.0);
            x = center + range * (2.0f * (float)u - 1.0f);
        }
        if (dtype == AT_F32) ((float *)host)[i] = x;
        else if (dtype == AT_BF16) ((uint16_t *)host)[i] = at_f32_to_bf16(x);
        else ((uint16_t *)host)[i] = at_f32_to_f16(x);
    }
    *seed = s0 + (uint64_t)(normal ? (n + 1) / 2 * 2 : n) * SPLITMIX_GAMMA;
    at_status st = AT_OK;
    if (!be->is_host) {
        st = at_tensor_upload(*out, host, (size_t)n * esz);
        free(host);
    }
    if (st != AT_OK) {
        at_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

/* std > 0: Hugging Face's initialisation (normal(0, std) matrices and
 * embeddings, zero biases); std 0: at_decoder_weights_random's. */
static at_status random_weights(const at_model_config *cfg, at_backend *be, at_dtype dtype, uint64_t seed, float std,
                                at_decoder_weights **out)
{
    *out = NULL;
    if (dtype != AT_F32 && dtype != AT_BF16 && dtype != AT_F16)
        return at_error(AT_ERR_INVALID, "random weights: dtype %s (f32, bf16, f16)", at_dtype_name(dtype));
    at_decoder_weights *w;
    AT_TRY(at_decoder_weights_alloc(cfg, be, &w));
    be = w->backend;
    at_status st = AT_OK;
    const at_model_config *c = cfg;
    int64_t hd = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, D = c->head_dim;
    int64_t qd = (int64_t)c->num_attention_heads * D, kd = (int64_t)c->num_key_value_heads * D;
    uint64_t s = seed;
    char n[128];
#define MAT(dst, label, rows, cols)                                                              \
    do {                                                                                         \
        int64_t sh_[2] = {rows, cols};                                                           \
        AT_CHECK(random_tensor(be, dtype, 2, sh_, label, 0.0f, std > 0 ? std : sqrtf(3.0f / (float)(cols)), std > 0, \
                               &s, &(dst)));                                                    \
    } while (0)
#define VEC(dst, label, len, center, range)                                                      \
    do {                                                                                         \
        int64_t sh_[1] = {len};                                                                  \
        AT_CHECK(random_tensor(be, AT_F32, 1, sh_, label, center, std > 0 ? 0.0f : (range), 0, &s, &(dst))); \
    } while (0)
    {
        int64_t sh[2] = {V, hd};
        AT_CHECK(random_tensor(be, dtype, 2, sh, "model.embed_tokens.weight", 0.0f, std > 0 ? std : 1.0f, std > 0, &s,
                               &w->embed));
    }
    VEC(w->final_norm, "model.norm.weight", hd, 1.0f, 0.0f);
    if (c->tie_word_embeddings) w->lm_head = w->embed;
    else MAT(w->lm_head, "lm_head.weight", V, hd);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        at_layer_weights *L = &w->layers[l];
#define NAME(label) (snprintf(n, sizeof n, "model.layers.%d.%s", l, label), n)
        VEC(L->attn_norm, NAME("input_layernorm.weight"), hd, 1.0f, 0.0f);
        MAT(L->wq, NAME("self_attn.q_proj.weight"), qd, hd);
        MAT(L->wk, NAME("self_attn.k_proj.weight"), kd, hd);
        MAT(L->wv, NAME("self_attn.v_proj.weight"), kd, hd);
        MAT(L->wo, NAME("self_attn.o_proj.weight"), hd, qd);
        if (c->attn_qkv_bias) {
            VEC(L->bq, NAME("self_attn.q_proj.bias"), qd, 0.0f, 0.1f);
            VEC(L->bk, NAME("self_attn.k_proj.bias"), kd, 0.0f, 0.1f);
            VEC(L->bv, NAME("self_attn.v_proj.bias"), kd, 0.0f, 0.1f);
        }
        if (c->attn_o_bias) VEC(L->bo, NAME("self_attn.o_proj.bias"), hd, 0.0f, 0.1f);
        if (c->qk_norm) {
            VEC(L->q_norm, NAME("self_attn.q_norm.weight"), D, 1.0f, 0.0f);
            VEC(L->k_norm, NAME("self_attn.k_norm.weight"), D, 1.0f, 0.0f);
        }
        VEC(L->ffn_norm, NAME("post_attention_layernorm.weight"), hd, 1.0f, 0.0f);
        MAT(L->w_gate, NAME("mlp.gate_proj.weight"), I, hd);
        MAT(L->w_up, NAME("mlp.up_proj.weight"), I, hd);
        MAT(L->w_down, NAME("mlp.down_proj.weight"), hd, I);
#undef NAME
    }
#undef MAT
#undef VEC
done:
    if (st != AT_OK) {
        at_decoder_weights_free(w);
        return st;
    }
    *out = w;
    return AT_OK;
}

at_status at_decoder_weights_random(const at_model_config *cfg, at_backend *be, at_dtype dtype, uint64_t seed,
                                    at_decoder_weights **out)
{
    return random_weights(cfg, be, dtype, seed, 0.0f, out);
}

at_status at_decoder_weights_random_hf(const at_model_config *cfg, at_backend *be, at_dtype dtype, uint64_t seed,
                                       float std, at_decoder_weights **out)
{
    if (!(std > 0)) return at_error(AT_ERR_INVALID, "random weights: initializer_range %g (must be > 0)", (double)std);
    return random_weights(cfg, be, dtype, seed, std, out);
}
