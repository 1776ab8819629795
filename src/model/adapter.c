#include "model/adapter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "base/manifest.h"
#include "base/rng.h"
#include "device/cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/qk_permute.h"
#include "model/safetensors.h"

static const char *const module_names[AT_MOD_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};

const char *at_module_name(at_module m) { return m < AT_MOD_COUNT ? module_names[m] : "?"; }

const char *at_module_parent(at_module m) { return m <= AT_MOD_O ? "self_attn" : "mlp"; }

void at_module_dims(const at_model_config *cfg, at_module m, int64_t *in, int64_t *out)
{
    int64_t h = cfg->hidden_size, q = (int64_t)cfg->num_attention_heads * cfg->head_dim;
    int64_t kv = (int64_t)cfg->num_key_value_heads * cfg->head_dim, im = cfg->intermediate_size;
    switch (m) {
    case AT_MOD_Q: *in = h; *out = q; break;
    case AT_MOD_K: case AT_MOD_V: *in = h; *out = kv; break;
    case AT_MOD_O: *in = q; *out = h; break;
    case AT_MOD_GATE: case AT_MOD_UP: *in = h; *out = im; break;
    default: *in = im; *out = h; break;
    }
}

at_status at_parse_target_modules(const char *const *items, int n, unsigned *mask)
{
    *mask = 0;
    for (int i = 0; i < n; i++) {
        const char *s = items[i];
        if (!strcmp(s, "all-linear") || !strcmp(s, "all_linear") || !strcmp(s, "all")) {
            *mask |= (1u << AT_MOD_COUNT) - 1;
            continue;
        }
        int found = 0;
        for (int m = 0; m < AT_MOD_COUNT; m++)
            if (!strcmp(s, module_names[m])) {
                *mask |= 1u << m;
                found = 1;
            }
        if (!found)
            return at_error(AT_ERR_INVALID,
                            "--target_modules: unknown module \"%s\" (use all-linear or any of q_proj, k_proj, "
                            "v_proj, o_proj, gate_proj, up_proj, down_proj)",
                            s);
    }
    if (!*mask) return at_error(AT_ERR_INVALID, "--target_modules: no module given");
    return AT_OK;
}

void at_adapter_tensor_name(int layer, at_module m, const char *which, char *buf, size_t len)
{
    snprintf(buf, len, "base_model.model.model.layers.%d.%s.%s.%s.weight", layer, at_module_parent(m),
             at_module_name(m), which);
}

at_lora_pair *at_adapter_pair(at_adapter *a, int layer, at_module m)
{
    return &a->mods[(size_t)layer * AT_MOD_COUNT + m];
}

static double lora_scale(double alpha, int rank, int rslora)
{
    return rslora ? alpha / sqrt((double)rank) : alpha / rank;
}

