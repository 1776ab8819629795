/* Prefill throughput of the decoder against PyTorch, in one run.
 *
 * For each shape, random weights are made in-process on both sides (same
 * shapes, not the same values): our decoder with f32 weights and with bf16
 * weights (activations f32, the GEMM engine computes in bf16), and PyTorch
 * (tools/bench_forward_torch.py, HF-style eager forward) started as a
 * subprocess three times:
 *   f32 best:   OpenBLAS OpenMP build and tcmalloc preloaded, OPENBLAS_CORETYPE/L2_SIZE unset
 *   f32 as given: OpenBLAS OpenMP preloaded, environment as given
 *   bf16:       bf16 autocast (oneDNN), tcmalloc preloaded (bench_util.h, BENCH_PEER_ALLOCATOR)
 * (shared BENCHMARKING.md). Both sides prefill B sequences of T tokens and
 * compute logits for the last position only.
 *
 *   bench_forward [--shape small|qwen|all] [--runs N] [--no-torch]
 *
 * Environment: ANYTUNE_PYTHON (default /usr/bin/python3, Debian's, which
 * has torch), ANYTUNE_OPENBLAS_OPENMP_DIR (the folder of the OpenMP build's
 * libblas.so.3; default: the Debian multiarch location when present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/progress.h"
#include "bench_util.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/gemm.h"
#include "model/config.h"
#include "model/decoder.h"
#include "ops/ops.h"

/* FLOPs of one prefill: 2 per weight per token for the layer matmuls, the
 * causal attention (q·k and p·v over T/2 keys on average: 2·T·H·D per token
 * and layer, done as T²/2 pairs), and the head for the last rows only. */
static double prefill_flops(const bench_shape *s)
{
    double D = (double)s->hidden / s->heads, hd = s->hidden;
    double per_layer = hd * s->heads * D * 2 + hd * s->kv_heads * D * 2 + 3.0 * hd * s->inter;
    double tokens = (double)s->batch * s->seq;
    return tokens * 2 * per_layer * s->layers + (double)s->batch * 2 * hd * s->vocab +
           (double)s->layers * s->batch * 2.0 * s->seq * s->seq * s->heads * D;
}

/* Median seconds of one matmul [M, K] · [N, K]ᵀ with B of dtype bt (as the
 * decoder's projections run): the measured peak of the GEMM engine. */
static double matmul_peak_gflops(at_dtype bt)
{
    const int64_t M = 1024, N = 2048, K = 2048;
    at_tensor *a = NULL, *b = NULL, *c = NULL;
    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N};
    double best = 0;
    if (at_tensor_zeros(at_cpu_backend(), AT_F32, 2, sa, "A", &a) == AT_OK &&
        at_tensor_zeros(at_cpu_backend(), bt, 2, sb, "B", &b) == AT_OK &&
        at_tensor_new(at_cpu_backend(), AT_F32, 2, sc, "C", &c) == AT_OK) {
        at_fill(a, 0.5f);
        at_fill(b, 0.25f);
        double t[5];
        for (int i = 0; i < 6; i++) {
            double t0 = at_now_seconds();
            if (at_matmul(c, a, b, 0, 1, 1.0f, 0.0f) != AT_OK) return 0;
            if (i > 0) t[i - 1] = at_now_seconds() - t0;
        }
        best = 2.0 * M * N * K / bench_median(t, 5) / 1e9;
    }
    at_tensor_free(a);
    at_tensor_free(b);
    at_tensor_free(c);
    return best;
}

typedef struct {
    double tok_s, median_s, rss_mib;
    int ok;
} result;

static result run_ours(const bench_shape *s, at_dtype dt, int runs)
{
    result r = {0};
    at_decoder_weights *w = NULL;
    at_decoder *d = NULL;
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    int32_t *ids = malloc((size_t)s->batch * s->seq * sizeof *ids);
    double *t = malloc((size_t)runs * sizeof *t);
    int64_t sl[2] = {s->batch, s->vocab};
    at_status st = bench_random_weights(s, NULL, dt, &w);
    if (st == AT_OK && (st = at_decoder_new(w, &d)) != AT_OK) at_decoder_weights_free(w);
    if (st == AT_OK) st = at_kv_cache_new(&d->cfg, NULL, AT_F32, s->batch, s->seq, &c);
    if (st == AT_OK) st = at_tensor_new(at_cpu_backend(), AT_F32, 2, sl, "logits", &logits);
    bench_token_ids(ids, (int64_t)s->batch * s->seq, s->vocab);
    for (int i = 0; st == AT_OK && i <= runs; i++) { /* run 0 warms up */
        at_kv_cache_reset(c);
        double t0 = at_now_seconds();
        st = at_decoder_prefill(d, c, ids, s->seq, NULL, logits, 0);
        if (i > 0) t[i - 1] = at_now_seconds() - t0;
    }
    if (st == AT_OK) {
        const float *l = at_tensor_data(logits);
        for (int64_t i = 0; i < (int64_t)s->batch * s->vocab; i++)
            if (!isfinite(l[i])) {
                fprintf(stderr, "non-finite logit\n");
                st = AT_ERR_INTERNAL;
                break;
            }
    }
    if (st == AT_OK) {
        r.median_s = bench_median(t, runs);
        r.tok_s = (double)s->batch * s->seq / r.median_s;
        r.rss_mib = bench_peak_rss_mib();
        r.ok = 1;
    } else {
        fprintf(stderr, "ours (%s): %s\n", at_dtype_name(dt), at_last_error());
    }
    free(ids);
    free(t);
    at_tensor_free(logits);
    at_kv_cache_free(c);
    at_decoder_free(d);
    return r;
}

