/* The decoder against the PyTorch goldens of tools/make_goldens.py (a
 * re-implementation of Hugging Face's Llama / Qwen2 / Qwen3 forward), for
 * every configuration and through every model source: the HF folder, the
 * same weights split into two safetensors shards with an index, and the same
 * weights written as GGUF by our writer and read back. Also: packed
 * sequences (segment ids), the reference-kernel backend, bf16 weights, and
 * errors on bad models and bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "decoder_goldens.h"
#include "device/cpu/cpu_features.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/gguf.h"
#include "model/loader.h"
#include "model/qk_permute.h"
#include "model/safetensors.h"
#include "ops/ops.h"
#include "testing.h"

#define TOL 1e-4       /* f32 end to end */
#define TOL_BF16 3e-2  /* bf16 weights with bf16 matmuls (activations rounded to bf16) */

static char tmp_root[256];

/* ---- running the decoder ---------------------------------------------------- */

/* Training forward over the golden batch; *out = logits [B, T, V] (host). */
static at_status forward_logits(at_decoder *d, const golden *g, const at_tensor *segments, const at_tensor *pos,
                                int B, int T, const int32_t *ids, float **out)
{
    *out = NULL;
    at_status st = AT_OK;
    at_tensor *t_ids = NULL, *logits = NULL;
    at_decoder_acts *acts = NULL;
    int64_t sh[2] = {B, T}, shl[2] = {(int64_t)B * T, g->V};
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &t_ids));
    AT_CHECK(at_tensor_upload(t_ids, ids, (size_t)B * T * sizeof(int32_t)));
    AT_CHECK(at_decoder_acts_new(d, B, T, &acts));
    AT_CHECK(at_decoder_forward(d, acts, t_ids, pos, segments));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, shl, "logits", &logits));
    AT_CHECK(at_decoder_logits(d, logits, &acts->final_norm));
    *out = malloc(at_tensor_nbytes(logits));
    if (!*out) {
        st = at_error(AT_ERR_NOMEM, "oom");
        goto done;
    }
    AT_CHECK(at_tensor_download(logits, *out, at_tensor_nbytes(logits)));
done:
    at_tensor_free(t_ids);
    at_tensor_free(logits);
    at_decoder_acts_free(acts);
    return st;
}

/* Forward of the golden batch; returns the max relative error over the valid
 * positions of both sequences (INFINITY on failure). */
static double golden_forward_err(at_decoder *d, const golden *g)
{
    float *got;
    at_status st = forward_logits(d, g, NULL, NULL, g->B, g->T, g->ids, &got);
    if (st != AT_OK) {
        fprintf(stderr, "forward: %s\n", at_last_error());
        return INFINITY;
    }
    double err = 0;
    for (int b = 0; b < g->B; b++) {
        double e = golden_rel_err_seq(g, b, got, g->T, 0, g->len[b]);
        if (!(e <= err)) err = e;
    }
    free(got);
    return err;
}

/* Prefill of both sequences at once (different lengths) through a fresh KV
 * cache, logits at every position. */
static double golden_prefill_err(at_decoder *d, const golden *g)
{
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    float *got = NULL;
    double err = INFINITY;
    int64_t shl[3] = {g->B, g->T, g->V};
    int n_new[8];
    for (int b = 0; b < g->B; b++) n_new[b] = g->len[b];
    at_status st = at_kv_cache_new(&d->cfg, d->be, AT_F32, g->B, g->T + 4, &c);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 3, shl, "logits", &logits);
    if (st == AT_OK) st = at_decoder_prefill(d, c, g->ids, g->T, n_new, logits, 1);
    if (st == AT_OK) {
        got = malloc(at_tensor_nbytes(logits));
        st = at_tensor_download(logits, got, at_tensor_nbytes(logits));
    }
    if (st == AT_OK) {
        err = 0;
        for (int b = 0; b < g->B; b++) {
            double e = golden_rel_err_seq(g, b, got, g->T, 0, g->len[b]);
            if (!(e <= err)) err = e;
            if (c->len[b] != g->len[b]) err = INFINITY;
        }
    } else {
        fprintf(stderr, "prefill: %s\n", at_last_error());
    }
    free(got);
    at_tensor_free(logits);
    at_kv_cache_free(c);
    return err;
}

