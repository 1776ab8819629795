/* Chat templates: turning a conversation into the exact text a model was
 * trained on, as Hugging Face transformers' apply_chat_template does, and
 * finding the assistant's part of that text for loss masks.
 *
 * A template comes from a model folder (chat_template.jinja, or the
 * chat_template field of tokenizer_config.json: a string, or a list of named
 * templates of which "default" is used unless another name is asked for, e.g.
 * "tool_use"), from a string, or from the built-in fallbacks "chatml",
 * "llama-2", "llama-3" and "mistral" for folders without one.
 *
 * Rendering sees the variables transformers passes: messages, tools (None
 * when absent), documents (None), add_generation_prompt, the special tokens
 * (bos_token, eos_token, unk_token, pad_token, ... as strings) and any extra
 * variables (enable_thinking, date_string, ...). */
#ifndef AT_TEXT_CHAT_TEMPLATE_H
#define AT_TEXT_CHAT_TEMPLATE_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "text/jinja.h"

typedef struct at_chat_template at_chat_template;

/* From template text. `tokens` (may be NULL) is an object of special tokens,
 * e.g. {"bos_token": "<s>", "eos_token": "</s>"}; it is copied. `name`
 * prefixes error messages. *out: at_chat_template_free. */
at_status at_chat_template_from_string(const char *src, size_t len, const char *name, const cJSON *tokens,
                                       at_chat_template **out);

/* From a tokenizer_config.json file: its chat_template (named `which` when
 * the field is a list; NULL means "default") and its special tokens (strings
 * or AddedToken objects). AT_ERR_NOT_FOUND when the file has no template or
 * none of that name. */
at_status at_chat_template_from_config(const char *path, const char *which, at_chat_template **out);

/* From a model folder: DIR/chat_template.jinja if present, else the
 * template of DIR/tokenizer_config.json, else the built-in `fallback` (may be
 * NULL: then AT_ERR_NOT_FOUND). Special tokens come from
 * DIR/tokenizer_config.json when it exists. */
at_status at_chat_template_load(const char *dir, const char *which, const char *fallback, at_chat_template **out);

/* A built-in template by name: "chatml", "llama-2", "llama-3", "mistral", and
 * ms-swift's template names (--template qwen2_5...) with ms-swift's text:
 * qwen, qwen2_5, internlm2 and llama put their template's default system
 * message first when a conversation has none; llama3_2 always opens with the
 * knowledge cutoff and today's date. tokens as in at_chat_template_from_string;
 * when NULL the family's usual tokens are used. */
at_status at_chat_template_builtin(const char *name, const cJSON *tokens, at_chat_template **out);

/* The built-in names, with ms-swift's that map to them, for messages. */
#define AT_CHAT_TEMPLATE_NAMES                                                                                    \
    "chatml, llama-2, llama-3, mistral; ms-swift's qwen, qwen2 (qwen), qwen2_5, internlm2, llama, llama2 "       \
    "(llama), llama3_2, yi (chatml), llama3, llama3_1, llama3_3 (llama-3)"

/* The built-in template a name means (ours, or ms-swift's alias of it), or NULL. */
const char *at_chat_template_builtin_name(const char *name);

/* The text of a built-in template (by either name), or NULL for an unknown name. */
const char *at_chat_template_builtin_source(const char *name);

void at_chat_template_free(at_chat_template *ct);

/* The template text (owned by ct). */
const char *at_chat_template_source(const at_chat_template *ct);

/* A special token ("bos_token", "eos_token", ...) or NULL (owned by ct). */
const char *at_chat_template_token(const at_chat_template *ct, const char *key);

typedef enum {
    AT_CHAT_MASK_NONE = 0, /* no spans */
    AT_CHAT_MASK_ALL,      /* every assistant message */
    AT_CHAT_MASK_LAST      /* only the last assistant message */
} at_chat_mask_mode;

typedef struct {
    const cJSON *tools;        /* array of tool schemas, or NULL */
    int add_generation_prompt;
    const cJSON *extra;        /* object of more variables, or NULL */
    at_chat_mask_mode mask;
    const at_jinja_options *jinja; /* limits, fixed time; NULL for defaults */
} at_chat_render_opts;

/* Bytes [start, end) of the rendered text that belong to assistant message
 * number `message` (its index in the messages array). */
typedef struct {
    size_t start, end;
    int message;
} at_chat_span;

typedef struct {
    char *text; /* NUL-terminated */
    size_t len;
    at_chat_span *spans;
    size_t n_spans;
} at_chat_rendered;

/* Renders `messages` (a JSON array of {"role", "content", "tool_calls", ...}
 * objects, OpenAI style). out is filled on success (free with
 * at_chat_rendered_free); on failure it is left empty and the error (syntax,
 * raise_exception's message, limits) names the template line and column.
 *
 * Assistant spans (opt->mask) are found by rendering prefixes of the
 * conversation, as many trainers do, so they work for any template:
 *   start of turn i = length of the common prefix of the full text and the
 *     text of messages[:i] with the generation prompt (the role header the
 *     template writes before an assistant turn is outside the span);
 *   end = start + common prefix of the full text and the text of
 *     messages[:i+1], both from `start` — which includes the end-of-turn
 *     token (<|im_end|>, <|eot_id|>, </s>, ...) and whatever the template
 *     writes right after it (usually "\n"); when the template renders a final
 *     turn differently from an earlier one (Qwen3 adds an empty <think> block
 *     to the last turn), the end is found by the longest tail of that turn's
 *     text that the full text continues with.
 * A span must be non-empty and contain the message's content (the part after
 * any </think>, stripped); otherwise rendering fails with AT_ERR_UNSUPPORTED
 * naming the message: templates whose earlier text changes with later
 * messages, or that rewrite the content beyond recognition, cannot be masked
 * this way. Costs two extra renders per masked message. */
at_status at_chat_template_render(const at_chat_template *ct, const cJSON *messages, const at_chat_render_opts *opt,
                                  at_chat_rendered *out);

void at_chat_rendered_free(at_chat_rendered *r);

#endif
