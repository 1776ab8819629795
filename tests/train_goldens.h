/* Helpers shared by the training tests (test_backward.c, test_lora.c): the
 * training goldens of tools/make_goldens.py (NAME.train.golden.safetensors
 * and the PEFT adapter folder NAME_lora), a model + adapter + batch in one
 * struct, one forward/loss/backward, and comparisons of gradient tensors
 * against the golden ones by name. Header-only (static inline). */
#ifndef AT_TESTS_TRAIN_GOLDENS_H
#define AT_TESTS_TRAIN_GOLDENS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "decoder_goldens.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "ops/ops.h"
#include "testing.h"

typedef struct {
    at_decoder *d;
    at_adapter *ad;      /* the golden PEFT adapter (NULL when not loaded) */
    at_st_file *gf;      /* NAME.train.golden.safetensors */
    int B, T;
    int32_t *ids, *labels; /* host [B, T] */
    int64_t n_targets;     /* supervised targets of the batch (labels shifted by one) */
    at_tensor *t_ids, *t_labels;
} train_case;

static inline void tc_free(train_case *c)
{
    if (c->d) at_decoder_set_adapter(c->d, NULL);
    at_adapter_free(c->ad);
    at_decoder_free(c->d);
    if (c->gf) at_st_close(c->gf);
    free(c->ids);
    free(c->labels);
    at_tensor_free(c->t_ids);
    at_tensor_free(c->t_labels);
    memset(c, 0, sizeof *c);
}

/* Loads tests/data/goldens/NAME (weights converted to dtype), the golden
 * batch, and with `lora` the adapter NAME_lora set on the decoder. */
static inline at_status tc_open(train_case *c, const char *name, at_backend *be, at_dtype dtype, int lora)
{
    char path[256];
    at_status st = AT_OK;
    memset(c, 0, sizeof *c);
    at_load_options o = at_load_options_default();
    o.backend = be;
    o.dtype = dtype;
    snprintf(path, sizeof path, GOLDEN_DIR "/%s", name);
    AT_CHECK(at_decoder_load(path, &o, &c->d));
    if (lora) {
        snprintf(path, sizeof path, GOLDEN_DIR "/%s_lora", name);
        AT_CHECK(at_adapter_load(path, &c->d->cfg, c->d->be, &c->ad));
        AT_CHECK(at_decoder_set_adapter(c->d, c->ad));
    }
    snprintf(path, sizeof path, GOLDEN_DIR "/%s.train.golden.safetensors", name);
    AT_CHECK(at_st_open(path, &c->gf));
    int64_t shape[4] = {0};
    int nd = 0;
    AT_CHECK(golden_array(c->gf, "input_ids", AT_I32, (void **)&c->ids, shape, &nd));
    c->B = (int)shape[0];
    c->T = (int)shape[1];
    AT_CHECK(golden_array(c->gf, "labels", AT_I32, (void **)&c->labels, NULL, NULL));
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t + 1 < c->T; t++) c->n_targets += c->labels[b * c->T + t + 1] >= 0;
    int64_t sh[2] = {c->B, c->T};
    AT_CHECK(at_tensor_new(c->d->be, AT_I32, 2, sh, "ids", &c->t_ids));
    AT_CHECK(at_tensor_upload(c->t_ids, c->ids, (size_t)c->B * c->T * sizeof(int32_t)));
    AT_CHECK(at_tensor_new(c->d->be, AT_I32, 2, sh, "labels", &c->t_labels));
    AT_CHECK(at_tensor_upload(c->t_labels, c->labels, (size_t)c->B * c->T * sizeof(int32_t)));
done:
    if (st != AT_OK) tc_free(c);
    return st;
}

