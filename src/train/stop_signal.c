#include "train/stop_signal.h"

#include <string.h>

static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig)
{
    if (g_stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_stop_signal = sig;
}

void at_stop_signals_catch(at_stop_handlers *saved)
{
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = on_stop_signal;
    sigemptyset(&a.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGTERM, &a, &saved->term);
    sigaction(SIGINT, &a, &saved->intr);
}

void at_stop_signals_release(const at_stop_handlers *saved)
{
    sigaction(SIGTERM, &saved->term, NULL);
    sigaction(SIGINT, &saved->intr, NULL);
}

int at_stop_signal(void) { return (int)g_stop_signal; }
