#include "serve/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"
#include "data/media.h"
#include "data/records.h"

static at_status bad(at_serve_request *r, const char *param, const char *fmt, const char *detail)
{
    snprintf(r->param, sizeof r->param, "%s", param);
    return at_error(AT_ERR_INVALID, fmt, param, detail ? detail : "");
}

/* A number field into *out when present (null counts as absent). */
static at_status number(at_serve_request *r, const cJSON *o, const char *key, double lo, double hi, double *out,
                        int *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (present) *present = 0;
    if (!v || cJSON_IsNull(v)) return AT_OK;
    if (!cJSON_IsNumber(v)) return bad(r, key, "'%s' must be a number%s", NULL);
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi) {
        char range[96];
        snprintf(range, sizeof range, " in [%g, %g] (got %g)", lo, hi, d);
        return bad(r, key, "'%s' must be a number%s", range);
    }
    *out = d;
    if (present) *present = 1;
    return AT_OK;
}

static at_status integer(at_serve_request *r, const cJSON *o, const char *key, double lo, double hi, long long *out,
                         int *present)
{
    double d = 0;
    int have = 0;
    AT_TRY(number(r, o, key, lo, hi, &d, &have));
    if (have && d != floor(d)) return bad(r, key, "'%s' must be an integer%s", NULL);
    if (have) *out = (long long)d;
    if (present) *present = have;
    return AT_OK;
}

static at_status boolean(at_serve_request *r, const cJSON *o, const char *key, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return AT_OK;
    if (!cJSON_IsBool(v)) return bad(r, key, "'%s' must be true or false%s", NULL);
    *out = cJSON_IsTrue(v);
    return AT_OK;
}

/* content: a string, null, or a list of parts: text (joined) and images
 * ("<image>" tags; their references appended to r->images). A new string. */
static at_status content_text(at_serve_request *r, const cJSON *c, const at_request_limits *lim, char **out)
{
    *out = NULL;
    if (!c || cJSON_IsNull(c)) {
        *out = strdup("");
    } else if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
    } else if (cJSON_IsArray(c)) {
        at_arena a = {0};
        at_media_list list = {0};
        const char *text = NULL;
        at_status st = at_media_content_text(&a, NULL, c, "content", &text, &list);
        int max = lim->max_images > 0 ? lim->max_images : AT_SERVE_MAX_IMAGES;
        if (st == AT_OK && (size_t)r->n_images + list.n > (size_t)max) {
            char d[64];
            snprintf(d, sizeof d, " (at most %d: --limit_mm_per_prompt)", max);
            at_arena_free(&a);
            return bad(r, "messages", "'%s': too many images in one request%s", d);
        }
        if (st == AT_OK && list.n) {
            char **im = realloc(r->images, ((size_t)r->n_images + list.n) * sizeof *im);
            if (im) r->images = im;
            for (size_t i = 0; im && i < list.n && st == AT_OK; i++)
                if ((im[r->n_images] = strdup(list.items[i]))) r->n_images++;
                else st = at_error(AT_ERR_NOMEM, "out of memory");
            if (!im) st = at_error(AT_ERR_NOMEM, "out of memory");
        }
        if (st == AT_OK) *out = strdup(text);
        at_arena_free(&a);
        if (st == AT_ERR_NOMEM) return st;
        if (st != AT_OK) {
            char why[400];
            snprintf(why, sizeof why, "%s", at_last_error());
            snprintf(r->param, sizeof r->param, "messages");
            return at_error(AT_ERR_INVALID, "'messages': %s", why);
        }
    } else {
        return bad(r, "messages", "'%s': a message's content must be a string or a list of text parts%s", NULL);
    }
    if (!*out) return at_error(AT_ERR_NOMEM, "out of memory");
    return AT_OK;
}

