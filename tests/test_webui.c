/* The web UI (serve/webui.h, serve/webui_train.h), over real sockets:
 *  - GET / is the page (its controls are there), its files are the bytes of
 *    web/ with their content types, unknown files are 404;
 *  - the train endpoints refuse bad requests with 400 naming the option:
 *    unknown options, wrong types, out-of-range values, shell
 *    metacharacters in paths (passed literally, never run: the file the
 *    injected command would create does not appear), a leading '-';
 *    non-JSON bodies (415) and foreign origins (403);
 *  - a real 3-step `anytune sft` of the demo model, started through
 *    POST /ui/api/train, finishes; its status shows the run folder and the
 *    same logging rows the trainer wrote; the child is reaped;
 *  - a long job: a second start gets 409, stop ends it (SIGTERM) with its
 *    checkpoints whole (MANIFEST.sha256 verified), no zombie;
 *  - the job slot with stand-in programs (shell scripts): a program that
 *    cannot run is an error naming it; a child flooding its output keeps the
 *    last 64 lines and its exit code, and a run folder longer than a short
 *    line is read whole; stop ends a process the child started that holds
 *    the output open; a child ignoring SIGTERM is killed after the grace;
 *    the child (posix_spawn) inherits no descriptor but stdin /dev/null and
 *    its output pipe (not the server's socket, another job's pipe, or fds
 *    opened without O_CLOEXEC), no blocked or ignored SIGTERM/SIGINT/SIGPIPE,
 *    and leads its own process group;
 *  - `anytune serve` has the page but not the train endpoints; an API key
 *    guards the train endpoints but not the page;
 *  - `anytune web-ui` without --api_key prints its URL with a random token
 *    (>= 128 bits, another on each start): without it (or with a wrong one)
 *    the train endpoints and the OpenAI API answer 401, with it they work;
 *    --api_key K prints ?token=K;
 *  - a web-ui killed with SIGKILL: its running job stops as Stop stops it
 *    (the death signal the trainer asked for becomes one SIGTERM: exit 143)
 *    and its last logged step is checkpointed;
 *  - the program: tests/js/webui_check.mjs drives the page opened from the
 *    printed URL in Debian's chromium (playwright-core): it sends the token,
 *    which leaves the address bar; SIGTERM stops the server and the job it
 *    runs. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "http_client.h"
#include "infer/bundle.h"
#include "model/loader.h"
#include "serve/server.h"
#include "serve/webui_train.h"
#include "testing.h"
#include "train/run_files.h"

#define BIN "tests/data/models/stories260K.bin"
#define TOKENIZER "tests/data/goldens/tok512.bin"
#define DEMO_MODEL "demo/stories260K"
#define DEMO_DATA "demo/identity.json"

static char tmp[64];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cJSON *get_json(int port, const char *method, const char *path, const char *headers, const char *body,
                       int *status)
{
    http_resp r;
    *status = 0;
    if (!http(port, method, path, headers, body, &r)) return NULL;
    *status = r.status;
    cJSON *j = cJSON_Parse(r.body);
    if (!j) fprintf(stderr, "not JSON (%d): %s\n", r.status, r.body);
    free(r.body);
    return j;
}

static const char *jstr(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *a)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* ---- the page ------------------------------------------------------------------------ */

static void expect_file(int port, const char *url, const char *file, const char *type)
{
    http_resp r;
    char ct[128];
    CHECK(http(port, "GET", url, NULL, NULL, &r));
    CHECK_MSG(r.status == 200, "GET %s: %d", url, r.status);
    const char *got = http_header(&r, "Content-Type", ct, sizeof ct);
    CHECK_MSG(got && !strncmp(got, type, strlen(type)), "GET %s: Content-Type %s, want %s", url, got ? got : "none",
              type);
    /* the embedded bytes are the source file's */
    char *want = NULL;
    size_t want_len = 0;
    CHECK_OK(at_read_file(file, &want, &want_len));
    CHECK_MSG(want && r.len == want_len && !memcmp(r.body, want, want_len), "GET %s differs from %s", url, file);
    free(want);
    free(r.body);
}

