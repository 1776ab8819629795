/* Loading a Hugging Face tokenizer.json. Every component is read into the
 * structs of tok_internal.h; a component this library lacks is an
 * AT_ERR_UNSUPPORTED that names it. */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"

typedef struct {
    const char *what;
    at_tokenizer *t;
} ctx;

static const char *get_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int get_bool(const cJSON *o, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static const char *type_of(const cJSON *o)
{
    const char *t = get_str(o, "type");
    return t ? t : "(no type)";
}

/* A {"String": s} or {"Regex": r} pattern. */
static at_status get_pattern(const ctx *c, const cJSON *o, const char *where, char **lit, size_t *lit_len,
                             pcre2_code **re)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s;
    *lit = NULL;
    *re = NULL;
    if (cJSON_IsObject(p) && (s = get_str(p, "String")) != NULL) {
        *lit = tok_dup(s, strlen(s));
        *lit_len = strlen(s);
        return *lit ? AT_OK : at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (cJSON_IsObject(p) && (s = get_str(p, "Regex")) != NULL) return tok_regex_compile(s, strlen(s), re, c->what);
    return at_error(AT_ERR_FORMAT, "%s: %s: \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}", c->what,
                    where);
}

/* ---- normalizers --------------------------------------------------------- */

static at_status add_norm(ctx *c, const cJSON *o)
{
    if (cJSON_IsNull(o) || !o) return AT_OK;
    if (!cJSON_IsObject(o)) return at_error(AT_ERR_FORMAT, "%s: normalizer must be an object", c->what);
    const char *ty = type_of(o);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        if (!cJSON_IsArray(list)) return at_error(AT_ERR_FORMAT, "%s: normalizer Sequence without \"normalizers\"", c->what);
        const cJSON *e;
        cJSON_ArrayForEach(e, list) AT_TRY(add_norm(c, e));
        return AT_OK;
    }
    tok_norm n = {0};
    if (strcmp(ty, "NFC") == 0) n.kind = TOK_NORM_NFC;
    else if (strcmp(ty, "NFD") == 0) n.kind = TOK_NORM_NFD;
    else if (strcmp(ty, "NFKC") == 0) n.kind = TOK_NORM_NFKC;
    else if (strcmp(ty, "NFKD") == 0) n.kind = TOK_NORM_NFKD;
    else if (strcmp(ty, "Lowercase") == 0) n.kind = TOK_NORM_LOWERCASE;
    else if (strcmp(ty, "Strip") == 0) {
        n.kind = TOK_NORM_STRIP;
        n.left = get_bool(o, "strip_left", 1);
        n.right = get_bool(o, "strip_right", 1);
    } else if (strcmp(ty, "Prepend") == 0) {
        const char *p = get_str(o, "prepend");
        if (!p) return at_error(AT_ERR_FORMAT, "%s: normalizer Prepend without \"prepend\"", c->what);
        n.kind = TOK_NORM_PREPEND;
        n.a = tok_dup(p, strlen(p));
        n.alen = strlen(p);
        if (!n.a) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    } else if (strcmp(ty, "Replace") == 0) {
        const char *content = get_str(o, "content");
        if (!content) return at_error(AT_ERR_FORMAT, "%s: normalizer Replace without \"content\"", c->what);
        n.kind = TOK_NORM_REPLACE;
        AT_TRY(get_pattern(c, o, "normalizer Replace", &n.a, &n.alen, &n.re));
        n.b = tok_dup(content, strlen(content));
        n.blen = strlen(content);
        if (!n.b) {
            tok_norm_free(&n);
            return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        }
    } else {
        return at_error(AT_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported", c->what, ty);
    }
    return tok_push_norm(c->t, &n);
}

/* ---- pre-tokenizers ------------------------------------------------------ */

static at_status parse_behavior(const ctx *c, const cJSON *o, tok_split_behavior dflt, tok_split_behavior *out)
{
    const char *b = get_str(o, "behavior");
    *out = dflt;
    if (!b) return AT_OK;
    if (strcmp(b, "Removed") == 0) *out = TOK_SPLIT_REMOVED;
    else if (strcmp(b, "Isolated") == 0) *out = TOK_SPLIT_ISOLATED;
    else if (strcmp(b, "MergedWithPrevious") == 0) *out = TOK_SPLIT_MERGED_PREV;
    else if (strcmp(b, "MergedWithNext") == 0) *out = TOK_SPLIT_MERGED_NEXT;
    else if (strcmp(b, "Contiguous") == 0) *out = TOK_SPLIT_CONTIGUOUS;
    else return at_error(AT_ERR_FORMAT, "%s: unknown split behavior \"%s\"", c->what, b);
    return AT_OK;
}

static at_status parse_prepend_scheme(const ctx *c, const cJSON *o, tok_prepend_scheme *out)
{
    const char *s = get_str(o, "prepend_scheme");
    if (!s) {
        /* Older files: add_prefix_space. */
        *out = get_bool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return AT_OK;
    }
    if (strcmp(s, "always") == 0) *out = TOK_PREPEND_ALWAYS;
    else if (strcmp(s, "first") == 0) *out = TOK_PREPEND_FIRST;
    else if (strcmp(s, "never") == 0) *out = TOK_PREPEND_NEVER;
    else return at_error(AT_ERR_FORMAT, "%s: unknown Metaspace prepend_scheme \"%s\"", c->what, s);
    return AT_OK;
}

static at_status set_replacement(const ctx *c, const cJSON *o, char *repl, int *repl_len)
{
    const char *r = get_str(o, "replacement");
    if (!r) r = "\xE2\x96\x81";
    size_t n = strlen(r);
    uint32_t cp;
    if (n == 0 || n > 4 || tok_utf8_decode((const uint8_t *)r, n, &cp) != (int)n)
        return at_error(AT_ERR_FORMAT, "%s: Metaspace replacement must be one character", c->what);
    memcpy(repl, r, n);
    repl[n] = '\0';
    *repl_len = (int)n;
    return AT_OK;
}

static at_status add_pre(ctx *c, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return AT_OK;
    if (!cJSON_IsObject(o)) return at_error(AT_ERR_FORMAT, "%s: pre_tokenizer must be an object", c->what);
    const char *ty = type_of(o);
    tok_pre p = {0};
    at_status st = AT_OK;
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        if (!cJSON_IsArray(list))
            return at_error(AT_ERR_FORMAT, "%s: pre_tokenizer Sequence without \"pretokenizers\"", c->what);
        const cJSON *e;
        cJSON_ArrayForEach(e, list) AT_TRY(add_pre(c, e));
        return AT_OK;
    } else if (strcmp(ty, "Split") == 0) {
        p.kind = TOK_PRE_SPLIT;
        AT_CHECK(get_pattern(c, o, "pre_tokenizer Split", &p.literal, &p.literal_len, &p.re));
        AT_CHECK(parse_behavior(c, o, TOK_SPLIT_ISOLATED, &p.behavior));
        p.invert = get_bool(o, "invert", 0);
    } else if (strcmp(ty, "ByteLevel") == 0) {
        p.kind = TOK_PRE_BYTELEVEL;
        p.add_prefix_space = get_bool(o, "add_prefix_space", 1);
        p.use_regex = get_bool(o, "use_regex", 1);
        if (p.use_regex) AT_CHECK(tok_regex_compile(tok_re_gpt2, strlen(tok_re_gpt2), &p.re, c->what));
    } else if (strcmp(ty, "Metaspace") == 0) {
        p.kind = TOK_PRE_METASPACE;
        AT_CHECK(set_replacement(c, o, p.repl, &p.repl_len));
        AT_CHECK(parse_prepend_scheme(c, o, &p.prepend));
        p.split = get_bool(o, "split", 1);
    } else if (strcmp(ty, "Digits") == 0) {
        p.kind = TOK_PRE_DIGITS;
        p.individual = get_bool(o, "individual_digits", 0);
    } else if (strcmp(ty, "Punctuation") == 0) {
        p.kind = TOK_PRE_PUNCT;
        AT_CHECK(parse_behavior(c, o, TOK_SPLIT_ISOLATED, &p.behavior));
    } else if (strcmp(ty, "Whitespace") == 0) {
        p.kind = TOK_PRE_WHITESPACE;
        AT_CHECK(tok_regex_compile("\\w+|[^\\w\\s]+", 14, &p.re, c->what));
    } else if (strcmp(ty, "WhitespaceSplit") == 0) {
        p.kind = TOK_PRE_WHITESPACE_SPLIT;
    } else {
        return at_error(AT_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" is not supported", c->what, ty);
    }
    return tok_push_pre(c->t, &p);
done:
    tok_pre_free(&p);
    return st;
}

