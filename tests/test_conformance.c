/* Conformance suite: every operation of ops/ops.h, on every compiled-in
 * backend (the CPU backend at each ISA level this machine has), against the
 * reference kernels of device/ref on random inputs with awkward shapes.
 *
 * Inputs are drawn in f32 and rounded to the input dtype; the reference runs
 * on exactly those rounded values (host copies), so the only differences left
 * are the backend's accumulation order and its rounding of the output. The
 * reference writes f32 outputs (exact to f32), the backend writes its own
 * dtype; outputs that are overwritten start as NaN on the backend so an
 * element never written is caught.
 *
 * One line is printed per op / backend / dtype combination with the largest
 * error over all its cases (and the case it came from). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "base/progress.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/cuda_loader.h"
#include "device/quant.h"
#include "device/ref/ref_ops.h"
#include "ops/ops.h"
#include "testing.h"

/* ---- tolerances: max |backend − reference| / max |reference| over one output ---- */
static const struct {
    at_dtype dtype;
    double tol;
} TOLERANCES[] = {
    {AT_F32, 1e-5},  /* f32 output: only accumulation order differs                    */
    {AT_F16, 2e-3},  /* f16 output: half an ulp is 2^-11 of the value; ~4 ulp of slack   */
    {AT_BF16, 1e-2}, /* bf16 output: half an ulp is 2^-9 of the value; ~5 ulp of slack   */
    {AT_I32, 0},     /* integers: exact                                                  */
};
#define TOL_EXACT 0.0       /* cast and fill: round to nearest even, bit for bit          */
#define TOL_ADAMW_STEP 1e-4 /* AdamW: the change of the parameter (new − old), relative    */
#define REL_FLOOR 1e-6      /* denominators never below this (all-zero outputs)            */

static double tol_of(at_dtype dt)
{
    for (size_t i = 0; i < sizeof TOLERANCES / sizeof TOLERANCES[0]; i++)
        if (TOLERANCES[i].dtype == dt) return TOLERANCES[i].tol;
    return 0;
}

#define F32 AT_F32
#define BF16 AT_BF16
#define F16 AT_F16
#define I32 AT_I32
#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* ---- state of the current run ---- */

static at_backend *g_be;  /* the backend under test */
static char g_tag[48];    /* "cpu/avx2" */
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)); }
static int irand(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo)); } /* [lo, hi) */

/* ---- element access ---- */

static void put(void *p, at_dtype dt, int64_t i, float v)
{
    if (dt == F32) ((float *)p)[i] = v;
    else if (dt == BF16) ((uint16_t *)p)[i] = at_f32_to_bf16(v);
    else if (dt == F16) ((uint16_t *)p)[i] = at_f32_to_f16(v);
    else ((int32_t *)p)[i] = (int32_t)v;
}
static float get(const void *p, at_dtype dt, int64_t i)
{
    if (dt == F32) return ((const float *)p)[i];
    if (dt == BF16) return at_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == F16) return at_f16_to_f32(((const uint16_t *)p)[i]);
    return (float)((const int32_t *)p)[i];
}

/* All elements of t (on any backend) as floats; caller frees. */
static float *floats_of(const at_tensor *t)
{
    int64_t n = at_tensor_numel(t);
    size_t nb = at_tensor_nbytes(t);
    void *raw = malloc(nb ? nb : 1);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (!raw || !f || at_tensor_download(t, raw, nb) != AT_OK) {
        free(raw);
        free(f);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) f[i] = get(raw, t->dtype, i);
    free(raw);
    return f;
}

/* ---- tensor pairs: h on the host for the reference, d on the backend under test ---- */

typedef struct {
    at_tensor *h, *d;
} tp;

static at_tensor *host_new(at_dtype dt, int nd, const int64_t *sh, const char *name)
{
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), dt, nd, sh, name, &t));
    return t;
}

static at_tensor *dev_copy(const at_tensor *h)
{
    at_tensor *d = NULL;
    CHECK_OK(at_tensor_new(g_be, h->dtype, h->ndim, h->shape, h->name, &d));
    if (d) CHECK_OK(at_tensor_upload(d, at_tensor_data(h), at_tensor_nbytes(h)));
    return d;
}

/* Random input in [lo, hi) rounded to dt; the same bytes on both sides. */
static tp in_rand(at_dtype dt, int nd, const int64_t *sh, const char *name, float lo, float hi)
{
    tp p = {host_new(dt, nd, sh, name), NULL};
    for (int64_t i = 0; i < at_tensor_numel(p.h); i++) put(at_tensor_data(p.h), dt, i, urand(lo, hi));
    p.d = dev_copy(p.h);
    return p;
}

/* Index tensor with the given values. */
static tp in_idx(int nd, const int64_t *sh, const char *name, const int32_t *vals)
{
    tp p = {host_new(I32, nd, sh, name), NULL};
    memcpy(at_tensor_data(p.h), vals, at_tensor_nbytes(p.h));
    p.d = dev_copy(p.h);
    return p;
}

enum { POISON, RANDOM };

/* Output: dtype ddt on the backend, f32 for the reference. POISON fills both
 * with NaN (must be overwritten); RANDOM puts the same values (rounded to ddt)
 * in both (read by the op: beta, accumulation). */
static tp out_new(at_dtype ddt, int nd, const int64_t *sh, const char *name, int mode, float lo, float hi)
{
    at_tensor *t = host_new(ddt, nd, sh, name);
    tp p = {host_new(F32, nd, sh, name), NULL};
    for (int64_t i = 0; i < at_tensor_numel(t); i++) {
        put(at_tensor_data(t), ddt, i, mode == POISON ? NAN : urand(lo, hi));
        ((float *)at_tensor_data(p.h))[i] = get(at_tensor_data(t), ddt, i);
    }
    p.d = dev_copy(t);
    at_tensor_free(t);
    return p;
}

static void tp_free(tp *p)
{
    at_tensor_free(p->h);
    at_tensor_free(p->d);
    p->h = p->d = NULL;
}

/* ---- result groups: one printed line per op / backend / dtypes ---- */

static struct {
    const char *op;
    char dt[48];
    double ratio, err, tol; /* worst err/tol and its err, tol */
    char worst[128];
    int cases, fails;
    char msg[256];
} G;

static void begin(const char *op, const char *dt)
{
    memset(&G, 0, sizeof G);
    G.op = op;
    snprintf(G.dt, sizeof G.dt, "%s", dt);
}

/* Records the backend's status; returns whether to compare. */
static int called(at_status s, const char *what)
{
    G.cases++;
    if (s == AT_OK) return 1;
    if (!G.fails++) snprintf(G.msg, sizeof G.msg, "%s: %s: %s", what, at_status_name(s), at_last_error());
    return 0;
}

static void record(double err, double tol, const char *what)
{
    double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0);
    if (ratio > G.ratio || isnan(err) || G.worst[0] == 0) {
        if (isnan(err)) err = INFINITY, ratio = INFINITY;
        G.ratio = ratio;
        G.err = err;
        G.tol = tol;
        snprintf(G.worst, sizeof G.worst, "%s", what);
    }
}

/* Max |got − want| / max(max |size|, REL_FLOOR) over n values, size the
 * values' scale (want itself but for products: compare_product); equal
 * values (both NaN, both −inf) count as 0, one non-finite alone as inf. */
static double rel_err_to(const float *got, const float *want, const float *size, int64_t n)
{
    double maxw = REL_FLOOR, maxd = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(size[i]) && fabs(size[i]) > maxw) maxw = fabs(size[i]);
        if (got[i] == want[i] || (isnan(got[i]) && isnan(want[i]))) continue;
        double d = (isfinite(got[i]) && isfinite(want[i])) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (d > maxd) maxd = d;
    }
    return maxd / maxw;
}
static double rel_err(const float *got, const float *want, int64_t n) { return rel_err_to(got, want, want, n); }

/* Compares the backend's tensor d with the reference's host tensor h. */
static void compare_t(const at_tensor *d, const at_tensor *h, double tol, const char *case_desc, const char *what)
{
    float *got = floats_of(d), *want = floats_of(h);
    char label[128];
    snprintf(label, sizeof label, "%s %s", what, case_desc);
    if (!got || !want) {
        G.fails++;
        snprintf(G.msg, sizeof G.msg, "%s: cannot read back: %s", label, at_last_error());
    } else {
        record(rel_err(got, want, at_tensor_numel(h)), tol, label);
    }
    free(got);
    free(want);
}
static void compare(const tp *o, const char *case_desc, const char *what)
{
    compare_t(o->d, o->h, tol_of(o->d->dtype), case_desc, what);
}

/* A product's rounding error is bounded by the size of its terms, not of its
 * result: |fl(Σ a·b) − Σ a·b| <= γ_K·Σ|a·b| (Higham, ch. 3), and a result
 * that cancels (one output element, the sum of 64 terms of ±1 near 0) has
 * no relative accuracy to keep. So C's error counts against the largest of
 * |alpha|·|A|·|op(B)| + |beta|·|C0|, computed by the reference from the
 * inputs' absolute values (a, b as the reference was given them; c0: C's
 * values before the product, NULL for beta 0). */
static at_tensor *abs_of(const at_tensor *t)
{
    at_tensor *r = host_new(F32, t->ndim, t->shape, t->name);
    float *o = at_tensor_data(r);
    if (at_dtype_is_quantized(t->dtype)) {
        CHECK_OK(at_dequantize(r, t));
    } else {
        float *v = floats_of(t);
        if (v) memcpy(o, v, at_tensor_nbytes(r));
        free(v);
    }
    for (int64_t i = 0; i < at_tensor_numel(r); i++) o[i] = fabsf(o[i]);
    return r;
}
static void compare_product(const tp *c, const at_tensor *c0, const at_tensor *a, const at_tensor *b, int ta, int tb,
                            float alpha, float beta, const char *case_desc)
{
    at_tensor *aa = abs_of(a), *ab = abs_of(b), *size = c0 ? abs_of(c0) : host_new(F32, c->h->ndim, c->h->shape, "size");
    CHECK_OK(at_ref_matmul(size, aa, ab, ta, tb, fabsf(alpha), fabsf(beta)));
    float *got = floats_of(c->d), *want = floats_of(c->h);
    char label[128];
    snprintf(label, sizeof label, "C %s", case_desc);
    if (!got || !want) {
        G.fails++;
        snprintf(G.msg, sizeof G.msg, "%s: cannot read back: %s", label, at_last_error());
    } else {
        record(rel_err_to(got, want, at_tensor_data(size), at_tensor_numel(c->h)), tol_of(c->d->dtype), label);
    }
    free(got);
    free(want);
    at_tensor_free(aa);
    at_tensor_free(ab);
    at_tensor_free(size);
}

static void end(void)
{
    if (G.fails)
        printf("[%-14s] %-18s %-16s %d of %d calls FAILED: %s\n", g_tag, G.op, G.dt, G.fails, G.cases, G.msg);
    else
        printf("[%-14s] %-18s %-16s %3d cases  max err %.2e  tol %.0e  %s  (worst: %s)\n", g_tag, G.op, G.dt,
               G.cases, G.err, G.tol, G.ratio <= 1 ? "ok  " : "FAIL", G.worst);
    CHECK_MSG(G.fails == 0 && G.ratio <= 1, "%s %s %s", g_tag, G.op, G.dt);
}

static const char *dn(at_dtype t) { return at_dtype_name(t); }

/* ---- matmul: every transpose combination, batches, batch broadcast, alpha/beta ---- */

