/* Measured choice of the f32 GEMM engine per problem class (gemm_tune.h).
 *
 * Timing: two warm-up calls per engine (oneDNN compiles its kernel then,
 * OpenBLAS starts its threads, C's pages are touched), then rounds in which
 * each engine takes one sample of as many calls as fill ~0.5 ms. At least
 * MIN_ROUNDS rounds and MIN_SECONDS, more until every engine's best is
 * steady (at_gemm_tune_best) or the class has had ROUND_BUDGET seconds.
 * Meanwhile the CPU time other processes took is read from /proc/stat (the
 * machine's busy time less ours): a measurement during which they took more
 * than a quarter of the machine is not steady either (at_gemm_tune_busy).
 * (Per-sample preemption counts were tried: OpenBLAS's idle threads call
 * sched_yield, which counts as preemption, so every OpenBLAS sample looked
 * disturbed.) About 50-100 ms per class on a quiet machine, paid once while
 * the cache file holds. */
#include "device/cpu/gemm_tune.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_libs.h"

/* 2: classes bucketed by the small dimension; figures are best samples
 * (1 held medians, and on a loaded machine garbage kept forever); 3: large
 * timed on the MLP's shapes (at_gemm_tune_class_shape) */
#define FILE_MAGIC "anytune-gemm-engines 3"
#define LIB_MARGIN 1.03 /* a library must be this much faster than our kernels */

static const char *kind_names[AT_GEMM_KINDS] = {"m1", "m16", "m64", "n16", "n64", "k16", "k64", "large", "deep"};
static const char *layout_names[3] = {"nn", "nt", "tn"};

int at_gemm_tune_class(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K)
{
    int kind;
    if (M <= N && M <= K && M <= 64) kind = M <= 1 ? 0 : M <= 16 ? 1 : 2;
    else if (N <= K && N <= 64) kind = N <= 16 ? 3 : 4;
    else if (K <= 64) kind = K <= 16 ? 5 : 6;
    else kind = K >= 2 * (M > N ? M : N) ? 8 : 7;
    int layout = trans_a && !trans_b ? 2 : trans_b ? 1 : 0;
    return kind * 3 + layout;
}

const char *at_gemm_tune_class_name(int cls)
{
    static char names[AT_GEMM_CLASSES][16];
    if (cls < 0 || cls >= AT_GEMM_CLASSES) return "?";
    if (!names[cls][0]) snprintf(names[cls], sizeof names[cls], "%s-%s", kind_names[cls / 3], layout_names[cls % 3]);
    return names[cls];
}

void at_gemm_tune_class_shape(int cls, int *trans_a, int *trans_b, int64_t *M, int64_t *N, int64_t *K)
{
    /* M x N x K per kind; m16-tn and m64-tn are LoRA's dA instead (M = rank,
     * N = hidden, K = tokens: a transposed GEMV is rare), large-tn a weight's
     * gradient (M = the MLP's width, K = tokens). large is the MLP's up
     * projection with N cut to 3072, as deep's K: at 512x1024x512 our kernels
     * and oneDNN were within 1-3% on a Zen 4, and at 512x4864x896 oneDNN was
     * 7-12% ahead (the wide C's packing and passes, not the microkernel). */
    static const int64_t dims[AT_GEMM_KINDS][3] = {
        {1, 4864, 896}, {8, 4864, 896}, {32, 4864, 896}, {512, 8, 896},
        {512, 32, 896}, {512, 896, 8},  {512, 896, 32},  {512, 3072, 896}, {512, 896, 3072},
    };
    int kind = cls / 3, layout = cls % 3;
    int64_t d[3] = {dims[kind][0], dims[kind][1], dims[kind][2]};
    if ((kind == 1 || kind == 2) && layout == 2) d[1] = 896, d[2] = 512;
    if (kind == 7 && layout == 2) d[0] = 3072, d[1] = 896, d[2] = 512; /* large-tn */
    /* tiny: the sizes above 64 divided by 4, which keeps each problem in its class */
    for (int i = 0; i < 3; i++)
        if (at_gemm_tune_tiny() && d[i] > 64) d[i] /= 4;
    *trans_a = layout == 2;
    *trans_b = layout == 1;
    *M = d[0];
    *N = d[1];
    *K = d[2];
}

const char *at_gemm_engine_name(at_gemm_engine_id e)
{
    switch (e) {
    case AT_GEMM_ANYTUNE: return "anytune";
    case AT_GEMM_OPENBLAS: return "openblas";
    case AT_GEMM_ONEDNN: return "onednn";
    default: return "?";
    }
}

static int engine_named(const char *s)
{
    for (int e = 0; e < AT_GEMM_ENGINES; e++)
        if (!strcmp(s, at_gemm_engine_name((at_gemm_engine_id)e))) return e;
    return -1;
}

