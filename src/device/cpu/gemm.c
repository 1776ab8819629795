/* The CPU GEMM driver: argument checks, the choice of path and kernel, cache
 * blocking and threads. The instruction-set kernels live in gemm_avx2.c,
 * gemm_avx512.c and gemm_avx512bf16.c; their contract is gemm_kernels.h.
 *
 * Paths:
 *  - small: M or N tiny (decode, LoRA rank r; see small_side). The tiny
 *    operand is converted once to f32 and the big one streamed in place,
 *    threads splitting the big one (one thread or all, as measured:
 *    at_par_threads); nothing is packed.
 *  - outer: K tiny (LoRA's rank-r update, <= AT_GEMM_OUTER_K) and M, N not.
 *    Both operands converted once to f32, each tile of C written once.
 *  - blocked (GotoBLAS): for each NC block of columns and KC block of k, pack
 *    op(B) into NR-wide panels; for each MC block of rows pack op(A) into
 *    MR-high panels; the MRxNR microkernel walks the panels. Blocks are cut
 *    to equal sizes (no thin remainder block). Threads own disjoint
 *    rectangles of C with private packing buffers (gemm_blocked says why).
 *  - library: f32 x f32 -> f32 can be handed to oneDNN or OpenBLAS, when
 *    that measured faster for the problem's class on this machine (see
 *    "libraries" below and gemm_tune.h).
 * Compute format (see gemm.h) is decided here (run_ours): bf16 if either
 * input is bf16 and the CPU multiplies bf16 natively, else f32 on the
 * inputs widened as they are packed.
 *
 * Block sizes (gemm_*.c) were chosen by measurement. f32 on a 2-core Zen 5
 * (L1d 48 KiB, L2 1 MiB per core): kc 1024, nc 1024, and mc 112 (AVX-512)
 * or 72 (AVX2), i.e. the packed block of A keeps the 448 KiB of L2 it had
 * at kc 512 (mc 224 / 144, nc 2048). The kernels stream the kc x nr panel
 * of B from L2 (it no longer fits L1), and C is read and written half as
 * often: per core (one thread, CPU time, median of 3-5 runs on a busy
 * machine) against the best library in the same run, AVX-512 sq2048
 * 0.94 -> 1.00-1.02, up 0.93 -> 1.02, down 0.92 -> 0.96-0.98, dX NT 0.96
 * -> 0.98; AVX2 sq2048 0.96 -> 0.98, up 0.98 -> 1.02; kc 256 was 10-15%
 * slower, kc 768 or 1536 no better. nc 1024 rather than 2048 keeps the
 * packed block of B (re-read from L3 for each block of A, 112 rows) at
 * 4 MiB: sq2048 +5%. bf16 (gemm_avx512bf16.c) keeps what a Zen 4 (L1d 32
 * KiB) gave: kc 512 f32 values in bytes. On a CPU with smaller caches the
 * blocks are cut to the same share of them (at_gemm_sized_for_caches). */
#include "device/cpu/gemm.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/progress.h"
#include "base/threads.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_libs.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/cpu/cpu_simd.h"
#include "device/cpu/gemm_kernels.h"
#include "device/cpu/gemm_tune.h"

#ifdef AT_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef AT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

/* Up to these sizes of M or N the small path beats packing (measured on Zen
 * 4): the axpy form streams the big operand once per 8 rows of the tiny one,
 * the dot form rereads it per 8 too but with less work per load. */
#define SMALL_AXPY 16
#define SMALL_DOT 8
/* Below this many bytes of the big operand (a few microseconds of reading)
 * the small path runs on one thread without timing (a wake-up of another
 * thread costs more). */
#define PAR_MIN_BYTES 32768

static size_t esize(at_dtype t) { return t == AT_F32 ? 4 : 2; }

static float load_f32(const void *p, at_dtype t, int64_t i)
{
    switch (t) {
    case AT_BF16: return at_bf16_to_f32(((const uint16_t *)p)[i]);
    case AT_F16: return at_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static float round_bf16(float v) { return at_bf16_to_f32(at_f32_to_bf16(v)); }

static void store_c(void *c, at_dtype ct, int64_t i, float v)
{
    if (ct == AT_BF16) ((uint16_t *)c)[i] = at_f32_to_bf16(v);
    else ((float *)c)[i] = v;
}

/* ---- portable kernels (also the reference for the others) ---- */

void at_gemm_pack_portable(void *dst_, const void *src, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n,
                           int64_t kc, int round)
{
    float *dst = dst_;
    for (int64_t x0 = 0; x0 < n; x0 += w, dst += kc * w) {
        for (int64_t k = 0; k < kc; k++) {
            for (int x = 0; x < w; x++) {
                float v = x0 + x < n ? load_f32(src, t, (x0 + x) * sx + k * sk) : 0.0f;
                dst[k * w + x] = round ? round_bf16(v) : v;
            }
        }
    }
}

void at_gemm_store_tile(const float *acc, int ld, void *c, at_dtype ct, int64_t ldc, int m, int n, float alpha,
                        float beta)
{
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float v = alpha * acc[i * ld + j];
            if (beta != 0.0f) v += beta * load_f32(c, ct, i * ldc + j);
            store_c(c, ct, i * ldc + j, v);
        }
    }
}

#define SCALAR_MR 4
#define SCALAR_NR 8

static void kernel_scalar(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m,
                          int n, float alpha, float beta)
{
    const float *ap = ap_, *bp = bp_;
    float acc[SCALAR_MR][SCALAR_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        for (int i = 0; i < SCALAR_MR; i++) {
            float a = ap[k * SCALAR_MR + i];
            for (int j = 0; j < SCALAR_NR; j++) acc[i][j] += a * bp[k * SCALAR_NR + j];
        }
    }
    at_gemm_store_tile(&acc[0][0], SCALAR_NR, c, ct, ldc, m, n, alpha, beta);
}

static const at_gemm_blocked gemm_f32_scalar = {
    .name = "scalar", .mr = SCALAR_MR, .nr = SCALAR_NR, .kp = 1, .mc = 32 * SCALAR_MR, .kc = 256,
    .nc = 128 * SCALAR_NR, .pack = at_gemm_pack_portable, .kernel = kernel_scalar,
};

static void dot_portable(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y, at_dtype yt,
                         int64_t ldy, int round, float *out, int64_t ors, int64_t oss)
{
    for (int64_t r = 0; r < R; r++) {
        for (int s = 0; s < S; s++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                float v = load_f32(y, yt, r * ldy + k);
                acc += x[s * ldx + k] * (round ? round_bf16(v) : v);
            }
            out[r * ors + s * oss] = acc;
        }
    }
}

