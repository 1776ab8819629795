/* Vectorized element access for the memory-bound kernels of the CUDA backend
 * (elementwise, norms, loss): 8 consecutive elements in one 16-byte access
 * for bf16/f16 (two for f32), converted to/from f32 with cuda_compat.h's
 * bit-exact conversions. Callers use the 8-wide path only where the base
 * pointers are 16-byte aligned (cu_aligned16) and the index is a multiple of
 * 8, and fall back to one element at a time for the rest. */
#ifndef AT_DEVICE_CUDA_VEC_H
#define AT_DEVICE_CUDA_VEC_H

#include <stdint.h>
#include "device/cuda/cuda_compat.h"

#define AT_VEC 8

/* Whether a device address allows 16-byte accesses. */
static inline int cu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* v[0..7] = elements i..i+7 of a tensor of dtype dt (0 f32, 1 bf16, 2 f16). */
__device__ __forceinline__ void at_cu_load8(const void *p, int dt, int64_t i, float *v)
{
    if (dt == 0) {
        const float4 *q = (const float4 *)((const float *)p + i);
        float4 a = q[0], b = q[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    uint4 q = *(const uint4 *)((const uint16_t *)p + i);
    uint32_t w[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; k++) { /* little endian: the lower half is the first element */
        uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
        v[2 * k] = dt == 1 ? at_cu_bf16_to_f32(lo) : at_cu_f16_to_f32(lo);
        v[2 * k + 1] = dt == 1 ? at_cu_bf16_to_f32(hi) : at_cu_f16_to_f32(hi);
    }
}

/* Elements i..i+7 = v[0..7], rounded to dt. */
__device__ __forceinline__ void at_cu_store8(void *p, int dt, int64_t i, const float *v)
{
    if (dt == 0) {
        float4 *q = (float4 *)((float *)p + i);
        float4 a, b;
        a.x = v[0], a.y = v[1], a.z = v[2], a.w = v[3];
        b.x = v[4], b.y = v[5], b.z = v[6], b.w = v[7];
        q[0] = a;
        q[1] = b;
        return;
    }
    uint32_t w[4];
    for (int k = 0; k < 4; k++) {
        uint32_t lo = dt == 1 ? at_cu_f32_to_bf16(v[2 * k]) : at_cu_f32_to_f16(v[2 * k]);
        uint32_t hi = dt == 1 ? at_cu_f32_to_bf16(v[2 * k + 1]) : at_cu_f32_to_f16(v[2 * k + 1]);
        w[k] = lo | (hi << 16);
    }
    uint4 q;
    q.x = w[0], q.y = w[1], q.z = w[2], q.w = w[3];
    *(uint4 *)((uint16_t *)p + i) = q;
}

/* w (8 or 1) elements from i: the vector access or one scalar. */
__device__ __forceinline__ void at_cu_loadw(const void *p, int dt, int64_t i, float *v, int w)
{
    if (w == AT_VEC) at_cu_load8(p, dt, i, v);
    else v[0] = at_cu_load(p, dt, i);
}

__device__ __forceinline__ void at_cu_storew(void *p, int dt, int64_t i, const float *v, int w)
{
    if (w == AT_VEC) at_cu_store8(p, dt, i, v);
    else at_cu_store(p, dt, i, v[0]);
}

/* Calls f(i, w) over [0, n) grid-stride: f(8v, 8) for every group of 8 when
 * vec (the whole groups), then f(i, 1) for each element left (all of them
 * when !vec). Every element is visited exactly once. */
template <class F> __device__ __forceinline__ void at_cu_for_each(int64_t n, int vec, F f)
{
    int64_t done = 0, stride = (int64_t)blockDim.x * gridDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        int64_t nv = n / AT_VEC;
        for (int64_t v = t; v < nv; v += stride) f(v * AT_VEC, AT_VEC);
        done = nv * AT_VEC;
    }
    for (int64_t i = done + t; i < n; i += stride) f(i, 1);
}

/* The same within one block over a row [0, n) (threads of the block only). */
template <class F> __device__ __forceinline__ void at_cu_for_row(int64_t n, int vec, F f)
{
    int64_t done = 0;
    if (vec) {
        int64_t nv = n / AT_VEC;
        for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) f(v * AT_VEC, AT_VEC);
        done = nv * AT_VEC;
    }
    for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) f(i, 1);
}

#endif
