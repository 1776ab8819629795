#include "train/train_options.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "hub/hub.h"
#include "model/config.h"
#include "train/grpo.h"
#include "train/preference.h"

/* A row stored in at_train_args (the library default is `def`). */
#define AT(n, t, d, r, f, h) {.name = n, .type = t, .def = d, .range = r, .help = h, AT_OPT_AT(at_train_args, f)}
/* A row the command reads itself. */
#define CLI(n, t, d, r, h) {.name = n, .type = t, .def = d, .range = r, .help = h}
#define CHOICE(n, d, c, h) {.name = n, .type = AT_OPT_STRING, .def = d, .choices = c, .help = h}
/* ms-swift options accepted with no effect, and refused ones (base/options.h). */
#define IGNORED(n, t, why) {.name = n, .type = t, .help = why, .role = AT_OPT_IGNORED, .note = why}
#define REFUSED(n, t, instead) {.name = n, .type = t, .help = instead, .role = AT_OPT_REFUSED, .note = instead}

/* Ranges as transformers' TrainingArguments and PEFT's LoraConfig define
 * the same names (and what the code here can honour: an int field holds at
 * most 2^31 - 1). */
const at_opt_spec at_train_options[] = {
    AT("model", AT_OPT_STRING, NULL, NULL, model, "model folder (Hugging Face), GGUF or llama2.c file"),
    CLI("dataset", AT_OPT_LIST, NULL, NULL, "training data: FILE or FILE#N, several allowed"),
    CLI("val_dataset", AT_OPT_LIST, NULL, NULL, "validation data"),
    AT("split_dataset_ratio", AT_OPT_FLOAT, "0", "[0, 1)", split_dataset_ratio,
       "share of --dataset held out for validation"),
    AT("template", AT_OPT_STRING, NULL, NULL, template_name,
       "chat template: the model's (default), none, chatml, llama-2, llama-3, mistral (or ms-swift's names: "
       "qwen2_5, llama3, ...), or a .jinja file"),
    AT("system", AT_OPT_STRING, NULL, NULL, system,
       "system message of the conversations that have none (ms-swift's --system)"),
    {AT_MODEL_TYPE_OPTION_FIELDS, AT_OPT_AT(at_train_args, model_type)},
    AT("tokenizer", AT_OPT_STRING, NULL, NULL, tokenizer, "tokenizer folder or file (default: the model's)"),
    {.name = "train_type", .type = AT_OPT_STRING, .def = "lora", .choices = "lora|qlora|full|auto",
     .help = "lora, qlora (lora with --quant_bits 4), full, or auto (the planner: lora, or qlora when lora does "
             "not fit)", .alias = "tuner_type"},
    CLI("quant_bits", AT_OPT_INT, "0", "[0, 8]",
        "quantize the frozen linear weights: 4 (NF4, QLoRA), 8 (q8_0), 0 (off)"),
    CLI("dry_run", AT_OPT_BOOL, "false", NULL, "print the plan (device, formats, micro-batch, memory by part) and stop"),
    CLI("demo", AT_OPT_STRING, NULL, NULL,
        "sft: vision runs the bundled vision demo (a tiny Qwen2-VL learns the colour of generated pictures; "
        "accuracy before and after)"),
    CLI("json", AT_OPT_BOOL, "false", NULL, "with --dry_run: the plan as JSON"),
    CLI("max_memory", AT_OPT_STRING, NULL, NULL, "memory budget, e.g. 8GB or 7.5GiB (default: 90% of the free memory)"),
    CLI("simulate_device", AT_OPT_STRING, NULL, NULL,
        "with --dry_run: plan for a device profile (v100, t4, a100, h100, rtx4090, m2-16gb, ascend-910b, "
        "laptop-8gb)"),
    AT("lora_rank", AT_OPT_INT, "8", "[1, 65536]", lora_rank, "LoRA rank"),
    AT("lora_alpha", AT_OPT_FLOAT, "32", "(0, inf)", lora_alpha, "LoRA alpha (scale alpha/rank)"),
    AT("lora_dropout", AT_OPT_FLOAT, "0.05", "[0, 1)", lora_dropout, "dropout on the LoRA input"),
    AT("neftune_noise_alpha", AT_OPT_FLOAT, "0", "[0, inf)", neftune_noise_alpha,
       "NEFTune: uniform noise alpha/sqrt(length*hidden) on the embeddings in training (e.g. 5; 0: off)"),
    {.name = "target_modules", .type = AT_OPT_LIST, .def = "all-linear",
     .help = "all-linear or names such as q_proj,v_proj", .alias = "lora_target_modules"},
    AT("use_rslora", AT_OPT_BOOL, "false", NULL, use_rslora, "scale alpha/sqrt(rank)"),
    AT("adapters", AT_OPT_STRING, NULL, NULL, adapters, "start from this PEFT adapter folder"),
    AT("max_length", AT_OPT_INT, NULL, "[1, 16777216]", max_length,
       "longest sample in tokens (default: the model's context, max_position_embeddings)"),
    CHOICE("truncation_strategy", "delete", "delete|left|right", "what to do with longer samples"),
    AT("packing", AT_OPT_BOOL, "false", NULL, packing, "pack samples into rows of max_length tokens"),
    AT("group_by_length", AT_OPT_BOOL, "false", NULL, group_by_length, "batch samples of similar length together"),
    AT("gradient_checkpointing", AT_OPT_BOOL, "true", NULL, gradient_checkpointing,
       "recompute activations in the backward (unset: the planner turns it off when memory allows)"),
    {.name = "per_device_train_batch_size", .type = AT_OPT_INT, .def = "1", .range = "[1, 65536]",
     .help = "rows per micro-batch (unset: the planner may raise it)", .alias = "batch_size",
     AT_OPT_AT(at_train_args, batch_size)},
    AT("gradient_accumulation_steps", AT_OPT_INT, "1", "[1, 1048576]", grad_accum,
       "micro-batches per optimizer step (unset: the planner may change it, keeping the step's rows)"),
    AT("learning_rate", AT_OPT_FLOAT, "1e-4", "(0, 1]", learning_rate,
       "peak learning rate (unset: 1e-4 for LoRA, 1e-5 for --train_type full)"),
    AT("num_train_epochs", AT_OPT_FLOAT, "3", "(0, 1e6]", num_train_epochs, "epochs"),
    AT("max_steps", AT_OPT_INT, "-1", "[-1, inf)", max_steps, "optimizer steps (overrides epochs when > 0)"),
    CHOICE("lr_scheduler_type", "cosine", "cosine|linear|constant|constant_with_warmup", "learning-rate schedule"),
    AT("warmup_ratio", AT_OPT_FLOAT, "0", "[0, 1]", warmup_ratio, "share of the steps spent warming up"),
    AT("warmup_steps", AT_OPT_INT, "0", "[0, inf)", warmup_steps, "warmup steps (wins over the ratio)"),
    AT("weight_decay", AT_OPT_FLOAT, "0.1", "[0, inf)", weight_decay, "AdamW decoupled weight decay"),
    AT("adam_beta1", AT_OPT_FLOAT, "0.9", "[0, 1)", adam_beta1, "AdamW beta1"),
    AT("adam_beta2", AT_OPT_FLOAT, "0.95", "[0, 1)", adam_beta2, "AdamW beta2"),
    AT("adam_epsilon", AT_OPT_FLOAT, "1e-8", "(0, inf)", adam_epsilon, "AdamW epsilon"),
    AT("max_grad_norm", AT_OPT_FLOAT, "1.0", "[0, inf)", max_grad_norm, "clip the global gradient norm (0: off)"),
    AT("logging_steps", AT_OPT_INT, "5", "[1, 2147483647]", logging_steps, "log every N steps"),
    AT("save_steps", AT_OPT_INT, "500", "[0, 2147483647]", save_steps,
       "checkpoint every N steps and at the end (0: only at the end)"),
    AT("eval_steps", AT_OPT_INT, "500", "[0, 2147483647]", eval_steps,
       "evaluate every N steps and at the end (0: only at the end)"),
    {.name = "save_strategy", .type = AT_OPT_STRING, .def = "steps", .choices = "steps|epoch|no",
     .help = "when to checkpoint: every --save_steps, at each epoch's end, or only at the end (no)",
     AT_OPT_AT(at_train_args, save_strategy)},
    {.name = "eval_strategy", .type = AT_OPT_STRING, .def = "steps", .choices = "steps|epoch|no",
     .help = "when to evaluate: every --eval_steps (and at the end), at each epoch's end, or never (no)",
     .alias = "evaluation_strategy", AT_OPT_AT(at_train_args, eval_strategy)},
    AT("save_only_model", AT_OPT_BOOL, "false", NULL, save_only_model,
       "checkpoints without the optimizer state: smaller, but they cannot be resumed"),
    AT("add_version", AT_OPT_BOOL, "true", NULL, add_version,
       "a vN-YYYYMMDD-HHMMSS folder per run in --output_dir (false: the run writes into --output_dir itself)"),
    AT("columns", AT_OPT_STRING, NULL, NULL, columns,
       "rename the records' keys, as ms-swift's JSON form: '{\"question\": \"query\", \"answer\": \"response\"}'"),
    AT("load_best_model_at_end", AT_OPT_BOOL, "false", NULL, load_best_model_at_end,
       "checkpoints fall on evaluations (--save_steps a multiple of --eval_steps) and the one with the lowest "
       "eval_loss is named at the end (the final weights stay the last step's)"),
    CHOICE("metric_for_best_model", "loss", "loss|eval_loss", "the metric of the best checkpoint (lower is better)"),
    AT("save_total_limit", AT_OPT_INT, "0", "[0, 2147483647]", save_total_limit,
       "keep only the N newest checkpoints (0: all)"),
    AT("output_dir", AT_OPT_STRING, "output", NULL, output_dir,
       "where runs go (a vN-YYYYMMDD-HHMMSS folder per run)"),
    AT("resume_from_checkpoint", AT_OPT_STRING, NULL, NULL, resume_from_checkpoint, "a checkpoint folder, or 'last'"),
    CHOICE("torch_dtype", NULL, "bfloat16|float16|float32|auto",
           "format of the frozen weights (unset or auto: the planner's choice)"),
    AT("seed", AT_OPT_INT, "42", "[0, 9223372036854775807]", seed, "seed of everything random"),
    AT("device", AT_OPT_STRING, NULL, NULL, device, "auto, cpu, cuda, cuda:N"),
    CLI("tf32", AT_OPT_BOOL, "false", NULL,
        "on GPUs, let f32 matmuls use TF32 tensor cores (faster, ~1e-3 relative error)"),
    AT("strict", AT_OPT_BOOL, "false", NULL, strict, "stop at the first bad dataset record"),
    CLI("model_name", AT_OPT_LIST, NULL, NULL,
        "fills {{name}} in the data (self-cognition data); two values as ms-swift's: Chinese records', English "
        "records' (--model_name 小黄 'Xiao Huang')"),
    CLI("model_author", AT_OPT_LIST, NULL, NULL, "fills {{author}} in the data; two values as --model_name"),
    CHOICE("loss_scale", "default", "default|last_round", "default (every assistant turn) or last_round"),
    CLI("preview", AT_OPT_LIST, NULL, NULL, "questions answered before and after training"),
    {.name = "report_to", .type = AT_OPT_STRING, .def = "none", .choices = "none|tensorboard|all",
     .help = "tensorboard (or all): also write every logged scalar as TensorBoard event files in RUN/runs "
             "(logging.jsonl and images/train_loss.svg are always written)",
     AT_OPT_AT(at_train_args, report_to)},
    AT("preview_max_tokens", AT_OPT_INT, "48", "[1, 1048576]", preview_max_tokens, "answer length of --preview"),
    AT_HUB_OPTION_ROWS,
    /* ms-swift's spellings of what is above */
    CLI("bf16", AT_OPT_BOOL, NULL, NULL, "true: as --torch_dtype bfloat16 (ms-swift / transformers spelling)"),
    CLI("fp16", AT_OPT_BOOL, NULL, NULL, "true: as --torch_dtype float16 (ms-swift / transformers spelling)"),
    CHOICE("optim", "adamw_torch", "adamw_torch|adamw_torch_fused|adamw_hf|adamw",
           "the optimizer: AdamW with decoupled weight decay (torch's)"),
    CLI("logging_first_step", AT_OPT_BOOL, "true", NULL, "log the first step (always done)"),
    /* accepted: nothing to change here */
    IGNORED("attn_impl", AT_OPT_STRING, "attention is always the fused causal kernel (flash-attention's algorithm)"),
    IGNORED("use_flash_attn", AT_OPT_BOOL, "attention is always the fused causal kernel (flash-attention's algorithm)"),
    IGNORED("dataloader_num_workers", AT_OPT_INT, "data is encoded once before the first step, in-process"),
    IGNORED("dataset_num_proc", AT_OPT_INT, "data is encoded once before the first step, in-process"),
    IGNORED("lazy_tokenize", AT_OPT_BOOL, "every sample is tokenized before the first step (it is fast)"),
    IGNORED("streaming", AT_OPT_BOOL, "datasets are read whole (memory-mapped); streaming is not needed at "
                                      "the sizes fine-tuning uses"),
    IGNORED("check_model", AT_OPT_BOOL, "models fetched by name are checked against the hub's sha256"),
    IGNORED("ddp_backend", AT_OPT_STRING, "data parallel runs over MPI (and NCCL on GPUs): mpirun -np N anytune sft"),
    IGNORED("ddp_find_unused_parameters", AT_OPT_BOOL, "gradients are summed over ranks by the trainer itself"),
    IGNORED("save_safetensors", AT_OPT_BOOL, "checkpoints are always safetensors"),
    IGNORED("remove_unused_columns", AT_OPT_BOOL, "records are read by their known keys"),
    IGNORED("dataloader_pin_memory", AT_OPT_BOOL, "batches are copied to the device by the trainer"),
    /* refused: what to use instead */
    REFUSED("deepspeed", AT_OPT_STRING, "ZeRO sharding is not implemented; data parallel: mpirun -np N anytune sft "
                                        "..., and --train_type qlora or --quant_bits to fit one device"),
    REFUSED("fsdp", AT_OPT_STRING, "not implemented; data parallel: mpirun -np N anytune sft ..."),
    REFUSED("torch_compile", AT_OPT_BOOL, "there is no torch here: the kernels are compiled C"),
    /* ms-swift's vision-language options (Qwen2-VL / Qwen2.5-VL folders; text-only models ignore them) */
    AT("freeze_vit", AT_OPT_BOOL, "true", NULL, freeze_vit,
       "keep the vision transformer frozen (false: LoRA on its linears with --train_type lora, every weight "
       "with full)"),
    AT("freeze_aligner", AT_OPT_BOOL, "true", NULL, freeze_aligner,
       "keep the vision merger (aligner) frozen (false: its weights train, with LoRA too)"),
    AT("freeze_llm", AT_OPT_BOOL, "false", NULL, freeze_llm, "keep the language model's weights (or LoRA) frozen"),
    AT("vit_lr", AT_OPT_FLOAT, NULL, "(0, inf)", vit_lr,
       "learning rate of the vision transformer's tensors (default: --learning_rate; scheduled alike)"),
    AT("aligner_lr", AT_OPT_FLOAT, NULL, "(0, inf)", aligner_lr,
       "learning rate of the aligner's tensors (default: --learning_rate; scheduled alike)"),
    AT("vit_freeze_steps", AT_OPT_INT, "0", "[0, 2147483647]", vit_freeze_steps,
       "the vision transformer trains only after this many steps (with --freeze_vit false)"),
    AT("max_pixels", AT_OPT_INT, NULL, "[784, 2147483647]", max_pixels,
       "largest image area in pixels after resizing (ms-swift's MAX_PIXELS; default: preprocessor_config.json's)"),
    AT("min_pixels", AT_OPT_INT, NULL, "[1, 2147483647]", min_pixels,
       "smallest image area in pixels after resizing (default: preprocessor_config.json's)"),
    REFUSED("sequence_parallel_size", AT_OPT_INT, "sequence parallelism is not implemented"),
};
const int at_train_n_options = (int)(sizeof at_train_options / sizeof at_train_options[0]);

