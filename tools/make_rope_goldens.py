#!/usr/bin/python3
"""Writes tests/data/models/rope_inv_freq.json: RoPE inverse frequencies for a
few configs, computed with torch exactly as transformers' modeling_rope_utils.py
does (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters, as transformers 4.46 has them: make_goldens.py's
hf_inv_freq).

Run from the repository root:  /usr/bin/python3 tools/make_rope_goldens.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import hf_inv_freq  # noqa: E402  (the same reference the model goldens use)


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
    f, _ = hf_inv_freq(c)
    assert f.dtype == torch.float32
    c["inv_freq"] = [float("%.9e" % v) for v in f.tolist()]

with open("tests/data/models/rope_inv_freq.json", "w") as fh:
    json.dump({"generator": "tools/make_rope_goldens.py (torch %s)" % torch.__version__, "cases": cases}, fh, indent=1)
print("wrote %d cases" % len(cases))
