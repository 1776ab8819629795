/* One record (parsed JSON) -> one at_sample. The key aliases and role names
 * follow ms-swift's preprocessors (AutoPreprocessor, AlpacaPreprocessor,
 * ResponsePreprocessor, MessagesPreprocessor) and LLaMA-Factory's
 * dataset_info conventions. */
#include "data/dataset.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "data/media.h"

static const char *const k_message_keys[] = {"messages", "conversations", "conversation", NULL};
static const char *const k_query_keys[] = {"query", "prompt", "input", "instruction", "question", "problem", NULL};
static const char *const k_response_keys[] = {"response", "answer", "output", "targets", "target",
                                              "answer_key", "answers", "solution", "text", "completion",
                                              "content", NULL};
static const char *const k_system_keys[] = {"system", "system_prompt", NULL};

const char *at_role_name(at_role r)
{
    switch (r) {
    case AT_ROLE_SYSTEM: return "system";
    case AT_ROLE_USER: return "user";
    case AT_ROLE_ASSISTANT: return "assistant";
    case AT_ROLE_TOOL: return "tool";
    default: return "?";
    }
}

static const char *const k_format_names[] = {"auto", "alpaca", "sharegpt", "messages",
                                             "response", "text", "tokens", "preference"};

const char *at_data_format_name(at_data_format f)
{
    return (unsigned)f < sizeof k_format_names / sizeof *k_format_names ? k_format_names[f] : "?";
}

at_status at_data_format_parse(const char *name, at_data_format *out)
{
    for (size_t i = 0; i < sizeof k_format_names / sizeof *k_format_names; i++) {
        if (strcmp(name, k_format_names[i]) == 0) {
            *out = (at_data_format)i;
            return AT_OK;
        }
    }
    if (strcmp(name, "pt") == 0 || strcmp(name, "plain") == 0) {
        *out = AT_FORMAT_TEXT;
        return AT_OK;
    }
    if (strcmp(name, "dpo") == 0 || strcmp(name, "ranking") == 0) {
        *out = AT_FORMAT_PREFERENCE;
        return AT_OK;
    }
    return at_error(AT_ERR_INVALID,
                    "unknown dataset format \"%s\" (auto, alpaca, sharegpt, messages, response, text, tokens, "
                    "preference)", name);
}

/* Key lookup is case-insensitive (ms-swift matches lower-cased column
 * names); a null value counts as absent. */
