/* NEFTune (--neftune_noise_alpha): uniform noise on the embeddings in
 * training, x_0 = embed[ids] + U(−m, m), m = alpha / sqrt(L·hidden).
 *  - the operation (ops.h at_add_uniform_noise): |n| <= m, mean ~0, variance
 *    ~m²/3 over a big tensor; magnitude 0 leaves y bit for bit; the same
 *    noise at any thread count; bad arguments refused;
 *  - against PyTorch (tools/make_goldens.py, *.neftune.golden.safetensors:
 *    the noise redone in numpy from base/rng.c's counter hash, added to the
 *    embeddings of the hand-written HF forward, gradients by autograd): the
 *    noise itself, the loss, every LoRA gradient (checkpointing on and off)
 *    and every full fine-tuning gradient, on the CPU, the reference kernels,
 *    the CUDA backend under the emulator and a real GPU when there is one;
 *    the goldens without noise no longer match (the noise matters);
 *  - evaluation is unaffected: at_decoder_forward with alpha set on the
 *    activations equals a forward without, bit for bit; alpha 0 trains
 *    exactly as before;
 *  - layout independence: the batch's rows run as two micro-batches of one
 *    row each (own lengths, rows keyed by their place in the step, L the
 *    step's columns) give the whole batch's gradients, with LoRA dropout on;
 *  - the trainer: per_device_train_batch_size 1 × accumulation 2 logs the
 *    step-1 loss and gradient norm of 2 × 1 (1e-6), which differ from a run
 *    without noise; a negative alpha is refused; the CLI writes the option
 *    to args.json; `anytune rlhf` (DPO) likewise: 1 pair × 2 = 2 pairs × 1. */
#include <dirent.h>
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
#include "base/file.h"
#include "base/json.h"
#include "device/cpu/cpu_backend.h"
#include "device/cuda_loader.h"
#include "train/run_files.h"
#include "train/trainer.h"
#include "train_goldens.h"

#define TOL 1e-4

/* ---- the operation ---------------------------------------------------------------------- */

static void test_op(void)
{
    const int64_t n = 1 << 17;
    const float m = 0.25f;
    at_tensor *y = NULL, *z = NULL;
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "y", &y));
    CHECK_OK(at_tensor_new(at_cpu_backend(), AT_F32, 1, &n, "z", &z));
    if (!y || !z) goto done;
    float *py = at_tensor_data(y), *pz = at_tensor_data(z);
    memset(py, 0, (size_t)n * 4);
    CHECK_OK(at_add_uniform_noise(y, m, 77, 123, 1000, 1u << 20));
    double s = 0, s2 = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        s += py[i];
        s2 += (double)py[i] * py[i];
        mx = fmax(mx, fabs(py[i]));
    }
    double mean = s / n, var = s2 / n - mean * mean, sd_mean = m / sqrt(3.0 * n);
    printf("noise m %.2f: mean %.2e (sd %.1e), var %.6f (m^2/3 = %.6f), max |n| %.6f\n", (double)m, mean, sd_mean,
           var, (double)m * m / 3, mx);
    CHECK_MSG(fabs(mean) < 5 * sd_mean, "mean %g", mean);
    CHECK_MSG(fabs(var / ((double)m * m / 3) - 1) < 0.02, "variance %g vs %g", var, (double)m * m / 3);
    CHECK_MSG(mx <= m && mx > 0.99 * m, "max |n| %g, m %g", mx, (double)m);
    /* the same noise on one thread (chunks split differently), and added on top of values */
    for (int64_t i = 0; i < n; i++) pz[i] = 1.5f;
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK_OK(at_add_uniform_noise(z, m, 77, 123, 1000, 1u << 20));
    omp_set_num_threads(threads);
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= pz[i] == 1.5f + py[i];
    CHECK_MSG(same, "noise depends on the thread count or on y");
    /* another seed, other noise; magnitude 0 changes nothing */
    memcpy(pz, py, (size_t)n * 4);
    CHECK_OK(at_add_uniform_noise(z, 0.0f, 77, 123, 1000, 1u << 20));
    CHECK(!memcmp(pz, py, (size_t)n * 4));
    memset(pz, 0, (size_t)n * 4);
    CHECK_OK(at_add_uniform_noise(z, m, 78, 123, 1000, 1u << 20));
    CHECK(memcmp(pz, py, (size_t)n * 4) != 0);
    /* bad arguments */
    CHECK_FAILS(at_add_uniform_noise(y, -0.1f, 1, 0, 0, 0), AT_ERR_INVALID);
    CHECK_FAILS(at_add_uniform_noise(y, NAN, 1, 0, 0, 0), AT_ERR_INVALID);
    CHECK_FAILS(at_add_uniform_noise(y, INFINITY, 1, 0, 0, 0), AT_ERR_INVALID);
    CHECK_FAILS(at_add_uniform_noise(y, m, 1, 0, 10, 9), AT_ERR_INVALID);
    CHECK_FAILS(at_add_uniform_noise(y, m, 1, 0, -1, 9), AT_ERR_INVALID);
