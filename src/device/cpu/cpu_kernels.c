#include "device/cpu/cpu_kernels.h"

#include "device/cpu/cpu_attention.h"
#include "device/cpu/cpu_dropout.h"
#include "device/cpu/cpu_elementwise.h"
#include "device/cpu/cpu_embedding.h"
#include "device/cpu/cpu_loss.h"
#include "device/cpu/cpu_matmul.h"
#include "device/cpu/cpu_norm.h"
#include "device/cpu/cpu_optim.h"
#include "device/cpu/cpu_rope.h"

/* Every entry is filled: the CPU is the backend all others fall back on. */
static const at_backend_ops table = {
    .matmul = at_cpu_matmul,
    .add = at_cpu_add,
    .scale = at_cpu_scale,
    .axpy = at_cpu_axpy,
    .fill = at_cpu_fill,
    .cast = at_cpu_cast,
    .sum_rows = at_cpu_sum_rows,
    .rmsnorm_forward = at_cpu_rmsnorm_forward,
    .rmsnorm_backward = at_cpu_rmsnorm_backward,
    .rope = at_cpu_rope,
    .attention_forward = at_cpu_attention_forward,
    .attention_backward = at_cpu_attention_backward,
    .swiglu_forward = at_cpu_swiglu_forward,
    .swiglu_backward = at_cpu_swiglu_backward,
    .embedding_forward = at_cpu_embedding_forward,
    .embedding_backward = at_cpu_embedding_backward,
    .cross_entropy = at_cpu_cross_entropy,
    .adamw = at_cpu_adamw,
    .sumsq = at_cpu_sumsq,
    .dropout = at_cpu_dropout,
    .add_uniform_noise = at_cpu_add_uniform_noise,
};

const at_backend_ops *at_cpu_ops(void) { return &table; }
