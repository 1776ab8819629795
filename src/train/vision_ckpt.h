/* The vision tower's trained tensors in a checkpoint.
 *
 * A run on a vision-language model whose tower trains (--freeze_vit false,
 * --freeze_aligner false) writes them, whatever the train type, into
 * CHECKPOINT/visual.safetensors (beside the adapter or model.safetensors,
 * which hold the language model's), each under its model/vision.h name:
 *   LoRA on the vision transformer (with --train_type lora):
 *     base_model.model.visual.blocks.N.{attn.qkv, attn.proj, mlp.fc1, mlp.fc2
 *     | mlp.gate_proj, mlp.up_proj, mlp.down_proj}.lora_A.weight [r, in]
 *     and .lora_B.weight [out, r]: PEFT's names; scale lora_alpha / r
 *     (use_rslora: / sqrt(r)), from the metadata below;
 *   trained tower weights under their Hugging Face names: visual.merger.*
 *     (the aligner, LoRA or full runs), and with --train_type full and
 *     --freeze_vit false every visual.* weight; the patch embedding
 *     (a Conv3d [width, in_chans, temporal_patch_size, patch, patch] in
 *     Hugging Face files) is stored flattened as the 2-D matrix [width,
 *     in_chans · temporal_patch_size · patch²], the same values in the same
 *     (row-major) order: reshape it to write a Hugging Face folder.
 * Metadata: "vit_trained", "aligner_trained" ("true" / "false"), and when the
 * tower has LoRA "lora_rank", "lora_alpha", "use_rslora". Frozen tensors are
 * not written: they are the base model's. The file is absent when nothing of
 * the tower trains. */
#ifndef AT_TRAIN_VISION_CKPT_H
#define AT_TRAIN_VISION_CKPT_H

#include "base/status.h"
#include "model/vision.h"

#define AT_VISION_CKPT_FILE "visual.safetensors"

/* Writes dir/visual.safetensors with v's trainable tensors (those with a
 * gradient, at_vision_set_trainable); nothing when there are none. The LoRA
 * settings go to the metadata. */
at_status at_vision_ckpt_save(const at_vision *v, const char *dir, int lora_rank, double lora_alpha, int use_rslora);

/* Reads dir/visual.safetensors back into v by name. trainable_only: every
 * trainable tensor of v must be in the file (a resume), others are left;
 * else every tensor of the file must be one of v's (LoRA pairs need
 * at_vision_lora_add first) and is loaded, and a missing file loads nothing
 * (inference with a checkpoint whose tower did not train). */
at_status at_vision_ckpt_load(at_vision *v, const char *dir, int trainable_only);

#endif
