/* Helpers shared by the reference kernels (device/ref): whole tensors read
 * into double arrays and written back with a single rounding. Host tensors
 * only; errors name the op and the tensor. */
#ifndef AT_DEVICE_REF_REF_UTIL_H
#define AT_DEVICE_REF_REF_UTIL_H

#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"

/* Host address of t's first element, or NULL (with an error set) when t is
 * not in host memory. */
const void *at_ref_host(const at_tensor *t, const char *op);
/* n zeroed doubles (at least one). Caller frees. */
at_status at_ref_zeros(int64_t n, double **out);
/* Every element of t (f32, bf16, f16, i32, or quantized: the dequantized
 * values) as a double. t may be NULL
 * (then *out is NULL). Caller frees *out. */
at_status at_ref_load(const at_tensor *t, const char *op, double **out);
/* Writes numel(t) values into t (f32, bf16 or f16), each rounded once to
 * nearest even from double (no double rounding through f32). */
at_status at_ref_store(at_tensor *t, const double *v, const char *op);
/* Host pointer to the elements of an i32 tensor (NULL tensor gives NULL, OK). */
at_status at_ref_index(const at_tensor *t, const char *op, const int32_t **out);

#endif
