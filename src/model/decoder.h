/* The Llama-family decoder: one implementation for Llama 2/3, Mistral,
 * Qwen2/2.5, Qwen3, SmolLM, TinyLlama, whatever file the weights came from
 * (Hugging Face folder, GGUF, llama2.c). The differences between those models
 * are fields of at_model_config.
 *
 *   x_0     = embed[ids]
 *   x_{l+1} = mlp_block_l(attention_block_l(x_l))        (layers.h)
 *   logits  = rmsnorm(x_L) · w_norm · W_headᵀ            (W_head = embed when tied)
 *
 * Two ways to run it:
 *  - training (at_decoder_forward_train, at_decoder_loss,
 *    at_decoder_backward): a batch [B, T] with positions and optional
 *    segment ids (packed samples), keeping the activations (or, with
 *    gradient checkpointing, each layer's input) in an at_decoder_acts, the
 *    loss and the gradients of LoRA adapters or of every weight;
 *  - inference (at_decoder_prefill / at_decoder_decode_step): with a KV cache
 *    (kv_cache.h), a batch of sequences of different lengths, logits for the
 *    last new token of each sequence (or for every new token).
 * Everything runs through ops/ops.h on the weights' backend; activations are
 * f32. */
#ifndef AT_MODEL_DECODER_H
#define AT_MODEL_DECODER_H

#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"
#include "model/adapter.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/layers.h"
#include "model/weights.h"

typedef struct at_decoder_scratch at_decoder_scratch;

typedef struct at_decoder {
    at_model_config cfg;
    at_decoder_weights *w; /* owned */
    at_backend *be;        /* = w->backend */
    at_tensor *inv_freq;   /* f32 [head_dim/2], RoPE after rope_scaling */
    float attn_scale;      /* 1/sqrt(head_dim) */
    at_decoder_scratch *scratch; /* inference buffers, grown on demand */
    at_adapter *adapter;   /* LoRA applied by every forward; NOT owned; NULL: none (at_decoder_set_adapter) */
    /* Quantized (QLoRA) weights: whether activations are rounded to bf16
     * before their products (see at_layer_io.qact): -1 when the backend has
     * fast bf16 (the default), 0 never, 1 always. */
    int quant_bf16;
    at_tensor *qact;       /* the bf16 scratch for that, owned, grown on demand */
    /* M-RoPE (cfg.mrope_section set: Qwen2-VL's language model): n = 3, len =
     * the sections; positions are then i32 [.., 3] (t, h, w) per token. n = 0: one. */
    at_rope_sections mrope;
} at_decoder;

/* The sections of at_rope for d's positions (NULL: one position per token), and
 * how many positions each token has (1 or 3). */
static inline const at_rope_sections *at_decoder_sections(const at_decoder *d) { return d->mrope.n ? &d->mrope : NULL; }
static inline int at_decoder_pos_width(const at_decoder *d) { return d->mrope.n ? d->mrope.n : 1; }

/* Input-embedding injection (a vision tower's features in place of the
 * <|image_pad|> tokens' embeddings): x has N = B·T rows [N, hidden], ids the
 * host copy of the batch's ids [N]. Row j of feats [n, hidden] goes to the
 * j-th token whose id is `token` (row-major order); n must equal their count.
 *   AT_PLACE_SET (0):  x[pos_j] = feats[j]                      (forward)
 *   AT_PLACE_TAKE (1): feats[j] = x[pos_j], then x[pos_j] = 0: the
 *     gradient reaches the features, and the embedding table gets none from
 *     those rows (their lookup was overwritten)                (its backward)
 *   AT_PLACE_ADD (2):  x[pos_j] += feats[j]    (Qwen3-VL's deepstack features)
 *   AT_PLACE_GET (3):  feats[j] = x[pos_j]                     (its backward)
 * One copy per run of consecutive such tokens (an image is one run). */
enum { AT_PLACE_SET = 0, AT_PLACE_TAKE = 1, AT_PLACE_ADD = 2, AT_PLACE_GET = 3 };
at_status at_decoder_place_features(at_tensor *x, at_tensor *feats, const int32_t *ids, int64_t N, int32_t token,
                                    int mode);
