/* Reward models (train/reward.h, `anytune rlhf --rlhf_type rm`):
 *  - against PyTorch (tools/make_rm_goldens.py: transformers'
 *    ForSequenceClassification score head on the last token, TRL's
 *    RewardTrainer loss, on the golden qwen2_bias_tied model with its LoRA
 *    adapter and two pairs): each row's reward, the loss with and without
 *    center_rewards_coefficient, the gradient of the score head and of every
 *    lora_A / lora_B; the same gradients from two micro-batches of one pair;
 *  - one pair's loss and derivatives against finite differences;
 *  - the CLI end to end on the demo model and real LLaMA-Factory pairs:
 *    accuracy, margin and mean_reward on every line, the loss falls,
 *    checkpoints hold score.safetensors, and a resumed run continues from it;
 *    `export --merge_lora --to hf` writes a LlamaForSequenceClassification
 *    folder (one label) with the head as score.weight and no lm_head; GGUF is
 *    refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "model/safetensors.h"
#include "train/objective.h"
#include "train/reward.h"
#include "train/run_files.h"
#include "train_goldens.h"
#include "device/cpu/cpu_backend.h"

#define TOL 1e-4

static void test_pair(void)
{
    printf("one pair's loss against finite differences\n");
    const double rs[] = {-30, -2, -0.3, 0, 0.4, 3, 25}, coefs[] = {0, 0.01, 0.5};
    for (size_t i = 0; i < 7; i++)
        for (size_t j = 0; j < 7; j++)
            for (size_t k = 0; k < 3; k++) {
                double l, dc, dr, lp, lm, x, y, h = 1e-6;
                at_rm_pair(coefs[k], rs[i], rs[j], &l, &dc, &dr);
                double s = rs[i] + rs[j];
                CHECK_NEAR(l, log1p(exp(-(rs[i] - rs[j]))) + coefs[k] * s * s, 1e-9 * (1 + fabs(l)));
                at_rm_pair(coefs[k], rs[i] + h, rs[j], &lp, &x, &y);
                at_rm_pair(coefs[k], rs[i] - h, rs[j], &lm, &x, &y);
                CHECK_NEAR(dc, (lp - lm) / (2 * h), 1e-5 * (1 + fabs(dc)));
                at_rm_pair(coefs[k], rs[i], rs[j] + h, &lp, &x, &y);
                at_rm_pair(coefs[k], rs[i], rs[j] - h, &lm, &x, &y);
                CHECK_NEAR(dr, (lp - lm) / (2 * h), 1e-5 * (1 + fabs(dr)));
            }
}

static void run(train_case *c, const at_pref_config *cfg, const int32_t *ids, const int32_t *lengths, int T, int r0,
                int rows, double step_pairs, const at_tensor *score, at_tensor *score_grad, at_decoder_grads *g,
                double *rewards, at_rm_stats *s, unsigned flags)
{
    at_batch b = {0};
    b.rows = (size_t)rows;
    b.cols = (size_t)T;
    b.ids = (int32_t *)ids + (size_t)r0 * T;
    int32_t *pos = malloc((size_t)rows * T * sizeof *pos);
    int32_t *lab = malloc((size_t)rows * T * sizeof *lab);
    for (int i = 0; pos && lab && i < rows * T; i++) {
        pos[i] = i % T;
        lab[i] = -100;
    }
    b.positions = pos;
    b.labels = lab;
    at_batch_tensors t = {0};
    at_decoder_acts *a = NULL;
    at_fwd_opts fwd = {0};
    CHECK_OK(at_batch_tensors_upload(c->d->be, &b, 0, &t));
    CHECK_OK(at_decoder_acts_new_ex(c->d, rows, T, flags, &a));
    if (a && t.ids)
        CHECK_OK(at_rm_forward_backward(cfg, (size_t)rows / 2, c->d, a, t.ids, t.pos, lengths + r0, &fwd, score,
                                        score_grad, step_pairs, 1.0, g, rewards, s));
    at_decoder_acts_free(a);
    at_batch_tensors_free(&t);
    free(pos);
    free(lab);
}

static void test_golden(void)
{
    printf("reward model against PyTorch (qwen2_bias_tied + LoRA + score head, 2 pairs)\n");
    train_case c;
    memset(&c, 0, sizeof c);
    at_load_options o = at_load_options_default();
    o.backend = at_cpu_backend();
    o.dtype = AT_F32;
    CHECK_OK(at_decoder_load(GOLDEN_DIR "/qwen2_bias_tied", &o, &c.d));
    CHECK_OK(at_adapter_load(GOLDEN_DIR "/qwen2_bias_tied_lora", &c.d->cfg, c.d->be, &c.ad));
    CHECK_OK(at_st_open(GOLDEN_DIR "/qwen2_bias_tied.rm.golden.safetensors", &c.gf));
    if (!c.d || !c.ad || !c.gf) return;
    CHECK_OK(at_decoder_set_adapter(c.d, c.ad));
    int32_t *ids = NULL, *lengths = NULL;
    float *w = NULL, *want_r = NULL;
    int64_t shape[4] = {0};
    int nd = 0;
    CHECK_OK(golden_array(c.gf, "input_ids", AT_I32, (void **)&ids, shape, &nd));
    int B = (int)shape[0], T = (int)shape[1];
    CHECK_OK(golden_array(c.gf, "lengths", AT_I32, (void **)&lengths, NULL, NULL));
    CHECK_OK(golden_array(c.gf, "score.weight", AT_F32, (void **)&w, NULL, NULL));
    CHECK_OK(golden_array(c.gf, "rewards", AT_F32, (void **)&want_r, NULL, NULL));
    int64_t hs[2] = {1, c.d->cfg.hidden_size};
    at_tensor *score = NULL, *sg = NULL, *sg2 = NULL;
    CHECK_OK(at_tensor_zeros(c.d->be, AT_F32, 2, hs, "score.weight", &score));
    CHECK_OK(at_tensor_zeros(c.d->be, AT_F32, 2, hs, "score.weight", &sg));
    CHECK_OK(at_tensor_zeros(c.d->be, AT_F32, 2, hs, "score.weight", &sg2));
    if (score && w) CHECK_OK(at_tensor_upload(score, w, (size_t)hs[1] * sizeof *w));
    at_decoder_grads *g = NULL, *g2 = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g2));
    static const struct {
        const char *name;
        double coef;
    } cases[] = {{"bt", 0}, {"center", 0.5}};
    for (size_t i = 0; i < 2 && g && g2 && sg && ids && lengths && want_r && B == 4; i++) {
        at_pref_config cfg;
        CHECK_OK(at_pref_config_init(&cfg, "rm"));
        cfg.center_rewards_coefficient = cases[i].coef;
        CHECK_OK(at_pref_config_check(&cfg));
        char key[64], prefix[64];
        snprintf(key, sizeof key, "%s.loss", cases[i].name);
        double want = tc_scalar(&c, key);
        snprintf(prefix, sizeof prefix, "%s.lora.", cases[i].name);
        CHECK_OK(at_decoder_grads_zero(g));
        CHECK_OK(at_fill(sg, 0.0f));
        double r[4] = {0};
        at_rm_stats s = {0};
        run(&c, &cfg, ids, lengths, T, 0, 4, 2, score, sg, g, r, &s, AT_ACTS_TRAIN | (i ? AT_ACTS_CHECKPOINT : 0));
        for (int b = 0; b < 4; b++) CHECK_NEAR(r[b], want_r[b], 1e-5 * (1 + fabs(want_r[b])));
        double loss = at_rm_stats_loss(&s);
        printf("%-7s loss %.7f, PyTorch %.7f; rewards %.5f %.5f %.5f %.5f\n", cases[i].name, loss, want, r[0], r[1],
               r[2], r[3]);
        CHECK_NEAR(loss, want, 1e-5 * fabs(want));
        CHECK(s.pairs == 2 && s.correct == (double)(r[0] > r[1]) + (double)(r[2] > r[3]));
        double e = tc_grads_err(&c, g, prefix, "LoRA grads");
        CHECK_MSG(e <= TOL, "%s: LoRA gradient rel err %g", cases[i].name, e);
        snprintf(prefix, sizeof prefix, "%s.", cases[i].name);
        e = tc_rel_err(&c, prefix, sg);
        printf("  score head gradient rel err %.2e\n", e);
        CHECK_MSG(e >= 0 && e <= TOL, "%s: score gradient rel err %g", cases[i].name, e);
        /* two micro-batches of one pair each: the same step */
        CHECK_OK(at_decoder_grads_zero(g2));
        CHECK_OK(at_fill(sg2, 0.0f));
        at_rm_stats s2 = {0};
        run(&c, &cfg, ids, lengths, T, 0, 2, 2, score, sg2, g2, NULL, &s2, AT_ACTS_TRAIN);
        run(&c, &cfg, ids, lengths, T, 2, 2, 2, score, sg2, g2, NULL, &s2, AT_ACTS_TRAIN);
        CHECK_NEAR(at_rm_stats_loss(&s2), want, 1e-5 * fabs(want));
        snprintf(prefix, sizeof prefix, "%s.lora.", cases[i].name);
        e = tc_grads_err(&c, g2, prefix, "LoRA grads, 2 micro-batches");
        CHECK(e <= TOL);
        snprintf(prefix, sizeof prefix, "%s.", cases[i].name);
        CHECK(tc_rel_err(&c, prefix, sg2) <= TOL);
        /* without gradients: the same loss */
        at_rm_stats se = {0};
        run(&c, &cfg, ids, lengths, T, 0, 4, 1, score, NULL, NULL, NULL, &se, AT_ACTS_LOSS);
        CHECK_NEAR(at_rm_stats_loss(&se), want, 1e-5 * fabs(want));
    }
    at_decoder_grads_free(g);
    at_decoder_grads_free(g2);
    at_tensor_free(score);
    at_tensor_free(sg);
    at_tensor_free(sg2);
    free(ids);
    free(lengths);
    free(w);
    free(want_r);
    tc_free(&c);
}

