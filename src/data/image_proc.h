/* The Qwen2-VL / Qwen2.5-VL image processor: an RGB image -> the flattened
 * patches the vision tower embeds, and its grid, as transformers'
 * Qwen2VLImageProcessor computes them (the pixel values are equal to its
 * within float32 rounding; tools/make_image_goldens.py checks it).
 *
 *   1. smart_resize: both sides a multiple of factor = patch_size *
 *      merge_size (28), the area within [min_pixels, max_pixels], the aspect
 *      ratio kept as well as that allows (see at_smart_resize);
 *   2. resize with Pillow's bicubic filter (data/image_resize.h);
 *   3. rescale and normalize per channel, in float32 as numpy does it:
 *      v = (float(x * rescale_factor) - mean[c]) / std[c];
 *   4. the frame repeated temporal_patch_size (2) times, cut into patches of
 *      temporal_patch_size x patch_size x patch_size per channel; patches in
 *      the order of the 2x2 merge (the merger concatenates four neighbours):
 *        row  = ((t * gh/m + bh) * gw/m + bw) * m*m + mh * m + mw
 *        col  = (c * T + tt) * P*P + ph * P + pw
 *        value = frame[c][(bh*m + mh)*P + ph][(bw*m + mw)*P + pw]
 *      (transformers: reshape to (gt, T, C, gh/m, m, P, gw/m, m, P), permute
 *      (0, 3, 6, 4, 7, 2, 1, 5, 8), flatten), gt = 1, gh = height / P,
 *      gw = width / P. The language model sees gt*gh*gw / m^2 image tokens. */
#ifndef AT_DATA_IMAGE_PROC_H
#define AT_DATA_IMAGE_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/image.h"

typedef struct {
    int patch_size;          /* P: 14 */
    int temporal_patch_size; /* T: 2 */
    int merge_size;          /* m: 2 */
    uint64_t min_pixels;     /* 56 * 56 */
    uint64_t max_pixels;     /* 28 * 28 * 1280 (Qwen2-VL's folders say 12845056) */
    double rescale_factor;   /* 1 / 255 */
    float image_mean[3];     /* OpenAI CLIP's */
    float image_std[3];
    int do_resize, do_rescale, do_normalize;
} at_image_processor;

/* Qwen2VLImageProcessor's defaults (its __init__). */
void at_image_processor_default(at_image_processor *p);

/* Overrides the defaults in *p with the keys of a preprocessor_config.json
 * object (min_pixels / max_pixels, or size.shortest_edge / longest_edge as
 * newer files write them; patch_size, temporal_patch_size, merge_size,
 * rescale_factor, image_mean, image_std, do_resize, do_rescale,
 * do_normalize). A resample other than 3 (bicubic) is refused. what names
 * the file in messages. */
at_status at_image_processor_from_json(const cJSON *cfg, const char *what, at_image_processor *p);

/* Defaults, then dir/preprocessor_config.json when the folder has one
 * (*found = 1); found may be NULL. */
at_status at_image_processor_load(const char *dir, at_image_processor *p, int *found);

/* The resized height and width (qwen_vl_utils' and transformers' current
 * smart_resize):
 *   refuse max(h, w) / min(h, w) > 200;
 *   h' = max(f, round(h / f) * f), w' likewise (round half to even, Python's);
 *   if h' w' > max_pixels: b = sqrt(h w / max_pixels),
 *       h' = max(f, floor(h / b / f) * f), w' likewise;
 *   else if h' w' < min_pixels: b = sqrt(min_pixels / (h w)),
 *       h' = ceil(h b / f) * f, w' likewise. */
at_status at_smart_resize(int height, int width, int factor, uint64_t min_pixels, uint64_t max_pixels,
                          int *out_height, int *out_width);

typedef struct {
    float *values;    /* n_patches x patch_dim, malloc'd (at_image_patches_free) */
    size_t n_patches; /* grid_t * grid_h * grid_w */
    size_t patch_dim; /* 3 * T * P * P (1176) */
    int grid_t, grid_h, grid_w; /* image_grid_thw */
} at_image_patches;

/* Steps 1-4 for one image. name is used in messages. */
at_status at_image_to_patches(const at_image_processor *p, const at_image *img, const char *name,
                              at_image_patches *out);

/* grid_t * grid_h * grid_w / merge_size^2: the <|image_pad|> tokens. */
size_t at_image_patches_tokens(const at_image_patches *pp, int merge_size);

void at_image_patches_free(at_image_patches *pp);

#endif
