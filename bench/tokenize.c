/* Tokenizer encode speed on real text, one thread.
 *
 *   bench_tokenize [TOKENIZER_PATH [DATA_DIR]]
 *
 * With no TOKENIZER_PATH, each of the full tokenizers under
 * ../shared/data/tokenizers that exists is measured (Qwen2, Llama 3, GPT-2,
 * Mistral); the text is alpaca_en_demo.json, alpaca_zh_demo.json,
 * c4_demo.jsonl and wiki_demo.txt from DATA_DIR (default
 * ../shared/data/datasets/llama-factory), about 3.3 MB, encoded a chunk of
 * 4 KiB at a time (as a data loader feeds records), and also whole. Prints
 * MB/s of input text and tokens/s, timed in this thread's CPU time. Run from
 * the repo root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/file.h"
#include "base/log.h"
#include "text/tokenizer.h"

/* CPU time of this thread: the figure does not depend on what else the
 * (shared) machine is running. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Cuts at a UTF-8 character boundary at or before want. */
static size_t cut(const char *s, size_t n, size_t want)
{
    if (want >= n) return n;
    while (want > 0 && ((unsigned char)s[want] & 0xC0) == 0x80) want--;
    return want;
}

static int bench_one(const char *path, const char *text, size_t len)
{
    double t0 = now();
    at_tokenizer *t = NULL;
    if (at_tokenizer_load(path, NULL, &t) != AT_OK) {
        fprintf(stderr, "%s: %s\n", path, at_last_error());
        return 1;
    }
    double t_load = now() - t0;
    /* Chunked: records of ~4 KiB. Run twice, report the second (warm cache,
     * as in a training run that encodes many records). */
    size_t ntok = 0;
    double best = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        double a = now();
        ntok = 0;
        for (size_t off = 0; off < len;) {
            size_t k = cut(text + off, len - off, 4096);
            if (k == 0) k = len - off;
            int32_t *ids = NULL;
            size_t n = 0;
            if (at_tokenizer_encode(t, text + off, k, 0, &ids, &n) != AT_OK) {
                fprintf(stderr, "%s: encode: %s\n", path, at_last_error());
                at_tokenizer_free(t);
                return 1;
            }
            ntok += n;
            free(ids);
            off += k;
        }
        double dt = now() - a;
        if (dt < best) best = dt;
    }
    /* Whole text at once. */
    double a = now();
    int32_t *ids = NULL;
    size_t n = 0;
    at_status st = at_tokenizer_encode(t, text, len, 0, &ids, &n);
    double whole = now() - a;
    free(ids);
    printf("%-60s load %6.2f s | 4 KiB records: %6.2f MB/s, %5.2f M tokens/s (%zu tokens) | whole: %6.2f MB/s%s\n",
           path, t_load, (double)len / best / 1e6, (double)ntok / best / 1e6, ntok, (double)len / whole / 1e6,
           st == AT_OK ? "" : " (failed)");
    at_tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    at_log_set_level(AT_LOG_WARN);
    const char *data = argc > 2 ? argv[2] : "../shared/data/datasets/llama-factory";
    static const char *const files[] = {"alpaca_en_demo.json", "alpaca_zh_demo.json", "c4_demo.jsonl", "wiki_demo.txt"};
    char *text = NULL;
    size_t len = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = at_path_join(data, files[i]);
        char *buf = NULL;
        size_t n = 0;
        if (!p || at_read_file(p, &buf, &n) != AT_OK) {
            fprintf(stderr, "%s: %s (give the data folder as the second argument)\n", p ? p : files[i], at_last_error());
            free(p);
            free(text);
            return 1;
        }
        char *t2 = realloc(text, len + n + 1);
        if (!t2) return 1;
        text = t2;
        memcpy(text + len, buf, n);
        len += n;
        text[len] = '\0';
        free(buf);
        free(p);
    }
    printf("text: %.2f MB from %s\n", (double)len / 1e6, data);
    int rc = 0;
    if (argc > 1) {
        rc = bench_one(argv[1], text, len);
    } else {
        static const char *const toks[] = {
            "../shared/data/tokenizers/qwen3-full/tokenizer.json", "../shared/data/tokenizers/llama3-full/tokenizer.json",
            "../shared/data/tokenizers/gpt2", "../shared/data/tokenizers/qwen2",
            "../shared/data/tokenizers/mistral-7b-instruct-v0.3/tokenizer.json",
            "../shared/data/tokenizers/phi-3-mini/tokenizer.json"};
        for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++)
            if (at_file_exists(toks[i])) rc |= bench_one(toks[i], text, len);
    }
    free(text);
    return rc;
}
