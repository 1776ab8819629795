/* The JSON shapes of OpenAI's API that the server writes: completions and
 * chat completions (whole and as stream chunks), the model list, errors. Each
 * function returns a new NUL-terminated string (free()) or NULL when out of
 * memory. */
#ifndef AT_SERVE_RESPONSE_H
#define AT_SERVE_RESPONSE_H

#include <stddef.h>
#include <stdint.h>
#include "serve/request.h"

typedef struct at_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* < 0: no prompt_tokens_details; else its cached_tokens */
} at_usage;

/* {"error": {"message", "type", "param", "code"}}; param and code may be NULL (null). */
char *at_resp_error(const char *message, const char *type, const char *param, const char *code);

/* A whole response: chat.completion (message.content = text) or
 * text_completion (choices[0].text). finish: "stop", "length", ... */
char *at_resp_full(at_request_kind kind, const char *id, long long created, const char *model, const char *text,
                   size_t len, const char *finish, at_usage usage);

/* One stream chunk: chat.completion.chunk with delta {role?, content?}
 * (role when with_role; content when text != NULL) and finish_reason (NULL:
 * null), or text_completion with text. usage (may be NULL) adds the usage
 * object; usage_only gives the final chunk of stream_options.include_usage
 * (empty choices). */
char *at_resp_chunk(at_request_kind kind, const char *id, long long created, const char *model, int with_role,
                    const char *text, size_t len, const char *finish, const at_usage *usage, int usage_only);

/* {"object": "list", "default_model", "data": [{"id", "object": "model", "created", "owned_by", "root",
 * "parent"}...]}: the base model, then each adapter (parent: the base). default_model (anytune's
 * field) is the model a request without `model` gets; null: such a request is refused (adapters are
 * loaded and no --default_model was given), and the chat page makes its user choose. */
char *at_resp_models(const char *base, const char *const *adapters, int n_adapters, const char *default_model,
                     long long created);

#endif
