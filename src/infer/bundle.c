#include "infer/bundle.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "model/gguf.h"
#include "model/loader.h"

typedef enum { SRC_FOLDER, SRC_GGUF, SRC_LLAMA2C } source_kind;

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static source_kind kind_of(const char *path)
{
    if (at_is_dir(path)) return SRC_FOLDER;
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (f) {
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && !memcmp(magic, "GGUF", 4)) return SRC_GGUF;
    }
    return ends_with(path, ".bin") ? SRC_LLAMA2C : SRC_FOLDER;
}

/* The folder holding path (a new string). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* Name: last path component without a trailing slash and extension. */
static void model_name(const char *path, char *out, size_t cap)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    size_t n = len - start;
    const char *base = path + start;
    for (size_t i = n; i > 0; i--)
        if (base[i - 1] == '.') {
            if (!at_is_dir(path)) n = i - 1;
            break;
        }
    if (n == 0 || n >= cap) n = n >= cap ? cap - 1 : n;
    memcpy(out, base, n);
    out[n] = 0;
    if (!out[0]) snprintf(out, cap, "model");
}

/* A llama2.c tokenizer next to a .bin (text/tokenizer.h finds it). */
static at_status find_llama2c_tokenizer(const char *model, char **out)
{
    char *dir = dir_of(model);
    if (!dir) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = at_tokenizer_find_llama2c(dir, out);
    free(dir);
    return st == AT_OK ? AT_OK : at_error_wrap(st, "%s: give --tokenizer", model);
}

/* A string element of a GGUF array (pointer into g). */
static int gguf_str(const at_gguf_value *arr, size_t i, const char **s, size_t *len)
{
    at_gguf_value v;
    if (at_gguf_value_elem(arr, i, &v) != AT_OK || v.type != AT_GGUF_STRING) return 0;
    *s = v.v.str.s;
    *len = v.v.str.len;
    return 1;
}

static int32_t gguf_id(const at_gguf *g, const char *key)
{
    int64_t v;
    return at_gguf_get_int(g, key, &v) == AT_OK && v >= 0 && v <= 0x7fffffff ? (int32_t)v : -1;
}

