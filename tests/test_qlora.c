/* QLoRA: LoRA adapters trained in f32 over frozen quantized weights.
 *
 *  - Qwen2.5-0.5B-shaped random model (hidden 896, intermediate 4864, 14/2
 *    heads, vocab 151936, tied, q/k/v bias) with 2 layers instead of 24 (the
 *    test must stay fast on 2 shared cores; bench_train runs the full depth);
 *    under a CPU emulator (testing.h) 1 layer, a vocabulary of 4096 and 16
 *    tokens, the same checks (the quantized matrices keep Qwen's shapes; the
 *    lm head, bf16 and never quantized, was 82% of the work):
 *    one LoRA step on the same batch with the same adapter over bf16 weights,
 *    NF4 weights and q8_0 weights:
 *      * loss of the quantized step within 2% of the bf16 step's;
 *      * NF4 matrices take <= 0.6 bytes per parameter;
 *      * LoRA gradients near the bf16 step's (relative L2 error below 0.4 for
 *        NF4, 0.05 for q8_0; measured 0.28 and 0.013: the weights themselves
 *        differ by NF4's / q8_0's rounding, and this random model's logits
 *        are large (loss ~250), which magnifies any change);
 *      * an independent reference for the quantized matmuls inside the
 *        decoder: the same step on a dense f32 copy of the dequantized
 *        weights (at_dequantize, checked against bitsandbytes / ggml in
 *        test_quant) gives the same loss (1e-4 relative) and gradients (1e-3);
 *      * inference (prefill + one decode step) of the quantized model equals
 *        the dequantized dense model's logits (1e-3) and stays near the bf16
 *        model's (relative L2 below 0.3 for NF4, 0.05 for q8_0; measured 0.20
 *        and 0.009);
 *  - full fine-tuning over quantized weights is refused with a clear message
 *    (loader, gradients, trainer);
 *  - the loader quantizes demo/stories260K, whose down_proj rows (172 values)
 *    are not whole blocks and stay dense;
 *  - the trainer runs QLoRA (quant_bits 4) end to end on the demo (4 steps
 *    of 2 samples instead of 8 of 4 under a CPU emulator). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/quant.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "train/run_files.h"
#include "train/trainer.h"
#include "testing.h"

#define T_MAX 48
#define L_MAX 2
static const int T_TOK = AT_TEST_UNDER_EMULATOR ? 16 : T_MAX;
static const int N_LAYERS = AT_TEST_UNDER_EMULATOR ? 1 : L_MAX;
static const int64_t VOCAB = AT_TEST_UNDER_EMULATOR ? 4096 : 151936;

static void qwen_config(at_model_config *c)
{
    at_model_config_init(c);
    snprintf(c->model_type, sizeof c->model_type, "qwen2");
    c->hidden_size = 896;
    c->intermediate_size = 4864;
    c->num_hidden_layers = N_LAYERS;
    c->num_attention_heads = 14;
    c->num_key_value_heads = 2;
    c->head_dim = 64;
    c->vocab_size = VOCAB;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1000000.0;
    c->tie_word_embeddings = 1;
    c->attn_qkv_bias = 1;
}

/* The random bf16 model (made once: the quantized variants swap its linear
 * matrices in place, see test_qwen_shape). */
static at_status build(at_decoder **out)
{
    *out = NULL;
    at_model_config cfg;
    qwen_config(&cfg);
    at_decoder_weights *w = NULL;
    AT_TRY(at_model_config_validate(&cfg, "qwen-shaped"));
    AT_TRY(at_decoder_weights_random(&cfg, NULL, AT_BF16, 4242, &w));
    at_status st = at_decoder_new(w, out);
    if (st != AT_OK) at_decoder_weights_free(w);
    return st;
}

/* An adapter of rank 8 on every module, B filled with small values so that
 * dA is not zero (PEFT's B = 0 would make it so). Same values every time. */