static void test_page(int port)
{
    http_resp r;
    char buf[512];
    CHECK(http(port, "GET", "/", NULL, NULL, &r) && r.status == 200);
    const char *b = r.body ? r.body : "";
    CHECK(http_header(&r, "Content-Type", buf, sizeof buf) && !strncmp(buf, "text/html", 9));
    /* every resource from this server: a CSP that forbids others, no CDN */
    CHECK(http_header(&r, "Content-Security-Policy", buf, sizeof buf) && strstr(buf, "default-src 'self'"));
    static const char *const want[] = {"id=\"messages\"", "id=\"prompt\"", "id=\"send\"", "id=\"stop\"",
                                       "id=\"regenerate\"", "id=\"clear\"", "id=\"system\"", "id=\"temperature\"",
                                       "id=\"top_p\"", "id=\"top_k\"", "id=\"max_tokens\"", "id=\"repetition_penalty\"",
                                       "id=\"model\"", "id=\"api-key\"", "id=\"train-form\"", "id=\"loss-chart\"",
                                       "src=\"/ui/chat.js\"", "href=\"/ui/app.css\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(b, want[i]), "the page lacks %s", want[i]);
    CHECK(!strstr(b, "http://") && !strstr(b, "https://"));
    free(r.body);
    expect_file(port, "/", "web/index.html", "text/html");
    expect_file(port, "/ui/app.css", "web/app.css", "text/css");
    expect_file(port, "/ui/app.js", "web/app.js", "text/javascript");
    expect_file(port, "/ui/chat.js", "web/chat.js", "text/javascript");
    expect_file(port, "/ui/train.js", "web/train.js", "text/javascript");
    static const char *const missing[] = {"/ui/nothing.js", "/ui/", "/ui/../CMakeLists.txt", "/ui/web/app.js",
                                          "/ui/embed.cmake"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        CHECK(http(port, "GET", missing[i], NULL, NULL, &r));
        CHECK_MSG(r.status == 404, "GET %s: %d, want 404", missing[i], r.status);
        free(r.body);
    }
    CHECK(http(port, "POST", "/", NULL, "{}", &r) && r.status == 405);
    free(r.body);
}

/* ---- the train endpoints: bad requests ------------------------------------------------- */

static void expect_400(int port, const char *body, int status, const char *param)
{
    int st;
    cJSON *j = get_json(port, "POST", "/ui/api/train", NULL, body, &st);
    const char *msg = jstr(j, "error", "message"), *p = jstr(j, "error", "param");
    CHECK_MSG(st == status && msg && msg[0], "%.200s: status %d, want %d", body, st, status);
    if (param)
        CHECK_MSG(p && !strcmp(p, param) && strstr(msg, param), "%.200s: param %s (%s), want %s", body,
                  p ? p : "null", msg ? msg : "", param);
    cJSON_Delete(j);
}

static void test_bad_requests(int port)
{
    char body[1024], marker[128];
    snprintf(marker, sizeof marker, "%s/pwned", tmp);
    expect_400(port, "{\"model\": ", 400, NULL);
    expect_400(port, "", 400, NULL);
    expect_400(port, "[\"model\"]", 400, NULL);
    /* data after the object is refused, not ignored (it carried an option past the check) */
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}\"max_steps\": 1}", 400, NULL);
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"rm\": 1}", 400, "rm");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"config\": \"x.yaml\"}", 400,
               "config");
    expect_400(port, "{\"dataset\": \"" DEMO_DATA "\"}", 400, "model");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\"}", 400, "dataset");
    /* shell metacharacters: refused, and nothing ran them */
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "; touch %s\"}", marker);
    expect_400(port, body, 400, "dataset");
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"output_dir\": "
             "\"$(touch %s)\"}", marker);
    expect_400(port, body, 400, "output_dir");
    snprintf(body, sizeof body, "{\"model\": \"`touch %s`\", \"dataset\": \"" DEMO_DATA "\"}", marker);
    expect_400(port, body, 400, "model");
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"output_dir\": "
             "\"%s/a|b\"}", tmp);
    expect_400(port, body, 400, "output_dir");
    /* a path that would read as an option, a missing file, a bad FILE#N */
    expect_400(port, "{\"model\": \"--config=/etc/passwd\", \"dataset\": \"" DEMO_DATA "\"}", 400, "model");
    expect_400(port, "{\"model\": \"demo/no-such-model\", \"dataset\": \"" DEMO_DATA "\"}", 400, "model");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "#x\"}", 400, "dataset");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": [\"" DEMO_DATA "\", 3]}", 400, "dataset");
    /* types and ranges */
    static const char *const bad[][2] = {
        {"\"lora_rank\": \"8\"", "lora_rank"},
        {"\"lora_rank\": 2.5", "lora_rank"},
        {"\"lora_rank\": 0", "lora_rank"},
        {"\"learning_rate\": \"fast\"", "learning_rate"},
        {"\"learning_rate\": -1", "learning_rate"},
        {"\"num_train_epochs\": true", "num_train_epochs"},
        {"\"max_steps\": [3]", "max_steps"},
        {"\"per_device_train_batch_size\": 0", "per_device_train_batch_size"},
        {"\"train_type\": \"dpo\"", "train_type"},
        {"\"train_type\": 1", "train_type"},
        {"\"packing\": \"yes\"", "packing"},
        {"\"device\": \"cuda:x\"", "device"},
        {"\"model_name\": \"a\\nb\"", "model_name"},
        {"\"output_dir\": \"\"", "output_dir"},
        {"\"max_length\": 1e300", "max_length"},
        {"\"lora_rank\": 8, \"lora_rank\": 16", "lora_rank"},
        {"\"neftune_noise_alpha\": -1", "neftune_noise_alpha"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", %s}", bad[i][0]);
        expect_400(port, body, 400, bad[i][1]);
    }
    CHECK_MSG(!at_file_exists(marker), "%s exists: a value reached a shell", marker);
    /* not JSON, another site, wrong methods, nothing to stop */
    int st;
    cJSON *j = get_json(port, "POST", "/ui/api/train", "Content-Type: text/plain\r\n",
                        "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}", &st);
    CHECK_MSG(st == 415, "text/plain body: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "POST", "/ui/api/train", "Origin: http://evil.example\r\n",
                 "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}", &st);
    CHECK_MSG(st == 403, "foreign origin: %d", st);
    cJSON_Delete(j);
    /* DNS rebinding: a foreign name resolving to this machine is same-origin
     * for the browser, so the Host header itself must be ours */
    j = get_json(port, "POST", "/ui/api/train", "Host: rebind.example\r\nOrigin: http://rebind.example\r\n",
                 "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}", &st);
    CHECK_MSG(st == 403, "foreign Host on start: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/train/status", "Host: rebind.example:7860\r\n", NULL, &st);
    CHECK_MSG(st == 403, "foreign Host on status: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/train/status", "Host: 127.0.0.1:7860\r\n", NULL, &st);
    CHECK_MSG(st == 200, "Host 127.0.0.1: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/train", NULL, NULL, &st);
    CHECK(st == 405);
    cJSON_Delete(j);
    j = get_json(port, "POST", "/ui/api/train/status", NULL, "{}", &st);
    CHECK(st == 405);
    cJSON_Delete(j);
    j = get_json(port, "POST", "/ui/api/train/stop", "Origin: http://localhost\r\n", "{}", &st);
    CHECK_MSG(st == 409, "stop with no job: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/nothing", NULL, NULL, &st);
    CHECK(st == 404);
    cJSON_Delete(j);
    /* a body over the server's limit */
    size_t huge = 80000;
    char *big = malloc(huge + 1);
    memset(big, ' ', huge);
    memcpy(big, "{}", 2);
    big[huge] = 0;
    j = get_json(port, "POST", "/ui/api/train", NULL, big, &st);
    CHECK_MSG(st == 413, "big body: %d", st);
    cJSON_Delete(j);
    free(big);
    printf("bad requests: refused with the option named; nothing reached a shell\n");
}

/* ---- the train endpoints: real jobs ---------------------------------------------------- */

/* Polls the status until `until` says stop or timeout_s passes; returns the last status. */
static cJSON *poll_status(int port, const char *headers, int (*until)(const cJSON *), double timeout_s)
{
    double t0 = now_s();
    cJSON *j = NULL;
    for (;;) {
        int st;
        cJSON_Delete(j);
        j = get_json(port, "GET", "/ui/api/train/status", headers, NULL, &st);
        if (!j || st != 200 || until(j) || now_s() - t0 > timeout_s) return j;
        usleep(50 * 1000);
    }
}

static int not_running(const cJSON *j)
{
    const char *s = jstr(j, "state", NULL);
    return s && strcmp(s, "running") && strcmp(s, "starting");
}

static int six_rows(const cJSON *j) { return not_running(j) || jnum(j, "log_total") >= 6; }

/* The pid is gone: reaped (a zombie would still accept signal 0). */
static int reaped(int pid)
{
    if (pid <= 0) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", pid);
    return kill(pid, 0) != 0 && errno == ESRCH && !at_file_exists(path);
}

