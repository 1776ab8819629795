/* Preference objectives (`anytune rlhf --rlhf_type dpo|simpo|cpo|orpo`), as
 * TRL's DPOTrainer, CPOTrainer and ORPOTrainer compute them (what ms-swift's
 * `swift rlhf` runs; its rlhf_type simpo is TRL's CPO with loss_type simpo).
 *
 * Each record is a preference pair: a prompt, a chosen and a rejected reply.
 * π is log p(reply tokens | prompt) under the policy being trained: the sum
 * over the reply's tokens, or their mean ("averaged": ipo, simpo and orpo, as
 * TRL's average_log_prob). r is the same under a frozen reference model (DPO
 * only). With h = (π_c − π_r) − (r_c − r_r) (r = 0 without a reference):
 *   dpo   sigmoid (default): L = −(1−ls)·log σ(βh) − ls·log σ(−βh)
 *         ipo:               L = (h − 1/(2β))²          (averaged)
 *         hinge:             L = max(0, 1 − βh)
 *   cpo   the same three without a reference (TRL's CPO), and
 *         simpo:             L = −(1−ls)·log σ(βh − γ) − ls·log σ(γ − βh)   (averaged)
 *   simpo = cpo with loss_type simpo and β = 2 (ms-swift's defaults)
 *   orpo  with ℓ(a) = log(odds) = a − log(1 − e^a) of a mean log-prob a:
 *                            L = −β·log σ(ℓ(π_c) − ℓ(π_r))   (averaged)
 * The step's loss is the mean of L over its pairs plus α × the NLL of the
 * chosen replies (a mean over their tokens, the whole step's): α is
 * rpo_alpha for dpo (RPO), cpo_alpha for cpo and simpo, 1 for orpo (its SFT
 * term). The reported rewards are β(π_c − r_c) and β(π_r − r_r).
 *
 * DPO's reference log-probs are computed once, before training, in one pass
 * without dropout (TRL's precompute_ref_log_probs): by the policy's own base
 * (LoRA: the model with the adapter off; full fine-tuning: the initial
 * weights) or by another model (--ref_model). They live in host memory and are
 * recomputed on resume (deterministic, so a resumed run continues exactly).
 * The other objectives are reference-free: no reference pass at all.
 *
 * A micro-batch holds the chosen and rejected rows of its pairs interleaved
 * [c0, r0, c1, r1, ...], right-padded, so a piece of consecutive pairs is a
 * piece of consecutive rows. One forward serves both: a first loss pass
 * without gradients gives each row's log-prob sum and target count, then the
 * pair's dL/dπ (divided by the reply's token count when averaged, plus the NLL
 * term on the chosen row) becomes the gradient scale of its rows in a second
 * pass (per-row scales, model/decoder.h) and one backward follows. */
#ifndef AT_TRAIN_PREFERENCE_H
#define AT_TRAIN_PREFERENCE_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "model/decoder.h"
#include "train/batch_upload.h"

typedef enum { AT_PREF_DPO = 0, AT_PREF_CPO, AT_PREF_ORPO, AT_PREF_KTO, AT_PREF_RM, AT_PREF_GRPO } at_pref_objective;
typedef enum { AT_PREF_SIGMOID = 0, AT_PREF_IPO, AT_PREF_HINGE, AT_PREF_SIMPO } at_pref_loss_type;

/* "sigmoid", "ipo", "hinge", "simpo". */
const char *at_pref_loss_type_name(at_pref_loss_type t);
/* Parses one of those names; AT_ERR_INVALID naming the choices otherwise. */
at_status at_pref_loss_type_parse(const char *name, at_pref_loss_type *out);

/* A reply's mean log-prob above this counts as this in ORPO's odds (see
 * at_pref_pair): every token predicted with probability 1 within f32's
 * rounding would make log(1 − e^a) infinite. */
#define AT_PREF_ORPO_MAX_LOGP (-1e-7)