/* The tokenizer stored in a GGUF file (tokenizer.ggml.*), and its chat template text (new string or NULL). */
static at_status gguf_tokenizer(const char *path, at_tokenizer **tok, char **tmpl)
{
    *tok = NULL;
    *tmpl = NULL;
    at_gguf *g = NULL;
    AT_TRY(at_gguf_open(path, &g));
    at_status st = AT_OK;
    const char **tokens = NULL, **merges = NULL;
    size_t *tok_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    const char *model = NULL, *pre = NULL;
    at_gguf_type et;
    size_t n_tok = 0, n_merges = 0;
    if (at_gguf_get_string(g, "tokenizer.ggml.model", &model, NULL) != AT_OK ||
        at_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n_tok) != AT_OK || et != AT_GGUF_STRING) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: the GGUF file holds no tokenizer (tokenizer.ggml.model/tokens); "
                      "give --tokenizer", path);
        goto done;
    }
    (void)at_gguf_get_string(g, "tokenizer.ggml.pre", &pre, NULL);
    const at_gguf_value *tv = at_gguf_get(g, "tokenizer.ggml.tokens");
    tokens = malloc(n_tok * sizeof *tokens);
    tok_lens = malloc(n_tok * sizeof *tok_lens);
    if (!tokens || !tok_lens) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n_tok; i++)
        if (!gguf_str(tv, i, &tokens[i], &tok_lens[i])) {
            st = at_error(AT_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] is not a string", path, i);
            goto done;
        }
    size_t cnt;
    if (at_gguf_get_array(g, "tokenizer.ggml.scores", &et, &cnt) == AT_OK && cnt == n_tok) {
        const at_gguf_value *sv = at_gguf_get(g, "tokenizer.ggml.scores");
        scores = malloc(n_tok * sizeof *scores);
        if (!scores) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t i = 0; i < n_tok; i++) {
            at_gguf_value v;
            double f = 0;
            if (at_gguf_value_elem(sv, i, &v) == AT_OK) (void)at_gguf_value_float(&v, &f);
            scores[i] = (float)f;
        }
    }
    if (at_gguf_get_array(g, "tokenizer.ggml.token_type", &et, &cnt) == AT_OK && cnt == n_tok) {
        const at_gguf_value *tt = at_gguf_get(g, "tokenizer.ggml.token_type");
        types = malloc(n_tok * sizeof *types);
        if (!types) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t i = 0; i < n_tok; i++) {
            at_gguf_value v;
            int64_t x = 1;
            if (at_gguf_value_elem(tt, i, &v) == AT_OK) (void)at_gguf_value_int(&v, &x);
            types[i] = (int32_t)x;
        }
    }
    if (at_gguf_get_array(g, "tokenizer.ggml.merges", &et, &n_merges) == AT_OK && et == AT_GGUF_STRING) {
        const at_gguf_value *mv = at_gguf_get(g, "tokenizer.ggml.merges");
        merges = malloc((n_merges ? n_merges : 1) * sizeof *merges);
        merge_lens = malloc((n_merges ? n_merges : 1) * sizeof *merge_lens);
        if (!merges || !merge_lens) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t i = 0; i < n_merges; i++)
            if (!gguf_str(mv, i, &merges[i], &merge_lens[i])) {
                st = at_error(AT_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] is not a string", path, i);
                goto done;
            }
    } else {
        n_merges = 0;
    }
    int add_bos = !strcmp(model, "llama"), add_eos = 0, add_space = 1;
    (void)at_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    (void)at_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos);
    (void)at_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space);
    at_tokenizer_arrays a = {
        .model = model, .pre = pre, .n_tokens = n_tok, .tokens = tokens, .token_lens = tok_lens,
        .scores = scores, .token_types = types, .n_merges = n_merges, .merges = merges, .merge_lens = merge_lens,
        .bos_id = gguf_id(g, "tokenizer.ggml.bos_token_id"), .eos_id = gguf_id(g, "tokenizer.ggml.eos_token_id"),
        .unk_id = gguf_id(g, "tokenizer.ggml.unknown_token_id"),
        .pad_id = gguf_id(g, "tokenizer.ggml.padding_token_id"), .add_bos = add_bos, .add_eos = add_eos,
        .add_space_prefix = add_space};
    st = at_tokenizer_from_arrays(&a, tok);
    if (st != AT_OK) {
        at_error_wrap(st, "%s", path);
        goto done;
    }
    const char *ct = NULL;
    if (at_gguf_get_string(g, "tokenizer.chat_template", &ct, NULL) == AT_OK && ct[0]) {
        *tmpl = strdup(ct);
        if (!*tmpl) st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
    }
done:
    free(tokens);
    free(tok_lens);
    free(merges);
    free(merge_lens);
    free(scores);
    free(types);
    at_gguf_close(g);
    if (st != AT_OK) {
        at_tokenizer_free(*tok);
        *tok = NULL;
    }
    return st;
}

/* Special tokens of the tokenizer as template variables ({"bos_token": ...}). */
static cJSON *token_vars(const at_tokenizer *t)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    struct { const char *key; int32_t id; } k[] = {
        {"bos_token", at_tokenizer_bos(t)}, {"eos_token", at_tokenizer_eos(t)},
        {"pad_token", at_tokenizer_pad(t)}, {"unk_token", at_tokenizer_unk(t)}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const char *s = k[i].id >= 0 ? at_tokenizer_id_to_token(t, k[i].id) : NULL;
        if (s) cJSON_AddStringToObject(o, k[i].key, s);
    }
    return o;
}

static void add_stop(int32_t *ids, int *n, int cap, int vocab, int32_t id)
{
    if (id < 0 || id >= vocab) return;
    for (int i = 0; i < *n; i++)
        if (ids[i] == id) return;
    if (*n < cap) ids[(*n)++] = id;
}

/* eos_token_id of generation_config.json (a number or a list), when the folder has one. */
static void generation_config_stops(at_bundle *b, const char *dir)
#define add_stop(b, id) add_stop((b)->stop_ids, &(b)->n_stop_ids, AT_BUNDLE_MAX_STOP_IDS, (b)->decoder->cfg.vocab_size, id)
{
    char *p = at_path_join(dir, "generation_config.json");
    cJSON *j = NULL;
    if (p && at_file_exists(p) && at_json_parse_file(p, &j) == AT_OK) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
        if (cJSON_IsNumber(e)) add_stop(b, (int32_t)e->valuedouble);
        const cJSON *it;
        if (cJSON_IsArray(e))
            cJSON_ArrayForEach(it, e) if (cJSON_IsNumber(it)) add_stop(b, (int32_t)it->valuedouble);
    }
    at_clear_error();
    cJSON_Delete(j);
    free(p);
}

