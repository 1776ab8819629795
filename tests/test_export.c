/* Export: merged Hugging Face folders, PEFT adapters, GGUF files.
 *
 *  - merge: base + PEFT adapter merged and written as an HF folder, loaded
 *    back, gives the logits PyTorch computes for base + UNMERGED adapter
 *    (tests/data/export/make_goldens.py: y = xWᵀ + s·(xAᵀ)Bᵀ); f32 models
 *    within 1e-5, a bf16 model within its one bf16 rounding of W';
 *  - sharding (index + shards load back to identical logits), MANIFEST.sha256
 *    verified, refusal to overwrite, no staging folder left behind;
 *  - PEFT adapter export: names and shapes as PEFT names them, values kept;
 *  - GGUF: each golden model exported and loaded back gives the logits of the
 *    safetensors model (f32/bf16 bit-identical, f16 within rounding); the
 *    Llama 3.1 rope_freqs tensor equals PyTorch's inv_freq ratio;
 *  - stories260K (llama2.c .bin + tok512.bin) → GGUF: tensors byte-identical
 *    to llama.cpp's own stories260K.gguf (q/k permutation included), same
 *    vocabulary, and the PyTorch logits when loaded back;
 *  - tokenizers embedded in GGUF (gpt2 and llama kinds) encode llama.cpp's
 *    tokenizer test vectors exactly as Hugging Face did;
 *  - Hugging Face tokenizer files written from GGUF files (a whole model
 *    exported --to hf, or a vocabulary-only GGUF), from llama2.c's
 *    tokenizer.bin and from the byte-level families: read back by our loader
 *    they encode llama.cpp's vectors as Hugging Face did and everything as
 *    the tokenizer they came from; the merges derived from Llama 2's scores
 *    are the ones in transformers' Llama 2 tokenizer.json; tokenizers with no
 *    such form fail clearly and leave no folder. (test_tokenizer_hf_js.c has
 *    transformers.js read the same folders.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "decoder_goldens.h"
#include "export/export_files.h"
#include "export/export_gguf.h"
#include "export/export_hf.h"
#include "export/export_job.h"
#include "export/merge.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/loader.h"
#include "testing.h"
#include "text/tokenizer.h"
#include "text/tokenizer_export.h"
#include "text/tokenizer_hf_export.h"
#include "train/run_files.h"

static char tmp_root[64];

static char *tmp_path(const char *name)
{
    return at_path_join(tmp_root, name);
}

/* Logits of model `path` (loaded as f32) on golden g's ids; max relative
 * error over the valid positions, or +inf on failure. *out_logits (optional)
 * gets the logits [B·T, V] (caller frees). */
static double model_err(const char *path, const golden *g, float **out_logits)
{
    at_load_options lo = at_load_options_default();
    lo.dtype = AT_F32;
    at_decoder *d = NULL;
    double err = INFINITY;
    at_tensor *ids = NULL, *logits = NULL;
    at_decoder_acts *acts = NULL;
    CHECK_OK(at_decoder_load(path, &lo, &d));
    if (!d) return err;
    int64_t sh[2] = {g->B, g->T}, shl[2] = {(int64_t)g->B * g->T, g->V};
    CHECK_OK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &ids));
    CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shl, "logits", &logits));
    CHECK_OK(at_decoder_acts_new(d, g->B, g->T, &acts));
    if (ids && logits && acts && at_tensor_upload(ids, g->ids, (size_t)g->B * g->T * sizeof(int32_t)) == AT_OK &&
        at_decoder_forward(d, acts, ids, NULL, NULL) == AT_OK &&
        at_decoder_logits(d, logits, &acts->final_norm) == AT_OK) {
        const float *got = at_tensor_data(logits);
        err = 0;
        for (int b = 0; b < g->B; b++) {
            double e = golden_rel_err_seq(g, b, got, g->T, 0, g->len[b]);
            if (!(e <= err)) err = e;
        }
        if (out_logits) {
            *out_logits = malloc(at_tensor_nbytes(logits));
            if (*out_logits) memcpy(*out_logits, got, at_tensor_nbytes(logits));
        }
    }
    at_tensor_free(ids);
    at_tensor_free(logits);
    at_decoder_acts_free(acts);
    at_decoder_free(d);
    return err;
}

/* max |a - b| / max |b| over n values. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static int no_staging_left(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -d %.60s/*.tmp-* %.60s/*.old-* >/dev/null 2>&1", tmp_root, tmp_root);
    return system(cmd) != 0;
}

static void test_merge_rounding(const char *merged_dir);

/* ---- merge → HF folder → load: the unmerged PyTorch logits ------------- */

static void test_merge_hf(const char *name, double tol)
{
    char model[256], adapters[256], gname[128], out_name[128];
    snprintf(model, sizeof model, GOLDEN_DIR "/%s", name);
    snprintf(adapters, sizeof adapters, "tests/data/export/%s_lora", name);
    snprintf(gname, sizeof gname, "../export/%s_lora", name);
    snprintf(out_name, sizeof out_name, "%s_merged", name);
    golden g;
    CHECK_OK(golden_load(gname, &g));
    if (!g.logits) return;
    char *out = tmp_path(out_name);
    at_export_args a = {.model = model, .adapters = adapters, .merge_lora = 1, .to = "hf", .output_dir = out,
                        .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    double base_err = model_err(model, &g, NULL); /* the base alone must NOT match */
    double err = model_err(out, &g, NULL);
    printf("merge %-16s merged HF folder vs PyTorch base+unmerged LoRA: max rel err %.2e (base alone: %.2f)\n", name,
           err, base_err);
    CHECK_MSG(err < tol, "%s: merged logits rel err %g >= %g", name, err, tol);
    CHECK_MSG(base_err > 0.05, "%s: the adapter does not change the logits (%g)", name, base_err);

    /* The folder: config with the model's dtype, manifest that verifies. */
    char *cfgp = at_path_join(out, "config.json");
    at_model_config c0, c1;
    CHECK_OK(at_model_config_load(model, &c0));
    CHECK_OK(at_model_config_load(cfgp, &c1));
    CHECK(c1.has_dtype && c0.has_dtype && c1.dtype == c0.dtype && c1.hidden_size == c0.hidden_size);
    CHECK_OK(at_manifest_verify(out));
    at_st_model *st = NULL;
    CHECK_OK(at_st_model_open(out, &st));
    if (st) {
        const at_st_info *q = at_st_model_find(st, "model.layers.0.self_attn.q_proj.weight");
        CHECK(q && q->has_dtype && q->dtype == c0.dtype);
        CHECK(at_st_metadata(at_st_model_shard(st, 0), "format") &&
              !strcmp(at_st_metadata(at_st_model_shard(st, 0), "format"), "pt"));
        CHECK((at_st_model_find(st, "lm_head.weight") != NULL) == !c0.tie_word_embeddings);
        at_st_model_close(st);
    }

    /* f32 merge of a bf16 model: the difference above is bf16 rounding only. */
    if (c0.has_dtype && c0.dtype == AT_BF16) {
        test_merge_rounding(out);
        char *out32 = tmp_path("bf16_as_f32");
        a.output_dir = out32;
        a.dtype = AT_F32;
        CHECK_OK(at_export_run(&a));
        double e32 = model_err(out32, &g, NULL);
        printf("merge %-16s stored as f32 instead: max rel err %.2e\n", name, e32);
        CHECK_MSG(e32 < 1e-5, "%s: f32 merge rel err %g", name, e32);
        at_remove_tree(out32);
        free(out32);
    }
    free(cfgp);
    free(out);
    golden_free(&g);
}

/* One merged bf16 matrix against W' = bf16(W + s·B·A) computed here in
 * double from the input files: the merge rounds once, to nearest. */
static void test_merge_rounding(const char *merged_dir)
{
    const char *wname = "model.layers.1.mlp.down_proj.weight";
    const char *aname = "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight";
    const char *bname = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
    at_st_model *base = NULL, *out = NULL;
    at_st_file *ad = NULL;
    at_tensor *W = NULL, *A = NULL, *B = NULL, *M = NULL;
    CHECK_OK(at_st_model_open(GOLDEN_DIR "/llama_bf16", &base));
    CHECK_OK(at_st_model_open(merged_dir, &out));
    CHECK_OK(at_st_open("tests/data/export/llama_bf16_lora/adapter_model.safetensors", &ad));
    if (base && out && ad) {
        CHECK_OK(at_st_get(base, wname, 0, NULL, AT_F32, &W));
        CHECK_OK(at_st_get(out, wname, 0, NULL, AT_BF16, &M));
        CHECK_OK(at_st_tensor(at_st_find(ad, aname), AT_F32, &A));
        CHECK_OK(at_st_tensor(at_st_find(ad, bname), AT_F32, &B));
    }
    if (W && M && A && B) {
        int64_t rows = W->shape[0], cols = W->shape[1], r = A->shape[0];
        const float *w = at_tensor_data(W), *a = at_tensor_data(A), *b = at_tensor_data(B);
        const uint16_t *m = at_tensor_data(M);
        size_t exact = 0, far = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                double acc = w[i * cols + j];
                for (int64_t k = 0; k < r; k++) acc += 4.0 * b[i * r + k] * a[k * cols + j];
                uint16_t want = at_f32_to_bf16((float)acc);
                uint16_t got = m[i * cols + j];
                exact += got == want;
                far += abs((int)got - (int)want) > 1;
            }
        printf("merge llama_bf16       %s: %zu/%lld values equal bf16(W + s*B*A) computed in double, %zu off by "
               "more than 1 ulp\n", wname, exact, (long long)(rows * cols), far);
        CHECK(far == 0 && exact * 100 >= (size_t)(rows * cols) * 99);
    }
    at_tensor_free(W);
    at_tensor_free(A);
    at_tensor_free(B);
    at_tensor_free(M);
    at_st_model_close(base);
    at_st_model_close(out);
    at_st_close(ad);
}

