/* Jinja2 parser: tokens -> syntax tree. The grammar and its precedences
 * are those of jinja2/parser.py (3.1):
 *   expr    := or ("if" or ("else" expr)?)*
 *   or      := and ("or" and)*          and := not ("and" not)*
 *   not     := "not" not | compare      compare := math1 (cmpop math1)*
 *   math1   := concat (("+"|"-") concat)*    concat := math2 ("~" math2)*
 *   math2   := pow (("*"|"/"|"//"|"%") pow)* pow := unary ("**" unary)*
 *   unary   := ("-"|"+") unary | primary postfix* ; then filters/tests
 * so `a + b | trim` filters b only, and `not x is defined` negates the test. */
#include "text/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARSE_DEPTH 200

typedef struct {
    at_jx_tok *t;
    size_t n, i;
    const char *name;
    at_jx_arena *ar;
    int depth;
    int has_gen;
} parser;

static at_status pfail(parser *P, const at_jx_tok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static at_status pfail(parser *P, const at_jx_tok *t, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return at_error(AT_ERR_FORMAT, "%s:%d:%d: %s", P->name, t->line, t->col, msg);
}

static at_status oom(parser *P) { return at_error(AT_ERR_NOMEM, "%s: template too large", P->name); }

static at_jx_tok *cur(parser *P) { return &P->t[P->i]; }
static at_jx_tok *look(parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static void adv(parser *P)
{
    if (P->i + 1 < P->n) P->i++;
}

static int is_name(const at_jx_tok *t, const char *s)
{
    return t->type == JT_NAME && t->len == strlen(s) && memcmp(t->s, s, t->len) == 0;
}
static int is_op(const at_jx_tok *t, int op) { return t->type == JT_OP && t->op == op; }

static const char *describe(const at_jx_tok *t, char *buf, size_t bs)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    case JT_NAME: snprintf(buf, bs, "%.*s", (int)(t->len > 64 ? 64 : t->len), t->s); return buf;
    case JT_OP: {
        static const char *names[] = {"", "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}",
                                      "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
        if (t->op > 0 && t->op < (int)(sizeof names / sizeof names[0])) return names[t->op];
        return "operator";
    }
    }
    return "token";
}

static at_status expect_op(parser *P, int op, const char *what)
{
    if (!is_op(cur(P), op)) {
        char b[80];
        return pfail(P, cur(P), "expected '%s', got '%s'", what, describe(cur(P), b, sizeof b));
    }
    adv(P);
    return AT_OK;
}

static at_status expect_type(parser *P, int type, const char *what)
{
    if (cur(P)->type != type) {
        char b[80];
        return pfail(P, cur(P), "expected %s, got '%s'", what, describe(cur(P), b, sizeof b));
    }
    adv(P);
    return AT_OK;
}

static at_status new_node(parser *P, int kind, const at_jx_tok *at, at_jx_node **out)
{
    at_jx_node *n = at_jx_alloc(P->ar, sizeof *n);
    if (!n) return oom(P);
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    *out = n;
    return AT_OK;
}

static at_status nodes_push(parser *P, at_jx_nodes *l, at_jx_node *x, int *cap)
{
    if (l->n == *cap) {
        int nc = *cap ? *cap * 2 : 4;
        at_jx_node **v = at_jx_alloc(P->ar, (size_t)nc * sizeof *v);
        if (!v) return oom(P);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        *cap = nc;
    }
    l->v[l->n++] = x;
    return AT_OK;
}

static char *dupname(parser *P, const char *s, size_t n)
{
    char *d = at_jx_alloc(P->ar, n + 1);
    if (d) memcpy(d, s, n);
    return d;
}

static at_status parse_expr(parser *P, int with_condexpr, at_jx_node **out);
static at_status parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren,
                             at_jx_node **out);
static at_status parse_unary(parser *P, int with_filter, at_jx_node **out);
static at_status parse_primary(parser *P, at_jx_node **out);
static at_status parse_postfix(parser *P, at_jx_node *n, at_jx_node **out);
static at_status subparse(parser *P, const char *const *end_names, at_jx_nodes *body);

static at_status enter(parser *P)
{
    if (++P->depth > MAX_PARSE_DEPTH) return pfail(P, cur(P), "template nested too deeply (more than %d levels)", MAX_PARSE_DEPTH);
    return AT_OK;
}

