/* The backend interface: a device is a struct of function pointers.
 *
 * Memory management entries are required. Operation entries (listed in
 * device/op_table.h) may be NULL: the dispatcher in ops/ then runs the CPU
 * kernel on host copies and warns once per operation. Each operation entry
 * has exactly the signature of the at_<op> function of ops/ops.h (see there
 * for the math and the shapes);
 * the dispatcher has already checked shapes and dtypes and that every tensor
 * lives on this backend before calling it. */
#ifndef AT_DEVICE_BACKEND_H
#define AT_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/op_table.h"
#include "device/tensor.h"

typedef enum { AT_DEVICE_CPU = 0, AT_DEVICE_CUDA, AT_DEVICE_NPU, AT_DEVICE_MPS, AT_DEVICE_TEST } at_device_kind;

/* Parameters of causal attention (see at_attention_forward). */
typedef struct {
    float scale;               /* scores = scale * q·k, usually 1/sqrt(head_dim) */
    const at_tensor *q_index;  /* i32 [B, Tq]: index among the keys of each query (the
                                  causal limit); NULL means Tk - Tq + i */
    const at_tensor *kv_len;   /* i32 [B]: valid keys per sequence; NULL means Tk */
    const at_tensor *segments; /* i32 [B, T] (Tq == Tk): keys of another segment are
                                  masked (packed samples); NULL means one segment */
    int bf16;                  /* 1: the products (q·k, p·v and the backward's) take
                                  their operands rounded to bf16, products exact and sums
                                  in f32, as PyTorch's autocast runs attention; softmax
                                  and the rest stay f32. For models that compute in bf16;
                                  a backend may compute these in f32 instead */
} at_attn_params;

/* The GELU variants (at_gelu_forward's kind), as transformers' ACT2FN names them:
 *   AT_GELU_ERF   "gelu":               x·Φ(x) = x/2·(1 + erf(x/√2))
 *   AT_GELU_TANH  "gelu_pytorch_tanh":  x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
 *   AT_GELU_QUICK "quick_gelu":         x·σ(1.702·x) (CLIP; Qwen2-VL's vision blocks) */
typedef enum { AT_GELU_ERF = 0, AT_GELU_TANH = 1, AT_GELU_QUICK = 2 } at_gelu_kind;

/* Rotary positions of several components (M-RoPE, 2-D RoPE; see at_rope):
 * token t has n positions pos[t, 0..n-1], and frequency i (of D/2) turns by
 * pos[t, k]·inv_freq[i] for the component k of i. Chunked (interleaved 0):
 * the first len[0] frequencies take component 0, the next len[1] component
 * 1, and so on (Σ len = D/2); Qwen2-VL's language model: n = 3 (t, h, w)
 * and len = mrope_section; its vision tower: n = 2 (row, column), len =
 * [D/4, D/4]. Interleaved (Qwen3-VL's language model, mrope_interleaved):
 * frequency i takes component i mod n when i < n·len[i mod n], else 0
 * (t h w t h w ... then t's tail: transformers' apply_interleaved_mrope). */
#define AT_ROPE_MAX_SECTIONS 4
typedef struct {
    int n;
    int len[AT_ROPE_MAX_SECTIONS];
    int interleaved;
} at_rope_sections;

/* The component of frequency i under s (0 when s is NULL). */
static inline int at_rope_section_of(const at_rope_sections *s, int64_t i)
{
    int k = 0;
    if (!s) return 0;
    if (s->interleaved) {
        k = (int)(i % s->n);
        return i < (int64_t)s->n * s->len[k] ? k : 0;
    }
    for (int64_t end = s->len[0]; k < s->n - 1 && i >= end; end += s->len[++k]) {}
    return k;
}

/* Parameters of one AdamW step (decoupled weight decay, bias-corrected). */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* gradient is multiplied by this first (clipping, loss scaling) */
    int64_t step;     /* 1 for the first step */
} at_adamw_params;

/* One entry per operation of device/op_table.h, in its order: at_status
 * (*matmul)(at_tensor *c, const at_tensor *a, ...) and so on. */
#define AT_BACKEND_OP_FIELD_(name) at_status (*name)(AT_OP_PARAMS(name));
typedef struct at_backend_ops {
    AT_BACKEND_OPS(AT_BACKEND_OP_FIELD_)
} at_backend_ops;
#undef AT_BACKEND_OP_FIELD_

/* Index of each entry of at_backend_ops: AT_OP_INDEX_matmul, ... */
#define AT_BACKEND_OP_ENUM_(name) AT_OP_INDEX_##name,
enum { AT_BACKEND_OPS(AT_BACKEND_OP_ENUM_) AT_BACKEND_OP_COUNT };
#undef AT_BACKEND_OP_ENUM_

/* Name of entry `index` of at_backend_ops ("matmul"; "?" out of range). */
const char *at_backend_op_name(int index);

#define AT_COMM_ID_BYTES 128

typedef struct at_backend {
    char name[32];       /* "cpu", "cuda:0" */
    at_device_kind kind;
    int is_host;         /* buffers are host memory the CPU may read directly */
    int fast_bf16;       /* bf16 matmuls run faster than f32 here (AVX512_BF16, Ampere+ GPUs) */
    void *ctx;           /* backend-private */
    at_status (*alloc)(struct at_backend *be, size_t size, void **out);
    void (*free)(struct at_backend *be, void *ptr);
    at_status (*upload)(struct at_backend *be, void *dst, const void *src, size_t n);   /* host -> device */
    at_status (*download)(struct at_backend *be, void *dst, const void *src, size_t n); /* device -> host */
    at_status (*synchronize)(struct at_backend *be);
    at_backend_ops ops;
    /* Collectives across processes (data parallel, device/comm.h); optional:
     * when NULL the core stages tensors through host memory and uses MPI.
     * comm_id writes AT_COMM_ID_BYTES of an id that rank 0 creates and every
     * rank passes to comm_init (NCCL's unique id); allreduce_sum sums n f32
     * tensors over every rank, each in place, as one grouped operation. */
    at_status (*comm_id)(struct at_backend *be, void *id);
    at_status (*comm_init)(struct at_backend *be, const void *id, int rank, int world);
    at_status (*allreduce_sum)(struct at_backend *be, at_tensor *const *ts, int n);
    /* Fallback warnings already given, one bit per op. */
    uint64_t fallback_warned;
} at_backend;

#endif
