/* Data parallel training through MPI on the CPU:
 *  - `mpirun -np 2 anytune sft …` with micro-batches of 1 row, 2 accumulated,
 *    logs what one process with micro-batches of 2 rows, 2 accumulated, logs
 *    (LoRA dropout on: its masks are keyed by the row of the step, not by
 *    the micro-batch layout): the same tokens, the same first loss and
 *    gradient norm (up to the order of the sums: 1e-6), and later steps
 *    within 2e-3 (AdamW's first steps divide by sqrt(v), so a last-bit
 *    difference in a tiny gradient moves a weight by up to lr);
 *    this and the preference cases below run in f32: with bf16 products
 *    (the planner's choice for the f32 demo model on a CPU with bf16
 *    hardware) a last-bit difference in step 1's update (the order of the
 *    sums over ranks) flips roundings of activations from step 2 on, so
 *    whether bf16 runs agree is luck.
 *    DPO's second step differed by 0.5% between the layouts at seed 7 with
 *    one dropout hash and not at all at seeds 8 and 9; with another, the
 *    SFT case's third gradient norm by 2.9e-3 under ASan alone. In f32 the
 *    layouts differ by the order of the sums (3e-6 and less);
 *  - rank 0 alone writes the run (one run folder, a verified checkpoint);
 *  - DPO, KTO and reward models (anytune rlhf) likewise: 2 ranks x 1 pair
 *    = 1 process x one micro-batch of 2 pairs (KTO: 2 ranks x 2 examples =
 *    1 process x 2 micro-batches of 2);
 *  - GRPO likewise (grpo_case): 2 ranks x 1 prompt = 1 process x 2
 *    micro-batches of 1 prompt (num_iterations 2) and = 1 process x one
 *    micro-batch of 2 prompts, with --scale_rewards batch (the std over
 *    every rank's completions) and the KL term: the same rewards at every
 *    step, the same losses, gradient norms and adapter at the end
 *    (generation draws each completion from a seed of its prompt and index,
 *    so every layout samples the same tokens);
 *  - the same on the CUDA backend under the emulator (gradients staged
 *    through host memory: the emulator has no NCCL);
 *  - an error on the ranks (a missing dataset) ends the job with the message,
 *    it does not hang in a collective;
 *  - at_comm_allreduce_tensors (this program run by mpirun with
 *    --allreduce-worker): sums equal on every rank, in the number of MPI
 *    calls the buckets imply.
 * Needs OpenMPI's mpirun (scripts/setup.sh installs it). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "device/comm.h"
#include "device/cpu/cpu_backend.h"
#include "device/cuda_loader.h"
#include "model/safetensors.h"
#include "train/run_files.h"
#include "testing.h"

#define COMMON                                                                         \
    " sft --model demo/stories260K --dataset demo/identity.json --max_steps 4 --logging_steps 1 " \
    "--lora_dropout 0.05 --seed 7 --learning_rate 1e-3 --torch_dtype float32"
#define MPIRUN "mpirun -np 2 --oversubscribe"

/* The only v*-* run folder under dir (NULL if none or several). */
static char *run_folder(const char *dir, int *count)
{
    char *found = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != 'v' || !strchr(e->d_name, '-')) continue;
        (*count)++;
        free(found);
        found = at_path_join(dir, e->d_name);
    }
    closedir(d);
    return found;
}

typedef struct {
    int n;
    double loss[16], norm[16], tokens[16];
    double reward[16], reward_std[16], kl[16]; /* grpo's (NaN when absent) */
} log_rows;

