/* Export of vision-language models (Qwen2-VL, Qwen2.5-VL): the inputs are
 * made at test time (tests/test_export_vlm_inputs.py: tools/make_tiny_vlm.py
 * folders and PEFT adapters with LoRA on the language model and on the
 * vision tower, and a trained aligner weight).
 *
 *  1. Hugging Face folder, Qwen2-VL f32, merged with its adapter: config.json
 *     keeps model_type / architectures / vision_config, preprocessor_config
 *     and the chat template come along, every source tensor is there under
 *     its name, shape and dtype; the tower's untouched tensors are
 *     bit-identical, the aligner weight is the adapter's; the folder loads
 *     back and gives the logits of base + unmerged adapter, and (at_vision)
 *     the vision features of base + unmerged tower LoRA + the adapter's
 *     aligner weight, within the f32 tolerance below.
 *  2. Qwen2.5-VL bf16 in transformers' newer layout (model.language_model.*,
 *     model.visual.*) merged with a tower LoRA: the layout, names, 5-D patch
 *     embedding and bf16 are kept; a merged qkv equals bf16(W + s·B·A)
 *     computed here in double (within one bf16 rounding step).
 *  3. GGUF: the language model as llama.cpp's qwen2vl (rope.dimension_sections)
 *     and the tower as its mmproj file, read back by @huggingface/gguf
 *     (tests/js/check_gguf.mjs): every key, every tensor's name, ggml shape
 *     and type, and values of the patch-embedding halves, the split qkv and
 *     the aligner against the source safetensors (the merged folder for the
 *     merged export); anytune reads the qwen2vl file back (its M-RoPE
 *     sections, and the merged folder's logits).
 *  4. The adapter alone to PEFT keeps the tower's tensors; an adapter tower
 *     tensor that names no tensor of the tower is refused; the command line
 *     names the mmproj file it writes.
 *
 * Tolerance of 1 (f32): merged W' = fl(W + s·B·A) differs from the unmerged
 * computation x·Wᵀ + s·(x·Aᵀ)·Bᵀ by rounding only: per dot product of
 * length K at most γ_K = K·u/(1 − K·u) of Σ|x||w| (u = 2^-24; K ≤ 4·32 in the
 * tower, 128 in the language model: γ ≤ 7.7e-6), and the random-sign sums
 * make Σ|x||w| / |Σ x·w| ~ sqrt(K) ≤ 12; through the few matmuls of two
 * blocks and the merger (normalised between them) that stays well under
 * 1e-4 of the outputs' largest magnitude, which is the bound checked. The
 * adapter changes the outputs by more than 1e-2 of it (checked), so the
 * bound separates a merged adapter from a dropped one. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_job.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/gguf.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model/vision.h"
#include "testing.h"
#include "train/run_files.h"

enum { GGML_F32 = 0, GGML_F16 = 1 };

static char tmp_root[64];

static char *tmp_path(const char *name) { return at_path_join(tmp_root, name); }

static char *export_to(at_export_args *a, const char *out_name)
{
    char *out = tmp_path(out_name);
    a->output_dir = out;
    CHECK_OK(at_export_run(a));
    return out;
}

/* The values of tensor `name` of model folder dir as f32 (caller frees); *n its count. */
static float *read_f32(const at_st_model *m, const char *name, size_t *n)
{
    const at_st_info *info = at_st_model_find(m, name);
    CHECK_MSG(info != NULL, "tensor %s missing", name);
    if (!info) return NULL;
    size_t c = 1;
    for (int d = 0; d < info->ndim; d++) c *= (size_t)info->shape[d];
    float *f = malloc(c * sizeof *f);
    CHECK_OK(at_st_read_f32(info, f, c));
    if (n) *n = c;
    return f;
}

/* Every tensor of src is in dst under its name with its shape and dtype;
 * and no other. Returns the number compared. */
static size_t same_names(const at_st_model *src, const at_st_model *dst, const char *what)
{
    size_t n = at_st_model_count(src);
    CHECK_MSG(at_st_model_count(dst) == n, "%s: %zu tensors, the source %zu", what, at_st_model_count(dst), n);
    for (size_t i = 0; i < n; i++) {
        const at_st_info *s = at_st_model_info_at(src, i), *d = at_st_model_find(dst, s->name);
        CHECK_MSG(d != NULL, "%s: %s missing", what, s->name);
        if (!d) continue;
        int same = d->ndim == s->ndim && !strcmp(d->dtype_name, s->dtype_name);
        for (int k = 0; same && k < s->ndim; k++) same = d->shape[k] == s->shape[k];
        CHECK_MSG(same, "%s: %s: %s/%d-D, the source %s/%d-D", what, s->name, d->dtype_name, d->ndim, s->dtype_name,
                  s->ndim);
    }
    return n;
}

static int bytes_equal(const at_st_info *a, const at_st_info *b)
{
    return a && b && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes);
}

/* Logits of `ids` under the model at path (with adapter dir `lora` unmerged
 * when non-NULL), f32; caller frees. */
