#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "model/gguf.h"

void at_model_config_init(at_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->rms_norm_eps = 1e-6;
    cfg->rope_theta = 10000.0;
    cfg->rope_type = AT_ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    cfg->bos_token_id = -1;
}

/* ---- config.json -------------------------------------------------------- */

static at_status req_int(const cJSON *obj, const char *key, const char *what, int *out)
{
    long long v;
    at_status st = at_json_get_int(obj, key, what, &v);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: \"%s\" is missing", what, key);
    if (st != AT_OK) return st;
    if (v <= 0 || v > 0x7fffffff) return at_error(AT_ERR_FORMAT, "%s: \"%s\" = %lld is out of range", what, key, v);
    *out = (int)v;
    return AT_OK;
}

/* Optional: *out unchanged when absent or null. */
static at_status opt_int(const cJSON *obj, const char *key, const char *what, int *out)
{
    long long v;
    at_status st = at_json_get_int(obj, key, what, &v);
    if (st == AT_ERR_NOT_FOUND) return AT_OK;
    if (st != AT_OK) return st;
    if (v < -1 || v > 0x7fffffff) return at_error(AT_ERR_FORMAT, "%s: \"%s\" = %lld is out of range", what, key, v);
    *out = (int)v;
    return AT_OK;
}

static at_status opt_i64(const cJSON *obj, const char *key, const char *what, int64_t *out)
{
    long long v;
    at_status st = at_json_get_int(obj, key, what, &v);
    if (st == AT_ERR_NOT_FOUND) return AT_OK;
    if (st != AT_OK) return st;
    if (v < 0) return at_error(AT_ERR_FORMAT, "%s: \"%s\" = %lld is negative", what, key, v);
    *out = v;
    return AT_OK;
}

static at_status opt_double(const cJSON *obj, const char *key, const char *what, double *out)
{
    at_status st = at_json_get_double(obj, key, what, out);
    return st == AT_ERR_NOT_FOUND ? AT_OK : st;
}

static at_status opt_bool(const cJSON *obj, const char *key, const char *what, int *out)
{
    at_status st = at_json_get_bool(obj, key, what, out);
    return st == AT_ERR_NOT_FOUND ? AT_OK : st;
}

static at_status req_double_in(const cJSON *obj, const char *key, const char *what, double *out)
{
    at_status st = at_json_get_double(obj, key, what, out);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: rope_scaling needs \"%s\"", what, key);
    return st;
}

/* rope_scaling.mrope_section: three non-negative integers (their sum is
 * checked against head_dim by at_model_config_validate). */
static at_status parse_mrope_section(const cJSON *rs, const char *what, at_model_config *cfg)
{
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(rs, "mrope_section");
    if (!ms || cJSON_IsNull(ms)) return AT_OK;
    int k = 0;
    for (const cJSON *c = cJSON_IsArray(ms) ? ms->child : NULL; c; c = c->next, k++) {
        if (k >= 3 || !cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 0 ||
            c->valuedouble > AT_MAX_ROPE_PAIRS)
            break;
        cfg->mrope_section[k] = (int)c->valuedouble;
    }
    if (!cJSON_IsArray(ms) || k != 3 || cJSON_GetArraySize(ms) != 3)
        return at_error(AT_ERR_FORMAT, "%s: rope_scaling.mrope_section must be three integers in [0, %d]", what,
                        AT_MAX_ROPE_PAIRS);
    return opt_bool(rs, "mrope_interleaved", what, &cfg->mrope_interleaved);
}