/* A new f32 host tensor holding t's values rounded to bf16. */
static at_tensor *bf16_rounded(const at_tensor *t)
{
    at_tensor *r = NULL;
    float *v = floats_of(t);
    CHECK_OK(at_tensor_new(at_cpu_backend(), F32, t->ndim, t->shape, t->name, &r));
    float *o = at_tensor_data(r);
    for (int64_t i = 0; i < at_tensor_numel(t); i++) o[i] = at_bf16_to_f32(at_f32_to_bf16(v[i]));
    free(v);
    return r;
}

/* Whether the backend under test computes a product with a bf16 input in
 * bf16, rounding the other input (ops.h): everywhere but on a CPU without
 * bf16 products, which widens bf16 exactly and computes in f32. */
static int rounds_to_bf16(void) { return g_be != at_cpu_backend() || at_cpu_fast_bf16(); }

static void test_matmul(void)
{
    static const at_dtype combos[][3] = {{F32, F32, F32},  {BF16, BF16, F32}, {BF16, BF16, BF16},
                                         {F16, F16, F32},  {F32, BF16, F32},  {F16, BF16, BF16}};
    static const int64_t mkn[][3] = {{1, 1, 1}, {3, 17, 65}, {17, 63, 1}, {65, 1000, 3}, {63, 65, 17}, {100, 300, 130}};
    static const int64_t batches[][2] = {{1, 1}, {2, 2}, {3, 1}, {6, 1}}; /* {6,1}: A is [2, 3, ., .] */
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        char dt[48];
        snprintf(dt, sizeof dt, "%s.%s->%s", dn(combos[c][0]), dn(combos[c][1]), dn(combos[c][2]));
        begin("matmul", dt);
        int variant = 0;
        for (size_t s = 0; s < sizeof mkn / sizeof mkn[0]; s++)
            for (size_t bt = 0; bt < sizeof batches / sizeof batches[0]; bt++) {
                if (s == 5 && (bt > 0 || c > 2)) continue; /* the big one: unbatched, first combos only */
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++) {
                        int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2], ba = batches[bt][0],
                                bb = batches[bt][1];
                        int64_t ash[4], bsh[4], csh[4];
                        int na = 0, nb = 0, nc = 0;
                        if (ba == 6) ash[na++] = 2, ash[na++] = 3, csh[nc++] = 2, csh[nc++] = 3;
                        else if (ba > 1) ash[na++] = ba, csh[nc++] = ba;
                        if (bb > 1) bsh[nb++] = bb;
                        ash[na++] = ta ? K : M, ash[na++] = ta ? M : K;
                        bsh[nb++] = tb ? N : K, bsh[nb++] = tb ? K : N;
                        csh[nc++] = M, csh[nc++] = N;
                        /* alpha/beta: plain, beta reading C, negative alpha */
                        float alpha = variant % 3 == 0 ? 1.0f : variant % 3 == 1 ? 0.5f : -1.0f;
                        float beta = variant % 3 == 0 ? 0.0f : variant % 3 == 1 ? 1.5f : 1.0f;
                        variant++;
                        tp A = in_rand(combos[c][0], na, ash, "A", -1, 1);
                        tp B = in_rand(combos[c][1], nb, bsh, "B", -1, 1);
                        tp C = out_new(combos[c][2], nc, csh, "C", beta == 0 ? POISON : RANDOM, -1, 1);
                        char desc[96];
                        snprintf(desc, sizeof desc, "M%lld K%lld N%lld ta%d tb%d batch %lld/%lld a%g b%g",
                                 (long long)M, (long long)K, (long long)N, ta, tb, (long long)ba, (long long)bb,
                                 (double)alpha, (double)beta);
                        /* ops.h: with one bf16 input the product is computed in bf16 (where
                         * the backend rounds), so the reference sees the other input rounded
                         * to bf16 too. */
                        at_tensor *ra = A.h, *rb = B.h;
                        if (combos[c][1] == BF16 && combos[c][0] != BF16 && rounds_to_bf16()) ra = bf16_rounded(A.h);
                        if (combos[c][0] == BF16 && combos[c][1] != BF16 && rounds_to_bf16()) rb = bf16_rounded(B.h);
                        at_tensor *c0 = beta != 0 ? abs_of(C.h) : NULL;
                        CHECK_OK(at_ref_matmul(C.h, ra, rb, ta, tb, alpha, beta));
                        if (called(at_matmul(C.d, A.d, B.d, ta, tb, alpha, beta), desc))
                            compare_product(&C, c0, ra, rb, ta, tb, alpha, beta, desc);
                        at_tensor_free(c0);
                        if (ra != A.h) at_tensor_free(ra);
                        if (rb != B.h) at_tensor_free(rb);
                        tp_free(&A);
                        tp_free(&B);
                        tp_free(&C);
                    }
            }
        end();
    }
}

/* ---- matmul with a quantized weight W [out, in]: forward x · Wᵀ (tb 1), input backward dy · W (tb 0) ---- */

static void to_view(tp *p, int64_t off);

/* A new f32 host tensor holding t's rows as the CPU's int8 decode path sees
 * them (device/cpu/cpu_qmatmul.h; AVX2 and above, Q8_0 / Q4_0 weights, the
 * forward of up to 8 rows): each block of 32 values of a row as d·q, d =
 * max|x| / 127, q = rint(x · (1/d)), each step in f32 as the kernel does it.
 * The kernel's integer block dots are exact, so against a reference fed
 * these values only the accumulation order differs (f32 tolerance). */
static at_tensor *int8_rounded(const at_tensor *t)
{
    at_tensor *r = NULL;
    float *v = floats_of(t);
    CHECK_OK(at_tensor_new(at_cpu_backend(), F32, t->ndim, t->shape, t->name, &r));
    float *o = at_tensor_data(r);
    int64_t n = at_tensor_numel(t);
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int64_t i = b; i < b + 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t i = b; i < b + 32; i++) o[i] = d * rintf(v[i] * id);
    }
    free(v);
    return r;
}

/* One case: C [bt, N, n] = alpha · A [bt, N, k] · op(W) + beta · C, W a random
 * f32 [out, in] quantized to qt on the host (its bytes copied to the
 * backend); A and C are views at element `off` of bigger buffers when off > 0. */
static void qmm_case(at_dtype qt, at_dtype a_dt, at_dtype c_dt, int64_t bt, int64_t N, int64_t out, int64_t in, int tb,
                     float alpha, float beta, int64_t off, const char *note)
{
    int64_t k = tb ? in : out, n = tb ? out : in;
    at_tensor *wf = host_new(F32, 2, SH(out, in), "W.f32"), *wq = host_new(qt, 2, SH(out, in), "W");
    for (int64_t i = 0; i < out * in; i++) ((float *)at_tensor_data(wf))[i] = urand(-1, 1);
    CHECK_OK(at_quantize(wq, wf));
    at_tensor *wd = dev_copy(wq);
    tp A = bt > 1 ? in_rand(a_dt, 3, SH(bt, N, k), "A", -1, 1) : in_rand(a_dt, 2, SH(N, k), "A", -1, 1);
    tp C = bt > 1 ? out_new(c_dt, 3, SH(bt, N, n), "C", beta == 0 ? POISON : RANDOM, -1, 1)
                  : out_new(c_dt, 2, SH(N, n), "C", beta == 0 ? POISON : RANDOM, -1, 1);
    if (off > 0) to_view(&A, off), to_view(&C, off);
    char desc[128];
    snprintf(desc, sizeof desc, "batch %lld N%lld out%lld in%lld tb%d a%g b%g%s%s", (long long)bt, (long long)N,
             (long long)out, (long long)in, tb, (double)alpha, (double)beta, off ? " view" : "", note);
    /* the reference multiplies the dequantized weight (ref_util.c loads a
     * quantized tensor as its values), rounded to bf16 when A is bf16; on
     * the CPU's int8 decode path by A as int8_rounded gives it instead */
    at_tensor *rb = wq, *deq = NULL, *ra = A.h;
    int i8 = g_be == at_cpu_backend() && at_cpu_qmatmul_int8_decode() && tb && bt * N <= 8 && qt != AT_NF4;
    if (i8) ra = int8_rounded(A.h);
    else if (a_dt == BF16) {
        deq = host_new(F32, 2, SH(out, in), "W.deq");
        CHECK_OK(at_dequantize(deq, wq));
        rb = bf16_rounded(deq);
    }
    at_tensor *c0 = beta != 0 ? abs_of(C.h) : NULL;
    CHECK_OK(at_ref_matmul(C.h, ra, rb, 0, tb, alpha, beta));
    if (A.d && C.d && called(at_matmul(C.d, A.d, wd, 0, tb, alpha, beta), desc))
        compare_product(&C, c0, ra, rb, 0, tb, alpha, beta, desc);
    at_tensor_free(c0);
    if (ra != A.h) at_tensor_free(ra);
    if (rb != wq) at_tensor_free(rb);
    at_tensor_free(deq);
    at_tensor_free(wf);
    at_tensor_free(wq);
    at_tensor_free(wd);
    tp_free(&A);
    tp_free(&C);
}

static void test_qmatmul(void)
{
    uint64_t saved_rng = g_rng; /* the other ops' inputs stay what they were without these cases */
    static const at_dtype qts[] = {AT_Q8_0, AT_Q4_0, AT_NF4};
    static const at_dtype combos[][2] = {{F32, F32}, {BF16, F32}, {BF16, BF16}, {F16, F32}, {F16, BF16}}; /* A, C */
    static const int64_t shapes[][4] = {/* batch, N, out, in (in: a multiple of every block, 64) */
                                        {1, 1, 1, 64}, {1, 3, 17, 128}, {1, 65, 3, 192}, {1, 17, 1000, 64},
                                        {1, 33, 130, 1088}, {2, 5, 70, 128}};
    /* decoding shapes, x · Wᵀ only: the CUDA backend's fused GEMV takes up to
     * 8 rows of A (batch stacked), the tile path the rest (9 rows, 2 x 5).
     * Odd out; in of several blocks, with units of 32 values that do and do
     * not fill a warp's 32 lanes (in 1024 / 1088). A and C are views at an
     * element offset in some (1: only scalar accesses are legal; 8: 16-byte
     * aligned again). Each runs with the fused path on and off
     * (ANYTUNE_CUDA_NO_QGEMV), against the same reference. */
    static const int64_t gemv[][5] = {/* batch, N, out, in, view offset */
                                      {1, 1, 257, 320, 0}, {1, 2, 33, 1024, 1}, {1, 3, 7, 1088, 8},
                                      {1, 5, 129, 192, 0}, {1, 8, 65, 576, 3},  {1, 9, 31, 256, 0},
                                      {2, 4, 37, 128, 8},  {3, 2, 19, 64, 1},   {2, 5, 9, 64, 0}};
    for (size_t q = 0; q < sizeof qts / sizeof qts[0]; q++)
        for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
            char dt[48];
            snprintf(dt, sizeof dt, "%s.%s->%s", dn(combos[c][0]), dn(qts[q]), dn(combos[c][1]));
            begin("matmul", dt);
            int variant = 0;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int tb = 0; tb < 2; tb++) {
                    float alpha = variant % 3 == 0 ? 1.0f : variant % 3 == 1 ? 0.5f : -1.0f;
                    float beta = variant % 3 == 0 ? 0.0f : variant % 3 == 1 ? 1.5f : 1.0f;
                    variant++;
                    qmm_case(qts[q], combos[c][0], combos[c][1], shapes[s][0], shapes[s][1], shapes[s][2],
                             shapes[s][3], tb, alpha, beta, 0, "");
                }
            for (size_t s = 0; s < sizeof gemv / sizeof gemv[0]; s++)
                for (int path = 0; path < 2; path++) {
                    float alpha = variant % 3 == 0 ? 1.0f : variant % 3 == 1 ? 0.5f : -1.0f;
                    float beta = variant % 3 == 0 ? 0.0f : variant % 3 == 1 ? 1.5f : 1.0f;
                    variant++;
                    setenv("ANYTUNE_CUDA_NO_QGEMV", path ? "1" : "0", 1);
                    qmm_case(qts[q], combos[c][0], combos[c][1], gemv[s][0], gemv[s][1], gemv[s][2], gemv[s][3], 1,
                             alpha, beta, gemv[s][4], path ? " tiles" : "");
                }
            unsetenv("ANYTUNE_CUDA_NO_QGEMV");
            end();
        }
    g_rng = saved_rng;
}

