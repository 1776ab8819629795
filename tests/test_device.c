/* Device probing and selection: auto, explicit, environment variables, and
 * clear errors for unavailable choices. Also `anytune env --json`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/json.h"
#include "device/registry.h"
#include "device/cuda_loader.h"
#include "testing.h"

static void test_probe(void)
{
    at_device_info *d = NULL;
    int n = 0;
    CHECK_OK(at_devices_probe(&d, &n));
    CHECK(n >= 4);
    CHECK(d[0].kind == AT_DEVICE_CPU && d[0].usable && d[0].mem_total > 0);
    int kinds[5] = {0};
    for (int i = 0; i < n; i++) {
        kinds[d[i].kind]++;
        if (!d[i].usable) CHECK_MSG(d[i].note[0] != '\0', "%s unusable without a reason", d[i].name);
    }
    CHECK(kinds[AT_DEVICE_CUDA] >= 1 && kinds[AT_DEVICE_NPU] == 1 && kinds[AT_DEVICE_MPS] == 1);
    free(d);
}

/* Usable CUDA devices here: the answers of "auto" and "cuda" depend on it
 * (a machine with a GPU and this build's CUDA library picks it). */
static int usable_cuda(void)
{
    at_device_info *d = NULL;
    int n = 0, k = 0;
    if (at_devices_probe(&d, &n) != AT_OK) return 0;
    for (int i = 0; i < n; i++) k += d[i].kind == AT_DEVICE_CUDA && d[i].usable;
    free(d);
    return k;
}

static void test_select(void)
{
    at_backend *be = NULL;
    unsetenv("ANYTUNE_DEVICE");
    unsetenv("ANYTUNE_DEVICE_PRIORITY");
    int gpus = usable_cuda();
    at_device_kind first = gpus ? AT_DEVICE_CUDA : AT_DEVICE_CPU; /* what auto takes: cuda before cpu */
    printf("usable CUDA devices: %d\n", gpus);
    CHECK_OK(at_device_select("cpu", &be));
    CHECK(be && !strcmp(be->name, "cpu"));
    CHECK_OK(at_device_select("auto", &be));
    CHECK(be && be->kind == first);
    CHECK_OK(at_device_select(NULL, &be));
    CHECK(be != NULL);
    /* explicit choices that cannot be honored are errors, never a silent fallback */
    CHECK_FAILS(at_device_select("tpu", &be), AT_ERR_INVALID);
    CHECK(be == NULL && strstr(at_last_error(), "tpu") != NULL);
    at_status s = at_device_select("cuda", &be);
    if (gpus) {
        CHECK(s == AT_OK && be && be->kind == AT_DEVICE_CUDA);
    } else {
        CHECK(s != AT_OK && be == NULL);
        CHECK_MSG(strstr(at_last_error(), "cuda") != NULL, "%s", at_last_error());
    }
    s = at_device_select("cuda:7", &be);
    CHECK(gpus > 7 ? s == AT_OK : s != AT_OK && be == NULL);
    CHECK_FAILS(at_device_select("cuda:x", &be), AT_ERR_INVALID);
    s = at_device_select("npu", &be);
    CHECK(s != AT_OK && strstr(at_last_error(), "npu") != NULL);
    CHECK_FAILS(at_device_select("cpu:1", &be), AT_ERR_INVALID);
    /* the environment decides when no option is given */
    setenv("ANYTUNE_DEVICE", "mps", 1);
    s = at_device_select(NULL, &be);
    CHECK(s != AT_OK && strstr(at_last_error(), "mps") != NULL);
    setenv("ANYTUNE_DEVICE", "cpu", 1);
    CHECK_OK(at_device_select(NULL, &be));
    unsetenv("ANYTUNE_DEVICE");
    setenv("ANYTUNE_DEVICE_PRIORITY", "mps,cuda,cpu", 1);
    CHECK_OK(at_device_select("auto", &be));
    CHECK(be && be->kind == first);
    setenv("ANYTUNE_DEVICE_PRIORITY", "mps,cuda", 1);
    s = at_device_select("auto", &be);
    CHECK(gpus ? s == AT_OK && be && be->kind == AT_DEVICE_CUDA : s == AT_ERR_NOT_FOUND && be == NULL);
    setenv("ANYTUNE_DEVICE_PRIORITY", "cpu,quantum", 1);
    CHECK_FAILS(at_device_select("auto", &be), AT_ERR_INVALID);
    unsetenv("ANYTUNE_DEVICE_PRIORITY");
}

