#include "train/preference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "train/train_options.h"
#include "train/grpo.h"
#include "train/objective.h"

_Static_assert(sizeof(at_pref_stats) == AT_PREF_STATS_N * sizeof(double), "at_pref_stats is summed as an array");

static const char *const LOSS_NAMES[] = {"sigmoid", "ipo", "hinge", "simpo"};

const char *at_pref_loss_type_name(at_pref_loss_type t)
{
    return (unsigned)t < sizeof LOSS_NAMES / sizeof LOSS_NAMES[0] ? LOSS_NAMES[t] : "?";
}

at_status at_pref_loss_type_parse(const char *name, at_pref_loss_type *out)
{
    for (size_t i = 0; name && i < sizeof LOSS_NAMES / sizeof LOSS_NAMES[0]; i++)
        if (!strcmp(name, LOSS_NAMES[i])) {
            *out = (at_pref_loss_type)i;
            return AT_OK;
        }
    return at_error(AT_ERR_INVALID, "--loss_type %s: this build has sigmoid, ipo and hinge (dpo, cpo) and simpo (cpo)",
                    name ? name : "(none)");
}

#define BUILD_HAS "this build has dpo, simpo, cpo, orpo, kto, rm and grpo"

at_status at_pref_config_init(at_pref_config *c, const char *name)
{
    memset(c, 0, sizeof *c);
    at_pref_config_store(NULL, c); /* the option table's defaults (train/train_options.c) */
    /* beta's default depends on the type (its row has none) */
    c->beta = 0.1;
    c->loss_type = AT_PREF_SIGMOID;
    if (name && !strcmp(name, "dpo")) {
        c->objective = AT_PREF_DPO;
        c->name = "dpo";
    } else if (name && !strcmp(name, "simpo")) { /* ms-swift: cpo with loss_type simpo, beta 2 */
        c->objective = AT_PREF_CPO;
        c->name = "simpo";
        c->loss_type = AT_PREF_SIMPO;
        c->beta = 2.0;
        c->simpo_gamma = 1.0;
        c->cpo_alpha = 1.0;
    } else if (name && !strcmp(name, "cpo")) {
        c->objective = AT_PREF_CPO;
        c->name = "cpo";
        c->cpo_alpha = 1.0;
    } else if (name && !strcmp(name, "orpo")) {
        c->objective = AT_PREF_ORPO;
        c->name = "orpo";
    } else if (name && !strcmp(name, "kto")) {
        c->objective = AT_PREF_KTO;
        c->name = "kto";
    } else if (name && !strcmp(name, "rm")) {
        c->objective = AT_PREF_RM;
        c->name = "rm";
    } else if (name && !strcmp(name, "grpo")) { /* ms-swift's beta 0.04 (TRL's is 0: no reference pass) */
        c->objective = AT_PREF_GRPO;
        c->name = "grpo";
        c->beta = 0.04;
    } else {
        static const char *const others[] = {"ppo", "gkd"};
        for (size_t i = 0; name && i < sizeof others / sizeof others[0]; i++)
            if (!strcmp(name, others[i]))
                return at_error(AT_ERR_UNSUPPORTED, "--rlhf_type %s: not in this build (%s)", name, BUILD_HAS);
        return at_error(AT_ERR_INVALID, "--rlhf_type %s: unknown; %s (ms-swift also has ppo, gkd)",
                        name ? name : "(none)", BUILD_HAS);
    }
    return AT_OK;
}

int at_pref_needs_reference(const at_pref_config *c)
{
    return c->objective == AT_PREF_DPO || c->objective == AT_PREF_KTO || (c->objective == AT_PREF_GRPO && c->beta > 0);
}

int at_pref_averaged(const at_pref_config *c)
{
    return c->objective == AT_PREF_ORPO || c->loss_type == AT_PREF_IPO || c->loss_type == AT_PREF_SIMPO;
}

double at_pref_nll_alpha(const at_pref_config *c)
{
    return c->objective == AT_PREF_ORPO ? 1.0 : c->objective == AT_PREF_CPO ? c->cpo_alpha : c->rpo_alpha;
}

