/* Fuzz target: the Parquet reader (data/parquet.c, with its Thrift footer
 * parser). Must not crash, leak or read out of bounds; every row it hands
 * out is a JSON object numbered in order. Seeds: files written by
 * parquet-wasm (tests/js/write_parquet.mjs) in several codecs and nestings. */
#include <stdint.h>
#include <stdlib.h>
#include "data/parquet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static at_status on_row(void *ctx, const at_record *rec)
{
    int *rows = ctx;
    if (!cJSON_IsObject(rec->json) || rec->line != *rows + 1) __builtin_trap();
    ++*rows;
    return AT_OK;
}

static at_status on_issue(void *ctx, at_issue_kind kind, int line, const char *msg)
{
    int *rows = ctx;
    if (kind != AT_ISSUE_UTF8 || line != *rows + 1 || !msg) __builtin_trap();
    ++*rows;
    return AT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int rows = 0;
    (void)at_parquet_read_limited(data, size, "fuzz.parquet", (size_t)1 << 16, on_row, on_issue, &rows);
    return 0;
}
