/* The decoder's loss and backward against PyTorch (tools/make_goldens.py:
 * a hand-written HF Llama/Qwen2/Qwen3 forward with PEFT LoRA, gradients by
 * torch autograd), for every f32 configuration:
 *  - the mean loss and each row's loss sum;
 *  - the gradient of every LoRA A and B (adapter on all 7 linear modules,
 *    B non-zero), with gradient checkpointing on and off (identical);
 *  - the LoRA parameters after two AdamW steps (torch.optim.AdamW);
 *  - full fine-tuning: the gradient of every weight (tied embeddings get the
 *    head's and the embedding's contributions);
 *  - the same LoRA gradients on the reference-kernel backend;
 *  - LoRA and full fine-tuning gradients and AdamW steps on the CUDA backend,
 *    its kernels run by the CUDA emulator (when the build has it), and on a
 *    real GPU when the machine has one;
 *  - the loss reads no final_norm row of a position without a target (the
 *    head's products skip them);
 *  - errors: backward before the loss, full FT on bf16 weights, mismatched
 *    activations. */
#include "device/cuda_loader.h"
#include "train/optimizer.h"
#include "train_goldens.h"

#define TOL 1e-4

static const char *const F32_CONFIGS[] = {"llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "llama3_rope"};
#define N_F32 (int)(sizeof F32_CONFIGS / sizeof F32_CONFIGS[0])

/* Loss and LoRA gradients, checkpointing on and off. */
static void test_lora_grads(const char *name, at_backend *be)
{
    train_case c;
    printf("%s (LoRA, %s backend)\n", name, be->name);
    CHECK_OK(tc_open(&c, name, be, AT_F32, 1));
    if (!c.d) return;
    at_decoder_grads *g1 = NULL, *g2 = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g1));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g2));
    double row[2] = {0};
    int64_t rowt[2] = {0};
    at_loss_stats s1 = {0}, s2 = {0};
    s1.row_loss = row;
    s1.row_targets = rowt;
    if (g1 && g2 && c.B == 2) {
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g1, 0.0f, 0, &s1));
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN, g2, 0.0f, 0, &s2));
        double want = tc_scalar(&c, "loss");
        CHECK(s1.n_targets == c.n_targets);
        CHECK(s1.n_targets == (int64_t)tc_scalar(&c, "n_targets"));
        CHECK(rowt[0] + rowt[1] == s1.n_targets);
        double loss = s1.loss_sum / (double)s1.n_targets;
        printf("  loss %.7f, PyTorch %.7f (rel err %.1e)\n", loss, want, fabs(loss - want) / want);
        CHECK_NEAR(loss, want, TOL * fabs(want));
        float *wrow = NULL;
        CHECK_OK(golden_array(c.gf, "row_loss", AT_F32, (void **)&wrow, NULL, NULL));
        if (wrow)
            for (int b = 0; b < 2; b++) CHECK_NEAR(row[b], wrow[b], TOL * fabs(wrow[b]));
        free(wrow);
        CHECK(s1.loss_sum == s2.loss_sum);
        double e = tc_grads_err(&c, g1, "lora.", "LoRA grads (checkpointing)");
        CHECK_MSG(e <= TOL, "%s: LoRA gradient rel err %g", name, e);
        /* checkpointing recomputes exactly the same activations: same gradients, bit for bit */
        int n = at_decoder_trainables(c.d, g1, NULL, 0);
        at_param_grad *p1 = calloc((size_t)n, sizeof *p1), *p2 = calloc((size_t)n, sizeof *p2);
        if (p1 && p2) {
            at_decoder_trainables(c.d, g1, p1, n);
            at_decoder_trainables(c.d, g2, p2, n);
            int same = 1;
            double sumsq = 0;
            for (int i = 0; i < n; i++) {
                float *a = tc_host(p1[i].grad), *b = tc_host(p2[i].grad);
                same &= a && b && !memcmp(a, b, at_tensor_nbytes(p1[i].grad));
                for (int64_t k = 0; a && k < at_tensor_numel(p1[i].grad); k++) sumsq += (double)a[k] * a[k];
                free(a);
                free(b);
            }
            CHECK_MSG(same, "%s: gradients differ with and without checkpointing", name);
            /* the optimizer's global norm (every tensor's Σg² on the device,
             * read back at once) against the host's, over all n tensors */
            at_optimizer opt = {0};
            at_adamw_config oc = {0.9, 0.999, 1e-8, 0.0, 1.0};
            double norm = -1;
            CHECK_OK(at_optimizer_init(&opt, c.d, g1, &oc));
            if (opt.n == n) CHECK_OK(at_optimizer_grad_norm(&opt, &norm));
            CHECK_MSG(opt.n == n && fabs(norm - sqrt(sumsq)) <= 1e-5 * sqrt(sumsq),
                      "%s: optimizer grad norm %.9g, host %.9g over %d tensors", name, norm, sqrt(sumsq), n);
            at_optimizer_free(&opt);
        }
        free(p1);
        free(p2);
    }
    at_decoder_grads_free(g1);
    at_decoder_grads_free(g2);
    tc_free(&c);
}

