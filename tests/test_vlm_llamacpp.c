/* A real llama.cpp runs what anytune export --to gguf writes for a
 * vision-language model: the language model GGUF and the vision tower's
 * mmproj GGUF, loaded by llama.cpp's multimodal library (mtmd, in
 * @fugood/llama.node's prebuilt CPU binary; tests/js/vlm_llamacpp_check.mjs),
 * answer a question about an image greedily with the same tokens as
 * anytune infer --images at temperature 0, for Qwen2-VL and Qwen2.5-VL.
 *
 * The models are tools/make_tiny_vlm.py's (f32), made to depend on their
 * images (tests/tiny_vlm.h: attention outputs x30, unused embedding rows
 * zeroed, the tower's attention qkv and proj x16 so that its attention is
 * not uniform and weighs in the features: an error in its q, k or rotary
 * changes the answers). Each model answers two
 * images, a photo and its negative, whose answers must differ (else the
 * check would not see the tower). The images' sides are multiples of 28
 * within both processors' pixel limits, so neither resizes them and the
 * pixels the towers see are the same: 112x84 (Qwen2-VL: 4x3 merged tokens)
 * and 224x168 (Qwen2.5-VL, its processor's max_pixels raised: 8x6 merged
 * tokens, so its 4x4-unit windows are cut by the image's edges and its
 * window blocks differ from the full-attention one). The export is f32,
 * so the two engines differ only by rounding. Planted once: the patch
 * embedding's colour channels reversed, or q and k of the tower swapped, in
 * the mmproj: all four answers differ. Not seen: Qwen2.5-VL's last block
 * windowed instead of full (n_wa_pattern 3), a small change of the features
 * of a random tower that the greedy answers do not show. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "testing.h"
#include "train/run_files.h"
#include "tiny_vlm.h"

#define QUESTION "What is in the picture?"
#define N_NEW 16

/* `cmd`'s output (stdout) into out, at most len - 1 bytes, its last
 * newline cut; returns the command's status. */
static int run_capture(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    if (n && out[n - 1] == '\n') out[--n] = 0; /* infer's own; an answer may end in newlines */
    return pclose(p);
}

/* The images: the photo at width x height, and its negative. */
static int make_images(const char *dir, int w, int h, char paths[2][256])
{
    snprintf(paths[0], 256, "%s/photo_%dx%d.png", dir, w, h);
    snprintf(paths[1], 256, "%s/negative_%dx%d.png", dir, w, h);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"from PIL import Image, ImageOps; "
             "im = Image.open('tests/data/images/photo.jpg').convert('RGB').resize((%d, %d), Image.BICUBIC); "
             "im.save('%s'); ImageOps.invert(im).save('%s')\"",
             w, h, paths[0], paths[1]);
    return system(cmd) == 0;
}

/* Raises the folder's preprocessor max_pixels to `px`. */
static void set_max_pixels(const char *model, int px)
{
    char path[512];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", model);
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(at_read_file(path, &text, &n));
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECK(j != NULL);
    if (j) {
        cJSON_ReplaceItemInObject(j, "max_pixels", cJSON_CreateNumber(px));
        char *out = cJSON_Print(j);
        CHECK_OK(at_write_file_atomic(path, out, strlen(out)));
        free(out);
    }
    cJSON_Delete(j);
    free(text);
}

