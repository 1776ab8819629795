#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/rng.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "device/registry.h"
#include "infer/bundle.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "ops/ops.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/optimizer.h"
#include "train/plot.h"
#include "train/preview.h"
#include "train/ckpt_files.h"
#include "train/run_files.h"
#include "device/comm.h"
#include "train/text_pipeline.h"
#include "train/train_options.h"

void at_train_args_defaults(at_train_args *a)
{
    memset(a, 0, sizeof *a);
    /* the option table's defaults (train/train_options.c): what `anytune sft` uses */
    at_options_store_defaults(at_train_options, at_train_n_options, a);
    /* what the command line parses from text (enums, lists) */
    a->target_mask = (1u << AT_MOD_COUNT) - 1;
    a->truncation = AT_TRUNCATE_DELETE;
    a->scheduler = AT_SCHED_COSINE;
    a->max_nonfinite_steps = 5;
}

/* Everything a run holds; released by trainer_free on every path. */
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
    at_encoded *train, *val;
    size_t n_train, n_val;
    size_t *train_len, *val_len;
    int max_length;       /* --max_length, or the model's context when unset (0) */
    at_decoder_acts *acts;
    char *run_dir;
    int run_dir_new;      /* this process created run_dir (removed again when no step of it trained) */
    at_run_lock lock;     /* rank 0's hold on run_dir */
    FILE *log;
    int64_t steps_per_epoch, total_steps, n_batches;
    int64_t tokens_seen;  /* input tokens trained on so far (kept across a resume) */
    double loss_scale;    /* dynamic loss scaling (f16): gradients are of loss · loss_scale; 1 when off */
    int good_steps;       /* steps since the scale last changed */
    int oom_halvings;     /* micro-batches run in 1 << oom_halvings pieces since an out-of-memory retry */
    /* data parallel (mpirun -np N): this process is rank `rank` of `world`; each
     * step's grad_accum · world micro-batches are split in consecutive runs of
     * grad_accum per rank and the gradients summed, so N processes compute what
     * one process with N-fold accumulation would. Rank 0 alone writes files. */
    at_comm *comm;
    int rank, world;
    FILE *devnull;
    /* the current epoch's batch plan */
    at_batch_plan plan;
    int64_t plan_epoch;
    /* preference objectives (a->pref, train/preference.h): the pairs (with
     * DPO's reference log-probs); the current step's sums and those of the
     * logging interval. The batch plan is over pairs (train_len: the longer
     * side of each). */
    at_pref_pairs pref_train, pref_val;
    at_pref_stats pref_step, pref_interval;
    int64_t step_base;       /* plan index of the step's first micro-batch (of rank 0) */
    int64_t step_first;      /* plan index of this rank's first micro-batch of the step */
    double step_nll_targets; /* chosen-reply targets of the whole step (the NLL term) */
    int64_t step_columns;    /* NEFTune's L: columns of one micro-batch of the whole step (step_columns) */
    /* history for the SVG */
    int64_t *hist_step, *eval_step;
    double *hist_loss, *hist_lr, *eval_loss;
    int n_hist, cap_hist, n_eval, cap_eval;
} trainer;

static void free_encoded(at_encoded *e, size_t n)
{
    for (size_t i = 0; e && i < n; i++) at_encoded_free(&e[i]);
    free(e);
}

static void trainer_free(trainer *t)
{
    at_decoder_acts_free(t->acts);
    if (t->opt_ready) at_optimizer_free(&t->opt);
    at_decoder_grads_free(t->grads);
    if (t->dec) at_decoder_set_adapter(t->dec, NULL);
    at_adapter_free(t->adapter);
    at_decoder_free(t->dec);
    if (t->pipe_ready) at_text_pipeline_free(&t->pipe);
    at_chat_template_free(t->tmpl);
    at_tokenizer_free(t->tok);
    free_encoded(t->train, t->n_train);
    free_encoded(t->val, t->n_val);
    free(t->train_len);
    free(t->val_len);
    at_dataset_free(t->ds);
    at_dataset_free(t->val_ds);
    at_pref_pairs_free(&t->pref_train);
    at_pref_pairs_free(&t->pref_val);
    if (t->plan.batch_start) at_batch_plan_free(&t->plan);
    if (t->log) fclose(t->log);
    if (t->devnull) fclose(t->devnull);
    at_run_lock_release(&t->lock);
    free(t->run_dir);
    free(t->hist_step);
    free(t->hist_loss);
    free(t->hist_lr);
    free(t->eval_step);
    free(t->eval_loss);
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
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
    if (!t->tmpl && !a->template_name)
        at_log_info("%s has no chat template: conversations need --template", a->model);
    AT_TRY(at_text_pipeline_init(&t->pipe, t->tok, t->tmpl, a->loss_last_turn_only));
    t->pipe.system = a->system;
    t->pipe_ready = 1;
    return AT_OK;
}


