#include "train/grpo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train/train_options.h"

_Static_assert(sizeof(at_grpo_stats) == AT_GRPO_STATS_N * sizeof(double), "at_grpo_stats is summed as an array");

void at_grpo_config_init(at_grpo_config *c)
{
    memset(c, 0, sizeof *c);
    at_grpo_config_store(NULL, c); /* the option table's defaults (train/train_options.c) */
}

at_status at_grpo_config_check(const at_grpo_config *c)
{
    if (c->num_generations < 2)
        return at_error(AT_ERR_INVALID, "--num_generations %d: GRPO compares completions within a group, it needs "
                        "at least 2", c->num_generations);
    if (c->max_completion_length < 1)
        return at_error(AT_ERR_INVALID, "--max_completion_length %d must be at least 1", c->max_completion_length);
    if (!(c->temperature >= 0) || !(c->top_p > 0 && c->top_p <= 1) || c->top_k < 0)
        return at_error(AT_ERR_INVALID, "--temperature must be >= 0, --top_p in (0, 1], --top_k >= 0");
    if (!(c->epsilon >= 0 && c->epsilon < 1) || !(c->epsilon_high >= 0 && c->epsilon_high < 1e6))
        return at_error(AT_ERR_INVALID, "--epsilon must be in [0, 1) and --epsilon_high >= 0");
    if (c->num_iterations < 1) return at_error(AT_ERR_INVALID, "--num_iterations must be at least 1");
    if (c->n_reward_weights && c->n_reward_weights != c->n_reward_funcs + !!c->reward_model + !!c->reward_command)
        return at_error(AT_ERR_INVALID, "--reward_weights has %d values for %d reward functions (--reward_funcs, "
                        "then --reward_model, then --reward_command)", c->n_reward_weights,
                        c->n_reward_funcs + !!c->reward_model + !!c->reward_command);
    if (!c->n_reward_funcs && !c->reward_model && !c->reward_command)
        return at_error(AT_ERR_INVALID, "grpo needs a reward: --reward_funcs accuracy|format|cosine|repetition|"
                        "soft_overlong, --reward_model DIR or --reward_command CMD");
    return AT_OK;
}

static const char *const LOSS_NAMES[] = {"grpo", "bnpo", "dr_grpo"};
static const char *const SCALE_NAMES[] = {"group", "batch", "none"};

const char *at_grpo_loss_type_name(at_grpo_loss_type t) { return LOSS_NAMES[t]; }

at_status at_grpo_loss_type_parse(const char *name, at_grpo_loss_type *out)
{
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, LOSS_NAMES[i])) {
            *out = (at_grpo_loss_type)i;
            return AT_OK;
        }
    return at_error(AT_ERR_INVALID, "--loss_type %s: grpo takes grpo, bnpo or dr_grpo", name ? name : "(none)");
}

at_status at_grpo_scale_parse(const char *name, at_grpo_scale *out)
{
    /* TRL's booleans: true is group, false none */
    if (name && !strcmp(name, "true")) name = "group";
    if (name && !strcmp(name, "false")) name = "none";
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, SCALE_NAMES[i])) {
            *out = (at_grpo_scale)i;
            return AT_OK;
        }
    return at_error(AT_ERR_INVALID, "--scale_rewards %s: group, batch or none", name ? name : "(none)");
}

/* torch's unbiased std of x[0..n) (0 for n < 2) */
static double std_unbiased(const double *x, size_t n, double *mean_out)
{
    double m = 0, v = 0;
    for (size_t i = 0; i < n; i++) m += x[i];
    m = n ? m / (double)n : 0;
    for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    if (mean_out) *mean_out = m;
    return n > 1 ? sqrt(v / (double)(n - 1)) : 0;
}

