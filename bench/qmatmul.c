/* Quantized matmul throughput against the bf16 GEMM on the linear layers of
 * Qwen2.5-0.5B with 512 tokens: the forward x[512, in] · Wᵀ and the input
 * backward dy[512, out] · W, W [out, in] as bf16 (the baseline: at_matmul
 * with a bf16 weight), q8_0, q4_0 and nf4 (at_matmul with the quantized
 * weight). A is bf16 (QLoRA computes in bf16) unless -f32 is given.
 *
 *   bench_qmatmul            all shapes, best of a few runs
 *   bench_qmatmul -f32       A in f32 (f32 compute for every weight)
 *   bench_qmatmul -f32 -i    as inference runs it (at_cpu_qmatmul_inference:
 *                            at the AVX2 level, the forward on int8 activations)
 *   bench_qmatmul -r N       runs per measurement (default 7)
 *   bench_qmatmul -t N       tokens (default 512)
 *   bench_qmatmul -c         time with the process's CPU time (use with
 *                            OMP_NUM_THREADS=1 on a busy machine: time
 *                            slices other processes take do not count)
 *
 * Prints GFLOP/s (2·tokens·in·out per matmul) and the ratio to bf16. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/cpu/gemm.h"
#include "device/quant.h"
#include "ops/ops.h"

static int cpu_clock;

static double now(void)
{
    struct timespec ts;
    clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static at_tensor *new_tensor(at_dtype t, int64_t r, int64_t c, const char *name)
{
    at_tensor *x = NULL;
    if (at_tensor_new(at_cpu_backend(), t, 2, (const int64_t[]){r, c}, name, &x) != AT_OK) {
        fprintf(stderr, "%s\n", at_last_error());
        exit(1);
    }
    return x;
}

static void fill(at_tensor *t, at_rng *r, float scale)
{
    int64_t n = at_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        float v = (float)at_rng_normal(r) * scale;
        if (t->dtype == AT_BF16) ((uint16_t *)at_tensor_data(t))[i] = at_f32_to_bf16(v);
        else ((float *)at_tensor_data(t))[i] = v;
    }
}

/* Best GFLOP/s of `reps` runs after a warm-up. */
static double measure(at_tensor *c, const at_tensor *a, const at_tensor *w, int tb, int reps)
{
    double flops = 2.0 * at_tensor_numel(c) * (tb ? w->shape[1] : w->shape[0]);
    if (at_matmul(c, a, w, 0, tb, 1.0f, 0.0f) != AT_OK) {
        fprintf(stderr, "%s\n", at_last_error());
        exit(1);
    }
    double best = 0;
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        at_matmul(c, a, w, 0, tb, 1.0f, 0.0f);
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv)
{
    int reps = 7, tokens = 512;
    at_dtype adt = AT_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f32")) adt = AT_F32;
        else if (!strcmp(argv[i], "-c")) cpu_clock = 1;
        else if (!strcmp(argv[i], "-i")) at_cpu_qmatmul_inference(1);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_qmatmul [-f32] [-i] [-c] [-r N] [-t tokens]\n");
            return 2;
        }
    }
    static const struct { const char *name; int64_t in, out; } shapes[] = {
        {"gate/up 896->4864", 896, 4864},
        {"down 4864->896", 4864, 896},
        {"q/o 896->896", 896, 896},
        {"k/v 896->128", 896, 128},
    };
    const at_dtype qts[] = {AT_Q8_0, AT_Q4_0, AT_NF4};
    printf("CPU %s, ISA %s, A %s, %d tokens; GFLOP/s (ratio to the bf16 weight)\n", at_cpu_get_features()->model,
           at_cpu_isa_name(at_cpu_isa_level()), at_dtype_name(adt), tokens);
    printf("%-22s %-8s %10s %18s %18s %18s\n", "shape", "pass", "bf16", "q8_0", "q4_0", "nf4");
    at_rng r;
    at_rng_seed(&r, 1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t in = shapes[s].in, out = shapes[s].out;
        at_tensor *wf = new_tensor(AT_F32, out, in, "w"), *wb = new_tensor(AT_BF16, out, in, "w.bf16");
        fill(wf, &r, 0.02f);
        at_cast(wb, wf);
        at_tensor *wq[3];
        for (int q = 0; q < 3; q++) {
            wq[q] = new_tensor(qts[q], out, in, "w.q");
            if (at_quantize(wq[q], wf) != AT_OK) {
                fprintf(stderr, "%s\n", at_last_error());
                return 1;
            }
        }
        for (int tb = 1; tb >= 0; tb--) {
            int64_t k = tb ? in : out, n = tb ? out : in;
            at_tensor *a = new_tensor(adt, tokens, k, "a"), *c = new_tensor(AT_F32, tokens, n, "c");
            fill(a, &r, 1.0f);
            double base = measure(c, a, wb, tb, reps);
            printf("%-22s %-8s %10.1f", shapes[s].name, tb ? "forward" : "dx", base);
            for (int q = 0; q < 3; q++) {
                double g = measure(c, a, wq[q], tb, reps);
                printf(" %10.1f (%4.2f)", g, g / base);
            }
            printf("\n");
            fflush(stdout);
            at_tensor_free(a);
            at_tensor_free(c);
        }
        for (int q = 0; q < 3; q++) at_tensor_free(wq[q]);
        at_tensor_free(wf);
        at_tensor_free(wb);
    }
    return 0;
}
