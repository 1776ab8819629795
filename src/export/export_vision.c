/* The vision tower on export (export_vision.h). */
#include "export/export_vision.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "data/image_proc.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_gguf.h"
#include "export/merge.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "ops/ops.h"

/* The tower's norms use eps 1e-6 in both models (model/vision.h). */
#define VISION_NORM_EPS 1e-6

struct at_export_vision {
    at_vision_config vc;
    int image_size;           /* vision_config.image_size, else llama.cpp's default 560 */
    int lm_nested;
    at_st_model *src;         /* keeps the views of the source alive */
    size_t n;
    at_vision_tensor *canon;  /* at_vision_tensors: visual.* names and shapes */
    char **names;             /* as written: the source's names */
    at_tensor **t;
    at_st_shape *shape;
    int merged, replaced;
    at_image_processor proc;
    int have_proc;
};

void at_export_vision_free(at_export_vision *v)
{
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        if (v->names) free(v->names[i]);
        if (v->t) at_tensor_free(v->t[i]);
    }
    free(v->names);
    free(v->t);
    free(v->shape);
    free(v->canon);
    at_st_model_close(v->src);
    free(v);
}

const at_vision_config *at_export_vision_config(const at_export_vision *v) { return &v->vc; }
int at_export_vision_lm_nested(const at_export_vision *v) { return v->lm_nested; }
size_t at_export_vision_count(const at_export_vision *v) { return v->n; }
const char *at_export_vision_name(const at_export_vision *v, size_t i) { return v->names[i]; }
const at_tensor *at_export_vision_tensor(const at_export_vision *v, size_t i) { return v->t[i]; }
const at_st_shape *at_export_vision_shape(const at_export_vision *v, size_t i) { return &v->shape[i]; }

void at_export_vision_applied(const at_export_vision *v, int *merged, int *replaced)
{
    *merged = v->merged;
    *replaced = v->replaced;
}

const char *at_export_mmproj_name(const char *model_file, char *buf, size_t len)
{
    snprintf(buf, len, "mmproj-%s", model_file);
    return buf;
}

/* A host tensor of a stored float tensor: a view of the file when it has at
 * most AT_MAX_DIMS dimensions and copy is 0, else a copy (more dimensions:
 * held as the matrix [shape[0], the rest]). */
static at_status tensor_of(const at_st_info *info, int copy, at_tensor **out)
{
    *out = NULL;
    if (!info->has_dtype || (info->dtype != AT_F32 && info->dtype != AT_BF16 && info->dtype != AT_F16))
        return at_error(AT_ERR_UNSUPPORTED, "export: tensor %s is %s (F32, BF16, F16 supported)", info->name,
                        info->dtype_name);
    if (info->ndim >= 1 && info->ndim <= AT_MAX_DIMS && !copy) return at_st_tensor(info, AT_ST_KEEP_DTYPE, out);
    int64_t shape[AT_MAX_DIMS] = {info->ndim ? info->shape[0] : 1, 1};
    int ndim = info->ndim <= AT_MAX_DIMS && info->ndim >= 1 ? info->ndim : 2;
    if (ndim == info->ndim) memcpy(shape, info->shape, (size_t)ndim * sizeof shape[0]);
    else
        for (int d = 1; d < info->ndim; d++) shape[1] *= info->shape[d];
    AT_TRY(at_tensor_new(at_cpu_backend(), info->dtype, ndim, shape, info->name, out));
    memcpy(at_tensor_data(*out), info->data, info->nbytes);
    return AT_OK;
}

/* The canonical (visual.*) name of an adapter tensor name, or NULL when it
 * is not the tower's: PEFT's base_model.model[.model]. prefix, or a plain
 * [model.] one, then visual. */
static int find_canon(const at_export_vision *v, const char *name)
{
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->canon[i].name, name)) return (int)i;
    return -1;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* The adapter's tower tensors (export_vision.h): replacements first, then
 * the LoRA merges onto whatever the weight then is. */
