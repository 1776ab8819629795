#include "serve/response.h"

#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

/* Prints and frees o (unformatted). */
static char *print(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* A string item from len bytes (which need not end with a NUL). */
static cJSON *string_n(const char *s, size_t len)
{
    char *z = malloc(len + 1);
    if (!z) return NULL;
    memcpy(z, s, len);
    z[len] = 0;
    cJSON *item = cJSON_CreateString(z);
    free(z);
    return item;
}

static void add_or_null(cJSON *o, const char *key, const char *s)
{
    if (s) cJSON_AddStringToObject(o, key, s);
    else cJSON_AddNullToObject(o, key);
}

char *at_resp_error(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    if (!e) return print(o);
    cJSON_AddStringToObject(e, "message", message ? message : "");
    cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
    add_or_null(e, "param", param && param[0] ? param : NULL);
    add_or_null(e, "code", code);
    return print(o);
}

static cJSON *usage_obj(at_usage u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u.prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u.completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u.prompt_tokens + u.completion_tokens);
    if (u.cached_tokens >= 0) {
        cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
        if (d) cJSON_AddNumberToObject(d, "cached_tokens", u.cached_tokens);
    }
    return o;
}

static cJSON *head(at_request_kind kind, const char *id, long long created, const char *model, int chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", kind == AT_REQ_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                             : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

char *at_resp_full(at_request_kind kind, const char *id, long long created, const char *model, const char *text,
                   size_t len, const char *finish, at_usage usage)
{
    cJSON *o = head(kind, id, created, model, 0);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *t = string_n(text ? text : "", text ? len : 0);
    if (kind == AT_REQ_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", t);
    } else {
        cJSON_AddItemToObject(c, "text", t);
    }
    cJSON_AddNullToObject(c, "logprobs");
    add_or_null(c, "finish_reason", finish);
    cJSON_AddItemToObject(o, "usage", usage_obj(usage));
    return print(o);
}

char *at_resp_chunk(at_request_kind kind, const char *id, long long created, const char *model, int with_role,
                    const char *text, size_t len, const char *finish, const at_usage *usage, int usage_only)
{
    cJSON *o = head(kind, id, created, model, 1);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    if (!usage_only) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", 0);
        if (kind == AT_REQ_CHAT) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (with_role) cJSON_AddStringToObject(d, "role", "assistant");
            if (text) cJSON_AddItemToObject(d, "content", string_n(text, len));
        } else {
            cJSON_AddItemToObject(c, "text", string_n(text ? text : "", text ? len : 0));
        }
        cJSON_AddNullToObject(c, "logprobs");
        add_or_null(c, "finish_reason", finish);
    }
    if (usage) cJSON_AddItemToObject(o, "usage", usage_obj(*usage));
    return print(o);
}

char *at_resp_models(const char *base, const char *const *adapters, int n_adapters, const char *default_model,
                     long long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    add_or_null(o, "default_model", default_model);
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int i = -1; i < n_adapters; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(data, m);
        cJSON_AddStringToObject(m, "id", i < 0 ? base : adapters[i]);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)created);
        cJSON_AddStringToObject(m, "owned_by", "anytune");
        cJSON_AddStringToObject(m, "root", i < 0 ? base : adapters[i]);
        add_or_null(m, "parent", i < 0 ? NULL : base);
    }
    return print(o);
}
