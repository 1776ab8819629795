/* The Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower and merger (see
 * vision.h): the weights, the forward and the backward, block by block as
 * the decoder's layers.c does, with only operations of ops/ops.h. */
#include "model/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/rng.h"
#include "model/safetensors.h"
#include "ops/ops.h"

#define NORM_EPS 1e-6f    /* both towers' LayerNorm / RMSNorm, the merger's ln_q too */
#define ROPE_THETA 10000.0f

/* A block's tensors, by role; the two towers use different subsets. */
enum {
    B_N1W, B_N1B, B_N2W, B_N2B, B_QKVW, B_QKVB, B_PROJW, B_PROJB,
    B_FC1W, B_FC1B, B_FC2W, B_FC2B,                               /* Qwen2-VL */
    B_GATEW, B_GATEB, B_UPW, B_UPB, B_DOWNW, B_DOWNB,             /* Qwen2.5-VL */
    B_COUNT
};
static const char *const block_suffix[B_COUNT] = {
    "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.qkv.weight", "attn.qkv.bias",
    "attn.proj.weight", "attn.proj.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
    "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight",
    "mlp.down_proj.bias"};
enum { M_LNW, M_LNB, M_0W, M_0B, M_2W, M_2B, M_COUNT };
/* Qwen3-VL's names of the roles that Qwen2-VL calls mlp.fc1 / fc2, and of a merger's tensors after its prefix */
static const char *const block_suffix3[4] = {"mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
                                             "mlp.linear_fc2.bias"};
static const char *const merger_suffix3[M_COUNT] = {"norm.weight", "norm.bias", "linear_fc1.weight",
                                                    "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"};
#define MAX_MERGERS (1 + AT_VISION_MAX_DEEPSTACK) /* the merger, then Qwen3-VL's deepstack mergers */
/* The blocks' linears that LoRA adapts, their weights' roles and PEFT's module names. */
enum { L_QKV, L_PROJ, L_FC1, L_FC2, L_GATE, L_UP, L_DOWN, L_COUNT };
static const int lora_weight[L_COUNT] = {B_QKVW, B_PROJW, B_FC1W, B_FC2W, B_GATEW, B_UPW, B_DOWNW};
static const char *const lora_module[L_COUNT] = {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "mlp.gate_proj",
                                                 "mlp.up_proj", "mlp.down_proj"};
static const char *lora_module_of(const at_vision_config *vc, int l)
{
    if (vc->kind == AT_VISION_QWEN3_VL && (l == L_FC1 || l == L_FC2)) return l == L_FC1 ? "mlp.linear_fc1" : "mlp.linear_fc2";
    return lora_module[l];
}
static const char *const merger_name[M_COUNT] = {"visual.merger.ln_q.weight", "visual.merger.ln_q.bias",
                                                 "visual.merger.mlp.0.weight", "visual.merger.mlp.0.bias",
                                                 "visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias"};

/* What one block keeps for its backward (training), or reuses (inference:
 * one set for all blocks, mid and out NULL: the residual is updated in place). */
typedef struct {
    at_tensor *n1, *mean1, *rstd1; /* norm1(x) [N, W]; LayerNorm's mean, 1/std (rstd only for RMSNorm) [N] */
    at_tensor *q, *k, *v, *att;    /* q, k after the rotary; the attention's output [1, N, H, D] */
    at_tensor *lse;                /* [1, H, N] */
    at_tensor *mid;                /* x + attention [N, W] */
    at_tensor *n2, *mean2, *rstd2; /* norm2(mid) */
    at_tensor *h1, *h2, *act;      /* fc1(n2) | gate(n2), up(n2) [N, F]; quick_gelu(h1) | silu(h1)·h2 */
    at_tensor *out;                /* the block's output [N, W] */
    at_tensor *u[L_COUNT];         /* LoRA: x·Aᵀ of each adapted linear [N, r] */
} block_acts;

/* What a merger keeps: its input (a deepstack merger's: a copy of its
 * block's output [N, W]), the norm's output and statistics, the MLP's
 * hidden layer before and after GELU [N/m², m²W], Qwen2.5-VL's output in
 * window order [N/m², O]. */
typedef struct {
    at_tensor *in, *ln, *mean, *rstd, *h, *a, *out;
} merger_acts;

struct at_vision {
    at_vision_config vc;
    at_backend *be;
    size_t n_params;
    at_tensor **params, **grads;
    int *blk;              /* [depth][B_COUNT]: parameter index of each role, -1 when the tower has none */
    int merger[MAX_MERGERS][M_COUNT]; /* likewise; [0] the merger, [1 + j] deepstack merger j */
    int pe_bias, pos_embed; /* Qwen3-VL's patch_embed.proj.bias and pos_embed.weight, else -1 */
    int pos_side;          /* Qwen3-VL: the position grid's side, sqrt(num_position_embeddings) */
    int train_vit, train_aligner;
    int vit_held;          /* at_vision_hold_vit: the vision transformer's gradients kept, not computed */
    size_t n_base;         /* the tower's own parameters; LoRA's A, B pairs follow */
    int *lora;             /* [depth][L_COUNT]: parameter index of A (B is the next), -1 when not adapted; NULL: no LoRA */
    int lora_rank;
    float lora_scale;
    at_tensor *inv_freq;   /* f32 [D/2]: the D/4 frequencies twice (rows, then columns) */
    /* the last forward */
    int kept;              /* a training forward's activations are here (the merger's at least) */
    int kept_blocks;       /* and every block's: the vision transformer trains (else one set served all) */
    int64_t n, n_tok;      /* patches, merged tokens */
    at_tensor *pix, *pos, *q_index, *seg_frame, *seg_window, *win_ids, *unwin_ids;
    at_tensor *x0;         /* patch embedding [N, W] */
    block_acts *acts;      /* [depth] (training) or [1] */
    merger_acts ma[MAX_MERGERS];
    /* Qwen3-VL's interpolated positions: per image the bilinear weights
     * along its rows rh [h, S] and columns rw [w, S] (S = pos_side), all
     * images' stacked; pe_ids [N] the row of the interpolated grid
     * (images' h·w rows one after another) each patch takes */
    at_tensor *pe_rh, *pe_rw, *pe_ids;
    int32_t (*grid)[3];    /* the images' grids, n_grid of them */
    int n_grid;
};

/* ---- parameters ---------------------------------------------------------- */

static at_tensor *P(const at_vision *v, int b, int role)
{
    int i = v->blk[b * B_COUNT + role];
    return i < 0 ? NULL : v->params[i];
}
static at_tensor *G(const at_vision *v, int b, int role)
{
    int i = v->blk[b * B_COUNT + role];
    return i < 0 ? NULL : v->grads[i];
}
static at_tensor *MP(const at_vision *v, int j, int role)
{
    return v->merger[j][role] < 0 ? NULL : v->params[v->merger[j][role]];
}
static at_tensor *MG(const at_vision *v, int j, int role)
{
    return v->merger[j][role] < 0 ? NULL : v->grads[v->merger[j][role]];
}
static at_tensor *XP(const at_vision *v, int i) { return i < 0 ? NULL : v->params[i]; }
static at_tensor *XG(const at_vision *v, int i) { return i < 0 ? NULL : v->grads[i]; }

void at_vision_release(at_vision *v);

void at_vision_free(at_vision *v)
{
    if (!v) return;
    at_vision_release(v);
    for (size_t i = 0; i < v->n_params; i++) {
        if (v->params) at_tensor_free(v->params[i]);
        if (v->grads) at_tensor_free(v->grads[i]);
    }
    at_tensor_free(v->inv_freq);
    free(v->params);
    free(v->grads);
    free(v->blk);
    free(v->lora);
    free(v);
}

/* An empty tower for vc: the table of tensors, the role indices, the rotary
 * frequencies. fill(i, host f32 buffer, numel, ctx) gives tensor i's values. */
typedef at_status (*fill_fn)(size_t i, const at_vision_tensor *t, float *dst, int64_t n, void *ctx);

