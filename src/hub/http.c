#include "hub/http.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "base/json.h"
#include "base/progress.h"
#include "base/sha256.h"

#define MAX_JSON_BYTES ((size_t)64 << 20)

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static int opt_parallel(const at_http_options *o) { return o && o->max_parallel > 0 ? o->max_parallel : 8; }
static int opt_retries(const at_http_options *o) { return o && o->max_retries > 0 ? o->max_retries : 5; }
static double opt_backoff(const at_http_options *o) { return o && o->backoff_s > 0 ? o->backoff_s : 0.5; }

/* One header value into dst (without quotes or a weak W/ prefix). */
static void header_value(const char *v, size_t vl, char *dst, size_t cap)
{
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    if (vl >= 2 && v[0] == 'W' && v[1] == '/') v += 2, vl -= 2;
    if (vl >= 2 && v[0] == '"' && v[vl - 1] == '"') v++, vl -= 2;
    if (vl >= cap) vl = cap - 1;
    memcpy(dst, v, vl);
    dst[vl] = '\0';
}

/* Headers of the answer being received: the hub's error code and message. */
static size_t on_header(char *buf, size_t size, size_t n, void *ctx)
{
    at_http_reply *r = ctx;
    size_t len = size * n;
    static const struct {
        const char *name;
        size_t off, cap;
    } keep[] = {{"x-error-code:", offsetof(at_http_reply, error_code), sizeof r->error_code},
                {"x-error-message:", offsetof(at_http_reply, error_text), sizeof r->error_text}};
    if (len >= 5 && !strncmp(buf, "HTTP/", 5)) { /* a new answer (after a redirect): forget the last one's */
        r->error_code[0] = r->error_text[0] = '\0';
        return len;
    }
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
        size_t kl = strlen(keep[k].name);
        if (len > kl && !strncasecmp(buf, keep[k].name, kl))
            header_value(buf + kl, len - kl, (char *)r + keep[k].off, keep[k].cap);
    }
    return len;
}

static struct curl_slist *auth_header(const at_http_options *o)
{
    if (!o || !o->token || !*o->token) return NULL;
    char *h = malloc(strlen(o->token) + 32);
    if (!h) return NULL;
    sprintf(h, "Authorization: Bearer %s", o->token);
    struct curl_slist *l = curl_slist_append(NULL, h);
    free(h);
    return l;
}

static void common_setup(CURL *c, const char *url, struct curl_slist *hdr, at_http_reply *reply)
{
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 8L);
    curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "anytune");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, reply);
}

static int transient(CURLcode cc, long status)
{
    if (cc == CURLE_OK) return status == 408 || status == 429 || status >= 500;
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_PARTIAL_FILE || cc == CURLE_OPERATION_TIMEDOUT ||
           cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR || cc == CURLE_GOT_NOTHING ||
           cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_HTTP2 ||
           cc == CURLE_HTTP2_STREAM;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Final errors by HTTP status. */
static at_status status_error(long status, const char *what)
{
    if (status == 404) return at_error(AT_ERR_NOT_FOUND, "%s: not found (HTTP 404)", what);
    if (status == 401 || status == 403) return at_error(AT_ERR_INVALID, "%s: access denied (HTTP %ld)", what, status);
    return at_error(AT_ERR_IO, "%s: HTTP %ld", what, status);
}

typedef struct {
    char *buf;
    size_t len;
} membuf;

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    membuf *m = ctx;
    size_t len = size * n;
    if (m->len + len > MAX_JSON_BYTES) return 0;
    char *nb = realloc(m->buf, m->len + len + 1);
    if (!nb) return 0;
    memcpy(nb + m->len, data, len);
    m->buf = nb;
    m->len += len;
    m->buf[m->len] = '\0';
    return len;
}

/* One request to url, tried again after transient failures (waits doubling
 * from the backoff): `setup` prepares each try's fresh handle (and resets
 * ctx); an answer below `ok_below` (and at least 200) ends it. */
