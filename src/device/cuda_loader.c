#include "device/cuda_loader.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/log.h"
#include "device/cuda/cuda_api.h"
#include "device/quant.h"

#define LIB_NAME "libanytune_cuda.so"

static int is_file(const char *p) { return access(p, R_OK) == 0; }

int at_cuda_library_find(char *buf, size_t len)
{
    const char *env = getenv("ANYTUNE_CUDA_LIBRARY");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return 1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, len, "%s/%s", exe, LIB_NAME);
            if (is_file(buf)) return 1;
        }
    }
#ifdef AT_CUDA_LIBRARY_DIR
    snprintf(buf, len, "%s/%s", AT_CUDA_LIBRARY_DIR, LIB_NAME);
    if (is_file(buf)) return 1;
#endif
    snprintf(buf, len, "%s", LIB_NAME);
    return 0;
}

/* The core's logger, with the level as an int (the library's view of at_log). */
static void host_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void host_log(int level, const char *fmt, ...)
{
    if (!at_log_enabled((at_log_level)level)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    at_log((at_log_level)level, "%s", msg);
}

static const at_cuda_host_api host_api = {
    .version = AT_CUDA_API_VERSION,
    .error = at_error,
    .log = host_log,
    .nf4_code = at_nf4_code,
    .dyn8_code = at_dyn8_code,
};

at_status at_cuda_backend_load(const char *library, int device_index, at_backend **out)
{
    *out = NULL;
    char path[4096];
    if (library) snprintf(path, sizeof path, "%s", library);
    else at_cuda_library_find(path, sizeof path);
    /* Never closed: the backend and its kernels live until the process ends. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return at_error(AT_ERR_NOT_FOUND,
                        "cannot load the CUDA backend library %s: %s (build anytune on a machine with the CUDA "
                        "toolkit, or set ANYTUNE_CUDA_LIBRARY)",
                        path, dlerror());
    at_cuda_open_fn open_fn = (at_cuda_open_fn)dlsym(lib, AT_CUDA_OPEN_SYMBOL);
    if (!open_fn)
        return at_error(AT_ERR_FORMAT, "%s is not an anytune CUDA backend (no %s)", path, AT_CUDA_OPEN_SYMBOL);
    at_clear_error();
    at_status st = open_fn(&host_api, device_index, out);
    if (st != AT_OK && !*at_last_error()) /* refused before it could report: another interface version */
        return at_error(st, "%s was built for another version of anytune (interface %d expected): rebuild it", path,
                        AT_CUDA_API_VERSION);
    if (st != AT_OK) return at_error_wrap(st, "CUDA device %d (backend %s)", device_index, path);
    at_log_debug("loaded CUDA backend %s for device %d: %s", path, device_index, (*out)->name);
    return AT_OK;
}
