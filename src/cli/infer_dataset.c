/* anytune infer --val_dataset FILE --result_path OUT.jsonl: every record's
 * prompt answered, as ms-swift's `swift infer --val_dataset` does (with a
 * vision-language model, the records' images too: data/media.h's forms). The
 * records are the files sft reads; a conversation's prompt is its messages
 * up to the last assistant turn, whose text is kept as the reference
 * ("labels") beside the answer ("response"). The prompts go through the
 * continuous-batching scheduler (infer/scheduler.h): --max_batch_size
 * sequences decode together and a finished one's slot takes the next
 * prompt. With --load_data_args true the data are the validation split of
 * the run the adapter came from (its args.json: dataset, split ratio,
 * seed), as ms-swift's --load_data_args. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/progress.h"
#include "cli/cli.h"
#include "data/dataset.h"
#include "data/media.h"
#include "infer/bundle.h"
#include "infer/scheduler.h"
#include "infer/vlm.h"

typedef struct {
    cJSON *prompt;     /* the messages asked */
    const char *const *images; /* their images (borrowed from the dataset) */
    size_t n_images;
    const char *label; /* the reference answer (borrowed from the dataset), or NULL */
    char *text;        /* the answer so far */
    size_t len, cap;
    at_finish_reason finish;
    int prompt_tokens, completion_tokens;
} item;

static at_status append(item *it, const char *s, size_t n)
{
    if (it->len + n + 1 > it->cap) {
        size_t cap = (it->len + n + 1) * 2;
        char *p = realloc(it->text, cap);
        if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
        it->text = p;
        it->cap = cap;
    }
    memcpy(it->text + it->len, s, n);
    it->len += n;
    it->text[it->len] = '\0';
    return AT_OK;
}

/* The data of --load_data_args: the run's args.json beside the adapter
 * (CKPT/../args.json). Fills the dataset options and the spec list (owned by
 * *args, freed by the caller with cJSON_Delete). */
static at_status run_data_args(const char *adapter, cJSON **args, const char ***specs, int *n, int *use_val,
                               at_dataset_options *dopt)
{
    const char *eq = strchr(adapter, '=');
    const char *dir = eq && !memchr(adapter, '/', (size_t)(eq - adapter)) ? eq + 1 : adapter;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/../args.json", dir);
    AT_TRY(at_json_parse_file(path, args));
    const cJSON *vd = cJSON_GetObjectItem(*args, "val_dataset"), *d = cJSON_GetObjectItem(*args, "dataset");
    *use_val = cJSON_IsArray(vd) && cJSON_GetArraySize(vd) > 0;
    const cJSON *list = *use_val ? vd : d;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return at_error(AT_ERR_INVALID, "%s: no dataset to take the validation split of", path);
    *n = cJSON_GetArraySize(list);
    *specs = calloc((size_t)*n + 1, sizeof **specs);
    if (!*specs) return at_error(AT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(list, i);
        if (!cJSON_IsString(e)) return at_error(AT_ERR_FORMAT, "%s: dataset items must be strings", path);
        (*specs)[i] = e->valuestring;
    }
    const cJSON *r = cJSON_GetObjectItem(*args, "split_dataset_ratio"), *s = cJSON_GetObjectItem(*args, "seed");
    dopt->split_ratio = *use_val ? 0 : cJSON_IsNumber(r) ? r->valuedouble : 0;
    if (cJSON_IsNumber(s) && s->valuedouble >= 0 && s->valuedouble < 0x1p64) /* the cast is defined */
        dopt->seed = (uint64_t)s->valuedouble;
    if (!*use_val && dopt->split_ratio <= 0)
        return at_error(AT_ERR_INVALID, "%s: the run held no validation data out (no --val_dataset, "
                        "--split_dataset_ratio 0): give --val_dataset", path);
    /* the run's self-cognition names, as it filled them */
    static const char *const keys[2] = {"model_name", "model_author"};
    const char **first[2] = {&dopt->model_name, &dopt->model_author},
               **en[2] = {&dopt->model_name_en, &dopt->model_author_en};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItem(*args, keys[k]);
        if (cJSON_IsString(v)) *first[k] = v->valuestring;
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
            *first[k] = cJSON_GetArrayItem(v, 0)->valuestring;
            if (cJSON_GetArraySize(v) > 1) *en[k] = cJSON_GetArrayItem(v, 1)->valuestring;
        }
    }
    at_log_warn("--load_data_args: the validation data of %s (%d file%s)", path, *n, *n == 1 ? "" : "s");
    return AT_OK;
}

