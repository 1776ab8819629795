/* anytune eval: multiple-choice accuracy on MMLU / C-Eval style benchmarks
 * (--eval_dataset, LLaMA-Factory's scheme, eval/mc_eval.h) and loss /
 * perplexity on a dataset (--dataset, the files sft and pt read,
 * eval/loss_eval.h); either or both. Results go to
 * EVAL_OUTPUT_DIR/NAME_SPLIT_results.json and EVAL_OUTPUT_DIR/loss_results.json,
 * each with the options used. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/log.h"
#include "base/options.h"
#include "cli/cli.h"
#include "hub/hub.h"
#include "model/config.h"
#include "eval/loss_eval.h"
#include "eval/mc_bench.h"
#include "eval/mc_eval.h"
#include "infer/bundle.h"

static const at_opt_spec specs[] = {
    {.name = "model", .type = AT_OPT_STRING,
     .help = "model folder (Hugging Face), GGUF or llama2.c file (default: the demo model)"},
    {.name = "no_verify", .type = AT_OPT_BOOL, .def = "false",
     .help = "read checkpoints whose files do not match their MANIFEST.sha256 (damaged or edited since written)"},
    {.name = "adapters", .type = AT_OPT_LIST,
     .help = "LoRA adapter folders: DIR or NAME=DIR (the first, or --adapter_name, is applied)"},
    {.name = "adapter_name", .type = AT_OPT_STRING, .help = "which of --adapters to apply (default: the first)"},
    {.name = "tokenizer", .type = AT_OPT_STRING, .help = "tokenizer folder or file (default: the model's)"},
    {.name = "template", .type = AT_OPT_STRING,
     .help = "chat template: the model's (default), none (LLaMA-Factory's fewshot layout), "
                                      "chatml, llama-2, llama-3, mistral, or a .jinja file"},
    {.name = "device", .type = AT_OPT_STRING, .help = "auto, cpu, cuda, cuda:N"},
    {.name = "torch_dtype", .type = AT_OPT_STRING,
     .help = "weights as bfloat16, float16 or float32 (default: as stored)"},
    {.name = "quant_bits", .type = AT_OPT_INT, .def = "0",
     .help = "run with the linear matrices quantized: 4 (NF4) or 8 (q8_0)", .range = "[0, 8]"},
    {.name = "eval_dataset", .type = AT_OPT_STRING,
     .help = "multiple-choice benchmark: mmlu, ceval (found in $ANYTUNE_EVAL_DATA or "
     "evaluation/) or a folder with mapping.json, dev/ and val/"},
    {.name = "eval_split", .type = AT_OPT_STRING, .def = "val", .help = "the questions: val, dev or test"},
    {.name = "n_shot", .type = AT_OPT_INT, .def = "5",
     .help = "few-shot examples from dev/ before each question (0: none)", .range = "[0, 1000]"},
    {.name = "lang", .type = AT_OPT_STRING, .help = "prompt language en or zh (default: zh for ceval/cmmlu, else en)"},
    {.name = "eval_limit", .type = AT_OPT_INT, .def = "0",
     .help = "at most N questions per subject (0: all)", .range = "[0, 2147483647]"},
    {.name = "eval_output_dir", .type = AT_OPT_STRING, .def = "eval_output", .help = "where the results JSON files go"},
    {.name = "max_length", .type = AT_OPT_INT, .def = "0",
     .help = "longest prompt or sample in tokens (0: the model's context); longer prompts "
     "lose their earliest shots", .range = "[0, 16777216]"},
    {.name = "eval_batch_size", .type = AT_OPT_INT, .def = "8",
     .help = "questions (or samples) per forward", .alias = "per_device_eval_batch_size", .range = "[1, 65536]"},
    {.name = "dataset", .type = AT_OPT_LIST,
     .help = "loss / perplexity on FILE or FILE#N (the formats sft and pt read)"},
    {.name = "pt", .type = AT_OPT_BOOL, .def = "false",
     .help = "with --dataset: plain texts, every token supervised (as anytune pt)"},
    {.name = "loss_scale", .type = AT_OPT_STRING, .def = "default",
     .help = "with --dataset: default (every assistant turn) or last_round"},
    {.name = "model_name", .type = AT_OPT_STRING, .help = "with --dataset: fills {{name}} in the data (as sft)"},
    {.name = "model_author", .type = AT_OPT_STRING, .help = "with --dataset: fills {{author}} in the data (as sft)"},
    {.name = "truncation_strategy", .type = AT_OPT_STRING, .def = "delete",
     .help = "delete, left or right for samples over --max_length"},
    {.name = "strict", .type = AT_OPT_BOOL, .def = "false", .help = "stop at the first bad dataset record"},
    {.name = "seed", .type = AT_OPT_INT, .def = "42",
     .help = "seed of FILE#N sampling", .range = "[0, 9223372036854775807]"},
    AT_HUB_OPTION_ROWS,
    AT_MODEL_TYPE_OPTION_ROW,
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

static const char *base_name(const char *path, char *buf, size_t len)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(buf, len, "%.*s", (int)(n - s), path + s);
    return buf;
}

/* Writes j (with the options under "args") to DIR/NAME-YYYYMMDD-HHMMSS.json
 * (a new file per run, -2, -3... when one of that second exists) and the
 * same to DIR/NAME.json (the newest), each atomically. *path_out: the new
 * file's path. */
