/* CPU kernels of causal grouped-query attention, forward and backward, in the
 * manner of FlashAttention-2 (see ops/ops.h for the math and the masks). */
#ifndef AT_DEVICE_CPU_CPU_ATTENTION_H
#define AT_DEVICE_CPU_CPU_ATTENTION_H

#include "device/backend.h"

at_status at_cpu_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                                   const at_tensor *v, const at_attn_params *p);
at_status at_cpu_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                    const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                    const at_tensor *out, const at_tensor *lse, const at_attn_params *p);

#endif