static void check_kind(const char *bin, const char *tmp, const char *kind, int w, int h)
{
    char model[256], out[256], cmd[2048], images[2][256];
    snprintf(model, sizeof model, "%s/%s", tmp, kind);
    snprintf(out, sizeof out, "%s/%s-gguf", tmp, kind);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/make_tiny_vlm.py %s --kind %s --dtype f32 >/dev/null", model, kind);
    int ok = system(cmd) == 0;
    CHECK_MSG(ok, "%s failed", cmd);
    if (!ok) return;
    tiny_vlm_sharpen(model, 16.0f);
    if (w * h > 112 * 112) set_max_pixels(model, w * h);
    ok = make_images(tmp, w, h, images);
    CHECK_MSG(ok, "%s: the images could not be made (python3-pil)", kind);
    if (!ok) return;

    snprintf(cmd, sizeof cmd, "%s export --model %s --to gguf --output_dir %s/model.gguf --quant f32 --quiet "
             ">/dev/null 2>&1", bin, model, out);
    ok = system(cmd) == 0;
    CHECK_MSG(ok, "%s: export failed", kind);
    if (!ok) return;

    /* ours: the text and, from --verbose, the tokens generated (decode + the prefill's one) */
    char ours[2][1024];
    int n_ours[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        char log[4096];
        snprintf(cmd, sizeof cmd, "%s infer --model %s --images %s --prompt '" QUESTION "' --max_new_tokens %d "
                 "--temperature 0 --stream false --verbose 2>%s/infer.log", bin, model, images[i], N_NEW, tmp);
        int rc = run_capture(cmd, ours[i], sizeof ours[i]);
        CHECK_MSG(rc == 0, "%s: infer --images %s: status %d", kind, images[i], rc);
        snprintf(cmd, sizeof cmd, "cat %s/infer.log", tmp);
        run_capture(cmd, log, sizeof log);
        const char *d = strstr(log, "decode: ");
        CHECK_MSG(d && sscanf(d, "decode: %d tokens", &n_ours[i]) == 1, "%s: infer --verbose said %s", kind, log);
        n_ours[i]++;
        printf("%s, %s: anytune infer answers \"%s\" (%d tokens)\n", kind, images[i], ours[i], n_ours[i]);
    }
    CHECK_MSG(strcmp(ours[0], ours[1]) != 0, "%s: the photo and its negative get the same answer \"%s\"", kind,
              ours[0]);

    /* llama.cpp */
    if (!at_test_js_ready("@fugood/llama.node")) return;
    snprintf(cmd, sizeof cmd, "node tests/js/vlm_llamacpp_check.mjs %s/model.gguf %s/mmproj-model.gguf %d '" QUESTION
             "' %s %s 2>%s/node.log", out, out, N_NEW, images[0], images[1], tmp);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char line[65536];
    int k = 0;
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, "{\"image\"", 8) != 0) continue; /* llama.cpp's log lines */
        cJSON *j = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text"), *n = cJSON_GetObjectItemCaseSensitive(j, "n");
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
        ok = k < 2 && cJSON_IsString(text) && cJSON_IsNumber(n) && cJSON_IsArray(toks);
        CHECK_MSG(ok, "%s: llama.cpp said %.300s", kind, line);
        if (ok) {
            /* the tokens' strings make the text (no token was merged or split on the way) */
            char joined[1024] = "";
            for (int t = 0; t < cJSON_GetArraySize(toks); t++) {
                const cJSON *x = cJSON_GetArrayItem(toks, t);
                if (cJSON_IsString(x) && strlen(joined) + strlen(x->valuestring) < sizeof joined)
                    strcat(joined, x->valuestring);
            }
            CHECK_MSG(!strcmp(text->valuestring, ours[k]) && n->valueint == n_ours[k] &&
                          cJSON_GetArraySize(toks) == n_ours[k] && !strcmp(joined, text->valuestring),
                      "%s, %s: llama.cpp answers \"%s\" (%d tokens), anytune infer \"%s\" (%d tokens)", kind, images[k],
                      text->valuestring, n->valueint, ours[k], n_ours[k]);
        }
        cJSON_Delete(j);
        k++;
    }
    int rc = pclose(p);
    CHECK_MSG(rc == 0 && k == 2, "%s: llama.cpp (status %d) answered %d of 2 images; its log: %s/node.log", kind, rc, k,
              tmp);
}

int main(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) {
        printf("ANYTUNE_BIN not set: run by ctest\n");
        return 0;
    }
    char tmp[] = "/tmp/anytune-vlm-llamacpp-XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0);
        return at_test_result("test_vlm_llamacpp");
    }
    check_kind(bin, tmp, "qwen2_vl", 112, 84);
    check_kind(bin, tmp, "qwen2_5_vl", 224, 168);
    if (at_test_failures == 0) CHECK_OK(at_remove_tree(tmp));
    else fprintf(stderr, "files kept in %s\n", tmp);
    return at_test_result("test_vlm_llamacpp");
}
