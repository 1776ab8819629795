/* KTO (train/kto.h, `anytune rlhf --rlhf_type kto`):
 *  - against PyTorch (tools/make_kto_goldens.py, written from TRL's
 *    KTOTrainer on the golden qwen2_bias_tied model with its LoRA adapter,
 *    four examples, two desirable): the KL rows built as TRL's get_kl_dataset
 *    builds them, the reference and policy log-probs, the loss, the KL
 *    estimate and the gradient of every lora_A / lora_B (β 0.1 and 0.5,
 *    weighted, and a reference under which kl > 0); the same gradients when
 *    the examples run as two micro-batches is NOT expected (kl is each
 *    forward's, as TRL's), so the accumulation check uses a step of one
 *    micro-batch; the evaluation's loss equals the training forward's;
 *  - one example's loss and derivative against finite differences;
 *  - the option checks;
 *  - the CLI end to end on the demo model and real LLaMA-Factory KTO records
 *    (and LLaMA-Factory's kto_tag column): a reference pass, TRL's fields on
 *    every logging.jsonl line, the loss falls and the margin grows on a
 *    repeated tiny set; a record without a label and a batch of one are
 *    refused saying why. */
#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "train/run_files.h"
#include <stdlib.h>
#include <string.h>
#include "model/safetensors.h"
#include "train/kto.h"
#include "train/objective.h"
#include "train_goldens.h"
#include "device/cpu/cpu_backend.h"

#define TOL 1e-4

typedef struct {
    train_case c;
    at_kto_examples k;
    int32_t *ids, *labels, *lengths, *desirable;
    int B, T;
} kto_case;

static void kc_free(kto_case *k)
{
    at_kto_examples_free(&k->k);
    free(k->ids);
    free(k->labels);
    free(k->lengths);
    free(k->desirable);
    tc_free(&k->c);
}

static at_encoded copy_row(const kto_case *k, int r)
{
    at_encoded e = {0};
    size_t L = (size_t)k->lengths[r];
    e.ids = malloc(L * sizeof *e.ids);
    e.labels = malloc(L * sizeof *e.labels);
    if (e.ids && e.labels) {
        memcpy(e.ids, k->ids + (size_t)r * k->T, L * sizeof *e.ids);
        memcpy(e.labels, k->labels + (size_t)r * k->T, L * sizeof *e.labels);
        e.n = L;
    }
    return e;
}

/* The examples (the golden's even rows) as at_kto_encode holds them, with
 * the KL rows built by at_kto_kl_rows (not copied from the golden). */
static at_status kc_open(kto_case *k)
{
    at_status st = AT_OK;
    memset(k, 0, sizeof *k);
    at_load_options o = at_load_options_default();
    o.backend = at_cpu_backend();
    o.dtype = AT_F32;
    AT_CHECK(at_decoder_load(GOLDEN_DIR "/qwen2_bias_tied", &o, &k->c.d));
    AT_CHECK(at_adapter_load(GOLDEN_DIR "/qwen2_bias_tied_lora", &k->c.d->cfg, k->c.d->be, &k->c.ad));
    AT_CHECK(at_st_open(GOLDEN_DIR "/qwen2_bias_tied.kto.golden.safetensors", &k->c.gf));
    int64_t shape[4] = {0};
    int nd = 0;
    AT_CHECK(golden_array(k->c.gf, "input_ids", AT_I32, (void **)&k->ids, shape, &nd));
    k->B = (int)shape[0];
    k->T = (int)shape[1];
    AT_CHECK(golden_array(k->c.gf, "labels", AT_I32, (void **)&k->labels, NULL, NULL));
    AT_CHECK(golden_array(k->c.gf, "lengths", AT_I32, (void **)&k->lengths, NULL, NULL));
    AT_CHECK(golden_array(k->c.gf, "desirable", AT_I32, (void **)&k->desirable, NULL, NULL));
    size_t n = (size_t)k->B / 2;
    at_pref_pairs *p = &k->k.ex;
    p->chosen = calloc(n, sizeof *p->chosen);
    p->rejected = calloc(n, sizeof *p->rejected);
    p->len = calloc(n, sizeof *p->len);
    p->n_c = calloc(n, sizeof *p->n_c);
    p->n_r = calloc(n, sizeof *p->n_r);
    p->ref_c = calloc(n, sizeof *p->ref_c);
    p->ref_r = calloc(n, sizeof *p->ref_r);
    k->k.desirable = calloc(n, sizeof *k->k.desirable);
    if (!p->chosen || !p->rejected || !p->len || !p->n_c || !p->n_r || !p->ref_c || !p->ref_r || !k->k.desirable) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    p->n = n;
    for (size_t i = 0; i < n; i++) {
        p->chosen[i] = copy_row(k, 2 * (int)i);
        if (!p->chosen[i].ids) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t t = 1; t < p->chosen[i].n; t++) p->n_c[i] += p->chosen[i].labels[t] >= 0;
        k->k.desirable[i] = k->desirable[i];
    }
    AT_CHECK(at_kto_kl_rows(&k->k, n, 0));
