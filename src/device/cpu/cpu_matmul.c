/* CPU kernel of the batched matmul: a loop over at_cpu_gemm (see ops/ops.h). */
#include "device/cpu/cpu_kernels.h"

#include "device/cpu/cpu_qmatmul.h"
#include "device/cpu/cpu_simd.h"
#include "device/cpu/gemm.h"
#include "device/quant.h"

static int64_t batch_of(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++) n *= t->shape[i];
    return n;
}

/* C = alpha · op(A) · op(B) + beta · C over the batch. When B is shared by
 * the whole batch and A is not transposed, the batch of A is stacked into the
 * rows of one GEMM ([batch·M, K] · [K, N]), which the engine runs faster
 * than many small ones. */
at_status at_cpu_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b, float alpha,
                        float beta)
{
    if (at_dtype_is_quantized(b->dtype)) return at_cpu_qmatmul(c, a, b, trans_a, trans_b, alpha, beta);
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
    int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac, N = trans_b ? br : bc;
    int64_t batch = batch_of(a), bb = batch_of(b);
    const void *pa = at_tensor_data(a), *pb = at_tensor_data(b);
    void *pc = at_tensor_data(c);
    if (bb == 1 && !trans_a) {
        M *= batch;
        batch = 1;
    }
    for (int64_t i = 0; i < batch; i++) {
        at_cpu_gemm(trans_a, trans_b, M, N, K, alpha, at_cpu_elem(pa, a->dtype, i * ar * ac), a->dtype, ac,
                    at_cpu_elem(pb, b->dtype, bb == 1 ? 0 : i * br * bc), b->dtype, bc, beta,
                    at_cpu_elem(pc, c->dtype, i * M * N), c->dtype, N);
    }
    return AT_OK;
}

/* One product with the low-rank term in its tiles (at_cpu_gemm_lowrank);
 * a quantized B: its product, then the term alone (K 0), with the same
 * arithmetic. a and c are single matrices (at_matmul_lowrank). */
at_status at_cpu_matmul_lowrank(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                                float alpha, float beta, const at_tensor *u, const at_tensor *v, float s)
{
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
    int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac, N = trans_b ? br : bc, r = u->shape[1];
    const void *pa = at_tensor_data(a), *pb = at_tensor_data(b);
    at_dtype at = a->dtype, bt = b->dtype;
    if (at_dtype_is_quantized(bt)) {
        AT_TRY(at_cpu_matmul(c, a, b, trans_a, trans_b, alpha, beta));
        K = 0, alpha = 0.0f, beta = 1.0f, pa = pb = NULL, at = bt = AT_F32;
    }
    at_status st = at_cpu_gemm_lowrank(trans_a, trans_b, M, N, K, alpha, pa, at, ac, pb, bt, bc, beta,
                                       at_tensor_data(c), c->dtype, N, at_tensor_data(u), r, at_tensor_data(v), r,
                                       (int)r, s);
    /* the arguments were checked by at_matmul_lowrank; a failure is ours */
    if (st != AT_OK) return at_error(AT_ERR_INTERNAL, "matmul_lowrank: the product of %s failed", c->name);
    return AT_OK;
}