at_status at_pref_config_check(const at_pref_config *c)
{
    const char *n = c->name ? c->name : "dpo";
    if (c->objective == AT_PREF_GRPO) {
        /* β 0: no KL term and no reference pass */
        if (!(c->beta >= 0) || !isfinite(c->beta)) return at_error(AT_ERR_INVALID, "--beta %g must be >= 0", c->beta);
    } else if (!(c->beta > 0) || !isfinite(c->beta)) {
        return at_error(AT_ERR_INVALID, "--beta %g must be > 0", c->beta);
    }
    if ((unsigned)c->objective > AT_PREF_GRPO || (unsigned)c->loss_type > AT_PREF_SIMPO)
        return at_error(AT_ERR_INVALID, "preference objective %d / loss_type %d: out of range", (int)c->objective,
                        (int)c->loss_type);
    if ((c->objective == AT_PREF_ORPO || c->objective == AT_PREF_KTO || c->objective == AT_PREF_RM ||
         c->objective == AT_PREF_GRPO) && c->loss_type != AT_PREF_SIGMOID)
        return at_error(AT_ERR_INVALID, "--loss_type %s does not apply to --rlhf_type %s (it has one loss)",
                        at_pref_loss_type_name(c->loss_type), n);
    if (!(c->desirable_weight >= 0 && isfinite(c->desirable_weight)) ||
        !(c->undesirable_weight >= 0 && isfinite(c->undesirable_weight)))
        return at_error(AT_ERR_INVALID, "--desirable_weight %g and --undesirable_weight %g must be finite and >= 0",
                        c->desirable_weight, c->undesirable_weight);
    if (c->objective != AT_PREF_KTO && (c->desirable_weight != 1 || c->undesirable_weight != 1))
        return at_error(AT_ERR_INVALID, "--desirable_weight and --undesirable_weight are kto's (not %s)", n);
    if (!(c->center_rewards_coefficient >= 0 && isfinite(c->center_rewards_coefficient)))
        return at_error(AT_ERR_INVALID, "--center_rewards_coefficient %g must be finite and >= 0",
                        c->center_rewards_coefficient);
    if (c->center_rewards_coefficient > 0 && c->objective != AT_PREF_RM)
        return at_error(AT_ERR_INVALID, "--center_rewards_coefficient is rm's (not %s)", n);
    if (c->objective == AT_PREF_DPO && c->loss_type == AT_PREF_SIMPO)
        return at_error(AT_ERR_INVALID, "--loss_type simpo is reference-free: use --rlhf_type simpo (or cpo)");
    if (!(c->label_smoothing >= 0 && c->label_smoothing < 0.5))
        return at_error(AT_ERR_INVALID, "--label_smoothing %g must be in [0, 0.5)", c->label_smoothing);
    if (c->label_smoothing > 0 && (c->objective == AT_PREF_ORPO || c->objective >= AT_PREF_KTO ||
                                   (c->loss_type != AT_PREF_SIGMOID && c->loss_type != AT_PREF_SIMPO)))
        return at_error(AT_ERR_INVALID, "--label_smoothing applies to the sigmoid and simpo losses of dpo, cpo and "
                        "simpo only (not %s with loss_type %s)", n, at_pref_loss_type_name(c->loss_type));
    if (!(c->rpo_alpha >= 0) || !isfinite(c->rpo_alpha))
        return at_error(AT_ERR_INVALID, "--rpo_alpha %g must be >= 0", c->rpo_alpha);
    if (c->rpo_alpha > 0 && c->objective != AT_PREF_DPO)
        return at_error(AT_ERR_INVALID, "--rpo_alpha is DPO's; %s weighs the chosen replies' NLL with %s", n,
                        c->objective == AT_PREF_ORPO  ? "1 (its SFT term)"
                        : c->objective >= AT_PREF_KTO ? "nothing (it has no NLL term)"
                                                      : "--cpo_alpha");
    if (!(c->cpo_alpha >= 0) || !isfinite(c->cpo_alpha))
        return at_error(AT_ERR_INVALID, "--cpo_alpha %g must be >= 0", c->cpo_alpha);
    if (c->cpo_alpha > 0 && c->objective != AT_PREF_CPO)
        return at_error(AT_ERR_INVALID, "--cpo_alpha applies to cpo and simpo (not %s)", n);
    if (!isfinite(c->simpo_gamma))
        return at_error(AT_ERR_INVALID, "--simpo_gamma %g must be finite", c->simpo_gamma);
    if (c->simpo_gamma != 0 && c->loss_type != AT_PREF_SIMPO)
        return at_error(AT_ERR_INVALID, "--simpo_gamma applies to simpo (--loss_type simpo) only (not %s with "
                        "loss_type %s)", n, at_pref_loss_type_name(c->loss_type));
    if (c->objective == AT_PREF_GRPO) {
        if (!c->grpo) return at_error(AT_ERR_INVALID, "grpo: its options are missing");
        AT_TRY(at_grpo_config_check(c->grpo));
    }
    if (c->ref_model && !at_pref_needs_reference(c) && c->objective == AT_PREF_GRPO)
        return at_error(AT_ERR_INVALID, "--ref_model %s with grpo --beta 0: no KL term, so no reference; drop "
                        "--ref_model or set --beta", c->ref_model);
    if (c->ref_model && !at_pref_needs_reference(c))
        return at_error(AT_ERR_INVALID, "--ref_model %s: %s is reference-free (it compares the policy's own chosen and "
                        "rejected log-probs); drop --ref_model", c->ref_model, n);
    return AT_OK;
}