/* ---- decoders ------------------------------------------------------------ */

static at_status add_dec(ctx *c, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return AT_OK;
    if (!cJSON_IsObject(o)) return at_error(AT_ERR_FORMAT, "%s: decoder must be an object", c->what);
    c->t->has_decoder = 1;
    const char *ty = type_of(o);
    tok_dec d = {0};
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        if (!cJSON_IsArray(list)) return at_error(AT_ERR_FORMAT, "%s: decoder Sequence without \"decoders\"", c->what);
        const cJSON *e;
        cJSON_ArrayForEach(e, list) AT_TRY(add_dec(c, e));
        return AT_OK;
    } else if (strcmp(ty, "ByteLevel") == 0) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (strcmp(ty, "ByteFallback") == 0) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (strcmp(ty, "Fuse") == 0) {
        d.kind = TOK_DEC_FUSE;
    } else if (strcmp(ty, "Strip") == 0) {
        const char *content = get_str(o, "content");
        uint32_t cp = ' ';
        if (content && tok_utf8_decode((const uint8_t *)content, strlen(content), &cp) != (int)strlen(content))
            return at_error(AT_ERR_FORMAT, "%s: decoder Strip content must be one character", c->what);
        d.kind = TOK_DEC_STRIP;
        d.strip_cp = cp;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "start"), *b = cJSON_GetObjectItemCaseSensitive(o, "stop");
        d.start = cJSON_IsNumber(a) ? a->valueint : 0;
        d.stop = cJSON_IsNumber(b) ? b->valueint : 0;
        if (d.start < 0 || d.stop < 0 || d.start > 1000000 || d.stop > 1000000)
            return at_error(AT_ERR_FORMAT, "%s: decoder Strip start/stop out of range", c->what);
    } else if (strcmp(ty, "Replace") == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
        const char *s = cJSON_IsObject(p) ? get_str(p, "String") : NULL;
        const char *content = get_str(o, "content");
        if (!s || !content)
            return at_error(AT_ERR_UNSUPPORTED, "%s: decoder Replace is supported with a String pattern and content only",
                            c->what);
        d.kind = TOK_DEC_REPLACE;
        d.a = tok_dup(s, strlen(s));
        d.alen = strlen(s);
        d.b = tok_dup(content, strlen(content));
        d.blen = strlen(content);
        if (!d.a || !d.b) {
            tok_dec_free(&d);
            return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        }
    } else if (strcmp(ty, "Metaspace") == 0) {
        char repl[5];
        int rl;
        d.kind = TOK_DEC_METASPACE;
        AT_TRY(set_replacement(c, o, repl, &rl));
        AT_TRY(parse_prepend_scheme(c, o, &d.prepend));
        d.a = tok_dup(repl, (size_t)rl);
        d.alen = (size_t)rl;
        if (!d.a) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    } else if (strcmp(ty, "BPEDecoder") == 0) {
        const char *s = get_str(o, "suffix");
        if (!s) s = "</w>";
        d.kind = TOK_DEC_BPE_SUFFIX;
        d.a = tok_dup(s, strlen(s));
        d.alen = strlen(s);
        if (!d.a) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    } else {
        return at_error(AT_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported", c->what, ty);
    }
    return tok_push_dec(c->t, &d);
}

