/* The measured choice of the f32 GEMM engine (device/cpu/gemm_tune.h).
 *
 * The suite runs with ANYTUNE_GEMM_TUNE=0; this test turns measuring on,
 * with its own cache folder (XDG_CACHE_HOME in a temporary directory), and
 * checks:
 *  - problems fall into the documented classes;
 *  - the first GEMM of a class measures every engine of the build and the
 *    product is right whichever engine won (against a double loop; the
 *    tolerance is test_gemm's: 1e-5 of sum |a b|, f32 sums of <= 1024 terms);
 *  - the choice is written to the cache file and read back by a fresh start
 *    (from_cache, same figures), a cache file that does not parse or has
 *    another key is ignored and measured again, then rewritten;
 *  - ANYTUNE_GEMM_TUNE=0 or a pinned engine measure nothing;
 *  - ANYTUNE_GEMM_TUNE=tiny times problems of the same classes under a cache
 *    key of its own. Under a CPU emulator (testing.h: ~0.1 GFLOP/s, the
 *    full problems took 750 s) the checks above run with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/cpu/cpu_libs.h"
#include "device/cpu/gemm.h"
#include "device/cpu/gemm_tune.h"
#include "testing.h"

static float A[64 * 256], B[256 * 96], C[64 * 96];

/* C = A B (64x256 times 256x96, a large-nn problem) and its check. */
static void run_and_check(void)
{
    at_cpu_gemm(0, 0, 64, 96, 256, 1.0f, A, AT_F32, 256, B, AT_F32, 96, 0.0f, C, AT_F32, 96);
    double worst = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 96; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < 256; k++) {
                ref += (double)A[i * 256 + k] * B[k * 96 + j];
                mag += fabs((double)A[i * 256 + k] * B[k * 96 + j]);
            }
            double e = fabs(C[i * 96 + j] - ref) / (1e-5 * mag);
            if (e > worst) worst = e;
        }
    CHECK_MSG(worst <= 1.0, "worst err/tol %.3f", worst);
}

static int file_has(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, what) != NULL;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

#define TUNE_ON (AT_TEST_UNDER_EMULATOR ? "tiny" : "1")

