/* Values of the Jinja interpreter and their Python semantics: truth,
 * equality, ordering, str(), repr(), json.dumps(). */
#include "text/jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena ---- */

struct at_jx_block {
    at_jx_block *next;
    size_t used, cap;
    max_align_t align_[];
};

void *at_jx_alloc(at_jx_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    at_jx_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 - sizeof *b ? n : 65536 - sizeof *b;
        /* grow block size with use so big renders need few mallocs */
        if (a->total / 8 > cap) cap = a->total / 8;
        if (cap < n) cap = n;
        if (a->limit && a->total + cap + sizeof *b > a->limit) {
            if (a->total + n + sizeof *b > a->limit) return NULL;
            cap = n;
        }
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += sizeof *b + cap;
    }
    void *p = (char *)(b + 1) + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void at_jx_arena_free(at_jx_arena *a)
{
    at_jx_block *b = a->head;
    while (b) {
        at_jx_block *nx = b->next;
        free(b);
        b = nx;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- errors ---- */

at_status at_jx_fail(at_jx_ctx *c, const at_jx_node *site, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (site) return at_error(AT_ERR_INVALID, "%s:%d:%d: %s", c->t->name, site->line, site->col, msg);
    return at_error(AT_ERR_INVALID, "%s: %s", c->t->name, msg);
}

at_status at_jx_oom(at_jx_ctx *c, const at_jx_node *site)
{
    return at_jx_fail(c, site, "template needs more than %zu bytes of memory (limit)", c->ar.limit);
}

/* ---- buffers ---- */

at_status at_jx_put(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, const char *s, size_t n)
{
    if (n == 0) return AT_OK;
    if (b->len + n > c->opt.max_output)
        return at_jx_fail(c, site, "template output exceeds %zu bytes (limit)", c->opt.max_output);
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *p = at_jx_alloc(&c->ar, nc);
        if (!p) return at_jx_oom(c, site);
        if (b->len) memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return AT_OK;
}

at_status at_jx_putc(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, char ch) { return at_jx_put(c, site, b, &ch, 1); }

/* ---- construction ---- */

at_jx_value at_jx_undef(const char *name)
{
    at_jx_value v = {.type = JX_UNDEF};
    v.u.undef_name = name;
    return v;
}
at_jx_value at_jx_none(void) { return (at_jx_value){.type = JX_NONE}; }
at_jx_value at_jx_bool(int b)
{
    at_jx_value v = {.type = JX_BOOL};
    v.u.b = b != 0;
    return v;
}
at_jx_value at_jx_int(int64_t i)
{
    at_jx_value v = {.type = JX_INT};
    v.u.i = i;
    return v;
}
at_jx_value at_jx_float(double f)
{
    at_jx_value v = {.type = JX_FLOAT};
    v.u.f = f;
    return v;
}

at_status at_jx_str_new(at_jx_ctx *c, const at_jx_node *site, const char *s, size_t n, at_jx_value *out)
{
    at_jx_str *p = at_jx_alloc(&c->ar, sizeof *p + n + 1);
    if (!p) return at_jx_oom(c, site);
    p->len = n;
    if (n) memcpy(p->s, s, n);
    out->type = JX_STR;
    out->u.s = p;
    return AT_OK;
}

at_status at_jx_str_buf(at_jx_ctx *c, const at_jx_node *site, const at_jx_buf *b, at_jx_value *out)
{
    return at_jx_str_new(c, site, b->p ? b->p : "", b->len, out);
}

at_status at_jx_list_new(at_jx_ctx *c, const at_jx_node *site, size_t cap, at_jx_value *out)
{
    at_jx_list *l = at_jx_alloc(&c->ar, sizeof *l);
    if (!l) return at_jx_oom(c, site);
    if (cap) {
        l->v = at_jx_alloc(&c->ar, cap * sizeof *l->v);
        if (!l->v) return at_jx_oom(c, site);
        l->cap = cap;
    }
    out->type = JX_LIST;
    out->u.l = l;
    return AT_OK;
}

at_status at_jx_list_push(at_jx_ctx *c, const at_jx_node *site, at_jx_list *l, at_jx_value v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        at_jx_value *nv = at_jx_alloc(&c->ar, nc * sizeof *nv);
        if (!nv) return at_jx_oom(c, site);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return AT_OK;
}

at_status at_jx_dict_new(at_jx_ctx *c, const at_jx_node *site, int kind, at_jx_value *out)
{
    at_jx_dict *d = at_jx_alloc(&c->ar, sizeof *d);
    if (!d) return at_jx_oom(c, site);
    d->kind = kind;
    out->type = JX_DICT;
    out->u.d = d;
    return AT_OK;
}

at_jx_value *at_jx_dict_get(const at_jx_dict *d, at_jx_value k)
{
    for (size_t i = 0; i < d->n; i++)
        if (at_jx_equal(d->keys[i], k)) return &d->vals[i];
    return NULL;
}

at_jx_value *at_jx_dict_get_cstr(const at_jx_dict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == JX_STR && d->keys[i].u.s->len == n && memcmp(d->keys[i].u.s->s, k, n) == 0)
            return &d->vals[i];
    return NULL;
}

at_status at_jx_dict_set(at_jx_ctx *c, const at_jx_node *site, at_jx_dict *d, at_jx_value k, at_jx_value v)
{
    at_jx_value *p = at_jx_dict_get(d, k);
    if (p) {
        *p = v;
        return AT_OK;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        at_jx_value *nk = at_jx_alloc(&c->ar, nc * sizeof *nk);
        at_jx_value *nv = at_jx_alloc(&c->ar, nc * sizeof *nv);
        if (!nk || !nv) return at_jx_oom(c, site);
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof *nk);
            memcpy(nv, d->vals, d->n * sizeof *nv);
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = nc;
    }
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    return AT_OK;
}

