/* Inference and serving with images, on a tiny random Qwen2-VL folder that
 * tools/make_tiny_vlm.py writes into a temporary folder:
 *  - the scheduler's tokens for a prompt with an image equal a reference run
 *    here from the library's parts (at_vision_forward's features placed by
 *    at_decoder_prefill_ex with at_mrope_position_ids' positions, then
 *    decode steps), greedy, and another image gives other logits and tokens.
 *    The random folder is made to see its images first (sharpen_model): as
 *    written, its answer is the prompt's last token again whatever the
 *    image (the tied embedding of that token dominates), so a tower whose
 *    features never reached the model would pass;
 *  - the prefix cache: the same prompt again takes all but its last token
 *    from the cache and runs no vision forward; the same text with another
 *    image misses from that image's first token on (the scheduler and the
 *    generator);
 *  - anytune infer --images prints the scheduler's answer, and infer
 *    --val_dataset answers records with images (ms-swift's "images", tags
 *    or none) as the scheduler does;
 *  - anytune serve (in process): a data: URL image gets that answer, a file
 *    under --allowed_local_media_path too, and usage/health show the cache;
 *    a file outside it (a symbolic link, ".."), no folder given, an http
 *    URL, bad base64, a corrupt image, an image over the pixel limit and a
 *    body over the limit are refused with a message naming the problem. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "data/media.h"
#include "http_client.h"
#include "infer/bundle.h"
#include "infer/scheduler.h"
#include "infer/vlm.h"
#include "model/loader.h"
#include "model/mrope.h"
#include "model/safetensors.h"
#include "serve/server.h"
#include "testing.h"

#define IMG_A "tests/data/images/photo.png"
#define IMG_B "tests/data/images/photo.jpg"
#define QUESTION "What is in the picture?"
#define MAX_NEW 16

static at_bundle *load(const char *dir)
{
    at_bundle_opts o = {0};
    o.model = dir;
    o.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    CHECK_OK(at_bundle_load(&o, &b));
    return b;
}

static cJSON *question(void)
{
    cJSON *m = cJSON_CreateArray(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", AT_IMAGE_TAG QUESTION);
    cJSON_AddItemToArray(m, u);
    return m;
}

/* Rewrites dir/model.safetensors (f32) so that its answers depend on its
 * images: every layer's attention output projection times 30 (the
 * residual stream at the last token is then mostly attention over the
 * prompt, a fifth of which is the image), and the embedding rows of ids the
 * trimmed tokenizer lacks zeroed (tied, so their logits are 0 and a greedy
 * answer, the largest of ~7000 positive-tailed logits, is always text). */
static void sharpen_model(const char *dir)
{
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *data = NULL;
    size_t len = 0;
    at_st_file *f = NULL;
    at_tokenizer *tok = NULL;
    CHECK_OK(at_read_file(path, &data, &len));
    CHECK_OK(at_tokenizer_load(dir, NULL, &tok));
    if (!data || !tok || at_st_parse(data, len, path, &f) != AT_OK) {
        CHECK(0);
        goto done;
    }
    int scaled = 0, zeroed = 0;
    for (size_t i = 0; at_st_info_at(f, i); i++) {
        const at_st_info *t = at_st_info_at(f, i);
        uint8_t *p = (uint8_t *)data + (t->data - (const uint8_t *)data);
        if ((strstr(t->name, "self_attn.o_proj.weight") || !strcmp(t->name, "model.embed_tokens.weight")) &&
            !(t->has_dtype && t->dtype == AT_F32)) {
            CHECK_MSG(0, "%s: not f32", t->name);
        } else if (strstr(t->name, "self_attn.o_proj.weight")) {
            for (size_t k = 0; k < t->nbytes; k += 4) {
                float v;
                memcpy(&v, p + k, 4);
                v *= 30.0f;
                memcpy(p + k, &v, 4);
            }
            scaled++;
        } else if (!strcmp(t->name, "model.embed_tokens.weight")) {
            size_t row = (size_t)t->shape[1] * 4;
            for (int64_t id = 0; id < t->shape[0]; id++)
                if (!at_tokenizer_id_to_token(tok, (int32_t)id)) memset(p + (size_t)id * row, 0, row), zeroed++;
        }
    }
    CHECK_MSG(scaled == 2 && zeroed > 100000, "sharpen_model: %d projections scaled, %d rows zeroed", scaled, zeroed);
    CHECK_OK(at_write_file_atomic(path, data, len));
done:
    at_st_close(f);
    at_tokenizer_free(tok);
    free(data);
}

