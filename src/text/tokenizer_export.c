/* A tokenizer as GGUF arrays (tokenizer_export.h). Reads the tokenizer's
 * internals (tok_internal.h): the vocabulary, the merge table, the added
 * tokens and the pipeline. */
#include "text/tokenizer_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

static const char probe[] =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n"
    "\xF0\x9F\x9A\x80 (normal) \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F (multiple emojis) "
    "\xE2\x9C\x85 3 33 333 3333 33333 333333 3333333 3.3 3..3 3...3 "
    "\xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93\xE1\x9F\x8B ?\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8" "apple\xE5\xB7\xA5"
    "\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E ------======= "
    "\xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE \xD0\xBD\xD0\xB0 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll "
    "make it, 'D you like some tea? We'Ve a'lL caf" "e\xCC\x81 Caf\xC3\xA9  x\xC2\xA0y ab12cd_ef $100,000.50";

const char *at_tokenizer_probe_text(void)
{
    return probe;
}

/* ---- pre-tokenizer identification ------------------------------------- */

/* The pieces t's normalizer and pre-tokenizer make of text (no added tokens). */
static at_status split(const at_tokenizer *t, const char *s, size_t n, tok_pieces *out, tok_buf *norm,
                       tok_pieces *in, pcre2_match_data *md)
{
    const char *ns = s;
    size_t nn = n;
    if (t->n_norm) {
        AT_TRY(tok_normalize(t->norm, t->n_norm, s, n, norm));
        ns = norm->p ? norm->p : "";
        nn = norm->len;
    }
    tok_pieces_clear(in);
    tok_pieces_clear(out);
    if (!t->n_pre) return tok_pieces_add(out, ns, nn, 1);
    AT_TRY(tok_pieces_add(in, ns, nn, 1));
    return tok_pretokenize(t->pre, t->n_pre, in, out, md);
}

static int same_pieces(const tok_pieces *a, const tok_pieces *b)
{
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].len != b->v[i].len ||
            memcmp(a->text.p + a->v[i].off, b->text.p + b->v[i].off, a->v[i].len) != 0)
            return 0;
    return 1;
}

static const struct {
    const char *family; /* tok_use_family name */
    const char *gguf;   /* llama.cpp's tokenizer.ggml.pre */
} families[] = {
    {"llama3", "llama-bpe"}, {"qwen2", "qwen2"}, {"gpt2", "gpt-2"}, {"smollm", "smollm"}, {"falcon", "falcon"},
};

at_status at_tokenizer_detect_pre(const at_tokenizer *t, char *name, size_t len)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        if (!strcmp(t->pre_name, families[i].family)) {
            snprintf(name, len, "%s", families[i].gguf);
            return AT_OK;
        }
    }
    at_status st = AT_OK;
    tok_pieces want = {0}, got = {0}, in = {0};
    tok_buf norm = {0};
    at_tokenizer *cand = NULL;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    AT_CHECK(split(t, probe, sizeof probe - 1, &want, &norm, &in, md));
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        at_tokenizer_free(cand);
        cand = NULL;
        AT_CHECK(tok_new(&cand));
        AT_CHECK(tok_use_family(cand, families[i].family));
        if (cand->model.ignore_merges != t->model.ignore_merges) continue;
        AT_CHECK(split(cand, probe, sizeof probe - 1, &got, &norm, &in, md));
        if (same_pieces(&want, &got)) {
            snprintf(name, len, "%s", families[i].gguf);
            goto done;
        }
    }
    st = at_error(AT_ERR_UNSUPPORTED,
                  "tokenizer: its pre-tokenizer splits text like none of the GGUF families (gpt-2, llama-bpe, qwen2, "
                  "smollm, falcon); llama.cpp could not reproduce it");
done:
    at_tokenizer_free(cand);
    pcre2_match_data_free(md);
    tok_pieces_free(&want);
    tok_pieces_free(&got);
    tok_pieces_free(&in);
    tok_buf_free(&norm);
    return st;
}

/* ---- arrays -------------------------------------------------------------- */

void at_tokenizer_gguf_free(at_tokenizer_gguf *g)
{
    if (!g) return;
    for (size_t i = 0; g->tokens && i < g->n_tokens; i++) free(g->tokens[i]);
    for (size_t i = 0; g->merges && i < g->n_merges; i++) free(g->merges[i]);
    free(g->tokens);
    free(g->token_lens);
    free(g->scores);
    free(g->token_types);
    free(g->merges);
    free(g);
}

