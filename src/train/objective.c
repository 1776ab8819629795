#include "train/objective.h"

#include <stdlib.h>
#include <string.h>

/* The objectives by name: a new one is a row here and its file. */
static const struct {
    const char *name;
    const at_objective_ops *ops;
} OBJECTIVES[] = {
    {"sft", &at_objective_sft},
    {"pt", &at_objective_pt},
    {"dpo", &at_objective_preference},
    {"cpo", &at_objective_preference},
    {"simpo", &at_objective_preference},
    {"orpo", &at_objective_preference},
    {"kto", &at_objective_kto},
    {"rm", &at_objective_rm},
};

at_status at_objective_open(const char *name, const at_pref_config *pref, at_objective **out)
{
    *out = NULL;
    for (size_t i = 0; name && i < sizeof OBJECTIVES / sizeof OBJECTIVES[0]; i++) {
        if (strcmp(name, OBJECTIVES[i].name) != 0) continue;
        at_objective *o = calloc(1, sizeof *o);
        if (!o) return at_error(AT_ERR_NOMEM, "out of memory");
        o->ops = OBJECTIVES[i].ops;
        o->pref = pref;
        *out = o;
        return AT_OK;
    }
    return at_error(AT_ERR_INVALID, "no training objective named %s", name ? name : "(none)");
}

void at_objective_free(at_objective *o)
{
    if (!o) return;
    if (o->ops->free) o->ops->free(o);
    free(o);
}

void at_batch_tensors_free(at_batch_tensors *t)
{
    at_tensor_free(t->ids);
    at_tensor_free(t->pos);
    at_tensor_free(t->seg);
    at_tensor_free(t->labels);
    memset(t, 0, sizeof *t);
}

static at_status upload_i32(at_backend *be, const int32_t *host, size_t rows, size_t cols, const char *name,
                            at_tensor **out)
{
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    AT_TRY(at_tensor_new(be, AT_I32, 2, shape, name, out));
    return at_tensor_upload(*out, host, rows * cols * sizeof(int32_t));
}

at_status at_batch_tensors_upload(at_backend *be, const at_batch *b, int with_segments, at_batch_tensors *bt)
{
    memset(bt, 0, sizeof *bt);
    at_status st = upload_i32(be, b->ids, b->rows, b->cols, "input_ids", &bt->ids);
    if (st == AT_OK) st = upload_i32(be, b->positions, b->rows, b->cols, "position_ids", &bt->pos);
    if (st == AT_OK && with_segments) st = upload_i32(be, b->segments, b->rows, b->cols, "segment_ids", &bt->seg);
    if (st == AT_OK) st = upload_i32(be, b->labels, b->rows, b->cols, "labels", &bt->labels);
    if (st != AT_OK) at_batch_tensors_free(bt);
    return st;
}
