/* Preference objectives (train/preference.h, `anytune rlhf --rlhf_type
 * dpo|simpo|cpo|orpo`):
 *  - against PyTorch (tools/make_dpo_goldens.py: TRL's get_batch_logps,
 *    dpo_loss, cpo_loss and odds_ratio_loss on the golden qwen2_bias_tied
 *    model with its LoRA adapter, two pairs): reference and policy log-probs,
 *    the loss and the gradient of every lora_A / lora_B for DPO (sigmoid,
 *    rpo_alpha, ipo, label smoothing), SimPO (the paper's, and with cpo_alpha
 *    and smoothing), CPO (sigmoid, ipo) and ORPO (two betas, with TRL's
 *    log-odds metrics); the same gradients when the pairs run as two
 *    micro-batches; reference-free objectives never read the reference;
 *  - the per-row gradient scale of at_decoder_loss: rows with scales s_b get
 *    Σ s_b × the gradient of each row run alone;
 *  - every pair loss and its derivatives against finite differences and the
 *    textbook formulas, finite at extreme log-probs (ORPO's certain replies);
 *    ms-swift's defaults per type and the option checks;
 *  - ms-swift, TRL and LLaMA-Factory records: labels on the final reply only;
 *  - bad records: errors naming the file and line;
 *  - the CLI end to end on the demo model and real LLaMA-Factory pairs:
 *    TRL's metrics in logging.jsonl, the loss falls and the margin grows on a
 *    repeated tiny set (each objective), PEFT checkpoints, a DPO run killed
 *    between checkpoints and resumed logs exactly what an uninterrupted run
 *    logs; usage errors exit 2 saying why. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "data/dataset.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/preference.h"
#include "train/run_files.h"
#include "train/text_pipeline.h"
#include "train/trainer.h"
#include "train_goldens.h"
#include "device/cpu/cpu_backend.h"

#define TOL 1e-4

/* ---- the golden ---- */

typedef struct {
    train_case c; /* d, ad and gf (the DPO golden) are used */
    at_pref_pairs p;
    int32_t *ids, *labels, *lengths;
    int B, T;
} dpo_case;

static void dc_free(dpo_case *k)
{
    at_pref_pairs_free(&k->p);
    free(k->ids);
    free(k->labels);
    free(k->lengths);
    tc_free(&k->c);
}

static at_status dc_open(dpo_case *k)
{
    at_status st = AT_OK;
    memset(k, 0, sizeof *k);
    at_load_options o = at_load_options_default();
    o.backend = at_cpu_backend();
    o.dtype = AT_F32;
    AT_CHECK(at_decoder_load(GOLDEN_DIR "/qwen2_bias_tied", &o, &k->c.d));
    AT_CHECK(at_adapter_load(GOLDEN_DIR "/qwen2_bias_tied_lora", &k->c.d->cfg, k->c.d->be, &k->c.ad));
    AT_CHECK(at_st_open(GOLDEN_DIR "/qwen2_bias_tied.dpo.golden.safetensors", &k->c.gf));
    int64_t shape[4] = {0};
    int nd = 0;
    AT_CHECK(golden_array(k->c.gf, "input_ids", AT_I32, (void **)&k->ids, shape, &nd));
    k->B = (int)shape[0];
    k->T = (int)shape[1];
    AT_CHECK(golden_array(k->c.gf, "labels", AT_I32, (void **)&k->labels, NULL, NULL));
    AT_CHECK(golden_array(k->c.gf, "lengths", AT_I32, (void **)&k->lengths, NULL, NULL));
    /* the pairs as at_pref_pairs_encode would hold them */
    size_t n = (size_t)k->B / 2;
    k->p.n = n;
    k->p.chosen = calloc(n, sizeof *k->p.chosen);
    k->p.rejected = calloc(n, sizeof *k->p.rejected);
    k->p.len = calloc(n, sizeof *k->p.len);
    k->p.n_c = calloc(n, sizeof *k->p.n_c);
    k->p.n_r = calloc(n, sizeof *k->p.n_r);
    k->p.ref_c = calloc(n, sizeof *k->p.ref_c);
    k->p.ref_r = calloc(n, sizeof *k->p.ref_r);
    if (!k->p.chosen || !k->p.rejected || !k->p.len || !k->p.n_c || !k->p.n_r || !k->p.ref_c || !k->p.ref_r) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < k->B; r++) {
        at_encoded *e = r % 2 ? &k->p.rejected[r / 2] : &k->p.chosen[r / 2];
        size_t L = (size_t)k->lengths[r];
        e->n = L;
        e->ids = malloc(L * sizeof *e->ids);
        e->labels = malloc(L * sizeof *e->labels);
        if (!e->ids || !e->labels) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(e->ids, k->ids + (size_t)r * k->T, L * sizeof *e->ids);
        memcpy(e->labels, k->labels + (size_t)r * k->T, L * sizeof *e->labels);
        int64_t nt = 0;
        for (size_t t = 1; t < L; t++) nt += e->labels[t] >= 0;
        if (r % 2) k->p.n_r[r / 2] = nt;
        else k->p.n_c[r / 2] = nt;
        if (L > k->p.len[r / 2]) k->p.len[r / 2] = L;
    }
done:
    if (st != AT_OK) dc_free(k);
    return st;
}

typedef struct {
    at_tensor *ids, *pos, *labels;
} up_tensors;

static void up_free(up_tensors *u)
{
    at_tensor_free(u->ids);
    at_tensor_free(u->pos);
    at_tensor_free(u->labels);
}

static void up(at_backend *be, const at_batch *b, up_tensors *u)
{
    int64_t sh[2] = {(int64_t)b->rows, (int64_t)b->cols};
    size_t bytes = b->rows * b->cols * sizeof(int32_t);
    CHECK_OK(at_tensor_new(be, AT_I32, 2, sh, "ids", &u->ids));
    CHECK_OK(at_tensor_new(be, AT_I32, 2, sh, "pos", &u->pos));
    CHECK_OK(at_tensor_new(be, AT_I32, 2, sh, "labels", &u->labels));
    if (u->ids && u->pos && u->labels) {
        CHECK_OK(at_tensor_upload(u->ids, b->ids, bytes));
        CHECK_OK(at_tensor_upload(u->pos, b->positions, bytes));
        CHECK_OK(at_tensor_upload(u->labels, b->labels, bytes));
    }
}

