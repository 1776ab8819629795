/* The trainer: `anytune sft`, `anytune pt` and `anytune rlhf` (preference
 * objectives: DPO, SimPO, CPO, ORPO).
 *
 * One run: load the model, tokenizer and chat template; read and encode the
 * datasets; make (or load) the LoRA adapter, or train every weight; then for
 * each optimizer step run gradient_accumulation_steps micro-batches through
 * forward and backward (the loss is the mean over every supervised token of
 * the step, token-weighted across micro-batches as transformers >= 4.46
 * does), clip by the global norm, step AdamW with the scheduled rate, log,
 * evaluate and checkpoint. Everything a run writes is laid out as DESIGN.md
 * says (run_files.h). The data order, LoRA dropout masks and everything else
 * random are functions of --seed and the step, so a run resumed from a
 * checkpoint continues exactly as it would have. */
#ifndef AT_TRAIN_TRAINER_H
#define AT_TRAIN_TRAINER_H

#include <stdint.h>
#include <stdio.h>
#include "base/status.h"
#include "data/encode.h"
#include "device/dtype.h"
#include "train/preference.h"
#include "train/schedule.h"

typedef struct {
    /* what */
    const char *model;              /* model folder / file */
    const char *template_name;      /* NULL: the model's; "none"; a built-in name; a .jinja file */
    const char *model_type;         /* NULL, or --model_type: the family to read --model as (model/config.h) */
    const char *tokenizer;          /* NULL: the model's (folder files, GGUF arrays, llama2.c tokenizer.bin) */
    const char *const *datasets;
    int n_datasets;
    const char *const *val_datasets;
    int n_val_datasets;
    double split_dataset_ratio;
    int pt;                         /* continued pre-training: every token of text samples */
    int strict;
    const char *model_name, *model_author; /* fill {{name}} / {{author}} in the data */
    const char *model_name_en, *model_author_en; /* ms-swift's second value: English records' (the first fills
                                                    Chinese ones; data/dataset.h); NULL: the first fills all */
    const char *system;             /* the system message of conversations that have none (NULL: none added) */
    int loss_last_turn_only;
    /* how */
    int full;                       /* --train_type full */
    int quant_bits;                 /* --quant_bits: 0 none, 4 NF4 (QLoRA), 8 q8_0: the frozen linear
                                       matrices quantized (LoRA only; refused with full) */
    int lora_rank;
    double lora_alpha, lora_dropout;
    double neftune_noise_alpha;     /* NEFTune: uniform noise of alpha / sqrt(L·hidden) on the embeddings in
                                       training (decoder.h at_decoder_acts); 0: off. L is the columns of a
                                       micro-batch holding the whole step (the step's longest row, or the
                                       packing length), so every micro-batch layout adds the same noise */
    unsigned target_mask;
    int use_rslora;
    const char *adapters;           /* start from this PEFT adapter */
    int max_length;
    at_truncation truncation;
    int packing;
    int group_by_length;            /* batches of similar lengths (less padding) */
    int gradient_checkpointing;
    int batch_size, grad_accum;
    double learning_rate;
    double num_train_epochs;
    int64_t max_steps;              /* > 0 overrides epochs */
    at_schedule_kind scheduler;
    double warmup_ratio;
    int64_t warmup_steps;
    double weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
    int logging_steps, save_steps, eval_steps, save_total_limit;
    const char *save_strategy, *eval_strategy; /* "steps" (every save_steps / eval_steps), "epoch" (at each
                                                  epoch's end), "no" (only the final checkpoint / no evaluation) */
    int save_only_model;            /* checkpoints without the optimizer state (smaller; they cannot be resumed) */
    int add_version;                /* 0: the run writes into output_dir itself, not a vN-... folder in it */
    const char *columns;            /* ms-swift's --columns: a JSON object renaming the records' keys */
    int load_best_model_at_end;     /* HF's: checkpoints must fall on evaluations (save_steps a multiple of
                                       eval_steps); the best one is never rotated out by save_total_limit, and
                                       the run ends with its weights (at_train_result.best_checkpoint) */
    const char *output_dir;
    const char *resume_from_checkpoint; /* a checkpoint folder, or "last" (in output_dir's newest run) */
    int has_dtype;
    at_dtype dtype;                 /* --torch_dtype */
    uint64_t seed;
    const char *device;
    int max_nonfinite_steps;        /* stop after this many non-finite steps in a row */
    int loss_scaling;               /* dynamic loss scaling (the planner's choice for f16 devices) */
    double loss_scale_init;         /* its first scale; 0: 2^16 as torch's GradScaler */
    /* the demo's before/after answers: prompts asked before and after training */
    const char *const *preview_prompts;
    int n_preview_prompts;
    int preview_max_tokens;
    const char *args_json;          /* every option as resolved, written to args.json (may be NULL) */
    const char *report_to;          /* "tensorboard" or "all": event files in RUN/runs (train/tensorboard.h);
                                       NULL or "none": none */
    /* preference training (`anytune rlhf`, train/preference.h): the datasets
     * hold pairs, a micro-batch is batch_size pairs (2 rows each), the loss
     * is the objective's mean over the step's pairs. NULL: the causal-LM loss. */
    const at_pref_config *pref;
    /* vision-language models (a folder with a vision tower; ms-swift's names and defaults): which parts
     * train, their learning rates (0: learning_rate), the steps the vision transformer waits, and the
     * image processor's area bounds (0: preprocessor_config.json's) */
    int freeze_vit, freeze_aligner, freeze_llm;
    double vit_lr, aligner_lr;
    int vit_freeze_steps;
    int max_pixels, min_pixels;
} at_train_args;

/* Defaults as ms-swift's (LoRA rank 8, alpha 32, dropout 0.05, lr 1e-4, ...). */
void at_train_args_defaults(at_train_args *a);

typedef struct {
    char run_dir[1024];     /* "" when the run made no update and its new folder was removed again */
    int64_t steps_done;     /* the step reached (counting the steps of the checkpoint resumed from) */
    int64_t start_step;     /* the step a resumed run started from (0: a fresh run); steps_done - start_step ran here */
    int64_t steps_trained;  /* updates this process made (skipped steps not counted) */
    double last_loss;
    double first_loss;
    double first_logged_loss, last_logged_loss; /* the first and last logged losses (interval means, as
                                                   logging.jsonl's); NaN when nothing was logged */
    char best_checkpoint[1100]; /* the saved checkpoint with the lowest eval_loss ("" when none was evaluated) */
    double best_eval_loss;
    int loaded_best;        /* --load_best_model_at_end: the model ends as best_checkpoint's (not the last step's) */
    double train_seconds;
    int stopped_by;         /* SIGTERM or SIGINT when a signal ended the run early (after checkpointing
                               its last step: resume with --resume_from_checkpoint last); 0: it ran to the end */
} at_train_result;

/* Runs the whole training. A run that fails, or stops, before any step made
 * an update removes the run folder it created (nothing in it is worth
 * keeping); a run where no step trained is an error. Progress goes to stderr, the answers of the
 * preview prompts to `out` (stdout when NULL). While the steps run, SIGTERM
 * and SIGINT stop it at the next step boundary with a checkpoint (returns
 * AT_OK with res->stopped_by set; a second signal kills the process). */
at_status at_train_run(const at_train_args *a, FILE *out, at_train_result *res);

#endif
