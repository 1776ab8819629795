/* From dataset samples to token ids with labels: the chat template renders a
 * conversation and says which bytes are the assistant's, the tokenizer turns
 * the text into ids with the bytes each covers. These are the render and
 * tokenize callbacks of data/encode.h, bound to a model's tokenizer and
 * template.
 *
 * Special tokens written by the template (bos_token, eos_token, <|im_end|>,
 * ...) become their ids: the text is tokenized with special tokens parsed. */
#ifndef AT_TRAIN_TEXT_PIPELINE_H
#define AT_TRAIN_TEXT_PIPELINE_H

#include "base/status.h"
#include "data/encode.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

typedef struct {
    const at_tokenizer *tok;
    const at_chat_template *tmpl; /* NULL: conversations cannot be encoded */
    at_chat_mask_mode mask;       /* AT_CHAT_MASK_ALL or AT_CHAT_MASK_LAST */
    const char *system;           /* NULL, or the system message of conversations that have none (borrowed) */
} at_text_pipeline;

/* Binds tokenizer and template (both borrowed; they must outlive p).
 * last_turn_only: labels on the last assistant turn only. */
at_status at_text_pipeline_init(at_text_pipeline *p, const at_tokenizer *tok, const at_chat_template *tmpl,
                                int last_turn_only);
void at_text_pipeline_free(at_text_pipeline *p);

/* An encoder over p (render + tokenize callbacks with p as context). */
void at_text_pipeline_encoder(at_text_pipeline *p, at_encoder *enc);

/* Renders messages (OpenAI-style JSON array) with the generation prompt and
 * tokenizes them, for generation ("before/after" answers, eval). *ids is a
 * new array (caller frees). */
at_status at_text_pipeline_prompt(const at_text_pipeline *p, const cJSON *messages, int32_t **ids, size_t *n);

#endif
