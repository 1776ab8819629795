#include "train/reward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/rng.h"
#include "model/safetensors.h"
#include "ops/ops.h"
#include "train/objective.h"

_Static_assert(sizeof(at_rm_stats) == AT_RM_STATS_N * sizeof(double), "at_rm_stats is summed as an array");

static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

void at_rm_pair(double coef, double r_c, double r_r, double *loss, double *d_c, double *d_r)
{
    double delta = r_c - r_r, s = r_c + r_r;
    *loss = -log_sigmoid(delta) + coef * s * s;
    *d_c = -sigmoid(-delta) + 2 * coef * s;
    *d_r = sigmoid(-delta) + 2 * coef * s;
}

at_status at_rm_read_rewards(const at_decoder_acts *acts, const int32_t *lengths, const float *w, float *h,
                             double *rewards)
{
    size_t B = (size_t)acts->B, T = (size_t)acts->T, H = (size_t)at_tensor_cols(&acts->final_norm);
    /* h_b: the final hidden state of row b's last token; r_b = w · h_b */
    for (size_t b = 0; b < B; b++) {
        size_t last = lengths[b] > 0 ? (size_t)lengths[b] - 1 : 0;
        at_tensor row;
        int64_t shape[2] = {1, (int64_t)H};
        at_tensor_view_inplace(&row, &acts->final_norm, (b * T + last) * H, 2, shape);
        AT_TRY(at_tensor_download(&row, h + b * H, H * sizeof *h));
        double s = 0;
        for (size_t k = 0; k < H; k++) s += (double)w[k] * (double)h[b * H + k];
        rewards[b] = s;
    }
    return AT_OK;
}

at_status at_rm_forward_backward(const at_pref_config *c, size_t n, at_decoder *d, at_decoder_acts *acts,
                                 const at_tensor *ids, const at_tensor *pos, const int32_t *lengths,
                                 const at_fwd_opts *fwd, const at_tensor *score, at_tensor *score_grad,
                                 double step_pairs, double scale, at_decoder_grads *g, double *rewards,
                                 at_rm_stats *stats)
{
    size_t B = 2 * n, T = (size_t)acts->T, H = (size_t)d->cfg.hidden_size;
    if ((size_t)acts->B != B)
        return at_error(AT_ERR_INVALID, "rm step: %zu pairs need %zu rows, the activations have %d", n, B, acts->B);
    float *w = malloc(H * sizeof *w), *h = malloc(B * H * sizeof *h), *dw = NULL, *dfin = NULL;
    double *r = calloc(B, sizeof *r), *dr = calloc(B, sizeof *dr);
    at_status st = AT_OK;
    if (!w || !h || !r || !dr) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_decoder_forward_train_opts(d, acts, ids, pos, NULL, fwd));
    AT_CHECK(at_tensor_download(score, w, H * sizeof *w));
    AT_CHECK(at_rm_read_rewards(acts, lengths, w, h, r));
    if (rewards) memcpy(rewards, r, B * sizeof *r);
    double coef = c->center_rewards_coefficient;
    for (size_t i = 0; i < n; i++) {
        double rc = r[2 * i], rr = r[2 * i + 1], loss, dc, drr;
        at_rm_pair(coef, rc, rr, &loss, &dc, &drr);
        stats->pairs += 1;
        stats->loss += loss;
        stats->correct += rc > rr;
        stats->margin += rc - rr;
        stats->rewards += rc + rr;
        dr[2 * i] = dc * scale / step_pairs;
        dr[2 * i + 1] = drr * scale / step_pairs;
    }
    if (!g) goto done;
    /* dL/dh_b = dL/dr_b · w at row b's last token; dL/dw += Σ_b dL/dr_b · h_b */
    dfin = calloc(B * T * H, sizeof *dfin);
    dw = malloc(H * sizeof *dw);
    if (!dfin || !dw) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t b = 0; b < B; b++) {
        size_t last = lengths[b] > 0 ? (size_t)lengths[b] - 1 : 0;
        for (size_t k = 0; k < H; k++) dfin[(b * T + last) * H + k] = (float)(dr[b] * (double)w[k]);
    }
    AT_CHECK(at_tensor_download(score_grad, dw, H * sizeof *dw));
    for (size_t k = 0; k < H; k++) {
        double s = 0;
        for (size_t b = 0; b < B; b++) s += dr[b] * (double)h[b * H + k];
        dw[k] += (float)s;
    }
    AT_CHECK(at_tensor_upload(score_grad, dw, H * sizeof *dw));
    AT_CHECK(at_decoder_set_d_final(acts, dfin));
    AT_CHECK(at_decoder_backward(d, acts, g));