/* Allocates the struct and, for every targeted module, A and B (zeroed). */
static at_status adapter_alloc(const at_model_config *cfg, at_backend *be, int rank, double alpha, double dropout,
                               int use_rslora, unsigned mask, at_adapter **out)
{
    *out = NULL;
    if (rank < 1 || rank > 65536) return at_error(AT_ERR_INVALID, "--lora_rank %d: must be between 1 and 65536", rank);
    if (!(dropout >= 0 && dropout < 1)) return at_error(AT_ERR_INVALID, "--lora_dropout %g: must be in [0, 1)", dropout);
    at_adapter *a = calloc(1, sizeof *a);
    if (!a) return at_error(AT_ERR_NOMEM, "out of memory");
    a->rank = rank;
    a->alpha = alpha;
    a->dropout = dropout;
    a->use_rslora = use_rslora;
    a->scale = lora_scale(alpha, rank, use_rslora);
    a->target_mask = mask;
    a->n_layers = cfg->num_hidden_layers;
    a->backend = be;
    a->mods = calloc((size_t)a->n_layers * AT_MOD_COUNT, sizeof *a->mods);
    if (!a->mods) {
        free(a);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    at_status st = AT_OK;
    for (int l = 0; l < a->n_layers && st == AT_OK; l++) {
        for (int m = 0; m < AT_MOD_COUNT && st == AT_OK; m++) {
            if (!(mask & (1u << m))) continue;
            int64_t in, outf;
            at_module_dims(cfg, (at_module)m, &in, &outf);
            at_lora_pair *p = at_adapter_pair(a, l, (at_module)m);
            char name[160];
            int64_t sa[2] = {rank, in}, sb[2] = {outf, rank};
            at_adapter_tensor_name(l, (at_module)m, "lora_A", name, sizeof name);
            st = at_tensor_zeros(be, AT_F32, 2, sa, name, &p->A);
            if (st != AT_OK) break;
            at_adapter_tensor_name(l, (at_module)m, "lora_B", name, sizeof name);
            st = at_tensor_zeros(be, AT_F32, 2, sb, name, &p->B);
        }
    }
    if (st != AT_OK) {
        at_adapter_free(a);
        return st;
    }
    *out = a;
    return AT_OK;
}

void at_adapter_free(at_adapter *a)
{
    if (!a) return;
    for (size_t i = 0; a->mods && i < (size_t)a->n_layers * AT_MOD_COUNT; i++) {
        at_tensor_free(a->mods[i].A);
        at_tensor_free(a->mods[i].B);
    }
    free(a->mods);
    free(a);
}

at_status at_adapter_new(const at_model_config *cfg, at_backend *be, int rank, double alpha, double dropout,
                         int use_rslora, unsigned target_mask, uint64_t seed, at_adapter **out)
{
    AT_TRY(adapter_alloc(cfg, be, rank, alpha, dropout, use_rslora, target_mask, out));
    at_adapter *a = *out;
    at_rng rng;
    at_rng_seed(&rng, seed);
    at_status st = AT_OK;
    for (int l = 0; l < a->n_layers && st == AT_OK; l++) {
        for (int m = 0; m < AT_MOD_COUNT && st == AT_OK; m++) {
            at_lora_pair *p = at_adapter_pair(a, l, (at_module)m);
            if (!p->A) continue;
            /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain·sqrt(3/fan_in) = 1/sqrt(fan_in) */
            int64_t n = at_tensor_numel(p->A), fan_in = p->A->shape[1];
            float bound = (float)(1.0 / sqrt((double)fan_in));
            float *host = malloc((size_t)n * sizeof *host);
            if (!host) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
            for (int64_t i = 0; i < n; i++) host[i] = (2.0f * at_rng_uniform(&rng) - 1.0f) * bound;
            st = at_tensor_upload(p->A, host, (size_t)n * sizeof *host);
            free(host);
        }
    }
    if (st != AT_OK) {
        at_adapter_free(a);
        *out = NULL;
    }
    return st;
}

const char *at_adapter_tower_name(const char *name)
{
    static const char *const prefixes[] = {"base_model.model.model.", "base_model.model.", "model.", ""};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n = strlen(prefixes[i]);
        if (!strncmp(name, prefixes[i], n) && !strncmp(name + n, "visual.", 7)) return name + n;
    }
    return NULL;
}

int at_adapter_has_tower(const char *dir)
{
    char *path = dir && at_is_dir(dir) ? at_path_join(dir, "adapter_model.safetensors") : NULL;
    at_st_file *f = NULL;
    int found = 0;
    if (path && at_file_exists(path) && at_st_open(path, &f) == AT_OK)
        for (size_t k = 0; k < at_st_count(f) && !found; k++) found = at_adapter_tower_name(at_st_info_at(f, k)->name) != NULL;
    at_clear_error();
    at_st_close(f);
    free(path);
    return found;
}

at_status at_adapter_save(const at_adapter *a, const char *dir)
{
    return at_adapter_save_with(a, dir, NULL, 0);
}

at_status at_adapter_save_with(const at_adapter *a, const char *dir, const at_tensor *const *extra, size_t n_extra)
{
    at_status st = AT_OK;
    char *cfg_path = at_path_join(dir, "adapter_config.json");
    char *st_path = at_path_join(dir, "adapter_model.safetensors");
    cJSON *j = cJSON_CreateObject();
    const at_tensor **tensors = calloc((size_t)a->n_layers * AT_MOD_COUNT * 2 + n_extra, sizeof *tensors);
    char *text = NULL;
    if (!cfg_path || !st_path || !j || !tensors) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    cJSON_AddObjectToObject(j, "alpha_pattern");
    cJSON_AddNullToObject(j, "auto_mapping");
    if (a->base_model[0]) cJSON_AddStringToObject(j, "base_model_name_or_path", a->base_model);
    else cJSON_AddNullToObject(j, "base_model_name_or_path");
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    cJSON_AddNullToObject(j, "layers_pattern");
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddNumberToObject(j, "lora_alpha", a->alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", a->dropout);
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddNumberToObject(j, "r", a->rank);
    cJSON_AddObjectToObject(j, "rank_pattern");
    cJSON_AddNullToObject(j, "revision");
    cJSON *tm = cJSON_AddArrayToObject(j, "target_modules");
    for (int m = 0; m < AT_MOD_COUNT; m++)
        if (a->target_mask & (1u << m)) cJSON_AddItemToArray(tm, cJSON_CreateString(module_names[m]));
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddBoolToObject(j, "use_dora", 0);
    cJSON_AddBoolToObject(j, "use_rslora", a->use_rslora);
    text = cJSON_Print(j);
    if (!text) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_write_file_atomic(cfg_path, text, strlen(text)));
    size_t n = 0;
    for (size_t i = 0; i < (size_t)a->n_layers * AT_MOD_COUNT; i++) {
        if (!a->mods[i].A) continue;
        tensors[n++] = a->mods[i].A;
        tensors[n++] = a->mods[i].B;
    }
    for (size_t i = 0; i < n_extra; i++) tensors[n++] = extra[i];
    at_st_kv meta[1] = {{"format", "pt"}};
    AT_CHECK(at_safetensors_write(st_path, (const at_tensor *const *)tensors, NULL, n, meta, 1));
done:
    free(text);
    cJSON_Delete(j);
    free((void *)tensors);
    free(cfg_path);
    free(st_path);
    return st;
}

