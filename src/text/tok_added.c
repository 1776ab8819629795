/* Added tokens (special or not), split out of the text before the model
 * runs, as HF's AddedVocabulary: leftmost-longest matching; a token with
 * single_word matches only between non-word characters; lstrip / rstrip take
 * the whitespace beside the match into it. Tokens with normalized = false
 * are matched in the raw text, the others (their content normalized too) in
 * the normalized text. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

at_status tok_add_token(at_tokenizer *t, const char *content, size_t len, int32_t id, int special, int lstrip,
                        int rstrip, int single_word, int normalized)
{
    if (id < 0) return at_error(AT_ERR_FORMAT, "tokenizer: added token \"%.*s\" has a negative id", (int)len, content);
    if (len == 0) return AT_OK; /* HF ignores empty added tokens */
    tok_added *a = NULL;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) a = &t->added[i];
    if (!a) {
        tok_added *v = realloc(t->added, (t->n_added + 1) * sizeof *v);
        if (!v) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        t->added = v;
        a = &t->added[t->n_added++];
        memset(a, 0, sizeof *a);
    } else {
        free(a->content);
        free(a->norm);
        a->norm = NULL;
    }
    a->content = tok_dup(content, len);
    if (!a->content) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    a->len = len;
    a->id = id;
    a->special = (uint8_t)!!special;
    a->lstrip = (uint8_t)!!lstrip;
    a->rstrip = (uint8_t)!!rstrip;
    a->single_word = (uint8_t)!!single_word;
    a->normalized = (uint8_t)!!normalized;
    return AT_OK;
}

const tok_added *tok_added_by_id(const at_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_added_of_id) return NULL;
    int32_t k = t->added_of_id[id];
    return k >= 0 ? &t->added[k] : NULL;
}

/* Longest first; equal lengths keep file order (the first pattern wins in
 * HF's trie). */
static size_t match_len(const tok_added *a)
{
    return a->normalized ? a->norm_len : a->len;
}

static void sort_by_len(const tok_added *base, int32_t *v, int32_t n)
{
    for (int32_t i = 1; i < n; i++) {
        int32_t x = v[i], j = i;
        while (j > 0 && match_len(&base[v[j - 1]]) < match_len(&base[x])) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static void matcher_free(tok_matcher *m)
{
    for (int i = 0; i < 256; i++) free(m->by_first[i]);
    memset(m, 0, sizeof *m);
}

static at_status matcher_build(at_tokenizer *t, tok_matcher *m, int normalized)
{
    matcher_free(m);
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->normalized != normalized) continue;
        const char *s = normalized ? a->norm : a->content;
        size_t n = normalized ? a->norm_len : a->len;
        if (n == 0) continue;
        uint8_t f = (uint8_t)s[0];
        int32_t *v = realloc(m->by_first[f], (size_t)(m->n_first[f] + 1) * sizeof *v);
        if (!v) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        v[m->n_first[f]++] = (int32_t)i;
        m->by_first[f] = v;
    }
    for (int f = 0; f < 256; f++)
        if (m->n_first[f] > 1) sort_by_len(t->added, m->by_first[f], m->n_first[f]);
    return AT_OK;
}

at_status tok_added_finish(at_tokenizer *t)
{
    tok_buf nb = {0};
    at_status st = AT_OK;
    int32_t max_id = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->id > max_id) max_id = a->id;
        free(a->norm);
        a->norm = NULL;
        a->norm_len = 0;
        if (a->normalized) {
            AT_CHECK(tok_normalize(t->norm, t->n_norm, a->content, a->len, &nb));
            a->norm = malloc(nb.len + 1);
            if (!a->norm) {
                st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
            memcpy(a->norm, nb.p ? nb.p : "", nb.len);
            a->norm[nb.len] = '\0';
            a->norm_len = nb.len;
        }
    }
    free(t->added_of_id);
    t->added_of_id = NULL;
    t->n_added_of_id = max_id + 1;
    if (max_id >= 0) {
        t->added_of_id = malloc((size_t)(max_id + 1) * sizeof(int32_t));
        if (!t->added_of_id) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        for (int32_t i = 0; i <= max_id; i++) t->added_of_id[i] = -1;
        for (size_t i = 0; i < t->n_added; i++) t->added_of_id[t->added[i].id] = (int32_t)i;
    }
    AT_CHECK(matcher_build(t, &t->match_raw, 0));
    AT_CHECK(matcher_build(t, &t->match_norm, 1));
