/* Internal types shared by the tokenizer's parts (src/text/tok_*.c and
 * tokenizer.c). Not a public API: only files of the tokenizer include it.
 *
 * The pipeline follows Hugging Face `tokenizers`:
 *   text -> split out added tokens (tok_added.c) -> normalize (tok_norm.c)
 *        -> pre-tokenize into pieces (tok_pretok.c) -> model: BPE (tok_bpe.c)
 *        -> post-process (tokenizer.c)
 *   ids  -> tokens -> decoders (tok_decode.c) -> text
 * Loaders (tok_load_json.c, tok_load_files.c) build the struct below. */
#ifndef AT_TEXT_TOK_INTERNAL_H
#define AT_TEXT_TOK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "base/status.h"
#include "text/tokenizer.h"

/* ---- growable byte buffer ---------------------------------------------- */
typedef struct {
    char *p;
    size_t len, cap;
} tok_buf;

at_status tok_buf_reserve(tok_buf *b, size_t extra);
at_status tok_buf_put(tok_buf *b, const void *data, size_t n);
at_status tok_buf_putc(tok_buf *b, char c);
void tok_buf_free(tok_buf *b);
/* A NUL-terminated copy of s[0..n) (malloc; the caller frees), NULL when out
 * of memory. */
char *tok_dup(const char *s, size_t n);

/* ---- UTF-8 helpers ------------------------------------------------------ */
/* Decodes one code point at s[0..n) (n >= 1); *cp gets it, returns its byte
 * length. Invalid or truncated sequences return 0. */
int tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Encodes cp into out (4 bytes room); returns its length. */
int tok_utf8_encode(uint32_t cp, char *out);
/* Length of the character that starts with byte c (1 for stray bytes). */
int tok_utf8_len(uint8_t c);
/* Copies text into out replacing every invalid sequence by U+FFFD, as
 * Rust's String::from_utf8_lossy does. */
at_status tok_utf8_sanitize(const char *text, size_t len, tok_buf *out);
/* Unicode predicates (utf8proc categories). */
int tok_is_space(uint32_t cp);   /* White_Space, as Rust's char::is_whitespace */
int tok_is_word(uint32_t cp);    /* regex \w: letters, marks, digits, connector punct. */
int tok_is_numeric(uint32_t cp); /* Rust char::is_numeric: Nd, Nl, No */
int tok_is_punct(uint32_t cp);   /* ASCII punctuation or Unicode P* */

/* ---- byte-level alphabet (GPT-2) --------------------------------------- */
/* Byte b is written as the code point tok_byte_cp[b]; its UTF-8 form is
 * tok_byte_utf8[b] (1 or 2 bytes, length tok_byte_utf8_len[b]). */
extern const uint16_t tok_byte_cp[256];
void tok_byte_level_init(void);
extern char tok_byte_utf8[256][2];
extern uint8_t tok_byte_utf8_len[256];
/* The byte a code point stands for, or -1 when cp is not in the alphabet. */
int tok_cp_to_byte(uint32_t cp);

/* ---- vocabulary: id <-> string ---------------------------------------- */
typedef struct {
    char **str;       /* by id; NULL for ids without a token */
    uint32_t *len;
    int32_t n;        /* ids 0..n-1 */
    int32_t *slots;   /* open-addressing index: id or -1 */
    uint32_t mask;
} tok_vocab;

at_status tok_vocab_init(tok_vocab *v, int32_t n);
/* Grows the id range to at least n. */
at_status tok_vocab_grow(tok_vocab *v, int32_t n);
/* Stores a copy of s under id (replacing any earlier string). The index is
 * rebuilt by tok_vocab_index. */
at_status tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t len);
/* Builds the string -> id index; where two ids share a string the lower id
 * wins unless prefer_last. */
at_status tok_vocab_index(tok_vocab *v);
int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t len);
void tok_vocab_free(tok_vocab *v);
uint64_t tok_hash(const void *data, size_t n);

/* ---- the BPE model ----------------------------------------------------- */
typedef enum {
    TOK_MODEL_BPE = 0,   /* merges by rank (tokenizer.json, merges.txt, GGUF gpt2) */
    TOK_MODEL_SCORES     /* merge the best-scored pair whose concatenation is a
                            token (llama2.c tokenizer.bin, GGUF llama) */
} tok_model_kind;

typedef struct {
    uint64_t key;   /* (left id << 32) | right id; 0 marks an empty slot (key+1 stored) */
    int32_t rank;
    int32_t new_id;
} tok_merge_slot;

#define TOK_CACHE_KEY 40
#define TOK_CACHE_IDS 14
typedef struct {
    uint64_t hash;
    uint8_t klen;   /* 0: empty */
    uint8_t nids;
    char key[TOK_CACHE_KEY];
    int32_t ids[TOK_CACHE_IDS];
} tok_cache_entry;
#define TOK_CACHE_SIZE 16384
#define TOK_CHAR_TABLE 0x800

