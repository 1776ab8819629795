/* The training side of the decoder (decoder.h): activations with optional
 * gradient checkpointing, the training forward with LoRA dropout, the
 * causal-LM loss computed a few rows of logits at a time, the backward
 * through every layer (layers.c), and the gradient buffers.
 *
 * One training step, llm.c style:
 *   forward:   x_0 = embed[ids];  x_{l+1} = layer_l(x_l);  h = rmsnorm(x_L)·w
 *   loss:      for each chunk of rows: logits = h·W_headᵀ, CE → dlogits,
 *              dh = dlogits·W_head,  dW_head += dlogitsᵀ·h
 *   backward:  dx_L = rmsnorm_backward(dh);  dx_l = layer_l_backward(dx_{l+1})
 *              (recomputing layer l's activations from x_l first when
 *              checkpointing);  dembed[ids] += dx_0 */
#include "model/decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/rng.h"
#include "ops/ops.h"

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

/* ---- activations -------------------------------------------------------------- */

/* Rows of logits per chunk: the N rows cut into equal chunks of at most
 * 512 rows and 40M floats (160 MB), 16 rows at least. Each chunk's two
 * products with the lm_head (logits, dh) repack all of it (V x hidden) for
 * the GEMM kernels: with Qwen2.5's 151,936-token vocabulary that packing was
 * ~1/8 of a step's GEMM time at 110-row chunks (5 per 512 tokens), ~1/20 at
 * 2 chunks. A 512-token step is 2 chunks of 256 rows: 155 MB of logits
 * rather than 311 for one chunk, at a cost lost in the noise of bench_train
 * (Zen 4: 150.7 and 161.4 tok/s against 153.3 and 156.7). Equal chunks: a
 * remainder of a few rows would repack it all for little work. */
/* The length of equal chunks of at most max that cover total (> 0). */
static int64_t equal_chunk(int64_t total, int64_t max)
{
    int64_t chunks = (total + max - 1) / max;
    return (total + chunks - 1) / chunks;
}

static int chunk_rows_for(const at_model_config *c, int64_t N)
{
    int64_t r = ((int64_t)40 << 20) / (c->vocab_size > 0 ? c->vocab_size : 1);
    if (r > 512) r = 512;
    if (r < 16) r = 16;
    return (int)(N > 0 ? equal_chunk(N, r) : r);
}

/* Where everything lives in the arena, in elements. */
typedef struct {
    size_t resid, layers, recomputed, final_norm, final_rstd, lora, logits, target_loss, target_rows, d_final, d_resid,
        bwd, total;
    size_t layer_stride, lora_stride;
} acts_plan;

static void plan_acts(const at_model_config *c, int B, int T, unsigned flags, int rank, unsigned mask, acts_plan *p)
{
    size_t N = (size_t)B * (size_t)T, hd = (size_t)c->hidden_size, L = (size_t)c->num_hidden_layers;
    size_t nl = (flags & AT_ACTS_CHECKPOINT) ? 1 : L;
    int loss = (flags & (AT_ACTS_LOSS | AT_ACTS_TRAIN)) != 0, train = (flags & AT_ACTS_TRAIN) != 0;
    size_t chunk = loss ? (size_t)chunk_rows_for(c, (int64_t)N) : 0;
    size_t off = 0;
    memset(p, 0, sizeof *p);
    p->resid = off;
    off += (L + 1) * round16(N * hd);
    p->layers = off;
    p->layer_stride = at_layer_acts_elems(c, (int64_t)N);
    off += nl * p->layer_stride;
    p->recomputed = off; /* one set for all layers (layers.h) */
    off += at_layer_recomputed_elems(c, (int64_t)N);
    p->final_norm = off;
    off += round16(N * hd);
    p->final_rstd = off;
    off += round16(N);
    p->lora = off;
    p->lora_stride = at_layer_lora_elems((int64_t)N, rank, mask);
    off += nl * p->lora_stride;
    p->logits = off;
    off += round16(chunk * (size_t)c->vocab_size);
    p->target_loss = off;
    off += loss ? round16(N) : 0;
    p->target_rows = off;
    off += loss ? round16(N * hd) : 0;
    p->d_final = off;
    off += train ? round16(N * hd) : 0;
    p->d_resid = off;
    off += train ? round16(N * hd) : 0;
    p->bwd = off;
    off += train ? at_layer_bwd_elems(c, (int64_t)N, rank) : 0;
    p->total = off;
}

size_t at_decoder_acts_elems_ex(const at_model_config *cfg, int B, int T, unsigned flags, int lora_rank,
                                unsigned lora_mask)
{
    acts_plan p;
    plan_acts(cfg, B, T, flags, lora_rank, lora_mask, &p);
    return p.total;
}

size_t at_decoder_acts_elems(const at_model_config *c, int B, int T)
{
    return at_decoder_acts_elems_ex(c, B, T, 0, 0, 0);
}

void at_decoder_acts_free(at_decoder_acts *a)
{
    if (!a) return;
    at_tensor_free(a->arena);
    at_tensor_free(a->pos);
    at_tensor_free(a->targets);
    at_tensor_free(a->target_pos);
    free(a->host_targets);
    free(a->host_target_loss);
    free(a->resid);
    free(a->layers);
    free(a);
}

static void view2(at_tensor *dst, const at_tensor *arena, size_t off, int64_t rows, int64_t cols, const char *name)
{
    int64_t shape[2] = {rows, cols};
    at_tensor_view_inplace(dst, arena, off, 2, shape);
    at_tensor_set_name(dst, name);
}

