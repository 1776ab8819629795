/* GEMM throughput: anytune's at_cpu_gemm against OpenBLAS (cblas_sgemm, and
 * cblas_sbgemm when the installed library exports it) and oneDNN (dnnl_sgemm
 * for f32, a matmul primitive with bf16 inputs and f32 output for bf16).
 *
 *   bench_gemm            square 512..4096 and the LLM training shapes
 *   bench_gemm -q         fewer sizes (a quick look)
 *   bench_gemm -f NAME    only rows whose name contains NAME
 *   bench_gemm -d f32     only one dtype (f32 or bf16)
 *   bench_gemm -r N       repetitions per measurement (median is reported)
 *   bench_gemm -l         libraries only (skip anytune)
 *   bench_gemm -c         time with the process's CPU time instead of the wall
 *                         clock: with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
 *                         this compares kernels per core, unaffected by time
 *                         slices other processes take (threads that spin
 *                         waiting would count, so single thread only)
 *   bench_gemm -b         report the best run instead of the median (on a
 *                         busy machine the best is the steadier estimate)
 *   bench_gemm -e         leave the libraries' ISA variables as they are
 *                         (see bench_libraries_at_our_level)
 *
 * Each row warms every engine up, then runs them in turn (measure_all) and
 * reports each one's median GFLOP/s; ratio = ours / best library on that row. */
#include "base/threads.h"
#include "bench_util.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/gemm.h"
#include "device/dtype.h"

#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef AT_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef AT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

typedef struct {
    const char *name;
    int ta, tb;
    int64_t M, N, K;
    int quick; /* part of the -q set */
} shape;

static const shape shapes[] = {
    {"sq512", 0, 0, 512, 512, 512, 0},
    {"sq1024", 0, 0, 1024, 1024, 1024, 1},
    {"sq2048", 0, 0, 2048, 2048, 2048, 0},
    {"sq4096", 0, 0, 4096, 4096, 4096, 0},
    {"up 512x896*896x4864", 0, 0, 512, 4864, 896, 1},
    {"down 512x4864*4864x896", 0, 0, 512, 896, 4864, 1},
    {"dX NN 512x4864*4864x896", 0, 0, 512, 896, 4864, 0},
    {"dX NT 512x4864*(896x4864)T", 0, 1, 512, 896, 4864, 1},
    {"dW TN (4864x512)T*512x896", 1, 0, 4864, 896, 512, 1},
    {"decode 1x896*896x4864", 0, 0, 1, 4864, 896, 1},
    {"decode NT 1x896*(4864x896)T", 0, 1, 1, 4864, 896, 0},
    {"lora 512x896*896x8", 0, 0, 512, 8, 896, 1},
    {"lora 512x8*8x896", 0, 0, 512, 896, 8, 0},
    {"lora dA (512x8)T*512x896", 1, 0, 8, 896, 512, 0},
};

static int cpu_clock;

static double now(void)
{
    struct timespec ts;
    clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


typedef struct {
    const shape *s;
    void *A, *B;
    float *C;
    at_dtype dt;
#ifdef AT_HAVE_DNNL
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc;
#endif
} ctx;

typedef enum { ENG_OURS, ENG_OPENBLAS, ENG_DNNL, ENG_COUNT } engine;
static const char *engine_names[ENG_COUNT] = {"anytune", "OpenBLAS", "oneDNN"};

typedef void (*sbgemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int,
                          float, float *, int);
static sbgemm_fn sbgemm;
static int bench_best;

static int64_t lda_of(const shape *s) { return s->ta ? s->M : s->K; }
static int64_t ldb_of(const shape *s) { return s->tb ? s->K : s->N; }

/* Runs one GEMM with the engine; returns 0 when the engine cannot. */
static int run_once(ctx *c, engine e)
{
    const shape *s = c->s;
    switch (e) {
    case ENG_OURS:
        at_cpu_gemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, c->A, c->dt, lda_of(s), c->B, c->dt, ldb_of(s), 0.0f, c->C,
                    AT_F32, s->N);
        return 1;
    case ENG_OPENBLAS:
#ifdef AT_HAVE_OPENBLAS
        if (c->dt == AT_F32) {
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                        (int)s->M, (int)s->N, (int)s->K, 1.0f, c->A, (int)lda_of(s), c->B, (int)ldb_of(s), 0.0f, c->C,
                        (int)s->N);
            return 1;
        }
        if (sbgemm) {
            sbgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)s->M,
                   (int)s->N, (int)s->K, 1.0f, c->A, (int)lda_of(s), c->B, (int)ldb_of(s), 0.0f, c->C, (int)s->N);
            return 1;
        }
