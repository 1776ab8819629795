/* A Qwen2-VL and a Qwen3-VL language model against PyTorch
 * (tools/make_vlm_goldens.py: a hand-written Qwen2-VL / Qwen3-VL text decoder
 * with M-RoPE from get_rope_index's ids (Qwen3-VL: interleaved, q/k norms)
 * and random features placed at the <|image_pad|> tokens by masked_scatter,
 * Qwen3-VL's random deepstack features added there after layers 0 and 1 of
 * 3; two rows, three images of odd grids, two in one row):
 *  - the folder loads (config.json model_type qwen2_vl, tensors under
 *    model.language_model.*) as a Qwen2 decoder with M-RoPE sections 2/3/3;
 *  - at_mrope_position_ids gives the golden position ids;
 *  - training with a LoRA adapter: the loss, every LoRA gradient and the
 *    features' gradient (checkpointing on and off), and the deepstack's;
 *  - full fine-tuning: every weight's gradient (the embedding gets none from
 *    the image rows) and the features' gradient;
 *  - inference: one batched prefill with positions and features (logits of
 *    every token), then a decode step per row at cache length + rope delta;
 *  - errors: features of the wrong count, positions of the wrong width.
 * Tolerance 1e-4 relative to the largest golden value of each tensor (TOL
 * below); every ISA level runs it (CMakeLists.txt). */
#include "model/mrope.h"
#include "train_goldens.h"

/* Both sides compute in f32. A dot product of K <= 80 terms (the widest
 * here: intermediate 80) is off by at most K·u|x||y| (u = 6e-8), about 5e-6
 * relative, sqrt(K)·u typically; the softmax, RMSNorm and the two layers
 * chain about ten such steps forward and as many backward, with O(1) gains
 * for these well-scaled weights, so errors stay near 1e-5 of each tensor's
 * largest value. 1e-4 leaves a factor 10 while a wrong rotation, a lost row
 * or an embedding gradient at an image row gives O(1) errors. */
#define TOL 1e-4
static const char *NAME = "qwen2_vl_lm";
static int NDS; /* deepstack layers of the case (Qwen3-VL: 2) */
#define IMAGE_PAD 152
#define VSTART 150

typedef struct {
    train_case c;
    int32_t *pos;         /* host [B, T, 3] as at_mrope_position_ids gives them */
    int32_t *len;         /* host [B] */
    int64_t n_feat;       /* image tokens */
    at_tensor *t_pos, *t_feats, *t_dfeats;
    at_tensor *t_ds, *t_dds; /* Qwen3-VL's deepstack features [NDS · n_feat, hidden] and their gradient */
} vlm_case;

static void vlm_free(vlm_case *v)
{
    tc_free(&v->c);
    free(v->pos);
    free(v->len);
    at_tensor_free(v->t_pos);
    at_tensor_free(v->t_feats);
    at_tensor_free(v->t_dfeats);
    at_tensor_free(v->t_ds);
    at_tensor_free(v->t_dds);
    memset(v, 0, sizeof *v);
}

/* Loads the golden model (with the adapter when lora), its batch, the
 * features, and the M-RoPE ids computed here from ids and grids. */