/* ---- sharding, overwrite, manifest ------------------------------------------ */

static void test_shards_and_safety(void)
{
    const char *model = GOLDEN_DIR "/llama_gqa";
    golden g;
    CHECK_OK(golden_load("llama_gqa", &g));
    char *one = tmp_path("gqa_one"), *many = tmp_path("gqa_many");
    at_export_args a = {.model = model, .to = "hf", .output_dir = one, .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    a.output_dir = many;
    a.max_shard_size = 60000; /* ~340 KB of f32 weights: several files */
    CHECK_OK(at_export_run(&a));
    char *idx = at_path_join(many, "model.safetensors.index.json");
    cJSON *j = NULL;
    CHECK_OK(at_json_parse_file(idx, &j));
    size_t n_files = 0;
    if (j) {
        const cJSON *wm = cJSON_GetObjectItem(j, "weight_map");
        const cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "total_size");
        CHECK(cJSON_IsObject(wm) && cJSON_IsNumber(ts));
        int n = cJSON_GetArraySize(wm);
        at_st_model *m1 = NULL;
        CHECK_OK(at_st_model_open(one, &m1));
        if (m1) {
            CHECK_MSG((size_t)n == at_st_model_count(m1), "weight_map has %d names, the model %zu", n,
                      at_st_model_count(m1));
            double total = 0;
            for (size_t i = 0; i < at_st_model_count(m1); i++) total += (double)at_st_model_info_at(m1, i)->nbytes;
            CHECK(ts && ts->valuedouble == total);
            at_st_model_close(m1);
        }
        const cJSON *e;
        const char *prev = "";
        cJSON_ArrayForEach(e, wm)
        {
            CHECK(strcmp(prev, e->string) < 0); /* sorted, as transformers writes it */
            prev = e->string;
        }
        cJSON_ArrayForEach(e, wm) CHECK(!strncmp(e->valuestring, "model-0000", 10) && strstr(e->valuestring, "-of-0000"));
        at_st_model *mm = NULL;
        CHECK_OK(at_st_model_open(many, &mm));
        if (mm) {
            n_files = at_st_model_shard_count(mm);
            at_st_model_close(mm);
        }
    }
    CHECK_MSG(n_files >= 3, "only %zu shards", n_files);
    float *l1 = NULL, *l2 = NULL;
    double e1 = model_err(one, &g, &l1), e2 = model_err(many, &g, &l2);
    CHECK(e1 < 1e-4 && e2 < 1e-4);
    if (l1 && l2) CHECK(memcmp(l1, l2, (size_t)g.B * g.T * g.V * sizeof(float)) == 0);
    printf("shards: %zu files + index load back to identical logits (rel err vs golden %.2e)\n", n_files, e2);
    CHECK_OK(at_manifest_verify(many));

    /* Refusal to overwrite, and --overwrite replacing the folder whole. */
    a.max_shard_size = 0;
    CHECK_FAILS(at_export_run(&a), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "--overwrite") != NULL);
    a.overwrite = 1;
    CHECK_OK(at_export_run(&a));
    char *shard1 = at_path_join(many, "model-00001-of-00002.safetensors");
    char *single = at_path_join(many, "model.safetensors");
    CHECK(at_file_exists(single) && !at_file_exists(shard1) && !at_file_exists(idx));
    CHECK_OK(at_manifest_verify(many));
    /* A damaged file is caught by the manifest. */
    FILE *f = fopen(single, "r+b");
    if (f) {
        fseek(f, 100, SEEK_SET);
        fputc(0x5a, f);
        fclose(f);
    }
    CHECK(at_manifest_verify(many) != AT_OK);
    /* Bad input: a clear error, nothing left behind. */
    char *bad = tmp_path("bad");
    at_export_args b = {.model = "tests/data/export/no_such_model", .to = "hf", .output_dir = bad,
                        .dtype = AT_DTYPE_COUNT};
    CHECK(at_export_run(&b) != AT_OK);
    b.model = model;
    b.to = "onnx";
    CHECK_FAILS(at_export_run(&b), AT_ERR_INVALID);
    b.to = "hf";
    b.adapters = "tests/data/export/qwen3_qknorm_lora"; /* shapes of another model */
    b.merge_lora = 1;
    CHECK(at_export_run(&b) != AT_OK);
    CHECK(!at_file_exists(bad));
    CHECK(no_staging_left());
    int64_t sz = 0;
    CHECK_OK(at_export_parse_size("5GB", &sz));
    CHECK(sz == 5000000000LL);
    CHECK_OK(at_export_parse_size("2GiB", &sz));
    CHECK(sz == 2147483648LL);
    CHECK(at_export_parse_size("12 parsecs", &sz) != AT_OK);
    free(bad);
    free(shard1);
    free(single);
    free(idx);
    cJSON_Delete(j);
    free(l1);
    free(l2);
    free(one);
    free(many);
    golden_free(&g);
}

/* ---- PEFT adapter alone -------------------------------------------------- */

/* PEFT's naming (peft/tuners/lora: the module path inside
 * PeftModelForCausalLM, "base_model.model." + the transformers module name,
 * then ".lora_A.weight" / ".lora_B.weight"; lora_A is nn.Linear(in, r),
 * lora_B nn.Linear(r, out)). Returns the module's index or -1. */
static int peft_name(const char *s, int *layer, int *is_b)
{
    static const char *const mods[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const char *pre = "base_model.model.model.layers.";
    if (strncmp(s, pre, strlen(pre))) return -1;
    s += strlen(pre);
    char *end;
    long l = strtol(s, &end, 10);
    if (end == s || *end != '.') return -1;
    s = end + 1;
    for (int m = 0; m < 7; m++) {
        size_t k = strlen(mods[m]);
        if (strncmp(s, mods[m], k)) continue;
        if (!strcmp(s + k, ".lora_A.weight")) *is_b = 0;
        else if (!strcmp(s + k, ".lora_B.weight")) *is_b = 1;
        else return -1;
        *layer = (int)l;
        return m;
    }
    return -1;
}

static void test_peft(void)
{
    const char *model = GOLDEN_DIR "/llama_gqa", *adapters = "tests/data/export/llama_gqa_lora";
    char *out = tmp_path("gqa_peft");
    at_export_args a = {.model = model, .adapters = adapters, .to = "hf", .output_dir = out, .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    CHECK_OK(at_manifest_verify(out));
    at_model_config cfg;
    CHECK_OK(at_model_config_load(model, &cfg));
    char *cp = at_path_join(out, "adapter_config.json"), *tp = at_path_join(out, "adapter_model.safetensors");
    char *srcp = at_path_join(adapters, "adapter_model.safetensors");
    cJSON *j = NULL;
    CHECK_OK(at_json_parse_file(cp, &j));
    if (j) {
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "peft_type")), "LORA"));
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "task_type")), "CAUSAL_LM"));
        CHECK(cJSON_GetObjectItem(j, "r")->valueint == 4 && cJSON_GetObjectItem(j, "lora_alpha")->valuedouble == 8);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "target_modules")) == 7);
    }
    at_st_file *f = NULL, *src = NULL;
    CHECK_OK(at_st_open(tp, &f));
    CHECK_OK(at_st_open(srcp, &src));
    if (f && src) {
        CHECK(at_st_count(f) == (size_t)cfg.num_hidden_layers * 7 * 2);
        int bad_names = 0, bad_shapes = 0, bad_values = 0;
        for (size_t i = 0; i < at_st_count(f); i++) {
            const at_st_info *t = at_st_info_at(f, i);
            int layer, is_b, m = peft_name(t->name, &layer, &is_b);
            if (m < 0 || layer >= cfg.num_hidden_layers) {
                bad_names++;
                continue;
            }
            int64_t in, outf;
            at_module_dims(&cfg, (at_module)m, &in, &outf);
            if (t->ndim != 2 || t->shape[0] != (is_b ? outf : 4) || t->shape[1] != (is_b ? 4 : in)) bad_shapes++;
            const at_st_info *s = at_st_find(src, t->name);
            if (!s || s->nbytes != t->nbytes || memcmp(s->data, t->data, t->nbytes) != 0) bad_values++;
        }
        CHECK_MSG(bad_names == 0 && bad_shapes == 0 && bad_values == 0, "names %d shapes %d values %d", bad_names,
                  bad_shapes, bad_values);
        printf("peft: %zu tensors, PEFT names and [r,in]/[out,r] shapes, values identical to the input\n",
               at_st_count(f));
    }
    at_st_close(f);
    at_st_close(src);
    cJSON_Delete(j);
    free(cp);
    free(tp);
    free(srcp);
    free(out);
}