done:
    if (st != AT_OK) kc_free(k);
    return st;
}

static void run_examples(kto_case *k, const at_pref_config *cfg, const size_t *idx, size_t n, double step_examples,
                         unsigned flags, at_decoder_grads *g, at_kto_stats *s)
{
    at_batch b = {0};
    at_batch_tensors t = {0};
    at_decoder_acts *a = NULL;
    at_fwd_opts fwd = {0};
    CHECK_OK(at_pref_batch_build(&k->k.ex, idx, n, 0, &b));
    CHECK_OK(at_batch_tensors_upload(k->c.d->be, &b, 0, &t));
    CHECK_OK(at_decoder_acts_new_ex(k->c.d, (int)b.rows, (int)b.cols, flags, &a));
    if (a && t.labels)
        CHECK_OK(at_kto_forward_backward(cfg, &k->k, idx, n, k->c.d, a, t.ids, t.pos, t.labels, &fwd, step_examples,
                                         1.0, g, s));
    at_decoder_acts_free(a);
    at_batch_tensors_free(&t);
    at_batch_free(&b);
}

static void test_golden(void)
{
    kto_case k;
    printf("KTO against PyTorch (qwen2_bias_tied + LoRA, 4 examples)\n");
    CHECK_OK(kc_open(&k));
    if (!k.c.d) return;
    float *want_ref = NULL, *want_pol = NULL;
    CHECK_OK(golden_array(k.c.gf, "ref_logps", AT_F32, (void **)&want_ref, NULL, NULL));
    CHECK_OK(golden_array(k.c.gf, "policy_logps", AT_F32, (void **)&want_pol, NULL, NULL));
    size_t n = (size_t)k.B / 2, idx[4] = {0, 1, 2, 3};
    CHECK(n == 4);
    /* the KL rows and the layout are TRL's (the golden's odd rows) */
    at_batch b = {0};
    CHECK_OK(at_pref_batch_build(&k.k.ex, idx, n, 0, &b));
    CHECK(b.rows == (size_t)k.B && b.cols == (size_t)k.T);
    if (b.ids && b.rows == (size_t)k.B && b.cols == (size_t)k.T) {
        CHECK_MSG(!memcmp(b.ids, k.ids, (size_t)k.B * k.T * sizeof(int32_t)), "KL rows' ids differ from TRL's");
        CHECK_MSG(!memcmp(b.labels, k.labels, (size_t)k.B * k.T * sizeof(int32_t)), "KL rows' labels differ");
    }
    at_batch_free(&b);
    /* reference: the model without the adapter, example rows and KL rows */
    CHECK_OK(at_pref_reference(k.c.d, &k.k.ex, 2, 0));
    for (int r = 0; r < k.B && want_ref; r++) {
        double got = r % 2 ? k.k.ex.ref_r[r / 2] : k.k.ex.ref_c[r / 2];
        CHECK_NEAR(got, want_ref[r], 1e-5 * fabs(want_ref[r]));
    }
    CHECK_OK(at_decoder_set_adapter(k.c.d, k.c.ad));
    static const struct {
        const char *name;
        double beta, wd, wu;
    } cases[] = {{"kto", 0.1, 1.0, 1.0}, {"weighted", 0.5, 1.0, 1.33}, {"shift", 0.5, 0.7, 1.2}};
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(k.c.d, 0, &g));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && g; i++) {
        at_pref_config cfg;
        CHECK_OK(at_pref_config_init(&cfg, "kto"));
        cfg.beta = cases[i].beta;
        cfg.desirable_weight = cases[i].wd;
        cfg.undesirable_weight = cases[i].wu;
        CHECK_OK(at_pref_config_check(&cfg));
        char key[64], prefix[64];
        float *ref = NULL;
        snprintf(key, sizeof key, "%s.ref_logps", cases[i].name);
        CHECK_OK(golden_array(k.c.gf, key, AT_F32, (void **)&ref, NULL, NULL));
        for (size_t e = 0; ref && e < n; e++) {
            k.k.ex.ref_c[e] = ref[2 * e];
            k.k.ex.ref_r[e] = ref[2 * e + 1];
        }
        free(ref);
        snprintf(key, sizeof key, "%s.loss", cases[i].name);
        double want = tc_scalar(&k.c, key);
        snprintf(key, sizeof key, "%s.kl", cases[i].name);
        double want_kl = tc_scalar(&k.c, key);
        snprintf(prefix, sizeof prefix, "%s.lora.", cases[i].name);
        at_kto_stats s = {0};
        CHECK_OK(at_decoder_grads_zero(g));
        run_examples(&k, &cfg, idx, n, (double)n, AT_ACTS_TRAIN | (i % 2 ? AT_ACTS_CHECKPOINT : 0), g, &s);
        double loss = at_kto_stats_loss(&s);
        printf("%-9s loss %.7f, PyTorch %.7f; kl %.6f, PyTorch %.6f\n", cases[i].name, loss, want, s.kl, want_kl);
        CHECK_NEAR(loss, want, 1e-5 * fabs(want));
        CHECK_NEAR(s.kl, want_kl, 1e-5 + 1e-5 * fabs(want_kl));
        CHECK(s.examples == 4 && s.n_des == 2 && s.n_und == 2 && s.kl_forwards == 1);
        double e = tc_grads_err(&k.c, g, prefix, "LoRA grads");
        CHECK_MSG(e <= TOL, "%s: LoRA gradient rel err %g", cases[i].name, e);
        /* TRL's metrics: rewards are β·(π − r) of each kind */
        double rc = 0, rr = 0;
        for (size_t x = 0; want_pol && x < n; x++) {
            double z = want_pol[2 * x] - k.k.ex.ref_c[x];
            *(k.k.desirable[x] ? &rc : &rr) += cfg.beta * z;
        }
        CHECK_NEAR(s.reward_c, rc, 1e-5 + 1e-5 * fabs(rc));
        CHECK_NEAR(s.reward_r, rr, 1e-5 + 1e-5 * fabs(rr));
        /* the same forward without gradients (evaluation) gives the same loss */
        at_kto_stats se = {0};
        run_examples(&k, &cfg, idx, n, 1, AT_ACTS_LOSS, NULL, &se);
        CHECK_NEAR(at_kto_stats_loss(&se), want, 1e-5 * fabs(want));
    }
    at_decoder_grads_free(g);
    free(want_ref);
    free(want_pol);
    kc_free(&k);
}

