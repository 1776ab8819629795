/* GGUF model and adapter files for llama.cpp (export_gguf.h). */
#include "export/export_gguf.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/progress.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_hf.h"
#include "export/export_quant.h"
#include "model/qk_permute.h"
#include "ops/ops.h"
#include "text/tokenizer_export.h"

const char *at_export_gguf_arch(const at_model_config *cfg)
{
    const char *t = cfg->model_type;
    if (!strcmp(t, "llama") || !strcmp(t, "mistral")) return "llama";
    if (!strcmp(t, "qwen2")) return at_model_config_mrope(cfg) ? "qwen2vl" : "qwen2";
    if (!strcmp(t, "qwen3")) return "qwen3";
    return NULL;
}

at_status at_export_parse_quant(const char *s, at_dtype *out)
{
    char l[16] = {0};
    for (int i = 0; s && s[i] && i < 15; i++) l[i] = (char)tolower((unsigned char)s[i]);
    if (!strcmp(l, "f32") || !strcmp(l, "float32")) *out = AT_F32;
    else if (!strcmp(l, "f16") || !strcmp(l, "float16")) *out = AT_F16;
    else if (!strcmp(l, "bf16") || !strcmp(l, "bfloat16")) *out = AT_BF16;
    else if (!strcmp(l, "q8_0")) *out = AT_Q8_0;
    else if (!strcmp(l, "q4_0")) *out = AT_Q4_0;
    else return at_error(AT_ERR_INVALID, "--quant \"%s\": expected f32, f16, bf16, q8_0 or q4_0", s ? s : "");
    return AT_OK;
}

uint32_t at_export_gguf_file_type(at_dtype t)
{
    switch (t) {
    case AT_F32: return 0;
    case AT_F16: return 1;
    case AT_Q4_0: return 2;
    case AT_Q8_0: return 7;
    default: return 32; /* BF16 */
    }
}

/* ---- tensors kept alive until the file is written ----------------------- */

typedef struct {
    at_gguf_writer *w;
    at_tensor **owned;
    size_t n_owned, cap_owned;
    const at_decoder_weights *weights;
    const char *arch;
    at_dtype quant;
    at_progress *bar;
    int64_t done;
    int n_fallback;
} gguf_job;

static at_status keep(gguf_job *j, at_tensor *t)
{
    if (j->n_owned == j->cap_owned) {
        size_t c = j->cap_owned ? j->cap_owned * 2 : 64;
        at_tensor **p = realloc(j->owned, c * sizeof *p);
        if (!p) {
            at_tensor_free(t);
            return at_error(AT_ERR_NOMEM, "export: out of memory");
        }
        j->owned = p;
        j->cap_owned = c;
    }
    j->owned[j->n_owned++] = t;
    return AT_OK;
}

/* A new host copy of t converted to dtype (f32/bf16/f16), kept by j. */
static at_status host_copy(gguf_job *j, const at_tensor *t, at_dtype dtype, at_tensor **out)
{
    at_tensor *c = NULL, *h = NULL;
    at_status st;
    if (t->dtype != AT_F32 && t->dtype != AT_BF16 && t->dtype != AT_F16)
        return at_error(AT_ERR_UNSUPPORTED, "export: %s is %s; GGUF export reads f32, bf16 or f16 weights", t->name,
                        at_dtype_name(t->dtype));
    AT_CHECK(at_tensor_new(at_cpu_backend(), dtype, t->ndim, t->shape, t->name, &c));
    if (!at_tensor_data(t)) {
        AT_CHECK(at_tensor_new(at_cpu_backend(), t->dtype, t->ndim, t->shape, t->name, &h));
        AT_CHECK(at_tensor_download(t, at_tensor_data(h), at_tensor_nbytes(h)));
    }
    AT_CHECK(at_cast(c, h ? h : t));
    st = keep(j, c);
    c = NULL;
    if (st == AT_OK) *out = j->owned[j->n_owned - 1];
done:
    at_tensor_free(c);
    at_tensor_free(h);
    return st;
}

