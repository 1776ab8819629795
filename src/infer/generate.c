#include "infer/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *at_finish_reason_name(at_finish_reason r)
{
    switch (r) {
    case AT_FINISH_STOP: return "stop";
    case AT_FINISH_LENGTH: return "length";
    case AT_FINISH_CANCELLED: return "cancelled";
    case AT_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

at_gen_params at_gen_params_default(void)
{
    at_gen_params p;
    memset(&p, 0, sizeof p);
    p.sampling = at_sampling_defaults();
    return p;
}

/* A growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 1;
}

struct at_gen_seq {
    const at_tokenizer *tok;
    int vocab;
    at_gen_params p;
    char *stop[AT_GEN_MAX_STOP];
    size_t stop_len[AT_GEN_MAX_STOP];
    int32_t *stop_ids;
    at_sampler *sampler;
    at_tok_stream *stream;
    buf held;    /* text not yet released: it may begin a stop string */
    buf out;     /* every released byte */
    size_t taken; /* out[0..taken) was handed out by take_text */
    int32_t *ids;
    int n_ids, cap_ids;
    at_finish_reason fin;
};

void at_gen_seq_free(at_gen_seq *g)
{
    if (!g) return;
    for (int i = 0; i < g->p.n_stop; i++) free(g->stop[i]);
    free(g->stop_ids);
    at_sampler_free(g->sampler);
    at_tok_stream_free(g->stream);
    free(g->held.p);
    free(g->out.p);
    free(g->ids);
    free(g);
}

at_status at_gen_seq_new(const at_tokenizer *tok, int vocab, const at_gen_params *p, at_gen_seq **out)
{
    *out = NULL;
    if (p->n_stop < 0 || p->n_stop > AT_GEN_MAX_STOP)
        return at_error(AT_ERR_INVALID, "at most %d stop strings (got %d)", AT_GEN_MAX_STOP, p->n_stop);
    if (p->n_stop_ids < 0) return at_error(AT_ERR_INVALID, "negative number of stop tokens");
    at_gen_seq *g = calloc(1, sizeof *g);
    if (!g) return at_error(AT_ERR_NOMEM, "generate: out of memory");
    at_status st = AT_OK;
    g->tok = tok;
    g->vocab = vocab;
    g->p = *p;
    g->p.stop = NULL;
    g->p.stop_ids = NULL;
    int n_stop = p->n_stop;
    g->p.n_stop = 0;
    for (int i = 0; i < n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0]) continue; /* an empty stop string would stop at once */
        g->stop[g->p.n_stop] = strdup(p->stop[i]);
        if (!g->stop[g->p.n_stop]) {
            st = at_error(AT_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        g->stop_len[g->p.n_stop] = strlen(p->stop[i]);
        g->p.n_stop++;
    }
    if (p->n_stop_ids) {
        g->stop_ids = malloc((size_t)p->n_stop_ids * sizeof *g->stop_ids);
        if (!g->stop_ids) {
            st = at_error(AT_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        memcpy(g->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *g->stop_ids);
    }
    AT_CHECK(at_sampler_new(&p->sampling, vocab, &g->sampler));
    AT_CHECK(at_tok_stream_new(tok, 1, &g->stream));
done:
    if (st != AT_OK) {
        at_gen_seq_free(g);
        return st;
    }
    *out = g;
    return AT_OK;
}

at_status at_gen_seq_start(at_gen_seq *g, const int32_t *prompt, size_t n)
{
    at_sampler_reset(g->sampler, prompt, n);
    at_tok_stream_free(g->stream);
    g->stream = NULL;
    AT_TRY(at_tok_stream_new(g->tok, 1, &g->stream));
    for (size_t i = 0; g->p.continues_prompt && i < n; i++)
        if (!at_tokenizer_is_special(g->tok, prompt[i])) {
            at_tok_stream_continue(g->stream);
            break;
        }
    g->held.len = g->out.len = g->taken = 0;
    g->n_ids = 0;
    g->fin = AT_FINISH_NONE;
    return AT_OK;
}

static int release(at_gen_seq *g, size_t n)
{
    if (!buf_add(&g->out, g->held.p, n)) return 0;
    /* nothing held yet: held.p may be NULL (memmove of NULL is undefined even for 0 bytes) */
    if (g->held.len > n) memmove(g->held.p, g->held.p + n, g->held.len - n);
    g->held.len -= n;
    return 1;
}

/* Looks for a stop string in the held text: on a match releases what comes
 * before it and returns 1; otherwise releases all but the longest tail that
 * begins some stop string, and returns 0. */
static int scan_stops(at_gen_seq *g, int *oom)
{
    const char *h = g->held.p ? g->held.p : "";
    size_t hl = g->held.len, best = (size_t)-1;
    for (int i = 0; i < g->p.n_stop; i++) {
        const char *m = hl >= g->stop_len[i] ? memmem(h, hl, g->stop[i], g->stop_len[i]) : NULL;
        if (m && (size_t)(m - h) < best) best = (size_t)(m - h);
    }
    if (best != (size_t)-1) {
        if (!release(g, best)) *oom = 1;
        g->held.len = 0;
        return 1;
    }
    size_t keep = 0;
    for (int i = 0; i < g->p.n_stop; i++)
        for (size_t k = g->stop_len[i] - 1; k > keep; k--)
            if (k <= hl && !memcmp(h + hl - k, g->stop[i], k)) {
                keep = k;
                break;
            }
    if (!release(g, hl - keep)) *oom = 1;
    return 0;
}

void at_gen_seq_finish(at_gen_seq *g, at_finish_reason why)
{
    if (g->fin != AT_FINISH_NONE) return;
    const char *t = NULL;
    size_t n = 0;
    int oom = 0;
    if (at_tok_stream_flush(g->stream, &t, &n) == AT_OK && n) {
        if (!buf_add(&g->held, t, n)) oom = 1;
        if (scan_stops(g, &oom)) why = AT_FINISH_STOP;
    }
    if (g->held.len && !release(g, g->held.len)) oom = 1;
    g->held.len = 0;
    g->fin = oom ? AT_FINISH_ERROR : why;
}

at_status at_gen_seq_next(at_gen_seq *g, const float *logits, int room, int32_t *token, at_finish_reason *fin)
{
    if (g->fin != AT_FINISH_NONE) return at_error(AT_ERR_INVALID, "generate: the sequence has finished");
    int32_t id = at_sampler_sample(g->sampler, logits);
    at_sampler_accept(g->sampler, id);
    if (g->n_ids == g->cap_ids) {
        int cap = g->cap_ids ? 2 * g->cap_ids : 64;
        int32_t *p = realloc(g->ids, (size_t)cap * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "generate: out of memory");
        g->ids = p;
        g->cap_ids = cap;
    }
    g->ids[g->n_ids++] = id;
    *token = id;
    for (int i = 0; i < g->p.n_stop_ids; i++)
        if (g->stop_ids[i] == id) {
            at_gen_seq_finish(g, AT_FINISH_STOP);
            *fin = g->fin;
            return AT_OK;
        }
    const char *t = NULL;
    size_t n = 0;
    int oom = 0;
    AT_TRY(at_tok_stream_push(g->stream, id, &t, &n));
    if (n && !buf_add(&g->held, t, n)) return at_error(AT_ERR_NOMEM, "generate: out of memory");
    if (scan_stops(g, &oom)) g->fin = AT_FINISH_STOP;
    if (oom) return at_error(AT_ERR_NOMEM, "generate: out of memory");
    if (g->fin == AT_FINISH_NONE &&
        ((g->p.max_new_tokens > 0 && g->n_ids >= g->p.max_new_tokens) || room <= 0))
        at_gen_seq_finish(g, AT_FINISH_LENGTH);
    *fin = g->fin;
    return AT_OK;
}

void at_gen_seq_take_text(at_gen_seq *g, const char **text, size_t *len)
{
    *text = g->out.p ? g->out.p + g->taken : "";
    *len = g->out.len - g->taken;
    g->taken = g->out.len;
}

at_finish_reason at_gen_seq_finished(const at_gen_seq *g) { return g->fin; }
int at_gen_seq_tokens(const at_gen_seq *g) { return g->n_ids; }
const int32_t *at_gen_seq_ids(const at_gen_seq *g) { return g->ids; }

/* ---- one sequence on a decoder ------------------------------------------ */

struct at_generator {
    at_decoder *d;
    const at_tokenizer *tok;
    int max_seq;
    at_kv_cache *cache;
    at_tensor *logits; /* f32 [1, V] on the decoder's backend */
    float *host;       /* [V] */
    uint64_t *cached;  /* the keys (at_prompt_media) of the tokens whose keys and values are in the cache */
    at_adapter *adapter; /* the adapter those keys and values were computed with */
};

/* Longest prompt piece prefilled in one call: bounds the scratch memory. */
#define PREFILL_CHUNK 512

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

at_status at_generator_new(at_decoder *d, const at_tokenizer *tok, int max_seq, at_generator **out)
{
    *out = NULL;
    if (max_seq < 2) return at_error(AT_ERR_INVALID, "generator: max_seq %d is too small", max_seq);
    at_generator *g = calloc(1, sizeof *g);
    if (!g) return at_error(AT_ERR_NOMEM, "generator: out of memory");
    at_status st = AT_OK;
    int64_t V = d->cfg.vocab_size, sh[2] = {1, V};
    g->d = d;
    g->tok = tok;
    g->max_seq = max_seq;
    AT_CHECK(at_kv_cache_new(&d->cfg, d->be, AT_F32, 1, max_seq, &g->cache));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "generate.logits", &g->logits));
    g->host = malloc((size_t)V * sizeof *g->host);
    g->cached = malloc((size_t)max_seq * sizeof *g->cached);
    if (!g->host || !g->cached) st = at_error(AT_ERR_NOMEM, "generator: out of memory");
done:
    if (st != AT_OK) {
        at_generator_free(g);
        return st;
    }
    *out = g;
    return AT_OK;
}

void at_generator_free(at_generator *g)
{
    if (!g) return;
    at_kv_cache_free(g->cache);
    at_tensor_free(g->logits);
    free(g->host);
    free(g->cached);
    free(g);
}

void at_generator_reset(at_generator *g) { at_kv_cache_reset(g->cache); }

at_status at_prompt_media_features(const at_prompt_media *m, float **out, int64_t *rows, int64_t *cols)
{
    *out = NULL;
    *rows = *cols = 0;
    const at_vision_config *vc = at_vision_get_config(m->vision);
    int64_t n_tok = 0;
    AT_TRY(at_vision_tokens(vc, m->grid_thw, m->n_images, m->n_patches, &n_tok));
    int64_t sh[2] = {at_vision_feature_rows(vc, n_tok), vc->out_hidden_size};
    at_tensor *t = NULL;
    AT_TRY(at_tensor_new(at_vision_backend(m->vision), AT_F32, 2, sh, "vision.features", &t));
    at_status st = at_vision_forward(m->vision, t, m->pixels, m->n_patches, m->grid_thw, m->n_images, 0);
    float *h = st == AT_OK ? malloc((size_t)(sh[0] * sh[1]) * sizeof *h) : NULL;
    if (st == AT_OK && !h) st = at_error(AT_ERR_NOMEM, "vision features: out of memory");
    if (st == AT_OK) st = at_tensor_download(t, h, (size_t)(sh[0] * sh[1]) * sizeof *h);
    at_tensor_free(t);
    if (st != AT_OK) {
        free(h);
        return st;
    }
    *out = h;
    *rows = n_tok;
    *cols = sh[1];
    return AT_OK;
}

/* The key of prompt token i. */
static uint64_t key_at(const at_prompt_media *m, const int32_t *ids, size_t i)
{
    return m && m->keys ? m->keys[i] : at_prompt_text_key(ids[i]);
}

static at_status fetch_logits(at_generator *g)
{
    return at_tensor_download(g->logits, g->host, (size_t)g->d->cfg.vocab_size * sizeof *g->host);
}

at_status at_generator_run(at_generator *g, const int32_t *prompt, size_t n, const at_gen_params *p,
                           at_gen_text_fn on_text, void *user, char **out_text, at_finish_reason *fin,
                           at_gen_stats *stats)
{
    return at_generator_run_media(g, prompt, n, NULL, p, on_text, user, out_text, fin, stats);
}

/* Prefills prompt[at, at + T) (the cache holds prompt[0, at)); the image
 * tokens among them take their rows of feats (computed on first need into
 * *feats, counted in *encoded). */
static at_status prefill_piece(at_generator *g, const int32_t *prompt, size_t at, int T, const at_prompt_media *m,
                               float **feats, int *encoded)
{
    at_prefill_extra ex = {0};
    at_tensor *ft = NULL, *dt = NULL;
    if (m && m->mrope_pos) ex.mrope_pos = m->mrope_pos + at * 3;
    size_t before = 0, k = 0;
    if (m && m->n_images) {
        for (size_t i = 0; i < at; i++) before += prompt[i] == m->image_token;
        for (size_t i = at; i < at + (size_t)T; i++) k += prompt[i] == m->image_token;
    }
    at_status st = AT_OK;
    if (k) {
        int64_t rows = 0, cols = 0;
        if (!*feats) {
            AT_TRY(at_prompt_media_features(m, feats, &rows, &cols));
            *encoded += m->n_images;
        }
        int64_t sh[2] = {(int64_t)k, g->d->cfg.hidden_size};
        AT_TRY(at_tensor_new(g->d->be, AT_F32, 2, sh, "generate.features", &ft));
        st = at_tensor_upload(ft, *feats + before * (size_t)sh[1], k * (size_t)sh[1] * sizeof **feats);
        ex.features = ft;
        ex.feature_token = m->image_token;
        /* Qwen3-VL: the same tokens' rows of each deepstack section, layer by layer */
        const at_vision_config *vc = at_vision_get_config(m->vision);
        int64_t n_tok = 0;
        if (st == AT_OK) st = at_vision_tokens(vc, m->grid_thw, m->n_images, m->n_patches, &n_tok);
        const int nds = st == AT_OK ? (int)(at_vision_feature_rows(vc, n_tok) / n_tok) - 1 : 0;
        int64_t sd[2] = {(int64_t)k * nds, sh[1]};
        if (nds && st == AT_OK) st = at_tensor_new(g->d->be, AT_F32, 2, sd, "generate.deepstack", &dt);
        for (int l = 0; l < nds && st == AT_OK; l++) {
            at_tensor part;
            int64_t sp[2] = {(int64_t)k, sh[1]};
            at_tensor_view_inplace(&part, dt, (size_t)l * k * (size_t)sh[1], 2, sp);
            st = at_tensor_upload(&part, *feats + ((size_t)(1 + l) * (size_t)n_tok + before) * (size_t)sh[1],
                                  k * (size_t)sh[1] * sizeof **feats);
        }
        ex.deepstack = dt;
        ex.n_deepstack = nds;
    }
    if (st == AT_OK) st = at_decoder_prefill_ex(g->d, g->cache, prompt + at, T, NULL, g->logits, 0, &ex);
    at_tensor_free(ft);
    at_tensor_free(dt);
    return st;
}

at_status at_generator_run_media(at_generator *g, const int32_t *prompt, size_t n, const at_prompt_media *media,
                                 const at_gen_params *p, at_gen_text_fn on_text, void *user, char **out_text,
                                 at_finish_reason *fin, at_gen_stats *stats)
{
    if (out_text) *out_text = NULL;
    if (fin) *fin = AT_FINISH_NONE;
    if (stats) memset(stats, 0, sizeof *stats);
    if (n < 1) return at_error(AT_ERR_INVALID, "generate: empty prompt (give at least the BOS token)");
    if (n > (size_t)g->max_seq - 1)
        return at_error(AT_ERR_INVALID, "generate: the prompt has %zu tokens; the context holds %d", n, g->max_seq);
    at_gen_seq *seq = NULL;
    buf all = {0};
    float *feats = NULL;
    int encoded = 0;
    at_status st = AT_OK;
    AT_CHECK(at_gen_seq_new(g->tok, g->d->cfg.vocab_size, p, &seq));
    AT_CHECK(at_gen_seq_start(seq, prompt, n));
    /* the cache holds keys and values of one adapter: another one starts over */
    if (p->adapter != g->adapter) g->cache->len[0] = 0;
    g->adapter = p->adapter;
    AT_CHECK(at_decoder_set_adapter(g->d, p->adapter));

    /* reuse the cached prefix; at least the last prompt token runs again for its logits */
    int len = g->cache->len[0], keep = 0;
    while (keep < len && (size_t)keep < n - 1 && g->cached[keep] == key_at(media, prompt, (size_t)keep)) keep++;
    g->cache->len[0] = keep;
    /* text positions follow the cache's length (a kept prefix of text has none
     * of a previous prompt's images); explicit ones reset the delta */
    if (!media || !media->mrope_pos) g->cache->rope_delta[0] = 0;
    double t0 = now_s();
    for (size_t at = (size_t)keep; at < n;) {
        int T = (int)(n - at < PREFILL_CHUNK ? n - at : PREFILL_CHUNK);
        st = prefill_piece(g, prompt, at, T, media, &feats, &encoded);
        if (st != AT_OK) {
            g->cache->len[0] = 0; /* the cache no longer matches `cached` */
            goto done;
        }
        for (size_t i = at; i < at + (size_t)T; i++) g->cached[i] = key_at(media, prompt, i);
        at += (size_t)T;
    }
    AT_CHECK(fetch_logits(g));
    double t1 = now_s();
    if (stats) {
        stats->prompt_tokens = (int)n;
        stats->prefilled_tokens = (int)n - keep;
        stats->prefill_s = t1 - t0;
        stats->images_encoded = encoded;
    }
    at_finish_reason f = AT_FINISH_NONE;
    while (f == AT_FINISH_NONE) {
        int32_t tok;
        AT_CHECK(at_gen_seq_next(seq, g->host, g->max_seq - g->cache->len[0], &tok, &f));
        const char *t;
        size_t tl;
        at_gen_seq_take_text(seq, &t, &tl);
        if (tl && out_text && !buf_add(&all, t, tl)) {
            st = at_error(AT_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        if (tl && on_text && on_text(user, t, tl)) {
            at_gen_seq_finish(seq, AT_FINISH_CANCELLED);
            f = AT_FINISH_CANCELLED;
        }
        if (f != AT_FINISH_NONE) break;
        int pos = g->cache->len[0];
        st = at_decoder_decode_step(g->d, g->cache, &tok, NULL, g->logits);
        if (st != AT_OK) {
            g->cache->len[0] = 0;
            goto done;
        }
        g->cached[pos] = at_prompt_text_key(tok);
        AT_CHECK(fetch_logits(g));
    }
    /* text released by the finish (held back or flushed) */
    const char *t;
    size_t tl;
    at_gen_seq_take_text(seq, &t, &tl);
    if (tl && out_text && !buf_add(&all, t, tl)) {
        st = at_error(AT_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    if (tl && on_text && f != AT_FINISH_CANCELLED) on_text(user, t, tl);
    if (stats) {
        stats->new_tokens = at_gen_seq_tokens(seq);
        stats->decode_s = now_s() - t1;
    }
    if (fin) *fin = at_gen_seq_finished(seq);
    if (out_text) {
        if (!all.p && !buf_add(&all, "", 0)) {
            st = at_error(AT_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        *out_text = all.p;
        all.p = NULL;
    }
done:
    (void)at_decoder_set_adapter(g->d, NULL);
    free(feats);
    free(all.p);
    at_gen_seq_free(seq);
    return st;
}
