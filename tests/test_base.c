/* base/ and device/ foundations: errors, JSON errors, SHA-256 (FIPS 180-2
 * vectors), atomic files, progress output, f16/bf16 conversions (checked
 * against the CPU's own conversion instructions), tensors and views. */
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "base/progress.h"
#include "base/threads.h"
#include "base/rng.h"
#include "base/sha256.h"
#include "device/cpu/cpu_backend.h"
#include "device/cpu/cpu_features.h"
#include "device/dtype.h"
#include "device/tensor.h"
#include "testing.h"

static void test_status(void)
{
    at_status s = at_error(AT_ERR_FORMAT, "%s: line %d", "data.jsonl", 7);
    CHECK(s == AT_ERR_FORMAT);
    CHECK(!strcmp(at_last_error(), "data.jsonl: line 7"));
    at_error_wrap(s, "loading %s", "dataset");
    CHECK(!strcmp(at_last_error(), "loading dataset: data.jsonl: line 7"));
    CHECK(!strcmp(at_status_name(AT_ERR_DEVICE_OOM), "out of device memory"));
}

static void test_json(void)
{
    cJSON *j = NULL;
    const char *bad = "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}";
    CHECK_FAILS(at_json_parse(bad, strlen(bad), "cfg.json", &j), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "cfg.json") && strstr(at_last_error(), "line 3"), "%s", at_last_error());
    CHECK(j == NULL);
    const char *trail = "{\"a\": 1} x";
    CHECK_FAILS(at_json_parse(trail, strlen(trail), "t.json", &j), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "unexpected data after JSON value at line 1, column 10"), "%s", at_last_error());
    /* at_json_value: the same rule, no message */
    at_clear_error();
    CHECK(at_json_value(trail) == NULL && at_json_value("0.5 0.7") == NULL && at_json_value("") == NULL);
    CHECK(at_json_value(bad) == NULL && at_json_value(NULL) == NULL);
    CHECK(!strcmp(at_last_error(), ""));
    cJSON *v = at_json_value(" [1, 2]\r\n");
    CHECK(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2);
    cJSON_Delete(v);
    const char *good = "{\"n\": 3, \"f\": 0.5, \"s\": \"x\", \"b\": true, \"frac\": 2.5}";
    CHECK_OK(at_json_parse(good, strlen(good), "g.json", &j));
    long long n = 0;
    double f = 0;
    const char *s = NULL;
    int b = 0;
    CHECK_OK(at_json_get_int(j, "n", "g.json", &n));
    CHECK(n == 3);
    CHECK_OK(at_json_get_double(j, "f", "g.json", &f));
    CHECK(f == 0.5);
    CHECK_OK(at_json_get_string(j, "s", "g.json", &s));
    CHECK(s && !strcmp(s, "x"));
    CHECK_OK(at_json_get_bool(j, "b", "g.json", &b));
    CHECK(b == 1);
    CHECK(at_json_get_int(j, "missing", "g.json", &n) == AT_ERR_NOT_FOUND);
    CHECK_FAILS(at_json_get_int(j, "frac", "g.json", &n), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "frac") != NULL);
    CHECK_FAILS(at_json_get_string(j, "n", "g.json", &s), AT_ERR_FORMAT);
    cJSON_Delete(j);
}

