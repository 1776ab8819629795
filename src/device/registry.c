#include "device/registry.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "device/cuda_loader.h"
#include "device/cpu/cpu_features.h"

/* ---- host memory ---- */

static int64_t read_int64_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = {0};
    int64_t v = -1;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0) v = strtoll(buf, NULL, 10);
    fclose(f);
    return v;
}

void at_host_memory(int64_t *total, int64_t *available, int *cgroup_limited)
{
    *total = -1;
    *available = -1;
    *cgroup_limited = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            long long kb;
            if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) *total = kb * 1024;
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) *available = kb * 1024;
        }
        fclose(f);
    }
    /* cgroup v2, then v1: a limit below the machine's memory is what we really have. */
    int64_t limit = read_int64_file("/sys/fs/cgroup/memory.max");
    int64_t used = read_int64_file("/sys/fs/cgroup/memory.current");
    if (limit <= 0) {
        limit = read_int64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = read_int64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (limit > 0 && (*total < 0 || limit < *total)) {
        *total = limit;
        *cgroup_limited = 1;
        if (used >= 0) {
            int64_t free_in_cg = limit - used;
            if (*available < 0 || free_in_cg < *available) *available = free_in_cg;
        }
    }
}

/* ---- CUDA, through the driver API loaded at run time ---- */

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_dev_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_ctx_retain_fn)(void **, int);
typedef int (*cu_ctx_release_fn)(int);
typedef int (*cu_ctx_set_fn)(void *);
typedef int (*cu_meminfo_fn)(size_t *, size_t *);

/* ANYTUNE_CUDA_EMULATE=LIBRARY (tests): one CUDA device served by the
 * emulator build of the backend (device/cuda/emu), which runs the CUDA
 * kernels on the CPU; the whole program then runs "on CUDA" without a GPU. */
static int probe_cuda_emulated(at_device_info **list, int *n, int *cap)
{
    const char *lib = getenv("ANYTUNE_CUDA_EMULATE");
    if (!lib || !*lib) return 0;
    at_device_info d;
    memset(&d, 0, sizeof d);
    d.kind = AT_DEVICE_CUDA;
    d.present = d.usable = 1;
    snprintf(d.name, sizeof d.name, "cuda:0");
    snprintf(d.model, sizeof d.model, "CUDA emulator on the CPU (%.80s)", lib);
    snprintf(d.driver, sizeof d.driver, "emulated");
    int limited = 0;
    at_host_memory(&d.mem_total, &d.mem_free, &limited);
    d.cc_major = 9;
    d.fast_bf16 = d.fast_f16 = d.tf32 = 1;
    if (*n == *cap) {
        at_device_info *nl = realloc(*list, (size_t)(*cap * 2) * sizeof **list);
        if (!nl) return 0;
        *list = nl;
        *cap *= 2;
    }
    (*list)[(*n)++] = d;
    return 1;
}

