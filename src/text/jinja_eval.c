/* Jinja evaluator: runs the syntax tree against variables.
 *
 * Scoping follows Jinja2: a for loop gives each iteration a fresh scope whose
 * parent is the scope around the loop (so {% set %} inside a loop never leaks
 * out, and each iteration starts from the outer values), macros and `with`
 * blocks get their own scope, `if` does not. Namespaces (namespace()) are the
 * way to carry values out of loops, as in Jinja2. */
#include "text/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static at_status exec_body(at_jx_ctx *c, at_jx_scope *sc, const at_jx_nodes *body);

/* ---- scopes ---- */

static at_jx_scope *scope_new(at_jx_ctx *c, at_jx_scope *parent)
{
    at_jx_scope *s = at_jx_alloc(&c->ar, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static at_status scope_set(at_jx_ctx *c, const at_jx_node *site, at_jx_scope *s, const char *name, at_jx_value v)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return AT_OK;
        }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = at_jx_alloc(&c->ar, nc * sizeof *nn);
        at_jx_value *nv = at_jx_alloc(&c->ar, nc * sizeof *nv);
        if (!nn || !nv) return at_jx_oom(c, site);
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return AT_OK;
}

static int scope_find(at_jx_scope *s, const char *name, at_jx_value *out)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i > 0; i--)
            if (strcmp(s->names[i - 1], name) == 0) {
                *out = s->vals[i - 1];
                return 1;
            }
    return 0;
}

/* An undefined value remembering why, for the error when it is used. */
static at_jx_value undef_msg(at_jx_ctx *c, const char *fmt, const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = strlen(fmt) + alen + blen + 1;
    char *m = at_jx_alloc(&c->ar, n);
    if (!m) return at_jx_undef(NULL);
    snprintf(m, n, fmt, (int)alen, a, (int)blen, b);
    return at_jx_undef(m);
}

at_status at_jx_undefined_error(at_jx_ctx *c, const at_jx_node *site, at_jx_value v)
{
    return at_jx_fail(c, site, "UndefinedError: %s", v.u.undef_name ? v.u.undef_name : "value is undefined");
}

at_status at_jx_step(at_jx_ctx *c, const at_jx_node *site)
{
    if (++c->steps > c->opt.max_steps)
        return at_jx_fail(c, site, "template exceeded %llu evaluation steps (limit)", (unsigned long long)c->opt.max_steps);
    return AT_OK;
}

static at_status lookup(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value *out)
{
    if (scope_find(sc, n->name, out)) return AT_OK;
    if (at_jx_global(n->name, n->name_len, out, c)) return AT_OK;
    *out = undef_msg(c, "'%.*s' is undefined%.*s", n->name, n->name_len, "", 0);
    return AT_OK;
}

/* ---- iteration ---- */

at_status at_jx_to_list(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, at_jx_list **out)
{
    at_jx_value lv = {0};
    switch (v.type) {
    case JX_LIST: *out = v.u.l; return AT_OK;
    case JX_UNDEF:
        AT_TRY(at_jx_list_new(c, site, 0, &lv));
        *out = lv.u.l;
        return AT_OK;
    case JX_DICT:
        if (v.u.d->kind != JX_DICT_PLAIN) break;
        AT_TRY(at_jx_list_new(c, site, v.u.d->n, &lv));
        for (size_t i = 0; i < v.u.d->n; i++) AT_TRY(at_jx_list_push(c, site, lv.u.l, v.u.d->keys[i]));
        *out = lv.u.l;
        return AT_OK;
    case JX_STR: {
        const at_jx_str *s = v.u.s;
        AT_TRY(at_jx_list_new(c, site, s->len, &lv));
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            at_jx_utf8_next(s->s, s->len, &i);
            at_jx_value ch = {0};
            AT_TRY(at_jx_str_new(c, site, s->s + st, i - st, &ch));
            AT_TRY(at_jx_list_push(c, site, lv.u.l, ch));
        }
        *out = lv.u.l;
        return AT_OK;
    }
    default: break;
    }
    return at_jx_fail(c, site, "TypeError: '%s' object is not iterable", at_jx_type_name(v));
}

/* ---- attribute and item access ---- */

