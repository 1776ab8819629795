/* The tokenizer API beyond the HF vectors (test_tokenizer_vectors.c):
 * special tokens on and off, added-token options, BOS/EOS/PAD from
 * tokenizer_config.json, decode with skip_special, streaming decode,
 * token_to_piece, llama2.c tokenizer.bin against a port of run.c's encode,
 * components (NFKC, Lowercase, Strip, Digits, Metaspace) on small inline
 * files, invalid UTF-8, and clear errors for bad or unsupported files. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "testing.h"
#include "text/tokenizer.h"

#define DATA "tests/data/tokenizers/"

static int32_t *enc(const at_tokenizer *t, const char *s, unsigned flags, size_t *n)
{
    int32_t *ids = NULL;
    *n = 0;
    CHECK_OK(at_tokenizer_encode(t, s, strlen(s), flags, &ids, n));
    return ids;
}

static int contains(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

static int eq_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static int valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int k = p[i] < 0x80 ? 1 : (p[i] & 0xE0) == 0xC0 ? 2 : (p[i] & 0xF0) == 0xE0 ? 3 : (p[i] & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + (size_t)k > n) return 0;
        for (int j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* Chat markup: special tokens are tokens only when the caller asks. */
static void test_special_tokens(void)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "qwen3/tokenizer.json", NULL, &t));
    if (!t) return;
    const char *chat = "<|im_start|>user\nhello<|im_end|>";
    size_t n1, n2;
    int32_t *on = enc(t, chat, AT_TOK_PARSE_SPECIAL, &n1);
    int32_t *off = enc(t, chat, 0, &n2);
    CHECK(n1 > 0 && on[0] == 151644 && on[n1 - 1] == 151645);
    CHECK(!contains(off, n2, 151644) && !contains(off, n2, 151645) && n2 > n1);
    CHECK(at_tokenizer_special_id(t, "<|im_end|>") == 151645);
    CHECK(at_tokenizer_token_to_id(t, "<|im_start|>") == 151644);
    CHECK(at_tokenizer_is_special(t, 151644) && !at_tokenizer_is_special(t, 9707));
    CHECK(at_tokenizer_special_id(t, "hello") == -1);
    const char *s = at_tokenizer_id_to_token(t, 151645);
    CHECK(s && strcmp(s, "<|im_end|>") == 0);
    CHECK(at_tokenizer_id_to_token(t, -1) == NULL && at_tokenizer_id_to_token(t, 99999999) == NULL);
    CHECK(at_tokenizer_vocab_size(t) >= 151669);
    char *d = NULL;
    size_t dl = 0;
    CHECK_OK(at_tokenizer_decode(t, on, n1, 0, &d, &dl));
    CHECK(d && strcmp(d, chat) == 0);
    free(d);
    CHECK_OK(at_tokenizer_decode(t, on, n1, 1, &d, &dl));
    CHECK(d && strcmp(d, "user\nhello") == 0);
    free(d);
    /* Text without markup decodes to itself either way. */
    CHECK_OK(at_tokenizer_decode(t, off, n2, 1, &d, &dl));
    CHECK(d && strcmp(d, chat) == 0);
    free(d);
    /* Ids out of range are an error, not a crash. */
    int32_t bad[2] = {1, 1 << 30};
    CHECK_FAILS(at_tokenizer_decode(t, bad, 2, 0, &d, &dl), AT_ERR_INVALID);
    free(on);
    free(off);
    at_tokenizer_free(t);
}

/* BOS/EOS/PAD from tokenizer_config.json (Qwen2-1.5B-Instruct: eos
 * <|im_end|>, pad <|endoftext|>, no bos) and Llama's BOS template. */
