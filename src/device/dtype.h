/* Number formats of tensor elements, and scalar conversions. */
#ifndef AT_DEVICE_DTYPE_H
#define AT_DEVICE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    AT_F32 = 0,
    AT_BF16,
    AT_F16,
    AT_I32,  /* token ids, positions, labels, segment ids */
    AT_Q8_0, /* GGUF block: f16 scale + 32 int8 (34 bytes per 32 values) */
    AT_Q4_0, /* GGUF block: f16 scale + 16 bytes of nibbles (18 bytes per 32) */
    AT_NF4,  /* bitsandbytes NF4, 64-value blocks, double-quantized absmax: one buffer
                laid out as device/quant.h says (~0.516 bytes per value) */
    AT_DTYPE_COUNT
} at_dtype;

/* "f32", "bf16", ... */
const char *at_dtype_name(at_dtype t);
/* Parses a name ("f32", "float32", "bf16", "bfloat16", "f16", "float16", "fp16"...).
 * Returns 0 and sets *out on success, -1 when unknown. */
int at_dtype_parse(const char *name, at_dtype *out);

/* Elements per block (1 for plain types) and bytes per block. */
size_t at_dtype_block_elems(at_dtype t);
size_t at_dtype_block_bytes(at_dtype t);
/* Bytes needed for n elements (n must be a multiple of the block size for
 * block types; otherwise rounds up to whole blocks). For AT_NF4 this is the
 * size of a whole tensor of n values (header and scales included, see
 * device/quant.h), not n times a per-value size. */
size_t at_dtype_bytes(at_dtype t, size_t n);

/* Scalar conversions (round to nearest even, NaN kept). */
static inline float at_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t at_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float at_f16_to_f32(uint16_t h);
uint16_t at_f32_to_f16(float f);

#endif
