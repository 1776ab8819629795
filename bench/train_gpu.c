/* LoRA training throughput on a CUDA GPU against PyTorch + PEFT on the same
 * GPU, in one run (issue 10).
 *
 * One training step = forward, loss, backward and the optimizer (global
 * gradient norm, clipping at 1.0, AdamW on the LoRA parameters), as
 * bench/train.c times it on the CPU: LoRA rank 8, alpha 16, dropout 0.05 on
 * q, k, v, o, gate, up, down; random bf16 frozen weights built exactly as
 * bench/train.c builds them (at_decoder_weights_random_hf, seed 1234), LoRA
 * parameters, gradients and AdamW moments f32. Shapes:
 *   qwen         the Qwen2.5-0.5B shape of bench_util.h (tied, q/k/v bias)
 *   mistral-7b   hidden 4096, intermediate 14336, 32 layers, 32/8 heads, vocab 32000
 *   llama2-7b    hidden 4096, intermediate 11008, 32 layers, 32/32 heads, vocab 32000
 *   tiny         hidden 64, intermediate 128, 2 layers, 4/2 heads, vocab 512, seq 32
 *   tiny-qwen    the same, tied and with q/k/v bias (both check the program
 *                under the CUDA emulator; "all" leaves them out)
 * A shape runs only when the planner's estimate of the step (plan/memory.h)
 * fits in the device's memory (--force runs it anyway).
 *
 * The peer: tools/bench_train_torch_gpu.py (the same model written by hand
 * as Hugging Face's Llama / Qwen2, peft's get_peft_model when peft imports,
 * bf16 weights, torch.autocast(bf16), SDPA flash attention, fused AdamW),
 * run as a subprocess BEFORE our side of each shape, so the two never hold
 * GPU memory at the same time. Both sides: the median of --steps steps after
 * --warmup warm-up steps; ours synchronizes the device before each clock
 * reading, the peer calls torch.cuda.synchronize().
 *
 * Reported per side: tokens/s, seconds per step, achieved FLOP/s and MFU =
 * FLOP/s / the device's dense bf16 tensor peak (from a table by device name,
 * or --peak-tflops), peak device memory: ours = the peak of the bytes of
 * tensors allocated through the backend (the backend's alloc/free are
 * wrapped; library scratch and the cuBLAS workspace are not counted), the
 * planner's estimate, and on a real GPU the device memory in use after the
 * steps (cuMemGetInfo through the device probe: CUDA context, cuBLAS
 * workspace and scratch included); the peer's = torch.cuda.max_memory_allocated.
 * FLOPs per trained token (shared BENCHMARKING.md, bench_util.h):
 * 6·N_lora + 4·N_frozen + 12·L·T·(H·D). Then the ratio ours / torch tokens/s
 * against the target 1.0x.
 *
 *   bench_train_gpu [--shape qwen,mistral-7b,llama2-7b,tiny,tiny-qwen|all] [--seq N] [--batch N]
 *                   [--steps N] [--warmup N] [--checkpointing] [--no-torch] [--force]
 *                   [--device cuda|cuda:N] [--torch-device cuda|cpu] [--peak-tflops X]
 *                   [--time-budget SECONDS] [--dry-run]
 * (--dry-run prints the shapes, FLOPs per token and the planner's estimates
 * and runs nothing; --time-budget, default 120, bounds our timed steps per
 * shape: when the first step shows warm-up + steps would take longer, fewer
 * steps are timed, at least 3, and the row says so)
 * Defaults: --shape qwen,mistral-7b --seq 1024 (tiny: 32) --batch 1 --steps 10 --warmup 2.
 *
 * ON THE LENT GPU MACHINE (H200), from the repository root, one line (build
 * the core and the nvcc backend for sm_90 only, then the benchmark: the
 * build took 1.5 minutes on 2 cores here; then about 3-4 minutes for qwen +
 * mistral-7b, most of it setup: our random 7B weights are generated on one
 * host thread, ~1 minute; `--shape qwen` alone takes well under a minute):
 *
 *   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real && cmake --build build-gpu -j16 --target anytune_cuda bench_train_gpu && ./build-gpu/bench_train_gpu --shape qwen,mistral-7b --seq 1024 --steps 10
 *
 * (add --checkpointing for the gradient-checkpointing rows; the peer then
 * checkpoints each decoder layer too.)
 *
 * Here, without a GPU (the emulator runs the CUDA kernels on the CPU; the
 * peer runs on the CPU):
 *   ANYTUNE_CUDA_EMULATE=build/libanytune_cuda_emu.so ANYTUNE_PYTHON=/usr/bin/python3 \
 *       build/bench_train_gpu --shape tiny --steps 2 --warmup 1
 *
 * Environment: ANYTUNE_PYTHON (default: the first of python3, /usr/bin/python3
 * that imports torch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/progress.h"
#include "bench_util.h"
#include "device/backend.h"
#include "device/registry.h"
#include "model/adapter.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "plan/memory.h"
#include "plan/profiles.h"
#include "train/optimizer.h"

#define RANK BENCH_LORA_RANK
#define ALPHA BENCH_LORA_ALPHA
#define DROPOUT BENCH_LORA_DROPOUT
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* The shapes of this benchmark besides bench_util.h's Qwen2.5-0.5B (which
 * is taken from there). seq and batch are overridden by the options. */