static void axpy_portable(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y, at_dtype yt,
                          int64_t ldy, int round, float *out, int64_t lds)
{
    for (int s = 0; s < S; s++)
        for (int64_t l = 0; l < L; l++) out[s * lds + l] = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        for (int64_t l = 0; l < L; l++) {
            float v = load_f32(y, yt, k * ldy + l);
            if (round) v = round_bf16(v);
            for (int s = 0; s < S; s++) out[s * lds + l] += x[s * ldx + k] * v;
        }
    }
}

static void outer_portable(int64_t R, int64_t L, int K, const float *a, int64_t lda, const float *b, int64_t ldb,
                           void *c, at_dtype ct, int64_t ldc, float alpha, float beta)
{
    for (int64_t i = 0; i < R; i++) {
        for (int64_t j = 0; j < L; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += a[i * lda + k] * b[k * ldb + j];
            float v = alpha * acc;
            if (beta != 0.0f) v += beta * load_f32(c, ct, i * ldc + j);
            store_c(c, ct, i * ldc + j, v);
        }
    }
}

static const at_gemm_small gemm_small_portable = {.dot = dot_portable, .axpy = axpy_portable,
                                                  .outer = outer_portable};

/* ---- choice of kernels ---- */

static const at_gemm_blocked *blocked_engine(int bf16)
{
#if defined(__x86_64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (bf16 && isa >= AT_ISA_AVX512_BF16) return &at_gemm_bf16_avx512bf16;
    if (isa >= AT_ISA_AVX512) return &at_gemm_f32_avx512;
    if (isa >= AT_ISA_AVX2) return &at_gemm_f32_avx2;
#elif defined(__aarch64__)
    if (bf16 && at_cpu_isa_level() >= AT_ISA_NEON_BF16) return &at_gemm_bf16_neon_bf16;
    if (at_cpu_isa_level() >= AT_ISA_NEON) return &at_gemm_f32_neon;
#else
    (void)bf16;
#endif
    return &gemm_f32_scalar;
}

static const at_gemm_small *small_engine(void)
{
#if defined(__x86_64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (isa >= AT_ISA_AVX512_BF16) return &at_gemm_small_avx512bf16;
    if (isa >= AT_ISA_AVX512) return &at_gemm_small_avx512;
    if (isa >= AT_ISA_AVX2) return &at_gemm_small_avx2;
#elif defined(__aarch64__)
    if (at_cpu_isa_level() >= AT_ISA_NEON) return &at_gemm_small_neon;
#endif
    return &gemm_small_portable;
}

/* ---- libraries ----
 * f32 x f32 -> f32 may go to OpenBLAS (cblas_sgemm) or oneDNN (dnnl_sgemm)
 * instead of our kernels: which one runs is measured per class of problem on
 * the machine at hand (gemm_tune.h), or pinned with ANYTUNE_GEMM_F32 /
 * at_cpu_gemm_use_engine. bf16 and f16 inputs always run here: OpenBLAS
 * 0.3.21 as packaged exports no sbgemm, and oneDNN's bf16 matmul needs a
 * primitive per shape. */
#define ENGINE_AUTO (-1)
#define ENGINE_UNREAD (-2)
static int f32_pinned = ENGINE_UNREAD; /* ENGINE_AUTO or an at_gemm_engine_id */

static unsigned engines_built(void)
{
    unsigned m = 1u << AT_GEMM_ANYTUNE;
#ifdef AT_HAVE_OPENBLAS
    m |= 1u << AT_GEMM_OPENBLAS;
#endif
#ifdef AT_HAVE_DNNL
    m |= 1u << AT_GEMM_ONEDNN;
#endif
    return m;
}

/* The engines that may stand in for our kernels at the current ISA level:
 * each library whose kernels need no higher tier (cpu_libs.h). */
static unsigned engines_usable(void)
{
    unsigned m = 1u << AT_GEMM_ANYTUNE;
    int level = (int)at_cpu_isa_level(), blas = at_cpu_openblas_tier(), dnnl = at_cpu_onednn_tier(level);
    if (blas >= 0 && blas <= level) m |= 1u << AT_GEMM_OPENBLAS;
    if (dnnl >= 0 && dnnl <= level) m |= 1u << AT_GEMM_ONEDNN;
    return m & engines_built();
}

/* ENGINE_AUTO or an engine this build has, for a name; -3 when none. */
static int engine_named(const char *v)
{
    if (!v || !*v || !strcmp(v, "auto")) return ENGINE_AUTO;
    if (!strcmp(v, "dnnl")) v = "onednn";
    for (int e = 0; e < AT_GEMM_ENGINES; e++)
        if (!strcmp(v, at_gemm_engine_name((at_gemm_engine_id)e)) && (engines_built() >> e & 1)) return e;
    return -3;
}

static int f32_pin(void)
{
    if (f32_pinned != ENGINE_UNREAD) return f32_pinned;
    const char *v = getenv("ANYTUNE_GEMM_F32");
    f32_pinned = engine_named(v);
    if (f32_pinned == -3) {
        at_log_warn("ANYTUNE_GEMM_F32=%s: not a GEMM engine of this build (auto, anytune, onednn, openblas); "
                    "measuring", v);
        f32_pinned = ENGINE_AUTO;
    }
    return f32_pinned;
}

at_status at_cpu_gemm_use_engine(at_dtype compute, const char *name)
{
    int e = engine_named(name);
    if (compute == AT_F32 && e != -3) {
        f32_pinned = e;
        return AT_OK;
    }
    if (compute == AT_BF16 && e == AT_GEMM_ANYTUNE) return AT_OK;
    return at_error(AT_ERR_UNSUPPORTED, "at_cpu_gemm_use_engine: no %s GEMM engine \"%s\" in this build",
                    at_dtype_name(compute), name ? name : "(null)");
}

/* Runs the f32 problem on library e; returns 0 if it did not. */
static int f32_on_library(at_gemm_engine_id e, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    switch (e) {
#ifdef AT_HAVE_DNNL
    case AT_GEMM_ONEDNN:
        return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) ==
               dnnl_success;
#endif
#ifdef AT_HAVE_OPENBLAS
    case AT_GEMM_OPENBLAS:
        if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
            return 0;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                    (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return 1;
#endif
    default:
        (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
        (void)beta, (void)C, (void)ldc;
        return 0;
    }
}

static const char *ours_name(int bf16)
{
    const at_gemm_blocked *e = blocked_engine(bf16);
#if defined(__x86_64__)
    if (e == &at_gemm_bf16_avx512bf16) return "anytune avx512+bf16";
    if (e == &at_gemm_f32_avx512) return "anytune avx512";
    if (e == &at_gemm_f32_avx2) return "anytune avx2+fma";
#elif defined(__aarch64__)
    if (e == &at_gemm_bf16_neon_bf16) return "anytune neon+bf16";
    if (e == &at_gemm_f32_neon) return "anytune neon";
#endif
    (void)e;
    return "anytune scalar";
}

const char *at_cpu_gemm_engine(at_dtype compute)
{
    if (compute != AT_F32) return ours_name(compute == AT_BF16);
    switch (f32_pin()) {
    case AT_GEMM_ONEDNN: return "oneDNN";
    case AT_GEMM_OPENBLAS: return "OpenBLAS";
    case AT_GEMM_ANYTUNE: return ours_name(0);
    default: break;
    }
    if (!at_gemm_tune_enabled() || engines_usable() == 1u) return ours_name(0);
    /* the engines this build links that run at this level, in the order of at_gemm_engine_id */
    static char buf[128];
    int n = snprintf(buf, sizeof buf, "measured per shape class (%s", ours_name(0));
    for (int e = 0; e < AT_GEMM_ENGINES && n > 0 && (size_t)n < sizeof buf; e++)
        if (e != AT_GEMM_ANYTUNE && (engines_usable() >> e & 1))
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", %s", e == AT_GEMM_ONEDNN ? "oneDNN" : "OpenBLAS");
    if (n > 0 && (size_t)n < sizeof buf) snprintf(buf + n, sizeof buf - (size_t)n, ")");
    return buf;
}

