/* The vision tower's tensors in a checkpoint.
 *
 * They live in the checkpoint's own weights file, under the names a
 * Hugging Face / PEFT reader expects there, so export, inference and
 * transformers read the folder as they read any other:
 *   LoRA runs (adapter_model.safetensors, beside the language model's pairs):
 *     the tower's LoRA pairs under PEFT's names,
 *       base_model.model.visual.blocks.N.{attn.qkv, attn.proj, mlp.fc1, mlp.fc2
 *       | mlp.gate_proj, mlp.up_proj, mlp.down_proj}.lora_A.weight [r, in]
 *       and .lora_B.weight [out, r], scaled as the language model's pairs
 *       (the same r, lora_alpha, use_rslora);
 *     a trained aligner (--freeze_aligner false) in full, visual.merger.*
 *       (PEFT's modules_to_save form: the module's own names);
 *     nothing of the tower when it does not train.
 *   Full fine-tuning (model.safetensors): every visual.* weight, trained or
 *     not, so the folder is a complete model; the patch embedding with its
 *     Hugging Face shape, the Conv3d [width, in_chans, temporal_patch_size,
 *     patch, patch] (the tower holds the same values as a matrix).
 * A resume and --load_best_model_at_end read the tensors back by name. */
#ifndef AT_TRAIN_VISION_CKPT_H
#define AT_TRAIN_VISION_CKPT_H

#include <stddef.h>
#include "base/status.h"
#include "model/safetensors.h"
#include "model/vision.h"

/* The tower's tensors for a checkpoint (see above): full 0, the trained ones;
 * full 1, all but LoRA pairs. Appends to tensors[*n] and shapes[*n] (room for
 * at_vision_param_count(v) more); shapes get the Hugging Face shape where it
 * differs from the tensor's (else ndim 0). */
void at_vision_ckpt_tensors(const at_vision *v, int full, const at_tensor **tensors, at_st_shape *shapes, size_t *n);

/* Reads the tower's tensors of checkpoint dir (its adapter_model.safetensors,
 * else model.safetensors) back into v by name. trainable_only: every
 * trainable tensor of v must be there (a resume), others are left; else every
 * tower tensor of the file is loaded (LoRA pairs need at_vision_lora_add
 * first) and the file's other tensors are left to their own loaders. */
at_status at_vision_ckpt_load(at_vision *v, const char *dir, int trainable_only);

#endif
