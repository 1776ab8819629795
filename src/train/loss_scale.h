/* Dynamic loss scaling (the planner's choice where f16 is the fast format),
 * as torch.cuda.amp.GradScaler: the gradients are of loss · scale; a step
 * whose loss is finite but whose gradient norm is not overflowed: the scale
 * halves and the step makes no update; after 2000 clean steps it doubles.
 * Off, the scale stays 1. The scale and its count are a checkpoint's (a
 * resumed run continues with them). */
#ifndef AT_TRAIN_LOSS_SCALE_H
#define AT_TRAIN_LOSS_SCALE_H

typedef struct {
    int on;
    double scale;   /* 1 when off */
    int good_steps; /* updates since the scale last changed */
} at_loss_scaler;

/* init: the first scale (0: 2^16, GradScaler's). */
void at_loss_scaler_init(at_loss_scaler *s, int on, double init);
/* After the step's gradients: whether they overflowed (then the scale was
 * halved and the step must make no update). */
int at_loss_scaler_overflow(at_loss_scaler *s, double loss, double grad_norm);
/* After an update: counts it, doubling the scale every 2000. */
void at_loss_scaler_updated(at_loss_scaler *s);

#endif
