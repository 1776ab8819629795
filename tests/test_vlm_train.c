/* `anytune sft` on images, end to end (train/trainer.h with a vision-language
 * model), on a tiny random Qwen2-VL folder that tools/make_tiny_vlm.py writes
 * into a temporary folder (f32 weights) and the images of
 * tests/data/datasets/vision:
 *  - the first step's loss equals the library's VLM step (train/vlm_step.h)
 *    on the same sample, built here from the dataset record (the LoRA B
 *    matrices start at zero, so the step-0 model is the base model);
 *  - --freeze_vit (default) with --freeze_aligner false: the checkpoint's
 *    adapter_model.safetensors holds the merger's tensors (beside the
 *    language model's pairs), every one moved from the base model's; the
 *    tower's blocks are nowhere; full fine-tuning with --freeze_vit false
 *    saves the tower's weights in model.safetensors, moved, the patch
 *    embedding as the Conv3d it is in the base, and the folder keeps the
 *    model's config.json (vision_config) and preprocessor_config.json: it
 *    loads as a vision-language model again (train/vision_ckpt.h); an adapter
 *    holding tower tensors is refused by inference (merge it first);
 *  - --freeze_vit false --vit_freeze_steps 2: the tower's LoRA pairs are
 *    their initial values at checkpoints 1 and 2 (A as at 1, B zero), moved
 *    at 3; the language model's adapter moves from step 1;
 *  - a packed run (two samples with images in one row) equals the unpacked
 *    one: first loss and the trained tensors;
 *  - checkpoint + resume: resuming from checkpoint-2 gives checkpoint-4's
 *    tensors bit for bit as the uninterrupted run;
 *  - a record whose image is corrupt or missing: an error naming the
 *    dataset's file:line and the image (strict), skipped with the rest
 *    trained (not strict);
 *  - the vision demo: the bundled model names the colour of at most half
 *    the test pictures before training, of 90% or more after;
 *  - a tiny random Qwen3-VL folder (make_tiny_vlm.py --kind qwen3_vl: learned
 *    positions, deepstack mergers, interleaved M-RoPE): the first loss equals
 *    the library's step, and packed = unpacked with the tower, its aligner
 *    and deepstack mergers trained (their tensors in the adapter). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "data/dataset.h"
#include "data/image_proc.h"
#include "data/media.h"
#include "device/registry.h"
#include "infer/bundle.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model/vision.h"
#include "train/run_files.h"
#include "train/text_pipeline.h"
#include "train/trainer.h"
#include "train/vision_demo.h"
#include "train/vlm_step.h"
#include "testing.h"

static char tmp[256], model[300], imgdir[PATH_MAX];
static int qwen3; /* the Qwen3-VL part of the run */