int at_gemm_tune_enabled(void)
{
    const char *v = getenv("ANYTUNE_GEMM_TUNE");
    return !(v && !strcmp(v, "0"));
}

int at_gemm_tune_tiny(void)
{
    const char *v = getenv("ANYTUNE_GEMM_TUNE");
    return v && !strcmp(v, "tiny");
}

/* ---- state ---- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static at_gemm_tune_result table[AT_GEMM_CLASSES];
static int cache_read; /* the cache file was looked at for the current key */
static char cur_key[512];

/* Called under the lock, at every GEMM: the library versions are read once. */
static void make_key(char *key, size_t len)
{
    static char libs[240];
    if (!libs[0]) {
        char ob[160], dn[64];
        at_cpu_openblas_version(ob, sizeof ob);
        at_cpu_onednn_version(dn, sizeof dn);
        snprintf(libs, sizeof libs, "%s|%s", ob, dn);
        for (char *p = libs; *p; p++)
            if (*p == '\n' || *p == '\r' || *p == '|') *p = ' ';
        libs[0] = libs[0] ? libs[0] : '?';
    }
    /* the libraries' own ISA caps change what they measure (bench_gemm
     * sets them; cpu_libs.h holds oneDNN to our level) */
    const char *ct = getenv("OPENBLAS_CORETYPE"), *dn = getenv("ONEDNN_MAX_CPU_ISA");
    at_cpu_isa level = at_cpu_isa_level();
    snprintf(key, len, "%s|%s|threads %d|%s|coretype %s|onednn isa %s|tiers %d %d%s", at_cpu_get_features()->model,
             at_cpu_isa_name(level), omp_get_max_threads(), libs, ct ? ct : "-", dn ? dn : "-",
             at_cpu_openblas_tier(), at_cpu_onednn_tier(level), at_gemm_tune_tiny() ? "|tiny" : "");
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int cache_dir(char *dir, size_t len)
{
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (x && *x) n = snprintf(dir, len, "%s/anytune", x);
    else if (home && *home) n = snprintf(dir, len, "%s/.cache/anytune", home);
    else return 0;
    return n > 0 && (size_t)n < len;
}

static int cache_file(const char *key, char *path, size_t len)
{
    char dir[1024];
    if (!cache_dir(dir, sizeof dir)) return 0;
    int n = snprintf(path, len, "%s/gemm-engines-%016llx.txt", dir, (unsigned long long)fnv1a(key));
    return n > 0 && (size_t)n < len;
}

/* The key may change within a process (ISA level forced by tests, thread
 * count set): then what was measured is forgotten. */
static void check_key(void)
{
    char key[sizeof cur_key];
    make_key(key, sizeof key);
    if (strcmp(key, cur_key)) {
        memcpy(cur_key, key, sizeof key);
        memset(table, 0, sizeof table);
        cache_read = 0;
    }
}

/* ---- the cache file ---- */

/* Reads the file for cur_key into table[] (classes it lists); the whole file
 * is ignored if any line does not parse or the key differs. */
static void read_cache(void)
{
    char path[1100], line[700];
    if (!cache_file(cur_key, path, sizeof path)) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    at_gemm_tune_result got[AT_GEMM_CLASSES];
    memset(got, 0, sizeof got);
    int ok = fgets(line, sizeof line, f) && !strcmp(line, FILE_MAGIC "\n");
    ok = ok && fgets(line, sizeof line, f) && !strncmp(line, "key ", 4) && strlen(line) == 5 + strlen(cur_key) &&
         !strncmp(line + 4, cur_key, strlen(cur_key)) && line[4 + strlen(cur_key)] == '\n';
    while (ok && fgets(line, sizeof line, f)) {
        char cls[32], choice[32];
        double g[AT_GEMM_ENGINES];
        int used = 0;
        if (sscanf(line, "%31s %31s %lf %lf %lf%n", cls, choice, &g[0], &g[1], &g[2], &used) != 5 ||
            line[used] != '\n') {
            ok = 0;
            break;
        }
        int c = -1, e = engine_named(choice);
        for (int i = 0; i < AT_GEMM_CLASSES; i++)
            if (!strcmp(cls, at_gemm_tune_class_name(i))) c = i;
        if (c < 0 || e < 0 || got[c].known || !(g[e] > 0) || g[0] <= 0) {
            ok = 0;
            break;
        }
        got[c].known = got[c].from_cache = got[c].steady = 1;
        got[c].choice = (at_gemm_engine_id)e;
        for (int i = 0; i < AT_GEMM_ENGINES; i++) got[c].gflops[i] = g[i];
    }
    fclose(f);
    if (!ok) {
        at_log_info("GEMM engine cache %s is of another format or key, or does not parse; measuring again", path);
        return;
    }
    for (int i = 0; i < AT_GEMM_CLASSES; i++)
        if (got[i].known) table[i] = got[i];
}

static void mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        (void)mkdir(tmp, 0755);
        *p = '/';
    }
    (void)mkdir(tmp, 0755);
}