typedef struct {
    tok_model_kind kind;
    tok_vocab vocab;
    tok_merge_slot *merges;   /* hash table */
    uint32_t merges_mask;
    size_t n_merges;
    float *scores;            /* TOK_MODEL_SCORES: by id */
    int32_t unk_id;           /* -1: none */
    int fuse_unk;
    int byte_fallback;
    int ignore_merges;
    char *cont_prefix;        /* continuing_subword_prefix or NULL */
    char *eow_suffix;         /* end_of_word_suffix or NULL */
    int32_t byte_ids[256];    /* <0xXX> tokens for byte fallback, -1 if absent */
    int32_t char_id[TOK_CHAR_TABLE]; /* id of each one-character token, -1 if absent */
    tok_cache_entry *cache;   /* NULL: no cache */
    pthread_mutex_t cache_lock;
    int cache_lock_ok;
} tok_bpe;

at_status tok_bpe_init(tok_bpe *m, tok_model_kind kind, int32_t n_vocab);
/* Adds merge "a b" as rank `rank` (lower merges first). Errors name `what`. */
at_status tok_bpe_add_merge(tok_bpe *m, const char *a, size_t alen, const char *b, size_t blen,
                            int32_t rank, const char *what);
/* Call after vocab and merges are complete: byte-fallback table, cache. */
at_status tok_bpe_finish(tok_bpe *m);
/* Tokenizes one pre-token, appending ids to *out. use_cache: whether the
 * caller holds the cache lock. */
at_status tok_bpe_encode(tok_bpe *m, const char *w, size_t n, int use_cache, int32_t **out,
                         size_t *nout, size_t *cap);
void tok_bpe_free(tok_bpe *m);

/* ---- pieces: a list of strings with where they came from -------------- */
typedef struct {
    uint32_t off, len;
    uint8_t at_start;   /* the piece starts at offset 0 of the original text */
} tok_piece;

typedef struct {
    tok_buf text;
    tok_piece *v;
    size_t n, cap;
} tok_pieces;

at_status tok_pieces_add(tok_pieces *p, const char *s, size_t len, int at_start);
/* Adds a piece of p's own text (no copy). */
at_status tok_pieces_add_ref(tok_pieces *p, uint32_t off, uint32_t len, int at_start);
void tok_pieces_clear(tok_pieces *p);
void tok_pieces_free(tok_pieces *p);

/* ---- normalizers -------------------------------------------------------- */
typedef enum {
    TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD,
    TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_LOWERCASE, TOK_NORM_STRIP
} tok_norm_kind;

typedef struct {
    tok_norm_kind kind;
    char *a;          /* PREPEND: text; REPLACE: literal pattern (when re is NULL) */
    size_t alen;
    char *b;          /* REPLACE: content */
    size_t blen;
    pcre2_code *re;   /* REPLACE with a Regex pattern */
    int left, right;  /* STRIP */
} tok_norm;

/* Applies the chain to s[0..n), writing the result to out (cleared first). */
at_status tok_normalize(const tok_norm *chain, size_t n_chain, const char *s, size_t n, tok_buf *out);
void tok_norm_free(tok_norm *n);

