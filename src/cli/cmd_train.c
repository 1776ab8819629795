/* anytune sft / anytune pt, and the body `anytune rlhf` shares (cmd_train.h):
 * option names as ms-swift's. With neither --model nor --dataset,
 * `anytune sft` runs the bundled demo: the stories260K model learns who it is
 * from identity.json, and answers before and after. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/options.h"
#include "cli/cli.h"
#include "cli/cmd_train.h"
#include "device/comm.h"
#include "data/encode.h"
#include "data/image_proc.h"
#include "model/adapter.h"
#include "model/vision_config.h"
#include "plan/planner.h"
#include "train/grpo.h"
#include "train/preference.h"
#include "train/schedule.h"
#include "train/train_options.h"
#include "train/trainer.h"
#include "train/vision_demo.h"

/* the common table: train/train_options.c */
#define NSPECS at_train_n_options


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
    if (at_plan_model_config(a->model, a->model_type, &cfg, &rq.has_model_dtype, &rq.model_dtype) != AT_OK) return at_cli_fail();
    rq.cfg = &cfg;
    rq.model = a->model;
    rq.command = c->plan_command ? c->plan_command : c->command;
    rq.preference = c->preference;
    rq.objective = a->pref ? a->pref->name : c->command; /* its memory: plan/memory.h's objective table */
    /* DPO's reference pass (plan/memory.h): none for the reference-free
     * objectives; --ref_model's config, not its weights, for its size and
     * the format it is stored in (what a full fine-tuning loads it as) */
    at_model_config ref_cfg;
    if (a->pref && !at_pref_needs_reference(a->pref)) rq.reference_free = 1;
    if (a->pref && a->pref->grpo) {
        rq.num_generations = a->pref->grpo->num_generations;
        rq.max_completion_length = a->pref->grpo->max_completion_length;
        rq.beta = a->pref->beta;
        rq.num_iterations = a->pref->grpo->num_iterations;
    }
    if (a->pref && a->pref->ref_model) {
        int has_stored = 0;
        at_dtype stored = AT_F32;
        if (at_plan_model_config(a->pref->ref_model, a->model_type, &ref_cfg, &has_stored, &stored) != AT_OK) {
            fprintf(stderr, "anytune: error: --ref_model: %s\n", at_last_error());
            return 2;
        }
        ref_cfg.has_dtype = has_stored;
        if (has_stored) ref_cfg.dtype = stored;
        rq.ref_cfg = &ref_cfg;
    }
    /* a vision-language folder: its tower, one image at the processor's largest area a row */
    at_vision_config vc;
    if (at_is_dir(a->model)) {
        char *cp = at_path_join(a->model, "config.json");
        cJSON *root = NULL;
        at_vision_kind kind = AT_VISION_NONE;
        at_image_processor ip;
        if (at_json_parse_file(cp, &root) == AT_OK && at_vision_kind_of(root, cp, &kind) == AT_OK &&
            kind != AT_VISION_NONE && at_vision_config_from_json(root, cp, &vc) == AT_OK &&
            at_image_processor_load(a->model, &ip, NULL) == AT_OK) {
            uint64_t px = a->max_pixels > 0 ? (uint64_t)a->max_pixels : ip.max_pixels;
            rq.vision = &vc;
            rq.image_patches = (int64_t)(px / ((uint64_t)ip.patch_size * (uint64_t)ip.patch_size));
            rq.train_vit = !a->freeze_vit;
            rq.train_aligner = !a->freeze_aligner;
        }
        at_clear_error(); /* the trainer's load names what is wrong with the folder */
        cJSON_Delete(root);
        free(cp);
    }
    rq.train_type = tt;
    rq.train_type_set = at_opt_source_of(o, "train_type") != AT_SRC_DEFAULT;
    rq.quant_bits = a->quant_bits;
    rq.lora_rank = a->lora_rank;
    rq.target_mask = a->target_mask;
    if (a->max_length <= 0) a->max_length = at_train_default_max_length(&cfg); /* unset: the model's context */
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
static atomic_flag g_server_gone = ATOMIC_FLAG_INIT;

/* The SIGHUPs may run this in two threads at once (the trainer's workers
 * take signals too): a test-and-set, not a read then a write, lets one
 * through. */