/* Two AdamW steps on the LoRA parameters, as torch.optim.AdamW. */
static void test_adamw_steps(const char *name, at_backend *be)
{
    train_case c;
    printf("%s (AdamW, %s backend)\n", name, be->name);
    CHECK_OK(tc_open(&c, name, be, AT_F32, 1));
    if (!c.d) return;
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g));
    int n = g ? at_decoder_trainables(c.d, g, NULL, 0) : 0;
    at_param_grad *pg = calloc((size_t)(n > 0 ? n : 1), sizeof *pg);
    at_tensor **m = calloc((size_t)(n > 0 ? n : 1), sizeof *m), **v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
    if (g && pg && m && v) {
        at_decoder_trainables(c.d, g, pg, n);
        for (int i = 0; i < n; i++) {
            CHECK_OK(at_tensor_zeros(c.d->be, AT_F32, pg[i].param->ndim, pg[i].param->shape, "m", &m[i]));
            CHECK_OK(at_tensor_zeros(c.d->be, AT_F32, pg[i].param->ndim, pg[i].param->shape, "v", &v[i]));
        }
        for (int step = 1; step <= 2; step++) {
            at_loss_stats s = {0};
            CHECK_OK(tc_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g, 0.0f, 0, &s));
            at_adamw_params ap = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                  .grad_scale = 1.0f, .step = step};
            for (int i = 0; i < n; i++) CHECK_OK(at_adamw(pg[i].param, pg[i].grad, m[i], v[i], &ap));
        }
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double e = tc_rel_err(&c, "adamw.", pg[i].param);
            if (!(e >= 0 && e <= worst)) worst = e < 0 ? 1e9 : e;
        }
        printf("  %-28s %3d parameters, worst rel err %.2e\n", "after 2 AdamW steps", n, worst);
        CHECK_MSG(worst <= TOL, "%s: AdamW parameters rel err %g", name, worst);
    }
    for (int i = 0; i < n && m && v; i++) {
        at_tensor_free(m[i]);
        at_tensor_free(v[i]);
    }
    free(m);
    free(v);
    free(pg);
    at_decoder_grads_free(g);
    tc_free(&c);
}

/* Full fine-tuning: every weight's gradient. */
static void test_full_grads(const char *name, at_backend *be)
{
    train_case c;
    printf("%s (full fine-tuning, %s backend)\n", name, be->name);
    CHECK_OK(tc_open(&c, name, be, AT_F32, 0));
    if (!c.d) return;
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 1, &g));
    if (g) {
        CHECK(g->lora == NULL && g->full != NULL);
        CHECK((g->full->lm_head == g->full->embed) == (c.d->w->lm_head == c.d->w->embed));
        /* one gradient per weight: as many elements as the model has parameters */
        int n = at_decoder_trainables(c.d, g, NULL, 0);
        at_param_grad *all = calloc((size_t)n, sizeof *all);
        int64_t total = 0;
        if (all) {
            at_decoder_trainables(c.d, g, all, n);
            for (int i = 0; i < n; i++) {
                total += at_tensor_numel(all[i].grad);
                CHECK(at_tensor_same_shape(all[i].grad, all[i].param) && all[i].grad->dtype == AT_F32);
            }
        }
        free(all);
        CHECK(total == at_decoder_weights_count(c.d->w));
        at_loss_stats s = {0};
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g, 0.0f, 0, &s));
        double e = tc_grads_err(&c, g, "full.", "full FT grads");
        CHECK_MSG(e <= TOL, "%s: full fine-tuning gradient rel err %g", name, e);
        /* micro-batches add up: a second backward doubles every gradient */
        at_decoder_acts *a = NULL;
        CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &a));
        if (a) {
            at_param_grad pg[1];
            at_decoder_trainables(c.d, g, pg, 1);
            float *before = tc_host(pg[0].grad);
            CHECK_OK(at_decoder_forward_backward(c.d, a, c.t_ids, NULL, NULL, c.t_labels, 0.0f, 0,
                                                 1.0f / (float)c.n_targets, g, &s));
            float *after = tc_host(pg[0].grad);
            double worst = 0;
            for (int64_t i = 0; before && after && i < at_tensor_numel(pg[0].grad); i++) {
                double d = fabs(after[i] - 2.0 * before[i]) / (fabs(before[i]) + 1e-6);
                if (d > worst) worst = d;
            }
            CHECK_MSG(before && after && worst < 1e-4, "%s: accumulation across micro-batches (%g)", name, worst);
            free(before);
            free(after);
            CHECK_OK(at_decoder_grads_zero(g));
            float *zero = tc_host(pg[0].grad);
            CHECK(zero && zero[0] == 0.0f);
            free(zero);
        }
        at_decoder_acts_free(a);
    }
    at_decoder_grads_free(g);
    tc_free(&c);
}

