/* The causal-LM objectives: sft (conversations, the assistant's tokens
 * trained) and pt (plain text, every token). The loss is the mean of
 * −log p(target) over every supervised token of the optimizer step (all its
 * micro-batches and ranks: token-weighted, as transformers >= 4.46 does). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "data/media.h"
#include "train/objective.h"
#include "train/vlm_step.h"

typedef struct {
    at_encoded *train, *val;
    size_t *train_len, *val_len;
    at_sample_images *train_img, *val_img; /* each encoded sample's images (vision-language models) */
    int has_images;                        /* some sample has images */
    at_image_processor proc;               /* a vision-language model's (valid when vision) */
    int vision;
    at_mrope_tokens mrope;                 /* valid when use_mrope */
    int use_mrope;
} lm_data;

static void free_encoded(at_encoded *e, size_t n)
{
    for (size_t i = 0; e && i < n; i++) at_encoded_free(&e[i]);
    free(e);
}

/* A sample with images: the <|image_pad|> tokens of each image (its size
 * after the processor's resize: each image is decoded), then the encoding
 * with the pads expanded (data/media.h). Errors name file:line and the image. */
static at_status encode_images(const at_obj_data_env *env, const at_sample *s, at_encoded *e, int *drop)
{
    if (!env->vision)
        return at_error(AT_ERR_UNSUPPORTED, "%s:%d: the sample has %zu image(s) and the model no vision tower (a "
                        "Qwen2-VL or Qwen2.5-VL folder takes images)", s->source, s->line, s->n_images);
    size_t *counts = calloc(s->n_images, sizeof *counts);
    if (!counts) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    for (size_t i = 0; i < s->n_images && st == AT_OK; i++) {
        st = at_media_image_tokens(env->vision, s->images[i], 0, &counts[i]);
        if (st != AT_OK)
            at_error_wrap(st, "%s:%d: image %zu of the sample", s->source, s->line, i + 1);
    }
    if (st == AT_OK) st = at_media_encode(env->enc, s, env->image_pad, counts, e, drop);
    if (st != AT_OK && !strstr(at_last_error(), s->source)) at_error_wrap(st, "%s:%d", s->source, s->line);
    free(counts);
    return st;
}

static at_status encode_list(const at_obj_data_env *env, const at_sample_list *list, at_encoded **out,
                             size_t **lens, at_sample_images **imgs, size_t *n_out, const char *what)
{
    at_encoded *e = calloc(list->n ? list->n : 1, sizeof *e);
    size_t *len = calloc(list->n ? list->n : 1, sizeof *len);
    at_sample_images *im = calloc(list->n ? list->n : 1, sizeof *im);
    if (!e || !len || !im) {
        free(e);
        free(len);
        free(im);
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
        } else if (s->n_images > 0) {
            st = encode_images(env, s, &e[n], &drop);
        } else {
            st = at_encode_sample(env->enc, s, &e[n], &drop);
        }
        if (st == AT_OK && !drop && s->kind == AT_SAMPLE_TEXT) /* pt: documents stay apart */
            st = at_encoded_frame(&e[n], env->bos, env->eos);
        if (st != AT_OK) {
            if (env->strict) break;
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
        im[n] = (at_sample_images){s->images, s->n_images, s->source, s->line};
        n++;
    }
    if (st != AT_OK) {
        free_encoded(e, n);
        free(len);
        free(im);
        return st;
    }
    at_log_info("%s: %zu samples encoded (%zu longer than --max_length %d dropped, %zu failed, %zu without "
                "trained tokens)", what, n, dropped, env->max_length, failed, no_labels);
    *out = e;
    *lens = len;
    *imgs = im;
    *n_out = n;
    return AT_OK;
}

