/* Jinja2 lexer: template text -> tokens.
 *
 * Follows jinja2/lexer.py (3.1) with trim_blocks and lstrip_blocks on:
 *  - newlines (\r\n, \r, \n) become \n and one trailing newline is dropped;
 *  - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}",
 *    "-#}" strip all whitespace after it;
 *  - lstrip_blocks: spaces/tabs between a line start and "{%" or "{#" go;
 *    "{%+" keeps them;
 *  - trim_blocks: one newline right after "%}" or "#}" goes; "+%}" keeps it.
 * The whitespace these rules strip is Python's (Unicode) whitespace. */
#include "text/jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t n;
    const char *name;
    at_jx_arena *ar;
    at_jx_tok *toks;
    size_t ntoks, cap;
    size_t line_start; /* offset of the current line's first byte */
    int line;
} lexer;

static at_status lex_fail(lexer *L, size_t pos, const char *msg)
{
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < L->n; i++) {
        if (L->s[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)L->s[i] & 0xC0) != 0x80) {
            col++;
        }
    }
    return at_error(AT_ERR_FORMAT, "%s:%d:%d: %s", L->name, line, col, msg);
}

static void pos_of(const lexer *L, size_t pos, int *line, int *col)
{
    /* Tokens are produced left to right, so a forward scan from the
     * beginning would be quadratic; count lazily from the start instead only
     * for the column within the current line. */
    *line = 1;
    *col = 1;
    size_t ls = 0;
    int ln = 1;
    /* L->line/line_start cache the last position asked for. */
    if (pos >= L->line_start) {
        ls = L->line_start;
        ln = L->line;
    }
    for (size_t i = ls; i < pos; i++)
        if (L->s[i] == '\n') {
            ln++;
            ls = i + 1;
        }
    ((lexer *)L)->line_start = ls;
    ((lexer *)L)->line = ln;
    *line = ln;
    int c = 1;
    for (size_t i = ls; i < pos; i++)
        if (((unsigned char)L->s[i] & 0xC0) != 0x80) c++;
    *col = c;
}

static at_status push(lexer *L, int type, size_t pos, at_jx_tok **out)
{
    if (L->ntoks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        at_jx_tok *t = at_jx_alloc(L->ar, nc * sizeof *t);
        if (!t) return at_error(AT_ERR_NOMEM, "%s: template too large", L->name);
        if (L->ntoks) memcpy(t, L->toks, L->ntoks * sizeof *t);
        L->toks = t;
        L->cap = nc;
    }
    at_jx_tok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    pos_of(L, pos, &t->line, &t->col);
    if (out) *out = t;
    return AT_OK;
}

/* Length of the Python whitespace character at s[i], or 0. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80) return at_jx_is_space(ch) ? 1 : 0;
    size_t j = i;
    uint32_t cp = at_jx_utf8_next(s, n, &j);
    return at_jx_is_space(cp) ? j - i : 0;
}

static size_t skip_spaces(const char *s, size_t n, size_t i)
{
    size_t k = 0;
    while (i < n && (k = space_at(s, n, i)) > 0) i += k;
    return i;
}

/* Length of text[0..len) without its trailing Python whitespace. */
static size_t rstrip_len(const char *s, size_t len)
{
    size_t end = len;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        if (space_at(s, end, st) == end - st)
            end = st;
        else
            break;
    }
    return end;
}