static const cJSON *get(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static const cJSON *get_any(const cJSON *obj, const char *const *keys, const char **which)
{
    for (size_t i = 0; keys[i]; i++) {
        const cJSON *v = get(obj, keys[i]);
        if (v) {
            if (which) *which = keys[i];
            return v;
        }
    }
    return NULL;
}

static const char *type_name(const cJSON *v)
{
    if (!v || cJSON_IsNull(v)) return "null";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

static at_status fail(at_issue_kind *kind, at_issue_kind k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static at_status fail(at_issue_kind *kind, at_issue_kind k, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *kind = k;
    return at_error(AT_ERR_FORMAT, "%s", msg);
}

static at_status nomem(at_issue_kind *kind)
{
    *kind = AT_ISSUE_VALUE;
    return at_error(AT_ERR_NOMEM, "out of memory normalizing a record");
}

/* Copies s into the arena, replacing {{name}}/{{NAME}} and {{author}}/{{AUTHOR}}
 * when the options give replacements (LLaMA-Factory's identity.json and
 * ms-swift's self-cognition data use these placeholders). */
static const char *copy_str(const at_normalizer *nz, const char *s)
{
    size_t n = strlen(s);
    const char *pats[4] = {"{{name}}", "{{NAME}}", "{{author}}", "{{AUTHOR}}"};
    const char *reps[4] = {nz->model_name, nz->model_name, nz->model_author, nz->model_author};
    if (nz->unfilled && strstr(s, "{{"))
        for (int k = 0; k < 4; k++)
            if (!reps[k] && strstr(s, pats[k])) {
                (*nz->unfilled)++; /* the loader warns: the model would learn the braces */
                break;
            }
    if ((!nz->model_name && !nz->model_author) || !strstr(s, "{{"))
        return at_arena_strndup(nz->arena, s, n);
    size_t out_len = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *dst = NULL;
        if (pass == 1) {
            dst = at_arena_alloc(nz->arena, out_len + 1);
            if (!dst) return NULL;
        }
        size_t o = 0;
        for (size_t i = 0; i < n;) {
            int hit = -1;
            if (s[i] == '{') {
                for (int k = 0; k < 4; k++) {
                    if (reps[k] && strncmp(s + i, pats[k], strlen(pats[k])) == 0) {
                        hit = k;
                        break;
                    }
                }
            }
            if (hit >= 0) {
                size_t rl = strlen(reps[hit]);
                if (dst) memcpy(dst + o, reps[hit], rl);
                o += rl;
                i += strlen(pats[hit]);
            } else {
                if (dst) dst[o] = s[i];
                o++;
                i++;
            }
        }
        if (dst) {
            dst[o] = '\0';
            return dst;
        }
        out_len = o;
    }
    return NULL;
}

/* A growing list of messages in the arena; the capacity is an upper bound
 * computed from the record, so it never grows. */
typedef struct {
    at_message *m;
    size_t n, cap;
    at_media_list *imgs; /* images of content lists go here; NULL: none allowed */
} msgbuf;

static int mb_init(const at_normalizer *nz, msgbuf *mb, size_t cap)
{
    mb->n = 0;
    mb->cap = cap;
    mb->m = at_arena_alloc(nz->arena, (cap ? cap : 1) * sizeof *mb->m);
    return mb->m != NULL;
}

static at_status mb_add(const at_normalizer *nz, msgbuf *mb, at_role role, const char *content, at_issue_kind *kind)
{
    if (mb->n >= mb->cap) {
        *kind = AT_ISSUE_VALUE;
        return at_error(AT_ERR_INTERNAL, "message list overflow");
    }
    const char *c = copy_str(nz, content ? content : "");
    if (!c) return nomem(kind);
    mb->m[mb->n++] = (at_message){role, c, NULL, -1};
    return AT_OK;
}

static int map_role(const char *r, at_role *role, int *is_call)
{
    *is_call = 0;
    if (strcmp(r, "system") == 0) *role = AT_ROLE_SYSTEM;
    else if (strcmp(r, "user") == 0 || strcmp(r, "human") == 0) *role = AT_ROLE_USER;
    else if (strcmp(r, "assistant") == 0 || strcmp(r, "gpt") == 0 || strcmp(r, "bot") == 0) *role = AT_ROLE_ASSISTANT;
    else if (strcmp(r, "function_call") == 0 || strcmp(r, "function-call") == 0 || strcmp(r, "tool_call") == 0 ||
             strcmp(r, "tool-call") == 0) {
        *role = AT_ROLE_ASSISTANT;
        *is_call = 1;
    } else if (strcmp(r, "observation") == 0 || strcmp(r, "observations") == 0 ||
               strcmp(r, "function_response") == 0 || strcmp(r, "tool_response") == 0 || strcmp(r, "tool") == 0 ||
               strcmp(r, "function") == 0)
        *role = AT_ROLE_TOOL;
    else
        return 0;
    return 1;
}

/* Adds one {"type": "function", "function": {name, arguments}} to arr. */
static int add_call(cJSON *arr, const cJSON *call)
{
    const cJSON *name = get(call, "name");
    if (!cJSON_IsString(name)) return 0;
    const cJSON *args = get(call, "arguments");
    if (!args) args = get(call, "parameters");
    cJSON *c = cJSON_CreateObject();
    cJSON *f = cJSON_CreateObject();
    cJSON *a = args ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
    if (!c || !f || !a) {
        cJSON_Delete(c);
        cJSON_Delete(f);
        cJSON_Delete(a);
        return -1;
    }
    cJSON_AddItemToObject(f, "name", cJSON_CreateString(name->valuestring));
    cJSON_AddItemToObject(f, "arguments", a);
    cJSON_AddItemToObject(c, "type", cJSON_CreateString("function"));
    cJSON_AddItemToObject(c, "function", f);
    cJSON_AddItemToArray(arr, c);
    return 1;
}

static const char *arena_json(const at_normalizer *nz, const cJSON *v)
{
    char *s = cJSON_PrintUnformatted(v);
    if (!s) return NULL;
    const char *r = at_arena_strndup(nz->arena, s, strlen(s));
    cJSON_free(s);
    return r;
}

/* The value of a function_call / tool_call message: a JSON object
 * {"name", "arguments"} or a list of them, as text. */
static at_status tool_calls_from_text(const at_normalizer *nz, const char *text, const char *where, const char **out,
                                      at_issue_kind *kind)
{
    at_status st = AT_OK;
    cJSON *v = at_json_value(text); /* strict: data after the value makes it no call (below) */
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        st = nomem(kind);
        goto done;
    }
    int ok = 0;
    if (cJSON_IsObject(v)) {
        ok = add_call(arr, v);
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        const cJSON *c;
        ok = 1;
        cJSON_ArrayForEach(c, v) {
            ok = add_call(arr, c);
            if (ok != 1) break;
        }
    }
    if (ok < 0) {
        st = nomem(kind);
        goto done;
    }
    if (!ok) {
        st = fail(kind, AT_ISSUE_VALUE, "%s: a function call must be JSON {\"name\", \"arguments\"}", where);
        goto done;
    }
    *out = arena_json(nz, arr);
    if (!*out) st = nomem(kind);
done:
    cJSON_Delete(v);
    cJSON_Delete(arr);
    return st;
}

static at_status parse_loss(const cJSON *m, const char *where, int *loss, at_issue_kind *kind)
{
    const cJSON *l = get(m, "loss");
    *loss = -1;
    if (!l) return AT_OK;
    if (cJSON_IsBool(l)) *loss = cJSON_IsTrue(l);
    else if (cJSON_IsNumber(l)) *loss = l->valuedouble != 0;
    else return fail(kind, AT_ISSUE_TYPE, "%s.loss must be a boolean or a number, not %s", where, type_name(l));
    return AT_OK;
}

/* One {role|from, content|value[, tool_calls][, loss]} message. */
static at_status parse_message(const at_normalizer *nz, const cJSON *m, const char *where, int default_role,
                               msgbuf *mb, at_issue_kind *kind)
{
    if (!cJSON_IsObject(m)) return fail(kind, AT_ISSUE_TYPE, "%s must be an object, not %s", where, type_name(m));
    const cJSON *role = get(m, "role");
    if (!role) role = get(m, "from");
    const cJSON *content = cJSON_GetObjectItem(m, "content");
    if (!content) content = cJSON_GetObjectItem(m, "value");
    at_role r = default_role < 0 ? AT_ROLE_USER : (at_role)default_role;
    int is_call = 0;
    if (role) {
        if (!cJSON_IsString(role))
            return fail(kind, AT_ISSUE_TYPE, "%s: the role must be a string, not %s", where, type_name(role));
        if (!map_role(role->valuestring, &r, &is_call))
            return fail(kind, AT_ISSUE_VALUE, "%s: unknown role \"%.40s\"", where, role->valuestring);
    } else if (default_role < 0) {
        return fail(kind, AT_ISSUE_MISSING, "%s has no \"role\" (or \"from\")", where);
    }
    const cJSON *calls = get(m, "tool_calls");
    if (calls && !cJSON_IsArray(calls))
        return fail(kind, AT_ISSUE_TYPE, "%s.tool_calls must be an array, not %s", where, type_name(calls));
    const char *text = "";
    if (content && cJSON_IsString(content)) {
        text = content->valuestring;
    } else if (cJSON_IsArray(content)) { /* an OpenAI content list (text and image parts) */
        char w[96];
        snprintf(w, sizeof w, "%s.content", where);
        at_status st = at_media_content_text(nz->arena, nz->base_dir, content, w, &text, mb->imgs);
        if (st != AT_OK) {
            *kind = st == AT_ERR_NOMEM ? AT_ISSUE_VALUE : AT_ISSUE_TYPE;
            return st;
        }
    } else if (!content || cJSON_IsNull(content)) {
        if (!calls) return fail(kind, AT_ISSUE_MISSING, "%s has no content", where);
    } else {
        return fail(kind, AT_ISSUE_TYPE, "%s: the content must be a string or a list of parts, not %s", where,
                    type_name(content));
    }
    int loss;
    AT_TRY(parse_loss(m, where, &loss, kind));
    const char *tc = NULL;
    if (is_call) {
        AT_TRY(tool_calls_from_text(nz, text, where, &tc, kind));
        text = "";
    } else if (calls) {
        tc = arena_json(nz, calls);
        if (!tc) return nomem(kind);
    }
    AT_TRY(mb_add(nz, mb, r, text, kind));
    mb->m[mb->n - 1].tool_calls = tc;
    mb->m[mb->n - 1].loss = loss;
    return AT_OK;
}

static at_status opt_string(const cJSON *obj, const char *const *keys, const char **out, at_issue_kind *kind)
{
    const char *which = NULL;
    const cJSON *v = get_any(obj, keys, &which);
    *out = NULL;
    if (!v) return AT_OK;
    if (!cJSON_IsString(v)) return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be a string, not %s", which, type_name(v));
    *out = v->valuestring;
    return AT_OK;
}

/* The list under a messages key; system (record-level) is prepended unless
 * the list starts with a system message. */
static at_status parse_message_list(const at_normalizer *nz, const cJSON *arr, const char *key, const char *system,
                                    size_t extra, msgbuf *mb, at_issue_kind *kind)
{
    if (!cJSON_IsArray(arr)) return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be an array, not %s", key, type_name(arr));
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0) return fail(kind, AT_ISSUE_VALUE, "\"%s\" is empty", key);
    /* ms-swift's "sharegptq" pairs [{"human": q, "assistant": a}] give two per element */
    if (!mb_init(nz, mb, 2 * n + 1 + extra)) return nomem(kind);
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        if (i == 0 && system) {
            const cJSON *r0 = cJSON_IsObject(m) ? get(m, "role") : NULL;
            if (!r0 && cJSON_IsObject(m)) r0 = get(m, "from");
            if (!(cJSON_IsString(r0) && strcmp(r0->valuestring, "system") == 0))
                AT_TRY(mb_add(nz, mb, AT_ROLE_SYSTEM, system, kind));
        }
        if (cJSON_IsObject(m) && !get(m, "role") && !get(m, "from") && !cJSON_GetObjectItem(m, "content") &&
            !cJSON_GetObjectItem(m, "value")) {
            static const char *const uk[] = {"user", "human", NULL};
            static const char *const ak[] = {"assistant", "gpt", "bot", NULL};
            const char *q = NULL, *a = NULL;
            AT_TRY(opt_string(m, uk, &q, kind));
            AT_TRY(opt_string(m, ak, &a, kind));
            if (!q && !a) return fail(kind, AT_ISSUE_MISSING, "%s has no \"role\" (or \"from\")", where);
            if (q) AT_TRY(mb_add(nz, mb, AT_ROLE_USER, q, kind));
            if (a) AT_TRY(mb_add(nz, mb, AT_ROLE_ASSISTANT, a, kind));
        } else {
            AT_TRY(parse_message(nz, m, where, -1, mb, kind));
        }
        i++;
    }
    return AT_OK;
}

