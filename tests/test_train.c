/* The trainer end to end on the bundled demo model (stories260K) and data:
 *  - gradient accumulation: 4 micro-batches of 1 equal one batch of 4;
 *  - a run killed with SIGKILL between checkpoints and resumed logs exactly
 *    what an uninterrupted run logs;
 *  - checkpoints hold PEFT files and a verifiable manifest;
 *  - full fine-tuning runs and lowers the loss;
 *  - bad input fails with a clear message;
 *  - on the CUDA backend (under the emulator, and on a real GPU when there is
 *    one), LoRA, full fine-tuning and QLoRA log what the CPU logs, and --tf32
 *    takes effect there. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "device/cpu/cpu_backend.h"
#include "device/registry.h"
#include "infer/bundle.h"
#include "model/loader.h"
#include "model/adapter.h"
#include "model/safetensors.h"
#include "train/run_files.h"
#include "train/trainer.h"
#include "testing.h"

static const char *MODEL = "demo/stories260K";
static const char *DATA = "demo/identity.json#24";

static void base_args(at_train_args *a, const char *out)
{
    at_test_train_args(a, MODEL, DATA, out);
    a->lora_dropout = 0;
}

/* The "loss" values of a logging.jsonl, in order. */
static int read_losses(const char *run_dir, double *loss, double *gnorm, int cap)
{
    char *p = at_path_join(run_dir, "logging.jsonl");
    char *text = NULL;
    int n = 0;
    if (at_read_file(p, &text, NULL) == AT_OK) {
        for (char *line = strtok(text, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *l = cJSON_GetObjectItem(j, "loss"), *g = cJSON_GetObjectItem(j, "grad_norm");
            if (l && g) {
                loss[n] = l->valuedouble;
                gnorm[n] = g->valuedouble;
                n++;
            }
            cJSON_Delete(j);
        }
    }
    free(text);
    free(p);
    return n;
}

/* The logs of two runs (the test run, then the one it must equal) have `steps`
 * lines each and their first `compared` agree: loss within tol_loss and
 * grad_norm within tol_norm, relative to the second run's. Prints the pairs
 * when `label` is not NULL. */
static void expect_same_first_steps(const char *run_a, const char *run_b, int steps, int compared, double tol_loss,
                                    double tol_norm, const char *label)
{
    double la[16], ga[16], lb[16], gb[16];
    int na = read_losses(run_a, la, ga, 16), nb = read_losses(run_b, lb, gb, 16);
    CHECK_MSG(na == steps && nb == steps, "%s: logged %d and %d steps, expected %d", label ? label : run_a, na, nb,
              steps);
    for (int i = 0; i < na && i < nb; i++) {
        if (label)
            printf("%s step %d: loss %.9f vs %.9f, grad_norm %.9f vs %.9f\n", label, i + 1, la[i], lb[i], ga[i], gb[i]);
        if (i >= compared) continue;
        CHECK_NEAR(la[i], lb[i], tol_loss * fabs(lb[i]));
        CHECK_NEAR(ga[i], gb[i], tol_norm * fabs(gb[i]));
    }
}

static void expect_same_logs(const char *run_a, const char *run_b, int steps, double tol_loss, double tol_norm,
                             const char *label)
{
    expect_same_first_steps(run_a, run_b, steps, steps, tol_loss, tol_norm, label);
}

/* The largest |m̂_t| / sqrt(v̂_t) AdamW can form at step t (bias-corrected
 * moments of any gradients g_1..g_t): m̂ = Σ w_i g_i, v̂ = Σ q_i g_i² with
 * w_i = (1-β1)β1^(t-i)/(1-β1^t), q_i = (1-β2)β2^(t-i)/(1-β2^t), so by
 * Cauchy-Schwarz |m̂| ≤ sqrt(Σ w_i²/q_i)·sqrt(v̂). About 1.00 for t ≤ 3. */
static double adam_ratio_bound(double b1, double b2, int t)
{
    double s = 0;
    for (int i = 1; i <= t; i++) {
        double w = (1 - b1) * pow(b1, t - i) / (1 - pow(b1, t)), q = (1 - b2) * pow(b2, t - i) / (1 - pow(b2, t));
        s += w * w / q;
    }
    return sqrt(s);
}

/* Gradient accumulation: 4 micro-batches of 1 make the gradient one batch of
 * 4 makes, up to the order of f32 sums (which differs with the ISA level and
 * the engine), so losses, gradient norms and the adapters after three AdamW
 * steps agree.
 *
 * Error analysis of the adapters' comparison. Per element, AdamW moves a
 * parameter by u_t = lr_t·m̂/(sqrt(v̂) + eps) (decoupled decay only shrinks a
 * difference). If the two runs' clipped gradients differ by at most E in every
 * element, m̂ (a convex combination of the g's) differs by ≤ E and sqrt(v̂) (a
 * weighted 2-norm of them) by ≤ E, so
 *   |Δu_t| ≤ lr_t·(E/eps + |m̂|·E/((sqrt(v̂)+eps)·eps)) ≤ lr_t·E·(1 + K_t)/eps
 * with K_t = adam_ratio_bound. The 1/eps is the point: at torch's eps 1e-8 an
 * element whose gradient is near 0 (sums of many per-token terms that cancel,
 * so its f32 error is large relative to itself) moves by ±lr in one run and
 * by a different amount in the other; the step is not a well-conditioned
 * function of the gradient and nothing below the step itself bounds the
 * difference (such elements differed by 3.6e-5, ~4% of lr, with AVX2 sums).
 * So this test runs AdamW with eps = 0.5 (--adam_epsilon stays below 1), where
 * the step is Lipschitz in the gradient, and takes for E the budget the
 * grad_norm comparison allows
 * (relative 1e-4 of the clipped gradient's norm, ≤ max_grad_norm; an element
 * differs by no more than the vector does). Gradients that differ at step t
 * also move the parameters of step t+1; that effect is of the order of
 * lr·E, far below E, and left out. */
static void test_accumulation(const char *root)
{
    at_train_args a;
    at_train_result r1, r2;
    char out1[512], out2[512];
    const double grad_tol = 1e-4;
    snprintf(out1, sizeof out1, "%s/accum-batch4", root);
    snprintf(out2, sizeof out2, "%s/accum-micro4", root);
    base_args(&a, out1);
    a.batch_size = 4;
    a.grad_accum = 1;
    a.max_steps = 3;
    a.adam_epsilon = 0.5;
    CHECK_OK(at_train_run(&a, stdout, &r1));
    base_args(&a, out2);
    a.batch_size = 1;
    a.grad_accum = 4;
    a.max_steps = 3;
    a.adam_epsilon = 0.5;
    CHECK_OK(at_train_run(&a, stdout, &r2));
    expect_same_logs(r2.run_dir, r1.run_dir, 3, 1e-5, grad_tol, NULL);
    /* the bound of the comment above, with lr_t ≤ lr (the schedule only lowers it) */
    double bound = 0;
    for (int t = 1; t <= a.max_steps; t++)
        bound += a.learning_rate * grad_tol * a.max_grad_norm * (1 + adam_ratio_bound(a.adam_beta1, a.adam_beta2, t)) /
                 a.adam_epsilon;
    /* the adapters after three updates agree too */
    char *c1 = at_path_join(r1.run_dir, "checkpoint-3"), *c2 = at_path_join(r2.run_dir, "checkpoint-3");
    CHECK_OK(at_manifest_verify(c1));
    char *f1 = at_path_join(c1, "adapter_model.safetensors"), *f2 = at_path_join(c2, "adapter_model.safetensors");
    at_st_file *s1 = NULL, *s2 = NULL;
    CHECK_OK(at_st_open(f1, &s1));
    CHECK_OK(at_st_open(f2, &s2));
    if (s1 && s2) {
        CHECK(at_st_count(s1) == at_st_count(s2) && at_st_count(s1) == 5 * 7 * 2);
        double maxd = 0;
        for (size_t i = 0; i < at_st_count(s1); i++) {
            const at_st_info *x = at_st_info_at(s1, i), *y = at_st_find(s2, x->name);
            CHECK(y != NULL);
            if (!y) continue;
            const float *px = (const float *)x->data, *py = (const float *)y->data;
            for (size_t k = 0; k < x->nbytes / 4; k++) maxd = fmax(maxd, fabs((double)px[k] - py[k]));
        }
        printf("accumulation: adapters differ by at most %.3g (bound %.3g)\n", maxd, bound);
        CHECK_MSG(maxd <= bound, "adapters differ by %g, more than the bound %g", maxd, bound);
    }
    at_st_close(s1);
    at_st_close(s2);
    free(f1);
    free(f2);
    free(c1);
    free(c2);
}

/* Runs the program with argv; returns its pid. */
static pid_t spawn(char *const argv[])
{
    fflush(stdout); /* else the child's freopen writes our buffered output a second time */
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* The run of argv (its last two items "--output_dir", dir) with the debug
 * variable env=7: it must end with `status` (a wait status check), then,
 * resumed from its last checkpoint, log what the uninterrupted run logged
 * (root/whole.txt, timings left out). */
static void interrupt_and_resume(char **argv, int k, const char *root, const char *dir, const char *env,
                                 int (*ended_as_expected)(int status), const char *what)
{
    argv[k - 1] = (char *)dir;
    argv[k] = NULL;
    setenv(env, "7", 1);
    int status = 0;
    pid_t pid = spawn(argv);
    waitpid(pid, &status, 0);
    unsetenv(env);
    CHECK_MSG(ended_as_expected(status), "%s: the run ended with status %d", what, status);
    argv[k] = "--resume_from_checkpoint";
    argv[k + 1] = "last";
    argv[k + 2] = NULL;
    pid = spawn(argv);
    waitpid(pid, &status, 0);
    argv[k] = NULL;
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the resumed run ended with status %d", what, status);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "r=$(ls -d %s/v0-*) && sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' "
             "$r/logging.jsonl > %s/resumed.txt && cmp %s/whole.txt %s/resumed.txt",
             dir, root, root, root);
    CHECK_MSG(system(cmd) == 0, "%s: logging.jsonl of the resumed run differs from the uninterrupted one", what);
}

static int killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
static int stopped_by_sigterm(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM; }

static void test_kill_and_resume(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char out_a[512], out_b[512], out_c[512];
    snprintf(out_a, sizeof out_a, "%s/resume-whole", root);
    snprintf(out_b, sizeof out_b, "%s/resume-killed", root);
    snprintf(out_c, sizeof out_c, "%s/resume-term", root);
    char *common[] = {"--model", (char *)MODEL, "--dataset", (char *)DATA, "--model_name", "anytune",
                      "--learning_rate", "1e-3", "--logging_steps", "1", "--save_steps", "3", "--max_steps", "12",
                      "--lora_dropout", "0.1", "--per_device_train_batch_size", "2", "--seed", "7"};
    int nc = (int)(sizeof common / sizeof common[0]);
    char *argv[64];
    int k = 0;
    argv[k++] = (char *)bin;
    argv[k++] = "sft";
    for (int i = 0; i < nc; i++) argv[k++] = common[i];
    argv[k++] = "--output_dir";
    argv[k++] = out_a;
    argv[k] = NULL;
    int status = 0;
    pid_t pid = spawn(argv);
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "a=$(ls -d %s/v0-*) && sed -E 's/\"tokens_per_s\":[^,}]*,?//; s/\"memory_mb\":[^,}]*,?//' "
             "$a/logging.jsonl > %s/whole.txt && test $(wc -l < %s/whole.txt) -eq 12",
             out_a, root, root);
    CHECK_MSG(system(cmd) == 0, "the uninterrupted run did not log 12 steps");

    /* Killed with SIGKILL after step 7 (checkpoint-6 is the last one written):
     * the trainer raises it on itself at that point, which is deterministic
     * where an outside kill would race a fast run. */
    interrupt_and_resume(argv, k, root, out_b, "ANYTUNE_DEBUG_KILL_AFTER_STEP", killed, "SIGKILL after step 7");

    /* Stopped by SIGTERM after step 7: the trainer finishes the step, writes
     * checkpoint-7 (not a save step) and exits with 128 + 15. */
    interrupt_and_resume(argv, k, root, out_c, "ANYTUNE_DEBUG_TERM_AFTER_STEP", stopped_by_sigterm,
                         "SIGTERM after step 7");
    /* checkpoint-7 from the stop, none at 8 (the stop came right after 7), 9 from the resumed run */
    snprintf(cmd, sizeof cmd, "c=$(ls -d %s/v0-*) && test -d $c/checkpoint-7 && test ! -d $c/checkpoint-8 && "
             "test -d $c/checkpoint-9", out_c);
    CHECK_MSG(system(cmd) == 0, "SIGTERM after step 7: not checkpoint-7 alone at the stop");
}