static void test_config_tokens(void)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "qwen2", NULL, &t));
    if (t) {
        CHECK(at_tokenizer_eos(t) == 151645);
        CHECK(at_tokenizer_pad(t) == 151643);
        CHECK(at_tokenizer_bos(t) == -1);
        CHECK(strcmp(at_tokenizer_pre_name(t), "qwen2") == 0);
        size_t n;
        int32_t *ids = enc(t, "hi", AT_TOK_ADD_SPECIAL, &n);
        CHECK(n == 1); /* nothing to add */
        free(ids);
    }
    at_tokenizer_free(t);
    /* The pre-tokenizer can be forced: GPT-2's split gives other ids for
     * digits than Qwen's one-digit split. */
    at_tokenizer_opts o = {"gpt2"};
    CHECK_OK(at_tokenizer_load(DATA "qwen2", &o, &t));
    if (t) CHECK(strcmp(at_tokenizer_pre_name(t), "gpt2") == 0);
    at_tokenizer_free(t);
    o.pre = "no-such-family";
    CHECK_FAILS(at_tokenizer_load(DATA "qwen2", &o, &t), AT_ERR_UNSUPPORTED);

    CHECK_OK(at_tokenizer_load(DATA "tinyllama", NULL, &t));
    if (t) {
        size_t n1, n2;
        int32_t *a = enc(t, "Hello", AT_TOK_ADD_SPECIAL, &n1);
        int32_t *b = enc(t, "Hello", 0, &n2);
        CHECK(n1 == n2 + 1 && a[0] == 1 && at_tokenizer_bos(t) == 1 && at_tokenizer_eos(t) == 2);
        CHECK(eq_ids(a + 1, n1 - 1, b, n2));
        free(a);
        free(b);
    }
    at_tokenizer_free(t);
}

/* Phi-3's </s> is a non-special added token with rstrip: it is split out
 * even without AT_TOK_PARSE_SPECIAL and takes the space after it, so
 * "</s> XML" is </s> then "▁XML" (6560); without rstrip (TinyLlama) the
 * space stays: </s> "▁" "▁XML" (the llama.cpp vector 2 29871 6560). */
static void test_added_token_options(void)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "phi-3", NULL, &t));
    if (t) {
        size_t n;
        int32_t *ids = enc(t, "</s> XML", 0, &n);
        int32_t want[] = {2, 6560};
        CHECK(eq_ids(ids, n, want, 2));
        free(ids);
        /* A special token written in user text stays text. */
        ids = enc(t, "<|user|>", 0, &n);
        CHECK(n > 1 && !contains(ids, n, 32010));
        free(ids);
        ids = enc(t, "<|user|>", AT_TOK_PARSE_SPECIAL, &n);
        CHECK(n == 1 && ids[0] == 32010);
        free(ids);
    }
    at_tokenizer_free(t);

    /* lstrip and single_word on an inline tokenizer: ids are characters. */
    const char *json =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\" \":2,\"x\":3},\"merges\":[]},"
        "\"added_tokens\":["
        "{\"id\":10,\"content\":\"<L>\",\"special\":true,\"lstrip\":true,\"rstrip\":false,\"single_word\":false,\"normalized\":false},"
        "{\"id\":11,\"content\":\"ab\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":true,\"normalized\":false}]}";
    CHECK_OK(at_tokenizer_from_json(json, strlen(json), "inline", &t));
    if (t) {
        size_t n;
        int32_t *ids = enc(t, "a  <L>b", AT_TOK_PARSE_SPECIAL, &n);
        int32_t w1[] = {0, 10, 1}; /* the two spaces go into <L> */
        CHECK(eq_ids(ids, n, w1, 3));
        free(ids);
        ids = enc(t, "x ab x", 0, &n);
        int32_t w2[] = {3, 2, 11, 2, 3}; /* "ab" alone is a word */
        CHECK(eq_ids(ids, n, w2, 5));
        free(ids);
        ids = enc(t, "xab", 0, &n);
        int32_t w3[] = {3, 0, 1}; /* inside a word it is not */
        CHECK(eq_ids(ids, n, w3, 3));
        free(ids);
    }
    at_tokenizer_free(t);
}

/* Streaming decode gives, piece by piece, exactly the full decode, and never
 * a cut character (byte-level tokens and <0xXX> tokens split characters). */
