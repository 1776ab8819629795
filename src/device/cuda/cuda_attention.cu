/* Causal grouped-query attention on the GPU, FlashAttention's scheme (ops.h
 * at_attention_forward / at_attention_backward; the CPU model is
 * device/cpu/cpu_attention.c, whose comment has the math).
 *
 * Work split. A row (a query, or in the dK/dV pass a key) belongs to a group
 * of TP consecutive threads of a block; thread `sub` of the group holds the
 * dims d = sub + TP·u (u < 16) of that row in registers, so TP·16 >= D
 * (TP = 1, 2, 4, 8, 16, 32: head_dim up to 512). A dot product over D is 16
 * FMAs per thread and log2(TP) xor shuffles inside the group. The other side
 * (keys and values for the forward and dQ, queries and dO for dK/dV) comes
 * a chunk of rows at a time into shared memory as f32, loaded by the whole
 * block with consecutive threads on consecutive elements (coalesced); the
 * threads of a group read consecutive words and the groups of a warp the
 * same ones (broadcast), so there are no bank conflicts. Scores never leave
 * registers: memory is O(T), never T×T.
 *
 * Forward, per query with running max m, sum l and unnormalized output o,
 * one key at a time (online softmax):
 *   s = (scale·q)·k_j;  if s > m: o, l *= exp(m − s), m = s;
 *   p = exp(s − m);  l += p;  o += p·v_j
 * and at the end out = o / l, lse = m + log l; a query that sees no key gets
 * out = 0, lse = −inf.
 *
 * Backward (FlashAttention-2, no atomics): D_i = dout_i·out_i first (a
 * thread group per query), then P is recomputed from lse, p = exp(s − lse) (0 where
 * lse = −inf: nothing visible), ds = p (dp − D_i) with dp = dout_i·v_j:
 *   dK/dV pass: a block per (batch, kv head, key tile), each thread group
 *     owning one key's dk, dv in registers, loops over the queries of every
 *     query head of its group: dv_j += p dout_i, dk_j += ds (scale·q_i);
 *   dQ pass: a block per (batch, query head, query tile) loops over keys:
 *     dq_i += ds k_j, times scale at the end.
 *
 * Visibility of key j to query i of sequence b: j <= lim_i with lim_i =
 * min(q_index[b,i] (default Tk − Tq + i), kv_len[b] − 1), and with segments
 * segments[b,j] == segments[b,i]. Chunks past the block's largest lim are
 * never loaded (so keys at or past kv_len are never read: a KV cache may
 * hold garbage there), and with segments a chunk no pair of which is
 * visible is skipped whole. */
#include <math.h>
#include "device/cuda/cuda_internal.h"

#define ATT_THREADS 256 /* per block, every kernel */
#define ATT_DPT 16      /* dims per thread */
#define ATT_MAX_D (32 * ATT_DPT)
#define ATT_MAX_CHUNK 64

/* The per-thread arrays must stay in registers: their loops are unrolled. */
#ifdef AT_CUDA_EMULATE
#define ATT_UNROLL
#else
#define ATT_UNROLL _Pragma("unroll")
#endif

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, G, D;
    float scale;
    const int32_t *qidx, *kvlen, *seg; /* device pointers or NULL */
} att_geo;

/* Rows of the shared-memory chunk: 32 KiB for K and V (or Q and dO) together. */
static int64_t att_chunk(int64_t D) { return D <= 64 ? 64 : D <= 128 ? 32 : D <= 256 ? 16 : 8; }

/* Threads per row: the smallest power of two with TP·16 >= D. */
static int att_tp(int64_t D)
{
    int tp = 1;
    while (tp * ATT_DPT < D) tp *= 2;
    return tp;
}

static __device__ __forceinline__ int64_t att_kvl(const att_geo &g, int64_t b)
{
    if (!g.kvlen) return g.Tk;
    int64_t n = g.kvlen[b];
    return n < 0 ? 0 : n > g.Tk ? g.Tk : n;
}

/* The last key query i may see (−1: none). */
static __device__ __forceinline__ int64_t att_lim(const att_geo &g, int64_t b, int64_t i, int64_t kvl)
{
    int64_t lim = g.qidx ? (int64_t)g.qidx[b * g.Tq + i] : g.Tk - g.Tq + i;
    if (lim > kvl - 1) lim = kvl - 1;
    return lim < -1 ? -1 : lim;
}