/* Writes every known class: a temporary file in the same folder, renamed
 * over the old one, so that a reader never sees half a file. Failing to
 * write only costs a measurement next time. */
static void write_cache(void)
{
    char dir[1024], path[1100], tmp[1200];
    if (!cache_dir(dir, sizeof dir) || !cache_file(cur_key, path, sizeof path)) return;
    mkdirs(dir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%s\nkey %s\n", FILE_MAGIC, cur_key);
    for (int c = 0; c < AT_GEMM_CLASSES; c++) {
        const at_gemm_tune_result *r = &table[c];
        if (!r->known || !r->steady) continue; /* an unsteady figure is this process's alone */
        fprintf(f, "%s %s %.3f %.3f %.3f\n", at_gemm_tune_class_name(c), at_gemm_engine_name(r->choice),
                r->gflops[0], r->gflops[1], r->gflops[2]);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        at_log_info("could not write the GEMM engine cache %s: %s", path, strerror(errno));
        (void)remove(tmp);
    }
}

/* ---- measuring ---- */

#define MIN_ROUNDS 5
#define MIN_SECONDS 0.05   /* long enough for /proc/stat's 10 ms ticks to tell load */
#define MAX_ROUNDS 64
#define ROUND_BUDGET 0.4   /* seconds of rounds per class, past which MIN_ROUNDS suffice */
#define SAMPLE_SECONDS 5e-4
#define STEADY_COUNT 3     /* samples within STEADY_TOL of the best */
#define STEADY_TOL 1.05

static double (*test_clock)(void); /* at_gemm_tune_use_clock; NULL: the monotonic clock */

static double now(void)
{
    if (test_clock) return test_clock();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds used by the whole machine (busy) and available to it (all),
 * summed over its CPUs, from /proc/stat; 0 when it cannot be read. */
static int machine_cpu(double *busy, double *all)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (n < 4 || hz <= 0) return 0;
    /* user nice system idle iowait irq softirq steal: idle and iowait are free time */
    double b = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]), i = (double)(v[3] + v[4]);
    *busy = b / (double)hz;
    *all = (b + i) / (double)hz;
    return 1;
}

static double own_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void at_gemm_tune_use_clock(double (*seconds)(void)) { test_clock = seconds; }

int at_gemm_tune_busy(double others, double capacity)
{
    /* two ticks of slack: /proc/stat counts whole 10 ms ticks, ours is exact */
    return others > 0.25 * capacity && others > 0.02;
}

double at_gemm_tune_best(const double *secs, int n, int *steady)
{
    double best = -1;
    for (int i = 0; i < n; i++)
        if (best < 0 || secs[i] < best) best = secs[i];
    int near = 0;
    for (int i = 0; i < n && best > 0; i++) near += secs[i] <= best * STEADY_TOL;
    *steady = best > 0 && near >= STEADY_COUNT;
    return best;
}

at_gemm_engine_id at_gemm_tune_choose(const double gflops[AT_GEMM_ENGINES])
{
    at_gemm_engine_id choice = AT_GEMM_ANYTUNE;
    double best = gflops[AT_GEMM_ANYTUNE] * LIB_MARGIN;
    for (int e = 1; e < AT_GEMM_ENGINES; e++)
        if (gflops[e] > best) {
            best = gflops[e];
            choice = (at_gemm_engine_id)e;
        }
    return choice;
}

/* GFLOP/s of each engine (available bits) on the class's problem, into
 * gflops[] (-1: not available or failed); returns whether every engine's
 * figure is steady. The engines take turns sample by sample, so that a
 * burst of load from another process hits them alike. */
