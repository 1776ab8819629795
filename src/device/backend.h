/* The backend interface: a device is a struct of function pointers.
 *
 * Memory management entries are required. Operation entries may be NULL: the
 * dispatcher in ops/ then runs the CPU kernel on host copies and warns once
 * per operation. Each operation entry has exactly the signature of the
 * at_<op> function of ops/ops.h (see there for the math and the shapes);
 * the dispatcher has already checked shapes and dtypes and that every tensor
 * lives on this backend before calling it. */
#ifndef AT_DEVICE_BACKEND_H
#define AT_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
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
} at_attn_params;

/* Parameters of one AdamW step (decoupled weight decay, bias-corrected). */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* gradient is multiplied by this first (clipping, loss scaling) */
    int64_t step;     /* 1 for the first step */
} at_adamw_params;

typedef struct at_backend_ops {
    at_status (*matmul)(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                        float alpha, float beta);
    at_status (*add)(at_tensor *y, const at_tensor *a, const at_tensor *b);
    at_status (*scale)(at_tensor *y, const at_tensor *x, float s);
    at_status (*axpy)(at_tensor *y, float alpha, const at_tensor *x);
    at_status (*fill)(at_tensor *y, float value);
    at_status (*cast)(at_tensor *y, const at_tensor *x);
    at_status (*sum_rows)(at_tensor *y, const at_tensor *x, float beta);
    at_status (*rmsnorm_forward)(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps);
    at_status (*rmsnorm_backward)(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                                  const at_tensor *w, const at_tensor *rstd);
    at_status (*rope)(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq, int inverse);
    at_status (*attention_forward)(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                                   const at_tensor *v, const at_attn_params *p);
    at_status (*attention_backward)(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                    const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                    const at_tensor *out, const at_tensor *lse, const at_attn_params *p);
    at_status (*swiglu_forward)(at_tensor *y, const at_tensor *gate, const at_tensor *up);
    at_status (*swiglu_backward)(at_tensor *dgate, at_tensor *dup, const at_tensor *dy, const at_tensor *gate,
                                 const at_tensor *up);
    at_status (*embedding_forward)(at_tensor *y, const at_tensor *ids, const at_tensor *table);
    at_status (*embedding_backward)(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids);
    at_status (*cross_entropy)(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                               const at_tensor *labels, float grad_scale);
    at_status (*adamw)(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                       const at_adamw_params *p);
    at_status (*sumsq)(at_tensor *out, const at_tensor *x);
    at_status (*dropout)(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset, int64_t run,
                         uint64_t pitch);
    at_status (*add_uniform_noise)(at_tensor *y, float magnitude, uint64_t seed, uint64_t offset, int64_t run,
                                   uint64_t pitch);
} at_backend_ops;

/* Names of the entries of at_backend_ops, in order (for warnings and tests). */
#define AT_BACKEND_OP_COUNT ((int)(sizeof(at_backend_ops) / sizeof(void (*)(void))))
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
