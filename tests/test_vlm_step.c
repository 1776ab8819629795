/* A vision-language training step (train/vlm_step.h) on the golden Qwen2-VL
 * and Qwen3-VL language models of tools/make_vlm_goldens.py with a random
 * tower (at_vision_random) and random pixels:
 *  - M-RoPE positions of a batch, one sample per row and the two samples
 *    packed in one row, equal get_rope_index's (the golden position_ids);
 *  - the packed row's loss, LoRA gradients and tower gradients equal the
 *    unpacked batch's (segments keep the samples apart, positions restart);
 *  - the tower's gradients (merger and patch embedding, reached through
 *    d_features; Qwen3-VL: a deepstack merger's, reached only through the
 *    deepstack features' gradient) against central finite differences of
 *    the loss;
 *  - frozen tower (freeze_vit and freeze_aligner): no tower gradient, same loss;
 *  - errors: more images in the ids than grids. */
#include "base/json.h"
#include "base/rng.h"
#include "train/vlm_step.h"
#include "train_goldens.h"

static const char *NAME = "qwen2_vl_lm";
#define IMAGE_PAD 152

typedef struct {
    train_case c;
    at_vision *v;
    int32_t (*grid)[3];
    int n_images;
    int32_t *gpos, *len;
    float *pixels;
    int64_t n_patches, patch_dim;
} step_case;

static void sc_free(step_case *s)
{
    tc_free(&s->c);
    at_vision_free(s->v);
    free(s->grid);
    free(s->gpos);
    free(s->len);
    free(s->pixels);
    memset(s, 0, sizeof *s);
}

static at_status sc_open(step_case *s)
{
    at_status st = AT_OK;
    cJSON *root = NULL;
    memset(s, 0, sizeof *s);
    AT_CHECK(tc_open(&s->c, NAME, at_cpu_backend(), AT_F32, 1));
    at_vision_config vc;
    char path[256];
    snprintf(path, sizeof path, "%s/%s/config.json", GOLDEN_DIR, NAME);
    AT_CHECK(at_json_parse_file(path, &root));
    AT_CHECK(at_vision_config_from_json(root, NAME, &vc));
    AT_CHECK(at_vision_random(&vc, at_cpu_backend(), 7, &s->v));
    int64_t shape[4] = {0};
    int nd = 0;
    AT_CHECK(golden_array(s->c.gf, "grid_thw", AT_I32, (void **)&s->grid, shape, &nd));
    s->n_images = (int)shape[0];
    AT_CHECK(golden_array(s->c.gf, "position_ids", AT_I32, (void **)&s->gpos, NULL, NULL));
    AT_CHECK(golden_array(s->c.gf, "lengths", AT_I32, (void **)&s->len, NULL, NULL));
    for (int i = 0; i < s->n_images; i++) s->n_patches += (int64_t)s->grid[i][0] * s->grid[i][1] * s->grid[i][2];
    s->patch_dim = (int64_t)vc.in_chans * vc.temporal_patch_size * vc.patch_size * vc.patch_size;
    s->pixels = malloc((size_t)(s->n_patches * s->patch_dim) * sizeof *s->pixels);
    if (!s->pixels) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* normalized pixel values are O(1) */
    for (int64_t i = 0; i < s->n_patches * s->patch_dim; i++)
        s->pixels[i] = 2.0f * (float)at_rng_hash_uniform(99, (uint64_t)i) - 1.0f;
done:
    cJSON_Delete(root);
    if (st != AT_OK) sc_free(s);
    return st;
}

static const at_mrope_tokens TK = {IMAGE_PAD, 153, 150, 2};

/* The golden's two rows packed into one: ids, labels, segments, lengths. */
typedef struct {
    int B, T;
    int32_t *ids, *labels, *segments, *lengths, *pos;
} layout;

static void layout_free(layout *l)
{
    free(l->ids);
    free(l->labels);
    free(l->segments);
    free(l->lengths);
    free(l->pos);
}

