/* The measured choice of the f32 GEMM engine (device/cpu/gemm_tune.h).
 *
 * The suite runs with ANYTUNE_GEMM_TUNE=0; this test turns measuring on,
 * with its own cache folder (XDG_CACHE_HOME in a temporary directory), and
 * checks:
 *  - problems fall into the documented classes (buckets of the small side);
 *  - the timing rule: the best sample (not the median), steady only with
 *    several samples near it; the load rule; the choice rule's 3% margin;
 *  - the first GEMM of a class measures every engine of the build and the
 *    product is right whichever engine won (against a double loop; the
 *    tolerance is test_gemm's: 1e-5 of sum |a b|, f32 sums of <= 1024
 *    terms); a steady result is cached, an unsteady one is not;
 *  - with a runner whose timings are known (a clock of the test's), a steady measurement
 *    is written to the cache file and read back by a fresh start
 *    (from_cache, same choice, nothing run); one whose samples disagree (one
 *    fast sample among slow ones, as under load) is used by the process but
 *    not cached, and the process does not measure that class again;
 *  - a cache file that does not parse, is of the older format (median
 *    figures, unbucketed classes) or has another key is ignored, measured
 *    again and rewritten;
 *  - ANYTUNE_GEMM_TUNE=0 or a pinned engine measure nothing;
 *  - a library stands in for our kernels only at an ISA level at or above
 *    its own (cpu_libs.h): in a fresh process at the AVX2 level, oneDNN is
 *    held to AVX2 (its first use caps it) and at the plain-C level no
 *    library is among the engines measured;
 *  - ANYTUNE_GEMM_TUNE=tiny times problems of the same classes under a cache
 *    key of its own. Under a CPU emulator (testing.h: ~0.1 GFLOP/s, the
 *    full problems took 750 s) the checks above run with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/cpu/cpu_libs.h"
#include "device/cpu/gemm.h"
#include "device/cpu/gemm_tune.h"
#include "testing.h"

static float A[64 * 256], B[256 * 96], C[64 * 96];

/* C = A B (64x256 times 256x96, an m64-nn problem) and its check. */
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

/* Runners with known timings: the tuner reads a clock of the test's
 * (at_gemm_tune_use_clock), and each call advances it by a fixed time
 * (anytune 4 ms, openblas 2 ms, onednn 6 ms: openblas wins), so the
 * timings are exact however busy the machine is. In the unsteady one,
 * anytune's samples drift (1, 1.5, 2, ... ms): a best that no other sample
 * comes near, as when load slows samples unevenly. */
static int fake_calls;
static double fake_now;

static double fake_clock(void) { return fake_now; }

static int fake_steady(at_gemm_engine_id e, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A_,
                       const float *B_, float *C_)
{
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A_, (void)B_, (void)C_;
    fake_calls++;
    fake_now += 1e-3 * (e == AT_GEMM_ANYTUNE ? 4 : e == AT_GEMM_OPENBLAS ? 2 : 6);
    return 1;
}

static int unsteady_calls;

static int fake_unsteady(at_gemm_engine_id e, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A_,
                         const float *B_, float *C_)
{
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A_, (void)B_, (void)C_;
    fake_calls++;
    /* calls 1 and 2: the warm-ups (the second sets the calls per sample: 1);
     * then each sample 0.5 ms longer than the one before, so no three agree
     * within 5% */
    if (e == AT_GEMM_ANYTUNE) {
        unsteady_calls++;
        fake_now += 1e-3 * (unsteady_calls <= 2 ? 3 : 1 + 0.5 * (unsteady_calls - 3));
    }
    else fake_now += 1e-3 * (e == AT_GEMM_OPENBLAS ? 2 : 6);
    return 1;
}

#define TUNE_ON (AT_TEST_UNDER_EMULATOR ? "tiny" : "1")

/* In a child, before anything has used oneDNN: the libraries at a level
 * lowered to `level`. */
