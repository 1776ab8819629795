/* Jinja builtins: global functions, Python methods of str/dict/list, the
 * loop object's methods, filters and tests — the subset real chat templates
 * use, with Jinja2 3.1 / Python 3 semantics.
 *
 * Globals: range, namespace, dict, raise_exception, strftime_now.
 * str methods: startswith endswith strip lstrip rstrip split rsplit splitlines
 *   upper lower title capitalize replace find rfind count join isdigit isalpha
 *   isalnum isspace isupper islower.   dict: items keys values get.
 *   list: index count.   loop: cycle changed.
 * Filters: abs attr batch capitalize center count d default dictsort e escape
 *   first float forceescape format indent int items join last length list
 *   lower map max min reject rejectattr replace reverse round safe select
 *   selectattr sort string sum title tojson trim truncate unique upper
 *   wordcount.
 * Tests: boolean callable defined divisibleby eq equalto escaped even false
 *   filter float ge gt greaterthan in integer iterable le lower lt lessthan
 *   mapping ne none number odd sameas sequence string test true undefined
 *   upper, and the operator spellings == != > >= < <=.
 * Case mapping is Unicode's simple (one-to-one) mapping via utf8proc, so
 * e.g. "ß".upper() stays "ß" where Python gives "SS". */
#include "text/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- small helpers ---- */

static int streq(const char *a, size_t n, const char *b) { return strlen(b) == n && memcmp(a, b, n) == 0; }

static at_status need_str(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, const char *what)
{
    if (v.type == JX_STR) return AT_OK;
    if (v.type == JX_UNDEF) return at_jx_undefined_error(c, site, v);
    return at_jx_fail(c, site, "TypeError: %s must be str, not %s", what, at_jx_type_name(v));
}

/* soft_str: str(v), with undefined as "". */
static at_status soft_str(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, at_jx_str **out)
{
    at_jx_value s = {0};
    if (v.type == JX_UNDEF) {
        AT_TRY(at_jx_str_new(c, site, "", 0, &s));
    } else {
        AT_TRY(at_jx_to_str(c, site, v, &s));
    }
    *out = s.u.s;
    return AT_OK;
}

static at_status mkstr(at_jx_ctx *c, const at_jx_node *site, const char *s, size_t n, at_jx_value *out)
{
    return at_jx_str_new(c, site, s, n, out);
}

/* keyword argument lookup */
static const at_jx_value *kwarg(int nkw, const char **names, const at_jx_value *vals, const char *name)
{
    for (int i = 0; i < nkw; i++)
        if (!strcmp(names[i], name)) return &vals[i];
    return NULL;
}

/* argument i (positional) or keyword `name`, else NULL */
static const at_jx_value *arg(int nargs, const at_jx_value *args, int i, int nkw, const char **names,
                              const at_jx_value *vals, const char *name)
{
    if (i < nargs) return &args[i];
    return name ? kwarg(nkw, names, vals, name) : NULL;
}

static int is_cased(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_PY, CASE_CAPITALIZE, CASE_TITLE_JINJA };

static int jinja_title_sep(uint32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || at_jx_is_space(cp);
}

static at_status change_case(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, int mode, at_jx_value *out)
{
    at_jx_buf b = {0};
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = at_jx_utf8_next(s->s, s->len, &i);
        uint32_t r = cp;
        if (cp <= 0x10FFFF) {
            switch (mode) {
            case CASE_UPPER: r = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); break;
            case CASE_LOWER: r = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); break;
            case CASE_TITLE_PY:
                r = prev_cased ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)
                               : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
                prev_cased = is_cased(cp);
                break;
            case CASE_CAPITALIZE:
                r = first ? (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
                break;
            case CASE_TITLE_JINJA:
                if (jinja_title_sep(cp)) {
                    word_start = 1;
                } else {
                    r = word_start ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp)
                                   : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
                    word_start = 0;
                }
                break;
            }
        }
        first = 0;
        char tmp[4];
        AT_TRY(at_jx_put(c, site, &b, tmp, (size_t)at_jx_utf8_put(r, tmp)));
    }
    return at_jx_str_buf(c, site, &b, out);
}

/* Does code point cp occur in chars? */
static int in_chars(uint32_t cp, const at_jx_str *chars)
{
    for (size_t i = 0; i < chars->len;)
        if (at_jx_utf8_next(chars->s, chars->len, &i) == cp) return 1;
    return 0;
}

/* strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace */
static at_status strip(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, const at_jx_str *chars, int which,
                       at_jx_value *out)
{
    size_t a = 0, e = s->len;
    if (which & 1) {
        while (a < e) {
            size_t j = a;
            uint32_t cp = at_jx_utf8_next(s->s, e, &j);
            if (chars ? !in_chars(cp, chars) : !at_jx_is_space(cp)) break;
            a = j;
        }
    }
    if (which & 2) {
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            uint32_t cp = at_jx_utf8_next(s->s, e, &j);
            if (j != e) cp = (unsigned char)s->s[e - 1], st = e - 1; /* invalid UTF-8: one byte */
            if (chars ? !in_chars(cp, chars) : !at_jx_is_space(cp)) break;
            e = st;
        }
    }
    return mkstr(c, site, s->s + a, e - a, out);
}

static size_t space_len(const char *s, size_t n, size_t i)
{
    size_t j = i;
    uint32_t cp = at_jx_utf8_next(s, n, &j);
    return at_jx_is_space(cp) ? j - i : 0;
}

/* Python str.split / rsplit */
static at_status split(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, const at_jx_str *sep,
                       int64_t maxsplit, int from_right, at_jx_value *out)
{
    AT_TRY(at_jx_list_new(c, site, 0, out));
    at_jx_list *l = out->u.l;
    at_jx_value piece = {0};
    if (sep && sep->len == 0) return at_jx_fail(c, site, "ValueError: empty separator");
    if (!from_right || maxsplit < 0) {
        size_t i = 0;
        int64_t splits = 0;
        if (!sep) {
            for (;;) {
                size_t k = 0;
                while (i < s->len && (k = space_len(s->s, s->len, i)) > 0) i += k;
                if (i >= s->len) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    /* the rest, as it is (Python keeps its trailing whitespace) */
                    AT_TRY(mkstr(c, site, s->s + i, s->len - i, &piece));
                    AT_TRY(at_jx_list_push(c, site, l, piece));
                    break;
                }
                size_t st = i;
                while (i < s->len && space_len(s->s, s->len, i) == 0) at_jx_utf8_next(s->s, s->len, &i);
                AT_TRY(mkstr(c, site, s->s + st, i - st, &piece));
                AT_TRY(at_jx_list_push(c, site, l, piece));
                splits++;
            }
            return AT_OK;
        }
        for (;;) {
            const char *hit = (maxsplit < 0 || splits < maxsplit)
                                  ? memmem(s->s + i, s->len - i, sep->s, sep->len)
                                  : NULL;
            size_t e = hit ? (size_t)(hit - s->s) : s->len;
            AT_TRY(mkstr(c, site, s->s + i, e - i, &piece));
            AT_TRY(at_jx_list_push(c, site, l, piece));
            if (!hit) break;
            i = e + sep->len;
            splits++;
        }
        return AT_OK;
    }
    /* rsplit with maxsplit >= 0: split from the right, then reverse */
    at_jx_value rev = {0};
    AT_TRY(at_jx_list_new(c, site, 0, &rev));
    size_t e = s->len;
    int64_t splits = 0;
    if (!sep) {
        for (;;) {
            while (e > 0 && space_len(s->s, e, e - 1) == 1) e--;
            if (e == 0) break;
            if (splits >= maxsplit) {
                AT_TRY(mkstr(c, site, s->s, e, &piece));
                AT_TRY(at_jx_list_push(c, site, rev.u.l, piece));
                break;
            }
            size_t st = e;
            while (st > 0 && space_len(s->s, e, st - 1) != 1) st--;
            AT_TRY(mkstr(c, site, s->s + st, e - st, &piece));
            AT_TRY(at_jx_list_push(c, site, rev.u.l, piece));
            e = st;
            splits++;
        }
    } else {
        for (;;) {
            size_t hit = (size_t)-1;
            if (splits < maxsplit && e >= sep->len)
                for (size_t p = e - sep->len + 1; p > 0; p--)
                    if (memcmp(s->s + p - 1, sep->s, sep->len) == 0) {
                        hit = p - 1;
                        break;
                    }
            size_t st = hit == (size_t)-1 ? 0 : hit + sep->len;
            AT_TRY(mkstr(c, site, s->s + st, e - st, &piece));
            AT_TRY(at_jx_list_push(c, site, rev.u.l, piece));
            if (hit == (size_t)-1) break;
            e = hit;
            splits++;
        }
    }
    for (size_t k = rev.u.l->n; k > 0; k--) AT_TRY(at_jx_list_push(c, site, l, rev.u.l->v[k - 1]));
    return AT_OK;
}

