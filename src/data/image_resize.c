/* Pillow-equal bicubic resampling (see image_resize.h). */
#include "data/image_resize.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22 /* 32 - 8 bits of result - 2 bits of headroom */

/* Keys' cubic convolution kernel with a = -0.5 (Pillow's BICUBIC), support 2. */
static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* The taps of one side: for output i, input [first[i], first[i] + count[i])
 * with fixed-point weights k[i * ksize ...]. */
typedef struct {
    int ksize;
    int *first, *count;
    int32_t *k;
} taps;

static void taps_free(taps *t) {
    free(t->first);
    free(t->count);
    free(t->k);
    memset(t, 0, sizeof *t);
}

static at_status taps_make(int in, int out, taps *t) {
    memset(t, 0, sizeof *t);
    double scale = (double)in / out, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    t->ksize = (int)ceil(support) * 2 + 1;
    double *w = malloc((size_t)t->ksize * sizeof *w);
    t->first = malloc((size_t)out * sizeof *t->first);
    t->count = malloc((size_t)out * sizeof *t->count);
    t->k = calloc((size_t)out * (size_t)t->ksize, sizeof *t->k);
    if (!w || !t->first || !t->count || !t->k) {
        free(w);
        taps_free(t);
        return at_error(AT_ERR_NOMEM, "out of memory resizing %d -> %d pixels", in, out);
    }
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale, ss = 1.0 / filterscale, sum = 0.0;
        /* (int) truncates toward zero, as Pillow's "round the value" does */
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        int n = hi - lo;
        for (int x = 0; x < n; x++) {
            w[x] = bicubic((x + lo - center + 0.5) * ss);
            sum += w[x];
        }
        for (int x = 0; x < n; x++) {
            double v = sum != 0.0 ? w[x] / sum : w[x];
            t->k[(size_t)i * t->ksize + x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS)
                                                             : 0.5 + v * (1 << PRECISION_BITS));
        }
        t->first[i] = lo;
        t->count[i] = n;
    }
    free(w);
    return AT_OK;
}

static inline uint8_t clip8(int64_t ss) {
    if (ss < 0) return 0;
    ss >>= PRECISION_BITS;
    return ss > 255 ? 255 : (uint8_t)ss;
}

/* dst (w_out x rows) from src rows [row0, row0 + rows) of width w_in. */
static void pass_horizontal(uint8_t *dst, const uint8_t *src, int w_in, int w_out, int row0, int rows,
                            const taps *t) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * w_out > 65536)
    for (int y = 0; y < rows; y++) {
        const uint8_t *s = src + (size_t)(row0 + y) * w_in * 3;
        uint8_t *d = dst + (size_t)y * w_out * 3;
        for (int x = 0; x < w_out; x++) {
            const int32_t *k = t->k + (size_t)x * t->ksize;
            const uint8_t *p = s + (size_t)t->first[x] * 3;
            int64_t a0 = 1 << (PRECISION_BITS - 1), a1 = a0, a2 = a0;
            for (int j = 0; j < t->count[x]; j++) {
                a0 += (int64_t)p[3 * j] * k[j];
                a1 += (int64_t)p[3 * j + 1] * k[j];
                a2 += (int64_t)p[3 * j + 2] * k[j];
            }
            d[3 * x] = clip8(a0);
            d[3 * x + 1] = clip8(a1);
            d[3 * x + 2] = clip8(a2);
        }
    }
}

/* dst (w x h_out) from src (w x ...), output row y reading src rows
 * first[y] - row0 ... */
static void pass_vertical(uint8_t *dst, const uint8_t *src, int w, int h_out, int row0, const taps *t) {
#pragma omp parallel for schedule(static) if ((int64_t)h_out * w > 65536)
    for (int y = 0; y < h_out; y++) {
        const int32_t *k = t->k + (size_t)y * t->ksize;
        const uint8_t *s = src + (size_t)(t->first[y] - row0) * w * 3;
        uint8_t *d = dst + (size_t)y * w * 3;
        for (int x = 0; x < 3 * w; x++) {
            int64_t a = 1 << (PRECISION_BITS - 1);
            for (int j = 0; j < t->count[y]; j++) a += (int64_t)s[(size_t)j * w * 3 + x] * k[j];
            d[x] = clip8(a);
        }
    }
}

at_status at_image_resize_bicubic(const at_image *in, int out_w, int out_h, at_image *out) {
    memset(out, 0, sizeof *out);
    if (!in->rgb || in->width <= 0 || in->height <= 0 || out_w <= 0 || out_h <= 0)
        return at_error(AT_ERR_INVALID, "resize of a %dx%d image to %dx%d", in->width, in->height, out_w, out_h);
    size_t n_out = (size_t)out_w * (size_t)out_h * 3;
    out->rgb = malloc(n_out);
    if (!out->rgb) return at_error(AT_ERR_NOMEM, "out of memory resizing to %dx%d", out_w, out_h);
    out->width = out_w;
    out->height = out_h;
    if (out_w == in->width && out_h == in->height) {
        memcpy(out->rgb, in->rgb, n_out);
        return AT_OK;
    }
    taps tv = {0}, th = {0};
    uint8_t *tmp = NULL;
    at_status st = taps_make(in->height, out_h, &tv);
    if (st != AT_OK) goto done;
    /* the rows of the source the vertical pass reads */
    int row0 = tv.first[0], row1 = tv.first[out_h - 1] + tv.count[out_h - 1];
    const uint8_t *src = in->rgb;
    int src_w = in->width;
    if (out_w != in->width) {
        AT_CHECK(taps_make(in->width, out_w, &th));
        tmp = malloc((size_t)out_w * (size_t)(row1 - row0) * 3);
        if (!tmp) {
            st = at_error(AT_ERR_NOMEM, "out of memory resizing to %dx%d", out_w, out_h);
            goto done;
        }
        pass_horizontal(tmp, in->rgb, in->width, out_w, row0, row1 - row0, &th);
        src = tmp;
        src_w = out_w;
    } else {
        row0 = 0; /* the vertical pass reads the source itself */
    }
    if (out_h != in->height) pass_vertical(out->rgb, src, src_w, out_h, row0, &tv);
    else memcpy(out->rgb, src, n_out); /* the intermediate holds every row */
done:
    free(tmp);
    taps_free(&tv);
    taps_free(&th);
    if (st != AT_OK) at_image_free(out);
    return st;
}
