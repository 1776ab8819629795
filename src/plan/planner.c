#include "plan/planner.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/llama2c.h"

#define GIB 1073741824.0

void at_plan_request_defaults(at_plan_request *rq)
{
    memset(rq, 0, sizeof *rq);
    rq->command = "sft";
    rq->train_type = "lora";
    rq->lora_rank = 8;
    rq->target_mask = (1u << AT_MOD_COUNT) - 1;
    rq->max_length = 2048;
    rq->batch_size = 1;
    rq->grad_accum = 1;
    rq->checkpointing = 1;
    rq->infer_batch = 1;
    rq->kv_dtype = AT_F32;
}

/* ---- memory sizes ---- */

at_status at_parse_memory_size(const char *s, int64_t *out)
{
    if (!s || !*s) return at_error(AT_ERR_INVALID, "memory size: empty (use e.g. 8GB or 7.5GiB)");
    char *end = NULL;
    double v = strtod(s, &end);
    while (*end == ' ') end++;
    double mul = 0;
    static const struct {
        const char *unit;
        double mul;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                 {"K", 1024.0}, {"M", 1048576.0}, {"G", GIB}, {"T", GIB * 1024},
                 {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", GIB}, {"TIB", GIB * 1024}};
    char unit[8];
    size_t n = strlen(end);
    if (end != s && n < sizeof unit) {
        for (size_t i = 0; i <= n; i++) unit[i] = (char)toupper((unsigned char)end[i]);
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcmp(unit, units[i].unit)) mul = units[i].mul;
    }
    if (mul == 0 || !(v > 0) || !isfinite(v) || v * mul >= 9.2e18)
        return at_error(AT_ERR_INVALID, "memory size \"%s\": use a positive number with GB, GiB, MB or MiB (e.g. 8GB, 7.5GiB)",
                        s);
    *out = (int64_t)(v * mul);
    return AT_OK;
}

static double gib(int64_t b) { return (double)b / GIB; }

/* "1.23 GiB", or MiB below 1 GiB */
static const char *fmt_bytes(int64_t b, char *buf, size_t len)
{
    if (b >= (int64_t)1 << 30 || b <= -((int64_t)1 << 30)) snprintf(buf, len, "%.2f GiB", gib(b));
    else if (b >= 1 << 20 || b == 0) snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    else snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

/* ---- the model's config ---- */

at_status at_plan_model_config(const char *path, const char *model_type, at_model_config *cfg, int *has_stored,
                               at_dtype *stored)
{
    *has_stored = 0;
    if (!path) return at_error(AT_ERR_INVALID, "--model is required");
    size_t n = strlen(path);
    int is_json = n >= 5 && !strcmp(path + n - 5, ".json");
    if (at_is_dir(path) || is_json) {
        if (is_json && !at_file_exists(path)) return at_error(AT_ERR_NOT_FOUND, "%s: no such file", path);
        AT_TRY(at_model_config_load_as(path, model_type, cfg));
        if (cfg->has_dtype) {
            *has_stored = 1;
            *stored = cfg->dtype;
        }
        return AT_OK;
    }
    if (!at_file_exists(path)) return at_error(AT_ERR_NOT_FOUND, "%s: no such model folder or file", path);
    char magic[4] = {0};
    size_t got = 0;
    AT_TRY(at_read_head(path, magic, 4, &got));
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        at_gguf *g = NULL;
        AT_TRY(at_gguf_open(path, &g));
        at_status st = at_model_config_from_gguf(g, path, cfg);
        const at_gguf_tensor_info *t = at_gguf_find_tensor(g, "blk.0.attn_q.weight");
        if (st == AT_OK && t) {
            int d = at_ggml_to_dtype(t->type);
            /* quantized GGUF matrices are dequantized to bf16 by the loader */
            if (d == AT_F32 || d == AT_F16 || d == AT_BF16) *stored = (at_dtype)d;
            else *stored = AT_BF16;
            *has_stored = 1;
        }
        at_gguf_close(g);
        return st == AT_OK ? at_model_type_check(cfg, path, model_type) : st;
    }
    at_llama2c *m = NULL;
    AT_TRY(at_llama2c_open(path, &m));
    *cfg = *at_llama2c_config(m);
    at_llama2c_close(m);
    *has_stored = 1;
    *stored = AT_F32;
    return at_model_type_check(cfg, path, model_type);
}

/* ---- decisions ---- */

static int64_t budget_of(const at_plan_request *rq, const at_device_profile *dev, char *why, size_t len)
{
    char b[32];
    if (rq->max_memory > 0) {
        snprintf(why, len, "--max_memory %s", fmt_bytes(rq->max_memory, b, sizeof b));
        return rq->max_memory;
    }
    int64_t free_b = dev->mem_free >= 0 ? dev->mem_free : dev->mem_total;
    snprintf(why, len, "90%% of the %s free", fmt_bytes(free_b, b, sizeof b));
    return (int64_t)((double)free_b * 0.9);
}

static int is_half(at_dtype t) { return t == AT_BF16 || t == AT_F16; }

/* The frozen weights' format for LoRA / QLoRA / inference: candidates in
 * order of preference (the second only when the first does not fit). */
static int format_candidates(const at_plan_request *rq, const at_device_profile *dev, at_dtype out[2], int *loss_scale,
                             char *why, size_t len)
{
    *loss_scale = 0;
    if (rq->has_dtype) {
        out[0] = rq->dtype;
        snprintf(why, len, "--torch_dtype %s, as given", at_dtype_name(rq->dtype));
        *loss_scale = rq->dtype == AT_F16 && dev->kind != AT_DEVICE_CPU;
        return 1;
    }
    if (dev->fast_bf16) {
        out[0] = AT_BF16;
        snprintf(why, len, "%s computes bf16 fast (%s); bf16 keeps f32's range, so no loss scaling",
                 dev->name, dev->kind == AT_DEVICE_CPU ? "AVX512_BF16" : "bf16 matrix units");
        return 1;
    }
    if (dev->fast_f16 && dev->kind != AT_DEVICE_CPU) {
        out[0] = AT_F16;
        *loss_scale = 1;
        snprintf(why, len, "%s computes f16 fast but not bf16: f16 with dynamic loss scaling (f16's range is "
                 "narrow: small gradients would underflow)", dev->name);
        return 1;
    }
    if (dev->kind == AT_DEVICE_CPU && rq->has_model_dtype && is_half(rq->model_dtype)) {
        /* the CPU's products widen 16-bit weights exactly where it has no
         * fast 16-bit products (device/cpu/gemm.h): as stored, they compute
         * what an f32 copy would, from half the memory */
        out[0] = rq->model_dtype;
        snprintf(why, len, "%s has no fast 16-bit formats: the model's %s weights as stored, multiplied in f32 "
                 "(widened exactly: the results of an f32 copy, from half its memory)", dev->name,
                 at_dtype_name(rq->model_dtype));
        return 1;
    }
    out[0] = AT_F32;
    if (rq->has_model_dtype && is_half(rq->model_dtype)) {
        out[1] = rq->model_dtype;
        snprintf(why, len, "%s has no fast 16-bit formats: f32 (the model's %s when f32 weights do not fit)",
                 dev->name, at_dtype_name(rq->model_dtype));
        return 2;
    }
    snprintf(why, len, "%s has no fast 16-bit formats: f32", dev->name);
    return 1;
}

typedef struct {
    at_tune_kind tune;
    at_dtype fmt, quant;
    int B, accum, ckpt, T;
} choice;

static void estimate(const at_plan_request *rq, const at_device_profile *dev, const choice *c, at_mem_estimate *m)
{
    at_mem_train_request r = {0};
    r.cfg = rq->cfg;
    r.tune = c->tune;
    r.weight_dtype = c->fmt;
    r.quant_dtype = c->quant;
    r.lora_rank = rq->lora_rank;
    r.lora_mask = rq->target_mask;
    r.batch = c->B;
    r.seq_len = c->T;
    r.checkpointing = c->ckpt;
    r.preference = rq->preference;
    r.reference_free = rq->reference_free;
    r.objective = rq->objective;
    r.ref_cfg = rq->ref_cfg;
    /* full fine-tuning loads --ref_model in its file's format (trainer.c
     * dpo_reference), f32 with --torch_dtype; unknown: f32, the most */
    r.ref_dtype = rq->ref_cfg && !rq->has_dtype && rq->ref_cfg->has_dtype ? rq->ref_cfg->dtype : AT_F32;
    /* grpo's frozen copy of the initial weights (full fine-tuning): the file's format, as --ref_model's */
    if (!rq->ref_cfg && !rq->has_dtype && rq->has_model_dtype) r.ref_dtype = rq->model_dtype;
    r.num_generations = rq->num_generations;
    r.max_completion_length = rq->max_completion_length;
    r.beta = rq->beta;
    r.num_iterations = rq->num_iterations;
    r.vision = rq->vision;
    r.image_patches = rq->image_patches;
    r.train_vit = rq->train_vit;
    r.train_aligner = rq->train_aligner;
    r.threads = dev->threads;
    r.runtime_overhead = dev->runtime_overhead;
    at_mem_estimate_train(&r, m);
}

static int parse_tune(const char *s, at_tune_kind *k, int *is_auto)
{
    *is_auto = 0;
    if (!s || !strcmp(s, "lora")) *k = AT_TUNE_LORA;
    else if (!strcmp(s, "qlora")) *k = AT_TUNE_QLORA;
    else if (!strcmp(s, "full")) *k = AT_TUNE_FULL;
    else if (!strcmp(s, "auto")) *k = AT_TUNE_LORA, *is_auto = 1;
    else return 0;
    return 1;
}

static void plan_header(const at_plan_request *rq, const at_device_profile *dev, at_plan *p)
{
    memset(p, 0, sizeof *p);
    p->dev = *dev;
    snprintf(p->command, sizeof p->command, "%s", rq->command ? rq->command : "sft");
    snprintf(p->model, sizeof p->model, "%s", rq->model ? rq->model : "");
    at_model_config_describe(rq->cfg, p->model_desc, sizeof p->model_desc);
    p->n_params = at_mem_param_count(rq->cfg);
    p->budget = budget_of(rq, dev, p->budget_why, sizeof p->budget_why);
}

/* Tries the relaxations of what the user fixed, one at a time and then all
 * together, and writes the first that fits into hint. */
static void suggest(const at_plan_request *rq, const at_device_profile *dev, const choice *base, int64_t budget,
                    char *hint, size_t len)
{
    char b[32];
    at_mem_estimate m;
    hint[0] = '\0';
    choice all = *base;
    struct {
        int applies;
        choice c;
        char text[96];
    } tries[5];
    int n = 0;
    if (!base->ckpt) {
        tries[n].c = *base;
        tries[n].c.ckpt = 1;
        snprintf(tries[n].text, sizeof tries[n].text, "--gradient_checkpointing true");
        tries[n++].applies = 1;
        all.ckpt = 1;
    }
    if (base->B > 1) {
        tries[n].c = *base;
        tries[n].c.B = 1;
        snprintf(tries[n].text, sizeof tries[n].text, "--per_device_train_batch_size 1 --gradient_accumulation_steps %d",
                 base->B * base->accum);
        tries[n++].applies = 1;
        all.B = 1;
    }
    if (base->tune == AT_TUNE_FULL) {
        tries[n].c = *base;
        tries[n].c.tune = AT_TUNE_LORA;
        if (!is_half(tries[n].c.fmt)) tries[n].c.fmt = dev->fast_f16 && !dev->fast_bf16 ? AT_F16 : AT_BF16;
        snprintf(tries[n].text, sizeof tries[n].text, "--train_type lora");
        tries[n++].applies = 1;
    }
    if (base->tune != AT_TUNE_QLORA) {
        tries[n].c = *base;
        tries[n].c.tune = AT_TUNE_QLORA;
        if (!is_half(tries[n].c.fmt)) tries[n].c.fmt = dev->fast_f16 && !dev->fast_bf16 ? AT_F16 : AT_BF16;
        snprintf(tries[n].text, sizeof tries[n].text, "--train_type qlora (or auto)");
        tries[n++].applies = 1;
        all.tune = AT_TUNE_QLORA;
        all.fmt = tries[n - 1].c.fmt;
    }
    for (int i = 0; i < n; i++) {
        estimate(rq, dev, &tries[i].c, &m);
        if (m.total <= budget) {
            snprintf(hint, len, "%s would fit (%s)", tries[i].text, fmt_bytes(m.total, b, sizeof b));
            return;
        }
    }
    /* everything at once, then shorter rows */
    for (int T = all.T; T >= 64; T /= 2) {
        choice c = all;
        c.T = T;
        estimate(rq, dev, &c, &m);
        if (m.total <= budget) {
            char opts[200] = "";
            size_t k = 0;
            if (all.ckpt != base->ckpt) k += (size_t)snprintf(opts + k, sizeof opts - k, " --gradient_checkpointing true");
            if (all.B != base->B && k < sizeof opts)
                k += (size_t)snprintf(opts + k, sizeof opts - k, " --per_device_train_batch_size 1");
            if (all.tune != base->tune && k < sizeof opts)
                k += (size_t)snprintf(opts + k, sizeof opts - k, " --train_type qlora");
            if (T != base->T && k < sizeof opts) snprintf(opts + k, sizeof opts - k, " --max_length %d", T);
            snprintf(hint, len, "%s would fit (%s)", opts + 1, fmt_bytes(m.total, b, sizeof b));
            return;
        }
    }
    at_mem_estimate w;
    choice c = all;
    c.T = 64;
    estimate(rq, dev, &c, &w);
    snprintf(hint, len, "even QLoRA with a micro-batch of 1, checkpointing and 64-token rows needs %s: a device with "
                        "more memory is needed", fmt_bytes(w.total, b, sizeof b));
}

at_status at_plan_train(const at_plan_request *rq, const at_device_profile *dev, at_plan *p)
{
    memset(p, 0, sizeof *p);
    if (!rq->cfg) return at_error(AT_ERR_INVALID, "plan: no model config");
    plan_header(rq, dev, p);
    p->train = 1;
    at_tune_kind tune;
    int is_auto;
    if (!parse_tune(rq->train_type, &tune, &is_auto))
        return at_error(AT_ERR_INVALID, "--train_type %s: use lora, qlora, full or auto", rq->train_type);
    if (tune != AT_TUNE_FULL && rq->lora_rank < 1)
        return at_error(AT_ERR_INVALID, "--lora_rank %d: must be at least 1", rq->lora_rank);
    if (rq->max_length < 1) return at_error(AT_ERR_INVALID, "plan: --max_length %d must be at least 1", rq->max_length);
    if (rq->batch_size < 1 || rq->grad_accum < 1)
        return at_error(AT_ERR_INVALID, "--per_device_train_batch_size and --gradient_accumulation_steps must be at "
                                        "least 1");
    p->lora_rank = rq->lora_rank;
    p->target_mask = rq->target_mask;
    p->seq_len = rq->max_length;
    int effective = rq->batch_size * rq->grad_accum;
    p->effective_batch = effective;

    at_dtype quant = rq->quant_bits == 8 ? AT_Q8_0 : AT_NF4;
    if (rq->quant_bits && rq->quant_bits != 4 && rq->quant_bits != 8)
        return at_error(AT_ERR_INVALID, "--quant_bits %d: use 4 (NF4), 8 (q8_0) or 0", rq->quant_bits);
    if (rq->quant_bits && tune == AT_TUNE_FULL)
        return at_error(AT_ERR_INVALID, "--train_type full with --quant_bits %d: quantized weights are frozen",
                        rq->quant_bits);
    if (rq->quant_bits && !is_auto) tune = AT_TUNE_QLORA;
    p->quant_dtype = quant;
    at_tune_kind tunes[2] = {tune, AT_TUNE_QLORA};
    int ntunes = is_auto ? 2 : 1;
    int found = 0;
    choice c = {0}, last = {0};
    int second_fmt = 0; /* c.fmt is format_candidates' second choice: the first did not fit */
    at_mem_estimate m;
    char why_fmt[AT_PLAN_WHY] = "";
    for (int ti = 0; ti < ntunes && !found; ti++) {
        at_dtype fmts[2];
        int loss_scale = 0, nf;
        if (tunes[ti] == AT_TUNE_FULL) {
            fmts[0] = AT_F32;
            nf = 1;
            snprintf(why_fmt, sizeof why_fmt, "full fine-tuning trains f32 weights (with f32 gradients and AdamW "
                                              "moments)%s", rq->has_dtype ? "; --torch_dtype does not apply" : "");
        } else {
            nf = format_candidates(rq, dev, fmts, &loss_scale, why_fmt, sizeof why_fmt);
        }
        for (int fi = 0; fi < nf && !found; fi++) {
            /* micro-batch: divisors of the effective batch, largest first */
            for (int B = rq->batch_size_set ? rq->batch_size : effective; B >= 1 && !found; B--) {
                if (!rq->batch_size_set && effective % B != 0) continue;
                int ck[2], nck = 0;
                if (rq->checkpointing_set) ck[nck++] = rq->checkpointing;
                else ck[nck++] = 0, ck[nck++] = 1;
                for (int k = 0; k < nck && !found; k++) {
                    c.tune = tunes[ti];
                    c.fmt = fmts[fi];
                    c.quant = quant;
                    c.B = B;
                    c.accum = rq->batch_size_set ? rq->grad_accum : effective / B;
                    c.ckpt = ck[k];
                    c.T = rq->max_length;
                    last = c; /* the search ends with the most lenient choice */
                    second_fmt = fi > 0;
                    estimate(rq, dev, &c, &m);
                    if (m.total <= p->budget) found = 1;
                }
                if (rq->batch_size_set) break;
            }
        }
        (void)loss_scale;
    }
    if (!found) c = last, estimate(rq, dev, &c, &m);

    p->tune = c.tune;
    p->weight_dtype = c.fmt;
    p->compute_dtype = c.fmt;
    p->quantized = c.tune == AT_TUNE_QLORA;
    p->loss_scaling = c.fmt == AT_F16 && dev->kind != AT_DEVICE_CPU;
    p->batch_size = c.B;
    p->grad_accum = c.accum;
    p->effective_batch = c.B * c.accum;
    p->checkpointing = c.ckpt;
    p->mem = m;
    p->fits = found;
    char b1[32], b2[32];

    /* the reasons */
    if (second_fmt)
        snprintf(p->why_format, sizeof p->why_format, "%s; f32 weights did not fit, so the model's %s is kept "
                 "(computed in f32 at lower speed)", why_fmt, at_dtype_name(c.fmt));
    else snprintf(p->why_format, sizeof p->why_format, "%s", why_fmt);
    if (is_auto) {
        if (c.tune == AT_TUNE_QLORA)
            snprintf(p->why_tune, sizeof p->why_tune, "--train_type auto: LoRA on %s weights does not fit even with "
                     "a micro-batch of 1 and checkpointing; QLoRA holds the frozen matrices in NF4 (%s instead of %s)",
                     at_dtype_name(c.fmt), fmt_bytes(at_mem_weight_bytes(rq->cfg, AT_NF4, c.fmt), b1, sizeof b1),
                     fmt_bytes(at_mem_weight_bytes(rq->cfg, c.fmt, c.fmt), b2, sizeof b2));
        else
            snprintf(p->why_tune, sizeof p->why_tune, "--train_type auto: LoRA fits, so the frozen weights stay %s "
                     "(QLoRA only when LoRA does not fit)", at_dtype_name(c.fmt));
    } else {
        snprintf(p->why_tune, sizeof p->why_tune, "--train_type %s%s, %s", at_tune_kind_name(tune),
                 rq->quant_bits ? (rq->quant_bits == 8 ? " (--quant_bits 8: q8_0)" : " (--quant_bits 4: NF4)") : "",
                 rq->train_type_set || rq->quant_bits ? "as given" : "the default (--train_type auto lets the planner "
                                                                    "choose QLoRA when LoRA does not fit)");
    }
    if (rq->batch_size_set)
        snprintf(p->why_batch, sizeof p->why_batch, "--per_device_train_batch_size %d%s, as given", c.B,
                 rq->grad_accum_set ? " and --gradient_accumulation_steps" : "");
    else if (c.B == effective)
        snprintf(p->why_batch, sizeof p->why_batch, "the effective batch asked for (%d × %d = %d) fits in one "
                 "micro-batch of rows of up to --max_length tokens", rq->batch_size, rq->grad_accum, effective);
    else
        snprintf(p->why_batch, sizeof p->why_batch, "the effective batch asked for is %d × %d = %d; larger "
                 "micro-batches do not fit, %d rows × %d accumulation steps keep it (same results, slower)",
                 rq->batch_size, rq->grad_accum, effective, c.B, c.accum);
    if (rq->checkpointing_set)
        snprintf(p->why_ckpt, sizeof p->why_ckpt, "--gradient_checkpointing %s, as given", c.ckpt ? "true" : "false");
    else if (c.ckpt) {
        choice off = c;
        off.ckpt = 0;
        at_mem_estimate mo;
        estimate(rq, dev, &off, &mo);
        snprintf(p->why_ckpt, sizeof p->why_ckpt, "on: without it the activations take %s and the total %s, over "
                 "the budget (it recomputes each layer in the backward: about a third more compute)",
                 fmt_bytes(mo.activations, b1, sizeof b1), fmt_bytes(mo.total, b2, sizeof b2));
    } else {
        snprintf(p->why_ckpt, sizeof p->why_ckpt, "off: every layer's activations fit (%s), so none is recomputed",
                 fmt_bytes(m.activations, b1, sizeof b1));
    }
    if (!found) {
        char hint[512], need[32], bud[32];
        suggest(rq, dev, &c, p->budget, hint, sizeof hint);
        snprintf(p->error, sizeof p->error, "%s does not fit on %s: it needs %s, the budget is %s (%s); %s",
                 p->command, dev->name, fmt_bytes(m.total, need, sizeof need), fmt_bytes(p->budget, bud, sizeof bud),
                 p->budget_why, hint);
        return at_error(AT_ERR_INVALID, "%s", p->error);
    }
    return AT_OK;
}

at_status at_plan_infer(const at_plan_request *rq, const at_device_profile *dev, at_plan *p)
{
    memset(p, 0, sizeof *p);
    if (!rq->cfg) return at_error(AT_ERR_INVALID, "plan: no model config");
    plan_header(rq, dev, p);
    snprintf(p->command, sizeof p->command, "%s", rq->command ? rq->command : "infer");
    at_dtype fmts[2];
    int ls = 0;
    char why[AT_PLAN_WHY];
    int nf;
    if (!rq->has_dtype && rq->has_model_dtype) {
        fmts[0] = rq->model_dtype;
        nf = 1;
        snprintf(why, sizeof why, "the model's own format %s, as infer loads it (--torch_dtype changes it)",
                 at_dtype_name(rq->model_dtype));
    } else {
        nf = format_candidates(rq, dev, fmts, &ls, why, sizeof why);
    }
    int seq = rq->max_seq > 0 ? rq->max_seq : rq->max_length > 0 ? rq->max_length : 2048;
    if (rq->cfg->max_position_embeddings > 0 && seq > rq->cfg->max_position_embeddings && rq->max_seq <= 0)
        seq = (int)rq->cfg->max_position_embeddings;
    int B = rq->infer_batch > 0 ? rq->infer_batch : 1;
    /* the prompt is prefilled at once: up to the whole context, 2048 tokens when not said */
    int prefill = rq->prefill_tokens > 0 ? rq->prefill_tokens : seq < 2048 ? seq : 2048;
    at_mem_estimate m;
    int found = 0;
    at_dtype fmt = fmts[0];
    for (int i = 0; i < nf && !found; i++) {
        fmt = fmts[i];
        at_mem_infer_request r = {rq->cfg, fmt, rq->kv_dtype, B, seq, prefill, rq->adapter_rank,
                                  rq->adapter_mask, dev->threads, dev->runtime_overhead};
        at_mem_estimate_infer(&r, &m);
        found = m.total <= p->budget;
    }
    p->weight_dtype = p->compute_dtype = fmt;
    p->kv_dtype = rq->kv_dtype;
    p->infer_batch = B;
    p->max_seq = seq;
    p->mem = m;
    p->fits = found;
    snprintf(p->why_format, sizeof p->why_format, "%s", why);
    if (!found) {
        char need[32], bud[32], hint[160];
        int64_t fixed = m.total - m.kv_cache;
        int64_t tokens = fixed < p->budget && m.kv_per_token > 0 ? (p->budget - fixed) / (m.kv_per_token * B) : 0;
        if (m.weights + m.workspace > p->budget)
            snprintf(hint, sizeof hint, "the weights alone do not fit: a device with more memory is needed");
        else if (tokens >= 1)
            snprintf(hint, sizeof hint, "a context of at most %lld tokens would fit", (long long)tokens);
        else
            snprintf(hint, sizeof hint, "fewer sequences at once or a shorter prompt would fit");
        snprintf(p->error, sizeof p->error, "%s does not fit on %s: weights and a %d-token KV cache for %d "
                 "sequence(s) need %s, the budget is %s (%s); %s", p->command, dev->name, seq, B,
                 fmt_bytes(m.total, need, sizeof need), fmt_bytes(p->budget, bud, sizeof bud), p->budget_why, hint);
        return at_error(AT_ERR_INVALID, "%s", p->error);
    }
    return AT_OK;
}

/* ---- output ---- */

static const char *mask_text(unsigned mask, char *buf, size_t len)
{
    static const char *names[AT_MOD_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    size_t k = 0;
    buf[0] = '\0';
    for (int m = 0; m < AT_MOD_COUNT && k < len; m++) {
        if (!(mask & (1u << m))) continue;
        int w = snprintf(buf + k, len - k, "%s%s", k ? "," : "", names[m]);
        if (w > 0) k += (size_t)w;
    }
    return buf;
}

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) return;
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 1024) + (size_t)w;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

