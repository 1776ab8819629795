/* Reward models (`anytune rlhf --rlhf_type rm`), as TRL's RewardTrainer
 * trains transformers' *ForSequenceClassification with num_labels 1.
 *
 * The model is the decoder with a score head instead of the LM head:
 * score = Linear(hidden, 1, bias=False) on the final-normed hidden states,
 * the reward of a sequence read at its last token (transformers: the last
 * token that is not the pad id; the same unless a sample ends in the pad
 * token). The head is trained whole (PEFT's modules_to_save with LoRA),
 * initialized N(0, 0.02²) as transformers' initializer_range. On preference
 * pairs (the DPO datasets) with rewards r_c, r_r and s = r_c + r_r:
 *   L = −log σ(r_c − r_r) + coef · s²     (coef: --center_rewards_coefficient, 0: off)
 *   dL/dr_c = −σ(r_r − r_c) + 2·coef·s,   dL/dr_r = σ(r_r − r_c) + 2·coef·s
 * the step's loss the mean over its pairs (TRL: each micro-batch's mean).
 * Backward: dL/d h_b = dL/dr_b · w at row b's last token (0 elsewhere), then
 * the decoder's backward (at_decoder_set_d_final); dL/dw = Σ_b dL/dr_b · h_b.
 * Logged as TRL: accuracy (r_c > r_r), margin (mean r_c − r_r), mean_reward.
 * A checkpoint holds the head as score.safetensors ("score.weight") beside
 * the adapter (PEFT would put it in adapter_model.safetensors). */
#ifndef AT_TRAIN_REWARD_H
#define AT_TRAIN_REWARD_H

#include "train/preference.h"

typedef struct {
    double pairs, loss;         /* Σ L */
    double correct, margin;     /* Σ [r_c > r_r], Σ (r_c − r_r) */
    double rewards;             /* Σ (r_c + r_r) */
} at_rm_stats;
#define AT_RM_STATS_N 5

/* One pair's loss and derivatives (see above). */
void at_rm_pair(double coef, double r_c, double r_r, double *loss, double *d_c, double *d_r);

/* Pairs idx[0..n) of p laid out by at_pref_batch_build and uploaded as
 * ids/pos [2n, T] (lengths: the rows' token counts, host): forward with fwd,
 * each row's reward score · h(last token) into rewards[2n] (may be NULL),
 * the loss terms into *stats, and with g the gradients of
 * scale · Σ L / step_pairs added to g and to score_grad (f32 [1, hidden]
 * like score). g NULL: evaluation. */
at_status at_rm_forward_backward(const at_pref_config *c, size_t n, at_decoder *d, at_decoder_acts *acts,
                                 const at_tensor *ids, const at_tensor *pos, const int32_t *lengths,
                                 const at_fwd_opts *fwd, const at_tensor *score, at_tensor *score_grad,
                                 double step_pairs, double scale, at_decoder_grads *g, double *rewards,
                                 at_rm_stats *stats);

/* After a forward over acts' B rows (row b's tokens: lengths[b], right-padded):
 * rewards[b] = w · h_b, h_b the final-normed hidden state of row b's last
 * token, copied into h[B·hidden] (host scratch the caller gives); w: the
 * score head on the host [hidden]. */
at_status at_rm_read_rewards(const at_decoder_acts *acts, const int32_t *lengths, const float *w, float *h,
                             double *rewards);

double at_rm_stats_loss(const at_rm_stats *s); /* Σ L / pairs (NaN without any) */
void at_rm_stats_log(const at_rm_stats *s, cJSON *line);

#endif
