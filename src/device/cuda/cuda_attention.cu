/* Causal grouped-query attention on the GPU, FlashAttention's scheme (ops.h
 * at_attention_forward / at_attention_backward; the CPU model is
 * device/cpu/cpu_attention.c, whose comment has the math).
 *
 * Two sets of kernels: the scalar f32-FMA ones described here (any float
 * dtypes, head_dim up to 512), and tensor-core ones (WMMA, "tensor cores"
 * below) that take over when q, k, v and the outputs are all bf16 or all f16
 * with head_dim a multiple of 16 up to 256, on sm_80 or later.
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
#include <stdlib.h>
#include <string.h>
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
    int bf16; /* the products' operands rounded to bf16 (at_attn_params.bf16), as the CPU rounds them */
} att_geo;

/* x as an operand of a product: rounded to bf16 where the model computes in
 * it (g.bf16), exactly the CPU's operands (cpu_attention.c): the forward's
 * scale·q and k (not p or v: p·v is f32 there), the backward's scale·q, k, v,
 * dout, out (for D_i), p and ds. */
static __device__ __forceinline__ float att_operand(const att_geo &g, float x)
{
    return g.bf16 ? at_cu_bf16_to_f32(at_cu_f32_to_bf16(x)) : x;
}

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

/* The query rows a thread block owns: blocks are laid out query block
 * fastest, then query head, then batch row (rows query rows per block);
 * kvh is the key/value head its query head reads (GQA). */
struct att_block {
    int64_t h, b, kvh, i0, kvl; /* i0: the block's first query row; kvl: keys it may see */
};
static __device__ __forceinline__ att_block att_block_of(const att_geo &g, int rows)
{
    att_block a;
    int64_t nqb = (g.Tq + rows - 1) / rows, blk = blockIdx.x;
    a.h = (blk / nqb) % g.Hq;
    a.b = blk / (nqb * g.Hq);
    a.kvh = a.h / g.G;
    a.i0 = blk % nqb * rows;
    a.kvl = att_kvl(g, a.b);
    return a;
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

/* Rows [r0, r0 + n) of a [B, T, H, D] tensor at (b, head h) into dst[n][D] as f32, times mul;
 * operands of the products (att_operand) when `operand`. */
static __device__ void att_load_rows(float *dst, const void *src, int dt, const att_geo &g, int64_t T, int64_t H,
                                     int64_t b, int64_t h, int64_t r0, int64_t n, float mul, bool operand)
{
    int D = (int)g.D, ne = (int)n * D; /* a chunk: at most 64 rows of 512 */
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int r = e / D, d = e % D;
        float x = at_cu_load(src, dt, ((b * T + r0 + r) * H + h) * D + d) * mul;
        dst[e] = operand ? att_operand(g, x) : x;
    }
}

/* The keys [j0, j0 + nk) of K and V (kv head kvh) into Ks, Vs as f32 and
 * their segments into segk, between two barriers: the previous chunk is no
 * longer read before, this one is published after. K is an operand of a
 * product (att_operand), V where v_operand (the backward's dO·Vᵀ). */
static __device__ __forceinline__ void att_load_keys(float *Ks, float *Vs, int *segk, const void *k, int tk,
                                                     const void *v, int tv, const att_geo &g, int64_t b, int64_t kvh,
                                                     int64_t j0, int64_t nk, bool v_operand)
{
    __syncthreads();
    att_load_rows(Ks, k, tk, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f, true);
    att_load_rows(Vs, v, tv, g, g.Tk, g.Hkv, b, kvh, j0, nk, 1.0f, v_operand);
    if (g.seg)
        for (int64_t t = threadIdx.x; t < nk; t += blockDim.x) segk[t] = g.seg[b * g.Tk + j0 + t];
    __syncthreads();
}

/* Dot products of a group of TP threads over head_dim, each thread its dims
 * d = sub + TP·u (< D): *s = Σ a[u]·x[d] and, with TWO, *dp = Σ b[u]·y[d]
 * (a, b: the thread's registers; x, y: rows in shared memory), summed over
 * the group. */