/* Python str.splitlines(): line boundaries \n \r \r\n \v \f \x1c-\x1e \x85 \u2028 \u2029 */
static at_status splitlines(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, int keepends, at_jx_value *out)
{
    AT_TRY(at_jx_list_new(c, site, 0, out));
    size_t st = 0, i = 0;
    while (i < s->len) {
        size_t j = i;
        uint32_t cp = at_jx_utf8_next(s->s, s->len, &j);
        int br = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
                 cp == 0x2028 || cp == 0x2029;
        if (!br) {
            i = j;
            continue;
        }
        if (cp == '\r' && j < s->len && s->s[j] == '\n') j++;
        at_jx_value piece = {0};
        AT_TRY(mkstr(c, site, s->s + st, (keepends ? j : i) - st, &piece));
        AT_TRY(at_jx_list_push(c, site, out->u.l, piece));
        st = i = j;
    }
    if (st < s->len) {
        at_jx_value piece = {0};
        AT_TRY(mkstr(c, site, s->s + st, s->len - st, &piece));
        AT_TRY(at_jx_list_push(c, site, out->u.l, piece));
    }
    return AT_OK;
}

static at_status replace(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, const at_jx_str *old,
                         const at_jx_str *new_, int64_t count, at_jx_value *out)
{
    at_jx_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) {
        /* Python inserts `new` between code points, count times */
        for (;;) {
            if (count >= 0 && done >= count) break;
            AT_TRY(at_jx_put(c, site, &b, new_->s, new_->len));
            done++;
            if (i >= s->len) break;
            size_t j = i;
            at_jx_utf8_next(s->s, s->len, &j);
            AT_TRY(at_jx_put(c, site, &b, s->s + i, j - i));
            i = j;
        }
        AT_TRY(at_jx_put(c, site, &b, s->s + i, s->len - i));
        return at_jx_str_buf(c, site, &b, out);
    }
    for (;;) {
        const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!hit) break;
        size_t p = (size_t)(hit - s->s);
        AT_TRY(at_jx_put(c, site, &b, s->s + i, p - i));
        AT_TRY(at_jx_put(c, site, &b, new_->s, new_->len));
        i = p + old->len;
        done++;
    }
    AT_TRY(at_jx_put(c, site, &b, s->s + i, s->len - i));
    return at_jx_str_buf(c, site, &b, out);
}

static int64_t count_sub(const at_jx_str *s, const at_jx_str *sub)
{
    if (sub->len == 0) return (int64_t)at_jx_utf8_count(s->s, s->len) + 1;
    int64_t n = 0;
    size_t i = 0;
    const char *hit;
    while ((hit = memmem(s->s + i, s->len - i, sub->s, sub->len)) != NULL) {
        n++;
        i = (size_t)(hit - s->s) + sub->len;
    }
    return n;
}

static int has_prefix(const at_jx_str *s, const at_jx_str *p, int suffix)
{
    if (p->len > s->len) return 0;
    return memcmp(suffix ? s->s + s->len - p->len : s->s, p->s, p->len) == 0;
}

static int64_t opt_int(const at_jx_value *v, int64_t dflt)
{
    if (!v || v->type == JX_NONE) return dflt;
    if (v->type == JX_INT) return v->u.i;
    if (v->type == JX_BOOL) return v->u.b;
    return dflt;
}

