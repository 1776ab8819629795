/* Arbitrary bytes read as a JSON array, as JSON Lines, as CSV and as text
 * lines; every record is normalized under every format and converted back
 * to OpenAI-style JSON. Nothing may crash, leak or read out of bounds, and
 * every record must come with a positive line number. A conversation's
 * images must match its <image> tags one for one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "data/dataset.h"
#include "data/media.h"

typedef struct {
    at_arena arena;
    size_t records;
} fuzz_ctx;

static void check_messages(const at_messages *m)
{
    cJSON *j = NULL;
    if (at_messages_to_json(m, &j) == AT_OK) {
        if ((size_t)cJSON_GetArraySize(j) != m->n) abort();
        cJSON_Delete(j);
    }
}

static at_status on_record(void *ctx, const at_record *rec)
{
    fuzz_ctx *fc = ctx;
    if (rec->line < 1) abort();
    fc->records++;
    at_normalizer nz = {.arena = &fc->arena, .model_name = (fc->records & 1) ? "N" : NULL, .model_author = "A",
                        .model_name_en = (fc->records & 2) ? "E" : NULL,
                        .base_dir = (fc->records & 4) ? "data" : NULL};
    at_sample s;
    if (!rec->json) {
        if (at_normalize_text(&nz, rec->text, rec->text_len, &s) == AT_OK && !s.text) abort();
        return AT_OK;
    }
    for (int f = AT_FORMAT_AUTO; f <= AT_FORMAT_PREFERENCE; f++) {
        at_issue_kind kind = AT_ISSUE_COUNT;
        at_status st = at_normalize_record(&nz, rec->json, (at_data_format)f, &s, &kind);
        if (st != AT_OK) {
            if (kind >= AT_ISSUE_COUNT || !at_last_error()[0]) abort();
            continue;
        }
        check_messages(&s.messages);
        if (s.n_images && at_media_count_tags(&s.messages) != s.n_images) abort();
        if (s.kind == AT_SAMPLE_PREFERENCE) {
            if (s.chosen.n == 0 || s.rejected.n == 0) abort();
            check_messages(&s.chosen);
            check_messages(&s.rejected);
        }
    }
    at_arena_free(&fc->arena);
    return AT_OK;
}

static at_status on_issue(void *ctx, at_issue_kind kind, int line, const char *msg)
{
    (void)ctx;
    if (line < 1 || kind >= AT_ISSUE_COUNT || !msg || !strstr(msg, "fuzz")) abort();
    return AT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const at_container kinds[] = {AT_CONTAINER_JSON_ARRAY, AT_CONTAINER_JSONL, AT_CONTAINER_CSV,
                                         AT_CONTAINER_TEXT};
    at_log_set_level(AT_LOG_ERROR);
    /* an exact-size copy, so reading past the end is caught by ASan */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        fuzz_ctx fc = {{0}, 0};
        at_records_read_mem(buf, size, "fuzz.json", kinds[k], on_record, on_issue, &fc);
        at_arena_free(&fc.arena);
    }
    free(buf);
    return 0;
}
