/* The body shared by `anytune serve` and `anytune web-ui`: one option table,
 * the model loaded, the server run until SIGTERM/SIGINT. */
#ifndef AT_CLI_CMD_SERVE_H
#define AT_CLI_CMD_SERVE_H

typedef struct {
    const char *command; /* "serve" or "web-ui": messages and --help */
    const char *usage;   /* first line of --help */
    int webui_train;     /* the page's Train tab starts `anytune sft` jobs */
    const char *default_port; /* --port's default (static text), shown by --help */
} at_serve_cli;

/* Parses argv and serves until a stop signal. Returns the exit status. */
int at_cli_serve(int argc, char **argv, const at_serve_cli *c);

#endif
