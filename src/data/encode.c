#include "data/encode.h"

#include <stdlib.h>
#include <string.h>

at_status at_truncation_parse(const char *name, at_truncation *out)
{
    if (strcmp(name, "delete") == 0) *out = AT_TRUNCATE_DELETE;
    else if (strcmp(name, "left") == 0) *out = AT_TRUNCATE_LEFT;
    else if (strcmp(name, "right") == 0) *out = AT_TRUNCATE_RIGHT;
    else return at_error(AT_ERR_INVALID, "unknown truncation_strategy \"%s\" (delete, left, right)", name);
    return AT_OK;
}

void at_encoded_free(at_encoded *e)
{
    if (!e) return;
    free(e->ids);
    free(e->labels);
    e->ids = e->labels = NULL;
    e->n = 0;
}

at_status at_encoded_frame(at_encoded *e, int32_t bos, int32_t eos)
{
    size_t extra = (bos >= 0) + (eos >= 0), k = 0;
    if (!extra) return AT_OK;
    int32_t *ids = malloc((e->n + extra) * sizeof *ids), *labels = malloc((e->n + extra) * sizeof *labels);
    if (!ids || !labels) {
        free(ids);
        free(labels);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    if (bos >= 0) ids[k] = bos, labels[k++] = AT_IGNORE_INDEX;
    if (e->n) {
        memcpy(ids + k, e->ids, e->n * sizeof *ids);
        memcpy(labels + k, e->labels, e->n * sizeof *labels);
    }
    k += e->n;
    if (eos >= 0) ids[k] = eos, labels[k++] = eos;
    free(e->ids);
    free(e->labels);
    e->ids = ids;
    e->labels = labels;
    e->n = k;
    return AT_OK;
}

static int span_cmp(const void *a, const void *b)
{
    const at_byte_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

at_status at_encode_labels(const int32_t *ids, const at_byte_span *offsets, size_t n, const at_byte_span *spans,
                           size_t n_spans, int32_t *labels)
{
    /* Sort and merge the spans so each token needs one binary search. */
    at_byte_span *sp = NULL;
    size_t m = 0;
    if (n_spans) {
        sp = malloc(n_spans * sizeof *sp);
        if (!sp) return at_error(AT_ERR_NOMEM, "out of memory masking labels");
        for (size_t i = 0; i < n_spans; i++) {
            if (spans[i].end < spans[i].begin) {
                free(sp);
                return at_error(AT_ERR_INVALID, "trained span %zu is reversed [%zu, %zu)", i, spans[i].begin,
                                spans[i].end);
            }
            if (spans[i].end > spans[i].begin) sp[m++] = spans[i];
        }
        qsort(sp, m, sizeof *sp, span_cmp);
        size_t k = 0;
        for (size_t i = 0; i < m; i++) {
            if (k && sp[i].begin <= sp[k - 1].end) {
                if (sp[i].end > sp[k - 1].end) sp[k - 1].end = sp[i].end;
            } else {
                sp[k++] = sp[i];
            }
        }
        m = k;
    }
    for (size_t t = 0; t < n; t++) {
        size_t b = offsets[t].begin, e = offsets[t].end;
        if (e < b) {
            free(sp);
            return at_error(AT_ERR_INVALID, "token %zu has reversed byte offsets [%zu, %zu)", t, b, e);
        }
        /* the last span starting at or before b (zero-width: strictly before) */
        size_t lo = 0, hi = m;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (b == e ? sp[mid].begin < b : sp[mid].begin <= b) lo = mid + 1;
            else hi = mid;
        }
        int inside = lo > 0 && e <= sp[lo - 1].end;
        labels[t] = inside ? ids[t] : AT_IGNORE_INDEX;
    }
    free(sp);
    return AT_OK;
}

at_status at_encode_truncate(at_encoded *e, size_t max_length, at_truncation t, int *dropped)
{
    *dropped = 0;
    if (max_length == 0 || e->n <= max_length) return AT_OK;
    switch (t) {
    case AT_TRUNCATE_DELETE:
        at_encoded_free(e);
        *dropped = 1;
        return AT_OK;
    case AT_TRUNCATE_LEFT: {
        size_t cut = e->n - max_length;
        memmove(e->ids, e->ids + cut, max_length * sizeof *e->ids);
        memmove(e->labels, e->labels + cut, max_length * sizeof *e->labels);
        e->n = max_length;
        return AT_OK;
    }
    case AT_TRUNCATE_RIGHT: e->n = max_length; return AT_OK;
    default: return at_error(AT_ERR_INVALID, "unknown truncation strategy %d", (int)t);
    }
}

static at_status tokenize_with_spans(const at_encoder *enc, const char *text, size_t len, const at_byte_span *spans,
                                     size_t n_spans, at_encoded *out)
{
    at_byte_span *off = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    at_status st = enc->tokenize(enc->tokenize_ctx, text, len, &ids, &off, &n);
    if (st != AT_OK) {
        free(ids);
        free(off);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        if (off[i].end > len || off[i].begin > off[i].end) {
            st = at_error(AT_ERR_INVALID, "tokenizer: token %zu covers bytes [%zu, %zu) of a %zu-byte text", i,
                          off[i].begin, off[i].end, len);
            break;
        }
    }
    int32_t *labels = st == AT_OK ? malloc((n ? n : 1) * sizeof *labels) : NULL;
    if (st == AT_OK && !labels) st = at_error(AT_ERR_NOMEM, "out of memory encoding");
    if (st == AT_OK) st = at_encode_labels(ids, off, n, spans, n_spans, labels);
    free(off);
    if (st != AT_OK) {
        free(ids);
        free(labels);
        return st;
    }
    *out = (at_encoded){ids, labels, n};
    return AT_OK;
}

at_status at_encode_sample(const at_encoder *enc, const at_sample *s, at_encoded *out, int *dropped)
{
    memset(out, 0, sizeof *out);
    *dropped = 0;
    at_status st = AT_OK;
    switch (s->kind) {
    case AT_SAMPLE_TOKENS: {
        size_t n = s->n_tokens;
        out->ids = malloc((n ? n : 1) * sizeof *out->ids);
        out->labels = malloc((n ? n : 1) * sizeof *out->labels);
        if (!out->ids || !out->labels) {
            at_encoded_free(out);
            return at_error(AT_ERR_NOMEM, "out of memory encoding");
        }
        memcpy(out->ids, s->input_ids, n * sizeof *out->ids);
        memcpy(out->labels, s->labels ? s->labels : s->input_ids, n * sizeof *out->labels);
        out->n = n;
        break;
    }
    case AT_SAMPLE_TEXT: {
        if (!enc->tokenize) return at_error(AT_ERR_INVALID, "%s:%d: no tokenizer to encode a text", s->source, s->line);
        size_t len = strlen(s->text);
        at_byte_span all = {0, len};
        st = tokenize_with_spans(enc, s->text, len, &all, 1, out);
        break;
    }
    case AT_SAMPLE_CONVERSATION: {
        if (!enc->render || !enc->tokenize)
            return at_error(AT_ERR_INVALID, "%s:%d: encoding a conversation needs a renderer and a tokenizer",
                            s->source ? s->source : "sample", s->line);
        char *text = NULL;
        size_t len = 0, n_spans = 0;
        at_byte_span *spans = NULL;
        st = enc->render(enc->render_ctx, s, &text, &len, &spans, &n_spans);
        for (size_t i = 0; st == AT_OK && i < n_spans; i++)
            if (spans[i].end > len || spans[i].begin > spans[i].end)
                st = at_error(AT_ERR_INVALID, "renderer: span %zu [%zu, %zu) outside a %zu-byte text", i,
                              spans[i].begin, spans[i].end, len);
        if (st == AT_OK) st = tokenize_with_spans(enc, text, len, spans, n_spans, out);
        free(text);
        free(spans);
        break;
    }
    default:
        return at_error(AT_ERR_INVALID, "%s:%d: a preference pair is encoded with at_encode_preference",
                        s->source ? s->source : "sample", s->line);
    }
    if (st != AT_OK) return st;
    return at_encode_truncate(out, enc->max_length, enc->truncation, dropped);
}

/* prompt ++ reply as a temporary conversation sample. */
static at_status encode_joined(const at_encoder *enc, const at_sample *s, const at_messages *reply, at_encoded *out,
                               int *dropped)
{
    size_t n = s->messages.n + reply->n;
    at_message *m = malloc((n ? n : 1) * sizeof *m);
    if (!m) return at_error(AT_ERR_NOMEM, "out of memory encoding");
    if (s->messages.n) memcpy(m, s->messages.items, s->messages.n * sizeof *m);
    if (reply->n) memcpy(m + s->messages.n, reply->items, reply->n * sizeof *m);
    at_sample c = *s;
    c.kind = AT_SAMPLE_CONVERSATION;
    c.messages = (at_messages){m, n};
    at_status st = at_encode_sample(enc, &c, out, dropped);
    free(m);
    return st;
}

at_status at_encode_preference(const at_encoder *enc, const at_sample *s, at_encoded *chosen, at_encoded *rejected,
                               int *dropped)
{
    memset(chosen, 0, sizeof *chosen);
    memset(rejected, 0, sizeof *rejected);
    *dropped = 0;
    if (s->kind != AT_SAMPLE_PREFERENCE)
        return at_error(AT_ERR_INVALID, "%s:%d: not a preference pair", s->source ? s->source : "sample", s->line);
    int d1 = 0, d2 = 0;
    AT_TRY(encode_joined(enc, s, &s->chosen, chosen, &d1));
    at_status st = encode_joined(enc, s, &s->rejected, rejected, &d2);
    if (st != AT_OK || d1 || d2) {
        at_encoded_free(chosen);
        at_encoded_free(rejected);
        *dropped = st == AT_OK;
    }
    return st;
}