static at_status loop_attr(at_jx_ctx *c, const at_jx_node *site, at_jx_loop *L, const char *name, at_jx_value *out)
{
    size_t n = L->items->n, i = L->index0;
    if (!strcmp(name, "index")) *out = at_jx_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = at_jx_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = at_jx_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = at_jx_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = at_jx_bool(i == 0);
    else if (!strcmp(name, "last")) *out = at_jx_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = at_jx_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = at_jx_int(L->depth0 + 1);
    else if (!strcmp(name, "depth0")) *out = at_jx_int(L->depth0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? L->items->v[i - 1] : undef_msg(c, "there is no previous item%.*s%.*s", "", 0, "", 0);
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? L->items->v[i + 1] : undef_msg(c, "there is no next item%.*s%.*s", "", 0, "", 0);
    else {
        at_jx_value self = {.type = JX_LOOP};
        self.u.loop = L;
        if (at_jx_method(c, self, name, strlen(name), out)) return AT_OK;
        *out = undef_msg(c, "'LoopContext object' has no attribute '%.*s'%.*s", name, strlen(name), "", 0);
    }
    (void)site;
    return AT_OK;
}

at_status at_jx_getattr(at_jx_ctx *c, const at_jx_node *site, at_jx_value obj, const char *name, size_t len,
                        at_jx_value *out)
{
    switch (obj.type) {
    case JX_UNDEF: return at_jx_undefined_error(c, site, obj);
    case JX_LOOP: return loop_attr(c, site, obj.u.loop, name, out);
    case JX_DICT: {
        if (obj.u.d->kind == JX_DICT_PLAIN && at_jx_method(c, obj, name, len, out)) return AT_OK;
        at_jx_value *v = at_jx_dict_get_cstr(obj.u.d, name, len);
        if (v) {
            *out = *v;
            return AT_OK;
        }
        break;
    }
    default:
        if (at_jx_method(c, obj, name, len, out)) return AT_OK;
        break;
    }
    if (len && name[0] == '_') {
        *out = undef_msg(c, "access to attribute '%.*s' of '%.*s' object is unsafe", name, len, at_jx_type_name(obj),
                         strlen(at_jx_type_name(obj)));
        return AT_OK;
    }
    if (obj.type == JX_NONE)
        *out = undef_msg(c, "'None' has no attribute '%.*s'%.*s", name, len, "", 0);
    else
        *out = undef_msg(c, "'%.*s object' has no attribute '%.*s'", at_jx_type_name(obj), strlen(at_jx_type_name(obj)),
                         name, len);
    return AT_OK;
}

static int index_of(int64_t k, size_t n, size_t *out)
{
    if (k < 0) k += (int64_t)n;
    if (k < 0 || (uint64_t)k >= n) return 0;
    *out = (size_t)k;
    return 1;
}

/* Byte offset of code point number `k` of s (k <= count). */
static size_t cp_offset(const at_jx_str *s, size_t k)
{
    size_t i = 0;
    while (k > 0 && i < s->len) {
        at_jx_utf8_next(s->s, s->len, &i);
        k--;
    }
    return i;
}

static int is_ascii(const at_jx_str *s)
{
    for (size_t i = 0; i < s->len; i++)
        if ((unsigned char)s->s[i] >= 0x80) return 0;
    return 1;
}

at_status at_jx_getitem(at_jx_ctx *c, const at_jx_node *site, at_jx_value obj, at_jx_value key, at_jx_value *out)
{
    if (obj.type == JX_UNDEF) return at_jx_undefined_error(c, site, obj);
    if (key.type == JX_UNDEF) return at_jx_undefined_error(c, site, key);
    if (obj.type == JX_DICT && obj.u.d->kind == JX_DICT_PLAIN) {
        at_jx_value *v = at_jx_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return AT_OK;
        }
    } else if ((obj.type == JX_LIST || obj.type == JX_STR) && (key.type == JX_INT || key.type == JX_BOOL)) {
        int64_t k = key.type == JX_INT ? key.u.i : key.u.b;
        size_t idx = 0;
        if (obj.type == JX_LIST) {
            if (index_of(k, obj.u.l->n, &idx)) {
                *out = obj.u.l->v[idx];
                return AT_OK;
            }
        } else {
            const at_jx_str *s = obj.u.s;
            size_t n = is_ascii(s) ? s->len : at_jx_utf8_count(s->s, s->len);
            if (index_of(k, n, &idx)) {
                size_t st = n == s->len ? idx : cp_offset(s, idx), e = st;
                at_jx_utf8_next(s->s, s->len, &e);
                return at_jx_str_new(c, site, s->s + st, e - st, out);
            }
        }
        *out = undef_msg(c, "%.*s index out of range%.*s", at_jx_type_name(obj), strlen(at_jx_type_name(obj)), "", 0);
        return AT_OK;
    }
    if (key.type == JX_STR) return at_jx_getattr(c, site, obj, key.u.s->s, key.u.s->len, out);
    *out = undef_msg(c, "'%.*s object' has no item of that type%.*s", at_jx_type_name(obj), strlen(at_jx_type_name(obj)),
                     "", 0);
    return AT_OK;
}

/* Python slice index normalization (CPython PySlice_AdjustIndices). */
static void adjust_slice(int64_t len, int has_start, int64_t start, int has_stop, int64_t stop, int64_t step,
                         int64_t *ostart, int64_t *ostop)
{
    if (!has_start) start = step < 0 ? len - 1 : 0;
    else if (start < 0) {
        start += len;
        if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= len) {
        start = step < 0 ? len - 1 : len;
    }
    if (!has_stop) stop = step < 0 ? -1 : len;
    else if (stop < 0) {
        stop += len;
        if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= len) {
        stop = step < 0 ? len - 1 : len;
    }
    *ostart = start;
    *ostop = stop;
}

static at_status slice_bound(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, int *has, int64_t *v)
{
    *has = 0;
    if (!n) return AT_OK;
    at_jx_value x = {0};
    AT_TRY(at_jx_eval(c, sc, n, &x));
    if (x.type == JX_NONE) return AT_OK;
    if (x.type != JX_INT && x.type != JX_BOOL)
        return at_jx_fail(c, n, "TypeError: slice indices must be integers or None");
    *has = 1;
    *v = x.type == JX_INT ? x.u.i : x.u.b;
    return AT_OK;
}

