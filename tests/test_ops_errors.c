/* Bad arguments to the operations are errors with messages that name the
 * tensors concerned, never crashes: mismatched shapes and dtypes (checked by
 * the dispatcher), missing tensors, and out-of-range indices (embedding ids,
 * labels >= vocabulary; checked by the kernels, at every ISA level). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "ops/ops.h"
#include "testing.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static at_tensor *pool[128];
static int npool;

/* A zero-filled CPU tensor, freed at the end. */
static at_tensor *T(at_dtype dt, int nd, const int64_t *sh, const char *name)
{
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_zeros(at_cpu_backend(), dt, nd, sh, name, &t));
    CHECK(npool < 128);
    if (t && npool < 128) pool[npool++] = t;
    return t;
}

/* The call fails with AT_ERR_INVALID and its message contains `name`. */
#define EXPECT_ERR(expr, name)                                                                          \
    do {                                                                                                \
        at_clear_error();                                                                               \
        at_status s_ = (expr);                                                                          \
        at_test_checks++;                                                                               \
        if (s_ != AT_ERR_INVALID || !strstr(at_last_error(), (name))) {                                 \
            at_test_failures++;                                                                         \
            fprintf(stderr, "%s:%d: %s returned %s \"%s\", expected invalid naming \"%s\"\n", __FILE__, \
                    __LINE__, #expr, at_status_name(s_), at_last_error(), (name));                     \
        }                                                                                               \
    } while (0)

static void test_shapes_and_dtypes(void)
{
    at_tensor *a = T(AT_F32, 2, SH(3, 4), "act.a"), *b = T(AT_F32, 2, SH(5, 6), "weight.b");
    at_tensor *c = T(AT_F32, 2, SH(3, 6), "out.c"), *c16 = T(AT_F16, 2, SH(3, 4), "out.c16");
    at_tensor *b34 = T(AT_F32, 2, SH(4, 4), "weight.b44");
    /* matmul: K differs, output dtype, batch not broadcastable */
    EXPECT_ERR(at_matmul(c, a, b, 0, 0, 1, 0), "weight.b");
    EXPECT_ERR(at_matmul(c, a, b, 0, 0, 1, 0), "act.a");
    EXPECT_ERR(at_matmul(c16, a, b34, 0, 0, 1, 0), "out.c16");
    at_tensor *a3 = T(AT_F32, 3, SH(3, 2, 4), "act.batch3"), *b2 = T(AT_F32, 3, SH(2, 4, 5), "weight.batch2");
    at_tensor *c3 = T(AT_F32, 3, SH(3, 2, 5), "out.batch3");
    EXPECT_ERR(at_matmul(c3, a3, b2, 0, 0, 1, 0), "weight.batch2");
    at_tensor *a1 = T(AT_F32, 1, SH(4), "act.vector");
    EXPECT_ERR(at_matmul(c, a1, b, 0, 0, 1, 0), "matmul");
    /* output of the wrong shape for transposed operands: Aᵀ is 4x3 */
    EXPECT_ERR(at_matmul(c, a, b34, 1, 0, 1, 0), "out.c");
    /* matmul_lowrank: u, v of the wrong rows, ranks that differ, a bf16 u, c as u, a batch of 2 */
    at_tensor *b64 = T(AT_F32, 2, SH(6, 4), "weight.b64"), *lu = T(AT_F32, 2, SH(3, 2), "lora.u");
    at_tensor *lv = T(AT_F32, 2, SH(6, 2), "lora.v"), *lv5 = T(AT_F32, 2, SH(5, 2), "lora.v5");
    at_tensor *lv3 = T(AT_F32, 2, SH(6, 3), "lora.v3"), *lub = T(AT_BF16, 2, SH(3, 2), "lora.ubf16");
    at_tensor *lcu = T(AT_F32, 2, SH(3, 6), "out.cu"), *lu6 = T(AT_F32, 2, SH(3, 6), "lora.u6");
    CHECK_OK(at_matmul_lowrank(c, a, b64, 0, 1, 1, 0, lu, lv, 2));
    EXPECT_ERR(at_matmul_lowrank(c, a, b64, 0, 1, 1, 0, lu, lv5, 2), "lora.v5");
    EXPECT_ERR(at_matmul_lowrank(c, a, b64, 0, 1, 1, 0, lu, lv3, 2), "lora.u");
    EXPECT_ERR(at_matmul_lowrank(c, a, b64, 0, 1, 1, 0, lub, lv, 2), "lora.ubf16");
    EXPECT_ERR(at_matmul_lowrank(lcu, a, b64, 0, 1, 1, 0, lcu, lu6, 2), "out.cu");
    EXPECT_ERR(at_matmul_lowrank(c, a, b64, 0, 1, 1, 0, NULL, lv, 2), "matmul_lowrank");
    at_tensor *a13 = T(AT_F32, 3, SH(1, 3, 4), "act.one"), *a23 = T(AT_F32, 3, SH(2, 3, 4), "act.two");
    at_tensor *c23 = T(AT_F32, 3, SH(2, 3, 6), "out.two");
    CHECK_OK(at_matmul_lowrank(c, a13, b64, 0, 1, 1, 0, lu, lv, 2)); /* a batch of one is one matrix */
    EXPECT_ERR(at_matmul_lowrank(c23, a23, b64, 0, 1, 1, 0, lu, lv, 2), "act.two");
    /* elementwise */
    at_tensor *y = T(AT_F32, 2, SH(3, 4), "y"), *y5 = T(AT_F32, 1, SH(5), "y.five"), *b3 = T(AT_F32, 1, SH(3), "bias3");
    EXPECT_ERR(at_add(y, a, b3), "bias3");
    EXPECT_ERR(at_add(y5, a, a), "y.five");
    EXPECT_ERR(at_scale(y5, a, 2), "y.five");
    EXPECT_ERR(at_axpy(y5, 2, a), "y.five");
    EXPECT_ERR(at_sum_rows(y5, a, 0), "y.five");
    at_tensor *ids = T(AT_I32, 1, SH(12), "token_ids"), *q8 = T(AT_Q8_0, 1, SH(32), "quant.q8");
    EXPECT_ERR(at_add(y, a, ids), "token_ids");
    EXPECT_ERR(at_scale(q8, q8, 2), "quant.q8");
    EXPECT_ERR(at_cast(y, ids), "token_ids");
    EXPECT_ERR(at_add(y, a, NULL), "add");

    /* rmsnorm */
    at_tensor *w3 = T(AT_F32, 1, SH(3), "norm.weight3"), *w4 = T(AT_F32, 1, SH(4), "norm.weight");
    at_tensor *rbf = T(AT_BF16, 1, SH(3), "rstd.bf16"), *r2 = T(AT_F32, 1, SH(2), "rstd.two");
    at_tensor *r3 = T(AT_F32, 1, SH(3), "rstd");
    EXPECT_ERR(at_rmsnorm_forward(y, NULL, a, w3, 1e-5f), "norm.weight3");
    EXPECT_ERR(at_rmsnorm_forward(y, rbf, a, w4, 1e-5f), "rstd.bf16");
    EXPECT_ERR(at_rmsnorm_forward(y, r2, a, w4, 1e-5f), "rstd.two");
    EXPECT_ERR(at_rmsnorm_backward(y, w3, a, a, w4, r3), "norm.weight3");
    EXPECT_ERR(at_rmsnorm_backward(y5, NULL, a, a, w4, r3), "y.five");
    EXPECT_ERR(at_rmsnorm_backward(y, NULL, a, a, w4, NULL), "rstd");

    /* rope: odd head dim, positions dtype and count, inv_freq size */
    at_tensor *x_odd = T(AT_F32, 3, SH(2, 1, 5), "x.odd"), *x = T(AT_F32, 3, SH(2, 2, 4), "x.rope");
    at_tensor *pos = T(AT_I32, 1, SH(2), "pos"), *posf = T(AT_F32, 1, SH(2), "pos.f32");
    at_tensor *pos3 = T(AT_I32, 1, SH(3), "pos.three"), *inv = T(AT_F32, 1, SH(2), "inv_freq");
    at_tensor *inv3 = T(AT_F32, 1, SH(3), "inv_freq.three");
    EXPECT_ERR(at_rope(x_odd, x_odd, pos, inv, NULL, 0), "x.odd");
    EXPECT_ERR(at_rope(x, x, posf, inv, NULL, 0), "pos.f32");
    EXPECT_ERR(at_rope(x, x, pos3, inv, NULL, 0), "pos.three");
    EXPECT_ERR(at_rope(x, x, pos, inv3, NULL, 0), "inv_freq.three");

    /* attention */
    at_tensor *q = T(AT_F32, 4, SH(1, 4, 6, 8), "attn.q"), *k = T(AT_F32, 4, SH(1, 4, 4, 8), "attn.k4");
    at_tensor *k2 = T(AT_F32, 4, SH(1, 4, 2, 8), "attn.k"), *v2 = T(AT_F32, 4, SH(1, 4, 2, 8), "attn.v");
    at_tensor *v3 = T(AT_F32, 4, SH(1, 3, 2, 8), "attn.v.short"), *o = T(AT_F32, 4, SH(1, 4, 6, 8), "attn.out");
    at_tensor *kd = T(AT_F32, 4, SH(1, 4, 2, 7), "attn.k.dim7");
    at_tensor *qi = T(AT_I32, 2, SH(1, 3), "q_index.short"), *kl = T(AT_F32, 1, SH(1), "kv_len.f32");
    at_tensor *lse = T(AT_BF16, 1, SH(24), "lse.bf16"), *lse_ok = T(AT_F32, 1, SH(24), "lse");
    at_attn_params p = {.scale = 0.3f};
    EXPECT_ERR(at_attention_forward(o, NULL, q, k, k, &p), "attn.k4"); /* 6 heads on 4 */
    EXPECT_ERR(at_attention_forward(o, NULL, q, k2, v3, &p), "attn.k");
    EXPECT_ERR(at_attention_forward(o, NULL, q, kd, kd, &p), "attn.k.dim7");
    EXPECT_ERR(at_attention_forward(o, lse, q, k2, v2, &p), "lse.bf16");
    EXPECT_ERR(at_attention_forward(o, NULL, q, k2, v2, NULL), "attention");
    p.q_index = qi;
    EXPECT_ERR(at_attention_forward(o, NULL, q, k2, v2, &p), "q_index.short");
    p.q_index = NULL;
    p.kv_len = kl;
    EXPECT_ERR(at_attention_forward(o, NULL, q, k2, v2, &p), "kv_len.f32");
    p.kv_len = NULL;
    at_tensor *q1 = T(AT_F32, 4, SH(1, 1, 6, 8), "attn.q.decode"), *o1 = T(AT_F32, 4, SH(1, 1, 6, 8), "o1");
    at_tensor *seg = T(AT_I32, 2, SH(1, 4), "segments");
    p.segments = seg; /* segments need Tq == Tk */
    EXPECT_ERR(at_attention_forward(o1, NULL, q1, k2, v2, &p), "segments");
    p.segments = NULL;
    at_tensor *dk_bad = T(AT_F32, 4, SH(1, 4, 6, 8), "grad.dk");
    EXPECT_ERR(at_attention_backward(o, dk_bad, v2, o, q, k2, v2, o, lse_ok, &p), "grad.dk");
    EXPECT_ERR(at_attention_backward(o, k2, v2, o, q, k2, v2, o, NULL, &p), "lse");

    /* swiglu */
    at_tensor *g = T(AT_F32, 1, SH(10), "mlp.gate"), *u = T(AT_F32, 1, SH(9), "mlp.up.short");
    at_tensor *yg = T(AT_F32, 1, SH(10), "mlp.y");
    EXPECT_ERR(at_swiglu_forward(yg, g, u), "mlp.up.short");
    EXPECT_ERR(at_swiglu_backward(yg, yg, yg, g, u), "mlp.up.short");

    /* embedding */
    at_tensor *tab1 = T(AT_F32, 1, SH(40), "embed.flat"), *tab = T(AT_F32, 2, SH(10, 4), "embed_tokens");
    at_tensor *idf = T(AT_F32, 1, SH(3), "ids.f32"), *id3 = T(AT_I32, 1, SH(3), "ids");
    at_tensor *ey = T(AT_F32, 2, SH(2, 4), "embed.out.short");
    EXPECT_ERR(at_embedding_forward(ey, id3, tab1), "embed.flat");
    EXPECT_ERR(at_embedding_forward(ey, idf, tab), "ids.f32");
    EXPECT_ERR(at_embedding_forward(ey, id3, tab), "embed.out.short");
    EXPECT_ERR(at_embedding_backward(tab, ey, id3), "embed.out.short");

    /* cross-entropy */
    at_tensor *lg = T(AT_F32, 2, SH(4, 10), "lm_logits"), *lab = T(AT_I32, 1, SH(3), "labels.short");
    at_tensor *lab4 = T(AT_I32, 1, SH(4), "labels"), *rl = T(AT_BF16, 1, SH(4), "row_loss.bf16");
    at_tensor *rl4 = T(AT_F32, 1, SH(4), "row_loss"), *dl = T(AT_F32, 2, SH(4, 9), "dlogits.short");
    at_tensor *labf = T(AT_F32, 1, SH(4), "labels.f32");
    EXPECT_ERR(at_cross_entropy(rl4, NULL, lg, lab, 1), "labels.short");
    EXPECT_ERR(at_cross_entropy(rl, NULL, lg, lab4, 1), "row_loss.bf16");
    EXPECT_ERR(at_cross_entropy(rl4, dl, lg, lab4, 1), "dlogits.short");
    EXPECT_ERR(at_cross_entropy(rl4, NULL, lg, labf, 1), "labels.f32");

    /* adamw */
    at_tensor *pp = T(AT_F32, 1, SH(8), "param"), *gg = T(AT_F32, 1, SH(8), "grad");
    at_tensor *mb = T(AT_BF16, 1, SH(8), "exp_avg.bf16"), *vv = T(AT_F32, 1, SH(8), "exp_avg_sq");
    at_tensor *v7 = T(AT_F32, 1, SH(7), "exp_avg_sq.short"), *mm = T(AT_F32, 1, SH(8), "exp_avg");
    at_adamw_params ap = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1, .step = 1};
    EXPECT_ERR(at_adamw(pp, gg, mb, vv, &ap), "exp_avg.bf16");
    EXPECT_ERR(at_adamw(pp, gg, mm, v7, &ap), "exp_avg_sq.short");
    ap.step = 0;
    EXPECT_ERR(at_adamw(pp, gg, mm, vv, &ap), "step");
    EXPECT_ERR(at_adamw(pp, gg, mm, vv, NULL), "adamw");

    /* sumsq, read_scalar */
    at_tensor *s2 = T(AT_F32, 1, SH(2), "norm.out2");
    EXPECT_ERR(at_sumsq(s2, pp), "norm.out2");
    float f;
    EXPECT_ERR(at_read_scalar(ids, &f), "token_ids");
}

