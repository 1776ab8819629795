/* Device-agnostic operations on tensors.
 *
 * Each function checks shapes and dtypes (errors name the tensors), finds the
 * backend from the output tensor's buffer, requires every tensor argument to
 * live on that backend, and calls the backend's entry. When that entry is
 * NULL it copies the tensors to host memory, runs the CPU kernel, copies the
 * outputs back, and warns once per operation and backend.
 *
 * Conventions: outputs first, inputs const. Accumulation is in f32 (or
 * better). "rows" means the product of all dimensions but the last. Unless an
 * operation says otherwise, floating tensors may be f32, bf16 or f16 and the
 * output may differ in dtype from the inputs. Index tensors (ids, positions,
 * labels, segments) are i32. */
#ifndef AT_OPS_OPS_H
#define AT_OPS_OPS_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"

/* C = alpha · op(A) · op(B) + beta · C, with op(X) = Xᵀ when trans_x.
 * The matrices are the last two dimensions; the product of the leading ones
 * is the batch. A: [.., M, K] ([.., K, M] when trans_a); B: [.., K, N]
 * ([.., N, K] when trans_b); C: [.., M, N], f32 or bf16. B's batch equals A's
 * or is 1 (broadcast). A and B may be f32, bf16 or f16, independently. The
 * compute format follows the inputs, as autocast does: when either is bf16
 * the product is computed in bf16 (the other input rounded to bf16) with f32
 * accumulation; otherwise in f32 (f16 inputs widened exactly). Except on a
 * CPU without bf16 products (at_cpu_fast_bf16: no AVX512_BF16 or ARM BF16),
 * whose kernels widen bf16 inputs exactly too and compute in f32
 * (device/cpu/gemm.h says why).
 * beta == 0 means C's old contents are ignored (even NaN).
 * B may also be a quantized weight (q8_0, q4_0, nf4; device/quant.h): one
 * matrix [out, in] with in a multiple of its block size (32, 32, 64), used
 * as x · Bᵀ (trans_b = 1, the forward) or dy · B (trans_b = 0, the input
 * gradient). Its values are the dequantized ones, in bf16 when A is bf16
 * (on every CPU too: a bf16 A there is the decoder's choice of a bf16
 * compute format, decoder.h's quant_bf16); the kernels dequantize a tile at
 * a time, never the whole weight. */
at_status at_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                    float alpha, float beta);

/* y = a + b. b has a's shape, or is 1-D with a's last dimension (added to every row). */
at_status at_add(at_tensor *y, const at_tensor *a, const at_tensor *b);
/* y = s · x */
at_status at_scale(at_tensor *y, const at_tensor *x, float s);
/* y += alpha · x */
at_status at_axpy(at_tensor *y, float alpha, const at_tensor *x);
/* every element of y = value */
at_status at_fill(at_tensor *y, float value);
/* y = x converted to y's dtype (f32/bf16/f16, round to nearest even); same dtype copies. */
at_status at_cast(at_tensor *y, const at_tensor *x);
/* y[j] = beta · y[j] + Σ_rows x[r, j];  y is 1-D with x's last dimension (bias gradients). */
at_status at_sum_rows(at_tensor *y, const at_tensor *x, float beta);

/* RMSNorm over the last dimension D.
 *   forward:  r = 1/sqrt(mean(x²) + eps),  y = x · r · w
 *   backward: with g = dy · w and x̂ = x · r,
 *             dx = r · (g − x̂ · mean(g · x̂)),   dw += Σ_rows dy · x̂
 * x, y, dy, dx: [rows, D] (any leading shape); w, dw: [D]; rstd: f32 [rows]
 * (r saved by the forward; may be NULL in the forward when not training).
 * dx is overwritten; dw is accumulated into (may be NULL: frozen weight). */
at_status at_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps);
at_status at_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                              const at_tensor *w, const at_tensor *rstd);