/* history: [[query, response], ...] */
static at_status add_history(const at_normalizer *nz, const cJSON *rec, msgbuf *mb, at_issue_kind *kind)
{
    const cJSON *h = get(rec, "history");
    if (!h) return AT_OK;
    if (!cJSON_IsArray(h)) return fail(kind, AT_ISSUE_TYPE, "\"history\" must be an array, not %s", type_name(h));
    size_t i = 0;
    const cJSON *pair;
    cJSON_ArrayForEach(pair, h) {
        const cJSON *q = cJSON_GetArrayItem(pair, 0), *a = cJSON_GetArrayItem(pair, 1);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(q) || !cJSON_IsString(a))
            return fail(kind, AT_ISSUE_TYPE, "history[%zu] must be a [query, response] pair of strings", i);
        AT_TRY(mb_add(nz, mb, AT_ROLE_USER, q->valuestring, kind));
        AT_TRY(mb_add(nz, mb, AT_ROLE_ASSISTANT, a->valuestring, kind));
        i++;
    }
    return AT_OK;
}

static size_t history_len(const cJSON *rec)
{
    const cJSON *h = get(rec, "history");
    return cJSON_IsArray(h) ? 2 * (size_t)cJSON_GetArraySize(h) : 0;
}

/* system + history + the user's query, for the alpaca and response formats.
 * alpaca: query = instruction "\n" input (either alone when the other is
 * empty), as ms-swift's AlpacaPreprocessor. Room for `extra` more messages. */
