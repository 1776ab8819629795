/* anytune rlhf --rlhf_type dpo: preference alignment with the options of
 * `anytune sft` (cmd_train.h) plus ms-swift's RLHF ones. DPO as TRL computes
 * it (train/dpo.h); the other ms-swift rlhf types are refused by name. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "train/dpo.h"

static const at_opt_spec rlhf_specs[] = {
    {"rlhf_type", AT_OPT_STRING, "dpo", "the preference objective: dpo (this build's only one)", NULL},
    {"beta", AT_OPT_FLOAT, "0.1", "DPO beta: how far the policy may move from the reference", NULL},
    {"loss_type", AT_OPT_STRING, "sigmoid", "sigmoid (DPO), ipo or hinge", NULL},
    {"label_smoothing", AT_OPT_FLOAT, "0", "conservative DPO: the share of pairs assumed mislabeled (sigmoid)", NULL},
    {"rpo_alpha", AT_OPT_FLOAT, NULL, "add rpo_alpha x the chosen replies' NLL (RPO); unset: off", NULL},
    {"ref_model", AT_OPT_STRING, NULL, "reference model (default: the policy's base: LoRA off, or the initial "
                                       "weights for full fine-tuning)", NULL},
};
#define NRLHF ((int)(sizeof rlhf_specs / sizeof rlhf_specs[0]))

static int resolve(at_options *o, at_train_args *a, void *ctx)
{
    at_dpo_config *c = ctx;
    const char *type = at_opt_str(o, "rlhf_type");
    if (strcmp(type, "dpo") != 0) {
        static const char *const known[] = {"orpo", "simpo", "kto", "cpo", "rm", "ppo", "grpo", "gkd"};
        int is_known = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) is_known |= !strcmp(type, known[i]);
        fprintf(stderr, "anytune: error: --rlhf_type %s: %s; this build has dpo\n", type,
                is_known ? "not in this build" : "unknown (ms-swift's are dpo, orpo, simpo, kto, cpo, rm, ppo, grpo, gkd)");
        return 2;
    }
    at_dpo_config_defaults(c);
    c->beta = at_opt_float(o, "beta");
    c->label_smoothing = at_opt_float(o, "label_smoothing");
    c->rpo_alpha = at_opt_str(o, "rpo_alpha") ? at_opt_float(o, "rpo_alpha") : 0;
    c->ref_model = at_opt_str(o, "ref_model");
    if (at_dpo_loss_type_parse(at_opt_str(o, "loss_type"), &c->loss_type) != AT_OK ||
        at_dpo_config_check(c) != AT_OK) {
        fprintf(stderr, "anytune: error: %s\n", at_last_error());
        return 2;
    }
    a->dpo = c;
    /* labels on the final reply only (ms-swift's loss_scale last_round for DPO):
     * the prompt's earlier assistant turns are context, not what is compared */
    a->loss_last_turn_only = 1;
    return -1;
}

int at_cmd_rlhf(int argc, char **argv)
{
    at_dpo_config cfg;
    at_dpo_config_defaults(&cfg);
    at_train_cli c = {0};
    c.command = "rlhf";
    c.usage = "usage: anytune rlhf --rlhf_type dpo --model DIR --dataset FILE [OPTIONS]   preference alignment\n"
              "  (records: chosen/rejected pairs; a micro-batch of N pairs runs 2N rows)";
    c.extra = rlhf_specs;
    c.n_extra = NRLHF;
    c.resolve = resolve;
    c.ctx = &cfg;
    c.plan_command = "dpo";
    c.preference = 1;
    return at_cli_train(argc, argv, &c);
}
