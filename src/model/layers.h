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
#include "model/adapter.h"
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
    /* attn_norm, ffn_norm and act are cheap to recompute (from x, h, gate
     * and up: one pass each, bit for bit the forward's, at_layer_recompute_shared),
     * so every layer of a training forward may share one set: act alone is
     * [N, I], 10 MB per layer for a 512-token step of Qwen2.5-0.5B. They are
     * bound apart (at_layer_acts_bind_recomputed). */
    /* LoRA: u_m = drop(x_m)·A_mᵀ of each adapted module m  [N, r] (buf NULL when
     * module m is not adapted or no adapter is used). Bound separately
     * (at_layer_acts_bind_lora); in inference all seven may share one buffer. */
    at_tensor lora_u[AT_MOD_COUNT];
    /* Scratch [N, max in-features] for drop(x) when LoRA dropout is on (buf
     * NULL otherwise). May be shared by all layers. */
    at_tensor lora_x;
} at_layer_acts;

/* f32 elements one at_layer_acts needs for B·T = N tokens (with alignment
 * padding), for at_layer_acts_bind: all but attn_norm, ffn_norm and act. */
size_t at_layer_acts_elems(const at_model_config *cfg, int64_t n_tokens);
/* f32 elements of attn_norm, ffn_norm and act, for at_layer_acts_bind_recomputed. */
size_t at_layer_recomputed_elems(const at_model_config *cfg, int64_t n_tokens);

/* Lays the activations of B×T tokens but attn_norm, ffn_norm and act out as
 * views into `arena` (f32, at least at_layer_acts_elems(cfg, B·T) elements
 * from elem_offset). The arena must outlive the views. */
void at_layer_acts_bind(at_layer_acts *a, const at_model_config *cfg, int B, int T, const at_tensor *arena,
                        size_t elem_offset);
/* The same for attn_norm, ffn_norm and act (at_layer_recomputed_elems
 * elements from elem_offset), which any number of layers may share. */
void at_layer_acts_bind_recomputed(at_layer_acts *a, const at_model_config *cfg, int64_t n_tokens,
                                   const at_tensor *arena, size_t elem_offset);

/* Recomputes a's attn_norm, ffn_norm and act (and the rstd beside each norm,
 * to the same values) from the layer input x [.., hidden] and a's res_mid,
 * gate and up: what a layer whose shared set (layers above) another layer
 * has overwritten must do before its backward. */
at_status at_layer_recompute_shared(const at_model_config *cfg, const at_layer_weights *w, at_layer_acts *a,
                                    const at_tensor *x);

/* f32 elements of the LoRA part of one at_layer_acts (the u_m of the
 * modules in target_mask, [N, rank] each); 0 without an adapter. */
size_t at_layer_lora_elems(int64_t n_tokens, int rank, unsigned target_mask);
/* Binds a->lora_u[m] of the modules in target_mask into arena from
 * elem_offset (at_layer_lora_elems elements), or every module to the same
 * [N, rank] region when shared (inference); others get buf NULL. lora_x is
 * left alone (set it with at_tensor_view_inplace or memset 0). */
void at_layer_acts_bind_lora(at_layer_acts *a, int64_t n_tokens, int rank, unsigned target_mask, int shared,
                             const at_tensor *arena, size_t elem_offset);

/* LoRA on one layer's linear modules (model/adapter.h), forward:
 *   y = x·Wᵀ + b + s · (drop(x)·Aᵀ)·Bᵀ,   drop(x) = x · mask / (1 − p)
 * The mask element of module m at (token t of batch row b, input feature c)
 * is at_rng_dropout_uniform(at_rng_mix(seed, m), ((first_row + b)·AT_DROPOUT_ROW_PITCH + t)·in + c) >= p
 * (ops.h at_dropout): keyed by the row, not by where the row sits, so a row
 * draws the same mask in any micro-batch layout (one process accumulating,
 * several ranks, a micro-batch cut in pieces), and the backward regenerates
 * it instead of storing it. */
#define AT_DROPOUT_ROW_PITCH ((int64_t)1 << 24) /* tokens: more than any row has */
typedef struct at_layer_lora {
    const at_lora_pair *pairs; /* [AT_MOD_COUNT] of this layer; A == NULL: module not adapted */
    float scale;               /* s = alpha / r (alpha / sqrt(r) with rsLoRA) */
    float dropout;             /* p; 0 in inference (then a->lora_x is not needed) */
    uint64_t seed;             /* this layer's dropout seed in this forward (kept for the backward) */
    int64_t first_row;         /* the batch's row 0 among the rows sharing the seed (the step's) */
    int64_t row_tokens;        /* tokens per row of the batch (its columns; 0: one row) */
} at_layer_lora;

/* How a layer sees its batch. */
typedef struct at_layer_io {
    int B, T;
    const at_tensor *pos;      /* i32 [B, T]: position of each token (RoPE); with sections, i32
                                  [B, T, sections->n] (M-RoPE: t, h, w of each token) */
    const at_tensor *inv_freq; /* f32 [D/2] */
    const at_rope_sections *sections; /* NULL: one position per token */
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
    const at_layer_lora *lora; /* NULL: no adapter */
    /* QLoRA's compute format: when non-NULL (a bf16 scratch of at least
     * N × max(hidden, intermediate, heads·head_dim) elements), activations
     * multiplied by a quantized weight are rounded to bf16 first, so the
     * product runs on the bf16 kernels, as bitsandbytes' compute_dtype=bf16
     * does. NULL: they stay f32 (the product is then computed in f32). */
    at_tensor *qact;
} at_layer_io;