/* ---- working memory ----
 * Packing buffers (and the small path's) are kept per thread between calls:
 * allocating ~1-5 MB afresh each call costs page faults that showed up as a
 * few percent of a mid-size GEMM and as jitter between threads. Each thread
 * keeps at most the largest size it needed; at_cpu_gemm_release_buffers()
 * hands the calling thread's back. */
enum { BUF_PACK, BUF_SMALL, BUF_COUNT };
static _Thread_local void *tl_buf[BUF_COUNT];
static _Thread_local size_t tl_cap[BUF_COUNT];

/* bytes (64-byte aligned) of the calling thread's buffer `slot`; NULL when out of memory. */
static void *thread_buffer(int slot, size_t bytes)
{
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > tl_cap[slot]) {
        at_cpu_thread_buffers_held();
        free(tl_buf[slot]);
        tl_buf[slot] = aligned_alloc(64, bytes);
        tl_cap[slot] = tl_buf[slot] ? bytes : 0;
    }
    return tl_buf[slot];
}

static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static int exit_key_ok;

static void on_thread_exit(void *unused)
{
    (void)unused;
    at_cpu_gemm_release_buffers();
}

static void exit_key_init(void) { exit_key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

void at_cpu_thread_buffers_held(void)
{
    pthread_once(&exit_once, exit_key_init);
    /* a key's destructor runs only for a non-NULL value */
    if (exit_key_ok && !pthread_getspecific(exit_key)) pthread_setspecific(exit_key, &exit_key);
}

void at_cpu_gemm_release_buffers(void)
{
    for (int i = 0; i < BUF_COUNT; i++) {
        free(tl_buf[i]);
        tl_buf[i] = NULL;
        tl_cap[i] = 0;
    }
    at_cpu_qmatmul_release_buffers();
#if defined(__x86_64__)
    if (at_cpu_get_features()->avx512bf16) at_gemm_bf16_release(); /* plain C, safe on any CPU */
#endif
}

/* ---- the problem ---- */

typedef struct {
    int ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const char *A, *B;
    char *C;
    at_dtype at, bt, ct;
    int64_t lda, ldb, ldc;
    int round_a, round_b; /* round that operand to bf16 (compute in bf16) */
    const at_gemm_lowrank *lr; /* added to each tile of C after its last k block; NULL: none */
} problem;

static int threads_for(double flops)
{
    if (omp_in_parallel()) return 1;
    int nt = omp_get_max_threads();
    /* below ~1 MFLOP per thread the fork costs more than it saves */
    int cap = (int)(flops / 1e6);
    if (cap < 1) cap = 1;
    return nt < cap ? nt : cap;
}

/* C = alpha * acc + beta * C over an M x N block; acc[i*ars + j*acs]. */
static void epilogue(const problem *p, const float *acc, int64_t ars, int64_t acs)
{
    size_t ce = esize(p->ct);
    int nt = threads_for(p->M * p->N * 8.0);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < p->M; i++) {
        void *crow = p->C + (size_t)(i * p->ldc) * ce;
        if (p->ct == AT_F32 && acs == 1) { /* the common case, in a form compilers vectorize */
            float *c = crow;
            const float *a = acc + i * ars;
            if (p->beta == 0.0f)
                for (int64_t j = 0; j < p->N; j++) c[j] = p->alpha * a[j];
            else
                for (int64_t j = 0; j < p->N; j++) c[j] = p->alpha * a[j] + p->beta * c[j];
            continue;
        }
        for (int64_t j = 0; j < p->N; j++) {
            float v = p->alpha * acc[i * ars + j * acs];
            if (p->beta != 0.0f) v += p->beta * load_f32(crow, p->ct, j);
            store_c(crow, p->ct, j, v);
        }
    }
}

/* ---- small path ---- */

/* 'A' when op(A) is the tiny operand, 'B' when op(B) is, 0 when neither. */
static int small_side(const problem *p)
{
    int a_dot = p->tb, b_dot = !p->ta; /* does the big operand run along k? */
    int a_ok = p->M <= (a_dot ? SMALL_DOT : SMALL_AXPY);
    int b_ok = p->N <= (b_dot ? SMALL_DOT : SMALL_AXPY);
    if (a_ok && (!b_ok || p->M <= p->N)) return 'A';
    return b_ok ? 'B' : 0;
}

