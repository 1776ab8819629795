/* An emulation of CUDA's execution model and of the subset of the CUDA
 * runtime and cuBLAS that the backend uses, so that the backend's .cu files
 * compile with the host C++ compiler (-x c++ -DAT_CUDA_EMULATE) and run on the
 * CPU. The conformance suite runs the whole backend this way on machines
 * without a GPU: kernel logic, host wrappers and the cuBLAS argument mapping
 * are all checked.
 *
 * Execution model: a launch runs its blocks one after another; inside a block
 * every CUDA thread is a fiber (its own stack), scheduled cooperatively.
 * __syncthreads() parks a fiber until every live thread of the block has
 * arrived; warp operations (__syncwarp, shuffles, votes) synchronize only the
 * 32 lanes of one warp. Since blocks never overlap, `__shared__` is `static`:
 * a function's static locals are shared by the fibers of the running block.
 * A kernel that deadlocks (fibers parked at barriers nobody else will reach),
 * uses a warp operation in a partial warp or with a mask other than the full
 * one, fails the launch (cudaErrorLaunchFailure, with a detailed message from
 * at_emu_error_detail) instead of hanging.
 *
 * Names and numeric values are the real headers' (cuda_runtime_api.h,
 * driver_types.h, library_types.h, cublas_api.h) so the same source compiles
 * both ways; only what the backend needs is declared.
 *
 * Device memory is host memory with guard zones: copies and GEMMs check that
 * every device range they touch lies inside one live allocation, and writes
 * past the end of an allocation are found at the next synchronization or
 * free (cudaErrorIllegalAddress). New allocations are filled with 0xff bytes
 * (NaN as floats) so reading memory nobody wrote shows. ANYTUNE_CUDA_EMU_MEMORY
 * (bytes, optional K/M/G suffix) caps the total allocated, to test
 * out-of-memory paths. */
#ifndef AT_DEVICE_CUDA_EMU_H
#define AT_DEVICE_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++: compile the .cu sources with the C++ compiler"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include <typeinfo>

#define AT_EMU_HIDDEN __attribute__((visibility("hidden")))

/* ---- qualifiers ---- */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
/* Blocks run one after another, so a block's shared arrays are the function's
 * static locals (kernels write `__shared__ float s[32];`). */
#define __shared__ static

/* ---- built-in types ---- */

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define AT_EMU_VEC2(T, N, A) \
    struct alignas(A) N##2 { T x, y; }; \
    static inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define AT_EMU_VEC4(T, N, A) \
    struct alignas(A) N##4 { T x, y, z, w; }; \
    static inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
