#include "train/kto.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "train/objective.h"

_Static_assert(sizeof(at_kto_stats) == AT_KTO_STATS_N * sizeof(double), "at_kto_stats is summed as an array");

static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

void at_kto_example(const at_pref_config *c, int desirable, double z, double kl, double *loss, double *d_z)
{
    if (desirable) {
        double u = c->beta * (z - kl);
        *loss = c->desirable_weight * (1 - sigmoid(u));
        *d_z = -c->desirable_weight * c->beta * sigmoid(u) * sigmoid(-u);
    } else {
        double v = c->beta * (kl - z);
        *loss = c->undesirable_weight * (1 - sigmoid(v));
        *d_z = c->undesirable_weight * c->beta * sigmoid(v) * sigmoid(-v);
    }
}

/* ---- examples ---- */

void at_kto_examples_free(at_kto_examples *k)
{
    if (!k) return;
    at_pref_pairs_free(&k->ex);
    free(k->desirable);
    memset(k, 0, sizeof *k);
}

static int64_t count_labels(const at_encoded *e, size_t from)
{
    int64_t n = 0;
    for (size_t i = from > 1 ? from : 1; i < e->n; i++) n += e->labels[i] != AT_IGNORE_INDEX;
    return n;
}

/* The first supervised token: where the reply starts. */
static size_t reply_start(const at_encoded *e)
{
    size_t p = 0;
    while (p < e->n && e->labels[p] == AT_IGNORE_INDEX) p++;
    return p;
}

/* prompt of x (before its reply) + the reply of y and what follows it, cut to max_length (0: no limit). */
static at_status kl_row(const at_encoded *x, const at_encoded *y, size_t max_length, at_encoded *out)
{
    size_t px = reply_start(x), py = reply_start(y);
    size_t n = px + (y->n - py);
    if (max_length && n > max_length) n = max_length;
    out->ids = malloc((n ? n : 1) * sizeof *out->ids);
    out->labels = malloc((n ? n : 1) * sizeof *out->labels);
    if (!out->ids || !out->labels) {
        at_encoded_free(out);
        return at_error(AT_ERR_NOMEM, "out of memory building KTO's KL rows");
    }
    for (size_t i = 0; i < n; i++) {
        int prompt = i < px;
        out->ids[i] = prompt ? x->ids[i] : y->ids[py + i - px];
        out->labels[i] = prompt ? AT_IGNORE_INDEX : y->labels[py + i - px];
    }
    out->n = n;
    return AT_OK;
}

at_status at_kto_kl_rows(at_kto_examples *k, size_t chunk, size_t max_length)
{
    at_pref_pairs *p = &k->ex;
    if (chunk < 1) chunk = 1;
    for (size_t c0 = 0; c0 < p->n; c0 += chunk) {
        size_t c1 = c0 + chunk < p->n ? c0 + chunk : p->n;
        for (size_t i = c0; i < c1; i++) {
            size_t j = i == c0 ? c1 - 1 : i - 1;
            at_encoded_free(&p->rejected[i]);
            AT_TRY(kl_row(&p->chosen[i], &p->chosen[j], max_length, &p->rejected[i]));
            p->n_r[i] = count_labels(&p->rejected[i], 0);
            p->len[i] = p->chosen[i].n > p->rejected[i].n ? p->chosen[i].n : p->rejected[i].n;
        }
    }
    return AT_OK;
}

at_status at_kto_encode(const at_sample_list *list, const at_encoder *enc, int strict, size_t chunk,
                        const char *what, at_kto_examples *out)
{
    memset(out, 0, sizeof *out);
    if (chunk < 2)
        return at_error(AT_ERR_INVALID, "kto: --per_device_train_batch_size must be at least 2: the KL term pairs "
                        "each prompt with another example's reply of its batch (TRL's rule)");
    size_t cap = list->n ? list->n : 1;
    at_kto_examples k = {0};
    at_pref_pairs *p = &k.ex;
    p->chosen = calloc(cap, sizeof *p->chosen);
    p->rejected = calloc(cap, sizeof *p->rejected);
    p->len = calloc(cap, sizeof *p->len);
    p->n_c = calloc(cap, sizeof *p->n_c);
    p->n_r = calloc(cap, sizeof *p->n_r);
    p->ref_c = calloc(cap, sizeof *p->ref_c);
    p->ref_r = calloc(cap, sizeof *p->ref_r);
    k.desirable = calloc(cap, sizeof *k.desirable);
    if (!p->chosen || !p->rejected || !p->len || !p->n_c || !p->n_r || !p->ref_c || !p->ref_r || !k.desirable) {
        at_kto_examples_free(&k);
        return at_error(AT_ERR_NOMEM, "out of memory encoding KTO examples");
    }
    size_t dropped = 0, failed = 0, no_labels = 0, des = 0;
    at_status st = AT_OK;
    for (size_t i = 0; i < list->n; i++) {
        const at_sample *s = list->items[i];
        int drop = 0;
        if (s->kind != AT_SAMPLE_CONVERSATION || s->label < 0)
            st = at_error(AT_ERR_INVALID, "%s:%d: not a KTO example: kto needs conversations with a \"label\" "
                          "(true: desirable, false: undesirable; or \"kto_tag\")",
                          s->source ? s->source : "dataset", s->line);
        else
            st = at_encode_sample(enc, s, &p->chosen[p->n], &drop);
        if (st != AT_OK) {
            if (strict) break;
            if (failed++ < 5) at_log_warn("skipping an example: %s", at_last_error());
            st = AT_OK;
            continue;
        }
        if (drop) {
            dropped++;
            continue;
        }
        int64_t nc = count_labels(&p->chosen[p->n], 0);
        if (!nc) {
            no_labels++;
            at_encoded_free(&p->chosen[p->n]);
            continue;
        }
        p->n_c[p->n] = nc;
        k.desirable[p->n] = s->label;
        des += s->label != 0;
        p->n++;
    }
    if (st == AT_OK) st = at_kto_kl_rows(&k, chunk, enc->max_length);
    if (st != AT_OK) {
        at_kto_examples_free(&k);
        return st;
    }
    at_log_info("%s: %zu KTO examples encoded, %zu desirable and %zu undesirable (%zu longer than --max_length "
                "dropped, %zu failed, %zu with an empty reply)", what, p->n, des, p->n - des, dropped, failed,
                no_labels);
    *out = k;
    return AT_OK;
}

