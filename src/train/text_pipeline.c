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
    /* ms-swift's --system: the default system message (the template's spans
     * then count one message more than the sample has) */
    int shift = 0;
    if (p->system && (s->messages.n == 0 || s->messages.items[0].role != AT_ROLE_SYSTEM)) {
        cJSON *sm = cJSON_CreateObject();
        if (!sm || !cJSON_AddStringToObject(sm, "role", "system") || !cJSON_AddStringToObject(sm, "content", p->system) ||
            !cJSON_InsertItemInArray(msgs, 0, sm)) {
            cJSON_Delete(sm);
            cJSON_Delete(msgs);
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        shift = 1;
    }
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
        int m = r.spans[i].message - shift;
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

/* Tokenizes text (special tokens written by the template become their ids)
 * and gives each token the bytes it decodes to, found by streaming decode:
 * it never splits a character, so a token ending inside one covers no bytes
 * and the next covers the whole character; a decoded space the text does not
 * have at that point (a dummy prefix) covers none. */
static at_status tokenize(void *ctx, const char *text, size_t len, int32_t **ids, at_byte_span **offsets, size_t *n)
{
    const at_text_pipeline *p = ctx;
    *ids = NULL;
    *offsets = NULL;
    *n = 0;
    int32_t *tok = NULL;
    size_t nt = 0;
    AT_TRY(at_tokenizer_encode(p->tok, text, len, AT_TOK_PARSE_SPECIAL, &tok, &nt));
    at_byte_span *off = malloc((nt ? nt : 1) * sizeof *off);
    at_tok_stream *s = NULL;
    at_status st = off ? at_tok_stream_new(p->tok, 0, &s) : at_error(AT_ERR_NOMEM, "out of memory");
    size_t pos = 0;
    for (size_t i = 0; st == AT_OK && i < nt; i++) {
        const char *out;
        size_t olen = 0;
        st = at_tok_stream_push(s, tok[i], &out, &olen);
        /* SentencePiece-style tokenizers give the text after a special token
         * a dummy "▁" prefix the text does not have: that decoded space
         * covers no byte (else every later span would start a byte late) */
        if (st == AT_OK && olen > 0 && out[0] == ' ' && (pos >= len || text[pos] != ' ')) olen--;
        off[i].begin = pos;
        pos = pos + olen > len ? len : pos + olen;
        off[i].end = pos;
    }
    at_tok_stream_free(s);
    if (st != AT_OK) {
        free(tok);
        free(off);
        return st;
    }
    *ids = tok;
    *offsets = off;
    *n = nt;
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
