/* Tensors: up to 4 dimensions, contiguous row-major, one dtype, stored in a
 * buffer of one backend (device). A tensor either owns its buffer or is a
 * view into another tensor's buffer (at an element offset). The name is used
 * in error messages ("model.layers.3.self_attn.q_proj.weight"). */
#ifndef AT_DEVICE_TENSOR_H
#define AT_DEVICE_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/dtype.h"

#define AT_MAX_DIMS 4
#define AT_NAME_MAX 96

struct at_backend;

/* Memory on one device. `ptr` is a device pointer (a host pointer for the CPU). */
typedef struct at_buffer {
    struct at_backend *backend;
    void *ptr;
    size_t size;
    int refcount;
    int external; /* memory not allocated by the backend (e.g. mmap): never freed */
} at_buffer;

typedef struct at_tensor {
    char name[AT_NAME_MAX];
    at_dtype dtype;
    int ndim;
    int64_t shape[AT_MAX_DIMS]; /* unused trailing entries are 1 */
    at_buffer *buf;
    size_t offset; /* byte offset into buf->ptr */
} at_tensor;

/* Allocates a tensor and its buffer on `backend` (contents undefined).
 * Caller frees with at_tensor_free. Returns AT_ERR_DEVICE_OOM/AT_ERR_NOMEM with
 * a message naming the tensor and the bytes asked for. */
at_status at_tensor_new(struct at_backend *backend, at_dtype dtype, int ndim, const int64_t *shape,
                        const char *name, at_tensor **out);
/* Same, zero-filled. */
at_status at_tensor_zeros(struct at_backend *backend, at_dtype dtype, int ndim, const int64_t *shape,
                          const char *name, at_tensor **out);
/* Wraps host memory (not copied, not freed) as a CPU tensor: used for mmapped
 * model weights. `data` must stay valid for the tensor's lifetime. */
at_status at_tensor_wrap(void *data, at_dtype dtype, int ndim, const int64_t *shape,
                         const char *name, at_tensor **out);
/* A view of `src` starting at element `elem_offset` with a new shape; shares
 * (and references) src's buffer. Free with at_tensor_free. The view must lie
 * inside src. */
at_status at_tensor_view(const at_tensor *src, size_t elem_offset, int ndim, const int64_t *shape,
                         const char *name, at_tensor **out);
/* Frees the tensor; the buffer is released when its last tensor goes. NULL ok. */
void at_tensor_free(at_tensor *t);

/* Fills an existing tensor struct as a view without heap allocation (no
 * reference taken: valid while src lives). For hot loops. */
void at_tensor_view_inplace(at_tensor *dst, const at_tensor *src, size_t elem_offset, int ndim,
                            const int64_t *shape);

int64_t at_tensor_numel(const at_tensor *t);
size_t at_tensor_nbytes(const at_tensor *t);
/* Rows = product of all dims but the last; cols = last dim. */
int64_t at_tensor_rows(const at_tensor *t);
int64_t at_tensor_cols(const at_tensor *t);
/* Host pointer to the first element; NULL when the tensor is not on a host backend. */
void *at_tensor_data(const at_tensor *t);
/* "name [2, 3, 4] bf16" into buf. Returns buf. */
const char *at_tensor_describe(const at_tensor *t, char *buf, size_t len);
int at_tensor_same_shape(const at_tensor *a, const at_tensor *b);
void at_tensor_set_name(at_tensor *t, const char *name);

/* Copies between host memory and a tensor on any backend (converting dtype is
 * not done here: bytes are copied as they are). */
at_status at_tensor_upload(at_tensor *t, const void *host, size_t nbytes);
at_status at_tensor_download(const at_tensor *t, void *host, size_t nbytes);

#endif