static float *logits_of(const char *path, const char *lora, const int32_t *ids, int T, int64_t *V)
{
    at_load_options lo = at_load_options_default();
    lo.dtype = AT_F32;
    at_decoder *d = NULL;
    at_adapter *ad = NULL;
    at_tensor *tid = NULL, *lg = NULL;
    at_decoder_acts *acts = NULL;
    float *out = NULL;
    CHECK_OK(at_decoder_load(path, &lo, &d));
    if (!d) return NULL;
    if (lora) {
        CHECK_OK(at_adapter_load(lora, &d->cfg, d->be, &ad));
        if (ad) CHECK_OK(at_decoder_set_adapter(d, ad));
    }
    *V = d->cfg.vocab_size;
    int64_t sh[2] = {1, T}, shl[2] = {T, *V};
    CHECK_OK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &tid));
    CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shl, "logits", &lg));
    CHECK_OK(at_decoder_acts_new(d, 1, T, &acts));
    if (tid && lg && acts && at_tensor_upload(tid, ids, (size_t)T * sizeof *ids) == AT_OK &&
        at_decoder_forward(d, acts, tid, NULL, NULL) == AT_OK && at_decoder_logits(d, lg, &acts->final_norm) == AT_OK) {
        out = malloc(at_tensor_nbytes(lg));
        if (out) memcpy(out, at_tensor_data(lg), at_tensor_nbytes(lg));
    }
    CHECK(out != NULL);
    at_tensor_free(tid);
    at_tensor_free(lg);
    at_decoder_acts_free(acts);
    at_decoder_free(d);
    at_adapter_free(ad);
    return out;
}

/* max |a - b| / max |b|. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return mb > 0 ? md / mb : md;
}

/* Vision features of the tower of folder dir on pixels; with lora (a PEFT
 * folder) the tower gets the adapter's LoRA pairs unmerged (at_vision_lora_add,
 * values by name) and its full visual.* tensors. Caller frees. */
static float *features_of(const char *dir, const char *lora, const float *pixels, int64_t n_patches,
                          const int32_t (*grid)[3], int64_t *n_out)
{
    at_vision *v = NULL;
    at_tensor *feat = NULL;
    float *out = NULL;
    at_st_model *am = NULL;
    CHECK_OK(at_vision_load(dir, dir, at_cpu_backend(), &v));
    if (!v) return NULL;
    const at_vision_config *vc = at_vision_get_config(v);
    if (lora) {
        char *p = at_path_join(lora, "adapter_model.safetensors");
        CHECK_OK(at_st_model_open(p, &am));
        free(p);
        CHECK_OK(at_vision_lora_add(v, 4, 8.0, 0, 1));
        size_t set = 0;
        for (size_t i = 0; am && i < at_vision_param_count(v); i++) {
            at_tensor *t = at_vision_param(v, i);
            char name[200];
            /* the tower's own tensors by their plain name, the pairs by PEFT's */
            if (at_vision_param_is_lora(v, i)) snprintf(name, sizeof name, "%s", t->name);
            else snprintf(name, sizeof name, "base_model.model.%s", t->name);
            const at_st_info *info = at_st_model_find(am, name);
            if (!info) continue;
            float *f = malloc(at_tensor_nbytes(t));
            CHECK_OK(at_st_read_f32(info, f, (size_t)at_tensor_numel(t)));
            CHECK_OK(at_tensor_upload(t, f, at_tensor_nbytes(t)));
            free(f);
            set++;
        }
        /* every block linear's A and B, and the aligner weight */
        size_t want = (size_t)vc->depth * (vc->kind == AT_VISION_QWEN2_VL ? 4 : 5) * 2 + 1;
        CHECK_MSG(set == want, "%zu adapter tensors set in the tower, expected %zu", set, want);
    }
    int64_t n_tok = 0;
    CHECK_OK(at_vision_tokens(vc, grid, 1, n_patches, &n_tok));
    int64_t sh[2] = {n_tok, vc->out_hidden_size};
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sh, "features", &feat));
    if (feat && at_vision_forward(v, feat, pixels, n_patches, grid, 1, 0) == AT_OK) {
        out = malloc(at_tensor_nbytes(feat));
        memcpy(out, at_tensor_data(feat), at_tensor_nbytes(feat));
        *n_out = at_tensor_numel(feat);
    }
    CHECK(out != NULL);
    at_tensor_free(feat);
    at_st_model_close(am);
    at_vision_free(v);
    return out;
}