static at_status write_result(const at_options *o, cJSON *j, const char *name, char **path_out)
{
    const char *dir = at_opt_str(o, "eval_output_dir");
    cJSON_AddItemToObject(j, "args", at_options_to_json(o));
    AT_TRY(at_mkdirs(dir));
    char stamp[32], file[256];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    char *path = NULL, *latest = NULL, *text = cJSON_Print(j);
    at_status st = text ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    for (int k = 1; st == AT_OK && k < 1000; k++) {
        if (k == 1) snprintf(file, sizeof file, "%s-%s.json", name, stamp);
        else snprintf(file, sizeof file, "%s-%s-%d.json", name, stamp, k);
        free(path);
        path = at_path_join(dir, file);
        if (!path) st = at_error(AT_ERR_NOMEM, "out of memory");
        else if (!at_file_exists(path)) break;
    }
    snprintf(file, sizeof file, "%s.json", name);
    if (st == AT_OK && !(latest = at_path_join(dir, file))) st = at_error(AT_ERR_NOMEM, "out of memory");
    if (st == AT_OK) {
        size_t n = strlen(text);
        text[n] = '\n'; /* replaces the NUL: the file ends with a newline */
        st = at_write_file_atomic(path, text, n + 1);
        if (st == AT_OK) st = at_write_file_atomic(latest, text, n + 1);
    }
    free(text);
    free(latest);
    if (st == AT_OK) *path_out = path;
    else free(path);
    return st;
}