template <int TP, bool TWO>
static __device__ __forceinline__ void att_dots(const float *a, const float *x, const float *b, const float *y, int sub,
                                                int D, float *s, float *dp)
{
    float vs = 0.0f, vd = 0.0f;
    ATT_UNROLL
    for (int u = 0; u < ATT_DPT; u++) {
        int d = sub + TP * u;
        if (d < D) {
            vs += a[u] * x[d];
            if (TWO) vd += b[u] * y[d];
        }
    }
    *s = att_group_sum<TP>(vs);
    if (TWO) *dp = att_group_sum<TP>(vd);
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
    const att_block ab = att_block_of(g, RPB);
    const int64_t h = ab.h, b = ab.b, kvh = ab.kvh, kvl = ab.kvl;
    const int D = (int)g.D;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t i = ab.i0 + row;
    bool valid = i < g.Tq;
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
        qr[u] = valid && d < D ? att_operand(g, at_cu_load(q, tq, qoff + d) * g.scale) : 0.0f;
        o[u] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int64_t maxlim = (int64_t)at_cu_block_max((float)lim, red); /* also publishes lims / segq */
    for (int64_t j0 = 0; j0 <= maxlim; j0 += kc) {
        int64_t nk = maxlim + 1 - j0 < kc ? maxlim + 1 - j0 : kc;
        if (g.seg && !att_any_visible(g, b, lims, segq, RPB, j0, nk, red)) continue;
        att_load_keys(Ks, Vs, segk, k, tk, v, tv, g, b, kvh, j0, nk, false);
        for (int64_t jj = 0; jj < nk; jj++) {
            const float *kr = Ks + jj * D, *vr = Vs + jj * D;
            float s;
            att_dots<TP, false>(qr, kr, (const float *)NULL, (const float *)NULL, sub, D, &s, (float *)NULL);
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
        if (ok && d < g.D)
            s += att_operand(g, at_cu_load(dout, tdo, r * g.D + d)) * att_operand(g, at_cu_load(out, to, r * g.D + d));
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
        kr[u] = kvalid && d < D ? att_operand(g, at_cu_load(k, tk, koff + d)) : 0.0f;
        vr[u] = kvalid && d < D ? att_operand(g, at_cu_load(v, tv, koff + d)) : 0.0f;
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
            att_load_rows(Qs, q, tq, g, g.Tq, g.Hq, b, h, i0, nq, g.scale, true);
            att_load_rows(dOs, dout, tdo, g, g.Tq, g.Hq, b, h, i0, nq, 1.0f, true);
            __syncthreads();
            for (int r = 0; r < nq; r++) {
                const float *qs = Qs + r * D, *dos = dOs + r * D;
                float s, dp;
                att_dots<TP, true>(kr, qs, vr, dos, sub, D, &s, &dp);
                float L = Ls[r];
                if (!kvalid || j > lims[r] || (g.seg && segs[r] != segk) || L == -INFINITY) continue;
                float p = expf(s - L), ds = p * (dp - Ds[r]);
                p = att_operand(g, p);
                ds = att_operand(g, ds);
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
    const att_block ab = att_block_of(g, RPB);
    const int64_t h = ab.h, b = ab.b, kvh = ab.kvh, kvl = ab.kvl;
    const int D = (int)g.D;
    int row = threadIdx.x / TP, sub = threadIdx.x % TP;
    int64_t i = ab.i0 + row;
    bool valid = i < g.Tq;
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
        qr[u] = valid && d < D ? att_operand(g, at_cu_load(q, tq, qoff + d) * g.scale) : 0.0f;
        dor[u] = valid && d < D ? att_operand(g, at_cu_load(dout, tdo, qoff + d)) : 0.0f;
        dqr[u] = 0.0f;
    }
    int64_t maxlim = (int64_t)at_cu_block_max((float)lim, red);
    for (int64_t j0 = 0; j0 <= maxlim; j0 += kc) {
        int64_t nk = maxlim + 1 - j0 < kc ? maxlim + 1 - j0 : kc;
        if (g.seg && !att_any_visible(g, b, lims, segq, RPB, j0, nk, red)) continue;
        att_load_keys(Ks, Vs, segk, k, tk, v, tv, g, b, kvh, j0, nk, true);
        for (int64_t jj = 0; jj < nk; jj++) {
            const float *kr = Ks + jj * D, *vr = Vs + jj * D;
            float s, dp;
            att_dots<TP, true>(qr, kr, dor, vr, sub, D, &s, &dp);
            if (j0 + jj > lim || (g.seg && segk[jj] != segi)) continue;
            float p = expf(s - L), ds = att_operand(g, p * (dp - Dd));
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

/* ---- tensor cores: bf16 / f16 inputs and outputs, head_dim a multiple of 16 up to 256, sm_80+ ----
 *
 * The same math as above, FlashAttention-2's schedule with WMMA 16x16x16
 * tiles (f32 accumulation). A block is 4 warps; each warp owns 16 rows (queries
 * in the forward and dQ passes, keys in the dK/dV pass) and every product of
 * the block's tiles (S = Q·Kᵀ, P·V, dP = dO·Vᵀ, dS·K, Pᵀ·dO, dSᵀ·Q) is an
 * mma over 16-row slices held in shared memory as 16-bit values (rows padded by
 * 8 elements against bank conflicts; WMMA needs 32-byte aligned pointers and
 * ldm a multiple of 16 bytes). Between the products the warp stores its S (and
 * dP) rows to shared memory as f32 and works on them row by row: scale, masks
 * (exactly those of the scalar path), online softmax in f32 with exp2 (the
 * scale folded with log2 e), then P (or dS) rounded to the input type for the
 * next mma — as FlashAttention does; the row sums l use the unrounded f32 p.
 *
 * The online softmax rescales the output accumulators of a row by
 * alpha = exp(m_old − m_new); WMMA does not say which row an accumulator
 * element belongs to, so each warp learns it once: it loads an accumulator
 * from a 16×16 matrix holding r·16 + c. That mapping is fixed for a fragment
 * type (a loaded accumulator, the mma result and the store agree), on the
 * GPU as in the emulator, whose mapping is deliberately scrambled.
 *
 * Used only when q, k, v, out (and dout, dq, dk, dv) all have the same 16-bit
 * dtype, are 16-byte aligned, and the kernel was compiled for sm_80 or later
 * (cudaFuncGetAttributes' ptxVersion: the sm_75 PTX has no body here); f32 or
 * mixed dtypes keep the scalar kernels, whose outputs must meet the f32
 * tolerance that rounding P to 16 bits would not. ANYTUNE_CUDA_ATTENTION_SCALAR=1
 * forces the scalar kernels (to compare speed). */

#if defined(AT_CUDA_EMULATE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define ATT_TC 1
#endif

#define TC_THREADS 128 /* 4 warps of 16 rows */
#define TC_ROWS 64     /* queries of a forward / dQ block, keys of a dK/dV block */
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* The columns of one tile of the other side: keys in the forward (64, or 32
 * above head_dim 128 to bound shared memory), queries in dK/dV and keys in dQ (32). */
template <int NFM> struct tc_cfg {
    enum { FWD_COLS = NFM <= 8 ? 64 : 32, BWD_COLS = 32 };
};

/* Shared memory, carved in 128-byte aligned pieces (all of it dynamic, so the
 * base is the block's shared window, aligned for WMMA). */
__host__ __device__ static inline int tc_take(int *off, int bytes)
{
    int o = *off;
    *off += (bytes + 127) & ~127;
    return o;
}

/* a, b: the two 16-bit row tiles of one side (Q, or K / V ...); c, d: of the
 * other; s, t: f32 score tiles; p, u: their 16-bit results; then row data. */
struct tc_plan {
    int a, b, c, d, s, t, p, u, f0, f1, f2, i0, i1, i2, red, pos, total;
};

/* rows_ab rows of A and B, rows_cd of C and D, cols: the score tiles' width. */
__host__ __device__ static inline tc_plan tc_layout(int D, int rows_ab, int rows_cd, int cols, int two_scores)
{
    tc_plan P;
    int o = 0, ldh = D + 8;
    P.a = tc_take(&o, rows_ab * ldh * 2);
    P.b = tc_take(&o, rows_ab * ldh * 2);
    P.c = tc_take(&o, rows_cd * ldh * 2);
    P.d = tc_take(&o, rows_cd * ldh * 2);
    P.s = tc_take(&o, TC_ROWS * (cols + 4) * 4);
    P.t = two_scores ? tc_take(&o, TC_ROWS * (cols + 4) * 4) : P.s;
    P.p = tc_take(&o, TC_ROWS * (cols + 8) * 2);
    P.u = two_scores ? tc_take(&o, TC_ROWS * (cols + 8) * 2) : P.p;
    P.f0 = tc_take(&o, TC_ROWS * 4);
    P.f1 = tc_take(&o, TC_ROWS * 4);
    P.f2 = tc_take(&o, TC_ROWS * 4);
    P.i0 = tc_take(&o, TC_ROWS * 4);
    P.i1 = tc_take(&o, TC_ROWS * 4);
    P.i2 = tc_take(&o, TC_ROWS * 4);
    P.red = tc_take(&o, 32 * 4);
    P.pos = tc_take(&o, 256 * 4);
    P.total = o;
    return P;
}

/* forward: a = Q (64 rows), c, d = K, V (FWD_COLS rows); s = S, p = P. */
template <int NFM> __host__ __device__ static inline tc_plan tc_fwd_layout(int D)
{
    return tc_layout(D, TC_ROWS, tc_cfg<NFM>::FWD_COLS, tc_cfg<NFM>::FWD_COLS, 0);
}
/* dK/dV: a, b = K, V (64 rows), c, d = Q, dO (32 rows); s, t = Sᵀ, dPᵀ; p, u = Pᵀ, dSᵀ. */
/* dQ: a, b = Q, dO (64 rows), c, d = K, V (32 rows); s, t = S, dP; p = dS. */
template <int NFM> __host__ __device__ static inline tc_plan tc_bwd_layout(int D)
{
    return tc_layout(D, TC_ROWS, tc_cfg<NFM>::BWD_COLS, tc_cfg<NFM>::BWD_COLS, 1);
}

#ifdef ATT_TC
/* Rows [r0, r0 + n) of a [B, T, H, D] 16-bit tensor at (b, head h) into
 * dst[rows][D + 8]; rows n.. are zeros (and never read from src: keys at or
 * past kv_len may be garbage). 16-byte copies, consecutive threads on
 * consecutive pieces of a row. */
static __device__ __forceinline__ void tc_load_rows(uint16_t *dst, int rows, const void *src, int64_t T, int64_t H,
                                                    int D, int64_t b, int64_t h, int64_t r0, int64_t n)
{
    int cpr = D / 8, total = rows * cpr, ld = D + 8;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int r = e / cpr, c = e % cpr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < n) v = ((const uint4 *)((const uint16_t *)src + ((b * T + r0 + r) * H + h) * D))[c];
        *(uint4 *)(dst + r * ld + c * 8) = v;
    }
}

static __device__ __forceinline__ void tc_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }
static __device__ __forceinline__ void tc_put(__half *p, float v) { *p = __float2half(v); }

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> tc_acc;

/* The row (0..15) of each element of an accumulator fragment: pos holds r·16 + c. */
static __device__ __forceinline__ void tc_rows_of(int *prow, const float *pos)
{
    tc_acc f;
    nvcuda::wmma::load_matrix_sync(f, pos, 16, nvcuda::wmma::mem_row_major);
    for (int e = 0; e < tc_acc::num_elements; e++) prow[e] = (int)f.x[e] >> 4;
}

/* Writes the warp's 16 rows of nf accumulators, times mul[row] and scale, to
 * dst[base + row·rowstride + col] (rows < nrows), staging 16×COLS floats at a
 * time through stage (ld COLS + 4): consecutive lanes write consecutive
 * elements of a row. */
template <int NFM, int COLS>
static __device__ __forceinline__ void tc_write_rows(tc_acc *acc, int nf, float *stage, void *dst, int dt,
                                                     int64_t base, int64_t rowstride, int64_t nrows,
                                                     const float *mul, float scale)
{
    using namespace nvcuda;
    const int PER = COLS / 16, LDS = COLS + 4;
    int lane = threadIdx.x % 32;
    ATT_UNROLL
    for (int nb = 0; nb < NFM; nb += PER) {
        if (nb >= nf) break;
        __syncwarp();
        ATT_UNROLL
        for (int c = 0; c < PER; c++)
            if (nb + c < nf) wmma::store_matrix_sync(stage + c * 16, acc[nb + c], LDS, wmma::mem_row_major);
        __syncwarp();
        int nc = (nf - nb < PER ? nf - nb : PER) * 16;
        for (int t = lane; t < 16 * nc; t += 32) {
            int rr = t / nc, cc = t % nc;
            if (rr < nrows)
                at_cu_store(dst, dt, base + rr * rowstride + nb * 16 + cc,
                            stage[rr * LDS + cc] * (mul ? mul[rr] : 1.0f) * scale);
        }
    }
    __syncwarp();
}

/* The 16-bit operand fragments (ET: __nv_bfloat16 or __half). */
template <class ET>
using tc_fa_row = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, ET, nvcuda::wmma::row_major>;
template <class ET>
using tc_fb_col = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, ET, nvcuda::wmma::col_major>;
template <class ET>
using tc_fb_row = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, ET, nvcuda::wmma::row_major>;

/* Scores of the warp's 16 rows of the 64-row side (from row warp·16) against
 * the COLS rows of the other side, over head_dim (NF tiles of 16; all ld LDH):
 * Sw = A·Cᵀ and, with TWO, dPw = B·Eᵀ, stored row-major (ld COLS + 4). Ends
 * with __syncwarp: the warp's lanes may then read Sw / dPw. */
template <int NFM, int COLS, bool TWO, class ET>
static __device__ __forceinline__ void tc_scores(const ET *A, const ET *C, const ET *B, const ET *E, int NF, int LDH,
                                                 float *Sw, float *dPw)
{
    using namespace nvcuda;
    const int LDS = COLS + 4;
    int warp = threadIdx.x / 32;
    tc_acc s[COLS / 16], dp[COLS / 16];
    ATT_UNROLL
    for (int c = 0; c < COLS / 16; c++) {
        wmma::fill_fragment(s[c], 0.0f);
        if (TWO) wmma::fill_fragment(dp[c], 0.0f);
    }
    ATT_UNROLL
    for (int kk = 0; kk < NFM; kk++) {
        if (kk >= NF) break;
        tc_fa_row<ET> fa, fb2;
        wmma::load_matrix_sync(fa, A + warp * 16 * LDH + kk * 16, LDH);
        if (TWO) wmma::load_matrix_sync(fb2, B + warp * 16 * LDH + kk * 16, LDH);
        ATT_UNROLL
        for (int c = 0; c < COLS / 16; c++) {
            tc_fb_col<ET> fb;
            wmma::load_matrix_sync(fb, C + c * 16 * LDH + kk * 16, LDH);
            wmma::mma_sync(s[c], fa, fb, s[c]);
            if (TWO) {
                wmma::load_matrix_sync(fb, E + c * 16 * LDH + kk * 16, LDH);
                wmma::mma_sync(dp[c], fb2, fb, dp[c]);
            }
        }
    }
    ATT_UNROLL
    for (int c = 0; c < COLS / 16; c++) {
        wmma::store_matrix_sync(Sw + c * 16, s[c], LDS, wmma::mem_row_major);
        if (TWO) wmma::store_matrix_sync(dPw + c * 16, dp[c], LDS, wmma::mem_row_major);
    }
    __syncwarp();
}

/* acc[n] += P·X over the COLS columns of the warp's 16 rows of P (from row
 * warp·16, ld COLS + 8) and the COLS rows of X (ld LDH), for the NF column
 * tiles n of X; with TWO also acc2[n] += P2·X2. */
template <int NFM, int COLS, bool TWO, class ET>
static __device__ __forceinline__ void tc_accumulate(tc_acc *acc, const ET *Pm, const ET *X, tc_acc *acc2,
                                                     const ET *P2, const ET *X2, int NF, int LDH)
{
    using namespace nvcuda;
    const int LDP = COLS + 8;
    int warp = threadIdx.x / 32;
    ATT_UNROLL
    for (int kk = 0; kk < COLS / 16; kk++) {
        tc_fa_row<ET> fp, fp2;
        wmma::load_matrix_sync(fp, Pm + warp * 16 * LDP + kk * 16, LDP);
        if (TWO) wmma::load_matrix_sync(fp2, P2 + warp * 16 * LDP + kk * 16, LDP);
        ATT_UNROLL
        for (int n = 0; n < NFM; n++) {
            if (n >= NF) break;
            tc_fb_row<ET> fb;
            wmma::load_matrix_sync(fb, X + kk * 16 * LDH + n * 16, LDH);
            wmma::mma_sync(acc[n], fp, fb, acc[n]);
            if (TWO) {
                wmma::load_matrix_sync(fb, X2 + kk * 16 * LDH + n * 16, LDH);
                wmma::mma_sync(acc2[n], fp2, fb, acc2[n]);
            }
        }
    }
}

/* Keys [j0, j0 + nk) of K and V (kv head kvh) into Ks, Vs (cols rows) and
 * their segments into segk, between two barriers: the previous tile is no
 * longer read before, this one is published after. */
static __device__ __forceinline__ void tc_load_keys(uint16_t *Ks, uint16_t *Vs, int *segk, int cols, const att_geo &g,
                                                    const void *k, const void *v, int64_t b, int64_t kvh, int64_t j0,
                                                    int64_t nk)
{
    __syncthreads();
    tc_load_rows(Ks, cols, k, g.Tk, g.Hkv, (int)g.D, b, kvh, j0, nk);
    tc_load_rows(Vs, cols, v, g.Tk, g.Hkv, (int)g.D, b, kvh, j0, nk);
    if (g.seg)
        for (int t = threadIdx.x; t < nk; t += TC_THREADS) segk[t] = g.seg[b * g.Tk + j0 + t];
    __syncthreads();
}

/* Whether key j (segment *sk) is visible to a query of limit lim and segment
 * *sq. Pointers, so the segments are read (from shared memory) only with g.seg. */
static __device__ __forceinline__ bool tc_visible(const att_geo &g, int64_t j, int lim, const int *sq, const int *sk)
{
    return j <= lim && (!g.seg || *sq == *sk);
}

/* The backward's p = exp(scale·s − lse) = 2^(*s·sl2 − *L2) (L2 = lse·log2 e),
 * 0 where the key is not visible or the query sees nothing (lse = −inf); *s
 * and *L2 are read only where they count. */
static __device__ __forceinline__ float tc_prob(const att_geo &g, int64_t j, int lim, const int *sq, const int *sk,
                                                const float *s, float sl2, const float *L2)
{
    return tc_visible(g, j, lim, sq, sk) && *L2 != -INFINITY ? exp2f(*s * sl2 - *L2) : 0.0f;
}
#endif

/* Forward: a block per (batch, query head, 64 queries). */
template <int NFM, class ET>
static __global__ void __launch_bounds__(TC_THREADS)
    k_att_tc_forward(att_geo g, const void *q, const void *k, const void *v, void *out, int to, float *lse)
{
#ifdef ATT_TC
    using namespace nvcuda;
    const int BK = tc_cfg<NFM>::FWD_COLS, D = (int)g.D, NF = D / 16, LDH = D + 8, LDS = BK + 4, LDP = BK + 8;
    AT_DYNAMIC_SHARED(uint4, smv);
    unsigned char *sm = (unsigned char *)smv;
    const tc_plan P = tc_fwd_layout<NFM>(D);
    uint16_t *Qs = (uint16_t *)(sm + P.a), *Ks = (uint16_t *)(sm + P.c), *Vs = (uint16_t *)(sm + P.d);
    const ET *Qh = (const ET *)Qs, *Kh = (const ET *)Ks, *Vh = (const ET *)Vs;
    ET *Ph = (ET *)(sm + P.p);
    float *Ss = (float *)(sm + P.s), *rm = (float *)(sm + P.f0), *rl = (float *)(sm + P.f1),
          *ral = (float *)(sm + P.f2), *red = (float *)(sm + P.red), *pos = (float *)(sm + P.pos);
    int *lims = (int *)(sm + P.i0), *segq = (int *)(sm + P.i1), *segk = (int *)(sm + P.i2);

    const att_block ab = att_block_of(g, TC_ROWS);
    const int64_t h = ab.h, b = ab.b, kvh = ab.kvh, i0 = ab.i0, kvl = ab.kvl;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float mylim = -1.0f;
    for (int r = tid; r < TC_ROWS; r += TC_THREADS) {
        int64_t i = i0 + r, lim = i < g.Tq ? att_lim(g, b, i, kvl) : -1;
        lims[r] = (int)lim;
        segq[r] = i < g.Tq && g.seg ? g.seg[b * g.Tq + i] : 0;
        rm[r] = -INFINITY;
        rl[r] = 0.0f;
        mylim = fmaxf(mylim, (float)lim);
    }
    for (int t = tid; t < 256; t += TC_THREADS) pos[t] = (float)t;
    tc_load_rows(Qs, TC_ROWS, q, g.Tq, g.Hq, D, b, h, i0, g.Tq - i0);
    int64_t maxlim = (int64_t)at_cu_block_max(mylim, red); /* its barrier publishes the rows, pos and Q */
    int prow[tc_acc::num_elements];
    tc_rows_of(prow, pos);
    tc_acc O[NFM];
    ATT_UNROLL
    for (int n = 0; n < NFM; n++) wmma::fill_fragment(O[n], 0.0f);
    const float sl2 = g.scale * TC_LOG2E;
    float *Sw = Ss + warp * 16 * LDS;
    for (int64_t j0 = 0; j0 <= maxlim; j0 += BK) {
        int64_t nk = maxlim + 1 - j0 < BK ? maxlim + 1 - j0 : BK;
        if (g.seg && !att_any_visible(g, b, lims, segq, TC_ROWS, j0, nk, red)) continue;
        tc_load_keys(Ks, Vs, segk, BK, g, k, v, b, kvh, j0, nk);
        /* S = Q·Kᵀ for the warp's 16 queries */
        tc_scores<NFM, BK, false>(Qh, Kh, (const ET *)NULL, (const ET *)NULL, NF, LDH, Sw, (float *)NULL);
        { /* online softmax of the warp's rows, two lanes a row (even / odd keys) */
            int rr = lane >> 1, odd = lane & 1, r = warp * 16 + rr, lim = lims[r], si = segq[r];
            float *srow = Sw + rr * LDS;
            ET *prw = Ph + r * LDP;
            float mloc = -INFINITY;
            for (int t = 0; t < BK / 2; t++) {
                int c = odd + 2 * t;
                float s = tc_visible(g, j0 + c, lim, &si, segk + c) ? srow[c] * sl2 : -INFINITY;
                srow[c] = s;
                mloc = fmaxf(mloc, s);
            }
            mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, 1));
            float mold = rm[r], mnew = fmaxf(mold, mloc);
            float alpha = mnew == -INFINITY ? 1.0f : exp2f(mold - mnew); /* 0 while mold = −inf */
            float lsum = 0.0f;
            for (int t = 0; t < BK / 2; t++) {
                int c = odd + 2 * t;
                float s = srow[c], p = s == -INFINITY ? 0.0f : exp2f(s - mnew);
                tc_put(prw + c, p);
                lsum += p;
            }
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1); /* both lanes have read rm[r] */
            if (!odd) {
                rm[r] = mnew;
                rl[r] = rl[r] * alpha + lsum;
                ral[r] = alpha;
            }
        }
        __syncwarp();
        /* O = alpha·O + P·V */
        ATT_UNROLL
        for (int n = 0; n < NFM; n++)
            for (int e = 0; e < tc_acc::num_elements; e++) O[n].x[e] *= ral[warp * 16 + prow[e]];
        tc_accumulate<NFM, BK, false>(O, (const ET *)Ph, Vh, (tc_acc *)NULL, (const ET *)NULL, (const ET *)NULL, NF,
                                      LDH);
    }
    /* out = O / l (0 for a query that sees nothing), lse = ln 2 · (m + log2 l) */
    int r0 = warp * 16;
    if (lane < 16) {
        float l = rl[r0 + lane];
        ral[r0 + lane] = l > 0.0f ? 1.0f / l : 0.0f;
    }
    __syncwarp();
    int64_t nrows = g.Tq - (i0 + r0);
    tc_write_rows<NFM, BK>(O, NF, Sw, out, to, ((b * g.Tq + i0 + r0) * g.Hq + h) * D, g.Hq * D, nrows, ral + r0,
                           1.0f);
    if (lse && lane < 16 && lane < nrows) {
        float l = rl[r0 + lane];
        lse[(b * g.Hq + h) * g.Tq + i0 + r0 + lane] = l > 0.0f ? (rm[r0 + lane] + log2f(l)) * TC_LN2 : -INFINITY;
    }
