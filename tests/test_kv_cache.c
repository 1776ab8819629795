/* Incremental decoding with the KV cache gives the logits of a full forward:
 * a batch of two sequences of different lengths, prefilled with different
 * prompt lengths and then decoded one token at a time (one of them finishing
 * earlier while the other goes on), compared at every step with the full
 * forward of our decoder and with the PyTorch goldens. Also chunked prefill,
 * slot reuse after reset, a bf16 cache, and the reference-kernel backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "decoder_goldens.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "ops/ops.h"
#include "testing.h"

#define TOL 1e-4
#define TOL_SAME 2e-5 /* incremental vs full forward of our own decoder */

/* Logits [B, T, V] of our full training forward on the golden batch. */
static float *full_forward(at_decoder *d, const golden *g)
{
    at_tensor *ids = NULL, *logits = NULL;
    at_decoder_acts *acts = NULL;
    float *out = NULL;
    int64_t sh[2] = {g->B, g->T}, shl[2] = {(int64_t)g->B * g->T, g->V};
    at_status st = at_tensor_new(d->be, AT_I32, 2, sh, "ids", &ids);
    if (st == AT_OK) st = at_tensor_upload(ids, g->ids, (size_t)g->B * g->T * sizeof(int32_t));
    if (st == AT_OK) st = at_decoder_acts_new(d, g->B, g->T, &acts);
    if (st == AT_OK) st = at_decoder_forward(d, acts, ids, NULL, NULL);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 2, shl, "logits", &logits);
    if (st == AT_OK) st = at_decoder_logits(d, logits, &acts->final_norm);
    if (st == AT_OK && (out = malloc(at_tensor_nbytes(logits))))
        st = at_tensor_download(logits, out, at_tensor_nbytes(logits));
    if (st != AT_OK) {
        fprintf(stderr, "full forward: %s\n", at_last_error());
        free(out);
        out = NULL;
    }
    at_tensor_free(ids);
    at_tensor_free(logits);
    at_decoder_acts_free(acts);
    return out;
}

static double row_err(const float *got, const float *want, int V)
{
    double maxd = 0, maxw = 0;
    for (int v = 0; v < V; v++) {
        double dd = fabs((double)got[v] - (double)want[v]);
        if (!(dd <= maxd)) maxd = dd;
        if (fabs(want[v]) > maxw) maxw = fabs(want[v]);
    }
    return maxw > 0 ? maxd / maxw : maxd;
}

/* Prefill prompt[b] tokens of each sequence, then decode the rest one token
 * per step; a sequence that has all its tokens stops (inactive) while the
 * other continues. Each produced row (logits after token t) is compared with
 * row t of the full forward and of the golden. Returns the two max errors. */
static void incremental(at_decoder *d, const golden *g, const float *full, const int *prompt, at_dtype cache_dtype,
                        double *err_full, double *err_golden)
{
    *err_full = *err_golden = INFINITY;
    int B = g->B, V = g->V;
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    float *host = malloc((size_t)B * V * sizeof *host);
    int32_t *ids = calloc((size_t)B * g->T, sizeof *ids);
    int n_new[8], active[8];
    int64_t sh[2] = {B, V};
    at_status st = at_kv_cache_new(&d->cfg, d->be, cache_dtype, B, g->T, &c);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 2, sh, "logits", &logits);
    int Tp = 0;
    for (int b = 0; b < B; b++) Tp = prompt[b] > Tp ? prompt[b] : Tp;
    /* the prompts, right-padded into [B, Tp] */
    for (int b = 0; b < B; b++) {
        n_new[b] = prompt[b];
        for (int t = 0; t < prompt[b]; t++) ids[(size_t)b * Tp + t] = g->ids[(size_t)b * g->T + t];
    }
    if (st == AT_OK) st = at_decoder_prefill(d, c, ids, Tp, n_new, logits, 0);
    double ef = 0, eg = 0;
    int pos[8];
    for (int b = 0; b < B; b++) pos[b] = prompt[b] - 1; /* the row just produced */
    while (st == AT_OK) {
        st = at_tensor_download(logits, host, (size_t)B * V * sizeof *host);
        if (st != AT_OK) break;
        for (int b = 0; b < B; b++) {
            if (pos[b] < 0 || (pos[b] >= g->len[b])) continue;
            const float *row = host + (size_t)b * V;
            double e1 = row_err(row, full + ((size_t)b * g->T + pos[b]) * V, V);
            double e2 = golden_rel_err_row(g, b, pos[b], row);
            if (!(e1 <= ef)) ef = e1;
            if (!(e2 <= eg)) eg = e2;
        }
        /* next step: sequences with tokens left take their next one */
        int any = 0;
        for (int b = 0; b < B; b++) {
            int next = c->len[b];
            active[b] = next < g->len[b];
            ids[b] = active[b] ? g->ids[(size_t)b * g->T + next] : 0;
            pos[b] = active[b] ? next : -1;
            any |= active[b];
        }
        if (!any) break;
        st = at_decoder_decode_step(d, c, ids, active, logits);
    }
    if (st != AT_OK) {
        fprintf(stderr, "incremental: %s\n", at_last_error());
    } else {
        for (int b = 0; b < B; b++)
            if (c->len[b] != g->len[b]) ef = INFINITY;
        *err_full = ef;
        *err_golden = eg;
    }
    free(host);
    free(ids);
    at_tensor_free(logits);
    at_kv_cache_free(c);
}