/* `anytune rlhf`'s own options (ms-swift's names), beside the table above:
 * cli/cmd_rlhf.c parses them and the web UI's Train tab checks its rlhf
 * fields against them. The ranges are train/preference.c's checks. */
const at_opt_spec at_rlhf_options[] = {
    {.name = "rlhf_type", .type = AT_OPT_STRING, .def = "dpo",
     .help = "the objective: dpo, simpo, cpo, orpo, kto (unpaired examples with a label), rm (a reward model: a "
             "score head trained on the pairs), or grpo (completions generated in the loop, scored by rewards)"},
    {.name = "beta", .type = AT_OPT_FLOAT, .range = "[0, inf)",
     .help = "dpo: how far the policy may move from the reference; simpo/cpo: the reward "
                                 "scale; orpo: the odds-ratio weight (lambda). Unset: 2 for simpo, else 0.1"},
    {.name = "loss_type", .type = AT_OPT_STRING,
     .help = "dpo: sigmoid, ipo or hinge; cpo: those or simpo (unset: sigmoid; simpo "
                                       "for --rlhf_type simpo); grpo: grpo, bnpo or dr_grpo (unset: grpo)"},
    {.name = "label_smoothing", .type = AT_OPT_FLOAT, .def = "0", .range = "[0, 0.5)",
     .help = "conservative DPO/CPO: the share of pairs assumed mislabeled "
                                           "(sigmoid and simpo losses)"},
    {.name = "rpo_alpha", .type = AT_OPT_FLOAT,
     .help = "dpo: add rpo_alpha x the chosen replies' NLL (RPO); unset: off"},
    {.name = "cpo_alpha", .type = AT_OPT_FLOAT,
     .help = "cpo, simpo: weight of the chosen replies' NLL (unset: 1; 0: the SimPO "
                                      "paper's loss)"},
    {.name = "simpo_gamma", .type = AT_OPT_FLOAT, .help = "simpo: the target reward margin gamma (unset: 1)"},
    {.name = "desirable_weight", .type = AT_OPT_FLOAT, .def = "1", .range = "[0, inf)",
     .help = "kto: weight of the desirable examples' losses"},
    {.name = "undesirable_weight", .type = AT_OPT_FLOAT, .def = "1", .range = "[0, inf)",
     .help = "kto: weight of the undesirable examples' losses"},
    {.name = "center_rewards_coefficient", .type = AT_OPT_FLOAT, .def = "0", .range = "[0, inf)",
     .help = "rm: weight of the mean squared sum of the pair's rewards (centers them near 0; 0: off)"},
    {.name = "ref_model", .type = AT_OPT_STRING,
     .help = "dpo's and kto's reference model (default: the policy's base: LoRA off, or the "
                                       "initial weights for full fine-tuning); refused by the reference-free "
                                       "simpo, cpo and orpo"},
    /* grpo (train/grpo.h, train/grpo_reward.h; ms-swift's names and defaults) */
    {.name = "num_generations", .type = AT_OPT_INT, .def = "8", .range = "[2, 65536]",
     .help = "grpo: completions generated per prompt (G); a micro-batch of N prompts runs N·G rows"},
    {.name = "max_completion_length", .type = AT_OPT_INT, .def = "512", .range = "[1, 16777216]",
     .help = "grpo: the longest completion in tokens"},
    {.name = "temperature", .type = AT_OPT_FLOAT, .def = "0.9", .range = "[0, inf)", .help = "grpo: sampling temperature"},
    {.name = "top_p", .type = AT_OPT_FLOAT, .def = "1.0", .range = "(0, 1]", .help = "grpo: nucleus sampling (1: off)"},
    {.name = "top_k", .type = AT_OPT_INT, .def = "0", .range = "[-1, inf)", .help = "grpo: top-k sampling (0 or -1: off)"},
    {.name = "stop_words", .type = AT_OPT_LIST,
     .help = "grpo: strings that end a completion besides the model's end tokens (at most 8)"},
    {.name = "epsilon", .type = AT_OPT_FLOAT, .def = "0.2", .range = "[0, 1)",
     .help = "grpo: the ratio's clip range below and above 1"},
    {.name = "epsilon_high", .type = AT_OPT_FLOAT, .range = "[0, inf)",
     .help = "grpo: the clip range above 1 (DAPO's clip-higher; unset: --epsilon)"},
    {.name = "num_iterations", .type = AT_OPT_INT, .def = "1", .range = "[1, 1024]",
     .help = "grpo: optimizer steps per generated batch (μ; the old policy's log-probs are kept)"},
    {.name = "scale_rewards", .type = AT_OPT_STRING, .def = "group", .choices = "group|batch|none|true|false",
     .help = "grpo: divide the advantages by the group's reward std, the batch's, or not at all"},
    {.name = "dynamic_sample", .type = AT_OPT_BOOL, .def = "false",
     .help = "grpo: regenerate groups whose rewards are all equal (DAPO), up to --max_resample_times"},
    {.name = "max_resample_times", .type = AT_OPT_INT, .def = "3", .range = "[0, 1024]",
     .help = "grpo: tries of --dynamic_sample"},
    {.name = "overlong_filter", .type = AT_OPT_BOOL, .def = "false",
     .help = "grpo: completions cut by --max_completion_length get no loss (DAPO)"},
    {.name = "reward_funcs", .type = AT_OPT_LIST,
     .help = "grpo: built-in rewards: accuracy, format, cosine, repetition, soft_overlong"},
    {.name = "reward_weights", .type = AT_OPT_LIST,
     .help = "grpo: one weight per reward: --reward_funcs in order, then --reward_model, then --reward_command "
             "(unset: 1 each)"},
    {.name = "reward_model", .type = AT_OPT_STRING,
     .help = "grpo: a reward model (an rm run's checkpoint or its sequence-classification export, or ORG/NAME) "
             "scoring each completion"},
    {.name = "reward_command", .type = AT_OPT_STRING,
     .help = "grpo: a program (split at spaces, no shell) reading JSON lines {prompt, completion, solution} on "
             "stdin and writing one reward per line"},
    {.name = "reward_timeout", .type = AT_OPT_FLOAT, .def = "60", .range = "(0, inf)",
     .help = "grpo: seconds --reward_command may take per batch"},
    {.name = "log_completions", .type = AT_OPT_BOOL, .def = "false",
     .help = "grpo: write every completion with its rewards to RUN/completions.jsonl"},
    {.name = "cosine_min_len_value_wrong", .type = AT_OPT_FLOAT, .def = "-0.5", .help = "grpo cosine: a short wrong answer's reward"},
    {.name = "cosine_max_len_value_wrong", .type = AT_OPT_FLOAT, .def = "0.0", .help = "grpo cosine: a long wrong answer's reward"},
    {.name = "cosine_min_len_value_correct", .type = AT_OPT_FLOAT, .def = "1.0", .help = "grpo cosine: a short right answer's reward"},
    {.name = "cosine_max_len_value_correct", .type = AT_OPT_FLOAT, .def = "0.5", .help = "grpo cosine: a long right answer's reward"},
    {.name = "cosine_max_len", .type = AT_OPT_INT, .range = "[1, inf)",
     .help = "grpo cosine: the length scale (unset: --max_completion_length)"},
    {.name = "repetition_n_grams", .type = AT_OPT_INT, .def = "3", .range = "[1, 1024]",
     .help = "grpo repetition: the n of the n-grams"},
    {.name = "repetition_max_penalty", .type = AT_OPT_FLOAT, .def = "-1.0", .help = "grpo repetition: the penalty of a text that is all repeats"},
    {.name = "soft_max_length", .type = AT_OPT_INT, .range = "[1, inf)",
     .help = "grpo soft_overlong: the length where the penalty reaches -1 (unset: --max_completion_length)"},
    {.name = "soft_cache_length", .type = AT_OPT_INT, .range = "[1, inf)",
     .help = "grpo soft_overlong: the penalty grows over this many tokens before soft_max_length"},
};
const int at_rlhf_n_options = (int)(sizeof at_rlhf_options / sizeof at_rlhf_options[0]);

