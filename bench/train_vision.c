/* bench/train's vision row: a LoRA training step of a Qwen2-VL-shaped model
 * with images against PyTorch running the tests' hand-written reference of
 * the same model (tools/bench_vlm_torch.py), in one run.
 *
 * The shape is Qwen2-VL-2B scaled down to run in seconds on two cores,
 * keeping its head sizes, ratios and image geometry:
 *   tower   width 320, 8 blocks, 4 heads of 80, MLP 4x (Qwen2-VL-2B: 1280,
 *           32, 16 of 80, 4x); patch 14, 2x2 merge, temporal patch 2
 *   LM      hidden 384, 7 layers, 3 heads of 128 / 1 KV head, intermediate
 *           2240, M-RoPE sections 16/24/24, q/k/v biases (2B: 1536, 28,
 *           12 / 2 of 128, 8960, 16/24/24), vocabulary 32000
 *   batch   2 rows, each: 16 prompt tokens, one 448x448 image (32x32
 *           patches -> 256 image tokens), 46 answer tokens (the labels)
 * The step is ms-swift's LoRA default for a VLM: tower and merger frozen
 * (--freeze_vit, --freeze_aligner: the tower runs forward only), LoRA r 8,
 * alpha 16, no dropout, on the LM's q, k, v, o, gate, up, down; loss, backward,
 * gradient norm, clipping at 1, AdamW (lr 1e-4, weight decay 0.01). Ours:
 * frozen LM weights f32 or bf16 (the tower is f32 in memory whatever the
 * file holds, model/vision.h); the peer: f32 (OpenBLAS's OpenMP build, as
 * BENCHMARKING.md's "best") and bf16 autocast. Tokens/s counts every token
 * of the batch (image tokens too), images/s the images. */
#include "train_vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/progress.h"
#include "bench_util.h"
#include "device/cpu/cpu_backend.h"
#include "model/vision.h"
#include "ops/ops.h"
#include "train/vlm_step.h"

enum { V_WIDTH = 320, V_DEPTH = 8, V_HEADS = 4, V_MLP = 4, IMAGE = 448, PROMPT = 16, ANSWER = 46, ROWS = 2 };
static const bench_shape LM = {"qwen2-vl-2b/4", 384, 2240, 7, 3, 1, 32000, 0, ROWS, 0, 1, 1000000.0, 0};
static const int MROPE[3] = {16, 24, 24};
#define GRID (IMAGE / 14)
#define IMAGE_TOKENS (GRID * GRID / 4)
#define T (PROMPT + IMAGE_TOKENS + 2 + ANSWER)
#define PATCH_DIM (3 * 2 * 14 * 14)

typedef struct {
    int ok;
    double tok_s, img_s, median_s, cpu_s, loss0, peak_mib;
    char err[256];
} vrow;

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tokens of one row, as tools/bench_vlm_torch.py's sample(): its image ids
 * are the vocabulary's top ones. */
static void row_ids(int32_t *ids, int32_t *labels)
{
    int32_t vstart = LM.vocab - 4, vend = LM.vocab - 3, image = LM.vocab - 2;
    int32_t text[PROMPT + ANSWER];
    bench_token_ids(text, PROMPT + ANSWER, vstart);
    int k = 0;
    for (int i = 0; i < PROMPT; i++) ids[k] = text[i], labels[k++] = -100;
    ids[k] = vstart, labels[k++] = -100;
    for (int i = 0; i < IMAGE_TOKENS; i++) ids[k] = image, labels[k++] = -100;
    ids[k] = vend, labels[k++] = -100;
    for (int i = 0; i < ANSWER; i++) ids[k] = labels[k] = text[PROMPT + i], k++;
}