static void stream_check(const char *path, const char *text)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(path, NULL, &t));
    if (!t) return;
    size_t n;
    int32_t *ids = enc(t, text, 0, &n);
    char *full = NULL;
    size_t fl = 0;
    CHECK_OK(at_tokenizer_decode(t, ids, n, 0, &full, &fl));
    CHECK(full && strcmp(full, text) == 0);
    at_tok_stream *s = NULL;
    CHECK_OK(at_tok_stream_new(t, 0, &s));
    char acc[1024];
    size_t al = 0;
    int cut_ok = 1, held = 0;
    for (size_t i = 0; s && i < n; i++) {
        const char *p;
        size_t pl;
        CHECK_OK(at_tok_stream_push(s, ids[i], &p, &pl));
        if (!valid_utf8(p, pl)) cut_ok = 0;
        if (pl == 0) held = 1;
        if (al + pl < sizeof acc) {
            memcpy(acc + al, p, pl);
            al += pl;
        }
    }
    if (s) {
        const char *p;
        size_t pl;
        CHECK_OK(at_tok_stream_flush(s, &p, &pl));
        CHECK(pl == 0);
    }
    CHECK_MSG(cut_ok, "%s: a streamed piece was not valid UTF-8", path);
    CHECK_MSG(held, "%s: no token held back a partial character (test text too easy)", path);
    CHECK_MSG(al == fl && full && memcmp(acc, full, al) == 0, "%s: stream \"%.*s\" != decode \"%s\"", path, (int)al, acc,
              full ? full : "");
    /* An incomplete character at the end comes out as U+FFFD on flush. */
    at_tok_stream_free(s);
    s = NULL;
    CHECK_OK(at_tok_stream_new(t, 0, &s));
    int32_t byte_tok = -1;
    for (size_t i = 0; i < n && byte_tok < 0; i++) {
        char *pc = NULL;
        size_t pn = 0;
        if (at_tokenizer_token_to_piece(t, ids[i], &pc, &pn) == AT_OK && pn > 0 && !valid_utf8(pc, pn)) byte_tok = ids[i];
        free(pc);
    }
    CHECK(byte_tok >= 0);
    if (s && byte_tok >= 0) {
        const char *p;
        size_t pl;
        CHECK_OK(at_tok_stream_push(s, byte_tok, &p, &pl));
        CHECK_OK(at_tok_stream_flush(s, &p, &pl));
        CHECK(pl == 3 && memcmp(p, "\xEF\xBF\xBD", 3) == 0);
    }
    at_tok_stream_free(s);
    free(full);
    free(ids);
    at_tokenizer_free(t);
}

static void test_pieces(void)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "phi-3", NULL, &t));
    if (t) {
        char *p = NULL;
        size_t n = 0;
        CHECK_OK(at_tokenizer_token_to_piece(t, 13, &p, &n)); /* <0x0A> */
        CHECK(n == 1 && p && p[0] == '\n');
        free(p);
        CHECK_OK(at_tokenizer_token_to_piece(t, 15043, &p, &n)); /* ▁Hello */
        CHECK(p && strcmp(p, " Hello") == 0);
        free(p);
        CHECK_FAILS(at_tokenizer_token_to_piece(t, -5, &p, &n), AT_ERR_INVALID);
    }
    at_tokenizer_free(t);
    CHECK_OK(at_tokenizer_load(DATA "gpt2", NULL, &t));
    if (t) {
        char *p = NULL;
        size_t n = 0;
        int32_t id = at_tokenizer_token_to_id(t, "\xC4\xA0the"); /* "Ġthe" */
        CHECK(id == 262);
        CHECK_OK(at_tokenizer_token_to_piece(t, id, &p, &n));
        CHECK(p && strcmp(p, " the") == 0);
        free(p);
        CHECK(at_tokenizer_eos(t) == 50256 && at_tokenizer_is_special(t, 50256));
    }
    at_tokenizer_free(t);
}

/* ---- llama2.c: run.c's encode, ported as the reference ---------------- */

typedef struct {
    char **vocab;
    float *scores;
    int n;
} l2c;

static int l2c_read(const char *path, l2c *v)
{
    char *b = NULL;
    size_t len = 0;
    memset(v, 0, sizeof *v);
    if (at_read_file(path, &b, &len) != AT_OK) return 0;
    for (size_t o = 4; o + 8 <= len;) {
        int32_t l;
        memcpy(&l, b + o + 4, 4);
        v->vocab = realloc(v->vocab, (size_t)(v->n + 1) * sizeof *v->vocab);
        v->scores = realloc(v->scores, (size_t)(v->n + 1) * sizeof *v->scores);
        memcpy(&v->scores[v->n], b + o, 4);
        v->vocab[v->n] = malloc((size_t)l + 1);
        memcpy(v->vocab[v->n], b + o + 8, (size_t)l);
        v->vocab[v->n][l] = 0;
        v->n++;
        o += 8 + (size_t)l;
    }
    free(b);
    return v->n > 0;
}

static int l2c_lookup(const l2c *v, const char *s)
{
    for (int i = 0; i < v->n; i++) /* run.c bsearches a sorted copy; same result */
        if (strcmp(v->vocab[i], s) == 0) return i;
    return -1;
}

