#include "plan/memory.h"

#include <stdlib.h>
#include <string.h>

#include "device/quant.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/layers.h"

const char *at_tune_kind_name(at_tune_kind k)
{
    switch (k) {
    case AT_TUNE_LORA: return "lora";
    case AT_TUNE_QLORA: return "qlora";
    case AT_TUNE_FULL: return "full";
    }
    return "?";
}

/* Every tensor is allocated whole and rounded up to 64 bytes (cpu_backend.c). */
static int64_t tensor_bytes(at_dtype t, int64_t n) { return ((int64_t)at_dtype_bytes(t, (size_t)n) + 63) / 64 * 64; }

/* Bytes of a matrix [out, in] held as `t`; a quantized format needs rows of
 * whole blocks, else the matrix stays in `fallback` (as the quantizer would
 * leave it). */
static int64_t matrix_bytes(at_dtype t, at_dtype fallback, int64_t out, int64_t in)
{
    if (at_dtype_is_quantized(t) && in % at_quant_row_block(t) != 0) t = fallback;
    return tensor_bytes(t, out * in);
}

/* Norm weights and biases of one layer (always f32), in elements each. */
static void layer_small(const at_model_config *c, int64_t *elems, int64_t *bytes)
{
    int64_t hd = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
            kd = (int64_t)c->num_key_value_heads * c->head_dim;
    int64_t e = 0, b = 0;
#define ADD(n) (e += (n), b += tensor_bytes(AT_F32, (n)))
    ADD(hd); /* attn_norm */
    ADD(hd); /* ffn_norm */
    if (c->attn_qkv_bias) {
        ADD(qd);
        ADD(kd);
        ADD(kd);
    }
    if (c->attn_o_bias) ADD(hd);
    if (c->qk_norm) {
        ADD(c->head_dim);
        ADD(c->head_dim);
    }
#undef ADD
    *elems = e;
    *bytes = b;
}

int64_t at_mem_param_count(const at_model_config *c)
{
    int64_t n = 0, se, sb;
    layer_small(c, &se, &sb);
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        int64_t in, out;
        at_module_dims(c, (at_module)m, &in, &out);
        n += in * out;
    }
    n = (n + se) * c->num_hidden_layers;
    int64_t emb = (int64_t)c->vocab_size * c->hidden_size;
    n += emb + c->hidden_size + (c->tie_word_embeddings ? 0 : emb);
    return n;
}

int64_t at_mem_weight_bytes(const at_model_config *c, at_dtype matrix_dtype, at_dtype embed_dtype)
{
    int64_t b = 0, se, sb;
    layer_small(c, &se, &sb);
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        int64_t in, out;
        at_module_dims(c, (at_module)m, &in, &out);
        b += matrix_bytes(matrix_dtype, embed_dtype, out, in);
    }
    b = (b + sb) * c->num_hidden_layers;
    int64_t emb = tensor_bytes(embed_dtype, (int64_t)c->vocab_size * c->hidden_size);
    b += emb + tensor_bytes(AT_F32, c->hidden_size) + (c->tie_word_embeddings ? 0 : emb);
    return b;
}

int64_t at_mem_lora_params(const at_model_config *c, int rank, unsigned mask)
{
    int64_t n = 0;
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        if (!(mask & (1u << m))) continue;
        int64_t in, out;
        at_module_dims(c, (at_module)m, &in, &out);
        n += (int64_t)rank * (in + out);
    }
    return n * c->num_hidden_layers;
}

/* LoRA tensors: one A [r, in] and one B [out, r] per adapted module and layer,
 * each rounded like an allocation. */
static int64_t lora_bytes(const at_model_config *c, int rank, unsigned mask)
{
    int64_t b = 0;
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        if (!(mask & (1u << m))) continue;
        int64_t in, out;
        at_module_dims(c, (at_module)m, &in, &out);
        b += tensor_bytes(AT_F32, rank * in) + tensor_bytes(AT_F32, out * rank);
    }
    return b * c->num_hidden_layers;
}

/* Scratch of the attention kernels (cpu_attention.c): per thread, tiles of
 * 64 queries × 64 keys (forward: 2·64·D + 3·64·D + 64·64 + 128 floats;
 * backward: 8·64·D + 2·64·64 + 128), and in the backward one float per
 * (row, head, query) and the store of dS tiles between its passes (64 x 64
 * floats per row, head and pair of 64-blocks, when at most 16 MiB; only the
 * causally visible tiles are touched, about half). Device kernels need about
 * the same or less. */
