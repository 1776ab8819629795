/* Generation on stories260K (llama2.c's real 260K-parameter model):
 *  - greedy from BOS reproduces the story llama2.c's run printed at -t 0.0,
 *    and sampling at -t 1.0 -p 0.9 -s 133742 the story it printed with that
 *    seed (both recorded in stories260K.md);
 *  - stop strings cut the text where the reference story has them;
 *  - streaming never cuts a UTF-8 character, and equals the tokenizer's
 *    decode; stop strings split across tokens are held back, never shown;
 *  - the scheduler (continuous batching, requests joining and leaving)
 *    gives each sequence the tokens it gets alone; cancel frees a slot;
 *  - the generator's cached prefix gives the same answer as a fresh run;
 *  - a LoRA adapter applied unmerged gives the text of the model with the
 *    adapter merged into its weights (export/merge.h), alone and batched
 *    with sequences of the base model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "export/merge.h"
#include "infer/bundle.h"
#include "infer/generate.h"
#include "infer/scheduler.h"
#include "model/loader.h"
#include "testing.h"

#define BIN "tests/data/models/stories260K.bin"
#define TOKENIZER "tests/data/goldens/tok512.bin"
#define STORY_MD "tests/data/goldens/stories260K.md"

/* The code block after the line `cmd` in stories260K.md. Caller frees. */
static char *md_block(const char *cmd)
{
    char *md = NULL, *out = NULL;
    if (at_read_file(STORY_MD, &md, NULL) != AT_OK) return NULL;
    char *at = strstr(md, cmd);
    if (at) {
        char *start = strchr(at, '\n') + 1, *end = strstr(start, "\n```");
        if (end) out = strndup(start, (size_t)(end - start));
    }
    free(md);
    return out;
}

static at_bundle *load(void)
{
    at_bundle_opts o = {0};
    o.model = BIN;
    o.tokenizer = TOKENIZER;
    o.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    CHECK_OK(at_bundle_load(&o, &b));
    return b;
}

static at_gen_params greedy(const at_bundle *b, int max_new)
{
    at_gen_params p = at_gen_params_default();
    p.max_new_tokens = max_new;
    p.stop_ids = b->stop_ids;
    p.n_stop_ids = b->n_stop_ids;
    return p;
}

static char *run(at_generator *g, const at_bundle *b, const char *prompt, const at_gen_params *p,
                 at_finish_reason *fin, at_gen_stats *stats)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    CHECK_OK(at_bundle_encode_text(b, prompt, &ids, &n));
    if (ids) CHECK_OK(at_generator_run(g, ids, n, p, NULL, NULL, &text, fin, stats));
    free(ids);
    return text;
}

