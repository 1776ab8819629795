/* The CPU dropout at every ISA level of this machine gives, bit for bit, the
 * mask and values its definition in ops/ops.h says: element i kept when
 * at_rng_dropout_uniform(seed, counter(i)) >= p (base/rng.c, the scalar hash),
 * counter(i) = offset + i, or offset + (i / run)·pitch + i % run with runs,
 * kept values x[i] · (1 / (1 − p)) in f32, dropped ones +0. Covers the SIMD
 * path's tails (n not a multiple of 16, chunk edges), counters that wrap
 * past 2⁶⁴, in-place calls and probabilities on the 2⁻²⁴ grid of the hash,
 * where a threshold off by one would show. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/gemm.h"
#include "ops/ops.h"
#include "testing.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Runs at_dropout on n values (in place or not) and counts elements that
 * differ from the definition. */
static int64_t mismatches_runs(int64_t n, float p, uint64_t seed, uint64_t offset, int64_t run, uint64_t pitch,
                               int in_place, int64_t *kept)
{
    at_tensor *x = NULL, *y = NULL;
    int64_t bad = -1;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "x", &x));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "y", &y));
    float *want = malloc((size_t)n * sizeof *want);
    if (x && y && want) {
        float *xd = at_tensor_data(x), *yd = at_tensor_data(y);
        at_rng r;
        at_rng_seed(&r, seed ^ 0x5eed);
        float keep = 1.0f / (1.0f - p);
        *kept = 0;
        for (int64_t i = 0; i < n; i++) {
            xd[i] = (float)(at_rng_uniform(&r) * 6.0 - 3.0);
            uint64_t counter = run ? offset + (uint64_t)(i / run) * pitch + (uint64_t)(i % run) : offset + (uint64_t)i;
            int k = at_rng_dropout_uniform(seed, counter) >= p;
            *kept += k;
            want[i] = k ? xd[i] * keep : 0.0f;
            yd[i] = NAN;
        }
        CHECK_OK(at_dropout(in_place ? x : y, x, p, seed, offset, run, pitch));
        const float *got = in_place ? xd : yd;
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += bits(got[i]) != bits(want[i]);
    }
    free(want);
    at_tensor_free(x);
    at_tensor_free(y);
    return bad;
}

static int64_t mismatches(int64_t n, float p, uint64_t seed, uint64_t offset, int in_place, int64_t *kept)
{
    return mismatches_runs(n, p, seed, offset, 0, 0, in_place, kept);
}

/* at_matmul_dropout against at_matmul then at_dropout, bit for bit, both on
 * our kernels: LoRA's dx = drop(dU·A) (K 8) and a K that takes the blocked
 * path, C wide enough to be cut into several blocks of rows (the fused
 * kernel's unit), A plain and transposed, LoRA's row runs. Also a bf16 C
 * (the unfused path) and the reference kernels. Returns the elements that
 * differ. */
static int64_t matmul_dropout_mismatches(int64_t M, int64_t N, int64_t K, int ta, at_dtype ct, float p, int64_t run,
                                         uint64_t pitch)
{
    int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {K, N}, sc[2] = {M, N};
    at_tensor *a = NULL, *b = NULL, *c = NULL, *want = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sa, "a", &a));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, sb, "b", &b));
    CHECK_OK(at_tensor_new(at_cpu_backend(), ct, 2, sc, "c", &c));
    CHECK_OK(at_tensor_new(at_cpu_backend(), ct, 2, sc, "want", &want));
    if (!a || !b || !c || !want) return -1;
    at_rng r;
    at_rng_seed(&r, (uint64_t)(M * 131 + N * 7 + K));
    float *pa = at_tensor_data(a), *pb = at_tensor_data(b);
    for (int64_t i = 0; i < M * K; i++) pa[i] = 2.0f * at_rng_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < K * N; i++) pb[i] = 2.0f * at_rng_uniform(&r) - 1.0f;
    uint64_t seed = 0xabcdef ^ (uint64_t)N, offset = 12345;
    CHECK_OK(at_matmul(want, a, b, ta, 0, 0.75f, 0.0f));
    CHECK_OK(at_dropout(want, want, p, seed, offset, run, pitch));
    CHECK_OK(at_matmul_dropout(c, a, b, ta, 0, 0.75f, p, seed, offset, run, pitch));
    size_t es = ct == AT_F32 ? 4 : 2;
    int64_t bad = 0, zeros = 0;
    const unsigned char *pc = at_tensor_data(c), *pw = at_tensor_data(want);
    for (int64_t i = 0; i < M * N; i++) {
        bad += memcmp(pc + i * es, pw + i * es, es) != 0;
        zeros += ct == AT_F32 && ((const float *)pw)[i] == 0.0f;
    }
    /* the mask did drop some: p of M·N (on enough elements to tell) */
    if (ct == AT_F32 && M * N >= 10000 && p > 0) CHECK_MSG(zeros > M * N * p / 2 && zeros < M * N * p * 2, "%lld of %lld dropped", (long long)zeros,
                                (long long)(M * N));
    at_tensor_free(a);
    at_tensor_free(b);
    at_tensor_free(c);
    at_tensor_free(want);
    return bad;
}