static at_status load(const char *path, at_backend *be, at_dtype dt, at_decoder **d)
{
    at_load_options o = at_load_options_default();
    o.backend = be;
    o.dtype = dt;
    return at_decoder_load(path, &o, d);
}

/* ---- writing the golden weights in other layouts -------------------------- */

static at_status copy_file(const char *from, const char *to)
{
    char *text;
    size_t n;
    AT_TRY(at_read_file(from, &text, &n));
    at_status st = at_write_file_atomic(to, text, n);
    free(text);
    return st;
}

/* The golden model split in two shards with model.safetensors.index.json. */
static at_status write_sharded(const char *name, const char *dir)
{
    char src[256], path[1024];
    snprintf(src, sizeof src, GOLDEN_DIR "/%s/model.safetensors", name);
    at_st_file *f = NULL;
    at_tensor **ts = NULL;
    const char **names = NULL;
    cJSON *index = NULL;
    char *text = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_mkdirs(dir));
    AT_CHECK(at_st_open(src, &f));
    size_t n = at_st_count(f);
    ts = calloc(n, sizeof *ts);
    names = calloc(n, sizeof *names);
    if (!ts || !names) {
        st = at_error(AT_ERR_NOMEM, "oom");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const at_st_info *info = at_st_info_at(f, i);
        names[i] = info->name;
        AT_CHECK(at_st_tensor(info, AT_ST_KEEP_DTYPE, &ts[i]));
    }
    const char *shard_names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    size_t half = n / 2;
    snprintf(path, sizeof path, "%s/%s", dir, shard_names[0]);
    AT_CHECK(at_safetensors_write(path, (const at_tensor *const *)ts, names, half, NULL, 0));
    snprintf(path, sizeof path, "%s/%s", dir, shard_names[1]);
    AT_CHECK(at_safetensors_write(path, (const at_tensor *const *)ts + half, names + half, n - half, NULL, 0));
    index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += at_tensor_nbytes(ts[i]);
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    for (size_t i = 0; i < n; i++) cJSON_AddStringToObject(map, names[i], shard_names[i < half ? 0 : 1]);
    text = cJSON_Print(index);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    AT_CHECK(at_write_file_atomic(path, text, strlen(text)));
    snprintf(src, sizeof src, GOLDEN_DIR "/%s/config.json", name);
    snprintf(path, sizeof path, "%s/config.json", dir);
    AT_CHECK(copy_file(src, path));
done:
    if (ts)
        for (size_t i = 0; i < n; i++) at_tensor_free(ts[i]);
    free(ts);
    free(names);
    cJSON_Delete(index);
    free(text);
    at_st_close(f);
    return st;
}

/* The golden model as a GGUF file written by our writer, with llama.cpp's
 * metadata keys and tensor names; q/k rows of arch llama in the interleaved
 * order, as llama.cpp's converter writes them. */
static at_status write_gguf(const char *name, const char *path)
{
    char src[256], key[128];
    snprintf(src, sizeof src, GOLDEN_DIR "/%s", name);
    at_model_config cfg;
    at_st_file *f = NULL;
    at_gguf_writer *w = NULL;
    at_tensor **ts = NULL;
    size_t n = 0;
    at_status st = AT_OK;
    AT_CHECK(at_model_config_load(src, &cfg));
    snprintf(src, sizeof src, GOLDEN_DIR "/%s/model.safetensors", name);
    AT_CHECK(at_st_open(src, &f));
    AT_CHECK(at_gguf_writer_new(&w));
    const char *arch = cfg.model_type; /* llama, qwen2, qwen3 */
    AT_CHECK(at_gguf_add_string(w, "general.architecture", arch));
    AT_CHECK(at_gguf_add_string(w, "general.name", name));
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    AT_CHECK(at_gguf_add_u32(w, KEY("context_length"), (uint32_t)cfg.max_position_embeddings));
    AT_CHECK(at_gguf_add_u32(w, KEY("embedding_length"), (uint32_t)cfg.hidden_size));
    AT_CHECK(at_gguf_add_u32(w, KEY("block_count"), (uint32_t)cfg.num_hidden_layers));
    AT_CHECK(at_gguf_add_u32(w, KEY("feed_forward_length"), (uint32_t)cfg.intermediate_size));
    AT_CHECK(at_gguf_add_u32(w, KEY("attention.head_count"), (uint32_t)cfg.num_attention_heads));
    AT_CHECK(at_gguf_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)cfg.num_key_value_heads));
    AT_CHECK(at_gguf_add_u32(w, KEY("attention.key_length"), (uint32_t)cfg.head_dim));
    AT_CHECK(at_gguf_add_u32(w, KEY("attention.value_length"), (uint32_t)cfg.head_dim));
    AT_CHECK(at_gguf_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)cfg.rms_norm_eps));
    AT_CHECK(at_gguf_add_f32(w, KEY("rope.freq_base"), (float)cfg.rope_theta));
    AT_CHECK(at_gguf_add_u32(w, KEY("vocab_size"), (uint32_t)cfg.vocab_size));
