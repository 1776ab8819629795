/* safetensors: a file from an independent encoder (tools/make_fuzz_seeds.py),
 * the writer's round trip, every lie a hostile file can tell, sharded folders,
 * zero-copy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "model/safetensors.h"
#include "testing.h"

static char tmpdir[64];

static char *tmp_path(const char *name)
{
    return at_path_join(tmpdir, name);
}

/* valid_mixed.safetensors: values listed in tools/make_fuzz_seeds.py (st_valid). */
static void test_independent_file(void)
{
    at_st_file *f = NULL;
    CHECK_OK(at_st_open("tests/fuzz/safetensors/valid_mixed.safetensors", &f));
    if (!f) return;
    CHECK(at_st_count(f) == 5);
    CHECK(at_st_metadata_count(f) == 2);
    CHECK(at_st_metadata(f, "format") && strcmp(at_st_metadata(f, "format"), "pt") == 0);
    CHECK(at_st_metadata(f, "none") == NULL);
    /* Sorted by offset. */
    CHECK(strcmp(at_st_info_at(f, 0)->name, "w.f32") == 0 && strcmp(at_st_info_at(f, 4)->name, "scalar.u8") == 0);
    const at_st_info *a = at_st_find(f, "w.f32");
    CHECK(a && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 2 && a->dtype == AT_F32 && a->nbytes == 16);
    size_t size;
    const uint8_t *bytes = at_st_bytes(f, &size);
    at_tensor *t = NULL;
    CHECK_OK(at_st_tensor(a, AT_ST_KEEP_DTYPE, &t));
    if (t) {
        /* Zero-copy: the tensor's data lies inside the mapping. */
        const uint8_t *p = at_tensor_data(t);
        CHECK(p == a->data && p >= bytes && p + 16 <= bytes + size);
        CHECK(((float *)p)[3] == 3.25f);
        at_tensor_free(t);
    }
    /* Conversions: bf16 {1, -2, 0.5} and f16 {1, -0.5} to f32; f32 to bf16 and f16. */
    CHECK_OK(at_st_tensor(at_st_find(f, "w.bf16"), AT_F32, &t));
    if (t) {
        float *x = at_tensor_data(t);
        CHECK(x[0] == 1.0f && x[1] == -2.0f && x[2] == 0.5f && x != (float *)at_st_find(f, "w.bf16")->data);
        at_tensor_free(t);
    }
    CHECK_OK(at_st_tensor(at_st_find(f, "w.f16"), AT_F32, &t));
    if (t) {
        CHECK(((float *)at_tensor_data(t))[1] == -0.5f);
        at_tensor_free(t);
    }
    CHECK_OK(at_st_tensor(a, AT_BF16, &t));
    if (t) {
        const uint16_t *h = at_tensor_data(t); /* 1, -2, 0.5, 3.25 */
        CHECK(h[0] == 0x3F80 && h[1] == 0xC000 && h[2] == 0x3F00 && h[3] == 0x4050);
        at_tensor_free(t);
    }
    CHECK_OK(at_st_tensor(a, AT_F16, &t));
    if (t) {
        const uint16_t *h = at_tensor_data(t);
        CHECK(h[0] == 0x3C00 && h[1] == 0xC000 && h[3] == 0x4280);
        at_tensor_free(t);
    }
    CHECK_OK(at_st_tensor(at_st_find(f, "w.i32"), AT_ST_KEEP_DTYPE, &t));
    if (t) {
        CHECK(t->dtype == AT_I32 && ((int32_t *)at_tensor_data(t))[1] == -9);
        at_tensor_free(t);
    }
    CHECK(at_st_tensor(at_st_find(f, "w.i32"), AT_F32, &t) == AT_ERR_UNSUPPORTED);
    const at_st_info *s = at_st_find(f, "scalar.u8");
    CHECK(s && s->ndim == 0 && s->nbytes == 1 && !s->has_dtype);
    CHECK(at_st_tensor(s, AT_ST_KEEP_DTYPE, &t) == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "U8"));
    /* at_st_read_f32: the same values into the caller's buffer; the count must be the tensor's */
    float v[4] = {0};
    CHECK_OK(at_st_read_f32(at_st_find(f, "w.bf16"), v, 3));
    CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 0.5f);
    CHECK_OK(at_st_read_f32(at_st_find(f, "w.f16"), v, 2));
    CHECK(v[0] == 1.0f && v[1] == -0.5f);
    CHECK_OK(at_st_read_f32(a, v, 4));
    CHECK(v[3] == 3.25f);
    CHECK(at_st_read_f32(a, v, 3) == AT_ERR_FORMAT && strstr(at_last_error(), "w.f32"));
    CHECK(at_st_read_f32(at_st_find(f, "w.i32"), v, 2) == AT_ERR_UNSUPPORTED && strstr(at_last_error(), "w.i32"));
    at_st_close(f);
}