#endif
        return 0;
    case ENG_DNNL:
#ifdef AT_HAVE_DNNL
        if (c->dt == AT_F32) {
            return dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, 1.0f, c->A, lda_of(s), c->B,
                              ldb_of(s), 0.0f, c->C, s->N) == dnnl_success;
        }
        if (c->prim) {
            dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, c->ma}, {DNNL_ARG_WEIGHTS, c->mb}, {DNNL_ARG_DST, c->mc}};
            if (dnnl_primitive_execute(c->prim, c->stream, 3, args) != dnnl_success) return 0;
            return dnnl_stream_wait(c->stream) == dnnl_success;
        }
#endif
        return 0;
    default: return 0;
    }
}

#ifdef AT_HAVE_DNNL
/* A bf16 x bf16 -> f32 matmul primitive for the shape (made once, outside timing). */
static void dnnl_setup(ctx *c)
{
    const shape *s = c->s;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t ad = {s->M, s->K}, bd = {s->K, s->N}, cd = {s->M, s->N};
    dnnl_dims_t as = {s->ta ? 1 : lda_of(s), s->ta ? lda_of(s) : 1};
    dnnl_dims_t bs = {s->tb ? 1 : ldb_of(s), s->tb ? ldb_of(s) : 1};
    dnnl_dims_t cs = {s->N, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    c->prim = NULL;
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) != dnnl_success) return;
    dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags);
    dnnl_memory_desc_init_by_strides(&a_md, 2, ad, dnnl_bf16, as);
    dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_bf16, bs);
    dnnl_memory_desc_init_by_strides(&c_md, 2, cd, dnnl_f32, cs);
    if (dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md) != dnnl_success) return;
    if (dnnl_primitive_desc_create(&pd, &md, NULL, c->eng, NULL) != dnnl_success) return;
    if (dnnl_primitive_create(&c->prim, pd) != dnnl_success) c->prim = NULL;
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_create(&c->ma, &a_md, c->eng, c->A);
    dnnl_memory_create(&c->mb, &b_md, c->eng, c->B);
    dnnl_memory_create(&c->mc, &c_md, c->eng, c->C);
}

static void dnnl_teardown(ctx *c)
{
    if (c->prim) {
        dnnl_primitive_destroy(c->prim);
        dnnl_memory_destroy(c->ma);
        dnnl_memory_destroy(c->mb);
        dnnl_memory_destroy(c->mc);
    }
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->eng) dnnl_engine_destroy(c->eng);
}
#endif

/* GFLOP/s of each engine (-1: unsupported or skipped), median (or best)
 * of reps runs after two warm-ups. The engines take turns run by run, so
 * that a change in the machine's other load between them (the helpers'
 * builds come and go within seconds) shifts all of them alike and the
 * ratio keeps its meaning. */
static void measure_all(ctx *c, const int use[ENG_COUNT], int reps, double g[ENG_COUNT])
{
    const shape *s = c->s;
    double flops = 2.0 * s->M * s->N * s->K, slowest = 0;
    int on[ENG_COUNT];
    for (int e = 0; e < ENG_COUNT; e++) {
        g[e] = -1;
        on[e] = use[e] && run_once(c, (engine)e);
        if (!on[e]) continue;
        double t0 = now();
        run_once(c, (engine)e);
        double t1 = now() - t0;
        if (t1 > slowest) slowest = t1;
    }
    int n = reps;
    if (n <= 0) { /* about 0.4 s per engine, between 5 and 41 runs */
        n = slowest > 0 ? (int)(0.4 / slowest) : 41;
        if (n < 5) n = 5;
        if (n > 41) n = 41;
    }
    double *t = malloc(sizeof(double) * n * ENG_COUNT);
    if (!t) return;
    for (int i = 0; i < n; i++)
        for (int e = 0; e < ENG_COUNT; e++) {
            if (!on[e]) continue;
            double a = now();
            run_once(c, (engine)e);
            t[e * n + i] = flops / (now() - a) / 1e9;
        }
    for (int e = 0; e < ENG_COUNT; e++) {
        if (!on[e]) continue;
        qsort(t + e * n, n, sizeof(double), bench_cmp_double);
        g[e] = bench_best ? t[e * n + n - 1] : t[e * n + n / 2];
    }
    free(t);
}

