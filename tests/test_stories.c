/* stories260K (Karpathy's 260K-parameter TinyStories Llama), a real
 * pretrained model, through the decoder:
 *  - logits on a few prompts equal those of a PyTorch llama2.c-style model
 *    loading the same checkpoint (tools/make_goldens.py), from the llama2.c
 *    .bin and from the GGUF;
 *  - greedy decoding from BOS with the KV cache reproduces, byte for byte,
 *    the 256-token story llama2.c's run.c printed (recorded in
 *    stories260K.md), from the .bin with tok512.bin and from the .gguf. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "decoder_goldens.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "text/tokenizer.h"
#include "testing.h"

#define BIN "tests/data/models/stories260K.bin"
#define GGUF "tests/data/models/stories260K.gguf"
#define TOKENIZER GOLDEN_DIR "/tok512.bin"
#define STORY_MD GOLDEN_DIR "/stories260K.md"
#define STEPS 256

/* The text of the code block that follows the `./run ... -t 0.0` command in
 * stories260K.md (lines joined with '\n'). Caller frees. */
static char *expected_story(void)
{
    char *md = NULL;
    if (at_read_file(STORY_MD, &md, NULL) != AT_OK) return NULL;
    char *out = NULL;
    char *cmd = strstr(md, "./run stories260K/stories260K.bin -z stories260K/tok512.bin -t 0.0\n");
    if (cmd) {
        char *start = strchr(cmd, '\n') + 1;
        char *end = strstr(start, "\n```");
        if (end) {
            out = malloc((size_t)(end - start) + 1);
            if (out) {
                memcpy(out, start, (size_t)(end - start));
                out[end - start] = 0;
            }
        }
    }
    free(md);
    return out;
}

/* Logits of the golden prompts through the training forward. */
static void test_logits(const char *path)
{
    golden g;
    CHECK_OK(golden_load("stories260K", &g));
    at_decoder *d = NULL;
    CHECK_OK(at_decoder_load(path, NULL, &d));
    if (!d || !g.logits) {
        at_decoder_free(d);
        golden_free(&g);
        return;
    }
    at_tensor *ids = NULL, *logits = NULL;
    at_decoder_acts *acts = NULL;
    int64_t sh[2] = {g.B, g.T}, shl[2] = {(int64_t)g.B * g.T, g.V};
    CHECK_OK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &ids));
    CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shl, "logits", &logits));
    CHECK_OK(at_decoder_acts_new(d, g.B, g.T, &acts));
    if (ids && logits && acts) {
        CHECK_OK(at_tensor_upload(ids, g.ids, (size_t)g.B * g.T * sizeof(int32_t)));
        CHECK_OK(at_decoder_forward(d, acts, ids, NULL, NULL));
        CHECK_OK(at_decoder_logits(d, logits, &acts->final_norm));
        const float *got = at_tensor_data(logits);
        double err = 0;
        for (int b = 0; b < g.B; b++) {
            double e = golden_rel_err_seq(&g, b, got, g.T, 0, g.len[b]);
            if (!(e <= err)) err = e;
        }
        printf("stories260K %-40s logits max rel err %.2e\n", path, err);
        CHECK_MSG(err < 1e-4, "%s: logits max rel err %g", path, err);
    }
    at_tensor_free(ids);
    at_tensor_free(logits);
    at_decoder_acts_free(acts);
    at_decoder_free(d);
    golden_free(&g);
}

/* Greedy decoding from BOS with the KV cache, as run.c -t 0: up to STEPS
 * tokens, stopping at BOS (id 1). Returns the ids generated (without the
 * leading BOS) in a new array and their number in *n. */
static int32_t *greedy(at_decoder *d, int *n)
{
    *n = 0;
    at_kv_cache *c = NULL;
    at_tensor *logits = NULL;
    int64_t sh[2] = {1, d->cfg.vocab_size};
    int32_t *out = malloc(STEPS * sizeof *out);
    at_status st = at_kv_cache_new(&d->cfg, d->be, AT_F32, 1, STEPS + 1, &c);
    if (st == AT_OK) st = at_tensor_new(d->be, AT_F32, 2, sh, "logits", &logits);
    int32_t tok = 1; /* BOS */
    for (int step = 0; st == AT_OK && step < STEPS; step++) {
        st = at_decoder_decode_step(d, c, &tok, NULL, logits);
        if (st != AT_OK) break;
        const float *l = at_tensor_data(logits);
        int best = 0;
        for (int v = 1; v < d->cfg.vocab_size; v++)
            if (l[v] > l[best]) best = v;
        if (best == 1) break;
        out[(*n)++] = best;
        tok = best;
    }
    if (st != AT_OK) fprintf(stderr, "greedy: %s\n", at_last_error());
    at_tensor_free(logits);
    at_kv_cache_free(c);
    return out;
}

static void test_story(const char *path, const at_tokenizer *tok, const char *want)
{
    at_decoder *d = NULL;
    CHECK_OK(at_decoder_load(path, NULL, &d));
    if (!d) return;
    int n = 0;
    int32_t *ids = greedy(d, &n);
    CHECK_MSG(n == STEPS, "%s: %d tokens generated", path, n);
    char *text = NULL;
    size_t len = 0;
    if (tok) CHECK_OK(at_tokenizer_decode(tok, ids, (size_t)n, 1, &text, &len));
    if (text && want) {
        int same = strcmp(text, want) == 0;
        CHECK_MSG(same, "%s: the story differs from llama2.c's:\n--- got\n%s\n--- want\n%s", path, text, want);
        if (same) printf("stories260K %-40s greedy story: %d tokens, %zu bytes, identical\n", path, n, len);
    }
    free(text);
    free(ids);
    at_decoder_free(d);
}

int main(void)
{
    test_logits(BIN);
    test_logits(GGUF);
    char *want = expected_story();
    CHECK_MSG(want != NULL, "could not read the story from %s", STORY_MD);
    at_tokenizer *tok = NULL;
    CHECK_OK(at_tokenizer_load(TOKENIZER, NULL, &tok));
    test_story(BIN, tok, want);
    test_story(GGUF, tok, want);
    at_tokenizer_free(tok);
    free(want);
    return at_test_result("test_stories");
}