at_dtype at_export_gguf_tensor_type(const at_tensor *t, at_dtype q)
{
    if (t->ndim == 1) return AT_F32;
    if ((q == AT_Q8_0 || q == AT_Q4_0) && at_tensor_cols(t) % 32 != 0) return AT_F16;
    return q;
}

at_status at_export_gguf_convert(const at_tensor *t, at_dtype type, at_tensor **out)
{
    *out = NULL;
    int quantized = type == AT_Q8_0 || type == AT_Q4_0;
    gguf_job j = {0};
    at_tensor *c = NULL;
    at_status st = host_copy(&j, t, quantized ? AT_F32 : type, &c);
    if (st == AT_OK && quantized) {
        st = at_export_quantize(c, type, out);
    } else if (st == AT_OK) {
        *out = c;
        j.n_owned = 0; /* handed over */
    }
    for (size_t i = 0; i < j.n_owned; i++) at_tensor_free(j.owned[i]);
    free(j.owned);
    return st;
}

static int is_q(const char *name)
{
    const char *s = strstr(name, ".self_attn.");
    return s && (!strncmp(s + 11, "q_proj.", 7));
}

static int is_k(const char *name)
{
    const char *s = strstr(name, ".self_attn.");
    return s && (!strncmp(s + 11, "k_proj.", 7));
}

/* One tensor: GGUF name, type (1-D f32; matrices j->quant or the F16
 * fallback), q/k permutation for arch llama. */
static at_status add_model_tensor(void *ctx, const char *hf_name, const at_tensor *t)
{
    gguf_job *j = ctx;
    char name[160];
    if (!at_gguf_name_from_hf(hf_name, name, sizeof name))
        return at_error(AT_ERR_INTERNAL, "export: %s has no GGUF name", hf_name);
    int permute = !strcmp(j->arch, "llama") && (is_q(hf_name) || is_k(hf_name));
    int heads = is_q(hf_name) ? j->weights->cfg.num_attention_heads : j->weights->cfg.num_key_value_heads;
    at_dtype want = at_export_gguf_tensor_type(t, j->quant);
    int quantized = want == AT_Q8_0 || want == AT_Q4_0;
    if (t->ndim > 1 && want != j->quant) {
        at_log_debug("export: %s: rows of %lld values are not a multiple of 32: written F16", name,
                    (long long)at_tensor_cols(t));
        j->n_fallback++;
    }
    const at_tensor *src = t;
    at_dtype stage = quantized ? AT_F32 : want;
    if (permute || t->dtype != stage || !at_tensor_data(t)) {
        at_tensor *c;
        AT_TRY(host_copy(j, t, stage, &c));
        if (permute) AT_TRY(at_qk_permute_tensor(c, heads, AT_QK_TO_INTERLEAVED));
        src = c;
    }
    if (quantized) {
        at_tensor *q = NULL;
        AT_TRY(at_export_quantize(src, want, &q));
        AT_TRY(keep(j, q));
        src = q;
    }
    AT_TRY(at_gguf_add_at_tensor(j->w, name, src));
    j->done++;
    if (j->bar) at_progress_update(j->bar, j->done, name);
    return AT_OK;
}

/* ---- metadata ------------------------------------------------------------- */

static at_status add_u32k(at_gguf_writer *w, const char *arch, const char *key, int64_t v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (v < 0 || v > 0xffffffffLL) return at_error(AT_ERR_INVALID, "export: %s = %lld does not fit", k, (long long)v);
    return at_gguf_add_u32(w, k, (uint32_t)v);
}

static at_status add_f32k(at_gguf_writer *w, const char *arch, const char *key, double v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return at_gguf_add_f32(w, k, (float)v);
}