static void test_stories(at_bundle *b)
{
    char *want0 = md_block("./run stories260K/stories260K.bin -z stories260K/tok512.bin -t 0.0\n");
    char *want1 = md_block("./run stories260K/stories260K.bin -z stories260K/tok512.bin -t 1.0 -p 0.9 -s 133742\n");
    CHECK(want0 && want1);
    at_generator *g = NULL;
    CHECK_OK(at_generator_new(b->decoder, b->tokenizer, 512, &g));
    if (!g || !want0 || !want1) goto done;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(at_bundle_encode_text(b, "", &ids, &n));
    CHECK(n == 1 && ids && ids[0] == 1); /* the empty prompt is BOS alone */
    free(ids);

    at_finish_reason fin;
    at_gen_stats st;
    at_gen_params p = greedy(b, 256);
    char *t = run(g, b, "", &p, &fin, &st);
    CHECK_MSG(t && !strcmp(t, want0), "greedy story differs:\n--- got\n%s\n--- want\n%s", t ? t : "", want0);
    CHECK(fin == AT_FINISH_LENGTH && st.new_tokens == 256);
    printf("greedy story: %d tokens, prefill %d tokens %.1f tok/s, decode %.0f tok/s\n", st.new_tokens,
           st.prefilled_tokens, st.prefilled_tokens / fmax(st.prefill_s, 1e-9), (st.new_tokens - 1) / fmax(st.decode_s, 1e-9));
    free(t);

    /* run.c samples up to 256 tokens or until it draws BOS (a stop token here too) */
    p.sampling.temperature = 1.0f;
    p.sampling.top_p = 0.9f;
    p.sampling.seed = 133742;
    t = run(g, b, "", &p, &fin, &st);
    CHECK_MSG(t && !strcmp(t, want1), "sampled story differs:\n--- got\n%s\n--- want\n%s", t ? t : "", want1);
    CHECK_MSG(st.new_tokens <= 256, "%d tokens", st.new_tokens);
    if (t && !strcmp(t, want1)) printf("sampled story (t 1.0, top-p 0.9, seed 133742): identical to llama2.c's\n");
    free(t);

    /* stop strings: the text up to the first occurrence in the reference */
    const char *stops[] = {"zzz", "Lily's mom"};
    p = greedy(b, 256);
    p.stop = stops;
    p.n_stop = 2;
    t = run(g, b, "", &p, &fin, NULL);
    const char *cut = strstr(want0, "Lily's mom");
    CHECK(t && cut && strlen(t) == (size_t)(cut - want0) && !strncmp(t, want0, strlen(t)));
    CHECK(fin == AT_FINISH_STOP);
    free(t);

    /* the cached prefix: a prompt extending the last one gives what a fresh generator gives */
    p = greedy(b, 20);
    char *a1 = run(g, b, "Once upon a time, there was a dog", &p, &fin, &st);
    char *a2 = run(g, b, "Once upon a time, there was a dog named Max", &p, &fin, &st);
    CHECK(st.prefilled_tokens < st.prompt_tokens);
    at_generator *fresh = NULL;
    CHECK_OK(at_generator_new(b->decoder, b->tokenizer, 512, &fresh));
    char *a3 = fresh ? run(fresh, b, "Once upon a time, there was a dog named Max", &p, &fin, &st) : NULL;
    CHECK(a2 && a3 && !strcmp(a2, a3) && st.prefilled_tokens == st.prompt_tokens);
    free(a1);
    free(a2);
    free(a3);
    at_generator_free(fresh);
done:
    at_generator_free(g);
    free(want0);
    free(want1);
}

static int valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return 0;
        i += k;
    }
    return 1;
}

/* Feeds the tokens of `text` through a sequence with one-hot logits
 * (greedy draws exactly them); returns the concatenated pieces. */
static char *force(at_bundle *b, const char *text, const char *stop, at_finish_reason *fin, int *pieces_ok)
{
    int V = b->decoder->cfg.vocab_size;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(at_tokenizer_encode(b->tokenizer, text, strlen(text), 0, &ids, &n));
    at_gen_params p = greedy(b, 0);
    const char *stops[1] = {stop};
    p.stop = stops;
    p.n_stop = stop ? 1 : 0;
    at_gen_seq *g = NULL;
    CHECK_OK(at_gen_seq_new(b->tokenizer, V, &p, &g));
    float *l = calloc((size_t)V, sizeof *l);
    char *out = calloc(1, 1);
    size_t len = 0;
    *pieces_ok = 1;
    *fin = AT_FINISH_NONE;
    if (g && l && out) {
        CHECK_OK(at_gen_seq_start(g, (int32_t[]){1}, 1));
        for (size_t i = 0; i < n && *fin == AT_FINISH_NONE; i++) {
            for (int v = 0; v < V; v++) l[v] = v == ids[i] ? 1.0f : 0.0f;
            int32_t tok;
            CHECK_OK(at_gen_seq_next(g, l, i + 1 < n ? 100 : 0, &tok, fin));
            CHECK(tok == ids[i]);
            const char *t;
            size_t tl;
            at_gen_seq_take_text(g, &t, &tl);
            if (!valid_utf8(t, tl)) *pieces_ok = 0;
            out = realloc(out, len + tl + 1);
            memcpy(out + len, t, tl);
            len += tl;
            out[len] = 0;
        }
    }
    free(l);
    free(ids);
    at_gen_seq_free(g);
    return out;
}

