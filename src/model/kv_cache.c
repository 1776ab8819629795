#include "model/kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include "device/cpu/cpu_backend.h"

void at_kv_cache_free(at_kv_cache *c)
{
    if (!c) return;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->k) at_tensor_free(c->k[l]);
        if (c->v) at_tensor_free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c->len);
    free(c->rope_delta);
    free(c);
}

at_status at_kv_cache_new(const at_model_config *cfg, at_backend *be, at_dtype dtype, int batch, int max_seq,
                          at_kv_cache **out)
{
    *out = NULL;
    if (batch <= 0 || max_seq <= 0)
        return at_error(AT_ERR_INVALID, "kv cache: batch %d and max_seq %d must be positive", batch, max_seq);
    if (dtype != AT_F32 && dtype != AT_BF16 && dtype != AT_F16)
        return at_error(AT_ERR_INVALID, "kv cache: dtype %s (f32, bf16 or f16 only)", at_dtype_name(dtype));
    if (cfg->num_hidden_layers <= 0 || cfg->num_key_value_heads <= 0 || cfg->head_dim <= 0)
        return at_error(AT_ERR_INVALID, "kv cache: config has no layers or heads");
    if (!be) be = at_cpu_backend();
    at_status st = AT_OK;
    at_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return at_error(AT_ERR_NOMEM, "kv cache: out of memory");
    c->n_layers = cfg->num_hidden_layers;
    c->batch = batch;
    c->max_seq = max_seq;
    c->n_kv_heads = cfg->num_key_value_heads;
    c->head_dim = cfg->head_dim;
    c->dtype = dtype;
    c->k = calloc((size_t)c->n_layers, sizeof *c->k);
    c->v = calloc((size_t)c->n_layers, sizeof *c->v);
    c->len = calloc((size_t)batch, sizeof *c->len);
    c->rope_delta = calloc((size_t)batch, sizeof *c->rope_delta);
    if (!c->k || !c->v || !c->len || !c->rope_delta) {
        st = at_error(AT_ERR_NOMEM, "kv cache: out of memory");
        goto done;
    }
    int64_t shape[4] = {batch, max_seq, c->n_kv_heads, c->head_dim};
    for (int l = 0; l < c->n_layers; l++) {
        char name[AT_NAME_MAX];
        snprintf(name, sizeof name, "kv_cache.%d.k", l);
        AT_CHECK(at_tensor_new(be, dtype, 4, shape, name, &c->k[l]));
        snprintf(name, sizeof name, "kv_cache.%d.v", l);
        AT_CHECK(at_tensor_new(be, dtype, 4, shape, name, &c->v[l]));
    }
done:
    if (st != AT_OK) {
        at_kv_cache_free(c);
        return st;
    }
    *out = c;
    return AT_OK;
}

void at_kv_cache_reset(at_kv_cache *c)
{
    for (int b = 0; b < c->batch; b++) c->len[b] = c->rope_delta[b] = 0;
}

void at_kv_cache_reset_seq(at_kv_cache *c, int b)
{
    if (b >= 0 && b < c->batch) c->len[b] = c->rope_delta[b] = 0;
}

size_t at_kv_cache_bytes(const at_kv_cache *c)
{
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++) n += at_tensor_nbytes(c->k[l]) + at_tensor_nbytes(c->v[l]);
    return n;
}