static at_status parse_messages(at_serve_request *r, const cJSON *o, const at_request_limits *lim)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!m) return bad(r, "messages", "'%s' is required%s", NULL);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return bad(r, "messages", "'%s' must be a non-empty list of messages%s", NULL);
    r->messages = cJSON_CreateArray();
    if (!r->messages) return at_error(AT_ERR_NOMEM, "out of memory");
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role) || !role->valuestring[0])
            return bad(r, "messages", "'%s': every message needs a string 'role'%s", NULL);
        char *text = NULL;
        AT_TRY(content_text(r, cJSON_GetObjectItemCaseSensitive(msg, "content"), lim, &text));
        cJSON *copy = cJSON_CreateObject();
        if (!copy || !cJSON_AddStringToObject(copy, "role", role->valuestring) ||
            !cJSON_AddStringToObject(copy, "content", text)) {
            free(text);
            cJSON_Delete(copy);
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        free(text);
        cJSON_AddItemToArray(r->messages, copy);
    }
    return AT_OK;
}

static at_status parse_prompt(at_serve_request *r, const cJSON *o)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!p) return bad(r, "prompt", "'%s' is required%s", NULL);
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) {
        r->prompt = strdup(p->valuestring);
        return r->prompt ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    }
    int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n == 0)
        return bad(r, "prompt", "'%s' must be a string, a list of one string, or a non-empty list of token ids%s",
                   NULL);
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return at_error(AT_ERR_NOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 2147483647.0 ||
            it->valuedouble != floor(it->valuedouble))
            return bad(r, "prompt", "'%s': a list prompt must hold one string or token ids (integers >= 0)%s", NULL);
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)it->valuedouble;
    }
    return AT_OK;
}

static at_status parse_stop(at_serve_request *r, const cJSON *o, const at_request_limits *lim)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!s || cJSON_IsNull(s)) return AT_OK;
    int max = lim->max_stop > 0 && lim->max_stop < AT_GEN_MAX_STOP ? lim->max_stop : AT_GEN_MAX_STOP;
    if (!cJSON_IsString(s) && !cJSON_IsArray(s))
        return bad(r, "stop", "'%s' must be a string or a list of strings%s", NULL);
    if (cJSON_IsArray(s) && cJSON_GetArraySize(s) > max) {
        char d[64];
        snprintf(d, sizeof d, " (at most %d)", max);
        return bad(r, "stop", "'%s' has too many strings%s", d);
    }
    const cJSON *it;
    const cJSON *one = cJSON_IsString(s) ? s : NULL;
    for (it = one ? one : s->child; it; it = one ? NULL : it->next) {
        if (!cJSON_IsString(it)) return bad(r, "stop", "'%s' must be a string or a list of strings%s", NULL);
        size_t n = strlen(it->valuestring);
        if (lim->max_stop_len && n > lim->max_stop_len) return bad(r, "stop", "'%s': a stop string is too long%s", NULL);
        if (n == 0) continue;
        r->stop[r->n_stop] = strdup(it->valuestring);
        if (!r->stop[r->n_stop]) return at_error(AT_ERR_NOMEM, "out of memory");
        r->n_stop++;
    }
    return AT_OK;
}