static void test_full(const char *root)
{
    at_train_args a;
    at_train_result r;
    char out[512];
    snprintf(out, sizeof out, "%s/full", root);
    base_args(&a, out);
    a.full = 1;
    a.learning_rate = 3e-3;
    a.batch_size = 4;
    a.max_steps = 12;
    a.weight_decay = 0;
    CHECK_OK(at_train_run(&a, stdout, &r));
    CHECK_MSG(r.last_loss < 0.8 * r.first_loss, "loss %g -> %g", r.first_loss, r.last_loss);
    char *ck = at_path_join(r.run_dir, "checkpoint-12");
    CHECK_OK(at_manifest_verify(ck));
    char *cfg = at_path_join(ck, "config.json"), *w = at_path_join(ck, "model.safetensors");
    CHECK(at_file_exists(cfg) && at_file_exists(w));
    free(cfg);
    free(w);
    /* the checkpoint stands alone (issue 21.3): tokenizer files and a
     * generation config beside the weights; it loads as a model and its
     * tokenizer encodes as the one it was trained with (the demo's llama2.c
     * tokenizer.bin, written as Hugging Face files) */
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = at_path_join(ck, files[i]);
        CHECK_MSG(at_file_exists(p), "%s has no %s", ck, files[i]);
        free(p);
    }
    at_bundle_opts bo = {.model = ck, .dtype = AT_LOAD_KEEP_DTYPE};
    at_bundle *b = NULL, *orig = NULL;
    at_bundle_opts bo0 = {.model = a.model, .dtype = AT_LOAD_KEEP_DTYPE};
    CHECK_OK(at_device_select("cpu", &bo.backend));
    bo0.backend = bo.backend;
    CHECK_OK(at_bundle_load(&bo, &b));
    CHECK_OK(at_bundle_load(&bo0, &orig));
    if (b && orig) {
        const char *text = "Once upon a time, a little girl named Lily";
        int32_t *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        CHECK_OK(at_bundle_encode_text(b, text, &x, &nx));
        CHECK_OK(at_bundle_encode_text(orig, text, &y, &ny));
        CHECK(nx == ny && nx > 3 && x && y && !memcmp(x, y, nx * sizeof *x));
        free(x);
        free(y);
    }
    at_bundle_free(b);
    at_bundle_free(orig);
    free(ck);
}

