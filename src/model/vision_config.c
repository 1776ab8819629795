/* Qwen2-VL / Qwen2.5-VL vision config and tower weights (see vision_config.h). */
#include "model/vision_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "model/safetensors.h"

at_status at_vision_kind_of(const cJSON *root, const char *what, at_vision_kind *kind)
{
    *kind = AT_VISION_NONE;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *vcfg = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    const char *t = cJSON_IsString(mt) ? mt->valuestring : "";
    if (!strcasecmp(t, "qwen2_vl")) *kind = AT_VISION_QWEN2_VL;
    else if (!strcasecmp(t, "qwen2_5_vl")) *kind = AT_VISION_QWEN2_5_VL;
    else if (!strcasecmp(t, "qwen3_vl")) *kind = AT_VISION_QWEN3_VL;
    else if (vcfg)
        return at_error(AT_ERR_UNSUPPORTED, "%s: vision model_type \"%.40s\" is not supported (qwen2_vl, "
                        "qwen2_5_vl and qwen3_vl are read)", what, t);
    return AT_OK;
}

const char *at_vision_kind_name(at_vision_kind kind)
{
    return kind == AT_VISION_QWEN2_VL ? "Qwen2-VL" : kind == AT_VISION_QWEN2_5_VL ? "Qwen2.5-VL"
           : kind == AT_VISION_QWEN3_VL ? "Qwen3-VL" : "text-only";
}

/* A required positive integer (at most max) of obj into *out; dflt >= 0 is
 * taken when the key is absent. */
static at_status get_int(const cJSON *obj, const char *key, const char *what, long long dflt, long long max, int *out)
{
    long long v;
    at_status st = at_json_get_int(obj, key, what, &v);
    if (st == AT_ERR_NOT_FOUND && dflt >= 0) v = dflt;
    else if (st == AT_ERR_NOT_FOUND) return at_error(AT_ERR_FORMAT, "%s: vision_config has no \"%s\"", what, key);
    else if (st != AT_OK) return st;
    if (v <= 0 || v > max) return at_error(AT_ERR_FORMAT, "%s: %s = %lld is out of range (1..%lld)", what, key, v, max);
    *out = (int)v;
    return AT_OK;
}

/* The block a list element names: an integral number in 0..depth-1, else -1
 * (checked before the cast, which is undefined out of int's range). */
static int block_index(const cJSON *e, int depth)
{
    if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < depth)) return -1;
    return e->valuedouble == floor(e->valuedouble) ? (int)e->valuedouble : -1;
}

static at_status get_token(const cJSON *root, const char *key, const char *what, int32_t dflt, int32_t *out)
{
    long long v;
    at_status st = at_json_get_int(root, key, what, &v);
    if (st == AT_ERR_NOT_FOUND) v = dflt; /* transformers' defaults: Qwen2's vocabulary */
    else if (st != AT_OK) return st;
    if (v < 0 || v > INT32_MAX) return at_error(AT_ERR_FORMAT, "%s: %s = %lld is not a token id", what, key, v);
    *out = (int32_t)v;
    return AT_OK;
}

