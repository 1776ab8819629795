/* DPO (train/dpo.h, `anytune rlhf --rlhf_type dpo`):
 *  - against PyTorch (tools/make_dpo_goldens.py: TRL's get_batch_logps and
 *    dpo_loss on the golden qwen2_bias_tied model with its LoRA adapter, two
 *    pairs): reference and policy log-probs, the loss and the gradient of
 *    every lora_A / lora_B for sigmoid, sigmoid + rpo_alpha, ipo and label
 *    smoothing; the same gradients when the pairs run as two micro-batches;
 *  - the per-row gradient scale of at_decoder_loss: rows with scales s_b get
 *    Σ s_b × the gradient of each row run alone;
 *  - the pair loss and its derivative (hinge too) against finite differences;
 *  - ms-swift, TRL and LLaMA-Factory records: labels on the final reply only;
 *  - bad records: errors naming the file and line;
 *  - the CLI end to end on the demo model and real LLaMA-Factory pairs:
 *    TRL's metrics in logging.jsonl, the loss falls and the margin grows on a
 *    repeated tiny set, PEFT checkpoints, a run killed between checkpoints
 *    and resumed logs exactly what an uninterrupted run logs. */
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
#include "train/dpo.h"
#include "train/run_files.h"
#include "train/text_pipeline.h"
#include "train/trainer.h"
#include "train_goldens.h"
#include "device/cpu/cpu_backend.h"

#define TOL 1e-4

/* ---- the golden ---- */

typedef struct {
    train_case c; /* d, ad and gf (the DPO golden) are used */
    at_dpo_pairs p;
    int32_t *ids, *labels, *lengths;
    int B, T;
} dpo_case;