/* ---- elementwise ---- */

static const int64_t EW_SHAPES[][2] = {{1, 1}, {3, 17}, {63, 65}, {1, 1000}, {17, 63}};
#define EW_N (sizeof EW_SHAPES / sizeof EW_SHAPES[0])

static void test_elementwise(void)
{
    static const at_dtype combos[][3] = {
        {F32, F32, F32}, {BF16, BF16, BF16}, {F16, F16, F16}, {BF16, F32, F32}, {F32, F32, BF16}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype ta = combos[c][0], tb = combos[c][1], ty = combos[c][2];
        char dt[48], desc[64];
        snprintf(dt, sizeof dt, "%s+%s->%s", dn(ta), dn(tb), dn(ty));
        begin("add", dt);
        for (size_t s = 0; s < EW_N; s++)
            for (int bcast = 0; bcast < 2; bcast++) {
                const int64_t *sh = EW_SHAPES[s];
                tp A = in_rand(ta, 2, sh, "a", -2, 2);
                tp B = bcast ? in_rand(tb, 1, &sh[1], "b", -2, 2) : in_rand(tb, 2, sh, "b", -2, 2);
                tp Y = out_new(ty, 2, sh, "y", POISON, 0, 0);
                snprintf(desc, sizeof desc, "%lldx%lld%s", (long long)sh[0], (long long)sh[1], bcast ? " row" : "");
                CHECK_OK(at_ref_add(Y.h, A.h, B.h));
                if (called(at_add(Y.d, A.d, B.d), desc)) compare(&Y, desc, "y");
                tp_free(&A);
                tp_free(&B);
                tp_free(&Y);
            }
        end();

        snprintf(dt, sizeof dt, "%s->%s", dn(ta), dn(ty));
        begin("scale", dt);
        for (size_t s = 0; s < EW_N; s++) {
            const int64_t *sh = EW_SHAPES[s];
            tp X = in_rand(ta, 2, sh, "x", -2, 2);
            tp Y = out_new(ty, 2, sh, "y", POISON, 0, 0);
            snprintf(desc, sizeof desc, "%lldx%lld", (long long)sh[0], (long long)sh[1]);
            CHECK_OK(at_ref_scale(Y.h, X.h, -1.7f));
            if (called(at_scale(Y.d, X.d, -1.7f), desc)) compare(&Y, desc, "y");
            tp_free(&X);
            tp_free(&Y);
        }
        end();

        snprintf(dt, sizeof dt, "%s+=%s", dn(ty), dn(tb));
        begin("axpy", dt);
        for (size_t s = 0; s < EW_N; s++) {
            const int64_t *sh = EW_SHAPES[s];
            tp X = in_rand(tb, 2, sh, "x", -2, 2);
            tp Y = out_new(ty, 2, sh, "y", RANDOM, -2, 2);
            snprintf(desc, sizeof desc, "%lldx%lld", (long long)sh[0], (long long)sh[1]);
            CHECK_OK(at_ref_axpy(Y.h, 0.3f, X.h));
            if (called(at_axpy(Y.d, 0.3f, X.d), desc)) compare(&Y, desc, "y");
            tp_free(&X);
            tp_free(&Y);
        }
        end();

        snprintf(dt, sizeof dt, "%s->%s", dn(ta), dn(ty));
        begin("sum_rows", dt);
        for (size_t s = 0; s < EW_N; s++)
            for (int b = 0; b < 2; b++) {
                const int64_t *sh = EW_SHAPES[s];
                float beta = b ? 0.5f : 0.0f;
                tp X = in_rand(ta, 2, sh, "x", -2, 2);
                tp Y = out_new(ty, 1, &sh[1], "y", RANDOM, -2, 2); /* finite: beta 0 on NaN is not specified */
                snprintf(desc, sizeof desc, "%lldx%lld beta %g", (long long)sh[0], (long long)sh[1], (double)beta);
                CHECK_OK(at_ref_sum_rows(Y.h, X.h, beta));
                if (called(at_sum_rows(Y.d, X.d, beta), desc)) compare(&Y, desc, "y");
                tp_free(&X);
                tp_free(&Y);
            }
        end();
    }
    /* a 1000-row column sum with 3-D input */
    begin("sum_rows", "f32 [10,100,3]");
    {
        tp X = in_rand(F32, 3, SH(10, 100, 3), "x", -1, 1);
        tp Y = out_new(F32, 1, SH(3), "y", RANDOM, -1, 1);
        CHECK_OK(at_ref_sum_rows(Y.h, X.h, 1.0f));
        if (called(at_sum_rows(Y.d, X.d, 1.0f), "3-D")) compare(&Y, "3-D", "y");
        tp_free(&X);
        tp_free(&Y);
    }
    end();
}

/* Values over many binades, ties, overflow to f16 inf, subnormals, inf, NaN. */
static float wide_value(int i)
{
    static const float special[] = {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f,
                                    65504.0f, 65520.0f, 1e6f, 0x1p-24f, 0x1p-126f, INFINITY, -INFINITY, NAN};
    int ns = (int)(sizeof special / sizeof special[0]);
    if (i < ns) return special[i];
    float m = urand(1.0f, 2.0f) * (rnd() & 1 ? -1.0f : 1.0f);
    return ldexpf(m, irand(-30, 20));
}

static void test_cast_fill(void)
{
    static const at_dtype dts[] = {F32, BF16, F16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            char dt[48];
            snprintf(dt, sizeof dt, "%s->%s", dn(dts[a]), dn(dts[b]));
            begin("cast", dt);
            for (int s = 0; s < 3; s++) {
                int64_t n = s == 0 ? 1 : s == 1 ? 65 : 1000;
                tp X = {host_new(dts[a], 1, &n, "x"), NULL};
                for (int64_t i = 0; i < n; i++) put(at_tensor_data(X.h), dts[a], i, wide_value((int)i));
                X.d = dev_copy(X.h);
                /* the reference writes the same dtype here: the result must match bit for bit */
                tp Y = {host_new(dts[b], 1, &n, "y"), NULL};
                Y.d = dev_copy(Y.h);
                char desc[32];
                snprintf(desc, sizeof desc, "n=%lld", (long long)n);
                CHECK_OK(at_ref_cast(Y.h, X.h));
                if (called(at_cast(Y.d, X.d), desc)) compare_t(Y.d, Y.h, TOL_EXACT, desc, "y");
                tp_free(&X);
                tp_free(&Y);
            }
            end();
        }
    begin("cast", "i32->i32");
    {
        int32_t v[17], z[17] = {0};
        for (int i = 0; i < 17; i++) v[i] = (int32_t)rnd();
        tp X = in_idx(1, SH(17), "x", v), Y = in_idx(1, SH(17), "y", z);
        if (called(at_cast(Y.d, X.d), "n=17")) compare_t(Y.d, X.h, TOL_EXACT, "n=17", "y");
        tp_free(&X);
        tp_free(&Y);
    }
    end();

    static const at_dtype fdts[] = {F32, BF16, F16, I32};
    for (int a = 0; a < 4; a++) {
        begin("fill", dn(fdts[a]));
        for (int s = 0; s < 3; s++) {
            int64_t n = s == 0 ? 1 : s == 1 ? 63 : 1000;
            float value = s == 0 ? -3.0f : s == 1 ? 1.0f / 3.0f : 0.0f;
            tp Y = {host_new(fdts[a], 1, &n, "y"), NULL};
            for (int64_t i = 0; i < n; i++) put(at_tensor_data(Y.h), fdts[a], i, 7.0f);
            Y.d = dev_copy(Y.h);
            char desc[48];
            snprintf(desc, sizeof desc, "n=%lld value %g", (long long)n, (double)value);
            CHECK_OK(at_ref_fill(Y.h, value));
            if (called(at_fill(Y.d, value), desc)) compare_t(Y.d, Y.h, TOL_EXACT, desc, "y");
            tp_free(&Y);
        }
        end();
    }
}

/* ---- rmsnorm ---- */

static const int64_t NORM_SHAPES[][3] = {{1, 1, 1}, {1, 3, 17}, {1, 17, 63}, {1, 5, 1000}, {2, 3, 65}};

static void test_rmsnorm(void)
{
    static const at_dtype combos[][3] = {/* x, w, y */ {F32, F32, F32},
                                         {BF16, BF16, BF16},
                                         {F16, F16, F16},
                                         {BF16, F32, F32},
                                         {F32, F32, BF16}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype tx = combos[c][0], tw = combos[c][1], ty = combos[c][2];
        char dt[48], desc[64];
        snprintf(dt, sizeof dt, "%s.%s->%s", dn(tx), dn(tw), dn(ty));
        for (int pass = 0; pass < 2; pass++) {
            begin(pass ? "rmsnorm_backward" : "rmsnorm_forward", dt);
            for (size_t s = 0; s < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; s++) {
                const int64_t *sh = NORM_SHAPES[s];
                int64_t D = sh[2], rows = sh[0] * sh[1];
                /* D = 1: dx = r·g·eps/(x²+eps) is all cancellation (x̂² ≈ 1), noise in any precision */
                if (pass && D == 1) continue;
                int nd = sh[0] > 1 ? 3 : 2;
                const int64_t *shp = nd == 3 ? sh : sh + 1;
                snprintf(desc, sizeof desc, "rows %lld D %lld", (long long)rows, (long long)D);
                tp X = in_rand(tx, nd, shp, "x", -3, 3);
                tp W = in_rand(tw, 1, &D, "w", 0.5f, 1.5f);
                if (!pass) {
                    tp Y = out_new(ty, nd, shp, "y", POISON, 0, 0);
                    tp R = out_new(F32, 1, &rows, "rstd", POISON, 0, 0);
                    int with_rstd = s != 1; /* rstd may be NULL */
                    CHECK_OK(at_ref_rmsnorm_forward(Y.h, with_rstd ? R.h : NULL, X.h, W.h, 1e-5f));
                    if (called(at_rmsnorm_forward(Y.d, with_rstd ? R.d : NULL, X.d, W.d, 1e-5f), desc)) {
                        compare(&Y, desc, "y");
                        if (with_rstd) compare(&R, desc, "rstd");
                    }
                    tp_free(&Y);
                    tp_free(&R);
                } else {
                    /* rstd from the reference forward, the same for both */
                    tp R = {host_new(F32, 1, &rows, "rstd"), NULL};
                    at_tensor *y = host_new(F32, nd, shp, "y");
                    CHECK_OK(at_ref_rmsnorm_forward(y, R.h, X.h, W.h, 1e-5f));
                    at_tensor_free(y);
                    R.d = dev_copy(R.h);
                    tp DY = in_rand(ty, nd, shp, "dy", -1, 1);
                    tp DX = out_new(tx, nd, shp, "dx", POISON, 0, 0);
                    tp DW = out_new(tw, 1, &D, "dw", RANDOM, -1, 1); /* accumulated into */
                    int with_dw = s != 2;                            /* frozen weight: dw NULL */
                    CHECK_OK(at_ref_rmsnorm_backward(DX.h, with_dw ? DW.h : NULL, DY.h, X.h, W.h, R.h));
                    if (called(at_rmsnorm_backward(DX.d, with_dw ? DW.d : NULL, DY.d, X.d, W.d, R.d), desc)) {
                        compare(&DX, desc, "dx");
                        compare(&DW, desc, "dw");
                    }
                    tp_free(&R);
                    tp_free(&DY);
                    tp_free(&DX);
                    tp_free(&DW);
                }
                tp_free(&X);
                tp_free(&W);
            }
            end();
        }
    }
}

