#include "device/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

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

/* ---- the device kinds ---- */

/* The drivers of AT_DEVICE_DRIVERS (registry.h), in its order. */
#define DRIVER(kind) &at_##kind##_device_driver,
static const at_device_driver *const drivers[] = {AT_DEVICE_DRIVERS(DRIVER)};
#undef DRIVER
#define NDRIVERS ((int)(sizeof drivers / sizeof drivers[0]))

static const at_device_driver *driver_of(at_device_kind id)
{
    for (int i = 0; i < NDRIVERS; i++)
        if (drivers[i]->id == id) return drivers[i];
    return NULL;
}

/* The driver whose word is k[0..len), or NULL. */
static const at_device_driver *driver_named(const char *k, size_t len)
{
    for (int i = 0; i < NDRIVERS; i++)
        if (strlen(drivers[i]->kind) == len && !strncmp(k, drivers[i]->kind, len)) return drivers[i];
    return NULL;
}

const char *at_device_kind_name(at_device_kind kind)
{
    const at_device_driver *d = driver_of(kind);
    return d ? d->kind : "?";
}

/* The strings below are built once from the table: they never change. */
const char *at_device_default_priority(void)
{
    static char buf[128];
    if (!buf[0]) {
        size_t k = 0;
        for (int host = 0; host <= 1; host++)
            for (int i = 0; i < NDRIVERS; i++)
                if (drivers[i]->host == host && k < sizeof buf)
                    k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", k ? "," : "", drivers[i]->kind);
    }
    return buf;
}

const char *at_device_choices(void)
{
    static char buf[160];
    if (!buf[0]) {
        size_t k = (size_t)snprintf(buf, sizeof buf, "auto");
        for (int i = 0; i < NDRIVERS && k < sizeof buf; i++) {
            k += (size_t)snprintf(buf + k, sizeof buf - k, ", %s", drivers[i]->kind);
            if (drivers[i]->numbered && k < sizeof buf)
                k += (size_t)snprintf(buf + k, sizeof buf - k, ", %s:N", drivers[i]->kind);
        }
    }
    return buf;
}

const char *at_compiled_backends(void)
{
    static char buf[128];
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < NDRIVERS && k < sizeof buf; i++)
        if (drivers[i]->has_backend && drivers[i]->has_backend())
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", k ? "," : "", drivers[i]->kind);
    return buf;
}

/* ---- probing ---- */

