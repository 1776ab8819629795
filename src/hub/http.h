/* HTTP for the hubs (libcurl): JSON API calls and parallel, resumable file
 * downloads.
 *
 * A download goes to `part` (appending: an existing part is resumed with a
 * Range request), is checked (size, and sha256 when given) and only then
 * renamed to `dest`, so a file at `dest` is always whole. Redirects are
 * followed (at most 8); the token goes only to the host of the first URL
 * (curl drops a custom Authorization header when a redirect leaves the
 * host). Transient failures (connection errors, a transfer cut short,
 * HTTP 408/429/5xx, a stalled transfer) are retried with exponential backoff;
 * 401/403/404 and a full disk are final. */
#ifndef AT_HUB_HTTP_H
#define AT_HUB_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef struct {
    const char *token;    /* sent as "Authorization: Bearer TOKEN", or NULL */
    int max_parallel;     /* files at once (default 8) */
    int max_retries;      /* tries after the first (default 5) */
    double backoff_s;     /* first wait between tries (default 0.5), doubled each time */
    int quiet;            /* no progress output */
} at_http_options;

/* What a failed request answered, for messages that say what to do. */
typedef struct {
    long status;          /* HTTP status; 0 when no answer came */
    char error_code[64];  /* the hub's X-Error-Code header (e.g. "RevisionNotFound"), or "" */
    char error_text[256]; /* its X-Error-Message header, or "" */
} at_http_reply;

/* GETs url and parses the body as JSON. Non-2xx: AT_ERR_NOT_FOUND for 404,
 * AT_ERR_INVALID for 401/403, AT_ERR_IO otherwise, with *reply filled so the
 * caller can say more. Caller owns *out. */
at_status at_http_get_json(const at_http_options *o, const char *url, cJSON **out, at_http_reply *reply);

/* HEADs url without following a redirect (the Hub answers a large file's
 * resolve with a 302 that carries its metadata) and reports the file's
 * identity: X-Linked-Etag, else ETag (quotes and W/ removed) into etag, and
 * X-Linked-Size, else Content-Length, into *size (-1 when absent). */
at_status at_http_head(const at_http_options *o, const char *url, char etag[96], long long *size,
                       at_http_reply *reply);

typedef struct {
    const char *url;
    const char *part;   /* the partial file (created, appended to, removed on a failed check) */
    const char *dest;   /* where the checked file is renamed to */
    const char *lock;   /* a lock file held while this file downloads (other processes wait), or NULL */
    const char *sha256; /* 64 lowercase hex digits, or NULL: not checked */
    int64_t size;       /* expected size, or -1 */
    const char *label;  /* the name shown in progress and messages */
} at_http_file;

/* Downloads the files (skipping those whose dest exists), several at once,
 * with a progress line per finished file and a total bar. On a final error
 * the message names the file and what to do; *reply (may be NULL) says what
 * the server answered. Completed files stay in place either way. */
at_status at_http_download(const at_http_options *o, const at_http_file *files, size_t n, at_http_reply *reply);

#endif
