/* Embedding lookup and its gradient on the CUDA backend.
 *   forward:  y[n, :] = table[ids[n], :]
 *   backward: dtable[ids[n], :] += dy[n, :]   (scatter-add)
 * An id outside [0, V) is an error naming it, found before anything is
 * written (as the CPU kernel): one block checks every id and writes a flag,
 * which is read back once per call; on error the ids are downloaded to name
 * the first bad one, as the CPU's message does.
 *
 * The backward adds with f32 atomics when dtable is f32 (the order of the
 * additions to a repeated id's row then varies from run to run, within f32
 * rounding). For a bf16/f16 dtable, whose elements cannot be added to
 * atomically, each thread owns one column and walks the ids in order,
 * rounding after each addition exactly as the CPU kernel does. */
#include <stdio.h>
#include <stdlib.h>
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

#define EMB_CHECK_THREADS 1024

/* flag[0] = 1 when some id lies outside [0, V), else 0 (one block). */
static __global__ void k_check_ids(uint32_t *flag, const int32_t *ids, int64_t n, int64_t V)
{
    __shared__ float red[32];
    float bad = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        if (ids[i] < 0 || ids[i] >= V) bad = 1.0f;
    bad = at_cu_block_max(bad, red);
    if (threadIdx.x == 0) flag[0] = bad > 0.0f ? 1u : 0u;
}

/* "name [d0, d1] dtype" (the core's at_tensor_describe, which the library cannot call). */
static const char *describe(const at_tensor *t, char *buf, size_t len)
{
    static const char *names[] = {"f32", "bf16", "f16", "i32", "q8_0", "q4_0", "nf4"};
    int k = snprintf(buf, len, "%s [", t->name);
    for (int i = 0; i < t->ndim && k > 0 && (size_t)k < len; i++)
        k += snprintf(buf + k, len - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k > 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, "] %s",
                 (int)t->dtype >= 0 && (int)t->dtype < 7 ? names[t->dtype] : "?");
    return buf;
}

/* AT_OK when every id is in [0, V); otherwise the CPU kernel's error. */
static at_status check_ids(cuda_ctx *c, const at_tensor *ids, const at_tensor *table, const char *op)
{
    int64_t n = cu_numel(ids), V = table->shape[0];
    if (n == 0) return AT_OK;
    void *p = NULL;
    CU_TRY(cu_scratch(c, sizeof(uint32_t), &p));
    AT_LAUNCH(k_check_ids, 1, EMB_CHECK_THREADS, 0, c->stream, (uint32_t *)p, (const int32_t *)cu_ptr(ids), n, V);
    CU_TRY(cu_launched(c, op));
    uint32_t flag = 0;
    CU_TRY(cu_check(c, cudaMemcpyAsync(&flag, p, sizeof flag, cudaMemcpyDeviceToHost, c->stream), op));
    CU_TRY(cu_check(c, cudaStreamSynchronize(c->stream), op));
    if (!flag) return AT_OK;
    /* the error path: find the first bad id on the host */
    int32_t *h = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    if (!h) return c->host->error(AT_ERR_NOMEM, "%s: an id is outside [0, %lld) of %s", op, (long long)V, table->name);
    at_status st = cu_check(
        c, cudaMemcpyAsync(h, cu_ptr(ids), (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream), op);
    if (st == AT_OK) st = cu_check(c, cudaStreamSynchronize(c->stream), op);
    if (st == AT_OK) {
        int64_t i = 0;
        while (i < n && h[i] >= 0 && h[i] < V) i++;
        char d[200];
        st = c->host->error(AT_ERR_INVALID, "%s: %s[%lld] = %d is outside [0, %lld) of %s", op,
                            ids->name[0] ? ids->name : "ids", (long long)i, i < n ? h[i] : -1, (long long)V,
                            describe(table, d, sizeof d));
    }
    free(h);
    return st;
}

/* ---- forward: block per row (grid-stride), threads along D ---- */

static __global__ void k_embedding_fwd(void *y, int ty, const int32_t *ids, const void *table, int tt, int64_t n,
                                       int64_t D, int vec)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int64_t src = (int64_t)ids[r] * D, dst = r * D;
        at_cu_for_row(D, vec, [&](int64_t j, int w) {
            float v[AT_VEC];
            at_cu_loadw(table, tt, src + j, v, w);
            at_cu_storew(y, ty, dst + j, v, w);
        });
    }
}

static int d_threads(int64_t D)
{
    int64_t t = (D + AT_WARP - 1) / AT_WARP * AT_WARP;
    if (t < AT_WARP) t = AT_WARP;
    if (t > 256) t = 256;
    return (int)t;
}

at_status cu_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table)
{
    cuda_ctx *c = cu_ctx(y);
    CU_TRY(check_ids(c, ids, table, "embedding_forward"));
    int64_t n = cu_numel(ids), D = table->shape[1];
    if (n == 0 || D == 0) return AT_OK;
    unsigned grid = n < 65536 ? (unsigned)n : 65536u;
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(y)) && cu_aligned16(cu_ptr(table));
    AT_LAUNCH(k_embedding_fwd, grid, d_threads(vec ? D / AT_VEC : D), 0, c->stream, cu_ptr(y), (int)y->dtype,
              (const int32_t *)cu_ptr(ids), cu_ptr(table), (int)table->dtype, n, D, vec);
    return cu_launched(c, "embedding_forward");
}

/* ---- backward ---- */

/* f32 dtable: every (n, j) adds atomically. */
static __global__ void k_embedding_bwd_atomic(float *dtable, const void *dy, int tdy, const int32_t *ids, int64_t n,
                                              int64_t D)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int64_t dst = (int64_t)ids[r] * D, src = r * D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) atomicAdd(&dtable[dst + j], at_cu_load(dy, tdy, src + j));
    }
}

/* bf16/f16 dtable: thread j owns column j and walks every id in order. */
static __global__ void k_embedding_bwd_cols(void *dtable, int tt, const void *dy, int tdy, const int32_t *ids,
                                            int64_t n, int64_t D)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D; j += (int64_t)blockDim.x * gridDim.x)
        for (int64_t r = 0; r < n; r++) {
            int64_t dst = (int64_t)ids[r] * D + j;
            at_cu_store(dtable, tt, dst, at_cu_load(dtable, tt, dst) + at_cu_load(dy, tdy, r * D + j));
        }
}

at_status cu_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids)
{
    cuda_ctx *c = cu_ctx(dtable);
    CU_TRY(check_ids(c, ids, dtable, "embedding_backward"));
    int64_t n = cu_numel(ids), D = dtable->shape[1];
    if (n == 0 || D == 0) return AT_OK;
    if (dtable->dtype == AT_F32) {
        unsigned grid = n < 65536 ? (unsigned)n : 65536u;
        AT_LAUNCH(k_embedding_bwd_atomic, grid, d_threads(D), 0, c->stream, (float *)cu_ptr(dtable), cu_ptr(dy),
                  (int)dy->dtype, (const int32_t *)cu_ptr(ids), n, D);
    } else {
        AT_LAUNCH(k_embedding_bwd_cols, cu_blocks(D, 64), 64, 0, c->stream, cu_ptr(dtable), (int)dtable->dtype,
                  cu_ptr(dy), (int)dy->dtype, (const int32_t *)cu_ptr(ids), n, D);
    }
    return cu_launched(c, "embedding_backward");
}
