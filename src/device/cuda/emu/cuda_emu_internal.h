/* What the parts of the CUDA emulator share (runtime, launches, cuBLAS);
 * not for the backend's sources, which see only cuda_emu.h. */
#ifndef AT_DEVICE_CUDA_EMU_INTERNAL_H
#define AT_DEVICE_CUDA_EMU_INTERNAL_H

#include <mutex>
#include "device/cuda/emu/cuda_emu.h"

#define AT_EMU_SHARED_DEFAULT ((size_t)48 * 1024) /* dynamic shared memory without opting in */
#define AT_EMU_SHARED_OPTIN ((size_t)232448)      /* the most a kernel may opt in to (Hopper) */

/* Held by every entry point that touches emulator state. */
extern AT_EMU_HIDDEN std::recursive_mutex at_emu_lock;
/* The largest dynamic shared memory cudaFuncSetAttribute allowed any kernel. */
extern AT_EMU_HIDDEN size_t at_emu_shared_optin;

/* Records e as the calling thread's last error, with a detailed message
 * (at_emu_error_detail); returns e. */
AT_EMU_HIDDEN cudaError_t at_emu_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether [p, p + n) lies inside one live device allocation. */
AT_EMU_HIDDEN bool at_emu_is_device(const void *p, size_t n);
/* Whether any byte of [p, p + n) is device memory (or its guard zones). */
AT_EMU_HIDDEN bool at_emu_touches_device(const void *p, size_t n);
/* Whether s is the default stream or a live one. */
AT_EMU_HIDDEN bool at_emu_stream_ok(cudaStream_t s);
/* Why work may not be queued on s (NULL when it may): s is not live, or it is
 * a default stream while non-blocking streams are alive, so that the work
 * would not be ordered with theirs (a race on a GPU). */
AT_EMU_HIDDEN const char *at_emu_stream_problem(cudaStream_t s);
/* Checks every allocation's guard zones: a damaged one becomes
 * cudaErrorIllegalAddress naming `who` (and is repaired). */
AT_EMU_HIDDEN cudaError_t at_emu_check_guards(const char *who);

#endif
