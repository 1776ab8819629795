/* LoRA in the decoder's forward and backward, beyond the PyTorch gradient
 * goldens of test_backward.c:
 *  - an adapter with B = 0 gives exactly the base model's logits;
 *  - unmerged LoRA inference: prefill and decode steps with the adapter give
 *    the training forward's logits with the adapter (and differ from the
 *    base model's);
 *  - packing: two samples in one row with segment ids give the same
 *    per-sample losses and the same gradients as the samples run alone;
 *  - the dropout operation: same seed same mask, p = 0 identity, kept
 *    elements scaled by 1/(1-p), the counter offset, thread-count
 *    independence;
 *  - LoRA dropout in training: reproducible from the seed, identical with
 *    checkpointing, and its backward agrees with finite differences;
 *  - bf16 base weights (frozen, bf16 matmuls) with f32 LoRA: gradients close
 *    to the f32 ones. */
#include <omp.h>
#include "base/rng.h"
#include "train_goldens.h"

/* logits [B·T, V] of a training forward of ids [B, T] (host), with optional
 * segments/positions (host, may be NULL). Caller frees. */
static float *forward_logits(at_decoder *d, int B, int T, const int32_t *ids, const int32_t *seg, const int32_t *pos)
{
    at_status st = AT_OK;
    at_tensor *t_ids = NULL, *t_seg = NULL, *t_pos = NULL, *lg = NULL;
    at_decoder_acts *a = NULL;
    float *out = NULL;
    int64_t sh[2] = {B, T}, shl[2] = {(int64_t)B * T, d->cfg.vocab_size};
    size_t n = (size_t)B * T * sizeof(int32_t);
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &t_ids));
    AT_CHECK(at_tensor_upload(t_ids, ids, n));
    if (seg) {
        AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "seg", &t_seg));
        AT_CHECK(at_tensor_upload(t_seg, seg, n));
    }
    if (pos) {
        AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "pos", &t_pos));
        AT_CHECK(at_tensor_upload(t_pos, pos, n));
    }
    AT_CHECK(at_decoder_acts_new(d, B, T, &a));
    AT_CHECK(at_decoder_forward(d, a, t_ids, t_pos, t_seg));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, shl, "logits", &lg));
    AT_CHECK(at_decoder_logits(d, lg, &a->final_norm));
    out = tc_host(lg);
done:
    CHECK_OK(st);
    at_tensor_free(t_ids);
    at_tensor_free(t_seg);
    at_tensor_free(t_pos);
    at_tensor_free(lg);
    at_decoder_acts_free(a);
    return out;
}

/* ---- B = 0: exactly the base model ---------------------------------------------- */

static void test_zero_b(void)
{
    train_case c;
    CHECK_OK(tc_open(&c, "qwen2_bias_tied", at_cpu_backend(), AT_F32, 0));
    if (!c.d) return;
    size_t n = (size_t)c.B * c.T * c.d->cfg.vocab_size;
    float *base = forward_logits(c.d, c.B, c.T, c.ids, NULL, NULL);
    at_adapter *fresh = NULL;
    CHECK_OK(at_adapter_new(&c.d->cfg, c.d->be, 8, 16.0, 0.05, 0, (1u << AT_MOD_COUNT) - 1, 7, &fresh));
    CHECK_OK(at_decoder_set_adapter(c.d, fresh));
    float *with = forward_logits(c.d, c.B, c.T, c.ids, NULL, NULL);
    CHECK(base && with && !memcmp(base, with, n * sizeof(float)));
    at_decoder_set_adapter(c.d, NULL);
    free(base);
    free(with);
    at_adapter_free(fresh);
    tc_free(&c);
}

/* ---- unmerged LoRA inference = the training forward ------------------------------- */