static int make_layout(const step_case *s, int packed, layout *l)
{
    const train_case *c = &s->c;
    l->B = packed ? 1 : c->B;
    l->T = packed ? s->len[0] + s->len[1] : c->T;
    size_t n = (size_t)l->B * (size_t)l->T;
    l->ids = calloc(n, sizeof *l->ids);
    l->labels = malloc(n * sizeof *l->labels);
    l->segments = calloc(n, sizeof *l->segments);
    l->lengths = calloc((size_t)l->B, sizeof *l->lengths);
    l->pos = malloc(n * 3 * sizeof *l->pos);
    if (!l->ids || !l->labels || !l->segments || !l->lengths || !l->pos) return 0;
    for (size_t i = 0; i < n; i++) l->labels[i] = -100;
    for (int b = 0, off = 0; b < c->B; b++) {
        int r = packed ? 0 : b, c0 = packed ? off : 0;
        for (int t = 0; t < s->len[b]; t++) {
            l->ids[r * l->T + c0 + t] = c->ids[b * c->T + t];
            l->labels[r * l->T + c0 + t] = c->labels[b * c->T + t];
            l->segments[r * l->T + c0 + t] = b + 1;
        }
        l->lengths[r] += s->len[b];
        off += s->len[b];
    }
    return 1;
}

/* One step on layout l; loss sum into *loss. g may be NULL (loss only).
 * With text_loss, then the same batch as text alone (the call without
 * at_fwd_opts) on the same activations, whose loss must equal a fresh
 * activations' one: the step's features (freed by then) are not reused. */
static at_status run_ex(step_case *s, const layout *l, at_decoder_grads *g, double *loss, double *text_loss)
{
    at_status st = AT_OK;
    at_decoder_acts *a = NULL;
    at_tensor *ids = NULL, *lab = NULL, *seg = NULL, *pos = NULL;
    int64_t sh[2] = {l->B, l->T}, sp[3] = {l->B, l->T, 3};
    at_backend *be = s->c.d->be;
    size_t n = (size_t)l->B * (size_t)l->T;
    AT_CHECK(at_vlm_batch_positions(&TK, l->ids, l->segments, l->lengths, (size_t)l->B, (size_t)l->T,
                                    (const int32_t(*)[3])s->grid, (size_t)s->n_images, l->pos));
    AT_CHECK(at_tensor_new(be, AT_I32, 2, sh, "ids", &ids));
    AT_CHECK(at_tensor_new(be, AT_I32, 2, sh, "labels", &lab));
    AT_CHECK(at_tensor_new(be, AT_I32, 2, sh, "segments", &seg));
    AT_CHECK(at_tensor_new(be, AT_I32, 3, sp, "pos", &pos));
    AT_CHECK(at_tensor_upload(ids, l->ids, n * sizeof(int32_t)));
    AT_CHECK(at_tensor_upload(lab, l->labels, n * sizeof(int32_t)));
    AT_CHECK(at_tensor_upload(seg, l->segments, n * sizeof(int32_t)));
    AT_CHECK(at_tensor_upload(pos, l->pos, 3 * n * sizeof(int32_t)));
    AT_CHECK(at_decoder_acts_new_ex(s->c.d, l->B, l->T, AT_ACTS_TRAIN, &a));
    at_vlm_images im = {s->pixels, s->n_patches, (const int32_t(*)[3])s->grid, s->n_images, IMAGE_PAD};
    at_fwd_opts o = {0};
    at_loss_stats stats = {0};
    AT_CHECK(at_vlm_forward_backward(s->c.d, s->v, a, l->ids, ids, pos, seg, lab, &im, &o, 1.0f, g, &stats));
    *loss = stats.loss_sum;
    if (text_loss) {
        at_loss_stats again = {0}, fresh = {0};
        AT_CHECK(at_decoder_forward_backward(s->c.d, a, ids, pos, seg, lab, 0.0f, 0, 1.0f, NULL, &again));
        at_decoder_acts_free(a);
        a = NULL;
        AT_CHECK(at_decoder_acts_new_ex(s->c.d, l->B, l->T, AT_ACTS_TRAIN, &a));
        AT_CHECK(at_decoder_forward_backward(s->c.d, a, ids, pos, seg, lab, 0.0f, 0, 1.0f, NULL, &fresh));
        CHECK_MSG(again.loss_sum == fresh.loss_sum, "text after an image step: loss %.7f, on fresh activations %.7f",
                  again.loss_sum, fresh.loss_sum);
        *text_loss = fresh.loss_sum;
    }
done:
    at_decoder_acts_free(a);
    at_tensor_free(ids);
    at_tensor_free(lab);
    at_tensor_free(seg);
    at_tensor_free(pos);
    return st;
}

static at_status run(step_case *s, const layout *l, at_decoder_grads *g, double *loss)
{
    return run_ex(s, l, g, loss, NULL);
}

/* The image step's features reach no later call: the text-only loss after it
 * equals a fresh one (run_ex) and differs from the step's (the pads' own
 * embeddings instead of the features). */
