#include "base/options.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>
#include "base/file.h"
#include "base/json.h"

typedef struct {
    char *text;          /* scalar text; lists: items joined by '\n' */
    int nitems;          /* lists */
    char **items;
    at_opt_source source;
} opt_value;

struct at_options {
    const at_opt_spec *specs;
    int n;
    opt_value *v;
};

static int find_spec(const at_options *o, const char *name, size_t len)
{
    for (int i = 0; i < o->n; i++) {
        const at_opt_spec *s = &o->specs[i];
        if (strlen(s->name) == len && !strncmp(s->name, name, len)) return i;
        if (s->alias && strlen(s->alias) == len && !strncmp(s->alias, name, len)) return i;
    }
    return -1;
}

/* Levenshtein distance, for "did you mean". */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* "'--name' (did you mean '--other'?)" into buf: one unknown option, named
 * with the closest known one. */
static void describe_unknown(const at_options *o, const char *name, char *buf, size_t cap)
{
    int best = -1, bestd = 4;
    for (int i = 0; i < o->n; i++) {
        int dist = edit_distance(name, o->specs[i].name);
        if (dist < bestd) {
            bestd = dist;
            best = i;
        }
    }
    if (best >= 0) snprintf(buf, cap, "'--%s' (did you mean '--%s'?)", name, o->specs[best].name);
    else snprintf(buf, cap, "'--%s'", name);
}

static at_status unknown_option(const at_options *o, const char *name, const char *where)
{
    char d[256];
    describe_unknown(o, name, d, sizeof d);
    return at_error(AT_ERR_INVALID, "%s: unknown option %s%s", where, d, strstr(d, "did you") ? "" : " (see --help)");
}

/* A config file's unknown keys, gathered to be reported at once (the
 * message is cut, with the count kept, past ~1 KB). */
typedef struct {
    char text[1024];
    int n;
} unknown_keys;

static void add_unknown(const at_options *o, unknown_keys *u, const char *name, const char *where)
{
    char d[256];
    describe_unknown(o, name, d, sizeof d);
    size_t len = strlen(u->text);
    if (len + 8 < sizeof u->text)
        snprintf(u->text + len, sizeof u->text - len, "%s%s%s", u->n ? "; " : "", where ? where : "", d);
    u->n++;
}

static at_status report_unknown(const unknown_keys *u, const char *path)
{
    if (!u->n) return AT_OK;
    return at_error(AT_ERR_INVALID, "%s: %d unknown option%s: %s (see --help)", path, u->n, u->n > 1 ? "s" : "",
                    u->text);
}

static void clear_value(opt_value *v)
{
    free(v->text);
    for (int i = 0; i < v->nitems; i++) free(v->items[i]);
    free(v->items);
    memset(v, 0, sizeof *v);
}

static int parse_bool(const char *s, int *out)
{
    if (!strcasecmp(s, "true") || !strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) {
        *out = 1;
        return 0;
    }
    if (!strcasecmp(s, "false") || !strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "off")) {
        *out = 0;
        return 0;
    }
    return -1;
}

int at_opt_range(const at_opt_spec *s, double *lo, int *lo_open, double *hi, int *hi_open)
{
    const char *r = s->range;
    if (!r || (*r != '[' && *r != '(')) return 0;
    *lo_open = *r == '(';
    char *end;
    const char *p = r + 1;
    while (*p == ' ') p++;
    if (!strncmp(p, "-inf", 4)) {
        *lo = -INFINITY;
        end = (char *)p + 4;
    } else {
        *lo = strtod(p, &end);
    }
    p = end;
    while (*p == ' ' || *p == ',') p++;
    if (!strncmp(p, "inf", 3)) {
        *hi = INFINITY;
        end = (char *)p + 3;
    } else {
        *hi = strtod(p, &end);
    }
    *hi_open = *end == ')';
    return 1;
}

/* Whether the text names one of "a|b|c". */
static int in_choices(const char *choices, const char *text)
{
    size_t n = strlen(text);
    for (const char *p = choices; *p;) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, text, n)) return 1;
        p += len;
        if (*p == '|') p++;
    }
    return 0;
}

