/* The memory model of the resource planner: how many bytes a training step
 * or an inference session needs on the device, part by part, from the model
 * config and the options alone (nothing is allocated).
 *
 * The parts follow what the code really allocates, so that the estimate can
 * be checked against measured peaks (tests/test_plan.c):
 *   weights      the model's tensors in the format they are held in: the
 *                frozen base (bf16 / f16 / f32; QLoRA: the linear layers'
 *                matrices in NF4 / q8_0 / q4_0 bytes, embeddings, lm_head,
 *                norms and biases unquantized), or for full fine-tuning every
 *                weight in f32 (trainer.c loads it so);
 *   trainable    LoRA A and B of every adapted module, f32 (0 for full
 *                fine-tuning: the weights themselves are trained);
 *   gradients    one f32 gradient per trainable value (model/decoder.h
 *                at_decoder_grads);
 *   optimizer    AdamW's two f32 moments per trainable value;
 *   activations  at_decoder_acts_elems_ex (the decoder's own arena plan, so
 *                checkpointing and LoRA intermediates are counted exactly as
 *                allocated) less the logits part, plus the batch's index
 *                tensors;
 *   attention    the attention kernels' scratch (per-thread tiles and one
 *                float per query row in the backward; no T×T matrix is ever
 *                formed);
 *   logits       one chunk of logits and its loss (the loss never holds
 *                [B·T, V] at once) and the targets;
 *   workspace    GEMM packing buffers (per thread on the CPU), library
 *                workspaces, and the device runtime's own overhead (a CUDA
 *                context, ...) from the device profile;
 *   reference    DPO, KTO: the reference pass's peak above the step's, if
 *                any (at_mem_train_request.reference_free);
 *   objective    what the objective holds beside the decoder's parts (a
 *                reward model's score head and its buffers; GRPO's
 *                generation), from its row of the objective table below.
 * Inference: weights + KV cache (per token: 2 · layers · kv_heads ·
 * head_dim · bytes of the cache format) + the decoder's prefill scratch and
 * logits. */
#ifndef AT_PLAN_MEMORY_H
#define AT_PLAN_MEMORY_H

#include <stdint.h>
#include "device/dtype.h"
#include "model/config.h"
#include "model/vision_config.h"

typedef enum { AT_TUNE_LORA = 0, AT_TUNE_QLORA, AT_TUNE_FULL } at_tune_kind;

/* "lora", "qlora", "full" */
const char *at_tune_kind_name(at_tune_kind k);

typedef struct at_mem_train_request at_mem_train_request;
typedef struct at_mem_estimate at_mem_estimate;

/* What an objective changes in a training step's memory: one row per
 * objective (memory.c), found by the objective's name (train/objective.c's
 * names: sft, pt, dpo, cpo, simpo, orpo, kto, rm; a new objective adds its
 * row). */
typedef struct at_mem_objective {
    const char *name;
    int rows_per_item;  /* rows one item runs at once: 1; 2 for a preference pair (chosen and rejected, DPO
                           family and rm) and for a KTO example (the example and its KL row, the KL batch);
                           0: the request's num_generations (a GRPO prompt's completions) */
    int reference;      /* a reference pass before training (dpo, kto; see reference_free below) */
    /* NULL: nothing else. Else the bytes the objective holds at the step's
     * peak beside the decoder's parts, given those parts in e: rm's score
     * head (f32, its gradient and AdamW moments) and its per-step host
     * buffers (train/reward.c); GRPO's generation KV cache and its group of
     * num_generations completions per prompt (the request's grpo fields)
     * go here. */
    int64_t (*extra)(const at_mem_train_request *r, const at_mem_estimate *e);
} at_mem_objective;

/* The row of objective `name`; NULL when there is none. */
const at_mem_objective *at_mem_objective_find(const char *name);

