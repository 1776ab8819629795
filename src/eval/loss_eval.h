/* Loss and perplexity of a model on a dataset: the same files, formats and
 * encoding as anytune sft / pt (data/dataset.h, train/text_pipeline.h), the
 * same loss as the trainer's evaluation:
 *
 *   loss       = Σ −log p(target) / number of targets, over every supervised
 *                token of every sample (token-weighted, not a mean of
 *                per-sample means); a target is the label of position t+1
 *                predicted at t (Hugging Face's shift), −100 not counted;
 *   perplexity = exp(loss).
 * Conversations supervise the assistant's tokens; with `pt` every record is
 * a text and every token but the BOS is supervised (BOS and EOS framed
 * around it, as pt trains). Samples longer than max_length follow the
 * truncation strategy (delete drops them). */
#ifndef AT_EVAL_LOSS_EVAL_H
#define AT_EVAL_LOSS_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "data/encode.h"
#include "infer/bundle.h"

typedef struct {
    int pt;                 /* texts, every token supervised */
    int max_length;         /* tokens per sample (0: the model's context) */
    at_truncation truncation;
    int batch_size;         /* rows per forward (0: 4) */
    int strict;             /* stop at the first bad record */
    uint64_t seed;          /* FILE#N sampling */
    int last_turn_only;     /* supervise only the last assistant turn */
    const char *model_name, *model_author; /* fill {{name}} / {{author}} as sft does (NULL: left) */
} at_loss_eval_options;

typedef struct {
    double loss_sum;        /* Σ −log p over the targets */
    int64_t n_targets;
    double loss;            /* loss_sum / n_targets */
    double perplexity;      /* exp(loss) */
    size_t n_samples;       /* evaluated */
    size_t n_dropped;       /* longer than max_length (truncation delete) */
    size_t n_failed;        /* records that could not be encoded (skipped; see the warnings) */
    size_t n_no_targets;    /* samples without a supervised token */
    double seconds;
} at_loss_eval_result;

/* Loads and encodes the dataset specs ("FILE" or "FILE#N") with b's
 * tokenizer and template. *out (n entries) are freed with at_encoded_free
 * each, then free(); counts gets n_dropped / n_failed / n_no_targets. */
at_status at_loss_eval_encode(const at_bundle *b, const char *const *specs, size_t n_specs,
                              const at_loss_eval_options *o, at_encoded **out, size_t *n, at_loss_eval_result *counts);

/* The loss of encoded samples on d (with its adapter, if set), batch_size
 * rows at a time; fills loss_sum, n_targets, loss, perplexity, n_samples. */
at_status at_loss_eval_encoded(at_decoder *d, const at_encoded *e, size_t n, int batch_size,
                               at_loss_eval_result *out);

/* Both: encode then evaluate. */
at_status at_loss_eval_run(at_bundle *b, const char *const *specs, size_t n_specs, const at_loss_eval_options *o,
                           at_loss_eval_result *out);

#endif
