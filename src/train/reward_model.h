/* Scoring with a trained reward model (train/reward.h) outside training:
 * in process (GRPO's --reward_model) and behind `anytune serve`'s
 * POST /v1/score (serve/server.h).
 *
 * A reward model comes in three forms, all loaded as a bundle
 * (infer/bundle.h):
 *   - a Hugging Face *ForSequenceClassification folder (`anytune export
 *     --merge_lora --to hf` of an rm run): the head is its score.weight;
 *   - a LoRA checkpoint of `anytune rlhf --rlhf_type rm` given as the one
 *     adapter over its base (--model BASE --adapters CKPT): the head is the
 *     checkpoint's score.safetensors, and the adapter applies;
 *   - a full fine-tuning checkpoint (--model CKPT): its score.safetensors.
 *
 * A (prompt, reply) pair is scored as training scores a pair's row: the
 * prompt's messages and the reply as the assistant's message rendered by the
 * model's chat template (no generation prompt), tokenized with its special
 * tokens, the reward the head's value at the last token. */
#ifndef AT_TRAIN_REWARD_MODEL_H
#define AT_TRAIN_REWARD_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "infer/bundle.h"

typedef struct at_reward_model at_reward_model;

/* The reward model of the loaded bundle b (borrowed: it must outlive *out),
 * model_path the --model it was loaded from. batch: sequences per forward
 * (< 1: 8). AT_ERR_NOT_FOUND when b has no score head (a generative model);
 * AT_ERR_INVALID when the head is not one label or two adapters are loaded.
 * Free with at_reward_model_free. */
at_status at_reward_model_attach(at_bundle *b, const char *model_path, int batch, at_reward_model **out);

/* Loads opts' model (and adapter) as a reward model: the bundle is its own.
 * Errors as at_bundle_load's and at_reward_model_attach's. */
at_status at_reward_model_open(const at_bundle_opts *opts, int batch, at_reward_model **out);

/* The tokens a pair is scored on (see above): prompt a JSON array of {role,
 * content} messages or a JSON string (one user message), reply the
 * assistant's text. *ids: a new array (free()). AT_ERR_INVALID when the model
 * has no chat template or a message is malformed. */
at_status at_reward_model_encode(const at_reward_model *rm, const cJSON *prompt, const char *reply, int32_t **ids,
                                 size_t *n);

/* rewards[i] of the sequences seqs[i] (lens[i] >= 1 tokens, each at most the
 * model's context), `batch` at a time in order. One scoring runs at a time
 * (a lock): callable from several threads. */
at_status at_reward_model_score_ids(at_reward_model *rm, const int32_t *const *seqs, const size_t *lens, size_t n,
                                    double *rewards);

/* rewards[i] of the pairs (prompts[i], replies[i]): at_reward_model_encode
 * then at_reward_model_score_ids. The error names the pair. */
at_status at_reward_model_score(at_reward_model *rm, const cJSON *const *prompts, const char *const *replies,
                                size_t n, double *rewards);

/* The longest sequence scored (the model's context). */
int at_reward_model_context(const at_reward_model *rm);

void at_reward_model_free(at_reward_model *rm); /* NULL ok; frees the bundle when it opened it */

#endif