static at_status eval_slice(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, at_jx_value obj,
                            const at_jx_node *sl, at_jx_value *out)
{
    int hs, he, hp;
    int64_t s = 0, e = 0, step = 1;
    AT_TRY(slice_bound(c, sc, sl->a, &hs, &s));
    AT_TRY(slice_bound(c, sc, sl->b, &he, &e));
    AT_TRY(slice_bound(c, sc, sl->c, &hp, &step));
    if (!hp) step = 1;
    if (step == 0) return at_jx_fail(c, site, "ValueError: slice step cannot be zero");
    if (obj.type == JX_UNDEF) return at_jx_undefined_error(c, site, obj);
    if (obj.type == JX_LIST) {
        const at_jx_list *l = obj.u.l;
        int64_t a, b;
        adjust_slice((int64_t)l->n, hs, s, he, e, step, &a, &b);
        AT_TRY(at_jx_list_new(c, site, 0, out));
        out->u.l->is_tuple = l->is_tuple;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) AT_TRY(at_jx_list_push(c, site, out->u.l, l->v[i]));
        return AT_OK;
    }
    if (obj.type == JX_STR) {
        const at_jx_str *str = obj.u.s;
        int ascii = is_ascii(str);
        size_t n = ascii ? str->len : at_jx_utf8_count(str->s, str->len);
        int64_t a, b;
        adjust_slice((int64_t)n, hs, s, he, e, step, &a, &b);
        if (step == 1) {
            if (b <= a) return at_jx_str_new(c, site, "", 0, out);
            size_t ba = ascii ? (size_t)a : cp_offset(str, (size_t)a);
            size_t bb = ascii ? (size_t)b : cp_offset(str, (size_t)b);
            return at_jx_str_new(c, site, str->s + ba, bb - ba, out);
        }
        /* general step: collect code point offsets */
        size_t *offs = at_jx_alloc(&c->ar, (n + 1) * sizeof *offs);
        if (!offs) return at_jx_oom(c, site);
        size_t k = 0;
        for (size_t i = 0; i < str->len;) {
            offs[k++] = i;
            at_jx_utf8_next(str->s, str->len, &i);
        }
        offs[n] = str->len;
        at_jx_buf b2 = {0};
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            AT_TRY(at_jx_put(c, site, &b2, str->s + offs[i], offs[i + 1] - offs[i]));
        return at_jx_str_buf(c, site, &b2, out);
    }
    return at_jx_fail(c, site, "TypeError: '%s' object is not subscriptable", at_jx_type_name(obj));
}

/* ---- operators ---- */

static at_status int_result(at_jx_ctx *c, const at_jx_node *site, int overflow, int64_t r, at_jx_value *out)
{
    if (overflow) return at_jx_fail(c, site, "integer overflow (values are 64-bit)");
    *out = at_jx_int(r);
    return AT_OK;
}

static int64_t to_i(at_jx_value v) { return v.type == JX_INT ? v.u.i : v.u.b; }

static at_status repeat_seq(at_jx_ctx *c, const at_jx_node *site, at_jx_value seq, int64_t times, at_jx_value *out)
{
    if (times < 0) times = 0;
    /* nothing repeated any number of times is nothing: no loop of `times` empty turns */
    if ((seq.type == JX_STR ? seq.u.s->len : seq.u.l->n) == 0) times = 0;
    if (seq.type == JX_STR) {
        if (seq.u.s->len && (uint64_t)times > c->opt.max_output / seq.u.s->len)
            return at_jx_fail(c, site, "string repetition exceeds the output limit");
        at_jx_buf b = {0};
        for (int64_t i = 0; i < times; i++) AT_TRY(at_jx_put(c, site, &b, seq.u.s->s, seq.u.s->len));
        return at_jx_str_buf(c, site, &b, out);
    }
    if (seq.u.l->n && (uint64_t)times > c->opt.max_output / seq.u.l->n)
        return at_jx_fail(c, site, "list repetition too large (limit)");
    AT_TRY(at_jx_list_new(c, site, 0, out));
    out->u.l->is_tuple = seq.u.l->is_tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < seq.u.l->n; j++) AT_TRY(at_jx_list_push(c, site, out->u.l, seq.u.l->v[j]));
    return AT_OK;
}

static const char *op_symbol(int op)
{
    switch (op) {
    case JO_ADD: return "+";
    case JO_SUB: return "-";
    case JO_MUL: return "*";
    case JO_DIV: return "/";
    case JO_FLOORDIV: return "//";
    case JO_MOD: return "%";
    case JO_POW: return "**";
    }
    return "?";
}