/* log σ(x) and σ(x) without overflow for large |x|. */
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

/* log(1 − e^a) for a < 0, accurate at both ends: near 0, 1 − e^a = −expm1(a)
 * keeps its digits; far below, log1p keeps those of the tiny e^a. */
static double log1m_exp(double a)
{
    return a > -0.69314718055994530942 /* −ln 2 */ ? log(-expm1(a)) : log1p(-exp(a));
}

/* With h = (π_c − π_r) − (r_c − r_r) (r = 0 without a reference), dh/dπ_c = 1,
 * dh/dπ_r = −1, and d log σ(x)/dx = σ(−x):
 *   sigmoid, simpo (z = βh − γ, γ = 0 for sigmoid):
 *            L = −(1−ls)·log σ(z) − ls·log σ(−z),   dL/dh = β·(−(1−ls)·σ(−z) + ls·σ(z))
 *   ipo:     L = (h − 1/(2β))²,                     dL/dh = 2(h − 1/(2β))
 *   hinge:   L = max(0, 1 − βh),                    dL/dh = −β where βh < 1, else 0
 *   orpo:    ℓ(a) = a − log(1 − e^a),               ℓ'(a) = 1 + e^a/(1 − e^a) = 1/(1 − e^a) = −1/expm1(a)
 *            Δ = ℓ(π_c) − ℓ(π_r),  L = −β·log σ(Δ), dL/dΔ = −β·σ(−Δ)
 *            dL/dπ_c = −β·σ(−Δ)·ℓ'(π_c),            dL/dπ_r = β·σ(−Δ)·ℓ'(π_r)
 * ORPO's π are mean log-probs, ≤ 0; one above AT_PREF_ORPO_MAX_LOGP (a reply
 * certain within f32 rounding, where ℓ would be +∞) is evaluated there, value
 * and slope alike: the loss stays finite and a certain rejected reply is
 * still pushed down (hard, ℓ' ≈ 1e7; clipping bounds the step). */
void at_pref_pair(const at_pref_config *c, double pi_c, double pi_r, double ref_c, double ref_r,
                  at_pref_pair_loss *out)
{
    memset(out, 0, sizeof *out);
    if (c->objective == AT_PREF_ORPO) {
        /* (not fmin, which would turn a NaN from a broken forward into a number) */
        double ac = pi_c > AT_PREF_ORPO_MAX_LOGP ? AT_PREF_ORPO_MAX_LOGP : pi_c;
        double ar = pi_r > AT_PREF_ORPO_MAX_LOGP ? AT_PREF_ORPO_MAX_LOGP : pi_r;
        double delta = (ac - log1m_exp(ac)) - (ar - log1m_exp(ar));
        double ls = log_sigmoid(delta), dd = -c->beta * sigmoid(-delta);
        out->loss = -c->beta * ls;
        out->d_chosen = dd * (-1 / expm1(ac));
        out->d_rejected = -dd * (-1 / expm1(ar));
        out->log_odds = delta;
        out->log_odds_ratio = ls;
        return;
    }
    if (!at_pref_needs_reference(c)) ref_c = ref_r = 0;
    double h = (pi_c - pi_r) - (ref_c - ref_r), dh;
    switch (c->loss_type) {
    case AT_PREF_IPO: {
        double t = h - 1 / (2 * c->beta);
        out->loss = t * t;
        dh = 2 * t;
        break;
    }
    case AT_PREF_HINGE: {
        double z = c->beta * h;
        out->loss = z < 1 ? 1 - z : 0;
        dh = z < 1 ? -c->beta : 0;
        break;
    }
    default: { /* sigmoid, simpo */
        double ls = c->label_smoothing;
        double z = c->beta * h - (c->loss_type == AT_PREF_SIMPO ? c->simpo_gamma : 0);
        out->loss = -(1 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
        dh = c->beta * (-(1 - ls) * sigmoid(-z) + ls * sigmoid(z));
        break;
    }
    }
    out->d_chosen = dh;
    out->d_rejected = -dh;
}

/* ---- pairs ---- */

void at_pref_pairs_free(at_pref_pairs *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) {
        at_encoded_free(&p->chosen[i]);
        at_encoded_free(&p->rejected[i]);
    }
    free(p->chosen);
    free(p->rejected);
    free(p->len);
    free(p->n_c);
    free(p->n_r);
    free(p->ref_c);
    free(p->ref_r);
    memset(p, 0, sizeof *p);
}

