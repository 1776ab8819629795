/* Tokenizers equal to Hugging Face's `tokenizers` library.
 *
 * Sources:
 *   - a tokenizer.json (BPE models: byte-level as GPT-2 / Qwen2 / Llama 3, or
 *     SentencePiece-style with "▁" and byte fallback as Llama 2 / Mistral),
 *   - a folder with vocab.json + merges.txt (or encoder.json + vocab.bpe), the
 *     pre-tokenizer then chosen from tokenizer_config.json or a family name,
 *   - a llama2.c tokenizer.bin,
 *   - plain arrays (the tokenizer.ggml.* keys of a GGUF file).
 * A folder may hold tokenizer_config.json / special_tokens_map.json, read for
 * the BOS/EOS/PAD tokens and added tokens.
 *
 * Text given to encode is UTF-8; invalid sequences are read as U+FFFD (what a
 * Python str would hold). A tokenizer is read-only once built; encode and
 * decode may run on several threads at once. */
#ifndef AT_TEXT_TOKENIZER_H
#define AT_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct at_tokenizer at_tokenizer;

/* Encode flags. */
enum {
    AT_TOK_ADD_SPECIAL = 1,   /* run the post-processor (e.g. prepend BOS) */
    AT_TOK_PARSE_SPECIAL = 2  /* recognise special tokens written in the text
                                 (chat templates: on; user text: off). Added
                                 tokens that are not special are always
                                 recognised, as in Hugging Face. */
};

typedef struct {
    /* Pre-tokenizer family for vocab.json + merges.txt folders, overriding
     * the choice made from tokenizer_config.json: "gpt2", "llama3", "qwen2",
     * "falcon", "smollm" ... (llama.cpp's tokenizer.ggml.pre names work). NULL:
     * choose. */
    const char *pre;
} at_tokenizer_opts;

/* Loads a tokenizer from a folder (tokenizer.json, else vocab.json +
 * merges.txt, else encoder.json + vocab.bpe, else tokenizer.bin) or from a
 * file (tokenizer.json or a llama2.c tokenizer.bin). opts may be NULL.
 * *out is freed with at_tokenizer_free. A tokenizer.json that uses a
 * component this library lacks is an AT_ERR_UNSUPPORTED naming it. */
at_status at_tokenizer_load(const char *path, const at_tokenizer_opts *opts, at_tokenizer **out);

/* The llama2.c tokenizer file in folder dir: dir/tokenizer.bin, else the one
 * tok*.bin there (llama2.c's tok512.bin, ...). *path: a new string (free()).
 * AT_ERR_NOT_FOUND, with a message naming dir, when there is none or several
 * tok*.bin. */
at_status at_tokenizer_find_llama2c(const char *dir, char **path);

/* Builds a tokenizer from the text of a tokenizer.json; `what` names it in
 * errors. */
at_status at_tokenizer_from_json(const char *json, size_t len, const char *what, at_tokenizer **out);

/* The arrays a GGUF file stores under tokenizer.ggml.*. Strings are UTF-8 and
 * need not be NUL-terminated; everything is copied. */
typedef struct {
    const char *model;           /* "gpt2" (byte-level BPE) or "llama" (SentencePiece scores) */
    const char *pre;             /* tokenizer.ggml.pre, or NULL ("default") */
    size_t n_tokens;
    const char *const *tokens;
    const size_t *token_lens;    /* NULL: NUL-terminated */
    const float *scores;         /* may be NULL for gpt2 */
    const int32_t *token_types;  /* 1 normal, 2 unknown, 3 control, 4 user defined,
                                    5 unused, 6 byte; may be NULL */
    size_t n_merges;
    const char *const *merges;   /* "a b" */
    const size_t *merge_lens;    /* NULL: NUL-terminated */
    int32_t bos_id, eos_id, unk_id, pad_id;  /* -1 when absent */
    int add_bos, add_eos;        /* what AT_TOK_ADD_SPECIAL adds */
    int add_space_prefix;        /* llama: prepend "▁" (tokenizer.ggml.add_space_prefix, default 1) */
} at_tokenizer_arrays;

