/* anytune infer: one answer (--prompt TEXT), or a chat in the terminal.
 *
 * With a chat template (the model's, or --template NAME) the prompt is a
 * user message; without one (or --template none) the text is continued as
 * it is, and an empty prompt starts from the BOS token alone, as llama2.c's
 * run does. With no --prompt: an interactive chat that keeps the history
 * (/reset, /system TEXT, /image PATH, /exit). A vision-language model takes
 * images: --images a.jpg,b.png with --prompt (each "<image>" in the prompt
 * stands for the next image; without tags they come first), or /image PATH
 * before a line of the chat. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/log.h"
#include "base/manifest.h"
#include "base/options.h"
#include "cli/cli.h"
#include "hub/hub.h"
#include "device/registry.h"
#include "infer/bundle.h"
#include "infer/generate.h"
#include "infer/vlm.h"
#include "data/media.h"
#include "model/loader.h"
#include "plan/planner.h"

static const at_opt_spec specs[] = {
    {.name = "model", .type = AT_OPT_STRING,
     .help = "model folder (Hugging Face), GGUF or llama2.c file (default: the demo model)"},
    {.name = "no_verify", .type = AT_OPT_BOOL, .def = "false",
     .help = "read checkpoints whose files do not match their MANIFEST.sha256 (damaged or edited since written)"},
    {.name = "adapters", .type = AT_OPT_LIST, .help = "LoRA adapter folders: DIR or NAME=DIR, several allowed"},
    {.name = "adapter_name", .type = AT_OPT_STRING, .help = "which of --adapters to apply (default: the first)"},
    {.name = "tokenizer", .type = AT_OPT_STRING, .help = "tokenizer folder or file (default: the model's)"},
    {.name = "template", .type = AT_OPT_STRING,
     .help = "chat template: the model's (default), none, chatml, llama-2, llama-3, "
                                      "mistral, or a .jinja file"},
    {.name = "prompt", .type = AT_OPT_STRING, .help = "answer this and exit (\"\" with no template: start from BOS)"},
    {.name = "system", .type = AT_OPT_STRING, .help = "system message"},
    {.name = "images", .type = AT_OPT_LIST,
     .help = "images for --prompt (paths or data URLs; a vision-language model): each <image> in the prompt "
             "stands for the next one, or they all come first"},
    AT_MAX_PIXELS_OPTION_ROW,
    {.name = "val_dataset", .type = AT_OPT_LIST,
     .help = "answer every record of these files (the formats sft reads; the last assistant turn is the "
             "reference) into --result_path, in batches (as ms-swift's infer --val_dataset)"},
    {.name = "load_data_args", .type = AT_OPT_BOOL, .def = "false",
     .help = "with --adapters RUN/checkpoint-N: answer the run's validation split (its args.json's data)"},
    {.name = "result_path", .type = AT_OPT_STRING,
     .help = "where --val_dataset's answers go, JSON Lines (default: infer_result/YYYYMMDD-HHMMSS.jsonl)"},
    {.name = "model_name", .type = AT_OPT_LIST,
     .help = "with --val_dataset: fills {{name}} in the data (one value, or Chinese and English as sft)"},
    {.name = "model_author", .type = AT_OPT_LIST, .help = "with --val_dataset: fills {{author}} in the data"},
    {.name = "max_batch_size", .type = AT_OPT_INT, .def = "8", .range = "[1, 4096]",
     .help = "with --val_dataset: sequences decoded together (continuous batching)"},
    {.name = "max_new_tokens", .type = AT_OPT_INT, .def = "512",
     .help = "most tokens to generate", .range = "[0, 16777216]"},
    {.name = "temperature", .type = AT_OPT_FLOAT, .def = "0", .help = "0: greedy (reproducible)", .range = "[0, 100]"},
    {.name = "top_k", .type = AT_OPT_INT, .def = "0",
     .help = "keep the k most probable tokens (0: off)", .range = "[0, 2147483647]"},
    {.name = "top_p", .type = AT_OPT_FLOAT, .def = "1", .help = "nucleus sampling (1: off)", .range = "(0, 1]"},
    {.name = "min_p", .type = AT_OPT_FLOAT, .def = "0",
     .help = "drop tokens under min_p times the most probable (0: off)", .range = "[0, 1]"},
    {.name = "repetition_penalty", .type = AT_OPT_FLOAT, .def = "1",
     .help = "penalty on tokens already seen (1: off)", .range = "(0, 100]"},
    {.name = "presence_penalty", .type = AT_OPT_FLOAT, .def = "0",
     .help = "OpenAI presence penalty", .range = "[-2, 2]"},
    {.name = "frequency_penalty", .type = AT_OPT_FLOAT, .def = "0",
     .help = "OpenAI frequency penalty", .range = "[-2, 2]"},
    {.name = "seed", .type = AT_OPT_INT, .def = "42",
     .help = "seed of the sampler", .range = "[0, 9223372036854775807]"},
    {.name = "stop", .type = AT_OPT_LIST, .help = "stop strings"},
    {.name = "stream", .type = AT_OPT_BOOL, .def = "true", .help = "print tokens as they come"},
    {.name = "max_model_len", .type = AT_OPT_INT, .def = "0",
     .help = "context length in tokens (0: the model's, at most 4096)", .range = "[0, 16777216]"},
    {.name = "device", .type = AT_OPT_STRING, .help = "auto, cpu, cuda, cuda:N"},
    {.name = "torch_dtype", .type = AT_OPT_STRING,
     .help = "weights as bfloat16, float16 or float32 (default: as stored)"},
    {.name = "quant_bits", .type = AT_OPT_INT, .def = "0",
     .help = "run with the linear matrices quantized: 4 (NF4) or 8 (q8_0)", .range = "[0, 8]"},
    {.name = "verbose", .type = AT_OPT_BOOL, .def = "false", .help = "print prefill and decode speed"},
    {.name = "dry_run", .type = AT_OPT_BOOL, .def = "false",
     .help = "print the plan (device, formats, memory: weights and KV cache) and stop"},
    {.name = "json", .type = AT_OPT_BOOL, .def = "false", .help = "with --dry_run: the plan as JSON"},
    {.name = "max_memory", .type = AT_OPT_STRING,
     .help = "memory budget for --dry_run, e.g. 8GB or 7.5GiB (default: 90% of the free "
     "memory)"},
    {.name = "simulate_device", .type = AT_OPT_STRING,
     .help = "with --dry_run: plan for a device profile (v100, a100, m2-16gb, "
     "laptop-8gb, ...)"},
    AT_HUB_OPTION_ROWS,
    AT_MODEL_TYPE_OPTION_ROW,
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

at_status at_cli_load_bundle(const at_options *o, at_bundle **out)
{
    *out = NULL;
    char demo[PATH_MAX], gguf[PATH_MAX];
    at_bundle_opts bo = {0};
    at_manifest_set_checks(!at_opt_bool(o, "no_verify"));
    int na = at_opt_list_count(o, "adapters");
    char **ad = calloc((size_t)na + 1, sizeof *ad);
    char *base = NULL;
    if (!ad) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    for (int i = 0; i < na && st == AT_OK; i++) st = at_cli_adapter_path(at_opt_list_get(o, "adapters", i), &ad[i]);
    bo.model = at_cli_model_path(at_opt_str(o, "model"), gguf, sizeof gguf);
    if (st == AT_OK && !bo.model && na) {
        /* the base the adapter was trained on, as ms-swift's --load_args */
        st = at_cli_adapter_base(ad[0], &base);
        if (st == AT_OK) {
            bo.model = at_cli_model_path(base, gguf, sizeof gguf);
            fprintf(stderr, "anytune: no --model given: using %s, the base model of %s\n", bo.model, ad[0]);
        }
    }
    if (st == AT_OK && !bo.model) {
        bo.model = at_cli_demo_path("demo/stories260K", demo, sizeof demo);
        if (!bo.model) st = at_error(AT_ERR_INVALID, "no --model given (and no bundled demo model found)");
        else fprintf(stderr, "anytune: no --model given: using the demo model %s\n", bo.model);
    }
    if (st != AT_OK) goto done;
    bo.tokenizer = at_opt_str(o, "tokenizer");
    bo.template_name = at_opt_str(o, "template");
    bo.model_type = at_opt_str(o, "model_type");
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    const char *dt = at_opt_str(o, "torch_dtype");
    if (dt && strcmp(dt, "auto") != 0) {
        at_dtype d;
        if (at_dtype_parse(dt, &d) != 0 || (d != AT_F32 && d != AT_BF16 && d != AT_F16)) {
            st = at_error(AT_ERR_INVALID, "--torch_dtype %s: use bfloat16, float16 or float32", dt);
            goto done;
        }
        bo.dtype = d;
    }
    at_quant_kind q = AT_QUANT_NONE;
    AT_CHECK(at_quant_from_bits((int)at_opt_int(o, "quant_bits"), &q));
    bo.quant = q;
    bo.adapters = (const char *const *)ad;
    bo.n_adapters = na;
    AT_CHECK(at_device_select(at_opt_str(o, "device"), &bo.backend));
    st = at_bundle_load(&bo, out);