static void test_inference(const char *name)
{
    train_case c;
    CHECK_OK(tc_open(&c, name, at_cpu_backend(), AT_F32, 1));
    if (!c.d) return;
    int B = c.B, T = c.T, V = c.d->cfg.vocab_size;
    int32_t *len = NULL;
    CHECK_OK(golden_array(c.gf, "lengths", AT_I32, (void **)&len, NULL, NULL));
    float *train = forward_logits(c.d, B, T, c.ids, NULL, NULL);
    at_decoder_set_adapter(c.d, NULL);
    float *base = forward_logits(c.d, B, T, c.ids, NULL, NULL);
    CHECK_OK(at_decoder_set_adapter(c.d, c.ad));
    at_kv_cache *cache = NULL;
    at_tensor *lg_all = NULL, *lg_one = NULL;
    int64_t sa[2] = {(int64_t)B * T, V}, so[2] = {B, V};
    CHECK_OK(at_kv_cache_new(&c.d->cfg, c.d->be, AT_F32, B, T, &cache));
    CHECK_OK(at_tensor_new(c.d->be, AT_F32, 2, sa, "lg_all", &lg_all));
    CHECK_OK(at_tensor_new(c.d->be, AT_F32, 2, so, "lg_one", &lg_one));
    if (train && base && len && cache && lg_all && lg_one) {
        /* prefill the first half of each sequence (all positions), then decode the rest one token at a time */
        int n_new[8], half[8];
        for (int b = 0; b < B; b++) n_new[b] = half[b] = len[b] / 2;
        CHECK_OK(at_decoder_prefill(c.d, cache, c.ids, T, n_new, lg_all, 1));
        float *pre = tc_host(lg_all);
        double err = 0, diff_base = 0;
        for (int b = 0; b < B && pre; b++)
            for (int t = 0; t < half[b]; t++) {
                size_t o = ((size_t)b * T + t) * V;
                double e = at_test_max_rel_err(pre + o, train + o, (size_t)V, 1.0);
                double e2 = at_test_max_rel_err(base + o, train + o, (size_t)V, 1.0);
                if (e > err) err = e;
                if (e2 > diff_base) diff_base = e2;
            }
        free(pre);
        int maxlen = 0;
        for (int b = 0; b < B; b++) maxlen = len[b] > maxlen ? len[b] : maxlen;
        for (int step = 0;; step++) {
            int32_t ids[8];
            int active[8], any = 0;
            for (int b = 0; b < B; b++) {
                int t = half[b] + step;
                active[b] = t < len[b];
                ids[b] = active[b] ? c.ids[b * T + t] : 0;
                any |= active[b];
            }
            if (!any) break;
            CHECK_OK(at_decoder_decode_step(c.d, cache, ids, active, lg_one));
            float *one = tc_host(lg_one);
            for (int b = 0; b < B && one; b++) {
                if (!active[b]) continue;
                size_t o = ((size_t)b * T + half[b] + step) * V;
                double e = at_test_max_rel_err(one + (size_t)b * V, train + o, (size_t)V, 1.0);
                if (e > err) err = e;
            }
            free(one);
        }
        printf("%s: prefill/decode with the adapter vs training forward: rel err %.2e (adapter moves the "
               "logits by %.2f)\n", name, err, diff_base);
        CHECK(err < 1e-5);
        CHECK(diff_base > 1e-2); /* the adapter does something */
    }
    at_kv_cache_free(cache);
    at_tensor_free(lg_all);
    at_tensor_free(lg_one);
    free(train);
    free(base);
    free(len);
    tc_free(&c);
}

/* ---- packing ----------------------------------------------------------------------- */

/* Host copies of every trainable gradient, concatenated. */
static float *all_grads(at_decoder *d, at_decoder_grads *g, size_t *n_out)
{
    int n = at_decoder_trainables(d, g, NULL, 0);
    at_param_grad *pg = calloc((size_t)n, sizeof *pg);
    size_t total = 0;
    at_decoder_trainables(d, g, pg, n);
    for (int i = 0; i < n; i++) total += (size_t)at_tensor_numel(pg[i].grad);
    float *out = malloc(total * sizeof *out);
    size_t off = 0;
    for (int i = 0; i < n && out; i++) {
        float *h = tc_host(pg[i].grad);
        if (h) memcpy(out + off, h, at_tensor_nbytes(pg[i].grad));
        off += (size_t)at_tensor_numel(pg[i].grad);
        free(h);
    }
    free(pg);
    *n_out = total;
    return out;
}

