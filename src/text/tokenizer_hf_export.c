/* A tokenizer as Hugging Face files (tokenizer_hf_export.h). The token
 * strings, types, scores and special ids come from the GGUF view of the
 * tokenizer (tokenizer_export.h: it already names llama2.c's tokens as
 * SentencePiece does and identifies the byte-level family), the merge table
 * and the flags of the added tokens from the tokenizer itself. */
#include "text/tokenizer_hf_export.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "text/tok_internal.h"
#include "text/tokenizer_export.h"

#define SPACE_MARK "\xE2\x96\x81" /* "▁", SentencePiece's space */

typedef struct {
    const at_tokenizer *t;
    at_tokenizer_gguf *g;
    int spm;       /* SentencePiece-style; else byte-level */
    char *hole;    /* [n_tokens]: 1 when the id has no token */
    tok_vocab idx; /* token string -> lowest id */
    int oom;       /* a cJSON allocation failed */
} ctx;

/* ---- small JSON helpers: failures are noted in c->oom ------------------- */

static cJSON *put(ctx *c, cJSON *parent, const char *key, cJSON *item)
{
    if (!item || !parent) {
        cJSON_Delete(item);
        c->oom = 1;
        return NULL;
    }
    cJSON_bool ok = key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item);
    if (!ok) {
        cJSON_Delete(item);
        c->oom = 1;
        return NULL;
    }
    return item;
}

