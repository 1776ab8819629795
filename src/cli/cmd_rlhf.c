/* anytune rlhf --rlhf_type dpo|simpo|cpo|orpo|kto|rm|grpo: alignment with the
 * options of `anytune sft` (cmd_train.h) plus ms-swift's RLHF ones, computed
 * as TRL's trainers do (train/preference.h). ms-swift's other rlhf types are
 * refused by name. Options left unset take ms-swift's defaults for the
 * chosen type (beta 2 for simpo, 0.1 otherwise; cpo_alpha 1 for cpo and
 * simpo; simpo_gamma 1), written back so args.json shows what ran. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "train/grpo.h"
#include "train/preference.h"
#include "train/train_options.h"


typedef struct {
    at_pref_config pref;
    at_grpo_config grpo;
    const char *demo_ds[1];
    char mbuf[4096], dbuf[4096], rmbuf[4096];
} rlhf_ctx;

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

/* Marks an option as given (the planner keeps it) with this value unless the user gave one. */
static void demo_default(at_options *o, const char *name, const char *value)
{
    if (at_opt_source_of(o, name) == AT_SRC_DEFAULT) at_opt_set_from(o, name, value, AT_SRC_CONFIG);
}

/* --reward_model given as an rm LoRA checkpoint (it has an adapter_config.json):
 * the adapter is scored over its base, found as `anytune infer --adapters`
 * finds it. 0, or 2 (the exit status) when that base cannot be found. */
static int resolve_reward_model(at_grpo_config *g, rlhf_ctx *x)
{
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", g->reward_model);
    if (!at_is_dir(g->reward_model) || !at_file_exists(cfg)) return 0;
    char *base = NULL;
    if (at_cli_adapter_base(g->reward_model, &base) != AT_OK) {
        fprintf(stderr, "anytune: error: --reward_model: %s\n", at_last_error());
        return 2;
    }
    snprintf(x->rmbuf, sizeof x->rmbuf, "%s", base);
    free(base);
    g->reward_model_adapter = g->reward_model;
    g->reward_model = x->rmbuf;
    return 0;
}

/* --rlhf_type grpo's own options into g; the demo when neither --model nor --dataset is given. */
static int resolve_grpo(at_options *o, at_train_args *a, rlhf_ctx *x)
{
    at_grpo_config *g = &x->grpo;
    int demo = !at_opt_str(o, "model") && a->n_datasets == 0;
    if (demo) {
        /* the stories260K model learns to answer in one short line (a completion ends at its first
         * newline): its reward is DAPO's soft overlong penalty, 0 up to 8 tokens, -1 at 40 */
        a->model = at_cli_demo_path("demo/stories260K", x->mbuf, sizeof x->mbuf);
        if (!a->model) a->model = "demo/stories260K";
        x->demo_ds[0] = at_cli_demo_path("demo/grpo_prompts.jsonl", x->dbuf, sizeof x->dbuf);
        if (!x->demo_ds[0]) x->demo_ds[0] = "demo/grpo_prompts.jsonl";
        a->datasets = x->demo_ds;
        a->n_datasets = 1;
        at_opt_set(o, "model", a->model);
        at_opt_set(o, "dataset", x->demo_ds[0]);
        demo_default(o, "reward_funcs", "soft_overlong");
        demo_default(o, "max_completion_length", "40");
        demo_default(o, "soft_cache_length", "32");
        demo_default(o, "num_generations", "8");
        demo_default(o, "temperature", "1.0");
        demo_default(o, "beta", "0");
        if (at_opt_source_of(o, "max_steps") == AT_SRC_DEFAULT) a->max_steps = 40;
        if (at_opt_source_of(o, "logging_steps") == AT_SRC_DEFAULT) a->logging_steps = 5;
        if (at_opt_source_of(o, "lora_rank") == AT_SRC_DEFAULT) a->lora_rank = 16;
        if (at_opt_source_of(o, "lr_scheduler_type") == AT_SRC_DEFAULT) a->scheduler = AT_SCHED_CONSTANT;
        if (at_opt_source_of(o, "warmup_ratio") == AT_SRC_DEFAULT) a->warmup_ratio = 0;
        fprintf(stderr, "anytune rlhf: no --model or --dataset given: the GRPO demo (%s learns to answer %s's "
                        "prompts in one short line: the mean reward rises toward 0)\n", a->model, x->demo_ds[0]);
    }
    /* the planner keeps a GRPO micro-batch as given: its rows are prompts × G generated in the step */
    demo_default(o, "per_device_train_batch_size", demo ? "2" : "1");
    if (demo) a->batch_size = (int)at_opt_int(o, "per_device_train_batch_size");
    demo_default(o, "gradient_accumulation_steps", "1");
    at_grpo_config_init(g);
    at_grpo_config_store(o, g); /* the rows' values (train/train_options.c) */
    if (g->top_k < 0) g->top_k = 0; /* ms-swift's -1: off */
    if (g->reward_model && resolve_reward_model(g, x)) return 2;
    if (at_grpo_scale_parse(at_opt_str(o, "scale_rewards"), &g->scale_rewards) != AT_OK) return fail2();
    const char *lt = at_opt_str(o, "loss_type");
    if (lt && at_grpo_loss_type_parse(lt, &g->loss_type) != AT_OK) return fail2();
    if (at_opt_set(o, "loss_type", at_grpo_loss_type_name(g->loss_type)) != AT_OK) return fail2();
    int ns = at_opt_list_count(o, "stop_words");
    if (ns > 8) {
        fprintf(stderr, "anytune: error: at most 8 --stop_words\n");
        return 2;
    }
    for (int i = 0; i < ns; i++) g->stop_words[g->n_stop_words++] = at_opt_list_get(o, "stop_words", i);
    /* the demo's completions end at a newline (the option lists trim white space, so it is set here) */
    if (demo && !ns) g->stop_words[g->n_stop_words++] = "\n";
    int nf = at_opt_list_count(o, "reward_funcs"), nw = at_opt_list_count(o, "reward_weights");
    if (nf > AT_GRPO_MAX_REWARDS || nw > AT_GRPO_MAX_REWARDS + 2) {
        fprintf(stderr, "anytune: error: at most %d --reward_funcs\n", AT_GRPO_MAX_REWARDS);
        return 2;
    }
    for (int i = 0; i < nf; i++) g->reward_funcs[g->n_reward_funcs++] = at_opt_list_get(o, "reward_funcs", i);
    for (int i = 0; i < nw; i++) {
        const char *w = at_opt_list_get(o, "reward_weights", i);
        char *end;
        g->reward_weights[i] = strtod(w, &end);
        if (end == w || *end || !isfinite(g->reward_weights[i])) {
            fprintf(stderr, "anytune: error: --reward_weights %s: not a number\n", w);
            return 2;
        }
    }
    g->n_reward_weights = nw;
    x->pref.grpo = g;
    return -1;
}