done:
    for (int i = 0; i < na; i++) free(ad[i]);
    free(ad);
    free(base);
    return st;
}

typedef struct {
    int stream;
} print_ctx;

static int print_text(void *user, const char *text, size_t len)
{
    print_ctx *pc = user;
    if (pc->stream) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

/* Everything a turn needs. */
typedef struct {
    at_bundle *b;
    at_vlm_images images; /* the conversation's images, in order (a vision-language model) */
    at_generator *gen;
    at_gen_params gp;
    int context;
    int stream, verbose;
} session;

static void report_speed(const at_gen_stats *s)
{
    double pf = s->prefill_s > 0 ? s->prefilled_tokens / s->prefill_s : 0;
    int dec = s->new_tokens > 1 ? s->new_tokens - 1 : 0; /* the first token comes from the prefill */
    double dc = s->decode_s > 0 ? dec / s->decode_s : 0;
    fprintf(stderr, "[prefill: %d tokens (%d cached) in %.3f s, %.1f tokens/s; decode: %d tokens in %.3f s, "
            "%.1f tokens/s]\n", s->prefilled_tokens, s->prompt_tokens - s->prefilled_tokens, s->prefill_s, pf, dec,
            s->decode_s, dc);
}

/* Generates after ids; prints; *text (may be NULL) gets the answer. */
static at_status turn(session *ss, const int32_t *ids, size_t n, char **text)
{
    print_ctx pc = {ss->stream};
    at_gen_params gp = ss->gp;
    int room = ss->context - (int)n;
    if (gp.max_new_tokens <= 0 || gp.max_new_tokens > room) gp.max_new_tokens = room;
    char *out = NULL;
    at_gen_stats stats;
    at_finish_reason fin;
    at_prompt_media media = {0};
    at_status st = ss->b->vision ? at_vlm_media(ss->b, ids, n, &ss->images, &media) : AT_OK;
    if (st == AT_OK)
        st = at_generator_run_media(ss->gen, ids, n, ss->b->vision ? &media : NULL, &gp, print_text, &pc, &out, &fin,
                                    &stats);
    at_vlm_media_free(&media);
    if (st != AT_OK) return st;
    if (!ss->stream) fputs(out, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (ss->verbose) report_speed(&stats);
    if (ss->verbose && ss->b->vision) fprintf(stderr, "[images encoded: %d]\n", stats.images_encoded);
    if (text) *text = out;
    else free(out);
    return AT_OK;
}

/* Decodes the image at ref (a path or a data URL) into the conversation's images. */
static at_status add_image(session *ss, const char *ref)
{
    at_image img = {0};
    AT_TRY(at_media_load_image(ref, 0, &img));
    at_status st = at_vlm_images_add(ss->b, &img, ref, &ss->images);
    at_image_free(&img);
    return st;
}

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* Encodes the chat, dropping the oldest exchanges (never the system
 * message nor the last one) while it does not fit. */
static at_status encode_history(session *ss, cJSON *history, int32_t **ids, size_t *n)
{
    for (;;) {
        AT_TRY(at_vlm_encode_chat(ss->b, history, &ss->images, ids, n));
        if ((int)*n < ss->context - 16) return AT_OK;
        cJSON *first = cJSON_GetArrayItem(history, 0);
        int skip = first && !strcmp(cJSON_GetObjectItem(first, "role")->valuestring, "system");
        if (cJSON_GetArraySize(history) - skip <= 1 || ss->images.n)
            return at_error(AT_ERR_INVALID, "the message has %zu tokens; the context holds %d", *n, ss->context);
        free(*ids);
        *ids = NULL;
        cJSON_DeleteItemFromArray(history, skip);
    }
}

/* Reads one line of any length (without the newline); NULL at the end of input. */
static char *read_line(FILE *f)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (len + 2 > cap) {
            char *p = realloc(s, cap *= 2);
            if (!p) {
                free(s);
                return NULL;
            }
            s = p;
        }
        s[len++] = (char)c;
    }
    if (c == EOF && len == 0) {
        free(s);
        return NULL;
    }
    if (len && s[len - 1] == '\r') len--;
    s[len] = 0;
    return s;
}