/* Runs the pairs idx[0..n) as one micro-batch of a step of step_pairs pairs. */
static void run_pairs(dpo_case *k, const at_pref_config *cfg, const size_t *idx, size_t n, double step_pairs,
                      double step_nll, unsigned flags, at_decoder_grads *g, at_pref_stats *s)
{
    at_batch b = {0};
    up_tensors u = {0};
    at_decoder_acts *a = NULL;
    CHECK_OK(at_pref_batch_build(&k->p, idx, n, 0, &b));
    up(k->c.d->be, &b, &u);
    CHECK_OK(at_decoder_acts_new_ex(k->c.d, (int)b.rows, (int)b.cols, flags, &a));
    if (a && u.labels)
        CHECK_OK(at_pref_forward_backward(cfg, &k->p, idx, n, k->c.d, a, u.ids, u.pos, u.labels, 0.0f, 0, step_pairs,
                                         step_nll, 1.0, g, s));
    at_decoder_acts_free(a);
    up_free(&u);
    at_batch_free(&b);
}

static void test_golden(void)
{
    dpo_case k;
    printf("DPO against PyTorch (qwen2_bias_tied + LoRA, 2 pairs)\n");
    CHECK_OK(dc_open(&k));
    if (!k.c.d) return;
    float *want_ref = NULL, *want_pol = NULL;
    CHECK_OK(golden_array(k.c.gf, "ref_logps", AT_F32, (void **)&want_ref, NULL, NULL));
    CHECK_OK(golden_array(k.c.gf, "policy_logps", AT_F32, (void **)&want_pol, NULL, NULL));

    /* the batch builder lays the pairs out as the golden: [c0, r0, c1, r1] */
    size_t idx[2] = {0, 1};
    at_batch b = {0};
    CHECK_OK(at_pref_batch_build(&k.p, idx, 2, 0, &b));
    CHECK(b.rows == (size_t)k.B && b.cols == (size_t)k.T);
    if (b.ids && b.rows == (size_t)k.B && b.cols == (size_t)k.T) {
        CHECK(!memcmp(b.ids, k.ids, (size_t)k.B * k.T * sizeof(int32_t)));
        CHECK(!memcmp(b.labels, k.labels, (size_t)k.B * k.T * sizeof(int32_t)));
    }

    /* reference: the model without the adapter */
    CHECK_OK(at_pref_reference(k.c.d, &k.p, 2, 0));
    for (int r = 0; r < k.B && want_ref; r++) {
        double got = r % 2 ? k.p.ref_r[r / 2] : k.p.ref_c[r / 2];
        printf("  row %d: reference log p %.6f, PyTorch %.6f\n", r, got, want_ref[r]);
        CHECK_NEAR(got, want_ref[r], 1e-5 * fabs(want_ref[r]));
    }
    /* policy: with the adapter, each row's log-prob sum */
    CHECK_OK(at_decoder_set_adapter(k.c.d, k.c.ad));
    {
        up_tensors u = {0};
        at_decoder_acts *a = NULL;
        up(k.c.d->be, &b, &u);
        double row[4] = {0};
        at_loss_stats ls = {0};
        ls.row_loss = row;
        CHECK_OK(at_decoder_acts_new_ex(k.c.d, k.B, k.T, AT_ACTS_LOSS, &a));
        if (a && u.ids && k.B == 4) {
            CHECK_OK(at_decoder_forward(k.c.d, a, u.ids, u.pos, NULL));
            CHECK_OK(at_decoder_loss(k.c.d, a, u.labels, 1.0f, NULL, &ls));
            for (int r = 0; r < 4 && want_pol; r++) CHECK_NEAR(-row[r], want_pol[r], 1e-5 * fabs(want_pol[r]));
            /* at_pref_reference (and at_pref_evaluate) keep one layer's
             * activations for all, with the adapter's intermediates: the same
             * kernels on the same inputs, so bit for bit the log-probs of the
             * forward above that keeps every layer */
            double keep_c[2] = {k.p.ref_c[0], k.p.ref_c[1]}, keep_r[2] = {k.p.ref_r[0], k.p.ref_r[1]};
            CHECK_OK(at_pref_reference(k.c.d, &k.p, 2, 0));
            for (int r = 0; r < 4; r++) {
                double got = r % 2 ? k.p.ref_r[r / 2] : k.p.ref_c[r / 2];
                CHECK_MSG(got == -row[r], "row %d: %.17g with one layer's activations, %.17g with every layer's", r,
                          got, -row[r]);
            }
            memcpy(k.p.ref_c, keep_c, sizeof keep_c);
            memcpy(k.p.ref_r, keep_r, sizeof keep_r);
        }
        at_decoder_acts_free(a);
        up_free(&u);
    }
    at_batch_free(&b);

    double nll_targets = (double)(k.p.n_c[0] + k.p.n_c[1]);
    /* the cases of tools/make_dpo_goldens.py; alpha: rpo_alpha (dpo) or
     * cpo_alpha (cpo, simpo); loss NULL: the type's own */
    static const struct {
        const char *name, *type, *loss;
        double beta, ls, alpha, gamma;
    } cases[] = {{"sigmoid", "dpo", NULL, 0.1, 0, 0, 0},        {"rpo", "dpo", NULL, 0.1, 0, 0.5, 0},
                 {"ipo", "dpo", "ipo", 0.1, 0, 0, 0},           {"smooth", "dpo", NULL, 0.5, 0.2, 0, 0},
                 {"simpo", "simpo", NULL, 2.0, 0, 0, 1.0},      {"simpo_nll", "simpo", NULL, 2.5, 0.1, 1.0, 0.5},
                 {"cpo", "cpo", NULL, 0.1, 0, 1.0, 0},          {"cpo_ipo", "cpo", "ipo", 0.1, 0, 0.5, 0},
                 {"orpo", "orpo", NULL, 0.1, 0, 0, 0},          {"orpo_b", "orpo", NULL, 0.5, 0, 0, 0}};
    at_decoder_grads *g = NULL, *g2 = NULL;
    CHECK_OK(at_decoder_grads_new(k.c.d, 0, &g));
    CHECK_OK(at_decoder_grads_new(k.c.d, 0, &g2));
    double ref_c[2] = {k.p.ref_c[0], k.p.ref_c[1]}, ref_r[2] = {k.p.ref_r[0], k.p.ref_r[1]};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && g && g2 && want_pol; i++) {
        at_pref_config cfg;
        CHECK_OK(at_pref_config_init(&cfg, cases[i].type));
        if (cases[i].loss) CHECK_OK(at_pref_loss_type_parse(cases[i].loss, &cfg.loss_type));
        cfg.beta = cases[i].beta;
        cfg.label_smoothing = cases[i].ls;
        if (cfg.objective == AT_PREF_DPO) cfg.rpo_alpha = cases[i].alpha;
        if (cfg.objective == AT_PREF_CPO) cfg.cpo_alpha = cases[i].alpha;
        cfg.simpo_gamma = cases[i].gamma;
        CHECK_OK(at_pref_config_check(&cfg));
        /* a reference-free objective must not read the reference log-probs */
        int ref = at_pref_needs_reference(&cfg);
        for (int j = 0; j < 2; j++) {
            k.p.ref_c[j] = ref ? ref_c[j] : NAN;
            k.p.ref_r[j] = ref ? ref_r[j] : NAN;
        }
        char key[64], prefix[64];
        snprintf(key, sizeof key, "%s.loss", cases[i].name);
        snprintf(prefix, sizeof prefix, "%s.lora.", cases[i].name);
        double want = tc_scalar(&k.c, key);
        /* one micro-batch of both pairs (checkpointing on for half the cases) */
        at_pref_stats s = {0};
        CHECK_OK(at_decoder_grads_zero(g));
        run_pairs(&k, &cfg, idx, 2, 2, nll_targets, AT_ACTS_TRAIN | (i % 2 ? AT_ACTS_CHECKPOINT : 0), g, &s);
        double loss = at_pref_stats_loss(&cfg, &s);
        printf("%s: loss %.7f, PyTorch %.7f\n", cases[i].name, loss, want);
        CHECK_NEAR(loss, want, 1e-5 * fabs(want));
        CHECK(s.pairs == 2);
        double e = tc_grads_err(&k.c, g, prefix, "LoRA grads, one micro-batch");
        CHECK_MSG(e <= TOL, "%s: LoRA gradient rel err %g", cases[i].name, e);
        /* the same step as two micro-batches of one pair (gradient accumulation) */
        at_pref_stats s2 = {0};
        CHECK_OK(at_decoder_grads_zero(g2));
        run_pairs(&k, &cfg, &idx[0], 1, 2, nll_targets, AT_ACTS_TRAIN, g2, &s2);
        run_pairs(&k, &cfg, &idx[1], 1, 2, nll_targets, AT_ACTS_TRAIN, g2, &s2);
        CHECK_NEAR(at_pref_stats_loss(&cfg, &s2), want, 1e-5 * fabs(want));
        e = tc_grads_err(&k.c, g2, prefix, "LoRA grads, two micro-batches");
        CHECK_MSG(e <= TOL, "%s: accumulated LoRA gradient rel err %g", cases[i].name, e);
        /* the evaluation gives the same loss without gradients */
        at_pref_stats se;
        CHECK_OK(at_pref_evaluate(&cfg, &k.p, k.c.d, 2, 0, &se));
        CHECK_NEAR(at_pref_stats_loss(&cfg, &se), want, 1e-5 * fabs(want));
        CHECK_NEAR(se.reward_c, s.reward_c, 1e-9 + 1e-9 * fabs(s.reward_c));
        if (!ref) {
            /* TRL's rewards without a reference: β·π, π a mean when averaged */
            double rc = 0, rr = 0;
            for (int j = 0; j < 2; j++) {
                double wc = at_pref_averaged(&cfg) ? 1.0 / (double)k.p.n_c[j] : 1;
                double wr = at_pref_averaged(&cfg) ? 1.0 / (double)k.p.n_r[j] : 1;
                rc += cfg.beta * want_pol[2 * j] * wc;
                rr += cfg.beta * want_pol[2 * j + 1] * wr;
            }
            CHECK_NEAR(s.reward_c, rc, 1e-5 * fabs(rc));
            CHECK_NEAR(s.reward_r, rr, 1e-5 * fabs(rr));
        }
        if (cfg.objective == AT_PREF_ORPO) {
            /* TRL's log_odds_chosen (Σ log-odds ratio) and log_odds_ratio (Σ its log σ) */
            float *lo = NULL;
            snprintf(key, sizeof key, "%s.log_odds", cases[i].name);
            CHECK_OK(golden_array(k.c.gf, key, AT_F32, (void **)&lo, NULL, NULL));
            if (lo) {
                double want_lo = (double)lo[0] + lo[1];
                double want_lr = log(1 / (1 + exp(-(double)lo[0]))) + log(1 / (1 + exp(-(double)lo[1])));
                printf("  log_odds %.6f, PyTorch %.6f; log σ %.6f, PyTorch %.6f\n", s.log_odds, want_lo,
                       s.log_odds_ratio, want_lr);
                CHECK_NEAR(s.log_odds, want_lo, 2e-5);
                CHECK_NEAR(s.log_odds_ratio, want_lr, 2e-5);
            }
            free(lo);
        } else {
            CHECK(s.log_odds == 0 && s.log_odds_ratio == 0);
        }
    }
    for (int j = 0; j < 2; j++) {
        k.p.ref_c[j] = ref_c[j];
        k.p.ref_r[j] = ref_r[j];
    }
    at_decoder_grads_free(g);
    at_decoder_grads_free(g2);
    free(want_ref);
    free(want_pol);
    dc_free(&k);
}