static void libraries_held(at_cpu_isa level)
{
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("ANYTUNE_GEMM_TUNE", "1", 1);
        unsetenv("ONEDNN_MAX_CPU_ISA");
        unsetenv("DNNL_MAX_CPU_ISA");
        at_cpu_isa_force(level);
        int lvl = (int)at_cpu_isa_level(), dnnl = at_cpu_onednn_tier(at_cpu_isa_level());
        const char *e = at_cpu_gemm_engine(AT_F32);
        /* a library among the engines runs at or below the level; the hold
         * brings a linked oneDNN down to any level above plain C */
        int ok = (!strstr(e, "oneDNN") || dnnl <= lvl) && (!strstr(e, "OpenBLAS") || at_cpu_openblas_tier() <= lvl);
        if (lvl > AT_ISA_SCALAR && dnnl >= 0) ok = ok && dnnl <= lvl;
        if (lvl == AT_ISA_SCALAR) ok = ok && !strstr(e, "oneDNN") && !strstr(e, "OpenBLAS");
        printf("at %s: oneDNN's tier %d, OpenBLAS's %d; f32 engines: %s\n", at_cpu_isa_name(at_cpu_isa_level()), dnnl,
               at_cpu_openblas_tier(), e);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a library runs above the ISA level %s", at_cpu_isa_name(level));
}