/* at_decoder_loss computes logits only for the positions that have a target:
 * with the final_norm rows of the others set to NaN between the forward and
 * the loss, the loss and the head's full gradient equal, bit for bit, those
 * of the run without it. Had the head multiplied those rows, dW_head +=
 * dlogitsᵀ·h would take 0·NaN from each (their dlogits rows are 0). */
static void test_untargeted_rows_unread(const char *name)
{
    train_case c;
    printf("%s (rows without a target)\n", name);
    CHECK_OK(tc_open(&c, name, at_cpu_backend(), AT_F32, 0));
    if (!c.d) return;
    at_decoder_grads *g = NULL;
    at_decoder_acts *a = NULL;
    float *want = NULL, *got = NULL;
    at_loss_stats s0 = {0}, s1 = {0};
    CHECK_OK(at_decoder_grads_new(c.d, 1, &g));
    CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &a));
    if (!g || !a) goto done;
    float scale = 1.0f / (float)c.n_targets;
    CHECK_OK(tc_step(&c, AT_ACTS_TRAIN, g, 0.0f, 0, &s0));
    want = tc_host(g->full->lm_head);
    CHECK_OK(at_decoder_grads_zero(g));
    CHECK_OK(at_decoder_forward_train(c.d, a, c.t_ids, NULL, NULL, 0.0f, 0));
    int64_t hd = c.d->cfg.hidden_size, poisoned = 0;
    float *h = at_tensor_data(&a->final_norm);
    for (int64_t i = 0; i < (int64_t)c.B * c.T; i++) {
        int has_target = i % c.T + 1 < c.T && c.labels[i + 1] >= 0; /* position t predicts label t + 1 */
        if (has_target) continue;
        for (int64_t j = 0; j < hd; j++) h[i * hd + j] = NAN;
        poisoned++;
    }
    CHECK_MSG(poisoned > 0 && poisoned < (int64_t)c.B * c.T, "%s: %lld of %lld positions without a target", name,
              (long long)poisoned, (long long)c.B * c.T);
    CHECK_OK(at_decoder_loss(c.d, a, c.t_labels, scale, g, &s1));
    CHECK_OK(at_decoder_backward(c.d, a, g));
    got = tc_host(g->full->lm_head);
    CHECK(s1.n_targets == s0.n_targets && s1.loss_sum == s0.loss_sum);
    CHECK_MSG(want && got && !memcmp(want, got, at_tensor_nbytes(g->full->lm_head)),
              "%s: the head's gradient read rows of positions without a target", name);
done:
    free(want);
    free(got);
    at_decoder_acts_free(a);
    at_decoder_grads_free(g);
    tc_free(&c);
}