/* A dataset file in tmp with the given lines; returns its path (static buffer rotation). */
static const char *write_dataset(const char *name, const char *text)
{
    static char paths[8][400];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, 400, "%s/%s", tmp, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

/* One record with image `img` (under tests/data/datasets/vision/images unless absolute) */
static void record(char *buf, size_t cap, const char *img, const char *q, const char *a)
{
    char path[PATH_MAX + 64];
    if (img[0] == '/') snprintf(path, sizeof path, "%s", img);
    else snprintf(path, sizeof path, "%s/%s", imgdir, img);
    snprintf(buf, cap,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>%s\"}, {\"role\": \"assistant\", "
             "\"content\": \"%s\"}], \"images\": [\"%s\"]}\n",
             q, a, path);
}

static void args_for(at_train_args *a, const char *dataset, const char *out)
{
    at_test_train_args(a, model, dataset, out);
    a->lora_dropout = 0; /* the packed and unpacked rows would draw other masks */
    a->max_length = 512;
    a->batch_size = 1;
    a->strict = 1;
}

/* Tensor `name` of the safetensors file at path as f32 (*out malloc'd); 0 when absent. */
static size_t read_tensor(const char *path, const char *name, float **out)
{
    at_st_file *f = NULL;
    *out = NULL;
    if (at_st_open(path, &f) != AT_OK) {
        at_clear_error();
        return 0;
    }
    const at_st_info *in = at_st_find(f, name);
    size_t n = 0;
    if (in) {
        n = in->nbytes / in->elem_size;
        *out = malloc((n ? n : 1) * sizeof **out);
        if (!*out || at_st_read_f32(in, *out, n) != AT_OK) n = 0;
    }
    at_st_close(f);
    return n;
}

/* Names of the tensors of a file, as one "|name|name|" string (caller frees; NULL when unreadable). */
static char *tensor_names(const char *path)
{
    at_st_file *f = NULL;
    if (at_st_open(path, &f) != AT_OK) {
        at_clear_error();
        return NULL;
    }
    size_t cap = 2;
    for (size_t i = 0; i < at_st_count(f); i++) cap += strlen(at_st_info_at(f, i)->name) + 1;
    char *s = calloc(cap, 1);
    if (s) {
        strcpy(s, "|");
        for (size_t i = 0; i < at_st_count(f); i++) {
            strcat(s, at_st_info_at(f, i)->name);
            strcat(s, "|");
        }
    }
    at_st_close(f);
    return s;
}

/* max |a - b| over the tensors two files share by name, and how many they share. */
static double max_diff(const char *pa, const char *pb, int *shared)
{
    at_st_file *f = NULL;
    double worst = 0;
    *shared = 0;
    if (at_st_open(pa, &f) != AT_OK) {
        at_clear_error();
        return INFINITY;
    }
    for (size_t i = 0; i < at_st_count(f); i++) {
        const char *name = at_st_info_at(f, i)->name;
        float *x = NULL, *y = NULL;
        size_t nx = read_tensor(pa, name, &x), ny = read_tensor(pb, name, &y);
        if (nx && nx == ny) {
            (*shared)++;
            for (size_t k = 0; k < nx; k++)
                if (fabs((double)x[k] - y[k]) > worst || isnan(x[k] - y[k])) worst = isnan(x[k] - y[k]) ? INFINITY : fabs((double)x[k] - y[k]);
        } else {
            worst = INFINITY;
        }
        free(x);
        free(y);
    }
    at_st_close(f);
    return worst;
}

/* The loss of `dataset`'s first record under the base model, by the library:
 * the text pipeline, then at_vlm_sample_loss (data/media.h's encoding, the
 * image processor, the M-RoPE positions, at_vlm_forward_backward without
 * gradients): none of the trainer's batching. */
static at_status reference_loss(const char *dataset, double *loss)
{
    at_status st = AT_OK;
    at_decoder *d = NULL;
    at_vision *v = NULL;
    at_tokenizer *tok = NULL;
    at_chat_template *tmpl = NULL;
    at_text_pipeline pipe;
    int pipe_ok = 0;
    at_dataset *ds = NULL;
    at_load_options lo = at_load_options_default();
    AT_CHECK(at_decoder_load(model, &lo, &d));
    AT_CHECK(at_vision_load(model, model, d->be, &v));
    at_bundle_opts bo = {0};
    bo.model = model;
    AT_CHECK(at_bundle_load_text(&bo, &tok, &tmpl));
    AT_CHECK(at_text_pipeline_init(&pipe, tok, tmpl, 0));
    pipe_ok = 1;
    at_encoder enc;
    at_text_pipeline_encoder(&pipe, &enc);
    at_dataset_options dopt = {0};
    dopt.strict = 1;
    AT_CHECK(at_dataset_load(&dataset, 1, &dopt, &ds));
    at_image_processor proc;
    AT_CHECK(at_image_processor_load(model, &proc, NULL));
    double sum = 0;
    int64_t n = 0;
    AT_CHECK(at_vlm_sample_loss(d, v, &enc, &proc, ds->train.items[0], &sum, &n));
    *loss = sum / (double)n;
done:
    at_dataset_free(ds);
    if (pipe_ok) at_text_pipeline_free(&pipe);
    at_chat_template_free(tmpl);
    at_tokenizer_free(tok);
    at_vision_free(v);
    at_decoder_free(d);
    return st;
}

/* Field `key` of the first line of RUN/logging.jsonl (NaN when absent). */
static double logged(const char *run_dir, const char *key)
{
    char p[1400], *text = NULL;
    snprintf(p, sizeof p, "%.1300s/logging.jsonl", run_dir);
    double v = NAN;
    if (at_read_file(p, &text, NULL) != AT_OK) {
        at_clear_error();
        return v;
    }
    cJSON *j = cJSON_ParseWithLength(text, strcspn(text, "\n"));
    const cJSON *x = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    if (cJSON_IsNumber(x)) v = x->valuedouble;
    cJSON_Delete(j);
    free(text);
    return v;
}

static char *ckpt_file(const at_train_result *r, int step, const char *file)
{
    static char p[8][1400];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 1400, "%s/checkpoint-%d/%s", r->run_dir, step, file);
    return s;
}

