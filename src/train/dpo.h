/* Direct Preference Optimization (`anytune rlhf --rlhf_type dpo`), as TRL's
 * DPOTrainer computes it (the objective ms-swift runs).
 *
 * Each record is a preference pair: a prompt, a chosen and a rejected reply.
 * With π = Σ log p(reply tokens | prompt) under the policy being trained and
 * r the same under the frozen reference model,
 *     h = (π_c − π_r) − (r_c − r_r),     z = β·h
 *   sigmoid (default):  L = −(1−ls)·log σ(z) − ls·log σ(−z)   (ls: label smoothing)
 *   ipo:                L = (h − 1/(2β))²  with π and r averaged over the reply's tokens
 *   hinge:              L = max(0, 1 − z)
 * and with rpo_alpha the NLL of the chosen replies is added (RPO, as TRL:
 * rpo_alpha × the mean over the chosen tokens). The reported rewards are
 * β(π_c − r_c) and β(π_r − r_r).
 *
 * The reference log-probs are computed once, before training, in one pass
 * without dropout (TRL's precompute_ref_log_probs): by the policy's own base
 * (LoRA: the model with the adapter off; full fine-tuning: the initial
 * weights) or by another model (--ref_model). They live in host memory and are
 * recomputed on resume (deterministic, so a resumed run continues exactly).
 *
 * A micro-batch holds the chosen and rejected rows of its pairs interleaved
 * [c0, r0, c1, r1, ...], right-padded, so a piece of consecutive pairs is a
 * piece of consecutive rows. One forward serves both: a first loss pass
 * without gradients gives each row's log-prob sum, then the pair's dL/dπ
 * becomes the gradient scale of its rows in a second pass (per-row scales,
 * model/decoder.h) and one backward follows. */
#ifndef AT_TRAIN_DPO_H
#define AT_TRAIN_DPO_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "model/decoder.h"

typedef enum { AT_DPO_SIGMOID = 0, AT_DPO_IPO, AT_DPO_HINGE } at_dpo_loss_type;

/* "sigmoid", "ipo", "hinge". */
const char *at_dpo_loss_type_name(at_dpo_loss_type t);
/* Parses one of those names; AT_ERR_INVALID naming the choices otherwise. */
at_status at_dpo_loss_type_parse(const char *name, at_dpo_loss_type *out);

typedef struct {
    double beta;                /* --beta (0.1) */
    at_dpo_loss_type loss_type; /* --loss_type (sigmoid) */
    double label_smoothing;     /* --label_smoothing (0; sigmoid only) */
    double rpo_alpha;           /* --rpo_alpha (0: off, TRL's and ms-swift's None) */
    const char *ref_model;      /* --ref_model; NULL: the policy's base */
} at_dpo_config;

void at_dpo_config_defaults(at_dpo_config *c);
/* AT_ERR_INVALID naming the option when a value is out of range. */
at_status at_dpo_config_check(const at_dpo_config *c);

/* One pair's loss from its log-probs (sums, or for ipo means over the
 * reply's tokens) and its derivatives dL/dπ_c, dL/dπ_r. */
typedef struct {
    double loss, d_chosen, d_rejected;
} at_dpo_pair_loss;
void at_dpo_pair(const at_dpo_config *c, double pi_c, double pi_r, double ref_c, double ref_r, at_dpo_pair_loss *out);

/* Encoded preference pairs and their reference log-probs. */
typedef struct {
    size_t n;
    at_encoded *chosen, *rejected; /* [n] prompt + reply, labels on the reply only */
    size_t *len;                   /* [n] the longer of the two (batch planning) */
    int64_t *n_c, *n_r;            /* [n] supervised targets of each reply */
    double *ref_c, *ref_r;         /* [n] reference log-prob sums (at_dpo_reference) */
} at_dpo_pairs;

/* Encodes the preference samples of list through enc (labels on the final
 * reply only: make enc with last-turn-only masking). --max_length applies to
 * prompt + reply with enc's truncation: a pair is dropped when either side is
 * (delete), else both sides are cut alike. A sample that is not a pair is an
 * error naming its file and line; with strict the first failure stops, else
 * failures are skipped with a warning (the first few). what: "train"/"eval"
 * for the summary line. Free with at_dpo_pairs_free. */
at_status at_dpo_pairs_encode(const at_sample_list *list, const at_encoder *enc, int strict, const char *what,
                              at_dpo_pairs *out);
void at_dpo_pairs_free(at_dpo_pairs *p);

/* The micro-batch of pairs idx[0..n): rows [c, r] per pair, right-padded with
 * pad to the longest row; positions 0.., no segments. Free with at_batch_free. */
at_status at_dpo_batch_build(const at_dpo_pairs *p, const size_t *idx, size_t n, int32_t pad, at_batch *out);

/* Fills p->ref_c / ref_r with the log-prob sums of every reply under d as it
 * is now (its adapter, if any, applies: remove it first for the base), no
 * dropout, batch_pairs pairs at a time. */
at_status at_dpo_reference(at_decoder *d, at_dpo_pairs *p, int batch_pairs, int32_t pad);

/* What a step (or a logging interval) sums over its pairs. */
typedef struct {
    double pairs;                  /* pairs counted */
    double loss;                   /* Σ preference loss (without the RPO term) */
    double reward_c, reward_r;     /* Σ β(π_c − r_c), Σ β(π_r − r_r) */
    double correct;                /* Σ [reward_c > reward_r] */
    double logp_c, logp_r;         /* Σ π_c, Σ π_r (ipo: means over tokens) */
    double nll, nll_targets;       /* Σ −log p over the chosen targets, and their count */
} at_dpo_stats;
#define AT_DPO_STATS_N 9 /* doubles in at_dpo_stats (summed over ranks as an array) */

/* The step's loss: Σ loss / pairs + rpo_alpha · nll / nll_targets. */
double at_dpo_stats_loss(const at_dpo_config *c, const at_dpo_stats *s);
/* a += b */
void at_dpo_stats_add(at_dpo_stats *a, const at_dpo_stats *b);
/* Adds TRL's metrics, means over s's pairs, to line: rewards/chosen,
 * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
 * logps/rejected, and nll_loss with rpo_alpha. */
void at_dpo_stats_log(const at_dpo_config *c, const at_dpo_stats *s, cJSON *line);

/* One micro-batch of pairs idx[0..n) built by at_dpo_batch_build and uploaded
 * as ids/pos/labels [2n, T] (acts of that shape, AT_ACTS_TRAIN when g is
 * given): forward (LoRA dropout p with seed), log-probs, loss terms into
 * *stats, and with g the gradients of
 *     scale · (Σ_pairs L / step_pairs + rpo_alpha · Σ chosen NLL / step_nll_targets)
 * added to g, where step_pairs and step_nll_targets count the whole
 * optimizer step (every micro-batch, every rank): the step's loss is the
 * mean over its pairs, as TRL's. g NULL: evaluation (no gradients). */
at_status at_dpo_forward_backward(const at_dpo_config *c, const at_dpo_pairs *p, const size_t *idx, size_t n,
                                  at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                                  const at_tensor *labels, float dropout, uint64_t seed, double step_pairs,
                                  double step_nll_targets, double scale, at_decoder_grads *g, at_dpo_stats *stats);

/* Loss terms of every pair of p (batch_pairs at a time, no dropout, no
 * gradients) summed into *stats (zeroed first): the evaluation. */
at_status at_dpo_evaluate(const at_dpo_config *c, const at_dpo_pairs *p, at_decoder *d, int batch_pairs, int32_t pad,
                          at_dpo_stats *stats);

#endif