done:
    free(w);
    free(h);
    free(r);
    free(dr);
    free(dfin);
    free(dw);
    return st;
}

double at_rm_stats_loss(const at_rm_stats *s) { return s->pairs > 0 ? s->loss / s->pairs : NAN; }

void at_rm_stats_log(const at_rm_stats *s, cJSON *line)
{
    if (!(s->pairs > 0)) return;
    cJSON_AddNumberToObject(line, "accuracy", s->correct / s->pairs);
    cJSON_AddNumberToObject(line, "margin", s->margin / s->pairs);
    cJSON_AddNumberToObject(line, "mean_reward", s->rewards / (2 * s->pairs));
}

/* ---- the objective (train/objective.h) ---- */

typedef struct {
    at_pref_pairs train, val;
    at_tensor *score, *score_grad; /* [1, hidden] f32 on the decoder's backend */
} rm_data;

static at_status obj_prepare(at_objective *o, const at_obj_data_env *env, const at_sample_list *train,
                             const at_sample_list *val)
{
    rm_data *rd = calloc(1, sizeof *rd);
    if (!rd) return at_error(AT_ERR_NOMEM, "out of memory");
    o->impl = rd;
    AT_TRY(at_pref_pairs_encode(train, env->enc, env->strict, "train", &rd->train));
    if (val->n) AT_TRY(at_pref_pairs_encode(val, env->enc, env->strict, "eval", &rd->val));
    if (rd->train.n == 0) return at_error(AT_ERR_INVALID, "no preference pair left after encoding (see the warnings above)");
    o->n_train = rd->train.n;
    o->train_len = rd->train.len;
    o->n_val = rd->val.n;
    o->val_len = rd->val.len;
    return AT_OK;
}

/* The score head, N(0, 0.02²) from the seed, and its gradient. */
static at_status obj_attach(at_objective *o, at_decoder *d, uint64_t seed)
{
    rm_data *rd = o->impl;
    int64_t shape[2] = {1, d->cfg.hidden_size};
    AT_TRY(at_tensor_zeros(d->be, AT_F32, 2, shape, "score.weight", &rd->score));
    AT_TRY(at_tensor_zeros(d->be, AT_F32, 2, shape, "grad.score.weight", &rd->score_grad));
    size_t H = (size_t)shape[1];
    float *w = malloc(H * sizeof *w);
    if (!w) return at_error(AT_ERR_NOMEM, "out of memory");
    at_rng rng;
    at_rng_seed(&rng, at_rng_mix(seed, 0x73636f7265ull)); /* "score" */
    for (size_t k = 0; k < H; k++) w[k] = (float)(0.02 * at_rng_normal(&rng));
    at_status st = at_tensor_upload(rd->score, w, H * sizeof *w);
    free(w);
    return st;
}

static int obj_trainables(at_objective *o, at_param_grad *out, int cap)
{
    rm_data *rd = o->impl;
    if (cap >= 1) out[0] = (at_param_grad){rd->score, rd->score_grad};
    return 1;
}

static at_status obj_save(const at_objective *o, const char *dir)
{
    const rm_data *rd = o->impl;
    char *p = at_path_join(dir, "score.safetensors");
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    const at_tensor *t[1] = {rd->score};
    at_status st = at_safetensors_write(p, t, NULL, 1, NULL, 0);
    free(p);
    return st;
}