static void test_short_job(int port)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"max_steps\": 3, "
             "\"logging_steps\": 1, \"lora_rank\": 4, \"learning_rate\": 0.001, \"neftune_noise_alpha\": 5, "
             "\"output_dir\": \"%s/short\"}", tmp);
    int st;
    double t0 = now_s();
    cJSON *j = get_json(port, "POST", "/ui/api/train", "Origin: http://localhost\r\n", body, &st);
    CHECK_MSG(st == 200 && jnum(j, "pid") > 0, "start: %d %s", st, jstr(j, "error", "message"));
    const cJSON *argv = cJSON_GetObjectItemCaseSensitive(j, "argv");
    CHECK(cJSON_GetArraySize(argv) == 10 && !strcmp(cJSON_GetArrayItem(argv, 1)->valuestring, "sft"));
    int neftune = 0;
    for (int i = 0; i < cJSON_GetArraySize(argv); i++)
        neftune += !strcmp(cJSON_GetArrayItem(argv, i)->valuestring, "--neftune_noise_alpha=5");
    CHECK_MSG(neftune == 1, "neftune_noise_alpha did not reach the job's argv");
    cJSON_Delete(j);
    j = poll_status(port, NULL, not_running, 60);
    const char *state = jstr(j, "state", NULL), *run_dir = jstr(j, "run_dir", NULL);
    CHECK_MSG(state && !strcmp(state, "finished") && jnum(j, "exit_code") == 0, "state %s exit %g", state,
              jnum(j, "exit_code"));
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/short/v", tmp);
    CHECK_MSG(run_dir && !strncmp(run_dir, prefix, strlen(prefix)), "run_dir %s", run_dir ? run_dir : "null");
    CHECK(jnum(j, "log_total") == 3);
    /* the rows are those the trainer wrote */
    char *logp = run_dir ? at_path_join(run_dir, "logging.jsonl") : NULL, *text = NULL;
    size_t len = 0;
    if (logp) CHECK_OK(at_read_file(logp, &text, &len));
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(j, "log");
    CHECK(cJSON_GetArraySize(rows) == 3);
    char *line = text, *save = NULL;
    int i = 0;
    for (char *l = text ? strtok_r(line, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save), i++) {
        cJSON *want = cJSON_Parse(l);
        const cJSON *got = cJSON_GetArrayItem(rows, i);
        CHECK_MSG(want && got && cJSON_Compare(want, got, 1), "row %d differs from logging.jsonl", i);
        CHECK(jnum(got, "step") == i + 1 && jnum(got, "loss") > 0);
        cJSON_Delete(want);
    }
    CHECK(i == 3);
    /* ?since=2: the last row only */
    cJSON *k = get_json(port, "GET", "/ui/api/train/status?since=2", NULL, NULL, &st);
    rows = cJSON_GetObjectItemCaseSensitive(k, "log");
    CHECK(st == 200 && cJSON_GetArraySize(rows) == 1 && jnum(cJSON_GetArrayItem(rows, 0), "step") == 3);
    cJSON_Delete(k);
    char *ck = run_dir ? at_path_join(run_dir, "checkpoint-3") : NULL;
    CHECK(ck && at_is_dir(ck));
    if (ck) CHECK_OK(at_manifest_verify(ck));
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(j, "output");
    CHECK(cJSON_GetArraySize(out) > 0);
    CHECK_MSG(reaped((int)jnum(j, "pid")), "the finished job's process %g was not reaped", jnum(j, "pid"));
    printf("short job: 3 steps through POST /ui/api/train in %.2f s, 3 logging rows equal to %s/logging.jsonl\n",
           now_s() - t0, run_dir ? run_dir : "?");
    free(ck);
    free(text);
    free(logp);
    cJSON_Delete(j);
}

/* rlhf_type makes the job `anytune rlhf` with its own options, checked
 * against rlhf's option table (ranges) and the objectives of this build;
 * a kto run goes to its end and logs KTO's fields. */
static void test_kto_job(int port)
{
    /* the config lists the objectives the select offers */
    int st;
    cJSON *c = get_json(port, "GET", "/ui/api/config", NULL, NULL, &st);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(c, "rlhf_types");
    int kto = 0, rm = 0, dpo = 0;
    for (int i = 0; i < cJSON_GetArraySize(types); i++) {
        const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(types, i));
        kto += t && !strcmp(t, "kto");
        rm += t && !strcmp(t, "rm");
        dpo += t && !strcmp(t, "dpo");
    }
    CHECK_MSG(st == 200 && kto == 1 && rm == 1 && dpo == 1, "config rlhf_types lacks dpo, kto or rm");
    cJSON_Delete(c);
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"beta\": 0.1}", 400, "beta");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"rlhf_type\": \"ppo\"}", 400,
               "rlhf_type");
    /* --beta's table range is [0, inf) (grpo's 0 means no reference pass); kto's own check
     * refusing 0 is the library's, as on the command line */
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"rlhf_type\": \"kto\", "
               "\"beta\": -0.5}", 400, "beta");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"rlhf_type\": \"kto\", "
               "\"desirable_weight\": -1}", 400, "desirable_weight");
    expect_400(port, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"rlhf_type\": \"kto\", "
               "\"ref_model\": \"no/such/model\"}", 400, "ref_model");

    char body[1024];
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"tests/data/kto/kto_en_demo_8.json\", "
             "\"rlhf_type\": \"kto\", \"beta\": 0.25, \"desirable_weight\": 1.5, \"undesirable_weight\": 0.5, "
             "\"per_device_train_batch_size\": 2, \"max_steps\": 2, \"logging_steps\": 1, \"max_length\": 96, "
             "\"output_dir\": \"%s/kto\"}", tmp);
    cJSON *j = get_json(port, "POST", "/ui/api/train", "Origin: http://localhost\r\n", body, &st);
    CHECK_MSG(st == 200 && jnum(j, "pid") > 0, "kto start: %d %s", st, jstr(j, "error", "message"));
    const cJSON *argv = cJSON_GetObjectItemCaseSensitive(j, "argv");
    int found = 0;
    static const char *const want[] = {"--rlhf_type=kto", "--beta=0.25", "--desirable_weight=1.5",
                                       "--undesirable_weight=0.5"};
    for (int i = 0; i < cJSON_GetArraySize(argv); i++)
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            found += !strcmp(cJSON_GetArrayItem(argv, i)->valuestring, want[k]);
    CHECK_MSG(cJSON_GetArraySize(argv) > 1 && !strcmp(cJSON_GetArrayItem(argv, 1)->valuestring, "rlhf") && found == 4,
              "kto argv: %d of the rlhf options", found);
    cJSON_Delete(j);
    j = poll_status(port, NULL, not_running, 120);
    const char *state = jstr(j, "state", NULL);
    CHECK_MSG(state && !strcmp(state, "finished") && jnum(j, "exit_code") == 0, "kto state %s exit %g",
              state ? state : "?", jnum(j, "exit_code"));
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(j, "log");
    CHECK_MSG(cJSON_GetArraySize(rows) == 2, "kto logged %d rows", cJSON_GetArraySize(rows));
    for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "kl")) && jnum(r, "loss") > 0,
                  "kto row %d has no kl (not a KTO run?)", i);
    }
    printf("kto job: `anytune rlhf --rlhf_type kto` through POST /ui/api/train, 2 steps with kl logged\n");
    cJSON_Delete(j);
}

