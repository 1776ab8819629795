/* Internals shared by the files of the Jinja interpreter (jinja_*.c):
 * tokens, syntax tree, values, the render context. Not a public API. */
#ifndef AT_TEXT_JINJA_INTERNAL_H
#define AT_TEXT_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "text/jinja.h"

/* ---- arena: every value and tree node lives in one, freed at once ---- */

typedef struct at_jx_block at_jx_block;
typedef struct {
    at_jx_block *head;
    size_t total; /* bytes obtained from malloc so far */
    size_t limit; /* 0 = unlimited */
} at_jx_arena;

/* Zeroed memory, or NULL when the limit is reached or malloc fails. */
void *at_jx_alloc(at_jx_arena *a, size_t n);
void at_jx_arena_free(at_jx_arena *a);

/* ---- values (Python objects as Jinja sees them) ---- */

enum {
    JX_UNDEF, JX_NONE, JX_BOOL, JX_INT, JX_FLOAT, JX_STR, JX_LIST, JX_DICT, JX_FUNC, JX_LOOP
};

typedef struct {
    size_t len;
    char s[]; /* NUL-terminated UTF-8 */
} at_jx_str;

typedef struct at_jx_list at_jx_list;
typedef struct at_jx_dict at_jx_dict;
typedef struct at_jx_func at_jx_func;
typedef struct at_jx_loop at_jx_loop;

typedef struct {
    int type;
    union {
        int b;
        int64_t i;
        double f;
        at_jx_str *s;
        at_jx_list *l;
        at_jx_dict *d;
        at_jx_func *fn;
        at_jx_loop *loop;
        const char *undef_name; /* JX_UNDEF: the missing name, or NULL */
    } u;
} at_jx_value;

struct at_jx_list {
    size_t n, cap;
    at_jx_value *v;
    int is_tuple;
};

enum { JX_DICT_PLAIN, JX_DICT_NAMESPACE };
struct at_jx_dict {
    size_t n, cap;
    at_jx_value *keys, *vals;
    int kind;
};

/* ---- tokens ---- */

enum {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP
};
enum {
    JO_ADD = 1, JO_SUB, JO_DIV, JO_FLOORDIV, JO_MUL, JO_MOD, JO_POW, JO_TILDE,
    JO_LBRACKET, JO_RBRACKET, JO_LPAREN, JO_RPAREN, JO_LBRACE, JO_RBRACE,
    JO_EQ, JO_NE, JO_GT, JO_GTEQ, JO_LT, JO_LTEQ, JO_ASSIGN, JO_DOT, JO_COLON,
    JO_PIPE, JO_COMMA, JO_SEMICOLON,
    /* compare-only pseudo operators */
    JO_IN, JO_NOTIN
};

typedef struct {
    int type, op;
    int line, col;
    const char *s; /* DATA, NAME, STRING (decoded): in the arena */
    size_t len;
    int64_t ival;
    double fval;
} at_jx_tok;

/* Tokenizes src (newlines normalized, one trailing newline dropped, as
 * Jinja2 does) into *toks (in the arena), ending with JT_EOF. */
at_status at_jx_lex(const char *src, size_t len, const char *name, at_jx_arena *ar,
                    at_jx_tok **toks, size_t *ntoks);

/* ---- syntax tree ---- */

enum {
    /* statements */
    JN_DATA, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO, JN_WITH,
    JN_FILTER_BLOCK, JN_GENERATION, JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_CONST, JN_NAME, JN_NSREF, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL,
    JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BINOP, JN_AND, JN_OR,
    JN_COMPARE, JN_CONDEXPR, JN_LIST, JN_TUPLE, JN_DICT
};

typedef struct at_jx_node at_jx_node;
typedef struct {
    at_jx_node **v;
    int n;
} at_jx_nodes;

