/* Encoding and batching with a fake tokenizer (one token per byte, id =
 * byte + 3, optional BOS = 1 before and EOS = 2 after, both without bytes)
 * and a fake renderer ("U:" user "\n", "A:" reply "$", the reply and its
 * "$" trained). Expected ids, labels and layouts are worked out by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/batch.h"
#include "data/encode.h"
#include "testing.h"

typedef struct {
    int bos, eos;
} fake_tok;

static at_status tokenize(void *ctx, const char *text, size_t len, int32_t **ids, at_byte_span **off, size_t *n)
{
    const fake_tok *t = ctx;
    size_t m = len + (size_t)t->bos + (size_t)t->eos, k = 0;
    *ids = malloc((m ? m : 1) * sizeof **ids);
    *off = malloc((m ? m : 1) * sizeof **off);
    if (!*ids || !*off) return at_error(AT_ERR_NOMEM, "oom");
    if (t->bos) {
        (*ids)[k] = 1;
        (*off)[k++] = (at_byte_span){0, 0};
    }
    for (size_t i = 0; i < len; i++) {
        (*ids)[k] = (unsigned char)text[i] + 3;
        (*off)[k++] = (at_byte_span){i, i + 1};
    }
    if (t->eos) {
        (*ids)[k] = 2;
        (*off)[k++] = (at_byte_span){len, len};
    }
    *n = m;
    return AT_OK;
}

static at_status render(void *ctx, const at_sample *s, char **text, size_t *len, at_byte_span **spans, size_t *ns)
{
    (void)ctx;
    size_t cap = 16;
    for (size_t i = 0; i < s->messages.n; i++) cap += strlen(s->messages.items[i].content) + 3;
    *text = malloc(cap);
    *spans = malloc((s->messages.n + 1) * sizeof **spans);
    if (!*text || !*spans) return at_error(AT_ERR_NOMEM, "oom");
    char *out = *text;
    size_t o = 0, k = 0;
    for (size_t i = 0; i < s->messages.n; i++) {
        const at_message *m = &s->messages.items[i];
        int asst = m->role == AT_ROLE_ASSISTANT;
        size_t cl = strlen(m->content);
        memcpy(out + o, asst ? "A:" : "U:", 2);
        o += 2;
        size_t b = o;
        memcpy(out + o, m->content, cl);
        o += cl;
        out[o++] = asst ? '$' : '\n';
        if (asst) (*spans)[k++] = (at_byte_span){b, o};
    }
    *len = o;
    *ns = k;
    return AT_OK;
}

static at_sample conversation(at_message *m, size_t n)
{
    at_sample s;
    memset(&s, 0, sizeof s);
    s.kind = AT_SAMPLE_CONVERSATION;
    s.messages = (at_messages){m, n};
    s.source = "test";
    s.label = -1;
    return s;
}

static int same(const int32_t *a, const int32_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static void test_labels(void)
{
    fake_tok tok = {1, 1};
    at_encoder enc = {render, NULL, tokenize, &tok, 0, AT_TRUNCATE_DELETE};
    at_message m[4] = {{AT_ROLE_USER, "hi", NULL, -1}, {AT_ROLE_ASSISTANT, "yo", NULL, -1},
                       {AT_ROLE_USER, "x", NULL, -1}, {AT_ROLE_ASSISTANT, "z", NULL, -1}};
    at_sample s = conversation(m, 2);
    at_encoded e;
    int dropped = 1;
    /* "U:hi\nA:yo$": the reply "yo$" is bytes [7, 10); EOS sits at 10 */
    CHECK_OK(at_encode_sample(&enc, &s, &e, &dropped));
    static const int32_t ids[12] = {1, 88, 61, 107, 108, 13, 68, 61, 124, 114, 39, 2};
    static const int32_t lab[12] = {-100, -100, -100, -100, -100, -100, -100, -100, 124, 114, 39, 2};
    CHECK(!dropped && e.n == 12 && same(e.ids, ids, 12) && same(e.labels, lab, 12));
    at_encoded_free(&e);

    /* two turns: "U:hi\nA:yo$U:x\nA:z$" (18 bytes) without BOS/EOS */
    tok.bos = tok.eos = 0;
    s = conversation(m, 4);
    CHECK_OK(at_encode_sample(&enc, &s, &e, &dropped));
    static const int32_t want[18] = {-100, -100, -100, -100, -100, -100, -100, 124, 114, 39,
                                     -100, -100, -100, -100, -100, -100, 'z' + 3, '$' + 3};
    CHECK(e.n == 18 && same(e.labels, want, 18));
    at_encoded_free(&e);

    /* the rule itself: inside = fully inside; empty tokens by position */
    static const int32_t tid[6] = {10, 11, 12, 13, 14, 15};
    static const at_byte_span off[6] = {{5, 8}, {6, 8}, {8, 10}, {10, 10}, {6, 6}, {12, 13}};
    static const at_byte_span spans[3] = {{12, 14}, {6, 10}, {7, 9}}; /* unsorted, overlapping */
    int32_t got[6];
    CHECK_OK(at_encode_labels(tid, off, 6, spans, 3, got));
    static const int32_t wl[6] = {-100, 11, 12, 13, -100, 15};
    CHECK(same(got, wl, 6));
    static const at_byte_span bad[1] = {{3, 2}};
    CHECK_FAILS(at_encode_labels(tid, bad, 1, spans, 3, got), AT_ERR_INVALID);

    /* text samples (pt): everything but the BOS is trained */
    tok.bos = tok.eos = 1;
    at_sample t;
    memset(&t, 0, sizeof t);
    t.kind = AT_SAMPLE_TEXT;
    t.text = "ab";
    CHECK_OK(at_encode_sample(&enc, &t, &e, &dropped));
    static const int32_t tl[4] = {-100, 100, 101, 2};
    CHECK(e.n == 4 && same(e.labels, tl, 4));
    at_encoded_free(&e);

    /* token samples: as given, labels default to the ids */
    static const int32_t pi[3] = {5, 6, 7}, pl[3] = {-100, 6, 7};
    at_sample k;
    memset(&k, 0, sizeof k);
    k.kind = AT_SAMPLE_TOKENS;
    k.input_ids = pi;
    k.n_tokens = 3;
    CHECK_OK(at_encode_sample(&enc, &k, &e, &dropped));
    CHECK(e.n == 3 && same(e.labels, pi, 3));
    at_encoded_free(&e);
    k.labels = pl;
    CHECK_OK(at_encode_sample(&enc, &k, &e, &dropped));
    CHECK(e.n == 3 && same(e.labels, pl, 3) && same(e.ids, pi, 3));
    at_encoded_free(&e);

    /* preference: prompt + chosen, prompt + rejected */
    at_message ch = {AT_ROLE_ASSISTANT, "yo", NULL, -1}, rj = {AT_ROLE_ASSISTANT, "no!", NULL, -1};
    at_sample p = conversation(m, 1);
    p.kind = AT_SAMPLE_PREFERENCE;
    p.chosen = (at_messages){&ch, 1};
    p.rejected = (at_messages){&rj, 1};
    at_encoded c, r;
    tok.bos = tok.eos = 0;
    CHECK_OK(at_encode_preference(&enc, &p, &c, &r, &dropped));
    CHECK(!dropped && c.n == 10 && r.n == 11 && c.labels[6] == -100 && c.labels[7] == 124 && r.labels[7] == 'n' + 3);
    at_encoded_free(&c);
    at_encoded_free(&r);
    CHECK_FAILS(at_encode_sample(&enc, &p, &e, &dropped), AT_ERR_INVALID);
}

