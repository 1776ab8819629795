/* CPU kernels of the elementwise operations: add, scale, axpy, fill, cast,
 * sum_rows and SwiGLU (see ops/ops.h for the math; arguments are checked by
 * the dispatcher). f32/bf16/f16 are converted to f32 in chunks on load and
 * rounded to nearest even on store. */
#ifndef AT_DEVICE_CPU_CPU_ELEMENTWISE_H
#define AT_DEVICE_CPU_CPU_ELEMENTWISE_H

#include "device/backend.h"

at_status at_cpu_add(at_tensor *y, const at_tensor *a, const at_tensor *b);
at_status at_cpu_scale(at_tensor *y, const at_tensor *x, float s);
at_status at_cpu_axpy(at_tensor *y, float alpha, const at_tensor *x);
at_status at_cpu_fill(at_tensor *y, float value);
at_status at_cpu_cast(at_tensor *y, const at_tensor *x);
at_status at_cpu_sum_rows(at_tensor *y, const at_tensor *x, float beta);
at_status at_cpu_swiglu_forward(at_tensor *y, const at_tensor *gate, const at_tensor *up);
at_status at_cpu_swiglu_backward(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                                 const at_tensor *up);

#endif
