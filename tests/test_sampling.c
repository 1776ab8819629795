/* Sampling: the logits processors against a PyTorch rendering of Hugging
 * Face's (and vLLM's penalties) in tools/make_sampling_goldens.py; draws
 * against the processed distribution; greedy ties; seeds; refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"
#include "infer/sampling.h"
#include "testing.h"

#define GOLDENS "tests/data/sampling/processors.json"

static at_sampling_params params_of(const cJSON *p)
{
    at_sampling_params s = at_sampling_defaults();
    s.temperature = (float)cJSON_GetObjectItem(p, "temperature")->valuedouble;
    s.top_k = cJSON_GetObjectItem(p, "top_k")->valueint;
    s.top_p = (float)cJSON_GetObjectItem(p, "top_p")->valuedouble;
    s.min_p = (float)cJSON_GetObjectItem(p, "min_p")->valuedouble;
    s.repetition_penalty = (float)cJSON_GetObjectItem(p, "repetition_penalty")->valuedouble;
    s.presence_penalty = (float)cJSON_GetObjectItem(p, "presence_penalty")->valuedouble;
    s.frequency_penalty = (float)cJSON_GetObjectItem(p, "frequency_penalty")->valuedouble;
    return s;
}

static int ids_of(const cJSON *a, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) if (n < cap) out[n++] = it->valueint;
    return n;
}

/* A sampler set up as the case says: prompt recorded, generated tokens accepted. */
static at_sampler *case_sampler(const cJSON *c, int V, float *logits, float *want, int *finite)
{
    at_sampling_params p = params_of(cJSON_GetObjectItem(c, "params"));
    p.seed = 7;
    at_sampler *s = NULL;
    CHECK_OK(at_sampler_new(&p, V, &s));
    if (!s) return NULL;
    int32_t prompt[64], gen[64];
    int np = ids_of(cJSON_GetObjectItem(c, "prompt"), prompt, 64);
    int ng = ids_of(cJSON_GetObjectItem(c, "generated"), gen, 64);
    at_sampler_reset(s, prompt, (size_t)np);
    for (int i = 0; i < ng; i++) at_sampler_accept(s, gen[i]);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(c, "logits")) logits[i++] = (float)it->valuedouble;
    i = 0;
    *finite = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(c, "expected")) {
        want[i++] = cJSON_IsNull(it) ? -INFINITY : (float)it->valuedouble;
        *finite += !cJSON_IsNull(it);
    }
    return s;
}

static void test_processors(void)
{
    cJSON *g = NULL;
    CHECK_OK(at_json_parse_file(GOLDENS, &g));
    if (!g) return;
    int V = cJSON_GetObjectItem(g, "vocab")->valueint, k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        float logits[256], want[256];
        int finite;
        at_sampler *s = case_sampler(c, V, logits, want, &finite);
        if (!s) continue;
        at_sampler_process(s, logits);
        double err = 0;
        int same_mask = 1;
        for (int i = 0; i < V; i++) {
            if (isinf(want[i]) != isinf(logits[i])) same_mask = 0;
            else if (!isinf(want[i])) err = fmax(err, fabs(logits[i] - want[i]) / fmax(1.0, fabs(want[i])));
        }
        CHECK_MSG(same_mask, "case %d: the kept tokens differ from the reference", k);
        CHECK_MSG(err < 1e-5, "case %d: processed logits differ by %g", k, err);
        at_sampler_free(s);
        k++;
    }
    CHECK(k >= 10);
    printf("processors: %d cases equal to the PyTorch reference\n", k);
    cJSON_Delete(g);
}

/* Draws from cases of the goldens and compares frequencies with the
 * processed distribution: id-order walk (no top-p) and descending walk (top-p). */
static void test_draws(void)
{
    cJSON *g = NULL;
    CHECK_OK(at_json_parse_file(GOLDENS, &g));
    if (!g) return;
    int V = cJSON_GetObjectItem(g, "vocab")->valueint;
    int which[] = {1, 2, 4, 7, 10};
    for (size_t w = 0; w < sizeof which / sizeof which[0]; w++) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "cases"), which[w]);
        float logits[256], want[256];
        int finite;
        at_sampler *s = case_sampler(c, V, logits, want, &finite);
        if (!s) continue;
        double p[256], z = 0, mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = fmax(mx, want[i]);
        for (int i = 0; i < V; i++) z += p[i] = isinf(want[i]) ? 0 : exp(want[i] - mx);
        int count[256] = {0};
        const int N = 20000;
        for (int t = 0; t < N; t++) {
            int32_t id = at_sampler_sample(s, logits);
            if (id >= 0 && id < V) count[id]++;
        }
        double worst = 0;
        int outside = 0;
        for (int i = 0; i < V; i++) {
            double q = p[i] / z, f = (double)count[i] / N, sd = sqrt(q * (1 - q) / N);
            if (q == 0 && count[i]) outside = 1;
            worst = fmax(worst, fabs(f - q) / (sd + 1e-4));
        }
        CHECK_MSG(!outside, "case %d: drew a removed token", which[w]);
        CHECK_MSG(worst < 5, "case %d: frequencies off by %.1f standard deviations", which[w], worst);
        at_sampler_free(s);
    }
    cJSON_Delete(g);
}

