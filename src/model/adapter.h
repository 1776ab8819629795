/* LoRA adapters in PEFT's format (adapter_config.json +
 * adapter_model.safetensors), so peft and vLLM load ours and we load theirs.
 *
 * For a linear layer y = x·Wᵀ the adapter adds  s · (x·Aᵀ)·Bᵀ  with
 * A [r, in], B [out, r], s = alpha / r (rsLoRA: alpha / sqrt(r)).
 * Tensor names are PEFT's:
 *   base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight   [r, in]
 *   base_model.model.model.layers.N.mlp.down_proj.lora_B.weight      [out, r]
 * Fresh adapters are initialized as PEFT does: A Kaiming-uniform with
 * a = sqrt(5) (uniform in ±1/sqrt(in)), B zero, so the model starts unchanged.
 * A and B are f32 on the adapter's backend. */
#ifndef AT_MODEL_ADAPTER_H
#define AT_MODEL_ADAPTER_H

#include <stdint.h>
#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"
#include "model/config.h"

/* The linear layers of a decoder block, in PEFT's module names. */
typedef enum { AT_MOD_Q = 0, AT_MOD_K, AT_MOD_V, AT_MOD_O, AT_MOD_GATE, AT_MOD_UP, AT_MOD_DOWN, AT_MOD_COUNT } at_module;

/* "q_proj", ... */
const char *at_module_name(at_module m);
/* "self_attn" or "mlp" */
const char *at_module_parent(at_module m);
/* in and out features of module m under cfg. */
void at_module_dims(const at_model_config *cfg, at_module m, int64_t *in, int64_t *out);

/* Parses --target_modules items ("all-linear", "all", or names such as
 * "q_proj", "v_proj") into a bit mask of (1 << at_module). An unknown name is
 * an error naming it and listing the valid ones. */
at_status at_parse_target_modules(const char *const *items, int n, unsigned *mask);

typedef struct {
    at_tensor *A; /* [r, in] f32, NULL when the module is not adapted */
    at_tensor *B; /* [out, r] f32 */
} at_lora_pair;

typedef struct at_adapter {
    int rank;
    double alpha;
    double dropout;
    int use_rslora;
    double scale;          /* alpha / rank, or alpha / sqrt(rank) with rsLoRA */
    unsigned target_mask;  /* bits of at_module */
    int n_layers;
    at_lora_pair *mods;    /* [n_layers * AT_MOD_COUNT], index layer * AT_MOD_COUNT + module */
    char base_model[256];  /* base_model_name_or_path */
    at_backend *backend;
} at_adapter;

/* A fresh adapter for cfg: A Kaiming-uniform from `seed`, B zero. Caller frees
 * with at_adapter_free. */
at_status at_adapter_new(const at_model_config *cfg, at_backend *be, int rank, double alpha, double dropout,
                         int use_rslora, unsigned target_mask, uint64_t seed, at_adapter **out);
void at_adapter_free(at_adapter *a); /* NULL ok */

/* The pair of layer l, module m (NULL members when not adapted). */
at_lora_pair *at_adapter_pair(at_adapter *a, int layer, at_module m);

/* Writes dir/adapter_config.json and dir/adapter_model.safetensors (the
 * folder must exist). base_model may be NULL. */
at_status at_adapter_save(const at_adapter *a, const char *dir);
/* at_adapter_save, with n_extra more tensors written into
 * adapter_model.safetensors under their own names (a vision tower's LoRA
 * pairs and trained modules: train/vision_ckpt.h); at_adapter_load leaves
 * them to their owner. */
at_status at_adapter_save_with(const at_adapter *a, const char *dir, const at_tensor *const *extra, size_t n_extra);

/* Loads a PEFT adapter folder for a model of config cfg: r, lora_alpha,
 * lora_dropout, use_rslora and target_modules from adapter_config.json (a
 * peft_type other than LORA, DoRA, bias other than "none", or a
 * layers_to_transform subset are refused with a message); tensors checked
 * against cfg's shapes, by name. Tensors are converted to f32. */
at_status at_adapter_load(const char *dir, const at_model_config *cfg, at_backend *be, at_adapter **out);
/* `dir` may also be a LoRA GGUF file, as `anytune export --to gguf` writes it
 * and llama.cpp reads it: general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha (scale = alpha / rank), tensors blk.N.<name>.weight.lora_a
 * [r, in] and .lora_b [out, r] (q/k's lora_b rows in the interleaved RoPE
 * order for general.architecture "llama", turned back here). */

/* The vision tower's own name (visual.*) of an adapter tensor named name
 * (PEFT's base_model.model[.model].visual.*, or [model.]visual.*); NULL
 * when it is not a tower tensor. Points into name. */
const char *at_adapter_tower_name(const char *name);
/* Whether the PEFT folder dir's adapter_model.safetensors holds tensors of
 * a vision tower (its LoRA pairs or trained modules: train/vision_ckpt.h);
 * 0 when it has none or cannot be read. */
int at_adapter_has_tower(const char *dir);

/* PEFT's tensor name for layer l, module m, "lora_A" or "lora_B". */
void at_adapter_tensor_name(int layer, at_module m, const char *which, char *buf, size_t len);

#endif
