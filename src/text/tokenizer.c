/* The tokenizer's public face: the encode and decode pipelines, lookups,
 * streaming decode, and the choice of loader. The parts live in tok_*.c. */
#include "text/tokenizer.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/log.h"
#include "text/tok_internal.h"

void tok_added_free_all(at_tokenizer *t);
at_status tok_load_vocab_merges(const char *dir, const at_tokenizer_opts *opts, at_tokenizer **out);
at_status tok_load_llama2c(const char *path, at_tokenizer **out);

at_status tok_new(at_tokenizer **out)
{
    *out = NULL;
    at_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    t->model.unk_id = -1;
    for (int i = 0; i < 256; i++) t->model.byte_ids[i] = -1;
    tok_byte_level_init();
    *out = t;
    return AT_OK;
}

void at_tokenizer_free(at_tokenizer *t)
{
    if (!t) return;
    tok_bpe_free(&t->model);
    for (size_t i = 0; i < t->n_norm; i++) tok_norm_free(&t->norm[i]);
    free(t->norm);
    for (size_t i = 0; i < t->n_pre; i++) tok_pre_free(&t->pre[i]);
    free(t->pre);
    for (size_t i = 0; i < t->n_dec; i++) tok_dec_free(&t->dec[i]);
    free(t->dec);
    free(t->post.pre);
    free(t->post.post);
    tok_added_free_all(t);
    free(t);
}

at_status tok_push_norm(at_tokenizer *t, tok_norm *n)
{
    tok_norm *v = realloc(t->norm, (t->n_norm + 1) * sizeof *v);
    if (!v) {
        tok_norm_free(n);
        return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->norm = v;
    t->norm[t->n_norm++] = *n;
    return AT_OK;
}

at_status tok_push_pre(at_tokenizer *t, tok_pre *p)
{
    tok_pre *v = realloc(t->pre, (t->n_pre + 1) * sizeof *v);
    if (!v) {
        tok_pre_free(p);
        return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->pre = v;
    t->pre[t->n_pre++] = *p;
    return AT_OK;
}

at_status tok_push_dec(at_tokenizer *t, tok_dec *d)
{
    tok_dec *v = realloc(t->dec, (t->n_dec + 1) * sizeof *v);
    if (!v) {
        tok_dec_free(d);
        return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->dec = v;
    t->dec[t->n_dec++] = *d;
    t->has_decoder = 1;
    return AT_OK;
}

at_status tok_post_push(int32_t **v, size_t *n, int32_t id)
{
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    *v = p;
    p[(*n)++] = id;
    return AT_OK;
}

at_status tok_finish(at_tokenizer *t)
{
    AT_TRY(tok_bpe_finish(&t->model));
    AT_TRY(tok_added_finish(t));
    if (t->unk_id < 0) t->unk_id = t->model.unk_id;
    return AT_OK;
}

/* ---- lookups ------------------------------------------------------------- */

size_t at_tokenizer_vocab_size(const at_tokenizer *t)
{
    int32_t n = t->model.vocab.n;
    if (t->n_added_of_id > n) n = t->n_added_of_id;
    return (size_t)n;
}

const char *at_tokenizer_id_to_token(const at_tokenizer *t, int32_t id)
{
    const tok_added *a = tok_added_by_id(t, id);
    if (a) return a->content;
    if (id < 0 || id >= t->model.vocab.n) return NULL;
    return t->model.vocab.str[id];
}

int32_t at_tokenizer_token_to_id(const at_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, token, n) == 0) return t->added[i].id;
    return tok_vocab_find(&t->model.vocab, token, n);
}

int32_t at_tokenizer_special_id(const at_tokenizer *t, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].special && t->added[i].len == n && memcmp(t->added[i].content, text, n) == 0)
            return t->added[i].id;
    return -1;
}

int at_tokenizer_is_special(const at_tokenizer *t, int32_t id)
{
    const tok_added *a = tok_added_by_id(t, id);
    return a && a->special;
}

