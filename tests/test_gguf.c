/* GGUF: reading files written by an independent encoder
 * (tools/make_fuzz_seeds.py) and by llama.cpp's converters (the real model
 * files), hostile files, and the writer's round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "model/config.h"
#include "model/gguf.h"
#include "testing.h"

#define CHECK_ERR_HAS(expr, code, text) do { at_status s2_ = (expr); CHECK_MSG(s2_ == (code), "%s: got %s", #expr, \
    at_status_name(s2_)); CHECK_MSG(strstr(at_last_error(), text) != NULL, "message \"%s\" lacks \"%s\"", \
    at_last_error(), text); } while (0)

static const char *str_of(const at_gguf *g, const char *key)
{
    const char *s = NULL;
    return at_gguf_get_string(g, key, &s, NULL) == AT_OK ? s : "";
}

/* valid_all_types.gguf: values listed in tools/make_fuzz_seeds.py (GGUF_KVS). */
static void check_all_types(const at_gguf *g)
{
    int64_t i;
    uint64_t u;
    double f;
    int b;
    CHECK(at_gguf_version(g) == 3);
    CHECK(at_gguf_alignment(g) == 64);
    CHECK(at_gguf_data_offset(g) % 64 == 0);
    CHECK(at_gguf_get_uint(g, "t.u8", &u) == AT_OK && u == 200);
    CHECK(at_gguf_get(g, "t.u8")->type == AT_GGUF_UINT8);
    CHECK(at_gguf_get_int(g, "t.i8", &i) == AT_OK && i == -100);
    CHECK(at_gguf_get_uint(g, "t.u16", &u) == AT_OK && u == 60000);
    CHECK(at_gguf_get_int(g, "t.i16", &i) == AT_OK && i == -30000);
    CHECK(at_gguf_get_uint(g, "t.u32", &u) == AT_OK && u == 4000000000u);
    CHECK(at_gguf_get_int(g, "t.i32", &i) == AT_OK && i == -2000000000);
    CHECK(at_gguf_get_float(g, "t.f32", &f) == AT_OK && f == 1.5);
    CHECK(at_gguf_get_bool(g, "t.bool", &b) == AT_OK && b == 1);
    CHECK(strcmp(str_of(g, "t.str"), "h\xc3\xa9llo") == 0);
    CHECK(at_gguf_get_uint(g, "t.u64", &u) == AT_OK && u == 9223372036854775813ull);
    CHECK(at_gguf_get_int(g, "t.u64", &i) == AT_ERR_FORMAT); /* does not fit an int64 */
    CHECK(at_gguf_get_int(g, "t.i64", &i) == AT_OK && i == -(INT64_C(1) << 62));
    CHECK(at_gguf_get_float(g, "t.f64", &f) == AT_OK && f == -0.125);
    CHECK(at_gguf_get_int(g, "nope", &i) == AT_ERR_NOT_FOUND);
    CHECK_ERR_HAS(at_gguf_get_int(g, "t.str", &i), AT_ERR_FORMAT, "t.str");
    CHECK_ERR_HAS(at_gguf_get_bool(g, "t.u8", &b), AT_ERR_FORMAT, "t.u8");

    at_gguf_type et;
    size_t n;
    at_gguf_value e;
    CHECK(at_gguf_get_array(g, "t.arr_i32", &et, &n) == AT_OK && et == AT_GGUF_INT32 && n == 3);
    const at_gguf_value *a = at_gguf_get(g, "t.arr_i32");
    CHECK(at_gguf_value_elem(a, 1, &e) == AT_OK && e.type == AT_GGUF_INT32 && e.v.i == -2);
    CHECK(at_gguf_value_elem(a, 3, &e) == AT_ERR_INVALID);
    CHECK(at_gguf_get_array(g, "t.arr_str", &et, &n) == AT_OK && et == AT_GGUF_STRING && n == 3);
    a = at_gguf_get(g, "t.arr_str");
    CHECK(at_gguf_value_elem(a, 2, &e) == AT_OK && e.v.str.len == 3 && strcmp(e.v.str.s, "ccc") == 0);
    CHECK(at_gguf_value_elem(a, 1, &e) == AT_OK && e.v.str.len == 0 && e.v.str.s[0] == '\0');
    a = at_gguf_get(g, "t.arr_nested");
    CHECK(a && a->v.arr.type == AT_GGUF_ARRAY && a->v.arr.count == 2);
    at_gguf_value inner, s;
    CHECK(at_gguf_value_elem(a, 0, &inner) == AT_OK && inner.v.arr.count == 2);
    CHECK(at_gguf_value_elem(&inner, 1, &s) == AT_OK && strcmp(s.v.str.s, "y") == 0);
    CHECK(at_gguf_value_elem(a, 1, &inner) == AT_OK && inner.v.arr.count == 1);
    CHECK(at_gguf_get_array(g, "t.arr_empty", &et, &n) == AT_OK && et == AT_GGUF_FLOAT32 && n == 0);

    CHECK(at_gguf_tensor_count(g) == 5);
    const at_gguf_tensor_info *ti = at_gguf_find_tensor(g, "a.f32");
    CHECK(ti && ti->n_dims == 2 && ti->ne[0] == 3 && ti->ne[1] == 2 && ti->type == AT_GGML_F32);
    at_tensor *t = NULL;
    CHECK_OK(at_gguf_get_tensor(g, "a.f32", AT_GGUF_KEEP_DTYPE, &t));
    if (t) {
        /* PyTorch order [2, 3]; zero-copy: the data is the mapped bytes. */
        CHECK(t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->dtype == AT_F32);
        CHECK(at_tensor_data(t) == (void *)ti->data);
        CHECK(((float *)at_tensor_data(t))[5] == 6.0f);
        at_tensor_free(t);
    }
    CHECK_OK(at_gguf_get_tensor(g, "a.f32", AT_BF16, &t));
    if (t) {
        CHECK(t->dtype == AT_BF16 && ((uint16_t *)at_tensor_data(t))[1] == 0x4000); /* 2.0 */
        at_tensor_free(t);
    }
    static const struct {
        const char *name;
        float want[3];
    } conv[] = {{"a.f16", {1, -2, 0}}, {"a.bf16", {1, 3, 0}}};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(at_gguf_get_tensor(g, conv[k].name, AT_F32, &t));
        if (!t) continue;
        CHECK(((float *)at_tensor_data(t))[0] == conv[k].want[0] && ((float *)at_tensor_data(t))[1] == conv[k].want[1]);
        at_tensor_free(t);
    }
    /* Q8_0: d = 0.5, q[j] = j - 16;  Q4_0: d = 2, nibble[j] = j % 16, x = d * (nibble - 8). */
    CHECK_OK(at_gguf_get_tensor(g, "a.q8_0", AT_F32, &t));
    if (t) {
        int ok = t->ndim == 1 && t->shape[0] == 32;
        for (int j = 0; j < 32 && ok; j++) ok = ((float *)at_tensor_data(t))[j] == 0.5f * (float)(j - 16);
        CHECK(ok);
        at_tensor_free(t);
    }
    CHECK_OK(at_gguf_get_tensor(g, "a.q4_0", AT_F32, &t));
    if (t) {
        int ok = 1;
        for (int j = 0; j < 32 && ok; j++) ok = ((float *)at_tensor_data(t))[j] == 2.0f * (float)(j % 16 - 8);
        CHECK(ok);
        at_tensor_free(t);
    }
    CHECK_OK(at_gguf_get_tensor(g, "a.q8_0", AT_GGUF_KEEP_DTYPE, &t));
    if (t) {
        CHECK(t->dtype == AT_Q8_0 && at_tensor_nbytes(t) == 34);
        at_tensor_free(t);
    }
    CHECK_ERR_HAS(at_gguf_get_tensor(g, "a.missing", AT_F32, &t), AT_ERR_NOT_FOUND, "a.missing");
}