static double field(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int read_log(const char *run, log_rows *r)
{
    memset(r, 0, sizeof *r);
    char *p = at_path_join(run, "logging.jsonl"), *text = NULL;
    size_t len = 0;
    int ok = p && at_read_file(p, &text, &len) == AT_OK;
    free(p);
    for (char *line = text; ok && line < text + len && r->n < 16;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) break;
        cJSON *j = NULL;
        if (at_json_parse(line, (size_t)(nl - line), "logging.jsonl", &j) != AT_OK) {
            ok = 0;
            break;
        }
        const cJSON *l = cJSON_GetObjectItem(j, "loss"), *g = cJSON_GetObjectItem(j, "grad_norm"),
                    *t = cJSON_GetObjectItem(j, "tokens");
        if (l && g && t) {
            r->loss[r->n] = l->valuedouble;
            r->norm[r->n] = g->valuedouble;
            r->tokens[r->n] = t->valuedouble;
            r->reward[r->n] = field(j, "reward");
            r->reward_std[r->n] = field(j, "reward_std");
            r->kl[r->n] = field(j, "kl");
            r->n++;
        }
        cJSON_Delete(j);
        line = nl + 1;
    }
    free(text);
    return ok;
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12); }

/* Element j of tensor i on rank r: multiples of 1/4 small enough that every
 * sum over ranks is exact in f32. */
static float fill_value(int r, int i, size_t j) { return (float)(r + 1) * (float)(i * 1000 + (int)(j % 997)) * 0.25f; }

/* One rank's part: the tensors of `sizes` on backend be, summed with buckets
 * of bucket_bytes; every element is checked and, when want_calls >= 0, the
 * number of collective calls. */
static void allreduce_case(at_comm *c, at_backend *be, const size_t *sizes, int n, size_t bucket_bytes, long long want_calls)
{
    int world = at_comm_size(c), rank = at_comm_rank(c);
    at_tensor *ts[8] = {0};
    for (int i = 0; i < n; i++) {
        int64_t shape[1] = {(int64_t)sizes[i]};
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(at_tensor_new(be, AT_F32, 1, shape, name, &ts[i]));
        float *h = malloc(sizes[i] * sizeof *h);
        for (size_t j = 0; h && j < sizes[i]; j++) h[j] = fill_value(rank, i, j);
        if (h && ts[i]) CHECK_OK(at_tensor_upload(ts[i], h, sizes[i] * sizeof *h));
        free(h);
    }
    if (at_test_failures) goto done;
    long long calls0 = at_comm_calls(c);
    CHECK_OK(at_comm_allreduce_tensors(c, ts, n, bucket_bytes));
    if (want_calls >= 0)
        CHECK_MSG(at_comm_calls(c) - calls0 == want_calls, "%s, bucket %zu bytes: %lld collective calls, want %lld",
                  be->name, bucket_bytes, at_comm_calls(c) - calls0, want_calls);
    for (int i = 0; i < n; i++) {
        float *h = malloc(sizes[i] * sizeof *h);
        if (!h || at_tensor_download(ts[i], h, sizes[i] * sizeof *h) != AT_OK) {
            CHECK_MSG(0, "download of t%d", i);
            free(h);
            continue;
        }
        size_t bad = 0;
        for (size_t j = 0; j < sizes[i]; j++) {
            float want = 0;
            for (int r = 0; r < world; r++) want += fill_value(r, i, j);
            bad += h[j] != want;
        }
        CHECK_MSG(bad == 0, "%s, bucket %zu bytes: t%d (%zu values) has %zu wrong sums", be->name, bucket_bytes, i,
                  sizes[i], bad);
        free(h);
    }
done:
    for (int i = 0; i < n; i++) at_tensor_free(ts[i]);
}

static int allreduce_worker(void)
{
    at_comm *c = NULL;
    CHECK_OK(at_comm_world(&c));
    if (!c) return at_test_result("test_mpi worker");
    CHECK_MSG(at_comm_size(c) == 2, "the worker runs with 2 ranks, not %d", at_comm_size(c));
    /* 16 KiB buckets (4096 values): {3, 1000, 5} packed, 40000 alone and in
     * place, {7, 1} packed: 3 calls; the default bucket takes all in 1 */
    const size_t sizes[] = {3, 1000, 5, 40000, 7, 1};
    allreduce_case(c, at_cpu_backend(), sizes, 6, 16 << 10, 3);
    allreduce_case(c, at_cpu_backend(), sizes, 6, 0, 1);
#ifdef AT_CUDA_EMU_LIBRARY
    /* a device backend without NCCL: staged through host buckets, the tensor
     * bigger than a bucket in a buffer of its own */
    at_backend *emu = NULL;
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &emu));
    if (emu) allreduce_case(c, emu, sizes, 6, 16 << 10, -1);
    if (emu) allreduce_case(c, emu, sizes, 6, 16 << 10, 3);
