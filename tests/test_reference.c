/* The reference kernels (device/ref) checked on their own, so the conformance
 * suite compares backends against something known to be right:
 *  - tiny cases computed by hand (values in the comments),
 *  - every backward op against central differences of its forward
 *    (the loss L = Σ dy·y summed in double; f32 tensors, step h = 1e-2),
 *  - rounding of low-precision outputs (round once, to nearest even). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "device/ref/ref_ops.h"
#include "testing.h"

/* ---- small helpers (CPU tensors) ---- */

static at_tensor *mk(at_dtype dt, int ndim, const int64_t *shape, const char *name)
{
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_zeros(at_cpu_backend(), dt, ndim, shape, name, &t));
    return t;
}
static at_tensor *mk1(at_dtype dt, int64_t n, const char *name) { return mk(dt, 1, &n, name); }
static float *F(const at_tensor *t) { return (float *)at_tensor_data(t); }
static int32_t *I(const at_tensor *t) { return (int32_t *)at_tensor_data(t); }
static void setf(at_tensor *t, const float *v) { memcpy(F(t), v, at_tensor_nbytes(t)); }
static void seti(at_tensor *t, const int32_t *v) { memcpy(I(t), v, at_tensor_nbytes(t)); }

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}
static void randf(at_tensor *t, float lo, float hi)
{
    for (int64_t i = 0; i < at_tensor_numel(t); i++) F(t)[i] = frand(lo, hi);
}

/* ---- finite differences ---- */

typedef double (*loss_fn)(void *ctx);

/* Max over the n elements of x of |central difference − grad|, relative to
 * max |grad| (floor 1e-2). The loss is re-evaluated at x ± h. */
static double fd_err(float *x, int64_t n, const float *grad, loss_fn f, void *ctx)
{
    const float h = 1e-2f;
    double maxg = 1e-2, maxd = 0;
    for (int64_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + h;
        double xp = x[i], lp = f(ctx);
        x[i] = x0 - h;
        double xm = x[i], lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / (xp - xm), d = fabs(fd - grad[i]);
        if (fabs(grad[i]) > maxg) maxg = fabs(grad[i]);
        if (d > maxd || isnan(d)) maxd = isnan(d) ? INFINITY : d;
    }
    return maxd / maxg;
}

static double dotf(const at_tensor *a, const at_tensor *b)
{
    double s = 0;
    for (int64_t i = 0; i < at_tensor_numel(a); i++) s += (double)F(a)[i] * F(b)[i];
    return s;
}

#define FD_TOL 5e-4

/* ---- hand-computed cases ---- */

