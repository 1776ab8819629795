/* The dispatcher's CPU fallback, through a backend defined here that has
 * memory but no kernels at all (every op NULL, is_host = 0): each op must copy
 * its tensors to the host, run the CPU kernel, copy the outputs back, give the
 * same result as on the CPU backend, and warn once per op (not twice). Its
 * "device pointers" are host addresses shifted by a large constant, so any
 * code that dereferences one directly instead of going through
 * upload/download crashes (or trips ASan) instead of silently working.
 * Also: an op mixing tensors of two backends is an error naming the tensor. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "ops/ops.h"
#include "testing.h"

/* ---- the test backend ---- */

#define HANDLE_SHIFT ((uintptr_t)1 << 44) /* device handle = host address + 16 TiB */

typedef struct {
    int allocs, frees, uploads, downloads;
} dev_stats;

static dev_stats stats;

static void *real(const void *handle) { return (void *)((uintptr_t)handle - HANDLE_SHIFT); }

static at_status dev_alloc(at_backend *be, size_t size, void **out)
{
    (void)be;
    void *p = malloc(size ? size : 1);
    if (!p) return at_error(AT_ERR_DEVICE_OOM, "test device: out of memory");
    memset(p, 0xA5, size); /* garbage, like fresh device memory */
    stats.allocs++;
    *out = (void *)((uintptr_t)p + HANDLE_SHIFT);
    return AT_OK;
}

static void dev_free(at_backend *be, void *ptr)
{
    (void)be;
    stats.frees++;
    free(real(ptr));
}

static at_status dev_upload(at_backend *be, void *dst, const void *src, size_t n)
{
    (void)be;
    stats.uploads++;
    if (n) memcpy(real(dst), src, n);
    return AT_OK;
}

static at_status dev_download(at_backend *be, void *dst, const void *src, size_t n)
{
    (void)be;
    stats.downloads++;
    if (n) memcpy(dst, real(src), n);
    return AT_OK;
}

static at_status dev_sync(at_backend *be)
{
    (void)be;
    return AT_OK;
}

static at_backend testdev = {
    .name = "testdev",
    .kind = AT_DEVICE_TEST,
    .is_host = 0,
    .alloc = dev_alloc,
    .free = dev_free,
    .upload = dev_upload,
    .download = dev_download,
    .synchronize = dev_sync,
    /* .ops: all NULL */
};

/* ---- capturing the warnings written to stderr ---- */

static int saved_fd = -1;
static FILE *capture;

static void capture_begin(void)
{
    fflush(stderr);
    capture = tmpfile();
    saved_fd = dup(2);
    if (capture && saved_fd >= 0) dup2(fileno(capture), 2);
}

/* Returns what was written to stderr since capture_begin (caller frees) and
 * echoes it to the real stderr. */
static char *capture_end(void)
{
    fflush(stderr);
    if (saved_fd >= 0) {
        dup2(saved_fd, 2);
        close(saved_fd);
        saved_fd = -1;
    }
    if (!capture) return NULL;
    long n = ftell(capture);
    char *s = malloc((size_t)(n > 0 ? n : 0) + 1);
    rewind(capture);
    size_t got = s ? fread(s, 1, (size_t)(n > 0 ? n : 0), capture) : 0;
    if (s) s[got] = 0;
    fclose(capture);
    capture = NULL;
    if (s) fputs(s, stderr);
    return s;
}

/* Lines of `log` that are a fallback warning for `op` on the test backend. */
static int count_warnings(const char *log, const char *op)
{
    char needle[64];
    snprintf(needle, sizeof needle, " %s ", op);
    int n = 0;
    for (const char *line = log; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
        if (strstr(buf, "testdev") && strstr(buf, needle)) n++;
        line = end ? end + 1 : line + len;
    }
    return n;
}

static int op_index(const char *name)
{
    for (int i = 0; i < AT_BACKEND_OP_COUNT; i++)
        if (!strcmp(at_backend_op_name(i), name)) return i;
    return -1;
}

/* ---- tensors: the same data on the CPU and on the test device ---- */

typedef struct {
    at_tensor *c, *d; /* on the CPU, on the test device */
} pair;