static int file_same(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = at_read_file(a, &x, &nx) == AT_OK && at_read_file(b, &y, &ny) == AT_OK && nx == ny &&
               !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

/* ---- 1. Qwen2-VL, f32, merged -------------------------------------------- */

static void test_hf_q2(const char *base, const char *lora, const char *out)
{
    char a[600], b[600];
    /* the files beside the weights */
    snprintf(a, sizeof a, "%s/preprocessor_config.json", base);
    snprintf(b, sizeof b, "%s/preprocessor_config.json", out);
    CHECK_MSG(file_same(a, b), "preprocessor_config.json not copied as it is");
    snprintf(a, sizeof a, "%s/chat_template.json", base);
    snprintf(b, sizeof b, "%s/chat_template.json", out);
    CHECK_MSG(file_same(a, b), "chat_template.json not copied as it is");
    snprintf(b, sizeof b, "%s/tokenizer_config.json", out);
    CHECK(at_test_file_has(b, "\"chat_template\"") && at_test_file_has(b, "<|image_pad|>"));
    snprintf(b, sizeof b, "%s/config.json", out);
    cJSON *cfg = NULL;
    CHECK_OK(at_json_parse_file(b, &cfg));
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const cJSON *ar = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cfg, "architectures"), 0);
    CHECK(cJSON_IsString(mt) && !strcmp(mt->valuestring, "qwen2_vl"));
    CHECK(cJSON_IsString(ar) && !strcmp(ar->valuestring, "Qwen2VLForConditionalGeneration"));
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cfg, "vision_config")));
    cJSON_Delete(cfg);

    /* the tensors: names, shapes, dtypes; the untouched tower tensors bit-identical */
    at_st_model *src = NULL, *dst = NULL, *am = NULL;
    char *ap = at_path_join(lora, "adapter_model.safetensors");
    CHECK_OK(at_st_model_open(base, &src));
    CHECK_OK(at_st_model_open(out, &dst));
    CHECK_OK(at_st_model_open(ap, &am));
    free(ap);
    if (src && dst && am) {
        size_t n = same_names(src, dst, "q2 merged"), same = 0, visual = 0;
        for (size_t i = 0; i < n; i++) {
            const at_st_info *s = at_st_model_info_at(src, i);
            if (strncmp(s->name, "visual.", 7) != 0) continue;
            visual++;
            int adapted = strstr(s->name, ".weight") && (strstr(s->name, ".attn.") || strstr(s->name, ".mlp.fc"));
            int replaced = !strcmp(s->name, "visual.merger.mlp.2.weight");
            if (!adapted && !replaced) {
                CHECK_MSG(bytes_equal(s, at_st_model_find(dst, s->name)), "%s changed", s->name);
                same++;
            } else if (adapted) {
                CHECK_MSG(!bytes_equal(s, at_st_model_find(dst, s->name)), "%s: the tower LoRA is not merged", s->name);
            }
        }
        CHECK_MSG(bytes_equal(at_st_model_find(dst, "visual.merger.mlp.2.weight"),
                              at_st_model_find(am, "base_model.model.visual.merger.mlp.2.weight")),
                  "the aligner weight is not the adapter's");
        printf("hf q2_vl merged: %zu tensors as the source's (%zu of the tower, %zu of them bit-identical)\n", n,
               visual, same);
    }
    at_st_model_close(src);
    at_st_model_close(dst);
    at_st_model_close(am);

    /* logits: merged == base + unmerged adapter */
    int32_t ids[12] = {151644, 872, 198, 151652, 151655, 151653, 3838, 374, 419, 30, 151645, 198};
    int64_t V = 0;
    float *lm = logits_of(out, NULL, ids, 12, &V), *lu = logits_of(base, lora, ids, 12, &V),
          *l0 = logits_of(base, NULL, ids, 12, &V);
    if (lm && lu && l0) {
        double e = rel_diff(lm, lu, (size_t)12 * V), e0 = rel_diff(l0, lu, (size_t)12 * V);
        printf("hf q2_vl merged: logits vs base + adapter: max rel err %.2e (the adapter moves them by %.2e)\n", e, e0);
        CHECK_MSG(e < 1e-4, "merged logits differ by %g", e);
        CHECK_MSG(e0 > 1e-2, "the adapter does not change the logits (%g)", e0);
    }
    free(lm);
    free(lu);
    free(l0);

    /* vision features: merged tower == base tower + unmerged LoRA + the adapter's aligner */
    int32_t grid[1][3] = {{1, 4, 6}};
    int64_t np = 24, pd = 3 * 2 * 14 * 14, nf = 0;
    float *px = malloc((size_t)(np * pd) * sizeof *px);
    uint64_t s = 12345;
    for (int64_t i = 0; i < np * pd; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        px[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
    float *fm = features_of(out, NULL, px, np, (const int32_t(*)[3])grid, &nf);
    float *fu = features_of(base, lora, px, np, (const int32_t(*)[3])grid, &nf);
    float *f0 = features_of(base, NULL, px, np, (const int32_t(*)[3])grid, &nf);
    if (fm && fu && f0) {
        double e = rel_diff(fm, fu, (size_t)nf), e0 = rel_diff(f0, fu, (size_t)nf);
        printf("hf q2_vl merged: vision features vs base + tower LoRA: max rel err %.2e (the adapter moves them by "
               "%.2e)\n", e, e0);
        CHECK_MSG(e < 1e-4, "merged vision features differ by %g", e);
        CHECK_MSG(e0 > 1e-2, "the tower adapter does not change the features (%g)", e0);
    }
    free(fm);
    free(fu);
    free(f0);
    free(px);
}

/* ---- 2. Qwen2.5-VL, bf16, nested layout, merged ------------------------- */

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_hf_q25(const char *base, const char *lora, const char *out)
{
    at_st_model *src = NULL, *dst = NULL, *am = NULL;
    char *ap = at_path_join(lora, "adapter_model.safetensors");
    CHECK_OK(at_st_model_open(base, &src));
    CHECK_OK(at_st_model_open(out, &dst));
    CHECK_OK(at_st_model_open(ap, &am));
    free(ap);
    if (src && dst && am) {
        size_t n = same_names(src, dst, "q25 merged");
        CHECK(at_st_model_find(dst, "model.language_model.embed_tokens.weight") != NULL);
        const at_st_info *pe = at_st_model_find(dst, "model.visual.patch_embed.proj.weight");
        CHECK(pe && pe->ndim == 5 && !strcmp(pe->dtype_name, "BF16"));
        CHECK(bytes_equal(at_st_model_find(src, "model.visual.blocks.1.norm1.weight"),
                          at_st_model_find(dst, "model.visual.blocks.1.norm1.weight")));
        /* block 1's qkv: bf16(W + 2·B·A), within one bf16 step of the rounding done here */
        const at_st_info *w = at_st_model_find(src, "model.visual.blocks.1.attn.qkv.weight"),
                         *m = at_st_model_find(dst, "model.visual.blocks.1.attn.qkv.weight");
        size_t na = 0, nb = 0;
        float *A = read_f32(am, "base_model.model.model.visual.blocks.1.attn.qkv.lora_A.weight", &na);
        float *B = read_f32(am, "base_model.model.model.visual.blocks.1.attn.qkv.lora_B.weight", &nb);
        if (w && m && A && B) {
            int64_t O = w->shape[0], I = w->shape[1], r = (int64_t)na / I;
            const uint16_t *wb = (const uint16_t *)w->data, *mb = (const uint16_t *)m->data;
            size_t exact = 0, off = 0, changed = 0;
            for (int64_t o = 0; o < O; o++)
                for (int64_t i = 0; i < I; i++) {
                    double acc = bf16_to_f32(wb[o * I + i]);
                    for (int64_t k = 0; k < r; k++) acc += 2.0 * (double)B[o * r + k] * A[k * I + i];
                    double got = bf16_to_f32(mb[o * I + i]);
                    double ulp = ldexp(1.0, ilogb(acc) - 7);
                    changed += got != (double)bf16_to_f32(wb[o * I + i]);
                    if (fabs(got - acc) <= 0.5 * ulp) exact++;
                    else if (fabs(got - acc) <= ulp) off++;
                }
            CHECK_MSG(exact + off == (size_t)(O * I), "merged qkv: %zu of %lld values beyond one bf16 step",
                      (size_t)(O * I) - exact - off, (long long)(O * I));
            CHECK_MSG(changed > (size_t)(O * I) / 2, "merged qkv: only %zu of %lld values changed", changed,
                      (long long)(O * I));
            printf("hf q2_5_vl bf16 nested layout merged: %zu tensors as the source's; qkv = bf16(W + s·B·A): %zu "
                   "rounded to nearest, %zu one step off (double rounding through f32)\n", n, exact, off);
        }
        free(A);
        free(B);
    }
    at_st_model_close(src);
    at_st_model_close(dst);
    at_st_model_close(am);
    /* and it loads back: the language model (nested) and the tower */
    at_load_options lo = at_load_options_default();
    at_decoder *d = NULL;
    CHECK_OK(at_decoder_load(out, &lo, &d));
    at_decoder_free(d);
    at_vision *v = NULL;
    CHECK_OK(at_vision_load(out, out, at_cpu_backend(), &v));
    at_vision_free(v);
}

/* ---- 3. GGUF ------------------------------------------------------------- */

static void add_tensor(cJSON *list, const char *name, int n, const int64_t *ne, int type)
{
    cJSON *t = cJSON_CreateObject(), *s = cJSON_CreateArray();
    cJSON_AddStringToObject(t, "name", name);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)ne[i]));
    cJSON_AddItemToObject(t, "shape", s);
    cJSON_AddNumberToObject(t, "dtype", type);
    cJSON_AddItemToArray(list, t);
}