/* at_adapter_load of a LoRA GGUF file (adapter.h). */
static at_status load_gguf(const char *path, const at_model_config *cfg, at_backend *be, at_adapter **out)
{
    at_gguf *g = NULL;
    at_adapter *a = NULL;
    at_tensor *t = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_gguf_open(path, &g));
    const char *s = NULL;
    size_t len = 0;
    if (at_gguf_get_string(g, "general.type", &s, &len) != AT_OK || len != 7 || memcmp(s, "adapter", 7) != 0 ||
        at_gguf_get_string(g, "adapter.type", &s, &len) != AT_OK || len != 4 || memcmp(s, "lora", 4) != 0) {
        st = at_error(AT_ERR_FORMAT, "%s: not a LoRA adapter GGUF (general.type \"adapter\", adapter.type \"lora\")",
                      path);
        goto done;
    }
    double alpha = 0;
    at_gguf_get_float(g, "adapter.lora.alpha", &alpha);
    /* which modules are adapted, and the rank, from the lora_a tensors */
    unsigned mask = 0;
    int64_t rank = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            char hf[160], base[160], name[200];
            snprintf(hf, sizeof hf, "model.layers.%d.%s.%s.weight", l, at_module_parent((at_module)m), module_names[m]);
            if (!at_gguf_name_from_hf(hf, base, sizeof base)) continue;
            snprintf(name, sizeof name, "%s.lora_a", base);
            const at_gguf_tensor_info *ti = at_gguf_find_tensor(g, name);
            if (!ti) continue;
            mask |= 1u << m;
            if (!rank) rank = (int64_t)ti->ne[1];
        }
    if (!mask || rank < 1) {
        st = at_error(AT_ERR_FORMAT, "%s: no LoRA tensors (blk.N.*.weight.lora_a) for this model's layers", path);
        goto done;
    }
    /* llama.cpp: scale = alpha / rank, and 1 when no alpha is given */
    AT_CHECK(adapter_alloc(cfg, be, (int)rank, alpha > 0 ? alpha : (double)rank, 0, 0, mask, &a));
    int interleaved = at_gguf_qk_interleaved(g);
    for (int l = 0; l < a->n_layers; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *p = at_adapter_pair(a, l, (at_module)m);
            if (!p->A) continue;
            char hf[160], base[160], name[200];
            snprintf(hf, sizeof hf, "model.layers.%d.%s.%s.weight", l, at_module_parent((at_module)m), module_names[m]);
            at_gguf_name_from_hf(hf, base, sizeof base);
            for (int w = 0; w < 2; w++) {
                at_tensor *dst = w ? p->B : p->A;
                snprintf(name, sizeof name, "%s.%s", base, w ? "lora_b" : "lora_a");
                AT_CHECK(at_gguf_get_tensor(g, name, AT_F32, &t));
                if (t->ndim != 2 || t->shape[0] != dst->shape[0] || t->shape[1] != dst->shape[1]) {
                    st = at_error(AT_ERR_FORMAT, "%s: %s is [%lld, %lld], the model needs [%lld, %lld] (an adapter of "
                                  "another model?)", path, name, (long long)t->shape[0],
                                  (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)dst->shape[0],
                                  (long long)dst->shape[1]);
                    goto done;
                }
                if (w && interleaved && (m == AT_MOD_Q || m == AT_MOD_K)) {
                    at_tensor *c = NULL; /* t maps the file: permute a copy */
                    AT_CHECK(at_tensor_new(at_cpu_backend(), AT_F32, 2, t->shape, name, &c));
                    memcpy(at_tensor_data(c), at_tensor_data(t), at_tensor_nbytes(t));
                    at_tensor_free(t);
                    t = c;
                    AT_CHECK(at_qk_permute_tensor(t, m == AT_MOD_Q ? cfg->num_attention_heads : cfg->num_key_value_heads,
                                                  AT_QK_TO_HALVES));
                }
                AT_CHECK(at_tensor_upload(dst, at_tensor_data(t), at_tensor_nbytes(t)));
                at_tensor_free(t);
                t = NULL;
            }
        }
    *out = a;
    a = NULL;
done:
    at_tensor_free(t);
    at_adapter_free(a);
    at_gguf_close(g);
    return st;
}

