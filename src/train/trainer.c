#include "train/trainer.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/rng.h"
#include "device/registry.h"
#include "infer/bundle.h"
#include "model/loader.h"
#include "ops/ops.h"
#include "train/preview.h"
#include "train/stop_signal.h"
#include "train/train_options.h"
#include "train/trainer_impl.h"

void at_train_args_defaults(at_train_args *a)
{
    memset(a, 0, sizeof *a);
    /* the option table's defaults (train/train_options.c): what `anytune sft` uses */
    at_options_store_defaults(at_train_options, at_train_n_options, a);
    /* what the command line parses from text (enums, lists): parsed here from the same rows' defaults, so
     * the two cannot differ (the fallbacks serve only if a row's default stopped parsing) */
    const at_opt_spec *tm = at_opt_find(at_train_options, at_train_n_options, "target_modules"),
                      *tr = at_opt_find(at_train_options, at_train_n_options, "truncation_strategy"),
                      *sc = at_opt_find(at_train_options, at_train_n_options, "lr_scheduler_type"),
                      *ls = at_opt_find(at_train_options, at_train_n_options, "loss_scale");
    const char *tm_def[1] = {tm ? tm->def : NULL};
    if (!tm_def[0] || at_parse_target_modules(tm_def, 1, &a->target_mask) != AT_OK)
        a->target_mask = (1u << AT_MOD_COUNT) - 1;
    if (!tr || at_truncation_parse(tr->def, &a->truncation) != AT_OK) a->truncation = AT_TRUNCATE_DELETE;
    if (!sc || at_schedule_parse(sc->def, &a->scheduler) != AT_OK) a->scheduler = AT_SCHED_COSINE;
    a->loss_last_turn_only = ls && ls->def && !strcmp(ls->def, "last_round");
    at_clear_error();
    a->max_nonfinite_steps = 5;
}

typedef at_trainer trainer;

static void trainer_free(trainer *t)
{
    at_decoder_acts_free(t->acts);
    if (t->opt_ready) at_optimizer_free(&t->opt);
    at_vision_free(t->vision);
    at_decoder_grads_free(t->grads);
    if (t->dec) at_decoder_set_adapter(t->dec, NULL);
    at_adapter_free(t->adapter);
    at_decoder_free(t->dec);
    if (t->pipe_ready) at_text_pipeline_free(&t->pipe);
    at_chat_template_free(t->tmpl);
    at_tokenizer_free(t->tok);
    at_objective_free(t->obj);
    at_dataset_free(t->ds);
    at_dataset_free(t->val_ds);
    if (t->plan.batch_start) at_batch_plan_free(&t->plan);
    if (t->log) fclose(t->log);
    at_tb_close(&t->tb);
    if (t->devnull) fclose(t->devnull);
    at_run_lock_release(&t->lock);
    free(t->run_dir);
    free(t->hist_step);
    free(t->hist_loss);
    free(t->hist_lr);
    free(t->eval_step);
    free(t->eval_loss);
}

/* ---- model, text, data ---- */

/* How the model is loaded (the policy, and a DPO --ref_model alike). */
static at_status model_load_options(const trainer *t, at_load_options *out)
{
    const at_train_args *a = t->a;
    at_load_options lo = at_load_options_default();
    lo.backend = t->be;
    lo.model_type = a->model_type;
    /* Trainable weights are f32 (DESIGN.md); frozen ones keep their format or --torch_dtype. */
    if (a->full) {
        lo.dtype = AT_F32;
        lo.writable = 1;
    }
    else if (a->has_dtype) lo.dtype = a->dtype;
    /* QLoRA: frozen linear matrices quantized; what stays dense (embeddings,
     * lm_head, rows that are not whole blocks) is bf16 unless --torch_dtype says */
    AT_TRY(at_quant_from_bits(a->quant_bits, &lo.quant));
    if (lo.quant != AT_QUANT_NONE && a->full)
        return at_error(AT_ERR_INVALID, "--quant_bits %d with --train_type full: quantized weights are frozen; "
                        "full fine-tuning needs f32 weights (train LoRA adapters over the quantized model)",
                        a->quant_bits);
    if (lo.quant != AT_QUANT_NONE && !a->has_dtype) lo.dtype = AT_BF16;
    *out = lo;
    return AT_OK;
}

/* A vision-language folder's tower (at the model's backend, f32), its image
 * processor (preprocessor_config.json, then --max_pixels / --min_pixels as
 * ms-swift's MAX_PIXELS / MIN_PIXELS) and its M-RoPE tokens; for a text
 * model nothing (an M-RoPE language model alone still gets its positions). */
static at_status load_vision(trainer *t)
{
    const at_train_args *a = t->a;
    t->has_mrope = at_model_config_mrope(&t->dec->cfg);
    t->mrope = (at_mrope_tokens){-1, -1, -1, 2};
    if (!at_is_dir(a->model)) return AT_OK;
    char *cfgp = at_path_join(a->model, "config.json");
    cJSON *root = NULL;
    at_vision_kind kind = AT_VISION_NONE;
    at_status st = at_json_parse_file(cfgp, &root);
    if (st == AT_OK) st = at_vision_kind_of(root, cfgp, &kind);
    cJSON_Delete(root);
    free(cfgp);
    if (st != AT_OK || kind == AT_VISION_NONE) return st;
    AT_TRY(at_vision_load(a->model, a->model, t->be, &t->vision));
    const at_vision_config *vc = at_vision_get_config(t->vision);
    t->mrope = (at_mrope_tokens){vc->image_token_id, vc->video_token_id, vc->vision_start_token_id,
                                 vc->spatial_merge_size};
    AT_TRY(at_image_processor_load(a->model, &t->improc, NULL));
    if (a->max_pixels > 0) t->improc.max_pixels = (uint64_t)a->max_pixels;
    if (a->min_pixels > 0) t->improc.min_pixels = (uint64_t)a->min_pixels;
    if (t->improc.min_pixels > t->improc.max_pixels)
        return at_error(AT_ERR_INVALID, "min_pixels %llu is above max_pixels %llu (--min_pixels / --max_pixels, or "
                        "%s/preprocessor_config.json)", (unsigned long long)t->improc.min_pixels,
                        (unsigned long long)t->improc.max_pixels, a->model);
    if (t->improc.patch_size != vc->patch_size || t->improc.merge_size != vc->spatial_merge_size ||
        t->improc.temporal_patch_size != vc->temporal_patch_size)
        return at_error(AT_ERR_INVALID, "%s: preprocessor_config.json's patches (%d, merge %d, temporal %d) are not "
                        "the tower's (%d, %d, %d)", a->model, t->improc.patch_size, t->improc.merge_size,
                        t->improc.temporal_patch_size, vc->patch_size, vc->spatial_merge_size, vc->temporal_patch_size);
    at_log_info("vision tower: %s, %d blocks of width %d; images up to %llu pixels", 
                at_vision_kind_name(vc->kind), vc->depth, vc->width,
                (unsigned long long)t->improc.max_pixels);
    return AT_OK;
}