/* ---- GGUF round trips ----------------------------------------------------- */

static void test_gguf_roundtrip(const char *name, at_dtype q, double tol)
{
    char model[256], out_name[128], file[64];
    snprintf(model, sizeof model, GOLDEN_DIR "/%s", name);
    snprintf(out_name, sizeof out_name, "%s_gguf_%s", name, at_dtype_name(q));
    golden g;
    CHECK_OK(golden_load(name, &g));
    if (!g.logits) return;
    char *out = tmp_path(out_name);
    at_export_args a = {.model = model, .to = "gguf", .output_dir = out, .dtype = q};
    CHECK_OK(at_export_run(&a));
    at_export_gguf_file_name(&a, q, file, sizeof file);
    char *path = at_path_join(out, file);
    float *ls = NULL, *lg = NULL;
    model_err(model, &g, &ls);
    double eg = model_err(path, &g, &lg);
    double d = ls && lg ? rel_diff(lg, ls, (size_t)g.B * g.T * g.V) : INFINITY;
    printf("gguf %-16s %-4s loaded back vs the safetensors model: max rel diff %.2e (vs PyTorch %.2e)\n", name,
           at_dtype_name(q), d, eg);
    CHECK_MSG(d <= tol, "%s %s: GGUF logits differ by %g", name, at_dtype_name(q), d);
    CHECK_OK(at_manifest_verify(out));
    at_gguf *gg = NULL;
    CHECK_OK(at_gguf_open(path, &gg));
    if (gg) {
        at_model_config c0;
        CHECK_OK(at_model_config_load(model, &c0));
        const char *arch = NULL;
        CHECK_OK(at_gguf_get_string(gg, "general.architecture", &arch, NULL));
        CHECK(arch && !strcmp(arch, at_export_gguf_arch(&c0)));
        const at_gguf_tensor_info *ti = at_gguf_find_tensor(gg, "blk.0.attn_q.weight");
        CHECK(ti && (int)ti->type == at_ggml_from_dtype(q) && ti->ne[0] == c0.hidden_size);
        const at_gguf_tensor_info *nn = at_gguf_find_tensor(gg, "blk.0.attn_norm.weight");
        CHECK(nn && nn->type == AT_GGML_F32);
        CHECK((at_gguf_find_tensor(gg, "output.weight") == NULL) == (c0.tie_word_embeddings != 0));
        at_gguf_close(gg);
    }
    free(ls);
    free(lg);
    free(path);
    free(out);
    golden_free(&g);
}