/* ---- layernorm ---- */

static void test_layernorm(void)
{
    static const at_dtype combos[][3] = {/* x, w (and b), y */ {F32, F32, F32},
                                         {BF16, BF16, BF16},
                                         {F16, F16, F16},
                                         {BF16, F32, F32},
                                         {F32, F32, BF16}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype tx = combos[c][0], tw = combos[c][1], ty = combos[c][2];
        char dt[48], desc[64];
        snprintf(dt, sizeof dt, "%s.%s->%s", dn(tx), dn(tw), dn(ty));
        for (int pass = 0; pass < 2; pass++) {
            begin(pass ? "layernorm_backward" : "layernorm_forward", dt);
            for (size_t s = 0; s < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; s++) {
                const int64_t *sh = NORM_SHAPES[s];
                int64_t D = sh[2], rows = sh[0] * sh[1];
                /* D = 1: x − μ = 0, every output is the bias / every dx is 0: no test of the math */
                if (D == 1) continue;
                int nd = sh[0] > 1 ? 3 : 2;
                const int64_t *shp = nd == 3 ? sh : sh + 1;
                snprintf(desc, sizeof desc, "rows %lld D %lld", (long long)rows, (long long)D);
                /* rows far from zero (x in [2, 8)): a variance taken as E[x²] − μ² would lose digits */
                tp X = in_rand(tx, nd, shp, "x", 2, 8);
                tp W = in_rand(tw, 1, &D, "w", 0.5f, 1.5f), B = in_rand(tw, 1, &D, "b", -1, 1);
                int with_b = s != 3; /* no bias: b NULL */
                if (!pass) {
                    tp Y = out_new(ty, nd, shp, "y", POISON, 0, 0);
                    tp M = out_new(F32, 1, &rows, "mean", POISON, 0, 0), R = out_new(F32, 1, &rows, "rstd", POISON, 0, 0);
                    int with_stats = s != 1; /* mean/rstd may be NULL */
                    CHECK_OK(at_ref_layernorm_forward(Y.h, with_stats ? M.h : NULL, with_stats ? R.h : NULL, X.h, W.h,
                                                      with_b ? B.h : NULL, 1e-5f));
                    if (called(at_layernorm_forward(Y.d, with_stats ? M.d : NULL, with_stats ? R.d : NULL, X.d, W.d,
                                                    with_b ? B.d : NULL, 1e-5f),
                               desc)) {
                        compare(&Y, desc, "y");
                        if (with_stats) {
                            compare(&M, desc, "mean");
                            compare(&R, desc, "rstd");
                        }
                    }
                    tp_free(&Y);
                    tp_free(&M);
                    tp_free(&R);
                } else {
                    /* mean and rstd from the reference forward, the same for both */
                    tp M = {host_new(F32, 1, &rows, "mean"), NULL}, R = {host_new(F32, 1, &rows, "rstd"), NULL};
                    at_tensor *y = host_new(F32, nd, shp, "y");
                    CHECK_OK(at_ref_layernorm_forward(y, M.h, R.h, X.h, W.h, B.h, 1e-5f));
                    at_tensor_free(y);
                    M.d = dev_copy(M.h);
                    R.d = dev_copy(R.h);
                    tp DY = in_rand(ty, nd, shp, "dy", -1, 1);
                    tp DX = out_new(tx, nd, shp, "dx", POISON, 0, 0);
                    tp DW = out_new(tw, 1, &D, "dw", RANDOM, -1, 1); /* accumulated into */
                    tp DB = out_new(tw, 1, &D, "db", RANDOM, -1, 1);
                    int with_dw = s != 2, with_db = s != 4; /* frozen weight or bias: NULL */
                    CHECK_OK(at_ref_layernorm_backward(DX.h, with_dw ? DW.h : NULL, with_db ? DB.h : NULL, DY.h, X.h,
                                                       W.h, M.h, R.h));
                    if (called(at_layernorm_backward(DX.d, with_dw ? DW.d : NULL, with_db ? DB.d : NULL, DY.d, X.d, W.d,
                                                     M.d, R.d),
                               desc)) {
                        compare(&DX, desc, "dx");
                        compare(&DW, desc, "dw");
                        compare(&DB, desc, "db");
                    }
                    tp *all[] = {&M, &R, &DY, &DX, &DW, &DB};
                    for (int j = 0; j < 6; j++) tp_free(all[j]);
                }
                tp_free(&X);
                tp_free(&W);
                tp_free(&B);
            }
            end();
        }
    }
}

/* ---- rope ---- */

