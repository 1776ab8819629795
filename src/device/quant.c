/* Quantized formats (see quant.h for the layouts and the rules, with their
 * sources). Plain C on purpose: this file is the definition the SIMD
 * dequantizers of the matmul (device/cpu/cpu_qmatmul*.c) are tested against,
 * and quantization runs once, when a model is loaded. */
#include "device/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* bitsandbytes' NF4 table (backends/utils.py _NF4_QUANT_TABLE): the values
 * create_normal_map(0.9677083) gives, quantiles of N(0, 1) normalized to
 * [−1, 1] with an exact 0. */
const float at_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7,
 * total_bits=8): for e = 0..6, the midpoints of 2^e + 1 points of
 * torch.linspace(0.1, 1) times 10^(e−6), both signs, plus 0 and 1, sorted.
 * The values are the float32 ones torch computes (its linspace rounding
 * differs from a plain formula in the last bit of 90 entries), written as
 * exact hex floats; tests/test_quant.c compares them with the table
 * tools/make_quant_goldens.py gets from bitsandbytes' code. */
const float at_dyn8_code[256] = {
    -0x1.fc6666p-1f, -0x1.f53332p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df9998p-1f, -0x1.d86666p-1f,
    -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb9998p-1f, -0x1.b46666p-1f, -0x1.ad3332p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.979998p-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f,
    -0x1.7acccep-1f, -0x1.73999ap-1f, -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56cccep-1f,
    -0x1.4f999ap-1f, -0x1.486666p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f,
    -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.07999ap-1f, -0x1.006666p-1f,
    -0x1.f26668p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, -0x1.b8ccccp-2f, -0x1.aa6664p-2f,
    -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626664p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3334p-3f,
    -0x1.de6668p-3f, -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3332p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eap-4f,
    -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb85p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f4p-5f,
    -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c28ep-5f, -0x1.fd70a4p-6f, -0x1.cf5c26p-6f,
    -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451eb8p-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, -0x1.e978d4p-8f, -0x1.c49ba6p-8f,
    -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
    -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
    -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc506p-12f,
    0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f,
    0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f,
    0x1.451eb8p-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c26p-6f, 0x1.fd70a4p-6f, 0x1.15c28ep-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f,
    0x1.b70a3ep-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f4p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb85p-4f, 0x1.5a3d7p-4f,
    0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eap-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3332p-3f, 0x1.88p-3f,
    0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6668p-3f, 0x1.fb3334p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626664p-2f, 0x1.70ccccp-2f,
    0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6664p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26668p-2f, 0x1.006666p-1f, 0x1.07999ap-1f, 0x1.0eccccp-1f,
    0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486666p-1f, 0x1.4f999ap-1f, 0x1.56cccep-1f, 0x1.5ep-1f, 0x1.653334p-1f,
    0x1.6c6668p-1f, 0x1.73999ap-1f, 0x1.7acccep-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.979998p-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3332p-1f, 0x1.b46666p-1f, 0x1.bb9998p-1f,
    0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df9998p-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53332p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};

int at_dtype_is_quantized(at_dtype t) { return t == AT_Q8_0 || t == AT_Q4_0 || t == AT_NF4; }

int64_t at_quant_row_block(at_dtype t)
{
    switch (t) {
    case AT_Q8_0: return AT_QK8_0;
    case AT_Q4_0: return AT_QK4_0;
    case AT_NF4: return AT_NF4_BLOCK;
    default: return 1;
    }
}

/* ---- NF4 layout ---- */

static int64_t nf4_blocks(int64_t n) { return (n + AT_NF4_BLOCK - 1) / AT_NF4_BLOCK; }
static int64_t nf4_groups(int64_t nb) { return (nb + AT_NF4_GROUP - 1) / AT_NF4_GROUP; }
static size_t nf4_absmax2_at(int64_t nb) { return ((size_t)AT_NF4_HEADER + 33 * (size_t)nb + 3) / 4 * 4; }

size_t at_nf4_nbytes(int64_t n)
{
    int64_t nb = nf4_blocks(n);
    return nf4_absmax2_at(nb) + 4 * (size_t)nf4_groups(nb);
}

typedef struct {
    uint32_t magic, version;
    float offset;
    uint32_t nblocks;
} nf4_header;

