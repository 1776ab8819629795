/* Device profiles for the planner: what it needs to know about a device
 * (memory, the number formats it computes fast, threads) either probed from
 * the device this run uses, or one of the built-in profiles of devices that
 * are not present (--simulate_device NAME), so the decisions for a V100, an
 * A100 or an 8 GB laptop can be shown and tested on any machine. */
#ifndef AT_PLAN_PROFILES_H
#define AT_PLAN_PROFILES_H

#include <stdint.h>
#include "base/status.h"
#include "device/backend.h"

typedef struct at_device_profile {
    char name[32];           /* "cpu" (probed), "a100", "laptop-8gb", ... */
    char description[128];   /* "NVIDIA A100-SXM4-80GB", the CPU's brand string, ... */
    at_device_kind kind;
    int simulated;           /* a built-in profile, not this machine */
    int64_t mem_total;       /* bytes */
    int64_t mem_free;        /* bytes available to this run (-1: unknown, then mem_total) */
    int fast_bf16, fast_f16, tf32;
    int unified;             /* memory shared with the host (CPU, Apple silicon) */
    int threads;             /* CPU threads (per-thread scratch); 1 for accelerators */
    int64_t runtime_overhead;/* bytes the runtime takes before any tensor: CUDA context and
                                cuBLAS workspace, CANN context, ...; for the CPU the process's own
                                libraries, tokenizer and data are not counted */
} at_device_profile;

/* The built-in profiles, in a fixed order (i < at_device_profile_count()). */
int at_device_profile_count(void);
const at_device_profile *at_device_profile_at(int i);

/* The built-in profile called `name` (case-insensitive); AT_ERR_NOT_FOUND
 * listing the known names otherwise. */
at_status at_device_profile_find(const char *name, at_device_profile *out);

/* The profile of the device `spec` selects (at_device_select: NULL/"auto",
 * "cpu", "cuda:0", ...), probed now: its free memory, formats and threads. */
at_status at_device_profile_probe(const char *spec, at_device_profile *out);

/* --simulate_device NAME when name is not NULL, else the probe of spec. */
at_status at_device_profile_get(const char *simulate, const char *spec, at_device_profile *out);

#endif