/* ---- post-processors ----------------------------------------------------- */

static at_status special_pair_id(const ctx *c, const cJSON *o, const char *key, int32_t *id)
{
    /* ["<s>", 1] as RobertaProcessing / BertProcessing write it. */
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    const cJSON *v = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 1) : NULL;
    if (!cJSON_IsNumber(v)) return at_error(AT_ERR_FORMAT, "%s: post_processor \"%s\" must be [token, id]", c->what, key);
    *id = v->valueint;
    return AT_OK;
}

static at_status add_post(ctx *c, const cJSON *o)
{
    at_tokenizer *t = c->t;
    if (!o || cJSON_IsNull(o)) return AT_OK;
    if (!cJSON_IsObject(o)) return at_error(AT_ERR_FORMAT, "%s: post_processor must be an object", c->what);
    const char *ty = type_of(o);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "processors");
        if (!cJSON_IsArray(list))
            return at_error(AT_ERR_FORMAT, "%s: post_processor Sequence without \"processors\"", c->what);
        const cJSON *e;
        cJSON_ArrayForEach(e, list) AT_TRY(add_post(c, e));
        return AT_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) return AT_OK; /* changes offsets only */
    if (strcmp(ty, "RobertaProcessing") == 0 || strcmp(ty, "BertProcessing") == 0) {
        int32_t cls, sep;
        AT_TRY(special_pair_id(c, o, "cls", &cls));
        AT_TRY(special_pair_id(c, o, "sep", &sep));
        AT_TRY(tok_post_push(&t->post.pre, &t->post.n_pre, cls));
        return tok_post_push(&t->post.post, &t->post.n_post, sep);
    }
    if (strcmp(ty, "TemplateProcessing") != 0)
        return at_error(AT_ERR_UNSUPPORTED, "%s: post_processor \"%s\" is not supported", c->what, ty);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
    if (!cJSON_IsArray(single)) return at_error(AT_ERR_FORMAT, "%s: TemplateProcessing without \"single\"", c->what);
    int seen_seq = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, single)
    {
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
            seen_seq = 1;
            continue;
        }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const char *name = sp ? get_str(sp, "id") : NULL;
        if (!name) return at_error(AT_ERR_FORMAT, "%s: TemplateProcessing: a \"single\" item is neither Sequence nor SpecialToken", c->what);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
        const cJSON *ids = def ? cJSON_GetObjectItemCaseSensitive(def, "ids") : NULL;
        if (!cJSON_IsArray(ids))
            return at_error(AT_ERR_FORMAT, "%s: TemplateProcessing: special token \"%s\" has no ids", c->what, name);
        const cJSON *idv;
        cJSON_ArrayForEach(idv, ids)
        {
            if (!cJSON_IsNumber(idv)) return at_error(AT_ERR_FORMAT, "%s: TemplateProcessing: bad id for \"%s\"", c->what, name);
            if (seen_seq)
                AT_TRY(tok_post_push(&t->post.post, &t->post.n_post, idv->valueint));
            else
                AT_TRY(tok_post_push(&t->post.pre, &t->post.n_pre, idv->valueint));
        }
    }
    return AT_OK;
}

