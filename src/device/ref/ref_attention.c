/* Reference causal grouped-query attention (see ref_ops.h and ops/ops.h):
 * the full score row of each query is materialized, in double. */
#include "device/ref/ref_ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "device/ref/ref_util.h"

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D, group;
    const int32_t *qidx, *kvlen, *seg;
} attn_dims;

static at_status attn_setup(attn_dims *d, const at_tensor *q, const at_tensor *k, const at_attn_params *p,
                            const char *op)
{
    d->B = q->shape[0];
    d->Tq = q->shape[1];
    d->Hq = q->shape[2];
    d->D = q->shape[3];
    d->Tk = k->shape[1];
    d->Hkv = k->shape[2];
    d->group = d->Hkv ? d->Hq / d->Hkv : 1;
    AT_TRY(at_ref_index(p->q_index, op, &d->qidx));
    AT_TRY(at_ref_index(p->kv_len, op, &d->kvlen));
    AT_TRY(at_ref_index(p->segments, op, &d->seg));
    return AT_OK;
}

/* Whether key j is visible to query i of sequence b. */
static int attn_visible(const attn_dims *d, int64_t b, int64_t i, int64_t j)
{
    int64_t limit = d->qidx ? d->qidx[b * d->Tq + i] : d->Tk - d->Tq + i;
    int64_t len = d->kvlen ? d->kvlen[b] : d->Tk;
    if (j > limit || j >= len) return 0;
    if (d->seg && d->seg[b * d->Tk + j] != d->seg[b * d->Tq + i]) return 0;
    return 1;
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* s_j = scale · q·k_j (visible j),  p = softmax(s),  out = Σ_j p_j v_j,  lse = log Σ_j exp(s_j) */
at_status at_ref_attention_forward(at_tensor *out, at_tensor *lse, const at_tensor *q, const at_tensor *k,
                                   const at_tensor *v, const at_attn_params *p)
{
    const char *op = "attention_forward";
    double *Q = NULL, *K = NULL, *V = NULL, *O = NULL, *L = NULL, *S = NULL;
    at_status st = AT_OK;
    attn_dims d;
    AT_CHECK(attn_setup(&d, q, k, p, op));
    AT_CHECK(at_ref_load(q, op, &Q));
    AT_CHECK(at_ref_load(k, op, &K));
    AT_CHECK(at_ref_load(v, op, &V));
    AT_CHECK(at_ref_zeros(at_tensor_numel(q), &O));
    AT_CHECK(at_ref_zeros(d.B * d.Hq * d.Tq, &L));
    AT_CHECK(at_ref_zeros(d.Tk, &S));
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.Hq; h++)
            for (int64_t i = 0; i < d.Tq; i++) {
                const double *qi = Q + ((b * d.Tq + i) * d.Hq + h) * d.D;
                double *oi = O + ((b * d.Tq + i) * d.Hq + h) * d.D;
                int64_t hk = h / d.group;
                double mx = -INFINITY;
                for (int64_t j = 0; j < d.Tk; j++) {
                    if (!attn_visible(&d, b, i, j)) continue;
                    S[j] = (double)p->scale * dot(qi, K + ((b * d.Tk + j) * d.Hkv + hk) * d.D, d.D);
                    if (S[j] > mx) mx = S[j];
                }
                double *li = L + (b * d.Hq + h) * d.Tq + i;
                if (mx == -INFINITY) { /* no visible key: out stays 0 */
                    *li = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < d.Tk; j++)
                    if (attn_visible(&d, b, i, j)) sum += exp(S[j] - mx);
                *li = mx + log(sum);
                for (int64_t j = 0; j < d.Tk; j++) {
                    if (!attn_visible(&d, b, i, j)) continue;
                    double pj = exp(S[j] - *li);
                    const double *vj = V + ((b * d.Tk + j) * d.Hkv + hk) * d.D;
                    for (int64_t e = 0; e < d.D; e++) oi[e] += pj * vj[e];
                }
            }
    AT_CHECK(at_ref_store(out, O, op));
    if (lse) AT_CHECK(at_ref_store(lse, L, op));
done:
    free(Q);
    free(K);
    free(V);
    free(O);
    free(L);
    free(S);
    return st;
}

/* With p_j = exp(s_j − lse), dp_j = dout·v_j, D_i = dout·out:
 *   ds_j = p_j (dp_j − D_i),  dq = scale Σ_j ds_j k_j,  dk_j = scale Σ_i ds_j q_i,  dv_j = Σ_i p_j dout_i */
at_status at_ref_attention_backward(at_tensor *dq, at_tensor *dk, at_tensor *dv, const at_tensor *dout,
                                    const at_tensor *q, const at_tensor *k, const at_tensor *v,
                                    const at_tensor *out, const at_tensor *lse, const at_attn_params *p)
{
    const char *op = "attention_backward";
    double *Q = NULL, *K = NULL, *V = NULL, *O = NULL, *L = NULL, *DO = NULL;
    double *DQ = NULL, *DK = NULL, *DV = NULL;
    at_status st = AT_OK;
    attn_dims d;
    AT_CHECK(attn_setup(&d, q, k, p, op));
    AT_CHECK(at_ref_load(q, op, &Q));
    AT_CHECK(at_ref_load(k, op, &K));
    AT_CHECK(at_ref_load(v, op, &V));
    AT_CHECK(at_ref_load(out, op, &O));
    AT_CHECK(at_ref_load(lse, op, &L));
    AT_CHECK(at_ref_load(dout, op, &DO));
    AT_CHECK(at_ref_zeros(at_tensor_numel(q), &DQ));
    AT_CHECK(at_ref_zeros(at_tensor_numel(k), &DK));
    AT_CHECK(at_ref_zeros(at_tensor_numel(v), &DV));
    double scale = p->scale;
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.Hq; h++)
            for (int64_t i = 0; i < d.Tq; i++) {
                double li = L[(b * d.Hq + h) * d.Tq + i];
                if (li == -INFINITY) continue; /* no visible key */
                int64_t qo = ((b * d.Tq + i) * d.Hq + h) * d.D, hk = h / d.group;
                double Di = dot(DO + qo, O + qo, d.D);
                for (int64_t j = 0; j < d.Tk; j++) {
                    if (!attn_visible(&d, b, i, j)) continue;
                    int64_t ko = ((b * d.Tk + j) * d.Hkv + hk) * d.D;
                    double pj = exp(scale * dot(Q + qo, K + ko, d.D) - li);
                    double ds = pj * (dot(DO + qo, V + ko, d.D) - Di);
                    for (int64_t e = 0; e < d.D; e++) {
                        DQ[qo + e] += scale * ds * K[ko + e];
                        DK[ko + e] += scale * ds * Q[qo + e];
                        DV[ko + e] += pj * DO[qo + e];
                    }
                }
            }
    AT_CHECK(at_ref_store(dq, DQ, op));
    AT_CHECK(at_ref_store(dk, DK, op));
    AT_CHECK(at_ref_store(dv, DV, op));
done:
    free(Q);
    free(K);
    free(V);
    free(O);
    free(L);
    free(DO);
    free(DQ);
    free(DK);
    free(DV);
    return st;
}
