/* Row permutation of q/k projection weights between the two RoPE pairings.
 *
 * Meta's original Llama code, llama2.c and llama.cpp's GGUF "llama" tensors
 * rotate ADJACENT pairs of a head's features (x[2i], x[2i+1]) ("interleaved",
 * GPT-J style). Hugging Face's decoder rotates HALVES: (x[i], x[i + d/2])
 * (rotate_half, GPT-NeoX style), with the same frequency theta^(-2i/d) for
 * pair i. Both compute the same attention if the rows of W_q and W_k (and of
 * their biases) are reordered within each head, which is what
 * transformers' convert_llama_weights_to_hf.py does:
 *
 *   def permute(w, n_heads, dim1, dim2):        # interleaved -> halves
 *       return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
 *
 * i.e. with d = head_dim, for head h, i < d/2 and c in {0, 1}:
 *
 *   halves[h*d + c*d/2 + i] = interleaved[h*d + 2*i + c]
 *
 * llama.cpp's convert_hf_to_gguf.py applies the inverse (LlamaModel.permute)
 * to HF q/k weights of arch "llama", so GGUF llama files hold the interleaved
 * order and are turned back with AT_QK_TO_HALVES. (GGUF qwen2/qwen3 tensors are
 * not permuted: those use the halves order already.) W_k uses the number of
 * KV heads. Rows are opaque byte strings, so quantized rows (Q8_0, Q4_0: whole
 * blocks per row) and 1-element rows (biases) are permuted the same way. */
#ifndef AT_MODEL_QK_PERMUTE_H
#define AT_MODEL_QK_PERMUTE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"

typedef enum {
    AT_QK_TO_HALVES = 0,     /* interleaved (Meta, llama2.c, GGUF llama) -> HF rotate_half */
    AT_QK_TO_INTERLEAVED = 1 /* HF -> interleaved (for writing GGUF llama) */
} at_qk_direction;

/* Permutes n_rows rows of row_bytes bytes each from src into dst (which must
 * not overlap). n_rows must be n_heads * head_dim with head_dim even:
 * AT_ERR_INVALID otherwise, naming `what`. */
at_status at_qk_permute_rows(void *dst, const void *src, int64_t n_rows, size_t row_bytes, int n_heads,
                             at_qk_direction dir, const char *what);

/* Permutes a host tensor's rows (dim 0; a 1-D tensor's elements) in place,
 * through a temporary copy. The tensor must own writable memory (not a
 * read-only mapped view). n_heads is the tensor's own head count (KV heads
 * for W_k). */
at_status at_qk_permute_tensor(at_tensor *t, int n_heads, at_qk_direction dir);

#endif
