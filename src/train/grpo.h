/* GRPO (`anytune rlhf --rlhf_type grpo`), as TRL's GRPOTrainer computes it
 * (Shao et al. 2024, DeepSeekMath; what ms-swift's `swift rlhf --rlhf_type
 * grpo` runs), with DAPO's clip-higher, dynamic sampling and overlong
 * filter (Yu et al. 2025) and Dr. GRPO's loss (Liu et al. 2025).
 *
 * Each prompt is answered G times (--num_generations) by the current policy;
 * each completion i gets a reward R_i (train/grpo_reward.h: a weighted sum of
 * the reward functions). Within its group of G (TRL, scale_rewards):
 *   A_i = R_i − mean_group(R)                           (none)
 *   A_i = (R_i − mean_group(R)) / (std_group(R) + 1e-4)  (group, the default)
 *   A_i = (R_i − mean_group(R)) / (std_batch(R) + 1e-4)  (batch: the std over the generation batch)
 * std is torch's unbiased one (n − 1). Per completion token t with the
 * policy's log-prob π_t, the old policy's o_t (the one that generated: with
 * --num_iterations μ = 1 it is π_t itself, detached), the reference's r_t:
 *   ρ_t = exp(π_t − o_t),  ρ̂_t = clamp(ρ_t, 1 − ε_low, 1 + ε_high)
 *   ℓ_t = −min(ρ_t·A, ρ̂_t·A) + β·(exp(r_t − π_t) − (r_t − π_t) − 1)     (k3 KL estimator)
 *   dℓ_t/dπ_t = −ρ_t·A·[unclipped] + β·(1 − exp(r_t − π_t))
 * where [unclipped] is 1 unless the min picks the clamped term outside the
 * clamp's range (torch.min splits a tie evenly: the same result). The loss
 * (--loss_type) over the step's completions i with |o_i| tokens:
 *   grpo:     L = (1/N) Σ_i (1/|o_i|) Σ_t ℓ_it      (N: completions)
 *   bnpo:     L = Σ_i Σ_t ℓ_it / Σ_i |o_i|
 *   dr_grpo:  L = Σ_i Σ_t ℓ_it / (N · max_completion_length)
 * taken over the whole optimizer step (every micro-batch and rank; TRL:
 * per micro-batch, averaged over the accumulation steps: the same when every
 * micro-batch has as many completions, and for bnpo as many tokens).
 * Logged as TRL: kl (mean k3 over the tokens), clip_ratio/low_mean
 * (ρ < 1 − ε_low with A < 0), clip_ratio/high_mean (ρ > 1 + ε_high with A >
 * 0), clip_ratio/region_mean (either), reward, reward_std (the mean of the
 * per-completion std), rewards/NAME/mean, frac_reward_zero_std,
 * completions/mean_length, completions/clipped_ratio. */
#ifndef AT_TRAIN_GRPO_H
#define AT_TRAIN_GRPO_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "model/decoder.h"

typedef enum { AT_GRPO_LOSS_GRPO = 0, AT_GRPO_LOSS_BNPO, AT_GRPO_LOSS_DR_GRPO } at_grpo_loss_type;
typedef enum { AT_GRPO_SCALE_GROUP = 0, AT_GRPO_SCALE_BATCH, AT_GRPO_SCALE_NONE } at_grpo_scale;

#define AT_GRPO_MAX_REWARDS 8

/* --rlhf_type grpo's options (ms-swift's names and defaults). */
typedef struct at_grpo_config {
    int num_generations;        /* G (8) */
    int max_completion_length;  /* tokens (512) */
    double temperature;         /* 0.9 (ms-swift) */
    double top_p;               /* 1: off */
    int top_k;                  /* 0 (-1 in ms-swift): off */
    const char *stop_words[8];  /* --stop_words: more stop strings (the text before them is the completion) */
    int n_stop_words;
    double epsilon;             /* ε_low (0.2) */
    double epsilon_high;        /* ε_high (0: = epsilon) */
    int num_iterations;         /* μ (1): updates per generated batch, with old log-probs kept */
    at_grpo_loss_type loss_type;
    at_grpo_scale scale_rewards;
    int dynamic_sample;         /* resample groups whose rewards are all equal (DAPO) */
    int max_resample_times;     /* (3) */
    int overlong_filter;        /* completions cut by max_completion_length get no loss (DAPO) */
    /* rewards (train/grpo_reward.h) */
    const char *reward_funcs[AT_GRPO_MAX_REWARDS]; /* built-in names */
    int n_reward_funcs;
    double reward_weights[AT_GRPO_MAX_REWARDS + 2]; /* per function, then the model's, then the command's */
    int n_reward_weights;       /* 0: all 1 */
    const char *reward_model;   /* --reward_model DIR (NULL: none): a reward model (train/reward_model.h) */
    const char *reward_model_adapter; /* an rm LoRA checkpoint scored over reward_model (its base), or NULL */
    const char *reward_command; /* --reward_command CMD (NULL: none) */
    double reward_timeout;      /* seconds the command may take per batch (60) */
    /* cosine and soft_overlong (ms-swift's) */
    double cosine_min_len_value_wrong, cosine_max_len_value_wrong, cosine_min_len_value_correct,
        cosine_max_len_value_correct;
    int cosine_max_len;          /* 0: max_completion_length */
    double repetition_n_grams, repetition_max_penalty;
    int soft_max_length, soft_cache_length; /* 0: max_completion_length; 0: none */
    int log_completions;        /* RUN/completions.jsonl */
} at_grpo_config;