static void vision_config(at_vision_config *vc)
{
    memset(vc, 0, sizeof *vc);
    vc->kind = AT_VISION_QWEN2_VL;
    vc->depth = V_DEPTH;
    vc->width = V_WIDTH;
    vc->intermediate_size = V_WIDTH * V_MLP;
    vc->num_heads = V_HEADS;
    vc->in_chans = 3;
    vc->out_hidden_size = LM.hidden;
    vc->patch_size = 14;
    vc->temporal_patch_size = 2;
    vc->spatial_merge_size = 2;
    snprintf(vc->hidden_act, sizeof vc->hidden_act, "quick_gelu");
    vc->vision_start_token_id = LM.vocab - 4;
    vc->vision_end_token_id = LM.vocab - 3;
    vc->image_token_id = LM.vocab - 2;
    vc->video_token_id = LM.vocab - 1;
    memcpy(vc->mrope_section, MROPE, sizeof MROPE);
}

/* Our step with frozen LM weights of type dt, steps after one warm-up. */
static vrow ours(at_dtype dt, int steps)
{
    vrow r;
    memset(&r, 0, sizeof r);
    at_model_config cfg;
    bench_make_config(&LM, &cfg);
    memcpy(cfg.mrope_section, MROPE, sizeof MROPE);
    at_vision_config vc;
    vision_config(&vc);
    at_decoder_weights *w = NULL;
    at_decoder *d = NULL;
    at_adapter *ad = NULL;
    at_decoder_grads *g = NULL;
    at_decoder_acts *acts = NULL;
    at_vision *v = NULL;
    at_optimizer opt;
    int opt_ready = 0;
    at_tensor *ids = NULL, *lab = NULL, *pos = NULL;
    int64_t n_patches = (int64_t)ROWS * GRID * GRID;
    int32_t *hid = malloc(ROWS * T * sizeof *hid), *hlab = malloc(ROWS * T * sizeof *hlab);
    int32_t *hpos = malloc(ROWS * T * 3 * sizeof *hpos), grid[ROWS][3];
    float *pixels = malloc((size_t)n_patches * PATCH_DIM * sizeof *pixels);
    double *ts = malloc(2 * (size_t)steps * sizeof *ts), *cs = ts ? ts + steps : NULL;
    at_status st = AT_OK;
    if (!hid || !hlab || !hpos || !pixels || !ts) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int b = 0; b < ROWS; b++) {
        row_ids(hid + b * T, hlab + b * T);
        grid[b][0] = 1, grid[b][1] = grid[b][2] = GRID;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull; /* normalized pixels are O(1) */
    for (int64_t i = 0; i < n_patches * PATCH_DIM; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        pixels[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    at_mrope_tokens tk = {vc.image_token_id, vc.video_token_id, vc.vision_start_token_id, vc.spatial_merge_size};
    AT_CHECK(at_vlm_batch_positions(&tk, hid, NULL, NULL, ROWS, T, (const int32_t(*)[3])grid, ROWS, hpos));
    AT_CHECK(at_model_config_validate(&cfg, LM.name));
    AT_CHECK(at_decoder_weights_random(&cfg, NULL, dt, 1234, &w));
    AT_CHECK(at_decoder_new(w, &d));
    w = NULL; /* the decoder's now */
    AT_CHECK(at_vision_random(&vc, d->be, 7, &v));
    AT_CHECK(at_adapter_new(&d->cfg, d->be, BENCH_LORA_RANK, BENCH_LORA_ALPHA, 0.0, 0, (1u << AT_MOD_COUNT) - 1, 42,
                            &ad));
    AT_CHECK(at_decoder_set_adapter(d, ad));
    AT_CHECK(at_decoder_grads_new(d, 0, &g));
    at_adamw_config oc = {0.9, 0.999, 1e-8, 0.01, 1.0};
    AT_CHECK(at_optimizer_init(&opt, d, g, &oc));
    opt_ready = 1;
    AT_CHECK(at_decoder_acts_new_ex(d, ROWS, T, AT_ACTS_TRAIN, &acts));
    int64_t sh[2] = {ROWS, T}, sp[3] = {ROWS, T, 3};
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &ids));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "labels", &lab));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 3, sp, "positions", &pos));
    AT_CHECK(at_tensor_upload(ids, hid, ROWS * T * sizeof *hid));
    AT_CHECK(at_tensor_upload(lab, hlab, ROWS * T * sizeof *hlab));
    AT_CHECK(at_tensor_upload(pos, hpos, ROWS * T * 3 * sizeof *hpos));
    at_vlm_images im = {pixels, n_patches, (const int32_t(*)[3])grid, ROWS, vc.image_token_id};
    for (int i = 0; i <= steps; i++) { /* step 0 warms up */
        double t0 = at_now_seconds(), c0 = cpu_seconds(), norm = 0;
        at_loss_stats ls = {0};
        at_fwd_opts fo = {0};
        AT_CHECK(at_decoder_grads_zero(g));
        AT_CHECK(at_vlm_forward_backward(d, v, acts, hid, ids, pos, NULL, lab, &im, &fo, 1.0f / (ROWS * ANSWER), g,
                                         &ls));
        AT_CHECK(at_optimizer_grad_norm(&opt, &norm));
        AT_CHECK(at_optimizer_step(&opt, 1e-4, norm, 1.0));
        if (!isfinite(ls.loss_sum)) {
            st = at_error(AT_ERR_INTERNAL, "non-finite loss at step %d", i);
            goto done;
        }
        if (i == 0) r.loss0 = ls.n_targets ? ls.loss_sum / (double)ls.n_targets : NAN;
        else ts[i - 1] = at_now_seconds() - t0, cs[i - 1] = cpu_seconds() - c0;
    }
    r.median_s = bench_median(ts, steps);
    r.cpu_s = bench_median(cs, steps);
    r.tok_s = ROWS * T / r.median_s;
    r.img_s = ROWS / r.median_s;
    r.peak_mib = bench_peak_rss_mib();
    r.ok = 1;