done:
    tok_buf_free(&nb);
    return st;
}

void tok_added_free_all(at_tokenizer *t);
void tok_added_free_all(at_tokenizer *t)
{
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    t->added = NULL;
    t->n_added = 0;
    free(t->added_of_id);
    t->added_of_id = NULL;
    matcher_free(&t->match_raw);
    matcher_free(&t->match_norm);
}

/* The whitespace run that ends at `end` starts where? */
static size_t space_run_start(const char *s, size_t begin, size_t end)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t a = end;
    while (a > begin) {
        size_t c = a - 1;
        while (c > begin && (p[c] & 0xC0) == 0x80) c--;
        uint32_t cp;
        if (tok_utf8_decode(p + c, a - c, &cp) == 0 || !tok_is_space(cp)) break;
        a = c;
    }
    return a;
}

static size_t space_run_end(const char *s, size_t begin, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t b = begin;
    while (b < n) {
        uint32_t cp;
        int k = tok_utf8_decode(p + b, n - b, &cp);
        if (k == 0 || !tok_is_space(cp)) break;
        b += (size_t)k;
    }
    return b;
}

static int word_before(const char *s, size_t at)
{
    if (at == 0) return 0;
    size_t c = at - 1;
    while (c > 0 && ((uint8_t)s[c] & 0xC0) == 0x80) c--;
    uint32_t cp;
    return tok_utf8_decode((const uint8_t *)s + c, at - c, &cp) > 0 && tok_is_word(cp);
}

static int word_after(const char *s, size_t at, size_t n)
{
    if (at >= n) return 0;
    uint32_t cp;
    return tok_utf8_decode((const uint8_t *)s + at, n - at, &cp) > 0 && tok_is_word(cp);
}

static at_status span_add(tok_span **v, size_t *n, size_t *cap, int32_t id, size_t off, size_t len)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        tok_span *p = realloc(*v, c * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        *v = p;
        *cap = c;
    }
    (*v)[*n].id = id;
    (*v)[*n].off = off;
    (*v)[*n].len = len;
    (*n)++;
    return AT_OK;
}

at_status tok_added_split(const at_tokenizer *t, const tok_matcher *m, int normalized, const char *s, size_t n,
                          int skip_special, tok_span **out, size_t *nout, size_t *cap)
{
    size_t start_offset = 0, i = 0;
    while (i < n) {
        uint8_t f = (uint8_t)s[i];
        const tok_added *hit = NULL;
        for (int32_t k = 0; k < m->n_first[f]; k++) {
            const tok_added *a = &t->added[m->by_first[f][k]];
            if (skip_special && a->special) continue;
            const char *pat = normalized ? a->norm : a->content;
            size_t pl = normalized ? a->norm_len : a->len;
            if (pl <= n - i && memcmp(s + i, pat, pl) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + (normalized ? hit->norm_len : hit->len);
        i = stop;
        if (hit->single_word && (word_before(s, start) || word_after(s, stop, n))) continue;
        if (hit->lstrip) {
            size_t ns = space_run_start(s, 0, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) stop = space_run_end(s, stop, n);
        if (start_offset < start) AT_TRY(span_add(out, nout, cap, -1, start_offset, start - start_offset));
        AT_TRY(span_add(out, nout, cap, hit->id, start, stop - start));
        start_offset = stop;
        i = stop;
    }
    if (start_offset < n) AT_TRY(span_add(out, nout, cap, -1, start_offset, n - start_offset));
    return AT_OK;
}
