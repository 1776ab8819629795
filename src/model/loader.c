#include "model/loader.h"
#include "model/vision_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/manifest.h"
#include "base/file.h"
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "device/quant.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/qk_permute.h"
#include "model/safetensors.h"
#include "ops/ops.h"

at_load_options at_load_options_default(void)
{
    at_load_options o = {NULL, AT_LOAD_KEEP_DTYPE, 0, AT_QUANT_NONE, NULL};
    return o;
}

/* ---- quantized formats (QLoRA) ------------------------------------------ */

at_dtype at_quant_dtype(at_quant_kind q)
{
    switch (q) {
    case AT_QUANT_NF4: return AT_NF4;
    case AT_QUANT_Q8_0: return AT_Q8_0;
    case AT_QUANT_Q4_0: return AT_Q4_0;
    default: return AT_DTYPE_COUNT;
    }
}

const char *at_quant_name(at_quant_kind q)
{
    switch (q) {
    case AT_QUANT_NF4: return "nf4";
    case AT_QUANT_Q8_0: return "q8_0";
    case AT_QUANT_Q4_0: return "q4_0";
    default: return "none";
    }
}

at_status at_quant_from_bits(int bits, at_quant_kind *out)
{
    switch (bits) {
    case 0: *out = AT_QUANT_NONE; return AT_OK;
    case 4: *out = AT_QUANT_NF4; return AT_OK;
    case 8: *out = AT_QUANT_Q8_0; return AT_OK;
    default:
        return at_error(AT_ERR_INVALID, "quant_bits %d: use 4 (NF4, QLoRA), 8 (q8_0) or 0 (no quantization)", bits);
    }
}

at_status at_quant_parse(const char *s, at_quant_kind *out)
{
    static const struct { const char *name; at_quant_kind q; } names[] = {
        {"none", AT_QUANT_NONE}, {"0", AT_QUANT_NONE}, {"nf4", AT_QUANT_NF4}, {"4", AT_QUANT_NF4},
        {"q8_0", AT_QUANT_Q8_0}, {"8", AT_QUANT_Q8_0}, {"q4_0", AT_QUANT_Q4_0},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].q;
            return AT_OK;
        }
    return at_error(AT_ERR_INVALID, "quantization '%s': use none, nf4, q8_0 or q4_0", s ? s : "(null)");
}

/* A matrix read in place from the mapped file is never read again once
 * quantized: drop its pages from this process (they stay in the page cache)
 * so that resident memory holds the quantized model, not the dense file as
 * well. Only whole pages inside the tensor; the mapping is read-only, so a
 * page that is touched again is simply read back. */
static void release_mapped(const at_tensor *t)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (!t->buf || !t->buf->external || pg <= 0) return;
    uintptr_t a = (uintptr_t)at_tensor_data(t), e = a + at_tensor_nbytes(t);
    uintptr_t a2 = (a + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg, e2 = e / (uintptr_t)pg * (uintptr_t)pg;
    if (e2 > a2) (void)madvise((void *)a2, e2 - a2, MADV_DONTNEED);
}

/* Replaces matrix *t (on backend be; host memory when be is NULL) by its
 * quantization to qt; release: *t may be a view of a file the loader mapped
 * (never set for tensors someone else made: their external memory may be
 * anything). Leaves it dense (*quantized = 0) when its rows are not
 * a multiple of qt's block or it is already quantized in another format. */
static at_status quantize_matrix(at_backend *be, at_dtype qt, at_tensor **t, int release, int *quantized)
{
    *quantized = 0;
    at_tensor *src = *t, *host = NULL, *q = NULL, *d = NULL;
    if (!src) return AT_OK;
    if (at_dtype_is_quantized(src->dtype)) {
        *quantized = src->dtype == qt;
        return AT_OK;
    }
    if (src->ndim != 2 || src->shape[1] % at_quant_row_block(qt)) return AT_OK;
    at_status st = AT_OK;
    const at_tensor *in = src;
    if (be && !be->is_host) { /* through host memory */
        AT_CHECK(at_tensor_new(at_cpu_backend(), src->dtype, 2, src->shape, src->name, &host));
        AT_CHECK(at_tensor_download(src, at_tensor_data(host), at_tensor_nbytes(host)));
        in = host;
    }
    AT_CHECK(at_tensor_new(at_cpu_backend(), qt, 2, src->shape, src->name, &q));
    AT_CHECK(at_quantize(q, in));
    at_tensor_free(host);
    host = NULL;
    if (be && !be->is_host) {
        AT_CHECK(at_tensor_new(be, qt, 2, q->shape, q->name, &d));
        AT_CHECK(at_tensor_upload(d, at_tensor_data(q), at_tensor_nbytes(q)));
        at_tensor_free(q);
        q = d;
        d = NULL;
    }
    if (release) release_mapped(src);
    at_tensor_free(src);
    *t = q;
    *quantized = 1;
    return AT_OK;
done:
    at_tensor_free(host);
    at_tensor_free(q);
    at_tensor_free(d);
    return st;
}