static at_status lm_prepare(at_objective *o, const at_obj_data_env *env, const at_sample_list *train,
                            const at_sample_list *val)
{
    lm_data *d = calloc(1, sizeof *d);
    if (!d) return at_error(AT_ERR_NOMEM, "out of memory");
    o->impl = d;
    if (env->vision) {
        d->proc = *env->vision;
        d->vision = 1;
    }
    if (env->mrope) {
        d->mrope = *env->mrope;
        d->use_mrope = 1;
    }
    AT_TRY(encode_list(env, train, &d->train, &d->train_len, &d->train_img, &o->n_train, "train"));
    o->train_len = d->train_len;
    if (val->n) AT_TRY(encode_list(env, val, &d->val, &d->val_len, &d->val_img, &o->n_val, "eval"));
    o->val_len = d->val_len;
    for (size_t i = 0; i < o->n_train; i++) d->has_images |= d->train_img[i].n > 0;
    for (size_t i = 0; i < o->n_val; i++) d->has_images |= d->val_img[i].n > 0;
    if (o->n_train == 0) return at_error(AT_ERR_INVALID, "no training sample left after encoding (see the warnings above)");
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

/* Batch b of plan over samples e (images imgs): the token arrays, and for a
 * vision-language model the images' patches and the M-RoPE positions (each
 * packed sample's own, from 0: vlm_step.h). */
static at_status build_batch(const lm_data *d, const at_batch_plan *plan, size_t b, const at_encoded *e,
                             const at_sample_images *imgs, size_t n, int32_t pad, at_batch *out)
{
    at_status st = at_batch_build(plan, b, e, n, pad, out);
    if (st == AT_OK && d->has_images) st = at_batch_add_images(out, plan, b, imgs, n, &d->proc);
    if (st == AT_OK && d->use_mrope) {
        out->mpos = malloc(out->rows * out->cols * 3 * sizeof *out->mpos);
        if (!out->mpos) st = at_error(AT_ERR_NOMEM, "out of memory");
        else st = at_vlm_batch_positions(&d->mrope, out->ids, out->segments, out->lengths, out->rows, out->cols,
                                         (const int32_t(*)[3])out->grid_thw, out->n_images, out->mpos);
    }
    if (st != AT_OK) at_batch_free(out);
    return st;
}

/* counts[0]: the batch's supervised tokens */
static at_status lm_build(const at_objective *o, const at_batch_plan *plan, size_t b, int32_t pad, at_batch *out,
                          double *counts)
{
    const lm_data *d = o->impl;
    AT_TRY(build_batch(d, plan, b, d->train, d->train_img, o->n_train, pad, out));
    counts[0] = (double)count_targets(out);
    return AT_OK;
}

/* The forward, loss and (with g) backward of batch b (on the host) and bt
 * (on the device): the vision-language step (train/vlm_step.h) with the
 * batch's images, which is the decoder's step alone when it has none. */
static at_status step(at_decoder *d, at_vision *v, at_decoder_acts *acts, const at_batch *b,
                      const at_batch_tensors *bt, const at_fwd_opts *fo, float grad_scale, at_decoder_grads *g,
                      at_loss_stats *ls)
{
    at_vlm_images im = {b->pixels, (int64_t)b->n_patches, (const int32_t(*)[3])b->grid_thw, (int)b->n_images,
                        v ? at_vision_get_config(v)->image_token_id : -1};
    return at_vlm_forward_backward(d, v, acts, b->ids, bt->ids, bt->pos, bt->seg, bt->labels, &im, fo, grad_scale, g,
                                   ls);
}

/* stats[0]: Σ −log p over the micro-batch's targets; the gradient is that of
 * scale · stats[0] / (the step's targets). */
static at_status lm_forward_backward(at_objective *o, at_decoder *d, at_decoder_acts *acts, const at_obj_micro *m,
                                     at_decoder_grads *g, double *stats)
{
    (void)o;
    at_loss_stats ls = {0};
    at_status st = step(d, m->vision, acts, m->batch, m->t, &m->fwd, (float)(m->scale / m->step_counts[0]),
                        g, &ls);
    stats[0] += ls.loss_sum;
    return st;
}

static double lm_loss(const at_objective *o, const double *stats, const double *counts)
{
    (void)o;
    return counts[0] > 0 ? stats[0] / counts[0] : NAN;
}

/* Loss of the validation samples, token-weighted, no gradients. */
static at_status lm_evaluate(at_objective *o, const at_obj_eval_env *env, double *eval_loss)
{
    const lm_data *dd = o->impl;
    at_batch_plan plan = {0};
    AT_TRY(at_batch_plan_make(dd->val_len, o->n_val, &env->batch, &plan));
    double sum = 0;
    int64_t n = 0;
    at_status st = AT_OK;
    for (size_t b = 0; b < plan.n_batches && st == AT_OK; b++) {
        at_batch batch = {0};
        at_batch_tensors bt = {0};
        st = build_batch(dd, &plan, b, dd->val, dd->val_img, o->n_val, 0, &batch);
        if (st == AT_OK) st = at_batch_tensors_upload(env->d->be, &batch, env->packing, &bt);
        at_decoder_acts **acts = env->acts;
        /* images go in through the training forward's injection (no backward without gradients) */
        unsigned flags = batch.n_images ? AT_ACTS_TRAIN : AT_ACTS_LOSS;
        if (st == AT_OK && !(*acts && (*acts)->B == (int)batch.rows && (*acts)->T == (int)batch.cols &&
                             (*acts)->flags == flags)) {
            at_decoder_acts_free(*acts);
            *acts = NULL;
            st = at_decoder_acts_new_ex(env->d, (int)batch.rows, (int)batch.cols, flags, acts);
        }
        at_loss_stats stats = {0};
        if (st == AT_OK && batch.n_images) {
            at_fwd_opts fo = {0};
            st = step(env->d, env->vision, *acts, &batch, &bt, &fo, 1.0f, NULL, &stats);
        } else {
            if (st == AT_OK) st = at_decoder_forward(env->d, *acts, bt.ids, bt.pos, bt.seg);
            if (st == AT_OK) st = at_decoder_loss(env->d, *acts, bt.labels, 1.0f, NULL, &stats);
        }
        sum += stats.loss_sum;
        n += stats.n_targets;
        at_batch_tensors_free(&bt);
        at_batch_free(&batch);
    }
    at_batch_plan_free(&plan);
    *eval_loss = n ? sum / (double)n : NAN;
    return st;
}

static void lm_free(at_objective *o)
{
    lm_data *d = o->impl;
    if (!d) return;
    free_encoded(d->train, o->n_train);
    free_encoded(d->val, o->n_val);
    free(d->train_len);
    free(d->val_len);
    free(d->train_img);
    free(d->val_img);
    free(d);
}

const at_objective_ops at_objective_sft = {
    .name = "sft", .rows_per_item = 1, .n_counts = 1, .n_stats = 1, .packs = 1, .plain_text = 0,
    .prepare = lm_prepare, .reference = NULL, .build = lm_build, .forward_backward = lm_forward_backward,
    .loss = lm_loss, .log = NULL, .evaluate = lm_evaluate, .free = lm_free,
};

/* pt: the same loss; its datasets are read as documents (data/dataset.h's
 * text format), every token of which is a target. */
const at_objective_ops at_objective_pt = {
    .name = "pt", .rows_per_item = 1, .n_counts = 1, .n_stats = 1, .packs = 1, .plain_text = 1,
    .prepare = lm_prepare, .reference = NULL, .build = lm_build, .forward_backward = lm_forward_backward,
    .loss = lm_loss, .log = NULL, .evaluate = lm_evaluate, .free = lm_free,
};
