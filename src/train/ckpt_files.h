/* What makes a full fine-tuning checkpoint stand alone: beside its
 * config.json and model.safetensors, the tokenizer files and a
 * generation_config.json, so that `anytune infer --model
 * RUN/checkpoint-N` and transformers' from_pretrained load the folder as
 * they load the model it was trained from. */
#ifndef AT_TRAIN_CKPT_FILES_H
#define AT_TRAIN_CKPT_FILES_H

#include <stdint.h>
#include "base/status.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

/* Into dir: the tokenizer files of the folder `tokenizer_dir` (the model's,
 * or --tokenizer's) when it has tokenizer.json or tokenizer.model, copied
 * as they are; otherwise (a llama2.c or GGUF tokenizer) tok written as
 * Hugging Face files with tmpl's source as the chat template. Then
 * generation_config.json: the model folder's, or one with tok's BOS and EOS.
 * tokenizer_dir may be NULL (a model file, not a folder). */
at_status at_ckpt_write_standalone(const char *dir, const char *tokenizer_dir, const char *model_dir,
                                   const at_tokenizer *tok, const at_chat_template *tmpl, int64_t context);

/* dir/name copied to to/name when it is a file; nothing when absent. */
at_status at_ckpt_copy_if_file(const char *dir, const char *name, const char *to);

#endif
