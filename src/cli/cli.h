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

/* A --model value as given, or, for a folder with no config.json and
 * exactly one .gguf file, that file (said on stderr). Into buf. */
const char *at_cli_model_path(const char *model, char *buf, size_t len);

/* An --adapters value (DIR or NAME=DIR) with DIR resolved: a run folder
 * (no adapter_config.json, checkpoint-N folders inside) becomes its newest
 * complete checkpoint, said on stderr; a folder with neither is an error
 * saying so. *out: a new string (caller frees). */
at_status at_cli_adapter_path(const char *arg, char **out);

/* The base model an adapter (a checkpoint folder, DIR or NAME=DIR) was
 * trained on, as ms-swift's --load_args finds it: "model" in the run's
 * args.json (beside the checkpoint, or in it), else adapter_config.json's
 * base_model_name_or_path when that is a path that exists. *out: a new
 * string (caller frees); AT_ERR_NOT_FOUND when neither says. */
at_status at_cli_adapter_base(const char *arg, char **out);

/* infer --val_dataset FILE / --load_data_args: every record's prompt
 * answered through the continuous-batching scheduler with gp, results as
 * JSON Lines in --result_path. Returns the exit status. Defined in
 * infer_dataset.c. */
struct at_gen_params;
int at_cli_infer_dataset(const at_options *o, struct at_bundle *b, const struct at_gen_params *gp, int context);

/* --dry_run output: the plan as text or (json) JSON on stdout. Returns the
 * exit status: 0 when the plan fits, 1 when it does not. */
int at_cli_print_plan(const at_plan *p, int json);

/* Replaces hub names in --model, --ref_model, --reward_model, --adapters,
 * --dataset and --val_dataset with the local paths they are fetched to
 * (cmd_download.c). Called by at_cli_parse. */
at_status at_cli_resolve_names(at_options *o);

#endif