static const bench_shape GPU_SHAPES[] = {
    {"mistral-7b", 4096, 14336, 32, 32, 8, 32000, 1024, 1, 0, 0, 1000000.0, 0},
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 1024, 1, 0, 0, 10000.0, 0},
    {"tiny", 64, 128, 2, 4, 2, 512, 32, 1, 0, 0, 10000.0, 0},
    {"tiny-qwen", 64, 128, 2, 4, 2, 512, 32, 1, 1, 1, 1000000.0, 0},
};
#define N_GPU_SHAPES ((int)(sizeof GPU_SHAPES / sizeof GPU_SHAPES[0]))

/* ---- device memory of the tensors: the backend's alloc/free wrapped -------------- */

typedef struct {
    void *p;
    size_t n;
} mem_block;

static struct {
    at_status (*alloc)(at_backend *, size_t, void **);
    void (*free)(at_backend *, void *);
    mem_block *live;
    size_t n_live, cap;
    size_t cur, peak;
} g_mem;

static at_status counting_alloc(at_backend *be, size_t size, void **out)
{
    at_status st = g_mem.alloc(be, size, out);
    if (st != AT_OK) return st;
    if (g_mem.n_live == g_mem.cap) {
        size_t cap = g_mem.cap ? 2 * g_mem.cap : 1024;
        mem_block *nl = realloc(g_mem.live, cap * sizeof *nl);
        if (!nl) return AT_OK; /* counting only: the allocation itself succeeded */
        g_mem.live = nl;
        g_mem.cap = cap;
    }
    g_mem.live[g_mem.n_live++] = (mem_block){*out, size};
    g_mem.cur += size;
    if (g_mem.cur > g_mem.peak) g_mem.peak = g_mem.cur;
    return AT_OK;
}

static void counting_free(at_backend *be, void *ptr)
{
    /* newest first: short-lived buffers are freed soon after they were made */
    for (size_t i = g_mem.n_live; i-- > 0;) {
        if (g_mem.live[i].p != ptr) continue;
        g_mem.cur -= g_mem.live[i].n;
        g_mem.live[i] = g_mem.live[--g_mem.n_live];
        break;
    }
    g_mem.free(be, ptr);
}

/* The benchmark's own instrumentation of the backend it selected: every
 * tensor allocation goes through be->alloc / be->free (device/tensor.c). */
static void count_allocations(at_backend *be)
{
    if (be->alloc == counting_alloc) return;
    g_mem.alloc = be->alloc;
    g_mem.free = be->free;
    be->alloc = counting_alloc;
    be->free = counting_free;
}

/* ---- the device --------------------------------------------------------------------- */

/* Dense bf16 tensor-core peak (FLOP/s, f32 accumulation, no sparsity) by
 * device name; 0 when not in the table. Order matters: the more specific
 * names first. */
static double peak_bf16(const char *model)
{
    static const struct {
        const char *key;
        double flops;
    } table[] = {
        {"H200", 989e12},      {"H100 PCIe", 756e12}, {"H100", 989e12}, {"A100", 312e12},
        {"L40S", 362e12},      {"L40", 181e12},       {"L4", 121e12},   {"RTX 4090", 165e12},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(model, table[i].key)) return table[i].flops;
    return 0;
}

/* Free bytes of device `name` now (cuMemGetInfo through the probe); -1 unknown. */
static int64_t device_free_now(const char *name)
{
    at_device_info *list = NULL;
    int n = 0;
    int64_t fr = -1;
    if (at_devices_probe(&list, &n) != AT_OK) return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i].name, name)) fr = list[i].mem_free;
    free(list);
    return fr;
}

/* ---- our side ------------------------------------------------------------------------- */

