/* Quantizing a matrix for a GGUF file (Q8_0, Q4_0: GGUF's own block
 * layouts, written unchanged), through device/quant.h. */
#ifndef AT_EXPORT_EXPORT_QUANT_H
#define AT_EXPORT_EXPORT_QUANT_H

#include "base/status.h"
#include "device/tensor.h"

/* *out = a new host tensor of src's shape in `type` (AT_Q8_0 or AT_Q4_0)
 * holding src (host, f32/bf16/f16) quantized. Rows must be a multiple of 32.
 * Caller frees *out with at_tensor_free. */
at_status at_export_quantize(const at_tensor *src, at_dtype type, at_tensor **out);

#endif
