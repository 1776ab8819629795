/* anytune env: what this machine has, for a person or (--json) a program.
 * The report is built once as JSON; the text form is printed from it. */
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>
#include <yaml.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "base/status.h"
#include "cli/cli.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_libs.h"
#include "device/cpu/gemm.h"
#include "device/cpu/gemm_tune.h"
#include "device/registry.h"

static cJSON *cpu_report(void)
{
    const at_cpu_features *f = at_cpu_get_features();
    cJSON *cpu = cJSON_CreateObject();
    cJSON_AddStringToObject(cpu, "model", f->model[0] ? f->model : "unknown");
    cJSON_AddNumberToObject(cpu, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(cpu, "threads", (double)omp_get_max_threads());
    cJSON *isa = cJSON_AddArrayToObject(cpu, "isa_features");
    const char *names[32];
    int n = at_cpu_feature_names(names, 32);
    for (int i = 0; i < n && i < 32; i++) cJSON_AddItemToArray(isa, cJSON_CreateString(names[i]));
    cJSON_AddStringToObject(cpu, "kernels", at_cpu_isa_name(at_cpu_isa_level()));
    return cpu;
}

static cJSON *memory_report(void)
{
    int64_t total, avail;
    int cg;
    at_host_memory(&total, &avail, &cg);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "total_bytes", (double)total);
    cJSON_AddNumberToObject(m, "available_bytes", (double)avail);
    cJSON_AddBoolToObject(m, "cgroup_limit", cg);
    return m;
}

static cJSON *library_report(void)
{
    cJSON *l = cJSON_CreateObject();
    char buf[256];
    cJSON_AddStringToObject(l, "cjson", cJSON_Version());
    cJSON_AddStringToObject(l, "libyaml", yaml_get_version_string());
    pcre2_config(PCRE2_CONFIG_VERSION, buf);
    cJSON_AddStringToObject(l, "pcre2", buf);
    cJSON_AddStringToObject(l, "utf8proc", utf8proc_version());
    cJSON_AddStringToObject(l, "libmicrohttpd", MHD_get_version());
    at_cpu_openblas_version(buf, sizeof buf);
    cJSON_AddStringToObject(l, "openblas", buf);
    at_cpu_onednn_version(buf, sizeof buf);
    cJSON_AddStringToObject(l, "onednn", buf);
    snprintf(buf, sizeof buf, "%d", _OPENMP);
    cJSON_AddStringToObject(l, "openmp", buf);
    return l;
}

static cJSON *device_report(const at_device_info *d)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddStringToObject(o, "kind", at_device_kind_name(d->kind));
    cJSON_AddStringToObject(o, "model", d->model);
    cJSON_AddBoolToObject(o, "present", d->present);
    cJSON_AddBoolToObject(o, "usable", d->usable);
    if (d->present) {
        cJSON_AddNumberToObject(o, "memory_total_bytes", (double)d->mem_total);
        cJSON_AddNumberToObject(o, "memory_free_bytes", (double)d->mem_free);
        cJSON *fmt = cJSON_AddArrayToObject(o, "number_formats");
        cJSON_AddItemToArray(fmt, cJSON_CreateString("f32"));
        if (d->fast_bf16) cJSON_AddItemToArray(fmt, cJSON_CreateString("bf16"));
        if (d->fast_f16) cJSON_AddItemToArray(fmt, cJSON_CreateString("f16"));
        if (d->tf32) cJSON_AddItemToArray(fmt, cJSON_CreateString("tf32"));
        if (d->cc_major > 0) { /* a GPU with a compute capability (CUDA's numbering) */
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
            cJSON_AddStringToObject(o, "compute_capability", cc);
        }
        if (d->driver[0]) cJSON_AddStringToObject(o, "driver", d->driver);
    }
    if (d->note[0]) cJSON_AddStringToObject(o, "note", d->note);
    return o;
}