/* The choice closest to text (for "did you mean"), into buf; 0 when none is close. */
static int closest_choice(const char *choices, const char *text, char *buf, size_t cap)
{
    int bestd = 3;
    for (const char *p = choices; *p;) {
        size_t len = strcspn(p, "|");
        char c[64];
        snprintf(c, sizeof c, "%.*s", (int)len, p);
        int d = edit_distance(text, c);
        if (d < bestd) {
            bestd = d;
            snprintf(buf, cap, "%s", c);
        }
        p += len;
        if (*p == '|') p++;
    }
    return bestd < 3;
}

at_status at_opt_check_value(const at_opt_spec *s, const char *text, const char *where)
{
    char *end = NULL;
    double v = 0;
    errno = 0;
    switch (s->type) {
    case AT_OPT_INT: {
        /* wide first: 2147483648 must be reported as typed, not as what an int cast made of it */
        long long i = strtoll(text, &end, 10);
        if (!*text || *end)
            return at_error(AT_ERR_INVALID, "%s: --%s expects an integer, got '%s'", where, s->name, text);
        if (errno == ERANGE)
            return at_error(AT_ERR_INVALID, "%s: --%s %s: too large", where, s->name, text);
        v = (double)i;
        int fits = s->store == AT_STORE_I64 || s->store == AT_STORE_U64 || (i >= INT_MIN && i <= INT_MAX);
        if (!s->range && !fits)
            return at_error(AT_ERR_INVALID, "%s: --%s %s: out of range [%d, %d]", where, s->name, text, INT_MIN,
                            INT_MAX);
        break;
    }
    case AT_OPT_FLOAT:
        v = strtod(text, &end);
        if (!*text || *end || errno || !isfinite(v))
            return at_error(AT_ERR_INVALID, "%s: --%s expects a number, got '%s'", where, s->name, text);
        break;
    case AT_OPT_BOOL: {
        int b;
        if (parse_bool(text, &b) != 0)
            return at_error(AT_ERR_INVALID, "%s: --%s expects true or false, got '%s'", where, s->name, text);
        return AT_OK;
    }
    case AT_OPT_STRING:
        if (s->choices && !in_choices(s->choices, text)) {
            char near[64];
            if (closest_choice(s->choices, text, near, sizeof near))
                return at_error(AT_ERR_INVALID, "%s: --%s %s: use one of %s (did you mean '%s'?)", where, s->name,
                                text, s->choices, near);
            return at_error(AT_ERR_INVALID, "%s: --%s %s: use one of %s", where, s->name, text, s->choices);
        }
        return AT_OK;
    default:
        return AT_OK;
    }
    double lo, hi;
    int lo_open, hi_open;
    int below = 0, above = 0;
    if (at_opt_range(s, &lo, &lo_open, &hi, &hi_open)) {
        below = lo_open ? !(v > lo) : !(v >= lo);
        above = hi_open ? !(v < hi) : !(v <= hi);
    }
    if (below || above)
        return at_error(AT_ERR_INVALID, "%s: --%s %s: out of range %s", where, s->name, text, s->range);
    return AT_OK;
}

/* Sets option i from one textual value (lists: a comma-separated string,
 * or one item appended when `append`). */
static at_status set_value(at_options *o, int i, const char *text, at_opt_source src, int append, const char *where)
{
    const at_opt_spec *s = &o->specs[i];
    opt_value *v = &o->v[i];
    if (s->role == AT_OPT_REFUSED && src != AT_SRC_DEFAULT)
        return at_error(AT_ERR_UNSUPPORTED, "%s: --%s is not supported: %s", where, s->name, s->note);
    if (s->type == AT_OPT_LIST) {
        if (!append || v->source != src) clear_value(v);
        /* a single value may hold several comma-separated items */
        const char *p = text;
        do {
            size_t len = strcspn(p, ",");
            char **ni = realloc(v->items, (size_t)(v->nitems + 1) * sizeof *ni);
            if (!ni) return at_error(AT_ERR_NOMEM, "out of memory");
            v->items = ni;
            v->items[v->nitems] = strndup(p, len);
            if (!v->items[v->nitems]) return at_error(AT_ERR_NOMEM, "out of memory");
            /* trim spaces */
            char *it = v->items[v->nitems];
            size_t l = strlen(it);
            while (l && isspace((unsigned char)it[l - 1])) it[--l] = '\0';
            size_t lead = strspn(it, " \t");
            memmove(it, it + lead, strlen(it + lead) + 1);
            if (*it) v->nitems++;
            else free(it);
            p += len;
            if (*p == ',') p++;
        } while (*p);
        v->source = src;
        return AT_OK;
    }
    AT_TRY(at_opt_check_value(s, text, where));
    clear_value(v);
    v->text = strdup(text);
    if (!v->text) return at_error(AT_ERR_NOMEM, "out of memory");
    v->source = src;
    return AT_OK;
}

