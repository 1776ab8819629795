/* at_cpu_gemm against a plain double-accumulation loop written here.
 *
 * Reference: ref[i][j] = alpha * sum_k a'(i,k) b'(k,j) + beta * c0[i][j], in
 * double, where a', b' are the inputs as the compute format sees them: when
 * either input is bf16 and the level multiplies bf16 natively, the other is
 * rounded to bf16 first; elsewhere bf16, like f16, is widened exactly
 * (gemm.h). Error is measured relative to the magnitude of the dot
 * product, mag = |alpha| sum_k |a' b'| + |beta c0|:
 *   f32 accumulation:  |got - ref| <= 1e-5 * mag (f32 sums of up to 1000
 *                      terms stay well inside; a wrong or unrounded operand,
 *                      a lost k block or tile would not: bf16 rounding alone
 *                      is 4e-3 relative)
 *   C in bf16:         + 2^-7 |ref| for the rounding of the result (half an
 *                      ulp is up to 2^-8 relative) and of beta C; with a
 *                      low-rank term (at_cpu_gemm_lowrank, two products into
 *                      a bf16 C) + 2^-7 of the first product's result too.
 * The low-rank term adds |s| Σ_k |u v| to mag.
 * Every ISA level available on the machine runs (at_cpu_isa_force), every
 * transpose pair, every dtype triple, odd sizes 1, 3, 17, 63, 65 and a few
 * large ones (1000, and past the cache-block sizes), alpha/beta not in
 * {0, 1}, padded leading dimensions (the padding must stay untouched),
 * beta == 0 with NaN in C, alpha == 0 / K == 0 with NaN in A. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/cpu_features.h"
#include "device/cpu/gemm.h"
#include "device/cpu/gemm_kernels.h"
#include "device/dtype.h"
#include "testing.h"

static unsigned rng_state = 12345;
static float rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f; /* [-1, 1) */
}

static size_t es(at_dtype t) { return t == AT_F32 ? 4 : 2; }

static void put(void *p, at_dtype t, size_t i, float v)
{
    if (t == AT_F32) ((float *)p)[i] = v;
    else if (t == AT_BF16) ((uint16_t *)p)[i] = at_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = at_f32_to_f16(v);
}

static double get(const void *p, at_dtype t, size_t i)
{
    if (t == AT_F32) return ((const float *)p)[i];
    if (t == AT_BF16) return at_bf16_to_f32(((const uint16_t *)p)[i]);
    return at_f16_to_f32(((const uint16_t *)p)[i]);
}

/* The value the compute format multiplies: rounded to bf16 if computing in bf16. */
static double as_computed(const void *p, at_dtype t, size_t i, int bf16)
{
    double v = get(p, t, i);
    if (bf16 && t != AT_BF16) v = at_bf16_to_f32(at_f32_to_bf16((float)v));
    return v;
}

static int printed;
static double worst[2]; /* largest err / tolerance seen, for C f32 and bf16 */

typedef struct {
    int ta, tb;
    int64_t M, N, K;
    at_dtype at, bt, ct;
    float alpha, beta;
    int pad;   /* extra elements per row in lda, ldb, ldc */
    int nan_c; /* fill C with NaN (only where beta == 0) */
} gcase;

/* The case through at_cpu_gemm; r > 0: at_cpu_gemm_lowrank with u [M, r],
 * v [N, r] (rows r + pad apart) and s. */
