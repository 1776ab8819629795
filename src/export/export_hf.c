/* Hugging Face model folders and PEFT adapter folders (export_hf.h). */
#include "export/export_hf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/progress.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_files.h"
#include "export/export_vision.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "ops/ops.h"
#include "text/tokenizer_hf_export.h"

#define DEFAULT_SHARD ((int64_t)5000000000LL)

static const char *const tokenizer_files[] = {
    "tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json",       "merges.txt",            "tokenizer.model",         "chat_template.jinja",
    "chat_template.json",
};

at_status at_export_each_hf_tensor(const at_decoder_weights *w, at_export_tensor_fn fn, void *ctx)
{
    char name[160];
    AT_TRY(fn(ctx, "model.embed_tokens.weight", w->embed));
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) {
        const at_layer_weights *L = &w->layers[l];
        struct {
            const char *suffix;
            const at_tensor *t;
        } parts[] = {
            {"input_layernorm.weight", L->attn_norm},   {"self_attn.q_proj.weight", L->wq},
            {"self_attn.q_proj.bias", L->bq},           {"self_attn.k_proj.weight", L->wk},
            {"self_attn.k_proj.bias", L->bk},           {"self_attn.v_proj.weight", L->wv},
            {"self_attn.v_proj.bias", L->bv},           {"self_attn.o_proj.weight", L->wo},
            {"self_attn.o_proj.bias", L->bo},           {"self_attn.q_norm.weight", L->q_norm},
            {"self_attn.k_norm.weight", L->k_norm},     {"post_attention_layernorm.weight", L->ffn_norm},
            {"mlp.gate_proj.weight", L->w_gate},        {"mlp.up_proj.weight", L->w_up},
            {"mlp.down_proj.weight", L->w_down},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            if (!parts[i].t) continue;
            snprintf(name, sizeof name, "model.layers.%d.%s", l, parts[i].suffix);
            AT_TRY(fn(ctx, name, parts[i].t));
        }
    }
    AT_TRY(fn(ctx, "model.norm.weight", w->final_norm));
    if (!w->cfg.tie_word_embeddings && w->lm_head && w->lm_head != w->embed)
        AT_TRY(fn(ctx, "lm_head.weight", w->lm_head));
    return AT_OK;
}

/* ---- the list of tensors to write ---------------------------------------- */

typedef struct {
    char **names;
    const at_tensor **tensors;
    at_st_shape *shapes; /* the shape written (ndim 0: the tensor's own) */
    size_t n, cap;
} tensor_list;

static at_status list_add_shaped(tensor_list *l, const char *name, const at_tensor *t, const at_st_shape *shape)
{
    if (!t) return at_error(AT_ERR_INTERNAL, "export: %s is missing", name);
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 64;
        char **nn = realloc(l->names, c * sizeof *nn);
        if (!nn) return at_error(AT_ERR_NOMEM, "export: out of memory");
        l->names = nn;
        const at_tensor **nt = realloc(l->tensors, c * sizeof *nt);
        if (!nt) return at_error(AT_ERR_NOMEM, "export: out of memory");
        l->tensors = nt;
        at_st_shape *ns = realloc(l->shapes, c * sizeof *ns);
        if (!ns) return at_error(AT_ERR_NOMEM, "export: out of memory");
        l->shapes = ns;
        l->cap = c;
    }
    if (!(l->names[l->n] = strdup(name))) return at_error(AT_ERR_NOMEM, "export: out of memory");
    l->shapes[l->n] = shape ? *shape : (at_st_shape){0};
    l->tensors[l->n++] = t;
    return AT_OK;
}

static at_status list_add(void *ctx, const char *name, const at_tensor *t)
{
    return list_add_shaped(ctx, name, t, NULL);
}

static void list_free(tensor_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->tensors);
    free(l->shapes);
}

/* A vision-language model: the language model's model.* names under
 * model.language_model.* when the source kept them there (lm_head stays),
 * then the tower's tensors under the source's own names and shapes. */
static at_status add_vision(tensor_list *l, const at_export_vision *v)
{
    if (at_export_vision_lm_nested(v))
        for (size_t i = 0; i < l->n; i++) {
            if (strncmp(l->names[i], "model.", 6) != 0) continue;
            size_t n = strlen(l->names[i]) + 32;
            char *nn = malloc(n);
            if (!nn) return at_error(AT_ERR_NOMEM, "export: out of memory");
            snprintf(nn, n, "model.language_model.%s", l->names[i] + 6);
            free(l->names[i]);
            l->names[i] = nn;
        }
    for (size_t i = 0; i < at_export_vision_count(v); i++)
        AT_TRY(list_add_shaped(l, at_export_vision_name(v, i), at_export_vision_tensor(v, i),
                               at_export_vision_shape(v, i)));
    return AT_OK;
}

