/* The CPU as a device kind of the registry (device/registry.h): always
 * present and usable, one device named "cpu", opened as at_cpu_backend(). */
#include <stdio.h>
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/registry.h"

static void cpu_probe(at_device_list *list)
{
    at_device_info *d = at_device_list_add(list, AT_DEVICE_CPU, "cpu");
    if (!d) return;
    const at_cpu_features *f = at_cpu_get_features();
    d->present = 1;
    d->usable = 1;
    snprintf(d->model, sizeof d->model, "%s", f->model[0] ? f->model : "unknown CPU");
    int cg;
    at_host_memory(&d->mem_total, &d->mem_free, &cg);
    d->fast_bf16 = at_cpu_fast_bf16();
    d->fast_f16 = 0;
}

static int cpu_has_backend(void) { return 1; }

static at_status cpu_open(const at_device_info *d, at_backend **out)
{
    (void)d;
    *out = at_cpu_backend();
    return AT_OK;
}

const at_device_driver at_cpu_device_driver = {
    .kind = "cpu",
    .id = AT_DEVICE_CPU,
    .numbered = 0,
    .host = 1,
    .probe = cpu_probe,
    .has_backend = cpu_has_backend,
    .open = cpu_open,
};
