#include "train/vision_demo.h"

#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/rng.h"
#include "data/dataset.h"
#include "data/image_proc.h"
#include "data/media.h"
#include "infer/bundle.h"
#include "model/adapter.h"
#include "model/loader.h"
#include "train/text_pipeline.h"
#include "train/vision_ckpt.h"
#include "train/vlm_step.h"

const char *const at_vision_demo_colours[AT_VISION_DEMO_COLOURS] = {"red", "green", "blue", "yellow"};
static const int RGB[AT_VISION_DEMO_COLOURS][3] = {{210, 40, 40}, {40, 170, 60}, {40, 70, 210}, {225, 205, 40}};

void at_vision_demo_free(at_vision_demo *d)
{
    free(d->test_colour);
    memset(d, 0, sizeof *d);
}

/* An 8-bit RGB picture as a PNG file (libpng). */
static at_status write_png(const char *path, const uint8_t *rgb, int w, int h)
{
    FILE *f = fopen(path, "wb");
    if (!f) return at_error(AT_ERR_IO, "%s: cannot create", path);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    at_status st = AT_OK;
    if (!png || !info) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
    } else if (setjmp(png_jmpbuf(png))) {
        st = at_error(AT_ERR_IO, "%s: writing the PNG failed", path);
    } else {
        png_init_io(png, f);
        png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < h; y++) png_write_row(png, (png_const_bytep)(rgb + (size_t)y * (size_t)w * 3));
        png_write_end(png, NULL);
    }
    png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
    if (fclose(f) != 0 && st == AT_OK) st = at_error(AT_ERR_IO, "%s: write failed", path);
    return st;
}