static int probe_cuda(at_device_info **list, int *n, int *cap)
{
    if (probe_cuda_emulated(list, n, cap)) return 1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    at_device_info info;
    memset(&info, 0, sizeof info);
    info.kind = AT_DEVICE_CUDA;
    snprintf(info.name, sizeof info.name, "cuda");
    info.mem_free = -1;
    if (!lib) {
        snprintf(info.note, sizeof info.note,
                 "no NVIDIA driver library (libcuda.so.1) found: install the NVIDIA driver to use a GPU");
        goto add_absent;
    }
    cu_init_fn cuInit = (cu_init_fn)dlsym(lib, "cuInit");
    cu_int_fn cuDriverGetVersion = (cu_int_fn)dlsym(lib, "cuDriverGetVersion");
    cu_int_fn cuDeviceGetCount = (cu_int_fn)dlsym(lib, "cuDeviceGetCount");
    cu_dev_get_fn cuDeviceGet = (cu_dev_get_fn)dlsym(lib, "cuDeviceGet");
    cu_name_fn cuDeviceGetName = (cu_name_fn)dlsym(lib, "cuDeviceGetName");
    cu_mem_fn cuDeviceTotalMem = (cu_mem_fn)dlsym(lib, "cuDeviceTotalMem_v2");
    cu_attr_fn cuDeviceGetAttribute = (cu_attr_fn)dlsym(lib, "cuDeviceGetAttribute");
    cu_ctx_retain_fn cuDevicePrimaryCtxRetain = (cu_ctx_retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu_ctx_release_fn cuDevicePrimaryCtxRelease = (cu_ctx_release_fn)dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    cu_ctx_set_fn cuCtxSetCurrent = (cu_ctx_set_fn)dlsym(lib, "cuCtxSetCurrent");
    cu_meminfo_fn cuMemGetInfo = (cu_meminfo_fn)dlsym(lib, "cuMemGetInfo_v2");
    if (!cuInit || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName || !cuDeviceTotalMem ||
        !cuDeviceGetAttribute) {
        snprintf(info.note, sizeof info.note, "the NVIDIA driver library is too old (missing entry points)");
        goto add_absent_close;
    }
    int rc = cuInit(0);
    if (rc != 0) {
        snprintf(info.note, sizeof info.note,
                 "NVIDIA driver found but cuInit failed (error %d): no usable GPU, or the driver and kernel "
                 "module versions differ",
                 rc);
        goto add_absent_close;
    }
    int version = 0, count = 0;
    if (cuDriverGetVersion) cuDriverGetVersion(&version);
    cuDeviceGetCount(&count);
    if (count == 0) {
        snprintf(info.note, sizeof info.note, "NVIDIA driver %d.%d found but no GPU is visible", version / 1000,
                 (version % 1000) / 10);
        goto add_absent_close;
    }
    for (int i = 0; i < count; i++) {
        at_device_info d;
        memset(&d, 0, sizeof d);
        d.kind = AT_DEVICE_CUDA;
        d.present = 1;
        d.mem_free = -1;
        snprintf(d.name, sizeof d.name, "cuda:%d", i);
        snprintf(d.driver, sizeof d.driver, "CUDA driver %d.%d", version / 1000, (version % 1000) / 10);
        int dev = 0;
        if (cuDeviceGet(&dev, i) != 0) continue;
        cuDeviceGetName(d.model, sizeof d.model, dev);
        size_t total = 0;
        cuDeviceTotalMem(&total, dev);
        d.mem_total = (int64_t)total;
        cuDeviceGetAttribute(&d.cc_major, 75, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        cuDeviceGetAttribute(&d.cc_minor, 76, dev); /* ..._MINOR */
        d.fast_bf16 = d.cc_major >= 8;
        d.tf32 = d.cc_major >= 8;
        d.fast_f16 = d.cc_major > 7 || (d.cc_major == 7 && d.cc_minor >= 0);
        if (cuDevicePrimaryCtxRetain && cuCtxSetCurrent && cuMemGetInfo && cuDevicePrimaryCtxRelease) {
            void *ctx = NULL;
            if (cuDevicePrimaryCtxRetain(&ctx, dev) == 0) {
                size_t fr = 0, tot = 0;
                if (cuCtxSetCurrent(ctx) == 0 && cuMemGetInfo(&fr, &tot) == 0) d.mem_free = (int64_t)fr;
                cuDevicePrimaryCtxRelease(dev);
            }
        }
        char lib_path[512];
        if (d.cc_major * 10 + d.cc_minor < 75) {
            /* CUDA 13, which builds the backend, compiles for Turing (7.5) and newer */
            snprintf(d.note, sizeof d.note,
                     "compute capability %d.%d is older than 7.5, the oldest the CUDA backend is built for",
                     d.cc_major, d.cc_minor);
        } else if (at_cuda_library_find(lib_path, sizeof lib_path)) {
            d.usable = 1;
        } else {
            snprintf(d.note, sizeof d.note,
                     "found, but this build has no CUDA backend (%.120s): rebuild on a machine with the CUDA "
                     "toolkit (nvcc, cuBLAS) installed, or set ANYTUNE_CUDA_LIBRARY",
                     lib_path);
        }
        if (*n == *cap) {
            *cap *= 2;
            at_device_info *nl = realloc(*list, (size_t)*cap * sizeof **list);
            if (!nl) break;
            *list = nl;
        }
        (*list)[(*n)++] = d;
    }
    dlclose(lib);
    return count;
add_absent_close:
    dlclose(lib);
add_absent:
    if (*n == *cap) {
        *cap *= 2;
        at_device_info *nl = realloc(*list, (size_t)*cap * sizeof **list);
        if (!nl) return 0;
        *list = nl;
    }
    (*list)[(*n)++] = info;
    return 0;
}

static int in_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *copy = strdup(path);
    if (!copy) return 0;
    int found = 0;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s/%s", dir, prog);
        found = access(buf, X_OK) == 0;
    }
    free(copy);
    return found;
}