static at_status html_escape(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, at_jx_value *out)
{
    at_jx_buf b = {0};
    for (size_t i = 0; i < s->len; i++) {
        const char *r = NULL;
        switch (s->s[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        }
        if (r)
            AT_TRY(at_jx_put(c, site, &b, r, strlen(r)));
        else
            AT_TRY(at_jx_putc(c, site, &b, s->s[i]));
    }
    return at_jx_str_buf(c, site, &b, out);
}

/* ---- globals ---- */

enum { G_RANGE = 1, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static const struct {
    const char *name;
    int id;
} globals_tab[] = {{"range", G_RANGE},
                   {"namespace", G_NAMESPACE},
                   {"dict", G_DICT},
                   {"raise_exception", G_RAISE},
                   {"strftime_now", G_STRFTIME}};

static int make_func(at_jx_ctx *c, int kind, int id, const char *name, at_jx_value self, at_jx_value *out)
{
    at_jx_func *fn = at_jx_alloc(&c->ar, sizeof *fn);
    if (!fn) {
        /* reported as undefined; the memory error surfaces on the next allocation */
        *out = at_jx_undef("out of memory");
        return 1;
    }
    fn->kind = kind;
    fn->id = id;
    fn->name = name;
    fn->self = self;
    out->type = JX_FUNC;
    out->u.fn = fn;
    return 1;
}

int at_jx_global(const char *name, size_t len, at_jx_value *out, at_jx_ctx *c)
{
    for (size_t i = 0; i < sizeof globals_tab / sizeof globals_tab[0]; i++)
        if (streq(name, len, globals_tab[i].name))
            return make_func(c, JX_FN_GLOBAL, globals_tab[i].id, globals_tab[i].name, at_jx_none(), out);
    return 0;
}

/* ---- methods ---- */

enum {
    M_STARTSWITH = 1, M_ENDSWITH, M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_SCOUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE,
    M_ISUPPER, M_ISLOWER,
    M_ITEMS = 100, M_KEYS, M_VALUES, M_GET,
    M_INDEX = 200, M_LCOUNT,
    M_CYCLE = 300, M_CHANGED
};

static const struct {
    int type;
    const char *name;
    int id;
} methods_tab[] = {
    {JX_STR, "startswith", M_STARTSWITH}, {JX_STR, "endswith", M_ENDSWITH}, {JX_STR, "strip", M_STRIP},
    {JX_STR, "lstrip", M_LSTRIP}, {JX_STR, "rstrip", M_RSTRIP}, {JX_STR, "split", M_SPLIT},
    {JX_STR, "rsplit", M_RSPLIT}, {JX_STR, "splitlines", M_SPLITLINES}, {JX_STR, "upper", M_UPPER},
    {JX_STR, "lower", M_LOWER}, {JX_STR, "title", M_TITLE}, {JX_STR, "capitalize", M_CAPITALIZE},
    {JX_STR, "replace", M_REPLACE}, {JX_STR, "find", M_FIND}, {JX_STR, "rfind", M_RFIND},
    {JX_STR, "count", M_SCOUNT}, {JX_STR, "join", M_JOIN}, {JX_STR, "isdigit", M_ISDIGIT},
    {JX_STR, "isalpha", M_ISALPHA}, {JX_STR, "isalnum", M_ISALNUM}, {JX_STR, "isspace", M_ISSPACE},
    {JX_STR, "isupper", M_ISUPPER}, {JX_STR, "islower", M_ISLOWER},
    {JX_DICT, "items", M_ITEMS}, {JX_DICT, "keys", M_KEYS}, {JX_DICT, "values", M_VALUES}, {JX_DICT, "get", M_GET},
    {JX_LIST, "index", M_INDEX}, {JX_LIST, "count", M_LCOUNT},
    {JX_LOOP, "cycle", M_CYCLE}, {JX_LOOP, "changed", M_CHANGED},
};

int at_jx_method(at_jx_ctx *c, at_jx_value obj, const char *name, size_t len, at_jx_value *out)
{
    if (obj.type == JX_DICT && obj.u.d->kind != JX_DICT_PLAIN) return 0;
    for (size_t i = 0; i < sizeof methods_tab / sizeof methods_tab[0]; i++)
        if (methods_tab[i].type == obj.type && streq(name, len, methods_tab[i].name))
            return make_func(c, JX_FN_METHOD, methods_tab[i].id, methods_tab[i].name, obj, out);
    return 0;
}

static at_status dict_items(at_jx_ctx *c, const at_jx_node *site, const at_jx_dict *d, at_jx_value *out)
{
    AT_TRY(at_jx_list_new(c, site, d->n, out));
    for (size_t i = 0; i < d->n; i++) {
        at_jx_value t = {0};
        AT_TRY(at_jx_list_new(c, site, 2, &t));
        t.u.l->is_tuple = 1;
        AT_TRY(at_jx_list_push(c, site, t.u.l, d->keys[i]));
        AT_TRY(at_jx_list_push(c, site, t.u.l, d->vals[i]));
        AT_TRY(at_jx_list_push(c, site, out->u.l, t));
    }
    return AT_OK;
}

static int str_class(const at_jx_str *s, int id)
{
    if (s->len == 0) return 0;
    int any_cased = 0;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = at_jx_utf8_next(s->s, s->len, &i);
        utf8proc_category_t k = cp <= 0x10FFFF ? utf8proc_category((utf8proc_int32_t)cp) : UTF8PROC_CATEGORY_CN;
        int alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int numeric = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (id) {
        case M_ISDIGIT: if (!digit) return 0; break;
        case M_ISALPHA: if (!alpha) return 0; break;
        case M_ISALNUM: if (!alpha && !numeric) return 0; break;
        case M_ISSPACE: if (!at_jx_is_space(cp)) return 0; break;
        case M_ISUPPER:
            if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return 0;
            if (k == UTF8PROC_CATEGORY_LU) any_cased = 1;
            break;
        case M_ISLOWER:
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return 0;
            if (k == UTF8PROC_CATEGORY_LL) any_cased = 1;
            break;
        }
    }
    return (id == M_ISUPPER || id == M_ISLOWER) ? any_cased : 1;
}

static at_status call_str_method(at_jx_ctx *c, const at_jx_node *site, int id, const at_jx_str *s, int nargs,
                                 const at_jx_value *args, int nkw, const char **kwn, const at_jx_value *kwv,
                                 at_jx_value *out)
{
    const at_jx_value *a0 = arg(nargs, args, 0, nkw, kwn, kwv, NULL);
    switch (id) {
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (!a0) return at_jx_fail(c, site, "TypeError: %s() takes at least 1 argument", id == M_STARTSWITH ? "startswith" : "endswith");
        if (a0->type == JX_LIST && a0->u.l->is_tuple) {
            int r = 0;
            for (size_t i = 0; i < a0->u.l->n; i++) {
                AT_TRY(need_str(c, site, a0->u.l->v[i], "tuple item"));
                r |= has_prefix(s, a0->u.l->v[i].u.s, id == M_ENDSWITH);
            }
            *out = at_jx_bool(r);
            return AT_OK;
        }
        AT_TRY(need_str(c, site, *a0, "argument"));
        *out = at_jx_bool(has_prefix(s, a0->u.s, id == M_ENDSWITH));
        return AT_OK;
    }
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        const at_jx_str *chars = NULL;
        if (a0 && a0->type != JX_NONE) {
            AT_TRY(need_str(c, site, *a0, "strip arg"));
            chars = a0->u.s;
        }
        return strip(c, site, s, chars, id == M_STRIP ? 3 : id == M_LSTRIP ? 1 : 2, out);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        const at_jx_value *sep = arg(nargs, args, 0, nkw, kwn, kwv, "sep");
        const at_jx_value *mx = arg(nargs, args, 1, nkw, kwn, kwv, "maxsplit");
        const at_jx_str *sp = NULL;
        if (sep && sep->type != JX_NONE) {
            AT_TRY(need_str(c, site, *sep, "separator"));
            sp = sep->u.s;
        }
        return split(c, site, s, sp, opt_int(mx, -1), id == M_RSPLIT, out);
    }
    case M_SPLITLINES: {
        const at_jx_value *k = arg(nargs, args, 0, nkw, kwn, kwv, "keepends");
        return splitlines(c, site, s, k && at_jx_truthy(*k), out);
    }
    case M_UPPER: return change_case(c, site, s, CASE_UPPER, out);
    case M_LOWER: return change_case(c, site, s, CASE_LOWER, out);
    case M_TITLE: return change_case(c, site, s, CASE_TITLE_PY, out);
    case M_CAPITALIZE: return change_case(c, site, s, CASE_CAPITALIZE, out);
    case M_REPLACE: {
        const at_jx_value *o = arg(nargs, args, 0, nkw, kwn, kwv, NULL), *nw = arg(nargs, args, 1, nkw, kwn, kwv, NULL);
        const at_jx_value *cnt = arg(nargs, args, 2, nkw, kwn, kwv, "count");
        if (!o || !nw) return at_jx_fail(c, site, "TypeError: replace() takes at least 2 arguments");
        AT_TRY(need_str(c, site, *o, "replace() argument 1"));
        AT_TRY(need_str(c, site, *nw, "replace() argument 2"));
        return replace(c, site, s, o->u.s, nw->u.s, opt_int(cnt, -1), out);
    }
    case M_FIND:
    case M_RFIND: {
        if (!a0) return at_jx_fail(c, site, "TypeError: find() takes at least 1 argument");
        AT_TRY(need_str(c, site, *a0, "find() argument"));
        const at_jx_str *sub = a0->u.s;
        int64_t pos = -1;
        if (id == M_FIND) {
            const char *h = sub->len ? memmem(s->s, s->len, sub->s, sub->len) : s->s;
            if (h) pos = (int64_t)(h - s->s);
        } else if (sub->len <= s->len) {
            for (size_t p = s->len - sub->len + 1; p > 0; p--)
                if (memcmp(s->s + p - 1, sub->s, sub->len) == 0) {
                    pos = (int64_t)(p - 1);
                    break;
                }
        }
        *out = at_jx_int(pos < 0 ? -1 : (int64_t)at_jx_utf8_count(s->s, (size_t)pos));
        return AT_OK;
    }
    case M_SCOUNT:
        if (!a0) return at_jx_fail(c, site, "TypeError: count() takes at least 1 argument");
        AT_TRY(need_str(c, site, *a0, "count() argument"));
        *out = at_jx_int(count_sub(s, a0->u.s));
        return AT_OK;
    case M_JOIN: {
        if (!a0) return at_jx_fail(c, site, "TypeError: join() takes exactly one argument");
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, *a0, &l));
        at_jx_buf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].type != JX_STR)
                return at_jx_fail(c, site, "TypeError: sequence item %zu: expected str instance, %s found", i,
                                  at_jx_type_name(l->v[i]));
            if (i) AT_TRY(at_jx_put(c, site, &b, s->s, s->len));
            AT_TRY(at_jx_put(c, site, &b, l->v[i].u.s->s, l->v[i].u.s->len));
        }
        return at_jx_str_buf(c, site, &b, out);
    }
    default: *out = at_jx_bool(str_class(s, id)); return AT_OK;
    }
}

static at_status strftime_now(at_jx_ctx *c, const at_jx_node *site, const at_jx_value *fmt, at_jx_value *out)
{
    if (!fmt) return at_jx_fail(c, site, "TypeError: strftime_now() missing 1 required positional argument: 'format'");
    AT_TRY(need_str(c, site, *fmt, "strftime_now() format"));
    if (memchr(fmt->u.s->s, '\0', fmt->u.s->len)) return at_jx_fail(c, site, "ValueError: embedded null character");
    struct tm tmv;
    time_t t = c->opt.has_fixed_time ? (time_t)c->opt.fixed_time : time(NULL);
    if (c->opt.has_fixed_time ? !gmtime_r(&t, &tmv) : !localtime_r(&t, &tmv))
        return at_jx_fail(c, site, "strftime_now: time out of range");
    if (fmt->u.s->len == 0) return mkstr(c, site, "", 0, out);
    for (size_t cap = 256; cap <= 65536; cap *= 4) {
        char *buf = at_jx_alloc(&c->ar, cap);
        if (!buf) return at_jx_oom(c, site);
        size_t n = strftime(buf, cap, fmt->u.s->s, &tmv);
        if (n > 0) return mkstr(c, site, buf, n, out);
    }
    /* strftime returns 0 both for "too long" and for an empty result */
    return mkstr(c, site, "", 0, out);
}

