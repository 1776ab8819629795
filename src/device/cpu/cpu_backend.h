/* The CPU backend: always present, the reference every other backend falls
 * back on. Kernels are chosen at run time from cpuid. */
#ifndef AT_DEVICE_CPU_BACKEND_H
#define AT_DEVICE_CPU_BACKEND_H

#include "device/backend.h"

/* The process-wide CPU backend (created on first use; never freed). */
at_backend *at_cpu_backend(void);

#endif
