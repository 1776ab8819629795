/* Training objectives behind one interface: what the trainer's step calls.
 *
 * An objective (sft, pt, the preference family dpo/cpo/simpo/orpo, kto, ...)
 * is a table of functions:
 *   prepare           encode its datasets (its items: samples, pairs, ...)
 *                     and give their lengths to the batch plan;
 *   reference         (objectives comparing with a frozen model) the
 *                     reference log-probs under the model it is given;
 *   build             the micro-batch of a plan batch, and its counts (the
 *                     step's normalizers: supervised tokens, pairs, ...),
 *                     which the trainer sums over the step and the ranks;
 *   forward_backward  one micro-batch (or a piece of one): forward with the
 *                     step's options, the per-token gradient weights, the
 *                     backward, its statistics;
 *   loss, log         the step's loss from its statistics, and the
 *                     objective's fields of a logging.jsonl line;
 *   evaluate          the validation loss.
 * A new objective is one file with its table and one row of the name table
 * in objective.c. The trainer (trainer.c) never asks which objective it runs.
 *
 * Statistics and counts are arrays of doubles so the trainer can sum them
 * over micro-batches, ranks and logging intervals without knowing them. */
#ifndef AT_TRAIN_OBJECTIVE_H
#define AT_TRAIN_OBJECTIVE_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/image_proc.h"
#include "model/decoder.h"
#include "model/mrope.h"
#include "model/vision.h"
#include "train/batch_upload.h"
#include "train/preference.h"

#define AT_OBJ_MAX_COUNTS 4
#define AT_OBJ_MAX_STATS 24

typedef struct at_objective at_objective;

/* What data preparation gets from the trainer. */
typedef struct {
    const at_encoder *enc; /* the chat template and tokenizer; max_length and truncation set */
    int strict;            /* the first sample that fails stops the run (else skipped with a warning) */
    int32_t bos, eos;      /* the tokenizer's (-1: none): pt frames its documents */
    int max_length;        /* for the summary line */
    int batch_size;        /* --per_device_train_batch_size (kto's KL pairs are made within batches) */
    const struct at_tokenizer *tok; /* the tokenizer (grpo generates and decodes) */
    const struct at_chat_template *tmpl; /* the chat template, or NULL (grpo's stop tokens) */
    /* a vision-language model (NULL vision: a text model, whose samples with images are refused): */
    const at_image_processor *vision; /* its image processor (--max_pixels / --min_pixels applied) */
    int32_t image_pad;                 /* <|image_pad|> */
    const at_mrope_tokens *mrope;      /* NULL, or the model takes M-RoPE positions (built with the batches) */
} at_obj_data_env;

/* One micro-batch, or rows [u0·unit, u1·unit) of it after out-of-memory
 * halving (unit: the objective's rows_per_item), as the trainer runs it. */
typedef struct {
    const at_batch_plan *plan;  /* the epoch's plan over the objective's training items */
    size_t b;                   /* the plan batch */
    size_t u0, u1;              /* its items [u0, u1) (plan rows, one item per row for objectives with
                                   rows_per_item > 1) */
    const at_batch *batch;      /* those rows, on the host */
    const at_batch_tensors *t;  /* and on the device */
    at_fwd_opts fwd;            /* the forward's options (dropout, NEFTune) */
    const double *step_counts;  /* build's counts summed over the whole step, every rank */
    double scale;               /* the loss scale (gradients are of loss · scale) */
    at_vision *vision;          /* the vision tower (NULL: a text model); its trainable parts get gradients */
} at_obj_micro;

/* What the evaluation gets from the trainer. */
typedef struct {
    at_decoder *d;
    at_decoder_acts **acts;     /* the trainer's activations: reused, replaced or freed (the trainer frees
                                   what is left) */
    at_batch_options batch;     /* how the validation items are batched (no shuffle) */
    int32_t pad;
    int packing;                /* batches carry segment ids */
    at_vision *vision;          /* the vision tower, or NULL */
} at_obj_eval_env;

