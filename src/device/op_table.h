/* The backend operations, listed once.
 *
 * Everything that used to spell out each operation by hand is generated from
 * this list: the entries of at_backend_ops (device/backend.h), their names
 * (at_backend_op_name), the CPU, CUDA and reference kernels' declarations and
 * tables, and the dispatcher's copy-to-the-CPU fallback (ops/ops.c). Adding an
 * operation is: its arguments and its name below, its public at_<op> with its
 * checks and math in ops/ops.h and ops/ops.c, and its kernels
 * (at_ref_<op> in ref/, at_cpu_<op> in cpu/, cu_<op> in cuda/ if the GPU has
 * one; a backend without it falls back on the CPU). docs/ARCHITECTURE.md, "How
 * the pieces grow", walks through it.
 *
 * Each operation's arguments are a macro AT_OP_<name>(OUT, IN, VAL, ATTN)
 * that lists them in order, each wrapped in its role, so that one list can be
 * read as a parameter list, an argument list or the fallback's copy list:
 *   OUT(x)     at_tensor *x: an output (written; the fallback copies it back)
 *   IN(x)      const at_tensor *x: an input
 *   VAL(T, x)  a value of type T passed as it is (numbers, a params struct)
 *   ATTN(p)    const at_attn_params *p (holds index tensors the fallback copies)
 * A tensor that may be NULL is still OUT/IN: NULL passes through everywhere.
 *
 * AT_BACKEND_OPS(X) calls X(name) for every operation, in the order of the
 * fields of at_backend_ops. The CUDA library is built separately against this
 * layout: changing the list (adding, removing, reordering, or changing an
 * argument) needs AT_CUDA_API_VERSION bumped (device/cuda/cuda_api.h). */
#ifndef AT_DEVICE_OP_TABLE_H
#define AT_DEVICE_OP_TABLE_H

#define AT_OP_matmul(OUT, IN, VAL, ATTN) \
    OUT(c), IN(a), IN(b), VAL(int, trans_a), VAL(int, trans_b), VAL(float, alpha), VAL(float, beta)
#define AT_OP_add(OUT, IN, VAL, ATTN) OUT(y), IN(a), IN(b)
#define AT_OP_scale(OUT, IN, VAL, ATTN) OUT(y), IN(x), VAL(float, s)
#define AT_OP_axpy(OUT, IN, VAL, ATTN) OUT(y), VAL(float, alpha), IN(x)
#define AT_OP_fill(OUT, IN, VAL, ATTN) OUT(y), VAL(float, value)
#define AT_OP_cast(OUT, IN, VAL, ATTN) OUT(y), IN(x)
#define AT_OP_sum_rows(OUT, IN, VAL, ATTN) OUT(y), IN(x), VAL(float, beta)
#define AT_OP_rmsnorm_forward(OUT, IN, VAL, ATTN) OUT(y), OUT(rstd), IN(x), IN(w), VAL(float, eps)
#define AT_OP_rmsnorm_backward(OUT, IN, VAL, ATTN) OUT(dx), OUT(dw), IN(dy), IN(x), IN(w), IN(rstd)
#define AT_OP_layernorm_forward(OUT, IN, VAL, ATTN) \
    OUT(y), OUT(mean), OUT(rstd), IN(x), IN(w), IN(b), VAL(float, eps)
#define AT_OP_layernorm_backward(OUT, IN, VAL, ATTN) \
    OUT(dx), OUT(dw), OUT(db), IN(dy), IN(x), IN(w), IN(mean), IN(rstd)
#define AT_OP_rope(OUT, IN, VAL, ATTN) \
    OUT(y), IN(x), IN(pos), IN(inv_freq), VAL(const at_rope_sections *, sections), VAL(int, inverse)
#define AT_OP_attention_forward(OUT, IN, VAL, ATTN) OUT(out), OUT(lse), IN(q), IN(k), IN(v), ATTN(p)
#define AT_OP_attention_backward(OUT, IN, VAL, ATTN) \
    OUT(dq), OUT(dk), OUT(dv), IN(dout), IN(q), IN(k), IN(v), IN(out), IN(lse), ATTN(p)
