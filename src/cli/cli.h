/* The anytune command line: one function per command. Each returns the
 * process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef AT_CLI_H
#define AT_CLI_H

int at_cmd_env(int argc, char **argv);

/* Prints "anytune: error: <message>" for the current error and returns 1. */
int at_cli_fail(void);

#endif
