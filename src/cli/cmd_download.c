/* anytune download ORG/NAME: fetch a model or dataset from the Hugging Face
 * Hub or ModelScope into their caches (hub/hub.h) and print its folder.
 * Also the name resolution every command runs after parsing its options:
 * --model, --ref_model, --reward_model, --adapters, --dataset and
 * --val_dataset given as hub names become the local paths the jobs read. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "hub/hub.h"

static const at_opt_spec specs[] = {
    {.name = "repo_type", .type = AT_OPT_STRING, .def = "model", .choices = "model|dataset",
     .help = "model or dataset"},
    {.name = "include", .type = AT_OPT_LIST,
     .help = "glob patterns of the files to fetch ('*' crosses '/'; default: what a model needs, or a dataset's "
             "every file)"},
    AT_HUB_OPTION_ROWS,
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

/* The hub options as resolved from a command's table (rows AT_HUB_OPTION_ROWS). */
static at_status hub_options(const at_options *o, at_hub_options *h)
{
    memset(h, 0, sizeof *h);
    h->hub = at_opt_str(o, "use_hf") && !at_opt_bool(o, "use_hf") ? AT_HUB_MODELSCOPE : AT_HUB_HF;
    if (at_opt_str(o, "hub")) AT_TRY(at_hub_parse_kind(at_opt_str(o, "hub"), &h->hub));
    h->token = at_opt_str(o, "hub_token");
    h->gguf = at_opt_str(o, "gguf_file");
    return AT_OK;
}

/* One model or adapter value: "ORG/NAME[@REV]" or "ALIAS=ORG/NAME" (serve's
 * named adapters). Returns a new string (the local path, or value itself). */
static at_status resolve_model(const at_hub_options *h, const char *value, char **out)
{
    const char *eq = strchr(value, '=');
    const char *name = eq && (!strchr(value, '/') || eq < strchr(value, '/')) ? eq + 1 : value;
    *out = NULL;
    if (!at_hub_is_name(name, AT_REPO_MODEL)) return (*out = strdup(value)) ? AT_OK : AT_ERR_NOMEM;
    char *dir = NULL;
    at_status st = at_hub_snapshot(name, AT_REPO_MODEL, h, &dir);
    if (st != AT_OK) return at_error_wrap(st, "'%s' is not a local path; as a hub name", name);
    size_t pre = (size_t)(name - value);
    *out = malloc(pre + strlen(dir) + 1);
    if (*out) {
        memcpy(*out, value, pre);
        strcpy(*out + pre, dir);
    }
    free(dir);
    return *out ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
}

/* A dataset value "ORG/NAME[@REV][:SUBSET][#N]": its train files, the N
 * samples shared among them (the first takes the remainder). Appends to buf. */
static at_status resolve_dataset(const at_hub_options *h, const char *value, char **buf)
{
    char *spec = strdup(value);
    if (!spec) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t want = 0;
    char *hash = strrchr(spec, '#');
    if (hash && hash[1] && strspn(hash + 1, "0123456789") == strlen(hash + 1)) {
        want = (size_t)strtoull(hash + 1, NULL, 10);
        *hash = '\0';
    }
    at_status st = AT_OK;
    const char *ext = strrchr(spec, '.');
    int looks_local = ext && (!strcmp(ext, ".json") || !strcmp(ext, ".jsonl") || !strcmp(ext, ".csv") ||
                              !strcmp(ext, ".parquet") || !strcmp(ext, ".txt"));
    char **files = NULL;
    size_t n = 0;
    if (looks_local || !at_hub_is_name(spec, AT_REPO_DATASET)) {
        files = malloc(sizeof *files);
        if (files && (files[0] = strdup(value))) n = 1;
        else st = at_error(AT_ERR_NOMEM, "out of memory");
        want = 0;
    } else {
        st = at_hub_dataset_files(spec, h, &files, &n);
        if (st != AT_OK) st = at_error_wrap(st, "'%s' is not a local file; as a hub dataset", spec);
    }
    for (size_t i = 0; st == AT_OK && i < n; i++) {
        size_t share = want ? want / n + (i == 0 ? want % n : 0) : 0;
        if (want && !share) continue;
        char num[32] = "";
        if (share) snprintf(num, sizeof num, "#%zu", share);
        size_t have = *buf ? strlen(*buf) : 0;
        char *nb = realloc(*buf, have + strlen(files[i]) + strlen(num) + 2);
        if (!nb) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        sprintf(nb + have, "%s%s%s", have ? "," : "", files[i], num);
        *buf = nb;
    }
    for (size_t i = 0; i < n; i++) free(files[i]);
    free(files);
    free(spec);
    return st;
}

/* The token is not written to args.json or shown again: the names it
 * opened are local paths from here on. */