static at_status parse_rope_scaling(const cJSON *rs, const char *what, at_model_config *cfg)
{
    if (!rs || cJSON_IsNull(rs)) return AT_OK;
    if (!cJSON_IsObject(rs)) return at_error(AT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", what);
    AT_TRY(parse_mrope_section(rs, what, cfg));
    const char *type = NULL;
    /* Newer files say "rope_type", older ones "type". */
    at_status st = at_json_get_string(rs, "rope_type", what, &type);
    if (st == AT_ERR_NOT_FOUND) st = at_json_get_string(rs, "type", what, &type);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: rope_scaling has no \"rope_type\" or \"type\"", what);
    if (st != AT_OK) return st;
    /* Qwen2-VL's files say "mrope": default frequencies, three positions
     * (transformers reads it as "default" with mrope_section) */
    if (strcmp(type, "default") == 0 || strcmp(type, "mrope") == 0) {
        cfg->rope_type = AT_ROPE_DEFAULT;
        return AT_OK;
    }
    if (strcmp(type, "linear") == 0) {
        cfg->rope_type = AT_ROPE_LINEAR;
        return req_double_in(rs, "factor", what, &cfg->rope_factor);
    }
    if (strcmp(type, "llama3") == 0) {
        cfg->rope_type = AT_ROPE_LLAMA3;
        AT_TRY(req_double_in(rs, "factor", what, &cfg->rope_factor));
        AT_TRY(req_double_in(rs, "low_freq_factor", what, &cfg->rope_low_freq_factor));
        AT_TRY(req_double_in(rs, "high_freq_factor", what, &cfg->rope_high_freq_factor));
        long long o;
        st = at_json_get_int(rs, "original_max_position_embeddings", what, &o);
        if (st == AT_ERR_NOT_FOUND)
            return at_error(AT_ERR_FORMAT, "%s: rope_scaling needs \"original_max_position_embeddings\"", what);
        if (st != AT_OK) return st;
        cfg->rope_original_max_position_embeddings = o;
        return AT_OK;
    }
    return at_error(AT_ERR_UNSUPPORTED, "%s: rope_scaling type \"%.40s\" is not supported (default, linear, llama3 are)",
                    what, type);
}

static at_status parse_dtype(const cJSON *obj, const char *what, at_model_config *cfg)
{
    const char *s = NULL;
    at_status st = at_json_get_string(obj, "torch_dtype", what, &s);
    if (st == AT_ERR_NOT_FOUND) st = at_json_get_string(obj, "dtype", what, &s); /* transformers >= 4.56 */
    if (st == AT_ERR_NOT_FOUND) return AT_OK;
    if (st != AT_OK) return st;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", s);
    if (strcmp(s, "bfloat16") == 0) cfg->dtype = AT_BF16, cfg->has_dtype = 1;
    else if (strcmp(s, "float16") == 0) cfg->dtype = AT_F16, cfg->has_dtype = 1;
    else if (strcmp(s, "float32") == 0) cfg->dtype = AT_F32, cfg->has_dtype = 1;
    return AT_OK;
}

static at_status parse_token_ids(const cJSON *obj, const char *what, at_model_config *cfg)
{
    AT_TRY(opt_int(obj, "bos_token_id", what, &cfg->bos_token_id));
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, "eos_token_id");
    if (!e || cJSON_IsNull(e)) return AT_OK;
    if (cJSON_IsNumber(e)) {
        int id = -1;
        AT_TRY(opt_int(obj, "eos_token_id", what, &id));
        if (id >= 0) cfg->eos_token_ids[cfg->n_eos++] = id;
        return AT_OK;
    }
    if (!cJSON_IsArray(e)) return at_error(AT_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list", what);
    for (const cJSON *c = e->child; c; c = c->next) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 0 ||
            c->valuedouble > 0x7fffffff)
            return at_error(AT_ERR_FORMAT, "%s: \"eos_token_id\" holds a non-integer", what);
        if (cfg->n_eos == AT_MAX_EOS_IDS)
            return at_error(AT_ERR_UNSUPPORTED, "%s: more than %d eos_token_id values", what, AT_MAX_EOS_IDS);
        cfg->eos_token_ids[cfg->n_eos++] = (int)c->valuedouble;
    }
    return AT_OK;
}

/* model_type and architecture of each model read, and the family its
 * language model is read as: itself, or for a vision-language model the
 * decoder it wraps (its vision side is vision_config.h's). */
static const struct {
    const char *type, *arch, *family;
} known_types[] = {
    {"llama", "LlamaForCausalLM", "llama"},
    {"mistral", "MistralForCausalLM", "mistral"},
    {"qwen2", "Qwen2ForCausalLM", "qwen2"},
    {"qwen3", "Qwen3ForCausalLM", "qwen3"},
    {"qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2"},
    {"qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2"},
    {"qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen3"},
};

static at_status parse_model_type(const cJSON *obj, const char *what, at_model_config *cfg)
{
    const char *mt = NULL;
    at_status st = at_json_get_string(obj, "model_type", what, &mt);
    if (st != AT_OK && st != AT_ERR_NOT_FOUND) return st;
    if (st == AT_ERR_NOT_FOUND) { /* fall back on "architectures" */
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, "architectures");
        const cJSON *a0 = cJSON_IsArray(a) ? a->child : NULL;
        for (size_t i = 0; a0 && cJSON_IsString(a0) && i < sizeof known_types / sizeof known_types[0]; i++)
            if (strcmp(a0->valuestring, known_types[i].arch) == 0) mt = known_types[i].type;
        if (!mt) return at_error(AT_ERR_FORMAT, "%s: no \"model_type\" (and no known \"architectures\")", what);
    }
    for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
        if (strcasecmp(mt, known_types[i].type) == 0) {
            snprintf(cfg->model_type, sizeof cfg->model_type, "%s", known_types[i].family);
            return AT_OK;
        }
    return at_error(AT_ERR_UNSUPPORTED, "%s: model_type \"%.40s\" is not supported (llama, mistral, qwen2, qwen3, qwen2_vl, "
                    "qwen2_5_vl, qwen3_vl are)", what, mt);
}

