/* Images in dataset records, and their tokens.
 *
 * The record forms read (normalize.c calls these):
 *   ms-swift      {"messages": [{"role": "user", "content": "<image>What is it?"}, ...],
 *                  "images": ["a.jpg", "data:image/png;base64,...", {"path": "b.png"}]}
 *   OpenAI        "content": [{"type": "text", "text": "What is it?"},
 *                             {"type": "image_url", "image_url": {"url": "..."}}]
 *                 (also {"type": "image", "image": "..."}, ms-swift's spelling);
 *                 each image part becomes an "<image>" tag in the text
 *   LLaVA /       {"conversations": [{"from": "human", "value": "<image>\n..."}, ...],
 *   ShareGPT-4V    "image": "coco/train2017/000000033471.jpg"}
 * Each "<image>" tag stands for the next image of the record, in order. A
 * record with images and no tag gets them all at the start of its first user
 * message (ms-swift's default); any other mismatch of tags and images is an
 * error of the record. In a record without images the text "<image>" is
 * left as it is (text-only datasets may contain it).
 *
 * A reference is kept as: "data:...;base64,..." (a data URL), raw base64
 * (a string over 200 bytes that is not a data URL: ms-swift's rule), or a
 * path, made relative to the dataset file's folder unless absolute. Network
 * URLs (http://, https://) are refused: nothing is ever fetched.
 *
 * Tokens (Qwen2-VL's template): each tag is rendered as
 * <|vision_start|><|image_pad|><|vision_end|>, and after tokenizing the one
 * <|image_pad|> of image i becomes that image's token count
 * (grid_t * grid_h * grid_w / merge_size^2), never trained on (label -100). */
#ifndef AT_DATA_MEDIA_H
#define AT_DATA_MEDIA_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "data/arena.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/image.h"
#include "data/image_proc.h"

#define AT_IMAGE_TAG "<image>"
#define AT_QWEN2VL_IMAGE_TEXT "<|vision_start|><|image_pad|><|vision_end|>"

/* A growing list of references in an arena. Zero-initialize. */
typedef struct {
    const char **items;
    size_t n, cap;
} at_media_list;

/* Canonical reference of v (a string, or an object with "path", "url",
 * "image" or "bytes" / "base64") appended to list; base_dir may be NULL.
 * where names the field in messages. */
at_status at_media_add_ref(at_arena *a, const char *base_dir, const cJSON *v, const char *where, at_media_list *list);

/* An OpenAI content list -> its text (arena), with "<image>" in place of each
 * image part, whose reference is appended to list. Text parts are joined
 * without separators, as transformers' templates do. */
at_status at_media_content_text(at_arena *a, const char *base_dir, const cJSON *content, const char *where,
                                const char **text, at_media_list *list);

/* The number of "<image>" tags in all messages of m. */
size_t at_media_count_tags(const at_messages *m);

/* The folder of a dataset file (new string, caller frees): "." for a bare name. */
char *at_media_base_dir(const char *dataset_path);

/* Decodes reference ref (as at_media_add_ref keeps them) into *out.
 * Messages name the reference (a path, or "base64 image" for inline data). */
at_status at_media_load_image(const char *ref, uint64_t max_pixels, at_image *out);

/* Standard base64 (RFC 4648, padding optional, whitespace skipped) into a new
 * buffer (*out, caller frees). AT_ERR_FORMAT on another character. */
at_status at_base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_len);

/* A copy of the messages of s in a (the sample itself is left alone) with
 * every "<image>" replaced by replacement (AT_QWEN2VL_IMAGE_TEXT). */
at_status at_media_replace_tags(at_arena *a, const at_messages *m, const char *replacement, at_messages *out);

/* Expands, in order, the n occurrences of pad_id in e into counts[i] copies
 * each, labelled AT_IGNORE_INDEX. AT_ERR_INVALID when e holds another number
 * of them (e.g. a truncation cut an image). */
at_status at_media_expand_pads(at_encoded *e, int32_t pad_id, const size_t *counts, size_t n);

/* The <|image_pad|> tokens of the image at ref under processor p (it is
 * decoded: the count depends on its size after orientation). */
at_status at_media_image_tokens(const at_image_processor *p, const char *ref, uint64_t max_pixels, size_t *tokens);

/* Encodes conversation s with images: its tags rendered as
 * AT_QWEN2VL_IMAGE_TEXT through enc, then the pads (pad_id) expanded to
 * counts (one per image of s). max_length applies after the expansion; a
 * sample over it is dropped (*dropped = 1) whatever the truncation strategy:
 * cutting into an image would leave placeholders without features. */
at_status at_media_encode(const at_encoder *enc, const at_sample *s, int32_t pad_id, const size_t *counts,
                          at_encoded *out, int *dropped);

#endif