/* LayerNorm over the last dimension D (torch.nn.LayerNorm: biased variance).
 *   forward:  μ = mean(x),  r = 1/sqrt(mean((x − μ)²) + eps),  x̂ = (x − μ)·r,  y = x̂·w + b
 *   backward: with g = dy·w,
 *             dx = r·(g − mean(g) − x̂·mean(g·x̂)),  dw += Σ_rows dy·x̂,  db += Σ_rows dy
 * x, y, dy, dx: [rows, D] (any leading shape); w, b, dw, db: [D]; mean, rstd:
 * f32 [rows] saved by the forward (both or neither; NULL when not training).
 * b may be NULL (no bias); dx is overwritten; dw and db are accumulated into
 * and may be NULL (frozen). */
at_status at_layernorm_forward(at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                               const at_tensor *w, const at_tensor *b, float eps);
at_status at_layernorm_backward(at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy, const at_tensor *x,
                                const at_tensor *w, const at_tensor *mean, const at_tensor *rstd);

/* Rotary embedding, Hugging Face rotate_half layout. x, y: [N, H, D] or
 * [B, T, H, D] (N = B·T tokens); pos: i32 [N] (or [B, T]) position of each
 * token; inv_freq: f32 [D/2]. With a_i = pos · inv_freq[i], for i < D/2:
 *   y[i]       = x[i] · cos a_i − x[i + D/2] · sin a_i
 *   y[i + D/2] = x[i + D/2] · cos a_i + x[i] · sin a_i
 * inverse = 1 rotates by −a_i: that is the backward (dx = rope⁻¹(dy)).
 * y may equal x (in place).
 * sections (NULL: one position a token) gives each token several positions,
 * pos: i32 [N, sections->n], and a_i = pos[t, k] · inv_freq[i] for the
 * component k of frequency i (at_rope_sections, device/backend.h: M-RoPE,
 * 2-D RoPE). */
at_status at_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                  const at_rope_sections *sections, int inverse);

/* Causal attention with grouped-query heads.
 * q, out, dq, dout: [B, Tq, Hq, D]; k, v, dk, dv: [B, Tk, Hkv, D]; Hq a multiple
 * of Hkv (query head h uses key/value head h / (Hq/Hkv)).
 *   s_j = scale · q·k_j  for visible keys j,  p = softmax(s),  out = Σ_j p_j v_j
 * Key j is visible to query i of sequence b when j ≤ q_index[b,i], j < kv_len[b],
 * and (with segments) segments[b,j] == segments[b,i]. A query with no visible
 * key gets out = 0.
 * lse: f32 [B, Hq, Tq], log Σ_j exp(s_j), saved for the backward (may be NULL
 * in the forward). Backward, with dp_j = dout·v_j and D_i = dout·out:
 *   ds_j = p_j (dp_j − D_i),  dq = scale Σ_j ds_j k_j,  dk_j = scale Σ_i ds_j q_i,
 *   dv_j = Σ_i p_j dout_i.   dq, dk, dv are overwritten. */
at_status at_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                               const at_tensor *v, const at_attn_params *p);
at_status at_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                const at_tensor *out, const at_tensor *lse, const at_attn_params *p);

/* SwiGLU: y = silu(g) · u with silu(g) = g · σ(g).
 *   dg = dy · u · σ(g) · (1 + g · (1 − σ(g))),  du = dy · silu(g).
 * All the same shape; dgate and dup are overwritten. */
at_status at_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up);
at_status at_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                             const at_tensor *up);

/* GELU, elementwise; kind is an at_gelu_kind (device/backend.h gives each formula).
 *   backward: dx = dy·gelu'(x), with
 *     erf:   gelu'(x) = Φ(x) + x·φ(x),  φ(x) = e^(−x²/2)/√(2π)
 *     tanh:  with u = √(2/π)·(x + 0.044715·x³), t = tanh(u):
 *            gelu'(x) = (1 + t)/2 + x/2·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²)
 *     quick: with s = σ(1.702·x):  gelu'(x) = s·(1 + 1.702·x·(1 − s))
 * x, y, dy, dx: the same number of elements; y may be x, dx may be dy or x. */
at_status at_gelu_forward(at_tensor *y, const at_tensor *x, int kind);
at_status at_gelu_backward(at_tensor *dx, const at_tensor *dy, const at_tensor *x, int kind);

/* Embedding lookup: y[n, :] = table[ids[n], :]. ids: i32 [N] (any shape with N
 * elements); table: [V, D]; y: [N, D]. An id outside [0, V) is an error
 * naming it. Backward: dtable[ids[n], :] += dy[n, :] (scatter-add). */