static void test_first_loss(void)
{
    char rec[PATH_MAX + 400];
    record(rec, sizeof rec, "red.png", "What colour is this?", "Red.");
    const char *ds = write_dataset("one.jsonl", rec);
    at_train_args a;
    at_train_result r;
    char out[400];
    snprintf(out, sizeof out, "%s/first", tmp);
    args_for(&a, ds, out);
    a.max_steps = 1;
    CHECK_OK(at_train_run(&a, NULL, &r));
    double want = NAN;
    CHECK_OK(reference_loss(ds, &want));
    printf("first step loss %.7f, the library's VLM step %.7f\n", r.first_loss, want);
    /* the same f32 operations in the same order (LoRA's B·A term adds exact zeros) */
    CHECK_NEAR(r.first_loss, want, 1e-6 * fabs(want));
}

static void test_freeze(void)
{
    char rec[2][PATH_MAX + 400], text[2 * (PATH_MAX + 400)];
    record(rec[0], sizeof rec[0], "red.png", "What colour is this?", "Red.");
    record(rec[1], sizeof rec[1], "blue.png", "What colour is this?", "Blue.");
    snprintf(text, sizeof text, "%s%s", rec[0], rec[1]);
    const char *ds = write_dataset("two.jsonl", text);
    char out[400];
    at_train_args a;
    at_train_result r;
    /* freeze_vit (default) with the aligner trained */
    snprintf(out, sizeof out, "%s/aligner", tmp);
    args_for(&a, ds, out);
    a.max_steps = 2;
    a.freeze_aligner = 0;
    CHECK_OK(at_train_run(&a, NULL, &r));
    char *names = tensor_names(ckpt_file(&r, 2, "adapter_model.safetensors"));
    CHECK_MSG(names != NULL, "no adapter_model.safetensors in the checkpoint of a run that trains the aligner");
    static const char *merger[] = {"visual.merger.ln_q.weight", "visual.merger.ln_q.bias", "visual.merger.mlp.0.weight",
                                   "visual.merger.mlp.0.bias", "visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias"};
    if (names) {
        CHECK_MSG(strstr(names, "visual.blocks") == NULL && strstr(names, "patch_embed") == NULL,
                  "a frozen vision transformer's tensors in the checkpoint: %s", names);
        char base[400];
        snprintf(base, sizeof base, "%s/model.safetensors", model);
        for (int i = 0; i < 6; i++) {
            char key[96];
            snprintf(key, sizeof key, "|%s|", merger[i]);
            CHECK_MSG(strstr(names, key) != NULL, "%s missing from adapter_model.safetensors", merger[i]);
            float *x = NULL, *y = NULL;
            size_t nx = read_tensor(ckpt_file(&r, 2, "adapter_model.safetensors"), merger[i], &x);
            size_t ny = read_tensor(base, merger[i], &y);
            double moved = 0;
            for (size_t k = 0; nx == ny && k < nx; k++) moved = fmax(moved, fabs((double)x[k] - y[k]));
            CHECK_MSG(nx == ny && nx > 0 && moved > 0, "%s did not train (max change %g)", merger[i], moved);
            free(x);
            free(y);
        }
        free(names);
    }
    {
        /* inference with that adapter would leave its aligner out: refused, naming the way (merge it) */
        char ck[1400];
        snprintf(ck, sizeof ck, "%s/checkpoint-2", r.run_dir);
        const char *ads[1] = {ck};
        at_bundle_opts bo = {0};
        bo.model = model;
        bo.adapters = ads;
        bo.n_adapters = 1;
        at_bundle *b = NULL;
        at_status st = at_bundle_load(&bo, &b);
        CHECK_MSG(st == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "vision-tower") &&
                  strstr(at_last_error(), "--merge_lora"), "an adapter with a trained aligner loaded for inference: %s",
                  st == AT_OK ? "(no error)" : at_last_error());
        at_bundle_free(b);
        at_clear_error();
    }
    /* full fine-tuning with the vision transformer trained: its weights move and are saved beside the
     * language model's, the patch embedding with the base's 5-D shape */
    snprintf(out, sizeof out, "%s/fullvit", tmp);
    args_for(&a, ds, out);
    a.max_steps = 1;
    a.full = 1;
    a.freeze_vit = 0;
    CHECK_OK(at_train_run(&a, NULL, &r));
    static const char *vit[] = {"visual.patch_embed.proj.weight", "visual.blocks.0.attn.qkv.weight",
                                "visual.blocks.1.mlp.fc2.bias"};
    for (int i = 0; i < 3; i++) {
        char base[400];
        snprintf(base, sizeof base, "%s/model.safetensors", model);
        float *x = NULL, *y = NULL;
        size_t nx = read_tensor(ckpt_file(&r, 1, "model.safetensors"), vit[i], &x), ny = read_tensor(base, vit[i], &y);
        double moved = 0;
        for (size_t k = 0; nx == ny && k < nx; k++) moved = fmax(moved, fabs((double)x[k] - y[k]));
        CHECK_MSG(nx == ny && nx > 0 && moved > 0, "full, --freeze_vit false: %s did not train (%zu values)", vit[i], nx);
        free(x);
        free(y);
    }
    {
        at_st_file *f = NULL;
        CHECK_OK(at_st_open(ckpt_file(&r, 1, "model.safetensors"), &f));
        const at_st_info *pe = f ? at_st_find(f, "visual.patch_embed.proj.weight") : NULL;
        CHECK_MSG(pe && pe->ndim == 5, "the full checkpoint's patch embedding is not the base's 5-D Conv3d");
        at_st_close(f);
        char *cfg = NULL;
        size_t len = 0;
        CHECK_OK(at_read_file(ckpt_file(&r, 1, "config.json"), &cfg, &len));
        CHECK_MSG(cfg && strstr(cfg, "\"vision_config\"") && strstr(cfg, "\"qwen2_vl\""),
                  "the full checkpoint's config.json lost the model's vision_config / model_type");
        free(cfg);
        CHECK(at_file_exists(ckpt_file(&r, 1, "preprocessor_config.json")));
        /* the checkpoint loads as a vision-language model: its tower is the trained one */
        char dir[1400];
        snprintf(dir, sizeof dir, "%s/checkpoint-1", r.run_dir);
        at_decoder *d = NULL;
        at_vision *v = NULL;
        at_load_options lo = at_load_options_default();
        CHECK_OK(at_decoder_load(dir, &lo, &d));
        if (d) CHECK_OK(at_vision_load(dir, dir, d->be, &v));
        float *x = NULL;
        size_t nx = read_tensor(ckpt_file(&r, 1, "model.safetensors"), vit[1], &x);
        int seen = 0;
        for (size_t i = 0; v && i < at_vision_param_count(v); i++) {
            const at_tensor *t = at_vision_param(v, i);
            if (strcmp(t->name, vit[1])) continue;
            seen = 1;
            CHECK_MSG(nx == (size_t)at_tensor_numel(t) && !memcmp(at_tensor_data(t), x, nx * sizeof *x),
                      "the checkpoint's tower, loaded, is not the trained one");
        }
        CHECK_MSG(seen, "the checkpoint's tower has no %s", vit[1]);
        free(x);
        at_vision_free(v);
        at_decoder_free(d);
    }
    /* all frozen (the defaults): nothing of the tower in the adapter */
    snprintf(out, sizeof out, "%s/frozen", tmp);
    args_for(&a, ds, out);
    a.max_steps = 1;
    CHECK_OK(at_train_run(&a, NULL, &r));
    names = tensor_names(ckpt_file(&r, 1, "adapter_model.safetensors"));
    CHECK_MSG(names && !strstr(names, "visual."), "a frozen tower's tensors in the adapter: %s", names ? names : "(none)");
    free(names);
}

