/* Model configuration of the Llama family (Llama 2/3, Mistral, Qwen2/2.5,
 * Qwen3, and the same architectures under other names: SmolLM, TinyLlama...),
 * read from a Hugging Face config.json or built by the GGUF / llama2.c readers.
 *
 * Differences between the family members are fields here, never copies of the
 * decoder: q/k/v bias (Qwen2), q/k RMSNorm (Qwen3), head_dim != hidden/heads
 * (Qwen3, Mistral-Nemo), tied embeddings, RoPE scaling (linear, llama3).
 *
 * Anything the decoder could not honour is refused when the config is read,
 * with a message naming the field: an unknown model_type, hidden_act other
 * than silu, rope_scaling yarn/dynamic/..., mlp_bias true, ... */
#ifndef AT_MODEL_CONFIG_H
#define AT_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "device/dtype.h"

#define AT_MAX_EOS_IDS 8

typedef enum {
    AT_ROPE_DEFAULT = 0, /* inv_freq[k] = 1 / theta^(2k / head_dim) */
    AT_ROPE_LINEAR,      /* default / factor (position interpolation) */
    AT_ROPE_LLAMA3,      /* Llama 3.1 frequency-dependent scaling */
    AT_ROPE_FACTORS      /* default / rope_freq_factors[k]: the per-pair divisors GGUF files store
                            as rope_freqs.weight (how llama.cpp keeps Llama 3.1 scaling) */
} at_rope_type;

#define AT_MAX_ROPE_PAIRS 256 /* head_dim up to 512 */

typedef struct at_model_config {
    char model_type[32];     /* "llama", "mistral", "qwen2", "qwen3" (lower case, as in config.json); a
                                Qwen2-VL / Qwen2.5-VL folder's language model is "qwen2" with
                                mrope_section set (its vision side: vision_config.h) */
    int hidden_size;         /* d_model */
    int intermediate_size;   /* MLP width */
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* = num_attention_heads when the file does not say (no GQA) */
    int head_dim;            /* "head_dim" when given, else hidden_size / num_attention_heads */
    int vocab_size;
    int64_t max_position_embeddings; /* 0 when unknown */
    double rms_norm_eps;
    double rope_theta;       /* "rope_theta", default 10000 */

    /* rope_scaling (null / absent / type "default" give AT_ROPE_DEFAULT) */
    at_rope_type rope_type;
    double rope_factor;            /* linear and llama3 */
    double rope_low_freq_factor;   /* llama3 */
    double rope_high_freq_factor;  /* llama3 */
    int64_t rope_original_max_position_embeddings; /* llama3 */
    float rope_freq_factors[AT_MAX_ROPE_PAIRS];    /* AT_ROPE_FACTORS: head_dim / 2 divisors */
    /* Multimodal RoPE (Qwen2-VL, Qwen2.5-VL: rope_scaling.mrope_section): each
     * token has three positions (temporal, height, width) and the first
     * mrope_section[0] frequency pairs turn by the temporal one, the next [1]
     * by the height, the last [2] by the width (sum = head_dim / 2; mrope.h
     * computes the ids). All 0: one position per token.
     * mrope_interleaved (Qwen3-VL: rope_scaling.mrope_interleaved): the
     * frequencies take t, h, w in turn instead (at_rope_sections). */
    int mrope_section[3];
    int mrope_interleaved;

    int tie_word_embeddings; /* lm_head shares model.embed_tokens.weight (no lm_head.weight needed) */
    int attn_qkv_bias;       /* q_proj/k_proj/v_proj have a bias: qwen2 always; attention_bias for llama/qwen3 */
    int attn_o_bias;         /* o_proj has a bias: only llama/qwen3 with attention_bias true */
    int qk_norm;             /* q_norm/k_norm RMSNorm over head_dim before RoPE (qwen3) */

    /* Attention window: 0 = full causal attention. Otherwise the model was
     * trained with a sliding window of this many tokens; the decoder only does
     * full attention, which equals sliding-window attention for sequences of at
     * most this length, so it must refuse longer sequences. */
    int64_t sliding_window;

    char torch_dtype[16];    /* as written ("bfloat16", "float16", "float32"), "" when absent */
    int has_dtype;           /* torch_dtype maps to `dtype` */
    at_dtype dtype;          /* AT_BF16 / AT_F16 / AT_F32 when has_dtype */

    int bos_token_id;        /* -1 when absent */
    int n_eos;               /* 0..AT_MAX_EOS_IDS: eos_token_id may be a list */
    int eos_token_ids[AT_MAX_EOS_IDS];
} at_model_config;

/* Fills cfg with the defaults of a Llama config (theta 10000, eps 1e-6,
 * bos -1, no eos, default RoPE); sizes are zero. */
void at_model_config_init(at_model_config *cfg);

/* Reads a parsed config.json object. `what` names it in errors (a path).
 * On success the config is complete and validated (at_model_config_validate). */
at_status at_model_config_from_json(const cJSON *obj, const char *what, at_model_config *cfg);