/* Prefill in chunks of `chunk` tokens (all positions' logits), both
 * sequences together; compares every row with the full forward. */
static double chunked(at_decoder *d, const golden *g, const float *full, int chunk)
{
    int B = g->B, V = g->V;
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    int64_t sh[3] = {B, chunk, V};
    float *host = malloc((size_t)B * chunk * V * sizeof *host);
    int32_t *ids = calloc((size_t)B * chunk, sizeof *ids);
    at_status st = at_kv_cache_new(&d->cfg, d->be, AT_F32, B, g->T, &c);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 3, sh, "logits", &logits);
    double err = 0;
    for (int t0 = 0; st == AT_OK && t0 < g->T; t0 += chunk) {
        int n_new[8];
        for (int b = 0; b < B; b++) {
            int left = g->len[b] - t0;
            n_new[b] = left <= 0 ? 0 : left < chunk ? left : chunk;
            for (int i = 0; i < n_new[b]; i++) ids[(size_t)b * chunk + i] = g->ids[(size_t)b * g->T + t0 + i];
        }
        st = at_decoder_prefill(d, c, ids, chunk, n_new, logits, 1);
        if (st == AT_OK) st = at_tensor_download(logits, host, at_tensor_nbytes(logits));
        for (int b = 0; st == AT_OK && b < B; b++)
            for (int i = 0; i < n_new[b]; i++) {
                double e = row_err(host + ((size_t)b * chunk + i) * V, full + ((size_t)b * g->T + t0 + i) * V, V);
                if (!(e <= err)) err = e;
            }
    }
    if (st != AT_OK) {
        fprintf(stderr, "chunked: %s\n", at_last_error());
        err = INFINITY;
    }
    free(host);
    free(ids);
    at_tensor_free(logits);
    at_kv_cache_free(c);
    return err;
}

/* A slot is reused after at_kv_cache_reset_seq: sequence 0 is replaced by
 * sequence 1's tokens while sequence 1 keeps its cache; both then give
 * sequence 1's logits. */
static double reuse_slot(at_decoder *d, const golden *g, const float *full)
{
    int B = 2, V = g->V, n = g->len[1] < g->len[0] ? g->len[1] : g->len[0];
    int half = n / 2;
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    int64_t sh[2] = {B, V};
    float host[2 * 1024];
    if (V > 1024) return INFINITY;
    int32_t *ids = calloc((size_t)B * g->T, sizeof *ids);
    at_status st = at_kv_cache_new(&d->cfg, d->be, AT_F32, B, g->T, &c);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 2, sh, "logits", &logits);
    /* sequence 0 gets garbage (sequence 0's own tokens), sequence 1 its first half */
    for (int t = 0; t < half; t++) {
        ids[t] = g->ids[t];
        ids[(size_t)g->T + t] = g->ids[(size_t)g->T + t];
    }
    if (st == AT_OK) st = at_decoder_prefill(d, c, ids, g->T, (int[]){half, half}, logits, 0);
    if (st == AT_OK) {
        at_kv_cache_reset_seq(c, 0);
        /* sequence 0 now takes sequence 1's first half; sequence 1 waits */
        for (int t = 0; t < half; t++) ids[t] = g->ids[(size_t)g->T + t];
        st = at_decoder_prefill(d, c, ids, g->T, (int[]){half, 0}, logits, 0);
    }
    double err = 0;
    for (int t = half; st == AT_OK && t < n; t++) {
        int32_t step[2] = {g->ids[(size_t)g->T + t], g->ids[(size_t)g->T + t]};
        st = at_decoder_decode_step(d, c, step, NULL, logits);
        if (st == AT_OK) st = at_tensor_download(logits, host, (size_t)B * V * sizeof(float));
        for (int b = 0; st == AT_OK && b < B; b++) {
            double e = row_err(host + (size_t)b * V, full + ((size_t)g->T + t) * V, V);
            if (!(e <= err)) err = e;
        }
    }
    if (st != AT_OK) {
        fprintf(stderr, "reuse: %s\n", at_last_error());
        err = INFINITY;
    }
    free(ids);
    at_tensor_free(logits);
    at_kv_cache_free(c);
    return err;
}