static void run_lr(const gcase *g, int r, float s)
{
    int64_t M = g->M, N = g->N, K = g->K;
    int64_t lda = (g->ta ? M : K) + g->pad, ldb = (g->tb ? K : N) + g->pad, ldc = N + g->pad;
    int64_t arows = g->ta ? K : M, brows = g->tb ? N : K;
    size_t na = (size_t)(arows * lda), nb = (size_t)(brows * ldb), nc = (size_t)(M * ldc);
    void *A = malloc(na * es(g->at) + 1), *B = malloc(nb * es(g->bt) + 1), *C = malloc(nc * es(g->ct) + 1);
    float *C0 = malloc(nc * sizeof(float) + 1);
    int64_t ldr = r + g->pad;
    float *U = malloc(sizeof(float) * (size_t)(M * ldr) + 1), *V = malloc(sizeof(float) * (size_t)(N * ldr) + 1);
    if (!A || !B || !C || !C0 || !U || !V) {
        CHECK_MSG(0, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < na; i++) put(A, g->at, i, rnd());
    for (size_t i = 0; i < nb; i++) put(B, g->bt, i, rnd());
    for (size_t i = 0; i < nc; i++) {
        int gap = (int64_t)(i % ldc) >= N;
        put(C, g->ct, i, gap ? 1056.0f : g->nan_c && g->beta == 0.0f ? NAN : rnd());
        C0[i] = (float)get(C, g->ct, i);
    }
    for (int64_t i = 0; i < M * ldr; i++) U[i] = rnd();
    for (int64_t i = 0; i < N * ldr; i++) V[i] = rnd();
    if (r)
        CHECK_OK(at_cpu_gemm_lowrank(g->ta, g->tb, M, N, K, g->alpha, A, g->at, lda, B, g->bt, ldb, g->beta, C, g->ct,
                                     ldc, U, ldr, V, ldr, r, s));
    else
        at_cpu_gemm(g->ta, g->tb, M, N, K, g->alpha, A, g->at, lda, B, g->bt, ldb, g->beta, C, g->ct, ldc);

    int bf16 = (g->at == AT_BF16 || g->bt == AT_BF16) && at_cpu_fast_bf16();
    int bad = 0;
    for (int64_t i = 0; i < M && !bad; i++) {
        for (int64_t j = 0; j < ldc; j++) {
            double got = get(C, g->ct, (size_t)(i * ldc + j));
            if (j >= N) { /* padding must not be written */
                if (got != 1056.0) bad = 1;
                continue;
            }
            double dot = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = as_computed(A, g->at, (size_t)(g->ta ? k * lda + i : i * lda + k), bf16);
                double b = as_computed(B, g->bt, (size_t)(g->tb ? j * ldb + k : k * ldb + j), bf16);
                dot += a * b;
                mag += fabs(a * b);
            }
            double c0 = g->beta != 0.0f ? C0[i * ldc + j] : 0.0, lr = 0, lrmag = 0;
            for (int k = 0; k < r; k++) {
                lr += (double)U[i * ldr + k] * V[j * ldr + k];
                lrmag += fabs((double)U[i * ldr + k] * V[j * ldr + k]);
            }
            double ref = g->alpha * dot + g->beta * c0 + s * lr;
            mag = fabs(g->alpha) * mag + fabs(g->beta * c0) + fabs(s) * lrmag;
            double tol = 1e-5 * mag + 1e-30 + (g->ct == AT_BF16 ? fabs(ref) / 128 : 0);
            /* a bf16 C takes the low-rank term in a second product: the first one's result is rounded too */
            if (r && g->ct == AT_BF16) tol += fabs(g->alpha * dot + g->beta * c0) / 128;
            double err = fabs(got - ref);
            if (!(err <= tol)) {
                bad = 1;
                if (printed++ < 10)
                    fprintf(stderr, "  [%lld,%lld] got %.9g want %.9g (err %.3g, tol %.3g)\n", (long long)i,
                            (long long)j, got, ref, err, tol);
                break;
            }
            if (err / tol > worst[g->ct == AT_BF16]) worst[g->ct == AT_BF16] = err / tol;
        }
    }
    CHECK_MSG(!bad, "isa %s ta=%d tb=%d M=%lld N=%lld K=%lld A %s B %s C %s alpha %g beta %g pad %d nan_c %d "
              "rank %d s %g", at_cpu_isa_name(at_cpu_isa_level()), g->ta, g->tb, (long long)M, (long long)N,
              (long long)K, at_dtype_name(g->at), at_dtype_name(g->bt), at_dtype_name(g->ct), g->alpha, g->beta,
              g->pad, g->nan_c, r, (double)s);
done:
    free(U);
    free(V);
    free(A);
    free(B);
    free(C);
    free(C0);
}

static void run(const gcase *g) { run_lr(g, 0, 0.0f); }

static const at_dtype in_types[3] = {AT_F32, AT_BF16, AT_F16};
static const at_dtype out_types[2] = {AT_F32, AT_BF16};

/* Every transpose pair x dtype triple on shapes that cross the tile edges of
 * all kernels, the small path (M or N up to 16, both of its forms, more than
 * 8 tiny rows) and the blocked path. */
