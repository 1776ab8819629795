/* Images in dataset records, and their tokens (see media.h). */
#include "data/media.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static at_status media_push(at_arena *a, at_media_list *list, const char *ref) {
    if (list->n == list->cap) {
        size_t cap = list->cap ? 2 * list->cap : 4;
        const char **items = at_arena_alloc(a, cap * sizeof *items);
        if (!items) return at_error(AT_ERR_NOMEM, "out of memory reading images");
        if (list->n) memcpy(items, list->items, list->n * sizeof *items);
        list->items = items;
        list->cap = cap;
    }
    list->items[list->n++] = ref;
    return AT_OK;
}

at_status at_media_add_ref(at_arena *a, const char *base_dir, const cJSON *v, const char *where, at_media_list *list) {
    if (cJSON_IsObject(v)) { /* {"path"}, {"url"}, {"image"}, {"bytes"} (Hugging Face's Image feature) */
        static const char *const keys[] = {"path", "url", "image", "bytes", "base64", NULL};
        const cJSON *s = NULL;
        for (int i = 0; keys[i] && !cJSON_IsString(s); i++) s = cJSON_GetObjectItemCaseSensitive(v, keys[i]);
        if (!cJSON_IsString(s))
            return at_error(AT_ERR_FORMAT, "%s: an image object needs a \"path\", \"url\" or \"bytes\" string", where);
        v = s;
    }
    if (!cJSON_IsString(v)) return at_error(AT_ERR_FORMAT, "%s: an image must be a path, a data URL or base64", where);
    const char *s = v->valuestring;
    size_t n = strlen(s);
    if (n == 0) return at_error(AT_ERR_FORMAT, "%s: empty image reference", where);
    if (!strncmp(s, "http://", 7) || !strncmp(s, "https://", 8))
        return at_error(AT_ERR_UNSUPPORTED, "%s: %.80s: images are never downloaded; give a local path or base64 data",
                        where, s);
    const char *ref;
    if (!strncmp(s, "data:", 5) || n > 200 || s[0] == '/' || !base_dir || !strcmp(base_dir, ".")) {
        ref = at_arena_strndup(a, s, n);
    } else {
        if (!strncmp(s, "file://", 7)) s += 7;
        size_t nb = strlen(base_dir), ns = strlen(s);
        char *p = at_arena_alloc(a, nb + ns + 2);
        if (p) {
            memcpy(p, base_dir, nb);
            p[nb] = '/';
            memcpy(p + nb + 1, s, ns + 1);
        }
        ref = p;
    }
    if (!ref) return at_error(AT_ERR_NOMEM, "out of memory reading images");
    return media_push(a, list, ref);
}

at_status at_media_content_text(at_arena *a, const char *base_dir, const cJSON *content, const char *where,
                                const char **text, at_media_list *list) {
    size_t len = 0, i = 0;
    const cJSON *part;
    /* first pass: the text's length and the parts' validity */
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return at_error(AT_ERR_FORMAT, "%s[%zu]: a content part needs a \"type\"", where, i);
        const char *t = type->valuestring;
        if (!strcmp(t, "text")) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(s)) return at_error(AT_ERR_FORMAT, "%s[%zu]: a text part needs a \"text\" string", where, i);
            len += strlen(s->valuestring);
        } else if (!strcmp(t, "image_url") || !strcmp(t, "image")) {
            len += strlen(AT_IMAGE_TAG);
        } else {
            return at_error(AT_ERR_UNSUPPORTED, "%s[%zu]: content parts of type \"%.40s\" are not read (text, image_url, "
                            "image are)", where, i, t);
        }
        i++;
    }
    char *out = at_arena_alloc(a, len + 1), *o = out;
    if (!out) return at_error(AT_ERR_NOMEM, "out of memory reading a content list");
    i = 0;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "type")->valuestring;
        const char *piece = AT_IMAGE_TAG;
        if (!strcmp(t, "text")) {
            piece = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        } else {
            if (!list)
                return at_error(AT_ERR_UNSUPPORTED, "%s[%zu]: images are read in conversations only", where, i);
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(part, t);
            char w[96];
            snprintf(w, sizeof w, "%s[%zu].%s", where, i, t);
            if (!v) return at_error(AT_ERR_FORMAT, "%s is missing", w);
            AT_TRY(at_media_add_ref(a, base_dir, v, w, list));
        }
        size_t n = strlen(piece);
        memcpy(o, piece, n);
        o += n;
        i++;
    }
    *o = '\0';
    *text = out;
    return AT_OK;
}

static size_t count_tags(const char *s) {
    size_t n = 0;
    for (const char *p = strstr(s, AT_IMAGE_TAG); p; p = strstr(p + strlen(AT_IMAGE_TAG), AT_IMAGE_TAG)) n++;
    return n;
}

size_t at_media_count_tags(const at_messages *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++) n += count_tags(m->items[i].content);
    return n;
}

char *at_media_base_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

at_status at_base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_len) {
    *out = malloc(len / 4 * 3 + 3);
    if (!*out) return at_error(AT_ERR_NOMEM, "out of memory decoding base64");
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0, pad = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+' || c == '-') v = 62; /* '-' and '_': the URL-safe alphabet */
        else if (c == '/' || c == '_') v = 63;
        else if (c == '=') { pad++; continue; }
        else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        else {
            free(*out);
            *out = NULL;
            return at_error(AT_ERR_FORMAT, "invalid base64 character 0x%02x at byte %zu", c, i);
        }
        if (pad) {
            free(*out);
            *out = NULL;
            return at_error(AT_ERR_FORMAT, "base64 data after '=' padding (byte %zu)", i);
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            (*out)[o++] = (uint8_t)(acc >> bits);
        }
    }
    *out_len = o;
    return AT_OK;
}