static void probe_npu(at_device_info *d)
{
    memset(d, 0, sizeof *d);
    d->kind = AT_DEVICE_NPU;
    d->mem_free = -1;
    snprintf(d->name, sizeof d->name, "npu");
    void *lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
    int smi = in_path("npu-smi");
    int dev = access("/dev/davinci0", F_OK) == 0;
    if (lib) dlclose(lib);
    if (lib || smi || dev) {
        d->present = 1;
        snprintf(d->model, sizeof d->model, "Ascend NPU");
        snprintf(d->note, sizeof d->note,
                 "found (%s), but this build has no Ascend backend: anytune would need a CANN (ACL) backend "
                 "under src/device/; use --device cpu meanwhile",
                 lib ? "CANN runtime library" : smi ? "npu-smi" : "/dev/davinci0");
    } else {
        snprintf(d->note, sizeof d->note,
                 "no Ascend NPU: neither the CANN runtime (libascendcl.so) nor npu-smi was found");
    }
}

static void probe_mps(at_device_info *d)
{
    memset(d, 0, sizeof *d);
    d->kind = AT_DEVICE_MPS;
    d->mem_free = -1;
    snprintf(d->name, sizeof d->name, "mps");
#ifdef __APPLE__
    d->present = 1;
    snprintf(d->model, sizeof d->model, "Apple GPU (Metal)");
    snprintf(d->note, sizeof d->note,
             "found, but this build has no Metal backend; use --device cpu meanwhile");
#else
    snprintf(d->note, sizeof d->note, "Apple MPS exists only on macOS");
#endif
}

static void probe_cpu(at_device_info *d)
{
    memset(d, 0, sizeof *d);
    const at_cpu_features *f = at_cpu_get_features();
    d->kind = AT_DEVICE_CPU;
    d->present = 1;
    d->usable = 1;
    snprintf(d->name, sizeof d->name, "cpu");
    snprintf(d->model, sizeof d->model, "%s", f->model[0] ? f->model : "unknown CPU");
    int cg;
    at_host_memory(&d->mem_total, &d->mem_free, &cg);
    d->fast_bf16 = at_cpu_fast_bf16();
    d->fast_f16 = 0;
}

at_status at_devices_probe(at_device_info **out, int *n)
{
    int cap = 8;
    at_device_info *list = calloc((size_t)cap, sizeof *list);
    if (!list) return at_error(AT_ERR_NOMEM, "out of memory");
    *n = 0;
    probe_cpu(&list[(*n)++]);
    probe_cuda(&list, n, &cap);
    if (*n + 2 > cap) {
        at_device_info *nl = realloc(list, (size_t)(*n + 2) * sizeof *list);
        if (!nl) {
            free(list);
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        list = nl;
    }
    probe_npu(&list[(*n)++]);
    probe_mps(&list[(*n)++]);
    *out = list;
    return AT_OK;
}

const char *at_compiled_backends(void)
{
    char path[512];
    return at_cuda_library_find(path, sizeof path) ? "cpu,cuda" : "cpu";
}

static const char *kind_word(at_device_kind k)
{
    switch (k) {
    case AT_DEVICE_CPU: return "cpu";
    case AT_DEVICE_CUDA: return "cuda";
    case AT_DEVICE_NPU: return "npu";
    case AT_DEVICE_MPS: return "mps";
    default: return "?";
    }
}

/* Whether k[0..len) names a device kind. */
static int is_kind(const char *k, size_t len)
{
    static const char *kinds[] = {"cpu", "cuda", "npu", "mps"};
    for (size_t i = 0; i < 4; i++)
        if (strlen(kinds[i]) == len && !strncmp(k, kinds[i], len)) return 1;
    return 0;
}

/* Finds the device `kind` (index idx, -1 for the first) in the probe list. */
static const at_device_info *find(const at_device_info *list, int n, const char *kind, int idx)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(kind_word(list[i].kind), kind) != 0) continue;
        if (idx < 0) return &list[i];
        char want[32];
        snprintf(want, sizeof want, "%s:%d", kind, idx);
        if (!strcmp(list[i].name, want)) return &list[i];
    }
    return NULL;
}