static at_status make_adapter(at_decoder *d, at_adapter **out)
{
    AT_TRY(at_adapter_new(&d->cfg, d->be, 8, 16.0, 0.0, 0, (1u << AT_MOD_COUNT) - 1, 7, out));
    uint64_t s = 99;
    for (int l = 0; l < d->cfg.num_hidden_layers; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *p = at_adapter_pair(*out, l, (at_module)m);
            float *b = at_tensor_data(p->B);
            for (int64_t i = 0; i < at_tensor_numel(p->B); i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                b[i] = 0.02f * ((float)(s >> 40) / (float)(1ull << 24) - 0.5f);
            }
        }
    return at_decoder_set_adapter(d, *out);
}

typedef struct {
    double loss;
    float *grads; /* every dA, dB in order */
    size_t n_grads;
    float *logits; /* prefill's last-token logits [V], then the decode step's [V] */
} step_result;

static void ids_of(int32_t *ids, int n, int vocab)
{
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

/* One LoRA training step (forward, loss, backward) and inference on d. */
static at_status run_model(at_decoder *d, step_result *r)
{
    memset(r, 0, sizeof *r);
    at_status st = AT_OK;
    at_adapter *ad = NULL;
    at_decoder_acts *acts = NULL;
    at_decoder_grads *g = NULL;
    at_tensor *t_ids = NULL, *t_lab = NULL, *logits = NULL;
    at_kv_cache *cache = NULL;
    int64_t V = d->cfg.vocab_size, sh[2] = {1, T_TOK}, sl[2] = {1, V};
    int32_t ids[T_MAX];
    ids_of(ids, T_TOK, (int)V);
    AT_CHECK(make_adapter(d, &ad));
    AT_CHECK(at_tensor_new(at_cpu_backend(), AT_I32, 2, sh, "ids", &t_ids));
    AT_CHECK(at_tensor_new(at_cpu_backend(), AT_I32, 2, sh, "labels", &t_lab));
    memcpy(at_tensor_data(t_ids), ids, (size_t)T_TOK * sizeof *ids);
    memcpy(at_tensor_data(t_lab), ids, (size_t)T_TOK * sizeof *ids);
    AT_CHECK(at_decoder_acts_new_ex(d, 1, T_TOK, AT_ACTS_TRAIN, &acts));
    AT_CHECK(at_decoder_grads_new(d, 0, &g));
    at_loss_stats ls = {0};
    AT_CHECK(at_decoder_forward_backward(d, acts, t_ids, NULL, NULL, t_lab, 0.0f, 0, 1.0f / (T_TOK - 1), g, &ls));
    r->loss = ls.loss_sum / (double)ls.n_targets;
    int n = at_decoder_trainables(d, g, NULL, 0);
    at_param_grad *pg = calloc((size_t)n, sizeof *pg);
    if (!pg) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    at_decoder_trainables(d, g, pg, n);
    for (int i = 0; i < n; i++) r->n_grads += (size_t)at_tensor_numel(pg[i].grad);
    r->grads = malloc(r->n_grads * sizeof *r->grads);
    size_t k = 0;
    for (int i = 0; r->grads && i < n; i++) {
        memcpy(r->grads + k, at_tensor_data(pg[i].grad), (size_t)at_tensor_numel(pg[i].grad) * sizeof(float));
        k += (size_t)at_tensor_numel(pg[i].grad);
    }
    free(pg);
    /* inference with the same adapter: prefill, then one decode step */
    r->logits = malloc(2 * (size_t)V * sizeof *r->logits);
    if (!r->grads || !r->logits) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_kv_cache_new(&d->cfg, NULL, AT_F32, 1, T_TOK + 1, &cache));
    AT_CHECK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sl, "logits", &logits));
    AT_CHECK(at_decoder_prefill(d, cache, ids, T_TOK - 1, NULL, logits, 0));
    memcpy(r->logits, at_tensor_data(logits), (size_t)V * sizeof(float));
    AT_CHECK(at_decoder_decode_step(d, cache, &ids[T_TOK - 1], NULL, logits));
    memcpy(r->logits + V, at_tensor_data(logits), (size_t)V * sizeof(float));
done:
    at_kv_cache_free(cache);
    at_tensor_free(logits);
    at_tensor_free(t_ids);
    at_tensor_free(t_lab);
    at_decoder_acts_free(acts);
    at_decoder_grads_free(g);
    if (d) at_decoder_set_adapter(d, NULL);
    at_adapter_free(ad);
    return st;
}