static at_status build(const at_vision_config *vc, at_backend *be, fill_fn fill, void *ctx, at_vision **out)
{
    *out = NULL;
    if (vc->kind != AT_VISION_QWEN2_VL && vc->kind != AT_VISION_QWEN2_5_VL && vc->kind != AT_VISION_QWEN3_VL)
        return at_error(AT_ERR_INVALID, "vision tower: the config is not Qwen2-VL, Qwen2.5-VL or Qwen3-VL");
    if (vc->n_deepstack < 0 || vc->n_deepstack > AT_VISION_MAX_DEEPSTACK)
        return at_error(AT_ERR_INVALID, "vision tower: %d deepstack mergers", vc->n_deepstack);
    const int D = vc->width / vc->num_heads;
    if (D % 4) return at_error(AT_ERR_FORMAT, "vision tower: head size %d is not a multiple of 4 (2-D rotary)", D);
    at_vision_tensor *tab = NULL;
    size_t n = 0;
    float *host = NULL;
    at_status st = AT_OK;
    at_vision *v = calloc(1, sizeof *v);
    if (!v) return at_error(AT_ERR_NOMEM, "out of memory");
    v->vc = *vc;
    v->be = be;
    AT_CHECK(at_vision_tensors(vc, &tab, &n));
    v->params = calloc(n, sizeof *v->params);
    v->grads = calloc(n, sizeof *v->grads);
    v->blk = malloc((size_t)vc->depth * B_COUNT * sizeof *v->blk);
    if (!v->params || !v->grads || !v->blk) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    v->n_params = v->n_base = n;
    for (int i = 0; i < vc->depth * B_COUNT; i++) v->blk[i] = -1;
    for (int j = 0; j < MAX_MERGERS; j++)
        for (int r = 0; r < M_COUNT; r++) v->merger[j][r] = -1;
    v->pe_bias = v->pos_embed = -1;
    for (v->pos_side = 0; (v->pos_side + 1) * (v->pos_side + 1) <= vc->num_position_embeddings; v->pos_side++) {}
    const int q3 = vc->kind == AT_VISION_QWEN3_VL;
    for (size_t i = 0; i < n; i++) {
        const at_vision_tensor *t = &tab[i];
        int64_t shape[AT_MAX_DIMS] = {t->shape[0], t->shape[1], 1, 1};
        int nd = t->ndim;
        if (nd == 5) { /* the Conv3d kernel as the matrix [W, C·T·P·P] */
            shape[1] = t->shape[1] * t->shape[2] * t->shape[3] * t->shape[4];
            nd = 2;
        }
        int64_t numel = shape[0] * (nd == 2 ? shape[1] : 1);
        float *h = realloc(host, (size_t)numel * sizeof *h);
        if (!h) {
            st = at_error(AT_ERR_NOMEM, "out of memory reading %s", t->name);
            goto done;
        }
        host = h;
        AT_CHECK(fill(i, t, host, numel, ctx));
        AT_CHECK(at_tensor_new(be, AT_F32, nd, shape, t->name, &v->params[i]));
        AT_CHECK(at_tensor_upload(v->params[i], host, (size_t)numel * sizeof *host));
        int b = -1, pos = 0;
        if (sscanf(t->name, "visual.blocks.%d.%n", &b, &pos) == 1 && pos > 0 && b >= 0 && b < vc->depth) {
            for (int r = 0; r < B_COUNT; r++) {
                const char *sfx = q3 && r >= B_FC1W && r <= B_FC2B ? block_suffix3[r - B_FC1W] : block_suffix[r];
                if (!strcmp(t->name + pos, sfx)) v->blk[b * B_COUNT + r] = (int)i;
            }
        }
        int j = -1;
        pos = 0;
        if (q3 && !strncmp(t->name, "visual.merger.", 14)) j = 0, pos = 14;
        else if (q3 && sscanf(t->name, "visual.deepstack_merger_list.%d.%n", &j, &pos) == 1 && pos > 0 && j >= 0 &&
                 j < vc->n_deepstack)
            j++;
        else j = -1;
        for (int r = 0; r < M_COUNT; r++) {
            if (!q3 && !strcmp(t->name, merger_name[r])) v->merger[0][r] = (int)i;
            if (j >= 0 && !strcmp(t->name + pos, merger_suffix3[r])) v->merger[j][r] = (int)i;
        }
        if (!strcmp(t->name, "visual.patch_embed.proj.bias")) v->pe_bias = (int)i;
        if (!strcmp(t->name, "visual.pos_embed.weight")) v->pos_embed = (int)i;
    }
    /* HF's VisionRotaryEmbedding(D/2): inv_freq[j] = 1/θ^(2j/(D/2)), j < D/4, in f32 as torch computes it */
    int64_t sh = D / 2;
    float *f = realloc(host, (size_t)sh * sizeof *f);
    if (!f) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    host = f;
    for (int j = 0; j < D / 4; j++) {
        float e = (float)(2 * j) / (float)(D / 2);
        host[j] = host[j + D / 4] = 1.0f / powf(ROPE_THETA, e);
    }
    AT_CHECK(at_tensor_new(be, AT_F32, 1, &sh, "vision.inv_freq", &v->inv_freq));
    AT_CHECK(at_tensor_upload(v->inv_freq, host, (size_t)sh * sizeof *host));
    *out = v;
    v = NULL;
done:
    at_vision_free(v);
    free(tab);
    free(host);
    return st;
}

/* f32 values of a stored tensor (the Conv3d's 5-D kernel too). */
static at_status fill_from_file(size_t i, const at_vision_tensor *t, float *dst, int64_t n, void *ctx)
{
    (void)i;
    const at_st_info *info = at_vision_find(ctx, t->name);
    if (!info) return at_error(AT_ERR_NOT_FOUND, "the vision tower's tensor %s is missing", t->name);
    return at_st_read_f32(info, dst, (size_t)n);
}

at_status at_vision_from_model(const at_vision_config *vc, const at_st_model *m, const char *what, at_backend *be,
                               at_vision **out)
{
    *out = NULL;
    AT_TRY(at_vision_check_weights(vc, m, what));
    at_status st = build(vc, be, fill_from_file, (void *)m, out);
    if (st != AT_OK) return at_error(st, "%s: %s", what, at_last_error());
    return AT_OK;
}

at_status at_vision_load(const char *config_dir, const char *weights, at_backend *be, at_vision **out)
{
    *out = NULL;
    char *path = at_path_join(config_dir, "config.json");
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    cJSON *root = NULL;
    at_st_model *m = NULL;
    at_vision_config vc;
    at_status st = AT_OK;
    AT_CHECK(at_json_parse_file(path, &root));
    AT_CHECK(at_vision_config_from_json(root, path, &vc));
    AT_CHECK(at_st_model_open(weights, &m));
    AT_CHECK(at_vision_from_model(&vc, m, weights, be, out));
done:
    at_st_model_close(m);
    cJSON_Delete(root);
    free(path);
    return st;
}

static at_status fill_random(size_t i, const at_vision_tensor *t, float *dst, int64_t n, void *ctx)
{
    at_rng r;
    at_rng_seed(&r, at_rng_mix(*(const uint64_t *)ctx, i));
    const int norm = strstr(t->name, "norm") || strstr(t->name, "ln_q");
    const int bias = strstr(t->name, ".bias") != NULL;
    float a = 0.05f;
    if (!norm && !bias) a = sqrtf(3.0f / (float)(n / t->shape[0])); /* in_features = numel / out */
    for (int64_t k = 0; k < n; k++) dst[k] = (norm && !bias ? 1.0f : 0.0f) + a * (2.0f * at_rng_uniform(&r) - 1.0f);
    return AT_OK;
}

at_status at_vision_random(const at_vision_config *vc, at_backend *be, uint64_t seed, at_vision **out)
{
    return build(vc, be, fill_random, &seed, out);
}

const at_vision_config *at_vision_get_config(const at_vision *v) { return &v->vc; }
at_backend *at_vision_backend(const at_vision *v) { return v->be; }
size_t at_vision_param_count(const at_vision *v) { return v->n_params; }
at_tensor *at_vision_param(const at_vision *v, size_t i) { return i < v->n_params ? v->params[i] : NULL; }
at_tensor *at_vision_grad(const at_vision *v, size_t i) { return i < v->n_params ? v->grads[i] : NULL; }
int at_vision_param_is_lora(const at_vision *v, size_t i) { return i >= v->n_base && i < v->n_params; }
int at_vision_param_is_aligner(const at_vision *v, size_t i)
{
    return i < v->n_params && (!strncmp(v->params[i]->name, "visual.merger.", 14) ||
                               !strncmp(v->params[i]->name, "visual.deepstack_merger_list.", 29));
}

at_status at_vision_set_trainable(at_vision *v, int vit, int aligner)
{
    for (size_t i = 0; i < v->n_params; i++) {
        int want = at_vision_param_is_aligner(v, i) ? aligner : vit;
        if (v->lora && !at_vision_param_is_aligner(v, i)) want = vit && at_vision_param_is_lora(v, i);
        if (!want) {
            at_tensor_free(v->grads[i]);
            v->grads[i] = NULL;
        } else if (!v->grads[i]) {
            char name[AT_NAME_MAX + 8];
            snprintf(name, sizeof name, "grad.%s", v->params[i]->name);
            AT_TRY(at_tensor_zeros(v->be, AT_F32, v->params[i]->ndim, v->params[i]->shape, name, &v->grads[i]));
        }
    }
    v->train_vit = vit != 0;
    v->train_aligner = aligner != 0;
    return AT_OK;
}

