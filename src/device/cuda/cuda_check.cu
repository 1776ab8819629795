/* Deferred index checks on the CUDA backend (declared in cuda_internal.h).
 *
 * Embedding ids and cross-entropy labels come from the caller, and an index
 * out of range must be an error that names it, as on the CPU. Checking before
 * the kernel would make the host wait for the GPU on every call (several
 * times a micro-batch: cross-entropy runs once per logits chunk). Instead a
 * call takes one 64-bit device word here; its kernel writes the smallest
 * (position << 32 | value) it finds out of range into it and skips that row;
 * the words of all the calls since the last report are copied back with the
 * next download or synchronize, which waits for the stream anyway, and the
 * first call (in stream order) that saw a bad index becomes that download's
 * error. The host keeps what the message needs (op, tensor names, limit),
 * since the tensors may be gone by then. */
#include <stdio.h>
#include <string.h>
#include "device/cuda/cuda_internal.h"

#define CHK_CLEAN (~0ull) /* no bad index recorded */

/* "name [d0, d1] dtype" (the core's at_tensor_describe, which the library cannot call). */
static void describe(const at_tensor *t, char *buf, size_t len)
{
    static const char *names[] = {"f32", "bf16", "f16", "i32", "q8_0", "q4_0", "nf4"};
    int k = snprintf(buf, len, "%s [", t->name[0] ? t->name : "(unnamed)");
    for (int i = 0; i < t->ndim && k > 0 && (size_t)k < len; i++)
        k += snprintf(buf + k, len - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k > 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, "] %s", (int)t->dtype >= 0 && (int)t->dtype < 7 ? names[t->dtype] : "?");
}

/* Marks every word clean again (stream-ordered: no wait). */
static at_status reset_words(cuda_ctx *c, int n)
{
    if (n <= 0) return AT_OK;
    return cu_check(c, cudaMemsetAsync(c->chk_dev, 0xFF, (size_t)n * sizeof *c->chk_dev, c->stream),
                    "index check reset (cudaMemsetAsync)");
}

at_status cu_sync_report(cuda_ctx *c, const char *what)
{
    int n = c->chk_n;
    at_status st = AT_OK;
    if (n > 0)
        st = cu_check(c, cudaMemcpyAsync(c->chk_host, c->chk_dev, (size_t)n * sizeof *c->chk_dev,
                                         cudaMemcpyDeviceToHost, c->stream),
                      "index check read-back (cudaMemcpyAsync)");
    at_status ws = cu_check(c, cudaStreamSynchronize(c->stream), what);
    if (st == AT_OK) st = ws;
    c->chk_n = 0;
    if (st != AT_OK) { /* the words were not read: start clean rather than blame a later call */
        (void)reset_words(c, n);
        return st;
    }
    int bad = -1;
    for (int k = 0; k < n && bad < 0; k++)
        if (c->chk_host[k] != CHK_CLEAN) bad = k;
    if (bad < 0) return AT_OK; /* every word is still clean */
    AT_TRY(reset_words(c, n));
    const cu_pending_check *p = &c->chk_pending[bad];
    long long pos = (long long)(c->chk_host[bad] >> 32);
    int value = (int)(int32_t)(uint32_t)(c->chk_host[bad] & 0xFFFFFFFFull);
    if (p->kind == CU_CHK_BELOW)
        return c->host->error(AT_ERR_INVALID, "%s: %s[%lld] = %d is not below the vocabulary size %lld", p->op,
                              p->name, pos, value, (long long)p->limit);
    return c->host->error(AT_ERR_INVALID, "%s: %s[%lld] = %d is outside [0, %lld) of %s", p->op, p->name, pos, value,
                          (long long)p->limit, p->table);
}

at_status cu_check_defer(cuda_ctx *c, const char *op, int kind, const at_tensor *idx, const at_tensor *table,
                         int64_t limit, unsigned long long **slot)
{
    *slot = NULL;
    if (!c->chk_dev) { /* first use: the words live as long as the device */
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, CU_CHK_MAX * sizeof *c->chk_dev);
        if (e != cudaSuccess) return cu_check(c, e, "index check words (cudaMalloc)");
        c->chk_dev = (unsigned long long *)p;
        c->chk_n = 0;
        AT_TRY(reset_words(c, CU_CHK_MAX));
    }
    /* all words taken (many calls without a download): wait once for them */
    if (c->chk_n == CU_CHK_MAX) AT_TRY(cu_sync_report(c, op));
    cu_pending_check *p = &c->chk_pending[c->chk_n];
    p->op = op;
    p->kind = kind;
    p->limit = limit;
    snprintf(p->name, sizeof p->name, "%s", idx->name[0] ? idx->name : kind == CU_CHK_BELOW ? "labels" : "ids");
    p->table[0] = 0;
    if (table) describe(table, p->table, sizeof p->table);
    *slot = c->chk_dev + c->chk_n++;
    return AT_OK;
}
