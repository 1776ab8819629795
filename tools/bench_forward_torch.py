#!/usr/bin/python3
"""The PyTorch side of bench/forward.c: prefill tokens/s of a random
Llama-family decoder, written as Hugging Face's LlamaForCausalLM runs it in
eager mode (RMSNorm in f32, rotate_half RoPE, repeat_kv GQA, softmax in f32,
SiLU MLP, logits for the last position only as generate() asks since
transformers 4.45: num_logits_to_keep=1).

bench/forward runs it as a subprocess with PyTorch set up at its best (see
shared BENCHMARKING.md): 2 threads, OpenBLAS's OpenMP build preloaded and
OPENBLAS_CORETYPE unset for f32, bf16 autocast for bf16. Prints one JSON line:
{"tok_s": ..., "median_s": ..., "runs": [...], "peak_rss_mib": ..., "threads": ...,
 "blas": ...}.

    /usr/bin/python3 tools/bench_forward_torch.py --hidden 512 --intermediate 1408 \
        --layers 8 --heads 8 --kv-heads 4 --vocab 32000 --seq 256 --batch 4 --mode f32
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.hidden // a.heads
        self.H, self.Hkv, self.D = a.heads, a.kv_heads, D
        self.input_layernorm = RMSNorm(a.hidden, 1e-6)
        self.q_proj = nn.Linear(a.hidden, a.heads * D, bias=a.qkv_bias)
        self.k_proj = nn.Linear(a.hidden, a.kv_heads * D, bias=a.qkv_bias)
        self.v_proj = nn.Linear(a.hidden, a.kv_heads * D, bias=a.qkv_bias)
        self.o_proj = nn.Linear(a.heads * D, a.hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(a.hidden, 1e-6)
        self.gate_proj = nn.Linear(a.hidden, a.intermediate, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.intermediate, bias=False)
        self.down_proj = nn.Linear(a.intermediate, a.hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.Hkv, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.H // self.Hkv
        k = k[:, :, None].expand(B, self.Hkv, rep, T, self.D).reshape(B, self.H, T, self.D)
        v = v[:, :, None].expand(B, self.Hkv, rep, T, self.D).reshape(B, self.H, T, self.D)
        s = torch.matmul(q, k.transpose(2, 3)) * (self.D ** -0.5) + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList([Layer(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.hidden, 1e-6)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tied:
            self.lm_head.weight = self.embed_tokens.weight
        D = a.hidden // a.heads
        self.inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))

    def forward(self, ids):
        B, T = ids.shape
        x = self.embed_tokens(ids)
        pos = torch.arange(T, dtype=torch.float32)
        with torch.autocast("cpu", enabled=False):
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = torch.full((T, T), torch.finfo(x.dtype).min).triu(1).to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x[:, -1:, :])  # num_logits_to_keep=1
        return self.lm_head(x).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--intermediate", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--qkv-bias", action="store_true")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--mode", choices=["f32", "bf16"], required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        model = Model(a).eval()
        ids = torch.randint(0, a.vocab, (a.batch, a.seq))
        times = []
        for i in range(a.runs + 1):  # the first run warms up
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(a.mode == "bf16")):
                out = model(ids)
            dt = time.perf_counter() - t0
            if i > 0:
                times.append(dt)
            assert out.shape == (a.batch, 1, a.vocab) and torch.isfinite(out).all()
    times.sort()
    med = times[len(times) // 2]
    # Debian's torch calls the generic libblas.so.3; which BLAS that is
    # depends on LD_PRELOAD (bench/forward preloads OpenBLAS's OpenMP build).
    blas = os.environ.get("LD_PRELOAD") or "system libblas.so.3"
    print(json.dumps({
        "tok_s": a.batch * a.seq / med,
        "median_s": med,
        "runs": times,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "threads": torch.get_num_threads(),
        "blas": blas,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