static at_status load_model(trainer *t)
{
    const at_train_args *a = t->a;
    AT_TRY(at_device_select(a->device, &t->be));
    at_load_options lo;
    AT_TRY(model_load_options(t, &lo));
    AT_TRY(at_decoder_load(a->model, &lo, &t->dec));
    /* unset --max_length: the model's context, as ms-swift (a longer sample trains past what the model can see) */
    t->max_length = a->max_length > 0 ? a->max_length : at_train_default_max_length(&t->dec->cfg);
    /* the tokenizer and template where infer finds them: a model folder's
     * files, a GGUF file's tokenizer.ggml.* and chat template, a llama2.c
     * checkpoint's tokenizer.bin */
    at_bundle_opts bo = {0};
    bo.model = a->model;
    bo.template_name = a->template_name;
    bo.tokenizer = a->tokenizer;
    AT_TRY(at_bundle_load_text(&bo, &t->tok, &t->tmpl));
    AT_TRY(at_tokenizer_check_vocab(t->tok, t->dec->cfg.vocab_size, a->model));
    AT_TRY(load_vision(t));
    if (!t->tmpl && !a->template_name)
        at_log_info("%s has no chat template: conversations need --template", a->model);
    AT_TRY(at_text_pipeline_init(&t->pipe, t->tok, t->tmpl, a->loss_last_turn_only));
    t->pipe.system = a->system;
    t->pipe_ready = 1;
    return AT_OK;
}


static int32_t pad_id(const trainer *t) { return at_tokenizer_pad(t->tok) >= 0 ? at_tokenizer_pad(t->tok) : 0; }

/* The datasets, read and handed to the objective to encode. */
static at_status load_data(trainer *t)
{
    const at_train_args *a = t->a;
    at_dataset_options o = {0};
    o.seed = a->seed;
    o.strict = a->strict;
    o.split_ratio = a->n_val_datasets ? 0 : a->split_dataset_ratio;
    o.model_name = a->model_name;
    o.model_author = a->model_author;
    o.model_name_en = a->model_name_en;
    o.model_author_en = a->model_author_en;
    cJSON *columns = NULL;
    if (a->columns) {
        columns = at_json_value(a->columns);
        if (!cJSON_IsObject(columns)) {
            cJSON_Delete(columns);
            return at_error(AT_ERR_INVALID, "--columns %.100s: expected a JSON object such as {\"question\": \"query\"}",
                            a->columns);
        }
        for (const cJSON *c = columns->child; c; c = c->next)
            if (!cJSON_IsString(c)) {
                cJSON_Delete(columns);
                return at_error(AT_ERR_INVALID, "--columns: \"%s\" must map to a key name (a string)", c->string);
            }
        o.columns = columns;
    }
    if (t->obj->ops->plain_text) o.format = AT_FORMAT_TEXT;
    at_status st = at_dataset_load(a->datasets, (size_t)a->n_datasets, &o, &t->ds);
    if (st == AT_OK && !t->ds->n_skipped) at_log_info("%s", t->ds->summary); /* with skips, the load warned with it */
    if (st == AT_OK && a->n_val_datasets) {
        o.split_ratio = 0;
        st = at_dataset_load(a->val_datasets, (size_t)a->n_val_datasets, &o, &t->val_ds);
    }
    cJSON_Delete(columns);
    AT_TRY(st);
    const at_sample_list *vl = t->val_ds ? &t->val_ds->train : &t->ds->val;
    at_encoder enc;
    at_text_pipeline_encoder(&t->pipe, &enc);
    enc.max_length = (size_t)t->max_length;
    enc.truncation = a->truncation;
    at_obj_data_env env = {&enc, a->strict, at_tokenizer_bos(t->tok), at_tokenizer_eos(t->tok), t->max_length,
                           a->batch_size, t->tok, t->tmpl, t->vision ? &t->improc : NULL, t->mrope.image_token_id,
                           t->has_mrope ? &t->mrope : NULL};
    return t->obj->ops->prepare(t->obj, &env, &t->ds->train, vl);
}

/* A frozen reference model from path (--ref_model, or --model again),
 * loaded as the policy's frozen weights are. */
static at_status load_reference(trainer *t, const char *path, at_decoder **out)
{
    const at_train_args *a = t->a;
    at_load_options lo;
    *out = NULL;
    AT_TRY(model_load_options(t, &lo));
    lo.writable = 0;
    if (lo.dtype == AT_F32 && a->full && !a->has_dtype) lo.dtype = at_load_options_default().dtype;
    AT_TRY(at_decoder_load(path, &lo, out));
    if ((*out)->cfg.vocab_size == t->dec->cfg.vocab_size) return AT_OK;
    at_status st = at_error(AT_ERR_INVALID, "--ref_model %s has a vocabulary of %d tokens, --model %s has %d: the "
                            "reference must share the policy's tokenizer", path, (*out)->cfg.vocab_size, a->model,
                            t->dec->cfg.vocab_size);
    at_decoder_free(*out);
    *out = NULL;
    return st;
}

