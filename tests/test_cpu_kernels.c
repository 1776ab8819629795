/* Targeted checks of the CPU kernels through the ops API, on every ISA path
 * the machine has (scalar, AVX2, AVX-512). References are computed here in
 * double from the definitions in ops/ops.h (naive softmax(QKᵀ)V attention,
 * the torch.optim.AdamW update written out), and the backward kernels are
 * also checked against finite differences of their forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_kernels.h"
#include "device/cpu/gemm.h"
#include "device/cuda_loader.h"
#include "ops/ops.h"
#include "testing.h"

/* ---- helpers ---- */

static uint64_t rng = 88172645463325252ull;
static double urand(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(2.0 * urand() - 1.0); }

static float round_to(at_dtype t, float x)
{
    if (t == AT_BF16) return at_bf16_to_f32(at_f32_to_bf16(x));
    if (t == AT_F16) return at_f16_to_f32(at_f32_to_f16(x));
    return x;
}

/* A CPU tensor holding vals (rounded to dtype); vals is updated to the rounded values. */
static at_tensor *mk(at_dtype t, int ndim, const int64_t *shape, float *vals)
{
    at_tensor *x = NULL;
    if (at_tensor_new(at_cpu_backend(), t, ndim, shape, "t", &x) != AT_OK) return NULL;
    int64_t n = at_tensor_numel(x);
    void *d = at_tensor_data(x);
    for (int64_t i = 0; i < n; i++) {
        float v = vals ? vals[i] : 0.0f;
        if (t == AT_F32) ((float *)d)[i] = v;
        else if (t == AT_BF16) ((uint16_t *)d)[i] = at_f32_to_bf16(v);
        else if (t == AT_F16) ((uint16_t *)d)[i] = at_f32_to_f16(v);
        if (vals) vals[i] = round_to(t, v);
    }
    return x;
}

static at_tensor *mk_i32(int ndim, const int64_t *shape, const int32_t *vals)
{
    at_tensor *x = NULL;
    if (at_tensor_new(at_cpu_backend(), AT_I32, ndim, shape, "ids", &x) != AT_OK) return NULL;
    memcpy(at_tensor_data(x), vals, (size_t)at_tensor_numel(x) * 4);
    return x;
}

static void get(const at_tensor *x, float *out)
{
    int64_t n = at_tensor_numel(x);
    const void *d = at_tensor_data(x);
    for (int64_t i = 0; i < n; i++) {
        if (x->dtype == AT_F32) out[i] = ((const float *)d)[i];
        else if (x->dtype == AT_BF16) out[i] = at_bf16_to_f32(((const uint16_t *)d)[i]);
        else out[i] = at_f16_to_f32(((const uint16_t *)d)[i]);
    }
}

static float *rnd(int64_t n, float s)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = s * nrand();
    return p;
}

static double max_abs_diff_d(const float *got, const double *want, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static const at_dtype dts[3] = {AT_F32, AT_BF16, AT_F16};
static double tol_of(at_dtype t) { return t == AT_F32 ? 2e-5 : (t == AT_BF16 ? 1e-2 : 2e-3); }

/* ---- elementwise ---- */

static void test_elementwise(void)
{
    for (int ti = 0; ti < 3; ti++) {
        at_dtype t = dts[ti];
        int64_t shp[2] = {37, 1000}; /* 37000 elements: crosses the parallel threshold */
        int64_t n = shp[0] * shp[1];
        float *a = rnd(n, 2), *b = rnd(shp[1], 2), *c = rnd(n, 2), *out = malloc((size_t)n * 4);
        at_tensor *ta = mk(t, 2, shp, a), *tb = mk(AT_F32, 1, &shp[1], b), *tc = mk(t, 2, shp, c);
        at_tensor *ty = mk(AT_F32, 2, shp, NULL);
        /* add with broadcast row */
        CHECK_OK(at_add(ty, ta, tb));
        get(ty, out);
        double md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(out[i] - ((double)a[i] + b[i % shp[1]])));
        CHECK_MSG(md < 1e-5, "add %s: %g", at_dtype_name(t), md);
        /* same-shape add, output in t */
        CHECK_OK(at_add(tc, ta, tc));
        get(tc, out);
        md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(out[i] - round_to(t, a[i] + c[i])));
        CHECK_MSG(md == 0, "add in place %s: %g", at_dtype_name(t), md);
        /* scale in place */
        CHECK_OK(at_scale(ta, ta, -0.5f));
        get(ta, out);
        md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(out[i] - round_to(t, -0.5f * a[i])));
        CHECK_MSG(md == 0, "scale %s: %g", at_dtype_name(t), md);
        /* axpy into y of dtype t: y = round(y + 3x) */
        for (int64_t i = 0; i < n; i++) a[i] = round_to(t, -0.5f * a[i]);
        at_tensor *tx = mk(AT_F32, 2, shp, c);
        CHECK_OK(at_axpy(ta, 3.0f, tx));
        get(ta, out);
        md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(out[i] - round_to(t, fmaf(3.0f, c[i], a[i]))));
        CHECK_MSG(md <= (t == AT_F32 ? 1e-6 : 0.02), "axpy %s: %g", at_dtype_name(t), md);
        /* fill */
        CHECK_OK(at_fill(ta, 1.3f));
        get(ta, out);
        CHECK(out[0] == round_to(t, 1.3f) && out[n - 1] == round_to(t, 1.3f));
        /* sum_rows with beta and with beta = 0 over NaN */
        float *y0 = rnd(shp[1], 1);
        at_tensor *tsr = mk(AT_F32, 1, &shp[1], y0);
        for (int64_t i = 0; i < n; i++) c[i] = round_to(t, c[i]);
        at_tensor *tcc = mk(t, 2, shp, c);
        CHECK_OK(at_sum_rows(tsr, tcc, 0.5f));
        float *sr = malloc((size_t)shp[1] * 4);
        get(tsr, sr);
        md = 0;
        for (int64_t j = 0; j < shp[1]; j++) {
            double s = 0.5 * y0[j];
            for (int64_t r = 0; r < shp[0]; r++) s += c[r * shp[1] + j];
            md = fmax(md, fabs(sr[j] - s));
        }
        CHECK_MSG(md < 1e-4, "sum_rows %s: %g", at_dtype_name(t), md);
        CHECK_OK(at_fill(tsr, NAN));
        CHECK_OK(at_sum_rows(tsr, tcc, 0.0f));
        get(tsr, sr);
        CHECK(!isnan(sr[0]));
        free(sr);
        free(y0);
        at_tensor_free(tsr);
        at_tensor_free(tcc);
        at_tensor_free(tx);
        at_tensor_free(ta);
        at_tensor_free(tb);
        at_tensor_free(tc);
        at_tensor_free(ty);
        free(a);
        free(b);
        free(c);
        free(out);
    }
    /* cast: f32 -> bf16 / f16 rounds to nearest even like the scalar converters,
     * including f16 subnormals and overflow */
    int64_t n = 4099;
    float *x = rnd(n, 100);
    x[0] = 65519.0f;  /* rounds to 65504 */
    x[1] = 65520.0f;  /* rounds to inf */
    x[2] = 3e-6f;     /* f16 subnormal */
    x[3] = 1.0f + 1.0f / 2048; /* tie in f16: to even (1.0) */
    x[4] = 1.0f + 1.0f / 256;  /* tie in bf16: to even (1.0) */
    x[5] = NAN;
    at_tensor *tx = mk(AT_F32, 1, &n, x);
    for (int ti = 1; ti < 3; ti++) {
        at_tensor *ty = mk(dts[ti], 1, &n, NULL);
        CHECK_OK(at_cast(ty, tx));
        const uint16_t *h = at_tensor_data(ty);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint16_t want = dts[ti] == AT_BF16 ? at_f32_to_bf16(x[i]) : at_f32_to_f16(x[i]);
            if (i == 5) bad += !((h[i] & 0x7fff) > (dts[ti] == AT_BF16 ? 0x7f80 : 0x7c00));
            else bad += h[i] != want;
        }
        CHECK_MSG(bad == 0, "cast to %s: %d mismatches", at_dtype_name(dts[ti]), bad);
        /* and back */
        at_tensor *tz = mk(AT_F32, 1, &n, NULL);
        CHECK_OK(at_cast(tz, ty));
        const float *z = at_tensor_data(tz);
        bad = 0;
        for (int64_t i = 6; i < n; i++) bad += z[i] != round_to(dts[ti], x[i]);
        CHECK(bad == 0);
        at_tensor_free(tz);
        at_tensor_free(ty);
    }
    at_tensor_free(tx);
    free(x);
}