static int64_t attention_bytes(const at_model_config *c, int64_t rows, int64_t T, int threads, int train)
{
    int64_t D = c->head_dim, nt = threads > 1 ? threads : 1, nb = (T + 63) / 64;
    int64_t store = rows * c->num_attention_heads * nb * 64 * 64;
    store = store * nb > ((int64_t)4 << 20) ? 0 : store * (nb + 1) / 2;
    int64_t fwd = nt * (2 * 64 * D + 3 * 64 * D + 64 * 64 + 128);
    int64_t bwd = train ? nt * (8 * 64 * D + 2 * 64 * 64 + 128) + rows * c->num_attention_heads * T + store : 0;
    return 4 * (fwd > bwd ? fwd : bwd);
}

/* GEMM packing buffers (gemm.c): each thread keeps the largest packed
 * blocks it needed, at most kc = 1024 values deep and mc = 256 rows of A plus
 * nc = 2048 columns of B wide (f32 or bf16; counted as f32), for matrices as
 * wide as W = max(hidden, intermediate); 2 MB for the rest (small-matrix
 * path, norms, rope). Device runtimes add their own overhead (profile). */
static int64_t workspace_bytes(const at_model_config *c, int64_t N, int threads, int64_t runtime_overhead)
{
    int64_t nt = threads > 1 ? threads : 1;
    int64_t W = c->hidden_size > c->intermediate_size ? c->hidden_size : c->intermediate_size;
    int64_t kc = W < 1024 ? W : 1024, mc = N < 256 ? N : 256, nc = W < 2048 ? W : 2048;
    return ((int64_t)2 << 20) + nt * 4 * kc * (mc + nc) + runtime_overhead;
}

static void total(at_mem_estimate *e)
{
    e->total = e->weights + e->trainable + e->gradients + e->optimizer + e->activations + e->attention + e->logits +
               e->workspace + e->kv_cache + e->reference + e->objective;
}

/* Peak of DPO's reference pass (train/preference.c at_pref_reference, run by
 * the trainer's dpo_reference before at_decoder_grads_new and the
 * optimizer): the policy's weights and its LoRA A and B (allocated, set aside
 * for a base reference), --ref_model's weights when given, and for the
 * B rows × T of a micro-batch of pairs the forward's loss-only activations
 * of the model that runs it (AT_ACTS_LOSS | AT_ACTS_CHECKPOINT: no gradients,
 * so the layer inputs are kept and one layer's activations shared by all; no
 * LoRA intermediates: the base and --ref_model run without an adapter), one
 * logits chunk, the targets (device and host) and the positions' losses on
 * the host (as e->logits), the batch ids, positions and labels and the acts'
 * positions, the forward attention scratch and the workspace. Above the step
 * only with --ref_model (its weights). The validation's at_pref_evaluate
 * holds the same activations (with the LoRA intermediates of one layer)
 * after the step's are freed: below the step. */
static int64_t reference_peak(const at_mem_train_request *r, const at_mem_estimate *e, int B, int T)
{
    const at_model_config *rc = r->ref_cfg ? r->ref_cfg : r->cfg;
    int64_t N = (int64_t)B * T, ref_weights = 0;
    if (r->ref_cfg && r->tune == AT_TUNE_FULL)
        ref_weights = at_mem_weight_bytes(rc, r->ref_dtype, r->ref_dtype);
    else if (r->ref_cfg)
        ref_weights = at_mem_weight_bytes(rc, r->tune == AT_TUNE_QLORA ? r->quant_dtype : r->weight_dtype,
                                          r->weight_dtype);
    size_t acts = at_decoder_acts_elems_ex(rc, B, T, AT_ACTS_LOSS | AT_ACTS_CHECKPOINT, 0, 0);
    return e->weights + e->trainable + ref_weights + 4 * (int64_t)acts + 12 * N + 16 * N +
           attention_bytes(rc, B, T, r->threads, 0) + workspace_bytes(rc, N, r->threads, r->runtime_overhead);
}

/* A reward model (train/reward.c): the score head [1, hidden] f32 with its
 * gradient and AdamW's two moments (the objective's trainable tensor), and
 * what at_rm_forward_backward holds on the host during the step: the head's
 * copy and its gradient's [hidden] each, the last tokens' hidden states
 * [rows, hidden], the rewards and their derivatives (doubles), and dL/d
 * final_norm [rows·T, hidden] f32, uploaded into the activations. */