/* Out-of-range indices, checked by the kernels: at every ISA level. */
static void test_indices(void)
{
    at_tensor *tab = T(AT_F32, 2, SH(10, 4), "embed_tokens"), *ids = T(AT_I32, 1, SH(3), "input_ids");
    at_tensor *y = T(AT_F32, 2, SH(3, 4), "hidden"), *lg = T(AT_F32, 2, SH(3, 10), "lm_logits");
    at_tensor *lab = T(AT_I32, 1, SH(3), "labels"), *rl = T(AT_F32, 1, SH(3), "row_loss");
    at_tensor *dl = T(AT_F32, 2, SH(3, 10), "dlogits");
    int32_t *I = at_tensor_data(ids), *L = at_tensor_data(lab);
    at_cpu_isa top = at_cpu_isa_level();
    for (int lvl = AT_ISA_SCALAR; lvl <= (int)top; lvl++) {
        at_cpu_isa_force((at_cpu_isa)lvl);
        static const int32_t bad_ids[] = {10, -1, 1 << 30, INT32_MIN};
        for (int i = 0; i < 4; i++) {
            I[0] = 1, I[1] = bad_ids[i], I[2] = 2;
            EXPECT_ERR(at_embedding_forward(y, ids, tab), "input_ids");
            EXPECT_ERR(at_embedding_backward(tab, y, ids), "input_ids");
        }
        I[1] = 9; /* the last row is fine */
        CHECK_OK(at_embedding_forward(y, ids, tab));
        static const int32_t bad_labels[] = {10, 11, INT32_MAX};
        for (int i = 0; i < 3; i++) {
            L[0] = 0, L[1] = -100, L[2] = bad_labels[i];
            EXPECT_ERR(at_cross_entropy(rl, dl, lg, lab, 1), "labels");
            EXPECT_ERR(at_cross_entropy(rl, NULL, lg, lab, 1), "labels");
            EXPECT_ERR(at_cross_entropy(rl, lg, lg, lab, 1), "labels");
        }
        L[2] = 9; /* V − 1 is fine, negatives are ignored */
        L[1] = -7;
        CHECK_OK(at_cross_entropy(rl, dl, lg, lab, 1));
        CHECK(((float *)at_tensor_data(rl))[1] == 0.0f);
    }
    at_cpu_isa_force(top);
}

int main(void)
{
    test_shapes_and_dtypes();
    test_indices();
    for (int i = 0; i < npool; i++) at_tensor_free(pool[i]);
    return at_test_result("test_ops_errors");
}