/* ---- sumsq / log-sum-exp ---- */

static void test_reductions(void)
{
    int64_t n = 100003;
    float *x = rnd(n, 3);
    for (int ti = 0; ti < 3; ti++) {
        at_tensor *tx = mk(dts[ti], 1, &n, x);
        int64_t one = 1;
        at_tensor *o = mk(AT_F32, 1, &one, NULL);
        CHECK_OK(at_sumsq(o, tx));
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        float got;
        CHECK_OK(at_read_scalar(o, &got));
        CHECK_NEAR(got / s, 1.0, 1e-5);
        at_tensor_free(o);
        at_tensor_free(tx);
    }
    free(x);
    /* rows wider than a chunk whose max grows from chunk to chunk: the online
     * log-sum-exp of cross-entropy (its gradient is softmax − onehot) */
    int64_t shp[2] = {3, 5000};
    float *l = rnd(shp[0] * shp[1], 8);
    for (int64_t j = 0; j < shp[1]; j++) l[shp[1] + j] += 0.01f * (float)j; /* row 1: max at the end */
    l[2 * shp[1] + 7] = -INFINITY;
    for (int ti = 0; ti < 3; ti++) {
        float *lv = malloc(sizeof(float) * 15000);
        memcpy(lv, l, sizeof(float) * 15000);
        at_tensor *tl = mk(dts[ti], 2, shp, lv);
        static const int32_t lab0[3] = {0, 0, 0}; /* the onehot in column 0: compared from column 1 */
        at_tensor *ty = mk(AT_F32, 2, shp, NULL), *tlab = mk_i32(1, shp, lab0), *loss = mk(AT_F32, 1, shp, NULL);
        CHECK_OK(at_cross_entropy(loss, ty, tl, tlab, 1.0f));
        float *y = at_tensor_data(ty);
        double md = 0;
        for (int64_t r = 0; r < shp[0]; r++) {
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < shp[1]; j++) m = fmax(m, lv[r * shp[1] + j]);
            for (int64_t j = 0; j < shp[1]; j++) s += exp(lv[r * shp[1] + j] - m);
            for (int64_t j = 1; j < shp[1]; j++) {
                double w = exp(lv[r * shp[1] + j] - m) / s;
                md = fmax(md, fabs(y[r * shp[1] + j] - w) / fmax(w, 1e-30) * (w > 1e-30));
            }
        }
        CHECK_MSG(md < 2e-5, "softmax of cross_entropy %s rel err %g", at_dtype_name(dts[ti]), md);
        CHECK(y[2 * shp[1] + 7] == 0);
        at_tensor_free(tl);
        at_tensor_free(ty);
        at_tensor_free(tlab);
        at_tensor_free(loss);
        free(lv);
    }
    free(l);
}

/* ---- cross-entropy ---- */

static void test_cross_entropy(void)
{
    for (int big = 0; big < 2; big++) {
        int64_t V = big ? 151936 : 3001, N = big ? 2 : 6;
        int64_t shp[2] = {N, V};
        float *l = rnd(N * V, 12);
        int32_t lab[6] = {5, -100, (int32_t)V - 1, 0, -1, 77};
        for (int ti = 0; ti < 3; ti++) {
            at_dtype t = dts[ti];
            float *lv = malloc((size_t)(N * V) * 4);
            memcpy(lv, l, (size_t)(N * V) * 4);
            at_tensor *tl = mk(t, 2, shp, lv), *tlab = mk_i32(1, &N, lab);
            at_tensor *loss = mk(AT_F32, 1, &N, NULL);
            /* in place: dlogits is the logits tensor */
            CHECK_OK(at_cross_entropy(loss, tl, tl, tlab, 0.25f));
            float *ls = at_tensor_data(loss);
            float *d = malloc((size_t)(N * V) * 4);
            get(tl, d);
            double mdl = 0, mdg = 0;
            for (int64_t r = 0; r < N; r++) {
                const float *x = lv + r * V;
                if (lab[r] < 0) {
                    CHECK(ls[r] == 0);
                    for (int64_t j = 0; j < V; j++) mdg = fmax(mdg, fabs(d[r * V + j]));
                    continue;
                }
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j < V; j++) m = fmax(m, x[j]);
                for (int64_t j = 0; j < V; j++) s += exp(x[j] - m);
                double lse = m + log(s);
                mdl = fmax(mdl, fabs(ls[r] - (lse - x[lab[r]])));
                for (int64_t j = 0; j < V; j++) {
                    double g = 0.25 * (exp(x[j] - lse) - (j == lab[r]));
                    mdg = fmax(mdg, fabs(d[r * V + j] - g));
                }
            }
            CHECK_MSG(mdl < 1e-4, "cross_entropy V=%lld %s loss err %g", (long long)V, at_dtype_name(t), mdl);
            CHECK_MSG(mdg < (t == AT_F32 ? 1e-7 : 2e-3), "cross_entropy V=%lld %s grad err %g", (long long)V,
                      at_dtype_name(t), mdg);
            /* without gradient, on the original logits: same loss */
            at_tensor *tl2 = mk(t, 2, shp, lv);
            at_tensor *loss2 = mk(AT_F32, 1, &N, NULL);
            CHECK_OK(at_cross_entropy(loss2, NULL, tl2, tlab, 1.0f));
            CHECK(memcmp(at_tensor_data(loss2), ls, (size_t)N * 4) == 0);
            /* a label >= V is an error */
            ((int32_t *)at_tensor_data(tlab))[0] = (int32_t)V;
            CHECK_FAILS(at_cross_entropy(loss2, NULL, tl2, tlab, 1.0f), AT_ERR_INVALID);
            at_tensor_free(tl2);
            at_tensor_free(loss2);
            at_tensor_free(tl);
            at_tensor_free(tlab);
            at_tensor_free(loss);
            free(d);
            free(lv);
        }
        free(l);
    }
}

/* ---- AdamW ---- */

static void test_adamw(void)
{
    int64_t n = 40000 + 13;
    float *p = rnd(n, 1), *m = rnd(n, 0.1f), *v = rnd(n, 0.1f), *g = rnd(n, 2);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    at_tensor *tp = mk(AT_F32, 1, &n, p), *tm = mk(AT_F32, 1, &n, m), *tv = mk(AT_F32, 1, &n, v),
              *tg = mk(AT_F32, 1, &n, g);
    at_adamw_params ap = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_scale = 0.5f, .step = 3};
    CHECK_OK(at_adamw(tp, tg, tm, tv, &ap));
    const float *gp = at_tensor_data(tp), *gm = at_tensor_data(tm), *gv = at_tensor_data(tv);
    double ep = 0, em = 0, ev = 0;
    for (int64_t i = 0; i < n; i++) {
        /* torch.optim.AdamW, written out */
        double gr = 0.5 * g[i];
        double mm = 0.9 * m[i] + 0.1 * gr, vv = 0.95 * v[i] + 0.05 * gr * gr;
        double pp = p[i] * (1 - 1e-2 * 0.1);
        double bc1 = 1 - pow(0.9, 3), bc2 = 1 - pow(0.95, 3);
        pp -= 1e-2 / bc1 * mm / (sqrt(vv) / sqrt(bc2) + 1e-8);
        ep = fmax(ep, fabs(gp[i] - pp));
        em = fmax(em, fabs(gm[i] - mm));
        ev = fmax(ev, fabs(gv[i] - vv));
    }
    CHECK_MSG(ep < 2e-6 && em < 1e-6 && ev < 1e-6, "adamw err p %g m %g v %g", ep, em, ev);
    /* first step from zero moments: the update is lr·sign(g) (plus decay) */
    float *z = calloc((size_t)n, 4);
    at_tensor *tm0 = mk(AT_F32, 1, &n, z), *tv0 = mk(AT_F32, 1, &n, z), *tp0 = mk(AT_F32, 1, &n, z);
    ap.step = 1;
    ap.weight_decay = 0;
    CHECK_OK(at_adamw(tp0, tg, tm0, tv0, &ap));
    const float *q = at_tensor_data(tp0);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += fabs(q[i] + 1e-2 * (g[i] > 0 ? 1 : -1)) > 1e-6 && fabsf(g[i]) > 1e-2f;
    CHECK(bad == 0);
    at_tensor_free(tm0);
    at_tensor_free(tv0);
    at_tensor_free(tp0);
    free(z);
    at_tensor_free(tp);
    at_tensor_free(tm);
    at_tensor_free(tv);
    at_tensor_free(tg);
    free(p);
    free(m);
    free(v);
    free(g);
}