done:
    at_tensor_free(y);
    at_tensor_free(z);
}

/* ---- decoder: one step with noise --------------------------------------------------------- */

/* Forward (+ loss, + backward into g when given: zeroed first) of the golden
 * batch with NEFTune alpha; *resid0 (when given) gets the noisy embeddings. */
static at_status neft_step(train_case *c, unsigned flags, at_decoder_grads *g, float alpha, float dropout,
                           uint64_t seed, at_loss_stats *stats, float **resid0)
{
    at_decoder_acts *a = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_decoder_acts_new_ex(c->d, c->B, c->T, flags, &a));
    a->neftune_alpha = alpha;
    if (g) AT_CHECK(at_decoder_grads_zero(g));
    AT_CHECK(at_decoder_forward_backward(c->d, a, c->t_ids, NULL, NULL, c->t_labels, dropout, seed,
                                         1.0f / (float)c->n_targets, g, stats));
    if (resid0) *resid0 = tc_host(&a->resid[0]);
done:
    at_decoder_acts_free(a);
    return st;
}

/* Every gradient of g as one host array (the trainables' order). */
static float *all_grads(at_decoder *d, const at_decoder_grads *g, size_t *n_out)
{
    int n = at_decoder_trainables(d, g, NULL, 0);
    at_param_grad *pg = calloc((size_t)n, sizeof *pg);
    size_t total = 0;
    at_decoder_trainables(d, g, pg, n);
    for (int i = 0; i < n; i++) total += (size_t)at_tensor_numel(pg[i].grad);
    float *out = malloc((total ? total : 1) * sizeof *out);
    size_t o = 0;
    for (int i = 0; i < n && out; i++) {
        float *h = tc_host(pg[i].grad);
        if (h) memcpy(out + o, h, (size_t)at_tensor_numel(pg[i].grad) * sizeof *out);
        free(h);
        o += (size_t)at_tensor_numel(pg[i].grad);
    }
    free(pg);
    *n_out = total;
    return out;
}

/* Opens the case with the NEFTune golden as c->gf; *clean: the training golden (no noise). */
static at_status open_neft(train_case *c, const char *name, at_backend *be, int lora, at_st_file **clean)
{
    char path[256];
    *clean = NULL;
    AT_TRY(tc_open(c, name, be, AT_F32, lora));
    *clean = c->gf;
    c->gf = NULL;
    snprintf(path, sizeof path, GOLDEN_DIR "/%s.neftune.golden.safetensors", name);
    at_status st = at_st_open(path, &c->gf);
    if (st != AT_OK) {
        at_st_close(*clean);
        *clean = NULL;
        tc_free(c);
    }
    return st;
}