static void test_vit_freeze_steps(void)
{
    char rec[2][PATH_MAX + 400], text[2 * (PATH_MAX + 400)];
    record(rec[0], sizeof rec[0], "red.png", "What colour is this?", "Red.");
    record(rec[1], sizeof rec[1], "wide.jpg", "Describe it.", "A wide picture.");
    snprintf(text, sizeof text, "%s%s", rec[0], rec[1]);
    const char *ds = write_dataset("vfs.jsonl", text);
    char out[400];
    at_train_args a;
    at_train_result r;
    snprintf(out, sizeof out, "%s/vfs", tmp);
    args_for(&a, ds, out);
    a.max_steps = 3;
    a.save_steps = 1;
    a.freeze_vit = 0;
    a.vit_freeze_steps = 2;
    CHECK_OK(at_train_run(&a, NULL, &r));
    const char *A = "base_model.model.visual.blocks.0.attn.qkv.lora_A.weight";
    const char *B = "base_model.model.visual.blocks.1.mlp.fc2.lora_B.weight";
    float *a1 = NULL, *a2 = NULL, *a3 = NULL, *b2 = NULL, *b3 = NULL;
    size_t na1 = read_tensor(ckpt_file(&r, 1, "adapter_model.safetensors"), A, &a1);
    size_t na2 = read_tensor(ckpt_file(&r, 2, "adapter_model.safetensors"), A, &a2);
    size_t na3 = read_tensor(ckpt_file(&r, 3, "adapter_model.safetensors"), A, &a3);
    size_t nb2 = read_tensor(ckpt_file(&r, 2, "adapter_model.safetensors"), B, &b2);
    size_t nb3 = read_tensor(ckpt_file(&r, 3, "adapter_model.safetensors"), B, &b3);
    CHECK_MSG(na1 && na1 == na2 && na2 == na3 && nb2 && nb2 == nb3, "the tower's LoRA pairs are not in the checkpoints");
    if (na1 && na1 == na2 && na2 == na3 && nb2 && nb2 == nb3) {
        CHECK_MSG(!memcmp(a1, a2, na1 * sizeof *a1), "the tower's LoRA A moved during --vit_freeze_steps");
        double b2max = 0, b3max = 0, a3moved = 0;
        for (size_t k = 0; k < nb2; k++) b2max = fmax(b2max, fabs(b2[k]));
        for (size_t k = 0; k < nb3; k++) b3max = fmax(b3max, fabs(b3[k]));
        for (size_t k = 0; k < na3; k++) a3moved = fmax(a3moved, fabs((double)a3[k] - a2[k]));
        CHECK_MSG(b2max == 0, "the tower's LoRA B is %g after step 2 of --vit_freeze_steps 2 (must be 0)", b2max);
        CHECK_MSG(b3max > 0, "the tower's LoRA B did not train at step 3");
        /* B was zero at step 2, so A's first gradient is zero too: its change is weight decay's alone; none here */
        (void)a3moved;
    }
    free(a1);
    free(a2);
    free(a3);
    free(b2);
    free(b3);
    /* the language model's adapter trains from step 1 */
    float *l1 = NULL;
    size_t nl = read_tensor(ckpt_file(&r, 1, "adapter_model.safetensors"),
                            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", &l1);
    double l1max = 0;
    for (size_t k = 0; k < nl; k++) l1max = fmax(l1max, fabs(l1[k]));
    CHECK_MSG(nl > 0 && l1max > 0, "the language model's LoRA B did not train at step 1");
    free(l1);
}

static void test_packing(void)
{
    char rec[2][PATH_MAX + 400], text[2 * (PATH_MAX + 400)];
    record(rec[0], sizeof rec[0], "red.png", "What colour is this?", "Red.");
    record(rec[1], sizeof rec[1], "wide.jpg", "Describe it.", "A wide picture.");
    snprintf(text, sizeof text, "%s%s", rec[0], rec[1]);
    const char *ds = write_dataset("pack.jsonl", text);
    char out[400];
    at_train_args a;
    at_train_result r[2];
    double norm[2] = {NAN, NAN};
    for (int packed = 0; packed < 2; packed++) {
        snprintf(out, sizeof out, "%s/pack%d", tmp, packed);
        args_for(&a, ds, out);
        a.max_steps = 1;
        a.batch_size = packed ? 1 : 2; /* one step over both samples: one row, or two */
        a.packing = packed;
        a.freeze_aligner = 0;
        a.freeze_vit = 0;
        /* AdamW's first step is lr·g/(|g| + eps): with eps 1 it is Lipschitz in g (constant lr), so the
         * layouts' rounding differences in g (f32 sums in another order: under 1e-5 of the largest
         * gradient, itself under the norm, < 10 here) move a weight by at most lr · 1e-5 · 10 = 1e-7,
         * where a gradient that differs (samples seeing each other, shared positions) moves it by ~lr·|g| */
        a.adam_epsilon = 1;
        CHECK_OK(at_train_run(&a, NULL, &r[packed]));
        norm[packed] = logged(r[packed].run_dir, "grad_norm");
    }
    printf("first loss: unpacked %.7f, packed %.7f; grad norm %.7f, %.7f\n", r[0].first_loss, r[1].first_loss,
           norm[0], norm[1]);
    /* the same tokens and images, laid out in one row or two: f32 sums in another order */
    CHECK_NEAR(r[0].first_loss, r[1].first_loss, 1e-5 * fabs(r[0].first_loss));
    CHECK_MSG(norm[0] > 0 && norm[0] < 10 && fabs(norm[0] - norm[1]) <= 1e-5 * norm[0],
              "gradient norms: unpacked %.7f, packed %.7f", norm[0], norm[1]);
    int shared = 0;
    /* the adapter file holds the language model's pairs and the tower's tensors */
    double da = max_diff(ckpt_file(&r[0], 1, "adapter_model.safetensors"),
                         ckpt_file(&r[1], 1, "adapter_model.safetensors"), &shared);
    char *names = tensor_names(ckpt_file(&r[0], 1, "adapter_model.safetensors"));
    CHECK_MSG(names && strstr(names, "|visual.merger.") && strstr(names, "visual.blocks.") &&
              (!qwen3 || strstr(names, "|visual.deepstack_merger_list.1.linear_fc2.weight|")),
              "the tower's tensors are not in the adapter");
    free(names);
    CHECK_MSG(shared > 6 && da <= 1e-7, "packed vs unpacked differ by %g (%d shared tensors)", da, shared);
    printf("packed vs unpacked after one step: adapter with the tower's tensors %g\n", da);
}

static void test_resume(void)
{
    char rec[3][PATH_MAX + 400], text[3 * (PATH_MAX + 400)];
    record(rec[0], sizeof rec[0], "red.png", "What colour is this?", "Red.");
    record(rec[1], sizeof rec[1], "blue.png", "What colour is this?", "Blue.");
    record(rec[2], sizeof rec[2], "wide.jpg", "Describe it.", "A wide picture.");
    snprintf(text, sizeof text, "%s%s%s", rec[0], rec[1], rec[2]);
    const char *ds = write_dataset("resume.jsonl", text);
    char out[400], keep[1][600];
    at_train_args a;
    at_train_result r, r2;
    snprintf(out, sizeof out, "%s/resume", tmp);
    args_for(&a, ds, out);
    a.max_steps = 4;
    a.save_steps = 2;
    a.freeze_vit = 0;
    a.freeze_aligner = 0;
    a.vit_freeze_steps = 1;
    a.vit_lr = 3e-3;
    CHECK_OK(at_train_run(&a, NULL, &r));
    const char *files[1] = {"adapter_model.safetensors"}; /* with the tower's tensors */
    for (int i = 0; i < 1; i++) {
        snprintf(keep[i], sizeof keep[i], "%s/uninterrupted-%s", tmp, files[i]);
        char *data = NULL;
        size_t n = 0;
        CHECK_OK(at_read_file(ckpt_file(&r, 4, files[i]), &data, &n));
        CHECK_OK(at_write_file_atomic(keep[i], data, n));
        free(data);
    }
    char from[1400];
    snprintf(from, sizeof from, "%s/checkpoint-2", r.run_dir);
    a.resume_from_checkpoint = from;
    CHECK_OK(at_train_run(&a, NULL, &r2));
    CHECK(r2.start_step == 2 && r2.steps_done == 4);
    for (int i = 0; i < 1; i++) {
        int shared = 0;
        double d = max_diff(keep[i], ckpt_file(&r2, 4, files[i]), &shared);
        CHECK_MSG(shared > 0 && d == 0, "%s: resumed from step 2 differs from the uninterrupted run by %g", files[i], d);
    }
}

static void test_bad_images(void)
{
    char bad[400], rec[3][PATH_MAX + 400], text[3 * (PATH_MAX + 400)];
    snprintf(bad, sizeof bad, "%s/corrupt.png", tmp);
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("\x89PNG\r\n\x1a\n this is not a picture", f);
        fclose(f);
    }
    record(rec[0], sizeof rec[0], "red.png", "What colour is this?", "Red.");
    record(rec[1], sizeof rec[1], bad, "What colour is this?", "Red.");
    char missing[400];
    snprintf(missing, sizeof missing, "%s/no-such.png", tmp);
    record(rec[2], sizeof rec[2], missing, "What colour is this?", "Red.");
    const char *cases[2][2] = {{rec[1], "corrupt.png"}, {rec[2], "no-such.png"}};
    for (int c = 0; c < 2; c++) {
        snprintf(text, sizeof text, "%s%s", rec[0], cases[c][0]);
        const char *ds = write_dataset("bad.jsonl", text);
        char out[400], where[500];
        at_train_args a;
        at_train_result r;
        snprintf(out, sizeof out, "%s/bad%d", tmp, c);
        args_for(&a, ds, out);
        a.max_steps = 1;
        CHECK(at_train_run(&a, NULL, &r) != AT_OK);
        snprintf(where, sizeof where, "bad.jsonl:2");
        CHECK_MSG(strstr(at_last_error(), where) && strstr(at_last_error(), cases[c][1]),
                  "the error does not name %s and %s: %s", where, cases[c][1], at_last_error());
        a.strict = 0; /* skipped with a warning; the rest trains */
        CHECK_OK(at_train_run(&a, NULL, &r));
        CHECK(r.steps_trained == 1);
    }
    /* a text model refuses samples with images, naming file:line */
    char rec1[PATH_MAX + 400];
    record(rec1, sizeof rec1, "red.png", "What colour is this?", "Red.");
    const char *ds = write_dataset("text_model.jsonl", rec1);
    at_train_args a;
    at_train_result r;
    char out[400];
    snprintf(out, sizeof out, "%s/textmodel", tmp);
    args_for(&a, ds, out);
    a.model = "tests/data/models/stories260K.bin";
    a.tokenizer = "tests/data/goldens/tok512.bin";
    a.template_name = "chatml";
    a.max_steps = 1;
    CHECK(at_train_run(&a, NULL, &r) != AT_OK);
    CHECK_MSG(strstr(at_last_error(), "text_model.jsonl:1") && strstr(at_last_error(), "vision tower"),
              "%s", at_last_error());
}