/* ---- the model ----------------------------------------------------------- */

static at_status load_model(ctx *c, const cJSON *m)
{
    at_tokenizer *t = c->t;
    if (!cJSON_IsObject(m)) return at_error(AT_ERR_FORMAT, "%s: no \"model\" object", c->what);
    const char *ty = get_str(m, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (ty && strcmp(ty, "BPE") != 0)
        return at_error(AT_ERR_UNSUPPORTED, "%s: model \"%s\" is not supported (only BPE)", c->what, ty);
    if (!cJSON_IsObject(vocab)) return at_error(AT_ERR_FORMAT, "%s: model.vocab must be an object", c->what);
    if (merges && !cJSON_IsArray(merges)) return at_error(AT_ERR_FORMAT, "%s: model.merges must be an array", c->what);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0.0)
        return at_error(AT_ERR_UNSUPPORTED, "%s: BPE dropout %g is not supported", c->what, drop->valuedouble);

    int32_t max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0 ||
            e->valuedouble != (double)e->valueint)
            return at_error(AT_ERR_FORMAT, "%s: model.vocab[\"%.40s\"] must be an id between 0 and 2^24", c->what,
                            e->string ? e->string : "");
        if (e->valueint > max_id) max_id = e->valueint;
    }
    AT_TRY(tok_bpe_init(&t->model, TOK_MODEL_BPE, max_id + 1));
    cJSON_ArrayForEach(e, vocab) AT_TRY(tok_vocab_set(&t->model.vocab, e->valueint, e->string, strlen(e->string)));
    AT_TRY(tok_vocab_index(&t->model.vocab));

    const char *s;
    if ((s = get_str(m, "continuing_subword_prefix")) != NULL && s[0]) {
        t->model.cont_prefix = tok_dup(s, strlen(s));
        if (!t->model.cont_prefix) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    if ((s = get_str(m, "end_of_word_suffix")) != NULL && s[0]) {
        t->model.eow_suffix = tok_dup(s, strlen(s));
        if (!t->model.eow_suffix) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->model.fuse_unk = get_bool(m, "fuse_unk", 0);
    t->model.byte_fallback = get_bool(m, "byte_fallback", 0);
    t->model.ignore_merges = get_bool(m, "ignore_merges", 0);
    if ((s = get_str(m, "unk_token")) != NULL) {
        t->model.unk_id = tok_vocab_find(&t->model.vocab, s, strlen(s));
        if (t->model.unk_id < 0)
            return at_error(AT_ERR_FORMAT, "%s: unk_token \"%s\" is not in the vocabulary", c->what, s);
    }

    int32_t rank = 0;
    cJSON_ArrayForEach(e, merges)
    {
        if (cJSON_IsString(e)) {
            const char *line = e->valuestring;
            const char *sp = strchr(line, ' ');
            /* a strict split at the space, as Hugging Face's tokenizers reads
             * legacy merges: a line with more spaces (tokens holding spaces,
             * e.g. "   " in some Llama 2 files) has no one reading */
            if (!sp || strchr(sp + 1, ' '))
                return at_error(AT_ERR_FORMAT, "%s: merge %d \"%.60s\" is not two tokens separated by one space: a "
                                "legacy \"a b\" merge cannot hold tokens with spaces (Hugging Face's tokenizers "
                                "refuses it too: \"Merges text file invalid at line %d\"). Fix the file by writing its "
                                "merges as pairs [\"a\", \"b\"], as a current tokenizers (>= 0.20) saves them, or use "
                                "the model's tokenizer.model / a newer tokenizer.json", c->what, (int)rank, line,
                                (int)rank + 1);
            AT_TRY(tok_bpe_add_merge(&t->model, line, (size_t)(sp - line), sp + 1, strlen(sp + 1), rank, c->what));
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
            AT_TRY(tok_bpe_add_merge(&t->model, a, strlen(a), b, strlen(b), rank, c->what));
        } else {
            return at_error(AT_ERR_FORMAT, "%s: merge %d must be \"a b\" or [\"a\", \"b\"]", c->what, (int)rank);
        }
        rank++;
    }
    return AT_OK;
}

static at_status load_added(ctx *c, const cJSON *list)
{
    if (!list || cJSON_IsNull(list)) return AT_OK;
    if (!cJSON_IsArray(list)) return at_error(AT_ERR_FORMAT, "%s: added_tokens must be an array", c->what);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *content = get_str(e, "content");
        if (!cJSON_IsNumber(id) || !content || id->valuedouble < 0 || id->valuedouble > 16777216.0)
            return at_error(AT_ERR_FORMAT, "%s: added_tokens[%d] needs \"id\" (0..2^24) and \"content\"", c->what, i);
        int special = get_bool(e, "special", 0);
        AT_TRY(tok_add_token(c->t, content, strlen(content), id->valueint, special, get_bool(e, "lstrip", 0),
                             get_bool(e, "rstrip", 0), get_bool(e, "single_word", 0),
                             get_bool(e, "normalized", !special)));
        i++;
    }
    return AT_OK;
}

