/* CPU kernels of the embedding lookup and its scatter-add backward (see ops/ops.h). */
#include "device/cpu/cpu_kernels.h"

#include <omp.h>
#include <string.h>
#include "device/cpu/cpu_simd.h"

static at_status check_ids(const at_tensor *ids, const at_tensor *table, const char *op)
{
    const int32_t *id = at_tensor_data(ids);
    int64_t n = at_tensor_numel(ids), V = table->shape[0];
    for (int64_t i = 0; i < n; i++) {
        if (id[i] < 0 || id[i] >= V) {
            char d[200];
            return at_error(AT_ERR_INVALID, "%s: %s[%lld] = %d is outside [0, %lld) of %s", op, ids->name[0] ? ids->name : "ids",
                            (long long)i, id[i], (long long)V, at_tensor_describe(table, d, sizeof d));
        }
    }
    return AT_OK;
}

/* y[n, :] = table[ids[n], :] */
at_status at_cpu_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table)
{
    AT_TRY(check_ids(ids, table, "embedding_forward"));
    const at_cpu_simd *v = at_cpu_simd_get();
    const int32_t *id = at_tensor_data(ids);
    int64_t n = at_tensor_numel(ids), D = table->shape[1];
    const void *pt = at_tensor_data(table);
    void *py = at_tensor_data(y);
#pragma omp parallel for schedule(static) if (n * D >= AT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        if (table->dtype == y->dtype) {
            memcpy(at_cpu_elem(py, y->dtype, i * D), at_cpu_elem(pt, table->dtype, id[i] * D),
                   (size_t)D * (table->dtype == AT_F32 ? 4 : 2));
            continue;
        }
        float buf[AT_CPU_CHUNK];
        for (int64_t c0 = 0; c0 < D; c0 += AT_CPU_CHUNK) {
            int64_t len = D - c0 < AT_CPU_CHUNK ? D - c0 : AT_CPU_CHUNK;
            const float *r = at_cpu_in(v, buf, pt, table->dtype, id[i] * D + c0, len);
            v->store(at_cpu_elem(py, y->dtype, i * D + c0), y->dtype, r, len);
        }
    }
    return AT_OK;
}

/* dtable[ids[n], :] += dy[n, :]. Threads own column tiles and walk every n in
 * order, so repeated ids never race and the sums have a fixed order. */
at_status at_cpu_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids)
{
    AT_TRY(check_ids(ids, dtable, "embedding_backward"));
    const at_cpu_simd *v = at_cpu_simd_get();
    const int32_t *id = at_tensor_data(ids);
    int64_t n = at_tensor_numel(ids), D = dtable->shape[1];
    int nt = n * D >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1;
    int64_t tile = (D + nt - 1) / nt;
    tile = (tile + 15) / 16 * 16;
    if (tile < 64) tile = 64;
    if (tile > AT_CPU_CHUNK) tile = AT_CPU_CHUNK;
    int64_t ntiles = (D + tile - 1) / tile;
    const void *pdy = at_tensor_data(dy);
    void *pt = at_tensor_data(dtable);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && ntiles > 1)
    for (int64_t u = 0; u < ntiles; u++) {
        float bd[AT_CPU_CHUNK], bt[AT_CPU_CHUNK];
        int64_t c0 = u * tile, len = D - c0 < tile ? D - c0 : tile;
        for (int64_t i = 0; i < n; i++) {
            int64_t toff = id[i] * D + c0;
            const float *d = at_cpu_in(v, bd, pdy, dy->dtype, i * D + c0, len);
            float *o = at_cpu_out(bt, pt, dtable->dtype, toff);
            if (dtable->dtype != AT_F32) v->load(o, at_cpu_elem(pt, dtable->dtype, toff), dtable->dtype, len);
            v->add(o, o, d, len);
            at_cpu_out_done(v, o, pt, dtable->dtype, toff, len);
        }
    }
    return AT_OK;
}
