#include "data/records.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "data/parquet.h"

const char *at_issue_name(at_issue_kind k)
{
    switch (k) {
    case AT_ISSUE_SYNTAX: return "malformed record";
    case AT_ISSUE_UTF8: return "invalid UTF-8";
    case AT_ISSUE_TYPE: return "wrong type";
    case AT_ISSUE_MISSING: return "missing field";
    case AT_ISSUE_VALUE: return "invalid value";
    case AT_ISSUE_FORMAT: return "unknown format";
    default: return "issue";
    }
}

size_t at_utf8_check(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
            if (c == 0xED) hi = 0x9F;      /* no UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;      /* nothing above U+10FFFF */
        } else {
            return i;
        }
        if (len - i <= need) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return len;
}

typedef struct {
    const char *d;
    size_t n;
    const char *name;
    at_record_fn on_record;
    at_record_issue_fn on_issue;
    void *ctx;
    /* line tracker: the line number of offset `at`, moved forward only */
    size_t at, line_start;
    int line;
} reader;

static void locate(reader *r, size_t off, int *line, int *col)
{
    if (off > r->n) off = r->n;
    if (off < r->at) { /* rare: restart from the top */
        r->at = 0;
        r->line = 1;
        r->line_start = 0;
    }
    while (r->at < off) {
        const char *nl = memchr(r->d + r->at, '\n', off - r->at);
        if (!nl) {
            r->at = off;
            break;
        }
        r->line++;
        r->at = (size_t)(nl - r->d) + 1;
        r->line_start = r->at;
    }
    *line = r->line;
    if (col) *col = (int)(off - r->line_start) + 1;
}

/* Reports a skippable problem with one record. col 0 leaves the column out. */
static at_status issue(reader *r, at_issue_kind kind, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static at_status issue(reader *r, at_issue_kind kind, int line, int col, const char *fmt, ...)
{
    char what[256], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (col > 0)
        snprintf(msg, sizeof msg, "%s:%d:%d: %s", r->name, line, col, what);
    else
        snprintf(msg, sizeof msg, "%s:%d: %s", r->name, line, what);
    if (!r->on_issue) return at_error(AT_ERR_FORMAT, "%s", msg);
    return r->on_issue(r->ctx, kind, line, msg);
}

/* A problem that leaves the file's structure unknown: always fatal. */
static at_status fatal(reader *r, size_t off, const char *what)
{
    int line, col;
    locate(r, off, &line, &col);
    return at_error(AT_ERR_FORMAT, "%s:%d:%d: %s", r->name, line, col, what);
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const reader *r, size_t p)
{
    while (p < r->n && is_ws(r->d[p])) p++;
    return p;
}

static int utf8_ok(reader *r, size_t start, size_t end)
{
    size_t bad = at_utf8_check(r->d + start, end - start);
    if (bad == end - start) return 1;
    return 0;
}

/* Offset in s[0..len) of a NUL character, raw or (json) written "\u0000";
 * len when there is none. A NUL cannot be carried: cJSON's strings, the
 * tokenizers and the templates end a text at it, so the rest would be lost
 * without a word. */
static size_t find_nul(const char *s, size_t len, int json)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0') return i;
        if (json && s[i] == '\\' && i + 1 < len) {
            if (s[i + 1] == 'u' && len - i >= 6 && !memcmp(s + i + 2, "0000", 4)) return i;
            i++; /* the escaped character: "\\u0000" is a backslash and "u0000" */
        }
    }
    return len;
}

/* Validates and parses r->d[start..end) as one JSON record starting on `line`
 * and hands it to the callback. */
static at_status json_record(reader *r, size_t start, size_t end, int line)
{
    size_t len = end - start;
    size_t bad = at_utf8_check(r->d + start, len);
    int eline, ecol;
    if (bad < len) {
        locate(r, start + bad, &eline, &ecol);
        return issue(r, AT_ISSUE_UTF8, eline, ecol, "invalid UTF-8 (byte 0x%02x)",
                     (unsigned)(unsigned char)r->d[start + bad]);
    }
    size_t nul = find_nul(r->d + start, len, 1);
    if (nul < len) {
        locate(r, start + nul, &eline, &ecol);
        return issue(r, AT_ISSUE_VALUE, eline, ecol, "a NUL character (\\u0000) in the record: a text cannot hold "
                     "one (it would end there)%s", "");
    }
    const char *ep = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(r->d + start, len, &ep, 0);
    if (!j) {
        size_t off = (ep && ep >= r->d + start && ep <= r->d + end) ? (size_t)(ep - r->d) : start;
        locate(r, off, &eline, &ecol);
        return issue(r, AT_ISSUE_SYNTAX, eline, ecol, "malformed JSON (record starting at line %d)", line);
    }
    size_t tail = ep ? (size_t)(ep - r->d) : end;
    while (tail < end && is_ws(r->d[tail])) tail++;
    if (tail < end) {
        cJSON_Delete(j);
        locate(r, tail, &eline, &ecol);
        return issue(r, AT_ISSUE_SYNTAX, eline, ecol, "malformed JSON: unexpected data after the record");
    }
    at_record rec = {r->name, line, j, NULL, 0};
    at_status st = r->on_record(r->ctx, &rec);
    cJSON_Delete(j);
    return st;
}