static at_status apply_adapter(at_export_vision *v, const char *adapter_dir, double scale)
{
    char *path = at_path_join(adapter_dir, "adapter_model.safetensors");
    at_st_file *f = NULL;
    at_tensor *A = NULL, *B = NULL, *merged = NULL;
    at_status st = AT_OK;
    if (!path) return at_error(AT_ERR_NOMEM, "export: out of memory");
    if (!at_file_exists(path)) goto done;
    AT_CHECK(at_st_open(path, &f));
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < at_st_count(f); k++) {
            const at_st_info *info = at_st_info_at(f, k);
            const char *tn = at_adapter_tower_name(info->name);
            if (!tn) continue;
            int is_a = ends_with(tn, ".lora_A.weight"), is_b = ends_with(tn, ".lora_B.weight");
            char base[160];
            if (is_a || is_b) {
                if (pass == 0) continue;
                snprintf(base, sizeof base, "%.*s.weight", (int)(strlen(tn) - strlen(".lora_A.weight")), tn);
            } else {
                if (pass == 1) continue;
                snprintf(base, sizeof base, "%s", tn);
            }
            int i = find_canon(v, base);
            if (i < 0) {
                st = at_error(AT_ERR_INVALID, "export: %s: tensor %s matches no tensor of the vision tower (%s)", path,
                              info->name, base);
                goto done;
            }
            if (!is_a && !is_b) { /* a trained tower or aligner tensor: it replaces the base's */
                int same = info->ndim == v->canon[i].ndim;
                for (int d = 0; same && d < info->ndim; d++) same = info->shape[d] == v->canon[i].shape[d];
                if (!same) {
                    st = at_error(AT_ERR_INVALID, "export: %s: tensor %s has not the shape of the tower's %s", path,
                                  info->name, base);
                    goto done;
                }
                at_tensor *c = NULL;
                AT_CHECK(tensor_of(info, 1, &c));
                at_tensor_free(v->t[i]);
                v->t[i] = c;
                v->replaced++;
                continue;
            }
            if (is_b) { /* merged with its A; an A without its B is refused there */
                char a_name[200];
                snprintf(a_name, sizeof a_name, "%.*s.lora_A.weight",
                         (int)(strlen(info->name) - strlen(".lora_B.weight")), info->name);
                if (!at_st_find(f, a_name)) {
                    st = at_error(AT_ERR_INVALID, "export: %s: %s has no lora_A", path, info->name);
                    goto done;
                }
                continue;
            }
            char b_name[200];
            snprintf(b_name, sizeof b_name, "%.*s.lora_B.weight", (int)(strlen(info->name) - strlen(".lora_A.weight")),
                     info->name);
            const at_st_info *binfo = at_st_find(f, b_name);
            if (!binfo) {
                st = at_error(AT_ERR_INVALID, "export: %s: %s has no lora_B", path, info->name);
                goto done;
            }
            if (v->t[i]->ndim != 2) {
                st = at_error(AT_ERR_INVALID, "export: %s: %s adapts %s, which is no matrix", path, info->name, base);
                goto done;
            }
            AT_CHECK(at_st_tensor(info, AT_F32, &A));
            AT_CHECK(at_st_tensor(binfo, AT_F32, &B));
            AT_CHECK(at_merge_lora_matrix(v->t[i], A, B, scale, AT_F32, &merged));
            at_tensor_free(v->t[i]);
            v->t[i] = merged;
            merged = NULL;
            at_tensor_free(A);
            at_tensor_free(B);
            A = B = NULL;
            v->merged++;
        }
    }
done:
    at_tensor_free(A);
    at_tensor_free(B);
    at_tensor_free(merged);
    at_st_close(f);
    free(path);
    return st;
}