static at_status query_prompt(const at_normalizer *nz, const cJSON *rec, int alpaca, size_t extra, msgbuf *mb,
                              at_issue_kind *kind)
{
    const char *system = NULL, *query = NULL;
    char *joined = NULL;
    AT_TRY(opt_string(rec, k_system_keys, &system, kind));
    if (alpaca) {
        static const char *const ik[] = {"instruction", NULL}, *const nk[] = {"input", NULL};
        const char *ins = NULL, *inp = NULL;
        AT_TRY(opt_string(rec, ik, &ins, kind));
        AT_TRY(opt_string(rec, nk, &inp, kind));
        if (ins && *ins && inp && *inp) {
            size_t a = strlen(ins), b = strlen(inp);
            joined = at_arena_alloc(nz->arena, a + b + 2);
            if (!joined) return nomem(kind);
            memcpy(joined, ins, a);
            joined[a] = '\n';
            memcpy(joined + a + 1, inp, b + 1);
            query = joined;
        } else {
            query = (ins && *ins) ? ins : inp ? inp : ins;
        }
    } else {
        const char *which = NULL;
        const cJSON *q = get_any(rec, k_query_keys, &which);
        if (q && cJSON_IsArray(q)) {
            /* TRL-style conversational prompt */
            AT_TRY(parse_message_list(nz, q, which, system, extra, mb, kind));
            return AT_OK;
        }
        if (q && !cJSON_IsString(q))
            return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be a string, not %s", which, type_name(q));
        query = q ? q->valuestring : NULL;
    }
    if (!mb_init(nz, mb, 2 + history_len(rec) + extra)) return nomem(kind);
    if (system) AT_TRY(mb_add(nz, mb, AT_ROLE_SYSTEM, system, kind));
    AT_TRY(add_history(nz, rec, mb, kind));
    if (query) AT_TRY(mb_add(nz, mb, AT_ROLE_USER, query, kind));
    return AT_OK;
}