static void test_truncation(void)
{
    fake_tok tok = {0, 0};
    at_encoder enc = {render, NULL, tokenize, &tok, 4, AT_TRUNCATE_LEFT};
    at_sample t;
    memset(&t, 0, sizeof t);
    t.kind = AT_SAMPLE_TEXT;
    t.text = "abcdef";
    at_encoded e;
    int dropped = 0;
    CHECK_OK(at_encode_sample(&enc, &t, &e, &dropped));
    static const int32_t left[4] = {'c' + 3, 'd' + 3, 'e' + 3, 'f' + 3}, right[4] = {'a' + 3, 'b' + 3, 'c' + 3, 'd' + 3};
    CHECK(!dropped && e.n == 4 && same(e.ids, left, 4) && same(e.labels, left, 4));
    at_encoded_free(&e);
    enc.truncation = AT_TRUNCATE_RIGHT;
    CHECK_OK(at_encode_sample(&enc, &t, &e, &dropped));
    CHECK(!dropped && e.n == 4 && same(e.ids, right, 4));
    at_encoded_free(&e);
    enc.truncation = AT_TRUNCATE_DELETE;
    CHECK_OK(at_encode_sample(&enc, &t, &e, &dropped));
    CHECK(dropped && e.n == 0 && e.ids == NULL);
    enc.max_length = 6; /* exactly the limit: kept */
    CHECK_OK(at_encode_sample(&enc, &t, &e, &dropped));
    CHECK(!dropped && e.n == 6);
    at_encoded_free(&e);
    at_truncation tr;
    CHECK_OK(at_truncation_parse("left", &tr));
    CHECK(tr == AT_TRUNCATE_LEFT);
    CHECK_FAILS(at_truncation_parse("split", &tr), AT_ERR_INVALID);
}

