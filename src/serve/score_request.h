/* The body of POST /v1/score (also /score), vLLM's Score API as a reward
 * model answers it, and its answer.
 *
 *   {"model": "NAME", "text_1": "prompt" | ["prompt", ...],
 *                     "text_2": "reply" | ["reply", ...]}
 *
 * text_1 holds the prompts (each one user message), text_2 the replies: one
 * prompt with N replies scores the N pairs (prompt, reply_i); N prompts with
 * N replies score them pairwise. The answer:
 *
 *   {"id": "score-...", "object": "list", "created", "model",
 *    "data": [{"index": i, "object": "score", "score": r_i}, ...],
 *    "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0}}
 *
 * score is the reward model's raw output at the pair's last token (transformers'
 * logits[0] of a one-label *ForSequenceClassification; Bradley–Terry: the
 * probability that reply a is preferred to reply b is σ(r_a − r_b)), not a
 * sigmoid of it. Unknown fields are ignored, as vLLM does. The parser needs
 * no model and is fuzzed (fuzz/fuzz_request.c). */
#ifndef AT_SERVE_SCORE_REQUEST_H
#define AT_SERVE_SCORE_REQUEST_H

#include <stddef.h>
#include "base/status.h"

typedef struct at_score_request {
    char *model;            /* NULL when absent */
    char **prompts;         /* [n] (a single text_1 repeated by reference: free only through at_score_request_free) */
    char **replies;         /* [n] */
    size_t n;
    char param[32];         /* on failure: the offending field ("" when none) */
} at_score_request;

/* Parses body[0..len), at most max_pairs pairs. On failure the message says
 * what is wrong and req->param names the field; AT_ERR_FORMAT for text that is
 * not a JSON object, AT_ERR_INVALID for a bad field. Free req either way. */
at_status at_score_request_parse(const char *body, size_t len, size_t max_pairs, at_score_request *req);
void at_score_request_free(at_score_request *req);

/* The answer (a new string, free(); NULL when out of memory). */
char *at_resp_score(const char *id, long long created, const char *model, const double *scores, size_t n,
                    long long prompt_tokens);

#endif