static int64_t rm_extra(const at_mem_train_request *r, const at_mem_estimate *e)
{
    (void)e;
    int64_t H = r->cfg->hidden_size, rows = 2 * (int64_t)r->batch, T = r->seq_len;
    return 4 * tensor_bytes(AT_F32, H) + 4 * (2 * H + rows * H + rows * T * H) + 16 * rows;
}

/* GRPO (train/objective_grpo.c), per micro-batch of B prompts × G
 * completions, rows of T tokens (prompt + completion: the request's
 * seq_len). Beside the step's own parts:
 *   - generation (infer/scheduler.c), before the step and while the last
 *     step's activations are still held: the KV cache of S = min(B·G, 64)
 *     slots × (T + 1) tokens in f32, the logits [S, V] on the device and on
 *     the host; freed after;
 *   - the decoder's inference scratch, grown by the generation's prefill of
 *     S × min(2048 / S, 512, T − C) tokens and its decode steps and kept
 *     (model/decoder.h d->scratch), as at_mem_estimate_infer counts it;
 *   - after the generation, one at a time: with num_iterations > 1 the old
 *     policy's log-prob pass, with beta > 0 the reference's (the policy
 *     without its adapter, or a reference model): a forward without
 *     gradients over the B·G rows (loss-only activations, checkpoint
 *     layout, one logits chunk), beside the step's activations;
 *   - kept for the step: the rows' ids, labels and positions (i32) and the
 *     old and reference per-token log-probs (f32);
 *   - with beta > 0, --ref_model's weights (ref_cfg), or with full
 *     fine-tuning the frozen copy of the initial weights (ref_dtype), for
 *     the whole run. */
/* Completions per prompt: --num_generations, 0 meaning the option's default. */
static int grpo_generations(const at_mem_train_request *r)
{
    return r->num_generations > 0 ? r->num_generations : 8;
}

static int64_t grpo_extra(const at_mem_train_request *r, const at_mem_estimate *e)
{
    const at_model_config *c = r->cfg;
    int G = grpo_generations(r), T = r->seq_len;
    int64_t rows = (int64_t)r->batch * G, N = rows * T;
    int S = rows < 64 ? (int)rows : 64, C = r->max_completion_length, chunk = 2048 / S;
    if (chunk > 512) chunk = 512;
    if (chunk < 32) chunk = 32;
    if (C > 0 && T - C < chunk) chunk = T - C > 1 ? T - C : 1;
    at_mem_infer_request ir = {c, r->tune == AT_TUNE_FULL ? AT_F32 : r->weight_dtype, AT_F32, S, T + 1, chunk,
                               r->tune == AT_TUNE_FULL ? 0 : r->lora_rank, r->lora_mask, r->threads, 0};
    at_mem_estimate gen;
    at_mem_estimate_infer(&ir, &gen);
    int64_t scratch = gen.activations + gen.attention, generation = gen.kv_cache + 2 * gen.logits;
    int64_t pass = 0;
    int old = r->num_iterations > 1, ref = r->beta > 0;
    if (old || ref) {
        int lr = old ? r->lora_rank : 0;
        unsigned lm = old ? r->lora_mask : 0;
        const at_model_config *pc = ref && r->ref_cfg ? r->ref_cfg : c;
        size_t acts = at_decoder_acts_elems_ex(pc, (int)rows, T, AT_ACTS_LOSS | AT_ACTS_CHECKPOINT, lr, lm);
        pass = 4 * (int64_t)acts + 12 * N + 16 * N + attention_bytes(pc, (int)rows, T, r->threads, 0);
    }
    int64_t kept = 12 * N + 4 * N * (old + ref), ref_weights = 0;
    if (ref && r->ref_cfg)
        ref_weights = r->tune == AT_TUNE_FULL ? at_mem_weight_bytes(r->ref_cfg, r->ref_dtype, r->ref_dtype)
                      : at_mem_weight_bytes(r->ref_cfg, r->tune == AT_TUNE_QLORA ? r->quant_dtype : r->weight_dtype,
                                            r->weight_dtype);
    else if (ref && r->tune == AT_TUNE_FULL)
        ref_weights = at_mem_weight_bytes(c, r->ref_dtype, r->ref_dtype);
    (void)e;
    return scratch + (generation > pass ? generation : pass) + kept + ref_weights;
}