/* ms-swift's defaults, as the option table (train/train_options.c) holds them. */
void at_grpo_config_init(at_grpo_config *c);
/* AT_ERR_INVALID naming the option when a value is out of range. */
at_status at_grpo_config_check(const at_grpo_config *c);
/* "grpo", "bnpo", "dr_grpo" and back (AT_ERR_INVALID naming the choices). */
const char *at_grpo_loss_type_name(at_grpo_loss_type t);
at_status at_grpo_loss_type_parse(const char *name, at_grpo_loss_type *out);
at_status at_grpo_scale_parse(const char *name, at_grpo_scale *out);

/* The advantages of n_groups groups of g consecutive rewards (see above):
 * adv[n_groups·g]; std_out[n_groups·g] (may be NULL) each completion's std
 * (the group's or the batch's), before the 1e-4. */
void at_grpo_advantages(const double *rewards, size_t n_groups, int g, at_grpo_scale scale, double *adv,
                        double *std_out);

/* What the loss sums over a step (or logging interval): stats are summed as
 * an array of doubles. */
typedef struct {
    double completions, tokens;       /* completions and their tokens in the loss */
    double loss;                      /* Σ of the terms of L (already normalized by the step's counts) */
    double kl, low_clip, high_clip, region_clip; /* Σ over tokens */
    double reward, reward_std, zero_std; /* Σ over completions: R, its std, [std == 0] */
    double length, clipped;           /* Σ completion lengths (every completion), Σ [cut by the budget] */
    double generated;                 /* completions generated (the reward fields' denominator) */
    double func[AT_GRPO_MAX_REWARDS + 2]; /* Σ of each reward function's value */
} at_grpo_stats;
#define AT_GRPO_STATS_N 23

/* The step's normalizers of L: counts[0] completions, counts[1] tokens. */

/* Loss terms of one completion of n tokens: logp[n] the policy's, old[n]
 * the old policy's (NULL: logp itself), ref[n] the reference's (NULL when
 * β = 0), advantage adv; the step's completions and tokens (every
 * micro-batch and rank). d_logp[n] gets dL/dπ_t, the loss term and the token
 * statistics are added to *s. */
void at_grpo_completion(const at_grpo_config *c, double beta, const double *logp, const double *old,
                        const double *ref, size_t n, double adv, double step_completions, double step_tokens,
                        double *d_logp, at_grpo_stats *s);

/* Per-token arrays [B·T] of a batch of B rows hold at (b, t) the value for
 * the target position t predicts (the token at t + 1), as at_decoder_loss's
 * token_loss. */

/* One micro-batch of completions: rows [B, T] (prompt + completion, labels
 * on the completion, right-padded) uploaded as ids/pos/labels, host_labels
 * the same labels on the host, acts of that shape (AT_ACTS_TRAIN when g is
 * given). adv[B] the rows' advantages; old, ref (may be NULL: see
 * at_grpo_completion) per-token log-probs; in_loss[B] (NULL: all) 0 for a
 * row the overlong filter takes out of the loss. Forward with fwd, loss
 * terms and token statistics into *s, and with g the gradients of
 * scale · L added to g (step_completions, step_tokens: the step's counts).
 * logp_out (may be NULL) gets the policy's per-token log-probs. */
at_status at_grpo_forward_backward(const at_grpo_config *c, double beta, at_decoder *d, at_decoder_acts *acts,
                                   const at_tensor *ids, const at_tensor *pos, const at_tensor *labels,
                                   const int32_t *host_labels, const at_fwd_opts *fwd, const double *adv,
                                   const float *old, const float *ref, const uint8_t *in_loss,
                                   double step_completions, double step_tokens, double scale, at_decoder_grads *g,
                                   float *logp_out, at_grpo_stats *s);

/* Per-token log-probs [B·T] of the uploaded rows under d as it is (no
 * dropout, no gradients), with acts of loss-only activations of that shape
 * (AT_ACTS_LOSS); 0 where no target. The old policy's and the reference's. */
at_status at_grpo_token_logps(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                              const at_tensor *labels, float *out);

double at_grpo_stats_loss(const at_grpo_stats *s); /* NaN without completions */
/* TRL's fields (see above); names[n_names] the reward functions' names;
 * kl only with_kl (β ≠ 0, as TRL). */
void at_grpo_stats_log(const at_grpo_stats *s, const char *const *names, int n_names, int with_kl, cJSON *line);

#endif