static at_status encode_list(trainer *t, const at_sample_list *list, at_encoded **out, size_t **lens, size_t *n_out,
                             const char *what)
{
    const at_train_args *a = t->a;
    at_encoder enc;
    at_text_pipeline_encoder(&t->pipe, &enc);
    enc.max_length = (size_t)t->max_length;
    enc.truncation = a->truncation;
    at_encoded *e = calloc(list->n ? list->n : 1, sizeof *e);
    size_t *len = calloc(list->n ? list->n : 1, sizeof *len);
    if (!e || !len) {
        free(e);
        free(len);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    size_t n = 0, dropped = 0, failed = 0, no_labels = 0;
    at_status st = AT_OK;
    for (size_t i = 0; i < list->n; i++) {
        const at_sample *s = list->items[i];
        int drop = 0;
        if (s->kind == AT_SAMPLE_PREFERENCE) {
            st = at_error(AT_ERR_INVALID, "%s:%d: a preference pair; sft and pt take conversations or texts",
                          s->source, s->line);
        } else {
            st = at_encode_sample(&enc, s, &e[n], &drop);
        }
        if (st == AT_OK && !drop && s->kind == AT_SAMPLE_TEXT) /* pt: documents stay apart */
            st = at_encoded_frame(&e[n], at_tokenizer_bos(t->tok), at_tokenizer_eos(t->tok));
        if (st != AT_OK) {
            if (a->strict) break;
            if (failed++ < 5) at_log_warn("skipping a sample: %s", at_last_error());
            at_encoded_free(&e[n]);
            st = AT_OK;
            continue;
        }
        if (drop) {
            dropped++;
            continue;
        }
        int any = 0;
        for (size_t k = 1; k < e[n].n && !any; k++) any = e[n].labels[k] != AT_IGNORE_INDEX;
        if (!any) {
            no_labels++;
            at_encoded_free(&e[n]);
            continue;
        }
        len[n] = e[n].n;
        n++;
    }
    if (st != AT_OK) {
        free_encoded(e, n);
        free(len);
        return st;
    }
    at_log_info("%s: %zu samples encoded (%zu longer than --max_length %d dropped, %zu failed, %zu without "
                "trained tokens)", what, n, dropped, t->max_length, failed, no_labels);
    *out = e;
    *lens = len;
    *n_out = n;
    return AT_OK;
}

static int32_t pad_id(const trainer *t) { return at_tokenizer_pad(t->tok) >= 0 ? at_tokenizer_pad(t->tok) : 0; }

/* Preference objectives: the training and validation pairs; the batch plan
 * runs over pairs. */
static at_status load_pairs(trainer *t, const at_sample_list *vl)
{
    const at_train_args *a = t->a;
    at_encoder enc;
    at_text_pipeline_encoder(&t->pipe, &enc);
    enc.max_length = (size_t)t->max_length;
    enc.truncation = a->truncation;
    AT_TRY(at_pref_pairs_encode(&t->ds->train, &enc, a->strict, "train", &t->pref_train));
    if (vl->n) AT_TRY(at_pref_pairs_encode(vl, &enc, a->strict, "eval", &t->pref_val));
    if (t->pref_train.n == 0) return at_error(AT_ERR_INVALID, "no preference pair left after encoding (see the warnings above)");
    t->n_train = t->pref_train.n;
    t->n_val = t->pref_val.n;
    t->train_len = malloc(t->n_train * sizeof *t->train_len);
    if (!t->train_len) return at_error(AT_ERR_NOMEM, "out of memory");
    memcpy(t->train_len, t->pref_train.len, t->n_train * sizeof *t->train_len);
    return AT_OK;
}

/* DPO: the reference log-probs of every pair, once, before training (and
 * before a resume loads trained weights): by --ref_model, else by the policy
 * as loaded (LoRA: with the adapter off; full: the initial weights). */
static at_status dpo_reference(trainer *t)
{
    const at_train_args *a = t->a;
    at_decoder *ref = t->dec;
    at_status st = AT_OK;
    double t0 = at_now_seconds();
    if (a->pref->ref_model) {
        at_load_options lo;
        AT_TRY(model_load_options(t, &lo));
        lo.writable = 0;
        if (lo.dtype == AT_F32 && a->full && !a->has_dtype) lo.dtype = at_load_options_default().dtype;
        AT_TRY(at_decoder_load(a->pref->ref_model, &lo, &ref));
        if (ref->cfg.vocab_size != t->dec->cfg.vocab_size)
            st = at_error(AT_ERR_INVALID, "--ref_model %s has a vocabulary of %d tokens, --model %s has %d: the "
                          "reference must share the policy's tokenizer", a->pref->ref_model, ref->cfg.vocab_size,
                          a->model, t->dec->cfg.vocab_size);
    } else {
        st = at_decoder_set_adapter(t->dec, NULL);
    }
    if (st == AT_OK) st = at_pref_reference(ref, &t->pref_train, a->batch_size, pad_id(t));
    if (st == AT_OK && t->pref_val.n) st = at_pref_reference(ref, &t->pref_val, a->batch_size, pad_id(t));
    if (ref != t->dec) at_decoder_free(ref);
    else if (t->adapter) {
        at_status s2 = at_decoder_set_adapter(t->dec, t->adapter);
        if (st == AT_OK) st = s2;
    }
    if (st == AT_OK)
        at_log_info("DPO reference log-probs of %zu pairs in %.1f s (%s)", t->pref_train.n + t->pref_val.n,
                    at_now_seconds() - t0, a->pref->ref_model ? a->pref->ref_model : "the base model");
    return st;
}

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
        columns = cJSON_Parse(a->columns);
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
    if (a->pt) o.format = AT_FORMAT_TEXT;
    at_status st = at_dataset_load(a->datasets, (size_t)a->n_datasets, &o, &t->ds);
    if (st == AT_OK && !t->ds->n_skipped) at_log_info("%s", t->ds->summary); /* with skips, the load warned with it */
    if (st == AT_OK && a->n_val_datasets) {
        o.split_ratio = 0;
        st = at_dataset_load(a->val_datasets, (size_t)a->n_val_datasets, &o, &t->val_ds);
    }
    cJSON_Delete(columns);
    AT_TRY(st);
    const at_sample_list *vl = t->val_ds ? &t->val_ds->train : &t->ds->val;
    if (a->pref) return load_pairs(t, vl);
    AT_TRY(encode_list(t, &t->ds->train, &t->train, &t->train_len, &t->n_train, "train"));
    if (vl->n) AT_TRY(encode_list(t, vl, &t->val, &t->val_len, &t->n_val, "eval"));
    if (t->n_train == 0) return at_error(AT_ERR_INVALID, "no training sample left after encoding (see the warnings above)");
    return AT_OK;
}

/* ---- batches and steps ---- */

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
    AT_TRY(at_batch_plan_make(t->train_len, t->n_train, &o, &t->plan));
    t->plan_epoch = epoch;
    return AT_OK;
}

/* Targets of a batch: positions whose next token is supervised and belongs to
 * the same sample (the rule of at_decoder_loss). */
static int64_t count_targets(const at_batch *b)
{
    int64_t n = 0;
    for (size_t r = 0; r < b->rows; r++)
        for (size_t c = 0; c + 1 < b->cols; c++) {
            size_t i = r * b->cols + c;
            if (b->labels[i + 1] == AT_IGNORE_INDEX) continue;
            if (b->segments && b->segments[i + 1] != b->segments[i]) continue;
            n++;
        }
    return n;
}

typedef struct {
    at_tensor *ids, *pos, *seg, *labels;
} batch_tensors;

static void batch_tensors_free(batch_tensors *bt)
{
    at_tensor_free(bt->ids);
    at_tensor_free(bt->pos);
    at_tensor_free(bt->seg);
    at_tensor_free(bt->labels);
    memset(bt, 0, sizeof *bt);
}

