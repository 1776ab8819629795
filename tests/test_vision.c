/* The Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers (model/vision.h)
 * against the hand-written float64 PyTorch reference of
 * tools/make_vision_goldens.py (Qwen3-VL: with its interpolated learned
 * positions, and its deepstack features stacked after the merger's):
 *  - the features and the gradient of every weight for a random upstream
 *    gradient (two images a sample, odd grids; a two-frame image for
 *    Qwen2-VL; Qwen2.5-VL's windows cut at the images' edges), loaded from
 *    bf16 (Qwen2-VL) and f32 (Qwen2.5-VL) files;
 *  - the inference forward equal to the training one;
 *  - freeze_vit (only the merger's gradients, the same values) and a frozen
 *    aligner (only the tower's);
 *  - the weights named model.visual.* as newer transformers save them;
 *  - LoRA on the blocks' linears (B non-zero): the features and the
 *    gradients of every A, B and merger weight;
 *  - on the CPU backend, the reference kernels, the CUDA backend under the
 *    emulator and a real GPU when there is one;
 *  - the bundled tiny Qwen2-VL / Qwen2.5-VL folders load and run;
 *  - errors: a missing tensor, a tensor of another shape, bad grids, a
 *    features tensor of the wrong shape, a backward without a forward.
 *
 * Tolerance 1e-4 relative (to the largest magnitude of each tensor). The C
 * side computes in f32; the reference in float64 from the same stored
 * values, so the difference is the f32 rounding of our path. Each dot
 * product of length K (at most 96 here) errs by at most about K·2⁻²⁴·Σ|aᵢbᵢ|
 * (≈ 6e-6 of its terms' magnitude; random summation orders make it ~√K
 * smaller); the softmax, norms and activations add a few ulps each. The
 * deepest path (3 blocks, each a residual add of an attention and an MLP,
 * then the merger, and the same again backwards) chains about 20 such
 * steps whose gains are O(1) (unit-variance weights), giving ≲ 1e-5; 1e-4
 * leaves a factor of 10 for gains above 1 and for gradients that are sums
 * of many products (dW sums N ≤ 96 rows of products). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_goldens.h"
#include "device/cuda_loader.h"
#include "model/vision.h"
#include "ops/ops.h"
#include "testing.h"

#define TOL 1e-4

typedef struct {
    at_st_file *f;
    float *pixels, *features, *dfeat;
    int32_t *grid;
    int n_images;
    int64_t n_patches, n_tok, out;
} vgold;

static void vgold_free(vgold *g) {
    free(g->pixels);
    free(g->features);
    free(g->dfeat);
    free(g->grid);
    at_st_close(g->f);
    memset(g, 0, sizeof *g);
}

static at_status vgold_load(const char *dir, vgold *g) {
    char path[256];
    int64_t shape[4];
    snprintf(path, sizeof path, "tests/data/vision/%s/goldens.safetensors", dir);
    memset(g, 0, sizeof *g);
    AT_TRY(at_st_open(path, &g->f));
    AT_TRY(golden_array(g->f, "pixels", AT_F32, (void **)&g->pixels, shape, NULL));
    g->n_patches = shape[0];
    AT_TRY(golden_array(g->f, "grid_thw", AT_I32, (void **)&g->grid, shape, NULL));
    g->n_images = (int)shape[0];
    AT_TRY(golden_array(g->f, "features", AT_F32, (void **)&g->features, shape, NULL));
    g->n_tok = shape[0];
    g->out = shape[1];
    return golden_array(g->f, "d_features", AT_F32, (void **)&g->dfeat, NULL, NULL);
}

/* Max relative error of a tensor (any backend) against a host array. */
static double rel_err(const at_tensor *t, const float *want) {
    size_t n = (size_t)at_tensor_numel(t);
    float *got = malloc(n * sizeof *got);
    if (!got || at_tensor_download(t, got, n * sizeof *got) != AT_OK) {
        free(got);
        return INFINITY;
    }
    double e = at_test_max_rel_err(got, want, n, 1e-30);
    free(got);
    return e;
}

static double grad_err(const at_st_file *f, const at_tensor *grad, const char *name) {
    char key[160];
    float *want = NULL;
    snprintf(key, sizeof key, "grad.%s", name);
    if (golden_array(f, key, AT_F32, (void **)&want, NULL, NULL) != AT_OK) return INFINITY;
    double e = rel_err(grad, want);
    free(want);
    return e;
}