static void test_matmul_dropout(at_cpu_isa lvl)
{
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "anytune"));
    static const struct {
        int64_t M, N, K;
        int ta;
        at_dtype ct;
        int64_t run;
    } cases[] = {
        {512, 896, 8, 0, AT_F32, 0},     {300, 700, 8, 0, AT_F32, 700 * 100}, {257, 4864, 8, 0, AT_F32, 0},
        {200, 300, 96, 1, AT_F32, 300}, {130, 520, 16, 0, AT_BF16, 0},       {1, 17, 3, 0, AT_F32, 17},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t pitch = cases[i].run ? (uint64_t)cases[i].run * 5 + 1 : 0;
        int64_t bad = matmul_dropout_mismatches(cases[i].M, cases[i].N, cases[i].K, cases[i].ta, cases[i].ct, 0.05f,
                                                cases[i].run, pitch);
        CHECK_MSG(bad == 0, "isa %s matmul_dropout %lldx%lldx%lld%s %s run %lld: %lld elements differ from "
                  "matmul then dropout", at_cpu_isa_name(lvl), (long long)cases[i].M, (long long)cases[i].N,
                  (long long)cases[i].K, cases[i].ta ? " (A transposed)" : "", at_dtype_name(cases[i].ct),
                  (long long)cases[i].run, (long long)bad);
    }
    /* p 0: the product alone */
    CHECK_MSG(matmul_dropout_mismatches(300, 700, 8, 0, AT_F32, 0.0f, 0, 0) == 0, "isa %s matmul_dropout p 0",
              at_cpu_isa_name(lvl));
    CHECK_OK(at_cpu_gemm_use_engine(AT_F32, "auto"));
    /* the output may not be an operand */
    int64_t s2[2] = {8, 8};
    at_tensor *x = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 2, s2, "x", &x));
    CHECK(at_matmul_dropout(x, x, x, 0, 0, 1.0f, 0.1f, 1, 0, 0, 0) == AT_ERR_INVALID);
    CHECK(at_matmul_dropout(x, x, x, 0, 0, 1.0f, 1.0f, 1, 0, 0, 0) == AT_ERR_INVALID);
    at_tensor_free(x);
}

int main(void)
{
    static const int64_t sizes[] = {1, 15, 16, 17, 31, 2047, 2048, 2049, 40000};
    static const uint64_t offsets[] = {0, 1, 7, (3ull << 40) + 5, UINT64_MAX - 20};
    /* 0.05: LoRA's default; 0.5 and 0.25 lie on the hash's 2⁻²⁴ grid;
     * 2⁻²⁴ and 1 − 2⁻²⁴ are the extremes; 0.1 is not on the grid */
    static const float ps[] = {0.05f, 0.1f, 0.25f, 0.5f, 5.9604645e-8f, 0.99999994f};
    at_cpu_isa top = at_cpu_isa_level();
    for (int l = AT_ISA_SCALAR; l <= (int)top; l++) {
        at_cpu_isa_force((at_cpu_isa)l);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++)
                for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
                    uint64_t seed = 0x9e3779b97f4a7c15ull * (s * 131 + o * 17 + k + 1);
                    int64_t kept = 0, bad = mismatches(sizes[s], ps[k], seed, offsets[o], (int)((s + k) & 1), &kept);
                    CHECK_MSG(bad == 0, "isa %s n %lld offset %llu p %g: %lld elements differ",
                              at_cpu_isa_name((at_cpu_isa)l), (long long)sizes[s], (unsigned long long)offsets[o],
                              (double)ps[k], (long long)bad);
                }
        /* p exactly on an element's own value (kept: u >= p) and just above
         * it (dropped): a threshold off by one shows here and nowhere else */
        for (uint64_t i = 0; i < 40; i++) {
            uint64_t seed = 1000 + i, offset = (i << 40) + 3;
            float u = at_rng_dropout_uniform(seed, offset + 17 + i);
            if (!(u > 0.0f)) continue;
            float pk[2] = {u, nextafterf(u, 1.0f)};
            for (int j = 0; j < 2; j++) {
                int64_t kept = 0;
                CHECK_MSG(mismatches(33 + (int64_t)i, pk[j], seed, offset, j, &kept) == 0,
                          "isa %s: p %.9g on element %llu's value", at_cpu_isa_name((at_cpu_isa)l), (double)pk[j],
                          (unsigned long long)(17 + i));
            }
        }
        /* counters in runs (LoRA dropout's rows): runs shorter than a
         * SIMD vector, ending inside one, longer than a thread's chunk;
         * pitches equal to the run and far past it */
        static const int64_t runs[] = {1, 5, 16, 37, 2047, 4096, 9000};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
            for (int far = 0; far < 2; far++) {
                uint64_t pitch = far ? ((uint64_t)runs[r] << 24) + 3 : (uint64_t)runs[r];
                int64_t kept = 0, n = runs[r] * 3 + 11;
                int64_t bad = mismatches_runs(n, 0.25f, 77 + r, 1000 + r, runs[r], pitch, far, &kept);
                CHECK_MSG(bad == 0, "isa %s run %lld pitch %llu: %lld elements differ", at_cpu_isa_name((at_cpu_isa)l),
                          (long long)runs[r], (unsigned long long)pitch, (long long)bad);
            }
        /* the mask is not trivial: on 40000 values p = 0.5 keeps about half */
        int64_t kept = 0;
        CHECK(mismatches(40000, 0.5f, 42, 0, 0, &kept) == 0);
        CHECK_MSG(kept > 19000 && kept < 21000, "p 0.5 kept %lld of 40000", (long long)kept);
        test_matmul_dropout((at_cpu_isa)l);
    }
    at_cpu_isa_force(top);
    return at_test_result("test_dropout");
}
