/* A multiple-choice benchmark on disk, laid out as LLaMA-Factory's
 * evaluation/mmlu and evaluation/ceval folders:
 *
 *   DIR/mapping.json            {"abstract_algebra": {"name": "abstract algebra", "category": "STEM"}, ...}
 *   DIR/dev/SUBJECT_dev.csv     few-shot examples (mc_csv.h)
 *   DIR/val/SUBJECT_val.csv     the questions (also test/ when present)
 *
 * The subjects are the SUBJECT_SPLIT.csv files of DIR/SPLIT, reported in the
 * order of mapping.json (a folder may hold only some of its subjects). A file
 * whose subject mapping.json does not list is an error. Without
 * mapping.json, every file is a subject of its own name (underscores read
 * as spaces) and without category. */
#ifndef AT_EVAL_MC_BENCH_H
#define AT_EVAL_MC_BENCH_H

#include <stddef.h>
#include "base/status.h"
#include "eval/mc_csv.h"

typedef struct {
    char *id;       /* "abstract_algebra" */
    char *name;     /* "abstract algebra": the system line's subject */
    char *category; /* "STEM", "Social Sciences", "Humanities", "Other"; NULL: none */
    at_mc_file dev; /* the few-shot examples (empty when not asked for) */
    at_mc_file eval; /* the questions of the split */
} at_mc_subject;

typedef struct {
    char *dir;
    char *split;
    at_mc_subject *subjects;
    size_t n;
} at_mc_bench;

/* The folder of a benchmark: an existing folder as given; otherwise a name
 * (mmlu, ceval, cmmlu, ...) looked up as $ANYTUNE_EVAL_DATA/NAME, then
 * evaluation/NAME under the working folder (LLaMA-Factory's task_dir). *dir
 * is a new string (caller frees). AT_ERR_NOT_FOUND saying where it looked. */
at_status at_mc_bench_find(const char *name_or_path, char **dir);

/* Loads the split's questions and, when need_dev, each subject's dev file.
 * *out: at_mc_bench_free. Errors name the folder or file (and line). */
at_status at_mc_bench_load(const char *dir, const char *split, int need_dev, at_mc_bench *out);
void at_mc_bench_free(at_mc_bench *b); /* zeroed ok */

#endif
