#include "train/vision_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "model/safetensors.h"

at_status at_vision_ckpt_save(const at_vision *v, const char *dir, int lora_rank, double lora_alpha, int use_rslora)
{
    size_t np = at_vision_param_count(v), n = 0;
    const at_tensor **ts = calloc(np + 1, sizeof *ts);
    if (!ts) return at_error(AT_ERR_NOMEM, "out of memory");
    int has_lora = 0, vit = 0, aligner = 0;
    for (size_t i = 0; i < np; i++) {
        if (!at_vision_grad(v, i)) continue;
        has_lora |= at_vision_param_is_lora(v, i);
        if (at_vision_param_is_aligner(v, i)) aligner = 1;
        else vit = 1;
        ts[n++] = at_vision_param(v, i);
    }
    at_status st = AT_OK;
    if (n) {
        char rank[32], alpha[64];
        snprintf(rank, sizeof rank, "%d", lora_rank);
        snprintf(alpha, sizeof alpha, "%.17g", lora_alpha);
        at_st_kv meta[5] = {{"vit_trained", vit ? "true" : "false"}, {"aligner_trained", aligner ? "true" : "false"},
                            {"lora_rank", rank}, {"lora_alpha", alpha}, {"use_rslora", use_rslora ? "true" : "false"}};
        char *p = at_path_join(dir, AT_VISION_CKPT_FILE);
        st = p ? at_safetensors_write(p, ts, NULL, n, meta, has_lora ? 5 : 2) : at_error(AT_ERR_NOMEM, "out of memory");
        free(p);
    }
    free((void *)ts);
    return st;
}

/* The parameter of v named name, or -1. */
static long find_param(const at_vision *v, const char *name)
{
    for (size_t i = 0; i < at_vision_param_count(v); i++)
        if (!strcmp(at_vision_param(v, i)->name, name)) return (long)i;
    return -1;
}

static at_status load_one(const at_st_model *m, at_tensor *dst)
{
    at_tensor *src = NULL;
    at_status st = at_st_get(m, dst->name, dst->ndim, dst->shape, AT_F32, &src);
    if (st == AT_OK) st = at_tensor_upload(dst, at_tensor_data(src), at_tensor_nbytes(src));
    at_tensor_free(src);
    return st;
}

at_status at_vision_ckpt_load(at_vision *v, const char *dir, int trainable_only)
{
    size_t np = at_vision_param_count(v);
    int any = 0;
    for (size_t i = 0; i < np; i++) any |= at_vision_grad(v, i) != NULL;
    if (trainable_only && !any) return AT_OK;
    char *p = at_path_join(dir, AT_VISION_CKPT_FILE);
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    if (!trainable_only && !at_file_exists(p)) {
        free(p);
        return AT_OK;
    }
    at_st_model *m = NULL;
    at_status st = at_st_model_open(p, &m);
    if (st != AT_OK && trainable_only)
        at_error_wrap(st, "%s: the vision tower trains in this run (--freeze_vit / --freeze_aligner)", dir);
    if (trainable_only) {
        for (size_t i = 0; st == AT_OK && i < np; i++)
            if (at_vision_grad(v, i)) st = load_one(m, at_vision_param(v, i));
    } else {
        for (size_t i = 0; st == AT_OK && i < at_st_model_count(m); i++) {
            const char *name = at_st_model_info_at(m, i)->name;
            long k = find_param(v, name);
            if (k < 0) st = at_error(AT_ERR_INVALID, "%s: %s is not a tensor of the vision tower (LoRA pairs need the "
                                     "tower's LoRA)", p, name);
            else st = load_one(m, at_vision_param(v, (size_t)k));
        }
    }
    at_st_model_close(m);
    free(p);
    return st;
}