/* ---- UTF-8 ---- */

uint32_t at_jx_utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t p = *i;
    unsigned char c0 = u[p];
    if (c0 < 0x80) {
        *i = p + 1;
        return c0;
    }
    int len = c0 >= 0xF0 && c0 < 0xF8 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC0 ? 2 : 0;
    if (len == 0 || p + (size_t)len > n) {
        *i = p + 1;
        return c0;
    }
    uint32_t cp = c0 & (0xFF >> (len + 1));
    for (int k = 1; k < len; k++) {
        if ((u[p + (size_t)k] & 0xC0) != 0x80) {
            *i = p + 1;
            return c0;
        }
        cp = (cp << 6) | (u[p + (size_t)k] & 0x3F);
    }
    *i = p + (size_t)len;
    return cp;
}

size_t at_jx_utf8_count(const char *s, size_t n)
{
    size_t cnt = 0;
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
        } else {
            at_jx_utf8_next(s, n, &i);
        }
        cnt++;
    }
    return cnt;
}

int at_jx_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int at_jx_is_space(uint32_t cp)
{
    if (cp < 0x80) return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- Python semantics ---- */

int at_jx_truthy(at_jx_value v)
{
    switch (v.type) {
    case JX_UNDEF:
    case JX_NONE: return 0;
    case JX_BOOL: return v.u.b;
    case JX_INT: return v.u.i != 0;
    case JX_FLOAT: return v.u.f != 0.0;
    case JX_STR: return v.u.s->len != 0;
    case JX_LIST: return v.u.l->n != 0;
    case JX_DICT: return v.u.d->kind == JX_DICT_NAMESPACE || v.u.d->n != 0;
    default: return 1;
    }
}

int at_jx_is_number(at_jx_value v) { return v.type == JX_INT || v.type == JX_FLOAT || v.type == JX_BOOL; }

double at_jx_as_double(at_jx_value v)
{
    return v.type == JX_FLOAT ? v.u.f : v.type == JX_INT ? (double)v.u.i : v.type == JX_BOOL ? v.u.b : 0.0;
}

static int64_t as_int(at_jx_value v) { return v.type == JX_INT ? v.u.i : v.type == JX_BOOL ? v.u.b : 0; }

int at_jx_equal(at_jx_value a, at_jx_value b)
{
    if (at_jx_is_number(a) && at_jx_is_number(b)) {
        if (a.type == JX_FLOAT || b.type == JX_FLOAT) return at_jx_as_double(a) == at_jx_as_double(b);
        return as_int(a) == as_int(b);
    }
    if (a.type != b.type) return 0;
    switch (a.type) {
    case JX_UNDEF:
    case JX_NONE: return 1;
    case JX_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JX_LIST:
        if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!at_jx_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JX_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->kind != JX_DICT_PLAIN || b.u.d->kind != JX_DICT_PLAIN) return 0;
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            at_jx_value *o = at_jx_dict_get(b.u.d, a.u.d->keys[i]);
            if (!o || !at_jx_equal(a.u.d->vals[i], *o)) return 0;
        }
        return 1;
    case JX_FUNC: return a.u.fn == b.u.fn;
    case JX_LOOP: return a.u.loop == b.u.loop;
    }
    return 0;
}