/* Where rlhf rows' values go in the library's structs. The rows above keep
 * no store (the command stores the table's rows into at_train_args), so
 * these name the rows and give only the field; type and default stay in
 * the row. */
#define FIELD(T, n, f) {.name = n, AT_OPT_AT(T, f)}
static const at_opt_spec PREF_FIELDS[] = {
    FIELD(at_pref_config, "label_smoothing", label_smoothing),
    FIELD(at_pref_config, "desirable_weight", desirable_weight),
    FIELD(at_pref_config, "undesirable_weight", undesirable_weight),
    FIELD(at_pref_config, "center_rewards_coefficient", center_rewards_coefficient),
};
static const at_opt_spec GRPO_FIELDS[] = {
    FIELD(at_grpo_config, "num_generations", num_generations),
    FIELD(at_grpo_config, "max_completion_length", max_completion_length),
    FIELD(at_grpo_config, "temperature", temperature),
    FIELD(at_grpo_config, "top_p", top_p),
    FIELD(at_grpo_config, "top_k", top_k),
    FIELD(at_grpo_config, "epsilon", epsilon),
    FIELD(at_grpo_config, "epsilon_high", epsilon_high),
    FIELD(at_grpo_config, "num_iterations", num_iterations),
    FIELD(at_grpo_config, "dynamic_sample", dynamic_sample),
    FIELD(at_grpo_config, "max_resample_times", max_resample_times),
    FIELD(at_grpo_config, "overlong_filter", overlong_filter),
    FIELD(at_grpo_config, "reward_model", reward_model),
    FIELD(at_grpo_config, "reward_command", reward_command),
    FIELD(at_grpo_config, "reward_timeout", reward_timeout),
    FIELD(at_grpo_config, "log_completions", log_completions),
    FIELD(at_grpo_config, "cosine_min_len_value_wrong", cosine_min_len_value_wrong),
    FIELD(at_grpo_config, "cosine_max_len_value_wrong", cosine_max_len_value_wrong),
    FIELD(at_grpo_config, "cosine_min_len_value_correct", cosine_min_len_value_correct),
    FIELD(at_grpo_config, "cosine_max_len_value_correct", cosine_max_len_value_correct),
    FIELD(at_grpo_config, "cosine_max_len", cosine_max_len),
    FIELD(at_grpo_config, "repetition_n_grams", repetition_n_grams),
    FIELD(at_grpo_config, "repetition_max_penalty", repetition_max_penalty),
    FIELD(at_grpo_config, "soft_max_length", soft_max_length),
    FIELD(at_grpo_config, "soft_cache_length", soft_cache_length),
};
#undef FIELD

