/* The options of the training commands (sft, pt, rlhf): one table, with
 * ms-swift's names, that is the single source of
 *   - `anytune sft --help` and the parser (command line and config files),
 *   - args.json (every row, as resolved),
 *   - the library's defaults: at_train_args_defaults stores each row's
 *     default at the field the row names (AT_OPT_AT), so the library and the
 *     command line cannot train differently,
 *   - the web UI's allow-list, which takes each allowed option's type, range
 *     and choices from here (serve/webui_train.c).
 * An option is one row. Rows without a store are read by the command
 * (lists, enums parsed into at_train_args, options of the command line
 * alone). Rows of ms-swift options that mean nothing here are
 * AT_ROLE_IGNORED or AT_ROLE_REFUSED with a note (base/options.h). */
#ifndef AT_TRAIN_TRAIN_OPTIONS_H
#define AT_TRAIN_TRAIN_OPTIONS_H

#include "base/options.h"
#include "model/config.h"
#include "train/grpo.h"
#include "train/preference.h"
#include "train/trainer.h"

extern const at_opt_spec at_train_options[];
extern const int at_train_n_options;
/* `anytune rlhf`'s options beyond those (rlhf_type, beta, ...). */
extern const at_opt_spec at_rlhf_options[];
extern const int at_rlhf_n_options;

/* The rlhf rows' values into the library's structs: with o NULL the rows'
 * defaults (what at_pref_config_init and at_grpo_config_init start from),
 * else the values o resolved (unset rows without a default: 0 / NULL).
 * pref: label_smoothing, desirable_weight, undesirable_weight,
 * center_rewards_coefficient (beta and the type's own defaults are set by
 * at_pref_config_init); grpo: every number and bool row, reward_model,
 * reward_command and scale_rewards (lists and loss_type are the command's). */
void at_pref_config_store(const at_options *o, at_pref_config *c);
void at_grpo_config_store(const at_options *o, at_grpo_config *c);
/* How many of those fields name no row of at_rlhf_options (0; for the tests). */
int at_rlhf_fields_unknown(void);

/* Checks every stored field of *a against its row's range (the library's
 * callers get the command line's checks). Rows without a default (e.g.
 * max_length) accept 0 as "unset". */
at_status at_train_args_check(const at_train_args *a);

/* --max_length when unset: the model's context (max_position_embeddings),
 * 2048 when the config does not say. */
int at_train_default_max_length(const at_model_config *cfg);

#endif