/* dst: the view of layer l's rows of deepstack [n_deepstack · n, hidden] (at_fwd_opts). */
void at_decoder_deepstack_rows(at_tensor *dst, const at_tensor *deepstack, int n_deepstack, int l);
/* The bf16 scratch for `rows` tokens when activations times quantized weights
 * should be computed in bf16 (quant_bf16 above, and some matrix is
 * quantized); *out NULL otherwise. Owned by d; valid until the next call. */
at_status at_decoder_qact(at_decoder *d, int64_t rows, at_tensor **out);

/* AT_ERR_UNSUPPORTED when a sequence of `tokens` tokens exceeds the model's
 * sliding window (only full attention is implemented, which equals windowed
 * attention up to the window's length); AT_OK otherwise. */
at_status at_decoder_check_window(const at_decoder *d, int64_t tokens);

/* Makes a decoder over w (checked with at_decoder_weights_check). Takes
 * ownership of w on success only. Caller frees with at_decoder_free. */
at_status at_decoder_new(at_decoder_weights *w, at_decoder **out);
void at_decoder_free(at_decoder *d); /* frees the weights too; NULL ok (never the adapter) */

/* ---- LoRA --------------------------------------------------------------------- */

/* From now on every forward (training forward, prefill, decode) applies the
 * adapter unmerged: each adapted linear layer computes
 *     y = x·Wᵀ + b + s · (drop(x)·Aᵀ)·Bᵀ        (s = ad->scale)
 * with dropout only in at_decoder_forward_train. `ad` is not owned and must
 * outlive its use; NULL removes the adapter. It must have been made for this
 * model (layer count, shapes) on the decoder's backend. Activations
 * (at_decoder_acts) hold the LoRA intermediates of the adapter set when they
 * were allocated: set the adapter first, then allocate them. */
at_status at_decoder_set_adapter(at_decoder *d, at_adapter *ad);
/* The LoRA settings of layer l for a forward with dropout p and seed, filled
 * into *buf (returns buf), or NULL without an adapter. Each layer draws its
 * dropout masks from its own seed, at_rng_mix(seed, l) (and each module
 * from at_rng_mix of that and m, layers.h); the batch is one row from row 0
 * (set first_row and row_tokens for a batch of several rows). */
const at_layer_lora *at_decoder_layer_lora(const at_decoder *d, int l, float p, uint64_t seed, at_layer_lora *buf);

/* ---- training forward ------------------------------------------------------ */

/* The index given to at_rng_mix with the dropout seed for the NEFTune noise
 * (a stream apart from every layer's LoRA masks, which use the layer index). */
#define AT_NEFTUNE_STREAM 0x6e656674756e65ull /* "neftune" */

/* Flags of at_decoder_acts_new_ex. */
#define AT_ACTS_TRAIN 1u      /* buffers of the loss and the backward (gradients of the activations,
                                 one logits chunk, targets, LoRA dropout scratch) */
#define AT_ACTS_CHECKPOINT 2u /* gradient checkpointing: keep only each layer's input (resid[l]) and
                                 one layer's activations; the backward recomputes a layer's activations
                                 right before its backward. Same gradients, far less memory. */
#define AT_ACTS_LOSS 4u       /* only the loss buffers (evaluation: at_decoder_loss without gradients);
                                 implied by AT_ACTS_TRAIN */

