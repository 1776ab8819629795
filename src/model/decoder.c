#include "model/decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/rng.h"
#include "device/cpu/cpu_qmatmul.h"
#include "device/quant.h"
#include "ops/ops.h"

/* Inference buffers, sized for up to cap_tokens tokens and cap_batch
 * sequences, reused by every call (views are re-laid for each call's shape). */
struct at_decoder_scratch {
    int64_t cap_tokens;
    int cap_batch;
    int cap_rank;     /* LoRA rank the f32 buffer has room for (u [N, r], shared by the modules) */
    at_tensor *f32;   /* layer acts | residual stream [N, hidden] | rows [B, hidden] | rows_norm [B, hidden] */
    at_tensor *i32;   /* ids [N] | pos [N] | q_index [N] | kv_len [B] | last [B] */
    int32_t *host;    /* staging for i32, same layout */
    int *seq;         /* host [2 · cap_batch]: cache start and new tokens per sequence */
};

/* ---- construction -------------------------------------------------------------- */

at_status at_decoder_new(at_decoder_weights *w, at_decoder **out)
{
    *out = NULL;
    AT_TRY(at_decoder_weights_check(w));
    at_decoder *d = calloc(1, sizeof *d);
    if (!d) return at_error(AT_ERR_NOMEM, "decoder: out of memory");
    at_status st = AT_OK;
    float *host = NULL;
    d->cfg = w->cfg;
    d->be = w->backend;
    d->attn_scale = 1.0f / sqrtf((float)d->cfg.head_dim);
    d->quant_bf16 = -1;
    if (at_model_config_mrope(&d->cfg)) {
        d->mrope.n = 3;
        for (int k = 0; k < 3; k++) d->mrope.len[k] = d->cfg.mrope_section[k];
        d->mrope.interleaved = d->cfg.mrope_interleaved;
    }
    int64_t half = d->cfg.head_dim / 2;
    host = malloc((size_t)half * sizeof *host);
    if (!host) {
        st = at_error(AT_ERR_NOMEM, "decoder: out of memory");
        goto done;
    }
    AT_CHECK(at_model_config_rope_inv_freq(&d->cfg, host));
    AT_CHECK(at_tensor_new(d->be, AT_F32, 1, &half, "rope.inv_freq", &d->inv_freq));
    AT_CHECK(at_tensor_upload(d->inv_freq, host, (size_t)half * sizeof *host));
    d->w = w;
done:
    free(host);
    if (st != AT_OK) {
        at_tensor_free(d->inv_freq);
        free(d);
        return st;
    }
    *out = d;
    return AT_OK;
}

static void scratch_free(at_decoder_scratch *s)
{
    if (!s) return;
    at_tensor_free(s->f32);
    at_tensor_free(s->i32);
    free(s->host);
    free(s->seq);
    free(s);
}

void at_decoder_free(at_decoder *d)
{
    if (!d) return;
    scratch_free(d->scratch);
    at_tensor_free(d->qact);
    at_tensor_free(d->inv_freq);
    at_decoder_weights_free(d->w);
    free(d);
}

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

at_status at_decoder_qact(at_decoder *d, int64_t rows, at_tensor **out)
{
    *out = NULL;
    int on = d->quant_bf16 < 0 ? d->be->fast_bf16 : d->quant_bf16;
    if (!on || d->cfg.num_hidden_layers < 1) return AT_OK;
    const at_layer_weights *l0 = &d->w->layers[0];
    const at_tensor *mats[] = {l0->wq, l0->wk, l0->wv, l0->wo, l0->w_gate, l0->w_up, l0->w_down};
    int any = 0;
    for (int i = 0; i < 7; i++) any |= mats[i] && at_dtype_is_quantized(mats[i]->dtype);
    if (!any) return AT_OK;
    int64_t width = d->cfg.hidden_size;
    if (d->cfg.intermediate_size > width) width = d->cfg.intermediate_size;
    if ((int64_t)d->cfg.num_attention_heads * d->cfg.head_dim > width)
        width = (int64_t)d->cfg.num_attention_heads * d->cfg.head_dim;
    if (!d->qact || at_tensor_numel(d->qact) < rows * width) {
        at_tensor_free(d->qact);
        d->qact = NULL;
        int64_t shape[2] = {rows, width};
        AT_TRY(at_tensor_new(d->be, AT_BF16, 2, shape, "bf16 activations (QLoRA)", &d->qact));
    }
    *out = d->qact;
    return AT_OK;
}

