#include "serve/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "infer/vlm.h"
#include "serve/engine.h"
#include "serve/image_ref.h"
#include "serve/request.h"
#include "serve/response.h"
#include "serve/score_request.h"
#include "serve/webui.h"

/* How often a waiting handler looks whether its client is still there. */
#define POLL_MS 50

struct at_server {
    at_bundle *b;
    at_engine *engine;
    at_webui *ui;
    struct MHD_Daemon *daemon;
    int port;
    at_server_opts o;
    char *api_key;
    char *name;
    int context;
    pthread_mutex_t render_mu; /* chat templates render one at a time */
    atomic_int stopping;
    atomic_int in_flight; /* requests with a job whose answer is not yet sent */
    atomic_int open_conns; /* connections open now */
    atomic_ullong counter;
    char *media_dir;      /* o.allowed_local_media_path (a copy) */
};

/* Connections past max_connections (up to RESERVE_CONNECTIONS more) are the
 * reserve: they get /health only, and are closed after RESERVE_IDLE_S
 * without a byte. Idle clients from many addresses can fill max_connections
 * (the per-address limit cannot stop that), but the reserve turns over
 * every few seconds, so a monitor's /health is answered: the kernel queues
 * waiting connections in order, and the one that waited longest gets the
 * slot that frees. */
#define RESERVE_CONNECTIONS 4
#define RESERVE_IDLE_S 2
#define RESERVE_MARK ((void *)&reserve_mark)
static const char reserve_mark = 1;

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    at_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->open_conns, 1);
        return;
    }
    if (atomic_fetch_add(&s->open_conns, 1) >= s->o.max_connections) {
        *socket_context = RESERVE_MARK;
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)RESERVE_IDLE_S);
    }
}

static int in_reserve(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci && ci->socket_context == RESERVE_MARK;
}

