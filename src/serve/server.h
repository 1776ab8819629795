/* anytune serve: an OpenAI-compatible HTTP API on libmicrohttpd.
 *
 *   POST /v1/chat/completions   messages through the chat template
 *   POST /v1/completions        raw prompt continuation
 *   GET  /v1/models             the base model and each adapter by name
 *   POST /v1/score (and /score) a reward model's scores of (prompt, reply)
 *                               pairs, vLLM's Score API (serve/score_request.h);
 *                               the two above refuse a reward model, this one a
 *                               generative model (400, code model_not_supported)
 *   GET  /health                {"status": "ok", running/waiting counts, images_encoded,
 *                               cached_tokens (the prefix cache's work)}
 *   GET  /, /ui/...             the web UI: a chat page; with webui_train also
 *                               the Train tab and its endpoints (serve/webui.h)
 *
 * A vision-language model (the bundle has a vision tower) takes images in
 * chat content lists (serve/request.h, serve/image_ref.h); usage then says
 * prompt_tokens_details.cached_tokens, the prompt tokens the prefix cache
 * held (infer/scheduler.h).
 *
 * Streaming answers are server-sent events ("data: {chunk}\n\n" ... "data:
 * [DONE]\n\n"). Every request runs on the engine (engine.h): concurrent
 * requests are decoded together in one batch. Errors are OpenAI's
 * {"error": {...}} with the HTTP status: 400 bad input (malformed JSON,
 * bad fields, a prompt or max_tokens over the limits), 401 a missing or
 * wrong API key, 404 an unknown path or model, 405 a wrong method, 413 a
 * body over the limit, 503 busy or shutting down, 500 a failure while
 * generating. A client that goes away mid-answer is noticed (the socket
 * hangs up) and its slot freed.
 *
 * Each connection has its own thread (MHD_USE_THREAD_PER_CONNECTION), so a
 * handler may block while it waits for tokens. */
#ifndef AT_SERVE_SERVER_H
#define AT_SERVE_SERVER_H

#include <stddef.h>
#include "base/status.h"
#include "infer/bundle.h"
#include "train/reward_model.h"

typedef struct at_server_opts {
    const char *host;         /* numeric IPv4 address; NULL: 127.0.0.1 */
    int port;                 /* 0: any free port (see at_server_port) */
    int max_batch_size;       /* sequences decoded together (>= 1) */
    int max_model_len;        /* tokens per sequence (prompt + answer); 0: from the model */
    int max_tokens;           /* the largest max_tokens accepted; 0: max_model_len */
    int default_max_tokens;   /* when a completions request gives none (chat: the rest of the context); 0: 16 */
    size_t max_body_bytes;    /* 0: 1 MiB (20 MiB for a vision-language model: images come inline) */
    int max_queue;            /* requests waiting for a slot; 0: 64 */
    int max_connections;      /* 0: 256; a reserve of 4 more serves /health only (server.c) */
    int max_connections_per_client; /* connections one client address may hold; 0: a quarter of max_connections,
                                       so one client cannot take them all (and /health answers the others) */
    int idle_timeout_s;       /* a connection with no byte from its client for this long (an idle keep-alive, a
                                 stalled request) is closed; answers being generated do not count; 0: 30 */
    const char *api_key;      /* NULL: no authentication */
    const char *served_model_name; /* NULL: the bundle's name */
    const char *default_model;  /* the model of requests that name none: the base's name or an adapter's; NULL:
                                   the base */
    int model_required;         /* a request that names no model (and no default_model) is refused, listing
                                   the names (serve with adapters: which one is meant is not guessed) */
    at_reward_model *reward_model; /* the bundle's reward model (borrowed; NULL: a generative model) */
    int max_score_pairs;      /* pairs one /v1/score request may hold; 0: 256 */
    const char *allowed_local_media_path; /* image files of requests are read only under this folder; NULL: none
                                 (data: URLs only; serve/image_ref.h) */
    uint64_t max_image_pixels; /* an image with more pixels is refused (400); 0: the decoder's limit */
    int max_images;           /* images in one request; 0: AT_SERVE_MAX_IMAGES */
    int webui_train;          /* `anytune web-ui`: the Train tab starts `anytune sft` jobs */
    const char *webui_train_program; /* what those jobs run; NULL: this program (/proc/self/exe) */
} at_server_opts;

typedef struct at_server at_server;

/* Starts listening and the engine. b is borrowed and must outlive the
 * server. Caller stops it with at_server_stop. */
at_status at_server_start(at_bundle *b, const at_server_opts *o, at_server **out);

/* The port it listens on. */
int at_server_port(const at_server *s);

/* Graceful stop: stops accepting connections, lets requests in flight
 * finish for up to grace_s seconds (then cancels them: a stream gets an
 * error event and finish_reason "length", a whole answer a 503), closes every connection, stops a running
 * train job of the web UI (SIGTERM) and frees s. NULL ok. */
void at_server_stop(at_server *s, double grace_s);

#endif