/* Returns 0 when a buffer could not be allocated (the caller falls back). */
static int gemm_small(const problem *p)
{
    const at_gemm_small *e = small_engine();
    int a_small = small_side(p) == 'A';
    int64_t S = a_small ? p->M : p->N, K = p->K;
    int64_t ldx = (K + 15) / 16 * 16, spad = (S + AT_GEMM_SMALL_PAD - 1) / AT_GEMM_SMALL_PAD * AT_GEMM_SMALL_PAD;
    size_t xbytes = (size_t)(spad * ldx) * sizeof(float);
    char *buf = thread_buffer(BUF_SMALL, xbytes + sizeof(float) * (size_t)(p->M * p->N));
    if (!buf) return 0;
    float *x = (float *)buf, *out = (float *)(buf + xbytes);
    memset(x + S * ldx, 0, (size_t)((spad - S) * ldx) * sizeof(float)); /* rows past S */
    /* the tiny operand as x[s][k]: rows of op(A), or columns of op(B). That
     * is one f32 panel of ldx lanes (k) by S values (s), so the packing
     * routine of the f32 kernels makes it. */
    int round_x = a_small ? p->round_a : p->round_b;
    const char *xs = a_small ? p->A : p->B;
    at_dtype xt = a_small ? p->at : p->bt;
    int64_t ldxs = a_small ? p->lda : p->ldb;
    int k_along_row = a_small ? !p->ta : p->tb; /* source rows run along k */
    blocked_engine(0)->pack(x, xs, xt, k_along_row ? 1 : ldxs, k_along_row ? ldxs : 1, (int)ldx, K, S, round_x);
    const char *y = a_small ? p->B : p->A;
    at_dtype yt = a_small ? p->bt : p->at;
    int64_t ldy = a_small ? p->ldb : p->lda;
    int round_y = a_small ? p->round_b : p->round_a;
    size_t ye = esize(yt);
    /* y along k (dot) or along the big dimension (axpy)? */
    int dot = a_small ? p->tb : !p->ta;
    int64_t big = a_small ? p->N : p->M;
    /* one thread or all: by measurement (base/threads.h), per layout, dtype
     * of y, S and size; each value of out is computed the same either way */
    double ybytes = (double)big * (double)K * (double)ye;
    unsigned key = at_par_key((unsigned)(dot + 2 * (yt == AT_F32 ? 0 : yt == AT_BF16 ? 1 : 2) +
                                         6 * (S == 1 ? 0 : S <= 4 ? 1 : 2)), ybytes);
    int timed = !omp_in_parallel() && ybytes >= PAR_MIN_BYTES;
    int nt = timed ? at_par_threads(key, omp_get_max_threads()) : 1;
    double t0 = timed ? at_now_seconds() : 0;
    /* out[i*ars + j*acs] = (op(A) op(B))[i][j] */
    int64_t ars, acs;
    if (dot) {
        /* out[r*ors + s*oss]: r runs over the big dimension */
        int64_t ors = a_small ? 1 : S, oss = a_small ? p->N : 1;
        ars = a_small ? oss : ors;
        acs = a_small ? ors : oss;
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            int64_t r0 = big * t / n, r1 = big * (t + 1) / n;
            if (r1 > r0)
                e->dot((int)S, K, x, ldx, r1 - r0, y + (size_t)(r0 * ldy) * ye, yt, ldy, round_y, out + r0 * ors,
                       ors, oss);
        }
    } else {
        /* out[s*lds + l]: l runs over the big dimension */
        int64_t lds = big;
        ars = a_small ? lds : 1;
        acs = a_small ? 1 : lds;
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            int64_t chunks = (big + 63) / 64;
            int64_t l0 = chunks * t / n * 64, l1 = chunks * (t + 1) / n * 64;
            if (l1 > big) l1 = big;
            if (l1 > l0)
                e->axpy((int)S, K, x, ldx, l1 - l0, y + (size_t)l0 * ye, yt, ldy, round_y, out + l0, lds);
        }
    }
    if (timed) at_par_record(key, nt, at_now_seconds() - t0);
    epilogue(p, out, ars, acs);
    return 1;
}

/* ---- blocked path ---- */

static void lowrank_portable(float *c, int64_t ldc, int m, int n, const float *u, int64_t ldu, const float *vt,
                             int64_t ldvt, int r);
static at_gemm_lowrank_fn lowrank_fn(void);

/* The plain triple loop, used when packing buffers cannot be allocated (with
 * the low-rank term, p->lr, after it). */
static void reference_range(const problem *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    for (int64_t i = m0; i < m1; i++) {
        for (int64_t j = n0; j < n1; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < p->K; k++) {
                float a = load_f32(p->A, p->at, p->ta ? k * p->lda + i : i * p->lda + k);
                float b = load_f32(p->B, p->bt, p->tb ? j * p->ldb + k : k * p->ldb + j);
                if (p->round_a) a = round_bf16(a);
                if (p->round_b) b = round_bf16(b);
                acc += a * b;
            }
            float v = p->alpha * acc;
            if (p->beta != 0.0f) v += p->beta * load_f32(p->C, p->ct, i * p->ldc + j);
            store_c(p->C, p->ct, i * p->ldc + j, v);
        }
    }
    const at_gemm_lowrank *lr = p->lr;
    for (int64_t i = m0; lr && i < m1; i++)
        lowrank_fn()((float *)p->C + i * p->ldc + n0, p->ldc, 1, (int)(n1 - n0), lr->u + i * lr->ldu, lr->ldu,
                     lr->vt + n0, lr->ldvt, lr->r);
}

/* Strides of op(A) and op(B) as panels: element (x, k) at x*sx + k*sk. */
#define A_SX(p) ((p)->ta ? 1 : (p)->lda)
#define A_SK(p) ((p)->ta ? (p)->lda : 1)
#define B_SX(p) ((p)->tb ? (p)->ldb : 1)
#define B_SK(p) ((p)->tb ? 1 : (p)->ldb)

static size_t panel_bytes(const at_gemm_blocked *e, int w, int64_t kb)
{
    return (size_t)((kb + e->kp - 1) / e->kp * e->kp * w) * at_gemm_panel_esize(e);
}

/* Packs lanes [x0, x0 + n) x k [pc, pc + kb) of op(A) (or op(B)) into panels at dst. */
static void pack_a(const at_gemm_blocked *e, const problem *p, char *dst, int64_t x0, int64_t n, int64_t pc,
                   int64_t kb)
{
    e->pack(dst, p->A + (size_t)(x0 * A_SX(p) + pc * A_SK(p)) * esize(p->at), p->at, A_SX(p), A_SK(p), e->mr, n, kb,
            p->round_a);
}

static void pack_b(const at_gemm_blocked *e, const problem *p, char *dst, int64_t x0, int64_t n, int64_t pc,
                   int64_t kb)
{
    e->pack(dst, p->B + (size_t)(x0 * B_SX(p) + pc * B_SK(p)) * esize(p->bt), p->bt, B_SX(p), B_SK(p), e->nr, n, kb,
            p->round_b);
}

/* The step that cuts total into equal blocks of at most max (a multiple of
 * unit): a remainder block of a few rows would stream a whole B block from
 * L3 for little work. */
static int64_t block_step(int64_t total, int64_t max, int64_t unit)
{
    if (total <= max) return total > 0 ? total : 1;
    int64_t n = (total + max - 1) / max, len = (total + n - 1) / n;
    len = (len + unit - 1) / unit * unit;
    return len < max ? len : max;
}

/* The low-rank term's arithmetic, one element at a time, as the ISA files'
 * vector versions: t = Σ_k fma(u_k, vt_k, t) from 0 in k order, then c + t.
 * Summed apart from C, the term is rounded at its own magnitude and C once: added into C one product at a time it took r roundings at C's
 * magnitude, a few ulps of C that a tiny model amplified (1-ulp noise in
 * its projections moved its loss by 1e-4). */
static void lowrank_portable(float *c, int64_t ldc, int m, int n, const float *u, int64_t ldu, const float *vt,
                             int64_t ldvt, int r)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float t = 0.0f;
            for (int k = 0; k < r; k++) t = fmaf(u[i * ldu + k], vt[k * ldvt + j], t);
            c[i * ldc + j] += t;
        }
}

/* The low-rank tile function of the current ISA level: the one every path
 * uses, whether the term goes into the product's tiles or is added after
 * it, so that an element's value does not depend on which the problem's
 * size picked (a batch split over 2 ranks matches 1: test_mpi). */
