#include "infer/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A candidate token: its value (probability or logit) and id. */
typedef struct { float v; int32_t id; } cand;

struct at_sampler {
    at_sampling_params p;
    int vocab;
    uint64_t rng;
    uint8_t *seen;     /* [vocab] token appeared in the prompt or the output */
    int32_t *count;    /* [vocab] times generated */
    int32_t *seen_ids; /* the ids with seen set, n_seen of them */
    int32_t *gen_ids;  /* the ids with count > 0, n_gen of them */
    int n_seen, n_gen;
    float *work;       /* [vocab] processed logits */
    float *val;        /* [vocab] scratch values */
    cand *cands;       /* [vocab] candidates of top-p */
};

at_sampling_params at_sampling_defaults(void)
{
    at_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

at_status at_sampling_validate(const at_sampling_params *p)
{
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return at_error(AT_ERR_INVALID, "temperature must be a finite number >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return at_error(AT_ERR_INVALID, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return at_error(AT_ERR_INVALID, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return at_error(AT_ERR_INVALID, "repetition_penalty must be > 0 (got %g)", p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return at_error(AT_ERR_INVALID, "presence_penalty and frequency_penalty must be finite");
    return AT_OK;
}

/* llama2.c's xorshift64* and its 24-bit float. */
static uint32_t rng_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

float at_sampler_rng_f32(uint64_t *state) { return (float)(rng_u32(state) >> 8) / 16777216.0f; }

at_status at_sampler_new(const at_sampling_params *p, int vocab, at_sampler **out)
{
    *out = NULL;
    AT_TRY(at_sampling_validate(p));
    if (vocab <= 0) return at_error(AT_ERR_INVALID, "sampler: vocabulary size %d", vocab);
    at_sampler *s = calloc(1, sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "sampler: out of memory");
    size_t V = (size_t)vocab;
    s->p = *p;
    s->vocab = vocab;
    s->seen = calloc(V, 1);
    s->count = calloc(V, sizeof *s->count);
    s->seen_ids = malloc(V * sizeof *s->seen_ids);
    s->gen_ids = malloc(V * sizeof *s->gen_ids);
    s->work = malloc(V * sizeof *s->work);
    s->val = malloc(V * sizeof *s->val);
    s->cands = malloc(V * sizeof *s->cands);
    if (!s->seen || !s->count || !s->seen_ids || !s->gen_ids || !s->work || !s->val || !s->cands) {
        at_sampler_free(s);
        return at_error(AT_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d", vocab);
    }
    at_sampler_reset(s, NULL, 0);
    *out = s;
    return AT_OK;
}

void at_sampler_free(at_sampler *s)
{
    if (!s) return;
    free(s->seen);
    free(s->count);
    free(s->seen_ids);
    free(s->gen_ids);
    free(s->work);
    free(s->val);
    free(s->cands);
    free(s);
}

static void mark_seen(at_sampler *s, int32_t id)
{
    if (id < 0 || id >= s->vocab || s->seen[id]) return;
    s->seen[id] = 1;
    s->seen_ids[s->n_seen++] = id;
}

void at_sampler_reset(at_sampler *s, const int32_t *prompt, size_t n)
{
    for (int i = 0; i < s->n_seen; i++) s->seen[s->seen_ids[i]] = 0;
    for (int i = 0; i < s->n_gen; i++) s->count[s->gen_ids[i]] = 0;
    s->n_seen = s->n_gen = 0;
    /* a zero state would stay zero forever */
    s->rng = s->p.seed ? s->p.seed : 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) mark_seen(s, prompt[i]);
}

void at_sampler_accept(at_sampler *s, int32_t id)
{
    if (id < 0 || id >= s->vocab) return;
    mark_seen(s, id);
    if (s->count[id]++ == 0) s->gen_ids[s->n_gen++] = id;
}

/* Descending value, then ascending id (a total order). */
static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The k-th largest of v[0..n) (1-based k <= n); v is reordered. Quickselect. */
static float kth_largest(float *v, int n, int k)
{
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

/* probs (unnormalized, exp(l - max)) of the finite logits into s->val; returns their sum. */
static double softmax_unnorm(at_sampler *s, const float *l)
{
    float mx = -INFINITY;
    for (int i = 0; i < s->vocab; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    for (int i = 0; i < s->vocab; i++) {
        float e = isfinite(l[i]) ? expf(l[i] - mx) : 0.0f;
        s->val[i] = e;
        sum += e;
    }
    return sum;
}

static void top_k(at_sampler *s, float *l)
{
    int k = s->p.top_k, n = 0;
    if (k <= 0 || k >= s->vocab) return;
    for (int i = 0; i < s->vocab; i++)
        if (!isnan(l[i])) s->val[n++] = l[i];
    if (k >= n) return;
    float thr = kth_largest(s->val, n, k);
    for (int i = 0; i < s->vocab; i++)
        if (l[i] < thr) l[i] = -INFINITY;
}

/* Keeps token j (in descending probability) while the mass above it is below
 * p. Tokens under (1 - p) / (V - 1) can never be kept (everything below them
 * weighs less than 1 - p), so they are dropped before sorting, as llama2.c. */
static void top_p(at_sampler *s, float *l)
{
    float p = s->p.top_p;
    if (p >= 1.0f) return;
    double sum = softmax_unnorm(s, l);
    if (!(sum > 0)) return;
    double cutoff = s->vocab > 1 ? (1.0 - p) / (s->vocab - 1) * sum : 0;
    int n = 0;
    cand *cs = s->cands;
    for (int i = 0; i < s->vocab; i++)
        if (s->val[i] > 0 && s->val[i] >= cutoff) cs[n++] = (cand){s->val[i], i};
    qsort(cs, (size_t)n, sizeof *cs, cand_desc);
    double above = 0;
    int keep = 0;
    while (keep < n && (keep == 0 || above < p * sum)) above += cs[keep++].v;
    for (int i = 0; i < s->vocab; i++) s->val[i] = 0; /* kept marks */
    for (int i = 0; i < keep; i++) s->val[cs[i].id] = 1;
    for (int i = 0; i < s->vocab; i++)
        if (s->val[i] == 0) l[i] = -INFINITY;
}

static void min_p(at_sampler *s, float *l)
{
    float mp = s->p.min_p;
    if (mp <= 0.0f) return;
    (void)softmax_unnorm(s, l); /* the largest is exp(0) = 1 */
    for (int i = 0; i < s->vocab; i++)
        if (s->val[i] < mp) l[i] = -INFINITY;
}

void at_sampler_process(at_sampler *s, float *l)
{
    float r = s->p.repetition_penalty;
    if (r != 1.0f)
        for (int i = 0; i < s->n_seen; i++) {
            int32_t id = s->seen_ids[i];
            l[id] = l[id] > 0 ? l[id] / r : l[id] * r;
        }
    if (s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f)
        for (int i = 0; i < s->n_gen; i++) {
            int32_t id = s->gen_ids[i];
            l[id] -= s->p.frequency_penalty * (float)s->count[id] + s->p.presence_penalty;
        }
    if (s->p.temperature <= 0.0f) return;
    if (s->p.temperature != 1.0f)
        for (int i = 0; i < s->vocab; i++) l[i] /= s->p.temperature;
    top_k(s, l);
    top_p(s, l);
    min_p(s, l);
}

int32_t at_sampler_sample(at_sampler *s, const float *logits)
{
    float *l = s->work;
    memcpy(l, logits, (size_t)s->vocab * sizeof *l);
    at_sampler_process(s, l);
    if (s->p.temperature <= 0.0f) {
        int32_t best = 0;
        for (int i = 1; i < s->vocab; i++)
            if (l[i] > l[best] || (isnan(l[best]) && !isnan(l[i]))) best = i;
        return best;
    }
    double sum = softmax_unnorm(s, l);
    float coin = at_sampler_rng_f32(&s->rng);
    int32_t last = -1;
    if (s->p.top_p < 1.0f) {
        /* descending probability, as llama2.c's sample_topp */
        int n = 0;
        cand *cs = s->cands;
        for (int i = 0; i < s->vocab; i++)
            if (s->val[i] > 0) cs[n++] = (cand){s->val[i], i};
        qsort(cs, (size_t)n, sizeof *cs, cand_desc);
        double r = coin * sum, cdf = 0;
        for (int i = 0; i < n; i++) {
            cdf += cs[i].v;
            if (r < cdf) return cs[i].id;
        }
        if (n) return cs[n - 1].id;
    }
    /* id order, as llama2.c's sample_mult */
    double r = coin * sum, cdf = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (s->val[i] <= 0) continue;
        last = i;
        cdf += s->val[i];
        if (r < cdf) return i;
    }
    return last >= 0 ? last : 0;
}