void at_vision_hold_vit(at_vision *v, int hold) { v->vit_held = hold != 0; }

at_status at_vision_lora_add(at_vision *v, int rank, double alpha, int use_rslora, uint64_t seed)
{
    if (v->lora) return at_error(AT_ERR_INVALID, "vision tower: LoRA is already added");
    if (rank <= 0 || rank > 4096 || !(alpha > 0))
        return at_error(AT_ERR_INVALID, "vision tower: LoRA rank %d / alpha %g (rank 1..4096, alpha > 0)", rank, alpha);
    const int depth = v->vc.depth;
    size_t cap = v->n_base + (size_t)depth * L_COUNT * 2;
    at_tensor **p = realloc(v->params, cap * sizeof *p), **g;
    if (p) v->params = p;
    g = p ? realloc(v->grads, cap * sizeof *g) : NULL;
    if (g) v->grads = g;
    v->lora = malloc((size_t)depth * L_COUNT * sizeof *v->lora);
    if (!p || !g || !v->lora) return at_error(AT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < depth * L_COUNT; k++) v->lora[k] = -1;
    v->lora_rank = rank;
    v->lora_scale = (float)(use_rslora ? alpha / sqrt((double)rank) : alpha / rank);
    at_status st = AT_OK;
    float *host = NULL;
    for (int b = 0; b < depth; b++)
        for (int l = 0; l < L_COUNT; l++) {
            const at_tensor *w = P(v, b, lora_weight[l]);
            if (!w) continue;
            const int64_t out = w->shape[0], in = w->shape[1];
            int64_t sa[2] = {rank, in}, sb[2] = {out, rank};
            char name[AT_NAME_MAX];
            size_t i = v->n_params;
            v->lora[b * L_COUNT + l] = (int)i;
            for (int k = 0; k < 2; k++) {
                snprintf(name, sizeof name, "base_model.model.visual.blocks.%d.%s.lora_%c.weight", b,
                         lora_module_of(&v->vc, l), "AB"[k]);
                v->grads[i + k] = NULL;
                AT_CHECK(at_tensor_zeros(v->be, AT_F32, 2, k ? sb : sa, name, &v->params[i + k]));
                v->n_params++;
            }
            /* PEFT's init: A Kaiming-uniform with a = sqrt(5), i.e. uniform in ±1/sqrt(in); B zero */
            float *h = realloc(host, (size_t)(rank * in) * sizeof *h);
            if (!h) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                goto done;
            }
            host = h;
            at_rng r;
            at_rng_seed(&r, at_rng_mix(seed, i));
            for (int64_t k = 0; k < rank * in; k++) host[k] = (2.0f * at_rng_uniform(&r) - 1.0f) / sqrtf((float)in);
            AT_CHECK(at_tensor_upload(v->params[i], host, (size_t)(rank * in) * sizeof *host));
        }
    st = at_vision_set_trainable(v, v->train_vit, v->train_aligner);
done:
    free(host);
    return st;
}

at_status at_vision_zero_grads(at_vision *v)
{
    for (size_t i = 0; i < v->n_params; i++)
        if (v->grads[i]) AT_TRY(at_fill(v->grads[i], 0.0f));
    return AT_OK;
}

at_status at_vision_tokens(const at_vision_config *vc, const int32_t (*grid_thw)[3], int n_images, int64_t n_patches,
                           int64_t *n_tokens)
{
    const int m = vc->spatial_merge_size;
    int64_t np = 0;
    if (n_images <= 0) return at_error(AT_ERR_INVALID, "vision tower: no image");
    for (int i = 0; i < n_images; i++) {
        const int32_t *g = grid_thw[i];
        if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[1] % m || g[2] % m || g[1] > (1 << 16) || g[2] > (1 << 16) ||
            g[0] > 4096)
            return at_error(AT_ERR_INVALID, "vision tower: image %d has grid t=%d h=%d w=%d (positive, h and w "
                            "multiples of spatial_merge_size %d)", i, g[0], g[1], g[2], m);
        np += (int64_t)g[0] * g[1] * g[2];
    }
    if (n_patches >= 0 && np != n_patches)
        return at_error(AT_ERR_INVALID, "vision tower: the grids hold %lld patches, the pixels %lld", (long long)np,
                        (long long)n_patches);
    *n_tokens = np / ((int64_t)m * m);
    return AT_OK;
}

/* ---- the layers ---------------------------------------------------------- */

/* y = beta·y + x·Wᵀ + b (b may be NULL): nn.Linear. x [N, in], W [out, in], y [N, out]. */
static at_status linear(at_tensor *y, float beta, const at_tensor *x, const at_tensor *w, const at_tensor *b)
{
    AT_TRY(at_matmul(y, x, w, 0, 1, 1.0f, beta));
    return b ? at_add(y, y, b) : AT_OK;
}

/* Backward of y = x·Wᵀ + b for dy:
 *   dx = beta·dx + dy·W (dx NULL: not needed),  dW += dyᵀ·x,  db += Σ_rows dy (NULL: frozen). */
static at_status linear_backward(at_tensor *dx, float beta, const at_tensor *dy, const at_tensor *x, const at_tensor *w,
                                 at_tensor *dw, at_tensor *db)
{
    if (dx) AT_TRY(at_matmul(dx, dy, w, 0, 0, 1.0f, beta));
    if (dw) AT_TRY(at_matmul(dw, dy, x, 1, 0, 1.0f, 1.0f));
    return db ? at_sum_rows(db, dy, 1.0f) : AT_OK;
}

/* LoRA's A of block b's linear l (B is the parameter after it), or -1. */
static int lora_index(const at_vision *v, int b, int l) { return v->lora ? v->lora[b * L_COUNT + l] : -1; }

/* Block b's linear l (its weight and bias roles are adjacent) with its LoRA
 * when adapted (peft's lora.Linear, no dropout):
 *   y = beta·y + x·Wᵀ + b + s·u·Bᵀ,   u = x·Aᵀ kept in a->u[l] for the backward */
static at_status block_linear(const at_vision *v, int b, int l, at_tensor *y, float beta, const at_tensor *x,
                              block_acts *a)
{
    AT_TRY(linear(y, beta, x, P(v, b, lora_weight[l]), P(v, b, lora_weight[l] + 1)));
    int i = lora_index(v, b, l);
    if (i < 0) return AT_OK;
    AT_TRY(at_matmul(a->u[l], x, v->params[i], 0, 1, 1.0f, 0.0f));
    return at_matmul(y, a->u[l], v->params[i + 1], 0, 1, v->lora_scale, 1.0f);
}

/* LoRA's part of the backward below B, for dU = s·dy·B:  dA += dUᵀ·x,  dx += dU·A. */
static at_status lora_A_backward(const at_vision *v, int i, at_tensor *dx, const at_tensor *du, const at_tensor *x)
{
    if (v->grads[i]) AT_TRY(at_matmul(v->grads[i], du, x, 1, 0, 1.0f, 1.0f));
    return at_matmul(dx, du, v->params[i], 0, 0, 1.0f, 1.0f);
}

/* Backward of block_linear for dy: linear_backward's, then LoRA's:
 *   dB += s·dyᵀ·u,  dU = s·dy·B (du: scratch [N, r]),  dA += dUᵀ·x,  dx += dU·A */
static at_status block_linear_backward(const at_vision *v, int b, int l, at_tensor *dx, float beta,
                                       const at_tensor *dy, const at_tensor *x, const block_acts *a, at_tensor *du)
{
    const int wr = lora_weight[l], i = lora_index(v, b, l);
    AT_TRY(linear_backward(dx, beta, dy, x, P(v, b, wr), G(v, b, wr), G(v, b, wr + 1)));
    if (i < 0) return AT_OK;
    if (v->grads[i + 1]) AT_TRY(at_matmul(v->grads[i + 1], dy, a->u[l], 1, 0, v->lora_scale, 1.0f));
    AT_TRY(at_matmul(du, dy, v->params[i + 1], 0, 0, v->lora_scale, 0.0f));
    return lora_A_backward(v, i, dx, du, x);
}

/* The blocks' and ln_q's norm: LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL),
 * ops.h gives the math of both. mean is NULL for RMSNorm. */