static void test_matmul_hand(void)
{
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s22[2] = {2, 2}, s223[3] = {2, 2, 3}, s222[3] = {2, 2, 2};
    at_tensor *a = mk(AT_F32, 2, s23, "a"), *at = mk(AT_F32, 2, s32, "at"), *b = mk(AT_F32, 2, s32, "b"),
              *bt = mk(AT_F32, 2, s23, "bt"), *c = mk(AT_F32, 2, s22, "c");
    setf(a, (float[]){1, 2, 3, 4, 5, 6});
    setf(at, (float[]){1, 4, 2, 5, 3, 6});
    setf(b, (float[]){7, 8, 9, 10, 11, 12});
    setf(bt, (float[]){7, 9, 11, 8, 10, 12});
    /* [[1,2,3],[4,5,6]]·[[7,8],[9,10],[11,12]] = [[58,64],[139,154]] */
    const float want[4] = {58, 64, 139, 154};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            setf(c, (float[]){NAN, NAN, NAN, NAN}); /* beta = 0 ignores C, even NaN */
            CHECK_OK(at_ref_matmul(c, ta ? at : a, tb ? bt : b, ta, tb, 1.0f, 0.0f));
            for (int i = 0; i < 4; i++) CHECK_MSG(F(c)[i] == want[i], "ta=%d tb=%d c[%d]=%g", ta, tb, i, F(c)[i]);
        }
    /* alpha = 2, beta = -1 on C = 1: 2·C0 − 1 */
    setf(c, (float[]){1, 1, 1, 1});
    CHECK_OK(at_ref_matmul(c, a, b, 0, 0, 2.0f, -1.0f));
    CHECK(F(c)[0] == 115 && F(c)[1] == 127 && F(c)[2] == 277 && F(c)[3] == 307);
    /* batch of 2 A's against one B (broadcast): A[1] = [[1,0,0],[0,0,1]] picks rows 0 and 2 of B */
    at_tensor *a2 = mk(AT_F32, 3, s223, "a2"), *c2 = mk(AT_F32, 3, s222, "c2");
    setf(a2, (float[]){1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 0, 1});
    CHECK_OK(at_ref_matmul(c2, a2, b, 0, 0, 1.0f, 0.0f));
    const float want2[8] = {58, 64, 139, 154, 7, 8, 11, 12};
    for (int i = 0; i < 8; i++) CHECK(F(c2)[i] == want2[i]);
    /* bf16 inputs and output: small integers are exact */
    at_tensor *ab = mk(AT_BF16, 2, s23, "ab"), *bb = mk(AT_BF16, 2, s32, "bb"), *cb = mk(AT_BF16, 2, s22, "cb");
    CHECK_OK(at_ref_cast(ab, a));
    CHECK_OK(at_ref_cast(bb, b));
    CHECK_OK(at_ref_matmul(cb, ab, bb, 0, 0, 1.0f, 0.0f));
    uint16_t *cbp = at_tensor_data(cb);
    /* integers below 256 fit bf16's 8 significant bits */
    CHECK(at_bf16_to_f32(cbp[0]) == 58 && at_bf16_to_f32(cbp[1]) == 64);
    CHECK(at_bf16_to_f32(cbp[2]) == 139 && at_bf16_to_f32(cbp[3]) == 154);
    at_tensor *ts[] = {a, at, b, bt, c, a2, c2, ab, bb, cb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static void test_elementwise_hand(void)
{
    int64_t s23[2] = {2, 3};
    at_tensor *a = mk(AT_F32, 2, s23, "a"), *b = mk1(AT_F32, 3, "b"), *y = mk(AT_F32, 2, s23, "y");
    setf(a, (float[]){1, 2, 3, 4, 5, 6});
    setf(b, (float[]){10, 20, 30});
    CHECK_OK(at_ref_add(y, a, b)); /* row broadcast */
    CHECK(F(y)[0] == 11 && F(y)[2] == 33 && F(y)[3] == 14 && F(y)[5] == 36);
    CHECK_OK(at_ref_add(y, a, a));
    CHECK(F(y)[4] == 10);
    CHECK_OK(at_ref_scale(y, a, -0.5f));
    CHECK(F(y)[0] == -0.5f && F(y)[5] == -3.0f);
    CHECK_OK(at_ref_axpy(y, 2.0f, a)); /* -0.5 a + 2 a = 1.5 a */
    CHECK(F(y)[1] == 3.0f && F(y)[5] == 9.0f);
    CHECK_OK(at_ref_fill(y, 0.25f));
    CHECK(F(y)[0] == 0.25f && F(y)[5] == 0.25f);
    at_tensor *yi = mk1(AT_I32, 3, "yi");
    CHECK_OK(at_ref_fill(yi, 7.0f));
    CHECK(I(yi)[0] == 7 && I(yi)[2] == 7);
    /* sum_rows: [1+4, 2+5, 3+6] + beta·b */
    CHECK_OK(at_ref_sum_rows(b, a, 0.5f));
    CHECK(F(b)[0] == 10 && F(b)[1] == 17 && F(b)[2] == 24);
    setf(b, (float[]){NAN, NAN, NAN});
    CHECK_OK(at_ref_sum_rows(b, a, 0.0f));
    CHECK(F(b)[0] == 5 && F(b)[1] == 7 && F(b)[2] == 9);
    /* sumsq of [1..6] = 91 */
    at_tensor *o = mk1(AT_F32, 1, "o");
    CHECK_OK(at_ref_sumsq(o, a));
    CHECK(F(o)[0] == 91.0f);
    at_tensor *ts[] = {a, b, y, yi, o};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* Round-to-nearest-even, once: the bits are known by hand. */
static void test_rounding(void)
{
    at_tensor *x = mk1(AT_F32, 4, "x"), *yb = mk1(AT_BF16, 4, "yb"), *yh = mk1(AT_F16, 4, "yh");
    /* bf16 keeps 7 fraction bits (ulp 2^-7 at 1): 1+2^-8 is a tie → even 1.0 (0x3F80);
     * 1+3·2^-8 is a tie → even 1+2^-6 (0x3F82); -2 exact (0xC000); 65504 → 65536 (0x4780) */
    setf(x, (float[]){1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.0f, 65504.0f});
    CHECK_OK(at_ref_cast(yb, x));
    uint16_t *pb = at_tensor_data(yb), *ph = at_tensor_data(yh);
    CHECK(pb[0] == 0x3F80 && pb[1] == 0x3F82 && pb[2] == 0xC000 && pb[3] == 0x4780);
    /* f16 keeps 10 fraction bits: 1+2^-8 exact (0x3C04); 1+3·2^-8 exact (0x3C0C); -2 = 0xC000; 65504 = 0x7BFF */
    CHECK_OK(at_ref_cast(yh, x));
    CHECK(ph[0] == 0x3C04 && ph[1] == 0x3C0C && ph[2] == 0xC000 && ph[3] == 0x7BFF);
    /* 1+2^-8 + 2^-30 lies just above the bf16 tie: the exact sum must round up
     * to 1+2^-7 (0x3F81). Rounding first to f32 would land on the tie and give 1.0. */
    at_tensor *a = mk1(AT_F32, 1, "a"), *b = mk1(AT_F32, 1, "b"), *y = mk1(AT_BF16, 1, "y");
    F(a)[0] = 1.0f + 0x1p-8f;
    F(b)[0] = 0x1p-30f;
    CHECK_OK(at_ref_add(y, a, b));
    CHECK(((uint16_t *)at_tensor_data(y))[0] == 0x3F81);
    at_tensor *ts[] = {x, yb, yh, a, b, y};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static void test_norm_rope_swiglu_hand(void)
{
    /* rmsnorm of [3, 4], w = [1, 2], eps = 0: mean x² = 12.5, r = 1/sqrt(12.5) */
    int64_t s12[2] = {1, 2};
    at_tensor *x = mk(AT_F32, 2, s12, "x"), *w = mk1(AT_F32, 2, "w"), *y = mk(AT_F32, 2, s12, "y"),
              *r = mk1(AT_F32, 1, "r");
    setf(x, (float[]){3, 4});
    setf(w, (float[]){1, 2});
    CHECK_OK(at_ref_rmsnorm_forward(y, r, x, w, 0.0f));
    CHECK_NEAR(F(r)[0], 0.28284271, 1e-7);
    CHECK_NEAR(F(y)[0], 0.84852814, 1e-6);
    CHECK_NEAR(F(y)[1], 2.26274170, 1e-6);

    /* rope, D = 4, inv_freq = [1, 0.5], x = [1, 2, 3, 4]; token 0 at pos 0 (identity), token 1 at pos 1:
     * y = [1cos1 − 3sin1, 2cos.5 − 4sin.5, 3cos1 + 1sin1, 4cos.5 + 2sin.5] */
    int64_t s4[3] = {2, 1, 4};
    at_tensor *xr = mk(AT_F32, 3, s4, "xr"), *yr = mk(AT_F32, 3, s4, "yr"), *pos = mk1(AT_I32, 2, "pos"),
              *inv = mk1(AT_F32, 2, "inv");
    setf(xr, (float[]){1, 2, 3, 4, 1, 2, 3, 4});
    seti(pos, (int32_t[]){0, 1});
    setf(inv, (float[]){1.0f, 0.5f});
    CHECK_OK(at_ref_rope(yr, xr, pos, inv, NULL, 0));
    const double want[8] = {1, 2, 3, 4, cos(1.0) - 3 * sin(1.0), 2 * cos(0.5) - 4 * sin(0.5),
                            3 * cos(1.0) + sin(1.0), 4 * cos(0.5) + 2 * sin(0.5)};
    for (int i = 0; i < 8; i++) CHECK_NEAR(F(yr)[i], want[i], 1e-6);
    CHECK_OK(at_ref_rope(yr, yr, pos, inv, NULL, 1)); /* in place, inverse: back to x */
    for (int i = 0; i < 8; i++) CHECK_NEAR(F(yr)[i], F(xr)[i], 1e-6);

    /* swiglu: silu(1)·2 = 2/(1+e^-1) = 1.46211716;  silu(0)·5 = 0;  silu(-2)·1 = -2/(1+e^2) */
    at_tensor *g = mk1(AT_F32, 3, "g"), *u = mk1(AT_F32, 3, "u"), *ys = mk1(AT_F32, 3, "ys");
    setf(g, (float[]){1, 0, -2});
    setf(u, (float[]){2, 5, 1});
    CHECK_OK(at_ref_swiglu_forward(ys, g, u));
    CHECK_NEAR(F(ys)[0], 1.46211716, 1e-6);
    CHECK(F(ys)[1] == 0.0f);
    CHECK_NEAR(F(ys)[2], -0.23840584, 1e-7);
    at_tensor *ts[] = {x, w, y, r, xr, yr, pos, inv, g, u, ys};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* LayerNorm of x = [1, 2, 3, 6], w = [1, 2, 1, 1], b = [0.5, 0, 0, −1], eps = 0:
 * μ = 3, var = (4 + 1 + 0 + 9)/4 = 3.5, r = 1/√3.5 = 0.53452248, x̂ = [−2r, −r, 0, 3r].
 * GELU at 1, −0.5, 2 (Python's math.erf / math.tanh / math.exp of the formulas):
 *   erf   0.841344746  −0.154268769  1.954499736
 *   tanh  0.841191991  −0.154285990  1.954597694
 *   quick 0.845795766  −0.149611563  1.935658623 */
static void test_layernorm_gelu_hand(void)
{
    int64_t s14[2] = {1, 4};
    at_tensor *x = mk(AT_F32, 2, s14, "x"), *w = mk1(AT_F32, 4, "w"), *b = mk1(AT_F32, 4, "b"),
              *y = mk(AT_F32, 2, s14, "y"), *m = mk1(AT_F32, 1, "mean"), *r = mk1(AT_F32, 1, "rstd");
    setf(x, (float[]){1, 2, 3, 6});
    setf(w, (float[]){1, 2, 1, 1});
    setf(b, (float[]){0.5f, 0, 0, -1});
    CHECK_OK(at_ref_layernorm_forward(y, m, r, x, w, b, 0.0f));
    double rs = 1 / sqrt(3.5);
    CHECK_NEAR(F(m)[0], 3.0, 1e-7);
    CHECK_NEAR(F(r)[0], rs, 1e-7);
    const double want[4] = {-2 * rs + 0.5, -2 * rs, 0, 3 * rs - 1};
    for (int i = 0; i < 4; i++) CHECK_NEAR(F(y)[i], want[i], 1e-6);
    CHECK_OK(at_ref_layernorm_forward(y, NULL, NULL, x, w, NULL, 0.0f)); /* no bias */
    CHECK_NEAR(F(y)[0], -2 * rs, 1e-6);

    at_tensor *gx = mk1(AT_F32, 3, "x"), *gy = mk1(AT_F32, 3, "y");
    setf(gx, (float[]){1, -0.5f, 2});
    static const double gw[3][3] = {{0.841344746, -0.154268769, 1.954499736},
                                    {0.841191991, -0.154285990, 1.954597694},
                                    {0.845795766, -0.149611563, 1.935658623}};
    const int kinds[3] = {AT_GELU_ERF, AT_GELU_TANH, AT_GELU_QUICK};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(at_ref_gelu_forward(gy, gx, kinds[k]));
        for (int i = 0; i < 3; i++) CHECK_NEAR(F(gy)[i], gw[k][i], 1e-7);
    }
    at_tensor *ts[] = {x, w, b, y, m, r, gx, gy};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* One head, head_dim 1, scale 1: q = [1, 1], k = [0, ln 3], v = [1, 3].
 * Query 0 sees key 0: out 1, lse 0. Query 1 sees both: p = [1/4, 3/4], out 2.5, lse ln 4. */
static void test_attention_hand(void)
{
    int64_t s[4] = {1, 2, 1, 1}, s1[4] = {1, 1, 1, 1}, sg[4] = {1, 2, 2, 1};
    at_tensor *q = mk(AT_F32, 4, s, "q"), *k = mk(AT_F32, 4, s, "k"), *v = mk(AT_F32, 4, s, "v"),
              *o = mk(AT_F32, 4, s, "o"), *lse = mk1(AT_F32, 2, "lse");
    setf(q, (float[]){1, 1});
    setf(k, (float[]){0, (float)log(3.0)});
    setf(v, (float[]){1, 3});
    at_attn_params p = {.scale = 1.0f};
    CHECK_OK(at_ref_attention_forward(o, lse, q, k, v, &p));
    CHECK_NEAR(F(o)[0], 1.0, 1e-6);
    CHECK_NEAR(F(o)[1], 2.5, 1e-6);
    CHECK_NEAR(F(lse)[0], 0.0, 1e-6);
    CHECK_NEAR(F(lse)[1], log(4.0), 1e-6);
    /* kv_len = 1: query 1 only sees key 0 */
    at_tensor *kvl = mk1(AT_I32, 1, "kv_len"), *qi = mk1(AT_I32, 2, "q_index"), *seg = mk1(AT_I32, 2, "seg");
    seti(kvl, (int32_t[]){1});
    p.kv_len = kvl;
    CHECK_OK(at_ref_attention_forward(o, lse, q, k, v, &p));
    CHECK_NEAR(F(o)[1], 1.0, 1e-6);
    /* kv_len = 0: nothing visible: out 0, lse −inf */
    seti(kvl, (int32_t[]){0});
    CHECK_OK(at_ref_attention_forward(o, lse, q, k, v, &p));
    CHECK(F(o)[0] == 0.0f && F(o)[1] == 0.0f && isinf(F(lse)[0]) && F(lse)[0] < 0);
    p.kv_len = NULL;
    /* q_index = [1, 1]: query 0 sees both keys too */
    seti(qi, (int32_t[]){1, 1});
    p.q_index = qi;
    CHECK_OK(at_ref_attention_forward(o, lse, q, k, v, &p));
    CHECK_NEAR(F(o)[0], 2.5, 1e-6);
    p.q_index = NULL;
    /* segments [0, 1]: query 1 only sees key 1: out 3 */
    seti(seg, (int32_t[]){0, 1});
    p.segments = seg;
    CHECK_OK(at_ref_attention_forward(o, lse, q, k, v, &p));
    CHECK_NEAR(F(o)[0], 1.0, 1e-6);
    CHECK_NEAR(F(o)[1], 3.0, 1e-6);
    p.segments = NULL;
    /* decode: one query (the last position) sees both keys */
    at_tensor *q1 = mk(AT_F32, 4, s1, "q1"), *o1 = mk(AT_F32, 4, s1, "o1");
    F(q1)[0] = 1;
    CHECK_OK(at_ref_attention_forward(o1, NULL, q1, k, v, &p));
    CHECK_NEAR(F(o1)[0], 2.5, 1e-6);
    /* GQA: two query heads share the one k/v head; head 1 has q = 0 → uniform weights */
    at_tensor *qg = mk(AT_F32, 4, sg, "qg"), *og = mk(AT_F32, 4, sg, "og");
    setf(qg, (float[]){1, 0, 1, 0});
    CHECK_OK(at_ref_attention_forward(og, NULL, qg, k, v, &p));
    CHECK_NEAR(F(og)[0], 1.0, 1e-6); /* t0 h0 */
    CHECK_NEAR(F(og)[1], 1.0, 1e-6); /* t0 h1 */
    CHECK_NEAR(F(og)[2], 2.5, 1e-6); /* t1 h0 */
    CHECK_NEAR(F(og)[3], 2.0, 1e-6); /* t1 h1: (1 + 3) / 2 */
    at_tensor *ts[] = {q, k, v, o, lse, kvl, qi, seg, q1, o1, qg, og};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static void test_embedding_ce_hand(void)
{
    int64_t s32[2] = {3, 2}, s23[2] = {2, 3};
    at_tensor *tab = mk(AT_F32, 2, s32, "table"), *ids = mk1(AT_I32, 3, "ids"), *y = mk(AT_F32, 2, s32, "y");
    setf(tab, (float[]){1, 2, 3, 4, 5, 6});
    seti(ids, (int32_t[]){2, 0, 2});
    CHECK_OK(at_ref_embedding_forward(y, ids, tab));
    CHECK(F(y)[0] == 5 && F(y)[1] == 6 && F(y)[2] == 1 && F(y)[3] == 2 && F(y)[4] == 5);
    setf(y, (float[]){1, 1, 1, 1, 1, 1});
    CHECK_OK(at_ref_embedding_backward(tab, y, ids)); /* row 2 gets 2, row 0 gets 1 */
    CHECK(F(tab)[0] == 2 && F(tab)[1] == 3 && F(tab)[2] == 3 && F(tab)[3] == 4 && F(tab)[4] == 7);
    seti(ids, (int32_t[]){0, 3, 1});
    CHECK_FAILS(at_ref_embedding_forward(y, ids, tab), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "ids[1] = 3") != NULL);
    CHECK_FAILS(at_ref_embedding_backward(tab, y, ids), AT_ERR_INVALID);
    CHECK(F(tab)[0] == 2); /* untouched */
    seti(ids, (int32_t[]){0, -1, 1});
    CHECK_FAILS(at_ref_embedding_forward(y, ids, tab), AT_ERR_INVALID);

    /* cross-entropy, rows ln[1,2,5] with label 2 and label −100 (ignored):
     * loss = ln 8 − ln 5, dlogits = 0.5 · ([1, 2, 5]/8 − [0, 0, 1]) */
    at_tensor *lg = mk(AT_F32, 2, s23, "logits"), *lab = mk1(AT_I32, 2, "labels"), *rl = mk1(AT_F32, 2, "rl"),
              *dl = mk(AT_F32, 2, s23, "dl");
    setf(lg, (float[]){0.0f, (float)log(2.0), (float)log(5.0), 9, 9, 9});
    seti(lab, (int32_t[]){2, -100});
    CHECK_OK(at_ref_cross_entropy(rl, dl, lg, lab, 0.5f));
    CHECK_NEAR(F(rl)[0], log(8.0 / 5.0), 1e-6);
    CHECK(F(rl)[1] == 0.0f);
    CHECK_NEAR(F(dl)[0], 0.0625, 1e-7);
    CHECK_NEAR(F(dl)[1], 0.125, 1e-7);
    CHECK_NEAR(F(dl)[2], -0.1875, 1e-7);
    CHECK(F(dl)[3] == 0.0f && F(dl)[4] == 0.0f && F(dl)[5] == 0.0f);
    CHECK_OK(at_ref_cross_entropy(rl, NULL, lg, lab, 0.5f)); /* no gradient */
    CHECK_NEAR(F(rl)[0], log(8.0 / 5.0), 1e-6);
    CHECK_OK(at_ref_cross_entropy(rl, lg, lg, lab, 0.5f)); /* in place */
    for (int i = 0; i < 6; i++) CHECK(F(lg)[i] == F(dl)[i]);
    seti(lab, (int32_t[]){3, 0});
    CHECK_FAILS(at_ref_cross_entropy(rl, dl, lg, lab, 1.0f), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "labels[0] = 3") != NULL);
    at_tensor *ts[] = {tab, ids, y, lg, lab, rl, dl};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* AdamW, written out: at step 1 m̂ = g, v̂ = g², so the update is lr·g/(|g| + eps);
 * at step 2, m = β1(1−β1)g1 + (1−β1)g2, v = β2(1−β2)g1² + (1−β2)g2². */
static void test_adamw_hand(void)
{
    at_tensor *p = mk1(AT_F32, 2, "p"), *g = mk1(AT_F32, 2, "g"), *m = mk1(AT_F32, 2, "m"),
              *v = mk1(AT_F32, 2, "v");
    setf(p, (float[]){1.0f, -2.0f});
    setf(g, (float[]){0.5f, -4.0f}); /* times grad_scale 0.5: 0.25, -2 */
    at_adamw_params ap = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.01f,
                          .grad_scale = 0.5f, .step = 1};
    CHECK_OK(at_ref_adamw(p, g, m, v, &ap));
    double lr = 0.1f, wd = 0.01f, eps = 1e-8f, b1 = 0.9f, b2 = 0.99f;
    double p1a = 1.0 * (1 - lr * wd) - lr * 0.25 / (0.25 + eps);
    double p1b = -2.0 * (1 - lr * wd) - lr * -2.0 / (2.0 + eps);
    CHECK_NEAR(F(p)[0], p1a, 1e-6);
    CHECK_NEAR(F(p)[1], p1b, 1e-6);
    CHECK_NEAR(F(m)[0], (1 - b1) * 0.25, 1e-7);
    CHECK_NEAR(F(v)[1], (1 - b2) * 4.0, 1e-7);
    /* step 2 with g2 = [-1, 1] (after grad_scale) */
    setf(g, (float[]){-2.0f, 2.0f});
    ap.step = 2;
    CHECK_OK(at_ref_adamw(p, g, m, v, &ap));
    double g1[2] = {0.25, -2.0}, g2[2] = {-1.0, 1.0}, p1[2] = {p1a, p1b};
    for (int i = 0; i < 2; i++) {
        double m2 = b1 * (1 - b1) * g1[i] + (1 - b1) * g2[i];
        double v2 = b2 * (1 - b2) * g1[i] * g1[i] + (1 - b2) * g2[i] * g2[i];
        double want = p1[i] * (1 - lr * wd) - lr * (m2 / (1 - b1 * b1)) / (sqrt(v2 / (1 - b2 * b2)) + eps);
        CHECK_NEAR(F(p)[i], want, 1e-6);
        CHECK_NEAR(F(m)[i], m2, 1e-7);
    }
    at_tensor *ts[] = {p, g, m, v};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* ---- backward ops against finite differences ---- */

typedef struct {
    at_tensor *y, *x, *w, *dy, *g, *u, *pos, *inv, *ids;
} fd_ctx;

static double loss_rmsnorm(void *c)
{
    fd_ctx *k = c;
    if (at_ref_rmsnorm_forward(k->y, NULL, k->x, k->w, 1e-5f) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

static void test_rmsnorm_fd(void)
{
    int64_t s[3] = {2, 3, 7};
    fd_ctx k = {.y = mk(AT_F32, 3, s, "y"), .x = mk(AT_F32, 3, s, "x"), .w = mk1(AT_F32, 7, "w"),
                .dy = mk(AT_F32, 3, s, "dy")};
    at_tensor *r = mk1(AT_F32, 6, "rstd"), *dx = mk(AT_F32, 3, s, "dx"), *dw = mk1(AT_F32, 7, "dw");
    randf(k.x, -2, 2);
    randf(k.w, 0.5f, 1.5f);
    randf(k.dy, -1, 1);
    for (int i = 0; i < 7; i++) F(dw)[i] = 0.5f; /* dw is accumulated into */
    CHECK_OK(at_ref_rmsnorm_forward(k.y, r, k.x, k.w, 1e-5f));
    CHECK_OK(at_ref_rmsnorm_backward(dx, dw, k.dy, k.x, k.w, r));
    for (int i = 0; i < 7; i++) F(dw)[i] -= 0.5f;
    double ex = fd_err(F(k.x), 42, F(dx), loss_rmsnorm, &k), ew = fd_err(F(k.w), 7, F(dw), loss_rmsnorm, &k);
    printf("fd rmsnorm_backward   dx %.2e  dw %.2e\n", ex, ew);
    CHECK(ex < FD_TOL);
    CHECK(ew < FD_TOL);
    CHECK_OK(at_ref_rmsnorm_backward(dx, NULL, k.dy, k.x, k.w, r)); /* frozen weight */
    at_tensor *ts[] = {k.y, k.x, k.w, k.dy, r, dx, dw};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static double loss_swiglu(void *c)
{
    fd_ctx *k = c;
    if (at_ref_swiglu_forward(k->y, k->g, k->u) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

static void test_swiglu_fd(void)
{
    int64_t n = 17;
    fd_ctx k = {.y = mk1(AT_F32, n, "y"), .g = mk1(AT_F32, n, "g"), .u = mk1(AT_F32, n, "u"),
                .dy = mk1(AT_F32, n, "dy")};
    at_tensor *dg = mk1(AT_F32, n, "dg"), *du = mk1(AT_F32, n, "du");
    randf(k.g, -4, 4);
    randf(k.u, -2, 2);
    randf(k.dy, -1, 1);
    CHECK_OK(at_ref_swiglu_backward(dg, du, k.dy, k.g, k.u));
    double eg = fd_err(F(k.g), n, F(dg), loss_swiglu, &k), eu = fd_err(F(k.u), n, F(du), loss_swiglu, &k);
    printf("fd swiglu_backward    dgate %.2e  dup %.2e\n", eg, eu);
    CHECK(eg < FD_TOL);
    CHECK(eu < FD_TOL);
    at_tensor *ts[] = {k.y, k.g, k.u, k.dy, dg, du};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static double loss_layernorm(void *c)
{
    fd_ctx *k = c;
    if (at_ref_layernorm_forward(k->y, NULL, NULL, k->x, k->w, k->u, 1e-5f) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

/* The bias rides in fd_ctx's u. */
static void test_layernorm_fd(void)
{
    int64_t s[3] = {2, 3, 7};
    fd_ctx k = {.y = mk(AT_F32, 3, s, "y"), .x = mk(AT_F32, 3, s, "x"), .w = mk1(AT_F32, 7, "w"),
                .u = mk1(AT_F32, 7, "b"), .dy = mk(AT_F32, 3, s, "dy")};
    at_tensor *m = mk1(AT_F32, 6, "mean"), *r = mk1(AT_F32, 6, "rstd"), *dx = mk(AT_F32, 3, s, "dx"),
              *dw = mk1(AT_F32, 7, "dw"), *db = mk1(AT_F32, 7, "db");
    randf(k.x, -2, 3);
    randf(k.w, 0.5f, 1.5f);
    randf(k.u, -1, 1);
    randf(k.dy, -1, 1);
    for (int i = 0; i < 7; i++) F(dw)[i] = F(db)[i] = 0.5f; /* accumulated into */
    CHECK_OK(at_ref_layernorm_forward(k.y, m, r, k.x, k.w, k.u, 1e-5f));
    CHECK_OK(at_ref_layernorm_backward(dx, dw, db, k.dy, k.x, k.w, m, r));
    for (int i = 0; i < 7; i++) F(dw)[i] -= 0.5f, F(db)[i] -= 0.5f;
    double ex = fd_err(F(k.x), 42, F(dx), loss_layernorm, &k), ew = fd_err(F(k.w), 7, F(dw), loss_layernorm, &k),
           eb = fd_err(F(k.u), 7, F(db), loss_layernorm, &k);
    printf("fd layernorm_backward dx %.2e  dw %.2e  db %.2e\n", ex, ew, eb);
    CHECK(ex < FD_TOL);
    CHECK(ew < FD_TOL);
    CHECK(eb < FD_TOL);
    CHECK_OK(at_ref_layernorm_backward(dx, NULL, NULL, k.dy, k.x, k.w, m, r)); /* frozen */
    at_tensor *ts[] = {k.y, k.x, k.w, k.u, k.dy, m, r, dx, dw, db};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static int g_gelu_kind;
static double loss_gelu(void *c)
{
    fd_ctx *k = c;
    if (at_ref_gelu_forward(k->y, k->x, g_gelu_kind) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

static void test_gelu_fd(void)
{
    int64_t n = 17;
    fd_ctx k = {.y = mk1(AT_F32, n, "y"), .x = mk1(AT_F32, n, "x"), .dy = mk1(AT_F32, n, "dy")};
    at_tensor *dx = mk1(AT_F32, n, "dx");
    randf(k.x, -4, 4);
    randf(k.dy, -1, 1);
    static const char *names[] = {"erf", "tanh", "quick"};
    for (int kind = AT_GELU_ERF; kind <= AT_GELU_QUICK; kind++) {
        g_gelu_kind = kind;
        CHECK_OK(at_ref_gelu_backward(dx, k.dy, k.x, kind));
        double e = fd_err(F(k.x), n, F(dx), loss_gelu, &k);
        printf("fd gelu_backward %-5s dx %.2e\n", names[kind], e);
        CHECK(e < FD_TOL);
    }
    at_tensor *ts[] = {k.y, k.x, k.dy, dx};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

/* Rotary embeddings with several position components against torch
 * (tools/make_rope_sections_goldens.py: Qwen2-VL's multimodal RoPE and its vision
 * tower's 2-D RoPE as transformers computes them). Both sides form each
 * angle as the same f32 product; torch's f32 cos/sin and products leave
 * ~1e-6 on values of size ~3. */
static void test_rope_sections_golden(void)
{
    char *text = NULL;
    cJSON *root = NULL;
    CHECK_OK(at_read_file("tests/data/ops/rope_sections.json", &text, NULL));
    root = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(root != NULL, "tests/data/ops/rope_sections.json does not parse");
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
    {
        const cJSON *secs = cJSON_GetObjectItem(c, "sections"), *inv = cJSON_GetObjectItem(c, "inv_freq"),
                    *pos = cJSON_GetObjectItem(c, "pos"), *xs = cJSON_GetObjectItem(c, "x"), *ys = cJSON_GetObjectItem(c, "y");
        at_rope_sections sec = {cJSON_GetArraySize(secs), {0}, 0};
        int64_t half = cJSON_GetArraySize(inv), D = 2 * half, ntok = cJSON_GetArraySize(pos) / sec.n;
        int64_t H = cJSON_GetArraySize(xs) / (ntok * D), shape[3] = {ntok, H, D}, np = cJSON_GetArraySize(pos);
        for (int k = 0; k < sec.n; k++) sec.len[k] = cJSON_GetArrayItem(secs, k)->valueint;
        at_tensor *x = mk(AT_F32, 3, shape, "x"), *y = mk(AT_F32, 3, shape, "y"), *p = mk1(AT_I32, np, "pos"),
                  *f = mk1(AT_F32, half, "inv_freq");
        for (int64_t i = 0; i < np; i++) I(p)[i] = cJSON_GetArrayItem(pos, (int)i)->valueint;
        for (int64_t i = 0; i < half; i++) F(f)[i] = (float)cJSON_GetArrayItem(inv, (int)i)->valuedouble;
        for (int64_t i = 0; i < at_tensor_numel(x); i++) F(x)[i] = (float)cJSON_GetArrayItem(xs, (int)i)->valuedouble;
        CHECK_OK(at_ref_rope(y, x, p, f, &sec, 0));
        double worst = 0;
        for (int64_t i = 0; i < at_tensor_numel(y); i++) {
            double e = fabs(F(y)[i] - cJSON_GetArrayItem(ys, (int)i)->valuedouble);
            if (e > worst) worst = e;
        }
        printf("rope sections %-24s max |ref - torch| %.2e\n", cJSON_GetObjectItem(c, "name")->valuestring, worst);
        CHECK_MSG(worst < 1e-5, "%s: %.3g", cJSON_GetObjectItem(c, "name")->valuestring, worst);
        CHECK_OK(at_ref_rope(y, y, p, f, &sec, 1)); /* the inverse brings x back */
        for (int64_t i = 0; i < at_tensor_numel(y); i++) CHECK_NEAR(F(y)[i], F(x)[i], 1e-5);
        at_tensor *ts[] = {x, y, p, f};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
        ncases++;
    }
    CHECK(ncases == 4);
    cJSON_Delete(root);
    free(text);
}

static double loss_rope(void *c)
{
    fd_ctx *k = c;
    if (at_ref_rope(k->y, k->x, k->pos, k->inv, NULL, 0) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

/* The backward of rope is rope⁻¹: dx = rope(dy, inverse = 1). */
static void test_rope_fd(void)
{
    int64_t s[4] = {2, 3, 2, 6};
    fd_ctx k = {.y = mk(AT_F32, 4, s, "y"), .x = mk(AT_F32, 4, s, "x"), .dy = mk(AT_F32, 4, s, "dy"),
                .pos = mk1(AT_I32, 6, "pos"), .inv = mk1(AT_F32, 3, "inv_freq")};
    at_tensor *dx = mk(AT_F32, 4, s, "dx");
    randf(k.x, -1, 1);
    randf(k.dy, -1, 1);
    seti(k.pos, (int32_t[]){0, 1, 2, 7, 100, 3});
    for (int i = 0; i < 3; i++) F(k.inv)[i] = (float)pow(10000.0, -2.0 * i / 6);
    CHECK_OK(at_ref_rope(dx, k.dy, k.pos, k.inv, NULL, 1));
    double e = fd_err(F(k.x), 72, F(dx), loss_rope, &k);
    printf("fd rope inverse       dx %.2e\n", e);
    CHECK(e < FD_TOL);
    at_tensor *ts[] = {k.y, k.x, k.dy, k.pos, k.inv, dx};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

static double loss_embedding(void *c)
{
    fd_ctx *k = c;
    if (at_ref_embedding_forward(k->y, k->ids, k->w) != AT_OK) return NAN;
    return dotf(k->y, k->dy);
}

static void test_embedding_fd(void)
{
    int64_t st[2] = {5, 3}, sy[2] = {4, 3};
    fd_ctx k = {.y = mk(AT_F32, 2, sy, "y"), .w = mk(AT_F32, 2, st, "table"), .dy = mk(AT_F32, 2, sy, "dy"),
                .ids = mk1(AT_I32, 4, "ids")};
    at_tensor *dt = mk(AT_F32, 2, st, "dtable");
    randf(k.w, -1, 1);
    randf(k.dy, -1, 1);
    seti(k.ids, (int32_t[]){3, 0, 3, 4}); /* repeated id: gradients add */
    CHECK_OK(at_ref_embedding_backward(dt, k.dy, k.ids));
    double e = fd_err(F(k.w), 15, F(dt), loss_embedding, &k);
    printf("fd embedding_backward dtable %.2e\n", e);
    CHECK(e < FD_TOL);
    at_tensor *ts[] = {k.y, k.w, k.dy, k.ids, dt};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

typedef struct {
    at_tensor *rl, *logits, *labels;
    float gs;
} ce_ctx;

static double loss_ce(void *c)
{
    ce_ctx *k = c;
    if (at_ref_cross_entropy(k->rl, NULL, k->logits, k->labels, 1.0f) != AT_OK) return NAN;
    double s = 0;
    for (int64_t i = 0; i < at_tensor_numel(k->rl); i++) s += F(k->rl)[i];
    return k->gs * s;
}

/* dlogits is the gradient of grad_scale · Σ row_loss. */
static void test_cross_entropy_fd(void)
{
    int64_t s[2] = {4, 9};
    ce_ctx k = {.rl = mk1(AT_F32, 4, "row_loss"), .logits = mk(AT_F32, 2, s, "logits"),
                .labels = mk1(AT_I32, 4, "labels"), .gs = 0.25f};
    at_tensor *dl = mk(AT_F32, 2, s, "dlogits");
    randf(k.logits, -3, 3);
    seti(k.labels, (int32_t[]){8, -100, 0, 4});
    CHECK_OK(at_ref_cross_entropy(k.rl, dl, k.logits, k.labels, k.gs));
    double e = fd_err(F(k.logits), 36, F(dl), loss_ce, &k);
    printf("fd cross_entropy      dlogits %.2e\n", e);
    CHECK(e < FD_TOL);
    at_tensor *ts[] = {k.rl, k.logits, k.labels, dl};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
}

typedef struct {
    at_tensor *q, *k, *v, *out, *dout;
    at_attn_params p;
} attn_ctx;

static double loss_attn(void *c)
{
    attn_ctx *a = c;
    if (at_ref_attention_forward(a->out, NULL, a->q, a->k, a->v, &a->p) != AT_OK) return NAN;
    return dotf(a->out, a->dout);
}

/* GQA (4 query heads on 2 kv heads); decode-like (Tq < Tk) with the default
 * causal limit, then kv_len, explicit q_index, and packed segments. */
static void test_attention_fd(void)
{
    for (int variant = 0; variant < 4; variant++) {
        int64_t B = 2, Tq = variant == 3 ? 5 : 3, Tk = 5, Hq = 4, Hkv = 2, D = 3;
        int64_t sq[4] = {B, Tq, Hq, D}, sk[4] = {B, Tk, Hkv, D};
        attn_ctx a = {.q = mk(AT_F32, 4, sq, "q"), .k = mk(AT_F32, 4, sk, "k"), .v = mk(AT_F32, 4, sk, "v"),
                      .out = mk(AT_F32, 4, sq, "out"), .dout = mk(AT_F32, 4, sq, "dout")};
        at_tensor *lse = mk1(AT_F32, B * Hq * Tq, "lse"), *dq = mk(AT_F32, 4, sq, "dq"),
                  *dk = mk(AT_F32, 4, sk, "dk"), *dv = mk(AT_F32, 4, sk, "dv");
        at_tensor *kvl = mk1(AT_I32, B, "kv_len"), *qi = mk1(AT_I32, B * Tq, "q_index"),
                  *seg = mk1(AT_I32, B * Tk, "segments");
        randf(a.q, -1.5f, 1.5f);
        randf(a.k, -1.5f, 1.5f);
        randf(a.v, -1, 1);
        randf(a.dout, -1, 1);
        a.p.scale = 0.7f;
        if (variant == 1) {
            seti(kvl, (int32_t[]){3, 5});
            a.p.kv_len = kvl;
        } else if (variant == 2) {
            seti(qi, (int32_t[]){0, 2, 4, 1, 1, 3});
            a.p.q_index = qi;
        } else if (variant == 3) {
            seti(seg, (int32_t[]){0, 0, 1, 1, 1, 0, 1, 1, 2, 2});
            a.p.segments = seg;
        }
        CHECK_OK(at_ref_attention_forward(a.out, lse, a.q, a.k, a.v, &a.p));
        CHECK_OK(at_ref_attention_backward(dq, dk, dv, a.dout, a.q, a.k, a.v, a.out, lse, &a.p));
        double eq = fd_err(F(a.q), at_tensor_numel(a.q), F(dq), loss_attn, &a);
        double ek = fd_err(F(a.k), at_tensor_numel(a.k), F(dk), loss_attn, &a);
        double ev = fd_err(F(a.v), at_tensor_numel(a.v), F(dv), loss_attn, &a);
        static const char *names[] = {"causal Tq<Tk", "kv_len", "q_index", "segments"};
        printf("fd attention_backward %-12s dq %.2e  dk %.2e  dv %.2e\n", names[variant], eq, ek, ev);
        CHECK(eq < FD_TOL);
        CHECK(ek < FD_TOL);
        CHECK(ev < FD_TOL);
        at_tensor *ts[] = {a.q, a.k, a.v, a.out, a.dout, lse, dq, dk, dv, kvl, qi, seg};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) at_tensor_free(ts[i]);
    }
}

int main(void)
{
    test_matmul_hand();
    test_elementwise_hand();
    test_rounding();
    test_norm_rope_swiglu_hand();
    test_layernorm_gelu_hand();
    test_attention_hand();
    test_embedding_ce_hand();
    test_adamw_hand();
    test_rmsnorm_fd();
    test_swiglu_fd();
    test_layernorm_fd();
    test_gelu_fd();
    test_rope_fd();
    test_rope_sections_golden();
    test_embedding_fd();
    test_cross_entropy_fd();
    test_attention_fd();
    return at_test_result("test_reference");
}