/* The same model as a Hugging Face folder, a GGUF file (tokenizer from its
 * tokenizer.ggml.* arrays) and a llama2.c checkpoint (--tokenizer
 * tokenizer.bin) trains alike: three loaders, three tokenizer sources. */
static void test_model_formats(const char *root)
{
    static const struct {
        const char *model, *tokenizer, *name;
    } forms[] = {{"demo/stories260K", NULL, "hf"},
                 {"tests/data/models/stories260K.gguf", NULL, "gguf"},
                 {"tests/data/models/stories260K.bin", "tests/data/goldens/tok512.bin", "llama2c"}};
    char runs[3][1024];
    for (int i = 0; i < 3; i++) {
        at_train_args a;
        at_train_result r;
        char out[512];
        snprintf(out, sizeof out, "%s/form-%s", root, forms[i].name);
        base_args(&a, out);
        a.model = forms[i].model;
        a.tokenizer = forms[i].tokenizer;
        a.template_name = "chatml"; /* the GGUF and llama2.c files carry none */
        a.has_dtype = 1;
        a.dtype = AT_F32;
        a.max_steps = 3;
        CHECK_OK(at_train_run(&a, stdout, &r));
        snprintf(runs[i], sizeof runs[i], "%s", r.run_dir);
    }
    expect_same_logs(runs[1], runs[0], 3, 1e-6, 1e-5, "gguf vs hf");
    expect_same_logs(runs[2], runs[0], 3, 1e-6, 1e-5, "llama2.c vs hf");
}

