/* Images: JPEG, PNG and WebP files decoded to 8-bit RGB, as a vision model's
 * processor receives them.
 *
 * The decoders are the system's libjpeg-turbo, libpng and libwebp; this
 * module only drives them and turns every kind of pixel layout into RGB the
 * way ms-swift's load_image does it with Pillow (Image.open, then
 * convert("RGB")):
 *   - grayscale is replicated into the three channels; 1/2/4-bit grays are
 *     scaled to 0..255 (0, 85, 170, 255 for 2 bits) and palettes looked up;
 *   - an alpha channel is dropped (convert("RGB") keeps the colour under it);
 *   - 16-bit samples keep their high byte (Pillow's "RGB;16B"; for 16-bit
 *     grayscale Pillow clips instead, which turns such images white: we keep
 *     the high byte there too, on purpose);
 *   - Adobe CMYK / YCCK JPEGs: the stored (inverted) inks are read as Pillow's
 *     "CMYK;I" and converted with Pillow's cmyk2rgb, R = (255-C)(255-K)/255
 *     rounded as its MULDIV255 does;
 *   - the EXIF orientation (JPEG APP1, PNG eXIf, WebP EXIF chunk) is applied,
 *     as Pillow's ImageOps.exif_transpose does.
 *
 * Untrusted input: the width and height from the header are checked against
 * a pixel limit before any pixel memory is allocated (a small file can claim
 * a huge picture: a decompression bomb); progressive JPEGs with more than
 * AT_IMAGE_MAX_JPEG_SCANS scans are refused (each scan re-walks the whole
 * picture, so a few kilobytes could keep the decoder busy for minutes);
 * truncated files are errors, not grey bottoms (as Pillow, which raises
 * "image file is truncated"). Every error names the file. */
#ifndef AT_DATA_IMAGE_H
#define AT_DATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

/* Pillow's refusal point: 2 x Image.MAX_IMAGE_PIXELS (89478485), above which
 * it raises DecompressionBombError. */
#define AT_IMAGE_MAX_PIXELS_DEFAULT 178956970u
/* libjpeg-turbo's own limit when asked to limit scans (TJFLAG_LIMITSCANS). */
#define AT_IMAGE_MAX_JPEG_SCANS 500

typedef struct {
    int width, height;
    uint8_t *rgb; /* height rows of width RGB triples, malloc'd (at_image_free) */
} at_image;

typedef enum { AT_IMAGE_UNKNOWN = 0, AT_IMAGE_JPEG, AT_IMAGE_PNG, AT_IMAGE_WEBP } at_image_type;

/* The type from the first bytes (magic numbers), AT_IMAGE_UNKNOWN when none
 * of the three. */
at_image_type at_image_sniff(const void *data, size_t len);

/* Decodes data[0..len) into *out (RGB, orientation applied). name is used in
 * messages only (a path, or e.g. "image 2 of sample 7"). max_pixels: 0 means
 * AT_IMAGE_MAX_PIXELS_DEFAULT. Errors: AT_ERR_FORMAT (not an image, corrupt,
 * truncated), AT_ERR_UNSUPPORTED (GIF, BMP, TIFF..., animated WebP),
 * AT_ERR_INVALID (over the pixel limit), AT_ERR_NOMEM; *out is then empty. */
at_status at_image_decode(const void *data, size_t len, const char *name, uint64_t max_pixels, at_image *out);

/* Reads the file at path and decodes it (as above, messages name path). */
at_status at_image_load(const char *path, uint64_t max_pixels, at_image *out);

/* The orientation (1..8) in an EXIF block: a TIFF header and IFD0, with or
 * without the "Exif\0\0" prefix of JPEG's APP1; 1 when absent or unreadable. */
int at_exif_orientation(const uint8_t *exif, size_t len);

/* Applies EXIF orientation o (1..8; others leave it alone) in place, as
 * Pillow's exif_transpose (2 mirror, 3 rotate 180, 4 flip, 5 transpose,
 * 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise). */
at_status at_image_orient(at_image *img, int o);

void at_image_free(at_image *img); /* safe on a zeroed struct */

#endif
