/* CPU kernels of causal grouped-query attention, forward and backward, in the
 * manner of FlashAttention-2 (see ops/ops.h for the math and the masks). */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "base/progress.h"
#include "base/threads.h"
#include "device/cpu/cpu_simd.h"
#include "device/cpu/gemm.h"

/* FlashAttention on the CPU.
 *
 * Scores are formed one tile of BQ queries × BK keys at a time, in f32
 * per-thread scratch; the T×T matrix never exists.
 *
 * Forward, per (batch, query head, query block), keys in blocks, with the
 * running max m, running sum l and unnormalized output O of each query:
 *   S = scale · Q Kᵀ (masked entries −inf),  m' = max(m, rowmax S),
 *   P = exp(S − m'),  l = l·exp(m − m') + rowsum P,  O = O·exp(m − m') + P V
 * and at the end out = O / l, lse = m + log l (a query that sees no key gets
 * out = 0, lse = −inf).
 *
 * Backward (FlashAttention-2): P is recomputed from lse, P = exp(S − lse), and
 * with D_i = dout_i · out_i,
 *   dP = dO Vᵀ,  dS = P ∘ (dP − D),  dV = Pᵀ dO,  dK = scale · dSᵀ Q,
 *   dQ = scale · dS K.
 * Two passes keep every output owned by one task, so there are no atomics:
 * pass 1 runs over (batch, kv head, key block) and sums dK, dV over the query
 * heads of the group and all query blocks; pass 2 runs over (batch, query
 * head, query block) for dQ. Pass 1 keeps each dS tile it forms in a store of
 * B·Hq·ceil(Tq/BQ)·ceil(Tk/BK) tiles when that fits in DS_STORE_MAX bytes, and
 * pass 2 reads it back (dQ += dS K: one product instead of three, and no
 * exp); beyond that size, or without the memory, pass 2 forms S and dP again.
 * Either way dQ gets the same dS values, so the result does not depend on it.
 *
 * Visibility of key j to query i of sequence b: j ≤ lim_i with
 * lim_i = min(q_index[b,i] (default Tk − Tq + i), kv_len[b] − 1), and with
 * segments, segments[b,j] == segments[b,i]. Key blocks past every lim of the
 * query block, or whose segment range misses the block's, are skipped whole;
 * blocks wholly visible skip the mask.
 *
 * Products in bf16 (at_attn_params.bf16) on a CPU with vdpbf16ps take their
 * operands as pair panels (gemm.h), each packed once: the key blocks per
 * call (forward: K; backward: K both ways and V), the query blocks per task
 * in the forward and per call in the backward (Q and dO both ways), P and dS
 * per tile. Packing each operand for each product instead (transposing K
 * for every query block of every head) took a quarter of the forward. */

#define BQ 64
#define BK 64
/* 14.7 MB for Qwen2.5-0.5B's 14 heads at 512 tokens; small beside a step's activations
 * (plan/memory.c counts the touched half) */
#define DS_STORE_MAX ((size_t)16 << 20)
static size_t ds_store_max = DS_STORE_MAX;

size_t at_cpu_attention_ds_store_limit(size_t bytes)
{
    size_t old = ds_store_max;
    ds_store_max = bytes;
    return old;
}

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, G, D;
    float scale;
    const int32_t *qidx, *kvlen, *seg;
    const at_cpu_simd *v;
    int bf16;  /* the products' operands rounded to bf16 (at_attn_params) */
    int round; /* bf16 without vdpbf16ps: operands rounded once, as they are
                  loaded or formed, and the f32 kernel */
    int pairs; /* bf16 with vdpbf16ps: operands packed once into pair
                  panels (gemm.h), keys and values per call, Q per task */
    int64_t panel; /* words of one block's pair panel: ceil(D / 2) x 64 lanes */
} geo;

/* A block of query rows: row i is position pos[i] of query head h + hd[i]
 * (h: the task's head; hd is 0 except in the forward's grouped blocks). */
typedef struct {
    int64_t i0, nq;
    int64_t lim[BQ];
    int64_t pos[BQ];
    int hd[BQ];
    int64_t minlim, maxlim;
    int32_t smin, smax;
} qblock;

static geo make_geo(const at_tensor *q, const at_tensor *k, const at_attn_params *p)
{
    geo g;
    g.B = q->shape[0];
    g.Tq = q->shape[1];
    g.Hq = q->shape[2];
    g.D = q->shape[3];
    g.Tk = k->shape[1];
    g.Hkv = k->shape[2];
    g.G = g.Hq / g.Hkv;
    g.scale = p->scale;
    g.qidx = p->q_index ? at_tensor_data(p->q_index) : NULL;
    g.kvlen = p->kv_len ? at_tensor_data(p->kv_len) : NULL;
    g.seg = p->segments ? at_tensor_data(p->segments) : NULL;
    g.v = at_cpu_simd_get();
    g.bf16 = p->bf16;
    g.round = p->bf16 && !at_cpu_gemm_acc_bf16_native();
    g.pairs = p->bf16 && !g.round;
    g.panel = (g.D + 1) / 2 * BK;
    return g;
}

/* C += A · B (gemm_acc's arguments), in bf16 where the model computes in it. */
static void product(const geo *g, float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                    int64_t ldb, int64_t M, int64_t N, int64_t K)
{
    if (g->bf16 && !g->round) at_cpu_gemm_acc_bf16(c, ldc, a, a_rs, a_cs, b, ldb, M, N, K);
    else g->v->gemm_acc(c, ldc, a, a_rs, a_cs, b, ldb, M, N, K);
}

/* nrows rows of n values, rows ld apart, rounded to bf16 in place where the
 * products' operands are rounded before the f32 kernel (g->round). */