/* Activations of a [B, T] batch, everything the backward needs. */
typedef struct at_decoder_acts {
    int B, T, n_layers;
    unsigned flags;         /* AT_ACTS_* given at allocation */
    at_tensor *arena;       /* f32, owns the memory of every view below */
    at_tensor *resid;       /* [n_layers + 1] views [B·T, hidden]: resid[0] = embeddings,
                               resid[l+1] = output of layer l */
    at_layer_acts *layers;  /* [n_layers]; with AT_ACTS_CHECKPOINT all alias one set (valid for the
                               layer computed last) */
    at_tensor final_norm;   /* rmsnorm(resid[L]) · w_norm    [B·T, hidden] */
    at_tensor final_rstd;   /*                               [B·T] */
    at_tensor *pos;         /* i32 [B, T] (M-RoPE: [B, T, 3]): 0..T-1 in every row (used when no positions
                               are given) */
    /* LoRA: rank and modules the LoRA intermediates were laid out for (0, 0: none) */
    int lora_rank;
    unsigned lora_mask;
    /* What the last forward ran on, kept for the loss and the backward: the
     * caller's tensors (not owned: they must stay alive and unchanged until
     * the backward), the dropout of the LoRA inputs and its seed. */
    const at_tensor *ids, *fwd_pos, *segments;
    float lora_dropout;
    uint64_t dropout_seed;
    /* at_fwd_opts.first_row, recorded by the training forward (at_decoder_forward_train
     * reads it from here, as set by the caller): the index of the batch's first
     * row among the rows of the training step (all micro-batches, pieces and
     * ranks; 0 for one batch). LoRA dropout masks are keyed by (that row + b,
     * token, feature), so a row draws the same mask however the step's rows
     * are laid out in micro-batches (layers.h). */
    int64_t dropout_first_row;
    /* at_fwd_opts.neftune_* (recorded like first_row; 0: off): NEFTune (Jain et
     * al. 2023; transformers' --neftune_noise_alpha) adds uniform noise to the
     * embeddings, x_0 = embed[ids] + U(−m, m), m = alpha / sqrt(L · hidden),
     * in at_decoder_forward_train only (never at_decoder_forward: evaluation,
     * DPO's reference pass, generation). L is neftune_columns, or T when 0
     * (transformers: input_ids.size(1), padding included). The noise is keyed
     * by (row of the step, token, feature) as the dropout masks are, from
     * at_rng_mix(dropout_seed, AT_NEFTUNE_STREAM). */
    float neftune_alpha;
    int64_t neftune_columns;
    /* at_fwd_opts' injection, recorded by the training forward for the backward */
    const at_tensor *features;
    const int32_t *host_ids;
    int32_t feature_token;
    at_tensor *d_features;
    const at_tensor *deepstack;
    int n_deepstack;
    at_tensor *d_deepstack;
    int forward_done;       /* a forward ran since allocation */
    int loss_done;          /* at_decoder_loss left d_final ready (with gradients) */
    /* AT_ACTS_LOSS or AT_ACTS_TRAIN (buf NULL otherwise): */
    int chunk_rows;         /* rows of logits computed at once */
    at_tensor logits_chunk; /* [chunk_rows, V] f32: logits, then their gradient */
    /* at_decoder_loss computes logits for the n positions that have a target
     * only, k = 0..n-1 in order: */
    at_tensor target_loss;  /* [B·T] f32: loss of target k, chunk by chunk */
    at_tensor *targets;     /* i32 [B·T]: target k (the label its position predicts) */
    at_tensor *target_pos;  /* i32 [B·T]: position of target k */
    at_tensor target_rows;  /* [B·T, hidden] f32: final_norm of target k's position, then its
                               gradient (where some positions have none) */
    int32_t *host_targets;  /* host [3·B·T] (owned): each position's target (−100: none),
                               then the targets and positions of k */
    float *host_target_loss; /* host [B·T] (owned) */
    /* AT_ACTS_TRAIN only (buf NULL otherwise): */
    at_tensor d_final;      /* dL/d final_norm [B·T, hidden], written by at_decoder_loss */
    at_tensor d_resid;      /* dL/d resid[l] while the backward runs [B·T, hidden] */
    at_layer_bwd_scratch bwd;
} at_decoder_acts;

/* Allocates the activations of a [B, T] batch on the decoder's backend,
 * keeping every layer's activations (no checkpointing) and no backward
 * buffers: the forward-only case. Caller frees with at_decoder_acts_free. */
at_status at_decoder_acts_new(const at_decoder *d, int B, int T, at_decoder_acts **out);
/* Same with flags AT_ACTS_*: training uses AT_ACTS_TRAIN, and
 * AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT for gradient checkpointing (the
 * default of the trainer). The LoRA intermediates follow d->adapter. */
at_status at_decoder_acts_new_ex(const at_decoder *d, int B, int T, unsigned flags, at_decoder_acts **out);
void at_decoder_acts_free(at_decoder_acts *a); /* NULL ok */
/* f32 elements at_decoder_acts_new allocates for [B, T] (memory planning). */
size_t at_decoder_acts_elems(const at_model_config *cfg, int B, int T);
/* f32 elements of at_decoder_acts_new_ex with flags and a LoRA adapter of
 * lora_rank on the modules of lora_mask (0, 0: none). Index tensors and the
 * small host arrays are not counted. */