int main(void)
{
    char dir[] = "/tmp/anytune-gemm-tune-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("XDG_CACHE_HOME", dir, 1);

    /* tiny: every class's problem stays in its class, 16-64 times fewer
     * multiply-adds, and its own cache file */
    setenv("ANYTUNE_GEMM_TUNE", "1", 1);
    char full_path[1100];
    snprintf(full_path, sizeof full_path, "%s", at_gemm_tune_cache_path());
    int64_t full_work[AT_GEMM_CLASSES];
    for (int c = 0; c < AT_GEMM_CLASSES; c++) {
        int ta, tb;
        int64_t M, N, K;
        at_gemm_tune_class_shape(c, &ta, &tb, &M, &N, &K);
        full_work[c] = M * N * K;
    }
    setenv("ANYTUNE_GEMM_TUNE", "tiny", 1);
    CHECK(at_gemm_tune_enabled() && at_gemm_tune_tiny());
    CHECK(strcmp(full_path, at_gemm_tune_cache_path()) != 0);
    for (int c = 0; c < AT_GEMM_CLASSES; c++) {
        int ta, tb;
        int64_t M, N, K;
        at_gemm_tune_class_shape(c, &ta, &tb, &M, &N, &K);
        CHECK_MSG(at_gemm_tune_class(ta, tb, M, N, K) == c, "tiny %s", at_gemm_tune_class_name(c));
        CHECK(M * N * K * 16 <= full_work[c] && M * N * K * 64 >= full_work[c]);
    }
    setenv("ANYTUNE_GEMM_TUNE", TUNE_ON, 1);
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "auto"));
    for (int i = 0; i < 64 * 256; i++) A[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    for (int i = 0; i < 256 * 96; i++) B[i] = (float)((i * 53) % 97 - 48) / 48.0f;

    /* classes */
    CHECK(!strcmp(at_gemm_tune_class_name(at_gemm_tune_class(0, 1, 1, 4864, 896)), "rows-nt"));
    CHECK(!strcmp(at_gemm_tune_class_name(at_gemm_tune_class(0, 1, 512, 8, 896)), "skinny-n-nt"));
    CHECK(!strcmp(at_gemm_tune_class_name(at_gemm_tune_class(0, 0, 512, 896, 8)), "skinny-k-nn"));
    CHECK(!strcmp(at_gemm_tune_class_name(at_gemm_tune_class(1, 0, 4864, 896, 512)), "large-tn"));
    CHECK(!strcmp(at_gemm_tune_class_name(at_gemm_tune_class(1, 1, 512, 512, 512)), "large-nt"));
    int cls = at_gemm_tune_class(0, 0, 64, 96, 256);
    CHECK(!strcmp(at_gemm_tune_class_name(cls), "large-nn"));

    if (!at_cpu_gemm_tune_all()) {
        /* only our kernels in this build: nothing to choose, nothing measured */
        run_and_check();
        CHECK(!at_gemm_tune_result_of(cls).known);
        printf("no GEMM library in this build: nothing measured\n");
        return at_test_result("test_gemm_tune");
    }
    remove(at_gemm_tune_cache_path());
    at_gemm_tune_forget();

    /* first use measures */
    run_and_check();
    at_gemm_tune_result r = at_gemm_tune_result_of(cls);
    CHECK(r.known && !r.from_cache);
    CHECK(r.gflops[AT_GEMM_ANYTUNE] > 0);
    int libs = 0;
    for (int e = 1; e < AT_GEMM_ENGINES; e++) libs += r.gflops[e] > 0;
    CHECK(libs >= 1);
    CHECK(r.gflops[r.choice] > 0);
    printf("large-nn: anytune %.1f openblas %.1f onednn %.1f GFLOP/s -> %s\n", r.gflops[0], r.gflops[1], r.gflops[2],
           at_gemm_engine_name(r.choice));
    CHECK(!at_gemm_tune_result_of(at_gemm_tune_class(0, 1, 1, 4864, 896)).known); /* only the class used */
    const char *path = at_gemm_tune_cache_path();
    CHECK(strncmp(path, dir, strlen(dir)) == 0);
    CHECK(file_has(path, "anytune-gemm-engines 1\nkey "));
    CHECK(file_has(path, "\nlarge-nn "));

    /* a fresh start reads it back */
    at_gemm_tune_forget();
    run_and_check();
    at_gemm_tune_result r2 = at_gemm_tune_result_of(cls);
    CHECK(r2.known && r2.from_cache && r2.choice == r.choice);
    CHECK(fabs(r2.gflops[0] - r.gflops[0]) <= 1e-3 * r.gflops[0] + 1e-3);

    /* the product is right on every engine the class could pick */
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        if (r.gflops[e] < 0) continue;
        CHECK_OK(at_cpu_gemm_use_engine(AT_F32, at_gemm_engine_name((at_gemm_engine_id)e)));
        run_and_check();
    }
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "auto"));

    /* a corrupt file is ignored, measured again and rewritten */
    char keyline[1024] = "";
    {
        FILE *f = fopen(path, "r");
        CHECK(f != NULL);
        if (f) {
            CHECK(fgets(keyline, sizeof keyline, f) != NULL);
            CHECK(fgets(keyline, sizeof keyline, f) != NULL);
            fclose(f);
        }
    }
    static const char *bad[] = {
        "garbage\n",
        "anytune-gemm-engines 1\n",
        NULL, /* right key, a line cut short */
        NULL, /* right key, an engine that does not exist */
        "anytune-gemm-engines 1\nkey another machine\nlarge-nn onednn 1.000 2.000 3.000\n",
    };
    for (int i = 0; i < 5; i++) {
        char text[2048];
        if (i == 2) snprintf(text, sizeof text, "anytune-gemm-engines 1\n%slarge-nn anytune 1.0", keyline);
        else if (i == 3) snprintf(text, sizeof text, "anytune-gemm-engines 1\n%slarge-nn cublas 1.0 1.0 1.0\n", keyline);
        else snprintf(text, sizeof text, "%s", bad[i]);
        write_file(path, text);
        at_gemm_tune_forget();
        run_and_check();
        at_gemm_tune_result rb = at_gemm_tune_result_of(cls);
        CHECK_MSG(rb.known && !rb.from_cache, "bad cache file %d was not ignored", i);
        CHECK_MSG(file_has(path, keyline) && file_has(path, "\nlarge-nn "), "bad cache file %d was not rewritten", i);
    }
    /* the right key with a well-formed line is taken as it is */
    {
        char text[2048];
        snprintf(text, sizeof text, "anytune-gemm-engines 1\n%slarge-nn anytune 12.500 -1.000 -1.000\n", keyline);
        write_file(path, text);
        at_gemm_tune_forget();
        run_and_check();
        at_gemm_tune_result rc = at_gemm_tune_result_of(cls);
        CHECK(rc.known && rc.from_cache && rc.choice == AT_GEMM_ANYTUNE && rc.gflops[0] == 12.5);
    }

    /* the f32 engine line names exactly the libraries this build links */
    {
        char v[256];
        CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "auto"));
        const char *e = at_cpu_gemm_engine(AT_F32);
        at_cpu_onednn_version(v, sizeof v);
        CHECK_MSG((strstr(e, "oneDNN") != NULL) == (strcmp(v, "not linked") != 0), "engine line \"%s\", oneDNN %s", e, v);
        at_cpu_openblas_version(v, sizeof v);
        CHECK_MSG((strstr(e, "OpenBLAS") != NULL) == (strcmp(v, "not linked") != 0), "engine line \"%s\", OpenBLAS %s",
                  e, v);
    }

    /* measuring off, or an engine pinned: nothing measured */
    remove(path);
    setenv("ANYTUNE_GEMM_TUNE", "0", 1);
    CHECK(!at_gemm_tune_tiny());
    at_gemm_tune_forget();
    run_and_check();
    CHECK(!at_gemm_tune_result_of(cls).known && access(path, F_OK) != 0);
    CHECK(strstr(at_cpu_gemm_engine(AT_F32), "anytune") != NULL);
    setenv("ANYTUNE_GEMM_TUNE", TUNE_ON, 1);
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "anytune"));
    run_and_check();
    CHECK(!at_gemm_tune_result_of(cls).known && access(path, F_OK) != 0);
    CHECK(!at_cpu_gemm_tune_all());

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return at_test_result("test_gemm_tune");
}