#undef add_stop

int at_stop_tokens(const at_model_config *c, const at_tokenizer *tok, const at_chat_template *tmpl, int32_t *ids,
                   int n, int cap)
{
    int V = c->vocab_size;
    for (int i = 0; i < c->n_eos; i++) add_stop(ids, &n, cap, V, c->eos_token_ids[i]);
    add_stop(ids, &n, cap, V, at_tokenizer_eos(tok));
    add_stop(ids, &n, cap, V, at_tokenizer_bos(tok));
    if (tmpl) {
        const char *eos = at_chat_template_token(tmpl, "eos_token");
        if (eos) add_stop(ids, &n, cap, V, at_tokenizer_token_to_id(tok, eos));
    }
    static const char *const eot[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                                      "<|endoftext|>", "<|end_of_text|>"};
    for (size_t i = 0; i < sizeof eot / sizeof eot[0]; i++) {
        int32_t id = at_tokenizer_special_id(tok, eot[i]);
        if (id >= 0) add_stop(ids, &n, cap, V, id);
    }
    return n;
}

static void collect_stops(at_bundle *b)
{
    b->n_stop_ids = at_stop_tokens(&b->decoder->cfg, b->tokenizer, b->tmpl, b->stop_ids, b->n_stop_ids,
                                   AT_BUNDLE_MAX_STOP_IDS);
}

static at_status load_template(const at_tokenizer *tok, const at_bundle_opts *o, source_kind kind,
                               const char *gguf_tmpl, at_chat_template **tmpl)
{
    const char *t = o->template_name;
    if (t && !strcmp(t, "none")) return AT_OK;
    if (t && at_chat_template_builtin_source(t)) return at_chat_template_builtin(t, NULL, tmpl);
    cJSON *vars = token_vars(tok);
    at_status st = AT_OK;
    if (t) {
        char *src = NULL;
        size_t len = 0;
        if (!at_file_exists(t)) {
            st = at_error(AT_ERR_NOT_FOUND, "--template %s: not a file nor a built-in template (none, %s)", t,
                          AT_CHAT_TEMPLATE_NAMES);
        } else if ((st = at_read_file(t, &src, &len)) == AT_OK) {
            st = at_chat_template_from_string(src, len, t, vars, tmpl);
        }
        free(src);
    } else if (kind == SRC_FOLDER && at_is_dir(o->model)) {
        st = at_chat_template_load(o->model, NULL, NULL, tmpl);
        if (st == AT_ERR_NOT_FOUND) {
            at_clear_error();
            st = AT_OK;
        }
    } else if (kind == SRC_GGUF && gguf_tmpl) {
        st = at_chat_template_from_string(gguf_tmpl, strlen(gguf_tmpl), o->model, vars, tmpl);
    }
    cJSON_Delete(vars);
    return st;
}

static at_status load_adapters(at_bundle *b, const at_bundle_opts *o)
{
    if (o->n_adapters > AT_BUNDLE_MAX_ADAPTERS)
        return at_error(AT_ERR_INVALID, "--adapters: at most %d adapters", AT_BUNDLE_MAX_ADAPTERS);
    for (int i = 0; i < o->n_adapters; i++) {
        const char *item = o->adapters[i], *eq = strchr(item, '=');
        at_bundle_adapter *a = &b->adapters[b->n_adapters];
        const char *path = eq ? eq + 1 : item;
        if (eq) {
            size_t n = (size_t)(eq - item);
            if (n == 0 || n >= sizeof a->name)
                return at_error(AT_ERR_INVALID, "--adapters %s: the name must have 1 to %zu characters", item,
                                sizeof a->name - 1);
            memcpy(a->name, item, n);
            a->name[n] = 0;
        } else {
            model_name(path, a->name, sizeof a->name);
        }
        if (!strcmp(a->name, b->name) || at_bundle_adapter_get(b, a->name))
            return at_error(AT_ERR_INVALID, "--adapters: the name '%s' is used twice (name them: NAME=DIR)",
                            a->name);
        a->path = strdup(path);
        if (!a->path) return at_error(AT_ERR_NOMEM, "out of memory");
        b->n_adapters++;
        /* a trained tower or aligner would be left out here (adapters switch per request; the tower is shared):
           refused rather than answered without it */
        if (at_adapter_has_tower(path))
            return at_error(AT_ERR_UNSUPPORTED, "--adapters %s: the adapter holds vision-tower tensors (a run with "
                            "--freeze_vit false or --freeze_aligner false): merge it into the model first (anytune "
                            "export --adapters %s --merge_lora --to hf ...) and run the merged folder", item, path);
        at_status st = at_adapter_load(path, &b->decoder->cfg, b->decoder->be, &a->adapter);
        if (st != AT_OK) return at_error_wrap(st, "--adapters %s", item);
    }
    return AT_OK;
}