static void result_free(step_result *r)
{
    free(r->grads);
    free(r->logits);
}

/* ||a − b|| / ||b|| */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double e = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        e += d * d;
        w += (double)b[i] * b[i];
    }
    return w > 0 ? sqrt(e / w) : sqrt(e);
}

/* The seven linear matrices of layer l. */
static at_tensor **mat_slot(at_decoder *d, int i)
{
    at_layer_weights *L = &d->w->layers[i / 7];
    at_tensor **mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return mats[i % 7];
}

static void test_qwen_shape(void)
{
    at_decoder *d = NULL;
    step_result ref = {0};
    CHECK_OK(build(&d));
    if (!d) return;
    CHECK_OK(run_model(d, &ref));
    size_t V = (size_t)VOCAB;
    const int n_mats = 7 * N_LAYERS;
    at_tensor *orig[7 * L_MAX], *qm[7 * L_MAX], *fm[7 * L_MAX];
    printf("qwen2.5-0.5b shape, %d layers, %d tokens: bf16 LoRA step loss %.6f\n", N_LAYERS, T_TOK, ref.loss);
    const at_quant_kind kinds[2] = {AT_QUANT_NF4, AT_QUANT_Q8_0};
    const double grad_tol[2] = {0.4, 0.05}, logit_tol[2] = {0.3, 0.05};
    for (int k = 0; k < 2 && ref.grads; k++) {
        at_quant_kind q = kinds[k];
        at_dtype qt = at_quant_dtype(q);
        step_result rq = {0}, rd = {0}, rb = {0};
        int64_t params = 0;
        size_t bytes = 0;
        at_status st = AT_OK;
        memset(qm, 0, sizeof qm);
        memset(fm, 0, sizeof fm);
        /* each matrix quantized, and the f32 values that quantization stands for */
        for (int i = 0; i < n_mats && st == AT_OK; i++) {
            const at_tensor *t = orig[i] = *mat_slot(d, i);
            st = at_tensor_new(at_cpu_backend(), qt, 2, t->shape, t->name, &qm[i]);
            if (st == AT_OK) st = at_quantize(qm[i], t);
            if (st == AT_OK) st = at_tensor_new(at_cpu_backend(), AT_F32, 2, t->shape, t->name, &fm[i]);
            if (st == AT_OK) st = at_dequantize(fm[i], qm[i]);
            if (st == AT_OK) params += at_tensor_numel(qm[i]), bytes += at_tensor_nbytes(qm[i]);
        }
        CHECK_OK(st);
        if (st == AT_OK) {
            for (int i = 0; i < n_mats; i++) *mat_slot(d, i) = qm[i];
            CHECK_OK(at_decoder_weights_check(d->w));
            /* f32 activations: exactly the dequantized model's arithmetic */
            d->quant_bf16 = 0;
            CHECK_OK(run_model(d, &rq));
            /* bf16 activations (QLoRA's compute format on fast-bf16 devices) */
            d->quant_bf16 = 1;
            CHECK_OK(run_model(d, &rb));
            d->quant_bf16 = -1;
            for (int i = 0; i < n_mats; i++) *mat_slot(d, i) = fm[i];
            CHECK_OK(run_model(d, &rd));
            for (int i = 0; i < n_mats; i++) *mat_slot(d, i) = orig[i];
        }
        if (rq.grads && rd.grads) {
            double bpp = (double)bytes / (double)params;
            double dl = fabs(rq.loss - ref.loss) / ref.loss;
            double g_ref = rel_l2(rq.grads, ref.grads, ref.n_grads), g_deq = rel_l2(rq.grads, rd.grads, rd.n_grads);
            /* the prefill row (47 tokens) is the dequantized model's arithmetic,
             * except at the AVX2 level, where the prefill's matmuls with Q8_0 /
             * Q4_0 weights run on int8 activations as the decode row's do on AVX2
             * and above (device/cpu/cpu_qmatmul.h): each value rounded to
             * d = max|x| / 127 over its block of 32, an rms error of d/sqrt(12),
             * about 0.0048 sigma for Gaussian values (E max of 32 ~ 2.1 sigma),
             * 4.2x the rms of bf16 rounding (2^-9/sqrt(3) relative) whose logits
             * are held to 2e-2 below: 4.2 x 2e-2 */
            double l_ref = rel_l2(rq.logits, ref.logits, 2 * V), l_deq = rel_l2(rq.logits, rd.logits, V);
            double l_dec = rel_l2(rq.logits + V, rd.logits + V, V);
            int i8 = q == AT_QUANT_Q8_0 && at_cpu_qmatmul_int8_decode();
            int i8p = q == AT_QUANT_Q8_0 && at_cpu_qmatmul_int8_prefill(AT_F32);
            printf("  %-5s: %lld params, %.4f bytes/param; loss %.6f (%.3f%% from bf16; dequantized f32 %.6f); "
                   "LoRA grads rel L2 vs bf16 %.4f, vs dequantized %.2e; logits rel L2 vs bf16 %.4f, vs "
                   "dequantized %.2e (prefill%s) %.2e (decode%s)\n",
                   at_quant_name(q), (long long)params, bpp, rq.loss, 100 * dl, rd.loss, g_ref, g_deq, l_ref, l_deq,
                   i8p ? ", int8 activations" : "", l_dec, i8 ? ", int8 activations" : "");
            if (q == AT_QUANT_NF4) CHECK_MSG(bpp <= 0.6, "NF4 %.4f bytes per parameter", bpp);
            else CHECK_NEAR(bpp, 34.0 / 32.0, 1e-6);
            CHECK_MSG(dl <= 0.02, "%s loss %.6f vs bf16 %.6f", at_quant_name(q), rq.loss, ref.loss);
            CHECK_NEAR(rq.loss, rd.loss, 1e-4 * rd.loss);
            CHECK(rq.n_grads == ref.n_grads && rq.n_grads == rd.n_grads);
            CHECK_MSG(g_deq <= 1e-3, "%s grads vs dequantized f32 model: %g", at_quant_name(q), g_deq);
            CHECK_MSG(g_ref <= grad_tol[k], "%s grads vs bf16: %g", at_quant_name(q), g_ref);
            CHECK_MSG(l_deq <= (i8p ? 8.4e-2 : 1e-3), "%s prefill logits vs dequantized f32 model: %g",
                      at_quant_name(q), l_deq);
            CHECK_MSG(l_dec <= (i8 ? 8.4e-2 : 1e-3), "%s decode logits vs dequantized f32 model: %g",
                      at_quant_name(q), l_dec);
            CHECK_MSG(l_ref <= logit_tol[k], "%s logits vs bf16: %g", at_quant_name(q), l_ref);
        }
        if (rb.grads && rd.grads) {
            /* bf16 rounding of the activations only: bf16-sized differences */
            double dl = fabs(rb.loss - ref.loss) / ref.loss;
            double g_deq = rel_l2(rb.grads, rd.grads, rd.n_grads), l_deq = rel_l2(rb.logits, rd.logits, 2 * V);
            printf("  %-5s with bf16 activations: loss %.6f (%.3f%% from bf16 LoRA); grads vs dequantized %.2e, "
                   "logits %.2e\n", at_quant_name(q), rb.loss, 100 * dl, g_deq, l_deq);
            CHECK_MSG(dl <= 0.02, "%s (bf16 activations) loss %.6f vs bf16 %.6f", at_quant_name(q), rb.loss, ref.loss);
            CHECK_NEAR(rb.loss, rd.loss, 1e-3 * rd.loss);
            CHECK_MSG(g_deq <= 3e-2, "%s (bf16 activations) grads vs dequantized: %g", at_quant_name(q), g_deq);
            CHECK_MSG(l_deq <= 2e-2, "%s (bf16 activations) logits vs dequantized: %g", at_quant_name(q), l_deq);
        }
        result_free(&rb);
        result_free(&rq);
        result_free(&rd);
        for (int i = 0; i < n_mats; i++) at_tensor_free(fm[i]);
        /* the public entry: quantizes in place to exactly these bytes (q8_0 last, kept) */
        if (k == 1 && st == AT_OK) {
            at_quant_stats qs;
            CHECK_OK(at_decoder_weights_quantize(d->w, q, &qs));
            CHECK(qs.n_quantized == n_mats && qs.n_dense == 0 && qs.params == params && qs.bytes == bytes);
            for (int i = 0; i < n_mats; i++) {
                const at_tensor *t = *mat_slot(d, i);
                CHECK(t->dtype == qt && at_tensor_nbytes(t) == at_tensor_nbytes(qm[i]) &&
                      memcmp(at_tensor_data(t), at_tensor_data(qm[i]), at_tensor_nbytes(t)) == 0);
            }
            CHECK(d->w->embed->dtype == AT_BF16 && d->w->layers[0].bq->dtype == AT_F32);
        }
        for (int i = 0; i < n_mats; i++) at_tensor_free(qm[i]);
    }
    result_free(&ref);
    at_decoder_free(d);
}