static void test_long_job_stop(int port)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": [\"" DEMO_DATA "\"], \"max_steps\": "
             "1000000, \"logging_steps\": 1, \"save_steps\": 5, \"save_total_limit\": 2, \"output_dir\": \"%s/long\"}",
             tmp);
    int st;
    cJSON *j = get_json(port, "POST", "/ui/api/train", NULL, body, &st);
    int pid = (int)jnum(j, "pid");
    CHECK_MSG(st == 200 && pid > 0, "start: %d %s", st, jstr(j, "error", "message"));
    cJSON_Delete(j);
    /* one job at a time */
    j = get_json(port, "POST", "/ui/api/train", NULL, body, &st);
    CHECK_MSG(st == 409 && jstr(j, "error", "message"), "second start: %d", st);
    cJSON_Delete(j);
    j = poll_status(port, NULL, six_rows, 60);
    CHECK_MSG(jnum(j, "log_total") >= 6, "the long job logged %g rows", jnum(j, "log_total"));
    char *run_dir = jstr(j, "run_dir", NULL) ? strdup(jstr(j, "run_dir", NULL)) : NULL;
    cJSON_Delete(j);
    double t0 = now_s();
    j = get_json(port, "POST", "/ui/api/train/stop", NULL, "{}", &st);
    CHECK(st == 200);
    cJSON_Delete(j);
    j = poll_status(port, NULL, not_running, 20);
    const char *state = jstr(j, "state", NULL);
    /* the trainer finishes its step, checkpoints it and exits as a shell
     * reports SIGTERM (128 + 15) */
    CHECK_MSG(state && !strcmp(state, "stopped") && jnum(j, "exit_code") == 128 + SIGTERM,
              "after stop: %s, exit code %g, signal %g", state ? state : "?", jnum(j, "exit_code"), jnum(j, "signal"));
    double rows = jnum(j, "log_total");
    CHECK_MSG(reaped(pid), "the stopped job's process %d was not reaped", pid);
    printf("long job: 409 for a second start; stopped after %g rows in %.0f ms\n", jnum(j, "log_total"),
           (now_s() - t0) * 1000);
    cJSON_Delete(j);
    /* the checkpoints on disk are whole */
    char *ck = NULL;
    int64_t step = 0;
    if (run_dir) CHECK_OK(at_ckpt_find_last(run_dir, &ck, &step));
    CHECK(ck && step >= 5);
    /* no finished step lost: the last logged step is checkpointed */
    CHECK_MSG(step == (int64_t)rows, "newest checkpoint %lld, %g steps logged", (long long)step, rows);
    if (ck) CHECK_OK(at_manifest_verify(ck));
    free(ck);
    free(run_dir);
}

/* ---- the job slot with stand-in programs --------------------------------------------------- */

/* Writes an executable shell script tmp/NAME and returns its path (static buffer). */
static const char *script(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    CHECK_OK(at_write_file_atomic(path, text, strlen(text)));
    CHECK(chmod(path, 0755) == 0);
    return path;
}

/* Waits for the job to leave the running state; returns its status (cJSON). */
static cJSON *job_wait(at_train_job *j, int (*until)(const cJSON *), double timeout_s)
{
    double t0 = now_s();
    for (;;) {
        char *text = at_train_job_status_json(j, 0);
        cJSON *s = text ? cJSON_Parse(text) : NULL;
        free(text);
        if (!s || until(s) || now_s() - t0 > timeout_s) return s;
        cJSON_Delete(s);
        usleep(20 * 1000);
    }
}

/* The output's last line is "started PID" (the pid of a process the script put in the background). */
static int started(const cJSON *s)
{
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(s, "output");
    int n = cJSON_GetArraySize(out);
    return not_running(s) || (n > 0 && cJSON_IsString(cJSON_GetArrayItem(out, n - 1)) &&
                              !strncmp(cJSON_GetArrayItem(out, n - 1)->valuestring, "started", 7));
}

static int last_pid(const cJSON *s)
{
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(s, "output");
    const cJSON *l = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
    return cJSON_IsString(l) ? atoi(l->valuestring + 7) : 0;
}

/* Whether pid (not our child) ends within timeout_s: gone, or a zombie
 * waiting for whoever adopted it. */
static int dies(int pid, double timeout_s)
{
    double t0 = now_s();
    for (;;) {
        char path[64], *stat = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        if (kill(pid, 0) != 0) return 1;
        if (at_read_file(path, &stat, &len) == AT_OK) {
            const char *paren = strrchr(stat, ')');
            int zombie = paren && paren[1] == ' ' && paren[2] == 'Z';
            free(stat);
            if (zombie) return 1;
        }
        at_clear_error();
        if (now_s() - t0 > timeout_s) return 0;
        usleep(10 * 1000);
    }
}