/* Which modules stayed dense, for one info line per module. */
typedef struct {
    int count[AT_MOD_COUNT];
    int64_t in[AT_MOD_COUNT];
} dense_notes;

static at_status quantize_layer(at_backend *be, at_layer_weights *L, at_dtype qt, int release, at_quant_stats *stats,
                                dense_notes *notes)
{
    at_tensor **mats[AT_MOD_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        int done = 0;
        AT_TRY(quantize_matrix(be, qt, mats[m], release, &done));
        const at_tensor *t = *mats[m];
        if (!t) continue;
        if (done) {
            stats->n_quantized++;
            stats->params += at_tensor_numel(t);
            stats->bytes += at_tensor_nbytes(t);
        } else if (!at_dtype_is_quantized(t->dtype)) {
            stats->n_dense++;
            stats->dense_params += at_tensor_numel(t);
            notes->count[m]++;
            notes->in[m] = t->ndim == 2 ? t->shape[1] : 0;
        }
    }
    return AT_OK;
}

static void log_dense_notes(const dense_notes *n, at_dtype qt, const at_decoder_weights *w)
{
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        if (!n->count[m]) continue;
        const at_tensor *t = NULL;
        for (int l = 0; l < w->cfg.num_hidden_layers && !t; l++) {
            at_layer_weights *L = &w->layers[l];
            const at_tensor *mats[AT_MOD_COUNT] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
            if (mats[m] && !at_dtype_is_quantized(mats[m]->dtype)) t = mats[m];
        }
        at_log_info("%s.%s of %d layer(s): rows of %lld values are not a multiple of %s's block (%lld): kept "
                    "unquantized (%s)",
                    at_module_parent((at_module)m), at_module_name((at_module)m), n->count[m], (long long)n->in[m],
                    at_dtype_name(qt), (long long)at_quant_row_block(qt), t ? at_dtype_name(t->dtype) : "dense");
    }
}

at_status at_decoder_weights_quantize(at_decoder_weights *w, at_quant_kind q, at_quant_stats *stats)
{
    at_quant_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    at_dtype qt = at_quant_dtype(q);
    if (qt == AT_DTYPE_COUNT) return at_error(AT_ERR_INVALID, "quantize weights: no format given");
    dense_notes notes;
    memset(&notes, 0, sizeof notes);
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) {
        at_status st = quantize_layer(w->backend, &w->layers[l], qt, 0, stats, &notes);
        if (st != AT_OK) return at_error_wrap(st, "quantizing layer %d to %s", l, at_dtype_name(qt));
    }
    log_dense_notes(&notes, qt, w);
    return AT_OK;
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
        if (!info && strncmp(hf_name, "model.", 6) == 0) {
            /* a vision-language model saved by transformers >= 4.52 keeps its
             * language model under model.language_model.* (lm_head unchanged) */
            char alt[192];
            snprintf(alt, sizeof alt, "model.language_model.%s", hf_name + 6);
            info = at_st_model_find(s->st, alt);
        }
        if (!info) {
            if (optional) return AT_OK;
            return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s is missing", s->path, hf_name);
        }
        if (!info->has_dtype || !is_float(info->dtype))
            return at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (F32, BF16, F16 supported)", s->path,
                            hf_name, info->dtype_name);
        AT_TRY(at_st_tensor(info, want == AT_LOAD_KEEP_DTYPE ? AT_ST_KEEP_DTYPE : want, out));
        at_tensor_set_name(*out, hf_name); /* the canonical name, whichever the file used */
        return AT_OK;
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
        if (at_dtype_is_quantized(w) && stored != (int)w) w = AT_LOAD_KEEP_DTYPE; /* quantized later */
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