typedef struct {
    at_pref_objective objective;
    const char *name;           /* the --rlhf_type it came from: "dpo", "simpo", "cpo", "orpo" */
    double beta;                /* --beta (2 for simpo, 0.1 otherwise) */
    at_pref_loss_type loss_type;/* --loss_type (sigmoid; simpo for simpo; orpo: unused, sigmoid) */
    double label_smoothing;     /* --label_smoothing (0; sigmoid and simpo only) */
    double rpo_alpha;           /* --rpo_alpha (dpo; 0: off, TRL's and ms-swift's None) */
    double cpo_alpha;           /* --cpo_alpha (cpo and simpo: 1, ms-swift's; 0 otherwise) */
    double simpo_gamma;         /* --simpo_gamma (loss_type simpo: 1, ms-swift's; 0 otherwise) */
    const char *ref_model;      /* --ref_model (dpo and kto); NULL: the policy's base */
    double desirable_weight;    /* kto: --desirable_weight (1), the weight of desirable examples' losses */
    double undesirable_weight;  /* kto: --undesirable_weight (1) */
    double center_rewards_coefficient; /* rm: --center_rewards_coefficient (0: off; train/reward.h) */
    const struct at_grpo_config *grpo; /* grpo's own options (train/grpo.h; borrowed); NULL otherwise */
} at_pref_config;

/* The defaults of --rlhf_type name, as ms-swift's: dpo (β 0.1, sigmoid),
 * simpo (cpo with loss_type simpo, β 2, γ 1, cpo_alpha 1), cpo (β 0.1,
 * sigmoid, cpo_alpha 1), orpo (β 0.1), kto (β 0.1, weights 1; train/kto.h),
 * rm (train/reward.h), grpo (β 0.04; its options in c->grpo, train/grpo.h, set by the
 * caller). Another of ms-swift's types (ppo, gkd) is AT_ERR_UNSUPPORTED,
 * anything else AT_ERR_INVALID; both messages list what this build has. */
at_status at_pref_config_init(at_pref_config *c, const char *name);
/* AT_ERR_INVALID naming the option when a value is out of range or does not
 * apply to the objective (--ref_model with a reference-free one, ...). */
at_status at_pref_config_check(const at_pref_config *c);
/* Whether the objective compares with a reference model (dpo, kto; grpo with beta > 0). */
int at_pref_needs_reference(const at_pref_config *c);
/* Whether π is the mean log-prob over the reply's tokens (else the sum). */
int at_pref_averaged(const at_pref_config *c);
/* α of the chosen replies' NLL term: rpo_alpha, cpo_alpha or 1 (orpo). */
double at_pref_nll_alpha(const at_pref_config *c);

/* One pair's loss from its log-probs (sums or means, at_pref_averaged) and
 * its derivatives dL/dπ_c, dL/dπ_r; ref_c, ref_r are ignored without a
 * reference. For orpo also ℓ(π_c) − ℓ(π_r) and its log σ (TRL's metrics);
 * 0 otherwise. Finite for any finite input. */
typedef struct {
    double loss, d_chosen, d_rejected;
    double log_odds, log_odds_ratio;
} at_pref_pair_loss;
void at_pref_pair(const at_pref_config *c, double pi_c, double pi_r, double ref_c, double ref_r,
                  at_pref_pair_loss *out);

/* Encoded preference pairs and their reference log-probs. */
typedef struct {
    size_t n;
    at_encoded *chosen, *rejected; /* [n] prompt + reply, labels on the reply only */
    size_t *len;                   /* [n] the longer of the two (batch planning) */
    int64_t *n_c, *n_r;            /* [n] supervised targets of each reply */
    double *ref_c, *ref_r;         /* [n] reference log-prob sums (at_pref_reference; 0 without one) */
} at_pref_pairs;

/* Encodes the preference samples of list through enc (labels on the final
 * reply only: make enc with last-turn-only masking). --max_length applies to
 * prompt + reply with enc's truncation: a pair is dropped when either side is
 * (delete), else both sides are cut alike. A sample that is not a pair is an
 * error naming its file and line; with strict the first failure stops, else
 * failures are skipped with a warning (the first few). what: "train"/"eval"
 * for the summary line. Free with at_pref_pairs_free. */
at_status at_pref_pairs_encode(const at_sample_list *list, const at_encoder *enc, int strict, const char *what,
                               at_pref_pairs *out);
void at_pref_pairs_free(at_pref_pairs *p);

/* The micro-batch of pairs idx[0..n): rows [c, r] per pair, right-padded with
 * pad to the longest row; positions 0.., no segments. Free with at_batch_free. */
at_status at_pref_batch_build(const at_pref_pairs *p, const size_t *idx, size_t n, int32_t pad, at_batch *out);

/* Fills p->ref_c / ref_r with the log-prob sums of every reply under d as it
 * is now (its adapter, if any, applies: remove it first for the base), no
 * dropout, batch_pairs pairs at a time. Holds loss-only activations of one
 * batch of [2·batch_pairs, longest row] with one layer's activations shared
 * by all (AT_ACTS_LOSS | AT_ACTS_CHECKPOINT: the layer inputs are kept, no
 * layer's intermediates), freed before it returns. */
