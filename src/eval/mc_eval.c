#include "eval/mc_eval.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/log.h"
#include "model/kv_cache.h"
#include "text/tokenizer.h"

at_status at_mc_choice_ids(const at_tokenizer *tok, int32_t ids[4])
{
    for (int k = 0; k < 4; k++) {
        char letter[2] = {(char)('A' + k), 0};
        int32_t *t = NULL;
        size_t n = 0;
        AT_TRY(at_tokenizer_encode(tok, letter, 1, 0, &t, &n));
        if (n == 0) {
            free(t);
            return at_error(AT_ERR_UNSUPPORTED, "the tokenizer encodes \"%s\" as no token: no choice token", letter);
        }
        ids[k] = t[n - 1];
        free(t);
        for (int j = 0; j < k; j++)
            if (ids[j] == ids[k])
                return at_error(AT_ERR_UNSUPPORTED, "the tokenizer gives \"%c\" and \"%c\" the same last token %d",
                                'A' + j, 'A' + k, (int)ids[k]);
    }
    return AT_OK;
}

static at_status encode_with(const at_bundle *b, const at_mc_subject *s, size_t q, const at_mc_options *o,
                             const at_mc_item *shots, size_t n_shots, int32_t **ids, size_t *n, char **text)
{
    cJSON *msgs = NULL;
    char *t = NULL;
    size_t len = 0;
    AT_TRY(at_mc_messages(&s->eval.items[q], shots, n_shots, s->name, o->lang, &msgs));
    at_status st = at_mc_prompt_text(b->tmpl, msgs, &t, &len);
    cJSON_Delete(msgs);
    if (st != AT_OK) return at_error_wrap(st, "%s:%d", s->eval.path, s->eval.items[q].line);
    /* a template writes its own BOS; without one the tokenizer adds it, as
     * LLaMA-Factory's templates do */
    unsigned flags = AT_TOK_PARSE_SPECIAL | (b->tmpl ? 0u : (unsigned)AT_TOK_ADD_SPECIAL);
    st = at_tokenizer_encode(b->tokenizer, t, len, flags, ids, n);
    if (st == AT_OK && text) *text = t;
    else free(t);
    return st;
}

at_status at_mc_encode(const at_bundle *b, const at_mc_subject *s, size_t q, const at_mc_options *o, int max_len,
                       int32_t **ids, size_t *n, int *shots, char **text)
{
    *ids = NULL;
    *n = 0;
    *shots = 0;
    if (text) *text = NULL;
    if (q >= s->eval.n) return at_error(AT_ERR_INVALID, "%s: question %zu of %zu", s->eval.path, q, s->eval.n);
    size_t all = o->n_shot > 0 ? (size_t)o->n_shot : 0, k;
    if (all > s->dev.n) all = s->dev.n;
    /* LLaMA-Factory's template truncation: the earliest shots go first, the
     * last k of the first `all` dev questions stay */
    for (k = all;;) {
        AT_TRY(encode_with(b, s, q, o, s->dev.items + (all - k), k, ids, n, text));
        if (max_len <= 0 || *n <= (size_t)max_len) {
            *shots = (int)k;
            return AT_OK;
        }
        free(*ids);
        *ids = NULL;
        *n = 0;
        if (text) {
            free(*text);
            *text = NULL;
        }
        if (k == 0) return AT_OK; /* too long even alone */
        k--;
    }
}

/* ---- running ---- */

typedef struct {
    int32_t *ids;
    size_t n;
    size_t q;
} prompt;

static int cmp_len(const void *a, const void *b)
{
    const prompt *x = a, *y = b;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->q < y->q ? -1 : x->q > y->q;
}