static at_status backend_for(const at_device_info *d, at_backend **out)
{
    if (d->kind == AT_DEVICE_CPU) {
        *out = at_cpu_backend();
        return AT_OK;
    }
    if (d->kind == AT_DEVICE_CUDA && d->usable) {
        const char *emu = getenv("ANYTUNE_CUDA_EMULATE");
        return at_cuda_backend_load(emu && *emu ? emu : NULL, atoi(d->name + 5), out);
    }
    return at_error(AT_ERR_UNSUPPORTED, "device %s%s%s: %s", d->name, d->model[0] ? " (" : "", d->model[0] ? d->model : "",
                    d->note);
}

at_status at_device_select(const char *spec, at_backend **out)
{
    *out = NULL;
    if (!spec || !*spec) spec = getenv("ANYTUNE_DEVICE");
    if (!spec || !*spec) spec = "auto";
    at_device_info *list = NULL;
    int n = 0;
    AT_TRY(at_devices_probe(&list, &n));
    at_status st = AT_OK;
    if (!strcmp(spec, "auto")) {
        const char *prio = getenv("ANYTUNE_DEVICE_PRIORITY");
        if (!prio || !*prio) prio = "cuda,npu,mps,cpu";
        char *copy = strdup(prio);
        if (!copy) {
            free(list);
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        st = at_error(AT_ERR_NOT_FOUND, "no usable device among ANYTUNE_DEVICE_PRIORITY=%s", prio);
        /* Validate the whole list first: a typo is an error even after a usable entry. */
        for (const char *k = prio; *k;) {
            size_t len = strcspn(k, ", ");
            if (len && !is_kind(k, len)) {
                free(copy);
                free(list);
                return at_error(AT_ERR_INVALID,
                                "ANYTUNE_DEVICE_PRIORITY: unknown device kind \"%.*s\" (use cuda, npu, mps, cpu)",
                                (int)len, k);
            }
            k += len;
            k += strspn(k, ", ");
        }
        for (char *save = NULL, *k = strtok_r(copy, ", ", &save); k; k = strtok_r(NULL, ", ", &save)) {
            for (int i = 0; i < n; i++) {
                if (strcmp(kind_word(list[i].kind), k) != 0 || !list[i].usable) continue;
                st = backend_for(&list[i], out);
                break;
            }
            if (*out) break;
        }
        free(copy);
        for (int i = 0; *out && i < n; i++)
            if (list[i].present && !list[i].usable && list[i].kind != (*out)->kind)
                at_log_warn("%s (%s) %s; running on %s", list[i].name, list[i].model, list[i].note, (*out)->name);
        if (*out) {
            at_clear_error();
            st = AT_OK;
            at_log_debug("device auto: chose %s", (*out)->name);
        }
    } else {
        char kind[16] = {0};
        int idx = -1;
        const char *colon = strchr(spec, ':');
        size_t kl = colon ? (size_t)(colon - spec) : strlen(spec);
        if (kl >= sizeof kind) kl = sizeof kind - 1;
        memcpy(kind, spec, kl);
        if (colon) {
            char *end = NULL;
            long v = strtol(colon + 1, &end, 10);
            if (!*(colon + 1) || *end || v < 0 || v > 1024) {
                free(list);
                return at_error(AT_ERR_INVALID, "--device %s: the index after ':' must be a number", spec);
            }
            idx = (int)v;
        }
        if (!is_kind(kind, strlen(kind))) {
            st = at_error(AT_ERR_INVALID, "--device %s: unknown device (use auto, cpu, cuda, cuda:N, npu, mps)", spec);
        } else if (!strcmp(kind, "cpu") && idx > 0) {
            st = at_error(AT_ERR_INVALID, "--device %s: there is one CPU device", spec);
        } else {
            const at_device_info *d = find(list, n, kind, !strcmp(kind, "cuda") ? (idx < 0 ? 0 : idx) : -1);
            if (!d) d = find(list, n, kind, -1);
            if (!d) {
                st = at_error(AT_ERR_NOT_FOUND, "--device %s: no such device", spec);
            } else if (!d->present) {
                st = at_error(AT_ERR_NOT_FOUND, "--device %s: not available: %s", spec, d->note);
            } else if (!strcmp(kind, "cuda") && idx >= 0 && strcmp(d->name, spec) != 0) {
                st = at_error(AT_ERR_NOT_FOUND, "--device %s: no such GPU", spec);
            } else {
                st = backend_for(d, out);
            }
        }
    }
    free(list);
    return st;
}