at_status at_export_vision_load(const char *dir, const char *adapter_dir, double lora_scale, at_export_vision **out)
{
    *out = NULL;
    char *cfg_path = at_path_join(dir, "config.json");
    cJSON *root = NULL;
    at_export_vision *v = NULL;
    at_status st = AT_OK;
    if (!cfg_path) return at_error(AT_ERR_NOMEM, "export: out of memory");
    if (!at_file_exists(cfg_path)) goto done;
    AT_CHECK(at_json_parse_file(cfg_path, &root));
    at_vision_kind kind = AT_VISION_NONE;
    AT_CHECK(at_vision_kind_of(root, cfg_path, &kind));
    if (kind == AT_VISION_NONE) goto done;
    if (!(v = calloc(1, sizeof *v))) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    AT_CHECK(at_vision_config_from_json(root, cfg_path, &v->vc));
    const cJSON *vcj = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    const cJSON *is = cJSON_GetObjectItemCaseSensitive(vcj, "image_size");
    v->image_size = cJSON_IsNumber(is) && is->valuedouble >= 1 && is->valuedouble < 1e6 ? (int)is->valuedouble : 560;
    AT_CHECK(at_st_model_open(dir, &v->src));
    v->lm_nested = at_st_model_find(v->src, "model.language_model.embed_tokens.weight") != NULL;
    AT_CHECK(at_vision_check_weights(&v->vc, v->src, dir));
    AT_CHECK(at_vision_tensors(&v->vc, &v->canon, &v->n));
    v->names = calloc(v->n, sizeof *v->names);
    v->t = calloc(v->n, sizeof *v->t);
    v->shape = calloc(v->n, sizeof *v->shape);
    if (!v->names || !v->t || !v->shape) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    for (size_t i = 0; i < v->n; i++) {
        const at_st_info *info = at_vision_find(v->src, v->canon[i].name);
        if (!(v->names[i] = strdup(info->name))) {
            st = at_error(AT_ERR_NOMEM, "export: out of memory");
            goto done;
        }
        if (info->ndim > AT_MAX_DIMS) {
            v->shape[i].ndim = info->ndim;
            memcpy(v->shape[i].shape, info->shape, (size_t)info->ndim * sizeof info->shape[0]);
        }
        AT_CHECK(tensor_of(info, 0, &v->t[i]));
    }
    AT_CHECK(at_image_processor_load(dir, &v->proc, &v->have_proc));
    if (adapter_dir && at_is_dir(adapter_dir)) AT_CHECK(apply_adapter(v, adapter_dir, lora_scale));
    *out = v;
    v = NULL;
done:
    at_export_vision_free(v);
    cJSON_Delete(root);
    free(cfg_path);
    return st;
}

/* ---- the mmproj GGUF ------------------------------------------------------ */

typedef struct {
    at_gguf_writer *w;
    at_tensor **keep; /* the written tensors' data must live until the file is written */
    size_t n_keep, cap;
    at_dtype quant;
    int n_fallback;
} mmproj_job;

static at_status keep(mmproj_job *j, at_tensor *t)
{
    if (j->n_keep == j->cap) {
        size_t c = j->cap ? 2 * j->cap : 64;
        at_tensor **p = realloc(j->keep, c * sizeof *p);
        if (!p) {
            at_tensor_free(t);
            return at_error(AT_ERR_NOMEM, "export: out of memory");
        }
        j->keep = p;
        j->cap = c;
    }
    j->keep[j->n_keep++] = t;
    return AT_OK;
}

/* Adds f32 tensor f (taken: freed or kept by j until the file is written)
 * as `name`: 1-D F32, the patch halves F32 (F16 in an F16 file, as
 * llama.cpp's converter), matrices in the file's type
 * (at_export_gguf_tensor_type). Only the written form is kept, so the peak
 * holds the tower once in the file's type. */
static at_status put(mmproj_job *j, const char *name, at_tensor *f, int patch)
{
    at_dtype type = patch ? (j->quant == AT_F16 ? AT_F16 : AT_F32) : at_export_gguf_tensor_type(f, j->quant);
    if (!patch && f->ndim > 1 && type != j->quant) j->n_fallback++;
    if (type != AT_F32) {
        at_tensor *c = NULL;
        at_status st = at_export_gguf_convert(f, type, &c);
        at_tensor_free(f);
        if (st != AT_OK) return st;
        f = c;
    }
    AT_TRY(keep(j, f));
    return at_gguf_add_at_tensor(j->w, name, f);
}

/* A new f32 tensor of rows [r0, r0 + n) of f32 tensor f. */
static at_status rows(const at_tensor *f, int64_t r0, int64_t n, at_tensor **out)
{
    int64_t shape[AT_MAX_DIMS];
    memcpy(shape, f->shape, sizeof shape);
    shape[0] = n;
    AT_TRY(at_tensor_new(at_cpu_backend(), AT_F32, f->ndim, shape, f->name, out));
    size_t row = (size_t)(at_tensor_numel(f) / f->shape[0]);
    memcpy(at_tensor_data(*out), (const float *)at_tensor_data(f) + (size_t)r0 * row, (size_t)n * row * sizeof(float));
    return AT_OK;
}