static at_status binop(at_jx_ctx *c, const at_jx_node *site, int op, at_jx_value a, at_jx_value b, at_jx_value *out)
{
    if (op == JO_TILDE) {
        at_jx_buf buf = {0};
        AT_TRY(at_jx_write_str(c, site, &buf, a));
        AT_TRY(at_jx_write_str(c, site, &buf, b));
        return at_jx_str_buf(c, site, &buf, out);
    }
    if (a.type == JX_UNDEF) return at_jx_undefined_error(c, site, a);
    if (b.type == JX_UNDEF) return at_jx_undefined_error(c, site, b);
    int an = at_jx_is_number(a), bn = at_jx_is_number(b);
    if (an && bn) {
        int fl = a.type == JX_FLOAT || b.type == JX_FLOAT;
        double x = at_jx_as_double(a), y = at_jx_as_double(b);
        int64_t i = to_i(a), j = to_i(b), r = 0;
        switch (op) {
        case JO_ADD:
            if (fl) break;
            {
                int ov = __builtin_add_overflow(i, j, &r);
                return int_result(c, site, ov, r, out);
            }
        case JO_SUB:
            if (fl) break;
            {
                int ov = __builtin_sub_overflow(i, j, &r);
                return int_result(c, site, ov, r, out);
            }
        case JO_MUL:
            if (fl) break;
            {
                int ov = __builtin_mul_overflow(i, j, &r);
                return int_result(c, site, ov, r, out);
            }
        case JO_DIV:
            if (y == 0) return at_jx_fail(c, site, "ZeroDivisionError: division by zero");
            *out = at_jx_float(x / y);
            return AT_OK;
        case JO_FLOORDIV:
        case JO_MOD:
            if (fl ? y == 0 : j == 0)
                return at_jx_fail(c, site, "ZeroDivisionError: integer division or modulo by zero");
            if (!fl) {
                if (i == INT64_MIN && j == -1) return int_result(c, site, 1, 0, out);
                int64_t q = i / j, m = i % j;
                if (m != 0 && ((m < 0) != (j < 0))) {
                    q--;
                    m += j;
                }
                *out = at_jx_int(op == JO_FLOORDIV ? q : m);
                return AT_OK;
            } else {
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                *out = at_jx_float(op == JO_FLOORDIV ? floor(x / y) : m);
                return AT_OK;
            }
        case JO_POW:
            if (!fl && j >= 0) {
                int64_t res = 1, base = i;
                int ov = 0;
                for (int64_t e = j; e > 0 && !ov; e >>= 1) {
                    if (e & 1) ov |= __builtin_mul_overflow(res, base, &res);
                    if (e > 1) ov |= __builtin_mul_overflow(base, base, &base);
                }
                return int_result(c, site, ov, res, out);
            }
            if (x == 0 && y < 0) return at_jx_fail(c, site, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
            *out = at_jx_float(pow(x, y));
            return AT_OK;
        }
        /* float + - * */
        *out = at_jx_float(op == JO_ADD ? x + y : op == JO_SUB ? x - y : x * y);
        return AT_OK;
    }
    if (op == JO_ADD && a.type == JX_STR && b.type == JX_STR) {
        at_jx_buf buf = {0};
        AT_TRY(at_jx_put(c, site, &buf, a.u.s->s, a.u.s->len));
        AT_TRY(at_jx_put(c, site, &buf, b.u.s->s, b.u.s->len));
        return at_jx_str_buf(c, site, &buf, out);
    }
    if (op == JO_ADD && a.type == JX_LIST && b.type == JX_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        AT_TRY(at_jx_list_new(c, site, a.u.l->n + b.u.l->n, out));
        out->u.l->is_tuple = a.u.l->is_tuple;
        for (size_t k = 0; k < a.u.l->n; k++) AT_TRY(at_jx_list_push(c, site, out->u.l, a.u.l->v[k]));
        for (size_t k = 0; k < b.u.l->n; k++) AT_TRY(at_jx_list_push(c, site, out->u.l, b.u.l->v[k]));
        return AT_OK;
    }
    if (op == JO_MUL && (a.type == JX_STR || a.type == JX_LIST) && (b.type == JX_INT || b.type == JX_BOOL))
        return repeat_seq(c, site, a, to_i(b), out);
    if (op == JO_MUL && (b.type == JX_STR || b.type == JX_LIST) && (a.type == JX_INT || a.type == JX_BOOL))
        return repeat_seq(c, site, b, to_i(a), out);
    if (op == JO_ADD && a.type == JX_STR)
        return at_jx_fail(c, site, "TypeError: can only concatenate str (not \"%s\") to str", at_jx_type_name(b));
    return at_jx_fail(c, site, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op_symbol(op),
                      at_jx_type_name(a), at_jx_type_name(b));
}

static at_status contains(at_jx_ctx *c, const at_jx_node *site, at_jx_value hay, at_jx_value needle, int *out)
{
    *out = 0;
    switch (hay.type) {
    case JX_UNDEF: return AT_OK;
    case JX_STR:
        if (needle.type == JX_UNDEF) return at_jx_undefined_error(c, site, needle);
        if (needle.type != JX_STR)
            return at_jx_fail(c, site, "TypeError: 'in <string>' requires string as left operand, not %s",
                              at_jx_type_name(needle));
        if (needle.u.s->len == 0) {
            *out = 1;
            return AT_OK;
        }
        *out = memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
        return AT_OK;
    case JX_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (at_jx_equal(hay.u.l->v[i], needle)) {
                *out = 1;
                break;
            }
        return AT_OK;
    case JX_DICT:
        if (hay.u.d->kind != JX_DICT_PLAIN) break;
        *out = at_jx_dict_get(hay.u.d, needle) != NULL;
        return AT_OK;
    default: break;
    }
    return at_jx_fail(c, site, "TypeError: argument of type '%s' is not iterable", at_jx_type_name(hay));
}

/* ---- calls ---- */

static at_status eval_args(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value **args, at_jx_value **kw)
{
    *args = NULL;
    *kw = NULL;
    if (n->body.n) {
        *args = at_jx_alloc(&c->ar, (size_t)n->body.n * sizeof **args);
        if (!*args) return at_jx_oom(c, n);
        for (int i = 0; i < n->body.n; i++) AT_TRY(at_jx_eval(c, sc, n->body.v[i], &(*args)[i]));
    }
    if (n->kwvals.n) {
        *kw = at_jx_alloc(&c->ar, (size_t)n->kwvals.n * sizeof **kw);
        if (!*kw) return at_jx_oom(c, n);
        for (int i = 0; i < n->kwvals.n; i++) AT_TRY(at_jx_eval(c, sc, n->kwvals.v[i], &(*kw)[i]));
    }
    return AT_OK;
}

/* Runs body with output captured into a new string. */
static at_status capture(at_jx_ctx *c, at_jx_scope *sc, const at_jx_nodes *body, const at_jx_node *site,
                         at_jx_value *out)
{
    at_jx_buf buf = {0}, *saved = c->out;
    c->out = &buf;
    at_status st = exec_body(c, sc, body);
    c->out = saved;
    if (st != AT_OK) return st;
    return at_jx_str_buf(c, site, &buf, out);
}

static at_status call_macro(at_jx_ctx *c, const at_jx_node *site, const at_jx_func *fn, int nargs,
                            const at_jx_value *args, int nkw, const char **kwnames, const at_jx_value *kwvals,
                            at_jx_value *out)
{
    const at_jx_node *m = fn->macro;
    int np = m->kwvals.n, nd = m->orelse.n;
    if (nargs > np) return at_jx_fail(c, site, "macro '%s' takes not more than %d argument(s)", m->name, np);
    if (c->depth >= c->opt.max_depth)
        return at_jx_fail(c, site, "macro calls nested more than %d deep (limit)", c->opt.max_depth);
    at_jx_scope *sc = scope_new(c, fn->closure);
    if (!sc) return at_jx_oom(c, site);
    for (int i = 0; i < np; i++) {
        const char *pname = m->kwvals.v[i]->name;
        at_jx_value v = {0};
        int have = 0;
        if (i < nargs) {
            v = args[i];
            have = 1;
        }
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kwnames[k], pname)) {
                if (have) return at_jx_fail(c, site, "macro '%s' got multiple values for argument '%s'", m->name, pname);
                v = kwvals[k];
                have = 1;
            }
        if (!have) {
            int di = i - (np - nd);
            if (di >= 0) {
                AT_TRY(at_jx_eval(c, sc, m->orelse.v[di], &v));
            } else {
                v = undef_msg(c, "parameter '%.*s' was not provided%.*s", pname, strlen(pname), "", 0);
            }
        }
        AT_TRY(scope_set(c, site, sc, pname, v));
    }
    for (int k = 0; k < nkw; k++) {
        int found = 0;
        for (int i = 0; i < np; i++)
            if (!strcmp(kwnames[k], m->kwvals.v[i]->name)) found = 1;
        if (!found) return at_jx_fail(c, site, "macro '%s' takes no keyword argument '%s'", m->name, kwnames[k]);
    }
    c->depth++;
    at_status st = capture(c, sc, &m->body, site, out);
    c->depth--;
    c->ctl = 0;
    return st;
}