/* Supervised targets of an encoded sample: labels after the first token. */
static int64_t count_labels(const at_encoded *e)
{
    int64_t n = 0;
    for (size_t k = 1; k < e->n; k++) n += e->labels[k] != AT_IGNORE_INDEX;
    return n;
}

at_status at_pref_pairs_encode(const at_sample_list *list, const at_encoder *enc, int strict, const char *what,
                              at_pref_pairs *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = list->n ? list->n : 1;
    at_pref_pairs p = {0};
    p.chosen = calloc(cap, sizeof *p.chosen);
    p.rejected = calloc(cap, sizeof *p.rejected);
    p.len = calloc(cap, sizeof *p.len);
    p.n_c = calloc(cap, sizeof *p.n_c);
    p.n_r = calloc(cap, sizeof *p.n_r);
    p.ref_c = calloc(cap, sizeof *p.ref_c);
    p.ref_r = calloc(cap, sizeof *p.ref_r);
    if (!p.chosen || !p.rejected || !p.len || !p.n_c || !p.n_r || !p.ref_c || !p.ref_r) {
        at_pref_pairs_free(&p);
        return at_error(AT_ERR_NOMEM, "out of memory encoding preference pairs");
    }
    size_t dropped = 0, failed = 0, no_labels = 0;
    at_status st = AT_OK;
    for (size_t i = 0; i < list->n; i++) {
        const at_sample *s = list->items[i];
        int drop = 0;
        if (s->kind != AT_SAMPLE_PREFERENCE)
            st = at_error(AT_ERR_INVALID, "%s:%d: not a preference pair: rlhf needs records with a chosen and a "
                          "rejected reply (\"chosen\"/\"rejected\", or \"messages\" + \"rejected_response\")",
                          s->source ? s->source : "dataset", s->line);
        else
            st = at_encode_preference(enc, s, &p.chosen[p.n], &p.rejected[p.n], &drop);
        if (st != AT_OK) {
            if (strict) break;
            if (failed++ < 5) at_log_warn("skipping a pair: %s", at_last_error());
            st = AT_OK;
            continue;
        }
        if (drop) {
            dropped++;
            continue;
        }
        int64_t nc = count_labels(&p.chosen[p.n]), nr = count_labels(&p.rejected[p.n]);
        if (!nc || !nr) { /* a reply cut away entirely: nothing to compare */
            no_labels++;
            at_encoded_free(&p.chosen[p.n]);
            at_encoded_free(&p.rejected[p.n]);
            continue;
        }
        p.n_c[p.n] = nc;
        p.n_r[p.n] = nr;
        p.len[p.n] = p.chosen[p.n].n > p.rejected[p.n].n ? p.chosen[p.n].n : p.rejected[p.n].n;
        p.n++;
    }
    if (st != AT_OK) {
        at_pref_pairs_free(&p);
        return st;
    }
    at_log_info("%s: %zu preference pairs encoded (%zu longer than --max_length dropped, %zu failed, %zu with an "
                "empty reply)", what, p.n, dropped, failed, no_labels);
    *out = p;
    return AT_OK;
}