static const at_mem_objective OBJECTIVES[] = {
    {"sft", 1, 0, NULL},   {"pt", 1, 0, NULL},    {"dpo", 2, 1, NULL}, {"cpo", 2, 0, NULL},
    {"simpo", 2, 0, NULL}, {"orpo", 2, 0, NULL},  {"kto", 2, 1, NULL}, {"rm", 2, 0, rm_extra},
    {"grpo", 0, 0, grpo_extra},
};

const at_mem_objective *at_mem_objective_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof OBJECTIVES / sizeof OBJECTIVES[0]; i++)
        if (!strcmp(OBJECTIVES[i].name, name)) return &OBJECTIVES[i];
    return NULL;
}

/* The tower (model/vision.h) as vision.c allocates it, N patches of width W,
 * F the MLP's width, P values a patch, n = N / m² merged tokens:
 *   weights     every tensor f32 (vision_config.h's list);
 *   a block     n1, n2, q, k, v, att, (mid, out when training) [N, W] each,
 *               h1, act (and h2 for SwiGLU) [N, F], LoRA's u [N, r] per linear;
 *               kept for every block when the vision transformer trains,
 *               else one set serves them all;
 *   the rest    pixels [N, P], x0 and ln_q [N, W], the merger's two
 *               [n, m²W] (= [N, W]) and the features [n, hidden] twice
 *               (and their gradient);
 *   backward    (vision transformer trains) seven [N, W] and three [N, F]. */
void at_mem_vision(const at_mem_train_request *r, at_mem_estimate *e)
{
    const at_vision_config *vc = r->vision;
    at_vision_tensor *ts = NULL;
    size_t nt = 0;
    if (at_vision_tensors(vc, &ts, &nt) != AT_OK) return;
    int64_t params = 0, aligner = 0, lora = 0;
    int linears = 0;
    for (size_t i = 0; i < nt; i++) {
        int64_t n = 1;
        for (int k = 0; k < ts[i].ndim; k++) n *= ts[i].shape[k];
        params += n;
        if (!strncmp(ts[i].name, "visual.merger.", 14)) aligner += n;
        const char *dot = strrchr(ts[i].name, '.');
        /* a block's linear: a 2-D weight under visual.blocks (LoRA's A [r, in] and B [out, r]) */
        if (!strncmp(ts[i].name, "visual.blocks.", 14) && ts[i].ndim == 2 && dot && !strcmp(dot, ".weight")) {
            lora += (int64_t)r->lora_rank * (ts[i].shape[0] + ts[i].shape[1]);
            linears++;
        }
    }
    free(ts);
    int full = r->tune == AT_TUNE_FULL;
    int64_t trained = (r->train_aligner ? aligner : 0) + (r->train_vit ? (full ? params - aligner : lora) : 0);
    e->n_params += params;
    e->weights += 4 * params + (r->train_vit && !full ? 4 * lora : 0);
    e->n_trainable += trained;
    e->trainable += full ? 0 : 4 * trained;
    e->gradients += 4 * trained;
    e->optimizer += 8 * trained;
    const int64_t mm = (int64_t)vc->spatial_merge_size * vc->spatial_merge_size;
    const int64_t row = r->image_patches < (int64_t)r->seq_len * mm ? r->image_patches : (int64_t)r->seq_len * mm;
    const int64_t N = row * r->batch, W = vc->width, F = vc->intermediate_size;
    const int64_t P = (int64_t)vc->in_chans * vc->temporal_patch_size * vc->patch_size * vc->patch_size;
    const int swiglu = vc->kind == AT_VISION_QWEN2_5_VL;
    const int64_t per_block = N * (6 * W + (2 + swiglu) * F) + (r->train_vit ? N * (2 * W + 6) : 0) +
                              (r->train_vit && !full ? N * r->lora_rank * linears / (vc->depth ? vc->depth : 1) : 0);
    int64_t f32 = per_block * (r->train_vit ? vc->depth : 1) + N * P + 4 * N * W + 3 * (N / mm) * vc->out_hidden_size;
    if (r->train_vit) f32 += N * (7 * W + (2 + swiglu) * F);
    /* Qwen3-VL: each deepstack merger's input copy, norm, MLP layers and output (and its gradient), the
     * interpolated positions' grid and a row block of it */
    f32 += (int64_t)vc->n_deepstack * (4 * N * W + 3 * (N / mm) * vc->out_hidden_size);
    if (vc->num_position_embeddings) f32 += 2 * N * W;
    e->activations += 4 * f32;
}