at_status at_decoder_acts_new_ex(const at_decoder *d, int B, int T, unsigned flags, at_decoder_acts **out)
{
    *out = NULL;
    if (B <= 0 || T <= 0) return at_error(AT_ERR_INVALID, "decoder acts: batch %d x %d tokens", B, T);
    if (flags & ~(AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT | AT_ACTS_LOSS))
        return at_error(AT_ERR_INVALID, "decoder acts: unknown flags 0x%x", flags);
    const at_model_config *c = &d->cfg;
    int rank = d->adapter ? d->adapter->rank : 0;
    unsigned mask = d->adapter ? d->adapter->target_mask : 0;
    at_status st = AT_OK;
    int32_t *host = NULL;
    at_decoder_acts *a = calloc(1, sizeof *a);
    if (!a) return at_error(AT_ERR_NOMEM, "decoder acts: out of memory");
    a->B = B;
    a->T = T;
    a->n_layers = c->num_hidden_layers;
    a->flags = flags;
    a->lora_rank = rank;
    a->lora_mask = mask;
    a->resid = calloc((size_t)a->n_layers + 1, sizeof *a->resid);
    a->layers = calloc((size_t)a->n_layers, sizeof *a->layers);
    int64_t N = (int64_t)B * T, hd = c->hidden_size;
    host = malloc((size_t)N * 3 * sizeof *host);
    if (!a->resid || !a->layers || !host) {
        st = at_error(AT_ERR_NOMEM, "decoder acts: out of memory");
        goto done;
    }
    acts_plan p;
    plan_acts(c, B, T, flags, rank, mask, &p);
    int64_t total = (int64_t)p.total;
    AT_CHECK(at_tensor_new(d->be, AT_F32, 1, &total, "decoder.acts", &a->arena));
    for (int l = 0; l <= a->n_layers; l++)
        view2(&a->resid[l], a->arena, p.resid + (size_t)l * round16((size_t)(N * hd)), N, hd, "acts.resid");
    int ckpt = (flags & AT_ACTS_CHECKPOINT) != 0;
    for (int l = 0; l < a->n_layers; l++) {
        size_t k = ckpt ? 0 : (size_t)l;
        at_layer_acts_bind(&a->layers[l], c, B, T, a->arena, p.layers + k * p.layer_stride);
        at_layer_acts_bind_recomputed(&a->layers[l], c, N, a->arena, p.recomputed);
        at_layer_acts_bind_lora(&a->layers[l], N, rank, mask, 0, a->arena, p.lora + k * p.lora_stride);
    }
    view2(&a->final_norm, a->arena, p.final_norm, N, hd, "acts.final_norm");
    at_tensor_view_inplace(&a->final_rstd, a->arena, p.final_rstd, 1, &N);
    at_tensor_set_name(&a->final_rstd, "acts.final_rstd");

    if (flags & (AT_ACTS_LOSS | AT_ACTS_TRAIN)) {
        a->chunk_rows = chunk_rows_for(c, N);
        view2(&a->logits_chunk, a->arena, p.logits, a->chunk_rows, c->vocab_size, "acts.logits_chunk");
        at_tensor_view_inplace(&a->target_loss, a->arena, p.target_loss, 1, &N);
        at_tensor_set_name(&a->target_loss, "acts.target_loss");
        view2(&a->target_rows, a->arena, p.target_rows, N, hd, "acts.target_rows");
        AT_CHECK(at_tensor_new(d->be, AT_I32, 1, &N, "acts.targets", &a->targets));
        AT_CHECK(at_tensor_new(d->be, AT_I32, 1, &N, "acts.target_pos", &a->target_pos));
        a->host_targets = malloc((size_t)N * 3 * sizeof *a->host_targets);
        a->host_target_loss = malloc((size_t)N * sizeof *a->host_target_loss);
        if (!a->host_targets || !a->host_target_loss) {
            st = at_error(AT_ERR_NOMEM, "decoder acts: out of memory");
            goto done;
        }
    }
    if (flags & AT_ACTS_TRAIN) {
        view2(&a->d_final, a->arena, p.d_final, N, hd, "acts.d_final");
        view2(&a->d_resid, a->arena, p.d_resid, N, hd, "acts.d_resid");
        at_layer_bwd_bind(&a->bwd, c, N, rank, a->arena, p.bwd);
        /* the forward's dropout scratch is the backward's (never used at once) */
        for (int l = 0; l < a->n_layers; l++) a->layers[l].lora_x = a->bwd.lora_x;
    }

    int P = at_decoder_pos_width(d);
    int64_t pshape[3] = {B, T, P};
    AT_CHECK(at_tensor_new(d->be, AT_I32, 3, pshape, "acts.pos", &a->pos));
    for (int64_t i = 0; i < N * P; i++) host[i] = (int32_t)(i / P % T);
    AT_CHECK(at_tensor_upload(a->pos, host, (size_t)(N * P) * sizeof *host));
done:
    free(host);
    if (st != AT_OK) {
        at_decoder_acts_free(a);
        return st;
    }
    *out = a;
    return AT_OK;
}

at_status at_decoder_acts_new(const at_decoder *d, int B, int T, at_decoder_acts **out)
{
    return at_decoder_acts_new_ex(d, B, T, 0, out);
}

/* ---- forward -------------------------------------------------------------------- */

