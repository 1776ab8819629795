#include "train/text_pipeline.h"

#include <stdlib.h>
#include <string.h>

at_status at_text_pipeline_init(at_text_pipeline *p, const at_tokenizer *tok, const at_chat_template *tmpl,
                                int last_turn_only)
{
    memset(p, 0, sizeof *p);
    p->tok = tok;
    p->tmpl = tmpl;
    p->mask = last_turn_only ? AT_CHAT_MASK_LAST : AT_CHAT_MASK_ALL;
    return AT_OK;
}

void at_text_pipeline_free(at_text_pipeline *p) { memset(p, 0, sizeof *p); }

static at_status render(void *ctx, const at_sample *s, char **text, size_t *len, at_byte_span **spans,
                        size_t *n_spans)
{
    at_text_pipeline *p = ctx;
    *text = NULL;
    *spans = NULL;
    *n_spans = 0;
    if (!p->tmpl)
        return at_error(AT_ERR_INVALID, "%s:%d: a conversation needs a chat template (the model has none: use --template)",
                        s->source, s->line);
    cJSON *msgs = NULL;
    AT_TRY(at_messages_to_json(&s->messages, &msgs));
    cJSON *tools = s->tools ? cJSON_Parse(s->tools) : NULL;
    at_chat_render_opts o = {0};
    o.tools = tools;
    o.mask = p->mask;
    at_chat_rendered r;
    at_status st = at_chat_template_render(p->tmpl, msgs, &o, &r);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    if (st != AT_OK) return at_error_wrap(st, "%s:%d", s->source, s->line);
    at_byte_span *sp = malloc((r.n_spans ? r.n_spans : 1) * sizeof *sp);
    if (!sp) {
        at_chat_rendered_free(&r);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < r.n_spans; i++) {
        /* A message marked loss=false in the data (ms-swift's "loss" key) is not trained. */
        int m = r.spans[i].message;
        if (m >= 0 && (size_t)m < s->messages.n && !s->messages.items[m].loss) continue;
        sp[k].begin = r.spans[i].start;
        sp[k].end = r.spans[i].end;
        k++;
    }
    *text = r.text;
    *len = r.len;
    r.text = NULL;
    at_chat_rendered_free(&r);
    *spans = sp;
    *n_spans = k;
    return AT_OK;
}

typedef struct {
    int32_t *ids;
    at_byte_span *off;
    size_t n, cap;
} token_list;

static at_status push_token(token_list *l, int32_t id, size_t b, size_t e)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        int32_t *ni = realloc(l->ids, nc * sizeof *ni);
        if (!ni) return at_error(AT_ERR_NOMEM, "out of memory");
        l->ids = ni;
        at_byte_span *no = realloc(l->off, nc * sizeof *no);
        if (!no) return at_error(AT_ERR_NOMEM, "out of memory");
        l->off = no;
        l->cap = nc;
    }
    l->ids[l->n] = id;
    l->off[l->n].begin = b;
    l->off[l->n].end = e;
    l->n++;
    return AT_OK;
}

/* Tokenizes text[start, end) (special tokens written by the template become
 * their ids) and gives each token the bytes it decodes to,
 * found by streaming decode (which never splits a character, so a token
 * ending inside one covers no bytes and the next covers the whole character). */
static at_status tokenize_piece(const at_text_pipeline *p, const char *text, size_t start, size_t end, token_list *l)
{
    if (end <= start) return AT_OK;
    int32_t *ids = NULL;
    size_t n = 0;
    AT_TRY(at_tokenizer_encode(p->tok, text + start, end - start, AT_TOK_PARSE_SPECIAL, &ids, &n));
    at_tok_stream *s = NULL;
    at_status st = at_tok_stream_new(p->tok, 0, &s);
    size_t pos = start;
    for (size_t i = 0; st == AT_OK && i < n; i++) {
        const char *out;
        size_t olen = 0;
        st = at_tok_stream_push(s, ids[i], &out, &olen);
        if (st != AT_OK) break;
        size_t b = pos, e = pos + olen > end ? end : pos + olen;
        st = push_token(l, ids[i], b, e);
        pos = e;
    }
    at_tok_stream_free(s);
    free(ids);
    return st;
}

static at_status tokenize(void *ctx, const char *text, size_t len, int32_t **ids, at_byte_span **offsets, size_t *n)
{
    at_text_pipeline *p = ctx;
    token_list l = {0};
    at_status st = tokenize_piece(p, text, 0, len, &l);
    if (st != AT_OK) {
        free(l.ids);
        free(l.off);
        return st;
    }
    *ids = l.ids;
    *offsets = l.off;
    *n = l.n;
    return AT_OK;
}

void at_text_pipeline_encoder(at_text_pipeline *p, at_encoder *enc)
{
    memset(enc, 0, sizeof *enc);
    enc->render = render;
    enc->render_ctx = p;
    enc->tokenize = tokenize;
    enc->tokenize_ctx = p;
}

at_status at_text_pipeline_prompt(const at_text_pipeline *p, const cJSON *messages, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!p->tmpl) return at_error(AT_ERR_INVALID, "no chat template to render the prompt with");
    at_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    at_chat_rendered r;
    AT_TRY(at_chat_template_render(p->tmpl, messages, &o, &r));
    at_byte_span *off = NULL;
    at_status st = tokenize((void *)p, r.text, r.len, ids, &off, n);
    free(off);
    at_chat_rendered_free(&r);
    return st;
}