size_t at_decoder_acts_elems_ex(const at_model_config *cfg, int B, int T, unsigned flags, int lora_rank,
                                unsigned lora_mask);

/* Forward of a batch. ids: i32 [B, T]; pos: i32 [B, T] positions (NULL:
 * 0..T-1 in every row; M-RoPE models: i32 [B, T, 3], NULL giving all three
 * 0..T-1); segments: i32 [B, T] or NULL. With segments, a token
 * attends only to earlier tokens of its own segment (packed samples: give
 * positions restarting at 0 in each segment). All on the decoder's backend.
 * Leaves the result in acts->final_norm; logits with at_decoder_logits. */
at_status at_decoder_forward(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids, const at_tensor *pos,
                             const at_tensor *segments);
/* The training forward: as at_decoder_forward, with dropout p = lora_dropout
 * (--lora_dropout) on the input of every LoRA module, masks drawn from
 * `dropout_seed` (counter-based: reproducible at any thread count and
 * regenerated by the backward; give each micro-batch its own seed). p > 0
 * needs acts made with AT_ACTS_TRAIN. With acts->neftune_alpha > 0 the
 * embeddings get NEFTune noise (see at_decoder_acts). ids, pos and segments
 * must stay alive and unchanged until the backward. */
at_status at_decoder_forward_train(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                   const at_tensor *pos, const at_tensor *segments, float lora_dropout,
                                   uint64_t dropout_seed);

/* The options of one training forward, given with the call (the trainer's
 * step computes them; see at_decoder_acts for what each one keys). The
 * forward records them in acts for the backward. */
typedef struct at_fwd_opts {
    float lora_dropout;      /* p of the LoRA inputs' dropout (0: off) */
    uint64_t dropout_seed;   /* the step's seed of the dropout masks and the NEFTune noise */
    int64_t first_row;       /* the batch's first row among the step's rows (acts->dropout_first_row) */
    float neftune_alpha;     /* NEFTune's alpha (0: off) */
    int64_t neftune_columns; /* its L (0: the batch's T) */
    /* Input-embedding injection (at_decoder_place_features; NULL features: none):
     * features f32 [n, hidden] replace the embeddings of the tokens whose id is
     * feature_token (after NEFTune's noise, which is on the text's embeddings,
     * as transformers' hook on embed_tokens). host_ids: the host copy of ids
     * [B·T]. d_features (NULL: not wanted) f32 [n, hidden]: the backward writes
     * dL/dfeatures there. All must stay alive until the backward.
     * Qwen3-VL's deepstack (NULL deepstack or n_deepstack 0: none): deepstack
     * f32 [n_deepstack · n, hidden], n rows a layer; rows l·n.. are added to
     * the feature tokens' hidden states after decoder layer l (l <
     * n_deepstack). d_deepstack (NULL: not wanted) gets their gradient. */
    const at_tensor *features;
    const int32_t *host_ids;
    int32_t feature_token;
    at_tensor *d_features;
    const at_tensor *deepstack;
    int n_deepstack;
    at_tensor *d_deepstack;
} at_fwd_opts;

/* The options the calls without at_fwd_opts run with: first_row and NEFTune's
 * as acts holds them, no injection (features are given with at_fwd_opts only:
 * a previous call's are never reused, they may be freed by now). */
at_fwd_opts at_decoder_acts_opts(const at_decoder_acts *a, float lora_dropout, uint64_t dropout_seed);

/* The training forward with its options as an argument; at_decoder_forward_train
 * is this with first_row and NEFTune's fields read from acts. */
at_status at_decoder_forward_train_opts(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                        const at_tensor *pos, const at_tensor *segments, const at_fwd_opts *o);

/* logits [n, V] (f32 or bf16) = hidden [n, hidden] · W_headᵀ, for rows of
 * final_norm (a view of some of its rows computes only those: big
 * vocabularies need not be done all at once). */
at_status at_decoder_logits(at_decoder *d, at_tensor *logits, const at_tensor *hidden);

/* ---- loss, gradients, backward ---------------------------------------------- */

/* Gradient buffers, f32, accumulated into by the loss and the backward
 * (micro-batches add up) and reset by at_decoder_grads_zero. Frozen tensors
 * have none. */
