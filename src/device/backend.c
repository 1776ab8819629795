#include "device/backend.h"

static const char *const op_names[] = {
    "matmul", "add", "scale", "axpy", "fill", "cast", "sum_rows", "rmsnorm_forward", "rmsnorm_backward",
    "rope", "attention_forward", "attention_backward", "swiglu_forward", "swiglu_backward",
    "embedding_forward", "embedding_backward", "cross_entropy", "adamw", "sumsq",
    "dropout", "add_uniform_noise",
};

_Static_assert(sizeof op_names / sizeof op_names[0] == sizeof(at_backend_ops) / sizeof(void (*)(void)),
               "op_names must list every entry of at_backend_ops");

const char *at_backend_op_name(int index)
{
    if (index < 0 || index >= AT_BACKEND_OP_COUNT) return "?";
    return op_names[index];
}
