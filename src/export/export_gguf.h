/* Writing GGUF files that llama.cpp loads: a whole model, or a LoRA adapter
 * alone (llama.cpp's --lora file); and reading a GGUF's embedded tokenizer.
 *
 * A model file follows llama.cpp's convert_hf_to_gguf.py:
 *   general.architecture  "llama" (Llama, Mistral, SmolLM, TinyLlama, llama2.c),
 *                         "qwen2" or "qwen3"; general.type "model",
 *                         general.name, general.file_type (0 F32, 1 F16,
 *                         2 Q4_0, 7 Q8_0, 32 BF16), general.quantization_version 2
 *                         when quantized;
 *   {arch}.vocab_size, context_length, embedding_length, block_count,
 *   feed_forward_length, attention.head_count, attention.head_count_kv,
 *   rope.dimension_count, rope.freq_base, attention.layer_norm_rms_epsilon,
 *   attention.key_length / value_length (when head_dim != hidden / heads),
 *   rope.scaling.type "linear" + rope.scaling.factor; Llama 3.1 scaling as
 *   llama.cpp stores it: a tensor rope_freqs.weight of per-pair divisors;
 *   tensors token_embd, output_norm, output (absent when tied),
 *   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm,
 *   attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.{weight,bias};
 *   for arch "llama" the rows of attn_q / attn_k (weights and biases) in the
 *   interleaved RoPE order (qk_permute.h), as llama.cpp's LlamaModel.permute;
 *   1-D tensors f32; matrices in the asked type; a matrix whose rows are not
 *   a multiple of 32 cannot be Q8_0/Q4_0 and is written F16 (as llama.cpp's
 *   converter falls back);
 *   the tokenizer (text/tokenizer_export.h) and tokenizer.chat_template.
 *
 * An adapter file follows llama.cpp's convert_lora_to_gguf.py:
 *   general.architecture, general.type "adapter", adapter.type "lora",
 *   adapter.lora.alpha (llama.cpp scales by alpha / rank, so alpha is written
 *   as scale · rank: rsLoRA adapters keep their scale);
 *   blk.N.attn_q.weight.lora_a = A [r, in] (ne {in, r}),
 *   blk.N.attn_q.weight.lora_b = B [out, r] (ne {r, out}), B's rows permuted
 *   for q/k of arch "llama". */
#ifndef AT_EXPORT_EXPORT_GGUF_H
#define AT_EXPORT_EXPORT_GGUF_H

#include "base/status.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct {
    at_dtype quant;            /* AT_F32, AT_F16, AT_BF16, AT_Q8_0, AT_Q4_0; AT_DTYPE_COUNT:
                                  the model's own (f32 / f16 / bf16) */
    const at_tokenizer *tok;   /* embedded when non-NULL */
    const at_gguf *tok_gguf;   /* else: tokenizer.* keys copied from this GGUF (a GGUF source) */
    const char *chat_template; /* tokenizer.chat_template; NULL: none */
    const char *name;          /* general.name; NULL: "anytune export" */
    int progress;              /* progress bar on stderr */
} at_export_gguf_opts;

/* "llama", "qwen2" or "qwen3" for cfg's model_type ("qwen2vl" for the
 * language model of Qwen2-VL / Qwen2.5-VL: M-RoPE, written as
 * qwen2vl.rope.dimension_sections = the mrope_section pairs + a 0, as
 * llama.cpp's converter does; its vision tower goes to a separate mmproj
 * file, export_vision.h); NULL when GGUF has no architecture llama.cpp would
 * run the model as. */
const char *at_export_gguf_arch(const at_model_config *cfg);

/* llama.cpp's general.file_type (llama_ftype) of a file mostly of type t. */
uint32_t at_export_gguf_file_type(at_dtype t);

/* The type a tensor of t's shape is written in, in a file of type q: 1-D
 * tensors F32; matrices q, or F16 when q is Q8_0 / Q4_0 and their rows are
 * not a multiple of 32 (as llama.cpp's converter falls back). */
at_dtype at_export_gguf_tensor_type(const at_tensor *t, at_dtype q);

/* *out = a new host tensor holding t (host or device, f32/bf16/f16) in type
 * (f32, f16, bf16: cast; Q8_0, Q4_0: quantized). Caller frees. */
at_status at_export_gguf_convert(const at_tensor *t, at_dtype type, at_tensor **out);

/* Parses "f32", "f16", "bf16", "q8_0", "q4_0" (any case). */
at_status at_export_parse_quant(const char *s, at_dtype *out);

/* Writes w as a GGUF model file at path (atomically). o may be NULL. A
 * tokenizer whose vocabulary is larger than the model's is refused (llama.cpp
 * would); a smaller one is padded with "[PAD<id>]" unused tokens. */
at_status at_export_gguf_model(const at_decoder_weights *w, const char *path, const at_export_gguf_opts *o);

/* Writes adapter a (for a model of config cfg) as a llama.cpp LoRA GGUF at
 * path. dtype: AT_F32, AT_F16 or AT_BF16 (A's rows are only r long, too
 * short for block types). */
at_status at_export_gguf_adapter(const at_adapter *a, const at_model_config *cfg, const char *path, at_dtype dtype);

/* The tokenizer a GGUF file embeds (tokenizer.ggml.*). Caller frees *out with
 * at_tokenizer_free. AT_ERR_NOT_FOUND when the file has none. */
at_status at_export_gguf_read_tokenizer(const at_gguf *g, at_tokenizer **out);

#endif