static void test_errors(const char *root)
{
    at_train_args a;
    at_train_result r;
    char out[512];
    snprintf(out, sizeof out, "%s/errors", root);
    base_args(&a, out);
    const char *bad[] = {"tests/data/datasets/missing.jsonl"};
    a.datasets = bad;
    CHECK(at_train_run(&a, stdout, &r) != AT_OK);
    CHECK(strstr(at_last_error(), "missing.jsonl") != NULL);
    base_args(&a, out);
    a.model = "tests/data/models/no-such-model";
    CHECK(at_train_run(&a, stdout, &r) != AT_OK);
    CHECK(strstr(at_last_error(), "no-such-model") != NULL);
    /* a dataset with images: refused, not trained on its text alone */
    base_args(&a, out);
    const char *vision[] = {"tests/data/datasets/vision/vlm.jsonl"};
    a.datasets = vision;
    a.strict = 1;
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(at_last_error(), "vlm.jsonl:1") && strstr(at_last_error(), "image"), "%s", at_last_error());
    base_args(&a, out);
    a.resume_from_checkpoint = "last";
    a.output_dir = "/tmp/anytune-no-runs-here";
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_NOT_FOUND);
}

/* A learning rate that blows the weights up: the steps with a non-finite loss
 * are skipped and logged, and after max_nonfinite_steps in a row the run
 * stops with a message naming the last good checkpoint. */
