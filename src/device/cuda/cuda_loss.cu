/* Cross-entropy (fused with the softmax over the vocabulary) on the CUDA
 * backend.
 *
 * One block per row (rows spread over the grid), two passes over the row and
 * no probability tensor: pass 1 finds m = max and s = Σ exp(x − m) online
 * (each thread over its strided elements, rescaling s when its max rises;
 * then the block combines the threads' (m, s) pairs), giving
 * lse = m + log s; pass 2 writes
 *   dlogits = grad_scale · (exp(x − lse) − onehot(label)),
 *   row_loss = lse − x[label]
 * An ignored label (< 0) gives row_loss 0 and a zero dlogits row. A label
 * ≥ V is an error (the CPU kernel's message), but the host does not wait for
 * it here: the kernel records the first one in a deferred-check word
 * (cuda_check.cu), treats its row as ignored (never reading past the row),
 * and the error is raised by the next download or synchronize; the trainer
 * downloads the chunk losses right after, so its step fails with it. Unlike
 * the CPU kernel, the other rows are written meanwhile.
 * The label's logit is read before the block's reductions, whose barriers
 * order every read of a row before any write of it, so dlogits may be the
 * logits tensor itself. Rows are walked 8 elements a step in 16-byte accesses
 * when V is a multiple of 8 and the pointers are 16-byte aligned. */
#include <math.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

static int row_threads(int64_t V)
{
    int64_t t = (V + 7) / 8; /* about 8 elements a thread, at most 1024 threads */
    t = (t + AT_WARP - 1) / AT_WARP * AT_WARP;
    if (t < AT_WARP) t = AT_WARP;
    if (t > 1024) t = 1024;
    return (int)t;
}

static unsigned row_grid(int64_t rows) { return rows < 65536 ? (unsigned)(rows < 1 ? 1 : rows) : 65536u; }

/* Adds v to the running (m, s) = (max, Σ exp(x − max)); NaN poisons s. */
static __device__ __forceinline__ void online_add(float &m, float &s, float v)
{
    if (v > m) {
        s = s * expf(m - v) + 1.0f; /* m = −inf: s is 0 and stays 0 before the + 1 */
        m = v;
    } else if (m != -INFINITY) {
        s += expf(v - m);
    } else if (v != v) {
        s = v;
    }
}

/* log Σ exp over the block's (m, s) pairs; every thread gets it. */
static __device__ __forceinline__ float block_lse(float m, float s, float *red)
{
    float mb = at_cu_block_max(m, red);
    /* a thread that saw only −inf has s = 0 (or NaN, kept by s · 0) */
    float sc = m == -INFINITY ? s * 0.0f : s * expf(m - mb);
    float sb = at_cu_block_sum(sc, red);
    return mb == -INFINITY ? -INFINITY : mb + logf(sb);
}

/* Pass 1 of a row: the thread's (m, s) over its elements. */
static __device__ __forceinline__ void row_online(const void *x, int tx, int64_t off, int64_t V, int vec, float &m,
                                                  float &s)
{
    at_cu_for_row(V, vec, [&](int64_t j, int w) {
        float v[AT_VEC];
        at_cu_loadw(x, tx, off + j, v, w);
        for (int k = 0; k < w; k++) online_add(m, s, v[k]);
    });
}

/* ---- cross-entropy ---- */

static __global__ void k_cross_entropy(float *loss, void *dl, int tdl, const void *x, int tx, const int32_t *labels,
                                       int64_t rows, int64_t V, float gs, int vec, unsigned long long *bad)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * V;
        int32_t lab = labels[r];
        if (lab >= V) { /* an error, reported at the next sync; the row counts as ignored */
            if (threadIdx.x == 0) cu_record_bad(bad, r, lab);
            lab = -1;
        }
        if (lab < 0) { /* ignored: the same branch for the whole block */
            if (threadIdx.x == 0) loss[r] = 0.0f;
            if (dl)
                at_cu_for_row(V, vec, [&](int64_t j, int w) {
                    float z[AT_VEC] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                    at_cu_storew(dl, tdl, off + j, z, w);
                });
            continue;
        }
        float xl = at_cu_load(x, tx, off + lab);
        float m = -INFINITY, s = 0.0f;
        row_online(x, tx, off, V, vec, m, s);
        float lse = block_lse(m, s, red);
        if (threadIdx.x == 0) loss[r] = lse - xl;
        if (!dl) continue;
        at_cu_for_row(V, vec, [&](int64_t j, int w) {
            float v[AT_VEC];
            at_cu_loadw(x, tx, off + j, v, w);
            for (int k = 0; k < w; k++)
                v[k] = j + k == lab ? gs * (expf(xl - lse) - 1.0f) : gs * expf(v[k] - lse);
            at_cu_storew(dl, tdl, off + j, v, w);
        });
    }
}

at_status cu_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits, const at_tensor *labels,
                           float grad_scale)
{
    cuda_ctx *c = cu_ctx(row_loss);
    int64_t rows = cu_rows(logits), V = cu_cols(logits);
    if (rows == 0) return AT_OK;
    unsigned long long *bad = NULL;
    CU_TRY(cu_check_defer(c, "cross_entropy", CU_CHK_BELOW, labels, NULL, V, &bad));
    int vec = V % AT_VEC == 0 && cu_aligned16(cu_ptr(logits)) && (!dlogits || cu_aligned16(cu_ptr(dlogits)));
    AT_LAUNCH(k_cross_entropy, row_grid(rows), row_threads(V), 0, c->stream, (float *)cu_ptr(row_loss),
              dlogits ? cu_ptr(dlogits) : (void *)NULL, dlogits ? (int)dlogits->dtype : 0, cu_ptr(logits),
              (int)logits->dtype, (const int32_t *)cu_ptr(labels), rows, V, grad_scale, vec, bad);
    return cu_launched(c, "cross_entropy");
}
