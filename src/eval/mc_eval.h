/* Multiple-choice accuracy (MMLU, C-Eval, ...), as LLaMA-Factory's
 * evaluator computes it (src/llamafactory/eval/evaluator.py):
 *
 *   prompt     the question after n_shot solved examples (mc_prompt.h),
 *              through the chat template with the generation prompt;
 *   prediction the letter whose token has the largest logit at the prompt's
 *              last position, among the tokens of "A", "B", "C", "D" (each
 *              the last id of tokenizer.encode(letter) without special
 *              tokens); a tie goes to the earlier letter, as torch.argmax;
 *   accuracy   per subject, per category of mapping.json and over all
 *              questions ("Average"): correct / answered.
 * A prompt longer than max_length tokens loses its earliest shots until it
 * fits; a question too long even without shots is skipped and counted.
 *
 * Questions of a subject are sorted by length and run `batch_size` at a time
 * through one prefill (a KV cache, right padding with per-row lengths), so
 * little is spent on padding; the logits are those of each row's last token. */
#ifndef AT_EVAL_MC_EVAL_H
#define AT_EVAL_MC_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "eval/mc_bench.h"
#include "eval/mc_prompt.h"
#include "infer/bundle.h"

typedef struct {
    at_mc_lang lang;
    int n_shot;     /* few-shot examples from dev (0: none) */
    int limit;      /* at most this many questions per subject (0: all) */
    int max_length; /* prompt tokens (0: the model's context, at_bundle_context) */
    int batch_size; /* questions per forward (0: 8) */
    int progress;   /* an info line per subject */
} at_mc_options;

typedef struct {
    int pred;       /* 0..3 for A..D; -1: skipped (too long) */
    int shots;      /* few-shot examples that fit */
    int n_tokens;   /* prompt length */
    float logits[4]; /* logits of the four choice tokens */
} at_mc_pred;

typedef struct {
    at_mc_pred *preds; /* [n], in file order */
    size_t n, correct, skipped;
} at_mc_subject_result;

typedef struct {
    int32_t choice_ids[4];
    at_mc_subject_result *subjects; /* [n], the bench's order */
    size_t n;
    size_t correct, total, skipped; /* total counts answered questions only */
    double seconds;
} at_mc_result;

/* The token ids of "A".."D": the last id of each letter's encoding without
 * special tokens. */
at_status at_mc_choice_ids(const struct at_tokenizer *tok, int32_t ids[4]);

/* Question q of subject s as the model sees it: the prompt with the most
 * shots (up to o->n_shot) that keeps it within max_len tokens. *ids (free())
 * and *n; *shots the shots used; text (may be NULL) gets the prompt text
 * (free()). *n == 0 (and *ids NULL) when even no shots do not fit. */
at_status at_mc_encode(const at_bundle *b, const at_mc_subject *s, size_t q, const at_mc_options *o, int max_len,
                       int32_t **ids, size_t *n, int *shots, char **text);

/* Runs every subject of bench on b's decoder (with whatever adapter is set
 * on it). *out: at_mc_result_free. */
at_status at_mc_evaluate(at_bundle *b, const at_mc_bench *bench, const at_mc_options *o, at_mc_result *out);
void at_mc_result_free(at_mc_result *r); /* zeroed ok */

/* {"average": {accuracy, correct, total}, "categories": {NAME: {...}},
 *  "subjects": {ID: {name, category, accuracy, correct, total, skipped,
 *  predictions: "BCA..." ('-' for skipped)}}, "skipped": N}; accuracy is a
 * fraction (0..1), null when nothing was answered. NULL when out of memory. */
cJSON *at_mc_result_json(const at_mc_bench *bench, const at_mc_result *r);

/* The same as lines for people: "  STEM: 31.25 (10/32)" in percent,
 * categories then the average, as LLaMA-Factory prints them. Caller frees. */
char *at_mc_result_text(const at_mc_bench *bench, const at_mc_result *r);

#endif
