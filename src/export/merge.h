/* Merging a LoRA adapter into a decoder's weights, for deployment:
 *
 *   W' = W + s · B · A        A [r, in], B [out, r], s = alpha / r
 *                             (alpha / sqrt(r) with rsLoRA)
 *
 * computed in f32 (W widened exactly, the product accumulated in f32), then
 * rounded once to W's dtype (round to nearest even). A model stored in bf16
 * thus differs from base + unmerged adapter by one bf16 rounding of W'. */
#ifndef AT_EXPORT_MERGE_H
#define AT_EXPORT_MERGE_H

#include "base/status.h"
#include "model/adapter.h"
#include "model/weights.h"

/* The weight matrix a module of layer l adapts (&w->layers[l].wq, ...). */
at_tensor **at_merge_target(at_decoder_weights *w, int layer, at_module m);

/* *out = W + s·B·A (A [r, in], B [out, r], both f32; W f32/bf16/f16, 2-D,
 * on the host) as a new host tensor of `dtype` named as W, computed in f32
 * and rounded once. Shapes that do not fit are an error naming W. */
at_status at_merge_lora_matrix(const at_tensor *W, const at_tensor *A, const at_tensor *B, double s, at_dtype dtype,
                               at_tensor **out);

/* Merges every adapted module of `a` into w. Each merged matrix is replaced
 * by a new tensor owned by w (same name, shape and dtype; the old one, which
 * may be a read-only view of a mapped file, is freed). w and a must live on
 * the host (the CPU backend). The adapter must match w's config (layers and
 * shapes): a mismatch is an error naming the tensor. Quantized matrices are
 * refused (AT_ERR_UNSUPPORTED). On error w may be partly merged. */
at_status at_merge_lora(at_decoder_weights *w, const at_adapter *a);

#endif