static void make_encoded(at_encoded *e, size_t n, int32_t base)
{
    e->n = n;
    e->ids = malloc(n * sizeof *e->ids);
    e->labels = malloc(n * sizeof *e->labels);
    for (size_t i = 0; i < n; i++) {
        e->ids[i] = base + (int32_t)i;
        e->labels[i] = i == 0 ? -100 : base + (int32_t)i;
    }
}

static void test_packing(void)
{
    /* FFD by hand: 6 -> row 0, 5 -> row 1, 4 -> row 2, 3 -> row 1, 2 -> row 0 */
    static const size_t len[5] = {5, 3, 4, 2, 6};
    size_t bin_of[5], nb = 0;
    CHECK_OK(at_pack_ffd(len, 5, 8, bin_of, &nb));
    CHECK(nb == 3 && bin_of[0] == 1 && bin_of[1] == 1 && bin_of[2] == 2 && bin_of[3] == 0 && bin_of[4] == 0);
    static const size_t too_long[2] = {3, 9};
    CHECK_FAILS(at_pack_ffd(too_long, 2, 8, bin_of, &nb), AT_ERR_INVALID);

    /* random lengths: rows never overflow, every sample placed, near optimal */
    size_t rl[300], bo[300], sum = 0;
    unsigned x = 12345;
    for (int i = 0; i < 300; i++) {
        x = x * 1103515245u + 12345u;
        rl[i] = 1 + (x >> 16) % 64;
        sum += rl[i];
    }
    CHECK_OK(at_pack_ffd(rl, 300, 64, bo, &nb));
    size_t fill[300] = {0};
    int ok = 1;
    for (int i = 0; i < 300; i++) {
        ok &= bo[i] < nb;
        if (bo[i] < nb) fill[bo[i]] += rl[i];
    }
    for (size_t b = 0; b < nb; b++) ok &= fill[b] > 0 && fill[b] <= 64;
    size_t lower = (sum + 63) / 64;
    CHECK(ok && nb >= lower && nb <= lower * 11 / 9 + 2);

    /* batches of packed rows, in row order */
    at_encoded s[5];
    for (int i = 0; i < 5; i++) make_encoded(&s[i], len[i], 100 * (i + 1));
    at_batch_options o = {.batch_size = 2, .packing_length = 8};
    at_batch_plan plan;
    CHECK_OK(at_batch_plan_make(len, 5, &o, &plan));
    CHECK(plan.n_batches == 2 && plan.n_rows == 3);
    at_batch b;
    CHECK_OK(at_batch_build(&plan, 0, s, 5, 0, &b));
    CHECK(b.rows == 2 && b.cols == 8 && b.lengths[0] == 8 && b.lengths[1] == 8);
    static const int32_t ids0[8] = {400, 401, 500, 501, 502, 503, 504, 505};
    static const int32_t lab0[8] = {-100, 401, -100, 501, 502, 503, 504, 505};
    static const int32_t pos0[8] = {0, 1, 0, 1, 2, 3, 4, 5}, seg0[8] = {1, 1, 2, 2, 2, 2, 2, 2};
    static const int32_t ids1[8] = {100, 101, 102, 103, 104, 200, 201, 202};
    static const int32_t pos1[8] = {0, 1, 2, 3, 4, 0, 1, 2}, seg1[8] = {1, 1, 1, 1, 1, 2, 2, 2};
    CHECK(same(b.ids, ids0, 8) && same(b.labels, lab0, 8) && same(b.positions, pos0, 8) && same(b.segments, seg0, 8));
    CHECK(same(b.ids + 8, ids1, 8) && same(b.positions + 8, pos1, 8) && same(b.segments + 8, seg1, 8));
    at_batch_free(&b);
    CHECK_OK(at_batch_build(&plan, 1, s, 5, 7, &b));
    static const int32_t ids2[8] = {300, 301, 302, 303, 7, 7, 7, 7}, lab2[8] = {-100, 301, 302, 303, -100, -100, -100, -100};
    static const int32_t pos2[8] = {0, 1, 2, 3, 0, 0, 0, 0}, seg2[8] = {1, 1, 1, 1, 0, 0, 0, 0};
    CHECK(b.rows == 1 && b.lengths[0] == 4 && same(b.ids, ids2, 8) && same(b.labels, lab2, 8) &&
          same(b.positions, pos2, 8) && same(b.segments, seg2, 8));
    at_batch_free(&b);
    CHECK_FAILS(at_batch_build(&plan, 2, s, 5, 0, &b), AT_ERR_INVALID);
    at_batch_plan_free(&plan);

    /* unpacked: padded to the longest row of the batch */
    o.packing_length = 0;
    CHECK_OK(at_batch_plan_make(len, 5, &o, &plan));
    CHECK(plan.n_batches == 3);
    CHECK_OK(at_batch_build(&plan, 0, s, 5, 0, &b));
    static const int32_t u_ids[10] = {100, 101, 102, 103, 104, 200, 201, 202, 0, 0};
    static const int32_t u_pos[10] = {0, 1, 2, 3, 4, 0, 1, 2, 0, 0}, u_seg[10] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    CHECK(b.rows == 2 && b.cols == 5 && same(b.ids, u_ids, 10) && same(b.positions, u_pos, 10) &&
          same(b.segments, u_seg, 10) && b.lengths[1] == 3 && b.labels[9] == -100);
    at_batch_free(&b);
    at_batch_plan_free(&plan);
    o.drop_last = 1;
    CHECK_OK(at_batch_plan_make(len, 5, &o, &plan));
    CHECK(plan.n_batches == 2);
    at_batch_plan_free(&plan);
    for (int i = 0; i < 5; i++) at_encoded_free(&s[i]);
}

