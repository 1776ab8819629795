#!/usr/bin/python3
"""The PyTorch side of bench/train.c: training tokens/s of one LoRA step
(forward, backward, AdamW) on a random Llama-family decoder.

The model is Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM written by
hand as tools/make_goldens.py and tools/bench_forward_torch.py do (RMSNorm in
f32, rotate_half RoPE, repeat_kv GQA, softmax in f32, SiLU MLP), with PEFT's
lora.Linear on q, k, v, o, gate, up, down:

    y = x W^T + b + (alpha / r) * B(A(dropout(x)))      r = 8, alpha = 16

A Kaiming-uniform, B zero, as PEFT; the rest initialised as transformers
does (hf_init: normal(0, 0.02), so the first loss is near ln(vocab), as
bench/train's at_decoder_weights_random_hf); the base weights frozen; the loss is HF's
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
import torch.utils.checkpoint
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


class EagerAttention:
    """transformers' eager attention: q k^T scaled plus the causal mask
    (made once per forward by mask()), softmax in f32."""

    def mask(self, T, dtype, device):
        return torch.full((T, T), torch.finfo(dtype).min, device=device).triu(1).to(dtype)

    def __call__(self, q, k, v, scale, mask):
        s = torch.matmul(q, k.transpose(2, 3)) * scale + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v)


class Layer(nn.Module):
    """A decoder layer; linear(fin, fout, bias) makes each of the 7 projections
    (default: LoraLinear with a.rank, a.alpha, a.dropout), attn the attention
    (default: EagerAttention)."""

    def __init__(self, a, linear=None, attn=None):
        super().__init__()
        D = a.hidden // a.heads
        self.H, self.Hkv, self.D = a.heads, a.kv_heads, D
        L = linear or (lambda i, o, b: LoraLinear(i, o, b, a.rank, a.alpha, a.dropout))
        self.attn = attn or EagerAttention()
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
        if rep > 1:  # transformers' repeat_kv
            k = k[:, :, None].expand(B, self.Hkv, rep, T, self.D).reshape(B, self.H, T, self.D)
            v = v[:, :, None].expand(B, self.Hkv, rep, T, self.D).reshape(B, self.H, T, self.D)
        o = self.attn(q, k, v, self.D ** -0.5, mask).transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def hf_init(model, std):
    """transformers' PreTrainedModel._init_weights for Llama / Qwen2 (config.
    initializer_range = std = 0.02): every nn.Linear and the nn.Embedding
    normal(0, std), biases 0 (the norms are 1 already); PEFT adds LoRA after
    that, so lora_A keeps its Kaiming-uniform and lora_B its zeros. The
    torch defaults instead (nn.Embedding N(0, 1) through the tied head)
    give logits in the hundreds and a first loss of ~750, far from the
    ln(vocab) of a real untrained model."""
    lora = {id(m) for mod in model.modules() if isinstance(mod, LoraLinear) for m in (mod.lora_A, mod.lora_B)}
    with torch.no_grad():
        for m in model.modules():
            if id(m) in lora or not isinstance(m, (nn.Linear, nn.Embedding)):
                continue
            m.weight.normal_(0.0, std)
            if getattr(m, "bias", None) is not None:
                m.bias.zero_()


class Model(nn.Module):
    """The causal LM; linear and attn as Layer's. a.checkpointing (when
    present): torch.utils.checkpoint around each layer, as HF's gradient
    checkpointing."""

    def __init__(self, a, linear=None, attn=None):
        super().__init__()
        self.checkpointing = getattr(a, "checkpointing", False)
        self.attn = attn or EagerAttention()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList([Layer(a, linear, self.attn) for _ in range(a.layers)])
        self.norm = RMSNorm(a.hidden, 1e-6)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tied:
            self.lm_head.weight = self.embed_tokens.weight
        hf_init(self, getattr(a, "init_std", 0.02))
        D = a.hidden // a.heads
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        self.register_buffer("inv_freq", inv, persistent=False)  # moves with model.to(device)

    def hidden(self, ids):
        """The last layer's output (before the final norm)."""
        B, T = ids.shape
        x = self.embed_tokens(ids)
        pos = torch.arange(T, dtype=torch.float32, device=ids.device)
        with torch.autocast(ids.device.type, enabled=False):
            freqs = torch.outer(pos, self.inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = self.attn.mask(T, x.dtype, x.device)
        for layer in self.layers:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return x

    def forward(self, ids, labels):
        logits = self.lm_head(self.norm(self.hidden(ids))).float()
        # transformers' ForCausalLMLoss: shift, mean over the targets
        return F.cross_entropy(logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)


def add_shape_args(ap):
    """The model-shape options every torch peer takes (bench_util.h's bench_shape)."""
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


def add_lora_args(ap):
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--dropout", type=float, default=0.05)


def freeze_base(model, base_bf16):
    """Marks the LoRA parameters trainable and f32 (PEFT's autocast_adapter_dtype),
    freezes the rest, stored in bf16 when base_bf16 (torch_dtype=bfloat16);
    returns the LoRA parameters."""
    lora = []
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            p.data = p.data.float()
            lora.append(p)
        else:
            p.requires_grad_(False)
            if base_bf16:
                p.data = p.data.to(torch.bfloat16)
    return lora


def adamw(lora, **kw):
    """A Trainer's AdamW: lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01."""
    return torch.optim.AdamW(lora, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kw)


def train_step(model, opt, lora, ids, labels, bf16):
    """One Trainer step: forward (under bf16 autocast when bf16), backward,
    clip_grad_norm_(1.0), AdamW; returns the loss."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids, labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lora, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main():
    ap = argparse.ArgumentParser()
    add_shape_args(ap)
    add_lora_args(ap)
    ap.add_argument("--mode", choices=["f32", "bf16"], required=True)
    ap.add_argument("--base-dtype", choices=["f32", "bf16"], default=None,
                    help="dtype of the frozen weights (default: bf16 in bf16 mode, f32 in f32 mode)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    base = a.base_dtype or a.mode
    lora = freeze_base(model, base == "bf16")
    opt = adamw(lora)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    labels = ids.clone()
    model.train()
    times, cpu, loss0 = [], [], None
    for i in range(a.steps + 1):  # the first step warms up
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(model, opt, lora, ids, labels, a.mode == "bf16")
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