/* ---- RMSNorm ---- */

static double rms_loss(const float *x, const float *w, const float *c, int64_t rows, int64_t D, float eps)
{
    double L = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += (double)x[r * D + j] * x[r * D + j];
        double rs = 1 / sqrt(ss / D + eps);
        for (int64_t j = 0; j < D; j++) L += c[r * D + j] * x[r * D + j] * rs * w[j];
    }
    return L;
}

static void test_rmsnorm(void)
{
    int64_t rows = 40, D = 1029;
    int64_t shp[2] = {rows, D};
    float eps = 1e-5f;
    float *x = rnd(rows * D, 2), *w = rnd(D, 1), *c = rnd(rows * D, 1);
    for (int ti = 0; ti < 3; ti++) {
        at_dtype t = dts[ti];
        float *xv = malloc((size_t)(rows * D) * 4), *wv = malloc((size_t)D * 4);
        memcpy(xv, x, (size_t)(rows * D) * 4);
        memcpy(wv, w, (size_t)D * 4);
        at_tensor *tx = mk(t, 2, shp, xv), *tw = mk(t, 1, &D, wv), *ty = mk(t, 2, shp, NULL),
                  *tr = mk(AT_F32, 1, &rows, NULL);
        CHECK_OK(at_rmsnorm_forward(ty, tr, tx, tw, eps));
        float *y = malloc((size_t)(rows * D) * 4);
        get(ty, y);
        double md = 0, mr = 0;
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0;
            for (int64_t j = 0; j < D; j++) ss += (double)xv[r * D + j] * xv[r * D + j];
            double rs = 1 / sqrt(ss / D + eps);
            mr = fmax(mr, fabs(((float *)at_tensor_data(tr))[r] - rs) / rs);
            for (int64_t j = 0; j < D; j++) md = fmax(md, fabs(y[r * D + j] - xv[r * D + j] * rs * wv[j]));
        }
        /* r = 1/sqrt(Σx²/D + eps): Σx² of D positive f32 terms summed in any
         * order (the ISA levels differ) is within D·u of the exact sum, u =
         * 2⁻²⁴ (the squares' own rounding included); 1/sqrt halves the relative
         * error and adds at most 3u of its own roundings (divide, add, sqrt). */
        double r_bound = 0.5 * (double)D * 0x1p-24 + 3 * 0x1p-24;
        CHECK_MSG(md < 8 * tol_of(t) && mr <= r_bound, "rmsnorm fwd %s: %g %g (bound %g)", at_dtype_name(t), md, mr,
                  r_bound);
        if (t == AT_F32) {
            /* backward vs finite differences of L = Σ c · y; dw accumulates onto 1.0 */
            at_tensor *tdy = mk(AT_F32, 2, shp, c), *tdx = mk(AT_F32, 2, shp, NULL);
            float *ones = malloc((size_t)D * 4);
            for (int64_t j = 0; j < D; j++) ones[j] = 1.0f;
            at_tensor *tdw = mk(AT_F32, 1, &D, ones);
            CHECK_OK(at_rmsnorm_backward(tdx, tdw, tdy, tx, tw, tr));
            const float *dx = at_tensor_data(tdx), *dw = at_tensor_data(tdw);
            double ex = 0, ew = 0;
            for (int k = 0; k < 20; k++) {
                int64_t i = (int64_t)(urand() * rows * D), j = (int64_t)(urand() * D);
                float h = 1e-2f, s0 = xv[i];
                xv[i] = s0 + h;
                double lp = rms_loss(xv, wv, c, rows, D, eps);
                xv[i] = s0 - h;
                double lm = rms_loss(xv, wv, c, rows, D, eps);
                xv[i] = s0;
                ex = fmax(ex, fabs(dx[i] - (lp - lm) / (2 * h)));
                s0 = wv[j];
                wv[j] = s0 + h;
                lp = rms_loss(xv, wv, c, rows, D, eps);
                wv[j] = s0 - h;
                lm = rms_loss(xv, wv, c, rows, D, eps);
                wv[j] = s0;
                ew = fmax(ew, fabs(dw[j] - 1.0 - (lp - lm) / (2 * h)));
            }
            CHECK_MSG(ex < 1e-3 && ew < 1e-3, "rmsnorm bwd fd: dx %g dw %g", ex, ew);
            free(ones);
            at_tensor_free(tdy);
            at_tensor_free(tdx);
            at_tensor_free(tdw);
        }
        free(y);
        free(xv);
        free(wv);
        at_tensor_free(tx);
        at_tensor_free(tw);
        at_tensor_free(ty);
        at_tensor_free(tr);
    }
    free(x);
    free(w);
    free(c);
}

/* ---- RoPE ---- */

static void test_rope(void)
{
    int64_t shp[4] = {2, 37, 3, 64}, n = 2 * 37 * 3 * 64, ntok = 74, half = 32;
    float *x = rnd(n, 1), *f = malloc((size_t)half * 4);
    for (int64_t i = 0; i < half; i++) f[i] = (float)pow(10000.0, -(double)(2 * i) / 64);
    int32_t pos[74];
    for (int i = 0; i < 74; i++) pos[i] = (i * 977) % 5000;
    int64_t pshp[2] = {2, 37};
    at_tensor *tp = mk_i32(2, pshp, pos), *tf = mk(AT_F32, 1, &half, f);
    for (int ti = 0; ti < 3; ti++) {
        at_dtype t = dts[ti];
        float *xv = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        memcpy(xv, x, (size_t)n * 4);
        at_tensor *tx = mk(t, 4, shp, xv), *ty = mk(AT_F32, 4, shp, NULL);
        CHECK_OK(at_rope(ty, tx, tp, tf, NULL, 0));
        get(ty, y);
        double md = 0;
        for (int64_t tk = 0; tk < ntok; tk++)
            for (int64_t h = 0; h < 3; h++)
                for (int64_t i = 0; i < half; i++) {
                    double a = (double)((float)pos[tk] * f[i]);
                    const float *xr = xv + (tk * 3 + h) * 64;
                    const float *yr = y + (tk * 3 + h) * 64;
                    md = fmax(md, fabs(yr[i] - (xr[i] * cos(a) - xr[i + half] * sin(a))));
                    md = fmax(md, fabs(yr[i + half] - (xr[i + half] * cos(a) + xr[i] * sin(a))));
                }
        CHECK_MSG(md < 1e-5, "rope %s: %g", at_dtype_name(t), md);
        /* inverse in place undoes it */
        CHECK_OK(at_rope(ty, ty, tp, tf, NULL, 1));
        get(ty, y);
        md = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs(y[i] - xv[i]);
            md = d > md || d != d ? d : md; /* not fmax: that loop crashes aarch64 gcc 12's vectorizer */
        }
        CHECK_MSG(md < 1e-5, "rope inverse %s: %g", at_dtype_name(t), md);
        free(xv);
        free(y);
        at_tensor_free(tx);
        at_tensor_free(ty);
    }
    at_tensor_free(tp);
    at_tensor_free(tf);
    free(x);
    free(f);
}

/* ---- SwiGLU ---- */

