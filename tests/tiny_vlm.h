/* The tiny random Qwen-VL folders of the tests (tools/make_tiny_vlm.py, f32)
 * made to depend on their images: test_vlm_serve, test_vlm_llamacpp. */
#ifndef AT_TEST_TINY_VLM_H
#define AT_TEST_TINY_VLM_H

#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"
#include "testing.h"

/* Rewrites dir/model.safetensors (f32) so that its answers depend on its
 * images: every layer's attention output projection times 30 (the
 * residual stream at the last token is then mostly attention over the
 * prompt, a fifth of which is the image), and the embedding rows of ids the
 * trimmed tokenizer lacks zeroed (tied, so their logits are 0 and a greedy
 * answer, the largest of ~7000 positive-tailed logits, is always text).
 * tower_qkv (1: unchanged) scales every tower block's attn.qkv and
 * attn.proj weights: the random tower's attention is nearly uniform and
 * small beside the residual, so an error in its q, k or rotary would hardly
 * change the features; scaled, the scores spread and the output weighs. */
static inline void tiny_vlm_sharpen(const char *dir, float tower_qkv)
{
    char path[512];
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
    int scaled = 0, zeroed = 0, tower = 0;
    for (size_t i = 0; at_st_info_at(f, i); i++) {
        const at_st_info *t = at_st_info_at(f, i);
        uint8_t *p = (uint8_t *)data + (t->data - (const uint8_t *)data);
        int o_proj = strstr(t->name, "self_attn.o_proj.weight") != NULL, embed = !strcmp(t->name, "model.embed_tokens.weight");
        int qkv = tower_qkv != 1.0f && strstr(t->name, "visual.blocks.") &&
                  (strstr(t->name, ".attn.qkv.weight") || strstr(t->name, ".attn.proj.weight"));
        if ((o_proj || embed || qkv) && !(t->has_dtype && t->dtype == AT_F32)) {
            CHECK_MSG(0, "%s: not f32", t->name);
        } else if (o_proj || qkv) {
            float s = o_proj ? 30.0f : tower_qkv;
            for (size_t k = 0; k < t->nbytes; k += 4) {
                float v;
                memcpy(&v, p + k, 4);
                v *= s;
                memcpy(p + k, &v, 4);
            }
            if (o_proj) scaled++;
            else tower++;
        } else if (embed) {
            size_t row = (size_t)t->shape[1] * 4;
            for (int64_t id = 0; id < t->shape[0]; id++)
                if (!at_tokenizer_id_to_token(tok, (int32_t)id)) memset(p + (size_t)id * row, 0, row), zeroed++;
        }
    }
    CHECK_MSG(scaled == 2 && zeroed > 100000 && (tower_qkv == 1.0f || tower == 4),
              "tiny_vlm_sharpen: %d projections scaled, %d rows zeroed, %d tower blocks", scaled, zeroed, tower);
    CHECK_OK(at_write_file_atomic(path, data, len));
done:
    at_st_close(f);
    at_tokenizer_free(tok);
    free(data);
}

#endif
