/* What every command does alike: option parsing with --help, and printing a plan. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "train/run_files.h"

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
    int k = 0;
    for (const at_opt_spec *s; (s = at_options_ignored(*out, &k));)
        fprintf(stderr, "anytune %s: note: --%s changes nothing here: %s\n", command, s->name, s->note);
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

const char *at_cli_model_path(const char *model, char *buf, size_t len)
{
    if (!model || !at_is_dir(model)) return model;
    char *cfg = at_path_join(model, "config.json");
    int has_cfg = cfg && at_file_exists(cfg);
    free(cfg);
    if (has_cfg) return model;
    DIR *d = opendir(model);
    if (!d) return model;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) {
            if (n++ == 0) snprintf(buf, len, "%s/%s", model, e->d_name);
        }
    }
    closedir(d);
    if (n != 1) return model; /* none, or several: the loader's error says what the folder lacks */
    fprintf(stderr, "anytune: %s holds one GGUF file: loading %s\n", model, buf);
    return buf;
}

/* DIR of "NAME=DIR" (NAME: letters, digits, - _ .), else the whole value. */
static const char *adapter_dir_part(const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) return arg;
    for (const char *p = arg; p < eq; p++)
        if (*p == '/') return arg;
    return eq + 1;
}

/* Whether the run in dir was made with --load_best_model_at_end (its args.json). */
static int run_loads_best(const char *dir)
{
    char *p = at_path_join(dir, "args.json");
    cJSON *j = NULL;
    int yes = p && at_file_exists(p) && at_json_parse_file(p, &j) == AT_OK &&
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "load_best_model_at_end"));
    cJSON_Delete(j);
    free(p);
    at_clear_error();
    return yes;
}

at_status at_cli_adapter_path(const char *arg, char **out)
{
    *out = NULL;
    const char *dir = adapter_dir_part(arg);
    char *cfg = at_path_join(dir, "adapter_config.json");
    int is_adapter = cfg && at_file_exists(cfg);
    free(cfg);
    if (is_adapter || !at_is_dir(dir)) { /* an adapter, a GGUF file, or a missing path the loader names */
        *out = strdup(arg);
        return *out ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    }
    char *ckpt = NULL;
    int64_t step = 0;
    double best = 0;
    const char *which = "newest";
    at_status st = AT_ERR_NOT_FOUND;
    /* a run with --load_best_model_at_end ends as its best checkpoint (transformers') */
    if (run_loads_best(dir) && at_run_best_checkpoint(dir, &step, &best) == AT_OK) {
        ckpt = malloc(strlen(dir) + 40);
        if (!ckpt) return at_error(AT_ERR_NOMEM, "out of memory");
        snprintf(ckpt, strlen(dir) + 40, "%s/checkpoint-%lld", dir, (long long)step);
        which = "best (--load_best_model_at_end)";
        st = AT_OK;
    }
    at_clear_error();
    if (!ckpt) st = at_ckpt_find_last(dir, &ckpt, &step);
    if (st == AT_ERR_NOT_FOUND)
        return at_error(AT_ERR_NOT_FOUND, "--adapters %s: neither an adapter (no adapter_config.json) nor a run "
                        "folder with a complete checkpoint-N inside", dir);
    if (st != AT_OK) return st;
    size_t n = (size_t)(dir - arg) + strlen(ckpt) + 1;
    *out = malloc(n);
    if (*out) snprintf(*out, n, "%.*s%s", (int)(dir - arg), arg, ckpt);
    fprintf(stderr, "anytune: --adapters %s is a run folder: using its %s checkpoint, %s\n", dir, which, ckpt);
    free(ckpt);
    return *out ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
}

/* "model" of the args.json at path, when it names a model that exists. */
static char *model_of_args(const char *path)
{
    cJSON *j = NULL;
    if (!at_file_exists(path) || at_json_parse_file(path, &j) != AT_OK) return NULL;
    const cJSON *m = cJSON_GetObjectItem(j, "model");
    char *r = cJSON_IsString(m) && m->valuestring[0] && at_file_exists(m->valuestring) ? strdup(m->valuestring) : NULL;
    cJSON_Delete(j);
    return r;
}

at_status at_cli_adapter_base(const char *arg, char **out)
{
    *out = NULL;
    const char *dir = adapter_dir_part(arg);
    char path[PATH_MAX];
    /* the run's args.json (CKPT/../args.json), or one kept in the checkpoint */
    snprintf(path, sizeof path, "%s/../args.json", dir);
    if ((*out = model_of_args(path))) return AT_OK;
    snprintf(path, sizeof path, "%s/args.json", dir);
    if ((*out = model_of_args(path))) return AT_OK;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *j = NULL;
    if (at_file_exists(path) && at_json_parse_file(path, &j) == AT_OK) {
        const cJSON *b = cJSON_GetObjectItem(j, "base_model_name_or_path");
        if (cJSON_IsString(b) && b->valuestring[0] && at_file_exists(b->valuestring)) *out = strdup(b->valuestring);
        cJSON_Delete(j);
        at_clear_error();
        if (*out) return AT_OK;
    }
    at_clear_error();
    if (!at_is_dir(dir) && at_file_exists(dir)) /* a LoRA GGUF: llama.cpp's format names no base model */
        return at_error(AT_ERR_NOT_FOUND, "--adapters %s: a LoRA GGUF file does not say which model it was trained "
                        "on: give --model (the base model, as llama.cpp's --lora needs -m)", dir);
    return at_error(AT_ERR_NOT_FOUND, "--adapters %s: no args.json beside it and no base_model_name_or_path that "
                    "exists in its adapter_config.json: give --model", dir);
}
