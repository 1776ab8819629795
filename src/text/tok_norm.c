/* Normalizers: NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Replace, Lowercase,
 * Strip, applied in order (HF's Sequence). */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Text made only of code points that the normalization form leaves alone,
 * and that never compose with a neighbour, needs no pass through utf8proc.
 * For both forms: ASCII, CJK ideographs, Hangul syllables. For NFC also:
 * Latin-1 and Latin Extended below the combining marks (U+0300), general
 * punctuation U+2010-U+205E, CJK punctuation and kana U+3000-U+30FF less
 * the combining marks U+302A-U+302F and U+3099-U+309A, and the fullwidth
 * forms U+FF00-U+FFEF (all without canonical decompositions; only NFKC
 * folds some of them). */
static int surely_normal(const char *s, size_t n, int compat)
{
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_decode(p + i, n - i, &cp);
        if (k == 0) return 0;
        int ok = (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
        if (!compat && !ok)
            ok = cp < 0x300 || (cp >= 0x2010 && cp <= 0x205E) ||
                 (cp >= 0x3000 && cp <= 0x30FF && !(cp >= 0x302A && cp <= 0x302F) && cp != 0x3099 && cp != 0x309A) ||
                 (cp >= 0xFF00 && cp <= 0xFFEF);
        if (!ok) return 0;
        i += (size_t)k;
    }
    return 1;
}

static at_status unicode_form(tok_norm_kind kind, const char *s, size_t n, tok_buf *out)
{
    int compat = kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD;
    int compose = kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC;
    if (compose && surely_normal(s, n, compat)) return tok_buf_put(out, s, n);
    utf8proc_option_t opt = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
    if (compat) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res, opt);
    if (r < 0) {
        /* Only invalid UTF-8 fails here, and encode sanitizes its input. */
        free(res);
        return at_error(AT_ERR_INVALID, "tokenizer: unicode normalization failed: %s", utf8proc_errmsg(r));
    }
    at_status st = tok_buf_put(out, res, (size_t)r);
    free(res);
    return st;
}

static at_status replace_literal(const char *pat, size_t pl, const char *rep, size_t rl, const char *s, size_t n,
                                 tok_buf *out)
{
    if (pl == 0) return tok_buf_put(out, s, n);
    size_t i = 0;
    while (i < n) {
        const char *hit = pl <= n - i ? memmem(s + i, n - i, pat, pl) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - s);
        AT_TRY(tok_buf_put(out, s + i, at - i));
        AT_TRY(tok_buf_put(out, rep, rl));
        i = at + pl;
    }
    return tok_buf_put(out, s + i, n - i);
}

static at_status replace_regex(pcre2_code *re, const char *rep, size_t rl, const char *s, size_t n, tok_buf *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    at_status st = AT_OK;
    size_t i = 0, last = 0;
    while (i <= n) {
        /* the first call checks the subject's UTF-8 once (PCRE2 must never see
         * invalid UTF-8 with NO_UTF_CHECK: a tokenizer file's own normalizer
         * strings may hold bytes the input sanitizing never saw) */
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, i, i ? PCRE2_NO_UTF_CHECK : 0, md, NULL);
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
            st = at_error(AT_ERR_INVALID, "tokenizer: normalized text is not valid UTF-8 (a normalizer string of the "
                          "tokenizer file holds invalid bytes)");
            goto done;
        }
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        AT_CHECK(tok_buf_put(out, s + last, ov[0] - last));
        AT_CHECK(tok_buf_put(out, rep, rl));
        last = ov[1];
        if (ov[1] == ov[0]) {
            if (ov[1] >= n) break;
            i = ov[1] + (size_t)tok_utf8_len((uint8_t)s[ov[1]]);
            AT_CHECK(tok_buf_put(out, s + ov[1], i - ov[1]));
            last = i;
        } else {
            i = ov[1];
        }
    }
    if (last < n) AT_CHECK(tok_buf_put(out, s + last, n - last));
done:
    pcre2_match_data_free(md);
    return st;
}

static at_status lowercase(const char *s, size_t n, tok_buf *out)
{
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_decode(p + i, n - i, &cp);
        if (k == 0) {
            AT_TRY(tok_buf_putc(out, s[i]));
            i++;
            continue;
        }
        char tmp[4];
        int m = tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), tmp);
        AT_TRY(tok_buf_put(out, tmp, (size_t)m));
        i += (size_t)k;
    }
    return AT_OK;
}

static at_status strip(int left, int right, const char *s, size_t n, tok_buf *out)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t a = 0, b = n;
    if (left) {
        while (a < b) {
            uint32_t cp;
            int k = tok_utf8_decode(p + a, b - a, &cp);
            if (k == 0 || !tok_is_space(cp)) break;
            a += (size_t)k;
        }
    }
    if (right) {
        while (b > a) {
            size_t c = b - 1;
            while (c > a && (p[c] & 0xC0) == 0x80) c--;
            uint32_t cp;
            int k = tok_utf8_decode(p + c, b - c, &cp);
            if (k == 0 || !tok_is_space(cp)) break;
            b = c;
        }
    }
    return tok_buf_put(out, s + a, b - a);
}

at_status tok_normalize(const tok_norm *chain, size_t n_chain, const char *s, size_t n, tok_buf *out)
{
    tok_buf a = {0}, b = {0};
    at_status st = AT_OK;
    const char *cur = s;
    size_t cur_n = n;
    out->len = 0;
    if (n_chain == 0) return tok_buf_put(out, s, n);
    for (size_t i = 0; i < n_chain; i++) {
        const tok_norm *nm = &chain[i];
        tok_buf *dst = (i + 1 == n_chain) ? out : (cur == a.p ? &b : &a);
        dst->len = 0;
        AT_CHECK(tok_buf_reserve(dst, cur_n + 8));
        switch (nm->kind) {
        case TOK_NORM_NFC: case TOK_NORM_NFD: case TOK_NORM_NFKC: case TOK_NORM_NFKD:
            AT_CHECK(unicode_form(nm->kind, cur, cur_n, dst));
            break;
        case TOK_NORM_PREPEND:
            if (cur_n > 0) AT_CHECK(tok_buf_put(dst, nm->a, nm->alen));
            AT_CHECK(tok_buf_put(dst, cur, cur_n));
            break;
        case TOK_NORM_REPLACE:
            if (nm->re)
                AT_CHECK(replace_regex(nm->re, nm->b, nm->blen, cur, cur_n, dst));
            else
                AT_CHECK(replace_literal(nm->a, nm->alen, nm->b, nm->blen, cur, cur_n, dst));
            break;
        case TOK_NORM_LOWERCASE:
            AT_CHECK(lowercase(cur, cur_n, dst));
            break;
        case TOK_NORM_STRIP:
            AT_CHECK(strip(nm->left, nm->right, cur, cur_n, dst));
            break;
        }
        cur = dst->p ? dst->p : "";
        cur_n = dst->len;
    }
done:
    tok_buf_free(&a);
    tok_buf_free(&b);
    return st;
}

void tok_norm_free(tok_norm *n)
{
    free(n->a);
    free(n->b);
    if (n->re) pcre2_code_free(n->re);
    memset(n, 0, sizeof *n);
}
