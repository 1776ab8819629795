#include "train/preview.h"

#include <stdlib.h>
#include <string.h>
#include "model/kv_cache.h"

/* Index of the largest logit (the first on ties). */
static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static at_status answer_one(at_decoder *d, const at_text_pipeline *p, const char *prompt, int max_tokens, FILE *out)
{
    cJSON *msgs = cJSON_CreateArray();
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt);
    cJSON_AddItemToArray(msgs, m);
    int32_t *ids = NULL;
    size_t n = 0;
    at_kv_cache *cache = NULL;
    at_tensor *logits = NULL;
    at_tok_stream *stream = NULL;
    float *host = NULL;
    int64_t V = d->cfg.vocab_size;
    at_status st = at_text_pipeline_prompt(p, msgs, &ids, &n);
    cJSON_Delete(msgs);
    if (st != AT_OK) return st;
    int max_seq = (int)n + max_tokens + 1;
    int64_t shape[2] = {1, V};
    AT_CHECK(at_kv_cache_new(&d->cfg, d->be, AT_F32, 1, max_seq, &cache));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, shape, "preview logits", &logits));
    AT_CHECK(at_tok_stream_new(p->tok, 1, &stream));
    host = malloc((size_t)V * sizeof *host);
    if (!host) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    AT_CHECK(at_decoder_prefill(d, cache, ids, (int)n, NULL, logits, 0));
    fprintf(out, "  Q: %s\n  A: ", prompt);
    int started = 0; /* the answer's leading spaces are not printed (the decoder may or may not keep them) */
    int32_t eos = at_tokenizer_eos(p->tok);
    for (int i = 0; i < max_tokens; i++) {
        AT_CHECK(at_tensor_download(logits, host, (size_t)V * sizeof *host));
        int32_t next = argmax(host, V);
        if (next == eos) break;
        const char *text;
        size_t len;
        AT_CHECK(at_tok_stream_push(stream, next, &text, &len));
        for (size_t k = 0; k < len; k++) {
            char ch = text[k] == '\n' ? ' ' : text[k];
            if (!started && ch == ' ') continue;
            started = 1;
            fputc(ch, out);
        }
        if (i + 1 < max_tokens) AT_CHECK(at_decoder_decode_step(d, cache, &next, NULL, logits));
    }
    fputc('\n', out);
    fflush(out);
done:
    free(host);
    at_tok_stream_free(stream);
    at_tensor_free(logits);
    at_kv_cache_free(cache);
    free(ids);
    return st;
}

at_status at_preview_answers(at_decoder *d, const at_text_pipeline *p, const char *const *prompts, int n,
                             int max_tokens, FILE *out)
{
    for (int i = 0; i < n; i++) AT_TRY(answer_one(d, p, prompts[i], max_tokens, out));
    return AT_OK;
}