static void test_no_stale_features(step_case *s)
{
    layout l = {0};
    double vl = 0, tl = 0;
    CHECK(make_layout(s, 0, &l));
    CHECK_OK(run_ex(s, &l, NULL, &vl, &tl));
    CHECK_MSG(fabs(vl - tl) > 1e-3 * fabs(vl), "the image step's loss %.7f equals the text-only one %.7f", vl, tl);
    layout_free(&l);
}

static void test_positions(step_case *s)
{
    for (int packed = 0; packed < 2; packed++) {
        layout l = {0};
        CHECK(make_layout(s, packed, &l));
        CHECK_OK(at_vlm_batch_positions(&TK, l.ids, l.segments, l.lengths, (size_t)l.B, (size_t)l.T,
                                        (const int32_t(*)[3])s->grid, (size_t)s->n_images, l.pos));
        size_t bad = 0;
        for (int b = 0, off = 0; b < s->c.B; b++) {
            for (int t = 0; t < s->len[b]; t++)
                for (int k = 0; k < 3; k++) {
                    size_t got = packed ? ((size_t)off + (size_t)t) * 3 : ((size_t)b * (size_t)l.T + (size_t)t) * 3;
                    bad += l.pos[got + (size_t)k] != s->gpos[((size_t)b * (size_t)s->c.T + (size_t)t) * 3 + (size_t)k];
                }
            off += s->len[b];
        }
        CHECK_MSG(bad == 0, "%s: %zu positions differ from get_rope_index's", packed ? "packed" : "unpacked", bad);
        /* one grid short: the error names the row */
        CHECK_FAILS(at_vlm_batch_positions(&TK, l.ids, l.segments, l.lengths, (size_t)l.B, (size_t)l.T,
                                           (const int32_t(*)[3])s->grid, (size_t)s->n_images - 1, l.pos),
                    AT_ERR_INVALID);
        CHECK(strstr(at_last_error(), "row") != NULL);
        layout_free(&l);
    }
}

/* Host copy of every tower gradient, concatenated (caller frees). */
static float *tower_grads(const at_vision *v, size_t *n)
{
    *n = 0;
    for (size_t i = 0; i < at_vision_param_count(v); i++)
        if (at_vision_grad(v, i)) *n += (size_t)at_tensor_numel(at_vision_grad(v, i));
    float *h = malloc((*n ? *n : 1) * sizeof *h), *p = h;
    for (size_t i = 0; h && i < at_vision_param_count(v); i++) {
        at_tensor *gt = at_vision_grad(v, i);
        if (!gt) continue;
        if (at_tensor_download(gt, p, at_tensor_nbytes(gt)) != AT_OK) return h;
        p += at_tensor_numel(gt);
    }
    return h;
}

