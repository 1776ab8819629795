/* Reference kernels: plain, obviously correct implementations of every
 * operation of ops/ops.h, used by the conformance suite as the independent
 * check of every backend (the CPU backend included).
 *
 * Each at_ref_<op> has exactly the signature of the corresponding entry of
 * at_backend_ops (device/backend.h) and the semantics documented in
 * ops/ops.h. They work on host tensors only (at_tensor_data), read every input
 * into double precision first (so outputs may alias inputs: rope in place,
 * cross-entropy's dlogits == logits), accumulate in double in the natural loop
 * order, and round once when storing (f32/bf16/f16, round to nearest even).
 * No threads, no SIMD, no blocking: slow by design.
 *
 * They assume the dispatcher's shape and dtype checks have passed, but still
 * refuse what would make them read out of bounds: a tensor not in host memory,
 * an embedding id outside [0, V), a label >= V (AT_ERR_INVALID naming the
 * tensor and the index). On such an error no output is modified.
 *
 * Two choices the header of ops.h leaves open, made here as Hugging Face does:
 *  - rope: the angle is pos · inv_freq rounded to f32 (HF computes it as an
 *    f32 product), then cos/sin are taken in double.
 *  - attention: a query with no visible key gets out = 0, lse = −inf (log of
 *    an empty sum), and contributes nothing to the backward. */
#ifndef AT_DEVICE_REF_REF_OPS_H
#define AT_DEVICE_REF_REF_OPS_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"

at_status at_ref_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                        float alpha, float beta);
at_status at_ref_add(at_tensor *y, const at_tensor *a, const at_tensor *b);
at_status at_ref_scale(at_tensor *y, const at_tensor *x, float s);
at_status at_ref_axpy(at_tensor *y, float alpha, const at_tensor *x);
at_status at_ref_fill(at_tensor *y, float value);
at_status at_ref_cast(at_tensor *y, const at_tensor *x);
at_status at_ref_sum_rows(at_tensor *y, const at_tensor *x, float beta);
at_status at_ref_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps);
at_status at_ref_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                                  const at_tensor *w, const at_tensor *rstd);
at_status at_ref_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                      int inverse);
at_status at_ref_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                                   const at_tensor *v, const at_attn_params *p);
at_status at_ref_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                    const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                    const at_tensor *out, const at_tensor *lse, const at_attn_params *p);
at_status at_ref_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up);
at_status at_ref_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                                 const at_tensor *up);
at_status at_ref_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table);
at_status at_ref_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids);
at_status at_ref_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                               const at_tensor *labels, float grad_scale);
at_status at_ref_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                       const at_adamw_params *p);
at_status at_ref_sumsq(at_tensor *out, const at_tensor *x);
at_status at_ref_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                         uint64_t pitch);
at_status at_ref_add_uniform_noise(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                                   uint64_t pitch);

/* The table of all the above (static storage; never freed). */
const at_backend_ops *at_ref_ops(void);

#endif