/* ---- config files ---- */

static at_status config_json(at_options *o, const char *path)
{
    cJSON *j = NULL;
    AT_TRY(at_json_parse_file(path, &j));
    at_status st = AT_OK;
    unknown_keys unk = {{0}, 0};
    if (!cJSON_IsObject(j)) {
        st = at_error(AT_ERR_FORMAT, "%s: a config file must hold an object of option names", path);
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, j)
    {
        char key[128];
        snprintf(key, sizeof key, "%s", it->string);
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        int i = find_spec(o, key, strlen(key));
        if (i < 0) {
            add_unknown(o, &unk, key, NULL);
            continue;
        }
        char where[512];
        snprintf(where, sizeof where, "%s (key \"%s\")", path, it->string);
        if (cJSON_IsArray(it)) {
            if (o->specs[i].type != AT_OPT_LIST) {
                st = at_error(AT_ERR_FORMAT, "%s: expects one value, not a list", where);
                goto done;
            }
            clear_value(&o->v[i]);
            const cJSON *e;
            cJSON_ArrayForEach(e, it)
            {
                char buf[64];
                const char *t = cJSON_IsString(e) ? e->valuestring : NULL;
                if (!t && cJSON_IsNumber(e)) {
                    snprintf(buf, sizeof buf, "%.17g", e->valuedouble);
                    t = buf;
                }
                if (!t) {
                    st = at_error(AT_ERR_FORMAT, "%s: list items must be strings or numbers", where);
                    goto done;
                }
                AT_CHECK(set_value(o, i, t, AT_SRC_CONFIG, 1, where));
            }
        } else if (cJSON_IsString(it)) {
            AT_CHECK(set_value(o, i, it->valuestring, AT_SRC_CONFIG, 0, where));
        } else if (cJSON_IsBool(it)) {
            AT_CHECK(set_value(o, i, cJSON_IsTrue(it) ? "true" : "false", AT_SRC_CONFIG, 0, where));
        } else if (cJSON_IsNumber(it)) {
            char buf[64];
            if (it->valuedouble == floor(it->valuedouble) && fabs(it->valuedouble) < 1e15)
                snprintf(buf, sizeof buf, "%lld", (long long)it->valuedouble);
            else
                snprintf(buf, sizeof buf, "%.17g", it->valuedouble);
            AT_CHECK(set_value(o, i, buf, AT_SRC_CONFIG, 0, where));
        } else if (cJSON_IsNull(it)) {
            clear_value(&o->v[i]);
            o->v[i].source = AT_SRC_CONFIG;
        } else {
            st = at_error(AT_ERR_FORMAT, "%s: unsupported value type", where);
            goto done;
        }
    }
    st = report_unknown(&unk, path);
done:
    cJSON_Delete(j);
    return st;
}