static void test_swiglu(void)
{
    int64_t n = 20000;
    float *g = rnd(n, 12), *u = rnd(n, 3), *dy = rnd(n, 1);
    g[0] = -100;
    g[1] = 100;
    for (int ti = 0; ti < 3; ti++) {
        at_dtype t = dts[ti];
        float *gv = malloc((size_t)n * 4), *uv = malloc((size_t)n * 4), *o = malloc((size_t)n * 4),
              *o2 = malloc((size_t)n * 4);
        memcpy(gv, g, (size_t)n * 4);
        memcpy(uv, u, (size_t)n * 4);
        at_tensor *tg = mk(t, 1, &n, gv), *tu = mk(t, 1, &n, uv), *ty = mk(AT_F32, 1, &n, NULL),
                  *tdy = mk(AT_F32, 1, &n, dy), *tdg = mk(AT_F32, 1, &n, NULL), *tdu = mk(AT_F32, 1, &n, NULL);
        CHECK_OK(at_swiglu_forward(ty, tg, tu));
        get(ty, o);
        double md = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = 1 / (1 + exp(-(double)gv[i]));
            md = fmax(md, fabs(o[i] - gv[i] * s * uv[i]) / fmax(1, fabs(gv[i] * s * uv[i])));
        }
        CHECK_MSG(md < 1e-6, "swiglu fwd %s: %g", at_dtype_name(t), md);
        CHECK_OK(at_swiglu_backward(tdg, tdu, tdy, tg, tu));
        get(tdg, o);
        get(tdu, o2);
        double eg = 0, eu = 0;
        for (int64_t i = 0; i < n; i++) {
            /* central differences of y = silu(g)·u in double */
            double h = 1e-4, gi = gv[i];
            double fp = (gi + h) / (1 + exp(-(gi + h))) * uv[i], fm = (gi - h) / (1 + exp(-(gi - h))) * uv[i];
            eg = fmax(eg, fabs(o[i] - dy[i] * (fp - fm) / (2 * h)) / fmax(1, fabs(o[i])));
            eu = fmax(eu, fabs(o2[i] - dy[i] * gi / (1 + exp(-gi))) / fmax(1, fabs(o2[i])));
        }
        CHECK_MSG(eg < 1e-5 && eu < 1e-6, "swiglu bwd %s: %g %g", at_dtype_name(t), eg, eu);
        if (t == AT_F32) {
            /* in place (dgate = gate, dup = up: written directly, no
             * scratch) gives the same values as apart */
            CHECK_OK(at_swiglu_backward(tg, tu, tdy, tg, tu));
            int same = 1;
            for (int64_t i = 0; i < n; i++)
                same &= ((float *)at_tensor_data(tg))[i] == o[i] && ((float *)at_tensor_data(tu))[i] == o2[i];
            CHECK_MSG(same, "swiglu bwd in place differs from apart");
        }
        free(gv);
        free(uv);
        free(o);
        free(o2);
        at_tensor *all[] = {tg, tu, ty, tdy, tdg, tdu};
        for (int i = 0; i < 6; i++) at_tensor_free(all[i]);
    }
    free(g);
    free(u);
    free(dy);
}

/* ---- embedding ---- */

static void test_embedding(void)
{
    int64_t V = 50, D = 300, N = 200;
    int64_t tshp[2] = {V, D}, yshp[2] = {N, D};
    float *tab = rnd(V * D, 1), *dy = rnd(N * D, 1);
    int32_t ids[200];
    for (int i = 0; i < N; i++) ids[i] = (i * 7) % 13; /* many repeats */
    at_tensor *ti = mk_i32(1, &N, ids);
    for (int k = 0; k < 3; k++) {
        at_dtype t = dts[k];
        float *tv = malloc((size_t)(V * D) * 4), *y = malloc((size_t)(N * D) * 4);
        memcpy(tv, tab, (size_t)(V * D) * 4);
        at_tensor *tt = mk(t, 2, tshp, tv), *ty = mk(AT_F32, 2, yshp, NULL);
        CHECK_OK(at_embedding_forward(ty, ti, tt));
        get(ty, y);
        int bad = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < D; j++) bad += y[i * D + j] != tv[ids[i] * D + j];
        CHECK(bad == 0);
        /* backward: scatter-add onto a table of 1s */
        for (int64_t i = 0; i < V * D; i++) tv[i] = 1;
        at_tensor *tdt = mk(AT_F32, 2, tshp, tv), *tdy = mk(t, 2, yshp, NULL);
        float *dyv = malloc((size_t)(N * D) * 4);
        memcpy(dyv, dy, (size_t)(N * D) * 4);
        at_tensor_free(tdy);
        tdy = mk(t, 2, yshp, dyv);
        CHECK_OK(at_embedding_backward(tdt, tdy, ti));
        double *want = malloc((size_t)(V * D) * sizeof(double));
        for (int64_t i = 0; i < V * D; i++) want[i] = 1;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < D; j++) want[ids[i] * D + j] += dyv[i * D + j];
        CHECK(max_abs_diff_d(at_tensor_data(tdt), want, V * D) < 1e-4);
        free(want);
        free(dyv);
        free(tv);
        free(y);
        at_tensor_free(tt);
        at_tensor_free(ty);
        at_tensor_free(tdt);
        at_tensor_free(tdy);
    }
    /* an id outside the vocabulary is an error, not a crash */
    int32_t badids[2] = {3, 50};
    int64_t two = 2, y2[2] = {2, D};
    at_tensor *tb = mk_i32(1, &two, badids), *tt = mk(AT_F32, 2, tshp, tab), *ty = mk(AT_F32, 2, y2, NULL);
    CHECK_FAILS(at_embedding_forward(ty, tb, tt), AT_ERR_INVALID);
    CHECK_FAILS(at_embedding_backward(tt, ty, tb), AT_ERR_INVALID);
    at_tensor_free(tb);
    at_tensor_free(tt);
    at_tensor_free(ty);
    at_tensor_free(ti);
    free(tab);
    free(dy);
}

/* ---- matmul ---- */

static void test_matmul(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bb = 0; bb < 2; bb++) {
                int64_t batch = 3, M = 17, N = 9, K = 23;
                int64_t as[3] = {batch, ta ? K : M, ta ? M : K};
                int64_t bs3[3] = {bb ? 1 : batch, tb ? N : K, tb ? K : N};
                int64_t cs[3] = {batch, M, N};
                float *a = rnd(batch * M * K, 1), *b = rnd(batch * K * N, 1), *c = rnd(batch * M * N, 1);
                /* f16 × f32 runs in f32; bf16 × bf16 multiplies exactly representable values */
                int bf = (ta + tb + bb) % 2;
                at_tensor *TA = mk(bf ? AT_BF16 : AT_F16, 3, as, a), *TB = mk(bf ? AT_BF16 : AT_F32, 3, bs3, b),
                          *TC = mk(AT_F32, 3, cs, c);
                CHECK_OK(at_matmul(TC, TA, TB, ta, tb, 0.5f, 2.0f));
                const float *got = at_tensor_data(TC);
                double md = 0;
                for (int64_t z = 0; z < batch; z++)
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            double s = 0;
                            for (int64_t k = 0; k < K; k++) {
                                double av = ta ? a[z * M * K + k * M + i] : a[z * M * K + i * K + k];
                                int64_t zb = bb ? 0 : z;
                                double bv = tb ? b[zb * N * K + j * K + k] : b[zb * K * N + k * N + j];
                                s += av * bv;
                            }
                            double w = 0.5 * s + 2.0 * c[(z * M + i) * N + j];
                            md = fmax(md, fabs(got[(z * M + i) * N + j] - w));
                        }
                CHECK_MSG(md < 1e-4, "matmul ta=%d tb=%d bcast=%d: %g", ta, tb, bb, md);
                at_tensor_free(TA);
                at_tensor_free(TB);
                at_tensor_free(TC);
                free(a);
                free(b);
                free(c);
            }
}

/* ---- attention ---- */

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D;
    const int32_t *qidx, *kvlen, *seg;
} attn_case;

static int visible(const attn_case *c, int64_t b, int64_t i, int64_t j)
{
    int64_t lim = c->qidx ? c->qidx[b * c->Tq + i] : c->Tk - c->Tq + i;
    if (j > lim) return 0;
    if (c->kvlen && j >= c->kvlen[b]) return 0;
    if (c->seg && c->seg[b * c->Tk + j] != c->seg[b * c->Tq + i]) return 0;
    return 1;
}

