#include "infer/vlm.h"

#include <stdlib.h>
#include <string.h>
#include "base/sha256.h"
#include "data/media.h"
#include "model/mrope.h"

static at_status need_vision(const at_bundle *b)
{
    if (!b->vision)
        return at_error(AT_ERR_UNSUPPORTED, "the model %s reads no images (it has no vision tower: a Qwen2-VL or "
                        "Qwen2.5-VL folder does)", b->name);
    return AT_OK;
}

void at_vlm_images_free(at_vlm_images *im)
{
    free(im->pixels);
    free(im->grid);
    free(im->tokens);
    free(im->hash);
    memset(im, 0, sizeof *im);
}

at_status at_vlm_images_add(const at_bundle *b, const at_image *img, const char *name, at_vlm_images *im)
{
    AT_TRY(need_vision(b));
    const at_vision_config *vc = at_vision_get_config(b->vision);
    at_image_patches pp = {0};
    AT_TRY(at_image_to_patches(&b->image_proc, img, name, &pp));
    at_status st = AT_OK;
    size_t dim = (size_t)vc->in_chans * (size_t)vc->temporal_patch_size * (size_t)vc->patch_size * (size_t)vc->patch_size;
    if (pp.patch_dim != dim || b->image_proc.merge_size != vc->spatial_merge_size) {
        st = at_error(AT_ERR_FORMAT, "%s: preprocessor_config.json makes patches of %zu values (merge %d); the vision "
                      "tower takes %zu (merge %d)", b->name, pp.patch_dim, b->image_proc.merge_size, dim,
                      vc->spatial_merge_size);
        goto done;
    }
    size_t n = (size_t)im->n + 1, total = (size_t)im->n_patches + pp.n_patches;
    float *px = realloc(im->pixels, total * dim * sizeof *px);
    if (px) im->pixels = px;
    int32_t(*grid)[3] = realloc(im->grid, n * sizeof *grid);
    if (grid) im->grid = grid;
    size_t *tokens = realloc(im->tokens, n * sizeof *tokens);
    if (tokens) im->tokens = tokens;
    uint64_t *hash = realloc(im->hash, n * sizeof *hash);
    if (hash) im->hash = hash;
    if (!px || !grid || !tokens || !hash) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    memcpy(im->pixels + (size_t)im->n_patches * dim, pp.values, pp.n_patches * dim * sizeof *px);
    int32_t g[3] = {pp.grid_t, pp.grid_h, pp.grid_w};
    memcpy(im->grid[im->n], g, sizeof g);
    im->tokens[im->n] = at_image_patches_tokens(&pp, vc->spatial_merge_size);
    /* the key of the prefix caches: the pixel values the tower sees, and their grid */
    at_sha256 h;
    uint8_t d[32];
    at_sha256_init(&h);
    at_sha256_update(&h, g, sizeof g);
    at_sha256_update(&h, pp.values, pp.n_patches * dim * sizeof *pp.values);
    at_sha256_final(&h, d);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | d[i];
    im->hash[im->n] = v;
    im->n_patches = (int64_t)total;
    im->patch_dim = dim;
    im->n++;
done:
    at_image_patches_free(&pp);
    return st;
}

/* s with every "<image>" replaced by the template's image text (a new string). */
static char *render_tags(const char *s, size_t *count)
{
    size_t k = 0, tl = strlen(AT_IMAGE_TAG), rl = strlen(AT_QWEN2VL_IMAGE_TEXT);
    for (const char *p = strstr(s, AT_IMAGE_TAG); p; p = strstr(p + tl, AT_IMAGE_TAG)) k++;
    *count += k;
    char *out = malloc(strlen(s) + k * rl + 1), *o = out;
    if (!out) return NULL;
    for (const char *p; (p = strstr(s, AT_IMAGE_TAG)); s = p + tl) {
        memcpy(o, s, (size_t)(p - s));
        o += p - s;
        memcpy(o, AT_QWEN2VL_IMAGE_TEXT, rl);
        o += rl;
    }
    strcpy(o, s);
    return out;
}