at_status at_media_load_image(const char *ref, uint64_t max_pixels, at_image *out) {
    memset(out, 0, sizeof *out);
    const char *b64 = NULL;
    if (!strncmp(ref, "data:", 5)) {
        const char *comma = strchr(ref, ',');
        if (!comma || !strstr(ref, ";base64,") || strstr(ref, ";base64,") + 7 != comma)
            return at_error(AT_ERR_FORMAT, "data URL \"%.60s...\": only base64 data URLs are read", ref);
        b64 = comma + 1;
    } else if (strlen(ref) > 200) {
        b64 = ref;
    }
    if (!b64) return at_image_load(ref, max_pixels, out);
    uint8_t *bytes = NULL;
    size_t n = 0;
    at_status st = at_base64_decode(b64, strlen(b64), &bytes, &n);
    if (st != AT_OK) return at_error_wrap(st, "base64 image");
    st = at_image_decode(bytes, n, "base64 image", max_pixels, out);
    free(bytes);
    return st;
}

at_status at_media_replace_tags(at_arena *a, const at_messages *m, const char *replacement, at_messages *out) {
    at_message *items = at_arena_alloc(a, (m->n ? m->n : 1) * sizeof *items);
    if (!items) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t tl = strlen(AT_IMAGE_TAG), rl = strlen(replacement);
    for (size_t i = 0; i < m->n; i++) {
        items[i] = m->items[i];
        const char *c = m->items[i].content;
        size_t k = count_tags(c);
        if (!k) continue;
        char *s = at_arena_alloc(a, strlen(c) + k * rl + 1), *o = s;
        if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
        for (const char *p; (p = strstr(c, AT_IMAGE_TAG));) {
            memcpy(o, c, (size_t)(p - c));
            o += p - c;
            memcpy(o, replacement, rl);
            o += rl;
            c = p + tl;
        }
        strcpy(o, c);
        items[i].content = s;
    }
    *out = (at_messages){items, m->n};
    return AT_OK;
}

at_status at_media_expand_pads(at_encoded *e, int32_t pad_id, const size_t *counts, size_t n) {
    size_t found = 0, total = e->n;
    for (size_t i = 0; i < e->n; i++) {
        if (e->ids[i] != pad_id) continue;
        if (found < n) total += counts[found] - 1;
        found++;
    }
    if (found != n)
        return at_error(AT_ERR_INVALID, "%zu image placeholder tokens for %zu images (was an image cut by "
                        "max_length?)", found, n);
    int32_t *ids = malloc((total ? total : 1) * sizeof *ids), *labels = malloc((total ? total : 1) * sizeof *labels);
    if (!ids || !labels) {
        free(ids);
        free(labels);
        return at_error(AT_ERR_NOMEM, "out of memory expanding %zu image tokens", total);
    }
    size_t o = 0, img = 0;
    for (size_t i = 0; i < e->n; i++) {
        if (e->ids[i] == pad_id) {
            for (size_t k = 0; k < counts[img]; k++, o++) {
                ids[o] = pad_id;
                labels[o] = AT_IGNORE_INDEX;
            }
            img++;
        } else {
            ids[o] = e->ids[i];
            labels[o++] = e->labels ? e->labels[i] : AT_IGNORE_INDEX;
        }
    }
    free(e->ids);
    free(e->labels);
    e->ids = ids;
    e->labels = labels;
    e->n = total;
    return AT_OK;
}

at_status at_media_image_tokens(const at_image_processor *p, const char *ref, uint64_t max_pixels, size_t *tokens) {
    at_image img;
    AT_TRY(at_media_load_image(ref, max_pixels, &img));
    int h = img.height, w = img.width, f = p->patch_size * p->merge_size;
    at_image_free(&img);
    if (p->do_resize) {
        at_status st = at_smart_resize(h, w, f, p->min_pixels, p->max_pixels, &h, &w);
        if (st != AT_OK) return at_error_wrap(st, "%.200s", ref);
    }
    *tokens = (size_t)(h / p->patch_size) * (size_t)(w / p->patch_size) / ((size_t)p->merge_size * p->merge_size);
    return AT_OK;
}

at_status at_media_encode(const at_encoder *enc, const at_sample *s, int32_t pad_id, const size_t *counts,
                          at_encoded *out, int *dropped) {
    at_arena tmp = {0};
    at_sample c = *s;
    at_encoder e = *enc;
    e.max_length = 0; /* applied below, to the expanded sequence */
    *dropped = 0;
    memset(out, 0, sizeof *out);
    /* (without images "<image>" is plain text: see media.h) */
    at_status st = s->n_images ? at_media_replace_tags(&tmp, &s->messages, AT_QWEN2VL_IMAGE_TEXT, &c.messages) : AT_OK;
    if (st == AT_OK) st = at_encode_sample(&e, &c, out, dropped);
    if (st == AT_OK && !*dropped) st = at_media_expand_pads(out, pad_id, counts, s->n_images);
    if (st == AT_OK && enc->max_length && out->n > enc->max_length) {
        at_encoded_free(out);
        *dropped = 1;
    }
    if (st != AT_OK) at_encoded_free(out);
    at_arena_free(&tmp);
    return st;
}