/* An objective that scores against its reference during training (grpo):
 * --ref_model, or with full fine-tuning a frozen copy of the initial
 * weights (read from --model again), or none (LoRA: the adapter off). */
static at_status keep_reference(trainer *t)
{
    const at_train_args *a = t->a;
    const char *path = a->pref && a->pref->ref_model ? a->pref->ref_model : a->full ? a->model : NULL;
    at_decoder *ref = NULL;
    if (path) AT_TRY(load_reference(t, path, &ref));
    at_status st = t->obj->ops->keep_reference(t->obj, ref);
    if (st != AT_OK) at_decoder_free(ref);
    else if (path) at_log_info("reference model: %s%s", path,
                               a->pref && a->pref->ref_model ? "" : " (the initial weights, frozen)");
    return st;
}

/* The objective's reference log-probs (DPO's, KTO's), once, before training
 * (and before a resume loads trained weights): by --ref_model, else by the
 * policy as loaded (LoRA: with the adapter off; full: the initial weights). */
static at_status reference_pass(trainer *t)
{
    const at_train_args *a = t->a;
    const char *ref_model = a->pref ? a->pref->ref_model : NULL;
    at_decoder *ref = t->dec;
    at_status st = AT_OK;
    double t0 = at_now_seconds();
    if (ref_model) AT_TRY(load_reference(t, ref_model, &ref));
    else st = at_decoder_set_adapter(t->dec, NULL);
    if (st == AT_OK) st = t->obj->ops->reference(t->obj, ref, a->batch_size, pad_id(t));
    if (ref != t->dec) at_decoder_free(ref);
    else if (t->adapter) {
        at_status s2 = at_decoder_set_adapter(t->dec, t->adapter);
        if (st == AT_OK) st = s2;
    }
    if (st == AT_OK)
        at_log_info("%s reference log-probs of %zu items in %.1f s (%s)", a->pref ? a->pref->name : t->obj->ops->name,
                    t->obj->n_train + t->obj->n_val, at_now_seconds() - t0, ref_model ? ref_model : "the base model");
    return st;
}

/* ---- what trains ---- */

/* The vision tower's parts (ms-swift's rules): --freeze_vit false trains
 * the vision transformer (LoRA on its linears with LoRA: all-linear then
 * reaches the tower; every weight with full), --freeze_aligner false the
 * merger's weights (with LoRA too, as ms-swift's modules_to_save). */
static at_status vision_trainable(trainer *t)
{
    const at_train_args *a = t->a;
    if (!t->vision) return AT_OK;
    int vit = !a->freeze_vit, aligner = !a->freeze_aligner;
    if (vit && !a->full)
        AT_TRY(at_vision_lora_add(t->vision, a->lora_rank, a->lora_alpha, a->use_rslora, at_rng_mix(a->seed, 0x7615)));
    return at_vision_set_trainable(t->vision, vit, aligner);
}

/* The optimizer over one list of every trainable tensor: the decoder's
 * (none with --freeze_llm), the objective's own, the vision tower's (its
 * groups: --vit_lr and --vit_freeze_steps, --aligner_lr). */
static at_status init_optimizer(trainer *t, const at_adamw_config *oc)
{
    const at_train_args *a = t->a;
    at_objective *o = t->obj;
    int nd = a->freeze_llm ? 0 : at_decoder_trainables(t->dec, t->grads, NULL, 0);
    int no = o->ops->trainables ? o->ops->trainables(o, NULL, 0) : 0, nv = 0;
    size_t nvp = t->vision ? at_vision_param_count(t->vision) : 0;
    for (size_t i = 0; i < nvp; i++) nv += at_vision_grad(t->vision, i) != NULL;
    at_param_grad *all = calloc((size_t)(nd + no + nv) + 1, sizeof *all);
    if (!all) return at_error(AT_ERR_NOMEM, "out of memory");
    at_decoder_trainables(t->dec, t->grads, all, nd);
    if (no) o->ops->trainables(o, all + nd, no);
    int n = nd + no;
    for (size_t i = 0; i < nvp; i++)
        if (at_vision_grad(t->vision, i)) all[n++] = (at_param_grad){at_vision_param(t->vision, i), at_vision_grad(t->vision, i)};
    at_status st = n ? at_optimizer_init_list(&t->opt, t->be, all, n, oc)
                     : at_error(AT_ERR_INVALID, "nothing to train: --freeze_llm with the vision tower frozen "
                                "(--freeze_vit, --freeze_aligner)");
    free(all);
    AT_TRY(st);
    t->opt_ready = 1;
    t->n_dec_params = nd;
    t->n_vis_params = nv;
    for (size_t i = 0, k = (size_t)(nd + no); i < nvp; i++) {
        if (!at_vision_grad(t->vision, i)) continue;
        int aligner = at_vision_param_is_aligner(t->vision, i);
        double lr = aligner ? a->aligner_lr : a->vit_lr;
        at_optimizer_set_group(&t->opt, (int)k++, lr > 0 ? lr / a->learning_rate : 1.0,
                               aligner ? 0 : a->vit_freeze_steps);
    }
    return AT_OK;
}

/* ---- batches ---- */

static at_batch_options batch_options(const trainer *t, int64_t epoch)
{
    at_batch_options o = {0};
    o.batch_size = (size_t)t->a->batch_size;
    o.packing_length = t->a->packing ? (size_t)t->max_length : 0;
    o.group_by_length = t->a->group_by_length && !t->a->packing;
    o.shuffle = 1;
    o.seed = t->a->seed + (uint64_t)epoch * 1000003u;
    return o;
}

static at_status plan_epoch(trainer *t, int64_t epoch)
{
    if (t->plan.batch_start && t->plan_epoch == epoch) return AT_OK;
    if (t->plan.batch_start) at_batch_plan_free(&t->plan);
    memset(&t->plan, 0, sizeof t->plan);
    at_batch_options o = batch_options(t, epoch);
    AT_TRY(at_batch_plan_make(t->obj->train_len, t->obj->n_train, &o, &t->plan));
    t->plan_epoch = epoch;
    t->obj->epoch = epoch;
    return AT_OK;
}

