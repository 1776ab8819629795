#include "serve/score_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/json.h"

static at_status bad(at_score_request *r, const char *param, const char *msg)
{
    snprintf(r->param, sizeof r->param, "%s", param);
    return at_error(AT_ERR_INVALID, "'%s' %s", param, msg);
}

/* A string or a non-empty list of strings: its items into *out[*n] (new
 * strings). */
static at_status texts(at_score_request *r, const cJSON *o, const char *key, size_t max, char ***out, size_t *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    *n = 0;
    if (!v || cJSON_IsNull(v)) return bad(r, key, "is required (a string or a list of strings)");
    size_t k = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? (size_t)cJSON_GetArraySize(v) : 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad(r, key, "must be a string or a list of strings");
    if (k == 0) return bad(r, key, "must not be an empty list");
    if (k > max) {
        char msg[96];
        snprintf(msg, sizeof msg, "has %zu items; a request scores at most %zu pairs", k, max);
        return bad(r, key, msg);
    }
    char **s = calloc(k, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    *out = s;
    *n = k;
    for (size_t i = 0; i < k; i++) {
        const cJSON *it = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, (int)i);
        if (!cJSON_IsString(it)) return bad(r, key, "must be a string or a list of strings");
        if (!(s[i] = strdup(it->valuestring))) return at_error(AT_ERR_NOMEM, "out of memory");
    }
    return AT_OK;
}

at_status at_score_request_parse(const char *body, size_t len, size_t max_pairs, at_score_request *req)
{
    memset(req, 0, sizeof *req);
    cJSON *j = NULL;
    if (at_json_parse(body, len, "request", &j) != AT_OK) {
        return at_error(AT_ERR_FORMAT, "the body is not valid JSON: %s", at_last_error());
    }
    at_status st = AT_OK;
    char **p = NULL, **q = NULL;
    size_t np = 0, nq = 0;
    if (!cJSON_IsObject(j)) {
        st = at_error(AT_ERR_FORMAT, "the body must be a JSON object");
        goto done;
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (m && !cJSON_IsNull(m)) {
        if (!cJSON_IsString(m)) {
            st = bad(req, "model", "must be a string");
            goto done;
        }
        if (!(req->model = strdup(m->valuestring))) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if ((st = texts(req, j, "text_1", max_pairs, &p, &np)) != AT_OK) goto done;
    if ((st = texts(req, j, "text_2", max_pairs, &q, &nq)) != AT_OK) goto done;
    if (np != 1 && np != nq) {
        char msg[128];
        snprintf(msg, sizeof msg, "has %zu items and text_2 %zu: give one prompt, or one per reply", np, nq);
        st = bad(req, "text_1", msg);
        goto done;
    }
    req->n = nq;
    req->replies = q;
    q = NULL;
    req->prompts = calloc(nq, sizeof *req->prompts);
    if (!req->prompts) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* one prompt for every reply: the same string (freed once, from its first slot) */
    for (size_t i = 0; i < nq; i++) req->prompts[i] = np == 1 ? p[0] : p[i];
    free(p);
    p = NULL;
    np = 0;
done:
    for (size_t i = 0; p && i < np; i++) free(p[i]);
    free(p);
    for (size_t i = 0; q && i < nq; i++) free(q[i]);
    free(q);
    cJSON_Delete(j);
    return st;
}

void at_score_request_free(at_score_request *req)
{
    if (req->prompts) {
        /* a shared prompt sits in every slot: free each distinct pointer once */
        for (size_t i = 0; i < req->n; i++)
            if (i == 0 || req->prompts[i] != req->prompts[0]) free(req->prompts[i]);
    }
    for (size_t i = 0; req->replies && i < req->n; i++) free(req->replies[i]);
    free(req->prompts);
    free(req->replies);
    free(req->model);
    memset(req, 0, sizeof *req);
}

char *at_resp_score(const char *id, long long created, const char *model, const double *scores, size_t n,
                    long long prompt_tokens)
{
    cJSON *j = cJSON_CreateObject(), *data = NULL, *u = NULL;
    int ok = j && cJSON_AddStringToObject(j, "id", id) && cJSON_AddStringToObject(j, "object", "list") &&
             cJSON_AddNumberToObject(j, "created", (double)created) && cJSON_AddStringToObject(j, "model", model) &&
             (data = cJSON_AddArrayToObject(j, "data")) != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(data, e)) {
            cJSON_Delete(e);
            ok = 0;
            break;
        }
        ok = cJSON_AddNumberToObject(e, "index", (double)i) && cJSON_AddStringToObject(e, "object", "score") &&
             cJSON_AddNumberToObject(e, "score", scores[i]);
    }
    ok = ok && (u = cJSON_AddObjectToObject(j, "usage")) != NULL &&
         cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens) &&
         cJSON_AddNumberToObject(u, "total_tokens", (double)prompt_tokens) &&
         cJSON_AddNumberToObject(u, "completion_tokens", 0);
    char *s = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return s;
}