typedef struct at_decoder_grads {
    /* LoRA training: dA, dB of every adapted module, same structure, shapes
     * and tensor names as the decoder's adapter (A/B members hold the
     * gradients; rank, alpha, ... copied). NULL for full fine-tuning. */
    at_adapter *lora;
    /* Full fine-tuning (--train_type full): the gradient of every weight,
     * same shapes and names as d->w (lm_head == embed when tied: both
     * contributions land in one tensor). NULL for LoRA. */
    at_decoder_weights *full;
} at_decoder_grads;

/* Zeroed gradient buffers on the decoder's backend: of its adapter's A and B
 * (full == 0; an adapter must be set), or of every weight (full == 1; every
 * weight must then be f32, else an error says to load the model as f32).
 * Caller frees with at_decoder_grads_free. */
at_status at_decoder_grads_new(const at_decoder *d, int full, at_decoder_grads **out);
at_status at_decoder_grads_zero(at_decoder_grads *g);
void at_decoder_grads_free(at_decoder_grads *g); /* NULL ok */

/* A trainable tensor and its gradient (not owned: views of the decoder's
 * adapter or weights and of g). */
typedef struct at_param_grad {
    at_tensor *param, *grad;
} at_param_grad;
/* Lists the trainable tensors of g's kind in a fixed order (layer by layer,
 * module order, A before B; for full FT: embed, then each layer's tensors in
 * at_layer_weights order, final_norm, lm_head when not tied). Writes up to
 * cap entries to out (may be NULL with cap 0) and returns how many there are. */
int at_decoder_trainables(at_decoder *d, const at_decoder_grads *g, at_param_grad *out, int cap);

/* What the loss reports. The caller may point the arrays at host memory to
 * get per-row or per-token values (NULL: not wanted). */
typedef struct at_loss_stats {
    double loss_sum;       /* out: Σ over the targets of −log p(target) */
    int64_t n_targets;     /* out: number of targets */
    double *row_loss;      /* in: NULL or host [B]: filled with each row's loss sum */
    int64_t *row_targets;  /* in: NULL or host [B]: each row's number of targets */
    float *token_loss;     /* in: NULL or host [B·T]: −log p of the target predicted at position
                              (b, t), 0 where there is none */
    const float *row_grad_scale; /* in: NULL or host [B]: row b's gradient is that of its loss sum times
                              grad_scale · row_grad_scale[b] (any sign; 0 gives the row none). For
                              objectives weighting whole sequences (DPO); NULL: grad_scale everywhere */
    const float *token_grad_scale; /* in: NULL or host [B·T]: the gradient of the target predicted at
                              position (b, t) is that of its −log p times token_grad_scale[b·T + t]
                              (with row_grad_scale, both apply). For objectives weighting each token
                              (GRPO's clipped ratios); NULL: 1 everywhere */
} at_loss_stats;

/* Causal-LM loss of the batch of the last forward on acts.
 * labels: i32 [B, T] on any backend (host is fine), unshifted as in Hugging
 * Face (labels[b, t] is the token at t; −100 = ignored). Position t predicts
 * labels[b, t+1]: the last position of each row, and with segments any t
 * where segments[t+1] != segments[t] (the next sample of a packed row), has
 * no target. The logits are computed a few rows at a time (never [B·T, V] at
 * once). acts must be made with AT_ACTS_LOSS (evaluation) or AT_ACTS_TRAIN.
 * With g != NULL (acts made with AT_ACTS_TRAIN) it also computes the
 * gradient of loss_sum · grad_scale: dL/d final_norm into acts->d_final for
 * at_decoder_backward, and for full FT adds the lm_head gradient to g. The
 * trainer passes grad_scale = 1 / (supervised tokens of the whole optimizer
 * step), as transformers >= 4.46 does. With stats->row_grad_scale each row
 * has its own scale (no logits chunk then spans two rows). */
at_status at_decoder_loss(at_decoder *d, at_decoder_acts *acts, const at_tensor *labels, float grad_scale,
                          at_decoder_grads *g, at_loss_stats *stats);

/* Multiplies row b of the gradient the last at_decoder_loss (with g) left in
 * acts->d_final by row_scale[b] (host [B], any sign). d_final is linear in
 * the loss's gradient scale, so a loss pass followed by this equals a pass
 * with row_grad_scale: objectives whose row weights depend on the rows' own
 * losses (DPO) learn them and weight the rows from one pass over the
 * vocabulary instead of two. LoRA only: for full fine-tuning the loss has
 * already added the (unweighted) lm_head gradient to g, so g->full is
 * refused. */