static void dc_free(dpo_case *k)
{
    at_dpo_pairs_free(&k->p);
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
    /* the pairs as at_dpo_pairs_encode would hold them */
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
static void run_pairs(dpo_case *k, const at_dpo_config *cfg, const size_t *idx, size_t n, double step_pairs,
                      double step_nll, unsigned flags, at_decoder_grads *g, at_dpo_stats *s)
{
    at_batch b = {0};
    up_tensors u = {0};
    at_decoder_acts *a = NULL;
    CHECK_OK(at_dpo_batch_build(&k->p, idx, n, 0, &b));
    up(k->c.d->be, &b, &u);
    CHECK_OK(at_decoder_acts_new_ex(k->c.d, (int)b.rows, (int)b.cols, flags, &a));
    if (a && u.labels)
        CHECK_OK(at_dpo_forward_backward(cfg, &k->p, idx, n, k->c.d, a, u.ids, u.pos, u.labels, 0.0f, 0, step_pairs,
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
    CHECK_OK(at_dpo_batch_build(&k.p, idx, 2, 0, &b));
    CHECK(b.rows == (size_t)k.B && b.cols == (size_t)k.T);
    if (b.ids && b.rows == (size_t)k.B && b.cols == (size_t)k.T) {
        CHECK(!memcmp(b.ids, k.ids, (size_t)k.B * k.T * sizeof(int32_t)));
        CHECK(!memcmp(b.labels, k.labels, (size_t)k.B * k.T * sizeof(int32_t)));
    }

    /* reference: the model without the adapter */
    CHECK_OK(at_dpo_reference(k.c.d, &k.p, 2, 0));
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
        }
        at_decoder_acts_free(a);
        up_free(&u);
    }
    at_batch_free(&b);

    double nll_targets = (double)(k.p.n_c[0] + k.p.n_c[1]);
    static const struct {
        const char *name;
        double beta, ls, rpo;
        at_dpo_loss_type type;
    } cases[] = {{"sigmoid", 0.1, 0, 0, AT_DPO_SIGMOID},
                 {"rpo", 0.1, 0, 0.5, AT_DPO_SIGMOID},
                 {"ipo", 0.1, 0, 0, AT_DPO_IPO},
                 {"smooth", 0.5, 0.2, 0, AT_DPO_SIGMOID}};
    at_decoder_grads *g = NULL, *g2 = NULL;
    CHECK_OK(at_decoder_grads_new(k.c.d, 0, &g));
    CHECK_OK(at_decoder_grads_new(k.c.d, 0, &g2));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && g && g2; i++) {
        at_dpo_config cfg;
        at_dpo_config_defaults(&cfg);
        cfg.beta = cases[i].beta;
        cfg.label_smoothing = cases[i].ls;
        cfg.rpo_alpha = cases[i].rpo;
        cfg.loss_type = cases[i].type;
        CHECK_OK(at_dpo_config_check(&cfg));
        char key[64], prefix[64];
        snprintf(key, sizeof key, "%s.loss", cases[i].name);
        snprintf(prefix, sizeof prefix, "%s.lora.", cases[i].name);
        double want = tc_scalar(&k.c, key);
        /* one micro-batch of both pairs (checkpointing on for half the cases) */
        at_dpo_stats s = {0};
        CHECK_OK(at_decoder_grads_zero(g));
        run_pairs(&k, &cfg, idx, 2, 2, nll_targets, AT_ACTS_TRAIN | (i % 2 ? AT_ACTS_CHECKPOINT : 0), g, &s);
        double loss = at_dpo_stats_loss(&cfg, &s);
        printf("%s: loss %.7f, PyTorch %.7f\n", cases[i].name, loss, want);
        CHECK_NEAR(loss, want, 1e-5 * fabs(want));
        CHECK(s.pairs == 2);
        double e = tc_grads_err(&k.c, g, prefix, "LoRA grads, one micro-batch");
        CHECK_MSG(e <= TOL, "%s: LoRA gradient rel err %g", cases[i].name, e);
        /* the same step as two micro-batches of one pair (gradient accumulation) */
        at_dpo_stats s2 = {0};
        CHECK_OK(at_decoder_grads_zero(g2));
        run_pairs(&k, &cfg, &idx[0], 1, 2, nll_targets, AT_ACTS_TRAIN, g2, &s2);
        run_pairs(&k, &cfg, &idx[1], 1, 2, nll_targets, AT_ACTS_TRAIN, g2, &s2);
        CHECK_NEAR(at_dpo_stats_loss(&cfg, &s2), want, 1e-5 * fabs(want));
        e = tc_grads_err(&k.c, g2, prefix, "LoRA grads, two micro-batches");
        CHECK_MSG(e <= TOL, "%s: accumulated LoRA gradient rel err %g", cases[i].name, e);
        /* the evaluation gives the same loss without gradients */
        at_dpo_stats se;
        CHECK_OK(at_dpo_evaluate(&cfg, &k.p, k.c.d, 2, 0, &se));
        CHECK_NEAR(at_dpo_stats_loss(&cfg, &se), want, 1e-5 * fabs(want));
        CHECK_NEAR(se.reward_c, s.reward_c, 1e-9 + 1e-9 * fabs(s.reward_c));
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

static void test_pair_math(void)
{
    at_dpo_config c;
    at_dpo_config_defaults(&c);
    CHECK(c.beta == 0.1 && c.loss_type == AT_DPO_SIGMOID && c.rpo_alpha == 0 && c.label_smoothing == 0);
    const at_dpo_loss_type types[] = {AT_DPO_SIGMOID, AT_DPO_IPO, AT_DPO_HINGE};
    for (int ti = 0; ti < 3; ti++) {
        c.loss_type = types[ti];
        c.label_smoothing = ti == 0 ? 0.1 : 0;
        c.beta = 0.3;
        const double pc = -20.5, pr = -23.25, rc = -21, rr = -22;
        at_dpo_pair_loss l, lp, lm;
        at_dpo_pair(&c, pc, pr, rc, rr, &l);
        const double h = 1e-5;
        at_dpo_pair(&c, pc + h, pr, rc, rr, &lp);
        at_dpo_pair(&c, pc - h, pr, rc, rr, &lm);
        CHECK_NEAR(l.d_chosen, (lp.loss - lm.loss) / (2 * h), 1e-6);
        at_dpo_pair(&c, pc, pr + h, rc, rr, &lp);
        at_dpo_pair(&c, pc, pr - h, rc, rr, &lm);
        CHECK_NEAR(l.d_rejected, (lp.loss - lm.loss) / (2 * h), 1e-6);
        double z = 0.3 * ((pc - pr) - (rc - rr));
        if (types[ti] == AT_DPO_HINGE) CHECK_NEAR(l.loss, fmax(0, 1 - z), 1e-12);
        if (types[ti] == AT_DPO_IPO) CHECK_NEAR(l.loss, pow(z / 0.3 - 1 / 0.6, 2), 1e-12);
    }
    /* far-apart log-probs stay finite */
    c.loss_type = AT_DPO_SIGMOID;
    c.label_smoothing = 0;
    at_dpo_pair_loss l;
    at_dpo_pair(&c, -1e4, 0, 0, 0, &l);
    CHECK(isfinite(l.loss) && isfinite(l.d_chosen) && l.loss > 900);
    at_dpo_loss_type t;
    CHECK_FAILS(at_dpo_loss_type_parse("kto_pair", &t), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "sigmoid") != NULL);
    c.beta = 0;
    CHECK_FAILS(at_dpo_config_check(&c), AT_ERR_INVALID);
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
    at_dpo_pairs p = {0};
    if (ds) CHECK_OK(at_dpo_pairs_encode(&ds->train, &enc, 1, "train", &p));
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
    at_dpo_pairs_free(&p);
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
        CHECK_FAILS(at_dpo_pairs_encode(&ds->train, &enc, 1, "train", &p), AT_ERR_INVALID);
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

static pid_t spawn(char *const argv[])
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        if (!freopen("/dev/null", "w", stderr)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int run_cli(char **argv)
{
    int status = 0;
    pid_t pid = spawn(argv);
    waitpid(pid, &status, 0);
    return status;
}

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

static void test_cli(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char out_a[512], out_b[512];
    snprintf(out_a, sizeof out_a, "%s/dpo-whole", root);
    snprintf(out_b, sizeof out_b, "%s/dpo-killed", root);
    /* 4 of the real pairs, repeated: 2 pairs a step, 2 steps an epoch */
    char ds[256];
    snprintf(ds, sizeof ds, "%s#4", PAIRS);
    char *argv[64];
    int k = 0;
    char *common[] = {"rlhf", "--rlhf_type", "dpo", "--model", (char *)MODEL, "--dataset", ds, "--learning_rate",
                      "2e-3", "--logging_steps", "1", "--save_steps", "4", "--max_steps", "10",
                      "--per_device_train_batch_size", "2", "--lora_dropout", "0.1", "--rpo_alpha", "0.1",
                      "--lr_scheduler_type", "constant", "--seed", "3", "--torch_dtype", "float32"};
    argv[k++] = (char *)bin;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) argv[k++] = common[i];
    argv[k++] = "--output_dir";
    argv[k++] = out_a;
    argv[k] = NULL;
    int status = run_cli(argv);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "anytune rlhf failed (status %d)", status);
    char *run = run_dir_of(out_a);
    CHECK(run != NULL);
    if (run) {
        /* TRL's metrics on every line; the loss falls and the margin grows */
        char *p = at_path_join(run, "logging.jsonl"), *text = NULL;
        CHECK_OK(at_read_file(p, &text, NULL));
        static const char *keys[] = {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                     "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss", "grad_norm",
                                     "lr"};
        double first_loss = NAN, last_loss = NAN, first_margin = NAN, last_margin = NAN;
        int lines = 0;
        for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
            cJSON *j = cJSON_Parse(line);
            for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
                CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[i])), "logging.jsonl line %d lacks %s", lines + 1,
                          keys[i]);
            double l = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "loss"));
            double m = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "rewards/margins"));
            if (!lines) {
                first_loss = l;
                first_margin = m;
                /* the policy starts as the reference: DPO's loss is log 2, plus rpo_alpha·NLL */
                CHECK_NEAR(m, 0, 1e-9);
            }
            last_loss = l;
            last_margin = m;
            lines++;
            cJSON_Delete(j);
        }
        printf("cli: %d steps, loss %.4f -> %.4f, margin %.4f -> %.4f\n", lines, first_loss, last_loss, first_margin,
               last_margin);
        CHECK(lines == 10);
        CHECK_MSG(last_loss < first_loss - 0.1, "loss %g -> %g", first_loss, last_loss);
        CHECK_MSG(last_margin > first_margin + 0.5, "margin %g -> %g", first_margin, last_margin);
        free(text);
        free(p);
        /* PEFT checkpoints */
        char *ck = at_path_join(run, "checkpoint-8");
        CHECK_OK(at_ckpt_verify(ck));
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

    /* killed after step 6 (checkpoint-4 the last), resumed: the same log */
    argv[k - 1] = out_b;
    setenv("ANYTUNE_DEBUG_KILL_AFTER_STEP", "6", 1);
    status = run_cli(argv);
    unsetenv("ANYTUNE_DEBUG_KILL_AFTER_STEP");
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the run was not killed (status %d)", status);
    argv[k++] = "--resume_from_checkpoint";
    argv[k++] = "last";
    argv[k] = NULL;
    status = run_cli(argv);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *run_b = run_dir_of(out_b);
    if (run && run_b) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' %s/logging.jsonl > %s/a.txt && "
                 "sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' %s/logging.jsonl > %s/b.txt && "
                 "test $(wc -l < %s/a.txt) -eq 10 && cmp %s/a.txt %s/b.txt",
                 run, root, run_b, root, root, root, root);
        CHECK_MSG(system(cmd) == 0, "logging.jsonl of the resumed DPO run differs from the uninterrupted one");
    }
    free(run_b);
    free(run);

    /* usage errors */
    char *bad_type[] = {(char *)bin, "rlhf", "--rlhf_type", "kto", "--model", (char *)MODEL, "--dataset", ds, NULL};
    status = run_cli(bad_type);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    char *bad_data[] = {(char *)bin, "rlhf", "--model", (char *)MODEL, "--dataset", "tests/data/dpo/not_pairs.jsonl",
                        "--strict", "true", "--output_dir", out_a, NULL};
    status = run_cli(bad_data);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

/* The trainer API with DPO: the errors it owes. */
static void test_trainer_errors(const char *root)
{
    at_train_args a;
    at_train_result r;
    at_dpo_config c;
    at_dpo_config_defaults(&c);
    char out[512];
    snprintf(out, sizeof out, "%s/errors", root);
    at_train_args_defaults(&a);
    const char *ds[] = {"tests/data/dpo/not_pairs.jsonl"};
    a.model = MODEL;
    a.datasets = ds;
    a.n_datasets = 1;
    a.output_dir = out;
    a.strict = 1;
    a.dpo = &c;
    a.loss_last_turn_only = 1;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "not_pairs.jsonl:1") != NULL, "message: %s", at_last_error());
    a.strict = 0; /* skipped with a warning: nothing left */
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "no preference pair") != NULL);
    a.packing = 1;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_UNSUPPORTED);
    CHECK(strstr(at_last_error(), "--packing") != NULL);
}

int main(void)
{
    char root[] = "/tmp/anytune-dpo-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_pair_math();
    test_golden();
    test_row_scales();
    test_records();
    test_trainer_errors(root);
    test_cli(root);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("test_dpo");
}
