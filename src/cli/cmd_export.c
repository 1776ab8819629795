/* anytune export: merge LoRA adapters and write Hugging Face folders or GGUF
 * files (export/export_job.h does the work). Option names as ms-swift's
 * `swift export` where one exists. */
#include <stdio.h>
#include <string.h>
#include "base/manifest.h"
#include "base/options.h"
#include "cli/cli.h"
#include "export/export_files.h"
#include "export/export_gguf.h"
#include "export/export_job.h"

static const at_opt_spec specs[] = {
    {"model", AT_OPT_STRING, NULL, "model: Hugging Face folder, GGUF or llama2.c file", NULL},
    {"no_verify", AT_OPT_BOOL, "false", "read checkpoints whose files do not match their MANIFEST.sha256 (damaged "
     "or edited since written)", NULL},
    {"adapters", AT_OPT_STRING, NULL, "PEFT LoRA adapter folder (e.g. a checkpoint-STEP folder)", NULL},
    {"merge_lora", AT_OPT_BOOL, "false", "merge the adapter into the weights (W + alpha/r * B*A)", NULL},
    {"to", AT_OPT_STRING, "hf", "hf (Hugging Face folder / PEFT adapter) or gguf (llama.cpp)", NULL},
    {"output_dir", AT_OPT_STRING, NULL, "folder to create (refused if it exists, unless --overwrite)", NULL},
    {"quant", AT_OPT_STRING, NULL, "gguf: f32, f16, bf16, q8_0, q4_0 (default: the model's own)", NULL},
    {"torch_dtype", AT_OPT_STRING, NULL, "hf: float32, bfloat16, float16 (default: the model's own)", "dtype"},
    {"max_shard_size", AT_OPT_STRING, "5GB", "hf: largest safetensors file (e.g. 2GB, 500MB)", NULL},
    {"tokenizer", AT_OPT_STRING, NULL, "tokenizer folder or file (default: the model's)", NULL},
    {"overwrite", AT_OPT_BOOL, "false", "replace an existing --output_dir", NULL},
    {"quiet", AT_OPT_BOOL, "false", "no progress bar", NULL},
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
    at_export_args a = {
        .model = at_opt_str(o, "model"),
        .adapters = at_opt_str(o, "adapters"),
        .merge_lora = at_opt_bool(o, "merge_lora"),
        .to = at_opt_str(o, "to"),
        .output_dir = at_opt_str(o, "output_dir"),
        .dtype = AT_DTYPE_COUNT,
        .tokenizer = at_opt_str(o, "tokenizer"),
        .overwrite = at_opt_bool(o, "overwrite"),
        .progress = !at_opt_bool(o, "quiet"),
    };
    const char *quant = at_opt_str(o, "quant"), *td = at_opt_str(o, "torch_dtype");
    int gguf = a.to && !strcmp(a.to, "gguf");
    if (!a.model || !a.output_dir) {
        fprintf(stderr, "anytune export: error: --model and --output_dir are required\n%s\n", usage);
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
    at_options_free(o);
    return rc;
}
