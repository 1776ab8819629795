/* Parquet files as dataset records.
 *
 * Each row becomes one JSON object, as if the file were JSON Lines: the
 * columns are its keys, nested groups become objects, LIST-annotated groups
 * (three-level and the older two-level layouts) and bare repeated fields
 * become arrays, so a Hugging Face chat dataset's `messages:
 * list<struct<role, content>>` reads as [{"role":..,"content":..}, ...].
 * Strings (BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY) must be valid UTF-8; integers and
 * floats become numbers, booleans booleans, INT96 null.
 *
 * Supported: PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, RLE booleans;
 * repetition/definition levels in the RLE/bit-packed hybrid; data pages v1 and
 * v2 and dictionary pages; uncompressed, SNAPPY, GZIP and ZSTD pages. Other
 * encodings and codecs are refused with a message naming them.
 *
 * Reading is streamed one row group at a time (only that group's pages are
 * decoded and held). Every offset, length and count in the file is checked
 * against the bytes that hold it. Memory is bounded: a page decompresses to
 * at most 256 MiB, and a row group may hold at most AT_PARQUET_MAX_ENTRIES
 * level entries (values and nulls, all columns together; about 24 bytes
 * each while the group is assembled). */
#ifndef AT_DATA_PARQUET_H
#define AT_DATA_PARQUET_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "data/records.h"

#define AT_PARQUET_MAX_ENTRIES ((size_t)1 << 25)

/* 1 when data starts like a Parquet file ("PAR1"). */
int at_parquet_sniff(const void *data, size_t len);

/* Calls on_record for each row of data[0..len) in order; the record's line
 * is the row's 1-based index in the file. A row holding a string that is not
 * UTF-8 goes to on_issue (skip or stop, as for other containers; NULL:
 * stop). Damage to the file's structure is AT_ERR_FORMAT naming `name` and
 * what is wrong. */
at_status at_parquet_read_mem(const uint8_t *data, size_t len, const char *name, at_record_fn on_record,
                              at_record_issue_fn on_issue, void *ctx);

/* The same with another bound on a row group's entries (the fuzzer keeps it
 * small so that a few bytes of run-length levels cannot make it slow). */
at_status at_parquet_read_limited(const uint8_t *data, size_t len, const char *name, size_t max_entries,
                                  at_record_fn on_record, at_record_issue_fn on_issue, void *ctx);

#endif