typedef struct {
    int ok;
    double tok_s, median_s, loss0;
    double peak_mib;      /* ours: tensors' peak; torch: max_memory_allocated during the steps */
    double in_use_mib;    /* ours: device memory in use after the steps (real GPU), -1 unknown */
    double setup_s;
    char note[256];       /* torch: how the peer was set up */
    char err[320];
} result;

/* budget_s: when the first step shows that warm-up + steps would take
 * longer, fewer steps are timed (at least 3) and the note says so. */
static result run_ours(at_backend *be, const at_device_profile *prof, const bench_shape *s, int steps, int warmup,
                       int ckpt, double budget_s)
{
    result r;
    memset(&r, 0, sizeof r);
    r.in_use_mib = -1;
    at_decoder_weights *w = NULL;
    bench_lora b = {0};
    int n = s->batch * s->seq;
    double *ts = malloc((size_t)steps * sizeof *ts);
    int emulated = strstr(prof->description, "emulator") != NULL;
    int64_t free0 = emulated ? -1 : device_free_now(prof->name);
    g_mem.peak = g_mem.cur;
    size_t base = g_mem.cur;
    double t_setup = at_now_seconds();
    at_status st = ts ? bench_random_weights_std(s, be, AT_BF16, BENCH_INIT_STD, &w) : at_error(AT_ERR_NOMEM, "out of memory");
    /* the step and token stream of bench/train.c; labels = ids (HF's causal LM shifts them) */
    if (st == AT_OK) st = bench_lora_new(&b, w, s, ckpt);
    if (st == AT_OK) st = be->synchronize(be);
    r.setup_s = at_now_seconds() - t_setup;
    for (int i = 0; st == AT_OK && i < warmup + steps; i++) {
        at_loss_stats ls = {0};
        st = be->synchronize(be);
        double t0 = at_now_seconds();
        if (st == AT_OK) st = bench_lora_step(&b, i, &ls);
        if (st == AT_OK) st = be->synchronize(be);
        double dt = at_now_seconds() - t0;
        if (i == 0) r.loss0 = ls.n_targets ? ls.loss_sum / (double)ls.n_targets : NAN;
        if (i == 0 && budget_s > 0 && dt * (warmup + steps) > budget_s && steps > 3) {
            int fit = (int)(budget_s / dt) - warmup;
            int was = steps;
            steps = fit > 3 ? fit : 3;
            if (steps < was)
                snprintf(r.note, sizeof r.note, "%d steps timed instead of %d: the first took %.2f s (--time-budget %g)",
                         steps, was, dt, budget_s);
            else
                steps = was;
        }
        if (i >= warmup) ts[i - warmup] = dt;
        if (st == AT_OK && !isfinite(ls.loss_sum)) {
            snprintf(r.err, sizeof r.err, "non-finite loss at step %d", i);
            st = AT_ERR_INTERNAL;
        }
    }
    if (st == AT_OK) {
        r.median_s = bench_median(ts, steps);
        r.tok_s = (double)n / r.median_s;
        r.peak_mib = (double)(g_mem.peak - base) / MIB;
        int64_t free1 = free0 >= 0 ? device_free_now(prof->name) : -1;
        if (free1 >= 0) r.in_use_mib = (double)(free0 - free1) / MIB;
        r.ok = 1;
    } else if (!r.err[0]) {
        snprintf(r.err, sizeof r.err, "%s", at_last_error());
    }
    free(ts);
    bench_lora_free(&b);
    return r;
}

/* ---- PyTorch + PEFT --------------------------------------------------------------------- */

/* ANYTUNE_PYTHON, else the first of python3 and /usr/bin/python3 that imports torch. */
static const char *python(void)
{
    const char *py = getenv("ANYTUNE_PYTHON");
    if (py && *py) return py;
    static const char *cands[] = {"python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) return cands[i];
    }
    return "python3";
}

static result run_torch(const bench_shape *s, int steps, int warmup, int ckpt, const char *device)
{
    result r;
    memset(&r, 0, sizeof r);
    r.in_use_mib = -1;
    char shape[512], cmd[4096];
    bench_shape_args(s, shape, sizeof shape);
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/tools/bench_train_torch_gpu.py' %s --rank %d --alpha %g --dropout %g --steps %d --warmup %d "
             "--device %s %s",
             python(), AT_SOURCE_DIR, shape, RANK, ALPHA, DROPOUT, steps, warmup, device, ckpt ? "--checkpointing" : "");
    cJSON *j = bench_run_peer(cmd, &r.tok_s, &r.median_s, r.err, sizeof r.err);
    if (j) {
        r.peak_mib = bench_json_num(j, "peak_mem_mib", -1);
        r.loss0 = bench_json_num(j, "loss0", NAN);
        r.setup_s = bench_json_num(j, "setup_s", 0);
        snprintf(r.note, sizeof r.note, "torch %s, %s, %s, %s", bench_json_str(j, "torch", "?"),
                 bench_json_str(j, "lora", "?"), bench_json_str(j, "attention", "?"),
                 bench_json_str(j, "optimizer", "?"));
        r.ok = 1;
    }
    cJSON_Delete(j);
    return r;
}

