#include "train/vision_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "model/adapter.h"

#define PATCH_EMBED "visual.patch_embed.proj.weight"

void at_vision_ckpt_tensors(const at_vision *v, int full, const at_tensor **tensors, at_st_shape *shapes, size_t *n)
{
    const at_vision_config *vc = at_vision_get_config(v);
    for (size_t i = 0; i < at_vision_param_count(v); i++) {
        int lora = at_vision_param_is_lora(v, i);
        if (full ? lora : !at_vision_grad(v, i)) continue;
        const at_tensor *t = at_vision_param(v, i);
        at_st_shape s = {0};
        if (!strcmp(t->name, PATCH_EMBED)) {
            s.ndim = 5;
            s.shape[0] = vc->width;
            s.shape[1] = vc->in_chans;
            s.shape[2] = vc->temporal_patch_size;
            s.shape[3] = s.shape[4] = vc->patch_size;
        }
        tensors[*n] = t;
        shapes[*n] = s;
        (*n)++;
    }
}

/* The parameter of v named name, or -1. */
static long find_param(const at_vision *v, const char *name)
{
    for (size_t i = 0; i < at_vision_param_count(v); i++)
        if (!strcmp(at_vision_param(v, i)->name, name)) return (long)i;
    return -1;
}

/* dst from the file's tensor of the same name and element count (the patch
 * embedding is 5-D in the file, a matrix in the tower). */
static at_status load_one(const at_st_model *m, const char *path, at_tensor *dst)
{
    const at_st_info *info = at_st_model_find(m, dst->name);
    if (!info) return at_error(AT_ERR_FORMAT, "%s: tensor %s is missing", path, dst->name);
    int64_t n = 1;
    for (int d = 0; d < info->ndim; d++) n *= info->shape[d];
    if (n != at_tensor_numel(dst))
        return at_error(AT_ERR_FORMAT, "%s: tensor %s holds %lld values, the tower's %lld", path, dst->name,
                        (long long)n, (long long)at_tensor_numel(dst));
    float *buf = malloc((size_t)n * sizeof *buf + 1);
    if (!buf) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = at_st_read_f32(info, buf, (size_t)n);
    if (st == AT_OK) st = at_tensor_upload(dst, buf, (size_t)n * sizeof *buf);
    free(buf);
    return st;
}

at_status at_vision_ckpt_load(at_vision *v, const char *dir, int trainable_only)
{
    size_t np = at_vision_param_count(v);
    int any = 0;
    for (size_t i = 0; i < np; i++) any |= at_vision_grad(v, i) != NULL;
    if (trainable_only && !any) return AT_OK;
    char *p = at_path_join(dir, "adapter_model.safetensors");
    if (p && !at_file_exists(p)) {
        free(p);
        p = at_path_join(dir, "model.safetensors");
    }
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    at_st_model *m = NULL;
    at_status st = at_st_model_open(p, &m);
    if (st != AT_OK && trainable_only)
        at_error_wrap(st, "%s: the vision tower trains in this run (--freeze_vit / --freeze_aligner)", dir);
    if (trainable_only) {
        for (size_t i = 0; st == AT_OK && i < np; i++)
            if (at_vision_grad(v, i)) st = load_one(m, p, at_vision_param(v, i));
    } else {
        for (size_t i = 0; st == AT_OK && i < at_st_model_count(m); i++) {
            const char *name = at_st_model_info_at(m, i)->name;
            if (!at_adapter_tower_name(name)) continue;
            long k = find_param(v, name);
            if (k < 0) st = at_error(AT_ERR_INVALID, "%s: %s is not a tensor of the vision tower (LoRA pairs need the "
                                     "tower's LoRA)", p, name);
            else st = load_one(m, p, at_vision_param(v, (size_t)k));
        }
    }
    at_st_model_close(m);
    free(p);
    return st;
}