/* ---- the step ---- */

at_status at_kto_forward_backward(const at_pref_config *c, const at_kto_examples *k, const size_t *idx, size_t n,
                                  at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                                  const at_tensor *labels, const at_fwd_opts *fwd, double step_examples,
                                  double scale, at_decoder_grads *g, at_kto_stats *stats)
{
    if (acts->B != (int)(2 * n))
        return at_error(AT_ERR_INVALID, "kto step: %zu examples need %zu rows, the activations have %d", n, 2 * n,
                        acts->B);
    double *row = calloc(2 * n, sizeof *row);
    float *rs = calloc(2 * n, sizeof *rs);
    at_status st = AT_OK;
    if (!row || !rs) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_decoder_forward_train_opts(d, acts, ids, pos, NULL, fwd));
    /* each row's Σ −log p; with LoRA the gradient of every row's loss sum at
     * `scale` in the same pass, weighted afterwards (as at_pref_forward_backward) */
    int one_pass = g && !g->full;
    at_loss_stats ls = {0};
    ls.row_loss = row;
    AT_CHECK(at_decoder_loss(d, acts, labels, one_pass ? (float)scale : 1.0f, one_pass ? g : NULL, &ls));
    /* kl: the mean over the forward's mismatched pairs, clamped at 0, a constant */
    double kl = 0;
    for (size_t i = 0; i < n; i++) kl += -row[2 * i + 1] - k->ex.ref_r[idx[i]];
    kl = n ? kl / (double)n : 0;
    if (!(kl > 0)) kl = 0;
    stats->kl += kl;
    stats->kl_forwards += 1;
    for (size_t i = 0; i < n; i++) {
        size_t e = idx[i];
        int des = k->desirable[e];
        double pi = -row[2 * i], z = pi - k->ex.ref_c[e], loss, dz;
        at_kto_example(c, des, z, kl, &loss, &dz);
        stats->examples += 1;
        stats->loss += loss;
        *(des ? &stats->n_des : &stats->n_und) += 1;
        *(des ? &stats->reward_c : &stats->reward_r) += c->beta * z;
        *(des ? &stats->logp_c : &stats->logp_r) += pi;
        /* the row's loss sum S is −π: dL/dS = −dL/dz, over the step's examples; the KL row gets none */
        rs[2 * i] = (float)(-dz / step_examples);
        rs[2 * i + 1] = 0.0f;
    }
    if (one_pass) {
        AT_CHECK(at_decoder_loss_scale_rows(acts, g, rs));
    } else if (g) {
        at_loss_stats ls2 = {0};
        ls2.row_grad_scale = rs;
        AT_CHECK(at_decoder_loss(d, acts, labels, (float)scale, g, &ls2));
    }
    if (g) AT_CHECK(at_decoder_backward(d, acts, g));
done:
    free(row);
    free(rs);
    return st;
}

double at_kto_stats_loss(const at_kto_stats *s) { return s->examples > 0 ? s->loss / s->examples : NAN; }

void at_kto_stats_log(const at_kto_stats *s, cJSON *line)
{
    if (s->kl_forwards > 0) cJSON_AddNumberToObject(line, "kl", s->kl / s->kl_forwards);
    if (s->n_des > 0) {
        cJSON_AddNumberToObject(line, "rewards/chosen", s->reward_c / s->n_des);
        cJSON_AddNumberToObject(line, "logps/chosen", s->logp_c / s->n_des);
    }
    if (s->n_und > 0) {
        cJSON_AddNumberToObject(line, "rewards/rejected", s->reward_r / s->n_und);
        cJSON_AddNumberToObject(line, "logps/rejected", s->logp_r / s->n_und);
    }
    if (s->n_des > 0 && s->n_und > 0)
        cJSON_AddNumberToObject(line, "rewards/margins", s->reward_c / s->n_des - s->reward_r / s->n_und);
}