/* Applies the whitespace rules to the data before a tag. */
static size_t strip_data(const char *text, size_t len, char sign, int is_var, int line_starting)
{
    if (sign == '-') return rstrip_len(text, len);
    if (sign == '+' || is_var) return len;
    size_t l_pos = 0;
    for (size_t i = len; i > 0; i--)
        if (text[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    if (l_pos > 0 || line_starting) {
        /* only whitespace (at least one char) between line start and tag */
        if (l_pos < len && skip_spaces(text, len, l_pos) == len) return l_pos;
    }
    return len;
}

static at_status emit_data(lexer *L, size_t pos, const char *text, size_t len)
{
    if (len == 0) return AT_OK;
    at_jx_tok *t = NULL;
    AT_TRY(push(L, JT_DATA, pos, &t));
    t->s = text;
    t->len = len;
    return AT_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(unsigned char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
static int is_name_char(unsigned char c) { return is_name_start(c) || is_digit((char)c); }

/* Digits with single underscores between them: (\d+_)*\d+ . Returns the end
 * or `i` when there is none. */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
    size_t j = i;
    if (j >= n || !is_digit(s[j])) return i;
    while (j < n) {
        if (is_digit(s[j])) {
            j++;
        } else if (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])) {
            j++;
        } else {
            break;
        }
    }
    return j;
}

static size_t scan_float(const char *s, size_t n, size_t i)
{
    if (i > 0 && s[i - 1] == '.') return i;
    size_t j = scan_digits(s, n, i);
    if (j == i) return i;
    size_t k = j;
    if (k < n && s[k] == '.') {
        size_t f = scan_digits(s, n, k + 1);
        if (f > k + 1) k = f;
        else k = j;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        size_t e = k + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t ee = scan_digits(s, n, e);
        if (ee > e) return ee;
    }
    return k > j ? k : i;
}

static size_t scan_int(const char *s, size_t n, size_t i, int *base)
{
    *base = 10;
    if (i + 1 < n && s[i] == '0' && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
        char kind = (char)(s[i + 1] | 32);
        *base = kind == 'b' ? 2 : kind == 'o' ? 8 : 16;
        size_t j = i + 2, last = i;
        while (j < n) {
            size_t k = j;
            if (s[k] == '_') k++;
            if (k >= n) break;
            char ch = (char)(s[k] | 32);
            int ok = *base == 2 ? (ch == '0' || ch == '1')
                     : *base == 8 ? (ch >= '0' && ch <= '7')
                                  : (is_digit(ch) || (ch >= 'a' && ch <= 'f'));
            if (!ok) break;
            j = k + 1;
            last = j;
        }
        if (last > i) return last;
        *base = 10;
        return i + 1; /* just "0" */
    }
    if (i < n && s[i] >= '1' && s[i] <= '9') return scan_digits(s, n, i);
    if (i < n && s[i] == '0') {
        size_t j = i + 1;
        while (j < n) {
            if (s[j] == '0') j++;
            else if (s[j] == '_' && j + 1 < n && s[j + 1] == '0') j += 2;
            else break;
        }
        return j;
    }
    return i;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 32);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Decodes a string literal body as Python's "unicode-escape" does. */
static at_status decode_string(lexer *L, size_t pos, const char *s, size_t n, char **out, size_t *outlen)
{
    char *d = at_jx_alloc(L->ar, n + 1);
    if (!d) return at_error(AT_ERR_NOMEM, "%s: template too large", L->name);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) {
            d[o++] = s[i++];
            continue;
        }
        char e = s[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': d[o++] = '\\'; break;
        case '\'': d[o++] = '\''; break;
        case '"': d[o++] = '"'; break;
        case 'a': d[o++] = '\a'; break;
        case 'b': d[o++] = '\b'; break;
        case 'f': d[o++] = '\f'; break;
        case 'n': d[o++] = '\n'; break;
        case 'r': d[o++] = '\r'; break;
        case 't': d[o++] = '\t'; break;
        case 'v': d[o++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i + (size_t)k < n ? hexval(s[i + (size_t)k]) : -1;
                if (h < 0) {
                    return lex_fail(L, pos, e == 'x' ? "truncated \\xXX escape"
                                            : e == 'u' ? "truncated \\uXXXX escape"
                                                       : "truncated \\UXXXXXXXX escape");
                }
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)nd;
            if (cp > 0x10FFFF) return lex_fail(L, pos, "illegal Unicode character");
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* lone surrogates cannot be UTF-8 */
            o += (size_t)at_jx_utf8_put(cp, d + o);
            break;
        }
        case 'N':
            return lex_fail(L, pos, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += (size_t)at_jx_utf8_put(cp, d + o);
            } else {
                /* unknown escapes stay as they are */
                d[o++] = '\\';
                d[o++] = e;
            }
        }
    }
    d[o] = '\0';
    *out = d;
    *outlen = o;
    return AT_OK;
}

