/* What the trainer reports (trainer_impl.h): logging.jsonl, one JSON object
 * per logged step as the Hugging Face Trainer's log history; the progress
 * notes; images/train_loss.svg. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "base/file.h"
#include "train/plot.h"
#include "train/trainer_impl.h"

double at_trainer_peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static at_status push_hist(int64_t **steps, double **a, double **b, int *n, int *cap, int64_t s, double va, double vb)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        int64_t *ns = realloc(*steps, (size_t)nc * sizeof *ns);
        if (!ns) return at_error(AT_ERR_NOMEM, "out of memory");
        *steps = ns;
        double *na = realloc(*a, (size_t)nc * sizeof *na);
        if (!na) return at_error(AT_ERR_NOMEM, "out of memory");
        *a = na;
        if (b) {
            double *nb = realloc(*b, (size_t)nc * sizeof *nb);
            if (!nb) return at_error(AT_ERR_NOMEM, "out of memory");
            *b = nb;
        }
        *cap = nc;
    }
    (*steps)[*n] = s;
    (*a)[*n] = va;
    if (b) (*b)[*n] = vb;
    (*n)++;
    return AT_OK;
}

at_status at_trainer_log_open(at_trainer *t)
{
    char *logp = at_path_join(t->run_dir, "logging.jsonl");
    t->log = logp ? fopen(logp, "a") : NULL;
    free(logp);
    if (!t->log) return at_error(AT_ERR_IO, "%s/logging.jsonl: cannot open: %s", t->run_dir, strerror(errno));
    const char *r = t->a->report_to;
    if (r && (!strcmp(r, "tensorboard") || !strcmp(r, "all"))) {
        char *runs = at_path_join(t->run_dir, "runs");
        if (!runs) return at_error(AT_ERR_NOMEM, "out of memory");
        at_status st = at_tb_open(&t->tb, runs);
        free(runs);
        AT_TRY(st);
    }
    return AT_OK;
}

at_status at_trainer_log_line(at_trainer *t, cJSON *obj)
{
    if (!t->log) return AT_OK; /* ranks other than 0 */
    char *s = cJSON_PrintUnformatted(obj);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    fprintf(t->log, "%s\n", s);
    free(s);
    if (fflush(t->log) != 0) return at_error(AT_ERR_IO, "%s/logging.jsonl: write failed: %s", t->run_dir, strerror(errno));
    if (!t->tb.f) return AT_OK;
    return at_tb_write_scalars(&t->tb, (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(obj, "step")), obj);
}

at_status at_trainer_log_step(at_trainer *t, cJSON *line, at_progress *bar, int64_t done, double norm, double lr,
                              at_log_interval *iv, at_train_result *res)
{
    const at_objective *o = t->obj;
    double now = at_now_seconds();
    double tps = (double)iv->tokens / (now - iv->t0 > 1e-9 ? now - iv->t0 : 1e-9);
    double loss = iv->loss / iv->steps;
    cJSON_AddNumberToObject(line, "step", (double)done);
    cJSON_AddNumberToObject(line, "epoch", (double)done / (double)t->steps_per_epoch);
    cJSON_AddNumberToObject(line, "loss", loss);
    if (isnan(res->first_logged_loss)) res->first_logged_loss = loss;
    res->last_logged_loss = loss;
    if (o->ops->log) o->ops->log(o, t->interval_stats, line);
    memset(t->interval_stats, 0, sizeof t->interval_stats);
    cJSON_AddNumberToObject(line, "grad_norm", norm);
    cJSON_AddNumberToObject(line, "lr", lr);
    cJSON_AddNumberToObject(line, "tokens", (double)t->tokens_seen);
    cJSON_AddNumberToObject(line, "tokens_per_s", round(tps * 10) / 10);
    cJSON_AddNumberToObject(line, "memory_mb", round(at_trainer_peak_rss_mb()));
    AT_TRY(push_hist(&t->hist_step, &t->hist_loss, &t->hist_lr, &t->n_hist, &t->cap_hist, done, loss, lr));
    char note[300];
    int k = snprintf(note, sizeof note, "step %lld/%lld  epoch %.2f  loss %.4f  grad_norm %.3f  lr %.3g  "
                     "%.0f tok/s", (long long)done, (long long)t->total_steps,
                     (double)done / (double)t->steps_per_epoch, loss, norm, lr, tps);
    /* preference objectives: TRL's two figures a user watches */
    const cJSON *acc = cJSON_GetObjectItem(line, "rewards/accuracies"),
                *mar = cJSON_GetObjectItem(line, "rewards/margins");
    if (cJSON_IsNumber(acc) && cJSON_IsNumber(mar) && k > 0 && (size_t)k < sizeof note)
        snprintf(note + k, sizeof note - (size_t)k, "  rewards/accuracies %.3f  rewards/margins %.4f",
                 acc->valuedouble, mar->valuedouble);
    /* grpo: the mean reward, and generation's share of the wall time */
    const cJSON *rw = cJSON_GetObjectItem(line, "reward"), *gs = cJSON_GetObjectItem(line, "generation_share");
    if (cJSON_IsNumber(rw) && cJSON_IsNumber(gs) && k > 0 && (size_t)k < sizeof note)
        snprintf(note + k, sizeof note - (size_t)k, "  reward %.4f  generation %.0f%% of the time", rw->valuedouble,
                 100 * gs->valuedouble);
    at_progress_note(bar, note);
    iv->loss = 0;
    iv->steps = 0;
    iv->tokens = 0;
    iv->t0 = now;
    return AT_OK;
}

at_status at_trainer_log_eval(at_trainer *t, cJSON *line, at_progress *bar, int64_t done, double el)
{
    if (!cJSON_GetObjectItem(line, "step")) cJSON_AddNumberToObject(line, "step", (double)done);
    cJSON_AddNumberToObject(line, "eval_loss", el);
    AT_TRY(push_hist(&t->eval_step, &t->eval_loss, NULL, &t->n_eval, &t->cap_eval, done, el, 0));
    char note[120];
    snprintf(note, sizeof note, "step %lld/%lld  eval_loss %.4f", (long long)done, (long long)t->total_steps, el);
    at_progress_note(bar, note);
    return AT_OK;
}

at_status at_trainer_write_plot(at_trainer *t)
{
    if (!t->n_hist) return AT_OK;
    at_status st = AT_OK;
    char *img = at_path_join(t->run_dir, "images");
    if (img) st = at_mkdirs(img);
    char *svg = img ? at_path_join(img, "train_loss.svg") : NULL;
    at_plot_series l = {t->hist_step, t->hist_loss, t->n_hist}, e = {t->eval_step, t->eval_loss, t->n_eval},
                   r = {t->hist_step, t->hist_lr, t->n_hist};
    if (st == AT_OK && svg) st = at_plot_loss_svg(svg, &l, &e, &r);
    free(svg);
    free(img);
    return st;
}