static at_status config_yaml(at_options *o, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(path, &text, &len)); /* a regular file, of bounded size */
    yaml_parser_t p;
    yaml_document_t doc;
    at_status st = AT_OK;
    int have_doc = 0;
    unknown_keys unk = {{0}, 0};
    if (!yaml_parser_initialize(&p)) {
        free(text);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    if (!yaml_parser_load(&p, &doc)) {
        st = at_error(AT_ERR_FORMAT, "%s: line %zu, column %zu: %s", path, p.problem_mark.line + 1,
                      p.problem_mark.column + 1, p.problem ? p.problem : "malformed YAML");
        goto done;
    }
    have_doc = 1;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) goto done; /* empty file: nothing set */
    if (root->type != YAML_MAPPING_NODE) {
        st = at_error(AT_ERR_FORMAT, "%s: line %zu: a config file must be a mapping of option names", path,
                      root->start_mark.line + 1);
        goto done;
    }
    for (yaml_node_pair_t *pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top; pair++) {
        yaml_node_t *k = yaml_document_get_node(&doc, pair->key);
        yaml_node_t *v = yaml_document_get_node(&doc, pair->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE) {
            st = at_error(AT_ERR_FORMAT, "%s: line %zu: keys must be option names", path,
                          k ? k->start_mark.line + 1 : 0);
            goto done;
        }
        char key[128];
        snprintf(key, sizeof key, "%s", (const char *)k->data.scalar.value);
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        int i = find_spec(o, key, strlen(key));
        char where[512];
        snprintf(where, sizeof where, "%s:%zu", path, k->start_mark.line + 1);
        if (i < 0) {
            char line[32];
            snprintf(line, sizeof line, "line %zu: ", k->start_mark.line + 1);
            add_unknown(o, &unk, key, line);
            continue;
        }
        if (v->type == YAML_SCALAR_NODE) {
            const char *t = (const char *)v->data.scalar.value;
            if (v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                (!strcmp(t, "null") || !strcmp(t, "~") || !*t)) {
                /* null: the table's default (an option with none is unset); clearing a
                 * defaulted one stored 0, e.g. learning_rate 0, which the check refuses */
                if (o->specs[i].def) continue;
                clear_value(&o->v[i]);
                o->v[i].source = AT_SRC_CONFIG;
                continue;
            }
            AT_CHECK(set_value(o, i, t, AT_SRC_CONFIG, 0, where));
        } else if (v->type == YAML_SEQUENCE_NODE) {
            if (o->specs[i].type != AT_OPT_LIST) {
                st = at_error(AT_ERR_FORMAT, "%s: --%s expects one value, not a list", where, o->specs[i].name);
                goto done;
            }
            clear_value(&o->v[i]);
            for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                yaml_node_t *e = yaml_document_get_node(&doc, *it);
                if (!e || e->type != YAML_SCALAR_NODE) {
                    st = at_error(AT_ERR_FORMAT, "%s: list items must be scalars", where);
                    goto done;
                }
                AT_CHECK(set_value(o, i, (const char *)e->data.scalar.value, AT_SRC_CONFIG, 1, where));
            }
        } else {
            st = at_error(AT_ERR_FORMAT, "%s: --%s: nested mappings are not options", where, o->specs[i].name);
            goto done;
        }
    }
    st = report_unknown(&unk, path);
done:
    if (have_doc) yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    free(text);
    return st;
}

static at_status load_config(at_options *o, const char *path)
{
    const char *dot = strrchr(path, '.');
    if (dot && !strcasecmp(dot, ".json")) return config_json(o, path);
    if (dot && (!strcasecmp(dot, ".yaml") || !strcasecmp(dot, ".yml"))) return config_yaml(o, path);
    return at_error(AT_ERR_INVALID, "--config %s: use a .yaml, .yml or .json file", path);
}

/* ---- command line ---- */

at_status at_options_parse(const at_opt_spec *specs, int nspecs, int argc, char **argv, at_options **out)
{
    *out = NULL;
    at_options *o = calloc(1, sizeof *o);
    if (!o) return at_error(AT_ERR_NOMEM, "out of memory");
    o->specs = specs;
    o->n = nspecs;
    o->v = calloc((size_t)nspecs, sizeof *o->v);
    if (!o->v) {
        free(o);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    at_status st = AT_OK;
    for (int i = 0; i < nspecs; i++)
        if (specs[i].def) AT_CHECK(set_value(o, i, specs[i].def, AT_SRC_DEFAULT, 0, "default"));
    /* The config file first, wherever --config appears, so the command line wins. */
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        const char *path = NULL;
        if (!strcmp(arg, "--config")) {
            if (a + 1 >= argc) {
                st = at_error(AT_ERR_INVALID, "--config needs a file name");
                goto done;
            }
            path = argv[a + 1];
        } else if (!strncmp(arg, "--config=", 9)) {
            path = arg + 9;
        }
        if (path) AT_CHECK(load_config(o, path));
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
            st = at_error(AT_ERR_INVALID, "unexpected argument '%s' (options start with --)", arg);
            goto done;
        }
        if (!strcmp(arg, "--config")) {
            a++;
            continue;
        }
        if (!strncmp(arg, "--config=", 9)) continue;
        char name[128];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, arg + 2, len);
        name[len] = '\0';
        for (char *c = name; *c; c++)
            if (*c == '-') *c = '_';
        int i = find_spec(o, name, strlen(name));
        if (i < 0) {
            st = unknown_option(o, name, "command line");
            goto done;
        }
        const at_opt_spec *s = &specs[i];
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            int b;
            if (s->type == AT_OPT_BOOL && (a + 1 >= argc || parse_bool(argv[a + 1], &b) != 0)) {
                value = "true";
            } else if (a + 1 < argc) {
                value = argv[++a];
            } else {
                st = at_error(AT_ERR_INVALID, "--%s needs a value", s->name);
                goto done;
            }
        }
        char where[160];
        snprintf(where, sizeof where, "command line");
        /* A list option given several times, or followed by several values, accumulates. */
        AT_CHECK(set_value(o, i, value, AT_SRC_CLI, s->type == AT_OPT_LIST, where));
        if (s->type == AT_OPT_LIST && !eq)
            while (a + 1 < argc && strncmp(argv[a + 1], "--", 2) != 0)
                AT_CHECK(set_value(o, i, argv[++a], AT_SRC_CLI, 1, where));
    }