#else
    (void)g, (void)q, (void)k, (void)v, (void)out, (void)to, (void)lse;
#ifdef __CUDA_ARCH__
    __trap(); /* never launched: the host checks ptxVersion */
#endif
#endif
}

/* dK, dV: a block per (batch, kv head, 64 keys), each warp 16 keys, over
 * tiles of 32 queries of every query head of the group:
 *   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, p = exp(scale·s − lse), ds = p (dp − D_i),
 *   dV += Pᵀ·dO, dK += dSᵀ·Q (times scale at the end). */
template <int NFM, class ET>
static __global__ void __launch_bounds__(TC_THREADS)
    k_att_tc_dkdv(att_geo g, const void *q, const void *k, const void *v, const void *dout, const float *lse,
                  const float *Di, void *dk, void *dv, int dt)
{
#ifdef ATT_TC
    using namespace nvcuda;
    const int BQ = tc_cfg<NFM>::BWD_COLS, D = (int)g.D, NF = D / 16, LDH = D + 8, LDS = BQ + 4, LDP = BQ + 8;
    AT_DYNAMIC_SHARED(uint4, smv);
    unsigned char *sm = (unsigned char *)smv;
    const tc_plan P = tc_bwd_layout<NFM>(D);
    uint16_t *Ks = (uint16_t *)(sm + P.a), *Vs = (uint16_t *)(sm + P.b), *Qs = (uint16_t *)(sm + P.c),
             *dOs = (uint16_t *)(sm + P.d);
    const ET *Kh = (const ET *)Ks, *Vh = (const ET *)Vs, *Qh = (const ET *)Qs, *dOh = (const ET *)dOs;
    ET *Pt = (ET *)(sm + P.p), *dSt = (ET *)(sm + P.u);
    float *St = (float *)(sm + P.s), *dPt = (float *)(sm + P.t), *Ls = (float *)(sm + P.f0),
          *Ds = (float *)(sm + P.f1), *red = (float *)(sm + P.red);
    int *lims = (int *)(sm + P.i0), *segs = (int *)(sm + P.i1), *segk = (int *)(sm + P.i2);

    int64_t nkb = (g.Tk + TC_ROWS - 1) / TC_ROWS, blk = blockIdx.x;
    int64_t kb = blk % nkb, kvh = (blk / nkb) % g.Hkv, b = blk / (nkb * g.Hkv), j0 = kb * TC_ROWS;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int64_t kvl = att_kvl(g, b);
    int64_t nk = kvl - j0 < TC_ROWS ? kvl - j0 : TC_ROWS; /* the tile's readable keys (may be <= 0) */
    tc_load_rows(Ks, TC_ROWS, k, g.Tk, g.Hkv, D, b, kvh, j0, nk);
    tc_load_rows(Vs, TC_ROWS, v, g.Tk, g.Hkv, D, b, kvh, j0, nk);
    for (int t = tid; t < TC_ROWS; t += TC_THREADS) segk[t] = j0 + t < g.Tk && g.seg ? g.seg[b * g.Tk + j0 + t] : 0;
    tc_acc dK[NFM], dV[NFM];
    ATT_UNROLL
    for (int n = 0; n < NFM; n++) {
        wmma::fill_fragment(dK[n], 0.0f);
        wmma::fill_fragment(dV[n], 0.0f);
    }
    const float sl2 = g.scale * TC_LOG2E;
    float *Sw = St + warp * 16 * LDS, *dPw = dPt + warp * 16 * LDS;
    for (int64_t h = kvh * g.G; h < (kvh + 1) * g.G && nk > 0; h++) {
        for (int64_t i0 = 0; i0 < g.Tq; i0 += BQ) {
            int nq = (int)(g.Tq - i0 < BQ ? g.Tq - i0 : BQ);
            __syncthreads(); /* the previous tile is no longer read */
            for (int t = tid; t < BQ; t += TC_THREADS) {
                int64_t i = i0 + t;
                bool ok = t < nq;
                lims[t] = ok ? (int)att_lim(g, b, i, kvl) : -1;
                segs[t] = ok && g.seg ? g.seg[b * g.Tq + i] : 0;
                Ls[t] = ok ? lse[(b * g.Hq + h) * g.Tq + i] * TC_LOG2E : -INFINITY;
                Ds[t] = ok ? Di[(b * g.Hq + h) * g.Tq + i] : 0.0f;
            }
            __syncthreads();
            if (!att_any_visible(g, b, lims, segs, nq, j0, nk, red)) continue;
            tc_load_rows(Qs, BQ, q, g.Tq, g.Hq, D, b, h, i0, nq);
            tc_load_rows(dOs, BQ, dout, g.Tq, g.Hq, D, b, h, i0, nq);
            __syncthreads();
            tc_scores<NFM, BQ, true>(Kh, Qh, Vh, dOh, NF, LDH, Sw, dPw); /* Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ */
            for (int t = lane; t < 16 * BQ; t += 32) {
                int rr = t / BQ, cc = t % BQ, jj = warp * 16 + rr;
                float p = tc_prob(g, j0 + jj, lims[cc], segs + cc, segk + jj, Sw + rr * LDS + cc, sl2, Ls + cc);
                tc_put(Pt + jj * LDP + cc, p);
                tc_put(dSt + jj * LDP + cc, p * (dPw[rr * LDS + cc] - Ds[cc]));
            }
            __syncwarp();
            tc_accumulate<NFM, BQ, true>(dV, (const ET *)Pt, dOh, dK, (const ET *)dSt, Qh, NF, LDH);
        }
    }
    /* keys at or past kv_len saw nothing: their zeros are written too */
    int64_t nrows = g.Tk - (j0 + warp * 16), base = ((b * g.Tk + j0 + warp * 16) * g.Hkv + kvh) * D;
    tc_write_rows<NFM, BQ>(dK, NF, Sw, dk, dt, base, g.Hkv * D, nrows, NULL, g.scale);
    tc_write_rows<NFM, BQ>(dV, NF, Sw, dv, dt, base, g.Hkv * D, nrows, NULL, 1.0f);
#else
    (void)g, (void)q, (void)k, (void)v, (void)dout, (void)lse, (void)Di, (void)dk, (void)dv, (void)dt;
#ifdef __CUDA_ARCH__
    __trap();
#endif
#endif
}

