/* The vision side of a Qwen2-VL / Qwen2.5-VL folder: config.json's
 * vision_config, the multimodal token ids and M-RoPE sections, and the
 * vision tower's weights (names and shapes) in model.safetensors.
 *
 * The two towers (transformers' Qwen2VisionTransformerPretrainedModel and
 * Qwen2_5_VisionTransformerPretrainedModel), per block i of `depth`:
 *   Qwen2-VL    norm1/norm2 LayerNorm (weight, bias) over embed_dim,
 *               attn.qkv / attn.proj (with biases), mlp.fc1 (embed_dim ->
 *               embed_dim * mlp_ratio) and mlp.fc2 with QuickGELU between;
 *               merger.ln_q a LayerNorm
 *   Qwen2.5-VL  norm1/norm2 RMSNorm (weight), attn.qkv / attn.proj, mlp
 *               gate_proj / up_proj / down_proj (SwiGLU, with biases),
 *               window attention except at fullatt_block_indexes;
 *               merger.ln_q an RMSNorm
 * and for both: patch_embed.proj (a Conv3d without bias, [width, in_chans,
 * temporal_patch_size, patch_size, patch_size], applied to each flattened
 * patch as one matmul) and the merger's MLP: mlp.0 (4 width -> 4 width),
 * GELU, mlp.2 (4 width -> the language model's hidden size).
 *
 * Qwen3-VL (transformers' Qwen3VLVisionModel; vision_config says
 * hidden_size, intermediate_size, in_channels, out_hidden_size,
 * num_position_embeddings, deepstack_visual_indexes): patch_embed.proj with
 * a bias; pos_embed.weight [num_position_embeddings, width], a square grid
 * of learned positions; blocks as Qwen2-VL's (LayerNorm, qkv, proj) with
 * mlp.linear_fc1 / linear_fc2 and gelu_pytorch_tanh between; the merger
 * merger.norm (LayerNorm over width), merger.linear_fc1, GELU,
 * merger.linear_fc2; and one more merger per deepstack index,
 * deepstack_merger_list.J.{norm, linear_fc1, linear_fc2}, whose LayerNorm
 * is over 4 width (after the 2x2 merge: use_postshuffle_norm). */
#ifndef AT_MODEL_VISION_CONFIG_H
#define AT_MODEL_VISION_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef enum { AT_VISION_NONE = 0, AT_VISION_QWEN2_VL, AT_VISION_QWEN2_5_VL, AT_VISION_QWEN3_VL } at_vision_kind;

#define AT_VISION_MAX_FULLATT 64
#define AT_VISION_MAX_DEEPSTACK 16

typedef struct {
    at_vision_kind kind;
    int depth;               /* blocks */
    int width;               /* Qwen2-VL embed_dim, Qwen2.5-VL hidden_size */
    int intermediate_size;   /* Qwen2-VL embed_dim * mlp_ratio */
    int num_heads;
    int in_chans;            /* 3 */
    int out_hidden_size;     /* the merger's output: the language model's hidden size */
    int patch_size;          /* 14 */
    int temporal_patch_size; /* 2 */
    int spatial_merge_size;  /* 2 */
    int window_size;         /* Qwen2.5-VL: 112 pixels; 0 for Qwen2-VL */
    int n_fullatt;           /* Qwen2.5-VL: blocks with full attention */
    int fullatt_block_indexes[AT_VISION_MAX_FULLATT];
    char hidden_act[24];     /* "quick_gelu" (Qwen2-VL), "silu" (Qwen2.5-VL), "gelu_pytorch_tanh" (Qwen3-VL) */
    int num_position_embeddings; /* Qwen3-VL: a square number, the learned position grid */
    int n_deepstack;             /* Qwen3-VL: blocks whose output also goes through a deepstack merger */
    int deepstack_visual_indexes[AT_VISION_MAX_DEEPSTACK];
    /* from the top level of config.json */
    int32_t image_token_id, video_token_id, vision_start_token_id, vision_end_token_id;
    int mrope_section[3];    /* rope_scaling.mrope_section: t, h, w pairs of head_dim / 2 */
} at_vision_config;

/* The kind from config.json's model_type ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"), or
 * AT_VISION_NONE for a text-only model (no vision_config). A vision_config
 * with another model_type is AT_ERR_UNSUPPORTED. */
at_status at_vision_kind_of(const cJSON *root, const char *what, at_vision_kind *kind);

/* "Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL" (messages). */
const char *at_vision_kind_name(at_vision_kind kind);

/* Reads and validates the vision side of a parsed config.json (what names it
 * in messages). */
at_status at_vision_config_from_json(const cJSON *root, const char *what, at_vision_config *vc);

/* One tensor of the tower: its safetensors name and shape. */
typedef struct {
    char name[112];
    int ndim;
    int64_t shape[5];
} at_vision_tensor;

/* The tensors the tower needs, in file order: *out (malloc'd, caller frees)
 * and *n. */
at_status at_vision_tensors(const at_vision_config *vc, at_vision_tensor **out, size_t *n);

/* Tensor `name` (a visual.* name of at_vision_tensors) of m: under that
 * name, as the published folders store it, or under model.visual.*, as
 * transformers 4.52 and later save the model; NULL when neither is there. */
struct at_st_model;
struct at_st_info;
const struct at_st_info *at_vision_find(const struct at_st_model *m, const char *name);

/* Checks that every tensor of the tower is in the model with its shape; the
 * message names the first one missing or of another shape. */
struct at_st_model;
at_status at_vision_check_weights(const at_vision_config *vc, const struct at_st_model *m, const char *what);

/* The loader's check of a folder's vision side: AT_OK for a text-only folder
 * (config.json without vision_config); for Qwen2-VL / Qwen2.5-VL the vision
 * config is read and the tower's tensors in weights (a folder or
 * .safetensors path, as at_st_model_open takes) are checked, the message
 * naming what is wrong or missing. The language model is then loaded as a
 * Qwen2 decoder with M-RoPE (config.h). */
at_status at_vision_gate(const char *config_dir, const char *weights);

#endif