static at_status response_text(const cJSON *rec, const char *const *keys, const char **out, at_issue_kind *kind)
{
    const char *which = NULL;
    const cJSON *r = get_any(rec, keys, &which);
    if (!r) return fail(kind, AT_ISSUE_MISSING, "no response (\"%s\" or an alias)", keys[0]);
    if (cJSON_IsArray(r) && cJSON_GetArraySize(r) > 0 && cJSON_IsString(cJSON_GetArrayItem(r, 0))) {
        /* ms-swift picks one of several answers at random; the first keeps
         * the data deterministic */
        *out = cJSON_GetArrayItem(r, 0)->valuestring;
        return AT_OK;
    }
    if (!cJSON_IsString(r)) return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be a string, not %s", which, type_name(r));
    *out = r->valuestring;
    return AT_OK;
}

static at_status tools_of(const at_normalizer *nz, const cJSON *rec, const char **out, at_issue_kind *kind)
{
    const cJSON *t = get(rec, "tools");
    *out = NULL;
    if (!t) return AT_OK;
    if (cJSON_IsString(t)) {
        const char *s = t->valuestring;
        while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
        if (!*s) return AT_OK;
        cJSON *v = at_json_value(s);
        if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) {
            cJSON_Delete(v);
            return fail(kind, AT_ISSUE_VALUE, "\"tools\" is not a JSON list of tool definitions");
        }
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) {
            cJSON_Delete(v);
            return AT_OK;
        }
        *out = arena_json(nz, v);
        cJSON_Delete(v);
    } else if (cJSON_IsArray(t) || cJSON_IsObject(t)) {
        if (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0) return AT_OK;
        *out = arena_json(nz, t);
    } else {
        return fail(kind, AT_ISSUE_TYPE, "\"tools\" must be an array or a JSON string, not %s", type_name(t));
    }
    return *out ? AT_OK : nomem(kind);
}

static void set_messages(at_messages *dst, const msgbuf *mb) { *dst = (at_messages){mb->m, mb->n}; }

static void kto_label(const cJSON *rec, at_sample *out)
{
    const cJSON *l = get(rec, "label");
    if (!l) l = get(rec, "kto_tag"); /* LLaMA-Factory's column name */
    if (cJSON_IsBool(l)) out->label = cJSON_IsTrue(l);
    else if (cJSON_IsNumber(l) && (l->valuedouble == 0 || l->valuedouble == 1)) out->label = (int)l->valuedouble;
}

/* The record's images: those of content lists (already in imgs) or those of
 * its "images" (ms-swift) / "image" (LLaVA) key, never both; then the tags
 * checked against them (see data/media.h). */
static at_status record_images(const at_normalizer *nz, const cJSON *rec, msgbuf *mb, at_sample *out,
                               at_issue_kind *kind)
{
    at_media_list *imgs = mb->imgs;
    const char *which = NULL;
    static const char *const image_keys[] = {"images", "image", NULL};
    const cJSON *v = get_any(rec, image_keys, &which);
    if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)) {
        if (imgs->n) return fail(kind, AT_ISSUE_VALUE, "images both in content lists and in \"%s\"", which);
        at_status st = AT_OK;
        if (cJSON_IsArray(v)) {
            size_t i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                char w[64];
                snprintf(w, sizeof w, "%s[%zu]", which, i++);
                st = at_media_add_ref(nz->arena, nz->base_dir, e, w, imgs);
                if (st != AT_OK) break;
            }
        } else {
            st = at_media_add_ref(nz->arena, nz->base_dir, v, which, imgs);
        }
        if (st != AT_OK) {
            *kind = AT_ISSUE_VALUE;
            return st;
        }
    }
    at_messages m = {mb->m, mb->n};
    size_t tags = at_media_count_tags(&m);
    if (tags == 0 && imgs->n) {
        /* ms-swift: images without tags go before the first user message's text */
        for (size_t i = 0; i < mb->n; i++) {
            if (mb->m[i].role != AT_ROLE_USER) continue;
            size_t tl = strlen(AT_IMAGE_TAG), cl = strlen(mb->m[i].content);
            char *c = at_arena_alloc(nz->arena, imgs->n * tl + cl + 1);
            if (!c) return nomem(kind);
            for (size_t k = 0; k < imgs->n; k++) memcpy(c + k * tl, AT_IMAGE_TAG, tl);
            memcpy(c + imgs->n * tl, mb->m[i].content, cl + 1);
            mb->m[i].content = c;
            tags = imgs->n;
            break;
        }
    }
    /* without images "<image>" is plain text (a text-only dataset may say it) */
    if (imgs->n && tags != imgs->n)
        return fail(kind, AT_ISSUE_VALUE, "%zu <image> tag%s for %zu image%s", tags, tags == 1 ? "" : "s", imgs->n,
                    imgs->n == 1 ? "" : "s");
    out->images = imgs->items;
    out->n_images = imgs->n;
    return AT_OK;
}