done:
    if (st != AT_OK) snprintf(r.err, sizeof r.err, "%s", at_last_error());
    at_tensor_free(ids);
    at_tensor_free(lab);
    at_tensor_free(pos);
    at_decoder_acts_free(acts);
    if (opt_ready) at_optimizer_free(&opt);
    at_decoder_grads_free(g);
    at_decoder_free(d);
    at_decoder_weights_free(w);
    at_adapter_free(ad);
    at_vision_free(v);
    free(hid);
    free(hlab);
    free(hpos);
    free(pixels);
    free(ts);
    return r;
}

/* The peer: best 1 for f32 with OpenBLAS's OpenMP build (shared
 * BENCHMARKING.md), 0 for bf16 autocast; tcmalloc preloaded in both
 * (bench_util.h, BENCH_PEER_ALLOCATOR). */
static vrow peer(int best, int steps, int threads)
{
    vrow r;
    memset(&r, 0, sizeof r);
    char pre[2048], cmd[4096];
    bench_cpu_peer_prefix(BENCH_PEER_ALLOCATOR | (best ? BENCH_PEER_LIBS_BEST : 0), pre, sizeof pre);
    snprintf(cmd, sizeof cmd,
             "%s '%s/tools/bench_vlm_torch.py' --mode %s --threads %d --steps %d --hidden %d --intermediate %d "
             "--layers %d --heads %d --kv-heads %d --vocab %d --mrope-section %d %d %d --v-width %d --v-depth %d "
             "--v-heads %d --v-mlp-ratio %d --image %d --batch %d --prompt %d --answer %d --rank %d --alpha %g",
             pre, AT_SOURCE_DIR, best ? "f32" : "bf16", threads, steps, LM.hidden, LM.inter, LM.layers, LM.heads,
             LM.kv_heads, LM.vocab, MROPE[0], MROPE[1], MROPE[2], V_WIDTH, V_DEPTH, V_HEADS, V_MLP, IMAGE, ROWS,
             PROMPT, ANSWER, BENCH_LORA_RANK, BENCH_LORA_ALPHA);
    cJSON *j = bench_run_peer(cmd, &r.tok_s, &r.median_s, r.err, sizeof r.err);
    if (j) {
        r.img_s = bench_json_num(j, "images_s", 0);
        r.cpu_s = bench_json_num(j, "cpu_s", 0);
        r.loss0 = bench_json_num(j, "loss0", NAN);
        r.peak_mib = bench_json_num(j, "peak_rss_mib", -1);
        r.ok = 1;
    }
    cJSON_Delete(j);
    return r;
}