/* t: i32 [B, T] (width 1) or [B, T, width] (M-RoPE positions), or NULL. */
static at_status check_index(const at_tensor *t, int B, int T, int width, const char *what)
{
    char buf[200];
    if (!t) return AT_OK;
    if (t->dtype != AT_I32 || at_tensor_numel(t) != (int64_t)B * T * width)
        return at_error(AT_ERR_INVALID, "decoder: %s %s must be i32 [%d, %d%s]", what,
                        at_tensor_describe(t, buf, sizeof buf), B, T, width == 3 ? ", 3" : "");
    return AT_OK;
}

/* The layer view of the batch the last forward ran on. */
static at_status layer_io(at_decoder *d, const at_decoder_acts *a, at_layer_io *io)
{
    memset(io, 0, sizeof *io);
    io->B = a->B;
    io->T = a->T;
    io->pos = a->fwd_pos ? a->fwd_pos : a->pos;
    io->inv_freq = d->inv_freq;
    io->sections = at_decoder_sections(d);
    io->attn.scale = d->attn_scale;
    io->attn.segments = a->segments;
    io->save_lse = 1;
    AT_TRY(at_decoder_qact(d, (int64_t)a->B * a->T, &io->qact));
    /* a model that computes its products in bf16 (bf16 matrices where the
     * backend multiplies bf16 natively, as the CPU's GEMM does: gemm.h; or
     * quantized ones with a bf16 compute format) computes attention's in
     * bf16 too */
    const at_tensor *wq = d->cfg.num_hidden_layers > 0 ? d->w->layers[0].wq : NULL;
    io->attn.bf16 = (wq && wq->dtype == AT_BF16 && d->be->fast_bf16) || io->qact;
    return AT_OK;
}

/* NEFTune:  x_0 = embed[ids] + n,  n = m·(2u − 1) ∈ [−m, m),  m = alpha / sqrt(L·hidden)
 * with u the counter-based uniform of (row of the step, token, feature), so a
 * row draws the same noise in any micro-batch layout.  Backward: dx_0 passes
 * to the embedding unchanged (the noise is additive), and a checkpointed
 * backward recomputes layer 0 from the stored noisy x_0. */
static at_status neftune_noise(const at_decoder *d, at_decoder_acts *a, uint64_t dropout_seed)
{
    int64_t H = d->cfg.hidden_size, L = a->neftune_columns > 0 ? a->neftune_columns : a->T;
    if (a->T > AT_DROPOUT_ROW_PITCH)
        return at_error(AT_ERR_INVALID, "decoder forward: NEFTune keys its noise by token for rows of up to %lld "
                        "tokens, not %d", (long long)AT_DROPOUT_ROW_PITCH, a->T);
    float m = (float)((double)a->neftune_alpha / sqrt((double)L * (double)H));
    uint64_t pitch = (uint64_t)AT_DROPOUT_ROW_PITCH * (uint64_t)H;
    return at_add_uniform_noise(&a->resid[0], m, at_rng_mix(dropout_seed, AT_NEFTUNE_STREAM),
                                (uint64_t)a->dropout_first_row * pitch, (int64_t)a->T * H, pitch);
}

/* The training forward, with the embedding noise when `neftune` (not for
 * at_decoder_forward, which shares the activations with evaluation). */
static at_status forward(at_decoder *d, at_decoder_acts *a, const at_tensor *ids, const at_tensor *pos,
                         const at_tensor *segments, float lora_dropout, uint64_t dropout_seed, int neftune)
{
    const at_model_config *c = &d->cfg;
    int B = a->B, T = a->T;
    if (!ids) return at_error(AT_ERR_INVALID, "decoder forward: ids missing");
    AT_TRY(check_index(ids, B, T, 1, "ids"));
    AT_TRY(check_index(pos, B, T, at_decoder_pos_width(d), d->mrope.n ? "M-RoPE positions" : "positions"));
    AT_TRY(check_index(segments, B, T, 1, "segments"));
    if (a->features && !a->host_ids)
        return at_error(AT_ERR_INVALID, "decoder forward: features to place need the host copy of the ids");
    AT_TRY(at_decoder_check_window(d, T));
    if (!(lora_dropout >= 0.0f && lora_dropout < 1.0f))
        return at_error(AT_ERR_INVALID, "decoder forward: --lora_dropout %g must be in [0, 1)", (double)lora_dropout);
    if (d->adapter && (a->lora_rank != d->adapter->rank || a->lora_mask != d->adapter->target_mask))
        return at_error(AT_ERR_INVALID, "decoder forward: the activations were allocated for LoRA rank %d "
                        "(modules 0x%x), the adapter has rank %d (modules 0x%x): allocate them after "
                        "at_decoder_set_adapter", a->lora_rank, a->lora_mask, d->adapter->rank,
                        d->adapter->target_mask);
    if (!d->adapter) lora_dropout = 0.0f;
    if (lora_dropout > 0.0f && !(a->flags & AT_ACTS_TRAIN))
        return at_error(AT_ERR_INVALID, "decoder forward: LoRA dropout needs activations made with AT_ACTS_TRAIN");
    if (lora_dropout > 0.0f && T > AT_DROPOUT_ROW_PITCH)
        return at_error(AT_ERR_INVALID, "decoder forward: LoRA dropout keys its masks by token for rows of up to "
                        "%lld tokens, not %d", (long long)AT_DROPOUT_ROW_PITCH, T);

    a->ids = ids;
    a->fwd_pos = pos;
    a->segments = segments;
    a->lora_dropout = lora_dropout;
    a->dropout_seed = dropout_seed;
    a->forward_done = 0;
    a->loss_done = 0;
    at_layer_io io;
    AT_TRY(layer_io(d, a, &io));

    /* x_0 = embed[ids] */
    AT_TRY(at_embedding_forward(&a->resid[0], ids, d->w->embed));
    if (neftune && a->neftune_alpha > 0.0f) AT_TRY(neftune_noise(d, a, dropout_seed));
    /* x_0[image tokens] = features (at_decoder_place_features) */
    if (a->features)
        AT_TRY(at_decoder_place_features(&a->resid[0], (at_tensor *)a->features, a->host_ids, (int64_t)B * T,
                                         a->feature_token, AT_PLACE_SET));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        at_layer_acts *la = &a->layers[l];
        const at_layer_weights *lw = &d->w->layers[l];
        at_layer_lora ll;
        io.lora = at_decoder_layer_lora(d, l, lora_dropout, dropout_seed, &ll);
        ll.first_row = a->dropout_first_row;
        ll.row_tokens = a->T;
        AT_TRY(at_attention_block_forward(c, lw, la, &la->res_mid, &a->resid[l], &io));
        AT_TRY(at_mlp_block_forward(c, lw, la, &a->resid[l + 1], &la->res_mid, &io));
        if (a->features && a->deepstack && l < a->n_deepstack) { /* x_{l+1}[image tokens] += deepstack_l */
            at_tensor ds;
            at_decoder_deepstack_rows(&ds, a->deepstack, a->n_deepstack, l);
            AT_TRY(at_decoder_place_features(&a->resid[l + 1], &ds, a->host_ids, (int64_t)B * T, a->feature_token,
                                             AT_PLACE_ADD));
        }
    }
    AT_TRY(at_rmsnorm_forward(&a->final_norm, &a->final_rstd, &a->resid[c->num_hidden_layers], d->w->final_norm,
                              (float)c->rms_norm_eps));
    a->forward_done = 1;
    return AT_OK;
}