const char *at_jx_type_name(at_jx_value v)
{
    switch (v.type) {
    case JX_UNDEF: return "Undefined";
    case JX_NONE: return "NoneType";
    case JX_BOOL: return "bool";
    case JX_INT: return "int";
    case JX_FLOAT: return "float";
    case JX_STR: return "str";
    case JX_LIST: return v.u.l->is_tuple ? "tuple" : "list";
    case JX_DICT: return v.u.d->kind == JX_DICT_NAMESPACE ? "Namespace" : "dict";
    case JX_FUNC: return "function";
    case JX_LOOP: return "LoopContext";
    }
    return "object";
}

at_status at_jx_compare(at_jx_ctx *c, const at_jx_node *site, at_jx_value a, at_jx_value b, int *cmp)
{
    if (at_jx_is_number(a) && at_jx_is_number(b)) {
        if (a.type == JX_FLOAT || b.type == JX_FLOAT) {
            double x = at_jx_as_double(a), y = at_jx_as_double(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = as_int(a), y = as_int(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        }
        return AT_OK;
    }
    if (a.type == JX_STR && b.type == JX_STR) {
        /* byte order of UTF-8 is code point order */
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, n);
        *cmp = r ? (r < 0 ? -1 : 1) : (a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0);
        return AT_OK;
    }
    if (a.type == JX_LIST && b.type == JX_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (at_jx_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return at_jx_compare(c, site, a.u.l->v[i], b.u.l->v[i], cmp);
        }
        *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
        return AT_OK;
    }
    if (a.type == JX_UNDEF) return at_jx_undefined_error(c, site, a);
    if (b.type == JX_UNDEF) return at_jx_undefined_error(c, site, b);
    return at_jx_fail(c, site, "TypeError: '<' not supported between instances of '%s' and '%s'", at_jx_type_name(a),
                      at_jx_type_name(b));
}

/* ---- text forms ---- */

void at_jx_format_float(double x, char *buf)
{
    if (isnan(x)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(buf, x < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1;
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

static at_status write_int(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, int64_t i)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)i);
    return at_jx_put(c, site, b, tmp, (size_t)n);
}

static at_status write_float(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, double f)
{
    char tmp[40];
    at_jx_format_float(f, tmp);
    return at_jx_put(c, site, b, tmp, strlen(tmp));
}

/* Python's str.isprintable for one code point. */
static int printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp < 0x7F) return 1;
    if (cp > 0x10FFFF) return 0;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return cp == ' ';
    default: return 1;
    }
}

