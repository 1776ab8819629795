/* GGUF quantization of one matrix (export_quant.h), by device/quant.h whose
 * Q8_0 / Q4_0 blocks are ggml's (quantize_row_q8_0_ref / q4_0_ref). */
#include "export/export_quant.h"

#include "device/cpu/cpu_backend.h"
#include "device/quant.h"

at_status at_export_quantize(const at_tensor *src, at_dtype type, at_tensor **out)
{
    *out = NULL;
    if (type != AT_Q8_0 && type != AT_Q4_0)
        return at_error(AT_ERR_INVALID, "export: %s: %s is not a GGUF block type here (q8_0, q4_0)", src->name,
                        at_dtype_name(type));
    if (at_tensor_cols(src) % 32 != 0)
        return at_error(AT_ERR_INVALID, "export: %s: rows of %lld values are not a multiple of 32", src->name,
                        (long long)at_tensor_cols(src));
    at_tensor *q = NULL;
    AT_TRY(at_tensor_new(at_cpu_backend(), type, src->ndim, src->shape, src->name, &q));
    at_status st = at_quantize(q, src);
    if (st != AT_OK) {
        at_tensor_free(q);
        return st;
    }
    *out = q;
    return AT_OK;
}
