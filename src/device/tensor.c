#include "device/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device/backend.h"
#include "device/cpu/cpu_backend.h"

void at_tensor_set_name(at_tensor *t, const char *name)
{
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
}

static at_status check_shape(int ndim, const int64_t *shape, const char *name)
{
    if (ndim < 1 || ndim > AT_MAX_DIMS)
        return at_error(AT_ERR_INVALID, "tensor %s: %d dimensions (1 to %d allowed)", name ? name : "?", ndim,
                        AT_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || shape[i] > ((int64_t)1 << 40))
            return at_error(AT_ERR_INVALID, "tensor %s: dimension %d has size %lld", name ? name : "?", i,
                            (long long)shape[i]);
    return AT_OK;
}

static void init_header(at_tensor *t, at_dtype dtype, int ndim, const int64_t *shape, const char *name)
{
    memset(t, 0, sizeof *t);
    at_tensor_set_name(t, name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < AT_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
}

/* A checked tensor header and an empty buffer record (one refcount): the
 * common start of at_tensor_new and at_tensor_wrap. */
static at_status new_header(at_dtype dtype, int ndim, const int64_t *shape, const char *name, at_tensor **t,
                            at_buffer **b)
{
    AT_TRY(check_shape(ndim, shape, name));
    *t = malloc(sizeof **t);
    *b = calloc(1, sizeof **b);
    if (!*t || !*b) {
        free(*t);
        free(*b);
        return at_error(AT_ERR_NOMEM, "tensor %s: out of host memory", name ? name : "?");
    }
    init_header(*t, dtype, ndim, shape, name);
    (*b)->refcount = 1;
    return AT_OK;
}

at_status at_tensor_new(at_backend *backend, at_dtype dtype, int ndim, const int64_t *shape, const char *name,
                        at_tensor **out)
{
    *out = NULL;
    at_tensor *t;
    at_buffer *b;
    AT_TRY(new_header(dtype, ndim, shape, name, &t, &b));
    size_t bytes = at_tensor_nbytes(t);
    b->backend = backend;
    b->size = bytes;
    at_status st = backend->alloc(backend, bytes ? bytes : 1, &b->ptr);
    if (st != AT_OK) {
        free(t);
        free(b);
        return at_error_wrap(st, "tensor %s (%zu bytes on %s)", name ? name : "?", bytes, backend->name);
    }
    t->buf = b;
    *out = t;
    return AT_OK;
}

at_status at_tensor_zeros(at_backend *backend, at_dtype dtype, int ndim, const int64_t *shape, const char *name,
                          at_tensor **out)
{
    AT_TRY(at_tensor_new(backend, dtype, ndim, shape, name, out));
    at_tensor *t = *out;
    size_t n = at_tensor_nbytes(t);
    if (backend->is_host) {
        memset(t->buf->ptr, 0, n);
        return AT_OK;
    }
    void *z = calloc(1, n ? n : 1);
    if (!z) {
        at_tensor_free(t);
        *out = NULL;
        return at_error(AT_ERR_NOMEM, "tensor %s: out of host memory", name ? name : "?");
    }
    at_status st = backend->upload(backend, t->buf->ptr, z, n);
    free(z);
    if (st != AT_OK) {
        at_tensor_free(t);
        *out = NULL;
    }
    return st;
}

at_status at_tensor_wrap(void *data, at_dtype dtype, int ndim, const int64_t *shape, const char *name,
                         at_tensor **out)
{
    *out = NULL;
    at_tensor *t;
    at_buffer *b;
    AT_TRY(new_header(dtype, ndim, shape, name, &t, &b));
    b->backend = at_cpu_backend();
    b->ptr = data;
    b->size = at_tensor_nbytes(t);
    b->external = 1;
    t->buf = b;
    *out = t;
    return AT_OK;
}

at_status at_tensor_view(const at_tensor *src, size_t elem_offset, int ndim, const int64_t *shape,
                         const char *name, at_tensor **out)
{
    *out = NULL;
    AT_TRY(check_shape(ndim, shape, name));
    at_tensor *t = malloc(sizeof *t);
    if (!t) return at_error(AT_ERR_NOMEM, "tensor %s: out of host memory", name ? name : "?");
    at_tensor_view_inplace(t, src, elem_offset, ndim, shape);
    if (name) at_tensor_set_name(t, name);
    if (t->offset + at_tensor_nbytes(t) > src->buf->size) {
        char d[160];
        free(t);
        return at_error(AT_ERR_INVALID, "view %s: outside of %s", name ? name : "?",
                        at_tensor_describe(src, d, sizeof d));
    }
    src->buf->refcount++;
    *out = t;
    return AT_OK;
}

void at_tensor_view_inplace(at_tensor *dst, const at_tensor *src, size_t elem_offset, int ndim,
                            const int64_t *shape)
{
    char name[AT_NAME_MAX];
    memcpy(name, src->name, sizeof name);
    init_header(dst, src->dtype, ndim, shape, name);
    dst->buf = src->buf;
    dst->offset = src->offset + at_dtype_bytes(src->dtype, elem_offset);
}

void at_tensor_free(at_tensor *t)
{
    if (!t) return;
    at_buffer *b = t->buf;
    if (b && --b->refcount == 0) {
        if (!b->external && b->ptr) b->backend->free(b->backend, b->ptr);
        free(b);
    }
    free(t);
}

int64_t at_tensor_numel(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t at_tensor_nbytes(const at_tensor *t) { return at_dtype_bytes(t->dtype, (size_t)at_tensor_numel(t)); }

int64_t at_tensor_cols(const at_tensor *t) { return t->shape[t->ndim - 1]; }

int64_t at_tensor_rows(const at_tensor *t)
{
    int64_t c = at_tensor_cols(t);
    return c ? at_tensor_numel(t) / c : 0;
}

void *at_tensor_data(const at_tensor *t)
{
    if (!t->buf || !t->buf->backend->is_host) return NULL;
    return (char *)t->buf->ptr + t->offset;
}

const char *at_tensor_describe(const at_tensor *t, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s [", t->name[0] ? t->name : "(unnamed)");
    for (int i = 0; i < t->ndim && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "] %s", at_dtype_name(t->dtype));
    return buf;
}

int at_tensor_same_shape(const at_tensor *a, const at_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

at_status at_tensor_upload(at_tensor *t, const void *host, size_t nbytes)
{
    if (nbytes != at_tensor_nbytes(t))
        return at_error(AT_ERR_INVALID, "tensor %s: upload of %zu bytes into %zu", t->name, nbytes,
                        at_tensor_nbytes(t));
    at_backend *be = t->buf->backend;
    return be->upload(be, (char *)t->buf->ptr + t->offset, host, nbytes);
}

at_status at_tensor_download(const at_tensor *t, void *host, size_t nbytes)
{
    if (nbytes != at_tensor_nbytes(t))
        return at_error(AT_ERR_INVALID, "tensor %s: download of %zu bytes from %zu", t->name, nbytes,
                        at_tensor_nbytes(t));
    at_backend *be = t->buf->backend;
    return be->download(be, host, (char *)t->buf->ptr + t->offset, nbytes);
}
