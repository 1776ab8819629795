/* A reader of Apache Thrift's compact protocol, the encoding of Parquet's
 * footer and page headers. Only what reading needs: field headers, varints
 * (zigzag for signed), binary strings, list headers, and skipping any value
 * of an unknown field. Every read is bounds-checked against the buffer; the
 * first failure sticks in `err`, so a caller may read a whole struct and
 * check once. Nesting is limited (AT_THRIFT_MAX_DEPTH) so hostile input
 * cannot exhaust the stack. */
#ifndef AT_DATA_THRIFT_H
#define AT_DATA_THRIFT_H

#include <stddef.h>
#include <stdint.h>

#define AT_THRIFT_MAX_DEPTH 32

/* Compact-protocol type codes (low nibble of a field header). */
enum {
    AT_TT_STOP = 0,
    AT_TT_TRUE = 1,
    AT_TT_FALSE = 2,
    AT_TT_BYTE = 3,
    AT_TT_I16 = 4,
    AT_TT_I32 = 5,
    AT_TT_I64 = 6,
    AT_TT_DOUBLE = 7,
    AT_TT_BINARY = 8,
    AT_TT_LIST = 9,
    AT_TT_SET = 10,
    AT_TT_MAP = 11,
    AT_TT_STRUCT = 12
};

typedef struct {
    const uint8_t *p, *end;
    int err;    /* nonzero after the first malformed or truncated read */
    int depth;  /* structs entered */
} at_thrift;

/* Reads the next field header of the current struct: returns 0 at the STOP
 * byte (or on error), else 1 with *id and *type set. *last is the previous
 * field id of this struct (start with 0); it is updated. */
int at_thrift_field(at_thrift *t, int16_t *last, int16_t *id, int *type);
int64_t at_thrift_i64(at_thrift *t); /* zigzag varint: i16, i32, i64 */
/* A binary/string: pointer into the buffer and its length (NULL on error). */
const uint8_t *at_thrift_binary(at_thrift *t, size_t *len);
/* A list or set header: element count (bounded by the bytes left) and type. */
size_t at_thrift_list(at_thrift *t, int *elem_type);
/* Skips one value of the given type (structs, lists and maps recursively). */
void at_thrift_skip(at_thrift *t, int type);
/* Struct nesting: enter returns 0 (and sets err) past the depth limit. */
int at_thrift_enter(at_thrift *t);
void at_thrift_leave(at_thrift *t);

#endif