at_status at_serve_request_parse(const char *body, size_t len, at_request_kind kind, const at_request_limits *lim,
                                 at_serve_request *r)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->sampling = at_sampling_defaults();
    r->sampling.temperature = 1.0f; /* OpenAI's default */
    cJSON *o = NULL;
    at_status st = AT_OK;
    size_t bad_at = at_utf8_check(body, len);
    if (bad_at != len) { /* JSON is UTF-8 (RFC 8259), and the dataset loader refuses it alike */
        st = at_error(AT_ERR_FORMAT, "the request body is not valid UTF-8 (byte %zu)", bad_at);
        goto done;
    }
    AT_CHECK(at_json_parse(body, len, "request body", &o));
    if (!cJSON_IsObject(o)) {
        st = at_error(AT_ERR_FORMAT, "the request body must be a JSON object");
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            st = bad(r, "model", "'%s' must be a string%s", NULL);
            goto done;
        }
        r->model = strdup(model->valuestring);
        if (!r->model) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    /* accepted by OpenAI's API but not implemented here: refused, never silently ignored */
    static const char *const unsupported[] = {"tools", "tool_choice", "functions", "function_call", "response_format"};
    for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, unsupported[k]);
        const cJSON *type = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        int no_op = !v || cJSON_IsNull(v) || (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) ||
                    (cJSON_IsString(v) && !strcmp(v->valuestring, "none")) ||
                    (cJSON_IsString(type) && !strcmp(type->valuestring, "text")); /* what is done anyway */
        if (!no_op) {
            st = bad(r, unsupported[k], "'%s' is not supported by this server%s", " (tool calls and structured "
                     "output are not implemented yet; leave it out)");
            goto done;
        }
    }
    if (kind == AT_REQ_CHAT) AT_CHECK(parse_messages(r, o, lim));
    else AT_CHECK(parse_prompt(r, o));

    double d;
    long long i;
    int have;
    AT_CHECK(integer(r, o, "max_tokens", 1, 1e15, &i, &have));
    if (!have) AT_CHECK(integer(r, o, "max_completion_tokens", 1, 1e15, &i, &have));
    if (have) {
        if (lim->max_tokens > 0 && i > lim->max_tokens) {
            char detail[96];
            snprintf(detail, sizeof detail, " (got %lld, at most %d)", i, lim->max_tokens);
            st = bad(r, "max_tokens", "'%s' is too large%s", detail);
            goto done;
        }
        r->max_tokens = (int)i;
    }
    AT_CHECK(integer(r, o, "n", 1, 1e9, &i, &have));
    if (have && i != 1) {
        st = bad(r, "n", "'%s': only n = 1 is supported%s", NULL);
        goto done;
    }
    AT_CHECK(integer(r, o, "best_of", 1, 1e9, &i, &have));
    if (have && i != 1) {
        st = bad(r, "best_of", "'%s': only best_of = 1 is supported%s", NULL);
        goto done;
    }
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp) && !(cJSON_IsNumber(lp) && lp->valuedouble == 0)) {
        st = bad(r, "logprobs", "'%s' is not supported%s", NULL);
        goto done;
    }
    AT_CHECK(number(r, o, "temperature", 0, 2, &d, &have));
    if (have) r->sampling.temperature = (float)d;
    AT_CHECK(number(r, o, "top_p", 1e-9, 1, &d, &have));
    if (have) r->sampling.top_p = (float)d;
    AT_CHECK(integer(r, o, "top_k", -1, 1e9, &i, &have));
    if (have) r->sampling.top_k = i < 0 ? 0 : (int)i;
    AT_CHECK(number(r, o, "min_p", 0, 1, &d, &have));
    if (have) r->sampling.min_p = (float)d;
    AT_CHECK(number(r, o, "repetition_penalty", 1e-6, 1e6, &d, &have));
    if (have) r->sampling.repetition_penalty = (float)d;
    AT_CHECK(number(r, o, "presence_penalty", -2, 2, &d, &have));
    if (have) r->sampling.presence_penalty = (float)d;
    AT_CHECK(number(r, o, "frequency_penalty", -2, 2, &d, &have));
    if (have) r->sampling.frequency_penalty = (float)d;
    AT_CHECK(integer(r, o, "seed", -9.2e18, 9.2e18, &i, &have));
    if (have) {
        r->sampling.seed = (uint64_t)i;
        r->has_seed = 1;
    }
    AT_CHECK(boolean(r, o, "stream", &r->stream));
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            st = bad(r, "stream_options", "'%s' must be an object%s", NULL);
            goto done;
        }
        AT_CHECK(boolean(r, so, "include_usage", &r->include_usage));
    }
    AT_CHECK(parse_stop(r, o, lim));
done:
    cJSON_Delete(o);
    return st;
}

void at_serve_request_free(at_serve_request *r)
{
    free(r->model);
    cJSON_Delete(r->messages);
    for (int i = 0; i < r->n_images; i++) free(r->images[i]);
    free(r->images);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