/* The tensors llama.cpp's clip loads for a Qwen2-VL / 2.5-VL tower (ggml
 * shapes, innermost first); matrices of type mt, patch halves pt, 1-D F32. */
static cJSON *mmproj_tensors(const at_vision_config *vc, int64_t lm_hidden, int mt, int pt)
{
    cJSON *l = cJSON_CreateArray();
    int64_t W = vc->width, F = vc->intermediate_size, P = vc->patch_size, M = 4 * vc->width;
    int q25 = vc->kind == AT_VISION_QWEN2_5_VL;
    int64_t pe[4] = {P, P, 3, W};
    add_tensor(l, "v.patch_embd.weight", 4, pe, pt);
    add_tensor(l, "v.patch_embd.weight.1", 4, pe, pt);
    char n[96];
    for (int b = 0; b < vc->depth; b++) {
#define T2(s, a, c) do { int64_t ne_[2] = {a, c}; snprintf(n, sizeof n, "v.blk.%d." s, b); add_tensor(l, n, 2, ne_, mt); } while (0)
#define T1(s, a) do { int64_t ne_[1] = {a}; snprintf(n, sizeof n, "v.blk.%d." s, b); add_tensor(l, n, 1, ne_, GGML_F32); } while (0)
        T1("ln1.weight", W);
        T1("ln2.weight", W);
        if (!q25) {
            T1("ln1.bias", W);
            T1("ln2.bias", W);
        }
        T2("attn_q.weight", W, W);
        T2("attn_k.weight", W, W);
        T2("attn_v.weight", W, W);
        T1("attn_q.bias", W);
        T1("attn_k.bias", W);
        T1("attn_v.bias", W);
        T2("attn_out.weight", W, W);
        T1("attn_out.bias", W);
        T2("ffn_up.weight", W, F);
        T1("ffn_up.bias", F);
        T2("ffn_down.weight", F, W);
        T1("ffn_down.bias", W);
        if (q25) {
            T2("ffn_gate.weight", W, F);
            T1("ffn_gate.bias", F);
        }
#undef T1
#undef T2
    }
    int64_t v1[1] = {W}, m0[2] = {M, M}, m0b[1] = {M}, m2[2] = {M, lm_hidden}, m2b[1] = {lm_hidden};
    add_tensor(l, "v.post_ln.weight", 1, v1, GGML_F32);
    if (!q25) add_tensor(l, "v.post_ln.bias", 1, v1, GGML_F32);
    add_tensor(l, "mm.0.weight", 2, m0, mt);
    add_tensor(l, "mm.0.bias", 1, m0b, GGML_F32);
    add_tensor(l, "mm.2.weight", 2, m2, mt);
    add_tensor(l, "mm.2.bias", 1, m2b, GGML_F32);
    return l;
}