static const at_opt_spec *rlhf_row(const char *name)
{
    for (int i = 0; i < at_rlhf_n_options; i++)
        if (!strcmp(at_rlhf_options[i].name, name)) return &at_rlhf_options[i];
    return NULL;
}

/* Each field's row with `text` (the row's default when o is NULL, else the
 * value o resolved: NULL when unset) stored into dst. */
static void store_fields(const at_opt_spec *fields, int n, const at_options *o, void *dst)
{
    for (int i = 0; i < n; i++) {
        const at_opt_spec *row = rlhf_row(fields[i].name);
        if (!row) continue; /* every field names a row (test_options checks) */
        at_opt_spec s = *row;
        s.store = fields[i].store;
        s.offset = fields[i].offset;
        if (o) s.def = at_opt_str(o, s.name);
        at_options_store_defaults(&s, 1, dst);
    }
}

void at_pref_config_store(const at_options *o, at_pref_config *c)
{
    store_fields(PREF_FIELDS, (int)(sizeof PREF_FIELDS / sizeof PREF_FIELDS[0]), o, c);
}

void at_grpo_config_store(const at_options *o, at_grpo_config *c)
{
    store_fields(GRPO_FIELDS, (int)(sizeof GRPO_FIELDS / sizeof GRPO_FIELDS[0]), o, c);
    const at_opt_spec *sr = rlhf_row("scale_rewards");
    (void)at_grpo_scale_parse(o ? at_opt_str(o, "scale_rewards") : sr->def, &c->scale_rewards);
}