done:
    if (st != AT_OK) {
        at_options_free(o);
        return st;
    }
    *out = o;
    return AT_OK;
}

void at_options_free(at_options *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) clear_value(&o->v[i]);
    free(o->v);
    free(o);
}

static const opt_value *get(const at_options *o, const char *name)
{
    int i = find_spec(o, name, strlen(name));
    return i < 0 ? NULL : &o->v[i];
}

const char *at_opt_str(const at_options *o, const char *name)
{
    const opt_value *v = get(o, name);
    return v ? v->text : NULL;
}

long long at_opt_int(const at_options *o, const char *name)
{
    const char *t = at_opt_str(o, name);
    return t ? strtoll(t, NULL, 10) : 0;
}

double at_opt_float(const at_options *o, const char *name)
{
    const char *t = at_opt_str(o, name);
    return t ? strtod(t, NULL) : 0.0;
}

int at_opt_bool(const at_options *o, const char *name)
{
    const char *t = at_opt_str(o, name);
    int b = 0;
    if (t) parse_bool(t, &b);
    return b;
}

int at_opt_list_count(const at_options *o, const char *name)
{
    const opt_value *v = get(o, name);
    return v ? v->nitems : 0;
}

const char *at_opt_list_get(const at_options *o, const char *name, int i)
{
    const opt_value *v = get(o, name);
    return v && i >= 0 && i < v->nitems ? v->items[i] : NULL;
}

at_opt_source at_opt_source_of(const at_options *o, const char *name)
{
    const opt_value *v = get(o, name);
    return v ? v->source : AT_SRC_DEFAULT;
}

at_status at_opt_set(at_options *o, const char *name, const char *value)
{
    int i = find_spec(o, name, strlen(name));
    if (i < 0) return at_error(AT_ERR_INTERNAL, "no option named %s", name);
    at_opt_source src = o->v[i].source;
    AT_TRY(set_value(o, i, value, src, 0, "resolved"));
    return AT_OK;
}

at_status at_opt_set_from(at_options *o, const char *name, const char *value, at_opt_source src)
{
    int i = find_spec(o, name, strlen(name));
    if (i < 0) return at_error(AT_ERR_INTERNAL, "no option named %s", name);
    return set_value(o, i, value, src, 0, name);
}

cJSON *at_options_to_json(const at_options *o)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    for (int i = 0; i < o->n; i++) {
        const at_opt_spec *s = &o->specs[i];
        const opt_value *v = &o->v[i];
        if (s->role != AT_OPT_NORMAL && v->source == AT_SRC_DEFAULT) continue; /* ms-swift's words, unused */
        if (s->type == AT_OPT_LIST) {
            cJSON *arr = cJSON_AddArrayToObject(j, s->name);
            for (int k = 0; k < v->nitems; k++) cJSON_AddItemToArray(arr, cJSON_CreateString(v->items[k]));
        } else if (!v->text) {
            cJSON_AddNullToObject(j, s->name);
        } else if (s->type == AT_OPT_INT) {
            cJSON_AddNumberToObject(j, s->name, (double)strtoll(v->text, NULL, 10));
        } else if (s->type == AT_OPT_FLOAT) {
            cJSON_AddNumberToObject(j, s->name, strtod(v->text, NULL));
        } else if (s->type == AT_OPT_BOOL) {
            int b = 0;
            parse_bool(v->text, &b);
            cJSON_AddBoolToObject(j, s->name, b);
        } else {
            cJSON_AddStringToObject(j, s->name, v->text);
        }
    }
    return j;
}