at_status at_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table);
at_status at_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids);

/* Cross-entropy over the last dimension, loss and gradient in one pass.
 * logits: [N, V]; labels: i32 [N], a label < 0 (e.g. −100) is ignored.
 *   row_loss[n] = logsumexp(logits[n]) − logits[n, label]   (0 when ignored), f32 [N]
 *   dlogits[n]  = grad_scale · (softmax(logits[n]) − onehot(label))  (0 when ignored)
 * dlogits may be NULL (no gradient) or the logits tensor itself (in place).
 * A label ≥ V is an error. */
at_status at_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                           const at_tensor *labels, float grad_scale);

/* One AdamW step (Loshchilov & Hutter; as torch.optim.AdamW):
 *   g = grad_scale · grad
 *   m = β1 m + (1−β1) g,   v = β2 v + (1−β2) g²
 *   param −= lr · wd · param            (decoupled decay)
 *   param −= lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
 * param, m, v: f32; grad: f32. All the same shape. */
at_status at_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                   const at_adamw_params *p);

/* out[0] = Σ x² (f32 [1]); the global L2 norm is the sqrt of the sum over tensors. */
at_status at_sumsq(at_tensor *out, const at_tensor *x);

/* Host value of a scalar f32 tensor (downloads when on a device). */
at_status at_read_scalar(const at_tensor *t, float *out);

/* Inverted dropout with a counter-based mask (LoRA dropout):
 *   y[i] = x[i] / (1 − p)   when at_rng_dropout_uniform(seed, counter(i)) >= p   (base/rng.h)
 *   y[i] = 0                otherwise
 *   counter(i) = offset + (i / run)·pitch + i % run     (run 0: offset + i)
 * The mask depends only on (seed, counter): reproducible at any thread
 * count, and the backward is the same call on dy (dx = dropout(dy), same
 * seed and counters), so no mask is stored. Runs let the elements of one
 * sequence row keep their counters whatever rows share the tensor (LoRA
 * dropout keys its masks by (row of the step, token, feature)).
 * 0 <= p < 1; p == 0 copies. run >= 0; pitch >= run when run > 0.
 * x, y: f32/bf16/f16, same number of elements; y may be x (in place). */
at_status at_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                     uint64_t pitch);

/* c = dropout(alpha · op(a) · op(b)): at_matmul with beta 0, then
 * at_dropout(c, c, p, seed, offset, run, pitch), counters over c's elements.
 * One operation so that a backend can drop each block of c while it is still
 * in cache (LoRA's input gradient dx = drop(dU·A), [tokens, in] at K = rank).
 * Operands as at_matmul's with c f32 or bf16; p, run, pitch as at_dropout's;
 * c must not be a or b. */
at_status at_matmul_dropout(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch);

/* c = alpha · op(a) · op(b) + beta · c + s · u · vᵀ: at_matmul plus a
 * low-rank term, u [M, r] and v [N, r] f32 (LoRA's forward, y = x·Wᵀ +
 * s·(drop(x)·Aᵀ)·Bᵀ with u = drop(x)·Aᵀ, v = B). One operation so that a
 * backend can add the term to each block of c while it is in cache rather
 * than in a second pass over c. Operands as at_matmul's with a and c single
 * matrices; u, v on c's backend and neither of them c. */
at_status at_matmul_lowrank(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                            float alpha, float beta, const at_tensor *u, const at_tensor *v, float s);

/* Uniform noise added in place, with at_dropout's counters (NEFTune):
 *   y[i] += m · (2·at_rng_hash_uniform(seed, counter(i)) − 1)   ∈ [−m, m)
 *   counter(i) = offset + (i / run)·pitch + i % run     (run 0: offset + i)
 * computed in f32 as n = m·(2u − 1), then y + n (two roundings, no fused
 * multiply-add), so every backend adds the same noise bit for bit. The
 * gradient passes through unchanged (the noise is additive), so there is no
 * backward. m >= 0 and finite (0 leaves y as it is). y: f32/bf16/f16. */
at_status at_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                               uint64_t pitch);

#endif