/* Offset just past the JSON string whose opening quote is at p;
 * (size_t)-1 if the file ends inside it. */
static size_t string_end(const reader *r, size_t p)
{
    for (size_t i = p + 1; i < r->n; i++) {
        if (r->d[i] == '\\') i++;
        else if (r->d[i] == '"') return i + 1;
    }
    return (size_t)-1;
}

/* End of the JSON value starting at p, found by bracket counting only (the
 * record's own parse checks the rest); (size_t)-1 if the file ends first. */
static size_t value_end(const reader *r, size_t p)
{
    char c = r->d[p];
    if (c == '{' || c == '[') {
        size_t depth = 0;
        while (p < r->n) {
            c = r->d[p];
            if (c == '"') {
                p = string_end(r, p);
                if (p == (size_t)-1) return p;
                continue;
            }
            if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0) return p + 1;
            }
            p++;
        }
        return (size_t)-1;
    }
    if (c == '"') return string_end(r, p);
    while (p < r->n && !is_ws(r->d[p]) && r->d[p] != ',' && r->d[p] != ']' && r->d[p] != '}' &&
           r->d[p] != '[' && r->d[p] != '{')
        p++;
    return p;
}

static at_status read_json_array(reader *r, size_t p)
{
    p = skip_ws(r, p);
    if (p >= r->n) return AT_OK; /* empty file: no records */
    if (r->d[p] != '[') return fatal(r, p, "malformed JSON: a JSON array of records must start with '['");
    p = skip_ws(r, p + 1);
    if (p < r->n && r->d[p] == ']') {
        p++;
    } else {
        for (;;) {
            if (p >= r->n) return fatal(r, p, "malformed JSON: unexpected end of file, the array is not closed");
            if (r->d[p] == ',' || r->d[p] == ']' || r->d[p] == '}')
                return fatal(r, p, "malformed JSON: expected a record");
            size_t e = value_end(r, p);
            if (e == (size_t)-1) {
                int line;
                locate(r, p, &line, NULL);
                char what[128];
                snprintf(what, sizeof what, "malformed JSON: unexpected end of file in the record starting at line %d",
                         line);
                return fatal(r, r->n, what);
            }
            int line;
            locate(r, p, &line, NULL);
            AT_TRY(json_record(r, p, e, line));
            p = skip_ws(r, e);
            if (p >= r->n) return fatal(r, p, "malformed JSON: unexpected end of file, the array is not closed");
            if (r->d[p] == ',') {
                p = skip_ws(r, p + 1);
                continue;
            }
            if (r->d[p] == ']') {
                p++;
                break;
            }
            return fatal(r, p, "malformed JSON: expected ',' or ']' after a record");
        }
    }
    p = skip_ws(r, p);
    if (p < r->n) return fatal(r, p, "malformed JSON: unexpected data after the array");
    return AT_OK;
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) return 0;
    return 1;
}

static at_status read_lines(reader *r, size_t p, int json)
{
    int line = 1;
    while (p < r->n) {
        const char *nl = memchr(r->d + p, '\n', r->n - p);
        size_t e = nl ? (size_t)(nl - r->d) : r->n;
        size_t te = e;
        if (te > p && r->d[te - 1] == '\r') te--;
        if (!blank(r->d + p, te - p)) {
            if (json) {
                AT_TRY(json_record(r, p, te, line));
            } else {
                size_t bad = at_utf8_check(r->d + p, te - p), nul = find_nul(r->d + p, te - p, 0);
                if (nul < te - p) {
                    AT_TRY(issue(r, AT_ISSUE_VALUE, line, (int)nul + 1, "a NUL byte in the line: a text cannot hold "
                                 "one (it would end there)%s", ""));
                } else if (bad < te - p) {
                    AT_TRY(issue(r, AT_ISSUE_UTF8, line, (int)bad + 1, "invalid UTF-8 (byte 0x%02x)",
                                 (unsigned)(unsigned char)r->d[p + bad]));
                } else {
                    at_record rec = {r->name, line, NULL, r->d + p, te - p};
                    AT_TRY(r->on_record(r->ctx, &rec));
                }
            }
        }
        line++;
        p = e + 1;
    }
    return AT_OK;
}

