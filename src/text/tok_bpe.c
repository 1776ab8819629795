/* The BPE model: one pre-token in, token ids out.
 *
 * As Hugging Face's BPE::merge_word + Word::merge_all: the word is split into
 * characters (each looked up in the vocabulary; missing ones become <0xXX>
 * byte tokens with byte_fallback, else the unknown token, fused when
 * fuse_unk), then pairs are merged lowest rank first, leftmost first among
 * equal ranks, using a binary heap of candidate pairs. A popped candidate is
 * used only if both of its symbols are still the ones it was made from; each
 * merge pushes the two new pairs around the merged symbol. That is
 * O(n log n) per word instead of rescanning all pairs after every merge.
 *
 * TOK_MODEL_SCORES (llama2.c's run.c encode, llama.cpp's SentencePiece
 * tokenizer) is the same loop where the candidate pair is any two symbols
 * whose concatenation is a token, and its priority is that token's score
 * (higher first). Both pick the best pair and, among ties, the leftmost.
 *
 * A direct-mapped cache keyed by the pre-token's bytes holds recent results,
 * as HF's BPE cache does: natural text repeats words constantly. */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

at_status tok_bpe_init(tok_bpe *m, tok_model_kind kind, int32_t n_vocab)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->unk_id = -1;
    for (int i = 0; i < 256; i++) m->byte_ids[i] = -1;
    return tok_vocab_init(&m->vocab, n_vocab > 0 ? n_vocab : 1);
}

/* Merge keys are two ids: a multiplicative hash is enough and much cheaper
 * than hashing bytes (this lookup is the inner loop of BPE). */
static uint32_t key_hash(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(key >> 32) ^ (uint32_t)key;
}

static at_status merges_grow(tok_bpe *m)
{
    size_t cap = m->merges ? (size_t)m->merges_mask + 1 : 0;
    if (m->merges && (m->n_merges + 1) * 2 < cap) return AT_OK;
    size_t ncap = cap ? cap * 2 : 1024;
    tok_merge_slot *s = calloc(ncap, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for merges");
    uint32_t mask = (uint32_t)(ncap - 1);
    for (size_t i = 0; i < cap; i++) {
        if (!m->merges[i].key) continue;
        uint32_t h = key_hash(m->merges[i].key) & mask;
        while (s[h].key) h = (h + 1) & mask;
        s[h] = m->merges[i];
    }
    free(m->merges);
    m->merges = s;
    m->merges_mask = mask;
    return AT_OK;
}

static const tok_merge_slot *merge_find(const tok_bpe *m, int32_t a, int32_t b)
{
    if (!m->merges) return NULL;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t h = key_hash(key) & m->merges_mask;
    for (;;) {
        const tok_merge_slot *s = &m->merges[h];
        if (!s->key) return NULL;
        if (s->key == key) return s;
        h = (h + 1) & m->merges_mask;
    }
}

at_status tok_bpe_add_merge(tok_bpe *m, const char *a, size_t alen, const char *b, size_t blen,
                            int32_t rank, const char *what)
{
    int32_t ia = tok_vocab_find(&m->vocab, a, alen);
    int32_t ib = tok_vocab_find(&m->vocab, b, blen);
    if (ia < 0 || ib < 0)
        return at_error(AT_ERR_FORMAT, "%s: merge %d \"%.*s %.*s\": \"%.*s\" is not in the vocabulary", what,
                        (int)rank, (int)alen, a, (int)blen, b, ia < 0 ? (int)alen : (int)blen, ia < 0 ? a : b);
    /* The merged token is a + b, less b's continuing-subword prefix. */
    size_t skip = 0;
    if (m->cont_prefix) {
        size_t pl = strlen(m->cont_prefix);
        if (blen >= pl && memcmp(b, m->cont_prefix, pl) == 0) skip = pl;
    }
    char stackbuf[256];
    size_t nl = alen + blen - skip;
    char *cat = nl <= sizeof stackbuf ? stackbuf : malloc(nl);
    if (!cat) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(cat, a, alen);
    memcpy(cat + alen, b + skip, blen - skip);
    int32_t in = tok_vocab_find(&m->vocab, cat, nl);
    if (cat != stackbuf) free(cat);
    if (in < 0)
        return at_error(AT_ERR_FORMAT, "%s: merge %d \"%.*s %.*s\": the merged token is not in the vocabulary",
                        what, (int)rank, (int)alen, a, (int)blen, b);
    AT_TRY(merges_grow(m));
    uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
    uint32_t h = key_hash(key) & m->merges_mask;
    while (m->merges[h].key && m->merges[h].key != key) h = (h + 1) & m->merges_mask;
    if (m->merges[h].key) return AT_OK; /* a repeated merge keeps its first rank, as HF's map does not: harmless */
    m->merges[h].key = key;
    m->merges[h].rank = rank;
    m->merges[h].new_id = in;
    m->n_merges++;
    return AT_OK;
}

at_status tok_bpe_finish(tok_bpe *m)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (m->byte_ids[b] < 0) m->byte_ids[b] = tok_vocab_find(&m->vocab, name, 6);
    }
    /* Characters below U+0800 (the byte-level alphabet, Latin, Greek,
     * Cyrillic...) looked up once here instead of hashed per occurrence. */
    for (uint32_t cp = 0; cp < TOK_CHAR_TABLE; cp++) {
        char u[4];
        int k = tok_utf8_encode(cp, u);
        m->char_id[cp] = tok_vocab_find(&m->vocab, u, (size_t)k);
    }
    if (!m->cache) {
        m->cache = calloc(TOK_CACHE_SIZE, sizeof *m->cache);
        if (!m->cache) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for the cache");
        m->cache_lock_ok = pthread_mutex_init(&m->cache_lock, NULL) == 0;
    }
    return AT_OK;
}

