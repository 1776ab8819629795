/* GRPO's rewards (--reward_funcs, --reward_weights, --reward_command), as
 * ms-swift's built-in reward functions (swift/plugin/orm.py) define them.
 * A completion's reward is Σ_f w_f · r_f over the functions (w: 1 unless
 * --reward_weights).
 *
 *   accuracy       1 when the completion's final answer equals the record's
 *                  `solution`'s, else 0. The completion's answer: the content
 *                  of its last \boxed{...} (braces balanced), else of its last
 *                  <answer>...</answer>, else its last number; the
 *                  solution's: the same \boxed{} or <answer>, else what
 *                  follows "####" (GSM8K), else all of it; two numbers
 *                  are equal within 1e-6 relative, other answers when equal
 *                  after removing spaces and `$` (ms-swift uses math_verify;
 *                  this covers numbers and literal answers, not symbolic
 *                  equivalence).
 *   format         1 when the completion is `<think>…</think>`, optional
 *                  white space, `<answer>…</answer>` and nothing else (the
 *                  regex ^<think>.*?</think>\s*<answer>.*?</answer>(?![\s\S])).
 *   cosine         length-scaled accuracy (Yeo et al. 2025): with L tokens and
 *                  L_max (--cosine_max_len, default max_completion_length),
 *                  hi − (hi − lo)·(1 − cos(π·L/L_max))/2 where correct answers
 *                  go from hi = cosine_min_len_value_correct (1) to lo =
 *                  cosine_max_len_value_correct (0.5) and wrong ones from
 *                  cosine_min_len_value_wrong (−0.5) to cosine_max_len_value_wrong (0).
 *   repetition     (1 − distinct n-grams / n-grams) · repetition_max_penalty
 *                  over the lower-cased white-space words (n = repetition_n_grams,
 *                  3; penalty −1); 0 for fewer than n words.
 *   soft_overlong  DAPO's: min(0, −(L − (soft_max_length − soft_cache_length)) /
 *                  soft_cache_length) with L the completion's tokens.
 *
 * --reward_model DIR scores each (prompt, completion) with a reward model
 * (train/reward_model.h: the prompt's messages and the completion as the
 * assistant's reply, rendered by the reward model's chat template), as TRL
 * passes a sequence-classification model among its reward_funcs; its name
 * (rewards/NAME/mean, a key of --log_completions) is the folder's name.
 *
 * --reward_command CMD runs CMD (split at spaces, no shell) once per batch of
 * completions: one JSON object per line on its stdin, {"prompt": ...,
 * "completion": ..., "solution": ...} (solution null when the record has
 * none), then its stdin is closed; it answers one line per completion on
 * stdout: a number, or {"reward": number}. A missing, extra or malformed
 * line, an exit status other than 0, or no answer within --reward_timeout
 * seconds is an error naming the command and what was wrong. */
#ifndef AT_TRAIN_GRPO_REWARD_H
#define AT_TRAIN_GRPO_REWARD_H

#include <stddef.h>
#include "base/status.h"
#include "train/grpo.h"
#include "train/reward_model.h"

/* The built-ins, by name (NULL past the last). */
const char *at_grpo_builtin_name(int i);

/* Each built-in alone (pure functions, for the tests). solution may be NULL
 * (accuracy then refuses: it needs one). */
at_status at_grpo_reward_accuracy(const char *completion, const char *solution, double *out);
double at_grpo_reward_format(const char *completion);
double at_grpo_reward_cosine(const at_grpo_config *c, int correct, int tokens);
double at_grpo_reward_repetition(const at_grpo_config *c, const char *completion);
double at_grpo_reward_soft_overlong(const at_grpo_config *c, int tokens);
/* The final answer of a text (see above) into buf (NUL-terminated, cut to
 * cap - 1 bytes); 0 when it has none. */
int at_grpo_extract_answer(const char *text, char *buf, size_t cap);

/* What the rewards see of one completion. */
typedef struct {
    const char *prompt;      /* the prompt's last user message */
    const char *completion;  /* the generated text */
    const char *solution;    /* the record's, or NULL */
    int tokens;              /* completion tokens */
    const cJSON *messages;   /* the prompt's messages (a JSON array of {role, content}) a reward model scores;
                                NULL: prompt as the one user message */
} at_grpo_sample;

/* The functions of c (built-ins, then the reward model, then the command),
 * checked: an unknown name or a soft_overlong without --soft_cache_length
 * is AT_ERR_INVALID. With c->reward_model the caller opens the model
 * (at_reward_model_open) and sets `model` before scoring (names point into
 * the struct: do not copy it). */
typedef struct {
    const at_grpo_config *c;
    int n;                          /* functions */
    const char *names[AT_GRPO_MAX_REWARDS + 2];
    double weights[AT_GRPO_MAX_REWARDS + 2];
    at_reward_model *model;         /* --reward_model (borrowed), or NULL */
    char model_name[128];           /* its function's name */
} at_grpo_rewards;
at_status at_grpo_rewards_init(const at_grpo_config *c, at_grpo_rewards *r);

/* Each function's value for each of the n samples: out[i·r->n + f]. */
at_status at_grpo_rewards_score(const at_grpo_rewards *r, const at_grpo_sample *s, size_t n, double *out);

/* --reward_command alone: rewards of the n samples into out[n]. */
at_status at_grpo_reward_command(const char *cmd, double timeout_s, const at_grpo_sample *s, size_t n, double *out);

#endif