/* ---- per-row gradient scales ---- */

/* max |a − b| / max |b| over every gradient of two gradient sets */
static double grads_diff(at_decoder *d, at_decoder_grads *ga, at_decoder_grads *gb)
{
    int n = at_decoder_trainables(d, ga, NULL, 0);
    at_param_grad *pa = calloc((size_t)n, sizeof *pa), *pb = calloc((size_t)n, sizeof *pb);
    double maxd = 0, maxv = 0;
    if (pa && pb) {
        at_decoder_trainables(d, ga, pa, n);
        at_decoder_trainables(d, gb, pb, n);
        for (int i = 0; i < n; i++) {
            float *x = tc_host(pa[i].grad), *y = tc_host(pb[i].grad);
            for (int64_t k = 0; x && y && k < at_tensor_numel(pa[i].grad); k++) {
                maxd = fmax(maxd, fabs((double)x[k] - y[k]));
                maxv = fmax(maxv, fabs((double)y[k]));
            }
            free(x);
            free(y);
        }
    }
    free(pa);
    free(pb);
    return maxv > 0 ? maxd / maxv : 1e9;
}

static void test_row_scales(void)
{
    train_case c;
    printf("per-row gradient scales (qwen2_bias_tied training batch)\n");
    CHECK_OK(tc_open(&c, "qwen2_bias_tied", at_cpu_backend(), AT_F32, 1));
    if (!c.d) return;
    const float s[2] = {2.5f, -0.75f};
    at_decoder_grads *gsum = NULL, *grow = NULL, *gref = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &gsum));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &grow));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &gref));
    /* the batch with scales s */
    at_decoder_acts *a = NULL;
    CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &a));
    at_loss_stats ls = {0};
    ls.row_grad_scale = s;
    if (a && gsum) CHECK_OK(at_decoder_forward_backward(c.d, a, c.t_ids, NULL, NULL, c.t_labels, 0, 0, 0.5f, gsum, &ls));
    at_decoder_acts_free(a);
    /* each row alone (B = 1, plain grad_scale), combined by hand: Σ 0.5·s_b·g_b */
    at_tensor *ids1 = NULL, *lab1 = NULL;
    int64_t sh[2] = {1, c.T};
    CHECK_OK(at_tensor_new(c.d->be, AT_I32, 2, sh, "ids1", &ids1));
    CHECK_OK(at_tensor_new(c.d->be, AT_I32, 2, sh, "lab1", &lab1));
    CHECK_OK(at_decoder_acts_new_ex(c.d, 1, c.T, AT_ACTS_TRAIN, &a));
    int np = grow ? at_decoder_trainables(c.d, grow, NULL, 0) : 0;
    at_param_grad *pr = calloc((size_t)(np ? np : 1), sizeof *pr), *pf = calloc((size_t)(np ? np : 1), sizeof *pf);
    if (a && ids1 && lab1 && pr && pf && gref && c.B == 2) {
        at_decoder_trainables(c.d, grow, pr, np);
        at_decoder_trainables(c.d, gref, pf, np);
        for (int b = 0; b < 2; b++) {
            CHECK_OK(at_tensor_upload(ids1, c.ids + (size_t)b * c.T, (size_t)c.T * sizeof(int32_t)));
            CHECK_OK(at_tensor_upload(lab1, c.labels + (size_t)b * c.T, (size_t)c.T * sizeof(int32_t)));
            CHECK_OK(at_decoder_grads_zero(grow));
            at_loss_stats l1 = {0};
            CHECK_OK(at_decoder_forward_backward(c.d, a, ids1, NULL, NULL, lab1, 0, 0, 1.0f, grow, &l1));
            for (int i = 0; i < np; i++) CHECK_OK(at_axpy(pf[i].grad, 0.5f * s[b], pr[i].grad));
        }
        double e = grads_diff(c.d, gsum, gref);
        printf("  scaled rows vs rows alone: rel err %.2e\n", e);
        CHECK_MSG(e <= 1e-5, "per-row scales: rel err %g", e);
    }
    free(pr);
    free(pf);
    at_decoder_acts_free(a);
    at_tensor_free(ids1);
    at_tensor_free(lab1);
    at_decoder_grads_free(gsum);
    at_decoder_grads_free(grow);
    at_decoder_grads_free(gref);
    tc_free(&c);
}