static at_status add_hparams(at_gguf_writer *w, const char *arch, const at_model_config *c)
{
    int64_t ctx = c->max_position_embeddings > 0 ? c->max_position_embeddings : 2048;
    if (c->max_position_embeddings <= 0) at_log_warn("export: the model does not say its context length: 2048 written");
    AT_TRY(add_u32k(w, arch, "vocab_size", c->vocab_size));
    AT_TRY(add_u32k(w, arch, "context_length", ctx));
    AT_TRY(add_u32k(w, arch, "embedding_length", c->hidden_size));
    AT_TRY(add_u32k(w, arch, "block_count", c->num_hidden_layers));
    AT_TRY(add_u32k(w, arch, "feed_forward_length", c->intermediate_size));
    AT_TRY(add_u32k(w, arch, "attention.head_count", c->num_attention_heads));
    AT_TRY(add_u32k(w, arch, "attention.head_count_kv", c->num_key_value_heads));
    AT_TRY(add_u32k(w, arch, "rope.dimension_count", c->head_dim));
    if (c->head_dim * c->num_attention_heads != c->hidden_size || !strcmp(arch, "qwen3")) {
        AT_TRY(add_u32k(w, arch, "attention.key_length", c->head_dim));
        AT_TRY(add_u32k(w, arch, "attention.value_length", c->head_dim));
    }
    AT_TRY(add_f32k(w, arch, "rope.freq_base", c->rope_theta));
    AT_TRY(add_f32k(w, arch, "attention.layer_norm_rms_epsilon", c->rms_norm_eps));
    if (at_model_config_mrope(c)) { /* llama.cpp's four sections: t, h, w and a fourth (0) */
        int32_t sec[4] = {c->mrope_section[0], c->mrope_section[1], c->mrope_section[2], 0};
        char k[128];
        snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
        AT_TRY(at_gguf_add_array(w, k, AT_GGUF_INT32, sec, 4));
    }
    if (c->rope_type == AT_ROPE_LINEAR) {
        char k[128];
        snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
        AT_TRY(at_gguf_add_string(w, k, "linear"));
        AT_TRY(add_f32k(w, arch, "rope.scaling.factor", c->rope_factor));
    }
    return AT_OK;
}

/* Llama 3.1 RoPE scaling as llama.cpp stores it (LlamaModel.generate_extra_tensors):
 * rope_freqs[k] = the divisor of pair k's default frequency, i.e.
 * inv_freq_default[k] / inv_freq_llama3[k]. */
static at_status add_rope_freqs(gguf_job *j, const at_model_config *c)
{
    int half = c->head_dim / 2;
    at_model_config plain = *c;
    plain.rope_type = AT_ROPE_DEFAULT;
    float *def = malloc((size_t)half * sizeof *def), *scaled = malloc((size_t)half * sizeof *scaled);
    at_tensor *t = NULL;
    at_status st;
    if (!def || !scaled) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    AT_CHECK(at_model_config_rope_inv_freq(&plain, def));
    AT_CHECK(at_model_config_rope_inv_freq(c, scaled));
    int64_t shape[1] = {half};
    AT_CHECK(at_tensor_new(at_cpu_backend(), AT_F32, 1, shape, "rope_freqs.weight", &t));
    float *f = at_tensor_data(t);
    for (int k = 0; k < half; k++) f[k] = def[k] / scaled[k];
    st = keep(j, t);
    t = NULL;
    if (st == AT_OK) st = at_gguf_add_at_tensor(j->w, "rope_freqs.weight", j->owned[j->n_owned - 1]);
done:
    free(def);
    free(scaled);
    at_tensor_free(t);
    return st;
}