static void round_operand(const geo *g, float *x, int64_t ld, int64_t nrows, int64_t n)
{
    if (!g->round) return;
    for (int64_t r = 0; r < nrows; r++) at_cpu_round_bf16(g->v, x + r * ld, x + r * ld, n);
}

/* Fills lim[], minlim/maxlim and the segment range from pos[0..nq). */
static void qblock_limits(const geo *g, int64_t b, qblock *qk)
{
    int64_t kvl = g->Tk;
    if (g->kvlen) kvl = g->kvlen[b] < 0 ? 0 : (g->kvlen[b] > g->Tk ? g->Tk : g->kvlen[b]);
    qk->minlim = INT64_MAX;
    qk->maxlim = -1;
    qk->smin = INT32_MAX;
    qk->smax = INT32_MIN;
    for (int64_t i = 0; i < qk->nq; i++) {
        int64_t qi = qk->pos[i];
        int64_t lim = g->qidx ? (int64_t)g->qidx[b * g->Tq + qi] : g->Tk - g->Tq + qi;
        if (lim > kvl - 1) lim = kvl - 1;
        if (lim < -1) lim = -1;
        qk->lim[i] = lim;
        if (lim < qk->minlim) qk->minlim = lim;
        if (lim > qk->maxlim) qk->maxlim = lim;
        if (g->seg) {
            int32_t s = g->seg[b * g->Tq + qi];
            if (s < qk->smin) qk->smin = s;
            if (s > qk->smax) qk->smax = s;
        }
    }
}

/* Positions qb·BQ.. of one head. */
static void qblock_setup(const geo *g, int64_t b, int64_t qb, qblock *qk)
{
    qk->i0 = qb * BQ;
    qk->nq = g->Tq - qk->i0 < BQ ? g->Tq - qk->i0 : BQ;
    for (int64_t i = 0; i < qk->nq; i++) {
        qk->pos[i] = qk->i0 + i;
        qk->hd[i] = 0;
    }
    qblock_limits(g, b, qk);
}

/* Every position of the G query heads of one kv head (G·Tq <= BQ): decoding
 * then reads each key and value once per kv head, not once per query head. */
static void qblock_group(const geo *g, int64_t b, qblock *qk)
{
    qk->i0 = 0;
    qk->nq = g->G * g->Tq;
    for (int64_t i = 0; i < qk->nq; i++) {
        qk->pos[i] = i % g->Tq;
        qk->hd[i] = (int)(i / g->Tq);
    }
    qblock_limits(g, b, qk);
}

/* 0: no query of the block sees a key of [j0, j0+nk); 1: some do (mask
 * needed); 2: all see all. */
static int block_visibility(const geo *g, int64_t b, const qblock *qk, int64_t j0, int64_t nk)
{
    if (j0 > qk->maxlim) return 0;
    int full = j0 + nk - 1 <= qk->minlim;
    if (g->seg) {
        int32_t kmin = INT32_MAX, kmax = INT32_MIN;
        for (int64_t j = j0; j < j0 + nk; j++) {
            int32_t s = g->seg[b * g->Tk + j];
            if (s < kmin) kmin = s;
            if (s > kmax) kmax = s;
        }
        if (kmax < qk->smin || kmin > qk->smax) return 0;
        if (!(kmin == kmax && qk->smin == qk->smax && kmin == qk->smin)) full = 0;
    }
    return full ? 2 : 1;
}

static void apply_mask(const geo *g, int64_t b, const qblock *qk, int64_t j0, int64_t nk, float *S)
{
    for (int64_t i = 0; i < qk->nq; i++) {
        float *row = S + i * BK;
        int64_t lim = qk->lim[i] - j0; /* last visible column, may be < 0 */
        for (int64_t j = lim + 1 < 0 ? 0 : lim + 1; j < nk; j++) row[j] = -INFINITY;
        if (g->seg) {
            int32_t si = g->seg[b * g->Tq + qk->pos[i]];
            const int32_t *sk = g->seg + b * g->Tk + j0;
            for (int64_t j = 0; j < nk && j <= lim; j++)
                if (sk[j] != si) row[j] = -INFINITY;
        }
    }
}

/* nrows rows of D elements, rows `stride` elements apart, to f32 dst[nrows][D], times mul;
 * an operand of the bf16 products (round_operand) when `operand`. */
static void load_rows(const geo *g, float *dst, const void *base, at_dtype t, int64_t off, int64_t stride,
                      int64_t nrows, float mul, int operand)
{
    for (int64_t r = 0; r < nrows; r++) {
        const void *src = at_cpu_elem(base, t, off + r * stride);
        if (t == AT_F32 && mul != 1.0f) { /* one pass */
            g->v->scale(dst + r * g->D, src, mul, g->D);
            continue;
        }
        g->v->load(dst + r * g->D, src, t, g->D);
        if (mul != 1.0f) g->v->scale(dst + r * g->D, dst + r * g->D, mul, g->D);
    }
    if (operand) round_operand(g, dst, g->D, nrows, g->D);
}

/* Key (or value) rows j0.. of (b, kvh) to f32, transposed to dst_t[D][BK];
 * also row-major to dst (when not NULL); tmp holds one row. An operand of the
 * products (round_operand). */
static void load_keys(const geo *g, float *dst, float *dst_t, float *tmp, const void *base, at_dtype t, int64_t b,
                      int64_t kvh, int64_t j0, int64_t nk)
{
    int64_t D = g->D;
    for (int64_t j = 0; j < nk; j++) {
        float *row = dst ? dst + j * D : tmp;
        g->v->load(row, at_cpu_elem(base, t, ((b * g->Tk + j0 + j) * g->Hkv + kvh) * D), t, D);
        round_operand(g, row, D, 1, D);
        for (int64_t d = 0; d < D; d++) dst_t[d * BK + j] = row[d];
    }
}