/* Naive attention in double: out, lse, and (when dout) dq, dk, dv. */
static void attn_ref(const attn_case *c, float scale, const float *q, const float *k, const float *v,
                     const float *dout, double *out, double *lse, double *dq, double *dk, double *dv)
{
    int64_t D = c->D, G = c->Hq / c->Hkv;
    double *p = malloc((size_t)c->Tk * sizeof(double)), *dp = malloc((size_t)c->Tk * sizeof(double));
    if (dq) {
        memset(dq, 0, (size_t)(c->B * c->Tq * c->Hq * D) * sizeof(double));
        memset(dk, 0, (size_t)(c->B * c->Tk * c->Hkv * D) * sizeof(double));
        memset(dv, 0, (size_t)(c->B * c->Tk * c->Hkv * D) * sizeof(double));
    }
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                const float *qi = q + ((b * c->Tq + i) * c->Hq + h) * D;
                double m = -INFINITY;
                for (int64_t j = 0; j < c->Tk; j++) {
                    p[j] = -INFINITY;
                    if (!visible(c, b, i, j)) continue;
                    const float *kj = k + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += (double)qi[d] * kj[d];
                    p[j] = scale * s;
                    m = fmax(m, p[j]);
                }
                double sum = 0;
                for (int64_t j = 0; j < c->Tk; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - m);
                double *o = out + ((b * c->Tq + i) * c->Hq + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0;
                lse[(b * c->Hq + h) * c->Tq + i] = sum > 0 ? m + log(sum) : -INFINITY;
                for (int64_t j = 0; j < c->Tk; j++) {
                    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m) / sum;
                    if (!visible(c, b, i, j)) continue; /* invisible keys may hold NaN */
                    const float *vj = v + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    for (int64_t d = 0; d < D; d++) o[d] += p[j] * vj[d];
                }
                if (!dq) continue;
                const float *doi = dout + ((b * c->Tq + i) * c->Hq + h) * D;
                double Di = 0;
                for (int64_t d = 0; d < D; d++) Di += doi[d] * o[d];
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    const float *vj = v + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    const float *kj = k + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += (double)doi[d] * vj[d];
                    dp[j] = p[j] * (s - Di);
                    double *dqi = dq + ((b * c->Tq + i) * c->Hq + h) * D;
                    double *dkj = dk + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double *dvj = dv + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += scale * dp[j] * kj[d];
                        dkj[d] += scale * dp[j] * qi[d];
                        dvj[d] += p[j] * doi[d];
                    }
                }
            }
    free(p);
    free(dp);
}

static void run_attn_case(const char *name, const attn_case *c, at_dtype t, int check_bwd)
{
    int64_t nq = c->B * c->Tq * c->Hq * c->D, nk = c->B * c->Tk * c->Hkv * c->D, nl = c->B * c->Hq * c->Tq;
    int64_t qs[4] = {c->B, c->Tq, c->Hq, c->D}, ks[4] = {c->B, c->Tk, c->Hkv, c->D};
    float scale = 1.0f / sqrtf((float)c->D);
    float *q = rnd(nq, 1.5f), *k = rnd(nk, 1.5f), *v = rnd(nk, 1), *dout = rnd(nq, 1);
    /* keys past kv_len are garbage (as in a KV cache): they must never be read */
    for (int64_t b = 0; c->kvlen && b < c->B; b++)
        for (int64_t j = c->kvlen[b]; j < c->Tk; j++)
            for (int64_t d = 0; d < c->Hkv * c->D; d++) {
                k[(b * c->Tk + j) * c->Hkv * c->D + d] = NAN;
                v[(b * c->Tk + j) * c->Hkv * c->D + d] = NAN;
            }
    at_tensor *tq = mk(t, 4, qs, q), *tk = mk(t, 4, ks, k), *tv = mk(t, 4, ks, v), *to = mk(AT_F32, 4, qs, NULL);
    at_tensor *tl = mk(AT_F32, 3, (int64_t[]){c->B, c->Hq, c->Tq}, NULL);
    at_tensor *tqi = NULL, *tkl = NULL, *tsg = NULL;
    if (c->qidx) tqi = mk_i32(2, (int64_t[]){c->B, c->Tq}, c->qidx);
    if (c->kvlen) tkl = mk_i32(1, &c->B, c->kvlen);
    if (c->seg) tsg = mk_i32(2, (int64_t[]){c->B, c->Tq}, c->seg);
    at_attn_params p = {scale, tqi, tkl, tsg, 0};
    CHECK_OK(at_attention_forward(to, tl, tq, tk, tv, &p));
    double *ro = malloc((size_t)nq * 8), *rl = malloc((size_t)nl * 8), *rdq = malloc((size_t)nq * 8),
           *rdk = malloc((size_t)nk * 8), *rdv = malloc((size_t)nk * 8);
    attn_ref(c, scale, q, k, v, dout, ro, rl, rdq, rdk, rdv);
    const float *go = at_tensor_data(to), *gl = at_tensor_data(tl);
    double eo = max_abs_diff_d(go, ro, nq), el = 0;
    int lse_ok = 1;
    for (int64_t i = 0; i < nl; i++) {
        if (rl[i] == -INFINITY) lse_ok &= gl[i] == -INFINITY;
        else el = fmax(el, fabs(gl[i] - rl[i]));
    }
    CHECK_MSG(eo < 2e-5 && el < 2e-5 && lse_ok, "attention fwd %s %s: out %g lse %g (-inf ok %d)", name,
              at_dtype_name(t), eo, el, lse_ok);
    if (check_bwd) {
        at_tensor *tdo = mk(AT_F32, 4, qs, dout), *tdq = mk(t, 4, qs, NULL), *tdk = mk(AT_F32, 4, ks, NULL),
                  *tdv = mk(AT_F32, 4, ks, NULL);
        CHECK_OK(at_attention_backward(tdq, tdk, tdv, tdo, tq, tk, tv, to, tl, &p));
        float *gdq = malloc((size_t)nq * 4);
        get(tdq, gdq);
        double eq = max_abs_diff_d(gdq, rdq, nq), ek = max_abs_diff_d(at_tensor_data(tdk), rdk, nk),
               ev = max_abs_diff_d(at_tensor_data(tdv), rdv, nk);
        double tq_ = t == AT_F32 ? 5e-5 : 1e-2;
        CHECK_MSG(eq < tq_ && ek < 5e-5 && ev < 5e-5, "attention bwd %s %s: dq %g dk %g dv %g", name,
                  at_dtype_name(t), eq, ek, ev);
        int finite = 1;
        for (int64_t i = 0; i < nq; i++) finite &= isfinite(gdq[i]);
        CHECK(finite);
        free(gdq);
        at_tensor_free(tdo);
        at_tensor_free(tdq);
        at_tensor_free(tdk);
        at_tensor_free(tdv);
    }
    free(ro);
    free(rl);
    free(rdq);
    free(rdk);
    free(rdv);
    free(q);
    free(k);
    free(v);
    free(dout);
    at_tensor *all[] = {tq, tk, tv, to, tl, tqi, tkl, tsg};
    for (int i = 0; i < 8; i++) at_tensor_free(all[i]);
}

/* Finite differences of L = Σ c·out through the kernels themselves (checks
 * the backward formula of ops.h, not just our reading of it). */
static void test_attention_fd(void)
{
    int64_t B = 1, T = 5, Hq = 2, Hkv = 1, D = 4, n = B * T * Hq * D, nk = B * T * Hkv * D;
    int64_t qs[4] = {B, T, Hq, D}, ks[4] = {B, T, Hkv, D}, ls[3] = {B, Hq, T};
    float *q = rnd(n, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *c = rnd(n, 1);
    at_tensor *tq = mk(AT_F32, 4, qs, q), *tk = mk(AT_F32, 4, ks, k), *tv = mk(AT_F32, 4, ks, v);
    at_tensor *to = mk(AT_F32, 4, qs, NULL), *tl = mk(AT_F32, 3, ls, NULL), *tc = mk(AT_F32, 4, qs, c);
    at_tensor *dq = mk(AT_F32, 4, qs, NULL), *dk = mk(AT_F32, 4, ks, NULL), *dv = mk(AT_F32, 4, ks, NULL);
    at_attn_params p = {0.7f, NULL, NULL, NULL, 0};
    CHECK_OK(at_attention_forward(to, tl, tq, tk, tv, &p));
    CHECK_OK(at_attention_backward(dq, dk, dv, tc, tq, tk, tv, to, tl, &p));
    at_tensor *which[3] = {tq, tk, tv}, *grads[3] = {dq, dk, dv};
    double emax = 0;
    for (int w = 0; w < 3; w++) {
        float *x = at_tensor_data(which[w]);
        const float *gr = at_tensor_data(grads[w]);
        for (int64_t i = 0; i < at_tensor_numel(which[w]); i++) {
            float s0 = x[i], h = 1e-2f;
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                x[i] = s0 + (sgn ? -h : h);
                CHECK_OK(at_attention_forward(to, NULL, tq, tk, tv, &p));
                const float *o = at_tensor_data(to);
                L[sgn] = 0;
                for (int64_t j = 0; j < n; j++) L[sgn] += (double)c[j] * o[j];
            }
            x[i] = s0;
            emax = fmax(emax, fabs(gr[i] - (L[0] - L[1]) / (2 * h)));
        }
    }
    CHECK_MSG(emax < 2e-3, "attention finite differences: %g", emax);
    at_tensor *all[] = {tq, tk, tv, to, tl, tc, dq, dk, dv};
    for (int i = 0; i < 9; i++) at_tensor_free(all[i]);
    free(q);
    free(k);
    free(v);
    free(c);
}

