#include "device/cpu/cpu_kernels.h"

/* Every entry is filled: the CPU is the backend all others fall back on. */
#define ENTRY(name) .name = at_cpu_##name,
static const at_backend_ops table = {AT_BACKEND_OPS(ENTRY)};
#undef ENTRY

const at_backend_ops *at_cpu_ops(void) { return &table; }