at_status at_vision_config_from_json(const cJSON *root, const char *what, at_vision_config *vc)
{
    memset(vc, 0, sizeof *vc);
    AT_TRY(at_vision_kind_of(root, what, &vc->kind));
    if (vc->kind == AT_VISION_NONE) return at_error(AT_ERR_INVALID, "%s: not a vision-language model", what);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (!cJSON_IsObject(v)) return at_error(AT_ERR_FORMAT, "%s: no \"vision_config\" object", what);
    const int q25 = vc->kind == AT_VISION_QWEN2_5_VL, q3 = vc->kind == AT_VISION_QWEN3_VL;
    const long long big = 1 << 20;
    AT_TRY(get_int(v, "depth", what, -1, 1024, &vc->depth));
    AT_TRY(get_int(v, "num_heads", what, -1, 1024, &vc->num_heads));
    AT_TRY(get_int(v, "in_chans", what, 3, 16, &vc->in_chans));
    if (q3) AT_TRY(get_int(v, "in_channels", what, vc->in_chans, 16, &vc->in_chans));
    AT_TRY(get_int(v, "patch_size", what, q3 ? 16 : 14, 1024, &vc->patch_size));
    AT_TRY(get_int(v, "temporal_patch_size", what, 2, 16, &vc->temporal_patch_size));
    AT_TRY(get_int(v, "spatial_merge_size", what, 2, 16, &vc->spatial_merge_size));
    const char *act = q25 ? "silu" : q3 ? "gelu_pytorch_tanh" : "quick_gelu";
    at_status st = at_json_get_string(v, "hidden_act", what, &act);
    if (st != AT_OK && st != AT_ERR_NOT_FOUND) return st;
    snprintf(vc->hidden_act, sizeof vc->hidden_act, "%s", act);
    if (q3) {
        AT_TRY(get_int(v, "hidden_size", what, -1, big, &vc->width));
        AT_TRY(get_int(v, "intermediate_size", what, -1, big, &vc->intermediate_size));
        AT_TRY(get_int(v, "out_hidden_size", what, -1, big, &vc->out_hidden_size));
        AT_TRY(get_int(v, "num_position_embeddings", what, 2304, big, &vc->num_position_embeddings));
        int side = (int)sqrt((double)vc->num_position_embeddings);
        while (side * side > vc->num_position_embeddings) side--;
        while ((side + 1) * (side + 1) <= vc->num_position_embeddings) side++;
        if (side * side != vc->num_position_embeddings)
            return at_error(AT_ERR_FORMAT, "%s: num_position_embeddings %d is not a square (a grid of positions)",
                            what, vc->num_position_embeddings);
        /* transformers' default when the key is absent */
        static const int ds_default[3] = {8, 16, 24};
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(v, "deepstack_visual_indexes");
        if (!ds) {
            vc->n_deepstack = 3;
            memcpy(vc->deepstack_visual_indexes, ds_default, sizeof ds_default);
        } else {
            if (!cJSON_IsArray(ds) || cJSON_GetArraySize(ds) > AT_VISION_MAX_DEEPSTACK)
                return at_error(AT_ERR_FORMAT, "%s: deepstack_visual_indexes must be a list of at most %d blocks",
                                what, AT_VISION_MAX_DEEPSTACK);
            const cJSON *e;
            cJSON_ArrayForEach(e, ds) vc->deepstack_visual_indexes[vc->n_deepstack++] = block_index(e, vc->depth);
        }
        for (int i = 0; i < vc->n_deepstack; i++) {
            const int b = vc->deepstack_visual_indexes[i];
            if (b < 0 || b >= vc->depth || (i && b <= vc->deepstack_visual_indexes[i - 1]))
                return at_error(AT_ERR_FORMAT, "%s: deepstack_visual_indexes[%d] is not a block of 0..%d after the "
                                "previous one", what, i, vc->depth - 1);
        }
        if (strcmp(vc->hidden_act, "gelu_pytorch_tanh"))
            return at_error(AT_ERR_UNSUPPORTED, "%s: vision hidden_act \"%s\" (Qwen3-VL's tower uses "
                            "gelu_pytorch_tanh)", what, vc->hidden_act);
    } else if (q25) {
        AT_TRY(get_int(v, "hidden_size", what, -1, big, &vc->width));
        AT_TRY(get_int(v, "intermediate_size", what, -1, big, &vc->intermediate_size));
        AT_TRY(get_int(v, "out_hidden_size", what, -1, big, &vc->out_hidden_size));
        AT_TRY(get_int(v, "window_size", what, 112, big, &vc->window_size));
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(v, "fullatt_block_indexes");
        if (fa) {
            if (!cJSON_IsArray(fa) || cJSON_GetArraySize(fa) > AT_VISION_MAX_FULLATT)
                return at_error(AT_ERR_FORMAT, "%s: fullatt_block_indexes must be a list of at most %d blocks", what,
                                AT_VISION_MAX_FULLATT);
            const cJSON *e;
            cJSON_ArrayForEach(e, fa) {
                const int b = block_index(e, vc->depth);
                if (b < 0)
                    return at_error(AT_ERR_FORMAT, "%s: fullatt_block_indexes holds %g, not a block of 0..%d", what,
                                    cJSON_IsNumber(e) ? e->valuedouble : -1.0, vc->depth - 1);
                vc->fullatt_block_indexes[vc->n_fullatt++] = b;
            }
        }
        if (strcmp(vc->hidden_act, "silu"))
            return at_error(AT_ERR_UNSUPPORTED, "%s: vision hidden_act \"%s\" (Qwen2.5-VL's tower uses silu)", what,
                            vc->hidden_act);
        if (vc->window_size % (vc->patch_size * vc->spatial_merge_size))
            return at_error(AT_ERR_FORMAT, "%s: window_size %d is not a multiple of patch_size * spatial_merge_size",
                            what, vc->window_size);
    } else {
        int mlp_ratio = 4;
        AT_TRY(get_int(v, "embed_dim", what, -1, big, &vc->width));
        /* mlp_ratio may be fractional in principle; Qwen2-VL writes 4 */
        double r = 4;
        st = at_json_get_double(v, "mlp_ratio", what, &r);
        if (st != AT_OK && st != AT_ERR_NOT_FOUND) return st;
        mlp_ratio = (int)r;
        if (r != mlp_ratio || mlp_ratio <= 0 || mlp_ratio > 64)
            return at_error(AT_ERR_FORMAT, "%s: mlp_ratio %g is not a whole number of 1..64", what, r);
        vc->intermediate_size = vc->width * mlp_ratio;
        AT_TRY(get_int(v, "hidden_size", what, -1, big, &vc->out_hidden_size));
        if (strcmp(vc->hidden_act, "quick_gelu"))
            return at_error(AT_ERR_UNSUPPORTED, "%s: vision hidden_act \"%s\" (Qwen2-VL's tower uses quick_gelu)", what,
                            vc->hidden_act);
    }
    if (vc->width % vc->num_heads || (vc->width / vc->num_heads) % 2)
        return at_error(AT_ERR_FORMAT, "%s: vision width %d is not num_heads %d times an even head size", what,
                        vc->width, vc->num_heads);
    AT_TRY(get_token(root, "image_token_id", what, 151655, &vc->image_token_id));
    AT_TRY(get_token(root, "video_token_id", what, 151656, &vc->video_token_id));
    AT_TRY(get_token(root, "vision_start_token_id", what, 151652, &vc->vision_start_token_id));
    AT_TRY(get_token(root, "vision_end_token_id", what, 151653, &vc->vision_end_token_id));
    /* rope_scaling {"type": "mrope", "mrope_section": [t, h, w]}: at the top level, or in text_config (newer saves) */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(rs) && cJSON_IsObject(tc)) rs = cJSON_GetObjectItemCaseSensitive(tc, "rope_scaling");
    if (!cJSON_IsObject(rs) && cJSON_IsObject(tc)) rs = cJSON_GetObjectItemCaseSensitive(tc, "rope_parameters");
    const cJSON *sec = cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "mrope_section") : NULL;
    if (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3)
        return at_error(AT_ERR_FORMAT, "%s: rope_scaling.mrope_section must be a list of 3 numbers", what);
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetArrayItem(sec, i);
        if (!cJSON_IsNumber(e) || e->valuedouble <= 0 || e->valuedouble > 4096 || e->valuedouble != (int)e->valuedouble)
            return at_error(AT_ERR_FORMAT, "%s: rope_scaling.mrope_section[%d] is not a positive whole number", what, i);
        vc->mrope_section[i] = (int)e->valuedouble;
    }
    return AT_OK;
}