/* Quantized weights are frozen: full fine-tuning is refused everywhere. */
static void test_full_refused(void)
{
    at_decoder *d = NULL;
    at_load_options lo = at_load_options_default();
    lo.quant = AT_QUANT_NF4;
    lo.writable = 1;
    CHECK_FAILS(at_decoder_load("demo/stories260K", &lo, &d), AT_ERR_UNSUPPORTED);
    CHECK(strstr(at_last_error(), "full fine-tuning") != NULL && strstr(at_last_error(), "nf4") != NULL);
    lo.writable = 0;
    lo.dtype = AT_F32;
    CHECK_OK(at_decoder_load("demo/stories260K", &lo, &d));
    if (d) {
        at_decoder_grads *g = NULL;
        CHECK_FAILS(at_decoder_grads_new(d, 1, &g), AT_ERR_UNSUPPORTED);
        CHECK(strstr(at_last_error(), "nf4") != NULL);
        at_decoder_grads_free(g);
    }
    at_decoder_free(d);

    at_train_args a;
    at_train_result r;
    at_train_args_defaults(&a);
    static const char *ds[1] = {"demo/identity.json#4"};
    a.model = "demo/stories260K";
    a.datasets = ds;
    a.n_datasets = 1;
    a.output_dir = "/tmp/anytune-qlora-refused";
    a.full = 1;
    a.quant_bits = 4;
    CHECK(at_train_run(&a, stdout, &r) != AT_OK);
    CHECK_MSG(strstr(at_last_error(), "quant_bits") != NULL, "%s", at_last_error());
    a.full = 0;
    a.quant_bits = 3;
    CHECK(at_train_run(&a, stdout, &r) != AT_OK);
    CHECK_MSG(strstr(at_last_error(), "quant_bits 3") != NULL, "%s", at_last_error());
    at_quant_kind q;
    CHECK_FAILS(at_quant_from_bits(2, &q), AT_ERR_INVALID);
    CHECK_FAILS(at_quant_parse("int4", &q), AT_ERR_INVALID);
    CHECK_OK(at_quant_parse("q4_0", &q));
    CHECK(q == AT_QUANT_Q4_0);
}