void at_tokenizer_gguf_arrays(const at_tokenizer_gguf *g, at_tokenizer_arrays *a)
{
    memset(a, 0, sizeof *a);
    a->model = g->model;
    a->pre = g->pre[0] ? g->pre : NULL;
    a->n_tokens = g->n_tokens;
    a->tokens = (const char *const *)g->tokens;
    a->token_lens = g->token_lens;
    a->scores = g->scores;
    a->token_types = g->token_types;
    a->n_merges = g->n_merges;
    a->merges = (const char *const *)g->merges;
    a->bos_id = g->bos_id;
    a->eos_id = g->eos_id;
    a->unk_id = g->unk_id;
    a->pad_id = g->pad_id;
    a->add_bos = g->add_bos;
    a->add_eos = g->add_eos;
    a->add_space_prefix = g->add_space_prefix;
}

static int has_dec(const at_tokenizer *t, tok_dec_kind k)
{
    for (size_t i = 0; i < t->n_dec; i++)
        if (t->dec[i].kind == k) return 1;
    return 0;
}

static int list_has(const int32_t *v, size_t n, int32_t id)
{
    for (size_t i = 0; id >= 0 && i < n; i++)
        if (v[i] == id) return 1;
    return 0;
}

/* Whether the SentencePiece-style pipeline puts "▁" before the text. */
static int spm_space_prefix(const at_tokenizer *t)
{
    for (size_t i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind == TOK_NORM_PREPEND) return 1;
    for (size_t i = 0; i < t->n_pre; i++)
        if (t->pre[i].kind == TOK_PRE_METASPACE) return t->pre[i].prepend != TOK_PREPEND_NEVER;
    return 0;
}

/* Copies s[0..n) replacing every ' ' by "▁" (llama2.c stores raw spaces). */
static char *dup_metaspace(const char *s, size_t n, size_t *out_len)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == ' ' ? 3 : 1;
    char *o = malloc(k + 1);
    if (!o) return NULL;
    for (size_t i = 0, j = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(o + j, "\xE2\x96\x81", 3);
            j += 3;
        } else {
            o[j++] = s[i];
        }
    }
    o[k] = '\0';
    *out_len = k;
    return o;
}

typedef struct {
    int32_t rank, left, right, id;
} merge_rec;

