/* anytune serve: the OpenAI-compatible HTTP API (serve/server.h) and the
 * chat page at / until SIGTERM or SIGINT, which stop it gracefully: no new
 * connections, requests in flight finish (cancelled after
 * --shutdown_timeout seconds), exit 0. `anytune web-ui` (cmd_webui.c) is the
 * same with the page's Train tab (cmd_serve.h).
 *
 * web-ui always wants an API key: loopback is every local account's, and the
 * Train tab runs programs as the user who started it. Without --api_key it
 * makes a random token, as Jupyter does, and prints the page's URL with
 * ?token=...; the page keeps it as its key (web/app.js). serve stays an
 * open OpenAI-compatible API unless --api_key is given, as vLLM. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/log.h"
#include "base/options.h"
#include "cli/cli.h"
#include "hub/hub.h"
#include "model/config.h"
#include "cli/cmd_serve.h"
#include "infer/bundle.h"
#include "infer/vlm.h"
#include "serve/server.h"

static const at_opt_spec specs[] = {
    {.name = "model", .type = AT_OPT_STRING,
     .help = "model folder (Hugging Face), GGUF or llama2.c file (default: the demo model)"},
    {.name = "no_verify", .type = AT_OPT_BOOL, .def = "false",
     .help = "read checkpoints whose files do not match their MANIFEST.sha256 (damaged or edited since written)"},
    {.name = "adapters", .type = AT_OPT_LIST,
     .help = "LoRA adapters: DIR or NAME=DIR, several allowed (requests pick one by name)"},
    {.name = "tokenizer", .type = AT_OPT_STRING, .help = "tokenizer folder or file (default: the model's)"},
    {.name = "template", .type = AT_OPT_STRING,
     .help = "chat template: the model's (default), none, chatml, llama-2, llama-3, "
                                      "mistral, or a .jinja file"},
    {.name = "host", .type = AT_OPT_STRING, .def = "127.0.0.1",
     .help = "IPv4 address to listen on (0.0.0.0: every interface)"},
    {.name = "port", .type = AT_OPT_INT, .def = "8000", .help = "TCP port (0: any free port)", .range = "[0, 65535]"},
    {.name = "served_model_name", .type = AT_OPT_STRING, .help = "the model's name in the API (default: the folder's)"},
    {.name = "default_model", .type = AT_OPT_STRING,
     .help = "the model of requests that name none: the served name or an adapter's (default: with --adapters, "
             "such requests are refused, listing the names)"},
    {.name = "api_key", .type = AT_OPT_STRING, .help = "require Authorization: Bearer KEY"},
    {.name = "max_batch_size", .type = AT_OPT_INT, .def = "8",
     .help = "requests decoded together", .range = "[1, 4096]"},
    {.name = "max_model_len", .type = AT_OPT_INT, .def = "0",
     .help = "context per request in tokens (0: the model's, at most 4096)", .range = "[0, 16777216]"},
    {.name = "max_tokens_limit", .type = AT_OPT_INT, .def = "0",
     .help = "the largest max_tokens a request may ask (0: the context)", .range = "[0, 16777216]"},
    {.name = "max_body_bytes", .type = AT_OPT_INT, .def = "0",
     .help = "the largest request body (0: 1 MiB, or 20 MiB for a vision-language model, whose images come inline)",
     .range = "[0, 1073741824]"},
    {.name = "allowed_local_media_path", .type = AT_OPT_STRING,
     .help = "a vision-language model reads image files (file:// URLs, paths) of requests only under this folder "
             "(default: none, data: URLs only; http(s) URLs are always refused)"},
    AT_MAX_PIXELS_OPTION_ROW,
    {.name = "max_image_pixels", .type = AT_OPT_INT, .def = "0", .range = "[0, 9223372036854775807]",
     .help = "a request's image with more pixels (before resizing) is refused (0: 178956970, Pillow's bomb limit)"},
    {.name = "limit_mm_per_prompt", .type = AT_OPT_INT, .def = "16", .range = "[1, 1024]",
     .help = "images one request may hold"},
    {.name = "max_queue", .type = AT_OPT_INT, .def = "64",
     .help = "requests that may wait for a free slot", .range = "[0, 1048576]"},
    {.name = "idle_timeout", .type = AT_OPT_INT, .def = "30",
     .help = "seconds a connection may send nothing before it is closed (answers being generated do not count)",
     .range = "[1, 86400]"},
    {.name = "max_connections_per_client", .type = AT_OPT_INT, .def = "64",
     .help = "connections one client address may hold (of 256)", .range = "[1, 256]"},
    {.name = "shutdown_timeout", .type = AT_OPT_FLOAT, .def = "10",
     .help = "seconds requests in flight get to finish on SIGTERM", .range = "[0, 86400]"},
    {.name = "device", .type = AT_OPT_STRING, .help = "auto, cpu, cuda, cuda:N"},
    {.name = "torch_dtype", .type = AT_OPT_STRING,
     .help = "weights as bfloat16, float16 or float32 (default: as stored)"},
    {.name = "quant_bits", .type = AT_OPT_INT, .def = "0",
     .help = "run with the linear matrices quantized: 4 (NF4) or 8 (q8_0)", .range = "[0, 8]"},
    {.name = "verbose", .type = AT_OPT_BOOL, .def = "false", .help = "more logging"},
    AT_HUB_OPTION_ROWS,
    AT_MODEL_TYPE_OPTION_ROW,
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

/* web-ui's token: 24 bytes (192 bits) from /dev/urandom as 48 hex digits
 * into hex[49]. */