static void test_golden(const char *name, at_backend *be)
{
    train_case c;
    at_st_file *clean = NULL;
    printf("%s (NEFTune, %s backend)\n", name, be->name);
    CHECK_OK(open_neft(&c, name, be, 1, &clean));
    if (!c.d) return;
    train_case cc = c; /* the same case read against the golden without noise */
    cc.gf = clean;
    float alpha = (float)tc_scalar(&c, "alpha");
    uint64_t seed = (uint64_t)tc_scalar(&c, "seed");
    int H = c.d->cfg.hidden_size;
    int64_t BT = (int64_t)c.B * c.T, esh[2] = {BT, H};
    at_decoder_grads *g1 = NULL, *g2 = NULL;
    at_tensor *emb = NULL;
    float *r1 = NULL, *r2 = NULL, *e = NULL, *noise = NULL, *a1 = NULL, *a2 = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g1));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &g2));
    CHECK_OK(at_tensor_new(be, AT_F32, 2, esh, "embeddings", &emb));
    if (!g1 || !g2 || !emb) goto done;
    at_loss_stats s1 = {0}, s2 = {0};
    CHECK_OK(neft_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g1, alpha, 0.0f, seed, &s1, &r1));
    CHECK_OK(neft_step(&c, AT_ACTS_TRAIN, g2, alpha, 0.0f, seed, &s2, &r2));
    /* the noise: resid[0] = embed[ids] + noise, f32 sum */
    CHECK_OK(at_embedding_forward(emb, c.t_ids, c.d->w->embed));
    e = tc_host(emb);
    CHECK_OK(golden_array(c.gf, "noise", AT_F32, (void **)&noise, NULL, NULL));
    if (r1 && e && noise) {
        double worst = 0, me = 0;
        for (int64_t i = 0; i < BT * H; i++) me = fmax(me, fabs(e[i]));
        for (int64_t i = 0; i < BT * H; i++) worst = fmax(worst, fabs((double)r1[i] - (double)(e[i] + noise[i])));
        printf("  noise: max |x_0 - (embed + golden noise)| %.2e (|embed| max %.2f)\n", worst, me);
        CHECK_MSG(worst <= 1e-6 * me, "%s: the noise differs from the golden's by %g", name, worst);
    }
    double loss = s1.loss_sum / (double)s1.n_targets, want = tc_scalar(&c, "loss"), l0 = tc_scalar(&cc, "loss");
    printf("  loss %.7f, golden %.7f (without noise %.7f)\n", loss, want, l0);
    CHECK_NEAR(loss, want, 1e-5 * fabs(want));
    CHECK_MSG(fabs(l0 - want) > 50 * 1e-5 * fabs(want), "%s: the noise barely moves the loss", name);
    CHECK(s1.n_targets == (int64_t)tc_scalar(&c, "n_targets"));
    CHECK(tc_grads_err(&c, g1, "lora.", "LoRA grads (checkpointing)") <= TOL);
    CHECK(tc_grads_err(&c, g2, "lora.", "LoRA grads") <= TOL);
    CHECK(tc_grads_err(&cc, g1, "lora.", "vs the golden without noise") > 100 * TOL);
    size_t n1 = 0, n2 = 0;
    a1 = all_grads(c.d, g1, &n1);
    a2 = all_grads(c.d, g2, &n2);
    /* checkpointing recomputes from the stored noisy x_0: the same gradients */
    CHECK(a1 && a2 && n1 == n2 && at_test_max_rel_err(a1, a2, n1, 0) <= 1e-6);
done:
    free(r1);
    free(r2);
    free(e);
    free(noise);
    free(a1);
    free(a2);
    at_tensor_free(emb);
    at_decoder_grads_free(g1);
    at_decoder_grads_free(g2);
    at_st_close(clean);
    tc_free(&c);
}

/* Full fine-tuning: the noise is additive, so the embedding's gradient is the
 * scatter of dx_0 as without noise (plus the tied head's). */
static void test_golden_full(const char *name, at_backend *be)
{
    train_case c;
    at_st_file *clean = NULL;
    printf("%s (NEFTune, full fine-tuning, %s backend)\n", name, be->name);
    CHECK_OK(open_neft(&c, name, be, 0, &clean));
    if (!c.d) return;
    at_decoder_grads *g = NULL;
    CHECK_OK(at_decoder_grads_new(c.d, 1, &g));
    at_loss_stats s = {0};
    if (g) {
        CHECK_OK(neft_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, g, (float)tc_scalar(&c, "alpha"), 0.0f,
                           (uint64_t)tc_scalar(&c, "seed"), &s, NULL));
        double want = tc_scalar(&c, "full_loss");
        CHECK_NEAR(s.loss_sum / (double)s.n_targets, want, 1e-5 * fabs(want));
        CHECK(tc_grads_err(&c, g, "full.", "full grads") <= TOL);
    }
    at_decoder_grads_free(g);
    at_st_close(clean);
    tc_free(&c);
}

/* ---- evaluation unaffected; alpha 0 as before; bad alpha ---------------------------------- */