at_status at_model_config_from_json(const cJSON *obj, const char *what, at_model_config *cfg)
{
    at_model_config_init(cfg);
    if (!what) what = "config.json";
    if (!cJSON_IsObject(obj)) return at_error(AT_ERR_FORMAT, "%s: not a JSON object", what);
    AT_TRY(parse_model_type(obj, what, cfg));
    /* transformers >= 4.52 writes a vision-language model's language side in
     * "text_config"; older files (and the hub's Qwen2-VL) keep it flat */
    const cJSON *top = obj, *tc = cJSON_GetObjectItemCaseSensitive(top, "text_config");
    if (cJSON_IsObject(tc) && !cJSON_GetObjectItemCaseSensitive(top, "hidden_size")) obj = tc;
    int is_llama = strcmp(cfg->model_type, "llama") == 0;
    int is_mistral = strcmp(cfg->model_type, "mistral") == 0;
    int is_qwen2 = strcmp(cfg->model_type, "qwen2") == 0;
    int is_qwen3 = strcmp(cfg->model_type, "qwen3") == 0;

    AT_TRY(req_int(obj, "hidden_size", what, &cfg->hidden_size));
    AT_TRY(req_int(obj, "intermediate_size", what, &cfg->intermediate_size));
    AT_TRY(req_int(obj, "num_hidden_layers", what, &cfg->num_hidden_layers));
    AT_TRY(req_int(obj, "num_attention_heads", what, &cfg->num_attention_heads));
    AT_TRY(req_int(obj, "vocab_size", what, &cfg->vocab_size));
    cfg->num_key_value_heads = cfg->num_attention_heads;
    AT_TRY(opt_int(obj, "num_key_value_heads", what, &cfg->num_key_value_heads));
    cfg->head_dim = 0;
    AT_TRY(opt_int(obj, "head_dim", what, &cfg->head_dim));
    if (cfg->head_dim <= 0) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0)
            return at_error(AT_ERR_FORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", what,
                            cfg->hidden_size, cfg->num_attention_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    AT_TRY(opt_i64(obj, "max_position_embeddings", what, &cfg->max_position_embeddings));
    AT_TRY(opt_double(obj, "rms_norm_eps", what, &cfg->rms_norm_eps));

    /* RoPE: transformers >= 4.56 may nest theta and scaling in "rope_parameters". */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(obj, "rope_parameters");
    if (cJSON_IsObject(rp)) {
        AT_TRY(opt_double(rp, "rope_theta", what, &cfg->rope_theta));
        AT_TRY(parse_rope_scaling(rp, what, cfg));
    }
    AT_TRY(opt_double(obj, "rope_theta", what, &cfg->rope_theta));
    AT_TRY(parse_rope_scaling(cJSON_GetObjectItemCaseSensitive(obj, "rope_scaling"), what, cfg));
    double prf = 1.0;
    AT_TRY(opt_double(obj, "partial_rotary_factor", what, &prf));
    if (prf != 1.0) return at_error(AT_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", what, prf);

    AT_TRY(opt_bool(obj, "tie_word_embeddings", what, &cfg->tie_word_embeddings));
    int attention_bias = 0, mlp_bias = 0;
    AT_TRY(opt_bool(obj, "attention_bias", what, &attention_bias));
    AT_TRY(opt_bool(obj, "mlp_bias", what, &mlp_bias));
    if (mlp_bias) return at_error(AT_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", what);
    /* Which projections have a bias, as each transformers model class builds them. */
    if (is_qwen2) {
        cfg->attn_qkv_bias = 1;
        cfg->attn_o_bias = 0;
    } else if (is_llama || is_qwen3) {
        cfg->attn_qkv_bias = attention_bias;
        cfg->attn_o_bias = attention_bias;
    }
    cfg->qk_norm = is_qwen3;

    const char *act = "silu";
    at_status st = at_json_get_string(obj, "hidden_act", what, &act);
    if (st != AT_OK && st != AT_ERR_NOT_FOUND) return st;
    if (strcmp(act, "silu") != 0)
        return at_error(AT_ERR_UNSUPPORTED, "%s: hidden_act \"%.40s\" is not supported (silu is)", what, act);

    /* Sliding window: record the window when some layer would use it. */
    int64_t window = 0;
    AT_TRY(opt_i64(obj, "sliding_window", what, &window));
    if (is_mistral) {
        cfg->sliding_window = window;
    } else if (is_qwen2 || is_qwen3) {
        int use = 0;
        AT_TRY(opt_bool(obj, "use_sliding_window", what, &use));
        int mwl = cfg->num_hidden_layers;
        AT_TRY(opt_int(obj, "max_window_layers", what, &mwl));
        /* transformers: layer i slides when use_sliding_window and i >= max_window_layers. */
        if (use && window > 0 && mwl < cfg->num_hidden_layers) cfg->sliding_window = window;
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(obj, "layer_types");
    if (cJSON_IsArray(lt))
        for (const cJSON *c = lt->child; c; c = c->next)
            if (cJSON_IsString(c) && strcmp(c->valuestring, "sliding_attention") == 0 && window > 0)
                cfg->sliding_window = window;

    AT_TRY(parse_dtype(obj, what, cfg));
    if (!cfg->torch_dtype[0]) AT_TRY(parse_dtype(top, what, cfg));
    AT_TRY(parse_token_ids(obj, what, cfg));
    if (cfg->n_eos == 0 && cfg->bos_token_id < 0) AT_TRY(parse_token_ids(top, what, cfg));
    return at_model_config_validate(cfg, what);
}

/* ms-swift's --model_type names (swift/llm/model/constant.py) of the families
 * the decoder runs, with Hugging Face's own; AT_MODEL_TYPE_CHOICES lists the
 * same names (test_model_config checks that they agree). */
static const struct {
    const char *name, *family;
} model_types[] = {
    {"llama", "llama"},    {"llama3", "llama"},       {"llama3_1", "llama"}, {"llama3_2", "llama"},
    {"yi", "llama"},       {"mistral", "mistral"},    {"qwen2", "qwen2"},    {"qwen2_5", "qwen2"},
    {"qwen2_5_math", "qwen2"}, {"qwq", "qwen2"},      {"qwen3", "qwen3"},    {"qwen3_thinking", "qwen3"},
    {"qwen3_nothinking", "qwen3"},
};

const char *at_model_type_family(const char *name)
{
    for (size_t i = 0; name && i < sizeof model_types / sizeof model_types[0]; i++)
        if (!strcmp(model_types[i].name, name)) return model_types[i].family;
    return NULL;
}

at_status at_model_config_parse_as(const char *text, size_t len, const char *what, const char *model_type,
                                   at_model_config *cfg)
{
    const char *family = NULL;
    if (model_type && !(family = at_model_type_family(model_type)))
        return at_error(AT_ERR_INVALID, "--model_type %.40s is not a known model type (%s)", model_type,
                        AT_MODEL_TYPE_NAMES);
    cJSON *root = NULL;
    if (!what) what = "config.json";
    AT_TRY(at_json_parse(text, len, what, &root));
    at_status st = AT_OK;
    if (family && cJSON_IsObject(root)) {
        const cJSON *was = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        if (!cJSON_IsString(was) || strcmp(was->valuestring, family) != 0)
            at_log_info("%s: read as %s (--model_type %s; the file says %s)", what, family, model_type,
                        cJSON_IsString(was) ? was->valuestring : "no model_type");
        cJSON *v = cJSON_CreateString(family);
        if (!v) st = at_error(AT_ERR_NOMEM, "out of memory");
        else if (cJSON_GetObjectItemCaseSensitive(root, "model_type")) cJSON_ReplaceItemInObjectCaseSensitive(root, "model_type", v);
        else cJSON_AddItemToObject(root, "model_type", v);
    }
    if (st == AT_OK) st = at_model_config_from_json(root, what, cfg);
    cJSON_Delete(root);
    return st;
}

at_status at_model_config_parse(const char *text, size_t len, const char *what, at_model_config *cfg)
{
    return at_model_config_parse_as(text, len, what, NULL, cfg);
}

at_status at_model_config_load_as(const char *path, const char *model_type, at_model_config *cfg)
{
    char *p = at_is_dir(path) ? at_path_join(path, "config.json") : strdup(path);
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    at_status st = at_read_file(p, &text, &len);
    if (st == AT_OK) st = at_model_config_parse_as(text, len, p, model_type, cfg);
    free(text);
    free(p);
    return st;
}

at_status at_model_config_load(const char *path, at_model_config *cfg)
{
    return at_model_config_load_as(path, NULL, cfg);
}

at_status at_model_type_check(const at_model_config *cfg, const char *what, const char *model_type)
{
    if (!model_type) return AT_OK;
    const char *family = at_model_type_family(model_type);
    if (!family)
        return at_error(AT_ERR_INVALID, "--model_type %.40s is not a known model type (%s)", model_type,
                        AT_MODEL_TYPE_NAMES);
    if (strcmp(family, cfg->model_type) != 0)
        return at_error(AT_ERR_INVALID, "--model_type %s (%s): %s is a %s model, and a GGUF or llama2.c file's "
                        "family is its tensors' (--model_type reads a Hugging Face folder's config.json as another "
                        "family)", model_type, family, what, cfg->model_type);
    return AT_OK;
}

at_status at_model_config_validate(const at_model_config *c, const char *what)
{
    if (!what) what = "model config";
    if (c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 ||
        c->num_key_value_heads <= 0 || c->head_dim <= 0 || c->vocab_size <= 0)
        return at_error(AT_ERR_FORMAT, "%s: sizes must be positive (hidden %d, ffn %d, layers %d, heads %d/%d, head_dim %d, vocab %d)",
                        what, c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                        c->num_key_value_heads, c->head_dim, c->vocab_size);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return at_error(AT_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what,
                        c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2 != 0) return at_error(AT_ERR_FORMAT, "%s: head_dim %d is odd (RoPE needs pairs)", what, c->head_dim);
    if ((int64_t)c->num_attention_heads * c->head_dim > (1 << 24) || c->num_hidden_layers > 100000)
        return at_error(AT_ERR_FORMAT, "%s: sizes are absurd", what);
    if (!(c->rms_norm_eps > 0) || !(c->rms_norm_eps < 1))
        return at_error(AT_ERR_FORMAT, "%s: rms_norm_eps %g is out of range", what, c->rms_norm_eps);
    if (!(c->rope_theta > 1) || !isfinite(c->rope_theta))
        return at_error(AT_ERR_FORMAT, "%s: rope_theta %g is out of range", what, c->rope_theta);
    if ((c->rope_type == AT_ROPE_LINEAR || c->rope_type == AT_ROPE_LLAMA3) &&
        (!(c->rope_factor > 0) || !isfinite(c->rope_factor)))
        return at_error(AT_ERR_FORMAT, "%s: rope_scaling factor %g must be positive", what, c->rope_factor);
    if (c->rope_type == AT_ROPE_LLAMA3 &&
        (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
         !isfinite(c->rope_high_freq_factor) || c->rope_original_max_position_embeddings <= 0))
        return at_error(AT_ERR_FORMAT, "%s: llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor and "
                        "original_max_position_embeddings > 0", what);
    if (c->sliding_window < 0) return at_error(AT_ERR_FORMAT, "%s: sliding_window is negative", what);
    if (at_model_config_mrope(c) && c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] != c->head_dim / 2)
        return at_error(AT_ERR_FORMAT, "%s: rope_scaling.mrope_section %d/%d/%d must add up to head_dim / 2 = %d", what,
                        c->mrope_section[0], c->mrope_section[1], c->mrope_section[2], c->head_dim / 2);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] < 0) return at_error(AT_ERR_FORMAT, "%s: negative eos_token_id", what);
    return AT_OK;
}

