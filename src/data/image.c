/* Images: JPEG / PNG / WebP through the system libraries (see image.h). */
#include "data/image.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h> /* JWRN_JPEG_EOF */
#include <png.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include "base/file.h"

void at_image_free(at_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

at_image_type at_image_sniff(const void *data, size_t len) {
    const uint8_t *p = data;
    if (len >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return AT_IMAGE_JPEG;
    if (len >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return AT_IMAGE_PNG;
    if (len >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) return AT_IMAGE_WEBP;
    return AT_IMAGE_UNKNOWN;
}

/* Names of the image types we do not read, for a clearer refusal. */
static const char *other_image_type(const uint8_t *p, size_t len) {
    if (len >= 4 && !memcmp(p, "GIF8", 4)) return "GIF";
    if (len >= 2 && p[0] == 'B' && p[1] == 'M') return "BMP";
    if (len >= 4 && (!memcmp(p, "II*\0", 4) || !memcmp(p, "MM\0*", 4))) return "TIFF";
    if (len >= 12 && !memcmp(p + 4, "ftyp", 4)) return "HEIF/AVIF";
    if (len >= 4 && !memcmp(p, "\0\0\1\0", 4)) return "ICO";
    return NULL;
}

/* Width x height against the limit, and the RGB buffer for them: the one
 * place pixel memory is sized, so every decoder checks before allocating. */
static at_status alloc_pixels(at_image *out, uint64_t w, uint64_t h, uint64_t max_pixels, const char *name) {
    if (w == 0 || h == 0) return at_error(AT_ERR_FORMAT, "%s: image has no pixels (%llux%llu)", name,
                                          (unsigned long long)w, (unsigned long long)h);
    if (w > INT_MAX || h > INT_MAX || w * h > max_pixels)
        return at_error(AT_ERR_INVALID,
                        "%s: image of %llux%llu pixels is over the limit of %llu pixels (a decompression bomb?)", name,
                        (unsigned long long)w, (unsigned long long)h, (unsigned long long)max_pixels);
    out->rgb = malloc((size_t)(w * h * 3));
    if (!out->rgb) return at_error(AT_ERR_NOMEM, "%s: out of memory for %llux%llu pixels", name,
                                   (unsigned long long)w, (unsigned long long)h);
    out->width = (int)w;
    out->height = (int)h;
    return AT_OK;
}

/* ---- EXIF ---------------------------------------------------------------- */

int at_exif_orientation(const uint8_t *p, size_t n) {
    if (n >= 6 && !memcmp(p, "Exif\0\0", 6)) {
        p += 6;
        n -= 6;
    }
    if (n < 8) return 1;
    int le;
    if (p[0] == 'I' && p[1] == 'I') le = 1;
    else if (p[0] == 'M' && p[1] == 'M') le = 0;
    else return 1;
#define RD16(o) (le ? (uint32_t)p[o] | (uint32_t)p[(o) + 1] << 8 : (uint32_t)p[o] << 8 | (uint32_t)p[(o) + 1])
#define RD32(o) (le ? RD16(o) | RD16((o) + 2) << 16 : RD16(o) << 16 | RD16((o) + 2))
    if (RD16(2) != 42) return 1;
    uint32_t ifd = RD32(4);
    if (ifd > n || n - ifd < 2) return 1;
    uint32_t count = RD16(ifd);
    for (uint32_t i = 0; i < count; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e + 12 > n) break;
        if (RD16(e) != 0x0112) continue;
        uint32_t type = RD16(e + 2), v;
        if (type == 3) v = RD16(e + 8);       /* SHORT, the standard's type */
        else if (type == 4) v = RD32(e + 8);  /* LONG, written by some tools */
        else return 1;
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
#undef RD32
#undef RD16
}

at_status at_image_orient(at_image *img, int o) {
    if (o < 2 || o > 8 || !img->rgb) return AT_OK;
    int w = img->width, h = img->height;
    int swap = o >= 5; /* transpose, rotations by 90 and transverse swap the sides */
    int ow = swap ? h : w, oh = swap ? w : h;
    uint8_t *dst = malloc((size_t)w * (size_t)h * 3);
    if (!dst) return at_error(AT_ERR_NOMEM, "out of memory orienting a %dx%d image", w, h);
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sx, sy; /* the source pixel of output (x, y) */
            switch (o) {
            case 2: sx = w - 1 - x; sy = y; break;
            case 3: sx = w - 1 - x; sy = h - 1 - y; break;
            case 4: sx = x; sy = h - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = h - 1 - x; break;
            case 7: sx = w - 1 - y; sy = h - 1 - x; break;
            default: sx = w - 1 - y; sy = x; break; /* 8 */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, img->rgb + ((size_t)sy * w + sx) * 3, 3);
        }
    }
    free(img->rgb);
    img->rgb = dst;
    img->width = ow;
    img->height = oh;
    return AT_OK;
}

/* ---- JPEG ---------------------------------------------------------------- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int truncated;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_fail(j_common_ptr c) {
    jpeg_err *e = (jpeg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jump, 1);
}

/* Warnings: libjpeg goes on past most damage (as Pillow does), but running
 * out of data is a truncated file, which Pillow refuses. */
static void jpeg_warn(j_common_ptr c, int level) {
    jpeg_err *e = (jpeg_err *)c->err;
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) e->truncated = 1;
}