char *at_plan_to_text(const at_plan *p)
{
    sbuf b = {0};
    char x[32], y[32], z[32];
    const at_device_profile *d = &p->dev;
    put(&b, "anytune %s: the plan%s\n", p->command, p->fits ? "" : " (DOES NOT FIT)");
    put(&b, "  device         %s%s: %s\n", d->name, d->simulated ? " (simulated)" : "", d->description);
    put(&b, "                 memory %s, free %s; fast formats:%s%s%s\n", fmt_bytes(d->mem_total, x, sizeof x),
        d->mem_free >= 0 ? fmt_bytes(d->mem_free, y, sizeof y) : "unknown", d->fast_bf16 ? " bf16" : "",
        d->fast_f16 ? " f16" : "", !d->fast_bf16 && !d->fast_f16 ? " none (f32)" : "");
    put(&b, "  budget         %s (%s)\n", fmt_bytes(p->budget, x, sizeof x), p->budget_why);
    put(&b, "  model          %s: %s, %.1fM parameters\n", p->model, p->model_desc, (double)p->n_params / 1e6);
    if (p->train) {
        char mt[64];
        if (p->tune == AT_TUNE_FULL)
            put(&b, "  training       full fine-tuning (%.1fM trainable)\n", (double)p->mem.n_trainable / 1e6);
        else
            put(&b, "  training       %s, rank %d on %s (%.2fM trainable)\n", at_tune_kind_name(p->tune), p->lora_rank,
                mask_text(p->target_mask, mt, sizeof mt), (double)p->mem.n_trainable / 1e6);
        put(&b, "                 why: %s\n", p->why_tune);
        put(&b, "  formats        weights %s%s%s%s, compute %s%s\n", p->quantized ? at_dtype_name(p->quant_dtype) : "",
            p->quantized ? " (linear layers), " : "",
            at_dtype_name(p->weight_dtype), p->quantized ? " (embeddings, head)" : "", at_dtype_name(p->compute_dtype),
            p->loss_scaling ? ", dynamic loss scaling" : "");
        put(&b, "                 why: %s\n", p->why_format);
        put(&b, "  micro-batch    %d row(s) × %d tokens, gradient accumulation %d (effective batch %d)\n", p->batch_size,
            p->seq_len, p->grad_accum, p->effective_batch);
        put(&b, "                 why: %s\n", p->why_batch);
        put(&b, "  checkpointing  %s\n", p->checkpointing ? "on" : "off");
        put(&b, "                 why: %s\n", p->why_ckpt);
    } else {
        put(&b, "  formats        weights %s, KV cache %s\n", at_dtype_name(p->weight_dtype), at_dtype_name(p->kv_dtype));
        put(&b, "                 why: %s\n", p->why_format);
        put(&b, "  context        %d sequence(s) × %d tokens; KV cache %s per token per sequence\n", p->infer_batch,
            p->max_seq, fmt_bytes(p->mem.kv_per_token, x, sizeof x));
    }
    const at_mem_estimate *m = &p->mem;
    put(&b, "  memory estimate (peak)\n");
    const struct {
        const char *name;
        int64_t v;
        const char *what;
    } parts[] = {
        {"weights", m->weights, p->train && p->tune == AT_TUNE_FULL ? "f32, trained" : "frozen"},
        {"trainable", m->trainable, p->train ? "LoRA A and B, f32" : "adapter"},
        {"gradients", m->gradients, "f32"},
        {"optimizer", m->optimizer, "AdamW moments m and v, f32"},
        {"activations", m->activations, p->train ? (p->checkpointing ? "layer inputs + one layer" : "every layer")
                                                 : "prefill scratch"},
        {"attention", m->attention, "kernel scratch (no T×T matrix)"},
        {"logits+loss", m->logits, p->train ? "one chunk of rows" : "last token"},
        {"kv cache", m->kv_cache, ""},
        {"workspace", m->workspace, "GEMM buffers, runtime"},
        {"reference", m->reference, "DPO reference pass above the step (and KTO's; --ref_model, before gradients)"},
        {"objective", m->objective, "the objective's own (rm: score head, its gradient, moments and buffers; grpo: "
         "generation's KV cache, log-prob passes, reference weights)"},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!p->train && (i == 2 || i == 3 || (i == 1 && parts[i].v == 0))) continue;
        if (p->train && i == 7) continue;
        if (i >= 9 && parts[i].v == 0) continue;
        put(&b, "    %-13s %11s   %s\n", parts[i].name, fmt_bytes(parts[i].v, x, sizeof x), parts[i].what);
    }
    put(&b, "    %-13s %11s   of a %s budget (%.0f%%)\n", "total", fmt_bytes(m->total, x, sizeof x),
        fmt_bytes(p->budget, z, sizeof z), p->budget > 0 ? 100.0 * (double)m->total / (double)p->budget : 0.0);
    if (!p->fits) put(&b, "  error          %s\n", p->error);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