/* The Conv3d [W, C, T, P, P] (held as [W, C·T·P·P]) cut at temporal index tt: [W, C, P, P]. */
static at_status temporal_half(const at_tensor *f, const at_vision_config *vc, int tt, at_tensor **out)
{
    int64_t W = f->shape[0], C = vc->in_chans, T = vc->temporal_patch_size, PP = (int64_t)vc->patch_size * vc->patch_size;
    int64_t shape[4] = {W, C, vc->patch_size, vc->patch_size};
    AT_TRY(at_tensor_new(at_cpu_backend(), AT_F32, 4, shape, "v.patch_embd.weight", out));
    const float *s = at_tensor_data(f);
    float *d = at_tensor_data(*out);
    for (int64_t w = 0; w < W; w++)
        for (int64_t c = 0; c < C; c++)
            memcpy(d + (w * C + c) * PP, s + ((w * C + c) * T + tt) * PP, (size_t)PP * sizeof(float));
    return AT_OK;
}

/* llama.cpp's name of tower tensor `canon` (visual.*) other than the patch
 * embedding and qkv: 1 and buf, or 0 when it has none. */
static int clip_name(const char *canon, char *buf, size_t len)
{
    static const struct {
        const char *hf, *gg;
    } blk[] = {{"norm1", "ln1"},          {"norm2", "ln2"},          {"attn.proj", "attn_out"},
               {"mlp.fc1", "ffn_up"},     {"mlp.fc2", "ffn_down"},   {"mlp.gate_proj", "ffn_gate"},
               {"mlp.up_proj", "ffn_up"}, {"mlp.down_proj", "ffn_down"}};
    static const struct {
        const char *hf, *gg;
    } top[] = {{"visual.merger.ln_q.", "v.post_ln."}, {"visual.merger.mlp.0.", "mm.0."}, {"visual.merger.mlp.2.", "mm.2."}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        size_t n = strlen(top[i].hf);
        if (!strncmp(canon, top[i].hf, n)) return snprintf(buf, len, "%s%s", top[i].gg, canon + n) < (int)len;
    }
    int b = -1, off = 0;
    if (sscanf(canon, "visual.blocks.%d.%n", &b, &off) != 1 || off == 0) return 0;
    const char *rest = canon + off;
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
        size_t n = strlen(blk[i].hf);
        if (!strncmp(rest, blk[i].hf, n) && rest[n] == '.')
            return snprintf(buf, len, "v.blk.%d.%s%s", b, blk[i].gg, rest + n) < (int)len;
    }
    return 0;
}

static at_status add_keys(at_gguf_writer *w, const at_export_vision *v, const at_model_config *lm, at_dtype quant,
                          const char *name)
{
    const at_vision_config *vc = &v->vc;
    int q25 = vc->kind == AT_VISION_QWEN2_5_VL;
    AT_TRY(at_gguf_add_string(w, "general.architecture", "clip"));
    AT_TRY(at_gguf_add_string(w, "general.type", "mmproj"));
    AT_TRY(at_gguf_add_string(w, "general.name", name ? name : "anytune export"));
    AT_TRY(at_gguf_add_u32(w, "general.file_type", at_export_gguf_file_type(quant)));
    if (quant == AT_Q8_0 || quant == AT_Q4_0) AT_TRY(at_gguf_add_u32(w, "general.quantization_version", 2));
    AT_TRY(at_gguf_add_bool(w, "clip.has_vision_encoder", 1));
    AT_TRY(at_gguf_add_string(w, "clip.projector_type", q25 ? "qwen2.5vl_merger" : "qwen2vl_merger"));
    if (q25) AT_TRY(at_gguf_add_bool(w, "clip.use_silu", 1));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.projection_dim", (uint32_t)lm->hidden_size));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.image_size", (uint32_t)v->image_size));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.patch_size", (uint32_t)vc->patch_size));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.embedding_length", (uint32_t)vc->width));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.feed_forward_length", (uint32_t)vc->intermediate_size));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.block_count", (uint32_t)vc->depth));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.attention.head_count", (uint32_t)vc->num_heads));
    AT_TRY(at_gguf_add_f32(w, "clip.vision.attention.layer_norm_epsilon", (float)VISION_NORM_EPS));
    AT_TRY(at_gguf_add_array(w, "clip.vision.image_mean", AT_GGUF_FLOAT32, v->proc.image_mean, 3));
    AT_TRY(at_gguf_add_array(w, "clip.vision.image_std", AT_GGUF_FLOAT32, v->proc.image_std, 3));
    AT_TRY(at_gguf_add_u32(w, "clip.vision.spatial_merge_size", (uint32_t)vc->spatial_merge_size));
    if (q25) {
        /* clip runs full attention in blocks n-1, 2n-1, ...: the converter's n_wa_pattern */
        int n = vc->n_fullatt ? vc->fullatt_block_indexes[0] + 1 : 0;
        for (int i = 1; i < vc->n_fullatt; i++)
            if (vc->fullatt_block_indexes[i] - vc->fullatt_block_indexes[i - 1] != n) n = 0;
        if (n <= 0)
            return at_error(AT_ERR_UNSUPPORTED, "export: fullatt_block_indexes that are not every n-th block (the "
                            "first n-1) have no llama.cpp form (clip.vision.n_wa_pattern)");
        AT_TRY(at_gguf_add_u32(w, "clip.vision.n_wa_pattern", (uint32_t)n));
        AT_TRY(at_gguf_add_u32(w, "clip.vision.window_size", (uint32_t)vc->window_size));
        if (vc->window_size != 112)
            at_log_warn("export: window_size %d: llama.cpp's Qwen2.5-VL graph assumes 112", vc->window_size);
    }
    return AT_OK;
}

