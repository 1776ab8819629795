/* What the benchmarks share: the two model shapes the issues name, sorting
 * timings for medians, and the process's peak resident memory. Wall time is
 * at_now_seconds (base/progress.h). */
#ifndef AT_BENCH_UTIL_H
#define AT_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/adapter.h"
#include "model/config.h"

/* A model shape of the benchmarks (random weights of this shape). */
typedef struct {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, vocab, seq, batch, tied, qkv_bias;
    double theta;
    int runs; /* default repetitions of bench/forward */
} bench_shape;

/* The small model and the Qwen2.5-0.5B shape of the models issue. */
static const bench_shape BENCH_SHAPES[] = {
    {"small", 512, 1408, 8, 8, 4, 32000, 256, 4, 0, 0, 10000.0, 5},
    {"qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 512, 1, 1, 1, 1000000.0, 3},
};
#define BENCH_N_SHAPES ((size_t)(sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0]))

/* The config of a shape (llama, or qwen2 with q/k/v bias). */
static inline void bench_make_config(const bench_shape *s, at_model_config *c)
{
    at_model_config_init(c);
    snprintf(c->model_type, sizeof c->model_type, "%s", s->qkv_bias ? "qwen2" : "llama");
    c->hidden_size = s->hidden;
    c->intermediate_size = s->inter;
    c->num_hidden_layers = s->layers;
    c->num_attention_heads = s->heads;
    c->num_key_value_heads = s->kv_heads;
    c->head_dim = s->hidden / s->heads;
    c->vocab_size = s->vocab;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = s->theta;
    c->tie_word_embeddings = s->tied;
    c->attn_qkv_bias = s->qkv_bias;
}

/* FLOPs per trained token of LoRA rank `rank` on all 7 linear modules of
 * shape s (BENCHMARKING.md): 6·N_lora + 4·N_frozen + 12·L·T·(H·D), N_frozen
 * counting every frozen matmul weight, the lm_head even when tied; T =
 * s->seq. The parameter counts behind it go to *n_lora, *n_frozen (either
 * may be NULL). */
static inline double bench_flops_per_token(const bench_shape *s, int rank, double *n_lora, double *n_frozen)
{
    at_model_config c;
    bench_make_config(s, &c);
    double lora = 0, frozen = 0;
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        int64_t in, out;
        at_module_dims(&c, (at_module)m, &in, &out);
        lora += (double)rank * (double)(in + out);
        frozen += (double)in * (double)out;
    }
    lora *= s->layers;
    frozen = frozen * s->layers + (double)s->vocab * s->hidden;
    if (n_lora) *n_lora = lora;
    if (n_frozen) *n_frozen = frozen;
    return 6 * lora + 4 * frozen + 12.0 * s->layers * s->seq * (double)s->heads * c.head_dim;
}

/* qsort comparator of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Peak resident memory of this process so far (VmHWM), MiB; -1 if unknown. */
static inline double bench_peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atof(line + 6);
    fclose(f);
    return kb / 1024.0;
}

#endif