static int cmp_rank(const void *a, const void *b)
{
    const merge_rec *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

at_status at_tokenizer_to_gguf(const at_tokenizer *t, at_tokenizer_gguf **out)
{
    *out = NULL;
    if (!t) return at_error(AT_ERR_INVALID, "tokenizer: NULL");
    const tok_bpe *m = &t->model;
    const tok_vocab *v = &m->vocab;
    int llama2c = !strcmp(t->pre_name, "llama2c");
    int byte_level = has_dec(t, TOK_DEC_BYTELEVEL);
    int spm = !byte_level && (llama2c || m->byte_fallback || m->kind == TOK_MODEL_SCORES || has_dec(t, TOK_DEC_METASPACE) ||
                              has_dec(t, TOK_DEC_REPLACE));
    if (!byte_level && !spm)
        return at_error(AT_ERR_UNSUPPORTED, "tokenizer: neither byte-level BPE nor SentencePiece-style BPE "
                                            "(no ByteLevel decoder, byte fallback or \"\xE2\x96\x81\" spaces): not supported");
    if (m->cont_prefix || m->eow_suffix)
        return at_error(AT_ERR_UNSUPPORTED, "tokenizer: BPE with a subword prefix or suffix (continuing_subword_prefix "
                                            "/ end_of_word_suffix, WordPiece-like) is not supported");
    at_status st = AT_OK;
    merge_rec *recs = NULL;
    at_tokenizer_gguf *g = calloc(1, sizeof *g);
    if (!g) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    snprintf(g->model, sizeof g->model, "%s", byte_level ? "gpt2" : "llama");
    if (byte_level) AT_CHECK(at_tokenizer_detect_pre(t, g->pre, sizeof g->pre));

    size_t n = at_tokenizer_vocab_size(t);
    if (n == 0) {
        st = at_error(AT_ERR_INVALID, "tokenizer: empty vocabulary");
        goto done;
    }
    g->n_tokens = n;
    g->tokens = calloc(n, sizeof *g->tokens);
    g->token_lens = calloc(n, sizeof *g->token_lens);
    g->token_types = calloc(n, sizeof *g->token_types);
    if (!g->tokens || !g->token_lens || !g->token_types) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", n);
        goto done;
    }
    for (size_t id = 0; id < n; id++) {
        const tok_added *ad = tok_added_by_id(t, (int32_t)id);
        const char *s = NULL;
        size_t len = 0;
        int type = AT_TOKTYPE_NORMAL;
        if (ad) {
            s = ad->content;
            len = ad->len;
            type = ad->special ? AT_TOKTYPE_CONTROL : AT_TOKTYPE_USER_DEFINED;
        } else if ((int32_t)id < v->n && v->str[id]) {
            s = v->str[id];
            len = v->len[id];
        }
        if (llama2c && id < 3) {
            /* llama2.c stores "<unk>", "\n<s>\n", "\n</s>\n"; GGUF names them plainly. */
            static const char *const names[3] = {"<unk>", "<s>", "</s>"};
            s = names[id];
            len = strlen(s);
            type = id == 0 ? AT_TOKTYPE_UNKNOWN : AT_TOKTYPE_CONTROL;
        }
        if (!s) {
            char pad[32];
            int k = snprintf(pad, sizeof pad, "[PAD%zu]", id);
            g->tokens[id] = tok_dup(pad, (size_t)k);
            g->token_lens[id] = (size_t)k;
            type = AT_TOKTYPE_UNUSED;
        } else if (llama2c && id >= 3) {
            g->tokens[id] = dup_metaspace(s, len, &g->token_lens[id]);
        } else {
            g->tokens[id] = tok_dup(s, len);
            g->token_lens[id] = len;
        }
        if (!g->tokens[id]) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        if ((int32_t)id == m->unk_id && (!ad || ad->special)) type = AT_TOKTYPE_UNKNOWN; /* as llama.cpp types it */
        if (spm && type == AT_TOKTYPE_NORMAL)
            for (int b = 0; b < 256; b++)
                if (m->byte_ids[b] == (int32_t)id) type = AT_TOKTYPE_BYTE;
        g->token_types[id] = type;
    }

    /* The merge table in rank order. */
    size_t nm = 0;
    if (m->merges) {
        recs = malloc((m->n_merges ? m->n_merges : 1) * sizeof *recs);
        if (!recs) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        for (size_t i = 0; i <= (size_t)m->merges_mask; i++) {
            const tok_merge_slot *s = &m->merges[i];
            if (!s->key || nm == m->n_merges) continue;
            uint64_t key = s->key - 1;
            recs[nm++] = (merge_rec){s->rank, (int32_t)(key >> 32), (int32_t)(uint32_t)key, s->new_id};
        }
        qsort(recs, nm, sizeof *recs, cmp_rank);
    }
    if (byte_level) {
        g->merges = calloc(nm ? nm : 1, sizeof *g->merges);
        if (!g->merges) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        for (size_t i = 0; i < nm; i++) {
            int32_t a = recs[i].left, b = recs[i].right;
            size_t la = v->len[a], lb = v->len[b];
            char *s = malloc(la + lb + 2);
            if (!s) {
                st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
            memcpy(s, v->str[a], la);
            s[la] = ' ';
            memcpy(s + la + 1, v->str[b], lb);
            s[la + lb + 1] = '\0';
            g->merges[g->n_merges++] = s;
        }
    } else {
        g->scores = calloc(n, sizeof *g->scores);
        if (!g->scores) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        if (m->scores) {
            memcpy(g->scores, m->scores, (size_t)(v->n < (int32_t)n ? v->n : (int32_t)n) * sizeof(float));
        } else {
            /* A BPE given by merges: a token's score is minus the rank of the
             * first merge that makes it, so "best score first" is "lowest rank
             * first"; tokens no merge makes keep 0 (single characters, bytes)
             * or, for longer ones, a score below every merge. */
            for (size_t id = 0; id < n; id++) {
                const char *s = g->tokens[id];
                size_t len = g->token_lens[id];
                uint32_t cp;
                int one_char = len > 0 && (size_t)tok_utf8_decode((const uint8_t *)s, len, &cp) == len;
                g->scores[id] = one_char || g->token_types[id] == AT_TOKTYPE_BYTE ? 0.0f : -1e9f;
            }
            for (size_t i = nm; i-- > 0;) /* lowest rank written last: it wins */
                if (recs[i].id >= 0 && (size_t)recs[i].id < n) g->scores[recs[i].id] = -(float)recs[i].rank;
        }
        g->add_space_prefix = llama2c ? 1 : spm_space_prefix(t);
    }
    g->bos_id = t->bos_id;
    g->eos_id = t->eos_id;
    g->unk_id = m->unk_id >= 0 ? m->unk_id : t->unk_id;
    g->pad_id = t->pad_id;
    g->add_bos = list_has(t->post.pre, t->post.n_pre, t->bos_id);
    g->add_eos = list_has(t->post.post, t->post.n_post, t->eos_id);
    *out = g;
    g = NULL;
done:
    free(recs);
    at_tokenizer_gguf_free(g);
    return st;
}