static void test_independent_file(void)
{
    at_gguf *g = NULL;
    CHECK_OK(at_gguf_open("tests/fuzz/gguf/valid_all_types.gguf", &g));
    if (!g) return;
    check_all_types(g);

    /* Writer round trip: copy every value and tensor into a new file. */
    at_gguf_writer *w = NULL;
    CHECK_OK(at_gguf_writer_new(&w));
    for (size_t i = 0; i < at_gguf_kv_count(g); i++)
        CHECK_OK(at_gguf_add_value(w, at_gguf_kv_key(g, i), at_gguf_kv_value(g, i)));
    CHECK(at_gguf_add_u8(w, "t.u8", 1) == AT_ERR_INVALID); /* duplicate key */
    for (size_t i = 0; i < at_gguf_tensor_count(g); i++) {
        const at_gguf_tensor_info *ti = at_gguf_tensor_at(g, i);
        CHECK_OK(at_gguf_add_tensor(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, ti->nbytes));
    }
    const at_gguf_tensor_info *t0 = at_gguf_tensor_at(g, 0);
    CHECK(at_gguf_add_tensor(w, "bad", AT_GGML_F32, 1, t0->ne, t0->data, 7) == AT_ERR_INVALID);
    char path[] = "/tmp/at_gguf_rt_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_OK(at_gguf_write(w, path));
    at_gguf_writer_free(w);
    at_gguf *g2 = NULL;
    CHECK_OK(at_gguf_open(path, &g2));
    if (g2) {
        check_all_types(g2);
        for (size_t i = 0; i < at_gguf_tensor_count(g); i++) {
            const at_gguf_tensor_info *a = at_gguf_tensor_at(g, i), *b = at_gguf_tensor_at(g2, i);
            CHECK(strcmp(a->name, b->name) == 0 && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0);
        }
        at_gguf_close(g2);
    }
    /* The same bytes as the independent encoder wrote (same layout rules). */
    char *x = NULL, *y = NULL;
    size_t xl = 0, yl = 0;
    CHECK_OK(at_read_file("tests/fuzz/gguf/valid_all_types.gguf", &x, &xl));
    CHECK_OK(at_read_file(path, &y, &yl));
    CHECK(x && y && xl == yl && memcmp(x, y, xl) == 0);
    free(x);
    free(y);
    unlink(path);
    at_gguf_close(g);
}