static void test_attention(void)
{
    /* plain causal, GQA, two query blocks and a partial one */
    attn_case c1 = {2, 70, 70, 4, 2, 16, NULL, NULL, NULL};
    run_attn_case("causal gqa", &c1, AT_F32, 1);
    run_attn_case("causal gqa", &c1, AT_BF16, 1);
    /* packed segments (one starting mid-block) and kv_len; sequence 1 has
     * kv_len 0 (every query sees nothing: out 0, lse −inf, finite grads) */
    int32_t seg[2 * 130], kvl[2] = {120, 0};
    for (int i = 0; i < 130; i++) {
        seg[i] = i < 50 ? 0 : (i < 100 ? 1 : 2);
        seg[130 + i] = i / 3;
    }
    attn_case c2 = {2, 130, 130, 3, 1, 8, NULL, kvl, seg};
    run_attn_case("segments+kv_len", &c2, AT_F32, 1);
    /* the same two without the backward's dS store (dS formed twice) */
    size_t store = at_cpu_attention_ds_store_limit(0);
    run_attn_case("causal gqa, no dS store", &c1, AT_F32, 1);
    run_attn_case("segments+kv_len, no dS store", &c2, AT_F32, 1);
    at_cpu_attention_ds_store_limit(store);
    /* decode-like: 3 queries against 100 keys, default q_index (Tk − Tq + i) */
    attn_case c3 = {1, 3, 100, 8, 2, 32, NULL, NULL, NULL};
    run_attn_case("decode", &c3, AT_F16, 1);
    /* explicit, non-monotonic q_index incl. −1 (sees nothing) */
    int32_t qi[2 * 9] = {0, 5, 80, -1, 3, 99, 64, 63, 10, 2, 2, 2, 50, 40, 30, 20, 10, 0};
    int32_t kv2[2] = {90, 100};
    attn_case c4 = {2, 9, 100, 2, 2, 24, qi, kv2, NULL};
    run_attn_case("q_index", &c4, AT_F32, 1);
    test_attention_fd();
}

/* ---- attention's products in bf16 (at_attn_params.bf16) ----
 * Error analysis. bf16 rounding to nearest even has unit roundoff u = 2^-9,
 * so a product of two rounded operands is off by at most (2u + u²)·|a·b|,
 * and f32 sums add at most K·2^-24 of Σ|terms| (bound with a margin: G).
 *  - at_cpu_gemm_acc_bf16 against Σ bf16(a)·bf16(b) summed in double: the
 *    products are exact, so only the f32 sums differ: ≤ (K + 2)·2^-24·Σ|ab|.
 *  - attention against exact math (attn_ref): a score s = scale·q·k is off
 *    by δ ≤ G·scale·Σ_d|q_d k_d|; a probability p = exp(s − lse) then by a
 *    factor within e^{±2δ_i} (δ_i: the row's largest δ, which moves lse
 *    too), and its rounding for p·v by (1 ± u). Hence
 *      |Δout_d| ≤ ε_i·Σ_j p_j|v_jd|,  ε_i = e^{2δ_i}(1 + u)² − 1.
 *    Backward, with dP_ij = dO_i·v_j (off by ≤ G·Σ_d|dO_id v_jd|) and
 *    D_i = dO_i·out_i (off by ≤ Σ_d|dO_id|·|Δout_d|):
 *      |ΔdS_ij| ≤ ε_i·p_ij|dP_ij − D_i| + p_ij(|ΔdP_ij| + |ΔD_i|),
 *      |ΔdV_jd| ≤ Σ_i (ε_i + G)·p_ij|dO_id|,
 *      |ΔdK_jd| ≤ scale·Σ_i (|ΔdS_ij| + G·|dS_ij|)·|q_id|, dQ likewise with k.
 *    The checks allow twice these first-order bounds, plus 1e-6. */
#define BF16_U (1.0 / 512)
#define BF16_G (2.01 * BF16_U + 1e-6)

static double bf16r(float x) { return at_bf16_to_f32(at_f32_to_bf16(x)); }

static void test_gemm_acc_bf16(void)
{
    /* odd sizes across the 64-blocks of k, columns and rows; A plain and transposed */
    int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 64, 64}, {67, 70, 130}, {20, 200, 33}};
    for (int si = 0; si < 5; si++)
        for (int tr = 0; tr < 2; tr++) {
            int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], ldc = N + 3, ldb = N + 5;
            int64_t a_rs = tr ? 1 : K + 2, a_cs = tr ? M + 1 : 1;
            float *a = rnd(tr ? K * (M + 1) : M * (K + 2), 2), *b = rnd(K * ldb, 2), *c = rnd(M * ldc, 1);
            float *c0 = malloc((size_t)(M * ldc) * sizeof(float));
            memcpy(c0, c, (size_t)(M * ldc) * sizeof(float));
            at_cpu_gemm_acc_bf16(c, ldc, a, a_rs, a_cs, b, ldb, M, N, K);
            double worst = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < ldc; j++) {
                    if (j >= N) { /* past N: untouched */
                        worst = fmax(worst, c[i * ldc + j] == c0[i * ldc + j] ? 0 : INFINITY);
                        continue;
                    }
                    double want = c0[i * ldc + j], mag = fabs(want);
                    for (int64_t k = 0; k < K; k++) {
                        double t = bf16r(a[i * a_rs + k * a_cs]) * bf16r(b[k * ldb + j]);
                        want += t;
                        mag += fabs(t);
                    }
                    double tol = (double)(K + 2) * ldexp(1.0, -24) * mag;
                    worst = fmax(worst, fabs(c[i * ldc + j] - want) / tol);
                }
            CHECK_MSG(worst <= 1.0, "gemm_acc_bf16 %lldx%lldx%lld%s: worst err/tol %g", (long long)M, (long long)N,
                      (long long)K, tr ? " (A transposed)" : "", worst);
            free(a);
            free(b);
            free(c);
            free(c0);
        }
}

/* The pair panels (gemm.h): X [M][K] packed with pairs in rows, Y [K][N]
 * with pairs of rows; their product against the double sums of the rounded
 * values (bound as for at_cpu_gemm_acc_bf16), overwriting a C of NaNs (acc
 * 0) and adding to one (acc 1). Yᵀ packed with pairs in rows must give
 * Y's pairs-of-rows panel word for word, and the lanes past the last up to
 * the next 16 are 0. */