/* ---- report ------------------------------------------------------------------------------ */

static void print_row(const char *who, const result *r, double flops_tok, double peak)
{
    if (!r->ok) {
        printf("  %-16s failed: %s\n", who, r->err);
        return;
    }
    double fl = r->tok_s * flops_tok;
    printf("  %-16s %10.1f tok/s  %8.4f s/step  %8.3f TFLOP/s  ", who, r->tok_s, r->median_s, fl / 1e12);
    if (peak > 0) printf("MFU %5.1f%%", 100.0 * fl / peak);
    else printf("MFU: unknown peak");
    printf("  peak mem %8.0f MiB", r->peak_mib);
    if (r->in_use_mib >= 0) printf(" (device in use after the steps %.0f MiB)", r->in_use_mib);
    printf("  loss0 %.4f  setup %.1f s\n", r->loss0, r->setup_s);
    if (r->note[0]) printf("  %-16s %s\n", "", r->note);
}

/* Whether `name` is an item of the comma-separated list (or the list is "all"). */
static int wanted(const char *list, const char *name)
{
    if (!strcmp(list, "all")) return strncmp(name, "tiny", 4) != 0;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n)) return 1;
        /* "qwen" names bench_util.h's "qwen2.5-0.5b" */
        if (len >= 4 && !strncmp(name, p, len) && !strncmp(name, "qwen", 4)) return 1;
        p += len;
        p += *p == ',';
    }
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--shape qwen,mistral-7b,llama2-7b,tiny,tiny-qwen|all] [--seq N] [--batch N] [--steps N] [--warmup N]\n"
            "          [--checkpointing] [--no-torch] [--force] [--device cuda|cuda:N] [--torch-device cuda|cpu]\n"
            "          [--peak-tflops X] [--time-budget SECONDS] [--dry-run]\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *which = "qwen,mistral-7b", *spec = "cuda", *torch_dev = NULL;
    int seq = 0, batch = 1, steps = 10, warmup = 2, torch = 1, ckpt = 0, force = 0, dry = 0;
    double peak_tflops = 0, budget = 120;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--shape") && more) which = argv[++i];
        else if (!strcmp(a, "--seq") && more) seq = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && more) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && more) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && more) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--device") && more) spec = argv[++i];
        else if (!strcmp(a, "--torch-device") && more) torch_dev = argv[++i];
        else if (!strcmp(a, "--peak-tflops") && more) peak_tflops = atof(argv[++i]);
        else if (!strcmp(a, "--time-budget") && more) budget = atof(argv[++i]);
        else if (!strcmp(a, "--checkpointing")) ckpt = 1;
        else if (!strcmp(a, "--no-torch")) torch = 0;
        else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--dry-run")) dry = 1; /* shapes, FLOPs and the planner's estimate only */
        else {
            usage(argv[0]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || batch < 1 || seq < 0 || (seq > 0 && seq < 2) || strncmp(spec, "cuda", 4) != 0) {
        usage(argv[0]);
        fprintf(stderr, "(steps >= 1, warmup >= 0, batch >= 1, seq >= 2, a CUDA device)\n");
        return 2;
    }

    /* The device: the profile loads the backend (at_device_select) and probes
     * its name and memory; then every tensor allocation is counted. */
    at_device_profile prof;
    at_backend *be = NULL;
    if (at_device_profile_probe(spec, &prof) != AT_OK || at_device_select(spec, &be) != AT_OK) {
        fprintf(stderr, "bench_train_gpu: %s\n", at_last_error());
        return 1;
    }
    count_allocations(be);
    int emulated = strstr(prof.description, "emulator") != NULL;
    if (!torch_dev) torch_dev = emulated ? "cpu" : "cuda";
    double peak = peak_tflops > 0 ? peak_tflops * 1e12 : peak_bf16(prof.description);
    printf("device %s (%s): %s, %.1f GiB, %.1f GiB free; bf16 dense peak ", be->name, prof.name, prof.description,
           (double)prof.mem_total / GIB, prof.mem_free >= 0 ? (double)prof.mem_free / GIB : NAN);
    if (peak > 0) printf("%.4g TFLOP/s%s\n", peak / 1e12, peak_tflops > 0 ? " (--peak-tflops)" : "");
    else printf("unknown (MFU: unknown peak; give --peak-tflops)\n");
    if (emulated) printf("(the CUDA emulator: kernels run on the CPU, the peer on %s; numbers check the program only)\n", torch_dev);

    /* the shapes asked for, in order: Qwen from bench_util.h, then ours */
    bench_shape shapes[8];
    int n_shapes = 0;
    for (size_t k = 0; k < BENCH_N_SHAPES; k++)
        if (!strncmp(BENCH_SHAPES[k].name, "qwen", 4) && wanted(which, BENCH_SHAPES[k].name)) shapes[n_shapes++] = BENCH_SHAPES[k];
    for (int k = 0; k < N_GPU_SHAPES; k++)
        if (wanted(which, GPU_SHAPES[k].name)) shapes[n_shapes++] = GPU_SHAPES[k];
    if (!n_shapes) {
        fprintf(stderr, "bench_train_gpu: --shape %s names no shape (qwen, mistral-7b, llama2-7b, tiny, tiny-qwen, all)\n", which);
        return 2;
    }
    int all_met = 1, any = 0;
    for (int k = 0; k < n_shapes; k++) {
        bench_shape s = shapes[k];
        s.seq = seq > 0 ? seq : (!strncmp(s.name, "tiny", 4) ? 32 : 1024);
        s.batch = batch;
        double nl, nf, fl = bench_flops_per_token(&s, RANK, &nl, &nf);
        at_model_config cfg;
        bench_make_config(&s, &cfg);
        at_mem_train_request mr = {.cfg = &cfg, .tune = AT_TUNE_LORA, .weight_dtype = AT_BF16, .lora_rank = RANK,
                                   .lora_mask = (1u << AT_MOD_COUNT) - 1, .batch = s.batch, .seq_len = s.seq,
                                   .checkpointing = ckpt, .threads = 1, .runtime_overhead = prof.runtime_overhead};
        at_mem_estimate est;
        at_mem_estimate_train(&mr, &est);
        printf("\n%s: hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d%s%s; batch %d x seq %d; bf16 "
               "frozen weights; LoRA r=%d alpha %g dropout %g on all 7 linear layers (%.2fM params), frozen matmul "
               "weights %.1fM; %.3f GFLOP per token; median of %d steps after %d warm-up%s\n",
               s.name, s.hidden, s.inter, s.layers, s.heads, s.kv_heads, s.vocab, s.tied ? ", tied" : "",
               s.qkv_bias ? ", qkv bias" : "", s.batch, s.seq, RANK, ALPHA, DROPOUT, nl / 1e6, nf / 1e6, fl / 1e9,
               steps, warmup, ckpt ? "; gradient checkpointing" : "");
        printf("  planner's estimate of our step: %.2f GiB (weights %.2f, activations %.2f, logits %.2f, "
               "workspace %.2f)\n",
               (double)est.total / GIB, (double)est.weights / GIB, (double)est.activations / GIB,
               (double)est.logits / GIB, (double)est.workspace / GIB);
        int64_t room = prof.mem_free > 0 ? prof.mem_free : prof.mem_total;
        if (!force && room > 0 && (double)est.total > 0.92 * (double)room) {
            printf("  skipped: the estimate exceeds the device's free memory (%.1f GiB); --force runs it anyway\n",
                   (double)room / GIB);
            continue;
        }
        if (dry) continue;
        result t;
        memset(&t, 0, sizeof t);
        if (torch) {
            t = run_torch(&s, steps, warmup, ckpt, torch_dev);
            print_row("torch+peft", &t, fl, peak);
        }
        result o = run_ours(be, &prof, &s, steps, warmup, ckpt, budget);
        print_row("anytune", &o, fl, peak);
        if (o.ok && t.ok && t.tok_s > 0) {
            double x = o.tok_s / t.tok_s;
            printf("  ours / torch tokens/s: %.2fx  (target 1.0x: %s)%s\n", x, x >= 1.0 ? "met" : "MISSED",
                   strcmp(torch_dev, "cpu") == 0 && !emulated ? "  [peer on the CPU]" : "");
            printf("  first-step loss: ours %.4f, torch %.4f\n", o.loss0, t.loss0);
            all_met &= x >= 1.0;
            any = 1;
        } else {
            all_met = 0;
        }
    }
    if (any) printf("\noverall: target 1.0x %s\n", all_met ? "met on every shape" : "MISSED on some shape");
    free(g_mem.live);
    return 0;
}