#define AT_OP_swiglu_forward(OUT, IN, VAL, ATTN) OUT(y), IN(gate), IN(up)
#define AT_OP_swiglu_backward(OUT, IN, VAL, ATTN) OUT(dgate), OUT(dup), IN(dy), IN(gate), IN(up)
#define AT_OP_gelu_forward(OUT, IN, VAL, ATTN) OUT(y), IN(x), VAL(int, kind)
#define AT_OP_gelu_backward(OUT, IN, VAL, ATTN) OUT(dx), IN(dy), IN(x), VAL(int, kind)
#define AT_OP_embedding_forward(OUT, IN, VAL, ATTN) OUT(y), IN(ids), IN(table)
#define AT_OP_embedding_backward(OUT, IN, VAL, ATTN) OUT(dtable), IN(dy), IN(ids)
#define AT_OP_cross_entropy(OUT, IN, VAL, ATTN) \
    OUT(row_loss), OUT(dlogits), IN(logits), IN(labels), VAL(float, grad_scale)
#define AT_OP_adamw(OUT, IN, VAL, ATTN) OUT(param), IN(grad), OUT(m), OUT(v), VAL(const at_adamw_params *, p)
#define AT_OP_sumsq(OUT, IN, VAL, ATTN) OUT(out), IN(x)
#define AT_OP_dropout(OUT, IN, VAL, ATTN) \
    OUT(y), IN(x), VAL(float, p), VAL(uint64_t, seed), VAL(uint64_t, offset), VAL(int64_t, run), VAL(uint64_t, pitch)
#define AT_OP_add_uniform_noise(OUT, IN, VAL, ATTN) \
    OUT(y), VAL(float, magnitude), VAL(uint64_t, seed), VAL(uint64_t, offset), VAL(int64_t, run), VAL(uint64_t, pitch)

#define AT_OP_matmul_dropout(OUT, IN, VAL, ATTN)                                                                      \
    OUT(c), IN(a), IN(b), VAL(int, trans_a), VAL(int, trans_b), VAL(float, alpha), VAL(float, p), VAL(uint64_t, seed), \
        VAL(uint64_t, offset), VAL(int64_t, run), VAL(uint64_t, pitch)

#define AT_OP_matmul_lowrank(OUT, IN, VAL, ATTN)                                                                      \
    OUT(c), IN(a), IN(b), VAL(int, trans_a), VAL(int, trans_b), VAL(float, alpha), VAL(float, beta), IN(u), IN(v),   \
        VAL(float, s)

#define AT_BACKEND_OPS(X)                                                                                  \
    X(matmul) X(add) X(scale) X(axpy) X(fill) X(cast) X(sum_rows) X(rmsnorm_forward) X(rmsnorm_backward) \
    X(layernorm_forward) X(layernorm_backward) X(rope) X(attention_forward) X(attention_backward)          \
    X(swiglu_forward) X(swiglu_backward) X(gelu_forward) X(gelu_backward) X(embedding_forward)            \
    X(embedding_backward) X(cross_entropy) X(adamw) X(sumsq) X(dropout) X(add_uniform_noise)             \
    X(matmul_dropout) X(matmul_lowrank)

/* ---- reading an operation's list ---- */

/* As a C parameter list: AT_OP_PARAMS(matmul) is
 * "at_tensor *c, const at_tensor *a, ..., float beta". */
#define AT_OP_PARAM_OUT(x) at_tensor *x
#define AT_OP_PARAM_IN(x) const at_tensor *x
#define AT_OP_PARAM_VAL(T, x) T x
#define AT_OP_PARAM_ATTN(x) const at_attn_params *x
#define AT_OP_PARAMS(name) AT_OP_##name(AT_OP_PARAM_OUT, AT_OP_PARAM_IN, AT_OP_PARAM_VAL, AT_OP_PARAM_ATTN)

/* As the argument list passing those parameters on: AT_OP_ARGS(matmul) is
 * "c, a, b, trans_a, trans_b, alpha, beta". */
#define AT_OP_ARG(x) x
#define AT_OP_ARG_VAL(T, x) x
#define AT_OP_ARGS(name) AT_OP_##name(AT_OP_ARG, AT_OP_ARG, AT_OP_ARG_VAL, AT_OP_ARG)

#endif
