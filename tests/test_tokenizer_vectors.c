/* Tokenizers against ids Hugging Face produced: llama.cpp's tokenizer test
 * vectors (tests/data/tokenizers/ggml-vocab-*.gguf.inp/.out, made with HF
 * transformers, add_special_tokens=False) for GPT-2, Qwen2, Llama 3
 * (llama-bpe), Llama 2 (llama-spm), Phi-3, Falcon and TinyLlama (special
 * tokens), and Mistral v0.3 ids made by @lenml/tokenizers
 * (tools/make_mistral_vectors.mjs). Each family is loaded the ways the
 * project supports (tokenizer.json, vocab.json + merges.txt, GGUF arrays)
 * and decode(encode(x)) == x is checked where the tokenizer is lossless.
 * When ../shared/data is present the full (untrimmed) files are run too. */
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "testing.h"
#include "text/tokenizer.h"

#define DATA "tests/data/tokenizers/"
#define SEP "\n__ggml_vocab_test__\n"

typedef struct {
    char **text;
    size_t *len;
    int32_t **ids;
    size_t *nids;
    size_t n;
} vectors;

static void vectors_free(vectors *v)
{
    for (size_t i = 0; i < v->n; i++) {
        free(v->text[i]);
        free(v->ids[i]);
    }
    free(v->text);
    free(v->len);
    free(v->ids);
    free(v->nids);
    memset(v, 0, sizeof *v);
}

static int vectors_push(vectors *v, const char *s, size_t len)
{
    v->text = realloc(v->text, (v->n + 1) * sizeof *v->text);
    v->len = realloc(v->len, (v->n + 1) * sizeof *v->len);
    v->ids = realloc(v->ids, (v->n + 1) * sizeof *v->ids);
    v->nids = realloc(v->nids, (v->n + 1) * sizeof *v->nids);
    if (!v->text || !v->len || !v->ids || !v->nids) return 0;
    v->text[v->n] = malloc(len + 1);
    memcpy(v->text[v->n], s, len);
    v->text[v->n][len] = '\0';
    v->len[v->n] = len;
    v->ids[v->n] = NULL;
    v->nids[v->n] = 0;
    v->n++;
    return 1;
}

/* llama.cpp's format: each string followed by SEP; line i of .out holds
 * the ids of string i, space-separated. */
static int read_ggml_vectors(const char *name, vectors *v)
{
    char path[256];
    char *inp = NULL, *outp = NULL;
    size_t ilen = 0, olen = 0;
    memset(v, 0, sizeof *v);
    snprintf(path, sizeof path, DATA "ggml-vocab-%s.gguf.inp", name);
    if (at_read_file(path, &inp, &ilen) != AT_OK) return 0;
    snprintf(path, sizeof path, DATA "ggml-vocab-%s.gguf.out", name);
    if (at_read_file(path, &outp, &olen) != AT_OK) {
        free(inp);
        return 0;
    }
    size_t sl = strlen(SEP);
    for (char *p = inp; p < inp + ilen;) {
        char *q = strstr(p, SEP);
        if (!q) break;
        vectors_push(v, p, (size_t)(q - p));
        p = q + sl;
    }
    char *line = outp;
    for (size_t i = 0; i < v->n && line && *line; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t cap = 16;
        v->ids[i] = malloc(cap * sizeof(int32_t));
        for (char *t = strtok(line, " "); t; t = strtok(NULL, " ")) {
            if (v->nids[i] == cap) v->ids[i] = realloc(v->ids[i], (cap *= 2) * sizeof(int32_t));
            v->ids[i][v->nids[i]++] = (int32_t)atoi(t);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(inp);
    free(outp);
    return v->n > 0;
}

static int read_json_cases(const cJSON *list, vectors *v)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, list)
    {
        const cJSON *text = cJSON_GetObjectItem(c, "text"), *ids = cJSON_GetObjectItem(c, "ids");
        if (!cJSON_IsString(text) || !cJSON_IsArray(ids)) return 0;
        vectors_push(v, text->valuestring, strlen(text->valuestring));
        size_t k = v->n - 1, n = (size_t)cJSON_GetArraySize(ids);
        v->ids[k] = malloc((n ? n : 1) * sizeof(int32_t));
        const cJSON *x;
        cJSON_ArrayForEach(x, ids) v->ids[k][v->nids[k]++] = x->valueint;
    }
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Encodes every case; returns how many matched. Checks the round trip when
 * lossless. */
static size_t run_vectors(const char *label, const at_tokenizer *t, const vectors *v, unsigned flags, int lossless)
{
    size_t ok = 0, rt_ok = 0;
    for (size_t i = 0; i < v->n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(at_tokenizer_encode(t, v->text[i], v->len[i], flags, &ids, &n));
        int same = n == v->nids[i] && (n == 0 || memcmp(ids, v->ids[i], n * sizeof(int32_t)) == 0);
        CHECK_MSG(same, "%s: case %zu \"%.60s\" differs", label, i, v->text[i]);
        if (!same) {
            print_ids("want", v->ids[i], v->nids[i]);
            print_ids("got ", ids, n);
        }
        ok += (size_t)same;
        if (lossless) {
            char *back = NULL;
            size_t blen = 0;
            CHECK_OK(at_tokenizer_decode(t, ids, n, 0, &back, &blen));
            int rt = back && blen == v->len[i] && memcmp(back, v->text[i], blen) == 0;
            CHECK_MSG(rt, "%s: case %zu: decode(encode(x)) = \"%.60s\" != \"%.60s\"", label, i, back ? back : "",
                      v->text[i]);
            rt_ok += (size_t)rt;
            free(back);
        }
        free(ids);
    }
    if (lossless)
        printf("%-34s %zu/%zu encode, %zu/%zu round trip\n", label, ok, v->n, rt_ok, v->n);
    else
        printf("%-34s %zu/%zu encode\n", label, ok, v->n);
    return ok;
}

static void family(const char *label, const char *path, const char *pre, const char *vec, unsigned flags, int lossless,
                   const char *want_pre)
{
    vectors v;
    CHECK_MSG(read_ggml_vectors(vec, &v), "%s: cannot read vectors %s", label, vec);
    at_tokenizer_opts o = {pre};
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(path, pre ? &o : NULL, &t));
    if (t) {
        if (want_pre)
            CHECK_MSG(strcmp(at_tokenizer_pre_name(t), want_pre) == 0, "%s: pre-tokenizer %s, want %s", label,
                      at_tokenizer_pre_name(t), want_pre);
        run_vectors(label, t, &v, flags, lossless);
    }
    at_tokenizer_free(t);
    vectors_free(&v);
}

