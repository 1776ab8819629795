#include "device/cpu/gemm.h"

#include <stddef.h>

/* Placeholder engine: straightforward loops, to be replaced by the blocked
 * kernels. Kept correct for every argument combination. */
static float load(const void *p, at_dtype t, int64_t i)
{
    switch (t) {
    case AT_BF16: return at_bf16_to_f32(((const uint16_t *)p)[i]);
    case AT_F16: return at_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

void at_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                 at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta, void *C,
                 at_dtype c_type, int64_t ldc)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0;
            for (int64_t k = 0; k < K; k++) {
                float a = load(A, a_type, trans_a ? k * lda + i : i * lda + k);
                float b = load(B, b_type, trans_b ? j * ldb + k : k * ldb + j);
                acc += a * b;
            }
            float r = alpha * acc;
            if (c_type == AT_BF16) {
                uint16_t *c = (uint16_t *)C + i * ldc + j;
                if (beta != 0) r += beta * at_bf16_to_f32(*c);
                *c = at_f32_to_bf16(r);
            } else {
                float *c = (float *)C + i * ldc + j;
                if (beta != 0) r += beta * *c;
                *c = r;
            }
        }
    }
}

const char *at_cpu_gemm_engine(at_dtype compute)
{
    (void)compute;
    return "anytune scalar";
}
