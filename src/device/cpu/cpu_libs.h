/* The math libraries linked into the CPU backend: their versions, and the
 * ISA tier their f32 GEMMs run at. */
#ifndef AT_DEVICE_CPU_LIBS_H
#define AT_DEVICE_CPU_LIBS_H

#include <stddef.h>
#include "device/cpu/cpu_features.h"

/* Writes e.g. "OpenBLAS 0.3.21 ..." or "not linked" into buf. */
void at_cpu_openblas_version(char *buf, size_t len);
/* Writes e.g. "oneDNN 2.6.3" or "not linked" into buf. */
void at_cpu_onednn_version(char *buf, size_t len);

/* The tier of cpu_features.h's levels each library's kernels need: a
 * library may stand in for our kernels only at a level at or above it, so
 * that ANYTUNE_CPU_ISA=avx2 on an AVX-512 CPU runs what an AVX2 machine
 * would (a library at AVX-512 made the f32 GEMMs of such a run ~1.8x as
 * fast as an AVX2 machine's). -1 where the library is not linked.
 *   oneDNN: its cap can be set once, before its first use; the first call
 *   holds it to `level` (unless ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA
 *   already caps it) and later calls return the tier it kept.
 *   OpenBLAS: the core it chose when it loaded (OPENBLAS_CORETYPE selects
 *   it, read only then), by name.
 * Kernels of SSE4.1 or AVX count as the AVX2 tier: they are not the
 * baseline build's, and not faster than an AVX2 machine's. */
int at_cpu_onednn_tier(at_cpu_isa level);
int at_cpu_openblas_tier(void);

#endif
