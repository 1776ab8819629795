/* Matmul with a quantized weight (see cpu_qmatmul.h): the GotoBLAS loop of
 * gemm.c with a B packer that dequantizes.
 *
 * For each NC block of C's columns and KC block of k, B = op(W) is packed
 * into NR-wide panels; for trans_b (forward, op(W)[k][n] = W[n][k]) a tile
 * of NR rows of W over the KC values of k is dequantized into tmp[NR][KC]
 * and packed from there; otherwise (input backward, op(W)[k][n] = W[k][n])
 * the KC rows of W are dequantized 64 columns at a time into tmp[KC][64]
 * (64: a multiple of both NR and every block size). Then, as in gemm.c, each
 * MC block of op(A) rows is packed and the microkernel walks the panels.
 * Threads own disjoint column ranges of C (multiples of 64, so each weight
 * value is dequantized by one thread), or row ranges as well when C has
 * fewer column units than threads. */
#include "device/cpu/cpu_qmatmul.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/progress.h"
#include "base/threads.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/cpu_simd.h"
#include "device/cpu/gemm.h"
#include "device/cpu/gemm_kernels.h"
#include "device/quant.h"

/* ---- the scalar dequantizers: device/quant.c's row helpers ---- */

static void q8_0_scalar(float *y, const uint8_t *blk, int64_t nblk) { at_q8_0_dequantize_row(blk, y, nblk * AT_QK8_0); }
static void q4_0_scalar(float *y, const uint8_t *blk, int64_t nblk) { at_q4_0_dequantize_row(blk, y, nblk * AT_QK4_0); }
static void nf4_scalar(float *y, const uint8_t *nib, const float *absmax, int64_t nblk)
{
    at_nf4_dequantize_blocks(nib, absmax, nblk * AT_NF4_BLOCK, y);
}

static const at_cpu_qdeq qdeq_scalar = {.name = "scalar", .q8_0 = q8_0_scalar, .q4_0 = q4_0_scalar, .nf4 = nf4_scalar};

const at_cpu_qdeq *at_cpu_qdeq_get(void)
{
#if defined(__x86_64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (isa >= AT_ISA_AVX512) return &at_cpu_qdeq_avx512;
    if (isa >= AT_ISA_AVX2) return &at_cpu_qdeq_avx2;
#elif defined(__aarch64__)
    if (at_cpu_isa_level() >= AT_ISA_NEON) return &at_cpu_qdeq_neon;
#endif
    return &qdeq_scalar;
}

/* ---- the weight ---- */

typedef struct {
    at_dtype t;
    const uint8_t *data; /* q8_0 / q4_0 blocks */
    at_nf4_parts nf4;
    int64_t rows, cols;
    size_t row_bytes; /* q8_0 / q4_0 */
    const at_cpu_qdeq *dq;
} qweight;

static at_status qweight_of(const at_tensor *w, qweight *q)
{
    char d[200];
    memset(q, 0, sizeof *q);
    q->t = w->dtype;
    q->rows = w->shape[w->ndim - 2];
    q->cols = w->shape[w->ndim - 1];
    q->dq = at_cpu_qdeq_get();
    int64_t blk = at_quant_row_block(w->dtype);
    if (!at_dtype_is_quantized(w->dtype) || q->cols % blk)
        return at_error(AT_ERR_INVALID, "matmul: quantized weight %s needs rows that are a multiple of %lld",
                        at_tensor_describe(w, d, sizeof d), (long long)blk);
    if (w->dtype == AT_NF4) return at_nf4_parts_of(w, &q->nf4);
    q->data = at_tensor_data(w);
    q->row_bytes = (size_t)(q->cols / blk) * at_dtype_block_bytes(w->dtype);
    return AT_OK;
}