static void test_writer_types(void)
{
    /* Every add_* entry point and at_tensor tensors, read back. */
    at_gguf_writer *w = NULL;
    CHECK_OK(at_gguf_writer_new(&w));
    CHECK_OK(at_gguf_add_u8(w, "u8", 255));
    CHECK_OK(at_gguf_add_i8(w, "i8", -128));
    CHECK_OK(at_gguf_add_u16(w, "u16", 65535));
    CHECK_OK(at_gguf_add_i16(w, "i16", -32768));
    CHECK_OK(at_gguf_add_u32(w, "u32", 0xffffffffu));
    CHECK_OK(at_gguf_add_i32(w, "i32", INT32_MIN));
    CHECK_OK(at_gguf_add_u64(w, "u64", UINT64_MAX));
    CHECK_OK(at_gguf_add_i64(w, "i64", INT64_MIN));
    CHECK_OK(at_gguf_add_f32(w, "f32", 0.1f));
    CHECK_OK(at_gguf_add_f64(w, "f64", 0.1));
    CHECK_OK(at_gguf_add_bool(w, "bool", 0));
    CHECK_OK(at_gguf_add_string(w, "str", "x y z"));
    const float fa[3] = {1.0f, -0.0f, 3e38f};
    CHECK_OK(at_gguf_add_array(w, "arr_f32", AT_GGUF_FLOAT32, fa, 3));
    const uint8_t ba[2] = {1, 0};
    CHECK_OK(at_gguf_add_array(w, "arr_bool", AT_GGUF_BOOL, ba, 2));
    const char *sa[2] = {"<s>", "</s>"};
    CHECK_OK(at_gguf_add_string_array(w, "arr_str", sa, 2));
    CHECK(at_gguf_add_array(w, "arr_bad", AT_GGUF_STRING, sa, 2) == AT_ERR_INVALID);
    float data[2][32];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 32; j++) data[r][j] = (float)(r * 32 + j);
    at_tensor *t = NULL;
    const int64_t shape[2] = {2, 32};
    CHECK_OK(at_tensor_wrap(data, AT_F32, 2, shape, "m", &t));
    CHECK_OK(at_gguf_add_at_tensor(w, NULL, t));
    CHECK(at_gguf_add_at_tensor(w, NULL, t) == AT_ERR_INVALID); /* duplicate name */
    char path[] = "/tmp/at_gguf_w_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK_OK(at_gguf_write(w, path));
    at_gguf_writer_free(w);
    at_gguf *g = NULL;
    CHECK_OK(at_gguf_open(path, &g));
    if (g) {
        uint64_t u;
        int64_t i;
        double f;
        int b;
        CHECK(at_gguf_get_uint(g, "u8", &u) == AT_OK && u == 255);
        CHECK(at_gguf_get_int(g, "i8", &i) == AT_OK && i == -128);
        CHECK(at_gguf_get_uint(g, "u16", &u) == AT_OK && u == 65535);
        CHECK(at_gguf_get_int(g, "i16", &i) == AT_OK && i == -32768);
        CHECK(at_gguf_get_uint(g, "u32", &u) == AT_OK && u == 0xffffffffu);
        CHECK(at_gguf_get_int(g, "i32", &i) == AT_OK && i == INT32_MIN);
        CHECK(at_gguf_get_uint(g, "u64", &u) == AT_OK && u == UINT64_MAX);
        CHECK(at_gguf_get_int(g, "i64", &i) == AT_OK && i == INT64_MIN);
        CHECK(at_gguf_get_float(g, "f32", &f) == AT_OK && f == (double)0.1f);
        CHECK(at_gguf_get_float(g, "f64", &f) == AT_OK && f == 0.1);
        CHECK(at_gguf_get_bool(g, "bool", &b) == AT_OK && b == 0);
        CHECK(strcmp(str_of(g, "str"), "x y z") == 0);
        at_gguf_value e;
        CHECK(at_gguf_value_elem(at_gguf_get(g, "arr_f32"), 2, &e) == AT_OK && e.v.f == (double)3e38f);
        CHECK(at_gguf_value_elem(at_gguf_get(g, "arr_bool"), 0, &e) == AT_OK && e.type == AT_GGUF_BOOL && e.v.b == 1);
        CHECK(at_gguf_value_elem(at_gguf_get(g, "arr_str"), 1, &e) == AT_OK && strcmp(e.v.str.s, "</s>") == 0);
        const at_gguf_tensor_info *ti = at_gguf_find_tensor(g, "m");
        CHECK(ti && ti->ne[0] == 32 && ti->ne[1] == 2 && ti->offset == 0 && memcmp(ti->data, data, sizeof data) == 0);
        CHECK(at_gguf_data_offset(g) % 32 == 0);
        at_gguf_close(g);
    }
    at_tensor_free(t);
    unlink(path);
}

