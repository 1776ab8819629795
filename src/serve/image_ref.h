/* The image references of a request (serve/request.h keeps them as given),
 * turned into pixels under the server's rules:
 *   - "data:image/...;base64,..." URLs are decoded (data/media.h);
 *   - http:// and https:// are refused: the server never fetches anything;
 *   - local files ("file:///abs/path", "/abs/path", or a path relative to
 *     the folder) only when the server was started with
 *     --allowed_local_media_path DIR (vLLM's option), and only when the
 *     file's real path (symbolic links and ".." resolved) lies inside DIR's;
 *   - any other string over 200 bytes is raw base64 (ms-swift's rule).
 * Every refusal and every decoding failure (bad base64, a corrupt or
 * truncated image, more pixels than max_pixels) is an error whose message
 * says what is wrong: the server answers it with a 400. */
#ifndef AT_SERVE_IMAGE_REF_H
#define AT_SERVE_IMAGE_REF_H

#include <stdint.h>
#include "base/status.h"
#include "data/image.h"

/* Decodes reference ref into *out (at_image_free). allowed_dir: NULL or ""
 * refuses local files. max_pixels: the decoder's limit (0: its default). */
at_status at_serve_image_load(const char *ref, const char *allowed_dir, uint64_t max_pixels, at_image *out);

#endif