at_status at_vlm_encode_chat(const at_bundle *b, const cJSON *messages, const at_vlm_images *im, int32_t **ids,
                             size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!im || im->n == 0) return at_bundle_encode_chat(b, messages, ids, n);
    AT_TRY(need_vision(b));
    at_status st = AT_OK;
    at_encoded e = {0};
    cJSON *copy = cJSON_Duplicate(messages, 1);
    if (!copy) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t tags = 0;
    cJSON *m, *first_user = NULL;
    cJSON_ArrayForEach(m, copy) {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!first_user && cJSON_IsString(role) && !strcmp(role->valuestring, "user")) first_user = m;
        if (!cJSON_IsString(c)) continue;
        char *r = render_tags(c->valuestring, &tags);
        if (!r || !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(r))) {
            free(r);
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        free(r);
    }
    if (tags == 0) { /* no tag: the images go first in the first user message */
        cJSON *c = first_user ? cJSON_GetObjectItemCaseSensitive(first_user, "content") : NULL;
        if (!cJSON_IsString(c)) {
            st = at_error(AT_ERR_INVALID, "%d images and no user message to put them in", im->n);
            goto done;
        }
        size_t rl = strlen(AT_QWEN2VL_IMAGE_TEXT), cl = strlen(c->valuestring);
        char *s = malloc((size_t)im->n * rl + cl + 1);
        if (!s) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < im->n; i++) memcpy(s + (size_t)i * rl, AT_QWEN2VL_IMAGE_TEXT, rl);
        memcpy(s + (size_t)im->n * rl, c->valuestring, cl + 1);
        cJSON_ReplaceItemInObjectCaseSensitive(first_user, "content", cJSON_CreateString(s));
        free(s);
        tags = (size_t)im->n;
    }
    if (tags != (size_t)im->n) {
        st = at_error(AT_ERR_INVALID, "the messages hold %zu <image> tags for %d images (one tag per image, in order, "
                      "or none)", tags, im->n);
        goto done;
    }
    AT_CHECK(at_bundle_encode_chat(b, copy, &e.ids, &e.n));
    st = at_media_expand_pads(&e, at_vision_get_config(b->vision)->image_token_id, im->tokens, (size_t)im->n);
    if (st != AT_OK) {
        at_encoded_free(&e);
        goto done;
    }
    free(e.labels);
    *ids = e.ids;
    *n = e.n;
done:
    cJSON_Delete(copy);
    return st;
}

void at_vlm_media_free(at_prompt_media *m)
{
    free((void *)m->keys);
    free((void *)m->mrope_pos);
    memset(m, 0, sizeof *m);
}

at_status at_vlm_media(const at_bundle *b, const int32_t *ids, size_t n, const at_vlm_images *im,
                       at_prompt_media *out)
{
    memset(out, 0, sizeof *out);
    AT_TRY(need_vision(b));
    const at_vision_config *vc = at_vision_get_config(b->vision);
    uint64_t *keys = malloc((n ? n : 1) * sizeof *keys);
    int32_t *pos = malloc((n ? n : 1) * 3 * sizeof *pos), *planar = malloc((n ? n : 1) * 3 * sizeof *planar);
    at_status st = AT_OK;
    if (!keys || !pos || !planar) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    at_mrope_tokens tk = {vc->image_token_id, vc->video_token_id, vc->vision_start_token_id, vc->spatial_merge_size};
    int n_img = im ? im->n : 0;
    AT_CHECK(at_mrope_position_ids(&tk, ids, n, n_img ? (const int32_t(*)[3])im->grid : NULL, (size_t)n_img, planar,
                                   NULL));
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) pos[i * 3 + (size_t)k] = planar[(size_t)k * n + i];
    /* image tokens in order: image `img`, its token j */
    size_t img = 0, j = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != vc->image_token_id || !n_img) {
            keys[i] = at_prompt_text_key(ids[i]);
            continue;
        }
        while (img < (size_t)n_img && j == im->tokens[img]) img++, j = 0;
        if (img == (size_t)n_img) {
            st = at_error(AT_ERR_INVALID, "the prompt has more image tokens than its %d images make", n_img);
            goto done;
        }
        keys[i] = 1ull << 63 | ((im->hash[img] ^ (j + 1) * 0x9E3779B97F4A7C15ull) >> 1);
        j++;
    }
    out->vision = b->vision;
    out->n_images = n_img;
    out->pixels = n_img ? im->pixels : NULL;
    out->n_patches = n_img ? im->n_patches : 0;
    out->grid_thw = n_img ? (const int32_t(*)[3])im->grid : NULL;
    out->image_token = vc->image_token_id;
    out->keys = keys;
    out->mrope_pos = pos;
    keys = NULL;
    pos = NULL;
done:
    free(keys);
    free(pos);
    free(planar);
    return st;
}