static void test_round_trip(void)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3F80, 0x4000, 0x4040};
    int32_t c[1] = {42};
    at_tensor *ta = NULL, *tb = NULL, *tc = NULL;
    const int64_t sa[2] = {2, 3}, sb[1] = {3}, sc[1] = {1};
    CHECK_OK(at_tensor_wrap(a, AT_F32, 2, sa, "model.a", &ta));
    CHECK_OK(at_tensor_wrap(b, AT_BF16, 1, sb, "model.b", &tb));
    CHECK_OK(at_tensor_wrap(c, AT_I32, 1, sc, "model.c", &tc));
    /* The bf16 tensor first: the writer still puts 4-byte types first. */
    const at_tensor *ts[3] = {tb, ta, tc};
    const at_st_kv meta[2] = {{"format", "pt"}, {"who", "anytune \"quoted\""}};
    char *path = tmp_path("rt.safetensors");
    CHECK_OK(at_safetensors_write(path, ts, NULL, 3, meta, 2));
    /* The header length is a multiple of 8 (the spec asks for 8-byte alignment). */
    char *raw = NULL;
    size_t rl = 0;
    CHECK_OK(at_read_file(path, &raw, &rl));
    if (raw) {
        uint64_t hl;
        memcpy(&hl, raw, 8);
        CHECK(hl % 8 == 0 && 8 + hl + 24 + 6 + 4 == rl); /* f32 [2,3], bf16 [3], i32 [1] */
        free(raw);
    }
    at_st_file *f = NULL;
    CHECK_OK(at_st_open(path, &f));
    if (f) {
        CHECK(at_st_count(f) == 3);
        CHECK(strcmp(at_st_metadata(f, "who"), "anytune \"quoted\"") == 0);
        const at_st_info *ia = at_st_find(f, "model.a"), *ib = at_st_find(f, "model.b"), *ic = at_st_find(f, "model.c");
        CHECK(ia && ia->ndim == 2 && ia->shape[1] == 3 && memcmp(ia->data, a, sizeof a) == 0);
        CHECK(ib && ib->dtype == AT_BF16 && memcmp(ib->data, b, sizeof b) == 0);
        CHECK(ic && ic->dtype == AT_I32 && memcmp(ic->data, c, sizeof c) == 0);
        CHECK(ia && ic && ib && ia->data < ib->data && ic->data < ib->data);
        CHECK(ia && ((uintptr_t)ia->data % 4) == 0);
        at_st_close(f);
    }
    /* Names given separately; duplicates refused; quantized dtypes refused. */
    const char *names[2] = {"x", "x"};
    CHECK(at_safetensors_write(path, ts, names, 2, NULL, 0) == AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "\"x\""));
    at_tensor *tq = NULL;
    const int64_t sq[1] = {32};
    uint8_t qb[34] = {0};
    CHECK_OK(at_tensor_wrap(qb, AT_Q8_0, 1, sq, "q", &tq));
    const at_tensor *tsq[1] = {tq};
    CHECK(at_safetensors_write(path, tsq, NULL, 1, NULL, 0) == AT_ERR_UNSUPPORTED);
    /* A failed write leaves the previous file whole. */
    at_st_file *f2 = NULL;
    CHECK_OK(at_st_open(path, &f2));
    CHECK(f2 && at_st_count(f2) == 3);
    at_st_close(f2);
    at_tensor_free(tq);
    at_tensor_free(ta);
    at_tensor_free(tb);
    at_tensor_free(tc);
    unlink(path);
    free(path);
}