static void test_streaming(at_bundle *b)
{
    const char *text = "Olá, 日本語のテキスト! naïve café — ok 🙂 done";
    int32_t *ids = NULL;
    size_t n = 0;
    char *want = NULL;
    CHECK_OK(at_tokenizer_encode(b->tokenizer, text, strlen(text), 0, &ids, &n));
    CHECK_OK(at_tokenizer_decode(b->tokenizer, ids, n, 1, &want, NULL));
    free(ids);
    at_finish_reason fin;
    int ok;
    char *got = force(b, text, NULL, &fin, &ok);
    CHECK_MSG(got && want && !strcmp(got, want), "streamed '%s' != decoded '%s'", got, want);
    CHECK(ok);
    CHECK(fin == AT_FINISH_LENGTH);
    free(got);
    /* a stop string made of several byte tokens: the text before it, nothing of it */
    got = force(b, text, "日本", &fin, &ok);
    const char *cut = want ? strstr(want, "日本") : NULL;
    CHECK(got && cut && strlen(got) == (size_t)(cut - want) && !strncmp(got, want, strlen(got)));
    CHECK(fin == AT_FINISH_STOP && ok);
    free(got);
    /* a stop string whose beginning shows up but not its end: held back, then released */
    got = force(b, text, "done!", &fin, &ok);
    CHECK(got && want && !strcmp(got, want) && fin == AT_FINISH_LENGTH);
    free(got);
    free(want);

    /* a stop token ends without text; max_new_tokens ends with LENGTH */
    int V = b->decoder->cfg.vocab_size;
    float *l = calloc((size_t)V, sizeof *l);
    at_gen_params p = greedy(b, 3);
    at_gen_seq *g = NULL;
    CHECK_OK(at_gen_seq_new(b->tokenizer, V, &p, &g));
    if (g && l) {
        CHECK_OK(at_gen_seq_start(g, (int32_t[]){1}, 1));
        int32_t tok;
        l[300] = 1;
        CHECK_OK(at_gen_seq_next(g, l, 100, &tok, &fin));
        CHECK(fin == AT_FINISH_NONE);
        l[300] = 0;
        l[2] = 1; /* EOS */
        CHECK_OK(at_gen_seq_next(g, l, 100, &tok, &fin));
        CHECK(fin == AT_FINISH_STOP && at_gen_seq_tokens(g) == 2);
        const char *t;
        size_t tl;
        at_gen_seq_take_text(g, &t, &tl);
        char *piece = NULL;
        CHECK_OK(at_tokenizer_decode(b->tokenizer, (int32_t[]){300}, 1, 1, &piece, NULL));
        CHECK(piece && tl == strlen(piece) && !memcmp(t, piece, tl));
        free(piece);
        CHECK_FAILS(at_gen_seq_next(g, l, 100, &tok, &fin), AT_ERR_INVALID);
        CHECK_OK(at_gen_seq_start(g, (int32_t[]){1}, 1));
        l[2] = 0;
        l[300] = 1;
        for (int i = 0; i < 3; i++) CHECK_OK(at_gen_seq_next(g, l, 100, &tok, &fin));
        CHECK(fin == AT_FINISH_LENGTH && at_gen_seq_tokens(g) == 3);
    }
    at_gen_seq_free(g);
    free(l);
}

typedef struct {
    const char *prompt;
    int max_new;
    at_adapter *adapter;
    char *want;
    char got[4096];
    size_t len;
    at_finish_reason fin;
    int tokens;
} seq_case;

/* Runs cases through a scheduler of B slots, adding case i at step join[i]
 * (or as soon as a slot frees after that); returns the largest number of
 * sequences that produced a token in one step. */
static int run_scheduler(at_bundle *b, int B, seq_case *c, int nc, const int *join)
{
    at_scheduler *s = NULL;
    CHECK_OK(at_scheduler_new(b->decoder, b->tokenizer, B, 256, &s));
    if (!s) return 0;
    int added[16] = {0}, finished = 0, peak = 0;
    for (int step = 0; finished < nc && step < 2000; step++) {
        for (int i = 0; i < nc; i++) {
            if (added[i] || step < join[i] || at_scheduler_in_use(s) == B) continue;
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(at_bundle_encode_text(b, c[i].prompt, &ids, &n));
            at_gen_params p = greedy(b, c[i].max_new);
            p.adapter = c[i].adapter;
            int slot;
            CHECK_OK(at_scheduler_add(s, ids, n, &p, &c[i], &slot));
            free(ids);
            added[i] = 1;
        }
        const at_sched_event *ev;
        int ne, produced = 0;
        CHECK_OK(at_scheduler_step(s, &ev, &ne));
        for (int e = 0; e < ne; e++) {
            seq_case *sc = ev[e].user;
            produced += ev[e].token >= 0;
            if (sc->len + ev[e].len < sizeof sc->got) {
                memcpy(sc->got + sc->len, ev[e].text, ev[e].len);
                sc->len += ev[e].len;
            }
            if (ev[e].finish != AT_FINISH_NONE) {
                sc->fin = ev[e].finish;
                sc->tokens = ev[e].completion_tokens;
                finished++;
            }
        }
        if (produced > peak) peak = produced;
    }
    CHECK(finished == nc);
    at_scheduler_free(s);
    return peak;
}