static void test_nonfinite(const char *root)
{
    at_train_args a;
    at_train_result r;
    char out[512];
    snprintf(out, sizeof out, "%s/nonfinite", root);
    base_args(&a, out);
    a.full = 1;
    /* non-finite from the second step on: the first update scales every
     * weight by 1 - lr·weight_decay = 1 - 1e38 (a learning rate of 1e38 did
     * it before; the option table now refuses a rate over 1) */
    a.learning_rate = 1;
    a.scheduler = AT_SCHED_CONSTANT;
    a.max_grad_norm = 0;
    a.weight_decay = 1e38;
    a.max_steps = 20;
    a.save_steps = 1;
    a.max_nonfinite_steps = 3;
    at_status s = at_train_run(&a, stdout, &r);
    CHECK(s != AT_OK);
    CHECK_MSG(strstr(at_last_error(), "non-finite") && strstr(at_last_error(), "checkpoint"), "%s", at_last_error());
    char *log = at_path_join(r.run_dir, "logging.jsonl"), *text = NULL;
    CHECK_OK(at_read_file(log, &text, NULL));
    int skipped = 0;
    for (char *p = text; p && (p = strstr(p, "\"skipped\":true")); p++) skipped++;
    CHECK(skipped == 3);
    char *last = NULL;
    int64_t step = 0;
    CHECK_OK(at_ckpt_find_last(r.run_dir, &last, &step));
    CHECK(step >= 1);
    free(last);
    free(text);
    free(log);
}

/* Continued pre-training on plain text, with a validation split, and a LoRA
 * run that starts from an existing adapter. */
static void test_pt_and_adapters(const char *root)
{
    at_train_args a;
    at_train_result r, r2;
    char out[512];
    snprintf(out, sizeof out, "%s/pt", root);
    base_args(&a, out);
    const char *txt[] = {"tests/data/datasets/c4_demo.jsonl#40"};
    a.datasets = txt;
    a.pt = 1;
    a.split_dataset_ratio = 0.2;
    a.max_steps = 4;
    a.batch_size = 2;
    a.eval_steps = 2;
    a.max_length = 128;
    a.truncation = AT_TRUNCATE_RIGHT;
    CHECK_OK(at_train_run(&a, stdout, &r));
    char *log = at_path_join(r.run_dir, "logging.jsonl"), *text = NULL;
    CHECK_OK(at_read_file(log, &text, NULL));
    int evals = 0;
    for (char *p = text; p && (p = strstr(p, "\"eval_loss\":")); p++) evals++;
    CHECK(evals == 2);
    free(text);
    free(log);
    char *svg = at_path_join(r.run_dir, "images/train_loss.svg");
    CHECK(at_file_exists(svg));
    free(svg);
    /* start from the adapter of that run: its first loss is the pt run's trained state */
    char *ck = at_path_join(r.run_dir, "checkpoint-4");
    snprintf(out, sizeof out, "%s/from-adapter", root);
    base_args(&a, out);
    a.datasets = txt;
    a.pt = 1;
    a.max_steps = 1;
    a.max_length = 128;
    a.truncation = AT_TRUNCATE_RIGHT;
    a.adapters = ck;
    a.learning_rate = 1e-9;
    CHECK_OK(at_train_run(&a, stdout, &r2));
    a.adapters = NULL;
    at_train_result r3;
    CHECK_OK(at_train_run(&a, stdout, &r3));
    CHECK_MSG(r2.first_loss < r3.first_loss, "from adapter %g, fresh %g", r2.first_loss, r3.first_loss);
    free(ck);
}