static at_status vlm_open(vlm_case *v, at_backend *be, int lora)
{
    at_status st = AT_OK;
    int32_t *gpos = NULL, (*grid)[3] = NULL, *cm = NULL;
    float *feats = NULL;
    memset(v, 0, sizeof *v);
    AT_CHECK(tc_open(&v->c, NAME, be, AT_F32, lora));
    train_case *c = &v->c;
    int64_t B = c->B, T = c->T, H = c->d->cfg.hidden_size, shape[4] = {0};
    int nd = 0;
    AT_CHECK(golden_array(c->gf, "position_ids", AT_I32, (void **)&gpos, NULL, NULL));
    AT_CHECK(golden_array(c->gf, "lengths", AT_I32, (void **)&v->len, NULL, NULL));
    AT_CHECK(golden_array(c->gf, "grid_thw", AT_I32, (void **)&grid, shape, &nd));
    int64_t n_grid = shape[0];
    AT_CHECK(golden_array(c->gf, "features", AT_F32, (void **)&feats, shape, &nd));
    v->n_feat = shape[0];
    v->pos = calloc((size_t)(B * T * 3), sizeof *v->pos);
    cm = malloc((size_t)(T * 3) * sizeof *cm);
    if (!v->pos || !cm) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* each row's ids from its images' grids (component-major), laid out
     * token-major [B, T, 3] as the decoder takes them; padding stays 0 */
    at_mrope_tokens tk = {IMAGE_PAD, 153, VSTART, 2};
    int64_t g0 = 0;
    for (int64_t b = 0; b < B; b++) {
        size_t n = (size_t)v->len[b], ni = 0;
        for (size_t t = 0; t < n; t++) ni += c->ids[b * T + (int64_t)t] == VSTART;
        if (g0 + (int64_t)ni > n_grid) {
            st = at_error(AT_ERR_FORMAT, "golden: too few grids");
            goto done;
        }
        AT_CHECK(at_mrope_position_ids(&tk, c->ids + b * T, n, (const int32_t(*)[3])(grid + g0), ni, cm, NULL));
        g0 += (int64_t)ni;
        for (size_t t = 0; t < n; t++)
            for (int k = 0; k < 3; k++) v->pos[(b * T + (int64_t)t) * 3 + k] = cm[(size_t)k * n + t];
    }
    size_t bad = 0;
    for (int64_t i = 0; i < B * T * 3; i++) bad += v->pos[i] != gpos[i];
    CHECK_MSG(bad == 0, "%zu M-RoPE position ids differ from get_rope_index's", bad);
    int64_t sp[3] = {B, T, 3}, sf[2] = {v->n_feat, H};
    AT_CHECK(at_tensor_new(c->d->be, AT_I32, 3, sp, "mrope_pos", &v->t_pos));
    AT_CHECK(at_tensor_upload(v->t_pos, v->pos, (size_t)(B * T * 3) * sizeof *v->pos));
    AT_CHECK(at_tensor_new(c->d->be, AT_F32, 2, sf, "features", &v->t_feats));
    AT_CHECK(at_tensor_upload(v->t_feats, feats, (size_t)(v->n_feat * H) * sizeof *feats));
    AT_CHECK(at_tensor_new(c->d->be, AT_F32, 2, sf, "d_features", &v->t_dfeats));
    if (NDS) {
        float *ds = NULL;
        int64_t sd[2] = {NDS * v->n_feat, H};
        AT_CHECK(golden_array(c->gf, "deepstack", AT_F32, (void **)&ds, shape, &nd));
        if (shape[0] != sd[0]) st = at_error(AT_ERR_FORMAT, "golden: deepstack has %lld rows", (long long)shape[0]);
        if (st == AT_OK) st = at_tensor_new(c->d->be, AT_F32, 2, sd, "deepstack", &v->t_ds);
        if (st == AT_OK) st = at_tensor_upload(v->t_ds, ds, (size_t)(sd[0] * H) * sizeof *ds);
        if (st == AT_OK) st = at_tensor_new(c->d->be, AT_F32, 2, sd, "d_deepstack", &v->t_dds);
        free(ds);
    }
done:
    free(gpos);
    free(grid);
    free(cm);
    free(feats);
    if (st != AT_OK) vlm_free(v);
    return st;
}

/* max rel err of a device tensor against golden `name` */
static double err_vs(const vlm_case *v, const char *name, const at_tensor *t)
{
    at_tensor view = *t;
    at_tensor_set_name(&view, name);
    return tc_rel_err(&v->c, "", &view);
}

