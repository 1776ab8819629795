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

#include <cjson/cJSON.h>
#include "base/status.h"

typedef enum { AT_OPT_STRING, AT_OPT_INT, AT_OPT_FLOAT, AT_OPT_BOOL, AT_OPT_LIST } at_opt_type;

typedef struct {
    const char *name;     /* underscore spelling, without dashes */
    at_opt_type type;
    const char *def;      /* default as text; NULL: unset (lists: comma-separated) */
    const char *help;
    const char *alias;    /* another accepted name (e.g. tuner_type for train_type), or NULL */
} at_opt_spec;

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

/* Prints the table as help text. */
void at_options_print_help(const at_opt_spec *specs, int nspecs, const char *usage);

#endif
