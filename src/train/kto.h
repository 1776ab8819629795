/* KTO (`anytune rlhf --rlhf_type kto`), as TRL's KTOTrainer computes it
 * (Ethayarajh et al. 2024, eqn. 7; what ms-swift's `swift rlhf --rlhf_type
 * kto` runs).
 *
 * Each record is one conversation whose last reply is desirable or not
 * (`"label": true|false`, or LLaMA-Factory's `kto_tag`). π is the log-prob
 * sum of the reply under the policy, r the same under the frozen reference
 * (computed once before training, as DPO's: the policy's base or
 * --ref_model), z = π − r. The KL term is estimated from mismatched pairs:
 * example i's prompt with the reply of example i−1 of its chunk of
 * per_device_train_batch_size consecutive examples (the chunk's first takes
 * its last), as TRL's get_kl_dataset builds them once before training:
 *   kl = max(0, mean over the forward's examples of (π_KL − r_KL)),
 * detached (no gradient flows through it). With β (--beta, 0.1) and the
 * weights w_d (--desirable_weight), w_u (--undesirable_weight):
 *   desirable:    L = w_d · (1 − σ(β(z − kl)))      dL/dz = −w_d·β·σ(u)·σ(−u), u = β(z − kl)
 *   undesirable:  L = w_u · (1 − σ(β(kl − z)))      dL/dz =  w_u·β·σ(v)·σ(−v), v = β(kl − z)
 * The step's loss is the mean of L over its examples (TRL: each
 * micro-batch's mean, averaged over the accumulation steps: the same for
 * micro-batches of equal size). kl is the forward's (TRL: each micro-batch's;
 * a micro-batch cut in pieces after an out-of-memory error estimates it per
 * piece). The logged fields are TRL's: kl, rewards/chosen (mean β·z of the
 * desirable examples), rewards/rejected, rewards/margins, logps/chosen,
 * logps/rejected (means of π), pooled over the logging interval.
 *
 * Layout: an example is two rows, [x_i + y_i, x_i + y_KL(i)], interleaved
 * over the micro-batch like a preference pair's (train/preference.h), so the
 * pair machinery (batches, the reference pass) serves unchanged: chosen is
 * the example, rejected its KL row. */
#ifndef AT_TRAIN_KTO_H
#define AT_TRAIN_KTO_H

#include "train/preference.h"

/* One example's loss and dL/dz (see above). */
void at_kto_example(const at_pref_config *c, int desirable, double z, double kl, double *loss, double *d_z);

/* Encoded KTO examples: ex.chosen[i] the example (labels on its reply),
 * ex.rejected[i] its KL row (prompt_i + the mismatched reply), n_c / n_r
 * their targets, ref_c / ref_r their reference log-prob sums, len the longer
 * of the two; desirable[i] its label. */
typedef struct {
    at_pref_pairs ex;
    int *desirable;
} at_kto_examples;

/* Encodes the labeled conversations of list through enc (labels on the last
 * reply: make enc with last-turn-only masking) and builds the KL rows within
 * chunks of chunk consecutive examples (>= 2). A record without a label is
 * an error naming its file and line (skipped with a warning unless strict).
 * Free with at_kto_examples_free. */
at_status at_kto_encode(const at_sample_list *list, const at_encoder *enc, int strict, size_t chunk,
                        const char *what, at_kto_examples *out);
void at_kto_examples_free(at_kto_examples *k);
/* (Re)builds every KL row of k from its examples (ex.chosen): example i of a
 * chunk [c0, c1) of `chunk` consecutive examples gets its prompt (the tokens
 * before its first supervised one) followed by the reply of example i − 1
 * (c0 takes c1 − 1's) and what follows that reply, cut to max_length (0: no
 * limit); also n_r and len. */
at_status at_kto_kl_rows(at_kto_examples *k, size_t chunk, size_t max_length);

/* What a step (or logging interval) sums over its examples. */
typedef struct {
    double examples, loss;           /* Σ L */
    double n_des, n_und;             /* desirable and undesirable examples */
    double reward_c, reward_r;       /* Σ β·z over each kind */
    double logp_c, logp_r;           /* Σ π over each kind */
    double kl, kl_forwards;          /* Σ of each forward's kl, and the forwards */
} at_kto_stats;
#define AT_KTO_STATS_N 10

/* The examples idx[0..n) of k, laid out by at_pref_batch_build(&k->ex, ...)
 * and uploaded as ids/pos/labels [2n, T]: forward with fwd, kl from their KL
 * rows, loss terms into *stats and with g the gradients of
 * scale · Σ L / step_examples (the step's examples, every micro-batch and
 * rank) added to g. g NULL: evaluation. */
at_status at_kto_forward_backward(const at_pref_config *c, const at_kto_examples *k, const size_t *idx, size_t n,
                                  at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                                  const at_tensor *labels, const at_fwd_opts *fwd, double step_examples,
                                  double scale, at_decoder_grads *g, at_kto_stats *stats);

double at_kto_stats_loss(const at_kto_stats *s); /* Σ L / examples (NaN without any) */
void at_kto_stats_log(const at_kto_stats *s, cJSON *line);

#endif