/* Dynamic loss scaling (what the planner picks for f16 GPUs): scaling by a
 * power of two changes nothing in f32 arithmetic, and a scale so large that
 * the gradients overflow is halved, with those steps skipped and logged. */
static void test_loss_scaling(const char *root)
{
    at_train_args a;
    at_train_result r1, r2, r3;
    char out[512];
    snprintf(out, sizeof out, "%s/ls-off", root);
    base_args(&a, out);
    a.max_steps = 4;
    a.batch_size = 2;
    CHECK_OK(at_train_run(&a, stdout, &r1));
    snprintf(out, sizeof out, "%s/ls-on", root);
    base_args(&a, out);
    a.max_steps = 4;
    a.batch_size = 2;
    a.loss_scaling = 1;
    CHECK_OK(at_train_run(&a, stdout, &r2));
    expect_same_logs(r2.run_dir, r1.run_dir, 4, 1e-6, 1e-6, NULL);
    snprintf(out, sizeof out, "%s/ls-overflow", root);
    base_args(&a, out);
    a.max_steps = 20;
    a.batch_size = 2;
    a.loss_scaling = 1;
    a.loss_scale_init = ldexp(1.0, 66);
    CHECK_OK(at_train_run(&a, stdout, &r3));
    char *log = at_path_join(r3.run_dir, "logging.jsonl"), *text = NULL;
    CHECK_OK(at_read_file(log, &text, NULL));
    int overflows = 0;
    for (char *p = text; p && (p = strstr(p, "loss scale overflow")); p++) overflows++;
    CHECK_MSG(overflows >= 1 && overflows < 20, "%d overflow steps", overflows);
    CHECK(isfinite(r3.last_loss));
    free(text);
    free(log);
}

/* The whole trainer on the CUDA backend: on a real GPU when the machine has
 * one, and with its kernels run by the CUDA emulator (emulator != NULL: the
 * registry offers it as cuda:0). LoRA and full fine-tuning in f32 log what
 * the CPU logs (only the order of sums differs), and the checkpoint
 * verifies. */
