/* Ascend NPUs as a device kind of the registry (device/registry.h): found
 * through the CANN runtime library, npu-smi or the device node, and reported
 * as present but not usable, since this build has no Ascend backend. An
 * Ascend backend would add its open (and has_backend) here. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "device/registry.h"

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

static void npu_probe(at_device_list *list)
{
    at_device_info *d = at_device_list_add(list, AT_DEVICE_NPU, "npu");
    if (!d) return;
    void *lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
    int smi = in_path("npu-smi");
    int dev = access("/dev/davinci0", F_OK) == 0;
    if (lib) dlclose(lib);
    if (lib || smi || dev) {
        d->present = 1;
        snprintf(d->model, sizeof d->model, "Ascend NPU");
        snprintf(d->note, sizeof d->note,
                 "found (%s), but this build has no Ascend backend: anytune would need a CANN (ACL) backend "
                 "under src/device/npu/; use --device cpu meanwhile",
                 lib ? "CANN runtime library" : smi ? "npu-smi" : "/dev/davinci0");
    } else {
        snprintf(d->note, sizeof d->note,
                 "no Ascend NPU: neither the CANN runtime (libascendcl.so) nor npu-smi was found");
    }
}

const at_device_driver at_npu_device_driver = {
    .kind = "npu",
    .id = AT_DEVICE_NPU,
    .probe = npu_probe,
};