/* ---- RoPE --------------------------------------------------------------- */

at_status at_model_config_rope_inv_freq(const at_model_config *cfg, float *out)
{
    int dim = cfg->head_dim, half = dim / 2;
    if (dim <= 0 || dim % 2) return at_error(AT_ERR_INVALID, "rope: head_dim %d must be positive and even", dim);
    /* _compute_default_rope_parameters, in float32 as torch does it:
     *   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)) */
    float base = (float)cfg->rope_theta;
    for (int k = 0; k < half; k++) out[k] = 1.0f / powf(base, (float)(2 * k) / (float)dim);
    if (cfg->rope_type == AT_ROPE_LINEAR) {
        /* _compute_linear_scaling_rope_parameters: inv_freq /= factor */
        float f = (float)cfg->rope_factor;
        for (int k = 0; k < half; k++) out[k] = out[k] / f;
    } else if (cfg->rope_type == AT_ROPE_FACTORS) {
        if (half > AT_MAX_ROPE_PAIRS) return at_error(AT_ERR_INVALID, "rope: head_dim %d is too large", dim);
        for (int k = 0; k < half; k++) out[k] = out[k] / cfg->rope_freq_factors[k];
    } else if (cfg->rope_type == AT_ROPE_LLAMA3) {
        /* _compute_llama3_parameters: long wavelengths are divided by factor,
         * short ones kept, the band between blended smoothly. */
        float factor = (float)cfg->rope_factor;
        float low = (float)cfg->rope_low_freq_factor;
        double old_ctx = (double)cfg->rope_original_max_position_embeddings;
        float low_wavelen = (float)(old_ctx / cfg->rope_low_freq_factor);
        float high_wavelen = (float)(old_ctx / cfg->rope_high_freq_factor);
        float span = (float)(cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
        for (int k = 0; k < half; k++) {
            float inv = out[k];
            float wavelen = (float)(2 * M_PI) / inv;
            float il = wavelen > low_wavelen ? inv / factor : inv;
            float smooth = ((float)old_ctx / wavelen - low) / span;
            float smoothed = (1.0f - smooth) * il / factor + smooth * il;
            int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            out[k] = medium ? smoothed : il;
        }
    }
    return AT_OK;
}

/* ---- writing config.json ------------------------------------------------ */

at_status at_model_config_to_json(const at_model_config *c, char **out)
{
    *out = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return at_error(AT_ERR_NOMEM, "out of memory");
    const char *arch = "LlamaForCausalLM";
    for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
        if (strcmp(c->model_type, known_types[i].type) == 0) arch = known_types[i].arch;
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    if (archs) cJSON_AddItemToArray(archs, cJSON_CreateString(arch));
    cJSON_AddStringToObject(o, "model_type", c->model_type[0] ? c->model_type : "llama");
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    if (c->max_position_embeddings > 0)
        cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    if (c->rope_type == AT_ROPE_FACTORS) {
        cJSON_Delete(o);
        return at_error(AT_ERR_UNSUPPORTED, "config.json has no way to hold per-pair RoPE factors "
                                            "(rope_freqs.weight of a GGUF file)");
    }
    if (at_model_config_mrope(c)) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON *ms = rs ? cJSON_AddArrayToObject(rs, "mrope_section") : NULL;
        if (rs) cJSON_AddStringToObject(rs, "type", "mrope");
        if (rs && c->mrope_interleaved) cJSON_AddTrueToObject(rs, "mrope_interleaved");
        for (int k = 0; ms && k < 3; k++) cJSON_AddItemToArray(ms, cJSON_CreateNumber(c->mrope_section[k]));
    } else if (c->rope_type == AT_ROPE_DEFAULT) {
        cJSON_AddNullToObject(o, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        if (rs) {
            cJSON_AddStringToObject(rs, "rope_type", c->rope_type == AT_ROPE_LINEAR ? "linear" : "llama3");
            cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
            if (c->rope_type == AT_ROPE_LLAMA3) {
                cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
                cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
                cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                        (double)c->rope_original_max_position_embeddings);
            }
        }
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    int is_qwen2 = strcmp(c->model_type, "qwen2") == 0, is_mistral = strcmp(c->model_type, "mistral") == 0;
    if (!is_qwen2 && !is_mistral) cJSON_AddBoolToObject(o, "attention_bias", c->attn_qkv_bias);
    if (strcmp(c->model_type, "llama") == 0) cJSON_AddBoolToObject(o, "mlp_bias", 0);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    if (is_mistral) {
        if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
    } else if (!strcmp(c->model_type, "qwen2") || !strcmp(c->model_type, "qwen3")) {
        cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0);
        if (c->sliding_window > 0) {
            cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
            cJSON_AddNumberToObject(o, "max_window_layers", 0);
        }
    }
    if (c->has_dtype || c->torch_dtype[0])
        cJSON_AddStringToObject(o, "torch_dtype", c->torch_dtype[0] ? c->torch_dtype
                                                  : c->dtype == AT_BF16 ? "bfloat16"
                                                  : c->dtype == AT_F16  ? "float16"
                                                                        : "float32");
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id);
    if (c->n_eos == 1) {
        cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_ids[0]);
    } else if (c->n_eos > 1) {
        cJSON *e = cJSON_AddArrayToObject(o, "eos_token_id");
        for (int i = 0; e && i < c->n_eos; i++) cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_token_ids[i]));
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory printing config.json");
    *out = s;
    return AT_OK;
}