void at_grpo_advantages(const double *rewards, size_t n_groups, int g, at_grpo_scale scale, double *adv,
                        double *std_out)
{
    double batch_std = std_unbiased(rewards, n_groups * (size_t)g, NULL);
    for (size_t k = 0; k < n_groups; k++) {
        const double *r = rewards + k * (size_t)g;
        double mean, s = std_unbiased(r, (size_t)g, &mean);
        if (scale == AT_GRPO_SCALE_BATCH) s = batch_std;
        for (int i = 0; i < g; i++) {
            double a = r[i] - mean;
            if (scale != AT_GRPO_SCALE_NONE) a /= s + 1e-4;
            adv[k * (size_t)g + (size_t)i] = a;
            if (std_out) std_out[k * (size_t)g + (size_t)i] = s;
        }
    }
}

void at_grpo_completion(const at_grpo_config *c, double beta, const double *logp, const double *old,
                        const double *ref, size_t n, double adv, double step_completions, double step_tokens,
                        double *d_logp, at_grpo_stats *s)
{
    double lo = 1 - c->epsilon, hi = 1 + (c->epsilon_high > 0 ? c->epsilon_high : c->epsilon);
    /* each token's weight in L (see grpo.h) */
    double w;
    if (c->loss_type == AT_GRPO_LOSS_GRPO) w = n ? 1.0 / ((double)n * step_completions) : 0;
    else if (c->loss_type == AT_GRPO_LOSS_BNPO) w = step_tokens > 0 ? 1.0 / step_tokens : 0;
    else w = 1.0 / (step_completions * (double)c->max_completion_length);
    double sum = 0;
    for (size_t t = 0; t < n; t++) {
        double rho = old ? exp(logp[t] - old[t]) : 1.0;
        double clipped = rho < lo ? lo : rho > hi ? hi : rho;
        double u = rho * adv, v = clipped * adv;
        /* −min(u, v): the clamped term wins only outside the clamp's range, where it has no gradient */
        double l = -(u < v ? u : v), d = u <= v ? -rho * adv : 0;
        if (beta != 0 && ref) {
            double x = ref[t] - logp[t], kl = exp(x) - x - 1;
            l += beta * kl;
            d += beta * (1 - exp(x));
            s->kl += kl;
        }
        sum += l;
        d_logp[t] = w * d;
        int low = rho < lo && adv < 0, high = rho > hi && adv > 0;
        s->low_clip += low;
        s->high_clip += high;
        s->region_clip += low || high;
    }
    s->loss += w * sum;
    s->completions += 1;
    s->tokens += (double)n;
}

double at_grpo_stats_loss(const at_grpo_stats *s) { return s->completions > 0 ? s->loss : NAN; }

void at_grpo_stats_log(const at_grpo_stats *s, const char *const *names, int n_names, int with_kl, cJSON *line)
{
    if (s->generated > 0) {
        double g = s->generated;
        cJSON_AddNumberToObject(line, "reward", s->reward / g);
        cJSON_AddNumberToObject(line, "reward_std", s->reward_std / g);
        cJSON_AddNumberToObject(line, "frac_reward_zero_std", s->zero_std / g);
        for (int i = 0; i < n_names && i < AT_GRPO_MAX_REWARDS + 2; i++) {
            char key[160];
            snprintf(key, sizeof key, "rewards/%s/mean", names[i]);
            cJSON_AddNumberToObject(line, key, s->func[i] / g);
        }
        cJSON_AddNumberToObject(line, "completions/mean_length", s->length / g);
        cJSON_AddNumberToObject(line, "completions/clipped_ratio", s->clipped / g);
    }
    if (s->tokens > 0) {
        if (with_kl) cJSON_AddNumberToObject(line, "kl", s->kl / s->tokens);
        cJSON_AddNumberToObject(line, "clip_ratio/low_mean", s->low_clip / s->tokens);
        cJSON_AddNumberToObject(line, "clip_ratio/high_mean", s->high_clip / s->tokens);
        cJSON_AddNumberToObject(line, "clip_ratio/region_mean", s->region_clip / s->tokens);
    }
}

/* ---- one micro-batch ---- */