/* (args, kwargs) of a call; current token is '('. */
static at_status parse_call_args(parser *P, at_jx_node *n)
{
    AT_TRY(expect_op(P, JO_LPAREN, "("));
    int cap = 0, kcap = 0;
    int require_comma = 0;
    while (!is_op(cur(P), JO_RPAREN)) {
        if (require_comma) {
            AT_TRY(expect_op(P, JO_COMMA, ","));
            if (is_op(cur(P), JO_RPAREN)) break;
        }
        if (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_POW))
            return pfail(P, cur(P), "*args and **kwargs in calls are not supported");
        if (cur(P)->type == JT_NAME && is_op(look(P), JO_ASSIGN)) {
            at_jx_tok *k = cur(P);
            adv(P);
            adv(P);
            at_jx_node *v = NULL;
            AT_TRY(parse_expr(P, 1, &v));
            if (n->kwvals.n == kcap) {
                int nc = kcap ? kcap * 2 : 4;
                const char **nn = at_jx_alloc(P->ar, (size_t)nc * sizeof *nn);
                if (!nn) return oom(P);
                if (n->kwvals.n) memcpy(nn, n->kwnames, (size_t)n->kwvals.n * sizeof *nn);
                n->kwnames = nn;
            }
            int kc2 = kcap;
            AT_TRY(nodes_push(P, &n->kwvals, v, &kc2));
            kcap = kc2;
            n->kwnames[n->kwvals.n - 1] = dupname(P, k->s, k->len);
            if (!n->kwnames[n->kwvals.n - 1]) return oom(P);
        } else {
            if (n->kwvals.n) return pfail(P, cur(P), "invalid syntax for function call expression");
            at_jx_node *v = NULL;
            AT_TRY(parse_expr(P, 1, &v));
            AT_TRY(nodes_push(P, &n->body, v, &cap));
        }
        require_comma = 1;
    }
    return expect_op(P, JO_RPAREN, ")");
}

/* A call of callee; current token is '('. */
static at_status parse_call(parser *P, at_jx_node *callee, at_jx_node **out)
{
    at_jx_node *c = NULL;
    AT_TRY(new_node(P, JN_CALL, cur(P), &c));
    c->a = callee;
    AT_TRY(parse_call_args(P, c));
    *out = c;
    return AT_OK;
}

/* name(.name)* for filters and tests */
static at_status parse_dotted_name(parser *P, const char **name)
{
    at_jx_tok *t = cur(P);
    if (t->type != JT_NAME) {
        char b[80];
        return pfail(P, t, "expected a name, got '%s'", describe(t, b, sizeof b));
    }
    size_t len = t->len;
    const char *start = t->s;
    adv(P);
    char buf[256];
    size_t bl = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, start, bl);
    while (is_op(cur(P), JO_DOT)) {
        adv(P);
        at_jx_tok *q = cur(P);
        if (q->type != JT_NAME) return pfail(P, q, "expected a name after '.'");
        if (bl + 1 + q->len < sizeof buf) {
            buf[bl++] = '.';
            memcpy(buf + bl, q->s, q->len);
            bl += q->len;
        }
        adv(P);
    }
    *name = dupname(P, buf, bl);
    return *name ? AT_OK : oom(P);
}

static at_status parse_filter(parser *P, at_jx_node *operand, int start_inline, at_jx_node **out)
{
    at_jx_node *node = operand;
    while (is_op(cur(P), JO_PIPE) || start_inline) {
        if (!start_inline) adv(P);
        at_jx_tok *t = cur(P);
        at_jx_node *f = NULL;
        AT_TRY(new_node(P, JN_FILTER, t, &f));
        AT_TRY(parse_dotted_name(P, &f->name));
        if (!at_jx_filter_exists(f->name)) return pfail(P, t, "no filter named '%s'", f->name);
        if (is_op(cur(P), JO_LPAREN)) AT_TRY(parse_call_args(P, f));
        f->a = node;
        node = f;
        start_inline = 0;
    }
    *out = node;
    return AT_OK;
}

static at_status parse_test(parser *P, at_jx_node *operand, at_jx_node **out)
{
    at_jx_tok *is_tok = cur(P);
    adv(P); /* "is" */
    int negated = 0;
    if (is_name(cur(P), "not")) {
        adv(P);
        negated = 1;
    }
    at_jx_tok *t = cur(P);
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_TEST, is_tok, &n));
    AT_TRY(parse_dotted_name(P, &n->name));
    if (!at_jx_test_exists(n->name)) return pfail(P, t, "no test named '%s'", n->name);
    n->a = operand;
    at_jx_tok *c = cur(P);
    if (is_op(c, JO_LPAREN)) {
        AT_TRY(parse_call_args(P, n));
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT || c->type == JT_FLOAT ||
                is_op(c, JO_LBRACKET) || is_op(c, JO_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return pfail(P, c, "You cannot chain multiple tests with is");
        at_jx_node *arg = NULL;
        AT_TRY(parse_primary(P, &arg));
        AT_TRY(parse_postfix(P, arg, &arg));
        int cap = 0;
        AT_TRY(nodes_push(P, &n->body, arg, &cap));
    }
    if (negated) {
        at_jx_node *nt = NULL;
        AT_TRY(new_node(P, JN_NOT, is_tok, &nt));
        nt->a = n;
        n = nt;
    }
    *out = n;
    return AT_OK;
}