static void test_example_loss(void)
{
    printf("one example's loss against finite differences\n");
    at_pref_config c;
    CHECK_OK(at_pref_config_init(&c, "kto"));
    c.beta = 0.3;
    c.desirable_weight = 1.5;
    c.undesirable_weight = 0.6;
    const double zs[] = {-40, -3, -0.2, 0, 0.7, 5, 60}, kls[] = {0, 0.4, 2};
    for (int des = 0; des < 2; des++)
        for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++)
            for (size_t j = 0; j < sizeof kls / sizeof kls[0]; j++) {
                double l, d, lp, dp, lm, dm, h = 1e-5;
                at_kto_example(&c, des, zs[i], kls[j], &l, &d);
                at_kto_example(&c, des, zs[i] + h, kls[j], &lp, &dp);
                at_kto_example(&c, des, zs[i] - h, kls[j], &lm, &dm);
                double w = des ? c.desirable_weight : c.undesirable_weight;
                double u = des ? c.beta * (zs[i] - kls[j]) : c.beta * (kls[j] - zs[i]);
                CHECK_NEAR(l, w * (1 - 1 / (1 + exp(-u))), 1e-12);
                CHECK_NEAR(d, (lp - lm) / (2 * h), 1e-7);
                CHECK(des ? d <= 0 : d >= 0); /* desirable: a higher log-ratio lowers the loss */
            }
}

static void test_options(void)
{
    printf("options\n");
    at_pref_config c;
    CHECK_OK(at_pref_config_init(&c, "kto"));
    CHECK(c.beta == 0.1 && c.desirable_weight == 1 && c.undesirable_weight == 1 && at_pref_needs_reference(&c));
    CHECK_OK(at_pref_config_check(&c));
    c.undesirable_weight = -1;
    CHECK_FAILS(at_pref_config_check(&c), AT_ERR_INVALID);
    c.undesirable_weight = 1;
    c.loss_type = AT_PREF_IPO;
    CHECK_FAILS(at_pref_config_check(&c), AT_ERR_INVALID);
    CHECK_OK(at_pref_config_init(&c, "dpo"));
    c.desirable_weight = 2;
    CHECK_FAILS(at_pref_config_check(&c), AT_ERR_INVALID); /* kto's option */
}