at_status at_decoder_forward_train_opts(at_decoder *d, at_decoder_acts *a, const at_tensor *ids,
                                        const at_tensor *pos, const at_tensor *segments, const at_fwd_opts *o)
{
    if (!(o->neftune_alpha >= 0.0f && isfinite(o->neftune_alpha)))
        return at_error(AT_ERR_INVALID, "decoder forward: --neftune_noise_alpha %g must be finite and >= 0",
                        (double)o->neftune_alpha);
    a->dropout_first_row = o->first_row;
    a->neftune_alpha = o->neftune_alpha;
    a->neftune_columns = o->neftune_columns;
    a->features = o->features;
    a->host_ids = o->host_ids;
    a->feature_token = o->feature_token;
    a->d_features = o->d_features;
    a->deepstack = o->deepstack;
    a->n_deepstack = o->deepstack ? o->n_deepstack : 0;
    a->d_deepstack = o->d_deepstack;
    return forward(d, a, ids, pos, segments, o->lora_dropout, o->dropout_seed, 1);
}

at_fwd_opts at_decoder_acts_opts(const at_decoder_acts *a, float lora_dropout, uint64_t dropout_seed)
{
    at_fwd_opts o = {.lora_dropout = lora_dropout, .dropout_seed = dropout_seed, .first_row = a->dropout_first_row,
                     .neftune_alpha = a->neftune_alpha, .neftune_columns = a->neftune_columns};
    return o;
}

at_status at_decoder_forward_train(at_decoder *d, at_decoder_acts *a, const at_tensor *ids, const at_tensor *pos,
                                   const at_tensor *segments, float lora_dropout, uint64_t dropout_seed)
{
    at_fwd_opts o = at_decoder_acts_opts(a, lora_dropout, dropout_seed);
    return at_decoder_forward_train_opts(d, a, ids, pos, segments, &o);
}

at_status at_decoder_forward(at_decoder *d, at_decoder_acts *a, const at_tensor *ids, const at_tensor *pos,
                             const at_tensor *segments)
{
    a->features = NULL; /* injection is at_fwd_opts' (at_decoder_forward_train_opts) */
    a->d_features = NULL;
    a->deepstack = a->d_deepstack = NULL;
    a->n_deepstack = 0;
    return forward(d, a, ids, pos, segments, 0.0f, 0, 0);
}

/* ---- gradients ---------------------------------------------------------------------- */

/* The addresses of w's tensor slots, for the tensors that `like` has, in the
 * fixed order of at_decoder_trainables (the tied head once). like == w lists
 * w's own tensors; like = the model and w = an empty struct gives the slots
 * to fill for gradients. Returns the count; fills up to cap. */
static int weight_slots(const at_decoder_weights *like, at_decoder_weights *w, at_tensor ***out, int cap)
{
    int n = 0;
#define SLOT(field)                              \
    do {                                         \
        if (like->field) {                       \
            if (n < cap) out[n] = &w->field;     \
            n++;                                 \
        }                                        \
    } while (0)
    SLOT(embed);
    for (int l = 0; l < like->cfg.num_hidden_layers; l++) {
        SLOT(layers[l].attn_norm);
        SLOT(layers[l].wq);
        SLOT(layers[l].wk);
        SLOT(layers[l].wv);
        SLOT(layers[l].wo);
        SLOT(layers[l].bq);
        SLOT(layers[l].bk);
        SLOT(layers[l].bv);
        SLOT(layers[l].bo);
        SLOT(layers[l].q_norm);
        SLOT(layers[l].k_norm);
        SLOT(layers[l].ffn_norm);
        SLOT(layers[l].w_gate);
        SLOT(layers[l].w_up);
        SLOT(layers[l].w_down);
    }
    SLOT(final_norm);
    if (like->lm_head != like->embed) SLOT(lm_head);
#undef SLOT
    return n;
}