/* The images of a record, decoded through the model's processor (its
 * messages name the reference). */
static at_status record_images(const at_bundle *b, const item *it, at_vlm_images *im)
{
    for (size_t k = 0; k < it->n_images; k++) {
        at_image img = {0};
        at_status st = at_media_load_image(it->images[k], 0, &img);
        if (st == AT_OK) st = at_vlm_images_add(b, &img, it->images[k], im);
        at_image_free(&img);
        if (st != AT_OK) {
            at_vlm_images_free(im);
            return st;
        }
    }
    return AT_OK;
}

int at_cli_infer_dataset(const at_options *o, at_bundle *b, const at_gen_params *gp, int context)
{
    int rc = 1;
    at_dataset *ds = NULL;
    cJSON *args = NULL;
    const char **specs = NULL;
    item *items = NULL;
    at_scheduler *sched = NULL;
    FILE *out = NULL;
    char *tmp = NULL;
    size_t n_items = 0;
    at_status st = AT_OK;
    at_dataset_options dopt = {.seed = (uint64_t)at_opt_int(o, "seed")};
    int n = at_opt_list_count(o, "val_dataset"), use_val = 0;
    const char *result = at_opt_str(o, "result_path");
    char result_buf[64];
    if (!result) { /* ms-swift's: a new file per run */
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(result_buf, sizeof result_buf, "infer_result/%Y%m%d-%H%M%S.jsonl", &tm);
        result = result_buf;
        if (at_mkdirs("infer_result") != AT_OK) goto fail;
    }
    if (at_opt_bool(o, "load_data_args")) {
        if (!at_opt_list_count(o, "adapters")) {
            at_error(AT_ERR_INVALID, "--load_data_args reads the run of --adapters: give --adapters RUN/checkpoint-N");
            goto fail;
        }
        if (n) {
            at_error(AT_ERR_INVALID, "give --val_dataset or --load_data_args, not both");
            goto fail;
        }
        if (run_data_args(at_opt_list_get(o, "adapters", 0), &args, &specs, &n, &use_val, &dopt) != AT_OK) goto fail;
    } else {
        specs = calloc((size_t)n + 1, sizeof *specs);
        if (!specs) goto nomem;
        for (int i = 0; i < n; i++) specs[i] = at_opt_list_get(o, "val_dataset", i);
        use_val = 1;
        dopt.model_name = at_opt_list_get(o, "model_name", 0);
        dopt.model_name_en = at_opt_list_get(o, "model_name", 1);
        dopt.model_author = at_opt_list_get(o, "model_author", 0);
        dopt.model_author_en = at_opt_list_get(o, "model_author", 1);
    }
    if (at_dataset_load(specs, (size_t)n, &dopt, &ds) != AT_OK) goto fail;
    const at_sample_list *list = use_val ? &ds->train : &ds->val;
    items = calloc(list->n ? list->n : 1, sizeof *items);
    if (!items) goto nomem;
    /* the prompts: each conversation up to its last assistant turn */
    for (size_t i = 0; i < list->n; i++) {
        const at_sample *s = list->items[i];
        if (s->kind != AT_SAMPLE_CONVERSATION || s->messages.n == 0) continue;
        size_t k = s->messages.n;
        item *it = &items[n_items];
        it->label = NULL;
        if (s->messages.items[k - 1].role == AT_ROLE_ASSISTANT) it->label = s->messages.items[--k].content;
        if (k == 0) continue;
        at_messages m = s->messages;
        m.n = k;
        if (at_messages_to_json(&m, &it->prompt) != AT_OK) goto fail;
        it->images = s->images;
        it->n_images = s->n_images;
        n_items++;
    }
    if (!n_items) {
        at_error(AT_ERR_INVALID, "no conversation to answer in the data (%zu samples)", list->n);
        goto fail;
    }
    int batch = (int)at_opt_int(o, "max_batch_size");
    if (at_scheduler_new(b->decoder, b->tokenizer, batch, context, &sched) != AT_OK) goto fail;
    double t0 = at_now_seconds();
    size_t next = 0, done = 0;
    long long new_tokens = 0;
    while (done < n_items) {
        /* fill the free slots; a prompt too long for the context is answered with an error, not dropped */
        while (next < n_items && at_scheduler_in_use(sched) < at_scheduler_capacity(sched)) {
            item *it = &items[next++];
            int32_t *ids = NULL;
            size_t nids = 0;
            at_vlm_images im = {0};
            at_prompt_media media = {0};
            st = record_images(b, it, &im);
            if (st == AT_OK) st = at_vlm_encode_chat(b, it->prompt, &im, &ids, &nids);
            if (st == AT_OK && (int)nids >= context - 1) {
                free(ids);
                at_vlm_images_free(&im);
                it->finish = AT_FINISH_LENGTH;
                it->prompt_tokens = (int)nids;
                done++;
                continue;
            }
            if (st == AT_OK && im.n) st = at_vlm_media(b, ids, nids, &im, &media);
            if (st != AT_OK) {
                free(ids);
                at_vlm_images_free(&im);
                goto fail;
            }
            at_gen_params p = *gp;
            int room = context - (int)nids;
            if (p.max_new_tokens <= 0 || p.max_new_tokens > room) p.max_new_tokens = room;
            int slot;
            st = at_scheduler_add_media(sched, ids, nids, im.n ? &media : NULL, &p, it, &slot);
            free(ids);
            at_vlm_media_free(&media);
            at_vlm_images_free(&im);
            if (st != AT_OK) goto fail;
        }
        if (done >= n_items) break;
        const at_sched_event *ev;
        int nev = 0;
        if (at_scheduler_step(sched, &ev, &nev) != AT_OK) goto fail;
        for (int e = 0; e < nev; e++) {
            item *it = ev[e].user;
            if (ev[e].len && append(it, ev[e].text, ev[e].len) != AT_OK) goto fail;
            if (ev[e].finish != AT_FINISH_NONE) {
                it->finish = ev[e].finish;
                it->prompt_tokens = ev[e].prompt_tokens;
                it->completion_tokens = ev[e].completion_tokens;
                new_tokens += ev[e].completion_tokens;
                done++;
            }
        }
    }
    double secs = at_now_seconds() - t0;
    /* JSON Lines in the records' order, as ms-swift's result files */
    size_t rl = strlen(result) + 32;
    tmp = malloc(rl);
    if (!tmp) goto nomem;
    snprintf(tmp, rl, "%s.tmp", result);
    out = fopen(tmp, "wb");
    if (!out) {
        at_error(AT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    for (size_t i = 0; i < n_items; i++) {
        cJSON *line = cJSON_CreateObject();
        if (!line) goto nomem;
        cJSON_AddStringToObject(line, "response", items[i].text ? items[i].text : "");
        if (items[i].label) cJSON_AddStringToObject(line, "labels", items[i].label);
        else cJSON_AddNullToObject(line, "labels");
        cJSON_AddItemReferenceToObject(line, "messages", items[i].prompt);
        if (items[i].n_images) {
            cJSON *imgs = cJSON_AddArrayToObject(line, "images");
            for (size_t k = 0; imgs && k < items[i].n_images; k++)
                cJSON_AddItemToArray(imgs, cJSON_CreateString(items[i].images[k]));
        }
        cJSON_AddStringToObject(line, "finish_reason", at_finish_reason_name(items[i].finish));
        cJSON_AddNumberToObject(line, "prompt_tokens", items[i].prompt_tokens);
        cJSON_AddNumberToObject(line, "completion_tokens", items[i].completion_tokens);
        char *text = cJSON_PrintUnformatted(line);
        cJSON_Delete(line);
        if (!text) goto nomem;
        int ok = fputs(text, out) >= 0 && fputc('\n', out) != EOF;
        free(text);
        if (!ok) {
            at_error(AT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
            goto fail;
        }
    }
    if (fflush(out) != 0 || fsync(fileno(out)) != 0 || fclose(out) != 0) {
        out = NULL;
        at_error(AT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        goto fail;
    }
    out = NULL;
    if (rename(tmp, result) != 0) {
        at_error(AT_ERR_IO, "%s: cannot rename into place: %s", result, strerror(errno));
        goto fail;
    }
    fprintf(stderr, "anytune infer: %zu prompts answered in %.1f s (%lld tokens, %.1f tokens/s, batches of up to %d); "
                    "results in %s\n", n_items, secs, new_tokens, secs > 0 ? (double)new_tokens / secs : 0, batch,
            result);
    rc = 0;
    goto done;
nomem:
    at_error(AT_ERR_NOMEM, "out of memory");
fail:
    rc = at_cli_fail();
done:
    if (out) fclose(out);
    if (tmp && rc != 0) remove(tmp);
    free(tmp);
    for (size_t i = 0; items && i < n_items; i++) {
        cJSON_Delete(items[i].prompt);
        free(items[i].text);
    }
    free(items);
    at_scheduler_free(sched);
    at_dataset_free(ds);
    free(specs);
    cJSON_Delete(args);
    return rc;
}