at_status at_jx_call_builtin(at_jx_ctx *c, const at_jx_node *site, const at_jx_func *fn, int nargs,
                             const at_jx_value *args, int nkw, const char **kwn, const at_jx_value *kwv,
                             at_jx_value *out)
{
    if (fn->kind == JX_FN_GLOBAL) {
        switch (fn->id) {
        case G_RANGE: {
            int64_t a = 0, b, step = 1;
            for (int i = 0; i < nargs; i++)
                if (args[i].type != JX_INT && args[i].type != JX_BOOL)
                    return at_jx_fail(c, site, "TypeError: range() arguments must be integers, not %s",
                                      at_jx_type_name(args[i]));
            if (nargs == 1) {
                b = opt_int(&args[0], 0);
            } else if (nargs == 2 || nargs == 3) {
                a = opt_int(&args[0], 0);
                b = opt_int(&args[1], 0);
                if (nargs == 3) step = opt_int(&args[2], 1);
            } else {
                return at_jx_fail(c, site, "TypeError: range expected 1 to 3 arguments, got %d", nargs);
            }
            if (step == 0) return at_jx_fail(c, site, "ValueError: range() arg 3 must not be zero");
            double count = step > 0 ? ceil(((double)b - (double)a) / (double)step) : ceil(((double)a - (double)b) / (double)-step);
            if (count < 0) count = 0;
            /* Jinja's sandbox caps ranges at 100000 items (MAX_RANGE) */
            if (count > 100000)
                return at_jx_fail(c, site, "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            /* building the list is work too: charge it to the step budget */
            c->steps += (uint64_t)count;
            AT_TRY(at_jx_step(c, site));
            AT_TRY(at_jx_list_new(c, site, (size_t)count, out));
            for (int64_t k = 0; k < (int64_t)count; k++) AT_TRY(at_jx_list_push(c, site, out->u.l, at_jx_int(a + k * step)));
            return AT_OK;
        }
        case G_NAMESPACE:
        case G_DICT: {
            AT_TRY(at_jx_dict_new(c, site, fn->id == G_NAMESPACE ? JX_DICT_NAMESPACE : JX_DICT_PLAIN, out));
            if (nargs > 1) return at_jx_fail(c, site, "TypeError: %s expected at most 1 argument", fn->name);
            if (nargs == 1) {
                if (args[0].type != JX_DICT) return at_jx_fail(c, site, "TypeError: %s() argument must be a mapping", fn->name);
                for (size_t i = 0; i < args[0].u.d->n; i++)
                    AT_TRY(at_jx_dict_set(c, site, out->u.d, args[0].u.d->keys[i], args[0].u.d->vals[i]));
            }
            for (int i = 0; i < nkw; i++) {
                at_jx_value k = {0};
                AT_TRY(mkstr(c, site, kwn[i], strlen(kwn[i]), &k));
                AT_TRY(at_jx_dict_set(c, site, out->u.d, k, kwv[i]));
            }
            return AT_OK;
        }
        case G_RAISE: {
            at_jx_str *m = NULL;
            const at_jx_value *a0 = arg(nargs, args, 0, nkw, kwn, kwv, "message");
            AT_TRY(soft_str(c, site, a0 ? *a0 : at_jx_undef(NULL), &m));
            return at_jx_fail(c, site, "raise_exception: %s", m->s);
        }
        case G_STRFTIME: return strftime_now(c, site, arg(nargs, args, 0, nkw, kwn, kwv, "format"), out);
        }
        return at_jx_fail(c, site, "internal error: unknown global");
    }
    /* methods */
    at_jx_value self = fn->self;
    const at_jx_value *a0 = arg(nargs, args, 0, nkw, kwn, kwv, NULL);
    if (self.type == JX_STR) return call_str_method(c, site, fn->id, self.u.s, nargs, args, nkw, kwn, kwv, out);
    switch (fn->id) {
    case M_ITEMS: return dict_items(c, site, self.u.d, out);
    case M_KEYS:
    case M_VALUES:
        AT_TRY(at_jx_list_new(c, site, self.u.d->n, out));
        for (size_t i = 0; i < self.u.d->n; i++)
            AT_TRY(at_jx_list_push(c, site, out->u.l, fn->id == M_KEYS ? self.u.d->keys[i] : self.u.d->vals[i]));
        return AT_OK;
    case M_GET: {
        if (!a0) return at_jx_fail(c, site, "TypeError: get expected at least 1 argument, got 0");
        at_jx_value *v = at_jx_dict_get(self.u.d, *a0);
        const at_jx_value *d = arg(nargs, args, 1, nkw, kwn, kwv, NULL);
        *out = v ? *v : d ? *d : at_jx_none();
        return AT_OK;
    }
    case M_INDEX:
    case M_LCOUNT: {
        if (!a0) return at_jx_fail(c, site, "TypeError: %s() takes exactly one argument", fn->name);
        int64_t cnt = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (at_jx_equal(self.u.l->v[i], *a0)) {
                if (fn->id == M_INDEX) {
                    *out = at_jx_int((int64_t)i);
                    return AT_OK;
                }
                cnt++;
            }
        if (fn->id == M_INDEX) return at_jx_fail(c, site, "ValueError: value is not in list");
        *out = at_jx_int(cnt);
        return AT_OK;
    }
    case M_CYCLE:
        if (nargs == 0) return at_jx_fail(c, site, "TypeError: no items for cycling given");
        *out = args[self.u.loop->index0 % (size_t)nargs];
        return AT_OK;
    case M_CHANGED: {
        at_jx_value cur = {0};
        AT_TRY(at_jx_list_new(c, site, (size_t)nargs, &cur));
        for (int i = 0; i < nargs; i++) AT_TRY(at_jx_list_push(c, site, cur.u.l, args[i]));
        at_jx_loop *L = self.u.loop;
        int changed = !L->has_changed || !at_jx_equal(L->last_changed, cur);
        L->last_changed = cur;
        L->has_changed = 1;
        *out = at_jx_bool(changed);
        return AT_OK;
    }
    }
    return at_jx_fail(c, site, "internal error: unknown method");
}

/* ---- tests ---- */

static const char *const tests_tab[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "lessthan",
    "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
    "upper", NULL};

int at_jx_test_exists(const char *name)
{
    for (int i = 0; tests_tab[i]; i++)
        if (!strcmp(tests_tab[i], name)) return 1;
    return 0;
}

static int is(const char *a, const char *b) { return strcmp(a, b) == 0; }

at_status at_jx_test(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, const char *name, at_jx_value v,
                     int nargs, const at_jx_value *args, int *out)
{
    (void)sc;
    const at_jx_value *a0 = nargs > 0 ? &args[0] : NULL;
    if (is(name, "defined")) *out = v.type != JX_UNDEF;
    else if (is(name, "undefined")) *out = v.type == JX_UNDEF;
    else if (is(name, "none")) *out = v.type == JX_NONE;
    else if (is(name, "true")) *out = v.type == JX_BOOL && v.u.b;
    else if (is(name, "false")) *out = v.type == JX_BOOL && !v.u.b;
    else if (is(name, "boolean")) *out = v.type == JX_BOOL;
    else if (is(name, "string")) *out = v.type == JX_STR;
    else if (is(name, "mapping")) *out = v.type == JX_DICT && v.u.d->kind == JX_DICT_PLAIN;
    else if (is(name, "number")) *out = at_jx_is_number(v);
    else if (is(name, "integer")) *out = v.type == JX_INT;
    else if (is(name, "float")) *out = v.type == JX_FLOAT;
    else if (is(name, "iterable"))
        *out = v.type == JX_STR || v.type == JX_LIST || v.type == JX_UNDEF ||
               (v.type == JX_DICT && v.u.d->kind == JX_DICT_PLAIN);
    else if (is(name, "sequence"))
        *out = v.type == JX_STR || v.type == JX_LIST || v.type == JX_UNDEF ||
               (v.type == JX_DICT && v.u.d->kind == JX_DICT_PLAIN);
    else if (is(name, "callable")) *out = v.type == JX_FUNC || v.type == JX_LOOP || v.type == JX_UNDEF;
    else if (is(name, "escaped")) *out = 0;
    else if (is(name, "lower") || is(name, "upper")) {
        at_jx_str *s = NULL;
        AT_TRY(soft_str(c, site, v, &s));
        *out = str_class(s, is(name, "lower") ? M_ISLOWER : M_ISUPPER);
    } else if (is(name, "even") || is(name, "odd") || is(name, "divisibleby")) {
        int64_t d = 2;
        if (is(name, "divisibleby")) {
            if (!a0 || (a0->type != JX_INT && a0->type != JX_BOOL))
                return at_jx_fail(c, site, "divisibleby needs an integer argument");
            d = opt_int(a0, 1);
            if (d == 0) return at_jx_fail(c, site, "ZeroDivisionError: integer division or modulo by zero");
        }
        if (v.type == JX_UNDEF) return at_jx_undefined_error(c, site, v);
        if (!at_jx_is_number(v)) return at_jx_fail(c, site, "TypeError: not all arguments converted during string formatting");
        if (v.type == JX_FLOAT) {
            double m = fmod(v.u.f, (double)d);
            *out = is(name, "odd") ? m != 0 : m == 0;
        } else {
            int64_t x = v.type == JX_INT ? v.u.i : v.u.b, m = x % d;
            *out = is(name, "odd") ? m != 0 : m == 0;
        }
    } else if (is(name, "sameas")) {
        if (!a0) return at_jx_fail(c, site, "sameas needs an argument");
        if (v.type != a0->type) *out = 0;
        else if (v.type == JX_NONE || v.type == JX_UNDEF) *out = 1;
        else if (v.type == JX_BOOL) *out = v.u.b == a0->u.b;
        else if (v.type == JX_INT) *out = v.u.i == a0->u.i;
        else if (v.type == JX_FLOAT) *out = v.u.f == a0->u.f;
        else *out = v.u.l == a0->u.l; /* same object */
    } else if (is(name, "filter") || is(name, "test")) {
        if (v.type != JX_STR) *out = 0;
        else *out = is(name, "filter") ? at_jx_filter_exists(v.u.s->s) : at_jx_test_exists(v.u.s->s);
    } else if (is(name, "in")) {
        if (!a0) return at_jx_fail(c, site, "the 'in' test needs an argument");
        if (a0->type == JX_STR) {
            if (v.type != JX_STR) return at_jx_fail(c, site, "TypeError: 'in <string>' requires string as left operand");
            *out = v.u.s->len == 0 || memmem(a0->u.s->s, a0->u.s->len, v.u.s->s, v.u.s->len) != NULL;
        } else {
            at_jx_list *l = NULL;
            if (a0->type == JX_DICT) {
                *out = at_jx_dict_get(a0->u.d, v) != NULL;
                return AT_OK;
            }
            AT_TRY(at_jx_to_list(c, site, *a0, &l));
            *out = 0;
            for (size_t i = 0; i < l->n; i++)
                if (at_jx_equal(l->v[i], v)) *out = 1;
        }
    } else {
        /* comparisons */
        if (!a0) return at_jx_fail(c, site, "the '%s' test needs an argument", name);
        if (is(name, "eq") || is(name, "equalto") || is(name, "==")) *out = at_jx_equal(v, *a0);
        else if (is(name, "ne") || is(name, "!=")) *out = !at_jx_equal(v, *a0);
        else {
            int cmp;
            AT_TRY(at_jx_compare(c, site, v, *a0, &cmp));
            if (is(name, "lt") || is(name, "lessthan") || is(name, "<")) *out = cmp < 0;
            else if (is(name, "le") || is(name, "<=")) *out = cmp <= 0;
            else if (is(name, "gt") || is(name, "greaterthan") || is(name, ">")) *out = cmp > 0;
            else *out = cmp >= 0;
        }
    }
    return AT_OK;
}

/* ---- filters ---- */

static const char *const filters_tab[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount", NULL};

int at_jx_filter_exists(const char *name)
{
    for (int i = 0; filters_tab[i]; i++)
        if (!strcmp(filters_tab[i], name)) return 1;
    return 0;
}

/* Jinja's make_attrgetter: "a.b.0" looked up item-first at each step. */
static at_status attr_path(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, const at_jx_value *attr,
                           at_jx_value *out)
{
    if (!attr || attr->type == JX_NONE) {
        *out = v;
        return AT_OK;
    }
    if (attr->type == JX_INT) return at_jx_getitem(c, site, v, *attr, out);
    AT_TRY(need_str(c, site, *attr, "attribute"));
    const char *p = attr->u.s->s, *end = p + attr->u.s->len;
    at_jx_value cur = v;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        at_jx_value key = {0};
        int all_digits = n > 0;
        for (size_t i = 0; i < n; i++)
            if (p[i] < '0' || p[i] > '9') all_digits = 0;
        if (all_digits && n < 18) {
            key = at_jx_int(strtoll(p, NULL, 10));
        } else {
            AT_TRY(mkstr(c, site, p, n, &key));
        }
        AT_TRY(at_jx_getitem(c, site, cur, key, &cur));
        if (!dot) break;
        p = dot + 1;
    }
    *out = cur;
    return AT_OK;
}

/* Sort key ordering with Jinja's case-insensitive default for strings. */
static at_status key_cmp(at_jx_ctx *c, const at_jx_node *site, at_jx_value a, at_jx_value b, int case_sensitive,
                         int *cmp)
{
    if (!case_sensitive && a.type == JX_STR && b.type == JX_STR) {
        at_jx_value la = {0}, lb = {0};
        AT_TRY(change_case(c, site, a.u.s, CASE_LOWER, &la));
        AT_TRY(change_case(c, site, b.u.s, CASE_LOWER, &lb));
        return at_jx_compare(c, site, la, lb, cmp);
    }
    return at_jx_compare(c, site, a, b, cmp);
}

/* Stable merge sort of items by keys. */
static at_status sort_by(at_jx_ctx *c, const at_jx_node *site, at_jx_value *items, at_jx_value *keys, size_t n,
                         int case_sensitive, int reverse)
{
    if (n < 2) return AT_OK;
    at_jx_value *ti = at_jx_alloc(&c->ar, n * sizeof *ti), *tk = at_jx_alloc(&c->ar, n * sizeof *tk);
    if (!ti || !tk) return at_jx_oom(c, site);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                int cmp;
                AT_TRY(key_cmp(c, site, keys[j], keys[i], case_sensitive, &cmp));
                int take_j = reverse ? cmp > 0 : cmp < 0;
                if (take_j) {
                    ti[o] = items[j];
                    tk[o++] = keys[j++];
                } else {
                    ti[o] = items[i];
                    tk[o++] = keys[i++];
                }
            }
            while (i < mid) {
                ti[o] = items[i];
                tk[o++] = keys[i++];
            }
            while (j < hi) {
                ti[o] = items[j];
                tk[o++] = keys[j++];
            }
        }
        memcpy(items, ti, n * sizeof *ti);
        memcpy(keys, tk, n * sizeof *tk);
    }
    return AT_OK;
}