at_status at_pref_reference(at_decoder *d, at_pref_pairs *p, int batch_pairs, int32_t pad);

/* Calls fn for every batch of batch_pairs consecutive pairs of p (the last
 * may have fewer), laid out by at_pref_batch_build with pad and uploaded,
 * with loss-only activations of its shape that keep one layer's
 * intermediates (AT_ACTS_LOSS | AT_ACTS_CHECKPOINT: no gradients follow);
 * stops at fn's first error. The passes without gradients (reference,
 * evaluation) of the objectives on pairs (and pair-like rows: kto, rm). */
typedef at_status (*at_pref_batch_fn)(void *ctx, const size_t *idx, size_t n, at_decoder_acts *acts,
                                      const at_batch *b, const at_batch_tensors *t);
at_status at_pref_each_batch(at_decoder *d, const at_pref_pairs *p, int batch_pairs, int32_t pad, at_pref_batch_fn fn,
                             void *ctx);

/* What a step (or a logging interval) sums over its pairs. */
typedef struct {
    double pairs;                  /* pairs counted */
    double loss;                   /* Σ pair loss L (without the NLL term) */
    double reward_c, reward_r;     /* Σ β(π_c − r_c), Σ β(π_r − r_r) */
    double correct;                /* Σ [reward_c > reward_r] */
    double logp_c, logp_r;         /* Σ π_c, Σ π_r (means when averaged) */
    double nll, nll_targets;       /* Σ −log p over the chosen targets, and their count */
    double log_odds, log_odds_ratio; /* orpo: Σ ℓ(π_c) − ℓ(π_r), Σ log σ of it */
} at_pref_stats;
#define AT_PREF_STATS_N 11 /* doubles in at_pref_stats (summed over ranks as an array) */

/* The step's loss: Σ L / pairs + α · nll / nll_targets (α: at_pref_nll_alpha). */
double at_pref_stats_loss(const at_pref_config *c, const at_pref_stats *s);
/* a += b */
void at_pref_stats_add(at_pref_stats *a, const at_pref_stats *b);
/* Adds TRL's metrics, means over s's pairs, to line: rewards/chosen,
 * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
 * logps/rejected; nll_loss when the objective has an NLL term (or dpo's
 * rpo_alpha); orpo's log_odds_ratio and log_odds_chosen. */
void at_pref_stats_log(const at_pref_config *c, const at_pref_stats *s, cJSON *line);

/* One micro-batch of pairs idx[0..n) built by at_pref_batch_build and uploaded
 * as ids/pos/labels [2n, T] (acts of that shape, AT_ACTS_TRAIN when g is
 * given): forward (LoRA dropout p with seed), log-probs, loss terms into
 * *stats, and with g the gradients of
 *     scale · (Σ_pairs L / step_pairs + α · Σ chosen NLL / step_nll_targets)
 * added to g, where step_pairs and step_nll_targets count the whole
 * optimizer step (every micro-batch, every rank): the step's loss is the
 * mean over its pairs, as TRL's. g NULL: evaluation (no gradients). */
at_status at_pref_forward_backward(const at_pref_config *c, const at_pref_pairs *p, const size_t *idx, size_t n,
                                   at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                                   const at_tensor *labels, float dropout, uint64_t seed, double step_pairs,
                                   double step_nll_targets, double scale, at_decoder_grads *g, at_pref_stats *stats);

/* The same with the forward's options as an argument (model/decoder.h at_fwd_opts);
 * at_pref_forward_backward reads first_row and NEFTune's fields from acts. */
at_status at_pref_forward_backward_opts(const at_pref_config *c, const at_pref_pairs *p, const size_t *idx, size_t n,
                                        at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                        const at_tensor *pos, const at_tensor *labels, const at_fwd_opts *fwd,
                                        double step_pairs, double step_nll_targets, double scale,
                                        at_decoder_grads *g, at_pref_stats *stats);

/* Loss terms of every pair of p (batch_pairs at a time, no dropout, no
 * gradients) summed into *stats (zeroed first): the evaluation. Its own
 * activations as at_pref_reference's (with the LoRA intermediates of d's
 * adapter, for one layer), freed before it returns. */
at_status at_pref_evaluate(const at_pref_config *c, const at_pref_pairs *p, at_decoder *d, int batch_pairs,
                           int32_t pad, at_pref_stats *stats);

#endif