/* dQ: a block per (batch, query head, 64 queries), each warp 16 queries, over
 * tiles of 32 keys: S = Q·Kᵀ, dP = dO·Vᵀ, ds as above, dQ += dS·K (times scale). */
template <int NFM, class ET>
static __global__ void __launch_bounds__(TC_THREADS)
    k_att_tc_dq(att_geo g, const void *q, const void *k, const void *v, const void *dout, const float *lse,
                const float *Di, void *dq, int dt)
{
#ifdef ATT_TC
    using namespace nvcuda;
    const int BK = tc_cfg<NFM>::BWD_COLS, D = (int)g.D, NF = D / 16, LDH = D + 8, LDS = BK + 4, LDP = BK + 8;
    AT_DYNAMIC_SHARED(uint4, smv);
    unsigned char *sm = (unsigned char *)smv;
    const tc_plan P = tc_bwd_layout<NFM>(D);
    uint16_t *Qs = (uint16_t *)(sm + P.a), *dOs = (uint16_t *)(sm + P.b), *Ks = (uint16_t *)(sm + P.c),
             *Vs = (uint16_t *)(sm + P.d);
    const ET *Qh = (const ET *)Qs, *dOh = (const ET *)dOs, *Kh = (const ET *)Ks, *Vh = (const ET *)Vs;
    ET *dSs = (ET *)(sm + P.p);
    float *Ss = (float *)(sm + P.s), *dPs = (float *)(sm + P.t), *Ls = (float *)(sm + P.f0),
          *Dd = (float *)(sm + P.f1), *red = (float *)(sm + P.red);
    int *lims = (int *)(sm + P.i0), *segq = (int *)(sm + P.i1), *segk = (int *)(sm + P.i2);

    const att_block ab = att_block_of(g, TC_ROWS);
    const int64_t h = ab.h, b = ab.b, kvh = ab.kvh, i0 = ab.i0, kvl = ab.kvl;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float mylim = -1.0f;
    for (int r = tid; r < TC_ROWS; r += TC_THREADS) {
        int64_t i = i0 + r;
        float L = i < g.Tq ? lse[(b * g.Hq + h) * g.Tq + i] : -INFINITY;
        /* a query that sees nothing (lse = −inf) gets dq = 0 */
        int64_t lim = i < g.Tq && L != -INFINITY ? att_lim(g, b, i, kvl) : -1;
        lims[r] = (int)lim;
        segq[r] = i < g.Tq && g.seg ? g.seg[b * g.Tq + i] : 0;
        Ls[r] = L * TC_LOG2E;
        Dd[r] = i < g.Tq ? Di[(b * g.Hq + h) * g.Tq + i] : 0.0f;
        mylim = fmaxf(mylim, (float)lim);
    }
    tc_load_rows(Qs, TC_ROWS, q, g.Tq, g.Hq, D, b, h, i0, g.Tq - i0);
    tc_load_rows(dOs, TC_ROWS, dout, g.Tq, g.Hq, D, b, h, i0, g.Tq - i0);
    int64_t maxlim = (int64_t)at_cu_block_max(mylim, red);
    tc_acc dQ[NFM];
    ATT_UNROLL
    for (int n = 0; n < NFM; n++) wmma::fill_fragment(dQ[n], 0.0f);
    const float sl2 = g.scale * TC_LOG2E;
    float *Sw = Ss + warp * 16 * LDS, *dPw = dPs + warp * 16 * LDS;
    for (int64_t j0 = 0; j0 <= maxlim; j0 += BK) {
        int64_t nk = maxlim + 1 - j0 < BK ? maxlim + 1 - j0 : BK;
        if (g.seg && !att_any_visible(g, b, lims, segq, TC_ROWS, j0, nk, red)) continue;
        tc_load_keys(Ks, Vs, segk, BK, g, k, v, b, kvh, j0, nk);
        tc_scores<NFM, BK, true>(Qh, Kh, dOh, Vh, NF, LDH, Sw, dPw); /* S = Q·Kᵀ, dP = dO·Vᵀ */
        for (int t = lane; t < 16 * BK; t += 32) {
            int rr = t / BK, cc = t % BK, r = warp * 16 + rr;
            float p = tc_prob(g, j0 + cc, lims[r], segq + r, segk + cc, Sw + rr * LDS + cc, sl2, Ls + r);
            tc_put(dSs + r * LDP + cc, p * (dPw[rr * LDS + cc] - Dd[r]));
        }
        __syncwarp();
        tc_accumulate<NFM, BK, false>(dQ, (const ET *)dSs, Kh, (tc_acc *)NULL, (const ET *)NULL, (const ET *)NULL, NF,
                                      LDH);
    }
    int64_t nrows = g.Tq - (i0 + warp * 16);
    tc_write_rows<NFM, BK>(dQ, NF, Sw, dq, dt, ((b * g.Tq + i0 + warp * 16) * g.Hq + h) * D, g.Hq * D, nrows,
                           NULL, g.scale);
#else
    (void)g, (void)q, (void)k, (void)v, (void)dout, (void)lse, (void)Di, (void)dq, (void)dt;
#ifdef __CUDA_ARCH__
    __trap();
#endif
#endif
}

