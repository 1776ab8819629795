/* Versions of the math libraries linked into the CPU backend. */
#ifndef AT_DEVICE_CPU_LIBS_H
#define AT_DEVICE_CPU_LIBS_H

#include <stddef.h>

/* Writes e.g. "OpenBLAS 0.3.21 ..." or "not linked" into buf. */
void at_cpu_openblas_version(char *buf, size_t len);
/* Writes e.g. "oneDNN 2.6.3" or "not linked" into buf. */
void at_cpu_onednn_version(char *buf, size_t len);

#endif