const char *at_model_config_describe(const at_model_config *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s: %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d%s%s%s", c->model_type,
             c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
             c->intermediate_size, c->vocab_size, c->attn_qkv_bias ? ", qkv bias" : "", c->qk_norm ? ", qk norm" : "",
             c->tie_word_embeddings ? ", tied" : "");
    return buf;
}

/* ---- GGUF metadata ------------------------------------------------------ */

static at_status gguf_req(const at_gguf *g, const char *arch, const char *key, const char *what, int *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v;
    at_status st = at_gguf_get_int(g, k, &v);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: key %s is missing", what, k);
    if (st != AT_OK) return st;
    if (v <= 0 || v > 0x7fffffff) return at_error(AT_ERR_FORMAT, "%s: key %s = %lld is out of range", what, k, (long long)v);
    *out = (int)v;
    return AT_OK;
}

static at_status gguf_opt_int(const at_gguf *g, const char *arch, const char *key, int64_t *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    at_status st = at_gguf_get_int(g, k, out);
    return st == AT_ERR_NOT_FOUND ? AT_OK : st;
}

static at_status gguf_opt_float(const at_gguf *g, const char *arch, const char *key, double *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    at_status st = at_gguf_get_float(g, k, out);
    return st == AT_ERR_NOT_FOUND ? AT_OK : st;
}