/* Host side of the tensor-core path. */

/* Whether the tensor-core kernels may take tensors ts (all the same 16-bit
 * dtype, 16-byte aligned) of head_dim D. */
static bool att_tc_eligible(const at_tensor *const *ts, int n, int64_t D)
{
    const char *e = getenv("ANYTUNE_CUDA_ATTENTION_SCALAR");
    if (e && *e && strcmp(e, "0") != 0) return false;
    if (D < 16 || D > 256 || D % 16) return false;
    if (ts[0]->dtype != AT_BF16 && ts[0]->dtype != AT_F16) return false;
    for (int i = 0; i < n; i++)
        if (ts[i]->dtype != ts[0]->dtype || (uintptr_t)cu_ptr(ts[i]) % 16) return false;
    return true;
}

/* Whether `kernel` has a tensor-core body on this device (compiled for sm_80
 * or later) and `bytes` of dynamic shared memory fit (asking for them above
 * the default 48 KiB). A refusal leaves no CUDA error behind. */
template <class K> static bool att_tc_ready(cuda_ctx *c, K *kernel, size_t bytes)
{
    cudaFuncAttributes fa;
    int optin = 0;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || fa.ptxVersion < 80 ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device) != cudaSuccess ||
        bytes > (size_t)optin ||
        (bytes > 48 * 1024 &&
         cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess)) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