/* The prompt of QUESTION with the image at path. */
static int prompt_of(at_bundle *b, const char *path, at_vlm_images *im, int32_t **ids, size_t *n)
{
    at_image img = {0};
    memset(im, 0, sizeof *im);
    CHECK_OK(at_image_load(path, 0, &img));
    CHECK_OK(at_vlm_images_add(b, &img, path, im));
    at_image_free(&img);
    cJSON *m = question();
    at_status st = at_vlm_encode_chat(b, m, im, ids, n);
    CHECK_OK(st);
    cJSON_Delete(m);
    return st == AT_OK;
}

/* What every run here generates with: greedy, MAX_NEW tokens. */
static at_gen_params params(const at_bundle *b)
{
    at_gen_params gp = at_gen_params_default();
    gp.max_new_tokens = MAX_NEW;
    gp.stop_ids = b->stop_ids;
    gp.n_stop_ids = b->n_stop_ids;
    return gp;
}

/* The reference: the tokens drawn (params(), until a stop token or MAX_NEW)
 * and the first logits, from the library's parts. Returns the token count. */
static int reference(at_bundle *b, const at_vlm_images *im, const int32_t *ids, size_t n, int32_t *out, float *logits0)
{
    at_decoder *d = b->decoder;
    const at_vision_config *vc = at_vision_get_config(b->vision);
    int V = d->cfg.vocab_size, got = 0;
    int64_t n_tok = 0;
    CHECK_OK(at_vision_tokens(vc, (const int32_t(*)[3])im->grid, im->n, im->n_patches, &n_tok));
    int64_t shf[2] = {n_tok, vc->out_hidden_size}, shl[2] = {1, V};
    at_tensor *feats = NULL, *logits = NULL;
    at_kv_cache *cache = NULL;
    int32_t *planar = malloc(n * 3 * sizeof *planar), *pos = malloc(n * 3 * sizeof *pos);
    float *host = malloc((size_t)V * sizeof *host);
    CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shf, "ref.features", &feats));
    CHECK_OK(at_tensor_new(d->be, AT_F32, 2, shl, "ref.logits", &logits));
    CHECK_OK(at_kv_cache_new(&d->cfg, d->be, AT_F32, 1, 512, &cache));
    CHECK_OK(at_vision_forward(b->vision, feats, im->pixels, im->n_patches, (const int32_t(*)[3])im->grid, im->n, 0));
    at_mrope_tokens tk = {vc->image_token_id, vc->video_token_id, vc->vision_start_token_id, vc->spatial_merge_size};
    CHECK_OK(at_mrope_position_ids(&tk, ids, n, (const int32_t(*)[3])im->grid, (size_t)im->n, planar, NULL));
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) pos[i * 3 + (size_t)k] = planar[(size_t)k * n + i];
    at_prefill_extra ex = {pos, feats, vc->image_token_id, NULL, 0};
    at_status st = at_decoder_prefill_ex(d, cache, ids, (int)n, NULL, logits, 0, &ex);
    CHECK_OK(st);
    at_gen_params gp = params(b);
    at_gen_seq *seq = NULL;
    CHECK_OK(at_gen_seq_new(b->tokenizer, V, &gp, &seq));
    CHECK_OK(at_gen_seq_start(seq, ids, n));
    at_finish_reason fin = AT_FINISH_NONE;
    while (st == AT_OK && seq && fin == AT_FINISH_NONE) {
        CHECK_OK(at_tensor_download(logits, host, (size_t)V * sizeof *host));
        if (got == 0) memcpy(logits0, host, (size_t)V * sizeof *host);
        int32_t t = -1;
        CHECK_OK(at_gen_seq_next(seq, host, 512 - cache->len[0], &t, &fin));
        if (t >= 0 && got < MAX_NEW) out[got++] = t;
        if (fin != AT_FINISH_NONE) break;
        st = at_decoder_decode_step(d, cache, &t, NULL, logits);
        CHECK_OK(st);
    }
    at_gen_seq_free(seq);
    at_kv_cache_free(cache);
    at_tensor_free(feats);
    at_tensor_free(logits);
    free(planar);
    free(pos);
    free(host);
    return got;
}

