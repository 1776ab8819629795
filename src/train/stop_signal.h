/* SIGTERM / SIGINT while a run trains (a scheduler's preemption, Ctrl-C, the
 * web UI's Stop): the step under way finishes, every rank stops at the same
 * step boundary (the trainer sends the flag with the step's counts), the
 * last step is checkpointed and the run ends, so no finished step is lost.
 * A second signal ends the process at once (the default action). */
#ifndef AT_TRAIN_STOP_SIGNAL_H
#define AT_TRAIN_STOP_SIGNAL_H

#include <signal.h>

typedef struct {
    struct sigaction term, intr; /* the handlers before */
} at_stop_handlers;

/* Clears the flag and catches SIGTERM and SIGINT; *saved receives the old handlers. */
void at_stop_signals_catch(at_stop_handlers *saved);
/* Puts the old handlers back. */
void at_stop_signals_release(const at_stop_handlers *saved);
/* The signal received since at_stop_signals_catch (0: none). */
int at_stop_signal(void);

#endif