static void test_model(const char *name, at_backend *be)
{
    golden g;
    CHECK_OK(golden_load(name, &g));
    char path[256];
    snprintf(path, sizeof path, GOLDEN_DIR "/%s", name);
    at_load_options o = at_load_options_default();
    o.backend = be;
    o.dtype = AT_F32;
    at_decoder *d = NULL;
    CHECK_OK(at_decoder_load(path, &o, &d));
    float *full = d && g.logits ? full_forward(d, &g) : NULL;
    CHECK(full != NULL);
    if (full) {
        const char *bn = be ? be->name : "cpu";
        /* prompts of different lengths (and different from the final lengths) */
        int prompt[2] = {3, g.len[1] > 5 ? 5 : 1};
        double ef, eg;
        incremental(d, &g, full, prompt, AT_F32, &ef, &eg);
        printf("%-16s %-4s incremental  vs full %.2e  vs golden %.2e\n", name, bn, ef, eg);
        CHECK_MSG(ef < TOL_SAME, "%s: incremental vs full forward %g", name, ef);
        CHECK_MSG(eg < TOL, "%s: incremental vs golden %g", name, eg);
        /* decoding from the very first token */
        int one[2] = {1, 1};
        incremental(d, &g, full, one, AT_F32, &ef, &eg);
        printf("%-16s %-4s from token 1 vs full %.2e  vs golden %.2e\n", name, bn, ef, eg);
        CHECK_MSG(ef < TOL_SAME, "%s: token-by-token vs full forward %g", name, ef);
        CHECK_MSG(eg < TOL, "%s: token-by-token vs golden %g", name, eg);
        double e = chunked(d, &g, full, 4);
        printf("%-16s %-4s chunked prefill vs full %.2e\n", name, bn, e);
        CHECK_MSG(e < TOL_SAME, "%s: chunked prefill %g", name, e);
        e = reuse_slot(d, &g, full);
        printf("%-16s %-4s slot reuse      vs full %.2e\n", name, bn, e);
        CHECK_MSG(e < TOL_SAME, "%s: slot reuse %g", name, e);
        /* a bf16 cache rounds keys and values: close, not equal */
        incremental(d, &g, full, prompt, AT_BF16, &ef, &eg);
        printf("%-16s %-4s bf16 cache   vs full %.2e\n", name, bn, ef);
        CHECK_MSG(ef < 2e-2, "%s: bf16 cache %g", name, ef);
    }
    free(full);
    at_decoder_free(d);
    golden_free(&g);
}

int main(void)
{
    test_model("llama_gqa", NULL);
    test_model("qwen2_bias_tied", NULL);
    test_model("qwen3_qknorm", NULL);
    test_model("llama3_rope", NULL);
    test_model("llama_gqa", golden_ref_backend());
    /* cache construction errors */
    at_model_config cfg;
    at_model_config_init(&cfg);
    cfg.num_hidden_layers = 2;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 8;
    at_kv_cache *c = NULL;
    CHECK_FAILS(at_kv_cache_new(&cfg, NULL, AT_F32, 0, 4, &c), AT_ERR_INVALID);
    CHECK_FAILS(at_kv_cache_new(&cfg, NULL, AT_I32, 1, 4, &c), AT_ERR_INVALID);
    CHECK(c == NULL);
    CHECK_OK(at_kv_cache_new(&cfg, NULL, AT_BF16, 3, 5, &c));
    if (c) {
        CHECK(at_kv_cache_bytes(c) == (size_t)2 * 2 * 3 * 5 * 2 * 8 * 2);
        CHECK(c->len[2] == 0);
    }
    at_kv_cache_free(c);
    return at_test_result("test_kv_cache");
}