/* ---- the pair loss ---- */

/* dL/dπ_c and dL/dπ_r of at_pref_pair against central differences */
static void fd_check(const at_pref_config *c, double pc, double pr, double rc, double rr)
{
    at_pref_pair_loss l, lp, lm;
    at_pref_pair(c, pc, pr, rc, rr, &l);
    const double h = 1e-5 * fmax(1e-2, fmin(1, fabs(pc) < fabs(pr) ? fabs(pc) : fabs(pr)));
    at_pref_pair(c, pc + h, pr, rc, rr, &lp);
    at_pref_pair(c, pc - h, pr, rc, rr, &lm);
    double fd = (lp.loss - lm.loss) / (2 * h);
    CHECK_MSG(fabs(l.d_chosen - fd) <= 1e-6 * fmax(1, fabs(fd)), "%s/%s at (%g, %g): dL/dπ_c %.9g, differences %.9g",
              c->name, at_pref_loss_type_name(c->loss_type), pc, pr, l.d_chosen, fd);
    at_pref_pair(c, pc, pr + h, rc, rr, &lp);
    at_pref_pair(c, pc, pr - h, rc, rr, &lm);
    fd = (lp.loss - lm.loss) / (2 * h);
    CHECK_MSG(fabs(l.d_rejected - fd) <= 1e-6 * fmax(1, fabs(fd)),
              "%s/%s at (%g, %g): dL/dπ_r %.9g, differences %.9g", c->name, at_pref_loss_type_name(c->loss_type), pc,
              pr, l.d_rejected, fd);
}

static double naive_log_sigmoid(double x) { return log(1 / (1 + exp(-x))); }