static at_status norm_conversation(const at_normalizer *nz, const cJSON *rec, at_data_format fmt, at_sample *out,
                                   at_issue_kind *kind)
{
    at_media_list imgs = {0};
    msgbuf mb = {.imgs = &imgs};
    out->kind = AT_SAMPLE_CONVERSATION;
    if (fmt == AT_FORMAT_ALPACA || fmt == AT_FORMAT_RESPONSE) {
        const char *resp = NULL;
        static const char *const ok[] = {"output", NULL};
        AT_TRY(response_text(rec, fmt == AT_FORMAT_ALPACA ? ok : k_response_keys, &resp, kind));
        AT_TRY(query_prompt(nz, rec, fmt == AT_FORMAT_ALPACA, 1, &mb, kind));
        AT_TRY(mb_add(nz, &mb, AT_ROLE_ASSISTANT, resp, kind));
    } else {
        const char *which = NULL, *system = NULL;
        const cJSON *arr = get_any(rec, k_message_keys, &which);
        if (!arr) return fail(kind, AT_ISSUE_MISSING, "no \"messages\" (or \"conversations\")");
        AT_TRY(opt_string(rec, k_system_keys, &system, kind));
        AT_TRY(parse_message_list(nz, arr, which, system, 0, &mb, kind));
    }
    AT_TRY(record_images(nz, rec, &mb, out, kind));
    set_messages(&out->messages, &mb);
    AT_TRY(tools_of(nz, rec, &out->tools, kind));
    kto_label(rec, out);
    /* GRPO's accuracy reward compares completions with the record's "solution" (a string or a number) */
    const cJSON *sol = get(rec, "solution");
    char num[64];
    const char *sv = cJSON_IsString(sol) ? sol->valuestring : NULL;
    if (cJSON_IsNumber(sol)) {
        snprintf(num, sizeof num, "%.17g", sol->valuedouble);
        sv = num;
    }
    if (sv && !(out->solution = at_arena_strndup(nz->arena, sv, strlen(sv)))) return nomem(kind);
    return AT_OK;
}

static int msg_equal(const at_message *a, const at_message *b)
{
    if (a->role != b->role || strcmp(a->content, b->content) != 0) return 0;
    if (!a->tool_calls || !b->tool_calls) return a->tool_calls == b->tool_calls;
    return strcmp(a->tool_calls, b->tool_calls) == 0;
}

/* chosen / rejected value: a string (one assistant reply), one message
 * object (LLaMA-Factory), or a list of messages (TRL). */
static at_status parse_reply(const at_normalizer *nz, const cJSON *v, const char *key, msgbuf *mb, at_issue_kind *kind)
{
    if (cJSON_IsString(v)) {
        if (!mb_init(nz, mb, 1)) return nomem(kind);
        return mb_add(nz, mb, AT_ROLE_ASSISTANT, v->valuestring, kind);
    }
    if (cJSON_IsObject(v)) {
        if (!mb_init(nz, mb, 1)) return nomem(kind);
        return parse_message(nz, v, key, AT_ROLE_ASSISTANT, mb, kind);
    }
    if (cJSON_IsArray(v)) return parse_message_list(nz, v, key, NULL, 0, mb, kind);
    return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be a string, a message or a list of messages, not %s", key,
                type_name(v));
}