static void test_sha256(void)
{
    static const struct { const char *msg; const char *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t d[32];
        char hex[65];
        at_sha256_digest(v[i].msg, strlen(v[i].msg), d);
        at_sha256_hex(d, hex);
        CHECK_MSG(!strcmp(hex, v[i].hex), "sha256(\"%s\") = %s", v[i].msg, hex);
    }
    /* One million 'a', fed in uneven pieces to exercise the buffering. */
    at_sha256 s;
    at_sha256_init(&s);
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    size_t left = 1000000;
    while (left) {
        size_t take = left < sizeof chunk ? left : (left % 7) + 1 + (left > 2000 ? 900 : 0);
        if (take > left) take = left;
        at_sha256_update(&s, chunk, take);
        left -= take;
    }
    uint8_t d[32];
    char hex[65];
    at_sha256_final(&s, d);
    at_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

static void test_files(void)
{
    char dir[] = "/tmp/anytune-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char *sub = at_path_join(dir, "a/b/c");
    CHECK_OK(at_mkdirs(sub));
    CHECK(at_is_dir(sub));
    char *file = at_path_join(sub, "x.txt");
    CHECK_OK(at_write_file_atomic(file, "hello", 5));
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(file, &data, &len));
    CHECK(len == 5 && data && !strcmp(data, "hello"));
    free(data);
    at_mapped_file m;
    CHECK_OK(at_map_file(file, &m));
    CHECK(m.size == 5 && !memcmp(m.data, "hello", 5));
    at_unmap_file(&m);
    char hex[65];
    CHECK_OK(at_sha256_file(file, hex));
    CHECK(!strcmp(hex, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"));
    CHECK_FAILS(at_map_file("/nonexistent/file.bin", &m), AT_ERR_IO);
    CHECK(strstr(at_last_error(), "/nonexistent/file.bin") != NULL);
    CHECK_FAILS(at_map_file(sub, &m), AT_ERR_IO); /* a directory */
    CHECK(strstr(at_last_error(), "a folder, not a regular file") != NULL);
    /* a FIFO with no writer: refused by both readers, without hanging in open() */
    char *fifo = at_path_join(dir, "fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_FAILS(at_map_file(fifo, &m), AT_ERR_IO);
    CHECK(strstr(at_last_error(), "pipe or socket, not a regular file") != NULL);
    CHECK_FAILS(at_read_file(fifo, &data, &len), AT_ERR_IO);
    CHECK(strstr(at_last_error(), "pipe or socket, not a regular file") != NULL);
    unlink(fifo);
    free(fifo);
    unlink(file);
    free(file);
    free(sub);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_progress(void)
{
    FILE *f = tmpfile();
    at_progress p;
    at_progress_start(&p, "train", 10, f);
    at_progress_set_tty(&p, 0);
    for (int i = 1; i <= 10; i++) at_progress_update(&p, i, "loss 1.0");
    at_progress_finish(&p, "loss 0.5");
    rewind(f);
    char buf[4096] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK(strchr(buf, '\r') == NULL);      /* plain lines when not a terminal */
    CHECK(strstr(buf, "10/10") != NULL);   /* the final line is always printed */
    CHECK(strstr(buf, "loss 0.5") != NULL);
    int lines = 0;
    for (char *c = buf; *c; c++) lines += *c == '\n';
    CHECK(lines <= 3); /* throttled: not one line per update */
}

/* The CPU's own half-precision conversions: F16C on x86-64, FCVT (the
 * __fp16 type, round to nearest even by default) on aarch64. */
#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static int hw_has_f16(void) { return at_cpu_get_features()->f16c; }
#elif defined(__aarch64__)
static uint16_t hw_f32_to_f16(float f)
{
    __fp16 h = (__fp16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static float hw_f16_to_f32(uint16_t u)
{
    __fp16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}
static int hw_has_f16(void) { return 1; }
#else
static uint16_t hw_f32_to_f16(float f) { return at_f32_to_f16(f); }
static float hw_f16_to_f32(uint16_t h) { return at_f16_to_f32(h); }
static int hw_has_f16(void) { return 0; }
#endif

static void test_dtypes(void)
{
    /* bf16: known values and round-to-nearest-even. */
    CHECK(at_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(at_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(at_f32_to_bf16(1.00390625f) == 0x3f80);     /* exactly half way: ties to even (down) */
    CHECK(at_f32_to_bf16(1.01171875f) == 0x3f82);     /* half way above odd: up */
    CHECK(isnan(at_bf16_to_f32(at_f32_to_bf16(NAN))));
    CHECK(at_f32_to_bf16(INFINITY) == 0x7f80);
    if (!hw_has_f16()) return;
    /* f16: every half value converts to the same float as the hardware does. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = at_f16_to_f32((uint16_t)h), b = hw_f16_to_f32((uint16_t)h);
        if (!(a == b || (isnan(a) && isnan(b)))) bad++;
    }
    CHECK_MSG(bad == 0, "%d f16->f32 mismatches", bad);
    /* f32 -> f16 rounding equals the hardware on many floats, including subnormals and overflow. */
    bad = 0;
    uint32_t x = 12345;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t u = (i & 1) ? x : (x & 0x8fffffffu) | 0x30000000u; /* half of them near the f16 range */
        float f;
        memcpy(&f, &u, 4);
        uint16_t a = at_f32_to_f16(f), b = hw_f32_to_f16(f);
        if (isnan(f)) continue;
        if (a != b) bad++;
    }
    CHECK_MSG(bad == 0, "%d f32->f16 mismatches", bad);
    at_dtype t;
    CHECK(at_dtype_parse("bfloat16", &t) == 0 && t == AT_BF16);
    CHECK(at_dtype_parse("float16", &t) == 0 && t == AT_F16);
    CHECK(at_dtype_parse("float8", &t) == -1);
    CHECK(at_dtype_bytes(AT_Q8_0, 64) == 68);
}

static void test_tensors(void)
{
    at_tensor *t = NULL, *v = NULL;
    int64_t shape[3] = {2, 3, 4};
    CHECK_OK(at_tensor_zeros(at_cpu_backend(), AT_F32, 3, shape, "x", &t));
    CHECK(at_tensor_numel(t) == 24 && at_tensor_rows(t) == 6 && at_tensor_cols(t) == 4);
    float *d = at_tensor_data(t);
    for (int i = 0; i < 24; i++) CHECK(d[i] == 0);
    for (int i = 0; i < 24; i++) d[i] = (float)i;
    int64_t vs[2] = {3, 4};
    CHECK_OK(at_tensor_view(t, 12, 2, vs, "x[1]", &v));
    CHECK(((float *)at_tensor_data(v))[0] == 12.0f);
    at_tensor_free(t); /* the view keeps the buffer alive */
    CHECK(((float *)at_tensor_data(v))[11] == 23.0f);
    at_tensor *bad = NULL;
    int64_t big[2] = {4, 4};
    CHECK_FAILS(at_tensor_view(v, 0, 2, big, "too big", &bad), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "too big") != NULL);
    char desc[128];
    CHECK(!strcmp(at_tensor_describe(v, desc, sizeof desc), "x[1] [3, 4] f32"));
    at_tensor_free(v);
    int64_t neg[1] = {-1};
    CHECK_FAILS(at_tensor_new(at_cpu_backend(), AT_F32, 1, neg, "neg", &bad), AT_ERR_INVALID);
    CHECK_FAILS(at_tensor_new(at_cpu_backend(), AT_F32, 5, shape, "five", &bad), AT_ERR_INVALID);
}

static void test_rng(void)
{
    /* xoshiro256** reference: state {1, 2, 3, 4} gives 11520, 0, 1509978240, 1215971899390074240
     * (the first outputs of the authors' C code for that state). */
    at_rng r = {{1, 2, 3, 4}};
    CHECK(at_rng_next(&r) == 11520u);
    CHECK(at_rng_next(&r) == 0u);
    CHECK(at_rng_next(&r) == 1509978240u);
    CHECK(at_rng_next(&r) == 1215971899390074240ull);
    /* Saving the struct saves the stream. */
    at_rng a, b;
    at_rng_seed(&a, 42);
    for (int i = 0; i < 10; i++) at_rng_next(&a);
    b = a;
    int same = 1;
    for (int i = 0; i < 100; i++) same &= at_rng_next(&a) == at_rng_next(&b);
    CHECK(same);
    /* Moments of the distributions. */
    at_rng_seed(&a, 7);
    double sum = 0, sq = 0;
    int n = 200000, counts[10] = {0};
    for (int i = 0; i < n; i++) {
        double z = at_rng_normal(&a);
        sum += z;
        sq += z * z;
        float u = at_rng_uniform(&a);
        CHECK(u >= 0.0f && u < 1.0f);
        counts[at_rng_below(&a, 10)]++;
    }
    CHECK_NEAR(sum / n, 0.0, 0.01);
    CHECK_NEAR(sq / n, 1.0, 0.02);
    for (int i = 0; i < 10; i++) CHECK_NEAR(counts[i] / (double)n, 0.1, 0.005);
    int64_t v[100];
    for (int i = 0; i < 100; i++) v[i] = i;
    at_rng_shuffle(&a, v, 100);
    int seen[100] = {0}, moved = 0;
    for (int i = 0; i < 100; i++) {
        seen[v[i]]++;
        moved += v[i] != i;
    }
    int perm = 1;
    for (int i = 0; i < 100; i++) perm &= seen[i] == 1;
    CHECK(perm && moved > 80);
    CHECK(at_rng_hash_uniform(1, 5) == at_rng_hash_uniform(1, 5));
    CHECK(at_rng_hash_uniform(1, 5) != at_rng_hash_uniform(2, 5));
}

/* at_par_threads: both counts are timed, the faster kept, the slower timed
 * again now and then, and a change of which is faster is followed. Times
 * are reported, not measured: the test asserts the rule, not a machine. */
static void test_par(void)
{
    unsigned key = at_par_key(63, 12345.0);
    CHECK(key != at_par_key(63, 40000.0) && key == at_par_key(63, 16000.0));
    CHECK(at_par_threads(key, 1) == 1);
    double t_one = 1e-3, t_many = 3e-3;
    int tried[2] = {0, 0};
    for (int i = 0; i < 6; i++) { /* warming up: both, alternately */
        int n = at_par_threads(key, 4);
        CHECK(n == 1 || n == 4);
        tried[n > 1]++;
        at_par_record(key, n, n > 1 ? t_many : t_one);
    }
    CHECK(tried[0] == 3 && tried[1] == 3);
    int many = 0;
    for (int i = 0; i < 300; i++) {
        int n = at_par_threads(key, 4);
        many += n > 1;
        at_par_record(key, n, n > 1 ? t_many : t_one);
    }
    /* 3x slower: timed again every 4 x AT_PAR_EXPLORE calls */
    CHECK_MSG(many >= 1 && many <= 300 / (4 * AT_PAR_EXPLORE) + 1, "many threads chosen %d times of 300", many);
    t_many = 0.2e-3; /* the load changed: many threads now win */
    for (int i = 0; i < 3000; i++) {
        int n = at_par_threads(key, 4);
        at_par_record(key, n, n > 1 ? t_many : t_one);
    }
    many = 0;
    for (int i = 0; i < 100; i++) {
        int n = at_par_threads(key, 4);
        many += n > 1;
        at_par_record(key, n, n > 1 ? t_many : t_one);
    }
    CHECK_MSG(many >= 95, "after the change many threads chosen %d times of 100", many);
}

int main(void)
{
    test_par();
    test_rng();
    test_status();
    test_json();
    test_sha256();
    test_files();
    test_progress();
    test_dtypes();
    test_tensors();
    return at_test_result("test_base");
}