static at_status run_for(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value iterable, int depth0);

at_status at_jx_call(at_jx_ctx *c, const at_jx_node *site, at_jx_value fn, int nargs, const at_jx_value *args,
                     int nkw, const char **kwnames, const at_jx_value *kwvals, at_jx_value *out)
{
    if (fn.type == JX_FUNC) {
        if (fn.u.fn->kind == JX_FN_MACRO) return call_macro(c, site, fn.u.fn, nargs, args, nkw, kwnames, kwvals, out);
        return at_jx_call_builtin(c, site, fn.u.fn, nargs, args, nkw, kwnames, kwvals, out);
    }
    if (fn.type == JX_LOOP) {
        /* recursive loop: loop(children) renders the loop body again */
        at_jx_loop *L = fn.u.loop;
        if (!L->node->flag) return at_jx_fail(c, site, "TypeError: the loop is not recursive");
        if (nargs != 1) return at_jx_fail(c, site, "loop() takes exactly one argument");
        if (c->depth >= c->opt.max_depth)
            return at_jx_fail(c, site, "recursive loop nested more than %d deep (limit)", c->opt.max_depth);
        at_jx_buf buf = {0}, *saved = c->out;
        c->out = &buf;
        c->depth++;
        at_status st = run_for(c, L->scope, L->node, args[0], L->depth0 + 1);
        c->depth--;
        c->out = saved;
        if (st != AT_OK) return st;
        return at_jx_str_buf(c, site, &buf, out);
    }
    if (fn.type == JX_UNDEF) return at_jx_undefined_error(c, site, fn);
    return at_jx_fail(c, site, "TypeError: '%s' object is not callable", at_jx_type_name(fn));
}