/* select/reject/selectattr/rejectattr */
static at_status select_filter(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, at_jx_value v, int nargs,
                               const at_jx_value *args, int by_attr, int keep, at_jx_value *out)
{
    at_jx_list *l = NULL;
    AT_TRY(at_jx_to_list(c, site, v, &l));
    const at_jx_value *attr = NULL;
    int ai = 0;
    if (by_attr) {
        if (nargs < 1) return at_jx_fail(c, site, "Missing parameter for attribute name");
        attr = &args[0];
        ai = 1;
    }
    const char *test = NULL;
    if (nargs > ai) {
        AT_TRY(need_str(c, site, args[ai], "test name"));
        test = args[ai].u.s->s;
        if (!at_jx_test_exists(test)) return at_jx_fail(c, site, "No test named '%s'.", test);
        ai++;
    }
    AT_TRY(at_jx_list_new(c, site, 0, out));
    for (size_t i = 0; i < l->n; i++) {
        AT_TRY(at_jx_step(c, site));
        at_jx_value x = {0};
        AT_TRY(attr_path(c, site, l->v[i], attr, &x));
        int r;
        if (test)
            AT_TRY(at_jx_test(c, sc, site, test, x, nargs - ai, args + ai, &r));
        else
            r = at_jx_truthy(x);
        if ((r != 0) == keep) AT_TRY(at_jx_list_push(c, site, out->u.l, l->v[i]));
    }
    return AT_OK;
}

/* %-formatting for the format filter: %s %r %d %i %f %% (flags ignored except precision). */
static at_status percent_format(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *fmt, const at_jx_value *args,
                                int nargs, at_jx_value *out)
{
    at_jx_buf b = {0};
    int ai = 0;
    for (size_t i = 0; i < fmt->len; i++) {
        if (fmt->s[i] != '%') {
            AT_TRY(at_jx_putc(c, site, &b, fmt->s[i]));
            continue;
        }
        i++;
        int prec = -1;
        while (i < fmt->len && strchr("-+ #0123456789", fmt->s[i])) i++;
        if (i < fmt->len && fmt->s[i] == '.') {
            prec = 0;
            for (i++; i < fmt->len && fmt->s[i] >= '0' && fmt->s[i] <= '9'; i++) prec = prec * 10 + (fmt->s[i] - '0');
        }
        if (i >= fmt->len) return at_jx_fail(c, site, "ValueError: incomplete format");
        char k = fmt->s[i];
        if (k == '%') {
            AT_TRY(at_jx_putc(c, site, &b, '%'));
            continue;
        }
        if (ai >= nargs) return at_jx_fail(c, site, "TypeError: not enough arguments for format string");
        at_jx_value a = args[ai++];
        char tmp[64];
        switch (k) {
        case 's': AT_TRY(at_jx_write_str(c, site, &b, a)); break;
        case 'r': AT_TRY(at_jx_write_repr(c, site, &b, a)); break;
        case 'd':
        case 'i':
            if (!at_jx_is_number(a)) return at_jx_fail(c, site, "TypeError: %%d format: a number is required");
            snprintf(tmp, sizeof tmp, "%lld", a.type == JX_FLOAT ? (long long)a.u.f : (long long)(a.type == JX_INT ? a.u.i : a.u.b));
            AT_TRY(at_jx_put(c, site, &b, tmp, strlen(tmp)));
            break;
        case 'f':
            if (!at_jx_is_number(a)) return at_jx_fail(c, site, "TypeError: must be real number");
            snprintf(tmp, sizeof tmp, "%.*f", prec < 0 ? 6 : prec > 40 ? 40 : prec, at_jx_as_double(a));
            AT_TRY(at_jx_put(c, site, &b, tmp, strlen(tmp)));
            break;
        default: return at_jx_fail(c, site, "ValueError: unsupported format character '%c'", k);
        }
    }
    if (ai < nargs) return at_jx_fail(c, site, "TypeError: not all arguments converted during string formatting");
    return at_jx_str_buf(c, site, &b, out);
}