/* The lines of RUN/logging.jsonl (caller frees with cJSON_Delete). */
static cJSON *read_log(const char *run)
{
    char *p = at_path_join(run, "logging.jsonl"), *text = NULL;
    cJSON *arr = cJSON_CreateArray();
    CHECK_OK(at_read_file(p, &text, NULL));
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"))
        cJSON_AddItemToArray(arr, cJSON_Parse(line));
    free(text);
    free(p);
    return arr;
}

static void test_cli(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    printf("cli: anytune rlhf --rlhf_type rm\n");
    char err[512], whole[512], killed[512];
    snprintf(err, sizeof err, "%s/stderr.txt", root);
    snprintf(whole, sizeof whole, "%s/whole", root);
    snprintf(killed, sizeof killed, "%s/killed", root);
    /* 8 real pairs, 2 a step: 8 steps are 2 epochs */
    char *argv[] = {(char *)bin, "rlhf", "--rlhf_type", "rm", "--model", "demo/stories260K", "--dataset",
                    "tests/data/dpo/dpo_en_demo_8.json", "--learning_rate", "2e-3", "--logging_steps", "1",
                    "--save_steps", "2", "--max_steps", "8", "--per_device_train_batch_size", "2", "--lora_dropout",
                    "0", "--lr_scheduler_type", "constant", "--seed", "3", "--torch_dtype", "float32",
                    "--gradient_checkpointing", "false", "--max_length", "128", "--truncation_strategy", "right",
                    "--center_rewards_coefficient", "0.01", "--add_version", "false", "--output_dir", whole, NULL};
    int status = at_test_run(argv, err);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "anytune rlhf --rlhf_type rm failed (status %d)", status);
    cJSON *a = read_log(whole);
    int n = cJSON_GetArraySize(a);
    CHECK(n == 8);
    double first = 0, last = 0, acc_first = 0, acc_last = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *j = cJSON_GetArrayItem(a, i);
        static const char *const keys[] = {"loss", "accuracy", "margin", "mean_reward", "grad_norm"};
        for (size_t k = 0; k < 5; k++)
            CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[k])), "line %d lacks %s", i + 1, keys[k]);
        double l = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "loss"));
        double ac = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "accuracy"));
        if (i < 4) first += l / 4, acc_first += ac / 4;
        else last += l / 4, acc_last += ac / 4;
    }
    printf("  loss %.4f -> %.4f, accuracy %.3f -> %.3f (epoch means)\n", first, last, acc_first, acc_last);
    CHECK_MSG(last < first - 0.05, "loss %g -> %g", first, last);
    CHECK_MSG(acc_last > acc_first, "accuracy %g -> %g", acc_first, acc_last);
    char p[1024];
    snprintf(p, sizeof p, "%s/checkpoint-8/score.safetensors", whole);
    CHECK_MSG(access(p, R_OK) == 0, "%s missing", p);
    /* exported merged: a Hugging Face sequence-classification folder with the head as score.weight */
    char ck[600], ex[600], gg[600];
    snprintf(ck, sizeof ck, "%s/checkpoint-8", whole);
    snprintf(ex, sizeof ex, "%s/exported", root);
    snprintf(gg, sizeof gg, "%s/exported-gguf", root);
    char *exp[] = {(char *)bin, "export", "--model", "demo/stories260K", "--adapters", ck, "--merge_lora", "true",
                   "--to", "hf", "--output_dir", ex, NULL};
    status = at_test_run(exp, err);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "export of the reward model failed (status %d)", status);
    snprintf(p, sizeof p, "%s/config.json", ex);
    cJSON *cfg = NULL;
    CHECK_OK(at_json_parse_file(p, &cfg));
    if (cfg) {
        const char *arch = cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(cfg, "architectures"), 0));
        CHECK_MSG(arch && !strcmp(arch, "LlamaForSequenceClassification"), "architectures: %s", arch ? arch : "?");
        const char *l0 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "id2label"), "0"));
        CHECK(l0 && !strcmp(l0, "LABEL_0"));
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(cfg, "id2label")) == 1); /* num_labels 1 */
    }
    cJSON_Delete(cfg);
    {
        at_st_model *m = NULL, *sm = NULL;
        at_tensor *got = NULL, *want = NULL;
        snprintf(p, sizeof p, "%s/model.safetensors", ex);
        CHECK_OK(at_st_model_open(p, &m));
        snprintf(p, sizeof p, "%s/score.safetensors", ck);
        CHECK_OK(at_st_model_open(p, &sm));
        if (m && sm) {
            CHECK_OK(at_st_get(sm, "score.weight", 0, NULL, AT_F32, &want));
            if (want) CHECK_OK(at_st_get(m, "score.weight", 2, want->shape, AT_F32, &got));
            CHECK(at_st_find(at_st_model_shard(m, 0), "lm_head.weight") == NULL);
        }
        if (got && want) {
            const float *x = at_tensor_data(got), *y = at_tensor_data(want);
            double worst = 0;
            for (int64_t i = 0; i < at_tensor_numel(want); i++) {
                double e = fabs((double)x[i] - (double)y[i]) / (fabs((double)y[i]) + 1e-30);
                if (e > worst) worst = e;
            }
            printf("  exported score.weight: worst rel err %.2e against the checkpoint's\n", worst);
            CHECK(worst <= 1.0 / 256); /* the export's dtype may be bf16 (8 significant bits) */
        }
        at_tensor_free(got);
        at_tensor_free(want);
        at_st_model_close(m);
        at_st_model_close(sm);
    }
    char *exg[] = {(char *)bin, "export", "--model", "demo/stories260K", "--adapters", ck, "--merge_lora", "true",
                   "--to", "gguf", "--output_dir", gg, NULL};
    status = at_test_run(exg, err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    CHECK(at_test_file_has(err, "sequence-classification"));
    /* the evaluation: every pair's loss, no gradients */
    char ev_out[600];
    snprintf(ev_out, sizeof ev_out, "%s/eval", root);
    char *evargs[] = {(char *)bin, "rlhf", "--rlhf_type", "rm", "--model", "demo/stories260K", "--dataset",
                      "tests/data/dpo/dpo_en_demo_8.json#2", "--val_dataset", "tests/data/dpo/dpo_en_demo_8.json#2",
                      "--max_steps", "1", "--per_device_train_batch_size", "2", "--max_length", "128",
                      "--truncation_strategy", "right", "--add_version", "false", "--output_dir", ev_out, NULL};
    status = at_test_run(evargs, err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cJSON *el = read_log(ev_out);
    double eval_loss = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(el, 0), "eval_loss"));
    printf("  eval_loss %.4f\n", eval_loss);
    CHECK_MSG(eval_loss > 0 && eval_loss < 5, "eval_loss %g", eval_loss); /* −log σ of small rewards: near log 2 */
    cJSON_Delete(el);
    /* killed after step 5, resumed from checkpoint-4 (the score head comes back from it): the same log */
    argv[sizeof argv / sizeof argv[0] - 2] = killed;
    setenv("ANYTUNE_DEBUG_KILL_AFTER_STEP", "5", 1);
    status = at_test_run(argv, err);
    unsetenv("ANYTUNE_DEBUG_KILL_AFTER_STEP");
    CHECK(WIFSIGNALED(status));
    char *resume[sizeof argv / sizeof argv[0] + 2];
    size_t k = 0;
    for (; argv[k]; k++) resume[k] = argv[k];
    resume[k++] = "--resume_from_checkpoint";
    resume[k++] = "last";
    resume[k] = NULL;
    status = at_test_run(resume, err);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "resume failed (status %d)", status);
    cJSON *b = read_log(killed);
    CHECK(cJSON_GetArraySize(b) == n);
    for (int i = 0; i < n && i < cJSON_GetArraySize(b); i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i), *y = cJSON_GetArrayItem(b, i);
        static const char *const keys[] = {"loss", "accuracy", "margin", "mean_reward", "grad_norm"};
        for (size_t q = 0; q < 5; q++) {
            double u = cJSON_GetNumberValue(cJSON_GetObjectItem(x, keys[q]));
            double v = cJSON_GetNumberValue(cJSON_GetObjectItem(y, keys[q]));
            CHECK_MSG(u == v, "step %d: %s %.17g uninterrupted, %.17g resumed", i + 1, keys[q], u, v);
        }
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

int main(void)
{
    char root[] = "/tmp/anytune-rm-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_pair();
    test_golden();
    test_cli(root);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("test_rm");
}