static void sweep_dtypes(void)
{
    static const int64_t shp[][3] = {{1, 17, 63}, {3, 65, 17}, {17, 3, 65}, {63, 65, 3}, {65, 63, 17}, {17, 1, 65},
                                     {29, 70, 33}, {13, 40, 70}, {50, 12, 33}};
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 2; c++)
                    for (size_t s = 0; s < sizeof shp / sizeof shp[0]; s++, n++) {
                        gcase g = {t >> 1, t & 1, shp[s][0], shp[s][1], shp[s][2], in_types[a], in_types[b],
                                   out_types[c], n % 3 ? 0.75f : -1.5f, n % 2 ? 0.5f : 0.0f, n % 4 == 1 ? 3 : 0,
                                   n % 4 == 0};
                        run(&g);
                    }
}

/* Every size triple from {1, 3, 17, 63, 65} for f32 and bf16. */
static void sweep_sizes(void)
{
    static const int64_t sz[] = {1, 3, 17, 63, 65};
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 5; j++)
                    for (int k = 0; k < 5; k++, n++) {
                        at_dtype dt = d ? AT_BF16 : AT_F32;
                        gcase g = {t >> 1, t & 1, sz[i], sz[j], sz[k], dt, dt, AT_F32, 1.25f, n % 2 ? -0.5f : 0.0f,
                                   n % 3 == 0 ? 2 : 0, n % 4 == 0};
                        run(&g);
                    }
}

/* On one thread (so that the thread holds every column): past nc (1024 for
 * f32, 2048 for bf16 compute) and past mc (at most 168 for f32 and 224 for
 * bf16 where L1d >= 32 KiB and L2 >= 1 MiB; gemm.c's cache rule grows mc
 * only on smaller caches), the rows of A packed at the first column block
 * serve the others (gemm.c, blocked_range); K past 1024 in the f32 case, so
 * that two k blocks reuse them and accumulate. */
static void packed_a_reuse(void)
{
    gcase c[] = {
        {0, 0, 230, 1100, 1050, AT_F32, AT_F32, AT_F32, 1.0f, 0.5f, 0, 0},
        {0, 1, 230, 2100, 300, AT_BF16, AT_F32, AT_F32, 1.0f, 0.0f, 0, 1},
    };
    int nthreads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) run(&c[i]);
    omp_set_num_threads(nthreads);
}

/* Large shapes: several cache blocks in k, m and n (and 1000 in two dims). */
static void sweep_large(int full)
{
    gcase big[] = {
        {0, 0, 1000, 40, 1000, AT_F32, AT_F32, AT_F32, 0.5f, 0.25f, 1, 0},
        {1, 1, 70, 1000, 600, AT_BF16, AT_BF16, AT_F32, 1.0f, 0.0f, 0, 1},
        {0, 1, 300, 2100, 20, AT_BF16, AT_F32, AT_F32, 1.0f, 1.0f, 0, 0},
        {1, 0, 90, 100, 1100, AT_F32, AT_BF16, AT_BF16, -1.0f, 0.5f, 2, 0}, /* bf16 C over many k blocks */
        {0, 0, 40, 50, 700, AT_F16, AT_F32, AT_BF16, 1.0f, 0.0f, 0, 1},
        {0, 1, 20, 4200, 40, AT_F32, AT_F32, AT_F32, 1.0f, 0.0f, 1, 1},   /* a slice of N past NC */
        {1, 0, 1000, 2100, 10, AT_BF16, AT_BF16, AT_F32, 1.0f, 0.5f, 0, 0}, /* many n blocks, several m blocks */
        /* the small path's axpy form over several lane chunks and k passes
         * (AT_GEMM_AXPY_LC, at_gemm_axpy_kb): decode, and 8 + 1 rows of x */
        {0, 0, 1, 2100, 70, AT_F32, AT_F32, AT_F32, 1.0f, 0.0f, 0, 1},
        {1, 0, 9, 1100, 100, AT_F16, AT_BF16, AT_F32, 1.0f, 0.5f, 1, 0},
        /* f32 past kc (1024), nc and mc on one thread: two blocks of each
         * (at AVX2's mc 72; packed_a_reuse covers every level) */
        {1, 0, 120, 1100, 1100, AT_F32, AT_F32, AT_F32, 0.5f, 0.0f, 0, 1},
    };
    size_t n = sizeof big / sizeof big[0];
    for (size_t i = 0; i < n; i++)
        if (full || i >= 2) run(&big[i]);
}