static void mistral(const char *label, const char *path)
{
    cJSON *j = NULL;
    at_tokenizer *t = NULL;
    CHECK_OK(at_json_parse_file(DATA "mistral-v0.3/vectors.json", &j));
    CHECK_OK(at_tokenizer_load(path, NULL, &t));
    if (j && t) {
        vectors plain = {0}, special = {0};
        CHECK(read_json_cases(cJSON_GetObjectItem(j, "cases"), &plain));
        CHECK(read_json_cases(cJSON_GetObjectItem(j, "special_cases"), &special));
        CHECK(plain.n >= 30 && special.n >= 4);
        char l2[128];
        run_vectors(label, t, &plain, 0, 1);
        snprintf(l2, sizeof l2, "%s +parse_special", label);
        run_vectors(l2, t, &special, AT_TOK_PARSE_SPECIAL, 0);
        /* With add_special the template puts BOS first. */
        cJSON *wb = cJSON_CreateArray();
        cJSON_AddItemToArray(wb, cJSON_Duplicate(cJSON_GetObjectItem(j, "with_bos"), 1));
        vectors bos = {0};
        CHECK(read_json_cases(wb, &bos));
        snprintf(l2, sizeof l2, "%s +add_special", label);
        run_vectors(l2, t, &bos, AT_TOK_ADD_SPECIAL, 0);
        CHECK(at_tokenizer_bos(t) == 1 && at_tokenizer_eos(t) == 2);
        cJSON_Delete(wb);
        vectors_free(&bos);
        vectors_free(&plain);
        vectors_free(&special);
    }
    at_tokenizer_free(t);
    cJSON_Delete(j);
}