/* ---- small helpers -------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *json)
{
    if (!json) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *message, const char *type,
                                   const char *param, const char *code)
{
    return reply(c, status, at_resp_error(message, type, param, code));
}

/* Whether the client has hung up (or reset) its side of the connection. */
static int peer_closed(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static long long unix_now(void) { return (long long)time(NULL); }

static void make_id(at_server *s, at_request_kind kind, char *out, size_t cap)
{
    unsigned long long n = atomic_fetch_add(&s->counter, 1);
    snprintf(out, cap, "%s-%llx%06llx", kind == AT_REQ_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             n & 0xffffffull);
}

/* finish_reason in OpenAI's values only (stop, length): an answer cut by the
 * server's shutdown or an error is "length" (cut short), after an error event
 * that says why. */
static const char *finish_name(at_finish_reason f)
{
    return f == AT_FINISH_STOP ? "stop" : "length";
}

#define SHUTDOWN_MESSAGE "the server is shutting down: this answer was cut short"

/* ---- streaming (server-sent events) ---------------------------------------------- */

typedef struct {
    at_server *s;
    at_job *job;
    struct MHD_Connection *conn;
    at_request_kind kind;
    char id[64];
    char model[128];
    long long created;
    int include_usage;
    int started; /* the first chunk (chat: the role) went out */
    int ended;   /* [DONE] went out */
    char *out;
    size_t out_len, out_pos;
} stream_ctx;

/* Appends "data: <json>\n\n" (json freed) to the pending output. */
static int sse_add(stream_ctx *c, char *json)
{
    if (!json) return 0;
    size_t n = strlen(json);
    char *p = realloc(c->out, c->out_len + n + 9);
    if (!p) {
        free(json);
        return 0;
    }
    c->out = p;
    memcpy(c->out + c->out_len, "data: ", 6);
    memcpy(c->out + c->out_len + 6, json, n);
    memcpy(c->out + c->out_len + 6 + n, "\n\n", 3);
    c->out_len += n + 8;
    free(json);
    return 1;
}

/* Fills c->out with the next events; 0 when the stream must end in error
 * (the client left, or out of memory). */
static int stream_next(stream_ctx *c)
{
    if (!c->started) {
        c->started = 1;
        if (c->kind == AT_REQ_CHAT)
            return sse_add(c, at_resp_chunk(c->kind, c->id, c->created, c->model, 1, "", 0, NULL, NULL, 0));
    }
    for (;;) {
        if (peer_closed(c->conn)) {
            at_job_cancel(c->job);
            return 0;
        }
        at_job_news nw;
        if (!at_job_wait(c->job, POLL_MS, &nw)) continue;
        int ok = 1;
        if (nw.len)
            ok = sse_add(c, at_resp_chunk(c->kind, c->id, c->created, c->model, 0, nw.text, nw.len, NULL, NULL, 0));
        free(nw.text);
        if (ok && nw.finished) {
            at_usage u = {nw.prompt_tokens, nw.completion_tokens, nw.cached_tokens};
            if (nw.finish == AT_FINISH_ERROR)
                ok = sse_add(c, at_resp_error(nw.error[0] ? nw.error : "generation failed", "server_error", NULL,
                                              NULL));
            else if (nw.finish == AT_FINISH_CANCELLED)
                ok = sse_add(c, at_resp_error(SHUTDOWN_MESSAGE, "server_error", NULL, NULL));
            if (ok)
                ok = sse_add(c, at_resp_chunk(c->kind, c->id, c->created, c->model, 0, c->kind == AT_REQ_CHAT ? NULL : "",
                                              0, finish_name(nw.finish), NULL, 0));
            if (ok && c->include_usage)
                ok = sse_add(c, at_resp_chunk(c->kind, c->id, c->created, c->model, 0, NULL, 0, NULL, &u, 1));
            if (ok) {
                char *done = strdup("[DONE]");
                ok = done && sse_add(c, done);
            }
            c->ended = 1;
        }
        if (!ok) return 0;
        if (c->out_len) return 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *c = cls;
    while (c->out_pos == c->out_len) {
        free(c->out);
        c->out = NULL;
        c->out_len = c->out_pos = 0;
        if (c->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_next(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->out_len - c->out_pos;
    if (n > max) n = max;
    memcpy(buf, c->out + c->out_pos, n);
    c->out_pos += n;
    return (ssize_t)n;
}

/* MHD calls this when the response goes away: answered, or the connection
 * closed under it. Either way the job is no longer wanted. */
static void stream_free(void *cls)
{
    stream_ctx *c = cls;
    at_job_cancel(c->job);
    at_job_release(c->job);
    free(c->out);
    free(c);
}

/* ---- completions -------------------------------------------------------------------- */

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
    int counted; /* counted in in_flight until the request completes */
} conn_ctx;

static enum MHD_Result parse_error(struct MHD_Connection *c, at_status st, const at_serve_request *req)
{
    if (st == AT_ERR_NOMEM) return reply_error(c, 500, "out of memory", "server_error", NULL, NULL);
    return reply_error(c, 400, at_last_error(), "invalid_request_error", req->param, NULL);
}

/* The images of a chat request, decoded and through the model's processor;
 * the message of an error names the image (its place in the request). */
static at_status load_images(at_server *s, const at_serve_request *req, at_vlm_images *im)
{
    for (int i = 0; i < req->n_images; i++) {
        at_image img = {0};
        char name[48];
        snprintf(name, sizeof name, "image %d of the request", i + 1);
        at_status st = at_serve_image_load(req->images[i], s->o.allowed_local_media_path, s->o.max_image_pixels, &img);
        if (st == AT_OK) st = at_vlm_images_add(s->b, &img, name, im);
        at_image_free(&img);
        if (st != AT_OK) return st == AT_ERR_NOMEM ? st : at_error_wrap(st, "%s", name);
    }
    return AT_OK;
}

static enum MHD_Result completions(at_server *s, struct MHD_Connection *c, conn_ctx *cc, at_request_kind kind)
{
    at_serve_request req;
    int32_t *ids = NULL;
    size_t n = 0;
    at_job *job = NULL;
    enum MHD_Result ret;
    char msg[400];
    at_request_limits lim = {s->o.max_tokens, AT_GEN_MAX_STOP, 1024, s->o.max_images};
    at_vlm_images images = {0};
    at_prompt_media media = {0};
    at_status st = at_serve_request_parse(cc->body ? cc->body : "", cc->len, kind, &lim, &req);
    if (st != AT_OK) {
        ret = parse_error(c, st, &req);
        goto done;
    }
    /* the model: the base (by its served name, or none given) or an adapter */
    at_adapter *adapter = NULL;
    const char *want = req.model && req.model[0] ? req.model : s->o.default_model;
    if (!want && s->o.model_required) {
        int k = snprintf(msg, sizeof msg, "The request names no `model` and adapters are loaded: say which of `%s`",
                         s->name);
        for (int i = 0; i < s->b->n_adapters && k > 0 && (size_t)k < sizeof msg; i++)
            k += snprintf(msg + k, sizeof msg - (size_t)k, ", `%s`", s->b->adapters[i].name);
        if (k > 0 && (size_t)k < sizeof msg)
            snprintf(msg + k, sizeof msg - (size_t)k, " (or start the server with --default_model NAME).");
        ret = reply_error(c, 400, msg, "invalid_request_error", "model", NULL);
        goto done;
    }
    if (want && strcmp(want, s->name)) {
        adapter = at_bundle_adapter_get(s->b, want);
        if (!adapter) {
            snprintf(msg, sizeof msg, "The model `%s` does not exist.", want);
            ret = reply_error(c, 404, msg, "invalid_request_error", "model", "model_not_found");
            goto done;
        }
    }
    if (kind == AT_REQ_CHAT && req.n_images) {
        if (!s->b->vision) {
            snprintf(msg, sizeof msg, "The model `%s` reads no images (it has no vision tower).", s->name);
            ret = reply_error(c, 400, msg, "invalid_request_error", "messages", "model_not_supported");
            goto done;
        }
        st = load_images(s, &req, &images);
        if (st != AT_OK) {
            ret = st == AT_ERR_NOMEM ? reply_error(c, 500, "out of memory", "server_error", NULL, NULL)
                                     : reply_error(c, 400, at_last_error(), "invalid_request_error", "messages", NULL);
            goto done;
        }
    }
    if (kind == AT_REQ_CHAT) {
        pthread_mutex_lock(&s->render_mu);
        st = at_vlm_encode_chat(s->b, req.messages, &images, &ids, &n);
        pthread_mutex_unlock(&s->render_mu);
        if (st == AT_OK && images.n) st = at_vlm_media(s->b, ids, n, &images, &media);
    } else if (req.prompt) {
        st = at_bundle_encode_text(s->b, req.prompt, &ids, &n);
    } else {
        n = req.n_prompt_ids;
        ids = malloc(n * sizeof *ids);
        st = ids ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
        if (ids) memcpy(ids, req.prompt_ids, n * sizeof *ids);
        for (size_t i = 0; st == AT_OK && i < n; i++)
            if (ids[i] >= s->b->decoder->cfg.vocab_size)
                st = at_error(AT_ERR_INVALID, "prompt token %zu (id %d) is outside the vocabulary of %d", i, ids[i],
                              s->b->decoder->cfg.vocab_size);
    }
    if (st != AT_OK) {
        ret = st == AT_ERR_NOMEM ? reply_error(c, 500, "out of memory", "server_error", NULL, NULL)
                                 : reply_error(c, 400, at_last_error(), "invalid_request_error",
                                               kind == AT_REQ_CHAT ? "messages" : "prompt", NULL);
        goto done;
    }
    if (n > (size_t)s->context - 1) {
        snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, your prompt has %zu "
                 "tokens.", s->context, n);
        ret = reply_error(c, 400, msg, "invalid_request_error", kind == AT_REQ_CHAT ? "messages" : "prompt",
                          "context_length_exceeded");
        goto done;
    }
    int room = s->context - (int)n, max_new;
    if (req.max_tokens > 0) {
        if (req.max_tokens > room) {
            snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, you requested %zu "
                     "tokens (%zu in the prompt, %d for the completion).", s->context, n + (size_t)req.max_tokens,
                     n, req.max_tokens);
            ret = reply_error(c, 400, msg, "invalid_request_error", "max_tokens", "context_length_exceeded");
            goto done;
        }
        max_new = req.max_tokens;
    } else {
        max_new = kind == AT_REQ_CHAT ? room : (s->o.default_max_tokens < room ? s->o.default_max_tokens : room);
    }
    at_gen_params gp = at_gen_params_default();
    gp.sampling = req.sampling;
    if (!req.has_seed) gp.sampling.seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + atomic_fetch_add(&s->counter, 1);
    gp.max_new_tokens = max_new;
    gp.stop = (const char *const *)req.stop;
    gp.n_stop = req.n_stop;
    gp.stop_ids = s->b->stop_ids;
    gp.n_stop_ids = s->b->n_stop_ids;
    gp.adapter = adapter;
    gp.continues_prompt = kind != AT_REQ_CHAT;
    st = at_sampling_validate(&gp.sampling);
    if (st != AT_OK) {
        ret = reply_error(c, 400, at_last_error(), "invalid_request_error", NULL, NULL);
        goto done;
    }
    st = at_engine_submit_media(s->engine, ids, n, images.n ? &images : NULL, images.n ? &media : NULL, &gp, &job);
    if (st != AT_OK) {
        ret = reply_error(c, 503, at_last_error(), "server_error", NULL, NULL);
        goto done;
    }
    atomic_fetch_add(&s->in_flight, 1);
    cc->counted = 1;

    const char *model = want ? want : s->name;
    if (req.stream) {
        stream_ctx *sc = calloc(1, sizeof *sc);
        if (!sc) {
            at_job_cancel(job);
            ret = MHD_NO;
            goto done;
        }
        sc->s = s;
        sc->job = job;
        job = NULL; /* owned by the stream now */
        sc->conn = c;
        sc->kind = kind;
        make_id(s, kind, sc->id, sizeof sc->id);
        snprintf(sc->model, sizeof sc->model, "%s", model);
        sc->created = unix_now();
        sc->include_usage = req.include_usage;
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sc,
                                                                   stream_free);
        if (!r) {
            stream_free(sc);
            ret = MHD_NO;
            goto done;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        goto done;
    }

    /* whole answer: wait for the end, watching the client */
    char *text = NULL;
    size_t len = 0;
    at_job_news nw;
    for (;;) {
        if (peer_closed(c)) {
            at_job_cancel(job);
            free(text);
            ret = MHD_NO;
            goto done;
        }
        if (!at_job_wait(job, POLL_MS, &nw)) continue;
        if (nw.len) {
            char *p = realloc(text, len + nw.len + 1);
            if (!p) {
                free(nw.text);
                free(text);
                at_job_cancel(job);
                ret = reply_error(c, 500, "out of memory", "server_error", NULL, NULL);
                goto done;
            }
            text = p;
            memcpy(text + len, nw.text, nw.len);
            len += nw.len;
            text[len] = 0;
        }
        free(nw.text);
        if (nw.finished) break;
    }
    if (nw.finish == AT_FINISH_ERROR) {
        ret = reply_error(c, 500, nw.error[0] ? nw.error : "generation failed", "server_error", NULL, NULL);
    } else if (nw.finish == AT_FINISH_CANCELLED) {
        ret = reply_error(c, 503, SHUTDOWN_MESSAGE, "server_error", NULL, NULL);
    } else {
        char id[64];
        make_id(s, kind, id, sizeof id);
        at_usage u = {nw.prompt_tokens, nw.completion_tokens, nw.cached_tokens};
        ret = reply(c, 200, at_resp_full(kind, id, unix_now(), model, text, len, finish_name(nw.finish), u));
    }
    free(text);
done:
    at_job_release(job);
    free(ids);
    at_vlm_media_free(&media);
    at_vlm_images_free(&images);
    at_serve_request_free(&req);
    return ret;
}

/* ---- scores (a reward model) ------------------------------------------------------------ */

static enum MHD_Result scores(at_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    at_score_request req;
    int32_t **seqs = NULL;
    size_t *lens = NULL;
    double *out = NULL;
    enum MHD_Result ret;
    char msg[400];
    at_status st = at_score_request_parse(cc->body ? cc->body : "", cc->len, (size_t)s->o.max_score_pairs, &req);
    if (st != AT_OK) {
        ret = st == AT_ERR_NOMEM ? reply_error(c, 500, "out of memory", "server_error", NULL, NULL)
                                 : reply_error(c, 400, at_last_error(), "invalid_request_error", req.param, NULL);
        goto done;
    }
    if (req.model && req.model[0] && strcmp(req.model, s->name)) {
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", req.model);
        ret = reply_error(c, 404, msg, "invalid_request_error", "model", "model_not_found");
        goto done;
    }
    seqs = calloc(req.n, sizeof *seqs);
    lens = calloc(req.n, sizeof *lens);
    out = calloc(req.n, sizeof *out);
    if (!seqs || !lens || !out) {
        ret = reply_error(c, 500, "out of memory", "server_error", NULL, NULL);
        goto done;
    }
    long long tokens = 0;
    int context = at_reward_model_context(s->o.reward_model);
    for (size_t i = 0; i < req.n; i++) {
        cJSON *prompt = cJSON_CreateString(req.prompts[i]);
        pthread_mutex_lock(&s->render_mu);
        st = prompt ? at_reward_model_encode(s->o.reward_model, prompt, req.replies[i], &seqs[i], &lens[i])
                    : at_error(AT_ERR_NOMEM, "out of memory");
        pthread_mutex_unlock(&s->render_mu);
        cJSON_Delete(prompt);
        if (st == AT_ERR_NOMEM) {
            ret = reply_error(c, 500, "out of memory", "server_error", NULL, NULL);
            goto done;
        }
        if (st != AT_OK) {
            snprintf(msg, sizeof msg, "pair %zu: %.300s", i, at_last_error());
            ret = reply_error(c, 400, msg, "invalid_request_error", "text_2", NULL);
            goto done;
        }
        if (lens[i] > (size_t)context) {
            snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, pair %zu has %zu "
                     "tokens.", context, i, lens[i]);
            ret = reply_error(c, 400, msg, "invalid_request_error", "text_2", "context_length_exceeded");
            goto done;
        }
        tokens += (long long)lens[i];
    }
    atomic_fetch_add(&s->in_flight, 1);
    cc->counted = 1;
    st = at_reward_model_score_ids(s->o.reward_model, (const int32_t *const *)seqs, lens, req.n, out);
    if (st != AT_OK) {
        ret = reply_error(c, 500, at_last_error(), "server_error", NULL, NULL);
        goto done;
    }
    char id[64];
    unsigned long long k = atomic_fetch_add(&s->counter, 1);
    snprintf(id, sizeof id, "score-%llx%06llx", (unsigned long long)time(NULL), k & 0xffffffull);
    ret = reply(c, 200, at_resp_score(id, unix_now(), req.model && req.model[0] ? req.model : s->name, out, req.n,
                                      tokens));
done:
    for (size_t i = 0; seqs && i < req.n; i++) free(seqs[i]);
    free(seqs);
    free(lens);
    free(out);
    at_score_request_free(&req);
    return ret;
}

/* ---- routing ------------------------------------------------------------------------ */

static int authorized(at_server *s, struct MHD_Connection *c);

/* The web UI's urls (serve/webui.h). */
static enum MHD_Result web_ui(at_server *s, struct MHD_Connection *c, conn_ctx *cc, const char *url,
                              const char *method)
{
    if (cc->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o.max_body_bytes);
        return reply_error(c, 413, msg, "invalid_request_error", NULL, "request_too_large");
    }
    at_webui_request rq = {
        .method = method,
        .url = url,
        .body = cc->body,
        .len = cc->len,
        .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
        .origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
        .host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
        .since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since"),
        .authorized = authorized(s, c),
    };
    at_webui_reply wr;
    if (!at_webui_handle(s->ui, &rq, &wr)) return MHD_NO;
    struct MHD_Response *r =
        wr.owned ? MHD_create_response_from_buffer(wr.len, wr.owned, MHD_RESPMEM_MUST_FREE)
                 : MHD_create_response_from_buffer(wr.len, (void *)wr.body, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(wr.owned);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", wr.content_type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (!strncmp(wr.content_type, "text/html", 9)) {
        /* everything comes from this server; no inline script, no frames */
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                                "form-action 'none'");
        MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)wr.status, r);
    MHD_destroy_response(r);
    return ret;
}