static void test_env_json(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s env --json", bin);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char *buf = malloc(1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, p);
    buf[n] = '\0';
    CHECK(pclose(p) == 0);
    cJSON *j = NULL;
    CHECK_OK(at_json_parse(buf, n, "anytune env --json", &j));
    free(buf);
    if (!j) return;
    const char *top[] = {"cpu", "memory", "devices", "unusable", "backends", "gemm_engine", "libraries"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        CHECK_MSG(cJSON_GetObjectItemCaseSensitive(j, top[i]) != NULL, "missing \"%s\"", top[i]);
    const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(j, "cpu");
    CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cpu, "model")));
    CHECK(cJSON_GetObjectItemCaseSensitive(cpu, "cores")->valueint >= 1);
    CHECK(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(cpu, "isa_features")));
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(j, "memory");
    CHECK(cJSON_GetObjectItemCaseSensitive(mem, "total_bytes")->valuedouble > 0);
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(j, "devices");
    CHECK(cJSON_GetArraySize(devs) >= 1);
    const cJSON *d0 = cJSON_GetArrayItem(devs, 0);
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(d0, "kind")->valuestring, "cpu"));
    CHECK(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(d0, "number_formats")));
    const cJSON *u;
    cJSON_ArrayForEach(u, cJSON_GetObjectItemCaseSensitive(j, "unusable"))
        CHECK(strlen(cJSON_GetObjectItemCaseSensitive(u, "reason")->valuestring) > 10);
    const cJSON *libs = cJSON_GetObjectItemCaseSensitive(j, "libraries");
    CHECK(cJSON_GetObjectItemCaseSensitive(libs, "pcre2") && cJSON_GetObjectItemCaseSensitive(libs, "onednn"));
    cJSON_Delete(j);
}

#ifdef AT_CUDA_BUILT
/* The CUDA backend library this build made (nvcc) is found, loads with every
 * symbol resolved (cuBLAS included), and opening a device either works (a
 * GPU is here) or says why not (no driver / no GPU), never crashes. */
static void test_cuda_library(void)
{
    char path[1024];
    CHECK_MSG(at_cuda_library_find(path, sizeof path), "libanytune_cuda.so not found (%s)", path);
    at_backend *be = NULL;
    at_status st = at_cuda_backend_load(path, 0, &be);
    printf("CUDA backend library %s: %s\n", path, st == AT_OK ? be->name : at_last_error());
    if (st == AT_OK) {
        CHECK(be->kind == AT_DEVICE_CUDA && !be->is_host);
        for (int i = 0; i < AT_BACKEND_OP_COUNT; i++)
            CHECK_MSG(((void (*const *)(void))&be->ops)[i] != NULL, "CUDA backend lacks %s", at_backend_op_name(i));
    } else {
        CHECK_MSG(st == AT_ERR_DEVICE && strstr(at_last_error(), "CUDA"), "unexpected: %s", at_last_error());
    }
    /* a file that is not a backend library is refused with its name */
    CHECK_FAILS(at_cuda_backend_load("tests/data/no-such-library.so", 0, &be), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "no-such-library.so") != NULL);
}
#endif

int main(void)
{
    test_probe();
    test_select();
    test_env_json();
#ifdef AT_CUDA_BUILT
    test_cuda_library();
#endif
    return at_test_result("test_device");
}
