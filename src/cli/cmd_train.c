/* anytune sft / anytune pt, and the body `anytune rlhf` shares (cmd_train.h):
 * option names as ms-swift's. With neither --model nor --dataset,
 * `anytune sft` runs the bundled demo: the stories260K model learns who it is
 * from identity.json, and answers before and after. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "base/options.h"
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "device/comm.h"
#include "data/encode.h"
#include "model/adapter.h"
#include "plan/planner.h"
#include "train/preference.h"
#include "train/schedule.h"
#include "train/trainer.h"

static const at_opt_spec specs[] = {
    {"model", AT_OPT_STRING, NULL, "model folder (Hugging Face), GGUF or llama2.c file", NULL},
    {"dataset", AT_OPT_LIST, NULL, "training data: FILE or FILE#N, several allowed", NULL},
    {"val_dataset", AT_OPT_LIST, NULL, "validation data", NULL},
    {"split_dataset_ratio", AT_OPT_FLOAT, "0", "share of --dataset held out for validation", NULL},
    {"template", AT_OPT_STRING, NULL, "chat template: the model's (default), none, chatml, llama-2, llama-3, mistral, "
     "or a .jinja file", NULL},
    {"tokenizer", AT_OPT_STRING, NULL, "tokenizer folder or file (default: the model's)", NULL},
    {"train_type", AT_OPT_STRING, "lora", "lora, qlora (lora with --quant_bits 4) or full", "tuner_type"},
    {"quant_bits", AT_OPT_INT, "0", "quantize the frozen linear weights: 4 (NF4, QLoRA), 8 (q8_0), 0 (off)", NULL},
    {"dry_run", AT_OPT_BOOL, "false", "print the plan (device, formats, micro-batch, memory by part) and stop", NULL},
    {"json", AT_OPT_BOOL, "false", "with --dry_run: the plan as JSON", NULL},
    {"max_memory", AT_OPT_STRING, NULL, "memory budget, e.g. 8GB or 7.5GiB (default: 90% of the free memory)", NULL},
    {"simulate_device", AT_OPT_STRING, NULL,
     "with --dry_run: plan for a device profile (v100, t4, a100, h100, rtx4090, m2-16gb, ascend-910b, laptop-8gb)",
     NULL},
    {"lora_rank", AT_OPT_INT, "8", "LoRA rank", NULL},
    {"lora_alpha", AT_OPT_FLOAT, "32", "LoRA alpha (scale alpha/rank)", NULL},
    {"lora_dropout", AT_OPT_FLOAT, "0.05", "dropout on the LoRA input", NULL},
    {"neftune_noise_alpha", AT_OPT_FLOAT, "0", "NEFTune: uniform noise alpha/sqrt(length*hidden) on the "
     "embeddings in training (e.g. 5; 0: off)", NULL},
    {"target_modules", AT_OPT_LIST, "all-linear", "all-linear or names such as q_proj,v_proj", NULL},
    {"use_rslora", AT_OPT_BOOL, "false", "scale alpha/sqrt(rank)", NULL},
    {"adapters", AT_OPT_STRING, NULL, "start from this PEFT adapter folder", NULL},
    {"max_length", AT_OPT_INT, "2048", "longest sample in tokens", NULL},
    {"truncation_strategy", AT_OPT_STRING, "delete", "delete, left or right for longer samples", NULL},
    {"packing", AT_OPT_BOOL, "false", "pack samples into rows of max_length tokens", NULL},
    {"group_by_length", AT_OPT_BOOL, "false", "batch samples of similar length together", NULL},
    {"gradient_checkpointing", AT_OPT_BOOL, "true", "recompute activations in the backward", NULL},
    {"per_device_train_batch_size", AT_OPT_INT, "1", "rows per micro-batch", "batch_size"},
    {"gradient_accumulation_steps", AT_OPT_INT, "1", "micro-batches per optimizer step", NULL},
    {"learning_rate", AT_OPT_FLOAT, NULL, "peak learning rate (default 1e-4 for LoRA, 1e-5 for full)", NULL},
    {"num_train_epochs", AT_OPT_FLOAT, "3", "epochs", NULL},
    {"max_steps", AT_OPT_INT, "-1", "optimizer steps (overrides epochs when > 0)", NULL},
    {"lr_scheduler_type", AT_OPT_STRING, "cosine", "cosine, linear, constant, constant_with_warmup", NULL},
    {"warmup_ratio", AT_OPT_FLOAT, "0", "share of the steps spent warming up", NULL},
    {"warmup_steps", AT_OPT_INT, "0", "warmup steps (wins over the ratio)", NULL},
    {"weight_decay", AT_OPT_FLOAT, "0.1", "AdamW decoupled weight decay", NULL},
    {"adam_beta1", AT_OPT_FLOAT, "0.9", "AdamW beta1", NULL},
    {"adam_beta2", AT_OPT_FLOAT, "0.95", "AdamW beta2", NULL},
    {"adam_epsilon", AT_OPT_FLOAT, "1e-8", "AdamW epsilon", NULL},
    {"max_grad_norm", AT_OPT_FLOAT, "1.0", "clip the global gradient norm (0: off)", NULL},
    {"logging_steps", AT_OPT_INT, "5", "log every N steps", NULL},
    {"save_steps", AT_OPT_INT, "500", "checkpoint every N steps (and at the end)", NULL},
    {"eval_steps", AT_OPT_INT, "500", "evaluate every N steps (and at the end)", NULL},
    {"save_total_limit", AT_OPT_INT, "0", "keep only the N newest checkpoints (0: all)", NULL},
    {"output_dir", AT_OPT_STRING, "output", "where runs go (a vN-YYYYMMDD-HHMMSS folder per run)", NULL},
    {"resume_from_checkpoint", AT_OPT_STRING, NULL, "a checkpoint folder, or 'last'", NULL},
    {"torch_dtype", AT_OPT_STRING, NULL, "format of the frozen weights: bfloat16, float16, float32", NULL},
    {"seed", AT_OPT_INT, "42", "seed of everything random", NULL},
    {"device", AT_OPT_STRING, NULL, "auto, cpu, cuda, cuda:N", NULL},
    {"tf32", AT_OPT_BOOL, "false", "on GPUs, let f32 matmuls use TF32 tensor cores (faster, ~1e-3 relative error)",
     NULL},
    {"strict", AT_OPT_BOOL, "false", "stop at the first bad dataset record", NULL},
    {"model_name", AT_OPT_STRING, NULL, "fills {{name}} in the data (self-cognition data)", NULL},
    {"model_author", AT_OPT_STRING, NULL, "fills {{author}} in the data", NULL},
    {"loss_scale", AT_OPT_STRING, "default", "default (every assistant turn) or last_round", NULL},
    {"preview", AT_OPT_LIST, NULL, "questions answered before and after training", NULL},
    {"preview_max_tokens", AT_OPT_INT, "48", "answer length of --preview", NULL},
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))


/* The resource planner (plan/planner.h): formats, micro-batch, accumulation,
 * checkpointing and (with --train_type auto) QLoRA, from the device and the
 * options; the user's explicit choices are kept. Writes the decisions into
 * *a; with --dry_run prints the plan and stops. Returns -1 to go on training,
 * else the exit status. *plan_out: the plan as JSON, for args.json. */
