/* Decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace and
 * BPEDecoder (end-of-word suffix), chained as HF's decode_chain: each step
 * maps the list of token strings to a new list; the caller joins the end
 * result. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

void tok_dec_free(tok_dec *d)
{
    free(d->a);
    free(d->b);
    memset(d, 0, sizeof *d);
}

int tok_decoder_strips_first(const tok_dec *chain, size_t n_chain)
{
    for (size_t i = 0; i < n_chain; i++) {
        if (chain[i].kind == TOK_DEC_STRIP && chain[i].start > 0 && chain[i].strip_cp == ' ') return 1;
        if (chain[i].kind == TOK_DEC_METASPACE && chain[i].prepend != TOK_PREPEND_NEVER) return 1;
    }
    return 0;
}

/* ByteLevel: every character of the alphabet back to its byte; characters
 * outside it keep their UTF-8. Then the bytes as UTF-8, invalid sequences as
 * U+FFFD (from_utf8_lossy). All tokens become one. */
static at_status dec_byte_level(const tok_pieces *in, tok_pieces *out)
{
    tok_buf raw = {0};
    at_status st = AT_OK;
    for (size_t i = 0; i < in->n; i++) {
        const uint8_t *p = (const uint8_t *)in->text.p + in->v[i].off;
        size_t n = in->v[i].len;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            int k = tok_utf8_decode(p + j, n - j, &cp);
            if (k == 0) {
                AT_CHECK(tok_buf_putc(&raw, (char)p[j]));
                j++;
                continue;
            }
            int b = tok_cp_to_byte(cp);
            if (b >= 0)
                AT_CHECK(tok_buf_putc(&raw, (char)b));
            else
                AT_CHECK(tok_buf_put(&raw, p + j, (size_t)k));
            j += (size_t)k;
        }
    }
    {
        tok_buf clean = {0};
        st = tok_utf8_sanitize(raw.p ? raw.p : "", raw.len, &clean);
        if (st == AT_OK) st = tok_pieces_add(out, clean.p ? clean.p : "", clean.len, 0);
        tok_buf_free(&clean);
    }
done:
    tok_buf_free(&raw);
    return st;
}

static int byte_token(const char *s, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

/* ByteFallback: runs of <0xXX> tokens become the string they spell when
 * that is valid UTF-8, else one U+FFFD per byte token. */
static at_status dec_byte_fallback(const tok_pieces *in, tok_pieces *out)
{
    tok_buf run = {0};
    at_status st = AT_OK;
    for (size_t i = 0; i <= in->n; i++) {
        uint8_t b;
        const char *s = i < in->n ? in->text.p + in->v[i].off : NULL;
        size_t n = i < in->n ? in->v[i].len : 0;
        if (i < in->n && byte_token(s, n, &b)) {
            AT_CHECK(tok_buf_putc(&run, (char)b));
            continue;
        }
        if (run.len > 0) {
            int valid = 1;
            for (size_t j = 0; j < run.len;) {
                uint32_t cp;
                int k = tok_utf8_decode((const uint8_t *)run.p + j, run.len - j, &cp);
                if (k == 0) {
                    valid = 0;
                    break;
                }
                j += (size_t)k;
            }
            if (valid) {
                AT_CHECK(tok_pieces_add(out, run.p, run.len, 0));
            } else {
                tok_buf rep = {0};
                for (size_t j = 0; j < run.len && st == AT_OK; j++) st = tok_buf_put(&rep, "\xEF\xBF\xBD", 3);
                if (st == AT_OK) st = tok_pieces_add(out, rep.p, rep.len, 0);
                tok_buf_free(&rep);
                if (st != AT_OK) goto done;
            }
            run.len = 0;
        }
        if (i < in->n) AT_CHECK(tok_pieces_add(out, s, n, 0));
    }
done:
    tok_buf_free(&run);
    return st;
}

static at_status dec_replace(const tok_dec *d, const tok_pieces *in, tok_pieces *out)
{
    tok_buf t = {0};
    at_status st = AT_OK;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.p + in->v[i].off;
        size_t n = in->v[i].len, j = 0;
        t.len = 0;
        AT_CHECK(tok_buf_reserve(&t, n));
        while (j < n) {
            const char *hit = d->alen && d->alen <= n - j ? memmem(s + j, n - j, d->a, d->alen) : NULL;
            if (!hit) break;
            AT_CHECK(tok_buf_put(&t, s + j, (size_t)(hit - (s + j))));
            AT_CHECK(tok_buf_put(&t, d->b, d->blen));
            j = (size_t)(hit - s) + d->alen;
        }
        AT_CHECK(tok_buf_put(&t, s + j, n - j));
        AT_CHECK(tok_pieces_add(out, t.p, t.len, 0));
    }
done:
    tok_buf_free(&t);
    return st;
}

