/* Decoding matmuls with a quantized weight on a CUDA GPU: the fused
 * dequantize-GEMV (src/device/cuda/cuda_qgemv.cu) against the tile path
 * (dequantize a tile of W into scratch, then cuBLAS; cuda_matmul.cu), the
 * latter forced with ANYTUNE_CUDA_NO_QGEMV=1 in the same process.
 *
 *   C [M, N] = A [M, K] · Wᵀ,  W [N, K] in q8_0, q4_0 or nf4,  A and C bf16
 *
 * Layers of Qwen2.5-0.5B (hidden 896, intermediate 4864) and Qwen2.5-7B
 * (hidden 3584, intermediate 18944): q_proj [H, H], gate_proj [I, H],
 * down_proj [H, I]; M = 1 (one token) and 8 (eight sequences decoding at
 * once). The weights are random bytes with sane scales (their values do not
 * matter for the time; nothing is quantized on the host, to keep setup
 * short).
 *
 * Reported per row: microseconds per call (the median of a few timed runs,
 * each a loop of calls between device synchronizations) and GB/s = the bytes
 * a call must move at least (W's quantized bytes + A + C) / time, for both
 * paths, and the speedup. The tile path moves ~4-5 bytes per weight (read
 * the quantized W, write and read the bf16 tile) where the fused one moves
 * ~1.06 (q8_0) or ~0.52-0.56 (nf4, q4_0).
 *
 *   bench_qgemv_gpu [--device cuda|cuda:N] [--models small,7b|tiny] [--ms 20]
 * (--ms: the time a timed run aims at; tiny: a 64 x 128 layer, to check the
 * program under the CUDA emulator:
 *   ANYTUNE_CUDA_EMULATE=build/libanytune_cuda_emu.so build/bench_qgemv_gpu --models tiny)
 * Without a CUDA device it says so and exits with status 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/progress.h"
#include "base/status.h"
#include "device/backend.h"
#include "device/dtype.h"
#include "device/quant.h"
#include "device/registry.h"
#include "device/tensor.h"
#include "ops/ops.h"

typedef struct {
    const char *model, *layer;
    int64_t n, k; /* W [n, k] */
} layer;

static const layer LAYERS[] = {
    {"qwen2.5-0.5b", "q_proj", 896, 896},        {"qwen2.5-0.5b", "gate_proj", 4864, 896},
    {"qwen2.5-0.5b", "down_proj", 896, 4864},    {"qwen2.5-7b", "q_proj", 3584, 3584},
    {"qwen2.5-7b", "gate_proj", 18944, 3584},    {"qwen2.5-7b", "down_proj", 3584, 18944},
    {"tiny", "layer", 64, 128},
};

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }

/* Random bytes in W's layout, with scales in a sane range (and a valid NF4 header). */
static void fill_weight(uint8_t *p, at_dtype t, int64_t n, int64_t k)
{
    size_t nb = at_dtype_bytes(t, n * k);
    for (size_t i = 0; i < nb; i += 8) {
        uint64_t r = rnd();
        memcpy(p + i, &r, nb - i < 8 ? nb - i : 8);
    }
    if (t == AT_Q8_0 || t == AT_Q4_0) {
        size_t bb = t == AT_Q8_0 ? 34 : 18;
        for (size_t b = 0; b < (size_t)(n * k / 32); b++) {
            uint16_t d = at_f32_to_f16(urand(0.001f, 0.01f));
            memcpy(p + b * bb, &d, 2);
        }
        return;
    }
    int64_t nblocks = (n * k + 63) / 64, ngroups = (nblocks + 255) / 256;
    uint32_t hdr[4] = {AT_NF4_MAGIC, 1, 0, (uint32_t)nblocks};
    float offset = 0.02f;
    memcpy(&hdr[2], &offset, 4);
    memcpy(p, hdr, 16);
    size_t a2 = ((size_t)16 + 33 * (size_t)nblocks + 3) / 4 * 4;
    for (int64_t g = 0; g < ngroups; g++) {
        float v = urand(0.001f, 0.01f);
        memcpy(p + a2 + 4 * (size_t)g, &v, 4);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per call of C = A · Wᵀ: the median of 5 runs of `iters` calls. */
static at_status time_calls(at_backend *be, at_tensor *c, const at_tensor *a, const at_tensor *w, double ms,
                            double *out)
{
    AT_TRY(at_matmul(c, a, w, 0, 1, 1.0f, 0.0f)); /* warm-up: scratch, cuBLAS handles */
    AT_TRY(be->synchronize(be));
    double t0 = at_now_seconds();
    AT_TRY(at_matmul(c, a, w, 0, 1, 1.0f, 0.0f));
    AT_TRY(be->synchronize(be));
    double one = at_now_seconds() - t0;
    int iters = one > 0 ? (int)(ms * 1e-3 / one) : 1000;
    if (iters < 3) iters = 3;
    if (iters > 2000) iters = 2000;
    double runs[5];
    for (int r = 0; r < 5; r++) {
        t0 = at_now_seconds();
        for (int i = 0; i < iters; i++) AT_TRY(at_matmul(c, a, w, 0, 1, 1.0f, 0.0f));
        AT_TRY(be->synchronize(be));
        runs[r] = (at_now_seconds() - t0) / iters;
    }
    qsort(runs, 5, sizeof runs[0], cmp_double);
    *out = runs[2];
    return AT_OK;
}

/* Times W [n, k] of format qt (random bytes, uploaded once) at each M of ms_rows. */
static at_status bench_layer(at_backend *be, const layer *L, at_dtype qt, const int64_t *ms_rows, int n_ms, double ms)
{
    at_status st = AT_OK;
    at_tensor *w = NULL, *a = NULL, *c = NULL;
    const int64_t wsh[2] = {L->n, L->k};
    size_t wb = at_dtype_bytes(qt, (size_t)(L->n * L->k)), ab = (size_t)(8 * L->k * 2);
    uint8_t *host = malloc(wb > ab ? wb : ab);
    if (!host) {
        st = at_error(AT_ERR_NOMEM, "bench_qgemv_gpu: %zu bytes for %s", wb, L->layer);
        goto done;
    }
    if ((st = at_tensor_new(be, qt, 2, wsh, "W", &w)) != AT_OK) goto done;
    fill_weight(host, qt, L->n, L->k);
    if ((st = at_tensor_upload(w, host, wb)) != AT_OK) goto done;
    for (int r = 0; r < n_ms; r++) {
        int64_t m = ms_rows[r];
        const int64_t ash[2] = {m, L->k}, csh[2] = {m, L->n};
        if ((st = at_tensor_new(be, AT_BF16, 2, ash, "A", &a)) != AT_OK) goto done;
        if ((st = at_tensor_new(be, AT_BF16, 2, csh, "C", &c)) != AT_OK) goto done;
        for (int64_t i = 0; i < m * L->k; i++) ((uint16_t *)host)[i] = at_f32_to_bf16(urand(-1, 1));
        if ((st = at_tensor_upload(a, host, (size_t)(m * L->k * 2))) != AT_OK) goto done;
        double t[2];
        for (int path = 0; path < 2; path++) { /* 0: fused GEMV, 1: tiles + cuBLAS */
            setenv("ANYTUNE_CUDA_NO_QGEMV", path ? "1" : "0", 1);
            if ((st = time_calls(be, c, a, w, ms, &t[path])) != AT_OK) goto done;
        }
        double bytes = (double)wb + (double)(m * L->k * 2) + (double)(m * L->n * 2);
        printf("%-13s %-10s %5lld x %-6lld %-5s M=%d  fused %9.1f us %7.1f GB/s   tiles %9.1f us %7.1f GB/s   x%.2f\n",
               L->model, L->layer, (long long)L->n, (long long)L->k, at_dtype_name(qt), (int)m, t[0] * 1e6,
               bytes / t[0] * 1e-9, t[1] * 1e6, bytes / t[1] * 1e-9, t[1] / t[0]);
        at_tensor_free(a);
        at_tensor_free(c);
        a = c = NULL;
    }
done:
    unsetenv("ANYTUNE_CUDA_NO_QGEMV");
    free(host);
    at_tensor_free(w);
    at_tensor_free(a);
    at_tensor_free(c);
    return st;
}

static int wanted(const char *list, const char *model)
{
    if (!strcmp(model, "tiny")) return strstr(list, "tiny") != NULL;
    if (!strcmp(model, "qwen2.5-0.5b")) return strstr(list, "small") != NULL || strstr(list, "0.5b") != NULL;
    return strstr(list, "7b") != NULL;
}

int main(int argc, char **argv)
{
    const char *spec = "cuda", *models = "small,7b";
    double ms = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) spec = argv[++i];
        else if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--device cuda|cuda:N] [--models small,7b|tiny] [--ms 20]\n", argv[0]);
            return 2;
        }
    }
    if (strncmp(spec, "cuda", 4) != 0 || !(ms > 0)) {
        fprintf(stderr, "bench_qgemv_gpu: needs a CUDA device (--device cuda[:N]) and --ms > 0\n");
        return 2;
    }
    at_backend *be = NULL;
    if (at_device_select(spec, &be) != AT_OK) {
        fprintf(stderr, "bench_qgemv_gpu: no usable CUDA device, nothing to measure: %s\n", at_last_error());
        return 1;
    }
    printf("bench_qgemv_gpu on %s: C = A · Wᵀ, A and C bf16; fused dequantize-GEMV vs tiles + cuBLAS "
           "(ANYTUNE_CUDA_NO_QGEMV=1)\n",
           be->name);
    if (strstr(be->name, "emu")) printf("(the CUDA emulator: kernels run on the CPU; the times check the program only)\n");
    static const at_dtype qts[] = {AT_Q8_0, AT_Q4_0, AT_NF4};
    static const int64_t ms_rows[] = {1, 8};
    int rc = 0;
    for (size_t l = 0; l < sizeof LAYERS / sizeof LAYERS[0]; l++) {
        if (!wanted(models, LAYERS[l].model)) continue;
        for (size_t q = 0; q < sizeof qts / sizeof qts[0]; q++)
            if (bench_layer(be, &LAYERS[l], qts[q], ms_rows, 2, ms) != AT_OK) {
                fprintf(stderr, "bench_qgemv_gpu: %s %s: %s\n", LAYERS[l].model, LAYERS[l].layer, at_last_error());
                rc = 1;
            }
    }
    return rc;
}