/* Sum over the TP threads of a row group (every lane of the warp calls it). */
template <int TP> static __device__ __forceinline__ float att_group_sum(float v)
{
    for (int o = TP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Rows [r0, r0 + n) of a [B, T, H, D] tensor at (b, head h) into dst[n][D] as f32, times mul. */
static __device__ void att_load_rows(float *dst, const void *src, int dt, const att_geo &g, int64_t T, int64_t H,
                                     int64_t b, int64_t h, int64_t r0, int64_t n, float mul)
{
    int D = (int)g.D, ne = (int)n * D; /* a chunk: at most 64 rows of 512 */
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int r = e / D, d = e % D;
        dst[e] = at_cu_load(src, dt, ((b * T + r0 + r) * H + h) * D + d) * mul;
    }
}

/* Whether any key of [j0, j0 + nk) is visible to any of the n queries whose
 * lims and segments are given (shared arrays). A block-wide vote. */
static __device__ bool att_any_visible(const att_geo &g, int64_t b, const int *lims, const int *segs, int n,
                                       int64_t j0, int64_t nk, float *red)
{
    float f = 0.0f;
    int nkk = (int)nk, np = n * nkk; /* at most 256 rows × 64 keys */
    for (int t = threadIdx.x; t < np; t += blockDim.x) {
        int r = t / nkk;
        int64_t j = j0 + t % nkk;
        if (j <= lims[r] && (!g.seg || g.seg[b * g.Tk + j] == segs[r])) f = 1.0f;
    }
    return at_cu_block_max(f, red) > 0.0f;
}

/* ---- forward ---- */

template <int TP>
static __global__ void k_att_forward(att_geo g, const void *q, int tq, const void *k, int tk, const void *v, int tv,
                                     void *out, int to, float *lse, int64_t kc)
{
    const int RPB = ATT_THREADS / TP;
    AT_DYNAMIC_SHARED(float, smem);
    __shared__ int lims[ATT_THREADS], segq[ATT_THREADS], segk[ATT_MAX_CHUNK];
    __shared__ float red[32];
    float *Ks = smem, *Vs = smem + kc * g.D;
    int64_t nqb = (g.Tq + RPB - 1) / RPB, blk = blockIdx.x;
    int64_t qb = blk % nqb, h = (blk / nqb) % g.Hq, b = blk / (nqb * g.Hq), kvh = h / g.G;
    const int D = (int)g.D;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t i = qb * RPB + row;
    bool valid = i < g.Tq;
    int64_t kvl = att_kvl(g, b);
    int64_t lim = valid ? att_lim(g, b, i, kvl) : -1;
    int segi = valid && g.seg ? g.seg[b * g.Tq + i] : 0;
    if (sub == 0) {
        lims[row] = (int)lim;
        segq[row] = segi;
    }
    int64_t qoff = ((b * g.Tq + i) * g.Hq + h) * D;
    float qr[ATT_DPT], o[ATT_DPT];
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        qr[u] = valid && d < D ? at_cu_load(q, tq, qoff + d) * g.scale : 0.0f;
        o[u] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int64_t maxlim = (int64_t)at_cu_block_max((float)lim, red); /* also publishes lims / segq */
    for (int64_t j0 = 0; j0 <= maxlim; j0 += kc) {
        int64_t nk = maxlim + 1 - j0 < kc ? maxlim + 1 - j0 : kc;
        if (g.seg && !att_any_visible(g, b, lims, segq, RPB, j0, nk, red)) continue;
        __syncthreads(); /* the previous chunk is no longer read */
        att_load_rows(Ks, k, tk, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f);
        att_load_rows(Vs, v, tv, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f);
        if (g.seg)
            for (int64_t t = threadIdx.x; t < nk; t += blockDim.x) segk[t] = g.seg[b * g.Tk + j0 + t];
        __syncthreads();
        for (int64_t jj = 0; jj < nk; jj++) {
            const float *kr = Ks + jj * D, *vr = Vs + jj * D;
            float s = 0.0f;
            ATT_UNROLL
            for (int u = 0; u < ATT_DPT; u++) {
                int d = sub + TP * u;
                if (d < D) s += qr[u] * kr[d];
            }
            s = att_group_sum<TP>(s);
            if (j0 + jj > lim || (g.seg && segk[jj] != segi)) continue;
            if (s > m) { /* a new maximum: rescale what was summed so far */
                float alpha = expf(m - s); /* 0 while m = −inf */
                l *= alpha;
                ATT_UNROLL
                for (int u = 0; u < ATT_DPT; u++) o[u] *= alpha;
                m = s;
            }
            float p = expf(s - m);
            l += p;
            ATT_UNROLL
            for (int u = 0; u < ATT_DPT; u++) {
                int d = sub + TP * u;
                if (d < D) o[u] += p * vr[d];
            }
        }
    }
    if (!valid) return;
    float L = -INFINITY, inv = 0.0f;
    if (l > 0.0f) {
        inv = 1.0f / l;
        L = m + logf(l);
    }
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        if (d < D) at_cu_store(out, to, qoff + d, o[u] * inv);
    }
    if (lse && sub == 0) lse[(b * g.Hq + h) * g.Tq + i] = L;
}