static void test_errors(void)
{
    train_case c;
    CHECK_OK(tc_open(&c, "llama_bf16", at_cpu_backend(), AT_LOAD_KEEP_DTYPE, 1));
    if (!c.d) return;
    at_decoder_grads *g = NULL;
    /* full fine-tuning of bf16 weights is refused with a message */
    CHECK_FAILS(at_decoder_grads_new(c.d, 1, &g), AT_ERR_UNSUPPORTED);
    CHECK(g == NULL);
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g));
    at_decoder_acts *a = NULL, *fwd_only = NULL;
    CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &a));
    CHECK_OK(at_decoder_acts_new(c.d, c.B, c.T, &fwd_only));
    at_loss_stats s = {0};
    if (a && g && fwd_only) {
        CHECK_FAILS(at_decoder_loss(c.d, a, c.t_labels, 1.0f, g, &s), AT_ERR_INVALID);     /* no forward yet */
        CHECK_OK(at_decoder_forward(c.d, a, c.t_ids, NULL, NULL));
        CHECK_FAILS(at_decoder_backward(c.d, a, g), AT_ERR_INVALID);                      /* no loss yet */
        int64_t one = 1;
        at_tensor *short_labels = NULL;
        CHECK_OK(at_tensor_zeros(c.d->be, AT_I32, 1, &one, "short", &short_labels));
        if (short_labels) CHECK_FAILS(at_decoder_loss(c.d, a, short_labels, 1.0f, g, &s), AT_ERR_INVALID);
        at_tensor_free(short_labels);
        CHECK_OK(at_decoder_forward(c.d, fwd_only, c.t_ids, NULL, NULL));
        CHECK_FAILS(at_decoder_loss(c.d, fwd_only, c.t_labels, 1.0f, NULL, &s), AT_ERR_INVALID); /* no loss buffers */
        CHECK_FAILS(at_decoder_forward_train(c.d, fwd_only, c.t_ids, NULL, NULL, 0.1f, 1), AT_ERR_INVALID);
        CHECK_FAILS(at_decoder_forward_train(c.d, a, c.t_ids, NULL, NULL, 1.0f, 1), AT_ERR_INVALID);
        /* activations allocated for another adapter are refused */
        at_decoder_set_adapter(c.d, NULL);
        at_adapter *other = NULL;
        CHECK_OK(at_adapter_new(&c.d->cfg, c.d->be, 2, 4.0, 0.0, 0, 1u << AT_MOD_Q, 1, &other));
        if (other) {
            CHECK_OK(at_decoder_set_adapter(c.d, other));
            CHECK_FAILS(at_decoder_forward(c.d, a, c.t_ids, NULL, NULL), AT_ERR_INVALID);
            at_decoder_set_adapter(c.d, NULL);
        }
        at_adapter_free(other);
        /* an adapter for another model is refused */
        at_model_config cfg2 = c.d->cfg;
        cfg2.num_hidden_layers = 1;
        CHECK_OK(at_adapter_new(&cfg2, c.d->be, 2, 4.0, 0.0, 0, 1u << AT_MOD_Q, 1, &other));
        if (other) CHECK_FAILS(at_decoder_set_adapter(c.d, other), AT_ERR_INVALID);
        at_adapter_free(other);
        CHECK_OK(at_decoder_set_adapter(c.d, c.ad));
    }
    at_decoder_acts_free(a);
    at_decoder_acts_free(fwd_only);
    at_decoder_grads_free(g);
    tc_free(&c);
}

int main(void)
{
    for (int i = 0; i < N_F32; i++) {
        test_lora_grads(F32_CONFIGS[i], at_cpu_backend());
        test_full_grads(F32_CONFIGS[i], at_cpu_backend());
    }
    test_adamw_steps("llama_gqa", at_cpu_backend());
    test_adamw_steps("qwen3_qknorm", at_cpu_backend());
    test_untargeted_rows_unread("llama_gqa");
    /* the same goldens on the CUDA backend: its kernels run by the emulator,
     * and on a real GPU when the machine has one */
    at_backend *cuda[2] = {NULL, at_test_gpu_backend()};
#ifdef AT_CUDA_EMU_LIBRARY
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &cuda[0]));
#endif
    for (int b = 0; b < 2; b++) {
        for (int i = 0; cuda[b] && i < N_F32; i++) {
            test_lora_grads(F32_CONFIGS[i], cuda[b]);
            test_full_grads(F32_CONFIGS[i], cuda[b]);
        }
        if (cuda[b]) test_adamw_steps("qwen3_qknorm", cuda[b]);
    }
    /* the reference kernels (device/ref), written independently of the CPU ones */
    test_lora_grads("qwen2_bias_tied", golden_ref_backend());
    test_errors();
    return at_test_result("backward");
}
