/* Images: decoding (JPEG / PNG / WebP, EXIF orientation), Pillow's bicubic
 * resize and the Qwen2-VL processor against tools/make_image_goldens.py
 * (Pillow + numpy), and the refusals of bad files. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/file.h"
#include "base/json.h"
#include "data/image.h"
#include "data/image_proc.h"
#include "data/image_resize.h"
#include "model/safetensors.h"
#include "testing.h"

#define DIR "tests/data/images/"

static at_st_file *goldens;

static const at_st_info *golden(const char *kind, const char *name) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", kind, name);
    const at_st_info *t = at_st_find(goldens, key);
    CHECK_MSG(t != NULL, "golden %s missing", key);
    return t;
}

/* Bytes of img against a U8 [h, w, 3] golden: equal, byte for byte. Decoding
 * runs the same libraries (libjpeg-turbo, libpng, libwebp) with the same
 * settings as Pillow, whose SIMD and plain paths are bit-exact by design; the
 * resize is integer arithmetic: no tolerance is due anywhere. */
static void check_pixels(const at_image *img, const at_st_info *t, const char *what) {
    if (!t) return;
    CHECK_MSG(t->ndim == 3 && t->shape[0] == img->height && t->shape[1] == img->width && t->shape[2] == 3,
              "%s: %dx%d, golden %lldx%lld", what, img->width, img->height, (long long)t->shape[1],
              (long long)t->shape[0]);
    if (t->nbytes != (size_t)img->width * img->height * 3) return;
    size_t bad = 0, first = 0;
    int maxd = 0;
    for (size_t i = 0; i < t->nbytes; i++) {
        int d = abs((int)img->rgb[i] - (int)t->data[i]);
        if (d && !bad++) first = i;
        if (d > maxd) maxd = d;
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu bytes differ (first at %zu, max difference %d)", what, bad, t->nbytes, first,
              maxd);
}

static void test_decode_goldens(void) {
    size_t n = at_st_count(goldens), seen = 0;
    for (size_t i = 0; i < n; i++) {
        const at_st_info *t = at_st_info_at(goldens, i);
        if (strncmp(t->name, "decoded.", 8)) continue;
        char path[256];
        snprintf(path, sizeof path, DIR "%s", t->name + 8);
        at_image img;
        CHECK_OK(at_image_load(path, 0, &img));
        check_pixels(&img, t, path);
        at_image_free(&img);
        seen++;
    }
    CHECK_MSG(seen >= 25, "only %zu decoded goldens", seen);
}

/* The processor cases: smart_resize's size, the resized bytes and, where
 * kept, the patches and grid. */
static void test_processor_goldens(void) {
    cJSON *cases = NULL;
    const char *meta = at_st_metadata(goldens, "cases");
    CHECK(meta != NULL);
    if (!meta) return;
    CHECK_OK(at_json_parse(meta, strlen(meta), "cases", &cases));
    size_t n_patch_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        char path[256];
        snprintf(path, sizeof path, DIR "%s", cJSON_GetObjectItem(c, "file")->valuestring);
        at_image_processor p;
        at_image_processor_default(&p);
        p.min_pixels = (uint64_t)cJSON_GetObjectItem(c, "min_pixels")->valuedouble;
        p.max_pixels = (uint64_t)cJSON_GetObjectItem(c, "max_pixels")->valuedouble;
        /* another processor's settings (Qwen3-VL's: patch 16, mean / std 0.5), as its preprocessor_config.json says */
        if (cJSON_GetObjectItem(c, "patch_size")) CHECK_OK(at_image_processor_from_json(c, name, &p));
        at_image img, rs;
        CHECK_OK(at_image_load(path, 0, &img));
        if (!img.rgb) continue;
        int rh = 0, rw = 0;
        CHECK_OK(at_smart_resize(img.height, img.width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels, &rh,
                                 &rw));
        CHECK_OK(at_image_resize_bicubic(&img, rw, rh, &rs));
        check_pixels(&rs, golden("resized", name), name);
        if (cJSON_IsTrue(cJSON_GetObjectItem(c, "patches"))) {
            n_patch_cases++;
            at_image_patches pp;
            CHECK_OK(at_image_to_patches(&p, &img, path, &pp));
            const at_st_info *g = golden("grid", name), *v = golden("patches", name);
            if (g && v && pp.values) {
                int32_t grid[3];
                memcpy(grid, g->data, sizeof grid);
                CHECK(pp.grid_t == grid[0] && pp.grid_h == grid[1] && pp.grid_w == grid[2]);
                CHECK(pp.n_patches == (size_t)v->shape[0] && pp.patch_dim == (size_t)v->shape[1]);
                CHECK(pp.patch_dim == (size_t)(3 * 2 * p.patch_size * p.patch_size));
                CHECK(at_image_patches_tokens(&pp, 2) == pp.n_patches / 4);
                /* Each value is three float32 roundings (x/255, - mean, / std)
                 * of numbers below 2.2 in magnitude: at most 3 * 2^-24 * 2.2
                 * relative to each step's result, under 1e-6 absolute. The
                 * arithmetic is the same as numpy's, so 0 is what we expect. */
                double maxd = 0;
                size_t nv = pp.n_patches * pp.patch_dim;
                if (nv * 4 == v->nbytes) {
                    for (size_t i = 0; i < nv; i++) {
                        float want;
                        memcpy(&want, v->data + 4 * i, 4);
                        double d = fabs((double)pp.values[i] - want);
                        if (d > maxd) maxd = d;
                    }
                }
                CHECK_MSG(nv * 4 == v->nbytes && maxd <= 1e-6, "%s: patches differ by %g", name, maxd);
            }
            at_image_patches_free(&pp);
        }
        at_image_free(&rs);
        at_image_free(&img);
    }
    CHECK(n_patch_cases >= 3);
    cJSON_Delete(cases);
}

