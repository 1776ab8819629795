/* The Parquet reader (data/parquet.c) against an independent writer:
 * tests/js/write_parquet.mjs writes files with parquet-wasm (the Rust parquet
 * crate) in several codecs (none, SNAPPY, GZIP, ZSTD), page versions (v1,
 * v2), encodings (dictionary, PLAIN, RLE booleans) and nestings (chat
 * messages as list<struct>, list<int32>, a struct of list<list<string>> and a
 * struct), with nulls and empty lists, several row groups and pages, plus
 * the rows it was given as JSON. Every file must read back equal to those
 * rows. Then: a chat Parquet file loads as a dataset of conversations, and
 * damaged files fail with a message instead of crashing. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "data/dataset.h"
#include "data/parquet.h"
#include "testing.h"

static const char *cases[] = {"chat_snappy_v1",   "chat_zstd_v2",   "chat_gzip_plain", "chat_none_v2",
                              "alpaca_snappy_v1", "alpaca_zstd_v2", "alpaca_gzip_plain", "deep_none_v1",
                              "deep_zstd_v2",     "deep_gzip_plain"};

static at_status collect(void *ctx, const at_record *rec)
{
    cJSON *arr = ctx;
    CHECK(rec->line == cJSON_GetArraySize(arr) + 1);
    cJSON_AddItemToArray(arr, cJSON_Duplicate(rec->json, 1));
    return AT_OK;
}

static void check_case(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    cJSON *want = NULL;
    CHECK_OK(at_json_parse_file(path, &want));
    cJSON *got = cJSON_CreateArray();
    snprintf(path, sizeof path, "%s/%s.parquet", dir, name);
    CHECK_OK(at_records_read(path, AT_CONTAINER_AUTO, collect, NULL, got));
    int equal = want && cJSON_Compare(want, got, 1);
    if (!equal) {
        char *g = cJSON_PrintUnformatted(got);
        fprintf(stderr, "%s: read back:\n%.3000s\n", name, g ? g : "?");
        free(g);
    }
    CHECK_MSG(equal, "%s differs from the rows given to the writer", name);
    CHECK(cJSON_GetArraySize(got) > 10);
    cJSON_Delete(want);
    cJSON_Delete(got);
}

/* Every truncation of a file and a byte flipped at many offsets: an error
 * or rows, never a crash (ASan runs this too). */
static void check_damage(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/chat_snappy_v1.parquet", dir);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(path, &data, &len));
    if (!data) return;
    int failures = 0;
    for (size_t cut = 0; cut < len; cut += 7) {
        cJSON *got = cJSON_CreateArray();
        if (at_parquet_read_mem((const uint8_t *)data, cut, "cut.parquet", collect, NULL, got) != AT_OK) failures++;
        cJSON_Delete(got);
    }
    CHECK(failures == (int)((len + 6) / 7)); /* the footer is at the end: every cut loses it */
    CHECK(strstr(at_last_error(), "cut.parquet") != NULL);
    char *copy = malloc(len);
    for (size_t off = 4; off < len - 8; off += 3) {
        memcpy(copy, data, len);
        copy[off] ^= 0x5a;
        cJSON *got = cJSON_CreateArray();
        (void)at_parquet_read_mem((const uint8_t *)copy, len, "flip.parquet", collect, NULL, got);
        cJSON_Delete(got);
    }
    free(copy);
    free(data);
}

/* Rows whose string bytes are not UTF-8 go to the issue callback, one each,
 * numbered; the others come back equal. */
typedef struct {
    cJSON *good, *bad;
} split_rows;

static at_status keep_good(void *ctx, const at_record *rec)
{
    split_rows *s = ctx;
    cJSON_AddItemToArray(s->good, cJSON_Duplicate(rec->json, 1));
    return AT_OK;
}

static at_status keep_bad(void *ctx, at_issue_kind kind, int line, const char *msg)
{
    split_rows *s = ctx;
    CHECK(kind == AT_ISSUE_UTF8 && strstr(msg, "binary_utf8.parquet:") != NULL);
    cJSON_AddItemToArray(s->bad, cJSON_CreateNumber(line));
    return AT_OK;
}

static void check_utf8(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/binary_utf8.json", dir);
    cJSON *want = NULL;
    CHECK_OK(at_json_parse_file(path, &want));
    split_rows s = {cJSON_CreateArray(), cJSON_CreateArray()};
    snprintf(path, sizeof path, "%s/binary_utf8.parquet", dir);
    CHECK_OK(at_records_read(path, AT_CONTAINER_AUTO, keep_good, keep_bad, &s));
    CHECK(cJSON_Compare(cJSON_GetObjectItem(want, "good"), s.good, 1));
    CHECK(cJSON_Compare(cJSON_GetObjectItem(want, "bad"), s.bad, 1));
    CHECK(cJSON_GetArraySize(s.bad) == 2);
    CHECK_FAILS(at_records_read(path, AT_CONTAINER_AUTO, keep_good, NULL, &s), AT_ERR_FORMAT);
    cJSON_Delete(s.good);
    cJSON_Delete(s.bad);
    cJSON_Delete(want);
}

/* A chat file as a dataset: rows become conversations, sampled like any file. */
static void check_dataset(const char *dir)
{
    char spec[512];
    snprintf(spec, sizeof spec, "%s/chat_zstd_v2.parquet#5", dir);
    const char *specs[] = {spec};
    at_dataset *ds = NULL;
    CHECK_OK(at_dataset_load(specs, 1, NULL, &ds));
    if (!ds) return;
    CHECK(ds->train.n == 5);
    for (size_t i = 0; i < ds->train.n; i++) {
        const at_sample *s = ds->train.items[i];
        CHECK(s->kind == AT_SAMPLE_CONVERSATION);
        CHECK(s->messages.n >= 1);
    }
    at_dataset_free(ds);
}

int main(void)
{
    if (!at_test_js_ready("parquet-wasm") || !at_test_js_ready("apache-arrow")) return at_test_result("parquet");
    char dir[] = "/tmp/at_parquet_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "node tests/js/write_parquet.mjs %s > /dev/null", dir);
    CHECK_MSG(system(cmd) == 0, "tests/js/write_parquet.mjs failed");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(dir, cases[i]);
    check_utf8(dir);
    check_dataset(dir);
    check_damage(dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return at_test_result("parquet");
}