static at_status features_new(at_backend *be, const vgold *g, at_tensor **out) {
    int64_t s[2] = {g->n_tok, g->out};
    return at_tensor_new(be, AT_F32, 2, s, "features", out);
}

/* One forward + backward with (vit, aligner) trainable; checks the features
 * and every gradient that exists against gf's (the tower's goldens, or the
 * LoRA run's), and that the frozen parts have none (with LoRA: the tower's
 * own weights). */
static void check_run(at_vision *v, const vgold *g, const at_st_file *gf, const float *features, at_tensor *feat,
                      at_tensor *dfeat, int vit, int aligner, const char *what) {
    const int32_t(*grid)[3] = (const int32_t(*)[3])g->grid;
    CHECK_OK(at_vision_set_trainable(v, vit, aligner));
    CHECK_OK(at_vision_zero_grads(v));
    CHECK_OK(at_vision_forward(v, feat, g->pixels, g->n_patches, grid, g->n_images, 1));
    double e = rel_err(feat, features);
    CHECK_MSG(e <= TOL, "%s: features differ by %.3g", what, e);
    CHECK_OK(at_vision_backward(v, dfeat));
    double worst = 0;
    const char *wname = "";
    const int lora = at_vision_param_is_lora(v, at_vision_param_count(v) - 1); /* the pairs come last */
    for (size_t i = 0; i < at_vision_param_count(v); i++) {
        const at_tensor *p = at_vision_param(v, i), *gr = at_vision_grad(v, i);
        int want = at_vision_param_is_aligner(v, i) ? aligner : vit;
        if (lora && !at_vision_param_is_aligner(v, i)) want = vit && at_vision_param_is_lora(v, i);
        CHECK_MSG(want == (gr != NULL), "%s: %s has %s gradient", what, p->name, gr ? "a" : "no");
        if (!gr) continue;
        double ge = grad_err(gf, gr, p->name);
        CHECK_MSG(ge <= TOL, "%s: the gradient of %s differs by %.3g", what, p->name, ge);
        if (ge > worst) worst = ge, wname = p->name;
    }
    printf("  %s: features %.2g, worst gradient %.2g (%s)\n", what, e, worst, wname);
}

/* LoRA on the blocks' linears: fresh pairs (B zero) leave the features as
 * they were; with the reference's A and B (B non-zero) the features and the
 * gradients of every A, B and merger weight match lora.safetensors, and the
 * tower's own weights get none. */
static void test_lora(at_vision *v, const vgold *g, const char *dir, at_tensor *feat, at_tensor *dfeat,
                      at_backend *be) {
    char path[256], what[192];
    at_st_file *lf = NULL;
    float *lfeat = NULL;
    snprintf(path, sizeof path, "tests/data/vision/%s/lora.safetensors", dir);
    CHECK_OK(at_st_open(path, &lf));
    if (!lf) return;
    CHECK_OK(golden_array(lf, "features", AT_F32, (void **)&lfeat, NULL, NULL));
    size_t n0 = at_vision_param_count(v);
    CHECK_OK(at_vision_lora_add(v, 2, 4.0, 0, 7));
    CHECK_FAILS(at_vision_lora_add(v, 2, 4.0, 0, 7), AT_ERR_INVALID);
    const size_t per_block = strstr(dir, "2_5") ? 5 : 4; /* linears a block; an A and a B each */
    CHECK(at_vision_param_count(v) == n0 + 2 * per_block * (size_t)at_vision_get_config(v)->depth);
    CHECK_OK(at_vision_forward(v, feat, g->pixels, g->n_patches, (const int32_t(*)[3])g->grid, g->n_images, 0));
    CHECK_MSG(rel_err(feat, g->features) <= TOL, "%s: fresh LoRA changed the features", dir);
    for (size_t i = n0; i < at_vision_param_count(v); i++) {
        at_tensor *p = at_vision_param(v, i);
        float *val = NULL;
        CHECK(at_vision_param_is_lora(v, i) && !at_vision_param_is_aligner(v, i));
        CHECK_OK(golden_array(lf, p->name, AT_F32, (void **)&val, NULL, NULL));
        if (val) CHECK_OK(at_tensor_upload(p, val, at_tensor_nbytes(p)));
        free(val);
    }
    snprintf(what, sizeof what, "%s on %s, LoRA", dir, be->name);
    if (lfeat) check_run(v, g, lf, lfeat, feat, dfeat, 1, 1, what);
    free(lfeat);
    at_st_close(lf);
}