/* ---- expressions ---- */

static at_status eval_filter(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value v, at_jx_value *out)
{
    at_jx_value *args, *kw;
    AT_TRY(eval_args(c, sc, n, &args, &kw));
    return at_jx_filter(c, sc, n, n->name, v, n->body.n, args, n->kwvals.n, n->kwnames, kw, out);
}

/* Applies a filter chain whose innermost operand is NULL to v. */
static at_status apply_chain(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *f, at_jx_value v, at_jx_value *out)
{
    if (!f) {
        *out = v;
        return AT_OK;
    }
    at_jx_value inner = {0};
    AT_TRY(apply_chain(c, sc, f->a, v, &inner));
    return eval_filter(c, sc, f, inner, out);
}

at_status at_jx_eval(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value *out)
{
    AT_TRY(at_jx_step(c, n));
    at_jx_value a = {0}, b = {0};
    switch (n->kind) {
    case JN_CONST: *out = n->val; return AT_OK;
    case JN_NAME: return lookup(c, sc, n, out);
    case JN_GETATTR:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        return at_jx_getattr(c, n, a, n->name, n->name_len, out);
    case JN_GETITEM:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        if (n->b->kind == JN_SLICE) return eval_slice(c, sc, n, a, n->b, out);
        AT_TRY(at_jx_eval(c, sc, n->b, &b));
        return at_jx_getitem(c, n, a, b, out);
    case JN_CALL: {
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        at_jx_value *args, *kw;
        AT_TRY(eval_args(c, sc, n, &args, &kw));
        return at_jx_call(c, n, a, n->body.n, args, n->kwvals.n, n->kwnames, kw, out);
    }
    case JN_FILTER:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        return eval_filter(c, sc, n, a, out);
    case JN_TEST: {
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        at_jx_value *args, *kw;
        AT_TRY(eval_args(c, sc, n, &args, &kw));
        int r;
        AT_TRY(at_jx_test(c, sc, n, n->name, a, n->body.n, args, &r));
        *out = at_jx_bool(r);
        return AT_OK;
    }
    case JN_NOT:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        *out = at_jx_bool(!at_jx_truthy(a));
        return AT_OK;
    case JN_NEG:
    case JN_POS:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        if (a.type == JX_UNDEF) return at_jx_undefined_error(c, n, a);
        if (a.type == JX_FLOAT) {
            *out = at_jx_float(n->kind == JN_NEG ? -a.u.f : a.u.f);
        } else if (a.type == JX_INT || a.type == JX_BOOL) {
            int64_t i = to_i(a);
            if (n->kind == JN_NEG && i == INT64_MIN) return int_result(c, n, 1, 0, out);
            *out = at_jx_int(n->kind == JN_NEG ? -i : i);
        } else {
            return at_jx_fail(c, n, "TypeError: bad operand type for unary %s: '%s'", n->kind == JN_NEG ? "-" : "+",
                              at_jx_type_name(a));
        }
        return AT_OK;
    case JN_BINOP:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        AT_TRY(at_jx_eval(c, sc, n->b, &b));
        return binop(c, n, n->op, a, b, out);
    case JN_AND:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        if (!at_jx_truthy(a)) {
            *out = a;
            return AT_OK;
        }
        return at_jx_eval(c, sc, n->b, out);
    case JN_OR:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        if (at_jx_truthy(a)) {
            *out = a;
            return AT_OK;
        }
        return at_jx_eval(c, sc, n->b, out);
    case JN_COMPARE: {
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        for (int i = 0; i < n->body.n; i++) {
            AT_TRY(at_jx_eval(c, sc, n->body.v[i], &b));
            int r = 0, op = n->ops[i];
            if (op == JO_EQ || op == JO_NE) {
                r = at_jx_equal(a, b) == (op == JO_EQ);
            } else if (op == JO_IN || op == JO_NOTIN) {
                AT_TRY(contains(c, n, b, a, &r));
                if (op == JO_NOTIN) r = !r;
            } else {
                int cmp;
                AT_TRY(at_jx_compare(c, n, a, b, &cmp));
                r = op == JO_LT ? cmp < 0 : op == JO_LTEQ ? cmp <= 0 : op == JO_GT ? cmp > 0 : cmp >= 0;
            }
            if (!r) {
                *out = at_jx_bool(0);
                return AT_OK;
            }
            a = b;
        }
        *out = at_jx_bool(1);
        return AT_OK;
    }
    case JN_CONDEXPR:
        AT_TRY(at_jx_eval(c, sc, n->a, &a));
        if (at_jx_truthy(a)) return at_jx_eval(c, sc, n->b, out);
        if (n->c) return at_jx_eval(c, sc, n->c, out);
        *out = undef_msg(c, "the inline if-expression evaluated to false and no else section was defined.%.*s%.*s", "",
                         0, "", 0);
        return AT_OK;
    case JN_LIST:
    case JN_TUPLE:
        AT_TRY(at_jx_list_new(c, n, (size_t)n->body.n, out));
        out->u.l->is_tuple = n->kind == JN_TUPLE;
        for (int i = 0; i < n->body.n; i++) {
            AT_TRY(at_jx_eval(c, sc, n->body.v[i], &a));
            AT_TRY(at_jx_list_push(c, n, out->u.l, a));
        }
        return AT_OK;
    case JN_DICT:
        AT_TRY(at_jx_dict_new(c, n, JX_DICT_PLAIN, out));
        for (int i = 0; i < n->body.n; i++) {
            AT_TRY(at_jx_eval(c, sc, n->body.v[i], &a));
            AT_TRY(at_jx_eval(c, sc, n->orelse.v[i], &b));
            if (a.type == JX_LIST && !a.u.l->is_tuple)
                return at_jx_fail(c, n, "TypeError: unhashable type: 'list'");
            if (a.type == JX_DICT) return at_jx_fail(c, n, "TypeError: unhashable type: 'dict'");
            AT_TRY(at_jx_dict_set(c, n, out->u.d, a, b));
        }
        return AT_OK;
    default: return at_jx_fail(c, n, "internal error: not an expression");
    }
}

