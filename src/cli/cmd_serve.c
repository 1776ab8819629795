/* anytune serve: the OpenAI-compatible HTTP API (serve/server.h) and the
 * chat page at / until SIGTERM or SIGINT, which stop it gracefully: no new
 * connections, requests in flight finish (cancelled after
 * --shutdown_timeout seconds), exit 0. `anytune web-ui` (cmd_webui.c) is the
 * same with the page's Train tab (cmd_serve.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "base/log.h"
#include "base/options.h"
#include "cli/cli.h"
#include "cli/cmd_serve.h"
#include "infer/bundle.h"
#include "serve/server.h"

static const at_opt_spec specs[] = {
    {"model", AT_OPT_STRING, NULL, "model folder (Hugging Face), GGUF or llama2.c file (default: the demo model)", NULL},
    {"adapters", AT_OPT_LIST, NULL, "LoRA adapters: DIR or NAME=DIR, several allowed (requests pick one by name)",
     NULL},
    {"tokenizer", AT_OPT_STRING, NULL, "tokenizer folder or file (default: the model's)", NULL},
    {"template", AT_OPT_STRING, NULL, "chat template: the model's (default), none, chatml, llama-2, llama-3, "
                                      "mistral, or a .jinja file", NULL},
    {"host", AT_OPT_STRING, "127.0.0.1", "IPv4 address to listen on (0.0.0.0: every interface)", NULL},
    {"port", AT_OPT_INT, "8000", "TCP port (0: any free port)", NULL},
    {"served_model_name", AT_OPT_STRING, NULL, "the model's name in the API (default: the folder's)", NULL},
    {"api_key", AT_OPT_STRING, NULL, "require Authorization: Bearer KEY", NULL},
    {"max_batch_size", AT_OPT_INT, "8", "requests decoded together", NULL},
    {"max_model_len", AT_OPT_INT, "0", "context per request in tokens (0: the model's, at most 4096)", NULL},
    {"max_tokens_limit", AT_OPT_INT, "0", "the largest max_tokens a request may ask (0: the context)", NULL},
    {"max_body_bytes", AT_OPT_INT, "1048576", "the largest request body", NULL},
    {"max_queue", AT_OPT_INT, "64", "requests that may wait for a free slot", NULL},
    {"shutdown_timeout", AT_OPT_FLOAT, "10", "seconds requests in flight get to finish on SIGTERM", NULL},
    {"device", AT_OPT_STRING, NULL, "auto, cpu, cuda, cuda:N", NULL},
    {"torch_dtype", AT_OPT_STRING, NULL, "weights as bfloat16, float16 or float32 (default: as stored)", NULL},
    {"quant_bits", AT_OPT_INT, "0", "run with the linear matrices quantized: 4 (NF4) or 8 (q8_0)", NULL},
    {"verbose", AT_OPT_BOOL, "false", "more logging", NULL},
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

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
    at_server *srv = NULL;
    if (at_opt_int(o, "max_body_bytes") < 1024 || at_opt_int(o, "max_batch_size") < 1) {
        at_error(AT_ERR_INVALID, "--max_body_bytes must be >= 1024 and --max_batch_size >= 1");
        goto fail;
    }
    if (at_cli_load_bundle(o, &b) != AT_OK) goto fail;
    at_server_opts so = {0};
    so.host = at_opt_str(o, "host");
    so.port = (int)at_opt_int(o, "port");
    so.max_batch_size = (int)at_opt_int(o, "max_batch_size");
    so.max_model_len = (int)at_opt_int(o, "max_model_len");
    so.max_tokens = (int)at_opt_int(o, "max_tokens_limit");
    so.max_body_bytes = (size_t)at_opt_int(o, "max_body_bytes");
    so.max_queue = (int)at_opt_int(o, "max_queue");
    so.api_key = at_opt_str(o, "api_key");
    so.served_model_name = at_opt_str(o, "served_model_name");
    so.webui_train = c->webui_train;
    if (at_server_start(b, &so, &srv) != AT_OK) goto fail;
    const char *host = so.host ? so.host : "127.0.0.1";
    fprintf(stderr, "anytune %s: %s%s on http://%s:%d/v1 (batch %d, context %d tokens, %d adapter%s)\n", c->command,
            so.served_model_name ? so.served_model_name : b->name, b->tmpl ? "" : " (no chat template)", host,
            at_server_port(srv), so.max_batch_size, at_bundle_context(b, so.max_model_len), b->n_adapters,
            b->n_adapters == 1 ? "" : "s");
    fprintf(stderr, "anytune %s: %s: open http://%s:%d/ in a browser\n", c->command,
            c->webui_train ? "chat and training" : "chat page", host, at_server_port(srv));
    if (c->webui_train && strcmp(host, "127.0.0.1") && strcmp(host, "localhost"))
        fprintf(stderr, "anytune %s: warning: listening on %s: whoever reaches this port can start training jobs "
                        "that read and write files as you%s\n",
                c->command, host, so.api_key ? "" : " (no --api_key set)");
    else if (c->webui_train && !so.api_key)
        /* loopback is every local account's, not only yours */
        fprintf(stderr, "anytune %s: note: without --api_key, every user of this machine can start training jobs "
                        "here that read and write files as you\n",
                c->command);
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
