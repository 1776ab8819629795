/* The vision tower of Qwen2-VL, Qwen2.5-VL and Qwen3-VL and its patch merger
 * (the "aligner"): pixel patches -> the embeddings that replace the language
 * model's <|image_pad|> tokens (and Qwen3-VL's deepstack features, added to
 * the language model's hidden states there after its first layers). Forward and backward through the ops layer,
 * so it runs on every backend. The weights (vision_config.h lists them) are
 * f32 in memory whatever the file stores.
 *
 * The computation (transformers' Qwen2VisionTransformerPretrainedModel and
 * Qwen2_5_VisionTransformerPretrainedModel; N patches, width W, H heads of
 * size D = W/H, m = spatial_merge_size):
 *   x = pixels · Wpatchᵀ                    (the Conv3d of stride = kernel)
 *   per block:  x += proj(attn(rope(q), rope(k), v)),  q|k|v = qkv(norm1(x))
 *               x += mlp(norm2(x))
 *   features = mlp.2(gelu(mlp.0(ln_q(x) viewed as [N/m², m²·W])))
 * Qwen2-VL: LayerNorm norms, mlp = fc2(quick_gelu(fc1(.))); Qwen3-VL the
 * same with gelu_tanh, x += bias + pos(grid) after the patch embedding
 * (pos: the learned S x S positions bilinearly interpolated to the image's
 * h x w patches, transformers' fast_pos_embed_interpolate), and deepstack
 * merger i taking block deepstack_visual_indexes[i]'s output x_b:
 * ds_i = fc2(gelu(fc1(LayerNorm(x_b viewed as [N/m², m²·W])))); Qwen2.5-VL:
 * RMSNorm norms, mlp = down(silu(gate(.)) · up(.)). Norm eps 1e-6.
 * Rotary: 2-D, each patch turns the first D/4 frequencies by its row and
 * the next D/4 by its column in the image (frequencies 1/10000^(4j/D), j <
 * D/4). Attention is bidirectional and stays within one frame of one image
 * (Qwen2-VL; Qwen2.5-VL's full-attention blocks at fullatt_block_indexes)
 * or within one window (Qwen2.5-VL's other blocks: squares of
 * window_size / (patch_size·m) merge units of one frame, cut at the
 * image's edges). Qwen2.5-VL runs the blocks on the patches reordered
 * window by window (a merge unit's m² patches stay together) and puts the
 * merged tokens back in image order at the end.
 *
 * pixels are Qwen2VLImageProcessor's (data/image_proc.h): per image,
 * t·h·w rows of in_chans·temporal_patch_size·patch_size² values, rows in the
 * order of the merge (m² neighbours consecutive); images one after another.
 * grid_thw[i] = {t, h, w} of image i (h and w in patches, multiples of m).
 * The features of image i are its t·h·w/m² rows, images one after another:
 * the order of its <|image_pad|> tokens in the text. */
#ifndef AT_MODEL_VISION_H
#define AT_MODEL_VISION_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"
#include "model/vision_config.h"

struct at_st_model;
typedef struct at_vision at_vision;

/* Reads config_dir/config.json's vision side and the tower's tensors from
 * weights (a folder or .safetensors path, as at_st_model_open takes), onto
 * backend be as f32 (bf16 and f16 files converted). A missing tensor or one
 * of another shape is an error naming it. Caller frees with at_vision_free. */
at_status at_vision_load(const char *config_dir, const char *weights, at_backend *be, at_vision **out);

/* The same from a config already read and a model already open (the
 * decoder's loader has both); what names the weights in messages. m may be
 * closed after this returns (the tensors are copies). */
at_status at_vision_from_model(const at_vision_config *vc, const struct at_st_model *m, const char *what,
                               at_backend *be, at_vision **out);

/* Random weights for tests and demos: matrices uniform in
 * ±sqrt(3 / in_features), norm weights 1 (+ small noise), biases small.
 * Deterministic in seed. Caller frees with at_vision_free. */
at_status at_vision_random(const at_vision_config *vc, at_backend *be, uint64_t seed, at_vision **out);

void at_vision_free(at_vision *v); /* NULL ok */

const at_vision_config *at_vision_get_config(const at_vision *v);
at_backend *at_vision_backend(const at_vision *v);

/* The tower's parameters in at_vision_tensors' order; each tensor's name is
 * its safetensors name. Every one is f32 and has the file's shape, except
 * visual.patch_embed.proj.weight, kept as the matrix [W, in_chans ·
 * temporal_patch_size · patch_size²] (the file's 5-D tensor, flattened).
 * Owned by v. */