static at_gemm_lowrank_fn lowrank_fn(void)
{
    const at_gemm_blocked *e = blocked_engine(0);
    return e->lowrank ? e->lowrank : lowrank_portable;
}

/* C (f32) += the low-rank term, in blocks of rows over the threads. */
static void lowrank_pass(const problem *p, const at_gemm_lowrank *lr)
{
    at_gemm_lowrank_fn f = lowrank_fn();
    int nt = threads_for(2.0 * p->M * p->N * lr->r);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < p->M; i += 16) {
        int m = p->M - i < 16 ? (int)(p->M - i) : 16;
        f((float *)p->C + i * p->ldc, p->ldc, m, (int)p->N, lr->u + i * lr->ldu, lr->ldu, lr->vt, lr->ldvt, lr->r);
    }
}

/* C[ic.., jc..] (mb x nb) += the packed A block times the packed B block;
 * at the last k block (last) the low-rank term too, each tile while the
 * kernel has just written it. */
static void multiply_blocks(const at_gemm_blocked *e, const problem *p, int64_t ic, int64_t mb, int64_t jc,
                            int64_t nb, int64_t kb, const char *abuf, const char *bbuf, float beta, int last)
{
    const at_gemm_lowrank *lr = last ? p->lr : NULL;
    at_gemm_lowrank_fn lowrank = lr ? lowrank_fn() : NULL;
    size_t ce = esize(p->ct), apanel = panel_bytes(e, e->mr, kb), bpanel = panel_bytes(e, e->nr, kb);
    for (int64_t jr = 0; jr < nb; jr += e->nr) {
        int nv = nb - jr < e->nr ? (int)(nb - jr) : e->nr;
        for (int64_t ir = 0; ir < mb; ir += e->mr) {
            int mv = mb - ir < e->mr ? (int)(mb - ir) : e->mr;
            char *c = p->C + (size_t)((ic + ir) * p->ldc + jc + jr) * ce;
            e->kernel(kb, abuf + (ir / e->mr) * apanel, bbuf + (jr / e->nr) * bpanel, c, p->ct, p->ldc, mv, nv,
                      p->alpha, beta);
            if (lr)
                lowrank((float *)c, p->ldc, mv, nv, lr->u + (ic + ir) * lr->ldu, lr->ldu, lr->vt + jc + jr, lr->ldvt,
                        lr->r);
        }
    }
}

/* ---- outer-product path (K <= AT_GEMM_OUTER_K; gemm_kernels.h) ---- */

#define OUTER_MB 192 /* rows of op(A) converted at a time: at most 192 x 64 f32, 48 KiB */

/* C's rows [m0, m1) x columns [n0, n1) on one thread: op(B)'s columns as
 * b[k][j] once, op(A) OUTER_MB rows at a time as a[i][k], then the
 * primitive over chunks of lanes whose K rows of b fit in 32 KiB. */
static void outer_range(const at_gemm_small *e, const problem *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    const at_gemm_pack_fn pack = blocked_engine(0)->pack;
    int K = (int)p->K;
    int64_t nb = n1 - n0, ldb = (nb + AT_GEMM_OUTER_PAD - 1) / AT_GEMM_OUTER_PAD * AT_GEMM_OUTER_PAD;
    int64_t mb = m1 - m0 < OUTER_MB ? m1 - m0 : OUTER_MB;
    int64_t lc = 8192 / K / AT_GEMM_OUTER_PAD * AT_GEMM_OUTER_PAD;
    if (lc < AT_GEMM_OUTER_PAD) lc = AT_GEMM_OUTER_PAD;
    size_t bbytes = (size_t)(K * ldb) * sizeof(float), ce = esize(p->ct);
    char *buf = thread_buffer(BUF_SMALL, bbytes + (size_t)(mb * K) * sizeof(float));
    if (!buf) {
        reference_range(p, m0, m1, n0, n1);
        return;
    }
    float *b = (float *)buf, *a = (float *)(buf + bbytes);
    /* element (x, k) of a panel: b's lanes are op(B)'s columns, a's lanes op(A)'s k */
    pack(b, p->B + (size_t)(n0 * B_SX(p)) * esize(p->bt), p->bt, B_SX(p), B_SK(p), (int)ldb, nb, K, p->round_b);
    for (int64_t ic = m0; ic < m1; ic += mb) {
        int64_t rows = m1 - ic < mb ? m1 - ic : mb;
        pack(a, p->A + (size_t)(ic * A_SX(p)) * esize(p->at), p->at, A_SK(p), A_SX(p), K, K, rows, p->round_a);
        for (int64_t l0 = 0; l0 < nb; l0 += lc)
            e->outer(rows, nb - l0 < lc ? nb - l0 : lc, K, a, K, b + l0, ldb,
                     p->C + (size_t)(ic * p->ldc + n0 + l0) * ce, p->ct, p->ldc, p->alpha, p->beta);
    }
}

/* Each tile of C is written once, with all of K. Threads split the columns
 * when there are more of them than rows (each converts its columns of op(B)
 * and all of op(A), the smaller), else the rows; no barrier inside. One
 * thread or all by measurement, as the small path: at LoRA's sizes (512x896
 * at K 8 is ~0.1 ms of stores on one core) waking the other thread, or
 * waiting for it when another process has its core, can cost more than half
 * the work (2 threads ran at 0.2-0.3x of 1 on a busy 2-core Zen 5). Each
 * value is computed the same way whichever thread takes it. */
static void gemm_outer(const at_gemm_small *e, const problem *p)
{
    double cbytes = (double)p->M * (double)p->N * (double)esize(p->ct);
    unsigned key = at_par_key(30u + (p->K <= 16 ? 0u : 1u) + 2u * (p->ct == AT_BF16), cbytes);
    int many = threads_for(2.0 * p->M * p->N * p->K);
    int timed = many > 1 && cbytes >= PAR_MIN_BYTES;
    int nt = timed ? at_par_threads(key, many) : 1;
    double t0 = timed ? at_now_seconds() : 0;
    int by_cols = p->N >= p->M && p->N >= (int64_t)AT_GEMM_OUTER_PAD * nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t m0 = 0, m1 = p->M, n0 = 0, n1 = p->N;
        if (by_cols) {
            int64_t units = (p->N + AT_GEMM_OUTER_PAD - 1) / AT_GEMM_OUTER_PAD;
            n0 = units * t / n * AT_GEMM_OUTER_PAD;
            n1 = units * (t + 1) / n * AT_GEMM_OUTER_PAD;
            if (n1 > p->N) n1 = p->N;
        } else {
            m0 = p->M * t / n;
            m1 = p->M * (t + 1) / n;
        }
        if (m1 > m0 && n1 > n0) outer_range(e, p, m0, m1, n0, n1);
    }
    if (timed) at_par_record(key, nt, at_now_seconds() - t0);
}