static void references(at_bundle *b, seq_case *c, int nc)
{
    at_generator *g = NULL;
    CHECK_OK(at_generator_new(b->decoder, b->tokenizer, 256, &g));
    for (int i = 0; g && i < nc; i++) {
        at_gen_params p = greedy(b, c[i].max_new);
        p.adapter = c[i].adapter;
        at_finish_reason fin;
        c[i].want = run(g, b, c[i].prompt, &p, &fin, NULL);
        memset(c[i].got, 0, sizeof c[i].got);
        c[i].len = 0;
        c[i].fin = AT_FINISH_NONE;
    }
    at_generator_free(g);
}

static void test_scheduler(at_bundle *b)
{
    static seq_case c[5];
    const char *prompts[5] = {"Once upon a time", "", "The cat sat", "Tom and Sue went to the park. They", "Lily"};
    const int max_new[5] = {40, 60, 25, 50, 10};
    for (int i = 0; i < 5; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].prompt = prompts[i];
        c[i].max_new = max_new[i];
    }
    references(b, c, 5);
    int join[5] = {0, 0, 3, 4, 9};
    int peak = run_scheduler(b, 3, c, 5, join);
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(c[i].want && !strcmp(c[i].got, c[i].want), "sequence %d: batched '%s' != alone '%s'", i, c[i].got,
                  c[i].want ? c[i].want : "");
        CHECK(c[i].fin == AT_FINISH_LENGTH || c[i].fin == AT_FINISH_STOP);
        free(c[i].want);
    }
    CHECK(peak == 3);
    printf("scheduler: 5 sequences through 3 slots, joining at steps 0/0/3/4/9: same text as alone\n");

    /* 64 slots: prompts go in pieces of 32 tokens per step; a 100-token prompt takes 4 */
    static seq_case lc[2];
    memset(lc, 0, sizeof lc);
    lc[0].prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One "
                   "day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom said, "
                   "\"Lily, let's go to the park.\" Lily was sad";
    lc[0].max_new = 20;
    lc[1].prompt = "The cat";
    lc[1].max_new = 30;
    references(b, lc, 2);
    int join2[2] = {0, 1};
    run_scheduler(b, 64, lc, 2, join2);
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(lc[i].want && !strcmp(lc[i].got, lc[i].want), "chunked prefill %d: '%s' != '%s'", i, lc[i].got,
                  lc[i].want ? lc[i].want : "");
        free(lc[i].want);
    }

    /* cancel: the slot is free after the next step */
    at_scheduler *s = NULL;
    CHECK_OK(at_scheduler_new(b->decoder, b->tokenizer, 1, 64, &s));
    if (!s) return;
    at_gen_params p = greedy(b, 50);
    int slot, other;
    CHECK_OK(at_scheduler_add(s, (int32_t[]){1}, 1, &p, NULL, &slot));
    CHECK_FAILS(at_scheduler_add(s, (int32_t[]){1}, 1, &p, NULL, &other), AT_ERR_INVALID); /* full */
    const at_sched_event *ev;
    int ne;
    CHECK_OK(at_scheduler_step(s, &ev, &ne));
    CHECK(ne == 1 && ev[0].finish == AT_FINISH_NONE);
    at_scheduler_cancel(s, slot);
    CHECK_OK(at_scheduler_step(s, &ev, &ne));
    CHECK_MSG(ne == 1 && ev[0].finish == AT_FINISH_CANCELLED && at_scheduler_in_use(s) == 0, "ne %d finish %d in use %d",
              ne, ne ? (int)ev[0].finish : -1, at_scheduler_in_use(s));
    CHECK_OK(at_scheduler_add(s, (int32_t[]){1}, 1, &p, NULL, &slot));
    /* prompts that do not fit, ids outside the vocabulary */
    int32_t big[64];
    for (int i = 0; i < 64; i++) big[i] = 1;
    at_scheduler_cancel(s, slot);
    CHECK_OK(at_scheduler_step(s, &ev, &ne));
    CHECK_FAILS(at_scheduler_add(s, big, 64, &p, NULL, &other), AT_ERR_INVALID);
    CHECK_FAILS(at_scheduler_add(s, (int32_t[]){512}, 1, &p, NULL, &other), AT_ERR_INVALID);
    at_scheduler_free(s);
}