static int layernorm(const at_vision *v) { return v->vc.kind != AT_VISION_QWEN2_5_VL; }
/* The blocks' MLP activation between fc1 and fc2: QuickGELU (Qwen2-VL), GELU's tanh form (Qwen3-VL). */
static int block_gelu(const at_vision *v) { return v->vc.kind == AT_VISION_QWEN3_VL ? AT_GELU_TANH : AT_GELU_QUICK; }

static at_status norm_forward(const at_vision *v, at_tensor *y, at_tensor *mean, at_tensor *rstd, const at_tensor *x,
                              const at_tensor *w, const at_tensor *b)
{
    return layernorm(v) ? at_layernorm_forward(y, mean, rstd, x, w, b, NORM_EPS)
                        : at_rmsnorm_forward(y, rstd, x, w, NORM_EPS);
}
static at_status norm_backward(const at_vision *v, at_tensor *dx, at_tensor *dw, at_tensor *db, const at_tensor *dy,
                               const at_tensor *x, const at_tensor *w, const at_tensor *mean, const at_tensor *rstd)
{
    return layernorm(v) ? at_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd)
                        : at_rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

/* Views of q, k or v (s = 0, 1, 2) in the fused qkv weight [3W, W] and bias
 * [3W] (transformers reshapes qkv's output as (N, 3, H, D): rows s·W.. are s's). */
static void qkv_view(at_tensor *w, at_tensor *b, const at_tensor *qkv_w, const at_tensor *qkv_b, int s, int64_t W)
{
    int64_t sw[2] = {W, W}, sb[1] = {W};
    at_tensor_view_inplace(w, qkv_w, (size_t)(s * W * W), 2, sw);
    at_tensor_view_inplace(b, qkv_b, (size_t)(s * W), 1, sb);
}

/* The rows of LoRA's B [3W, r] of the fused qkv that make q, k or v (s = 0, 1, 2). */
static void lora_rows(at_tensor *dst, const at_tensor *B, int s, int64_t W)
{
    int64_t sh[2] = {W, B->shape[1]};
    at_tensor_view_inplace(dst, B, (size_t)(s * W * B->shape[1]), 2, sh);
}

/* [1, N, H, D] seen as [N, W] (for the linears) or [N, H, D] (for the rotary). */
static void flat2(at_tensor *dst, const at_tensor *t, int64_t N, int64_t W)
{
    int64_t s[2] = {N, W};
    at_tensor_view_inplace(dst, t, 0, 2, s);
}
static void flat3(at_tensor *dst, const at_tensor *t)
{
    int64_t s[3] = {t->shape[1], t->shape[2], t->shape[3]};
    at_tensor_view_inplace(dst, t, 0, 3, s);
}

static at_rope_sections rope_2d(const at_vision *v)
{
    const int D = v->vc.width / v->vc.num_heads;
    at_rope_sections s = {2, {D / 4, D / 4, 0, 0}, 0};
    return s;
}

static at_attn_params attn_params(const at_vision *v, int b)
{
    int full = v->vc.kind != AT_VISION_QWEN2_5_VL;
    for (int i = 0; i < v->vc.n_fullatt; i++) full |= v->vc.fullatt_block_indexes[i] == b;
    at_attn_params p = {1.0f / sqrtf((float)(v->vc.width / v->vc.num_heads)), v->q_index, NULL,
                        full ? v->seg_frame : v->seg_window, 0};
    return p;
}

/* Block b (pre-norm transformer block):
 *   n1 = norm1(x),  q|k|v = n1·Wqkvᵀ + bqkv,  q, k = rope2d(q, k)
 *   mid = x + attn(q, k, v)·Wprojᵀ + bproj      (bidirectional, within a frame or window)
 *   n2 = norm2(mid)
 *   out = mid + fc2(quick_gelu(fc1(n2)))                  Qwen2-VL
 *   out = mid + down(silu(gate(n2)) · up(n2))             Qwen2.5-VL
 * x is read before mid is written; a->mid and a->out NULL (inference) put
 * both in x. */
static at_status block_forward(at_vision *v, int b, at_tensor *x, block_acts *a)
{
    const int64_t N = v->n, W = v->vc.width;
    at_tensor wv, bv, t2, t3;
    at_rope_sections sec = rope_2d(v);
    at_attn_params ap = attn_params(v, b);
    at_tensor *mid = a->mid ? a->mid : x, *out = a->out ? a->out : x;
    AT_TRY(norm_forward(v, a->n1, a->mean1, a->rstd1, x, P(v, b, B_N1W), P(v, b, B_N1B)));
    at_tensor *qkv[3] = {a->q, a->k, a->v};
    const int lq = lora_index(v, b, L_QKV);
    if (lq >= 0) AT_TRY(at_matmul(a->u[L_QKV], a->n1, v->params[lq], 0, 1, 1.0f, 0.0f));
    for (int s = 0; s < 3; s++) {
        qkv_view(&wv, &bv, P(v, b, B_QKVW), P(v, b, B_QKVB), s, W);
        flat2(&t2, qkv[s], N, W);
        AT_TRY(linear(&t2, 0.0f, a->n1, &wv, &bv));
        if (lq >= 0) { /* + s·u·B_sᵀ, B_s the rows of B that make s's outputs */
            lora_rows(&wv, v->params[lq + 1], s, W);
            AT_TRY(at_matmul(&t2, a->u[L_QKV], &wv, 0, 1, v->lora_scale, 1.0f));
        }
        if (s < 2) {
            flat3(&t3, qkv[s]);
            AT_TRY(at_rope(&t3, &t3, v->pos, v->inv_freq, &sec, 0));
        }
    }
    AT_TRY(at_attention_forward(a->att, a->lse, a->q, a->k, a->v, &ap));
    if (mid != x) AT_TRY(at_cast(mid, x));
    flat2(&t2, a->att, N, W);
    AT_TRY(block_linear(v, b, L_PROJ, mid, 1.0f, &t2, a));
    AT_TRY(norm_forward(v, a->n2, a->mean2, a->rstd2, mid, P(v, b, B_N2W), P(v, b, B_N2B)));
    if (out != mid) AT_TRY(at_cast(out, mid));
    if (layernorm(v)) {
        AT_TRY(block_linear(v, b, L_FC1, a->h1, 0.0f, a->n2, a));
        AT_TRY(at_gelu_forward(a->act, a->h1, block_gelu(v)));
        return block_linear(v, b, L_FC2, out, 1.0f, a->act, a);
    }
    AT_TRY(block_linear(v, b, L_GATE, a->h1, 0.0f, a->n2, a));
    AT_TRY(block_linear(v, b, L_UP, a->h2, 0.0f, a->n2, a));
    AT_TRY(at_swiglu_forward(a->act, a->h1, a->h2));
    return block_linear(v, b, L_DOWN, out, 1.0f, a->act, a);
}

/* Scratch of the backward: [N, W] x4, [N, F] x3, [1, N, H, D] x3. */
typedef struct {
    at_tensor *dmid, *dn, *tmp, *datt, *dact, *dh1, *dh2, *dq, *dk, *dv;
    at_tensor *du; /* LoRA's dU [N, r] */
} block_scratch;

/* Backward of block b: dx (the gradient of its output on entry) becomes the
 * gradient of its input x. The weights' gradients are added to G(b, .).
 *   dmid = dout + norm2ᵀ(mlpᵀ(dout))
 *   dx   = dmid + norm1ᵀ(Σ_s qkv_sᵀ(rope⁻¹(attnᵀ(projᵀ(dmid)))))
 * (rope⁻¹: the rotary is a rotation, its transpose the inverse rotation.) */