at_status at_bundle_load_text(const at_bundle_opts *o, at_tokenizer **tok, at_chat_template **tmpl)
{
    *tok = NULL;
    *tmpl = NULL;
    if (!o->model || !o->model[0]) return at_error(AT_ERR_INVALID, "no --model given");
    if (!at_file_exists(o->model) && !at_is_dir(o->model))
        return at_error(AT_ERR_NOT_FOUND, "--model %s: no such file or folder", o->model);
    at_status st = AT_OK;
    char *tok_path = NULL, *gguf_tmpl = NULL;
    source_kind kind = kind_of(o->model);
    if (o->tokenizer) {
        AT_CHECK(at_tokenizer_load(o->tokenizer, NULL, tok));
        if (kind == SRC_GGUF) { /* the template may still come from the file */
            at_tokenizer *unused = NULL;
            if (gguf_tokenizer(o->model, &unused, &gguf_tmpl) != AT_OK) at_clear_error();
            at_tokenizer_free(unused);
        }
    } else if (kind == SRC_GGUF) {
        AT_CHECK(gguf_tokenizer(o->model, tok, &gguf_tmpl));
    } else if (kind == SRC_LLAMA2C) {
        AT_CHECK(find_llama2c_tokenizer(o->model, &tok_path));
        AT_CHECK(at_tokenizer_load(tok_path, NULL, tok));
    } else {
        char *dir = at_is_dir(o->model) ? strdup(o->model) : dir_of(o->model);
        if (!dir) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        st = at_tokenizer_load(dir, NULL, tok);
        free(dir);
        if (st != AT_OK) {
            at_error_wrap(st, "--model %s has no usable tokenizer (give --tokenizer)", o->model);
            goto done;
        }
    }
    AT_CHECK(load_template(*tok, o, kind, gguf_tmpl, tmpl));
done:
    free(tok_path);
    free(gguf_tmpl);
    if (st != AT_OK) {
        at_tokenizer_free(*tok);
        at_chat_template_free(*tmpl);
        *tok = NULL;
        *tmpl = NULL;
    }
    return st;
}

/* The vision tower and the image processor of a vision-language folder. */
static at_status load_vision(at_bundle *b, const char *model)
{
    if (kind_of(model) != SRC_FOLDER || !at_is_dir(model)) return AT_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model);
    cJSON *root = NULL;
    if (!at_file_exists(path) || at_json_parse_file(path, &root) != AT_OK) {
        at_clear_error();
        return AT_OK; /* the decoder's loader read its config already; nothing vision-like here */
    }
    at_vision_kind kind = AT_VISION_NONE;
    at_status st = at_vision_kind_of(root, path, &kind);
    cJSON_Delete(root);
    AT_TRY(st);
    if (kind == AT_VISION_NONE) return AT_OK;
    AT_TRY(at_vision_load(model, model, b->decoder->be, &b->vision));
    return at_image_processor_load(model, &b->image_proc, NULL);
}