static at_status open_source(const char *path, const char *model_type, source *s, at_model_config *cfg)
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
        /* a vision-language folder: its vision config and tower weights are
         * checked (what is missing is named); the language model loads here */
        at_status st = model_type ? AT_OK : at_vision_gate(folder, path);
        if (st == AT_OK) st = at_model_config_load_as(folder, model_type, cfg);
        free(folder);
        AT_TRY(st);
        return at_st_model_open(path, &s->st);
    }
    /* a file: GGUF by its magic, else a llama2.c checkpoint */
    char magic[4] = {0};
    size_t n = 0;
    AT_TRY(at_read_head(path, magic, 4, &n));
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        s->kind = SRC_GGUF;
        AT_TRY(at_gguf_open(path, &s->gg));
        AT_TRY(at_model_config_from_gguf(s->gg, path, cfg));
        s->gguf_interleaved = at_gguf_qk_interleaved(s->gg);
        return at_model_type_check(cfg, path, model_type);
    }
    s->kind = SRC_LLAMA2C;
    AT_TRY(at_llama2c_open(path, &s->l2));
    *cfg = *at_llama2c_config(s->l2);
    return at_model_type_check(cfg, path, model_type);
}

/* ---- loading ------------------------------------------------------------ */

/* The dtype to load matrix hf_name as: lin, or the stored Q8_0 / Q4_0 of a
 * GGUF when nothing else is asked (see LIN below). */
static at_dtype keep_quantized(const source *s, const char *hf_name, at_dtype lin, const at_load_options *o)
{
    char gname[160];
    if (s->kind != SRC_GGUF || o->dtype != AT_LOAD_KEEP_DTYPE || o->quant != AT_QUANT_NONE || o->writable ||
        !at_gguf_name_from_hf(hf_name, gname, sizeof gname))
        return lin;
    const at_gguf_tensor_info *info = at_gguf_find_tensor(s->gg, gname);
    int stored = info ? at_ggml_to_dtype(info->type) : -1;
    return stored == AT_Q8_0 || stored == AT_Q4_0 ? (at_dtype)stored : lin;
}

at_status at_decoder_weights_load(const char *path, const at_load_options *opt, at_decoder_weights **out)
{
    *out = NULL;
    at_load_options o = opt ? *opt : at_load_options_default();
    if (o.dtype != AT_LOAD_KEEP_DTYPE && !is_float(o.dtype))
        return at_error(AT_ERR_INVALID, "loader: dtype %s (keep, f32, bf16 or f16)", at_dtype_name(o.dtype));
    at_dtype qt = at_quant_dtype(o.quant);
    if (o.quant != AT_QUANT_NONE && qt == AT_DTYPE_COUNT)
        return at_error(AT_ERR_INVALID, "loader: unknown quantization %d", (int)o.quant);
    if (o.quant != AT_QUANT_NONE && o.writable)
        return at_error(AT_ERR_UNSUPPORTED, "%s: full fine-tuning trains every weight and cannot run on quantized "
                        "(%s) weights: train LoRA adapters over them (--train_type lora --quant_bits N), or load "
                        "without quantization", path, at_quant_name(o.quant));
    /* A full fine-tuning checkpoint is checked against its manifest (an
     * export's too would mean hashing a deployed model at every start). */
    char *state = at_is_dir(path) ? at_path_join(path, "trainer_state.safetensors") : NULL;
    at_status vst = state && at_file_exists(state) ? at_manifest_check(path) : AT_OK;
    free(state);
    AT_TRY(vst);
    at_backend *be = o.backend ? o.backend : at_cpu_backend();
    source *s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "loader: out of memory");
    at_model_config cfg;
    at_decoder_weights *w = NULL;
    at_status st = AT_OK;
    AT_CHECK(open_source(path, o.model_type, s, &cfg));
    AT_CHECK(at_decoder_weights_alloc(&cfg, be, &w));
    w->source = s;
    w->source_close = source_close;
    s = NULL; /* owned by w now */
    source *src = w->source;
    at_dtype mat = o.dtype; /* matrices and embeddings */
    /* GGUF matrices already stored in the asked format are taken as they are */
    at_dtype lin = qt != AT_DTYPE_COUNT && src->kind == SRC_GGUF && (qt == AT_Q8_0 || qt == AT_Q4_0) ? qt : mat;
    at_quant_stats qstats;
    dense_notes notes;
    memset(&qstats, 0, sizeof qstats);
    memset(&notes, 0, sizeof notes);

/* A GGUF's Q8_0 / Q4_0 layer matrices stay as stored when neither a dtype
 * nor a quantization is asked and the weights are read-only: decoding reads
 * their blocks directly (as llama.cpp does), where dequantizing to bf16 would
 * double (q8_0) or nearly quadruple (q4_0) the bytes each token reads. */