static at_status block_backward(at_vision *v, int b, at_tensor *dx, const at_tensor *x, const block_acts *a,
                                const block_scratch *s)
{
    const int64_t N = v->n, W = v->vc.width;
    at_tensor wv, bv, gw, gb, t2, d2, t3;
    at_rope_sections sec = rope_2d(v);
    at_attn_params ap = attn_params(v, b);
    const int lq = lora_index(v, b, L_QKV);
    /* the MLP: dn2 = mlpᵀ(dout) */
    if (layernorm(v)) {
        AT_TRY(block_linear_backward(v, b, L_FC2, s->dact, 0.0f, dx, a->act, a, s->du));
        AT_TRY(at_gelu_backward(s->dh1, s->dact, a->h1, block_gelu(v)));
        AT_TRY(block_linear_backward(v, b, L_FC1, s->dn, 0.0f, s->dh1, a->n2, a, s->du));
    } else {
        AT_TRY(block_linear_backward(v, b, L_DOWN, s->dact, 0.0f, dx, a->act, a, s->du));
        AT_TRY(at_swiglu_backward(s->dh1, s->dh2, s->dact, a->h1, a->h2));
        AT_TRY(block_linear_backward(v, b, L_GATE, s->dn, 0.0f, s->dh1, a->n2, a, s->du));
        AT_TRY(block_linear_backward(v, b, L_UP, s->dn, 1.0f, s->dh2, a->n2, a, s->du));
    }
    AT_TRY(norm_backward(v, s->tmp, G(v, b, B_N2W), G(v, b, B_N2B), s->dn, a->mid, P(v, b, B_N2W), a->mean2, a->rstd2));
    AT_TRY(at_add(s->dmid, dx, s->tmp));
    /* the attention */
    flat2(&t2, a->att, N, W);
    flat2(&d2, s->datt, N, W);
    AT_TRY(block_linear_backward(v, b, L_PROJ, &d2, 0.0f, s->dmid, &t2, a, s->du));
    AT_TRY(at_attention_backward(s->dq, s->dk, s->dv, s->datt, a->q, a->k, a->v, a->att, a->lse, &ap));
    at_tensor *dqkv[3] = {s->dq, s->dk, s->dv};
    for (int k = 0; k < 3; k++) {
        if (k < 2) {
            flat3(&t3, dqkv[k]);
            AT_TRY(at_rope(&t3, &t3, v->pos, v->inv_freq, &sec, 1));
        }
        qkv_view(&wv, &bv, P(v, b, B_QKVW), P(v, b, B_QKVB), k, W);
        at_tensor *pgw = NULL, *pgb = NULL;
        if (G(v, b, B_QKVW)) {
            qkv_view(&gw, &gb, G(v, b, B_QKVW), G(v, b, B_QKVB), k, W);
            pgw = &gw;
            pgb = &gb;
        }
        flat2(&d2, dqkv[k], N, W);
        AT_TRY(linear_backward(s->dn, k ? 1.0f : 0.0f, &d2, a->n1, &wv, pgw, pgb));
        if (lq >= 0) { /* dB_s += s·dq_sᵀ·u,  dU += s·dq_s·B_s */
            if (v->grads[lq + 1]) {
                lora_rows(&gw, v->grads[lq + 1], k, W);
                AT_TRY(at_matmul(&gw, &d2, a->u[L_QKV], 1, 0, v->lora_scale, 1.0f));
            }
            lora_rows(&wv, v->params[lq + 1], k, W);
            AT_TRY(at_matmul(s->du, &d2, &wv, 0, 0, v->lora_scale, k ? 1.0f : 0.0f));
        }
    }
    if (lq >= 0) AT_TRY(lora_A_backward(v, lq, s->dn, s->du, a->n1));
    AT_TRY(norm_backward(v, s->tmp, G(v, b, B_N1W), G(v, b, B_N1B), s->dn, x, P(v, b, B_N1W), a->mean1, a->rstd1));
    return at_add(dx, s->dmid, s->tmp);
}

/* ---- activations --------------------------------------------------------- */

static void free_tensors(at_tensor **t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        at_tensor_free(t[i]);
        t[i] = NULL;
    }
}

static void acts_free(block_acts *a) { free_tensors((at_tensor **)a, sizeof *a / sizeof(at_tensor *)); }

void at_vision_release(at_vision *v)
{
    if (!v) return;
    if (v->acts) {
        int na = v->kept_blocks ? v->vc.depth : 1;
        for (int b = 0; b < na; b++) acts_free(&v->acts[b]);
        free(v->acts);
        v->acts = NULL;
    }
    at_tensor **t[] = {&v->pix, &v->pos, &v->q_index, &v->seg_frame, &v->seg_window, &v->win_ids, &v->unwin_ids,
                       &v->x0, &v->pe_rh, &v->pe_rw, &v->pe_ids};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        at_tensor_free(*t[i]);
        *t[i] = NULL;
    }
    for (int j = 0; j < MAX_MERGERS; j++) free_tensors((at_tensor **)&v->ma[j], sizeof v->ma[j] / sizeof(at_tensor *));
    free(v->grid);
    v->grid = NULL;
    v->n_grid = 0;
    v->kept = v->kept_blocks = 0;
}

static at_status new_f32(const at_vision *v, int64_t d0, int64_t d1, const char *name, at_tensor **out)
{
    int64_t s[2] = {d0, d1};
    return at_tensor_new(v->be, AT_F32, d1 ? 2 : 1, s, name, out);
}
static at_status new_heads(const at_vision *v, const char *name, at_tensor **out)
{
    int64_t s[4] = {1, v->n, v->vc.num_heads, v->vc.width / v->vc.num_heads};
    return at_tensor_new(v->be, AT_F32, 4, s, name, out);
}

/* One block's activations; mid and out only when training. */
static at_status acts_alloc(const at_vision *v, block_acts *a, int training)
{
    const int64_t N = v->n, W = v->vc.width, F = v->vc.intermediate_size;
    const int ln = layernorm(v);
    AT_TRY(new_f32(v, N, W, "vision.n1", &a->n1));
    AT_TRY(new_f32(v, N, W, "vision.n2", &a->n2));
    if (training) {
        AT_TRY(new_f32(v, N, 0, "vision.rstd1", &a->rstd1));
        AT_TRY(new_f32(v, N, 0, "vision.rstd2", &a->rstd2));
        if (ln) AT_TRY(new_f32(v, N, 0, "vision.mean1", &a->mean1));
        if (ln) AT_TRY(new_f32(v, N, 0, "vision.mean2", &a->mean2));
        AT_TRY(new_f32(v, N, W, "vision.mid", &a->mid));
        AT_TRY(new_f32(v, N, W, "vision.out", &a->out));
        int64_t sl[3] = {1, v->vc.num_heads, N};
        AT_TRY(at_tensor_new(v->be, AT_F32, 3, sl, "vision.lse", &a->lse));
    }
    AT_TRY(new_heads(v, "vision.q", &a->q));
    AT_TRY(new_heads(v, "vision.k", &a->k));
    AT_TRY(new_heads(v, "vision.v", &a->v));
    AT_TRY(new_heads(v, "vision.att", &a->att));
    AT_TRY(new_f32(v, N, F, "vision.h1", &a->h1));
    if (!ln) AT_TRY(new_f32(v, N, F, "vision.h2", &a->h2));
    for (int l = 0; l < L_COUNT; l++)
        if (lora_index(v, 0, l) >= 0) AT_TRY(new_f32(v, N, v->lora_rank, "vision.lora_u", &a->u[l]));
    return new_f32(v, N, F, "vision.act", &a->act);
}

static at_status upload_i32(const at_vision *v, const int32_t *host, int ndim, const int64_t *shape, const char *name,
                            at_tensor **out)
{
    AT_TRY(at_tensor_new(v->be, AT_I32, ndim, shape, name, out));
    return at_tensor_upload(*out, host, (size_t)at_tensor_numel(*out) * sizeof *host);
}

/* The per-patch tables of a batch of images, in the order the blocks see the
 * patches (Qwen2.5-VL: window by window):
 *   order[r]   the processor's row of patch r
 *   pos[r]     its (row, column) in its image, in patches
 *   frame[r]   its frame, counted over all images (attention's segments)
 *   window[r]  its window, counted likewise (Qwen2.5-VL)
 *   win[u]     the merged token (image order) that merged unit u is (u in block order)
 *   pe[r]      its row of the interpolated position grid (Qwen3-VL): the
 *              images' h·w rows one after another, frames sharing them.
 * Windows (transformers' get_window_index): per frame, squares of
 * ws = window_size / (patch_size·m) merge units, row-major, cut at the
 * frame's bottom and right edges; units within a window row-major. */
typedef struct {
    int32_t *order, *pos, *frame, *window, *win, *pe;
} patch_tables;

