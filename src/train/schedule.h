/* Learning-rate schedules, as transformers' get_scheduler defines them.
 *
 * The multiplier of the base rate at optimizer step s (0 for the first
 * update), with W warmup steps and S total steps:
 *   warmup (s < W):  s / W
 *   constant:        1
 *   linear:          max(0, (S − s) / (S − W))
 *   cosine:          max(0, ½ (1 + cos(π · (s − W) / (S − W))))
 * "constant" has no warmup (as in transformers); "constant_with_warmup" does. */
#ifndef AT_TRAIN_SCHEDULE_H
#define AT_TRAIN_SCHEDULE_H

#include <stdint.h>
#include "base/status.h"

typedef enum { AT_SCHED_CONSTANT, AT_SCHED_CONSTANT_WARMUP, AT_SCHED_LINEAR, AT_SCHED_COSINE } at_schedule_kind;

typedef struct {
    at_schedule_kind kind;
    double base_lr;
    int64_t warmup_steps;
    int64_t total_steps;
} at_schedule;

/* Parses "cosine", "linear", "constant", "constant_with_warmup". */
at_status at_schedule_parse(const char *name, at_schedule_kind *out);

/* Warmup steps from --warmup_steps (wins when > 0) or --warmup_ratio
 * (ceil(ratio · total), as transformers computes it). */
int64_t at_schedule_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

/* The learning rate for optimizer step s (0-based). */
double at_schedule_lr(const at_schedule *s, int64_t step);

#endif
