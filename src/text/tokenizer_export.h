/* A tokenizer as the arrays a GGUF file stores (tokenizer.ggml.*), for
 * embedding it in exported GGUF files the way llama.cpp's converter does:
 *
 *   tokenizer.ggml.model       "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2/3...)
 *                              or "llama" (SentencePiece-style: Llama 2, Mistral,
 *                              TinyLlama, llama2.c)
 *   tokenizer.ggml.pre         gpt2 only: llama.cpp's name of the pre-tokenizer
 *                              ("gpt-2", "llama-bpe", "qwen2", "smollm", "falcon")
 *   tokens, token_type         one per id, 0 .. vocab size - 1 (ids without a token,
 *                              as in trimmed vocabularies, become "[PAD<id>]" UNUSED)
 *   scores                     llama: the model's scores, or for a BPE with merges
 *                              -(rank of the first merge making the token), so that
 *                              "best score first" merges in rank order
 *   merges                     gpt2: "left right", in rank order
 *   bos/eos/unk/padding ids, add_bos_token, add_eos_token, add_space_prefix
 *
 * Token types: 1 normal, 2 unknown, 3 control (special added tokens),
 * 4 user-defined (other added tokens), 5 unused, 6 byte (<0xXX>).
 *
 * The pre-tokenizer of a tokenizer.json is identified by splitting a probe
 * text (digits, contractions, CJK, emoji, runs of spaces and newlines,
 * combining marks) with it and with each known family: the family giving
 * the same pieces is the one named. */
#ifndef AT_TEXT_TOKENIZER_EXPORT_H
#define AT_TEXT_TOKENIZER_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "text/tokenizer.h"

enum {
    AT_TOKTYPE_NORMAL = 1,
    AT_TOKTYPE_UNKNOWN = 2,
    AT_TOKTYPE_CONTROL = 3,
    AT_TOKTYPE_USER_DEFINED = 4,
    AT_TOKTYPE_UNUSED = 5,
    AT_TOKTYPE_BYTE = 6
};

typedef struct {
    char model[8];          /* "gpt2" or "llama" */
    char pre[32];           /* gpt2: llama.cpp's pre-tokenizer name; "" for llama */
    size_t n_tokens;
    char **tokens;          /* [n_tokens], NUL-terminated (token_lens give the length) */
    size_t *token_lens;
    float *scores;          /* [n_tokens]; NULL for gpt2 */
    int32_t *token_types;   /* [n_tokens] */
    size_t n_merges;
    char **merges;          /* [n_merges] "left right"; none for llama */
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos, add_eos, add_space_prefix;
} at_tokenizer_gguf;

/* The GGUF arrays of t. AT_ERR_UNSUPPORTED (with a message) for a tokenizer
 * whose pipeline has no GGUF equivalent. Caller frees *out with
 * at_tokenizer_gguf_free. */
at_status at_tokenizer_to_gguf(const at_tokenizer *t, at_tokenizer_gguf **out);
void at_tokenizer_gguf_free(at_tokenizer_gguf *g); /* NULL ok */

/* A view of g for at_tokenizer_from_arrays (pointers into g). */
void at_tokenizer_gguf_arrays(const at_tokenizer_gguf *g, at_tokenizer_arrays *a);

/* The pre-tokenizer family of a byte-level BPE tokenizer, in llama.cpp's
 * spelling ("gpt-2", "llama-bpe", "qwen2", "smollm", "falcon") into
 * name[len]. AT_ERR_UNSUPPORTED when no family splits text as t does. */
at_status at_tokenizer_detect_pre(const at_tokenizer *t, char *name, size_t len);

/* The probe text used to compare pre-tokenizers (also a good check that two
 * tokenizers encode alike). NUL-terminated UTF-8. */
const char *at_tokenizer_probe_text(void);

#endif
