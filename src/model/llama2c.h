/* llama2.c checkpoints (karpathy/llama2.c, the legacy "version 0" .bin that
 * run.c reads):
 *
 *   7 x int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 *              seq_len   (vocab_size < 0: the classifier is not shared)
 *   f32 weights: token_embedding [vocab, dim]; rms_att [L, dim];
 *     wq [L, dim, dim]; wk [L, kv_dim, dim]; wv [L, kv_dim, dim];
 *     wo [L, dim, dim]; rms_ffn [L, dim]; w1 [L, hidden, dim];
 *     w2 [L, dim, hidden]; w3 [L, hidden, dim]; rms_final [dim];
 *     freq_cis_real, freq_cis_imag [seq_len * head_size / 2] each (unused);
 *     wcls [vocab, dim] when not shared.
 *
 * The weights are exposed under Hugging Face Llama names with HF shapes
 * (model.embed_tokens.weight, model.layers.N.input_layernorm.weight,
 * model.layers.N.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.N.post_attention_layernorm.weight,
 * model.layers.N.mlp.{gate,down,up}_proj.weight (w1, w2, w3), model.norm.weight,
 * lm_head.weight only when the classifier is not shared), with a config
 * (model_type llama, rope_theta 10000, rms_norm_eps 1e-5, tie_word_embeddings
 * when shared, max_position_embeddings = seq_len), so one decoder runs them.
 *
 * RoPE: llama2.c rotates adjacent pairs (interleaved); the HF decoder rotates
 * halves. The q_proj and k_proj rows are therefore permuted on load as
 * transformers' convert_llama_weights_to_hf.py does (see qk_permute.h), which
 * makes the HF decoder compute exactly what run.c computes. Those two tensors
 * per layer are copies; every other tensor is a zero-copy read-only view of
 * the mapped file. */
#ifndef AT_MODEL_LLAMA2C_H
#define AT_MODEL_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"
#include "model/config.h"

typedef struct at_llama2c at_llama2c;

/* Reads a checkpoint from memory (not copied: data must outlive *out);
 * `what` names it in messages. Validates the header (positive sizes,
 * heads divide dim, kv heads divide heads, even head size) and that the size
 * of the file is exactly what the header implies (shared or not).
 * Caller closes with at_llama2c_close. */
at_status at_llama2c_parse(const void *data, size_t size, const char *what, at_llama2c **out);
/* Maps `path` and parses it. */
at_status at_llama2c_open(const char *path, at_llama2c **out);
void at_llama2c_close(at_llama2c *m); /* NULL ok */

/* The config built from the header (owned by m). */
const at_model_config *at_llama2c_config(const at_llama2c *m);
/* The header's seq_len (the training context). */
int at_llama2c_seq_len(const at_llama2c *m);

/* Tensors under HF names, owned by m (do not free; valid until close).
 * at_llama2c_find returns NULL when absent. */
size_t at_llama2c_count(const at_llama2c *m);
const at_tensor *at_llama2c_tensor_at(const at_llama2c *m, size_t i);
const at_tensor *at_llama2c_find(const at_llama2c *m, const char *name);

#endif