/* Strip: up to `start` leading and `stop` trailing copies of the character
 * from every token. */
static at_status dec_strip(const tok_dec *d, const tok_pieces *in, tok_pieces *out)
{
    char c[4];
    int cl = tok_utf8_encode(d->strip_cp, c);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.p + in->v[i].off;
        size_t a = 0, b = in->v[i].len;
        for (int k = 0; k < d->start && b - a >= (size_t)cl && memcmp(s + a, c, (size_t)cl) == 0; k++) a += (size_t)cl;
        for (int k = 0; k < d->stop && b - a >= (size_t)cl && memcmp(s + b - cl, c, (size_t)cl) == 0; k++)
            b -= (size_t)cl;
        AT_TRY(tok_pieces_add(out, s + a, b - a, 0));
    }
    return AT_OK;
}

/* Metaspace: the replacement back to spaces; the first token loses a leading
 * space that the pre-tokenizer prepended. */
static at_status dec_metaspace(const tok_dec *d, const tok_pieces *in, tok_pieces *out, int no_strip)
{
    tok_dec r = {.kind = TOK_DEC_REPLACE, .a = d->a, .alen = d->alen, .b = " ", .blen = 1};
    size_t first = out->n;
    AT_TRY(dec_replace(&r, in, out));
    if (!no_strip && d->prepend != TOK_PREPEND_NEVER && out->n > first && out->v[first].len > 0 &&
        out->text.p[out->v[first].off] == ' ') {
        out->v[first].off++;
        out->v[first].len--;
    }
    return AT_OK;
}

/* BPEDecoder: the suffix becomes a space, except on the last token. */
static at_status dec_bpe_suffix(const tok_dec *d, const tok_pieces *in, tok_pieces *out)
{
    tok_dec r = {.kind = TOK_DEC_REPLACE, .a = d->a, .alen = d->alen, .b = " ", .blen = 1};
    tok_dec r_last = {.kind = TOK_DEC_REPLACE, .a = d->a, .alen = d->alen, .b = "", .blen = 0};
    for (size_t i = 0; i < in->n; i++) {
        tok_pieces one = {0};
        at_status st = tok_pieces_add(&one, in->text.p + in->v[i].off, in->v[i].len, 0);
        if (st == AT_OK) st = dec_replace(i + 1 == in->n ? &r_last : &r, &one, out);
        tok_pieces_free(&one);
        AT_TRY(st);
    }
    return AT_OK;
}

at_status tok_decode_chain(const tok_dec *chain, size_t n_chain, tok_pieces *io, int no_strip)
{
    at_status st = AT_OK;
    tok_pieces tmp = {0};
    for (size_t k = 0; k < n_chain; k++) {
        const tok_dec *d = &chain[k];
        tok_pieces_clear(&tmp);
        switch (d->kind) {
        case TOK_DEC_BYTELEVEL:
            AT_CHECK(dec_byte_level(io, &tmp));
            break;
        case TOK_DEC_METASPACE:
            AT_CHECK(dec_metaspace(d, io, &tmp, no_strip));
            break;
        case TOK_DEC_BYTEFALLBACK:
            AT_CHECK(dec_byte_fallback(io, &tmp));
            break;
        case TOK_DEC_FUSE: {
            tok_buf all = {0};
            for (size_t i = 0; i < io->n && st == AT_OK; i++) st = tok_buf_put(&all, io->text.p + io->v[i].off, io->v[i].len);
            if (st == AT_OK) st = tok_pieces_add(&tmp, all.p ? all.p : "", all.len, 0);
            tok_buf_free(&all);
            if (st != AT_OK) goto done;
            break;
        }
        case TOK_DEC_STRIP:
            if (no_strip) {
                for (size_t i = 0; i < io->n; i++)
                    AT_CHECK(tok_pieces_add(&tmp, io->text.p + io->v[i].off, io->v[i].len, 0));
            } else {
                AT_CHECK(dec_strip(d, io, &tmp));
            }
            break;
        case TOK_DEC_REPLACE:
            AT_CHECK(dec_replace(d, io, &tmp));
            break;
        case TOK_DEC_BPE_SUFFIX:
            AT_CHECK(dec_bpe_suffix(d, io, &tmp));
            break;
        }
        /* Swap the lists. */
        tok_pieces t = *io;
        *io = tmp;
        tmp = t;
    }
done:
    tok_pieces_free(&tmp);
    return st;
}