static void test_cli(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    printf("cli: anytune rlhf --rlhf_type kto\n");
    char err[512], out[512], run[700];
    snprintf(err, sizeof err, "%s/stderr.txt", root);
    snprintf(out, sizeof out, "%s/kto", root);
    /* 8 real examples (4 desirable), 4 a step: 6 steps see each one 3 times */
    char *argv[] = {(char *)bin, "rlhf", "--rlhf_type", "kto", "--model", "demo/stories260K", "--dataset",
                    "tests/data/kto/kto_en_demo_8.json", "--learning_rate", "2e-3", "--logging_steps", "1",
                    "--save_steps", "100", "--max_steps", "6", "--per_device_train_batch_size", "4", "--lora_dropout",
                    "0", "--lr_scheduler_type", "constant", "--seed", "3", "--torch_dtype", "float32",
                    "--gradient_checkpointing", "false", "--max_length", "128", "--truncation_strategy", "right",
                    "--add_version", "false", "--output_dir", out, NULL};
    int status = at_test_run(argv, err);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "anytune rlhf --rlhf_type kto failed (status %d)", status);
    CHECK(at_test_file_has(err, "8 KTO examples encoded, 4 desirable and 4 undesirable"));
    CHECK(at_test_file_has(err, "reference log-probs")); /* KTO compares with the reference, as DPO */
    snprintf(run, sizeof run, "%s/logging.jsonl", out);
    char *text = NULL;
    CHECK_OK(at_read_file(run, &text, NULL));
    static const char *const keys[] = {"loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins",
                                       "logps/chosen", "logps/rejected", "grad_norm"};
    int lines = 0;
    double first_loss = NAN, last_losses = 0, first_margin = NAN, last_margin = NAN;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[i])), "logging.jsonl line %d lacks %s", lines + 1,
                      keys[i]);
        double l = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "loss"));
        double m = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "rewards/margins"));
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "kl")) >= 0);
        if (!lines) {
            first_loss = l;
            first_margin = m;
        }
        if (lines >= 4) last_losses += l / 2; /* the last epoch's two steps (each sees half the set) */
        last_margin = m;
        lines++;
        cJSON_Delete(j);
    }
    free(text);
    printf("  %d steps, loss %.4f -> %.4f (last epoch), margin %.4f -> %.4f\n", lines, first_loss, last_losses,
           first_margin, last_margin);
    CHECK(lines == 6);
    /* the first step starts at the reference: z = 0, kl = 0, L = 1 − σ(0) = 0.5 for every example */
    CHECK_NEAR(first_loss, 0.5, 1e-6);
    CHECK_MSG(last_losses < 0.8 * first_loss, "loss %g -> %g", first_loss, last_losses);
    CHECK_MSG(last_margin > first_margin + 1, "margin %g -> %g", first_margin, last_margin);
    snprintf(run, sizeof run, "%s/args.json", out);
    cJSON *args = NULL;
    CHECK_OK(at_json_parse_file(run, &args));
    if (args) {
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(args, "rlhf_type")), "kto"));
        CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(args, "beta")), 0.1, 1e-12);
        CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(args, "desirable_weight")), 1.0, 1e-12);
    }
    cJSON_Delete(args);

    /* LLaMA-Factory's kto_tag column */
    snprintf(out, sizeof out, "%s/kto_tag", root);
    char *tag[] = {(char *)bin, "rlhf", "--rlhf_type", "kto", "--model", "demo/stories260K", "--dataset",
                   "tests/data/kto/kto_tag.jsonl", "--per_device_train_batch_size", "2", "--max_steps", "1",
                   "--val_dataset", "tests/data/kto/kto_tag.jsonl", "--add_version", "false", "--output_dir", out,
                   NULL};
    status = at_test_run(tag, err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(at_test_file_has(err, "2 KTO examples encoded, 1 desirable and 1 undesirable"));
    /* the evaluation (the same two examples): a KTO loss, each term in [0, weight] */
    snprintf(run, sizeof run, "%s/logging.jsonl", out);
    text = NULL;
    CHECK_OK(at_read_file(run, &text, NULL));
    const char *ev = text ? strstr(text, "\"eval_loss\":") : NULL;
    double el = ev ? strtod(ev + 12, NULL) : NAN;
    printf("  kto_tag: eval_loss %.4f\n", el);
    CHECK_MSG(el > 0 && el < 1, "eval_loss %g", el);
    free(text);
    /* refused, saying why */
    char *nolabel[] = {(char *)bin, "rlhf", "--rlhf_type", "kto", "--model", "demo/stories260K", "--dataset",
                       "tests/data/kto/no_label.jsonl", "--strict", "true", "--per_device_train_batch_size", "2",
                       "--output_dir", out, NULL};
    status = at_test_run(nolabel, err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    CHECK(at_test_file_has(err, "no_label.jsonl:2: not a KTO example"));
    char *one[] = {(char *)bin, "rlhf", "--rlhf_type", "kto", "--model", "demo/stories260K", "--dataset",
                   "tests/data/kto/kto_tag.jsonl", "--per_device_train_batch_size", "1", "--output_dir", out, NULL};
    status = at_test_run(one, err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    CHECK(at_test_file_has(err, "--per_device_train_batch_size must be at least 2"));
}

int main(void)
{
    char root[] = "/tmp/anytune-kto-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_example_loss();
    test_options();
    test_golden();
    test_cli(root);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("test_kto");
}