#undef KEY
    int interleave = strcmp(arch, "llama") == 0;
    n = at_st_count(f);
    ts = calloc(n, sizeof *ts);
    if (!ts) {
        st = at_error(AT_ERR_NOMEM, "oom");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const at_st_info *info = at_st_info_at(f, i);
        char gname[160];
        if (!at_gguf_name_from_hf(info->name, gname, sizeof gname)) {
            st = at_error(AT_ERR_INTERNAL, "no GGUF name for %s", info->name);
            goto done;
        }
        /* an owned copy (writable, aligned) */
        at_tensor *view;
        AT_CHECK(at_st_tensor(info, AT_ST_KEEP_DTYPE, &view));
        st = at_tensor_new(at_cpu_backend(), view->dtype, view->ndim, view->shape, gname, &ts[i]);
        if (st == AT_OK) memcpy(at_tensor_data(ts[i]), at_tensor_data(view), at_tensor_nbytes(view));
        at_tensor_free(view);
        if (st != AT_OK) goto done;
        int is_q = strstr(info->name, "q_proj") != NULL, is_k = strstr(info->name, "k_proj") != NULL;
        if (interleave && (is_q || is_k))
            AT_CHECK(at_qk_permute_tensor(ts[i], is_q ? cfg.num_attention_heads : cfg.num_key_value_heads,
                                          AT_QK_TO_INTERLEAVED));
        AT_CHECK(at_gguf_add_at_tensor(w, gname, ts[i]));
    }
    AT_CHECK(at_gguf_write(w, path));
done:
    if (ts)
        for (size_t i = 0; i < n; i++) at_tensor_free(ts[i]);
    free(ts);
    at_gguf_writer_free(w);
    at_st_close(f);
    return st;
}

/* ---- the tests ------------------------------------------------------------ */

typedef struct {
    const char *name;
    int gguf;       /* the config can be expressed in GGUF metadata */
    at_dtype dtype; /* stored dtype */
} config_case;

static const config_case CASES[] = {
    {"llama_gqa", 1, AT_F32},
    {"qwen2_bias_tied", 1, AT_F32},
    {"qwen3_qknorm", 1, AT_F32},
    /* Llama 3 rope scaling has no GGUF metadata: llama.cpp bakes it into a
     * rope_freqs.weight tensor, which the GGUF config reader refuses. */
    {"llama3_rope", 0, AT_F32},
    {"llama_bf16", 1, AT_BF16},
};

/* On a CPU without bf16 products, bf16 weights are widened exactly and the
 * model computes what its f32 copy computes (device/cpu/gemm.h), attention
 * included: the logits of d (the folder at `path` loaded as stored) equal
 * those of the same folder loaded as f32. The same kernels run on the same
 * values, so only a GEMM's engine could change the order of sums (the suite
 * pins ours): 1e-6 of the largest logit. Activations rounded to bf16
 * anywhere would show at ~1e-3. */
static void bf16_as_f32(at_decoder *d, const char *path, const golden *g)
{
    at_decoder *d32 = NULL;
    float *a = NULL, *b = NULL;
    CHECK_OK(load(path, NULL, AT_F32, &d32));
    if (d32) {
        CHECK_OK(forward_logits(d, g, NULL, NULL, g->B, g->T, g->ids, &a));
        CHECK_OK(forward_logits(d32, g, NULL, NULL, g->B, g->T, g->ids, &b));
    }
    if (a && b) {
        size_t n = (size_t)g->B * (size_t)g->T * (size_t)g->V;
        double big = 0, diff = 0;
        for (size_t i = 0; i < n; i++) {
            if (fabs(b[i]) > big) big = fabs(b[i]);
            if (!(fabs((double)a[i] - b[i]) <= diff)) diff = fabs((double)a[i] - b[i]);
        }
        printf("%-16s bf16 as stored vs f32 copy at %s: max diff %.2e of max |logit| %.2f\n", "",
               at_cpu_isa_name(at_cpu_isa_level()), diff, big);
        CHECK_MSG(diff <= 1e-6 * big, "bf16 weights at %s: logits differ from the f32 copy's by %g",
                  at_cpu_isa_name(at_cpu_isa_level()), diff);
    }
    free(a);
    free(b);
    at_decoder_free(d32);
}