at_status at_bundle_load(const at_bundle_opts *o, at_bundle **out)
{
    *out = NULL;
    if (!o->model || !o->model[0]) return at_error(AT_ERR_INVALID, "no --model given");
    if (!at_file_exists(o->model) && !at_is_dir(o->model))
        return at_error(AT_ERR_NOT_FOUND, "--model %s: no such file or folder", o->model);
    at_bundle *b = calloc(1, sizeof *b);
    if (!b) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    model_name(o->model, b->name, sizeof b->name);
    at_load_options lo = at_load_options_default();
    if (o->backend) lo.backend = o->backend;
    lo.dtype = (at_dtype)o->dtype;
    lo.quant = (at_quant_kind)o->quant;
    lo.model_type = o->model_type;
    AT_CHECK(at_decoder_load(o->model, &lo, &b->decoder));
    AT_CHECK(at_bundle_load_text(o, &b->tokenizer, &b->tmpl));
    AT_CHECK(at_tokenizer_check_vocab(b->tokenizer, b->decoder->cfg.vocab_size, o->model));
    collect_stops(b);
    if (kind_of(o->model) == SRC_FOLDER && at_is_dir(o->model)) generation_config_stops(b, o->model);
    AT_CHECK(load_adapters(b, o));
    AT_CHECK(load_vision(b, o->model));
done:
    if (st != AT_OK) {
        at_bundle_free(b);
        return st;
    }
    *out = b;
    return AT_OK;
}

void at_bundle_free(at_bundle *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_adapters; i++) {
        at_adapter_free(b->adapters[i].adapter);
        free(b->adapters[i].path);
    }
    at_vision_free(b->vision);
    at_chat_template_free(b->tmpl);
    at_tokenizer_free(b->tokenizer);
    at_decoder_free(b->decoder);
    free(b);
}

at_adapter *at_bundle_adapter_get(const at_bundle *b, const char *name)
{
    for (int i = 0; i < b->n_adapters; i++)
        if (!strcmp(b->adapters[i].name, name)) return b->adapters[i].adapter;
    return NULL;
}

/* Ids beyond the model's vocabulary (a tokenizer with more tokens than the
 * model) are refused here, with the text position, not deep in the decoder. */
static at_status check_ids(const at_bundle *b, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= b->decoder->cfg.vocab_size)
            return at_error(AT_ERR_INVALID, "the prompt's token %zu (id %d) is outside the model's vocabulary of %d",
                            i, ids[i], b->decoder->cfg.vocab_size);
    return AT_OK;
}

at_status at_bundle_encode_text(const at_bundle *b, const char *text, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!text[0]) {
        int32_t bos = at_tokenizer_bos(b->tokenizer);
        if (bos < 0) return at_error(AT_ERR_INVALID, "an empty prompt needs a BOS token, and the tokenizer has none");
        *ids = malloc(sizeof **ids);
        if (!*ids) return at_error(AT_ERR_NOMEM, "out of memory");
        (*ids)[0] = bos;
        *n = 1;
        return AT_OK;
    }
    AT_TRY(at_tokenizer_encode(b->tokenizer, text, strlen(text), AT_TOK_ADD_SPECIAL | AT_TOK_PARSE_SPECIAL, ids, n));
    at_status st = *n ? check_ids(b, *ids, *n) : at_error(AT_ERR_INVALID, "the prompt encodes to no token");
    if (st != AT_OK) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return st;
}

at_status at_bundle_encode_chat(const at_bundle *b, const cJSON *messages, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!b->tmpl)
        return at_error(AT_ERR_INVALID, "the model %s has no chat template (give --template NAME)", b->name);
    at_chat_render_opts ro = {0};
    ro.add_generation_prompt = 1;
    at_chat_rendered r = {0};
    AT_TRY(at_chat_template_render(b->tmpl, messages, &ro, &r));
    /* the template writes the special tokens itself (bos_token ...): no post-processor */
    at_status st = at_tokenizer_encode(b->tokenizer, r.text, r.len, AT_TOK_PARSE_SPECIAL, ids, n);
    at_chat_rendered_free(&r);
    if (st == AT_OK) st = *n ? check_ids(b, *ids, *n) : at_error(AT_ERR_INVALID, "the chat renders to no token");
    if (st != AT_OK) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return st;
}

int at_bundle_context(const at_bundle *b, int want)
{
    int64_t mp = b->decoder->cfg.max_position_embeddings;
    if (want > 0) return mp > 0 && want > mp ? (int)mp : want;
    if (mp <= 0) return 2048;
    return mp > 4096 ? 4096 : (int)mp;
}