int at_rlhf_fields_unknown(void)
{
    int bad = 0;
    for (size_t i = 0; i < sizeof PREF_FIELDS / sizeof PREF_FIELDS[0]; i++) bad += !rlhf_row(PREF_FIELDS[i].name);
    for (size_t i = 0; i < sizeof GRPO_FIELDS / sizeof GRPO_FIELDS[0]; i++) bad += !rlhf_row(GRPO_FIELDS[i].name);
    return bad;
}

at_status at_train_args_check(const at_train_args *a)
{
    for (int i = 0; i < at_train_n_options; i++) {
        const at_opt_spec *s = &at_train_options[i];
        if (!s->range || !s->store) continue;
        const char *p = (const char *)a + s->offset;
        char text[64];
        int zero = 0;
        if (s->store == AT_STORE_INT) {
            int v;
            memcpy(&v, p, sizeof v);
            snprintf(text, sizeof text, "%d", v);
            zero = v == 0;
        } else if (s->store == AT_STORE_I64) {
            int64_t v;
            memcpy(&v, p, sizeof v);
            snprintf(text, sizeof text, "%" PRId64, v);
            zero = v == 0;
        } else if (s->store == AT_STORE_U64) {
            uint64_t v;
            memcpy(&v, p, sizeof v);
            snprintf(text, sizeof text, "%" PRIu64, v);
            zero = v == 0;
        } else if (s->store == AT_STORE_DOUBLE) {
            double v;
            memcpy(&v, p, sizeof v);
            snprintf(text, sizeof text, "%.17g", v);
            zero = v == 0;
        } else {
            continue;
        }
        if (!s->def && zero) continue; /* unset */
        AT_TRY(at_opt_check_value(s, text, "training arguments"));
    }
    return AT_OK;
}

int at_train_default_max_length(const at_model_config *cfg)
{
    if (cfg->max_position_embeddings > 0 && cfg->max_position_embeddings <= 16777216)
        return (int)cfg->max_position_embeddings;
    return 2048;
}