static void test_eval_unaffected(void)
{
    train_case c;
    at_st_file *clean = NULL;
    CHECK_OK(open_neft(&c, "llama_gqa", at_cpu_backend(), 1, &clean));
    if (!c.d) return;
    int64_t nf = (int64_t)c.B * c.T * c.d->cfg.hidden_size;
    at_decoder_acts *a = NULL, *b = NULL;
    float *f1 = NULL, *f2 = NULL, *f3 = NULL;
    CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &a));
    CHECK_OK(at_decoder_acts_new_ex(c.d, c.B, c.T, AT_ACTS_TRAIN, &b));
    if (!a || !b) goto done;
    /* evaluation (and DPO's reference pass) run at_decoder_forward on the trainer's activations */
    a->neftune_alpha = 5.0f;
    CHECK_OK(at_decoder_forward(c.d, a, c.t_ids, NULL, NULL));
    f1 = tc_host(&a->final_norm);
    CHECK_OK(at_decoder_forward(c.d, b, c.t_ids, NULL, NULL));
    f2 = tc_host(&b->final_norm);
    /* alpha 0: the training forward is the plain one */
    CHECK_OK(at_decoder_forward_train(c.d, b, c.t_ids, NULL, NULL, 0.0f, 99));
    f3 = tc_host(&b->final_norm);
    CHECK(f1 && f2 && f3 && !memcmp(f1, f2, (size_t)nf * 4) && !memcmp(f2, f3, (size_t)nf * 4));
    at_loss_stats s = {0};
    CHECK_OK(at_decoder_loss(c.d, a, c.t_labels, 1.0f, NULL, &s));
    train_case cc = c;
    cc.gf = clean;
    CHECK_NEAR(s.loss_sum / (double)s.n_targets, tc_scalar(&cc, "loss"), 1e-5 * tc_scalar(&cc, "loss"));
    /* bad alpha */
    a->neftune_alpha = -1.0f;
    CHECK_FAILS(at_decoder_forward_train(c.d, a, c.t_ids, NULL, NULL, 0.0f, 1), AT_ERR_INVALID);
    a->neftune_alpha = NAN;
    CHECK_FAILS(at_decoder_forward_train(c.d, a, c.t_ids, NULL, NULL, 0.0f, 1), AT_ERR_INVALID);
done:
    free(f1);
    free(f2);
    free(f3);
    at_decoder_acts_free(a);
    at_decoder_acts_free(b);
    at_st_close(clean);
    tc_free(&c);
}

/* ---- the rows of a step in any layout ------------------------------------------------------ */

/* Forward + backward of row r of the golden batch alone, cut to its own
 * length, as row r of the step, NEFTune's L = columns (0: the row's own). */
static at_status row_step(train_case *c, int r, int len, int64_t columns, float alpha, float dropout, uint64_t seed,
                          at_decoder_grads *g)
{
    at_decoder_acts *a = NULL;
    at_tensor *ids = NULL, *lab = NULL;
    at_status st = AT_OK;
    int64_t sh[2] = {1, len};
    AT_CHECK(at_tensor_new(c->d->be, AT_I32, 2, sh, "row_ids", &ids));
    AT_CHECK(at_tensor_new(c->d->be, AT_I32, 2, sh, "row_labels", &lab));
    AT_CHECK(at_tensor_upload(ids, c->ids + (size_t)r * c->T, (size_t)len * 4));
    AT_CHECK(at_tensor_upload(lab, c->labels + (size_t)r * c->T, (size_t)len * 4));
    AT_CHECK(at_decoder_acts_new_ex(c->d, 1, len, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, &a));
    a->neftune_alpha = alpha;
    a->neftune_columns = columns;
    a->dropout_first_row = r;
    at_loss_stats stats = {0};
    AT_CHECK(at_decoder_forward_backward(c->d, a, ids, NULL, NULL, lab, dropout, seed, 1.0f / (float)c->n_targets,
                                         g, &stats));
done:
    at_decoder_acts_free(a);
    at_tensor_free(ids);
    at_tensor_free(lab);
    return st;
}

