/* Prompts with images for a vision-language model (Qwen2-VL, Qwen2.5-VL):
 * what anytune infer --images and anytune serve (image_url parts) build
 * before generating.
 *
 *   images   each decoded image through the model's processor
 *            (data/image_proc.h): its patches, grid and token count, and a
 *            hash of its pixel values and grid (SHA-256, first 8 bytes);
 *   ids      the chat rendered with each "<image>" tag of the messages as
 *            <|vision_start|><|image_pad|><|vision_end|> (data/media.h, as
 *            training renders it), then each image's one <|image_pad|>
 *            expanded to its token count; a prompt with images and no tag
 *            gets them all at the start of its first user message (ms-swift's
 *            rule);
 *   media    the keys of the prefix caches (text: the id; image token j of an
 *            image with hash h: top bit | mix(h, j)) and the M-RoPE positions
 *            (model/mrope.h), for at_generator_run_media / at_scheduler_add. */
#ifndef AT_INFER_VLM_H
#define AT_INFER_VLM_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/image.h"
#include "infer/bundle.h"
#include "infer/generate.h"

/* The option row (base/options.h) of --max_pixels, for the commands that
 * read images (infer, serve): it overrides the bundle's image_proc.max_pixels. */
#define AT_MAX_PIXELS_OPTION_ROW                                                                                  \
    {.name = "max_pixels", .type = AT_OPT_INT, .def = "0", .range = "[0, 9223372036854775807]",                 \
     .help = "images are resized to at most this many pixels (0: preprocessor_config.json's; ms-swift's "          \
             "MAX_PIXELS)"}

typedef struct at_vlm_images {
    int n;
    float *pixels;          /* [n_patches, patch_dim], all images one after another */
    int64_t n_patches;
    size_t patch_dim;
    int32_t (*grid)[3];     /* [n] (t, h, w) in patches */
    size_t *tokens;         /* [n] <|image_pad|> tokens of each image */
    uint64_t *hash;         /* [n] */
} at_vlm_images;            /* zero-initialize; at_vlm_images_free */

/* Appends img (name: for messages) through b's processor. AT_ERR_UNSUPPORTED
 * when b has no vision tower. */
at_status at_vlm_images_add(const at_bundle *b, const at_image *img, const char *name, at_vlm_images *im);
void at_vlm_images_free(at_vlm_images *im);

/* The prompt's ids: messages (an array of {role, content: string}) with
 * "<image>" tags, one per image of im, in order (none: all at the start of
 * the first user message). *ids: new array (free()). */
at_status at_vlm_encode_chat(const at_bundle *b, const cJSON *messages, const at_vlm_images *im, int32_t **ids,
                             size_t *n);

/* A prompt's media for the generators (arrays owned by *out:
 * at_vlm_media_free). im may have no image: text keys and positions (an
 * M-RoPE model needs its positions either way). */
at_status at_vlm_media(const at_bundle *b, const int32_t *ids, size_t n, const at_vlm_images *im,
                       at_prompt_media *out);
void at_vlm_media_free(at_prompt_media *m);

#endif