typedef struct {
    int32_t tokens[64];
    int n;
    char text[4096];
    int cached, encoded, prompt;
} run_result;

/* One sequence through the scheduler s. */
static void sched_run(at_scheduler *s, at_bundle *b, const at_vlm_images *im, const int32_t *ids, size_t n,
                      run_result *r)
{
    memset(r, 0, sizeof *r);
    at_prompt_media media = {0};
    CHECK_OK(at_vlm_media(b, ids, n, im, &media));
    at_gen_params gp = params(b);
    int slot = -1;
    CHECK_OK(at_scheduler_add_media(s, ids, n, &media, &gp, NULL, &slot));
    at_vlm_media_free(&media);
    for (int done = 0, guard = 0; !done && slot >= 0 && guard < 1000; guard++) {
        const at_sched_event *ev = NULL;
        int nev = 0;
        CHECK_OK(at_scheduler_step(s, &ev, &nev));
        for (int i = 0; i < nev; i++) {
            if (ev[i].token >= 0 && r->n < 64) r->tokens[r->n++] = ev[i].token;
            size_t have = strlen(r->text);
            if (ev[i].len && have + ev[i].len < sizeof r->text) memcpy(r->text + have, ev[i].text, ev[i].len);
            r->cached = ev[i].cached_tokens;
            r->encoded = ev[i].images_encoded;
            r->prompt = ev[i].prompt_tokens;
            if (ev[i].finish != AT_FINISH_NONE) done = 1;
        }
    }
}

/* Two sequences at once (one prefill call places both images' features). */
static void sched_run_two(at_scheduler *s, at_bundle *b, const at_vlm_images *im[2], int32_t *const ids[2],
                          const size_t n[2], run_result r[2])
{
    int slot[2] = {-1, -1};
    at_gen_params gp = params(b);
    for (int k = 0; k < 2; k++) {
        memset(&r[k], 0, sizeof r[k]);
        at_prompt_media media = {0};
        CHECK_OK(at_vlm_media(b, ids[k], n[k], im[k], &media));
        CHECK_OK(at_scheduler_add_media(s, ids[k], n[k], &media, &gp, &r[k], &slot[k]));
        at_vlm_media_free(&media);
    }
    for (int done = 0, guard = 0; done < 2 && guard < 1000; guard++) {
        const at_sched_event *ev = NULL;
        int nev = 0;
        CHECK_OK(at_scheduler_step(s, &ev, &nev));
        for (int i = 0; i < nev; i++) {
            run_result *x = ev[i].user;
            if (ev[i].token >= 0 && x->n < 64) x->tokens[x->n++] = ev[i].token;
            x->encoded = ev[i].images_encoded;
            done += ev[i].finish != AT_FINISH_NONE;
        }
    }
}

static size_t first_image_token(const at_bundle *b, const int32_t *ids, size_t n)
{
    int32_t pad = at_vision_get_config(b->vision)->image_token_id;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == pad) return i;
    return n;
}

/* ---- a data: URL of a file ------------------------------------------------------- */

static char *data_url(const char *path, const char *mime)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *raw = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(path, &raw, &len));
    size_t head = strlen(mime) + 13;
    char *out = malloc(head + (len + 2) / 3 * 4 + 1), *o = out + head;
    sprintf(out, "data:%s;base64,", mime);
    const unsigned char *p = (const unsigned char *)raw;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < len ? p[i + 2] : 0);
        *o++ = tab[v >> 18 & 63];
        *o++ = tab[v >> 12 & 63];
        *o++ = i + 1 < len ? tab[v >> 6 & 63] : '=';
        *o++ = i + 2 < len ? tab[v & 63] : '=';
    }
    *o = 0;
    free(raw);
    return out;
}