/* y[0, len) = W[r][c0, c0 + len); c0 and len are multiples of the block. */
static void dequant(const qweight *w, int64_t r, int64_t c0, int64_t len, float *y)
{
    switch (w->t) {
    case AT_Q8_0:
        w->dq->q8_0(y, w->data + (size_t)r * w->row_bytes + (size_t)(c0 / AT_QK8_0) * (2 + AT_QK8_0), len / AT_QK8_0);
        break;
    case AT_Q4_0:
        w->dq->q4_0(y, w->data + (size_t)r * w->row_bytes + (size_t)(c0 / AT_QK4_0) * (2 + AT_QK4_0 / 2),
                    len / AT_QK4_0);
        break;
    default: {
        int64_t b0 = (r * w->cols + c0) / AT_NF4_BLOCK, nb = len / AT_NF4_BLOCK;
        float amax[32];
        for (int64_t i = 0; i < nb; i += 32) {
            int64_t n = nb - i < 32 ? nb - i : 32;
            at_nf4_absmax(&w->nf4, b0 + i, n, amax);
            w->dq->nf4(y + i * AT_NF4_BLOCK, w->nf4.nibbles + (b0 + i) * (AT_NF4_BLOCK / 2), amax, n);
        }
    }
    }
}

/* ---- the problem ---- */

#define UNIT 64 /* columns of C a thread owns are multiples of this (and of NR) */

typedef struct {
    const at_gemm_blocked *e;
    const qweight *w;
    int ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const char *A;
    at_dtype at;
    int64_t lda;
    char *C;
    at_dtype ct;
    int64_t ldc;
    int round; /* compute in bf16 with an f32 engine: round both operands */
} qproblem;

static size_t esize(at_dtype t) { return t == AT_F32 ? 4 : 2; }

/* Packs the B block of columns [jc, jc + nb) and k in [pc, pc + kb). */
static void pack_b(const qproblem *p, int64_t jc, int64_t nb, int64_t pc, int64_t kb, char *bbuf, float *tmp)
{
    const at_gemm_blocked *e = p->e;
    size_t pe = at_gemm_panel_esize(e);
    size_t bpanel = (size_t)((kb + e->kp - 1) / e->kp * e->kp * e->nr) * pe;
    if (p->tb) {
        for (int64_t x0 = 0; x0 < nb; x0 += e->nr) {
            int rows = nb - x0 < e->nr ? (int)(nb - x0) : e->nr;
            for (int r = 0; r < rows; r++) dequant(p->w, jc + x0 + r, pc, kb, tmp + (size_t)r * kb);
            e->pack(bbuf + (size_t)(x0 / e->nr) * bpanel, tmp, AT_F32, kb, 1, e->nr, rows, kb, p->round);
        }
    } else {
        for (int64_t x0 = 0; x0 < nb; x0 += UNIT) {
            int64_t cw = nb - x0 < UNIT ? nb - x0 : UNIT;
            for (int64_t k = 0; k < kb; k++) dequant(p->w, pc + k, jc + x0, cw, tmp + (size_t)k * UNIT);
            e->pack(bbuf + (size_t)(x0 / e->nr) * bpanel, tmp, AT_F32, 1, UNIT, e->nr, cw, kb, p->round);
        }
    }
}

/* C's rows [m0, m1) x columns [n0, n1) on one thread (gemm.c's blocked_range). */
static void run_range(const qproblem *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1, char *abuf, char *bbuf,
                      float *tmp)
{
    const at_gemm_blocked *e = p->e;
    size_t ae = esize(p->at), ce = esize(p->ct), pe = at_gemm_panel_esize(e);
    int64_t a_sx = p->ta ? 1 : p->lda, a_sk = p->ta ? p->lda : 1;
    for (int64_t jc = n0; jc < n1; jc += e->nc) {
        int64_t nb = n1 - jc < e->nc ? n1 - jc : e->nc;
        for (int64_t pc = 0; pc < p->K; pc += e->kc) {
            int64_t kb = p->K - pc < e->kc ? p->K - pc : e->kc;
            int64_t kbp = (kb + e->kp - 1) / e->kp * e->kp;
            size_t bpanel = (size_t)(kbp * e->nr) * pe, apanel = (size_t)(kbp * e->mr) * pe;
            pack_b(p, jc, nb, pc, kb, bbuf, tmp);
            float beta = pc == 0 ? p->beta : 1.0f;
            for (int64_t ic = m0; ic < m1; ic += e->mc) {
                int64_t mb = m1 - ic < e->mc ? m1 - ic : e->mc;
                e->pack(abuf, p->A + (size_t)(ic * a_sx + pc * a_sk) * ae, p->at, a_sx, a_sk, e->mr, mb, kb,
                        p->round);
                for (int64_t jr = 0; jr < nb; jr += e->nr) {
                    int nv = nb - jr < e->nr ? (int)(nb - jr) : e->nr;
                    for (int64_t ir = 0; ir < mb; ir += e->mr) {
                        int mv = mb - ir < e->mr ? (int)(mb - ir) : e->mr;
                        char *c = p->C + (size_t)((ic + ir) * p->ldc + jc + jr) * ce;
                        e->kernel(kb, abuf + (ir / e->mr) * apanel, bbuf + (jr / e->nr) * bpanel, c, p->ct, p->ldc,
                                  mv, nv, p->alpha, beta);
                    }
                }
            }
        }
    }
}

