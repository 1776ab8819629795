/* The CPU backend: always present, the reference every other backend falls
 * back on. Kernels are chosen at run time from cpuid. */
#ifndef AT_DEVICE_CPU_BACKEND_H
#define AT_DEVICE_CPU_BACKEND_H

#include "device/backend.h"

/* The process-wide CPU backend (created on first use; never freed). */
at_backend *at_cpu_backend(void);

/* The CPU kernels themselves, callable on host tensors by the dispatcher's
 * fallback path. Same entries as at_cpu_backend()->ops. */
const at_backend_ops *at_cpu_ops(void);

#endif
