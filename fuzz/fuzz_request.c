/* Fuzz target: the body of a request to /v1/chat/completions,
 * /v1/completions or /v1/score (the first byte picks which) parsed into the
 * internal request, and the error or answer shapes built from it. Must not
 * crash or leak, whatever the bytes. */
#include <stdint.h>
#include <stdlib.h>
#include "serve/request.h"
#include "serve/response.h"
#include "serve/score_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] == '2') { /* /v1/score (seeds: score_*.json): at most 8 pairs */
        at_score_request sr;
        char *out = NULL;
        if (at_score_request_parse((const char *)data + 1, size - 1, 8, &sr) != AT_OK) {
            out = at_resp_error(at_last_error(), "invalid_request_error", sr.param, NULL);
        } else {
            double scores[8];
            long long tokens = 0;
            for (size_t i = 0; i < sr.n; i++) {
                scores[i] = (double)strlen(sr.prompts[i]) - (double)strlen(sr.replies[i]);
                tokens += (long long)strlen(sr.replies[i]);
            }
            out = at_resp_score("score-1", 0, sr.model ? sr.model : "m", scores, sr.n, tokens);
        }
        free(out);
        at_score_request_free(&sr);
        return 0;
    }
    at_request_kind kind = (data[0] & 1) ? AT_REQ_COMPLETION : AT_REQ_CHAT;
    at_request_limits lim = {4096, 4, 64, 2};
    at_serve_request req;
    char *out = NULL;
    if (at_serve_request_parse((const char *)data + 1, size - 1, kind, &lim, &req) != AT_OK) {
        out = at_resp_error(at_last_error(), "invalid_request_error", req.param, NULL);
    } else {
        at_usage u = {(int)req.n_prompt_ids, req.max_tokens, req.n_images - 1};
        const char *text = req.prompt ? req.prompt : (req.n_stop ? req.stop[0] : "");
        out = at_resp_full(kind, "id", 0, req.model ? req.model : "m", text, 0, "stop", u);
        free(out);
        out = at_resp_chunk(kind, "id", 0, req.model ? req.model : "m", 1, text, 0, NULL, &u, 0);
    }
    free(out);
    at_serve_request_free(&req);
    return 0;
}