static void jpeg_progress(j_common_ptr c) {
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > AT_IMAGE_MAX_JPEG_SCANS) {
        jpeg_err *e = (jpeg_err *)c->err;
        snprintf(e->msg, sizeof e->msg, "progressive JPEG with more than %d scans", AT_IMAGE_MAX_JPEG_SCANS);
        longjmp(e->jump, 1);
    }
}

/* Pillow's MULDIV255: a * b / 255 rounded, in integers. */
static inline int muldiv255(int a, int b) {
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

/* Each decoder fills *out and says the EXIF orientation (1 when none);
 * at_image_decode applies it. */
static at_status decode_jpeg(const uint8_t *data, size_t len, const char *name, uint64_t max_pixels, at_image *out,
                             int *orientation_out) {
    struct jpeg_decompress_struct ci;
    struct jpeg_progress_mgr prog;
    jpeg_err je;
    /* changed between setjmp and a longjmp back, hence volatile */
    uint8_t *volatile row = NULL;
    volatile int orientation = 1;
    at_status st = AT_OK;
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_fail;
    je.pub.emit_message = jpeg_warn;
    if (setjmp(je.jump)) {
        at_image_free(out);
        st = at_error(AT_ERR_FORMAT, "%s: corrupt JPEG: %s", name, je.msg);
        goto done;
    }
    jpeg_create_decompress(&ci);
    memset(&prog, 0, sizeof prog);
    prog.progress_monitor = jpeg_progress;
    ci.progress = &prog;
    jpeg_mem_src(&ci, data, (unsigned long)len);
    jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&ci, TRUE);
    for (jpeg_saved_marker_ptr m = ci.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && !memcmp(m->data, "Exif\0\0", 6)) {
            orientation = at_exif_orientation(m->data, m->data_length);
            break; /* Pillow keeps the first Exif block */
        }
    }
    int cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    int gray = ci.jpeg_color_space == JCS_GRAYSCALE;
    ci.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
    if (ci.num_components != (cmyk ? 4 : gray ? 1 : 3)) {
        st = at_error(AT_ERR_UNSUPPORTED, "%s: JPEG with %d colour components is not supported", name,
                      ci.num_components);
        goto done;
    }
    st = alloc_pixels(out, ci.image_width, ci.image_height, max_pixels, name);
    if (st != AT_OK) goto done;
    jpeg_start_decompress(&ci);
    int nc = ci.output_components;
    row = malloc((size_t)ci.output_width * (size_t)nc);
    if (!row) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    /* Photoshop (and Pillow, which assumes it) store Adobe CMYK inverted */
    int inverted = ci.saw_Adobe_marker;
    while (ci.output_scanline < ci.output_height && !je.truncated) {
        JSAMPROW r = row;
        uint8_t *dst = out->rgb + (size_t)ci.output_scanline * (size_t)out->width * 3;
        if (jpeg_read_scanlines(&ci, &r, 1) != 1) break;
        for (int x = 0; x < out->width; x++) {
            const uint8_t *s = row + (size_t)x * nc;
            if (nc == 1) {
                dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = s[0];
            } else if (nc == 3) {
                memcpy(dst + 3 * x, s, 3);
            } else {
                int k = inverted ? 255 - s[3] : s[3], nk = 255 - k;
                for (int c = 0; c < 3; c++) dst[3 * x + c] = (uint8_t)(nk - muldiv255(inverted ? 255 - s[c] : s[c], nk));
            }
        }
    }
    if (je.truncated || ci.output_scanline < ci.output_height) {
        st = at_error(AT_ERR_FORMAT, "%s: truncated JPEG (%u of %u rows)", name, ci.output_scanline, ci.output_height);
        goto fail;
    }
    jpeg_finish_decompress(&ci);
    if (je.truncated) {
        st = at_error(AT_ERR_FORMAT, "%s: truncated JPEG", name);
        goto fail;
    }
    *orientation_out = orientation;
    goto done;