static at_status ensure_acts(trainer *t, int B, int T, unsigned flags)
{
    if (t->acts && t->acts->B == B && t->acts->T == T && t->acts->flags == flags) return AT_OK;
    at_decoder_acts_free(t->acts);
    t->acts = NULL;
    return at_decoder_acts_new_ex(t->dec, B, T, flags, &t->acts);
}

/* The objective's loss over the validation items, no gradients. */
static at_status evaluate(trainer *t, double *eval_loss)
{
    at_obj_eval_env env = {t->dec, &t->acts, batch_options(t, 0), pad_id(t), t->a->packing, t->vision};
    env.batch.shuffle = 0;
    return t->obj->ops->evaluate(t->obj, &env, eval_loss);
}

/* ---- the step ---- */

/* A step's micro-batches: plan batches [step_first, step_last) over every
 * rank, of which this rank runs [first, last). */
typedef struct {
    int64_t step_first, step_last; /* every rank's */
    int64_t first, last;           /* this rank's */
    int64_t columns;               /* NEFTune's L: columns of one micro-batch holding the whole step */
    at_batch *batches;             /* [n]: this rank's, built by the objective */
    int n;
    int64_t tokens;                /* input tokens of the whole step */
    int stop;                      /* some rank was told to stop: none runs this step */
} step_batches;

/* Data parallel: each rank runs a consecutive run of grad_accum of the
 * step's grad_accum · world micro-batches. */
static void split_over_ranks(const trainer *t, int64_t step, step_batches *sb)
{
    const at_train_args *a = t->a;
    /* an objective whose plan steps repeat (grpo's μ) runs plan step k as steps kμ .. kμ + μ − 1 */
    int64_t rep = t->obj->step_repeats > 1 ? t->obj->step_repeats : 1;
    sb->step_first = ((step % t->steps_per_epoch) / rep) * a->grad_accum * t->world;
    sb->step_last = sb->step_first + (int64_t)a->grad_accum * t->world;
    if (sb->step_last > (int64_t)t->plan.n_batches) sb->step_last = (int64_t)t->plan.n_batches;
    sb->first = sb->step_first + (int64_t)t->rank * a->grad_accum;
    sb->last = sb->first + a->grad_accum;
    if (sb->last > sb->step_last) sb->last = sb->step_last;
    if (sb->first > sb->last) sb->first = sb->last;
}

/* The columns one micro-batch holding the whole step (plan batches [b0, b1),
 * every rank's) would have: the packing length, or the step's longest row.
 * NEFTune scales its noise by it (transformers: the batch's columns), and
 * taking the step's rather than each micro-batch's keeps the noise, like the
 * dropout masks, independent of how the step is split. */
static int64_t step_columns(const trainer *t, int64_t b0, int64_t b1)
{
    const at_batch_plan *pl = &t->plan;
    if (pl->packing_length) return (int64_t)pl->packing_length;
    size_t cols = 1;
    for (size_t r = pl->batch_start[b0]; r < pl->batch_start[b1]; r++) {
        size_t len = 0; /* a preference row is one pair: its length is the longer side */
        for (size_t k = pl->row_start[r]; k < pl->row_start[r + 1]; k++)
            if (pl->items[k] < t->obj->n_train) len += t->obj->train_len[pl->items[k]];
        if (len > cols) cols = len;
    }
    return (int64_t)cols;
}

static void free_batches(step_batches *sb)
{
    for (int m = 0; sb->batches && m < sb->n; m++) at_batch_free(&sb->batches[m]);
    free(sb->batches);
    sb->batches = NULL;
}

/* The next step's micro-batches, and the step's counts (the objective's
 * normalizers, the input tokens, the stop flag) summed over every rank. */
static at_status next_batches(trainer *t, int64_t step, step_batches *sb)
{
    const at_objective *o = t->obj;
    memset(sb, 0, sizeof *sb);
    split_over_ranks(t, step, sb);
    sb->columns = step_columns(t, sb->step_first, sb->step_last);
    sb->n = (int)(sb->last - sb->first);
    sb->batches = calloc((size_t)(sb->n ? sb->n : 1), sizeof *sb->batches);
    if (!sb->batches) return at_error(AT_ERR_NOMEM, "out of memory");
    int nc = o->ops->n_counts;
    double counts[AT_OBJ_MAX_COUNTS + 2] = {0};
    int64_t tokens = 0;
    for (int m = 0; m < sb->n; m++) {
        double c[AT_OBJ_MAX_COUNTS] = {0};
        AT_TRY(o->ops->build(o, &t->plan, (size_t)(sb->first + m), pad_id(t), &sb->batches[m], c));
        for (int k = 0; k < nc; k++) counts[k] += c[k];
        for (size_t r = 0; r < sb->batches[m].rows; r++) tokens += sb->batches[m].lengths[r];
    }
    counts[nc] = (double)tokens;
    counts[nc + 1] = at_stop_signal() ? 1.0 : 0.0;
    AT_TRY(at_comm_allreduce_f64(t->comm, counts, nc + 2)); /* the whole step's, over every rank */
    memcpy(t->step_counts, counts, (size_t)nc * sizeof *counts);
    sb->tokens = (int64_t)counts[nc];
    sb->stop = counts[nc + 1] > 0;
    return AT_OK;
}

/* The step's LoRA dropout seed; the masks are keyed by the row of the step
 * (decoder.h dropout_first_row), so they do not depend on how the step's
 * rows are split into micro-batches, pieces and ranks. */
static uint64_t dropout_seed(const trainer *t, int64_t step)
{
    return at_rng_mix(t->a->seed * 0x9e3779b97f4a7c15ull, (uint64_t)step);
}

/* Every gradient to zero: the decoder's and the others of the optimizer's
 * list (the objective's own, the vision tower's). */
static at_status zero_grads(trainer *t)
{
    AT_TRY(at_decoder_grads_zero(t->grads));
    for (int i = t->n_dec_params; i < t->opt.n; i++) AT_TRY(at_fill(t->opt.params[i].grad, 0.0f));
    return AT_OK;
}