/* The rows [m0, m1) x columns [n0, n1) of C, on one thread, with its own
 * packing buffers. With astride > 0, abuf holds the packed blocks of all the
 * thread's rows for one k block, astride bytes apart: each is packed at the
 * first column block and reused by the others (a wide C, as LoRA's up
 * projection or the lm_head, repacked the same rows of A once per column
 * block: 3 to 38 times). With astride 0, abuf holds one block, packed
 * before each use. */
static void blocked_range(const at_gemm_blocked *e, const problem *p, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1, char *abuf, size_t astride, char *bbuf)
{
    int64_t ns = block_step(n1 - n0, e->nc, e->nr), ks = block_step(p->K, e->kc, e->kp);
    int64_t ms = block_step(m1 - m0, e->mc, e->mr);
    for (int64_t pc = 0; pc < p->K; pc += ks) {
        int64_t kb = p->K - pc < ks ? p->K - pc : ks;
        for (int64_t jc = n0; jc < n1; jc += ns) {
            int64_t nb = n1 - jc < ns ? n1 - jc : ns;
            pack_b(e, p, bbuf, jc, nb, pc, kb);
            for (int64_t ic = m0; ic < m1; ic += ms) {
                int64_t mb = m1 - ic < ms ? m1 - ic : ms;
                char *ab = abuf + (size_t)((ic - m0) / ms) * astride;
                if (!astride || jc == n0) pack_a(e, p, ab, ic, mb, pc, kb);
                multiply_blocks(e, p, ic, mb, jc, nb, kb, ab, bbuf, pc == 0 ? p->beta : 1.0f, pc + kb >= p->K);
            }
        }
    }
}

/* The most a thread's packed rows of A may take to be packed once for all
 * column blocks (blocked_range): 8 MB, 4096 f32 rows at AVX-512's kc. */
#define A_WHOLE_MAX ((size_t)8 << 20)

/* Threads own disjoint rectangles of C and pack what they need themselves:
 * no barrier inside, so a thread that the OS preempts delays only its own
 * part. (Packing the shared operand cooperatively saved a few percent on an
 * idle machine, but its two barriers per block made every time slice lost
 * to another process a stall for both threads: 30-40% slower under load.)
 * The grid tm x tn is the one that packs the fewest values in total: each
 * column of threads packs all its rows of A, each row of threads its
 * columns of B. */
static void gemm_blocked(const at_gemm_blocked *e, const problem *p)
{
    int64_t tiles_m = (p->M + e->mr - 1) / e->mr, tiles_n = (p->N + e->nr - 1) / e->nr;
    int nt = threads_for(2.0 * p->M * p->N * p->K);
    int tm = 1, tn = 1;
    for (; nt > 1; nt--) {
        double best = -1;
        for (int a = 1; a <= nt; a++) {
            if (nt % a || a > tiles_m || nt / a > tiles_n) continue;
            double cost = (double)(nt / a) * p->M * p->K + (double)a * p->K * p->N;
            if (best < 0 || cost < best) {
                best = cost;
                tm = a;
                tn = nt / a;
            }
        }
        if (best >= 0) break;
    }
    int64_t kcb = p->K < e->kc ? p->K : e->kc;
#pragma omp parallel num_threads(tm * tn) if (tm * tn > 1)
    {
        int t = omp_get_thread_num();
        int ti = t / tn, tj = t % tn;
        int64_t m0 = tiles_m * ti / tm * e->mr, m1 = tiles_m * (ti + 1) / tm * e->mr;
        int64_t n0 = tiles_n * tj / tn * e->nr, n1 = tiles_n * (tj + 1) / tn * e->nr;
        if (m1 > p->M) m1 = p->M;
        if (n1 > p->N) n1 = p->N;
        if (m1 > m0 && n1 > n0) {
            int64_t ms = block_step(m1 - m0, e->mc, e->mr), ncb = n1 - n0 < e->nc ? n1 - n0 : e->nc;
            size_t ablk = panel_bytes(e, e->mr, kcb) * (size_t)((ms + e->mr - 1) / e->mr);
            size_t bblk = panel_bytes(e, e->nr, kcb) * (size_t)((ncb + e->nr - 1) / e->nr);
            ablk = (ablk + 63) / 64 * 64;
            /* all the rows' blocks where there is more than one column block to reuse them */
            size_t awhole = ablk * (size_t)((m1 - m0 + ms - 1) / ms);
            int whole = n1 - n0 > ncb && awhole <= A_WHOLE_MAX;
            size_t abytes = whole ? awhole : ablk;
            char *buf = thread_buffer(BUF_PACK, abytes + bblk);
            if (buf) blocked_range(e, p, m0, m1, n0, n1, buf, whole ? ablk : 0, buf + abytes);
            else reference_range(p, m0, m1, n0, n1);
        }
    }
}

/* kc follows L1d and the packed block of A (mc x kc values) L2, each in
 * proportion to the caches e was measured on (l1_ref, l2_ref), only where
 * this CPU's are smaller: blocks larger than the measured ones were not
 * measured. kc is a multiple of 16 (kp divides it), at least 64; mc a
 * multiple of mr, between mr and 4 x e->mc (it grows where only kc was
 * cut, so that the block of A keeps its share of L2). Scaling kc with L1d
 * is a proxy for the whole hierarchy: on the cores measured, a smaller L1d
 * came with a smaller L2 per core or a slower L2, where the kc x nr panel
 * of B that the microkernel streams (128 KiB at AVX-512's kc 1024) should
 * shrink too. */
at_gemm_blocked at_gemm_sized_for_caches(const at_gemm_blocked *e, long l1d_bytes, long l2_bytes)
{
    at_gemm_blocked s = *e;
    long l1 = e->l1_ref * 1024L, l2 = e->l2_ref * 1024L;
    if (l1 > 0 && l1d_bytes > 0 && l1d_bytes < l1) {
        int64_t kc = (int64_t)e->kc * l1d_bytes / l1 / 16 * 16; /* kp divides 16 */
        s.kc = kc < 64 ? 64 : (int)kc;
    }
    int64_t abytes = (int64_t)e->mc * e->kc; /* in values */
    if (l2 > 0 && l2_bytes > 0 && l2_bytes < l2) abytes = abytes * l2_bytes / l2;
    int64_t mc = abytes / s.kc / e->mr * e->mr;
    s.mc = mc < e->mr ? e->mr : mc > e->mc * 4 ? e->mc * 4 : (int)mc;
    return s;
}

/* The problem on our kernels (arguments checked, K > 0, alpha != 0). With
 * a low-rank term (pp->lr) returns 1 where it added it (the blocked path
 * into an f32 C), else 0 and the caller adds it. */