static at_status upload_i32(at_backend *be, const int32_t *host, size_t rows, size_t cols, const char *name,
                            at_tensor **out)
{
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    AT_TRY(at_tensor_new(be, AT_I32, 2, shape, name, out));
    return at_tensor_upload(*out, host, rows * cols * sizeof(int32_t));
}

static at_status upload_batch(trainer *t, const at_batch *b, batch_tensors *bt)
{
    memset(bt, 0, sizeof *bt);
    at_status st = upload_i32(t->be, b->ids, b->rows, b->cols, "input_ids", &bt->ids);
    if (st == AT_OK) st = upload_i32(t->be, b->positions, b->rows, b->cols, "position_ids", &bt->pos);
    if (st == AT_OK && t->a->packing) st = upload_i32(t->be, b->segments, b->rows, b->cols, "segment_ids", &bt->seg);
    if (st == AT_OK) st = upload_i32(t->be, b->labels, b->rows, b->cols, "labels", &bt->labels);
    if (st != AT_OK) batch_tensors_free(bt);
    return st;
}

static at_status ensure_acts(trainer *t, int B, int T, unsigned flags)
{
    if (t->acts && t->acts->B == B && t->acts->T == T && t->acts->flags == flags) return AT_OK;
    at_decoder_acts_free(t->acts);
    t->acts = NULL;
    return at_decoder_acts_new_ex(t->dec, B, T, flags, &t->acts);
}

/* Loss of the validation samples, token-weighted, no gradients. */
static at_status evaluate(trainer *t, double *eval_loss)
{
    if (t->a->pref) {
        at_pref_stats s;
        at_decoder_acts_free(t->acts); /* the evaluation makes its own */
        t->acts = NULL;
        AT_TRY(at_pref_evaluate(t->a->pref, &t->pref_val, t->dec, t->a->batch_size, pad_id(t), &s));
        *eval_loss = at_pref_stats_loss(t->a->pref, &s);
        return AT_OK;
    }
    at_batch_options o = batch_options(t, 0);
    o.shuffle = 0;
    at_batch_plan plan = {0};
    AT_TRY(at_batch_plan_make(t->val_len, t->n_val, &o, &plan));
    double sum = 0;
    int64_t n = 0;
    at_status st = AT_OK;
    for (size_t b = 0; b < plan.n_batches && st == AT_OK; b++) {
        at_batch batch = {0};
        batch_tensors bt = {0};
        st = at_batch_build(&plan, b, t->val, t->n_val, 0, &batch);
        if (st == AT_OK) st = upload_batch(t, &batch, &bt);
        if (st == AT_OK) st = ensure_acts(t, (int)batch.rows, (int)batch.cols, AT_ACTS_LOSS);
        if (st == AT_OK) st = at_decoder_forward(t->dec, t->acts, bt.ids, bt.pos, bt.seg);
        at_loss_stats stats = {0};
        if (st == AT_OK) st = at_decoder_loss(t->dec, t->acts, bt.labels, 1.0f, NULL, &stats);
        sum += stats.loss_sum;
        n += stats.n_targets;
        batch_tensors_free(&bt);
        at_batch_free(&batch);
    }
    at_batch_plan_free(&plan);
    *eval_loss = n ? sum / (double)n : NAN;
    return st;
}

/* ---- logging, checkpoints ---- */

static at_status push_hist(int64_t **steps, double **a, double **b, int *n, int *cap, int64_t s, double va, double vb)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        int64_t *ns = realloc(*steps, (size_t)nc * sizeof *ns);
        if (!ns) return at_error(AT_ERR_NOMEM, "out of memory");
        *steps = ns;
        double *na = realloc(*a, (size_t)nc * sizeof *na);
        if (!na) return at_error(AT_ERR_NOMEM, "out of memory");
        *a = na;
        if (b) {
            double *nb = realloc(*b, (size_t)nc * sizeof *nb);
            if (!nb) return at_error(AT_ERR_NOMEM, "out of memory");
            *b = nb;
        }
        *cap = nc;
    }
    (*steps)[*n] = s;
    (*a)[*n] = va;
    if (b) (*b)[*n] = vb;
    (*n)++;
    return AT_OK;
}

static at_status log_line(trainer *t, cJSON *obj)
{
    if (!t->log) return AT_OK; /* ranks other than 0 */
    char *s = cJSON_PrintUnformatted(obj);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    fprintf(t->log, "%s\n", s);
    free(s);
    if (fflush(t->log) != 0) return at_error(AT_ERR_IO, "%s/logging.jsonl: write failed: %s", t->run_dir, strerror(errno));
    return AT_OK;
}

static at_status save_checkpoint(trainer *t, int64_t step)
{
    char *dir = NULL;
    AT_TRY(at_ckpt_begin(t->run_dir, step, &dir));
    at_status st = AT_OK;
    if (t->a->full) {
        /* every weight, under its Hugging Face name, with the config beside */
        int n = at_decoder_trainables(t->dec, t->grads, NULL, 0);
        at_param_grad *pg = calloc((size_t)n, sizeof *pg);
        const at_tensor **ts = calloc((size_t)n, sizeof *ts);
        char *cfg = NULL;
        if (!pg || !ts) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
        } else {
            at_decoder_trainables(t->dec, t->grads, pg, n);
            for (int i = 0; i < n; i++) ts[i] = pg[i].param;
            char *p = at_path_join(dir, "model.safetensors");
            st = at_safetensors_write(p, (const at_tensor *const *)ts, NULL, (size_t)n, NULL, 0);
            free(p);
            if (st == AT_OK) st = at_model_config_to_json(&t->dec->cfg, &cfg);
            if (st == AT_OK) {
                p = at_path_join(dir, "config.json");
                st = at_write_file_atomic(p, cfg, strlen(cfg));
                free(p);
            }
            /* and the tokenizer and generation config: the folder loads as the model did */
            const char *model_dir = at_is_dir(t->a->model) ? t->a->model : NULL;
            const char *tok_dir = t->a->tokenizer ? (at_is_dir(t->a->tokenizer) ? t->a->tokenizer : NULL) : model_dir;
            if (st == AT_OK)
                st = at_ckpt_write_standalone(dir, tok_dir, model_dir, t->tok, t->tmpl, t->max_length);
        }
        free(cfg);
        free(pg);
        free((void *)ts);
    } else {
        st = at_adapter_save(t->adapter, dir);
    }
    if (st == AT_OK) {
        char *p = at_path_join(dir, "trainer_state.safetensors");
        char sstep[32], sseed[32], stok[32], sscale[64], sgood[32];
        snprintf(sscale, sizeof sscale, "%.17g", t->loss_scale);
        snprintf(sgood, sizeof sgood, "%d", t->good_steps);
        snprintf(sstep, sizeof sstep, "%lld", (long long)step);
        snprintf(sseed, sizeof sseed, "%llu", (unsigned long long)t->a->seed);
        snprintf(stok, sizeof stok, "%lld", (long long)t->tokens_seen);
        const char *meta[] = {"global_step", sstep, "seed", sseed, "train_type", t->a->full ? "full" : "lora",
                              "tokens_seen", stok, "loss_scale", sscale, "loss_scale_good_steps", sgood};
        /* --save_only_model: the weights alone (the moments are what a resume needs) */
        if (!t->a->save_only_model) st = at_optimizer_save(&t->opt, p, meta, 6);
        free(p);
    }
    if (st == AT_OK) st = at_ckpt_commit(t->run_dir, step, dir);
    if (st == AT_OK) st = at_ckpt_prune(t->run_dir, t->a->save_total_limit, t->a->load_best_model_at_end);
    free(dir);
    return st;
}