/* The loader on stories260K (hidden 64, intermediate 172): every matrix
 * whose rows are whole blocks quantized, down_proj (rows of 172) dense;
 * logits of the quantized model near the dense one's. */
static void test_loader_stories(void)
{
    const at_quant_kind kinds[3] = {AT_QUANT_NF4, AT_QUANT_Q8_0, AT_QUANT_Q4_0};
    at_decoder *dense = NULL;
    at_load_options lo = at_load_options_default();
    CHECK_OK(at_decoder_load("demo/stories260K", &lo, &dense));
    if (!dense) return;
    int32_t ids[12] = {1, 403, 407, 261, 378, 430, 267, 297, 365, 265, 429, 260};
    int64_t V = dense->cfg.vocab_size, sl[2] = {1, V};
    at_tensor *lg = NULL, *lq = NULL;
    at_kv_cache *c = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sl, "logits", &lg));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sl, "logits_q", &lq));
    CHECK_OK(at_kv_cache_new(&dense->cfg, NULL, AT_F32, 1, 16, &c));
    if (lg && lq && c) CHECK_OK(at_decoder_prefill(dense, c, ids, 12, NULL, lg, 0));
    for (int k = 0; k < 3 && lg && lq && c; k++) {
        at_decoder *d = NULL;
        lo.quant = kinds[k];
        CHECK_OK(at_decoder_load("demo/stories260K", &lo, &d));
        if (!d) continue;
        at_dtype qt = at_quant_dtype(kinds[k]);
        for (int l = 0; l < d->cfg.num_hidden_layers; l++) {
            const at_layer_weights *L = &d->w->layers[l];
            CHECK(L->wq->dtype == qt && L->wk->dtype == qt && L->wv->dtype == qt && L->wo->dtype == qt);
            CHECK(L->w_gate->dtype == qt && L->w_up->dtype == qt);
            CHECK(L->w_down->dtype == AT_F32); /* rows of 172: not whole blocks */
            CHECK(L->attn_norm->dtype == AT_F32 && L->ffn_norm->dtype == AT_F32);
        }
        CHECK(d->w->embed->dtype == AT_F32 && d->w->lm_head == d->w->embed);
        at_kv_cache_reset(c);
        CHECK_OK(at_decoder_prefill(d, c, ids, 12, NULL, lq, 0));
        double e = rel_l2(at_tensor_data(lq), at_tensor_data(lg), (size_t)V);
        printf("stories260K %s: logits rel L2 vs dense %.4f\n", at_quant_name(kinds[k]), e);
        CHECK(e < (kinds[k] == AT_QUANT_Q8_0 ? 0.02 : 0.3));
        at_decoder_free(d);
    }
    at_kv_cache_free(c);
    at_tensor_free(lg);
    at_tensor_free(lq);
    at_decoder_free(dense);
}