at_status at_nf4_parts_of(const at_tensor *t, at_nf4_parts *out)
{
    char d[200];
    const uint8_t *base = at_tensor_data(t);
    if (t->dtype != AT_NF4 || !base)
        return at_error(AT_ERR_INVALID, "nf4: %s is not an NF4 tensor in host memory",
                        at_tensor_describe(t, d, sizeof d));
    int64_t nb = nf4_blocks(at_tensor_numel(t));
    nf4_header h;
    memcpy(&h, base, sizeof h);
    if (h.magic != AT_NF4_MAGIC || h.version != 1 || h.nblocks != (uint32_t)nb || !isfinite(h.offset))
        return at_error(AT_ERR_INVALID, "nf4: %s holds no NF4 data (bad header; quantize it with at_quantize)",
                        at_tensor_describe(t, d, sizeof d));
    out->nibbles = base + AT_NF4_HEADER;
    out->codes = base + AT_NF4_HEADER + 32 * nb;
    out->absmax2 = (const float *)(base + nf4_absmax2_at(nb));
    out->offset = h.offset;
    out->nblocks = nb;
    return AT_OK;
}

void at_nf4_absmax(const at_nf4_parts *p, int64_t b0, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t b = b0 + i;
        /* two roundings, as bitsandbytes: dequantize_blockwise(...) + offset */
        float s = at_dyn8_code[p->codes[b]] * p->absmax2[b / AT_NF4_GROUP];
        out[i] = s + p->offset;
    }
}

/* Index of the entry of code[0..n) (ascending, distinct) nearest to s; ties
 * to the lower index, as torch.argmin(|s − code|) returns the first minimum.
 * |s − c| is computed as the difference of the nearest pair, which rounds
 * exactly as torch's elementwise abs(s − c) does. */
static int nearest(const float *code, int n, float s)
{
    int lo = 0, hi = n; /* first index with code > s */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (code[mid] <= s) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    if (lo == n) return n - 1;
    float below = s - code[lo - 1], above = code[lo] - s;
    return above < below ? lo : lo - 1;
}

static float clamp1(float v) { return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v; }

void at_nf4_quantize_blocks(const float *x, int64_t n, uint8_t *packed, float *absmax)
{
    int64_t nb = nf4_blocks(n);
#pragma omp parallel for schedule(static) if (nb >= 1024)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * AT_NF4_BLOCK, len = n - i0 < AT_NF4_BLOCK ? n - i0 : AT_NF4_BLOCK;
        float amax = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            float a = fabsf(x[i0 + j]);
            if (a > amax) amax = a;
        }
        absmax[b] = amax;
        float inv = 1.0f / amax; /* scaled by multiplying, as bitsandbytes does */
        uint8_t q[AT_NF4_BLOCK];
        for (int j = 0; j < AT_NF4_BLOCK; j++)
            q[j] = j < len && amax > 0.0f ? (uint8_t)nearest(at_nf4_code, 16, clamp1(x[i0 + j] * inv)) : 7;
        for (int j = 0; j < AT_NF4_BLOCK / 2; j++) packed[b * 32 + j] = (uint8_t)(q[2 * j] << 4 | q[2 * j + 1]);
    }
}

void at_nf4_dequantize_blocks(const uint8_t *packed, const float *absmax, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) {
        uint8_t byte = packed[i / 2];
        int q = i % 2 ? byte & 15 : byte >> 4;
        y[i] = at_nf4_code[q] * absmax[i / AT_NF4_BLOCK];
    }
}

void at_nf4_compress_absmax(const float *absmax, int64_t nb, uint8_t *codes, float *absmax2, float *offset)
{
    double sum = 0.0;
    for (int64_t b = 0; b < nb; b++) sum += absmax[b];
    float off = nb > 0 ? (float)(sum / (double)nb) : 0.0f;
    *offset = off;
    for (int64_t g = 0; g * AT_NF4_GROUP < nb; g++) {
        int64_t b0 = g * AT_NF4_GROUP, b1 = b0 + AT_NF4_GROUP < nb ? b0 + AT_NF4_GROUP : nb;
        float m = 0.0f;
        for (int64_t b = b0; b < b1; b++) {
            float a = fabsf(absmax[b] - off);
            if (a > m) m = a;
        }
        absmax2[g] = m;
        float inv = 1.0f / m;
        for (int64_t b = b0; b < b1; b++)
            codes[b] = m > 0.0f ? (uint8_t)nearest(at_dyn8_code, 256, clamp1((absmax[b] - off) * inv)) : 127;
    }
}

/* ---- Q8_0 / Q4_0 (ggml's reference rules) ---- */