static void test_case(const char *dir, at_backend *be) {
    vgold g;
    at_vision *v = NULL;
    at_tensor *feat = NULL, *dfeat = NULL;
    char cfgdir[128], what[192];
    snprintf(cfgdir, sizeof cfgdir, "tests/data/vision/%s", dir);
    CHECK_OK(vgold_load(dir, &g));
    CHECK_OK(at_vision_load(cfgdir, cfgdir, be, &v));
    if (!v || !g.features) goto done;
    CHECK_OK(features_new(be, &g, &feat));
    CHECK_OK(features_new(be, &g, &dfeat));
    CHECK_OK(at_tensor_upload(dfeat, g.dfeat, (size_t)(g.n_tok * g.out) * sizeof(float)));
    snprintf(what, sizeof what, "%s on %s", dir, be->name);
    check_run(v, &g, g.f, g.features, feat, dfeat, 1, 1, what);
    /* the inference forward keeps nothing and gives the same features */
    CHECK_OK(at_vision_forward(v, feat, g.pixels, g.n_patches, (const int32_t(*)[3])g.grid, g.n_images, 0));
    CHECK_MSG(rel_err(feat, g.features) <= TOL, "%s: inference features differ", what);
    CHECK_FAILS(at_vision_backward(v, dfeat), AT_ERR_INVALID);
    snprintf(what, sizeof what, "%s on %s, freeze_vit", dir, be->name);
    check_run(v, &g, g.f, g.features, feat, dfeat, 0, 1, what);
    snprintf(what, sizeof what, "%s on %s, frozen aligner", dir, be->name);
    check_run(v, &g, g.f, g.features, feat, dfeat, 1, 0, what);
    test_lora(v, &g, dir, feat, dfeat, be);
    if (!strcmp(dir, "qwen2_vl")) { /* the weights named model.visual.* (transformers 4.52+) */
        at_vision_free(v);
        v = NULL;
        CHECK_OK(at_vision_load(cfgdir, "tests/data/vision/qwen2_vl/prefixed.safetensors", be, &v));
        snprintf(what, sizeof what, "%s on %s, model.visual.* names", dir, be->name);
        if (v) check_run(v, &g, g.f, g.features, feat, dfeat, 1, 1, what);
    }
done:
    at_tensor_free(feat);
    at_tensor_free(dfeat);
    at_vision_free(v);
    vgold_free(&g);
}

/* The bundled tiny model folders (language model and tower in one
 * model.safetensors): the tower loads from the folder and gives finite,
 * non-zero features for an image whose grid is not a multiple of the window. */
static void test_folders(void) {
    static const char *const dirs[] = {"tests/data/models/tiny-qwen2-vl", "tests/data/models/tiny-qwen2_5-vl"};
    for (int d = 0; d < 2; d++) {
        at_vision *v = NULL;
        at_tensor *feat = NULL;
        CHECK_OK(at_vision_load(dirs[d], dirs[d], at_cpu_backend(), &v));
        if (!v) continue;
        const at_vision_config *vc = at_vision_get_config(v);
        const int32_t grid[1][3] = {{1, 10, 6}};
        const int64_t n = 60, k = (int64_t)vc->in_chans * vc->temporal_patch_size * vc->patch_size * vc->patch_size;
        int64_t n_tok = 0, s[2] = {15, vc->out_hidden_size};
        CHECK_OK(at_vision_tokens(vc, grid, 1, n, &n_tok));
        CHECK(n_tok == 15);
        float *pix = malloc((size_t)(n * k) * sizeof *pix), *out = malloc((size_t)(15 * s[1]) * sizeof *out);
        for (int64_t i = 0; pix && i < n * k; i++) pix[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, s, "features", &feat));
        if (pix && out && feat) {
            CHECK_OK(at_vision_forward(v, feat, pix, n, grid, 1, 0));
            CHECK_OK(at_tensor_download(feat, out, (size_t)(15 * s[1]) * sizeof *out));
            double sum = 0;
            int finite = 1;
            for (int64_t i = 0; i < 15 * s[1]; i++) finite &= isfinite(out[i]) != 0, sum += fabs(out[i]);
            CHECK_MSG(finite && sum > 0, "%s: features finite %d, sum of |x| %g", dirs[d], finite, sum);
        }
        free(pix);
        free(out);
        at_tensor_free(feat);
        at_vision_free(v);
    }
}

