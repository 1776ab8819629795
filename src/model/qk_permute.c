#include "model/qk_permute.h"

#include <stdlib.h>
#include <string.h>

/* Within each head of d rows, with i < d/2 and c in {0, 1}:
 *   halves row  c*d/2 + i   <->   interleaved row  2*i + c */
at_status at_qk_permute_rows(void *dst, const void *src, int64_t n_rows, size_t row_bytes, int n_heads,
                             at_qk_direction dir, const char *what)
{
    if (n_heads <= 0 || n_rows <= 0 || n_rows % n_heads != 0 || (n_rows / n_heads) % 2 != 0)
        return at_error(AT_ERR_INVALID, "%s: cannot permute %lld rows over %d heads (need an even head size)",
                        what ? what : "q/k weight", (long long)n_rows, n_heads);
    int64_t d = n_rows / n_heads, half = d / 2;
    uint8_t *o = dst;
    const uint8_t *s = src;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t c = 0; c < 2; c++) {
                int64_t hv = h * d + c * half + i, il = h * d + 2 * i + c;
                int64_t to = dir == AT_QK_TO_HALVES ? hv : il, from = dir == AT_QK_TO_HALVES ? il : hv;
                memcpy(o + (size_t)to * row_bytes, s + (size_t)from * row_bytes, row_bytes);
            }
    return AT_OK;
}

at_status at_qk_permute_tensor(at_tensor *t, int n_heads, at_qk_direction dir)
{
    uint8_t *data = at_tensor_data(t);
    if (!data) return at_error(AT_ERR_INVALID, "%s: not in host memory", t->name);
    if (t->buf->external)
        return at_error(AT_ERR_INVALID, "%s: wraps external (possibly read-only mapped) memory; permute a copy",
                        t->name);
    size_t nbytes = at_tensor_nbytes(t);
    int64_t rows = t->shape[0];
    if (rows <= 0) return at_error(AT_ERR_INVALID, "%s: no rows to permute", t->name);
    size_t row_bytes = nbytes / (size_t)rows;
    uint8_t *tmp = malloc(nbytes ? nbytes : 1);
    if (!tmp) return at_error(AT_ERR_NOMEM, "%s: out of memory (%zu bytes)", t->name, nbytes);
    memcpy(tmp, data, nbytes);
    at_status st = at_qk_permute_rows(data, tmp, rows, row_bytes, n_heads, dir, t->name);
    free(tmp);
    return st;
}
