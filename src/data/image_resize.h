/* Resampling an RGB image the way Pillow's Image.resize(size, BICUBIC) does,
 * so the pixels a vision model sees equal those of the Python pipeline
 * (transformers' image processors resize through Pillow).
 *
 * Pillow's algorithm (libImaging/Resample.c), reimplemented here:
 *   - separable: a horizontal pass into an 8-bit intermediate holding only the
 *     source rows the vertical pass will read, then a vertical pass; a pass
 *     whose size does not change is skipped;
 *   - output pixel i of a side of length in -> out samples the input around
 *     center = (i + 0.5) * scale, scale = in / out, with the bicubic kernel
 *     (a = -0.5, support 2) stretched by max(scale, 1) when downscaling (so
 *     every input pixel contributes: antialiasing), taps
 *     [int(center - support + 0.5), int(center + support + 0.5)) clipped to
 *     the image, weights normalized to sum 1;
 *   - the weights in fixed point with 22 fraction bits (rounded half away
 *     from zero), each output value (2^21 + sum of pixel * weight) >> 22
 *     clipped to 0..255.
 * The integer arithmetic makes the result exact: equal, byte for byte, to
 * Pillow's on every machine. */
#ifndef AT_DATA_IMAGE_RESIZE_H
#define AT_DATA_IMAGE_RESIZE_H

#include "base/status.h"
#include "data/image.h"

/* *out (new buffer, at_image_free) = in resized to out_w x out_h. */
at_status at_image_resize_bicubic(const at_image *in, int out_w, int out_h, at_image *out);

#endif
