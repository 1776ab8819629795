#include "infer/scheduler.h"

#include <stdlib.h>
#include <string.h>

/* A prefill call computes every slot's rows (B · T, padding included):
 * prompts go in pieces of T = min(512, 2048 / B) tokens (at least 32) per
 * step, which bounds the decoder's scratch memory and the pause the other
 * sequences see. */
static int prefill_chunk(int B)
{
    int t = 2048 / B;
    return t > 512 ? 512 : t < 32 ? 32 : t;
}

typedef enum { SLOT_FREE = 0, SLOT_PREFILL, SLOT_DECODE, SLOT_DONE } slot_state;

typedef struct {
    slot_state state;
    int cancel;
    void *user;
    at_adapter *adapter;
    int32_t *prompt;
    int n_prompt;
    int prefilled;   /* prompt tokens in the cache */
    int32_t pending; /* drawn, not yet in the cache (SLOT_DECODE) */
    at_gen_seq *seq;
} slot;

struct at_scheduler {
    at_decoder *d;
    const at_tokenizer *tok;
    int B, max_seq, V, chunk;
    at_kv_cache *cache;
    at_tensor *logits; /* f32 [B, V] */
    float *host;       /* [B, V] */
    slot *slots;
    int32_t *ids;      /* [B, chunk] */
    int *n_new;        /* [B] */
    at_sched_event *events;
    int n_events;
};

at_status at_scheduler_new(at_decoder *d, const at_tokenizer *tok, int max_batch, int max_seq, at_scheduler **out)
{
    *out = NULL;
    if (max_batch < 1 || max_seq < 2)
        return at_error(AT_ERR_INVALID, "scheduler: max_batch %d, max_seq %d", max_batch, max_seq);
    at_scheduler *s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "scheduler: out of memory");
    at_status st = AT_OK;
    s->d = d;
    s->tok = tok;
    s->B = max_batch;
    s->max_seq = max_seq;
    s->V = d->cfg.vocab_size;
    s->chunk = prefill_chunk(max_batch);
    int64_t sh[2] = {max_batch, s->V};
    AT_CHECK(at_kv_cache_new(&d->cfg, d->be, AT_F32, max_batch, max_seq, &s->cache));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "scheduler.logits", &s->logits));
    s->host = malloc((size_t)max_batch * (size_t)s->V * sizeof *s->host);
    s->slots = calloc((size_t)max_batch, sizeof *s->slots);
    s->ids = malloc((size_t)max_batch * (size_t)s->chunk * sizeof *s->ids);
    s->n_new = malloc((size_t)max_batch * sizeof *s->n_new);
    s->events = malloc((size_t)max_batch * sizeof *s->events);
    if (!s->host || !s->slots || !s->ids || !s->n_new || !s->events)
        st = at_error(AT_ERR_NOMEM, "scheduler: out of memory");
done:
    if (st != AT_OK) {
        at_scheduler_free(s);
        return st;
    }
    *out = s;
    return AT_OK;
}

static void slot_clear(at_scheduler *s, int b)
{
    slot *sl = &s->slots[b];
    at_gen_seq_free(sl->seq);
    free(sl->prompt);
    memset(sl, 0, sizeof *sl);
    at_kv_cache_reset_seq(s->cache, b);
}

void at_scheduler_free(at_scheduler *s)
{
    if (!s) return;
    if (s->slots)
        for (int b = 0; b < s->B; b++) slot_clear(s, b);
    at_kv_cache_free(s->cache);
    at_tensor_free(s->logits);
    free(s->host);
    free(s->slots);
    free(s->ids);
    free(s->n_new);
    free(s->events);
    free(s);
}

int at_scheduler_capacity(const at_scheduler *s) { return s->B; }
int at_scheduler_max_seq(const at_scheduler *s) { return s->max_seq; }

int at_scheduler_in_use(const at_scheduler *s)
{
    int n = 0;
    for (int b = 0; b < s->B; b++) n += s->slots[b].state != SLOT_FREE && s->slots[b].state != SLOT_DONE;
    return n;
}

at_status at_scheduler_add(at_scheduler *s, const int32_t *prompt, size_t n, const at_gen_params *p, void *user,
                           int *slot_out)
{
    *slot_out = -1;
    if (n < 1) return at_error(AT_ERR_INVALID, "scheduler: empty prompt");
    if (n > (size_t)s->max_seq - 1)
        return at_error(AT_ERR_INVALID, "scheduler: the prompt has %zu tokens; the context holds %d", n,
                        s->max_seq);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= s->V)
            return at_error(AT_ERR_INVALID, "scheduler: token id %d at %zu is outside the vocabulary of %d",
                            prompt[i], i, s->V);
    int b = 0;
    while (b < s->B && s->slots[b].state != SLOT_FREE && s->slots[b].state != SLOT_DONE) b++;
    if (b == s->B) return at_error(AT_ERR_INVALID, "scheduler: all %d slots are in use", s->B);
    if (s->slots[b].state == SLOT_DONE) slot_clear(s, b);
    slot *sl = &s->slots[b];
    at_status st = AT_OK;
    AT_CHECK(at_gen_seq_new(s->tok, s->V, p, &sl->seq));
    AT_CHECK(at_gen_seq_start(sl->seq, prompt, n));
    sl->prompt = malloc(n * sizeof *prompt);
    if (!sl->prompt) {
        st = at_error(AT_ERR_NOMEM, "scheduler: out of memory");
        goto done;
    }
    memcpy(sl->prompt, prompt, n * sizeof *prompt);
    sl->n_prompt = (int)n;
    sl->user = user;
    sl->adapter = p->adapter;
    sl->state = SLOT_PREFILL;
    at_kv_cache_reset_seq(s->cache, b);
    *slot_out = b;