static at_status make_tables(const at_vision *v, const int32_t (*g)[3], int n_images, patch_tables *pt)
{
    const int m = v->vc.spatial_merge_size, mm = m * m;
    const int64_t N = v->n, U = v->n_tok;
    const int q25 = v->vc.kind == AT_VISION_QWEN2_5_VL;
    const int ws = q25 ? v->vc.window_size / (v->vc.patch_size * m) : 1 << 30;
    pt->order = malloc((size_t)N * sizeof(int32_t));
    pt->pos = malloc((size_t)N * 2 * sizeof(int32_t));
    pt->frame = malloc((size_t)N * sizeof(int32_t));
    pt->window = malloc((size_t)N * sizeof(int32_t));
    pt->win = malloc((size_t)U * sizeof(int32_t));
    pt->pe = malloc((size_t)N * sizeof(int32_t));
    if (!pt->order || !pt->pos || !pt->frame || !pt->window || !pt->win || !pt->pe)
        return at_error(AT_ERR_NOMEM, "out of memory (vision tables of %lld patches)", (long long)N);
    int64_t u = 0, base = 0; /* next unit in block order; first unit of the frame in image order */
    int32_t frame = 0, window = 0, pe_base = 0;
    for (int i = 0; i < n_images; pe_base += g[i][1] * g[i][2], i++) {
        const int lh = g[i][1] / m, lw = g[i][2] / m;
        for (int t = 0; t < g[i][0]; t++, frame++, base += (int64_t)lh * lw) {
            for (int wh = 0; wh < lh; wh += ws)
                for (int ww = 0; ww < lw; ww += ws, window++)
                    for (int uh = wh; uh < lh && uh < wh + ws; uh++)
                        for (int uw = ww; uw < lw && uw < ww + ws; uw++, u++) {
                            int64_t src = base + (int64_t)uh * lw + uw; /* the unit in image order */
                            pt->win[u] = (int32_t)src;
                            for (int k = 0; k < mm; k++) {
                                int64_t r = u * mm + k;
                                pt->order[r] = (int32_t)(src * mm + k);
                                pt->pos[2 * r] = uh * m + k / m;
                                pt->pos[2 * r + 1] = uw * m + k % m;
                                pt->frame[r] = frame;
                                pt->window[r] = window;
                                pt->pe[r] = pe_base + pt->pos[2 * r] * g[i][2] + pt->pos[2 * r + 1];
                            }
                        }
        }
    }
    return AT_OK;
}

static void tables_free(patch_tables *pt)
{
    free(pt->order);
    free(pt->pos);
    free(pt->frame);
    free(pt->window);
    free(pt->win);
    free(pt->pe);
}

/* ---- the tower ----------------------------------------------------------- */

/* The bilinear weights of n points spread evenly over a grid side of S
 * (transformers' fast_pos_embed_interpolate along one axis): point a sits
 * at p = linspace(0, S-1, n)[a] (float32, as torch computes it), weight
 * 1 - (p - floor p) on floor p and p - floor p on min(floor p + 1, S - 1).
 * dst: [n, S], overwritten. */
static void interp_weights(float *dst, int n, int S)
{
    memset(dst, 0, (size_t)n * (size_t)S * sizeof *dst);
    const float step = n > 1 ? (float)(S - 1) / (float)(n - 1) : 0.0f;
    for (int a = 0; a < n; a++) {
        float p = a < n / 2 ? step * (float)a : (float)(S - 1) - step * (float)(n - 1 - a);
        int f = (int)p, c = f + 1 < S ? f + 1 : S - 1;
        float d = p - (float)f;
        dst[(size_t)a * S + f] += 1.0f - d;
        dst[(size_t)a * S + c] += d;
    }
}

/* Qwen3-VL's position tables of a batch (the pe_* fields of at_vision). */
static at_status prepare_pos_embed(at_vision *v, const patch_tables *pt, const int32_t (*g)[3], int n_images)
{
    const int S = v->pos_side;
    int64_t sh = 0, sw = 0;
    for (int i = 0; i < n_images; i++) sh += g[i][1], sw += g[i][2];
    float *rh = malloc((size_t)(sh * S) * sizeof *rh), *rw = malloc((size_t)(sw * S) * sizeof *rw);
    v->grid = malloc((size_t)n_images * sizeof *v->grid);
    at_status st = AT_OK;
    if (!rh || !rw || !v->grid) {
        st = at_error(AT_ERR_NOMEM, "out of memory (vision position tables)");
        goto done;
    }
    memcpy(v->grid, g, (size_t)n_images * sizeof *v->grid);
    v->n_grid = n_images;
    for (int i = 0, oh = 0, ow = 0; i < n_images; oh += g[i][1], ow += g[i][2], i++) {
        interp_weights(rh + (int64_t)oh * S, g[i][1], S);
        interp_weights(rw + (int64_t)ow * S, g[i][2], S);
    }
    int64_t s_h[2] = {sh, S}, s_w[2] = {sw, S}, s_n[1] = {v->n};
    AT_CHECK(at_tensor_new(v->be, AT_F32, 2, s_h, "vision.pos_rows", &v->pe_rh));
    AT_CHECK(at_tensor_upload(v->pe_rh, rh, (size_t)(sh * S) * sizeof *rh));
    AT_CHECK(at_tensor_new(v->be, AT_F32, 2, s_w, "vision.pos_cols", &v->pe_rw));
    AT_CHECK(at_tensor_upload(v->pe_rw, rw, (size_t)(sw * S) * sizeof *rw));
    AT_CHECK(upload_i32(v, pt->pe, 1, s_n, "vision.pos_ids", &v->pe_ids));
done:
    free(rh);
    free(rw);
    return st;
}

/* Rows of the interpolated position grid of image i (row-major, h·w rows),
 * its weights' views, its first row in pe_grid. */
typedef struct {
    at_tensor rh, rw;
    int64_t h, w, first;
} pe_image;

static void pe_views(const at_vision *v, int i, int64_t *oh, int64_t *ow, int64_t *first, pe_image *pi)
{
    const int64_t S = v->pos_side;
    pi->h = v->grid[i][1];
    pi->w = v->grid[i][2];
    pi->first = *first;
    int64_t s_h[2] = {pi->h, S}, s_w[2] = {pi->w, S};
    at_tensor_view_inplace(&pi->rh, v->pe_rh, (size_t)(*oh * S), 2, s_h);
    at_tensor_view_inplace(&pi->rw, v->pe_rw, (size_t)(*ow * S), 2, s_w);
    *oh += pi->h;
    *ow += pi->w;
    *first += pi->h * pi->w;
}

/* Qwen3-VL's learned positions, bilinearly interpolated to each image's grid
 * and added to the patch embedding. With E = pos_embed viewed [S, S·W] and
 * Rh, Rw an image's weights (interp_weights), separably:
 *   T = Rh · E  [h, S·W],   grid[a] = Rw · T[a] viewed [S, W]  ([w, W], row a)
 *   x0[r] += grid[pe_ids[r]]
 * backward (dx0 the gradient of x0):
 *   dgrid = scatter-add of dx0 by pe_ids,  dT[a] = Rwᵀ · dgrid[a],  dE += Rhᵀ · dT
 * scratch: [Σ h·w, W] (grid) and [max h, S·W] (T). */
static at_status pos_embed_pass(at_vision *v, at_tensor *x0, int backward)
{
    const int64_t S = v->pos_side, W = v->vc.width;
    int64_t rows = 0, maxh = 0;
    for (int i = 0; i < v->n_grid; i++) {
        rows += (int64_t)v->grid[i][1] * v->grid[i][2];
        if (v->grid[i][1] > maxh) maxh = v->grid[i][1];
    }
    at_tensor *grid = NULL, *t = NULL, *patch = NULL;
    at_status st = AT_OK;
    at_tensor e, tv, ta, ga;
    int64_t se[2] = {S, S * W};
    at_tensor_view_inplace(&e, backward ? v->grads[v->pos_embed] : v->params[v->pos_embed], 0, 2, se);
    AT_CHECK(new_f32(v, rows, W, "vision.pos_grid", &grid));
    AT_CHECK(new_f32(v, maxh, S * W, "vision.pos_rows_t", &t));
    if (backward) {
        AT_CHECK(at_fill(grid, 0.0f));
        AT_CHECK(at_embedding_backward(grid, x0, v->pe_ids));
    }
    int64_t oh = 0, ow = 0, first = 0;
    for (int i = 0; i < v->n_grid; i++) {
        pe_image pi;
        pe_views(v, i, &oh, &ow, &first, &pi);
        int64_t s_t[2] = {pi.h, S * W}, s_a[2] = {S, W}, s_g[2] = {pi.w, W};
        at_tensor_view_inplace(&tv, t, 0, 2, s_t);
        if (!backward) AT_CHECK(at_matmul(&tv, &pi.rh, &e, 0, 0, 1.0f, 0.0f));
        for (int64_t a = 0; a < pi.h; a++) {
            at_tensor_view_inplace(&ta, t, (size_t)(a * S * W), 2, s_a);
            at_tensor_view_inplace(&ga, grid, (size_t)((pi.first + a * pi.w) * W), 2, s_g);
            if (backward) AT_CHECK(at_matmul(&ta, &pi.rw, &ga, 1, 0, 1.0f, 0.0f));
            else AT_CHECK(at_matmul(&ga, &pi.rw, &ta, 0, 0, 1.0f, 0.0f));
        }
        if (backward) AT_CHECK(at_matmul(&e, &pi.rh, &tv, 1, 0, 1.0f, 1.0f));
    }
    if (!backward) {
        AT_CHECK(new_f32(v, v->n, W, "vision.pos_patch", &patch));
        AT_CHECK(at_embedding_forward(patch, v->pe_ids, grid));
        AT_CHECK(at_add(x0, x0, patch));
    }
done:
    at_tensor_free(grid);
    at_tensor_free(t);
    at_tensor_free(patch);
    return st;
}

