/* Quantized weight formats: their byte layouts, quantization from f32 / bf16 /
 * f16 and dequantization (host code), and the row helpers the matmul kernels
 * use.
 *
 * Q8_0 (GGUF, ggml's block_q8_0): blocks of 32 values, 34 bytes each:
 *   f16 d, int8 qs[32];  value j = qs[j] · d.
 *   Quantize (ggml quantize_row_q8_0_ref): amax = max |x|, d = amax / 127,
 *   qs[j] = roundf(x[j] · (1/d))  (0 when d == 0); d is stored as f16 (RNE).
 *   The rounding error is at most d/2 per value, plus d's f16 rounding.
 *   1.0625 bytes per value.
 *
 * Q4_0 (GGUF, ggml's block_q4_0): blocks of 32 values, 18 bytes each:
 *   f16 d, uint8 qs[16];  value j = ((qs[j] & 15) − 8) · d for j < 16,
 *   ((qs[j−16] >> 4) − 8) · d for j ≥ 16 (low nibbles: the first 16 values).
 *   Quantize (ggml quantize_row_q4_0_ref): m = the value of largest
 *   magnitude (signed, first one on ties), d = m / −8, q = min(15,
 *   (int8)(x · (1/d) + 8.5)).  0.5625 bytes per value.
 *   Both block layouts are GGUF's, so export writes them unchanged.
 *
 * NF4 (bitsandbytes quantize_4bit, quant_type "nf4", blocksize 64) with
 * double quantization of the block scales (bitsandbytes compress_statistics,
 * QLoRA §3), always on:
 *   - the tensor is flattened and cut into blocks of 64 (the last may be
 *     partial); absmax[b] = max |x| over the block;
 *   - each value becomes the index of the code nearest x · (1/absmax[b])
 *     (clamped to [−1, 1]; ties to the lower index) in the 16-value NF4 code
 *     book at_nf4_code (bitsandbytes' table); two indices a byte, the FIRST
 *     value in the HIGH nibble (bitsandbytes' packing); padding past the
 *     end is index 7 (0.0). An all-zero block stores index 7 everywhere
 *     (bitsandbytes computes 0·∞ = NaN there and stores index 0; both give 0
 *     without double quantization, only index 7 gives exactly 0 with it);
 *   - double quantization: offset = mean(absmax) (computed in double,
 *     rounded once to f32; bitsandbytes takes torch's f32 mean, which can
 *     differ in the last bit), then a = absmax − offset is quantized in
 *     groups of 256 blocks like bitsandbytes' quantize_blockwise: absmax2[g]
 *     = max |a| over the group, code = nearest entry of a·(1/absmax2[g]) in
 *     bitsandbytes' dynamic 8-bit map (create_dynamic_map(), at_dyn8_code).
 *     We use that map rather than linear int8 because it is what
 *     bitsandbytes stores (a checkpoint's nested_quant_map), so states
 *     convert both ways without requantizing, and it keeps more precision
 *     near 0, where most a = absmax − mean lie.
 *   - dequantize: s = (dyn8[code] · absmax2[g]) + offset   (two f32 roundings,
 *     as bitsandbytes' dequantize_blockwise + offset), value = nf4[q] · s.
 *   Layout of an AT_NF4 tensor of n values, nb = ceil(n/64) blocks,
 *   ng = ceil(nb/256) groups, all in its one buffer (little endian):
 *     [0, 16)                      header: u32 magic "NF4Q", u32 version 1,
 *                                  f32 offset, u32 nb (for validation)
 *     [16, 16 + 32·nb)             nibbles, 32 bytes per block
 *     [16 + 32·nb, 16 + 33·nb)     u8 absmax code per block
 *     [A, A + 4·ng)                f32 absmax2 per group, A = 16 + 33·nb
 *                                  rounded up to a multiple of 4
 *   at_dtype_bytes(AT_NF4, n) = at_nf4_nbytes(n) = A + 4·ng. Bytes per
 *   value: 33/64 + 4/16384 + (≤ 19)/n ≈ 0.5159 for large n (Qwen2.5-0.5B's
 *   896×4864 weights: 0.51587). A view into an NF4 tensor at a non-zero
 *   offset is meaningless (the arrays are not per row): use whole tensors.
 *   Without double quantization bitsandbytes keeps f32 absmax (0.5625 bytes
 *   per value); the helpers at_nf4_quantize_blocks / at_nf4_dequantize_blocks
 *   give that form for checks and conversion, but tensors always hold the
 *   double-quantized form so that their size is a function of n alone.
 *
 * Sources: ggml-quants.c (quantize_row_q8_0_ref, quantize_row_q4_0_ref,
 * dequantize_row_*), bitsandbytes functional.py (quantize_4bit,
 * quantize_blockwise, create_dynamic_map, create_normal_map) and its
 * pure-torch backend (backends/default/ops.py). tools/make_quant_goldens.py
 * restates those rules and writes the goldens tests/test_quant.c checks. */