static void test_rope(void)
{
    static const at_dtype combos[][2] = {{F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    static const int64_t shapes[][4] = {/* B (0: 3-D), T, H, D */ {0, 1, 1, 2},   {0, 17, 3, 34},
                                        {2, 3, 4, 64},  {0, 5, 2, 126}, {1, 63, 2, 130}, {2, 4, 1, 128}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        char dt[48];
        snprintf(dt, sizeof dt, "%s->%s", dn(combos[c][0]), dn(combos[c][1]));
        begin("rope", dt);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int inverse = 0; inverse < 2; inverse++)
                for (int variant = 0; variant < 5; variant++) {
                    /* 0, 1: one position a token (1: in place); 2: three components (M-RoPE,
                     * a section may be empty); 3: two halves (the vision tower's 2-D RoPE);
                     * 4: variant 2's sections interleaved (Qwen3-VL's M-RoPE) */
                    int inplace = variant == 1;
                    if (inplace && combos[c][0] != combos[c][1]) continue;
                    const int64_t *sh = shapes[s];
                    int64_t ntok = sh[0] ? sh[0] * sh[1] : sh[1], D = sh[3], half = D / 2;
                    int nd = sh[0] ? 4 : 3;
                    const int64_t *xs = sh[0] ? sh : sh + 1;
                    at_rope_sections sec3 = {3, {(int)(half / 4), (int)((half - half / 4) / 2), 0, 0}, 0};
                    sec3.len[2] = (int)half - sec3.len[0] - sec3.len[1];
                    sec3.interleaved = variant == 4;
                    at_rope_sections sec2 = {2, {(int)(half / 2), (int)(half - half / 2), 0, 0}, 0};
                    const at_rope_sections *sec = variant == 2 || variant == 4 ? &sec3 : variant == 3 ? &sec2 : NULL;
                    int64_t np = ntok * (sec ? sec->n : 1);
                    int32_t *pv = malloc((size_t)np * sizeof *pv);
                    for (int64_t i = 0; i < np; i++) pv[i] = i == 0 ? 0 : irand(0, 4096);
                    int64_t psh[2] = {ntok, sec ? sec->n : 1};
                    tp P = sec ? in_idx(2, psh, "pos", pv) : sh[0] ? in_idx(2, sh, "pos", pv) : in_idx(1, &ntok, "pos", pv);
                    free(pv);
                    tp Fq = {host_new(F32, 1, &half, "inv_freq"), NULL};
                    for (int64_t i = 0; i < half; i++)
                        ((float *)at_tensor_data(Fq.h))[i] = (float)pow(10000.0, -2.0 * (double)i / (double)D);
                    Fq.d = dev_copy(Fq.h);
                    tp X = in_rand(combos[c][0], nd, xs, "x", -2, 2);
                    tp Y = out_new(combos[c][1], nd, xs, "y", POISON, 0, 0);
                    char desc[80];
                    snprintf(desc, sizeof desc, "%lld tok H%lld D%lld%s%s%s", (long long)ntok, (long long)sh[2],
                             (long long)D, inverse ? " inverse" : "", inplace ? " in place" : "",
                             variant == 2 ? " 3 sections" : variant == 3 ? " 2 sections" :
                             variant == 4 ? " 3 interleaved" : "");
                    CHECK_OK(at_ref_rope(Y.h, X.h, P.h, Fq.h, sec, inverse));
                    at_tensor *yd = inplace ? X.d : Y.d;
                    if (called(at_rope(yd, X.d, P.d, Fq.d, sec, inverse), desc))
                        compare_t(yd, Y.h, tol_of(combos[c][1]), desc, "y");
                    tp_free(&P);
                    tp_free(&Fq);
                    tp_free(&X);
                    tp_free(&Y);
                }
        end();
    }
}

/* ---- attention ---- */

typedef struct {
    const char *name;
    int64_t B, Tq, Tk, Hq, Hkv, D;
    int q_index, kv_len, segments; /* which masks to pass */
} attn_case;

static const attn_case ATTN_CASES[] = {
    {"GQA causal", 2, 17, 17, 4, 2, 16, 0, 0, 0},
    {"decode Tq=1", 2, 1, 63, 8, 2, 64, 0, 0, 0},
    {"chunk Tq<Tk D17", 1, 3, 65, 3, 3, 17, 0, 0, 0},
    {"q_index+kv_len", 2, 5, 17, 4, 4, 8, 1, 1, 0},
    {"segments MQA", 2, 63, 63, 4, 1, 32, 0, 0, 1},
    {"segments+kv_len", 1, 17, 17, 2, 1, 16, 0, 1, 1},
    {"single token", 1, 1, 1, 2, 1, 4, 0, 0, 0},
    {"long 130", 1, 130, 130, 2, 1, 64, 0, 0, 0},
};

typedef struct {
    tp q, k, v, qi, kl, seg;
    at_attn_params ph, pd;
} attn_in;

static void attn_make(attn_in *a, const attn_case *c, at_dtype dt)
{
    memset(a, 0, sizeof *a);
    a->q = in_rand(dt, 4, SH(c->B, c->Tq, c->Hq, c->D), "q", -2, 2);
    a->k = in_rand(dt, 4, SH(c->B, c->Tk, c->Hkv, c->D), "k", -2, 2);
    a->v = in_rand(dt, 4, SH(c->B, c->Tk, c->Hkv, c->D), "v", -1, 1);
    a->ph.scale = a->pd.scale = (float)(1.0 / sqrt((double)c->D));
    int32_t buf[2 * 130];
    if (c->q_index) { /* arbitrary limits, one query (-1) with no visible key */
        for (int64_t i = 0; i < c->B * c->Tq; i++) buf[i] = i == 1 ? -1 : irand(0, (int)c->Tk);
        a->qi = in_idx(2, SH(c->B, c->Tq), "q_index", buf);
        a->ph.q_index = a->qi.h;
        a->pd.q_index = a->qi.d;
    }
    if (c->kv_len) {
        for (int64_t b = 0; b < c->B; b++) buf[b] = b == 0 ? (int32_t)c->Tk : irand(1, (int)c->Tk);
        if (c->B == 1) buf[0] = (int32_t)(c->Tk - 3); /* trailing padding */
        a->kl = in_idx(1, &c->B, "kv_len", buf);
        a->ph.kv_len = a->kl.h;
        a->pd.kv_len = a->kl.d;
    }
    if (c->segments) { /* packed samples of random lengths */
        for (int64_t b = 0; b < c->B; b++) {
            int id = 0, left = irand(1, 25);
            for (int64_t t = 0; t < c->Tk; t++) {
                if (left-- == 0) id++, left = irand(1, 25);
                buf[b * c->Tk + t] = id;
            }
        }
        a->seg = in_idx(2, SH(c->B, c->Tk), "segments", buf);
        a->ph.segments = a->seg.h;
        a->pd.segments = a->seg.d;
    }
}

static void attn_free(attn_in *a)
{
    tp *all[] = {&a->q, &a->k, &a->v, &a->qi, &a->kl, &a->seg};
    for (int i = 0; i < 6; i++) tp_free(all[i]);
}

static void test_attention(void)
{
    static const at_dtype combos[][2] = {{F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    size_t ncase = sizeof ATTN_CASES / sizeof ATTN_CASES[0];
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype ti = combos[c][0], to = combos[c][1];
        char dt[48];
        snprintf(dt, sizeof dt, "%s->%s", dn(ti), dn(to));
        begin("attention_forward", dt);
        for (size_t i = 0; i < ncase; i++) {
            const attn_case *ac = &ATTN_CASES[i];
            attn_in a;
            attn_make(&a, ac, ti);
            int64_t nl = ac->B * ac->Hq * ac->Tq;
            tp O = out_new(to, 4, SH(ac->B, ac->Tq, ac->Hq, ac->D), "out", POISON, 0, 0);
            tp L = out_new(F32, 1, &nl, "lse", POISON, 0, 0);
            int with_lse = i != 0; /* lse may be NULL */
            CHECK_OK(at_ref_attention_forward(O.h, with_lse ? L.h : NULL, a.q.h, a.k.h, a.v.h, &a.ph));
            if (called(at_attention_forward(O.d, with_lse ? L.d : NULL, a.q.d, a.k.d, a.v.d, &a.pd), ac->name)) {
                compare(&O, ac->name, "out");
                if (with_lse) compare(&L, ac->name, "lse");
            }
            tp_free(&O);
            tp_free(&L);
            attn_free(&a);
        }
        end();

        begin("attention_backward", dt);
        for (size_t i = 0; i < ncase; i++) {
            const attn_case *ac = &ATTN_CASES[i];
            attn_in a;
            attn_make(&a, ac, ti);
            int64_t nl = ac->B * ac->Hq * ac->Tq;
            /* out (in dtype `to`) and lse from the reference forward, the same for both */
            tp O = {host_new(to, 4, SH(ac->B, ac->Tq, ac->Hq, ac->D), "out"), NULL};
            tp L = {host_new(F32, 1, &nl, "lse"), NULL};
            CHECK_OK(at_ref_attention_forward(O.h, L.h, a.q.h, a.k.h, a.v.h, &a.ph));
            O.d = dev_copy(O.h);
            L.d = dev_copy(L.h);
            tp DO = in_rand(to, 4, SH(ac->B, ac->Tq, ac->Hq, ac->D), "dout", -1, 1);
            tp DQ = out_new(to, 4, SH(ac->B, ac->Tq, ac->Hq, ac->D), "dq", POISON, 0, 0);
            tp DK = out_new(to, 4, SH(ac->B, ac->Tk, ac->Hkv, ac->D), "dk", POISON, 0, 0);
            tp DV = out_new(to, 4, SH(ac->B, ac->Tk, ac->Hkv, ac->D), "dv", POISON, 0, 0);
            CHECK_OK(at_ref_attention_backward(DQ.h, DK.h, DV.h, DO.h, a.q.h, a.k.h, a.v.h, O.h, L.h, &a.ph));
            if (called(at_attention_backward(DQ.d, DK.d, DV.d, DO.d, a.q.d, a.k.d, a.v.d, O.d, L.d, &a.pd),
                       ac->name)) {
                compare(&DQ, ac->name, "dq");
                compare(&DK, ac->name, "dk");
                compare(&DV, ac->name, "dv");
            }
            tp *all[] = {&O, &L, &DO, &DQ, &DK, &DV};
            for (int j = 0; j < 6; j++) tp_free(all[j]);
            attn_free(&a);
        }
        end();
    }
}

/* ---- swiglu ---- */

static void test_swiglu(void)
{
    static const at_dtype combos[][2] = {{F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    static const int64_t shapes[][2] = {{1, 1}, {3, 17}, {63, 65}, {1, 1000}, {5, 1000}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype ti = combos[c][0], to = combos[c][1];
        char dt[48], desc[64];
        snprintf(dt, sizeof dt, "%s->%s", dn(ti), dn(to));
        begin("swiglu_forward", dt);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tp Gt = in_rand(ti, 2, shapes[s], "gate", -8, 8), U = in_rand(ti, 2, shapes[s], "up", -2, 2);
            tp Y = out_new(to, 2, shapes[s], "y", POISON, 0, 0);
            snprintf(desc, sizeof desc, "%lldx%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
            CHECK_OK(at_ref_swiglu_forward(Y.h, Gt.h, U.h));
            if (called(at_swiglu_forward(Y.d, Gt.d, U.d), desc)) compare(&Y, desc, "y");
            tp_free(&Gt);
            tp_free(&U);
            tp_free(&Y);
        }
        end();
        begin("swiglu_backward", dt);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tp Gt = in_rand(ti, 2, shapes[s], "gate", -8, 8), U = in_rand(ti, 2, shapes[s], "up", -2, 2);
            tp DY = in_rand(to, 2, shapes[s], "dy", -1, 1);
            tp DG = out_new(to, 2, shapes[s], "dgate", POISON, 0, 0), DU = out_new(to, 2, shapes[s], "dup", POISON, 0, 0);
            snprintf(desc, sizeof desc, "%lldx%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
            CHECK_OK(at_ref_swiglu_backward(DG.h, DU.h, DY.h, Gt.h, U.h));
            if (called(at_swiglu_backward(DG.d, DU.d, DY.d, Gt.d, U.d), desc)) {
                compare(&DG, desc, "dgate");
                compare(&DU, desc, "dup");
            }
            tp *all[] = {&Gt, &U, &DY, &DG, &DU};
            for (int j = 0; j < 5; j++) tp_free(all[j]);
        }
        end();
    }
}

/* ---- gelu ---- */

static void test_gelu(void)
{
    static const at_dtype combos[][2] = {{F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    /* No tiny tensors: gelu' is a cancellation of O(1) terms at its root (x ≈ −0.75) and in the
     * negative tail (tanh's 1 + t as t → −1), so an f32 kernel's absolute error is up to
     * ~4ε(1 + |x|)|dy| ≈ 2e-6 here, whatever the value. Over ≥ 33 elements drawn in [−6, 6],
     * max |reference| is ≥ 0.5 but with negligible chance, which keeps that within 1e-5 of it;
     * over one or a few elements it can be the whole of max |reference|. */
    static const int64_t shapes[][2] = {{1, 33}, {3, 17}, {63, 65}, {5, 1000}};
    static const char *kinds[] = {"erf", "tanh", "quick"};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        at_dtype ti = combos[c][0], to = combos[c][1];
        for (int kind = AT_GELU_ERF; kind <= AT_GELU_QUICK; kind++) {
            char dt[48], desc[64];
            snprintf(dt, sizeof dt, "%s %s->%s", kinds[kind], dn(ti), dn(to));
            for (int pass = 0; pass < 2; pass++) {
                begin(pass ? "gelu_backward" : "gelu_forward", dt);
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                    tp X = in_rand(ti, 2, shapes[s], "x", -6, 6);
                    snprintf(desc, sizeof desc, "%lldx%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
                    if (!pass) {
                        tp Y = out_new(to, 2, shapes[s], "y", POISON, 0, 0);
                        CHECK_OK(at_ref_gelu_forward(Y.h, X.h, kind));
                        if (called(at_gelu_forward(Y.d, X.d, kind), desc)) compare(&Y, desc, "y");
                        tp_free(&Y);
                    } else {
                        tp DY = in_rand(to, 2, shapes[s], "dy", -1, 1);
                        tp DX = out_new(to, 2, shapes[s], "dx", POISON, 0, 0);
                        CHECK_OK(at_ref_gelu_backward(DX.h, DY.h, X.h, kind));
                        if (called(at_gelu_backward(DX.d, DY.d, X.d, kind), desc)) compare(&DX, desc, "dx");
                        tp_free(&DY);
                        tp_free(&DX);
                    }
                    tp_free(&X);
                }
                end();
            }
        }
    }
}

/* ---- embedding ---- */

static void test_embedding(void)
{
    static const at_dtype combos[][2] = {/* table, y */ {F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    static const int64_t shapes[][3] = {/* V, D, N */ {1, 1, 1}, {17, 3, 63}, {1000, 65, 17}, {63, 130, 200}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        char dt[48], desc[64];
        snprintf(dt, sizeof dt, "%s->%s", dn(combos[c][0]), dn(combos[c][1]));
        for (int pass = 0; pass < 2; pass++) {
            begin(pass ? "embedding_backward" : "embedding_forward", dt);
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                int64_t V = shapes[s][0], D = shapes[s][1], N = shapes[s][2];
                int32_t *iv = malloc((size_t)N * sizeof *iv);
                for (int64_t i = 0; i < N; i++) iv[i] = irand(0, (int)V); /* repeats when N > V */
                if (N > 2) iv[N - 1] = (int32_t)(V - 1), iv[0] = 0;
                /* ids 2-D [N/.., ..] when N is even */
                tp I = N % 2 == 0 ? in_idx(2, SH(2, N / 2), "ids", iv) : in_idx(1, &N, "ids", iv);
                free(iv);
                snprintf(desc, sizeof desc, "V%lld D%lld N%lld", (long long)V, (long long)D, (long long)N);
                if (!pass) {
                    tp T = in_rand(combos[c][0], 2, SH(V, D), "table", -1, 1);
                    tp Y = out_new(combos[c][1], 2, SH(N, D), "y", POISON, 0, 0);
                    CHECK_OK(at_ref_embedding_forward(Y.h, I.h, T.h));
                    if (called(at_embedding_forward(Y.d, I.d, T.d), desc)) compare(&Y, desc, "y");
                    tp_free(&T);
                    tp_free(&Y);
                } else { /* dtable (dtype of y) += scatter of dy (dtype of table) */
                    tp DY = in_rand(combos[c][0], 2, SH(N, D), "dy", -1, 1);
                    tp DT = out_new(combos[c][1], 2, SH(V, D), "dtable", RANDOM, -1, 1);
                    CHECK_OK(at_ref_embedding_backward(DT.h, DY.h, I.h));
                    if (called(at_embedding_backward(DT.d, DY.d, I.d), desc)) compare(&DT, desc, "dtable");
                    tp_free(&DY);
                    tp_free(&DT);
                }
                tp_free(&I);
            }
            end();
        }
    }
}

/* ---- cross-entropy: ignored labels, grad_scale, dlogits NULL / separate / in place ---- */

static void test_cross_entropy(void)
{
    static const at_dtype combos[][2] = {/* logits, dlogits */ {F32, F32}, {BF16, BF16}, {F16, F16}, {BF16, F32}};
    static const int64_t shapes[][3] = {/* B (0: 2-D), T, V */ {0, 1, 1}, {0, 3, 17}, {0, 17, 1000}, {0, 63, 65},
                                        {2, 3, 65}, {0, 4, 5000}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        char dt[48], desc[80];
        snprintf(dt, sizeof dt, "%s->%s", dn(combos[c][0]), dn(combos[c][1]));
        begin("cross_entropy", dt);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int mode = 0; mode < 3; mode++) { /* 0 separate, 1 NULL, 2 in place */
                if (mode == 2 && combos[c][0] != combos[c][1]) continue;
                const int64_t *sh = shapes[s];
                int64_t N = sh[0] ? sh[0] * sh[1] : sh[1], V = sh[2];
                int nd = sh[0] ? 3 : 2;
                const int64_t *ls = sh[0] ? sh : sh + 1;
                int32_t *lv = malloc((size_t)N * sizeof *lv);
                int counted = 0;
                for (int64_t i = 0; i < N; i++) {
                    int r = irand(0, 10);
                    lv[i] = r == 0 ? -100 : r == 1 ? -1 : irand(0, (int)V);
                    if (N == 1) lv[i] = 0;
                    counted += lv[i] >= 0;
                }
                float gs = 1.0f / (float)(counted ? counted : 1);
                tp Lab = sh[0] ? in_idx(2, SH(sh[0], sh[1]), "labels", lv) : in_idx(1, &N, "labels", lv);
                free(lv);
                float spread = s == 3 ? 30.0f : 4.0f; /* confident rows */
                tp X = in_rand(combos[c][0], nd, ls, "logits", -spread, spread);
                tp R = out_new(F32, 1, &N, "row_loss", POISON, 0, 0);
                tp DL = out_new(combos[c][1], nd, ls, "dlogits", POISON, 0, 0);
                snprintf(desc, sizeof desc, "N%lld V%lld %s", (long long)N, (long long)V,
                         mode == 0 ? "dlogits" : mode == 1 ? "no grad" : "in place");
                CHECK_OK(at_ref_cross_entropy(R.h, mode == 1 ? NULL : DL.h, X.h, Lab.h, gs));
                at_tensor *dld = mode == 0 ? DL.d : mode == 1 ? NULL : X.d;
                if (called(at_cross_entropy(R.d, dld, X.d, Lab.d, gs), desc)) {
                    compare(&R, desc, "row_loss");
                    if (dld) compare_t(dld, DL.h, tol_of(combos[c][1]), desc, "dlogits");
                }
                tp *all[] = {&Lab, &X, &R, &DL};
                for (int j = 0; j < 4; j++) tp_free(all[j]);
            }
        end();
    }
}

/* Rows that are not all finite, as PyTorch's F.cross_entropy (the
 * reference computes in double what it does): a +inf or a NaN logit, or a
 * row all −inf, makes the row's loss and gradient NaN; −inf logits beside a
 * finite max (masked tokens) get probability 0, and a label on one of them a
 * loss of +inf. The f32 path's one-exp rows hand such rows to the general
 * pass (cpu_loss.c), which no random input reaches. */
static void test_cross_entropy_nonfinite(void)
{
    static const at_dtype dts[] = {F32, BF16};
    enum { N = 6, V = 1000 };
    for (size_t c = 0; c < sizeof dts / sizeof dts[0]; c++) {
        char desc[80];
        begin("cross_entropy non-finite", dn(dts[c]));
        for (int mode = 0; mode < 3; mode++) { /* 0 separate, 1 NULL, 2 in place */
            int64_t n = N;
            int32_t lv[N] = {3, 5, 7, 900, 2, 11};
            tp Lab = in_idx(1, &n, "labels", lv);
            tp X = in_rand(dts[c], 2, SH(N, V), "logits", -4, 4);
            void *x = at_tensor_data(X.h);
            put(x, dts[c], 0 * V + 600, INFINITY);
            put(x, dts[c], 1 * V + 17, NAN);
            for (int64_t i = 0; i < V; i++) put(x, dts[c], 2 * V + i, -INFINITY);
            for (int64_t i = 0; i < V; i += 2) put(x, dts[c], 3 * V + i, -INFINITY); /* the label (900) too */
            for (int64_t i = 1; i < V; i += 3) put(x, dts[c], 5 * V + i, -INFINITY);
            CHECK_OK(at_tensor_upload(X.d, x, at_tensor_nbytes(X.h)));
            tp R = out_new(F32, 1, &n, "row_loss", POISON, 0, 0);
            tp DL = out_new(dts[c], 2, SH(N, V), "dlogits", POISON, 0, 0);
            snprintf(desc, sizeof desc, "%s", mode == 0 ? "dlogits" : mode == 1 ? "no grad" : "in place");
            CHECK_OK(at_ref_cross_entropy(R.h, mode == 1 ? NULL : DL.h, X.h, Lab.h, 0.5f));
            at_tensor *dld = mode == 0 ? DL.d : mode == 1 ? NULL : X.d;
            if (called(at_cross_entropy(R.d, dld, X.d, Lab.d, 0.5f), desc)) {
                compare(&R, desc, "row_loss");
                if (dld) compare_t(dld, DL.h, tol_of(dts[c]), desc, "dlogits");
            }
            tp *all[] = {&Lab, &X, &R, &DL};
            for (int j = 0; j < 4; j++) tp_free(all[j]);
        }
        end();
    }
}

/* ---- AdamW, sumsq ---- */

static void test_adamw_sumsq(void)
{
    static const int64_t sizes[] = {1, 17, 1000, 65 * 63};
    static const int64_t steps[] = {1, 7, 1000};
    begin("adamw", "f32");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t t = 0; t < sizeof steps / sizeof steps[0]; t++) {
            int64_t n = sizes[s];
            at_adamw_params p = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                                 .grad_scale = 0.5f, .step = steps[t]};
            tp P = out_new(F32, 1, &n, "param", RANDOM, -1, 1);
            tp Gr = in_rand(F32, 1, &n, "grad", -2, 2);
            tp M = out_new(F32, 1, &n, "m", RANDOM, -0.1f, 0.1f);
            tp V = out_new(F32, 1, &n, "v", RANDOM, 0.0f, 0.05f);
            if (steps[t] == 1) { /* first step: fresh moments */
                memset(at_tensor_data(M.h), 0, at_tensor_nbytes(M.h));
                memset(at_tensor_data(V.h), 0, at_tensor_nbytes(V.h));
                CHECK_OK(at_tensor_upload(M.d, at_tensor_data(M.h), at_tensor_nbytes(M.h)));
                CHECK_OK(at_tensor_upload(V.d, at_tensor_data(V.h), at_tensor_nbytes(V.h)));
            }
            float *p0 = floats_of(P.h);
            char desc[48];
            snprintf(desc, sizeof desc, "n%lld step %lld", (long long)n, (long long)steps[t]);
            CHECK_OK(at_ref_adamw(P.h, Gr.h, M.h, V.h, &p));
            if (called(at_adamw(P.d, Gr.d, M.d, V.d, &p), desc)) {
                compare(&P, desc, "param");
                compare(&M, desc, "m");
                compare(&V, desc, "v");
                /* The step itself, new − old, to a tighter relative bound than the parameter.
                 * Both new parameters are f32, so the steps carry the rounding of the parameter
                 * (half an ulp, ≤ FLT_EPSILON·|p| with slack) whatever the kernel: when weight decay
                 * and the Adam step nearly cancel, that is most of a small step. So the bound is
                 * TOL·max |Δ| + FLT_EPSILON·max |p|, written as a relative error. */
                float *got = floats_of(P.d), *want = floats_of(P.h);
                if (got && want && p0) {
                    double e = 0, dmax = 0, pmax = 0;
                    for (int64_t i = 0; i < n; i++) {
                        double pi = fabs(want[i]);
                        got[i] -= p0[i], want[i] -= p0[i];
                        double ei = fabs((double)got[i] - want[i]), di = fabs(want[i]);
                        if (pi > pmax) pmax = pi; /* comparisons, not fmax: aarch64 gcc 12 ICEs on such loops */
                        if (ei > e) e = ei;
                        if (di > dmax) dmax = di;
                    }
                    char label[80];
                    snprintf(label, sizeof label, "Δparam %s", desc);
                    record(e / (dmax + FLT_EPSILON * pmax / TOL_ADAMW_STEP + REL_FLOOR), TOL_ADAMW_STEP, label);
                }
                free(got);
                free(want);
            }
            free(p0);
            tp *all[] = {&P, &Gr, &M, &V};
            for (int j = 0; j < 4; j++) tp_free(all[j]);
        }
    end();

    static const at_dtype dts[] = {F32, BF16, F16};
    for (int d = 0; d < 3; d++) {
        begin("sumsq", dn(dts[d]));
        static const int64_t shapes[][2] = {{1, 1}, {1, 17}, {1, 1000}, {63, 65}, {1000, 65}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tp X = in_rand(dts[d], 2, shapes[s], "x", -3, 3);
            tp O = out_new(F32, 1, SH(1), "out", POISON, 0, 0);
            char desc[48];
            snprintf(desc, sizeof desc, "%lldx%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
            CHECK_OK(at_ref_sumsq(O.h, X.h));
            if (called(at_sumsq(O.d, X.d), desc)) {
                compare(&O, desc, "out");
                float v = NAN; /* the scalar read back through the ops API too */
                CHECK_OK(at_read_scalar(O.d, &v));
                CHECK(v == ((float *)at_tensor_data(O.h))[0] || fabs(v - ((float *)at_tensor_data(O.h))[0]) <=
                                                                      1e-5 * fabs(((float *)at_tensor_data(O.h))[0]));
            }
            tp_free(&X);
            tp_free(&O);
        }
        end();
    }
}

/* ---- dropout (counter-based mask) ---- */

static void test_dropout(void)
{
    static const at_dtype dts[] = {F32, BF16, F16};
    static const int64_t sizes[] = {1, 17, 5000, 70001};
    static const float ps[] = {0.0f, 0.1f, 0.5f};
    for (int d = 0; d < 3; d++) {
        begin("dropout", dn(dts[d]));
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
                int64_t n = sizes[s];
                uint64_t seed = rnd(), offset = (uint64_t)k << 40; /* offsets past 2^32 too */
                /* contiguous counters, short runs (a row's tokens), runs longer than a vector */
                int64_t run = (s + k) % 3 == 0 ? 0 : (s + k) % 3 == 1 ? 37 : 4096;
                uint64_t pitch = run ? ((uint64_t)run << 24) + 5 : 0;
                tp X = in_rand(dts[d], 1, &n, "x", -3, 3);
                tp Y = out_new(dts[d], 1, &n, "y", POISON, 0, 0);
                char desc[64];
                snprintf(desc, sizeof desc, "n%lld p%.1f run%lld", (long long)n, (double)ps[k], (long long)run);
                CHECK_OK(at_ref_dropout(Y.h, X.h, ps[k], seed, offset, run, pitch));
                if (called(at_dropout(Y.d, X.d, ps[k], seed, offset, run, pitch), desc)) compare(&Y, desc, "y");
                tp_free(&X);
                tp_free(&Y);
            }
        end();
    }
}

/* ---- the product, then dropout (LoRA's input gradient drop(dU·A)) ---- */

static void test_matmul_dropout(void)
{
    /* K 8 as LoRA's rank at its sizes, a K for the blocked path, one row, a wide C */
    static const int64_t mkn[][3] = {{1, 8, 17}, {512, 8, 896}, {100, 96, 300}, {37, 16, 4864}};
    begin("matmul_dropout", "f32");
    for (size_t s = 0; s < sizeof mkn / sizeof mkn[0]; s++)
        for (int ta = 0; ta < 2; ta++) {
            int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2];
            int64_t run = ta ? N * 3 : 0; /* rows in runs, as LoRA keys them */
            uint64_t seed = rnd(), offset = (uint64_t)s << 40, pitch = run ? (uint64_t)run * 7 + 1 : 0;
            tp A = in_rand(F32, 2, ta ? SH(K, M) : SH(M, K), "A", -1, 1);
            tp B = in_rand(F32, 2, SH(K, N), "B", -1, 1);
            tp C = out_new(F32, 2, SH(M, N), "C", POISON, 0, 0);
            char desc[64];
            snprintf(desc, sizeof desc, "M%lld K%lld N%lld ta%d run%lld", (long long)M, (long long)K, (long long)N,
                     ta, (long long)run);
            CHECK_OK(at_ref_matmul_dropout(C.h, A.h, B.h, ta, 0, 0.5f, 0.1f, seed, offset, run, pitch));
            if (called(at_matmul_dropout(C.d, A.d, B.d, ta, 0, 0.5f, 0.1f, seed, offset, run, pitch), desc))
                compare(&C, desc, "C");
            tp_free(&A);
            tp_free(&B);
            tp_free(&C);
        }
    end();
}

/* ---- the product plus a low-rank term (LoRA's forward) ---- */

static void test_matmul_lowrank(void)
{
    /* LoRA's y = x·Wᵀ + s·u·Bᵀ at its sizes (bf16 W, beta 0 and the residual's
     * 1), one row, a K for the blocked path with W f32, a transposed A */
    static const int64_t mkn[][4] = {{512, 896, 128, 8}, {1, 64, 17, 8}, {100, 300, 96, 1}, {37, 70, 40, 16}};
    begin("matmul_lowrank", "f32");
    for (size_t s = 0; s < sizeof mkn / sizeof mkn[0]; s++)
        for (int v = 0; v < 2; v++) {
            int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2], r = mkn[s][3];
            int ta = s == 3 && v;
            at_dtype wt = s == 0 || v ? BF16 : F32;
            tp A = in_rand(F32, 2, ta ? SH(K, M) : SH(M, K), "A", -1, 1);
            tp W = in_rand(wt, 2, SH(N, K), "W", -1, 1);
            tp U = in_rand(F32, 2, SH(M, r), "u", -1, 1), V = in_rand(F32, 2, SH(N, r), "v", -1, 1);
            tp C = out_new(F32, 2, SH(M, N), "C", RANDOM, -1, 1);
            float beta = v ? 1.0f : 0.0f;
            char desc[80];
            snprintf(desc, sizeof desc, "M%lld K%lld N%lld r%lld W %s ta%d beta%g", (long long)M, (long long)K,
                     (long long)N, (long long)r, dn(wt), ta, (double)beta);
            /* a bf16 W: the product in bf16, A rounded (as test_matmul) */
            at_tensor *ra = wt == BF16 && rounds_to_bf16() ? bf16_rounded(A.h) : A.h;
            CHECK_OK(at_ref_matmul_lowrank(C.h, ra, W.h, ta, 1, 0.5f, beta, U.h, V.h, 2.0f));
            if (ra != A.h) at_tensor_free(ra);
            if (called(at_matmul_lowrank(C.d, A.d, W.d, ta, 1, 0.5f, beta, U.d, V.d, 2.0f), desc)) compare(&C, desc, "C");
            tp_free(&A);
            tp_free(&W);
            tp_free(&U);
            tp_free(&V);
            tp_free(&C);
        }
    end();
}

/* ---- uniform noise added in place (NEFTune), dropout's counters ---- */

static void test_add_uniform_noise(void)
{
    static const at_dtype dts[] = {F32, BF16, F16};
    static const int64_t sizes[] = {1, 17, 5000, 70001};
    static const float ms[] = {0.0f, 0.01f, 0.7f};
    for (int d = 0; d < 3; d++) {
        begin("add_uniform_noise", dn(dts[d]));
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
                int64_t n = sizes[s];
                uint64_t seed = rnd(), offset = (uint64_t)(k + 1) << 40; /* offsets past 2^32 too */
                int64_t run = (s + k) % 3 == 0 ? 0 : (s + k) % 3 == 1 ? 37 : 4096;
                uint64_t pitch = run ? ((uint64_t)run << 24) + 5 : 0;
                /* y is read and written: the same values on both sides */
                tp Y = out_new(dts[d], 1, &n, "y", RANDOM, -3, 3);
                char desc[64];
                snprintf(desc, sizeof desc, "n%lld m%.2f run%lld", (long long)n, (double)ms[k], (long long)run);
                CHECK_OK(at_ref_add_uniform_noise(Y.h, ms[k], seed, offset, run, pitch));
                if (called(at_add_uniform_noise(Y.d, ms[k], seed, offset, run, pitch), desc)) compare(&Y, desc, "y");
                tp_free(&Y);
            }
        end();
    }
}