int32_t at_tokenizer_bos(const at_tokenizer *t) { return t->bos_id; }
int32_t at_tokenizer_eos(const at_tokenizer *t) { return t->eos_id; }
int32_t at_tokenizer_pad(const at_tokenizer *t) { return t->pad_id; }
int32_t at_tokenizer_unk(const at_tokenizer *t) { return t->unk_id; }
const char *at_tokenizer_pre_name(const at_tokenizer *t) { return t->pre_name; }

/* ---- encode --------------------------------------------------------------- */

static at_status push_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *v, size_t k)
{
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + k) c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for ids");
        *ids = p;
        *cap = c;
    }
    if (k) memcpy(*ids + *n, v, k * sizeof *v);
    *n += k;
    return AT_OK;
}

typedef struct {
    tok_buf norm;
    tok_pieces in, out;
    tok_span *spans2;
    size_t n2, cap2;
    pcre2_match_data *md;
} enc_scratch;

/* Normalize, split normalized added tokens, pre-tokenize, run the model. */
static at_status encode_segment(at_tokenizer *t, const char *s, size_t n, int at_start, int skip_special,
                                int use_cache, enc_scratch *w, int32_t **ids, size_t *nids, size_t *cap)
{
    const char *ns = s;
    size_t nn = n;
    if (t->n_norm) {
        AT_TRY(tok_normalize(t->norm, t->n_norm, s, n, &w->norm));
        ns = w->norm.p ? w->norm.p : "";
        nn = w->norm.len;
    }
    w->n2 = 0;
    AT_TRY(tok_added_split(t, &t->match_norm, 1, ns, nn, skip_special, &w->spans2, &w->n2, &w->cap2));
    for (size_t k = 0; k < w->n2; k++) {
        tok_span sp = w->spans2[k];
        if (sp.id >= 0) {
            AT_TRY(push_ids(ids, nids, cap, &sp.id, 1));
            continue;
        }
        tok_pieces_clear(&w->in);
        AT_TRY(tok_pieces_add(&w->in, ns + sp.off, sp.len, at_start && sp.off == 0));
        const tok_pieces *src = &w->in;
        if (t->n_pre) {
            AT_TRY(tok_pretokenize(t->pre, t->n_pre, &w->in, &w->out, w->md));
            src = &w->out;
        }
        for (size_t i = 0; i < src->n; i++)
            AT_TRY(tok_bpe_encode(&t->model, src->text.p + src->v[i].off, src->v[i].len, use_cache, ids, nids, cap));
    }
    return AT_OK;
}

at_status at_tokenizer_encode(const at_tokenizer *tc, const char *text, size_t len, unsigned flags, int32_t **ids,
                              size_t *n)
{
    /* The cache is the only state encode changes; it is guarded by a lock
     * that a concurrent caller does not wait for (it runs uncached). */
    at_tokenizer *t = (at_tokenizer *)tc;
    at_status st = AT_OK;
    tok_buf clean = {0};
    tok_span *spans = NULL;
    size_t nsp = 0, capsp = 0, cap = 0;
    enc_scratch w = {0};
    int skip_special = !(flags & AT_TOK_PARSE_SPECIAL);
    int use_cache = 0;
    *ids = NULL;
    *n = 0;
    if (!text && len) return at_error(AT_ERR_INVALID, "tokenizer: encode: NULL text");
    if (t->model.cache && t->model.cache_lock_ok) use_cache = pthread_mutex_trylock(&t->model.cache_lock) == 0;

    w.md = pcre2_match_data_create(4, NULL);
    if (!w.md) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (flags & AT_TOK_ADD_SPECIAL) AT_CHECK(push_ids(ids, n, &cap, t->post.pre, t->post.n_pre));
    AT_CHECK(tok_utf8_sanitize(text ? text : "", len, &clean));
    const char *s = clean.p ? clean.p : "";
    AT_CHECK(tok_added_split(t, &t->match_raw, 0, s, clean.len, skip_special, &spans, &nsp, &capsp));
    for (size_t i = 0; i < nsp; i++) {
        if (spans[i].id >= 0)
            AT_CHECK(push_ids(ids, n, &cap, &spans[i].id, 1));
        else
            AT_CHECK(encode_segment(t, s + spans[i].off, spans[i].len, spans[i].off == 0, skip_special, use_cache, &w,
                                    ids, n, &cap));
    }
    if (flags & AT_TOK_ADD_SPECIAL) AT_CHECK(push_ids(ids, n, &cap, t->post.post, t->post.n_post));
done:
    if (use_cache) pthread_mutex_unlock(&t->model.cache_lock);
    if (w.md) pcre2_match_data_free(w.md);
    tok_buf_free(&w.norm);
    tok_pieces_free(&w.in);
    tok_pieces_free(&w.out);
    free(w.spans2);
    free(spans);
    tok_buf_free(&clean);
    if (st != AT_OK) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    } else if (*n == 0) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}