/* Every corpus file named lie_* or truncated_* is refused with a format error. */
static void test_hostile_corpus(void)
{
    static const struct {
        const char *file, *text;
    } lies[] = {
        {"lie_magic.gguf", "magic"},
        {"lie_version1.gguf", "version 1"},
        {"lie_version9.gguf", "version 9"},
        {"lie_n_kv_huge.gguf", "cannot fit"},
        {"lie_n_tensors_huge.gguf", "cannot fit"},
        {"lie_string_too_long.gguf", "past the end"},
        {"lie_array_too_long.gguf", "past the end"},
        {"lie_value_type.gguf", "unknown value type 77"},
        {"lie_deep_nesting.gguf", "nested deeper"},
        {"lie_duplicate_key.gguf", "t.u8 appears twice"},
        {"lie_alignment_3.gguf", "general.alignment"},
        {"lie_alignment_type.gguf", "general.alignment"},
        {"lie_misaligned_offset.gguf", "not a multiple of the alignment"},
        {"lie_data_outside.gguf", "outside the file"},
        {"lie_huge_ne.gguf", "absurd"},
        {"lie_ne_overflow.gguf", "overflows"},
        {"lie_empty_overflow.gguf", "element count overflows"},
        {"lie_n_dims_5.gguf", "5 dimensions"},
        {"lie_unknown_type.gguf", "ggml type 99"},
        {"lie_q8_row.gguf", "not a multiple of the Q8_0 block"},
        {"lie_duplicate_tensor.gguf", "tensor x appears twice"},
        {"lie_overlap.gguf", "overlap"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fuzz/gguf/%s", lies[i].file);
        at_gguf *g = NULL;
        at_status st = at_gguf_open(path, &g);
        CHECK_MSG(st == AT_ERR_FORMAT && g == NULL, "%s: %s", path, at_status_name(st));
        CHECK_MSG(strstr(at_last_error(), lies[i].text) != NULL, "%s: message \"%s\" lacks \"%s\"", path,
                  at_last_error(), lies[i].text);
        at_gguf_close(g);
    }
    /* Every strict prefix of a valid file is refused (not crashed on). */
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file("tests/fuzz/gguf/valid_all_types.gguf", &buf, &len));
    int refused = 0;
    for (size_t n = 0; buf && n < len; n++) {
        at_gguf *g = NULL;
        if (at_gguf_parse(buf, n, "prefix", &g) != AT_OK) refused++;
        at_gguf_close(g);
    }
    CHECK_MSG(refused == (int)len, "%d of %zu prefixes refused", refused, len);
    free(buf);
}