/* One parsed CSV row: fields unescaped into buf, each NUL-terminated. */
typedef struct {
    char *buf;
    size_t len, cap;
    size_t *start;
    size_t nf, capf;
} csv_row;

static int csv_push(csv_row *row, char c)
{
    if (row->len == row->cap) {
        size_t nc = row->cap ? row->cap * 2 : 256;
        char *nb = realloc(row->buf, nc);
        if (!nb) return 0;
        row->buf = nb;
        row->cap = nc;
    }
    row->buf[row->len++] = c;
    return 1;
}

static int csv_field(csv_row *row, size_t start)
{
    if (!csv_push(row, '\0')) return 0;
    if (row->nf == row->capf) {
        size_t nc = row->capf ? row->capf * 2 : 16;
        size_t *ns = realloc(row->start, nc * sizeof *ns);
        if (!ns) return 0;
        row->start = ns;
        row->capf = nc;
    }
    row->start[row->nf++] = start;
    return 1;
}

static int csv_eol(const reader *r, size_t p)
{
    return p >= r->n || r->d[p] == '\n' || (r->d[p] == '\r' && (p + 1 >= r->n || r->d[p + 1] == '\n'));
}

/* Parses the RFC 4180 row at *pp. Returns 1 on success, 0 on a syntax error
 * (*err_off, *err set; *pp moved past the next newline so reading can go
 * on), -1 when out of memory. */
static int csv_parse_row(const reader *r, size_t *pp, csv_row *row, size_t *err_off, const char **err)
{
    size_t p = *pp;
    row->len = 0;
    row->nf = 0;
    for (;;) {
        size_t start = row->len;
        if (p < r->n && r->d[p] == '"') {
            p++;
            for (;;) {
                if (p >= r->n) {
                    *err_off = r->n;
                    *err = "unterminated quoted field";
                    *pp = r->n;
                    return 0;
                }
                if (r->d[p] == '"') {
                    if (p + 1 < r->n && r->d[p + 1] == '"') {
                        if (!csv_push(row, '"')) return -1;
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                if (!csv_push(row, r->d[p])) return -1;
                p++;
            }
            if (!csv_eol(r, p) && r->d[p] != ',') {
                *err_off = p;
                *err = "unexpected character after a closing quote";
                const char *nl = memchr(r->d + p, '\n', r->n - p);
                *pp = nl ? (size_t)(nl - r->d) + 1 : r->n;
                return 0;
            }
        } else {
            while (!csv_eol(r, p) && r->d[p] != ',') {
                if (!csv_push(row, r->d[p])) return -1;
                p++;
            }
        }
        if (!csv_field(row, start)) return -1;
        if (p < r->n && r->d[p] == ',') {
            p++;
            continue;
        }
        if (p < r->n && r->d[p] == '\r') p++;
        if (p < r->n && r->d[p] == '\n') p++;
        *pp = p;
        return 1;
    }
}

static at_status read_csv(reader *r, size_t p)
{
    at_status st = AT_OK;
    csv_row head = {0}, row = {0};
    size_t err_off = 0;
    const char *err = NULL;
    cJSON *obj = NULL;
    while (p < r->n && (r->d[p] == '\n' || r->d[p] == '\r')) p++; /* leading blank lines */
    if (p >= r->n) goto done;
    size_t hstart = p;
    int rc = csv_parse_row(r, &p, &head, &err_off, &err);
    if (rc < 0) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory reading CSV", r->name);
        goto done;
    }
    if (rc == 0) {
        st = fatal(r, err_off, err);
        goto done;
    }
    if (!utf8_ok(r, hstart, p)) {
        st = fatal(r, hstart + at_utf8_check(r->d + hstart, p - hstart), "invalid UTF-8 in the CSV header");
        goto done;
    }
    while (p < r->n) {
        size_t rstart = p;
        int line;
        locate(r, rstart, &line, NULL);
        rc = csv_parse_row(r, &p, &row, &err_off, &err);
        if (rc < 0) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory reading CSV", r->name);
            goto done;
        }
        if (rc == 0) {
            int eline, ecol;
            locate(r, err_off, &eline, &ecol);
            AT_CHECK(issue(r, AT_ISSUE_SYNTAX, eline, ecol, "malformed CSV: %s (row starting at line %d)", err, line));
            continue;
        }
        if (row.nf == 1 && row.buf[0] == '\0' && r->d[rstart] != '"') continue; /* blank line */
        if (!utf8_ok(r, rstart, p)) {
            int eline, ecol;
            size_t bad = rstart + at_utf8_check(r->d + rstart, p - rstart);
            locate(r, bad, &eline, &ecol);
            AT_CHECK(issue(r, AT_ISSUE_UTF8, eline, ecol, "invalid UTF-8 (byte 0x%02x)",
                           (unsigned)(unsigned char)r->d[bad]));
            continue;
        }
        size_t nul = find_nul(r->d + rstart, p - rstart, 0);
        if (nul < p - rstart) {
            int eline, ecol;
            locate(r, rstart + nul, &eline, &ecol);
            AT_CHECK(issue(r, AT_ISSUE_VALUE, eline, ecol, "a NUL byte in the row: a text cannot hold one (it would "
                           "end there)%s", ""));
            continue;
        }
        if (row.nf != head.nf) {
            AT_CHECK(issue(r, AT_ISSUE_SYNTAX, line, 0, "malformed CSV: the row has %zu fields, the header %zu",
                           row.nf, head.nf));
            continue;
        }
        obj = cJSON_CreateObject();
        if (!obj) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory reading CSV", r->name);
            goto done;
        }
        for (size_t i = 0; i < row.nf; i++) {
            cJSON *s = cJSON_CreateString(row.buf + row.start[i]);
            if (!s || !cJSON_AddItemToObject(obj, head.buf + head.start[i], s)) {
                cJSON_Delete(s);
                st = at_error(AT_ERR_NOMEM, "%s: out of memory reading CSV", r->name);
                goto done;
            }
        }
        at_record rec = {r->name, line, obj, NULL, 0};
        AT_CHECK(r->on_record(r->ctx, &rec));
        cJSON_Delete(obj);
        obj = NULL;
    }
