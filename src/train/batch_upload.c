#include "train/batch_upload.h"

#include <string.h>

void at_batch_tensors_free(at_batch_tensors *t)
{
    at_tensor_free(t->ids);
    at_tensor_free(t->pos);
    at_tensor_free(t->seg);
    at_tensor_free(t->labels);
    memset(t, 0, sizeof *t);
}

static at_status upload_i32(struct at_backend *be, const int32_t *host, size_t rows, size_t cols, const char *name,
                            at_tensor **out)
{
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    AT_TRY(at_tensor_new(be, AT_I32, 2, shape, name, out));
    return at_tensor_upload(*out, host, rows * cols * sizeof(int32_t));
}

at_status at_batch_tensors_upload(struct at_backend *be, const at_batch *b, int with_segments, at_batch_tensors *bt)
{
    memset(bt, 0, sizeof *bt);
    at_status st = upload_i32(be, b->ids, b->rows, b->cols, "input_ids", &bt->ids);
    if (st == AT_OK && b->mpos) { /* M-RoPE: three positions a token */
        int64_t shape[3] = {(int64_t)b->rows, (int64_t)b->cols, 3};
        st = at_tensor_new(be, AT_I32, 3, shape, "position_ids", &bt->pos);
        if (st == AT_OK) st = at_tensor_upload(bt->pos, b->mpos, b->rows * b->cols * 3 * sizeof(int32_t));
    } else if (st == AT_OK) {
        st = upload_i32(be, b->positions, b->rows, b->cols, "position_ids", &bt->pos);
    }
    if (st == AT_OK && with_segments) st = upload_i32(be, b->segments, b->rows, b->cols, "segment_ids", &bt->seg);
    if (st == AT_OK) st = upload_i32(be, b->labels, b->rows, b->cols, "labels", &bt->labels);
    if (st != AT_OK) at_batch_tensors_free(bt);
    return st;
}