/* Work buffers kept per thread between calls (as gemm.c does: fresh
 * megabytes each call cost page faults). */
static _Thread_local void *tl_buf;
static _Thread_local size_t tl_cap;

static void *thread_buffer(size_t bytes)
{
    if (bytes > tl_cap) {
        at_cpu_thread_buffers_held();
        free(tl_buf);
        tl_buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        tl_cap = tl_buf ? bytes : 0;
    }
    return tl_buf;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

static at_status run_blocked(const qproblem *p)
{
    const at_gemm_blocked *e = p->e;
    int64_t units = (p->N + UNIT - 1) / UNIT, tiles_m = (p->M + e->mr - 1) / e->mr;
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    double flops = 2.0 * p->M * p->N * p->K;
    if (nt > 1 && flops < 4e6 * nt) nt = flops < 4e6 ? 1 : (int)(flops / 4e6);
    /* columns first (each weight value dequantized once); rows as well when
     * there are fewer column units than threads */
    int tn = units < nt ? (int)units : nt, tm = nt / tn;
    if (tm > tiles_m) tm = (int)tiles_m;
    size_t pe = at_gemm_panel_esize(e);
    int64_t kcb = p->K < e->kc ? p->K : e->kc;
    kcb = (kcb + e->kp - 1) / e->kp * e->kp;
    int failed = 0;
#pragma omp parallel num_threads(tm * tn)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int tnn = n == tm * tn ? tn : 1, tmm = n == tm * tn ? tm : n; /* the team may be smaller */
        int ti = t / tnn, tj = t % tnn;
        int64_t m0 = tiles_m * ti / tmm * e->mr, m1 = tiles_m * (ti + 1) / tmm * e->mr;
        int64_t n0 = units * tj / tnn * UNIT, n1 = units * (tj + 1) / tnn * UNIT;
        if (m1 > p->M) m1 = p->M;
        if (n1 > p->N) n1 = p->N;
        int64_t mcb = m1 - m0 < e->mc ? (m1 - m0 + e->mr - 1) / e->mr * e->mr : e->mc;
        int64_t ncb = n1 - n0 < e->nc ? (n1 - n0 + UNIT - 1) / UNIT * UNIT : e->nc;
        size_t abytes = round64((size_t)(mcb * kcb) * pe), bbytes = round64((size_t)(ncb * kcb) * pe);
        size_t tbytes = (size_t)kcb * (e->nr > UNIT ? e->nr : UNIT) * sizeof(float);
        if (m1 > m0 && n1 > n0) {
            char *buf = thread_buffer(abytes + bbytes + tbytes);
            if (buf) run_range(p, m0, m1, n0, n1, buf, buf + abytes, (float *)(buf + abytes + bbytes));
            else {
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    if (failed) return at_error(AT_ERR_NOMEM, "matmul: no memory for the quantized matmul's work buffers");
    return AT_OK;
}

/* The forward of a few tokens (decode): packing panels for 1..8 rows of A
 * would cost more than the product, and the product is bound by reading W.
 * With AVX2 or AVX-512, the decode kernels (at_cpu_qgemv) read each Q8_0 /
 * Q4_0 row of W once, in place, against every row of op(A) quantized to
 * int8 (quant_x, once per call); NF4 rows are dequantized into an f32 row
 * (in L1) first and dotted in f32. Without them, each row of W is
 * dequantized, rounded to bf16 when computing in bf16, and dotted with every
 * row of op(A). Threads split the rows of W (one thread or all, as measured:
 * at_par_threads). */
#define SMALL_M 8

static const at_cpu_qgemv *qgemv_get(void)
{
#if defined(__x86_64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (isa >= AT_ISA_AVX512) return at_cpu_get_features()->avx512vnni ? &at_cpu_qgemv_avx512vnni : &at_cpu_qgemv_avx512;
    if (isa >= AT_ISA_AVX2) return &at_cpu_qgemv_avx2;
#elif defined(__aarch64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (isa >= AT_ISA_NEON_DOTPROD) return &at_cpu_qgemv_neon_dotprod;
    if (isa >= AT_ISA_NEON) return &at_cpu_qgemv_neon;
#endif
    return NULL;
}

int at_cpu_qmatmul_int8_decode(void)
{
    const at_cpu_qgemv *kq = qgemv_get();
    return kq && kq->gemv_i8;
}

/* x rounded to bf16 (nearest even) in place; dequantized values are finite,
 * so the NaN case of at_f32_to_bf16 is not needed and the loop vectorizes. */
static void round_bf16_row(float *x, int64_t n)
{
    uint32_t *u = (uint32_t *)x;
    for (int64_t i = 0; i < n; i++) u[i] = (u[i] + 0x7fffu + ((u[i] >> 16) & 1u)) & 0xffff0000u;
}

/* op(A)'s rows as the decode kernels take them. */
typedef struct {
    const float *a32; /* M x K f32 */
    const int8_t *xq; /* M x K int8 and M x K/32 scales (quant_x), or NULL */
    const float *xd;
    const int32_t *xc; /* Q4_0: M x K/4 group sums (at_cpu_qgemv_xc), else NULL */
} small_a;

void at_cpu_qgemv_xc(int64_t n, const int8_t *q, int32_t *xc)
{
    for (int64_t i = 0; i < n / 4; i++) xc[i] = -8 * (q[4 * i] + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3]);
}

/* out[m] = row r of W · row m of x (m < M): the decode kernels, or the
 * portable dequantize-then-dot; row: K floats of scratch. */
static void small_row(const qproblem *p, const at_cpu_qgemv *kq, const at_cpu_simd *v, const small_a *x, int64_t r,
                      int bf16, float *row, float *out)
{
    const qweight *w = p->w;
    if (x->xq) {
        kq->gemv_i8((int)p->M, p->K, x->xq, x->xd, x->xc, w->t, w->data + (size_t)r * w->row_bytes, out);
        return;
    }
    if (kq && w->t != AT_NF4) {
        kq->gemv((int)p->M, p->K, x->a32, w->t, w->data + (size_t)r * w->row_bytes, bf16, out);
        return;
    }
    dequant(w, r, 0, p->K, row);
    if (kq) {
        kq->dotm((int)p->M, p->K, x->a32, row, bf16, out);
        return;
    }
    if (bf16) round_bf16_row(row, p->K);
    for (int64_t m = 0; m < p->M; m++) out[m] = v->dot(x->a32 + m * p->K, row, p->K);
}

/* C[m][n] = alpha · dot + beta · C[m][n] (beta 0: C not read). */
static void put_c(const qproblem *p, int64_t m, int64_t n, float dot)
{
    float s = p->alpha * dot;
    size_t at = (size_t)(m * p->ldc + n);
    if (p->ct == AT_F32) {
        float *c = (float *)p->C + at;
        *c = p->beta == 0.0f ? s : s + p->beta * *c;
    } else {
        uint16_t *c = (uint16_t *)p->C + at;
        *c = at_f32_to_bf16(p->beta == 0.0f ? s : s + p->beta * at_bf16_to_f32(*c));
    }
}

/* op(A) as f32 (and int8) rows, kept per thread between calls like the
 * work buffers (a decode step makes a few hundred of these calls). */
static _Thread_local void *tl_a;
static _Thread_local size_t tl_a_cap;

static void *a_buffer(size_t bytes)
{
    if (bytes > tl_a_cap) {
        at_cpu_thread_buffers_held();
        free(tl_a);
        tl_a = aligned_alloc(64, round64(bytes));
        tl_a_cap = tl_a ? bytes : 0;
    }
    return tl_a;
}

static at_status small_rows(const qproblem *p, const at_cpu_qgemv *kq, small_a *x)
{
    int64_t n = p->M * p->K;
    int i8 = kq && kq->gemv_i8 && (p->w->t == AT_Q8_0 || p->w->t == AT_Q4_0);
    int q4 = i8 && p->w->t == AT_Q4_0;
    /* a32 [n] | xd [n / 32] | xc [n / 4] (Q4_0) | xq [n] */
    size_t bytes = (size_t)n * sizeof(float) +
                   (i8 ? (size_t)n + (size_t)(n / 32) * sizeof(float) + (q4 ? (size_t)n : 0) : 0);
    if (!a_buffer(bytes)) return at_error(AT_ERR_NOMEM, "matmul: no memory for %lld rows of A", (long long)p->M);
    const at_cpu_simd *v = at_cpu_simd_get();
    float *a32 = tl_a;
    size_t es = esize(p->at);
    for (int64_t m = 0; m < p->M; m++) {
        if (!p->ta) v->load(a32 + m * p->K, p->A + (size_t)(m * p->lda) * es, p->at, p->K);
        else
            for (int64_t k = 0; k < p->K; k++) v->load(a32 + m * p->K + k, p->A + (size_t)(k * p->lda + m) * es, p->at, 1);
    }
    x->a32 = a32;
    x->xq = NULL;
    x->xd = NULL;
    x->xc = NULL;
    if (i8) {
        float *xd = a32 + n;
        int32_t *xc = (int32_t *)(xd + n / 32);
        int8_t *xq = (int8_t *)(xc + (q4 ? n / 4 : 0));
        kq->quant_x(n, a32, xq, xd);
        if (q4) at_cpu_qgemv_xc(n, xq, xc);
        x->xq = xq;
        x->xd = xd;
        x->xc = q4 ? xc : NULL;
    }
    return AT_OK;
}

static at_status run_small_forward(const qproblem *p)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    const at_cpu_qgemv *kq = qgemv_get();
    small_a x;
    AT_TRY(small_rows(p, kq, &x));
    int bf16 = p->at == AT_BF16;
    /* one thread or all, by measurement (base/threads.h) per format, M and
     * size; a row of W gives the same dots whichever thread takes it */
    const qweight *w = p->w;
    double wbytes = w->t == AT_NF4 ? (double)p->N * (double)p->K / 2 : (double)p->N * (double)w->row_bytes;
    unsigned key = at_par_key(20u + 3u * (w->t == AT_Q8_0 ? 0u : w->t == AT_Q4_0 ? 1u : 2u) +
                                  (p->M == 1 ? 0u : p->M <= 4 ? 1u : 2u), wbytes);
    int timed = !omp_in_parallel() && wbytes >= 16384;
    int nt = timed ? at_par_threads(key, omp_get_max_threads()) : 1;
    double t0 = timed ? at_now_seconds() : 0;
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t r0 = p->N * t / n, r1 = p->N * (t + 1) / n;
        float *row = r1 > r0 ? thread_buffer((size_t)p->K * sizeof(float)) : NULL;
        if (r1 > r0 && !row) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t r = r0; row && r < r1; r++) {
            float dots[SMALL_M];
            small_row(p, kq, v, &x, r, bf16, row, dots);
            for (int64_t m = 0; m < p->M; m++) put_c(p, m, r, dots[m]);
        }
    }
    if (timed) at_par_record(key, nt, at_now_seconds() - t0);
    if (failed) return at_error(AT_ERR_NOMEM, "matmul: no memory for a dequantized row");
    return AT_OK;
}