/* ---- backward ---- */

/* Di[b, h, i] = dout_i · out_i (rows walk [B, Tq, Hq]), a group of TP
 * threads per row summing in exactly the order the dK/dV and dQ kernels sum
 * dp = dout_i · v_j: where out_i equals v_j bit for bit (a query that sees
 * one key) dp − D_i is then exactly 0, as in the reference. */
template <int TP> static __global__ void k_att_rowdot(float *Di, const void *dout, int tdo, const void *out, int to,
                                                      att_geo g, int64_t nrows)
{
    const int RPB = ATT_THREADS / TP;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t r = (int64_t)blockIdx.x * RPB + row;
    bool ok = r < nrows; /* every lane reaches the shuffles */
    float s = 0.0f;
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        if (ok && d < g.D) s += at_cu_load(dout, tdo, r * g.D + d) * at_cu_load(out, to, r * g.D + d);
    }
    s = att_group_sum<TP>(s);
    if (ok && sub == 0) {
        int64_t h = r % g.Hq, i = (r / g.Hq) % g.Tq, b = r / (g.Hq * g.Tq);
        Di[(b * g.Hq + h) * g.Tq + i] = s;
    }
}

/* dK, dV of the keys of one tile of one kv head, over every query of the group's heads. */
template <int TP>
static __global__ void k_att_dkdv(att_geo g, const void *q, int tq, const void *k, int tk, const void *v, int tv,
                                  const void *dout, int tdo, const float *lse, const float *Di, void *dk, int tdk,
                                  void *dv, int tdv, int64_t qc)
{
    const int RPB = ATT_THREADS / TP;
    AT_DYNAMIC_SHARED(float, smem);
    __shared__ int lims[ATT_MAX_CHUNK], segs[ATT_MAX_CHUNK];
    __shared__ float Ls[ATT_MAX_CHUNK], Ds[ATT_MAX_CHUNK], red[32];
    float *Qs = smem, *dOs = smem + qc * g.D;
    int64_t nkb = (g.Tk + RPB - 1) / RPB, blk = blockIdx.x;
    int64_t kb = blk % nkb, kvh = (blk / nkb) % g.Hkv, b = blk / (nkb * g.Hkv);
    const int D = (int)g.D;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t j0 = kb * RPB, j = j0 + row;
    int64_t kvl = att_kvl(g, b);
    bool kvalid = j < kvl; /* keys at or past kv_len are never read; their dk, dv stay 0 */
    int segk = j < g.Tk && g.seg ? g.seg[b * g.Tk + j] : 0;
    int64_t koff = ((b * g.Tk + j) * g.Hkv + kvh) * D;
    int64_t nk = kvl - j0 < RPB ? kvl - j0 : RPB; /* the tile's readable keys */
    float kr[ATT_DPT], vr[ATT_DPT], dkr[ATT_DPT], dvr[ATT_DPT];
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        kr[u] = kvalid && d < D ? at_cu_load(k, tk, koff + d) : 0.0f;
        vr[u] = kvalid && d < D ? at_cu_load(v, tv, koff + d) : 0.0f;
        dkr[u] = dvr[u] = 0.0f;
    }
    for (int64_t h = kvh * g.G; h < (kvh + 1) * g.G && nk > 0; h++) {
        for (int64_t i0 = 0; i0 < g.Tq; i0 += qc) {
            int nq = (int)(g.Tq - i0 < qc ? g.Tq - i0 : qc);
            __syncthreads(); /* the previous chunk is no longer read */
            for (int t = threadIdx.x; t < nq; t += blockDim.x) {
                int64_t i = i0 + t;
                lims[t] = (int)att_lim(g, b, i, kvl);
                segs[t] = g.seg ? g.seg[b * g.Tq + i] : 0;
                Ls[t] = lse[(b * g.Hq + h) * g.Tq + i];
                Ds[t] = Di[(b * g.Hq + h) * g.Tq + i];
            }
            __syncthreads();
            if (!att_any_visible(g, b, lims, segs, nq, j0, nk, red)) continue;
            att_load_rows(Qs, q, tq, g, g.Tq, g.Hq, b, h, i0, nq, g.scale);
            att_load_rows(dOs, dout, tdo, g, g.Tq, g.Hq, b, h, i0, nq, 1.0f);
            __syncthreads();
            for (int r = 0; r < nq; r++) {
                const float *qs = Qs + r * D, *dos = dOs + r * D;
                float s = 0.0f, dp = 0.0f;
                ATT_UNROLL
                for (int u = 0; u < ATT_DPT; u++) {
                    int d = sub + TP * u;
                    if (d < D) {
                        s += qs[d] * kr[u];
                        dp += dos[d] * vr[u];
                    }
                }
                s = att_group_sum<TP>(s);
                dp = att_group_sum<TP>(dp);
                float L = Ls[r];
                if (!kvalid || j > lims[r] || (g.seg && segs[r] != segk) || L == -INFINITY) continue;
                float p = expf(s - L), ds = p * (dp - Ds[r]);
                ATT_UNROLL
                for (int u = 0; u < ATT_DPT; u++) {
                    int d = sub + TP * u;
                    if (d < D) {
                        dvr[u] += p * dos[d];
                        dkr[u] += ds * qs[d]; /* qs carries the scale */
                    }
                }
            }
        }
    }
    if (j >= g.Tk) return;
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        if (d < D) {
            at_cu_store(dk, tdk, koff + d, dkr[u]);
            at_cu_store(dv, tdv, koff + d, dvr[u]);
        }
    }
}

