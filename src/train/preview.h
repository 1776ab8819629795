/* Greedy answers to a few prompts, before and after training: the demo's way
 * of showing that training changed the model. */
#ifndef AT_TRAIN_PREVIEW_H
#define AT_TRAIN_PREVIEW_H

#include <stdio.h>
#include "base/status.h"
#include "model/decoder.h"
#include "train/text_pipeline.h"

/* For each prompt (a user message), renders it through the pipeline's chat
 * template and writes "  Q: prompt\n  A: answer\n" to out, the answer decoded
 * greedily up to max_tokens or the end-of-sequence token. */
at_status at_preview_answers(at_decoder *d, const at_text_pipeline *p, const char *const *prompts, int n,
                             int max_tokens, FILE *out);

#endif