static void test_on_cuda(const char *root, const char *emulator)
{
    if (emulator) setenv("ANYTUNE_CUDA_EMULATE", emulator, 1);
    /* modes: LoRA f32, full fine-tuning f32, QLoRA (NF4 weights, bf16 compute) */
    static const char *const MODE[] = {"lora", "full", "qlora"};
    for (int mode = 0; mode < 3; mode++) {
        int full = mode == 1, qlora = mode == 2;
        at_train_args a;
        at_train_result rc, rg;
        char out1[512], out2[512];
        snprintf(out1, sizeof out1, "%s/cuda-%d-%s-cpu", root, !!emulator, MODE[mode]);
        snprintf(out2, sizeof out2, "%s/cuda-%d-%s-gpu", root, !!emulator, MODE[mode]);
        for (int dev = 0; dev < 2; dev++) {
            base_args(&a, dev ? out2 : out1);
            a.device = dev ? "cuda" : "cpu";
            a.has_dtype = 1;
            a.dtype = qlora ? AT_BF16 : AT_F32;
            a.quant_bits = qlora ? 4 : 0;
            a.full = full;
            a.learning_rate = full ? 1e-4 : 1e-3;
            a.lora_dropout = full ? 0 : 0.05; /* the masks are the CPU's bit for bit */
            a.batch_size = 2;
            a.grad_accum = 2;
            a.max_steps = 3;
            /* QLoRA: the GPU rounds activations to bf16 before the NF4
             * products; the CPU does so only where bf16 is fast (AVX512_BF16)
             * and computes them in f32 otherwise, a difference of up to one
             * bf16 rounding (2^-9) per activation, not what the comparison
             * below is about: the CPU computes in bf16 here at every ISA level */
            at_backend *cpu = at_cpu_backend();
            int fast = cpu->fast_bf16;
            if (qlora && !dev) cpu->fast_bf16 = 1;
            CHECK_OK(at_train_run(&a, stdout, dev ? &rg : &rc));
            cpu->fast_bf16 = fast;
        }
        /* f32: only the order of sums differs, all three steps agree.
         * bf16 compute (QLoRA): activations rounded to bf16 before the
         * products, so some roundings land differently and the first step
         * (the same weights on both) agrees within them. The later steps are
         * not compared: AdamW at eps 1e-8 is no bounded function of gradient
         * differences (test_accumulation's analysis; an element whose
         * gradient is near 0 moves by ±lr on one device and not on the
         * other), and the CPU's own ISA levels differ by 1e-3 at step 3. */
        double tol_loss = qlora ? 1e-3 : 1e-5, tol_norm = qlora ? 1e-2 : 1e-4;
        char label[64];
        snprintf(label, sizeof label, "cuda%s %s vs cpu", emulator ? " (emulated)" : "", MODE[mode]);
        expect_same_first_steps(rg.run_dir, rc.run_dir, 3, qlora ? 1 : 3, tol_loss, tol_norm, label);
        char *ck = at_path_join(rg.run_dir, "checkpoint-3");
        CHECK_OK(at_manifest_verify(ck));
        free(ck);
    }
    /* --tf32 reaches the device: f32 matmuls on TF32 tensor cores (the emulator
     * rounds their inputs to TF32 as the hardware does) move the first loss a
     * little, not much */
    const char *bin = getenv("ANYTUNE_BIN");
    double tl[2] = {0, 0};
    for (int tf = 0; bin && tf < 2; tf++) {
        char out[512];
        snprintf(out, sizeof out, "%s/tf32-%d-%d", root, !!emulator, tf);
        char *argv[] = {(char *)bin, "sft", "--model", (char *)MODEL, "--dataset", (char *)DATA, "--device", "cuda",
                        "--torch_dtype", "float32", "--max_steps", "1", "--logging_steps", "1", "--lora_dropout", "0",
                        "--tf32", tf ? "true" : "false", "--output_dir", out, NULL};
        int status = 0;
        pid_t pid = spawn(argv);
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
        char *rd = NULL;
        DIR *d = opendir(out);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL)
            if (e->d_name[0] == 'v') rd = at_path_join(out, e->d_name);
        if (d) closedir(d);
        double g[2];
        CHECK(rd && read_losses(rd, &tl[tf], g, 1) == 1);
        free(rd);
    }
    if (bin) {
        printf("cuda%s first loss: f32 %.9f, tf32 %.9f\n", emulator ? " (emulated)" : "", tl[0], tl[1]);
        CHECK_MSG(tl[0] != tl[1] && fabs(tl[1] - tl[0]) <= 1e-2 * fabs(tl[0]), "--tf32: loss %.9g vs %.9g", tl[1],
                  tl[0]);
    }
    if (emulator) unsetenv("ANYTUNE_CUDA_EMULATE");
}

int main(void)
{
    char root[] = "/tmp/anytune-train-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_accumulation(root);
    test_kill_and_resume(root);
    test_full(root);
    test_model_formats(root);
    test_errors(root);
    test_nonfinite(root);
    test_pt_and_adapters(root);
    test_loss_scaling(root);
#ifdef AT_CUDA_EMU_LIBRARY
    test_on_cuda(root, AT_CUDA_EMU_LIBRARY);
#endif
    if (at_test_gpu_backend()) test_on_cuda(root, NULL);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("test_train");
}