at_status at_tokenizer_from_arrays(const at_tokenizer_arrays *a, at_tokenizer **out);

void at_tokenizer_free(at_tokenizer *t);

/* Encodes text[0..len). *ids is a new array the caller frees with free()
 * (NULL when *n is 0). flags: AT_TOK_ADD_SPECIAL | AT_TOK_PARSE_SPECIAL. */
at_status at_tokenizer_encode(const at_tokenizer *t, const char *text, size_t len, unsigned flags,
                              int32_t **ids, size_t *n);

/* Decodes ids into a new NUL-terminated string (*out, caller frees; *len
 * excludes the NUL, len may be NULL). skip_special drops special tokens.
 * Ids out of range are an error. */
at_status at_tokenizer_decode(const at_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *len);

/* The bytes one token stands for on its own (byte-level and "▁" mapped back,
 * <0xXX> as its byte, no leading-space strip): a new buffer the caller frees
 * (*out, NUL-terminated, *len excludes the NUL). */
at_status at_tokenizer_token_to_piece(const at_tokenizer *t, int32_t id, char **out, size_t *len);

/* The token's string as stored in the vocabulary ("Ġthe", "▁the",
 * "<|im_end|>"), owned by the tokenizer; NULL for an unknown id. */
const char *at_tokenizer_id_to_token(const at_tokenizer *t, int32_t id);
/* The id of a token string (vocabulary or added token), or -1. */
int32_t at_tokenizer_token_to_id(const at_tokenizer *t, const char *token);
/* The id of an added token with that exact text that is special, or -1. */
int32_t at_tokenizer_special_id(const at_tokenizer *t, const char *text);
/* Whether id is a special (control) token. */
int at_tokenizer_is_special(const at_tokenizer *t, int32_t id);

/* Number of ids (the largest id + 1, added tokens included). */
size_t at_tokenizer_vocab_size(const at_tokenizer *t);
int32_t at_tokenizer_bos(const at_tokenizer *t);  /* -1 when none */
int32_t at_tokenizer_eos(const at_tokenizer *t);
int32_t at_tokenizer_pad(const at_tokenizer *t);
int32_t at_tokenizer_unk(const at_tokenizer *t);
/* The pre-tokenizer in use: "tokenizer.json" when the file defined it, else the
 * family chosen for vocab.json/merges.txt or GGUF ("gpt2", "llama3", ...), or
 * "llama2c". Owned by the tokenizer. */
const char *at_tokenizer_pre_name(const at_tokenizer *t);

/* Whether tokenizer t fits a model of vocabulary model_vocab (loaded from
 * `model`, for the message): no id at or past the model's vocabulary (the
 * model may have more rows than the tokenizer has ids, as Qwen's padded
 * embeddings), and a llama2.c tokenizer.bin exactly as many as the model (it
 * stores no count: a cut file would otherwise load). The error names both
 * sizes. */
at_status at_tokenizer_check_vocab(const at_tokenizer *t, int64_t model_vocab, const char *model);

/* Streaming decode: feed ids one at a time; each call gives the text that is
 * complete so far (never a cut multi-byte character). */
typedef struct at_tok_stream at_tok_stream;

at_status at_tok_stream_new(const at_tokenizer *t, int skip_special, at_tok_stream **out);
/* The stream continues text that came before it (a completion of a prompt
 * that holds more than BOS): its first token keeps its leading space, which
 * only a text decoded from its start drops (SentencePiece's dummy prefix). */
void at_tok_stream_continue(at_tok_stream *s);
/* Adds id; *text and *len get the newly completed bytes (may be empty), owned by
 * the stream and valid until the next call. */
at_status at_tok_stream_push(at_tok_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the stream: bytes still held (an incomplete character) come out as
 * U+FFFD. Same ownership as push. */
at_status at_tok_stream_flush(at_tok_stream *s, const char **text, size_t *len);
void at_tok_stream_free(at_tok_stream *s);

#endif
