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
    int cached;      /* of those, how many came from the prefix cache */
    int32_t pending; /* drawn, not yet in the cache (SLOT_DECODE) */
    at_gen_seq *seq;
    /* the prompt's images (copies; media.vision borrowed), NULL arrays: none */
    at_prompt_media media;
    float *feats;    /* host [image tokens, hidden] once computed (Qwen3-VL: then each deepstack layer's as many) */
    int encoded;     /* images run through the tower */
    /* what the cache rows hold, kept after the sequence ends (the prefix cache):
     * the adapter they were computed with; their keys are s->keys[b] */
    at_adapter *kv_adapter;
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
    int32_t *pos;      /* [B, chunk, 3] M-RoPE positions of a prefill */
    uint64_t *keys;    /* [B, max_seq]: the key of each cached token (at_prompt_media) */
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
    s->pos = malloc((size_t)max_batch * (size_t)s->chunk * 3 * sizeof *s->pos);
    s->keys = malloc((size_t)max_batch * (size_t)max_seq * sizeof *s->keys);
    s->n_new = malloc((size_t)max_batch * sizeof *s->n_new);
    s->events = malloc((size_t)max_batch * sizeof *s->events);
    if (!s->host || !s->slots || !s->ids || !s->pos || !s->keys || !s->n_new || !s->events)
        st = at_error(AT_ERR_NOMEM, "scheduler: out of memory");
done:
    if (st != AT_OK) {
        at_scheduler_free(s);
        return st;
    }
    *out = s;
    return AT_OK;
}

static void media_free(at_prompt_media *m)
{
    free((void *)m->pixels);
    free((void *)m->grid_thw);
    free((void *)m->keys);
    free((void *)m->mrope_pos);
    memset(m, 0, sizeof *m);
}

/* Frees the slot for the next sequence; its cache rows and their keys stay
 * (the prefix cache) unless `forget`. */
static void slot_clear(at_scheduler *s, int b, int forget)
{
    slot *sl = &s->slots[b];
    at_adapter *kv = sl->kv_adapter;
    at_gen_seq_free(sl->seq);
    free(sl->prompt);
    media_free(&sl->media);
    free(sl->feats);
    memset(sl, 0, sizeof *sl);
    sl->kv_adapter = kv;
    if (forget) at_kv_cache_reset_seq(s->cache, b);
}