/* The forward of more than SMALL_M rows on int8 activations (inference at
 * the AVX2 level, see at_cpu_qmatmul_int8_prefill): op(A)'s rows quantized once (threads
 * split the rows), then threads split W into groups of 8 rows, each packed
 * (at_cpu_qpack8_avx2) and multiplied by every row of x; the 8 lanes of the
 * result are 8 columns of C. */
static _Thread_local int tl_inference;

int at_cpu_qmatmul_inference(int on)
{
    int old = tl_inference;
    tl_inference = on;
    return old;
}

int at_cpu_qmatmul_int8_prefill(at_dtype a)
{
#if defined(__x86_64__)
    return a == AT_F32 && at_cpu_isa_level() == AT_ISA_AVX2;
#else
    (void)a;
    return 0;
#endif
}

static at_status run_prefill_i8(const qproblem *p)
{
#if defined(__x86_64__)
    const qweight *w = p->w;
    const int64_t M = p->M, N = p->N, K = p->K, nb = K / 32, groups = (N + 7) / 8;
    const int q4 = w->t == AT_Q4_0;
    /* xq [M·K] | xd [M·nb] | xs [M·nb] (Q4_0) */
    size_t xq_bytes = round64((size_t)(M * K));
    char *buf = a_buffer(xq_bytes + (size_t)(M * nb) * (q4 ? 8 : 4));
    if (!buf) return at_error(AT_ERR_NOMEM, "matmul: no memory for %lld int8 rows of A", (long long)M);
    int8_t *xq = (int8_t *)buf;
    float *xd = (float *)(buf + xq_bytes);
    int32_t *xs = (int32_t *)(xd + M * nb);
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads(), failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            at_cpu_quant_x_avx2(K, (const float *)p->A + m * p->lda, xq + m * K, xd + m * nb);
            for (int64_t b = 0; q4 && b < nb; b++) {
                int32_t sum = 0;
                for (int i = 0; i < 32; i++) sum += xq[m * K + 32 * b + i];
                xs[m * nb + b] = -8 * sum;
            }
        }
        /* packed rows: K · 8 bytes (16 for Q8_0) and K / 32 · 8 scales; out: M x 8 */
        size_t wp_bytes = round64((size_t)K * (q4 ? 8 : 16)), wd_bytes = round64((size_t)nb * 8 * sizeof(float));
        char *tb = thread_buffer(wp_bytes + wd_bytes + (size_t)M * 8 * sizeof(float));
        if (!tb) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            if (!tb) continue;
            uint8_t *wp = (uint8_t *)tb;
            float *wd = (float *)(tb + wp_bytes), *out = (float *)(tb + wp_bytes + wd_bytes);
            const uint8_t *rows[8];
            int nv = N - 8 * g < 8 ? (int)(N - 8 * g) : 8;
            for (int l = 0; l < 8; l++) rows[l] = l < nv ? w->data + (size_t)(8 * g + l) * w->row_bytes : NULL;
            at_cpu_qpack8_avx2(w->t, rows, K, wp, wd);
            at_cpu_qgemm8_avx2(w->t, M, K, xq, xd, xs, wp, wd, out);
            for (int64_t m = 0; m < M; m++)
                for (int l = 0; l < nv; l++) put_c(p, m, 8 * g + l, out[m * 8 + l]);
        }
    }
    if (failed) return at_error(AT_ERR_NOMEM, "matmul: no memory for packed rows of a quantized weight");
    return AT_OK;
