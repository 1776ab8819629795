/* The body of an OpenAI-style request (POST /v1/chat/completions or
 * /v1/completions) turned into an internal request: prompt or messages,
 * sampling parameters, limits. No model is needed here (the parser is
 * fuzzed on its own); prompts are rendered and tokenized by the server.
 *
 * Accepted fields: model, messages (chat: objects with a string role and a
 * content that is a string, null, or a list of {"type": "text", "text"}
 * parts, joined), prompt (completions: a string, a list of one string, or a
 * list of token ids), max_tokens / max_completion_tokens, temperature,
 * top_p, top_k, min_p, repetition_penalty, presence_penalty,
 * frequency_penalty, seed, stop (a string or a list), stream,
 * (chat content lists may hold {"type": "image_url", "image_url": {"url":
 * ...}} parts, also ms-swift's {"type": "image", "image": ...}: each becomes
 * an "<image>" tag in the text and its reference is kept in images, as
 * data/media.h reads them; http(s) URLs are refused: nothing is fetched),
 * stream_options.include_usage, n (only 1). Unknown fields are ignored, as
 * vLLM does; logprobs and best_of > 1 are refused. */
#ifndef AT_SERVE_REQUEST_H
#define AT_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "infer/generate.h"
#include "infer/sampling.h"

typedef enum { AT_REQ_CHAT = 0, AT_REQ_COMPLETION } at_request_kind;

typedef struct at_request_limits {
    int max_tokens;    /* largest max_tokens accepted */
    int max_stop;      /* stop strings, <= AT_GEN_MAX_STOP */
    size_t max_stop_len;
    int max_images;    /* images in one request; 0: AT_SERVE_MAX_IMAGES */
} at_request_limits;

#define AT_SERVE_MAX_IMAGES 16

typedef struct at_serve_request {
    at_request_kind kind;
    char *model;          /* NULL when absent */
    cJSON *messages;      /* chat: a normalized array [{role, content: string}] */
    char **images;        /* chat: the image references of the content lists, in order */
    int n_images;
    char *prompt;         /* completion as text, or NULL */
    int32_t *prompt_ids;  /* completion as token ids, or NULL */
    size_t n_prompt_ids;
    int stream;
    int include_usage;    /* stream_options.include_usage */
    int max_tokens;       /* 0 when absent */
    char *stop[AT_GEN_MAX_STOP];
    int n_stop;
    at_sampling_params sampling; /* OpenAI defaults: temperature 1, top_p 1 */
    int has_seed;
    char param[64];       /* on failure: the offending field ("" when none) */
} at_serve_request;

/* Parses body[0..len) for an endpoint of `kind`. On failure the message
 * says what is wrong and req->param names the field; AT_ERR_FORMAT for text
 * that is not JSON (or not an object), AT_ERR_INVALID for a bad field. The
 * request must be released with at_serve_request_free either way. */
at_status at_serve_request_parse(const char *body, size_t len, at_request_kind kind, const at_request_limits *lim,
                                 at_serve_request *req);
void at_serve_request_free(at_serve_request *req);

#endif