static void test_config(const config_case *cc)
{
    golden g;
    CHECK_OK(golden_load(cc->name, &g));
    if (!g.logits) return;
    char path[512];
    snprintf(path, sizeof path, GOLDEN_DIR "/%s", cc->name);
    at_decoder *d = NULL;

    /* HF folder, in f32 */
    CHECK_OK(load(path, NULL, AT_F32, &d));
    if (d) {
        /* RoPE inverse frequencies (rope_scaling included) as HF computes them */
        float inv[256];
        int half = d->cfg.head_dim / 2;
        CHECK(half == g.n_inv);
        CHECK_OK(at_tensor_download(d->inv_freq, inv, (size_t)half * sizeof(float)));
        for (int i = 0; i < half && i < g.n_inv; i++)
            CHECK_NEAR(inv[i], g.inv_freq[i], 1e-6 * fabs(g.inv_freq[i]));
        double e1 = golden_forward_err(d, &g), e2 = golden_prefill_err(d, &g);
        printf("%-16s hf folder f32    forward %.2e  prefill %.2e\n", cc->name, e1, e2);
        CHECK_MSG(e1 < TOL, "%s: forward max rel err %g", cc->name, e1);
        CHECK_MSG(e2 < TOL, "%s: prefill max rel err %g", cc->name, e2);
        at_decoder_free(d);
        d = NULL;
    }

    /* stored dtype kept (bf16 matrices: bf16 matmuls) */
    if (cc->dtype != AT_F32) {
        CHECK_OK(load(path, NULL, AT_LOAD_KEEP_DTYPE, &d));
        if (d) {
            CHECK(d->w->layers[0].wq->dtype == cc->dtype);
            CHECK(d->w->layers[0].attn_norm->dtype == AT_F32);
            double e = golden_forward_err(d, &g);
            printf("%-16s hf folder %-6s forward %.2e\n", cc->name, at_dtype_name(cc->dtype), e);
            CHECK_MSG(e < TOL_BF16, "%s: forward (stored dtype) max rel err %g", cc->name, e);
            if (cc->dtype == AT_BF16 && !at_cpu_fast_bf16()) bf16_as_f32(d, path, &g);
            at_decoder_free(d);
            d = NULL;
        }
    }

    /* two shards + index.json */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s-sharded", tmp_root, cc->name);
    CHECK_OK(write_sharded(cc->name, dir));
    CHECK_OK(load(dir, NULL, AT_F32, &d));
    if (d) {
        double e = golden_forward_err(d, &g);
        printf("%-16s sharded          forward %.2e\n", cc->name, e);
        CHECK_MSG(e < TOL, "%s: sharded forward max rel err %g", cc->name, e);
        at_decoder_free(d);
        d = NULL;
    }

    /* GGUF written by our writer, read back */
    if (cc->gguf) {
        snprintf(dir, sizeof dir, "%s/%s.gguf", tmp_root, cc->name);
        CHECK_OK(write_gguf(cc->name, dir));
        CHECK_OK(load(dir, NULL, AT_F32, &d));
        if (d) {
            double e = golden_forward_err(d, &g);
            printf("%-16s gguf             forward %.2e\n", cc->name, e);
            CHECK_MSG(e < TOL, "%s: gguf forward max rel err %g", cc->name, e);
            at_decoder_free(d);
            d = NULL;
        }
    }
    golden_free(&g);
}

/* The reference kernels (device/ref) run the same decoder to the same goldens. */
static void test_ref_backend(const char *name)
{
    golden g;
    CHECK_OK(golden_load(name, &g));
    char path[512];
    snprintf(path, sizeof path, GOLDEN_DIR "/%s", name);
    at_decoder *d = NULL;
    CHECK_OK(load(path, golden_ref_backend(), AT_F32, &d));
    if (d && g.logits) {
        CHECK(d->w->embed->buf->backend == golden_ref_backend());
        double e1 = golden_forward_err(d, &g), e2 = golden_prefill_err(d, &g);
        printf("%-16s ref kernels      forward %.2e  prefill %.2e\n", name, e1, e2);
        CHECK_MSG(e1 < TOL, "%s on ref kernels: %g", name, e1);
        CHECK_MSG(e2 < TOL, "%s on ref kernels (prefill): %g", name, e2);
    }
    at_decoder_free(d);
    golden_free(&g);
}