static at_status obj_load(at_objective *o, const char *dir)
{
    rm_data *rd = o->impl;
    char *p = at_path_join(dir, "score.safetensors");
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    at_st_model *m = NULL;
    at_status st = at_st_model_open(p, &m);
    at_tensor *t = NULL;
    if (st == AT_OK) st = at_st_get(m, "score.weight", 2, rd->score->shape, AT_F32, &t);
    if (st == AT_OK) st = at_tensor_upload(rd->score, at_tensor_data(t), at_tensor_nbytes(t));
    at_tensor_free(t);
    at_st_model_close(m);
    free(p);
    return st;
}

/* counts[0]: the batch's pairs (the loss is their mean over the step) */
static at_status obj_build(const at_objective *o, const at_batch_plan *plan, size_t b, int32_t pad, at_batch *out,
                           double *counts)
{
    const rm_data *rd = o->impl;
    size_t n = plan->batch_start[b + 1] - plan->batch_start[b];
    AT_TRY(at_pref_batch_build(&rd->train, at_batch_plan_items(plan, b, 0), n, pad, out));
    counts[0] = (double)n;
    return AT_OK;
}

static at_status obj_forward_backward(at_objective *o, at_decoder *d, at_decoder_acts *acts, const at_obj_micro *m,
                                      at_decoder_grads *g, double *stats)
{
    rm_data *rd = o->impl;
    return at_rm_forward_backward(o->pref, m->u1 - m->u0, d, acts, m->t->ids, m->t->pos, m->batch->lengths, &m->fwd,
                                  rd->score, rd->score_grad, m->step_counts[0], m->scale, g, NULL,
                                  (at_rm_stats *)stats);
}

static double obj_loss(const at_objective *o, const double *stats, const double *counts)
{
    (void)o;
    (void)counts;
    return at_rm_stats_loss((const at_rm_stats *)stats);
}

static void obj_log(const at_objective *o, const double *stats, cJSON *line)
{
    (void)o;
    at_rm_stats_log((const at_rm_stats *)stats, line);
}

typedef struct {
    const at_objective *o;
    const rm_data *rd;
    at_decoder *d;
    at_rm_stats *s;
} eval_ctx;

static at_status eval_batch(void *vctx, const size_t *idx, size_t n, at_decoder_acts *acts, const at_batch *b,
                            const at_batch_tensors *t)
{
    (void)idx;
    eval_ctx *e = vctx;
    at_fwd_opts fwd = {0};
    return at_rm_forward_backward(e->o->pref, n, e->d, acts, t->ids, t->pos, b->lengths, &fwd, e->rd->score, NULL, 1,
                                  1, NULL, NULL, e->s);
}

/* The validation pairs, batch_size at a time in order, no gradients. */
static at_status obj_evaluate(at_objective *o, const at_obj_eval_env *env, double *loss)
{
    rm_data *rd = o->impl;
    at_rm_stats s = {0};
    at_decoder_acts_free(*env->acts); /* the evaluation makes its own */
    *env->acts = NULL;
    eval_ctx e = {o, rd, env->d, &s};
    AT_TRY(at_pref_each_batch(env->d, &rd->val, (int)env->batch.batch_size, env->pad, eval_batch, &e));
    *loss = at_rm_stats_loss(&s);
    return AT_OK;
}

static void obj_free(at_objective *o)
{
    rm_data *rd = o->impl;
    if (!rd) return;
    at_pref_pairs_free(&rd->train);
    at_pref_pairs_free(&rd->val);
    at_tensor_free(rd->score);
    at_tensor_free(rd->score_grad);
    free(rd);
}

const at_objective_ops at_objective_rm = {
    .name = "rm", .rows_per_item = 2, .n_counts = 1, .n_stats = AT_RM_STATS_N, .packs = 0, .plain_text = 0,
    .prepare = obj_prepare, .attach = obj_attach, .trainables = obj_trainables, .save = obj_save, .load = obj_load,
    .build = obj_build, .forward_backward = obj_forward_backward, .loss = obj_loss, .log = obj_log,
    .evaluate = obj_evaluate, .free = obj_free,
};