struct at_mem_train_request {
    const at_model_config *cfg;
    at_tune_kind tune;
    at_dtype weight_dtype;   /* format of the frozen tensors (bf16, f16, f32); ignored for full (f32) */
    at_dtype quant_dtype;    /* QLoRA: format of the linear layers' matrices (AT_NF4, AT_Q8_0, AT_Q4_0) */
    int lora_rank;           /* LoRA / QLoRA */
    unsigned lora_mask;      /* modules adapted, bits 1 << AT_MOD_* */
    int batch;               /* rows per micro-batch (B) */
    int seq_len;             /* tokens per row (T) */
    int checkpointing;       /* gradient checkpointing */
    int preference;          /* preference objectives: chosen and rejected rows, so 2·B rows run at once */
    int threads;             /* CPU threads (per-thread scratch); 0 or 1 for a GPU */
    int64_t runtime_overhead;/* bytes the device runtime holds before any tensor (device profile) */
    /* DPO's reference pass (with preference, unless reference_free): the
     * trainer computes the reference log-probs once, before the gradients and
     * optimizer state exist, by a forward without gradients that keeps only
     * the layer inputs (train/preference.h at_pref_reference), by the
     * policy's base or by --ref_model held beside the policy. Its peak counts
     * when it is above the step's (at_mem_estimate.reference): in practice
     * with --ref_model, whose weights the step does not hold. */
    int reference_free;      /* cpo, simpo, orpo: no reference pass */
    const at_model_config *ref_cfg; /* --ref_model's config; NULL: the policy's base is the reference */
    at_dtype ref_dtype;      /* full fine-tuning with ref_cfg: the format --ref_model is loaded in (the
                                file's); LoRA and QLoRA load it as the policy (weight_dtype, quant_dtype) */
    const char *objective;   /* its at_mem_objective row; NULL: "dpo" with preference (cpo without a
                                reference pass), else "sft" */
    /* GRPO (its row's extra): completions per prompt and their longest length, the KL's beta (> 0: a
     * reference pass per generated batch; with full fine-tuning a frozen copy of the weights, held in
     * ref_dtype) and num_iterations (> 1: the old policy's pass) */
    int num_generations, max_completion_length;
    double beta;
    int num_iterations;
    /* a vision-language model (NULL: a text model): its tower, the image patches of one row (at most
     * seq_len · merge², the image tokens being part of its tokens), and which parts train (--freeze_vit false:
     * LoRA of lora_rank on its linears, or every weight with full; --freeze_aligner false: the merger).
     * Counted (at_mem_vision): its f32 weights in weights, what trains in trainable / gradients /
     * optimizer, its forward's activations (every block's when the vision transformer trains, else one
     * block's and the merger's) and its backward's scratch in activations. */
    const at_vision_config *vision;
    int64_t image_patches;
    int train_vit, train_aligner;
};

struct at_mem_estimate {
    int64_t weights, trainable, gradients, optimizer, activations, attention, logits, workspace;
    int64_t reference;       /* DPO, KTO: how much more the reference pass needs than the training step
                                (0 when it needs less); part of total, which is the larger peak */
    int64_t objective;       /* the objective's own (at_mem_objective.extra) */
    int64_t kv_cache;        /* inference */
    int64_t kv_per_token;    /* inference: bytes of cache per token of one sequence */
    int64_t total;           /* sum of the parts */
    int64_t n_params;        /* parameters of the model (the tied head once) */
    int64_t n_trainable;     /* values trained */
};

/* Parameters of the model the config describes (as at_decoder_weights_count). */
int64_t at_mem_param_count(const at_model_config *cfg);
/* Bytes of the model's weights with the linear layers' matrices in
 * `matrix_dtype` (may be quantized), embeddings and lm_head in `embed_dtype`,
 * norms and biases f32. */
int64_t at_mem_weight_bytes(const at_model_config *cfg, at_dtype matrix_dtype, at_dtype embed_dtype);
/* LoRA parameters of rank r on the modules of mask, summed over layers. */
int64_t at_mem_lora_params(const at_model_config *cfg, int rank, unsigned mask);

/* The vision tower's parts of r (r->vision set) added to e: see the request's fields. */
void at_mem_vision(const at_mem_train_request *r, at_mem_estimate *e);

/* Estimate of one training step's peak. */
void at_mem_estimate_train(const at_mem_train_request *r, at_mem_estimate *out);

typedef struct at_mem_infer_request {
    const at_model_config *cfg;
    at_dtype weight_dtype;   /* bf16, f16, f32, or quantized (q8_0, q4_0, nf4: matrices; the rest bf16) */
    at_dtype kv_dtype;       /* cache format: f32, bf16, f16 */
    int batch;               /* sequences at once */
    int max_seq;             /* cache rows per sequence (prompt + new tokens) */
    int prefill_tokens;      /* tokens per sequence run at once in the prefill (the prompt) */
    int lora_rank;           /* adapter applied unmerged (0: none) */
    unsigned lora_mask;
    int threads;
    int64_t runtime_overhead;
} at_mem_infer_request;

void at_mem_estimate_infer(const at_mem_infer_request *r, at_mem_estimate *out);

#endif
