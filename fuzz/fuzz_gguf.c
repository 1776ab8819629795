/* Fuzz target: the GGUF reader on arbitrary bytes; walks every value (array
 * elements included) and makes every tensor into an at_tensor, converting
 * small ones to f32. Must not crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "model/config.h"
#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const at_gguf_value *v, int depth)
{
    int64_t i64;
    uint64_t u64;
    double f;
    (void)at_gguf_value_int(v, &i64);
    (void)at_gguf_value_uint(v, &u64);
    (void)at_gguf_value_float(v, &f);
    if (v->type == AT_GGUF_STRING) (void)strlen(v->v.str.s);
    if (v->type != AT_GGUF_ARRAY || depth > 16) return;
    size_t n = v->v.arr.count < 4096 ? v->v.arr.count : 4096;
    for (size_t i = 0; i < n; i++) {
        at_gguf_value e;
        if (at_gguf_value_elem(v, i, &e) == AT_OK) walk(&e, depth + 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* 64-byte aligned copy, like a page-aligned mapping. */
    uint8_t *buf = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    if (!buf) return 0;
    memcpy(buf, data, size);
    at_gguf *g = NULL;
    if (at_gguf_parse(buf, size, "fuzz", &g) == AT_OK) {
        for (size_t i = 0; i < at_gguf_kv_count(g); i++) {
            walk(at_gguf_kv_value(g, i), 0);
            (void)at_gguf_get(g, at_gguf_kv_key(g, i));
        }
        for (size_t i = 0; i < at_gguf_tensor_count(g); i++) {
            const at_gguf_tensor_info *ti = at_gguf_tensor_at(g, i);
            (void)at_gguf_find_tensor(g, ti->name);
            char hf[128];
            (void)at_gguf_name_to_hf(ti->name, hf, sizeof hf);
            at_tensor *t = NULL;
            if (at_gguf_tensor(g, ti, AT_GGUF_KEEP_DTYPE, &t) == AT_OK) at_tensor_free(t);
            if (ti->nbytes <= (1u << 20) && at_gguf_tensor(g, ti, AT_F32, &t) == AT_OK) at_tensor_free(t);
        }
        at_model_config cfg;
        (void)at_model_config_from_gguf(g, "fuzz", &cfg);
        (void)at_gguf_qk_interleaved(g);
        at_gguf_close(g);
    }
    free(buf);
    return 0;
}