/* The rule of at_gemm_sized_for_caches (gemm.c): on a core with caches no
 * smaller than the reference ones the blocks stay; kc follows a smaller
 * L1d (multiple of 16, at least 64) and the packed block of A, mc x kc
 * values, a smaller L2 (mc a multiple of mr, between mr and 4 x mc). The
 * figures below are that rule worked by hand for a 14 x 32 kernel measured
 * with kc 1024, mc 112 on 48 KiB / 1 MiB. */
static void cache_blocks(void)
{
    const at_gemm_blocked e = {.name = "t", .mr = 14, .nr = 32, .kp = 1, .mc = 112, .kc = 1024, .nc = 1024,
                               .l1_ref = 48, .l2_ref = 1024};
    static const struct {
        long l1, l2;
        int kc, mc;
    } want[] = {
        {48 << 10, 1 << 20, 1024, 112},  /* the reference core */
        {64 << 10, 2 << 20, 1024, 112},  /* larger: nothing grows */
        {0, 0, 1024, 112},               /* unknown caches */
        {32 << 10, 1 << 20, 672, 168},   /* 1024 x 32/48 = 682 -> 672; 112 x 1024 / 672 = 170 -> 168 */
        {48 << 10, 512 << 10, 1024, 56}, /* half the L2: half the block of A */
        {32 << 10, 512 << 10, 672, 84},  /* both: 57344 values / 672 = 85 -> 84 */
        {1 << 10, 1 << 20, 64, 448},     /* kc at its floor, mc at 4 x 112 */
        {1 << 10, 16 << 10, 64, 28},     /* 114688 x 16/1024 = 1792 values / 64 */
        {48 << 10, 1 << 10, 1024, 14},   /* less than a panel of A: one */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        at_gemm_blocked s = at_gemm_sized_for_caches(&e, want[i].l1, want[i].l2);
        CHECK_MSG(s.kc == want[i].kc && s.mc == want[i].mc && s.nc == e.nc && s.mr == e.mr && s.nr == e.nr,
                  "L1d %ld, L2 %ld: kc %d mc %d nc %d, want kc %d mc %d", want[i].l1, want[i].l2, s.kc, s.mc, s.nc,
                  want[i].kc, want[i].mc);
    }
}

/* alpha == 0 or K == 0: C = beta C without reading A and B (NaN there). */
static void special_scalars(void)
{
    float A[6], B[6], C[4] = {1, 2, 3, 4};
    for (int i = 0; i < 6; i++) A[i] = B[i] = NAN;
    at_cpu_gemm(0, 0, 2, 2, 3, 0.0f, A, AT_F32, 3, B, AT_F32, 2, 0.5f, C, AT_F32, 2);
    CHECK(C[0] == 0.5f && C[1] == 1.0f && C[2] == 1.5f && C[3] == 2.0f);
    at_cpu_gemm(0, 0, 2, 2, 0, 1.0f, A, AT_F32, 1, B, AT_F32, 2, 2.0f, C, AT_F32, 2);
    CHECK(C[0] == 1.0f && C[1] == 2.0f && C[2] == 3.0f && C[3] == 4.0f);
    C[0] = NAN;
    at_cpu_gemm(0, 0, 2, 2, 0, 1.0f, A, AT_F32, 1, B, AT_F32, 2, 0.0f, C, AT_F32, 2);
    CHECK(C[0] == 0.0f && C[3] == 0.0f);
}