static void test_job_processes(void)
{
    const char *body = "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}";
    char param[64], path[256];
    at_train_job *j = NULL;

    /* a program that cannot run: an error naming it, before any answer says "running" */
    snprintf(path, sizeof path, "%s/no-such-program", tmp);
    CHECK_OK(at_train_job_new(path, &j));
    if (!j) return;
    CHECK(at_train_job_start(j, body, strlen(body), param, sizeof param) == AT_ERR_IO);
    CHECK_MSG(strstr(at_last_error(), "no-such-program") && strstr(at_last_error(), "No such file"), "%s",
              at_last_error());
    at_train_job_free(j, 1);

    /* a flood: 20000 lines, then one long line without its newline, exit 3;
     * the run folder is announced in a line of ~900 bytes */
    char long_dir[700];
    memset(long_dir, 'd', sizeof long_dir - 1);
    long_dir[sizeof long_dir - 1] = 0;
    char text[2048];
    snprintf(text, sizeof text,
             "#!/bin/sh\necho \"anytune: full fine-tuning on cpu: 3 training samples, 3 steps (3 per epoch), 1 "
             "trainable parameters; output in %s/%s\"\ni=0\nwhile [ $i -lt 20000 ]; do echo \"line $i of the "
             "flood\"; i=$((i+1)); done\nhead -c 100000 /dev/zero | tr '\\0' x\nexit 3\n",
             tmp, long_dir);
    CHECK_OK(at_train_job_new(script("flood.sh", text), &j));
    if (!j) return;
    double t0 = now_s();
    CHECK_OK(at_train_job_start(j, body, strlen(body), param, sizeof param));
    cJSON *s = job_wait(j, not_running, 60);
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(s, "output");
    int n = cJSON_GetArraySize(out);
    const cJSON *last = cJSON_GetArrayItem(out, n - 1), *before = cJSON_GetArrayItem(out, n - 2);
    CHECK_MSG(jstr(s, "state", NULL) && !strcmp(jstr(s, "state", NULL), "failed") && jnum(s, "exit_code") == 3,
              "flood: state %s, exit %g", jstr(s, "state", NULL), jnum(s, "exit_code"));
    CHECK_MSG(n == 64, "flood: %d lines kept, want the last 64", n);
    CHECK(cJSON_IsString(before) && !strcmp(before->valuestring, "line 19999 of the flood"));
    /* the unterminated last line: kept (cut, all x) */
    CHECK(cJSON_IsString(last) && strlen(last->valuestring) >= 512 && strlen(last->valuestring) < 100000 &&
          strspn(last->valuestring, "x") == strlen(last->valuestring));
    const char *rd = jstr(s, "run_dir", NULL);
    snprintf(path, sizeof path, "%s/", tmp);
    CHECK_MSG(rd && strlen(rd) == strlen(path) + strlen(long_dir) && !strncmp(rd, path, strlen(path)),
              "flood: run_dir of %zu bytes, want %zu", rd ? strlen(rd) : 0, strlen(path) + strlen(long_dir));
    CHECK(reaped((int)jnum(s, "pid")));
    printf("flood: 20002 lines in %.2f s, the last 64 kept, exit code 3, a %zu-byte run folder read whole\n",
           now_s() - t0, rd ? strlen(rd) : 0);
    cJSON_Delete(s);
    at_train_job_free(j, 1);

    /* stop: the child's own child holds the output pipe; both end */
    CHECK_OK(at_train_job_new(script("bg.sh", "#!/bin/sh\nsleep 1000 &\necho started $!\nwait\n"), &j));
    if (!j) return;
    CHECK_OK(at_train_job_start(j, body, strlen(body), param, sizeof param));
    s = job_wait(j, started, 20);
    int bg = last_pid(s);
    CHECK_MSG(bg > 0, "bg.sh did not start");
    cJSON_Delete(s);
    t0 = now_s();
    CHECK_OK(at_train_job_stop(j));
    s = job_wait(j, not_running, 10);
    CHECK_MSG(jstr(s, "state", NULL) && !strcmp(jstr(s, "state", NULL), "stopped"), "stop: state %s",
              jstr(s, "state", NULL));
    CHECK_MSG(dies(bg, 5), "the background process %d outlived the stop", bg);
    printf("stop: the job and the process it started ended in %.0f ms\n", (now_s() - t0) * 1000);
    cJSON_Delete(s);
    at_train_job_free(j, 1);

    /* a child that ignores SIGTERM: killed after the grace */
    CHECK_OK(at_train_job_new(script("deaf.sh", "#!/bin/sh\ntrap '' TERM\necho started $$\n"
                                                "while :; do sleep 0.05; done\n"), &j));
    if (!j) return;
    CHECK_OK(at_train_job_start(j, body, strlen(body), param, sizeof param));
    s = job_wait(j, started, 20);
    int pid = (int)jnum(s, "pid");
    cJSON_Delete(s);
    t0 = now_s();
    at_train_job_free(j, 0.3);
    double took = now_s() - t0;
    CHECK_MSG(took >= 0.25 && took < 5, "free with a 0.3 s grace took %.2f s", took);
    CHECK_MSG(reaped(pid), "the process %d that ignored SIGTERM is still there", pid);
    printf("deaf: SIGKILL after the 0.3 s grace, freed in %.0f ms\n", took * 1000);
}

/* What the child inherits (posix_spawn's file actions and attributes): run
 * while the server listens and another job runs, with a socket and a pipe
 * this process opened without O_CLOEXEC, SIGTERM/SIGINT blocked in the
 * starting thread and ignored (as SIGPIPE is): the child has stdin
 * /dev/null, stdout and stderr one pipe and no other descriptor, an empty
 * signal mask, SIGINT/SIGPIPE/SIGTERM not ignored, and leads its own
 * process group. */
static void test_child_fds(void)
{
    const char *body = "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}";
    char param[64];
    at_train_job *other = NULL, *j = NULL;
    CHECK_OK(at_train_job_new(script("other.sh", "#!/bin/sh\necho started $$\nexec sleep 1000\n"), &other));
    if (!other) return;
    CHECK_OK(at_train_job_start(other, body, strlen(body), param, sizeof param));
    cJSON *s = job_wait(other, started, 20);
    cJSON_Delete(s);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* descriptors opened without O_CLOEXEC elsewhere in a server: closed in the child too */
    int sock = socket(AF_INET, SOCK_STREAM, 0), plain[2] = {-1, -1};
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(sock >= 0 && bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(sock, 1) == 0);
    CHECK(pipe(plain) == 0);
#endif
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* the monitor thread inherits it */
    void (*old_term)(int) = signal(SIGTERM, SIG_IGN), (*old_int)(int) = signal(SIGINT, SIG_IGN);
    CHECK_OK(at_train_job_new(script("fds.sh", "#!/bin/sh\necho \"pgrp $(cut -d' ' -f5 /proc/$$/stat) pid $$\"\n"
                                               /* read by the shell itself: it blocks signals while it waits */
                                               "while read -r k v; do case $k in SigBlk:|SigIgn:) echo \"$k $v\";; "
                                               "esac; done </proc/$$/status\n"
                                               "exec ls -l /proc/self/fd/\n"), &j));
    if (j) CHECK_OK(at_train_job_start(j, body, strlen(body), param, sizeof param));
    signal(SIGTERM, old_term);
    signal(SIGINT, old_int);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    s = j ? job_wait(j, not_running, 20) : NULL;
    CHECK_MSG(jstr(s, "state", NULL) && !strcmp(jstr(s, "state", NULL), "finished"), "fds.sh: state %s",
              jstr(s, "state", NULL));
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(s, "output"), *l;
    int fds = 0, leaked = 0, pgrp = -1, pid = -2, masks = 0;
    char pipe1[64] = "", pipe2_[64] = "";
    cJSON_ArrayForEach(l, out)
    {
        const char *t = cJSON_IsString(l) ? l->valuestring : "", *arrow = strstr(t, " -> ");
        if (!strncmp(t, "pgrp ", 5)) {
            CHECK(sscanf(t, "pgrp %d pid %d", &pgrp, &pid) == 2);
        } else if (!strncmp(t, "SigBlk:", 7)) {
            masks++;
            CHECK_MSG(strtoull(t + 7, NULL, 16) == 0, "the child starts with signals blocked: %s", t);
        } else if (!strncmp(t, "SigIgn:", 7)) {
            masks++;
            unsigned long long ign = strtoull(t + 7, NULL, 16);
            CHECK_MSG(!(ign & (1ull << (SIGTERM - 1))) && !(ign & (1ull << (SIGINT - 1))) &&
                      !(ign & (1ull << (SIGPIPE - 1))), "the child starts with SIGTERM/SIGINT/SIGPIPE ignored: %s", t);
        } else if (arrow) {
            const char *num = arrow;
            while (num > t && num[-1] != ' ') num--;
            int fd = atoi(num);
            const char *target = arrow + 4;
            fds++;
            if (fd == 0)
                CHECK_MSG(!strcmp(target, "/dev/null"), "the child's stdin is %s", target);
            else if (fd == 1)
                snprintf(pipe1, sizeof pipe1, "%s", target);
            else if (fd == 2)
                snprintf(pipe2_, sizeof pipe2_, "%s", target);
            else if (strncmp(target, "/proc/", 6)) { /* ls's own listing of the folder */
                leaked++;
                fprintf(stderr, "the child inherited fd %d -> %s\n", fd, target);
            }
        }
    }
    CHECK_MSG(pgrp > 0 && pgrp == pid, "the child's process group %d, its pid %d", pgrp, pid);
    CHECK(masks == 2);
    CHECK_MSG(!strncmp(pipe1, "pipe:", 5) && !strcmp(pipe1, pipe2_), "stdout %s, stderr %s", pipe1, pipe2_);
    CHECK_MSG(fds >= 3 && leaked == 0, "%d descriptors listed, %d leaked", fds, leaked);
    printf("child fds: %d listed (0 /dev/null, 1 and 2 %s), none leaked; its own process group; empty mask\n", fds,
           pipe1);
    cJSON_Delete(s);
    at_train_job_free(j, 1);
    at_train_job_free(other, 1);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    if (sock >= 0) close(sock);
    for (int i = 0; i < 2; i++)
        if (plain[i] >= 0) close(plain[i]);
#endif
}