static void test_pair_math(void)
{
    at_pref_config c;
    /* ms-swift's defaults per --rlhf_type */
    CHECK_OK(at_pref_config_init(&c, "dpo"));
    CHECK(c.objective == AT_PREF_DPO && c.beta == 0.1 && c.loss_type == AT_PREF_SIGMOID && c.rpo_alpha == 0 &&
          c.label_smoothing == 0 && at_pref_needs_reference(&c) && !at_pref_averaged(&c) && at_pref_nll_alpha(&c) == 0);
    CHECK_OK(at_pref_config_init(&c, "simpo"));
    CHECK(c.objective == AT_PREF_CPO && c.loss_type == AT_PREF_SIMPO && c.beta == 2.0 && c.simpo_gamma == 1.0 &&
          c.cpo_alpha == 1.0 && !at_pref_needs_reference(&c) && at_pref_averaged(&c) && at_pref_nll_alpha(&c) == 1);
    CHECK_OK(at_pref_config_check(&c));
    CHECK_OK(at_pref_config_init(&c, "cpo"));
    CHECK(c.objective == AT_PREF_CPO && c.loss_type == AT_PREF_SIGMOID && c.beta == 0.1 && c.cpo_alpha == 1.0 &&
          c.simpo_gamma == 0 && !at_pref_needs_reference(&c) && !at_pref_averaged(&c));
    CHECK_OK(at_pref_config_check(&c));
    CHECK_OK(at_pref_config_init(&c, "orpo"));
    CHECK(c.objective == AT_PREF_ORPO && c.beta == 0.1 && !at_pref_needs_reference(&c) && at_pref_averaged(&c) &&
          at_pref_nll_alpha(&c) == 1);
    CHECK_OK(at_pref_config_check(&c));

    /* every objective's derivatives against finite differences */
    static const struct {
        const char *type, *loss;
        double beta, ls, gamma;
        double pc, pr, rc, rr; /* sums for dpo/cpo sigmoid and hinge, means otherwise */
    } pts[] = {
        {"dpo", "sigmoid", 0.3, 0.1, 0, -20.5, -23.25, -21, -22}, {"dpo", "ipo", 0.3, 0, 0, -1.5, -2.25, -1.25, -2},
        {"dpo", "hinge", 0.3, 0, 0, -20.5, -23.25, -21, -22},     {"cpo", "sigmoid", 0.1, 0.2, 0, -20.5, -23.25, 0, 0},
        {"cpo", "ipo", 0.1, 0, 0, -1.5, -2.25, 0, 0},             {"cpo", "hinge", 0.1, 0, 0, -20.5, -13.25, 0, 0},
        {"simpo", NULL, 2.0, 0, 1.0, -1.2, -1.5, 0, 0},           {"simpo", NULL, 2.5, 0.1, 0.5, -2.2, -0.4, 0, 0},
        {"orpo", NULL, 0.1, 0, 0, -0.8, -1.1, 0, 0},              {"orpo", NULL, 0.5, 0, 0, -0.05, -0.02, 0, 0},
        {"orpo", NULL, 0.1, 0, 0, -3.0, -0.3, 0, 0},              {"orpo", NULL, 1.0, 0, 0, -45.0, -0.001, 0, 0},
    };
    for (size_t i = 0; i < sizeof pts / sizeof pts[0]; i++) {
        CHECK_OK(at_pref_config_init(&c, pts[i].type));
        if (pts[i].loss) CHECK_OK(at_pref_loss_type_parse(pts[i].loss, &c.loss_type));
        c.beta = pts[i].beta;
        c.label_smoothing = pts[i].ls;
        if (pts[i].gamma) c.simpo_gamma = pts[i].gamma;
        CHECK_OK(at_pref_config_check(&c));
        fd_check(&c, pts[i].pc, pts[i].pr, pts[i].rc, pts[i].rr);
        /* the values by the textbook formulas */
        at_pref_pair_loss l, l2;
        at_pref_pair(&c, pts[i].pc, pts[i].pr, pts[i].rc, pts[i].rr, &l);
        double h = (pts[i].pc - pts[i].pr) - (pts[i].rc - pts[i].rr), want = NAN;
        if (c.objective == AT_PREF_ORPO) {
            double lc = pts[i].pc - log(1 - exp(pts[i].pc)), lr = pts[i].pr - log(1 - exp(pts[i].pr));
            want = -c.beta * naive_log_sigmoid(lc - lr);
            CHECK_NEAR(l.log_odds, lc - lr, 1e-9 * fmax(1, fabs(lc - lr)));
            CHECK_NEAR(l.log_odds_ratio, naive_log_sigmoid(lc - lr), 1e-9);
        } else if (c.loss_type == AT_PREF_IPO) {
            want = pow(h - 1 / (2 * c.beta), 2);
        } else if (c.loss_type == AT_PREF_HINGE) {
            want = fmax(0, 1 - c.beta * h);
        } else {
            double z = c.beta * h - (c.loss_type == AT_PREF_SIMPO ? c.simpo_gamma : 0);
            want = -(1 - c.label_smoothing) * naive_log_sigmoid(z) - c.label_smoothing * naive_log_sigmoid(-z);
        }
        CHECK_MSG(fabs(l.loss - want) <= 1e-9 * fmax(1, fabs(want)), "%s/%s: loss %.12g, want %.12g", c.name,
                  at_pref_loss_type_name(c.loss_type), l.loss, want);
        /* reference-free: the reference arguments are ignored */
        at_pref_pair(&c, pts[i].pc, pts[i].pr, 5, -7, &l2);
        if (!at_pref_needs_reference(&c)) CHECK(l2.loss == l.loss && l2.d_chosen == l.d_chosen);
    }

    /* extreme log-probs stay finite, for every objective; ORPO's certain
     * replies (mean log-prob 0, or -0 / tiny from f32 rounding) too */
    static const double ext[][2] = {{-1e4, 0}, {0, -1e4}, {0, 0}, {-0.0, -1e-300}, {-1e-9, -1e-12},
                                    {-1e4, -1e4}, {-745, -1e-7}, {1e-12, -2}};
    static const char *types[] = {"dpo", "simpo", "cpo", "orpo"};
    for (size_t t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
            CHECK_OK(at_pref_config_init(&c, types[t]));
            at_pref_pair_loss l;
            at_pref_pair(&c, ext[i][0], ext[i][1], 0, 0, &l);
            CHECK_MSG(isfinite(l.loss) && isfinite(l.d_chosen) && isfinite(l.d_rejected) && isfinite(l.log_odds) &&
                          l.loss >= 0,
                      "%s at (%g, %g): loss %g, d %g %g", types[t], ext[i][0], ext[i][1], l.loss, l.d_chosen,
                      l.d_rejected);
            /* the loss still prefers the chosen reply: dL/dπ_c ≤ 0 ≤ dL/dπ_r */
            CHECK(l.d_chosen <= 0 && l.d_rejected >= 0);
        }
    at_pref_pair_loss l;
    CHECK_OK(at_pref_config_init(&c, "orpo"));
    at_pref_pair(&c, NAN, -1, 0, 0, &l); /* a broken forward stays visible to the trainer's check */
    CHECK(isnan(l.loss));
    at_pref_pair(&c, 0, 0, 0, 0, &l); /* both certain: equal odds */
    CHECK_NEAR(l.loss, c.beta * log(2), 1e-12);
    at_pref_pair(&c, -1e4, 0, 0, 0, &l); /* chosen impossible, rejected certain: ≈ β·(1e4 + ℓ(max)) */
    CHECK(l.loss > 0.1 * 1e4 && l.d_rejected > 0);
    CHECK_OK(at_pref_config_init(&c, "dpo"));
    at_pref_pair(&c, -1e4, 0, 0, 0, &l);
    CHECK(isfinite(l.loss) && isfinite(l.d_chosen) && l.loss > 900);

    /* names and option checks */
    at_pref_loss_type lt;
    CHECK_FAILS(at_pref_loss_type_parse("kto_pair", &lt), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "sigmoid") != NULL);
    CHECK_FAILS(at_pref_config_init(&c, "ppo"), AT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(at_last_error(), "not in this build") && strstr(at_last_error(), "dpo, simpo, cpo, orpo, kto, rm and grpo"),
              "message: %s", at_last_error());
    CHECK_FAILS(at_pref_config_init(&c, "dpoo"), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "unknown") && strstr(at_last_error(), "dpo, simpo, cpo, orpo, kto, rm and grpo"), "message: %s",
              at_last_error());
    static const struct {
        const char *type, *what, *msg;
    } bad[] = {{"orpo", "ref_model", "reference-free"}, {"simpo", "ref_model", "reference-free"},
               {"cpo", "rpo_alpha", "--rpo_alpha"},     {"dpo", "cpo_alpha", "--cpo_alpha"},
               {"cpo", "simpo_gamma", "--simpo_gamma"}, {"orpo", "label_smoothing", "--label_smoothing"},
               {"dpo", "loss_simpo", "--rlhf_type simpo"}, {"orpo", "loss_ipo", "orpo"},
               {"cpo", "beta", "--beta"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_OK(at_pref_config_init(&c, bad[i].type));
        if (!strcmp(bad[i].what, "ref_model")) c.ref_model = "demo/stories260K";
        if (!strcmp(bad[i].what, "rpo_alpha")) c.rpo_alpha = 0.5;
        if (!strcmp(bad[i].what, "cpo_alpha")) c.cpo_alpha = 0.5;
        if (!strcmp(bad[i].what, "simpo_gamma")) c.simpo_gamma = 0.5;
        if (!strcmp(bad[i].what, "label_smoothing")) c.label_smoothing = 0.1;
        if (!strcmp(bad[i].what, "loss_simpo")) c.loss_type = AT_PREF_SIMPO;
        if (!strcmp(bad[i].what, "loss_ipo")) c.loss_type = AT_PREF_IPO;
        if (!strcmp(bad[i].what, "beta")) c.beta = 0;
        CHECK_FAILS(at_pref_config_check(&c), AT_ERR_INVALID);
        CHECK_MSG(strstr(at_last_error(), bad[i].msg) != NULL, "%s with %s: %s", bad[i].type, bad[i].what,
                  at_last_error());
    }
}

