/* The resource planner: from the device profile (profiles.h), the model
 * config and the user's options, decides how a job runs so that it fits the
 * device, and says why.
 *
 * Training (sft, pt, dpo):
 *   - number format: what --torch_dtype says; else bf16 where the device has
 *     fast bf16 (Ampere and newer GPUs, Ascend, CPUs with AVX512_BF16); f16
 *     with dynamic loss scaling on accelerators with fast f16 but not bf16
 *     (V100, T4, Apple M-series); f32 otherwise (kept in the model's 16-bit
 *     format when f32 weights would not fit). Full fine-tuning trains f32
 *     weights (trainer.c) whatever the device;
 *   - micro-batch: the largest divisor of the effective batch (per-device
 *     batch × accumulation as asked) that fits under the budget
 *     (--max_memory, else 90% of the free memory), accumulation raised so
 *     that the effective batch stays what was asked;
 *   - gradient checkpointing: off when everything fits without it (faster),
 *     on when the activations would not fit;
 *   - QLoRA (NF4 frozen matrices) only with --train_type auto, when even
 *     LoRA with checkpointing and a micro-batch of 1 does not fit.
 * What the user set explicitly is kept; when the plan cannot fit, the error
 * says how much is needed, how much is free and which option would fit.
 *
 * Inference (infer): weights plus the KV cache of the context asked for. */
#ifndef AT_PLAN_PLANNER_H
#define AT_PLAN_PLANNER_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "device/dtype.h"
#include "model/config.h"
#include "plan/memory.h"
#include "plan/profiles.h"

typedef struct at_plan_request {
    const at_model_config *cfg;
    const char *model;            /* path, shown in the plan */
    const char *command;          /* "sft", "pt", "dpo", "infer" */
    /* training */
    const char *train_type;       /* "lora", "qlora", "full" or "auto"; NULL: lora */
    int train_type_set;           /* the user chose it (else: the default) */
    int quant_bits;               /* --quant_bits: 4 (NF4) or 8 (q8_0) frozen matrices (QLoRA); 0: none */
    int lora_rank;
    unsigned target_mask;         /* bits 1 << AT_MOD_* */
    int max_length;               /* tokens per row (T; padded batches are at most this long) */
    int batch_size, batch_size_set;       /* --per_device_train_batch_size, and whether the user set it */
    int grad_accum, grad_accum_set;       /* --gradient_accumulation_steps */
    int checkpointing, checkpointing_set; /* --gradient_checkpointing */
    int has_dtype;                /* --torch_dtype given */
    at_dtype dtype;
    int has_model_dtype;          /* the format the model's matrices are stored in, when known */
    at_dtype model_dtype;
    int preference;               /* dpo: chosen and rejected rows */
    int reference_free;           /* with preference: cpo, simpo, orpo (no DPO reference pass) */
    const at_model_config *ref_cfg; /* DPO --ref_model's config (NULL: the policy's base is the reference) */
    const char *objective;        /* the objective's name (plan/memory.h at_mem_objective); NULL: from
                                     preference and reference_free */
    /* grpo: --num_generations (0: 8), --max_completion_length, --beta, --num_iterations */
    int num_generations, max_completion_length;
    double beta;
    int num_iterations;
    /* a vision-language model (NULL: text): its tower, the patches of one row's images (one image at
     * --max_pixels a row), the parts that train (plan/memory.h) */
    const at_vision_config *vision;
    int64_t image_patches;
    int train_vit, train_aligner;
    int64_t max_memory;           /* --max_memory bytes; 0: 90% of the free memory */
    /* inference */
    int infer_batch;              /* sequences at once (default 1) */
    int max_seq;                  /* context: prompt + new tokens (default: max_length, else the model's) */
    int prefill_tokens;           /* prompt tokens run at once (default: max_seq) */
    at_dtype kv_dtype;            /* KV cache format (default f32: the generator's, exact) */
    int adapter_rank;             /* an adapter applied unmerged (0: none) */
    unsigned adapter_mask;
} at_plan_request;

/* Defaults of ms-swift's options (LoRA rank 8 on all linear layers, batch 1,
 * accumulation 1, max_length 2048, checkpointing on), nothing set explicitly. */
void at_plan_request_defaults(at_plan_request *rq);

#define AT_PLAN_WHY 384

typedef struct at_plan {
    at_device_profile dev;
    int train;                   /* a training plan; else inference */
    char command[16];
    char model[256];
    char model_desc[160];        /* at_model_config_describe */
    int64_t n_params;
    /* decisions */
    at_tune_kind tune;
    at_dtype weight_dtype;       /* frozen tensors (full: f32) */
    at_dtype compute_dtype;      /* matmul format */
    int quantized;               /* QLoRA: the frozen matrices in quant_dtype */
    at_dtype quant_dtype;
    int loss_scaling;            /* f16: dynamic loss scaling */
    int lora_rank;
    unsigned target_mask;
    int batch_size, grad_accum, effective_batch, seq_len;
    int checkpointing;
    int infer_batch, max_seq;    /* inference */
    at_dtype kv_dtype;
    /* the budget */
    int64_t budget;
    char budget_why[96];         /* "--max_memory 8GB", "90% of the 79.4 GiB free" */
    at_mem_estimate mem;
    int fits;
    /* why each decision */
    char why_tune[AT_PLAN_WHY], why_format[AT_PLAN_WHY], why_batch[AT_PLAN_WHY], why_ckpt[AT_PLAN_WHY];
    char error[1024];            /* when !fits: needed, free, and what would fit */
} at_plan;

/* Plans a training run. Fills *out whenever the request is valid (so
 * --dry_run can show a plan that does not fit); returns AT_OK when it fits,
 * else AT_ERR_INVALID with out->error as the message. Bad requests (no
 * config, rank < 1, an unknown train_type) are AT_ERR_INVALID with *out
 * zeroed (out->mem.total == 0). */
at_status at_plan_train(const at_plan_request *rq, const at_device_profile *dev, at_plan *out);

/* Plans inference: weights (rq->dtype when has_dtype, else the model's
 * stored format when known, as infer loads it, else the device's best) plus
 * the KV cache in rq->kv_dtype. Same contract as at_plan_train. */
at_status at_plan_infer(const at_plan_request *rq, const at_device_profile *dev, at_plan *out);

/* The plan as text for people (--dry_run), one decision a line with its
 * reason, then the memory by part. Caller frees. NULL when out of memory. */
char *at_plan_to_text(const at_plan *p);
/* The plan as a JSON object (--dry_run --json, and "plan" in args.json).
 * Caller frees with cJSON_Delete. */
cJSON *at_plan_to_json(const at_plan *p);

/* "8GB" (10⁹), "7.5GiB" (2³⁰), "512MB", "512MiB", "1024KB", "123456" (bytes)
 * → bytes. AT_ERR_INVALID naming the text otherwise. */
at_status at_parse_memory_size(const char *s, int64_t *out);

/* Reads the config of the model at `path` without loading its weights: a
 * Hugging Face folder or config.json, a GGUF file, or a llama2.c checkpoint.
 * *stored gets the format of its matrices when known (*has_stored = 1).
 * model_type: NULL, or --model_type (at_model_config_load_as). */
at_status at_plan_model_config(const char *path, const char *model_type, at_model_config *cfg, int *has_stored,
                               at_dtype *stored);

#endif