static void on_server_death(int sig)
{
    (void)sig;
    if (atomic_flag_test_and_set(&g_server_gone)) return;
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

/* The end of a run: the steps this process ran (and where a resumed run
 * started), the logged losses (interval means, as logging.jsonl and the
 * plot show them), the best checkpoint when there was evaluation. */
static void print_summary(const at_train_args *a, const at_train_result *r)
{
    char resumed[64] = "";
    if (r->start_step > 0)
        snprintf(resumed, sizeof resumed, " (resumed at %lld, %lld in all)", (long long)r->start_step,
                 (long long)r->steps_done);
    char loss[96] = "";
    if (!isnan(r->first_logged_loss))
        snprintf(loss, sizeof loss, ", logged loss %.4f -> %.4f", r->first_logged_loss, r->last_logged_loss);
    fprintf(stderr, "anytune: %lld steps%s in %.1f s%s; saved in %s\n", (long long)(r->steps_done - r->start_step),
            resumed, r->train_seconds, loss, r->run_dir);
    if (r->best_checkpoint[0])
        fprintf(stderr, "anytune: best checkpoint: %s (eval_loss %.4f)%s\n", r->best_checkpoint, r->best_eval_loss,
                !a->load_best_model_at_end ? ""
                : r->loaded_best           ? "; the final model (--load_best_model_at_end: its weights were loaded "
                                             "at the end; --adapters RUN_FOLDER takes it)"
                                           : "; the final model (--load_best_model_at_end: the last step's)");
}

/* --torch_dtype, or ms-swift's --bf16 / --fp16 true (transformers'
 * spelling), into a->dtype. Returns 0, or 2 after printing the error. */
static int resolve_dtype(const at_options *o, at_train_args *a)
{
    const char *td = at_opt_str(o, "torch_dtype");
    const char *flag = at_opt_bool(o, "bf16") ? "bfloat16" : at_opt_bool(o, "fp16") ? "float16" : NULL;
    if (at_opt_bool(o, "bf16") && at_opt_bool(o, "fp16")) {
        fprintf(stderr, "anytune: error: --bf16 and --fp16 both true: give one (or --torch_dtype)\n");
        return 2;
    }
    if (flag && td && strcmp(td, "auto") != 0 && strcmp(td, flag) != 0) {
        fprintf(stderr, "anytune: error: --%s true and --torch_dtype %s disagree: give one\n",
                at_opt_bool(o, "bf16") ? "bf16" : "fp16", td);
        return 2;
    }
    if (flag) td = flag;
    if (!td || !strcmp(td, "auto")) return 0;
    if (at_dtype_parse(td, &a->dtype) != 0) { /* the table's choices make this unreachable */
        fprintf(stderr, "anytune: error: --torch_dtype %s: use bfloat16, float16 or float32\n", td);
        return 2;
    }
    a->has_dtype = 1;
    return 0;
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
    memcpy(all, at_train_options, (size_t)NSPECS * sizeof *all);
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
    /* --demo vision: its own model, pictures and datasets (train/vision_demo.h) */
    const char *demo_kind = at_opt_str(o, "demo");
    at_vision_demo vd = {0};
    char vd_dir[PATH_MAX];
    if (demo_kind && (strcmp(demo_kind, "vision") || !demo)) {
        fprintf(stderr, "anytune: error: --demo %s: the demos are `anytune sft` (text, with no option) and "
                        "`anytune sft --demo vision`, without --model and --dataset\n", demo_kind);
        rc = 2;
        goto done;
    }
    int vdemo = demo_kind != NULL;
    if (vdemo) {
        demo = 0;
        /* 64 pictures, a 0.2M-parameter random model: every weight trains (LoRA cannot sharpen logits
         * whose tied embeddings and norms stay at their tiny random start), the merger with them */
        static const char *const def[][2] = {{"train_type", "full"}, {"learning_rate", "3e-3"},
                                             {"num_train_epochs", "10"}, {"per_device_train_batch_size", "4"},
                                             {"logging_steps", "20"}, {"freeze_aligner", "false"},
                                             {"max_length", "256"}};
        for (size_t i = 0; i < sizeof def / sizeof def[0]; i++)
            if (at_opt_source_of(o, def[i][0]) == AT_SRC_DEFAULT) at_opt_set(o, def[i][0], def[i][1]);
    }

    if (demo) {
        /* A 260K-parameter model and 16 samples: a higher rate and more epochs
         * than a real model needs, unless the user said otherwise. */
        if (at_opt_source_of(o, "learning_rate") == AT_SRC_DEFAULT) at_opt_set(o, "learning_rate", "3e-3");
        if (at_opt_source_of(o, "num_train_epochs") == AT_SRC_DEFAULT) at_opt_set(o, "num_train_epochs", "20");
        if (at_opt_source_of(o, "per_device_train_batch_size") == AT_SRC_DEFAULT)
            at_opt_set(o, "per_device_train_batch_size", "4");
        if (at_opt_source_of(o, "lora_rank") == AT_SRC_DEFAULT) at_opt_set(o, "lora_rank", "16");
        if (at_opt_source_of(o, "logging_steps") == AT_SRC_DEFAULT) at_opt_set(o, "logging_steps", "10");
        /* the demo data's {{name}} and {{author}} (kept in args.json like any option) */
        if (!at_opt_list_count(o, "model_name")) at_opt_set(o, "model_name", "anytune");
        if (!at_opt_list_count(o, "model_author")) at_opt_set(o, "model_author", "the anytune team");
    }
    const char *tt = at_opt_str(o, "train_type");
    /* full fine-tuning's default rate is ms-swift's 1e-5 */
    if (!strcmp(tt, "full") && !vdemo && at_opt_source_of(o, "learning_rate") == AT_SRC_DEFAULT)
        at_opt_set(o, "learning_rate", "1e-5");
    /* every option the table stores in at_train_args (train/train_options.c) */
    at_options_store(o, &a);
    a.pt = pt;
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
    /* --model_name NAME [NAME_EN], --model_author AUTHOR [AUTHOR_EN] (ms-swift's two-value form) */
    static const char *const who[2] = {"model_name", "model_author"};
    const char **first[2] = {&a.model_name, &a.model_author}, **en[2] = {&a.model_name_en, &a.model_author_en};
    for (int w = 0; w < 2; w++) {
        int nw = at_opt_list_count(o, who[w]);
        if (nw > 2) {
            fprintf(stderr, "anytune: error: --%s takes one value, or two (Chinese, English), not %d\n", who[w], nw);
            rc = 2;
            goto done;
        }
        *first[w] = at_opt_list_get(o, who[w], 0);
        *en[w] = at_opt_list_get(o, who[w], 1);
    }
    if (demo) {
        a.model = at_cli_demo_path("demo/stories260K", mbuf, sizeof mbuf);
        if (!a.model) a.model = "demo/stories260K"; /* the load error names it */
        demo_ds[0] = at_cli_demo_path("demo/identity.json", dbuf, sizeof dbuf);
        if (!demo_ds[0]) demo_ds[0] = "demo/identity.json";
        a.datasets = demo_ds;
        a.n_datasets = 1;
        if (!np) {
            at_opt_set(o, "preview", "Who are you?,What is your name?");
            a.preview_prompts = demo_prompts;
            a.n_preview_prompts = 2;
        }
        fprintf(stderr, "anytune sft: no --model or --dataset given: the demo (%s learns its identity from %s)\n",
                a.model, demo_ds[0]);
    }
    if (vdemo) {
        a.model = at_cli_demo_path("demo/qwen2-vl-tiny", mbuf, sizeof mbuf);
        if (!a.model) a.model = "demo/qwen2-vl-tiny"; /* the load error names it */
        snprintf(vd_dir, sizeof vd_dir, "%s/vision-demo-data", a.output_dir);
        if (at_vision_demo_make(vd_dir, a.seed, 64, 32, &vd) != AT_OK) {
            at_cli_fail();
            goto done;
        }
        demo_ds[0] = vd.train;
        a.datasets = demo_ds;
        a.n_datasets = 1;
        fprintf(stderr, "anytune sft --demo vision: %s learns to name the colour of the pictures in %s\n", a.model,
                vd_dir);
    }
    a.quant_bits = (int)at_opt_int(o, "quant_bits");
    if (!strcmp(tt, "full")) {
        a.full = 1;
    } else if (!strcmp(tt, "qlora")) { /* shorthand: LoRA over NF4 weights unless --quant_bits says 8 */
        if (a.quant_bits == 0) a.quant_bits = 4;
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
    a.loss_last_turn_only = !strcmp(at_opt_str(o, "loss_scale"), "last_round");
    if (resolve_dtype(o, &a) != 0) {
        rc = 2;
        goto done;
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
        cJSON_ReplaceItemInObject(j, "max_length", cJSON_CreateNumber(a.max_length));
        cJSON *dl = cJSON_CreateArray();
        for (int i = 0; i < a.n_datasets; i++) cJSON_AddItemToArray(dl, cJSON_CreateString(a.datasets[i]));
        cJSON_ReplaceItemInObject(j, "dataset", dl);
        cJSON_AddStringToObject(j, "command", c->command);
        args_json = cJSON_Print(j);
        cJSON_Delete(j);
    }
    a.args_json = args_json;
    if (vdemo) {
        double acc = 0;
        if (at_vision_demo_accuracy(&vd, a.model, NULL, &acc) != AT_OK) {
            at_cli_fail();
            goto done;
        }
        printf("Before training: %.0f%% of %d test pictures named right (chance: 25%%)\n", 100 * acc, vd.n_test);
        fflush(stdout);
    }
    at_train_result res;
    at_comm *comm = NULL;
    follow_webui_server();
    if (at_train_run(&a, stdout, &res) != AT_OK) {
        at_cli_fail();
        /* under mpirun the other ranks may be waiting in a collective: end them too */
        if (at_comm_world(&comm) == AT_OK) at_comm_abort(comm, 1);
        goto done;
    }
    if (at_comm_world(&comm) == AT_OK && at_comm_rank(comm) == 0) {
        if (!res.run_dir[0]) /* the run folder went with the run (trainer.h) */
            fprintf(stderr, "anytune: stopped before a step trained: nothing saved\n");
        else
            print_summary(&a, &res);
        if (vdemo && res.run_dir[0] && !res.stopped_by) {
            char ck[1200];
            double acc = 0;
            snprintf(ck, sizeof ck, "%.1100s/checkpoint-%lld", res.run_dir, (long long)res.steps_done);
            if (at_vision_demo_accuracy(&vd, a.model, ck, &acc) != AT_OK) {
                at_cli_fail();
                goto done;
            }
            printf("After training:  %.0f%% of %d test pictures named right\n", 100 * acc, vd.n_test);
        }
    }
    at_comm_finalize();
    rc = res.stopped_by ? 128 + res.stopped_by : 0; /* as a shell reports a process ended by the signal */
done:
    at_vision_demo_free(&vd);
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
