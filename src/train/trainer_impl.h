/* The trainer's state, shared by its files: trainer.c (the run and its
 * step), trainer_ckpt.c (checkpoints, resume, the run folder) and
 * trainer_log.c (logging.jsonl, the progress notes, the loss curve). Not
 * for use outside train/. */
#ifndef AT_TRAIN_TRAINER_IMPL_H
#define AT_TRAIN_TRAINER_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <cjson/cJSON.h>
#include "base/progress.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "device/comm.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/mrope.h"
#include "model/vision.h"
#include "data/image_proc.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/loss_scale.h"
#include "train/objective.h"
#include "train/optimizer.h"
#include "train/run_files.h"
#include "train/tensorboard.h"
#include "train/text_pipeline.h"
#include "train/trainer.h"

/* Everything a run holds; released by at_trainer_free on every path. */
typedef struct {
    const at_train_args *a;
    at_backend *be;
    at_decoder *dec;
    at_adapter *adapter;
    at_decoder_grads *grads;
    at_optimizer opt;
    int opt_ready;
    at_tokenizer *tok;
    at_chat_template *tmpl;
    at_text_pipeline pipe;
    int pipe_ready;
    at_dataset *ds, *val_ds;
    at_objective *obj;    /* what is trained (its data, its loss) */
    int max_length;       /* --max_length, or the model's context when unset (0) */
    at_decoder_acts *acts;
    /* a vision-language model (Qwen2-VL, Qwen2.5-VL folders): its tower, image processor and M-RoPE tokens */
    at_vision *vision;
    at_image_processor improc;
    at_mrope_tokens mrope;
    int has_mrope;        /* the language model takes M-RoPE positions */
    int n_dec_params;     /* the first n_dec_params of opt.params are the decoder's (0 with --freeze_llm) */
    int n_vis_params;     /* the last n_vis_params are the vision tower's */
    char *run_dir;
    int run_dir_new;      /* this process created run_dir (removed again when no step of it trained) */
    at_run_lock lock;     /* rank 0's hold on run_dir */
    FILE *log;
    at_tb_writer tb;      /* --report_to tensorboard (rank 0): every logged scalar */
    int64_t steps_per_epoch, total_steps, n_batches;
    int64_t tokens_seen;  /* input tokens trained on so far (kept across a resume) */
    at_loss_scaler scaler;
    int oom_halvings;     /* micro-batches run in 1 << oom_halvings pieces since an out-of-memory retry */
    /* data parallel (mpirun -np N): this process is rank `rank` of `world`; each
     * step's grad_accum · world micro-batches are split in consecutive runs of
     * grad_accum per rank and the gradients summed, so N processes compute what
     * one process with N-fold accumulation would. Rank 0 alone writes files. */
    at_comm *comm;
    int rank, world;
    FILE *devnull;
    /* the current epoch's batch plan (over the objective's training items) */
    at_batch_plan plan;
    int64_t plan_epoch;
    /* the step's counts and statistics (the objective's, summed over the
     * step's micro-batches and the ranks), and the logging interval's */
    double step_counts[AT_OBJ_MAX_COUNTS];
    double step_stats[AT_OBJ_MAX_STATS], interval_stats[AT_OBJ_MAX_STATS];
    /* history for the SVG */
    int64_t *hist_step, *eval_step;
    double *hist_loss, *hist_lr, *eval_loss;
    int n_hist, cap_hist, n_eval, cap_eval;
} at_trainer;

/* ---- trainer_ckpt.c ---- */

/* Writes RUN/checkpoint-STEP (the adapter, or every weight with the files
 * that make it a model folder; the optimizer state unless
 * --save_only_model), sealed, and prunes to --save_total_limit. */
at_status at_trainer_save_checkpoint(at_trainer *t, int64_t step);
/* --resume_from_checkpoint: finds the checkpoint, takes the run's lock (rank
 * 0), loads the weights, the optimizer state, the loss scale and the tokens
 * seen, truncates logging.jsonl to the step; t->run_dir becomes the run's. */
at_status at_trainer_resume(at_trainer *t, int64_t *start_step);
/* --load_best_model_at_end (transformers' rule): names in res the run's
 * checkpoint with the lowest logged eval_loss (resumed runs' evaluations
 * too) and, with the option, loads its weights so the run ends with them. */
at_status at_trainer_load_best(at_trainer *t, at_train_result *res);
/* A fresh run: rank 0 creates the run folder (or takes output_dir itself
 * with --add_version false) and its lock. */
at_status at_trainer_open_run_dir(at_trainer *t);

/* ---- trainer_log.c ---- */

/* The statistics of the logging interval under way. */
typedef struct {
    double loss, t0; /* sum of the steps' losses; when the interval began */
    int steps;
    int64_t tokens, tokens_run; /* the interval's input tokens; this process's so far */
} at_log_interval;

/* Opens RUN/logging.jsonl for appending (rank 0), and with --report_to
 * tensorboard a new event file in RUN/runs. */
at_status at_trainer_log_open(at_trainer *t);
/* Appends line to logging.jsonl, and its numbers to the event file
 * (nothing on ranks other than 0). */
at_status at_trainer_log_line(at_trainer *t, cJSON *line);
/* Adds the updated step `done`'s interval fields to line (step, epoch, loss,
 * the objective's, grad_norm, lr, tokens, ...), its point of the loss curve
 * and the progress note; starts the next interval. */
at_status at_trainer_log_step(at_trainer *t, cJSON *line, at_progress *bar, int64_t done, double norm, double lr,
                              at_log_interval *iv, at_train_result *res);
/* Adds eval_loss (and step when missing) to line, its point of the curve and the note. */
at_status at_trainer_log_eval(at_trainer *t, cJSON *line, at_progress *bar, int64_t done, double eval_loss);
/* RUN/images/train_loss.svg from the history (nothing when nothing was logged). */
at_status at_trainer_write_plot(at_trainer *t);
/* Peak resident memory of the process, MB. */
double at_trainer_peak_rss_mb(void);

#endif