/* ---- out of memory: smaller micro-batches ----
 * When a micro-batch runs out of device memory, the step is run again from
 * zeroed gradients with every micro-batch cut into 2 (then 4) pieces of
 * consecutive items, for the rest of the run. Each piece keeps the step's
 * counts (the loss's normalizers over the whole step) and the batch's
 * column count, so the summed gradients are those of the whole micro-batch:
 * the results do not change, only the speed (up to the rounding of the sums;
 * the LoRA dropout masks are the rows', wherever they are). At most two
 * halvings. */
#define MAX_OOM_HALVINGS 2

static int is_oom(at_status st) { return st == AT_ERR_DEVICE_OOM || st == AT_ERR_NOMEM; }

/* The objective's forward and backward of this rank's micro-batches, each in
 * 1 << oom_halvings pieces; its statistics into t->step_stats. */
static at_status run_micro_batches(trainer *t, const step_batches *sb, int64_t step, unsigned flags)
{
    const at_train_args *a = t->a;
    at_objective *o = t->obj;
    at_status st = AT_OK;
    memset(t->step_stats, 0, sizeof t->step_stats);
    size_t unit = o->rows_per_item; /* pieces are cut between items */
    for (int m = 0; m < sb->n && st == AT_OK && t->step_counts[0] > 0; m++) {
        size_t units = sb->batches[m].rows / unit, np = (size_t)1 << t->oom_halvings;
        if (np > units) np = units;
        /* the dropout masks and NEFTune's noise are keyed by the rows' place among the step's rows */
        size_t step_row = t->plan.batch_start[sb->first + m] - t->plan.batch_start[sb->step_first];
        for (size_t k = 0; k < np && st == AT_OK; k++) {
            size_t u0 = units * k / np, u1 = units * (k + 1) / np;
            at_batch piece = at_batch_rows(&sb->batches[m], u0 * unit, u1 * unit);
            at_batch_tensors bt;
            st = at_batch_tensors_upload(t->be, &piece, a->packing, &bt);
            if (st == AT_OK) st = ensure_acts(t, (int)piece.rows, (int)piece.cols, flags);
            at_obj_micro mi = {&t->plan, (size_t)(sb->first + m), u0, u1, &piece, &bt,
                               {.lora_dropout = (float)(a->full ? 0.0 : a->lora_dropout),
                                .dropout_seed = dropout_seed(t, step), .first_row = (int64_t)((step_row + u0) * unit),
                                .neftune_alpha = (float)a->neftune_noise_alpha, .neftune_columns = sb->columns},
                               t->step_counts, t->scaler.scale, t->vision};
            if (st == AT_OK) st = o->ops->forward_backward(o, t->dec, t->acts, &mi, t->grads, t->step_stats);
            at_batch_tensors_free(&bt);
        }
    }
    return st;
}

/* Runs the step's micro-batches, halving them on out-of-memory (see above). */
static at_status run_step_batches(trainer *t, const step_batches *sb, int64_t step, unsigned flags)
{
    size_t most = 0;
    for (int m = 0; m < sb->n; m++)
        if (sb->batches[m].rows > most) most = sb->batches[m].rows;
    at_status st = run_micro_batches(t, sb, step, flags);
    while (is_oom(st) && t->oom_halvings < MAX_OOM_HALVINGS && ((size_t)1 << t->oom_halvings) < most) {
        size_t before = (most + ((size_t)1 << t->oom_halvings) - 1) >> t->oom_halvings;
        t->oom_halvings++;
        size_t after = (most + ((size_t)1 << t->oom_halvings) - 1) >> t->oom_halvings;
        at_log_warn("step %lld: out of memory (%s); retrying the step with micro-batches of %zu rows instead of %zu "
                    "(twice the accumulation steps: same results, slower)",
                    (long long)step + 1, at_last_error(), after, before);
        /* the partial gradients and the bigger activations go first */
        at_decoder_acts_free(t->acts);
        t->acts = NULL;
        st = zero_grads(t);
        if (st == AT_OK) st = run_micro_batches(t, sb, step, flags);
    }
    if (is_oom(st) && t->oom_halvings > 0)
        st = at_error_wrap(st, "out of memory even with micro-batches of %zu rows (halved %d times); lower "
                           "--max_length, turn --gradient_checkpointing on, or use --train_type qlora",
                           (most + ((size_t)1 << t->oom_halvings) - 1) >> t->oom_halvings, t->oom_halvings);
    return st;
}

/* Data parallel: the step's statistics and every gradient summed over the
 * ranks (a world of one: nothing to do). */
static at_status sum_over_ranks(trainer *t)
{
    if (t->world <= 1) return AT_OK;
    AT_TRY(at_comm_allreduce_f64(t->comm, t->step_stats, t->obj->ops->n_stats));
    at_tensor **grads = malloc((size_t)(t->opt.n ? t->opt.n : 1) * sizeof *grads);
    if (!grads) return at_error(AT_ERR_NOMEM, "all-reduce of the gradients: out of memory");
    for (int i = 0; i < t->opt.n; i++) grads[i] = t->opt.params[i].grad;
    at_status st = at_comm_allreduce_tensors(t->comm, grads, t->opt.n, 0);
    free(grads);
    return st;
}

/* Whether step `done` evaluates / checkpoints under strategy (ms-swift's
 * steps|epoch|no; NULL: steps): every `every` steps and at the last, at each
 * epoch's end and the last, or never. */
static int due(const char *strategy, int every, int64_t done, const trainer *t)
{
    if (strategy && !strcmp(strategy, "no")) return 0;
    if (done == t->total_steps) return 1;
    if (strategy && !strcmp(strategy, "epoch")) return done % t->steps_per_epoch == 0;
    return every > 0 && done % every == 0;
}

/* Why step `done` makes no update (NULL: it does): a loss-scale overflow (the
 * scale is lowered and the step retried from the next batch, as
 * torch.cuda.amp.GradScaler), a non-finite loss or gradient, or no
 * supervised token. */