static void test_packing(const char *name, int full)
{
    train_case c;
    CHECK_OK(tc_open(&c, name, at_cpu_backend(), AT_F32, !full));
    if (!c.d) return;
    int32_t *len = NULL;
    CHECK_OK(golden_array(c.gf, "lengths", AT_I32, (void **)&len, NULL, NULL));
    at_decoder_grads *g1 = NULL, *g2 = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, full, &g1));
    CHECK_OK(at_decoder_grads_new(c.d, full, &g2));
    if (len && g1 && g2 && c.B == 2) {
        /* alone: the padded batch of two rows */
        double row[2];
        at_loss_stats s1 = {.row_loss = row};
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g1, 0.0f, 0, &s1));
        /* packed: both samples in one row, positions restarting, segments 0 and 1 */
        int P = len[0] + len[1];
        int32_t *ids = calloc((size_t)P, 4), *lab = calloc((size_t)P, 4), *seg = calloc((size_t)P, 4),
                *pos = calloc((size_t)P, 4);
        float *tok = calloc((size_t)P, sizeof *tok);
        for (int s = 0, o = 0; s < 2; o += len[s], s++)
            for (int t = 0; t < len[s]; t++) {
                ids[o + t] = c.ids[s * c.T + t];
                lab[o + t] = c.labels[s * c.T + t];
                seg[o + t] = s;
                pos[o + t] = t;
            }
        at_tensor *t_ids = NULL, *t_lab = NULL, *t_seg = NULL, *t_pos = NULL;
        int64_t sh[2] = {1, P};
        at_decoder_acts *a = NULL;
        CHECK_OK(at_tensor_wrap(ids, AT_I32, 2, sh, "ids", &t_ids));
        CHECK_OK(at_tensor_wrap(lab, AT_I32, 2, sh, "labels", &t_lab));
        CHECK_OK(at_tensor_wrap(seg, AT_I32, 2, sh, "segments", &t_seg));
        CHECK_OK(at_tensor_wrap(pos, AT_I32, 2, sh, "pos", &t_pos));
        CHECK_OK(at_decoder_acts_new_ex(c.d, 1, P, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, &a));
        at_loss_stats s2 = {.token_loss = tok};
        if (a && t_ids && t_lab && t_seg && t_pos)
            CHECK_OK(at_decoder_forward_backward(c.d, a, t_ids, t_pos, t_seg, t_lab, 0.0f, 0,
                                                 1.0f / (float)c.n_targets, g2, &s2));
        CHECK(s2.n_targets == s1.n_targets);
        double seg_loss[2] = {0, 0};
        for (int i = 0; i < P; i++) seg_loss[seg[i]] += tok[i];
        CHECK_NEAR(seg_loss[0], row[0], 1e-5 * fabs(row[0]));
        CHECK_NEAR(seg_loss[1], row[1], 1e-5 * fabs(row[1]));
        CHECK_NEAR(s2.loss_sum, s1.loss_sum, 1e-5 * fabs(s1.loss_sum));
        size_t n1, n2;
        float *a1 = all_grads(c.d, g1, &n1), *a2 = all_grads(c.d, g2, &n2);
        double e = a1 && a2 && n1 == n2 ? at_test_max_rel_err(a2, a1, n1, 0) : 1e9;
        printf("%s: packed vs alone (%s): sample losses %.6f %.6f vs %.6f %.6f, gradients rel err %.2e\n", name,
               full ? "full FT" : "LoRA", seg_loss[0], seg_loss[1], row[0], row[1], e);
        CHECK(e < 1e-5);
        free(a1);
        free(a2);
        at_decoder_acts_free(a);
        at_tensor_free(t_ids);
        at_tensor_free(t_lab);
        at_tensor_free(t_seg);
        at_tensor_free(t_pos);
        free(ids);
        free(lab);
        free(seg);
        free(pos);
        free(tok);
    }
    free(len);
    at_decoder_grads_free(g1);
    at_decoder_grads_free(g2);
    tc_free(&c);
}

/* ---- the dropout operation -------------------------------------------------------------- */

