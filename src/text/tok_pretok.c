/* Pre-tokenizers: Split (regex or literal, five behaviours, invert),
 * ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit,
 * run in order (HF's Sequence).
 *
 * Each step turns a list of pieces into a new list. As in HF's
 * NormalizedString::split, a pattern first yields the matches and the gaps
 * between them, in order, covering the whole piece; the behaviour then
 * decides what the new pieces are, and empty pieces are dropped. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

const char *const tok_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const tok_re_llama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const tok_re_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

at_status tok_regex_compile(const char *pattern, size_t len, pcre2_code **out, const char *what)
{
    int err = 0;
    PCRE2_SIZE erroff = 0;
    *out = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return at_error(AT_ERR_FORMAT, "%s: regex /%.*s/ does not compile at offset %zu: %s", what,
                        (int)(len > 200 ? 200 : len), pattern, (size_t)erroff, (const char *)msg);
    }
    /* JIT is an optimisation: without it pcre2_match still works. */
    (void)pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return AT_OK;
}

void tok_pre_free(tok_pre *p)
{
    if (p->re) pcre2_code_free(p->re);
    free(p->literal);
    memset(p, 0, sizeof *p);
}

/* ---- matches ------------------------------------------------------------ */

typedef struct {
    uint32_t a, b;
    uint8_t is_match;
} span;

typedef struct {
    span *v;
    size_t n, cap;
} spans;

static at_status spans_add(spans *s, size_t a, size_t b, int m)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 64;
        span *v = realloc(s->v, c * sizeof *v);
        if (!v) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        s->v = v;
        s->cap = c;
    }
    s->v[s->n].a = (uint32_t)a;
    s->v[s->n].b = (uint32_t)b;
    s->v[s->n].is_match = (uint8_t)m;
    s->n++;
    return AT_OK;
}

static at_status find_regex(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, spans *out)
{
    size_t prev = 0, pos = 0;
    while (pos <= n) {
        /* the first call checks the subject's UTF-8 once (see tok_norm.c) */
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, pos ? PCRE2_NO_UTF_CHECK : 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0 && rc != 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return at_error(AT_ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (prev != a) AT_TRY(spans_add(out, prev, a, 0));
        AT_TRY(spans_add(out, a, b, 1));
        prev = b;
        if (b == a) {
            if (b >= n) break;
            pos = b + (size_t)tok_utf8_len((uint8_t)s[b]);
        } else {
            pos = b;
        }
    }
    if (prev != n) AT_TRY(spans_add(out, prev, n, 0));
    return AT_OK;
}

static at_status find_literal(const char *lit, size_t ll, const char *s, size_t n, spans *out)
{
    size_t prev = 0, i = 0;
    while (ll > 0 && i + ll <= n) {
        const char *hit = memmem(s + i, n - i, lit, ll);
        if (!hit) break;
        size_t a = (size_t)(hit - s);
        if (prev != a) AT_TRY(spans_add(out, prev, a, 0));
        AT_TRY(spans_add(out, a, a + ll, 1));
        prev = i = a + ll;
    }
    if (prev != n) AT_TRY(spans_add(out, prev, n, 0));
    return AT_OK;
}

/* Each character for which pred holds is a match of its own (HF's Pattern
 * for Fn(char) -> bool). */
static at_status find_chars(int (*pred)(uint32_t), const char *s, size_t n, spans *out)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_decode(p + i, n - i, &cp);
        if (k == 0) {
            k = 1;
            cp = 0xFFFD;
        }
        if (pred(cp)) {
            if (last < i) AT_TRY(spans_add(out, last, i, 0));
            AT_TRY(spans_add(out, i, i + (size_t)k, 1));
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (last < n) AT_TRY(spans_add(out, last, n, 0));
    return AT_OK;
}

/* Applies a split behaviour in place: afterwards each span is a piece to
 * keep (is_match == 0) or to drop (is_match == 1). */
static void apply_behavior(spans *s, tok_split_behavior beh, int invert)
{
    if (invert)
        for (size_t i = 0; i < s->n; i++) s->v[i].is_match = !s->v[i].is_match;
    size_t k = 0;
    int prev = 0;
    switch (beh) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < s->n; i++) s->v[i].is_match = 0;
        return;
    case TOK_SPLIT_REMOVED:
        return;
    case TOK_SPLIT_CONTIGUOUS:
    case TOK_SPLIT_MERGED_PREV:
        /* Contiguous: a span of the same kind as the one before joins it;
         * MergedWithPrevious: a match joins the piece before it. */
        for (size_t i = 0; i < s->n; i++) {
            int m = s->v[i].is_match;
            int join = beh == TOK_SPLIT_CONTIGUOUS ? m == prev : (m && !prev);
            if (join && k > 0) {
                s->v[k - 1].b = s->v[i].b;
            } else {
                s->v[k] = s->v[i];
                s->v[k++].is_match = 0;
            }
            prev = m;
        }
        s->n = k;
        return;
    case TOK_SPLIT_MERGED_NEXT: {
        /* Walk backwards: a match joins the piece that follows it. */
        size_t w = s->n;
        for (size_t i = s->n; i-- > 0;) {
            int m = s->v[i].is_match;
            if (m && !prev && w < s->n) {
                s->v[w].a = s->v[i].a;
            } else {
                s->v[--w] = s->v[i];
                s->v[w].is_match = 0;
            }
            prev = m;
        }
        memmove(s->v, s->v + w, (s->n - w) * sizeof *s->v);
        s->n -= w;
        return;
    }
    }
}

