/* A model ready to generate with: the decoder, its tokenizer, its chat
 * template (or none), the tokens that end an answer, and LoRA adapters by
 * name. What anytune infer and anytune serve load.
 *
 * Where things come from:
 *   - a Hugging Face folder: tokenizer files of the folder; the template of
 *     chat_template.jinja / tokenizer_config.json; generation_config.json's
 *     eos_token_id joins the stop tokens;
 *   - a GGUF file: the tokenizer.ggml.* arrays and tokenizer.chat_template;
 *   - a llama2.c .bin: tokenizer.bin next to it (or the one tok*.bin there);
 *     no template.
 * A tokenizer given explicitly (opts->tokenizer) wins. */
#ifndef AT_INFER_BUNDLE_H
#define AT_INFER_BUNDLE_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "device/backend.h"
#include "model/adapter.h"
#include "data/image_proc.h"
#include "model/decoder.h"
#include "model/vision.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#define AT_BUNDLE_MAX_STOP_IDS 16
#define AT_BUNDLE_MAX_ADAPTERS 16

typedef struct at_bundle_adapter {
    char name[64];
    char *path;
    at_adapter *adapter;
} at_bundle_adapter;

typedef struct at_bundle {
    at_decoder *decoder;
    at_tokenizer *tokenizer;
    at_chat_template *tmpl;   /* NULL: prompts are continued as raw text */
    char name[128];           /* the model's name (the folder or file name without extension) */
    int32_t stop_ids[AT_BUNDLE_MAX_STOP_IDS];
    int n_stop_ids;
    at_bundle_adapter adapters[AT_BUNDLE_MAX_ADAPTERS];
    int n_adapters;
    /* a vision-language folder (config.json with vision_config): its tower,
     * on the decoder's backend, and its image processor; NULL otherwise */
    at_vision *vision;
    at_image_processor image_proc;
} at_bundle;

typedef struct at_bundle_opts {
    const char *model;        /* folder, .gguf or llama2.c .bin (required) */
    const char *tokenizer;    /* NULL: found from the model */
    const char *template_name;/* NULL: the model's; "none"; a built-in name; a .jinja file */
    const char *const *adapters; /* "DIR" or "NAME=DIR" items */
    int n_adapters;
    at_backend *backend;      /* NULL: the CPU */
    int dtype;                /* at_dtype, or AT_LOAD_KEEP_DTYPE */
    int quant;                /* at_quant_kind of model/loader.h: quantize the linear matrices (QLoRA models) */
    const char *model_type;   /* NULL, or --model_type: the family to read the folder as (model/config.h) */
} at_bundle_opts;

/* The stop tokens of a model: the config's and the tokenizer's EOS, BOS (a
 * model that writes BOS has begun a new document; llama2.c's run stops there
 * too), the template's eos_token (tmpl may be NULL) and the usual end-of-turn
 * tokens the vocabulary has; added to ids[0..n) (no duplicates, at most cap
 * in all). Returns the new count. */
int at_stop_tokens(const at_model_config *c, const at_tokenizer *tok, const at_chat_template *tmpl, int32_t *ids,
                   int n, int cap);

/* Loads everything. Caller frees *out with at_bundle_free. Errors name the
 * file concerned. */
at_status at_bundle_load(const at_bundle_opts *opts, at_bundle **out);

/* Only the text side, found as at_bundle_load finds it (opts->model,
 * ->tokenizer, ->template_name; nothing else is read): the trainer's
 * tokenizer and template. *tok: at_tokenizer_free; *tmpl:
 * at_chat_template_free, NULL when the model has none or "none" was asked. */
at_status at_bundle_load_text(const at_bundle_opts *opts, at_tokenizer **tok, at_chat_template **tmpl);
void at_bundle_free(at_bundle *b); /* NULL ok */

/* The adapter named `name`, or NULL. */
at_adapter *at_bundle_adapter_get(const at_bundle *b, const char *name);

/* Token ids of a prompt:
 *   - messages (a JSON array of {role, content}) through the chat template
 *     with the generation prompt (an error when the model has none);
 *   - else text: empty gives the BOS token alone; otherwise the text with
 *     the tokenizer's special tokens added (BOS for most models).
 * *ids is a new array (free()). */
at_status at_bundle_encode_chat(const at_bundle *b, const cJSON *messages, int32_t **ids, size_t *n);
at_status at_bundle_encode_text(const at_bundle *b, const char *text, int32_t **ids, size_t *n);

/* The context length to use: `want` when > 0 (capped by the model's
 * max_position_embeddings when known), else that, capped at 4096 (2048 when
 * unknown). */
int at_bundle_context(const at_bundle *b, int want);

#endif