at_status at_decoder_check_window(const at_decoder *d, int64_t tokens)
{
    if (d->cfg.sliding_window > 0 && tokens > d->cfg.sliding_window)
        return at_error(AT_ERR_UNSUPPORTED,
                        "decoder: %lld tokens exceed the model's sliding window of %lld (only full attention "
                        "is implemented, which equals the window's up to that length)",
                        (long long)tokens, (long long)d->cfg.sliding_window);
    return AT_OK;
}

/* ---- LoRA ------------------------------------------------------------------------ */

at_status at_decoder_set_adapter(at_decoder *d, at_adapter *ad)
{
    if (!ad) {
        d->adapter = NULL;
        return AT_OK;
    }
    const at_model_config *c = &d->cfg;
    char buf[200];
    if (ad->n_layers != c->num_hidden_layers)
        return at_error(AT_ERR_INVALID, "adapter: made for %d layers, the model has %d", ad->n_layers,
                        c->num_hidden_layers);
    if (ad->backend != d->be)
        return at_error(AT_ERR_INVALID, "adapter: lives on %s, the model on %s", ad->backend ? ad->backend->name : "?",
                        d->be->name);
    for (int l = 0; l < ad->n_layers; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *p = at_adapter_pair(ad, l, (at_module)m);
            int on = (ad->target_mask >> m) & 1;
            if (!on && !p->A) continue;
            int64_t in, out;
            at_module_dims(c, (at_module)m, &in, &out);
            if (!on || !p->A || !p->B || p->A->dtype != AT_F32 || p->B->dtype != AT_F32 || p->A->ndim != 2 ||
                p->B->ndim != 2 || p->A->shape[0] != ad->rank || p->A->shape[1] != in || p->B->shape[0] != out ||
                p->B->shape[1] != ad->rank || p->A->buf->backend != d->be || p->B->buf->backend != d->be)
                return at_error(AT_ERR_INVALID, "adapter: layer %d %s: %s does not fit the model (want A f32 [%d, "
                                "%lld], B f32 [%lld, %d] on %s)", l, at_module_name((at_module)m),
                                p->A ? at_tensor_describe(p->A, buf, sizeof buf) : "A missing", ad->rank,
                                (long long)in, (long long)out, ad->rank, d->be->name);
        }
    d->adapter = ad;
    return AT_OK;
}

const at_layer_lora *at_decoder_layer_lora(const at_decoder *d, int l, float p, uint64_t seed, at_layer_lora *buf)
{
    if (!d->adapter) return NULL;
    buf->pairs = at_adapter_pair(d->adapter, l, AT_MOD_Q);
    buf->scale = (float)d->adapter->scale;
    buf->dropout = p;
    buf->seed = at_rng_mix(seed, (uint64_t)l);
    buf->first_row = 0;
    buf->row_tokens = 0;
    return buf;
}

at_status at_decoder_logits(at_decoder *d, at_tensor *logits, const at_tensor *hidden)
{
    if (!d->w->lm_head)
        return at_error(AT_ERR_UNSUPPORTED, "the model is a reward model (a score head, no LM head): it scores "
                        "sequences, it does not predict tokens");
    return at_matmul(logits, hidden, d->w->lm_head, 0, 1, 1.0f, 0.0f);
}

/* ---- input-embedding injection ---------------------------------------------------- */

at_status at_decoder_place_features(at_tensor *x, at_tensor *feats, const int32_t *ids, int64_t N, int32_t token,
                                    int mode)
{
    char buf[200];
    int64_t hd = at_tensor_cols(x), n = 0;
    for (int64_t i = 0; i < N; i++) n += ids[i] == token;
    if (!feats || feats->dtype != AT_F32 || at_tensor_numel(feats) != n * hd)
        return at_error(AT_ERR_INVALID, "decoder: the batch has %lld tokens of id %d to take features, the features "
                        "are %s (want f32 [%lld, %lld])", (long long)n, token,
                        feats ? at_tensor_describe(feats, buf, sizeof buf) : "missing", (long long)n, (long long)hd);
    for (int64_t i = 0, j = 0; i < N;) {
        if (ids[i] != token) {
            i++;
            continue;
        }
        int64_t run = 1;
        while (i + run < N && ids[i + run] == token) run++;
        at_tensor xr, fr;
        int64_t sh[2] = {run, hd};
        at_tensor_view_inplace(&xr, x, (size_t)(i * hd), 2, sh);
        at_tensor_view_inplace(&fr, feats, (size_t)(j * hd), 2, sh);
        if (mode == AT_PLACE_TAKE || mode == AT_PLACE_GET) AT_TRY(at_cast(&fr, &xr));
        if (mode == AT_PLACE_TAKE) AT_TRY(at_fill(&xr, 0.0f));
        if (mode == AT_PLACE_SET) AT_TRY(at_cast(&xr, &fr));
        if (mode == AT_PLACE_ADD) AT_TRY(at_add(&xr, &xr, &fr));
        i += run;
        j += run;
    }
    return AT_OK;
}

