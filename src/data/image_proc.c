/* The Qwen2-VL image processor (see image_proc.h). */
#include "data/image_proc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "data/image_resize.h"

void at_image_processor_default(at_image_processor *p) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    static const float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    memset(p, 0, sizeof *p);
    p->patch_size = 14;
    p->temporal_patch_size = 2;
    p->merge_size = 2;
    p->min_pixels = 56 * 56;
    p->max_pixels = 28 * 28 * 1280;
    p->rescale_factor = 1.0 / 255.0;
    memcpy(p->image_mean, mean, sizeof mean);
    memcpy(p->image_std, std, sizeof std);
    p->do_resize = p->do_rescale = p->do_normalize = 1;
}

/* An optional positive integer key into *out (at most max). */
static at_status get_pos(const cJSON *o, const char *key, const char *what, long long max, long long *out) {
    long long v;
    at_status st = at_json_get_int(o, key, what, &v);
    if (st == AT_ERR_NOT_FOUND) return AT_OK;
    if (st != AT_OK) return st;
    if (v <= 0 || v > max) return at_error(AT_ERR_FORMAT, "%s: %s = %lld is out of range (1..%lld)", what, key, v, max);
    *out = v;
    return AT_OK;
}

static at_status get_rgb(const cJSON *o, const char *key, const char *what, int positive, float out[3]) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!a) return AT_OK;
    if (cJSON_IsNumber(a)) { /* one value for every channel, as transformers accepts */
        out[0] = out[1] = out[2] = (float)a->valuedouble;
    } else if (cJSON_IsArray(a) && cJSON_GetArraySize(a) == 3) {
        for (int c = 0; c < 3; c++) {
            const cJSON *v = cJSON_GetArrayItem(a, c);
            if (!cJSON_IsNumber(v)) return at_error(AT_ERR_FORMAT, "%s: %s[%d] is not a number", what, key, c);
            out[c] = (float)v->valuedouble;
        }
    } else {
        return at_error(AT_ERR_FORMAT, "%s: %s must be a number or a list of 3 numbers", what, key);
    }
    for (int c = 0; c < 3; c++)
        if (!isfinite(out[c]) || (positive && !(out[c] > 0)))
            return at_error(AT_ERR_FORMAT, "%s: %s[%d] = %g is not %s", what, key, c, out[c],
                            positive ? "a positive number" : "finite");
    return AT_OK;
}

static at_status get_flag(const cJSON *o, const char *key, const char *what, int *out) {
    at_status st = at_json_get_bool(o, key, what, out);
    return st == AT_ERR_NOT_FOUND ? AT_OK : st;
}

at_status at_image_processor_from_json(const cJSON *cfg, const char *what, at_image_processor *p) {
    if (!cJSON_IsObject(cfg)) return at_error(AT_ERR_FORMAT, "%s: not a JSON object", what);
    long long v;
    const long long max_px = 1LL << 40;
    v = p->patch_size;
    AT_TRY(get_pos(cfg, "patch_size", what, 1024, &v));
    p->patch_size = (int)v;
    v = p->temporal_patch_size;
    AT_TRY(get_pos(cfg, "temporal_patch_size", what, 16, &v));
    p->temporal_patch_size = (int)v;
    v = p->merge_size;
    AT_TRY(get_pos(cfg, "merge_size", what, 16, &v));
    p->merge_size = (int)v;
    /* newer files keep the pixel bounds in size {shortest_edge, longest_edge} */
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(cfg, "size");
    v = (long long)p->min_pixels;
    if (cJSON_IsObject(size)) AT_TRY(get_pos(size, "shortest_edge", what, max_px, &v));
    AT_TRY(get_pos(cfg, "min_pixels", what, max_px, &v));
    p->min_pixels = (uint64_t)v;
    v = (long long)p->max_pixels;
    if (cJSON_IsObject(size)) AT_TRY(get_pos(size, "longest_edge", what, max_px, &v));
    AT_TRY(get_pos(cfg, "max_pixels", what, max_px, &v));
    p->max_pixels = (uint64_t)v;
    if (p->min_pixels > p->max_pixels)
        return at_error(AT_ERR_FORMAT, "%s: min_pixels %llu is above max_pixels %llu", what,
                        (unsigned long long)p->min_pixels, (unsigned long long)p->max_pixels);
    double r;
    at_status st = at_json_get_double(cfg, "rescale_factor", what, &r);
    if (st == AT_OK) {
        if (!(r > 0) || !isfinite(r)) return at_error(AT_ERR_FORMAT, "%s: rescale_factor %g is not positive", what, r);
        p->rescale_factor = r;
    } else if (st != AT_ERR_NOT_FOUND) {
        return st;
    }
    AT_TRY(get_rgb(cfg, "image_mean", what, 0, p->image_mean));
    AT_TRY(get_rgb(cfg, "image_std", what, 1, p->image_std));
    AT_TRY(get_flag(cfg, "do_resize", what, &p->do_resize));
    AT_TRY(get_flag(cfg, "do_rescale", what, &p->do_rescale));
    AT_TRY(get_flag(cfg, "do_normalize", what, &p->do_normalize));
    v = 3;
    AT_TRY(get_pos(cfg, "resample", what, 16, &v));
    if (v != 3) return at_error(AT_ERR_UNSUPPORTED, "%s: resample %lld is not supported (3, bicubic, is)", what, v);
    return AT_OK;
}

