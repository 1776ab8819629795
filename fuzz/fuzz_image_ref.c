/* Fuzz target: an image reference of a chat request (serve/image_ref.h) as
 * the server resolves and decodes it: data: URLs (base64, then the image
 * decoders), http(s) refusals, file:// URLs and paths checked against an
 * allowed folder (tests/data/images, so that a path may resolve to a real
 * image there), raw base64. The first byte picks the pixel limit. Must not
 * crash or leak, whatever the bytes; a refusal is an error with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "serve/image_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char *ref = malloc(size);
    if (!ref) return 0;
    memcpy(ref, data + 1, size - 1);
    ref[size - 1] = '\0';
    at_image img;
    uint64_t max_pixels = (uint64_t)(data[0] & 15) * 4096 + 64;
    if (at_serve_image_load(ref, "tests/data/images", max_pixels, &img) == AT_OK) at_image_free(&img);
    else if (!at_last_error()[0]) abort(); /* a refusal always says why */
    free(ref);
    return 0;
}