static const char chat_commands[] = "/reset (forget the conversation), /system TEXT (set the system message and "
                                    "reset), /image PATH (an image for the next message), /help, /exit";

static int interactive(session *ss, const char *system)
{
    int tty = isatty(0);
    cJSON *history = cJSON_CreateArray();
    int pending = 0; /* images attached to the next message */
    char *sys = system ? strdup(system) : NULL;
    if (sys) cJSON_AddItemToArray(history, message("system", sys));
    if (tty)
        fprintf(stderr, "anytune chat with %s%s. Commands: %s\n", ss->b->name,
                ss->b->tmpl ? "" : " (no chat template: each line is continued as raw text)", chat_commands);
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        char *line = read_line(stdin);
        if (!line) break;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
            fprintf(stderr, "commands: %s\n", chat_commands);
            free(line);
            continue;
        }
        if (!strncmp(line, "/image ", 7)) {
            const char *path = line + 7;
            while (*path == ' ') path++;
            if (add_image(ss, path) == AT_OK) {
                pending++;
                fprintf(stderr, "(image %d attached to the next message)\n", ss->images.n);
            } else {
                fprintf(stderr, "anytune: error: %s\n", at_last_error());
            }
            free(line);
            continue;
        }
        if (!strcmp(line, "/reset") || !strncmp(line, "/system", 7)) {
            if (!strncmp(line, "/system", 7)) {
                const char *t = line + 7;
                while (*t == ' ') t++;
                free(sys);
                sys = *t ? strdup(t) : NULL;
            }
            cJSON_Delete(history);
            history = cJSON_CreateArray();
            if (sys) cJSON_AddItemToArray(history, message("system", sys));
            at_vlm_images_free(&ss->images);
            pending = 0;
            /* said on stderr, so that stdout holds the answers alone */
            fprintf(stderr, "(history cleared%s)\n", sys ? ", system message set" : "");
            free(line);
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        at_status st;
        char *answer = NULL;
        if (ss->b->tmpl) {
            /* the images attached since the last message go first in it, unless it places them */
            size_t tl = strlen(AT_IMAGE_TAG), ll = strlen(line);
            char *content = malloc((size_t)pending * tl + ll + 1);
            if (!content) {
                free(line);
                break;
            }
            for (int i = 0; i < pending; i++) memcpy(content + (size_t)i * tl, AT_IMAGE_TAG, tl);
            memcpy(content + (strstr(line, AT_IMAGE_TAG) ? 0 : (size_t)pending * tl), line, ll + 1);
            cJSON_AddItemToArray(history, message("user", content));
            free(content);
            pending = 0;
            st = encode_history(ss, history, &ids, &n);
            if (st == AT_OK) st = turn(ss, ids, n, &answer);
            if (st == AT_OK) {
                cJSON_AddItemToArray(history, message("assistant", answer));
            } else if (ss->images.n) { /* the images and the tags no longer pair up: start over */
                cJSON_Delete(history);
                history = cJSON_CreateArray();
                if (sys) cJSON_AddItemToArray(history, message("system", sys));
                at_vlm_images_free(&ss->images);
                fprintf(stderr, "(history and images cleared)\n");
            } else {
                cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            }
        } else if (pending) {
            st = at_error(AT_ERR_INVALID, "images need a chat template (the model has none; give --template)");
        } else {
            st = at_bundle_encode_text(ss->b, line, &ids, &n);
            if (st == AT_OK) st = turn(ss, ids, n, NULL);
        }
        if (st != AT_OK) fprintf(stderr, "anytune: error: %s\n", at_last_error());
        free(answer);
        free(ids);
        free(line);
    }
    cJSON_Delete(history);
    free(sys);
    return 0;
}