/* JSON text is UTF-8 (RFC 8259), and Hugging Face's tokenizers refuses a
 * tokenizer.json that is not; so do we, before any of its strings reach the
 * regex engine or the vocabulary. Names the line and byte. */
static at_status check_utf8(const char *text, size_t len, const char *what)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tok_utf8_decode(s + i, len - i, &cp);
        if (k <= 0)
            return at_error(AT_ERR_FORMAT, "%s: line %zu, byte %zu: not valid UTF-8 (byte 0x%02x)", what, line,
                            i - line_start + 1, s[i]);
        if (cp == '\n') line++, line_start = i + 1;
        i += (size_t)k;
    }
    return AT_OK;
}

at_status tok_load_json_text(const char *text, size_t len, const char *what, at_tokenizer **out)
{
    cJSON *root = NULL;
    at_tokenizer *t = NULL;
    at_status st;
    *out = NULL;
    AT_TRY(check_utf8(text, len, what));
    AT_CHECK(at_json_parse(text, len, what, &root));
    if (!cJSON_IsObject(root)) {
        st = at_error(AT_ERR_FORMAT, "%s: not a JSON object", what);
        goto done;
    }
    AT_CHECK(tok_new(&t));
    ctx c = {what, t};
    AT_CHECK(load_model(&c, cJSON_GetObjectItemCaseSensitive(root, "model")));
    AT_CHECK(add_norm(&c, cJSON_GetObjectItemCaseSensitive(root, "normalizer")));
    AT_CHECK(add_pre(&c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")));
    AT_CHECK(add_post(&c, cJSON_GetObjectItemCaseSensitive(root, "post_processor")));
    AT_CHECK(add_dec(&c, cJSON_GetObjectItemCaseSensitive(root, "decoder")));
    AT_CHECK(load_added(&c, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")));
    snprintf(t->pre_name, sizeof t->pre_name, "tokenizer.json");
    /* Guesses until tokenizer_config.json says otherwise: the template's
     * first special token is BOS-like; common names otherwise. */
    if (t->post.n_pre) t->bos_id = t->post.pre[0];
    AT_CHECK(tok_finish(t));
    {
        static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", "<bos>", NULL};
        static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", NULL};
        for (int i = 0; t->bos_id < 0 && bos_names[i]; i++) t->bos_id = at_tokenizer_special_id(t, bos_names[i]);
        for (int i = 0; t->eos_id < 0 && eos_names[i]; i++) t->eos_id = at_tokenizer_special_id(t, eos_names[i]);
    }
    *out = t;
    t = NULL;
done:
    at_tokenizer_free(t);
    cJSON_Delete(root);
    return st;
}