static void bad_arguments(void)
{
    float A[4] = {0}, B[4] = {0}, C[4] = {0};
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, 2, 2, 2, 1, A, AT_Q8_0, 2, B, AT_F32, 2, 0, C, AT_F32, 2), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "dtype") != NULL);
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, 2, 2, 2, 1, A, AT_F32, 2, B, AT_F32, 2, 0, C, AT_F16, 2), AT_ERR_INVALID);
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, 2, 2, 2, 1, A, AT_F32, 1, B, AT_F32, 2, 0, C, AT_F32, 2), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "lda=1") != NULL);
    CHECK_FAILS(at_cpu_gemm_checked(1, 1, 2, 3, 2, 1, A, AT_F32, 2, B, AT_F32, 1, 0, C, AT_F32, 3), AT_ERR_INVALID);
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, 2, 2, 2, 1, A, AT_F32, 2, B, AT_F32, 2, 0, C, AT_F32, 1), AT_ERR_INVALID);
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, -1, 2, 2, 1, A, AT_F32, 2, B, AT_F32, 2, 0, C, AT_F32, 2), AT_ERR_INVALID);
    CHECK_FAILS(at_cpu_gemm_checked(0, 0, 2, 2, 2, 1, NULL, AT_F32, 2, B, AT_F32, 2, 0, C, AT_F32, 2),
                AT_ERR_INVALID);
    CHECK_OK(at_cpu_gemm_checked(0, 0, 0, 2, 2, 1, NULL, AT_F32, 2, NULL, AT_F32, 2, 0, NULL, AT_F32, 2));
    /* C untouched by a rejected call */
    C[0] = 7;
    at_cpu_gemm(0, 0, 2, 2, 2, 1, A, AT_I32, 2, B, AT_F32, 2, 0, C, AT_F32, 2);
    CHECK(C[0] == 7);
}

/* The f32 library engines, through the same checks (beta == 0 with NaN in
 * C, padded leading dimensions, every transpose pair). */
static void library_engines(void)
{
    static const char *libs[] = {"onednn", "openblas"};
    for (int i = 0; i < 2; i++) {
        if (at_cpu_gemm_use_engine(AT_F32, libs[i]) != AT_OK) {
            printf("engine %s: not in this build\n", libs[i]);
            continue;
        }
        CHECK(strstr(at_cpu_gemm_engine(AT_F32), "anytune") == NULL);
        worst[0] = worst[1] = 0;
        sweep_dtypes();
        sweep_sizes();
        printf("engine f32 \"%s\": worst err/tol %.3f (C f32)\n", at_cpu_gemm_engine(AT_F32), worst[0]);
    }
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "anytune"));
    CHECK(strstr(at_cpu_gemm_engine(AT_F32), "anytune") != NULL);
    CHECK_FAILS(at_cpu_gemm_use_engine(AT_F32, "cublas"), AT_ERR_UNSUPPORTED);
    CHECK_FAILS(at_cpu_gemm_use_engine(AT_BF16, "openblas"), AT_ERR_UNSUPPORTED);
}

/* at_cpu_gemm_lowrank (C += s·U·Vᵀ besides the product) on each path the
 * product can take: the small path (M or N tiny), the outer path (K tiny),
 * the blocked path where the term goes into the tiles (one k block and
 * several, f32 and bf16 B), a bf16 C (the two products), a library engine;
 * then the property training on several ranks relies on: the term added
 * into the tiles and added after the product (K 0, the unfused pass) give
 * the same bits. */