/* dQ of one tile of queries of one head, over the keys they see. */
template <int TP>
static __global__ void k_att_dq(att_geo g, const void *q, int tq, const void *k, int tk, const void *v, int tv,
                                const void *dout, int tdo, const float *lse, const float *Di, void *dq, int tdq,
                                int64_t kc)
{
    const int RPB = ATT_THREADS / TP;
    AT_DYNAMIC_SHARED(float, smem);
    __shared__ int lims[ATT_THREADS], segq[ATT_THREADS], segk[ATT_MAX_CHUNK];
    __shared__ float red[32];
    float *Ks = smem, *Vs = smem + kc * g.D;
    int64_t nqb = (g.Tq + RPB - 1) / RPB, blk = blockIdx.x;
    int64_t qb = blk % nqb, h = (blk / nqb) % g.Hq, b = blk / (nqb * g.Hq), kvh = h / g.G;
    const int D = (int)g.D;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t i = qb * RPB + row;
    bool valid = i < g.Tq;
    int64_t kvl = att_kvl(g, b);
    float L = valid ? lse[(b * g.Hq + h) * g.Tq + i] : -INFINITY;
    float Dd = valid ? Di[(b * g.Hq + h) * g.Tq + i] : 0.0f;
    /* a query that sees nothing (lse = −inf) gets dq = 0 */
    int64_t lim = valid && L != -INFINITY ? att_lim(g, b, i, kvl) : -1;
    int segi = valid && g.seg ? g.seg[b * g.Tq + i] : 0;
    if (sub == 0) {
        lims[row] = (int)lim;
        segq[row] = segi;
    }
    int64_t qoff = ((b * g.Tq + i) * g.Hq + h) * D;
    float qr[ATT_DPT], dor[ATT_DPT], dqr[ATT_DPT];
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        qr[u] = valid && d < D ? at_cu_load(q, tq, qoff + d) * g.scale : 0.0f;
        dor[u] = valid && d < D ? at_cu_load(dout, tdo, qoff + d) : 0.0f;
        dqr[u] = 0.0f;
    }
    int64_t maxlim = (int64_t)at_cu_block_max((float)lim, red);
    for (int64_t j0 = 0; j0 <= maxlim; j0 += kc) {
        int64_t nk = maxlim + 1 - j0 < kc ? maxlim + 1 - j0 : kc;
        if (g.seg && !att_any_visible(g, b, lims, segq, RPB, j0, nk, red)) continue;
        __syncthreads();
        att_load_rows(Ks, k, tk, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f);
        att_load_rows(Vs, v, tv, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f);
        if (g.seg)
            for (int64_t t = threadIdx.x; t < nk; t += blockDim.x) segk[t] = g.seg[b * g.Tk + j0 + t];
        __syncthreads();
        for (int64_t jj = 0; jj < nk; jj++) {
            const float *kr = Ks + jj * D, *vr = Vs + jj * D;
            float s = 0.0f, dp = 0.0f;
            ATT_UNROLL
            for (int u = 0; u < ATT_DPT; u++) {
                int d = sub + TP * u;
                if (d < D) {
                    s += qr[u] * kr[d];
                    dp += dor[u] * vr[d];
                }
            }
            s = att_group_sum<TP>(s);
            dp = att_group_sum<TP>(dp);
            if (j0 + jj > lim || (g.seg && segk[jj] != segi)) continue;
            float p = expf(s - L), ds = p * (dp - Dd);
            ATT_UNROLL
            for (int u = 0; u < ATT_DPT; u++) {
                int d = sub + TP * u;
                if (d < D) dqr[u] += ds * kr[d];
            }
        }
    }
    if (!valid) return;
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        if (d < D) at_cu_store(dq, tdq, qoff + d, dqr[u] * g.scale);
    }
}