static at_status build_report(cJSON **out)
{
    at_device_info *devs = NULL;
    int n = 0;
    AT_TRY(at_devices_probe(&devs, &n));
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "cpu", cpu_report());
    cJSON_AddItemToObject(r, "memory", memory_report());
    cJSON *dl = cJSON_AddArrayToObject(r, "devices");
    cJSON *unusable = cJSON_AddArrayToObject(r, "unusable");
    for (int i = 0; i < n; i++) {
        if (devs[i].present) cJSON_AddItemToArray(dl, device_report(&devs[i]));
        if (!devs[i].usable) {
            cJSON *u = cJSON_CreateObject();
            cJSON_AddStringToObject(u, "kind", at_device_kind_name(devs[i].kind));
            cJSON_AddStringToObject(u, "name", devs[i].name);
            cJSON_AddBoolToObject(u, "present", devs[i].present);
            cJSON_AddStringToObject(u, "reason", devs[i].note);
            cJSON_AddItemToArray(unusable, u);
        }
    }
    free(devs);
    cJSON *be = cJSON_AddArrayToObject(r, "backends");
    char backends[128];
    snprintf(backends, sizeof backends, "%s", at_compiled_backends());
    for (char *save = NULL, *t = strtok_r(backends, ",", &save); t; t = strtok_r(NULL, ",", &save))
        cJSON_AddItemToArray(be, cJSON_CreateString(t));
    cJSON *g = cJSON_AddObjectToObject(r, "gemm_engine");
    cJSON_AddStringToObject(g, "f32", at_cpu_gemm_engine(AT_F32));
    cJSON_AddStringToObject(g, "bf16", at_cpu_gemm_engine(AT_BF16));
    if (at_cpu_gemm_tune_all()) {
        cJSON_AddStringToObject(g, "cache", at_gemm_tune_cache_path());
        cJSON *cl = cJSON_AddArrayToObject(g, "classes");
        for (int c = 0; c < AT_GEMM_CLASSES; c++) {
            at_gemm_tune_result res = at_gemm_tune_result_of(c);
            if (!res.known) continue;
            int ta, tb;
            int64_t M, N, K;
            char shape[64];
            at_gemm_tune_class_shape(c, &ta, &tb, &M, &N, &K);
            snprintf(shape, sizeof shape, "%lldx%lldx%lld%s%s", (long long)M, (long long)N, (long long)K,
                     ta ? " A^T" : "", tb ? " B^T" : "");
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "class", at_gemm_tune_class_name(c));
            cJSON_AddStringToObject(o, "timed_shape", shape);
            cJSON_AddStringToObject(o, "engine", at_gemm_engine_name(res.choice));
            cJSON_AddBoolToObject(o, "from_cache", res.from_cache);
            cJSON_AddBoolToObject(o, "steady", res.steady);
            cJSON *gf = cJSON_AddObjectToObject(o, "gflops");
            for (int e = 0; e < AT_GEMM_ENGINES; e++)
                if (res.gflops[e] >= 0)
                    cJSON_AddNumberToObject(gf, at_gemm_engine_name((at_gemm_engine_id)e), res.gflops[e]);
            cJSON_AddItemToArray(cl, o);
        }
    }
    cJSON_AddItemToObject(r, "libraries", library_report());
    const char *dev_env = getenv("ANYTUNE_DEVICE");
    cJSON_AddStringToObject(r, "device_default", dev_env && *dev_env ? dev_env : "auto");
    *out = r;
    return AT_OK;
}

static double gib(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && cJSON_IsNumber(v) && v->valuedouble >= 0 ? v->valuedouble / (1024.0 * 1024 * 1024) : -1;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && cJSON_IsString(v) ? v->valuestring : "";
}

static void print_list(const cJSON *arr)
{
    const cJSON *it;
    int first = 1;
    cJSON_ArrayForEach(it, arr)
    {
        printf("%s%s", first ? "" : " ", it->valuestring);
        first = 0;
    }
}