static void test_real_files(void)
{
    at_gguf *g = NULL;
    /* ollama's llama-2-tiny-random: hidden 8, 1 layer, 2 heads, ffn 32, F16
     * matrices, F32 norms, the 32000-token Llama 2 vocabulary. */
    CHECK_OK(at_gguf_open("tests/data/models/llama-2-tiny-random.gguf", &g));
    if (g) {
        int64_t v;
        CHECK(strcmp(str_of(g, "general.architecture"), "llama") == 0);
        CHECK(at_gguf_get_int(g, "llama.embedding_length", &v) == AT_OK && v == 8);
        CHECK(at_gguf_get_int(g, "llama.block_count", &v) == AT_OK && v == 1);
        CHECK(at_gguf_get_int(g, "llama.attention.head_count", &v) == AT_OK && v == 2);
        CHECK(at_gguf_get_int(g, "llama.feed_forward_length", &v) == AT_OK && v == 32);
        size_t n = 0;
        at_gguf_type et;
        CHECK(at_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n) == AT_OK && et == AT_GGUF_STRING && n == 32000);
        at_gguf_value e;
        CHECK(at_gguf_value_elem(at_gguf_get(g, "tokenizer.ggml.tokens"), 1, &e) == AT_OK &&
              strcmp(e.v.str.s, "<s>") == 0);
        const at_gguf_tensor_info *emb = at_gguf_find_tensor(g, "token_embd.weight");
        CHECK(emb && emb->n_dims == 2 && emb->ne[0] == 8 && emb->ne[1] == 32000 && emb->type == AT_GGML_F16);
        const at_gguf_tensor_info *nrm = at_gguf_find_tensor(g, "blk.0.attn_norm.weight");
        CHECK(nrm && nrm->type == AT_GGML_F32 && nrm->ne[0] == 8);
        at_tensor *t = NULL;
        CHECK_OK(at_gguf_get_tensor(g, "token_embd.weight", AT_GGUF_KEEP_DTYPE, &t));
        if (t) {
            CHECK(t->dtype == AT_F16 && t->shape[0] == 32000 && t->shape[1] == 8 && at_tensor_data(t) == (void *)emb->data);
            at_tensor_free(t);
        }
        at_model_config cfg;
        CHECK_OK(at_model_config_from_gguf(g, "tiny", &cfg));
        CHECK(cfg.hidden_size == 8 && cfg.num_hidden_layers == 1 && cfg.num_attention_heads == 2 &&
              cfg.intermediate_size == 32 && cfg.vocab_size == 32000 && cfg.head_dim == 4);
        CHECK(at_gguf_qk_interleaved(g) == 1);
        /* Every tensor name maps to an HF name and back. */
        int all = 1;
        for (size_t i = 0; i < at_gguf_tensor_count(g); i++) {
            char hf[128], back[128];
            const char *nm = at_gguf_tensor_at(g, i)->name;
            all &= at_gguf_name_to_hf(nm, hf, sizeof hf) && at_gguf_name_from_hf(hf, back, sizeof back) &&
                   strcmp(back, nm) == 0;
        }
        CHECK(all);
        at_gguf_close(g);
    }
    /* llama.cpp's CI stories260K: dim 64, 5 layers, 8/4 heads, vocab 512, F32. */
    CHECK_OK(at_gguf_open("tests/data/models/stories260K.gguf", &g));
    if (g) {
        int64_t v;
        CHECK(at_gguf_version(g) == 3);
        CHECK(at_gguf_get_int(g, "llama.context_length", &v) == AT_OK && v == 2048);
        CHECK(at_gguf_get_int(g, "llama.attention.head_count_kv", &v) == AT_OK && v == 4);
        const at_gguf_tensor_info *q = at_gguf_find_tensor(g, "blk.4.attn_q.weight");
        CHECK(q && q->ne[0] == 64 && q->ne[1] == 64 && q->type == AT_GGML_F32);
        const at_gguf_tensor_info *k = at_gguf_find_tensor(g, "blk.4.attn_k.weight");
        CHECK(k && k->ne[0] == 64 && k->ne[1] == 32);
        const at_gguf_tensor_info *f = at_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
        CHECK(f && f->ne[0] == 64 && f->ne[1] == 172);
        at_model_config cfg;
        CHECK_OK(at_model_config_from_gguf(g, "stories", &cfg));
        CHECK(cfg.hidden_size == 64 && cfg.num_hidden_layers == 5 && cfg.num_key_value_heads == 4 &&
              cfg.vocab_size == 512 && cfg.intermediate_size == 172 && fabs(cfg.rms_norm_eps - 1e-5) < 1e-12);
        at_gguf_close(g);
    }
}

static void test_names(void)
{
    char out[128];
    CHECK(at_gguf_name_to_hf("blk.12.ffn_down.weight", out, sizeof out) &&
          strcmp(out, "model.layers.12.mlp.down_proj.weight") == 0);
    CHECK(at_gguf_name_to_hf("blk.0.attn_q.bias", out, sizeof out) &&
          strcmp(out, "model.layers.0.self_attn.q_proj.bias") == 0);
    CHECK(at_gguf_name_to_hf("output.weight", out, sizeof out) && strcmp(out, "lm_head.weight") == 0);
    CHECK(!at_gguf_name_to_hf("rope_freqs.weight", out, sizeof out));
    CHECK(!at_gguf_name_to_hf("blk.x.attn_q.weight", out, sizeof out));
    CHECK(at_gguf_name_from_hf("model.layers.3.self_attn.k_norm.weight", out, sizeof out) &&
          strcmp(out, "blk.3.attn_k_norm.weight") == 0);
    CHECK(!at_gguf_name_to_hf("blk.1.ffn_up.weight", out, 8)); /* does not fit */
}

int main(void)
{
    test_independent_file();
    test_writer_types();
    test_hostile_corpus();
    test_real_files();
    test_names();
    return at_test_result("test_gguf");
}
