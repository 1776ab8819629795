#include "model/llama2c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "model/qk_permute.h"

#define HEADER_BYTES 28

struct at_llama2c {
    at_mapped_file map;
    int mapped;
    float *copy; /* owned aligned copy when the caller's bytes are not 4-aligned */
    at_model_config cfg;
    int seq_len;
    at_tensor **tensors;
    size_t n;
};

void at_llama2c_close(at_llama2c *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) at_tensor_free(m->tensors[i]);
    free(m->tensors);
    free(m->copy);
    if (m->mapped) at_unmap_file(&m->map);
    free(m);
}

static at_status add_view(at_llama2c *m, const float *w, int ndim, int64_t d0, int64_t d1, const char *name)
{
    int64_t shape[2] = {d0, d1};
    return at_tensor_wrap((void *)w, AT_F32, ndim, shape, name, &m->tensors[m->n++]);
}

/* q/k rows go from llama2.c's interleaved RoPE pairs to HF's halves. */
static at_status add_permuted(at_llama2c *m, const float *w, int64_t rows, int64_t cols, int n_heads, const char *name)
{
    int64_t shape[2] = {rows, cols};
    at_tensor *t = NULL;
    AT_TRY(at_tensor_new(at_cpu_backend(), AT_F32, 2, shape, name, &t));
    m->tensors[m->n++] = t;
    return at_qk_permute_rows(at_tensor_data(t), w, rows, (size_t)cols * sizeof(float), n_heads, AT_QK_TO_HALVES, name);
}

/* The offset of the next section of n floats; advances *end past it. */
static uint64_t take(uint64_t *end, uint64_t n)
{
    uint64_t at = *end;
    *end += n;
    return at;
}

