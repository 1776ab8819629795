/* Embedding lookup and its gradient on the CUDA backend.
 *   forward:  y[n, :] = table[ids[n], :]
 *   backward: dtable[ids[n], :] += dy[n, :]   (scatter-add)
 * An id outside [0, V) is an error naming it (the CPU kernel's message),
 * but the host does not wait for it here: the kernels record the first bad
 * id in a deferred-check word (cuda_check.cu) and leave its row alone (the
 * forward writes zeros there, the backward adds nothing), and the error is
 * raised by the next download or synchronize. Unlike the CPU kernel, the
 * good rows are written meanwhile.
 *
 * The backward adds with f32 atomics when dtable is f32 (the order of the
 * additions to a repeated id's row then varies from run to run, within f32
 * rounding). For a bf16/f16 dtable, whose elements cannot be added to
 * atomically, each thread owns one column and walks the ids in order,
 * rounding after each addition exactly as the CPU kernel does. */
#include "device/cuda/cuda_internal.h"
#include "device/cuda/cuda_vec.h"

/* ---- forward: block per row (grid-stride), threads along D ---- */

static __global__ void k_embedding_fwd(void *y, int ty, const int32_t *ids, const void *table, int tt, int64_t n,
                                       int64_t V, int64_t D, int vec, unsigned long long *bad)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int32_t id = ids[r];
        int64_t src = (int64_t)id * D, dst = r * D;
        if (id < 0 || id >= V) { /* an error, reported at the next sync: a zero row meanwhile */
            if (threadIdx.x == 0) cu_record_bad(bad, r, id);
            at_cu_for_row(D, vec, [&](int64_t j, int w) {
                float z[AT_VEC] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                at_cu_storew(y, ty, dst + j, z, w);
            });
            continue;
        }
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
    int64_t n = cu_numel(ids), V = table->shape[0], D = table->shape[1];
    if (n == 0) return AT_OK; /* D = 0 still checks the ids */
    unsigned long long *bad = NULL;
    CU_TRY(cu_check_defer(c, "embedding_forward", CU_CHK_RANGE, ids, table, V, &bad));
    unsigned grid = n < 65536 ? (unsigned)n : 65536u;
    int vec = D % AT_VEC == 0 && cu_aligned16(cu_ptr(y)) && cu_aligned16(cu_ptr(table));
    AT_LAUNCH(k_embedding_fwd, grid, d_threads(vec ? D / AT_VEC : D), 0, c->stream, cu_ptr(y), (int)y->dtype,
              (const int32_t *)cu_ptr(ids), cu_ptr(table), (int)table->dtype, n, V, D, vec, bad);
    return cu_launched(c, "embedding_forward");
}

/* ---- backward ---- */

/* f32 dtable: every (n, j) adds atomically. */
static __global__ void k_embedding_bwd_atomic(float *dtable, const void *dy, int tdy, const int32_t *ids, int64_t n,
                                              int64_t V, int64_t D, unsigned long long *bad)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int32_t id = ids[r];
        if (id < 0 || id >= V) { /* an error, reported at the next sync: nothing added */
            if (threadIdx.x == 0) cu_record_bad(bad, r, id);
            continue;
        }
        int64_t dst = (int64_t)id * D, src = r * D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) atomicAdd(&dtable[dst + j], at_cu_load(dy, tdy, src + j));
    }
}

/* bf16/f16 dtable: thread j owns column j and walks every id in order. */
static __global__ void k_embedding_bwd_cols(void *dtable, int tt, const void *dy, int tdy, const int32_t *ids,
                                            int64_t n, int64_t V, int64_t D, unsigned long long *bad)
{
    /* the grid records the bad ids once (also when D = 0); each column skips them */
    CU_GRID_STRIDE(r, n)
        if (ids[r] < 0 || ids[r] >= V) cu_record_bad(bad, r, ids[r]);
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D; j += (int64_t)blockDim.x * gridDim.x)
        for (int64_t r = 0; r < n; r++) {
            if (ids[r] < 0 || ids[r] >= V) continue;
            int64_t dst = (int64_t)ids[r] * D + j;
            at_cu_store(dtable, tt, dst, at_cu_load(dtable, tt, dst) + at_cu_load(dy, tdy, r * D + j));
        }
}

at_status cu_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids)
{
    cuda_ctx *c = cu_ctx(dtable);
    int64_t n = cu_numel(ids), V = dtable->shape[0], D = dtable->shape[1];
    if (n == 0) return AT_OK; /* D = 0 still checks the ids */
    unsigned long long *bad = NULL;
    CU_TRY(cu_check_defer(c, "embedding_backward", CU_CHK_RANGE, ids, dtable, V, &bad));
    if (dtable->dtype == AT_F32) {
        unsigned grid = n < 65536 ? (unsigned)n : 65536u;
        AT_LAUNCH(k_embedding_bwd_atomic, grid, d_threads(D), 0, c->stream, (float *)cu_ptr(dtable), cu_ptr(dy),
                  (int)dy->dtype, (const int32_t *)cu_ptr(ids), n, V, D, bad);
    } else {
        AT_LAUNCH(k_embedding_bwd_cols, cu_blocks(D, 64), 64, 0, c->stream, cu_ptr(dtable), (int)dtable->dtype,
                  cu_ptr(dy), (int)dy->dtype, (const int32_t *)cu_ptr(ids), n, V, D, bad);
    }
    return cu_launched(c, "embedding_backward");
}
