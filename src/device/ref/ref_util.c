/* Whole tensors to and from double arrays, for the reference kernels. */
#include "device/ref/ref_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/quant.h"

const void *at_ref_host(const at_tensor *t, const char *op)
{
    const void *p = at_tensor_data(t);
    if (!p) at_error(AT_ERR_INVALID, "ref %s: tensor %s is not in host memory", op, t->name);
    return p;
}

at_status at_ref_zeros(int64_t n, double **out)
{
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!*out) return at_error(AT_ERR_NOMEM, "ref: out of host memory for %lld values", (long long)n);
    return AT_OK;
}

/* A quantized tensor's values: what at_dequantize (device/quant.c, checked
 * against the formats' reference implementations) says they are. */
static at_status load_quantized(const at_tensor *t, const char *op, double *d, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    at_tensor *view = NULL;
    at_status st = f ? at_tensor_wrap(f, AT_F32, t->ndim, t->shape, t->name, &view)
                     : at_error(AT_ERR_NOMEM, "ref %s: out of host memory for %lld values", op, (long long)n);
    if (st == AT_OK) st = at_dequantize(view, t);
    if (st == AT_OK)
        for (int64_t i = 0; i < n; i++) d[i] = f[i];
    at_tensor_free(view);
    free(f);
    return st;
}

at_status at_ref_load(const at_tensor *t, const char *op, double **out)
{
    *out = NULL;
    if (!t) return AT_OK;
    const void *p = at_ref_host(t, op);
    if (!p) return AT_ERR_INVALID;
    int64_t n = at_tensor_numel(t);
    AT_TRY(at_ref_zeros(n, out));
    double *d = *out;
    switch (t->dtype) {
    case AT_F32:
        for (int64_t i = 0; i < n; i++) d[i] = ((const float *)p)[i];
        return AT_OK;
    case AT_BF16:
        for (int64_t i = 0; i < n; i++) d[i] = at_bf16_to_f32(((const uint16_t *)p)[i]);
        return AT_OK;
    case AT_F16:
        for (int64_t i = 0; i < n; i++) d[i] = at_f16_to_f32(((const uint16_t *)p)[i]);
        return AT_OK;
    case AT_I32:
        for (int64_t i = 0; i < n; i++) d[i] = ((const int32_t *)p)[i];
        return AT_OK;
    case AT_Q8_0: case AT_Q4_0: case AT_NF4: {
        at_status st = load_quantized(t, op, d, n);
        if (st != AT_OK) {
            free(*out);
            *out = NULL;
        }
        return st;
    }
    default:
        free(*out);
        *out = NULL;
        return at_error(AT_ERR_UNSUPPORTED, "ref %s: tensor %s has dtype %s (f32, bf16, f16 expected)", op,
                        t->name, at_dtype_name(t->dtype));
    }
}

/* Rounds a double to f32 by round-to-odd: truncate, and when inexact force the
 * last bit to 1. Rounding that (RNE) to bf16 or f16, which keep at least two
 * bits fewer, gives exactly RNE of the double: no double-rounding error. */
static float to_f32_odd(double d)
{
    float f = (float)d;
    if (!isfinite(d) || (double)f == d) return f;
    if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f); /* truncate toward zero */
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

at_status at_ref_store(at_tensor *t, const double *v, const char *op)
{
    void *p = (void *)at_ref_host(t, op);
    if (!p) return AT_ERR_INVALID;
    int64_t n = at_tensor_numel(t);
    switch (t->dtype) {
    case AT_F32:
        for (int64_t i = 0; i < n; i++) ((float *)p)[i] = (float)v[i];
        return AT_OK;
    case AT_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = at_f32_to_bf16(to_f32_odd(v[i]));
        return AT_OK;
    case AT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = at_f32_to_f16(to_f32_odd(v[i]));
        return AT_OK;
    default:
        return at_error(AT_ERR_UNSUPPORTED, "ref %s: output %s has dtype %s (f32, bf16, f16 expected)", op,
                        t->name, at_dtype_name(t->dtype));
    }
}

at_status at_ref_index(const at_tensor *t, const char *op, const int32_t **out)
{
    *out = NULL;
    if (!t) return AT_OK;
    if (t->dtype != AT_I32)
        return at_error(AT_ERR_INVALID, "ref %s: index tensor %s must be i32", op, t->name);
    *out = at_ref_host(t, op);
    return *out ? AT_OK : AT_ERR_INVALID;
}
