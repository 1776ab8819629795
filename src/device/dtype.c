#include "device/dtype.h"

#include <strings.h>

#include "device/quant.h"

const char *at_dtype_name(at_dtype t)
{
    switch (t) {
    case AT_F32: return "f32";
    case AT_BF16: return "bf16";
    case AT_F16: return "f16";
    case AT_I32: return "i32";
    case AT_Q8_0: return "q8_0";
    case AT_Q4_0: return "q4_0";
    case AT_NF4: return "nf4";
    default: return "?";
    }
}

int at_dtype_parse(const char *s, at_dtype *out)
{
    static const struct { const char *name; at_dtype t; } names[] = {
        {"f32", AT_F32}, {"float32", AT_F32}, {"fp32", AT_F32}, {"float", AT_F32},
        {"bf16", AT_BF16}, {"bfloat16", AT_BF16},
        {"f16", AT_F16}, {"float16", AT_F16}, {"fp16", AT_F16}, {"half", AT_F16},
        {"i32", AT_I32}, {"int32", AT_I32},
        {"q8_0", AT_Q8_0}, {"q4_0", AT_Q4_0}, {"nf4", AT_NF4},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strcasecmp(s, names[i].name)) {
            *out = names[i].t;
            return 0;
        }
    }
    return -1;
}

size_t at_dtype_block_elems(at_dtype t)
{
    switch (t) {
    case AT_Q8_0: case AT_Q4_0: return 32;
    case AT_NF4: return 64;
    default: return 1;
    }
}

size_t at_dtype_block_bytes(at_dtype t)
{
    switch (t) {
    case AT_F32: case AT_I32: return 4;
    case AT_BF16: case AT_F16: return 2;
    case AT_Q8_0: return 34;
    case AT_Q4_0: return 18;
    case AT_NF4: return 33; /* 32 bytes of nibbles + the absmax code; see at_dtype_bytes */
    default: return 0;
    }
}

size_t at_dtype_bytes(at_dtype t, size_t n)
{
    /* NF4 adds a header and one f32 scale per 256 blocks (device/quant.h) */
    if (t == AT_NF4) return at_nf4_nbytes((int64_t)n);
    size_t be = at_dtype_block_elems(t);
    return (n + be - 1) / be * at_dtype_block_bytes(t);
}

/* IEEE half conversions done by hand so the code runs on any x86-64. */
float at_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t at_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (absu < 0x38800000u) { /* result is subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffff) | 0x800000;
        /* value = m * 2^(e-150); in units of the half subnormal 2^-24: m >> (126-e) */
        uint32_t shift = 126 - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absu - 0x38000000u) >> 13);
    uint32_t rem = absu & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}