static int plan_run(at_options *o, at_train_args *a, const char *tt, const at_train_cli *c, cJSON **plan_out)
{
    int dry = at_opt_bool(o, "dry_run");
    const char *sim = at_opt_str(o, "simulate_device");
    if (sim && !dry) {
        fprintf(stderr, "anytune: error: --simulate_device %s plans for a device that is not here: add --dry_run\n", sim);
        return 2;
    }
    at_plan_request rq;
    at_plan_request_defaults(&rq);
    at_model_config cfg;
    if (at_plan_model_config(a->model, &cfg, &rq.has_model_dtype, &rq.model_dtype) != AT_OK) return at_cli_fail();
    rq.cfg = &cfg;
    rq.model = a->model;
    rq.command = c->plan_command ? c->plan_command : c->command;
    rq.preference = c->preference;
    /* DPO's reference pass (plan/memory.h): none for the reference-free
     * objectives; --ref_model's config, not its weights, for its size and
     * the format it is stored in (what a full fine-tuning loads it as) */
    at_model_config ref_cfg;
    if (a->pref && !at_pref_needs_reference(a->pref)) rq.reference_free = 1;
    if (a->pref && a->pref->ref_model) {
        int has_stored = 0;
        at_dtype stored = AT_F32;
        if (at_plan_model_config(a->pref->ref_model, &ref_cfg, &has_stored, &stored) != AT_OK) {
            fprintf(stderr, "anytune: error: --ref_model: %s\n", at_last_error());
            return 2;
        }
        ref_cfg.has_dtype = has_stored;
        if (has_stored) ref_cfg.dtype = stored;
        rq.ref_cfg = &ref_cfg;
    }
    rq.train_type = tt;
    rq.train_type_set = at_opt_source_of(o, "train_type") != AT_SRC_DEFAULT;
    rq.quant_bits = a->quant_bits;
    rq.lora_rank = a->lora_rank;
    rq.target_mask = a->target_mask;
    rq.max_length = a->max_length;
    rq.batch_size = a->batch_size;
    rq.batch_size_set = at_opt_source_of(o, "per_device_train_batch_size") != AT_SRC_DEFAULT;
    rq.grad_accum = a->grad_accum;
    rq.grad_accum_set = at_opt_source_of(o, "gradient_accumulation_steps") != AT_SRC_DEFAULT;
    rq.checkpointing = a->gradient_checkpointing;
    rq.checkpointing_set = at_opt_source_of(o, "gradient_checkpointing") != AT_SRC_DEFAULT;
    rq.has_dtype = a->has_dtype;
    rq.dtype = a->dtype;
    const char *mm = at_opt_str(o, "max_memory");
    if (mm && at_parse_memory_size(mm, &rq.max_memory) != AT_OK) {
        fprintf(stderr, "anytune: error: --max_memory: %s\n", at_last_error());
        return 2;
    }
    at_device_profile dev;
    if (at_device_profile_get(sim, a->device, &dev) != AT_OK) return at_cli_fail();
    at_plan p;
    at_status st = at_plan_train(&rq, &dev, &p);
    if (st != AT_OK && p.mem.total == 0) return at_cli_fail(); /* a bad request: no plan */
    if (dry) {
        return at_cli_print_plan(&p, at_opt_bool(o, "json"));
    }
    if (!p.fits) return at_cli_fail();
    a->batch_size = p.batch_size;
    a->grad_accum = p.grad_accum;
    a->gradient_checkpointing = p.checkpointing;
    a->loss_scaling = p.loss_scaling;
    if (p.tune == AT_TUNE_QLORA) a->quant_bits = p.quant_dtype == AT_Q8_0 ? 8 : 4;
    if (p.tune != AT_TUNE_FULL && !a->has_dtype) {
        a->has_dtype = 1;
        a->dtype = p.weight_dtype;
    }
    char est[32], bud[32];
    snprintf(est, sizeof est, "%.0f MiB", (double)p.mem.total / 1048576.0);
    snprintf(bud, sizeof bud, "%.1f GiB", (double)p.budget / 1073741824.0);
    fprintf(stderr, "anytune: plan: %s, %s weights, micro-batch %d x %d accumulation, checkpointing %s; estimated peak "
                    "%s of a %s budget (--dry_run shows why)\n",
            at_tune_kind_name(p.tune), p.quantized ? "nf4/q8_0" : at_dtype_name(p.weight_dtype), p.batch_size,
            p.grad_accum, p.checkpointing ? "on" : "off", est, bud);
    *plan_out = at_plan_to_json(&p);
    return -1;
}