at_device_info *at_device_list_add(at_device_list *list, at_device_kind kind, const char *name)
{
    if (list->n == list->cap) {
        int cap = list->cap ? list->cap * 2 : 8;
        at_device_info *nl = realloc(list->items, (size_t)cap * sizeof *nl);
        if (!nl) {
            list->out_of_memory = 1;
            return NULL;
        }
        list->items = nl;
        list->cap = cap;
    }
    at_device_info *d = &list->items[list->n++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->mem_free = -1;
    snprintf(d->name, sizeof d->name, "%s", name);
    return d;
}

at_status at_devices_probe(at_device_info **out, int *n)
{
    at_device_list list = {0};
    for (int i = 0; i < NDRIVERS && !list.out_of_memory; i++) drivers[i]->probe(&list);
    if (list.out_of_memory || list.n == 0) {
        free(list.items);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    *out = list.items;
    *n = list.n;
    return AT_OK;
}

/* ---- choosing ---- */

/* Parses "<kind>" or "<kind>:N" (idx -1 without an index). */
static at_status parse_spec(const char *spec, const char *what, const at_device_driver **drv, int *idx)
{
    *drv = NULL;
    *idx = -1;
    const char *colon = strchr(spec, ':');
    size_t kl = colon ? (size_t)(colon - spec) : strlen(spec);
    if (colon) {
        char *end = NULL;
        long v = strtol(colon + 1, &end, 10);
        if (!*(colon + 1) || *end || v < 0 || v > 1024)
            return at_error(AT_ERR_INVALID, "%s %s: the index after ':' must be a number", what, spec);
        *idx = (int)v;
    }
    *drv = driver_named(spec, kl);
    if (!*drv) return at_error(AT_ERR_INVALID, "%s %s: unknown device (use %s)", what, spec, at_device_choices());
    if (!(*drv)->numbered && *idx > 0)
        return at_error(AT_ERR_INVALID, "%s %s: there is one %s device", what, spec, (*drv)->kind);
    return AT_OK;
}

at_status at_device_spec_check(const char *spec, const char *what)
{
    const at_device_driver *drv;
    int idx;
    if (!spec) return at_error(AT_ERR_INVALID, "%s: no device given (use %s)", what, at_device_choices());
    if (!strcmp(spec, "auto")) return AT_OK;
    return parse_spec(spec, what, &drv, &idx);
}

/* Finds the device of driver drv (index idx, -1 for the first) in the probe list. */
static const at_device_info *find(const at_device_info *list, int n, const at_device_driver *drv, int idx)
{
    for (int i = 0; i < n; i++) {
        if (list[i].kind != drv->id) continue;
        if (idx < 0) return &list[i];
        char want[32];
        snprintf(want, sizeof want, "%s:%d", drv->kind, idx);
        if (!strcmp(list[i].name, want)) return &list[i];
    }
    return NULL;
}

static at_status backend_for(const at_device_info *d, at_backend **out)
{
    const at_device_driver *drv = driver_of(d->kind);
    if (drv && drv->open && d->usable) return drv->open(d, out);
    return at_error(AT_ERR_UNSUPPORTED, "device %s%s%s: %s", d->name, d->model[0] ? " (" : "", d->model[0] ? d->model : "",
                    d->note);
}

/* "auto": the first usable device of the first kind in the priority list
 * that has one. */
static at_status select_auto(const at_device_info *list, int n, at_backend **out)
{
    const char *prio = getenv("ANYTUNE_DEVICE_PRIORITY");
    if (!prio || !*prio) prio = at_device_default_priority();
    /* Validate the whole list first: a typo is an error even after a usable entry. */
    for (const char *k = prio; *k;) {
        size_t len = strcspn(k, ", ");
        if (len && !driver_named(k, len))
            return at_error(AT_ERR_INVALID, "ANYTUNE_DEVICE_PRIORITY: unknown device kind \"%.*s\" (use %s)",
                            (int)len, k, at_device_default_priority());
        k += len;
        k += strspn(k, ", ");
    }
    at_status st = at_error(AT_ERR_NOT_FOUND, "no usable device among ANYTUNE_DEVICE_PRIORITY=%s", prio);
    for (const char *k = prio; *k && !*out;) {
        size_t len = strcspn(k, ", ");
        const at_device_driver *drv = len ? driver_named(k, len) : NULL;
        for (int i = 0; drv && i < n; i++) {
            if (list[i].kind != drv->id || !list[i].usable) continue;
            st = backend_for(&list[i], out);
            break;
        }
        k += len;
        k += strspn(k, ", ");
    }
    if (!*out) return st;
    for (int i = 0; i < n; i++)
        if (list[i].present && !list[i].usable && list[i].kind != (*out)->kind)
            at_log_warn("%s (%s) %s; running on %s", list[i].name, list[i].model, list[i].note, (*out)->name);
    at_clear_error();
    at_log_debug("device auto: chose %s", (*out)->name);
    return AT_OK;
}

/* An explicit choice: that device, or an error saying why not. */
static at_status select_named(const char *spec, const at_device_info *list, int n, at_backend **out)
{
    const at_device_driver *drv;
    int idx;
    AT_TRY(parse_spec(spec, "--device", &drv, &idx));
    const at_device_info *d = find(list, n, drv, drv->numbered ? (idx < 0 ? 0 : idx) : -1);
    if (!d) d = find(list, n, drv, -1);
    if (!d) return at_error(AT_ERR_NOT_FOUND, "--device %s: no such device", spec);
    if (!d->present) return at_error(AT_ERR_NOT_FOUND, "--device %s: not available: %s", spec, d->note);
    if (drv->numbered && idx >= 0 && strcmp(d->name, spec) != 0)
        return at_error(AT_ERR_NOT_FOUND, "--device %s: no such device (the first is %s)", spec, d->name);
    return backend_for(d, out);
}

at_status at_device_select(const char *spec, at_backend **out)
{
    *out = NULL;
    if (!spec || !*spec) spec = getenv("ANYTUNE_DEVICE");
    if (!spec || !*spec) spec = "auto";
    at_device_info *list = NULL;
    int n = 0;
    AT_TRY(at_devices_probe(&list, &n));
    at_status st = !strcmp(spec, "auto") ? select_auto(list, n, out) : select_named(spec, list, n, out);
    free(list);
    return st;
}