/* ---- out-of-range indices: the CPU kernel's error on every backend ----
 * A backend may report a bad embedding id or label from the call itself (cpu)
 * or, so as not to make the host wait on every call, from the next download
 * or synchronize (cuda); either way the caller sees exactly the CPU kernel's
 * message, for the first bad call in order, and once only. */

/* The first failure among the calls made so far (s) or else of a synchronize;
 * its message is copied into msg ("" when none). */
static at_status or_sync(at_status s, char *msg, size_t len)
{
    if (s == AT_OK) s = g_be->synchronize(g_be);
    snprintf(msg, len, "%s", s == AT_OK ? "" : at_last_error());
    return s;
}

/* The backend's status and message (want: the CPU kernel's on the host copies). */
static void expect_same_error(at_status got, const char *gmsg, at_status want, const char *wmsg, const char *what)
{
    G.cases++;
    if (got == want && want != AT_OK && strcmp(gmsg, wmsg) == 0) return;
    if (!G.fails++)
        snprintf(G.msg, sizeof G.msg, "%.40s: got %s \"%.90s\", want %s \"%.90s\"", what, at_status_name(got), gmsg,
                 at_status_name(want), wmsg);
}

/* After an error was reported, the next synchronize is clean. */
static void expect_clean_sync(const char *what)
{
    char msg[256];
    at_status s = or_sync(AT_OK, msg, sizeof msg);
    G.cases++;
    if (s != AT_OK && !G.fails++) snprintf(G.msg, sizeof G.msg, "%.40s: reported again: %.180s", what, msg);
}