#ifndef AT_DEVICE_QUANT_H
#define AT_DEVICE_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"

#define AT_QK8_0 32
#define AT_QK4_0 32
#define AT_NF4_BLOCK 64
#define AT_NF4_GROUP 256 /* absmax codes per second-level scale */
#define AT_NF4_HEADER 16
#define AT_NF4_MAGIC 0x5134464eu /* "NF4Q" little endian */

/* 1 for AT_Q8_0, AT_Q4_0, AT_NF4. */
int at_dtype_is_quantized(at_dtype t);
/* Values per quantization block along a row (32, 32, 64); 1 for other dtypes.
 * A quantized matmul weight needs rows that are a multiple of this. */
int64_t at_quant_row_block(at_dtype t);

/* The NF4 code book (bitsandbytes' table, ascending) and bitsandbytes'
 * dynamic 8-bit map (create_dynamic_map(): ascending, 0 at index 127, 1.0
 * at index 255). */
extern const float at_nf4_code[16];
extern const float at_dyn8_code[256];

/* Bytes of an NF4 tensor of n values (the layout above). */
size_t at_nf4_nbytes(int64_t n);

/* Quantizes src (f32, bf16 or f16; host memory) into dst (AT_Q8_0, AT_Q4_0
 * or AT_NF4; host memory) of the same number of elements. Q8_0 and Q4_0 need
 * a last dimension that is a multiple of 32 (GGUF's rule). Non-finite
 * values are refused (AT_ERR_INVALID naming the tensor and the element).
 * Threads with OpenMP. */
at_status at_quantize(at_tensor *dst, const at_tensor *src);
/* dst (f32, bf16 or f16; host) = the values src (quantized; host) stands for
 * (rounded once to dst's dtype). An NF4 tensor must carry a valid header. */
at_status at_dequantize(at_tensor *dst, const at_tensor *src);

/* ---- row helpers (host memory; n a multiple of the block size) ---- */

void at_q8_0_quantize_row(const float *x, void *blocks, int64_t n);
void at_q8_0_dequantize_row(const void *blocks, float *y, int64_t n);
void at_q4_0_quantize_row(const float *x, void *blocks, int64_t n);
void at_q4_0_dequantize_row(const void *blocks, float *y, int64_t n);

/* bitsandbytes NF4 without double quantization, any n: packed gets
 * ceil(n/64)·32 bytes (padding nibbles 7), absmax ceil(n/64) floats. */
void at_nf4_quantize_blocks(const float *x, int64_t n, uint8_t *packed, float *absmax);
/* y[i] = nf4[q_i] · absmax[i/64] for i < n. */
void at_nf4_dequantize_blocks(const uint8_t *packed, const float *absmax, int64_t n, float *y);
/* Double quantization of nb absmax values (see above): codes[nb],
 * absmax2[ceil(nb/256)], *offset. */
void at_nf4_compress_absmax(const float *absmax, int64_t nb, uint8_t *codes, float *absmax2, float *offset);

/* The parts of an NF4 tensor's buffer. Pointers into the tensor (valid
 * while it lives). */
typedef struct {
    const uint8_t *nibbles; /* 32 bytes per block */
    const uint8_t *codes;   /* absmax code per block */
    const float *absmax2;   /* one per AT_NF4_GROUP blocks */
    float offset;
    int64_t nblocks;
} at_nf4_parts;
/* Finds the parts of host tensor t (AT_NF4) and checks its header;
 * AT_ERR_INVALID naming the tensor when it was never quantized. */
at_status at_nf4_parts_of(const at_tensor *t, at_nf4_parts *out);
/* out[i] = the dequantized absmax of block b0 + i, for i < n. */
void at_nf4_absmax(const at_nf4_parts *p, int64_t b0, int64_t n, float *out);

#endif