static void print_text(const cJSON *r)
{
    const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(r, "cpu");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(r, "memory");
    printf("CPU:        %s, %d cores, %d threads\n", str(cpu, "model"),
           cJSON_GetObjectItemCaseSensitive(cpu, "cores")->valueint,
           cJSON_GetObjectItemCaseSensitive(cpu, "threads")->valueint);
    printf("ISA:        ");
    print_list(cJSON_GetObjectItemCaseSensitive(cpu, "isa_features"));
    printf("\nkernels:    %s\n", str(cpu, "kernels"));
    printf("memory:     %.1f GiB total, %.1f GiB available%s\n", gib(mem, "total_bytes"), gib(mem, "available_bytes"),
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mem, "cgroup_limit")) ? " (cgroup limit)" : "");
    printf("backends:   ");
    print_list(cJSON_GetObjectItemCaseSensitive(r, "backends"));
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "gemm_engine");
    printf("\nGEMM:       f32: %s; bf16: %s\n", str(g, "f32"), str(g, "bf16"));
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(g, "classes");
    if (cJSON_GetArraySize(cl) > 0) {
        printf("            f32 engine per class (GFLOP/s measured here, cache %s):\n", str(g, "cache"));
        const cJSON *c;
        cJSON_ArrayForEach(c, cl)
        {
            printf("            %-12s %-9s", str(c, "class"), str(c, "engine"));
            const cJSON *v;
            cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(c, "gflops"))
                printf(" %s %.1f", v->string, v->valuedouble);
            printf("  (%s%s)\n", str(c, "timed_shape"),
                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "from_cache")) ? ", cached"
                   : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "steady")) ? ""
                                                                                 : ", under load: not cached");
        }
    }
    printf("\ndevices:\n");
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r, "devices"))
    {
        printf("  %-8s %s%s\n", str(d, "name"), str(d, "model"),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "usable")) ? "" : "  [not usable]");
        printf("           memory %.1f GiB", gib(d, "memory_total_bytes"));
        if (gib(d, "memory_free_bytes") >= 0) printf(" (%.1f GiB free)", gib(d, "memory_free_bytes"));
        printf(", formats: ");
        print_list(cJSON_GetObjectItemCaseSensitive(d, "number_formats"));
        if (*str(d, "compute_capability")) printf(", compute capability %s, %s", str(d, "compute_capability"), str(d, "driver"));
        printf("\n");
    }
    printf("\nnot usable here:\n");
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r, "unusable"))
        printf("  %-8s %s\n", str(d, "name"), str(d, "reason"));
    printf("\nlibraries:\n");
    const cJSON *l;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(r, "libraries"))
        printf("  %-14s %s\n", l->string, l->valuestring);
    printf("\ndevice choice: --device / ANYTUNE_DEVICE = %s", str(r, "device_default"));
    const char *prio = getenv("ANYTUNE_DEVICE_PRIORITY");
    printf(", priority %s\n", prio && *prio ? prio : at_device_default_priority());
}

int at_cmd_env(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: anytune env [--json]\n  Prints the CPU, memory, devices, number formats, compiled-in\n"
                   "  backends, GEMM engine and library versions; for each device kind that\n"
                   "  cannot be used, why and how to fix it.\n");
            return 0;
        } else {
            fprintf(stderr, "anytune env: unknown option '%s' (see anytune env --help)\n", argv[i]);
            return 2;
        }
    }
    cJSON *r = NULL;
    if (build_report(&r) != AT_OK) return at_cli_fail();
    if (json) {
        char *s = cJSON_Print(r);
        if (!s) {
            cJSON_Delete(r);
            fprintf(stderr, "anytune: error: out of memory\n");
            return 1;
        }
        printf("%s\n", s);
        free(s);
    } else {
        print_text(r);
    }
    cJSON_Delete(r);
    return 0;
}