static at_status perform(const at_http_options *o, const char *url, at_http_reply *reply, long ok_below,
                         void (*setup)(CURL *c, void *ctx), void *ctx)
{
    at_http_reply local;
    if (!reply) reply = &local;
    memset(reply, 0, sizeof *reply);
    pthread_once(&curl_once, curl_init);
    struct curl_slist *hdr = auth_header(o);
    at_status st = AT_OK;
    double wait = opt_backoff(o);
    for (int attempt = 0;; attempt++) {
        CURL *c = curl_easy_init();
        if (!c) {
            st = at_error(AT_ERR_NOMEM, "cannot start an HTTP request");
            break;
        }
        common_setup(c, url, hdr, reply);
        setup(c, ctx);
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
        reply->status = cc == CURLE_OK ? status : 0;
        if (cc == CURLE_OK && status >= 200 && status < ok_below) break;
        if (transient(cc, status) && attempt < opt_retries(o)) {
            sleep_s(wait);
            wait *= 2;
            continue;
        }
        st = cc != CURLE_OK ? at_error(AT_ERR_IO, "%s: %s", url, curl_easy_strerror(cc)) : status_error(status, url);
        break;
    }
    curl_slist_free_all(hdr);
    return st;
}

static void setup_get(CURL *c, void *ctx)
{
    membuf *m = ctx;
    free(m->buf);
    m->buf = NULL;
    m->len = 0;
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, m);
}

at_status at_http_get_json(const at_http_options *o, const char *url, cJSON **out, at_http_reply *reply)
{
    membuf m = {0};
    *out = NULL;
    at_status st = perform(o, url, reply, 300, setup_get, &m);
    if (st == AT_OK) {
        /* strict: a reply with data after the value is refused, not half read */
        st = m.buf ? at_json_parse(m.buf, m.len, url, out) : at_error(AT_ERR_FORMAT, "%s: an empty answer", url);
    }
    free(m.buf);
    return st;
}

typedef struct {
    at_http_reply *reply;
    char etag[96], linked_etag[96];
    long long size, linked_size;
} head_info;

static size_t on_head_header(char *buf, size_t size, size_t n, void *ctx)
{
    head_info *h = ctx;
    size_t len = size * n;
    static const char *const names[] = {"etag:", "x-linked-etag:", "content-length:", "x-linked-size:"};
    if (len >= 5 && !strncmp(buf, "HTTP/", 5)) h->etag[0] = h->linked_etag[0] = '\0';
    for (int k = 0; k < 4; k++) {
        size_t kl = strlen(names[k]);
        if (len <= kl || strncasecmp(buf, names[k], kl)) continue;
        char v[96];
        header_value(buf + kl, len - kl, v, sizeof v);
        if (k == 0) strcpy(h->etag, v);
        else if (k == 1) strcpy(h->linked_etag, v);
        else if (k == 2) h->size = strtoll(v, NULL, 10);
        else h->linked_size = strtoll(v, NULL, 10);
    }
    return on_header(buf, size, n, h->reply);
}

static void setup_head(CURL *c, void *ctx)
{
    head_info *h = ctx;
    h->etag[0] = h->linked_etag[0] = '\0';
    h->size = h->linked_size = -1;
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_head_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
}

at_status at_http_head(const at_http_options *o, const char *url, char etag[96], long long *size,
                       at_http_reply *reply)
{
    at_http_reply local;
    head_info h = {reply ? reply : &local, "", "", -1, -1};
    AT_TRY(perform(o, url, h.reply, 400, setup_head, &h));
    long status = h.reply->status;
    strcpy(etag, h.linked_etag[0] ? h.linked_etag : h.etag);
    *size = h.linked_size >= 0 ? h.linked_size : status < 300 ? h.size : -1;
    return AT_OK;
}

/* ---- parallel downloads ---- */

typedef struct {
    const at_http_file *f;
    CURL *easy;
    int fd, lock_fd;
    int64_t have;      /* bytes in the part file */
    int attempts;
    double next_try;
    int state;         /* 0 waiting, 1 running, 2 done */
    int write_errno;   /* a failed write's errno */
    int answered;      /* the body of this try's answer has begun */
    at_http_reply reply;
} transfer;

static size_t on_data(char *data, size_t size, size_t n, void *ctx)
{
    transfer *t = ctx;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200 && status != 206) return len; /* an error page: not part of the file */
    if (!t->answered && status == 200 && t->have > 0) { /* the server ignored the range: start over */
        if (ftruncate(t->fd, 0) != 0) {
            t->write_errno = errno;
            return 0;
        }
        t->have = 0;
    }
    t->answered = 1;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(t->fd, data + done, len - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            t->write_errno = errno;
            return 0;
        }
        done += (size_t)w;
    }
    t->have += (int64_t)len;
    return len;
}

static void release_lock(transfer *t)
{
    if (t->lock_fd >= 0) {
        flock(t->lock_fd, LOCK_UN);
        close(t->lock_fd);
        t->lock_fd = -1;
    }
}

