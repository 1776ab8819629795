/* Fuzz target for the tokenizer. The first byte picks the mode:
 *   0: the rest is a tokenizer.json; load it and, when it loads, encode and
 *      decode a fixed text with it;
 *   1: encode the rest (any bytes, invalid UTF-8 included) with a small
 *      committed byte-level tokenizer (tests/data/tokenizers/qwen3), with
 *      special tokens parsed when the second byte is odd; decode, stream
 *      decode;
 *   2: the same with a SentencePiece-style one (tests/data/tokenizers/phi-3);
 *   3: the same with the llama2.c tokenizer.bin (score merges).
 * Seeds: tests/fuzz/tokenizer/. Inputs are bounded by the fuzzer's max_len,
 * and encoding is O(n log n), so each input takes little time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "text/tokenizer.h"

static at_tokenizer *g_tok[3];
static int g_init;

static void exercise(const at_tokenizer *t, const char *text, size_t len, unsigned flags)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (at_tokenizer_encode(t, text, len, flags, &ids, &n) != AT_OK) return;
    char *d = NULL;
    size_t dl = 0;
    if (at_tokenizer_decode(t, ids, n, flags & 1, &d, &dl) == AT_OK) free(d);
    at_tok_stream *s = NULL;
    if (at_tok_stream_new(t, 0, &s) == AT_OK) {
        const char *p;
        size_t pl;
        for (size_t i = 0; i < n; i++) (void)at_tok_stream_push(s, ids[i], &p, &pl);
        (void)at_tok_stream_flush(s, &p, &pl);
        at_tok_stream_free(s);
    }
    for (size_t i = 0; i < n && i < 8; i++) {
        char *pc = NULL;
        if (at_tokenizer_token_to_piece(t, ids[i], &pc, NULL) == AT_OK) free(pc);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_init) {
        g_init = 1;
        at_log_set_level(AT_LOG_ERROR);
        (void)at_tokenizer_load("tests/data/tokenizers/qwen3/tokenizer.json", NULL, &g_tok[0]);
        (void)at_tokenizer_load("tests/data/tokenizers/phi-3/tokenizer.json", NULL, &g_tok[1]);
        (void)at_tokenizer_load("tests/data/tokenizers/llama2c/tok512.bin", NULL, &g_tok[2]);
    }
    if (size < 1) return 0;
    uint8_t mode = data[0] % 4;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (mode == 0) {
        at_tokenizer *t = NULL;
        if (at_tokenizer_from_json(rest, n, "fuzz", &t) == AT_OK) {
            static const char text[] = "Hello world! 123 \xE4\xBD\xA0\xE5\xA5\xBD <s> \xF0\x9F\x98\x80\n";
            exercise(t, text, sizeof text - 1, AT_TOK_PARSE_SPECIAL | AT_TOK_ADD_SPECIAL);
            at_tokenizer_free(t);
        }
        return 0;
    }
    const at_tokenizer *t = g_tok[mode - 1];
    if (!t || n < 1) return 0;
    unsigned flags = (rest[0] & 1 ? AT_TOK_PARSE_SPECIAL : 0) | (rest[0] & 2 ? AT_TOK_ADD_SPECIAL : 0);
    exercise(t, rest + 1, n - 1, flags);
    return 0;
}