/* Both golden sequences packed into one row, kept apart by segment ids and
 * with positions restarting at 0: each must give its own golden logits. */
static void test_packed(const char *name)
{
    golden g;
    CHECK_OK(golden_load(name, &g));
    char path[512];
    snprintf(path, sizeof path, GOLDEN_DIR "/%s", name);
    at_decoder *d = NULL;
    CHECK_OK(load(path, NULL, AT_F32, &d));
    if (!d || !g.logits) {
        at_decoder_free(d);
        golden_free(&g);
        return;
    }
    int T = g.len[0] + g.len[1] + 3; /* 3 tokens of padding in a third segment */
    int32_t *ids = calloc((size_t)T, sizeof *ids), *seg = calloc((size_t)T, sizeof *seg),
            *pos = calloc((size_t)T, sizeof *pos);
    int t = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < g.len[b]; i++, t++) {
            ids[t] = g.ids[(size_t)b * g.T + i];
            seg[t] = b;
            pos[t] = i;
        }
    for (; t < T; t++) {
        ids[t] = 1;
        seg[t] = 7;
        pos[t] = t;
    }
    int64_t sh[2] = {1, T};
    at_tensor *tseg = NULL, *tpos = NULL;
    CHECK_OK(at_tensor_new(d->be, AT_I32, 2, sh, "segments", &tseg));
    CHECK_OK(at_tensor_new(d->be, AT_I32, 2, sh, "pos", &tpos));
    float *got = NULL;
    if (tseg && tpos) {
        CHECK_OK(at_tensor_upload(tseg, seg, (size_t)T * sizeof *seg));
        CHECK_OK(at_tensor_upload(tpos, pos, (size_t)T * sizeof *pos));
        CHECK_OK(forward_logits(d, &g, tseg, tpos, 1, T, ids, &got));
    }
    if (got) {
        double err = 0;
        for (int b = 0, t0 = 0; b < 2; t0 += g.len[b], b++)
            for (int i = 0; i < g.len[b]; i++) {
                double e = golden_rel_err_row(&g, b, i, got + (size_t)(t0 + i) * g.V);
                if (!(e <= err)) err = e;
            }
        printf("%-16s packed segments  forward %.2e\n", name, err);
        CHECK_MSG(err < TOL, "%s packed: %g", name, err);
    }
    free(got);
    free(ids);
    free(seg);
    free(pos);
    at_tensor_free(tseg);
    at_tensor_free(tpos);
    at_decoder_free(d);
    golden_free(&g);
}