static void test_smart_resize_table(void) {
    cJSON *table = NULL;
    const char *meta = at_st_metadata(goldens, "smart_resize");
    CHECK(meta != NULL);
    if (!meta) return;
    CHECK_OK(at_json_parse(meta, strlen(meta), "smart_resize", &table));
    const cJSON *row;
    int n = 0, refused = 0;
    cJSON_ArrayForEach(row, table) {
        long long v[7];
        for (int i = 0; i < 7; i++) v[i] = (long long)cJSON_GetArrayItem(row, i)->valuedouble;
        int rh = -1, rw = -1;
        at_status st = at_smart_resize((int)v[0], (int)v[1], (int)v[2], (uint64_t)v[3], (uint64_t)v[4], &rh, &rw);
        if (v[5] == 0) {
            refused++;
            CHECK_MSG(st == AT_ERR_INVALID, "%lldx%lld should be refused", v[0], v[1]);
        } else {
            CHECK_MSG(st == AT_OK && rh == v[5] && rw == v[6], "smart_resize(%lld, %lld, min %lld, max %lld) = %d x %d, "
                      "want %lld x %lld", v[0], v[1], v[3], v[4], rh, rw, v[5], v[6]);
        }
        n++;
    }
    CHECK(n >= 60 && refused >= 4);
    cJSON_Delete(table);
}

/* ---- refusals -------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    CHECK_OK(at_read_file(path, &buf, len));
    return buf;
}

/* st == want and the message names `name` (and contains `word` if given). */
static void check_refused(at_status st, at_status want, const char *name, const char *word, const char *what) {
    CHECK_MSG(st == want, "%s: %s, expected %s (%s)", what, at_status_name(st), at_status_name(want), at_last_error());
    CHECK_MSG(strstr(at_last_error(), name) != NULL, "%s: message does not name %s: %s", what, name, at_last_error());
    if (word) CHECK_MSG(strstr(at_last_error(), word) != NULL, "%s: no '%s' in: %s", what, word, at_last_error());
}