/* Merged + GGUF: the PyTorch unmerged-adapter logits again. */
static void test_gguf_merged(const char *name, double tol)
{
    char model[256], adapters[256], gname[128], out_name[128], file[64];
    snprintf(model, sizeof model, GOLDEN_DIR "/%s", name);
    snprintf(adapters, sizeof adapters, "tests/data/export/%s_lora", name);
    snprintf(gname, sizeof gname, "../export/%s_lora", name);
    snprintf(out_name, sizeof out_name, "%s_merged_gguf", name);
    golden g;
    CHECK_OK(golden_load(gname, &g));
    if (!g.logits) return;
    char *out = tmp_path(out_name);
    at_export_args a = {.model = model, .adapters = adapters, .merge_lora = 1, .to = "gguf", .output_dir = out,
                        .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    at_model_config c;
    CHECK_OK(at_model_config_load(model, &c));
    at_export_gguf_file_name(&a, c.has_dtype ? c.dtype : AT_F32, file, sizeof file);
    char *path = at_path_join(out, file);
    double e = model_err(path, &g, NULL);
    printf("gguf %-16s merged, vs PyTorch base+unmerged LoRA: max rel err %.2e\n", name, e);
    CHECK_MSG(e < tol, "%s: merged GGUF rel err %g", name, e);
    free(path);
    free(out);
    golden_free(&g);
}

/* Llama 3.1 scaling: rope_freqs.weight[k] = default inv_freq / scaled
 * inv_freq, the scaled one as PyTorch computed it (the golden's inv_freq). */
static void test_rope_freqs(void)
{
    golden g;
    CHECK_OK(golden_load("llama3_rope", &g));
    char *out = tmp_path("llama3_gguf");
    at_export_args a = {.model = GOLDEN_DIR "/llama3_rope", .to = "gguf", .output_dir = out, .dtype = AT_F32};
    CHECK_OK(at_export_run(&a));
    char *path = at_path_join(out, "model-f32.gguf");
    at_gguf *gg = NULL;
    CHECK_OK(at_gguf_open(path, &gg));
    if (gg && g.inv_freq) {
        at_tensor *t = NULL;
        CHECK_OK(at_gguf_get_tensor(gg, "rope_freqs.weight", AT_F32, &t));
        if (t) {
            CHECK(at_tensor_numel(t) == g.n_inv);
            const float *f = at_tensor_data(t);
            double worst = 0;
            for (int k = 0; k < g.n_inv; k++) {
                double def = 1.0 / pow(500000.0, 2.0 * k / 16.0);
                double want = def / g.inv_freq[k];
                double e = fabs(f[k] - want) / want;
                if (e > worst) worst = e;
            }
            printf("gguf llama3_rope      rope_freqs vs PyTorch inv_freq ratio: max rel err %.2e\n", worst);
            CHECK(worst < 1e-5);
            at_tensor_free(t);
        }
        /* and the file loads back: the factors give PyTorch's logits */
        double err = model_err(path, &g, NULL);
        printf("gguf llama3_rope      loaded back vs PyTorch logits: max rel err %.2e\n", err);
        CHECK(err < 1e-4);
    }
    at_gguf_close(gg);
    free(path);
    free(out);
    golden_free(&g);
}

/* ---- stories260K: llama2.c → GGUF against llama.cpp's own file ---------- */

static void test_stories(void)
{
    char *out = tmp_path("stories_gguf");
    at_export_args a = {.model = "tests/data/models/stories260K.bin", .tokenizer = GOLDEN_DIR "/tok512.bin",
                        .to = "gguf", .output_dir = out, .dtype = AT_F32};
    CHECK_OK(at_export_run(&a));
    char *path = at_path_join(out, "model-f32.gguf");
    at_gguf *ours = NULL, *ref = NULL;
    CHECK_OK(at_gguf_open(path, &ours));
    CHECK_OK(at_gguf_open("tests/data/models/stories260K.gguf", &ref));
    if (ours && ref) {
        /* Every tensor of ours is in llama.cpp's file, same type, shape and bytes. */
        size_t same = 0, n = at_gguf_tensor_count(ours);
        for (size_t i = 0; i < n; i++) {
            const at_gguf_tensor_info *t = at_gguf_tensor_at(ours, i), *r = at_gguf_find_tensor(ref, t->name);
            int ok = r && r->type == t->type && r->n_dims == t->n_dims && r->nbytes == t->nbytes &&
                     memcmp(r->ne, t->ne, sizeof t->ne) == 0 && memcmp(r->data, t->data, t->nbytes) == 0;
            CHECK_MSG(ok, "stories260K: tensor %s differs from llama.cpp's", t->name);
            same += (size_t)ok;
        }
        /* llama.cpp's file also stores output.weight (= token_embd); ours is tied. */
        CHECK(n + 1 == at_gguf_tensor_count(ref) && !at_gguf_find_tensor(ours, "output.weight"));
        const char *keys[] = {"llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
                              "llama.attention.head_count_kv", "llama.block_count", "llama.rope.dimension_count",
                              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                              "tokenizer.ggml.unknown_token_id"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            int64_t x = -1, y = -2;
            CHECK_OK(at_gguf_get_int(ours, keys[k], &x));
            CHECK_OK(at_gguf_get_int(ref, keys[k], &y));
            CHECK_MSG(x == y, "%s: %lld, llama.cpp %lld", keys[k], (long long)x, (long long)y);
        }
        double e1 = 0, e2 = 0;
        CHECK_OK(at_gguf_get_float(ours, "llama.attention.layer_norm_rms_epsilon", &e1));
        CHECK_OK(at_gguf_get_float(ref, "llama.attention.layer_norm_rms_epsilon", &e2));
        CHECK(e1 == e2);
        const char *m = NULL;
        CHECK_OK(at_gguf_get_string(ours, "tokenizer.ggml.model", &m, NULL));
        CHECK(m && !strcmp(m, "llama"));
        /* The vocabulary: tokens, scores, types as llama.cpp's converter wrote them. */
        const char *arrs[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"};
        for (size_t k = 0; k < 3; k++) {
            const at_gguf_value *x = at_gguf_get(ours, arrs[k]), *y = at_gguf_get(ref, arrs[k]);
            int ok = x && y && x->v.arr.count == y->v.arr.count;
            size_t bad = 0;
            for (size_t i = 0; ok && i < x->v.arr.count; i++) {
                at_gguf_value ex, ey;
                at_gguf_value_elem(x, i, &ex);
                at_gguf_value_elem(y, i, &ey);
                if (ex.type == AT_GGUF_STRING) {
                    bad += ey.type != AT_GGUF_STRING || ex.v.str.len != ey.v.str.len ||
                           memcmp(ex.v.str.s, ey.v.str.s, ex.v.str.len) != 0;
                } else {
                    double fx = 0, fy = 0;
                    at_gguf_value_float(&ex, &fx);
                    at_gguf_value_float(&ey, &fy);
                    bad += fx != fy;
                }
            }
            CHECK_MSG(ok && bad == 0, "%s: %zu entries differ from llama.cpp's", arrs[k], bad);
        }
        printf("stories260K: %zu/%zu tensors byte-identical to llama.cpp's stories260K.gguf; vocabulary identical\n",
               same, n);
    }
    at_gguf_close(ours);
    at_gguf_close(ref);
    golden g;
    CHECK_OK(golden_load("stories260K", &g));
    if (g.logits) {
        double e = model_err(path, &g, NULL);
        printf("stories260K: exported GGUF vs PyTorch llama2.c logits: max rel err %.2e\n", e);
        CHECK(e < 1e-4);
        golden_free(&g);
    }
    free(path);
    free(out);
}

/* Q8_0 / Q4_0: the quantized stories260K loaded back stays close to the
 * PyTorch logits; rows not a multiple of 32 (ffn_down, 172) are F16. */
static void test_quantized(at_dtype q, double tol)
{
    char name[64], file[64];
    snprintf(name, sizeof name, "stories_%s", at_dtype_name(q));
    char *out = tmp_path(name);
    at_export_args a = {.model = "tests/data/models/stories260K.bin", .tokenizer = GOLDEN_DIR "/tok512.bin",
                        .to = "gguf", .output_dir = out, .dtype = q};
    CHECK_OK(at_export_run(&a));
    at_export_gguf_file_name(&a, q, file, sizeof file);
    char *path = at_path_join(out, file);
    at_gguf *gg = NULL;
    CHECK_OK(at_gguf_open(path, &gg));
    if (gg) {
        const at_gguf_tensor_info *wq = at_gguf_find_tensor(gg, "blk.0.attn_q.weight");
        const at_gguf_tensor_info *dn = at_gguf_find_tensor(gg, "blk.0.ffn_down.weight");
        CHECK(wq && (int)wq->type == at_ggml_from_dtype(q));
        CHECK(dn && dn->type == AT_GGML_F16);
        int64_t ft = -1;
        CHECK_OK(at_gguf_get_int(gg, "general.file_type", &ft));
        CHECK(ft == (q == AT_Q8_0 ? 7 : 2));
        at_gguf_close(gg);
    }
    /* loaded for inference, the layers' matrices stay as stored (decoding
     * reads the blocks); asked for f32, or writable, they are dequantized */
    at_decoder_weights *w = NULL;
    CHECK_OK(at_decoder_weights_load(path, NULL, &w));
    if (w) {
        CHECK(w->layers[0].wq->dtype == q && w->layers[0].w_up->dtype == q);
        CHECK(w->layers[0].w_down->dtype == AT_F16 && w->embed->dtype == AT_BF16);
        CHECK(w->cfg.tie_word_embeddings && w->lm_head != w->embed && w->lm_head->dtype == q);
        at_decoder_weights_free(w);
    }
    at_load_options lo = at_load_options_default();
    lo.writable = 1;
    CHECK_OK(at_decoder_weights_load(path, &lo, &w));
    if (w) {
        CHECK(w->layers[0].wq->dtype == AT_BF16);
        at_decoder_weights_free(w);
    }
    golden g;
    CHECK_OK(golden_load("stories260K", &g));
    if (g.logits) {
        double e = model_err(path, &g, NULL);
        printf("stories260K: %s GGUF loaded back vs PyTorch f32 logits: max rel err %.2e\n", at_dtype_name(q), e);
        CHECK_MSG(e < tol, "%s: rel err %g", at_dtype_name(q), e);
        golden_free(&g);
    }
    free(path);
    free(out);
}

/* ---- tokenizers embedded in GGUF vs the test vectors -------------------- */

#define TOKDATA "tests/data/tokenizers/"
#define SEP "\n__ggml_vocab_test__\n"

/* Reads llama.cpp's .inp/.out pair; returns the number of cases. */
static size_t read_vectors(const char *vec, char ***texts, size_t **lens, int32_t ***ids, size_t **nids)
{
    char path[256], *inp = NULL, *outp = NULL;
    size_t il = 0, ol = 0, n = 0;
    snprintf(path, sizeof path, TOKDATA "ggml-vocab-%s.gguf.inp", vec);
    if (at_read_file(path, &inp, &il) != AT_OK) return 0;
    snprintf(path, sizeof path, TOKDATA "ggml-vocab-%s.gguf.out", vec);
    if (at_read_file(path, &outp, &ol) != AT_OK) {
        free(inp);
        return 0;
    }
    *texts = NULL;
    *lens = NULL;
    for (char *p = inp; p < inp + il;) {
        char *q = strstr(p, SEP);
        if (!q) break;
        *texts = realloc(*texts, (n + 1) * sizeof **texts);
        *lens = realloc(*lens, (n + 1) * sizeof **lens);
        (*texts)[n] = strndup(p, (size_t)(q - p));
        (*lens)[n] = (size_t)(q - p);
        n++;
        p = q + strlen(SEP);
    }
    *ids = calloc(n, sizeof **ids);
    *nids = calloc(n, sizeof **nids);
    char *line = outp;
    for (size_t i = 0; i < n && line; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        (*ids)[i] = malloc((strlen(line) / 2 + 2) * sizeof(int32_t));
        for (char *t = strtok(line, " "); t; t = strtok(NULL, " ")) (*ids)[i][(*nids)[i]++] = (int32_t)atoi(t);
        line = nl ? nl + 1 : NULL;
    }
    free(inp);
    free(outp);
    return n;
}

/* Exports a random model with t's vocabulary and the tokenizer embedded,
 * reads the tokenizer back from the file, runs the vectors. */
/* Frees what read_vectors returned. */
static void free_vectors(size_t n, char **texts, size_t *lens, int32_t **ids, size_t *nids)
{
    for (size_t i = 0; i < n; i++) {
        free(texts[i]);
        free(ids[i]);
    }
    free(texts);
    free(lens);
    free(ids);
    free(nids);
}

static void test_gguf_tokenizer(const char *label, const char *tok_path, const char *vec, unsigned flags,
                                const char *want_model, const char *want_pre)
{
    at_tokenizer *t = NULL, *back = NULL;
    at_decoder_weights *w = NULL;
    at_gguf *gg = NULL;
    char **texts = NULL;
    size_t *lens = NULL, *nids = NULL;
    int32_t **ids = NULL;
    size_t n = read_vectors(vec, &texts, &lens, &ids, &nids);
    CHECK_MSG(n > 0, "%s: no vectors", label);
    CHECK_OK(at_tokenizer_load(tok_path, NULL, &t));
    char *path = tmp_path("tok.gguf");
    if (t && n) {
        at_model_config c;
        at_model_config_init(&c);
        snprintf(c.model_type, sizeof c.model_type, "llama");
        c.hidden_size = 8;
        c.intermediate_size = 8;
        c.num_hidden_layers = 1;
        c.num_attention_heads = 2;
        c.num_key_value_heads = 2;
        c.head_dim = 4;
        c.vocab_size = (int)at_tokenizer_vocab_size(t);
        c.rms_norm_eps = 1e-5;
        c.max_position_embeddings = 64;
        c.tie_word_embeddings = 1;
        CHECK_OK(at_decoder_weights_random(&c, NULL, AT_F16, 1, &w));
        at_export_gguf_opts o = {.quant = AT_F16, .tok = t, .chat_template = "{{ messages }}"};
        if (w) CHECK_OK(at_export_gguf_model(w, path, &o));
        CHECK_OK(at_gguf_open(path, &gg));
    }
    if (gg) {
        const char *m = NULL, *pre = NULL, *tpl = NULL;
        CHECK_OK(at_gguf_get_string(gg, "tokenizer.ggml.model", &m, NULL));
        CHECK_MSG(m && !strcmp(m, want_model), "%s: model %s, want %s", label, m ? m : "-", want_model);
        if (want_pre) {
            CHECK_OK(at_gguf_get_string(gg, "tokenizer.ggml.pre", &pre, NULL));
            CHECK_MSG(pre && !strcmp(pre, want_pre), "%s: pre %s, want %s", label, pre ? pre : "-", want_pre);
        }
        CHECK_OK(at_gguf_get_string(gg, "tokenizer.chat_template", &tpl, NULL));
        CHECK(tpl && !strcmp(tpl, "{{ messages }}"));
        CHECK_OK(at_export_gguf_read_tokenizer(gg, &back));
    }
    if (back) {
        size_t ok = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t *got = NULL;
            size_t ng = 0;
            CHECK_OK(at_tokenizer_encode(back, texts[i], lens[i], flags, &got, &ng));
            int same = ng == nids[i] && (ng == 0 || memcmp(got, ids[i], ng * sizeof(int32_t)) == 0);
            if (!same) fprintf(stderr, "  %s: case %zu \"%.50s\" differs\n", label, i, texts[i]);
            ok += (size_t)same;
            free(got);
        }
        printf("gguf tokenizer %-34s %zu/%zu test vectors encode as Hugging Face\n", label, ok, n);
        CHECK_MSG(ok == n, "%s: %zu of %zu vectors differ", label, n - ok, n);
    }
    free_vectors(n, texts, lens, ids, nids);
    at_gguf_close(gg);
    at_tokenizer_free(t);
    at_tokenizer_free(back);
    at_decoder_weights_free(w);
    unlink(path);
    free(path);
}

/* The llama2.c tokenizer embedded: encodes like tok512.bin itself. */
static void test_llama2c_tokenizer(void)
{
    at_tokenizer *t = NULL, *back = NULL;
    at_tokenizer_gguf *g = NULL;
    CHECK_OK(at_tokenizer_load(GOLDEN_DIR "/tok512.bin", NULL, &t));
    if (t) CHECK_OK(at_tokenizer_to_gguf(t, &g));
    if (g) {
        at_tokenizer_arrays arr;
        at_tokenizer_gguf_arrays(g, &arr);
        CHECK_OK(at_tokenizer_from_arrays(&arr, &back));
    }
    if (back) {
        const char *texts[] = {"Once upon a time, there was a little girl named Lily.", "She liked to play outside!",
                               "  two  spaces and a tab\tand é ü 日本"};
        for (size_t i = 0; i < 3; i++) {
            int32_t *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            CHECK_OK(at_tokenizer_encode(t, texts[i], strlen(texts[i]), AT_TOK_ADD_SPECIAL, &a, &na));
            CHECK_OK(at_tokenizer_encode(back, texts[i], strlen(texts[i]), AT_TOK_ADD_SPECIAL, &b, &nb));
            CHECK_MSG(na == nb && na && !memcmp(a, b, na * sizeof *a), "llama2c tokenizer: \"%s\" differs", texts[i]);
            free(a);
            free(b);
        }
    }
    at_tokenizer_gguf_free(g);
    at_tokenizer_free(t);
    at_tokenizer_free(back);
}

/* ---- Hugging Face tokenizer files written from GGUF / llama2.c ------------ */

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Loads the tokenizer of folder dir (what at_tokenizer_load makes of the
 * written tokenizer.json + tokenizer_config.json) and checks it against
 *   - llama.cpp's vectors `vec` (ids Hugging Face gave), when vec is set;
 *   - src, the tokenizer it was written from: the same ids for the vectors'
 *     texts (or `texts_of`'s when vec is NULL) and the probe text, the same
 *     text decoded, the same BOS/EOS/UNK, and BOS added alike;
 *   - decode(ids) giving the text back (skip when the source does not). */
static void check_hf_dir(const char *label, const at_tokenizer *src, const char *dir, const char *vec,
                         const char *texts_of, unsigned flags)
{
    at_tokenizer *back = NULL;
    char **texts = NULL;
    size_t *lens = NULL, *nids = NULL;
    int32_t **ids = NULL;
    size_t n = read_vectors(vec ? vec : texts_of, &texts, &lens, &ids, &nids);
    CHECK_MSG(n > 0, "%s: no test texts", label);
    CHECK_OK(at_tokenizer_load(dir, NULL, &back));
    if (!back) goto done;
    CHECK(at_tokenizer_bos(back) == at_tokenizer_bos(src) && at_tokenizer_eos(back) == at_tokenizer_eos(src));
    CHECK_MSG(at_tokenizer_unk(back) == at_tokenizer_unk(src) || at_tokenizer_unk(src) < 0, "%s: unk %d, source %d",
              label, (int)at_tokenizer_unk(back), (int)at_tokenizer_unk(src));
    size_t ok = 0, same = 0, dec = 0, round = 0, nonempty = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *text = i < n ? texts[i] : at_tokenizer_probe_text();
        size_t len = i < n ? lens[i] : strlen(text);
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK_OK(at_tokenizer_encode(back, text, len, flags, &a, &na));
        CHECK_OK(at_tokenizer_encode(src, text, len, flags, &b, &nb));
        if (vec && i < n) {
            int good = ids_equal(a, na, ids[i], nids[i]);
            if (!good) fprintf(stderr, "  %s: case %zu \"%.40s\" differs from Hugging Face's ids\n", label, i, text);
            ok += (size_t)good;
        }
        int alike = ids_equal(a, na, b, nb);
        if (!alike) fprintf(stderr, "  %s: \"%.40s\" encodes unlike the source tokenizer\n", label, text);
        same += (size_t)alike;
        if (na) {
            char *da = NULL, *db = NULL;
            size_t la = 0, lb = 0;
            nonempty++;
            CHECK_OK(at_tokenizer_decode(back, a, na, 0, &da, &la));
            CHECK_OK(at_tokenizer_decode(src, a, na, 0, &db, &lb));
            dec += da && db && la == lb && memcmp(da, db, la) == 0;
            round += da && la == len && memcmp(da, text, len) == 0;
            free(da);
            free(db);
        }
        free(a);
        free(b);
    }
    /* BOS (and EOS) from the post-processor, as the source adds them. */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK_OK(at_tokenizer_encode(back, "Hello world", 11, AT_TOK_ADD_SPECIAL, &a, &na));
    CHECK_OK(at_tokenizer_encode(src, "Hello world", 11, AT_TOK_ADD_SPECIAL, &b, &nb));
    CHECK_MSG(ids_equal(a, na, b, nb), "%s: special tokens added unlike the source", label);
    free(a);
    free(b);
    if (vec) {
        printf("hf tokenizer %-28s %zu/%zu vectors as Hugging Face", label, ok, n);
        CHECK_MSG(ok == n, "%s: %zu of %zu vectors differ", label, n - ok, n);
    } else {
        printf("hf tokenizer %-28s", label);
    }
    printf(", %zu/%zu texts as the source, %zu/%zu decode alike, %zu round trip\n", same, n + 1, dec, nonempty, round);
    CHECK_MSG(same == n + 1 && dec == nonempty, "%s: differs from its source tokenizer", label);
done:
    at_tokenizer_free(back);
    free_vectors(n, texts, lens, ids, nids);
}

/* Whether file dir/name holds `want` (a JSON value at key). */
static cJSON *read_json_in(const char *dir, const char *name)
{
    char *p = at_path_join(dir, name);
    cJSON *j = NULL;
    CHECK_OK(at_json_parse_file(p, &j));
    free(p);
    return j;
}

/* A model GGUF → Hugging Face folder with at_export_run: the folder has the
 * tokenizer files, loads in our loader, and encodes as the GGUF did. */
static void test_hf_from_gguf_model(const char *label, const char *gguf, const char *vec, const char *texts_of,
                                    int64_t ctx_len)
{
    char name[64];
    snprintf(name, sizeof name, "hf_tok_%s", label);
    char *out = tmp_path(name);
    at_export_args a = {.model = gguf, .to = "hf", .output_dir = out, .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    at_gguf *g = NULL;
    at_tokenizer *src = NULL;
    CHECK_OK(at_gguf_open(gguf, &g));
    if (g) CHECK_OK(at_export_gguf_read_tokenizer(g, &src));
    if (src) check_hf_dir(label, src, out, vec, texts_of, 0);
    cJSON *cfg = read_json_in(out, "tokenizer_config.json");
    if (cfg) {
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length");
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
        CHECK(cJSON_IsNumber(mx) && (int64_t)mx->valuedouble == ctx_len);
        CHECK(cJSON_IsString(cls) && !strcmp(cls->valuestring, "LlamaTokenizerFast"));
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token")));
    }
    cJSON_Delete(cfg);
    char *mf = at_path_join(out, "special_tokens_map.json");
    CHECK(at_file_exists(mf));
    free(mf);
    at_tokenizer_free(src);
    at_gguf_close(g);
    free(out);
}

/* A vocabulary-only GGUF (no weights): the tokenizer written with
 * at_tokenizer_hf_write, read back, run on the vectors. */
/* src written with at_tokenizer_hf_write into the temporary folder
 * PREFIX_LABEL, read back and run on the vectors (check_hf_dir). */
static void hf_write_and_check(const char *prefix, const char *label, const at_tokenizer *src, const char *vec,
                               unsigned flags)
{
    char name[64];
    snprintf(name, sizeof name, "%s_%s", prefix, label);
    char *out = tmp_path(name);
    CHECK_OK(at_mkdirs(out));
    if (src) {
        CHECK_OK(at_tokenizer_hf_write(src, NULL, out));
        check_hf_dir(label, src, out, vec, NULL, flags);
    }
    free(out);
}

static void test_hf_from_gguf_vocab(const char *label, const char *gguf, const char *vec, unsigned flags)
{
    at_gguf *g = NULL;
    at_tokenizer *src = NULL;
    CHECK_OK(at_gguf_open(gguf, &g));
    if (g) CHECK_OK(at_export_gguf_read_tokenizer(g, &src));
    hf_write_and_check("hf_vocab", label, src, vec, flags);
    at_tokenizer_free(src);
    at_gguf_close(g);
}

/* Other byte-level families and SentencePiece forms, from the tokenizer
 * folders of tests/data (Hugging Face files) through our writer. */
static void test_hf_from_folder(const char *label, const char *path, const char *vec, unsigned flags)
{
    at_tokenizer *src = NULL;
    CHECK_OK(at_tokenizer_load(path, NULL, &src));
    hf_write_and_check("hf_fam", label, src, vec, flags);
    at_tokenizer_free(src);
}

/* stories260K two ways, llama.cpp's GGUF and the llama2.c .bin with
 * tok512.bin (the same vocabulary, stored differently): both exports write
 * the same tokenizer.json, and the llama2.c tokenizer encodes as the one it
 * was written from. */
static void test_hf_stories(void)
{
    test_hf_from_gguf_model("stories-gguf", "tests/data/models/stories260K.gguf", NULL, "llama-spm", 2048);
    char *out = tmp_path("hf_tok_stories-bin");
    at_export_args a = {.model = "tests/data/models/stories260K.bin", .tokenizer = GOLDEN_DIR "/tok512.bin",
                        .to = "hf", .output_dir = out, .dtype = AT_F32};
    CHECK_OK(at_export_run(&a));
    at_tokenizer *src = NULL;
    CHECK_OK(at_tokenizer_load(GOLDEN_DIR "/tok512.bin", NULL, &src));
    if (src) check_hf_dir("stories-llama2c", src, out, NULL, "llama-spm", 0);
    at_tokenizer_free(src);
    char *p1 = at_path_join(out, "tokenizer.json"), *p2 = tmp_path("hf_tok_stories-gguf/tokenizer.json");
    char *t1 = NULL, *t2 = NULL;
    size_t l1 = 0, l2 = 0;
    CHECK_OK(at_read_file(p1, &t1, &l1));
    CHECK_OK(at_read_file(p2, &t2, &l2));
    CHECK_MSG(t1 && t2 && l1 == l2 && !memcmp(t1, t2, l1),
              "stories260K: tokenizer.json from the llama2.c tokenizer differs from the one from the GGUF");
    /* Without --tokenizer: the tokenizer.bin beside the checkpoint, as infer
     * finds it (here the only tok*.bin). */
    char *src_dir = tmp_path("l2c_src"), *beside = tmp_path("hf_tok_stories-beside");
    char *m = at_path_join(src_dir, "model.bin"), *tb = at_path_join(src_dir, "tok512.bin");
    CHECK_OK(at_mkdirs(src_dir));
    CHECK_OK(at_export_copy_file("tests/data/models/stories260K.bin", m));
    CHECK_OK(at_export_copy_file(GOLDEN_DIR "/tok512.bin", tb));
    at_export_args b = {.model = m, .to = "hf", .output_dir = beside, .dtype = AT_F32};
    CHECK_OK(at_export_run(&b));
    char *p3 = at_path_join(beside, "tokenizer.json"), *t3 = NULL;
    size_t l3 = 0;
    CHECK_OK(at_read_file(p3, &t3, &l3));
    CHECK(t1 && t3 && l1 == l3 && !memcmp(t1, t3, l1));
    free(t3);
    free(p3);
    free(m);
    free(tb);
    free(src_dir);
    free(beside);
    free(t1);
    free(t2);
    free(p1);
    free(p2);
    free(out);
}

/* The merges derived from Llama 2's scores are the ones transformers wrote
 * into Llama 2's tokenizer.json: tests/data/tokenizers/phi-3 holds them
 * (trimmed: every merge whose parts and result are kept tokens, in the
 * original order), so ours, filtered the same way, must be that list. */
static void test_hf_llama_merges(void)
{
    at_gguf *g = NULL;
    at_tokenizer *t = NULL;
    cJSON *tj = NULL, *cfg = NULL, *map = NULL, *ref = NULL;
    CHECK_OK(at_gguf_open(TOKDATA "ggml-vocab-llama-spm.gguf", &g));
    if (g) CHECK_OK(at_export_gguf_read_tokenizer(g, &t));
    if (t) CHECK_OK(at_tokenizer_hf_build(t, NULL, &tj, &cfg, &map));
    CHECK_OK(at_json_parse_file(TOKDATA "phi-3/tokenizer.json", &ref));
    if (tj && ref) {
        const cJSON *rm = cJSON_GetObjectItemCaseSensitive(ref, "model");
        const cJSON *kept = cJSON_GetObjectItemCaseSensitive(rm, "vocab");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(rm, "merges");
        const cJSON *ours = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "merges");
        const cJSON *w = want ? want->child : NULL, *m;
        size_t n_ours = 0, matched = 0, bad = 0;
        char buf[256];
        cJSON_ArrayForEach(m, ours)
        {
            n_ours++;
            const char *l = cJSON_GetArrayItem(m, 0)->valuestring, *r = cJSON_GetArrayItem(m, 1)->valuestring;
            snprintf(buf, sizeof buf, "%s%s", l, r);
            if (!cJSON_GetObjectItemCaseSensitive(kept, l) || !cJSON_GetObjectItemCaseSensitive(kept, r) ||
                !cJSON_GetObjectItemCaseSensitive(kept, buf))
                continue;
            snprintf(buf, sizeof buf, "%s %s", l, r);
            if (!w || !cJSON_IsString(w) || strcmp(w->valuestring, buf) != 0) {
                if (bad++ < 3) fprintf(stderr, "  llama merges: ours \"%s\", transformers' \"%s\"\n", buf,
                                       w && cJSON_IsString(w) ? w->valuestring : "(end)");
            } else {
                matched++;
            }
            if (w) w = w->next;
        }
        printf("hf tokenizer llama merges: %zu derived from scores (Llama 2: 61249); %zu/%d of transformers' "
               "(trimmed) list matched in order\n",
               n_ours, matched, cJSON_GetArraySize(want));
        CHECK(n_ours == 61249);
        CHECK(bad == 0 && !w && matched == (size_t)cJSON_GetArraySize(want));
    }
    if (cfg) {
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "legacy")));
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(map, "unk_token");
        CHECK(unk && !strcmp(cJSON_GetObjectItemCaseSensitive(unk, "content")->valuestring, "<unk>"));
    }
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    cJSON_Delete(ref);
    at_tokenizer_free(t);
    at_gguf_close(g);
}