void at_q8_0_quantize_row(const float *x, void *blocks, int64_t n)
{
    uint8_t *out = blocks;
    for (int64_t b = 0; b < n / AT_QK8_0; b++, x += AT_QK8_0, out += 2 + AT_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < AT_QK8_0; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = at_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < AT_QK8_0; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

void at_q8_0_dequantize_row(const void *blocks, float *y, int64_t n)
{
    const uint8_t *in = blocks;
    for (int64_t b = 0; b < n / AT_QK8_0; b++, y += AT_QK8_0, in += 2 + AT_QK8_0) {
        uint16_t dh;
        memcpy(&dh, in, 2);
        float d = at_f16_to_f32(dh);
        for (int j = 0; j < AT_QK8_0; j++) y[j] = (float)(int8_t)in[2 + j] * d;
    }
}

void at_q4_0_quantize_row(const float *x, void *blocks, int64_t n)
{
    uint8_t *out = blocks;
    for (int64_t b = 0; b < n / AT_QK4_0; b++, x += AT_QK4_0, out += 2 + AT_QK4_0 / 2) {
        float amax = 0.0f, max = 0.0f; /* the signed value of largest magnitude */
        for (int j = 0; j < AT_QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = at_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < AT_QK4_0 / 2; j++) {
            /* (int8_t) truncates; x·id + 8.5 lies in [0.5, 16.5] */
            int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + AT_QK4_0 / 2] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            out[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void at_q4_0_dequantize_row(const void *blocks, float *y, int64_t n)
{
    const uint8_t *in = blocks;
    for (int64_t b = 0; b < n / AT_QK4_0; b++, y += AT_QK4_0, in += 2 + AT_QK4_0 / 2) {
        uint16_t dh;
        memcpy(&dh, in, 2);
        float d = at_f16_to_f32(dh);
        for (int j = 0; j < AT_QK4_0 / 2; j++) {
            y[j] = (float)((in[2 + j] & 15) - 8) * d;
            y[j + AT_QK4_0 / 2] = (float)((in[2 + j] >> 4) - 8) * d;
        }
    }
}

/* ---- whole tensors ---- */

/* Values are converted and (de)quantized a chunk at a time: a multiple of
 * every block size, small enough for the stack. */
#define CHUNK 4096

static void load_chunk(float *dst, const void *src, at_dtype t, int64_t off, int64_t n)
{
    switch (t) {
    case AT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = at_bf16_to_f32(((const uint16_t *)src)[off + i]);
        break;
    case AT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = at_f16_to_f32(((const uint16_t *)src)[off + i]);
        break;
    default: memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
    }
}

static void store_chunk(void *dst, at_dtype t, int64_t off, const float *src, int64_t n)
{
    switch (t) {
    case AT_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[off + i] = at_f32_to_bf16(src[i]);
        break;
    case AT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[off + i] = at_f32_to_f16(src[i]);
        break;
    default: memcpy((float *)dst + off, src, (size_t)n * sizeof(float));
    }
}

static int is_float(at_dtype t) { return t == AT_F32 || t == AT_BF16 || t == AT_F16; }

static at_status check_pair(const at_tensor *q, const at_tensor *f, const char *op)
{
    char d1[200], d2[200];
    if (!q || !f || !q->buf || !f->buf) return at_error(AT_ERR_INVALID, "%s: a tensor is missing", op);
    if (!at_dtype_is_quantized(q->dtype) || !is_float(f->dtype))
        return at_error(AT_ERR_INVALID, "%s: needs a quantized (q8_0, q4_0, nf4) and an f32/bf16/f16 tensor, got "
                        "%s and %s", op, at_tensor_describe(q, d1, sizeof d1), at_tensor_describe(f, d2, sizeof d2));
    if (!at_tensor_data(q) || !at_tensor_data(f))
        return at_error(AT_ERR_UNSUPPORTED, "%s: %s and %s must both be in host memory", op,
                        at_tensor_describe(q, d1, sizeof d1), at_tensor_describe(f, d2, sizeof d2));
    if (at_tensor_numel(q) != at_tensor_numel(f))
        return at_error(AT_ERR_INVALID, "%s: %s and %s differ in size", op, at_tensor_describe(q, d1, sizeof d1),
                        at_tensor_describe(f, d2, sizeof d2));
    int64_t blk = at_quant_row_block(q->dtype);
    if (q->dtype != AT_NF4 && at_tensor_cols(q) % blk)
        return at_error(AT_ERR_INVALID, "%s: %s: the last dimension must be a multiple of %lld", op,
                        at_tensor_describe(q, d1, sizeof d1), (long long)blk);
    return AT_OK;
}

at_status at_quantize(at_tensor *dst, const at_tensor *src)
{
    AT_TRY(check_pair(dst, src, "quantize"));
    int64_t n = at_tensor_numel(src), nchunks = (n + CHUNK - 1) / CHUNK;
    const void *in = at_tensor_data(src);
    uint8_t *out = at_tensor_data(dst);
    int64_t nb = nf4_blocks(n);
    float *absmax = NULL;
    if (dst->dtype == AT_NF4) {
        absmax = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(float));
        if (!absmax) return at_error(AT_ERR_NOMEM, "quantize %s: out of host memory", dst->name);
    }
    int64_t bad = -1; /* first non-finite element */
#pragma omp parallel for schedule(static) if (nchunks >= 16) /* threads pay off from ~64K values */
    for (int64_t c = 0; c < nchunks; c++) {
        float buf[CHUNK];
        int64_t off = c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        load_chunk(buf, in, src->dtype, off, len);
        int64_t first_bad = -1;
        for (int64_t i = 0; i < len && first_bad < 0; i++)
            if (!isfinite(buf[i])) first_bad = off + i;
        if (first_bad >= 0) {
#pragma omp critical(at_quantize_bad)
            if (bad < 0 || first_bad < bad) bad = first_bad;
            continue;
        }
        switch (dst->dtype) {
        case AT_Q8_0: at_q8_0_quantize_row(buf, out + off / AT_QK8_0 * (2 + AT_QK8_0), len); break;
        case AT_Q4_0: at_q4_0_quantize_row(buf, out + off / AT_QK4_0 * (2 + AT_QK4_0 / 2), len); break;
        default:
            at_nf4_quantize_blocks(buf, len, out + AT_NF4_HEADER + off / 2, absmax + off / AT_NF4_BLOCK);
            break;
        }
    }
    if (bad >= 0) {
        free(absmax);
        char d[200];
        return at_error(AT_ERR_INVALID, "quantize: %s has a non-finite value at element %lld",
                        at_tensor_describe(src, d, sizeof d), (long long)bad);
    }
    if (dst->dtype == AT_NF4) {
        nf4_header h = {.magic = AT_NF4_MAGIC, .version = 1, .nblocks = (uint32_t)nb};
        at_nf4_compress_absmax(absmax, nb, out + AT_NF4_HEADER + 32 * nb, (float *)(out + nf4_absmax2_at(nb)),
                               &h.offset);
        /* the padding bytes between the codes and absmax2 are zero, so equal
         * inputs give byte-identical tensors */
        memset(out + AT_NF4_HEADER + 33 * nb, 0, nf4_absmax2_at(nb) - (AT_NF4_HEADER + 33 * (size_t)nb));
        memcpy(out, &h, sizeof h);
        free(absmax);
    }
    return AT_OK;
}

at_status at_dequantize(at_tensor *dst, const at_tensor *src)
{
    AT_TRY(check_pair(src, dst, "dequantize"));
    at_nf4_parts parts = {0};
    if (src->dtype == AT_NF4) AT_TRY(at_nf4_parts_of(src, &parts));
    int64_t n = at_tensor_numel(src), nchunks = (n + CHUNK - 1) / CHUNK;
    const uint8_t *in = at_tensor_data(src);
    void *out = at_tensor_data(dst);
#pragma omp parallel for schedule(static) if (nchunks >= 16) /* threads pay off from ~64K values */
    for (int64_t c = 0; c < nchunks; c++) {
        float buf[CHUNK], amax[CHUNK / AT_NF4_BLOCK];
        int64_t off = c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        switch (src->dtype) {
        case AT_Q8_0: at_q8_0_dequantize_row(in + off / AT_QK8_0 * (2 + AT_QK8_0), buf, len); break;
        case AT_Q4_0: at_q4_0_dequantize_row(in + off / AT_QK4_0 * (2 + AT_QK4_0 / 2), buf, len); break;
        default:
            at_nf4_absmax(&parts, off / AT_NF4_BLOCK, nf4_blocks(len), amax);
            at_nf4_dequantize_blocks(parts.nibbles + off / 2, amax, len, buf);
            break;
        }
        store_chunk(out, dst->dtype, off, buf, len);
    }
    return AT_OK;
}