static cJSON *mmproj_keys(const at_vision_config *vc, int64_t lm_hidden, int file_type, const char *name)
{
    cJSON *m = cJSON_CreateObject();
    int q25 = vc->kind == AT_VISION_QWEN2_5_VL;
    cJSON_AddStringToObject(m, "general.name", name); /* the model folder's name, as the language model's file */
    cJSON_AddStringToObject(m, "general.architecture", "clip");
    cJSON_AddStringToObject(m, "general.type", "mmproj");
    cJSON_AddNumberToObject(m, "general.file_type", file_type);
    cJSON_AddBoolToObject(m, "clip.has_vision_encoder", 1);
    cJSON_AddStringToObject(m, "clip.projector_type", q25 ? "qwen2.5vl_merger" : "qwen2vl_merger");
    if (q25) cJSON_AddBoolToObject(m, "clip.use_silu", 1);
    cJSON_AddNumberToObject(m, "clip.vision.projection_dim", (double)lm_hidden);
    cJSON_AddNumberToObject(m, "clip.vision.image_size", 560);
    cJSON_AddNumberToObject(m, "clip.vision.patch_size", vc->patch_size);
    cJSON_AddNumberToObject(m, "clip.vision.embedding_length", vc->width);
    cJSON_AddNumberToObject(m, "clip.vision.feed_forward_length", vc->intermediate_size);
    cJSON_AddNumberToObject(m, "clip.vision.block_count", vc->depth);
    cJSON_AddNumberToObject(m, "clip.vision.attention.head_count", vc->num_heads);
    cJSON_AddNumberToObject(m, "clip.vision.attention.layer_norm_epsilon", 1e-6);
    cJSON_AddNumberToObject(m, "clip.vision.spatial_merge_size", vc->spatial_merge_size);
    if (q25) {
        cJSON_AddNumberToObject(m, "clip.vision.n_wa_pattern", vc->fullatt_block_indexes[0] + 1);
        cJSON_AddNumberToObject(m, "clip.vision.window_size", vc->window_size);
    }
    return m;
}

static cJSON *entry(const char *file, cJSON *meta, cJSON *tensors)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "file", file);
    cJSON_AddItemToObject(e, "metadata", meta);
    cJSON_AddItemToObject(e, "tensors", tensors);
    return e;
}

/* Expected values of GGUF tensor `gname` at 5 flat indexes, from src (a
 * float array of the ggml tensor's layout), added to e's "values". */
static void add_values(cJSON *e, const char *gname, const float *src, size_t n)
{
    cJSON *vals = cJSON_GetObjectItemCaseSensitive(e, "values");
    if (!vals) vals = cJSON_AddArrayToObject(e, "values");
    cJSON *v = cJSON_CreateObject(), *at = cJSON_CreateArray(), *want = cJSON_CreateArray();
    size_t idx[5] = {0, 1, n / 3, n / 2 + 7, n - 1};
    for (int i = 0; i < 5; i++) {
        cJSON_AddItemToArray(at, cJSON_CreateNumber((double)idx[i]));
        cJSON_AddItemToArray(want, cJSON_CreateNumber((double)src[idx[i]]));
    }
    cJSON_AddStringToObject(v, "tensor", gname);
    cJSON_AddItemToObject(v, "at", at);
    cJSON_AddItemToObject(v, "want", want);
    cJSON_AddItemToArray(vals, v);
}

/* Values of the mmproj f32 file against the folder `src` (as stored there):
 * both temporal halves of the Conv3d, q/k/v rows of block 0's and block 1's
 * qkv (weight and bias), and the aligner's mm.2. */