static void store_rows(const geo *g, void *base, at_dtype t, int64_t off, int64_t stride, int64_t nrows,
                       const float *src)
{
    for (int64_t r = 0; r < nrows; r++)
        g->v->store(at_cpu_elem(base, t, off + r * stride), t, src + r * g->D, g->D);
}

/* S[nq][nk] = Qs · Kt (Kt is [D][BK]) */
static void scores(const geo *g, float *S, const float *Qs, const float *Kt, int64_t nq, int64_t nk)
{
    for (int64_t i = 0; i < nq; i++) memset(S + i * BK, 0, (size_t)nk * sizeof(float));
    product(g, S, BK, Qs, g->D, 1, Kt, BK, nq, nk, g->D);
}

/* nrows rows of D values, `stride` apart, as f32: in place where the source is
 * f32, else loaded into tmp ([nrows][D], *ld set to the rows' distance). */
static const float *rows_f32(const geo *g, const void *base, at_dtype t, int64_t off, int64_t stride, int64_t nrows,
                             float *tmp, int64_t *ld)
{
    if (t == AT_F32) {
        *ld = stride;
        return (const float *)base + off;
    }
    load_rows(g, tmp, base, t, off, stride, nrows, 1.0f, 0);
    *ld = g->D;
    return tmp;
}

/* Key (or value) block kb of (b, kvh) as a pair panel with the keys as lanes
 * and D along k (pairs in rows): what q·kᵀ (and dO·vᵀ) take as their right
 * operand; with of != NULL also with D as lanes and the keys along k (pairs
 * of rows: dS·K). Only the keys before Tk and kv_len are read (a KV cache
 * may hold garbage past them); the products never take the lanes or pairs
 * past them. tmp holds BK x D floats. */
static void pack_key_block(const geo *g, uint32_t *in, uint32_t *of, int64_t ld_of, const void *base, at_dtype t,
                           int64_t b, int64_t kvh, int64_t kb, float *tmp)
{
    int64_t D = g->D, j0 = kb * BK, kvl = g->Tk, ld;
    if (g->kvlen) kvl = g->kvlen[b] < 0 ? 0 : (g->kvlen[b] > g->Tk ? g->Tk : g->kvlen[b]);
    int64_t nk = kvl - j0 < BK ? kvl - j0 : BK;
    if (nk <= 0) return;
    const float *x = rows_f32(g, base, t, ((b * g->Tk + j0) * g->Hkv + kvh) * D, g->Hkv * D, nk, tmp, &ld);
    at_cpu_bf16_pairs_in_rows(in, BK, x, ld, nk, D);
    if (of) at_cpu_bf16_pairs_of_rows(of, ld_of, x, ld, nk, D);
}

/* ---- forward ---- */

typedef struct {
    const void *q, *k, *vv;
    at_dtype qt, kt, vt;
    void *out;
    at_dtype ot;
    float *lse;
    uint32_t *kpairs; /* g->pairs: the key blocks' panels, [B, Hkv, nkb] */
    int64_t nkb;
} fwd_args;

static size_t fwd_ws_floats(int64_t D) { return (size_t)(2 * BQ * D + 3 * BK * D + BQ * BK + 2 * BQ); }

/* The rows of qk (heads h + hd[i], batch b), keys of kv head h / G. */
static void fwd_task(const geo *g, const fwd_args *a, float *ws, int64_t b, int64_t h, const qblock *qkp)
{
    const at_cpu_simd *v = g->v;
    int64_t D = g->D, kvh = h / g->G;
    float *Qs = ws, *O = Qs + BQ * D, *Kt = O + BQ * D, *Vf = Kt + BK * D, *tmp = Vf + BK * D, *S = tmp + BK * D;
    float *m = S + BQ * BK, *l = m + BQ;
    const qblock qk = *qkp;
    int64_t nq = qk.nq, qoff[BQ];
    for (int64_t i = 0; i < nq; i++) {
        qoff[i] = ((b * g->Tq + qk.pos[i]) * g->Hq + h + qk.hd[i]) * D;
        load_rows(g, Qs + i * D, a->q, a->qt, qoff[i], 0, 1, g->scale, 1);
    }
    memset(O, 0, (size_t)(nq * D) * sizeof(float));
    for (int64_t i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0;
    }
    uint32_t *Qp = (uint32_t *)Kt; /* g->pairs: Q as pairs in rows, in Kt's place */
    if (g->pairs) at_cpu_bf16_pairs_in_rows(Qp, BQ, Qs, D, nq, D);
    for (int64_t j0 = 0; j0 <= qk.maxlim; j0 += BK) {
        int64_t nk = qk.maxlim + 1 - j0 < BK ? qk.maxlim + 1 - j0 : BK;
        int vis = block_visibility(g, b, &qk, j0, nk);
        if (!vis) continue;
        if (g->pairs) {
            const uint32_t *Kp = a->kpairs + ((b * g->Hkv + kvh) * a->nkb + j0 / BK) * g->panel;
            at_cpu_gemm_acc_bf16_pairs(S, BK, Qp, BQ, Kp, BK, nq, nk, (D + 1) / 2, 0);
        } else {
            load_keys(g, NULL, Kt, tmp, a->k, a->kt, b, kvh, j0, nk);
            scores(g, S, Qs, Kt, nq, nk);
        }
        /* values in place where they are f32 (P·V is f32: not rounded) */
        const float *Vb = Vf;
        int64_t ldv = D;
        if (a->vt == AT_F32) {
            Vb = (const float *)a->vv + ((b * g->Tk + j0) * g->Hkv + kvh) * D;
            ldv = g->Hkv * D;
        } else {
            load_rows(g, Vf, a->vv, a->vt, ((b * g->Tk + j0) * g->Hkv + kvh) * D, g->Hkv * D, nk, 1.0f, 0);
        }
        if (vis == 1) apply_mask(g, b, &qk, j0, nk, S);
        for (int64_t i = 0; i < nq; i++) {
            float *row = S + i * BK;
            float mx = v->max(row, nk);
            if (mx == -INFINITY) { /* nothing visible in this block for query i */
                memset(row, 0, (size_t)nk * sizeof(float));
                continue;
            }
            float mn = mx > m[i] ? mx : m[i];
            float alpha = expf(m[i] - mn); /* 0 while m = −inf */
            if (alpha != 1.0f) v->scale(O + i * D, O + i * D, alpha, D);
            l[i] = l[i] * alpha + v->sum_exp(row, row, mn, nk);
            m[i] = mn;
        }
        /* in f32 even for a bf16 model: P here is relative to the running max,
         * which depends on where the key blocks fall (packed samples, the
         * micro-batch layout); rounded, it would make the result depend on
         * them beyond the order of the sums (test_mpi). The backward's P is
         * relative to lse and takes bf16. */
        v->gemm_acc(O, D, S, BK, 1, Vb, ldv, nq, D, nk);
    }
    for (int64_t i = 0; i < nq; i++) {
        float *o = O + i * D;
        float L;
        if (l[i] > 0) {
            v->scale(o, o, 1.0f / l[i], D);
            L = m[i] + logf(l[i]);
        } else {
            memset(o, 0, (size_t)D * sizeof(float));
            L = -INFINITY;
        }
        if (a->lse) a->lse[(b * g->Hq + h + qk.hd[i]) * g->Tq + qk.pos[i]] = L;
        store_rows(g, a->out, a->ot, qoff[i], 0, 1, o);
    }
}