/* run.c encode(t, text, bos=0, eos=0, tokens, &n). */
static int l2c_encode(const l2c *v, const char *text, int *tokens)
{
    char buf[256];
    size_t str_len = 0;
    int n = 0;
    if (text[0] != '\0') tokens[n++] = l2c_lookup(v, " ");
    for (const char *c = text; *c != '\0'; c++) {
        if ((*c & 0xC0) != 0x80) str_len = 0;
        buf[str_len++] = *c;
        buf[str_len] = '\0';
        if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4) continue;
        int id = l2c_lookup(v, buf);
        if (id != -1) {
            tokens[n++] = id;
        } else {
            for (size_t i = 0; i < str_len; i++) tokens[n++] = (unsigned char)buf[i] + 3;
        }
        str_len = 0;
    }
    while (1) {
        float best_score = -1e10f;
        int best_id = -1, best_idx = -1;
        for (int i = 0; i < n - 1; i++) {
            snprintf(buf, sizeof buf, "%s%s", v->vocab[tokens[i]], v->vocab[tokens[i + 1]]);
            int id = l2c_lookup(v, buf);
            if (id != -1 && v->scores[id] > best_score) {
                best_score = v->scores[id];
                best_id = id;
                best_idx = i;
            }
        }
        if (best_idx == -1) break;
        tokens[best_idx] = best_id;
        for (int i = best_idx + 1; i < n - 1; i++) tokens[i] = tokens[i + 1];
        n--;
    }
    return n;
}

static void test_llama2c(void)
{
    l2c v;
    CHECK(l2c_read(DATA "llama2c/tok512.bin", &v));
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "llama2c/tok512.bin", NULL, &t));
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "Lily's mom said, \"Lily, let's go to the park.\"",
        "She wanted to play with it, but it was too high.\nThe end.",
        "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 zebra!",  /* bytes fall back */
        "   spaces   and\ttabs",
        "",
    };
    for (size_t k = 0; t && v.n && k < sizeof texts / sizeof texts[0]; k++) {
        int want[512];
        int nw = l2c_encode(&v, texts[k], want);
        size_t n;
        int32_t *got = enc(t, texts[k], 0, &n);
        int same = (size_t)nw == n;
        for (size_t i = 0; same && i < n; i++) same = got[i] == want[i];
        CHECK_MSG(same, "tok512.bin: \"%s\": %zu ids, run.c gives %d", texts[k], n, nw);
        /* Round trip (run.c's decode drops the space after BOS). */
        char *d = NULL;
        CHECK_OK(at_tokenizer_decode(t, got, n, 1, &d, NULL));
        CHECK_MSG(d && strcmp(d, texts[k]) == 0, "tok512.bin: decode gives \"%s\"", d ? d : "");
        free(d);
        free(got);
    }
    if (t) {
        size_t n;
        int32_t *ids = enc(t, "Hi", AT_TOK_ADD_SPECIAL, &n);
        CHECK(n >= 2 && ids[0] == 1 && at_tokenizer_bos(t) == 1 && at_tokenizer_eos(t) == 2);
        CHECK(strcmp(at_tokenizer_pre_name(t), "llama2c") == 0 && at_tokenizer_vocab_size(t) == 512);
        free(ids);
    }
    for (int i = 0; i < v.n; i++) free(v.vocab[i]);
    free(v.vocab);
    free(v.scores);
    at_tokenizer_free(t);
}

/* ---- components on inline files ---------------------------------------- */

static at_tokenizer *inline_tok(const char *norm, const char *pre, const char *vocab_extra)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"normalizer\":%s,\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\","
             "\"vocab\":{\"?\":0,\"f\":1,\"i\":2,\"a\":3,\"b\":4,\"1\":5,\"2\":6,\"12\":7,\"\xE2\x96\x81\":8%s},"
             "\"merges\":[\"1 2\"]},\"decoder\":null}",
             norm, pre, vocab_extra);
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_from_json(json, strlen(json), "inline", &t));
    return t;
}

static void expect(at_tokenizer *t, const char *text, const int32_t *want, size_t nw)
{
    if (!t) return;
    size_t n;
    int32_t *ids = enc(t, text, 0, &n);
    CHECK_MSG(eq_ids(ids, n, want, nw), "\"%s\": got %zu ids", text, n);
    free(ids);
}