void at_mc_result_free(at_mc_result *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free(r->subjects[i].preds);
    free(r->subjects);
    memset(r, 0, sizeof *r);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs the prompts p[0..np) (sorted by length) of one subject in batches. */
static at_status run_subject(at_bundle *b, const prompt *p, size_t np, int batch, const int32_t choice[4],
                             at_mc_pred *preds)
{
    at_decoder *d = b->decoder;
    int64_t V = d->cfg.vocab_size;
    int max_seq = np ? (int)p[np - 1].n : 0;
    if (max_seq == 0) return AT_OK;
    if ((size_t)batch > np) batch = (int)np; /* a small subject needs no cache rows it never fills */
    at_kv_cache *cache = NULL;
    at_tensor *logits = NULL;
    int32_t *ids = NULL;
    float *host = NULL;
    int *n_new = NULL;
    at_status st = AT_OK;
    AT_CHECK(at_kv_cache_new(&d->cfg, d->be, AT_F32, batch, max_seq, &cache));
    int64_t shape[2] = {batch, V};
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, shape, "mc_logits", &logits));
    ids = calloc((size_t)batch * (size_t)max_seq, sizeof *ids);
    host = malloc((size_t)batch * (size_t)V * sizeof *host);
    n_new = calloc((size_t)batch, sizeof *n_new);
    if (!ids || !host || !n_new) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i0 = 0; i0 < np; i0 += (size_t)batch) {
        size_t nb = np - i0 < (size_t)batch ? np - i0 : (size_t)batch;
        int T = (int)p[i0 + nb - 1].n; /* the longest of the batch: sorted */
        at_kv_cache_reset(cache);
        memset(ids, 0, (size_t)batch * (size_t)T * sizeof *ids);
        for (int r = 0; r < batch; r++) {
            n_new[r] = (size_t)r < nb ? (int)p[i0 + r].n : 0; /* unused rows take no token */
            if ((size_t)r < nb) memcpy(ids + (size_t)r * T, p[i0 + r].ids, p[i0 + r].n * sizeof *ids);
        }
        AT_CHECK(at_decoder_prefill(d, cache, ids, T, n_new, logits, 0));
        AT_CHECK(at_tensor_download(logits, host, (size_t)batch * (size_t)V * sizeof *host));
        for (size_t r = 0; r < nb; r++) {
            at_mc_pred *pr = &preds[p[i0 + r].q];
            const float *row = host + r * (size_t)V;
            pr->pred = 0;
            for (int k = 0; k < 4; k++) {
                pr->logits[k] = row[choice[k]];
                if (row[choice[k]] > row[choice[pr->pred]]) pr->pred = k; /* ties: the earlier letter */
            }
        }
    }
done:
    at_kv_cache_free(cache);
    at_tensor_free(logits);
    free(ids);
    free(host);
    free(n_new);
    return st;
}

at_status at_mc_evaluate(at_bundle *b, const at_mc_bench *bench, const at_mc_options *o, at_mc_result *out)
{
    memset(out, 0, sizeof *out);
    double t0 = now_s();
    int batch = o->batch_size > 0 ? o->batch_size : 8;
    int max_len = at_bundle_context(b, o->max_length);
    AT_TRY(at_mc_choice_ids(b->tokenizer, out->choice_ids));
    for (int k = 0; k < 4; k++)
        if (out->choice_ids[k] < 0 || out->choice_ids[k] >= b->decoder->cfg.vocab_size)
            return at_error(AT_ERR_INVALID, "choice token %d of \"%c\" is outside the model's vocabulary of %d",
                            (int)out->choice_ids[k], 'A' + k, (int)b->decoder->cfg.vocab_size);
    out->subjects = calloc(bench->n ? bench->n : 1, sizeof *out->subjects);
    if (!out->subjects) return at_error(AT_ERR_NOMEM, "out of memory");
    out->n = bench->n;
    at_status st = AT_OK;
    prompt *p = NULL;
    size_t np = 0;
    for (size_t si = 0; si < bench->n && st == AT_OK; si++) {
        const at_mc_subject *s = &bench->subjects[si];
        at_mc_subject_result *sr = &out->subjects[si];
        size_t m = s->eval.n;
        if (o->limit > 0 && (size_t)o->limit < m) m = (size_t)o->limit;
        sr->n = m;
        sr->preds = calloc(m ? m : 1, sizeof *sr->preds);
        p = calloc(m ? m : 1, sizeof *p);
        if (!sr->preds || !p) {
            free(p);
            p = NULL;
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        np = 0;
        size_t fewer_shots = 0;
        for (size_t q = 0; q < m && st == AT_OK; q++) {
            int32_t *ids = NULL;
            size_t n = 0;
            int shots = 0;
            st = at_mc_encode(b, s, q, o, max_len, &ids, &n, &shots, NULL);
            if (st != AT_OK) break;
            sr->preds[q].shots = shots;
            sr->preds[q].n_tokens = (int)n;
            sr->preds[q].pred = -1;
            if (n == 0) {
                sr->skipped++;
                at_log_warn("%s:%d: the question alone is longer than --max_length %d tokens: skipped", s->eval.path,
                            s->eval.items[q].line, max_len);
                continue;
            }
            if (o->n_shot > 0 && (size_t)shots < ((size_t)o->n_shot < s->dev.n ? (size_t)o->n_shot : s->dev.n))
                fewer_shots++;
            p[np++] = (prompt){ids, n, q};
        }
        if (st == AT_OK) {
            qsort(p, np, sizeof *p, cmp_len);
            st = run_subject(b, p, np, batch, out->choice_ids, sr->preds);
        }
        for (size_t i = 0; i < np; i++) free(p[i].ids);
        free(p);
        p = NULL;
        if (st != AT_OK) break;
        for (size_t q = 0; q < m; q++)
            if (sr->preds[q].pred >= 0 && sr->preds[q].pred == s->eval.items[q].answer) sr->correct++;
        out->correct += sr->correct;
        out->total += m - sr->skipped;
        out->skipped += sr->skipped;
        if (fewer_shots)
            at_log_info("%s: %zu of %zu prompts hold fewer than %d shots to fit in %d tokens", s->id, fewer_shots, m,
                        o->n_shot, max_len);
        if (o->progress)
            at_log_info("[%zu/%zu] %s: %.2f%% (%zu/%zu)", si + 1, bench->n, s->id,
                        m > sr->skipped ? 100.0 * (double)sr->correct / (double)(m - sr->skipped) : 0.0, sr->correct,
                        m - sr->skipped);
    }
    out->seconds = now_s() - t0;
    if (st != AT_OK) at_mc_result_free(out);
    return st;
}

/* ---- reports ---- */

/* LLaMA-Factory's categories, in its order; others follow as met. */
static const char *const known_cats[] = {"STEM", "Social Sciences", "Humanities", "Other"};

typedef struct {
    const char *name;
    size_t correct, total;
} tally;

static size_t tally_categories(const at_mc_bench *bench, const at_mc_result *r, tally *t, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < 4 && n < cap; i++) t[n++] = (tally){known_cats[i], 0, 0};
    for (size_t si = 0; si < bench->n; si++) {
        const char *c = bench->subjects[si].category;
        if (!c) continue;
        size_t k = 0;
        while (k < n && strcmp(t[k].name, c) != 0) k++;
        if (k == n) {
            if (n == cap) continue;
            t[n++] = (tally){c, 0, 0};
        }
        t[k].correct += r->subjects[si].correct;
        t[k].total += r->subjects[si].n - r->subjects[si].skipped;
    }
    return n;
}

