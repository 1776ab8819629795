/* The body shared by the training commands (sft, pt, rlhf): one option table
 * (ms-swift's names), its resolution into at_train_args, the planner, args.json
 * and the run. A command adds its own options and resolves them in a hook. */
#ifndef AT_CLI_CMD_TRAIN_H
#define AT_CLI_CMD_TRAIN_H

#include "base/options.h"
#include "train/trainer.h"

typedef struct {
    const char *command;       /* "sft", "pt", "rlhf": the parser's name and args.json's "command" */
    const char *usage;         /* first lines of --help */
    int pt;                    /* continued pre-training */
    int demo;                  /* neither --model nor --dataset: the bundled demo (sft) */
    const at_opt_spec *extra;  /* the command's own options, after the common ones */
    int n_extra;
    /* Called after the common options are in *a and before the planner: reads
     * the extra options into *a. Returns -1 to go on, else the exit status
     * (having printed the error). */
    int (*resolve)(at_options *o, at_train_args *a, void *ctx);
    void *ctx;
    const char *plan_command;  /* the planner's command name (NULL: command) */
    int preference;            /* the planner counts two rows per sample (chosen and rejected) */
} at_train_cli;

/* --resume_from_checkpoint (resume_args.c): finds the run and takes the
 * options of its args.json that were not given again; options given again
 * must agree with the run's (except those that do not change what it
 * computes, e.g. --logging_steps), else the error names each difference.
 * Sets resume_from_checkpoint to the checkpoint found. Returns -1 to go on
 * (also without --resume_from_checkpoint), else the exit status (the error
 * printed). */
int at_cli_resume_options(at_options *o, const char *command);

/* Parses argv with the common table plus c->extra and runs the training.
 * Returns the process exit status. */
int at_cli_train(int argc, char **argv, const at_train_cli *c);

#endif