at_status at_pref_batch_build(const at_pref_pairs *p, const size_t *idx, size_t n, int32_t pad, at_batch *out)
{
    memset(out, 0, sizeof *out);
    size_t rows = 2 * n, cols = 1;
    for (size_t i = 0; i < n; i++) {
        if (idx[i] >= p->n) return at_error(AT_ERR_INVALID, "preference batch: pair %zu of %zu", idx[i], p->n);
        if (p->len[idx[i]] > cols) cols = p->len[idx[i]];
    }
    size_t cells = rows * cols;
    out->ids = malloc((cells ? cells : 1) * sizeof *out->ids);
    out->labels = malloc((cells ? cells : 1) * sizeof *out->labels);
    out->positions = malloc((cells ? cells : 1) * sizeof *out->positions);
    out->lengths = malloc((rows ? rows : 1) * sizeof *out->lengths);
    if (!out->ids || !out->labels || !out->positions || !out->lengths) {
        at_batch_free(out);
        return at_error(AT_ERR_NOMEM, "out of memory building a preference batch of %zu x %zu", rows, cols);
    }
    out->rows = rows;
    out->cols = cols;
    for (size_t r = 0; r < rows; r++) {
        const at_encoded *e = r % 2 ? &p->rejected[idx[r / 2]] : &p->chosen[idx[r / 2]];
        for (size_t c = 0; c < cols; c++) {
            size_t k = r * cols + c;
            int in = c < e->n;
            out->ids[k] = in ? e->ids[c] : pad;
            out->labels[k] = in ? e->labels[c] : AT_IGNORE_INDEX;
            out->positions[k] = in ? (int32_t)c : 0;
        }
        out->lengths[r] = (int32_t)e->n;
    }
    return AT_OK;
}

/* ---- running batches without gradients ---- */

/* No gradients here, so no layer's activations are needed after the layer:
 * AT_ACTS_CHECKPOINT makes every layer share one set of them (keeping only
 * the layer inputs resid[0..L]) instead of keeping all L. The forward runs the
 * same kernels on the same inputs, so the log-probs are bit-identical; the
 * pass then needs less memory than a training step (it used to be the peak
 * of DPO with gradient checkpointing: plan/memory.c reference_peak). */
at_status at_pref_each_batch(at_decoder *d, const at_pref_pairs *p, int batch_pairs, int32_t pad, at_pref_batch_fn fn,
                             void *ctx)
{
    size_t bp = batch_pairs > 0 ? (size_t)batch_pairs : 1;
    size_t *idx = malloc(bp * sizeof *idx);
    if (!idx) return at_error(AT_ERR_NOMEM, "out of memory");
    at_decoder_acts *acts = NULL;
    at_status st = AT_OK;
    for (size_t i0 = 0; i0 < p->n && st == AT_OK; i0 += bp) {
        size_t n = p->n - i0 < bp ? p->n - i0 : bp;
        for (size_t k = 0; k < n; k++) idx[k] = i0 + k;
        at_batch b = {0};
        at_batch_tensors t = {0};
        st = at_pref_batch_build(p, idx, n, pad, &b);
        if (st == AT_OK) st = at_batch_tensors_upload(d->be, &b, 0, &t);
        if (st == AT_OK && (!acts || acts->B != (int)b.rows || acts->T != (int)b.cols)) {
            at_decoder_acts_free(acts);
            acts = NULL;
            st = at_decoder_acts_new_ex(d, (int)b.rows, (int)b.cols, AT_ACTS_LOSS | AT_ACTS_CHECKPOINT, &acts);
        }
        if (st == AT_OK) st = fn(ctx, idx, n, acts, &b, &t);
        at_batch_tensors_free(&t);
        at_batch_free(&b);
    }
    at_decoder_acts_free(acts);
    free(idx);
    return st;
}

typedef struct {
    at_decoder *d;
    at_pref_pairs *p;
} ref_ctx;