/* weight_slots into a new array (caller frees); NULL on out of memory. */
static at_tensor ***slot_list(const at_decoder_weights *like, at_decoder_weights *w, int *n)
{
    *n = weight_slots(like, w, NULL, 0);
    at_tensor ***v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    if (v) weight_slots(like, w, v, *n);
    return v;
}

void at_decoder_grads_free(at_decoder_grads *g)
{
    if (!g) return;
    at_adapter_free(g->lora);
    at_decoder_weights_free(g->full);
    free(g);
}

at_status at_decoder_grads_zero(at_decoder_grads *g)
{
    if (!g) return AT_OK;
    if (g->lora)
        for (size_t i = 0; i < (size_t)g->lora->n_layers * AT_MOD_COUNT; i++) {
            if (g->lora->mods[i].A) AT_TRY(at_fill(g->lora->mods[i].A, 0.0f));
            if (g->lora->mods[i].B) AT_TRY(at_fill(g->lora->mods[i].B, 0.0f));
        }
    if (g->full) {
        int n;
        at_tensor ***slots = slot_list(g->full, g->full, &n);
        if (!slots) return at_error(AT_ERR_NOMEM, "gradients: out of memory");
        at_status st = AT_OK;
        for (int i = 0; i < n && st == AT_OK; i++) st = at_fill(*slots[i], 0.0f);
        free(slots);
        return st;
    }
    return AT_OK;
}

at_status at_decoder_grads_new(const at_decoder *d, int full, at_decoder_grads **out)
{
    *out = NULL;
    at_status st = AT_OK;
    at_decoder_grads *g = calloc(1, sizeof *g);
    if (!g) return at_error(AT_ERR_NOMEM, "gradients: out of memory");
    if (!full) {
        const at_adapter *ad = d->adapter;
        if (!ad) {
            st = at_error(AT_ERR_INVALID, "gradients: LoRA training needs an adapter (at_decoder_set_adapter)");
            goto done;
        }
        /* same structure and names as the adapter; contents zeroed below */
        AT_CHECK(at_adapter_new(&d->cfg, d->be, ad->rank, ad->alpha, ad->dropout, ad->use_rslora, ad->target_mask, 0,
                                &g->lora));
        memcpy(g->lora->base_model, ad->base_model, sizeof g->lora->base_model);
    } else {
        at_decoder_weights *w = d->w;
        int n;
        at_tensor ***src = slot_list(w, w, &n);
        if (!src) {
            st = at_error(AT_ERR_NOMEM, "gradients: out of memory");
            goto done;
        }
        for (int i = 0; i < n && st == AT_OK; i++) {
            char buf[200];
            if ((*src[i])->dtype != AT_F32)
                st = at_error(AT_ERR_UNSUPPORTED, "full fine-tuning needs f32 weights: %s is %s (load the model "
                              "as f32, or train LoRA)", at_tensor_describe(*src[i], buf, sizeof buf),
                              at_dtype_name((*src[i])->dtype));
        }
        if (st == AT_OK) st = at_decoder_weights_alloc(&d->cfg, d->be, &g->full);
        at_tensor ***dst = st == AT_OK ? slot_list(w, g->full, &n) : NULL;
        if (st == AT_OK && !dst) st = at_error(AT_ERR_NOMEM, "gradients: out of memory");
        /* a zeroed f32 tensor of the same shape and name for every weight */
        for (int i = 0; i < n && st == AT_OK; i++) {
            const at_tensor *t = *src[i];
            st = at_tensor_zeros(d->be, AT_F32, t->ndim, t->shape, t->name, dst[i]);
        }
        free(src);
        free(dst);
        if (st != AT_OK) goto done;
        if (w->lm_head == w->embed) g->full->lm_head = g->full->embed; /* both contributions in one */
    }
    AT_CHECK(at_decoder_grads_zero(g));
done:
    if (st != AT_OK) {
        at_decoder_grads_free(g);
        return st;
    }
    *out = g;
    return AT_OK;
}

int at_decoder_trainables(at_decoder *d, const at_decoder_grads *g, at_param_grad *out, int cap)
{
    int n = 0;
    if (!g) return 0;
    if (g->lora && d->adapter) {
        for (int l = 0; l < d->adapter->n_layers; l++)
            for (int m = 0; m < AT_MOD_COUNT; m++) {
                at_lora_pair *p = at_adapter_pair(d->adapter, l, (at_module)m);
                at_lora_pair *q = at_adapter_pair(g->lora, l, (at_module)m);
                if (!p->A || !q->A) continue;
                if (n < cap) out[n] = (at_param_grad){p->A, q->A};
                n++;
                if (n < cap) out[n] = (at_param_grad){p->B, q->B};
                n++;
            }
    }
    if (g->full) {
        int k = weight_slots(d->w, d->w, NULL, 0);
        if (cap > n) {
            int kp, kg;
            at_tensor ***ps = slot_list(d->w, d->w, &kp), ***gs = slot_list(d->w, g->full, &kg);
            for (int i = 0; ps && gs && i < k && n + i < cap; i++) out[n + i] = (at_param_grad){*ps[i], *gs[i]};
            free(ps);
            free(gs);
        }
        n += k;
    }
    return n;
}

