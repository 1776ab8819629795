/* A small HTTP/1.1 client over real sockets for the server tests
 * (test_serve.c, test_webui.c): one request per connection (Connection:
 * close), the whole answer read, chunked bodies joined. Functions are
 * static inline so that each test program takes only what it uses without
 * a library of its own. */
#ifndef AT_TESTS_HTTP_CLIENT_H
#define AT_TESTS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* A connected socket to 127.0.0.1:port (reads time out after 60 s), or -1. */
static inline int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends one request; headers: extra "Name: value\r\n" lines or NULL (a
 * first line "Host: ..." replaces the default Host: localhost). The body goes
 * as application/json unless headers name another Content-Type. */
static inline int send_request(int fd, const char *method, const char *path, const char *headers, const char *body,
                               size_t body_len)
{
    char head[2048];
    const char *h = headers ? headers : "";
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\n%sConnection: close\r\n%s%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, strncasecmp(h, "Host:", 5) ? "Host: localhost\r\n" : "", h,
                     strcasestr(h, "Content-Type:") ? "" : "Content-Type: application/json\r\n",
                     body ? body_len : 0);
    if (n < 0 || (size_t)n >= sizeof head) return 0;
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n) return 0;
    size_t off = 0;
    while (body && off < body_len) {
        ssize_t w = send(fd, body + off, body_len - off, MSG_NOSIGNAL);
        if (w <= 0) return off > 0; /* the server may answer (413) and close before reading it all */
        off += (size_t)w;
    }
    return 1;
}

typedef struct {
    int status;
    char head[4096]; /* the status line and headers (cut at 4 KiB) */
    char *body; /* de-chunked, NUL-terminated */
    size_t len;
} http_resp;

static inline void dechunk(http_resp *r)
{
    char *out = malloc(r->len + 1), *p = r->body, *end = r->body + r->len;
    size_t n = 0;
    while (out && p < end) {
        unsigned long sz = strtoul(p, NULL, 16);
        char *crlf = strstr(p, "\r\n");
        if (!crlf || sz == 0) break;
        p = crlf + 2;
        if (p + sz > end) sz = (unsigned long)(end - p);
        memcpy(out + n, p, sz);
        n += sz;
        p += sz + 2;
    }
    if (!out) return;
    out[n] = 0;
    free(r->body);
    r->body = out;
    r->len = n;
}

/* Sends a request (body: NUL-terminated or NULL) and reads the whole
 * answer into *r (free r->body). 0 when no answer came. */
static inline int http(int port, const char *method, const char *path, const char *headers, const char *body,
                       http_resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = connect_to(port);
    if (fd < 0) return 0;
    if (!send_request(fd, method, path, headers, body, body ? strlen(body) : 0)) {
        close(fd);
        return 0;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got <= 0) break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return 0;
    }
    *sep = 0;
    int chunked = strcasestr(buf, "transfer-encoding: chunked") != NULL;
    r->len = len - (size_t)(sep + 4 - buf);
    r->body = malloc(r->len + 1);
    memcpy(r->body, sep + 4, r->len);
    r->body[r->len] = 0;
    snprintf(r->head, sizeof r->head, "%s", buf);
    free(buf);
    if (chunked) dechunk(r);
    return 1;
}

/* The value of header `name` in r (copied into buf), or NULL. */
static inline const char *http_header(const http_resp *r, const char *name, char *buf, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (!strncasecmp(line, name, n) && line[n] == ':') {
            line += n + 1;
            while (*line == ' ') line++;
            size_t len = strcspn(line, "\r\n");
            if (len >= cap) len = cap - 1;
            memcpy(buf, line, len);
            buf[len] = 0;
            return buf;
        }
    }
    return NULL;
}

#endif