static at_status write_str_repr(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    AT_TRY(at_jx_putc(c, site, b, q));
    for (size_t i = 0; i < n;) {
        size_t st = i;
        uint32_t cp = at_jx_utf8_next(s, n, &i);
        char tmp[16];
        if (cp == (uint32_t)q || cp == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)cp;
            AT_TRY(at_jx_put(c, site, b, tmp, 2));
        } else if (cp == '\n') {
            AT_TRY(at_jx_put(c, site, b, "\\n", 2));
        } else if (cp == '\r') {
            AT_TRY(at_jx_put(c, site, b, "\\r", 2));
        } else if (cp == '\t') {
            AT_TRY(at_jx_put(c, site, b, "\\t", 2));
        } else if (printable(cp)) {
            AT_TRY(at_jx_put(c, site, b, s + st, i - st));
        } else {
            int k = cp < 0x100 ? snprintf(tmp, sizeof tmp, "\\x%02x", cp)
                    : cp < 0x10000 ? snprintf(tmp, sizeof tmp, "\\u%04x", cp)
                                   : snprintf(tmp, sizeof tmp, "\\U%08x", cp);
            AT_TRY(at_jx_put(c, site, b, tmp, (size_t)k));
        }
    }
    return at_jx_putc(c, site, b, q);
}

#define MAX_NEST 512

static at_status write_repr_d(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v, int depth)
{
    if (depth > MAX_NEST) return at_jx_fail(c, site, "value nested too deeply to print");
    switch (v.type) {
    case JX_UNDEF: return at_jx_put(c, site, b, "Undefined", 9);
    case JX_NONE: return at_jx_put(c, site, b, "None", 4);
    case JX_BOOL: return v.u.b ? at_jx_put(c, site, b, "True", 4) : at_jx_put(c, site, b, "False", 5);
    case JX_INT: return write_int(c, site, b, v.u.i);
    case JX_FLOAT: return write_float(c, site, b, v.u.f);
    case JX_STR: return write_str_repr(c, site, b, v.u.s->s, v.u.s->len);
    case JX_LIST: {
        const at_jx_list *l = v.u.l;
        AT_TRY(at_jx_putc(c, site, b, l->is_tuple ? '(' : '['));
        for (size_t i = 0; i < l->n; i++) {
            if (i) AT_TRY(at_jx_put(c, site, b, ", ", 2));
            AT_TRY(write_repr_d(c, site, b, l->v[i], depth + 1));
        }
        if (l->is_tuple && l->n == 1) AT_TRY(at_jx_putc(c, site, b, ','));
        return at_jx_putc(c, site, b, l->is_tuple ? ')' : ']');
    }
    case JX_DICT: {
        const at_jx_dict *d = v.u.d;
        if (d->kind == JX_DICT_NAMESPACE) AT_TRY(at_jx_put(c, site, b, "<Namespace ", 11));
        AT_TRY(at_jx_putc(c, site, b, '{'));
        for (size_t i = 0; i < d->n; i++) {
            if (i) AT_TRY(at_jx_put(c, site, b, ", ", 2));
            AT_TRY(write_repr_d(c, site, b, d->keys[i], depth + 1));
            AT_TRY(at_jx_put(c, site, b, ": ", 2));
            AT_TRY(write_repr_d(c, site, b, d->vals[i], depth + 1));
        }
        AT_TRY(at_jx_putc(c, site, b, '}'));
        if (d->kind == JX_DICT_NAMESPACE) AT_TRY(at_jx_putc(c, site, b, '>'));
        return AT_OK;
    }
    case JX_FUNC: {
        char tmp[160];
        int k = snprintf(tmp, sizeof tmp, "<function %s>", v.u.fn->name ? v.u.fn->name : "?");
        return at_jx_put(c, site, b, tmp, (size_t)k);
    }
    case JX_LOOP: return at_jx_put(c, site, b, "<LoopContext>", 13);
    }
    return AT_OK;
}

at_status at_jx_write_repr(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v)
{
    return write_repr_d(c, site, b, v, 0);
}