static at_status indent_filter(at_jx_ctx *c, const at_jx_node *site, const at_jx_str *s, const at_jx_value *width,
                               int first, int blank, at_jx_value *out)
{
    at_jx_buf ind = {0};
    if (width && width->type == JX_STR) {
        AT_TRY(at_jx_put(c, site, &ind, width->u.s->s, width->u.s->len));
    } else {
        int64_t w = opt_int(width, 4);
        for (int64_t i = 0; i < w && i < 4096; i++) AT_TRY(at_jx_putc(c, site, &ind, ' '));
    }
    /* s + "\n", split into lines */
    at_jx_value withnl = {0}, lines = {0};
    at_jx_buf t = {0};
    AT_TRY(at_jx_put(c, site, &t, s->s, s->len));
    AT_TRY(at_jx_putc(c, site, &t, '\n'));
    AT_TRY(at_jx_str_buf(c, site, &t, &withnl));
    AT_TRY(splitlines(c, site, withnl.u.s, 0, &lines));
    at_jx_buf b = {0};
    if (first) AT_TRY(at_jx_put(c, site, &b, ind.p, ind.len));
    for (size_t i = 0; i < lines.u.l->n; i++) {
        const at_jx_str *ln = lines.u.l->v[i].u.s;
        if (i > 0) {
            AT_TRY(at_jx_putc(c, site, &b, '\n'));
            if (blank || ln->len) AT_TRY(at_jx_put(c, site, &b, ind.p, ind.len));
        }
        AT_TRY(at_jx_put(c, site, &b, ln->s, ln->len));
    }
    return at_jx_str_buf(c, site, &b, out);
}