static at_status ref_batch(void *vctx, const size_t *idx, size_t n, at_decoder_acts *acts, const at_batch *b,
                           const at_batch_tensors *t)
{
    (void)b;
    ref_ctx *c = vctx;
    double *row = calloc(2 * n, sizeof *row);
    if (!row) return at_error(AT_ERR_NOMEM, "out of memory");
    at_loss_stats ls = {0};
    ls.row_loss = row;
    at_status st = at_decoder_forward(c->d, acts, t->ids, t->pos, NULL);
    if (st == AT_OK) st = at_decoder_loss(c->d, acts, t->labels, 1.0f, NULL, &ls);
    for (size_t i = 0; i < n && st == AT_OK; i++) {
        c->p->ref_c[idx[i]] = -row[2 * i]; /* the loss sum is −log p */
        c->p->ref_r[idx[i]] = -row[2 * i + 1];
    }
    free(row);
    return st;
}

at_status at_pref_reference(at_decoder *d, at_pref_pairs *p, int batch_pairs, int32_t pad)
{
    ref_ctx c = {d, p};
    at_status st = at_pref_each_batch(d, p, batch_pairs, pad, ref_batch, &c);
    return st == AT_OK ? st : at_error_wrap(st, "DPO reference log-probs");
}
/* ---- the step ---- */

double at_pref_stats_loss(const at_pref_config *c, const at_pref_stats *s)
{
    if (!(s->pairs > 0)) return NAN;
    double l = s->loss / s->pairs, alpha = at_pref_nll_alpha(c);
    if (alpha > 0 && s->nll_targets > 0) l += alpha * s->nll / s->nll_targets;
    return l;
}

void at_pref_stats_add(at_pref_stats *a, const at_pref_stats *b)
{
    double *x = (double *)a;
    const double *y = (const double *)b;
    for (int i = 0; i < AT_PREF_STATS_N; i++) x[i] += y[i];
}

void at_pref_stats_log(const at_pref_config *c, const at_pref_stats *s, cJSON *line)
{
    if (!(s->pairs > 0)) return;
    double n = s->pairs;
    cJSON_AddNumberToObject(line, "rewards/chosen", s->reward_c / n);
    cJSON_AddNumberToObject(line, "rewards/rejected", s->reward_r / n);
    cJSON_AddNumberToObject(line, "rewards/accuracies", s->correct / n);
    cJSON_AddNumberToObject(line, "rewards/margins", (s->reward_c - s->reward_r) / n);
    cJSON_AddNumberToObject(line, "logps/chosen", s->logp_c / n);
    cJSON_AddNumberToObject(line, "logps/rejected", s->logp_r / n);
    /* TRL's CPO and ORPO log the NLL always, its DPO with rpo_alpha */
    if ((c->objective != AT_PREF_DPO || c->rpo_alpha > 0) && s->nll_targets > 0)
        cJSON_AddNumberToObject(line, "nll_loss", s->nll / s->nll_targets);
    if (c->objective == AT_PREF_ORPO) {
        cJSON_AddNumberToObject(line, "log_odds_ratio", s->log_odds_ratio / n);
        cJSON_AddNumberToObject(line, "log_odds_chosen", s->log_odds / n);
    }
}

at_status at_pref_forward_backward(const at_pref_config *c, const at_pref_pairs *p, const size_t *idx, size_t n,
                                   at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                                   const at_tensor *labels, float dropout, uint64_t seed, double step_pairs,
                                   double step_nll_targets, double scale, at_decoder_grads *g, at_pref_stats *stats)
{
    at_fwd_opts o = at_decoder_acts_opts(acts, dropout, seed);
    return at_pref_forward_backward_opts(c, p, idx, n, d, acts, ids, pos, labels, &o, step_pairs, step_nll_targets,
                                         scale, g, stats);
}

