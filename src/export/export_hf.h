/* Writing Hugging Face folders: a whole model (transformers'
 * save_pretrained layout) or a LoRA adapter alone (PEFT layout).
 *
 * A model folder holds
 *   config.json                       the source's config.json when there is one
 *                                     (torch_dtype updated), else one made
 *                                     from the config (at_model_config_to_json)
 *   model.safetensors                 or, above max_shard_size,
 *   model-00001-of-0000N.safetensors  + model.safetensors.index.json
 *                                     ({"metadata": {"total_size"}, "weight_map"})
 *   generation_config.json            copied when the source has one
 *   preprocessor_config.json,         copied when the source has them (a
 *   video_preprocessor_config.json    vision-language model's processor)
 *   tokenizer files                   copied: tokenizer.json, tokenizer_config.json,
 *                                     special_tokens_map.json, added_tokens.json,
 *                                     vocab.json, merges.txt, tokenizer.model,
 *                                     chat_template.jinja (those present);
 *                                     or, given a loaded tokenizer (a GGUF or
 *                                     llama2.c source), written from it:
 *                                     tokenizer.json, tokenizer_config.json,
 *                                     special_tokens_map.json
 *                                     (text/tokenizer_hf_export.h)
 *   MANIFEST.sha256
 * Tensors carry Hugging Face names and the output dtype (norm weights and
 * biases too, as save_pretrained does); the tied lm_head is not written. The
 * safetensors files have {"format": "pt"} metadata, which transformers
 * requires. Everything is written into a staging folder and renamed into
 * place (export_files.h). */
#ifndef AT_EXPORT_EXPORT_HF_H
#define AT_EXPORT_EXPORT_HF_H

#include <stdint.h>
#include "base/status.h"
#include "model/adapter.h"
#include "model/weights.h"
#include "text/tokenizer.h"

struct at_export_vision;

typedef struct {
    at_dtype dtype;          /* AT_F32, AT_BF16, AT_F16; AT_DTYPE_COUNT: the model's own
                                (config torch_dtype, else the matrices' dtype) */
    int64_t max_shard_size;  /* bytes per safetensors file; 0: 5 GB (HF's default) */
    const char *source_dir;  /* model folder to take config.json / generation_config.json from; may be NULL */
    const char *tokenizer_dir; /* folder to copy tokenizer files from; NULL: source_dir */
    const at_tokenizer *tokenizer; /* when non-NULL: tokenizer files written from it (nothing copied) */
    const char *chat_template; /* with tokenizer: tokenizer_config.json's chat_template; may be NULL */
    int overwrite;           /* replace an existing out_dir */
    int progress;            /* progress bar on stderr */
    const at_tensor *score;  /* a reward model's head [1, hidden] (train/reward.h), or NULL: written as
                                score.weight in place of lm_head, and config.json's architectures become
                                *ForSequenceClassification with one label (id2label {"0": "LABEL_0"}),
                                as transformers saves such a model */
    const struct at_export_vision *vision; /* a vision-language model's tower (export_vision.h), or NULL: its
                                tensors follow the language model's under the source's names and shapes, and
                                the language model is written under model.language_model.* when the source
                                kept it there */
} at_export_hf_opts;

/* Writes w as a Hugging Face folder out_dir (see above). o may be NULL. */
at_status at_export_hf(const at_decoder_weights *w, const char *out_dir, const at_export_hf_opts *o);

/* Writes the adapter alone in PEFT's format (adapter_config.json,
 * adapter_model.safetensors, MANIFEST.sha256) as folder out_dir. */
at_status at_export_peft(const at_adapter *a, const char *out_dir, int overwrite);

/* The Hugging Face name of every tensor of w in save_pretrained's order
 * (embeddings, layers, final norm, lm_head unless tied), with the tensor.
 * Calls fn for each; stops at the first error fn returns. */
typedef at_status (*at_export_tensor_fn)(void *ctx, const char *name, const at_tensor *t);
at_status at_export_each_hf_tensor(const at_decoder_weights *w, at_export_tensor_fn fn, void *ctx);

#endif