/* --dry_run: the planner's view of this session (plan/planner.h): the
 * weights and the KV cache of the context, on this device or a simulated
 * one. Nothing is loaded. Returns the exit status. */
static int infer_dry_run(const at_options *o)
{
    char demo[PATH_MAX];
    const char *model = at_opt_str(o, "model");
    if (!model) model = at_cli_demo_path("demo/stories260K", demo, sizeof demo);
    at_plan_request rq;
    at_plan_request_defaults(&rq);
    at_model_config cfg;
    if (!model) return at_cli_fail();
    if (at_plan_model_config(model, at_opt_str(o, "model_type"), &cfg, &rq.has_model_dtype, &rq.model_dtype) != AT_OK) return at_cli_fail();
    rq.cfg = &cfg;
    rq.model = model;
    rq.command = "infer";
    const char *td = at_opt_str(o, "torch_dtype");
    if (td) {
        if (at_dtype_parse(td, &rq.dtype) != 0 || (rq.dtype != AT_F32 && rq.dtype != AT_BF16 && rq.dtype != AT_F16)) {
            fprintf(stderr, "anytune infer: error: --torch_dtype %s: use bfloat16, float16 or float32\n", td);
            return 2;
        }
        rq.has_dtype = 1;
    }
    /* the context as at_bundle_context decides it */
    int want = (int)at_opt_int(o, "max_model_len");
    int64_t mp = cfg.max_position_embeddings;
    rq.max_seq = want > 0 ? (mp > 0 && want > mp ? (int)mp : want) : mp <= 0 ? 2048 : mp > 4096 ? 4096 : (int)mp;
    const char *mm = at_opt_str(o, "max_memory");
    if (mm && at_parse_memory_size(mm, &rq.max_memory) != AT_OK) {
        fprintf(stderr, "anytune infer: error: --max_memory: %s\n", at_last_error());
        return 2;
    }
    at_device_profile dev;
    if (at_device_profile_get(at_opt_str(o, "simulate_device"), at_opt_str(o, "device"), &dev) != AT_OK)
        return at_cli_fail();
    at_plan p;
    if (at_plan_infer(&rq, &dev, &p) != AT_OK && p.mem.total == 0) return at_cli_fail();
    return at_cli_print_plan(&p, at_opt_bool(o, "json"));
}