/* A golden scalar (f32 [1] or i32 [1]) as double. */
static inline double tc_scalar(const train_case *c, const char *name)
{
    const at_st_info *info = at_st_find(c->gf, name);
    if (!info) return NAN;
    if (info->dtype == AT_I32) {
        int32_t *v = NULL;
        if (golden_array(c->gf, name, AT_I32, (void **)&v, NULL, NULL) != AT_OK) return NAN;
        double x = v[0];
        free(v);
        return x;
    }
    float *v = NULL;
    if (golden_array(c->gf, name, AT_F32, (void **)&v, NULL, NULL) != AT_OK) return NAN;
    double x = v[0];
    free(v);
    return x;
}

/* Host copy of a tensor converted to f32 (caller frees). */
static inline float *tc_host(const at_tensor *t)
{
    int64_t n = at_tensor_numel(t);
    float *out = malloc((size_t)n * sizeof *out);
    if (!out) return NULL;
    if (t->dtype == AT_F32) {
        if (at_tensor_download(t, out, (size_t)n * sizeof *out) != AT_OK) {
            free(out);
            return NULL;
        }
        return out;
    }
    at_tensor *f = NULL;
    if (at_tensor_new(t->buf->backend, AT_F32, t->ndim, t->shape, "tmp", &f) != AT_OK || at_cast(f, t) != AT_OK ||
        at_tensor_download(f, out, (size_t)n * sizeof *out) != AT_OK) {
        free(out);
        out = NULL;
    }
    at_tensor_free(f);
    return out;
}

/* max |got − want| / max |want| of tensor t against golden PREFIX + t->name;
 * −1 when the golden tensor is missing or the sizes differ. */
static inline double tc_rel_err(const train_case *c, const char *prefix, const at_tensor *t)
{
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    const at_st_info *info = at_st_find(c->gf, name);
    if (!info) {
        fprintf(stderr, "golden %s missing\n", name);
        return -1;
    }
    float *want = NULL, *got = tc_host(t);
    int64_t shape[4] = {1, 1, 1, 1};
    int nd = 0;
    double err = -1;
    if (got && golden_array(c->gf, name, AT_F32, (void **)&want, shape, &nd) == AT_OK) {
        int64_t n = 1;
        for (int i = 0; i < nd; i++) n *= shape[i];
        if (n == at_tensor_numel(t)) err = at_test_max_rel_err(got, want, (size_t)n, 0);
    }
    free(want);
    free(got);
    return err;
}

/* One forward + loss + backward of the golden batch into g (zeroed first),
 * with grad_scale 1/n_targets (the mean loss, as the goldens). */
static inline at_status tc_step(train_case *c, unsigned flags, at_decoder_grads *g, float dropout, uint64_t seed,
                                at_loss_stats *stats)
{
    at_decoder_acts *a = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_decoder_acts_new_ex(c->d, c->B, c->T, flags, &a));
    if (g) AT_CHECK(at_decoder_grads_zero(g));
    AT_CHECK(at_decoder_forward_backward(c->d, a, c->t_ids, NULL, NULL, c->t_labels, dropout, seed,
                                         1.0f / (float)c->n_targets, g, stats));
done:
    at_decoder_acts_free(a);
    return st;
}

/* The largest relative error over the gradients of g against the golden
 * PREFIX.<name> tensors (LoRA: "lora.", full: "full."); prints the worst. */
static inline double tc_grads_err(const train_case *c, at_decoder_grads *g, const char *prefix, const char *what)
{
    int n = at_decoder_trainables(c->d, g, NULL, 0);
    at_param_grad *pg = malloc((size_t)(n > 0 ? n : 1) * sizeof *pg);
    if (!pg) return 1e9;
    at_decoder_trainables(c->d, g, pg, n);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        double e = tc_rel_err(c, prefix, pg[i].grad);
        if (e < 0) e = 1e9;
        if (!(e <= worst)) {
            worst = e;
            worst_name = pg[i].grad->name;
        }
    }
    printf("  %-28s %3d gradients, worst rel err %.2e (%s)\n", what, n, worst, worst_name);
    free(pg);
    return worst;
}

#endif
