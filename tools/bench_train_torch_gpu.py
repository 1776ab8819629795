#!/usr/bin/python3
"""The PyTorch + PEFT side of bench/train_gpu.c: training tokens/s of one LoRA
step (forward, backward, gradient clipping, AdamW) on a random Llama-family
decoder on a GPU, as ms-swift runs it with Hugging Face + PEFT.

The model is tools/bench_train_torch.py's hand-written LlamaForCausalLM /
Qwen2ForCausalLM, imported from there with its LoRA, optimizer and step
(transformers need not be installed; RMSNorm in f32,
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
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_torch import (EagerAttention, LoraLinear, Model, adamw, add_lora_args,  # noqa: E402
                               add_shape_args, freeze_base, train_step)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Attention(EagerAttention):
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

    def mask(self, T, dtype, device):
        return None if self.has_sdpa else super().mask(T, dtype, device)

    def __call__(self, q, k, v, scale, mask):
        if not self.has_sdpa:
            return super().__call__(q, k, v, scale, mask)
        with self.context():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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
    return model, freeze_base(model, True), how


def main():
    ap = argparse.ArgumentParser()
    add_shape_args(ap)
    add_lora_args(ap)
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
    opt = None
    if cuda:
        try:
            opt = adamw(lora, fused=True)
            fused = "AdamW fused"
        except (TypeError, RuntimeError, ValueError):
            opt = None
    if opt is None:
        opt = adamw(lora)
        fused = "AdamW (default implementation)"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(a.device)
    labels = ids.clone()
    model.train()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        return train_step(model, opt, lora, ids, labels, True)

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