/* The trainer with --quant_bits 4 on the demo: runs, lowers the loss,
 * writes a checkpoint; its first loss is near plain LoRA's on bf16 weights. */
#define TRAIN_STEPS (AT_TEST_UNDER_EMULATOR ? 4 : 8)
static void test_trainer(const char *root)
{
    at_train_args a;
    at_train_result r, r0;
    char out[512], out0[512];
    snprintf(out, sizeof out, "%s/qlora", root);
    snprintf(out0, sizeof out0, "%s/lora", root);
    for (int run = 0; run < 2; run++) {
        at_test_train_args(&a, "demo/stories260K", "demo/identity.json#16", run ? out : out0);
        a.learning_rate = 3e-3;
        a.lora_rank = 16;
        a.lora_dropout = 0;
        a.batch_size = AT_TEST_UNDER_EMULATOR ? 2 : 4;
        a.max_steps = TRAIN_STEPS;
        a.has_dtype = 1;
        a.dtype = AT_BF16;
        a.quant_bits = run ? 4 : 0;
        CHECK_OK(at_train_run(&a, stdout, run ? &r : &r0));
    }
    printf("demo: LoRA over bf16 loss %.4f -> %.4f; QLoRA (nf4) loss %.4f -> %.4f\n", r0.first_loss, r0.last_loss,
           r.first_loss, r.last_loss);
    CHECK_MSG(r.last_loss < 0.7 * r.first_loss, "QLoRA loss %g -> %g", r.first_loss, r.last_loss);
    CHECK_NEAR(r.first_loss, r0.first_loss, 0.05 * r0.first_loss);
    char ck_name[32];
    snprintf(ck_name, sizeof ck_name, "checkpoint-%d", TRAIN_STEPS);
    char *ck = at_path_join(r.run_dir, ck_name);
    char *ad = ck ? at_path_join(ck, "adapter_model.safetensors") : NULL;
    CHECK(ad && at_file_exists(ad));
    free(ad);
    free(ck);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void)
{
    char root[] = "/tmp/anytune-qlora-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    double t0 = now();
    test_full_refused();
    double t1 = now();
    test_loader_stories();
    double t2 = now();
    test_trainer(root);
    double t3 = now();
    test_qwen_shape();
    printf("seconds: refusals %.1f, loader %.1f, trainer %.1f, qwen shape %.1f\n", t1 - t0, t2 - t1, t3 - t2,
           now() - t3);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("qlora");
}
