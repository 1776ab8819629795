/* Multimodal RoPE positions (Qwen2-VL, Qwen2.5-VL): each token gets three
 * position ids (temporal, height, width), as transformers' get_rope_index
 * computes them for one sequence without padding:
 *   - text tokens: all three equal, counting on from the previous chunk's
 *     largest position + 1;
 *   - the image tokens of one image (grid t x h x w patches, merged m x m
 *     into t * (h/m) * (w/m) tokens, row-major): (ti, hi, wi) + the text
 *     before them's start, i.e. st + text_len + (ti, hi, wi);
 *   - the text after the last image continues from the largest position + 1.
 * An image is the run of image tokens that follows a <|vision_start|>. The
 * rope delta (used when generating past the prompt) is max position + 1 - n.
 * Each head_dim / 2 frequency pair takes its angle from one of the three ids:
 * the first mrope_section[0] pairs the temporal id, the next [1] the height
 * id, the last [2] the width id. */
#ifndef AT_MODEL_MROPE_H
#define AT_MODEL_MROPE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct {
    int32_t image_token_id;       /* <|image_pad|> */
    int32_t video_token_id;       /* <|video_pad|>: refused for now */
    int32_t vision_start_token_id;
    int spatial_merge_size;
} at_mrope_tokens;

/* pos[0..n) temporal, pos[n..2n) height, pos[2n..3n) width ids of ids[0..n);
 * grid_thw: n_images rows of (t, h, w) patches (image_grid_thw), used in
 * order. *delta may be NULL. Errors (AT_ERR_INVALID) when the images in ids
 * and the grids disagree: a count, a run shorter than its grid's tokens, a
 * grid not divisible by the merge size. */
at_status at_mrope_position_ids(const at_mrope_tokens *tk, const int32_t *ids, size_t n, const int32_t (*grid_thw)[3],
                                size_t n_images, int32_t *pos, int64_t *delta);

#endif