/* Bad models and bad input give clear errors, never a crash. */
static void test_errors(void)
{
    at_decoder *d = NULL;
    at_status st = load("tests/data/goldens/no-such-model", NULL, AT_F32, &d);
    CHECK(st != AT_OK && d == NULL);

    /* a config that does not fit the weights: the message names the tensor */
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/bad-config", tmp_root);
    CHECK_OK(at_mkdirs(dir));
    cJSON *cfg = NULL;
    CHECK_OK(at_json_parse_file(GOLDEN_DIR "/llama_gqa/config.json", &cfg));
    if (cfg) {
        cJSON_ReplaceItemInObject(cfg, "intermediate_size", cJSON_CreateNumber(98));
        char *text = cJSON_Print(cfg);
        snprintf(path, sizeof path, "%s/config.json", dir);
        CHECK_OK(at_write_file_atomic(path, text, strlen(text)));
        free(text);
        cJSON_Delete(cfg);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK_OK(copy_file(GOLDEN_DIR "/llama_gqa/model.safetensors", path));
        st = load(dir, NULL, AT_F32, &d);
        CHECK(st == AT_ERR_FORMAT);
        CHECK_MSG(strstr(at_last_error(), "mlp.") != NULL, "message: %s", at_last_error());
        at_decoder_free(d);
        d = NULL;
    }

    /* a missing tensor */
    snprintf(dir, sizeof dir, "%s/missing-tensor", tmp_root);
    CHECK_OK(at_mkdirs(dir));
    {
        at_st_file *f = NULL;
        CHECK_OK(at_st_open(GOLDEN_DIR "/qwen2_bias_tied/model.safetensors", &f));
        if (f) {
            size_t n = at_st_count(f), k = 0;
            at_tensor **ts = calloc(n, sizeof *ts);
            const char **names = calloc(n, sizeof *names);
            for (size_t i = 0; i < n; i++) {
                const at_st_info *info = at_st_info_at(f, i);
                if (strcmp(info->name, "model.layers.1.self_attn.k_proj.bias") == 0) continue;
                names[k] = info->name;
                CHECK_OK(at_st_tensor(info, AT_ST_KEEP_DTYPE, &ts[k]));
                k++;
            }
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            CHECK_OK(at_safetensors_write(path, (const at_tensor *const *)ts, names, k, NULL, 0));
            for (size_t i = 0; i < k; i++) at_tensor_free(ts[i]);
            free(ts);
            free(names);
            at_st_close(f);
        }
        snprintf(path, sizeof path, "%s/config.json", dir);
        CHECK_OK(copy_file(GOLDEN_DIR "/qwen2_bias_tied/config.json", path));
        st = load(dir, NULL, AT_F32, &d);
        CHECK(st == AT_ERR_NOT_FOUND);
        CHECK_MSG(strstr(at_last_error(), "model.layers.1.self_attn.k_proj.bias") != NULL, "message: %s",
                  at_last_error());
        at_decoder_free(d);
        d = NULL;
    }

    /* bad input to a good model */
    CHECK_OK(load(GOLDEN_DIR "/llama_gqa", NULL, AT_F32, &d));
    if (d) {
        at_kv_cache *c = NULL;
        at_tensor *logits = NULL;
        int64_t sh[2] = {1, d->cfg.vocab_size};
        CHECK_OK(at_kv_cache_new(&d->cfg, NULL, AT_F32, 1, 4, &c));
        CHECK_OK(at_tensor_new(d->be, AT_F32, 2, sh, "logits", &logits));
        if (c && logits) {
            int32_t bad[2] = {3, 253}; /* vocab is 253 */
            CHECK_FAILS(at_decoder_prefill(d, c, bad, 2, NULL, logits, 0), AT_ERR_INVALID);
            CHECK(c->len[0] == 0);
            int32_t ok[5] = {1, 2, 3, 4, 5};
            CHECK_FAILS(at_decoder_prefill(d, c, ok, 5, NULL, logits, 0), AT_ERR_INVALID); /* cache holds 4 */
            CHECK_OK(at_decoder_prefill(d, c, ok, 4, NULL, logits, 0));
            CHECK_FAILS(at_decoder_decode_step(d, c, ok, NULL, logits), AT_ERR_INVALID); /* full */
            int64_t shw[2] = {2, d->cfg.vocab_size};
            at_tensor *wrong = NULL;
            CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shw, "wrong", &wrong));
            at_kv_cache_reset(c);
            if (wrong) CHECK_FAILS(at_decoder_prefill(d, c, ok, 2, NULL, wrong, 0), AT_ERR_INVALID);
            at_tensor_free(wrong);
        }
        /* an id outside the vocabulary in the training forward */
        int64_t shi[2] = {1, 2};
        at_tensor *ids = NULL;
        at_decoder_acts *acts = NULL;
        CHECK_OK(at_tensor_new(d->be, AT_I32, 2, shi, "ids", &ids));
        CHECK_OK(at_decoder_acts_new(d, 1, 2, &acts));
        if (ids && acts) {
            int32_t bad[2] = {0, 999};
            CHECK_OK(at_tensor_upload(ids, bad, sizeof bad));
            CHECK(at_decoder_forward(d, acts, ids, NULL, NULL) != AT_OK);
        }
        at_tensor_free(ids);
        at_decoder_acts_free(acts);
        at_tensor_free(logits);
        at_kv_cache_free(c);
        at_decoder_free(d);
    }
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/anytune-test-decoder-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_config(&CASES[i]);
    test_ref_backend("llama_gqa");
    test_ref_backend("qwen3_qknorm");
    test_packed("llama_gqa");
    test_packed("qwen2_bias_tied");
    test_errors();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    return at_test_result("test_decoder");
}
