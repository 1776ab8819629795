/* The anytune command line: one function per command. Each returns the
 * process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef AT_CLI_H
#define AT_CLI_H

#include "base/options.h"
#include "base/status.h"
#include "plan/planner.h"

int at_cmd_env(int argc, char **argv);
int at_cmd_infer(int argc, char **argv);
int at_cmd_serve(int argc, char **argv);
int at_cmd_webui(int argc, char **argv);
int at_cmd_export(int argc, char **argv);
int at_cmd_sft(int argc, char **argv);
int at_cmd_pt(int argc, char **argv);
int at_cmd_rlhf(int argc, char **argv);
int at_cmd_eval(int argc, char **argv);
int at_cmd_download(int argc, char **argv);

/* Loads the model of infer/serve from their options (--model, --tokenizer,
 * --template, --adapters, --device, --torch_dtype; no --model: the bundled
 * demo). Defined in cmd_infer.c. */
struct at_options;
struct at_bundle;
at_status at_cli_load_bundle(const struct at_options *o, struct at_bundle **out);

/* Prints "anytune: error: <message>" for the current error and returns 1. */
int at_cli_fail(void);

/* Parses a command's options; --help prints `usage` and the table. Returns -1
 * when the command should go on with *out (caller frees), else the exit
 * status to return (0 after --help, 2 after an error, already printed). */
int at_cli_parse(const at_opt_spec *specs, int n, int argc, char **argv, const char *command, const char *usage,
                 at_options **out);

/* A file of the bundled demo (e.g. "demo/stories260K"): relative to the
 * working folder, else to the program (build/anytune -> ../demo); written
 * into buf when needed. NULL when neither exists. */
const char *at_cli_demo_path(const char *rel, char *buf, size_t len);

/* --dry_run output: the plan as text or (json) JSON on stdout. Returns the
 * exit status: 0 when the plan fits, 1 when it does not. */
int at_cli_print_plan(const at_plan *p, int json);

/* The rows of the hub options (cmd_download.c), in every table with a --model
 * or --dataset: names ORG/NAME[@REV] there are fetched before the job runs. */
#define AT_CLI_HUB_OPTIONS                                                                                        \
    {"use_hf", AT_OPT_BOOL, "true", "hub names from the Hugging Face Hub (false: from ModelScope)", NULL},         \
    {"hub", AT_OPT_STRING, NULL, "huggingface or modelscope (overrides --use_hf)", NULL},                          \
    {"hub_token", AT_OPT_STRING, NULL, "hub access token (default: HF_TOKEN / MODELSCOPE_API_TOKEN)", NULL},       \
    {"gguf_file", AT_OPT_STRING, NULL, "which GGUF of a hub repository: a file name or quantization (Q4_K_M)", NULL}

/* Replaces hub names in --model, --ref_model, --reward_model, --adapters,
 * --dataset and --val_dataset with the local paths they are fetched to
 * (cmd_download.c). Called by at_cli_parse. */
at_status at_cli_resolve_names(at_options *o);

#endif