/* Parses config.json text[0..len) (need not be NUL-terminated). */
at_status at_model_config_parse(const char *text, size_t len, const char *what, at_model_config *cfg);

/* Reads `path`: a config.json file, or a model folder holding config.json. */
at_status at_model_config_load(const char *path, at_model_config *cfg);

/* ms-swift's --model_type: the family to read a model as, whatever its
 * config.json's model_type says (a fine-tune saved with a wrong or missing
 * one). Names: ms-swift's model types of the families the decoder runs
 * (qwen2_5 -> qwen2, llama3_1 -> llama, ...) and Hugging Face's. */
#define AT_MODEL_TYPE_CHOICES                                                                                       \
    "llama|llama3|llama3_1|llama3_2|yi|mistral|qwen2|qwen2_5|qwen2_5_math|qwq|qwen3|qwen3_thinking|qwen3_nothinking"
#define AT_MODEL_TYPE_NAMES                                                                                         \
    "llama, llama3, llama3_1, llama3_2, yi (llama); mistral; qwen2, qwen2_5, qwen2_5_math, qwq (qwen2); qwen3, "    \
    "qwen3_thinking, qwen3_nothinking (qwen3)"
/* The option row of --model_type (base/options.h), for every command that loads a model. */
#define AT_MODEL_TYPE_OPTION_FIELDS                                                                                 \
    .name = "model_type", .type = AT_OPT_STRING, .choices = AT_MODEL_TYPE_CHOICES,                                \
    .help = "read the model folder as this family whatever its config.json says (ms-swift's model types: "       \
            AT_MODEL_TYPE_NAMES ")"
#define AT_MODEL_TYPE_OPTION_ROW {AT_MODEL_TYPE_OPTION_FIELDS}

/* The family ("llama", "mistral", "qwen2", "qwen3") of a --model_type name, or NULL. */
const char *at_model_type_family(const char *name);

/* at_model_config_load / _parse reading the config as model_type's family
 * (NULL: as it says). An unknown name is AT_ERR_INVALID listing the known ones. */
at_status at_model_config_load_as(const char *path, const char *model_type, at_model_config *cfg);
at_status at_model_config_parse_as(const char *text, size_t len, const char *what, const char *model_type,
                                   at_model_config *cfg);

/* For sources whose family is not a config field (GGUF, llama2.c): a
 * model_type of another family is refused, naming both. NULL: AT_OK. */
at_status at_model_type_check(const at_model_config *cfg, const char *what, const char *model_type);

/* Checks that the sizes are positive and consistent (heads divide hidden when
 * head_dim is implied, kv heads divide heads, head_dim even, rope parameters
 * sane). Used by every reader; `what` names the source in the message. */
at_status at_model_config_validate(const at_model_config *cfg, const char *what);

/* RoPE inverse frequencies, head_dim / 2 floats into out, computed in float32
 * exactly like transformers' _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters and _compute_llama3_parameters
 * (modeling_rope_utils.py). The angle of pair k at position p is p * out[k];
 * pairs are (k, k + head_dim/2) (rotate_half convention). The attention
 * scaling factor is 1 for all three types. */
at_status at_model_config_rope_inv_freq(const at_model_config *cfg, float *out);

/* Writes the config as a Hugging Face config.json text (architectures,
 * model_type, every field above). *out is a new NUL-terminated string, caller
 * frees with free(). Reading it back gives the same config. */
at_status at_model_config_to_json(const at_model_config *cfg, char **out);

/* 1 when the model takes three M-RoPE positions per token (mrope_section set). */
static inline int at_model_config_mrope(const at_model_config *cfg) { return cfg->mrope_section[0] + cfg->mrope_section[1] + cfg->mrope_section[2] > 0; }

/* One line: "llama: 5 layers, hidden 64, heads 8/4 x 8, ffn 172, vocab 512". Returns buf. */
const char *at_model_config_describe(const at_model_config *cfg, char *buf, size_t len);

/* Builds the config of a GGUF file of arch "llama", "qwen2", "qwen3" or
 * "qwen2vl" (a qwen2 language model with M-RoPE: rope.dimension_sections'
 * first three, the fourth 0) from
 * its metadata ({arch}.embedding_length, block_count, feed_forward_length,
 * attention.head_count(_kv), attention.key_length, attention.layer_norm_rms_epsilon,
 * rope.freq_base, rope.scaling.type/factor, context_length, vocab_size or the
 * token list, tokenizer.ggml.bos/eos_token_id) and its tensors (output.weight
 * absent = tied; attn_q.bias, attn_output.bias, attn_q_norm present = biases,
 * q/k norm). Mistral models converted by llama.cpp say "llama". A tensor
 * rope_freqs.weight (Llama 3.1 scaling baked into factors) is refused as
 * unsupported. */
struct at_gguf;
at_status at_model_config_from_gguf(const struct at_gguf *g, const char *what, at_model_config *cfg);

#endif
