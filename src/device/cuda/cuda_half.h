/* bf16/f16 <-> f32 conversions by bit manipulation (the same results as
 * device/dtype.h, bit for bit), __host__ __device__, in one place: the kernels
 * use them through cuda_compat.h, and the emulator (emu/cuda_emu.h) builds its
 * __nv_bfloat16 / __half types and its cuBLAS element loads and stores on them.
 * Needs __host__ / __device__ / __forceinline__ defined first (by the CUDA
 * headers, or by emu/cuda_emu.h). */
#ifndef AT_DEVICE_CUDA_HALF_H
#define AT_DEVICE_CUDA_HALF_H

#include <stdint.h>
#include <string.h>

/* Bit casts usable in __host__ __device__ code: __float_as_uint and
 * __uint_as_float are device-only under nvcc, so the host pass uses memcpy. */
__host__ __device__ __forceinline__ uint32_t at_cu_f2u(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
__host__ __device__ __forceinline__ float at_cu_u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

__host__ __device__ __forceinline__ float at_cu_bf16_to_f32(uint16_t h) { return at_cu_u2f((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN. */
__host__ __device__ __forceinline__ uint16_t at_cu_f32_to_bf16(float f)
{
    uint32_t u = at_cu_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__host__ __device__ __forceinline__ float at_cu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);      /* inf / NaN */
    else if (exp) u = sign | ((exp + 112u) << 23) | (man << 13); /* normal */
    else if (man) {                                               /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    } else
        u = sign;
    return at_cu_u2f(u);
}

/* Round to nearest even, overflow to inf, NaN kept quiet. */
__host__ __device__ __forceinline__ uint16_t at_cu_f32_to_f16(float f)
{
    uint32_t u = at_cu_f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN, as device/dtype.c */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65536: inf */
    if (abs < 0x38800000u) {                                    /* below the smallest normal */
        if (abs < 0x33000000u) return (uint16_t)sign;           /* below half the smallest subnormal */
        uint32_t e = abs >> 23, man = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

#endif