/* ---- host side ---- */

static at_status att_geometry(cuda_ctx *c, const at_tensor *q, const at_tensor *k, const at_attn_params *p,
                              const char *op, att_geo *g)
{
    g->B = q->shape[0];
    g->Tq = q->shape[1];
    g->Hq = q->shape[2];
    g->D = q->shape[3];
    g->Tk = k->shape[1];
    g->Hkv = k->shape[2];
    g->G = g->Hkv ? g->Hq / g->Hkv : 1;
    g->scale = p->scale;
    g->qidx = p->q_index ? (const int32_t *)cu_ptr(p->q_index) : NULL;
    g->kvlen = p->kv_len ? (const int32_t *)cu_ptr(p->kv_len) : NULL;
    g->seg = p->segments ? (const int32_t *)cu_ptr(p->segments) : NULL;
    if (g->D > ATT_MAX_D)
        return c->host->error(AT_ERR_UNSUPPORTED, "%s: head_dim %lld of %s is above the CUDA kernel's %d", op,
                              (long long)g->D, q->name, ATT_MAX_D);
    /* positions travel as int and through a float block maximum (exact below 2^24) */
    if (g->Tq >= (1 << 24) || g->Tk >= (1 << 24))
        return c->host->error(AT_ERR_UNSUPPORTED, "%s: sequence of %lld queries / %lld keys is too long", op,
                              (long long)g->Tq, (long long)g->Tk);
    return AT_OK;
}

static int att_floating(const at_tensor *t) { return t->dtype == AT_F32 || t->dtype == AT_BF16 || t->dtype == AT_F16; }

#define ATT_DISPATCH(TPV, launch) \
    switch (TPV) {                \
    case 1: launch(1); break;     \
    case 2: launch(2); break;     \
    case 4: launch(4); break;     \
    case 8: launch(8); break;     \
    case 16: launch(16); break;   \
    default: launch(32); break;   \
    }

