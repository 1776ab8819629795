/* The anytune command line: one function per command. Each returns the
 * process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef AT_CLI_H
#define AT_CLI_H

#include "base/status.h"

int at_cmd_env(int argc, char **argv);
int at_cmd_infer(int argc, char **argv);
int at_cmd_serve(int argc, char **argv);
int at_cmd_export(int argc, char **argv);
int at_cmd_sft(int argc, char **argv);
int at_cmd_pt(int argc, char **argv);

/* Loads the model of infer/serve from their options (--model, --tokenizer,
 * --template, --adapters, --device, --torch_dtype; no --model: the bundled
 * demo). Defined in cmd_infer.c. */
struct at_options;
struct at_bundle;
at_status at_cli_load_bundle(const struct at_options *o, struct at_bundle **out);

/* Prints "anytune: error: <message>" for the current error and returns 1. */
int at_cli_fail(void);

#endif