/* The body of a greedy chat request with one image reference. */
static char *chat_body(const char *url)
{
    cJSON *o = cJSON_CreateObject(), *ms = cJSON_AddArrayToObject(o, "messages"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON *c = cJSON_AddArrayToObject(m, "content"), *img = cJSON_CreateObject(), *txt = cJSON_CreateObject();
    cJSON_AddStringToObject(img, "type", "image_url");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(img, "image_url"), "url", url);
    cJSON_AddStringToObject(txt, "type", "text");
    cJSON_AddStringToObject(txt, "text", QUESTION);
    cJSON_AddItemToArray(c, img);
    cJSON_AddItemToArray(c, txt);
    cJSON_AddItemToArray(ms, m);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddNumberToObject(o, "max_tokens", MAX_NEW);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static cJSON *post(int port, const char *body, int *status)
{
    http_resp r;
    *status = 0;
    if (!http(port, "POST", "/v1/chat/completions", NULL, body, &r)) return NULL;
    *status = r.status;
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    if (!j || r.status != 200) fprintf(stderr, "answer %d: %.300s\n", r.status, r.body ? r.body : "");
    free(r.body);
    return j;
}

static const char *content_of(const cJSON *j)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "message"), "content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int cached_of(const cJSON *j)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"),
                                                       "cached_tokens");
    return cJSON_IsNumber(c) ? c->valueint : -1;
}

static long long health(int port, const char *field)
{
    http_resp r;
    long long v = -1;
    if (http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, field);
        if (cJSON_IsNumber(x)) v = (long long)x->valuedouble;
        cJSON_Delete(j);
    }
    free(r.body);
    return v;
}

/* A request answered 400 (or `status`) whose message holds `needle`. */
static void refused(int port, const char *body, int status, const char *needle)
{
    http_resp r;
    CHECK(http(port, "POST", "/v1/chat/completions", NULL, body, &r));
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    CHECK_MSG(r.status == status && cJSON_IsString(m) && strstr(m->valuestring, needle),
              "%.80s...: status %d (want %d), answer %.300s (want \"%s\")", body, r.status, status,
              r.body ? r.body : "", needle);
    cJSON_Delete(j);
    free(r.body);
}

static void refused_url(int port, const char *url, const char *needle)
{
    char *body = chat_body(url);
    refused(port, body, 400, needle);
    free(body);
}

static at_status copy_file(const char *from, const char *to)
{
    char *data = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(from, &data, &len));
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    free(data);
    return ok ? AT_OK : at_error(AT_ERR_IO, "%s: cannot write", to);
}