static void test_truncated_and_corrupt(void) {
    static const char *files[] = {"photo.jpg", "progressive.jpg", "photo.png", "palette.png", "lossy.webp",
                                  "lossless.webp"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, DIR "%s", files[i]);
        size_t len = 0;
        char *buf = slurp(path, &len);
        if (!buf) continue;
        at_image img;
        /* cut in the middle of the pixel data, and just after the header */
        size_t cuts[] = {len / 2, len - 20, 40};
        for (size_t k = 0; k < 3; k++) {
            at_status st = at_image_decode(buf, cuts[k], "cut.img", 0, &img);
            check_refused(st, AT_ERR_FORMAT, "cut.img", NULL, files[i]);
            CHECK(img.rgb == NULL);
        }
        /* damage in the middle of the data */
        for (size_t j = len / 3; j < len / 3 + 16; j++) buf[j] = (char)(buf[j] ^ 0x5a);
        at_status st = at_image_decode(buf, len, "bad.img", 0, &img);
        if (!strstr(files[i], ".png")) {
            /* JPEG and WebP carry no checksums: libjpeg and libwebp (as
             * Pillow) decode damaged entropy-coded data into other pixels;
             * PNG's CRCs catch it */
            CHECK(st == AT_OK || st == AT_ERR_FORMAT);
        } else {
            check_refused(st, AT_ERR_FORMAT, "bad.img", NULL, files[i]);
        }
        at_image_free(&img);
        free(buf);
    }
    /* a JPEG cut inside its pixels says so */
    size_t len = 0;
    char *buf = slurp(DIR "photo.jpg", &len);
    at_image img;
    if (buf) {
        check_refused(at_image_decode(buf, len / 2, "half.jpg", 0, &img), AT_ERR_FORMAT, "half.jpg", "truncated",
                      "half JPEG");
        free(buf);
    }
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Files whose headers claim huge pictures are refused before any pixel
 * memory: the status is AT_ERR_INVALID (over the limit), not AT_ERR_NOMEM. */
static void test_decompression_bombs(void) {
    at_image img;
    /* PNG: the IHDR says 100000 x 100000 (30 GB of RGB) */
    size_t len = 0;
    char *buf = slurp(DIR "photo.png", &len);
    if (buf) {
        uint8_t *ihdr = (uint8_t *)buf + 8; /* length, "IHDR", width, height, ... crc */
        put_be32(ihdr + 8, 100000);
        put_be32(ihdr + 12, 100000);
        put_be32(ihdr + 8 + 13, (uint32_t)crc32(0, ihdr + 4, 17));
        check_refused(at_image_decode(buf, len, "bomb.png", 0, &img), AT_ERR_INVALID, "bomb.png", "limit", "PNG bomb");
        CHECK(img.rgb == NULL);
        free(buf);
    }
    /* JPEG: the SOF says 65000 x 65000 */
    buf = slurp(DIR "photo.jpg", &len);
    if (buf) {
        uint8_t *p = (uint8_t *)buf;
        for (size_t i = 2; i + 9 < len; i++) {
            if (p[i] == 0xFF && (p[i + 1] == 0xC0 || p[i + 1] == 0xC2)) {
                p[i + 5] = p[i + 7] = 0xFD; /* height, width: 0xFDE8 = 65000 */
                p[i + 6] = p[i + 8] = 0xE8;
                break;
            }
        }
        check_refused(at_image_decode(buf, len, "bomb.jpg", 0, &img), AT_ERR_INVALID, "bomb.jpg", "limit", "JPEG bomb");
        free(buf);
    }
    /* WebP (lossy VP8): the frame header says 16383 x 16383 */
    buf = slurp(DIR "lossy.webp", &len);
    if (buf) {
        uint8_t *p = (uint8_t *)buf;
        for (size_t i = 12; i + 7 < len; i++) {
            if (p[i] == 0x9d && p[i + 1] == 0x01 && p[i + 2] == 0x2a) {
                p[i + 3] = p[i + 5] = 0xff;
                p[i + 4] = p[i + 6] = 0x3f;
                break;
            }
        }
        check_refused(at_image_decode(buf, len, "bomb.webp", 0, &img), AT_ERR_INVALID, "bomb.webp", "limit",
                      "WebP bomb");
        free(buf);
    }
    /* a real image over a caller's limit */
    check_refused(at_image_load(DIR "photo.jpg", 1000, &img), AT_ERR_INVALID, "photo.jpg", "limit", "small limit");
    CHECK_OK(at_image_load(DIR "photo.jpg", 120 * 80, &img));
    at_image_free(&img);
}