/* Lengths of each batch's rows, in batch order, for comparing orders. */
static void batch_lengths(const at_batch_plan *p, const size_t *len, size_t *out)
{
    size_t k = 0;
    for (size_t b = 0; b < p->n_batches; b++)
        for (size_t r = p->batch_start[b]; r < p->batch_start[b + 1]; r++) out[k++] = len[p->items[p->row_start[r]]];
}

static void test_grouping(void)
{
    size_t len[40];
    for (size_t i = 0; i < 40; i++) len[i] = i * 7 % 40 + 1; /* 1..40, each once, scrambled */
    at_batch_options o = {.batch_size = 4, .group_by_length = 1, .shuffle = 1, .seed = 42};
    at_batch_plan a, b, c;
    CHECK_OK(at_batch_plan_make(len, 40, &o, &a));
    CHECK_OK(at_batch_plan_make(len, 40, &o, &b));
    o.seed = 43;
    CHECK_OK(at_batch_plan_make(len, 40, &o, &c));
    CHECK(a.n_batches == 10 && a.n_rows == 40);
    size_t la[40], lb[40], lc[40];
    batch_lengths(&a, len, la);
    batch_lengths(&b, len, lb);
    batch_lengths(&c, len, lc);
    int seen[41] = {0}, grouped = 1, first_desc = 1;
    for (size_t bt = 0; bt < 10; bt++) {
        size_t mn = 99, mx = 0;
        for (size_t k = 4 * bt; k < 4 * bt + 4; k++) {
            seen[la[k]]++;
            mn = la[k] < mn ? la[k] : mn;
            mx = la[k] > mx ? la[k] : mx;
        }
        grouped &= mx - mn == 3 && mx % 4 == 0; /* {4k-3 .. 4k} */
    }
    int once = 1;
    for (int l = 1; l <= 40; l++) once &= seen[l] == 1;
    for (size_t bt = 1; bt < 10; bt++) first_desc &= la[4 * bt] < la[4 * (bt - 1)];
    CHECK(grouped && once);
    CHECK(!first_desc); /* the groups were shuffled */
    CHECK(memcmp(la, lb, sizeof la) == 0);
    CHECK(memcmp(la, lc, sizeof la) != 0);
    at_batch_plan_free(&a);
    at_batch_plan_free(&b);
    at_batch_plan_free(&c);

    /* without grouping, a shuffled order mixes lengths */
    o.group_by_length = 0;
    CHECK_OK(at_batch_plan_make(len, 40, &o, &a));
    batch_lengths(&a, len, la);
    int mixed = 0;
    for (size_t bt = 0; bt < 10; bt++) {
        size_t mn = 99, mx = 0;
        for (size_t k = 4 * bt; k < 4 * bt + 4; k++) {
            mn = la[k] < mn ? la[k] : mn;
            mx = la[k] > mx ? la[k] : mx;
        }
        mixed |= mx - mn > 3;
    }
    CHECK(mixed);
    at_batch_plan_free(&a);
    o.batch_size = 0;
    CHECK_FAILS(at_batch_plan_make(len, 40, &o, &a), AT_ERR_INVALID);
}

int main(void)
{
    test_labels();
    test_truncation();
    test_packing();
    test_grouping();
    return at_test_result("test_encode");
}
