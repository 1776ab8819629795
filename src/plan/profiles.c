#include "plan/profiles.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "device/registry.h"

#define MIB ((int64_t)1 << 20)
#define GIB ((int64_t)1 << 30)

/* Memory figures are what the vendor tools report for an idle device
 * (nvidia-smi "Total", npu-smi, Metal's recommendedMaxWorkingSetSize for
 * Apple silicon, which is about two thirds of the RAM); runtime_overhead is
 * what the runtime takes once a process starts (CUDA context plus the BLAS
 * library's workspace are a few hundred MB). */
static const at_device_profile builtin[] = {
    {"v100", "NVIDIA Tesla V100-SXM2-16GB (Volta, cc 7.0)", AT_DEVICE_CUDA, 1, 16160 * MIB, 16160 * MIB,
     0, 1, 0, 0, 1, 512 * MIB},
    {"v100-32gb", "NVIDIA Tesla V100-SXM2-32GB (Volta, cc 7.0)", AT_DEVICE_CUDA, 1, 32510 * MIB, 32510 * MIB,
     0, 1, 0, 0, 1, 512 * MIB},
    {"t4", "NVIDIA Tesla T4 16GB (Turing, cc 7.5)", AT_DEVICE_CUDA, 1, 15360 * MIB, 15360 * MIB, 0, 1, 0, 0, 1,
     512 * MIB},
    {"a100", "NVIDIA A100-SXM4-80GB (Ampere, cc 8.0)", AT_DEVICE_CUDA, 1, 81920 * MIB, 81920 * MIB, 1, 1, 1, 0, 1,
     512 * MIB},
    {"a100-40gb", "NVIDIA A100-SXM4-40GB (Ampere, cc 8.0)", AT_DEVICE_CUDA, 1, 40960 * MIB, 40960 * MIB, 1, 1, 1, 0,
     1, 512 * MIB},
    {"h100", "NVIDIA H100 80GB HBM3 (Hopper, cc 9.0)", AT_DEVICE_CUDA, 1, 81559 * MIB, 81559 * MIB, 1, 1, 1, 0, 1,
     512 * MIB},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB (Ada, cc 8.9)", AT_DEVICE_CUDA, 1, 24564 * MIB, 24564 * MIB, 1, 1, 1,
     0, 1, 512 * MIB},
    {"m2-16gb", "Apple M2, 16 GB unified memory (MPS; about 10.7 GB usable by the GPU)", AT_DEVICE_MPS, 1, 16 * GIB,
     10922 * MIB, 0, 1, 0, 1, 1, 256 * MIB},
    {"ascend-910b", "Huawei Ascend 910B, 64 GB HBM (CANN)", AT_DEVICE_NPU, 1, 65536 * MIB, 65536 * MIB, 1, 1, 0, 0,
     1, 768 * MIB},
    {"laptop-8gb", "x86-64 laptop, 8 cores with AVX2 (no AVX512_BF16), 8 GB RAM of which 5.5 GB free", AT_DEVICE_CPU,
     1, 8 * GIB, 5632 * MIB, 0, 0, 0, 1, 8, 0},
};
#define NBUILTIN ((int)(sizeof builtin / sizeof builtin[0]))

int at_device_profile_count(void) { return NBUILTIN; }

const at_device_profile *at_device_profile_at(int i) { return i >= 0 && i < NBUILTIN ? &builtin[i] : NULL; }

at_status at_device_profile_find(const char *name, at_device_profile *out)
{
    for (int i = 0; name && i < NBUILTIN; i++)
        if (!strcasecmp(name, builtin[i].name)) {
            *out = builtin[i];
            return AT_OK;
        }
    char names[512];
    size_t k = 0;
    names[0] = '\0';
    for (int i = 0; i < NBUILTIN && k < sizeof names; i++) {
        int w = snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", builtin[i].name);
        if (w > 0) k += (size_t)w;
    }
    return at_error(AT_ERR_NOT_FOUND, "--simulate_device %s: no such device profile (known: %s)", name ? name : "(null)",
                    names);
}

/* The probe's entry for a selected backend: the same name, or the same kind
 * and index ("cuda:0" is the backend "cuda-emu:0" under the emulator). */
static int same_device(const at_device_info *d, const at_backend *be)
{
    if (!strcmp(d->name, be->name)) return 1;
    const char *a = strchr(d->name, ':'), *b = strchr(be->name, ':');
    return d->kind == be->kind && a && b && !strcmp(a, b);
}

at_status at_device_profile_probe(const char *spec, at_device_profile *out)
{
    memset(out, 0, sizeof *out);
    at_backend *be = NULL;
    AT_TRY(at_device_select(spec, &be));
    at_device_info *list = NULL;
    int n = 0;
    AT_TRY(at_devices_probe(&list, &n));
    const at_device_info *d = NULL;
    for (int i = 0; i < n && !d; i++)
        if (same_device(&list[i], be)) d = &list[i];
    if (!d) {
        free(list);
        return at_error(AT_ERR_INTERNAL, "device %s was selected but not found by the probe", be->name);
    }
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->description, sizeof out->description, "%s", d->model);
    out->kind = d->kind;
    out->mem_total = d->mem_total;
    out->mem_free = d->mem_free;
    out->fast_bf16 = d->fast_bf16;
    out->fast_f16 = d->fast_f16;
    out->tf32 = d->tf32;
    out->unified = d->kind == AT_DEVICE_CPU;
    out->threads = d->kind == AT_DEVICE_CPU ? omp_get_max_threads() : 1;
    out->runtime_overhead = d->kind == AT_DEVICE_CPU ? 0 : 512 * MIB;
    free(list);
    return AT_OK;
}

at_status at_device_profile_get(const char *simulate, const char *spec, at_device_profile *out)
{
    if (simulate && *simulate) return at_device_profile_find(simulate, out);
    return at_device_profile_probe(spec, out);
}