AT_EMU_VEC2(float, float, 8)
AT_EMU_VEC4(float, float, 16)
AT_EMU_VEC2(int, int, 8)
AT_EMU_VEC4(int, int, 16)
AT_EMU_VEC2(unsigned int, uint, 8)
AT_EMU_VEC4(unsigned int, uint, 16)
AT_EMU_VEC2(unsigned short, ushort, 4)
AT_EMU_VEC4(unsigned short, ushort, 8)
AT_EMU_VEC2(short, short, 4)
AT_EMU_VEC4(short, short, 8)
AT_EMU_VEC4(unsigned char, uchar, 4)
AT_EMU_VEC4(signed char, char, 4)
AT_EMU_VEC2(double, double, 16)
AT_EMU_VEC2(long long, longlong, 16)
AT_EMU_VEC2(unsigned long long, ulonglong, 16)
#undef AT_EMU_VEC2
#undef AT_EMU_VEC4
struct float3 {
    float x, y, z;
};
struct int3 {
    int x, y, z;
};
static inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
static inline int3 make_int3(int x, int y, int z) { return int3{x, y, z}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

/* ---- built-in variables: the running fiber's and launch's coordinates ---- */

struct at_emu_coords {
    uint3 block_idx;
    dim3 block_dim, grid_dim;
};
extern AT_EMU_HIDDEN const uint3 *at_emu_thread_idx; /* the running fiber's threadIdx */
extern AT_EMU_HIDDEN at_emu_coords at_emu_launch_coords;

#define threadIdx (*at_emu_thread_idx)
#define blockIdx (static_cast<const uint3 &>(at_emu_launch_coords.block_idx))
#define blockDim (static_cast<const dim3 &>(at_emu_launch_coords.block_dim))
#define gridDim (static_cast<const dim3 &>(at_emu_launch_coords.grid_dim))
constexpr int warpSize = 32;

/* ---- synchronization ---- */

void __syncthreads();
int __syncthreads_count(int predicate);
int __syncthreads_and(int predicate);
int __syncthreads_or(int predicate);
void __syncwarp(unsigned int mask = 0xffffffffu);
static inline void __threadfence() {}
static inline void __threadfence_block() {}
/* Fibers only switch at barriers, so every lane of a warp is "active". */
static inline unsigned int __activemask() { return 0xffffffffu; }

/* Warp exchange: every lane of the warp publishes `bits` and gets the bits of
 * the lane chosen by mode (0 idx, 1 up, 2 down, 3 xor) and arg within groups
 * of `width` lanes (out-of-group sources return the lane's own bits, as CUDA
 * does). mode 4 returns the ballot of (bits != 0) over the warp. */
uint64_t at_emu_warp_exchange(unsigned int mask, uint64_t bits, int mode, int arg, int width);

template <class T> static inline T at_emu_shfl(unsigned int mask, T v, int mode, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = at_emu_warp_exchange(mask, bits, mode, arg, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
template <class T> static inline T __shfl_sync(unsigned int mask, T v, int src, int width = warpSize)
{
    return at_emu_shfl(mask, v, 0, src, width);
}
template <class T> static inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = warpSize)
{
    return at_emu_shfl(mask, v, 1, (int)delta, width);
}
template <class T> static inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = warpSize)
{
    return at_emu_shfl(mask, v, 2, (int)delta, width);
}
template <class T> static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = warpSize)
{
    return at_emu_shfl(mask, v, 3, lane_mask, width);
}
static inline unsigned int __ballot_sync(unsigned int mask, int pred)
{
    return (unsigned int)at_emu_warp_exchange(mask, pred != 0, 4, 0, warpSize);
}
static inline int __any_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }

/* ---- atomics (fibers never interleave inside one, so plain read-modify-write) ---- */

#define AT_EMU_ATOMIC(T, NAME, EXPR)            \
    static inline T NAME(T *p, T v)             \
    {                                           \
        T o = *p;                               \
        *p = (EXPR);                            \
        return o;                               \
    }
AT_EMU_ATOMIC(float, atomicAdd, o + v)
AT_EMU_ATOMIC(double, atomicAdd, o + v)
AT_EMU_ATOMIC(int, atomicAdd, o + v)
AT_EMU_ATOMIC(unsigned int, atomicAdd, o + v)
AT_EMU_ATOMIC(unsigned long long, atomicAdd, o + v)
AT_EMU_ATOMIC(int, atomicSub, o - v)
AT_EMU_ATOMIC(unsigned int, atomicSub, o - v)
AT_EMU_ATOMIC(int, atomicMax, o > v ? o : v)
AT_EMU_ATOMIC(unsigned int, atomicMax, o > v ? o : v)
AT_EMU_ATOMIC(int, atomicMin, o < v ? o : v)
AT_EMU_ATOMIC(unsigned int, atomicMin, o < v ? o : v)
AT_EMU_ATOMIC(int, atomicExch, v)
AT_EMU_ATOMIC(unsigned int, atomicExch, v)
AT_EMU_ATOMIC(float, atomicExch, v)
AT_EMU_ATOMIC(int, atomicOr, o | v)
AT_EMU_ATOMIC(unsigned int, atomicOr, o | v)
AT_EMU_ATOMIC(int, atomicAnd, o & v)
AT_EMU_ATOMIC(unsigned int, atomicAnd, o & v)
#undef AT_EMU_ATOMIC
template <class T> static inline T atomicCAS(T *p, T compare, T v)
{
    T o = *p;
    if (o == compare) *p = v;
    return o;
}

/* ---- math and bit intrinsics ---- */

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* glibc declares these names (its internal aliases, not exported): define them inline */
inline float __expf(float x) noexcept { return expf(x); }
inline float __logf(float x) noexcept { return logf(x); }
inline float __log2f(float x) noexcept { return log2f(x); }
inline float __powf(float x, float y) noexcept { return powf(x, y); }
inline float __sinf(float x) noexcept { return sinf(x); }
inline float __cosf(float x) noexcept { return cosf(x); }
inline float __tanf(float x) noexcept { return tanf(x); }
inline void __sincosf(float x, float *s, float *c) noexcept { *s = sinf(x), *c = cosf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline unsigned int __float_as_uint(float f)
{
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned int u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
static inline float __int_as_float(int i) { return __uint_as_float((unsigned int)i); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
static inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned int)(((uint64_t)a * b) >> 32); }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* CUDA's min / max overloads for integers and floats (device and host). */
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
static inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
static inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}