at_status at_model_config_from_gguf(const at_gguf *g, const char *what, at_model_config *cfg)
{
    at_model_config_init(cfg);
    if (!what) what = "gguf";
    const char *arch = NULL;
    at_status st = at_gguf_get_string(g, "general.architecture", &arch, NULL);
    if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: general.architecture is missing", what);
    if (st != AT_OK) return st;
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3") && strcmp(arch, "qwen2vl"))
        return at_error(AT_ERR_UNSUPPORTED,
                        "%s: architecture \"%.40s\" is not supported (llama, qwen2, qwen3, qwen2vl are)", what, arch);
    /* qwen2vl: the language model of Qwen2-VL / Qwen2.5-VL, a qwen2 decoder with M-RoPE */
    int vl = !strcmp(arch, "qwen2vl");
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", vl ? "qwen2" : arch);
    if (vl) { /* llama.cpp's four sections: t, h, w and a fourth this decoder has not (0) */
        const at_gguf_value *sec = at_gguf_get(g, "qwen2vl.rope.dimension_sections");
        int64_t s[4] = {0};
        for (size_t i = 0; sec && sec->type == AT_GGUF_ARRAY && i < sec->v.arr.count && i < 4; i++) {
            at_gguf_value e;
            if (at_gguf_value_elem(sec, i, &e) != AT_OK || at_gguf_value_int(&e, &s[i]) != AT_OK || s[i] < 0 ||
                s[i] > AT_MAX_ROPE_PAIRS)
                return at_error(AT_ERR_FORMAT, "%s: qwen2vl.rope.dimension_sections[%zu] is not a section size", what, i);
        }
        if (!sec || s[3] != 0 || s[0] + s[1] + s[2] <= 0)
            return at_error(AT_ERR_UNSUPPORTED, "%s: qwen2vl.rope.dimension_sections is missing or has a fourth "
                            "section", what);
        for (int i = 0; i < 3; i++) cfg->mrope_section[i] = (int)s[i];
    }
    AT_TRY(gguf_req(g, arch, "embedding_length", what, &cfg->hidden_size));
    AT_TRY(gguf_req(g, arch, "block_count", what, &cfg->num_hidden_layers));
    AT_TRY(gguf_req(g, arch, "feed_forward_length", what, &cfg->intermediate_size));
    AT_TRY(gguf_req(g, arch, "attention.head_count", what, &cfg->num_attention_heads));
    int64_t v = cfg->num_attention_heads;
    AT_TRY(gguf_opt_int(g, arch, "attention.head_count_kv", &v));
    cfg->num_key_value_heads = (int)(v > 0 && v <= 0x7fffffff ? v : 0);
    v = cfg->hidden_size / cfg->num_attention_heads;
    AT_TRY(gguf_opt_int(g, arch, "attention.key_length", &v));
    cfg->head_dim = (int)(v > 0 && v <= 0x7fffffff ? v : 0);
    int64_t rot = cfg->head_dim;
    AT_TRY(gguf_opt_int(g, arch, "rope.dimension_count", &rot));
    if (rot != cfg->head_dim)
        return at_error(AT_ERR_UNSUPPORTED, "%s: rope.dimension_count %lld != head size %d (partial RoPE)", what,
                        (long long)rot, cfg->head_dim);
    AT_TRY(gguf_opt_float(g, arch, "attention.layer_norm_rms_epsilon", &cfg->rms_norm_eps));
    AT_TRY(gguf_opt_float(g, arch, "rope.freq_base", &cfg->rope_theta));
    int64_t ctx = 0;
    AT_TRY(gguf_opt_int(g, arch, "context_length", &ctx));
    cfg->max_position_embeddings = ctx > 0 ? ctx : 0;

    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const char *rs = NULL;
    st = at_gguf_get_string(g, k, &rs, NULL);
    if (st != AT_OK && st != AT_ERR_NOT_FOUND) return st;
    if (rs && strcmp(rs, "none") != 0) {
        if (strcmp(rs, "linear") != 0)
            return at_error(AT_ERR_UNSUPPORTED, "%s: rope scaling \"%.40s\" is not supported", what, rs);
        cfg->rope_type = AT_ROPE_LINEAR;
        AT_TRY(gguf_opt_float(g, arch, "rope.scaling.factor", &cfg->rope_factor));
    }
    const at_gguf_tensor_info *rf = at_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) {
        /* Llama 3.1 scaling as llama.cpp converts it: one divisor per rotary pair. */
        int half = cfg->head_dim / 2;
        at_tensor *t = NULL;
        if (half <= 0 || half > AT_MAX_ROPE_PAIRS)
            return at_error(AT_ERR_UNSUPPORTED, "%s: rope_freqs.weight with head size %d", what, cfg->head_dim);
        AT_TRY(at_gguf_tensor(g, rf, AT_F32, &t));
        if (at_tensor_numel(t) != half) {
            at_tensor_free(t);
            return at_error(AT_ERR_FORMAT, "%s: rope_freqs.weight has %lld values, the head size needs %d", what,
                            (long long)at_tensor_numel(t), half);
        }
        const float *f = at_tensor_data(t);
        for (int i = 0; i < half; i++) {
            if (!(f[i] > 0) || !isfinite(f[i])) {
                at_tensor_free(t);
                return at_error(AT_ERR_FORMAT, "%s: rope_freqs.weight[%d] = %g is not a positive factor", what, i,
                                (double)f[i]);
            }
            cfg->rope_freq_factors[i] = f[i];
        }
        at_tensor_free(t);
        if (cfg->rope_type != AT_ROPE_DEFAULT)
            return at_error(AT_ERR_UNSUPPORTED, "%s: rope_freqs.weight together with rope scaling \"%s\"", what, rs);
        cfg->rope_type = AT_ROPE_FACTORS;
    }

    /* Vocabulary: the explicit size, else the token list, else the embedding. */
    v = 0;
    AT_TRY(gguf_opt_int(g, arch, "vocab_size", &v));
    size_t n_tok = 0;
    if (v <= 0 && at_gguf_get_array(g, "tokenizer.ggml.tokens", NULL, &n_tok) == AT_OK) v = (int64_t)n_tok;
    const at_gguf_tensor_info *emb = at_gguf_find_tensor(g, "token_embd.weight");
    if (v <= 0 && emb && emb->n_dims == 2) v = emb->ne[1];
    if (v <= 0 || v > 0x7fffffff) return at_error(AT_ERR_FORMAT, "%s: cannot tell the vocabulary size", what);
    cfg->vocab_size = (int)v;

    cfg->tie_word_embeddings = at_gguf_find_tensor(g, "output.weight") == NULL;
    cfg->attn_qkv_bias = at_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL || strcmp(cfg->model_type, "qwen2") == 0;
    cfg->attn_o_bias = at_gguf_find_tensor(g, "blk.0.attn_output.bias") != NULL;
    cfg->qk_norm = at_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    if (emb) {
        int dt = at_ggml_to_dtype(emb->type);
        if (dt == AT_F32 || dt == AT_F16 || dt == AT_BF16) {
            cfg->has_dtype = 1;
            cfg->dtype = (at_dtype)dt;
            snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s",
                     dt == AT_F32 ? "float32" : dt == AT_F16 ? "float16" : "bfloat16");
        }
    }
    int64_t id;
    if (at_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &id) == AT_OK && id >= 0 && id <= 0x7fffffff)
        cfg->bos_token_id = (int)id;
    if (at_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id) == AT_OK && id >= 0 && id <= 0x7fffffff)
        cfg->eos_token_ids[cfg->n_eos++] = (int)id;
    at_clear_error();
    return at_model_config_validate(cfg, what);
}