static void test_layout(void)
{
    train_case c;
    at_st_file *clean = NULL;
    CHECK_OK(open_neft(&c, "llama_gqa", at_cpu_backend(), 1, &clean));
    if (!c.d) return;
    int32_t *len = NULL;
    at_decoder_grads *whole = NULL, *rows = NULL, *own = NULL;
    float *aw = NULL, *ar = NULL, *ao = NULL;
    const float alpha = 5.0f, p = 0.1f;
    const uint64_t seed = 4242;
    CHECK_OK(golden_array(clean, "lengths", AT_I32, (void **)&len, NULL, NULL));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &whole));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &rows));
    CHECK_OK(at_decoder_grads_new(c.d, 0, &own));
    if (!len || !whole || !rows || !own || c.B != 2) goto done;
    CHECK(len[0] == c.T && len[1] < c.T); /* row 1 is shorter: alone it has fewer columns */
    at_loss_stats sw = {0};
    CHECK_OK(neft_step(&c, AT_ACTS_TRAIN | AT_ACTS_CHECKPOINT, whole, alpha, p, seed, &sw, NULL));
    CHECK_OK(at_decoder_grads_zero(rows));
    CHECK_OK(at_decoder_grads_zero(own));
    for (int r = 0; r < 2; r++) {
        CHECK_OK(row_step(&c, r, len[r], c.T, alpha, p, seed, rows));
        CHECK_OK(row_step(&c, r, len[r], 0, alpha, p, seed, own));
    }
    size_t nw = 0, nr = 0, no = 0;
    aw = all_grads(c.d, whole, &nw);
    ar = all_grads(c.d, rows, &nr);
    ao = all_grads(c.d, own, &no);
    if (aw && ar && ao && nw == nr && nw == no) {
        double e_rows = at_test_max_rel_err(ar, aw, nw, 0), e_own = at_test_max_rel_err(ao, aw, nw, 0);
        printf("two 1-row micro-batches vs one of 2 rows (noise + dropout): rel err %.2e; with each row's own "
               "columns as L: %.2e\n", e_rows, e_own);
        CHECK_MSG(e_rows <= 1e-5, "layouts differ: %g", e_rows);
        CHECK_MSG(e_own > 1e-3, "L does not reach the noise: %g", e_own);
    } else {
        CHECK(0);
    }
done:
    free(len);
    free(aw);
    free(ar);
    free(ao);
    at_decoder_grads_free(whole);
    at_decoder_grads_free(rows);
    at_decoder_grads_free(own);
    at_st_close(clean);
    tc_free(&c);
}

/* ---- the trainer ---------------------------------------------------------------------------- */

static void train_args(at_train_args *a, const char *out, int batch, int accum, double alpha)
{
    at_test_train_args(a, "demo/stories260K", "demo/identity.json#24", out);
    a->lora_dropout = 0.05;
    a->neftune_noise_alpha = alpha;
    a->max_steps = 1;
    a->seed = 7;
    a->batch_size = batch;
    a->grad_accum = accum;
}

/* Step 1's loss and grad_norm from a run's logging.jsonl. */
static int first_step(const char *run_dir, double *loss, double *norm)
{
    char *p = at_path_join(run_dir, "logging.jsonl"), *text = NULL;
    int ok = 0;
    if (p && at_read_file(p, &text, NULL) == AT_OK) {
        char *nl = strchr(text, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(text);
        const cJSON *l = cJSON_GetObjectItem(j, "loss"), *g = cJSON_GetObjectItem(j, "grad_norm");
        if (l && g) {
            *loss = l->valuedouble;
            *norm = g->valuedouble;
            ok = 1;
        }
        cJSON_Delete(j);
    }
    free(text);
    free(p);
    return ok;
}

static void test_trainer(const char *root)
{
    static const int layout[3][2] = {{1, 2}, {2, 1}, {2, 1}};
    static const double alphas[3] = {5, 5, 0};
    double loss[3] = {0}, norm[3] = {0};
    for (int k = 0; k < 3; k++) {
        char out[512];
        snprintf(out, sizeof out, "%s/run%d", root, k);
        at_train_args a;
        at_train_result r;
        train_args(&a, out, layout[k][0], layout[k][1], alphas[k]);
        CHECK_OK(at_train_run(&a, stdout, &r));
        CHECK(first_step(r.run_dir, &loss[k], &norm[k]));
        printf("batch %d x accumulation %d, alpha %g: step 1 loss %.9f, grad_norm %.9f\n", layout[k][0],
               layout[k][1], alphas[k], loss[k], norm[k]);
    }
    CHECK_NEAR(loss[0], loss[1], 1e-6 * fabs(loss[1]));
    CHECK_NEAR(norm[0], norm[1], 1e-6 * fabs(norm[1]));
    CHECK_MSG(fabs(norm[1] - norm[2]) > 1e-4 * norm[2], "the noise does not change the gradients");
    at_train_args a;
    at_train_result r;
    char out[512];
    snprintf(out, sizeof out, "%s/bad", root);
    train_args(&a, out, 1, 1, -1);
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
    train_args(&a, out, 1, 1, NAN);
    CHECK_FAILS(at_train_run(&a, stdout, &r), AT_ERR_INVALID);
}

/* The CLI's option reaches args.json (and a bad value is an error). */
static void test_cli(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s sft --model demo/stories260K --dataset demo/identity.json#4 --max_steps 1 --save_steps 100 "
             "--neftune_noise_alpha 5 --output_dir %s/cli > %s/cli.log 2>&1",
             bin, root, root);
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "grep -Eq '\"neftune_noise_alpha\":[[:space:]]*5' %s/cli/v0-*/args.json", root);
    CHECK_MSG(system(cmd) == 0, "args.json lacks neftune_noise_alpha 5");
    snprintf(cmd, sizeof cmd,
             "%s sft --model demo/stories260K --dataset demo/identity.json#4 --max_steps 1 "
             "--neftune_noise_alpha -2 --output_dir %s/cli-bad > %s/cli-bad.log 2>&1",
             bin, root, root);
    int rc = system(cmd);
    CHECK_MSG(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "a negative alpha was accepted");
    snprintf(cmd, sizeof cmd, "grep -q 'neftune_noise_alpha' %s/cli-bad.log", root);
    CHECK_MSG(system(cmd) == 0, "the error does not name --neftune_noise_alpha");
}