/* Launches the forward; *done = false (nothing launched) when the kernel cannot run here. */
template <int NFM, class ET>
static at_status att_tc_forward(cuda_ctx *c, const att_geo &g, at_tensor *out, float *lse, const at_tensor *q,
                                const at_tensor *k, const at_tensor *v, bool *done)
{
    size_t bytes = (size_t)tc_fwd_layout<NFM>((int)g.D).total;
    *done = att_tc_ready(c, k_att_tc_forward<NFM, ET>, bytes);
    if (!*done) return AT_OK;
    int64_t blocks = g.B * g.Hq * ((g.Tq + TC_ROWS - 1) / TC_ROWS);
    auto kern = k_att_tc_forward<NFM, ET>;
    AT_LAUNCH(kern, (unsigned)blocks, TC_THREADS, bytes, c->stream, g, cu_ptr(q), cu_ptr(k), cu_ptr(v), cu_ptr(out),
              (int)out->dtype, lse);
    return cu_launched(c, "attention_forward (tensor cores)");
}

/* The dK/dV and dQ kernels (after D_i); *done as above, checked for both before either runs. */
template <int NFM, class ET>
static at_status att_tc_backward(cuda_ctx *c, const att_geo &g, at_tensor *dq, at_tensor *dk, at_tensor *dv,
                                 const at_tensor *dout, const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                 const float *lse, const float *Di, bool *done)
{
    size_t bytes = (size_t)tc_bwd_layout<NFM>((int)g.D).total;
    *done = att_tc_ready(c, k_att_tc_dkdv<NFM, ET>, bytes) && att_tc_ready(c, k_att_tc_dq<NFM, ET>, bytes);
    if (!*done) return AT_OK;
    int dt = (int)dq->dtype;
    int64_t kblocks = g.B * g.Hkv * ((g.Tk + TC_ROWS - 1) / TC_ROWS);
    if (kblocks > 0) {
        auto kern = k_att_tc_dkdv<NFM, ET>;
        AT_LAUNCH(kern, (unsigned)kblocks, TC_THREADS, bytes, c->stream, g, cu_ptr(q), cu_ptr(k), cu_ptr(v),
                  cu_ptr(dout), lse, Di, cu_ptr(dk), cu_ptr(dv), dt);
        CU_TRY(cu_launched(c, "attention_backward (dk, dv; tensor cores)"));
    }
    int64_t qblocks = g.B * g.Hq * ((g.Tq + TC_ROWS - 1) / TC_ROWS);
    if (qblocks > 0) {
        auto kern = k_att_tc_dq<NFM, ET>;
        AT_LAUNCH(kern, (unsigned)qblocks, TC_THREADS, bytes, c->stream, g, cu_ptr(q), cu_ptr(k), cu_ptr(v),
                  cu_ptr(dout), lse, Di, cu_ptr(dq), dt);
        CU_TRY(cu_launched(c, "attention_backward (dq; tensor cores)"));
    }
    return AT_OK;
}

