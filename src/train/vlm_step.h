/* One training micro-batch of a vision-language model (Qwen2-VL, Qwen2.5-VL,
 * Qwen3-VL):
 *   features = merger(tower(pixels))                        (model/vision.h)
 *   x_0      = embed[ids], features at the <|image_pad|> tokens (decoder.h),
 *              Qwen3-VL's deepstack features added there after layer l < k
 *   loss     = the decoder's causal-LM loss, with M-RoPE positions
 *   backward: decoder -> d_features -> merger / tower (their trainable parts)
 * and the M-RoPE positions of a batch whose rows may pack several samples:
 * each sample (segment) gets get_rope_index's positions of its own tokens,
 * starting at 0, as it would alone (mrope.h), so packed samples neither see
 * each other (segments) nor share positions. */
#ifndef AT_TRAIN_VLM_STEP_H
#define AT_TRAIN_VLM_STEP_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/image_proc.h"
#include "model/decoder.h"
#include "model/mrope.h"
#include "model/vision.h"

/* Positions of a [rows, cols] batch: ids, segments (NULL: one sample per
 * row) and lengths (real tokens per row; the rest is padding) on the host.
 * grid_thw: the images of the batch in the order of their tokens (row by
 * row). out: host i32 [rows · cols · 3], token-major (t, h, w) as the
 * decoder takes them; padding gets 0. Errors name the row when its images
 * and the grids disagree (mrope.h) or grids are left over. */
at_status at_vlm_batch_positions(const at_mrope_tokens *tk, const int32_t *ids, const int32_t *segments,
                                 const int32_t *lengths, size_t rows, size_t cols, const int32_t (*grid_thw)[3],
                                 size_t n_images, int32_t *out);

/* The images of a micro-batch, in the order of their tokens. */
typedef struct {
    const float *pixels;          /* host [n_patches, patch_dim] (data/image_proc.h, images one after another) */
    int64_t n_patches;
    const int32_t (*grid_thw)[3]; /* [n_images] */
    int n_images;
    int32_t image_token_id;       /* <|image_pad|> */
} at_vlm_images;

/* Forward, loss and (with g) backward of one micro-batch: the tower's
 * features (training mode when some part of v is trainable, at_vision_set_trainable),
 * the decoder's at_decoder_forward_backward_opts with them placed at the
 * image tokens (o's feature fields are set here), then the tower's backward
 * from d_features when a part of it is trainable, adding to its gradients
 * (at_vision_grad). host_ids: the host copy of ids [B·T]. pos: the M-RoPE
 * positions (at_vlm_batch_positions, uploaded). Without images
 * (im->n_images 0) it is the decoder's step alone. */
at_status at_vlm_forward_backward(at_decoder *d, at_vision *v, at_decoder_acts *acts, const int32_t *host_ids,
                                  const at_tensor *ids, const at_tensor *pos, const at_tensor *segments,
                                  const at_tensor *labels, const at_vlm_images *im, const at_fwd_opts *o,
                                  float grad_scale, at_decoder_grads *g, at_loss_stats *stats);

/* Σ −log p of the trained tokens of one conversation s with its images (none
 * is fine), under d and v with no gradients: s encoded by enc with each
 * image's <|image_pad|> count (data/media.h), its images made patches by
 * proc, its M-RoPE positions, then at_vlm_forward_backward. *n_targets may
 * be NULL. The demo's answer ranking and the tests' reference. */
at_status at_vlm_sample_loss(at_decoder *d, at_vision *v, const at_encoder *enc, const at_image_processor *proc,
                             const at_sample *s, double *loss, int64_t *n_targets);

#endif