static const char *skip_reason(trainer *t, int64_t done, double loss, double norm, int *nonfinite)
{
    if (at_loss_scaler_overflow(&t->scaler, loss, norm)) {
        at_log_info("step %lld: gradient overflow: loss scale lowered to %g", (long long)done, t->scaler.scale);
        return "loss scale overflow";
    }
    if (isfinite(loss) && isfinite(norm)) return NULL;
    int targets = t->step_counts[0] > 0;
    (*nonfinite)++;
    at_log_warn("step %lld: %s (loss %g, grad norm %g): update skipped", (long long)done,
                targets ? "non-finite loss or gradient" : "no supervised token", loss, norm);
    return targets ? "non-finite" : "no supervised token";
}

/* A step that makes its update: the optimizer step, the loss scale's growth,
 * zeroed gradients, the statistics, the log line's fields (into `line`) and
 * the evaluation. */
static at_status step_update(trainer *t, cJSON *line, at_progress *bar, int64_t done, double loss, double norm,
                             double lr, int64_t tokens, at_log_interval *iv, at_train_result *res, double *eval_now)
{
    const at_train_args *a = t->a;
    AT_TRY(at_optimizer_step(&t->opt, lr, norm, 1.0 / t->scaler.scale));
    at_loss_scaler_updated(&t->scaler);
    AT_TRY(zero_grads(t));
    res->steps_trained++;
    if (isnan(res->first_loss)) res->first_loss = loss;
    res->last_loss = loss;
    iv->loss += loss;
    iv->steps++;
    for (int i = 0; i < t->obj->ops->n_stats; i++) t->interval_stats[i] += t->step_stats[i];
    iv->tokens += tokens;
    iv->tokens_run += tokens;
    t->tokens_seen += tokens;
    if (done % a->logging_steps == 0 || done == t->total_steps || done == 1)
        AT_TRY(at_trainer_log_step(t, line, bar, done, norm, lr, iv, res));
    if (t->rank == 0 && t->obj->n_val && due(a->eval_strategy, a->eval_steps, done, t)) {
        double el = NAN;
        AT_TRY(evaluate(t, &el));
        AT_TRY(at_trainer_log_eval(t, line, bar, done, el));
        *eval_now = el;
    }
    return AT_OK;
}

/* A skipped step's log line; stops the run after --max_nonfinite_steps in a row. */
static at_status step_skipped(trainer *t, cJSON *line, int64_t done, const char *why, int nonfinite, int64_t last_saved)
{
    cJSON_AddNumberToObject(line, "step", (double)done);
    cJSON_AddBoolToObject(line, "skipped", 1);
    cJSON_AddStringToObject(line, "reason", why);
    if (!strcmp(why, "loss scale overflow")) cJSON_AddNumberToObject(line, "loss_scale", t->scaler.scale);
    AT_TRY(zero_grads(t));
    if (nonfinite < t->a->max_nonfinite_steps) return AT_OK;
    char where[1100];
    if (last_saved > 0) snprintf(where, sizeof where, "the last good checkpoint is %s/checkpoint-%lld",
                                 t->run_dir ? t->run_dir : ".", (long long)last_saved);
    else snprintf(where, sizeof where, "no checkpoint was saved");
    return at_error(AT_ERR_INVALID,
                    "stopping: %d steps in a row had a non-finite loss or gradient (lower the learning "
                    "rate, or check the data and the model's weights); %s",
                    nonfinite, where);
}

/* The run's steps, as llm.c's: the next step's micro-batches → the
 * objective's forward and backward → sum over ranks → gradient norm → skip
 * or update (which zeroes the gradients) → log / evaluate / checkpoint. */