/* ---- statements ---- */

static at_status assign(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *target, at_jx_value v)
{
    if (target->kind == JN_NAME) return scope_set(c, target, sc, target->name, v);
    if (target->kind == JN_TUPLE) {
        at_jx_list *l = NULL;
        AT_TRY(at_jx_to_list(c, target, v, &l));
        if (l->n != (size_t)target->body.n)
            return at_jx_fail(c, target, "ValueError: %s values to unpack (expected %d, got %zu)",
                              l->n > (size_t)target->body.n ? "too many" : "not enough", target->body.n, l->n);
        for (int i = 0; i < target->body.n; i++) AT_TRY(assign(c, sc, target->body.v[i], l->v[i]));
        return AT_OK;
    }
    if (target->kind == JN_NSREF) {
        at_jx_value ns = {0};
        if (!scope_find(sc, target->name, &ns) || ns.type != JX_DICT || ns.u.d->kind != JX_DICT_NAMESPACE)
            return at_jx_fail(c, target, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        at_jx_value k = {0};
        AT_TRY(at_jx_str_new(c, target, target->attr, strlen(target->attr), &k));
        return at_jx_dict_set(c, target, ns.u.d, k, v);
    }
    return at_jx_fail(c, target, "cannot assign to this expression");
}

static at_status run_for(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value iterable, int depth0)
{
    at_jx_list *items = NULL;
    AT_TRY(at_jx_to_list(c, n->b, iterable, &items));
    if (n->c) {
        /* the loop filter sees the target names but not the new loop object */
        at_jx_value fl = {0};
        AT_TRY(at_jx_list_new(c, n, 0, &fl));
        for (size_t i = 0; i < items->n; i++) {
            AT_TRY(at_jx_step(c, n));
            at_jx_scope *fs = scope_new(c, sc);
            if (!fs) return at_jx_oom(c, n);
            AT_TRY(assign(c, fs, n->a, items->v[i]));
            at_jx_value keep = {0};
            AT_TRY(at_jx_eval(c, fs, n->c, &keep));
            if (at_jx_truthy(keep)) AT_TRY(at_jx_list_push(c, n, fl.u.l, items->v[i]));
        }
        items = fl.u.l;
    }
    if (items->n == 0) return exec_body(c, sc, &n->orelse);
    at_jx_loop *L = at_jx_alloc(&c->ar, sizeof *L);
    if (!L) return at_jx_oom(c, n);
    L->items = items;
    L->depth0 = depth0;
    L->node = n;
    L->scope = sc;
    at_jx_value lv = {.type = JX_LOOP};
    lv.u.loop = L;
    /* one scope, emptied for each iteration, so long loops need no memory per
     * iteration (nothing can hold on to an iteration's scope past it) */
    at_jx_scope *is = scope_new(c, sc);
    if (!is) return at_jx_oom(c, n);
    for (size_t i = 0; i < items->n; i++) {
        AT_TRY(at_jx_step(c, n));
        L->index0 = i;
        is->n = 0;
        AT_TRY(assign(c, is, n->a, items->v[i]));
        AT_TRY(scope_set(c, n, is, "loop", lv));
        AT_TRY(exec_body(c, is, &n->body));
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    return AT_OK;
}

static at_status exec_stmt(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n)
{
    at_jx_value v = {0};
    switch (n->kind) {
    case JN_OUTPUT:
        for (int i = 0; i < n->body.n; i++) {
            const at_jx_node *e = n->body.v[i];
            if (e->kind == JN_DATA) {
                AT_TRY(at_jx_put(c, e, c->out, e->name, e->name_len));
            } else {
                AT_TRY(at_jx_eval(c, sc, e, &v));
                AT_TRY(at_jx_write_str(c, e, c->out, v));
            }
        }
        return AT_OK;
    case JN_IF:
        AT_TRY(at_jx_eval(c, sc, n->a, &v));
        return exec_body(c, sc, at_jx_truthy(v) ? &n->body : &n->orelse);
    case JN_FOR:
        AT_TRY(at_jx_eval(c, sc, n->b, &v));
        return run_for(c, sc, n, v, 0);
    case JN_SET:
        AT_TRY(at_jx_eval(c, sc, n->b, &v));
        return assign(c, sc, n->a, v);
    case JN_SET_BLOCK: {
        at_jx_value body = {0}, r = {0};
        AT_TRY(capture(c, sc, &n->body, n, &body));
        AT_TRY(apply_chain(c, sc, n->c, body, &r));
        return assign(c, sc, n->a, r);
    }
    case JN_FILTER_BLOCK: {
        at_jx_value body = {0}, r = {0};
        AT_TRY(capture(c, sc, &n->body, n, &body));
        AT_TRY(apply_chain(c, sc, n->c, body, &r));
        return at_jx_write_str(c, n, c->out, r);
    }
    case JN_MACRO: {
        at_jx_func *fn = at_jx_alloc(&c->ar, sizeof *fn);
        if (!fn) return at_jx_oom(c, n);
        fn->kind = JX_FN_MACRO;
        fn->name = n->name;
        fn->macro = n;
        fn->closure = sc;
        v.type = JX_FUNC;
        v.u.fn = fn;
        return scope_set(c, n, sc, n->name, v);
    }
    case JN_WITH: {
        at_jx_scope *ws = scope_new(c, sc);
        if (!ws) return at_jx_oom(c, n);
        for (int i = 0; i < n->kwvals.n; i++) {
            AT_TRY(at_jx_eval(c, sc, n->orelse.v[i], &v));
            AT_TRY(assign(c, ws, n->kwvals.v[i], v));
        }
        return exec_body(c, ws, &n->body);
    }
    case JN_GENERATION: {
        int track = c->out == c->root_out;
        size_t start = c->out->len;
        AT_TRY(exec_body(c, sc, &n->body));
        if (track) {
            if (c->n_gen == c->cap_gen) {
                size_t nc = c->cap_gen ? c->cap_gen * 2 : 8;
                at_jinja_span *g = at_jx_alloc(&c->ar, nc * sizeof *g);
                if (!g) return at_jx_oom(c, n);
                if (c->n_gen) memcpy(g, c->gen, c->n_gen * sizeof *g);
                c->gen = g;
                c->cap_gen = nc;
            }
            c->gen[c->n_gen].start = start;
            c->gen[c->n_gen].end = c->out->len;
            c->n_gen++;
        }
        return AT_OK;
    }
    case JN_BREAK: c->ctl = 1; return AT_OK;
    case JN_CONTINUE: c->ctl = 2; return AT_OK;
    default: return at_jx_fail(c, n, "internal error: not a statement");
    }
}

static at_status exec_body(at_jx_ctx *c, at_jx_scope *sc, const at_jx_nodes *body)
{
    for (int i = 0; i < body->n; i++) {
        AT_TRY(exec_stmt(c, sc, body->v[i]));
        if (c->ctl) return AT_OK;
    }
    return AT_OK;
}

at_status at_jinja_render(const at_jinja_template *t, const cJSON *vars, const at_jinja_options *opt, char **out,
                          size_t *out_len, at_jinja_span **gen_spans, size_t *n_gen)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (gen_spans) *gen_spans = NULL;
    if (n_gen) *n_gen = 0;
    if (!t) return at_error(AT_ERR_INVALID, "at_jinja_render: no template");
    if (vars && !cJSON_IsObject(vars)) return at_error(AT_ERR_INVALID, "%s: render variables must be a JSON object", t->name);
    at_jx_ctx c = {0};
    c.t = t;
    if (opt) c.opt = *opt;
    if (!c.opt.max_output) c.opt.max_output = (size_t)64 << 20;
    if (!c.opt.max_memory) c.opt.max_memory = (size_t)512 << 20;
    if (!c.opt.max_steps) c.opt.max_steps = 100000000ull;
    if (!c.opt.max_depth) c.opt.max_depth = 64;
    c.ar.limit = c.opt.max_memory;
    at_jx_buf root = {0};
    c.out = c.root_out = &root;
    at_status st = AT_OK;
    c.root = scope_new(&c, NULL);
    if (!c.root) {
        st = at_jx_oom(&c, NULL);
        goto done;
    }
    if (vars) {
        for (const cJSON *m = vars->child; m; m = m->next) {
            at_jx_value v = {0};
            AT_CHECK(at_jx_from_cjson(&c, m, &v, 0));
            AT_CHECK(scope_set(&c, NULL, c.root, m->string ? m->string : "", v));
        }
    }
    AT_CHECK(exec_body(&c, c.root, &t->body));
    *out = malloc(root.len + 1);
    if (!*out) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", t->name);
        goto done;
    }
    if (root.len) memcpy(*out, root.p, root.len);
    (*out)[root.len] = '\0';
    if (out_len) *out_len = root.len;
    if (gen_spans && c.n_gen) {
        *gen_spans = malloc(c.n_gen * sizeof **gen_spans);
        if (!*gen_spans) {
            free(*out);
            *out = NULL;
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", t->name);
            goto done;
        }
        memcpy(*gen_spans, c.gen, c.n_gen * sizeof **gen_spans);
        *n_gen = c.n_gen;
    }
done:
    at_jx_arena_free(&c.ar);
    return st;
}