/* Picture k of colour c: a square of 28..84 pixels, each channel ± 35 of the colour. */
static at_status picture(const char *path, int c, at_rng *r)
{
    int side = 28 + (int)(at_rng_uniform(r) * 57.0f);
    if (side > 84) side = 84;
    uint8_t *px = malloc((size_t)side * (size_t)side * 3);
    if (!px) return at_error(AT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < side * side * 3; i++) {
        int v = RGB[c][i % 3] + (int)((at_rng_uniform(r) * 2.0f - 1.0f) * 35.0f);
        px[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    at_status st = write_png(path, px, side, side);
    free(px);
    return st;
}

static void line(FILE *f, const char *image, const char *answer)
{
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>What colour is this?\"}, {\"role\": "
               "\"assistant\", \"content\": \"%s\"}], \"images\": [\"%s\"]}\n", answer, image);
}

at_status at_vision_demo_make(const char *dir, uint64_t seed, int n_train, int n_test, at_vision_demo *out)
{
    memset(out, 0, sizeof *out);
    AT_TRY(at_mkdirs(dir));
    out->test_colour = calloc((size_t)(n_test > 0 ? n_test : 1), sizeof *out->test_colour);
    if (!out->test_colour) return at_error(AT_ERR_NOMEM, "out of memory");
    out->n_test = n_test;
    snprintf(out->train, sizeof out->train, "%s/train.jsonl", dir);
    snprintf(out->test, sizeof out->test, "%s/test.jsonl", dir);
    FILE *ft = fopen(out->train, "w"), *fe = fopen(out->test, "w");
    at_status st = ft && fe ? AT_OK : at_error(AT_ERR_IO, "%s: cannot write the demo's datasets", dir);
    at_rng r;
    at_rng_seed(&r, seed);
    for (int k = 0; k < n_train + n_test && st == AT_OK; k++) {
        int c = k % AT_VISION_DEMO_COLOURS; /* every colour as often */
        char name[64], path[1200];
        snprintf(name, sizeof name, "%s-%03d.png", k < n_train ? "train" : "test", k);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st = picture(path, c, &r);
        if (st != AT_OK) break;
        if (k < n_train) {
            line(ft, name, at_vision_demo_colours[c]);
        } else {
            out->test_colour[k - n_train] = c;
            for (int a = 0; a < AT_VISION_DEMO_COLOURS; a++) line(fe, name, at_vision_demo_colours[a]);
        }
    }
    if (ft && fclose(ft) != 0 && st == AT_OK) st = at_error(AT_ERR_IO, "%s: write failed", out->train);
    if (fe && fclose(fe) != 0 && st == AT_OK) st = at_error(AT_ERR_IO, "%s: write failed", out->test);
    if (st != AT_OK) at_vision_demo_free(out);
    return st;
}

/* What scoring holds: the model, its tower, tokenizer, template and processor. */
typedef struct {
    at_decoder *d;
    at_vision *v;
    at_adapter *ad;
    at_tokenizer *tok;
    at_chat_template *tmpl;
    at_text_pipeline pipe;
    int pipe_ok;
    at_image_processor proc;
} scorer;

static void scorer_free(scorer *s)
{
    if (s->d) at_decoder_set_adapter(s->d, NULL);
    at_adapter_free(s->ad);
    if (s->pipe_ok) at_text_pipeline_free(&s->pipe);
    at_chat_template_free(s->tmpl);
    at_tokenizer_free(s->tok);
    at_vision_free(s->v);
    at_decoder_free(s->d);
}

/* Σ −log p of sample smp's trained tokens (its answer and end of turn). */
static at_status sample_loss(scorer *s, const at_sample *smp, double *loss)
{
    at_encoder enc;
    at_text_pipeline_encoder(&s->pipe, &enc);
    return at_vlm_sample_loss(s->d, s->v, &enc, &s->proc, smp, loss, NULL);
}

at_status at_vision_demo_accuracy(const at_vision_demo *d, const char *model, const char *ckpt, double *accuracy)
{
    scorer s;
    memset(&s, 0, sizeof s);
    at_dataset *ds = NULL;
    at_status st = AT_OK;
    at_load_options lo = at_load_options_default();
    lo.dtype = AT_F32;
    /* a LoRA checkpoint holds an adapter; a full one the model's weights (the tower's too: train/vision_ckpt.h) */
    char *acfg = ckpt ? at_path_join(ckpt, "adapter_config.json") : NULL;
    int lora = acfg && at_file_exists(acfg);
    free(acfg);
    AT_CHECK(at_decoder_load(ckpt && !lora ? ckpt : model, &lo, &s.d));
    AT_CHECK(at_vision_load(model, model, s.d->be, &s.v));
    at_bundle_opts bo = {0};
    bo.model = model;
    AT_CHECK(at_bundle_load_text(&bo, &s.tok, &s.tmpl));
    AT_CHECK(at_text_pipeline_init(&s.pipe, s.tok, s.tmpl, 0));
    s.pipe_ok = 1;
    AT_CHECK(at_image_processor_load(model, &s.proc, NULL));
    if (lora) {
        AT_CHECK(at_adapter_load(ckpt, &s.d->cfg, s.d->be, &s.ad));
        AT_CHECK(at_decoder_set_adapter(s.d, s.ad));
    }
    if (ckpt) AT_CHECK(at_vision_ckpt_load(s.v, ckpt, 0));
    at_dataset_options dopt = {0};
    dopt.strict = 1;
    const char *spec = d->test;
    AT_CHECK(at_dataset_load(&spec, 1, &dopt, &ds));
    if (ds->train.n != (size_t)d->n_test * AT_VISION_DEMO_COLOURS) {
        st = at_error(AT_ERR_INVALID, "%s: %zu records, %d expected", d->test, ds->train.n,
                      d->n_test * AT_VISION_DEMO_COLOURS);
        goto done;
    }
    int right = 0;
    for (int k = 0; k < d->n_test; k++) {
        int best = 0;
        double best_loss = INFINITY;
        for (int c = 0; c < AT_VISION_DEMO_COLOURS; c++) {
            double l = 0;
            AT_CHECK(sample_loss(&s, ds->train.items[(size_t)k * AT_VISION_DEMO_COLOURS + (size_t)c], &l));
            if (l < best_loss) {
                best_loss = l;
                best = c;
            }
        }
        right += best == d->test_colour[k];
    }
    *accuracy = d->n_test ? (double)right / d->n_test : 0;
done:
    at_dataset_free(ds);
    scorer_free(&s);
    return st;
}
