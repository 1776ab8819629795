/* The Llama-family decoder: one implementation for Llama 2/3, Mistral,
 * Qwen2/2.5, Qwen3, SmolLM, TinyLlama, whatever file the weights came from
 * (Hugging Face folder, GGUF, llama2.c). The differences between those models
 * are fields of at_model_config.
 *
 *   x_0     = embed[ids]
 *   x_{l+1} = mlp_block_l(attention_block_l(x_l))        (layers.h)
 *   logits  = rmsnorm(x_L) · w_norm · W_headᵀ            (W_head = embed when tied)
 *
 * Two ways to run it:
 *  - training forward (at_decoder_forward): a batch [B, T] with positions and
 *    optional segment ids (packed samples), keeping every layer's activations
 *    in an at_decoder_acts for the backward;
 *  - inference (at_decoder_prefill / at_decoder_decode_step): with a KV cache
 *    (kv_cache.h), a batch of sequences of different lengths, logits for the
 *    last new token of each sequence (or for every new token).
 * Everything runs through ops/ops.h on the weights' backend; activations are
 * f32. */
#ifndef AT_MODEL_DECODER_H
#define AT_MODEL_DECODER_H

#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/layers.h"
#include "model/weights.h"

typedef struct at_decoder_scratch at_decoder_scratch;

typedef struct at_decoder {
    at_model_config cfg;
    at_decoder_weights *w; /* owned */
    at_backend *be;        /* = w->backend */
    at_tensor *inv_freq;   /* f32 [head_dim/2], RoPE after rope_scaling */
    float attn_scale;      /* 1/sqrt(head_dim) */
    at_decoder_scratch *scratch; /* inference buffers, grown on demand */
} at_decoder;

/* Makes a decoder over w (checked with at_decoder_weights_check). Takes
 * ownership of w on success only. Caller frees with at_decoder_free. */
at_status at_decoder_new(at_decoder_weights *w, at_decoder **out);
void at_decoder_free(at_decoder *d); /* frees the weights too; NULL ok */

/* ---- training forward ------------------------------------------------------ */

/* Activations of a [B, T] batch, everything the backward needs. */
typedef struct at_decoder_acts {
    int B, T, n_layers;
    at_tensor *arena;       /* f32, owns the memory of every view below */
    at_tensor *resid;       /* [n_layers + 1] views [B·T, hidden]: resid[0] = embeddings,
                               resid[l+1] = output of layer l */
    at_layer_acts *layers;  /* [n_layers] */
    at_tensor final_norm;   /* rmsnorm(resid[L]) · w_norm    [B·T, hidden] */
    at_tensor final_rstd;   /*                               [B·T] */
    at_tensor *pos;         /* i32 [B, T]: 0..T-1 in every row (used when no positions are given) */
} at_decoder_acts;

/* Allocates the activations of a [B, T] batch on the decoder's backend.
 * Caller frees with at_decoder_acts_free. */
at_status at_decoder_acts_new(const at_decoder *d, int B, int T, at_decoder_acts **out);
void at_decoder_acts_free(at_decoder_acts *a); /* NULL ok */
/* f32 elements at_decoder_acts_new allocates for [B, T] (memory planning). */
size_t at_decoder_acts_elems(const at_model_config *cfg, int B, int T);

/* Forward of a batch. ids: i32 [B, T]; pos: i32 [B, T] positions (NULL:
 * 0..T-1 in every row); segments: i32 [B, T] or NULL. With segments, a token
 * attends only to earlier tokens of its own segment (packed samples: give
 * positions restarting at 0 in each segment). All on the decoder's backend.
 * Leaves the result in acts->final_norm; logits with at_decoder_logits. */
at_status at_decoder_forward(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                             const at_tensor *segments);

/* logits [n, V] (f32 or bf16) = hidden [n, hidden] · W_headᵀ, for rows of
 * final_norm (a view of some of its rows computes only those: big
 * vocabularies need not be done all at once). */
at_status at_decoder_logits(at_decoder *d, at_tensor *logits, const at_tensor *hidden);

/* ---- inference with a KV cache -------------------------------------------- */

/* Runs T new tokens per sequence through the model, appending their keys and
 * values to the cache after each sequence's cached tokens.
 *   ids:    host i32 [B, T] row-major, B = cache->batch;
 *   n_new:  host [B]: sequence b has n_new[b] <= T new tokens (its first
 *           n_new[b] ids; the rest is padding and ignored); 0 leaves that
 *           sequence untouched; NULL means T for every sequence;
 *   logits: f32 on the decoder's backend, [B, V] for the last new token of
 *           each sequence, or [B, T, V] (all_positions) for every new token.
 *           Rows of padding and of skipped sequences are undefined.
 * The cache lengths grow by n_new. Refused when a sequence would outgrow the
 * cache, or a model trained with a sliding window would see more tokens than
 * the window. */
at_status at_decoder_prefill(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                             at_tensor *logits, int all_positions);

/* One token per sequence: ids host [B]; active host [B] (NULL: all) says
 * which sequences take a token. logits f32 [B, V]. */
at_status at_decoder_decode_step(at_decoder *d, at_kv_cache *cache, const int32_t *ids, const int *active,
                                 at_tensor *logits);

#endif