static at_status parse_filter_expr(parser *P, at_jx_node *n, at_jx_node **out)
{
    for (;;) {
        if (is_op(cur(P), JO_PIPE)) {
            AT_TRY(parse_filter(P, n, 0, &n));
        } else if (is_name(cur(P), "is")) {
            AT_TRY(parse_test(P, n, &n));
        } else if (is_op(cur(P), JO_LPAREN)) {
            AT_TRY(parse_call(P, n, &n));
        } else {
            break;
        }
    }
    *out = n;
    return AT_OK;
}

static at_status parse_subscribed(parser *P, at_jx_node **out)
{
    at_jx_tok *start = cur(P);
    at_jx_node *parts[3] = {NULL, NULL, NULL};
    if (is_op(cur(P), JO_COLON)) {
        adv(P);
    } else {
        at_jx_node *e = NULL;
        AT_TRY(parse_expr(P, 1, &e));
        if (!is_op(cur(P), JO_COLON)) {
            *out = e;
            return AT_OK;
        }
        adv(P);
        parts[0] = e;
    }
    if (!is_op(cur(P), JO_COLON) && !is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA))
        AT_TRY(parse_expr(P, 1, &parts[1]));
    if (is_op(cur(P), JO_COLON)) {
        adv(P);
        if (!is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA)) AT_TRY(parse_expr(P, 1, &parts[2]));
    }
    at_jx_node *s = NULL;
    AT_TRY(new_node(P, JN_SLICE, start, &s));
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    *out = s;
    return AT_OK;
}

static at_status parse_subscript(parser *P, at_jx_node *n, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    if (t->op == JO_DOT) {
        at_jx_tok *a = cur(P);
        adv(P);
        if (a->type == JT_NAME) {
            at_jx_node *g = NULL;
            AT_TRY(new_node(P, JN_GETATTR, t, &g));
            g->a = n;
            g->name = dupname(P, a->s, a->len);
            if (!g->name) return oom(P);
            g->name_len = a->len;
            *out = g;
            return AT_OK;
        }
        if (a->type != JT_INT) return pfail(P, a, "expected name or number");
        at_jx_node *g = NULL, *k = NULL;
        AT_TRY(new_node(P, JN_GETITEM, t, &g));
        AT_TRY(new_node(P, JN_CONST, a, &k));
        k->val = at_jx_int(a->ival);
        g->a = n;
        g->b = k;
        *out = g;
        return AT_OK;
    }
    /* '[' */
    at_jx_nodes args = {0};
    int cap = 0;
    while (!is_op(cur(P), JO_RBRACKET)) {
        if (args.n) AT_TRY(expect_op(P, JO_COMMA, ","));
        at_jx_node *e = NULL;
        AT_TRY(parse_subscribed(P, &e));
        AT_TRY(nodes_push(P, &args, e, &cap));
    }
    AT_TRY(expect_op(P, JO_RBRACKET, "]"));
    at_jx_node *g = NULL;
    AT_TRY(new_node(P, JN_GETITEM, t, &g));
    g->a = n;
    if (args.n == 1) {
        g->b = args.v[0];
    } else {
        at_jx_node *tup = NULL;
        AT_TRY(new_node(P, JN_TUPLE, t, &tup));
        tup->body = args;
        g->b = tup;
    }
    *out = g;
    return AT_OK;
}

static at_status parse_postfix(parser *P, at_jx_node *n, at_jx_node **out)
{
    for (;;) {
        if (is_op(cur(P), JO_DOT) || is_op(cur(P), JO_LBRACKET)) {
            AT_TRY(parse_subscript(P, n, &n));
        } else if (is_op(cur(P), JO_LPAREN)) {
            AT_TRY(parse_call(P, n, &n));
        } else {
            break;
        }
    }
    *out = n;
    return AT_OK;
}