/* mode: 0 f32 best, 1 f32 as given, 2 bf16 best */
static result run_torch(const bench_shape *s, int mode, int runs)
{
    result r = {0};
    char pre[2048], shape[512], cmd[4096];
    static const int how[3] = {BENCH_PEER_LIBS_BEST | BENCH_PEER_ALLOCATOR, BENCH_PEER_AS_GIVEN, BENCH_PEER_ALLOCATOR};
    bench_cpu_peer_prefix(how[mode], pre, sizeof pre);
    bench_shape_args(s, shape, sizeof shape);
    snprintf(cmd, sizeof cmd, "%s '%s/tools/bench_forward_torch.py' %s --mode %s --runs %d", pre, AT_SOURCE_DIR, shape,
             mode == 2 ? "bf16" : "f32", runs);
    char err[256];
    cJSON *j = bench_run_peer(cmd, &r.tok_s, &r.median_s, err, sizeof err);
    if (!j) {
        fprintf(stderr, "%s: %s\n", err, cmd);
        return r;
    }
    r.rss_mib = bench_json_num(j, "peak_rss_mib", -1);
    r.ok = 1;
    cJSON_Delete(j);
    return r;
}

static void line(const char *who, const result *r, double flops, double peak, double ref_tok_s)
{
    if (!r->ok) {
        printf("  %-26s failed\n", who);
        return;
    }
    double gf = flops / r->median_s / 1e9;
    printf("  %-26s %9.1f tok/s  %7.3f s  %7.1f GFLOP/s", who, r->tok_s, r->median_s, gf);
    if (peak > 0) printf("  %5.1f%% of peak", 100.0 * gf / peak);
    else printf("                 ");
    printf("  rss %7.0f MiB", r->rss_mib);
    if (ref_tok_s > 0) printf("  %.2fx", r->tok_s / ref_tok_s);
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *which = "all";
    int runs = 0, torch = 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when piped to a file */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) which = argv[++i];
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-torch") == 0) torch = 0;
        else {
            fprintf(stderr, "usage: %s [--shape small|qwen|all] [--runs N] [--no-torch]\n", argv[0]);
            return 2;
        }
    }
    double peak32 = matmul_peak_gflops(AT_F32), peak16 = matmul_peak_gflops(AT_BF16);
    printf("GEMM engine: f32 %s, bf16 %s; measured peak (1024x2048x2048, activations f32): f32 %.0f GFLOP/s, "
           "bf16 weights %.0f GFLOP/s\n",
           at_cpu_gemm_engine(AT_F32), at_cpu_gemm_engine(AT_BF16), peak32, peak16);
    for (size_t k = 0; k < BENCH_N_SHAPES; k++) {
        const bench_shape *s = &BENCH_SHAPES[k];
        if (strcmp(which, "all") != 0 && strncmp(s->name, which, strlen(which)) != 0) continue;
        int n = runs > 0 ? runs : s->runs;
        double flops = prefill_flops(s);
        printf("\n%s: hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d%s%s; prefill %d x %d tokens, "
               "%.1f GFLOP, median of %d\n",
               s->name, s->hidden, s->inter, s->layers, s->heads, s->kv_heads, s->vocab, s->tied ? ", tied" : "",
               s->qkv_bias ? ", qkv bias" : "", s->batch, s->seq, flops / 1e9, n);
        result t32 = {0}, t32g = {0}, t16 = {0};
        if (torch) {
            t32 = run_torch(s, 0, n);
            t32g = run_torch(s, 1, n);
            t16 = run_torch(s, 2, n);
            line("torch f32 (best)", &t32, flops, 0, 0);
            line("torch f32 (as given)", &t32g, flops, 0, 0);
            line("torch bf16 autocast", &t16, flops, 0, 0);
        }
        result o32 = run_ours(s, AT_F32, n);
        result o16 = run_ours(s, AT_BF16, n);
        line("anytune f32 vs f32 best", &o32, flops, peak32, t32.ok ? t32.tok_s : 0);
        if (t32g.ok) line("anytune f32 vs as given", &o32, flops, peak32, t32g.tok_s);
        line("anytune bf16 vs bf16", &o16, flops, peak16, t16.ok ? t16.tok_s : 0);
    }
    return 0;
}