static at_status train_loop(trainer *t, int64_t start_step, at_train_result *res)
{
    const at_train_args *a = t->a;
    const at_objective *o = t->obj;
    at_schedule sched = {a->scheduler, a->learning_rate,
                         at_schedule_warmup_steps(a->warmup_steps, a->warmup_ratio, t->total_steps), t->total_steps};
    unsigned flags = AT_ACTS_TRAIN | (a->gradient_checkpointing ? AT_ACTS_CHECKPOINT : 0);
    at_progress bar;
    at_progress_start(&bar, "train", t->total_steps, t->rank == 0 || !t->devnull ? stderr : t->devnull);
    at_progress_update(&bar, start_step, NULL);
    double t0 = at_now_seconds();
    at_log_interval interval = {0, t0, 0, 0, 0};
    int nonfinite = 0;
    at_status st = AT_OK;
    res->first_loss = NAN;
    res->first_logged_loss = res->last_logged_loss = NAN;
    res->best_eval_loss = NAN;
    res->steps_done = start_step;
    res->start_step = start_step;
    int64_t last_saved = start_step; /* the newest checkpoint's step (start_step: the one resumed from, or none) */
    /* ANYTUNE_DEBUG_KILL_AFTER_STEP=N: the process kills itself (SIGKILL) right
     * after step N, as a crash would; ANYTUNE_DEBUG_TERM_AFTER_STEP=N: it sends
     * itself SIGTERM there, as a scheduler would. The resume tests use them
     * (an outside signal would race a fast run). ANYTUNE_DEBUG_NONFINITE_FROM=N:
     * step N and those after it have a non-finite loss, as a diverging run's
     * (the tests of skipped steps). */
    const char *ks = getenv("ANYTUNE_DEBUG_KILL_AFTER_STEP"), *ts = getenv("ANYTUNE_DEBUG_TERM_AFTER_STEP");
    const char *nf = getenv("ANYTUNE_DEBUG_NONFINITE_FROM");
    int64_t kill_after = ks ? strtoll(ks, NULL, 10) : 0, term_after = ts ? strtoll(ts, NULL, 10) : 0;
    int64_t nonfinite_from = nf ? strtoll(nf, NULL, 10) : 0;
    for (int64_t step = start_step; step < t->total_steps && st == AT_OK; step++) {
        if ((st = plan_epoch(t, step / t->steps_per_epoch)) != AT_OK) break;
        step_batches sb;
        st = next_batches(t, step, &sb);
        if (st == AT_OK && sb.stop) {
            free_batches(&sb);
            res->stopped_by = at_stop_signal() ? at_stop_signal() : SIGTERM;
            break;
        }
        /* --vit_freeze_steps: the vision transformer's first updates are the optimizer's held ones */
        if (t->vision) at_vision_hold_vit(t->vision, step < a->vit_freeze_steps);
        if (st == AT_OK) st = run_step_batches(t, &sb, step, flags);
        free_batches(&sb);
        if (st == AT_OK) st = sum_over_ranks(t);
        if (st != AT_OK) break;
        double loss = o->ops->loss(o, t->step_stats, t->step_counts), norm = 0;
        if (nonfinite_from > 0 && step + 1 >= nonfinite_from) loss = NAN;
        if ((st = at_optimizer_grad_norm(&t->opt, &norm)) != AT_OK) break;
        norm /= t->scaler.scale; /* the gradients carry the loss scale */
        double lr = at_schedule_lr(&sched, step);
        int64_t done = step + 1;
        double eval_now = NAN; /* this step's eval_loss, for the best checkpoint */
        cJSON *line = cJSON_CreateObject();
        if (!line) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        const char *skipped = skip_reason(t, done, loss, norm, &nonfinite);
        if (skipped) {
            st = step_skipped(t, line, done, skipped, nonfinite, last_saved);
        } else {
            nonfinite = 0;
            st = step_update(t, line, &bar, done, loss, norm, lr, sb.tokens, &interval, res, &eval_now);
        }
        if (cJSON_GetObjectItem(line, "step")) {
            at_status ls = at_trainer_log_line(t, line);
            if (st == AT_OK) st = ls;
        }
        cJSON_Delete(line);
        char status[160];
        if (skipped) snprintf(status, sizeof status, "step skipped: %s", skipped);
        else snprintf(status, sizeof status, "loss %.4f lr %.2e %.0f tok/s mem %.0f MB", loss, lr,
                      (double)interval.tokens_run / (at_now_seconds() - t0 + 1e-9), at_trainer_peak_rss_mb());
        at_progress_update(&bar, done, status);
        /* the last step is checkpointed even when skipped; nothing is, until a step has trained */
        if (st == AT_OK && t->rank == 0 && (res->steps_trained > 0 || start_step > 0) &&
            (due(a->save_strategy, a->save_steps, done, t) || done == t->total_steps)) {
            st = at_trainer_save_checkpoint(t, done);
            last_saved = done;
            if (st == AT_OK && !isnan(eval_now) && !(eval_now >= res->best_eval_loss)) {
                res->best_eval_loss = eval_now;
                snprintf(res->best_checkpoint, sizeof res->best_checkpoint, "%s/checkpoint-%lld", t->run_dir,
                         (long long)done);
            }
        }
        res->steps_done = done;
        if (kill_after > 0 && done == kill_after) raise(SIGKILL); /* crash tests: die between checkpoints */
        if (term_after > 0 && done == term_after) raise(SIGTERM);
    }
    if (st == AT_OK && res->stopped_by && t->rank == 0) {
        if (res->steps_done > last_saved && (res->steps_trained > 0 || start_step > 0)) {
            st = at_trainer_save_checkpoint(t, res->steps_done);
            last_saved = res->steps_done;
        }
        const char *sig = res->stopped_by == SIGINT ? "SIGINT" : "SIGTERM";
        if (st == AT_OK && last_saved == res->steps_done && last_saved > 0)
            at_log_warn("%s: stopped after step %lld of %lld, checkpoint-%lld saved; continue with "
                        "--resume_from_checkpoint last", sig, (long long)res->steps_done, (long long)t->total_steps,
                        (long long)res->steps_done);
        else if (st == AT_OK)
            at_log_warn("%s: stopped before a step trained: nothing to save", sig);
    }
    if (st == AT_OK && !res->stopped_by && res->steps_trained == 0) {
        char where[1100];
        if (last_saved > 0) snprintf(where, sizeof where, "the weights are those of step %lld, in %s/checkpoint-%lld",
                                     (long long)start_step, t->run_dir ? t->run_dir : ".", (long long)last_saved);
        else snprintf(where, sizeof where, "nothing was saved");
        st = at_error(AT_ERR_INVALID, "none of the %lld steps run made an update: every one was skipped (a non-finite "
                      "loss or gradient, or no supervised token: check the model's weights and the data); %s",
                      (long long)(res->steps_done - start_step), where);
    }
    at_progress_finish(&bar, NULL);
    res->train_seconds = at_now_seconds() - t0;
    return st;
}

