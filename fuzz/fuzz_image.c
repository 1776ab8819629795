/* Fuzz target: image decoding (JPEG, PNG, WebP through the system libraries,
 * EXIF orientation) on arbitrary bytes, then the Qwen2-VL processor (resize,
 * patches) on whatever decoded. Must not crash, leak or hang. The pixel limit
 * is lowered so one input stays fast (the limit itself is what stops a
 * decompression bomb). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "data/image.h"
#include "data/image_proc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy, so that reads past `size` are caught by ASan */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    (void)at_exif_orientation(buf, size);
    at_image img;
    if (at_image_decode(buf, size, "fuzz", 1u << 20, &img) == AT_OK) {
        at_image_processor p;
        at_image_processor_default(&p);
        p.min_pixels = 28 * 28;
        p.max_pixels = 28 * 28 * 16;
        at_image_patches pp;
        if (at_image_to_patches(&p, &img, "fuzz", &pp) == AT_OK) at_image_patches_free(&pp);
        at_image_free(&img);
    }
    free(buf);
    return 0;
}