static at_status hide_token(at_options *o)
{
    const char *t = at_opt_str(o, "hub_token");
    return t && *t ? at_opt_set(o, "hub_token", "(hidden)") : AT_OK;
}

at_status at_cli_resolve_names(at_options *o)
{
    static const char *const models[] = {"model", "ref_model", "reward_model", "adapters"};
    static const char *const datasets[] = {"dataset", "val_dataset"};
    at_hub_options h;
    int any = 0;
    if (at_opt_str(o, "repo_type")) return AT_OK; /* anytune download's own table: it fetches by itself */
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        const char *s = at_opt_str(o, models[k]);
        any |= (s && at_hub_is_name(strchr(s, '=') ? strchr(s, '=') + 1 : s, AT_REPO_MODEL)) ||
               at_opt_list_count(o, models[k]) > 0;
    }
    for (size_t k = 0; k < sizeof datasets / sizeof datasets[0]; k++) any |= at_opt_list_count(o, datasets[k]) > 0;
    if (!any) return hide_token(o);
    AT_TRY(hub_options(o, &h));
    char *token = h.token ? strdup(h.token) : NULL; /* hide_token below replaces the option's text */
    h.token = token;
    at_status st = AT_OK;
    for (size_t k = 0; k < sizeof models / sizeof models[0] && st == AT_OK; k++) {
        const char *key = models[k];
        int n = at_opt_list_count(o, key);
        char *joined = NULL, *one = NULL;
        if (n == 0 && at_opt_str(o, key)) {
            st = resolve_model(&h, at_opt_str(o, key), &one);
            if (st == AT_OK && strcmp(one, at_opt_str(o, key))) st = at_opt_set(o, key, one);
        }
        for (int i = 0; i < n && st == AT_OK; i++) {
            st = resolve_model(&h, at_opt_list_get(o, key, i), &one);
            size_t have = joined ? strlen(joined) : 0;
            char *nj = st == AT_OK ? realloc(joined, have + strlen(one) + 2) : NULL;
            if (st == AT_OK && !nj) st = at_error(AT_ERR_NOMEM, "out of memory");
            if (nj) {
                sprintf(nj + have, "%s%s", have ? "," : "", one);
                joined = nj;
            }
            free(one);
            one = NULL;
        }
        if (st == AT_OK && joined) st = at_opt_set(o, key, joined);
        free(joined);
        free(one);
    }
    for (size_t k = 0; k < sizeof datasets / sizeof datasets[0] && st == AT_OK; k++) {
        int n = at_opt_list_count(o, datasets[k]);
        char *joined = NULL;
        for (int i = 0; i < n && st == AT_OK; i++) st = resolve_dataset(&h, at_opt_list_get(o, datasets[k], i), &joined);
        if (st == AT_OK && joined) st = at_opt_set(o, datasets[k], joined);
        free(joined);
    }
    free(token);
    return st == AT_OK ? hide_token(o) : st;
}

int at_cmd_download(int argc, char **argv)
{
    const char *usage =
        "usage: anytune download ORG/NAME[@REVISION] [--repo_type dataset] [--include PATTERN ...] [--hub modelscope]\n"
        "Fetches into the Hugging Face cache ($HF_HOME/hub; HF_ENDPOINT for a mirror, HF_TOKEN for gated\n"
        "models, HF_HUB_OFFLINE=1 for the cache alone) or ModelScope's ($MODELSCOPE_CACHE), and prints the folder.";
    const char *name = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
    at_options *o = NULL;
    int rc = at_cli_parse(specs, NSPECS, name ? argc - 1 : argc, name ? argv + 1 : argv, "download", usage, &o);
    if (rc >= 0) return rc;
    if (!name) {
        fprintf(stderr, "%s\n", usage);
        at_options_free(o);
        return 2;
    }
    at_hub_options h;
    at_repo_kind kind = strcmp(at_opt_str(o, "repo_type"), "dataset") == 0 ? AT_REPO_DATASET : AT_REPO_MODEL;
    int ni = at_opt_list_count(o, "include");
    const char **inc = calloc((size_t)ni + 1, sizeof *inc);
    char *dir = NULL;
    rc = 1;
    if (!inc || hub_options(o, &h) != AT_OK) goto done;
    for (int i = 0; i < ni; i++) inc[i] = at_opt_list_get(o, "include", i);
    h.include = inc;
    h.n_include = (size_t)ni;
    if (strcmp(at_opt_str(o, "repo_type"), "model") && kind != AT_REPO_DATASET) {
        at_error(AT_ERR_INVALID, "--repo_type is model or dataset, not '%s'", at_opt_str(o, "repo_type"));
        goto done;
    }
    if (at_hub_snapshot(name, kind, &h, &dir) != AT_OK) goto done;
    printf("%s\n", dir);
    rc = 0;
done:
    if (rc) at_cli_fail();
    free(dir);
    free(inc);
    at_options_free(o);
    return rc;
}