/* Started by web-ui's Train tab (serve/webui_train.c sets
 * ANYTUNE_WEBUI_SERVER_PID): when the server dies, stop as its Stop button
 * stops the job (SIGTERM: the step under way finishes and is checkpointed),
 * and keep writing into the pipe nobody reads any more without dying of
 * SIGPIPE before that checkpoint.
 * The death signal is SIGHUP turned into one SIGTERM, not SIGTERM itself:
 * the kernel sends it again each time the orphan is handed to another of
 * the dying server's threads, and a second SIGTERM ends the trainer at once. */
static volatile sig_atomic_t g_server_gone;

static void on_server_death(int sig)
{
    (void)sig;
    if (g_server_gone) return;
    g_server_gone = 1;
    raise(SIGTERM);
}

static void follow_webui_server(void)
{
    const char *s = getenv("ANYTUNE_WEBUI_SERVER_PID");
    if (!s) return;
    pid_t server = (pid_t)strtol(s, NULL, 10);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, on_server_death);
    prctl(PR_SET_PDEATHSIG, SIGHUP);
    if (getppid() == server) return;
    if (server > 0 && (kill(server, 0) == 0 || errno == EPERM)) {
        /* alive but not our parent: the variable was inherited, it is not about us */
        prctl(PR_SET_PDEATHSIG, 0);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        return;
    }
    raise(SIGHUP); /* it died before the prctl */
}

