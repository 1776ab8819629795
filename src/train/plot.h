/* images/train_loss.svg: the loss curve of a run (training loss, eval loss
 * and the learning rate against the step), as a self-contained SVG. */
#ifndef AT_TRAIN_PLOT_H
#define AT_TRAIN_PLOT_H

#include <stdint.h>
#include "base/status.h"

typedef struct {
    const int64_t *step;   /* x of each point */
    const double *value;
    int n;
} at_plot_series;

/* Writes the SVG atomically. loss is drawn against the left axis, eval_loss
 * (may have n = 0) likewise, lr (n = 0 to omit) against the right axis. */
at_status at_plot_loss_svg(const char *path, const at_plot_series *loss, const at_plot_series *eval_loss,
                           const at_plot_series *lr);

#endif