fail:
    at_image_free(out);
done:
    free(row);
    jpeg_destroy_decompress(&ci);
    return st;
}

/* ---- PNG ----------------------------------------------------------------- */

typedef struct {
    const uint8_t *data;
    size_t len, pos;
    char msg[200];
} png_src;

static void png_read_mem(png_structp p, png_bytep buf, size_t n) {
    png_src *s = png_get_io_ptr(p);
    if (n > s->len - s->pos) png_error(p, "unexpected end of file (truncated)");
    memcpy(buf, s->data + s->pos, n);
    s->pos += n;
}

static void png_fail(png_structp p, png_const_charp msg) {
    png_src *s = png_get_error_ptr(p);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(p, 1);
}

static void png_warn(png_structp p, png_const_charp msg) {
    (void)p;
    (void)msg; /* damaged ancillary chunks: skipped, as Pillow does */
}

static at_status decode_png(const uint8_t *data, size_t len, const char *name, uint64_t max_pixels, at_image *out,
                            int *orientation) {
    png_src src = {data, len, 0, {0}};
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_warn);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    png_bytep *volatile rows = NULL;
    at_status st = AT_OK;
    if (!info) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    if (setjmp(png_jmpbuf(p))) {
        at_image_free(out);
        st = at_error(AT_ERR_FORMAT, "%s: corrupt PNG: %s", name, src.msg);
        goto done;
    }
    png_set_read_fn(p, &src, png_read_mem);
    /* libpng's own caps: dimensions (1e6 by default) and ancillary chunk
     * memory; the pixel limit is ours, below */
    png_set_user_limits(p, 0x7fffffff, 0x7fffffff);
    png_set_chunk_malloc_max(p, 8u << 20);
    png_read_info(p, info);
    png_uint_32 w = png_get_image_width(p, info), h = png_get_image_height(p, info);
    int depth = png_get_bit_depth(p, info), ctype = png_get_color_type(p, info);
    st = alloc_pixels(out, w, h, max_pixels, name);
    if (st != AT_OK) goto done;
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p);
    if (depth == 16) png_set_strip_16(p);
    if (ctype & PNG_COLOR_MASK_ALPHA || png_get_valid(p, info, PNG_INFO_tRNS)) png_set_strip_alpha(p);
    if (!(ctype & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(p);
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    if (png_get_rowbytes(p, info) != (size_t)w * 3) {
        st = at_error(AT_ERR_INTERNAL, "%s: PNG rows of %zu bytes after conversion, expected %zu", name,
                      (size_t)png_get_rowbytes(p, info), (size_t)w * 3);
        goto fail;
    }
    rows = malloc((size_t)h * sizeof *rows);
    if (!rows) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = out->rgb + (size_t)y * w * 3;
    png_read_image(p, rows);
    png_read_end(p, info); /* an eXIf chunk may follow the pixels */
    png_uint_32 n_exif = 0;
    png_bytep exif = NULL;
    if (png_get_eXIf_1(p, info, &n_exif, &exif) && exif) *orientation = at_exif_orientation(exif, n_exif);
    goto done;
fail:
    at_image_free(out);
done:
    free(rows);
    png_destroy_read_struct(p ? &p : NULL, info ? &info : NULL, NULL);
    return st;
}

/* ---- WebP ---------------------------------------------------------------- */

static at_status decode_webp(const uint8_t *data, size_t len, const char *name, uint64_t max_pixels, at_image *out,
                             int *orientation) {
    WebPBitstreamFeatures f;
    VP8StatusCode vs = WebPGetFeatures(data, len, &f);
    if (vs == VP8_STATUS_NOT_ENOUGH_DATA) return at_error(AT_ERR_FORMAT, "%s: truncated WebP header", name);
    if (vs != VP8_STATUS_OK) return at_error(AT_ERR_FORMAT, "%s: corrupt WebP (status %d)", name, (int)vs);
    if (f.has_animation) return at_error(AT_ERR_UNSUPPORTED, "%s: animated WebP is not supported", name);
    AT_TRY(alloc_pixels(out, (uint64_t)f.width, (uint64_t)f.height, max_pixels, name));
    size_t stride = (size_t)out->width * 3;
    if (stride > INT_MAX || !WebPDecodeRGBInto(data, len, out->rgb, stride * (size_t)out->height, (int)stride)) {
        at_image_free(out);
        return at_error(AT_ERR_FORMAT, "%s: corrupt or truncated WebP", name);
    }
    WebPData wd = {data, len};
    WebPDemuxer *dm = WebPDemux(&wd);
    if (dm) {
        WebPChunkIterator it;
        if (WebPDemuxGetChunk(dm, "EXIF", 1, &it)) {
            *orientation = at_exif_orientation(it.chunk.bytes, it.chunk.size);
            WebPDemuxReleaseChunkIterator(&it);
        }
        WebPDemuxDelete(dm);
    }
    return AT_OK;
}

/* ---- entry points -------------------------------------------------------- */

at_status at_image_decode(const void *data, size_t len, const char *name, uint64_t max_pixels, at_image *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "image";
    if (max_pixels == 0) max_pixels = AT_IMAGE_MAX_PIXELS_DEFAULT;
    if (!data || len == 0) return at_error(AT_ERR_FORMAT, "%s: empty file, not an image", name);
    at_image_type type = at_image_sniff(data, len);
    if (type == AT_IMAGE_UNKNOWN) {
        const char *other = other_image_type(data, len);
        if (other)
            return at_error(AT_ERR_UNSUPPORTED, "%s: %s images are not supported (JPEG, PNG and WebP are)", name, other);
        return at_error(AT_ERR_FORMAT, "%s: not a JPEG, PNG or WebP image", name);
    }
    int orientation = 1;
    at_status st = type == AT_IMAGE_JPEG ? decode_jpeg(data, len, name, max_pixels, out, &orientation)
                   : type == AT_IMAGE_PNG ? decode_png(data, len, name, max_pixels, out, &orientation)
                                          : decode_webp(data, len, name, max_pixels, out, &orientation);
    if (st == AT_OK) st = at_image_orient(out, orientation);
    if (st != AT_OK) at_image_free(out);
    return st;
}

at_status at_image_load(const char *path, uint64_t max_pixels, at_image *out) {
    char *buf = NULL;
    size_t len = 0;
    memset(out, 0, sizeof *out);
    at_status st = at_read_file(path, &buf, &len);
    if (st != AT_OK) return st;
    st = at_image_decode(buf, len, path, max_pixels, out);
    free(buf);
    return st;
}