done:
    cJSON_Delete(obj);
    free(head.buf);
    free(head.start);
    free(row.buf);
    free(row.start);
    return st;
}

static const char *extension(const char *name)
{
    const char *slash = strrchr(name, '/');
    const char *dot = strrchr(slash ? slash : name, '.');
    return dot ? dot : "";
}

at_status at_records_read_mem(const char *data, size_t len, const char *name, at_container container,
                              at_record_fn on_record, at_record_issue_fn on_issue, void *ctx)
{
    reader r = {data, len, name, on_record, on_issue, ctx, 0, 0, 1};
    size_t p = 0;
    if (len >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) p = 3;
    if (container == AT_CONTAINER_AUTO) {
        const char *ext = extension(name);
        if (strcmp(ext, ".jsonl") == 0) {
            container = AT_CONTAINER_JSONL;
        } else if (strcmp(ext, ".csv") == 0) {
            container = AT_CONTAINER_CSV;
        } else if (strcmp(ext, ".txt") == 0) {
            container = AT_CONTAINER_TEXT;
        } else if (strcmp(ext, ".parquet") == 0 || at_parquet_sniff(data, len)) {
            container = AT_CONTAINER_PARQUET;
        } else {
            size_t q = skip_ws(&r, p);
            container = (q < len && data[q] == '[') ? AT_CONTAINER_JSON_ARRAY : AT_CONTAINER_JSONL;
        }
    }
    switch (container) {
    case AT_CONTAINER_JSON_ARRAY: return read_json_array(&r, p);
    case AT_CONTAINER_JSONL: return read_lines(&r, p, 1);
    case AT_CONTAINER_TEXT: return read_lines(&r, p, 0);
    case AT_CONTAINER_CSV: return read_csv(&r, p);
    case AT_CONTAINER_PARQUET:
        return at_parquet_read_mem((const uint8_t *)data, len, name, on_record, on_issue, ctx);
    default: return at_error(AT_ERR_INVALID, "%s: unknown container %d", name, (int)container);
    }
}

at_status at_records_read(const char *path, at_container container, at_record_fn on_record,
                          at_record_issue_fn on_issue, void *ctx)
{
    at_mapped_file m;
    AT_TRY(at_map_file(path, &m));
    at_status st = at_records_read_mem((const char *)m.data, m.size, path, container, on_record, on_issue, ctx);
    at_unmap_file(&m);
    return st;
}