/* One forward + loss + backward with the features placed and their gradient asked. */
static at_status vlm_step(vlm_case *v, unsigned flags, at_decoder_grads *g, at_loss_stats *s)
{
    train_case *c = &v->c;
    at_decoder_acts *a = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_decoder_acts_new_ex(c->d, c->B, c->T, flags, &a));
    AT_CHECK(at_decoder_grads_zero(g));
    at_fwd_opts o = {0};
    o.features = v->t_feats;
    o.host_ids = c->ids;
    o.feature_token = IMAGE_PAD;
    o.d_features = v->t_dfeats;
    o.deepstack = v->t_ds;
    o.n_deepstack = NDS;
    o.d_deepstack = v->t_dds;
    AT_CHECK(at_decoder_forward_backward_opts(c->d, a, c->t_ids, v->t_pos, NULL, c->t_labels, &o,
                                              1.0f / (float)c->n_targets, g, s));
done:
    at_decoder_acts_free(a);
    return st;
}

/* Qwen3-VL's folder: a Qwen3 decoder (q/k norms, no biases) from
 * text_config, interleaved M-RoPE 2/3/3 that survives a round trip. */
static void test_config3(void)
{
    at_model_config cfg, back;
    char *json = NULL;
    CHECK_OK(at_model_config_load(GOLDEN_DIR "/qwen3_vl_lm", &cfg));
    CHECK(!strcmp(cfg.model_type, "qwen3") && cfg.qk_norm && !cfg.attn_qkv_bias && cfg.mrope_interleaved);
    CHECK(cfg.mrope_section[0] == 2 && cfg.mrope_section[1] == 3 && cfg.mrope_section[2] == 3);
    CHECK_OK(at_model_config_to_json(&cfg, &json));
    if (json) CHECK_OK(at_model_config_parse(json, strlen(json), "round trip", &back));
    if (json) CHECK(back.mrope_interleaved && !memcmp(back.mrope_section, cfg.mrope_section, sizeof cfg.mrope_section));
    free(json);
}

static void test_config(void)
{
    at_model_config cfg;
    CHECK_OK(at_model_config_load(GOLDEN_DIR "/qwen2_vl_lm", &cfg));
    CHECK(!strcmp(cfg.model_type, "qwen2") && cfg.attn_qkv_bias && !cfg.attn_o_bias);
    CHECK(cfg.mrope_section[0] == 2 && cfg.mrope_section[1] == 3 && cfg.mrope_section[2] == 3);
    /* written back and read again: the sections survive */
    char *json = NULL;
    CHECK_OK(at_model_config_to_json(&cfg, &json));
    at_model_config back;
    if (json) CHECK_OK(at_model_config_parse(json, strlen(json), "round trip", &back));
    if (json) CHECK(!memcmp(back.mrope_section, cfg.mrope_section, sizeof cfg.mrope_section));
    free(json);
    /* sections that do not add up to head_dim / 2 are refused, naming the field */
    const char *bad = "{\"model_type\": \"qwen2_vl\", \"hidden_size\": 32, \"intermediate_size\": 8, "
                      "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"vocab_size\": 9, "
                      "\"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 2, 2]}}";
    CHECK_FAILS(at_model_config_parse(bad, strlen(bad), "config.json", &back), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "mrope_section") != NULL);
    /* the language model nested in text_config (transformers >= 4.52) */
    const char *nested = "{\"model_type\": \"qwen2_vl\", \"eos_token_id\": 7, \"text_config\": {\"model_type\": "
                         "\"qwen2_vl_text\", \"hidden_size\": 32, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                         "\"num_attention_heads\": 2, \"vocab_size\": 9, \"rope_scaling\": {\"rope_type\": "
                         "\"default\", \"mrope_section\": [2, 3, 3]}}}";
    CHECK_OK(at_model_config_parse(nested, strlen(nested), "config.json", &back));
    CHECK(back.hidden_size == 32 && back.mrope_section[1] == 3 && back.n_eos == 1 && back.eos_token_ids[0] == 7);
}