static void test_server(at_bundle *b, const char *tmp, const run_result *ra, const run_result *rb,
                        size_t first_pad)
{
    char allowed[128], outside[192], link[192], inside[192], url[256];
    snprintf(allowed, sizeof allowed, "%s/allowed", tmp);
    snprintf(outside, sizeof outside, "%s/outside.png", tmp);
    snprintf(inside, sizeof inside, "%s/a.png", allowed);
    snprintf(link, sizeof link, "%s/link.png", allowed);
    CHECK(mkdir(allowed, 0755) == 0);
    CHECK_OK(copy_file(IMG_A, inside));
    CHECK_OK(copy_file(IMG_A, outside));
    CHECK(symlink(outside, link) == 0);

    at_server_opts o = {0};
    o.max_batch_size = 2;
    o.max_model_len = 512;
    o.max_body_bytes = 256 * 1024;
    o.allowed_local_media_path = allowed;
    o.max_image_pixels = 300 * 300;
    at_server *s = NULL;
    CHECK_OK(at_server_start(b, &o, &s));
    if (!s) return;
    int port = at_server_port(s), status = 0;

    /* a data: URL: infer's answer; then the same again from the cache */
    char *ua = data_url(IMG_A, "image/png"), *ub = data_url(IMG_B, "image/jpeg");
    char *body = chat_body(ua);
    cJSON *j = post(port, body, &status);
    CHECK_MSG(status == 200 && content_of(j) && !strcmp(content_of(j), ra->text), "server %d: \"%s\", infer \"%s\"",
              status, content_of(j) ? content_of(j) : "(none)", ra->text);
    CHECK_MSG(cached_of(j) == 0, "first request: %d cached tokens", cached_of(j));
    CHECK_MSG(health(port, "images_encoded") == 1, "images encoded %lld", health(port, "images_encoded"));
    cJSON_Delete(j);
    j = post(port, body, &status);
    CHECK(status == 200 && content_of(j) && !strcmp(content_of(j), ra->text));
    CHECK_MSG(cached_of(j) == ra->prompt - 1, "repeated image: %d cached tokens of %d", cached_of(j), ra->prompt);
    CHECK_MSG(health(port, "images_encoded") == 1, "the repeat ran the tower: %lld images encoded",
              health(port, "images_encoded"));
    cJSON_Delete(j);
    free(body);
    /* the same text with another image: a miss from its first image token on */
    body = chat_body(ub);
    j = post(port, body, &status);
    CHECK_MSG(status == 200 && content_of(j) && !strcmp(content_of(j), rb->text), "image B: \"%s\", want \"%s\"",
              content_of(j) ? content_of(j) : "(none)", rb->text);
    CHECK_MSG(cached_of(j) >= 0 && (size_t)cached_of(j) <= first_pad,
              "another image: %d cached tokens (its first image token is at %zu)", cached_of(j), first_pad);
    CHECK(health(port, "images_encoded") == 2);
    cJSON_Delete(j);
    free(body);

    /* the chat page: its attach button sends the file as a data: URL, and shows infer's answer */
    char want[192], cmd[512];
    snprintf(want, sizeof want, "%s/want.txt", tmp);
    CHECK_OK(at_write_file_atomic(want, ra->text, strlen(ra->text)));
    int ok_node = system("node --version >/dev/null 2>&1") == 0, ok_chromium = access("/usr/bin/chromium", X_OK) == 0;
    CHECK_MSG(ok_node && ok_chromium, "the browser check needs node and /usr/bin/chromium: run scripts/setup.sh");
    if (ok_node && ok_chromium && at_test_js_ready("playwright-core")) {
        snprintf(cmd, sizeof cmd, "node tests/js/vlm_chat_check.mjs http://127.0.0.1:%d/ " IMG_A " %s %d", port, want,
                 MAX_NEW);
        int rc = system(cmd);
        CHECK_MSG(rc == 0, "tests/js/vlm_chat_check.mjs failed (status %d)", rc);
    }

    /* a file under the allowed folder (as file:// and as a plain path): the same answer */
    snprintf(url, sizeof url, "file://%s", inside);
    body = chat_body(url);
    j = post(port, body, &status);
    CHECK_MSG(status == 200 && content_of(j) && !strcmp(content_of(j), ra->text), "file:// %d", status);
    cJSON_Delete(j);
    free(body);
    body = chat_body("a.png");
    j = post(port, body, &status);
    CHECK_MSG(status == 200 && content_of(j) && !strcmp(content_of(j), ra->text), "a relative path: %d", status);
    cJSON_Delete(j);
    free(body);

    /* refusals, each with its reason */
    refused_url(port, link, "outside --allowed_local_media_path");
    snprintf(url, sizeof url, "file://%s/../outside.png", allowed);
    refused_url(port, url, "outside --allowed_local_media_path");
    refused_url(port, "../outside.png", "outside --allowed_local_media_path");
    refused_url(port, "http://127.0.0.1:1/a.png", "never");
    refused_url(port, "https://example.com/a.png", "never");
    refused_url(port, "data:image/png;base64,iVBOR%%%###", "base64");
    refused_url(port, "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB", "image 1 of the request");
    char *big = data_url("tests/data/images/big.jpg", "image/jpeg");
    refused_url(port, big, "pixel");
    free(big);
    size_t huge = 300 * 1024;
    char *pad = malloc(huge + 1);
    memset(pad, 'A', huge);
    pad[huge] = 0;
    memcpy(pad, "data:image/png;base64,", 22);
    body = chat_body(pad);
    refused(port, body, 413, "larger than");
    free(body);
    free(pad);
    at_server_stop(s, 5);

    /* without --allowed_local_media_path no file is read */
    o.allowed_local_media_path = NULL;
    CHECK_OK(at_server_start(b, &o, &s));
    if (s) {
        refused_url(at_server_port(s), inside, "--allowed_local_media_path");
        at_server_stop(s, 5);
    }
    free(ua);
    free(ub);
    unlink(link);
    unlink(inside);
    unlink(outside);
    rmdir(allowed);
}