at_status at_llama2c_parse(const void *data, size_t size, const char *what, at_llama2c **out)
{
    *out = NULL;
    if (!what) what = "llama2.c checkpoint";
    if (size < HEADER_BYTES)
        return at_error(AT_ERR_FORMAT, "%s: %zu bytes, shorter than the 28-byte header", what, size);
    int32_t h[7];
    memcpy(h, data, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u)
        return at_error(AT_ERR_UNSUPPORTED, "%s: llama2.c export version %d (\"ak42\" header) is not supported; only "
                        "the legacy (version 0) float32 format is", what, h[1]);
    int dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4], vocab = h[5], seq_len = h[6];
    int shared = vocab > 0;
    if (vocab < 0) vocab = vocab == INT32_MIN ? 0 : -vocab;
    if (dim <= 0 || hidden <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv <= 0 || vocab <= 0 || seq_len <= 0 ||
        dim > (1 << 20) || hidden > (1 << 22) || n_layers > 4096 || vocab > (1 << 24) || seq_len > (1 << 24))
        return at_error(AT_ERR_FORMAT, "%s: header sizes out of range (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                        "n_kv_heads %d, vocab_size %d, seq_len %d)", what, dim, hidden, n_layers, n_heads, n_kv, h[5],
                        seq_len);
    if (dim % n_heads != 0 || n_heads % n_kv != 0 || (dim / n_heads) % 2 != 0)
        return at_error(AT_ERR_FORMAT, "%s: dim %d, n_heads %d, n_kv_heads %d: heads must divide dim, kv heads divide "
                        "heads, and the head size be even", what, dim, n_heads, n_kv);
    uint64_t hs = (uint64_t)(dim / n_heads), kv_dim = hs * (uint64_t)n_kv, L = (uint64_t)n_layers;
    uint64_t D = (uint64_t)dim, H = (uint64_t)hidden, V = (uint64_t)vocab;
    /* The file's float sections in order, as offsets in floats (all factors
     * are bounded above, so these fit in 64 bits); the end is the size. */
    uint64_t floats = 0;
    uint64_t emb = take(&floats, V * D), rms_att = take(&floats, L * D), wq = take(&floats, L * D * D),
             wk = take(&floats, L * kv_dim * D), wv = take(&floats, L * kv_dim * D), wo = take(&floats, L * D * D),
             rms_ffn = take(&floats, L * D), w1 = take(&floats, L * H * D), w2 = take(&floats, L * D * H),
             w3 = take(&floats, L * H * D), rms_final = take(&floats, D);
    take(&floats, (uint64_t)seq_len * hs); /* freq_cis_real and freq_cis_imag: the decoder computes its own */
    uint64_t wcls = take(&floats, shared ? 0 : V * D);
    uint64_t want = HEADER_BYTES + 4 * floats;
    if ((uint64_t)size != want)
        return at_error(AT_ERR_FORMAT, "%s: %zu bytes, but the header (dim %d, hidden_dim %d, %d layers, vocab %d%s, "
                        "seq_len %d) implies %llu", what, size, dim, hidden, n_layers, vocab,
                        shared ? " shared" : " unshared", seq_len, (unsigned long long)want);

    at_status st = AT_OK;
    at_llama2c *m = calloc(1, sizeof *m);
    if (!m) return at_error(AT_ERR_NOMEM, "%s: out of memory", what);
    m->map.fd = -1;
    m->seq_len = seq_len;
    const float *w;
    if (((uintptr_t)data % sizeof(float)) == 0) {
        w = (const float *)((const uint8_t *)data + HEADER_BYTES);
    } else {
        m->copy = malloc(size - HEADER_BYTES);
        if (!m->copy) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        memcpy(m->copy, (const uint8_t *)data + HEADER_BYTES, size - HEADER_BYTES);
        w = m->copy;
    }
    size_t cap = 3 + 9 * (size_t)n_layers;
    m->tensors = calloc(cap, sizeof *m->tensors);
    if (!m->tensors) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", what);
        goto done;
    }
    at_model_config *c = &m->cfg;
    at_model_config_init(c);
    snprintf(c->model_type, sizeof c->model_type, "llama");
    c->hidden_size = dim;
    c->intermediate_size = hidden;
    c->num_hidden_layers = n_layers;
    c->num_attention_heads = n_heads;
    c->num_key_value_heads = n_kv;
    c->head_dim = (int)hs;
    c->vocab_size = vocab;
    c->max_position_embeddings = seq_len;
    c->rms_norm_eps = 1e-5; /* run.c's rmsnorm */
    c->rope_theta = 10000.0;
    c->tie_word_embeddings = shared;
    c->has_dtype = 1;
    c->dtype = AT_F32;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    c->bos_token_id = 1; /* llama2.c's SentencePiece conventions */
    c->eos_token_ids[0] = 2;
    c->n_eos = 1;
    AT_CHECK(at_model_config_validate(c, what));

    AT_CHECK(add_view(m, w + emb, 2, vocab, dim, "model.embed_tokens.weight"));
    char name[AT_NAME_MAX];
    for (int l = 0; l < n_layers; l++) {
        uint64_t ul = (uint64_t)l;
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        AT_CHECK(add_view(m, w + rms_att + ul * D, 1, dim, 1, NAME("input_layernorm.weight")));
        AT_CHECK(add_permuted(m, w + wq + ul * D * D, dim, dim, n_heads, NAME("self_attn.q_proj.weight")));
        AT_CHECK(add_permuted(m, w + wk + ul * kv_dim * D, (int64_t)kv_dim, dim, n_kv,
                              NAME("self_attn.k_proj.weight")));
        AT_CHECK(add_view(m, w + wv + ul * kv_dim * D, 2, (int64_t)kv_dim, dim, NAME("self_attn.v_proj.weight")));
        AT_CHECK(add_view(m, w + wo + ul * D * D, 2, dim, dim, NAME("self_attn.o_proj.weight")));
        AT_CHECK(add_view(m, w + rms_ffn + ul * D, 1, dim, 1, NAME("post_attention_layernorm.weight")));
        AT_CHECK(add_view(m, w + w1 + ul * H * D, 2, hidden, dim, NAME("mlp.gate_proj.weight")));
        AT_CHECK(add_view(m, w + w2 + ul * D * H, 2, dim, hidden, NAME("mlp.down_proj.weight")));
        AT_CHECK(add_view(m, w + w3 + ul * H * D, 2, hidden, dim, NAME("mlp.up_proj.weight")));
#undef NAME
    }
    AT_CHECK(add_view(m, w + rms_final, 1, dim, 1, "model.norm.weight"));
    if (!shared) AT_CHECK(add_view(m, w + wcls, 2, vocab, dim, "lm_head.weight"));
done:
    if (st != AT_OK) {
        at_llama2c_close(m);
        return st;
    }
    *out = m;
    return AT_OK;
}

at_status at_llama2c_open(const char *path, at_llama2c **out)
{
    *out = NULL;
    at_mapped_file mf;
    AT_TRY(at_map_file(path, &mf));
    at_status st = at_llama2c_parse(mf.data, mf.size, path, out);
    if (st != AT_OK) {
        at_unmap_file(&mf);
        return st;
    }
    (*out)->map = mf;
    (*out)->mapped = 1;
    return AT_OK;
}

const at_model_config *at_llama2c_config(const at_llama2c *m) { return &m->cfg; }
int at_llama2c_seq_len(const at_llama2c *m) { return m->seq_len; }
size_t at_llama2c_count(const at_llama2c *m) { return m->n; }
const at_tensor *at_llama2c_tensor_at(const at_llama2c *m, size_t i) { return i < m->n ? m->tensors[i] : NULL; }

const at_tensor *at_llama2c_find(const at_llama2c *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->tensors[i]->name, name) == 0) return m->tensors[i];
    return NULL;
}