/* ---- loss ------------------------------------------------------------------------------ */

/* Host copy of an i32 [N] tensor: the data itself on a host backend, else
 * downloaded into buf. */
static at_status host_i32(const at_tensor *t, int32_t *buf, int64_t n, const int32_t **out)
{
    const int32_t *p = at_tensor_data(t);
    if (p) {
        *out = p;
        return AT_OK;
    }
    AT_TRY(at_tensor_download(t, buf, (size_t)n * sizeof *buf));
    *out = buf;
    return AT_OK;
}

at_status at_decoder_loss(at_decoder *d, at_decoder_acts *a, const at_tensor *labels, float grad_scale,
                          at_decoder_grads *g, at_loss_stats *stats)
{
    const at_model_config *c = &d->cfg;
    int B = a->B, T = a->T;
    int64_t N = (int64_t)B * T, V = c->vocab_size, hd = c->hidden_size;
    at_status st = AT_OK;
    int32_t *lab_buf = NULL, *seg_buf = NULL;
    if (!stats) return at_error(AT_ERR_INVALID, "decoder loss: stats missing");
    stats->loss_sum = 0;
    stats->n_targets = 0;
    if (!a->forward_done) return at_error(AT_ERR_INVALID, "decoder loss: run the forward first");
    if (!labels) return at_error(AT_ERR_INVALID, "decoder loss: labels missing");
    AT_TRY(check_index(labels, B, T, 1, "labels"));
    if (!a->targets)
        return at_error(AT_ERR_INVALID, "decoder loss: the activations were made without AT_ACTS_LOSS or AT_ACTS_TRAIN");
    if (g && !(a->flags & AT_ACTS_TRAIN))
        return at_error(AT_ERR_INVALID, "decoder loss: gradients need activations made with AT_ACTS_TRAIN");
    a->loss_done = 0;
    at_decoder_grads *gr = g;
    at_tensor *dhead = gr && gr->full ? gr->full->lm_head : NULL;

    /* targets: position t predicts labels[t+1] of its own segment */
    const int32_t *lab, *seg = NULL;
    lab_buf = malloc((size_t)N * sizeof *lab_buf);
    if (!lab_buf) return at_error(AT_ERR_NOMEM, "decoder loss: out of memory");
    AT_CHECK(host_i32(labels, lab_buf, N, &lab));
    if (a->segments) {
        seg_buf = malloc((size_t)N * sizeof *seg_buf);
        if (!seg_buf) {
            st = at_error(AT_ERR_NOMEM, "decoder loss: out of memory");
            goto done;
        }
        AT_CHECK(host_i32(a->segments, seg_buf, N, &seg));
    }
    int32_t *tg = a->host_targets;
    for (int b = 0; b < B; b++) {
        if (stats->row_loss) stats->row_loss[b] = 0;
        if (stats->row_targets) stats->row_targets[b] = 0;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            int32_t y = -100;
            if (t + 1 < T && (!seg || seg[i + 1] == seg[i])) y = lab[i + 1];
            if (y >= V) {
                st = at_error(AT_ERR_INVALID, "decoder loss: label %d at row %d, position %d is outside the "
                              "vocabulary of %lld", y, b, t + 1, (long long)V);
                goto done;
            }
            tg[i] = y < 0 ? -100 : y;
            if (tg[i] >= 0) {
                stats->n_targets++;
                if (stats->row_targets) stats->row_targets[b]++;
            }
            if (stats->token_loss) stats->token_loss[i] = 0;
        }
    }
    /* Logits for the positions with a target only, k = 0..n-1 in order: a
     * prompt, padding or an ignored span costs no product with the lm_head
     * (with Qwen2.5's vocabulary the head is a quarter of a step's FLOPs).
     * When every position has one, the rows are final_norm's and d_final's
     * own; else they are gathered into target_rows and their gradient is
     * scattered back into d_final, zero elsewhere. */
    int32_t *tk = tg + N, *pos = tg + 2 * N;
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++)
        if (tg[i] >= 0) {
            tk[n] = tg[i];
            pos[n++] = (int32_t)i;
        }
    int gathered = n < N;
    at_tensor targets_n, pos_n, rows_n, loss_n; /* the first n of targets, target_pos, target_rows, target_loss */
    int64_t shn[2] = {n, hd};
    if (n > 0) {
        at_tensor_view_inplace(&targets_n, a->targets, 0, 1, &n);
        at_tensor_view_inplace(&pos_n, a->target_pos, 0, 1, &n);
        at_tensor_view_inplace(&rows_n, &a->target_rows, 0, 2, shn);
        at_tensor_view_inplace(&loss_n, &a->target_loss, 0, 1, &n);
        AT_CHECK(at_tensor_upload(&targets_n, tk, (size_t)n * sizeof *tk));
    }
    if (gathered && n > 0) {
        AT_CHECK(at_tensor_upload(&pos_n, pos, (size_t)n * sizeof *pos));
        AT_CHECK(at_embedding_forward(&rows_n, &pos_n, &a->final_norm));
    }

    /* Equal chunks of at most chunk_rows, as chunk_rows_for cuts N; with
     * per-row scales a chunk stops at the end of its row, so that one
     * at_cross_entropy call carries one scale. The chunks write their losses
     * into target_loss, read back once after the last (on a GPU the host
     * waits once, not once per chunk). */
    const float *rs = g ? stats->row_grad_scale : NULL;
    int64_t step = n > 0 ? equal_chunk(n, a->chunk_rows) : 0;
    for (int64_t k0 = 0, rows; k0 < n; k0 += rows) {
        rows = n - k0 < step ? n - k0 : step;
        int b = pos[k0] / T;
        if (rs)
            for (int64_t k = k0 + 1; k < k0 + rows; k++)
                if (pos[k] / T != b) {
                    rows = k - k0;
                    break;
                }
        float scale = rs ? grad_scale * rs[b] : grad_scale;
        at_tensor hid, lg, cl, tt;
        int64_t sh[2] = {rows, hd}, sl[2] = {rows, V};
        at_tensor_view_inplace(&hid, gathered ? &a->target_rows : &a->final_norm, (size_t)(k0 * hd), 2, sh);
        at_tensor_view_inplace(&lg, &a->logits_chunk, 0, 2, sl);
        at_tensor_view_inplace(&cl, &a->target_loss, (size_t)k0, 1, &rows);
        at_tensor_view_inplace(&tt, a->targets, (size_t)k0, 1, &rows);
        /* logits = h·W_headᵀ;  CE; dlogits = grad_scale·(softmax − onehot) in place */
        AT_CHECK(at_decoder_logits(d, &lg, &hid));
        AT_CHECK(at_cross_entropy(&cl, g ? &lg : NULL, &lg, &tt, scale));
        /* per-token weights: row k of dlogits is that target's gradient, linear in its weight */
        for (int64_t k = k0; g && stats->token_grad_scale && k < k0 + rows; k++) {
            float w = stats->token_grad_scale[pos[k]];
            if (w == 1.0f) continue;
            at_tensor lr;
            int64_t s1[2] = {1, V};
            at_tensor_view_inplace(&lr, &a->logits_chunk, (size_t)((k - k0) * V), 2, s1);
            AT_CHECK(at_scale(&lr, &lr, w));
        }
        if (g) {
            /* dW_head += dlogitsᵀ·h;  dh = dlogits·W_head, over the gathered h
             * (read by then) or into d_final's rows */
            at_tensor dh = hid;
            if (!gathered) at_tensor_view_inplace(&dh, &a->d_final, (size_t)(k0 * hd), 2, sh);
            if (dhead) AT_CHECK(at_matmul(dhead, &lg, &hid, 1, 0, 1.0f, 1.0f));
            AT_CHECK(at_matmul(&dh, &lg, d->w->lm_head, 0, 0, 1.0f, 0.0f));
        }
    }
    if (g && gathered) { /* rows_n holds the gradient of the gathered rows now */
        AT_CHECK(at_fill(&a->d_final, 0.0f));
        if (n > 0) AT_CHECK(at_embedding_backward(&a->d_final, &rows_n, &pos_n));
    }
    /* summed in position order */
    if (n > 0) {
        AT_CHECK(at_tensor_download(&loss_n, a->host_target_loss, (size_t)n * sizeof(float)));
        for (int64_t k = 0; k < n; k++) {
            int32_t row = pos[k];
            double v = a->host_target_loss[k];
            stats->loss_sum += v;
            if (stats->row_loss) stats->row_loss[row / T] += v;
            if (stats->token_loss) stats->token_loss[row] = (float)v;
        }
    }
    if (g) a->loss_done = 1;