void tok_bpe_free(tok_bpe *m)
{
    tok_vocab_free(&m->vocab);
    free(m->merges);
    free(m->scores);
    free(m->cont_prefix);
    free(m->eow_suffix);
    if (m->cache) {
        if (m->cache_lock_ok) pthread_mutex_destroy(&m->cache_lock);
        free(m->cache);
    }
    memset(m, 0, sizeof *m);
}

/* ---- one word ------------------------------------------------------------ */

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* 0: merged away */
} sym;

typedef struct {
    double prio; /* lower first: the rank, or minus the score */
    int32_t pos;
    int32_t left, right, new_id;
} cand;

static int cand_less(const cand *a, const cand *b)
{
    if (a->prio != b->prio) return a->prio < b->prio;
    return a->pos < b->pos;
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    h[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&h[i], &h[p])) break;
        cand t = h[i]; h[i] = h[p]; h[p] = t;
        i = p;
    }
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && cand_less(&h[l], &h[m])) m = l;
        if (r < *n && cand_less(&h[r], &h[m])) m = r;
        if (m == i) break;
        cand t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
    return top;
}

/* The candidate for merging symbols a and b, if any. */
static int pair_lookup(const tok_bpe *m, int32_t a, int32_t b, double *prio, int32_t *new_id)
{
    if (m->kind == TOK_MODEL_BPE) {
        const tok_merge_slot *s = merge_find(m, a, b);
        if (!s) return 0;
        *prio = s->rank;
        *new_id = s->new_id;
        return 1;
    }
    const tok_vocab *v = &m->vocab;
    size_t la = v->len[a], lb = v->len[b];
    char stackbuf[256];
    char *cat = la + lb <= sizeof stackbuf ? stackbuf : malloc(la + lb);
    if (!cat) return 0;
    memcpy(cat, v->str[a], la);
    memcpy(cat + la, v->str[b], lb);
    int32_t id = tok_vocab_find(v, cat, la + lb);
    if (cat != stackbuf) free(cat);
    if (id < 0) return 0;
    *prio = -(double)m->scores[id];
    *new_id = id;
    return 1;
}

static at_status push_id(int32_t **out, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*out, c * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for ids");
        *out = p;
        *cap = c;
    }
    (*out)[(*n)++] = id;
    return AT_OK;
}

static at_status word_add(sym **syms, size_t *n, size_t *cap, int32_t id, uint32_t len)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        sym *p = realloc(*syms, c * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        *syms = p;
        *cap = c;
    }
    sym *s = &(*syms)[*n];
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = (int32_t)*n + 1;
    (*n)++;
    return AT_OK;
}

