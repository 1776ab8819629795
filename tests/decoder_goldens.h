/* Helpers shared by the decoder tests: reading the PyTorch goldens made by
 * tools/make_goldens.py, a backend running the reference kernels, and
 * comparisons. Header-only (static inline) so each test program stays one
 * file. */
#ifndef AT_TESTS_DECODER_GOLDENS_H
#define AT_TESTS_DECODER_GOLDENS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device/cpu/cpu_backend.h"
#include "device/ref/ref_ops.h"
#include "model/safetensors.h"

#define GOLDEN_DIR "tests/data/goldens"

typedef struct {
    int B, T, V;
    int32_t *ids;    /* [B, T] */
    int32_t *len;    /* [B] */
    float *logits;   /* [B, T, V] */
    float *inv_freq; /* [D/2] or NULL */
    int n_inv;
} golden;

static inline void golden_free(golden *g)
{
    free(g->ids);
    free(g->len);
    free(g->logits);
    free(g->inv_freq);
    memset(g, 0, sizeof *g);
}

/* Copies tensor `name` of f (converted to dtype) into a new host array. */
static inline at_status golden_array(const at_st_file *f, const char *name, at_dtype dt, void **out, int64_t *shape,
                                     int *ndim)
{
    const at_st_info *info = at_st_find(f, name);
    if (!info) return at_error(AT_ERR_NOT_FOUND, "golden: %s missing", name);
    at_tensor *t;
    AT_TRY(at_st_tensor(info, dt, &t));
    size_t n = at_tensor_nbytes(t);
    *out = malloc(n);
    if (!*out) {
        at_tensor_free(t);
        return at_error(AT_ERR_NOMEM, "golden: out of memory");
    }
    memcpy(*out, at_tensor_data(t), n);
    if (shape)
        for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    if (ndim) *ndim = t->ndim;
    at_tensor_free(t);
    return AT_OK;
}

/* Reads tests/data/goldens/NAME.golden.safetensors. */
static inline at_status golden_load(const char *name, golden *g)
{
    char path[256];
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, GOLDEN_DIR "/%s.golden.safetensors", name);
    at_st_file *f;
    AT_TRY(at_st_open(path, &f));
    int64_t shape[4] = {0};
    int nd = 0;
    at_status st = golden_array(f, "logits", AT_F32, (void **)&g->logits, shape, &nd);
    if (st == AT_OK) {
        g->B = (int)shape[0];
        g->T = (int)shape[1];
        g->V = (int)shape[2];
        st = golden_array(f, "input_ids", AT_I32, (void **)&g->ids, NULL, NULL);
    }
    if (st == AT_OK) st = golden_array(f, "lengths", AT_I32, (void **)&g->len, NULL, NULL);
    if (st == AT_OK && at_st_find(f, "inv_freq")) {
        st = golden_array(f, "inv_freq", AT_F32, (void **)&g->inv_freq, shape, &nd);
        g->n_inv = (int)shape[0];
    }
    at_st_close(f);
    if (st != AT_OK) golden_free(g);
    return st;
}

/* max |got - want| / max |want| over sequence b's valid positions; got is
 * [*, T, V] with row stride T·V per sequence (or pass T = 1 and one row). */
static inline double golden_rel_err_seq(const golden *g, int b, const float *got, int got_T, int t0, int t1)
{
    double maxd = 0, maxw = 0;
    for (int t = t0; t < t1; t++) {
        const float *w = g->logits + ((size_t)b * g->T + t) * g->V;
        const float *x = got + ((size_t)b * got_T + t) * g->V;
        for (int v = 0; v < g->V; v++) {
            double d = fabs((double)x[v] - (double)w[v]);
            if (!(d <= maxd)) maxd = d; /* NaN propagates */
            if (fabs(w[v]) > maxw) maxw = fabs(w[v]);
        }
    }
    return maxw > 0 ? maxd / maxw : maxd;
}

/* Relative error of one row of V logits against golden row (b, t). */
static inline double golden_rel_err_row(const golden *g, int b, int t, const float *row)
{
    const float *w = g->logits + ((size_t)b * g->T + t) * g->V;
    double maxd = 0, maxw = 0;
    for (int v = 0; v < g->V; v++) {
        double d = fabs((double)row[v] - (double)w[v]);
        if (!(d <= maxd)) maxd = d;
        if (fabs(w[v]) > maxw) maxw = fabs(w[v]);
    }
    return maxw > 0 ? maxd / maxw : maxd;
}

/* A host backend whose operations are the reference kernels (device/ref):
 * the decoder on it is checked against kernels written independently of the
 * CPU backend's optimized ones. */
static inline at_backend *golden_ref_backend(void)
{
    static at_backend ref;
    static int made;
    if (!made) {
        ref = *at_cpu_backend();
        snprintf(ref.name, sizeof ref.name, "ref");
        ref.kind = AT_DEVICE_TEST;
        ref.ops = *at_ref_ops();
        ref.fallback_warned = 0;
        made = 1;
    }
    return &ref;
}

#endif