#define LIN(name) keep_quantized(src, name, lin, &o)
#define GET(slot, name, dtype, optional)                          \
    do {                                                          \
        AT_CHECK(source_get(src, name, dtype, optional, &(slot))); \
    } while (0)
    GET(w->embed, "model.embed_tokens.weight", mat, 0);
    GET(w->final_norm, "model.norm.weight", AT_F32, 0);
    /* the lm_head of a quantized GGUF stays quantized too (LIN's reasons: it is
     * the largest matrix a token reads); when tied, it is a second, quantized
     * view of the embedding, which stays dequantized for the lookup */
    at_dtype head = keep_quantized(src, cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                                   mat, &o);
    /* a Hugging Face *ForSequenceClassification folder (a reward model): its
     * score head, and no LM head unless tied */
    if (src->kind == SRC_HF) GET(w->score, "score.weight", AT_F32, 1);
    if (!cfg.tie_word_embeddings) GET(w->lm_head, "lm_head.weight", head, w->score != NULL);
    else if (head != mat) GET(w->lm_head, "model.embed_tokens.weight", head, 0);
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
        at_layer_weights *L = &w->layers[l];
        char n[160];
#define NAME(label) (snprintf(n, sizeof n, "model.layers.%d.%s", l, label), n)
        GET(L->attn_norm, NAME("input_layernorm.weight"), AT_F32, 0);
        GET(L->wq, NAME("self_attn.q_proj.weight"), LIN(NAME("self_attn.q_proj.weight")), 0);
        GET(L->wk, NAME("self_attn.k_proj.weight"), LIN(NAME("self_attn.k_proj.weight")), 0);
        GET(L->wv, NAME("self_attn.v_proj.weight"), LIN(NAME("self_attn.v_proj.weight")), 0);
        GET(L->wo, NAME("self_attn.o_proj.weight"), LIN(NAME("self_attn.o_proj.weight")), 0);
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
        GET(L->w_gate, NAME("mlp.gate_proj.weight"), LIN(NAME("mlp.gate_proj.weight")), 0);
        GET(L->w_up, NAME("mlp.up_proj.weight"), LIN(NAME("mlp.up_proj.weight")), 0);
        GET(L->w_down, NAME("mlp.down_proj.weight"), LIN(NAME("mlp.down_proj.weight")), 0);
#undef NAME
#undef LIN
        if (src->kind == SRC_GGUF && src->gguf_interleaved) {
            AT_CHECK(unpermute(&L->wq, cfg.num_attention_heads, path));
            AT_CHECK(unpermute(&L->bq, cfg.num_attention_heads, path));
            AT_CHECK(unpermute(&L->wk, cfg.num_key_value_heads, path));
            AT_CHECK(unpermute(&L->bk, cfg.num_key_value_heads, path));
        }
        /* quantized on the host before moving to the backend, layer by layer */
        if (qt != AT_DTYPE_COUNT) {
            st = quantize_layer(NULL, L, qt, 1, &qstats, &notes);
            if (st != AT_OK) {
                at_error_wrap(st, "%s: quantizing layer %d to %s", path, l, at_dtype_name(qt));
                goto done;
            }
        }
        at_tensor **all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk, &L->bv, &L->bo,
                             &L->q_norm, &L->k_norm, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) AT_CHECK(place(be, o.writable, all[i]));
    }
#undef GET
    AT_CHECK(place(be, o.writable, &w->embed));
    AT_CHECK(place(be, o.writable, &w->final_norm));
    AT_CHECK(place(be, o.writable, &w->lm_head));
    AT_CHECK(place(be, o.writable, &w->score));
    if (cfg.tie_word_embeddings && !w->lm_head) w->lm_head = w->embed;
    st = at_decoder_weights_check(w);
    if (st != AT_OK) at_error_wrap(st, "%s", path);
    if (st == AT_OK && qt != AT_DTYPE_COUNT) {
        log_dense_notes(&notes, qt, w);
        at_log_info("%s: %d linear matrices quantized to %s (%.1f MiB, %.4f bytes per value); %d kept dense", path,
                    qstats.n_quantized, at_dtype_name(qt), (double)qstats.bytes / 1048576.0,
                    qstats.params ? (double)qstats.bytes / (double)qstats.params : 0.0, qstats.n_dense);
    }
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
