#include "serve/webui.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "serve/response.h"
#include "serve/webui_train.h"
#include "train/objective.h"

struct at_webui {
    at_webui_opts o;
    char bind_host[64]; /* o.bind_host copied */
    at_train_job *job;  /* NULL without the Train tab */
};

at_status at_webui_new(const at_webui_opts *o, at_webui **out)
{
    *out = NULL;
    at_webui *ui = calloc(1, sizeof *ui);
    if (!ui) return at_error(AT_ERR_NOMEM, "out of memory");
    ui->o = *o;
    ui->o.train_program = NULL;
    snprintf(ui->bind_host, sizeof ui->bind_host, "%s", o->bind_host ? o->bind_host : "127.0.0.1");
    ui->o.bind_host = ui->bind_host;
    if (o->train) {
        at_status st = at_train_job_new(o->train_program, &ui->job);
        if (st != AT_OK) {
            free(ui);
            return st;
        }
    }
    *out = ui;
    return AT_OK;
}

void at_webui_free(at_webui *ui, double grace_s)
{
    if (!ui) return;
    at_train_job_free(ui->job, grace_s);
    free(ui);
}

int at_webui_owns(const char *url) { return !strcmp(url, "/") || !strncmp(url, "/ui/", 4); }

static const char *content_type_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    return "application/octet-stream";
}

/* r gets a JSON body (json freed by the caller through r->owned). */
static int json_reply(at_webui_reply *r, int status, char *json)
{
    if (!json) return 0;
    r->status = status;
    r->content_type = "application/json";
    r->body = r->owned = json;
    r->len = strlen(json);
    return 1;
}

static int error_reply(at_webui_reply *r, int status, const char *message, const char *param, const char *code)
{
    return json_reply(r, status, at_resp_error(message, status >= 500 ? "server_error" : "invalid_request_error",
                                               param && param[0] ? param : NULL, code));
}