/* Attention block.
 *   a = rmsnorm(x) · w_attn_norm                      (r = 1/sqrt(mean(x²) + eps))
 *   q = a·Wqᵀ + bq,  k = a·Wkᵀ + bk,  v = a·Wvᵀ + bv  (biases: Qwen2, attention_bias)
 *   q, k = rmsnorm_D(q) · w_q_norm, rmsnorm_D(k) · w_k_norm   per head (Qwen3)
 *   q, k = rope(q, pos), rope(k, pos)                 (rotate_half pairs (i, i + D/2); M-RoPE:
 *                                                      pair i turns by its section's position)
 *   o_h  = softmax(scale · q_h·K_gᵀ + causal mask) · V_g,   g = h / (H/Hkv)
 *   y    = x + o·Woᵀ + bo
 * y may be x itself (inference: the residual stream updated in place); in
 * training y is acts->res_mid. With io->k_cache the new keys/values are
 * appended to the cache and the queries attend to everything cached.
 * Every projection adds its LoRA term when io->lora adapts it (u = drop(a)·Aᵀ
 * kept in acts->lora_u). Backward: at_attention_block_backward below. */
at_status at_attention_block_forward(const at_model_config *cfg, const at_layer_weights *w, at_layer_acts *acts,
                                     at_tensor *y, const at_tensor *x, const at_layer_io *io);

/* MLP block (SwiGLU).
 *   m = rmsnorm(h) · w_ffn_norm
 *   g = m·Wgᵀ,  u = m·Wuᵀ,  z = silu(g) · u
 *   y = h + z·Wdᵀ
 * y may be h itself; LoRA as in the attention block. Backward:
 * at_mlp_block_backward below. */
at_status at_mlp_block_forward(const at_model_config *cfg, const at_layer_weights *w, at_layer_acts *acts,
                               at_tensor *y, const at_tensor *h, const at_layer_io *io);

/* ---- backward ------------------------------------------------------------------ */

/* Gradients of one layer's trainable parameters; every member is
 * accumulated into (+=), never overwritten. NULL members are frozen. */
typedef struct at_layer_grads {
    at_layer_weights *w;   /* full fine-tuning: f32 tensors shaped like the weights; NULL: frozen base */
    at_lora_pair *lora;    /* [AT_MOD_COUNT] dA [r, in], dB [out, r] f32; NULL: no LoRA training */
} at_layer_grads;

/* Scratch for the backward of one layer, f32 views reused by every layer
 * (N = B·T tokens, W = max(I, H·D), Kv = Hkv·D, r = LoRA rank, X = max in-features). */
typedef struct at_layer_bwd_scratch {
    at_tensor big[3];   /* [N, W] */
    at_tensor kv[3];    /* [N, Kv] */
    at_tensor hd[2];    /* [N, hidden] */
    at_tensor lora_du;  /* [N, r] (buf NULL without LoRA) */
    at_tensor lora_x;   /* [N, X] (buf NULL without LoRA) */
} at_layer_bwd_scratch;

/* f32 elements of at_layer_bwd_scratch (rank 0: no LoRA). */
size_t at_layer_bwd_elems(const at_model_config *cfg, int64_t n_tokens, int lora_rank);
void at_layer_bwd_bind(at_layer_bwd_scratch *s, const at_model_config *cfg, int64_t n_tokens, int lora_rank,
                       const at_tensor *arena, size_t elem_offset);

/* MLP block backward. On entry dres holds dL/dy [N, hidden]; on return
 * dL/dh (dres += the block's contribution: y = h + f(h) so dh = dy + f'ᵀdy).
 *   dz = dy·Wd                           dWd += dyᵀ·z
 *   dg, du = swiglu_backward(dz)         (ops.h)
 *   dm = dg·Wg + du·Wu                   dWg += dgᵀ·m,  dWu += duᵀ·m
 *   dh = dy + rmsnorm_backward(dm)       dw_ffn_norm += Σ dm · ĥ
 * LoRA of module (x → y):  u = drop(x)·Aᵀ
 *   dB += s·dyᵀ·u,   dU = s·dy·B,   dA += dUᵀ·drop(x),   dx += drop(dU·A)
 * acts must hold this layer's forward activations (recomputed when
 * checkpointing; the shared set by at_layer_recompute_shared). */
at_status at_mlp_block_backward(const at_model_config *cfg, const at_layer_weights *w, const at_layer_acts *acts,
                                at_layer_grads *g, at_tensor *dres, const at_tensor *h, const at_layer_io *io,
                                at_layer_bwd_scratch *s);

/* Attention block backward. dres: dL/dy on entry, dL/dx on return.
 *   do = dy·Wo                                      dWo += dyᵀ·o,  dbo += Σ dy
 *   dq, dk, dv = attention_backward(do)             (ops.h, with the saved lse)
 *   dq, dk = rope⁻¹(dq), rope⁻¹(dk)                 (rotation by −angle)
 *   qk_norm: dq_raw, dk_raw = rmsnorm_backward_D(dq), (dk)   dw_q_norm, dw_k_norm
 *   da = dq·Wq + dk·Wk + dv·Wv                     dWq += dqᵀ·a, dbq += Σ dq (k, v alike)
 *   dx = dy + rmsnorm_backward(da)                  dw_attn_norm
 * plus LoRA of q, k, v, o as in the MLP block. x is the layer input. */
at_status at_attention_block_backward(const at_model_config *cfg, const at_layer_weights *w,
                                      const at_layer_acts *acts, at_layer_grads *g, at_tensor *dres,
                                      const at_tensor *x, const at_layer_io *io, at_layer_bwd_scratch *s);

#endif