size_t at_vision_param_count(const at_vision *v);
at_tensor *at_vision_param(const at_vision *v, size_t i);
/* Whether parameter i belongs to the merger (visual.merger.*, and Qwen3-VL's
 * visual.deepstack_merger_list.*: the aligner, they project into the
 * language model)
 * rather than the vision transformer (patch embedding, positions, blocks). */
int at_vision_param_is_aligner(const at_vision *v, size_t i);
/* Its gradient (f32, the parameter's shape, owned by v), or NULL when that
 * part is not trainable (at_vision_set_trainable). */
at_tensor *at_vision_grad(const at_vision *v, size_t i);

/* Which parts the backward computes gradients for: the vision transformer
 * (vit: patch embedding and blocks, or only their LoRA pairs once
 * at_vision_lora_add has run) and the merger (aligner). Allocates
 * zeroed gradients for the trainable parts and frees the others'. With vit
 * frozen the backward stops after the merger (ms-swift's freeze_vit); with
 * both frozen it does nothing. Default: both frozen. */
at_status at_vision_set_trainable(at_vision *v, int vit, int aligner);
/* With hold, the forward and backward treat the vision transformer as
 * frozen (its gradients are kept as they are, not computed) while
 * at_vision_set_trainable's setting stays; without, it trains again. For
 * --vit_freeze_steps: the tower's gradient tensors keep their addresses. */
void at_vision_hold_vit(at_vision *v, int hold);
/* LoRA on every linear of the vision transformer's blocks (attn.qkv,
 * attn.proj, mlp.fc1 / fc2, linear_fc1 / linear_fc2 or gate_proj / up_proj /
 * down_proj; not the mergers'): y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ with A [rank, in], B [out, rank],
 * s = alpha / rank (use_rslora: alpha / sqrt(rank)), no dropout. A starts
 * Kaiming-uniform (±1/sqrt(in), from seed) and B zero, as PEFT starts them.
 * The pairs become parameters after the tower's, A then B of each linear,
 * named as PEFT names them for the model
 * (base_model.model.visual.blocks.N.attn.qkv.lora_A.weight); from then on a
 * trainable vit (at_vision_set_trainable) trains the pairs and leaves the
 * tower's own weights frozen. The flags in force are kept. On an error v can
 * only be freed. */
at_status at_vision_lora_add(at_vision *v, int rank, double alpha, int use_rslora, uint64_t seed);
/* Whether parameter i is a LoRA A or B of the tower. */
int at_vision_param_is_lora(const at_vision *v, size_t i);

/* Zeroes every gradient (the backward accumulates into them). */
at_status at_vision_zero_grads(at_vision *v);

/* Image tokens of a batch: Σ t·h·w / m². Checks each grid (positive, h and
 * w multiples of m) and, when n_patches >= 0, that Σ t·h·w == n_patches;
 * the message names the image. */
at_status at_vision_tokens(const at_vision_config *vc, const int32_t (*grid_thw)[3], int n_images,
                           int64_t n_patches, int64_t *n_tokens);

/* Rows of the forward's features for n_tokens image tokens: n_tokens, and
 * for Qwen3-VL n_tokens more per deepstack merger (the merger's features,
 * then deepstack merger 0's, 1's, ...: n_tokens rows each). */
int64_t at_vision_feature_rows(const at_vision_config *vc, int64_t n_tokens);

/* The forward. pixels: host f32 [n_patches, in_chans · temporal_patch_size
 * · patch_size²]; features: f32 [at_vision_feature_rows, out_hidden_size]
 * on v's backend (at_vision_tokens gives n_tokens), overwritten. With training the
 * activations the backward needs are kept in v (until the next forward or
 * at_vision_release): every block's when the vision transformer is
 * trainable (at_vision_set_trainable), else only the merger's (its blocks
 * run as in inference); without, nothing is kept. */
at_status at_vision_forward(at_vision *v, at_tensor *features, const float *pixels, int64_t n_patches,
                            const int32_t (*grid_thw)[3], int n_images, int training);

/* The backward of the last training forward: d_features (f32, the
 * features' shape, on v's backend) -> the gradients of the trainable parts,
 * accumulated (added) into at_vision_grad's tensors. No gradient of the
 * pixels is computed. */
at_status at_vision_backward(at_vision *v, const at_tensor *d_features);

/* Frees the activations kept by a training forward. */
void at_vision_release(at_vision *v);

#endif