done:
    free(lab_buf);
    free(seg_buf);
    return st;
}

at_status at_decoder_loss_scale_rows(at_decoder_acts *a, const at_decoder_grads *g, const float *row_scale)
{
    if (!a->loss_done)
        return at_error(AT_ERR_INVALID, "decoder loss rows: run at_decoder_loss with gradients first");
    if (g && g->full)
        return at_error(AT_ERR_UNSUPPORTED, "decoder loss rows: full fine-tuning has added the lm_head gradient "
                                            "already; pass row_grad_scale to at_decoder_loss instead");
    int64_t hd = at_tensor_cols(&a->d_final), sh[2] = {a->T, hd};
    for (int b = 0; b < a->B; b++) {
        if (row_scale[b] == 1.0f) continue;
        at_tensor row;
        at_tensor_view_inplace(&row, &a->d_final, (size_t)b * (size_t)a->T * (size_t)hd, 2, sh);
        AT_TRY(at_scale(&row, &row, row_scale[b]));
    }
    return AT_OK;
}

/* ---- backward ------------------------------------------------------------------------------ */

at_status at_decoder_set_d_final(at_decoder_acts *a, const float *host)
{
    if (!(a->flags & AT_ACTS_TRAIN) || !a->d_final.buf)
        return at_error(AT_ERR_INVALID, "decoder: setting dL/d final_norm needs activations made with AT_ACTS_TRAIN");
    if (!a->forward_done) return at_error(AT_ERR_INVALID, "decoder: setting dL/d final_norm before a forward");
    AT_TRY(at_tensor_upload(&a->d_final, host, at_tensor_nbytes(&a->d_final)));
    a->loss_done = 1;
    return AT_OK;
}