#endif
    int rc = at_test_result("test_mpi worker");
    at_comm_finalize();
    return rc;
}

/* `mpirun -np 2 anytune rlhf ARGS MPI_ARGS` and `anytune rlhf ARGS
 * ONE_ARGS`, into T/NAME-mpi and T/NAME-one: both logs read into a, b
 * (returns 0 when a run failed or a log is unreadable) and their run
 * folders into *run_mpi, *run_one (free()); the 2-rank job makes one. */
static int run_pair(const char *bin, const char *T, const char *name, const char *args, const char *mpi_args,
                    const char *one_args, log_rows *a, log_rows *b, char **run_mpi, char **run_one)
{
    char cmd[2048], dir[600];
    snprintf(cmd, sizeof cmd, "timeout 300 " MPIRUN " %s rlhf %s %s --output_dir %s/%s-mpi > %s/%s-mpi.out 2>&1", bin,
             args, mpi_args, T, name, T, name);
    int ok = run(cmd) == 0;
    CHECK_MSG(ok, "mpirun -np 2 anytune rlhf (%s) failed (%s/%s-mpi.out)", name, T, name);
    snprintf(cmd, sizeof cmd, "timeout 300 %s rlhf %s %s --output_dir %s/%s-one > %s/%s-one.out 2>&1", bin, args,
             one_args, T, name, T, name);
    int ok1 = run(cmd) == 0;
    CHECK_MSG(ok1, "anytune rlhf (%s) failed (%s/%s-one.out)", name, T, name);
    int n_mpi = 0, n_one = 0;
    snprintf(dir, sizeof dir, "%s/%s-mpi", T, name);
    *run_mpi = run_folder(dir, &n_mpi);
    snprintf(dir, sizeof dir, "%s/%s-one", T, name);
    *run_one = run_folder(dir, &n_one);
    CHECK_MSG(n_mpi == 1, "the 2-rank %s job made %d run folders", name, n_mpi);
    ok = ok && ok1 && *run_mpi && *run_one && read_log(*run_mpi, a) && read_log(*run_one, b);
    CHECK_MSG(ok, "%s: could not read both runs' logging.jsonl", name);
    return ok;
}

/* `mpirun -np 2 anytune rlhf --rlhf_type TYPE` with the options mpi_opts
 * against one process with one_opts: one run folder, the same tokens, the
 * same first loss and gradient norm up to the order of the sums (1e-6),
 * later steps within 2e-3 (see the top of the file). */
static void rlhf_case(const char *bin, const char *T, const char *type, const char *dataset, const char *dropout,
                      const char *mpi_opts, const char *one_opts)
{
    char common[512], args[1024];
    /* in f32, as the SFT case (the top of the file says why) */
    snprintf(common, sizeof common, "--model demo/stories260K --max_steps 3 --logging_steps 1 --lora_dropout %s "
             "--learning_rate 1e-4 --max_length 96 --truncation_strategy left --seed 7 --torch_dtype float32", dropout);
    snprintf(args, sizeof args, "--rlhf_type %s --dataset %s %s", type, dataset, common);
    log_rows a, b;
    char *run_mpi = NULL, *run_one = NULL;
    if (run_pair(bin, T, type, args, mpi_opts, one_opts, &a, &b, &run_mpi, &run_one)) {
        CHECK_MSG(a.n == 3 && b.n == 3, "%s: logged steps %d (2 ranks) and %d", type, a.n, b.n);
        for (int i = 0; i < a.n && i < b.n; i++) {
            double tol = i == 0 ? 1e-6 : 2e-3;
            CHECK_MSG(a.tokens[i] == b.tokens[i] && rel(a.loss[i], b.loss[i]) <= tol && rel(a.norm[i], b.norm[i]) <= tol,
                      "%s step %d: tokens %.0f / %.0f, loss %.9g / %.9g, grad_norm %.9g / %.9g", type, i + 1,
                      a.tokens[i], b.tokens[i], a.loss[i], b.loss[i], a.norm[i], b.norm[i]);
            printf("%s step %d: loss %.9f / %.9f, grad_norm %.9f / %.9f\n", type, i + 1, a.loss[i], b.loss[i],
                   a.norm[i], b.norm[i]);
        }
    }
    free(run_mpi);
    free(run_one);
}

