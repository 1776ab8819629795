#!/usr/bin/python3
"""Writes tests/data/quant/: inputs and the bytes the quantized formats must
produce from them, computed here independently of anytune's C code.

  q8_0 / q4_0   ggml's reference quantizers (quantize_row_q8_0_ref,
                quantize_row_q4_0_ref in ggml-quants.c) and dequantizers,
                restated in numpy with the same float32 operations.
  nf4           bitsandbytes' quantize_4bit (blocksize 64) as its pure-torch
                backend (bitsandbytes/backends/default/ops.py) computes it:
                absmax per block, scaled = clamp(x * (1/absmax), -1, 1), the
                nearest code (argmin, ties to the lower index), two codes a
                byte with the first value in the high nibble.
  double quant  bitsandbytes' compress_statistics: offset = mean(absmax),
                (absmax - offset) quantized with quantize_blockwise
                (blocksize 256, the dynamic 8-bit code of create_dynamic_map).
                One deliberate difference: bitsandbytes takes torch's float32
                mean; here (and in anytune) the offset is the double-precision
                mean rounded once to float32, which does not depend on the
                summation order of a library.

The NF4 code book is rebuilt from its definition (create_normal_map with
offset 0.9677083, using the standard library's inverse normal CDF instead of
scipy) and checked against bitsandbytes' literal table; the dynamic map is
create_dynamic_map() itself (it depends on torch.linspace's float32 values,
so it is stored as a golden and anytune's table is compared with it).

Run from the repository root:  /usr/bin/python3 tools/make_quant_goldens.py
All files are raw little-endian arrays; tests/data/quant/SOURCES.md lists them.
"""
import os
from statistics import NormalDist

import numpy as np
import torch

OUT = "tests/data/quant"
f32 = np.float32

# bitsandbytes/backends/utils.py _NF4_QUANT_TABLE (also csrc/kernels.cu nf4_dequantization_lut)
NF4_TABLE = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
             0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


def create_normal_map(offset=0.9677083):
    # bitsandbytes.functional.create_normal_map(use_extra_value=True), scipy's norm.ppf
    # replaced by statistics.NormalDist().inv_cdf
    nd = NormalDist()
    v1 = [nd.inv_cdf(float(p)) for p in torch.linspace(offset, 0.5, 9)[:-1]]
    v2 = [0] * (256 - 15)
    v3 = [-nd.inv_cdf(float(p)) for p in torch.linspace(offset, 0.5, 8)[:-1]]
    values = torch.Tensor(v1 + v2 + v3).sort().values
    values /= values.max()
    return values


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    # bitsandbytes.functional.create_dynamic_map
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    assert additional_items == 0
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.Tensor(data)


def to_f16_bits(x):
    return np.array([x], dtype=np.float32).astype(np.float16).view(np.uint16)[0]


