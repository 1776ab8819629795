/* llama2.c checkpoints: stories260K.bin loads under HF names; its weights equal
 * the GGUF copy's once the q/k permutation rules are applied (cross-checking
 * both readers); and the permuted q/k with HF's rotate_half RoPE give the same
 * attention scores as llama2.c's interleaved RoPE on the raw weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/qk_permute.h"
#include "testing.h"

#define BIN "tests/data/models/stories260K.bin"
#define GGUF "tests/data/models/stories260K.gguf"

static void test_load(const at_llama2c *m)
{
    const at_model_config *c = at_llama2c_config(m);
    CHECK(strcmp(c->model_type, "llama") == 0);
    CHECK(c->hidden_size == 64 && c->intermediate_size == 172 && c->num_hidden_layers == 5);
    CHECK(c->num_attention_heads == 8 && c->num_key_value_heads == 4 && c->head_dim == 8 && c->vocab_size == 512);
    CHECK(c->tie_word_embeddings && c->rope_theta == 10000.0 && c->rms_norm_eps == 1e-5);
    CHECK(at_llama2c_seq_len(m) == 512 && c->max_position_embeddings == 512);
    CHECK(at_llama2c_count(m) == 1 + 5 * 9 + 1);
    CHECK(at_llama2c_find(m, "lm_head.weight") == NULL);
    const at_tensor *t = at_llama2c_find(m, "model.layers.4.self_attn.k_proj.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 32 && t->shape[1] == 64 && t->dtype == AT_F32);
    t = at_llama2c_find(m, "model.layers.2.mlp.down_proj.weight");
    CHECK(t && t->shape[0] == 64 && t->shape[1] == 172);
    t = at_llama2c_find(m, "model.norm.weight");
    CHECK(t && t->ndim == 1 && t->shape[0] == 64);
    CHECK(at_llama2c_find(m, "model.embed_tokens.weight") != NULL);
}

/* Every tensor equals the GGUF's (llama.cpp keeps llama2.c's interleaved q/k
 * order in arch "llama" files, so those are permuted to halves first). */
static void test_matches_gguf(const at_llama2c *m)
{
    at_gguf *g = NULL;
    CHECK_OK(at_gguf_open(GGUF, &g));
    if (!g) return;
    CHECK(at_gguf_qk_interleaved(g) == 1);
    int compared = 0, permuted = 0;
    for (size_t i = 0; i < at_llama2c_count(m); i++) {
        const at_tensor *t = at_llama2c_tensor_at(m, i);
        char gn[128];
        CHECK_MSG(at_gguf_name_from_hf(t->name, gn, sizeof gn), "%s has no GGUF name", t->name);
        const at_gguf_tensor_info *gi = at_gguf_find_tensor(g, gn);
        CHECK_MSG(gi && gi->nbytes == at_tensor_nbytes(t) && gi->type == AT_GGML_F32, "%s", gn);
        if (!gi || gi->nbytes != at_tensor_nbytes(t)) continue;
        const void *want = gi->data;
        void *tmp = NULL;
        int is_q = strstr(t->name, "q_proj") != NULL, is_k = strstr(t->name, "k_proj") != NULL;
        if (is_q || is_k) {
            tmp = malloc(gi->nbytes);
            CHECK_OK(at_qk_permute_rows(tmp, gi->data, t->shape[0], (size_t)t->shape[1] * 4, is_q ? 8 : 4,
                                        AT_QK_TO_HALVES, gn));
            want = tmp;
            /* ... and they really were reordered. */
            CHECK(memcmp(gi->data, at_tensor_data(t), gi->nbytes) != 0);
            permuted++;
        }
        CHECK_MSG(memcmp(want, at_tensor_data(t), gi->nbytes) == 0, "%s differs from %s", t->name, gn);
        free(tmp);
        compared++;
    }
    CHECK(compared == 47 && permuted == 10);
    /* The .bin shares its classifier; the GGUF stores it as output.weight, a copy of the embedding. */
    const at_gguf_tensor_info *out = at_gguf_find_tensor(g, "output.weight");
    const at_tensor *emb = at_llama2c_find(m, "model.embed_tokens.weight");
    CHECK(out && emb && out->nbytes == at_tensor_nbytes(emb) && memcmp(out->data, at_tensor_data(emb), out->nbytes) == 0);
    at_gguf_close(g);
}