/* ---- decode --------------------------------------------------------------- */

enum { DEC_NO_STRIP = 1 };

static at_status collect_tokens(const at_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                                tok_pieces *out)
{
    for (size_t i = 0; i < n; i++) {
        const tok_added *a = tok_added_by_id(t, ids[i]);
        if (a) {
            if (skip_special && a->special) continue;
            AT_TRY(tok_pieces_add(out, a->content, a->len, 0));
            continue;
        }
        if (ids[i] < 0 || ids[i] >= t->model.vocab.n || !t->model.vocab.str[ids[i]])
            return at_error(AT_ERR_INVALID, "tokenizer: decode: token id %d at position %zu is not in the vocabulary",
                            (int)ids[i], i);
        AT_TRY(tok_pieces_add(out, t->model.vocab.str[ids[i]], t->model.vocab.len[ids[i]], 0));
    }
    return AT_OK;
}

static at_status join(const tok_pieces *p, const char *sep, char **out, size_t *len)
{
    tok_buf b = {0};
    at_status st = tok_buf_reserve(&b, 0);
    for (size_t i = 0; st == AT_OK && i < p->n; i++) {
        if (i && sep) st = tok_buf_put(&b, sep, strlen(sep));
        if (st == AT_OK) st = tok_buf_put(&b, p->text.p + p->v[i].off, p->v[i].len);
    }
    if (st != AT_OK) {
        tok_buf_free(&b);
        return st;
    }
    *out = b.p;
    if (len) *len = b.len;
    return AT_OK;
}

at_status at_tokenizer_decode(const at_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                              size_t *len)
{
    tok_pieces p = {0};
    at_status st = AT_OK;
    *out = NULL;
    if (len) *len = 0;
    AT_CHECK(collect_tokens(t, ids, n, skip_special, &p));
    if (t->has_decoder) {
        AT_CHECK(tok_decode_chain(t->dec, t->n_dec, &p, 0));
        AT_CHECK(join(&p, NULL, out, len));
    } else {
        AT_CHECK(join(&p, " ", out, len));
    }
done:
    tok_pieces_free(&p);
    return st;
}

/* The raw bytes of one token: the decoder chain without its strip steps and
 * without turning partial UTF-8 into U+FFFD (a byte-level token or a
 * <0xXX> token may hold part of a character). */
static at_status raw_piece(const at_tokenizer *t, int32_t id, tok_buf *out)
{
    out->len = 0;
    const tok_added *a = tok_added_by_id(t, id);
    if (a) return tok_buf_put(out, a->content, a->len);
    if (id < 0 || id >= t->model.vocab.n || !t->model.vocab.str[id])
        return at_error(AT_ERR_INVALID, "tokenizer: token id %d is not in the vocabulary", (int)id);
    const char *s = t->model.vocab.str[id];
    size_t n = t->model.vocab.len[id];
    int byte_level = 0, byte_fallback = 0;
    for (size_t i = 0; i < t->n_dec; i++) {
        if (t->dec[i].kind == TOK_DEC_BYTELEVEL) byte_level = 1;
        if (t->dec[i].kind == TOK_DEC_BYTEFALLBACK) byte_fallback = 1;
    }
    if (byte_fallback && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
        char hex[3] = {s[3], s[4], 0};
        char *end;
        long v = strtol(hex, &end, 16);
        if (*end == '\0') return tok_buf_putc(out, (char)v);
    }
    if (byte_level) {
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            int k = tok_utf8_decode((const uint8_t *)s + j, n - j, &cp);
            if (k == 0) {
                AT_TRY(tok_buf_putc(out, s[j]));
                j++;
                continue;
            }
            int b = tok_cp_to_byte(cp);
            if (b >= 0)
                AT_TRY(tok_buf_putc(out, (char)b));
            else
                AT_TRY(tok_buf_put(out, s + j, (size_t)k));
            j += (size_t)k;
        }
        return AT_OK;
    }
    /* Other chains (Replace / Metaspace / Fuse / Strip): run them on the one token. */
    tok_pieces p = {0};
    at_status st = tok_pieces_add(&p, s, n, 0);
    if (st == AT_OK && t->has_decoder) st = tok_decode_chain(t->dec, t->n_dec, &p, DEC_NO_STRIP);
    for (size_t i = 0; st == AT_OK && i < p.n; i++) st = tok_buf_put(out, p.text.p + p.v[i].off, p.v[i].len);
    tok_pieces_free(&p);
    return st;
}