static void add_source_values(cJSON *e, const char *src_dir, const at_vision_config *vc)
{
    at_st_model *m = NULL;
    CHECK_OK(at_st_model_open(src_dir, &m));
    if (!m) return;
    int64_t W = vc->width, C = 3, T = 2, PP = (int64_t)vc->patch_size * vc->patch_size;
    float *pe = read_f32(m, "visual.patch_embed.proj.weight", NULL);
    float *half = malloc((size_t)(W * C * PP) * sizeof *half);
    for (int tt = 0; pe && tt < 2; tt++) {
        for (int64_t w = 0; w < W; w++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t k = 0; k < PP; k++) half[(w * C + c) * PP + k] = pe[((w * C + c) * T + tt) * PP + k];
        add_values(e, tt ? "v.patch_embd.weight.1" : "v.patch_embd.weight", half, (size_t)(W * C * PP));
    }
    static const char *const part[3] = {"attn_q", "attn_k", "attn_v"};
    for (int b = 0; b < 2; b++) {
        char name[96], g[96];
        snprintf(name, sizeof name, "visual.blocks.%d.attn.qkv.weight", b);
        float *qkv = read_f32(m, name, NULL);
        snprintf(name, sizeof name, "visual.blocks.%d.attn.qkv.bias", b);
        float *bias = read_f32(m, name, NULL);
        for (int s = 0; qkv && bias && s < 3; s++) {
            snprintf(g, sizeof g, "v.blk.%d.%s.weight", b, part[s]);
            add_values(e, g, qkv + s * W * W, (size_t)(W * W));
            snprintf(g, sizeof g, "v.blk.%d.%s.bias", b, part[s]);
            add_values(e, g, bias + s * W, (size_t)W);
        }
        free(qkv);
        free(bias);
    }
    size_t n = 0;
    float *mm2 = read_f32(m, "visual.merger.mlp.2.weight", &n);
    if (mm2) add_values(e, "mm.2.weight", mm2, n);
    free(mm2);
    free(pe);
    free(half);
    at_st_model_close(m);
}

static cJSON *lm_keys(const at_model_config *c, int file_type)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "general.architecture", "qwen2vl");
    cJSON_AddStringToObject(m, "general.type", "model");
    cJSON_AddNumberToObject(m, "general.file_type", file_type);
    cJSON_AddNumberToObject(m, "qwen2vl.embedding_length", c->hidden_size);
    cJSON_AddNumberToObject(m, "qwen2vl.block_count", c->num_hidden_layers);
    cJSON_AddNumberToObject(m, "qwen2vl.rope.dimension_count", c->head_dim);
    cJSON_AddNumberToObject(m, "qwen2vl.attention.head_count_kv", c->num_key_value_heads);
    return m;
}

static void lm_arrays(cJSON *e, const at_model_config *c)
{
    cJSON *a = cJSON_AddObjectToObject(e, "arrays"), *s = cJSON_CreateArray();
    for (int i = 0; i < 3; i++) cJSON_AddItemToArray(s, cJSON_CreateNumber(c->mrope_section[i]));
    cJSON_AddItemToArray(s, cJSON_CreateNumber(0));
    cJSON_AddItemToObject(a, "qwen2vl.rope.dimension_sections", s);
}

/* The language model's tensors (Qwen2: q/k/v biases, tied). */
static cJSON *lm_tensors(const at_model_config *c, int mt)
{
    cJSON *l = cJSON_CreateArray();
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, q = c->num_attention_heads * c->head_dim,
            kv = c->num_key_value_heads * c->head_dim;
    int64_t emb[2] = {H, V}, h1[1] = {H};
    add_tensor(l, "token_embd.weight", 2, emb, mt);
    add_tensor(l, "output_norm.weight", 1, h1, GGML_F32);
    char n[96];
    for (int b = 0; b < c->num_hidden_layers; b++) {
        struct {
            const char *s;
            int64_t a, c;
        } t[] = {{"attn_norm.weight", H, 0}, {"attn_q.weight", H, q},  {"attn_k.weight", H, kv},
                 {"attn_v.weight", H, kv},   {"attn_output.weight", q, H}, {"ffn_norm.weight", H, 0},
                 {"ffn_gate.weight", H, I},  {"ffn_up.weight", H, I},  {"ffn_down.weight", I, H},
                 {"attn_q.bias", q, 0},      {"attn_k.bias", kv, 0},   {"attn_v.bias", kv, 0}};
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            int64_t ne[2] = {t[i].a, t[i].c};
            snprintf(n, sizeof n, "blk.%d.%s", b, t[i].s);
            add_tensor(l, n, t[i].c ? 2 : 1, ne, t[i].c ? mt : GGML_F32);
        }
    }
    return l;
}