/* ---- a minimal GGUF metadata reader (tests only) ------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n, off;
    int bad;
} rd;

static uint64_t rd_u(rd *r, size_t k)
{
    uint64_t v = 0;
    if (r->off + k > r->n) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p + r->off, k);
    r->off += k;
    return v;
}

static size_t type_size(uint32_t ty)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return ty < 13 ? sz[ty] : 0;
}

typedef struct {
    const char *model, *pre;
    size_t model_len, pre_len;
    size_t n_tokens, n_merges;
    const char **tokens;
    size_t *token_lens;
    const char **merges;
    size_t *merge_lens;
    float *scores;
    int32_t *types;
    int64_t bos, eos, unk, pad;
    int add_bos, add_space_prefix;
} gguf_tok;

static int key_is(const char *k, size_t kl, const char *want)
{
    return kl == strlen(want) && memcmp(k, want, kl) == 0;
}

static int gguf_read(const uint8_t *p, size_t n, gguf_tok *g)
{
    rd r = {p, n, 0, 0};
    memset(g, 0, sizeof *g);
    g->bos = g->eos = g->unk = g->pad = -1;
    g->add_space_prefix = 1;
    if (n < 24 || memcmp(p, "GGUF", 4) != 0) return 0;
    r.off = 4;
    rd_u(&r, 4);
    rd_u(&r, 8);
    uint64_t nkv = rd_u(&r, 8);
    for (uint64_t i = 0; i < nkv && !r.bad; i++) {
        uint64_t kl = rd_u(&r, 8);
        if (r.off + kl > n) return 0;
        const char *k = (const char *)p + r.off;
        r.off += kl;
        uint32_t ty = (uint32_t)rd_u(&r, 4);
        if (ty == 8) {
            uint64_t sl = rd_u(&r, 8);
            if (r.off + sl > n) return 0;
            const char *s = (const char *)p + r.off;
            if (key_is(k, kl, "tokenizer.ggml.model")) { g->model = s; g->model_len = sl; }
            if (key_is(k, kl, "tokenizer.ggml.pre")) { g->pre = s; g->pre_len = sl; }
            r.off += sl;
        } else if (ty == 9) {
            uint32_t et = (uint32_t)rd_u(&r, 4);
            uint64_t cnt = rd_u(&r, 8);
            if (cnt > n) return 0;
            int is_tok = key_is(k, kl, "tokenizer.ggml.tokens"), is_mer = key_is(k, kl, "tokenizer.ggml.merges");
            if (is_tok) {
                g->n_tokens = cnt;
                g->tokens = calloc(cnt, sizeof *g->tokens);
                g->token_lens = calloc(cnt, sizeof *g->token_lens);
            }
            if (is_mer) {
                g->n_merges = cnt;
                g->merges = calloc(cnt, sizeof *g->merges);
                g->merge_lens = calloc(cnt, sizeof *g->merge_lens);
            }
            for (uint64_t j = 0; j < cnt && !r.bad; j++) {
                if (et == 8) {
                    uint64_t sl = rd_u(&r, 8);
                    if (r.off + sl > n) return 0;
                    if (is_tok) { g->tokens[j] = (const char *)p + r.off; g->token_lens[j] = sl; }
                    if (is_mer) { g->merges[j] = (const char *)p + r.off; g->merge_lens[j] = sl; }
                    r.off += sl;
                } else {
                    size_t es = type_size(et);
                    if (!es) return 0;
                    if (key_is(k, kl, "tokenizer.ggml.scores") && et == 6) {
                        if (!g->scores) g->scores = calloc(cnt, sizeof(float));
                        memcpy(&g->scores[j], p + r.off, 4);
                    }
                    if (key_is(k, kl, "tokenizer.ggml.token_type") && et == 5) {
                        if (!g->types) g->types = calloc(cnt, sizeof(int32_t));
                        memcpy(&g->types[j], p + r.off, 4);
                    }
                    r.off += es;
                }
            }
        } else {
            size_t es = type_size(ty);
            if (!es) return 0;
            int64_t v = (int64_t)rd_u(&r, es);
            if (key_is(k, kl, "tokenizer.ggml.bos_token_id")) g->bos = v;
            if (key_is(k, kl, "tokenizer.ggml.eos_token_id")) g->eos = v;
            if (key_is(k, kl, "tokenizer.ggml.unknown_token_id")) g->unk = v;
            if (key_is(k, kl, "tokenizer.ggml.padding_token_id")) g->pad = v;
            if (key_is(k, kl, "tokenizer.ggml.add_bos_token")) g->add_bos = (int)v;
            if (key_is(k, kl, "tokenizer.ggml.add_space_prefix")) g->add_space_prefix = (int)v;
        }
    }
    return !r.bad && g->model && g->tokens;
}

static void gguf_tok_free(gguf_tok *g)
{
    free(g->tokens);
    free(g->token_lens);
    free(g->merges);
    free(g->merge_lens);
    free(g->scores);
    free(g->types);
}

static void gguf_family(const char *label, const char *path, const char *vec, int lossless)
{
    at_mapped_file mf = {0};
    CHECK_OK(at_map_file(path, &mf));
    gguf_tok g;
    int ok = mf.data && gguf_read(mf.data, mf.size, &g);
    CHECK_MSG(ok, "%s: cannot read GGUF tokenizer metadata", path);
    if (ok) {
        char model[16] = {0}, pre[64] = {0};
        memcpy(model, g.model, g.model_len < 15 ? g.model_len : 15);
        if (g.pre) memcpy(pre, g.pre, g.pre_len < 63 ? g.pre_len : 63);
        at_tokenizer_arrays a = {
            .model = model, .pre = g.pre ? pre : NULL, .n_tokens = g.n_tokens, .tokens = g.tokens,
            .token_lens = g.token_lens, .scores = g.scores, .token_types = g.types, .n_merges = g.n_merges,
            .merges = g.merges, .merge_lens = g.merge_lens, .bos_id = (int32_t)g.bos, .eos_id = (int32_t)g.eos,
            .unk_id = (int32_t)g.unk, .pad_id = (int32_t)g.pad, .add_bos = g.add_bos,
            .add_space_prefix = g.add_space_prefix};
        at_tokenizer *t = NULL;
        CHECK_OK(at_tokenizer_from_arrays(&a, &t));
        vectors v;
        CHECK(read_ggml_vectors(vec, &v));
        if (t) run_vectors(label, t, &v, 0, lossless);
        if (t && g.bos >= 0) {
            /* add_special puts BOS first when the file says so. */
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(at_tokenizer_encode(t, "Hello", 5, AT_TOK_ADD_SPECIAL, &ids, &n));
            CHECK(n >= 1 && (g.add_bos ? ids[0] == (int32_t)g.bos : ids[0] != (int32_t)g.bos));
            free(ids);
        }
        at_tokenizer_free(t);
        vectors_free(&v);
        gguf_tok_free(&g);
    }
    at_unmap_file(&mf);
}

