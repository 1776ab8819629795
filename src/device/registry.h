/* Devices: what is present, what this build can use, and choosing one.
 *
 * Probing asks every known device kind whether its runtime and a device are
 * present: the CPU always; NVIDIA GPUs by loading the driver library with
 * dlopen (so one binary runs with or without the GPU stack); Ascend NPUs
 * (CANN runtime library or npu-smi) and Apple MPS are detected and reported
 * as found-but-unsupported by this build, with what would be needed. */
#ifndef AT_DEVICE_REGISTRY_H
#define AT_DEVICE_REGISTRY_H

#include <stdint.h>
#include "base/status.h"
#include "device/backend.h"

typedef struct {
    at_device_kind kind;
    char name[32];         /* "cpu", "cuda:0", "npu:0", "mps" */
    char model[128];       /* e.g. CPU brand string, GPU name */
    int present;           /* the hardware/runtime was found */
    int usable;            /* this build has a backend for it and it works */
    int64_t mem_total;     /* bytes (for the CPU: RAM, or the cgroup limit) */
    int64_t mem_free;      /* bytes available now, -1 unknown */
    int cc_major, cc_minor;/* compute capability (CUDA) */
    int fast_bf16, fast_f16, tf32;
    char driver[64];       /* driver / runtime version */
    char note[320];        /* why not usable and how to fix it; "" when usable */
} at_device_info;

/* Probes every device kind. *out is a new array of *n entries (caller frees
 * with free()); the CPU is always entry 0. Never fails for a missing device:
 * those are entries with present = 0 or usable = 0 and a note. */
at_status at_devices_probe(at_device_info **out, int *n);

/* Chooses a backend. spec: "auto", "cpu", "cuda", "cuda:N", "npu", "mps"; NULL
 * means the ANYTUNE_DEVICE environment variable, else "auto". "auto" takes the
 * first usable kind in ANYTUNE_DEVICE_PRIORITY (default "cuda,npu,mps,cpu").
 * An explicit choice that is not usable is an error saying why, never a
 * silent fallback. */
at_status at_device_select(const char *spec, at_backend **out);

/* Backends compiled into this build ("cpu", ...), comma-separated. */
const char *at_compiled_backends(void);

/* Memory of the host: total and available bytes, honoring a cgroup limit. */
void at_host_memory(int64_t *total, int64_t *available, int *cgroup_limited);

#endif