static void test_gemm_acc_bf16_pairs(void)
{
    int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 64, 64}, {70, 100, 33}, {9, 40, 130}};
    for (int si = 0; si < 5; si++)
        for (int acc = 0; acc < 2; acc++) {
            int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], kp = (K + 1) / 2, ldc = N + 3;
            int64_t lda = (M + 15) / 16 * 16 + 16, ldb = (N + 15) / 16 * 16;
            float *x = rnd(M * (K + 1), 2), *y = rnd(K * (N + 2), 2), *yt = malloc(sizeof(float) * (size_t)(N * K));
            float *c = rnd(M * ldc, 1), *c0 = malloc(sizeof(float) * (size_t)(M * ldc));
            uint32_t *ap = malloc(sizeof(uint32_t) * (size_t)(kp * lda)), *bp = malloc(sizeof(uint32_t) * (size_t)(kp * ldb));
            uint32_t *bt = malloc(sizeof(uint32_t) * (size_t)(kp * ldb));
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < N; j++) yt[j * K + k] = y[k * (N + 2) + j];
            if (!acc)
                for (int64_t i = 0; i < M * ldc; i++) c[i] = NAN;
            memcpy(c0, c, sizeof(float) * (size_t)(M * ldc));
            memset(ap, 0xff, sizeof(uint32_t) * (size_t)(kp * lda));
            at_cpu_bf16_pairs_in_rows(ap, lda, x, K + 1, M, K);
            at_cpu_bf16_pairs_of_rows(bp, ldb, y, N + 2, K, N);
            at_cpu_bf16_pairs_in_rows(bt, ldb, yt, K, N, K);
            int same = 1, zero = 1;
            for (int64_t p = 0; p < kp; p++) {
                for (int64_t j = 0; j < N; j++) same &= bp[p * ldb + j] == bt[p * ldb + j];
                for (int64_t i = M; i < (M + 15) / 16 * 16; i++) zero &= ap[p * lda + i] == 0;
            }
            CHECK_MSG(same, "pair panels %lldx%lld: Y's pairs of rows differ from Yt's pairs in rows", (long long)K,
                      (long long)N);
            CHECK_MSG(zero, "pair panels %lld rows: lanes past them are not 0", (long long)M);
            at_cpu_gemm_acc_bf16_pairs(c, ldc, ap, lda, bp, ldb, M, N, kp, acc);
            double worst = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < ldc; j++) {
                    if (j >= N) {
                        worst = fmax(worst, memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof(float)) ? INFINITY : 0);
                        continue;
                    }
                    double want = acc ? c0[i * ldc + j] : 0, mag = fabs(want);
                    for (int64_t k = 0; k < K; k++) {
                        double t = bf16r(x[i * (K + 1) + k]) * bf16r(y[k * (N + 2) + j]);
                        want += t;
                        mag += fabs(t);
                    }
                    double tol = (double)(K + 2) * ldexp(1.0, -24) * mag;
                    worst = fmax(worst, fabs(c[i * ldc + j] - want) / tol);
                }
            CHECK_MSG(worst <= 1.0, "gemm_acc_bf16_pairs %lldx%lldx%lld acc %d: worst err/tol %g", (long long)M,
                      (long long)N, (long long)K, acc, worst);
            free(x);
            free(y);
            free(yt);
            free(c);
            free(c0);
            free(ap);
            free(bp);
            free(bt);
        }
}

/* The bounds of the analysis above, per element of out, dq, dk, dv. */
static void attn_bf16_bounds(const attn_case *c, float scale, const float *q, const float *k, const float *v,
                             const float *dout, const double *ro, const double *rl, double *bo, double *bq,
                             double *bk, double *bv)
{
    int64_t D = c->D, G = c->Hq / c->Hkv;
    memset(bq, 0, (size_t)(c->B * c->Tq * c->Hq * D) * sizeof(double));
    memset(bk, 0, (size_t)(c->B * c->Tk * c->Hkv * D) * sizeof(double));
    memset(bv, 0, (size_t)(c->B * c->Tk * c->Hkv * D) * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                int64_t qo = ((b * c->Tq + i) * c->Hq + h) * D;
                double L = rl[(b * c->Hq + h) * c->Tq + i], delta = 0, dD = 0, Di = 0;
                for (int64_t d = 0; d < D; d++) bo[qo + d] = 0;
                if (L == -INFINITY) continue;
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    const float *kj = k + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double m = 0;
                    for (int64_t d = 0; d < D; d++) m += fabs((double)q[qo + d] * kj[d]);
                    delta = fmax(delta, BF16_G * scale * m);
                }
                double eps = exp(2 * delta) * (1 + BF16_U) * (1 + BF16_U) - 1;
                for (int64_t d = 0; d < D; d++) Di += (double)dout[qo + d] * ro[qo + d];
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    const float *kj = k + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    const float *vj = v + ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += (double)q[qo + d] * kj[d];
                    double p = exp(scale * s - L);
                    for (int64_t d = 0; d < D; d++) bo[qo + d] += eps * p * fabs(vj[d]);
                }
                for (int64_t d = 0; d < D; d++) dD += fabs(dout[qo + d]) * bo[qo + d];
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    int64_t ko = ((b * c->Tk + j) * c->Hkv + h / G) * D;
                    double s = 0, dp = 0, edp = 0;
                    for (int64_t d = 0; d < D; d++) {
                        s += (double)q[qo + d] * k[ko + d];
                        dp += (double)dout[qo + d] * v[ko + d];
                        edp += fabs((double)dout[qo + d] * v[ko + d]);
                    }
                    double p = exp(scale * s - L), ds = p * (dp - Di);
                    double eds = eps * fabs(ds) + p * (BF16_G * edp + dD);
                    for (int64_t d = 0; d < D; d++) {
                        bv[ko + d] += (eps + BF16_G) * p * fabs(dout[qo + d]);
                        bk[ko + d] += scale * (eds + BF16_G * fabs(ds)) * fabs(q[qo + d]);
                        bq[qo + d] += scale * (eds + BF16_G * fabs(ds)) * fabs(k[ko + d]);
                    }
                }
            }
}

static double worst_ratio(const float *got, const double *want, const double *bound, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = fabs((double)got[i] - want[i]) / (2 * bound[i] + 1e-6);
        if (!(r <= w)) w = isnan(r) ? INFINITY : r;
    }
    return w;
}

/* t (a CPU tensor) on backend be: t itself on the CPU, else a copy there
 * (t is freed). */
static at_tensor *on_backend(at_backend *be, at_tensor *t)
{
    if (!t || be == at_cpu_backend()) return t;
    at_tensor *d = NULL;
    CHECK_OK(at_tensor_new(be, t->dtype, t->ndim, t->shape, t->name, &d));
    if (d) CHECK_OK(at_tensor_upload(d, at_tensor_data(t), at_tensor_nbytes(t)));
    at_tensor_free(t);
    return d;
}

/* The f32 values of t (on any backend); caller frees. */
static float *values_of(const at_tensor *t)
{
    float *v = calloc((size_t)at_tensor_numel(t) + 1, sizeof(float));
    CHECK_OK(at_tensor_download(t, v, at_tensor_nbytes(t)));
    return v;
}

/* With bf16_inputs, q, k, v and dout are bf16 numbers already (and D a power
 * of 4, so that q·scale is one too): then q·k and dO·Vᵀ are exact products
 * summed in f32, the forward's out is as good as f32's, and what the bf16
 * path changes is the rounding of P and dS in the backward's products.
 * be: the backend that computes (the CPU at the forced level, or CUDA). */