static at_status random_token(char hex[49])
{
    unsigned char raw[24];
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return at_error(AT_ERR_IO, "/dev/urandom: %s (web-ui needs it for its access token)", strerror(errno));
    while (got < sizeof raw) {
        ssize_t n = read(fd, raw + got, sizeof raw - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            return at_error(AT_ERR_IO, "/dev/urandom: %s (web-ui needs it for its access token)", strerror(e));
        }
        got += (size_t)n;
    }
    close(fd);
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[2 * sizeof raw] = 0;
    memset(raw, 0, sizeof raw);
    return AT_OK;
}

/* key percent-encoded for a URL's query (RFC 3986 unreserved characters
 * kept) into out[cap]; cut to an empty string if it does not fit. */
static void url_encode(const char *key, char *out, size_t cap)
{
    static const char digits[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        int keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                   strchr("-._~", *p);
        if (n + (keep ? 1 : 3) >= cap) {
            out[0] = 0;
            return;
        }
        if (keep) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = digits[*p >> 4];
            out[n++] = digits[*p & 15];
        }
    }
    out[n] = 0;
}

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

int at_cli_serve(int argc, char **argv, const at_serve_cli *c)
{
    /* the table with this command's default port, so that --help shows the
     * port it listens on */
    at_opt_spec sp[NSPECS];
    memcpy(sp, specs, sizeof sp);
    for (int i = 0; i < NSPECS; i++)
        if (!strcmp(sp[i].name, "port")) sp[i].def = c->default_port;
        else if (!strcmp(sp[i].name, "api_key") && c->webui_train)
            sp[i].help = "require Authorization: Bearer KEY (default: a random token; the printed URL "
                         "carries it as ?token=KEY and the page keeps it)";
    at_options *o = NULL;
    int prc = at_cli_parse(sp, NSPECS, argc, argv, c->command, c->usage, &o);
    if (prc >= 0) return prc;
    at_log_set_level(at_opt_bool(o, "verbose") ? AT_LOG_DEBUG : AT_LOG_INFO);
    /* the signals are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    at_bundle *b = NULL;
    at_reward_model *rm = NULL;
    at_server *srv = NULL;
    char token[49] = {0}, *query = NULL;
    if ((at_opt_int(o, "max_body_bytes") != 0 && at_opt_int(o, "max_body_bytes") < 1024) ||
        at_opt_int(o, "max_batch_size") < 1) {
        /* a usage error, as the option table's range checks are (status 2) */
        fprintf(stderr, "anytune serve: error: --max_body_bytes must be 0 (the default for the model) or >= 1024, "
                        "and --max_batch_size >= 1\n");
        rc = 2;
        goto done;
    }
    if (at_cli_load_bundle(o, &b) != AT_OK) goto fail;
    /* a reward model (a score head) answers /v1/score instead of generating */
    at_status rst = at_reward_model_attach(b, at_opt_str(o, "model"), (int)at_opt_int(o, "max_batch_size"), &rm);
    if (rst == AT_ERR_NOT_FOUND) at_clear_error();
    else if (rst != AT_OK) goto fail;
    at_server_opts so = {0};
    so.reward_model = rm;
    so.host = at_opt_str(o, "host");
    so.port = (int)at_opt_int(o, "port");
    so.max_batch_size = (int)at_opt_int(o, "max_batch_size");
    so.max_model_len = (int)at_opt_int(o, "max_model_len");
    so.max_tokens = (int)at_opt_int(o, "max_tokens_limit");
    so.max_body_bytes = (size_t)at_opt_int(o, "max_body_bytes");
    so.max_queue = (int)at_opt_int(o, "max_queue");
    so.idle_timeout_s = (int)at_opt_int(o, "idle_timeout");
    so.max_connections_per_client = (int)at_opt_int(o, "max_connections_per_client");
    so.api_key = at_opt_str(o, "api_key");
    so.allowed_local_media_path = at_opt_str(o, "allowed_local_media_path");
    so.max_image_pixels = (uint64_t)at_opt_int(o, "max_image_pixels");
    so.max_images = (int)at_opt_int(o, "limit_mm_per_prompt");
    if (at_opt_int(o, "max_pixels") > 0) b->image_proc.max_pixels = (uint64_t)at_opt_int(o, "max_pixels");
    if (c->webui_train && (!so.api_key || !so.api_key[0])) {
        /* an empty --api_key would leave the Train tab open: a token instead */
        if (random_token(token) != AT_OK) goto fail;
        so.api_key = token;
    }
    if (c->webui_train) {
        size_t cap = 3 * strlen(so.api_key) + 8;
        query = malloc(cap);
        if (!query) {
            at_error(AT_ERR_NOMEM, "out of memory for the page's URL");
            goto fail;
        }
        memcpy(query, "?token=", 7);
        url_encode(so.api_key, query + 7, cap - 7);
    }
    so.served_model_name = at_opt_str(o, "served_model_name");
    so.default_model = at_opt_str(o, "default_model");
    /* with adapters: a request must say which model it means (the chat page too: /v1/models says so) */
    so.model_required = b->n_adapters > 0 && !rm; /* a reward model's adapter is part of it */
    const char *served = so.served_model_name ? so.served_model_name : b->name;
    if (so.default_model && strcmp(so.default_model, served) != 0 && !at_bundle_adapter_get(b, so.default_model)) {
        at_error(AT_ERR_INVALID, "--default_model %s: neither the served name (%s) nor an adapter's", so.default_model,
                 served);
        goto fail;
    }
    so.webui_train = c->webui_train;
    if (at_server_start(b, &so, &srv) != AT_OK) goto fail;
    const char *host = so.host ? so.host : "127.0.0.1";
    fprintf(stderr, "anytune %s: %s%s%s on http://%s:%d/v1 (batch %d, context %d tokens, %d adapter%s)\n",
            c->command, so.served_model_name ? so.served_model_name : b->name, rm ? " (a reward model: POST /v1/score)" : "",
            b->tmpl ? "" : " (no chat template)", host,
            at_server_port(srv), so.max_batch_size, at_bundle_context(b, so.max_model_len), b->n_adapters,
            b->n_adapters == 1 ? "" : "s");
    fprintf(stderr, "anytune %s: %s: open http://%s:%d/%s in a browser\n", c->command,
            c->webui_train ? "chat and training" : "chat page", host, at_server_port(srv), query ? query : "");
    if (c->webui_train && strcmp(host, "127.0.0.1") && strcmp(host, "localhost"))
        fprintf(stderr, "anytune %s: warning: listening on %s: the token travels over plain HTTP, and whoever "
                        "learns it can start training jobs that read and write files as you\n",
                c->command, host);
    fflush(stderr);
    /* SIGTERM/SIGINT are blocked in every thread we create, but a library may
     * start threads of its own that do not block them: a handler catches the
     * signal wherever it lands, and the loop sees either path. */
    int sig = 0;
    while (!sig && !stop_signal) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        int r = sigtimedwait(&sigs, NULL, &ts);
        if (r > 0) sig = r;
    }
    if (!sig) sig = stop_signal;
    fprintf(stderr, "anytune %s: %s: stopping (requests in flight get %.0f s)\n", c->command,
            sig == SIGINT ? "SIGINT" : "SIGTERM", at_opt_float(o, "shutdown_timeout"));
    at_server_stop(srv, at_opt_float(o, "shutdown_timeout"));
    fprintf(stderr, "anytune %s: stopped\n", c->command);
    rc = 0;
    goto done;
fail:
    rc = at_cli_fail();
done:
    free(query);
    memset(token, 0, sizeof token);
    at_reward_model_free(rm);
    at_bundle_free(b);
    at_options_free(o);
    return rc;
}

int at_cmd_serve(int argc, char **argv)
{
    const at_serve_cli c = {"serve", "usage: anytune serve [--model DIR] [--adapters NAME=DIR ...] [--port 8000] [OPTIONS]",
                            0, "8000"};
    return at_cli_serve(argc, argv, &c);
}