int main(void)
{
    at_log_set_level(AT_LOG_WARN);
    /* Byte-level BPE: lossless. */
    family("gpt-2 (vocab.json+merges.txt)", DATA "gpt2", NULL, "gpt-2", 0, 1, "gpt2");
    family("qwen2 (vocab.json, Qwen2Tokenizer)", DATA "qwen2", NULL, "qwen2", 0, 1, "qwen2");
    family("qwen2 (Qwen3 tokenizer.json)", DATA "qwen3/tokenizer.json", NULL, "qwen2", 0, 1, "tokenizer.json");
    family("llama-bpe (Llama 3 tokenizer.json)", DATA "llama3", NULL, "llama-bpe", 0, 1, "tokenizer.json");
    family("llama-bpe (encoder.json+vocab.bpe)", DATA "llama3-bpe", NULL, "llama-bpe", 0, 1, "llama3");
    family("falcon (tokenizer.json)", DATA "falcon", NULL, "falcon", 0, 1, NULL);
    /* SentencePiece-style BPE. */
    family("phi-3 (tokenizer.json)", DATA "phi-3", NULL, "phi-3", 0, 1, NULL);
    family("llama-spm (Phi-3 tokenizer.json)", DATA "phi-3", NULL, "llama-spm", 0, 1, NULL);
    family("tinyllama (+parse_special)", DATA "tinyllama", NULL, "tinyllama", AT_TOK_PARSE_SPECIAL, 0, NULL);
    gguf_family("llama-spm (GGUF arrays)", DATA "ggml-vocab-llama-spm.gguf", "llama-spm", 1);
    mistral("mistral-v0.3 (lenml vectors)", DATA "mistral-v0.3");

    /* The full files, when the shared data folder is beside the checkout. */
    const char *S = "../shared/data/";
    if (at_is_dir("../shared/data/tokenizers")) {
        char p[512];
#define FULL(label, dir, vec, want) \
    do { snprintf(p, sizeof p, "%stokenizers/%s", S, dir); family(label, p, NULL, vec, 0, 1, want); } while (0)
        FULL("full gpt2 vocab.json", "gpt2", "gpt-2", "gpt2");
        FULL("full qwen2 vocab.json", "qwen2", "qwen2", "qwen2");
        FULL("full qwen3 tokenizer.json", "qwen3-full", "qwen2", "tokenizer.json");
        FULL("full llama3 tokenizer.json", "llama3-full", "llama-bpe", "tokenizer.json");
        FULL("full llama3 encoder.json", "llama3", "llama-bpe", "llama3");
        FULL("full falcon tokenizer.json", "falcon", "falcon", NULL);
        FULL("full phi-3 tokenizer.json", "phi-3-mini", "phi-3", NULL);
        snprintf(p, sizeof p, "%stokenizers/mistral-7b-instruct-v0.3", S);
        mistral("full mistral-v0.3 tokenizer.json", p);
        snprintf(p, sizeof p, "%stokenizer-vectors/ggml-vocab-phi-3.gguf", S);
        gguf_family("phi-3 (full GGUF arrays)", p, "phi-3", 1);
        snprintf(p, sizeof p, "%stokenizer-vectors/ggml-vocab-gpt-2.gguf", S);
        gguf_family("gpt-2 (full GGUF arrays)", p, "gpt-2", 1);
    } else {
        printf("../shared/data absent: full-file checks skipped\n");
    }
    return at_test_result("test_tokenizer_vectors");
}