static void test_components(void)
{
    /* NFKC folds the ligature ﬁ to "fi"; Lowercase; Strip drops the spaces. */
    at_tokenizer *t = inline_tok(
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
        "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}]}",
        "null", "");
    int32_t w1[] = {1, 2, 3, 4};
    expect(t, "  \xEF\xAC\x81" "AB ", w1, 4);
    /* Unknown characters become the unk token. */
    int32_t w2[] = {3, 0, 4};
    expect(t, "a\xC3\xA9" "b", w2, 3);
    at_tokenizer_free(t);
    /* Digits: individual digits stop the "1 2" merge. */
    t = inline_tok("null", "{\"type\":\"Digits\",\"individual_digits\":true}", "");
    int32_t w3[] = {5, 6};
    expect(t, "12", w3, 2);
    at_tokenizer_free(t);
    t = inline_tok("null", "{\"type\":\"Digits\",\"individual_digits\":false}", "");
    int32_t w4[] = {7};
    expect(t, "12", w4, 1);
    at_tokenizer_free(t);
    /* Metaspace "first" prepends "▁" only at the start of the text; a text
     * that starts with a space gets none extra (HF tokenizers' rule). */
    t = inline_tok("null",
                   "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":true}",
                   "");
    int32_t w5[] = {8, 3, 8, 4};
    expect(t, "a b", w5, 4);
    int32_t w6[] = {8, 3};
    expect(t, " a", w6, 2);
    at_tokenizer_free(t);
    t = inline_tok("null",
                   "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"never\",\"split\":false}",
                   "");
    int32_t w7[] = {3, 8, 4};
    expect(t, "a b", w7, 3);
    at_tokenizer_free(t);
    /* Split with a literal pattern, removed. */
    t = inline_tok("null", "{\"type\":\"Split\",\"pattern\":{\"String\":\"b\"},\"behavior\":\"Removed\",\"invert\":false}", "");
    int32_t w8[] = {3, 3};
    expect(t, "aba", w8, 2);
    at_tokenizer_free(t);
}

/* ---- invalid input and bad files ----------------------------------------- */

static void test_invalid_utf8(void)
{
    at_tokenizer *t = NULL;
    CHECK_OK(at_tokenizer_load(DATA "qwen3/tokenizer.json", NULL, &t));
    if (!t) return;
    /* Invalid bytes read as U+FFFD, like a Python str from bytes with
     * errors="replace". */
    const char bad[] = "ok\xFF\xC3(end\xE4\xBD";
    const char rep[] = "ok\xEF\xBF\xBD\xEF\xBF\xBD(end\xEF\xBF\xBD";
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK_OK(at_tokenizer_encode(t, bad, sizeof bad - 1, 0, &a, &na));
    CHECK_OK(at_tokenizer_encode(t, rep, sizeof rep - 1, 0, &b, &nb));
    CHECK(na > 0 && eq_ids(a, na, b, nb));
    free(a);
    free(b);
    /* Embedded NUL bytes are text like any other. */
    CHECK_OK(at_tokenizer_encode(t, "a\0b", 3, 0, &a, &na));
    CHECK(na == 3);
    free(a);
    CHECK_OK(at_tokenizer_encode(t, "", 0, AT_TOK_ADD_SPECIAL, &a, &na));
    CHECK(na == 0 && a == NULL);
    at_tokenizer_free(t);
}

