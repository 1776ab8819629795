/* Multiple-choice question files: the CSVs of MMLU and C-Eval as
 * LLaMA-Factory ships them (evaluation/mmlu, evaluation/ceval).
 *
 * Two layouts, told apart by the first record:
 *   - a header naming the columns (C-Eval: id,question,A,B,C,D,answer and,
 *     in dev files, explanation): the columns question, A, B, C, D and answer
 *     are required (names compared without case), others are ignored;
 *   - no header (MMLU): every record is question,A,B,C,D,answer.
 * The CSV dialect is RFC 4180 as Python's csv module reads it: fields
 * separated by commas, records by LF, CRLF or CR; a field in double quotes
 * may hold commas, line breaks and doubled quotes (""); a quote inside an
 * unquoted field is kept as a character; blank lines are skipped; a UTF-8
 * byte-order mark at the start is skipped.
 *
 * Errors name the file and the line where the record starts: a quoted field
 * that never closes, text after a closing quote, a NUL byte, a record with the
 * wrong number of fields, a missing column, an answer that is not A-D, a
 * file without questions. */
#ifndef AT_EVAL_MC_CSV_H
#define AT_EVAL_MC_CSV_H

#include <stddef.h>
#include "base/status.h"

#define AT_MC_CHOICES 4

typedef struct {
    char *question;
    char *choices[AT_MC_CHOICES]; /* the texts of A, B, C, D */
    int answer;                   /* 0..3 for A..D */
    int line;                     /* where the record starts (1-based) */
} at_mc_item;

typedef struct {
    char *path;       /* the name errors use */
    at_mc_item *items; /* in file order */
    size_t n;
} at_mc_file;

/* Parses data[0..len) (`name` labels errors). On success *out owns
 * everything (at_mc_file_free); on failure *out is empty. */
at_status at_mc_csv_parse(const char *data, size_t len, const char *name, at_mc_file *out);

/* Reads and parses the file at path. */
at_status at_mc_csv_load(const char *path, at_mc_file *out);

void at_mc_file_free(at_mc_file *f); /* zeroed or NULL ok */

#endif