/* anytune infer --images prints the scheduler's answer; with --max_pixels
 * 3136 (56x56) its prompt has the tokens of the image resized that small. */
static void test_cli(at_bundle *b, const char *model, const run_result *ra)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) {
        printf("ANYTUNE_BIN not set: the CLI part is run by ctest\n");
        return;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s infer --model %s --images " IMG_A " --prompt '" QUESTION "' --max_new_tokens %d "
             "--temperature 0 --stream false 2>/dev/null", bin, model, MAX_NEW);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char out[4096] = {0};
    size_t n = fread(out, 1, sizeof out - 1, p);
    int rc = pclose(p);
    out[n] = 0;
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    CHECK_MSG(rc == 0 && !strcmp(out, ra->text), "infer --images (status %d): \"%s\", want \"%s\"", rc, out, ra->text);

    /* the chat: /image PATH, then the question */
    snprintf(cmd, sizeof cmd, "printf '/image " IMG_A "\\n" QUESTION "\\n' | %s infer --model %s --max_new_tokens %d "
             "--temperature 0 2>/dev/null", bin, model, MAX_NEW);
    p = popen(cmd, "r");
    n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    rc = p ? pclose(p) : -1;
    out[n] = 0;
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    CHECK_MSG(rc == 0 && !strcmp(out, ra->text), "infer's chat with /image (status %d): \"%s\", want \"%s\"", rc, out,
              ra->text);

    uint64_t keep = b->image_proc.max_pixels;
    b->image_proc.max_pixels = 3136;
    at_vlm_images im;
    int32_t *ids = NULL;
    size_t small = 0;
    if (prompt_of(b, IMG_A, &im, &ids, &small)) {
        CHECK_MSG(small < (size_t)ra->prompt, "max_pixels 3136: %zu prompt tokens, %d by default", small, ra->prompt);
        snprintf(cmd, sizeof cmd, "%s infer --model %s --images " IMG_A " --prompt '" QUESTION "' --max_new_tokens 2 "
                 "--max_pixels 3136 --verbose 2>&1 >/dev/null", bin, model);
        p = popen(cmd, "r");
        n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        rc = p ? pclose(p) : -1;
        out[n] = 0;
        char want[64];
        snprintf(want, sizeof want, "[prefill: %zu tokens (0 cached)", small);
        CHECK_MSG(rc == 0 && strstr(out, want), "infer --max_pixels 3136 --verbose (status %d) said %s, want %s", rc, out,
                  want);
    }
    free(ids);
    at_vlm_images_free(&im);
    b->image_proc.max_pixels = keep;
}

