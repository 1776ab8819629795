#include "device/cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_kernels.h"

/* 64-byte alignment: one cache line, one AVX-512 register.
 * ANYTUNE_DEBUG_FAIL_ALLOC_ABOVE=BYTES makes every allocation larger than
 * that fail as a full device would (AT_ERR_DEVICE_OOM), so tests can drive
 * the trainer's out-of-memory retry on this machine. */
static at_status cpu_alloc(at_backend *be, size_t size, void **out)
{
    (void)be;
    const char *limit = getenv("ANYTUNE_DEBUG_FAIL_ALLOC_ABOVE");
    if (limit && *limit && size > strtoull(limit, NULL, 10))
        return at_error(AT_ERR_DEVICE_OOM, "out of device memory allocating %zu bytes (ANYTUNE_DEBUG_FAIL_ALLOC_ABOVE=%s)",
                        size, limit);
    size_t rounded = (size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) return at_error(AT_ERR_NOMEM, "out of host memory allocating %zu bytes", size);
    *out = p;
    return AT_OK;
}

static void cpu_free(at_backend *be, void *p)
{
    (void)be;
    free(p);
}

static at_status cpu_copy(at_backend *be, void *dst, const void *src, size_t n)
{
    (void)be;
    if (n) memcpy(dst, src, n);
    return AT_OK;
}

static at_status cpu_sync(at_backend *be)
{
    (void)be;
    return AT_OK;
}

static at_backend cpu = {
    .name = "cpu",
    .kind = AT_DEVICE_CPU,
    .is_host = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_sync,
};

static int initialized;

at_backend *at_cpu_backend(void)
{
    if (!initialized) {
        cpu.ops = *at_cpu_ops();
        cpu.fast_bf16 = at_cpu_fast_bf16();
        initialized = 1;
    }
    return &cpu;
}