/* The largest difference between the tensors of two adapter files,
 * relative to the largest value (-1 when they cannot be compared). */
static double adapter_diff(const char *a, const char *b)
{
    at_st_file *fa = NULL, *fb = NULL;
    double worst = -1, big = 0;
    if (at_st_open(a, &fa) != AT_OK || at_st_open(b, &fb) != AT_OK || at_st_count(fa) != at_st_count(fb)) goto done;
    worst = 0;
    for (size_t i = 0; i < at_st_count(fa) && worst >= 0; i++) {
        const at_st_info *x = at_st_info_at(fa, i), *y = at_st_find(fb, x->name);
        at_tensor *tx = NULL, *ty = NULL;
        if (!y || x->nbytes != y->nbytes || at_st_tensor(x, AT_F32, &tx) != AT_OK ||
            at_st_tensor(y, AT_F32, &ty) != AT_OK) {
            worst = -1;
        } else {
            const float *px = at_tensor_data(tx), *py = at_tensor_data(ty);
            for (int64_t k = 0; k < at_tensor_numel(tx); k++) {
                worst = fmax(worst, fabs((double)px[k] - py[k]));
                big = fmax(big, fabs((double)px[k]));
            }
        }
        at_tensor_free(tx);
        at_tensor_free(ty);
    }
    if (worst > 0) worst /= big > 0 ? big : 1;
done:
    at_st_close(fa);
    at_st_close(fb);
    return worst;
}

/* GRPO over 2 ranks (1 prompt each) against one process: each rank
 * generates and scores its own prompt's group; the step's counts
 * (completions, tokens, Σ R and Σ R² for --scale_rewards batch),
 * statistics and gradients are summed over the ranks. Two layouts of the
 * one process:
 *   accum  2 micro-batches of 1 prompt, with num_iterations 2 (the old
 *          policy's pass) and the KL term: the same micro-batches as the
 *          ranks, the gradients summed in the same order, so every step
 *          agrees to the rounding of the f64 statistics: 1e-6 relative (and
 *          1e-12 absolute for the first step's on-policy loss, a sum of
 *          terms ~1 that cancel to ~0), the adapter at the end likewise;
 *   one    1 micro-batch of 2 prompts, the first step: the batch std must
 *          be every rank's (a rank's own would differ from the one
 *          process's over both groups). The loss sums its rows in another
 *          order, so it agrees to 1e-6. Only the first step: its samples
 *          come from the same weights, row by row the same (the GEMMs keep
 *          each row's sums); after an update the weights differ in their
 *          last bits, and a sample drawn near a tie of two tokens' odds may
 *          then differ, so the runs would no longer compare.
 * Each run's step k has the same rewards (the same completions: seeded by
 * prompt and index, not by rank). */
