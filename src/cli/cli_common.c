/* What every command does alike: option parsing with --help, and printing a plan. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
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
    if (at_cli_resolve_names(*out) != AT_OK) { /* hub names to local paths */
        fprintf(stderr, "anytune %s: error: %s\n", command, at_last_error());
        at_options_free(*out);
        *out = NULL;
        return 1;
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

const char *at_cli_demo_path(const char *rel, char *buf, size_t len)
{
    if (at_file_exists(rel)) return rel;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = '\0';
    int w = snprintf(buf, len, "%.*s/../%s", (int)(len > 64 ? len - 64 : 0), exe, rel);
    return w > 0 && (size_t)w < len && at_file_exists(buf) ? buf : NULL;
}