static at_status parse_primary(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    at_jx_node *n = NULL;
    AT_TRY(enter(P));
    if (t->type == JT_NAME) {
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            AT_TRY(new_node(P, JN_CONST, t, &n));
            n->val = at_jx_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            AT_TRY(new_node(P, JN_CONST, t, &n));
            n->val = at_jx_none();
        } else {
            AT_TRY(new_node(P, JN_NAME, t, &n));
            n->name = dupname(P, t->s, t->len);
            if (!n->name) return oom(P);
            n->name_len = t->len;
        }
        adv(P);
    } else if (t->type == JT_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0, j = P->i;
        while (j < P->n && P->t[j].type == JT_STRING) total += P->t[j++].len;
        at_jx_str *s = at_jx_alloc(P->ar, sizeof *s + total + 1);
        if (!s) return oom(P);
        size_t o = 0;
        while (cur(P)->type == JT_STRING) {
            memcpy(s->s + o, cur(P)->s, cur(P)->len);
            o += cur(P)->len;
            adv(P);
        }
        s->len = total;
        AT_TRY(new_node(P, JN_CONST, t, &n));
        n->val.type = JX_STR;
        n->val.u.s = s;
    } else if (t->type == JT_INT || t->type == JT_FLOAT) {
        AT_TRY(new_node(P, JN_CONST, t, &n));
        n->val = t->type == JT_INT ? at_jx_int(t->ival) : at_jx_float(t->fval);
        adv(P);
    } else if (is_op(t, JO_LPAREN)) {
        adv(P);
        AT_TRY(parse_tuple(P, 0, 1, NULL, 1, &n));
        AT_TRY(expect_op(P, JO_RPAREN, ")"));
    } else if (is_op(t, JO_LBRACKET)) {
        adv(P);
        AT_TRY(new_node(P, JN_LIST, t, &n));
        int cap = 0;
        while (!is_op(cur(P), JO_RBRACKET)) {
            if (n->body.n) AT_TRY(expect_op(P, JO_COMMA, ","));
            if (is_op(cur(P), JO_RBRACKET)) break;
            at_jx_node *e = NULL;
            AT_TRY(parse_expr(P, 1, &e));
            AT_TRY(nodes_push(P, &n->body, e, &cap));
        }
        AT_TRY(expect_op(P, JO_RBRACKET, "]"));
    } else if (is_op(t, JO_LBRACE)) {
        adv(P);
        AT_TRY(new_node(P, JN_DICT, t, &n));
        int kc = 0, vc = 0;
        while (!is_op(cur(P), JO_RBRACE)) {
            if (n->body.n) AT_TRY(expect_op(P, JO_COMMA, ","));
            if (is_op(cur(P), JO_RBRACE)) break;
            at_jx_node *k = NULL, *v = NULL;
            AT_TRY(parse_expr(P, 1, &k));
            AT_TRY(expect_op(P, JO_COLON, ":"));
            AT_TRY(parse_expr(P, 1, &v));
            AT_TRY(nodes_push(P, &n->body, k, &kc));
            AT_TRY(nodes_push(P, &n->orelse, v, &vc));
        }
        AT_TRY(expect_op(P, JO_RBRACE, "}"));
    } else {
        char b[80];
        return pfail(P, t, "unexpected '%s'", describe(t, b, sizeof b));
    }
    P->depth--;
    *out = n;
    return AT_OK;
}

static at_status parse_unary(parser *P, int with_filter, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    at_jx_node *n = NULL;
    AT_TRY(enter(P));
    if (is_op(t, JO_SUB) || is_op(t, JO_ADD)) {
        adv(P);
        AT_TRY(new_node(P, is_op(t, JO_SUB) ? JN_NEG : JN_POS, t, &n));
        AT_TRY(parse_unary(P, 0, &n->a));
    } else {
        AT_TRY(parse_primary(P, &n));
    }
    AT_TRY(parse_postfix(P, n, &n));
    if (with_filter) AT_TRY(parse_filter_expr(P, n, &n));
    P->depth--;
    *out = n;
    return AT_OK;
}

static at_status binop(parser *P, const at_jx_tok *t, int op, at_jx_node *a, at_jx_node *b, at_jx_node **out)
{
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_BINOP, t, &n));
    n->op = op;
    n->a = a;
    n->b = b;
    *out = n;
    return AT_OK;
}

static at_status parse_pow(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_unary(P, 1, &l));
    while (is_op(cur(P), JO_POW)) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_unary(P, 1, &r));
        AT_TRY(binop(P, t, JO_POW, l, r, &l));
    }
    *out = l;
    return AT_OK;
}

static at_status parse_math2(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_pow(P, &l));
    while (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_DIV) || is_op(cur(P), JO_FLOORDIV) || is_op(cur(P), JO_MOD)) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_pow(P, &r));
        AT_TRY(binop(P, t, t->op, l, r, &l));
    }
    *out = l;
    return AT_OK;
}