/* Every lie in the corpus is refused with a message naming the problem. */
static void test_lies(void)
{
    static const struct {
        const char *file, *text;
    } lies[] = {
        {"truncated_0.safetensors", "shorter than the 8-byte"},
        {"truncated_7.safetensors", "shorter than the 8-byte"},
        {"truncated_20.safetensors", "exceeds the file"},
        {"lie_header_len_past_end.safetensors", "exceeds the file"},
        {"lie_header_len_absurd.safetensors", "absurd"},
        {"lie_not_json.safetensors", "malformed JSON"},
        {"lie_not_object.safetensors", "not a JSON object"},
        {"lie_missing_dtype.safetensors", "missing \"dtype\""},
        {"lie_missing_shape.safetensors", "missing \"shape\""},
        {"lie_missing_offsets.safetensors", "missing \"data_offsets\""},
        {"lie_unknown_dtype.safetensors", "unknown dtype \"F31\""},
        {"lie_negative_shape.safetensors", "not a non-negative integer"},
        {"lie_fraction_shape.safetensors", "not a non-negative integer"},
        {"lie_shape_span_mismatch.safetensors", "needs 24 bytes but data_offsets span 16"},
        {"lie_offsets_outside.safetensors", "outside the data area"},
        {"lie_offsets_reversed.safetensors", "end before they begin"},
        {"lie_overlap.safetensors", "overlap"},
        {"lie_metadata_not_string.safetensors", "\"n\" is not a string"},
        {"lie_metadata_not_object.safetensors", "\"__metadata__\" must be an object"},
        {"lie_huge_shape.safetensors", "overflows"},
        {"lie_empty_overflow.safetensors", "shape overflows"},
        {"lie_nine_dims.safetensors", "9 dimensions"},
        {"lie_duplicate_name.safetensors", "\"w.f32\" appears twice"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fuzz/safetensors/%s", lies[i].file);
        at_st_file *f = NULL;
        at_status st = at_st_open(path, &f);
        CHECK_MSG(st == AT_ERR_FORMAT && f == NULL, "%s: %s", path, at_status_name(st));
        CHECK_MSG(strstr(at_last_error(), lies[i].text) != NULL && strstr(at_last_error(), lies[i].file) != NULL,
                  "%s: message \"%s\" lacks \"%s\"", path, at_last_error(), lies[i].text);
        at_st_close(f);
    }
    /* Every strict prefix of a valid file is refused. */
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file("tests/fuzz/safetensors/valid_mixed.safetensors", &buf, &len));
    int refused = 0;
    for (size_t n = 0; buf && n < len; n++) {
        at_st_file *f = NULL;
        if (at_st_parse(buf, n, "prefix", &f) != AT_OK) refused++;
        at_st_close(f);
    }
    CHECK_MSG(refused == (int)len, "%d of %zu prefixes refused", refused, len);
    free(buf);
}

static void write_text(const char *path, const char *text)
{
    CHECK_OK(at_write_file_atomic(path, text, strlen(text)));
}