done:
    if (st != AT_OK) slot_clear(s, b);
    return st;
}

void at_scheduler_cancel(at_scheduler *s, int b)
{
    if (b >= 0 && b < s->B && s->slots[b].state != SLOT_FREE) s->slots[b].cancel = 1;
}

static at_sched_event *event_for(at_scheduler *s, int b)
{
    for (int i = 0; i < s->n_events; i++)
        if (s->events[i].slot == b) return &s->events[i];
    at_sched_event *e = &s->events[s->n_events++];
    memset(e, 0, sizeof *e);
    e->slot = b;
    e->user = s->slots[b].user;
    e->token = -1;
    e->prompt_tokens = s->slots[b].n_prompt;
    return e;
}

/* Fills the event of slot b with the text and state of its sequence. */
static void report(at_scheduler *s, int b)
{
    slot *sl = &s->slots[b];
    at_sched_event *e = event_for(s, b);
    at_gen_seq_take_text(sl->seq, &e->text, &e->len);
    e->finish = at_gen_seq_finished(sl->seq);
    e->completion_tokens = at_gen_seq_tokens(sl->seq);
    if (e->finish != AT_FINISH_NONE) sl->state = SLOT_DONE;
}

/* Draws the next token of slot b from its row of logits. */
static void draw(at_scheduler *s, int b)
{
    slot *sl = &s->slots[b];
    int32_t tok = -1;
    at_finish_reason f = AT_FINISH_NONE;
    at_status st = at_gen_seq_next(sl->seq, s->host + (size_t)b * s->V, s->max_seq - s->cache->len[b], &tok, &f);
    if (st != AT_OK) at_gen_seq_finish(sl->seq, AT_FINISH_ERROR);
    event_for(s, b)->token = tok;
    sl->pending = tok;
    sl->state = SLOT_DECODE;
    report(s, b);
}

/* One decoder call for the slots with n_new[b] > 0, which all use `adapter`
 * (ids [B, T]); others are untouched. */
static at_status forward(at_scheduler *s, at_adapter *adapter, int T, int *n_new)
{
    at_status st = at_decoder_set_adapter(s->d, adapter);
    if (st == AT_OK) st = at_decoder_prefill(s->d, s->cache, s->ids, T, n_new, s->logits, 0);
    (void)at_decoder_set_adapter(s->d, NULL);
    if (st == AT_OK)
        st = at_tensor_download(s->logits, s->host, (size_t)s->B * (size_t)s->V * sizeof *s->host);
    return st;
}

/* Fails every slot of a call that failed. */
static void fail_call(at_scheduler *s, const int *n_new)
{
    for (int b = 0; b < s->B; b++)
        if (n_new[b] > 0) {
            at_gen_seq_finish(s->slots[b].seq, AT_FINISH_ERROR);
            report(s, b);
        }
}

/* The decoder calls of one phase (decode: want_prefill 0), one per adapter. */
static at_status run_phase(at_scheduler *s, int want_prefill)
{
    at_status first = AT_OK;
    slot_state want = want_prefill ? SLOT_PREFILL : SLOT_DECODE;
    unsigned char *done = calloc((size_t)s->B, 1);
    if (!done) return at_error(AT_ERR_NOMEM, "scheduler: out of memory");
    for (;;) {
        /* the adapter of the first slot not yet run, and every slot sharing it */
        at_adapter *ad = NULL;
        int any = 0, T = 1;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            if (sl->state != want || done[b] || (any && sl->adapter != ad)) continue;
            if (!any) ad = sl->adapter;
            any = 1;
            if (want_prefill) {
                int rest = sl->n_prompt - sl->prefilled;
                if (rest > T) T = rest < s->chunk ? rest : s->chunk;
            }
        }
        if (!any) break;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            s->n_new[b] = 0;
            if (sl->state != want || done[b] || sl->adapter != ad) continue;
            done[b] = 1;
            if (want_prefill) {
                int rest = sl->n_prompt - sl->prefilled, k = rest < T ? rest : T;
                memcpy(s->ids + (size_t)b * T, sl->prompt + sl->prefilled, (size_t)k * sizeof *s->ids);
                s->n_new[b] = k;
            } else {
                s->ids[b] = sl->pending;
                s->n_new[b] = 1;
            }
        }
        at_status st = forward(s, ad, T, s->n_new);
        if (st != AT_OK) {
            if (first == AT_OK) first = st;
            fail_call(s, s->n_new);
            continue;
        }
        for (int b = 0; b < s->B; b++) {
            if (!s->n_new[b]) continue;
            slot *sl = &s->slots[b];
            if (want_prefill) {
                sl->prefilled += s->n_new[b];
                if (sl->prefilled == sl->n_prompt) draw(s, b);
            } else {
                draw(s, b);
            }
        }
    }
    free(done);
    return first;
}

at_status at_scheduler_step(at_scheduler *s, const at_sched_event **events, int *n_events)
{
    s->n_events = 0;
    for (int b = 0; b < s->B; b++)
        if (s->slots[b].state == SLOT_DONE) slot_clear(s, b);
    for (int b = 0; b < s->B; b++) {
        slot *sl = &s->slots[b];
        if (sl->state != SLOT_FREE && sl->cancel) {
            at_gen_seq_finish(sl->seq, AT_FINISH_CANCELLED);
            report(s, b);
        }
    }
    at_status st = run_phase(s, 0);
    at_status st2 = run_phase(s, 1);
    *events = s->events;
    *n_events = s->n_events;
    return st != AT_OK ? st : st2;
}