static void test_wrong_types(void) {
    at_image img;
    static const char gif[] = "GIF89a\x01\x00\x01\x00\x80\x00\x00";
    check_refused(at_image_decode(gif, sizeof gif - 1, "anim.gif", 0, &img), AT_ERR_UNSUPPORTED, "anim.gif", "GIF",
                  "GIF");
    static const char bmp[] = "BM\x36\x00\x00\x00";
    check_refused(at_image_decode(bmp, sizeof bmp - 1, "x.bmp", 0, &img), AT_ERR_UNSUPPORTED, "x.bmp", "BMP", "BMP");
    check_refused(at_image_decode("hello, world", 12, "notes.txt", 0, &img), AT_ERR_FORMAT, "notes.txt",
                  "not a JPEG, PNG or WebP", "text");
    check_refused(at_image_decode("", 0, "empty.jpg", 0, &img), AT_ERR_FORMAT, "empty.jpg", "empty", "empty");
    check_refused(at_image_load(DIR "missing.jpg", 0, &img), AT_ERR_IO, "missing.jpg", NULL, "missing file");
    check_refused(at_image_load(DIR "goldens.safetensors", 0, &img), AT_ERR_FORMAT, "goldens.safetensors", NULL,
                  "safetensors");
    CHECK(at_image_sniff("\xff\xd8\xff", 3) == AT_IMAGE_JPEG);
    CHECK(at_image_sniff("RIFF\0\0\0\0WEBP", 12) == AT_IMAGE_WEBP);
    CHECK(at_image_sniff("RIFF\0\0\0\0WAVE", 12) == AT_IMAGE_UNKNOWN);
}

static void test_exif_parser(void) {
    /* big-endian, orientation as a LONG, after another tag */
    static const uint8_t mm[] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 2,
                                 0x01, 0x0F, 0, 2, 0, 0, 0, 4, 'a', 'b', 'c', 0,
                                 0x01, 0x12, 0, 4, 0, 0, 0, 1, 0, 0, 0, 7};
    CHECK(at_exif_orientation(mm, sizeof mm) == 7);
    uint8_t bad[sizeof mm];
    memcpy(bad, mm, sizeof mm);
    bad[7] = 200; /* IFD offset past the end */
    CHECK(at_exif_orientation(bad, sizeof bad) == 1);
    memcpy(bad, mm, sizeof mm);
    bad[33] = 9; /* not an orientation */
    CHECK(at_exif_orientation(bad, sizeof bad) == 1);
    CHECK(at_exif_orientation(mm, 20) == 1); /* cut inside the entries */
    CHECK(at_exif_orientation((const uint8_t *)"Exif\0\0II", 8) == 1);
}

static void test_processor_config(void) {
    at_image_processor p;
    at_image_processor_default(&p);
    CHECK(p.min_pixels == 3136 && p.max_pixels == 1003520 && p.patch_size == 14);
    static const char *cfg = "{\"size\": {\"shortest_edge\": 1000, \"longest_edge\": 2000000}, \"patch_size\": 16,"
                             " \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": 0.25, \"resample\": 3,"
                             " \"image_processor_type\": \"Qwen2VLImageProcessor\"}";
    cJSON *j = NULL;
    CHECK_OK(at_json_parse(cfg, strlen(cfg), "cfg", &j));
    CHECK_OK(at_image_processor_from_json(j, "cfg", &p));
    CHECK(p.min_pixels == 1000 && p.max_pixels == 2000000 && p.patch_size == 16);
    CHECK(p.image_mean[2] == 0.5f && p.image_std[1] == 0.25f);
    cJSON_Delete(j);
    static const char *bad[] = {"{\"resample\": 2}", "{\"image_std\": [1, 0, 1]}", "{\"min_pixels\": 10, \"max_pixels\": 5}",
                                "{\"patch_size\": -1}", "{\"image_mean\": [1, 2]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        at_image_processor_default(&p);
        CHECK_OK(at_json_parse(bad[i], strlen(bad[i]), "bad", &j));
        at_status st = at_image_processor_from_json(j, "pp.json", &p);
        CHECK_MSG(st != AT_OK && strstr(at_last_error(), "pp.json"), "%s accepted", bad[i]);
        cJSON_Delete(j);
    }
    int found = 1;
    CHECK_OK(at_image_processor_load(DIR, &p, &found));
    CHECK(found == 0 && p.patch_size == 14);
}

int main(void) {
    CHECK_OK(at_st_open(DIR "goldens.safetensors", &goldens));
    if (!goldens) return at_test_result("image");
    test_decode_goldens();
    test_processor_goldens();
    test_smart_resize_table();
    test_truncated_and_corrupt();
    test_decompression_bombs();
    test_wrong_types();
    test_exif_parser();
    test_processor_config();
    at_st_close(goldens);
    return at_test_result("image");
}