static void add(at_vision_tensor *t, size_t *n, const char *name, int ndim, int64_t a, int64_t b)
{
    at_vision_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = ndim;
    x->shape[0] = a;
    x->shape[1] = b;
}

/* A merger's six tensors under prefix: Qwen3-VL's names (norm over nw
 * features, linear_fc1, linear_fc2). */
static void merger3(at_vision_tensor *t, size_t *k, const char *prefix, int64_t nw, int64_t w4, int64_t out)
{
    char nm[112];
#define M(suffix, nd, a, b) (snprintf(nm, sizeof nm, "%s%s", prefix, suffix), add(t, k, nm, nd, a, b))
    M("norm.weight", 1, nw, 0);
    M("norm.bias", 1, nw, 0);
    M("linear_fc1.weight", 2, w4, w4);
    M("linear_fc1.bias", 1, w4, 0);
    M("linear_fc2.weight", 2, out, w4);
    M("linear_fc2.bias", 1, out, 0);
#undef M
}

at_status at_vision_tensors(const at_vision_config *vc, at_vision_tensor **out, size_t *n)
{
    const int q25 = vc->kind == AT_VISION_QWEN2_5_VL, q3 = vc->kind == AT_VISION_QWEN3_VL;
    const int64_t w = vc->width, f = vc->intermediate_size, m2 = (int64_t)vc->spatial_merge_size * vc->spatial_merge_size;
    size_t cap = 3 + (size_t)vc->depth * 14 + 6 * (size_t)(1 + vc->n_deepstack);
    at_vision_tensor *t = malloc(cap * sizeof *t);
    if (!t) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t k = 0;
    add(t, &k, "visual.patch_embed.proj.weight", 5, w, vc->in_chans);
    t[0].shape[2] = vc->temporal_patch_size;
    t[0].shape[3] = t[0].shape[4] = vc->patch_size;
    if (q3) {
        add(t, &k, "visual.patch_embed.proj.bias", 1, w, 0);
        add(t, &k, "visual.pos_embed.weight", 2, vc->num_position_embeddings, w);
    }
    for (int i = 0; i < vc->depth; i++) {
        char p[64], nm[96];
        snprintf(p, sizeof p, "visual.blocks.%d.", i);
#define T(suffix, nd, a, b) (snprintf(nm, sizeof nm, "%s%s", p, suffix), add(t, &k, nm, nd, a, b))
        T("norm1.weight", 1, w, 0);
        if (!q25) T("norm1.bias", 1, w, 0);
        T("norm2.weight", 1, w, 0);
        if (!q25) T("norm2.bias", 1, w, 0);
        T("attn.qkv.weight", 2, 3 * w, w);
        T("attn.qkv.bias", 1, 3 * w, 0);
        T("attn.proj.weight", 2, w, w);
        T("attn.proj.bias", 1, w, 0);
        if (q3) {
            T("mlp.linear_fc1.weight", 2, f, w);
            T("mlp.linear_fc1.bias", 1, f, 0);
            T("mlp.linear_fc2.weight", 2, w, f);
            T("mlp.linear_fc2.bias", 1, w, 0);
        } else if (q25) {
            T("mlp.gate_proj.weight", 2, f, w);
            T("mlp.gate_proj.bias", 1, f, 0);
            T("mlp.up_proj.weight", 2, f, w);
            T("mlp.up_proj.bias", 1, f, 0);
            T("mlp.down_proj.weight", 2, w, f);
            T("mlp.down_proj.bias", 1, w, 0);
        } else {
            T("mlp.fc1.weight", 2, f, w);
            T("mlp.fc1.bias", 1, f, 0);
            T("mlp.fc2.weight", 2, w, f);
            T("mlp.fc2.bias", 1, w, 0);
        }
#undef T
    }
    if (q3) {
        merger3(t, &k, "visual.merger.", w, w * m2, vc->out_hidden_size);
        for (int j = 0; j < vc->n_deepstack; j++) {
            char p[64];
            snprintf(p, sizeof p, "visual.deepstack_merger_list.%d.", j);
            merger3(t, &k, p, w * m2, w * m2, vc->out_hidden_size);
        }
        *out = t;
        *n = k;
        return AT_OK;
    }
    add(t, &k, "visual.merger.ln_q.weight", 1, w, 0);
    if (!q25) add(t, &k, "visual.merger.ln_q.bias", 1, w, 0);
    add(t, &k, "visual.merger.mlp.0.weight", 2, w * m2, w * m2);
    add(t, &k, "visual.merger.mlp.0.bias", 1, w * m2, 0);
    add(t, &k, "visual.merger.mlp.2.weight", 2, vc->out_hidden_size, w * m2);
    add(t, &k, "visual.merger.mlp.2.bias", 1, vc->out_hidden_size, 0);
    *out = t;
    *n = k;
    return AT_OK;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *s)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, i ? ", %lld" : "%lld", (long long)s[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

const at_st_info *at_vision_find(const at_st_model *m, const char *name)
{
    const at_st_info *info = at_st_model_find(m, name);
    char prefixed[128];
    if (!info && (size_t)snprintf(prefixed, sizeof prefixed, "model.%s", name) < sizeof prefixed)
        info = at_st_model_find(m, prefixed);
    return info;
}

at_status at_vision_check_weights(const at_vision_config *vc, const at_st_model *m, const char *what)
{
    at_vision_tensor *t = NULL;
    size_t n = 0;
    AT_TRY(at_vision_tensors(vc, &t, &n));
    at_status st = AT_OK;
    for (size_t i = 0; i < n && st == AT_OK; i++) {
        const at_st_info *info = at_vision_find(m, t[i].name);
        if (!info) {
            st = at_error(AT_ERR_NOT_FOUND, "%s: the vision tower's tensor %s is missing", what, t[i].name);
            break;
        }
        int same = info->ndim == t[i].ndim;
        for (int d = 0; same && d < t[i].ndim; d++) same = info->shape[d] == t[i].shape[d];
        if (!same) {
            char want[96], got[96];
            shape_str(want, sizeof want, t[i].ndim, t[i].shape);
            shape_str(got, sizeof got, info->ndim, info->shape);
            st = at_error(AT_ERR_FORMAT, "%s: %s has shape %s, the vision config says %s", what, t[i].name, got, want);
        }
    }
    free(t);
    return st;
}

at_status at_vision_gate(const char *config_dir, const char *weights)
{
    char *path = at_path_join(config_dir, "config.json");
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    cJSON *root = NULL;
    at_st_model *m = NULL;
    at_vision_config vc;
    at_vision_kind kind = AT_VISION_NONE;
    at_status st = AT_OK;
    if (!at_file_exists(path)) goto done; /* the config reader says what is missing */
    AT_CHECK(at_json_parse_file(path, &root));
    AT_CHECK(at_vision_kind_of(root, path, &kind));
    if (kind == AT_VISION_NONE) goto done;
    AT_CHECK(at_vision_config_from_json(root, path, &vc));
    AT_CHECK(at_st_model_open(weights, &m));
    AT_CHECK(at_vision_check_weights(&vc, m, weights));
    at_log_info("%s: a %s model (vision tower of %d blocks, width %d, M-RoPE sections %d/%d/%d)", config_dir,
                at_vision_kind_name(kind), vc.depth, vc.width, vc.mrope_section[0],
                vc.mrope_section[1], vc.mrope_section[2]);
done:
    at_st_model_close(m);
    cJSON_Delete(root);
    free(path);
    return st;
}