at_status at_train_run(const at_train_args *a, FILE *out, at_train_result *res)
{
    at_trainer t;
    memset(&t, 0, sizeof t);
    t.lock.fd = -1;
    t.a = a;
    memset(res, 0, sizeof *res);
    if (!out) out = stdout;
    at_status st = AT_OK;
    if (!a->model) return at_error(AT_ERR_INVALID, "--model is required");
    if (a->n_datasets < 1) return at_error(AT_ERR_INVALID, "--dataset is required");
    if (a->batch_size < 1 || a->grad_accum < 1 || a->logging_steps < 1)
        return at_error(AT_ERR_INVALID, "--per_device_train_batch_size, --gradient_accumulation_steps and "
                                        "--logging_steps must be at least 1");
    AT_TRY(at_train_args_check(a));
    if (a->load_best_model_at_end && a->eval_steps > 0 && (a->save_steps <= 0 || a->save_steps % a->eval_steps))
        return at_error(AT_ERR_INVALID, "--load_best_model_at_end: checkpoints must fall on evaluations: --save_steps "
                        "%d is not a multiple of --eval_steps %d", a->save_steps, a->eval_steps);
    if (!a->output_dir || !a->output_dir[0])
        return at_error(AT_ERR_INVALID, "--output_dir is empty: give the folder where runs go (default: output)");
    if (!(a->neftune_noise_alpha >= 0 && a->neftune_noise_alpha <= FLT_MAX))
        return at_error(AT_ERR_INVALID, "--neftune_noise_alpha %g must be finite and >= 0 (0: off)",
                        a->neftune_noise_alpha);
    if (a->pref && a->packing)
        return at_error(AT_ERR_UNSUPPORTED, "--packing with rlhf: each pair's chosen and rejected replies are rows of "
                        "their own; drop --packing");
    if (a->pref && a->pt) return at_error(AT_ERR_INVALID, "rlhf trains on preference pairs, not plain text");
    if (a->pref) AT_TRY(at_pref_config_check(a->pref));
    AT_TRY(at_objective_open(a->pref ? a->pref->name : a->pt ? "pt" : "sft", a->pref, &t.obj));
    AT_CHECK(at_comm_world(&t.comm));
    t.rank = at_comm_rank(t.comm);
    t.world = at_comm_size(t.comm);
    if (t.rank != 0) t.devnull = fopen("/dev/null", "w");
    AT_CHECK(load_model(&t));
    AT_CHECK(load_data(&t));
    if (!a->full) {
        if (a->adapters) {
            AT_CHECK(at_adapter_load(a->adapters, &t.dec->cfg, t.be, &t.adapter));
        } else {
            AT_CHECK(at_adapter_new(&t.dec->cfg, t.be, a->lora_rank, a->lora_alpha, a->lora_dropout, a->use_rslora,
                                    a->target_mask, a->seed, &t.adapter));
        }
        snprintf(t.adapter->base_model, sizeof t.adapter->base_model, "%s", a->model);
        AT_CHECK(at_decoder_set_adapter(t.dec, t.adapter));
    }
    if (t.obj->ops->needs_reference && t.obj->ops->needs_reference(t.obj))
        AT_CHECK(t.obj->ops->keep_reference ? keep_reference(&t) : reference_pass(&t));
    AT_CHECK(vision_trainable(&t));
    AT_CHECK(at_decoder_grads_new(t.dec, a->full, &t.grads));
    at_adamw_config oc = {a->adam_beta1, a->adam_beta2, a->adam_epsilon, a->weight_decay, a->max_grad_norm};
    if (t.obj->ops->attach) AT_CHECK(t.obj->ops->attach(t.obj, t.dec, a->seed));
    AT_CHECK(init_optimizer(&t, &oc));
    /* steps: every epoch's plan has the same number of batches */
    AT_CHECK(plan_epoch(&t, 0));
    t.n_batches = (int64_t)t.plan.n_batches;
    int64_t per_step = (int64_t)a->grad_accum * t.world; /* micro-batches per step, all ranks together */
    t.steps_per_epoch = (t.n_batches + per_step - 1) / per_step;
    if (t.steps_per_epoch < 1) t.steps_per_epoch = 1;
    if (t.obj->step_repeats > 1) t.steps_per_epoch *= t.obj->step_repeats;
    t.total_steps = a->max_steps > 0 ? a->max_steps : (int64_t)ceil(a->num_train_epochs * (double)t.steps_per_epoch);
    if (t.total_steps < 1) t.total_steps = 1;
    at_loss_scaler_init(&t.scaler, a->loss_scaling, a->loss_scale_init);
    int64_t start_step = 0;
    if (a->resume_from_checkpoint) {
        AT_CHECK(at_trainer_resume(&t, &start_step));
    } else if (t.rank == 0) {
        AT_CHECK(at_trainer_open_run_dir(&t));
    }
    if (t.rank != 0) goto train; /* rank 0 writes the run's files and prints */
    if (a->args_json && !a->resume_from_checkpoint) { /* a resumed run keeps its own */
        char *p = at_path_join(t.run_dir, "args.json");
        st = at_write_file_atomic(p, a->args_json, strlen(a->args_json));
        free(p);
        if (st != AT_OK) goto done;
    }
    AT_CHECK(at_trainer_log_open(&t));
    t.obj->run_dir = t.run_dir;
    snprintf(res->run_dir, sizeof res->run_dir, "%s", t.run_dir);
    int64_t trainable = 0;
    for (int i = 0; i < t.opt.n; i++) trainable += at_tensor_numel(t.opt.params[i].param);
    fprintf(stderr, "anytune: %s on %s: %zu training samples, %lld steps (%lld per epoch), %lld trainable "
                    "parameters; output in %s\n",
            a->full               ? "full fine-tuning"
            : a->quant_bits == 4  ? "QLoRA (nf4 weights)"
            : a->quant_bits == 8  ? "LoRA over q8_0 weights"
                                  : "LoRA",
            t.be->name, t.obj->n_train, (long long)t.total_steps,
            (long long)t.steps_per_epoch, (long long)trainable, t.run_dir);
    if (t.world > 1)
        fprintf(stderr, "anytune: data parallel over %d processes: %d micro-batches of %d per step\n", t.world,
                a->grad_accum * t.world, a->batch_size);
    if (a->n_preview_prompts && start_step == 0) {
        fprintf(out, "Before training:\n");
        AT_CHECK(at_preview_answers(t.dec, &t.pipe, a->preview_prompts, a->n_preview_prompts, a->preview_max_tokens, out));
    }
train:;
    at_stop_handlers handlers;
    at_stop_signals_catch(&handlers);
    st = train_loop(&t, start_step, res);
    at_stop_signals_release(&handlers);
    if (st != AT_OK) goto done;
    if (t.rank != 0) goto done;
    if (!res->stopped_by) AT_CHECK(at_trainer_load_best(&t, res));
    AT_CHECK(at_trainer_write_plot(&t));
    if (a->n_preview_prompts && !res->stopped_by) {
        fprintf(out, "After training:\n");
        AT_CHECK(at_preview_answers(t.dec, &t.pipe, a->preview_prompts, a->n_preview_prompts, a->preview_max_tokens, out));
    }
done:
    if (t.run_dir_new && res->steps_trained == 0 && (st != AT_OK || res->stopped_by)) {
        /* a run that failed or stopped before its first update leaves no folder behind */
        if (t.log) fclose(t.log);
        t.log = NULL;
        at_remove_tree(t.run_dir);
        res->run_dir[0] = '\0';
    }
    trainer_free(&t);
    return st;
}