/* The inputs of the blocks: the pixels in block order, the rotary
 * positions, the attention's segments, the windows' permutation. */
static at_status prepare(at_vision *v, const float *pixels, const int32_t (*grid_thw)[3], int n_images)
{
    const int64_t N = v->n, U = v->n_tok, K = v->params[0]->shape[1];
    const int q25 = v->vc.kind == AT_VISION_QWEN2_5_VL;
    patch_tables pt = {0};
    float *pix = NULL;
    int32_t *qi = NULL, *unwin = NULL;
    at_status st = AT_OK;
    AT_CHECK(make_tables(v, grid_thw, n_images, &pt));
    pix = malloc((size_t)(N * K) * sizeof *pix);
    qi = malloc((size_t)(N > U ? N : U) * sizeof *qi);
    if (!pix || !qi) {
        st = at_error(AT_ERR_NOMEM, "out of memory (vision input of %lld patches)", (long long)N);
        goto done;
    }
    for (int64_t r = 0; r < N; r++) memcpy(pix + r * K, pixels + (int64_t)pt.order[r] * K, (size_t)K * sizeof *pix);
    AT_CHECK(new_f32(v, N, K, "vision.pixels", &v->pix));
    AT_CHECK(at_tensor_upload(v->pix, pix, (size_t)(N * K) * sizeof *pix));
    int64_t s2[2] = {N, 2}, s1[2] = {1, N}, su[1] = {U};
    AT_CHECK(upload_i32(v, pt.pos, 2, s2, "vision.pos", &v->pos));
    for (int64_t r = 0; r < N; r++) qi[r] = (int32_t)(N - 1); /* every key visible but for the segments */
    AT_CHECK(upload_i32(v, qi, 2, s1, "vision.q_index", &v->q_index));
    AT_CHECK(upload_i32(v, pt.frame, 2, s1, "vision.frames", &v->seg_frame));
    if (q25) {
        AT_CHECK(upload_i32(v, pt.window, 2, s1, "vision.windows", &v->seg_window));
        unwin = qi; /* the inverse permutation: token j of image order is unit unwin[j] */
        for (int64_t u = 0; u < U; u++) unwin[pt.win[u]] = (int32_t)u;
        AT_CHECK(upload_i32(v, pt.win, 1, su, "vision.window_index", &v->win_ids));
        AT_CHECK(upload_i32(v, unwin, 1, su, "vision.window_reverse", &v->unwin_ids));
    }
    if (v->pos_embed >= 0) AT_CHECK(prepare_pos_embed(v, &pt, grid_thw, n_images));
done:
    tables_free(&pt);
    free(pix);
    free(qi);
    return st;
}

int64_t at_vision_feature_rows(const at_vision_config *vc, int64_t n_tokens)
{
    return n_tokens * (1 + (vc->kind == AT_VISION_QWEN3_VL ? vc->n_deepstack : 0));
}

/* Merger j (0: the merger, 1 + i: deepstack merger i) of the blocks' output x
 * [N, W] into out [N/m², O]:
 *   out = fc2(gelu(fc1(norm(x) viewed [N/m², m²W])))        the merger
 *   out = fc2(gelu(fc1(norm(x viewed [N/m², m²W]))))        a deepstack merger
 * (Qwen2-VL's and Qwen2.5-VL's fc1, fc2 are mlp.0, mlp.2; Qwen2.5-VL's out
 * goes back to image order). With training, what the backward needs is kept
 * in v->ma[j], a deepstack merger's input copied (its block's output is
 * overwritten when the blocks run as in inference). */
static at_status merger_forward(at_vision *v, int j, const at_tensor *x, at_tensor *out, int training)
{
    const int64_t N = v->n, U = v->n_tok, W = v->vc.width;
    const int64_t mmW = W * v->vc.spatial_merge_size * v->vc.spatial_merge_size;
    merger_acts *ma = &v->ma[j];
    int64_t s4[2] = {U, mmW};
    at_tensor in4, ln4;
    const int64_t nr = j ? U : N, nc = j ? mmW : W; /* the norm's rows and width */
    if (j && training) {
        AT_TRY(new_f32(v, N, W, "vision.deepstack.in", &ma->in));
        AT_TRY(at_cast(ma->in, x));
        x = ma->in;
    }
    at_tensor_view_inplace(&in4, x, 0, 2, s4);
    AT_TRY(new_f32(v, nr, nc, "vision.merger.norm", &ma->ln));
    if (training && layernorm(v)) AT_TRY(new_f32(v, nr, 0, "vision.merger.mean", &ma->mean));
    if (training) AT_TRY(new_f32(v, nr, 0, "vision.merger.rstd", &ma->rstd));
    AT_TRY(new_f32(v, U, mmW, "vision.merger.h", &ma->h));
    AT_TRY(new_f32(v, U, mmW, "vision.merger.act", &ma->a));
    AT_TRY(norm_forward(v, ma->ln, ma->mean, ma->rstd, j ? &in4 : x, MP(v, j, M_LNW), MP(v, j, M_LNB)));
    at_tensor_view_inplace(&ln4, ma->ln, 0, 2, s4);
    AT_TRY(linear(ma->h, 0.0f, &ln4, MP(v, j, M_0W), MP(v, j, M_0B)));
    AT_TRY(at_gelu_forward(ma->a, ma->h, AT_GELU_ERF));
    if (!v->unwin_ids) return linear(out, 0.0f, ma->a, MP(v, j, M_2W), MP(v, j, M_2B));
    /* Qwen2.5-VL: back to image order, features[j] = out[unwin[j]] */
    AT_TRY(new_f32(v, U, v->vc.out_hidden_size, "vision.merger.out", &ma->out));
    AT_TRY(linear(ma->out, 0.0f, ma->a, MP(v, j, M_2W), MP(v, j, M_2B)));
    return at_embedding_forward(out, v->unwin_ids, ma->out);
}

/* Backward of merger j for dout (its output's gradient, image order): the
 * trainable weights' gradients added, and dx (NULL: not wanted; else [N, W])
 * overwritten with the gradient of its input x. */
static at_status merger_backward(at_vision *v, int j, const at_tensor *dout, const at_tensor *x, at_tensor *dx)
{
    const int64_t N = v->n, U = v->n_tok, W = v->vc.width;
    const int64_t mmW = W * v->vc.spatial_merge_size * v->vc.spatial_merge_size;
    merger_acts *ma = &v->ma[j];
    at_tensor *dord = NULL, *dh = NULL, *dln = NULL, *dxs = NULL;
    at_tensor dln4, ln4, x4, dx4;
    int64_t s4[2] = {U, mmW};
    at_status st = AT_OK;
    if (v->win_ids) { /* Qwen2.5-VL: the gradient of out in block order, dord[u] = dout[win[u]] */
        AT_CHECK(new_f32(v, U, v->vc.out_hidden_size, "vision.d_merger_out", &dord));
        AT_CHECK(at_embedding_forward(dord, v->win_ids, dout));
        dout = dord;
    }
    AT_CHECK(new_f32(v, U, mmW, "vision.d_merger_h", &dh));
    AT_CHECK(linear_backward(dh, 0.0f, dout, ma->a, MP(v, j, M_2W), MG(v, j, M_2W), MG(v, j, M_2B)));
    AT_CHECK(at_gelu_backward(dh, dh, ma->h, AT_GELU_ERF));
    if (dx || MG(v, j, M_LNW)) {
        if (!dx) AT_CHECK(new_f32(v, N, W, "vision.d_merger_in", &dxs));
        at_tensor *d = dx ? dx : dxs;
        AT_CHECK(new_f32(v, j ? U : N, j ? mmW : W, "vision.d_merger_norm", &dln));
        at_tensor_view_inplace(&dln4, dln, 0, 2, s4);
        AT_CHECK(linear_backward(&dln4, 0.0f, dh, NULL, MP(v, j, M_0W), NULL, NULL));
        at_tensor_view_inplace(&x4, x, 0, 2, s4);
        at_tensor_view_inplace(&dx4, d, 0, 2, s4);
        AT_CHECK(norm_backward(v, j ? &dx4 : d, MG(v, j, M_LNW), MG(v, j, M_LNB), dln, j ? &x4 : x, MP(v, j, M_LNW),
                               ma->mean, ma->rstd));
    }
    at_tensor_view_inplace(&ln4, ma->ln, 0, 2, s4);
    AT_CHECK(linear_backward(NULL, 0.0f, dh, &ln4, MP(v, j, M_0W), MG(v, j, M_0W), MG(v, j, M_0B)));
done:
    at_tensor_free(dord);
    at_tensor_free(dh);
    at_tensor_free(dln);
    at_tensor_free(dxs);
    return st;
}

