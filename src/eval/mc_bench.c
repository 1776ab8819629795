#include "eval/mc_bench.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"

at_status at_mc_bench_find(const char *name, char **dir)
{
    *dir = NULL;
    if (!name || !*name) return at_error(AT_ERR_INVALID, "--eval_dataset: empty name");
    if (at_is_dir(name)) {
        *dir = strdup(name);
        return *dir ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    }
    const char *env = getenv("ANYTUNE_EVAL_DATA");
    char *cand[2] = {env && *env ? at_path_join(env, name) : NULL, at_path_join("evaluation", name)};
    for (int i = 0; i < 2; i++)
        if (cand[i] && !*dir && at_is_dir(cand[i])) {
            *dir = cand[i];
            cand[i] = NULL;
        }
    free(cand[0]);
    free(cand[1]);
    if (*dir) return AT_OK;
    if (strchr(name, '/'))
        return at_error(AT_ERR_NOT_FOUND, "--eval_dataset %s: no such folder", name);
    return at_error(AT_ERR_NOT_FOUND, "--eval_dataset %s: not a folder, and neither $ANYTUNE_EVAL_DATA/%s nor "
                    "evaluation/%s exists (put LLaMA-Factory's evaluation/%s folder, with mapping.json, dev/ and "
                    "val/, there, or give its path)", name, name, name, name);
}

static void subject_free(at_mc_subject *s)
{
    free(s->id);
    free(s->name);
    free(s->category);
    at_mc_file_free(&s->dev);
    at_mc_file_free(&s->eval);
}

void at_mc_bench_free(at_mc_bench *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->n; i++) subject_free(&b->subjects[i]);
    free(b->subjects);
    free(b->dir);
    free(b->split);
    memset(b, 0, sizeof *b);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The subject ids of DIR/SPLIT/ID_SPLIT.csv, sorted. */
static at_status list_subjects(const char *folder, const char *split, char ***ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    DIR *d = opendir(folder);
    if (!d)
        return at_error(AT_ERR_NOT_FOUND, "%s: no such folder (a benchmark folder holds dev/ and %s/ folders of "
                        "SUBJECT_dev.csv and SUBJECT_%s.csv files)", folder, split, split);
    char suffix[64];
    snprintf(suffix, sizeof suffix, "_%s.csv", split);
    size_t sl = strlen(suffix), cap = 0;
    at_status st = AT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            char **p = realloc(*ids, cap * sizeof *p);
            if (!p) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
            *ids = p;
        }
        if (!((*ids)[*n] = strndup(e->d_name, l - sl))) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (st == AT_OK && *n == 0)
        st = at_error(AT_ERR_NOT_FOUND, "%s: no SUBJECT%s files: not a benchmark folder of split '%s'", folder,
                      suffix, split);
    if (st != AT_OK) {
        for (size_t i = 0; i < *n; i++) free((*ids)[i]);
        free(*ids);
        *ids = NULL;
        *n = 0;
        return st;
    }
    qsort(*ids, *n, sizeof **ids, cmp_str);
    return AT_OK;
}

static char *file_of(const char *dir, const char *split, const char *id)
{
    size_t n = strlen(dir) + 2 * strlen(split) + strlen(id) + 8;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s/%s_%s.csv", dir, split, id, split);
    return p;
}

static at_status load_subject(const char *dir, const char *split, int need_dev, const cJSON *map, const char *id,
                              at_mc_subject *s)
{
    char *mp = at_path_join(dir, "mapping.json");
    at_status st = AT_OK;
    if (!(s->id = strdup(id))) goto oom;
    if (map) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(map, id);
        if (!e) {
            st = at_error(AT_ERR_NOT_FOUND, "%s/%s/%s_%s.csv: subject '%s' is not in %s", dir, split, id, split, id,
                          mp);
            goto done;
        }
        const char *name = NULL, *cat = NULL;
        AT_CHECK(at_json_get_string(e, "name", mp, &name));
        AT_CHECK(at_json_get_string(e, "category", mp, &cat));
        if (!(s->name = strdup(name)) || !(s->category = strdup(cat))) goto oom;
    } else {
        if (!(s->name = strdup(id))) goto oom;
        for (char *p = s->name; *p; p++)
            if (*p == '_') *p = ' ';
    }
    char *path = file_of(dir, split, id);
    if (!path) goto oom;
    st = at_mc_csv_load(path, &s->eval);
    free(path);
    if (st != AT_OK) goto done;
    if (need_dev) {
        path = file_of(dir, "dev", id);
        if (!path) goto oom;
        if (!at_file_exists(path))
            st = at_error(AT_ERR_NOT_FOUND, "%s: no such file: the few-shot examples of subject '%s' (use --n_shot 0 "
                          "to go without)", path, id);
        else
            st = at_mc_csv_load(path, &s->dev);
        free(path);
    }
done:
    free(mp);
    return st;
oom:
    free(mp);
    return at_error(AT_ERR_NOMEM, "out of memory");
}

at_status at_mc_bench_load(const char *dir, const char *split, int need_dev, at_mc_bench *out)
{
    memset(out, 0, sizeof *out);
    if (!split || !*split || strchr(split, '/'))
        return at_error(AT_ERR_INVALID, "--eval_split '%s': use val, dev or test", split ? split : "");
    cJSON *map = NULL;
    char **ids = NULL;
    size_t n_ids = 0;
    at_status st = AT_OK;
    char *mp = at_path_join(dir, "mapping.json"), *folder = at_path_join(dir, split);
    if (!mp || !folder) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (at_file_exists(mp)) {
        AT_CHECK(at_json_parse_file(mp, &map));
        if (!cJSON_IsObject(map)) {
            st = at_error(AT_ERR_FORMAT, "%s: not a JSON object of subjects", mp);
            goto done;
        }
    }
    AT_CHECK(list_subjects(folder, split, &ids, &n_ids));
    /* mapping.json order (LLaMA-Factory's), then files it does not list, which fail below */
    char **order = calloc(n_ids, sizeof *order);
    unsigned char *taken = calloc(n_ids, 1);
    if (!order || !taken) {
        free(order);
        free(taken);
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        char *key = e->string;
        char **hit = key ? bsearch(&key, ids, n_ids, sizeof *ids, cmp_str) : NULL;
        if (hit && !taken[hit - ids]) {
            taken[hit - ids] = 1;
            order[k++] = *hit;
        }
    }
    for (size_t i = 0; i < n_ids; i++)
        if (!taken[i]) order[k++] = ids[i];
    free(taken);
    free(ids);
    ids = order;
    out->subjects = calloc(n_ids, sizeof *out->subjects);
    out->dir = strdup(dir);
    out->split = strdup(split);
    if (!out->subjects || !out->dir || !out->split) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) {
        st = load_subject(dir, split, need_dev, map, ids[i], &out->subjects[i]);
        out->n = i + 1;
        if (st != AT_OK) goto done;
    }
    at_log_info("%s: %zu subjects of split %s%s", dir, out->n, split, map ? "" : " (no mapping.json: no categories)");
done:
    for (size_t i = 0; i < n_ids; i++) free(ids ? ids[i] : NULL);
    free(ids);
    cJSON_Delete(map);
    free(mp);
    free(folder);
    if (st != AT_OK) at_mc_bench_free(out);
    return st;
}