void at_mem_estimate_train(const at_mem_train_request *r, at_mem_estimate *e)
{
    const at_mem_objective *ob = at_mem_objective_find(r->objective);
    if (!ob) ob = at_mem_objective_find(r->preference ? (r->reference_free ? "cpo" : "dpo") : "sft");
    const at_model_config *c = r->cfg;
    memset(e, 0, sizeof *e);
    e->n_params = at_mem_param_count(c);
    int rank = r->tune == AT_TUNE_FULL ? 0 : r->lora_rank;
    unsigned mask = r->tune == AT_TUNE_FULL ? 0 : r->lora_mask;
    if (r->tune == AT_TUNE_FULL) {
        e->weights = at_mem_weight_bytes(c, AT_F32, AT_F32);
        e->n_trainable = e->n_params;
        e->gradients = e->weights;
        e->optimizer = 2 * e->weights;
    } else {
        at_dtype mat = r->tune == AT_TUNE_QLORA ? r->quant_dtype : r->weight_dtype;
        e->weights = at_mem_weight_bytes(c, mat, r->weight_dtype);
        e->n_trainable = at_mem_lora_params(c, rank, mask);
        e->trainable = lora_bytes(c, rank, mask);
        e->gradients = e->trainable;
        e->optimizer = 2 * e->trainable;
    }
    int B = r->batch * (ob->rows_per_item ? ob->rows_per_item : grpo_generations(r)),
        T = r->seq_len;
    int64_t N = (int64_t)B * T;
    unsigned flags = AT_ACTS_TRAIN | (r->checkpointing ? AT_ACTS_CHECKPOINT : 0);
    size_t all = at_decoder_acts_elems_ex(c, B, T, flags, rank, mask);
    size_t loss = at_decoder_acts_elems_ex(c, B, T, AT_ACTS_LOSS, rank, mask) -
                  at_decoder_acts_elems_ex(c, B, T, 0, rank, mask);
    /* targets on the device and on the host (i32), the positions' losses on the host */
    e->logits = 4 * (int64_t)loss + 12 * N;
    /* the arena, the positions tensor of the acts, and the batch: ids, positions, labels, segments */
    e->activations = 4 * (int64_t)(all - loss) + 4 * N + 16 * N;
    e->attention = attention_bytes(c, B, T, r->threads, 1);
    e->workspace = workspace_bytes(c, N, r->threads, r->runtime_overhead);
    if (r->vision) at_mem_vision(r, e);
    if (ob->extra) e->objective = ob->extra(r, e);
    total(e);
    if (ob->reference && !r->reference_free) {
        int64_t ref = reference_peak(r, e, B, T);
        if (ref > e->total) {
            e->reference = ref - e->total;
            total(e);
        }
    }
}

void at_mem_estimate_infer(const at_mem_infer_request *r, at_mem_estimate *e)
{
    const at_model_config *c = r->cfg;
    memset(e, 0, sizeof *e);
    e->n_params = at_mem_param_count(c);
    at_dtype emb = at_dtype_is_quantized(r->weight_dtype) ? AT_BF16 : r->weight_dtype;
    e->weights = at_mem_weight_bytes(c, r->weight_dtype, emb);
    if (r->lora_rank > 0) {
        e->n_trainable = 0;
        e->trainable = lora_bytes(c, r->lora_rank, r->lora_mask);
    }
    e->kv_per_token = 2 * (int64_t)c->num_hidden_layers * c->num_key_value_heads * c->head_dim *
                      (int64_t)at_dtype_bytes(r->kv_dtype, 1);
    e->kv_cache = e->kv_per_token * r->batch * r->max_seq;
    /* the decoder's scratch (decoder.c): one layer's activations, the residual
     * stream [N, hidden], two rows [B, hidden] and u [N, r] of the LoRA terms;
     * i32 indices ids, pos, q_index [N] and kv_len, last [B] */
    int64_t N = (int64_t)r->batch * (r->prefill_tokens > 0 ? r->prefill_tokens : 1), B = r->batch;
    int64_t hd = c->hidden_size;
    int64_t f32 = (int64_t)(at_layer_acts_elems(c, N) + at_layer_recomputed_elems(c, N)) + N * hd + 2 * B * hd +
                  N * r->lora_rank;
    e->activations = 4 * f32 + 4 * (3 * N + 2 * B) * 2;
    e->attention = attention_bytes(c, B, r->prefill_tokens, r->threads, 0);
    e->logits = 4 * B * (int64_t)c->vocab_size;
    e->workspace = workspace_bytes(c, N, r->threads, r->runtime_overhead);
    total(e);
}