static void test_index_errors(void)
{
    char got[256], want[256], what[96];
    int64_t V = 10, D = 4, N = 4;
    uint64_t rng = g_rng; /* restored at the end: the other groups' inputs stay as they were */
    begin("index errors", "i32");
    static const int32_t bad_ids[] = {10, -1, 1 << 30, INT32_MIN};
    static const at_dtype tdt[] = {F32, BF16}; /* the backward's two CUDA kernels */
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 4; b++) {
            int32_t iv[4] = {1, bad_ids[b], 2, 11}; /* the first bad one is named */
            tp I = in_idx(1, &N, "input_ids", iv);
            tp T = in_rand(tdt[t], 2, SH(V, D), "embed_tokens", -1, 1);
            tp Y = in_rand(tdt[t], 2, SH(N, D), "hidden", -1, 1);
            snprintf(what, sizeof what, "embedding_forward %s id %d", dn(tdt[t]), bad_ids[b]);
            at_status w = at_embedding_forward(Y.h, I.h, T.h);
            snprintf(want, sizeof want, "%s", at_last_error());
            at_status g = or_sync(at_embedding_forward(Y.d, I.d, T.d), got, sizeof got);
            expect_same_error(g, got, w, want, what);
            expect_clean_sync(what);
            snprintf(what, sizeof what, "embedding_backward %s id %d", dn(tdt[t]), bad_ids[b]);
            w = at_embedding_backward(T.h, Y.h, I.h);
            snprintf(want, sizeof want, "%s", at_last_error());
            g = or_sync(at_embedding_backward(T.d, Y.d, I.d), got, sizeof got);
            expect_same_error(g, got, w, want, what);
            expect_clean_sync(what);
            tp_free(&I);
            tp_free(&T);
            tp_free(&Y);
        }
    static const int32_t bad_labels[] = {10, 11, INT32_MAX};
    for (int b = 0; b < 3; b++)
        for (int mode = 0; mode < 3; mode++) { /* dlogits separate, NULL, in place */
            int32_t lv[4] = {0, -100, bad_labels[b], 12};
            tp L = in_idx(1, &N, "labels", lv);
            tp X = in_rand(F32, 2, SH(N, V), "lm_logits", -4, 4);
            tp R = in_rand(F32, 1, &N, "row_loss", 0, 1);
            tp DL = in_rand(F32, 2, SH(N, V), "dlogits", 0, 1);
            snprintf(what, sizeof what, "cross_entropy label %d mode %d", bad_labels[b], mode);
            at_status w = at_cross_entropy(R.h, mode == 1 ? NULL : mode == 0 ? DL.h : X.h, X.h, L.h, 1.0f);
            snprintf(want, sizeof want, "%s", at_last_error());
            at_status g = or_sync(at_cross_entropy(R.d, mode == 1 ? NULL : mode == 0 ? DL.d : X.d, X.d, L.d, 1.0f),
                                  got, sizeof got);
            expect_same_error(g, got, w, want, what);
            expect_clean_sync(what);
            tp_free(&L);
            tp_free(&X);
            tp_free(&R);
            tp_free(&DL);
        }

    /* several calls before a sync: the first bad call is the error, also when
     * more calls are made than a backend keeps pending (cuda: 64) */
    {
        int32_t good[4] = {0, 1, -100, 9}, badl[4] = {0, -1, 10, 3}, badi[4] = {0, 1, 2, -5};
        tp LG = in_idx(1, &N, "targets", good), LB = in_idx(1, &N, "labels", badl), IB = in_idx(1, &N, "ids", badi);
        tp X = in_rand(F32, 2, SH(N, V), "lm_logits", -4, 4), R = in_rand(F32, 1, &N, "row_loss", 0, 1);
        tp T = in_rand(F32, 2, SH(V, D), "embed_tokens", -1, 1), Y = in_rand(F32, 2, SH(N, D), "hidden", -1, 1);
        at_status w = at_cross_entropy(R.h, NULL, X.h, LB.h, 1.0f);
        snprintf(want, sizeof want, "%s", at_last_error());
        static const int goods[] = {0, 1, 63, 64, 70};
        for (size_t k = 0; k < sizeof goods / sizeof goods[0]; k++) {
            at_status s = AT_OK;
            for (int i = 0; i < goods[k] && s == AT_OK; i++) s = at_cross_entropy(R.d, NULL, X.d, LG.d, 1.0f);
            if (s == AT_OK) s = at_cross_entropy(R.d, NULL, X.d, LB.d, 1.0f);
            for (int i = 0; i < 70 && s == AT_OK; i++) /* later bad calls do not replace it */
                s = i % 2 ? at_cross_entropy(R.d, NULL, X.d, LB.d, 1.0f) : at_embedding_forward(Y.d, IB.d, T.d);
            at_status g = or_sync(s, got, sizeof got);
            snprintf(what, sizeof what, "%d good calls, then bad ones", goods[k]);
            expect_same_error(g, got, w, want, what);
            expect_clean_sync(what);
        }
        tp_free(&LG);
        tp_free(&LB);
        tp_free(&IB);
        tp_free(&X);
        tp_free(&R);
        tp_free(&T);
        tp_free(&Y);
    }
    end();
    g_rng = rng;
}