/* ---- the objective (train/objective.h) ---- */

typedef struct {
    at_kto_examples train, val;
} kto_data;

static at_status obj_prepare(at_objective *o, const at_obj_data_env *env, const at_sample_list *train,
                             const at_sample_list *val)
{
    kto_data *kd = calloc(1, sizeof *kd);
    if (!kd) return at_error(AT_ERR_NOMEM, "out of memory");
    o->impl = kd;
    size_t chunk = env->batch_size > 0 ? (size_t)env->batch_size : 1;
    AT_TRY(at_kto_encode(train, env->enc, env->strict, chunk, "train", &kd->train));
    if (val->n) AT_TRY(at_kto_encode(val, env->enc, env->strict, chunk, "eval", &kd->val));
    if (kd->train.ex.n == 0) return at_error(AT_ERR_INVALID, "no KTO example left after encoding (see the warnings above)");
    o->n_train = kd->train.ex.n;
    o->train_len = kd->train.ex.len;
    o->n_val = kd->val.ex.n;
    o->val_len = kd->val.ex.len;
    return AT_OK;
}

static int obj_needs_reference(const at_objective *o)
{
    (void)o;
    return 1;
}

static at_status obj_reference(at_objective *o, at_decoder *ref, int batch_items, int32_t pad)
{
    kto_data *kd = o->impl;
    AT_TRY(at_pref_reference(ref, &kd->train.ex, batch_items, pad));
    if (kd->val.ex.n) AT_TRY(at_pref_reference(ref, &kd->val.ex, batch_items, pad));
    return AT_OK;
}

/* counts[0]: the batch's examples (the loss is their mean over the step) */
static at_status obj_build(const at_objective *o, const at_batch_plan *plan, size_t b, int32_t pad, at_batch *out,
                           double *counts)
{
    const kto_data *kd = o->impl;
    size_t n = plan->batch_start[b + 1] - plan->batch_start[b];
    AT_TRY(at_pref_batch_build(&kd->train.ex, at_batch_plan_items(plan, b, 0), n, pad, out));
    counts[0] = (double)n;
    return AT_OK;
}

static at_status obj_forward_backward(at_objective *o, at_decoder *d, at_decoder_acts *acts, const at_obj_micro *m,
                                      at_decoder_grads *g, double *stats)
{
    const kto_data *kd = o->impl;
    const size_t *items = at_batch_plan_items(m->plan, m->b, m->u0);
    return at_kto_forward_backward(o->pref, &kd->train, items, m->u1 - m->u0, d, acts, m->t->ids, m->t->pos,
                                   m->t->labels, &m->fwd, m->step_counts[0], m->scale, g, (at_kto_stats *)stats);
}

static double obj_loss(const at_objective *o, const double *stats, const double *counts)
{
    (void)o;
    (void)counts;
    return at_kto_stats_loss((const at_kto_stats *)stats);
}

static void obj_log(const at_objective *o, const double *stats, cJSON *line)
{
    (void)o;
    at_kto_stats_log((const at_kto_stats *)stats, line);
}

typedef struct {
    const at_objective *o;
    const at_kto_examples *k;
    at_decoder *d;
    at_kto_stats *s;
} eval_ctx;

static at_status eval_batch(void *vctx, const size_t *idx, size_t n, at_decoder_acts *acts, const at_batch *b,
                            const at_batch_tensors *t)
{
    (void)b;
    eval_ctx *e = vctx;
    at_fwd_opts fwd = {0};
    return at_kto_forward_backward(e->o->pref, e->k, idx, n, e->d, acts, t->ids, t->pos, t->labels, &fwd, 1, 1, NULL,
                                   e->s);
}

/* The validation examples, batch_size at a time in order, no dropout, no gradients. */
static at_status obj_evaluate(at_objective *o, const at_obj_eval_env *env, double *loss)
{
    kto_data *kd = o->impl;
    at_kto_stats s = {0};
    at_decoder_acts_free(*env->acts); /* the evaluation makes its own */
    *env->acts = NULL;
    eval_ctx e = {o, &kd->val, env->d, &s};
    AT_TRY(at_pref_each_batch(env->d, &kd->val.ex, (int)env->batch.batch_size, env->pad, eval_batch, &e));
    *loss = at_kto_stats_loss(&s);
    return AT_OK;
}

static void obj_free(at_objective *o)
{
    kto_data *kd = o->impl;
    if (!kd) return;
    at_kto_examples_free(&kd->train);
    at_kto_examples_free(&kd->val);
    free(kd);
}

const at_objective_ops at_objective_kto = {
    .name = "kto", .rows_per_item = 2, .n_counts = 1, .n_stats = AT_KTO_STATS_N, .packs = 0, .plain_text = 0,
    .prepare = obj_prepare, .needs_reference = obj_needs_reference, .reference = obj_reference, .build = obj_build,
    .forward_backward = obj_forward_backward, .loss = obj_loss, .log = obj_log, .evaluate = obj_evaluate,
    .free = obj_free,
};