static at_status alloc_ws(int nt, size_t per, float **ws, const char *op)
{
    *ws = malloc((size_t)nt * per * sizeof(float));
    if (!*ws) return at_error(AT_ERR_NOMEM, "%s: no memory for %d × %zu floats of scratch", op, nt, per);
    return AT_OK;
}

at_status at_cpu_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                                   const at_tensor *v, const at_attn_params *p)
{
    geo g = make_geo(q, k, p);
    int64_t nkb = (g.Tk + BK - 1) / BK, nkblocks = g.B * g.Hkv * nkb;
    fwd_args a = {at_tensor_data(q), at_tensor_data(k), at_tensor_data(v), q->dtype, k->dtype, v->dtype,
                  at_tensor_data(out), out->dtype, lse ? at_tensor_data(lse) : NULL, NULL, nkb};
    /* few query positions (decoding): one task per kv head and its G query
     * heads (qblock_group); else per query head and block of positions */
    int grouped = g.G > 1 && g.G * g.Tq <= BQ;
    int64_t nqb = (g.Tq + BQ - 1) / BQ, ntask = grouped ? g.B * g.Hkv : g.B * g.Hq * nqb;
    if (ntask == 0) return AT_OK;
    int nt = g.B * g.Hq * g.Tq * g.Tk * g.D >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1;
    if (nt > ntask) nt = (int)ntask;
    /* decoding: one thread or all, as measured (base/threads.h), by the size
     * of the keys and values; a task gives the same values on any thread */
    int timed = nt > 1 && g.Tq <= 8 && !omp_in_parallel();
    unsigned key = timed ? at_par_key(40, 8.0 * (double)(g.B * g.Hkv * g.Tk * g.D)) : 0;
    if (timed) nt = at_par_threads(key, nt);
    double t0 = timed ? at_now_seconds() : 0;
    size_t per = fwd_ws_floats(g.D);
    float *ws;
    AT_TRY(alloc_ws(nt, per, &ws, "attention_forward"));
    if (g.pairs) {
        a.kpairs = malloc((size_t)(nkblocks * g.panel + 1) * sizeof(uint32_t)); /* + 1: no keys is not no memory */
        if (!a.kpairs) {
            free(ws);
            return at_error(AT_ERR_NOMEM, "attention_forward: no memory for %lld key blocks", (long long)nkblocks);
        }
    }
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *w = ws + (size_t)omp_get_thread_num() * per;
        if (g.pairs) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < nkblocks; t++)
                pack_key_block(&g, a.kpairs + t * g.panel, NULL, 0, a.k, a.kt, t / (g.Hkv * nkb), t / nkb % g.Hkv,
                               t % nkb, w);
        }
        /* later query blocks see more keys: hand tasks out one at a time */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            qblock qk;
            if (grouped) {
                int64_t b = t / g.Hkv;
                qblock_group(&g, b, &qk);
                fwd_task(&g, &a, w, b, t % g.Hkv * g.G, &qk);
            } else {
                int64_t qb = t % nqb, h = (t / nqb) % g.Hq, b = t / (nqb * g.Hq);
                qblock_setup(&g, b, qb, &qk);
                fwd_task(&g, &a, w, b, h, &qk);
            }
        }
    }
    if (timed) at_par_record(key, nt, at_now_seconds() - t0);
    free(a.kpairs);
    free(ws);
    return AT_OK;
}

/* ---- backward ---- */

/* g->pairs: every operand that more than one block takes, packed once per
 * call (gemm.h's pair panels): of each key block (b, kv head, kb) K and V
 * with the keys as lanes (pairs in rows: q·kᵀ, dO·vᵀ) and K with D as lanes
 * (pairs of rows: dS·K); of each query block (b, head, qb) the scaled Q and
 * dO both ways (pairs in rows: q·kᵀ, dO·vᵀ; pairs of rows: dSᵀ·Q, Pᵀ·dO). */
