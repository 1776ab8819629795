#include "testing.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "device/cpu/cpu_features.h"
#include "device/registry.h"

int at_test_failures;
int at_test_checks;

/* The suite runs the numeric tests again at each ISA level below the host's
 * (CMakeLists.txt: ANYTUNE_CPU_ISA=LEVEL with ANYTUNE_TEST_LOWER_ISA=1). A
 * level the host lacks, or its own best level (the plain run covers that),
 * is skipped before main: exit status 77, ctest's SKIP_RETURN_CODE. */
__attribute__((constructor)) static void skip_unless_lower_isa(void)
{
    if (!getenv("ANYTUNE_TEST_LOWER_ISA")) return;
    const char *want = getenv("ANYTUNE_CPU_ISA");
    at_cpu_isa capped = at_cpu_isa_level();
    at_cpu_isa_force(AT_ISA_TOP); /* lifts the cap to the host's best */
    at_cpu_isa best = at_cpu_isa_force(capped);
    const char *name = want ? want : "?";
    if (!want || capped >= best || strcmp(at_cpu_isa_env_names[capped], name) != 0) {
        printf("ISA level %s: not below this CPU's best (%s), skipped\n", name, at_cpu_isa_name(best));
        exit(77);
    }
}

int at_test_result(const char *name)
{
    if (at_test_failures) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", name, at_test_failures, at_test_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, at_test_checks);
    return 0;
}

double at_test_max_rel_err(const float *got, const float *want, size_t n, double floor)
{
    double maxw = floor, maxd = 0;
    for (size_t i = 0; i < n; i++) {
        double w = fabs((double)want[i]);
        if (w > maxw) maxw = w;
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > maxd || isnan(d)) maxd = isnan(d) ? INFINITY : d;
    }
    return maxd / maxw;
}

struct at_backend *at_test_gpu_backend(void)
{
    static int tried;
    static at_backend *gpu;
    if (tried) return gpu;
    tried = 1;
    const char *emu = getenv("ANYTUNE_CUDA_EMULATE");
    if (emu && *emu) {
        printf("GPU runs: skipped (ANYTUNE_CUDA_EMULATE is set: cuda:0 is the emulator)\n");
        return NULL;
    }
    at_device_info *list = NULL;
    int n = 0;
    const at_device_info *found = NULL;
    if (at_devices_probe(&list, &n) == AT_OK)
        for (int i = 0; i < n && !found; i++)
            if (list[i].kind == AT_DEVICE_CUDA && list[i].present) found = &list[i];
    if (!found) {
        printf("GPU runs: no NVIDIA GPU on this machine\n");
    } else if (!found->usable) {
        printf("GPU runs: %s (%s) not usable: %s\n", found->name, found->model, found->note);
    } else if (at_device_select("cuda:0", &gpu) != AT_OK) {
        at_test_checks++;
        at_test_failures++;
        fprintf(stderr, "GPU runs: %s (%s) is usable but does not open: %s\n", found->name, found->model,
                at_last_error());
        gpu = NULL;
    } else {
        printf("GPU runs: %s (%s)\n", found->name, found->model);
    }
    free(list);
    return gpu;
}

int at_test_js_ready(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "tests/js/node_modules/%s/package.json", name);
    FILE *f = fopen(path, "r");
    if (f) {
        fclose(f);
        return 1;
    }
    at_test_checks++;
    at_test_failures++;
    fprintf(stderr, "%s is not installed in tests/js/node_modules: run scripts/setup.sh (it runs npm ci --prefix "
            "tests/js from the pinned package-lock.json; the npm registry is needed once)\n", name);
    return 0;
}

void at_test_js_check(const char *dir, const cJSON *expect, const char *package, const char *script,
                      const char *reader)
{
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/expect.json", dir);
    char *text = cJSON_Print(expect);
    at_test_checks++;
    if (!text || at_write_file_atomic(path, text, strlen(text)) != AT_OK) {
        at_test_failures++;
        fprintf(stderr, "cannot write %s\n", path);
    } else if (at_test_js_ready(package)) {
        snprintf(cmd, sizeof cmd, "node tests/js/%s %s", script, path);
        int rc = system(cmd);
        at_test_checks++;
        if (rc != 0) {
            at_test_failures++;
            fprintf(stderr, "%s disagrees with the expectations of %s (status %d)\n", reader, path, rc);
        }
    }
    free(text);
}

void at_test_train_args(at_train_args *a, const char *model, const char *dataset, const char *out)
{
    static const char *ds[1];
    ds[0] = dataset;
    at_train_args_defaults(a);
    a->model = model;
    a->datasets = ds;
    a->n_datasets = 1;
    a->model_name = "anytune";
    a->model_author = "the anytune team";
    a->output_dir = out;
    a->learning_rate = 1e-3;
    a->logging_steps = 1;
    a->save_steps = 1000;
    a->max_length = 256;
    /* the goldens (tools/make_goldens.py) and these tests were made with
     * torch's AdamW defaults and evaluation only at the end, not ms-swift's
     * defaults that at_train_args_defaults gives */
    a->weight_decay = 0;
    a->adam_beta2 = 0.999;
    a->eval_steps = 0;
}

int at_test_run(char *const argv[], const char *err_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        if (!freopen(err_path ? err_path : "/dev/null", "w", stderr)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return status;
}

int at_test_file_has(const char *path, const char *text)
{
    char *s = NULL;
    int r = at_read_file(path, &s, NULL) == AT_OK && s && strstr(s, text);
    free(s);
    return r;
}
