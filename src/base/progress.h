/* A progress bar. On a terminal it redraws one line in place (bar, count,
 * rate, ETA and a caller-supplied status such as "loss 2.31"); when stderr is
 * not a terminal it prints plain lines, at most one per `plain_interval`
 * seconds (and at the end), so logs stay readable. */
#ifndef AT_BASE_PROGRESS_H
#define AT_BASE_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    char label[48];
    int64_t total;
    int64_t done;
    double start_time, last_draw;
    double plain_interval;
    int tty;
    int width;
    FILE *out;
} at_progress;

/* Starts a bar writing to `out` (stderr when NULL). total may be 0 (unknown). */
void at_progress_start(at_progress *p, const char *label, int64_t total, FILE *out);
/* Sets the count and redraws if due; status may be NULL. */
void at_progress_update(at_progress *p, int64_t done, const char *status);
/* Prints a whole line (no newline needed) above the bar: on a terminal the
 * bar is cleared first and drawn again below the line. */
void at_progress_note(at_progress *p, const char *line);
/* Final draw and newline. */
void at_progress_finish(at_progress *p, const char *status);
/* Forces plain-line mode (tests) or terminal mode. */
void at_progress_set_tty(at_progress *p, int tty);

/* Monotonic seconds. */
double at_now_seconds(void);

#endif