typedef struct {
    uint32_t *k_in, *k_of, *v_in; /* [B, Hkv, nkb] panels */
    uint32_t *q_in, *q_of, *do_in, *do_of; /* [B, Hq, nqb] panels */
    int64_t ld_of; /* lanes of a pairs-of-rows panel: D rounded up to 16 */
    int64_t panel_of; /* its words: BQ / 2 pairs */
} bwd_pairs;

typedef struct {
    const void *q, *k, *vv, *dout, *out;
    at_dtype qt, kt, vt, dot, outt;
    const float *lse;
    float *Dd; /* [B, Hq, Tq] */
    void *dq, *dk, *dv;
    at_dtype dqt, dkt, dvt;
    float *ds;              /* the dS store, [B, Hq, nqb, nkb] tiles of BQ x BK (g->pairs: pair panels of
                               dS with the queries as lanes); NULL: none */
    unsigned char *ds_done; /* per tile: pass 1 wrote it */
    int64_t nqb, nkb;
    bwd_pairs pp;
} bwd_args;

/* Index of the dS tile of (b, h, qb, kb) in the store. */
static int64_t ds_tile(const geo *g, const bwd_args *a, int64_t b, int64_t h, int64_t qb, int64_t kb)
{
    return ((b * g->Hq + h) * a->nqb + qb) * a->nkb + kb;
}

/* Qs, dO, acc1, acc2 ([BQ or BK][D] each), Kf, Kt, Vt, tmp ([BK][D]), S, dP ([BQ][BK]), two pair
 * panels (BQ / 2 x BK) */
static size_t bwd_ws_floats(int64_t D) { return (size_t)(8 * BK * D + 3 * BQ * BK); }

/* The operands of one query block: Qs (scaled), dO (rows ldo apart), lse
 * and D; with g->pairs their panels instead of Qs and dO. */
typedef struct {
    const float *Qs, *dO, *L, *Di;
    int64_t ldo;
    const uint32_t *q_in, *q_of, *do_in, *do_of;
} qside;

/* The operands of one key block: Kt, Vt ([D][BK]) and Kf ([BK][D]) where
 * loaded; with g->pairs their panels. */
typedef struct {
    const float *Kt, *Vt, *Kf;
    const uint32_t *k_in, *k_of, *v_in;
} kside;

/* The query side of block qk of head h: with g->pairs pointers to the
 * panels; else loads Qs (scaled) into the scratch, and dO in place where
 * dout is f32 and needs no rounding, else into dO. */
static qside load_qside(const geo *g, const bwd_args *a, int64_t b, int64_t h, const qblock *qk, float *Qs,
                        float *dO)
{
    int64_t D = g->D, qstride = g->Hq * D, qoff = ((b * g->Tq + qk->i0) * g->Hq + h) * D, row = (b * g->Hq + h) * g->Tq;
    qside q = {Qs, dO, a->lse + row + qk->i0, a->Dd + row + qk->i0, D, NULL, NULL, NULL, NULL};
    if (g->pairs) {
        int64_t blk = (b * g->Hq + h) * a->nqb + qk->i0 / BQ;
        q.q_in = a->pp.q_in + blk * g->panel;
        q.do_in = a->pp.do_in + blk * g->panel;
        q.q_of = a->pp.q_of + blk * a->pp.panel_of;
        q.do_of = a->pp.do_of + blk * a->pp.panel_of;
        return q;
    }
    load_rows(g, Qs, a->q, a->qt, qoff, qstride, qk->nq, g->scale, 1);
    if (a->dot == AT_F32 && !g->round) {
        q.dO = (const float *)a->dout + qoff;
        q.ldo = qstride;
    } else {
        load_rows(g, dO, a->dout, a->dot, qoff, qstride, qk->nq, 1.0f, 1);
    }
    return q;
}

/* The key side of block kb of kv head kvh: with g->pairs the panels; else
 * Kt, Vt loaded, and Kf too when given. */
static kside load_kside(const geo *g, const bwd_args *a, int64_t b, int64_t kvh, int64_t kb, int64_t nk, float *Kf,
                        float *Kt, float *Vt, float *tmp)
{
    kside k = {Kt, Vt, Kf, NULL, NULL, NULL};
    if (g->pairs) {
        int64_t blk = (b * g->Hkv + kvh) * a->nkb + kb;
        k.k_in = a->pp.k_in + blk * g->panel;
        k.v_in = a->pp.v_in + blk * g->panel;
        k.k_of = a->pp.k_of + blk * a->pp.panel_of;
        return k;
    }
    load_keys(g, Kf, Kt, tmp, a->k, a->kt, b, kvh, kb * BK, nk);
    load_keys(g, NULL, Vt, tmp, a->vv, a->vt, b, kvh, kb * BK, nk);
    return k;
}

/* P = exp(S − lse) (masked → 0; rows with lse = −inf see nothing → 0), then
 * dP = dO Vᵀ and dS = P ∘ (dP − D) in place of dP; P and dS leave as
 * operands of the products (round_operand). */
