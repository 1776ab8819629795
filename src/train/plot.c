#include "train/plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} sbuf;

__attribute__((format(printf, 2, 3))) static void put(sbuf *s, const char *fmt, ...)
{
    if (s->failed) return;
    if (!s->buf) {
        s->buf = malloc(4096);
        if (!s->buf) {
            s->failed = 1;
            return;
        }
        s->cap = 4096;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->failed = 1;
            return;
        }
        if ((size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return;
        }
        size_t nc = (s->cap ? s->cap * 2 : 4096) + (size_t)n;
        char *nb = realloc(s->buf, nc);
        if (!nb) {
            s->failed = 1;
            return;
        }
        s->buf = nb;
        s->cap = nc;
    }
}

static void range(const at_plot_series *s, double *lo, double *hi)
{
    for (int i = 0; s && i < s->n; i++) {
        if (!isfinite(s->value[i])) continue;
        if (s->value[i] < *lo) *lo = s->value[i];
        if (s->value[i] > *hi) *hi = s->value[i];
    }
}

enum { W = 720, H = 420, L = 70, R = 70, T = 40, B = 50 };

static void polyline(sbuf *s, const at_plot_series *p, double x0, double x1, double y0, double y1, const char *color,
                     const char *dash)
{
    if (!p || p->n == 0) return;
    put(s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", color, dash);
    for (int i = 0; i < p->n; i++) {
        if (!isfinite(p->value[i])) continue;
        double x = L + ((double)p->step[i] - x0) / (x1 - x0) * (W - L - R);
        double y = H - B - (p->value[i] - y0) / (y1 - y0) * (H - T - B);
        put(s, "%.1f,%.1f ", x, y);
    }
    put(s, "\"/>\n");
}

at_status at_plot_loss_svg(const char *path, const at_plot_series *loss, const at_plot_series *eval_loss,
                           const at_plot_series *lr)
{
    sbuf s = {0};
    double x0 = INFINITY, x1 = -INFINITY;
    const at_plot_series *all[3] = {loss, eval_loss, lr};
    for (int k = 0; k < 3; k++)
        for (int i = 0; all[k] && i < all[k]->n; i++) {
            if ((double)all[k]->step[i] < x0) x0 = (double)all[k]->step[i];
            if ((double)all[k]->step[i] > x1) x1 = (double)all[k]->step[i];
        }
    if (!isfinite(x0)) x0 = 0, x1 = 1;
    if (x1 <= x0) x1 = x0 + 1;
    double y0 = INFINITY, y1 = -INFINITY;
    range(loss, &y0, &y1);
    range(eval_loss, &y0, &y1);
    if (!isfinite(y0)) y0 = 0, y1 = 1;
    if (y1 <= y0) y1 = y0 + 1;
    double pad = (y1 - y0) * 0.05;
    y0 -= pad;
    y1 += pad;
    double r0 = 0, r1 = -INFINITY;
    range(lr, &r0, &r1);
    if (!(r1 > r0)) r1 = r0 + 1;

    put(&s, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", W, H, W, H);
    put(&s, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    put(&s, "<text x=\"%d\" y=\"22\" font-size=\"15\">training loss</text>\n", L);
    /* axes and grid */
    put(&s, "<g stroke=\"#ccc\" stroke-width=\"1\">\n");
    for (int i = 0; i <= 5; i++) {
        double y = T + (double)i / 5 * (H - T - B);
        put(&s, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", L, y, W - R, y);
    }
    put(&s, "</g>\n<g stroke=\"black\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/></g>\n", L, T, L, H - B, L, H - B, W - R, H - B);
    for (int i = 0; i <= 5; i++) {
        double y = H - B - (double)i / 5 * (H - T - B);
        put(&s, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, y + 4, y0 + (y1 - y0) * i / 5);
        if (lr && lr->n)
            put(&s, "<text x=\"%d\" y=\"%.1f\" fill=\"#2a9d4a\">%.2g</text>\n", W - R + 6, y + 4, r0 + (r1 - r0) * i / 5);
        double x = L + (double)i / 5 * (W - L - R);
        put(&s, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", x, H - B + 18, x0 + (x1 - x0) * i / 5);
    }
    put(&s, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12);
    polyline(&s, loss, x0, x1, y0, y1, "#1f5fbf", "");
    polyline(&s, eval_loss, x0, x1, y0, y1, "#d9480f", " stroke-dasharray=\"6 3\"");
    polyline(&s, lr, x0, x1, r0, r1, "#2a9d4a", " stroke-dasharray=\"2 3\" stroke-opacity=\"0.7\"");
    /* legend */
    put(&s, "<g font-size=\"12\"><text x=\"%d\" y=\"22\" fill=\"#1f5fbf\">&#8212; loss</text>", W - R - 230);
    if (eval_loss && eval_loss->n) put(&s, "<text x=\"%d\" y=\"22\" fill=\"#d9480f\">- - eval_loss</text>", W - R - 160);
    if (lr && lr->n) put(&s, "<text x=\"%d\" y=\"22\" fill=\"#2a9d4a\">&#183;&#183; learning rate</text>", W - R - 75);
    put(&s, "</g>\n</svg>\n");
    if (s.failed) {
        free(s.buf);
        return at_error(AT_ERR_NOMEM, "out of memory drawing %s", path);
    }
    at_status st = at_write_file_atomic(path, s.buf, s.len);
    free(s.buf);
    return st;
}
