/* Reference kernels: plain, obviously correct implementations of every
 * operation of ops/ops.h, used by the conformance suite as the independent
 * check of every backend (the CPU backend included).
 *
 * There is one at_ref_<op> for each operation of device/op_table.h, with
 * the signature listed there (that of the entry of at_backend_ops) and the
 * semantics documented in ops/ops.h. They work on host tensors only (at_tensor_data), read every input
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

#define AT_REF_KERNEL_DECLARE_(name) at_status at_ref_##name(AT_OP_PARAMS(name));
AT_BACKEND_OPS(AT_REF_KERNEL_DECLARE_)
#undef AT_REF_KERNEL_DECLARE_

/* The table of all the above (static storage; never freed). */
const at_backend_ops *at_ref_ops(void);

#endif