/* Keeps the lines of logging.jsonl up to `step` (a resumed run rewrites what came after). */
static at_status truncate_log(const char *path, int64_t step)
{
    char *text = NULL;
    size_t len = 0;
    if (at_read_file(path, &text, &len) != AT_OK) return AT_OK; /* no log yet */
    size_t keep = 0;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) break; /* a torn last line (the crash) is dropped */
        cJSON *j = cJSON_ParseWithLength(line, (size_t)(nl - line));
        const cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        int ok = s && cJSON_IsNumber(s) && s->valuedouble <= (double)step;
        cJSON_Delete(j);
        if (!ok) break;
        keep = (size_t)(nl + 1 - text);
        line = nl + 1;
    }
    at_status st = at_write_file_atomic(path, text, keep);
    free(text);
    return st;
}

/* The trained weights of checkpoint ckpt into the model: the LoRA matrices,
 * or (full fine-tuning) every trainable tensor. */
static at_status load_weights(trainer *t, const char *ckpt)
{
    at_status st = AT_OK;
    if (!t->a->full) {
        at_adapter *ad = NULL;
        st = at_adapter_load(ckpt, &t->dec->cfg, t->be, &ad);
        if (st == AT_OK) {
            at_decoder_set_adapter(t->dec, NULL);
            for (size_t i = 0; i < (size_t)ad->n_layers * AT_MOD_COUNT; i++) {
                if (!ad->mods[i].A || !t->adapter->mods[i].A) continue;
                st = at_cast(t->adapter->mods[i].A, ad->mods[i].A);
                if (st == AT_OK) st = at_cast(t->adapter->mods[i].B, ad->mods[i].B);
                if (st != AT_OK) break;
            }
            at_adapter_free(ad);
            if (st == AT_OK) st = at_decoder_set_adapter(t->dec, t->adapter);
        }
        return st;
    }
    char *p = at_path_join(ckpt, "model.safetensors");
    at_st_model *m = NULL;
    st = at_st_model_open(p, &m);
    free(p);
    for (int i = 0; st == AT_OK && i < t->opt.n; i++) {
        at_tensor *src = NULL, *dst = t->opt.params[i].param;
        st = at_st_get(m, dst->name, dst->ndim, dst->shape, AT_F32, &src);
        if (st == AT_OK) st = at_tensor_upload(dst, at_tensor_data(src), at_tensor_nbytes(src));
        at_tensor_free(src);
    }
    at_st_model_close(m);
    return st;
}

/* --load_best_model_at_end (transformers' rule): the best checkpoint of the
 * run, by the evaluations logged (resumed runs' too), becomes the model this
 * run ends with, and the one its result names. */
static at_status load_best(trainer *t, at_train_result *res)
{
    int64_t step = 0;
    double v = NAN;
    at_status st = at_run_best_checkpoint(t->run_dir, &step, &v);
    if (st == AT_ERR_NOT_FOUND) {
        at_clear_error();
        return AT_OK;
    }
    AT_TRY(st);
    snprintf(res->best_checkpoint, sizeof res->best_checkpoint, "%s/checkpoint-%lld", t->run_dir, (long long)step);
    res->best_eval_loss = v;
    if (!t->a->load_best_model_at_end || step == res->steps_done) return AT_OK;
    AT_TRY(load_weights(t, res->best_checkpoint));
    res->loaded_best = 1;
    return AT_OK;
}

static at_status resume(trainer *t, int64_t *start_step)
{
    char *ckpt = NULL, *run_dir = NULL;
    int64_t ckpt_step = 0;
    at_status st = at_run_find_resume(t->a->output_dir, t->a->resume_from_checkpoint, t->a->add_version, &run_dir, &ckpt, &ckpt_step);
    if (st != AT_OK) goto done;
    /* the run is this process's to write from here: nothing is read or truncated before */
    if (t->rank == 0 && (st = at_run_lock_take(run_dir, &t->lock)) != AT_OK) goto done;
    char *state = at_path_join(ckpt, "trainer_state.safetensors");
    at_st_file *f = NULL;
    st = at_st_open(state, &f);
    if (st == AT_OK) {
        const char *gs = at_st_metadata(f, "global_step");
        const char *tt = at_st_metadata(f, "train_type");
        if (!gs) st = at_error(AT_ERR_FORMAT, "%s: no global_step", state);
        else if (tt && strcmp(tt, t->a->full ? "full" : "lora") != 0)
            st = at_error(AT_ERR_INVALID, "%s was written by a %s run; this run is --train_type %s", ckpt, tt,
                          t->a->full ? "full" : "lora");
        else *start_step = strtoll(gs, NULL, 10);
        const char *ts = at_st_metadata(f, "tokens_seen");
        if (ts) t->tokens_seen = strtoll(ts, NULL, 10);
        const char *ls = at_st_metadata(f, "loss_scale"), *lg = at_st_metadata(f, "loss_scale_good_steps");
        if (ls && t->a->loss_scaling) t->loss_scale = strtod(ls, NULL);
        if (lg && t->a->loss_scaling) t->good_steps = (int)strtol(lg, NULL, 10);
        at_st_close(f);
    }
    if (st == AT_OK && *start_step >= t->total_steps)
        st = at_error(AT_ERR_INVALID, "%s is finished: %s is step %lld of its %lld; nothing to resume (to train "
                      "on from it, start a new run with %s %s)", run_dir, ckpt, (long long)*start_step,
                      (long long)t->total_steps, t->a->full ? "--model" : "--adapters", ckpt);
    if (st == AT_OK) st = load_weights(t, ckpt);
    if (st == AT_OK) st = at_optimizer_load(&t->opt, state);
    free(state);
    if (st != AT_OK) goto done;
    t->run_dir = run_dir;
    run_dir = NULL;
    char *logp = at_path_join(t->run_dir, "logging.jsonl");
    if (t->rank == 0) st = truncate_log(logp, *start_step);
    free(logp);
    at_log_info("resuming from %s at step %lld", ckpt, (long long)*start_step);
done:
    free(ckpt);
    free(run_dir);
    return st;
}