static int authorized(at_server *s, struct MHD_Connection *c)
{
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7;
    size_t a = strlen(k), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    at_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->too_large) return MHD_YES;
        if (cc->len + n > s->o.max_body_bytes) {
            cc->too_large = 1;
            return MHD_YES;
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t cap = cc->cap ? cc->cap : 4096;
            while (cap < cc->len + n + 1) cap *= 2;
            char *p = realloc(cc->body, cap);
            if (!p) return MHD_NO;
            cc->body = p;
            cc->cap = cap;
        }
        memcpy(cc->body + cc->len, upload, n);
        cc->len += n;
        cc->body[cc->len] = 0;
        return MHD_YES;
    }
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!is_get) return reply_error(c, 405, "use GET", "invalid_request_error", NULL, NULL);
        at_engine_stats st;
        at_engine_get_stats(s->engine, &st);
        char *j = malloc(320);
        if (!j) return MHD_NO;
        int stopping = atomic_load(&s->stopping);
        snprintf(j, 320, "{\"status\":\"%s\",\"running\":%d,\"waiting\":%d,\"max_batch_size\":%d,\"peak_batch\":%d,"
                 "\"steps\":%lld,\"tokens\":%lld,\"images_encoded\":%lld,\"cached_tokens\":%lld}",
                 stopping ? "stopping" : "ok", st.running, st.waiting, st.max_batch, st.peak_batch, st.steps, st.tokens,
                 st.images_encoded, st.cached_tokens);
        return reply(c, stopping ? 503 : 200, j);
    }
    if (in_reserve(c)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the server holds its %d connections: retry later (this connection, one of its "
                 "reserve, answers /health only)", s->o.max_connections);
        struct MHD_Response *r = NULL;
        char *j = at_resp_error(msg, "server_error", NULL, "server_busy");
        if (j) r = MHD_create_response_from_buffer(strlen(j), j, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            free(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Retry-After", "2");
        MHD_add_response_header(r, "Connection", "close");
        enum MHD_Result ret = MHD_queue_response(c, 503, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (at_webui_owns(url)) return web_ui(s, c, cc, url, method);
    int is_models = !strcmp(url, "/v1/models"), is_chat = !strcmp(url, "/v1/chat/completions"),
        is_cmpl = !strcmp(url, "/v1/completions"), is_score = !strcmp(url, "/v1/score") || !strcmp(url, "/score");
    if (!is_models && !is_chat && !is_cmpl && !is_score) {
        char msg[300];
        snprintf(msg, sizeof msg, "no such endpoint: %.200s %.60s", method, url);
        return reply_error(c, 404, msg, "invalid_request_error", NULL, "not_found");
    }
    if (!authorized(s, c))
        return reply_error(c, 401, "Incorrect or missing API key (send Authorization: Bearer KEY).",
                           "invalid_request_error", NULL, "invalid_api_key");
    if (is_models) {
        if (!is_get) return reply_error(c, 405, "use GET", "invalid_request_error", NULL, NULL);
        const char *names[AT_BUNDLE_MAX_ADAPTERS];
        for (int i = 0; i < s->b->n_adapters; i++) names[i] = s->b->adapters[i].name;
        /* the model of a request that names none (null: such a request is refused) */
        const char *def = s->o.default_model ? s->o.default_model : s->o.model_required ? NULL : s->name;
        return reply(c, 200, at_resp_models(s->name, names, s->b->n_adapters, def, unix_now()));
    }
    if (!is_post) return reply_error(c, 405, "use POST", "invalid_request_error", NULL, NULL);
    if (cc->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o.max_body_bytes);
        return reply_error(c, 413, msg, "invalid_request_error", NULL, "request_too_large");
    }
    if (atomic_load(&s->stopping))
        return reply_error(c, 503, "the server is shutting down", "server_error", NULL, NULL);
    if (is_score != (s->o.reward_model != NULL)) {
        char msg[400];
        if (is_score)
            snprintf(msg, sizeof msg, "The model `%.200s` does not support the Score API: it is a generative model "
                     "(serve a reward model: a sequence-classification folder or an rm checkpoint).", s->name);
        else
            snprintf(msg, sizeof msg, "The model `%.200s` is a reward model: it scores (prompt, reply) pairs at "
                     "POST /v1/score and does not generate text.", s->name);
        return reply_error(c, 400, msg, "invalid_request_error", "model", "model_not_supported");
    }
    if (is_score) return scores(s, c, cc);
    return completions(s, c, cc, is_chat ? AT_REQ_CHAT : AT_REQ_COMPLETION);
}

/* MHD calls this when a request is over: its answer sent, or the connection gone. */
static void request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc)
{
    at_server *s = cls;
    (void)c;
    (void)tc;
    conn_ctx *cc = *con_cls;
    if (cc) {
        if (cc->counted) atomic_fetch_sub(&s->in_flight, 1);
        free(cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

/* ---- start and stop ------------------------------------------------------------------- */

static void server_free(at_server *s)
{
    free(s->api_key);
    free(s->name);
    free(s->media_dir);
    pthread_mutex_destroy(&s->render_mu);
    free(s);
}

at_status at_server_start(at_bundle *b, const at_server_opts *o, at_server **out)
{
    *out = NULL;
    at_server *s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->render_mu, NULL);
    at_status st = AT_OK;
    s->b = b;
    s->o = *o;
    s->context = at_bundle_context(b, o->max_model_len);
    if (s->o.max_batch_size < 1) s->o.max_batch_size = 1;
    if (s->o.max_tokens <= 0 || s->o.max_tokens > s->context) s->o.max_tokens = s->context;
    if (s->o.default_max_tokens <= 0) s->o.default_max_tokens = 16;
    if (!s->o.max_body_bytes) s->o.max_body_bytes = b->vision ? 20u << 20 : 1u << 20;
    if (s->o.max_queue <= 0) s->o.max_queue = 64;
    if (s->o.max_score_pairs <= 0) s->o.max_score_pairs = 256;
    if (s->o.max_connections <= 0) s->o.max_connections = 256;
    if (s->o.max_connections_per_client <= 0)
        s->o.max_connections_per_client = s->o.max_connections >= 4 ? s->o.max_connections / 4 : 1;
    if (s->o.idle_timeout_s <= 0) s->o.idle_timeout_s = 30;
    s->name = strdup(o->served_model_name && o->served_model_name[0] ? o->served_model_name : b->name);
    s->api_key = o->api_key && o->api_key[0] ? strdup(o->api_key) : NULL;
    s->o.api_key = NULL;
    s->o.served_model_name = NULL;
    s->media_dir = o->allowed_local_media_path && o->allowed_local_media_path[0] ? strdup(o->allowed_local_media_path)
                                                                                  : NULL;
    s->o.allowed_local_media_path = s->media_dir;
    if (s->media_dir && !at_is_dir(s->media_dir)) {
        st = at_error(AT_ERR_NOT_FOUND, "--allowed_local_media_path %s: no such folder", s->media_dir);
        goto done;
    }
    if (!s->name || (o->api_key && o->api_key[0] && !s->api_key)) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    const char *host = o->host && o->host[0] ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        st = at_error(AT_ERR_INVALID, "--host %s: not an IPv4 address", host);
        goto done;
    }
    if (o->port < 0 || o->port > 65535) {
        st = at_error(AT_ERR_INVALID, "--port %d: not a port number", o->port);
        goto done;
    }
    at_webui_opts wo = {o->webui_train, o->webui_train_program, s->api_key != NULL, host};
    AT_CHECK(at_webui_new(&wo, &s->ui));
    s->o.webui_train_program = NULL;
    AT_CHECK(at_engine_start(b, s->o.max_batch_size, s->context, s->o.max_queue, &s->engine));
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
                                     MHD_USE_ITC,
                                 (uint16_t)o->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, &addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, request_done, s, MHD_OPTION_NOTIFY_CONNECTION,
                                 on_connection, s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)(s->o.max_connections + RESERVE_CONNECTIONS),
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                 (unsigned)s->o.max_connections_per_client, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)s->o.idle_timeout_s, MHD_OPTION_END);
    if (!s->daemon) {
        st = at_error(AT_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)", host, o->port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
done:
    if (st != AT_OK) {
        at_engine_free(s->engine);
        at_webui_free(s->ui, 5);
        server_free(s);
        return st;
    }
    *out = s;
    return AT_OK;
}

int at_server_port(const at_server *s) { return s->port; }

void at_server_stop(at_server *s, double grace_s)
{
    if (!s) return;
    atomic_store(&s->stopping, 1);
    /* no new connections; the ones open finish their requests */
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    /* running and waiting jobs finish (or are cancelled after grace_s); their
     * handlers then answer and return */
    at_engine_stop(s->engine, grace_s);
    /* the answers of those jobs are still being sent: let them go out before
     * the connections close (a few seconds at most) */
    for (int i = 0; i < 500 && atomic_load(&s->in_flight) > 0; i++) usleep(10000);
    MHD_stop_daemon(s->daemon);
    at_engine_free(s->engine);
    /* a training job started from the page stops with the server */
    at_webui_free(s->ui, 5);
    server_free(s);
}