static void probs_and_ds(const geo *g, int64_t b, const qblock *qk, int vis, int64_t j0, int64_t nk, const qside *q,
                         const kside *k, float *S, float *dP)
{
    const at_cpu_simd *v = g->v;
    int64_t nq = qk->nq, kp = (g->D + 1) / 2;
    if (g->pairs) at_cpu_gemm_acc_bf16_pairs(S, BK, q->q_in, BQ, k->k_in, BK, nq, nk, kp, 0);
    else scores(g, S, q->Qs, k->Kt, nq, nk);
    if (vis == 1) apply_mask(g, b, qk, j0, nk, S);
    for (int64_t i = 0; i < nq; i++) {
        float *row = S + i * BK;
        if (q->L[i] == -INFINITY) memset(row, 0, (size_t)nk * sizeof(float));
        else v->exp_scale(row, row, q->L[i], 1.0f, nk);
    }
    if (g->pairs) {
        at_cpu_gemm_acc_bf16_pairs(dP, BK, q->do_in, BQ, k->v_in, BK, nq, nk, kp, 0);
    } else {
        for (int64_t i = 0; i < nq; i++) memset(dP + i * BK, 0, (size_t)nk * sizeof(float));
        product(g, dP, BK, q->dO, q->ldo, 1, k->Vt, BK, nq, nk, g->D);
    }
    for (int64_t i = 0; i < nq; i++) {
        const float *pr = S + i * BK;
        float *dr = dP + i * BK, di = q->Di[i];
        for (int64_t j = 0; j < nk; j++) dr[j] = pr[j] * (dr[j] - di);
    }
    /* from here on both are operands of products only */
    round_operand(g, S, BK, nq, nk);
    round_operand(g, dP, BK, nq, nk);
}

/* Pass 1: dK, dV of key block kb of kv head kvh. */
static void bwd_kv_task(const geo *g, const bwd_args *a, float *ws, int64_t b, int64_t kvh, int64_t kb)
{
    int64_t D = g->D, j0 = kb * BK, nk = g->Tk - j0 < BK ? g->Tk - j0 : BK;
    /* keys at or past kv_len are never read (a KV cache may hold garbage
     * there); their dK, dV rows stay 0 */
    int64_t kvl = g->Tk, nk_all = nk;
    if (g->kvlen) kvl = g->kvlen[b] < 0 ? 0 : (g->kvlen[b] > g->Tk ? g->Tk : g->kvlen[b]);
    if (nk > kvl - j0) nk = kvl - j0 > 0 ? kvl - j0 : 0;
    float *Qs = ws, *dO = Qs + BK * D, *dK = dO + BK * D, *dV = dK + BK * D, *Kt = dV + BK * D, *Vt = Kt + BK * D;
    float *tmp = Vt + BK * D, *S = tmp + 2 * BK * D, *dP = S + BQ * BK;
    /* g->pairs: Pᵀ and dSᵀ as pair panels, the keys as lanes */
    uint32_t *Pt = (uint32_t *)(dP + BQ * BK), *dSt = Pt + BQ / 2 * BK;
    memset(dK, 0, (size_t)(BK * D) * sizeof(float));
    memset(dV, 0, (size_t)(BK * D) * sizeof(float));
    int64_t nqb = (g->Tq + BQ - 1) / BQ;
    int loaded = 0;
    kside k = {0};
    for (int64_t h = kvh * g->G; h < (kvh + 1) * g->G && nk > 0; h++) {
        for (int64_t qb = 0; qb < nqb; qb++) {
            qblock qk;
            qblock_setup(g, b, qb, &qk);
            int vis = block_visibility(g, b, &qk, j0, nk);
            if (!vis) continue;
            if (!loaded) {
                k = load_kside(g, a, b, kvh, kb, nk, NULL, Kt, Vt, tmp);
                loaded = 1;
            }
            qside q = load_qside(g, a, b, h, &qk, Qs, dO);
            int64_t tile = ds_tile(g, a, b, h, qb, kb);
            float *dS = a->ds && !g->pairs ? a->ds + tile * (BQ * BK) : dP;
            probs_and_ds(g, b, &qk, vis, j0, nk, &q, &k, S, dS);
            /* dV[j] += Σ_i P[i, j] dO[i];  dK[j] += Σ_i dS[i, j] Qs[i]  (Qs carries the scale) */
            if (g->pairs) {
                int64_t kq = (qk.nq + 1) / 2;
                at_cpu_bf16_pairs_of_rows(Pt, BK, S, BK, qk.nq, nk);
                at_cpu_bf16_pairs_of_rows(dSt, BK, dS, BK, qk.nq, nk);
                at_cpu_gemm_acc_bf16_pairs(dV, D, Pt, BK, q.do_of, a->pp.ld_of, nk, D, kq, 1);
                at_cpu_gemm_acc_bf16_pairs(dK, D, dSt, BK, q.q_of, a->pp.ld_of, nk, D, kq, 1);
                /* pass 2 takes dS with the queries as lanes */
                if (a->ds) at_cpu_bf16_pairs_in_rows((uint32_t *)(a->ds + tile * (BQ * BK)), BQ, dS, BK, qk.nq, nk);
            } else {
                product(g, dV, D, S, 1, BK, q.dO, q.ldo, nk, D, qk.nq);
                product(g, dK, D, dS, 1, BK, q.Qs, D, nk, D, qk.nq);
            }
            if (a->ds) a->ds_done[tile] = 1;
        }
    }
    int64_t koff = ((b * g->Tk + j0) * g->Hkv + kvh) * D, kstride = g->Hkv * D;
    store_rows(g, a->dk, a->dkt, koff, kstride, nk_all, dK);
    store_rows(g, a->dv, a->dvt, koff, kstride, nk_all, dV);
}

/* dQ += dS K for one key block, dS [nq][BK] (f32, or with g->pairs a pair
 * panel with the queries as lanes). */