/* Copies tests/data/models/stories260K.gguf to tmp/name with its
 * tokenizer.ggml.model value ("llama") replaced by `kind` (5 characters). */
static char *gguf_with_kind(const char *name, const char *kind)
{
    char *data = NULL;
    size_t n = 0;
    char *p = tmp_path(name);
    CHECK_OK(at_read_file("tests/data/models/stories260K.gguf", &data, &n));
    static const char key[] = "tokenizer.ggml.model";
    for (size_t i = 0; data && i + sizeof key + 12 + 5 < n; i++) {
        if (memcmp(data + i, key, sizeof key - 1) != 0) continue;
        char *v = data + i + (sizeof key - 1) + 4 + 8; /* type u32, length u64 */
        CHECK(memcmp(v, "llama", 5) == 0);
        memcpy(v, kind, 5);
        break;
    }
    if (data) CHECK_OK(at_write_file_atomic(p, data, n));
    free(data);
    return p;
}

/* Tokenizers with no Hugging Face form: a clear error naming the kind, and
 * no output folder (the export is staged and renamed). */
static void test_hf_tokenizer_errors(void)
{
    /* a GGUF whose tokenizer kind we do not know */
    char *bad = gguf_with_kind("bert.gguf", "bert5"), *out = tmp_path("hf_bad_kind");
    at_export_args a = {.model = bad, .to = "hf", .output_dir = out, .dtype = AT_DTYPE_COUNT};
    at_status st = at_export_run(&a);
    CHECK(st != AT_OK && strstr(at_last_error(), "bert5") != NULL);
    printf("hf tokenizer: unknown GGUF kind: %s\n", at_last_error());
    CHECK(!at_is_dir(out) && !at_file_exists(out));

    /* a BPE with a subword prefix (WordPiece-like), given as --tokenizer */
    static const char json[] =
        "{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {\"a\": 0, \"b\": 1, "
        "\"##b\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"decoder\": {\"type\": "
        "\"ByteLevel\"}}";
    char *tj = tmp_path("prefix_tokenizer.bpe.json");
    CHECK_OK(at_write_file_atomic(tj, json, sizeof json - 1));
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(tj, NULL, &t));
    if (t) {
        char *dir = tmp_path("hf_prefix");
        CHECK_OK(at_mkdirs(dir));
        st = at_tokenizer_hf_write(t, NULL, dir);
        CHECK(st == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "prefix") != NULL);
        printf("hf tokenizer: subword prefix: %s\n", at_last_error());
        char *f = at_path_join(dir, "tokenizer.json");
        CHECK(!at_file_exists(f));
        free(f);
        free(dir);
        at_tokenizer_free(t);
    }
    at_export_args b = {.model = "tests/data/models/stories260K.bin", .tokenizer = tj, .to = "hf",
                        .output_dir = out, .dtype = AT_F32};
    st = at_export_run(&b);
    CHECK(st == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "prefix") != NULL);
    CHECK(!at_is_dir(out) && !at_file_exists(out));
    free(tj);
    free(bad);
    free(out);
}