at_status at_image_processor_load(const char *dir, at_image_processor *p, int *found) {
    at_image_processor_default(p);
    if (found) *found = 0;
    char *path = at_path_join(dir, "preprocessor_config.json");
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    if (at_file_exists(path)) {
        cJSON *cfg = NULL;
        st = at_json_parse_file(path, &cfg);
        if (st == AT_OK) st = at_image_processor_from_json(cfg, path, p);
        cJSON_Delete(cfg);
        if (st == AT_OK && found) *found = 1;
    }
    free(path);
    return st;
}

at_status at_smart_resize(int height, int width, int factor, uint64_t min_pixels, uint64_t max_pixels,
                          int *out_height, int *out_width) {
    if (height <= 0 || width <= 0 || factor <= 0)
        return at_error(AT_ERR_INVALID, "smart_resize of a %dx%d image (factor %d)", width, height, factor);
    double h = height, w = width, f = factor;
    if ((h > w ? h / w : w / h) > 200)
        return at_error(AT_ERR_INVALID, "image of %dx%d: the aspect ratio must be at most 200", width, height);
    /* nearbyint rounds half to even in the default rounding mode, as Python's round */
    double hb = fmax(f, nearbyint(h / f) * f), wb = fmax(f, nearbyint(w / f) * f);
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt(h * w / (double)max_pixels);
        hb = fmax(f, floor(h / beta / f) * f);
        wb = fmax(f, floor(w / beta / f) * f);
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (h * w));
        hb = ceil(h * beta / f) * f;
        wb = ceil(w * beta / f) * f;
    }
    if (hb > 1 << 30 || wb > 1 << 30)
        return at_error(AT_ERR_INVALID, "image of %dx%d resizes to more than 2^30 pixels a side", width, height);
    *out_height = (int)hb;
    *out_width = (int)wb;
    return AT_OK;
}

void at_image_patches_free(at_image_patches *pp) {
    if (!pp) return;
    free(pp->values);
    memset(pp, 0, sizeof *pp);
}

size_t at_image_patches_tokens(const at_image_patches *pp, int merge_size) {
    return pp->n_patches / ((size_t)merge_size * (size_t)merge_size);
}

at_status at_image_to_patches(const at_image_processor *p, const at_image *img, const char *name,
                              at_image_patches *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "image";
    const int P = p->patch_size, T = p->temporal_patch_size, m = p->merge_size, f = P * m;
    at_image resized = {0};
    const at_image *src = img;
    at_status st = AT_OK;
    if (p->do_resize) {
        int rh, rw;
        st = at_smart_resize(img->height, img->width, f, p->min_pixels, p->max_pixels, &rh, &rw);
        if (st != AT_OK) return at_error_wrap(st, "%s", name);
        if (rh != img->height || rw != img->width) {
            AT_TRY(at_image_resize_bicubic(img, rw, rh, &resized));
            src = &resized;
        }
    } else if (img->height % f || img->width % f) {
        return at_error(AT_ERR_INVALID, "%s: %dx%d is not a multiple of %d and do_resize is off", name, img->width,
                        img->height, f);
    }
    /* each channel's 256 values, computed once in the processor's float32 steps */
    float lut[3][256];
    for (int c = 0; c < 3; c++) {
        for (int x = 0; x < 256; x++) {
            float v = p->do_rescale ? (float)(x * p->rescale_factor) : (float)x;
            lut[c][x] = p->do_normalize ? (v - p->image_mean[c]) / p->image_std[c] : v;
        }
    }
    const int gh = src->height / P, gw = src->width / P, W = src->width;
    out->grid_t = 1;
    out->grid_h = gh;
    out->grid_w = gw;
    out->n_patches = (size_t)gh * gw;
    out->patch_dim = (size_t)3 * T * P * P;
    out->values = malloc(out->n_patches * out->patch_dim * sizeof(float));
    if (!out->values) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory for %zu patches", name, out->n_patches);
        goto done;
    }
    size_t row = 0;
    for (int bh = 0; bh < gh / m; bh++) {
        for (int bw = 0; bw < gw / m; bw++) {
            for (int mh = 0; mh < m; mh++) {
                for (int mw = 0; mw < m; mw++, row++) {
                    float *d = out->values + row * out->patch_dim;
                    int y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
                    for (int c = 0; c < 3; c++) {
                        for (int tt = 0; tt < T; tt++) { /* one frame, repeated T times */
                            for (int ph = 0; ph < P; ph++) {
                                const uint8_t *s = src->rgb + ((size_t)(y0 + ph) * W + x0) * 3 + c;
                                for (int pw = 0; pw < P; pw++) *d++ = lut[c][s[3 * pw]];
                            }
                        }
                    }
                }
            }
        }
    }
done:
    if (st != AT_OK) at_image_patches_free(out);
    at_image_free(&resized);
    return st;
}
