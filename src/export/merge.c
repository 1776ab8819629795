/* LoRA merge (merge.h). */
#include "export/merge.h"

#include <stdio.h>
#include <string.h>

#include "device/cpu/cpu_backend.h"
#include "ops/ops.h"

at_tensor **at_merge_target(at_decoder_weights *w, int layer, at_module m)
{
    at_layer_weights *L = &w->layers[layer];
    switch (m) {
    case AT_MOD_Q: return &L->wq;
    case AT_MOD_K: return &L->wk;
    case AT_MOD_V: return &L->wv;
    case AT_MOD_O: return &L->wo;
    case AT_MOD_GATE: return &L->w_gate;
    case AT_MOD_UP: return &L->w_up;
    case AT_MOD_DOWN: return &L->w_down;
    default: return NULL;
    }
}

at_status at_merge_lora_matrix(const at_tensor *W, const at_tensor *A, const at_tensor *B, double s, at_dtype dtype,
                               at_tensor **out)
{
    at_backend *cpu = at_cpu_backend();
    at_tensor *w32 = NULL, *res = NULL;
    at_status st;
    *out = NULL;
    if (W->ndim != 2 || A->ndim != 2 || B->ndim != 2 || A->shape[1] != W->shape[1] || B->shape[0] != W->shape[0] ||
        B->shape[1] != A->shape[0])
        return at_error(AT_ERR_INVALID, "merge: %s: A [%lld, %lld] and B [%lld, %lld] do not fit W [%lld, %lld]",
                        W->name, (long long)A->shape[0], (long long)A->shape[1], (long long)B->shape[0],
                        (long long)B->shape[1], (long long)W->shape[0], (long long)W->shape[1]);
    if (A->dtype != AT_F32 || B->dtype != AT_F32)
        return at_error(AT_ERR_INVALID, "merge: %s: adapter tensors must be f32", W->name);
    AT_CHECK(at_tensor_new(cpu, AT_F32, 2, W->shape, W->name, &w32));
    AT_CHECK(at_cast(w32, W));
    /* C = s·(B·A) + 1·C: the f32 GEMM accumulates the rank-r product. */
    AT_CHECK(at_matmul(w32, B, A, 0, 0, (float)s, 1.0f));
    if (dtype == AT_F32) {
        res = w32;
        w32 = NULL;
    } else {
        AT_CHECK(at_tensor_new(cpu, dtype, 2, W->shape, W->name, &res));
        AT_CHECK(at_cast(res, w32));
    }
    *out = res;
    res = NULL;
done:
    at_tensor_free(w32);
    at_tensor_free(res);
    return st;
}

at_status at_merge_lora(at_decoder_weights *w, const at_adapter *a)
{
    if (!w || !a) return at_error(AT_ERR_INVALID, "merge: no weights or no adapter");
    if (a->n_layers != w->cfg.num_hidden_layers)
        return at_error(AT_ERR_INVALID, "merge: the adapter has %d layers, the model %d", a->n_layers,
                        w->cfg.num_hidden_layers);
    for (int l = 0; l < a->n_layers; l++) {
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            const at_lora_pair *p = &a->mods[l * AT_MOD_COUNT + m];
            if (!p->A || !p->B) continue;
            at_tensor **slot = at_merge_target(w, l, (at_module)m);
            at_tensor *W = *slot;
            char name[160];
            at_adapter_tensor_name(l, (at_module)m, "lora_A", name, sizeof name);
            if (!W) return at_error(AT_ERR_INVALID, "merge: %s has no base weight", name);
            if (!at_tensor_data(W) || !at_tensor_data(p->A) || !at_tensor_data(p->B))
                return at_error(AT_ERR_UNSUPPORTED, "merge: %s: the weights and the adapter must be in host memory",
                                W->name);
            if (W->dtype != AT_F32 && W->dtype != AT_BF16 && W->dtype != AT_F16)
                return at_error(AT_ERR_UNSUPPORTED, "merge: %s is %s; merging needs f32, bf16 or f16 weights", W->name,
                                at_dtype_name(W->dtype));
            at_tensor *merged = NULL;
            AT_TRY(at_merge_lora_matrix(W, p->A, p->B, a->scale, W->dtype, &merged));
            at_tensor_free(W);
            *slot = merged;
        }
    }
    return AT_OK;
}