/* FN<NFM, ET>(args) for the dtype and head_dim (NFM: fragments of 16 dims, 4, 8 or 16). */
#define ATT_TC_CALL(dtype, D, FN, ...)                                                          \
    ((dtype) == AT_BF16 ? ((D) <= 64    ? FN<4, __nv_bfloat16>(__VA_ARGS__)                     \
                           : (D) <= 128 ? FN<8, __nv_bfloat16>(__VA_ARGS__)                     \
                                        : FN<16, __nv_bfloat16>(__VA_ARGS__))                   \
                        : ((D) <= 64 ? FN<4, __half>(__VA_ARGS__)                               \
                           : (D) <= 128 ? FN<8, __half>(__VA_ARGS__) : FN<16, __half>(__VA_ARGS__)))

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
    g->bf16 = p->bf16;
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
    const at_tensor *ts[] = {q, k, v, out};
    if (att_tc_eligible(ts, 4, g.D)) {
        bool done = false;
        at_status s = ATT_TC_CALL(q->dtype, g.D, att_tc_forward, c, g, out, pl, q, k, v, &done);
        if (done || s != AT_OK) return s;
    }
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
    const at_tensor *ts[] = {dq, dk, dv, dout, q, k, v, out};
    if (nrows > 0 && att_tc_eligible(ts, 8, g.D)) {
        bool done = false;
        at_status s = ATT_TC_CALL(q->dtype, g.D, att_tc_backward, c, g, dq, dk, dv, dout, q, k, v, pl, Di, &done);
        if (done || s != AT_OK) return s;
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
