/* Command-line options with ms-swift's names.
 *
 * A command declares its options in a table. Values come from, in rising
 * priority: the table's defaults, a config file (--config FILE.yaml|.yml|.json:
 * a mapping of option names to scalars or lists), and the command line.
 * `--name value`, `--name=value`; hyphen spellings (--lora-rank) are accepted
 * for underscore names (--lora_rank); a bool option alone means true. Every
 * value is validated against its type when parsed, so getters cannot fail. */
#ifndef AT_BASE_OPTIONS_H
#define AT_BASE_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef enum { AT_OPT_STRING, AT_OPT_INT, AT_OPT_FLOAT, AT_OPT_BOOL, AT_OPT_LIST } at_opt_type;

/* Where an option's value goes in the command's struct (at_options_store):
 * the field's C type, checked at compile time by AT_OPT_AT. */
typedef enum { AT_STORE_NONE = 0, AT_STORE_INT, AT_STORE_I64, AT_STORE_U64, AT_STORE_DOUBLE, AT_STORE_STR } at_opt_store;

/* What the program does with an option (ms-swift's vocabulary: an option
 * that tool has and that means nothing here is accepted with a note, or
 * refused with what to use instead, never an "unknown option"). */
typedef enum {
    AT_OPT_NORMAL = 0,  /* an option like any other */
    AT_OPT_IGNORED,  /* accepted (typed and range-checked); `note` says why nothing changes, printed when set */
    AT_OPT_REFUSED,  /* an error when set; `note` says what to use instead */
} at_opt_role;

/* One row of an option table: the single place an option is described.
 * --help, the parser (command line and config files), args.json
 * (at_options_to_json), the library's defaults (at_options_store_defaults)
 * and the web UI's allow-list read it. Tables write rows with designated
 * initializers (.name = ..., .range = ...): what a row leaves out is zero
 * (no alias, no range, no store, AT_OPT_NORMAL). */
typedef struct {
    const char *name;     /* underscore spelling, without dashes */
    at_opt_type type;
    const char *def;      /* default as text; NULL: unset (lists: comma-separated) */
    const char *help;
    const char *alias;    /* another accepted name (e.g. tuner_type for train_type), or NULL */
    /* Numbers: the accepted interval as shown in --help, "[lo, hi]" with "("
     * or ")" for an open end and "inf" for none, e.g. "[0, 1)", "(0, inf)".
     * NULL: any finite number; an INT option without a range must fit an
     * int. Values are parsed wide (long long / double) before the check, so
     * the message shows the value as typed. */
    const char *range;
    const char *choices;  /* strings: "a|b|c", the accepted values; NULL: any */
    at_opt_store store;   /* with offset: where at_options_store writes the value */
    size_t offset;
    at_opt_role role;
    const char *note;     /* AT_OPT_IGNORED / AT_OPT_REFUSED: the explanation */
} at_opt_spec;

/* `.store` and `.offset` of a row (designated initializers) for field F of
 * struct T, the store kind from the field's type (bools are int fields). */
#define AT_OPT_AT(T, F)                                                                                             \
    .store = _Generic(((T *)0)->F, int: AT_STORE_INT, int64_t: AT_STORE_I64, uint64_t: AT_STORE_U64,               \
                      double: AT_STORE_DOUBLE, const char *: AT_STORE_STR),                                         \
    .offset = offsetof(T, F)

typedef enum { AT_SRC_DEFAULT = 0, AT_SRC_CONFIG, AT_SRC_CLI } at_opt_source;

typedef struct at_options at_options;

/* Parses argv[1..argc) (argv[0] is the command name) against specs. Errors
 * name the option and the source (command line or config file and key), and
 * suggest the closest known name for an unknown one. *out is owned by the
 * caller (at_options_free). */
at_status at_options_parse(const at_opt_spec *specs, int nspecs, int argc, char **argv, at_options **out);
void at_options_free(at_options *o);

/* Getters by name (the underscore spelling). Asking for a name not in the
 * table is a programming error and returns the zero value. */
const char *at_opt_str(const at_options *o, const char *name);       /* NULL when unset */
long long at_opt_int(const at_options *o, const char *name);
double at_opt_float(const at_options *o, const char *name);
int at_opt_bool(const at_options *o, const char *name);
int at_opt_list_count(const at_options *o, const char *name);
const char *at_opt_list_get(const at_options *o, const char *name, int i);
/* Where the value came from (AT_SRC_DEFAULT when the user did not set it). */
at_opt_source at_opt_source_of(const at_options *o, const char *name);
/* Overrides a value (the planner resolving "auto"); validated like input. */
at_status at_opt_set(at_options *o, const char *name, const char *value);

/* Sets a value as if it came from `src` (a resumed run's args.json is read as
 * a config file: AT_SRC_CONFIG); validated like input. Lists: items joined by
 * commas. */
at_status at_opt_set_from(at_options *o, const char *name, const char *value, at_opt_source src);

/* Every option as resolved, typed (for args.json). Caller owns the result. */
cJSON *at_options_to_json(const at_options *o);

/* Writes every option that has a store into the struct at dst: the value
 * as resolved (at_options_store) or the table's default
 * (at_options_store_defaults; unset defaults write 0 / NULL). Strings point
 * into o (or the table) and live as long as it. */
void at_options_store(const at_options *o, void *dst);
void at_options_store_defaults(const at_opt_spec *specs, int nspecs, void *dst);

/* Checks one textual value against row s (type, range, choices): the
 * parser's own check, for other callers of the table (the web UI). `where`
 * starts the message. */
at_status at_opt_check_value(const at_opt_spec *s, const char *text, const char *where);

/* The range of a number row as [lo, hi] with open ends flagged; 0 when the
 * row has none. */
int at_opt_range(const at_opt_spec *s, double *lo, int *lo_open, double *hi, int *hi_open);

/* The row named `name` (or its alias), or NULL. */
const at_opt_spec *at_opt_find(const at_opt_spec *specs, int nspecs, const char *name);

/* The options set (from the command line or a config file) whose row is
 * AT_OPT_IGNORED, one at a time: i from 0; NULL at the end. */
const at_opt_spec *at_options_ignored(const at_options *o, int *i);

/* Prints the table as help text (ignored and refused rows last, with their notes). */
void at_options_print_help(const at_opt_spec *specs, int nspecs, const char *usage);

#endif