static void test_greedy_and_seeds(void)
{
    at_sampling_params p = at_sampling_defaults();
    p.top_k = 1; /* ignored by greedy */
    at_sampler *s = NULL;
    CHECK_OK(at_sampler_new(&p, 8, &s));
    float l[8] = {0, 3, 1, 3, -2, 2.5f, 3, 0};
    CHECK(at_sampler_sample(s, l) == 1); /* ties: the lowest id, as torch.argmax */
    at_sampler_accept(s, 1);
    p.repetition_penalty = 2.0f;
    at_sampler_free(s);
    CHECK_OK(at_sampler_new(&p, 8, &s));
    at_sampler_reset(s, (int32_t[]){1}, 1);
    CHECK(at_sampler_sample(s, l) == 3); /* 1 was seen: 3 / 2 */
    at_sampler_free(s);

    /* the same seed draws the same tokens; reset starts over; another seed differs */
    at_sampling_params q = at_sampling_defaults();
    q.temperature = 1.0f;
    q.seed = 133742;
    at_sampler *a = NULL, *b = NULL;
    CHECK_OK(at_sampler_new(&q, 8, &a));
    CHECK_OK(at_sampler_new(&q, 8, &b));
    float flat[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t sa[64], sb[64];
    int same = 1, diff = 0;
    for (int i = 0; i < 64; i++) sa[i] = at_sampler_sample(a, flat);
    for (int i = 0; i < 64; i++) same &= (sb[i] = at_sampler_sample(b, flat)) == sa[i];
    CHECK(same);
    at_sampler_reset(a, NULL, 0);
    same = 1;
    for (int i = 0; i < 64; i++) same &= at_sampler_sample(a, flat) == sa[i];
    CHECK(same);
    at_sampler_free(b);
    q.seed = 133743;
    CHECK_OK(at_sampler_new(&q, 8, &b));
    for (int i = 0; i < 64; i++) diff += at_sampler_sample(b, flat) != sa[i];
    CHECK(diff > 16);
    at_sampler_free(a);
    at_sampler_free(b);

    /* llama2.c's generator gives floats in [0, 1) on a 2^-24 grid */
    uint64_t st = 133742;
    int ok = 1;
    for (int i = 0; i < 1000; i++) {
        float f = at_sampler_rng_f32(&st);
        ok &= f >= 0 && f < 1 && f * 16777216.0f == floorf(f * 16777216.0f);
    }
    CHECK(ok);
}

static void test_refusals(void)
{
    at_sampler *s = NULL;
    at_sampling_params p = at_sampling_defaults();
    p.temperature = -1;
    CHECK_FAILS(at_sampler_new(&p, 8, &s), AT_ERR_INVALID);
    p = at_sampling_defaults();
    p.top_p = 0;
    CHECK_FAILS(at_sampler_new(&p, 8, &s), AT_ERR_INVALID);
    p = at_sampling_defaults();
    p.min_p = 1.5f;
    CHECK_FAILS(at_sampler_new(&p, 8, &s), AT_ERR_INVALID);
    p = at_sampling_defaults();
    p.repetition_penalty = 0;
    CHECK_FAILS(at_sampler_new(&p, 8, &s), AT_ERR_INVALID);
    p = at_sampling_defaults();
    p.presence_penalty = NAN;
    CHECK_FAILS(at_sampler_new(&p, 8, &s), AT_ERR_INVALID);
    p = at_sampling_defaults();
    CHECK_FAILS(at_sampler_new(&p, 0, &s), AT_ERR_INVALID);
    CHECK(s == NULL);
}

int main(void)
{
    test_processors();
    test_draws();
    test_greedy_and_seeds();
    test_refusals();
    return at_test_result("test_sampling");
}