at_status at_decoder_backward(at_decoder *d, at_decoder_acts *a, at_decoder_grads *g)
{
    const at_model_config *c = &d->cfg;
    if (!g) return at_error(AT_ERR_INVALID, "decoder backward: gradients missing");
    if (!a->loss_done)
        return at_error(AT_ERR_INVALID, "decoder backward: run at_decoder_loss with gradients after the forward first");
    if (g->lora && (!d->adapter || g->lora->rank != d->adapter->rank || g->lora->target_mask != d->adapter->target_mask))
        return at_error(AT_ERR_INVALID, "decoder backward: the LoRA gradients do not match the decoder's adapter");
    a->loss_done = 0; /* d_final is consumed */
    int L = c->num_hidden_layers, ckpt = (a->flags & AT_ACTS_CHECKPOINT) != 0;
    at_decoder_weights *gw = g->full;
    at_tensor *dres = &a->d_resid;
    at_layer_io io;
    AT_TRY(layer_io(d, a, &io));

    /* h = rmsnorm(x_L)·w:  dx_L = rmsnorm_backward(dh) */
    AT_TRY(at_rmsnorm_backward(dres, gw ? gw->final_norm : NULL, &a->d_final, &a->resid[L], d->w->final_norm,
                               &a->final_rstd));
    for (int l = L - 1; l >= 0; l--) {
        at_layer_acts *la = &a->layers[l];
        const at_layer_weights *lw = &d->w->layers[l];
        at_layer_lora ll;
        io.lora = at_decoder_layer_lora(d, l, a->lora_dropout, a->dropout_seed, &ll);
        ll.first_row = a->dropout_first_row;
        ll.row_tokens = a->T;
        if (a->features && a->d_deepstack && l < a->n_deepstack) { /* ddeepstack_l = dx_{l+1}[image tokens] */
            at_tensor ds;
            at_decoder_deepstack_rows(&ds, a->d_deepstack, a->n_deepstack, l);
            AT_TRY(at_decoder_place_features(dres, &ds, a->host_ids, (int64_t)a->B * a->T, a->feature_token,
                                             AT_PLACE_GET));
        }
        if (ckpt && l != L - 1) {
            /* recompute layer l from its input (same dropout masks: same seed);
             * the block output goes to scratch, resid[l+1] is already used */
            at_tensor y = a->bwd.hd[0];
            AT_TRY(at_attention_block_forward(c, lw, la, &la->res_mid, &a->resid[l], &io));
            AT_TRY(at_mlp_block_forward(c, lw, la, &y, &la->res_mid, &io));
        } else if (l != L - 1) {
            /* the layers' shared set holds layer l + 1's values (layers.h) */
            AT_TRY(at_layer_recompute_shared(c, lw, la, &a->resid[l]));
        }
        at_layer_grads lg = {gw ? &gw->layers[l] : NULL, g->lora ? at_adapter_pair(g->lora, l, AT_MOD_Q) : NULL};
        AT_TRY(at_mlp_block_backward(c, lw, la, &lg, dres, &la->res_mid, &io, &a->bwd));
        AT_TRY(at_attention_block_backward(c, lw, la, &lg, dres, &a->resid[l], &io, &a->bwd));
    }
    /* x_0[image tokens] = features:  dfeatures = dx_0 there, and those rows of
     * dx_0 are zeroed, the lookup they replaced having no gradient */
    if (a->features) {
        at_tensor scratch;
        at_tensor *df = a->d_features;
        if (!df) { /* not wanted: the rows are still zeroed, through a scratch as large as the features */
            int64_t n = at_tensor_numel(a->features) / c->hidden_size, sh[2] = {n, c->hidden_size};
            if (n > (int64_t)a->B * a->T || !a->bwd.hd[0].buf)
                return at_error(AT_ERR_INTERNAL, "decoder backward: no scratch for the features' rows");
            at_tensor_view_inplace(&scratch, &a->bwd.hd[0], 0, 2, sh);
            df = &scratch;
        }
        AT_TRY(at_decoder_place_features(dres, df, a->host_ids, (int64_t)a->B * a->T, a->feature_token,
                                         AT_PLACE_TAKE));
    }
    /* x_0 = embed[ids]:  dembed[ids] += dx_0 (tied: on top of the head's gradient) */
    if (gw) AT_TRY(at_embedding_backward(gw->embed, dres, a->ids));
    return AT_OK;
}

at_status at_decoder_forward_backward(at_decoder *d, at_decoder_acts *a, const at_tensor *ids, const at_tensor *pos,
                                      const at_tensor *segments, const at_tensor *labels, float lora_dropout,
                                      uint64_t dropout_seed, float grad_scale, at_decoder_grads *g,
                                      at_loss_stats *stats)
{
    at_fwd_opts o = at_decoder_acts_opts(a, lora_dropout, dropout_seed);
    return at_decoder_forward_backward_opts(d, a, ids, pos, segments, labels, &o, grad_scale, g, stats);
}

at_status at_decoder_forward_backward_opts(at_decoder *d, at_decoder_acts *a, const at_tensor *ids,
                                           const at_tensor *pos, const at_tensor *segments, const at_tensor *labels,
                                           const at_fwd_opts *o, float grad_scale, at_decoder_grads *g,
                                           at_loss_stats *stats)
{
    AT_TRY(at_decoder_forward_train_opts(d, a, ids, pos, segments, o));
    AT_TRY(at_decoder_loss(d, a, labels, grad_scale, g, stats));
    if (!g) return AT_OK;
    return at_decoder_backward(d, a, g);
}