at_status cu_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                               const at_tensor *v, const at_attn_params *p)
{
    const char *op = "attention_forward";
    cuda_ctx *c = cu_ctx(out);
    att_geo g;
    CU_TRY(att_geometry(c, q, k, p, op, &g));
    if (!att_floating(q) || !att_floating(k) || !att_floating(v) || !att_floating(out))
        return c->host->error(AT_ERR_UNSUPPORTED, "%s: q, k, v and out must be f32, bf16 or f16", op);
    int tp = att_tp(g.D);
    int64_t rpb = ATT_THREADS / tp, kc = att_chunk(g.D);
    int64_t blocks = g.B * g.Hq * ((g.Tq + rpb - 1) / rpb);
    if (blocks == 0) return AT_OK;
    size_t shared = (size_t)(2 * kc * g.D) * sizeof(float);
    float *pl = lse ? (float *)cu_ptr(lse) : NULL;
#define ATT_FWD(T)                                                                                              \
    AT_LAUNCH(k_att_forward<T>, (unsigned)blocks, ATT_THREADS, shared, c->stream, g, cu_ptr(q), (int)q->dtype, \
              cu_ptr(k), (int)k->dtype, cu_ptr(v), (int)v->dtype, cu_ptr(out), (int)out->dtype, pl, kc)
    ATT_DISPATCH(tp, ATT_FWD)
#undef ATT_FWD
    return cu_launched(c, op);
}

at_status cu_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                const at_tensor *q, const at_tensor *k, const at_tensor *v, const at_tensor *out,
                                const at_tensor *lse, const at_attn_params *p)
{
    const char *op = "attention_backward";
    cuda_ctx *c = cu_ctx(dq);
    att_geo g;
    CU_TRY(att_geometry(c, q, k, p, op, &g));
    const at_tensor *all[] = {dq, dk, dv, dout, q, k, v, out};
    for (int i = 0; i < 8; i++)
        if (!att_floating(all[i]))
            return c->host->error(AT_ERR_UNSUPPORTED, "%s: %s must be f32, bf16 or f16", op, all[i]->name);
    int tp = att_tp(g.D);
    int64_t rpb = ATT_THREADS / tp, chunk = att_chunk(g.D);
    int64_t nrows = g.B * g.Tq * g.Hq;
    size_t shared = (size_t)(2 * chunk * g.D) * sizeof(float);
    void *scr = NULL;
    CU_TRY(cu_scratch(c, (size_t)(nrows > 0 ? nrows : 1) * sizeof(float), &scr));
    float *Di = (float *)scr;
    const float *pl = (const float *)cu_ptr(lse);
    if (nrows > 0) {
#define ATT_ROWDOT(T)                                                                                           \
    AT_LAUNCH(k_att_rowdot<T>, (unsigned)((nrows + rpb - 1) / rpb), ATT_THREADS, 0, c->stream, Di, cu_ptr(dout), \
              (int)dout->dtype, cu_ptr(out), (int)out->dtype, g, nrows)
        ATT_DISPATCH(tp, ATT_ROWDOT)
#undef ATT_ROWDOT
        CU_TRY(cu_launched(c, "attention_backward (dout·out)"));
    }
    int64_t kblocks = g.B * g.Hkv * ((g.Tk + rpb - 1) / rpb);
    if (kblocks > 0) {
#define ATT_DKDV(T)                                                                                             \
    AT_LAUNCH(k_att_dkdv<T>, (unsigned)kblocks, ATT_THREADS, shared, c->stream, g, cu_ptr(q), (int)q->dtype, \
              cu_ptr(k), (int)k->dtype, cu_ptr(v), (int)v->dtype, cu_ptr(dout), (int)dout->dtype, pl, Di,    \
              cu_ptr(dk), (int)dk->dtype, cu_ptr(dv), (int)dv->dtype, chunk)
        ATT_DISPATCH(tp, ATT_DKDV)
#undef ATT_DKDV
        CU_TRY(cu_launched(c, "attention_backward (dk, dv)"));
    }
    int64_t qblocks = g.B * g.Hq * ((g.Tq + rpb - 1) / rpb);
    if (qblocks > 0) {
#define ATT_DQ(T)                                                                                            \
    AT_LAUNCH(k_att_dq<T>, (unsigned)qblocks, ATT_THREADS, shared, c->stream, g, cu_ptr(q), (int)q->dtype, \
              cu_ptr(k), (int)k->dtype, cu_ptr(v), (int)v->dtype, cu_ptr(dout), (int)dout->dtype, pl, Di,  \
              cu_ptr(dq), (int)dq->dtype, chunk)
        ATT_DISPATCH(tp, ATT_DQ)
#undef ATT_DQ
        CU_TRY(cu_launched(c, "attention_backward (dq)"));
    }
    return AT_OK;
}