static cJSON *score(size_t correct, size_t total)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (total) cJSON_AddNumberToObject(o, "accuracy", (double)correct / (double)total);
    else cJSON_AddNullToObject(o, "accuracy");
    cJSON_AddNumberToObject(o, "correct", (double)correct);
    cJSON_AddNumberToObject(o, "total", (double)total);
    return o;
}

cJSON *at_mc_result_json(const at_mc_bench *bench, const at_mc_result *r)
{
    cJSON *j = cJSON_CreateObject(), *cats = cJSON_CreateObject(), *subs = cJSON_CreateObject();
    tally *t = calloc(bench->n + 4, sizeof *t);
    if (!j || !cats || !subs || !t) goto oom;
    cJSON_AddItemToObject(j, "average", score(r->correct, r->total));
    size_t nt = tally_categories(bench, r, t, bench->n + 4);
    for (size_t k = 0; k < nt; k++)
        if (t[k].total) cJSON_AddItemToObject(cats, t[k].name, score(t[k].correct, t[k].total));
    cJSON_AddItemToObject(j, "categories", cats);
    cats = NULL;
    for (size_t si = 0; si < bench->n; si++) {
        const at_mc_subject *s = &bench->subjects[si];
        const at_mc_subject_result *sr = &r->subjects[si];
        cJSON *o = score(sr->correct, sr->n - sr->skipped);
        char *pred = malloc(sr->n + 1);
        if (!o || !pred) {
            cJSON_Delete(o);
            free(pred);
            goto oom;
        }
        for (size_t q = 0; q < sr->n; q++) pred[q] = sr->preds[q].pred >= 0 ? (char)('A' + sr->preds[q].pred) : '-';
        pred[sr->n] = 0;
        cJSON_AddStringToObject(o, "name", s->name);
        if (s->category) cJSON_AddStringToObject(o, "category", s->category);
        else cJSON_AddNullToObject(o, "category");
        cJSON_AddNumberToObject(o, "skipped", (double)sr->skipped);
        cJSON_AddStringToObject(o, "predictions", pred);
        free(pred);
        cJSON_AddItemToObject(subs, s->id, o);
    }
    cJSON_AddItemToObject(j, "subjects", subs);
    subs = NULL;
    cJSON_AddNumberToObject(j, "skipped", (double)r->skipped);
    cJSON_AddNumberToObject(j, "seconds", r->seconds);
    free(t);
    return j;
oom:
    cJSON_Delete(j);
    cJSON_Delete(cats);
    cJSON_Delete(subs);
    free(t);
    return NULL;
}

char *at_mc_result_text(const at_mc_bench *bench, const at_mc_result *r)
{
    tally *t = calloc(bench->n + 5, sizeof *t);
    if (!t) return NULL;
    size_t nt = tally_categories(bench, r, t, bench->n + 4);
    t[nt++] = (tally){"Average", r->correct, r->total};
    /* a line is the name (padded to 15, as LLaMA-Factory's "{:>15}", never
     * cut) and at most 2 + 7 + 2 × 20 + 4 characters of numbers */
    size_t cap = 1, len = 0;
    for (size_t k = 0; k < nt; k++) cap += (strlen(t[k].name) > 15 ? strlen(t[k].name) : 15) + 64;
    char *s = malloc(cap);
    if (s) {
        s[0] = 0;
        for (size_t k = 0; k < nt; k++)
            if (t[k].total)
                len += (size_t)snprintf(s + len, cap - len, "%15s: %.2f (%zu/%zu)\n", t[k].name,
                                        100.0 * (double)t[k].correct / (double)t[k].total, t[k].correct, t[k].total);
    }
    free(t);
    return s;
}
