/* A Jinja2 interpreter for chat templates.
 *
 * It renders templates the way Hugging Face transformers' apply_chat_template
 * does: Jinja2 3.x semantics with trim_blocks and lstrip_blocks on, the
 * loopcontrols extension ({% break %}, {% continue %}), transformers'
 * {% generation %} blocks, `tojson` as json.dumps(x, ensure_ascii=False,
 * indent=...), and the globals raise_exception(msg) and strftime_now(fmt).
 * Values print as Python prints them (None, True, 1.0, {'a': 1}).
 *
 * Covered: {{ }}, {% %}, {# #}, whitespace control (-/+), if/elif/else,
 * for (with else, loop filters, recursive, tuple unpacking, the loop object),
 * set (also namespace attributes and block sets), macro, with, filter blocks,
 * raw, break/continue; the usual operators, slicing, filters, tests, string and
 * dict methods (see jinja_builtins.c for the list).
 *
 * Not covered: template inheritance and includes (extends, block, include,
 * import), {% call %} blocks, autoescaping and Markup semantics, Python's
 * arbitrary-precision integers (ours are 64-bit; overflow is an error).
 *
 * Hostile templates cannot hang or exhaust memory: loops, recursion, output
 * size and value memory are bounded (at_jinja_options), and exceeding a bound
 * is an error, not a crash. */
#ifndef AT_TEXT_JINJA_H
#define AT_TEXT_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef struct at_jinja_template at_jinja_template;

/* Bounds and environment of one render. Zero fields take the defaults. */
typedef struct {
    size_t max_output;   /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;   /* bytes of interpreter values (default 512 MiB) */
    uint64_t max_steps;  /* evaluation steps: expressions + loop iterations (default 100M) */
    int max_depth;       /* nested macro calls (default 64) */
    /* strftime_now: when has_fixed_time, the time is fixed_time (seconds since
     * the epoch) shown in UTC, so renders are reproducible; otherwise the
     * current local time, as Python's datetime.now(). */
    int has_fixed_time;
    long long fixed_time;
} at_jinja_options;

/* A byte range [start, end) of rendered text. */
typedef struct {
    size_t start, end;
} at_jinja_span;

/* Parses template text src[0..len). `name` (e.g. a file name) prefixes error
 * messages, which give the line and column: "name:3:14: unexpected '}'".
 * *out is owned by the caller (at_jinja_free). */
at_status at_jinja_parse(const char *src, size_t len, const char *name, at_jinja_template **out);

void at_jinja_free(at_jinja_template *t);

/* 1 when the template has {% generation %} blocks. */
int at_jinja_has_generation(const at_jinja_template *t);

/* Renders with the members of `vars` (a cJSON object, or NULL) as the
 * template's variables. On success *out is a new NUL-terminated string
 * (caller frees with free()) of *out_len bytes (out_len may be NULL).
 * When gen_spans is not NULL, *gen_spans receives the spans of the output of
 * {% generation %} blocks (caller frees; NULL when none) and *n_gen their
 * count. Errors (undefined variables used wrongly, type errors, limits,
 * raise_exception) return AT_ERR_INVALID with a message naming the template
 * line and column; raise_exception's message reads
 * "name:LINE:COL: raise_exception: <the template's message>". */
at_status at_jinja_render(const at_jinja_template *t, const cJSON *vars, const at_jinja_options *opt,
                          char **out, size_t *out_len, at_jinja_span **gen_spans, size_t *n_gen);

#endif
