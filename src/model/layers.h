/* The layers of the Llama-family decoder, one function per block, in the
 * manner of llm.c: each block's forward with its math, and (added for
 * training) its backward beside it. Only operations of ops/ops.h are used,
 * so the blocks run on any backend.
 *
 * Shapes: B sequences of T tokens, N = B·T; hidden = d_model; H query heads
 * and Hkv key/value heads of D features; I = intermediate size. The residual
 * stream and every activation are f32; weights may be f32, bf16 or f16. */
#ifndef AT_MODEL_LAYERS_H
#define AT_MODEL_LAYERS_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"
#include "model/config.h"
#include "model/weights.h"

/* Activations of one layer for N tokens: what the backward needs, kept by
 * the training forward (in inference one set is reused by every layer).
 * These are views (no reference taken) into an arena owned by whoever bound
 * them (at_layer_acts_bind). */
typedef struct at_layer_acts {
    at_tensor attn_norm;      /* a = rmsnorm(x) · w_attn_norm          [N, hidden] */
    at_tensor attn_rstd;      /* 1/rms of each row of x                [N] */
    at_tensor q_raw, k_raw;   /* qk_norm only: a·Wqᵀ+bq, a·Wkᵀ+bk      [N, H·D], [N, Hkv·D] */
    at_tensor q_rstd, k_rstd; /* qk_norm only: 1/rms per head          [N·H], [N·Hkv] */
    at_tensor q, k, v;        /* q, k after q/k norm and RoPE          [B, T, H, D], [B, T, Hkv, D] */
    at_tensor att;            /* attention output (before o_proj)      [B, T, H, D] */
    at_tensor lse;            /* log-sum-exp of the scores             [B, H, T] */
    at_tensor res_mid;        /* h = x + attention block               [N, hidden] */
    at_tensor ffn_norm;       /* m = rmsnorm(h) · w_ffn_norm           [N, hidden] */
    at_tensor ffn_rstd;       /*                                       [N] */
    at_tensor gate, up;       /* m·Wgᵀ, m·Wuᵀ                          [N, I] */
    at_tensor act;            /* silu(gate) · up                       [N, I] */
} at_layer_acts;

/* f32 elements one at_layer_acts needs for B·T = N tokens (with alignment
 * padding), for at_layer_acts_bind. */
size_t at_layer_acts_elems(const at_model_config *cfg, int64_t n_tokens);

/* Lays the activations of B×T tokens out as views into `arena` (f32, at least
 * at_layer_acts_elems(cfg, B·T) elements from elem_offset). The arena must
 * outlive the views. */
void at_layer_acts_bind(at_layer_acts *a, const at_model_config *cfg, int B, int T, const at_tensor *arena,
                        size_t elem_offset);

/* How a layer sees its batch. */
typedef struct at_layer_io {
    int B, T;
    const at_tensor *pos;      /* i32 [B, T]: position of each token (RoPE) */
    const at_tensor *inv_freq; /* f32 [D/2] */
    at_attn_params attn;       /* scale, and the masks: segments (packed samples), or with a
                                  cache q_index [B, T] and kv_len [B] */
    int save_lse;              /* write acts->lse (training) */
    /* Incremental decoding: the layer's cache tensors [B, max_seq, Hkv, D]
     * and, on the host, how many rows each sequence already has and how many
     * of its T rows are new (the rest is padding). NULL k_cache: attention
     * over this batch's own keys (training, full forward). */
    at_tensor *k_cache, *v_cache;
    const int *cache_start;
    const int *n_new;
} at_layer_io;

/* Attention block.
 *   a = rmsnorm(x) · w_attn_norm                      (r = 1/sqrt(mean(x²) + eps))
 *   q = a·Wqᵀ + bq,  k = a·Wkᵀ + bk,  v = a·Wvᵀ + bv  (biases: Qwen2, attention_bias)
 *   q, k = rmsnorm_D(q) · w_q_norm, rmsnorm_D(k) · w_k_norm   per head (Qwen3)
 *   q, k = rope(q, pos), rope(k, pos)                 (rotate_half pairs (i, i + D/2))
 *   o_h  = softmax(scale · q_h·K_gᵀ + causal mask) · V_g,   g = h / (H/Hkv)
 *   y    = x + o·Woᵀ + bo
 * y may be x itself (inference: the residual stream updated in place); in
 * training y is acts->res_mid. With io->k_cache the new keys/values are
 * appended to the cache and the queries attend to everything cached.
 * Backward (training; to be added beside): dx = dy + rmsnorm_backward(
 * Wqᵀ-, Wkᵀ-, Wvᵀ-products of dq, dk, dv from attention_backward of
 * rope⁻¹(dq), rope⁻¹(dk), dv with do = dy·Wo), dW = Σ outer products. */
at_status at_attention_block_forward(const at_model_config *cfg, const at_layer_weights *w, at_layer_acts *acts,
                                     at_tensor *y, const at_tensor *x, const at_layer_io *io);

/* MLP block (SwiGLU).
 *   m = rmsnorm(h) · w_ffn_norm
 *   g = m·Wgᵀ,  u = m·Wuᵀ,  z = silu(g) · u
 *   y = h + z·Wdᵀ
 * y may be h itself. Backward (to be added beside): dz = dy·Wd,
 * dg, du = swiglu_backward(dz), dm = dg·Wg + du·Wu, dh = dy + rmsnorm_backward(dm). */
at_status at_mlp_block_forward(const at_model_config *cfg, const at_layer_weights *w, at_layer_acts *acts,
                               at_tensor *y, const at_tensor *h);

#endif