int at_cmd_infer(int argc, char **argv)
{
    const char *usage = "usage: anytune infer [--model DIR] [--adapters DIR] [--prompt TEXT] [OPTIONS]\n"
                        "  with no --prompt: an interactive chat (/reset, /system TEXT, /exit)";
    at_options *o = NULL;
    int prc = at_cli_parse(specs, NSPECS, argc, argv, "infer", usage, &o);
    if (prc >= 0) return prc;
    at_log_set_level(at_opt_bool(o, "verbose") ? AT_LOG_INFO : AT_LOG_WARN);
    if (at_opt_bool(o, "dry_run") || at_opt_str(o, "simulate_device")) {
        int drc = at_opt_bool(o, "dry_run") ? infer_dry_run(o) : 2;
        if (drc == 2 && !at_opt_bool(o, "dry_run"))
            fprintf(stderr, "anytune infer: error: --simulate_device plans for a device that is not here: add "
                            "--dry_run\n");
        at_options_free(o);
        return drc;
    }
    int rc = 1;
    at_bundle *b = NULL;
    session ss;
    memset(&ss, 0, sizeof ss);
    const char **stops = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    cJSON *msgs = NULL;
    if (at_cli_load_bundle(o, &b) != AT_OK) goto fail;
    ss.b = b;
    if (at_opt_int(o, "max_pixels") > 0) b->image_proc.max_pixels = (uint64_t)at_opt_int(o, "max_pixels");
    ss.context = at_bundle_context(b, (int)at_opt_int(o, "max_model_len"));
    ss.stream = at_opt_bool(o, "stream");
    ss.verbose = at_opt_bool(o, "verbose");
    ss.gp = at_gen_params_default();
    at_sampling_params *sp = &ss.gp.sampling;
    sp->temperature = (float)at_opt_float(o, "temperature");
    sp->top_k = (int)at_opt_int(o, "top_k");
    sp->top_p = (float)at_opt_float(o, "top_p");
    sp->min_p = (float)at_opt_float(o, "min_p");
    sp->repetition_penalty = (float)at_opt_float(o, "repetition_penalty");
    sp->presence_penalty = (float)at_opt_float(o, "presence_penalty");
    sp->frequency_penalty = (float)at_opt_float(o, "frequency_penalty");
    sp->seed = (uint64_t)at_opt_int(o, "seed");
    if (at_sampling_validate(sp) != AT_OK) goto fail;
    ss.gp.max_new_tokens = (int)at_opt_int(o, "max_new_tokens");
    int ns = at_opt_list_count(o, "stop");
    if (ns > AT_GEN_MAX_STOP) {
        at_error(AT_ERR_INVALID, "--stop: at most %d strings", AT_GEN_MAX_STOP);
        goto fail;
    }
    stops = calloc((size_t)ns + 1, sizeof *stops);
    if (!stops) goto fail;
    for (int i = 0; i < ns; i++) stops[i] = at_opt_list_get(o, "stop", i);
    ss.gp.stop = stops;
    ss.gp.n_stop = ns;
    ss.gp.stop_ids = b->stop_ids;
    ss.gp.n_stop_ids = b->n_stop_ids;
    ss.gp.continues_prompt = !b->tmpl; /* raw text is continued; a chat answer is a text of its own */
    if (b->n_adapters) {
        const char *an = at_opt_str(o, "adapter_name");
        ss.gp.adapter = an ? at_bundle_adapter_get(b, an) : b->adapters[0].adapter;
        if (!ss.gp.adapter) {
            at_error(AT_ERR_NOT_FOUND, "--adapter_name %s: no adapter of that name", an);
            goto fail;
        }
    }
    if (at_opt_list_count(o, "val_dataset") || at_opt_bool(o, "load_data_args")) {
        if (!b->tmpl) {
            at_error(AT_ERR_INVALID, "--val_dataset answers conversations: the model has no chat template (--template)");
            goto fail;
        }
        rc = at_cli_infer_dataset(o, b, &ss.gp, ss.context);
        goto done;
    }
    if (at_generator_new(b->decoder, b->tokenizer, ss.context, &ss.gen) != AT_OK) goto fail;
    for (int i = 0; i < at_opt_list_count(o, "images"); i++)
        if (add_image(&ss, at_opt_list_get(o, "images", i)) != AT_OK) goto fail;

    const char *prompt = at_opt_str(o, "prompt");
    if (!prompt) {
        rc = interactive(&ss, at_opt_str(o, "system"));
        goto done;
    }
    if (b->tmpl) {
        msgs = cJSON_CreateArray();
        if (at_opt_str(o, "system")) cJSON_AddItemToArray(msgs, message("system", at_opt_str(o, "system")));
        cJSON_AddItemToArray(msgs, message("user", prompt));
        if (at_vlm_encode_chat(b, msgs, &ss.images, &ids, &n) != AT_OK) goto fail;
    } else if (ss.images.n) {
        at_error(AT_ERR_INVALID, "--images needs a chat template (the model has none; give --template)");
        goto fail;
    } else if (at_bundle_encode_text(b, prompt, &ids, &n) != AT_OK) {
        goto fail;
    }
    if ((int)n >= ss.context) {
        at_error(AT_ERR_INVALID, "the prompt has %zu tokens; the context holds %d (--max_model_len)", n, ss.context);
        goto fail;
    }
    if (turn(&ss, ids, n, NULL) != AT_OK) goto fail;
    rc = 0;
    goto done;
fail:
    rc = at_cli_fail();
done:
    cJSON_Delete(msgs);
    free(ids);
    free(stops);
    at_generator_free(ss.gen);
    at_vlm_images_free(&ss.images);
    at_bundle_free(b);
    at_options_free(o);
    return rc;
}
