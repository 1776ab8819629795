/* The vision tower of a Qwen2-VL / Qwen2.5-VL model on export.
 *
 * Hugging Face folders keep the tower as the source stored it: the same
 * tensor names (visual.*, or model.visual.* with the language model under
 * model.language_model.* as transformers 4.52 and later save it), shapes
 * (the 5-D Conv3d patch embedding) and the folder's output dtype.
 *
 * llama.cpp runs the tower from a separate "mmproj" GGUF (tools/mtmd), as
 * its convert_hf_to_gguf.py --mmproj writes it:
 *   general.architecture "clip", general.type "mmproj", general.file_type,
 *   clip.has_vision_encoder true, clip.projector_type "qwen2vl_merger" or
 *   "qwen2.5vl_merger" (+ clip.use_silu true: SwiGLU blocks; Qwen2-VL's
 *   QuickGELU is clip's default), clip.vision.{image_size (vision_config's,
 *   else 560), patch_size, embedding_length (the tower's width),
 *   feed_forward_length (its MLP width; llama.cpp's converter writes
 *   vision_config.hidden_size there for Qwen2-VL, which is the merger's
 *   output width; clip reads the MLP from the tensors either way),
 *   block_count, attention.head_count, attention.layer_norm_epsilon (1e-6),
 *   image_mean, image_std (preprocessor_config.json's), projection_dim (the
 *   language model's width), spatial_merge_size}; Qwen2.5-VL also
 *   clip.vision.n_wa_pattern (fullatt_block_indexes[0] + 1: every n-th block
 *   attends fully; indexes not evenly spaced cannot be written) and
 *   clip.vision.window_size;
 *   tensors (ggml shapes = PyTorch's reversed):
 *     v.patch_embd.weight, v.patch_embd.weight.1   the Conv3d [W, C, 2, P, P]
 *                                                  cut into its two temporal
 *                                                  halves [W, C, P, P] (F32, or
 *                                                  F16 in an F16 file)
 *     v.blk.N.ln1 / ln2                            norm1 / norm2 (weight, bias)
 *     v.blk.N.attn_q / attn_k / attn_v             attn.qkv's rows [0, W), [W, 2W), [2W, 3W)
 *     v.blk.N.attn_out                             attn.proj
 *     v.blk.N.ffn_up / ffn_down                    mlp.fc1 / fc2 (Qwen2-VL)
 *     v.blk.N.ffn_gate / ffn_up / ffn_down         mlp.gate_proj / up_proj / down_proj (Qwen2.5-VL)
 *     v.post_ln                                    merger.ln_q
 *     mm.0, mm.2                                   merger.mlp.0, merger.mlp.2
 *   1-D tensors F32; matrices in the file's type, F16 when their rows are
 *   not whole Q8_0 / Q4_0 blocks (as the language model's GGUF). */
#ifndef AT_EXPORT_EXPORT_VISION_H
#define AT_EXPORT_EXPORT_VISION_H

#include <stddef.h>
#include "base/status.h"
#include "device/tensor.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/vision_config.h"

typedef struct at_export_vision at_export_vision;

/* Reads the tower of the model folder dir (config.json's vision_config and
 * the tower's tensors, views of the source's files where they can be). With
 * adapter_dir (a PEFT folder; NULL: none), its adapter_model.safetensors'
 * tower tensors are applied, under PEFT's names
 * (base_model.model[.model].visual.*) or plain ones ([model.]visual.*):
 *   full tensors (a trained tower or aligner: ms-swift's modules_to_save,
 *   full fine-tuning) replace the base's of the same name and shape;
 *   LoRA pairs <linear>.lora_A.weight / lora_B.weight are merged into that
 *   linear's weight: W' = W + s·B·A in f32 (s = lora_scale, the adapter's
 *   alpha / r), rounded once when written.
 * A tower tensor of the adapter that matches none of the tower's is an
 * error naming it. *out stays NULL (AT_OK) for a folder without
 * vision_config. Caller frees with at_export_vision_free. */
at_status at_export_vision_load(const char *dir, const char *adapter_dir, double lora_scale, at_export_vision **out);
void at_export_vision_free(at_export_vision *v); /* NULL ok */

const at_vision_config *at_export_vision_config(const at_export_vision *v);
/* Whether the source keeps its language model under model.language_model.*. */
int at_export_vision_lm_nested(const at_export_vision *v);
/* LoRA pairs merged and tensors replaced from the adapter. */
void at_export_vision_applied(const at_export_vision *v, int *merged, int *replaced);

/* The tower's tensors, in at_vision_tensors' order: the name as the source
 * stores it, the tensor (host; a 5-D tensor is held as a matrix) and the
 * shape to write (*shape->ndim 0: the tensor's own). Owned by v. */
size_t at_export_vision_count(const at_export_vision *v);
const char *at_export_vision_name(const at_export_vision *v, size_t i);
const at_tensor *at_export_vision_tensor(const at_export_vision *v, size_t i);
const at_st_shape *at_export_vision_shape(const at_export_vision *v, size_t i);


/* The mmproj file name for a language-model GGUF file name: "mmproj-" + it
 * (model-f16.gguf -> mmproj-model-f16.gguf), as llama.cpp's converter
 * prefixes its own. Into buf; returns buf. */
const char *at_export_mmproj_name(const char *model_file, char *buf, size_t len);

/* Writes the mmproj GGUF (see above) at path, atomically. lm: the language
 * model's config (projection_dim); quant: the file's type (f32, f16, bf16,
 * q8_0, q4_0); name: general.name (NULL: "anytune export"). */
at_status at_export_vision_mmproj(const at_export_vision *v, const at_model_config *lm, const char *path,
                                  at_dtype quant, const char *name);

#endif