at_status at_grpo_token_logps(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                              const at_tensor *labels, float *out)
{
    at_loss_stats ls = {0};
    ls.token_loss = out;
    AT_TRY(at_decoder_forward(d, acts, ids, pos, NULL));
    AT_TRY(at_decoder_loss(d, acts, labels, 1.0f, NULL, &ls));
    size_t n = (size_t)acts->B * (size_t)acts->T;
    for (size_t i = 0; i < n; i++) out[i] = -out[i];
    return AT_OK;
}

/* Whether position t of row b predicts a completion token. */
static int is_target(const int32_t *lab, int T, int b, int t)
{
    return t + 1 < T && lab[(size_t)b * T + t + 1] >= 0;
}

at_status at_grpo_forward_backward(const at_grpo_config *c, double beta, at_decoder *d, at_decoder_acts *acts,
                                   const at_tensor *ids, const at_tensor *pos, const at_tensor *labels,
                                   const int32_t *host_labels, const at_fwd_opts *fwd, const double *adv,
                                   const float *old, const float *ref, const uint8_t *in_loss,
                                   double step_completions, double step_tokens, double scale, at_decoder_grads *g,
                                   float *logp_out, at_grpo_stats *s)
{
    int B = acts->B, T = acts->T;
    size_t N = (size_t)B * (size_t)T;
    float *tl = calloc(N, sizeof *tl), *w = calloc(N, sizeof *w);
    double *lp = malloc((size_t)T * sizeof *lp), *op = malloc((size_t)T * sizeof *op),
           *rp = malloc((size_t)T * sizeof *rp), *dl = malloc((size_t)T * sizeof *dl);
    at_status st = AT_OK;
    if (!tl || !w || !lp || !op || !rp || !dl) {
        st = at_error(AT_ERR_NOMEM, "grpo step: out of memory");
        goto done;
    }
    if (g) AT_CHECK(at_decoder_forward_train_opts(d, acts, ids, pos, NULL, fwd));
    else AT_CHECK(at_decoder_forward(d, acts, ids, pos, NULL));
    /* the weights depend on the log-probs only through the ratio to the old
     * policy and the KL; without either they are known before the loss pass,
     * and one pass over the vocabulary serves */
    int kl = beta != 0 && ref;
    int need_logp = old || kl || logp_out || !g;
    at_loss_stats ls = {0};
    if (need_logp) {
        ls.token_loss = tl;
        AT_CHECK(at_decoder_loss(d, acts, labels, 1.0f, NULL, &ls));
    }
    for (int b = 0; b < B; b++) {
        size_t n = 0;
        for (int t = 0; t < T; t++) {
            if (!is_target(host_labels, T, b, t)) continue;
            size_t i = (size_t)b * T + t;
            lp[n] = -(double)tl[i];
            if (old) op[n] = old[i];
            if (kl) rp[n] = ref[i];
            if (logp_out) logp_out[i] = -tl[i];
            n++;
        }
        if (in_loss && !in_loss[b]) n = 0; /* the overlong filter: no loss, still a completion of the step */
        at_grpo_completion(c, beta, lp, old ? op : NULL, kl ? rp : NULL, n, adv[b], step_completions, step_tokens,
                           dl, s);
        /* the loss pass differentiates Σ w_t · (−π_t): w_t = −dL/dπ_t */
        for (int t = 0, k = 0; t < T && (size_t)k < n; t++)
            if (is_target(host_labels, T, b, t)) w[(size_t)b * T + t] = (float)-dl[k++];
    }
    if (g) {
        at_loss_stats l2 = {0};
        l2.token_grad_scale = w;
        AT_CHECK(at_decoder_loss(d, acts, labels, (float)scale, g, &l2));
        AT_CHECK(at_decoder_backward(d, acts, g));
    }
done:
    free(tl);
    free(w);
    free(lp);
    free(op);
    free(rp);
    free(dl);
    return st;
}