void at_decoder_deepstack_rows(at_tensor *dst, const at_tensor *deepstack, int n_deepstack, int l)
{
    int64_t n = deepstack->shape[0] / n_deepstack, s[2] = {n, deepstack->shape[1]};
    at_tensor_view_inplace(dst, deepstack, (size_t)(l * n * deepstack->shape[1]), 2, s);
}

/* ---- inference ----------------------------------------------------------------- */

/* i32 layout: ids [N] | q_index [N] | pos [N · 3] (M-RoPE: 3 a token; else N) | kv_len [B] | last [B] */
static size_t i32_elems(int64_t N, int B) { return (size_t)(5 * N + 2 * B); }

static size_t f32_elems(const at_model_config *c, int64_t N, int B, int rank)
{
    size_t hd = (size_t)c->hidden_size;
    return at_layer_acts_elems(c, N) + at_layer_recomputed_elems(c, N) + round16((size_t)N * hd) +
           2 * round16((size_t)B * hd) + round16((size_t)N * (size_t)rank);
}

static at_status scratch_ensure(at_decoder *d, int64_t N, int B)
{
    at_decoder_scratch *s = d->scratch;
    int rank = d->adapter ? d->adapter->rank : 0;
    if (s && s->cap_tokens >= N && s->cap_batch >= B && s->cap_rank >= rank) return AT_OK;
    /* grow to at least what is asked and what was there */
    int64_t capN = s && s->cap_tokens > N ? s->cap_tokens : N;
    int capB = s && s->cap_batch > B ? s->cap_batch : B;
    int capR = s && s->cap_rank > rank ? s->cap_rank : rank;
    scratch_free(s);
    d->scratch = NULL;
    s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "decoder: out of memory");
    at_status st = AT_OK;
    int64_t nf = (int64_t)f32_elems(&d->cfg, capN, capB, capR), ni = (int64_t)i32_elems(capN, capB);
    AT_CHECK(at_tensor_new(d->be, AT_F32, 1, &nf, "decoder.scratch", &s->f32));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 1, &ni, "decoder.index", &s->i32));
    s->host = malloc((size_t)ni * sizeof *s->host);
    s->seq = malloc(2 * (size_t)capB * sizeof *s->seq);
    if (!s->host || !s->seq) {
        st = at_error(AT_ERR_NOMEM, "decoder: out of memory");
        goto done;
    }
    s->cap_tokens = capN;
    s->cap_batch = capB;
    s->cap_rank = capR;
done:
    if (st != AT_OK) {
        scratch_free(s);
        return st;
    }
    d->scratch = s;
    return AT_OK;
}

at_status at_decoder_prefill(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                             at_tensor *logits, int all_positions)
{
    return at_decoder_prefill_ex(d, cache, ids, T, n_new, logits, all_positions, NULL);
}

static at_status prefill_run(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                             at_tensor *logits, int all_positions, const at_prefill_extra *extra);

/* Inference: nothing differentiates through the prefill, so the CPU's
 * quantized products may run on int8 activations (cpu_qmatmul.h). */
at_status at_decoder_prefill_ex(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                                at_tensor *logits, int all_positions, const at_prefill_extra *extra)
{
    int was = at_cpu_qmatmul_inference(1);
    at_status st = prefill_run(d, cache, ids, T, n_new, logits, all_positions, extra);
    at_cpu_qmatmul_inference(was);
    return st;
}