/* ---- __half and __nv_bfloat16 (cuda_fp16.h, cuda_bf16.h) ---- */

/* The conversions are cuda_half.h's (round to nearest even, as the hardware
 * and device/dtype.h), shared with the kernels. */
#include "device/cuda/cuda_half.h"

/* The storage is the bits (__x, as in the real headers); conversions from and
 * to float round to nearest even. */
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(at_cu_f32_to_bf16(f)) {}
    operator float() const { return at_cu_bf16_to_f32(__x); }
};
struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(at_cu_f32_to_f16(f)) {}
    operator float() const { return at_cu_f16_to_f32(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __half half;
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return at_cu_bf16_to_f32(h.__x); }
static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return at_cu_f16_to_f32(h.__x); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
    __nv_bfloat16 h;
    h.__x = u;
    return h;
}
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short u)
{
    __half h;
    h.__x = u;
    return h;
}

/* ---- CUDA runtime subset ---- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorAssert = 710,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

/* The fields of cudaDeviceProp the emulator fills (a subset of the real struct). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
    int l2CacheSize;
    int memoryBusWidth;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int integrated;
    int concurrentKernels;
    int unifiedAddressing;
};

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream = 0);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t at_emu_func_set_attribute(cudaFuncAttribute attr, int value);
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value)
{
    (void)entry;
    return at_emu_func_set_attribute(attr, value);
}

/* cudaFuncGetAttributes: the emulator "compiles" every kernel for the device
 * it emulates (compute capability 9.0): ptxVersion = binaryVersion = 90. */
struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, cacheModeCA, maxDynamicSharedSizeBytes,
        preferredShmemCarveout;
};
cudaError_t at_emu_func_get_attributes(cudaFuncAttributes *attr);
template <class T> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, T *entry)
{
    (void)entry;
    return at_emu_func_get_attributes(attr);
}

/* ---- kernel launch (AT_LAUNCH of cuda_compat.h) ---- */

/* Runs body(arg) once per CUDA thread of grid × block; shared_bytes is the
 * dynamic shared memory (at_emu_dynamic_shared). `name` names the launch in
 * error messages. Errors (bad configuration, bad stream, a failed kernel)
 * become the last error (cudaGetLastError). */
void at_emu_launch_raw(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void (*body)(void *),
                       void *arg, const char *name);

template <class F> static inline void at_emu_launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, F f)
{
    at_emu_launch_raw(grid, block, shared_bytes, stream, [](void *p) { (*static_cast<F *>(p))(); }, &f,
                      typeid(F).name());
}

/* The running block's dynamic shared memory (the launch's shared_bytes). */
void *at_emu_dynamic_shared();

/* A detailed description of the last error the emulator reported for code e
 * ("" when there is none): which kernel, which block, what went wrong. */
const char *at_emu_error_detail(cudaError_t e);

/* ---- cuBLAS subset ---- */

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_8U = 8,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14
} cudaDataType;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DFALT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;
typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;
typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_32I = 72
} cublasComputeType_t;

typedef struct cublasContext *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb, long long int strideB,
                                         const float *beta, float *C, int ldc, long long int strideC,
                                         int batchCount);

/* The detail of the last cuBLAS error for status s ("" when none). */
const char *at_emu_blas_error_detail(cublasStatus_t s);

/* ---- WMMA (mma.h, namespace nvcuda::wmma): 16×16×16 tiles ----
 *
 * fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | __half,
 * row_major | col_major> and fragment<accumulator, 16, 16, 16, float>;
 * fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync.
 *
 * CUDA leaves the mapping of tile elements to (lane, x[i]) unspecified; the
 * emulator's is deliberately scrambled so that a kernel relying on some
 * particular hardware layout fails here: every fragment holds num_elements =
 * 8 elements per lane, and element e of lane l is the tile element
 * t = ((8·l + e)·P + Q) mod 256, (row, col) = (t / 16, t % 16), with (P, Q) =
 * (37, 5) for matrix_a (rows m, cols k), (101, 77) for matrix_b (rows k, cols
 * n), (149, 200) for the accumulator (rows m, cols n). The mapping is fixed
 * per fragment kind, as on a GPU: an accumulator loaded from memory, the
 * result of mma_sync and the layout store_matrix_sync writes agree.
 *
 * load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: all 32
 * lanes must reach the same call with the same pointer, ldm and layout
 * (checked, like the warp shuffles); the pointer must be 32-byte aligned and
 * ldm a multiple of 16 bytes (8 elements of 16 bits, 4 floats), as CUDA
 * requires. fill_fragment and x[] are each lane's own. mma_sync computes
 * d = a·b + c exactly in double and rounds once to float (the hardware sums
 * the exact products at about f32 precision: a last-bit difference). Only
 * inside kernels. */
namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use> struct at_emu_use;
template <> struct at_emu_use<matrix_a> { enum { kind = 0 }; };
template <> struct at_emu_use<matrix_b> { enum { kind = 1 }; };
template <> struct at_emu_use<accumulator> { enum { kind = 2 }; };

/* The tile index (row·16 + col) of element e of lane `lane` of a fragment of kind `kind` (0 a, 1 b, 2 accumulator). */
static inline int at_emu_wmma_index(int kind, int lane, int e)
{
    static const int P[3] = {37, 101, 149}, Q[3] = {5, 77, 200};
    return ((8 * lane + e) * P[kind] + Q[kind]) & 255;
}

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has the 16x16x16 WMMA shape only");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value
                                                        : (std::is_same<T, __nv_bfloat16>::value ||
                                                           std::is_same<T, __half>::value),
                  "emulated WMMA fragments: matrix_a / matrix_b of __nv_bfloat16 or __half, accumulator of float");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<Layout, void>::value
                                                        : (std::is_same<Layout, row_major>::value ||
                                                           std::is_same<Layout, col_major>::value),
                  "matrix_a / matrix_b fragments take row_major or col_major, accumulators no layout");

  public:
    typedef T element_type;
    enum { num_elements = 8 };
    T x[num_elements];
};

/* Emulator internals (cuda_emu_launch.cpp). at_emu_wmma_collective: every lane
 * of the warp reaches operation `op` (0 load, 1 store, 2 mma) with the same
 * pointer / ldm / layout, checked with CUDA's alignment rules (esize: bytes
 * per element); returns the calling lane. at_emu_wmma_mma: the lane's 8
 * elements of a, b, c in, its 8 elements of d = a·b + c out. */
int at_emu_wmma_collective(int op, const void *p, unsigned ldm, int col_major, size_t esize);
void at_emu_wmma_mma(float *d, const float *a, const float *b, const float *c);

template <class Use, class T, class L, class V> static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, V v)
{
    for (int e = 0; e < 8; e++) f.x[e] = T(v);
}

template <class Use, class T, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load takes a layout_t");
    const int col = std::is_same<L, col_major>::value;
    int lane = at_emu_wmma_collective(0, p, ldm, col, sizeof(T)), kind = at_emu_use<Use>::kind;
    for (int e = 0; e < 8; e++) {
        int t = at_emu_wmma_index(kind, lane, e), r = t / 16, c = t % 16;
        f.x[e] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout)
{
    const int col = layout == mem_col_major;
    int lane = at_emu_wmma_collective(0, p, ldm, col, sizeof(float));
    for (int e = 0; e < 8; e++) {
        int t = at_emu_wmma_index(2, lane, e), r = t / 16, c = t % 16;
        f.x[e] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t layout)
{
    const int col = layout == mem_col_major;
    int lane = at_emu_wmma_collective(1, p, ldm, col, sizeof(float));
    for (int e = 0; e < 8; e++) {
        int t = at_emu_wmma_index(2, lane, e), r = t / 16, c = t % 16;
        (col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[e];
    }
}

template <class T, class La, class Lb>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, La> &a,
                            const fragment<matrix_b, 16, 16, 16, T, Lb> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c, bool satf = false)
{
    (void)satf;
    float fa[8], fb[8], fc[8], fd[8];
    for (int e = 0; e < 8; e++) fa[e] = (float)a.x[e], fb[e] = (float)b.x[e], fc[e] = c.x[e];
    at_emu_wmma_mma(fd, fa, fb, fc);
    for (int e = 0; e < 8; e++) d.x[e] = fd[e];
}

} // namespace wmma
} // namespace nvcuda

#endif