/* Python int(str, base) for the int filter: returns 0 when not a number. */
static int parse_int_str(const at_jx_str *s, int base, int64_t *out)
{
    size_t i = 0, e = s->len;
    while (i < e && at_jx_is_space((unsigned char)s->s[i])) i++;
    while (e > i && at_jx_is_space((unsigned char)s->s[e - 1])) e--;
    int neg = 0;
    if (i < e && (s->s[i] == '+' || s->s[i] == '-')) neg = s->s[i++] == '-';
    if (i >= e) return 0;
    if (base == 16 && e - i > 2 && s->s[i] == '0' && (s->s[i + 1] | 32) == 'x') i += 2;
    uint64_t v = 0;
    int digits = 0;
    for (; i < e; i++) {
        char ch = s->s[i];
        if (ch == '_' && digits) continue;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'z' ? (ch | 32) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        digits++;
    }
    if (!digits || v > (uint64_t)INT64_MAX) return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

static int parse_float_str(const at_jx_str *s, double *out)
{
    char *end = NULL;
    const char *p = s->s;
    while (*p && at_jx_is_space((unsigned char)*p)) p++;
    if (!*p) return 0;
    double d = strtod(p, &end);
    if (end == p) return 0;
    while (*end && at_jx_is_space((unsigned char)*end)) end++;
    if (*end) return 0;
    *out = d;
    return 1;
}

at_status at_jx_filter(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, const char *name, at_jx_value v,
                       int nargs, const at_jx_value *args, int nkw, const char **kwn, const at_jx_value *kwv,
                       at_jx_value *out)
{
#define ARG(i, kw) arg(nargs, args, (i), nkw, kwn, kwv, (kw))
    at_jx_str *s = NULL;
    if (is(name, "tojson")) {
        /* transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        const at_jx_value *ea = ARG(0, "ensure_ascii"), *ind = ARG(1, "indent"), *seps = ARG(2, "separators");
        const at_jx_value *sk = ARG(3, "sort_keys");
        if (ea && at_jx_truthy(*ea)) return at_jx_fail(c, site, "tojson(ensure_ascii=True) is not supported");
        int indent = -1;
        if (ind && ind->type != JX_NONE) {
            if (ind->type != JX_INT) return at_jx_fail(c, site, "tojson: indent must be an integer");
            indent = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : (int)ind->u.i;
        }
        const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
        if (seps && seps->type != JX_NONE) {
            if (seps->type != JX_LIST || seps->u.l->n != 2 || seps->u.l->v[0].type != JX_STR ||
                seps->u.l->v[1].type != JX_STR)
                return at_jx_fail(c, site, "tojson: separators must be a pair of strings");
            item_sep = seps->u.l->v[0].u.s->s;
            key_sep = seps->u.l->v[1].u.s->s;
        }
        if (v.type == JX_UNDEF) return at_jx_fail(c, site, "TypeError: Object of type Undefined is not JSON serializable");
        at_jx_buf b = {0};
        AT_TRY(at_jx_write_json(c, site, &b, v, indent, item_sep, key_sep, sk && at_jx_truthy(*sk), 0));
        return at_jx_str_buf(c, site, &b, out);
    }
    if (is(name, "default") || is(name, "d")) {
        const at_jx_value *dv = ARG(0, "default_value"), *boolean = ARG(1, "boolean");
        int use = v.type == JX_UNDEF || (boolean && at_jx_truthy(*boolean) && !at_jx_truthy(v));
        if (use) {
            if (dv)
                *out = *dv;
            else
                AT_TRY(mkstr(c, site, "", 0, out));
        } else {
            *out = v;
        }
        return AT_OK;
    }
    if (is(name, "length") || is(name, "count")) {
        switch (v.type) {
        case JX_UNDEF: *out = at_jx_int(0); return AT_OK;
        case JX_STR: *out = at_jx_int((int64_t)at_jx_utf8_count(v.u.s->s, v.u.s->len)); return AT_OK;
        case JX_LIST: *out = at_jx_int((int64_t)v.u.l->n); return AT_OK;
        case JX_DICT:
            if (v.u.d->kind == JX_DICT_PLAIN) {
                *out = at_jx_int((int64_t)v.u.d->n);
                return AT_OK;
            }
            break;
        default: break;
        }
        return at_jx_fail(c, site, "TypeError: object of type '%s' has no len()", at_jx_type_name(v));
    }
    if (is(name, "trim")) {
        AT_TRY(soft_str(c, site, v, &s));
        const at_jx_value *chars = ARG(0, "chars");
        const at_jx_str *cs = NULL;
        if (chars && chars->type != JX_NONE) {
            AT_TRY(need_str(c, site, *chars, "trim chars"));
            cs = chars->u.s;
        }
        return strip(c, site, s, cs, 3, out);
    }
    if (is(name, "upper") || is(name, "lower") || is(name, "capitalize") || is(name, "title")) {
        AT_TRY(soft_str(c, site, v, &s));
        int mode = is(name, "upper") ? CASE_UPPER : is(name, "lower") ? CASE_LOWER : is(name, "title") ? CASE_TITLE_JINJA : CASE_CAPITALIZE;
        return change_case(c, site, s, mode, out);
    }
    if (is(name, "string") || is(name, "safe")) {
        if (v.type == JX_UNDEF) return mkstr(c, site, "", 0, out);
        return at_jx_to_str(c, site, v, out);
    }
    if (is(name, "e") || is(name, "escape") || is(name, "forceescape")) {
        AT_TRY(soft_str(c, site, v, &s));
        return html_escape(c, site, s, out);
    }
    if (is(name, "replace")) {
        AT_TRY(soft_str(c, site, v, &s));
        const at_jx_value *o = ARG(0, "old"), *nw = ARG(1, "new"), *cnt = ARG(2, "count");
        if (!o || !nw) return at_jx_fail(c, site, "replace filter needs old and new");
        at_jx_str *os = NULL, *ns = NULL;
        AT_TRY(soft_str(c, site, *o, &os));
        AT_TRY(soft_str(c, site, *nw, &ns));
        return replace(c, site, s, os, ns, opt_int(cnt, -1), out);
    }
    if (is(name, "join")) {
        const at_jx_value *sep = ARG(0, "d"), *attr = ARG(1, "attribute");
        at_jx_str *ss = NULL;
        if (sep) {
            AT_TRY(soft_str(c, site, *sep, &ss));
        } else {
            at_jx_value e = {0};
            AT_TRY(mkstr(c, site, "", 0, &e));
            ss = e.u.s;
        }
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        at_jx_buf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            at_jx_value x = {0};
            AT_TRY(attr_path(c, site, l->v[i], attr, &x));
            if (i) AT_TRY(at_jx_put(c, site, &b, ss->s, ss->len));
            AT_TRY(at_jx_write_str(c, site, &b, x));
        }
        return at_jx_str_buf(c, site, &b, out);
    }
    if (is(name, "list")) {
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        AT_TRY(at_jx_list_new(c, site, l->n, out));
        for (size_t i = 0; i < l->n; i++) AT_TRY(at_jx_list_push(c, site, out->u.l, l->v[i]));
        return AT_OK;
    }
    if (is(name, "first") || is(name, "last")) {
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        if (l->n == 0) {
            *out = at_jx_undef(is(name, "first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
            return AT_OK;
        }
        *out = l->v[is(name, "first") ? 0 : l->n - 1];
        return AT_OK;
    }
    if (is(name, "items")) {
        if (v.type == JX_UNDEF) return at_jx_list_new(c, site, 0, out);
        if (v.type != JX_DICT || v.u.d->kind != JX_DICT_PLAIN)
            return at_jx_fail(c, site, "TypeError: Can only get item pairs from a mapping.");
        return dict_items(c, site, v.u.d, out);
    }
    if (is(name, "dictsort")) {
        const at_jx_value *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rev = ARG(2, "reverse");
        if (v.type != JX_DICT || v.u.d->kind != JX_DICT_PLAIN)
            return at_jx_fail(c, site, "TypeError: dictsort needs a mapping");
        int by_value = 0;
        if (by) {
            AT_TRY(need_str(c, site, *by, "by"));
            if (is(by->u.s->s, "value")) by_value = 1;
            else if (!is(by->u.s->s, "key")) return at_jx_fail(c, site, "FilterArgumentError: You can only sort by either \"key\" or \"value\"");
        }
        AT_TRY(dict_items(c, site, v.u.d, out));
        size_t n = out->u.l->n;
        at_jx_value *keys = at_jx_alloc(&c->ar, (n + 1) * sizeof *keys);
        if (!keys) return at_jx_oom(c, site);
        for (size_t i = 0; i < n; i++) keys[i] = out->u.l->v[i].u.l->v[by_value];
        return sort_by(c, site, out->u.l->v, keys, n, cs && at_jx_truthy(*cs), rev && at_jx_truthy(*rev));
    }
    if (is(name, "sort") || is(name, "unique") || is(name, "max") || is(name, "min")) {
        int is_sort = is(name, "sort"), is_unique = is(name, "unique");
        const at_jx_value *rev = is_sort ? ARG(0, "reverse") : NULL;
        const at_jx_value *cs = is_sort ? ARG(1, "case_sensitive") : ARG(0, "case_sensitive");
        const at_jx_value *attr = is_sort ? ARG(2, "attribute") : ARG(1, "attribute");
        int case_sensitive = cs && at_jx_truthy(*cs);
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        size_t n = l->n;
        at_jx_value *items = at_jx_alloc(&c->ar, (n + 1) * sizeof *items), *keys = at_jx_alloc(&c->ar, (n + 1) * sizeof *keys);
        if (!items || !keys) return at_jx_oom(c, site);
        for (size_t i = 0; i < n; i++) {
            items[i] = l->v[i];
            AT_TRY(attr_path(c, site, l->v[i], attr, &keys[i]));
        }
        if (is_unique) {
            AT_TRY(at_jx_list_new(c, site, 0, out));
            at_jx_value seen = {0};
            AT_TRY(at_jx_list_new(c, site, 0, &seen));
            for (size_t i = 0; i < n; i++) {
                AT_TRY(at_jx_step(c, site));
                at_jx_value k = keys[i];
                if (!case_sensitive && k.type == JX_STR) AT_TRY(change_case(c, site, k.u.s, CASE_LOWER, &k));
                int dup = 0;
                for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = at_jx_equal(seen.u.l->v[j], k);
                if (dup) continue;
                AT_TRY(at_jx_list_push(c, site, seen.u.l, k));
                AT_TRY(at_jx_list_push(c, site, out->u.l, items[i]));
            }
            return AT_OK;
        }
        if (!is_sort) {
            if (n == 0) {
                *out = at_jx_undef(is(name, "max") ? "No aggregated item, sequence was empty." : "No aggregated item, sequence was empty.");
                return AT_OK;
            }
            size_t best = 0;
            for (size_t i = 1; i < n; i++) {
                int cmp;
                AT_TRY(key_cmp(c, site, keys[i], keys[best], case_sensitive, &cmp));
                if (is(name, "max") ? cmp > 0 : cmp < 0) best = i;
            }
            *out = items[best];
            return AT_OK;
        }
        AT_TRY(sort_by(c, site, items, keys, n, case_sensitive, rev && at_jx_truthy(*rev)));
        AT_TRY(at_jx_list_new(c, site, n, out));
        for (size_t i = 0; i < n; i++) AT_TRY(at_jx_list_push(c, site, out->u.l, items[i]));
        return AT_OK;
    }
    if (is(name, "reverse")) {
        if (v.type == JX_STR) {
            at_jx_buf b = {0};
            size_t e = v.u.s->len;
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)v.u.s->s[st] & 0xC0) == 0x80) st--;
                AT_TRY(at_jx_put(c, site, &b, v.u.s->s + st, e - st));
                e = st;
            }
            return at_jx_str_buf(c, site, &b, out);
        }
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        AT_TRY(at_jx_list_new(c, site, l->n, out));
        for (size_t i = l->n; i > 0; i--) AT_TRY(at_jx_list_push(c, site, out->u.l, l->v[i - 1]));
        return AT_OK;
    }
    if (is(name, "map")) {
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        AT_TRY(at_jx_list_new(c, site, l->n, out));
        const at_jx_value *attr = kwarg(nkw, kwn, kwv, "attribute"), *dflt = kwarg(nkw, kwn, kwv, "default");
        if (attr) {
            for (size_t i = 0; i < l->n; i++) {
                at_jx_value x = {0};
                AT_TRY(attr_path(c, site, l->v[i], attr, &x));
                if (x.type == JX_UNDEF && dflt) x = *dflt;
                AT_TRY(at_jx_list_push(c, site, out->u.l, x));
            }
            return AT_OK;
        }
        if (nargs < 1) return at_jx_fail(c, site, "map requires a filter argument");
        AT_TRY(need_str(c, site, args[0], "filter name"));
        const char *fname = args[0].u.s->s;
        if (!at_jx_filter_exists(fname)) return at_jx_fail(c, site, "No filter named '%s'.", fname);
        for (size_t i = 0; i < l->n; i++) {
            AT_TRY(at_jx_step(c, site));
            at_jx_value x = {0};
            AT_TRY(at_jx_filter(c, sc, site, fname, l->v[i], nargs - 1, args + 1, nkw, kwn, kwv, &x));
            AT_TRY(at_jx_list_push(c, site, out->u.l, x));
        }
        return AT_OK;
    }
    if (is(name, "select")) return select_filter(c, sc, site, v, nargs, args, 0, 1, out);
    if (is(name, "reject")) return select_filter(c, sc, site, v, nargs, args, 0, 0, out);
    if (is(name, "selectattr")) return select_filter(c, sc, site, v, nargs, args, 1, 1, out);
    if (is(name, "rejectattr")) return select_filter(c, sc, site, v, nargs, args, 1, 0, out);
    if (is(name, "attr")) {
        const at_jx_value *a = ARG(0, "name");
        if (!a) return at_jx_fail(c, site, "attr filter needs a name");
        AT_TRY(need_str(c, site, *a, "attribute name"));
        if (v.type == JX_DICT && v.u.d->kind == JX_DICT_PLAIN) {
            /* Python getattr only: dict keys are not attributes */
            if (at_jx_method(c, v, a->u.s->s, a->u.s->len, out)) return AT_OK;
            *out = at_jx_undef("no such attribute");
            return AT_OK;
        }
        return at_jx_getattr(c, site, v, a->u.s->s, a->u.s->len, out);
    }
    if (is(name, "int")) {
        const at_jx_value *d = ARG(0, "default"), *base = ARG(1, "base");
        int64_t dflt = d && d->type == JX_INT ? d->u.i : 0;
        switch (v.type) {
        case JX_INT: *out = v; return AT_OK;
        case JX_BOOL: *out = at_jx_int(v.u.b); return AT_OK;
        case JX_FLOAT:
            if (isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) {
                *out = at_jx_int((int64_t)v.u.f);
                return AT_OK;
            }
            break;
        case JX_STR: {
            int64_t r = 0;
            double f;
            if (parse_int_str(v.u.s, (int)opt_int(base, 10), &r)) {
                *out = at_jx_int(r);
                return AT_OK;
            }
            if (parse_float_str(v.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18) {
                *out = at_jx_int((int64_t)f);
                return AT_OK;
            }
            break;
        }
        default: break;
        }
        *out = d ? *d : at_jx_int(dflt);
        return AT_OK;
    }
    if (is(name, "float")) {
        const at_jx_value *d = ARG(0, "default");
        double f;
        if (at_jx_is_number(v)) {
            *out = at_jx_float(at_jx_as_double(v));
        } else if (v.type == JX_STR && parse_float_str(v.u.s, &f)) {
            *out = at_jx_float(f);
        } else {
            *out = d ? *d : at_jx_float(0.0);
        }
        return AT_OK;
    }
    if (is(name, "abs")) {
        if (v.type == JX_INT) {
            if (v.u.i == INT64_MIN) return at_jx_fail(c, site, "integer overflow");
            *out = at_jx_int(v.u.i < 0 ? -v.u.i : v.u.i);
        } else if (v.type == JX_BOOL) {
            *out = at_jx_int(v.u.b);
        } else if (v.type == JX_FLOAT) {
            *out = at_jx_float(fabs(v.u.f));
        } else {
            return at_jx_fail(c, site, "TypeError: bad operand type for abs(): '%s'", at_jx_type_name(v));
        }
        return AT_OK;
    }
    if (is(name, "round")) {
        const at_jx_value *pr = ARG(0, "precision"), *method = ARG(1, "method");
        int64_t p = opt_int(pr, 0);
        if (!at_jx_is_number(v)) return at_jx_fail(c, site, "TypeError: round needs a number");
        double x = at_jx_as_double(v), m = pow(10.0, (double)p), r;
        const char *meth = method && method->type == JX_STR ? method->u.s->s : "common";
        if (is(meth, "ceil")) r = ceil(x * m) / m;
        else if (is(meth, "floor")) r = floor(x * m) / m;
        else if (is(meth, "common")) {
            /* Python round(): half to even on the decimal value */
            double y = x * m, fl = floor(y), diff = y - fl;
            r = diff > 0.5 ? fl + 1 : diff < 0.5 ? fl : (fmod(fl, 2.0) == 0 ? fl : fl + 1);
            r /= m;
        } else {
            return at_jx_fail(c, site, "FilterArgumentError: method must be common, ceil or floor");
        }
        *out = at_jx_float(r);
        return AT_OK;
    }
    if (is(name, "sum")) {
        const at_jx_value *attr = ARG(0, "attribute"), *start = ARG(1, "start");
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        at_jx_value acc = start ? *start : at_jx_int(0);
        for (size_t i = 0; i < l->n; i++) {
            at_jx_value x = {0};
            AT_TRY(attr_path(c, site, l->v[i], attr, &x));
            if (!at_jx_is_number(acc) || !at_jx_is_number(x))
                return at_jx_fail(c, site, "TypeError: sum needs numbers");
            if (acc.type == JX_FLOAT || x.type == JX_FLOAT) {
                acc = at_jx_float(at_jx_as_double(acc) + at_jx_as_double(x));
            } else {
                int64_t r, a = acc.type == JX_INT ? acc.u.i : acc.u.b, b = x.type == JX_INT ? x.u.i : x.u.b;
                if (__builtin_add_overflow(a, b, &r)) return at_jx_fail(c, site, "integer overflow");
                acc = at_jx_int(r);
            }
        }
        *out = acc;
        return AT_OK;
    }
    if (is(name, "center")) {
        AT_TRY(soft_str(c, site, v, &s));
        int64_t w = opt_int(ARG(0, "width"), 80);
        int64_t n = (int64_t)at_jx_utf8_count(s->s, s->len);
        if (w > 1 << 20) w = 1 << 20;
        if (w <= n) {
            *out = (at_jx_value){.type = JX_STR, .u.s = s};
            return AT_OK;
        }
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        at_jx_buf b = {0};
        for (int64_t i = 0; i < left; i++) AT_TRY(at_jx_putc(c, site, &b, ' '));
        AT_TRY(at_jx_put(c, site, &b, s->s, s->len));
        for (int64_t i = 0; i < pad - left; i++) AT_TRY(at_jx_putc(c, site, &b, ' '));
        return at_jx_str_buf(c, site, &b, out);
    }
    if (is(name, "indent")) {
        AT_TRY(soft_str(c, site, v, &s));
        const at_jx_value *w = ARG(0, "width"), *first = ARG(1, "first"), *blank = ARG(2, "blank");
        return indent_filter(c, site, s, w, first && at_jx_truthy(*first), blank && at_jx_truthy(*blank), out);
    }
    if (is(name, "truncate")) {
        AT_TRY(soft_str(c, site, v, &s));
        int64_t length = opt_int(ARG(0, "length"), 255);
        const at_jx_value *kw = ARG(1, "killwords"), *endv = ARG(2, "end"), *lw = ARG(3, "leeway");
        int64_t leeway = opt_int(lw, 5);
        at_jx_str *end = NULL;
        if (endv) {
            AT_TRY(soft_str(c, site, *endv, &end));
        } else {
            at_jx_value e = {0};
            AT_TRY(mkstr(c, site, "...", 3, &e));
            end = e.u.s;
        }
        int64_t n = (int64_t)at_jx_utf8_count(s->s, s->len), el = (int64_t)at_jx_utf8_count(end->s, end->len);
        if (length < el) return at_jx_fail(c, site, "expected length >= %lld, got %lld", (long long)el, (long long)length);
        if (leeway < 0) return at_jx_fail(c, site, "expected leeway >= 0");
        if (n <= length + leeway) {
            *out = (at_jx_value){.type = JX_STR, .u.s = s};
            return AT_OK;
        }
        /* s[:length - len(end)], then (unless killwords) drop the last partial word */
        size_t cut = 0;
        for (int64_t k = 0; k < length - el && cut < s->len; k++) at_jx_utf8_next(s->s, s->len, &cut);
        if (!(kw && at_jx_truthy(*kw))) {
            for (size_t p = cut; p > 0; p--)
                if (s->s[p - 1] == ' ') {
                    cut = p - 1;
                    break;
                }
        }
        at_jx_buf b = {0};
        AT_TRY(at_jx_put(c, site, &b, s->s, cut));
        AT_TRY(at_jx_put(c, site, &b, end->s, end->len));
        return at_jx_str_buf(c, site, &b, out);
    }
    if (is(name, "wordcount")) {
        AT_TRY(soft_str(c, site, v, &s));
        int64_t n = 0;
        int in_word = 0;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp = at_jx_utf8_next(s->s, s->len, &i);
            utf8proc_category_t k = cp <= 0x10FFFF ? utf8proc_category((utf8proc_int32_t)cp) : UTF8PROC_CATEGORY_CN;
            int w = cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                    (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) || k == UTF8PROC_CATEGORY_MN ||
                    k == UTF8PROC_CATEGORY_MC;
            if (w && !in_word) n++;
            in_word = w;
        }
        *out = at_jx_int(n);
        return AT_OK;
    }
    if (is(name, "format")) {
        AT_TRY(soft_str(c, site, v, &s));
        if (nkw) return at_jx_fail(c, site, "format filter: keyword arguments are not supported");
        return percent_format(c, site, s, args, nargs, out);
    }
    if (is(name, "batch")) {
        int64_t cnt = opt_int(ARG(0, "linecount"), 0);
        const at_jx_value *fill = ARG(1, "fill_with");
        if (cnt <= 0) return at_jx_fail(c, site, "batch needs a positive count");
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, site, v, &l));
        AT_TRY(at_jx_list_new(c, site, 0, out));
        at_jx_value cur = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i % (size_t)cnt == 0) {
                AT_TRY(at_jx_list_new(c, site, (size_t)cnt, &cur));
                AT_TRY(at_jx_list_push(c, site, out->u.l, cur));
            }
            AT_TRY(at_jx_list_push(c, site, cur.u.l, l->v[i]));
        }
        if (fill && cur.type == JX_LIST)
            while (cur.u.l->n < (size_t)cnt) AT_TRY(at_jx_list_push(c, site, cur.u.l, *fill));
        return AT_OK;
    }
#undef ARG
    return at_jx_fail(c, site, "no filter named '%s'", name);
}