static const char *torch_dtype_name(at_dtype t)
{
    return t == AT_F32 ? "float32" : t == AT_BF16 ? "bfloat16" : "float16";
}

/* The dtype the model is "in": config torch_dtype, else its matrices'. */
static at_dtype model_dtype(const at_decoder_weights *w)
{
    if (w->cfg.has_dtype) return w->cfg.dtype;
    at_dtype t = w->layers && w->layers[0].wq ? w->layers[0].wq->dtype : w->embed->dtype;
    return t == AT_BF16 || t == AT_F16 ? t : AT_F32;
}

/* t in dtype, on the host: t itself or a converted copy (*owned, freed by the caller). */
static at_status host_as(const at_tensor *t, at_dtype dtype, const at_tensor **out, at_tensor **owned)
{
    *owned = NULL;
    if (t->dtype == dtype && at_tensor_data(t)) {
        *out = t;
        return AT_OK;
    }
    if (t->dtype != AT_F32 && t->dtype != AT_BF16 && t->dtype != AT_F16)
        return at_error(AT_ERR_UNSUPPORTED, "export: %s is %s; Hugging Face folders take f32, bf16 or f16", t->name,
                        at_dtype_name(t->dtype));
    at_tensor *c = NULL;
    AT_TRY(at_tensor_new(at_cpu_backend(), dtype, t->ndim, t->shape, t->name, &c));
    at_tensor *src_host = NULL;
    at_status st = AT_OK;
    if (!at_tensor_data(t)) { /* on a device: bring it to the host first */
        AT_CHECK(at_tensor_new(at_cpu_backend(), t->dtype, t->ndim, t->shape, t->name, &src_host));
        AT_CHECK(at_tensor_download(t, at_tensor_data(src_host), at_tensor_nbytes(src_host)));
    }
    AT_CHECK(at_cast(c, src_host ? src_host : t));
    *out = c;
    *owned = c;
    c = NULL;
done:
    at_tensor_free(src_host);
    at_tensor_free(c);
    return st;
}

/* qsort of indices by name (qsort has no context argument in C11). */
static _Thread_local char **sort_names;
static int cmp_index(const void *a, const void *b)
{
    return strcmp(sort_names[*(const size_t *)a], sort_names[*(const size_t *)b]);
}

static at_status write_json(const char *path, cJSON *j)
{
    char *text = cJSON_Print(j);
    if (!text) return at_error(AT_ERR_NOMEM, "export: out of memory for %s", path);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return at_error(AT_ERR_NOMEM, "export: out of memory");
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    at_status st = at_write_file_atomic(path, t2, n + 1);
    free(t2);
    return st;
}

/* A sequence-classification config: XForCausalLM -> XForSequenceClassification, one label. */
static at_status make_seq_cls(cJSON *j)
{
    cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *first = cJSON_IsArray(arch) ? cJSON_GetStringValue(cJSON_GetArrayItem(arch, 0)) : NULL;
    char name[128];
    const char *tail = first ? strstr(first, "ForCausalLM") : NULL;
    if (tail) snprintf(name, sizeof name, "%.*sForSequenceClassification", (int)(tail - first), first);
    else snprintf(name, sizeof name, "LlamaForSequenceClassification");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "id2label");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "label2id");
    cJSON *a = cJSON_AddArrayToObject(j, "architectures"), *i2l = cJSON_AddObjectToObject(j, "id2label"),
          *l2i = cJSON_AddObjectToObject(j, "label2id");
    if (!a || !i2l || !l2i || !cJSON_AddItemToArray(a, cJSON_CreateString(name)) ||
        !cJSON_AddStringToObject(i2l, "0", "LABEL_0") || !cJSON_AddNumberToObject(l2i, "LABEL_0", 0))
        return at_error(AT_ERR_NOMEM, "export: out of memory");
    return AT_OK;
}