/* Starts t; 0 started, 1 try later (another process holds the lock), 2
 * finished without a transfer (dest appeared), -1 error. */
static int start(transfer *t, CURLM *multi, struct curl_slist *hdr)
{
    if (t->f->lock) {
        t->lock_fd = open(t->f->lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (t->lock_fd < 0) {
            at_error(AT_ERR_IO, "%s: cannot create the lock file %s: %s", t->f->label, t->f->lock, strerror(errno));
            return -1;
        }
        if (flock(t->lock_fd, LOCK_EX | LOCK_NB) != 0) {
            close(t->lock_fd);
            t->lock_fd = -1;
            return 1;
        }
    }
    if (access(t->f->dest, F_OK) == 0) {
        release_lock(t);
        return 2;
    }
    t->fd = open(t->f->part, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat sb;
    if (t->fd < 0 || fstat(t->fd, &sb) != 0) {
        at_error(AT_ERR_IO, "%s: cannot write %s: %s", t->f->label, t->f->part, strerror(errno));
        release_lock(t);
        return -1;
    }
    t->have = S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : 0;
    if (t->f->size >= 0 && t->have > t->f->size) { /* longer than the file: not ours to keep */
        if (ftruncate(t->fd, 0) != 0) t->write_errno = errno;
        t->have = 0;
    }
    t->easy = curl_easy_init();
    if (!t->easy) {
        at_error(AT_ERR_NOMEM, "cannot start an HTTP request");
        return -1;
    }
    memset(&t->reply, 0, sizeof t->reply);
    t->answered = 0;
    common_setup(t->easy, t->f->url, hdr, &t->reply);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
    if (t->have > 0) curl_easy_setopt(t->easy, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)t->have);
    curl_multi_add_handle(multi, t->easy);
    t->state = 1;
    return 0;
}

static void stop(transfer *t, CURLM *multi)
{
    if (t->easy) {
        curl_multi_remove_handle(multi, t->easy);
        curl_easy_cleanup(t->easy);
        t->easy = NULL;
    }
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
}

/* The part file is whole: check it and move it into place. */
static at_status finish(transfer *t)
{
    const at_http_file *f = t->f;
    if (f->size >= 0 && t->have != f->size) {
        /* Could be a truncated answer with no length: let the caller retry. */
        return at_error(AT_ERR_IO, "%s: got %lld bytes, the hub lists %lld", f->label, (long long)t->have,
                        (long long)f->size);
    }
    if (f->sha256) {
        char hex[65];
        AT_TRY(at_sha256_file(f->part, hex));
        if (strcmp(hex, f->sha256) != 0) {
            unlink(f->part); /* corrupt: never resumed from, never used */
            return at_error(AT_ERR_FORMAT,
                            "%s: sha256 mismatch (the hub lists %s, the download has %s); the download was "
                            "discarded and nothing was put in the cache",
                            f->label, f->sha256, hex);
        }
    }
    if (rename(f->part, f->dest) != 0)
        return at_error(AT_ERR_IO, "%s: cannot move %s into place: %s", f->label, f->dest, strerror(errno));
    return AT_OK;
}

static void human(int64_t b, char *buf, size_t n)
{
    if (b >= (int64_t)1 << 30) snprintf(buf, n, "%.2f GiB", (double)b / (double)(1 << 30));
    else if (b >= 1 << 20) snprintf(buf, n, "%.1f MiB", (double)b / (double)(1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
}

at_status at_http_download(const at_http_options *o, const at_http_file *files, size_t n, at_http_reply *reply)
{
    at_status st = AT_OK;
    pthread_once(&curl_once, curl_init);
    if (reply) memset(reply, 0, sizeof *reply);
    transfer *ts = calloc(n ? n : 1, sizeof *ts);
    CURLM *multi = curl_multi_init();
    struct curl_slist *hdr = auth_header(o);
    at_progress bar;
    int64_t total = 0;
    size_t left = 0;
    if (!ts || !multi) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        ts[i].f = &files[i];
        ts[i].fd = ts[i].lock_fd = -1;
        if (access(files[i].dest, F_OK) == 0) {
            ts[i].state = 2;
        } else {
            left++;
            if (files[i].size > 0) total += files[i].size;
        }
    }
    if (!left) goto done;
    if (!(o && o->quiet)) at_progress_start(&bar, "download", total, stderr);
    int running = 0;
    int64_t finished_bytes = 0;
    while (left) {
        double now = at_now_seconds();
        for (size_t i = 0; i < n && running < opt_parallel(o); i++) {
            transfer *t = &ts[i];
            if (t->state != 0 || t->next_try > now) continue;
            int r = start(t, multi, hdr);
            if (r < 0) {
                st = AT_ERR_IO;
                goto done;
            }
            if (r == 1) t->next_try = now + 0.5;
            else if (r == 2) {
                t->state = 2;
                left--;
            } else running++;
        }
        int still = 0;
        curl_multi_perform(multi, &still);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(multi, &q))) {
            if (msg->msg != CURLMSG_DONE) continue;
            transfer *t = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
            CURLcode cc = msg->data.result;
            long status = 0;
            curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
            stop(t, multi);
            running--;
            t->reply.status = cc == CURLE_OK || cc == CURLE_WRITE_ERROR ? status : 0;
            at_status fs = AT_OK;
            if (t->write_errno) {
                fs = at_error(AT_ERR_IO, "%s: cannot write %s: %s%s", t->f->label, t->f->part, strerror(t->write_errno),
                              t->write_errno == ENOSPC ? " (the disk is full: free some space, then run again "
                                                         "and the download resumes)" : "");
                goto final;
            } else if (cc == CURLE_OK && (status == 200 || status == 206)) {
                fs = finish(t);
                if (fs == AT_OK) {
                    t->state = 2;
                    left--;
                    finished_bytes += t->have;
                    if (!(o && o->quiet)) {
                        char line[600], sz[32];
                        human(t->have, sz, sizeof sz);
                        snprintf(line, sizeof line, "  %s (%s)", t->f->label, sz);
                        at_progress_note(&bar, line);
                    }
                    release_lock(t);
                    continue;
                }
                if (fs != AT_ERR_IO) goto final; /* a wrong sha256 is final; a short file is retried */
            } else if (cc == CURLE_OK && status == 416 && t->have > 0) {
                fs = finish(t); /* asked for bytes past the end: it may be whole already */
                if (fs == AT_OK) {
                    t->state = 2;
                    left--;
                    release_lock(t);
                    continue;
                }
                if (fs != AT_ERR_IO) goto final;
                unlink(t->f->part); /* start again from the first byte */
            } else if (cc == CURLE_OK && !transient(cc, status)) {
                fs = status_error(status, t->f->label);
                goto final;
            } else if (cc != CURLE_OK && !transient(cc, status)) {
                fs = at_error(AT_ERR_IO, "%s: %s", t->f->label, curl_easy_strerror(cc));
                goto final;
            }
            /* transient: try again after a pause; a part file keeps what arrived */
            release_lock(t);
            if (t->attempts++ >= opt_retries(o)) {
                fs = cc != CURLE_OK ? at_error(AT_ERR_IO, "%s: %s (gave up after %d tries; run again to resume)",
                                               t->f->label, curl_easy_strerror(cc), t->attempts)
                                    : at_error(AT_ERR_IO, "%s: HTTP %ld (gave up after %d tries; run again to resume)",
                                               t->f->label, status, t->attempts);
                goto final;
            }
            t->state = 0;
            t->next_try = at_now_seconds() + opt_backoff(o) * (double)(1 << (t->attempts - 1));
            continue;
        final:
            release_lock(t);
            if (reply) *reply = t->reply;
            st = fs;
            goto done;
        }
        if (!(o && o->quiet)) {
            int64_t now_bytes = finished_bytes;
            char status_line[256] = "";
            size_t sl = 0;
            for (size_t i = 0; i < n; i++)
                if (ts[i].state == 1) {
                    now_bytes += ts[i].have;
                    if (sl < 160 && ts[i].f->size > 0)
                        sl += (size_t)snprintf(status_line + sl, sizeof status_line - sl, "%s%s %d%%", sl ? ", " : "",
                                               strrchr(ts[i].f->label, '/') ? strrchr(ts[i].f->label, '/') + 1
                                                                            : ts[i].f->label,
                                               (int)(100 * ts[i].have / ts[i].f->size));
                }
            at_progress_update(&bar, now_bytes, status_line);
        }
        if (left && running) curl_multi_poll(multi, NULL, 0, 100, NULL);
        else if (left) sleep_s(0.05);
    }
    if (!(o && o->quiet)) at_progress_finish(&bar, "done");
done:
    for (size_t i = 0; ts && i < n; i++) {
        stop(&ts[i], multi);
        release_lock(&ts[i]);
    }
    curl_slist_free_all(hdr);
    if (multi) curl_multi_cleanup(multi);
    free(ts);
    return st;
}