static void sweep_lowrank(void)
{
    const int64_t sizes[][3] = {{1, 5, 7}, {3, 40, 70}, {100, 70, 8}, {100, 70, 300}, {70, 100, 1100}, {33, 1, 64}};
    for (int si = 0; si < 6; si++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++) {
                at_dtype bt = di == 1 ? AT_BF16 : AT_F32, ct = di == 2 ? AT_BF16 : AT_F32;
                gcase g = {ti & 1, ti >> 1, sizes[si][0], sizes[si][1], sizes[si][2], AT_F32, bt, ct,
                           0.75f, ti == 3 ? 0.0f : 1.0f, si % 2 ? 3 : 0, ti == 3};
                run_lr(&g, si == 2 ? 1 : si == 4 ? 16 : 8, 0.5f);
            }
    /* the product on a library, the term after it */
    if (at_cpu_gemm_use_engine(AT_F32, "openblas") == AT_OK) {
        gcase g = {0, 1, 100, 70, 300, AT_F32, AT_F32, AT_F32, 1.0f, 1.0f, 0, 0};
        run_lr(&g, 8, 2.0f);
    }
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "anytune"));
    /* fused and after the product: the same bits */
    int64_t M = 100, N = 70, K = 300;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *U = malloc(sizeof(float) * M * 8),
          *V = malloc(sizeof(float) * N * 8), *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < M * K; i++) A[i] = rnd();
    for (int64_t i = 0; i < N * K; i++) B[i] = rnd();
    for (int64_t i = 0; i < M * 8; i++) U[i] = rnd();
    for (int64_t i = 0; i < N * 8; i++) V[i] = rnd();
    for (int bt = 0; bt < 2; bt++) {
        at_dtype t = bt ? AT_BF16 : AT_F32;
        void *Bt = B;
        uint16_t *Bb = bt ? malloc(sizeof(uint16_t) * N * K) : NULL;
        if (bt) {
            if (!Bb) {
                CHECK_MSG(0, "out of memory");
                break;
            }
            for (int64_t i = 0; i < N * K; i++) Bb[i] = at_f32_to_bf16(B[i]);
            Bt = Bb;
        }
        CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "anytune"));
        CHECK_OK(at_cpu_gemm_lowrank(0, 1, M, N, K, 1.0f, A, AT_F32, K, Bt, t, K, 0.0f, C1, AT_F32, N, U, 8, V, 8, 8,
                                     2.0f));
        at_cpu_gemm(0, 1, M, N, K, 1.0f, A, AT_F32, K, Bt, t, K, 0.0f, C2, AT_F32, N);
        CHECK_OK(at_cpu_gemm_lowrank(0, 1, M, N, 0, 0.0f, NULL, AT_F32, K, NULL, t, K, 1.0f, C2, AT_F32, N, U, 8, V, 8,
                                     8, 2.0f));
        CHECK_MSG(!memcmp(C1, C2, sizeof(float) * M * N), "isa %s, B %s: the low-rank term in the tiles differs from "
                  "the term added after the product", at_cpu_isa_name(at_cpu_isa_level()), at_dtype_name(t));
        free(Bb);
    }
    free(A);
    free(B);
    free(U);
    free(V);
    free(C1);
    free(C2);
}

/* The f32 engine each level must run (its name names its kernels). */
#if defined(__aarch64__)
static const char *const f32_engine_of[] = {"scalar", "neon", "neon", "neon"};
#else
static const char *const f32_engine_of[] = {"scalar", "avx2", "avx512", "avx512"};
#endif

int main(void)
{
    at_cpu_isa hw = at_cpu_isa_level();
    cache_blocks();
    special_scalars();
    bad_arguments();
    library_engines(); /* ends on our own engine, whatever ANYTUNE_GEMM_F32 says */
    for (int lvl = AT_ISA_SCALAR; lvl <= (int)hw; lvl++) {
        at_cpu_isa_force((at_cpu_isa)lvl);
        CHECK(at_cpu_isa_level() == (at_cpu_isa)lvl);
        /* the engine name follows the level, so each pass really runs its kernels */
        const char *e = at_cpu_gemm_engine(AT_F32);
        CHECK_MSG(strstr(e, f32_engine_of[lvl]) != NULL, "level %s, engine %s", at_cpu_isa_name((at_cpu_isa)lvl), e);
        if (lvl == AT_ISA_TOP) CHECK(strstr(at_cpu_gemm_engine(AT_BF16), "bf16") != NULL);
        worst[0] = worst[1] = 0;
        sweep_dtypes();
        sweep_sizes();
        sweep_large(lvl == (int)hw);
        packed_a_reuse();
        sweep_lowrank();
        printf("isa %-12s engine f32 \"%s\", bf16 \"%s\": worst err/tol %.3f (C f32), %.3f (C bf16)\n",
               at_cpu_isa_name(at_cpu_isa_level()), at_cpu_gemm_engine(AT_F32), at_cpu_gemm_engine(AT_BF16), worst[0],
               worst[1]);
    }
    at_cpu_isa_force(hw);
    /* an odd number of threads: uneven slices, and on a 1-core machine still several */
    int nthreads = omp_get_max_threads();
    omp_set_num_threads(3);
    worst[0] = worst[1] = 0;
    sweep_large(1);
    printf("3 threads: worst err/tol %.3f (C f32), %.3f (C bf16)\n", worst[0], worst[1]);
    omp_set_num_threads(nthreads);
    /* the per-thread buffers can be handed back, and come back */
    at_cpu_gemm_release_buffers();
    sweep_large(0);
    if (hw < AT_ISA_TOP) printf("note: this CPU lacks some ISA levels; those paths were not run\n");
    return at_test_result("test_gemm");
}