static at_status write_config(const at_decoder_weights *w, const char *source_dir, at_dtype dtype, int seq_cls,
                              const char *staging)
{
    cJSON *j = NULL;
    char *src = source_dir ? at_path_join(source_dir, "config.json") : NULL;
    char *dst = at_path_join(staging, "config.json");
    at_status st = AT_OK;
    if (!dst || (source_dir && !src)) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    if (src && at_file_exists(src)) {
        AT_CHECK(at_json_parse_file(src, &j));
    } else {
        char *text = NULL;
        AT_CHECK(at_model_config_to_json(&w->cfg, &text));
        st = at_json_parse(text, strlen(text), "config.json", &j);
        free(text);
        if (st != AT_OK) goto done;
    }
    if (!cJSON_IsObject(j)) {
        st = at_error(AT_ERR_FORMAT, "%s: not a JSON object", src ? src : "config.json");
        goto done;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(j, "torch_dtype");
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype_name(dtype));
    /* the family the weights were read as (--model_type may differ from the
     * source's); a config of that family (qwen2_vl's language model is
     * qwen2) is kept as it is */
    at_model_config as_read;
    int same_family = at_model_config_from_json(j, "config.json", &as_read) == AT_OK &&
                      !strcmp(as_read.model_type, w->cfg.model_type);
    at_clear_error();
    if (!same_family) {
        char *text = NULL;
        cJSON *fresh = NULL;
        AT_CHECK(at_model_config_to_json(&w->cfg, &text));
        st = at_json_parse(text, strlen(text), "config.json", &fresh);
        free(text);
        if (st != AT_OK) goto done;
        static const char *const keys[] = {"model_type", "architectures"};
        for (size_t i = 0; i < 2; i++) {
            cJSON_DeleteItemFromObjectCaseSensitive(j, keys[i]);
            cJSON_AddItemToObject(j, keys[i], cJSON_DetachItemFromObjectCaseSensitive(fresh, keys[i]));
        }
        cJSON_Delete(fresh);
    }
    if (seq_cls) AT_CHECK(make_seq_cls(j));
    st = write_json(dst, j);
done:
    cJSON_Delete(j);
    free(src);
    free(dst);
    return st;
}

static at_status copy_if_present(const char *dir, const char *name, const char *staging)
{
    if (!dir) return AT_OK;
    char *src = at_path_join(dir, name), *dst = at_path_join(staging, name);
    at_status st = AT_OK;
    if (!src || !dst) st = at_error(AT_ERR_NOMEM, "export: out of memory");
    else if (at_file_exists(src) && !at_is_dir(src)) st = at_export_copy_file(src, dst);
    free(src);
    free(dst);
    return st;
}

/* Writes the tensors of one shard, converted to dtype. */
static at_status write_shard(const tensor_list *l, size_t begin, size_t end, at_dtype dtype, const char *path,
                             at_progress *bar, int64_t *done_bytes)
{
    size_t n = end - begin;
    const at_tensor **ts = calloc(n, sizeof *ts);
    at_tensor **owned = calloc(n, sizeof *owned);
    at_status st = AT_OK;
    if (!ts || !owned) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        AT_CHECK(host_as(l->tensors[begin + i], dtype, &ts[i], &owned[i]));
        *done_bytes += (int64_t)at_tensor_nbytes(ts[i]);
        if (bar) at_progress_update(bar, *done_bytes, NULL);
    }
    const at_st_kv meta[] = {{"format", "pt"}};
    st = at_safetensors_write_shaped(path, ts, (const char *const *)l->names + begin, l->shapes + begin, n, meta, 1);
done:
    for (size_t i = 0; owned && i < n; i++) at_tensor_free(owned[i]);
    free(owned);
    free(ts);
    return st;
}