static at_status norm_preference(const at_normalizer *nz, const cJSON *rec, at_sample *out, at_issue_kind *kind)
{
    msgbuf prompt = {0}, chosen = {0}, rejected = {0};
    const char *which = NULL, *system = NULL;
    const cJSON *arr = get_any(rec, k_message_keys, &which);
    out->kind = AT_SAMPLE_PREFERENCE;
    AT_TRY(opt_string(rec, k_system_keys, &system, kind));
    if (arr) {
        AT_TRY(parse_message_list(nz, arr, which, system, 0, &prompt, kind));
    } else if (get(rec, "instruction")) {
        AT_TRY(query_prompt(nz, rec, 1, 0, &prompt, kind));
    } else if (get_any(rec, k_query_keys, NULL)) {
        AT_TRY(query_prompt(nz, rec, 0, 0, &prompt, kind));
    } else if (!mb_init(nz, &prompt, 1)) {
        return nomem(kind);
    }
    const cJSON *rr = get(rec, "rejected_response"), *rm = get(rec, "rejected_messages");
    const cJSON *c = get(rec, "chosen"), *r = get(rec, "rejected");
    int implicit = 0;
    if (rr) {
        /* ms-swift: the conversation ends with the chosen reply */
        if (!cJSON_IsString(rr))
            return fail(kind, AT_ISSUE_TYPE, "\"rejected_response\" must be a string, not %s", type_name(rr));
        if (c) {
            AT_TRY(parse_reply(nz, c, "chosen", &chosen, kind));
        } else {
            if (prompt.n == 0 || prompt.m[prompt.n - 1].role != AT_ROLE_ASSISTANT)
                return fail(kind, AT_ISSUE_VALUE, "with \"rejected_response\" the messages must end with the "
                                                  "assistant's chosen reply");
            chosen.m = &prompt.m[prompt.n - 1];
            chosen.n = chosen.cap = 1;
            prompt.n--;
        }
        AT_TRY(parse_reply(nz, rr, "rejected_response", &rejected, kind));
        if (chosen.n == 1 && strcmp(chosen.m[0].content, rejected.m[0].content) == 0)
            return fail(kind, AT_ISSUE_VALUE, "\"rejected_response\" equals the chosen reply");
    } else if (rm) {
        AT_TRY(parse_message_list(nz, rm, "rejected_messages", system, 0, &rejected, kind));
        chosen = prompt;
        implicit = 1;
    } else {
        if (!c || !r) return fail(kind, AT_ISSUE_MISSING, "a preference pair needs \"chosen\" and \"rejected\"");
        AT_TRY(parse_reply(nz, c, "chosen", &chosen, kind));
        AT_TRY(parse_reply(nz, r, "rejected", &rejected, kind));
        implicit = prompt.n == 0 && cJSON_IsArray(c) && cJSON_IsArray(r);
    }
    if (implicit) {
        /* the prompt is the common beginning of both conversations (TRL's
         * implicit prompt, ms-swift's rejected_messages) */
        size_t k = 0;
        while (k < chosen.n && k < rejected.n && msg_equal(&chosen.m[k], &rejected.m[k])) k++;
        prompt.m = chosen.m;
        prompt.n = k;
        chosen.m += k;
        chosen.n -= k;
        rejected.m += k;
        rejected.n -= k;
    }
    if (chosen.n == 0 || rejected.n == 0)
        return fail(kind, AT_ISSUE_VALUE, "the chosen and rejected replies must not be empty");
    if (chosen.m[chosen.n - 1].role != AT_ROLE_ASSISTANT || rejected.m[rejected.n - 1].role != AT_ROLE_ASSISTANT)
        return fail(kind, AT_ISSUE_VALUE, "the chosen and rejected replies must end with an assistant message");
    set_messages(&out->messages, &prompt);
    set_messages(&out->chosen, &chosen);
    set_messages(&out->rejected, &rejected);
    AT_TRY(tools_of(nz, rec, &out->tools, kind));
    return AT_OK;
}

static at_status int_array(const at_normalizer *nz, const cJSON *a, const char *key, int labels, int32_t **out,
                           size_t *n, at_issue_kind *kind)
{
    if (!cJSON_IsArray(a)) return fail(kind, AT_ISSUE_TYPE, "\"%s\" must be an array, not %s", key, type_name(a));
    *n = (size_t)cJSON_GetArraySize(a);
    if (*n == 0) return fail(kind, AT_ISSUE_VALUE, "\"%s\" is empty", key);
    *out = at_arena_alloc(nz->arena, *n * sizeof **out);
    if (!*out) return nomem(kind);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v))
            return fail(kind, AT_ISSUE_TYPE, "%s[%zu] must be an integer, not %s", key, i, type_name(v));
        double d = v->valuedouble;
        if (d != floor(d) || d > 2147483647.0 || (labels ? (d < 0 && d != -100) : d < 0))
            return fail(kind, AT_ISSUE_VALUE, "%s[%zu] = %g is not a valid %s", key, i, d,
                        labels ? "label (a token id or -100)" : "token id");
        (*out)[i++] = (int32_t)d;
    }
    return AT_OK;
}

static at_status norm_tokens(const at_normalizer *nz, const cJSON *rec, at_sample *out, at_issue_kind *kind)
{
    const cJSON *ids = get(rec, "input_ids"), *labels = get(rec, "labels");
    if (!ids) return fail(kind, AT_ISSUE_MISSING, "no \"input_ids\"");
    int32_t *pi = NULL, *pl = NULL;
    size_t n = 0, nl = 0;
    AT_TRY(int_array(nz, ids, "input_ids", 0, &pi, &n, kind));
    if (labels) {
        AT_TRY(int_array(nz, labels, "labels", 1, &pl, &nl, kind));
        if (nl != n)
            return fail(kind, AT_ISSUE_VALUE, "\"labels\" has %zu entries, \"input_ids\" %zu", nl, n);
    }
    out->kind = AT_SAMPLE_TOKENS;
    out->input_ids = pi;
    out->labels = pl;
    out->n_tokens = n;
    return AT_OK;
}