static at_status emit(const spans *sp, const char *s, int at_start, tok_pieces *out)
{
    for (size_t i = 0; i < sp->n; i++) {
        if (sp->v[i].is_match || sp->v[i].b == sp->v[i].a) continue;
        AT_TRY(tok_pieces_add(out, s + sp->v[i].a, sp->v[i].b - sp->v[i].a, at_start && sp->v[i].a == 0));
    }
    return AT_OK;
}

/* ---- the steps ---------------------------------------------------------- */

static at_status byte_level_map(const char *s, size_t n, int at_start, tok_pieces *out)
{
    if (out->text.len + n * 2 > UINT32_MAX) return at_error(AT_ERR_INVALID, "tokenizer: text too long");
    AT_TRY(tok_buf_reserve(&out->text, n * 2));
    uint32_t off = (uint32_t)out->text.len;
    char *d = out->text.p + out->text.len;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        *d++ = tok_byte_utf8[b][0];
        if (tok_byte_utf8_len[b] == 2) *d++ = tok_byte_utf8[b][1];
    }
    out->text.len = (size_t)(d - out->text.p);
    out->text.p[out->text.len] = '\0';
    return tok_pieces_add_ref(out, off, (uint32_t)(out->text.len - off), at_start);
}

static at_status step_byte_level(const tok_pre *pt, const char *s, size_t n, int at_start, tok_pieces *out,
                                 pcre2_match_data *md, spans *sp, tok_buf *tmp)
{
    if (pt->add_prefix_space && (n == 0 || s[0] != ' ')) {
        tmp->len = 0;
        AT_TRY(tok_buf_putc(tmp, ' '));
        AT_TRY(tok_buf_put(tmp, s, n));
        s = tmp->p;
        n = tmp->len;
    }
    if (!pt->use_regex) return byte_level_map(s, n, at_start, out);
    sp->n = 0;
    AT_TRY(find_regex(pt->re, md, s, n, sp));
    for (size_t i = 0; i < sp->n; i++) {
        if (sp->v[i].b == sp->v[i].a) continue;
        AT_TRY(byte_level_map(s + sp->v[i].a, sp->v[i].b - sp->v[i].a, at_start && sp->v[i].a == 0, out));
    }
    return AT_OK;
}

