#include "model/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/qk_permute.h"
#include "model/safetensors.h"
#include "ops/ops.h"

at_load_options at_load_options_default(void)
{
    at_load_options o = {NULL, AT_LOAD_KEEP_DTYPE, 0};
    return o;
}

/* ---- one interface over the three sources ------------------------------- */

typedef enum { SRC_HF, SRC_GGUF, SRC_LLAMA2C } src_kind;

typedef struct {
    src_kind kind;
    const char *path;
    at_st_model *st;
    at_gguf *gg;
    at_llama2c *l2;
    int gguf_interleaved; /* GGUF llama: q/k rows must go back to the halves order */
} source;

static void source_close(void *p)
{
    source *s = p;
    if (!s) return;
    at_st_model_close(s->st);
    at_gguf_close(s->gg);
    at_llama2c_close(s->l2);
    free(s);
}

static int is_float(at_dtype t) { return t == AT_F32 || t == AT_BF16 || t == AT_F16; }

/* Tensor `hf_name` as a host tensor we own (possibly a zero-copy view of the
 * mapping), converted to `want` (AT_LOAD_KEEP_DTYPE: stored dtype, quantized
 * dequantized to bf16). *out = NULL and AT_OK when absent and optional. */
static at_status source_get(source *s, const char *hf_name, at_dtype want, int optional, at_tensor **out)
{
    *out = NULL;
    if (s->kind == SRC_HF) {
        const at_st_info *info = at_st_model_find(s->st, hf_name);
        if (!info) {
            if (optional) return AT_OK;
            return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s is missing", s->path, hf_name);
        }
        if (!info->has_dtype || !is_float(info->dtype))
            return at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (F32, BF16, F16 supported)", s->path,
                            hf_name, info->dtype_name);
        return at_st_tensor(info, want == AT_LOAD_KEEP_DTYPE ? AT_ST_KEEP_DTYPE : want, out);
    }
    if (s->kind == SRC_GGUF) {
        char gname[160];
        if (!at_gguf_name_from_hf(hf_name, gname, sizeof gname))
            return at_error(AT_ERR_INTERNAL, "%s: no GGUF name for %s", s->path, hf_name);
        const at_gguf_tensor_info *info = at_gguf_find_tensor(s->gg, gname);
        if (!info) {
            if (optional) return AT_OK;
            return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s (%s) is missing", s->path, gname, hf_name);
        }
        int stored = at_ggml_to_dtype(info->type);
        if (stored < 0)
            return at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s has type %s (F32, F16, BF16, Q8_0, Q4_0 supported)",
                            s->path, gname, at_ggml_type_name(info->type));
        at_dtype w = want;
        if (w == AT_LOAD_KEEP_DTYPE) w = is_float((at_dtype)stored) ? (at_dtype)stored : AT_BF16;
        AT_TRY(at_gguf_tensor(s->gg, info, w, out));
        at_tensor_set_name(*out, hf_name);
        return AT_OK;
    }
    /* llama2.c: f32 views owned by the reader; we take a view of our own */
    const at_tensor *t = at_llama2c_find(s->l2, hf_name);
    if (!t) {
        if (optional) return AT_OK;
        return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s is missing", s->path, hf_name);
    }
    at_tensor *v;
    AT_TRY(at_tensor_view(t, 0, t->ndim, t->shape, hf_name, &v));
    if (want == AT_LOAD_KEEP_DTYPE || want == v->dtype) {
        *out = v;
        return AT_OK;
    }
    at_tensor *c;
    at_status st = at_tensor_new(at_cpu_backend(), want, v->ndim, v->shape, hf_name, &c);
    if (st == AT_OK) st = at_cast(c, v);
    at_tensor_free(v);
    if (st != AT_OK) {
        at_tensor_free(c);
        return st;
    }
    *out = c;
    return AT_OK;
}