/* ---- serve vs web-ui, the API key ---------------------------------------------------- */

static void test_modes(at_bundle *b, const char *program)
{
    at_server_opts o = {0};
    o.api_key = "sekrit";
    o.webui_train = 1;
    o.webui_train_program = program;
    at_server *s = NULL;
    CHECK_OK(at_server_start(b, &o, &s));
    if (!s) return;
    int port = at_server_port(s), st;
    http_resp r;
    CHECK(http(port, "GET", "/", NULL, NULL, &r) && r.status == 200); /* the page asks for the key itself */
    free(r.body);
    cJSON *j = get_json(port, "GET", "/ui/api/config", NULL, NULL, &st);
    CHECK(st == 200 && cJSON_IsTrue(cJSON_GetObjectItem(j, "auth")) && cJSON_IsTrue(cJSON_GetObjectItem(j, "train")));
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/train/status", NULL, NULL, &st);
    CHECK_MSG(st == 401, "status without the key: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "POST", "/ui/api/train", "Authorization: Bearer wrong\r\n", "{}", &st);
    CHECK_MSG(st == 401, "start with a wrong key: %d", st);
    cJSON_Delete(j);
    j = get_json(port, "GET", "/ui/api/train/status", "Authorization: Bearer sekrit\r\n", NULL, &st);
    CHECK(st == 200 && jstr(j, "state", NULL) && !strcmp(jstr(j, "state", NULL), "idle"));
    cJSON_Delete(j);
    at_server_stop(s, 5);

    /* anytune serve: the chat page, no training */
    at_server_opts p = {0};
    CHECK_OK(at_server_start(b, &p, &s));
    if (!s) return;
    port = at_server_port(s);
    j = get_json(port, "GET", "/ui/api/config", NULL, NULL, &st);
    CHECK(st == 200 && cJSON_IsFalse(cJSON_GetObjectItem(j, "train")) && cJSON_IsFalse(cJSON_GetObjectItem(j, "auth")));
    cJSON_Delete(j);
    j = get_json(port, "POST", "/ui/api/train", NULL, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\"}",
                 &st);
    CHECK_MSG(st == 404, "serve's train endpoint: %d", st);
    cJSON_Delete(j);
    /* the API is unchanged next to the page */
    j = get_json(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"Once\", \"max_tokens\": 3}", &st);
    CHECK(st == 200 && jnum(cJSON_GetObjectItem(j, "usage"), "completion_tokens") == 3);
    cJSON_Delete(j);
    at_server_stop(s, 5);
}

/* ---- the program and the browser -------------------------------------------------------- */

static int have_program(const char *name)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

/* Starts `anytune web-ui` on a free port (with --api_key api_key unless
 * NULL); returns its pid, port, the token its URL carries (into
 * token[cap]) and the read end of its stderr. */
static pid_t start_webui(const char *bin, const char *api_key, int *port, char *token, size_t cap, int *err_fd)
{
    int err[2];
    *port = 0;
    token[0] = 0;
    *err_fd = -1;
    if (pipe(err) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], 2);
        close(err[0]);
        if (api_key)
            execl(bin, bin, "web-ui", "--model", DEMO_MODEL, "--port", "0", "--max_batch_size", "2", "--api_key",
                  api_key, (char *)NULL);
        else
            execl(bin, bin, "web-ui", "--model", DEMO_MODEL, "--port", "0", "--max_batch_size", "2", (char *)NULL);
        _exit(127);
    }
    close(err[1]);
    char text[4096];
    size_t len = 0;
    while (!*port && len < sizeof text - 1) {
        struct pollfd p = {err[0], POLLIN, 0};
        if (poll(&p, 1, 30000) <= 0) break;
        ssize_t g = read(err[0], text + len, sizeof text - 1 - len);
        if (g <= 0) break;
        len += (size_t)g;
        text[len] = 0;
        /* "open http://127.0.0.1:PORT/?token=TOKEN in a browser": loopback by default */
        char *at = strstr(text, "open http://127.0.0.1:");
        char *eol = at ? strchr(at, '\n') : NULL;
        if (!eol) continue;
        *port = atoi(at + 22);
        const char *q = strstr(at, "/?token=");
        const char *sp = q && q < eol ? strchr(q, ' ') : NULL;
        if (sp && sp < eol && (size_t)(sp - q - 8) < cap) {
            memcpy(token, q + 8, (size_t)(sp - q - 8));
            token[sp - q - 8] = 0;
        }
    }
    CHECK_MSG(*port > 0, "web-ui printed no URL on 127.0.0.1: %s", len ? text : "(nothing)");
    CHECK_MSG(token[0], "web-ui's URL carries no ?token=: %s", len ? text : "(nothing)");
    *err_fd = err[0];
    return pid;
}

/* SIGTERM, and SIGKILL if it has not exited within timeout_s; returns its wait status (-1: killed). */
static int stop_webui(pid_t pid, int err_fd, double timeout_s)
{
    int status = -1;
    if (pid > 0) {
        kill(pid, SIGTERM);
        double t0 = now_s();
        while (now_s() - t0 < timeout_s && waitpid(pid, &status, WNOHANG) == 0) usleep(20000);
        if (waitpid(pid, NULL, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            status = -1;
        }
    }
    if (err_fd >= 0) close(err_fd);
    return status;
}

static int finished_ok(const cJSON *j) { return not_running(j); }

/* A server that dies (SIGKILL: no handler runs) leaves its job's output
 * without a reader: the trainer, told by its death signal (cmd_train.c
 * follow_webui_server; it ignores SIGPIPE), finishes the step under way,
 * checkpoints it and ends, so no trainer outlives a crashed server and no
 * finished step is lost. */
/* ANYTUNE_WEBUI_SERVER_PID naming a live process that is not the trainer's
 * parent (inherited from elsewhere) is not about this trainer: it trains. */
static void test_inherited_server_pid(const char *bin)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "ANYTUNE_WEBUI_SERVER_PID=1 '%s' sft --model " DEMO_MODEL " --dataset " DEMO_DATA
             " --max_steps 2 --logging_steps 1 --output_dir %s/inherited > %s/inherited.out 2>&1", bin, tmp, tmp);
    int rc = system(cmd);
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "sft with an inherited ANYTUNE_WEBUI_SERVER_PID: status 0x%x",
              rc);
}

