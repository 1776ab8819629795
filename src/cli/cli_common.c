/* What every command does alike: option parsing with --help, and printing a plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

int at_cli_fail(void)
{
    fprintf(stderr, "anytune: error: %s\n", at_last_error());
    return 1;
}

int at_cli_parse(const at_opt_spec *specs, int n, int argc, char **argv, const char *command, const char *usage,
                 at_options **out)
{
    *out = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            at_options_print_help(specs, n, usage);
            return 0;
        }
    if (at_options_parse(specs, n, argc, argv, out) != AT_OK) {
        fprintf(stderr, "anytune %s: error: %s\n", command, at_last_error());
        return 2;
    }
    return -1;
}

int at_cli_print_plan(const at_plan *p, int json)
{
    char *text = NULL;
    if (json) {
        cJSON *j = at_plan_to_json(p);
        text = j ? cJSON_Print(j) : NULL;
        cJSON_Delete(j);
        if (text) printf("%s\n", text);
    } else {
        text = at_plan_to_text(p);
        if (text) fputs(text, stdout);
    }
    free(text);
    return p->fits ? 0 : 1;
}