const at_opt_spec *at_opt_find(const at_opt_spec *specs, int nspecs, const char *name)
{
    at_options tmp = {specs, nspecs, NULL};
    int i = find_spec(&tmp, name, strlen(name));
    return i < 0 ? NULL : &specs[i];
}

const at_opt_spec *at_options_ignored(const at_options *o, int *i)
{
    for (; *i < o->n; (*i)++)
        if (o->specs[*i].role == AT_OPT_IGNORED && o->v[*i].source != AT_SRC_DEFAULT) return &o->specs[(*i)++];
    return NULL;
}

/* Writes one row's value (text: NULL when unset) at its place in dst. */
static void store_one(const at_opt_spec *s, const char *text, void *dst)
{
    char *p = (char *)dst + s->offset;
    int b = 0;
    switch (s->store) {
    case AT_STORE_INT: {
        int v = 0;
        if (text && s->type == AT_OPT_BOOL) v = parse_bool(text, &b) == 0 && b;
        else if (text) v = (int)strtoll(text, NULL, 10); /* the parser checked that it fits */
        memcpy(p, &v, sizeof v);
        break;
    }
    case AT_STORE_I64: {
        int64_t v = text ? (int64_t)strtoll(text, NULL, 10) : 0;
        memcpy(p, &v, sizeof v);
        break;
    }
    case AT_STORE_U64: {
        uint64_t v = text ? (uint64_t)strtoull(text, NULL, 10) : 0;
        memcpy(p, &v, sizeof v);
        break;
    }
    case AT_STORE_DOUBLE: {
        double v = text ? strtod(text, NULL) : 0;
        memcpy(p, &v, sizeof v);
        break;
    }
    case AT_STORE_STR:
        memcpy(p, &text, sizeof text);
        break;
    default:
        break;
    }
}

void at_options_store(const at_options *o, void *dst)
{
    for (int i = 0; i < o->n; i++)
        if (o->specs[i].store && o->specs[i].type != AT_OPT_LIST) store_one(&o->specs[i], o->v[i].text, dst);
}

void at_options_store_defaults(const at_opt_spec *specs, int nspecs, void *dst)
{
    for (int i = 0; i < nspecs; i++)
        if (specs[i].store && specs[i].type != AT_OPT_LIST) store_one(&specs[i], specs[i].def, dst);
}

static void print_row(const at_opt_spec *s)
{
    static const char *type_names[] = {"TEXT", "INT", "NUM", "[BOOL]", "LIST"};
    char left[96];
    snprintf(left, sizeof left, "--%s %s", s->name, s->choices ? s->choices : type_names[s->type]);
    if (strlen(left) > 40) printf("  %s\n  %-40s %s", left, "", s->role ? s->note : s->help);
    else printf("  %-40s %s", left, s->role ? s->note : s->help);
    if (s->def && s->role != AT_OPT_REFUSED) printf(" (default: %s)", s->def);
    if (s->range) printf(" (range %s)", s->range);
    if (s->alias) printf(" (alias --%s)", s->alias);
    printf("\n");
}

void at_options_print_help(const at_opt_spec *specs, int nspecs, const char *usage)
{
    printf("%s\n\noptions (hyphen spellings work too; --config FILE.yaml|json sets any of them):\n", usage);
    for (int i = 0; i < nspecs; i++)
        if (specs[i].role == AT_OPT_NORMAL) print_row(&specs[i]);
    static const char *titles[] = {NULL, "\nms-swift options accepted with no effect here (why):\n",
                                   "\nms-swift options not supported (what to use instead):\n"};
    for (int role = AT_OPT_IGNORED; role <= AT_OPT_REFUSED; role++) {
        int first = 1;
        for (int i = 0; i < nspecs; i++)
            if ((int)specs[i].role == role) {
                if (first) fputs(titles[role], stdout);
                first = 0;
                print_row(&specs[i]);
            }
    }
}