/* llama2.c run.c's RoPE on a head-interleaved vector, position pos. */
static void rope_llama2c(float *v, int n, int hs, int pos)
{
    for (int i = 0; i < n; i += 2) {
        int hd = i % hs;
        float freq = 1.0f / powf(10000.0f, hd / (float)hs);
        float val = pos * freq, fcr = cosf(val), fci = sinf(val);
        float v0 = v[i], v1 = v[i + 1];
        v[i] = v0 * fcr - v1 * fci;
        v[i + 1] = v0 * fci + v1 * fcr;
    }
}

/* HF rotate_half RoPE on each head: pairs (j, j + hs/2), angle pos * inv_freq[j]. */
static void rope_hf(float *v, int n, int hs, int pos, const float *inv)
{
    for (int h = 0; h < n / hs; h++)
        for (int j = 0; j < hs / 2; j++) {
            float *a = v + h * hs + j, *b = a + hs / 2;
            float c = cosf(pos * inv[j]), s = sinf(pos * inv[j]);
            float x = *a, y = *b;
            *a = x * c - y * s;
            *b = y * c + x * s;
        }
}

static void matvec(float *y, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[r * cols + c] * x[c];
        y[r] = (float)s;
    }
}

static void test_rope_equivalence(const at_llama2c *m)
{
    /* Raw llama2.c weights straight from the file: wq, wk of layer 0. */
    char *raw = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(BIN, &raw, &len));
    if (!raw) return;
    const int D = 64, V = 512, L = 5, hs = 8, nh = 8, nkv = 4, kvd = 32;
    float *wq = malloc((size_t)D * D * 4), *wk = malloc((size_t)kvd * D * 4);
    memcpy(wq, raw + 28 + 4 * ((size_t)V * D + (size_t)L * D), (size_t)D * D * 4);
    memcpy(wk, raw + 28 + 4 * ((size_t)V * D + (size_t)L * D + (size_t)L * D * D), (size_t)kvd * D * 4);
    const float *x1 = at_tensor_data(at_llama2c_find(m, "model.embed_tokens.weight")) + 65 * D;
    const float *x2 = at_tensor_data(at_llama2c_find(m, "model.embed_tokens.weight")) + 300 * D;
    float inv[4];
    CHECK_OK(at_model_config_rope_inv_freq(at_llama2c_config(m), inv));
    double worst = 0;
    for (int pq = 0; pq < 40; pq += 7)
        for (int pk = 0; pk <= pq; pk += 3) {
            float q1[64], k1[32], q2[64], k2[32];
            matvec(q1, wq, x1, D, D);
            matvec(k1, wk, x2, kvd, D);
            rope_llama2c(q1, D, hs, pq);
            rope_llama2c(k1, kvd, hs, pk);
            matvec(q2, at_tensor_data(at_llama2c_find(m, "model.layers.0.self_attn.q_proj.weight")), x1, D, D);
            matvec(k2, at_tensor_data(at_llama2c_find(m, "model.layers.0.self_attn.k_proj.weight")), x2, kvd, D);
            rope_hf(q2, D, hs, pq, inv);
            rope_hf(k2, kvd, hs, pk, inv);
            for (int h = 0; h < nh; h++) {
                int kh = h / (nh / nkv);
                double s1 = 0, s2 = 0;
                for (int j = 0; j < hs; j++) {
                    s1 += (double)q1[h * hs + j] * k1[kh * hs + j];
                    s2 += (double)q2[h * hs + j] * k2[kh * hs + j];
                }
                double e = fabs(s1 - s2) / (fabs(s1) + 1e-3);
                if (e > worst) worst = e;
            }
        }
    CHECK_MSG(worst < 1e-4, "attention scores differ by %.3g (relative)", worst);
    free(wq);
    free(wk);
    free(raw);
}