static at_status step_metaspace(const tok_pre *pt, const char *s, size_t n, int at_start, tok_pieces *out,
                                spans *sp, tok_buf *tmp)
{
    tmp->len = 0;
    int starts = n >= (size_t)pt->repl_len && memcmp(s, pt->repl, (size_t)pt->repl_len) == 0;
    /* The replacement of a leading space also counts as "starts with". */
    if (n > 0 && s[0] == ' ') starts = 1;
    if (!starts && (pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && at_start)))
        AT_TRY(tok_buf_put(tmp, pt->repl, (size_t)pt->repl_len));
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            AT_TRY(tok_buf_put(tmp, pt->repl, (size_t)pt->repl_len));
        else
            AT_TRY(tok_buf_putc(tmp, s[i]));
    }
    if (!pt->split) return tok_pieces_add(out, tmp->p ? tmp->p : "", tmp->len, at_start);
    sp->n = 0;
    AT_TRY(find_literal(pt->repl, (size_t)pt->repl_len, tmp->p ? tmp->p : "", tmp->len, sp));
    apply_behavior(sp, TOK_SPLIT_MERGED_NEXT, 0);
    return emit(sp, tmp->p, at_start, out);
}

static int is_space_cp(uint32_t cp)
{
    return tok_is_space(cp);
}

static at_status run_step(const tok_pre *pt, const char *s, size_t n, int at_start, tok_pieces *out,
                          pcre2_match_data *md, spans *sp, tok_buf *tmp)
{
    sp->n = 0;
    switch (pt->kind) {
    case TOK_PRE_BYTELEVEL:
        return step_byte_level(pt, s, n, at_start, out, md, sp, tmp);
    case TOK_PRE_METASPACE:
        return step_metaspace(pt, s, n, at_start, out, sp, tmp);
    case TOK_PRE_SPLIT:
        if (pt->re)
            AT_TRY(find_regex(pt->re, md, s, n, sp));
        else
            AT_TRY(find_literal(pt->literal, pt->literal_len, s, n, sp));
        apply_behavior(sp, pt->behavior, pt->invert);
        return emit(sp, s, at_start, out);
    case TOK_PRE_DIGITS:
        AT_TRY(find_chars(tok_is_numeric, s, n, sp));
        apply_behavior(sp, pt->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0);
        return emit(sp, s, at_start, out);
    case TOK_PRE_PUNCT:
        AT_TRY(find_chars(tok_is_punct, s, n, sp));
        apply_behavior(sp, pt->behavior, 0);
        return emit(sp, s, at_start, out);
    case TOK_PRE_WHITESPACE:
        /* \w+|[^\w\s]+ : the matches are the pieces. */
        AT_TRY(find_regex(pt->re, md, s, n, sp));
        apply_behavior(sp, TOK_SPLIT_REMOVED, 1);
        return emit(sp, s, at_start, out);
    case TOK_PRE_WHITESPACE_SPLIT:
        AT_TRY(find_chars(is_space_cp, s, n, sp));
        apply_behavior(sp, TOK_SPLIT_REMOVED, 0);
        return emit(sp, s, at_start, out);
    }
    return at_error(AT_ERR_INTERNAL, "tokenizer: unknown pre-tokenizer step");
}

at_status tok_pretokenize(const tok_pre *chain, size_t n_chain, tok_pieces *in, tok_pieces *out,
                          pcre2_match_data *md)
{
    at_status st = AT_OK;
    spans sp = {0};
    tok_buf tmp = {0};
    tok_pieces mid = {0};
    tok_pieces *src = in;
    if (n_chain == 0) {
        tok_pieces_clear(out);
        for (size_t i = 0; i < in->n; i++)
            AT_CHECK(tok_pieces_add(out, in->text.p + in->v[i].off, in->v[i].len, in->v[i].at_start));
        goto done;
    }
    for (size_t k = 0; k < n_chain; k++) {
        /* Alternate between out and mid so that the last step writes out. */
        tok_pieces *dst = ((n_chain - 1 - k) % 2 == 0) ? out : &mid;
        tok_pieces_clear(dst);
        for (size_t i = 0; i < src->n; i++) {
            const tok_piece *pc = &src->v[i];
            AT_CHECK(run_step(&chain[k], src->text.p + pc->off, pc->len, pc->at_start, dst, md, &sp, &tmp));
        }
        src = dst;
    }
done:
    free(sp.v);
    tok_buf_free(&tmp);
    tok_pieces_free(&mid);
    return st;
}