int main(void)
{
    /* first: the oneDNN of this process is not capped yet */
    libraries_held(AT_ISA_SCALAR);
#if defined(__x86_64__)
    libraries_held(AT_ISA_AVX2);
#endif
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

    /* classes: the smallest side, bucketed */
    static const struct {
        int ta, tb;
        int64_t M, N, K;
        const char *name;
    } classes[] = {
        {0, 1, 1, 4864, 896, "m1-nt"},      {0, 0, 1, 4864, 896, "m1-nn"},    {0, 0, 8, 4864, 896, "m16-nn"},
        {1, 0, 8, 896, 512, "m16-tn"},      {0, 0, 16, 4864, 896, "m16-nn"},  {0, 0, 17, 4864, 896, "m64-nn"},
        {0, 1, 512, 8, 896, "n16-nt"},      {1, 0, 896, 8, 512, "n16-tn"},    {0, 0, 512, 32, 896, "n64-nn"},
        {0, 0, 512, 896, 8, "k16-nn"},      {0, 1, 512, 896, 16, "k16-nt"},   {0, 1, 256, 256, 64, "k64-nt"},
        {1, 0, 4864, 896, 512, "large-tn"}, {1, 1, 512, 512, 512, "large-nt"}, {0, 0, 65, 65, 65, "large-nn"},
        {0, 1, 512, 896, 4864, "deep-nt"},  {0, 0, 512, 896, 1792, "deep-nn"}, {0, 0, 512, 896, 1791, "large-nn"},
        {0, 0, 8, 8, 8, "m16-nn"},          {0, 0, 9, 8, 8, "n16-nn"},
    };
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        const char *got = at_gemm_tune_class_name(
            at_gemm_tune_class(classes[i].ta, classes[i].tb, classes[i].M, classes[i].N, classes[i].K));
        CHECK_MSG(!strcmp(got, classes[i].name), "%lldx%lldx%lld: %s, not %s", (long long)classes[i].M,
                  (long long)classes[i].N, (long long)classes[i].K, got, classes[i].name);
    }
    /* each class's timed problem is in the class */
    for (int c = 0; c < AT_GEMM_CLASSES; c++) {
        int ta, tb;
        int64_t M, N, K;
        at_gemm_tune_class_shape(c, &ta, &tb, &M, &N, &K);
        CHECK_MSG(at_gemm_tune_class(ta, tb, M, N, K) == c, "%s", at_gemm_tune_class_name(c));
    }
    int cls = at_gemm_tune_class(0, 0, 64, 96, 256);
    CHECK(!strcmp(at_gemm_tune_class_name(cls), "m64-nn"));

    /* the timing rule: the best sample; steady with 3 samples within 5% of it */
    {
        int steady;
        static const double load[7] = {1.00, 1.01, 1.02, 3.0, 3.0, 3.0, 3.0}; /* median 3.0 */
        CHECK(at_gemm_tune_best(load, 7, &steady) == 1.00 && steady);
        static const double lucky[4] = {1.0, 1.5, 1.6, 1.7};
        CHECK(at_gemm_tune_best(lucky, 4, &steady) == 1.0 && !steady);
        static const double wide[5] = {1.06, 1.0, 1.06, 1.04, 2.0}; /* only 2 within 5% */
        CHECK(at_gemm_tune_best(wide, 5, &steady) == 1.0 && !steady);
        static const double tight[3] = {2.0, 2.09, 2.1};
        CHECK(at_gemm_tune_best(tight, 3, &steady) == 2.0 && steady);
        /* the load rule: others took more than a quarter of the machine (and two ticks) */
        CHECK(at_gemm_tune_busy(0.06, 0.2) && !at_gemm_tune_busy(0.04, 0.2) && !at_gemm_tune_busy(0.015, 0.04));
    }
    /* the choice rule: a library must beat ours by more than 3% */
    {
        const double near[3] = {100, 102.9, 90}, lib[3] = {100, 104, 110}, absent[3] = {100, -1, -1},
                     slow[3] = {100, 50, 60};
        CHECK(at_gemm_tune_choose(near) == AT_GEMM_ANYTUNE);
        CHECK(at_gemm_tune_choose(lib) == AT_GEMM_ONEDNN);
        CHECK(at_gemm_tune_choose(absent) == AT_GEMM_ANYTUNE);
        CHECK(at_gemm_tune_choose(slow) == AT_GEMM_ANYTUNE);
    }

    /* every class at once (what `anytune env` does), on the tiny problems */
    setenv("ANYTUNE_GEMM_TUNE", "tiny", 1);
    int tuned = at_cpu_gemm_tune_all();
    for (int c = 0; c < AT_GEMM_CLASSES && tuned; c++) {
        at_gemm_tune_result rt = at_gemm_tune_result_of(c);
        CHECK_MSG(rt.known && rt.gflops[0] > 0 && rt.gflops[rt.choice] > 0, "%s", at_gemm_tune_class_name(c));
    }
    setenv("ANYTUNE_GEMM_TUNE", TUNE_ON, 1);
    if (!tuned) {
        /* only our kernels in this build: nothing to choose, nothing measured */
        run_and_check();
        CHECK(!at_gemm_tune_result_of(cls).known);
        printf("no GEMM library in this build: nothing measured\n");
        return at_test_result("test_gemm_tune");
    }
    remove(at_gemm_tune_cache_path());
    at_gemm_tune_forget();

    /* first use measures the real engines; cached only when steady */
    run_and_check();
    at_gemm_tune_result r = at_gemm_tune_result_of(cls);
    CHECK(r.known && !r.from_cache);
    CHECK(r.gflops[AT_GEMM_ANYTUNE] > 0);
    int libs = 0;
    for (int e = 1; e < AT_GEMM_ENGINES; e++) libs += r.gflops[e] > 0;
    CHECK(libs >= 1);
    CHECK(r.gflops[r.choice] > 0 && r.choice == at_gemm_tune_choose(r.gflops));
    printf("%s: anytune %.1f openblas %.1f onednn %.1f GFLOP/s -> %s (%s)\n", at_gemm_tune_class_name(cls), r.gflops[0],
           r.gflops[1], r.gflops[2], at_gemm_engine_name(r.choice), r.steady ? "steady" : "unsteady: load");
    CHECK(!at_gemm_tune_result_of(at_gemm_tune_class(0, 1, 1, 4864, 896)).known); /* only the class used */
    const char *path = at_gemm_tune_cache_path();
    char line[64];
    snprintf(line, sizeof line, "\n%s ", at_gemm_tune_class_name(cls));
    CHECK(strncmp(path, dir, strlen(dir)) == 0);
    CHECK(r.steady ? file_has(path, "anytune-gemm-engines 3\nkey ") && file_has(path, line) : access(path, F_OK) != 0);

    /* the product is right on every engine the class could pick */
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        if (r.gflops[e] < 0) continue;
        CHECK_OK(at_cpu_gemm_use_engine(AT_F32, at_gemm_engine_name((at_gemm_engine_id)e)));
        run_and_check();
    }
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "auto"));

    /* known timings: steady, cached, read back by a fresh start without running
     * anything (the test's clock: no load rule) */
    at_gemm_tune_use_clock(fake_clock);
    remove(path);
    at_gemm_tune_forget();
    fake_calls = 0;
    CHECK(at_gemm_tune_engine(cls, 7u, fake_steady) == AT_GEMM_OPENBLAS);
    at_gemm_tune_result rs = at_gemm_tune_result_of(cls);
    CHECK(rs.known && rs.steady && !rs.from_cache && fake_calls >= 3 * (2 + 5));
    CHECK_MSG(rs.gflops[1] > 1.5 * rs.gflops[0] && rs.gflops[0] > 1.2 * rs.gflops[2], "%g %g %g", rs.gflops[0],
              rs.gflops[1], rs.gflops[2]);
    CHECK(file_has(path, "anytune-gemm-engines 3\nkey ") && file_has(path, line));
    at_gemm_tune_forget();
    fake_calls = 0;
    CHECK(at_gemm_tune_engine(cls, 7u, fake_steady) == AT_GEMM_OPENBLAS && fake_calls == 0);
    at_gemm_tune_result r2 = at_gemm_tune_result_of(cls);
    CHECK(r2.known && r2.from_cache && r2.steady && r2.choice == AT_GEMM_OPENBLAS);
    CHECK(fabs(r2.gflops[0] - rs.gflops[0]) <= 1e-3 * rs.gflops[0] + 1e-3);

    /* samples that disagree: used in this process, not cached, not measured again here */
    remove(path);
    at_gemm_tune_forget();
    fake_calls = unsteady_calls = 0;
    at_gemm_engine_id ue = at_gemm_tune_engine(cls, 7u, fake_unsteady);
    at_gemm_tune_result ru = at_gemm_tune_result_of(cls);
    CHECK(ru.known && !ru.steady && ue == ru.choice && fake_calls > 0);
    CHECK(access(path, F_OK) != 0);
    fake_calls = 0;
    CHECK(at_gemm_tune_engine(cls, 7u, fake_steady) == ue && fake_calls == 0);
    /* another class measured steadily later is cached without the unsteady one */
    int cls2 = at_gemm_tune_class(0, 0, 512, 896, 8);
    CHECK(at_gemm_tune_engine(cls2, 7u, fake_steady) == AT_GEMM_OPENBLAS);
    snprintf(line, sizeof line, "\n%s ", at_gemm_tune_class_name(cls));
    char line2[64];
    snprintf(line2, sizeof line2, "\n%s ", at_gemm_tune_class_name(cls2));
    CHECK(file_has(path, line2) && !file_has(path, line));

    /* a corrupt file, or one of the older format, is ignored, measured again and rewritten */
    at_gemm_tune_forget();
    CHECK(at_gemm_tune_engine(cls, 7u, fake_steady) == AT_GEMM_OPENBLAS); /* the file now holds cls */
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
    const char *cn = at_gemm_tune_class_name(cls);
    for (int i = 0; i < 6; i++) {
        char text[2048];
        switch (i) {
        case 0: snprintf(text, sizeof text, "garbage\n"); break;
        case 1: snprintf(text, sizeof text, "anytune-gemm-engines 3\n"); break;
        case 2: snprintf(text, sizeof text, "anytune-gemm-engines 3\n%s%s anytune 1.0", keyline, cn); break;
        case 3: snprintf(text, sizeof text, "anytune-gemm-engines 3\n%s%s cublas 1.0 1.0 1.0\n", keyline, cn); break;
        case 4:
            snprintf(text, sizeof text, "anytune-gemm-engines 3\nkey another machine\n%s onednn 1.000 2.000 3.000\n",
                     cn);
            break;
        default: /* the older format, right key, well-formed: its figures were medians under load */
            snprintf(text, sizeof text, "anytune-gemm-engines 1\n%s%s onednn 1.000 2.000 3.000\n", keyline, cn);
            break;
        }
        write_file(path, text);
        at_gemm_tune_forget();
        fake_calls = 0;
        CHECK(at_gemm_tune_engine(cls, 7u, fake_steady) == AT_GEMM_OPENBLAS && fake_calls > 0);
        at_gemm_tune_result rb = at_gemm_tune_result_of(cls);
        CHECK_MSG(rb.known && !rb.from_cache, "bad cache file %d was not ignored", i);
        CHECK_MSG(file_has(path, keyline) && file_has(path, line) && file_has(path, "anytune-gemm-engines 3\n"),
                  "bad cache file %d was not rewritten", i);
    }
    at_gemm_tune_use_clock(NULL);
    /* the right key with a well-formed line is taken as it is */
    {
        char text[2048];
        snprintf(text, sizeof text, "anytune-gemm-engines 3\n%s%s anytune 12.500 -1.000 -1.000\n", keyline, cn);
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
#ifdef AT_OPENBLAS_OPENMP
        /* built against OpenBLAS's OpenMP build: the one loaded is that one
         * (the pthread build's spinning workers slow the other engines) */
        CHECK_MSG(strstr(v, "USE_OPENMP") != NULL, "OpenBLAS loaded: %s", v);
#endif
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
