#include "train/optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/safetensors.h"
#include "ops/ops.h"

at_status at_optimizer_init(at_optimizer *o, at_decoder *d, const at_decoder_grads *g, const at_adamw_config *cfg)
{
    return at_optimizer_init_ex(o, d, g, NULL, 0, cfg);
}

at_status at_optimizer_init_ex(at_optimizer *o, at_decoder *d, const at_decoder_grads *g, const at_param_grad *extra,
                               int n_extra, const at_adamw_config *cfg)
{
    memset(o, 0, sizeof *o);
    int nd = at_decoder_trainables(d, g, NULL, 0), n = nd + n_extra;
    if (n <= 0) return at_error(AT_ERR_INVALID, "nothing to train");
    at_param_grad *all = calloc((size_t)n, sizeof *all);
    if (!all) return at_error(AT_ERR_NOMEM, "out of memory");
    at_decoder_trainables(d, g, all, nd);
    for (int i = 0; i < n_extra; i++) all[nd + i] = extra[i];
    at_status st = at_optimizer_init_list(o, d->be, all, n, cfg);
    free(all);
    return st;
}

at_status at_optimizer_init_list(at_optimizer *o, at_backend *be, const at_param_grad *params, int n,
                                 const at_adamw_config *cfg)
{
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    if (n <= 0) return at_error(AT_ERR_INVALID, "nothing to train");
    o->n = n;
    o->params = calloc((size_t)n, sizeof *o->params);
    o->m = calloc((size_t)n, sizeof *o->m);
    o->v = calloc((size_t)n, sizeof *o->v);
    o->lr_scale = malloc((size_t)n * sizeof *o->lr_scale);
    o->held = calloc((size_t)n, sizeof *o->held);
    at_status st = AT_OK;
    if (!o->params || !o->m || !o->v || !o->lr_scale || !o->held) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        o->params[i] = params[i];
        o->lr_scale[i] = 1.0;
    }
    for (int i = 0; i < n; i++) {
        const at_tensor *p = o->params[i].param;
        char name[AT_NAME_MAX + 16];
        snprintf(name, sizeof name, "exp_avg.%s", p->name);
        AT_CHECK(at_tensor_zeros(p->buf->backend, AT_F32, p->ndim, p->shape, name, &o->m[i]));
        snprintf(name, sizeof name, "exp_avg_sq.%s", p->name);
        AT_CHECK(at_tensor_zeros(p->buf->backend, AT_F32, p->ndim, p->shape, name, &o->v[i]));
    }
    int64_t count = n;
    AT_CHECK(at_tensor_zeros(be, AT_F32, 1, &count, "grad_sumsq", &o->sumsq));
    o->sumsq_host = calloc((size_t)n, sizeof *o->sumsq_host);
    if (!o->sumsq_host) st = at_error(AT_ERR_NOMEM, "out of memory");
done:
    if (st != AT_OK) at_optimizer_free(o);
    return st;
}

void at_optimizer_set_group(at_optimizer *o, int i, double lr_scale, int64_t held)
{
    if (i < 0 || i >= o->n) return;
    o->lr_scale[i] = lr_scale;
    o->held[i] = held;
}

void at_optimizer_free(at_optimizer *o)
{
    for (int i = 0; i < o->n; i++) {
        if (o->m) at_tensor_free(o->m[i]);
        if (o->v) at_tensor_free(o->v[i]);
    }
    free(o->m);
    free(o->v);
    free(o->params);
    free(o->lr_scale);
    free(o->held);
    at_tensor_free(o->sumsq);
    free(o->sumsq_host);
    memset(o, 0, sizeof *o);
}

/* Each gradient's sum of squares goes to its own element of o->sumsq and
 * all of them come back in one download: on a GPU the host waits once per
 * step, not once per trainable tensor (hundreds with LoRA). */
at_status at_optimizer_grad_norm(at_optimizer *o, double *norm)
{
    double total = 0;
    for (int i = 0; i < o->n; i++) {
        at_tensor one;
        int64_t shape = 1;
        at_tensor_view_inplace(&one, o->sumsq, (size_t)i, 1, &shape);
        AT_TRY(at_sumsq(&one, o->params[i].grad));
    }
    AT_TRY(at_tensor_download(o->sumsq, o->sumsq_host, (size_t)o->n * sizeof *o->sumsq_host));
    for (int i = 0; i < o->n; i++) total += (double)o->sumsq_host[i];
    *norm = sqrt(total);
    return AT_OK;
}

at_status at_optimizer_step(at_optimizer *o, double lr, double grad_norm, double unscale)
{
    double clip = 1.0;
    if (o->cfg.max_grad_norm > 0 && grad_norm > o->cfg.max_grad_norm) clip = o->cfg.max_grad_norm / (grad_norm + 1e-6);
    o->step++;
    at_adamw_params p = {(float)lr, (float)o->cfg.beta1, (float)o->cfg.beta2, (float)o->cfg.eps,
                         (float)o->cfg.weight_decay, (float)(clip * unscale), o->step};
    for (int i = 0; i < o->n; i++) {
        if (o->step <= o->held[i]) continue; /* its group sits this update out */
        p.lr = (float)(lr * o->lr_scale[i]);
        p.step = o->step - o->held[i];
        AT_TRY(at_adamw(o->params[i].param, o->params[i].grad, o->m[i], o->v[i], &p));
    }
    return AT_OK;
}

at_status at_optimizer_save(const at_optimizer *o, const char *path, const char *const *meta_kv, int n_meta)
{
    const at_tensor **t = calloc((size_t)o->n * 2, sizeof *t);
    at_st_kv *kv = calloc((size_t)n_meta + 1, sizeof *kv);
    if (!t || !kv) {
        free((void *)t);
        free(kv);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < o->n; i++) {
        t[2 * i] = o->m[i];
        t[2 * i + 1] = o->v[i];
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    kv[0].key = "optimizer_step";
    kv[0].value = step;
    for (int i = 0; i < n_meta; i++) {
        kv[i + 1].key = meta_kv[2 * i];
        kv[i + 1].value = meta_kv[2 * i + 1];
    }
    at_status st = at_safetensors_write(path, (const at_tensor *const *)t, NULL, (size_t)o->n * 2, kv, (size_t)n_meta + 1);
    free((void *)t);
    free(kv);
    return st;
}

at_status at_optimizer_load(at_optimizer *o, const char *path)
{
    at_st_model *m = NULL;
    AT_TRY(at_st_model_open(path, &m));
    at_status st = AT_OK;
    const char *step = at_st_metadata(at_st_model_shard(m, 0), "optimizer_step");
    if (!step) {
        st = at_error(AT_ERR_FORMAT, "%s: no optimizer_step in the metadata", path);
        goto done;
    }
    o->step = strtoll(step, NULL, 10);
    for (int i = 0; i < o->n; i++) {
        at_tensor *pair[2] = {o->m[i], o->v[i]};
        for (int k = 0; k < 2; k++) {
            at_tensor *t = NULL;
            AT_CHECK(at_st_get(m, pair[k]->name, pair[k]->ndim, pair[k]->shape, AT_F32, &t));
            st = at_tensor_upload(pair[k], at_tensor_data(t), at_tensor_nbytes(t));
            at_tensor_free(t);
            if (st != AT_OK) goto done;
        }
    }
done:
    at_st_model_close(m);
    return st;
}