/* FLOPs of one step: the LM's LoRA step (BENCHMARKING.md's formula over the
 * batch's tokens) and the frozen tower's forward (2 per weight per patch,
 * 4·N²·W per block for the attention of an image of N patches, the merger
 * per image token). */
static double step_flops(void)
{
    bench_shape s = LM;
    s.seq = T;
    double lm = bench_flops_per_token(&s, BENCH_LORA_RANK, NULL, NULL) * ROWS * T;
    double W = V_WIDTH, n = GRID * GRID, blk = 4 * W * W + 2 * W * W * V_MLP;
    double tower = V_DEPTH * (2 * blk * n + 4 * n * n * W) + 2 * (16 * W * W + 4 * W * LM.hidden) * (n / 4);
    return lm + ROWS * tower;
}

static void print_vrow(const char *who, const vrow *r, double flops, int threads)
{
    if (!r->ok) {
        printf("  %-22s failed: %s\n", who, r->err);
        return;
    }
    printf("  %-22s %7.1f tok/s %6.2f images/s  %6.3f s/step  %6.1f GFLOP/s", who, r->tok_s, r->img_s, r->median_s,
           flops / r->median_s / 1e9);
    if (r->cpu_s > 0) printf("  [cpu-time %7.1f tok/s]", r->tok_s * r->median_s / (r->cpu_s / threads));
    printf("  peak %5.0f MiB  loss0 %.4f\n", r->peak_mib, r->loss0);
}

/* a's rate over b's, by wall time and by CPU time (the same work a step) */
static void vratio(const char *what, const vrow *a, const vrow *b)
{
    if (!a->ok || !b->ok) return;
    printf("    %-30s %5.2fx", what, a->tok_s / b->tok_s);
    if (a->cpu_s > 0 && b->cpu_s > 0) printf("   by CPU time %5.2fx", b->cpu_s / a->cpu_s);
    printf("\n");
}

int bench_train_vision(int steps, int torch, int threads)
{
    double fl = step_flops();
    printf("\nvision (Qwen2-VL-2B scaled: tower width %d, %d blocks, %d heads, MLP %dx; LM hidden %d, %d layers, %d/%d "
           "heads, intermediate %d, vocab %d, M-RoPE %d/%d/%d): %d rows x %d tokens, one %dx%d image each (%d patches, "
           "%d image tokens); tower and merger frozen, LoRA r=%d alpha %g dropout 0 on the LM's 7 linear layers; "
           "%.1f GFLOP per step; median of %d steps after 1 warm-up; %d threads\n",
           V_WIDTH, V_DEPTH, V_HEADS, V_MLP, LM.hidden, LM.layers, LM.heads, LM.kv_heads, LM.inter, LM.vocab, MROPE[0],
           MROPE[1], MROPE[2], ROWS, T, IMAGE, IMAGE, GRID * GRID, IMAGE_TOKENS, BENCH_LORA_RANK, BENCH_LORA_ALPHA,
           fl / 1e9, steps, threads);
    vrow tf, tb;
    memset(&tf, 0, sizeof tf);
    memset(&tb, 0, sizeof tb);
    if (torch) {
        tf = peer(1, steps, threads);
        print_vrow("torch f32 (best)", &tf, fl, threads);
        tb = peer(0, steps, threads);
        print_vrow("torch bf16 autocast", &tb, fl, threads);
    }
    /* bf16 first: VmHWM only grows, and the f32 run's peak is the larger */
    vrow ob = ours(AT_BF16, steps);
    print_vrow("anytune bf16", &ob, fl, threads);
    vratio("vs torch bf16 autocast", &ob, &tb);
    vratio("vs torch f32 (best)", &ob, &tf);
    vrow of = ours(AT_F32, steps);
    print_vrow("anytune f32", &of, fl, threads);
    vratio("vs torch f32 (best)", &of, &tf);
    return ob.ok && of.ok ? 0 : 1;
}