typedef struct {
    const char *name;      /* "sft", "pt", "preference", ... */
    size_t rows_per_item;  /* rows one item fills (2: a pair's chosen and rejected rows; 0: set by prepare
                              in the objective's rows_per_item); out-of-memory halving cuts micro-batches
                              between items */
    int n_counts, n_stats; /* sizes of the arrays below (<= AT_OBJ_MAX_COUNTS, AT_OBJ_MAX_STATS) */
    int packs;             /* --packing applies (items of one row may be several samples) */
    int plain_text;        /* trains on plain text (--dataset read as documents) */
    /* Encodes train and val (val may be empty) into o->impl and sets
     * n_train, train_len, n_val, val_len. */
    at_status (*prepare)(at_objective *o, const at_obj_data_env *env, const at_sample_list *train,
                         const at_sample_list *val);
    /* NULL: nothing. Else called once the model (and its adapter) is set,
     * before the optimizer: the objective makes the tensors of its own (a
     * reward model's score head), random ones from seed. */
    at_status (*attach)(at_objective *o, at_decoder *d, uint64_t seed);
    /* NULL: none. Else its own trainable tensors and their gradients
     * (trained, clipped and summed over ranks with the decoder's): up to cap
     * into out; returns how many there are. */
    int (*trainables)(at_objective *o, at_param_grad *out, int cap);
    /* NULL: nothing. Else writes its own trained tensors into a checkpoint
     * folder, and reads them back from one (resume). */
    at_status (*save)(const at_objective *o, const char *dir);
    at_status (*load)(at_objective *o, const char *dir);
    /* NULL or 0: the objective is reference-free. Else `reference` computes
     * its reference log-probs of every item under ref (no dropout),
     * batch_items at a time, once, before training. */
    int (*needs_reference)(const at_objective *o);
    at_status (*reference)(at_objective *o, at_decoder *ref, int batch_items, int32_t pad);
    /* NULL: references are computed once, by `reference`. Else the
     * objective scores against its reference during training (grpo's KL),
     * and when needs_reference says so it is given, before attach, the
     * frozen reference it keeps: --ref_model, or for full fine-tuning a copy
     * of the initial weights (owned: freed by `free`), or NULL when the
     * reference is the policy with its LoRA adapter off. */
    at_status (*keep_reference)(at_objective *o, at_decoder *ref);
    /* The micro-batch of plan batch b (*out: free with at_batch_free) and its counts[n_counts]
     * (counts[0]: the loss's denominator: 0 means the step has nothing to train on). */
    at_status (*build)(const at_objective *o, const at_batch_plan *plan, size_t b, int32_t pad, at_batch *out,
                       double *counts);
    /* Forward and backward of m into g (NULL: evaluation, no gradients),
     * adding its statistics into stats[n_stats]. */
    at_status (*forward_backward)(at_objective *o, at_decoder *d, at_decoder_acts *acts, const at_obj_micro *m,
                                  at_decoder_grads *g, double *stats);
    /* The loss of a step with these statistics and counts (NaN when it has none). */
    double (*loss)(const at_objective *o, const double *stats, const double *counts);
    /* NULL: nothing beyond the loss. Else adds the objective's fields of a
     * logging interval with these summed statistics to line. */
    void (*log)(const at_objective *o, const double *stats, cJSON *line);
    /* The loss over the validation items (o->n_val > 0). */
    at_status (*evaluate)(at_objective *o, const at_obj_eval_env *env, double *loss);
    void (*free)(at_objective *o);
} at_objective_ops;

struct at_objective {
    const at_objective_ops *ops;
    const at_pref_config *pref;  /* the rlhf options (NULL for sft and pt) */
    void *impl;                  /* the objective's data (owned) */
    size_t n_train, n_val;
    const size_t *train_len;     /* [n_train] each item's length, for the batch plan (owned by impl) */
    const size_t *val_len;
    size_t rows_per_item;        /* ops->rows_per_item, or what prepare set (grpo: G completions a prompt) */
    int step_repeats;            /* each plan step runs this many optimizer steps (grpo's --num_iterations);
                                    prepare may set it (else 1) */
    const char *run_dir;         /* the run's folder on the rank that writes files (set before the first
                                    step), else NULL */
    int64_t epoch;               /* the epoch of the plan that build and forward_backward are given (set by
                                    the trainer; grpo keys its sampling by it) */
};

/* The objective of a run: "sft", "pt", or rlhf's pref->name (dpo, cpo, simpo,
 * orpo, ...). pref: the rlhf options (borrowed; NULL for sft and pt).
 * AT_ERR_INVALID naming the choices for another name. Free with
 * at_objective_free. */
at_status at_objective_open(const char *name, const at_pref_config *pref, at_objective **out);
void at_objective_free(at_objective *o); /* NULL ok */

/* The objectives `anytune rlhf --rlhf_type` runs in this build (every row of
 * the name table but sft and pt), "|"-separated into buf (cut to cap, NUL
 * ended; the web UI's choices). Returns the length the whole list needs. */
size_t at_objective_rlhf_names(char *buf, size_t cap);

/* The objectives' tables (one file each). */
extern const at_objective_ops at_objective_sft, at_objective_pt, at_objective_preference, at_objective_kto,
    at_objective_rm, at_objective_grpo;

#endif