#else
    (void)p;
    return at_error(AT_ERR_INVALID, "matmul: int8 prefill needs x86-64");
#endif
}

/* Without AVX2: 64 rows (forward) or 64 columns (backward) of W at a time
 * dequantized to f32 (rounded to bf16 when A is bf16: ops.h; at_cpu_gemm
 * would widen a bf16 A here) and multiplied by at_cpu_gemm. */
static at_status run_panels(const qproblem *p)
{
    const qweight *w = p->w;
    int64_t len = p->tb ? p->K : UNIT * p->K;
    float *panel = malloc((size_t)(len > 0 ? len : 1) * UNIT * sizeof(float));
    if (!panel) return at_error(AT_ERR_NOMEM, "matmul: no memory for a dequantized panel");
    size_t ce = esize(p->ct);
    for (int64_t j0 = 0; j0 < p->N; j0 += UNIT) {
        int64_t nw = p->N - j0 < UNIT ? p->N - j0 : UNIT;
        if (p->tb) {
            for (int64_t r = 0; r < nw; r++) dequant(w, j0 + r, 0, p->K, panel + r * p->K);
            if (p->at == AT_BF16) round_bf16_row(panel, nw * p->K);
            at_cpu_gemm(p->ta, 1, p->M, nw, p->K, p->alpha, p->A, p->at, p->lda, panel, AT_F32, p->K, p->beta,
                        p->C + (size_t)j0 * ce, p->ct, p->ldc);
        } else {
            for (int64_t k = 0; k < p->K; k++) dequant(w, k, j0, nw, panel + k * nw);
            if (p->at == AT_BF16) round_bf16_row(panel, p->K * nw);
            at_cpu_gemm(p->ta, 0, p->M, nw, p->K, p->alpha, p->A, p->at, p->lda, panel, AT_F32, nw, p->beta,
                        p->C + (size_t)j0 * ce, p->ct, p->ldc);
        }
    }
    free(panel);
    return AT_OK;
}