/* ---- records ---- */

static void test_records(void)
{
    at_tokenizer *tok = NULL;
    at_chat_template *tmpl = NULL;
    at_tokenizer_opts to = {0};
    CHECK_OK(at_tokenizer_load("demo/stories260K", &to, &tok));
    CHECK_OK(at_chat_template_load("demo/stories260K", NULL, NULL, &tmpl));
    if (!tok || !tmpl) return;
    at_text_pipeline pipe;
    CHECK_OK(at_text_pipeline_init(&pipe, tok, tmpl, 1));
    at_encoder enc;
    at_text_pipeline_encoder(&pipe, &enc);
    const char *spec[] = {"tests/data/dpo/swift_trl.jsonl"};
    at_dataset_options o = {.seed = 42, .strict = 1};
    at_dataset *ds = NULL;
    CHECK_OK(at_dataset_load(spec, 1, &o, &ds));
    at_pref_pairs p = {0};
    if (ds) CHECK_OK(at_pref_pairs_encode(&ds->train, &enc, 1, "train", &p));
    CHECK(p.n == 3);
    /* the labeled tokens of each side decode to exactly its reply (+ the end of turn) */
    const char *want_c[] = {"Lily is a little girl.", "Once upon a time there was a cat.", "Tom saw a big tree."};
    const char *want_r[] = {"The dog ran away.", "No.", "Tom saw nothing."};
    for (size_t i = 0; i < p.n && i < 3; i++) {
        for (int side = 0; side < 2; side++) {
            const at_encoded *e = side ? &p.rejected[i] : &p.chosen[i];
            int32_t *lab = malloc(e->n * sizeof *lab);
            size_t m = 0;
            for (size_t k = 0; lab && k < e->n; k++)
                if (e->labels[k] >= 0) lab[m++] = e->labels[k];
            char *text = NULL;
            if (lab) CHECK_OK(at_tokenizer_decode(tok, lab, m, 1, &text, NULL));
            const char *want = side ? want_r[i] : want_c[i];
            /* the template writes " reply</s>\n" (chat_template.h: the span
             * runs to the end of the turn); </s> decodes to nothing and the
             * "\n" after it with SentencePiece's dummy-prefix space */
            const char *got = text;
            while (got && *got == ' ') got++;
            size_t wl = strlen(want);
            CHECK_MSG(got && !strncmp(got, want, wl) && !strcmp(got + wl, " \n"), "pair %zu side %d: labels decode to \"%s\", want \"%s\"", i, side,
                      text ? text : "", want);
            /* the earlier assistant turn of the ms-swift record is context only */
            if (i == 0) CHECK(text && !strstr(text, "sunny"));
            free(text);
            free(lab);
        }
        /* both sides share the prompt: the same ids up to the first label */
        size_t k = 0;
        while (k < p.chosen[i].n && k < p.rejected[i].n && p.chosen[i].labels[k] < 0 && p.rejected[i].labels[k] < 0) {
            CHECK(p.chosen[i].ids[k] == p.rejected[i].ids[k]);
            k++;
        }
        CHECK(k > 3);
    }
    at_pref_pairs_free(&p);
    at_dataset_free(ds);
    ds = NULL;

    /* a record without "rejected": the file and line */
    const char *bad[] = {"tests/data/dpo/bad_record.jsonl"};
    CHECK(at_dataset_load(bad, 1, &o, &ds) != AT_OK);
    CHECK_MSG(strstr(at_last_error(), "bad_record.jsonl:2") != NULL, "message: %s", at_last_error());
    at_dataset_free(ds);
    ds = NULL;
    /* a conversation where a pair is expected */
    const char *np[] = {"tests/data/dpo/not_pairs.jsonl"};
    CHECK_OK(at_dataset_load(np, 1, &o, &ds));
    if (ds) {
        CHECK_FAILS(at_pref_pairs_encode(&ds->train, &enc, 1, "train", &p), AT_ERR_INVALID);
        CHECK_MSG(strstr(at_last_error(), "not_pairs.jsonl:1") && strstr(at_last_error(), "not a preference pair"),
                  "message: %s", at_last_error());
    }
    at_dataset_free(ds);
    at_text_pipeline_free(&pipe);
    at_chat_template_free(tmpl);
    at_tokenizer_free(tok);
}

/* ---- the command end to end ---- */

static const char *MODEL = "demo/stories260K";
static const char *PAIRS = "tests/data/dpo/dpo_en_demo_8.json";
/* The real pairs are 120-230 tokens a side: cut at 128 (right) they keep 20+
 * reply tokens each and the CLI runs stay short under ASan. */
#define CLI_MAX_LENGTH "128"

/* The newest run folder under out (caller frees); NULL when none. */
static char *run_dir_of(const char *out)
{
    char cmd[1024], line[1024] = {0};
    snprintf(cmd, sizeof cmd, "ls -d %s/v*-* 2>/dev/null | tail -1", out);
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    char *r = fgets(line, sizeof line, f) ? strdup(line) : NULL;
    pclose(f);
    if (r) r[strcspn(r, "\n")] = 0;
    return r;
}