/* Moves a host tensor onto backend `be` (no-op for the CPU unless it must be
 * writable and is a view of a mapped file). Frees t when it is replaced. */
static at_status place(at_backend *be, int writable, at_tensor **t)
{
    if (!*t || ((*t)->buf->backend == be && !(writable && (*t)->buf->external))) return AT_OK;
    at_tensor *d;
    AT_TRY(at_tensor_new(be, (*t)->dtype, (*t)->ndim, (*t)->shape, (*t)->name, &d));
    at_status st = at_tensor_upload(d, at_tensor_data(*t), at_tensor_nbytes(*t));
    if (st != AT_OK) {
        at_tensor_free(d);
        return st;
    }
    at_tensor_free(*t);
    *t = d;
    return AT_OK;
}

/* GGUF llama q/k: rows back from the interleaved to the halves order, into a
 * new tensor (the mapped one is read-only). */
static at_status unpermute(at_tensor **t, int n_heads, const char *path)
{
    if (!*t) return AT_OK;
    at_tensor *c;
    AT_TRY(at_tensor_new(at_cpu_backend(), (*t)->dtype, (*t)->ndim, (*t)->shape, (*t)->name, &c));
    int64_t rows = (*t)->shape[0];
    size_t row_bytes = at_tensor_nbytes(*t) / (size_t)rows;
    at_status st = at_qk_permute_rows(at_tensor_data(c), at_tensor_data(*t), rows, row_bytes, n_heads,
                                      AT_QK_TO_HALVES, path);
    if (st != AT_OK) {
        at_tensor_free(c);
        return st;
    }
    at_tensor_free(*t);
    *t = c;
    return AT_OK;
}

/* ---- finding what the path is ------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static at_status open_source(const char *path, source *s, at_model_config *cfg)
{
    s->path = path;
    if (at_is_dir(path) || ends_with(path, ".safetensors") || ends_with(path, ".index.json")) {
        s->kind = SRC_HF;
        char *folder = NULL;
        if (at_is_dir(path)) {
            folder = strdup(path);
        } else {
            folder = strdup(path);
            char *slash = folder ? strrchr(folder, '/') : NULL;
            if (slash) *slash = 0;
            else if (folder) strcpy(folder, ".");
        }
        if (!folder) return at_error(AT_ERR_NOMEM, "loader: out of memory");
        at_status st = at_model_config_load(folder, cfg);
        free(folder);
        AT_TRY(st);
        return at_st_model_open(path, &s->st);
    }
    /* a file: GGUF by its magic, else a llama2.c checkpoint */
    FILE *f = fopen(path, "rb");
    if (!f) return at_error(AT_ERR_IO, "%s: cannot open", path);
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        s->kind = SRC_GGUF;
        AT_TRY(at_gguf_open(path, &s->gg));
        AT_TRY(at_model_config_from_gguf(s->gg, path, cfg));
        s->gguf_interleaved = at_gguf_qk_interleaved(s->gg);
        return AT_OK;
    }
    s->kind = SRC_LLAMA2C;
    AT_TRY(at_llama2c_open(path, &s->l2));
    *cfg = *at_llama2c_config(s->l2);
    return AT_OK;
}

/* ---- loading ------------------------------------------------------------ */

at_status at_decoder_weights_load(const char *path, const at_load_options *opt, at_decoder_weights **out)
{
    *out = NULL;
    at_load_options o = opt ? *opt : at_load_options_default();
    if (o.dtype != AT_LOAD_KEEP_DTYPE && !is_float(o.dtype))
        return at_error(AT_ERR_INVALID, "loader: dtype %s (keep, f32, bf16 or f16)", at_dtype_name(o.dtype));
    at_backend *be = o.backend ? o.backend : at_cpu_backend();
    source *s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "loader: out of memory");
    at_model_config cfg;
    at_decoder_weights *w = NULL;
    at_status st = AT_OK;
    AT_CHECK(open_source(path, s, &cfg));
    AT_CHECK(at_decoder_weights_alloc(&cfg, be, &w));
    w->source = s;
    w->source_close = source_close;
    s = NULL; /* owned by w now */
    source *src = w->source;
    at_dtype mat = o.dtype; /* matrices and embeddings */