/* C = beta · C (nothing to multiply: K == 0 or alpha == 0). */
static void scale_c(const qproblem *p)
{
    for (int64_t i = 0; i < p->M; i++) {
        for (int64_t j = 0; j < p->N; j++) {
            size_t at = (size_t)(i * p->ldc + j);
            if (p->ct == AT_F32) {
                float *c = (float *)p->C + at;
                *c = p->beta == 0.0f ? 0.0f : p->beta * *c;
            } else {
                uint16_t *c = (uint16_t *)p->C + at;
                *c = at_f32_to_bf16(p->beta == 0.0f ? 0.0f : p->beta * at_bf16_to_f32(*c));
            }
        }
    }
}

static const at_gemm_blocked *engine(int bf16)
{
#if defined(__x86_64__)
    at_cpu_isa isa = at_cpu_isa_level();
    if (bf16 && isa >= AT_ISA_AVX512_BF16) return &at_gemm_bf16_avx512bf16;
    if (isa >= AT_ISA_AVX512) return &at_gemm_f32_avx512;
    if (isa >= AT_ISA_AVX2) return &at_gemm_f32_avx2;
#elif defined(__aarch64__)
    if (bf16 && at_cpu_isa_level() >= AT_ISA_NEON_BF16) return &at_gemm_bf16_neon_bf16;
    if (at_cpu_isa_level() >= AT_ISA_NEON) return &at_gemm_f32_neon;
#else
    (void)bf16;
#endif
    return NULL;
}