static at_status parse_concat(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_math2(P, &l));
    while (is_op(cur(P), JO_TILDE)) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_math2(P, &r));
        AT_TRY(binop(P, t, JO_TILDE, l, r, &l));
    }
    *out = l;
    return AT_OK;
}

static at_status parse_math1(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_concat(P, &l));
    while (is_op(cur(P), JO_ADD) || is_op(cur(P), JO_SUB)) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_concat(P, &r));
        AT_TRY(binop(P, t, t->op, l, r, &l));
    }
    *out = l;
    return AT_OK;
}

static at_status parse_compare(parser *P, at_jx_node **out)
{
    at_jx_tok *start = cur(P);
    at_jx_node *first = NULL;
    AT_TRY(parse_math1(P, &first));
    at_jx_node *n = NULL;
    int cap = 0;
    uint8_t ops[64];
    for (;;) {
        at_jx_tok *t = cur(P);
        int op = 0;
        if (t->type == JT_OP && (t->op == JO_EQ || t->op == JO_NE || t->op == JO_LT || t->op == JO_LTEQ ||
                                 t->op == JO_GT || t->op == JO_GTEQ)) {
            op = t->op;
            adv(P);
        } else if (is_name(t, "in")) {
            op = JO_IN;
            adv(P);
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            op = JO_NOTIN;
            adv(P);
            adv(P);
        } else {
            break;
        }
        if (!n) {
            AT_TRY(new_node(P, JN_COMPARE, start, &n));
            n->a = first;
        }
        if (n->body.n >= 64) return pfail(P, t, "too many chained comparisons");
        at_jx_node *r = NULL;
        AT_TRY(parse_math1(P, &r));
        ops[n->body.n] = (uint8_t)op;
        AT_TRY(nodes_push(P, &n->body, r, &cap));
    }
    if (!n) {
        *out = first;
        return AT_OK;
    }
    n->ops = at_jx_alloc(P->ar, (size_t)n->body.n);
    if (!n->ops) return oom(P);
    memcpy(n->ops, ops, (size_t)n->body.n);
    *out = n;
    return AT_OK;
}

static at_status parse_not(parser *P, at_jx_node **out)
{
    if (is_name(cur(P), "not")) {
        at_jx_tok *t = cur(P);
        adv(P);
        at_jx_node *n = NULL;
        AT_TRY(enter(P));
        AT_TRY(new_node(P, JN_NOT, t, &n));
        AT_TRY(parse_not(P, &n->a));
        P->depth--;
        *out = n;
        return AT_OK;
    }
    return parse_compare(P, out);
}

static at_status parse_and(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_not(P, &l));
    while (is_name(cur(P), "and")) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_not(P, &r));
        at_jx_node *n = NULL;
        AT_TRY(new_node(P, JN_AND, t, &n));
        n->a = l;
        n->b = r;
        l = n;
    }
    *out = l;
    return AT_OK;
}

static at_status parse_or(parser *P, at_jx_node **out)
{
    at_jx_node *l = NULL, *r = NULL;
    AT_TRY(parse_and(P, &l));
    while (is_name(cur(P), "or")) {
        at_jx_tok *t = cur(P);
        adv(P);
        AT_TRY(parse_and(P, &r));
        at_jx_node *n = NULL;
        AT_TRY(new_node(P, JN_OR, t, &n));
        n->a = l;
        n->b = r;
        l = n;
    }
    *out = l;
    return AT_OK;
}

static at_status parse_expr(parser *P, int with_condexpr, at_jx_node **out)
{
    AT_TRY(enter(P));
    at_jx_node *e = NULL;
    AT_TRY(parse_or(P, &e));
    if (with_condexpr) {
        while (is_name(cur(P), "if")) {
            at_jx_tok *t = cur(P);
            adv(P);
            at_jx_node *n = NULL;
            AT_TRY(new_node(P, JN_CONDEXPR, t, &n));
            n->b = e;
            AT_TRY(parse_or(P, &n->a));
            if (is_name(cur(P), "else")) {
                adv(P);
                AT_TRY(parse_expr(P, 1, &n->c));
            }
            e = n;
        }
    }
    P->depth--;
    *out = e;
    return AT_OK;
}

static int is_tuple_end(parser *P, const char *extra_end)
{
    at_jx_tok *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, JO_RPAREN)) return 1;
    return extra_end && is_name(t, extra_end);
}

