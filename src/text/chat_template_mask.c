/* Assistant spans for loss masks, by rendering prefixes of the conversation
 * (the method is described at at_chat_template_render in chat_template.h).
 * tools/make_template_goldens.py implements the same rule in Python over
 * Jinja2's output; the tests compare the two. */
#include <stdlib.h>
#include <string.h>
#include "text/chat_template_internal.h"

/* Common prefix length of a and b, backed off to a UTF-8 character start so
 * spans never split a character. */
static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    while (i > 0 && i < na && ((unsigned char)a[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Longest k with u[nu-k..nu) == v[0..k). */
static size_t suffix_prefix_overlap(const char *u, size_t nu, const char *v, size_t nv)
{
    for (size_t k = nu < nv ? nu : nv; k > 0; k--)
        if (memcmp(u + nu - k, v, k) == 0) return k;
    return 0;
}

/* The message's final content: after the last "</think>", stripped of
 * whitespace. Empty when the content is not a string. */
static void content_core(const cJSON *msg, const char **core, size_t *len)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    *core = "";
    *len = 0;
    if (!cJSON_IsString(c)) return;
    const char *s = c->valuestring, *p;
    while ((p = strstr(s, "</think>")) != NULL) s = p + 8;
    size_t n = strlen(s);
    /* Python's str.strip(): ASCII whitespace is what chat contents carry */
    while (n && strchr(" \t\n\r\v\f", s[n - 1])) n--;
    while (n && strchr(" \t\n\r\v\f", *s)) {
        s++;
        n--;
    }
    *core = s;
    *len = n;
}

/* Last occurrence of needle in hay[0..n), or NULL. */
static const char *last_occurrence(const char *hay, size_t n, const char *needle, size_t nn)
{
    const char *last = NULL, *p = hay;
    size_t left = n;
    while (nn <= left) {
        const char *h = memmem(p, left, needle, nn);
        if (!h) break;
        last = h;
        left -= (size_t)(h + 1 - p);
        p = h + 1;
    }
    return last;
}

/* A common prefix can end inside a tag: "<|" is shared by "<|endoftext|>"
 * and "<|user|>", "<t" by "<think>" and "<tool_call>". When text[s..e) has,
 * after the content, a '<' or '[' without its closing bracket, the span ends
 * before it. */
static size_t cut_partial_tag(const char *text, size_t s, size_t e, const char *core, size_t ncore)
{
    size_t tail = s;
    if (ncore) {
        const char *k = last_occurrence(text + s, e - s, core, ncore);
        if (k) tail = (size_t)(k - text) + ncore;
    }
    static const char pairs[2][2] = {{'<', '>'}, {'[', ']'}};
    for (int b = 0; b < 2; b++) {
        for (size_t k = e; k > tail; k--) {
            if (text[k - 1] != pairs[b][0]) continue;
            if (!memchr(text + k - 1, pairs[b][1], e - (k - 1))) e = k - 1;
            break;
        }
    }
    return e;
}

static int span_ok(const char *full, size_t s, size_t e, const char *core, size_t ncore)
{
    if (e <= s) return 0;
    if (ncore == 0) return 1;
    return e - s >= ncore && memmem(full + s, e - s, core, ncore) != NULL;
}

at_status at_chat_find_spans(const at_chat_template *ct, const cJSON *messages, const at_chat_render_opts *opt,
                             const char *full, size_t full_len, at_chat_span **spans, size_t *n_spans)
{
    *spans = NULL;
    *n_spans = 0;
    int n = cJSON_GetArraySize(messages), last = -1, count = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, i), "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) {
            last = i;
            count++;
        }
    }
    if (count == 0) return AT_OK;
    if (opt->mask == AT_CHAT_MASK_LAST) count = 1;
    at_chat_span *out = calloc((size_t)count, sizeof *out);
    if (!out) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    char *p = NULL, *q = NULL;
    size_t np = 0, nq = 0, k = 0;
    const cJSON *m = messages->child;
    for (int i = 0; i < n; i++, m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant") != 0) continue;
        if (opt->mask == AT_CHAT_MASK_LAST && i != last) continue;
        st = at_chat_render_prefix(ct, messages, i, opt, 1, &p, &np);
        if (st != AT_OK) {
            at_error_wrap(st, "loss mask: rendering the conversation before message %d", i);
            goto done;
        }
        size_t s = common_prefix(p, np, full, full_len);
        st = at_chat_render_prefix(ct, messages, i + 1, opt, 0, &q, &nq);
        if (st != AT_OK) {
            at_error_wrap(st, "loss mask: rendering the conversation up to message %d", i);
            goto done;
        }
        if (common_prefix(q, nq, full, full_len) < s) {
            st = at_error(AT_ERR_UNSUPPORTED, "loss mask: message %d: the text before the turn differs when it is "
                                              "the last message; this template cannot be masked by prefixes", i);
            goto done;
        }
        const char *core;
        size_t ncore;
        content_core(m, &core, &ncore);
        size_t e = cut_partial_tag(full, s, s + common_prefix(q + s, nq - s, full + s, full_len - s), core, ncore);
        if (!span_ok(full, s, e, core, ncore)) {
            e = s + suffix_prefix_overlap(q + s, nq - s, full + s, full_len - s);
            if (!span_ok(full, s, e, core, ncore)) {
                st = at_error(AT_ERR_UNSUPPORTED, "loss mask: message %d: cannot locate the assistant turn in the "
                                                  "rendered text (the template rewrites it depending on later "
                                                  "messages)", i);
                goto done;
            }
        }
        /* the previous message's content inside the span, and not before it:
         * the turn's start moved because the template renders earlier
         * messages differently once later ones exist (Mistral puts the system
         * prompt into the last user message only) */
        if (i > 0) {
            const char *pc;
            size_t npc;
            content_core(cJSON_GetArrayItem(messages, i - 1), &pc, &npc);
            if (npc && memmem(full + s, e - s, pc, npc) && !memmem(full, s, pc, npc)) {
                st = at_error(AT_ERR_UNSUPPORTED, "loss mask: message %d: the span would swallow message %d; the "
                                                  "template renders earlier messages differently depending on later "
                                                  "ones", i, i - 1);
                goto done;
            }
        }
        if (k > 0 && s < out[k - 1].end) {
            st = at_error(AT_ERR_UNSUPPORTED, "loss mask: message %d: assistant spans overlap", i);
            goto done;
        }
        out[k].start = s;
        out[k].end = e;
        out[k].message = i;
        k++;
        free(p);
        free(q);
        p = q = NULL;
    }
    *spans = out;
    *n_spans = k;
    out = NULL;
done:
    free(p);
    free(q);
    free(out);
    return st;
}
