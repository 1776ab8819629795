#include "eval/mc_csv.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/file.h"

/* ---- one CSV record at a time ---- */

typedef struct {
    const char *p, *end;
    const char *name;
    int line; /* line of *p */
} reader;

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static at_status sb_put(sbuf *b, char c)
{
    if (b->len + 2 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        char *p = realloc(b->s, nc);
        if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
        b->s = p;
        b->cap = nc;
    }
    b->s[b->len++] = c;
    b->s[b->len] = 0;
    return AT_OK;
}

/* The fields of one record, each a malloc'd NUL-terminated string. */
typedef struct {
    char **f;
    int n, cap;
} record;

static void record_clear(record *r)
{
    for (int i = 0; i < r->n; i++) free(r->f[i]);
    r->n = 0;
}

static void record_free(record *r)
{
    record_clear(r);
    free(r->f);
    r->f = NULL;
    r->cap = 0;
}

static at_status record_push(record *r, sbuf *b)
{
    if (r->n == r->cap) {
        int nc = r->cap ? r->cap * 2 : 8;
        char **p = realloc(r->f, (size_t)nc * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
        r->f = p;
        r->cap = nc;
    }
    if (!b->s && !(b->s = calloc(1, 1))) return at_error(AT_ERR_NOMEM, "out of memory"); /* empty field */
    r->f[r->n++] = b->s;
    memset(b, 0, sizeof *b);
    return AT_OK;
}

/* Consumes a line break at r->p if there is one (LF, CRLF or CR). */
static int eat_newline(reader *r)
{
    if (r->p < r->end && *r->p == '\r') {
        r->p++;
        if (r->p < r->end && *r->p == '\n') r->p++;
        r->line++;
        return 1;
    }
    if (r->p < r->end && *r->p == '\n') {
        r->p++;
        r->line++;
        return 1;
    }
    return 0;
}

/* Reads the next non-blank record into rec (cleared first). *got = 0 at the
 * end of the data; *line = where the record starts. */
static at_status next_record(reader *r, record *rec, int *got, int *line)
{
    record_clear(rec);
    *got = 0;
    while (r->p < r->end && eat_newline(r)) {
    } /* blank lines, as csv.reader's empty rows, carry no record */
    if (r->p >= r->end) return AT_OK;
    *line = r->line;
    sbuf b = {0};
    at_status st = AT_OK;
    for (;;) {
        /* one field */
        if (r->p < r->end && *r->p == '"') {
            int open_line = r->line;
            r->p++;
            for (;;) {
                if (r->p >= r->end) {
                    st = at_error(AT_ERR_FORMAT, "%s:%d: a quoted field opened here is never closed", r->name,
                                  open_line);
                    goto fail;
                }
                char c = *r->p;
                if (c == '"') {
                    if (r->p + 1 < r->end && r->p[1] == '"') {
                        r->p += 2;
                        if ((st = sb_put(&b, '"')) != AT_OK) goto fail;
                        continue;
                    }
                    r->p++;
                    break;
                }
                if (c == 0) {
                    st = at_error(AT_ERR_FORMAT, "%s:%d: NUL byte in a field", r->name, r->line);
                    goto fail;
                }
                if (c == '\n' || (c == '\r' && !(r->p + 1 < r->end && r->p[1] == '\n'))) r->line++;
                if ((st = sb_put(&b, c)) != AT_OK) goto fail;
                r->p++;
            }
            if (r->p < r->end && *r->p != ',' && *r->p != '\n' && *r->p != '\r') {
                st = at_error(AT_ERR_FORMAT, "%s:%d: text after the closing quote of a field (a quote inside a "
                              "quoted field is written \"\")", r->name, r->line);
                goto fail;
            }
        } else {
            while (r->p < r->end && *r->p != ',' && *r->p != '\n' && *r->p != '\r') {
                if (*r->p == 0) {
                    st = at_error(AT_ERR_FORMAT, "%s:%d: NUL byte in a field", r->name, r->line);
                    goto fail;
                }
                if ((st = sb_put(&b, *r->p)) != AT_OK) goto fail;
                r->p++;
            }
        }
        if ((st = record_push(rec, &b)) != AT_OK) goto fail;
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        eat_newline(r);
        break;
    }
    *got = 1;
    return AT_OK;
fail:
    free(b.s);
    return st;
}

/* ---- questions ---- */

static const char *const col_names[6] = {"question", "A", "B", "C", "D", "answer"};

static char *trimmed(const char *s, size_t *n)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t k = strlen(s);
    while (k && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
    *n = k;
    return (char *)s;
}

static at_status push_item(at_mc_file *f, size_t *cap, record *rec, const int *col, const char *name, int line)
{
    if (f->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        at_mc_item *p = realloc(f->items, nc * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
        f->items = p;
        *cap = nc;
    }
    size_t alen;
    const char *a = trimmed(rec->f[col[5]], &alen);
    if (alen != 1 || a[0] < 'A' || a[0] > 'D')
        return at_error(AT_ERR_FORMAT, "%s:%d: answer '%.*s' is not one of A, B, C, D", name, line,
                        (int)(alen > 40 ? 40 : alen), a);
    at_mc_item *it = &f->items[f->n];
    memset(it, 0, sizeof *it);
    it->answer = a[0] - 'A';
    it->line = line;
    /* take the strings out of the record (it frees what is left) */
    it->question = rec->f[col[0]];
    rec->f[col[0]] = NULL;
    for (int k = 0; k < AT_MC_CHOICES; k++) {
        it->choices[k] = rec->f[col[1 + k]];
        rec->f[col[1 + k]] = NULL;
    }
    f->n++;
    return AT_OK;
}

static void item_free(at_mc_item *it)
{
    free(it->question);
    for (int k = 0; k < AT_MC_CHOICES; k++) free(it->choices[k]);
}

void at_mc_file_free(at_mc_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) item_free(&f->items[i]);
    free(f->items);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Header mode when the first record names a question and an answer column. */
static int is_header(const record *rec)
{
    int q = 0, a = 0;
    for (int i = 0; i < rec->n; i++) {
        size_t n;
        const char *s = trimmed(rec->f[i], &n);
        q |= n == 8 && !strncasecmp(s, "question", 8);
        a |= n == 6 && !strncasecmp(s, "answer", 6);
    }
    return q && a;
}

at_status at_mc_csv_parse(const char *data, size_t len, const char *name, at_mc_file *out)
{
    memset(out, 0, sizeof *out);
    reader r = {data, data + len, name, 1};
    if (len >= 3 && !memcmp(data, "\xEF\xBB\xBF", 3)) r.p += 3;
    record rec = {0};
    size_t cap = 0;
    int col[6] = {0, 1, 2, 3, 4, 5}, n_fields = 6, header = -1, got = 0, line = 0;
    at_status st = AT_OK;
    out->path = strdup(name);
    if (!out->path) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (;;) {
        if ((st = next_record(&r, &rec, &got, &line)) != AT_OK) goto done;
        if (!got) break;
        if (header < 0) {
            header = is_header(&rec);
            if (header) {
                for (int k = 0; k < 6; k++) {
                    col[k] = -1;
                    for (int i = 0; i < rec.n && col[k] < 0; i++) {
                        size_t n;
                        const char *s = trimmed(rec.f[i], &n);
                        if (n == strlen(col_names[k]) && !strncasecmp(s, col_names[k], n)) col[k] = i;
                    }
                    if (col[k] < 0) {
                        st = at_error(AT_ERR_FORMAT, "%s:%d: the header has no column '%s' (a multiple-choice "
                                      "file needs question, A, B, C, D and answer)", name, line, col_names[k]);
                        goto done;
                    }
                }
                n_fields = rec.n;
                continue;
            }
        }
        if (rec.n != n_fields) {
            if (header)
                st = at_error(AT_ERR_FORMAT, "%s:%d: %d fields, the header has %d", name, line, rec.n, n_fields);
            else
                st = at_error(AT_ERR_FORMAT, "%s:%d: %d fields; a multiple-choice row without a header has 6: "
                              "question,A,B,C,D,answer", name, line, rec.n);
            goto done;
        }
        if ((st = push_item(out, &cap, &rec, col, name, line)) != AT_OK) goto done;
    }
    if (out->n == 0) st = at_error(AT_ERR_FORMAT, "%s: no questions in the file", name);
done:
    record_free(&rec);
    if (st != AT_OK) at_mc_file_free(out);
    return st;
}

at_status at_mc_csv_load(const char *path, at_mc_file *out)
{
    memset(out, 0, sizeof *out);
    char *data = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(path, &data, &len));
    at_status st = at_mc_csv_parse(data, len, path, out);
    free(data);
    return st;
}