/* Fills every B of the adapter with uniform values in ±amp (fresh adapters start at zero). */
static void randomize_b(at_adapter *a, float amp, unsigned seed)
{
    for (int l = 0; l < a->n_layers; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *pr = at_adapter_pair(a, l, (at_module)m);
            if (!pr->B) continue;
            float *d = at_tensor_data(pr->B);
            for (int64_t i = 0; i < at_tensor_numel(pr->B); i++) {
                seed = seed * 1664525u + 1013904223u;
                d[i] = amp * ((float)(seed >> 8) / 8388608.0f - 1.0f);
            }
        }
}

static void test_adapters(at_bundle *b)
{
    at_adapter *ad = NULL;
    CHECK_OK(at_adapter_new(&b->decoder->cfg, b->decoder->be, 4, 8.0, 0.0, 0, (1u << AT_MOD_COUNT) - 1, 5, &ad));
    if (!ad) return;
    randomize_b(ad, 0.3f, 11);
    /* the reference: the same model with the adapter merged into its weights */
    at_decoder *merged = NULL;
    at_load_options lo = at_load_options_default();
    CHECK_OK(at_decoder_load(BIN, &lo, &merged));
    if (merged) CHECK_OK(at_merge_lora(merged->w, ad));
    at_bundle mb = *b;
    mb.decoder = merged;
    const char *prompts[3] = {"Once upon a time", "", "The dog"};
    static seq_case c[6];
    memset(c, 0, sizeof c);
    at_generator *g = NULL, *gm = NULL;
    CHECK_OK(at_generator_new(b->decoder, b->tokenizer, 256, &g));
    if (merged) CHECK_OK(at_generator_new(merged, b->tokenizer, 256, &gm));
    int differ = 0;
    for (int i = 0; g && gm && i < 3; i++) {
        at_gen_params p = greedy(b, 40);
        at_finish_reason fin;
        char *base = run(g, b, prompts[i], &p, &fin, NULL);
        char *want = run(gm, &mb, prompts[i], &p, &fin, NULL);
        p.adapter = ad;
        char *got = run(g, b, prompts[i], &p, &fin, NULL);
        CHECK_MSG(got && want && !strcmp(got, want), "prompt %d: unmerged '%s' != merged '%s'", i, got, want);
        differ += base && got && strcmp(base, got) != 0;
        free(base);
        free(want);
        free(got);
    }
    CHECK(differ >= 2); /* the adapter changes the answers */
    /* batched: adapter and base sequences side by side */
    for (int i = 0; i < 6; i++) {
        c[i].prompt = prompts[i % 3];
        c[i].max_new = 30 + 5 * i;
        c[i].adapter = i % 2 ? ad : NULL;
    }
    references(b, c, 6);
    int join[6] = {0, 0, 0, 2, 2, 5};
    run_scheduler(b, 4, c, 6, join);
    for (int i = 0; i < 6; i++) {
        CHECK_MSG(c[i].want && !strcmp(c[i].got, c[i].want), "adapter batch %d: '%s' != '%s'", i, c[i].got,
                  c[i].want ? c[i].want : "");
        free(c[i].want);
    }
    printf("adapters: unmerged LoRA = merged weights (3 prompts); mixed base/adapter batch = alone\n");
    at_generator_free(g);
    at_generator_free(gm);
    at_decoder_free(merged);
    at_adapter_free(ad);
}

int main(void)
{
    at_bundle *b = load();
    if (!b) return at_test_result("test_generate");
    test_stories(b);
    test_streaming(b);
    test_scheduler(b);
    test_adapters(b);
    at_bundle_free(b);
    return at_test_result("test_generate");
}