static void test_gguf(const char *q2, const char *q2_lora, const char *q2_merged_hf, const char *q25,
                      const char *q25_lora)
{
    cJSON *all = cJSON_CreateArray();
    at_model_config c2, c25;
    at_vision_config v2, v25;
    cJSON *root = NULL;
    char p[600];
    CHECK_OK(at_model_config_load(q2, &c2));
    CHECK_OK(at_model_config_load(q25, &c25));
    snprintf(p, sizeof p, "%s/config.json", q2);
    CHECK_OK(at_json_parse_file(p, &root));
    CHECK_OK(at_vision_config_from_json(root, p, &v2));
    cJSON_Delete(root);
    snprintf(p, sizeof p, "%s/config.json", q25);
    CHECK_OK(at_json_parse_file(p, &root));
    CHECK_OK(at_vision_config_from_json(root, p, &v25));
    cJSON_Delete(root);

    /* a. Qwen2-VL as it is, f32: the values against the source */
    at_export_args a = {.model = q2, .to = "gguf", .dtype = AT_F32};
    char *o1 = export_to(&a, "q2_gguf");
    snprintf(p, sizeof p, "%s/mmproj-model-f32.gguf", o1);
    cJSON *e1 = entry(p, mmproj_keys(&v2, c2.hidden_size, 0, "q2"), mmproj_tensors(&v2, c2.hidden_size, GGML_F32, GGML_F32));
    cJSON *arr = cJSON_AddObjectToObject(e1, "arrays");
    /* Qwen2VLImageProcessor's mean / std, as make_tiny_vlm.py's preprocessor_config.json has them */
    const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, sd[3] = {0.26862954, 0.26130258, 0.27577711};
    cJSON_AddItemToObject(arr, "clip.vision.image_mean", cJSON_CreateDoubleArray(mean, 3));
    cJSON_AddItemToObject(arr, "clip.vision.image_std", cJSON_CreateDoubleArray(sd, 3));
    add_source_values(e1, q2, &v2);
    cJSON_AddItemToArray(all, e1);
    snprintf(p, sizeof p, "%s/model-f32.gguf", o1);
    cJSON *e1m = entry(p, lm_keys(&c2, 0), lm_tensors(&c2, GGML_F32));
    lm_arrays(e1m, &c2);
    cJSON_AddItemToArray(all, e1m);

    /* b. merged with its adapter, f32: the values of the merged folder (the
     * tower LoRA and the aligner in the mmproj too) */
    at_export_args b = {.model = q2, .adapters = q2_lora, .merge_lora = 1, .to = "gguf", .dtype = AT_F32};
    char *o2 = export_to(&b, "q2_merged_gguf");
    snprintf(p, sizeof p, "%s/mmproj-model-f32.gguf", o2);
    cJSON *e2 = entry(p, mmproj_keys(&v2, c2.hidden_size, 0, "q2"), mmproj_tensors(&v2, c2.hidden_size, GGML_F32, GGML_F32));
    add_source_values(e2, q2_merged_hf, &v2);
    cJSON_AddItemToArray(all, e2);

    /* c. Qwen2.5-VL (bf16, nested layout) merged, as one .gguf file name, f16 */
    snprintf(p, sizeof p, "%s/q25.gguf", tmp_root);
    at_export_args c = {.model = q25, .adapters = q25_lora, .merge_lora = 1, .to = "gguf", .dtype = AT_F16,
                        .output_dir = p};
    CHECK_OK(at_export_run(&c));
    snprintf(p, sizeof p, "%s/mmproj-q25.gguf", tmp_root);
    CHECK_MSG(at_file_exists(p), "%s missing", p);
    cJSON *e3 = entry(p, mmproj_keys(&v25, c25.hidden_size, 1, "q25"), mmproj_tensors(&v25, c25.hidden_size, GGML_F16, GGML_F16));
    cJSON *arr3 = cJSON_AddObjectToObject(e3, "arrays");
    const double mean3[3] = {0.5, 0.25, 0.125}, sd3[3] = {0.75, 0.5, 0.625}; /* the inputs script's */
    cJSON_AddItemToObject(arr3, "clip.vision.image_mean", cJSON_CreateDoubleArray(mean3, 3));
    cJSON_AddItemToObject(arr3, "clip.vision.image_std", cJSON_CreateDoubleArray(sd3, 3));
    cJSON_AddItemToArray(all, e3);
    snprintf(p, sizeof p, "%s/q25.gguf", tmp_root);
    cJSON *e3m = entry(p, lm_keys(&c25, 1), lm_tensors(&c25, GGML_F16));
    lm_arrays(e3m, &c25);
    cJSON_AddItemToArray(all, e3m);

    at_test_js_check(tmp_root, all, "@huggingface/gguf", "check_gguf.mjs", "@huggingface/gguf");

    /* anytune reads the qwen2vl GGUF back: the M-RoPE sections, and the merged logits */
    snprintf(p, sizeof p, "%s/model-f32.gguf", o2);
    at_gguf *g = NULL;
    at_model_config cg;
    CHECK_OK(at_gguf_open(p, &g));
    if (g) {
        CHECK_OK(at_model_config_from_gguf(g, p, &cg));
        CHECK(!memcmp(cg.mrope_section, c2.mrope_section, sizeof cg.mrope_section) && !strcmp(cg.model_type, "qwen2"));
        at_gguf_close(g);
    }
    int32_t ids[8] = {151644, 872, 198, 3838, 374, 419, 30, 151645};
    int64_t V = 0;
    float *lg = logits_of(p, NULL, ids, 8, &V), *lh = logits_of(q2_merged_hf, NULL, ids, 8, &V);
    if (lg && lh) {
        double e = rel_diff(lg, lh, (size_t)8 * V);
        printf("gguf q2_vl merged f32 loaded back: logits vs the merged folder's: max rel err %.2e\n", e);
        CHECK_MSG(e < 1e-4, "the GGUF's logits differ by %g", e);
    }
    free(lg);
    free(lh);
    free(o1);
    free(o2);
    cJSON_Delete(all);
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/at_export_vlm_XXXXXX");
    if (!mkdtemp(tmp_root)) return 1;
    char err[128];
    snprintf(err, sizeof err, "%s/inputs.err", tmp_root);
    char *argv[] = {"/usr/bin/python3", "tests/test_export_vlm_inputs.py", tmp_root, NULL};
    int rc = at_test_run(argv, err);
    CHECK_MSG(rc == 0, "tests/test_export_vlm_inputs.py failed (status %d): see %s", rc, err);
    if (rc != 0) return at_test_result("test_export_vlm");
    char *q2 = tmp_path("q2"), *q2l = tmp_path("q2_lora"), *q25 = tmp_path("q25"), *q25l = tmp_path("q25_lora");

    at_export_args a = {.model = q2, .adapters = q2l, .merge_lora = 1, .to = "hf", .dtype = AT_DTYPE_COUNT};
    char *o1 = export_to(&a, "q2_merged");
    test_hf_q2(q2, q2l, o1);

    at_export_args b = {.model = q25, .adapters = q25l, .merge_lora = 1, .to = "hf", .dtype = AT_DTYPE_COUNT};
    char *o2 = export_to(&b, "q25_merged");
    test_hf_q25(q25, q25l, o2);

    test_gguf(q2, q2l, o1, q25, q25l);

    /* the fuzz seeds of a qwen2vl GGUF's config: sections read; a fourth section refused */
    at_gguf *g = NULL;
    at_model_config cg;
    CHECK_OK(at_gguf_open("tests/fuzz/gguf/model_qwen2vl.gguf", &g));
    if (g) {
        CHECK_OK(at_model_config_from_gguf(g, "model_qwen2vl.gguf", &cg));
        CHECK(cg.mrope_section[0] == 2 && cg.mrope_section[1] == 3 && cg.mrope_section[2] == 3);
        at_gguf_close(g);
        g = NULL;
    }
    CHECK_OK(at_gguf_open("tests/fuzz/gguf/lie_qwen2vl_sections.gguf", &g));
    if (g) CHECK_FAILS(at_model_config_from_gguf(g, "lie_qwen2vl_sections.gguf", &cg), AT_ERR_UNSUPPORTED);
    at_gguf_close(g);

    /* the adapter alone, to PEFT: the tower's tensors kept (the files as they are) */
    at_export_args pa = {.model = q2, .adapters = q2l, .to = "hf", .dtype = AT_DTYPE_COUNT};
    char *o4 = export_to(&pa, "q2_peft"), f1[600], f2[600];
    snprintf(f1, sizeof f1, "%s/adapter_model.safetensors", q2l);
    snprintf(f2, sizeof f2, "%s/adapter_model.safetensors", o4);
    CHECK_MSG(file_same(f1, f2), "the PEFT export lost the tower's tensors");
    free(o4);

    /* the command line says where the mmproj file is */
    const char *bin = getenv("ANYTUNE_BIN");
    if (bin) {
        char *o5 = tmp_path("cli_gguf"), *errp = tmp_path("cli.err");
        char *cargv[] = {(char *)bin, "export", "--model", q2, "--to", "gguf", "--quant", "q8_0", "--output_dir", o5,
                         "--quiet", "true", NULL};
        CHECK(at_test_run(cargv, errp) == 0);
        snprintf(f1, sizeof f1, "%s/mmproj-model-q8_0.gguf", o5);
        CHECK(at_file_exists(f1));
        CHECK_MSG(at_test_file_has(errp, "mmproj-model-q8_0.gguf"), "the command does not name the mmproj file");
        free(o5);
        free(errp);
    }

    /* an adapter tensor of the tower that names no tower tensor is refused */
    char *bad = tmp_path("q2_lora_bad");
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import sys,os,shutil;sys.path.insert(0,'tools');"
             "from safetensors_np import write_safetensors;import numpy as np;"
             "shutil.copytree('%s','%s');"
             "write_safetensors('%s/adapter_model.safetensors',"
             "[('base_model.model.visual.blocks.9.attn.qkv.lora_A.weight',np.zeros((4,32),np.float32)),"
             "('base_model.model.visual.blocks.9.attn.qkv.lora_B.weight',np.zeros((96,4),np.float32)),"
             "('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight',np.zeros((4,64),np.float32)),"
             "('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight',np.zeros((64,4),np.float32)),"
             "('base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight',np.zeros((4,64),np.float32)),"
             "('base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight',np.zeros((64,4),np.float32)),"
             "('base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight',np.zeros((4,64),np.float32)),"
             "('base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight',np.zeros((32,4),np.float32)),"
             "('base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight',np.zeros((4,64),np.float32)),"
             "('base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight',np.zeros((32,4),np.float32))],"
             "{'format':'pt'})\"",
             q2l, bad, bad);
    CHECK(system(cmd) == 0);
    at_export_args c = {.model = q2, .adapters = bad, .merge_lora = 1, .to = "hf", .dtype = AT_DTYPE_COUNT};
    char *o3 = tmp_path("q2_bad_merged");
    c.output_dir = o3;
    CHECK_FAILS(at_export_run(&c), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "blocks.9.attn.qkv") != NULL, "message: %s", at_last_error());
    CHECK(!at_file_exists(o3));

    free(o1);
    free(o2);
    free(o3);
    free(bad);
    free(q2);
    free(q2l);
    free(q25);
    free(q25l);
    at_remove_tree(tmp_root);
    return at_test_result("test_export_vlm");
}
