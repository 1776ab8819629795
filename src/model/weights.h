/* The weights of a Llama-family decoder, in Hugging Face layout.
 *
 * Matrices are [out_features, in_features] (PyTorch nn.Linear), used as
 * y = x · Wᵀ. q/k rows are in HF's rotate_half order (sources that store the
 * interleaved order are permuted by the loader). Matrices keep their stored
 * dtype (f32, bf16, f16) or the one the loader was asked for; norm weights
 * and biases are always f32. Optional tensors are NULL when the config does
 * not have them. All tensors live on one backend. For QLoRA the seven linear
 * matrices of each layer may instead be quantized (nf4, q8_0, q4_0 with
 * rows of whole blocks; loader.h at_decoder_weights_quantize): frozen
 * weights for LoRA training and inference. */
#ifndef AT_MODEL_WEIGHTS_H
#define AT_MODEL_WEIGHTS_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"
#include "model/config.h"

typedef struct at_layer_weights {
    at_tensor *attn_norm;           /* input_layernorm [hidden] */
    at_tensor *wq, *wk, *wv, *wo;   /* [H·D, hidden], [Hkv·D, hidden] x2, [hidden, H·D] */
    at_tensor *bq, *bk, *bv;        /* [H·D], [Hkv·D] x2 (cfg.attn_qkv_bias) */
    at_tensor *bo;                  /* [hidden] (cfg.attn_o_bias) */
    at_tensor *q_norm, *k_norm;     /* [D] (cfg.qk_norm) */
    at_tensor *ffn_norm;            /* post_attention_layernorm [hidden] */
    at_tensor *w_gate, *w_up;       /* [I, hidden] */
    at_tensor *w_down;              /* [hidden, I] */
} at_layer_weights;

typedef struct at_decoder_weights {
    at_model_config cfg;
    at_backend *backend;
    at_tensor *embed;      /* model.embed_tokens.weight [V, hidden] */
    at_tensor *final_norm; /* model.norm.weight [hidden] */
    at_tensor *lm_head;    /* lm_head.weight [V, hidden]; == embed when tied (not freed twice), or, tied
                              and loaded from a quantized GGUF for inference, a quantized view of it; NULL
                              in a reward model's folder that has none (score below) */
    at_tensor *score;      /* score.weight [num_labels, hidden] f32: the head of a Hugging Face
                              *ForSequenceClassification folder (a reward model, train/reward.h); NULL
                              otherwise */
    at_layer_weights *layers; /* [num_hidden_layers] */
    /* What zero-copy tensors point into (mapped files), released by
     * at_decoder_weights_free after the tensors. */
    void *source;
    void (*source_close)(void *source);
} at_decoder_weights;

/* An empty set of weights for cfg (every tensor NULL), to be filled by a
 * loader or by at_decoder_weights_random. Caller frees with
 * at_decoder_weights_free. */
at_status at_decoder_weights_alloc(const at_model_config *cfg, at_backend *be, at_decoder_weights **out);

/* Frees every tensor (the tied lm_head once), then closes the source. NULL ok. */
void at_decoder_weights_free(at_decoder_weights *w);

/* Random weights for benchmarks and tests: matrices of dtype `dtype`
 * (f32/bf16/f16) uniform in ±sqrt(3/in_features) (unit variance of outputs),
 * embeddings uniform ±1, norm weights 1, biases small. Deterministic in seed.
 * Caller frees with at_decoder_weights_free. */
at_status at_decoder_weights_random(const at_model_config *cfg, at_backend *be, at_dtype dtype, uint64_t seed,
                                    at_decoder_weights **out);

/* The same as Hugging Face initialises a Llama / Qwen2 model
 * (PreTrainedModel._init_weights): every linear matrix and the embedding
 * normal(0, std) (std = config.initializer_range, 0.02 for both), biases 0,
 * norm weights 1. A tied head then gives logits of std ≈ std·sqrt(hidden),
 * so a first loss near ln(vocab), as a real untrained model has. */
at_status at_decoder_weights_random_hf(const at_model_config *cfg, at_backend *be, at_dtype dtype, uint64_t seed,
                                       float std, at_decoder_weights **out);

/* Checks that every tensor the config needs is present with its shape, and
 * that every tensor lives on w->backend. The message names the tensor. */
at_status at_decoder_weights_check(const at_decoder_weights *w);

/* Parameter count (matrices, embeddings, norms, biases; the tied head once). */
int64_t at_decoder_weights_count(const at_decoder_weights *w);

#endif