static int run_mc(const at_options *o, at_bundle *b)
{
    const char *name = at_opt_str(o, "eval_dataset"), *split = at_opt_str(o, "eval_split");
    at_mc_options mo = {0};
    mo.n_shot = (int)at_opt_int(o, "n_shot");
    mo.limit = (int)at_opt_int(o, "eval_limit");
    mo.max_length = (int)at_opt_int(o, "max_length");
    mo.batch_size = (int)at_opt_int(o, "eval_batch_size");
    mo.progress = 1;
    if (mo.n_shot < 0 || mo.limit < 0 || mo.max_length < 0 || mo.batch_size <= 0) {
        fprintf(stderr, "anytune eval: error: --n_shot, --eval_limit and --max_length must be >= 0, "
                        "--eval_batch_size > 0\n");
        return 2;
    }
    char *dir = NULL, bn[256], file[300], *path = NULL;
    if (at_mc_bench_find(name, &dir) != AT_OK) return at_cli_fail();
    base_name(dir, bn, sizeof bn);
    const char *lang = at_opt_str(o, "lang");
    if (!lang) lang = strstr(bn, "ceval") || strstr(bn, "cmmlu") ? "zh" : "en";
    int rc = 1;
    at_mc_bench bench = {0};
    at_mc_result r = {0};
    cJSON *j = NULL;
    char *text = NULL;
    if (at_mc_lang_parse(lang, &mo.lang) != AT_OK) {
        fprintf(stderr, "anytune eval: error: %s\n", at_last_error());
        rc = 2;
        goto done;
    }
    if (at_mc_bench_load(dir, split, mo.n_shot > 0, &bench) != AT_OK) goto fail;
    fprintf(stderr, "anytune eval: %s (%s), %zu subjects, split %s, %d-shot, lang %s%s\n", bn, dir, bench.n, split,
            mo.n_shot, at_mc_lang_name(mo.lang), b->tmpl ? "" : ", no chat template (fewshot layout)");
    if (at_mc_evaluate(b, &bench, &mo, &r) != AT_OK) goto fail;
    text = at_mc_result_text(&bench, &r);
    if (text) fputs(text, stdout);
    j = at_mc_result_json(&bench, &r);
    if (!j) goto oom;
    cJSON_AddStringToObject(j, "task", "multiple_choice");
    cJSON_AddStringToObject(j, "dataset", bn);
    cJSON_AddStringToObject(j, "dataset_dir", dir);
    cJSON_AddStringToObject(j, "split", split);
    cJSON_AddNumberToObject(j, "n_shot", mo.n_shot);
    cJSON_AddStringToObject(j, "lang", at_mc_lang_name(mo.lang));
    cJSON_AddNumberToObject(j, "max_length", at_bundle_context(b, mo.max_length));
    cJSON_AddStringToObject(j, "model", b->name);
    cJSON *ci = cJSON_CreateIntArray((const int[]){r.choice_ids[0], r.choice_ids[1], r.choice_ids[2],
                                                   r.choice_ids[3]}, 4);
    cJSON_AddItemToObject(j, "choice_ids", ci);
    snprintf(file, sizeof file, "%s_%s_results", bn, split);
    if (write_result(o, j, file, &path) != AT_OK) goto fail;
    fprintf(stderr, "anytune eval: %zu questions (%zu skipped as too long) in %.1f s; results in %s\n", r.total,
            r.skipped, r.seconds, path);
    rc = 0;
    goto done;
oom:
    at_error(AT_ERR_NOMEM, "out of memory");
fail:
    rc = at_cli_fail();
done:
    free(path);
    free(text);
    cJSON_Delete(j);
    at_mc_result_free(&r);
    at_mc_bench_free(&bench);
    free(dir);
    return rc;
}

