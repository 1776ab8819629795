/* The anytune command line: one function per command. Each returns the
 * process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef AT_CLI_H
#define AT_CLI_H

#include "base/status.h"

int at_cmd_env(int argc, char **argv);
int at_cmd_export(int argc, char **argv);
int at_cmd_sft(int argc, char **argv);
int at_cmd_pt(int argc, char **argv);

/* Prints "anytune: error: <message>" for the current error and returns 1. */
int at_cli_fail(void);

#endif