static at_status parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren,
                             at_jx_node **out)
{
    at_jx_tok *start = cur(P);
    at_jx_nodes items = {0};
    int cap = 0, is_tuple = 0;
    for (;;) {
        if (items.n) AT_TRY(expect_op(P, JO_COMMA, ","));
        if (is_tuple_end(P, extra_end)) break;
        at_jx_node *e = NULL;
        if (simplified)
            AT_TRY(parse_primary(P, &e));
        else
            AT_TRY(parse_expr(P, with_condexpr, &e));
        AT_TRY(nodes_push(P, &items, e, &cap));
        if (is_op(cur(P), JO_COMMA))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) {
            *out = items.v[0];
            return AT_OK;
        }
        if (!explicit_paren) {
            char b[80];
            return pfail(P, cur(P), "Expected an expression, got '%s'", describe(cur(P), b, sizeof b));
        }
    }
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_TUPLE, start, &n));
    n->body = items;
    *out = n;
    return AT_OK;
}

/* Assignment targets: a name, a tuple of names, or ns.attr (with_ns). */
static at_status parse_assign_target(parser *P, int with_ns, int name_only, const char *extra_end, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    if (with_ns && t->type == JT_NAME && is_op(look(P), JO_DOT)) {
        at_jx_node *n = NULL;
        AT_TRY(new_node(P, JN_NSREF, t, &n));
        n->name = dupname(P, t->s, t->len);
        n->name_len = t->len;
        adv(P);
        adv(P);
        at_jx_tok *a = cur(P);
        if (a->type != JT_NAME) return pfail(P, a, "expected a name after '.'");
        n->attr = dupname(P, a->s, a->len);
        if (!n->name || !n->attr) return oom(P);
        adv(P);
        *out = n;
        return AT_OK;
    }
    if (name_only) {
        if (t->type != JT_NAME) return pfail(P, t, "expected a name");
        at_jx_node *n = NULL;
        AT_TRY(new_node(P, JN_NAME, t, &n));
        n->name = dupname(P, t->s, t->len);
        if (!n->name) return oom(P);
        n->name_len = t->len;
        adv(P);
        *out = n;
        return AT_OK;
    }
    at_jx_node *n = NULL;
    AT_TRY(parse_tuple(P, 1, 1, extra_end, 0, &n));
    if (n->kind == JN_NAME) {
        *out = n;
        return AT_OK;
    }
    if (n->kind == JN_TUPLE) {
        for (int i = 0; i < n->body.n; i++)
            if (n->body.v[i]->kind != JN_NAME) return pfail(P, t, "can't assign to this expression");
        *out = n;
        return AT_OK;
    }
    return pfail(P, t, "can't assign to this expression");
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};

/* Parses "%}" body "{% <one of end_names>"; leaves the end name current. */
static at_status parse_statements(parser *P, const char *const *end_names, at_jx_nodes *body)
{
    if (is_op(cur(P), JO_COLON)) adv(P);
    AT_TRY(expect_type(P, JT_BLOCK_END, "end of statement block"));
    AT_TRY(subparse(P, end_names, body));
    if (cur(P)->type == JT_EOF) {
        return pfail(P, cur(P), "unexpected end of template: expected '%s'", end_names[0]);
    }
    return AT_OK;
}

/* After parse_statements: consume the end name, expecting one of names. */
static void drop_needle(parser *P) { adv(P); }

static at_status parse_for(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_FOR, t, &n));
    AT_TRY(parse_assign_target(P, 0, 0, "in", &n->a));
    if (!is_name(cur(P), "in")) return pfail(P, cur(P), "expected 'in'");
    adv(P);
    AT_TRY(parse_tuple(P, 0, 0, "recursive", 0, &n->b));
    if (is_name(cur(P), "if")) {
        adv(P);
        AT_TRY(parse_expr(P, 1, &n->c));
    }
    if (is_name(cur(P), "recursive")) {
        adv(P);
        n->flag = 1;
    }
    AT_TRY(parse_statements(P, END_FOR, &n->body));
    if (is_name(cur(P), "else")) {
        adv(P);
        AT_TRY(parse_statements(P, END_FOR2, &n->orelse));
    }
    drop_needle(P);
    *out = n;
    return AT_OK;
}

static at_status parse_if(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    at_jx_node *top = NULL, *node = NULL;
    AT_TRY(new_node(P, JN_IF, t, &top));
    node = top;
    for (;;) {
        AT_TRY(parse_tuple(P, 0, 0, NULL, 0, &node->a));
        AT_TRY(parse_statements(P, END_IF, &node->body));
        at_jx_tok *e = cur(P);
        if (is_name(e, "elif")) {
            adv(P);
            at_jx_node *next = NULL;
            AT_TRY(new_node(P, JN_IF, e, &next));
            int cap = 0;
            AT_TRY(nodes_push(P, &node->orelse, next, &cap));
            node = next;
            continue;
        }
        if (is_name(e, "else")) {
            adv(P);
            AT_TRY(parse_statements(P, END_IF2, &node->orelse));
        }
        drop_needle(P);
        break;
    }
    *out = top;
    return AT_OK;
}