static int msg_has(const char *s) { return strstr(at_last_error(), s) != NULL; }

static void test_errors(void) {
    const char *dir = "tests/data/vision/qwen2_vl";
    at_vision *v = NULL;
    CHECK_FAILS(at_vision_load(dir, "tests/data/vision/qwen2_vl/bad_missing.safetensors", at_cpu_backend(), &v),
                AT_ERR_NOT_FOUND);
    CHECK_MSG(msg_has("visual.blocks.1.attn.qkv.bias") && msg_has("missing"), "%s", at_last_error());
    CHECK(!v);
    CHECK_FAILS(at_vision_load(dir, "tests/data/vision/qwen2_vl/bad_shape.safetensors", at_cpu_backend(), &v),
                AT_ERR_FORMAT);
    CHECK_MSG(msg_has("visual.blocks.1.mlp.fc2.bias") && msg_has("[2, 8]") && msg_has("[16]"), "%s", at_last_error());
    CHECK_FAILS(at_vision_load("tests/data/vision/none", dir, at_cpu_backend(), &v), AT_ERR_IO);

    vgold g;
    at_tensor *feat = NULL, *bad = NULL;
    CHECK_OK(vgold_load("qwen2_vl", &g));
    CHECK_OK(at_vision_load(dir, dir, at_cpu_backend(), &v));
    if (!v || !g.features) goto done;
    CHECK_OK(features_new(at_cpu_backend(), &g, &feat));
    CHECK_OK(at_vision_set_trainable(v, 1, 1));
    CHECK_FAILS(at_vision_backward(v, feat), AT_ERR_INVALID); /* no forward yet */
    CHECK_FAILS(at_vision_lora_add(v, 0, 16.0, 0, 1), AT_ERR_INVALID);
    CHECK_MSG(msg_has("rank 0"), "%s", at_last_error());
    const int32_t odd[2][3] = {{1, 6, 9}, {2, 4, 2}};         /* 9 is not a multiple of the merge */
    CHECK_FAILS(at_vision_forward(v, feat, g.pixels, g.n_patches, odd, 2, 1), AT_ERR_INVALID);
    CHECK_MSG(msg_has("image 0") && msg_has("w=9"), "%s", at_last_error());
    CHECK_FAILS(at_vision_forward(v, feat, g.pixels, g.n_patches - 4, (const int32_t(*)[3])g.grid, 2, 1),
                AT_ERR_INVALID);
    CHECK_MSG(msg_has("76 patches"), "%s", at_last_error());
    int64_t s[2] = {g.n_tok + 1, g.out};
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, s, "features", &bad));
    CHECK_FAILS(at_vision_forward(v, bad, g.pixels, g.n_patches, (const int32_t(*)[3])g.grid, 2, 1), AT_ERR_INVALID);
    CHECK_MSG(msg_has("features"), "%s", at_last_error());
    CHECK_OK(at_vision_forward(v, feat, g.pixels, g.n_patches, (const int32_t(*)[3])g.grid, 2, 1));
    CHECK_FAILS(at_vision_backward(v, bad), AT_ERR_INVALID); /* d_features of another shape */
    /* a frozen tower's training forward keeps no block's activations: made trainable after it, the
     * backward is refused (not run through activations it does not have) */
    CHECK_OK(at_vision_set_trainable(v, 0, 1));
    CHECK_OK(at_vision_forward(v, feat, g.pixels, g.n_patches, (const int32_t(*)[3])g.grid, 2, 1));
    CHECK_OK(at_vision_set_trainable(v, 1, 1));
    CHECK_FAILS(at_vision_backward(v, feat), AT_ERR_INVALID);
    CHECK_MSG(msg_has("became trainable"), "%s", at_last_error());
done:
    at_tensor_free(feat);
    at_tensor_free(bad);
    at_vision_free(v);
    vgold_free(&g);
}

int main(void) {
    static const char *const cases[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"};
    at_backend *cuda[2] = {NULL, at_test_gpu_backend()};
#ifdef AT_CUDA_EMU_LIBRARY
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &cuda[0]));
#endif
    for (int i = 0; i < 3; i++) {
        test_case(cases[i], at_cpu_backend());
        test_case(cases[i], golden_ref_backend());
        for (int b = 0; b < 2; b++)
            if (cuda[b]) test_case(cases[i], cuda[b]);
    }
    test_folders();
    test_errors();
    return at_test_result("vision");
}