/* Token bytes JSON must escape or cannot hold, through a llama2.c
 * tokenizer.bin (which stores any bytes): control characters, quote and
 * backslash come back byte for byte from the written tokenizer.json (parsed
 * by cJSON, an independent reader of JSON escapes); a repeated token keeps
 * its first id; invalid UTF-8 and NUL fail naming the token's id and leave
 * no tokenizer.json. */
static void write_l2c(const char *path, const char *const *toks, const size_t *lens, size_t n)
{
    size_t cap = 4 + n * 8, off = 0;
    for (size_t i = 0; i < n; i++) cap += lens[i];
    char *b = malloc(cap);
    int32_t maxlen = 16;
    memcpy(b, &maxlen, 4);
    off = 4;
    for (size_t i = 0; i < n; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)lens[i];
        memcpy(b + off, &score, 4);
        memcpy(b + off + 4, &len, 4);
        memcpy(b + off + 8, toks[i], lens[i]);
        off += 8 + lens[i];
    }
    CHECK_OK(at_write_file_atomic(path, b, off));
    free(b);
}

static void test_hf_odd_tokens(void)
{
    static const char *const good[] = {"\n<unk>\n", "\n<s>\n", "\n</s>\n", "a", "\n", "\t\x01\x1f\"\\", "\x7f", "a"};
    size_t lens[8];
    for (size_t i = 0; i < 8; i++) lens[i] = strlen(good[i]);
    char *bin = tmp_path("odd_tok.bin"), *dir = tmp_path("hf_odd");
    CHECK_OK(at_mkdirs(dir));
    write_l2c(bin, good, lens, 8);
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(bin, NULL, &t));
    if (t) CHECK_OK(at_tokenizer_hf_write(t, NULL, dir));
    at_tokenizer_free(t);
    cJSON *tj = read_json_in(dir, "tokenizer.json");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "vocab");
    const cJSON *e;
    CHECK((e = cJSON_GetObjectItemCaseSensitive(v, "\n")) && e->valueint == 4);
    CHECK((e = cJSON_GetObjectItemCaseSensitive(v, "\t\x01\x1f\"\\")) && e->valueint == 5);
    CHECK((e = cJSON_GetObjectItemCaseSensitive(v, "\x7f")) && e->valueint == 6);
    CHECK((e = cJSON_GetObjectItemCaseSensitive(v, "a")) && e->valueint == 3);
    CHECK(cJSON_GetArraySize(v) == 7); /* the second "a" (id 7) is left out */
    cJSON_Delete(tj);
    at_tokenizer *back = NULL;
    CHECK_OK(at_tokenizer_load(dir, NULL, &back));
    at_tokenizer_free(back);

    static const char *const bad[][4] = {{"\n<unk>\n", "\n<s>\n", "\n</s>\n", "a\xff"}, {"\n<unk>\n", "\n<s>\n", "\n</s>\n", "a\0b"}};
    for (int k = 0; k < 2; k++) {
        size_t bl[4] = {7, 5, 6, k ? 3u : 2u};
        char name[32];
        snprintf(name, sizeof name, "hf_odd_bad%d", k);
        char *bdir = tmp_path(name), *f = at_path_join(bdir, "tokenizer.json");
        CHECK_OK(at_mkdirs(bdir));
        write_l2c(bin, bad[k], bl, 4);
        t = NULL;
        CHECK_OK(at_tokenizer_load(bin, NULL, &t));
        if (t) {
            at_status st = at_tokenizer_hf_write(t, NULL, bdir);
            CHECK_MSG(st == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "token 3 "), "odd token %d: %s", k,
                      at_last_error());
            CHECK(!at_file_exists(f));
        }
        at_tokenizer_free(t);
        free(f);
        free(bdir);
    }
    free(bin);
    free(dir);
}