static const struct {
    const char *s;
    int op;
} ops2[] = {{"//", JO_FLOORDIV}, {"**", JO_POW}, {"==", JO_EQ}, {"!=", JO_NE}, {">=", JO_GTEQ}, {"<=", JO_LTEQ}};

static int op1(char c)
{
    switch (c) {
    case '+': return JO_ADD;
    case '-': return JO_SUB;
    case '/': return JO_DIV;
    case '*': return JO_MUL;
    case '%': return JO_MOD;
    case '~': return JO_TILDE;
    case '[': return JO_LBRACKET;
    case ']': return JO_RBRACKET;
    case '(': return JO_LPAREN;
    case ')': return JO_RPAREN;
    case '{': return JO_LBRACE;
    case '}': return JO_RBRACE;
    case '>': return JO_GT;
    case '<': return JO_LT;
    case '=': return JO_ASSIGN;
    case '.': return JO_DOT;
    case ':': return JO_COLON;
    case '|': return JO_PIPE;
    case ',': return JO_COMMA;
    case ';': return JO_SEMICOLON;
    }
    return 0;
}

#define MAX_BALANCE 256

/* Lexes the inside of {{ }} or {% %} starting at *pos; stops after the end
 * delimiter. Sets *line_starting. */
static at_status lex_tag(lexer *L, size_t *pos, int is_block, int *line_starting)
{
    const char *s = L->s;
    size_t n = L->n, i = *pos;
    char stack[MAX_BALANCE];
    int depth = 0;
    for (;;) {
        if (i >= n) return lex_fail(L, i, "unexpected end of template inside a tag");
        if (depth == 0) {
            if (is_block) {
                if (s[i] == '+' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
                    AT_TRY(push(L, JT_BLOCK_END, i, NULL));
                    *pos = i + 3;
                    *line_starting = 0;
                    return AT_OK;
                }
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
                    AT_TRY(push(L, JT_BLOCK_END, i, NULL));
                    size_t e = skip_spaces(s, n, i + 3);
                    *line_starting = e > i + 3 && s[e - 1] == '\n';
                    *pos = e;
                    return AT_OK;
                }
                if (s[i] == '%' && i + 1 < n && s[i + 1] == '}') {
                    AT_TRY(push(L, JT_BLOCK_END, i, NULL));
                    size_t e = i + 2;
                    if (e < n && s[e] == '\n') e++;
                    *line_starting = s[e - 1] == '\n';
                    *pos = e;
                    return AT_OK;
                }
            } else {
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}') {
                    AT_TRY(push(L, JT_VAR_END, i, NULL));
                    size_t e = skip_spaces(s, n, i + 3);
                    *line_starting = e > i + 3 && s[e - 1] == '\n';
                    *pos = e;
                    return AT_OK;
                }
                if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
                    AT_TRY(push(L, JT_VAR_END, i, NULL));
                    *pos = i + 2;
                    *line_starting = 0;
                    return AT_OK;
                }
            }
        }
        size_t k = space_at(s, n, i);
        if (k) {
            i = skip_spaces(s, n, i);
            continue;
        }
        at_jx_tok *t = NULL;
        size_t j = scan_float(s, n, i);
        if (j > i) {
            char buf[128];
            size_t o = 0;
            for (size_t q = i; q < j && o + 1 < sizeof buf; q++)
                if (s[q] != '_') buf[o++] = s[q];
            buf[o] = '\0';
            AT_TRY(push(L, JT_FLOAT, i, &t));
            t->fval = strtod(buf, NULL);
            i = j;
            continue;
        }
        int base;
        j = scan_int(s, n, i, &base);
        if (j > i) {
            AT_TRY(push(L, JT_INT, i, &t));
            size_t q = i + (base != 10 ? 2 : 0);
            uint64_t v = 0;
            int overflow = 0;
            for (; q < j; q++) {
                if (s[q] == '_') continue;
                uint64_t dv = (uint64_t)hexval(s[q]);
                if (v > (UINT64_MAX - dv) / (uint64_t)base) overflow = 1;
                v = v * (uint64_t)base + dv;
            }
            if (overflow || v > (uint64_t)INT64_MAX) return lex_fail(L, i, "integer literal too large");
            t->ival = (int64_t)v;
            i = j;
            continue;
        }
        if (is_name_start((unsigned char)s[i])) {
            j = i;
            while (j < n && is_name_char((unsigned char)s[j])) j++;
            AT_TRY(push(L, JT_NAME, i, &t));
            t->s = s + i;
            t->len = j - i;
            i = j;
            continue;
        }
        if (s[i] == '\'' || s[i] == '"') {
            char q = s[i];
            j = i + 1;
            while (j < n && s[j] != q) j += s[j] == '\\' ? 2 : 1;
            if (j >= n) return lex_fail(L, i, "unterminated string literal");
            AT_TRY(push(L, JT_STRING, i, &t));
            char *d = NULL;
            size_t dl = 0;
            AT_TRY(decode_string(L, i, s + i + 1, j - i - 1, &d, &dl));
            t->s = d;
            t->len = dl;
            i = j + 1;
            continue;
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t q = 0; q < sizeof ops2 / sizeof ops2[0]; q++)
            if (i + 1 < n && s[i] == ops2[q].s[0] && s[i + 1] == ops2[q].s[1]) {
                op = ops2[q].op;
                oplen = 2;
                break;
            }
        if (!op) {
            op = op1(s[i]);
            oplen = 1;
        }
        if (!op) {
            char msg[64];
            if ((unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f)
                snprintf(msg, sizeof msg, "unexpected char '%c'", s[i]);
            else
                snprintf(msg, sizeof msg, "unexpected char 0x%02x", (unsigned char)s[i]);
            return lex_fail(L, i, msg);
        }
        if (op == JO_LBRACE || op == JO_LPAREN || op == JO_LBRACKET) {
            if (depth == MAX_BALANCE) return lex_fail(L, i, "brackets nested too deeply");
            stack[depth++] = op == JO_LBRACE ? '}' : op == JO_LPAREN ? ')' : ']';
        } else if (op == JO_RBRACE || op == JO_RPAREN || op == JO_RBRACKET) {
            char want = op == JO_RBRACE ? '}' : op == JO_RPAREN ? ')' : ']';
            if (depth == 0) {
                char msg[32];
                snprintf(msg, sizeof msg, "unexpected '%c'", want);
                return lex_fail(L, i, msg);
            }
            if (stack[depth - 1] != want) {
                char msg[48];
                snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", want, stack[depth - 1]);
                return lex_fail(L, i, msg);
            }
            depth--;
        }
        AT_TRY(push(L, JT_OP, i, &t));
        t->op = op;
        i += oplen;
    }
}

