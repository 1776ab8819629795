#!/usr/bin/python3
"""The PyTorch side of bench/train.c: training tokens/s of one LoRA step
(forward, backward, AdamW) on a random Llama-family decoder.

The model is Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM written by
hand as tools/make_goldens.py and tools/bench_forward_torch.py do (RMSNorm in
f32, rotate_half RoPE, repeat_kv GQA, softmax in f32, SiLU MLP), with PEFT's
lora.Linear on q, k, v, o, gate, up, down:

    y = x W^T + b + (alpha / r) * B(A(dropout(x)))      r = 8, alpha = 16

A Kaiming-uniform, B zero, as PEFT; the base weights frozen; the loss is HF's
causal-LM loss (logits of every position in f32, shifted labels, mean over
the targets); torch.nn.utils.clip_grad_norm_(1.0) and torch.optim.AdamW
(lr 1e-4, weight decay 0.01) on the LoRA parameters only, as a Trainer step.

Modes (shared BENCHMARKING.md):
  f32   everything f32;
  bf16  the frozen base weights stored in bf16 (as ms-swift loads a model
        with torch_dtype bfloat16), LoRA parameters f32 (PEFT's
        autocast_adapter_dtype), the step under torch.autocast('cpu',
        dtype=torch.bfloat16): every matmul through oneDNN's bf16 kernels.
bench/train runs this script as a subprocess, with 2 threads, OpenBLAS's
OpenMP build preloaded, and for "f32 best" OPENBLAS_CORETYPE unset. Prints one
JSON line: {"tok_s", "median_s", "runs", "cpu_s", "loss0", "peak_rss_mib", ...}; the
median is over --steps steps after one warm-up step.

    /usr/bin/python3 tools/bench_train_torch.py --hidden 512 --intermediate 1408 \\
        --layers 8 --heads 8 --kv-heads 4 --vocab 32000 --seq 256 --batch 4 --mode bf16
"""

import argparse
import json
import math
import os
import resource
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


class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear: base layer frozen, A and B trained."""

    def __init__(self, fin, fout, bias, r, alpha, dropout):
        super().__init__()
        self.base = nn.Linear(fin, fout, bias=bias)
        self.lora_A = nn.Linear(fin, r, bias=False)
        self.lora_B = nn.Linear(r, fout, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scale = alpha / r

    def forward(self, x):
        y = self.base(x)
        return y + self.lora_B(self.lora_A(self.drop(x))) * self.scale


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.hidden // a.heads
        self.H, self.Hkv, self.D = a.heads, a.kv_heads, D
        L = lambda i, o, b: LoraLinear(i, o, b, a.rank, a.alpha, a.dropout)
        self.input_layernorm = RMSNorm(a.hidden, 1e-6)
        self.q_proj = L(a.hidden, a.heads * D, a.qkv_bias)
        self.k_proj = L(a.hidden, a.kv_heads * D, a.qkv_bias)
        self.v_proj = L(a.hidden, a.kv_heads * D, a.qkv_bias)
        self.o_proj = L(a.heads * D, a.hidden, False)
        self.post_attention_layernorm = RMSNorm(a.hidden, 1e-6)
        self.gate_proj = L(a.hidden, a.intermediate, False)
        self.up_proj = L(a.hidden, a.intermediate, False)
        self.down_proj = L(a.intermediate, a.hidden, False)

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

    def forward(self, ids, labels):
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
        logits = self.lm_head(self.norm(x)).float()
        # transformers' ForCausalLMLoss: shift, mean over the targets
        return F.cross_entropy(logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)


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
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--dropout", type=float, default=0.05)
    ap.add_argument("--mode", choices=["f32", "bf16"], required=True)
    ap.add_argument("--base-dtype", choices=["f32", "bf16"], default=None,
                    help="dtype of the frozen weights (default: bf16 in bf16 mode, f32 in f32 mode)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    lora = []
    for name, p in model.named_parameters():
        if "lora_" in name:
            lora.append(p)
        else:
            p.requires_grad_(False)
    base = a.base_dtype or a.mode
    if base == "bf16":
        for name, p in model.named_parameters():
            if "lora_" not in name:
                p.data = p.data.to(torch.bfloat16)
    opt = torch.optim.AdamW(lora, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    labels = ids.clone()
    model.train()
    times, cpu, loss0 = [], [], None
    for i in range(a.steps + 1):  # the first step warms up
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(a.mode == "bf16")):
            loss = model(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i == 0:
            loss0 = loss.item()
        else:
            times.append(dt)
            cpu.append(dc)
        assert math.isfinite(loss.item())
    times.sort()
    cpu.sort()
    med = times[len(times) // 2]
    print(json.dumps({
        "tok_s": a.batch * a.seq / med,
        "median_s": med,
        "runs": times,
        # CPU seconds of the whole process per step (all threads): on a shared
        # machine, tokens / (cpu_s / threads) estimates the rate on idle cores
        "cpu_s": cpu[len(cpu) // 2],
        "loss0": loss0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "threads": torch.get_num_threads(),
        "base_dtype": base,
        "lora_params": sum(p.numel() for p in lora),
        "blas": os.environ.get("LD_PRELOAD") or "system libblas.so.3",
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
