/* What the CUDA sources of the backend may use, in one place, so that the
 * same files compile with nvcc (the real backend) and with the host C++
 * compiler under -DAT_CUDA_EMULATE (emu/cuda_emu.h runs the kernels on the
 * CPU, one fiber per CUDA thread, for the conformance suite).
 *
 * Kernels use only:
 *   __global__ __device__ __host__ __forceinline__ __restrict__,
 *   static __shared__ arrays (fixed size) and AT_DYNAMIC_SHARED below,
 *   threadIdx / blockIdx / blockDim / gridDim (.x .y .z),
 *   __syncthreads(), __syncwarp(), __shfl_xor_sync, __shfl_sync, __shfl_down_sync (full mask),
 *   atomicAdd on float, expf / logf / sqrtf / rsqrtf / fmaxf / fminf / fabsf / __expf,
 *   __float_as_uint / __uint_as_float,
 *   __nv_bfloat16 / __half with __float2bfloat16, __bfloat162float,
 *   __float2half, __half2float, __ushort_as_bfloat16, __ushort_as_half,
 *   WMMA 16x16x16 (nvcuda::wmma: bf16 / f16 matrix_a, matrix_b, f32
 *   accumulator; fill_fragment, load_matrix_sync, store_matrix_sync,
 *   mma_sync; needs sm_80 for bf16: guard with __CUDA_ARCH__ >= 800),
 *   the helpers of this header.
 * Kernels are launched only with AT_LAUNCH. Warp shuffles must be reached by
 * every thread of the warp (all 32 lanes, blockDim a multiple of 32). */
#ifndef AT_DEVICE_CUDA_COMPAT_H
#define AT_DEVICE_CUDA_COMPAT_H

#include <stdint.h>
#include <string.h>

#ifdef AT_CUDA_EMULATE
#include "device/cuda/emu/cuda_emu.h"
#define AT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    at_emu_launch((grid), (block), (shared_bytes), (stream), [=]() { kernel(__VA_ARGS__); })
#define AT_DYNAMIC_SHARED(type, name) type *name = (type *)at_emu_dynamic_shared()
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#define AT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define AT_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#define AT_WARP 32

/* ---- number formats: cuda_half.h (at_cu_f2u, at_cu_bf16_to_f32, at_cu_f32_to_f16, ...) ---- */
#include "device/cuda/cuda_half.h"

/* Element i of a float tensor of dtype dt (at_dtype: 0 f32, 1 bf16, 2 f16). */
__device__ __forceinline__ float at_cu_load(const void *p, int dt, int64_t i)
{
    if (dt == 0) return ((const float *)p)[i];
    if (dt == 1) return at_cu_bf16_to_f32(((const uint16_t *)p)[i]);
    return at_cu_f16_to_f32(((const uint16_t *)p)[i]);
}

__device__ __forceinline__ void at_cu_store(void *p, int dt, int64_t i, float v)
{
    if (dt == 0) ((float *)p)[i] = v;
    else if (dt == 1) ((uint16_t *)p)[i] = at_cu_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = at_cu_f32_to_f16(v);
}

/* ---- reductions ---- */

__device__ __forceinline__ float at_cu_warp_sum(float v)
{
    for (int o = AT_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float at_cu_warp_max(float v)
{
    for (int o = AT_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. `scratch` is __shared__ float[32]; the block may
 * reuse it after the call (the trailing barrier). */
__device__ __forceinline__ float at_cu_block_sum(float v, float *scratch)
{
    int lane = threadIdx.x % AT_WARP, warp = threadIdx.x / AT_WARP, nwarps = blockDim.x / AT_WARP;
    v = at_cu_warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    t = at_cu_warp_sum(t);
    __syncthreads();
    return t;
}

__device__ __forceinline__ float at_cu_block_max(float v, float *scratch)
{
    int lane = threadIdx.x % AT_WARP, warp = threadIdx.x / AT_WARP, nwarps = blockDim.x / AT_WARP;
    v = at_cu_warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -INFINITY;
    t = at_cu_warp_max(t);
    __syncthreads();
    return t;
}

/* base/rng.h's at_rng_hash_uniform (splitmix64 of seed ^ index·constant, top
 * 24 bits): dropout masks equal the CPU's bit for bit. */
__host__ __device__ __forceinline__ float at_cu_hash_uniform(uint64_t seed, uint64_t index)
{
    uint64_t z = seed ^ (index * 0xd1342543de82ef95ull);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* base/rng.h's at_rng_dropout_uniform: counters c and c ^ 1 share the hash of
 * c >> 1, an even c taking its low 32 bits, an odd one its high 32 (the top
 * 24 of those give the value). */
__host__ __device__ __forceinline__ float at_cu_dropout_uniform(uint64_t seed, uint64_t c)
{
    uint64_t z = seed ^ ((c >> 1) * 0xd1342543de82ef95ull);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    uint32_t w = (c & 1) ? (uint32_t)(z >> 32) : (uint32_t)z;
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

#endif