static int time_engines(unsigned available, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                        const float *B, float *C, at_gemm_tune_run_fn run, double *gflops)
{
    int calls[AT_GEMM_ENGINES];
    double secs[AT_GEMM_ENGINES][MAX_ROUNDS];
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        gflops[e] = -1;
        calls[e] = 0;
        if (!(available >> e & 1)) continue;
        if (!run((at_gemm_engine_id)e, ta, tb, M, N, K, A, B, C)) continue; /* warm-up */
        double t0 = now();
        run((at_gemm_engine_id)e, ta, tb, M, N, K, A, B, C);
        double once = now() - t0;
        calls[e] = once >= SAMPLE_SECONDS ? 1 : (int)(SAMPLE_SECONDS / (once > 1e-7 ? once : 1e-7)) + 1;
    }
    int rounds = 0, steady = 0;
    double busy0 = 0, all0 = 0, own0 = own_cpu(), t_start = now();
    int have_stat = machine_cpu(&busy0, &all0);
    while (rounds < MAX_ROUNDS) {
        double t = now() - t_start;
        /* (tiny problems: the path is checked, not the machine: a quarter of the budget) */
        double budget = at_gemm_tune_tiny() ? ROUND_BUDGET / 4 : ROUND_BUDGET;
        if (rounds >= MIN_ROUNDS && ((steady && t >= MIN_SECONDS) || t > budget)) break;
        for (int e = 0; e < AT_GEMM_ENGINES; e++) {
            if (!calls[e]) continue;
            double t0 = now();
            for (int i = 0; i < calls[e]; i++) run((at_gemm_engine_id)e, ta, tb, M, N, K, A, B, C);
            secs[e][rounds] = (now() - t0) / calls[e];
        }
        rounds++;
        steady = 1;
        for (int e = 0; e < AT_GEMM_ENGINES; e++) {
            int ok = 1;
            if (calls[e]) (void)at_gemm_tune_best(secs[e], rounds, &ok);
            steady = steady && ok;
        }
    }
    double busy1, all1, others = 0;
    if (have_stat && machine_cpu(&busy1, &all1)) {
        others = (busy1 - busy0) - (own_cpu() - own0);
        if (!test_clock && at_gemm_tune_busy(others, all1 - all0)) steady = 0;
    }
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        int ok;
        if (!calls[e]) continue;
        gflops[e] = 2.0 * M * N * K / at_gemm_tune_best(secs[e], rounds, &ok) * 1e-9;
        at_log_debug("GEMM engine %s on %lldx%lldx%lld%s%s: best %.1f GFLOP/s of %d samples, %s",
                     at_gemm_engine_name((at_gemm_engine_id)e), (long long)M, (long long)N, (long long)K,
                     ta ? " A^T" : "", tb ? " B^T" : "", gflops[e], rounds, ok ? "steady" : "unsteady");
    }
    at_log_debug("GEMM engines timed for %.3f s; other processes took %.3f CPU-seconds", now() - t_start, others);
    return steady;
}

static void measure(int cls, unsigned available, at_gemm_tune_run_fn run)
{
    int ta, tb;
    int64_t M, N, K;
    at_gemm_tune_class_shape(cls, &ta, &tb, &M, &N, &K);
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    at_gemm_tune_result r = {.known = 1, .choice = AT_GEMM_ANYTUNE};
    if (A && B && C) {
        for (int64_t i = 0; i < M * K; i++) A[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
        for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 104729) % 2001 - 1000) * 1e-3f;
        r.steady = time_engines(available | 1u, ta, tb, M, N, K, A, B, C, run, r.gflops);
        r.choice = at_gemm_tune_choose(r.gflops);
        r.known = r.gflops[AT_GEMM_ANYTUNE] > 0;
        if (!r.steady)
            at_log_debug("GEMM engines for %s measured under load (samples unsteady): used by this process, not "
                        "cached", at_gemm_tune_class_name(cls));
    } else {
        r.known = 0; /* try again next time */
    }
    free(A);
    free(B);
    free(C);
    if (r.known) table[cls] = r;
}

at_gemm_engine_id at_gemm_tune_engine(int cls, unsigned available, at_gemm_tune_run_fn run)
{
    if (cls < 0 || cls >= AT_GEMM_CLASSES || !(available & ~1u)) return AT_GEMM_ANYTUNE;
    at_gemm_engine_id e = AT_GEMM_ANYTUNE;
    pthread_mutex_lock(&lock);
    /* inside a parallel region the thread count (part of the key) reads
     * differently: use what is known, measure nothing */
    int nested = omp_in_parallel();
    if (!nested) check_key();
    if (!cache_read && !nested) {
        read_cache();
        cache_read = 1;
    }
    if (!table[cls].known && !nested) {
        measure(cls, available, run);
        if (table[cls].known && table[cls].steady) write_cache();
    }
    if (table[cls].known && available >> table[cls].choice & 1) e = table[cls].choice;
    pthread_mutex_unlock(&lock);
    return e;
}

at_gemm_tune_result at_gemm_tune_result_of(int cls)
{
    at_gemm_tune_result r = {0};
    if (cls < 0 || cls >= AT_GEMM_CLASSES) return r;
    pthread_mutex_lock(&lock);
    check_key();
    r = table[cls];
    pthread_mutex_unlock(&lock);
    return r;
}

const char *at_gemm_tune_cache_path(void)
{
    static char path[1100];
    pthread_mutex_lock(&lock);
    check_key();
    if (!cache_file(cur_key, path, sizeof path)) path[0] = '\0';
    pthread_mutex_unlock(&lock);
    return path;
}

void at_gemm_tune_forget(void)
{
    pthread_mutex_lock(&lock);
    memset(table, 0, sizeof table);
    cache_read = 0;
    cur_key[0] = '\0';
    pthread_mutex_unlock(&lock);
}