/* --tokenizer naming a file that is not called tokenizer.json (here
 * "my-tokenizer.json" beside nothing else: the model's own vocabulary as
 * Hugging Face files) is that tokenizer, loaded and written: not the
 * folder's (absent) tokenizer.json copied. */
static void test_hf_tokenizer_file_arg(void)
{
    char *src = tmp_path("named_tok"), *out = tmp_path("hf_named_tok"), *hf = tmp_path("named_tok_hf");
    char *f = at_path_join(src, "my-tokenizer.json"), *w = at_path_join(out, "tokenizer.json");
    char *hfj = at_path_join(hf, "tokenizer.json");
    CHECK_OK(at_mkdirs(src));
    CHECK_OK(at_mkdirs(hf));
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load("tests/data/goldens/tok512.bin", NULL, &t));
    if (t) CHECK_OK(at_tokenizer_hf_write(t, NULL, hf));
    at_tokenizer_free(t);
    CHECK_OK(at_export_copy_file(hfj, f));
    free(hfj);
    free(hf);
    at_export_args a = {.model = "tests/data/models/stories260K.bin", .tokenizer = f, .to = "hf",
                        .output_dir = out, .dtype = AT_F32};
    CHECK_OK(at_export_run(&a));
    CHECK_MSG(at_file_exists(w), "--tokenizer %s: the export has no tokenizer.json", f);
    free(w);
    free(f);
    free(src);
    free(out);
}