/* The scheduler's answer to one user message with the image at path. */
static void answer_of(at_bundle *b, const char *path, const char *content, run_result *r)
{
    at_image img = {0};
    at_vlm_images im = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    at_scheduler *s = NULL;
    memset(r, 0, sizeof *r);
    CHECK_OK(at_image_load(path, 0, &img));
    CHECK_OK(at_vlm_images_add(b, &img, path, &im));
    cJSON *m = cJSON_CreateArray(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", content);
    cJSON_AddItemToArray(m, u);
    CHECK_OK(at_vlm_encode_chat(b, m, &im, &ids, &n));
    CHECK_OK(at_scheduler_new(b->decoder, b->tokenizer, 1, 512, &s));
    if (s && ids) sched_run(s, b, &im, ids, n, r);
    at_scheduler_free(s);
    cJSON_Delete(m);
    free(ids);
    at_vlm_images_free(&im);
    at_image_free(&img);
}

/* anytune infer --val_dataset on the vision records: the answers of a
 * record with a tag and of one without equal the scheduler's. */
static void test_dataset(at_bundle *b, const char *model, const char *tmp)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) return;
    char cmd[8192], result[128];
    snprintf(result, sizeof result, "%s/result.jsonl", tmp);
    snprintf(cmd, sizeof cmd, "%s infer --model %s --val_dataset tests/data/datasets/vision/vlm.jsonl --result_path %s "
             "--max_new_tokens %d --temperature 0 --max_batch_size 2 2>/dev/null", bin, model, result, MAX_NEW);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    run_result red, blue;
    answer_of(b, "tests/data/datasets/vision/images/red.png", AT_IMAGE_TAG "What colour is this?", &red);
    answer_of(b, "tests/data/datasets/vision/images/blue.png", "Name the colour.", &blue);
    char *text = NULL;
    CHECK_OK(at_read_file(result, &text, NULL));
    int lines = 0, seen_red = 0, seen_blue = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        lines++;
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ms, 0), "content");
        const cJSON *resp = cJSON_GetObjectItemCaseSensitive(j, "response");
        const cJSON *fin = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
        const cJSON *imgs = cJSON_GetObjectItemCaseSensitive(j, "images");
        CHECK_MSG(cJSON_IsString(fin) && strcmp(fin->valuestring, "error") && cJSON_GetArraySize(imgs) >= 1,
                  "a result line: %.200s", line);
        if (cJSON_IsString(c) && cJSON_IsString(resp) && strstr(c->valuestring, "What colour is this?")) {
            seen_red = 1;
            CHECK_MSG(!strcmp(resp->valuestring, red.text), "red: \"%s\", want \"%s\"", resp->valuestring, red.text);
        }
        if (cJSON_IsString(c) && cJSON_IsString(resp) && strstr(c->valuestring, "Name the colour.")) {
            seen_blue = 1;
            CHECK_MSG(!strcmp(resp->valuestring, blue.text), "blue: \"%s\", want \"%s\"", resp->valuestring,
                      blue.text);
        }
        cJSON_Delete(j);
    }
    CHECK_MSG(lines == 5 && seen_red && seen_blue, "%d result lines (red %d, blue %d)", lines, seen_red, seen_blue);
    free(text);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char tmp[] = "/tmp/anytune-vlm-serve-XXXXXX", model[64], cmd[256];
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(model, sizeof model, "%s/model", tmp);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/make_tiny_vlm.py %s --dtype f32 >/dev/null", model);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    sharpen_model(model);
    at_bundle *b = load(model);
    if (b) {
        CHECK(b->vision != NULL);
        at_vlm_images ia, ib;
        int32_t *ids_a = NULL, *ids_b = NULL;
        size_t na = 0, nb = 0;
        int V = b->decoder->cfg.vocab_size;
        float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
        if (prompt_of(b, IMG_A, &ia, &ids_a, &na) && prompt_of(b, IMG_B, &ib, &ids_b, &nb)) {
            int32_t ref_a[MAX_NEW], ref_b[MAX_NEW];
            int ka = reference(b, &ia, ids_a, na, ref_a, la), kb = reference(b, &ib, ids_b, nb, ref_b, lb);
            /* another image, other logits (well above rounding: the features are O(1)) */
            double diff = 0;
            for (int i = 0; i < V; i++) diff = fabs(la[i] - lb[i]) > diff ? fabs(la[i] - lb[i]) : diff;
            CHECK_MSG(diff > 1e-3, "the two images give the same logits (max difference %g)", diff);
            CHECK_MSG(ka != kb || memcmp(ref_a, ref_b, (size_t)ka * sizeof *ref_a),
                      "the two images give the same tokens");
            size_t first_pad = first_image_token(b, ids_a, na);
            CHECK(first_pad < na && first_pad == first_image_token(b, ids_b, nb));

            at_scheduler *s = NULL;
            CHECK_OK(at_scheduler_new(b->decoder, b->tokenizer, 2, 512, &s));
            run_result ra, ra2, rb;
            sched_run(s, b, &ia, ids_a, na, &ra);
            CHECK_MSG(ra.n == ka && !memcmp(ra.tokens, ref_a, (size_t)ka * sizeof *ref_a),
                      "scheduler: %d tokens (first %d), reference %d (first %d)", ra.n, ra.tokens[0], ka, ref_a[0]);
            CHECK_MSG(ra.encoded == 1 && ra.cached == 0, "first run: %d images encoded, %d cached", ra.encoded,
                      ra.cached);
            sched_run(s, b, &ia, ids_a, na, &ra2);
            CHECK(ra2.n == ka && !memcmp(ra2.tokens, ref_a, (size_t)ka * sizeof *ref_a));
            CHECK_MSG(ra2.encoded == 0 && ra2.cached == (int)na - 1, "repeat: %d images encoded, %d of %zu cached",
                      ra2.encoded, ra2.cached, na);
            sched_run(s, b, &ib, ids_b, nb, &rb);
            CHECK_MSG(rb.n == kb && !memcmp(rb.tokens, ref_b, (size_t)kb * sizeof *ref_b),
                      "image B: scheduler %d tokens, reference %d", rb.n, kb);
            CHECK_MSG(rb.encoded == 1 && (size_t)rb.cached <= first_pad,
                      "image B after A: %d images encoded, %d cached (first image token at %zu)", rb.encoded, rb.cached,
                      first_pad);
            at_scheduler_free(s);
            /* both images in one batch, in a fresh scheduler (no cache) */
            CHECK_OK(at_scheduler_new(b->decoder, b->tokenizer, 2, 512, &s));
            if (s) {
                const at_vlm_images *two_im[2] = {&ia, &ib};
                int32_t *const two_ids[2] = {ids_a, ids_b};
                const size_t two_n[2] = {na, nb};
                run_result two[2];
                sched_run_two(s, b, two_im, two_ids, two_n, two);
                CHECK_MSG(two[0].n == ka && !memcmp(two[0].tokens, ref_a, (size_t)ka * sizeof *ref_a) &&
                              two[1].n == kb && !memcmp(two[1].tokens, ref_b, (size_t)kb * sizeof *ref_b) &&
                              two[0].encoded == 1 && two[1].encoded == 1,
                          "A and B together: %d and %d tokens, %d and %d images encoded", two[0].n, two[1].n,
                          two[0].encoded, two[1].encoded);
            }
            at_scheduler_free(s);

            /* the generator (infer's chat): the same text, and its own prefix cache */
            at_generator *g = NULL;
            CHECK_OK(at_generator_new(b->decoder, b->tokenizer, 512, &g));
            at_gen_params gp = params(b);
            const at_vlm_images *ims[3] = {&ia, &ia, &ib};
            const int32_t *idss[3] = {ids_a, ids_a, ids_b};
            size_t ns[3] = {na, na, nb};
            const char *want[3] = {ra.text, ra.text, rb.text};
            for (int k = 0; g && k < 3; k++) {
                at_prompt_media m = {0};
                CHECK_OK(at_vlm_media(b, idss[k], ns[k], ims[k], &m));
                char *text = NULL;
                at_gen_stats st;
                CHECK_OK(at_generator_run_media(g, idss[k], ns[k], &m, &gp, NULL, NULL, &text, NULL, &st));
                CHECK_MSG(text && !strcmp(text, want[k]), "generator run %d: \"%s\", want \"%s\"", k,
                          text ? text : "", want[k]);
                int cached = st.prompt_tokens - st.prefilled_tokens;
                CHECK_MSG(k == 1 ? st.images_encoded == 0 && cached == (int)na - 1
                                 : st.images_encoded == 1 && (size_t)cached <= first_pad,
                          "generator run %d: %d images encoded, %d cached", k, st.images_encoded, cached);
                free(text);
                at_vlm_media_free(&m);
            }
            at_generator_free(g);

            test_cli(b, model, &ra);
            test_dataset(b, model, tmp);
            test_server(b, tmp, &ra, &rb, first_pad);
        }
        free(la);
        free(lb);
        free(ids_a);
        free(ids_b);
        at_vlm_images_free(&ia);
        at_vlm_images_free(&ib);
    }
    at_bundle_free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
    return at_test_result("test_vlm_serve");
}
