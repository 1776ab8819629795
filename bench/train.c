/* LoRA training throughput against PyTorch, in one run.
 *
 * One training step = forward, loss, backward and the optimizer (global
 * gradient norm, clipping at 1.0, AdamW on the LoRA parameters), with LoRA
 * rank 8, alpha 16, dropout 0.05 on q, k, v, o, gate, up, down, on random
 * weights of the two shapes of the models issue, initialised on both sides
 * as Hugging Face initialises Llama / Qwen2 (normal(0, 0.02) matrices and
 * embedding, zero biases, unit norms; LoRA A Kaiming-uniform, B 0 as PEFT),
 * so the first loss is near ln(vocab) as for a real untrained model (the
 * defaults of nn.Embedding, N(0, 1) through a tied head, gave logits in the
 * hundreds and a first loss of ~750). Formats of the frozen
 * weights on our side:
 *   f32         f32 weights, f32 compute;
 *   bf16        bf16 weights, as Qwen2.5's files hold them (computed in bf16 with
 *               f32 accumulation where the CPU multiplies bf16 natively; elsewhere
 *               widened exactly and computed in f32: device/cpu/gemm.h);
 *   qlora-nf4   the layers' linear matrices NF4 (embeddings / lm_head bf16);
 *   qlora-q8_0  the same with q8_0.
 * Activations, LoRA parameters, gradients and optimizer state are f32.
 * Each configuration runs in a child process (fork), so its peak resident
 * memory (wait4's ru_maxrss) is its own; the child also reports the peak
 * of the training steps alone (VmHWM reset after setup, clear_refs 5).
 *
 * PyTorch (tools/bench_train_torch.py, the same step written as Hugging
 * Face + PEFT run it) runs as a subprocess three times, set up as shared
 * BENCHMARKING.md says, with tcmalloc preloaded where "best" (bench_util.h,
 * BENCH_PEER_ALLOCATOR):
 *   f32 best:       OpenBLAS's OpenMP build and tcmalloc preloaded, OPENBLAS_CORETYPE/L2_SIZE unset
 *   f32 as given:   OpenBLAS's OpenMP build preloaded, environment as given
 *   bf16 best:      bf16 frozen weights, torch.autocast(bf16), tcmalloc preloaded
 * PyTorch's best is the faster of f32 best and bf16 best (issue 16's
 * targets: ours >= 1.5x its tok/s, <= 0.5x its peak memory, for our bf16
 * row: what the planner trains a bf16 model in on any CPU). Where
 * ANYTUNE_CPU_ISA holds our kernels to AVX2 on an AVX-512 CPU, the
 * libraries on both sides are held to AVX2 as well (ours:
 * bench_libraries_at_our_level; PyTorch's kernels and libraries:
 * bench_peer_isa_env), so the ratio is the one an AVX2 machine would show.
 * Both sides: median of --steps steps after one warm-up step. On a shared
 * machine wall time depends on the other load; each row also shows the rate
 * from the process's CPU time (tokens / (CPU seconds per step / threads)),
 * an estimate of the rate on idle cores, and ratios by both. Run with
 * The bench sets its threads up as the CLI does (at_threads_setup: passive
 * OpenMP waiting unless OMP_WAIT_POLICY is set), so it measures what users
 * get; the PyTorch peer inherits the environment (spinning threads waste
 * the slices of descheduled ones on a busy machine).
 * After the formats, the first one runs again while another process keeps
 * one core busy (a spinning loop): the target is >= 40% of its quiet
 * throughput (--no-load skips it).
 *
 * FLOPs per trained token (BENCHMARKING.md): 6·N_lora + 4·N_frozen +
 * 12·L·T·(H·D), N_frozen counting every frozen matmul weight, the lm_head
 * even when tied. The matmul peak is at_cpu_gemm on a 2048³ problem
 * (bf16 × bf16 → f32, and f32), measured in the same run; rows give the
 * share of the faster of the two.
 *
 *   bench_train [--shape small|qwen|vision|all] [--steps N] [--formats f32,bf16,qlora-nf4,qlora-q8_0]
 *               [--no-torch] [--checkpointing] [--no-peak] [--no-load]
 * (--no-peak skips the GEMM peak measurement, for profiling the steps alone)
 *
 * Environment: ANYTUNE_PYTHON (default /usr/bin/python3, Debian's, which
 * has torch), ANYTUNE_OPENBLAS_OPENMP_DIR (the folder of the OpenMP build's
 * libblas.so.3; default: the Debian multiarch location when present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/progress.h"
#include "base/threads.h"
#include "bench_util.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/gemm.h"
#include "model/adapter.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "train/optimizer.h"
#include "train_vision.h"

enum { F_F32, F_BF16, F_NF4, F_Q8, F_COUNT };
static const char *FORMAT_NAMES[F_COUNT] = {"f32", "bf16", "qlora-nf4", "qlora-q8_0"};

#define RANK BENCH_LORA_RANK
#define ALPHA BENCH_LORA_ALPHA
#define DROPOUT BENCH_LORA_DROPOUT

/* CPU seconds of this process, every thread. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Threads both sides use: OpenMP's default here, torch.set_num_threads(2) there. */
static int n_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Resets VmHWM to the current resident size (Linux clear_refs 5). */
static int reset_hwm(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* ---- children ------------------------------------------------------------------- */

typedef struct {
    int ok;
    double tok_s, median_s, loss0;
    double cpu_s;           /* median CPU seconds per step (every thread) */
    double steps_peak_mib;  /* VmHWM of the training steps (reset after setup), -1 when unknown */
    double weights_mib;     /* bytes of every weight tensor */
    double quant_bpp;       /* bytes per quantized parameter (qlora) */
    double peak_mib;        /* whole child: ru_maxrss (filled by the parent) */
    double gflops_bf16, gflops_f32; /* the GEMM peak child */
    int skipped;            /* not run by design (err says why), not failed */
    char err[256];
} result;

/* Runs fn(arg, r) in a child process; r comes back through a pipe, with
 * the child's peak resident memory. */
static result in_child(void (*fn)(const void *, result *), const void *arg)
{
    result r;
    memset(&r, 0, sizeof r);
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(r.err, sizeof r.err, "pipe failed");
        return r;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        result c;
        memset(&c, 0, sizeof c);
        fn(arg, &c);
        ssize_t w = write(fd[1], &c, sizeof c);
        close(fd[1]);
        _exit(w == (ssize_t)sizeof c ? 0 : 1);
    }
    close(fd[1]);
    size_t got = 0;
    while (pid > 0 && got < sizeof r) {
        ssize_t n = read(fd[0], (char *)&r + got, sizeof r - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (pid < 0 || wait4(pid, &status, 0, &ru) < 0 || got != sizeof r || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        if (!r.err[0]) snprintf(r.err, sizeof r.err, "child failed (status %d)", status);
        r.ok = 0;
        return r;
    }
    r.peak_mib = (double)ru.ru_maxrss / 1024.0;
    return r;
}

static double gemm_rate(at_dtype t)
{
    const int64_t n = 2048;
    size_t es = t == AT_F32 ? 4 : 2;
    void *a = calloc((size_t)(n * n), es), *b = calloc((size_t)(n * n), es);
    float *c = calloc((size_t)(n * n), sizeof(float));
    double best = 0;
    if (a && b && c) {
        if (t == AT_F32) {
            for (int64_t i = 0; i < n * n; i++) ((float *)a)[i] = 0.5f, ((float *)b)[i] = 0.25f;
        } else {
            for (int64_t i = 0; i < n * n; i++)
                ((uint16_t *)a)[i] = at_f32_to_bf16(0.5f), ((uint16_t *)b)[i] = at_f32_to_bf16(0.25f);
        }
        double ts[5];
        for (int i = 0; i < 6; i++) {
            double t0 = at_now_seconds();
            at_cpu_gemm(0, 1, n, n, n, 1.0f, a, t, n, b, t, n, 0.0f, c, AT_F32, n);
            if (i > 0) ts[i - 1] = at_now_seconds() - t0;
        }
        /* the fastest run: the machine may be shared, and the peak is what the engine can do */
        qsort(ts, 5, sizeof ts[0], bench_cmp_double);
        best = 2.0 * (double)n * n * n / ts[0] / 1e9;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

static void gemm_child(const void *arg, result *r)
{
    (void)arg;
    r->gflops_bf16 = gemm_rate(AT_BF16);
    r->gflops_f32 = gemm_rate(AT_F32);
    r->ok = r->gflops_bf16 > 0;
}

typedef struct {
    const bench_shape *s;
    int format, steps, checkpointing;
} job;

static size_t weights_bytes(const at_decoder_weights *w)
{
    size_t n = at_tensor_nbytes(w->embed) + at_tensor_nbytes(w->final_norm);
    if (w->lm_head != w->embed) n += at_tensor_nbytes(w->lm_head);
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) {
        const at_layer_weights *L = &w->layers[l];
        const at_tensor *all[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv,
                                  L->bo, L->q_norm, L->k_norm, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) n += at_tensor_nbytes(all[i]);
    }
    return n;
}

/* Our training step on one shape and format (in a child). */
static void ours_child(const void *arg, result *r)
{
    const job *j = arg;
    const bench_shape *s = j->s;
    at_decoder_weights *w = NULL;
    bench_lora b = {0};
    int n = s->batch * s->seq;
    double *ts = malloc(2 * (size_t)j->steps * sizeof *ts), *cs = ts ? ts + j->steps : NULL;
    at_status st = bench_random_weights_std(s, NULL, j->format == F_F32 ? AT_F32 : AT_BF16, BENCH_INIT_STD, &w);
    if (st == AT_OK && (j->format == F_NF4 || j->format == F_Q8)) {
        at_quant_stats qs;
        st = at_decoder_weights_quantize(w, j->format == F_NF4 ? AT_QUANT_NF4 : AT_QUANT_Q8_0, &qs);
        r->quant_bpp = qs.params ? (double)qs.bytes / (double)qs.params : 0;
    }
    if (st == AT_OK) r->weights_mib = (double)weights_bytes(w) / 1048576.0;
    if (st == AT_OK) st = bench_lora_new(&b, w, s, j->checkpointing);
    else at_decoder_weights_free(w);
    int hwm = st == AT_OK && reset_hwm();
    for (int i = 0; st == AT_OK && i <= j->steps; i++) { /* step 0 warms up */
        double t0 = at_now_seconds(), c0 = cpu_now();
        at_loss_stats ls = {0};
        st = bench_lora_step(&b, i, &ls);
        if (i == 0) r->loss0 = ls.n_targets ? ls.loss_sum / (double)ls.n_targets : NAN;
        else ts[i - 1] = at_now_seconds() - t0, cs[i - 1] = cpu_now() - c0;
        if (st == AT_OK && !isfinite(ls.loss_sum)) {
            snprintf(r->err, sizeof r->err, "non-finite loss at step %d", i);
            st = AT_ERR_INTERNAL;
        }
    }
    if (st == AT_OK) {
        r->median_s = bench_median(ts, j->steps);
        r->cpu_s = bench_median(cs, j->steps);
        r->tok_s = (double)n / r->median_s;
        r->steps_peak_mib = hwm ? bench_peak_rss_mib() : -1;
        r->ok = 1;
    } else if (!r->err[0]) {
        snprintf(r->err, sizeof r->err, "%s", at_last_error());
    }
    free(ts);
    bench_lora_free(&b);
}

/* ---- PyTorch ---------------------------------------------------------------------- */

/* mode: 0 f32 best, 1 f32 as given, 2 bf16 best */
static result run_torch(const bench_shape *s, int mode, int steps)
{
    result r;
    memset(&r, 0, sizeof r);
    char pre[2048], shape[512], cmd[4096];
    if (mode == 2 && bench_isa_lowered_to_avx2()) {
        /* PyTorch sends bf16 products to oneDNN after reading the CPU, not
         * the cap, and oneDNN held to AVX2 has none: the call fails. On an
         * AVX2 machine it takes ATen's own bf16 kernels instead, at 12 tok/s
         * against f32's 387 on issue 16's small shape, never the best. */
        snprintf(r.err, sizeof r.err, "not run at the AVX2 level (no bf16 hardware there; f32 is PyTorch's best)");
        r.skipped = 1;
        return r;
    }
    static const int how[3] = {BENCH_PEER_LIBS_BEST | BENCH_PEER_ALLOCATOR, BENCH_PEER_AS_GIVEN, BENCH_PEER_ALLOCATOR};
    bench_cpu_peer_prefix(how[mode], pre, sizeof pre);
    bench_shape_args(s, shape, sizeof shape);
    snprintf(cmd, sizeof cmd,
             "%s '%s/tools/bench_train_torch.py' %s --rank %d --alpha %g --dropout %g --mode %s --steps %d", pre,
             AT_SOURCE_DIR, shape, RANK, ALPHA, DROPOUT, mode == 2 ? "bf16" : "f32", steps);
    cJSON *j = bench_run_peer(cmd, &r.tok_s, &r.median_s, r.err, sizeof r.err);
    if (j) {
        r.peak_mib = bench_json_num(j, "peak_rss_mib", -1);
        r.loss0 = bench_json_num(j, "loss0", NAN);
        r.cpu_s = bench_json_num(j, "cpu_s", 0);
        r.steps_peak_mib = -1;
        r.ok = 1;
    }
    cJSON_Delete(j);
    return r;
}

/* ---- report ------------------------------------------------------------------------ */

/* Tokens per second had the process had its threads' cores to itself:
 * tokens / (CPU seconds per step / threads). */
static double cpu_tok_s(const result *r)
{
    return r->cpu_s > 0 ? r->tok_s * r->median_s / (r->cpu_s / n_threads()) : 0;
}

static void print_row(const char *who, const result *r, double flops_tok, double peak)
{
    if (!r->ok) {
        printf("  %-22s %s%s\n", who, r->skipped ? "" : "failed: ", r->err);
        return;
    }
    double gf = r->tok_s * flops_tok / 1e9;
    printf("  %-22s %8.1f tok/s  %7.3f s/step  %7.1f GFLOP/s", who, r->tok_s, r->median_s, gf);
    if (peak > 0) printf(" %5.1f%% of peak", 100.0 * gf / peak);
    if (r->cpu_s > 0) printf("  [cpu-time %7.1f tok/s]", cpu_tok_s(r));
    printf("  peak %6.0f MiB", r->peak_mib);
    if (r->steps_peak_mib > 0) printf(" (steps %6.0f)", r->steps_peak_mib);
    printf("  loss0 %.4f", r->loss0);
    if (r->weights_mib > 0) printf("  weights %.0f MiB", r->weights_mib);
    if (r->quant_bpp > 0) printf(" (%.4f B/param quantized)", r->quant_bpp);
    printf("\n");
}

static void ratio(const char *what, const result *ours, const result *ref, double target)
{
    if (!ref->ok || ref->tok_s <= 0) return;
    double x = ours->tok_s / ref->tok_s;
    printf("    %-34s %5.2fx", what, x);
    if (target > 0) printf("  (target >= %.1fx: %s)", target, x >= target ? "met" : "NOT met");
    if (cpu_tok_s(ours) > 0 && cpu_tok_s(ref) > 0) printf("   by CPU time %5.2fx", cpu_tok_s(ours) / cpu_tok_s(ref));
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *which = "all", *formats = "f32,bf16,qlora-nf4,qlora-q8_0";
    at_threads_setup(argv);
    int steps = 5, torch = 1, ckpt = 0, gemm_peak = 1, load = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_libraries_at_our_level(argv, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) which = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--formats") == 0 && i + 1 < argc) formats = argv[++i];
        else if (strcmp(argv[i], "--no-torch") == 0) torch = 0;
        else if (strcmp(argv[i], "--checkpointing") == 0) ckpt = 1;
        else if (strcmp(argv[i], "--no-peak") == 0) gemm_peak = 0; /* profiling the steps alone */
        else if (strcmp(argv[i], "--no-load") == 0) load = 0;
        else {
            fprintf(stderr,
                    "usage: %s [--shape small|qwen|vision|all] [--steps N] [--formats f32,bf16,qlora-nf4,qlora-q8_0] "
                    "[--no-torch] [--checkpointing] [--no-peak] [--no-load]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    int want[F_COUNT] = {0};
    for (int f = 0; f < F_COUNT; f++) {
        const char *p = strstr(formats, FORMAT_NAMES[f]);
        size_t n = strlen(FORMAT_NAMES[f]);
        /* whole items only ("f32" is not part of another name here) */
        while (p && !((p == formats || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))) p = strstr(p + 1, FORMAT_NAMES[f]);
        want[f] = p != NULL;
    }
    double la[3] = {0};
    if (getloadavg(la, 3) > 0) printf("load average at start: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
    printf("CPU: %s, ISA level %s%s\n", at_cpu_get_features()->model, at_cpu_isa_name(at_cpu_isa_level()),
           bench_isa_lowered_to_avx2() ? "; PyTorch held to AVX2 too (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, "
                                         "OPENBLAS_CORETYPE), as on an AVX2 machine"
                                       : "");
    result gp;
    memset(&gp, 0, sizeof gp);
    if (gemm_peak) gp = in_child(gemm_child, NULL);
    /* the peak: the faster format (bf16 is emulated, and slower, below vdpbf16ps) */
    double peak = !gp.ok ? 0 : gp.gflops_bf16 > gp.gflops_f32 ? gp.gflops_bf16 : gp.gflops_f32;
    printf("GEMM engine (at_cpu_gemm, 2048^3, C f32, best of 5): bf16 %.0f GFLOP/s (%s), f32 %.0f GFLOP/s (%s)\n", gp.gflops_bf16,
           at_cpu_gemm_engine(AT_BF16), gp.gflops_f32, at_cpu_gemm_engine(AT_F32));
    for (size_t k = 0; k < BENCH_N_SHAPES; k++) {
        const bench_shape *s = &BENCH_SHAPES[k];
        if (strcmp(which, "all") != 0 && strncmp(s->name, which, strlen(which)) != 0) continue;
        double nl, nf, fl = bench_flops_per_token(s, RANK, &nl, &nf);
        printf("\n%s: hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d%s%s; batch %d x seq %d; LoRA r=%d "
               "alpha %g dropout %g on all 7 linear layers (%.2fM params), frozen matmul weights %.1fM; %.3f GFLOP "
               "per token; median of %d steps after 1 warm-up%s\n",
               s->name, s->hidden, s->inter, s->layers, s->heads, s->kv_heads, s->vocab, s->tied ? ", tied" : "",
               s->qkv_bias ? ", qkv bias" : "", s->batch, s->seq, RANK, ALPHA, DROPOUT, nl / 1e6, nf / 1e6, fl / 1e9,
               steps, ckpt ? "; gradient checkpointing" : "");
        result t[3];
        memset(t, 0, sizeof t);
        static const char *tn[3] = {"torch f32 (best)", "torch f32 (as given)", "torch bf16 (best)"};
        for (int m = 0; m < 3; m++) {
            if (torch) {
                t[m] = run_torch(s, m, steps);
                print_row(tn[m], &t[m], fl, peak);
            } else {
                snprintf(t[m].err, sizeof t[m].err, "not run (--no-torch)");
            }
        }
        /* PyTorch's best on this CPU: the faster of f32 best and bf16 best */
        int tb = t[0].ok && (!t[2].ok || t[0].tok_s >= t[2].tok_s) ? 0 : t[2].ok ? 2 : -1;
        result o[F_COUNT];
        memset(o, 0, sizeof o);
        for (int f = 0; f < F_COUNT; f++) {
            if (!want[f]) continue;
            job j = {s, f, steps, ckpt};
            o[f] = in_child(ours_child, &j);
            char who[64];
            snprintf(who, sizeof who, "anytune %s", FORMAT_NAMES[f]);
            print_row(who, &o[f], fl, peak);
            if (!o[f].ok) continue;
            /* the targets hold for the format anytune trains a bf16 model
             * in by default on every CPU (the planner's: its bf16 weights) */
            if (f == F_BF16 && tb >= 0) {
                char what[64];
                snprintf(what, sizeof what, "vs PyTorch's best (%s)", tn[tb]);
                ratio(what, &o[f], &t[tb], 1.5);
                if (t[tb].peak_mib > 0 && o[f].peak_mib > 0) {
                    double x = o[f].peak_mib / t[tb].peak_mib;
                    printf("    %-34s %5.2fx  (target <= 0.5x: %s)\n", "peak memory vs PyTorch's best", x,
                           x <= 0.5 ? "met" : "NOT met");
                }
            }
            if (f == F_F32) {
                ratio("vs torch f32 (as given)", &o[f], &t[1], 1.5);
                ratio("vs torch f32 (best)", &o[f], &t[0], 1.2);
            } else {
                ratio("vs torch bf16 (best)", &o[f], &t[2], f == F_BF16 ? 2.0 : 0);
                if (f != F_BF16) {
                    ratio("vs anytune bf16 LoRA", &o[f], &o[F_BF16], 0.8);
                    if (o[F_BF16].ok)
                        printf("    %-34s %+.3f%%\n", "first-step loss vs bf16 LoRA",
                               100.0 * (o[f].loss0 - o[F_BF16].loss0) / o[F_BF16].loss0);
                }
            }
        }
        /* under load: the target format (bf16) where it ran, else the first that did */
        int f = o[F_BF16].ok ? F_BF16 : -1;
        for (int k = 0; f < 0 && k < F_COUNT; k++)
            if (o[k].ok) f = k;
        if (load && f >= 0) {
            job j = {s, f, steps, ckpt};
            pid_t busy = bench_busy_start();
            result l = in_child(ours_child, &j);
            bench_busy_stop(busy);
            if (l.ok)
                printf("  anytune %s with one core busy with another process: %.1f tok/s, %.0f%% of quiet (target >= "
                       "40%%)\n", FORMAT_NAMES[f], l.tok_s, 100.0 * l.tok_s / o[f].tok_s);
            else printf("  anytune %s with one core busy: failed: %s\n", FORMAT_NAMES[f], l.err);
        }
    }
    int rc = 0; /* the vision row: bench/train_vision.c */
    if (!strcmp(which, "all") || !strcmp(which, "vision")) rc = bench_train_vision(steps, torch, n_threads());
    if (getloadavg(la, 3) > 0) printf("\nload average at end: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
    return rc;
}