static void test_server_crash(const char *bin)
{
    int port = 0, err_fd = -1, st;
    char token[128], body[512];
    const char *auth = "Authorization: Bearer crash-key\r\n";
    pid_t pid = start_webui(bin, "crash-key", &port, token, sizeof token, &err_fd);
    if (pid <= 0 || port <= 0) {
        stop_webui(pid, err_fd, 5);
        return;
    }
    snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"max_steps\": "
             "1000000, \"logging_steps\": 1, \"save_steps\": 1000000, \"output_dir\": \"%s/crash\"}", tmp);
    cJSON *j = get_json(port, "POST", "/ui/api/train", auth, body, &st);
    int job = (int)jnum(j, "pid");
    CHECK_MSG(st == 200 && job > 0, "start: %d %s", st, jstr(j, "error", "message"));
    cJSON_Delete(j);
    j = poll_status(port, auth, six_rows, 60);
    CHECK_MSG(jnum(j, "log_total") >= 6, "the job logged %g rows", jnum(j, "log_total"));
    char *run_dir = jstr(j, "run_dir", NULL) ? strdup(jstr(j, "run_dir", NULL)) : NULL;
    cJSON_Delete(j);
    /* the orphaned job comes to us, not to whatever init this machine has
     * (one that kills orphans would hide what the job does), so we can
     * also read how it ended */
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    double t0 = now_s();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(err_fd);
    int status = 0, ended = 0;
    while (job > 0 && !ended && now_s() - t0 < 20) {
        pid_t w = waitpid(job, &status, WNOHANG);
        if (w == job) ended = 1;
        else if (w < 0 && errno != EINTR) break;
        else usleep(2000);
    }
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    CHECK_MSG(ended, "the job %d outlived the killed server", job);
    printf("crash: the job of a SIGKILLed web-ui ended in %.0f ms\n", (now_s() - t0) * 1000);
    /* it stopped as Stop stops it (the death signal becomes one SIGTERM: exit 143),
     * and its last logged step is checkpointed (save_steps is far away):
     * no work lost */
    CHECK_MSG(ended && WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM,
              "the job ended with status 0x%x, want exit code %d (stopped by SIGTERM)", status, 128 + SIGTERM);
    char *ck = NULL, *logp = run_dir ? at_path_join(run_dir, "logging.jsonl") : NULL, *text = NULL;
    int64_t step = 0;
    size_t len = 0;
    CHECK(run_dir != NULL);
    if (run_dir) CHECK_OK(at_ckpt_find_last(run_dir, &ck, &step));
    if (ck) CHECK_OK(at_manifest_verify(ck));
    int64_t logged = 0;
    if (logp && at_read_file(logp, &text, &len) == AT_OK)
        for (char *l = strstr(text, "\"step\":"); l; l = strstr(l + 1, "\"step\":")) logged = strtoll(l + 7, NULL, 10);
    CHECK_MSG(step >= 6 && step == logged, "after the server's crash: newest checkpoint %lld, last logged step %lld",
              (long long)step, (long long)logged);
    free(text);
    free(logp);
    free(ck);
    free(run_dir);
}

/* web-ui without --api_key: a random token guards the train endpoints and
 * the OpenAI API (every account on the machine reaches 127.0.0.1); the
 * page itself needs none (it takes the token from its URL). A second start
 * gets another token; --api_key K is the token. */
static void test_token(const char *bin)
{
    int port = 0, err_fd = -1, st;
    char token[128], token2[128], auth[256], wrong[256], body[512];
    pid_t pid = start_webui(bin, NULL, &port, token, sizeof token, &err_fd);
    if (pid > 0 && port > 0 && token[0]) {
        size_t n = strlen(token);
        CHECK_MSG(n >= 32 && strspn(token, "0123456789abcdef") == n, "token %s: want >= 32 hex digits (128 bits)",
                  token);
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
        /* the same length, one digit changed */
        snprintf(wrong, sizeof wrong, "Authorization: Bearer %.*s%c\r\n", (int)n - 1, token,
                 token[n - 1] == '0' ? '1' : '0');
        http_resp r;
        CHECK(http(port, "GET", "/", NULL, NULL, &r) && r.status == 200);
        free(r.body);
        cJSON *j = get_json(port, "GET", "/ui/api/config", NULL, NULL, &st);
        CHECK(st == 200 && cJSON_IsTrue(cJSON_GetObjectItem(j, "auth")) && cJSON_IsTrue(cJSON_GetObjectItem(j, "train")));
        cJSON_Delete(j);
        snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"max_steps\": 1, "
                 "\"logging_steps\": 1, \"output_dir\": \"%s/token\"}", tmp);
        const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2}";
        const char *const refused[] = {NULL, wrong, "Authorization: Bearer \r\n", "Authorization: token\r\n"};
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
            j = get_json(port, "POST", "/ui/api/train", refused[i], body, &st);
            CHECK_MSG(st == 401, "POST /ui/api/train with %s: %d, want 401", refused[i] ? refused[i] : "no key", st);
            cJSON_Delete(j);
            j = get_json(port, "POST", "/v1/chat/completions", refused[i], chat, &st);
            CHECK_MSG(st == 401, "POST /v1/chat/completions with %s: %d, want 401", refused[i] ? refused[i] : "no key",
                      st);
            cJSON_Delete(j);
        }
        j = get_json(port, "GET", "/ui/api/train/status", NULL, NULL, &st);
        CHECK_MSG(st == 401, "status without the token: %d", st);
        cJSON_Delete(j);
        j = get_json(port, "GET", "/v1/models", NULL, NULL, &st);
        CHECK_MSG(st == 401, "/v1/models without the token: %d", st);
        cJSON_Delete(j);
        /* the refused starts started nothing */
        j = get_json(port, "GET", "/ui/api/train/status", auth, NULL, &st);
        CHECK_MSG(st == 200 && jstr(j, "state", NULL) && !strcmp(jstr(j, "state", NULL), "idle"),
                  "after the refused starts: %d %s", st, jstr(j, "state", NULL));
        cJSON_Delete(j);
        /* with it: an answer, and a 1-step job that runs to its end */
        j = get_json(port, "POST", "/v1/chat/completions", auth, chat, &st);
        CHECK_MSG(st == 200 && jnum(cJSON_GetObjectItem(j, "usage"), "completion_tokens") > 0,
                  "chat with the token: %d", st);
        cJSON_Delete(j);
        j = get_json(port, "POST", "/ui/api/train", auth, body, &st);
        CHECK_MSG(st == 200 && jnum(j, "pid") > 0, "start with the token: %d %s", st, jstr(j, "error", "message"));
        cJSON_Delete(j);
        j = poll_status(port, auth, finished_ok, 60);
        CHECK_MSG(jstr(j, "state", NULL) && !strcmp(jstr(j, "state", NULL), "finished") && jnum(j, "log_total") == 1,
                  "the job started with the token: %s, %g rows", jstr(j, "state", NULL), jnum(j, "log_total"));
        cJSON_Delete(j);
        printf("token: %zu hex digits; without it (or with a wrong one) 401 on train, chat, status, models; "
               "with it a chat answer and a 1-step job\n", n);
    }
    CHECK_MSG(stop_webui(pid, err_fd, 30) == 0, "web-ui did not exit 0 on SIGTERM");

    /* another start, another token; the first no longer opens anything */
    pid = start_webui(bin, NULL, &port, token2, sizeof token2, &err_fd);
    if (pid > 0 && port > 0 && token2[0]) {
        CHECK_MSG(strcmp(token, token2), "two starts printed the same token %s", token);
        cJSON *j = get_json(port, "GET", "/ui/api/train/status", auth, NULL, &st);
        CHECK_MSG(st == 401, "the first start's token on the second: %d", st);
        cJSON_Delete(j);
    }
    stop_webui(pid, err_fd, 30);

    /* --api_key K: K is the token, printed in the URL */
    const char *key = "my-key_1.x~K";
    pid = start_webui(bin, key, &port, token, sizeof token, &err_fd);
    if (pid > 0 && port > 0) {
        CHECK_MSG(!strcmp(token, key), "web-ui --api_key %s printed ?token=%s", key, token);
        cJSON *j = get_json(port, "GET", "/ui/api/train/status", NULL, NULL, &st);
        CHECK_MSG(st == 401, "--api_key: status without it: %d", st);
        cJSON_Delete(j);
        j = get_json(port, "GET", "/ui/api/train/status", "Authorization: Bearer my-key_1.x~K\r\n", NULL, &st);
        CHECK_MSG(st == 200, "--api_key: status with it: %d", st);
        cJSON_Delete(j);
    }
    stop_webui(pid, err_fd, 30);
    printf("token: a second start has another; --api_key %s prints ?token=%s\n", key, token);
}