/* ---- the loop ---- */

/* GradScaler's defaults: start at 2^16, halve on overflow, double after 2000 clean steps. */
#define LOSS_SCALE_INIT 65536.0
#define LOSS_SCALE_GROWTH_INTERVAL 2000

/* The step's LoRA dropout seed; the masks are keyed by the row of the step
 * (decoder.h dropout_first_row), so they do not depend on how the step's
 * rows are split into micro-batches, pieces and ranks. */
static uint64_t dropout_seed(const trainer *t, int64_t step)
{
    return at_rng_mix(t->a->seed * 0x9e3779b97f4a7c15ull, (uint64_t)step);
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
        size_t len = 0; /* a preference row is one pair: train_len is its longer side */
        for (size_t k = pl->row_start[r]; k < pl->row_start[r + 1]; k++)
            if (pl->items[k] < t->n_train) len += t->train_len[pl->items[k]];
        if (len > cols) cols = len;
    }
    return (int64_t)cols;
}

/* ---- out of memory: smaller micro-batches ----
 * When a micro-batch runs out of device memory, the step is run again from
 * zeroed gradients with every micro-batch cut into 2 (then 4) pieces of
 * consecutive rows, for the rest of the run. Each piece keeps the step's
 * grad_scale (1 / supervised tokens of the whole step) and the batch's
 * column count, so the summed gradients are those of the whole micro-batch:
 * the results do not change, only the speed (up to the rounding of the sums;
 * the LoRA dropout masks are the rows', wherever they are). At most two
 * halvings. */
#define MAX_OOM_HALVINGS 2

static int is_oom(at_status st) { return st == AT_ERR_DEVICE_OOM || st == AT_ERR_NOMEM; }

/* Rows [r0, r1) of b, as views into b (not to be freed). */
static at_batch batch_rows(const at_batch *b, size_t r0, size_t r1)
{
    at_batch v = *b;
    size_t off = r0 * b->cols;
    v.ids = b->ids + off;
    v.labels = b->labels + off;
    v.positions = b->positions + off;
    v.segments = b->segments ? b->segments + off : NULL;
    v.lengths = b->lengths + r0;
    v.rows = r1 - r0;
    return v;
}

/* Forward and backward of a step's micro-batches, each in 1 << oom_halvings
 * pieces; adds the loss sums into *loss_sum. */
static at_status run_micro_batches(trainer *t, const at_batch *batches, int nmicro, int64_t step, int64_t targets,
                                   unsigned flags, double *loss_sum)
{
    const at_train_args *a = t->a;
    at_status st = AT_OK;
    *loss_sum = 0;
    memset(&t->pref_step, 0, sizeof t->pref_step);
    /* preference objectives cut micro-batches between pairs (units of 2 rows) */
    size_t unit = a->pref ? 2 : 1;
    for (int m = 0; m < nmicro && st == AT_OK && targets > 0; m++) {
        size_t units = batches[m].rows / unit, np = (size_t)1 << t->oom_halvings;
        if (np > units) np = units;
        for (size_t k = 0; k < np && st == AT_OK; k++) {
            size_t u0 = units * k / np, u1 = units * (k + 1) / np;
            at_batch piece = batch_rows(&batches[m], u0 * unit, u1 * unit);
            batch_tensors bt;
            st = upload_batch(t, &piece, &bt);
            if (st == AT_OK) st = ensure_acts(t, (int)piece.rows, (int)piece.cols, flags);
            /* the dropout masks are keyed by the rows' place among the step's rows */
            size_t step_row = t->plan.batch_start[t->step_first + m] - t->plan.batch_start[t->step_base];
            if (st == AT_OK) t->acts->dropout_first_row = (int64_t)((step_row + u0) * unit);
            if (st == AT_OK) { /* NEFTune noise: keyed like the masks, scaled by the step's columns */
                t->acts->neftune_alpha = (float)a->neftune_noise_alpha;
                t->acts->neftune_columns = t->step_columns;
            }
            float dropout = (float)(a->full ? 0.0 : a->lora_dropout);
            uint64_t seed = dropout_seed(t, step);
            if (st == AT_OK && a->pref) {
                /* the pairs of this piece: the plan's items of the micro-batch's rows */
                const size_t *pairs = t->plan.items + t->plan.row_start[t->plan.batch_start[t->step_first + m]] + u0;
                st = at_pref_forward_backward(a->pref, &t->pref_train, pairs, u1 - u0, t->dec, t->acts, bt.ids, bt.pos,
                                             bt.labels, dropout, seed, (double)targets, t->step_nll_targets,
                                             t->loss_scale, t->grads, &t->pref_step);
            } else if (st == AT_OK) {
                at_loss_stats stats = {0};
                st = at_decoder_forward_backward(t->dec, t->acts, bt.ids, bt.pos, bt.seg, bt.labels, dropout, seed,
                                                 (float)(t->loss_scale / (double)targets), t->grads, &stats);
                *loss_sum += stats.loss_sum;
            }
            batch_tensors_free(&bt);
        }
    }
    return st;
}

/* Runs the step's micro-batches, halving them on out-of-memory (see above). */
static at_status run_step_batches(trainer *t, const at_batch *batches, int nmicro, int64_t step, int64_t targets,
                                  unsigned flags, double *loss_sum)
{
    size_t most = 0;
    for (int m = 0; m < nmicro; m++)
        if (batches[m].rows > most) most = batches[m].rows;
    at_status st = run_micro_batches(t, batches, nmicro, step, targets, flags, loss_sum);
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
        st = at_decoder_grads_zero(t->grads);
        if (st == AT_OK) st = run_micro_batches(t, batches, nmicro, step, targets, flags, loss_sum);
    }
    if (is_oom(st) && t->oom_halvings > 0)
        st = at_error_wrap(st, "out of memory even with micro-batches of %zu rows (halved %d times); lower "
                           "--max_length, turn --gradient_checkpointing on, or use --train_type qlora",
                           (most + ((size_t)1 << t->oom_halvings) - 1) >> t->oom_halvings, t->oom_halvings);
    return st;
}