#define GET(slot, name, dtype, optional)                          \
    do {                                                          \
        AT_CHECK(source_get(src, name, dtype, optional, &(slot))); \
    } while (0)
    GET(w->embed, "model.embed_tokens.weight", mat, 0);
    GET(w->final_norm, "model.norm.weight", AT_F32, 0);
    if (!cfg.tie_word_embeddings) GET(w->lm_head, "lm_head.weight", mat, 0);
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
        at_layer_weights *L = &w->layers[l];
        char n[160];
#define NAME(label) (snprintf(n, sizeof n, "model.layers.%d.%s", l, label), n)
        GET(L->attn_norm, NAME("input_layernorm.weight"), AT_F32, 0);
        GET(L->wq, NAME("self_attn.q_proj.weight"), mat, 0);
        GET(L->wk, NAME("self_attn.k_proj.weight"), mat, 0);
        GET(L->wv, NAME("self_attn.v_proj.weight"), mat, 0);
        GET(L->wo, NAME("self_attn.o_proj.weight"), mat, 0);
        if (cfg.attn_qkv_bias) {
            GET(L->bq, NAME("self_attn.q_proj.bias"), AT_F32, 0);
            GET(L->bk, NAME("self_attn.k_proj.bias"), AT_F32, 0);
            GET(L->bv, NAME("self_attn.v_proj.bias"), AT_F32, 0);
        }
        if (cfg.attn_o_bias) GET(L->bo, NAME("self_attn.o_proj.bias"), AT_F32, 0);
        if (cfg.qk_norm) {
            GET(L->q_norm, NAME("self_attn.q_norm.weight"), AT_F32, 0);
            GET(L->k_norm, NAME("self_attn.k_norm.weight"), AT_F32, 0);
        }
        GET(L->ffn_norm, NAME("post_attention_layernorm.weight"), AT_F32, 0);
        GET(L->w_gate, NAME("mlp.gate_proj.weight"), mat, 0);
        GET(L->w_up, NAME("mlp.up_proj.weight"), mat, 0);
        GET(L->w_down, NAME("mlp.down_proj.weight"), mat, 0);
#undef NAME
        if (src->kind == SRC_GGUF && src->gguf_interleaved) {
            AT_CHECK(unpermute(&L->wq, cfg.num_attention_heads, path));
            AT_CHECK(unpermute(&L->bq, cfg.num_attention_heads, path));
            AT_CHECK(unpermute(&L->wk, cfg.num_key_value_heads, path));
            AT_CHECK(unpermute(&L->bk, cfg.num_key_value_heads, path));
        }
        at_tensor **all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk, &L->bv, &L->bo,
                             &L->q_norm, &L->k_norm, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) AT_CHECK(place(be, o.writable, all[i]));
    }
#undef GET
    AT_CHECK(place(be, o.writable, &w->embed));
    AT_CHECK(place(be, o.writable, &w->final_norm));
    AT_CHECK(place(be, o.writable, &w->lm_head));
    if (cfg.tie_word_embeddings) w->lm_head = w->embed;
    st = at_decoder_weights_check(w);
    if (st != AT_OK) at_error_wrap(st, "%s", path);
done:
    source_close(s);
    if (st != AT_OK) {
        at_decoder_weights_free(w);
        return st;
    }
    *out = w;
    return AT_OK;
}

at_status at_decoder_load(const char *path, const at_load_options *opt, at_decoder **out)
{
    *out = NULL;
    at_decoder_weights *w;
    AT_TRY(at_decoder_weights_load(path, opt, &w));
    at_status st = at_decoder_new(w, out);
    if (st != AT_OK) at_decoder_weights_free(w);
    return st;
}