static void test_permute_inverse(void)
{
    /* Rows tagged with their index: to-halves then to-interleaved is the identity,
     * and head 0 of 8 rows maps interleaved rows 0,2,4,6 to the first half. */
    int32_t src[16], mid[16], back[16];
    for (int i = 0; i < 16; i++) src[i] = i;
    CHECK_OK(at_qk_permute_rows(mid, src, 16, 4, 2, AT_QK_TO_HALVES, "t"));
    CHECK(mid[0] == 0 && mid[1] == 2 && mid[2] == 4 && mid[3] == 6 && mid[4] == 1 && mid[7] == 7 && mid[8] == 8 &&
          mid[9] == 10);
    CHECK_OK(at_qk_permute_rows(back, mid, 16, 4, 2, AT_QK_TO_INTERLEAVED, "t"));
    CHECK(memcmp(back, src, sizeof src) == 0);
    CHECK(at_qk_permute_rows(back, mid, 15, 4, 2, AT_QK_TO_HALVES, "t") == AT_ERR_INVALID);
    CHECK(at_qk_permute_rows(back, mid, 12, 4, 4, AT_QK_TO_HALVES, "odd head") == AT_ERR_INVALID);
    /* In place on an owned tensor; refused on a wrapped one. */
    at_tensor *t = NULL;
    const int64_t shape[2] = {16, 1};
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_I32, 2, shape, "q", &t));
    if (t) {
        memcpy(at_tensor_data(t), src, sizeof src);
        CHECK_OK(at_qk_permute_tensor(t, 2, AT_QK_TO_HALVES));
        CHECK(memcmp(at_tensor_data(t), mid, sizeof mid) == 0);
        at_tensor_free(t);
    }
    CHECK_OK(at_tensor_wrap(src, AT_I32, 2, shape, "w", &t));
    CHECK(at_qk_permute_tensor(t, 2, AT_QK_TO_HALVES) == AT_ERR_INVALID);
    at_tensor_free(t);
}

static void test_bad_files(void)
{
    char *raw = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(BIN, &raw, &len));
    if (!raw) return;
    at_llama2c *m = NULL;
    CHECK(at_llama2c_parse(raw, 20, "short", &m) == AT_ERR_FORMAT && strstr(at_last_error(), "28-byte"));
    CHECK(at_llama2c_parse(raw, len - 4, "cut", &m) == AT_ERR_FORMAT && strstr(at_last_error(), "implies"));
    int32_t *h = (int32_t *)raw;
    h[5] = -512; /* claims an unshared classifier that is not there */
    CHECK(at_llama2c_parse(raw, len, "unshared", &m) == AT_ERR_FORMAT && strstr(at_last_error(), "unshared"));
    h[5] = 512;
    h[3] = 7; /* heads do not divide dim */
    CHECK(at_llama2c_parse(raw, len, "heads", &m) == AT_ERR_FORMAT && strstr(at_last_error(), "n_heads 7"));
    h[3] = 8;
    h[0] = 0x616b3432; /* "ak42": a newer export version */
    CHECK(at_llama2c_parse(raw, len, "v1", &m) == AT_ERR_UNSUPPORTED);
    h[0] = -64;
    CHECK(at_llama2c_parse(raw, len, "neg", &m) == AT_ERR_FORMAT);
    h[0] = 64;
    /* Unaligned bytes are copied, not read unaligned. */
    char *shifted = malloc(len + 1);
    memcpy(shifted + 1, raw, len);
    CHECK_OK(at_llama2c_parse(shifted + 1, len, "shifted", &m));
    if (m) {
        CHECK(((uintptr_t)at_tensor_data(at_llama2c_find(m, "model.norm.weight")) % 4) == 0);
        at_llama2c_close(m);
    }
    free(shifted);
    free(raw);
}

int main(void)
{
    at_llama2c *m = NULL;
    CHECK_OK(at_llama2c_open(BIN, &m));
    if (m) {
        test_load(m);
        test_matches_gguf(m);
        test_rope_equivalence(m);
        at_llama2c_close(m);
    }
    test_permute_inverse();
    test_bad_files();
    return at_test_result("test_llama2c");
}