static at_status prefill_run(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                             at_tensor *logits, int all_positions, const at_prefill_extra *extra)
{
    const at_model_config *c = &d->cfg;
    char buf[200];
    if (!cache || !ids || !logits) return at_error(AT_ERR_INVALID, "decoder prefill: missing argument");
    if (T <= 0) return at_error(AT_ERR_INVALID, "decoder prefill: T = %d", T);
    if (cache->n_layers != c->num_hidden_layers || cache->n_kv_heads != c->num_key_value_heads ||
        cache->head_dim != c->head_dim)
        return at_error(AT_ERR_INVALID, "decoder prefill: the cache was made for another model");
    int B = cache->batch;
    int64_t N = (int64_t)B * T, V = c->vocab_size, hd = c->hidden_size;
    int64_t want_rows = all_positions ? N : B;
    if (logits->dtype != AT_F32 || at_tensor_numel(logits) != want_rows * V)
        return at_error(AT_ERR_INVALID, "decoder prefill: logits %s must be f32 [%lld, %lld]",
                        at_tensor_describe(logits, buf, sizeof buf), (long long)want_rows, (long long)V);
    for (int b = 0; b < B; b++) {
        int n = n_new ? n_new[b] : T;
        if (n < 0 || n > T)
            return at_error(AT_ERR_INVALID, "decoder prefill: sequence %d has %d new tokens of %d", b, n, T);
        if ((int64_t)cache->len[b] + n > cache->max_seq)
            return at_error(AT_ERR_INVALID, "decoder prefill: sequence %d would have %d tokens, the cache holds %d",
                            b, cache->len[b] + n, cache->max_seq);
        AT_TRY(at_decoder_check_window(d, (int64_t)cache->len[b] + n));
        for (int t = 0; t < n; t++) {
            int32_t id = ids[(size_t)b * T + t];
            if (id < 0 || id >= c->vocab_size)
                return at_error(AT_ERR_INVALID, "decoder prefill: token id %d (sequence %d, position %d) is "
                                "outside the vocabulary of %d", id, b, t, c->vocab_size);
        }
    }
    AT_TRY(scratch_ensure(d, N, B));
    at_decoder_scratch *s = d->scratch;

    /* index tensors, filled on the host: padding gets id 0 and no visible key */
    int P = at_decoder_pos_width(d);
    const int32_t *xpos = extra && P > 1 ? extra->mrope_pos : NULL;
    int *cache_start = s->seq, *nn = s->seq + B;
    int32_t *h_ids = s->host, *h_qi = h_ids + N, *h_pos = h_qi + N, *h_kvl = h_pos + 3 * N, *h_last = h_kvl + B;
    for (int b = 0; b < B; b++) {
        int n = n_new ? n_new[b] : T, len = cache->len[b];
        cache_start[b] = len;
        nn[b] = n;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            h_ids[i] = t < n ? ids[i] : 0;
            h_qi[i] = t < n ? len + t : -1;
            for (int k = 0; k < P; k++)
                h_pos[i * (size_t)P + (size_t)k] = xpos && t < n ? xpos[i * 3 + (size_t)k] : len + cache->rope_delta[b] + t;
        }
        h_kvl[b] = len + n;
        h_last[b] = (int32_t)((int64_t)b * T + (n > 0 ? n - 1 : 0));
    }
    at_tensor t_all, t_ids, t_pos, t_qi, t_kvl, t_last;
    int64_t ni = (int64_t)i32_elems(N, B), shBT[2] = {B, T}, shB[1] = {B}, shP[3] = {B, T, P};
    at_tensor_view_inplace(&t_all, s->i32, 0, 1, &ni);
    AT_TRY(at_tensor_upload(&t_all, s->host, (size_t)ni * sizeof(int32_t)));
    at_tensor_view_inplace(&t_ids, s->i32, 0, 2, shBT);
    at_tensor_view_inplace(&t_qi, s->i32, (size_t)N, 2, shBT);
    at_tensor_view_inplace(&t_pos, s->i32, (size_t)(2 * N), 3, shP);
    at_tensor_view_inplace(&t_kvl, s->i32, (size_t)(5 * N), 1, shB);
    at_tensor_view_inplace(&t_last, s->i32, (size_t)(5 * N + B), 1, shB);

    /* f32 views: layer acts | x [N, hidden] | rows [B, hidden] | rows_norm [B, hidden] */
    at_layer_acts la;
    at_layer_acts_bind(&la, c, B, T, s->f32, 0);
    size_t off = at_layer_acts_elems(c, N);
    at_layer_acts_bind_recomputed(&la, c, N, s->f32, off);
    off += at_layer_recomputed_elems(c, N);
    at_tensor x, rows, rows_norm;
    int64_t shx[2] = {N, hd}, shr[2] = {B, hd};
    at_tensor_view_inplace(&x, s->f32, off, 2, shx);
    off += round16((size_t)(N * hd));
    at_tensor_view_inplace(&rows, s->f32, off, 2, shr);
    off += round16((size_t)(B * hd));
    at_tensor_view_inplace(&rows_norm, s->f32, off, 2, shr);
    off += round16((size_t)(B * hd));
    /* LoRA: one u [N, r] shared by every module (not needed after each product) */
    if (d->adapter) at_layer_acts_bind_lora(&la, N, d->adapter->rank, d->adapter->target_mask, 1, s->f32, off);

    at_layer_io io = {0};
    io.B = B;
    io.T = T;
    io.pos = &t_pos;
    io.inv_freq = d->inv_freq;
    io.sections = at_decoder_sections(d);
    io.attn.scale = d->attn_scale;
    io.attn.q_index = &t_qi;
    io.attn.kv_len = &t_kvl;
    io.cache_start = cache_start;
    io.n_new = nn;
    AT_TRY(at_decoder_qact(d, (int64_t)B * T, &io.qact));

    AT_TRY(at_embedding_forward(&x, &t_ids, d->w->embed));
    int32_t *mark = NULL; /* the ids, the padding marked apart (-1): it must not take features */
    if (extra && extra->features) {
        mark = malloc((size_t)N * sizeof *mark);
        if (!mark) return at_error(AT_ERR_NOMEM, "decoder prefill: out of memory");
        for (int64_t i = 0; i < N; i++) mark[i] = h_qi[i] >= 0 ? h_ids[i] : -1;
        at_status st = at_decoder_place_features(&x, (at_tensor *)extra->features, mark, N, extra->feature_token,
                                                 AT_PLACE_SET);
        if (st != AT_OK) free(mark);
        AT_TRY(st);
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const at_layer_weights *lw = &d->w->layers[l];
        at_layer_lora ll;
        io.lora = at_decoder_layer_lora(d, l, 0.0f, 0, &ll);
        io.k_cache = cache->k[l];
        io.v_cache = cache->v[l];
        at_status st = at_attention_block_forward(c, lw, &la, &x, &x, &io);
        if (st == AT_OK) st = at_mlp_block_forward(c, lw, &la, &x, &x, &io);
        if (st == AT_OK && mark && extra->deepstack && l < extra->n_deepstack) {
            at_tensor ds;
            at_decoder_deepstack_rows(&ds, extra->deepstack, extra->n_deepstack, l);
            st = at_decoder_place_features(&x, &ds, mark, N, extra->feature_token, AT_PLACE_ADD);
        }
        if (st != AT_OK) free(mark);
        AT_TRY(st);
    }
    free(mark);
    float eps = (float)c->rms_norm_eps;
    at_tensor lg;
    if (all_positions) {
        /* the layer scratch is free now: its attn_norm is [N, hidden] */
        AT_TRY(at_rmsnorm_forward(&la.attn_norm, NULL, &x, d->w->final_norm, eps));
        int64_t shl[2] = {N, V};
        at_tensor_view_inplace(&lg, logits, 0, 2, shl);
        AT_TRY(at_decoder_logits(d, &lg, &la.attn_norm));
    } else {
        /* only the rows whose logits are wanted: gather, norm, project */
        AT_TRY(at_embedding_forward(&rows, &t_last, &x));
        AT_TRY(at_rmsnorm_forward(&rows_norm, NULL, &rows, d->w->final_norm, eps));
        int64_t shl[2] = {B, V};
        at_tensor_view_inplace(&lg, logits, 0, 2, shl);
        AT_TRY(at_decoder_logits(d, &lg, &rows_norm));
    }
    for (int b = 0; b < B; b++) {
        if (xpos && nn[b] > 0) {
            /* the next token goes after the largest position: len + n + delta = max + 1 */
            int32_t mx = 0;
            for (size_t i = (size_t)b * T * 3; i < ((size_t)b * T + (size_t)nn[b]) * 3; i++)
                if (xpos[i] > mx) mx = xpos[i];
            cache->rope_delta[b] = mx + 1 - (cache->len[b] + nn[b]);
        }
        cache->len[b] += nn[b];
    }
    return AT_OK;
}

at_status at_decoder_decode_step(at_decoder *d, at_kv_cache *cache, const int32_t *ids, const int *active,
                                 at_tensor *logits)
{
    if (!cache) return at_error(AT_ERR_INVALID, "decoder decode step: cache missing");
    int B = cache->batch;
    int *n = malloc((size_t)B * sizeof *n);
    if (!n) return at_error(AT_ERR_NOMEM, "decoder decode step: out of memory");
    for (int b = 0; b < B; b++) n[b] = active ? (active[b] != 0) : 1;
    at_status st = at_decoder_prefill(d, cache, ids, 1, n, logits, 0);
    free(n);
    return st;
}