/* Rows [j·n_tok, (j+1)·n_tok) of features: merger j's output. */
static void feature_rows(at_tensor *dst, const at_tensor *features, int j, int64_t n_tok)
{
    int64_t s[2] = {n_tok, features->shape[1]};
    at_tensor_view_inplace(dst, features, (size_t)(j * n_tok * features->shape[1]), 2, s);
}

/* Deepstack merger i's block, or -1. */
static int deepstack_of(const at_vision *v, int b)
{
    for (int i = 0; v->vc.kind == AT_VISION_QWEN3_VL && i < v->vc.n_deepstack; i++)
        if (v->vc.deepstack_visual_indexes[i] == b) return i;
    return -1;
}

at_status at_vision_forward(at_vision *v, at_tensor *features, const float *pixels, int64_t n_patches,
                            const int32_t (*grid_thw)[3], int n_images, int training)
{
    const at_vision_config *vc = &v->vc;
    const int64_t W = vc->width;
    int64_t n_tok = 0;
    char d[128];
    at_vision_release(v);
    AT_TRY(at_vision_tokens(vc, grid_thw, n_images, n_patches, &n_tok));
    const int64_t rows = at_vision_feature_rows(vc, n_tok);
    if (features->dtype != AT_F32 || features->ndim != 2 || features->shape[0] != rows ||
        features->shape[1] != vc->out_hidden_size || features->buf->backend != v->be)
        return at_error(AT_ERR_INVALID, "vision forward: features %s must be f32 [%lld, %d] on the tower's device",
                        at_tensor_describe(features, d, sizeof d), (long long)rows, vc->out_hidden_size);
    v->n = n_patches;
    v->n_tok = n_tok;
    at_status st = AT_OK;
    /* a frozen tower's blocks run as in inference (the backward stops after the mergers) */
    const int blocks = training && v->train_vit && !v->vit_held;
    int na = blocks ? vc->depth : 1;
    v->acts = calloc((size_t)na, sizeof *v->acts);
    if (!v->acts) return at_error(AT_ERR_NOMEM, "out of memory");
    v->kept = training != 0;
    v->kept_blocks = blocks;
    AT_CHECK(prepare(v, pixels, grid_thw, n_images));
    for (int b = 0; b < na; b++) AT_CHECK(acts_alloc(v, &v->acts[b], blocks));
    /* the patch embedding: x0 = pixels · Wpatchᵀ (+ bias, + the interpolated positions: Qwen3-VL) */
    AT_CHECK(new_f32(v, v->n, W, "vision.x0", &v->x0));
    AT_CHECK(linear(v->x0, 0.0f, v->pix, v->params[0], XP(v, v->pe_bias)));
    if (v->pos_embed >= 0) AT_CHECK(pos_embed_pass(v, v->x0, 0));
    at_tensor *x = v->x0;
    at_tensor fr;
    for (int b = 0; b < vc->depth; b++) {
        block_acts *a = &v->acts[blocks ? b : 0];
        AT_CHECK(block_forward(v, b, x, a));
        if (blocks) x = a->out;
        int i = deepstack_of(v, b);
        if (i >= 0) {
            feature_rows(&fr, features, 1 + i, n_tok);
            AT_CHECK(merger_forward(v, 1 + i, x, &fr, training));
        }
    }
    feature_rows(&fr, features, 0, n_tok);
    AT_CHECK(merger_forward(v, 0, x, &fr, training));
done:
    if (st != AT_OK || !training) at_vision_release(v);
    return st;
}

at_status at_vision_backward(at_vision *v, const at_tensor *d_features)
{
    const at_vision_config *vc = &v->vc;
    const int64_t N = v->n, W = vc->width, F = vc->intermediate_size;
    char d[128];
    const int vit = v->train_vit && !v->vit_held;
    if (!vit && !v->train_aligner) return AT_OK;
    if (!v->kept) return at_error(AT_ERR_INVALID, "vision backward: no training forward to go back through");
    if (vit && !v->kept_blocks)
        return at_error(AT_ERR_INVALID, "vision backward: the tower became trainable after the forward, which kept "
                        "no block's activations");
    const int64_t rows = at_vision_feature_rows(vc, v->n_tok);
    if (d_features->dtype != AT_F32 || d_features->ndim != 2 || d_features->shape[0] != rows ||
        d_features->shape[1] != vc->out_hidden_size)
        return at_error(AT_ERR_INVALID, "vision backward: d_features %s must be f32 [%lld, %d]",
                        at_tensor_describe(d_features, d, sizeof d), (long long)rows, vc->out_hidden_size);
    at_status st = AT_OK;
    block_scratch s = {0};
    at_tensor *dx = NULL, *dds = NULL;
    at_tensor fr;
    /* the merger; its input gradient only when the blocks train */
    const int need_dx = vit;
    /* the blocks' output: the last block's, or x0 updated in place when they ran as in inference */
    at_tensor *x_last = v->kept_blocks && vc->depth ? v->acts[vc->depth - 1].out : v->x0;
    if (need_dx) AT_CHECK(new_f32(v, N, W, "vision.dx", &dx));
    feature_rows(&fr, d_features, 0, v->n_tok);
    AT_CHECK(merger_backward(v, 0, &fr, x_last, dx));
    if (!need_dx) { /* the deepstack mergers' weights alone */
        for (int b = 0; b < vc->depth; b++) {
            int i = deepstack_of(v, b);
            if (i < 0) continue;
            feature_rows(&fr, d_features, 1 + i, v->n_tok);
            AT_CHECK(merger_backward(v, 1 + i, &fr, v->ma[1 + i].in, NULL));
        }
        goto done;
    }
    /* the blocks, last to first; dx holds the gradient of the residual stream */
    AT_CHECK(new_f32(v, N, W, "vision.d_mid", &s.dmid));
    AT_CHECK(new_f32(v, N, W, "vision.d_norm", &s.dn));
    AT_CHECK(new_f32(v, N, W, "vision.d_tmp", &s.tmp));
    AT_CHECK(new_heads(v, "vision.d_att", &s.datt));
    AT_CHECK(new_heads(v, "vision.dq", &s.dq));
    AT_CHECK(new_heads(v, "vision.dk", &s.dk));
    AT_CHECK(new_heads(v, "vision.dv", &s.dv));
    AT_CHECK(new_f32(v, N, F, "vision.d_act", &s.dact));
    AT_CHECK(new_f32(v, N, F, "vision.d_h1", &s.dh1));
    if (!layernorm(v)) AT_CHECK(new_f32(v, N, F, "vision.d_h2", &s.dh2));
    if (v->lora) AT_CHECK(new_f32(v, N, v->lora_rank, "vision.d_lora_u", &s.du));
    for (int b = vc->depth - 1; b >= 0; b--) {
        int i = deepstack_of(v, b);
        if (i >= 0) { /* block b's output also went through deepstack merger i */
            if (!dds) AT_CHECK(new_f32(v, N, W, "vision.d_deepstack", &dds));
            feature_rows(&fr, d_features, 1 + i, v->n_tok);
            AT_CHECK(merger_backward(v, 1 + i, &fr, v->ma[1 + i].in, dds));
            AT_CHECK(at_add(dx, dx, dds));
        }
        AT_CHECK(block_backward(v, b, dx, b ? v->acts[b - 1].out : v->x0, &v->acts[b], &s));
    }
    /* the positions (Qwen3-VL) and the patch embedding: dWpatch += dx0ᵀ · pixels, dbias += Σ dx0 */
    if (v->pos_embed >= 0 && v->grads[v->pos_embed]) AT_CHECK(pos_embed_pass(v, dx, 1));
    AT_CHECK(linear_backward(NULL, 0.0f, dx, v->pix, v->params[0], v->grads[0], XG(v, v->pe_bias)));
done:
    free_tensors((at_tensor **)&s, sizeof s / sizeof(at_tensor *));
    at_tensor_free(dx);
    at_tensor_free(dds);
    return st;
}