/* The loss and the reward margin of the first and last lines of a run's
 * logging.jsonl, after checking that every line has each of keys[0..n). */
typedef struct {
    int lines;
    double first_loss, last_loss, first_margin, last_margin;
} log_summary;

static log_summary read_log(const char *run, const char *what, const char *const *keys, size_t n)
{
    log_summary s = {0, NAN, NAN, NAN, NAN};
    char *p = at_path_join(run, "logging.jsonl"), *text = NULL;
    CHECK_OK(at_read_file(p, &text, NULL));
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        for (size_t i = 0; i < n; i++)
            CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[i])), "%s: logging.jsonl line %d lacks %s", what,
                      s.lines + 1, keys[i]);
        double l = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "loss"));
        double m = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "rewards/margins"));
        if (!s.lines) {
            s.first_loss = l;
            s.first_margin = m;
        }
        s.last_loss = l;
        s.last_margin = m;
        s.lines++;
        cJSON_Delete(j);
    }
    printf("cli %s: %d steps, loss %.4f -> %.4f, margin %.4f -> %.4f\n", what, s.lines, s.first_loss, s.last_loss,
           s.first_margin, s.last_margin);
    free(text);
    free(p);
    return s;
}

static void test_cli(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char out_a[512], out_b[512];
    snprintf(out_a, sizeof out_a, "%s/dpo-whole", root);
    snprintf(out_b, sizeof out_b, "%s/dpo-killed", root);
    /* 3 of the real pairs, one a step: an epoch is 3 steps, so the run
     * killed after step 3 resumes from checkpoint-2 in the middle of the
     * first epoch and crosses into the (reshuffled) second */
    char ds[256];
    snprintf(ds, sizeof ds, "%s#3", PAIRS);
    char *argv[64];
    int k = 0;
    char *common[] = {"rlhf", "--rlhf_type", "dpo", "--model", (char *)MODEL, "--dataset", ds, "--learning_rate",
                      "2e-3", "--logging_steps", "1", "--save_steps", "2", "--max_steps", "4",
                      "--per_device_train_batch_size", "1", "--lora_dropout", "0.1", "--rpo_alpha", "0.1",
                      "--lr_scheduler_type", "constant", "--seed", "3", "--torch_dtype", "float32", "--max_length",
                      CLI_MAX_LENGTH, "--truncation_strategy", "right"};
    argv[k++] = (char *)bin;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) argv[k++] = common[i];
    argv[k++] = "--output_dir";
    argv[k++] = out_a;
    argv[k] = NULL;
    char err[512];
    snprintf(err, sizeof err, "%s/stderr.txt", root);
    int status = at_test_run(argv, err);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "anytune rlhf failed (status %d)", status);
    CHECK(at_test_file_has(err, "reference log-probs")); /* DPO's reference pass (the others have none) */
    char *run = run_dir_of(out_a);
    CHECK(run != NULL);
    if (run) {
        /* TRL's metrics on every line; the loss falls and the margin grows */
        static const char *keys[] = {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                     "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss", "grad_norm",
                                     "lr"};
        log_summary s = read_log(run, "dpo", keys, sizeof keys / sizeof keys[0]);
        CHECK(s.lines == 4);
        /* the policy starts as the reference: DPO's loss is log 2, plus rpo_alpha·NLL */
        CHECK_NEAR(s.first_margin, 0, 1e-9);
        CHECK_MSG(s.last_loss < s.first_loss - 0.1, "loss %g -> %g", s.first_loss, s.last_loss);
        CHECK_MSG(s.last_margin > s.first_margin + 0.5, "margin %g -> %g", s.first_margin, s.last_margin);
        /* PEFT checkpoints */
        char *ck = at_path_join(run, "checkpoint-2");
        CHECK_OK(at_manifest_verify(ck));
        char *af = at_path_join(ck, "adapter_model.safetensors"), *ac = at_path_join(ck, "adapter_config.json");
        CHECK(at_file_exists(af) && at_file_exists(ac));
        free(af);
        free(ac);
        free(ck);
        /* args.json says what ran */
        char *aj = at_path_join(run, "args.json"), *atext = NULL;
        CHECK_OK(at_read_file(aj, &atext, NULL));
        CHECK(atext && strstr(atext, "\"rlhf\"") && strstr(atext, "\"beta\""));
        free(atext);
        free(aj);
    }

    /* killed after step 3 (checkpoint-2 the last), resumed: the same log */
    argv[k - 1] = out_b;
    setenv("ANYTUNE_DEBUG_KILL_AFTER_STEP", "3", 1);
    status = at_test_run(argv, NULL);
    unsetenv("ANYTUNE_DEBUG_KILL_AFTER_STEP");
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the run was not killed (status %d)", status);
    argv[k++] = "--resume_from_checkpoint";
    argv[k++] = "last";
    argv[k] = NULL;
    status = at_test_run(argv, NULL);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *run_b = run_dir_of(out_b);
    if (run && run_b) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' %s/logging.jsonl > %s/a.txt && "
                 "sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' %s/logging.jsonl > %s/b.txt && "
                 "test $(wc -l < %s/a.txt) -eq 4 && cmp %s/a.txt %s/b.txt",
                 run, root, run_b, root, root, root, root);
        CHECK_MSG(system(cmd) == 0, "logging.jsonl of the resumed DPO run differs from the uninterrupted one");
    }
    free(run_b);
    free(run);

    /* usage errors */
    char *bad_type[] = {(char *)bin, "rlhf", "--rlhf_type", "ppo", "--model", (char *)MODEL, "--dataset", ds, NULL};
    status = at_test_run(bad_type, NULL);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    char *bad_data[] = {(char *)bin, "rlhf", "--model", (char *)MODEL, "--dataset", "tests/data/dpo/not_pairs.jsonl",
                        "--strict", "true", "--output_dir", out_a, NULL};
    status = at_test_run(bad_data, NULL);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

/* The reference-free objectives end to end: 4 steps each on one real pair
 * (every step sees it: the loss of the same pair must fall); TRL's metrics on
 * every line, the margin grows, no reference pass, ms-swift's defaults in
 * args.json. One pair cut at CLI_MAX_LENGTH and no checkpointing keep it
 * short under ASan. */