at_status at_normalize_text(const at_normalizer *nz, const char *text, size_t len, at_sample *out)
{
    char *tmp = malloc(len + 1);
    if (!tmp) return at_error(AT_ERR_NOMEM, "out of memory");
    memcpy(tmp, text, len);
    tmp[len] = '\0';
    out->kind = AT_SAMPLE_TEXT;
    out->label = -1;
    out->text = copy_str(nz, tmp);
    free(tmp);
    return out->text ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
}

static at_status norm_text(const at_normalizer *nz, const cJSON *rec, at_sample *out, at_issue_kind *kind)
{
    const cJSON *t = get(rec, "text");
    if (!t) return fail(kind, AT_ISSUE_MISSING, "no \"text\"");
    if (!cJSON_IsString(t)) return fail(kind, AT_ISSUE_TYPE, "\"text\" must be a string, not %s", type_name(t));
    if (!t->valuestring[0]) return fail(kind, AT_ISSUE_VALUE, "\"text\" is empty");
    out->kind = AT_SAMPLE_TEXT;
    out->text = copy_str(nz, t->valuestring);
    return out->text ? AT_OK : nomem(kind);
}

at_data_format at_data_format_detect(const cJSON *rec)
{
    if (!cJSON_IsObject(rec)) return AT_FORMAT_AUTO;
    if (get(rec, "input_ids")) return AT_FORMAT_TOKENS;
    if (get(rec, "rejected_response") || get(rec, "rejected_messages") || (get(rec, "chosen") && get(rec, "rejected")))
        return AT_FORMAT_PREFERENCE;
    if (get_any(rec, k_message_keys, NULL)) return AT_FORMAT_MESSAGES;
    if (get(rec, "instruction")) return AT_FORMAT_ALPACA;
    const char *which = NULL;
    const cJSON *resp = get_any(rec, k_response_keys, &which);
    if (get(rec, "text") && !get_any(rec, k_query_keys, NULL) && strcmp(which, "text") == 0) return AT_FORMAT_TEXT;
    if (resp || get_any(rec, k_query_keys, NULL)) return AT_FORMAT_RESPONSE;
    return AT_FORMAT_AUTO;
}

/* Whether a record is Chinese, for the two-value --model_name: its "tag"
 * key (ms-swift's self-cognition data), else any CJK ideograph (U+4E00 to
 * U+9FFF: UTF-8 lead bytes E4 to E9) in its strings. */
static int record_is_zh(const cJSON *rec)
{
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(rec, "tag");
    if (cJSON_IsString(tag)) return !strcmp(tag->valuestring, "zh");
    if (cJSON_IsString(rec)) {
        for (const unsigned char *p = (const unsigned char *)rec->valuestring; *p; p++)
            if (*p >= 0xE4 && *p <= 0xE9) return 1;
        return 0;
    }
    for (const cJSON *c = rec->child; c; c = c->next)
        if (record_is_zh(c)) return 1;
    return 0;
}

at_status at_normalize_record(const at_normalizer *nz_in, const cJSON *rec, at_data_format fmt, at_sample *out,
                              at_issue_kind *kind)
{
    at_normalizer local = *nz_in;
    const at_normalizer *nz = &local;
    if ((nz_in->model_name_en || nz_in->model_author_en) && !record_is_zh(rec)) {
        if (nz_in->model_name_en) local.model_name = nz_in->model_name_en;
        if (nz_in->model_author_en) local.model_author = nz_in->model_author_en;
    }
    memset(out, 0, sizeof *out);
    out->label = -1;
    if (!cJSON_IsObject(rec))
        return fail(kind, AT_ISSUE_TYPE, "a record must be a JSON object, not %s", type_name(rec));
    if (fmt == AT_FORMAT_AUTO) {
        fmt = at_data_format_detect(rec);
        if (fmt == AT_FORMAT_AUTO)
            return fail(kind, AT_ISSUE_FORMAT, "the keys fit no dataset format (messages, conversations, "
                                               "instruction/output, query/response, text, input_ids, chosen/rejected)");
    }
    switch (fmt) {
    case AT_FORMAT_ALPACA:
    case AT_FORMAT_RESPONSE:
    case AT_FORMAT_SHAREGPT:
    case AT_FORMAT_MESSAGES: return norm_conversation(nz, rec, fmt, out, kind);
    case AT_FORMAT_TEXT: return norm_text(nz, rec, out, kind);
    case AT_FORMAT_TOKENS: return norm_tokens(nz, rec, out, kind);
    case AT_FORMAT_PREFERENCE: return norm_preference(nz, rec, out, kind);
    default: return fail(kind, AT_ISSUE_FORMAT, "unknown format %d", (int)fmt);
    }
}
