#!/usr/bin/python3
"""Regenerates the LoRA goldens of tests/test_export.c under tests/data/export/.

Run from the repository root with Debian's Python and torch:

    /usr/bin/python3 tests/data/export/make_goldens.py

For each model NAME of tests/data/goldens/ listed in ADAPTERS it writes

    tests/data/export/NAME_lora/adapter_config.json        PEFT LoRA config
    tests/data/export/NAME_lora/adapter_model.safetensors  A, B (f32) under PEFT's names
        base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight  [r, in]
        base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight  [out, r]
    tests/data/export/NAME_lora.golden.safetensors
        input_ids i32 [B, T], lengths i32 [B], logits f32 [B, T, V]

The logits are those of the base model WITH THE ADAPTER UNMERGED, as PEFT's
LoraLayer computes them:  y = x·Wᵀ + b + s · (x·Aᵀ)·Bᵀ,  s = alpha / r
(alpha / sqrt(r) with use_rslora), through the Hugging Face reference forward
of tools/make_goldens.py (in f32, from the stored weights; a bf16 model is
upcast). B is random rather than zero so the adapter changes the logits.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
import make_goldens as mg  # noqa: E402

OUT = "tests/data/export"
GOLDENS = "tests/data/goldens"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}

ADAPTERS = {
    "llama_gqa": dict(r=4, alpha=8.0, rslora=False, modules=ALL, seed=11, lengths=(12, 7)),
    "qwen2_bias_tied": dict(r=2, alpha=4.0, rslora=False, modules=["q_proj", "v_proj", "down_proj"], seed=12,
                            lengths=(9, 5)),
    "qwen3_qknorm": dict(r=4, alpha=8.0, rslora=True, modules=ALL, seed=13, lengths=(10, 6)),
    "llama_bf16": dict(r=4, alpha=16.0, rslora=False, modules=ALL, seed=14, lengths=(11, 8)),
}


def module_dims(cfg, m):
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = mg.hf_head_dim(cfg)
    Hd, I = cfg["hidden_size"], cfg["intermediate_size"]
    return {"q_proj": (Hd, H * D), "k_proj": (Hd, Hkv * D), "v_proj": (Hd, Hkv * D), "o_proj": (H * D, Hd),
            "gate_proj": (Hd, I), "up_proj": (Hd, I), "down_proj": (I, Hd)}[m]


def forward_unmerged(cfg, W, lora, s, ids):
    """hf_forward with PEFT's unmerged LoRA added to every adapted linear."""
    orig = F.linear

    def linear(x, w, b=None):
        y = orig(x, w, b)
        key = id(w)
        if key in lora:
            A, B = lora[key]
            y = y + s * orig(orig(x, A), B)
        return y

    F.linear = linear
    try:
        return mg.hf_forward(cfg, W, ids)
    finally:
        F.linear = orig


def make(name, spec):
    folder = os.path.join(GOLDENS, name)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    W = {k: v.float() for k, v in mg.read_safetensors(os.path.join(folder, "model.safetensors")).items()}
    gen = torch.Generator().manual_seed(spec["seed"])
    r, alpha = spec["r"], spec["alpha"]
    s = alpha / math.sqrt(r) if spec["rslora"] else alpha / r
    tensors, lora = {}, {}
    for l in range(cfg["num_hidden_layers"]):
        for m in spec["modules"]:
            fin, fout = module_dims(cfg, m)
            A = torch.randn(r, fin, generator=gen) / math.sqrt(fin)
            B = torch.randn(fout, r, generator=gen) * (0.3 / math.sqrt(r))
            base = "base_model.model.model.layers.%d.%s.%s" % (l, PARENT[m], m)
            tensors[base + ".lora_A.weight"] = A
            tensors[base + ".lora_B.weight"] = B
            lora[id(W["model.layers.%d.%s.%s.weight" % (l, PARENT[m], m)])] = (A, B)
    adir = os.path.join(OUT, name + "_lora")
    os.makedirs(adir, exist_ok=True)
    conf = {
        "base_model_name_or_path": None, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "lora_alpha": alpha, "lora_dropout": 0.0, "modules_to_save": None,
        "peft_type": "LORA", "r": r, "target_modules": spec["modules"], "task_type": "CAUSAL_LM",
        "use_dora": False, "use_rslora": spec["rslora"],
    }
    with open(os.path.join(adir, "adapter_config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")
    mg.write_safetensors(os.path.join(adir, "adapter_model.safetensors"), tensors)

    V = cfg["vocab_size"]
    ids_all = [torch.randint(0, V, (n,), generator=gen) for n in spec["lengths"]]
    ids, logits = mg.batch_forward(lambda x: forward_unmerged(cfg, W, lora, s, x), spec["lengths"], ids_all, V)
    base_ids, base_logits = mg.batch_forward(lambda x: mg.hf_forward(cfg, W, x), spec["lengths"], ids_all, V)
    change = (logits - base_logits).abs().max().item() / base_logits.abs().max().item()
    assert change > 0.05, "the adapter barely changes the logits (%g)" % change
    mg.write_safetensors(os.path.join(OUT, name + "_lora.golden.safetensors"), {
        "input_ids": ids,
        "lengths": torch.tensor(spec["lengths"], dtype=torch.int32),
        "logits": logits,
    }, {"format": "pt", "source": "tests/data/export/make_goldens.py", "config": name})
    print("%-16s r=%d alpha=%g scale=%.4g: the adapter moves the logits by %.2f of their range" %
          (name, r, alpha, s, change))


def main():
    torch.set_num_threads(1)
    for name, spec in ADAPTERS.items():
        make(name, spec)


if __name__ == "__main__":
    main()