static void dq_product(const geo *g, const bwd_args *a, float *dQ, const float *dS, const kside *k, int64_t nq,
                       int64_t nk)
{
    if (g->pairs)
        at_cpu_gemm_acc_bf16_pairs(dQ, g->D, (const uint32_t *)dS, BQ, k->k_of, a->pp.ld_of, nq, g->D, (nk + 1) / 2, 1);
    else
        product(g, dQ, g->D, dS, BK, 1, k->Kf, g->D, nq, g->D, nk);
}

/* Pass 2: dQ of query block qb of head h. */
static void bwd_q_task(const geo *g, const bwd_args *a, float *ws, int64_t b, int64_t h, int64_t qb)
{
    const at_cpu_simd *v = g->v;
    int64_t D = g->D, kvh = h / g->G;
    float *Qs = ws, *dO = Qs + BK * D, *dQ = dO + BK * D, *Kf = dQ + BK * D, *Kt = Kf + BK * D, *Vt = Kt + BK * D;
    float *tmp = Vt + BK * D, *S = tmp + 2 * BK * D, *dP = S + BQ * BK;
    qblock qk;
    qblock_setup(g, b, qb, &qk);
    qside q = load_qside(g, a, b, h, &qk, Qs, dO);
    memset(dQ, 0, (size_t)(qk.nq * D) * sizeof(float));
    for (int64_t j0 = 0; j0 <= qk.maxlim; j0 += BK) {
        int64_t nk = qk.maxlim + 1 - j0 < BK ? qk.maxlim + 1 - j0 : BK;
        int vis = block_visibility(g, b, &qk, j0, nk);
        if (!vis) continue;
        int64_t tile = ds_tile(g, a, b, h, qb, j0 / BK);
        if (a->ds && a->ds_done[tile]) {
            /* pass 1's tile: its columns past this block's last visible key
             * (pass 1 may have had more) are dS = 0 for every row */
            kside k = {0};
            if (g->pairs) k = load_kside(g, a, b, kvh, j0 / BK, nk, Kf, Kt, Vt, tmp);
            else load_rows(g, Kf, a->k, a->kt, ((b * g->Tk + j0) * g->Hkv + kvh) * D, g->Hkv * D, nk, 1.0f, 1);
            k.Kf = Kf;
            dq_product(g, a, dQ, a->ds + tile * (BQ * BK), &k, qk.nq, nk);
            continue;
        }
        kside k = load_kside(g, a, b, kvh, j0 / BK, nk, Kf, Kt, Vt, tmp);
        probs_and_ds(g, b, &qk, vis, j0, nk, &q, &k, S, dP);
        if (g->pairs) { /* dS with the queries as lanes, in S's place */
            at_cpu_bf16_pairs_in_rows((uint32_t *)S, BQ, dP, BK, qk.nq, nk);
            dq_product(g, a, dQ, S, &k, qk.nq, nk);
        } else {
            dq_product(g, a, dQ, dP, &k, qk.nq, nk);
        }
    }
    for (int64_t i = 0; i < qk.nq; i++) v->scale(dQ + i * D, dQ + i * D, g->scale, D);
    int64_t qstride = g->Hq * D, qoff = ((b * g->Tq + qk.i0) * g->Hq + h) * D;
    store_rows(g, a->dq, a->dqt, qoff, qstride, qk.nq, dQ);
}

/* g->pairs: the panels of one item of the backward's first loop, items
 * [0, B·Hkv·nkb) the key blocks, then the query blocks, whose D_i it sums
 * too (at_cpu_attention_backward says how). tmp holds 4 x BQ x D floats. */
static void pack_bwd_item(const geo *g, const bwd_args *a, int64_t t, float *tmp)
{
    int64_t D = g->D, nkblocks = g->B * g->Hkv * a->nkb;
    const bwd_pairs *pp = &a->pp;
    if (t < nkblocks) {
        int64_t kb = t % a->nkb, kvh = t / a->nkb % g->Hkv, b = t / (a->nkb * g->Hkv);
        pack_key_block(g, pp->k_in + t * g->panel, pp->k_of + t * pp->panel_of, pp->ld_of, a->k, a->kt, b, kvh, kb,
                       tmp);
        pack_key_block(g, pp->v_in + t * g->panel, NULL, 0, a->vv, a->vt, b, kvh, kb, tmp);
        return;
    }
    t -= nkblocks;
    int64_t qb = t % a->nqb, h = t / a->nqb % g->Hq, b = t / (a->nqb * g->Hq);
    int64_t i0 = qb * BQ, nq = g->Tq - i0 < BQ ? g->Tq - i0 : BQ, ldo, ldy;
    int64_t qstride = g->Hq * D, qoff = ((b * g->Tq + i0) * g->Hq + h) * D;
    uint32_t *q_in = pp->q_in + t * g->panel, *do_in = pp->do_in + t * g->panel;
    uint32_t *y_in = (uint32_t *)(tmp + 3 * BQ * D);
    load_rows(g, tmp, a->q, a->qt, qoff, qstride, nq, g->scale, 0);
    at_cpu_bf16_pairs_in_rows(q_in, BQ, tmp, D, nq, D);
    at_cpu_bf16_pairs_of_rows(pp->q_of + t * pp->panel_of, pp->ld_of, tmp, D, nq, D);
    const float *dO = rows_f32(g, a->dout, a->dot, qoff, qstride, nq, tmp + BQ * D, &ldo);
    at_cpu_bf16_pairs_in_rows(do_in, BQ, dO, ldo, nq, D);
    at_cpu_bf16_pairs_of_rows(pp->do_of + t * pp->panel_of, pp->ld_of, dO, ldo, nq, D);
    const float *y = rows_f32(g, a->out, a->outt, qoff, qstride, nq, tmp + 2 * BQ * D, &ldy);
    at_cpu_bf16_pairs_in_rows(y_in, BQ, y, ldy, nq, D);
    float *Di = a->Dd + (b * g->Hq + h) * g->Tq + i0;
    for (int64_t i = 0; i < nq; i++) at_cpu_gemm_acc_bf16_pairs(Di + i, 1, do_in + i, BQ, y_in + i, BQ, 1, 1, (D + 1) / 2, 0);
}

