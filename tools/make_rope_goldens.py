#!/usr/bin/python3
"""Writes tests/data/models/rope_inv_freq.json: RoPE inverse frequencies for a
few configs, computed with torch exactly as transformers' modeling_rope_utils.py
does (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters; the function bodies below are copied from
transformers 4.46 with the config object replaced by arguments).

Run from the repository root:  /usr/bin/python3 tools/make_rope_goldens.py
"""
import json
import math

import torch


def default_inv_freq(base, dim):
    # _compute_default_rope_parameters
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def linear_inv_freq(base, dim, factor):
    # _compute_linear_scaling_rope_parameters
    inv_freq = default_inv_freq(base, dim)
    inv_freq /= factor
    return inv_freq


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    # _compute_llama3_parameters
    inv_freq = default_inv_freq(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama


cases = [
    dict(name="llama2 default", rope_theta=10000.0, head_dim=64, rope_scaling=None),
    dict(name="qwen2 default 1e6", rope_theta=1000000.0, head_dim=128, rope_scaling=None),
    dict(name="linear x4", rope_theta=10000.0, head_dim=128, rope_scaling=dict(rope_type="linear", factor=4.0)),
    dict(name="llama3.2 (factor 32)", rope_theta=500000.0, head_dim=64,
         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8192)),
    dict(name="llama3.1 (factor 8)", rope_theta=500000.0, head_dim=128,
         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8192)),
]

for c in cases:
    rs = c["rope_scaling"]
    if rs is None:
        f = default_inv_freq(c["rope_theta"], c["head_dim"])
    elif rs["rope_type"] == "linear":
        f = linear_inv_freq(c["rope_theta"], c["head_dim"], rs["factor"])
    else:
        f = llama3_inv_freq(c["rope_theta"], c["head_dim"], rs["factor"], rs["low_freq_factor"],
                            rs["high_freq_factor"], rs["original_max_position_embeddings"])
    assert f.dtype == torch.float32
    c["inv_freq"] = [float("%.9e" % v) for v in f.tolist()]

with open("tests/data/models/rope_inv_freq.json", "w") as fh:
    json.dump({"generator": "tools/make_rope_goldens.py (torch %s)" % torch.__version__, "cases": cases}, fh, indent=1)
print("wrote %d cases" % len(cases))