/* The v*-* run folder under dir (NULL if none). Caller frees. */
static char *run_under(const char *dir)
{
    char *found = NULL;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] == 'v' && strchr(e->d_name, '-') && !found) found = at_path_join(dir, e->d_name);
    closedir(d);
    return found;
}

/* anytune rlhf (DPO) shares the option: 1 pair × accumulation 2 = 2 pairs × 1
 * with noise (and LoRA dropout), and the noise changes the step. */
static void test_dpo(const char *root)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) bin = "build/anytune";
    static const int layout[3][2] = {{1, 2}, {2, 1}, {2, 1}};
    static const double alphas[3] = {5, 5, 0};
    double loss[3] = {0}, norm[3] = {0};
    for (int k = 0; k < 3; k++) {
        char cmd[2048], out[512];
        snprintf(out, sizeof out, "%s/dpo%d", root, k);
        snprintf(cmd, sizeof cmd,
                 "%s rlhf --rlhf_type dpo --model demo/stories260K --dataset tests/data/dpo/dpo_en_demo_8.json "
                 "--max_steps 1 --logging_steps 1 --lora_dropout 0.05 --learning_rate 1e-4 --max_length 96 "
                 "--truncation_strategy left --seed 7 --per_device_train_batch_size %d "
                 "--gradient_accumulation_steps %d --neftune_noise_alpha %g --output_dir %s > %s.log 2>&1",
                 bin, layout[k][0], layout[k][1], alphas[k], out, out);
        CHECK_MSG(system(cmd) == 0, "%s", cmd);
        char *run = run_under(out);
        CHECK(run && first_step(run, &loss[k], &norm[k]));
        free(run);
        printf("dpo: %d pair(s) x accumulation %d, alpha %g: step 1 loss %.9f, grad_norm %.9f\n", layout[k][0],
               layout[k][1], alphas[k], loss[k], norm[k]);
    }
    CHECK_NEAR(loss[0], loss[1], 1e-6 * fabs(loss[1]));
    CHECK_NEAR(norm[0], norm[1], 1e-6 * fabs(norm[1]));
    CHECK_MSG(fabs(norm[1] - norm[2]) > 1e-4 * norm[2], "dpo: the noise does not change the gradients");
}

int main(void)
{
    char root[] = "/tmp/anytune-neftune-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_op();
    test_golden("llama_gqa", at_cpu_backend());
    test_golden("qwen2_bias_tied", at_cpu_backend());
    test_golden_full("llama_gqa", at_cpu_backend());
    test_golden_full("qwen2_bias_tied", at_cpu_backend());
    /* the reference kernels, and the CUDA backend (emulated, and a real GPU when there is one) */
    test_golden("qwen2_bias_tied", golden_ref_backend());
    at_backend *cuda[2] = {NULL, at_test_gpu_backend()};
#ifdef AT_CUDA_EMU_LIBRARY
    CHECK_OK(at_cuda_backend_load(AT_CUDA_EMU_LIBRARY, 0, &cuda[0]));
#endif
    for (int b = 0; b < 2; b++)
        if (cuda[b]) {
            test_golden("llama_gqa", cuda[b]);
            test_golden_full("qwen2_bias_tied", cuda[b]);
        }
    test_eval_unaffected();
    test_layout();
    test_trainer(root);
    test_cli(root);
    test_dpo(root);
    if (!at_test_failures) at_remove_tree(root);
    return at_test_result("train_neftune");
}