/* ---- pre-tokenizers ----------------------------------------------------- */
typedef enum {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum {
    TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE, TOK_PRE_DIGITS, TOK_PRE_PUNCT,
    TOK_PRE_WHITESPACE, TOK_PRE_WHITESPACE_SPLIT
} tok_pre_kind;

typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_scheme;

typedef struct {
    tok_pre_kind kind;
    tok_split_behavior behavior;
    int invert;
    pcre2_code *re;       /* SPLIT with a regex; BYTELEVEL use_regex; WHITESPACE */
    char *literal;        /* SPLIT with a String pattern */
    size_t literal_len;
    int add_prefix_space; /* BYTELEVEL */
    int use_regex;        /* BYTELEVEL */
    char repl[5];         /* METASPACE replacement, UTF-8 */
    int repl_len;
    tok_prepend_scheme prepend;  /* METASPACE */
    int split;            /* METASPACE */
    int individual;       /* DIGITS */
} tok_pre;

/* Compiles a pattern with PCRE2_UTF | PCRE2_UCP (JIT when available). */
at_status tok_regex_compile(const char *pattern, size_t len, pcre2_code **out, const char *what);
/* Runs the chain: in -> out (both owned by the caller; out is cleared). */
at_status tok_pretokenize(const tok_pre *chain, size_t n_chain, tok_pieces *in, tok_pieces *out,
                          pcre2_match_data *md);
void tok_pre_free(tok_pre *p);
/* The pre-tokenizer regexes the families use. */
extern const char *const tok_re_gpt2;
extern const char *const tok_re_llama3;
extern const char *const tok_re_qwen2;

/* ---- decoders ----------------------------------------------------------- */
typedef enum {
    TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP,
    TOK_DEC_REPLACE, TOK_DEC_BPE_SUFFIX
} tok_dec_kind;

typedef struct {
    tok_dec_kind kind;
    char *a;            /* REPLACE pattern (literal), METASPACE replacement, BPE suffix */
    size_t alen;
    char *b;            /* REPLACE content */
    size_t blen;
    uint32_t strip_cp;  /* STRIP content */
    int start, stop;    /* STRIP counts */
    tok_prepend_scheme prepend; /* METASPACE */
} tok_dec;

/* Runs the chain over the tokens held in io (replaced by the result).
 * no_strip leaves out the steps that drop a leading space of the first
 * token (used for single pieces and streaming). */
at_status tok_decode_chain(const tok_dec *chain, size_t n_chain, tok_pieces *io, int no_strip);
/* Whether the chain removes a leading space from the first token. */
int tok_decoder_strips_first(const tok_dec *chain, size_t n_chain);
void tok_dec_free(tok_dec *d);

/* ---- added tokens ------------------------------------------------------- */
typedef struct {
    char *content;
    size_t len;
    char *norm;          /* content after the normalizer (normalized tokens) */
    size_t norm_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* One match set: the tokens matched against raw text (normalized == 0) or
 * against normalized text. */
typedef struct {
    int32_t *by_first[256];   /* token indices starting with each byte, longest first */
    int32_t n_first[256];
} tok_matcher;

typedef struct {
    int32_t id;              /* -1: text */
    size_t off, len;         /* into the searched string */
} tok_span;

/* ---- post-processor ---------------------------------------------------- */
typedef struct {
    int32_t *pre, *post;     /* ids before and after the sequence */
    size_t n_pre, n_post;
} tok_post;

/* ---- the tokenizer ------------------------------------------------------ */
struct at_tokenizer {
    tok_bpe model;
    tok_norm *norm;
    size_t n_norm;
    tok_pre *pre;
    size_t n_pre;
    tok_dec *dec;
    size_t n_dec;
    int has_decoder;
    tok_post post;
    tok_added *added;
    size_t n_added;
    int32_t *added_of_id;     /* id -> index into added, or -1 (n_added_of_id ids) */
    int32_t n_added_of_id;
    tok_matcher match_raw;    /* non-normalized added tokens */
    tok_matcher match_norm;   /* normalized added tokens (patterns normalized) */
    int32_t bos_id, eos_id, pad_id, unk_id;
    char pre_name[32];        /* the pre-tokenizer chosen, or "tokenizer.json" */
    int lossless_hint;
};

/* Registers an added token (content copied). Replaces an earlier one with
 * the same id. */
at_status tok_add_token(at_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                        int lstrip, int rstrip, int single_word, int normalized);
/* Builds the matchers from t->added (after the normalizer is known). */
at_status tok_added_finish(at_tokenizer *t);
/* Splits s[0..n) on the tokens of matcher m into spans (appended to *out).
 * skip_special: do not match special tokens. */
at_status tok_added_split(const at_tokenizer *t, const tok_matcher *m, int normalized, const char *s,
                          size_t n, int skip_special, tok_span **out, size_t *nout, size_t *cap);
const tok_added *tok_added_by_id(const at_tokenizer *t, int32_t id);

/* Allocates a tokenizer with empty parts. */
at_status tok_new(at_tokenizer **out);
/* Append one step to t's normalizer, pre-tokenizer or decoder chain; t takes
 * what the step owns. On failure the step is freed. A decoder step sets
 * t->has_decoder. */
at_status tok_push_norm(at_tokenizer *t, tok_norm *n);
at_status tok_push_pre(at_tokenizer *t, tok_pre *p);
at_status tok_push_dec(at_tokenizer *t, tok_dec *d);
/* Appends id to a post-processor list (t->post.pre or t->post.post). */
at_status tok_post_push(int32_t **v, size_t *n, int32_t id);
/* Reads bos/eos/pad/unk and added tokens from tokenizer_config.json and
 * special_tokens_map.json / added_tokens.json in dir (missing files are fine). */
at_status tok_read_config(at_tokenizer *t, const char *dir, int set_template);
/* Common final step of every loader. */
at_status tok_finish(at_tokenizer *t);
/* Installs the pipeline of a named pre-tokenizer family (gpt2, llama3, qwen2,
 * falcon, ...) for byte-level BPE loaded without a tokenizer.json. */
at_status tok_use_family(at_tokenizer *t, const char *name);

at_status tok_load_json_text(const char *text, size_t len, const char *what, at_tokenizer **out);

#endif