static void run_attn_bf16_case(at_backend *be, const char *name, const attn_case *c, int bf16_inputs)
{
    int64_t nq = c->B * c->Tq * c->Hq * c->D, nk = c->B * c->Tk * c->Hkv * c->D, nl = c->B * c->Hq * c->Tq;
    int64_t qs[4] = {c->B, c->Tq, c->Hq, c->D}, ks[4] = {c->B, c->Tk, c->Hkv, c->D};
    float scale = 1.0f / sqrtf((float)c->D);
    float *q = rnd(nq, 1.5f), *k = rnd(nk, 1.5f), *v = rnd(nk, 1), *dout = rnd(nq, 1);
    for (int64_t i = 0; bf16_inputs && i < nq; i++) q[i] = round_to(AT_BF16, q[i]), dout[i] = round_to(AT_BF16, dout[i]);
    for (int64_t i = 0; bf16_inputs && i < nk; i++) k[i] = round_to(AT_BF16, k[i]), v[i] = round_to(AT_BF16, v[i]);
    /* keys past kv_len are garbage, as in run_attn_case */
    for (int64_t b = 0; c->kvlen && b < c->B; b++)
        for (int64_t j = c->kvlen[b]; j < c->Tk; j++)
            for (int64_t d = 0; d < c->Hkv * c->D; d++) {
                k[(b * c->Tk + j) * c->Hkv * c->D + d] = NAN;
                v[(b * c->Tk + j) * c->Hkv * c->D + d] = NAN;
            }
    at_tensor *tq = mk(AT_F32, 4, qs, q), *tk = mk(AT_F32, 4, ks, k), *tv = mk(AT_F32, 4, ks, v);
    at_tensor *to = mk(AT_F32, 4, qs, NULL), *tl = mk(AT_F32, 3, (int64_t[]){c->B, c->Hq, c->Tq}, NULL);
    at_tensor *tsg = c->seg ? mk_i32(2, (int64_t[]){c->B, c->Tq}, c->seg) : NULL;
    at_tensor *tqi = c->qidx ? mk_i32(2, (int64_t[]){c->B, c->Tq}, c->qidx) : NULL;
    at_tensor *tkl = c->kvlen ? mk_i32(1, &c->B, c->kvlen) : NULL;
    at_tensor *tdo = mk(AT_F32, 4, qs, dout), *tdq = mk(AT_F32, 4, qs, NULL), *tdk = mk(AT_F32, 4, ks, NULL),
              *tdv = mk(AT_F32, 4, ks, NULL);
    at_tensor **all[] = {&tq, &tk, &tv, &to, &tl, &tsg, &tqi, &tkl, &tdo, &tdq, &tdk, &tdv};
    for (int i = 0; i < 12; i++) *all[i] = on_backend(be, *all[i]);
    at_attn_params p = {scale, tqi, tkl, tsg, 1};
    CHECK_OK(at_attention_forward(to, tl, tq, tk, tv, &p));
    CHECK_OK(at_attention_backward(tdq, tdk, tdv, tdo, tq, tk, tv, to, tl, &p));
    float *go = values_of(to), *gq = values_of(tdq), *gk = values_of(tdk), *gv = values_of(tdv);
    double *ro = malloc((size_t)nq * 8), *rl = malloc((size_t)nl * 8), *rdq = malloc((size_t)nq * 8),
           *rdk = malloc((size_t)nk * 8), *rdv = malloc((size_t)nk * 8), *bo = malloc((size_t)nq * 8),
           *bq = malloc((size_t)nq * 8), *bk = malloc((size_t)nk * 8), *bv = malloc((size_t)nk * 8);
    attn_ref(c, scale, q, k, v, dout, ro, rl, rdq, rdk, rdv);
    attn_bf16_bounds(c, scale, q, k, v, dout, ro, rl, bo, bq, bk, bv);
    double wo = worst_ratio(go, ro, bo, nq), wq = worst_ratio(gq, rdq, bq, nq), wk = worst_ratio(gk, rdk, bk, nk),
           wv = worst_ratio(gv, rdv, bv, nk);
    CHECK_MSG(wo <= 1 && wq <= 1 && wk <= 1 && wv <= 1,
              "attention bf16 %s on %s: worst err/bound out %g dq %g dk %g dv %g", name, be->name, wo, wq, wk, wv);
    /* position 0 sees one key: P = 1, out = v, so dS = P·(dP − D) is 0
     * exactly when D is summed as dP is (the same bf16 pairs in the same
     * order), and so is that row of dq (the bound above would let a
     * rounding residue through) */
    if (!c->qidx && !c->kvlen) {
        int zero = 1;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < c->Hq * c->D; i++) zero &= gq[b * c->Tq * c->Hq * c->D + i] == 0.0f;
        CHECK_MSG(zero, "attention bf16 %s on %s: dq of position 0 (one key seen) is not exactly 0", name, be->name);
    }
    /* and not f32 by accident: the rounding must show beyond f32's error
     * (~1e-6 here): in out through q·k; with bf16 inputs, where out is f32's,
     * in dv and dk, through P and dS rounded for Pᵀ·dO and dSᵀ·Q */
    double eo = max_abs_diff_d(go, ro, nq);
    if (!bf16_inputs)
        CHECK_MSG(eo > 1e-4, "attention bf16 %s on %s: out within %g of exact: not rounded to bf16", name, be->name,
                  eo);
    else {
        double ev = max_abs_diff_d(gv, rdv, nk), ek = max_abs_diff_d(gk, rdk, nk);
        CHECK_MSG(eo < 1e-5, "attention bf16 %s on %s: out %g from exact with bf16 inputs", name, be->name, eo);
        CHECK_MSG(ev > 1e-4 && ek > 1e-4, "attention bf16 %s on %s: dv within %g, dk within %g of exact: the "
                  "backward's products not in bf16", name, be->name, ev, ek);
    }
    free(go);
    free(gq);
    free(gk);
    free(gv);
    free(ro);
    free(rl);
    free(rdq);
    free(rdk);
    free(rdv);
    free(bo);
    free(bq);
    free(bk);
    free(bv);
    free(q);
    free(k);
    free(v);
    free(dout);
    for (int i = 0; i < 12; i++) at_tensor_free(*all[i]);
}

/* The cases of run_attn_bf16_case on backend be. */
static void attention_bf16_cases(at_backend *be)
{
    attn_case c1 = {1, 150, 150, 4, 2, 64, NULL, NULL, NULL}; /* Qwen's head size, partial blocks */
    run_attn_bf16_case(be, "causal gqa d64", &c1, 0);
    run_attn_bf16_case(be, "causal gqa d64, bf16 inputs", &c1, 1);
    int32_t seg[100];
    for (int i = 0; i < 100; i++) seg[i] = i < 37 ? 0 : 1;
    attn_case c2 = {1, 100, 100, 2, 1, 24, NULL, NULL, seg};
    run_attn_bf16_case(be, "segments d24", &c2, 0);
    /* kv_len with garbage past it (sequence 1 sees nothing), an odd head
     * size (pairs with a missing second), with and without the dS store */
    int32_t seg2[2 * 130], kvl[2] = {120, 0};
    for (int i = 0; i < 130; i++) {
        seg2[i] = i < 50 ? 0 : (i < 100 ? 1 : 2);
        seg2[130 + i] = i / 3;
    }
    attn_case c3 = {2, 130, 130, 3, 1, 15, NULL, kvl, seg2};
    run_attn_bf16_case(be, "segments+kv_len d15", &c3, 0);
    size_t store = at_cpu_attention_ds_store_limit(0);
    run_attn_bf16_case(be, "segments+kv_len d15, no dS store", &c3, 0);
    run_attn_bf16_case(be, "causal gqa d64, no dS store", &c1, 0);
    at_cpu_attention_ds_store_limit(store);
    int32_t qi[2 * 9] = {0, 5, 80, -1, 3, 99, 64, 63, 10, 2, 2, 2, 50, 40, 30, 20, 10, 0};
    int32_t kv2[2] = {90, 100};
    attn_case c4 = {2, 9, 100, 2, 2, 8, qi, kv2, NULL};
    run_attn_bf16_case(be, "q_index d8", &c4, 0);
    attn_case c5 = {1, 3, 3, 2, 1, 8, NULL, NULL, NULL}; /* an odd number of keys in a block */
    run_attn_bf16_case(be, "3 tokens d8", &c5, 0);
}

/* On the CPU at every level the machine has, the top one (vdpbf16ps)
 * included; then on the CUDA backend, which must meet the same bounds with
 * the same operands rounded: on a GPU when the machine has one, and run by
 * the CUDA emulator. */
static void test_attention_bf16(at_cpu_isa hw)
{
    for (int lvl = AT_ISA_SCALAR; lvl <= (int)hw; lvl++) {
        at_cpu_isa_force((at_cpu_isa)lvl);
        int before = at_test_failures;
        test_gemm_acc_bf16();
        test_gemm_acc_bf16_pairs();
        attention_bf16_cases(at_cpu_backend());
        if (at_test_failures != before)
            fprintf(stderr, "bf16 attention failures at ISA %s\n", at_cpu_isa_name((at_cpu_isa)lvl));
    }
    at_backend *gpu = at_test_gpu_backend();
    if (gpu) attention_bf16_cases(gpu);
#ifdef AT_CUDA_EMU_LIBRARY
    at_backend *emu = NULL;
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &emu));
    if (emu) attention_bf16_cases(emu);
#endif
}

int main(void)
{
    at_cpu_isa hw = at_cpu_isa_level();
    /* the top tier's vector primitives are the tier below's (it adds GEMM kernels only) */
    for (int lvl = AT_ISA_SCALAR; lvl <= (int)hw && lvl < AT_ISA_TOP; lvl++) {
        at_cpu_isa_force((at_cpu_isa)lvl);
        printf("ISA %s\n", at_cpu_isa_name((at_cpu_isa)lvl));
        int before = at_test_failures;
        test_elementwise();
        test_reductions();
        test_cross_entropy();
        test_adamw();
        test_rmsnorm();
        test_rope();
        test_swiglu();
        test_embedding();
        test_matmul();
        test_attention();
        if (at_test_failures != before) fprintf(stderr, "failures at ISA %s\n", at_cpu_isa_name((at_cpu_isa)lvl));
    }
    test_attention_bf16(hw);
    at_cpu_isa_force(hw);
    return at_test_result("test_cpu_kernels");
}
