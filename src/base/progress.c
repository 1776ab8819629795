#include "base/progress.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

double at_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void at_progress_start(at_progress *p, const char *label, int64_t total, FILE *out)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->out = out ? out : stderr;
    p->tty = isatty(fileno(p->out));
    p->width = 30;
    p->plain_interval = 5.0;
    p->start_time = at_now_seconds();
    p->last_draw = -1e9;
}

void at_progress_set_tty(at_progress *p, int tty) { p->tty = tty; }

static void format_time(double s, char *buf, size_t n)
{
    if (s < 0 || s > 1e7) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, n, "%02ld:%02ld", t / 60, t % 60);
}

static void draw(at_progress *p, const char *status, int final)
{
    double now = at_now_seconds();
    double elapsed = now - p->start_time;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0;
    char eta[32], el[32];
    format_time(rate > 0 && p->total > 0 ? (double)(p->total - p->done) / rate : -1, eta, sizeof eta);
    format_time(elapsed, el, sizeof el);
    if (p->tty) {
        char bar[128];
        int filled = p->total > 0 ? (int)((double)p->done / (double)p->total * p->width) : 0;
        if (filled > p->width) filled = p->width;
        for (int i = 0; i < p->width; i++) bar[i] = i < filled ? '#' : '.';
        bar[p->width] = '\0';
        fprintf(p->out, "\r\033[K%s [%s] %lld/%lld %s<%s %s", p->label, bar, (long long)p->done,
                (long long)p->total, el, eta, status ? status : "");
        if (final) fputc('\n', p->out);
    } else {
        fprintf(p->out, "%s: %lld/%lld elapsed %s eta %s %s\n", p->label, (long long)p->done, (long long)p->total,
                el, eta, status ? status : "");
    }
    fflush(p->out);
    p->last_draw = now;
}

void at_progress_update(at_progress *p, int64_t done, const char *status)
{
    p->done = done;
    double now = at_now_seconds();
    double interval = p->tty ? 0.1 : p->plain_interval;
    if (now - p->last_draw >= interval) draw(p, status, 0);
}

void at_progress_note(at_progress *p, const char *line)
{
    if (p->tty) fputs("\r\033[K", p->out);
    fprintf(p->out, "%s\n", line);
    if (p->tty) p->last_draw = -1e9; /* redraw at the next update */
    fflush(p->out);
}

void at_progress_finish(at_progress *p, const char *status)
{
    draw(p, status, 1);
}