static void test_sharded(void)
{
    float w0[4] = {1, 2, 3, 4}, w1[2] = {5, 6};
    at_tensor *t0 = NULL, *t1 = NULL;
    const int64_t s0[2] = {2, 2}, s1[1] = {2};
    CHECK_OK(at_tensor_wrap(w0, AT_F32, 2, s0, "model.layers.0.w", &t0));
    CHECK_OK(at_tensor_wrap(w1, AT_F32, 1, s1, "model.norm.weight", &t1));
    char *p1 = tmp_path("model-00001-of-00002.safetensors"), *p2 = tmp_path("model-00002-of-00002.safetensors");
    char *idx = tmp_path("model.safetensors.index.json");
    CHECK_OK(at_safetensors_write(p1, (const at_tensor *const[]){t0}, NULL, 1, NULL, 0));
    CHECK_OK(at_safetensors_write(p2, (const at_tensor *const[]){t1}, NULL, 1, NULL, 0));
    write_text(idx, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
                    "\"model.layers.0.w\": \"model-00001-of-00002.safetensors\","
                    "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    at_st_model *m = NULL;
    CHECK_OK(at_st_model_open(tmpdir, &m));
    if (m) {
        CHECK(at_st_model_shard_count(m) == 2 && at_st_model_count(m) == 2);
        const at_st_info *i1 = at_st_model_find(m, "model.norm.weight");
        CHECK(i1 && i1->shard == 1);
        at_tensor *t = NULL;
        CHECK_OK(at_st_get(m, "model.layers.0.w", 2, s0, AT_F32, &t));
        if (t) {
            CHECK(((float *)at_tensor_data(t))[3] == 4.0f);
            CHECK(at_tensor_data(t) == (void *)at_st_model_find(m, "model.layers.0.w")->data);
            at_tensor_free(t);
        }
        CHECK_OK(at_st_get(m, "model.norm.weight", 0, NULL, AT_BF16, &t));
        if (t) {
            CHECK(((uint16_t *)at_tensor_data(t))[1] == 0x40C0); /* 6.0 */
            at_tensor_free(t);
        }
        const int64_t wrong[2] = {2, 3};
        CHECK(at_st_get(m, "model.layers.0.w", 2, wrong, AT_F32, &t) == AT_ERR_FORMAT && !t);
        CHECK_MSG(strstr(at_last_error(), "model.layers.0.w has shape [2, 2], expected [2, 3]"), "%s", at_last_error());
        CHECK(at_st_get(m, "model.layers.1.w", 2, s0, AT_F32, &t) == AT_ERR_NOT_FOUND);
        CHECK_MSG(strstr(at_last_error(), "model.layers.1.w (expected shape [2, 2]) is missing"), "%s", at_last_error());
        at_st_model_close(m);
    }
    /* The index file itself, too. */
    CHECK_OK(at_st_model_open(idx, &m));
    at_st_model_close(m);
    /* An index that lies about where a tensor is. */
    write_text(idx, "{\"weight_map\": {\"model.layers.0.w\": \"model-00002-of-00002.safetensors\","
                    "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    CHECK(at_st_model_open(tmpdir, &m) == AT_ERR_FORMAT && !m);
    CHECK_MSG(strstr(at_last_error(), "model.layers.0.w"), "%s", at_last_error());
    /* An index that points out of the folder. */
    write_text(idx, "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
    CHECK(at_st_model_open(tmpdir, &m) == AT_ERR_FORMAT && strstr(at_last_error(), "not a file name"));
    /* A missing shard. */
    write_text(idx, "{\"weight_map\": {\"a\": \"model-00009.safetensors\"}}");
    CHECK(at_st_model_open(tmpdir, &m) == AT_ERR_IO && strstr(at_last_error(), "model-00009.safetensors"));
    /* Without an index, two shards are ambiguous... */
    unlink(idx);
    CHECK(at_st_model_open(tmpdir, &m) == AT_ERR_FORMAT && strstr(at_last_error(), "index"));
    /* ...and one file is the model; the same tensor name in two shards is an error. */
    unlink(p2);
    CHECK_OK(at_st_model_open(tmpdir, &m));
    CHECK(m && at_st_model_count(m) == 1);
    at_st_model_close(m);
    CHECK_OK(at_safetensors_write(p2, (const at_tensor *const[]){t0}, NULL, 1, NULL, 0));
    write_text(idx, "{\"weight_map\": {\"model.layers.0.w\": \"model-00001-of-00002.safetensors\","
                    "\"x\": \"model-00002-of-00002.safetensors\"}}");
    CHECK(at_st_model_open(tmpdir, &m) == AT_ERR_FORMAT && strstr(at_last_error(), "two shards"));
    unlink(idx);
    unlink(p1);
    unlink(p2);
    free(p1);
    free(p2);
    free(idx);
    at_tensor_free(t0);
    at_tensor_free(t1);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/at_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_independent_file();
    test_round_trip();
    test_lies();
    test_sharded();
    rmdir(tmpdir);
    return at_test_result("test_safetensors");
}
