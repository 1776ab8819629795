/* Fuzz target for the Hugging Face tokenizer writer (text/tokenizer_hf_export.h).
 * The first byte picks how the rest becomes a tokenizer:
 *   even: a tokenizer.json (at_tokenizer_from_json; one that is not valid
 *         UTF-8 is refused by the loader);
 *   odd:  a llama2.c tokenizer.bin (any token bytes: invalid UTF-8, control
 *         characters, NUL, duplicates), loaded from a temporary file.
 * A tokenizer that loads is written with at_tokenizer_hf_write to a
 * temporary folder; either the writer refuses it with an error message, or
 * the folder must load back and encode a fixed
 * text without error. Anything else traps. Seeds: tests/fuzz/tokenizer_hf/. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "text/tokenizer.h"
#include "text/tokenizer_hf_export.h"

static char g_dir[64];
static char *g_bin;

static void cleanup(void)
{
    if (g_dir[0]) rmdir(g_dir); /* emptied after each input */
    free(g_bin);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        at_log_set_level(AT_LOG_ERROR);
        snprintf(g_dir, sizeof g_dir, "/tmp/anytune_fuzz_hf_XXXXXX");
        if (!mkdtemp(g_dir)) {
            g_dir[0] = 0;
            return 0;
        }
        g_bin = at_path_join(g_dir, "tokenizer.bin");
        atexit(cleanup);
    }
    if (size < 1 || !g_bin) return 0;
    at_tokenizer *t = NULL, *back = NULL;
    if (data[0] & 1) {
        if (at_write_file_atomic(g_bin, data + 1, size - 1) != AT_OK) return 0;
        if (at_tokenizer_load(g_bin, NULL, &t) != AT_OK) t = NULL;
        unlink(g_bin);
    } else if (at_tokenizer_from_json((const char *)data + 1, size - 1, "fuzz", &t) != AT_OK) {
        t = NULL;
    }
    at_clear_error();
    if (!t) return 0;
    at_status st = at_tokenizer_hf_write(t, NULL, g_dir);
    if (getenv("ANYTUNE_FUZZ_VERBOSE")) /* to see what a seed reaches */
        fprintf(stderr, "fuzz_tokenizer_hf: %s\n", st == AT_OK ? "written" : at_last_error());
    if (st != AT_OK) {
        /* a refusal must say why */
        if (!at_last_error()[0]) __builtin_trap();
    } else {
        if (at_tokenizer_load(g_dir, NULL, &back) != AT_OK) {
            fprintf(stderr, "fuzz_tokenizer_hf: written folder does not load back: %s\n", at_last_error());
            __builtin_trap();
        }
        static const char text[] = "Hello world! 123 \xE4\xBD\xA0\xE5\xA5\xBD\n";
        int32_t *ids = NULL;
        size_t n = 0;
        if (at_tokenizer_encode(back, text, sizeof text - 1, AT_TOK_ADD_SPECIAL, &ids, &n) != AT_OK) {
            fprintf(stderr, "fuzz_tokenizer_hf: reloaded tokenizer cannot encode: %s\n", at_last_error());
            __builtin_trap();
        }
        free(ids);
        at_tokenizer_free(back);
    }
    at_clear_error();
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    for (size_t i = 0; i < 3; i++) {
        char *p = at_path_join(g_dir, files[i]);
        if (p) unlink(p);
        free(p);
    }
    at_tokenizer_free(t);
    return 0;
}