static int run_loss(const at_options *o, at_bundle *b)
{
    at_loss_eval_options lo = {0};
    lo.pt = at_opt_bool(o, "pt");
    lo.max_length = (int)at_opt_int(o, "max_length");
    lo.batch_size = (int)at_opt_int(o, "eval_batch_size");
    lo.strict = at_opt_bool(o, "strict");
    lo.seed = (uint64_t)at_opt_int(o, "seed");
    const char *ls = at_opt_str(o, "loss_scale");
    if (strcmp(ls, "default") != 0 && strcmp(ls, "last_round") != 0) {
        fprintf(stderr, "anytune eval: error: --loss_scale %s: use default or last_round\n", ls);
        return 2;
    }
    lo.last_turn_only = !strcmp(ls, "last_round");
    lo.model_name = at_opt_str(o, "model_name");
    lo.model_author = at_opt_str(o, "model_author");
    if (at_truncation_parse(at_opt_str(o, "truncation_strategy"), &lo.truncation) != AT_OK) {
        fprintf(stderr, "anytune eval: error: %s\n", at_last_error());
        return 2;
    }
    if (lo.max_length < 0 || lo.batch_size <= 0) {
        fprintf(stderr, "anytune eval: error: --max_length must be >= 0 and --eval_batch_size > 0\n");
        return 2;
    }
    int n = at_opt_list_count(o, "dataset");
    const char **ds = calloc((size_t)n + 1, sizeof *ds);
    if (!ds) {
        at_error(AT_ERR_NOMEM, "out of memory");
        return at_cli_fail();
    }
    for (int i = 0; i < n; i++) ds[i] = at_opt_list_get(o, "dataset", i);
    at_loss_eval_result r;
    cJSON *j = NULL;
    char *path = NULL;
    int rc = 1;
    if (at_loss_eval_run(b, ds, (size_t)n, &lo, &r) != AT_OK) goto fail;
    size_t read = r.n_samples + r.n_dropped + r.n_failed + r.n_no_targets;
    printf("eval_loss: %.6f\nperplexity: %.4f\ntokens: %lld\nsamples: %zu of %zu (%zu longer than --max_length "
           "%d dropped, %zu failed, %zu without targets)\n", r.loss, r.perplexity, (long long)r.n_targets,
           r.n_samples, read, r.n_dropped, at_bundle_context(b, lo.max_length), r.n_failed, r.n_no_targets);
    j = cJSON_CreateObject();
    if (!j) {
        at_error(AT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    cJSON_AddStringToObject(j, "task", lo.pt ? "loss_pt" : "loss");
    cJSON_AddNumberToObject(j, "eval_loss", r.loss);
    cJSON_AddNumberToObject(j, "perplexity", r.perplexity);
    cJSON_AddNumberToObject(j, "loss_sum", r.loss_sum);
    cJSON_AddNumberToObject(j, "tokens", (double)r.n_targets);
    cJSON_AddNumberToObject(j, "samples", (double)r.n_samples);
    cJSON_AddNumberToObject(j, "dropped_too_long", (double)r.n_dropped);
    cJSON_AddNumberToObject(j, "failed", (double)r.n_failed);
    cJSON_AddNumberToObject(j, "without_targets", (double)r.n_no_targets);
    cJSON_AddNumberToObject(j, "max_length", at_bundle_context(b, lo.max_length));
    cJSON_AddStringToObject(j, "model", b->name);
    cJSON_AddNumberToObject(j, "seconds", r.seconds);
    if (write_result(o, j, "loss_results", &path) != AT_OK) goto fail;
    fprintf(stderr, "anytune eval: %zu samples in %.1f s; results in %s\n", r.n_samples, r.seconds, path);
    rc = 0;
    goto done;
fail:
    rc = at_cli_fail();
done:
    free(path);
    cJSON_Delete(j);
    free(ds);
    return rc;
}

int at_cmd_eval(int argc, char **argv)
{
    const char *usage =
        "usage: anytune eval [--model DIR] --eval_dataset mmlu|ceval|DIR [OPTIONS]   multiple-choice accuracy\n"
        "       anytune eval [--model DIR] --dataset FILE [--pt] [OPTIONS]          loss and perplexity";
    at_options *o = NULL;
    int rc = at_cli_parse(specs, NSPECS, argc, argv, "eval", usage, &o);
    if (rc >= 0) return rc;
    at_bundle *b = NULL;
    rc = 1;
    if (!at_opt_str(o, "eval_dataset") && at_opt_list_count(o, "dataset") == 0) {
        fprintf(stderr, "anytune eval: error: nothing to evaluate: give --eval_dataset (mmlu, ceval or a benchmark "
                        "folder) and/or --dataset FILE\n%s\n", usage);
        rc = 2;
        goto done;
    }
    if (at_cli_load_bundle(o, &b) != AT_OK) {
        rc = at_cli_fail();
        goto done;
    }
    if (at_opt_str(o, "adapter_name") && b->n_adapters == 0) {
        fprintf(stderr, "anytune eval: error: --adapter_name %s without --adapters: give the adapter folders "
                        "(NAME=DIR) to choose from\n", at_opt_str(o, "adapter_name"));
        rc = 2;
        goto done;
    }
    if (b->n_adapters > 0) {
        const char *want = at_opt_str(o, "adapter_name");
        at_adapter *ad = want ? at_bundle_adapter_get(b, want) : b->adapters[0].adapter;
        if (!ad) {
            fprintf(stderr, "anytune eval: error: --adapter_name %s: no adapter of that name\n", want);
            rc = 2;
            goto done;
        }
        if (at_decoder_set_adapter(b->decoder, ad) != AT_OK) {
            rc = at_cli_fail();
            goto done;
        }
    }
    rc = 0;
    if (at_opt_str(o, "eval_dataset")) rc = run_mc(o, b);
    if (rc == 0 && at_opt_list_count(o, "dataset") > 0) rc = run_loss(o, b);
done:
    at_bundle_free(b);
    at_options_free(o);
    return rc;
}
