/* anytune rlhf --rlhf_type dpo|simpo|cpo|orpo|kto|rm: preference alignment with the
 * options of `anytune sft` (cmd_train.h) plus ms-swift's RLHF ones, computed
 * as TRL's trainers do (train/preference.h). ms-swift's other rlhf types are
 * refused by name. Options left unset take ms-swift's defaults for the
 * chosen type (beta 2 for simpo, 0.1 otherwise; cpo_alpha 1 for cpo and
 * simpo; simpo_gamma 1), written back so args.json shows what ran. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "train/preference.h"
#include "train/train_options.h"


static int fail2(void)
{
    fprintf(stderr, "anytune: error: %s\n", at_last_error());
    return 2;
}

/* Writes the resolved value of a float option back for args.json. */
static int set_float(at_options *o, const char *name, double v)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return at_opt_set(o, name, buf) == AT_OK ? -1 : fail2();
}

static int resolve(at_options *o, at_train_args *a, void *ctx)
{
    at_pref_config *c = ctx;
    if (at_pref_config_init(c, at_opt_str(o, "rlhf_type")) != AT_OK) return fail2();
    const char *lt = at_opt_str(o, "loss_type");
    if (lt) {
        if (c->objective == AT_PREF_ORPO) {
            fprintf(stderr, "anytune: error: --loss_type %s does not apply to --rlhf_type orpo (it has one loss)\n",
                    lt);
            return 2;
        }
        if (at_pref_loss_type_parse(lt, &c->loss_type) != AT_OK) return fail2();
        /* --rlhf_type cpo --loss_type simpo is SimPO (ms-swift's simpo keeps its beta 2) */
        if (c->loss_type == AT_PREF_SIMPO) c->simpo_gamma = 1.0;
        else c->simpo_gamma = 0;
    }
    if (at_opt_str(o, "beta")) c->beta = at_opt_float(o, "beta");
    c->label_smoothing = at_opt_float(o, "label_smoothing");
    if (at_opt_str(o, "rpo_alpha")) c->rpo_alpha = at_opt_float(o, "rpo_alpha");
    if (at_opt_str(o, "cpo_alpha")) c->cpo_alpha = at_opt_float(o, "cpo_alpha");
    if (at_opt_str(o, "simpo_gamma")) c->simpo_gamma = at_opt_float(o, "simpo_gamma");
    c->ref_model = at_opt_str(o, "ref_model");
    c->desirable_weight = at_opt_float(o, "desirable_weight");
    c->undesirable_weight = at_opt_float(o, "undesirable_weight");
    c->center_rewards_coefficient = at_opt_float(o, "center_rewards_coefficient");
    if (at_pref_config_check(c) != AT_OK) return fail2();
    /* what the defaults resolved to, for args.json */
    int rc = set_float(o, "beta", c->beta);
    if (rc < 0 && c->objective != AT_PREF_ORPO && c->objective < AT_PREF_KTO &&
        at_opt_set(o, "loss_type", at_pref_loss_type_name(c->loss_type)) != AT_OK)
        rc = fail2();
    if (rc < 0 && c->objective == AT_PREF_CPO) rc = set_float(o, "cpo_alpha", c->cpo_alpha);
    if (rc < 0 && c->loss_type == AT_PREF_SIMPO) rc = set_float(o, "simpo_gamma", c->simpo_gamma);
    if (rc >= 0) return rc;
    a->pref = c;
    /* labels on the final reply only (ms-swift's loss_scale last_round for
     * RLHF): the prompt's earlier assistant turns are context, not what is
     * compared */
    a->loss_last_turn_only = 1;
    return -1;
}

int at_cmd_rlhf(int argc, char **argv)
{
    at_pref_config cfg;
    at_pref_config_init(&cfg, "dpo");
    at_train_cli c = {0};
    c.command = "rlhf";
    c.usage = "usage: anytune rlhf --rlhf_type dpo|simpo|cpo|orpo|kto|rm --model DIR --dataset FILE [OPTIONS]   "
              "preference alignment\n"
              "  (records: chosen/rejected pairs, or for kto conversations with a \"label\"; a micro-batch of N "
              "pairs or examples runs 2N rows)";
    c.extra = at_rlhf_options;
    c.n_extra = at_rlhf_n_options;
    c.resolve = resolve;
    c.ctx = &cfg;
    c.plan_command = "dpo";
    c.preference = 1;
    return at_cli_train(argc, argv, &c);
}
