#!/usr/bin/python3
"""The PyTorch + PEFT side of bench/train_gpu.c: training tokens/s of one LoRA
step (forward, backward, gradient clipping, AdamW) on a random Llama-family
decoder on a GPU, as ms-swift runs it with Hugging Face + PEFT.

The model is tools/bench_train_torch.py's hand-written LlamaForCausalLM /
Qwen2ForCausalLM (transformers need not be installed; RMSNorm in f32,
rotate_half RoPE, repeat_kv GQA, SiLU MLP, logits upcast to f32 for HF's
shifted causal-LM loss), with transformers' "sdpa" attention path:
F.scaled_dot_product_attention(q, k, v, is_causal=True) on the repeated keys
and values, forced to the flash backend on CUDA (--sdpa default lets torch
choose). LoRA rank 8, alpha 16, dropout 0.05 on q, k, v, o, gate, up, down:
peft's LoraConfig / get_peft_model when `import peft` works, else the
hand-written PEFT lora.Linear of bench_train_torch.py (the JSON says which).
The frozen base weights are bf16 (torch_dtype=bfloat16), the LoRA
parameters f32 (PEFT's autocast_adapter_dtype), the step under
torch.autocast(device, bfloat16); torch.nn.utils.clip_grad_norm_(1.0) and
AdamW (lr 1e-4, weight decay 0.01, fused=True where torch has it) on the
LoRA parameters only. --checkpointing: torch.utils.checkpoint around each
decoder layer (use_reentrant=False), as HF's gradient checkpointing.

Timing: the median of --steps steps after --warmup warm-up steps, with
torch.cuda.synchronize() before each clock reading. Peak memory:
torch.cuda.max_memory_allocated() over the steps (the weights included;
reset after the setup); on the CPU, ru_maxrss. Prints one JSON line:
{"tok_s", "median_s", "runs", "loss0", "peak_mem_mib", "setup_s", "lora",
"attention", "optimizer", "torch", "device_name", ...}.

    python3 tools/bench_train_torch_gpu.py --hidden 896 --intermediate 4864 --layers 24 --heads 14 \\
        --kv-heads 2 --vocab 151936 --seq 1024 --batch 1 --tied --qkv-bias --rope-theta 1000000
    # a logic check without a GPU (torch >= 1.13):
    /usr/bin/python3 tools/bench_train_torch_gpu.py --hidden 64 --intermediate 128 --layers 2 --heads 4 \\
        --kv-heads 2 --vocab 512 --seq 32 --batch 1 --device cpu --steps 2 --warmup 1
"""

import argparse
import contextlib
import json
import math
import resource
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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
    """peft.tuners.lora.Linear written by hand (when peft is not installed)."""

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


class Attention:
    """transformers' sdpa attention (or the eager one where torch has no SDPA)."""

    def __init__(self, device, mode):
        self.has_sdpa = hasattr(F, "scaled_dot_product_attention")
        self.flash = self.has_sdpa and device == "cuda" and mode == "flash"

    def describe(self):
        if not self.has_sdpa:
            return "eager matmul+softmax (this torch has no SDPA)"
        return "sdpa flash" if self.flash else "sdpa (torch's choice)"

    def context(self):
        if not self.flash:
            return contextlib.nullcontext()
        try:  # torch >= 2.3
            from torch.nn.attention import SDPBackend, sdpa_kernel
            return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        except ImportError:
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)

    def __call__(self, q, k, v, scale):
        if self.has_sdpa:
            with self.context():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[2]
        mask = torch.full((T, T), torch.finfo(q.dtype).min, device=q.device).triu(1).to(q.dtype)
        s = torch.matmul(q, k.transpose(2, 3)) * scale + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v)