static void test_step(step_case *s)
{
    at_decoder_grads *g1 = NULL, *g2 = NULL;
    layout lu = {0}, lp = {0};
    CHECK(make_layout(s, 0, &lu) && make_layout(s, 1, &lp));
    CHECK_OK(at_decoder_grads_new(s->c.d, 0, &g1));
    CHECK_OK(at_decoder_grads_new(s->c.d, 0, &g2));
    CHECK_OK(at_vision_set_trainable(s->v, 1, 1));
    if (!g1 || !g2) goto done;
    double lu_loss = 0, lp_loss = 0;
    size_t n1 = 0, n2 = 0;
    CHECK_OK(at_vision_zero_grads(s->v));
    CHECK_OK(at_decoder_grads_zero(g1));
    CHECK_OK(run(s, &lu, g1, &lu_loss));
    float *t1 = tower_grads(s->v, &n1);
    CHECK_OK(at_vision_zero_grads(s->v));
    CHECK_OK(at_decoder_grads_zero(g2));
    CHECK_OK(run(s, &lp, g2, &lp_loss));
    float *t2 = tower_grads(s->v, &n2);
    printf("loss sum: unpacked %.7f, packed %.7f\n", lu_loss, lp_loss);
    /* the same f32 arithmetic on the same tokens, laid out differently: only
     * summation order differs (1e-4 relative, as the goldens' analysis) */
    CHECK_NEAR(lu_loss, lp_loss, 1e-4 * fabs(lu_loss));
    double worst = 0;
    for (int l = 0; l < g1->lora->n_layers * AT_MOD_COUNT; l++)
        for (int w = 0; w < 2; w++) {
            at_tensor *a = w ? g1->lora->mods[l].B : g1->lora->mods[l].A, *b = w ? g2->lora->mods[l].B : g2->lora->mods[l].A;
            if (!a) continue;
            float *ha = tc_host(a), *hb = tc_host(b);
            if (ha && hb) {
                double e = at_test_max_rel_err(hb, ha, (size_t)at_tensor_numel(a), 0);
                if (e > worst) worst = e;
            }
            free(ha);
            free(hb);
        }
    double et = t1 && t2 && n1 == n2 && n1 > 0 ? at_test_max_rel_err(t2, t1, n1, 0) : 1;
    printf("packed vs unpacked: LoRA grads rel err %.2e, tower grads (%zu values) %.2e\n", worst, n1, et);
    CHECK_MSG(worst <= 1e-4 && et <= 1e-4, "packed and unpacked gradients differ: %g, %g", worst, et);

    /* central differences of the loss sum for the largest gradient of the
     * merger's last matrix and of the patch embedding (reached only through
     * d_features). Loss sums are accumulated in double from f32 per-token
     * losses of ~5, so each carries ~20 · 5 · 1e-6 = 1e-4 of rounding; with
     * h = 1e-2 that is 5e-3 on the difference quotient, and the O(h²)
     * truncation of a smooth loss of O(1) curvature is of the same order:
     * |fd - g| <= 0.02 |g| + 0.01 leaves a margin while a missing or
     * misplaced tower gradient is off by O(|g|). */
    const int q3 = at_vision_get_config(s->v)->kind == AT_VISION_QWEN3_VL;
    const char *which[] = {q3 ? "visual.deepstack_merger_list.1.linear_fc2.weight" : "visual.merger.mlp.2.weight",
                           "visual.patch_embed.proj.weight"};
    for (int k = 0; k < 2 && t1; k++) {
        size_t off = 0, idx = 0;
        at_tensor *p = NULL;
        for (size_t i = 0; i < at_vision_param_count(s->v); i++) {
            at_tensor *gt = at_vision_grad(s->v, i);
            if (!strcmp(at_vision_param(s->v, i)->name, which[k])) {
                p = at_vision_param(s->v, i);
                break;
            }
            if (gt) off += (size_t)at_tensor_numel(gt);
        }
        CHECK_MSG(p != NULL, "no parameter %s", which[k]);
        if (!p) continue;
        for (size_t j = 0; j < (size_t)at_tensor_numel(p); j++)
            if (fabsf(t1[off + j]) > fabsf(t1[off + idx])) idx = j;
        float *hp = tc_host(p);
        if (!hp) continue;
        float x0 = hp[idx], h = 1e-2f;
        double lplus = 0, lminus = 0;
        hp[idx] = x0 + h;
        CHECK_OK(at_tensor_upload(p, hp, at_tensor_nbytes(p)));
        CHECK_OK(run(s, &lu, NULL, &lplus));
        hp[idx] = x0 - h;
        CHECK_OK(at_tensor_upload(p, hp, at_tensor_nbytes(p)));
        CHECK_OK(run(s, &lu, NULL, &lminus));
        hp[idx] = x0;
        CHECK_OK(at_tensor_upload(p, hp, at_tensor_nbytes(p)));
        double fd = (lplus - lminus) / (2.0 * h), gv = t1[off + idx];
        printf("%s[%zu]: gradient %.6f, finite difference %.6f\n", which[k], idx, gv, fd);
        CHECK_MSG(fabs(fd - gv) <= 0.02 * fabs(gv) + 0.01, "%s: gradient %g, finite difference %g", which[k], gv, fd);
        CHECK(fabs(gv) > 0.05); /* a gradient worth checking */
        free(hp);
    }

    /* frozen tower: the same loss, no tower gradient at all */
    CHECK_OK(at_vision_set_trainable(s->v, 0, 0));
    double lf = 0;
    CHECK_OK(run(s, &lu, g1, &lf));
    CHECK(lf == lu_loss);
    for (size_t i = 0; i < at_vision_param_count(s->v); i++) CHECK(at_vision_grad(s->v, i) == NULL);
    free(t1);
    free(t2);
done:
    at_decoder_grads_free(g1);
    at_decoder_grads_free(g2);
    layout_free(&lu);
    layout_free(&lp);
}

int main(void)
{
    for (int k = 0; k < 2; k++) {
        step_case s;
        NAME = k ? "qwen3_vl_lm" : "qwen2_vl_lm";
        printf("%s\n", NAME);
        CHECK_OK(sc_open(&s));
        if (!s.v) continue;
        test_positions(&s);
        test_step(&s);
        test_no_stale_features(&s);
        sc_free(&s);
    }
    return at_test_result("test_vlm_step");
}