static void test_hf_tokenizers(void)
{
    test_hf_from_gguf_model("llama-2-tiny", "tests/data/models/llama-2-tiny-random.gguf", "llama-spm", NULL, 4096);
    /* the same folder with special tokens in the text (legacy "▁" after </s>) */
    {
        char *out = tmp_path("hf_tok_llama-2-tiny");
        at_gguf *g = NULL;
        at_tokenizer *src = NULL;
        CHECK_OK(at_gguf_open("tests/data/models/llama-2-tiny-random.gguf", &g));
        if (g) CHECK_OK(at_export_gguf_read_tokenizer(g, &src));
        if (src) check_hf_dir("llama-2-tiny (+special)", src, out, "tinyllama", NULL, AT_TOK_PARSE_SPECIAL);
        at_tokenizer_free(src);
        at_gguf_close(g);
        free(out);
    }
    test_hf_stories();
    test_hf_from_gguf_vocab("llama-spm", TOKDATA "ggml-vocab-llama-spm.gguf", "llama-spm", 0);
    test_hf_from_gguf_vocab("gpt-2", "tests/data/tokexport/ggml-vocab-gpt-2.gguf", "gpt-2", 0);
    test_hf_from_folder("llama-bpe (Llama 3)", TOKDATA "llama3", "llama-bpe", 0);
    test_hf_from_folder("qwen2", TOKDATA "qwen2", "qwen2", 0);
    test_hf_from_folder("qwen2 (Qwen3 json)", TOKDATA "qwen3/tokenizer.json", "qwen2", 0);
    test_hf_from_folder("falcon", TOKDATA "falcon", "falcon", 0);
    test_hf_from_folder("llama-spm (Phi-3 json)", TOKDATA "phi-3", "phi-3", 0);
    test_hf_llama_merges();
    test_hf_tokenizer_errors();
    test_hf_odd_tokens();
    test_hf_tokenizer_file_arg();
}

/* ---- the command line ---------------------------------------------------- */

static void test_cli(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) {
        printf("cli: ANYTUNE_BIN not set (run through ctest): skipped\n");
        return;
    }
    char cmd[1024];
    char *out = tmp_path("cli_gguf_adapter");
    snprintf(cmd, sizeof cmd,
             "%s export --model " GOLDEN_DIR "/qwen2_bias_tied --adapters tests/data/export/qwen2_bias_tied_lora "
             "--to gguf --output_dir %s --quiet 2>/dev/null",
             bin, out);
    CHECK(system(cmd) == 0);
    CHECK(system(cmd) != 0); /* exists now: refused */
    char *f = at_path_join(out, "adapter-f32.gguf");
    at_gguf *gg = NULL;
    CHECK_OK(at_gguf_open(f, &gg));
    if (gg) {
        const char *s = NULL;
        double alpha = 0;
        CHECK_OK(at_gguf_get_string(gg, "general.type", &s, NULL));
        CHECK(s && !strcmp(s, "adapter"));
        CHECK_OK(at_gguf_get_string(gg, "adapter.type", &s, NULL));
        CHECK(s && !strcmp(s, "lora"));
        CHECK_OK(at_gguf_get_float(gg, "adapter.lora.alpha", &alpha));
        CHECK(alpha == 4.0);
        const at_gguf_tensor_info *a = at_gguf_find_tensor(gg, "blk.1.ffn_down.weight.lora_a");
        const at_gguf_tensor_info *b = at_gguf_find_tensor(gg, "blk.1.ffn_down.weight.lora_b");
        /* llama.cpp's check: a.ne[0] = in (72), b.ne[1] = out (40), a.ne[1] = b.ne[0] = r */
        CHECK(a && b && a->ne[0] == 72 && b->ne[1] == 40 && a->ne[1] == 2 && b->ne[0] == 2);
        CHECK(at_gguf_tensor_count(gg) == 2 * 2 * 3);
        at_gguf_close(gg);
    }
    snprintf(cmd, sizeof cmd, "%s export --model " GOLDEN_DIR "/llama_gqa --to hf --quant q9 --output_dir %s/x 2>/dev/null",
             bin, tmp_root);
    CHECK(WEXITSTATUS(system(cmd)) == 2);
    /* A GGUF model to a Hugging Face folder: the tokenizer comes along. */
    char *hf = tmp_path("cli_hf_from_gguf");
    snprintf(cmd, sizeof cmd, "%s export --model tests/data/models/stories260K.gguf --to hf --output_dir %s --quiet 2>/dev/null",
             bin, hf);
    CHECK(system(cmd) == 0);
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(hf, NULL, &t));
    if (t) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(at_tokenizer_encode(t, "Once upon a time", 16, AT_TOK_ADD_SPECIAL, &ids, &n));
        CHECK(n > 1 && ids[0] == 1 && at_tokenizer_vocab_size(t) == 512);
        free(ids);
    }
    at_tokenizer_free(t);
    free(hf);
    free(f);
    free(out);
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/at_export_XXXXXX");
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "cannot create a temporary folder\n");
        return 1;
    }
    test_merge_hf("llama_gqa", 1e-5);
    test_merge_hf("qwen2_bias_tied", 1e-5);
    test_merge_hf("qwen3_qknorm", 1e-5);
    test_merge_hf("llama_bf16", 2e-2);
    test_shards_and_safety();
    test_peft();
    test_gguf_roundtrip("llama_gqa", AT_F32, 0);
    test_gguf_roundtrip("qwen2_bias_tied", AT_F32, 0);
    test_gguf_roundtrip("qwen3_qknorm", AT_F32, 0);
    test_gguf_roundtrip("llama_bf16", AT_BF16, 0);
    test_gguf_roundtrip("llama_gqa", AT_F16, 2e-3);
    test_gguf_merged("llama_gqa", 1e-5);
    test_gguf_merged("qwen3_qknorm", 1e-5);
    test_rope_freqs();
    test_stories();
    test_quantized(AT_Q8_0, 2e-2);
    test_quantized(AT_Q4_0, 2e-1);
    test_llama2c_tokenizer();
    test_gguf_tokenizer("gpt-2 (vocab.json+merges.txt)", TOKDATA "gpt2", "gpt-2", 0, "gpt2", "gpt-2");
    test_gguf_tokenizer("qwen2 (vocab.json+merges.txt)", TOKDATA "qwen2", "qwen2", 0, "gpt2", "qwen2");
    test_gguf_tokenizer("qwen2 (Qwen3 tokenizer.json)", TOKDATA "qwen3/tokenizer.json", "qwen2", 0, "gpt2", "qwen2");
    test_gguf_tokenizer("llama-bpe (Llama 3 tokenizer.json)", TOKDATA "llama3", "llama-bpe", 0, "gpt2", "llama-bpe");
    test_gguf_tokenizer("falcon (tokenizer.json)", TOKDATA "falcon", "falcon", 0, "gpt2", "falcon");
    test_gguf_tokenizer("llama-spm (Phi-3 tokenizer.json)", TOKDATA "phi-3", "llama-spm", 0, "llama", NULL);
    test_gguf_tokenizer("tinyllama (+parse_special)", TOKDATA "tinyllama", "tinyllama", AT_TOK_PARSE_SPECIAL, "llama",
                        NULL);
    test_hf_tokenizers();
    test_cli();
    CHECK(no_staging_left());
    at_remove_tree(tmp_root);
    return at_test_result("test_export");
}