/* The vision demo (train/vision_demo.h) as `anytune sft --demo vision` runs it: the bundled random model
 * names a quarter of the pictures right before (one answer for all: chance) and nearly all after. */
static void test_demo(void)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/demo-data", tmp);
    at_vision_demo vd;
    CHECK_OK(at_vision_demo_make(dir, 42, 64, 32, &vd));
    if (!vd.test_colour) return;
    double before = -1, after = -1;
    CHECK_OK(at_vision_demo_accuracy(&vd, "demo/qwen2-vl-tiny", NULL, &before));
    at_train_args a;
    at_train_result r;
    char out[400];
    snprintf(out, sizeof out, "%s/demo", tmp);
    at_test_train_args(&a, "demo/qwen2-vl-tiny", vd.train, out);
    a.full = 1;
    a.freeze_aligner = 0;
    a.learning_rate = 3e-3;
    a.num_train_epochs = 10;
    a.batch_size = 4;
    a.logging_steps = 20;
    CHECK_OK(at_train_run(&a, NULL, &r));
    char ck[1200];
    snprintf(ck, sizeof ck, "%.1100s/checkpoint-%lld", r.run_dir, (long long)r.steps_done);
    CHECK_OK(at_vision_demo_accuracy(&vd, "demo/qwen2-vl-tiny", ck, &after));
    printf("vision demo: %.0f%% of %d pictures named right before training, %.0f%% after\n", 100 * before, vd.n_test,
           100 * after);
    CHECK_MSG(before <= 0.5 && after >= 0.9, "vision demo: %.2f before, %.2f after", before, after);
    at_vision_demo_free(&vd);
}