/* ---- views at element offsets ----
 * Every input and output below is a view of a larger device buffer at an
 * element offset (1 and 3: only 4- or 2-byte aligned), with rows of 64 values:
 * the shapes the CUDA kernels walk with 16-byte vector accesses (and the
 * tensor-core attention loads with them), at addresses where only their
 * element-wise fallback is legal. On a GPU a 16-byte access there fails
 * (cudaErrorMisalignedAddress); everywhere the results must match the
 * reference, which proves the view's offset is honoured. */

/* Replaces p's backend tensor by a view, at element `off`, of a bigger buffer
 * holding NaN before it and p's values from `off` on. */
static void to_view(tp *p, int64_t off)
{
    at_dtype dt = p->d->dtype;
    int64_t n = at_tensor_numel(p->d);
    float *v = floats_of(p->d);
    at_tensor *big = host_new(dt, 1, SH(n + off), "padded"), *bd = NULL, *view = NULL;
    for (int64_t i = 0; i < n + off; i++) put(at_tensor_data(big), dt, i, i < off || !v ? NAN : v[i - off]);
    bd = dev_copy(big);
    if (bd) CHECK_OK(at_tensor_view(bd, (size_t)off, p->d->ndim, p->d->shape, p->d->name, &view));
    free(v);
    at_tensor_free(big);
    at_tensor_free(bd); /* the view holds the buffer */
    at_tensor_free(p->d);
    p->d = view;
}

static void test_views(void)
{
    uint64_t saved_rng = g_rng; /* the other ops' inputs stay what they were without these cases */
    static const at_dtype dts[] = {F32, BF16, F16};
    static const int64_t offs[] = {1, 3};
    const int64_t R = 5, C = 64, sh[2] = {5, 64};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        at_dtype dt = dts[d];
        begin("views", dn(dt));
        for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
            int64_t off = offs[o];
            char desc[80];
            /* add, b broadcast over the rows; axpy; cast to f32 */
            {
                tp A = in_rand(dt, 2, sh, "a", -1, 1), B = in_rand(dt, 1, &C, "b", -1, 1);
                tp Y = out_new(dt, 2, sh, "y", POISON, 0, 0), Z = out_new(dt, 2, sh, "z", RANDOM, -1, 1);
                tp F = out_new(F32, 2, sh, "f", POISON, 0, 0);
                to_view(&A, off), to_view(&B, off), to_view(&Y, off), to_view(&Z, off), to_view(&F, off);
                snprintf(desc, sizeof desc, "add/axpy/cast offset %lld", (long long)off);
                CHECK_OK(at_ref_add(Y.h, A.h, B.h));
                CHECK_OK(at_ref_axpy(Z.h, 0.5f, A.h));
                CHECK_OK(at_ref_cast(F.h, A.h));
                if (called(at_add(Y.d, A.d, B.d), desc)) compare(&Y, desc, "add y");
                if (called(at_axpy(Z.d, 0.5f, A.d), desc)) compare(&Z, desc, "axpy y");
                if (called(at_cast(F.d, A.d), desc)) compare(&F, desc, "cast y");
                tp_free(&A), tp_free(&B), tp_free(&Y), tp_free(&Z), tp_free(&F);
            }
            /* rmsnorm, swiglu, sumsq */
            {
                tp X = in_rand(dt, 2, sh, "x", -3, 3), W = in_rand(dt, 1, &C, "w", 0.5f, 1.5f);
                tp U = in_rand(dt, 2, sh, "up", -2, 2);
                tp Y = out_new(dt, 2, sh, "y", POISON, 0, 0);
                tp G = out_new(dt, 2, sh, "g", POISON, 0, 0), Q = out_new(F32, 1, SH(1), "sumsq", POISON, 0, 0);
                to_view(&X, off), to_view(&W, off), to_view(&U, off), to_view(&Y, off);
                to_view(&G, off);
                snprintf(desc, sizeof desc, "rmsnorm/swiglu/sumsq offset %lld", (long long)off);
                CHECK_OK(at_ref_rmsnorm_forward(Y.h, NULL, X.h, W.h, 1e-5f));
                CHECK_OK(at_ref_swiglu_forward(G.h, X.h, U.h));
                CHECK_OK(at_ref_sumsq(Q.h, X.h));
                if (called(at_rmsnorm_forward(Y.d, NULL, X.d, W.d, 1e-5f), desc)) compare(&Y, desc, "rmsnorm y");
                if (called(at_swiglu_forward(G.d, X.d, U.d), desc)) compare(&G, desc, "swiglu y");
                if (called(at_sumsq(Q.d, X.d), desc)) compare_t(Q.d, Q.h, tol_of(F32), desc, "sumsq");
                tp_free(&X), tp_free(&W), tp_free(&U), tp_free(&Y), tp_free(&G), tp_free(&Q);
            }
            /* cross-entropy: logits and dlogits views */
            {
                int32_t lv[5] = {3, -100, 63, 0, 17};
                tp Lab = in_idx(1, &R, "labels", lv);
                tp X = in_rand(dt, 2, sh, "logits", -4, 4);
                tp L = out_new(F32, 1, &R, "row_loss", POISON, 0, 0), DL = out_new(dt, 2, sh, "dlogits", POISON, 0, 0);
                to_view(&X, off), to_view(&DL, off);
                snprintf(desc, sizeof desc, "cross_entropy offset %lld", (long long)off);
                CHECK_OK(at_ref_cross_entropy(L.h, DL.h, X.h, Lab.h, 0.25f));
                if (called(at_cross_entropy(L.d, DL.d, X.d, Lab.d, 0.25f), desc)) {
                    compare(&L, desc, "row_loss");
                    compare(&DL, desc, "dlogits");
                }
                tp_free(&Lab), tp_free(&X), tp_free(&L), tp_free(&DL);
            }
            /* rope over [T 5, H 2, D 64] and attention with head_dim 64 (the tensor-core shape) */
            {
                int32_t pv[5] = {0, 1, 7, 100, 4095};
                const int64_t half = 32, T = 5;
                tp P = in_idx(1, &T, "pos", pv);
                tp Fq = {host_new(F32, 1, &half, "inv_freq"), NULL};
                for (int64_t i = 0; i < half; i++)
                    ((float *)at_tensor_data(Fq.h))[i] = (float)pow(10000.0, -2.0 * (double)i / 64.0);
                Fq.d = dev_copy(Fq.h);
                tp X = in_rand(dt, 3, SH(5, 2, 64), "x", -2, 2), Y = out_new(dt, 3, SH(5, 2, 64), "y", POISON, 0, 0);
                to_view(&X, off), to_view(&Y, off);
                snprintf(desc, sizeof desc, "rope/attention offset %lld", (long long)off);
                CHECK_OK(at_ref_rope(Y.h, X.h, P.h, Fq.h, NULL, 0));
                if (called(at_rope(Y.d, X.d, P.d, Fq.d, NULL, 0), desc)) compare(&Y, desc, "rope y");
                const int64_t qs[4] = {1, 17, 2, 64}, ks[4] = {1, 17, 1, 64};
                tp Qt = in_rand(dt, 4, qs, "q", -2, 2), K = in_rand(dt, 4, ks, "k", -2, 2);
                tp V = in_rand(dt, 4, ks, "v", -1, 1), O = out_new(dt, 4, qs, "out", POISON, 0, 0);
                to_view(&Qt, off), to_view(&K, off), to_view(&V, off), to_view(&O, off);
                at_attn_params ap;
                memset(&ap, 0, sizeof ap);
                ap.scale = 0.125f;
                CHECK_OK(at_ref_attention_forward(O.h, NULL, Qt.h, K.h, V.h, &ap));
                if (called(at_attention_forward(O.d, NULL, Qt.d, K.d, V.d, &ap), desc)) compare(&O, desc, "attention out");
                tp_free(&P), tp_free(&Fq), tp_free(&X), tp_free(&Y);
                tp_free(&Qt), tp_free(&K), tp_free(&V), tp_free(&O);
            }
        }
        end();
    }
    g_rng = saved_rng;
}

/* Runs every op on `be` (tensors allocated there) against the reference;
 * returns the number of failed checks. */
static int run_backend(at_backend *be)
{
    int before = at_test_failures;
    g_be = be;
    test_matmul();
    test_qmatmul();
    test_elementwise();
    test_cast_fill();
    test_rmsnorm();
    test_layernorm();
    test_rope();
    test_attention();
    test_swiglu();
    test_gelu();
    test_embedding();
    test_cross_entropy();
    test_cross_entropy_nonfinite();
    test_adamw_sumsq();
    test_dropout();
    test_matmul_dropout();
    test_matmul_lowrank();
    test_add_uniform_noise();
    test_views();
    test_index_errors();
    return at_test_failures - before;
}

/* The backends compiled in. Another backend (CUDA) is one more entry: its
 * getter returns NULL when no device is present. */
typedef struct {
    const char *name;
    at_backend *(*get)(void);
    int cpu_isa_levels; /* run once per ISA level of this machine */
} backend_entry;

#ifdef AT_CUDA_EMU_LIBRARY
/* The CUDA backend's sources built against the CUDA emulator (set by CMake),
 * loaded through the same dlopen path as the real library. */
static at_backend *cuda_emu_backend(void)
{
    at_backend *be = NULL;
    at_status st = at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &be);
    CHECK_MSG(st == AT_OK, "loading %s: %s", AT_CUDA_EMU_LIBRARY, at_last_error());
    return st == AT_OK ? be : NULL;
}
#endif

static const backend_entry BACKENDS[] = {
    {"cpu", at_cpu_backend, 1},
    {"cuda", at_test_gpu_backend, 0}, /* a real GPU, when the machine has one */
#ifdef AT_CUDA_EMU_LIBRARY
    {"cuda-emu", cuda_emu_backend, 0},
#endif
};

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep result lines and stderr messages in order */
    printf("conformance: seed %#llx; tolerances: f32 %.0e, f16 %.0e, bf16 %.0e (relative to max |reference|), "
           "cast/fill exact\n",
           (unsigned long long)g_rng, tol_of(F32), tol_of(F16), tol_of(BF16));
    for (size_t b = 0; b < sizeof BACKENDS / sizeof BACKENDS[0]; b++) {
        at_backend *be = BACKENDS[b].get();
        if (!be) {
            printf("%s: no device, skipped\n", BACKENDS[b].name);
            continue;
        }
        if (!BACKENDS[b].cpu_isa_levels) {
            snprintf(g_tag, sizeof g_tag, "%s", be->name);
            double t0 = at_now_seconds();
            int f = run_backend(be);
            printf("[%-14s] %s (%.1f s)\n", g_tag, f ? "DISAGREES with the reference" : "agrees with the reference",
                   at_now_seconds() - t0);
            continue;
        }
        at_cpu_isa top = at_cpu_isa_level();
        for (int l = AT_ISA_SCALAR; l <= (int)top; l++) {
            at_cpu_isa_force((at_cpu_isa)l);
            snprintf(g_tag, sizeof g_tag, "%s/%s", be->name, at_cpu_isa_name((at_cpu_isa)l));
            int f = run_backend(be);
            printf("[%-14s] %s\n", g_tag, f ? "DISAGREES with the reference" : "agrees with the reference");
        }
        at_cpu_isa_force(top);
    }
    return at_test_result("test_conformance");
}