at_status at_export_hf(const at_decoder_weights *w, const char *out_dir, const at_export_hf_opts *o)
{
    at_export_hf_opts def = {.dtype = AT_DTYPE_COUNT};
    if (!o) o = &def;
    if (!w) return at_error(AT_ERR_INVALID, "export: no weights");
    at_dtype dtype = o->dtype == AT_DTYPE_COUNT ? model_dtype(w) : o->dtype;
    if (dtype != AT_F32 && dtype != AT_BF16 && dtype != AT_F16)
        return at_error(AT_ERR_INVALID, "export: Hugging Face folders are f32, bf16 or f16, not %s",
                        at_dtype_name(dtype));
    int64_t max_shard = o->max_shard_size > 0 ? o->max_shard_size : DEFAULT_SHARD;
    tensor_list l = {0};
    char *staging = NULL, *path = NULL;
    size_t *shard_of = NULL, n_shards = 0;
    cJSON *index = NULL, *tok_json = NULL, *tok_cfg = NULL, *tok_map = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_export_each_hf_tensor(w, list_add, &l));
    if (o->vision) AT_CHECK(add_vision(&l, o->vision));
    if (o->score) { /* a reward model: the score head, no LM head */
        if (l.n && !strcmp(l.names[l.n - 1], "lm_head.weight")) free(l.names[--l.n]);
        AT_CHECK(list_add(&l, "score.weight", o->score));
    }
    /* The tokenizer files are built before any shard is written: a tokenizer
     * with no Hugging Face form fails in a moment, not after gigabytes. */
    if (o->tokenizer) {
        at_tokenizer_hf_opts to = {.chat_template = o->chat_template,
                                   .model_max_length = w->cfg.max_position_embeddings};
        AT_CHECK(at_tokenizer_hf_build(o->tokenizer, &to, &tok_json, &tok_cfg, &tok_map));
    }

    /* Shards as save_pretrained makes them: tensors in order, a new file when
     * the next tensor would take this one past max_shard_size. */
    shard_of = calloc(l.n + 1, sizeof *shard_of);
    if (!shard_of) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    int64_t cur = 0, total = 0;
    for (size_t i = 0; i < l.n; i++) {
        int64_t b = (int64_t)at_dtype_bytes(dtype, (size_t)at_tensor_numel(l.tensors[i]));
        if (n_shards == 0 || (cur > 0 && cur + b > max_shard)) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += b;
        total += b;
    }

    AT_CHECK(at_export_begin(out_dir, o->overwrite, &staging));
    at_progress bar;
    if (o->progress) at_progress_start(&bar, "export safetensors", total, NULL);
    int64_t done_bytes = 0;
    if (n_shards > 1 && !(index = cJSON_CreateObject())) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    for (size_t s = 0, begin = 0; s < n_shards; s++) {
        size_t end = begin;
        while (end < l.n && shard_of[end] == s) end++;
        char fname[64];
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        free(path);
        if (!(path = at_path_join(staging, fname))) {
            st = at_error(AT_ERR_NOMEM, "export: out of memory");
            goto done;
        }
        AT_CHECK(write_shard(&l, begin, end, dtype, path, o->progress ? &bar : NULL, &done_bytes));
        begin = end;
    }
    if (o->progress) at_progress_finish(&bar, NULL);
    if (index) {
        /* weight_map sorted by name, as transformers writes it */
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON *wm = cJSON_AddObjectToObject(index, "weight_map");
        size_t *order = malloc(l.n * sizeof *order);
        if (!meta || !wm || !order) {
            free(order);
            st = at_error(AT_ERR_NOMEM, "export: out of memory");
            goto done;
        }
        for (size_t i = 0; i < l.n; i++) order[i] = i;
        sort_names = l.names;
        qsort(order, l.n, sizeof *order, cmp_index);
        for (size_t k = 0; k < l.n; k++) {
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", shard_of[order[k]] + 1, n_shards);
            if (!cJSON_AddStringToObject(wm, l.names[order[k]], fname)) {
                free(order);
                st = at_error(AT_ERR_NOMEM, "export: out of memory");
                goto done;
            }
        }
        free(order);
        free(path);
        if (!(path = at_path_join(staging, "model.safetensors.index.json"))) {
            st = at_error(AT_ERR_NOMEM, "export: out of memory");
            goto done;
        }
        AT_CHECK(write_json(path, index));
    }
    AT_CHECK(write_config(w, o->source_dir, dtype, o->score != NULL, staging));
    AT_CHECK(copy_if_present(o->source_dir, "generation_config.json", staging));
    /* a vision-language model's image (and video) processor */
    AT_CHECK(copy_if_present(o->source_dir, "preprocessor_config.json", staging));
    AT_CHECK(copy_if_present(o->source_dir, "video_preprocessor_config.json", staging));
    if (o->tokenizer) {
        AT_CHECK(at_tokenizer_hf_save(tok_json, tok_cfg, tok_map, staging));
    } else {
        const char *tdir = o->tokenizer_dir ? o->tokenizer_dir : o->source_dir;
        for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++)
            AT_CHECK(copy_if_present(tdir, tokenizer_files[i], staging));
    }
    AT_CHECK(at_export_commit(staging, out_dir));
    at_log_info("export: wrote %s (%zu tensors, %s, %zu file%s)", out_dir, l.n, torch_dtype_name(dtype), n_shards,
                n_shards == 1 ? "" : "s");
done:
    if (st != AT_OK) at_export_abort(staging);
    free(staging);
    free(path);
    free(shard_of);
    cJSON_Delete(index);
    cJSON_Delete(tok_json);
    cJSON_Delete(tok_cfg);
    cJSON_Delete(tok_map);
    list_free(&l);
    return st;
}

at_status at_export_peft(const at_adapter *a, const char *out_dir, int overwrite)
{
    if (!a) return at_error(AT_ERR_INVALID, "export: no adapter");
    char *staging = NULL;
    at_status st;
    AT_CHECK(at_export_begin(out_dir, overwrite, &staging));
    AT_CHECK(at_adapter_save(a, staging));
    AT_CHECK(at_export_commit(staging, out_dir));
done:
    if (st != AT_OK) at_export_abort(staging);
    free(staging);
    return st;
}