at_status at_jx_write_str(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v)
{
    if (v.type == JX_STR) return at_jx_put(c, site, b, v.u.s->s, v.u.s->len);
    if (v.type == JX_UNDEF) return AT_OK;
    return write_repr_d(c, site, b, v, 0);
}

at_status at_jx_to_str(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, at_jx_value *out)
{
    if (v.type == JX_STR) {
        *out = v;
        return AT_OK;
    }
    at_jx_buf b = {0};
    AT_TRY(at_jx_write_str(c, site, &b, v));
    return at_jx_str_buf(c, site, &b, out);
}

static at_status write_json_str(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, const char *s, size_t n)
{
    AT_TRY(at_jx_putc(c, site, b, '"'));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                esc = tmp;
            }
        }
        if (esc) {
            AT_TRY(at_jx_put(c, site, b, s + run, i - run));
            AT_TRY(at_jx_put(c, site, b, esc, strlen(esc)));
            run = i + 1;
        }
    }
    AT_TRY(at_jx_put(c, site, b, s + run, n - run));
    return at_jx_putc(c, site, b, '"');
}

static at_status json_newline(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, int indent, int level)
{
    AT_TRY(at_jx_putc(c, site, b, '\n'));
    for (int i = 0; i < indent * level; i++) AT_TRY(at_jx_putc(c, site, b, ' '));
    return AT_OK;
}

/* json.dumps key conversion: str stays, others become their JSON text. */
static at_status json_key(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value k)
{
    switch (k.type) {
    case JX_STR: return write_json_str(c, site, b, k.u.s->s, k.u.s->len);
    case JX_NONE: return at_jx_put(c, site, b, "\"null\"", 6);
    case JX_BOOL: return k.u.b ? at_jx_put(c, site, b, "\"true\"", 6) : at_jx_put(c, site, b, "\"false\"", 7);
    case JX_INT:
    case JX_FLOAT: {
        AT_TRY(at_jx_putc(c, site, b, '"'));
        AT_TRY(k.type == JX_INT ? write_int(c, site, b, k.u.i) : write_float(c, site, b, k.u.f));
        return at_jx_putc(c, site, b, '"');
    }
    default:
        return at_jx_fail(c, site, "TypeError: keys must be str, int, float, bool or None, not %s",
                          at_jx_type_name(k));
    }
}

static int key_less(at_jx_value a, at_jx_value b)
{
    if (a.type != JX_STR || b.type != JX_STR) return 0;
    size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
    int r = memcmp(a.u.s->s, b.u.s->s, n);
    return r < 0 || (r == 0 && a.u.s->len < b.u.s->len);
}

