/* The key/value cache of incremental decoding.
 *
 * For every layer, K and V tensors [B, max_seq, Hkv, D] on the decoder's
 * backend: row t of sequence b holds the key (after RoPE) and the value of
 * the token at position t. Each sequence has its own length (how many rows
 * are filled), so a batch may hold sequences of different lengths; a prefill
 * or decode step appends rows after each sequence's length.
 *
 * The cache dtype may be f32 (exact), bf16 or f16 (half the memory; keys and
 * values are rounded when stored). */
#ifndef AT_MODEL_KV_CACHE_H
#define AT_MODEL_KV_CACHE_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"
#include "model/config.h"

typedef struct at_kv_cache {
    int n_layers;
    int batch;      /* sequences (B) */
    int max_seq;    /* rows per sequence */
    int n_kv_heads; /* Hkv */
    int head_dim;   /* D */
    at_dtype dtype;
    at_tensor **k;  /* [n_layers] tensors [B, max_seq, Hkv, D] */
    at_tensor **v;
    int *len;       /* host [B]: rows filled per sequence */
    int *rope_delta; /* host [B]: a token appended without explicit positions is at position len + rope_delta
                        (all three M-RoPE components); a prompt with images spans fewer positions than
                        tokens, so its delta is < 0 (mrope.h). 0 for text. */
} at_kv_cache;

/* Allocates a cache for `batch` sequences of up to max_seq tokens each, on
 * backend `be` (NULL: CPU), dtype f32, bf16 or f16. Lengths start at 0.
 * Contents are undefined until written. Caller frees with at_kv_cache_free.
 * AT_ERR_INVALID on a non-positive size or an unsupported dtype; the
 * allocation errors name the tensor and the bytes. */
at_status at_kv_cache_new(const at_model_config *cfg, at_backend *be, at_dtype dtype, int batch, int max_seq,
                          at_kv_cache **out);
void at_kv_cache_free(at_kv_cache *c); /* NULL ok */

/* Forgets every sequence (lengths and deltas 0); the memory is kept. */
void at_kv_cache_reset(at_kv_cache *c);
/* Forgets sequence b only (its slot can take a new sequence). */
void at_kv_cache_reset_seq(at_kv_cache *c, int b);

/* Bytes of K and V over all layers. */
size_t at_kv_cache_bytes(const at_kv_cache *c);

#endif