static int run_ours(problem *pp)
{
    problem p = *pp;
    const at_gemm_lowrank *lr = p.lr;
    p.lr = NULL;
    int64_t M = p.M, N = p.N, K = p.K;
    int bf16 = (p.at == AT_BF16 || p.bt == AT_BF16) && at_cpu_fast_bf16(); /* the compute format: gemm.h */
    p.round_a = bf16 && p.at != AT_BF16;
    p.round_b = bf16 && p.bt != AT_BF16;

    if (small_side(&p) && gemm_small(&p)) return 0;
    const at_gemm_small *se = small_engine();
    /* Not where bf16 runs natively (vdpbf16ps, BFMMLA): there the small and
     * blocked paths sum pairs in bf16 hardware, and a product must give the
     * same values whichever path its batch's size picks (training on 2
     * ranks matches 1: test_mpi) */
    if (K <= AT_GEMM_OUTER_K && se->outer && blocked_engine(bf16)->kp == 1) {
        gemm_outer(se, &p);
        return 0;
    }

    const at_cpu_features *f = at_cpu_get_features();
    const at_gemm_blocked sized = at_gemm_sized_for_caches(blocked_engine(bf16), f->l1d_bytes, f->l2_bytes),
                          *e = &sized;
    if (p.ct == AT_BF16 && K > e->kc) {
        /* accumulating across k blocks in a bf16 C would round each partial
         * sum: accumulate in an f32 copy instead and round once */
        float *tmp = malloc(sizeof(float) * (size_t)(M * N));
        if (tmp) {
            problem q = p;
            q.C = (char *)tmp;
            q.ct = AT_F32;
            q.ldc = N;
            q.beta = 0.0f;
            gemm_blocked(e, &q);
            p.alpha = 1.0f;
            epilogue(&p, tmp, N, 1);
            free(tmp);
            return 0;
        }
        reference_range(&p, 0, M, 0, N);
        return 0;
    }
    if (p.ct == AT_F32) p.lr = lr;
    gemm_blocked(e, &p);
    return p.lr != NULL;
}