at_status at_tokenizer_token_to_piece(const at_tokenizer *t, int32_t id, char **out, size_t *len)
{
    tok_buf b = {0};
    *out = NULL;
    at_status st = raw_piece(t, id, &b);
    if (st == AT_OK) st = tok_buf_reserve(&b, 0);
    if (st != AT_OK) {
        tok_buf_free(&b);
        return st;
    }
    *out = b.p;
    if (len) *len = b.len;
    return AT_OK;
}

/* ---- streaming decode ----------------------------------------------------- */

struct at_tok_stream {
    const at_tokenizer *t;
    int skip_special;
    int started;       /* a token has been emitted */
    tok_buf pending;   /* bytes of an incomplete character */
    tok_buf piece;
    tok_buf out;
};

at_status at_tok_stream_new(const at_tokenizer *t, int skip_special, at_tok_stream **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return AT_OK;
}

void at_tok_stream_continue(at_tok_stream *s)
{
    s->started = 1;
}

void at_tok_stream_free(at_tok_stream *s)
{
    if (!s) return;
    tok_buf_free(&s->pending);
    tok_buf_free(&s->piece);
    tok_buf_free(&s->out);
    free(s);
}

/* Moves the complete characters of pending to out; invalid bytes become
 * U+FFFD; a character cut at the end stays pending. */
static at_status stream_drain(at_tok_stream *s, int final)
{
    const uint8_t *p = (const uint8_t *)s->pending.p;
    size_t n = s->pending.len, i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_decode(p + i, n - i, &cp);
        if (k > 0) {
            AT_TRY(tok_buf_put(&s->out, p + i, (size_t)k));
            i += (size_t)k;
            continue;
        }
        /* Could the rest still become a character? */
        int want = tok_utf8_len(p[i]);
        size_t have = n - i;
        int prefix_ok = want > 1 && have < (size_t)want;
        for (size_t j = 1; prefix_ok && j < have; j++)
            if ((p[i + j] & 0xC0) != 0x80) prefix_ok = 0;
        if (prefix_ok && !final) break;
        AT_TRY(tok_buf_put(&s->out, "\xEF\xBF\xBD", 3));
        i += prefix_ok ? have : 1;
    }
    if (n > i) memmove(s->pending.p, s->pending.p + i, n - i);
    s->pending.len = n - i;
    return AT_OK;
}

at_status at_tok_stream_push(at_tok_stream *s, int32_t id, const char **text, size_t *len)
{
    s->out.len = 0;
    AT_TRY(tok_buf_reserve(&s->out, 0));
    *text = s->out.p;
    *len = 0;
    const tok_added *a = tok_added_by_id(s->t, id);
    if (a && a->special && s->skip_special) return AT_OK;
    AT_TRY(raw_piece(s->t, id, &s->piece));
    const char *p = s->piece.p ? s->piece.p : "";
    size_t n = s->piece.len;
    if (!s->started) {
        /* The first token loses the space the pre-tokenizer/normalizer put
         * in front of the text, as the decoder's Strip/Metaspace does. */
        if (!a && n > 0 && p[0] == ' ' && tok_decoder_strips_first(s->t->dec, s->t->n_dec)) {
            p++;
            n--;
        }
        s->started = 1;
    }
    AT_TRY(tok_buf_put(&s->pending, p, n));
    AT_TRY(stream_drain(s, 0));
    *text = s->out.p;
    *len = s->out.len;
    return AT_OK;
}