at_status at_decoder_loss_scale_rows(at_decoder_acts *acts, const at_decoder_grads *g, const float *row_scale);

/* For objectives whose loss reads the final hidden states themselves (a
 * reward model's score head) rather than the LM head's logits: sets dL/d
 * final_norm to host[B·T·hidden] (f32, row-major like final_norm), so that
 * at_decoder_backward can follow as after at_decoder_loss. Needs activations
 * made with AT_ACTS_TRAIN and a forward done. */
at_status at_decoder_set_d_final(at_decoder_acts *acts, const float *host);

/* Backward of the last forward, from the d_final left by at_decoder_loss:
 * adds the gradients to g (LoRA dA/dB, or every weight for full FT).
 * With AT_ACTS_CHECKPOINT each layer's activations are recomputed first. */
at_status at_decoder_backward(at_decoder *d, at_decoder_acts *acts, at_decoder_grads *g);

/* The three in one: at_decoder_forward_train, at_decoder_loss (with g),
 * at_decoder_backward. */
at_status at_decoder_forward_backward(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                      const at_tensor *pos, const at_tensor *segments, const at_tensor *labels,
                                      float lora_dropout, uint64_t dropout_seed, float grad_scale,
                                      at_decoder_grads *g, at_loss_stats *stats);
/* The same with the forward's options as an argument (at_fwd_opts). */
at_status at_decoder_forward_backward_opts(at_decoder *d, at_decoder_acts *acts, const at_tensor *ids,
                                           const at_tensor *pos, const at_tensor *segments, const at_tensor *labels,
                                           const at_fwd_opts *o, float grad_scale, at_decoder_grads *g,
                                           at_loss_stats *stats);

/* ---- inference with a KV cache -------------------------------------------- */

/* Runs T new tokens per sequence through the model, appending their keys and
 * values to the cache after each sequence's cached tokens.
 *   ids:    host i32 [B, T] row-major, B = cache->batch;
 *   n_new:  host [B]: sequence b has n_new[b] <= T new tokens (its first
 *           n_new[b] ids; the rest is padding and ignored); 0 leaves that
 *           sequence untouched; NULL means T for every sequence;
 *   logits: f32 on the decoder's backend, [B, V] for the last new token of
 *           each sequence, or [B, T, V] (all_positions) for every new token.
 *           Rows of padding and of skipped sequences are undefined.
 * The cache lengths grow by n_new. Refused when a sequence would outgrow the
 * cache, or a model trained with a sliding window would see more tokens than
 * the window. */
at_status at_decoder_prefill(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                             at_tensor *logits, int all_positions);

/* What a prefill may add to its ids (NULL / 0 members: nothing). */
typedef struct at_prefill_extra {
    /* M-RoPE models: host i32 [B, T, 3], the new tokens' (t, h, w) positions
     * counted from the sequence's start (mrope.h). The cache's rope_delta of
     * each sequence becomes its largest position + 1 − its new length, so the
     * tokens decoded next continue after them. NULL: len + rope_delta + t, the
     * same in all three. */
    const int32_t *mrope_pos;
    /* f32 [n, hidden] on the decoder's backend, placed at the new tokens whose
     * id is feature_token (sequence by sequence; at_decoder_place_features). */
    const at_tensor *features;
    int32_t feature_token;
    /* Qwen3-VL's deepstack features (at_fwd_opts), for the same tokens */
    const at_tensor *deepstack;
    int n_deepstack;
} at_prefill_extra;

/* at_decoder_prefill with extra (NULL: at_decoder_prefill). */
at_status at_decoder_prefill_ex(at_decoder *d, at_kv_cache *cache, const int32_t *ids, int T, const int *n_new,
                                at_tensor *logits, int all_positions, const at_prefill_extra *extra);

/* One token per sequence: ids host [B]; active host [B] (NULL: all) says
 * which sequences take a token. logits f32 [B, V]. */
at_status at_decoder_decode_step(at_decoder *d, at_kv_cache *cache, const int32_t *ids, const int *active,
                                 at_tensor *logits);

#endif