at_status at_pref_forward_backward_opts(const at_pref_config *c, const at_pref_pairs *p, const size_t *idx, size_t n,
                                        at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                        const at_tensor *pos, const at_tensor *labels, const at_fwd_opts *fwd,
                                        double step_pairs, double step_nll_targets, double scale,
                                        at_decoder_grads *g, at_pref_stats *stats)
{
    if (acts->B != (int)(2 * n))
        return at_error(AT_ERR_INVALID, "%s step: %zu pairs need %zu rows, the activations have %d",
                        c->name ? c->name : "preference", n, 2 * n, acts->B);
    double *row = calloc(2 * n, sizeof *row);
    int64_t *rowt = calloc(2 * n, sizeof *rowt);
    float *rs = calloc(2 * n, sizeof *rs);
    at_status st = AT_OK;
    if (!row || !rowt || !rs) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_decoder_forward_train_opts(d, acts, ids, pos, NULL, fwd));
    /* each row's Σ −log p and its target count. With LoRA the same pass
     * leaves the gradient of every row's loss sum at `scale` and the rows are
     * weighted afterwards (at_decoder_loss_scale_rows: one pass over the
     * vocabulary); full fine-tuning accumulates the lm_head gradient inside
     * the loss, so there the weights must be known first (a second pass). */
    int one_pass = g && !g->full;
    at_loss_stats ls = {0};
    ls.row_loss = row;
    ls.row_targets = rowt;
    AT_CHECK(at_decoder_loss(d, acts, labels, one_pass ? (float)scale : 1.0f, one_pass ? g : NULL, &ls));
    int avg = at_pref_averaged(c), ref = at_pref_needs_reference(c);
    double alpha = at_pref_nll_alpha(c);
    for (size_t i = 0; i < n; i++) {
        size_t k = idx[i];
        double nc = rowt[2 * i] > 0 ? (double)rowt[2 * i] : 1, nr = rowt[2 * i + 1] > 0 ? (double)rowt[2 * i + 1] : 1;
        /* π is the sum of the reply's log-probs, or its mean (weight 1/n) */
        double wc = avg ? 1 / nc : 1, wr = avg ? 1 / nr : 1;
        double pc = -row[2 * i] * wc, pr = -row[2 * i + 1] * wr;
        double rc = ref ? p->ref_c[k] * wc : 0, rr = ref ? p->ref_r[k] * wr : 0;
        at_pref_pair_loss pl;
        at_pref_pair(c, pc, pr, rc, rr, &pl);
        double gc = c->beta * (pc - rc), gr = c->beta * (pr - rr);
        stats->pairs += 1;
        stats->loss += pl.loss;
        stats->reward_c += gc;
        stats->reward_r += gr;
        stats->correct += gc > gr;
        stats->logp_c += pc;
        stats->logp_r += pr;
        stats->nll += row[2 * i];
        stats->nll_targets += (double)rowt[2 * i];
        stats->log_odds += pl.log_odds;
        stats->log_odds_ratio += pl.log_odds_ratio;
        /* The row's loss sum S is −Σ log p and π = −w·S, so its gradient
         * scale is dL/dS = −dL/dπ · w / step_pairs; the chosen row adds the
         * NLL term's α / step_nll_targets (a token mean over the step). */
        double sc = -pl.d_chosen * wc / step_pairs, sr = -pl.d_rejected * wr / step_pairs;
        if (alpha > 0 && step_nll_targets > 0) sc += alpha / step_nll_targets;
        rs[2 * i] = (float)sc;
        rs[2 * i + 1] = (float)sr;
    }
    if (one_pass) {
        AT_CHECK(at_decoder_loss_scale_rows(acts, g, rs));
    } else if (g) {
        /* pass 2: the same forward's logits again, now with each row's scale */
        at_loss_stats ls2 = {0};
        ls2.row_grad_scale = rs;
        AT_CHECK(at_decoder_loss(d, acts, labels, (float)scale, g, &ls2));
    }
    if (g) AT_CHECK(at_decoder_backward(d, acts, g));
done:
    free(row);
    free(rowt);
    free(rs);
    return st;
}

typedef struct {
    const at_pref_config *c;
    const at_pref_pairs *p;
    at_decoder *d;
    at_pref_stats *stats;
} eval_ctx;

static at_status eval_batch(void *vctx, const size_t *idx, size_t n, at_decoder_acts *acts, const at_batch *b,
                            const at_batch_tensors *t)
{
    (void)b;
    eval_ctx *e = vctx;
    return at_pref_forward_backward(e->c, e->p, idx, n, e->d, acts, t->ids, t->pos, t->labels, 0.0f, 0, 1, 1, 1,
                                    NULL, e->stats);
}

at_status at_pref_evaluate(const at_pref_config *c, const at_pref_pairs *p, at_decoder *d, int batch_pairs,
                           int32_t pad, at_pref_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    eval_ctx e = {c, p, d, stats};
    return at_pref_each_batch(d, p, batch_pairs, pad, eval_batch, &e);
}

/* ---- the objective (train/objective.h): dpo, cpo, simpo, orpo ---- */

