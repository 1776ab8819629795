/* Apple MPS (Metal) as a device kind of the registry (device/registry.h):
 * present on macOS, reported as not usable, since this build has no Metal
 * backend. A Metal backend would add its open (and has_backend) here. */
#include <stdio.h>
#include "device/registry.h"

static void mps_probe(at_device_list *list)
{
    at_device_info *d = at_device_list_add(list, AT_DEVICE_MPS, "mps");
    if (!d) return;
#ifdef __APPLE__
    d->present = 1;
    snprintf(d->model, sizeof d->model, "Apple GPU (Metal)");
    snprintf(d->note, sizeof d->note,
             "found, but this build has no Metal backend; use --device cpu meanwhile");
#else
    snprintf(d->note, sizeof d->note, "Apple MPS exists only on macOS");
#endif
}

const at_device_driver at_mps_device_driver = {
    .kind = "mps",
    .id = AT_DEVICE_MPS,
    .probe = mps_probe,
};