int main(void)
{
    at_log_set_level(AT_LOG_WARN);
    snprintf(tmp, sizeof tmp, "/tmp/anytune_vlm_train_XXXXXX");
    if (!mkdtemp(tmp) || !realpath("tests/data/datasets/vision/images", imgdir)) {
        CHECK_MSG(0, "cannot make a temporary folder or find the test images");
        return at_test_result("test_vlm_train");
    }
    snprintf(model, sizeof model, "%s/model", tmp);
    char *argv[] = {"/usr/bin/python3", "tools/make_tiny_vlm.py", model, "--dtype", "f32", NULL};
    int ws = at_test_run(argv, NULL);
    CHECK_MSG(ws == 0, "tools/make_tiny_vlm.py failed (status %d): it needs /usr/bin/python3 with numpy", ws);
    if (ws == 0) {
        test_first_loss();
        test_freeze();
        test_vit_freeze_steps();
        test_packing();
        test_resume();
        test_bad_images();
        test_demo();
    }
    /* Qwen3-VL: its own folder and outputs under tmp/q3 */
    char top[sizeof tmp];
    memcpy(top, tmp, sizeof top);
    snprintf(tmp, sizeof tmp, "%.240s/q3", top);
    snprintf(model, sizeof model, "%s/model", tmp);
    char *argv3[] = {"/usr/bin/python3", "tools/make_tiny_vlm.py", model, "--dtype", "f32", "--kind", "qwen3_vl",
                     "--vocab", "bytes", NULL};
    qwen3 = 1;
    ws = ws == 0 && at_mkdirs(tmp) == AT_OK ? at_test_run(argv3, NULL) : -1;
    CHECK_MSG(ws == 0, "tools/make_tiny_vlm.py --kind qwen3_vl failed (status %d)", ws);
    if (ws == 0) {
        printf("Qwen3-VL\n");
        test_first_loss();
        test_packing();
    }
    memcpy(tmp, top, sizeof top);
    at_remove_tree(tmp);
    return at_test_result("test_vlm_train");
}