/* Data parallel: the loss sum and every gradient summed over the ranks (a
 * world of one: nothing to do). */
static at_status sum_over_ranks(trainer *t, double *loss_sum)
{
    if (t->world <= 1) return AT_OK;
    AT_TRY(at_comm_allreduce_f64(t->comm, loss_sum, 1));
    at_tensor **grads = malloc((size_t)(t->opt.n ? t->opt.n : 1) * sizeof *grads);
    if (!grads) return at_error(AT_ERR_NOMEM, "all-reduce of the gradients: out of memory");
    for (int i = 0; i < t->opt.n; i++) grads[i] = t->opt.params[i].grad;
    at_status st = at_comm_allreduce_tensors(t->comm, grads, t->opt.n, 0);
    free(grads);
    return st;
}

/* SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C, the web UI's Stop):
 * the step under way finishes, every rank stops at the same step boundary
 * (the flag travels with the step's counts), the last step is checkpointed
 * and the run ends, so no finished step is lost. A second signal ends the
 * process at once (the default action). */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig)
{
    if (g_stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_stop_signal = sig;
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

/* The statistics of the logging interval under way. */
typedef struct {
    double loss, t0; /* sum of the steps' losses; when the interval began */
    int steps;
    int64_t tokens, tokens_run; /* the interval's input tokens; this process's so far */
} log_interval;

/* A step that makes its update: the optimizer step, the loss scale's growth,
 * the statistics, the log line's fields (into `line`) and the evaluation. */
static at_status step_update(trainer *t, cJSON *line, at_progress *bar, int64_t done, double loss, double norm,
                             double lr, int64_t tokens, log_interval *iv, at_train_result *res, double *eval_now)
{
    const at_train_args *a = t->a;
    AT_TRY(at_optimizer_step(&t->opt, lr, norm, 1.0 / t->loss_scale));
    if (a->loss_scaling && ++t->good_steps >= LOSS_SCALE_GROWTH_INTERVAL) {
        t->loss_scale *= 2;
        t->good_steps = 0;
    }
    AT_TRY(at_decoder_grads_zero(t->grads));
    res->steps_trained++;
    if (isnan(res->first_loss)) res->first_loss = loss;
    res->last_loss = loss;
    iv->loss += loss;
    iv->steps++;
    if (a->pref) at_pref_stats_add(&t->pref_interval, &t->pref_step);
    iv->tokens += tokens;
    iv->tokens_run += tokens;
    t->tokens_seen += tokens;
    if (done % a->logging_steps == 0 || done == t->total_steps || done == 1) {
        double now = at_now_seconds();
        double tps = (double)iv->tokens / (now - iv->t0 > 1e-9 ? now - iv->t0 : 1e-9);
        cJSON_AddNumberToObject(line, "step", (double)done);
        cJSON_AddNumberToObject(line, "epoch", (double)done / (double)t->steps_per_epoch);
        cJSON_AddNumberToObject(line, "loss", iv->loss / iv->steps);
        if (isnan(res->first_logged_loss)) res->first_logged_loss = iv->loss / iv->steps;
        res->last_logged_loss = iv->loss / iv->steps;
        if (a->pref) {
            at_pref_stats_log(a->pref, &t->pref_interval, line);
            memset(&t->pref_interval, 0, sizeof t->pref_interval);
        }
        cJSON_AddNumberToObject(line, "grad_norm", norm);
        cJSON_AddNumberToObject(line, "lr", lr);
        cJSON_AddNumberToObject(line, "tokens", (double)t->tokens_seen);
        cJSON_AddNumberToObject(line, "tokens_per_s", round(tps * 10) / 10);
        cJSON_AddNumberToObject(line, "memory_mb", round(peak_rss_mb()));
        AT_TRY(push_hist(&t->hist_step, &t->hist_loss, &t->hist_lr, &t->n_hist, &t->cap_hist, done,
                         iv->loss / iv->steps, lr));
        char note[300];
        int k = snprintf(note, sizeof note, "step %lld/%lld  epoch %.2f  loss %.4f  grad_norm %.3f  lr %.3g  "
                         "%.0f tok/s", (long long)done, (long long)t->total_steps,
                         (double)done / (double)t->steps_per_epoch, iv->loss / iv->steps, norm, lr, tps);
        /* preference objectives: TRL's two figures a user watches */
        const cJSON *acc = cJSON_GetObjectItem(line, "rewards/accuracies"),
                    *mar = cJSON_GetObjectItem(line, "rewards/margins");
        if (cJSON_IsNumber(acc) && cJSON_IsNumber(mar) && k > 0 && (size_t)k < sizeof note)
            snprintf(note + k, sizeof note - (size_t)k, "  rewards/accuracies %.3f  rewards/margins %.4f",
                     acc->valuedouble, mar->valuedouble);
        at_progress_note(bar, note);
        iv->loss = 0;
        iv->steps = 0;
        iv->tokens = 0;
        iv->t0 = now;
    }
    if (t->rank == 0 && t->n_val && due(a->eval_strategy, a->eval_steps, done, t)) {
        double el = NAN;
        AT_TRY(evaluate(t, &el));
        if (!cJSON_GetObjectItem(line, "step")) cJSON_AddNumberToObject(line, "step", (double)done);
        cJSON_AddNumberToObject(line, "eval_loss", el);
        AT_TRY(push_hist(&t->eval_step, &t->eval_loss, NULL, &t->n_eval, &t->cap_eval, done, el, 0));
        char note[120];
        snprintf(note, sizeof note, "step %lld/%lld  eval_loss %.4f", (long long)done, (long long)t->total_steps, el);
        at_progress_note(bar, note);
        *eval_now = el;
    }
    return AT_OK;
}

static at_status train_loop(trainer *t, int64_t start_step, at_train_result *res)
{
    const at_train_args *a = t->a;
    at_schedule sched = {a->scheduler, a->learning_rate,
                         at_schedule_warmup_steps(a->warmup_steps, a->warmup_ratio, t->total_steps), t->total_steps};
    unsigned flags = AT_ACTS_TRAIN | (a->gradient_checkpointing ? AT_ACTS_CHECKPOINT : 0);
    at_progress bar;
    at_progress_start(&bar, "train", t->total_steps, t->rank == 0 || !t->devnull ? stderr : t->devnull);
    at_progress_update(&bar, start_step, NULL);
    double t0 = at_now_seconds();
    log_interval interval = {0, t0, 0, 0, 0};
    int nonfinite = 0;
    at_status st = AT_OK;
    res->first_loss = NAN;
    res->first_logged_loss = res->last_logged_loss = NAN;
    res->best_eval_loss = NAN;
    res->steps_done = start_step;
    res->start_step = start_step;
    double eval_now = NAN; /* this step's eval_loss, for the best checkpoint */
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
        int64_t epoch = step / t->steps_per_epoch;
        if ((st = plan_epoch(t, epoch)) != AT_OK) break;
        /* this rank's run of the step's grad_accum · world micro-batches */
        int64_t step_first = (step % t->steps_per_epoch) * a->grad_accum * t->world;
        int64_t step_last = step_first + (int64_t)a->grad_accum * t->world;
        if (step_last > (int64_t)t->plan.n_batches) step_last = (int64_t)t->plan.n_batches;
        int64_t first = step_first + (int64_t)t->rank * a->grad_accum, last = first + a->grad_accum;
        if (last > step_last) last = step_last;
        if (first > last) first = last;
        /* the batches of this step, and their supervised tokens */
        int nmicro = (int)(last - first);
        at_batch *batches = calloc((size_t)(nmicro ? nmicro : 1), sizeof *batches);
        if (!batches) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        /* targets: supervised tokens; for preference objectives the step's pairs (the loss is their mean) */
        int64_t targets = 0, tokens = 0, nll_targets = 0;
        t->step_base = step_first;
        t->step_first = first;
        t->step_columns = step_columns(t, step_first, step_last);
        for (int m = 0; m < nmicro && st == AT_OK; m++) {
            if (a->pref) {
                const at_batch_plan *pl = &t->plan;
                size_t r0 = pl->batch_start[first + m], r1 = pl->batch_start[first + m + 1];
                const size_t *pairs = pl->items + pl->row_start[r0];
                st = at_pref_batch_build(&t->pref_train, pairs, r1 - r0, pad_id(t), &batches[m]);
                targets += (int64_t)(r1 - r0);
                for (size_t i = 0; i < r1 - r0; i++) nll_targets += t->pref_train.n_c[pairs[i]];
            } else {
                st = at_batch_build(&t->plan, (size_t)(first + m), t->train, t->n_train, pad_id(t), &batches[m]);
                if (st == AT_OK) targets += count_targets(&batches[m]);
            }
            if (st != AT_OK) break;
            for (size_t r = 0; r < batches[m].rows; r++) tokens += batches[m].lengths[r];
        }
        double counts[4] = {(double)targets, (double)tokens, (double)nll_targets, g_stop_signal ? 1.0 : 0.0};
        if (st == AT_OK) st = at_comm_allreduce_f64(t->comm, counts, 4); /* the whole step's, over every rank */
        if (st == AT_OK && counts[3] > 0) { /* some rank was told to stop: none runs this step */
            for (int m = 0; m < nmicro; m++) at_batch_free(&batches[m]);
            free(batches);
            res->stopped_by = g_stop_signal ? (int)g_stop_signal : SIGTERM;
            break;
        }
        targets = (int64_t)counts[0];
        tokens = (int64_t)counts[1];
        t->step_nll_targets = counts[2];
        double loss_sum = 0;
        if (st == AT_OK) st = run_step_batches(t, batches, nmicro, step, targets, flags, &loss_sum);
        for (int m = 0; m < nmicro; m++) at_batch_free(&batches[m]);
        free(batches);
        if (st == AT_OK) st = sum_over_ranks(t, &loss_sum);
        if (st == AT_OK && a->pref && t->world > 1) /* the step's preference sums over every rank */
            st = at_comm_allreduce_f64(t->comm, (double *)&t->pref_step, AT_PREF_STATS_N);
        if (st != AT_OK) break;
        double loss = targets ? loss_sum / (double)targets : NAN, norm = 0;
        if (a->pref) loss = at_pref_stats_loss(a->pref, &t->pref_step);
        if (nonfinite_from > 0 && step + 1 >= nonfinite_from) loss = NAN;
        if ((st = at_optimizer_grad_norm(&t->opt, &norm)) != AT_OK) break;
        norm /= t->loss_scale; /* the gradients carry the loss scale */
        double lr = at_schedule_lr(&sched, step);
        int64_t done = step + 1;
        eval_now = NAN;
        cJSON *line = cJSON_CreateObject();
        if (!line) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        const char *skipped = NULL; /* why this step made no update */
        if (a->loss_scaling && isfinite(loss) && !isfinite(norm) && t->loss_scale > 1) {
            /* Dynamic loss scaling (f16): an overflow halves the scale and the
             * step is retried from the next batch, as torch.cuda.amp.GradScaler. */
            t->loss_scale /= 2;
            t->good_steps = 0;
            at_log_info("step %lld: gradient overflow: loss scale lowered to %g", (long long)done, t->loss_scale);
            skipped = "loss scale overflow";
        } else if (!isfinite(loss) || !isfinite(norm)) {
            nonfinite++;
            at_log_warn("step %lld: %s (loss %g, grad norm %g): update skipped", (long long)done,
                        targets ? "non-finite loss or gradient" : "no supervised token", loss, norm);
            skipped = targets ? "non-finite" : "no supervised token";
        }
        if (skipped) {
            cJSON_AddNumberToObject(line, "step", (double)done);
            cJSON_AddBoolToObject(line, "skipped", 1);
            cJSON_AddStringToObject(line, "reason", skipped);
            if (!strcmp(skipped, "loss scale overflow")) cJSON_AddNumberToObject(line, "loss_scale", t->loss_scale);
            st = at_decoder_grads_zero(t->grads);
            if (st == AT_OK && nonfinite >= a->max_nonfinite_steps) {
                char where[1100];
                if (last_saved > 0) snprintf(where, sizeof where, "the last good checkpoint is %s/checkpoint-%lld",
                                             t->run_dir ? t->run_dir : ".", (long long)last_saved);
                else snprintf(where, sizeof where, "no checkpoint was saved");
                st = at_error(AT_ERR_INVALID,
                              "stopping: %d steps in a row had a non-finite loss or gradient (lower the learning "
                              "rate, or check the data and the model's weights); %s",
                              nonfinite, where);
            }
        } else {
            nonfinite = 0;
            st = step_update(t, line, &bar, done, loss, norm, lr, tokens, &interval, res, &eval_now);
        }
        if (cJSON_GetObjectItem(line, "step")) {
            at_status ls = log_line(t, line);
            if (st == AT_OK) st = ls;
        }
        cJSON_Delete(line);
        char status[160];
        if (skipped) snprintf(status, sizeof status, "step skipped: %s", skipped);
        else snprintf(status, sizeof status, "loss %.4f lr %.2e %.0f tok/s mem %.0f MB", loss, lr,
                      (double)interval.tokens_run / (at_now_seconds() - t0 + 1e-9), peak_rss_mb());
        at_progress_update(&bar, done, status);
        /* the last step is checkpointed even when skipped; nothing is, until a step has trained */
        if (st == AT_OK && t->rank == 0 && (res->steps_trained > 0 || start_step > 0) &&
            (due(a->save_strategy, a->save_steps, done, t) || done == t->total_steps)) {
            st = save_checkpoint(t, done);
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
            st = save_checkpoint(t, res->steps_done);
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
    trainer t;
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
    if (a->pref && at_pref_needs_reference(a->pref)) AT_CHECK(dpo_reference(&t));
    AT_CHECK(at_decoder_grads_new(t.dec, a->full, &t.grads));
    at_adamw_config oc = {a->adam_beta1, a->adam_beta2, a->adam_epsilon, a->weight_decay, a->max_grad_norm};
    AT_CHECK(at_optimizer_init(&t.opt, t.dec, t.grads, &oc));
    t.opt_ready = 1;
    /* steps: every epoch's plan has the same number of batches */
    AT_CHECK(plan_epoch(&t, 0));
    t.n_batches = (int64_t)t.plan.n_batches;
    int64_t per_step = (int64_t)a->grad_accum * t.world; /* micro-batches per step, all ranks together */
    t.steps_per_epoch = (t.n_batches + per_step - 1) / per_step;
    if (t.steps_per_epoch < 1) t.steps_per_epoch = 1;
    t.total_steps = a->max_steps > 0 ? a->max_steps : (int64_t)ceil(a->num_train_epochs * (double)t.steps_per_epoch);
    if (t.total_steps < 1) t.total_steps = 1;
    t.loss_scale = !a->loss_scaling ? 1.0 : a->loss_scale_init > 0 ? a->loss_scale_init : LOSS_SCALE_INIT;
    int64_t start_step = 0;
    if (a->resume_from_checkpoint) {
        AT_CHECK(resume(&t, &start_step));
    } else if (t.rank == 0) {
        if (a->add_version) {
            AT_CHECK(at_run_dir_create(a->output_dir, &t.run_dir));
            t.run_dir_new = 1;
        } else { /* --add_version false: the run is output_dir itself (never removed) */
            if (!a->output_dir[0]) {
                st = at_error(AT_ERR_INVALID, "--output_dir is empty");
                goto done;
            }
            AT_CHECK(at_mkdirs(a->output_dir));
            t.run_dir = strdup(a->output_dir);
            if (!t.run_dir) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        AT_CHECK(at_run_lock_take(t.run_dir, &t.lock));
    }
    if (t.rank != 0) goto train; /* rank 0 writes the run's files and prints */
    if (a->args_json && !a->resume_from_checkpoint) { /* a resumed run keeps its own */
        char *p = at_path_join(t.run_dir, "args.json");
        st = at_write_file_atomic(p, a->args_json, strlen(a->args_json));
        free(p);
        if (st != AT_OK) goto done;
    }
    char *logp = at_path_join(t.run_dir, "logging.jsonl");
    t.log = logp ? fopen(logp, "a") : NULL;
    free(logp);
    if (!t.log) {
        st = at_error(AT_ERR_IO, "%s/logging.jsonl: cannot open: %s", t.run_dir, strerror(errno));
        goto done;
    }
    snprintf(res->run_dir, sizeof res->run_dir, "%s", t.run_dir);
    int64_t trainable = 0;
    for (int i = 0; i < t.opt.n; i++) trainable += at_tensor_numel(t.opt.params[i].param);
    fprintf(stderr, "anytune: %s on %s: %zu training samples, %lld steps (%lld per epoch), %lld trainable "
                    "parameters; output in %s\n",
            a->full               ? "full fine-tuning"
            : a->quant_bits == 4  ? "QLoRA (nf4 weights)"
            : a->quant_bits == 8  ? "LoRA over q8_0 weights"
                                  : "LoRA",
            t.be->name, t.n_train, (long long)t.total_steps,
            (long long)t.steps_per_epoch, (long long)trainable, t.run_dir);
    if (t.world > 1)
        fprintf(stderr, "anytune: data parallel over %d processes: %d micro-batches of %d per step\n", t.world,
                a->grad_accum * t.world, a->batch_size);
    if (a->n_preview_prompts && start_step == 0) {
        fprintf(out, "Before training:\n");
        AT_CHECK(at_preview_answers(t.dec, &t.pipe, a->preview_prompts, a->n_preview_prompts, a->preview_max_tokens, out));
    }
train:;
    struct sigaction stop_action, old_term, old_int;
    memset(&stop_action, 0, sizeof stop_action);
    stop_action.sa_handler = on_stop_signal;
    sigemptyset(&stop_action.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGTERM, &stop_action, &old_term);
    sigaction(SIGINT, &stop_action, &old_int);
    st = train_loop(&t, start_step, res);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    if (st != AT_OK) goto done;
    if (t.rank != 0) goto done;
    if (!res->stopped_by) AT_CHECK(load_best(&t, res));
    if (t.n_hist) {
        char *img = at_path_join(t.run_dir, "images");
        if (img) st = at_mkdirs(img);
        char *svg = img ? at_path_join(img, "train_loss.svg") : NULL;
        at_plot_series l = {t.hist_step, t.hist_loss, t.n_hist}, e = {t.eval_step, t.eval_loss, t.n_eval},
                       r = {t.hist_step, t.hist_lr, t.n_hist};
        if (st == AT_OK && svg) st = at_plot_loss_svg(svg, &l, &e, &r);
        free(svg);
        free(img);
        if (st != AT_OK) goto done;
    }
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