static at_status merge_word(const tok_bpe *m, const char *w, size_t n, int32_t **out, size_t *nout,
                            size_t *cap)
{
    at_status st = AT_OK;
    sym *syms = NULL;
    size_t ns = 0, scap = 0;
    cand *heap = NULL;
    size_t nh = 0;
    char *tmp = NULL;
    size_t plen = m->cont_prefix ? strlen(m->cont_prefix) : 0;
    size_t slen = m->eow_suffix ? strlen(m->eow_suffix) : 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    if (plen || slen) {
        tmp = malloc(plen + slen + 8);
        if (!tmp) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }

    /* 1. Characters to symbols. */
    for (size_t i = 0; i < n;) {
        size_t cl = (size_t)tok_utf8_len((uint8_t)w[i]);
        if (i + cl > n) cl = n - i;
        const char *s = w + i;
        size_t sl = cl;
        if ((i > 0 && plen) || (i + cl == n && slen)) {
            size_t k = 0;
            if (i > 0 && plen) { memcpy(tmp, m->cont_prefix, plen); k = plen; }
            memcpy(tmp + k, w + i, cl);
            k += cl;
            if (i + cl == n && slen) { memcpy(tmp + k, m->eow_suffix, slen); k += slen; }
            s = tmp;
            sl = k;
        }
        int32_t id;
        if (s == w + i && cl <= 2) {
            uint32_t cp = cl == 1 ? (uint8_t)s[0] : (((uint32_t)(uint8_t)s[0] & 0x1F) << 6) | ((uint8_t)s[1] & 0x3F);
            id = (cl == 1 || ((uint8_t)s[0] >= 0xC2 && ((uint8_t)s[1] & 0xC0) == 0x80)) && cp < TOK_CHAR_TABLE
                     ? m->char_id[cp]
                     : tok_vocab_find(&m->vocab, s, sl);
        } else {
            id = tok_vocab_find(&m->vocab, s, sl);
        }
        if (id >= 0) {
            if (unk >= 0) {
                AT_CHECK(word_add(&syms, &ns, &scap, unk, unk_len));
                unk = -1;
            }
            AT_CHECK(word_add(&syms, &ns, &scap, id, (uint32_t)cl));
        } else {
            int fell_back = 0;
            if (m->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < sl; k++)
                    if (m->byte_ids[(uint8_t)s[k]] < 0) all = 0;
                if (all) {
                    for (size_t k = 0; k < sl; k++)
                        AT_CHECK(word_add(&syms, &ns, &scap, m->byte_ids[(uint8_t)s[k]], 1));
                    fell_back = 1;
                }
            }
            if (!fell_back && m->unk_id >= 0) {
                if (unk >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (unk >= 0) AT_CHECK(word_add(&syms, &ns, &scap, unk, unk_len));
                    unk = m->unk_id;
                    unk_len = (uint32_t)cl;
                }
            }
            /* Without an unknown token the character is dropped, as in HF. */
        }
        i += cl;
    }
    if (unk >= 0) AT_CHECK(word_add(&syms, &ns, &scap, unk, unk_len));
    if (ns == 0) goto done;
    syms[ns - 1].next = -1;

    /* 2. Merge. */
    heap = malloc((ns * 2 + 2) * sizeof *heap);
    if (!heap) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    size_t hcap = ns * 2 + 2;
    for (size_t i = 0; i + 1 < ns; i++) {
        cand c;
        if (pair_lookup(m, syms[i].id, syms[i + 1].id, &c.prio, &c.new_id)) {
            c.pos = (int32_t)i;
            c.left = syms[i].id;
            c.right = syms[i + 1].id;
            heap_push(heap, &nh, c);
        }
    }
    while (nh > 0) {
        cand top = heap_pop(heap, &nh);
        sym *cur = &syms[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym *right = &syms[cur->next];
        if (cur->id != top.left || right->id != top.right) continue; /* stale */
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0) syms[cur->next].prev = top.pos;
        /* Each merge adds at most two candidates: grow to keep room. */
        if (nh + 2 > hcap) {
            size_t c2 = hcap * 2;
            cand *h2 = realloc(heap, c2 * sizeof *h2);
            if (!h2) {
                st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
            heap = h2;
            hcap = c2;
        }
        cand c;
        if (cur->prev >= 0 && pair_lookup(m, syms[cur->prev].id, cur->id, &c.prio, &c.new_id)) {
            c.pos = cur->prev;
            c.left = syms[cur->prev].id;
            c.right = cur->id;
            heap_push(heap, &nh, c);
        }
        if (cur->next >= 0 && pair_lookup(m, cur->id, syms[cur->next].id, &c.prio, &c.new_id)) {
            c.pos = top.pos;
            c.left = cur->id;
            c.right = syms[cur->next].id;
            heap_push(heap, &nh, c);
        }
    }
    for (int32_t i = 0; i >= 0 && (size_t)i < ns; i = syms[i].next) AT_CHECK(push_id(out, nout, cap, syms[i].id));

done:
    free(syms);
    free(heap);
    free(tmp);
    return st;
}

at_status tok_bpe_encode(tok_bpe *m, const char *w, size_t n, int use_cache, int32_t **out, size_t *nout,
                         size_t *cap)
{
    if (n == 0) return AT_OK;
    if (m->ignore_merges) {
        int32_t id = tok_vocab_find(&m->vocab, w, n);
        if (id >= 0) return push_id(out, nout, cap, id);
    }
    tok_cache_entry *e = NULL;
    uint64_t h = 0;
    if (use_cache && m->cache && n <= TOK_CACHE_KEY) {
        h = tok_hash(w, n);
        e = &m->cache[h & (TOK_CACHE_SIZE - 1)];
        if (e->klen == n && e->hash == h && memcmp(e->key, w, n) == 0) {
            for (int i = 0; i < e->nids; i++) AT_TRY(push_id(out, nout, cap, e->ids[i]));
            return AT_OK;
        }
    }
    size_t before = *nout;
    AT_TRY(merge_word(m, w, n, out, nout, cap));
    size_t got = *nout - before;
    if (e && got <= TOK_CACHE_IDS) {
        e->hash = h;
        e->klen = (uint8_t)n;
        e->nids = (uint8_t)got;
        memcpy(e->key, w, n);
        if (got) memcpy(e->ids, *out + before, got * sizeof(int32_t));
    }
    return AT_OK;
}