void at_scheduler_free(at_scheduler *s)
{
    if (!s) return;
    if (s->slots)
        for (int b = 0; b < s->B; b++) slot_clear(s, b, 1);
    at_kv_cache_free(s->cache);
    at_tensor_free(s->logits);
    free(s->host);
    free(s->slots);
    free(s->ids);
    free(s->pos);
    free(s->keys);
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

/* Copies media m of an n-token prompt into *d. */
static at_status media_copy(at_prompt_media *d, const at_prompt_media *m, size_t n)
{
    memset(d, 0, sizeof *d);
    d->vision = m->vision;
    d->n_images = m->n_images;
    d->n_patches = m->n_patches;
    d->image_token = m->image_token;
    size_t px = 0;
    if (m->n_images) {
        const at_vision_config *vc = at_vision_get_config(m->vision);
        px = (size_t)m->n_patches * (size_t)vc->in_chans * (size_t)vc->temporal_patch_size *
             (size_t)vc->patch_size * (size_t)vc->patch_size;
    }
    void *pixels = px ? malloc(px * sizeof(float)) : NULL;
    void *grid = m->n_images ? malloc((size_t)m->n_images * sizeof *m->grid_thw) : NULL;
    void *keys = m->keys ? malloc(n * sizeof *m->keys) : NULL;
    void *pos = m->mrope_pos ? malloc(n * 3 * sizeof *m->mrope_pos) : NULL;
    d->pixels = pixels;
    d->grid_thw = grid;
    d->keys = keys;
    d->mrope_pos = pos;
    if ((px && !pixels) || (m->n_images && !grid) || (m->keys && !keys) || (m->mrope_pos && !pos)) {
        media_free(d);
        return at_error(AT_ERR_NOMEM, "scheduler: out of memory");
    }
    if (px) memcpy(pixels, m->pixels, px * sizeof(float));
    if (grid) memcpy(grid, m->grid_thw, (size_t)m->n_images * sizeof *m->grid_thw);
    if (keys) memcpy(keys, m->keys, n * sizeof *m->keys);
    if (pos) memcpy(pos, m->mrope_pos, n * 3 * sizeof *m->mrope_pos);
    return AT_OK;
}

static uint64_t prompt_key(const slot *sl, int i)
{
    return sl->media.keys ? sl->media.keys[i] : at_prompt_text_key(sl->prompt[i]);
}

at_status at_scheduler_add(at_scheduler *s, const int32_t *prompt, size_t n, const at_gen_params *p, void *user,
                           int *slot_out)
{
    return at_scheduler_add_media(s, prompt, n, NULL, p, user, slot_out);
}

at_status at_scheduler_add_media(at_scheduler *s, const int32_t *prompt, size_t n, const at_prompt_media *media,
                                 const at_gen_params *p, void *user, int *slot_out)
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
    /* the free slot whose cache shares the longest prefix with the prompt */
    int b = -1, keep = -1;
    for (int c = 0; c < s->B; c++) {
        const slot *sc = &s->slots[c];
        if (sc->state != SLOT_FREE && sc->state != SLOT_DONE) continue;
        int k = 0, len = sc->kv_adapter == p->adapter ? s->cache->len[c] : 0;
        const uint64_t *ck = s->keys + (size_t)c * (size_t)s->max_seq;
        while (k < len && (size_t)k < n - 1 &&
               ck[k] == (media && media->keys ? media->keys[k] : at_prompt_text_key(prompt[k])))
            k++;
        if (k > keep) b = c, keep = k;
    }
    if (b < 0) return at_error(AT_ERR_INVALID, "scheduler: all %d slots are in use", s->B);
    slot_clear(s, b, 0);
    slot *sl = &s->slots[b];
    at_status st = AT_OK;
    if (media) AT_CHECK(media_copy(&sl->media, media, n));
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
    sl->adapter = sl->kv_adapter = p->adapter;
    sl->state = SLOT_PREFILL;
    sl->prefilled = sl->cached = keep;
    s->cache->len[b] = keep;
    /* text positions follow the length (a kept prefix of text holds no image); explicit ones reset the delta */
    if (!sl->media.mrope_pos) s->cache->rope_delta[b] = 0;
    *slot_out = b;
done:
    if (st != AT_OK) slot_clear(s, b, 1);
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
    e->cached_tokens = s->slots[b].cached;
    e->images_encoded = s->slots[b].encoded;
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

/* The image tokens among prompt[from, to) of slot sl. */
static size_t image_tokens(const slot *sl, int from, int to)
{
    size_t k = 0;
    for (int i = from; sl->media.n_images && i < to; i++) k += sl->prompt[i] == sl->media.image_token;
    return k;
}

/* The prefill's extras (want_prefill: the slots' chunks start at their
 * prefilled tokens): M-RoPE positions, and the features of the image tokens
 * of the chunks, slot by slot (computed on first need), in *ft, and
 * Qwen3-VL's deepstack features of the same tokens, layer by layer, in *dt
 * (caller frees both). */
static at_status prefill_extra(at_scheduler *s, int T, const int *n_new, at_prefill_extra *ex, at_tensor **ft,
                               at_tensor **dt)
{
    int64_t hd = s->d->cfg.hidden_size;
    size_t rows = 0;
    int nds = 0; /* deepstack layers: one model, so the same for every slot */
    for (int b = 0; b < s->B; b++) {
        slot *sl = &s->slots[b];
        if (!n_new[b] || !image_tokens(sl, sl->prefilled, sl->prefilled + n_new[b])) continue;
        rows += image_tokens(sl, sl->prefilled, sl->prefilled + n_new[b]);
        const at_vision_config *vc = at_vision_get_config(sl->media.vision);
        nds = (int)at_vision_feature_rows(vc, 1) - 1;
        if (!sl->feats) {
            int64_t r, c;
            AT_TRY(at_prompt_media_features(&sl->media, &sl->feats, &r, &c));
            sl->encoded += sl->media.n_images;
        }
    }
    if (at_decoder_pos_width(s->d) == 3) {
        for (int b = 0; b < s->B; b++) {
            const slot *sl = &s->slots[b];
            for (int t = 0; t < n_new[b]; t++)
                for (int k = 0; k < 3; k++)
                    s->pos[((size_t)b * T + t) * 3 + k] =
                        sl->media.mrope_pos ? sl->media.mrope_pos[(size_t)(sl->prefilled + t) * 3 + k]
                                            : s->cache->len[b] + s->cache->rope_delta[b] + t;
        }
        ex->mrope_pos = s->pos;
    }
    if (!rows) return AT_OK;
    float *h = malloc((size_t)(1 + nds) * rows * (size_t)hd * sizeof *h);
    if (!h) return at_error(AT_ERR_NOMEM, "scheduler: out of memory");
    /* section l (0: the features, 1 + j: deepstack layer j) of every slot's chunk, slot by slot */
    for (int l = 0, at = 0; l <= nds; l++)
        for (int b = 0; b < s->B; b++) {
            const slot *sl = &s->slots[b];
            size_t k = n_new[b] ? image_tokens(sl, sl->prefilled, sl->prefilled + n_new[b]) : 0;
            if (!k) continue;
            size_t before = image_tokens(sl, 0, sl->prefilled), all = image_tokens(sl, 0, sl->n_prompt);
            memcpy(h + (size_t)at * (size_t)hd, sl->feats + ((size_t)l * all + before) * (size_t)hd,
                   k * (size_t)hd * sizeof *h);
            at += (int)k;
        }
    int64_t sh[2] = {(int64_t)rows, hd}, sd[2] = {(int64_t)rows * nds, hd};
    at_status st = at_tensor_new(s->d->be, AT_F32, 2, sh, "scheduler.features", ft);
    if (st == AT_OK) st = at_tensor_upload(*ft, h, rows * (size_t)hd * sizeof *h);
    if (st == AT_OK && nds) st = at_tensor_new(s->d->be, AT_F32, 2, sd, "scheduler.deepstack", dt);
    if (st == AT_OK && nds) st = at_tensor_upload(*dt, h + rows * (size_t)hd, (size_t)sd[0] * (size_t)hd * sizeof *h);
    free(h);
    ex->deepstack = *dt;
    ex->n_deepstack = nds;
    ex->features = *ft;
    ex->feature_token = s->slots[0].media.image_token;
    for (int b = 0; b < s->B; b++)
        if (s->slots[b].media.n_images) ex->feature_token = s->slots[b].media.image_token;
    return st;
}

/* One decoder call for the slots with n_new[b] > 0, which all use `adapter`
 * (ids [B, T]); others are untouched. Records the keys of the new cache rows. */
static at_status forward(at_scheduler *s, at_adapter *adapter, int T, int *n_new, int want_prefill)
{
    at_prefill_extra ex = {0};
    at_tensor *ft = NULL, *dt = NULL;
    at_status st = want_prefill ? prefill_extra(s, T, n_new, &ex, &ft, &dt) : AT_OK;
    for (int b = 0; st == AT_OK && b < s->B; b++) {
        const slot *sl = &s->slots[b];
        uint64_t *ck = s->keys + (size_t)b * (size_t)s->max_seq + s->cache->len[b];
        for (int t = 0; t < n_new[b]; t++)
            ck[t] = want_prefill ? prompt_key(sl, sl->prefilled + t) : at_prompt_text_key(sl->pending);
    }
    if (st == AT_OK) st = at_decoder_set_adapter(s->d, adapter);
    if (st == AT_OK) st = at_decoder_prefill_ex(s->d, s->cache, s->ids, T, n_new, s->logits, 0, &ex);
    (void)at_decoder_set_adapter(s->d, NULL);
    at_tensor_free(ft);
    at_tensor_free(dt);
    if (st == AT_OK)
        st = at_tensor_download(s->logits, s->host, (size_t)s->B * (size_t)s->V * sizeof *s->host);
    return st;
}

/* Fails every slot of a call that failed; their caches are forgotten. */
static void fail_call(at_scheduler *s, const int *n_new)
{
    for (int b = 0; b < s->B; b++)
        if (n_new[b] > 0) {
            at_kv_cache_reset_seq(s->cache, b);
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
        at_status st = forward(s, ad, T, s->n_new, want_prefill);
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
        if (s->slots[b].state == SLOT_DONE) slot_clear(s, b, 0);
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