/* Finds "{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)" from i. On success sets the
 * data end, the sign and the position after the tag. */
static int find_endraw(const char *s, size_t n, size_t i, size_t *data_end, char *sign, size_t *after)
{
    for (size_t p = i; p + 1 < n; p++) {
        if (s[p] != '{' || s[p + 1] != '%') continue;
        size_t q = p + 2;
        char sg = 0;
        if (q < n && (s[q] == '-' || s[q] == '+')) sg = s[q++];
        q = skip_spaces(s, n, q);
        if (q + 6 > n || memcmp(s + q, "endraw", 6) != 0) continue;
        q = skip_spaces(s, n, q + 6);
        if (q + 2 < n + 0 && s[q] == '+' && q + 2 < n && s[q + 1] == '%' && s[q + 2] == '}') {
            *after = q + 3;
        } else if (q + 2 < n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') {
            *after = skip_spaces(s, n, q + 3);
        } else if (q + 1 < n && s[q] == '%' && s[q + 1] == '}') {
            *after = q + 2 < n && s[q + 2] == '\n' ? q + 3 : q + 2;
        } else {
            continue;
        }
        *data_end = p;
        *sign = sg;
        return 1;
    }
    return 0;
}

/* "{%[-+]?\s*raw\s*(-%}\s*|%})" at p: returns the position after it, or 0. */
static size_t match_raw_begin(const char *s, size_t n, size_t p)
{
    size_t q = p + 2;
    if (q < n && (s[q] == '-' || s[q] == '+')) q++;
    q = skip_spaces(s, n, q);
    if (q + 3 > n || memcmp(s + q, "raw", 3) != 0) return 0;
    q = skip_spaces(s, n, q + 3);
    if (q + 2 < n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') return skip_spaces(s, n, q + 3);
    if (q + 1 < n && s[q] == '%' && s[q + 1] == '}') return q + 2;
    return 0;
}

at_status at_jx_lex(const char *src, size_t len, const char *name, at_jx_arena *ar, at_jx_tok **toks, size_t *ntoks)
{
    lexer L = {0};
    L.name = name;
    L.ar = ar;
    L.line = 1;
    /* normalize newlines */
    char *s = at_jx_alloc(ar, len + 1);
    if (!s) return at_error(AT_ERR_NOMEM, "%s: template too large", name);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = '\0';
    L.s = s;
    L.n = n;

    size_t pos = 0;
    int line_starting = 1;
    while (pos < n) {
        /* next tag start */
        size_t p = pos;
        int kind = 0; /* '{', '%', '#' */
        while (p + 1 < n) {
            if (s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')) {
                kind = s[p + 1];
                break;
            }
            p++;
        }
        if (!kind) {
            AT_TRY(emit_data(&L, pos, s + pos, n - pos));
            break;
        }
        char sign = (p + 2 < n && (s[p + 2] == '-' || s[p + 2] == '+')) ? s[p + 2] : 0;
        size_t raw_after = kind == '%' ? match_raw_begin(s, n, p) : 0;
        size_t dl = strip_data(s + pos, p - pos, sign, kind == '{', line_starting);
        AT_TRY(emit_data(&L, pos, s + pos, dl));
        if (raw_after) {
            size_t dend, after;
            char esign;
            if (!find_endraw(s, n, raw_after, &dend, &esign, &after)) return lex_fail(&L, p, "missing end of raw directive");
            /* the data before {% endraw %} follows the same stripping rules */
            size_t rl = strip_data(s + raw_after, dend - raw_after, esign, 0, s[raw_after - 1] == '\n');
            AT_TRY(emit_data(&L, raw_after, s + raw_after, rl));
            pos = after;
            line_starting = s[after - 1] == '\n';
            continue;
        }
        size_t body = p + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t q = body, after = 0;
            for (; q + 1 < n; q++) {
                if ((s[q] == '+' || s[q] == '-') && q + 2 < n && s[q + 1] == '#' && s[q + 2] == '}') {
                    after = s[q] == '-' ? skip_spaces(s, n, q + 3) : q + 3;
                    break;
                }
                if (s[q] == '#' && s[q + 1] == '}') {
                    after = q + 2 < n && s[q + 2] == '\n' ? q + 3 : q + 2;
                    break;
                }
            }
            if (!after) return lex_fail(&L, p, "missing end of comment tag");
            pos = after;
            line_starting = s[after - 1] == '\n';
            continue;
        }
        AT_TRY(push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, p, NULL));
        pos = body;
        AT_TRY(lex_tag(&L, &pos, kind == '%', &line_starting));
    }
    AT_TRY(push(&L, JT_EOF, n, NULL));
    *toks = L.toks;
    *ntoks = L.ntoks;
    return AT_OK;
}
