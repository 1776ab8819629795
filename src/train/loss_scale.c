#include "train/loss_scale.h"

#include <math.h>

/* GradScaler's defaults: start at 2^16, halve on overflow, double after 2000 clean steps. */
#define LOSS_SCALE_INIT 65536.0
#define LOSS_SCALE_GROWTH_INTERVAL 2000

void at_loss_scaler_init(at_loss_scaler *s, int on, double init)
{
    s->on = on;
    s->scale = !on ? 1.0 : init > 0 ? init : LOSS_SCALE_INIT;
    s->good_steps = 0;
}

int at_loss_scaler_overflow(at_loss_scaler *s, double loss, double grad_norm)
{
    if (!(s->on && isfinite(loss) && !isfinite(grad_norm) && s->scale > 1)) return 0;
    s->scale /= 2;
    s->good_steps = 0;
    return 1;
}

void at_loss_scaler_updated(at_loss_scaler *s)
{
    if (s->on && ++s->good_steps >= LOSS_SCALE_GROWTH_INTERVAL) {
        s->scale *= 2;
        s->good_steps = 0;
    }
}