static at_status obj_prepare(at_objective *o, const at_obj_data_env *env, const at_sample_list *train,
                             const at_sample_list *val)
{
    at_pref_pairs *pp = calloc(2, sizeof *pp); /* [0] train, [1] val */
    if (!pp) return at_error(AT_ERR_NOMEM, "out of memory");
    o->impl = pp;
    AT_TRY(at_pref_pairs_encode(train, env->enc, env->strict, "train", &pp[0]));
    if (val->n) AT_TRY(at_pref_pairs_encode(val, env->enc, env->strict, "eval", &pp[1]));
    if (pp[0].n == 0) return at_error(AT_ERR_INVALID, "no preference pair left after encoding (see the warnings above)");
    /* the batch plan runs over pairs, by the longer side of each */
    o->n_train = pp[0].n;
    o->train_len = pp[0].len;
    o->n_val = pp[1].n;
    o->val_len = pp[1].len;
    return AT_OK;
}

static at_status obj_reference(at_objective *o, at_decoder *ref, int batch_items, int32_t pad)
{
    at_pref_pairs *pp = o->impl;
    AT_TRY(at_pref_reference(ref, &pp[0], batch_items, pad));
    if (pp[1].n) AT_TRY(at_pref_reference(ref, &pp[1], batch_items, pad));
    return AT_OK;
}

/* counts[0]: the batch's pairs (the loss is their mean over the step);
 * counts[1]: their chosen replies' targets (the NLL term's token mean) */
static at_status obj_build(const at_objective *o, const at_batch_plan *plan, size_t b, int32_t pad, at_batch *out,
                           double *counts)
{
    const at_pref_pairs *pp = o->impl;
    size_t n = plan->batch_start[b + 1] - plan->batch_start[b];
    const size_t *pairs = at_batch_plan_items(plan, b, 0);
    AT_TRY(at_pref_batch_build(&pp[0], pairs, n, pad, out));
    counts[0] = (double)n;
    counts[1] = 0;
    for (size_t i = 0; i < n; i++) counts[1] += (double)pp[0].n_c[pairs[i]];
    return AT_OK;
}

static at_status obj_forward_backward(at_objective *o, at_decoder *d, at_decoder_acts *acts, const at_obj_micro *m,
                                      at_decoder_grads *g, double *stats)
{
    const at_pref_pairs *pp = o->impl;
    const size_t *pairs = at_batch_plan_items(m->plan, m->b, m->u0);
    return at_pref_forward_backward_opts(o->pref, &pp[0], pairs, m->u1 - m->u0, d, acts, m->t->ids, m->t->pos,
                                         m->t->labels, &m->fwd, m->step_counts[0], m->step_counts[1], m->scale, g,
                                         (at_pref_stats *)stats);
}

static double obj_loss(const at_objective *o, const double *stats, const double *counts)
{
    (void)counts;
    return at_pref_stats_loss(o->pref, (const at_pref_stats *)stats);
}

static void obj_log(const at_objective *o, const double *stats, cJSON *line)
{
    at_pref_stats_log(o->pref, (const at_pref_stats *)stats, line);
}

static at_status obj_evaluate(at_objective *o, const at_obj_eval_env *env, double *loss)
{
    at_pref_pairs *pp = o->impl;
    at_pref_stats s;
    at_decoder_acts_free(*env->acts); /* the evaluation makes its own */
    *env->acts = NULL;
    AT_TRY(at_pref_evaluate(o->pref, &pp[1], env->d, (int)env->batch.batch_size, env->pad, &s));
    *loss = at_pref_stats_loss(o->pref, &s);
    return AT_OK;
}

static int obj_needs_reference(const at_objective *o) { return at_pref_needs_reference(o->pref); }

static void obj_free(at_objective *o)
{
    at_pref_pairs *pp = o->impl;
    if (!pp) return;
    at_pref_pairs_free(&pp[0]);
    at_pref_pairs_free(&pp[1]);
    free(pp);
}

const at_objective_ops at_objective_preference = {
    .name = "preference", .rows_per_item = 2, .n_counts = 2, .n_stats = AT_PREF_STATS_N, .packs = 0,
    .plain_text = 0, .prepare = obj_prepare, .needs_reference = obj_needs_reference,
    .reference = obj_reference, .build = obj_build,
    .forward_backward = obj_forward_backward, .loss = obj_loss, .log = obj_log, .evaluate = obj_evaluate,
    .free = obj_free,
};
