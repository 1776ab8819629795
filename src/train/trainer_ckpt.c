/* Checkpoints, resume and the run folder of the trainer (trainer_impl.h).
 * What a checkpoint holds and how it is sealed: run_files.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/log.h"
#include "model/safetensors.h"
#include "ops/ops.h"
#include "train/ckpt_files.h"
#include "train/vision_ckpt.h"
#include "train/trainer_impl.h"

at_status at_trainer_save_checkpoint(at_trainer *t, int64_t step)
{
    char *dir = NULL;
    AT_TRY(at_ckpt_begin(t->run_dir, step, &dir));
    at_status st = AT_OK;
    /* the tower's tensors go into the same weights file (train/vision_ckpt.h) */
    size_t nv = 0, nv_max = t->vision ? at_vision_param_count(t->vision) : 0;
    const at_tensor **vt = calloc(nv_max + 1, sizeof *vt);
    at_st_shape *vs = calloc(nv_max + 1, sizeof *vs);
    if (!vt || !vs) st = at_error(AT_ERR_NOMEM, "out of memory");
    else if (t->vision) at_vision_ckpt_tensors(t->vision, t->a->full, vt, vs, &nv);
    const char *model_dir = at_is_dir(t->a->model) ? t->a->model : NULL;
    if (st == AT_OK && t->a->full) {
        /* every weight, under its Hugging Face name, with the config beside */
        int n = at_decoder_trainables(t->dec, t->grads, NULL, 0);
        at_param_grad *pg = calloc((size_t)n, sizeof *pg);
        const at_tensor **ts = calloc((size_t)n + nv, sizeof *ts);
        at_st_shape *shapes = calloc((size_t)n + nv, sizeof *shapes);
        char *cfg = NULL;
        if (!pg || !ts || !shapes) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
        } else {
            at_decoder_trainables(t->dec, t->grads, pg, n);
            for (int i = 0; i < n; i++) ts[i] = pg[i].param;
            for (size_t i = 0; i < nv; i++) {
                ts[(size_t)n + i] = vt[i];
                shapes[(size_t)n + i] = vs[i];
            }
            char *p = at_path_join(dir, "model.safetensors");
            st = at_safetensors_write_shaped(p, (const at_tensor *const *)ts, NULL, shapes, (size_t)n + nv, NULL, 0);
            free(p);
            /* a vision-language model keeps its own config (vision_config) and image processor */
            if (st == AT_OK && t->vision && model_dir) {
                for (size_t i = 0; st == AT_OK && i < 3; i++) {
                    static const char *const own[] = {"config.json", "preprocessor_config.json", "chat_template.json"};
                    st = at_ckpt_copy_if_file(model_dir, own[i], dir);
                }
            } else if (st == AT_OK) {
                st = at_model_config_to_json(&t->dec->cfg, &cfg);
                if (st == AT_OK) {
                    p = at_path_join(dir, "config.json");
                    st = at_write_file_atomic(p, cfg, strlen(cfg));
                    free(p);
                }
            }
            /* and the tokenizer and generation config: the folder loads as the model did */
            const char *tok_dir = t->a->tokenizer ? (at_is_dir(t->a->tokenizer) ? t->a->tokenizer : NULL) : model_dir;
            if (st == AT_OK)
                st = at_ckpt_write_standalone(dir, tok_dir, model_dir, t->tok, t->tmpl, t->max_length);
        }
        free(cfg);
        free(pg);
        free((void *)ts);
        free(shapes);
    } else if (st == AT_OK) {
        st = at_adapter_save_with(t->adapter, dir, vt, nv);
    }
    free((void *)vt);
    free(vs);
    if (st == AT_OK && t->obj->ops->save) st = t->obj->ops->save(t->obj, dir);
    if (st == AT_OK) {
        char *p = at_path_join(dir, "trainer_state.safetensors");
        char sstep[32], sseed[32], stok[32], sscale[64], sgood[32];
        snprintf(sscale, sizeof sscale, "%.17g", t->scaler.scale);
        snprintf(sgood, sizeof sgood, "%d", t->scaler.good_steps);
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
static at_status load_weights(at_trainer *t, const char *ckpt)
{
    if (t->vision) AT_TRY(at_vision_ckpt_load(t->vision, ckpt, 1));
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
    for (int i = 0; st == AT_OK && i < t->opt.n - t->n_vis_params; i++) { /* the tower's: load_vision */
        at_tensor *src = NULL, *dst = t->opt.params[i].param;
        st = at_st_get(m, dst->name, dst->ndim, dst->shape, AT_F32, &src);
        if (st == AT_OK) st = at_tensor_upload(dst, at_tensor_data(src), at_tensor_nbytes(src));
        at_tensor_free(src);
    }
    at_st_model_close(m);
    return st;
}

at_status at_trainer_load_best(at_trainer *t, at_train_result *res)
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

at_status at_trainer_resume(at_trainer *t, int64_t *start_step)
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
        if (ls && t->a->loss_scaling) t->scaler.scale = strtod(ls, NULL);
        if (lg && t->a->loss_scaling) t->scaler.good_steps = (int)strtol(lg, NULL, 10);
        at_st_close(f);
    }
    if (st == AT_OK && *start_step >= t->total_steps)
        st = at_error(AT_ERR_INVALID, "%s is finished: %s is step %lld of its %lld; nothing to resume (to train "
                      "on from it, start a new run with %s %s)", run_dir, ckpt, (long long)*start_step,
                      (long long)t->total_steps, t->a->full ? "--model" : "--adapters", ckpt);
    if (st == AT_OK) st = load_weights(t, ckpt);
    if (st == AT_OK && t->obj->ops->load) st = t->obj->ops->load(t->obj, ckpt);
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

at_status at_trainer_open_run_dir(at_trainer *t)
{
    const at_train_args *a = t->a;
    if (a->add_version) {
        AT_TRY(at_run_dir_create(a->output_dir, &t->run_dir));
        t->run_dir_new = 1;
    } else { /* --add_version false: the run is output_dir itself (never removed) */
        if (!a->output_dir[0]) return at_error(AT_ERR_INVALID, "--output_dir is empty");
        AT_TRY(at_mkdirs(a->output_dir));
        t->run_dir = strdup(a->output_dir);
        if (!t->run_dir) return at_error(AT_ERR_NOMEM, "out of memory");
    }
    return at_run_lock_take(t->run_dir, &t->lock);
}
