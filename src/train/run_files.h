/* The files a run writes, laid out as ms-swift / the Hugging Face Trainer do:
 *
 *   OUTPUT_DIR/vN-YYYYMMDD-HHMMSS/            one folder per run
 *     checkpoint-STEP/ ... MANIFEST.sha256    one folder per checkpoint
 *
 * A checkpoint is written into "checkpoint-STEP.tmp", every file fsynced, a
 * MANIFEST.sha256 (sha256sum format, sorted by name) written last, then the
 * folder renamed into place and its parent fsynced: a crash never leaves a
 * folder named checkpoint-STEP that is not whole, and the manifest lets a
 * resume check that nothing was damaged since. */
#ifndef AT_TRAIN_RUN_FILES_H
#define AT_TRAIN_RUN_FILES_H

#include <stdint.h>
#include "base/manifest.h" /* at_manifest_verify checks a checkpoint */
#include "base/status.h"

/* Creates OUTPUT_DIR (and parents) and a fresh run folder in it named
 * v<N>-YYYYMMDD-HHMMSS, N one more than the highest existing v<N>-*.
 * *out is a new string (caller frees). */
at_status at_run_dir_create(const char *output_dir, char **out);

/* Starts checkpoint STEP: (re)creates RUN/checkpoint-STEP.tmp, empty.
 * *tmp_dir is a new string (caller frees). */
at_status at_ckpt_begin(const char *run_dir, int64_t step, char **tmp_dir);

/* Seals a checkpoint begun with at_ckpt_begin: fsyncs every file, writes the
 * manifest, renames the folder to RUN/checkpoint-STEP (replacing an older one
 * of that step), fsyncs RUN. */
at_status at_ckpt_commit(const char *run_dir, int64_t step, const char *tmp_dir);

/* The complete checkpoint with the highest step in run_dir (a sealed folder
 * whose manifest verifies; damaged ones are skipped with a warning).
 * AT_ERR_NOT_FOUND when there is none. *dir is a new string (caller frees). */
at_status at_ckpt_find_last(const char *run_dir, char **dir, int64_t *step);

/* Keeps the `limit` newest sealed checkpoints (limit <= 0: keep all), deleting
 * the others, plus any leftover *.tmp folder. keep_best (--load_best_model_at_end):
 * the best checkpoint (at_run_best_checkpoint) is kept too, as transformers
 * keeps it: in place of the oldest of the `limit` (limit 1: beside the newest). */
at_status at_ckpt_prune(const char *run_dir, int limit, int keep_best);

/* The run's best checkpoint (--metric_for_best_model loss / eval_loss: lower
 * is better): of the sealed checkpoint-N folders, the one whose step logged
 * the lowest eval_loss in RUN/logging.jsonl (the earliest of equals). Read
 * from the files, so a resumed run counts the evaluations of the runs before
 * it. AT_ERR_NOT_FOUND when no checkpoint's step was evaluated. */
at_status at_run_best_checkpoint(const char *run_dir, int64_t *step, double *value);

/* One writer per run folder: an exclusive flock on RUN/.anytune.lock, which
 * holds the writer's pid. The kernel drops the lock when the process dies,
 * so the lock of a killed run never blocks; a second writer is refused with
 * the holder's pid. Release removes the file. */
typedef struct {
    int fd;     /* -1: not held */
    char *path; /* owned */
} at_run_lock;

at_status at_run_lock_take(const char *run_dir, at_run_lock *lk);
void at_run_lock_release(at_run_lock *lk); /* safe on {-1, NULL}, on a zeroed lock, and twice */

/* The checkpoint that --resume_from_checkpoint SPEC names: a checkpoint
 * folder (its parent is the run), or "last": the newest complete checkpoint
 * of the newest run under output_dir that has one (a newer run without one
 * is named in a warning, never silently passed over); with versioned 0
 * (--add_version false) output_dir is the run itself. *run_dir and *ckpt
 * are new strings (caller frees). */
at_status at_run_find_resume(const char *output_dir, const char *spec, int versioned, char **run_dir, char **ckpt,
                             int64_t *step);

/* rm -rf of one folder (no symlink following). */
at_status at_remove_tree(const char *path);

#endif
