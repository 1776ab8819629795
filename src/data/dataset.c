#include "data/dataset.h"
#include "data/media.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "base/rng.h"

/* Only this many skipped records are logged one by one; the rest are counted. */
#define AT_DATASET_LOG_LIMIT 10

/* An independent stream per file (k) of the user's seed, so adding a file
 * does not change how the others are sampled. */
static uint64_t derive_seed(uint64_t seed, uint64_t k)
{
    uint64_t z = seed ^ (k * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Fisher-Yates over size_t indices. */
static void shuffle_idx(at_rng *r, size_t *idx, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)at_rng_below(r, i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

typedef struct {
    at_dataset *ds;
    const at_dataset_options *opt;
    const char *path; /* arena copy, shared by the file's samples */
    at_normalizer nz;
    at_data_format fmt; /* detected from the first record that has a known format */
    const at_sample **list;
    size_t n, cap;
    size_t skipped; /* in this file */
    char first_issue[256];
} file_ctx;

static at_status note_issue(file_ctx *fc, at_issue_kind kind, const char *msg)
{
    at_dataset *ds = fc->ds;
    if (fc->opt->strict) return at_error(AT_ERR_FORMAT, "%s", msg);
    if (fc->skipped++ == 0) snprintf(fc->first_issue, sizeof fc->first_issue, "%s", msg);
    ds->n_skipped++;
    ds->skipped_by_kind[kind < AT_ISSUE_COUNT ? kind : AT_ISSUE_VALUE]++;
    if (ds->n_issues < AT_DATASET_MAX_ISSUES) {
        char *copy = strdup(msg);
        if (copy) ds->issues[ds->n_issues++] = copy;
    }
    if (ds->n_skipped <= AT_DATASET_LOG_LIMIT) at_log_warn("%s (record skipped)", msg);
    return AT_OK;
}

static at_status on_issue(void *ctx, at_issue_kind kind, int line, const char *msg)
{
    (void)line;
    return note_issue(ctx, kind, msg);
}

static at_status on_record(void *ctx, const at_record *rec)
{
    file_ctx *fc = ctx;
    at_sample *s = at_arena_alloc(fc->nz.arena, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "%s: out of memory loading the dataset", fc->path);
    at_status st;
    at_issue_kind kind = AT_ISSUE_VALUE;
    if (!rec->json) {
        if (fc->fmt != AT_FORMAT_AUTO && fc->fmt != AT_FORMAT_TEXT)
            return at_error(AT_ERR_INVALID, "%s: a text file holds plain text; format \"%s\" does not apply",
                            fc->path, at_data_format_name(fc->fmt));
        memset(s, 0, sizeof *s);
        st = at_normalize_text(&fc->nz, rec->text, rec->text_len, s);
    } else {
        const cJSON *json = rec->json;
        cJSON *renamed = NULL;
        if (fc->opt->columns && cJSON_IsObject(json)) { /* --columns: the record's keys renamed first */
            renamed = cJSON_Duplicate(json, 1);
            if (!renamed) return at_error(AT_ERR_NOMEM, "%s: out of memory loading the dataset", fc->path);
            for (cJSON *k = renamed->child; k; k = k->next) {
                const cJSON *to = cJSON_GetObjectItemCaseSensitive(fc->opt->columns, k->string);
                if (cJSON_IsString(to) && strcmp(to->valuestring, k->string) != 0) {
                    char *name = strdup(to->valuestring);
                    if (!name) {
                        cJSON_Delete(renamed);
                        return at_error(AT_ERR_NOMEM, "%s: out of memory loading the dataset", fc->path);
                    }
                    if (!(k->type & cJSON_StringIsConst)) free(k->string);
                    k->string = name;
                    k->type &= ~cJSON_StringIsConst;
                }
            }
            json = renamed;
        }
        if (fc->fmt == AT_FORMAT_AUTO) fc->fmt = at_data_format_detect(json);
        st = at_normalize_record(&fc->nz, json, fc->fmt, s, &kind);
        cJSON_Delete(renamed);
    }
    if (st == AT_ERR_NOMEM) return st;
    if (st != AT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s:%d: %s", fc->path, rec->line, at_last_error());
        return note_issue(fc, kind, msg);
    }
    s->source = fc->path;
    s->line = rec->line;
    if (fc->n == fc->cap) {
        size_t nc = fc->cap ? fc->cap * 2 : 256;
        const at_sample **nl = realloc(fc->list, nc * sizeof *nl);
        if (!nl) return at_error(AT_ERR_NOMEM, "%s: out of memory loading the dataset", fc->path);
        fc->list = nl;
        fc->cap = nc;
    }
    fc->list[fc->n++] = s;
    return AT_OK;
}

at_status at_dataset_parse_spec(const char *spec, char **path, size_t *n_sample)
{
    *path = NULL;
    *n_sample = 0;
    const char *hash = strrchr(spec, '#');
    size_t plen = strlen(spec);
    if (hash && hash[1]) {
        const char *q = hash + 1;
        if (*q == '-' || *q == '+') q++; /* a signed count ("#-1") is a count, and a wrong one */
        const char *digits = q;
        while (isdigit((unsigned char)*q)) q++;
        if (*q == '\0' && q > digits && hash[1] != '+' && hash[1] != '-') {
            errno = 0;
            unsigned long long v = strtoull(hash + 1, NULL, 10);
            if (errno || v == 0 || v > (unsigned long long)SIZE_MAX / 2)
                return at_error(AT_ERR_INVALID, "%s: the sample count after '#' must be between 1 and %zu", spec,
                                (size_t)SIZE_MAX / 2);
            *n_sample = (size_t)v;
            plen = (size_t)(hash - spec);
        } else if (*q == '\0' && q > digits) {
            return at_error(AT_ERR_INVALID, "%s: the sample count after '#' must be between 1 and %zu", spec,
                            (size_t)SIZE_MAX / 2);
        }
    }
    if (plen == 0) return at_error(AT_ERR_INVALID, "\"%s\": empty dataset path", spec);
    *path = malloc(plen + 1);
    if (!*path) return at_error(AT_ERR_NOMEM, "out of memory");
    memcpy(*path, spec, plen);
    (*path)[plen] = '\0';
    return AT_OK;
}

static int append(at_sample_list *l, size_t *cap, const at_sample *s)
{
    if (l->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        const at_sample **ni = realloc(l->items, nc * sizeof *ni);
        if (!ni) return 0;
        l->items = ni;
        *cap = nc;
    }
    l->items[l->n++] = s;
    return 1;
}

/* Loads one file, samples it and splits it into the dataset's lists. */
static at_status load_file(at_dataset *ds, const char *spec, size_t file_index, const at_dataset_options *opt,
                           size_t *train_cap, size_t *val_cap)
{
    at_status st = AT_OK;
    char *path = NULL;
    size_t *idx = NULL, *perm = NULL;
    size_t want = 0;
    file_ctx fc = {0};
    char *base_dir = NULL;
    AT_CHECK(at_dataset_parse_spec(spec, &path, &want));
    fc.ds = ds;
    fc.opt = opt;
    size_t unfilled = 0;
    fc.nz = (at_normalizer){&ds->arena, opt->model_name, opt->model_author, opt->model_name_en, opt->model_author_en,
                            &unfilled, NULL};
    fc.nz.base_dir = base_dir = at_media_base_dir(path);
    if (!base_dir) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    fc.fmt = opt->format;
    fc.path = at_arena_strndup(&ds->arena, path, strlen(path));
    if (!fc.path) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_records_read(path, opt->container, on_record, on_issue, &fc));
    if (unfilled)
        at_log_warn("%s: %zu strings hold {{name}} / {{author}} placeholders and no --model_name / --model_author "
                    "fills them: the model would learn the braces (self-cognition data: give --model_name NAME "
                    "[NAME_EN] --model_author AUTHOR [AUTHOR_EN])", path, unfilled);
    size_t n = fc.n;
    if (n == 0) {
        if (fc.skipped)
            st = at_error(AT_ERR_FORMAT, "%s: no usable records (%zu skipped; the first: %s)", path, fc.skipped,
                          fc.first_issue);
        else
            st = at_error(AT_ERR_FORMAT, "%s: the file holds no records", path);
        goto done;
    }
    ds->n_records += n;
    at_rng rng;
    at_rng_seed(&rng, derive_seed(opt->seed, file_index));
    size_t m = want ? want : n;
    idx = malloc(m * sizeof *idx);
    perm = malloc(n * sizeof *perm);
    if (!idx || !perm) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory sampling", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) perm[i] = i;
    if (!want) {
        memcpy(idx, perm, n * sizeof *idx);
    } else {
        /* ms-swift's sample_dataset: whole copies, then a random remainder */
        size_t reps = want / n, rem = want % n, k = 0;
        for (size_t r = 0; r < reps; r++)
            for (size_t i = 0; i < n; i++) idx[k++] = i;
        if (rem) {
            shuffle_idx(&rng, perm, n);
            for (size_t i = 0; i < rem; i++) idx[k++] = perm[i];
        }
    }
    size_t n_val = 0;
    if (opt->split_ratio > 0) {
        /* train_test_split: ceil(ratio * n) held out, after a shuffle; the
         * epsilon keeps 0.1 * 30 from becoming 4 */
        n_val = (size_t)ceil(opt->split_ratio * (double)m - 1e-9);
        if (n_val >= m) n_val = m - 1;
        free(perm);
        perm = malloc(m * sizeof *perm);
        if (!perm) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory splitting", path);
            goto done;
        }
        for (size_t i = 0; i < m; i++) perm[i] = idx[i];
        shuffle_idx(&rng, perm, m);
        memcpy(idx, perm, m * sizeof *idx);
    }
    for (size_t i = 0; i < m; i++) {
        int ok = i < n_val ? append(&ds->val, val_cap, fc.list[idx[i]]) : append(&ds->train, train_cap, fc.list[idx[i]]);
        if (!ok) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
    }
    at_log_debug("%s: %zu records (%s), %zu samples, %zu held out", path, n, at_data_format_name(fc.fmt), m, n_val);
done:
    free(path);
    free(base_dir);
    free(idx);
    free(perm);
    free(fc.list);
    return st;
}

static at_status make_summary(at_dataset *ds)
{
    char buf[2048];
    size_t o = 0;
    o += (size_t)snprintf(buf + o, sizeof buf - o, "%zu train + %zu val samples from %zu file%s (%zu records)",
                          ds->train.n, ds->val.n, ds->n_files, ds->n_files == 1 ? "" : "s", ds->n_records);
    if (ds->n_skipped) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, "; skipped %zu bad record%s:", ds->n_skipped,
                              ds->n_skipped == 1 ? "" : "s");
        const char *sep = " ";
        for (int k = 0; k < AT_ISSUE_COUNT && o < sizeof buf; k++) {
            if (!ds->skipped_by_kind[k]) continue;
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%zu %s", sep, ds->skipped_by_kind[k],
                                  at_issue_name((at_issue_kind)k));
            sep = ", ";
        }
        if (o < sizeof buf && ds->n_issues)
            snprintf(buf + o, sizeof buf - o, " (first: %s)", ds->issues[0]);
    }
    ds->summary = strdup(buf);
    return ds->summary ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
}

