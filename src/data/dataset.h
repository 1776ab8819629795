/* Datasets: files of training records, normalized into one representation.
 *
 * Formats (chosen per file from the keys of its first record, as ms-swift's
 * AutoPreprocessor does, or forced with an option):
 *   alpaca      instruction, input, output, optional system and history
 *               ([[query, response], ...]); query = instruction + "\n" + input
 *   sharegpt /  conversations | messages | conversation: a list of
 *   messages    {from, value} or {role, content}; roles human/user,
 *               gpt/assistant/bot, system, function_call/tool_call (becomes an
 *               assistant message with OpenAI tool_calls), observation /
 *               function_response / tool_response / tool (becomes "tool");
 *               optional record-level system and tools
 *   response    query/prompt/question/... + response/answer/output/...
 *               (ms-swift's ResponsePreprocessor key aliases; CSV files with
 *               a header usually land here)
 *   text        {"text": ...} records and .txt files (one text per line), for pt
 *   tokens      {"input_ids": [...], "labels": [...] optional}, used as given
 *   preference  chosen/rejected pairs: LLaMA-Factory (conversations + chosen
 *               and rejected messages, or instruction/input + chosen and
 *               rejected strings), ms-swift (messages + rejected_response, or
 *               messages + rejected_messages), and TRL (prompt + chosen +
 *               rejected, as strings or message lists)
 * Containers: JSON array, JSON Lines, CSV with a header row, text lines.
 *
 * A spec is a path with an optional "#N" suffix: N samples of that file,
 * drawn without replacement when N <= its record count; above it, as
 * ms-swift's sample_dataset does, every record floor(N/count) times plus a
 * random (N mod count) of them. Sampling happens after bad records were
 * dropped, so exactly N samples come out. Then --split_dataset_ratio holds
 * out ceil(ratio * n) samples of each file for validation (at least one
 * sample stays in training), shuffling that file first, as Hugging Face's
 * train_test_split does. Everything random follows options.seed.
 *
 * Bad records: reported as "file:line: reason" (for a JSON array the line
 * where the record starts; JSON syntax errors also give the column). With
 * strict the first one stops loading with that message; otherwise it is
 * skipped, logged (the first few) and counted in the summary. A file with no
 * usable record is an error either way. */
#ifndef AT_DATA_DATASET_H
#define AT_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/arena.h"
#include "data/records.h"

typedef enum { AT_ROLE_SYSTEM = 0, AT_ROLE_USER, AT_ROLE_ASSISTANT, AT_ROLE_TOOL } at_role;

/* "system", "user", "assistant", "tool". */
const char *at_role_name(at_role r);

typedef struct {
    at_role role;
    const char *content;    /* NUL-terminated UTF-8, never NULL ("" if none) */
    const char *tool_calls; /* compact JSON of an OpenAI tool_calls array, or NULL */
    int loss;               /* ms-swift's per-message "loss": -1 unset, 0 or 1 */
} at_message;

typedef struct {
    const at_message *items;
    size_t n;
} at_messages;

typedef enum {
    AT_SAMPLE_CONVERSATION = 0,
    AT_SAMPLE_TEXT,
    AT_SAMPLE_TOKENS,
    AT_SAMPLE_PREFERENCE
} at_sample_kind;

/* One normalized record. Everything it points to is owned by its dataset. */
typedef struct {
    at_sample_kind kind;
    const char *source; /* the file it came from */
    int line;           /* where the record starts in that file */
    at_messages messages; /* conversation; for a preference pair the prompt */
    const char *tools;    /* compact JSON array of tool definitions, or NULL */
    at_messages chosen, rejected; /* preference pairs (each ends with an assistant message) */
    const char *text;     /* text samples */
    const int32_t *input_ids, *labels; /* token samples; labels NULL when absent */
    size_t n_tokens;
    int label;            /* KTO-style desirability: -1 none, else 0 or 1 */
    /* conversations: the images its "<image>" tags stand for, in order, as
     * data/media.h keeps references (a path, a data URL or base64) */
    const char *const *images;
    size_t n_images;
    const char *solution; /* the record's "solution" (GRPO's accuracy reward), or NULL */
} at_sample;