struct at_jx_node {
    int kind, op, flag;
    int line, col;
    const char *name;  /* DATA text, NAME, attribute, filter/test/macro name, NSREF var */
    size_t name_len;
    const char *attr;  /* NSREF attribute */
    at_jx_value val;   /* CONST */
    at_jx_node *a, *b, *c;
    at_jx_nodes body;   /* statement bodies; OUTPUT/LIST/TUPLE items; call args; DICT keys */
    at_jx_nodes orelse; /* else bodies; DICT values; macro defaults */
    at_jx_nodes kwvals; /* keyword argument values */
    const char **kwnames;
    uint8_t *ops;       /* COMPARE operators, one per operand in body */
};

struct at_jinja_template {
    at_jx_arena ar;
    char *name;
    at_jx_nodes body;
    int has_generation;
};

/* ---- render context ---- */

typedef struct {
    char *p;
    size_t len, cap;
} at_jx_buf;

typedef struct at_jx_scope at_jx_scope;
struct at_jx_scope {
    at_jx_scope *parent;
    size_t n, cap;
    const char **names;
    at_jx_value *vals;
};

typedef struct {
    const at_jinja_template *t;
    at_jx_arena ar;
    at_jinja_options opt;
    at_jx_buf *out;
    at_jx_buf *root_out;
    uint64_t steps;
    int depth;
    int ctl; /* 1 after break, 2 after continue: unwinds to the loop */
    at_jx_scope *root;
    at_jinja_span *gen;
    size_t n_gen, cap_gen;
} at_jx_ctx;

/* Records "name:line:col: message" and returns AT_ERR_INVALID. */
at_status at_jx_fail(at_jx_ctx *c, const at_jx_node *site, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The out-of-memory error (arena limit reached). */
at_status at_jx_oom(at_jx_ctx *c, const at_jx_node *site);

/* Buffers (memory in the context's arena; the output limit applies). */
at_status at_jx_put(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, const char *s, size_t n);
at_status at_jx_putc(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, char ch);

/* Value construction. */
at_jx_value at_jx_undef(const char *name);
at_jx_value at_jx_none(void);
at_jx_value at_jx_bool(int b);
at_jx_value at_jx_int(int64_t i);
at_jx_value at_jx_float(double f);
at_status at_jx_str_new(at_jx_ctx *c, const at_jx_node *site, const char *s, size_t n, at_jx_value *out);
at_status at_jx_str_buf(at_jx_ctx *c, const at_jx_node *site, const at_jx_buf *b, at_jx_value *out);
at_status at_jx_list_new(at_jx_ctx *c, const at_jx_node *site, size_t cap, at_jx_value *out);
at_status at_jx_list_push(at_jx_ctx *c, const at_jx_node *site, at_jx_list *l, at_jx_value v);
at_status at_jx_dict_new(at_jx_ctx *c, const at_jx_node *site, int kind, at_jx_value *out);
at_status at_jx_dict_set(at_jx_ctx *c, const at_jx_node *site, at_jx_dict *d, at_jx_value k, at_jx_value v);
/* NULL when absent. */
at_jx_value *at_jx_dict_get(const at_jx_dict *d, at_jx_value k);
at_jx_value *at_jx_dict_get_cstr(const at_jx_dict *d, const char *k, size_t n);

/* Python semantics. */
int at_jx_truthy(at_jx_value v);
int at_jx_equal(at_jx_value a, at_jx_value b);
int at_jx_is_number(at_jx_value v); /* int, float or bool */
double at_jx_as_double(at_jx_value v);
/* *cmp < 0, 0, > 0 for a < b, ==, >; a TypeError for unorderable types. */
at_status at_jx_compare(at_jx_ctx *c, const at_jx_node *site, at_jx_value a, at_jx_value b, int *cmp);
const char *at_jx_type_name(at_jx_value v);

/* str(v) and repr(v) appended to b. */
at_status at_jx_write_str(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v);
at_status at_jx_write_repr(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v);
/* str(v) as a string value (strings are returned as they are). */
at_status at_jx_to_str(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, at_jx_value *out);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators, sort_keys). */
at_status at_jx_write_json(at_jx_ctx *c, const at_jx_node *site, at_jx_buf *b, at_jx_value v, int indent,
                           const char *item_sep, const char *key_sep, int sort_keys, int depth);
