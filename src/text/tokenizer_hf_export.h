/* A tokenizer written as Hugging Face files, the way transformers' converters
 * write them (convert_slow_tokenizer.py LlamaConverter / GPT2Converter and
 * the GGUF integration, integrations/ggml.py), so that a folder exported
 * from a GGUF file or a llama2.c checkpoint loads with AutoTokenizer and with
 * at_tokenizer_load:
 *
 *   tokenizer.json           model BPE with vocab and merges (as pairs), the
 *                            added tokens with their flags, and the pipeline:
 *     SentencePiece-style ("llama" GGUF kind, llama2.c, Llama 2 / Mistral):
 *       byte_fallback true, fuse_unk true, unk_token;
 *       merges: as given when the tokenizer has a merge table, else derived
 *       from the scores as transformers does (every split of every token into
 *       two tokens, ordered by the score of the token they make, highest
 *       first; ties by the ids of the two halves);
 *       normalizer Prepend("▁") + Replace(" ", "▁") and no pre-tokenizer:
 *       the form transformers 4.x writes for Llama 2 (legacy=True, the
 *       default, and what meta-llama/Llama-2-7b-hf's tokenizer.json holds).
 *       A tokenizer that uses the Metaspace pre-tokenizer instead (the
 *       non-legacy form, e.g. Mistral v0.3) keeps it;
 *       decoder Replace("▁", " ") + ByteFallback + Fuse (+ Strip one leading
 *       space when a "▁" is prepended);
 *     byte-level ("gpt2" GGUF kind): the pre-tokenizer of its family as the
 *       model's own tokenizer.json has it: gpt-2 (ByteLevel with GPT-2's
 *       regex), llama-bpe (Llama 3: Split with its regex, ignore_merges),
 *       qwen2 (NFC, Split with Qwen's regex), smollm (Digits, ByteLevel),
 *       falcon (Punctuation, ByteLevel, Digits, Split of three digits);
 *       ByteLevel decoder;
 *     post_processor: TemplateProcessing adding BOS / EOS as add_bos /
 *       add_eos say (after a ByteLevel step for byte-level tokenizers);
 *   tokenizer_config.json    add_bos_token, add_eos_token, added_tokens_decoder,
 *                            bos/eos/unk/pad tokens, model_max_length,
 *                            chat_template, tokenizer_class
 *                            (LlamaTokenizerFast / PreTrainedTokenizerFast)
 *   special_tokens_map.json  bos/eos/unk/pad tokens
 *
 * Ids without a token (gaps in a trimmed vocabulary) are left out of the
 * vocabulary; so is a merge whose parts or result are not in the written
 * vocabulary (Hugging Face refuses such a merge; a warning counts them). A
 * token that is not valid UTF-8 (or holds a NUL) cannot be a
 * JSON string: AT_ERR_UNSUPPORTED naming its id. */
#ifndef AT_TEXT_TOKENIZER_HF_EXPORT_H
#define AT_TEXT_TOKENIZER_HF_EXPORT_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "text/tokenizer.h"

typedef struct {
    const char *chat_template; /* tokenizer_config.json "chat_template"; NULL: none */
    int64_t model_max_length;  /* the model's context length; <= 0: not written */
} at_tokenizer_hf_opts;

/* The three files as JSON objects (each freed by the caller with
 * cJSON_Delete). o may be NULL. AT_ERR_UNSUPPORTED, naming the kind, for a
 * tokenizer with no such form (e.g. BPE with subword prefixes, a byte-level
 * pre-tokenizer of no known family). */
at_status at_tokenizer_hf_build(const at_tokenizer *t, const at_tokenizer_hf_opts *o, cJSON **tokenizer_json,
                                cJSON **tokenizer_config, cJSON **special_tokens_map);

/* Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json
 * into the existing folder dir (each file atomically). */
at_status at_tokenizer_hf_write(const at_tokenizer *t, const at_tokenizer_hf_opts *o, const char *dir);

/* Writes the three objects at_tokenizer_hf_build made into dir, as
 * at_tokenizer_hf_write does (the caller keeps ownership). Lets a caller
 * build first, so that a tokenizer with no Hugging Face form fails before
 * any slow work, and write later. */
at_status at_tokenizer_hf_save(const cJSON *tokenizer_json, const cJSON *tokenizer_config,
                               const cJSON *special_tokens_map, const char *dir);

#endif