static uint64_t rng = 88172645463325252ull;
static float urand(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

static pair mk(at_dtype dt, int nd, const int64_t *sh, const char *name, float lo, float hi)
{
    pair p = {NULL, NULL};
    CHECK_OK(at_tensor_new(at_cpu_backend(), dt, nd, sh, name, &p.c));
    CHECK_OK(at_tensor_new(&testdev, dt, nd, sh, name, &p.d));
    if (!p.c || !p.d) return p;
    for (int64_t i = 0; i < at_tensor_numel(p.c); i++) {
        float v = urand(lo, hi);
        void *h = at_tensor_data(p.c);
        if (dt == AT_F32) ((float *)h)[i] = v;
        else if (dt == AT_BF16) ((uint16_t *)h)[i] = at_f32_to_bf16(v);
        else if (dt == AT_I32) ((int32_t *)h)[i] = (int32_t)v;
    }
    CHECK_OK(at_tensor_upload(p.d, at_tensor_data(p.c), at_tensor_nbytes(p.c)));
    return p;
}

static void pfree(pair *p)
{
    at_tensor_free(p->c);
    at_tensor_free(p->d);
}

/* The device tensor's bytes equal the CPU tensor's. */
static int same(const pair *p)
{
    size_t n = at_tensor_nbytes(p->c);
    void *buf = malloc(n ? n : 1);
    int ok = buf && at_tensor_download(p->d, buf, n) == AT_OK && memcmp(buf, at_tensor_data(p->c), n) == 0;
    free(buf);
    return ok;
}

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static void test_ops_fall_back(void)
{
    int64_t n16[1] = {16};
    pair a = mk(AT_F32, 2, SH(5, 16), "a", -1, 1), b = mk(AT_BF16, 2, SH(16, 7), "b", -1, 1);
    pair c = mk(AT_F32, 2, SH(5, 7), "c", -1, 1);
    pair w = mk(AT_F32, 1, n16, "w", 0.5f, 1.5f), y = mk(AT_F32, 2, SH(5, 16), "y", 0, 0);
    pair r = mk(AT_F32, 1, SH(5), "rstd", 0, 0);
    pair lab = mk(AT_I32, 1, SH(5), "labels", 0, 16);
    pair loss = mk(AT_F32, 1, SH(5), "row_loss", 0, 0);
    pair q = mk(AT_F32, 4, SH(1, 6, 4, 8), "q", -1, 1), k = mk(AT_F32, 4, SH(1, 6, 2, 8), "k", -1, 1);
    pair v = mk(AT_F32, 4, SH(1, 6, 2, 8), "v", -1, 1), o = mk(AT_F32, 4, SH(1, 6, 4, 8), "o", 0, 0);
    pair lse = mk(AT_F32, 1, SH(24), "lse", 0, 0), seg = mk(AT_I32, 2, SH(1, 6), "segments", 0, 0);
    pair pos = mk(AT_I32, 1, SH(6), "pos", 0, 100), inv = mk(AT_F32, 1, SH(4), "inv_freq", 0.01f, 1);
    pair s = mk(AT_F32, 1, SH(1), "sumsq", 0, 0);
    int32_t segv[6] = {0, 0, 0, 1, 1, 1};
    memcpy(at_tensor_data(seg.c), segv, sizeof segv);
    CHECK_OK(at_tensor_upload(seg.d, segv, sizeof segv));
    static const char *ops_used[] = {"matmul", "rmsnorm_forward", "attention_forward", "rope",
                                     "cross_entropy", "add", "sumsq"};
    int nused = (int)(sizeof ops_used / sizeof ops_used[0]);

    testdev.fallback_warned = 0;
    capture_begin();
    for (int round = 0; round < 2; round++) { /* the second round must not warn again */
        for (int side = 0; side < 2; side++) {
#define T(p) (side ? (p).d : (p).c)
            at_attn_params ap = {.scale = 0.35f, .segments = T(seg)};
            CHECK_OK(at_matmul(T(c), T(a), T(b), 0, 0, 1.0f, 0.5f));
            CHECK_OK(at_rmsnorm_forward(T(y), T(r), T(a), T(w), 1e-5f));
            CHECK_OK(at_attention_forward(T(o), T(lse), T(q), T(k), T(v), &ap));
            CHECK_OK(at_rope(T(q), T(q), T(pos), T(inv), NULL, 0)); /* in place: one tensor, copied once */
            CHECK_OK(at_cross_entropy(T(loss), T(y), T(y), T(lab), 0.5f)); /* dlogits == logits */
            CHECK_OK(at_add(T(y), T(y), T(w)));                           /* in place, row broadcast */
            CHECK_OK(at_sumsq(T(s), T(y)));
#undef T
        }
        /* the same results, bit for bit (the same CPU kernels ran) */
        pair *outs[] = {&c, &y, &r, &o, &lse, &q, &loss, &s};
        const char *names[] = {"c", "y", "rstd", "o", "lse", "q", "row_loss", "sumsq"};
        for (int i = 0; i < 8; i++) CHECK_MSG(same(outs[i]), "round %d: %s differs from the CPU's", round, names[i]);
        if (round == 0)
            for (int i = 0; i < nused; i++) {
                int idx = op_index(ops_used[i]);
                CHECK_MSG(idx >= 0 && (testdev.fallback_warned >> idx & 1), "%s: warned bit not set", ops_used[i]);
            }
    }
    char *log = capture_end();
    for (int i = 0; i < nused; i++)
        CHECK_MSG(count_warnings(log, ops_used[i]) == 1, "%s warned %d times (want once)", ops_used[i],
                  count_warnings(log, ops_used[i]));
    /* the ops that never ran have not warned */
    uint64_t want = 0;
    for (int i = 0; i < nused; i++) want |= 1ull << op_index(ops_used[i]);
    CHECK(testdev.fallback_warned == want);
    CHECK(count_warnings(log, "adamw") == 0);
    free(log);
    /* the CPU backend itself never warns */
    CHECK(at_cpu_backend()->fallback_warned == 0);

    float got = 0, want_s = ((float *)at_tensor_data(s.c))[0];
    CHECK_OK(at_read_scalar(s.d, &got));
    CHECK(got == want_s);

    pair *all[] = {&a, &b, &c, &w, &y, &r, &lab, &loss, &q, &k, &v, &o, &lse, &seg, &pos, &inv, &s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
}

/* A view at an offset inside a device buffer goes through the fallback too:
 * only the viewed elements change. */
static void test_view_fallback(void)
{
    pair base = mk(AT_F32, 1, SH(40), "base", -1, 1), x = mk(AT_F32, 1, SH(10), "x", -1, 1);
    at_tensor *vc = NULL, *vd = NULL;
    CHECK_OK(at_tensor_view(base.c, 17, 1, SH(10), "base[17:27]", &vc));
    CHECK_OK(at_tensor_view(base.d, 17, 1, SH(10), "base[17:27]", &vd));
    if (vc && vd) {
        CHECK_OK(at_axpy(vc, 2.0f, x.c));
        CHECK_OK(at_axpy(vd, 2.0f, x.d));
        CHECK(same(&base));
    }
    at_tensor_free(vc);
    at_tensor_free(vd);
    pfree(&base);
    pfree(&x);
}

/* Tensors of two backends in one op: an error that names the stray tensor. */
static void test_mixed_backends(void)
{
    pair a = mk(AT_F32, 2, SH(3, 4), "act_on_cpu", -1, 1), b = mk(AT_F32, 2, SH(3, 4), "weight_on_dev", -1, 1);
    pair y = mk(AT_F32, 2, SH(3, 4), "out", 0, 0);
    CHECK_FAILS(at_add(y.d, a.c, a.d), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "act_on_cpu") != NULL, "message: %s", at_last_error());
    CHECK_FAILS(at_add(y.c, a.c, b.d), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "weight_on_dev") != NULL, "message: %s", at_last_error());
    pair c = mk(AT_F32, 2, SH(3, 3), "c", 0, 0);
    CHECK_FAILS(at_matmul(c.d, a.d, b.c, 0, 1, 1.0f, 0.0f), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "weight_on_dev") != NULL, "message: %s", at_last_error());
    /* an index tensor of attention on the wrong backend */
    pair q = mk(AT_F32, 4, SH(1, 3, 1, 4), "q", -1, 1), o = mk(AT_F32, 4, SH(1, 3, 1, 4), "o", 0, 0);
    pair seg = mk(AT_I32, 2, SH(1, 3), "segments_on_cpu", 0, 0);
    at_attn_params ap = {.scale = 0.5f, .segments = seg.c};
    CHECK_FAILS(at_attention_forward(o.d, NULL, q.d, q.d, q.d, &ap), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "segments_on_cpu") != NULL, "message: %s", at_last_error());
    pair *all[] = {&a, &b, &y, &c, &q, &o, &seg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
}

int main(void)
{
    at_log_set_level(AT_LOG_INFO); /* the warnings must be visible whatever ANYTUNE_LOG says */
    test_ops_fall_back();
    test_view_fallback();
    test_mixed_backends();
    CHECK_MSG(stats.allocs == stats.frees, "test device: %d allocations, %d frees", stats.allocs, stats.frees);
    CHECK(stats.uploads > 0 && stats.downloads > 0);
    return at_test_result("test_fallback");
}