static int resolve(at_options *o, at_train_args *a, void *ctx)
{
    rlhf_ctx *x = ctx;
    at_pref_config *c = &x->pref;
    if (at_pref_config_init(c, at_opt_str(o, "rlhf_type")) != AT_OK) return fail2();
    if (c->objective == AT_PREF_GRPO) {
        int rc = resolve_grpo(o, a, x);
        if (rc >= 0) return rc;
    }
    const char *lt = at_opt_str(o, "loss_type");
    if (lt && c->objective != AT_PREF_GRPO) {
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
    at_pref_config_store(o, c); /* label_smoothing, the kto weights, center_rewards_coefficient */
    if (at_opt_str(o, "rpo_alpha")) c->rpo_alpha = at_opt_float(o, "rpo_alpha");
    if (at_opt_str(o, "cpo_alpha")) c->cpo_alpha = at_opt_float(o, "cpo_alpha");
    if (at_opt_str(o, "simpo_gamma")) c->simpo_gamma = at_opt_float(o, "simpo_gamma");
    c->ref_model = at_opt_str(o, "ref_model");
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
    static rlhf_ctx cfg; /* what the run borrows (a static: the context is big) */
    memset(&cfg, 0, sizeof cfg);
    at_pref_config_init(&cfg.pref, "dpo");
    at_train_cli c = {0};
    c.command = "rlhf";
    c.usage = "usage: anytune rlhf --rlhf_type dpo|simpo|cpo|orpo|kto|rm|grpo --model DIR --dataset FILE [OPTIONS]   "
              "alignment\n"
              "  (records: chosen/rejected pairs, or for kto conversations with a \"label\"; a micro-batch of N "
              "pairs or examples runs 2N rows; grpo: prompts, with a \"solution\" for the accuracy reward, N "
              "prompts run N x num_generations rows; with neither --model nor --dataset, grpo runs its demo)";
    c.extra = at_rlhf_options;
    c.n_extra = at_rlhf_n_options;
    c.resolve = resolve;
    c.ctx = &cfg;
    c.plan_command = "dpo";
    c.preference = 1;
    return at_cli_train(argc, argv, &c);
}