class Layer(nn.Module):
    def __init__(self, a, linear, attn):
        super().__init__()
        D = a.hidden // a.heads
        self.H, self.Hkv, self.D = a.heads, a.kv_heads, D
        self.attn = attn
        self.input_layernorm = RMSNorm(a.hidden, 1e-6)
        self.q_proj = linear(a.hidden, a.heads * D, a.qkv_bias)
        self.k_proj = linear(a.hidden, a.kv_heads * D, a.qkv_bias)
        self.v_proj = linear(a.hidden, a.kv_heads * D, a.qkv_bias)
        self.o_proj = linear(a.heads * D, a.hidden, False)
        self.post_attention_layernorm = RMSNorm(a.hidden, 1e-6)
        self.gate_proj = linear(a.hidden, a.intermediate, False)
        self.up_proj = linear(a.hidden, a.intermediate, False)
        self.down_proj = linear(a.intermediate, a.hidden, False)

    def forward(self, x, cos, sin):
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
        o = self.attn(q, k, v, self.D ** -0.5).transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, a, linear, attn):
        super().__init__()
        self.device_type = a.device
        self.checkpointing = a.checkpointing
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList([Layer(a, linear, attn) for _ in range(a.layers)])
        self.norm = RMSNorm(a.hidden, 1e-6)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tied:
            self.lm_head.weight = self.embed_tokens.weight
        D = a.hidden // a.heads
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, ids, labels):
        B, T = ids.shape
        x = self.embed_tokens(ids)
        with torch.autocast(self.device_type, enabled=False):
            pos = torch.arange(T, dtype=torch.float32, device=ids.device)
            freqs = torch.outer(pos, self.inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x)).float()
        # transformers' ForCausalLMLoss: shift, mean over the targets
        return F.cross_entropy(logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)


def build(a, attn):
    """The model with LoRA on the 7 linear modules; returns (model, lora params, how LoRA was made)."""
    try:
        import peft
        from peft import LoraConfig, get_peft_model
    except Exception as e:  # noqa: BLE001 - any import failure means: no peft here
        peft, why = None, "%s: %s" % (type(e).__name__, e)
    if peft is not None:
        model = Model(a, lambda i, o, b: nn.Linear(i, o, bias=b), attn)
        cfg = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=TARGETS, bias="none")
        model = get_peft_model(model, cfg)
        how = "peft %s get_peft_model" % peft.__version__
    else:
        model = Model(a, lambda i, o, b: LoraLinear(i, o, b, a.rank, a.alpha, a.dropout), attn)
        how = "hand-written PEFT LoRA (peft not importable: %s)" % why
    lora = []
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            p.data = p.data.float()  # PEFT's autocast_adapter_dtype: adapters f32
            lora.append(p)
        else:
            p.requires_grad_(False)
            p.data = p.data.to(torch.bfloat16)  # torch_dtype=bfloat16
    return model, lora, how


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
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--sdpa", choices=["flash", "default"], default="flash")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    a = ap.parse_args()

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench_train_torch_gpu: torch sees no CUDA device (use --device cpu)")
    if not cuda:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    t_setup = time.perf_counter()
    attn = Attention(a.device, a.sdpa)
    # Build on the device where torch can (torch >= 2.0: the device as a
    # context manager), so a 7B model is never initialized on the host.
    where = torch.device(a.device) if cuda and hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with where:
        model, lora, how = build(a, attn)
    model = model.to(a.device)
    fused = ""
    opt = None
    if cuda:
        try:
            opt = torch.optim.AdamW(lora, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
            fused = "AdamW fused"
        except (TypeError, RuntimeError, ValueError):
            opt = None
    if opt is None:
        opt = torch.optim.AdamW(lora, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        fused = "AdamW (default implementation)"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(a.device)
    labels = ids.clone()
    model.train()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = model(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync()
    setup_s = time.perf_counter() - t_setup
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, loss0, refused = [], None, ""
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        try:
            loss = step()
        except RuntimeError as e:
            # flash refused these inputs (an old GPU, an odd head size): let torch choose
            if i > 0 or not attn.flash:
                raise
            attn.flash = False
            refused = " (flash refused: %s)" % str(e).splitlines()[0][:120]
            opt.zero_grad(set_to_none=True)
            loss = step()
        sync()
        dt = time.perf_counter() - t0
        if i == 0:
            loss0 = loss.item()
        if i >= a.warmup:
            times.append(dt)
        assert math.isfinite(loss.item()), "non-finite loss at step %d" % i
    runs = list(times)
    times.sort()
    med = times[len(times) // 2]
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 1048576.0
        peak_kind = "torch.cuda.max_memory_allocated during the steps"
        name = torch.cuda.get_device_name()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        peak_kind = "ru_maxrss"
        name = "cpu"
    print(json.dumps({
        "tok_s": a.batch * a.seq / med,
        "median_s": med,
        "runs": runs,
        "loss0": loss0,
        "peak_mem_mib": peak,
        "peak_mem_kind": peak_kind,
        "setup_s": setup_s,
        "lora": how,
        "lora_params": sum(p.numel() for p in lora),
        "attention": attn.describe() + refused,
        "optimizer": fused,
        "checkpointing": a.checkpointing,
        "device": a.device,
        "device_name": name,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