at_status at_tok_stream_flush(at_tok_stream *s, const char **text, size_t *len)
{
    s->out.len = 0;
    AT_TRY(tok_buf_reserve(&s->out, 0));
    AT_TRY(stream_drain(s, 1));
    *text = s->out.p;
    *len = s->out.len;
    return AT_OK;
}

/* ---- loading --------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

at_status at_tokenizer_find_llama2c(const char *dir, char **path)
{
    *path = NULL;
    char *p = at_path_join(dir, "tokenizer.bin");
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    if (at_file_exists(p)) {
        *path = p;
        return AT_OK;
    }
    free(p);
    p = NULL;
    int found = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "tok", 3) != 0 || !ends_with(e->d_name, ".bin")) continue;
        found++;
        free(p);
        p = at_path_join(dir, e->d_name);
    }
    if (d) closedir(d);
    if (found == 1 && p) {
        *path = p;
        return AT_OK;
    }
    free(p);
    return at_error(AT_ERR_NOT_FOUND, "no tokenizer.bin (or a single tok*.bin) in %s", dir);
}

static at_status load_json_file(const char *path, const char *dir, at_tokenizer **out)
{
    char *text = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(path, &text, &len));
    at_status st = tok_load_json_text(text, len, path, out);
    free(text);
    if (st == AT_OK && dir) {
        st = tok_read_config(*out, dir, 0);
        if (st != AT_OK) {
            at_tokenizer_free(*out);
            *out = NULL;
        }
    }
    return st;
}

at_status at_tokenizer_load(const char *path, const at_tokenizer_opts *opts, at_tokenizer **out)
{
    *out = NULL;
    if (!path) return at_error(AT_ERR_INVALID, "tokenizer: no path given");
    if (at_is_dir(path)) {
        char *p = at_path_join(path, "tokenizer.json");
        if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        if (at_file_exists(p)) {
            at_status st = load_json_file(p, path, out);
            free(p);
            return st;
        }
        free(p);
        char *v1 = at_path_join(path, "vocab.json"), *v2 = at_path_join(path, "encoder.json");
        char *v3 = at_path_join(path, "tokenizer.bin");
        int has1 = v1 && at_file_exists(v1), has2 = v2 && at_file_exists(v2), has3 = v3 && at_file_exists(v3);
        at_status st;
        if (has1 || has2)
            st = tok_load_vocab_merges(path, opts, out);
        else if (has3)
            st = tok_load_llama2c(v3, out);
        else
            st = at_error(AT_ERR_NOT_FOUND,
                          "%s: no tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.bin",
                          path);
        free(v1);
        free(v2);
        free(v3);
        return st;
    }
    if (!at_file_exists(path)) return at_error(AT_ERR_NOT_FOUND, "%s: no such file", path);
    if (ends_with(path, ".bin")) return tok_load_llama2c(path, out);
    return load_json_file(path, NULL, out);
}

at_status at_tokenizer_from_json(const char *json, size_t len, const char *what, at_tokenizer **out)
{
    return tok_load_json_text(json, len, what ? what : "tokenizer.json", out);
}

at_status at_tokenizer_check_vocab(const at_tokenizer *t, int64_t model_vocab, const char *model)
{
    size_t n = at_tokenizer_vocab_size(t), m = (size_t)model_vocab;
    int l2c = !strcmp(at_tokenizer_pre_name(t), "llama2c");
    if (n > m || (l2c && n != m))
        return at_error(AT_ERR_FORMAT, "the tokenizer has %zu ids but the model %s has a vocabulary of %zu%s: they do "
                        "not belong together (give the model's own tokenizer with --tokenizer)", n, model, m,
                        l2c && n < m ? " (a llama2.c tokenizer.bin holds exactly the model's vocabulary: this one is "
                                       "cut short)" : "");
    return AT_OK;
}