static void fails_with(const char *json, at_status code, const char *needle)
{
    at_tokenizer *t = NULL;
    at_status st = at_tokenizer_from_json(json, strlen(json), "bad.json", &t);
    CHECK_MSG(st == code, "expected %s, got %s (%s)", at_status_name(code), at_status_name(st), at_last_error());
    CHECK_MSG(strstr(at_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", at_last_error(), needle);
    CHECK(t == NULL);
    at_tokenizer_free(t);
}

static void test_errors(void)
{
    const char *m = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    char buf[1024];
    snprintf(buf, sizeof buf, "{%s,\"normalizer\":{\"type\":\"BertNormalizer\"}}", m);
    fails_with(buf, AT_ERR_UNSUPPORTED, "BertNormalizer");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"}}", m);
    fails_with(buf, AT_ERR_UNSUPPORTED, "UnicodeScripts");
    snprintf(buf, sizeof buf, "{%s,\"decoder\":{\"type\":\"WordPiece\"}}", m);
    fails_with(buf, AT_ERR_UNSUPPORTED, "WordPiece");
    snprintf(buf, sizeof buf, "{%s,\"post_processor\":{\"type\":\"Foo\"}}", m);
    fails_with(buf, AT_ERR_UNSUPPORTED, "Foo");
    fails_with("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", AT_ERR_UNSUPPORTED, "Unigram");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a c\"]}}", AT_ERR_FORMAT, "\"c\"");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a\"]}}", AT_ERR_FORMAT, "merged token");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"}}}", AT_ERR_FORMAT, "model.vocab");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\n \"normalizer\": [}", AT_ERR_FORMAT, "line 2");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"}}}", m);
    fails_with(buf, AT_ERR_FORMAT, "regex");
    fails_with("[1,2]", AT_ERR_FORMAT, "object");
    /* legacy merges holding tokens with spaces (issue 21.8): refused as
     * Hugging Face's tokenizers refuses them, saying how to fix the file */
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"  \":1,\"   \":2},\"merges\":[\"   \"]}}",
               AT_ERR_FORMAT, "Hugging Face's tokenizers refuses it too");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"  \":1,\"   \":2},\"merges\":[\"   \"]}}",
               AT_ERR_FORMAT, "as pairs [\"a\", \"b\"]");
    /* the pair form of the same merge is read */
    {
        at_tokenizer *tp = NULL;
        const char *pairs = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"  \":1,\"   \":2},"
                            "\"merges\":[[\" \", \" \"], [\"  \", \" \"]]}}";
        CHECK_OK(at_tokenizer_from_json(pairs, strlen(pairs), "pairs.json", &tp));
        at_tokenizer_free(tp);
    }
    /* not UTF-8 (a lone continuation byte, an overlong "/", a truncated
     * sequence at the end): refused before parsing, naming line and byte */
    fails_with("{\"model\":{\"type\":\"BPE\",\n\"vocab\":{\"a\x80\":0}}}", AT_ERR_FORMAT, "line 2, byte 12");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xc0\xaf\":0}}}", AT_ERR_FORMAT, "not valid UTF-8");
    fails_with("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}\xe2\x96", AT_ERR_FORMAT, "not valid UTF-8");
    /* The Llama 2 copy in shared/ has U+00A0 turned into spaces: merges such
     * as "▁  " are ambiguous, and HF refuses the file as well. */
    at_tokenizer *t = NULL;
    CHECK_FAILS(at_tokenizer_load(DATA "llama2/tokenizer.json", NULL, &t), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "merge") != NULL);
    CHECK_FAILS(at_tokenizer_load(DATA "no-such-dir", NULL, &t), AT_ERR_NOT_FOUND);
    CHECK_FAILS(at_tokenizer_load("tests/data", NULL, &t), AT_ERR_NOT_FOUND);
    /* A truncated tokenizer.bin. */
    char *bin = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(DATA "llama2c/tok512.bin", &bin, &len));
    if (bin) {
        char path[] = "/tmp/at_tok_trunc_XXXXXX.bin";
        int fd = mkstemps(path, 4);
        CHECK(fd >= 0);
        if (fd >= 0) {
            CHECK(write(fd, bin, len / 2) == (ssize_t)(len / 2));
            close(fd);
            CHECK_FAILS(at_tokenizer_load(path, NULL, &t), AT_ERR_FORMAT);
            CHECK(strstr(at_last_error(), "runs past the end") || strstr(at_last_error(), "cut"));
            unlink(path);
        }
        free(bin);
    }
    at_tokenizer_arrays a = {.model = "bert", .n_tokens = 1, .tokens = (const char *const[]){"a"}};
    CHECK_FAILS(at_tokenizer_from_arrays(&a, &t), AT_ERR_UNSUPPORTED);
    a.model = "llama"; /* no scores */
    CHECK_FAILS(at_tokenizer_from_arrays(&a, &t), AT_ERR_INVALID);
}

int main(void)
{
    at_log_set_level(AT_LOG_WARN);
    test_special_tokens();
    test_config_tokens();
    test_added_token_options();
    stream_check(DATA "qwen3/tokenizer.json", "Mixed 中文 and 𝔘𝔫𝔦 emoji 😀👍🏽 text");
    stream_check(DATA "mistral-v0.3", "Emoji: 😀🎉👍🏽 🇫🇷 👨‍👩‍👧‍👦 and ❤️‍🔥!");
    test_pieces();
    test_llama2c();
    test_components();
    test_invalid_utf8();
    test_errors();
    return at_test_result("test_tokenizer");
}