/* The calibration's runner (gemm_tune.h): packed f32 operands, alpha 1, beta 0. */
static int tune_run(at_gemm_engine_id e, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                    const float *B, float *C)
{
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    if (e != AT_GEMM_ANYTUNE) return f32_on_library(e, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
    problem p = {
        .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = 0.0f, .A = (const char *)A,
        .B = (const char *)B, .C = (char *)C, .at = AT_F32, .bt = AT_F32, .ct = AT_F32, .lda = lda, .ldb = ldb,
        .ldc = N,
    };
    run_ours(&p);
    return 1;
}

/* The engine for an f32 x f32 -> f32 problem: pinned, or measured per class. */
static at_gemm_engine_id f32_engine(int ta, int tb, int64_t M, int64_t N, int64_t K)
{
    int pin = f32_pin();
    if (pin >= 0) return (at_gemm_engine_id)pin;
    unsigned usable = engines_usable();
    if (usable == 1u || !at_gemm_tune_enabled()) return AT_GEMM_ANYTUNE;
    return at_gemm_tune_engine(at_gemm_tune_class(ta, tb, M, N, K), usable, tune_run);
}

int at_cpu_gemm_tune_all(void)
{
    unsigned usable = engines_usable();
    if (f32_pin() != ENGINE_AUTO || usable == 1u || !at_gemm_tune_enabled()) return 0;
    for (int c = 0; c < AT_GEMM_CLASSES; c++) (void)at_gemm_tune_engine(c, usable, tune_run);
    return 1;
}

/* ---- entry points ---- */

static int supported_input(at_dtype t) { return t == AT_F32 || t == AT_BF16 || t == AT_F16; }

/* at_cpu_gemm_checked; with libraries 0 on our kernels only; with lr, plus
 * the low-rank term (at_cpu_gemm_lowrank). */
static at_status gemm_entry(int libraries, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb,
                            float beta, void *C, at_dtype c_type, int64_t ldc, const at_gemm_lowrank *lr)
{
    if (!supported_input(a_type) || !supported_input(b_type) || (c_type != AT_F32 && c_type != AT_BF16))
        return at_error(AT_ERR_INVALID, "at_cpu_gemm: unsupported dtypes A %s, B %s, C %s (A and B: f32, bf16, f16; "
                        "C: f32, bf16)", at_dtype_name(a_type), at_dtype_name(b_type), at_dtype_name(c_type));
    if (M < 0 || N < 0 || K < 0)
        return at_error(AT_ERR_INVALID, "at_cpu_gemm: negative size M=%lld N=%lld K=%lld", (long long)M,
                        (long long)N, (long long)K);
    if (M == 0 || N == 0) return AT_OK;
    int64_t min_lda = trans_a ? M : K, min_ldb = trans_b ? K : N;
    if (ldc < N || (K > 0 && (lda < min_lda || ldb < min_ldb)))
        return at_error(AT_ERR_INVALID, "at_cpu_gemm: leading dimension too small: lda=%lld (needs %lld), "
                        "ldb=%lld (needs %lld), ldc=%lld (needs %lld)", (long long)lda, (long long)min_lda,
                        (long long)ldb, (long long)min_ldb, (long long)ldc, (long long)N);
    if (!C || (K > 0 && alpha != 0.0f && (!A || !B)))
        return at_error(AT_ERR_INVALID, "at_cpu_gemm: NULL matrix (A %p, B %p, C %p)", A, B, C);

    problem p = {
        .ta = !!trans_a, .tb = !!trans_b, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
        .A = A, .B = B, .C = C, .at = a_type, .bt = b_type, .ct = c_type, .lda = lda, .ldb = ldb, .ldc = ldc,
    };
    int added = 0;
    if (K == 0 || alpha == 0.0f) { /* C = beta * C; A and B are not read */
        const float zero = 0.0f;
        p.alpha = 0.0f;
        if (beta != 1.0f) epilogue(&p, &zero, 0, 0);
    } else {
        int done = 0;
        if (libraries && a_type == AT_F32 && b_type == AT_F32 && c_type == AT_F32) {
            at_gemm_engine_id e = f32_engine(p.ta, p.tb, M, N, K);
            done = e != AT_GEMM_ANYTUNE && f32_on_library(e, p.ta, p.tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        }
        if (!done) {
            p.lr = lr;
            added = run_ours(&p);
        }
    }
    if (!lr || added) return AT_OK;
    if (c_type == AT_F32) {
        lowrank_pass(&p, lr);
        return AT_OK;
    }
    return gemm_entry(libraries, 0, 0, M, N, lr->r, 1.0f, lr->u, AT_F32, lr->ldu, lr->vt, AT_F32, lr->ldvt, 1.0f, C,
                      c_type, ldc, NULL);
}

at_status at_cpu_gemm_checked(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                              at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta,
                              void *C, at_dtype c_type, int64_t ldc)
{
    return gemm_entry(1, trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc,
                      NULL);
}

at_status at_cpu_gemm_ours(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                           at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta,
                           void *C, at_dtype c_type, int64_t ldc)
{
    return gemm_entry(0, trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc,
                      NULL);
}

at_status at_cpu_gemm_lowrank(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                              at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta,
                              void *C, at_dtype c_type, int64_t ldc, const float *u, int64_t ldu, const float *v,
                              int64_t ldv, int r, float s)
{
    if (r < 0 || (r > 0 && (!u || !v || ldu < r || ldv < r)))
        return at_error(AT_ERR_INVALID, "at_cpu_gemm_lowrank: rank %d with u %p (ldu %lld), v %p (ldv %lld)", r,
                        (const void *)u, (long long)ldu, (const void *)v, (long long)ldv);
    if (r == 0 || s == 0.0f || M == 0 || N == 0)
        return at_cpu_gemm_checked(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type,
                                   ldc);
    /* s·vᵀ [r][N]: the tiles take a row of it per k (s folded in once: a
     * tile at LoRA's ranks holds these rows in registers and takes u as it is) */
    float *vt = malloc(sizeof(float) * (size_t)r * (size_t)N);
    if (!vt) { /* the two products */
        AT_TRY(at_cpu_gemm_checked(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type,
                                   ldc));
        return at_cpu_gemm_checked(0, 1, M, N, r, s, u, AT_F32, ldu, v, AT_F32, ldv, 1.0f, C, c_type, ldc);
    }
    for (int64_t j = 0; j < N; j++)
        for (int k = 0; k < r; k++) vt[k * N + j] = s * v[j * ldv + k];
    at_gemm_lowrank lr = {u, vt, ldu, N, r};
    at_status st = gemm_entry(1, trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type,
                              ldc, &lr);
    free(vt);
    return st;
}

void at_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                 at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta, void *C,
                 at_dtype c_type, int64_t ldc)
{
    (void)at_cpu_gemm_checked(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type,
                              ldc);
}

/* ---- small products in bf16 (attention's tiles) ---- */

#define ACC_B 64 /* block of the rounded copies: 2 x 16 KiB of stack */

int at_cpu_gemm_acc_bf16_native(void)
{
#if defined(__x86_64__)
    return at_cpu_isa_level() >= AT_ISA_AVX512_BF16;
#else
    return 0;
#endif
}

void at_cpu_gemm_acc_bf16(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                          int64_t ldb, int64_t M, int64_t N, int64_t K)
{
#if defined(__x86_64__)
    if (at_cpu_gemm_acc_bf16_native()) {
        at_gemm_acc_bf16_avx512bf16(c, ldc, a, a_rs, a_cs, b, ldb, M, N, K);
        return;
    }
#endif
    /* elsewhere the f32 kernel on copies rounded to bf16: the same products */
    const at_cpu_simd *v = at_cpu_simd_get();
    float ar[ACC_B * ACC_B], br[ACC_B * ACC_B];
    for (int64_t k0 = 0; k0 < K; k0 += ACC_B) {
        int64_t kb = K - k0 < ACC_B ? K - k0 : ACC_B;
        for (int64_t n0 = 0; n0 < N; n0 += ACC_B) {
            int64_t nb = N - n0 < ACC_B ? N - n0 : ACC_B;
            for (int64_t k = 0; k < kb; k++) at_cpu_round_bf16(v, br + k * ACC_B, b + (k0 + k) * ldb + n0, nb);
            for (int64_t m0 = 0; m0 < M; m0 += ACC_B) {
                int64_t mb = M - m0 < ACC_B ? M - m0 : ACC_B;
                const float *as = a + m0 * a_rs + k0 * a_cs;
                if (a_cs == 1) { /* ar[m][k] */
                    for (int64_t m = 0; m < mb; m++) at_cpu_round_bf16(v, ar + m * ACC_B, as + m * a_rs, kb);
                    v->gemm_acc(c + m0 * ldc + n0, ldc, ar, ACC_B, 1, br, ACC_B, mb, nb, kb);
                } else { /* a_rs == 1: ar[k][m] */
                    for (int64_t k = 0; k < kb; k++) at_cpu_round_bf16(v, ar + k * ACC_B, as + k * a_cs, mb);
                    v->gemm_acc(c + m0 * ldc + n0, ldc, ar, 1, ACC_B, br, ACC_B, mb, nb, kb);
                }
            }
        }
    }
}

/* ---- pair panels (gemm.h) ---- */

static uint32_t pair_word(float lo, float hi)
{
    return (uint32_t)at_f32_to_bf16(lo) | (uint32_t)at_f32_to_bf16(hi) << 16;
}

/* Both packers without vdpbf16ps: word [p·ld + l] = (X(l, 2p), X(l, 2p + 1))
 * with X(l, k) = src[l·ls + k·ks], l < lanes, k < nk (gemm.h's zeros past them). */
static void pairs_portable(uint32_t *dst, int64_t ld, const float *src, int64_t ls, int64_t ks, int64_t lanes,
                           int64_t nk)
{
    for (int64_t p = 0; 2 * p < nk; p++)
        for (int64_t l = 0; l < (lanes + 15) / 16 * 16; l++) {
            const float *x = src + l * ls + 2 * p * ks;
            dst[p * ld + l] = l < lanes ? pair_word(x[0], 2 * p + 1 < nk ? x[ks] : 0.0f) : 0;
        }
}

void at_cpu_bf16_pairs_in_rows(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows, int64_t cols)
{
#if defined(__x86_64__)
    if (at_cpu_gemm_acc_bf16_native()) {
        at_gemm_bf16_pairs_in_rows_avx512bf16(dst, ld, src, rs, rows, cols);
        return;
    }
#endif
    pairs_portable(dst, ld, src, rs, 1, rows, cols);
}

void at_cpu_bf16_pairs_of_rows(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows, int64_t cols)
{
#if defined(__x86_64__)
    if (at_cpu_gemm_acc_bf16_native()) {
        at_gemm_bf16_pairs_of_rows_avx512bf16(dst, ld, src, rs, rows, cols);
        return;
    }
#endif
    pairs_portable(dst, ld, src, 1, rs, cols, rows);
}

void at_cpu_gemm_acc_bf16_pairs(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b,
                                int64_t ldb, int64_t M, int64_t N, int64_t kp, int acc)
{
#if defined(__x86_64__)
    if (at_cpu_gemm_acc_bf16_native()) {
        at_gemm_acc_bf16_pairs_avx512bf16(c, ldc, a, lda, b, ldb, M, N, kp, acc);
        return;
    }
#endif
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float s = acc ? c[m * ldc + n] : 0.0f;
            for (int64_t p = 0; p < kp; p++) {
                uint32_t x = a[p * lda + m], y = b[p * ldb + n];
                s += at_bf16_to_f32((uint16_t)x) * at_bf16_to_f32((uint16_t)y) +
                     at_bf16_to_f32((uint16_t)(x >> 16)) * at_bf16_to_f32((uint16_t)(y >> 16));
            }
            c[m * ldc + n] = s;
        }
}