/* tokenizer.ggml.* from a tokenizer, its vocabulary padded to n_vocab. */
static at_status add_tokenizer(at_gguf_writer *w, const at_tokenizer *tok, int64_t n_vocab)
{
    at_tokenizer_gguf *g = NULL;
    at_status st;
    char **tokens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    AT_TRY(at_tokenizer_to_gguf(tok, &g));
    size_t n = g->n_tokens;
    if ((int64_t)n > n_vocab) {
        st = at_error(AT_ERR_INVALID,
                      "export: the tokenizer has %zu tokens but the model's vocabulary is %lld: llama.cpp refuses such "
                      "a file",
                      n, (long long)n_vocab);
        goto done;
    }
    size_t nv = (size_t)n_vocab;
    tokens = calloc(nv, sizeof *tokens);
    types = calloc(nv, sizeof *types);
    scores = g->scores ? calloc(nv, sizeof *scores) : NULL;
    if (!tokens || !types || (g->scores && !scores)) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    for (size_t i = 0; i < nv; i++) {
        if (i < n) {
            tokens[i] = g->tokens[i];
            types[i] = g->token_types[i];
            if (scores) scores[i] = g->scores[i];
        } else { /* llama.cpp's converter pads the same way */
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%zu]", i);
            if (!(tokens[i] = strdup(pad))) {
                st = at_error(AT_ERR_NOMEM, "export: out of memory");
                goto done;
            }
            types[i] = AT_TOKTYPE_UNUSED;
            if (scores) scores[i] = -1000.0f;
        }
    }
    if (nv > n)
        at_log_info("export: tokenizer has %zu tokens, model vocabulary %zu: padded with [PAD] tokens", n, nv);
    AT_CHECK(at_gguf_add_string(w, "tokenizer.ggml.model", g->model));
    if (g->pre[0]) AT_CHECK(at_gguf_add_string(w, "tokenizer.ggml.pre", g->pre));
    AT_CHECK(at_gguf_add_string_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens, nv));
    if (scores) AT_CHECK(at_gguf_add_array(w, "tokenizer.ggml.scores", AT_GGUF_FLOAT32, scores, nv));
    AT_CHECK(at_gguf_add_array(w, "tokenizer.ggml.token_type", AT_GGUF_INT32, types, nv));
    if (!strcmp(g->model, "gpt2"))
        AT_CHECK(at_gguf_add_string_array(w, "tokenizer.ggml.merges", (const char *const *)g->merges, g->n_merges));
    if (g->bos_id >= 0) AT_CHECK(at_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)g->bos_id));
    if (g->eos_id >= 0) AT_CHECK(at_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)g->eos_id));
    if (g->unk_id >= 0) AT_CHECK(at_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)g->unk_id));
    if (g->pad_id >= 0) AT_CHECK(at_gguf_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)g->pad_id));
    AT_CHECK(at_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", g->add_bos));
    AT_CHECK(at_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", g->add_eos));
    if (!strcmp(g->model, "llama"))
        AT_CHECK(at_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", g->add_space_prefix));
done:
    for (size_t i = n; tokens && i < (size_t)(n_vocab > 0 ? n_vocab : 0); i++) free(tokens[i]);
    free(tokens);
    free(types);
    free(scores);
    at_tokenizer_gguf_free(g);
    return st;
}

static at_status copy_tokenizer_keys(at_gguf_writer *w, const at_gguf *src, int with_template)
{
    for (size_t i = 0; i < at_gguf_kv_count(src); i++) {
        const char *k = at_gguf_kv_key(src, i);
        if (strncmp(k, "tokenizer.", 10) != 0) continue;
        if (!with_template && !strcmp(k, "tokenizer.chat_template")) continue;
        AT_TRY(at_gguf_add_value(w, k, at_gguf_kv_value(src, i)));
    }
    return AT_OK;
}

static at_status count_tensor(void *ctx, const char *name, const at_tensor *t)
{
    (void)name;
    (void)t;
    ++*(int64_t *)ctx;
    return AT_OK;
}

at_status at_export_gguf_model(const at_decoder_weights *wts, const char *path, const at_export_gguf_opts *o)
{
    at_export_gguf_opts def = {.quant = AT_DTYPE_COUNT};
    if (!o) o = &def;
    if (!wts) return at_error(AT_ERR_INVALID, "export: no weights");
    const at_model_config *c = &wts->cfg;
    const char *arch = at_export_gguf_arch(c);
    if (!arch)
        return at_error(AT_ERR_UNSUPPORTED, "export: model_type \"%s\" has no llama.cpp architecture", c->model_type);
    at_dtype q = o->quant;
    if (q == AT_DTYPE_COUNT) {
        q = c->has_dtype ? c->dtype : wts->layers[0].wq->dtype;
        if (q != AT_BF16 && q != AT_F16) q = AT_F32;
    }
    if (q != AT_F32 && q != AT_F16 && q != AT_BF16 && q != AT_Q8_0 && q != AT_Q4_0)
        return at_error(AT_ERR_INVALID, "export: GGUF type %s is not one of f32, f16, bf16, q8_0, q4_0", at_dtype_name(q));
    gguf_job j = {.weights = wts, .arch = arch, .quant = q};
    at_progress bar;
    at_status st;
    AT_CHECK(at_gguf_writer_new(&j.w));
    AT_CHECK(at_gguf_add_string(j.w, "general.architecture", arch));
    AT_CHECK(at_gguf_add_string(j.w, "general.type", "model"));
    AT_CHECK(at_gguf_add_string(j.w, "general.name", o->name ? o->name : "anytune export"));
    AT_CHECK(at_gguf_add_u32(j.w, "general.file_type", at_export_gguf_file_type(q)));
    if (q == AT_Q8_0 || q == AT_Q4_0) AT_CHECK(at_gguf_add_u32(j.w, "general.quantization_version", 2));
    AT_CHECK(add_hparams(j.w, arch, c));
    if (o->tok) AT_CHECK(add_tokenizer(j.w, o->tok, c->vocab_size));
    else if (o->tok_gguf) AT_CHECK(copy_tokenizer_keys(j.w, o->tok_gguf, o->chat_template == NULL));
    else at_log_warn("export: no tokenizer to embed in %s: llama.cpp needs one to run the model", path);
    if (o->chat_template) AT_CHECK(at_gguf_add_string(j.w, "tokenizer.chat_template", o->chat_template));

    if (c->rope_type == AT_ROPE_LLAMA3 || c->rope_type == AT_ROPE_FACTORS) {
        if (strcmp(arch, "llama") != 0) {
            st = at_error(AT_ERR_UNSUPPORTED, "export: llama3 RoPE scaling on arch %s has no GGUF form", arch);
            goto done;
        }
        AT_CHECK(add_rope_freqs(&j, c));
    }
    int64_t n_tensors = 0;
    AT_CHECK(at_export_each_hf_tensor(wts, count_tensor, &n_tensors));
    if (o->progress) {
        at_progress_start(&bar, "export gguf", n_tensors, NULL);
        j.bar = &bar;
    }
    AT_CHECK(at_export_each_hf_tensor(wts, add_model_tensor, &j));
    if (j.n_fallback)
        at_log_warn("export: %d matri%s written F16: rows not a multiple of 32 cannot be %s", j.n_fallback,
                    j.n_fallback == 1 ? "x" : "ces", at_dtype_name(q));
    AT_CHECK(at_gguf_write(j.w, path));
    if (j.bar) at_progress_finish(j.bar, NULL);
done:
    at_gguf_writer_free(j.w);
    for (size_t i = 0; i < j.n_owned; i++) at_tensor_free(j.owned[i]);
    free(j.owned);
    return st;
}

at_status at_export_gguf_adapter(const at_adapter *a, const at_model_config *cfg, const char *path, at_dtype dtype)
{
    if (!a || !cfg) return at_error(AT_ERR_INVALID, "export: no adapter");
    const char *arch = at_export_gguf_arch(cfg);
    if (!arch)
        return at_error(AT_ERR_UNSUPPORTED, "export: model_type \"%s\" has no llama.cpp architecture", cfg->model_type);
    if (dtype != AT_F32 && dtype != AT_F16 && dtype != AT_BF16)
        return at_error(AT_ERR_INVALID, "export: a LoRA GGUF takes f32, f16 or bf16, not %s (lora_b rows are only r = "
                        "%d values long)", at_dtype_name(dtype), a->rank);
    if (a->n_layers != cfg->num_hidden_layers)
        return at_error(AT_ERR_INVALID, "export: the adapter has %d layers, the model %d", a->n_layers,
                        cfg->num_hidden_layers);
    gguf_job j = {.arch = arch, .quant = dtype};
    at_status st;
    AT_CHECK(at_gguf_writer_new(&j.w));
    AT_CHECK(at_gguf_add_string(j.w, "general.architecture", arch));
    AT_CHECK(at_gguf_add_string(j.w, "general.type", "adapter"));
    AT_CHECK(at_gguf_add_string(j.w, "general.name", "anytune LoRA"));
    AT_CHECK(at_gguf_add_string(j.w, "adapter.type", "lora"));
    /* llama.cpp applies alpha / rank (rank = lora_b's ne[0]). */
    AT_CHECK(at_gguf_add_f32(j.w, "adapter.lora.alpha", (float)(a->scale * a->rank)));
    for (int l = 0; l < a->n_layers; l++) {
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            const at_lora_pair *p = &a->mods[l * AT_MOD_COUNT + m];
            if (!p->A || !p->B) continue;
            char hf[160], base[160], name[200];
            snprintf(hf, sizeof hf, "model.layers.%d.%s.%s.weight", l, at_module_parent((at_module)m),
                     at_module_name((at_module)m));
            if (!at_gguf_name_from_hf(hf, base, sizeof base)) {
                st = at_error(AT_ERR_INTERNAL, "export: %s has no GGUF name", hf);
                goto done;
            }
            at_tensor *A, *B;
            AT_CHECK(host_copy(&j, p->A, dtype, &A));
            AT_CHECK(host_copy(&j, p->B, dtype, &B));
            if (!strcmp(arch, "llama") && (m == AT_MOD_Q || m == AT_MOD_K))
                AT_CHECK(at_qk_permute_tensor(B, m == AT_MOD_Q ? cfg->num_attention_heads : cfg->num_key_value_heads,
                                              AT_QK_TO_INTERLEAVED));
            snprintf(name, sizeof name, "%s.lora_a", base);
            AT_CHECK(at_gguf_add_at_tensor(j.w, name, A));
            snprintf(name, sizeof name, "%s.lora_b", base);
            AT_CHECK(at_gguf_add_at_tensor(j.w, name, B));
        }
    }
    AT_CHECK(at_gguf_write(j.w, path));
done:
    at_gguf_writer_free(j.w);
    for (size_t i = 0; i < j.n_owned; i++) at_tensor_free(j.owned[i]);
    free(j.owned);
    return st;
}

/* ---- reading the tokenizer back -------------------------------------------- */

static int get_bool(const at_gguf *g, const char *key, int dflt)
{
    int v;
    return at_gguf_get_bool(g, key, &v) == AT_OK ? v : dflt;
}

static int32_t get_id(const at_gguf *g, const char *key)
{
    int64_t v;
    return at_gguf_get_int(g, key, &v) == AT_OK && v >= 0 && v <= 0x7fffffff ? (int32_t)v : -1;
}

at_status at_export_gguf_read_tokenizer(const at_gguf *g, at_tokenizer **out)
{
    *out = NULL;
    const char *model = NULL, *pre = NULL;
    at_status st = at_gguf_get_string(g, "tokenizer.ggml.model", &model, NULL);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_NOT_FOUND, "gguf: no tokenizer.ggml.model: no tokenizer embedded");
    if (st != AT_OK) return st;
    if (at_gguf_get_string(g, "tokenizer.ggml.pre", &pre, NULL) != AT_OK) pre = NULL;
    at_gguf_type et;
    size_t n = 0, nm = 0, ns = 0, nt = 0;
    AT_TRY(at_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n));
    if (et != AT_GGUF_STRING) return at_error(AT_ERR_FORMAT, "gguf: tokenizer.ggml.tokens is not an array of strings");
    const at_gguf_value *tv = at_gguf_get(g, "tokenizer.ggml.tokens");
    const at_gguf_value *mv = at_gguf_get(g, "tokenizer.ggml.merges");
    const at_gguf_value *sv = at_gguf_get(g, "tokenizer.ggml.scores");
    const at_gguf_value *yv = at_gguf_get(g, "tokenizer.ggml.token_type");
    const char **toks = calloc(n ? n : 1, sizeof *toks), **merges = NULL;
    size_t *lens = calloc(n ? n : 1, sizeof *lens), *mlens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    if (!toks || !lens) {
        st = at_error(AT_ERR_NOMEM, "gguf: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        toks[i] = tv->v.arr.items[i].v.str.s;
        lens[i] = tv->v.arr.items[i].v.str.len;
    }
    if (mv && mv->type == AT_GGUF_ARRAY && mv->v.arr.type == AT_GGUF_STRING) {
        nm = mv->v.arr.count;
        merges = calloc(nm ? nm : 1, sizeof *merges);
        mlens = calloc(nm ? nm : 1, sizeof *mlens);
        if (!merges || !mlens) {
            st = at_error(AT_ERR_NOMEM, "gguf: out of memory");
            goto done;
        }
        for (size_t i = 0; i < nm; i++) {
            merges[i] = mv->v.arr.items[i].v.str.s;
            mlens[i] = mv->v.arr.items[i].v.str.len;
        }
    }
    if (sv && sv->type == AT_GGUF_ARRAY && (ns = sv->v.arr.count) == n) {
        scores = malloc(n * sizeof *scores);
        if (!scores) {
            st = at_error(AT_ERR_NOMEM, "gguf: out of memory");
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            at_gguf_value e;
            double f = 0;
            if (at_gguf_value_elem(sv, i, &e) != AT_OK || at_gguf_value_float(&e, &f) != AT_OK) {
                st = at_error(AT_ERR_FORMAT, "gguf: tokenizer.ggml.scores[%zu] is not a number", i);
                goto done;
            }
            scores[i] = (float)f;
        }
    }
    if (yv && yv->type == AT_GGUF_ARRAY && (nt = yv->v.arr.count) == n) {
        types = malloc(n * sizeof *types);
        if (!types) {
            st = at_error(AT_ERR_NOMEM, "gguf: out of memory");
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            at_gguf_value e;
            int64_t v = 0;
            if (at_gguf_value_elem(yv, i, &e) != AT_OK || at_gguf_value_int(&e, &v) != AT_OK) {
                st = at_error(AT_ERR_FORMAT, "gguf: tokenizer.ggml.token_type[%zu] is not an integer", i);
                goto done;
            }
            types[i] = (int32_t)v;
        }
    }
    int spm = !strcmp(model, "llama");
    at_tokenizer_arrays a = {
        .model = model,
        .pre = pre,
        .n_tokens = n,
        .tokens = toks,
        .token_lens = lens,
        .scores = scores,
        .token_types = types,
        .n_merges = nm,
        .merges = merges,
        .merge_lens = mlens,
        .bos_id = get_id(g, "tokenizer.ggml.bos_token_id"),
        .eos_id = get_id(g, "tokenizer.ggml.eos_token_id"),
        .unk_id = get_id(g, "tokenizer.ggml.unknown_token_id"),
        .pad_id = get_id(g, "tokenizer.ggml.padding_token_id"),
        .add_bos = get_bool(g, "tokenizer.ggml.add_bos_token", spm),
        .add_eos = get_bool(g, "tokenizer.ggml.add_eos_token", 0),
        .add_space_prefix = get_bool(g, "tokenizer.ggml.add_space_prefix", 1),
    };
    st = at_tokenizer_from_arrays(&a, out);
done:
    free(toks);
    free(lens);
    free(merges);
    free(mlens);
    free(scores);
    free(types);
    return st;
}
