#include "eval/loss_eval.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/log.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "train/text_pipeline.h"

at_status at_loss_eval_encode(const at_bundle *b, const char *const *specs, size_t n_specs,
                              const at_loss_eval_options *o, at_encoded **out, size_t *n, at_loss_eval_result *counts)
{
    *out = NULL;
    *n = 0;
    at_dataset_options dopt = {0};
    dopt.seed = o->seed;
    dopt.strict = o->strict;
    dopt.model_name = o->model_name;
    dopt.model_author = o->model_author;
    if (o->pt) dopt.format = AT_FORMAT_TEXT;
    at_dataset *ds = NULL;
    at_text_pipeline pipe;
    int pipe_ready = 0;
    at_encoded *e = NULL;
    size_t k = 0, n_e = 0;
    at_status st = AT_OK;
    AT_CHECK(at_dataset_load(specs, n_specs, &dopt, &ds));
    at_log_info("%s", ds->summary);
    AT_CHECK(at_text_pipeline_init(&pipe, b->tokenizer, b->tmpl, o->last_turn_only));
    pipe_ready = 1;
    at_encoder enc;
    at_text_pipeline_encoder(&pipe, &enc);
    int max_len = at_bundle_context(b, o->max_length);
    enc.max_length = (size_t)max_len;
    enc.truncation = o->truncation;
    const at_sample_list *list = &ds->train;
    e = calloc(list->n ? list->n : 1, sizeof *e);
    if (!e) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    n_e = list->n;
    for (size_t i = 0; i < list->n; i++) {
        const at_sample *s = list->items[i];
        int drop = 0;
        if (s->kind == AT_SAMPLE_PREFERENCE)
            st = at_error(AT_ERR_INVALID, "%s:%d: a preference pair; eval takes conversations or texts", s->source,
                          s->line);
        else
            st = at_encode_sample(&enc, s, &e[k], &drop);
        if (st == AT_OK && !drop && s->kind == AT_SAMPLE_TEXT) {
            st = at_encoded_frame(&e[k], at_tokenizer_bos(b->tokenizer), at_tokenizer_eos(b->tokenizer));
            /* framing adds two tokens: keep within the length asked for */
            if (st == AT_OK && e[k].n > (size_t)max_len) st = at_encode_truncate(&e[k], (size_t)max_len, o->truncation,
                                                                                  &drop);
        }
        if (st != AT_OK) {
            if (o->strict) goto done;
            if (counts->n_failed++ < 5) at_log_warn("skipping a sample: %s", at_last_error());
            at_encoded_free(&e[k]);
            st = AT_OK;
            continue;
        }
        if (drop) {
            counts->n_dropped++;
            continue;
        }
        int any = 0;
        for (size_t t = 1; t < e[k].n && !any; t++) any = e[k].labels[t] != AT_IGNORE_INDEX;
        if (!any) {
            counts->n_no_targets++;
            at_encoded_free(&e[k]);
            continue;
        }
        k++;
    }
    if (k == 0) {
        st = at_error(AT_ERR_INVALID, "no sample to evaluate: %zu longer than --max_length %d, %zu failed, %zu without "
                      "supervised tokens", counts->n_dropped, max_len, counts->n_failed, counts->n_no_targets);
        goto done;
    }
    *out = e;
    *n = k;
    e = NULL;
done:
    if (e) {
        /* up to the sample a strict stop left half-made; the rest are empty */
        for (size_t i = 0; i <= k && i < n_e; i++) at_encoded_free(&e[i]);
        free(e);
    }
    if (pipe_ready) at_text_pipeline_free(&pipe);
    at_dataset_free(ds);
    return st;
}

static at_status upload_i32(at_backend *be, const int32_t *host, size_t rows, size_t cols, const char *name,
                            at_tensor **out)
{
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    AT_TRY(at_tensor_new(be, AT_I32, 2, shape, name, out));
    return at_tensor_upload(*out, host, rows * cols * sizeof(int32_t));
}

at_status at_loss_eval_encoded(at_decoder *d, const at_encoded *e, size_t n, int batch_size,
                               at_loss_eval_result *out)
{
    size_t *len = malloc((n ? n : 1) * sizeof *len);
    if (!len) return at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) len[i] = e[i].n;
    /* rows of similar length together: less padding; the sum does not care about order */
    at_batch_options bo = {0};
    bo.batch_size = batch_size > 0 ? (size_t)batch_size : 4;
    bo.group_by_length = 1;
    at_batch_plan plan = {0};
    at_decoder_acts *acts = NULL;
    at_status st = at_batch_plan_make(len, n, &bo, &plan);
    free(len);
    if (st != AT_OK) return st;
    double sum = 0;
    int64_t targets = 0;
    for (size_t bi = 0; bi < plan.n_batches && st == AT_OK; bi++) {
        at_batch batch = {0};
        at_tensor *ids = NULL, *pos = NULL, *labels = NULL;
        st = at_batch_build(&plan, bi, e, n, 0, &batch);
        if (st == AT_OK) st = upload_i32(d->be, batch.ids, batch.rows, batch.cols, "input_ids", &ids);
        if (st == AT_OK) st = upload_i32(d->be, batch.positions, batch.rows, batch.cols, "position_ids", &pos);
        if (st == AT_OK) st = upload_i32(d->be, batch.labels, batch.rows, batch.cols, "labels", &labels);
        if (st == AT_OK && (!acts || acts->B != (int)batch.rows || acts->T != (int)batch.cols)) {
            at_decoder_acts_free(acts);
            acts = NULL;
            st = at_decoder_acts_new_ex(d, (int)batch.rows, (int)batch.cols, AT_ACTS_LOSS, &acts);
        }
        if (st == AT_OK) st = at_decoder_forward(d, acts, ids, pos, NULL);
        at_loss_stats ls = {0};
        if (st == AT_OK) st = at_decoder_loss(d, acts, labels, 1.0f, NULL, &ls);
        sum += ls.loss_sum;
        targets += ls.n_targets;
        at_tensor_free(ids);
        at_tensor_free(pos);
        at_tensor_free(labels);
        at_batch_free(&batch);
    }
    at_decoder_acts_free(acts);
    at_batch_plan_free(&plan);
    if (st != AT_OK) return st;
    out->loss_sum = sum;
    out->n_targets = targets;
    out->loss = targets ? sum / (double)targets : NAN;
    out->perplexity = exp(out->loss);
    out->n_samples = n;
    return AT_OK;
}

at_status at_loss_eval_run(at_bundle *b, const char *const *specs, size_t n_specs, const at_loss_eval_options *o,
                           at_loss_eval_result *out)
{
    memset(out, 0, sizeof *out);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    at_encoded *e = NULL;
    size_t n = 0;
    AT_TRY(at_loss_eval_encode(b, specs, n_specs, o, &e, &n, out));
    at_status st = at_loss_eval_encoded(b->decoder, e, n, o->batch_size, out);
    for (size_t i = 0; i < n; i++) at_encoded_free(&e[i]);
    free(e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return st;
}
