/* Raw records of a dataset file, before any format is applied.
 *
 * Containers: a JSON array of records, JSON Lines, CSV with a header row
 * (each row becomes an object of strings keyed by the header), plain text
 * (one record per non-empty line), and Parquet (each row an object). A UTF-8 byte order mark at the start
 * is skipped. Every record carries the line where it starts, so problems can
 * be reported as "file:line". Each record's bytes are checked to be valid
 * UTF-8 before they are parsed.
 *
 * A record that cannot be read (malformed JSON inside one array element or
 * one JSONL line, invalid UTF-8, a CSV row with the wrong number of fields)
 * is passed to the error callback, which decides whether to go on (skip) or
 * stop. Damage that leaves the file's structure unknown (e.g. a JSON array
 * whose brackets never close) is fatal and returned as AT_ERR_FORMAT naming
 * file, line and column. */
#ifndef AT_DATA_RECORDS_H
#define AT_DATA_RECORDS_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef enum {
    AT_CONTAINER_AUTO = 0, /* from the extension, then from the first byte */
    AT_CONTAINER_JSON_ARRAY,
    AT_CONTAINER_JSONL,
    AT_CONTAINER_CSV,
    AT_CONTAINER_TEXT,
    AT_CONTAINER_PARQUET /* rows as objects (data/parquet.h); "line" is the row number */
} at_container;

/* Why a record was skipped; counted per kind in the dataset summary. */
typedef enum {
    AT_ISSUE_SYNTAX = 0, /* malformed JSON / CSV */
    AT_ISSUE_UTF8,       /* invalid UTF-8 */
    AT_ISSUE_TYPE,       /* a field has the wrong JSON type */
    AT_ISSUE_MISSING,    /* a required field is absent */
    AT_ISSUE_VALUE,      /* a field has a value its format does not allow */
    AT_ISSUE_FORMAT,     /* the record fits no known format */
    AT_ISSUE_COUNT
} at_issue_kind;

/* A fixed short name such as "malformed JSON". */
const char *at_issue_name(at_issue_kind k);

typedef struct {
    const char *path; /* as given by the caller */
    int line;         /* 1-based line where the record starts */
    const cJSON *json; /* the record (CSV rows: object of strings); NULL for text */
    const char *text;  /* text lines only: the line without its newline */
    size_t text_len;
} at_record;

/* Return AT_OK to continue; anything else stops reading and is returned. */
typedef at_status (*at_record_fn)(void *ctx, const at_record *rec);
/* msg is "path:line: ..." or "path:line:column: ..."; valid during the call.
 * Return AT_OK to skip the record and go on. */
typedef at_status (*at_record_issue_fn)(void *ctx, at_issue_kind kind, int line, const char *msg);

/* Reads path (memory-mapped) and calls on_record for each record in order.
 * container AT_CONTAINER_AUTO chooses from the extension (.jsonl, .csv, .txt,
 * .parquet), then from the content ("PAR1" Parquet, first non-blank byte '['
 * a JSON array, else JSONL). */
at_status at_records_read(const char *path, at_container container, at_record_fn on_record,
                          at_record_issue_fn on_issue, void *ctx);

/* Same over data[0..len) (need not be NUL-terminated); name is used in messages.
 * container must not be AUTO unless name has an extension to go by. */
at_status at_records_read_mem(const char *data, size_t len, const char *name, at_container container,
                              at_record_fn on_record, at_record_issue_fn on_issue, void *ctx);

/* Offset of the first byte of s[0..len) that is not valid UTF-8 (overlong
 * forms, surrogates and code points above U+10FFFF are invalid); len if all
 * bytes are valid. */
size_t at_utf8_check(const char *s, size_t len);

#endif