static void grpo_case(const char *bin, const char *T, const char *name, const char *opts, const char *mpi_opts,
                      const char *one_opts, int steps, double tol_later, int adapters)
{
    char args[1024];
    snprintf(args, sizeof args, "%s --max_steps %d --save_steps %d", opts, steps, steps);
    log_rows a, b;
    char *run_mpi = NULL, *run_one = NULL;
    if (run_pair(bin, T, name, args, mpi_opts, one_opts, &a, &b, &run_mpi, &run_one)) {
        CHECK_MSG(a.n == steps && b.n == steps, "%s: logged steps %d (2 ranks) and %d", name, a.n, b.n);
        double spread = 0;
#define CLOSE(x, y, tol) (fabs((x) - (y)) <= (tol) * fabs(y) + 1e-12)
        for (int i = 0; i < a.n && i < b.n; i++) {
            double tol = i == 0 ? 1e-6 : tol_later;
            CHECK_MSG(a.tokens[i] == b.tokens[i] && CLOSE(a.reward[i], b.reward[i], 1e-12) &&
                          CLOSE(a.reward_std[i], b.reward_std[i], 1e-12) && CLOSE(a.kl[i], b.kl[i], tol) &&
                          CLOSE(a.loss[i], b.loss[i], tol) && CLOSE(a.norm[i], b.norm[i], tol),
                      "%s step %d: tokens %.0f / %.0f, reward %.9g / %.9g, reward_std %.9g / %.9g, kl %.9g / %.9g, "
                      "loss %.9g / %.9g, grad_norm %.9g / %.9g", name, i + 1, a.tokens[i], b.tokens[i], a.reward[i],
                      b.reward[i], a.reward_std[i], b.reward_std[i], a.kl[i], b.kl[i], a.loss[i], b.loss[i],
                      a.norm[i], b.norm[i]);
            printf("%s step %d: reward %.9f / %.9f, reward_std %.9f / %.9f, loss %.9f / %.9f, grad_norm %.9f / "
                   "%.9f\n", name, i + 1, a.reward[i], b.reward[i], a.reward_std[i], b.reward_std[i], a.loss[i],
                   b.loss[i], a.norm[i], b.norm[i]);
            spread = fmax(spread, a.reward_std[i]);
        }
#undef CLOSE
        /* the case means something: rewards that differ */
        CHECK_MSG(spread > 1e-3, "%s: every completion got the same reward (std %g)", name, spread);
        char ck[64];
        snprintf(ck, sizeof ck, "checkpoint-%d/adapter_model.safetensors", steps);
        char *ca = at_path_join(run_mpi, ck), *cb = at_path_join(run_one, ck);
        double d = ca && cb ? adapter_diff(ca, cb) : -1;
        if (adapters)
            CHECK_MSG(d >= 0 && d <= tol_later, "%s: the adapters after %d steps differ by %g (relative to the "
                      "largest value; -1: unreadable)", name, steps, d);
        printf("%s: adapters after %d steps differ by %.3g of the largest value\n", name, steps, d);
        free(ca);
        free(cb);
    }
    free(run_mpi);
    free(run_one);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--allreduce-worker")) return allreduce_worker();
    const char *bin = getenv("ANYTUNE_BIN");
    CHECK_MSG(bin != NULL, "ANYTUNE_BIN is not set (run through ctest)");
    CHECK_MSG(run("command -v mpirun > /dev/null") == 0, "mpirun not found: run scripts/setup.sh (OpenMPI)");
    if (!bin || at_test_failures) return at_test_result("test_mpi");
    /* as root in a container; one thread per rank (2 ranks on 2 cores); leak
     * reports of the MPI library itself are not ours */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    char tmpl[] = "/tmp/anytune-mpi-XXXXXX";
    char *T = mkdtemp(tmpl);
    CHECK(T != NULL);
    if (!T) return at_test_result("test_mpi");
    char cmd[2048];

    snprintf(cmd, sizeof cmd, "timeout 300 " MPIRUN " %s" COMMON " --per_device_train_batch_size 1 --gradient_accumulation_steps 2 --output_dir %s/mpi > %s/mpi.out 2>&1",
             bin, T, T);
    int rc = run(cmd);
    CHECK_MSG(rc == 0, "mpirun -np 2 anytune sft exited with %d (see below)", rc);
    if (rc) {
        snprintf(cmd, sizeof cmd, "tail -20 %s/mpi.out >&2", T);
        run(cmd);
    }
    snprintf(cmd, sizeof cmd, "timeout 300 %s" COMMON " --per_device_train_batch_size 2 --gradient_accumulation_steps 2 --output_dir %s/one > %s/one.out 2>&1",
             bin, T, T);
    CHECK(run(cmd) == 0);

    char dir[1024];
    int n_mpi = 0, n_one = 0;
    snprintf(dir, sizeof dir, "%s/mpi", T);
    char *run_mpi = run_folder(dir, &n_mpi);
    snprintf(dir, sizeof dir, "%s/one", T);
    char *run_one = run_folder(dir, &n_one);
    CHECK_MSG(n_mpi == 1, "the 2-rank job made %d run folders (rank 0 alone writes)", n_mpi);
    CHECK(n_one == 1);
    log_rows a, b;
    if (run_mpi && run_one && read_log(run_mpi, &a) && read_log(run_one, &b)) {
        CHECK_MSG(a.n == 4 && b.n == 4, "logged steps: %d (2 ranks) and %d (1 process)", a.n, b.n);
        for (int i = 0; i < a.n && i < b.n; i++) {
            CHECK_MSG(a.tokens[i] == b.tokens[i], "step %d: tokens %.0f vs %.0f", i + 1, a.tokens[i], b.tokens[i]);
            double tol = i == 0 ? 1e-6 : 2e-3;
            CHECK_MSG(rel(a.loss[i], b.loss[i]) <= tol, "step %d: loss %.9g (2 ranks) vs %.9g", i + 1, a.loss[i],
                      b.loss[i]);
            CHECK_MSG(rel(a.norm[i], b.norm[i]) <= tol, "step %d: grad_norm %.9g (2 ranks) vs %.9g", i + 1,
                      a.norm[i], b.norm[i]);
            printf("step %d: loss %.9f / %.9f, grad_norm %.9f / %.9f\n", i + 1, a.loss[i], b.loss[i], a.norm[i],
                   b.norm[i]);
        }
        char *ck = at_path_join(run_mpi, "checkpoint-4");
        CHECK_OK(at_manifest_verify(ck));
        free(ck);
    } else {
        CHECK_MSG(0, "could not read both runs' logging.jsonl");
    }
    free(run_mpi);
    free(run_one);

#ifdef AT_CUDA_EMU_LIBRARY
    /* on the CUDA backend (run by the emulator, which has no NCCL): the
     * gradients go through host memory and MPI; two micro-batches sum in the
     * same order either way, so the logs are equal to the last digit */
    snprintf(cmd, sizeof cmd,
             "ANYTUNE_CUDA_EMULATE=%s timeout 300 " MPIRUN " -x ANYTUNE_CUDA_EMULATE %s" COMMON
             " --device cuda --max_steps 3 --per_device_train_batch_size 1 --gradient_accumulation_steps 1 --output_dir %s/cuda-mpi > %s/cuda-mpi.out 2>&1",
             AT_CUDA_EMU_LIBRARY, bin, T, T);
    CHECK_MSG(run(cmd) == 0, "mpirun -np 2 anytune sft --device cuda (emulated) failed");
    snprintf(cmd, sizeof cmd,
             "ANYTUNE_CUDA_EMULATE=%s timeout 300 %s" COMMON
             " --device cuda --max_steps 3 --per_device_train_batch_size 1 --gradient_accumulation_steps 2 --output_dir %s/cuda-one > %s/cuda-one.out 2>&1",
             AT_CUDA_EMU_LIBRARY, bin, T, T);
    CHECK(run(cmd) == 0);
    snprintf(dir, sizeof dir, "%s/cuda-mpi", T);
    run_mpi = run_folder(dir, &n_mpi);
    snprintf(dir, sizeof dir, "%s/cuda-one", T);
    run_one = run_folder(dir, &n_one);
    if (run_mpi && run_one && read_log(run_mpi, &a) && read_log(run_one, &b)) {
        CHECK_MSG(a.n == 3 && b.n == 3, "cuda: logged steps %d (2 ranks) and %d", a.n, b.n);
        for (int i = 0; i < a.n && i < b.n; i++)
            CHECK_MSG(rel(a.loss[i], b.loss[i]) <= 1e-6 && rel(a.norm[i], b.norm[i]) <= 1e-6,
                      "cuda step %d: loss %.9g / %.9g, grad_norm %.9g / %.9g", i + 1, a.loss[i], b.loss[i], a.norm[i],
                      b.norm[i]);
    } else {
        CHECK_MSG(0, "cuda: could not read both runs' logging.jsonl");
    }
    free(run_mpi);
    free(run_one);
#endif

    /* The rlhf objectives: each rank's items, the step's item count, the
     * objective's sums and gradients summed over the ranks; one micro-batch
     * on each rank against the same micro-batches run by one process (the
     * dropout masks are the rows', not the layout's):
     *   dpo  2 ranks x 1 pair          = 1 process x one micro-batch of 2 pairs;
     *   kto  2 ranks x 2 examples      = 1 process x 2 micro-batches of 2 (the
     *        KL rows pair examples within a micro-batch: at least 2, and the
     *        same micro-batches both ways);
     *   rm   2 ranks x 1 pair          = 1 process x one micro-batch of 2 pairs
     *        (the score head's gradient is summed over the ranks too).
     * All in f32 (rlhf_case says why). The rm case ran without LoRA dropout
     * while its steps after the first depended on the micro-batch layout
     * even in one process (3e-3 apart at step 3, cause not found); that no
     * longer shows: one process's micro-batches of 1 and 2 pairs agree at
     * step 3 to 6e-6 in bf16 and 7e-7 in f32, and 2 ranks agree with one
     * process to 7e-7. */
    rlhf_case(bin, T, "dpo", "tests/data/dpo/dpo_en_demo_8.json", "0.05",
              "--per_device_train_batch_size 1 --gradient_accumulation_steps 1",
              "--per_device_train_batch_size 2 --gradient_accumulation_steps 1");
    rlhf_case(bin, T, "kto", "tests/data/kto/kto_en_demo_8.json", "0.05",
              "--per_device_train_batch_size 2 --gradient_accumulation_steps 1",
              "--per_device_train_batch_size 2 --gradient_accumulation_steps 2");
    rlhf_case(bin, T, "rm", "tests/data/dpo/dpo_en_demo_8.json", "0.05",
              "--per_device_train_batch_size 1 --gradient_accumulation_steps 1",
              "--per_device_train_batch_size 2 --gradient_accumulation_steps 1");
    /* grpo: rewards with a spread (completions end at a period: the overlong penalty varies) */
#define GRPO_OPTS                                                                                                  \
    "--rlhf_type grpo --model demo/stories260K --dataset demo/grpo_prompts.jsonl --reward_funcs soft_overlong "    \
    "repetition --stop_words . --soft_cache_length 32 --max_completion_length 40 --num_generations 4 "            \
    "--temperature 1.0 --scale_rewards batch --beta 0.04 --lora_dropout 0 --learning_rate 1e-3 "                   \
    "--logging_steps 1 --seed 7"
    grpo_case(bin, T, "grpo-accum", GRPO_OPTS " --num_iterations 2",
              "--per_device_train_batch_size 1 --gradient_accumulation_steps 1",
              "--per_device_train_batch_size 1 --gradient_accumulation_steps 2", 4, 1e-6, 1);
    grpo_case(bin, T, "grpo-one", GRPO_OPTS " --num_iterations 1",
              "--per_device_train_batch_size 1 --gradient_accumulation_steps 1",
              "--per_device_train_batch_size 2 --gradient_accumulation_steps 1", 1, 1e-6, 0);
#undef GRPO_OPTS

    snprintf(cmd, sizeof cmd, "timeout 120 " MPIRUN " %s --allreduce-worker > %s/worker.out 2>&1", argv[0], T);
    rc = run(cmd);
    CHECK_MSG(rc == 0, "mpirun -np 2 test_mpi --allreduce-worker exited with %d (see below)", rc);
    if (rc) {
        snprintf(cmd, sizeof cmd, "cat %s/worker.out >&2", T);
        run(cmd);
    }

    /* every rank fails (the dataset is missing): the job ends with the message */
    snprintf(cmd, sizeof cmd, "timeout 120 " MPIRUN " %s sft --model demo/stories260K --dataset %s/missing.jsonl --output_dir %s/bad > %s/bad.out 2>&1",
             bin, T, T, T);
    rc = run(cmd);
    CHECK_MSG(rc != 0 && rc != 124, "a failing 2-rank job exited with %d (124: it hung)", rc);
    snprintf(cmd, sizeof cmd, "grep -q 'missing.jsonl' %s/bad.out", T);
    CHECK_MSG(run(cmd) == 0, "the error does not name the missing dataset");

    snprintf(cmd, sizeof cmd, "rm -rf %s", T);
    run(cmd);
    return at_test_result("test_mpi");
}