at_status at_cpu_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                    const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                    const at_tensor *out, const at_tensor *lse, const at_attn_params *p)
{
    geo g = make_geo(q, k, p);
    int64_t nqb = (g.Tq + BQ - 1) / BQ, nkb = (g.Tk + BK - 1) / BK;
    int64_t nrows = g.B * g.Hq * g.Tq;
    int nt = nrows * g.Tk * g.D >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1;
    size_t per = bwd_ws_floats(g.D);
    float *ws = NULL, *Dd = NULL;
    at_status st = alloc_ws(nt, per, &ws, "attention_backward");
    if (st != AT_OK) return st;
    Dd = malloc((size_t)(nrows > 0 ? nrows : 1) * sizeof(float));
    if (!Dd) {
        free(ws);
        return at_error(AT_ERR_NOMEM, "attention_backward: no memory for %lld row sums", (long long)nrows);
    }
    bwd_args a = {at_tensor_data(q), at_tensor_data(k), at_tensor_data(v), at_tensor_data(dout), at_tensor_data(out),
                  q->dtype, k->dtype, v->dtype, dout->dtype, out->dtype, at_tensor_data(lse), Dd,
                  at_tensor_data(dq), at_tensor_data(dk), at_tensor_data(dv), dq->dtype, dk->dtype, dv->dtype,
                  NULL, NULL, nqb, nkb, {0}};
    int64_t nkblocks = g.B * g.Hkv * nkb, nqblocks = g.B * g.Hq * nqb, npack = 0;
    uint32_t *panels = NULL;
    if (g.pairs) {
        bwd_pairs *pp = &a.pp;
        pp->ld_of = (g.D + 15) / 16 * 16;
        pp->panel_of = BQ / 2 * pp->ld_of;
        size_t words = (size_t)(nkblocks * (2 * g.panel + pp->panel_of) + nqblocks * 2 * (g.panel + pp->panel_of));
        panels = malloc((words + 1) * sizeof(uint32_t)); /* + 1: an empty call is not out of memory */
        if (!panels) {
            free(Dd);
            free(ws);
            return at_error(AT_ERR_NOMEM, "attention_backward: no memory for %zu words of pair panels", words);
        }
        pp->k_in = panels;
        pp->v_in = pp->k_in + nkblocks * g.panel;
        pp->k_of = pp->v_in + nkblocks * g.panel;
        pp->q_in = pp->k_of + nkblocks * pp->panel_of;
        pp->do_in = pp->q_in + nqblocks * g.panel;
        pp->q_of = pp->do_in + nqblocks * g.panel;
        pp->do_of = pp->q_of + nqblocks * pp->panel_of;
        npack = nkblocks + nqblocks;
    }
    size_t ntiles = (size_t)(g.B * g.Hq * nqb * nkb);
    if (ntiles > 0 && ntiles <= ds_store_max / (BQ * BK * sizeof(float))) {
        /* without the memory, pass 2 recomputes (no error) */
        a.ds = malloc(ntiles * (BQ * BK) * sizeof(float));
        a.ds_done = a.ds ? calloc(ntiles, 1) : NULL;
        if (!a.ds_done) {
            free(a.ds);
            a.ds = NULL;
        }
    }
    const void *po = at_tensor_data(out), *pdo = at_tensor_data(dout);
    int64_t D = g.D;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *w = ws + (size_t)omp_get_thread_num() * per;
        /* D_i = dout_i · out_i, stored [B, Hq, Tq] like lse; summed as dP is
         * (product: in bf16 too, the same pairs in the same order; with
         * g.pairs by pack_bwd_item, from the same panels), so that where a
         * row sees one key (P = 1, out = v) dS = P ∘ (dP − D) is exactly 0
         * as it should be, on every ISA level, not a rounding residue. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < npack; t++) pack_bwd_item(&g, &a, t, w);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (g.pairs ? 0 : nrows); r++) { /* r walks [B, Tq, Hq] */
            int64_t h = r % g.Hq, i = (r / g.Hq) % g.Tq, b = r / (g.Hq * g.Tq);
            const float *x = at_cpu_in(g.v, w, pdo, dout->dtype, r * D, D);
            const float *y = at_cpu_in(g.v, w + D, po, out->dtype, r * D, D);
            if (g.round) { /* rounded copies (w, w + D) */
                if (x != w) memcpy(w, x, (size_t)D * sizeof(float));
                if (y != w + D) memcpy(w + D, y, (size_t)D * sizeof(float));
                round_operand(&g, w, D, 2, D);
                x = w;
                y = w + D;
            }
            float di = 0.0f;
            product(&g, &di, 1, x, 1, 1, y, 1, 1, 1, D);
            Dd[(b * g.Hq + h) * g.Tq + i] = di;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < g.B * g.Hkv * nkb; t++) {
            int64_t kb = t % nkb, kvh = (t / nkb) % g.Hkv, b = t / (nkb * g.Hkv);
            bwd_kv_task(&g, &a, w, b, kvh, kb);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < g.B * g.Hq * nqb; t++) {
            int64_t qb = t % nqb, h = (t / nqb) % g.Hq, b = t / (nqb * g.Hq);
            bwd_q_task(&g, &a, w, b, h, qb);
        }
    }
    free(panels);
    free(a.ds_done);
    free(a.ds);
    free(Dd);
    free(ws);
    return AT_OK;
}
