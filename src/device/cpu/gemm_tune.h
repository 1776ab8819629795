/* Which engine runs an f32 x f32 -> f32 GEMM, chosen by measurement on the
 * machine at hand.
 *
 * Problems fall into classes by shape and transpose layout (see
 * at_gemm_tune_class). The first time a class is used, each engine the build
 * has (our kernels, OpenBLAS's cblas_sgemm, oneDNN's dnnl_sgemm) runs a
 * representative problem of that class and the fastest one is kept; a
 * library must beat our kernels by more than 3% to be chosen
 * (at_gemm_tune_choose). Timing (at_gemm_tune_best): the engines take turns
 * sample by sample and each is credited with its fastest sample, as load from
 * other processes only ever adds time. A measurement is steady when each
 * engine has several samples within a few percent of its best and other
 * processes took little of the machine meanwhile; only steady ones are
 * cached, so that a measurement disturbed by load is used by this process
 * alone and the next one measures again.
 * The choices and their GFLOP/s are cached in
 *   $XDG_CACHE_HOME/anytune/gemm-engines-<hash>.txt (else ~/.cache/anytune/)
 * keyed by the CPU model, the ISA level (ANYTUNE_CPU_ISA lowers it), the
 * thread count and the libraries' versions; the file is written atomically
 * (a temporary file renamed over it) and a file that does not parse, is of
 * an older format, or whose key differs, is ignored and measured again.
 * Once known in a process, a class's engine does not change in it (unless
 * the key does).
 *
 * Environment: ANYTUNE_GEMM_TUNE=0 measures nothing (our kernels, unless
 * ANYTUNE_GEMM_F32 names an engine; the test suite sets it so that results
 * do not depend on timings); ANYTUNE_GEMM_TUNE=tiny times tiny problems
 * (at_gemm_tune_tiny); ANYTUNE_GEMM_F32=anytune|openblas|onednn pins every
 * class (gemm.h). */
#ifndef AT_DEVICE_CPU_GEMM_TUNE_H
#define AT_DEVICE_CPU_GEMM_TUNE_H

#include <stdint.h>

typedef enum { AT_GEMM_ANYTUNE = 0, AT_GEMM_OPENBLAS, AT_GEMM_ONEDNN, AT_GEMM_ENGINES } at_gemm_engine_id;

/* Classes: by the smallest of M, N, K (M first on ties) when it is <= 64,
 * bucketed by its size, else large; each by layout nn, nt, tn (tt counts as
 * nt). Kinds: m1 (M = 1: decode's GEMV), m16 (M <= 16: batched decode,
 * LoRA's dA = duᵀ·x), m64 (M <= 64), n16 (N <= 16: LoRA's x·Aᵀ, du = dy·B,
 * dB = dyᵀ·u at ranks 8-16), n64, k16 (K <= 16: LoRA's u·Bᵀ and du·A, an
 * outer product), k64 (ranks 32-64, attention's head dimension), large, and
 * deep: large with K at least twice M and N (the MLP's down projection and
 * its dX), where the engines' K blocking and packing weigh differently: one
 * class timed at 512x1024x512 handed dX NT (K 4864) to a library running it
 * at half our speed. */
enum { AT_GEMM_KINDS = 9, AT_GEMM_CLASSES = AT_GEMM_KINDS * 3 };

int at_gemm_tune_class(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K);
/* "large-nn", "m1-nt", "k16-nn", ... */
const char *at_gemm_tune_class_name(int cls);
/* The representative problem timed for a class: the bucket's typical small
 * size (1, 8 or 32; 8 is LoRA's most used rank) against Qwen2.5-0.5B's
 * sizes (hidden 896, MLP 4864, cut to 3072 for large and deep) and 512
 * tokens, the shapes bench_gemm lists. */
void at_gemm_tune_class_shape(int cls, int *trans_a, int *trans_b, int64_t *M, int64_t *N, int64_t *K);
const char *at_gemm_engine_name(at_gemm_engine_id e);

/* Runs C = op(A) op(B) (alpha 1, beta 0, packed leading dimensions) on
 * engine e; returns 0 if that engine could not run it. */
typedef int (*at_gemm_tune_run_fn)(at_gemm_engine_id e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                   const float *A, const float *B, float *C);

typedef struct {
    int known;                        /* measured or read from the cache */
    int from_cache;                   /* read from the cache file */
    int steady;                       /* read from the cache, or measured undisturbed (then cached) */
    double gflops[AT_GEMM_ENGINES];   /* < 0: engine not in this build */
    at_gemm_engine_id choice;
} at_gemm_tune_result;

/* The choice rule: the fastest of gflops[] (< 0: engine absent), where a
 * library must beat our kernels by more than 3% (the spread of repeated
 * best-of measurements on a shared 2-core machine). */
at_gemm_engine_id at_gemm_tune_choose(const double gflops[AT_GEMM_ENGINES]);

/* The timing rule: of n samples (seconds per call) of one engine, the
 * fastest; *steady = at least 3 lie within 5% of it (one lucky fast sample,
 * or samples all over the place, mean the machine was busy). */
double at_gemm_tune_best(const double *secs, int n, int *steady);
/* The load rule: other processes took `others` CPU-seconds of the
 * machine's `capacity` (CPUs x seconds) while engines were timed: more than
 * a quarter of it makes the measurement unsteady. */
int at_gemm_tune_busy(double others, double capacity);
/* Times engines with `seconds` instead of the monotonic clock, and turns
 * the load rule off: for tests whose runners advance a clock of their own
 * instead of multiplying, so that their timings are exact whatever the
 * machine is doing. NULL restores the monotonic clock and the load rule. */
void at_gemm_tune_use_clock(double (*seconds)(void));

/* The engine for class cls: measured with run on first use (available: a
 * bit per at_gemm_engine_id the build has), or read from the cache. Thread
 * safe; inside an OpenMP parallel region a class not yet known gets our
 * kernels without measuring. */
at_gemm_engine_id at_gemm_tune_engine(int cls, unsigned available, at_gemm_tune_run_fn run);
/* What is known of class cls (no measuring). */
at_gemm_tune_result at_gemm_tune_result_of(int cls);
/* The cache file's path for the current key ("" when no cache directory);
 * forgets what was measured in this process (tests). */
const char *at_gemm_tune_cache_path(void);
void at_gemm_tune_forget(void);
/* ANYTUNE_GEMM_TUNE is not "0" (read at each call). */
int at_gemm_tune_enabled(void);
/* ANYTUNE_GEMM_TUNE=tiny: each class timed on a problem 16-64 times smaller
 * (its sizes above 16 divided by 4), cached under a key of its own. For
 * checking the calibration's path where timing is slow and meaningless (the
 * aarch64 suite under qemu); the choices are not a machine's real ones. */
int at_gemm_tune_tiny(void);

#endif
