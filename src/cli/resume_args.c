/* --resume_from_checkpoint: a run continues with the options it was made
 * with (cmd_train.h at_cli_resume_options). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "train/run_files.h"

/* Options that say nothing about what a run computes: taken from args.json
 * when not given again, and free to differ when given. */
static const char *const free_options[] = {"device", "max_memory", "tf32", "logging_steps", "save_steps",
                                           "eval_steps", "save_total_limit", "preview", "preview_max_tokens",
                                           "strict"};
/* Options that are about this invocation, never the run's. */
static const char *const own_options[] = {"resume_from_checkpoint", "output_dir", "dry_run", "json",
                                          "simulate_device"};

static int listed(const char *name, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, names[i])) return 1;
    return 0;
}

/* A JSON value of args.json as option text (lists: items joined by commas). */
static int value_text(const cJSON *v, char *buf, size_t len)
{
    if (cJSON_IsString(v)) return snprintf(buf, len, "%s", v->valuestring) < (int)len;
    if (cJSON_IsBool(v)) return snprintf(buf, len, "%s", cJSON_IsTrue(v) ? "true" : "false") < (int)len;
    if (cJSON_IsNumber(v)) return snprintf(buf, len, "%.17g", v->valuedouble) < (int)len;
    if (!cJSON_IsArray(v)) return 0;
    size_t k = 0;
    buf[0] = '\0';
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        if (!cJSON_IsString(e)) return 0;
        int w = snprintf(buf + k, len - k, "%s%s", k ? "," : "", e->valuestring);
        if (w < 0 || (size_t)w >= len - k) return 0;
        k += (size_t)w;
    }
    return 1;
}

int at_cli_resume_options(at_options *o, const char *command)
{
    const char *spec = at_opt_str(o, "resume_from_checkpoint");
    if (!spec) return -1;
    char *run_dir = NULL, *ckpt = NULL, *argsp = NULL, *diff = NULL;
    cJSON *run = NULL, *now = NULL;
    int64_t step = 0;
    int rc = 1;
    size_t dlen = 0;
    if (at_run_find_resume(at_opt_str(o, "output_dir"), spec, at_opt_bool(o, "add_version"), &run_dir, &ckpt,
                           &step) != AT_OK) {
        at_cli_fail();
        goto done;
    }
    argsp = at_path_join(run_dir, "args.json");
    if (!argsp) goto nomem;
    if (!at_file_exists(argsp)) { /* a run of an older anytune, or of the library: the options given now */
        fprintf(stderr, "anytune: warning: %s has no args.json: resuming with the options given now\n", run_dir);
        rc = -1;
        goto set_ckpt;
    }
    if (at_json_parse_file(argsp, &run) != AT_OK || !cJSON_IsObject(run)) {
        fprintf(stderr, "anytune: error: %s: %s\n", argsp, run ? "not an object of options" : at_last_error());
        goto done;
    }
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(run, "command");
    if (cJSON_IsString(cmd) && strcmp(cmd->valuestring, command) != 0) {
        fprintf(stderr, "anytune: error: %s was made by `anytune %s`; resume it with that command, not `anytune %s`\n",
                run_dir, cmd->valuestring, command);
        goto done;
    }
    now = at_options_to_json(o);
    if (!now) goto nomem;
    const cJSON *it;
    cJSON_ArrayForEach(it, run)
    {
        const cJSON *cur = cJSON_GetObjectItemCaseSensitive(now, it->string);
        if (!cur || cJSON_IsNull(it) || listed(it->string, own_options, sizeof own_options / sizeof *own_options))
            continue; /* not an option of this command ("plan", "command"), or unset in the run */
        if (at_opt_source_of(o, it->string) != AT_SRC_DEFAULT) {
            if (listed(it->string, free_options, sizeof free_options / sizeof *free_options) ||
                cJSON_Compare(cur, it, 1))
                continue;
            char *was = cJSON_PrintUnformatted(it), *is = cJSON_PrintUnformatted(cur);
            size_t need = dlen + strlen(it->string) + (was ? strlen(was) : 0) + (is ? strlen(is) : 0) + 32;
            char *nd = realloc(diff, need);
            if (!nd || !was || !is) {
                free(was);
                free(is);
                if (nd) diff = nd;
                goto nomem;
            }
            diff = nd;
            dlen += (size_t)sprintf(diff + dlen, "%s--%s %s (the run: %s)", dlen ? ", " : "", it->string, is, was);
            free(was);
            free(is);
            continue;
        }
        char text[8192];
        if (!value_text(it, text, sizeof text) || at_opt_set_from(o, it->string, text, AT_SRC_CONFIG) != AT_OK) {
            fprintf(stderr, "anytune: error: %s: \"%s\" is not a value of --%s\n", argsp, it->string, it->string);
            goto done;
        }
    }
    if (diff) {
        fprintf(stderr, "anytune: error: %s was made with other options than those given: %s. A resumed run "
                        "keeps its own (drop them, or start a new run without --resume_from_checkpoint)\n",
                run_dir, diff);
        goto done;
    }
    rc = -1;
set_ckpt:
    /* the checkpoint found now is the one the trainer resumes from */
    if (at_opt_set(o, "resume_from_checkpoint", ckpt) != AT_OK) {
        rc = at_cli_fail();
        goto done;
    }
    if (run) fprintf(stderr, "anytune: resuming %s with its options (%s)\n", run_dir, argsp);
    goto done;
nomem:
    fprintf(stderr, "anytune: error: out of memory\n");
    rc = 1;
done:
    cJSON_Delete(run);
    cJSON_Delete(now);
    free(diff);
    free(argsp);
    free(run_dir);
    free(ckpt);
    return rc;
}
