/* anytune export: merge LoRA adapters and write Hugging Face folders or GGUF
 * files (export/export_job.h does the work). Option names as ms-swift's
 * `swift export` where one exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/manifest.h"
#include "base/options.h"
#include "cli/cli.h"
#include "hub/hub.h"
#include "model/config.h"
#include "export/export_files.h"
#include "export/export_gguf.h"
#include "export/export_job.h"

static const at_opt_spec specs[] = {
    {.name = "model", .type = AT_OPT_STRING, .help = "model: Hugging Face folder, GGUF or llama2.c file (default with --adapters: the base model named in "
             "the run's args.json or adapter_config.json)"},
    {.name = "no_verify", .type = AT_OPT_BOOL, .def = "false",
     .help = "read checkpoints whose files do not match their MANIFEST.sha256 (damaged or edited since written)"},
    {.name = "adapters", .type = AT_OPT_STRING, .help = "PEFT LoRA adapter folder (a checkpoint-STEP folder, or a run folder: its newest checkpoint)"},
    {.name = "merge_lora", .type = AT_OPT_BOOL, .def = "false",
     .help = "merge the adapter into the weights (W + alpha/r * B*A)"},
    {.name = "to", .type = AT_OPT_STRING, .def = "hf",
     .help = "hf (Hugging Face folder / PEFT adapter) or gguf (llama.cpp)"},
    {.name = "output_dir", .type = AT_OPT_STRING,
     .help = "folder to create (refused if it exists, unless --overwrite); with --to gguf, a name ending in .gguf "
             "is the file itself (default with --merge_lora: ADAPTER-merged)"},
    {.name = "quant", .type = AT_OPT_STRING, .help = "gguf: f32, f16, bf16, q8_0, q4_0 (default: the model's own)"},
    {.name = "torch_dtype", .type = AT_OPT_STRING,
     .help = "hf: float32, bfloat16, float16 (default: the model's own)", .alias = "dtype"},
    {.name = "max_shard_size", .type = AT_OPT_STRING, .def = "5GB",
     .help = "hf: largest safetensors file (e.g. 2GB, 500MB)"},
    {.name = "tokenizer", .type = AT_OPT_STRING, .help = "tokenizer folder or file (default: the model's)"},
    {.name = "overwrite", .type = AT_OPT_BOOL, .def = "false", .help = "replace an existing --output_dir"},
    {.name = "quiet", .type = AT_OPT_BOOL, .def = "false", .help = "no progress bar"},
    AT_HUB_OPTION_ROWS,
    AT_MODEL_TYPE_OPTION_ROW,
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

int at_cmd_export(int argc, char **argv)
{
    const char *usage =
        "usage: anytune export --model DIR [--adapters DIR [--merge_lora]] --to hf|gguf --output_dir OUT [OPTIONS]";
    at_options *o = NULL;
    int prc = at_cli_parse(specs, NSPECS, argc, argv, "export", usage, &o);
    if (prc >= 0) return prc;
    int rc = 2;
    at_manifest_set_checks(!at_opt_bool(o, "no_verify"));
    char *adapters = NULL, *base = NULL, *merged = NULL;
    char gguf_buf[4096];
    at_export_args a = {
        .model = at_cli_model_path(at_opt_str(o, "model"), gguf_buf, sizeof gguf_buf),
        .merge_lora = at_opt_bool(o, "merge_lora"),
        .to = at_opt_str(o, "to"),
        .output_dir = at_opt_str(o, "output_dir"),
        .dtype = AT_DTYPE_COUNT,
        .tokenizer = at_opt_str(o, "tokenizer"),
        .model_type = at_opt_str(o, "model_type"),
        .overwrite = at_opt_bool(o, "overwrite"),
        .progress = !at_opt_bool(o, "quiet"),
    };
    const char *quant = at_opt_str(o, "quant"), *td = at_opt_str(o, "torch_dtype");
    int gguf = a.to && !strcmp(a.to, "gguf");
    if (at_opt_str(o, "adapters")) {
        if (at_cli_adapter_path(at_opt_str(o, "adapters"), &adapters) != AT_OK) {
            rc = at_cli_fail();
            goto done;
        }
        a.adapters = adapters;
        if (!a.model) { /* the base the adapter was trained on, as ms-swift's --load_args */
            if (at_cli_adapter_base(adapters, &base) != AT_OK) {
                rc = at_cli_fail();
                goto done;
            }
            a.model = at_cli_model_path(base, gguf_buf, sizeof gguf_buf);
            fprintf(stderr, "anytune export: no --model given: using %s, the base model of %s\n", a.model, adapters);
        }
        if (!a.output_dir && a.merge_lora) { /* ms-swift's default: ADAPTER-merged beside the adapter */
            size_t n = strlen(adapters);
            while (n > 1 && adapters[n - 1] == '/') n--;
            merged = malloc(n + 16);
            if (!merged) goto done;
            snprintf(merged, n + 16, "%.*s-merged%s", (int)n, adapters, gguf ? ".gguf" : "");
            a.output_dir = merged;
            fprintf(stderr, "anytune export: no --output_dir given: writing %s\n", merged);
        }
    }
    if (!a.model || !a.output_dir) {
        fprintf(stderr, "anytune export: error: --model and --output_dir are required (--adapters finds the model "
                        "it was trained on; --merge_lora names the output ADAPTER-merged)\n%s\n", usage);
        goto done;
    }
    if (quant && !gguf) {
        fprintf(stderr, "anytune export: error: --quant is for --to gguf (use --torch_dtype for hf)\n");
        goto done;
    }
    if (quant && at_export_parse_quant(quant, &a.dtype) != AT_OK) {
        fprintf(stderr, "anytune export: error: %s\n", at_last_error());
        goto done;
    }
    if (td) {
        if (gguf && quant) {
            fprintf(stderr, "anytune export: error: give --quant or --torch_dtype, not both\n");
            goto done;
        }
        if (at_dtype_parse(td, &a.dtype) != 0 || (a.dtype != AT_F32 && a.dtype != AT_BF16 && a.dtype != AT_F16)) {
            fprintf(stderr, "anytune export: error: --torch_dtype \"%s\": expected float32, bfloat16 or float16\n", td);
            goto done;
        }
    }
    if (at_export_parse_size(at_opt_str(o, "max_shard_size"), &a.max_shard_size) != AT_OK) {
        fprintf(stderr, "anytune export: error: --max_shard_size: %s\n", at_last_error());
        goto done;
    }
    rc = at_export_run(&a) == AT_OK ? 0 : at_cli_fail();
done:
    free(adapters);
    free(base);
    free(merged);
    at_options_free(o);
    return rc;
}
