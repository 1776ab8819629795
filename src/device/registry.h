/* Devices: what is present, what this build can use, and choosing one.
 *
 * Each device kind describes itself from its own directory as an
 * at_device_driver (below): its word ("cpu", "cuda"), how to probe for its
 * devices and how to open one. The registry only walks the list of drivers;
 * device names, the default priority of "auto" and the words --device
 * accepts all come from it. The kinds today: the CPU (cpu/cpu_device.c,
 * always present); NVIDIA GPUs (cuda/cuda_device.c: the driver library is
 * loaded with dlopen, so one binary runs with or without the GPU stack);
 * Ascend NPUs (npu/) and Apple MPS (mps/), detected and reported as
 * found-but-unsupported by this build, with what would be needed. */
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

/* A growing list of probed devices (what a driver's probe appends to). */
typedef struct at_device_list {
    at_device_info *items;
    int n, cap;
    int out_of_memory; /* an append failed: at_devices_probe reports it */
} at_device_list;

/* Appends a zeroed entry of `kind` named `name` (mem_free = -1, unknown) and
 * returns it; NULL when out of memory (the probe then stops). */
at_device_info *at_device_list_add(at_device_list *list, at_device_kind kind, const char *name);

/* A device kind, as it describes itself to the registry. */
typedef struct at_device_driver {
    const char *kind;  /* the word of --device, ANYTUNE_DEVICE_PRIORITY and `anytune env`: "cuda" */
    at_device_kind id;
    int numbered;      /* its devices are "<kind>:N" and --device takes an index */
    int host;          /* the host itself: "auto" takes it after every accelerator */
    /* Appends one entry per device of this kind, or one entry with present = 0
     * and a note saying why there is none; never fails (out of memory aside). */
    void (*probe)(at_device_list *list);
    /* Whether this build has a backend for this kind (NULL: it has none). */
    int (*has_backend)(void);
    /* Opens the backend of a probed, usable device (NULL: none in this build). */
    at_status (*open)(const at_device_info *d, at_backend **out);
} at_device_driver;

/* The device kinds of this build, in probe order (the CPU first: it is entry
 * 0 of every probe). Each is at_<kind>_device_driver, defined in
 * device/<kind>/<kind>_device.c; a new kind is that file and its word here. */
#define AT_DEVICE_DRIVERS(X) X(cpu) X(cuda) X(npu) X(mps)
#define AT_DEVICE_DRIVER_DECLARE_(kind) extern const at_device_driver at_##kind##_device_driver;
AT_DEVICE_DRIVERS(AT_DEVICE_DRIVER_DECLARE_)
#undef AT_DEVICE_DRIVER_DECLARE_

/* The word of a device kind ("cpu", "cuda"; "?" for a kind no driver has). */
const char *at_device_kind_name(at_device_kind kind);

/* What "auto" tries when ANYTUNE_DEVICE_PRIORITY is unset: every accelerator
 * kind in the drivers' order, then the host ("cuda,npu,mps,cpu"). */
const char *at_device_default_priority(void);

/* The device choices, for help and error messages: "auto, cpu, cuda, cuda:N, npu, mps". */
const char *at_device_choices(void);

/* Whether spec is a well-formed device choice ("auto", a kind, or "<kind>:N"
 * for a numbered kind); AT_ERR_INVALID naming `what` and the choices if not.
 * Says nothing about whether such a device is present. */
at_status at_device_spec_check(const char *spec, const char *what);

/* Probes every device kind. *out is a new array of *n entries (caller frees
 * with free()); the CPU is always entry 0. Never fails for a missing device:
 * those are entries with present = 0 or usable = 0 and a note. */
at_status at_devices_probe(at_device_info **out, int *n);

/* Chooses a backend. spec: "auto" or one of at_device_choices(); NULL means
 * the ANYTUNE_DEVICE environment variable, else "auto". "auto" takes the
 * first usable kind in ANYTUNE_DEVICE_PRIORITY (default
 * at_device_default_priority()).
 * An explicit choice that is not usable is an error saying why, never a
 * silent fallback. */
at_status at_device_select(const char *spec, at_backend **out);

/* Kinds this build has a backend for ("cpu,cuda"), comma-separated. */
const char *at_compiled_backends(void);

/* Memory of the host: total and available bytes, honoring a cgroup limit. */
void at_host_memory(int64_t *total, int64_t *available, int *cgroup_limited);

#endif