static void test_cli_objectives(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char ds[256], err[512];
    snprintf(ds, sizeof ds, "%s#1", PAIRS);
    snprintf(err, sizeof err, "%s/stderr.txt", root);
    /* TRL's metrics on every line; nll_loss and orpo's log-odds where the objective has them */
    static const struct {
        const char *type, *lr;
        double beta; /* what args.json must say */
        int margin;  /* whether the margin must grow */
        const char *keys[11];
        size_t n_keys;
    } runs[] = {{"simpo", "2e-3", 2.0, 1, {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                            "rewards/margins", "logps/chosen", "logps/rejected", "grad_norm",
                                            "nll_loss"}, 9},
                /* CPO compares sums, and this chosen reply is far shorter: its
                 * margin starts saturated and the NLL term leads */
                {"cpo", "2e-3", 0.1, 0, {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                          "rewards/margins", "logps/chosen", "logps/rejected", "grad_norm",
                                          "nll_loss"}, 9},
                {"orpo", "2e-3", 0.1, 1, {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                           "rewards/margins", "logps/chosen", "logps/rejected", "grad_norm",
                                           "nll_loss", "log_odds_ratio", "log_odds_chosen"}, 11}};
    const int steps = 4;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char out[512];
        snprintf(out, sizeof out, "%s/%s", root, runs[r].type);
        char *argv[] = {(char *)bin, "rlhf", "--rlhf_type", (char *)runs[r].type, "--model", (char *)MODEL,
                        "--dataset", ds, "--learning_rate", (char *)runs[r].lr, "--logging_steps", "1", "--save_steps",
                        "100", "--max_steps", "4", "--per_device_train_batch_size", "1", "--lora_dropout", "0",
                        "--lr_scheduler_type", "constant", "--seed", "3", "--torch_dtype", "float32",
                        "--gradient_checkpointing", "false", "--max_length", CLI_MAX_LENGTH, "--truncation_strategy",
                        "right", "--output_dir", out, NULL};
        int status = at_test_run(argv, err);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "anytune rlhf --rlhf_type %s failed (status %d)",
                  runs[r].type, status);
        /* reference-free: no reference pass */
        CHECK_MSG(!at_test_file_has(err, "reference log-probs"), "%s ran a reference pass", runs[r].type);
        char *run = run_dir_of(out);
        CHECK(run != NULL);
        if (!run) continue;
        log_summary s = read_log(run, runs[r].type, runs[r].keys, runs[r].n_keys);
        CHECK(s.lines == steps);
        CHECK_MSG(s.last_loss < s.first_loss - 0.05 * fabs(s.first_loss), "%s: loss %g -> %g", runs[r].type,
                  s.first_loss, s.last_loss);
        if (runs[r].margin)
            CHECK_MSG(s.last_margin > s.first_margin, "%s: margin %g -> %g", runs[r].type, s.first_margin,
                      s.last_margin);
        /* args.json: the type and the defaults it resolved to */
        char *aj = at_path_join(run, "args.json");
        cJSON *args = NULL;
        CHECK_OK(at_json_parse_file(aj, &args));
        if (args) {
            CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(args, "rlhf_type")), runs[r].type));
            CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(args, "beta")), runs[r].beta, 1e-12);
            if (strcmp(runs[r].type, "orpo") != 0)
                CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(args, "cpo_alpha")), 1.0, 1e-12);
            if (!strcmp(runs[r].type, "simpo")) {
                CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(args, "simpo_gamma")), 1.0, 1e-12);
                CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(args, "loss_type")), "simpo"));
            }
        }
        cJSON_Delete(args);
        free(aj);
        free(run);
    }

    /* usage errors: exit 2 with a message that says why */
    static const struct {
        const char *type, *opt, *val, *msg;
    } bad[] = {{"orpo", "--ref_model", "demo/stories260K", "reference-free"},
               {"ppo", NULL, NULL, "not in this build"},
               {"dpoo", NULL, NULL, "this build has dpo, simpo, cpo, orpo, kto, rm and grpo"},
               {"orpo", "--loss_type", "ipo", "does not apply to --rlhf_type orpo"},
               {"dpo", "--simpo_gamma", "0.5", "--simpo_gamma"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[512];
        snprintf(out, sizeof out, "%s/bad", root);
        char *argv[16];
        int k = 0;
        argv[k++] = (char *)bin;
        argv[k++] = "rlhf";
        argv[k++] = "--rlhf_type";
        argv[k++] = (char *)bad[i].type;
        argv[k++] = "--model";
        argv[k++] = (char *)MODEL;
        argv[k++] = "--dataset";
        argv[k++] = ds;
        argv[k++] = "--output_dir";
        argv[k++] = out;
        if (bad[i].opt) {
            argv[k++] = (char *)bad[i].opt;
            argv[k++] = (char *)bad[i].val;
        }
        argv[k] = NULL;
        int status = at_test_run(argv, err);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 2, "--rlhf_type %s %s: status %d", bad[i].type,
                  bad[i].opt ? bad[i].opt : "", status);
        CHECK_MSG(at_test_file_has(err, bad[i].msg), "--rlhf_type %s %s: the message lacks \"%s\"", bad[i].type,
                  bad[i].opt ? bad[i].opt : "", bad[i].msg);
        CHECK(!at_file_exists(out)); /* refused before anything was written */
    }
}

/* The trainer API with preference objectives: the errors it owes. */
static void test_trainer_errors(const char *root)
{
    at_train_args a;
    at_train_result r;
    at_pref_config c;
    CHECK_OK(at_pref_config_init(&c, "dpo"));
    char out[512];
    snprintf(out, sizeof out, "%s/errors", root);
    at_train_args_defaults(&a);
    const char *ds[] = {"tests/data/dpo/not_pairs.jsonl"};
    a.model = MODEL;
    a.datasets = ds;
    a.n_datasets = 1;
    a.output_dir = out;
    a.strict = 1;
    a.pref = &c;
    a.loss_last_turn_only = 1;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "not_pairs.jsonl:1") != NULL, "message: %s", at_last_error());
    a.strict = 0; /* skipped with a warning: nothing left */
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "no preference pair") != NULL);
    a.packing = 1;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_UNSUPPORTED);
    CHECK(strstr(at_last_error(), "--packing") != NULL);
    a.packing = 0; /* a reference model for a reference-free objective */
    CHECK_OK(at_pref_config_init(&c, "orpo"));
    c.ref_model = MODEL;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "reference-free") != NULL, "message: %s", at_last_error());
}

int main(void)
{
    char root[] = "/tmp/anytune-pref-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_pair_math();
    test_golden();
    test_row_scales();
    test_records();
    test_trainer_errors(root);
    test_cli(root);
    test_cli_objectives(root);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("test_preference");
}