at_status at_dataset_load(const char *const *specs, size_t n_specs, const at_dataset_options *options,
                          at_dataset **out)
{
    at_status st = AT_OK;
    at_dataset_options defaults = {0};
    defaults.seed = 42;
    const at_dataset_options *opt = options ? options : &defaults;
    size_t train_cap = 0, val_cap = 0;
    *out = NULL;
    if (n_specs == 0) return at_error(AT_ERR_INVALID, "no dataset given");
    if (!(opt->split_ratio >= 0 && opt->split_ratio < 1))
        return at_error(AT_ERR_INVALID, "split_dataset_ratio %g must be in [0, 1)", opt->split_ratio);
    at_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_specs; i++) {
        AT_CHECK(load_file(ds, specs[i], i, opt, &train_cap, &val_cap));
        ds->n_files++;
    }
    if (opt->shuffle && ds->train.n > 1) {
        at_rng rng;
        at_rng_seed(&rng, derive_seed(opt->seed, (uint64_t)-1));
        for (size_t i = ds->train.n; i > 1; i--) {
            size_t j = (size_t)at_rng_below(&rng, i);
            const at_sample *t = ds->train.items[i - 1];
            ds->train.items[i - 1] = ds->train.items[j];
            ds->train.items[j] = t;
        }
    }
    AT_CHECK(make_summary(ds));
    if (ds->n_skipped) at_log_warn("dataset: %s", ds->summary);
    *out = ds;
    return AT_OK;
done:
    at_dataset_free(ds);
    return st;
}

void at_dataset_free(at_dataset *ds)
{
    if (!ds) return;
    free(ds->train.items);
    free(ds->val.items);
    for (size_t i = 0; i < ds->n_issues; i++) free(ds->issues[i]);
    free(ds->summary);
    at_arena_free(&ds->arena);
    free(ds);
}

at_status at_messages_to_json(const at_messages *m, cJSON **out)
{
    *out = NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n; i++) {
        const at_message *msg = &m->items[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o) || !cJSON_AddStringToObject(o, "role", at_role_name(msg->role)) ||
            !cJSON_AddStringToObject(o, "content", msg->content)) {
            if (o && !cJSON_IsArray(arr)) cJSON_Delete(o);
            cJSON_Delete(arr);
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        if (msg->tool_calls) {
            cJSON *tc = cJSON_Parse(msg->tool_calls);
            if (!tc) {
                cJSON_Delete(arr);
                return at_error(AT_ERR_INTERNAL, "message %zu: stored tool_calls are not JSON", i);
            }
            cJSON_AddItemToObject(o, "tool_calls", tc);
        }
    }
    *out = arr;
    return AT_OK;
}