static void test_browser(const char *bin)
{
    int ok_node = have_program("node"), ok_npm = have_program("npm");
    int ok_chromium = access("/usr/bin/chromium", X_OK) == 0;
    CHECK_MSG(ok_node && ok_npm && ok_chromium, "the browser test needs node, npm and /usr/bin/chromium: run "
              "scripts/setup.sh (node %d, npm %d, chromium %d)", ok_node, ok_npm, ok_chromium);
    if (!ok_node || !ok_npm || !ok_chromium) return;
    if (!at_test_js_ready("playwright-core")) return; /* scripts/setup.sh installs it */
    int port = 0, err_fd = -1;
    char token[128], auth[256];
    pid_t pid = start_webui(bin, NULL, &port, token, sizeof token, &err_fd);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    if (pid > 0 && port > 0 && token[0]) {
        /* the URL web-ui printed: the page must work from it alone */
        char cmd[512];
        snprintf(cmd, sizeof cmd, "node tests/js/webui_check.mjs 'http://127.0.0.1:%d/?token=%s' %s/browser", port,
                 token, tmp);
        double t0 = now_s();
        int rc = system(cmd);
        CHECK_MSG(rc == 0, "tests/js/webui_check.mjs failed (status %d)", rc);
        printf("browser: webui_check.mjs ran in %.1f s\n", now_s() - t0);

        /* SIGTERM with a job running: the server stops it and exits 0 */
        char body[512];
        snprintf(body, sizeof body, "{\"model\": \"" DEMO_MODEL "\", \"dataset\": \"" DEMO_DATA "\", \"max_steps\": "
                 "1000000, \"logging_steps\": 1, \"save_steps\": 1000000, \"output_dir\": \"%s/sigterm\"}", tmp);
        int st;
        cJSON *j = get_json(port, "POST", "/ui/api/train", auth, body, &st);
        int job = (int)jnum(j, "pid");
        CHECK_MSG(st == 200 && job > 0, "start: %d", st);
        cJSON_Delete(j);
        j = poll_status(port, auth, six_rows, 60);
        cJSON_Delete(j);
        kill(pid, SIGTERM);
        int status = -1;
        t0 = now_s();
        while (now_s() - t0 < 30 && waitpid(pid, &status, WNOHANG) == 0) usleep(20000);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "web-ui exit status %d", status);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            /* what the server said (a sanitizer's report, an error) */
            char text[8192];
            struct pollfd p = {err_fd, POLLIN, 0};
            ssize_t g = poll(&p, 1, 1000) > 0 ? read(err_fd, text, sizeof text - 1) : 0;
            text[g > 0 ? g : 0] = 0;
            fprintf(stderr, "web-ui's stderr:\n%s\n", text);
        }
        CHECK_MSG(job > 0 && kill(job, 0) != 0 && errno == ESRCH, "the job %d outlived the server", job);
        printf("sigterm: web-ui stopped its job and exited in %.0f ms\n", (now_s() - t0) * 1000);
    }
    if (pid > 0 && waitpid(pid, NULL, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    if (err_fd >= 0) close(err_fd);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmp, sizeof tmp, "/tmp/anytune-webui-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
    const char *bin = getenv("ANYTUNE_BIN");
    CHECK_MSG(bin && access(bin, X_OK) == 0, "ANYTUNE_BIN (the anytune program, set by ctest) is needed: the train "
              "jobs run it");
    at_bundle_opts bo = {0};
    bo.model = BIN;
    bo.tokenizer = TOKENIZER;
    bo.template_name = "chatml";
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    CHECK_OK(at_bundle_load(&bo, &b));
    if (b && bin) {
        at_server_opts o = {0};
        o.max_body_bytes = 64 * 1024;
        o.webui_train = 1;
        o.webui_train_program = bin;
        at_server *s = NULL;
        CHECK_OK(at_server_start(b, &o, &s));
        if (s) {
            int port = at_server_port(s);
            test_page(port);
            test_bad_requests(port);
            test_short_job(port);
            test_kto_job(port);
            test_long_job_stop(port);
            test_child_fds(); /* while the server listens */
            at_server_stop(s, 5);
        }
        test_job_processes();
        test_modes(b, bin);
        test_token(bin);
        test_server_crash(bin);
        test_inherited_server_pid(bin);
        test_browser(bin);
    }
    at_bundle_free(b);
    at_remove_tree(tmp);
    return at_test_result("test_webui");
}