static cJSON *put_str(ctx *c, cJSON *parent, const char *key, const char *s)
{
    return put(c, parent, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

static cJSON *put_num(ctx *c, cJSON *parent, const char *key, double v)
{
    return put(c, parent, key, cJSON_CreateNumber(v));
}

static cJSON *put_bool(ctx *c, cJSON *parent, const char *key, int v)
{
    return put(c, parent, key, cJSON_CreateBool(v != 0));
}

static cJSON *put_obj(ctx *c, cJSON *parent, const char *key, const char *type)
{
    cJSON *o = put(c, parent, key, cJSON_CreateObject());
    if (o && type) put_str(c, o, "type", type);
    return o;
}

/* ---- tokens ------------------------------------------------------------- */

/* Whether s[0..n) can be a JSON string: valid UTF-8 without NUL. */
static int json_safe(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0 || cp == 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* The token string of id (as the vocabulary is written), or NULL for none. */
static const char *tok_str(const ctx *c, int32_t id)
{
    if (id < 0 || (size_t)id >= c->g->n_tokens || c->hole[id]) return NULL;
    return c->g->tokens[id];
}

static at_status ctx_init(ctx *c, const at_tokenizer *t)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    at_status st = at_tokenizer_to_gguf(t, &c->g);
    if (st != AT_OK) return at_error_wrap(st, "tokenizer: cannot be written as Hugging Face files");
    const at_tokenizer_gguf *g = c->g;
    c->spm = strcmp(g->model, "llama") == 0;
    if (g->n_tokens > (size_t)INT32_MAX) /* ids are int32 throughout */
        return at_error(AT_ERR_UNSUPPORTED, "tokenizer: %zu tokens: more than ids can number", g->n_tokens);
    c->hole = calloc(g->n_tokens ? g->n_tokens : 1, 1); /* calloc(0) may be NULL */
    if (!c->hole) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    AT_TRY(tok_vocab_init(&c->idx, (int32_t)g->n_tokens));
    const tok_vocab *v = &t->model.vocab;
    for (size_t id = 0; id < g->n_tokens; id++) {
        /* An id the tokenizer has no string for (GGUF fills it with an
         * unused "[PAD<id>]") stays out of tokenizer.json, as in a trimmed
         * Hugging Face vocabulary. */
        int has = tok_added_by_id(t, (int32_t)id) || ((int32_t)id < v->n && v->str[id]);
        if (!has) {
            c->hole[id] = 1;
            continue;
        }
        if (!json_safe(g->tokens[id], g->token_lens[id]))
            return at_error(AT_ERR_UNSUPPORTED,
                            "tokenizer: token %zu is not valid UTF-8 (or holds a NUL byte): tokenizer.json cannot "
                            "hold it",
                            id);
        AT_TRY(tok_vocab_set(&c->idx, (int32_t)id, g->tokens[id], g->token_lens[id]));
    }
    return tok_vocab_index(&c->idx);
}

static void ctx_free(ctx *c)
{
    at_tokenizer_gguf_free(c->g);
    free(c->hole);
    tok_vocab_free(&c->idx);
}

/* The added token at id: the tokenizer's own, or for a SentencePiece-style
 * vocabulary its unknown token (GGUF types it UNKNOWN, not CONTROL, but
 * Hugging Face's Llama files list "<unk>" as a special added token, and
 * transformers adds it from unk_token anyway). NULL when id is none. */
static const tok_added *added_at(const ctx *c, int32_t id, tok_added *tmp)
{
    const tok_added *a = tok_added_by_id(c->t, id);
    if (a || !c->spm || id != c->g->unk_id || !tok_str(c, id)) return a;
    memset(tmp, 0, sizeof *tmp);
    tmp->id = id;
    tmp->special = 1;
    return tmp;
}

/* ---- merges ------------------------------------------------------------- */

typedef struct {
    int32_t l, r;   /* ids of the two halves */
    int32_t id;     /* the token they make (derived merges) */
    float score;    /* its score (derived merges) */
    int32_t rank;   /* table merges */
} merge_rec;

static int cmp_rank(const void *a, const void *b)
{
    const merge_rec *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* transformers' order for merges derived from scores: the score of the token
 * made, highest first; then the token's id; then the halves' ids. */
static int cmp_derived(const void *a, const void *b)
{
    const merge_rec *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

/* The merge table of a BPE tokenizer, in rank order. *out: malloc'd. */
static at_status table_merges(const ctx *c, merge_rec **out, size_t *n)
{
    const tok_bpe *m = &c->t->model;
    *out = NULL;
    *n = 0;
    merge_rec *recs = malloc((m->n_merges ? m->n_merges : 1) * sizeof *recs);
    if (!recs) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for %zu merges", m->n_merges);
    size_t k = 0;
    for (size_t i = 0; m->merges && i <= (size_t)m->merges_mask && k < m->n_merges; i++) {
        const tok_merge_slot *s = &m->merges[i];
        if (!s->key) continue;
        uint64_t key = s->key - 1;
        recs[k++] = (merge_rec){.l = (int32_t)(key >> 32), .r = (int32_t)(uint32_t)key, .rank = s->rank};
    }
    qsort(recs, k, sizeof *recs, cmp_rank);
    *out = recs;
    *n = k;
    return AT_OK;
}

/* Merges of a SentencePiece BPE given by scores, as transformers derives them
 * (SentencePieceExtractor / GGUFTokenizerSkeleton): every way of cutting a
 * token (at a character boundary) into two tokens is a merge, ranked by the
 * score of the token it makes, so that "lowest rank first" merges the best-
 * scored pair as SentencePiece does. */
static at_status derived_merges(const ctx *c, merge_rec **out, size_t *n)
{
    const at_tokenizer_gguf *g = c->g;
    size_t cap = 1024, k = 0;
    merge_rec *recs = malloc(cap * sizeof *recs);
    if (!recs) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t id = 0; id < g->n_tokens; id++) {
        const char *s = tok_str(c, (int32_t)id);
        size_t len = g->token_lens[id];
        /* A repeated string is one entry of the vocabulary: its first id. */
        if (!s || tok_vocab_find(&c->idx, s, len) != (int32_t)id) continue;
        for (size_t cut = (size_t)tok_utf8_len((uint8_t)s[0]); cut < len; cut += (size_t)tok_utf8_len((uint8_t)s[cut])) {
            int32_t l = tok_vocab_find(&c->idx, s, cut), r = tok_vocab_find(&c->idx, s + cut, len - cut);
            if (l < 0 || r < 0) continue;
            if (k == cap) {
                merge_rec *nr = realloc(recs, 2 * cap * sizeof *recs);
                if (!nr) {
                    free(recs);
                    return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for %zu merges", 2 * cap);
                }
                recs = nr;
                cap *= 2;
            }
            recs[k++] = (merge_rec){.l = l, .r = r, .id = (int32_t)id, .score = g->scores ? g->scores[id] : 0.0f};
        }
    }
    qsort(recs, k, sizeof *recs, cmp_derived);
    *out = recs;
    *n = k;
    return AT_OK;
}

/* ---- tokenizer.json ---------------------------------------------------- */

static void added_token_fields(ctx *c, cJSON *o, const tok_added *a)
{
    put_bool(c, o, "single_word", a->single_word);
    put_bool(c, o, "lstrip", a->lstrip);
    put_bool(c, o, "rstrip", a->rstrip);
    put_bool(c, o, "normalized", a->normalized);
    put_bool(c, o, "special", a->special);
}

/* A ByteLevel step under parent[key] (key NULL: appended to the array). */
static void byte_level(ctx *c, cJSON *parent, const char *key, int add_prefix_space, int trim_offsets, int use_regex)
{
    cJSON *o = put_obj(c, parent, key, "ByteLevel");
    put_bool(c, o, "add_prefix_space", add_prefix_space);
    put_bool(c, o, "trim_offsets", trim_offsets);
    put_bool(c, o, "use_regex", use_regex);
}

static void split_regex(ctx *c, cJSON *parent, const char *re)
{
    cJSON *o = put_obj(c, parent, NULL, "Split");
    cJSON *p = put_obj(c, o, "pattern", NULL);
    put_str(c, p, "Regex", re);
    put_str(c, o, "behavior", "Isolated");
    put_bool(c, o, "invert", 0);
}

static void digits(ctx *c, cJSON *parent, int individual)
{
    cJSON *o = put_obj(c, parent, NULL, "Digits");
    put_bool(c, o, "individual_digits", individual);
}

/* normalizer and pre_tokenizer of a byte-level family, as the model's own
 * tokenizer.json has them (tok_use_family builds the same pipelines). */
static at_status byte_level_pipeline(ctx *c, cJSON *root)
{
    const char *pre = c->g->pre;
    if (!strcmp(pre, "qwen2")) put_obj(c, root, "normalizer", "NFC");
    else put(c, root, "normalizer", cJSON_CreateNull());
    if (!strcmp(pre, "gpt-2")) {
        byte_level(c, root, "pre_tokenizer", 0, 1, 1);
        return AT_OK;
    }
    cJSON *seq = put_obj(c, root, "pre_tokenizer", "Sequence");
    cJSON *list = put(c, seq, "pretokenizers", cJSON_CreateArray());
    if (!strcmp(pre, "llama-bpe")) {
        split_regex(c, list, tok_re_llama3);
        byte_level(c, list, NULL, 0, 1, 0);
    } else if (!strcmp(pre, "qwen2")) {
        split_regex(c, list, tok_re_qwen2);
        byte_level(c, list, NULL, 0, 0, 0);
    } else if (!strcmp(pre, "smollm")) {
        digits(c, list, 1);
        byte_level(c, list, NULL, 0, 1, 1);
    } else if (!strcmp(pre, "falcon")) {
        cJSON *p = put_obj(c, list, NULL, "Punctuation");
        put_str(c, p, "behavior", "Contiguous");
        byte_level(c, list, NULL, 0, 1, 1);
        digits(c, list, 0);
        split_regex(c, list, "[0-9][0-9][0-9]");
    } else {
        return at_error(AT_ERR_UNSUPPORTED, "tokenizer: byte-level pre-tokenizer \"%s\" has no Hugging Face form here",
                        pre);
    }
    return AT_OK;
}

/* SentencePiece-style: the legacy Llama form (Prepend + Replace normalizer),
 * or Metaspace when the tokenizer uses it. */
static void spm_pipeline(ctx *c, cJSON *root)
{
    const tok_pre *ms = NULL;
    for (size_t i = 0; i < c->t->n_pre; i++)
        if (c->t->pre[i].kind == TOK_PRE_METASPACE) ms = &c->t->pre[i];
    if (ms) {
        put(c, root, "normalizer", cJSON_CreateNull());
        cJSON *p = put_obj(c, root, "pre_tokenizer", "Metaspace");
        put_str(c, p, "replacement", SPACE_MARK);
        put_str(c, p, "prepend_scheme", ms->prepend == TOK_PREPEND_ALWAYS  ? "always"
                                        : ms->prepend == TOK_PREPEND_FIRST ? "first"
                                                                           : "never");
        put_bool(c, p, "split", ms->split);
        return;
    }
    cJSON *seq = put_obj(c, root, "normalizer", "Sequence");
    cJSON *list = put(c, seq, "normalizers", cJSON_CreateArray());
    if (c->g->add_space_prefix) {
        cJSON *p = put_obj(c, list, NULL, "Prepend");
        put_str(c, p, "prepend", SPACE_MARK);
    }
    cJSON *r = put_obj(c, list, NULL, "Replace");
    cJSON *pat = put_obj(c, r, "pattern", NULL);
    put_str(c, pat, "String", " ");
    put_str(c, r, "content", SPACE_MARK);
    put(c, root, "pre_tokenizer", cJSON_CreateNull());
}

/* One special token of a TemplateProcessing: in the item list and in
 * special_tokens. */
static void template_special(ctx *c, cJSON *items, cJSON *specials, int32_t id, int type_id)
{
    const char *name = tok_str(c, id);
    cJSON *it = put(c, items, NULL, cJSON_CreateObject());
    cJSON *sp = put_obj(c, it, "SpecialToken", NULL);
    put_str(c, sp, "id", name);
    put_num(c, sp, "type_id", type_id);
    if (specials && name && !cJSON_GetObjectItemCaseSensitive(specials, name)) {
        cJSON *d = put_obj(c, specials, name, NULL);
        put_str(c, d, "id", name);
        cJSON *ids = put(c, d, "ids", cJSON_CreateArray());
        put_num(c, ids, NULL, id);
        cJSON *toks = put(c, d, "tokens", cJSON_CreateArray());
        put_str(c, toks, NULL, name);
    }
}

static void template_seq(ctx *c, cJSON *items, const char *which, int type_id)
{
    cJSON *it = put(c, items, NULL, cJSON_CreateObject());
    cJSON *s = put_obj(c, it, "Sequence", NULL);
    put_str(c, s, "id", which);
    put_num(c, s, "type_id", type_id);
}

/* TemplateProcessing as LlamaTokenizerFast.update_post_processor builds it:
 *   single: [BOS] $A [EOS];  pair: [BOS] $A [EOS] [BOS] $B:1 [EOS]:1 */
static cJSON *template_processing(ctx *c, int32_t bos, int32_t eos)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        c->oom = 1;
        return NULL;
    }
    put_str(c, o, "type", "TemplateProcessing");
    cJSON *single = put(c, o, "single", cJSON_CreateArray());
    cJSON *pair = put(c, o, "pair", cJSON_CreateArray());
    cJSON *specials = cJSON_CreateObject();
    if (bos >= 0) template_special(c, single, specials, bos, 0);
    template_seq(c, single, "A", 0);
    if (eos >= 0) template_special(c, single, specials, eos, 0);
    if (bos >= 0) template_special(c, pair, NULL, bos, 0);
    template_seq(c, pair, "A", 0);
    if (eos >= 0) template_special(c, pair, NULL, eos, 0);
    if (bos >= 0) template_special(c, pair, NULL, bos, 1);
    template_seq(c, pair, "B", 1);
    if (eos >= 0) template_special(c, pair, NULL, eos, 1);
    put(c, o, "special_tokens", specials);
    return o;
}

static void post_processor(ctx *c, cJSON *root)
{
    const at_tokenizer_gguf *g = c->g;
    int32_t bos = g->add_bos && tok_str(c, g->bos_id) ? g->bos_id : -1;
    int32_t eos = g->add_eos && tok_str(c, g->eos_id) ? g->eos_id : -1;
    if (c->spm) {
        put(c, root, "post_processor", template_processing(c, bos, eos));
        return;
    }
    if (bos < 0 && eos < 0) {
        byte_level(c, root, "post_processor", 1, 0, 1);
        return;
    }
    /* Llama 3's form: ByteLevel (offsets only), then the template. */
    cJSON *seq = put_obj(c, root, "post_processor", "Sequence");
    cJSON *list = put(c, seq, "processors", cJSON_CreateArray());
    byte_level(c, list, NULL, 1, 0, 1);
    put(c, list, NULL, template_processing(c, bos, eos));
}

static void decoder(ctx *c, cJSON *root)
{
    if (!c->spm) {
        byte_level(c, root, "decoder", 1, 1, 1);
        return;
    }
    cJSON *seq = put_obj(c, root, "decoder", "Sequence");
    cJSON *list = put(c, seq, "decoders", cJSON_CreateArray());
    cJSON *r = put_obj(c, list, NULL, "Replace");
    cJSON *pat = put_obj(c, r, "pattern", NULL);
    put_str(c, pat, "String", SPACE_MARK);
    put_str(c, r, "content", " ");
    put_obj(c, list, NULL, "ByteFallback");
    put_obj(c, list, NULL, "Fuse");
    if (c->g->add_space_prefix) {
        cJSON *s = put_obj(c, list, NULL, "Strip");
        put_str(c, s, "content", " ");
        put_num(c, s, "start", 1);
        put_num(c, s, "stop", 0);
    }
}

static at_status model(ctx *c, cJSON *root)
{
    const at_tokenizer_gguf *g = c->g;
    cJSON *m = put_obj(c, root, "model", "BPE");
    put(c, m, "dropout", cJSON_CreateNull());
    put_str(c, m, "unk_token", c->spm ? tok_str(c, g->unk_id) : NULL);
    put(c, m, "continuing_subword_prefix", cJSON_CreateNull());
    put(c, m, "end_of_word_suffix", cJSON_CreateNull());
    put_bool(c, m, "fuse_unk", c->spm);
    put_bool(c, m, "byte_fallback", c->spm);
    put_bool(c, m, "ignore_merges", c->t->model.ignore_merges);
    cJSON *vocab = put(c, m, "vocab", cJSON_CreateObject());
    size_t dups = 0;
    for (size_t id = 0; id < g->n_tokens && !c->oom; id++) {
        const char *s = tok_str(c, (int32_t)id);
        if (!s) continue;
        if (tok_vocab_find(&c->idx, s, g->token_lens[id]) != (int32_t)id) {
            dups++; /* a JSON object holds a key once: the first id keeps it */
            continue;
        }
        put_num(c, vocab, s, (double)id);
    }
    if (dups) at_log_warn("tokenizer: %zu tokens repeat an earlier token's text; tokenizer.json keeps the first", dups);

    merge_rec *recs = NULL;
    size_t n = 0;
    if (c->t->model.kind == TOK_MODEL_SCORES) AT_TRY(derived_merges(c, &recs, &n));
    else AT_TRY(table_merges(c, &recs, &n));
    cJSON *merges = put(c, m, "merges", cJSON_CreateArray());
    /* Hugging Face's BPE refuses a merge whose parts or result are not in
     * the vocabulary (MergeTokenOutOfVocabulary); one can arise when an added
     * token takes the id of a vocabulary entry with other text. Such a merge
     * is left out: it could never apply. */
    char *buf = NULL;
    size_t cap = 0, dropped = 0;
    at_status st = AT_OK;
    for (size_t i = 0; i < n && !c->oom; i++) {
        const char *l = tok_str(c, recs[i].l), *r = tok_str(c, recs[i].r);
        if (!l || !r) {
            dropped++;
            continue;
        }
        size_t ll = c->g->token_lens[recs[i].l], rl = c->g->token_lens[recs[i].r];
        if (ll + rl > cap) {
            char *nb = realloc(buf, ll + rl);
            if (!nb) {
                st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            buf = nb;
            cap = ll + rl;
        }
        memcpy(buf, l, ll);
        memcpy(buf + ll, r, rl);
        if (tok_vocab_find(&c->idx, buf, ll + rl) < 0) {
            dropped++;
            continue;
        }
        cJSON *p = put(c, merges, NULL, cJSON_CreateArray());
        put_str(c, p, NULL, l);
        put_str(c, p, NULL, r);
    }
    if (dropped)
        at_log_warn("tokenizer: %zu merges left out of tokenizer.json: a part or the merged token is not in the "
                    "vocabulary",
                    dropped);
    free(buf);
    free(recs);
    return st;
}

static cJSON *tokenizer_json(ctx *c, at_status *st)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) {
        c->oom = 1;
        return NULL;
    }
    put_str(c, root, "version", "1.0");
    put(c, root, "truncation", cJSON_CreateNull());
    put(c, root, "padding", cJSON_CreateNull());
    cJSON *added = put(c, root, "added_tokens", cJSON_CreateArray());
    for (size_t id = 0; id < c->g->n_tokens; id++) {
        tok_added tmp;
        const tok_added *a = added_at(c, (int32_t)id, &tmp);
        if (!a) continue;
        cJSON *o = put(c, added, NULL, cJSON_CreateObject());
        put_num(c, o, "id", (double)id);
        put_str(c, o, "content", c->g->tokens[id]);
        added_token_fields(c, o, a);
    }
    if (c->spm) {
        spm_pipeline(c, root);
    } else if ((*st = byte_level_pipeline(c, root)) != AT_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    post_processor(c, root);
    decoder(c, root);
    if ((*st = model(c, root)) != AT_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---- tokenizer_config.json, special_tokens_map.json --------------------- */

static const struct {
    const char *key;
    size_t off;
} special_keys[] = {
    {"bos_token", offsetof(at_tokenizer_gguf, bos_id)},
    {"eos_token", offsetof(at_tokenizer_gguf, eos_id)},
    {"unk_token", offsetof(at_tokenizer_gguf, unk_id)},
    {"pad_token", offsetof(at_tokenizer_gguf, pad_id)},
};

static int32_t special_id(const ctx *c, size_t k)
{
    int32_t id;
    memcpy(&id, (const char *)c->g + special_keys[k].off, sizeof id);
    return id;
}

static at_status config_json(ctx *c, const at_tokenizer_hf_opts *o, cJSON **cfg_out, cJSON **map_out)
{
    const at_tokenizer_gguf *g = c->g;
    cJSON *cfg = cJSON_CreateObject(), *map = cJSON_CreateObject();
    put_bool(c, cfg, "add_bos_token", g->add_bos);
    put_bool(c, cfg, "add_eos_token", g->add_eos);
    cJSON *dec = put(c, cfg, "added_tokens_decoder", cJSON_CreateObject());
    for (size_t id = 0; id < g->n_tokens; id++) {
        tok_added tmp;
        const tok_added *a = added_at(c, (int32_t)id, &tmp);
        if (!a) continue;
        char key[24];
        snprintf(key, sizeof key, "%zu", id);
        cJSON *e = put(c, dec, key, cJSON_CreateObject());
        put_str(c, e, "content", g->tokens[id]);
        put_bool(c, e, "lstrip", a->lstrip);
        put_bool(c, e, "normalized", a->normalized);
        put_bool(c, e, "rstrip", a->rstrip);
        put_bool(c, e, "single_word", a->single_word);
        put_bool(c, e, "special", a->special);
    }
    for (size_t k = 0; k < sizeof special_keys / sizeof special_keys[0]; k++) {
        const char *name = tok_str(c, special_id(c, k));
        put_str(c, cfg, special_keys[k].key, name);
        if (!name) continue;
        cJSON *e = put(c, map, special_keys[k].key, cJSON_CreateObject());
        put_str(c, e, "content", name);
        put_bool(c, e, "lstrip", 0);
        put_bool(c, e, "normalized", 0);
        put_bool(c, e, "rstrip", 0);
        put_bool(c, e, "single_word", 0);
    }
    if (o && o->chat_template) {
        if (!json_safe(o->chat_template, strlen(o->chat_template))) {
            cJSON_Delete(cfg);
            cJSON_Delete(map);
            return at_error(AT_ERR_UNSUPPORTED, "tokenizer: the chat template is not valid UTF-8");
        }
        put_str(c, cfg, "chat_template", o->chat_template);
    }
    /* Our decode does no clean-up of spaces before punctuation; neither
     * should transformers' decode of the same ids. */
    put_bool(c, cfg, "clean_up_tokenization_spaces", 0);
    if (c->spm) {
        /* legacy: the Prepend normalizer runs on the text after a special
         * token too (what this tokenizer.json does); Metaspace "first" is the
         * non-legacy behaviour. */
        int metaspace = 0;
        for (size_t i = 0; i < c->t->n_pre; i++) metaspace |= c->t->pre[i].kind == TOK_PRE_METASPACE;
        put_bool(c, cfg, "legacy", !metaspace);
    }
    if (o && o->model_max_length > 0) put_num(c, cfg, "model_max_length", (double)o->model_max_length);
    put_str(c, cfg, "tokenizer_class", c->spm ? "LlamaTokenizerFast" : "PreTrainedTokenizerFast");
    *cfg_out = cfg;
    *map_out = map;
    return AT_OK;
}

at_status at_tokenizer_hf_build(const at_tokenizer *t, const at_tokenizer_hf_opts *o, cJSON **tokenizer_json_out,
                                cJSON **tokenizer_config, cJSON **special_tokens_map)
{
    *tokenizer_json_out = *tokenizer_config = *special_tokens_map = NULL;
    if (!t) return at_error(AT_ERR_INVALID, "tokenizer: NULL");
    ctx c;
    cJSON *tj = NULL, *cfg = NULL, *map = NULL;
    at_status st = ctx_init(&c, t);
    if (st != AT_OK) goto done;
    tj = tokenizer_json(&c, &st);
    if (st != AT_OK) goto done;
    AT_CHECK(config_json(&c, o, &cfg, &map));
    if (c.oom || !tj || !cfg || !map) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory building tokenizer.json");
        goto done;
    }
    *tokenizer_json_out = tj;
    *tokenizer_config = cfg;
    *special_tokens_map = map;
    tj = cfg = map = NULL;
done:
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    ctx_free(&c);
    return st;
}

/* Prints j (formatted or compact) into dir/name with a final newline. */
static at_status write_json(const char *dir, const char *name, const cJSON *j, int formatted)
{
    char *text = formatted ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    char *path = at_path_join(dir, name);
    at_status st = AT_OK;
    if (!text || !path) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory writing %s", name);
        goto done;
    }
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory writing %s", name);
        goto done;
    }
    text = t2;
    text[n] = '\n';
    text[n + 1] = '\0';
    st = at_write_file_atomic(path, text, n + 1);
done:
    free(text);
    free(path);
    return st;
}

at_status at_tokenizer_hf_save(const cJSON *tj, const cJSON *cfg, const cJSON *map, const char *dir)
{
    AT_TRY(write_json(dir, "tokenizer.json", tj, 0));
    AT_TRY(write_json(dir, "tokenizer_config.json", cfg, 1));
    return write_json(dir, "special_tokens_map.json", map, 1);
}

at_status at_tokenizer_hf_write(const at_tokenizer *t, const at_tokenizer_hf_opts *o, const char *dir)
{
    cJSON *tj = NULL, *cfg = NULL, *map = NULL;
    at_status st;
    AT_CHECK(at_tokenizer_hf_build(t, o, &tj, &cfg, &map));
    AT_CHECK(at_tokenizer_hf_save(tj, cfg, map, dir));
done:
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    return st;
}