int at_cli_train(int argc, char **argv, const at_train_cli *c)
{
    int pt = c->pt;
    at_options *o = NULL;
    /* the common table, then the command's own options */
    at_opt_spec *all = malloc((size_t)(NSPECS + c->n_extra) * sizeof *all);
    if (!all) {
        fprintf(stderr, "anytune: error: out of memory\n");
        return 1;
    }
    memcpy(all, specs, sizeof specs);
    if (c->n_extra) memcpy(all + NSPECS, c->extra, (size_t)c->n_extra * sizeof *all);
    /* the options keep pointing into the table: it lives until done */
    int parse_rc = at_cli_parse(all, NSPECS + c->n_extra, argc, argv, c->command, c->usage, &o);
    if (parse_rc >= 0) {
        free(all);
        return parse_rc;
    }
    /* read by the CUDA backend when it opens the device, which comes later */
    if (at_opt_bool(o, "tf32")) setenv("ANYTUNE_ALLOW_TF32", "1", 1);
    int rc = at_cli_resume_options(o, c->command);
    if (rc >= 0) {
        at_options_free(o);
        free(all);
        return rc;
    }
    rc = 1;
    at_train_args a;
    at_train_args_defaults(&a);
    const char **ds = NULL, **vds = NULL, **prev = NULL, **tm = NULL;
    char *args_json = NULL;
    cJSON *plan_json = NULL;
    char mbuf[PATH_MAX], dbuf[PATH_MAX];
    const char *demo_ds[1];
    static const char *demo_prompts[] = {"Who are you?", "What is your name?"};
    int demo = c->demo && !at_opt_str(o, "model") && at_opt_list_count(o, "dataset") == 0;

    a.pt = pt;
    a.model = at_opt_str(o, "model");
    a.template_name = at_opt_str(o, "template");
    a.tokenizer = at_opt_str(o, "tokenizer");
    int nds = at_opt_list_count(o, "dataset"), nv = at_opt_list_count(o, "val_dataset");
    ds = calloc((size_t)nds + 1, sizeof *ds);
    vds = calloc((size_t)nv + 1, sizeof *vds);
    int np = at_opt_list_count(o, "preview"), nt = at_opt_list_count(o, "target_modules");
    prev = calloc((size_t)np + 1, sizeof *prev);
    tm = calloc((size_t)nt + 1, sizeof *tm);
    if (!ds || !vds || !prev || !tm) {
        fprintf(stderr, "anytune: error: out of memory\n");
        goto done;
    }
    for (int i = 0; i < nds; i++) ds[i] = at_opt_list_get(o, "dataset", i);
    for (int i = 0; i < nv; i++) vds[i] = at_opt_list_get(o, "val_dataset", i);
    for (int i = 0; i < np; i++) prev[i] = at_opt_list_get(o, "preview", i);
    for (int i = 0; i < nt; i++) tm[i] = at_opt_list_get(o, "target_modules", i);
    a.datasets = ds;
    a.n_datasets = nds;
    a.val_datasets = vds;
    a.n_val_datasets = nv;
    a.preview_prompts = prev;
    a.n_preview_prompts = np;
    a.preview_max_tokens = (int)at_opt_int(o, "preview_max_tokens");
    a.split_dataset_ratio = at_opt_float(o, "split_dataset_ratio");
    a.model_name = at_opt_str(o, "model_name");
    a.model_author = at_opt_str(o, "model_author");
    if (demo) {
        a.model = at_cli_demo_path("demo/stories260K", mbuf, sizeof mbuf);
        if (!a.model) a.model = "demo/stories260K"; /* the load error names it */
        demo_ds[0] = at_cli_demo_path("demo/identity.json", dbuf, sizeof dbuf);
        if (!demo_ds[0]) demo_ds[0] = "demo/identity.json";
        a.datasets = demo_ds;
        a.n_datasets = 1;
        /* as options, so that args.json holds them and a resumed demo finds them */
        if (!a.model_name) at_opt_set(o, "model_name", "anytune");
        if (!a.model_author) at_opt_set(o, "model_author", "the anytune team");
        a.model_name = at_opt_str(o, "model_name");
        a.model_author = at_opt_str(o, "model_author");
        if (!np) {
            at_opt_set(o, "preview", "Who are you?,What is your name?");
            a.preview_prompts = demo_prompts;
            a.n_preview_prompts = 2;
        }
        /* A 260K-parameter model and 16 samples: a higher rate and more epochs
         * than a real model needs, unless the user said otherwise. */
        if (at_opt_source_of(o, "learning_rate") == AT_SRC_DEFAULT) at_opt_set(o, "learning_rate", "3e-3");
        if (at_opt_source_of(o, "num_train_epochs") == AT_SRC_DEFAULT) at_opt_set(o, "num_train_epochs", "20");
        if (at_opt_source_of(o, "per_device_train_batch_size") == AT_SRC_DEFAULT)
            at_opt_set(o, "per_device_train_batch_size", "4");
        if (at_opt_source_of(o, "lora_rank") == AT_SRC_DEFAULT) at_opt_set(o, "lora_rank", "16");
        if (at_opt_source_of(o, "logging_steps") == AT_SRC_DEFAULT) at_opt_set(o, "logging_steps", "10");
        fprintf(stderr, "anytune sft: no --model or --dataset given: the demo (%s learns its identity from %s)\n",
                a.model, demo_ds[0]);
    }
    const char *tt = at_opt_str(o, "train_type");
    a.quant_bits = (int)at_opt_int(o, "quant_bits");
    if (!strcmp(tt, "full")) {
        a.full = 1;
    } else if (!strcmp(tt, "qlora")) { /* shorthand: LoRA over NF4 weights unless --quant_bits says 8 */
        if (at_opt_source_of(o, "quant_bits") == AT_SRC_DEFAULT || a.quant_bits == 0) a.quant_bits = 4;
    } else if (!strcmp(tt, "auto")) { /* the planner: lora, or qlora when lora cannot fit */
    } else if (strcmp(tt, "lora") != 0) {
        fprintf(stderr, "anytune: error: --train_type %s: use lora, qlora, full or auto\n", tt);
        rc = 2;
        goto done;
    }
    if (a.quant_bits != 0 && a.quant_bits != 4 && a.quant_bits != 8) {
        fprintf(stderr, "anytune: error: --quant_bits %d: use 4 (NF4), 8 (q8_0) or 0\n", a.quant_bits);
        rc = 2;
        goto done;
    }
    if (a.full && a.quant_bits) {
        fprintf(stderr, "anytune: error: --train_type full with --quant_bits %d: quantized weights are frozen; "
                        "use --train_type lora (QLoRA) or drop --quant_bits\n", a.quant_bits);
        rc = 2;
        goto done;
    }
    a.lora_rank = (int)at_opt_int(o, "lora_rank");
    a.lora_alpha = at_opt_float(o, "lora_alpha");
    a.lora_dropout = at_opt_float(o, "lora_dropout");
    a.neftune_noise_alpha = at_opt_float(o, "neftune_noise_alpha");
    a.use_rslora = at_opt_bool(o, "use_rslora");
    a.adapters = at_opt_str(o, "adapters");
    a.max_length = (int)at_opt_int(o, "max_length");
    a.packing = at_opt_bool(o, "packing");
    a.group_by_length = at_opt_bool(o, "group_by_length");
    a.gradient_checkpointing = at_opt_bool(o, "gradient_checkpointing");
    a.batch_size = (int)at_opt_int(o, "per_device_train_batch_size");
    a.grad_accum = (int)at_opt_int(o, "gradient_accumulation_steps");
    a.learning_rate = at_opt_str(o, "learning_rate") ? at_opt_float(o, "learning_rate") : (a.full ? 1e-5 : 1e-4);
    a.num_train_epochs = at_opt_float(o, "num_train_epochs");
    a.max_steps = at_opt_int(o, "max_steps");
    a.warmup_ratio = at_opt_float(o, "warmup_ratio");
    a.warmup_steps = at_opt_int(o, "warmup_steps");
    a.weight_decay = at_opt_float(o, "weight_decay");
    a.adam_beta1 = at_opt_float(o, "adam_beta1");
    a.adam_beta2 = at_opt_float(o, "adam_beta2");
    a.adam_epsilon = at_opt_float(o, "adam_epsilon");
    a.max_grad_norm = at_opt_float(o, "max_grad_norm");
    a.logging_steps = (int)at_opt_int(o, "logging_steps");
    a.save_steps = (int)at_opt_int(o, "save_steps");
    a.eval_steps = (int)at_opt_int(o, "eval_steps");
    a.save_total_limit = (int)at_opt_int(o, "save_total_limit");
    a.output_dir = at_opt_str(o, "output_dir");
    a.resume_from_checkpoint = at_opt_str(o, "resume_from_checkpoint");
    a.seed = (uint64_t)at_opt_int(o, "seed");
    a.device = at_opt_str(o, "device");
    a.strict = at_opt_bool(o, "strict");
    const char *ls = at_opt_str(o, "loss_scale");
    a.loss_last_turn_only = !strcmp(ls, "last_round");
    if (!a.loss_last_turn_only && strcmp(ls, "default") != 0) {
        fprintf(stderr, "anytune: error: --loss_scale %s: use default or last_round\n", ls);
        rc = 2;
        goto done;
    }
    if (at_opt_str(o, "torch_dtype")) {
        if (at_dtype_parse(at_opt_str(o, "torch_dtype"), &a.dtype) != 0 || a.dtype == AT_I32 || a.dtype >= AT_Q8_0) {
            fprintf(stderr, "anytune: error: --torch_dtype %s: use bfloat16, float16 or float32\n",
                    at_opt_str(o, "torch_dtype"));
            rc = 2;
            goto done;
        }
        a.has_dtype = 1;
    }
    if (at_truncation_parse(at_opt_str(o, "truncation_strategy"), &a.truncation) != AT_OK ||
        at_schedule_parse(at_opt_str(o, "lr_scheduler_type"), &a.scheduler) != AT_OK ||
        at_parse_target_modules(tm, nt, &a.target_mask) != AT_OK) {
        fprintf(stderr, "anytune: error: %s\n", at_last_error());
        rc = 2;
        goto done;
    }
    if (c->resolve) {
        int crc = c->resolve(o, &a, c->ctx);
        if (crc >= 0) {
            rc = crc;
            goto done;
        }
    }
    int prc = plan_run(o, &a, tt, c, &plan_json);
    if (prc >= 0) {
        rc = prc;
        goto done;
    }
    cJSON *j = at_options_to_json(o);
    if (j && plan_json) {
        /* the planner's decisions are the resolved options */
        cJSON *tto = cJSON_GetObjectItem(plan_json, "train_type");
        cJSON_ReplaceItemInObject(j, "train_type", cJSON_CreateString(tto ? tto->valuestring : tt));
        cJSON_ReplaceItemInObject(j, "per_device_train_batch_size", cJSON_CreateNumber(a.batch_size));
        cJSON_ReplaceItemInObject(j, "gradient_accumulation_steps", cJSON_CreateNumber(a.grad_accum));
        cJSON_ReplaceItemInObject(j, "gradient_checkpointing", cJSON_CreateBool(a.gradient_checkpointing));
        if (a.has_dtype) /* in ms-swift's (torch's) spelling */
            cJSON_ReplaceItemInObject(j, "torch_dtype", cJSON_CreateString(a.dtype == AT_BF16 ? "bfloat16"
                                                                           : a.dtype == AT_F16 ? "float16" : "float32"));
        cJSON_AddItemToObject(j, "plan", plan_json);
        plan_json = NULL;
    }
    if (j) {
        /* what the defaults resolved to */
        cJSON_ReplaceItemInObject(j, "model", cJSON_CreateString(a.model ? a.model : ""));
        cJSON_ReplaceItemInObject(j, "learning_rate", cJSON_CreateNumber(a.learning_rate));
        cJSON_ReplaceItemInObject(j, "quant_bits", cJSON_CreateNumber(a.quant_bits));
        cJSON *dl = cJSON_CreateArray();
        for (int i = 0; i < a.n_datasets; i++) cJSON_AddItemToArray(dl, cJSON_CreateString(a.datasets[i]));
        cJSON_ReplaceItemInObject(j, "dataset", dl);
        cJSON_AddStringToObject(j, "command", c->command);
        args_json = cJSON_Print(j);
        cJSON_Delete(j);
    }
    a.args_json = args_json;
    at_train_result res;
    at_comm *comm = NULL;
    follow_webui_server();
    if (at_train_run(&a, stdout, &res) != AT_OK) {
        at_cli_fail();
        /* under mpirun the other ranks may be waiting in a collective: end them too */
        if (at_comm_world(&comm) == AT_OK) at_comm_abort(comm, 1);
        goto done;
    }
    int rank0 = at_comm_world(&comm) == AT_OK && at_comm_rank(comm) == 0;
    if (rank0 && !res.run_dir[0]) /* the run folder went with the run (trainer.h) */
        fprintf(stderr, "anytune: stopped before a step trained: nothing saved\n");
    else if (rank0)
        fprintf(stderr, "anytune: %lld steps in %.1f s, loss %.4f -> %.4f; saved in %s\n", (long long)res.steps_done,
                res.train_seconds, res.first_loss, res.last_loss, res.run_dir);
    at_comm_finalize();
    rc = res.stopped_by ? 128 + res.stopped_by : 0; /* as a shell reports a process ended by the signal */
done:
    cJSON_Delete(plan_json);
    free(args_json);
    free(ds);
    free(vds);
    free(prev);
    free(tm);
    at_options_free(o);
    free(all);
    return rc;
}

int at_cmd_sft(int argc, char **argv)
{
    at_train_cli c = {0};
    c.command = "sft";
    c.usage = "usage: anytune sft [--model DIR --dataset FILE] [OPTIONS]   supervised fine-tuning\n"
              "  (with neither --model nor --dataset: the bundled demo)";
    c.demo = 1;
    return at_cli_train(argc, argv, &c);
}

int at_cmd_pt(int argc, char **argv)
{
    at_train_cli c = {0};
    c.command = "pt";
    c.usage = "usage: anytune pt --model DIR --dataset FILE [OPTIONS]   continued pre-training on text";
    c.pt = 1;
    return at_cli_train(argc, argv, &c);
}
