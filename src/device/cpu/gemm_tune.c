/* Measured choice of the f32 GEMM engine per problem class (gemm_tune.h).
 *
 * Timing: one warm-up call per engine (oneDNN compiles its kernel then,
 * OpenBLAS starts its threads), then 5 samples of as many calls as fill
 * ~1.5 ms each, the engines taking turns; the median sample per call gives
 * the GFLOP/s. About 10-20 ms per engine and
 * class, so a class costs well under 0.1 s once, and nothing after that
 * while the cache file holds. */
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

#define FILE_MAGIC "anytune-gemm-engines 1"
#define LIB_MARGIN 1.03 /* a library must be this much faster than our kernels */

static const char *kind_names[4] = {"rows", "skinny-n", "skinny-k", "large"};
static const char *layout_names[3] = {"nn", "nt", "tn"};

int at_gemm_tune_class(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K)
{
    int kind = M <= 8 ? 0 : N <= 64 ? 1 : K <= 64 ? 2 : 3;
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

/* Sizes typical of the kind in LLM work (Qwen2.5-0.5B's hidden 896 and
 * LoRA ranks), small enough to time in milliseconds: the rows kind streams
 * a 16 MB weight (memory-bound, like decoding). */
void at_gemm_tune_class_shape(int cls, int *trans_a, int *trans_b, int64_t *M, int64_t *N, int64_t *K)
{
    static const int64_t dims[4][3] = {{1, 4096, 1024}, {512, 16, 1024}, {512, 1024, 16}, {256, 1024, 512}};
    int kind = cls / 3, layout = cls % 3;
    /* tiny: the sizes above 16 divided by 4, which keeps each problem in its class */
    int64_t div = at_gemm_tune_tiny() ? 4 : 1;
    *trans_a = layout == 2;
    *trans_b = layout == 1;
    *M = dims[kind][0] > 16 ? dims[kind][0] / div : dims[kind][0];
    if (kind == 0 && layout == 2) *M = 8; /* rows-tn: LoRA's dA = duᵀ·x at rank 8 (a transposed GEMV is rare) */
    *N = dims[kind][1] > 16 ? dims[kind][1] / div : dims[kind][1];
    *K = dims[kind][2] > 16 ? dims[kind][2] / div : dims[kind][2];
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
    /* the libraries' own ISA caps change what they measure (bench_gemm sets them) */
    const char *ct = getenv("OPENBLAS_CORETYPE"), *dn = getenv("ONEDNN_MAX_CPU_ISA");
    snprintf(key, len, "%s|%s|threads %d|%s|coretype %s|onednn isa %s%s", at_cpu_get_features()->model,
             at_cpu_isa_name(at_cpu_isa_level()), omp_get_max_threads(), libs, ct ? ct : "-", dn ? dn : "-",
             at_gemm_tune_tiny() ? "|tiny" : "");
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
        got[c].known = got[c].from_cache = 1;
        got[c].choice = (at_gemm_engine_id)e;
        for (int i = 0; i < AT_GEMM_ENGINES; i++) got[c].gflops[i] = g[i];
    }
    fclose(f);
    if (!ok) {
        at_log_info("GEMM engine cache %s does not parse; measuring again", path);
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
        if (!r->known) continue;
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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GFLOP/s of each engine (available bits) on the class's problem, into
 * gflops[] (-1: not available or failed). The engines take turns sample by
 * sample, so that a burst of load from another process hits them alike. */
static void time_engines(unsigned available, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                         const float *B, float *C, at_gemm_tune_run_fn run, double *gflops)
{
    int calls[AT_GEMM_ENGINES];
    double samples[AT_GEMM_ENGINES][5];
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        gflops[e] = -1;
        calls[e] = 0;
        if (!(available >> e & 1)) continue;
        double t0 = now();
        if (!run((at_gemm_engine_id)e, ta, tb, M, N, K, A, B, C)) continue; /* also the warm-up */
        double once = now() - t0;
        calls[e] = once > 1.5e-3 ? 1 : (int)(1.5e-3 / (once > 1e-6 ? once : 1e-6)) + 1;
    }
    for (int s = 0; s < 5; s++)
        for (int e = 0; e < AT_GEMM_ENGINES; e++) {
            if (!calls[e]) continue;
            double t0 = now();
            for (int i = 0; i < calls[e]; i++) run((at_gemm_engine_id)e, ta, tb, M, N, K, A, B, C);
            samples[e][s] = (now() - t0) / calls[e];
        }
    for (int e = 0; e < AT_GEMM_ENGINES; e++) {
        if (!calls[e]) continue;
        qsort(samples[e], 5, sizeof samples[e][0], cmp_double);
        gflops[e] = 2.0 * M * N * K / samples[e][2] * 1e-9;
    }
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
        time_engines(available | 1u, ta, tb, M, N, K, A, B, C, run, r.gflops);
        double best = r.gflops[AT_GEMM_ANYTUNE] * LIB_MARGIN;
        for (int e = 1; e < AT_GEMM_ENGINES; e++)
            if (r.gflops[e] > best) {
                best = r.gflops[e];
                r.choice = (at_gemm_engine_id)e;
            }
        r.known = r.gflops[AT_GEMM_ANYTUNE] > 0;
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
        if (table[cls].known) write_cache();
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