at_status at_export_vision_mmproj(const at_export_vision *v, const at_model_config *lm, const char *path,
                                  at_dtype quant, const char *name)
{
    const at_vision_config *vc = &v->vc;
    if (vc->temporal_patch_size != 2)
        return at_error(AT_ERR_UNSUPPORTED, "export: temporal_patch_size %d: llama.cpp's mmproj takes 2 (two "
                        "patch-embedding halves)", vc->temporal_patch_size);
    if (!v->have_proc)
        at_log_warn("export: the model has no preprocessor_config.json: image_mean / image_std are "
                    "Qwen2VLImageProcessor's defaults");
    mmproj_job j = {.quant = quant};
    at_status st;
    AT_CHECK(at_gguf_writer_new(&j.w));
    AT_CHECK(add_keys(j.w, v, lm, quant, name));
    for (size_t i = 0; i < v->n; i++) {
        const char *canon = v->canon[i].name;
        at_tensor *f = NULL;
        AT_CHECK(at_tensor_new(at_cpu_backend(), AT_F32, v->t[i]->ndim, v->t[i]->shape, canon, &f));
        st = at_cast(f, v->t[i]);
        if (st != AT_OK) {
            at_tensor_free(f);
            goto done;
        }
        char gname[128];
        const char *qkv = strstr(canon, ".attn.qkv.");
        if (clip_name(canon, gname, sizeof gname)) {
            AT_CHECK(put(&j, gname, f, 0));
            continue;
        }
        /* f is the source of the parts below, freed once they are made */
        if (!strcmp(canon, "visual.patch_embed.proj.weight")) {
            for (int tt = 0; tt < 2 && st == AT_OK; tt++) {
                at_tensor *h = NULL;
                st = temporal_half(f, vc, tt, &h);
                if (st == AT_OK) st = put(&j, tt ? "v.patch_embd.weight.1" : "v.patch_embd.weight", h, 1);
            }
        } else if (qkv) {
            int b = atoi(canon + strlen("visual.blocks."));
            const char *kind = qkv + strlen(".attn.qkv.");
            static const char *const part[3] = {"attn_q", "attn_k", "attn_v"};
            int64_t W = f->shape[0] / 3;
            for (int s = 0; s < 3 && st == AT_OK; s++) {
                at_tensor *r = NULL;
                st = rows(f, s * W, W, &r);
                snprintf(gname, sizeof gname, "v.blk.%d.%s.%s", b, part[s], kind);
                if (st == AT_OK) st = put(&j, gname, r, 0);
            }
        } else {
            st = at_error(AT_ERR_INTERNAL, "export: %s has no llama.cpp name", canon);
        }
        at_tensor_free(f);
        if (st != AT_OK) goto done;
    }
    if (j.n_fallback)
        at_log_warn("export: mmproj: %d matri%s written F16: rows not a multiple of 32 cannot be %s", j.n_fallback,
                    j.n_fallback == 1 ? "x" : "ces", at_dtype_name(quant));
    AT_CHECK(at_gguf_write(j.w, path));
done:
    at_gguf_writer_free(j.w);
    for (size_t i = 0; i < j.n_keep; i++) at_tensor_free(j.keep[i]);
    free(j.keep);
    return st;
}
