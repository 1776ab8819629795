/* The C interface between the core and the CUDA backend library.
 *
 * The CUDA backend is its own shared library (libanytune_cuda.so, built with
 * nvcc when the CUDA toolkit is present). The core never links it: when the
 * registry finds an NVIDIA driver and a device it loads the library with
 * dlopen and calls AT_CUDA_OPEN_SYMBOL, so one build of anytune runs on
 * machines with and without NVIDIA GPUs.
 *
 * The library does not call into the core (it is loaded by executables that
 * do not export their symbols): what it needs from the core comes in
 * at_cuda_host_api, passed at open. The same sources also build, with the
 * C++ compiler and -DAT_CUDA_EMULATE, into libanytune_cuda_emu.so, which runs
 * the kernels on the CPU under an emulation of CUDA's execution model
 * (emu/cuda_emu.h) so that the conformance suite checks their logic on a
 * machine without a GPU. */
#ifndef AT_DEVICE_CUDA_API_H
#define AT_DEVICE_CUDA_API_H

#include "base/status.h"
#include "device/backend.h"

#define AT_CUDA_API_VERSION 10 /* 2: allreduce_sum takes a list; 3: dropout counters in runs;
                                  4: add_uniform_noise; 5: softmax dropped (no caller);
                                  6: layernorm and gelu (vision towers), rope sections (M-RoPE);
                                  7: interleaved rope sections (Qwen3-VL);
                                  8: matmul_dropout (LoRA's input gradient);
                                  9: matmul_lowrank (LoRA's forward);
                                  10: dropout draws two counters per hash */
#define AT_CUDA_OPEN_SYMBOL "at_cuda_backend_open"

typedef struct at_cuda_host_api {
    int version; /* AT_CUDA_API_VERSION */
    /* at_error of the core: records the message for the calling thread. */
    at_status (*error)(at_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* at_log of the core (level as base/log.h's at_log_level). */
    void (*log)(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    const float *nf4_code;  /* device/quant.h's at_nf4_code[16] */
    const float *dyn8_code; /* device/quant.h's at_dyn8_code[256] */
} at_cuda_host_api;

/* at_cuda_backend_open(host, device_index, &backend): opens CUDA device
 * `device_index` and returns its backend (owned by the library, lives until
 * the process ends; opening the same index twice returns the same backend).
 * Errors (no device, wrong API version, out of memory) are reported through
 * host->error. */
typedef at_status (*at_cuda_open_fn)(const at_cuda_host_api *host, int device_index, at_backend **out);

#endif
