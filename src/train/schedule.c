#include "train/schedule.h"

#include <math.h>
#include <string.h>

at_status at_schedule_parse(const char *name, at_schedule_kind *out)
{
    if (!strcmp(name, "cosine")) *out = AT_SCHED_COSINE;
    else if (!strcmp(name, "linear")) *out = AT_SCHED_LINEAR;
    else if (!strcmp(name, "constant")) *out = AT_SCHED_CONSTANT;
    else if (!strcmp(name, "constant_with_warmup")) *out = AT_SCHED_CONSTANT_WARMUP;
    else
        return at_error(AT_ERR_INVALID,
                        "--lr_scheduler_type %s: unknown (use cosine, linear, constant, constant_with_warmup)", name);
    return AT_OK;
}

int64_t at_schedule_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps)
{
    if (warmup_steps > 0) return warmup_steps;
    if (warmup_ratio > 0) return (int64_t)ceil(warmup_ratio * (double)total_steps);
    return 0;
}

double at_schedule_lr(const at_schedule *s, int64_t step)
{
    double w = (double)s->warmup_steps, total = (double)s->total_steps, k = (double)step;
    if (s->kind == AT_SCHED_CONSTANT) return s->base_lr;
    if (k < w) return s->base_lr * k / (w > 1 ? w : 1);
    double span = total - w > 1 ? total - w : 1;
    switch (s->kind) {
    case AT_SCHED_LINEAR: {
        double f = (total - k) / span;
        return s->base_lr * (f > 0 ? f : 0);
    }
    case AT_SCHED_COSINE: {
        double progress = (k - w) / span;
        double f = 0.5 * (1.0 + cos(M_PI * progress));
        return s->base_lr * (f > 0 ? f : 0);
    }
    default:
        return s->base_lr;
    }
}