static void test_dropout_op(void)
{
    int64_t n = 100000;
    at_tensor *x = NULL, *y1 = NULL, *y2 = NULL, *y3 = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "x", &x));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "y1", &y1));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "y2", &y2));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "y3", &y3));
    if (!x || !y1 || !y2 || !y3) goto done;
    float *px = at_tensor_data(x), *p1 = at_tensor_data(y1), *p2 = at_tensor_data(y2), *p3 = at_tensor_data(y3);
    for (int64_t i = 0; i < n; i++) px[i] = (float)(i % 97) * 0.25f - 3.0f;
    /* p = 0: identity */
    CHECK_OK(at_dropout(y1, x, 0.0f, 5, 0, 0, 0));
    CHECK(!memcmp(p1, px, (size_t)n * 4));
    /* same seed: same mask, at any thread count */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK_OK(at_dropout(y1, x, 0.3f, 42, 1000, 0, 0));
    omp_set_num_threads(threads > 1 ? threads : 2);
    CHECK_OK(at_dropout(y2, x, 0.3f, 42, 1000, 0, 0));
    omp_set_num_threads(threads);
    CHECK(!memcmp(p1, p2, (size_t)n * 4));
    /* each kept element is x / (1 - p), each dropped 0, and the mask is the dropout hash of (seed, offset + i) */
    int64_t kept = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int keep = at_rng_dropout_uniform(42, 1000 + (uint64_t)i) >= 0.3f;
        if (keep && px[i] != 0.0f) kept++;
        float want = keep ? px[i] * (1.0f / 0.7f) : 0.0f;
        if (fabsf(p1[i] - want) > 1e-6f * fabsf(want)) bad++;
    }
    CHECK(bad == 0);
    double frac = (double)kept / (double)n;
    CHECK_MSG(frac > 0.67 && frac < 0.73, "kept fraction %g for p = 0.3", frac);
    /* the offset shifts the counter: offset 1010 masks element i as offset 1000 masks element i + 10 */
    CHECK_OK(at_dropout(y3, x, 0.3f, 42, 1010, 0, 0));
    int shift_ok = 1;
    for (int64_t i = 0; i + 10 < n; i++) {
        int keep3 = p3[i] != 0.0f || px[i] == 0.0f, keep1 = p1[i + 10] != 0.0f || px[i + 10] == 0.0f;
        if (px[i] != 0.0f && px[i + 10] != 0.0f && keep3 != keep1) shift_ok = 0;
    }
    CHECK(shift_ok);
    /* another seed: another mask */
    CHECK_OK(at_dropout(y2, x, 0.3f, 43, 1000, 0, 0));
    CHECK(memcmp(p1, p2, (size_t)n * 4) != 0);
    /* in place equals out of place */
    memcpy(p2, px, (size_t)n * 4);
    CHECK_OK(at_dropout(y2, y2, 0.3f, 42, 1000, 0, 0));
    CHECK(!memcmp(p1, p2, (size_t)n * 4));
    /* bad p */
    CHECK_FAILS(at_dropout(y1, x, 1.0f, 1, 0, 0, 0), AT_ERR_INVALID);
    CHECK_FAILS(at_dropout(y1, x, -0.1f, 1, 0, 0, 0), AT_ERR_INVALID);
    /* runs that would overlap, a negative run */
    CHECK_FAILS(at_dropout(y1, x, 0.3f, 1, 0, 10, 9), AT_ERR_INVALID);
    CHECK_FAILS(at_dropout(y1, x, 0.3f, 1, 0, -1, 9), AT_ERR_INVALID);
done:
    at_tensor_free(x);
    at_tensor_free(y1);
    at_tensor_free(y2);
    at_tensor_free(y3);
}

/* ---- LoRA dropout in training ---------------------------------------------------------------- */

static double loss_at(train_case *c, float p, uint64_t seed)
{
    at_loss_stats s = {0};
    at_decoder_acts *a = NULL;
    double v = NAN;
    if (at_decoder_acts_new_ex(c->d, c->B, c->T, AT_ACTS_TRAIN, &a) == AT_OK &&
        at_decoder_forward_train(c->d, a, c->t_ids, NULL, NULL, p, seed) == AT_OK &&
        at_decoder_loss(c->d, a, c->t_labels, 1.0f, NULL, &s) == AT_OK)
        v = s.loss_sum / (double)s.n_targets;
    at_decoder_acts_free(a);
    return v;
}