static at_status parse_set(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    at_jx_node *target = NULL;
    AT_TRY(parse_assign_target(P, 1, 0, NULL, &target));
    at_jx_node *n = NULL;
    if (is_op(cur(P), JO_ASSIGN)) {
        adv(P);
        AT_TRY(new_node(P, JN_SET, t, &n));
        n->a = target;
        AT_TRY(parse_tuple(P, 0, 1, NULL, 0, &n->b));
    } else {
        AT_TRY(new_node(P, JN_SET_BLOCK, t, &n));
        n->a = target;
        AT_TRY(parse_filter(P, NULL, 0, &n->c));
        AT_TRY(parse_statements(P, END_SET, &n->body));
        drop_needle(P);
    }
    *out = n;
    return AT_OK;
}

static at_status parse_macro(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_MACRO, t, &n));
    at_jx_node *nm = NULL;
    AT_TRY(parse_assign_target(P, 0, 1, NULL, &nm));
    n->name = nm->name;
    n->name_len = nm->name_len;
    AT_TRY(expect_op(P, JO_LPAREN, "("));
    int cap = 0, dcap = 0;
    while (!is_op(cur(P), JO_RPAREN)) {
        if (n->body.n) AT_TRY(expect_op(P, JO_COMMA, ","));
        at_jx_node *arg = NULL;
        AT_TRY(parse_assign_target(P, 0, 1, NULL, &arg));
        if (is_op(cur(P), JO_ASSIGN)) {
            adv(P);
            at_jx_node *d = NULL;
            AT_TRY(parse_expr(P, 1, &d));
            AT_TRY(nodes_push(P, &n->orelse, d, &dcap));
        } else if (n->orelse.n) {
            return pfail(P, cur(P), "non-default argument follows default argument");
        }
        AT_TRY(nodes_push(P, &n->body, arg, &cap));
    }
    adv(P);
    /* params in n->kwvals (names), body in n->body: move params aside */
    n->kwvals = n->body;
    n->body = (at_jx_nodes){0};
    AT_TRY(parse_statements(P, END_MACRO, &n->body));
    drop_needle(P);
    *out = n;
    return AT_OK;
}

static at_status parse_with(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    adv(P);
    at_jx_node *n = NULL;
    AT_TRY(new_node(P, JN_WITH, t, &n));
    int tc = 0, vc = 0;
    at_jx_nodes targets = {0};
    while (cur(P)->type != JT_BLOCK_END) {
        if (targets.n) AT_TRY(expect_op(P, JO_COMMA, ","));
        at_jx_node *tg = NULL, *v = NULL;
        AT_TRY(parse_assign_target(P, 0, 0, NULL, &tg));
        AT_TRY(expect_op(P, JO_ASSIGN, "="));
        AT_TRY(parse_expr(P, 1, &v));
        AT_TRY(nodes_push(P, &targets, tg, &tc));
        AT_TRY(nodes_push(P, &n->orelse, v, &vc));
    }
    n->kwvals = targets;
    AT_TRY(parse_statements(P, END_WITH, &n->body));
    drop_needle(P);
    *out = n;
    return AT_OK;
}