def roundf(v):
    # C roundf: half away from zero (v is float32, exact in double)
    v = float(v)
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def q8_0(x):
    out = bytearray()
    deq = np.zeros_like(x)
    for b in range(len(x) // 32):
        blk = x[b * 32:(b + 1) * 32]
        amax = f32(0)
        for v in blk:
            amax = max(amax, abs(v))
        d = f32(amax / f32(127))
        idv = f32(1) / d if d != 0 else f32(0)
        dh = to_f16_bits(d)
        qs = [roundf(f32(v * idv)) for v in blk]
        out += int(dh).to_bytes(2, "little") + bytes((q & 0xFF) for q in qs)
        dd = np.array([dh], dtype=np.uint16).view(np.float16).astype(np.float32)[0]
        deq[b * 32:(b + 1) * 32] = [f32(q * dd) for q in qs]
    return bytes(out), deq


def q4_0(x):
    out = bytearray()
    deq = np.zeros_like(x)
    for b in range(len(x) // 32):
        blk = x[b * 32:(b + 1) * 32]
        amax, mx = f32(0), f32(0)
        for v in blk:
            if amax < abs(v):
                amax, mx = abs(v), v
        d = f32(mx / f32(-8))
        idv = f32(1) / d if d != 0 else f32(0)
        dh = to_f16_bits(d)
        q = [min(15, int(f32(f32(v * idv) + f32(8.5)))) for v in blk]  # (int8_t) truncates
        qs = bytes(q[j] | (q[j + 16] << 4) for j in range(16))
        out += int(dh).to_bytes(2, "little") + qs
        dd = np.array([dh], dtype=np.uint16).view(np.float16).astype(np.float32)[0]
        deq[b * 32:(b + 1) * 32] = [f32((v - 8) * dd) for v in q]
    return bytes(out), deq


def nearest(scaled, code):
    # argmin |scaled - code| along the last axis; torch returns the first minimum
    return torch.argmin(torch.abs(scaled.unsqueeze(-1) - code), dim=-1)


def nf4(x, code):
    n = x.numel()
    nb = (n + 63) // 64
    pad = torch.zeros(nb * 64, dtype=torch.float32)
    pad[:n] = x
    blocks = pad.view(nb, 64)
    absmax = blocks.abs().max(dim=1).values  # padding zeros never raise it
    scaled = torch.clamp(blocks * (1 / absmax).view(-1, 1), -1, 1)
    q = nearest(scaled, code).reshape(-1).to(torch.uint8)
    packed = (q[0::2] << 4) | q[1::2]
    return packed, absmax, q


def double_quant(absmax, dyn):
    offset = np.float32(np.mean(absmax.numpy().astype(np.float64)))
    a = absmax - torch.tensor(offset)
    nb = a.numel()
    ng = (nb + 255) // 256
    qa = torch.zeros(nb, dtype=torch.uint8)
    absmax2 = torch.zeros(ng, dtype=torch.float32)
    for g in range(ng):
        seg = a[g * 256:(g + 1) * 256]
        m = seg.abs().max()
        absmax2[g] = m
        s = torch.clamp(seg * (1 / m), -1, 1)
        qa[g * 256:(g + 1) * 256] = nearest(s, dyn).to(torch.uint8)
    # dequantize_blockwise(qabsmax, state2) + offset
    back = torch.zeros(nb, dtype=torch.float32)
    for g in range(ng):
        back[g * 256:(g + 1) * 256] = dyn[qa[g * 256:(g + 1) * 256].long()] * absmax2[g]
    back = back + torch.tensor(offset)
    return qa, absmax2, offset, back


def write(name, arr):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(arr if isinstance(arr, (bytes, bytearray)) else np.ascontiguousarray(arr).tobytes())
    print(f"{path}: {os.path.getsize(path)} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    nf4_code = create_normal_map()
    nf4_code = torch.tensor(sorted(set(nf4_code.tolist())), dtype=torch.float32)
    assert nf4_code.tolist() == torch.tensor(NF4_TABLE, dtype=torch.float32).tolist()
    dyn = create_dynamic_map()
    write("nf4_code.f32", nf4_code.numpy())
    write("dyn8_code.f32", dyn.numpy())

    rng = np.random.RandomState(20240531)
    # q8_0 / q4_0 input: 64 rows of 96, N(0,1) with awkward blocks
    x = rng.standard_normal(64 * 96).astype(np.float32)
    x[0:32] = 0  # an all-zero block: d = 0, every q = 0
    x[32:64] *= 1e-3  # tiny values (f16 subnormal scale)
    x[64 + 5] = -7.5  # the largest magnitude is negative: q4_0's d is positive
    x[96 + 9] = 6.25  # ... and positive: q4_0's d is negative
    x[128:160] = np.round(x[128:160] * 4) / 4  # values on a coarse grid: exact halves appear
    x[160:192] *= 300.0  # large values
    write("q_input.f32", x)
    b, deq = q8_0(x)
    write("q8_0.bin", b)
    write("q8_0_deq.f32", deq)
    b, deq = q4_0(x)
    write("q4_0.bin", b)
    write("q4_0_deq.f32", deq)

    # nf4 input: 20400 values (319 blocks, the last one partial with 48 values;
    # 2 groups of absmax for the double quantization), N(0, 0.02) as LLM weights
    # with a few outliers
    n = 20400
    w = (rng.standard_normal(n) * 0.02).astype(np.float32)
    w[rng.randint(0, n, 40)] *= 8.0
    write("nf4_input.f32", w)
    packed, absmax, q = nf4(torch.from_numpy(w), nf4_code)
    write("nf4_packed.u8", packed.numpy())
    write("nf4_absmax.f32", absmax.numpy())
    write("nf4_deq_nodq.f32", (nf4_code[q.long()][:n].view(-1) *
                               absmax.repeat_interleave(64)[:n]).numpy())
    qa, absmax2, offset, back = double_quant(absmax, dyn)
    write("nf4_dq_qabsmax.u8", qa.numpy())
    write("nf4_dq_absmax2.f32", absmax2.numpy())
    write("nf4_dq_offset.f32", np.array([offset], dtype=np.float32))
    write("nf4_deq.f32", (nf4_code[q.long()][:n] * back.repeat_interleave(64)[:n]).numpy())


if __name__ == "__main__":
    main()