at_status at_adapter_load(const char *dir, const at_model_config *cfg, at_backend *be, at_adapter **out)
{
    *out = NULL;
    if (!at_is_dir(dir) && at_file_exists(dir)) return load_gguf(dir, cfg, be, out);
    char *cfg_path = at_path_join(dir, "adapter_config.json");
    char *st_path = at_path_join(dir, "adapter_model.safetensors");
    cJSON *j = NULL;
    at_st_model *sm = NULL;
    at_adapter *a = NULL;
    at_status st = AT_OK;
    if (!cfg_path || !st_path) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_manifest_check(dir)); /* a checkpoint or export of ours: nothing changed since */
    AT_CHECK(at_json_parse_file(cfg_path, &j));
    const char *peft_type = NULL, *bias = NULL;
    if (at_json_get_string(j, "peft_type", cfg_path, &peft_type) == AT_OK && strcmp(peft_type, "LORA") != 0) {
        st = at_error(AT_ERR_UNSUPPORTED, "%s: peft_type %s is not supported (only LORA)", cfg_path, peft_type);
        goto done;
    }
    if (at_json_get_string(j, "bias", cfg_path, &bias) == AT_OK && strcmp(bias, "none") != 0) {
        st = at_error(AT_ERR_UNSUPPORTED, "%s: bias \"%s\" is not supported (only \"none\")", cfg_path, bias);
        goto done;
    }
    int flag = 0;
    if (at_json_get_bool(j, "use_dora", cfg_path, &flag) == AT_OK && flag) {
        st = at_error(AT_ERR_UNSUPPORTED, "%s: DoRA adapters are not supported", cfg_path);
        goto done;
    }
    const cJSON *ltt = cJSON_GetObjectItemCaseSensitive(j, "layers_to_transform");
    if (ltt && !cJSON_IsNull(ltt)) {
        st = at_error(AT_ERR_UNSUPPORTED, "%s: layers_to_transform is not supported", cfg_path);
        goto done;
    }
    long long r = 0;
    if (at_json_get_int(j, "r", cfg_path, &r) != AT_OK) {
        st = at_error(AT_ERR_FORMAT, "%s: \"r\" (the LoRA rank) is missing or not an integer", cfg_path);
        goto done;
    }
    double alpha = (double)r, dropout = 0;
    at_json_get_double(j, "lora_alpha", cfg_path, &alpha);
    at_json_get_double(j, "lora_dropout", cfg_path, &dropout);
    int rslora = 0;
    at_json_get_bool(j, "use_rslora", cfg_path, &rslora);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    unsigned mask = 0;
    if (cJSON_IsString(tm)) {
        const char *item = tm->valuestring;
        if (at_parse_target_modules(&item, 1, &mask) != AT_OK) {
            st = at_error_wrap(AT_ERR_FORMAT, "%s", cfg_path);
            goto done;
        }
    } else if (cJSON_IsArray(tm)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, tm)
        {
            unsigned one = 0;
            if (!cJSON_IsString(it) || at_parse_target_modules((const char *const *)&it->valuestring, 1, &one) != AT_OK) {
                st = at_error(AT_ERR_FORMAT, "%s: target_modules holds an unsupported entry", cfg_path);
                goto done;
            }
            mask |= one;
        }
    } else {
        st = at_error(AT_ERR_FORMAT, "%s: target_modules is missing", cfg_path);
        goto done;
    }
    AT_CHECK(adapter_alloc(cfg, be, (int)r, alpha, dropout, rslora, mask, &a));
    const char *base = NULL;
    if (at_json_get_string(j, "base_model_name_or_path", cfg_path, &base) == AT_OK)
        snprintf(a->base_model, sizeof a->base_model, "%s", base);
    AT_CHECK(at_st_model_open(st_path, &sm));
    for (int l = 0; l < a->n_layers; l++) {
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *p = at_adapter_pair(a, l, (at_module)m);
            if (!p->A) continue;
            at_tensor *pair[2] = {p->A, p->B};
            const char *which[2] = {"lora_A", "lora_B"};
            for (int w = 0; w < 2; w++) {
                char name[160];
                at_adapter_tensor_name(l, (at_module)m, which[w], name, sizeof name);
                at_tensor *t = NULL;
                /* peft may write the names without ".weight" suffix variants; ours is the standard one */
                AT_CHECK(at_st_get(sm, name, 2, pair[w]->shape, AT_F32, &t));
                st = at_tensor_upload(pair[w], at_tensor_data(t), at_tensor_nbytes(t));
                at_tensor_free(t);
                if (st != AT_OK) goto done;
            }
        }
    }
    *out = a;
    a = NULL;
done:
    at_adapter_free(a);
    at_st_model_close(sm);
    cJSON_Delete(j);
    free(cfg_path);
    free(st_path);
    return st;
}