static void test_lora(at_backend *be)
{
    vlm_case v;
    printf("LoRA (%s backend)\n", be->name);
    CHECK_OK(vlm_open(&v, be, 1));
    if (!v.c.d) return;
    CHECK(v.c.d->mrope.n == 3 && v.c.d->mrope.len[0] == 2 && v.c.d->mrope.len[2] == 3);
    CHECK(v.c.d->mrope.interleaved == (NDS > 0));
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(v.c.d, 0, &g));
    unsigned flags[2] = {AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, AT_ACTS_TRAIN};
    for (int k = 0; g && k < 2; k++) {
        at_loss_stats s = {0};
        CHECK_OK(vlm_step(&v, flags[k], g, &s));
        double want = tc_scalar(&v.c, "loss"), loss = s.loss_sum / (double)s.n_targets;
        printf("  %s: loss %.7f, PyTorch %.7f\n", k ? "all activations" : "checkpointing", loss, want);
        CHECK(s.n_targets == (int64_t)tc_scalar(&v.c, "n_targets"));
        CHECK_NEAR(loss, want, TOL * fabs(want));
        double e = tc_grads_err(&v.c, g, "lora.", "LoRA grads");
        CHECK_MSG(e <= TOL, "LoRA gradient rel err %g", e);
        e = err_vs(&v, "d_features", v.t_dfeats);
        printf("  d_features rel err %.2e\n", e);
        CHECK_MSG(e >= 0 && e <= TOL, "d_features rel err %g", e);
        if (!NDS) continue;
        e = err_vs(&v, "d_deepstack", v.t_dds);
        printf("  d_deepstack rel err %.2e\n", e);
        CHECK_MSG(e >= 0 && e <= TOL, "d_deepstack rel err %g", e);
    }
    at_decoder_grads_free(g);
    vlm_free(&v);
}

static void test_full(at_backend *be)
{
    vlm_case v;
    printf("full fine-tuning (%s backend)\n", be->name);
    CHECK_OK(vlm_open(&v, be, 0));
    if (!v.c.d) return;
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(v.c.d, 1, &g));
    at_loss_stats s = {0};
    if (g) CHECK_OK(vlm_step(&v, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g, &s));
    double e = g ? tc_grads_err(&v.c, g, "full.", "full grads") : 1;
    CHECK_MSG(e <= TOL, "full gradient rel err %g", e);
    e = err_vs(&v, "full_d_features", v.t_dfeats);
    printf("  d_features rel err %.2e\n", e);
    CHECK_MSG(e >= 0 && e <= TOL, "full d_features rel err %g", e);
    if (NDS) {
        e = err_vs(&v, "full_d_deepstack", v.t_dds);
        printf("  d_deepstack rel err %.2e\n", e);
        CHECK_MSG(e >= 0 && e <= TOL, "full d_deepstack rel err %g", e);
    }
    at_decoder_grads_free(g);
    vlm_free(&v);
}

/* Batched prefill of each row but its last token (features and positions
 * given), then one decode step per row, whose position is the cache length
 * + the rope delta the prefill left. */