/* Python float repr (shortest round-trip). buf needs 32 bytes. */
void at_jx_format_float(double x, char *buf);

at_status at_jx_from_cjson(at_jx_ctx *c, const cJSON *j, at_jx_value *out, int depth);

/* UTF-8 helpers: decode one code point at s[*i] (advancing *i; invalid bytes
 * decode as themselves), count code points, whitespace as Python's isspace. */
uint32_t at_jx_utf8_next(const char *s, size_t n, size_t *i);
size_t at_jx_utf8_count(const char *s, size_t n);
int at_jx_utf8_put(uint32_t cp, char *out); /* returns bytes written (1..4) */
int at_jx_is_space(uint32_t cp);

/* Evaluation (jinja_eval.c). */
at_status at_jx_eval(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *n, at_jx_value *out);
at_status at_jx_getattr(at_jx_ctx *c, const at_jx_node *site, at_jx_value obj, const char *name, size_t len,
                        at_jx_value *out);
at_status at_jx_getitem(at_jx_ctx *c, const at_jx_node *site, at_jx_value obj, at_jx_value key, at_jx_value *out);
/* Calls fn with evaluated arguments. */
at_status at_jx_call(at_jx_ctx *c, const at_jx_node *site, at_jx_value fn, int nargs, const at_jx_value *args,
                     int nkw, const char **kwnames, const at_jx_value *kwvals, at_jx_value *out);
at_status at_jx_step(at_jx_ctx *c, const at_jx_node *site);
/* Iterates like Python's iter(): lists, tuples, dict keys, string code
 * points, undefined (empty). */
at_status at_jx_to_list(at_jx_ctx *c, const at_jx_node *site, at_jx_value v, at_jx_list **out);
/* Returns an "undefined" error for using v (an undefined value). */
at_status at_jx_undefined_error(at_jx_ctx *c, const at_jx_node *site, at_jx_value v);

/* Builtins (jinja_builtins.c). Functions and methods are values of type
 * JX_FUNC; these look them up and call them. */
enum { JX_FN_GLOBAL, JX_FN_METHOD, JX_FN_MACRO, JX_FN_LOOP };
struct at_jx_func {
    int kind;
    int id;              /* builtin or method number */
    const char *name;
    at_jx_value self;    /* METHOD: the object */
    const at_jx_node *macro;
    at_jx_scope *closure;
};

struct at_jx_loop {
    at_jx_list *items;
    size_t index0;
    int depth0;
    const at_jx_node *node; /* the for statement (recursive loops) */
    at_jx_scope *scope;     /* where the for statement runs */
    at_jx_value last_changed;
    int has_changed;
};

/* A global function value by name (range, namespace, dict, raise_exception,
 * strftime_now, cycler-free subset); 0 when there is none. */
int at_jx_global(const char *name, size_t len, at_jx_value *out, at_jx_ctx *c);
/* Bound method `name` of obj; 0 when obj has no such method. */
int at_jx_method(at_jx_ctx *c, at_jx_value obj, const char *name, size_t len, at_jx_value *out);
at_status at_jx_call_builtin(at_jx_ctx *c, const at_jx_node *site, const at_jx_func *fn, int nargs,
                             const at_jx_value *args, int nkw, const char **kwnames, const at_jx_value *kwvals,
                             at_jx_value *out);
/* Applies filter `name` to v with evaluated arguments. */
at_status at_jx_filter(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, const char *name, at_jx_value v,
                       int nargs, const at_jx_value *args, int nkw, const char **kwnames, const at_jx_value *kwvals,
                       at_jx_value *out);
at_status at_jx_test(at_jx_ctx *c, at_jx_scope *sc, const at_jx_node *site, const char *name, at_jx_value v,
                     int nargs, const at_jx_value *args, int *out);
int at_jx_filter_exists(const char *name);
int at_jx_test_exists(const char *name);

#endif