static at_status parse_statement(parser *P, at_jx_node **out)
{
    at_jx_tok *t = cur(P);
    if (t->type != JT_NAME) return pfail(P, t, "tag name expected");
    AT_TRY(enter(P));
    at_status st;
    if (is_name(t, "for")) {
        st = parse_for(P, out);
    } else if (is_name(t, "if")) {
        st = parse_if(P, out);
    } else if (is_name(t, "set")) {
        st = parse_set(P, out);
    } else if (is_name(t, "macro")) {
        st = parse_macro(P, out);
    } else if (is_name(t, "with")) {
        st = parse_with(P, out);
    } else if (is_name(t, "print")) {
        adv(P);
        st = new_node(P, JN_OUTPUT, t, out);
        int cap = 0;
        while (st == AT_OK && cur(P)->type != JT_BLOCK_END) {
            if ((*out)->body.n) {
                st = expect_op(P, JO_COMMA, ",");
                if (st != AT_OK) break;
            }
            at_jx_node *e = NULL;
            st = parse_expr(P, 1, &e);
            if (st == AT_OK) st = nodes_push(P, &(*out)->body, e, &cap);
        }
    } else if (is_name(t, "filter")) {
        adv(P);
        st = new_node(P, JN_FILTER_BLOCK, t, out);
        if (st == AT_OK) st = parse_filter(P, NULL, 1, &(*out)->c);
        if (st == AT_OK) st = parse_statements(P, END_FILTER, &(*out)->body);
        if (st == AT_OK) drop_needle(P);
    } else if (is_name(t, "generation")) {
        adv(P);
        P->has_gen = 1;
        st = new_node(P, JN_GENERATION, t, out);
        if (st == AT_OK) st = parse_statements(P, END_GEN, &(*out)->body);
        if (st == AT_OK) drop_needle(P);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        adv(P);
        st = new_node(P, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, t, out);
    } else if (is_name(t, "extends") || is_name(t, "include") || is_name(t, "import") || is_name(t, "from") ||
               is_name(t, "block") || is_name(t, "call") || is_name(t, "autoescape")) {
        st = pfail(P, t, "the '%.*s' tag is not supported in chat templates", (int)t->len, t->s);
    } else {
        st = pfail(P, t, "Encountered unknown tag '%.*s'.", (int)(t->len > 64 ? 64 : t->len), t->s);
    }
    P->depth--;
    return st;
}

static at_status subparse(parser *P, const char *const *end_names, at_jx_nodes *body)
{
    int cap = 0;
    at_jx_node *out = NULL; /* current OUTPUT node collecting data and {{ }} */
    int ocap = 0;
    for (;;) {
        at_jx_tok *t = cur(P);
        if (t->type == JT_EOF) return AT_OK;
        if (t->type == JT_DATA || t->type == JT_VAR_BEGIN) {
            if (!out) {
                AT_TRY(new_node(P, JN_OUTPUT, t, &out));
                AT_TRY(nodes_push(P, body, out, &cap));
                ocap = 0;
            }
            at_jx_node *e = NULL;
            if (t->type == JT_DATA) {
                AT_TRY(new_node(P, JN_DATA, t, &e));
                e->name = t->s;
                e->name_len = t->len;
                adv(P);
            } else {
                adv(P);
                AT_TRY(parse_tuple(P, 0, 1, NULL, 0, &e));
                AT_TRY(expect_type(P, JT_VAR_END, "end of print statement"));
            }
            AT_TRY(nodes_push(P, &out->body, e, &ocap));
            continue;
        }
        if (t->type == JT_BLOCK_BEGIN) {
            out = NULL;
            adv(P);
            if (end_names) {
                for (int k = 0; end_names[k]; k++)
                    if (is_name(cur(P), end_names[k])) return AT_OK;
            }
            at_jx_node *s = NULL;
            AT_TRY(parse_statement(P, &s));
            AT_TRY(nodes_push(P, body, s, &cap));
            AT_TRY(expect_type(P, JT_BLOCK_END, "end of statement block"));
            continue;
        }
        char b[80];
        return pfail(P, t, "unexpected '%s'", describe(t, b, sizeof b));
    }
}

at_status at_jinja_parse(const char *src, size_t len, const char *name, at_jinja_template **out)
{
    *out = NULL;
    if (!name) name = "<template>";
    at_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return at_error(AT_ERR_NOMEM, "%s: out of memory", name);
    t->name = strdup(name);
    if (!t->name) {
        free(t);
        return at_error(AT_ERR_NOMEM, "%s: out of memory", name);
    }
    /* the tree of a template is bounded by its length; 64 KiB per source KiB
     * is far more than any real template needs */
    t->ar.limit = 64 * 1024 * 1024 + len * 64;
    parser P = {0};
    P.name = t->name;
    P.ar = &t->ar;
    at_status st = at_jx_lex(src, len, t->name, &t->ar, &P.t, &P.n);
    if (st == AT_OK) st = subparse(&P, NULL, &t->body);
    if (st == AT_OK && cur(&P)->type != JT_EOF) {
        /* an end tag (endfor, else, ...) without its opening tag */
        st = pfail(&P, cur(&P), "Encountered unknown tag '%.*s'.", (int)cur(&P)->len, cur(&P)->s);
    }
    if (st != AT_OK) {
        at_jinja_free(t);
        return st;
    }
    t->has_generation = P.has_gen;
    *out = t;
    return AT_OK;
}

void at_jinja_free(at_jinja_template *t)
{
    if (!t) return;
    at_jx_arena_free(&t->ar);
    free(t->name);
    free(t);
}

int at_jinja_has_generation(const at_jinja_template *t) { return t && t->has_generation; }