at_status at_jx_write_json(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v, int indent,
                           const char *item_sep, const char *key_sep, int sort_keys, int depth)
{
    if (depth > MAX_NEST) return at_jx_fail(c, site, "value nested too deeply for tojson");
    switch (v.type) {
    case JX_NONE: return at_jx_put(c, site, b, "null", 4);
    case JX_BOOL: return v.u.b ? at_jx_put(c, site, b, "true", 4) : at_jx_put(c, site, b, "false", 5);
    case JX_INT: return write_int(c, site, b, v.u.i);
    case JX_FLOAT:
        if (isnan(v.u.f)) return at_jx_put(c, site, b, "NaN", 3);
        if (isinf(v.u.f)) return v.u.f < 0 ? at_jx_put(c, site, b, "-Infinity", 9) : at_jx_put(c, site, b, "Infinity", 8);
        return write_float(c, site, b, v.u.f);
    case JX_STR: return write_json_str(c, site, b, v.u.s->s, v.u.s->len);
    case JX_LIST: {
        const at_jx_list *l = v.u.l;
        if (l->n == 0) return at_jx_put(c, site, b, "[]", 2);
        AT_TRY(at_jx_putc(c, site, b, '['));
        for (size_t i = 0; i < l->n; i++) {
            if (i) AT_TRY(at_jx_put(c, site, b, item_sep, strlen(item_sep)));
            if (indent >= 0) AT_TRY(json_newline(c, site, b, indent, depth + 1));
            AT_TRY(at_jx_write_json(c, site, b, l->v[i], indent, item_sep, key_sep, sort_keys, depth + 1));
        }
        if (indent >= 0) AT_TRY(json_newline(c, site, b, indent, depth));
        return at_jx_putc(c, site, b, ']');
    }
    case JX_DICT: {
        const at_jx_dict *d = v.u.d;
        if (d->kind != JX_DICT_PLAIN)
            return at_jx_fail(c, site, "TypeError: Object of type Namespace is not JSON serializable");
        if (d->n == 0) return at_jx_put(c, site, b, "{}", 2);
        size_t *order = at_jx_alloc(&c->ar, d->n * sizeof *order);
        if (!order) return at_jx_oom(c, site);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) {
            for (size_t i = 0; i < d->n; i++)
                if (d->keys[i].type != JX_STR)
                    return at_jx_fail(c, site, "TypeError: sort_keys needs string keys");
            for (size_t i = 1; i < d->n; i++) { /* insertion sort: stable, dicts are small */
                size_t x = order[i], j = i;
                while (j > 0 && key_less(d->keys[x], d->keys[order[j - 1]])) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        AT_TRY(at_jx_putc(c, site, b, '{'));
        for (size_t i = 0; i < d->n; i++) {
            size_t k = order[i];
            if (i) AT_TRY(at_jx_put(c, site, b, item_sep, strlen(item_sep)));
            if (indent >= 0) AT_TRY(json_newline(c, site, b, indent, depth + 1));
            AT_TRY(json_key(c, site, b, d->keys[k]));
            AT_TRY(at_jx_put(c, site, b, key_sep, strlen(key_sep)));
            AT_TRY(at_jx_write_json(c, site, b, d->vals[k], indent, item_sep, key_sep, sort_keys, depth + 1));
        }
        if (indent >= 0) AT_TRY(json_newline(c, site, b, indent, depth));
        return at_jx_putc(c, site, b, '}');
    }
    default:
        return at_jx_fail(c, site, "TypeError: Object of type %s is not JSON serializable", at_jx_type_name(v));
    }
}

at_status at_jx_from_cjson(at_jx_ctx *c, const cJSON *j, at_jx_value *out, int depth)
{
    if (depth > MAX_NEST) return at_jx_fail(c, NULL, "input JSON nested too deeply");
    if (!j || cJSON_IsNull(j)) {
        *out = at_jx_none();
    } else if (cJSON_IsBool(j)) {
        *out = at_jx_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON does not keep "1.0" apart from "1": integral values are ints */
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            *out = at_jx_int((int64_t)d);
        else
            *out = at_jx_float(d);
    } else if (cJSON_IsString(j)) {
        const char *s = j->valuestring ? j->valuestring : "";
        AT_TRY(at_jx_str_new(c, NULL, s, strlen(s), out));
    } else if (cJSON_IsArray(j)) {
        AT_TRY(at_jx_list_new(c, NULL, (size_t)cJSON_GetArraySize(j), out));
        for (const cJSON *e = j->child; e; e = e->next) {
            at_jx_value v = {0};
            AT_TRY(at_jx_from_cjson(c, e, &v, depth + 1));
            AT_TRY(at_jx_list_push(c, NULL, out->u.l, v));
        }
    } else if (cJSON_IsObject(j)) {
        AT_TRY(at_jx_dict_new(c, NULL, JX_DICT_PLAIN, out));
        for (const cJSON *e = j->child; e; e = e->next) {
            at_jx_value k = {0}, v = {0};
            const char *ks = e->string ? e->string : "";
            AT_TRY(at_jx_str_new(c, NULL, ks, strlen(ks), &k));
            AT_TRY(at_jx_from_cjson(c, e, &v, depth + 1));
            AT_TRY(at_jx_dict_set(c, NULL, out->u.d, k, v));
        }
    } else {
        *out = at_jx_none();
    }
    return AT_OK;
}