cJSON *at_plan_to_json(const at_plan *p)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *d = cJSON_AddObjectToObject(j, "device");
    if (d) {
        cJSON_AddStringToObject(d, "name", p->dev.name);
        cJSON_AddStringToObject(d, "description", p->dev.description);
        cJSON_AddBoolToObject(d, "simulated", p->dev.simulated);
        cJSON_AddNumberToObject(d, "memory_total", (double)p->dev.mem_total);
        cJSON_AddNumberToObject(d, "memory_free", (double)p->dev.mem_free);
        cJSON_AddBoolToObject(d, "fast_bf16", p->dev.fast_bf16);
        cJSON_AddBoolToObject(d, "fast_f16", p->dev.fast_f16);
        cJSON_AddNumberToObject(d, "threads", p->dev.threads);
    }
    cJSON_AddStringToObject(j, "command", p->command);
    cJSON_AddStringToObject(j, "model", p->model);
    cJSON_AddNumberToObject(j, "parameters", (double)p->n_params);
    cJSON_AddNumberToObject(j, "budget", (double)p->budget);
    cJSON_AddStringToObject(j, "budget_from", p->budget_why);
    cJSON_AddBoolToObject(j, "fits", p->fits);
    cJSON_AddStringToObject(j, "weight_dtype", at_dtype_name(p->weight_dtype));
    cJSON_AddStringToObject(j, "compute_dtype", at_dtype_name(p->compute_dtype));
    if (p->train) {
        cJSON_AddStringToObject(j, "train_type", at_tune_kind_name(p->tune));
        if (p->quantized) {
            cJSON_AddStringToObject(j, "quant_dtype", at_dtype_name(p->quant_dtype));
            cJSON_AddNumberToObject(j, "quant_bits", p->quant_dtype == AT_Q8_0 ? 8 : 4);
        }
        cJSON_AddBoolToObject(j, "loss_scaling", p->loss_scaling);
        cJSON_AddNumberToObject(j, "per_device_train_batch_size", p->batch_size);
        cJSON_AddNumberToObject(j, "gradient_accumulation_steps", p->grad_accum);
        cJSON_AddNumberToObject(j, "effective_batch", p->effective_batch);
        cJSON_AddNumberToObject(j, "max_length", p->seq_len);
        cJSON_AddBoolToObject(j, "gradient_checkpointing", p->checkpointing);
        cJSON_AddNumberToObject(j, "trainable_parameters", (double)p->mem.n_trainable);
    } else {
        cJSON_AddStringToObject(j, "kv_dtype", at_dtype_name(p->kv_dtype));
        cJSON_AddNumberToObject(j, "batch", p->infer_batch);
        cJSON_AddNumberToObject(j, "max_seq", p->max_seq);
        cJSON_AddNumberToObject(j, "kv_bytes_per_token", (double)p->mem.kv_per_token);
    }
    cJSON *m = cJSON_AddObjectToObject(j, "memory");
    if (m) {
        const at_mem_estimate *e = &p->mem;
        cJSON_AddNumberToObject(m, "weights", (double)e->weights);
        cJSON_AddNumberToObject(m, "trainable", (double)e->trainable);
        cJSON_AddNumberToObject(m, "gradients", (double)e->gradients);
        cJSON_AddNumberToObject(m, "optimizer", (double)e->optimizer);
        cJSON_AddNumberToObject(m, "activations", (double)e->activations);
        cJSON_AddNumberToObject(m, "attention", (double)e->attention);
        cJSON_AddNumberToObject(m, "logits", (double)e->logits);
        cJSON_AddNumberToObject(m, "kv_cache", (double)e->kv_cache);
        cJSON_AddNumberToObject(m, "workspace", (double)e->workspace);
        if (p->train) cJSON_AddNumberToObject(m, "reference", (double)e->reference);
        if (p->train) cJSON_AddNumberToObject(m, "objective", (double)e->objective);
        cJSON_AddNumberToObject(m, "total", (double)e->total);
    }
    cJSON *r = cJSON_AddObjectToObject(j, "reasons");
    if (r) {
        cJSON_AddStringToObject(r, "format", p->why_format);
        if (p->train) {
            cJSON_AddStringToObject(r, "train_type", p->why_tune);
            cJSON_AddStringToObject(r, "micro_batch", p->why_batch);
            cJSON_AddStringToObject(r, "gradient_checkpointing", p->why_ckpt);
        }
    }
    if (!p->fits) cJSON_AddStringToObject(j, "error", p->error);
    return j;
}