static void test_inference(at_backend *be)
{
    vlm_case v;
    printf("prefill + decode (%s backend)\n", be->name);
    CHECK_OK(vlm_open(&v, be, 1));
    if (!v.c.d) return;
    train_case *c = &v.c;
    int B = c->B, T = c->T, V = c->d->cfg.vocab_size;
    float *want = NULL, *got = malloc((size_t)B * T * V * sizeof *got);
    int n_new[2], active[2] = {1, 1};
    int32_t last[2];
    at_kv_cache *kv = NULL;
    at_tensor *lg = NULL, *lg1 = NULL;
    int64_t sl[3] = {B, T, V}, s1[2] = {B, V};
    CHECK_OK(golden_array(c->gf, "logits", AT_F32, (void **)&want, NULL, NULL));
    CHECK_OK(at_kv_cache_new(&c->d->cfg, c->d->be, AT_F32, B, T, &kv));
    CHECK_OK(at_tensor_new(c->d->be, AT_F32, 3, sl, "logits", &lg));
    CHECK_OK(at_tensor_new(c->d->be, AT_F32, 2, s1, "logits1", &lg1));
    if (B != 2 || !want || !got || !kv || !lg || !lg1) goto done;
    for (int b = 0; b < B; b++) {
        n_new[b] = v.len[b] - 1;
        last[b] = c->ids[b * T + n_new[b]];
        CHECK(last[b] != IMAGE_PAD);
    }
    at_prefill_extra ex = {v.pos, v.t_feats, IMAGE_PAD, v.t_ds, NDS};
    CHECK_OK(at_decoder_prefill_ex(c->d, kv, c->ids, T, n_new, lg, 1, &ex));
    CHECK_OK(at_tensor_download(lg, got, (size_t)B * T * V * sizeof *got));
    double worst = 0;
    for (int b = 0; b < B; b++) {
        double e = at_test_max_rel_err(got + (size_t)b * T * V, want + (size_t)b * T * V, (size_t)n_new[b] * V, 0);
        if (e > worst) worst = e;
        /* the next position is max + 1: what get_rope_index gives the last token */
        int32_t next = kv->len[b] + kv->rope_delta[b];
        CHECK_MSG(next == v.pos[(b * T + n_new[b]) * 3], "row %d: next position %d, want %d", b, next,
                  v.pos[(b * T + n_new[b]) * 3]);
    }
    printf("  prefill logits rel err %.2e\n", worst);
    CHECK_MSG(worst <= TOL, "prefill logits rel err %g", worst);
    CHECK_OK(at_decoder_decode_step(c->d, kv, last, active, lg1));
    CHECK_OK(at_tensor_download(lg1, got, (size_t)B * V * sizeof *got));
    worst = 0;
    for (int b = 0; b < B; b++) {
        double e = at_test_max_rel_err(got + (size_t)b * V, want + ((size_t)b * T + (size_t)n_new[b]) * V,
                                       (size_t)V, 0);
        if (e > worst) worst = e;
    }
    printf("  decode logits rel err %.2e\n", worst);
    CHECK_MSG(worst <= TOL, "decode logits rel err %g", worst);

    /* errors: features of the wrong count; positions of one component */
    at_kv_cache_reset(kv);
    at_tensor few;
    int64_t sf[2] = {v.n_feat - 1, c->d->cfg.hidden_size};
    at_tensor_view_inplace(&few, v.t_feats, 0, 2, sf);
    ex.features = &few;
    CHECK_FAILS(at_decoder_prefill_ex(c->d, kv, c->ids, T, n_new, lg, 1, &ex), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "11 tokens of id 152") != NULL);
    at_decoder_acts *a = NULL;
    CHECK_OK(at_decoder_acts_new(c->d, B, T, &a));
    if (a) CHECK_FAILS(at_decoder_forward(c->d, a, c->t_ids, c->t_ids, NULL), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "M-RoPE positions") != NULL);
    at_decoder_acts_free(a);
done:
    free(want);
    free(got);
    at_kv_cache_free(kv);
    at_tensor_free(lg);
    at_tensor_free(lg1);
    vlm_free(&v);
}

int main(void)
{
    at_backend *cpu = at_cpu_backend();
    test_config();
    test_config3();
    for (int k = 0; k < 2; k++) {
        NAME = k ? "qwen3_vl_lm" : "qwen2_vl_lm";
        NDS = k ? 2 : 0;
        printf("%s\n", NAME);
        test_lora(cpu);
        test_full(cpu);
        test_inference(cpu);
    }
    return at_test_result("test_vlm_decoder");
}