static void fill(void *p, at_dtype dt, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float v = ((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
        if (dt == AT_F32) ((float *)p)[i] = v;
        else ((uint16_t *)p)[i] = at_f32_to_bf16(v);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, reps = 0, libs_only = 0, keep_env = 0;
    const char *filter = NULL, *only_dt = NULL;
    at_threads_setup(argv); /* threads wait as in the program (base/threads.h) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-q")) quick = 1;
        else if (!strcmp(argv[i], "-l")) libs_only = 1;
        else if (!strcmp(argv[i], "-b")) bench_best = 1;
        else if (!strcmp(argv[i], "-c")) cpu_clock = 1;
        else if (!strcmp(argv[i], "-e")) keep_env = 1;
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) only_dt = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-q] [-l] [-b] [-c] [-e] [-f NAME] [-d f32|bf16] [-r REPS]\n", argv[0]);
            return 2;
        }
    }
    if (!keep_env) bench_libraries_at_our_level(argv, 1);
#ifdef AT_HAVE_OPENBLAS
    sbgemm = (sbgemm_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "cblas_sbgemm");
#endif
    double load[1] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load[0]) != 1) load[0] = -1;
        fclose(f);
    }
    const char *ct = getenv("OPENBLAS_CORETYPE"), *dn = getenv("ONEDNN_MAX_CPU_ISA");
    printf("cpu: %s, isa %s, %d OpenMP threads, load average %.2f, OPENBLAS_CORETYPE=%s, ONEDNN_MAX_CPU_ISA=%s%s%s\n",
           at_cpu_get_features()->model, at_cpu_isa_name(at_cpu_isa_level()), omp_get_max_threads(), load[0],
           ct ? ct : "(unset)", dn ? dn : "(unset)", cpu_clock ? ", timed by CPU time" : "", bench_best ? ", best of runs" : ", median of runs");
    printf("engines in use: f32 %s, bf16 %s; OpenBLAS bf16 (cblas_sbgemm) %s\n", at_cpu_gemm_engine(AT_F32),
           at_cpu_gemm_engine(AT_BF16), sbgemm ? "exported" : "not exported");
    printf("%-30s %-5s %9s %9s %9s %7s\n", "shape (M,N,K)", "dtype", "anytune", "OpenBLAS", "oneDNN", "ratio");

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        if (quick && !s->quick) continue;
        if (filter && !strstr(s->name, filter)) continue;
        for (int d = 0; d < 2; d++) {
            at_dtype dt = d ? AT_BF16 : AT_F32;
            if (only_dt && strcmp(only_dt, at_dtype_name(dt))) continue;
            size_t es = dt == AT_F32 ? 4 : 2;
            ctx c;
            memset(&c, 0, sizeof c);
            c.s = s;
            c.dt = dt;
            c.A = malloc(es * s->M * s->K);
            c.B = malloc(es * s->K * s->N);
            c.C = malloc(sizeof(float) * s->M * s->N);
            if (!c.A || !c.B || !c.C) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            fill(c.A, dt, s->M * s->K, 1);
            fill(c.B, dt, s->K * s->N, 2);
#ifdef AT_HAVE_DNNL
            if (dt == AT_BF16) dnnl_setup(&c);
#endif
            double g[ENG_COUNT];
            int use[ENG_COUNT];
            for (int e = 0; e < ENG_COUNT; e++) use[e] = !(e == ENG_OURS && libs_only);
            measure_all(&c, use, reps, g);
            double best = -1;
            for (int e = 1; e < ENG_COUNT; e++)
                if (g[e] > best) best = g[e];
            char cols[ENG_COUNT][16], ratio[16] = "-";
            for (int e = 0; e < ENG_COUNT; e++) {
                if (g[e] < 0) snprintf(cols[e], sizeof cols[e], "n/a");
                else snprintf(cols[e], sizeof cols[e], "%.1f", g[e]);
            }
            if (best > 0 && g[0] > 0) snprintf(ratio, sizeof ratio, "%.2f", g[0] / best);
            printf("%-30s %-5s %9s %9s %9s %7s\n", s->name, at_dtype_name(dt), cols[0], cols[1], cols[2], ratio);
            fflush(stdout);
#ifdef AT_HAVE_DNNL
            if (dt == AT_BF16) dnnl_teardown(&c);
#endif
            free(c.A);
            free(c.B);
            free(c.C);
        }
    }
    (void)engine_names;
    return 0;
}