static void test_lora_dropout(void)
{
    train_case c;
    const float p = 0.3f;
    CHECK_OK(tc_open(&c, "qwen3_qknorm", at_cpu_backend(), AT_F32, 1));
    if (!c.d) return;
    double l0 = loss_at(&c, 0.0f, 9), la = loss_at(&c, p, 9), lb = loss_at(&c, p, 9), lc = loss_at(&c, p, 10);
    CHECK(la == lb);          /* same seed, same masks */
    CHECK(la != lc && la != l0);
    at_decoder_grads *g1 = NULL, *g2 = NULL, *g0 = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g1));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g2));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g0));
    at_loss_stats s = {0};
    if (g1 && g2 && g0) {
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g1, p, 9, &s));
        CHECK_NEAR(s.loss_sum / (double)s.n_targets, la, 1e-6 * fabs(la));
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN, g2, p, 9, &s));
        CHECK_OK(tc_step(&c, AT_ACTS_TRAIN, g0, 0.0f, 9, &s));
        size_t n1, n2, n0;
        float *a1 = all_grads(c.d, g1, &n1), *a2 = all_grads(c.d, g2, &n2), *a0 = all_grads(c.d, g0, &n0);
        CHECK(a1 && a2 && n1 == n2 && !memcmp(a1, a2, n1 * 4)); /* checkpointing regenerates the masks */
        CHECK(a1 && a0 && at_test_max_rel_err(a1, a0, n1, 0) > 1e-3);
        free(a1);
        free(a2);
        free(a0);
        /* finite differences along the gradient of two tensors (a lora_A of an
         * attention module, a lora_B of an MLP module): the loss must change
         * by ε·|g|² to first order */
        int n = at_decoder_trainables(c.d, g1, NULL, 0);
        at_param_grad *pg = calloc((size_t)n, sizeof *pg);
        at_decoder_trainables(c.d, g1, pg, n);
        int picks[2] = {2 * AT_MOD_K, 2 * (AT_MOD_COUNT + AT_MOD_UP) + 1}; /* layer 0 k_proj A, layer 1 up_proj B */
        for (int k = 0; k < 2 && pg; k++) {
            at_param_grad *q = &pg[picks[k]];
            float *par = tc_host(q->param), *gr = tc_host(q->grad);
            int64_t m = at_tensor_numel(q->param);
            double g2sum = 0;
            for (int64_t i = 0; i < m; i++) g2sum += (double)gr[i] * gr[i];
            double gn = sqrt(g2sum), eps = 2e-2;
            float *pp = at_tensor_data(q->param);
            for (int64_t i = 0; i < m; i++) pp[i] = par[i] + (float)(eps * gr[i] / gn);
            double lp = loss_at(&c, p, 9);
            for (int64_t i = 0; i < m; i++) pp[i] = par[i] - (float)(eps * gr[i] / gn);
            double lm = loss_at(&c, p, 9);
            memcpy(pp, par, (size_t)m * 4);
            double fd = (lp - lm) / (2 * eps);
            printf("dropout %.1f, %s: directional derivative %.6f, finite differences %.6f\n", (double)p,
                   q->param->name, gn, fd);
            CHECK_NEAR(fd, gn, 2e-2 * gn);
            free(par);
            free(gr);
        }
        free(pg);
    }
    at_decoder_grads_free(g0);
    at_decoder_grads_free(g1);
    at_decoder_grads_free(g2);
    tc_free(&c);
}

/* ---- bf16 base weights -------------------------------------------------------------------- */

static void test_bf16(void)
{
    train_case c16, c32;
    CHECK_OK(tc_open(&c16, "llama_bf16", at_cpu_backend(), AT_LOAD_KEEP_DTYPE, 1));
    CHECK_OK(tc_open(&c32, "llama_bf16", at_cpu_backend(), AT_F32, 1));
    if (!c16.d || !c32.d) goto done;
    CHECK(c16.d->w->layers[0].wq->dtype == AT_BF16);
    at_decoder_grads *g16 = NULL, *g32 = NULL;
    CHECK_OK(at_decoder_grads_new(c16.d, 0, &g16));
    CHECK_OK(at_decoder_grads_new(c32.d, 0, &g32));
    at_loss_stats s16 = {0}, s32 = {0};
    if (g16 && g32) {
        CHECK_OK(tc_step(&c16, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g16, 0.0f, 0, &s16));
        CHECK_OK(tc_step(&c32, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g32, 0.0f, 0, &s32));
        double want = tc_scalar(&c32, "loss");
        double l16 = s16.loss_sum / (double)s16.n_targets, l32 = s32.loss_sum / (double)s32.n_targets;
        printf("llama_bf16: loss f32 %.6f, bf16 %.6f, PyTorch (f32 from the bf16 values) %.6f\n", l32, l16, want);
        CHECK_NEAR(l32, want, 1e-4 * want);
        CHECK_NEAR(l16, want, 2e-2 * want);
        double e32 = tc_grads_err(&c32, g32, "lora.", "LoRA grads, f32 compute");
        double e16 = tc_grads_err(&c16, g16, "lora.", "LoRA grads, bf16 weights");
        CHECK(e32 <= 1e-4);
        CHECK(e16 <= 5e-2);
    }
    at_decoder_grads_free(g16);
    at_decoder_grads_free(g32);
done:
    tc_free(&c16);
    tc_free(&c32);
}

int main(void)
{
    test_zero_b();
    test_inference("llama_gqa");
    test_inference("qwen3_qknorm");
    test_packing("llama_gqa", 0);
    test_packing("qwen2_bias_tied", 1);
    test_dropout_op();
    test_lora_dropout();
    test_bf16();
    return at_test_result("lora");
}
