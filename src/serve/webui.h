/* The web UI: a chat page (and, for `anytune web-ui`, a Train tab) served
 * by the HTTP server next to the OpenAI API.
 *
 *   GET  /                        the page (web/index.html)
 *   GET  /ui/NAME                 its files (web/NAME: .css, .js, ...)
 *   GET  /ui/api/config           {"train": bool, "auth": bool, "defaults": {...}}
 *   POST /ui/api/train            start `anytune sft` with the JSON body's options (webui_train.h)
 *   GET  /ui/api/train/status     the job: state, pid, run folder, output, logging rows (?since=N)
 *   POST /ui/api/train/stop       SIGTERM to the job
 *
 * The page's files live in web/ in the source tree and are compiled into
 * the program at build time (web/embed.cmake writes webui_assets.c), so the
 * page works offline and needs nothing beside the binary. The page and its
 * files need no API key (the page takes it from its URL's ?token=, which
 * `anytune web-ui` prints, or asks for it); the train endpoints need it
 * when the server has one (web-ui always has one), accept only JSON bodies (a cross-site form
 * cannot send one without a CORS preflight, which is never granted),
 * refuse an Origin other than the server's own, and refuse a Host header
 * that names neither a loopback address nor the address the server listens
 * on (a DNS-rebinding page is same-origin under a foreign name). Errors are OpenAI-shaped
 * {"error": {"message", "type", "param", "code"}}.
 *
 * This module knows nothing of the HTTP library: the server passes the
 * request's parts in and sends the reply out. */
#ifndef AT_SERVE_WEBUI_H
#define AT_SERVE_WEBUI_H

#include <stddef.h>
#include "base/status.h"

typedef struct at_webui_opts {
    int train;                 /* the Train tab and /ui/api/train* */
    const char *train_program; /* what the train job runs; NULL: /proc/self/exe */
    int auth;                  /* the server wants an API key (the page shows its field) */
    const char *bind_host;     /* the IPv4 address the server listens on (copied); NULL: 127.0.0.1 */
} at_webui_opts;

typedef struct at_webui_request {
    const char *method, *url; /* url without the query string */
    const char *body;         /* may be NULL */
    size_t len;
    const char *content_type, *origin, *host; /* headers, NULL when absent */
    const char *since;        /* ?since=N of the status request, or NULL */
    int authorized;           /* the request carries the right key (or none is needed) */
} at_webui_request;

typedef struct at_webui_reply {
    int status;
    const char *content_type;
    const void *body; /* static (embedded file) or `owned` */
    size_t len;
    char *owned;      /* the caller frees it after sending; NULL for static bodies */
} at_webui_reply;

typedef struct at_webui at_webui;

/* Caller frees with at_webui_free. */
at_status at_webui_new(const at_webui_opts *o, at_webui **out);

/* Stops a running train job (SIGTERM, SIGKILL after grace_s) and frees ui. NULL ok. */
void at_webui_free(at_webui *ui, double grace_s);

/* Whether url belongs to the UI ("/" or "/ui/..."). */
int at_webui_owns(const char *url);

/* Answers a request for a UI url into *r (r->owned to be freed by the
 * caller). Returns 0 when out of memory (nothing to send). */
int at_webui_handle(at_webui *ui, const at_webui_request *rq, at_webui_reply *r);

/* The embedded file web/NAME: 1 and its bytes (static) when there is one.
 * Defined in the generated webui_assets.c. */
int at_webui_asset(const char *name, const unsigned char **data, size_t *len);

#endif