static int64_t batch_of(const at_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++) n *= t->shape[i];
    return n;
}

at_status at_cpu_qmatmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                         float alpha, float beta)
{
    char d[200];
    qweight w;
    AT_TRY(qweight_of(b, &w));
    if (batch_of(b) != 1)
        return at_error(AT_ERR_INVALID, "matmul: quantized weight %s must be one matrix",
                        at_tensor_describe(b, d, sizeof d));
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t batch = batch_of(a);
    int bf16 = a->dtype == AT_BF16;
    qproblem p = {
        .e = engine(bf16), .w = &w, .ta = !!trans_a, .tb = !!trans_b,
        .M = trans_a ? ac : ar, .N = trans_b ? w.rows : w.cols, .K = trans_a ? ar : ac,
        .alpha = alpha, .beta = beta, .at = a->dtype, .lda = ac, .ct = c->dtype,
        .round = bf16 && !(engine(bf16) && engine(bf16)->kp > 1),
    };
    p.ldc = p.N;
    if (!trans_a) { /* the batch of A stacked into rows: one weight for all */
        p.M *= batch;
        batch = 1;
    }
    const char *pa = at_tensor_data(a);
    char *pc = at_tensor_data(c);
    for (int64_t i = 0; i < batch; i++) {
        p.A = pa + (size_t)(i * ar * ac) * esize(a->dtype);
        p.C = pc + (size_t)(i * p.M * p.N) * esize(c->dtype);
        if (p.M == 0 || p.N == 0) continue;
        if (p.K == 0 || alpha == 0.0f) scale_c(&p);
        else if (p.tb && p.M <= SMALL_M) AT_TRY(run_small_forward(&p));
        else if (tl_inference && p.tb && !p.ta && (w.t == AT_Q8_0 || w.t == AT_Q4_0) &&
                 at_cpu_qmatmul_int8_prefill(p.at))
            AT_TRY(run_prefill_i8(&p));
        else if (p.e) AT_TRY(run_blocked(&p));
        else AT_TRY(run_panels(&p));
    }
    return AT_OK;
}

void at_cpu_qmatmul_release_buffers(void)
{
    free(tl_buf);
    tl_buf = NULL;
    tl_cap = 0;
    free(tl_a);
    tl_a = NULL;
    tl_a_cap = 0;
}