typedef enum {
    AT_FORMAT_AUTO = 0,
    AT_FORMAT_ALPACA,
    AT_FORMAT_SHAREGPT, /* same reader as MESSAGES: both key styles accepted */
    AT_FORMAT_MESSAGES,
    AT_FORMAT_RESPONSE,
    AT_FORMAT_TEXT,
    AT_FORMAT_TOKENS,
    AT_FORMAT_PREFERENCE
} at_data_format;

/* "auto", "alpaca", "sharegpt", "messages", "response", "text", "tokens", "preference". */
const char *at_data_format_name(at_data_format f);
/* Parses one of those names (also "pt" for text, "dpo"/"ranking" for preference). */
at_status at_data_format_parse(const char *name, at_data_format *out);

typedef struct {
    uint64_t seed;           /* sampling, split and shuffle (ms-swift's default is 42) */
    int strict;              /* stop at the first bad record */
    double split_ratio;      /* 0..1: share of each file held out for validation */
    int shuffle;             /* shuffle the mixed training list after loading */
    at_data_format format;   /* AT_FORMAT_AUTO: per file from its keys */
    at_container container;  /* AT_CONTAINER_AUTO: from extension and content */
    const char *model_name;  /* when set, replaces {{name}} / {{NAME}} in all text */
    const char *model_author; /* likewise {{author}} / {{AUTHOR}} */
    /* ms-swift's two-value form (--model_name 小黄 'Xiao Huang'): when set,
     * model_name / model_author fill Chinese records (a "tag": "zh" key, or
     * CJK text) and these the others. NULL: the one value fills all. */
    const char *model_name_en, *model_author_en;
    /* ms-swift's --columns: an object {"their_key": "our_key", ...} renaming
     * each record's keys before its format is read (borrowed); NULL: none */
    const cJSON *columns;
} at_dataset_options;

typedef struct {
    const at_sample **items; /* a sample may appear more than once (#N > count) */
    size_t n;
} at_sample_list;

#define AT_DATASET_MAX_ISSUES 32

typedef struct {
    at_sample_list train, val;
    size_t n_files;
    size_t n_records;   /* usable records read, before sampling */
    size_t n_skipped;   /* bad records skipped */
    size_t skipped_by_kind[AT_ISSUE_COUNT];
    char *issues[AT_DATASET_MAX_ISSUES]; /* the first messages, "file:line: reason" */
    size_t n_issues;
    char *summary;      /* one line for people; see at_dataset_load */
    at_arena arena;     /* owns the samples */
} at_dataset;

/* Loads and mixes the specs ("path" or "path#N") in order: train holds each
 * file's training part in spec order (then shuffled if options.shuffle), val
 * each file's held-out part. options may be NULL (defaults: seed 42, not
 * strict, no split). *out is owned by the caller: at_dataset_free. On error
 * *out is NULL and the message names the file (and line). */
at_status at_dataset_load(const char *const *specs, size_t n_specs, const at_dataset_options *options,
                          at_dataset **out);

/* Splits "path#N" into a new path string (caller frees) and N (0 when no
 * suffix). A '#' not followed by digits only is part of the path. */
at_status at_dataset_parse_spec(const char *spec, char **path, size_t *n_sample);

void at_dataset_free(at_dataset *ds);

/* Messages as an OpenAI-style array [{"role", "content"[, "tool_calls"]}...],
 * the input of the chat-template renderer. Caller owns *out (cJSON_Delete). */
at_status at_messages_to_json(const at_messages *m, cJSON **out);

/* Normalizes one parsed record into *out (strings in arena). fmt AUTO
 * detects from the keys. On failure returns AT_ERR_FORMAT with a message
 * (without file and line) and sets *kind. Used by the loader and the fuzzer. */
typedef struct {
    at_arena *arena;
    const char *model_name, *model_author;
    const char *model_name_en, *model_author_en; /* see at_dataset_options; NULL: as above */
    size_t *unfilled;  /* may be NULL: counts strings left with a {{name}} / {{author}} placeholder */
    const char *base_dir; /* the dataset file's folder: relative image paths start there (NULL: as written) */
} at_normalizer;
at_data_format at_data_format_detect(const cJSON *rec);
at_status at_normalize_record(const at_normalizer *nz, const cJSON *rec, at_data_format fmt, at_sample *out,
                              at_issue_kind *kind);
at_status at_normalize_text(const at_normalizer *nz, const char *text, size_t len, at_sample *out);

#endif