static int config_reply(at_webui *ui, at_webui_reply *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return 0;
    cJSON_AddBoolToObject(o, "train", ui->job != NULL);
    cJSON_AddBoolToObject(o, "auth", ui->o.auth);
    /* the form starts filled with the bundled demo when it is at hand */
    cJSON *d = cJSON_AddObjectToObject(o, "defaults");
    if (d && at_file_exists("demo/stories260K")) cJSON_AddStringToObject(d, "model", "demo/stories260K");
    if (d && at_file_exists("demo/identity.json")) cJSON_AddStringToObject(d, "dataset", "demo/identity.json");
    if (d) cJSON_AddStringToObject(d, "output_dir", "output");
    /* the Train tab's objectives beyond sft: rlhf_type's choices in this build */
    char types[256];
    at_objective_rlhf_names(types, sizeof types);
    cJSON *rt = cJSON_AddArrayToObject(o, "rlhf_types");
    for (char *p = types; rt && *p;) {
        size_t len = strcspn(p, "|");
        int more = p[len] == '|';
        p[len] = 0;
        cJSON_AddItemToArray(rt, cJSON_CreateString(p));
        p += len + more;
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return json_reply(r, 200, s);
}

/* POST requests that change something: JSON only and from our own origin,
 * so that another site open in the same browser cannot start a job. */
static int refuse_cross_site(const at_webui_request *rq, at_webui_reply *r)
{
    const char *ct = rq->content_type;
    if (!ct || strncasecmp(ct, "application/json", 16) != 0)
        return error_reply(r, 415, "send the options as JSON (Content-Type: application/json)", NULL,
                           "unsupported_media_type");
    if (rq->origin) {
        const char *o = rq->origin;
        const char *h = rq->host ? rq->host : "";
        if (strncmp(o, "http://", 7) || strcmp(o + 7, h))
            return error_reply(r, 403, "cross-origin request refused", NULL, "forbidden");
    }
    return -1;
}

/* Whether the Host header names this server: a loopback name, or the
 * address it listens on. Listening on every interface (0.0.0.0) the names
 * it is reached by are unknown, so any is taken (the user chose --host).
 * No Host header (HTTP/1.0 clients, not browsers): taken. */
static int host_is_ours(const at_webui *ui, const char *host)
{
    if (!host || !strcmp(ui->bind_host, "0.0.0.0")) return 1;
    size_t n;
    if (host[0] == '[') { /* [v6]:port */
        const char *e = strchr(host, ']');
        n = e ? (size_t)(e - host) + 1 : strlen(host);
    } else {
        n = strcspn(host, ":");
    }
    static const char *loopback[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof loopback / sizeof loopback[0]; i++)
        if (strlen(loopback[i]) == n && !strncasecmp(host, loopback[i], n)) return 1;
    return strlen(ui->bind_host) == n && !strncmp(host, ui->bind_host, n);
}

static int train_api(at_webui *ui, const at_webui_request *rq, at_webui_reply *r)
{
    int is_get = !strcmp(rq->method, "GET"), is_post = !strcmp(rq->method, "POST");
    const char *u = rq->url;
    int start = !strcmp(u, "/ui/api/train"), status = !strcmp(u, "/ui/api/train/status"),
        stop = !strcmp(u, "/ui/api/train/stop");
    if (!start && !status && !stop) return error_reply(r, 404, "no such endpoint", NULL, "not_found");
    if (!ui->job)
        return error_reply(r, 404, "training from the browser is offered by `anytune web-ui`, not `anytune serve`",
                           NULL, "not_found");
    if (!rq->authorized)
        return error_reply(r, 401, "Incorrect or missing API key (send Authorization: Bearer KEY).", NULL,
                           "invalid_api_key");
    if (!host_is_ours(ui, rq->host))
        return error_reply(r, 403, "the Host header names neither this machine's loopback nor the address the server "
                           "listens on (DNS rebinding protection)", NULL, "forbidden");
    if (status) {
        if (!is_get) return error_reply(r, 405, "use GET", NULL, NULL);
        long since = rq->since ? strtol(rq->since, NULL, 10) : 0;
        return json_reply(r, 200, at_train_job_status_json(ui->job, since));
    }
    if (!is_post) return error_reply(r, 405, "use POST", NULL, NULL);
    int refused = refuse_cross_site(rq, r);
    if (refused >= 0) return refused;
    at_status st;
    char param[64] = "";
    if (start) {
        st = at_train_job_start(ui->job, rq->body, rq->len, param, sizeof param);
        if (st == AT_ERR_UNSUPPORTED) return error_reply(r, 409, at_last_error(), NULL, "job_running");
        if (st == AT_ERR_FORMAT || st == AT_ERR_INVALID) return error_reply(r, 400, at_last_error(), param, NULL);
    } else {
        st = at_train_job_stop(ui->job);
        if (st == AT_ERR_NOT_FOUND) return error_reply(r, 409, at_last_error(), NULL, "no_job");
    }
    if (st != AT_OK) return error_reply(r, 500, at_last_error(), NULL, NULL);
    return json_reply(r, 200, at_train_job_status_json(ui->job, 0));
}

int at_webui_handle(at_webui *ui, const at_webui_request *rq, at_webui_reply *r)
{
    memset(r, 0, sizeof *r);
    const char *u = rq->url;
    if (!strncmp(u, "/ui/api/", 8)) {
        if (!strcmp(u, "/ui/api/config")) {
            if (strcmp(rq->method, "GET")) return error_reply(r, 405, "use GET", NULL, NULL);
            return config_reply(ui, r);
        }
        return train_api(ui, rq, r);
    }
    /* the page and its files */
    const char *name = !strcmp(u, "/") ? "index.html" : !strncmp(u, "/ui/", 4) ? u + 4 : "";
    const unsigned char *data;
    size_t len;
    if (!name[0] || strchr(name, '/') || !at_webui_asset(name, &data, &len)) {
        char msg[300];
        snprintf(msg, sizeof msg, "no such file: %.200s", u);
        return error_reply(r, 404, msg, NULL, "not_found");
    }
    if (strcmp(rq->method, "GET") && strcmp(rq->method, "HEAD")) return error_reply(r, 405, "use GET", NULL, NULL);
    r->status = 200;
    r->content_type = content_type_of(name);
    r->body = data;
    r->len = len;
    return 1;
}
