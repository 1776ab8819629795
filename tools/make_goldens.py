#!/usr/bin/python3
"""Regenerates the decoder goldens under tests/data/goldens/.

Run from the repository root with Debian's Python and torch (transformers is
not needed and not used):

    /usr/bin/python3 tools/make_goldens.py

What it writes, for every configuration NAME in CONFIGS:

    tests/data/goldens/NAME/config.json           Hugging Face config
    tests/data/goldens/NAME/model.safetensors     random weights, HF tensor names
    tests/data/goldens/NAME.golden.safetensors    inputs and expected outputs:
        input_ids  i32 [B, T]    two sequences of different lengths, right-padded with 0
        lengths    i32 [B]
        logits     f32 [B, T, V] expected logits (0 past each sequence's length)
        inv_freq   f32 [D/2]     the RoPE inverse frequencies (after rope_scaling)

and, for training (every NAME of TRAIN_CONFIGS),

    tests/data/goldens/NAME_lora/adapter_config.json       PEFT LoRA adapter, r=4, alpha=8, dropout 0,
    tests/data/goldens/NAME_lora/adapter_model.safetensors  all 7 linear modules, B non-zero
    tests/data/goldens/NAME.train.golden.safetensors
        input_ids  i32 [B, T]    two rows of different lengths, right-padded with 0
        labels     i32 [B, T]    HF labels (unshifted): -100 on a prompt span, an inner span and padding
        lengths    i32 [B]
        loss       f32 [1]       mean cross-entropy over the supervised targets (HF shift by one)
        n_targets  i32 [1]
        row_loss   f32 [B]       loss sum of each row
        lora.<PEFT name>         f32 gradient of `loss` for every lora_A / lora_B
        adamw.<PEFT name>        f32 the LoRA parameters after two torch.optim.AdamW steps on this
                                 batch (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01)
        full.<HF name>           f32 gradient of `loss` for every weight, no adapter (full
                                 fine-tuning; FULL_GRADS configurations only)

The training reference is hf_forward with PEFT's lora.Linear added by hand
(y = x W^T + b + (alpha/r) (x A^T) B^T); torch autograd computes the gradients.

and, for NEFTune (every NAME of NEFTUNE_CONFIGS; the batch and adapter of
NAME.train.golden.safetensors, read back, so nothing above changes),

    tests/data/goldens/NAME.neftune.golden.safetensors
        alpha      f32 [1]       --neftune_noise_alpha
        seed       i32 [1]       the step's dropout seed; the noise seed is at_rng_mix(seed, NEFTUNE_STREAM)
        noise      f32 [B, T, H] the noise added to embed[ids] (padding included)
        full_loss  f32 [1]       the loss without the adapter (full fine-tuning)
        loss, n_targets, row_loss, lora.<PEFT name>, full.<HF name>: as the training golden, with
                                 hf_forward's embeddings + noise (transformers' neftune_post_forward_hook:
                                 U(-m, m), m = alpha / sqrt(T * H), T the batch's columns)

The noise is base/rng.c's counter hash redone in numpy: u = splitmix64(seed' ^
counter * K1) >> 40 as k * 2^-24, counter = (row * 2^24 + token) * H + feature
(model/layers.h AT_DROPOUT_ROW_PITCH), n = f32(m * f32(2u - 1)), so the goldens
pin the exact noise, not only its distribution.

and, from the llama2.c checkpoint tests/data/models/stories260K.bin,

    tests/data/goldens/stories260K.golden.safetensors
        input_ids, lengths, logits as above (a batch of prompts)

The reference model below re-implements Hugging Face's LlamaForCausalLM,
Qwen2ForCausalLM and Qwen3ForCausalLM forward (transformers 4.4x semantics):
rotate_half RoPE with HF's inv_freq rules (default, linear, llama3), repeat_kv
for grouped-query attention, RMSNorm computed in f32 then cast back, SiLU-gated
MLP, optional q/k/v bias (Qwen2, Llama attention_bias), q/k RMSNorm over
head_dim before RoPE (Qwen3), tied embeddings. Each sequence is run alone (no
padding, no attention mask beyond the causal one), so padding conventions cannot
leak into the goldens.

stories260K is checked against an independent llama2.c-style model (model.py
of karpathy/llama2.c: interleaved-pair "complex" RoPE on the original weight
layout), so a wrong q/k permutation in our loader shows up.

The safetensors files are written by hand (8-byte little-endian header length,
JSON header with dtype/shape/data_offsets, header padded with spaces to a
multiple of 8, then the raw little-endian data), since the safetensors package
may be absent.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------
# safetensors, by hand

_ST_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int32: "I32",
    torch.int64: "I64",
}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        # numpy has no bf16: reinterpret the bits as int16
        t = t.view(torch.int16)
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<")).tobytes()


def write_safetensors(path, tensors, metadata=None):
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        b = _tensor_bytes(t)
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Reader used only to check what was written (round trip)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        shape = info["shape"]
        if info["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        elif info["dtype"] == "I32":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i4").copy())
        elif info["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy()).view(torch.bfloat16)
        else:
            raise ValueError(info["dtype"])
        out[name] = t.reshape(shape)
    return out


# --------------------------------------------------------------------------
# The Hugging Face reference (LlamaForCausalLM / Qwen2 / Qwen3)


def hf_head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def hf_inv_freq(cfg):
    """transformers.modeling_rope_utils: _compute_default_rope_parameters and
    the linear / llama3 variants. Returns (inv_freq f32 [D/2], attention_scaling)."""
    base = cfg.get("rope_theta", 10000.0)
    dim = int(hf_head_dim(cfg) * cfg.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv_freq, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / rs["factor"], 1.0
    if kind == "llama3":
        factor = rs["factor"]
        low_freq_factor = rs["low_freq_factor"]
        high_freq_factor = rs["high_freq_factor"]
        old_context_len = rs["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
        return inv_freq_llama, 1.0
    raise ValueError("rope_type %r not in the reference" % kind)


def hf_rmsnorm(x, w, eps):
    # LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm: the statistics in f32, the
    # weight multiplied after casting back to the input dtype.
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, h, n_rep, t, d)
    return x.reshape(b, h * n_rep, t, d)


def hf_forward(cfg, W, ids, lora=None, lora_scale=1.0, noise=None):
    """ids: int64 [B, T], all positions valid. Returns f32 logits [B, T, V].
    lora: optional dict HF module prefix -> (A [r, in], B [out, r]), added as
    peft's lora.Linear does (dropout 0): y = x W^T + b + s (x A^T) B^T.
    noise: optional [B, T, hidden] added to the embeddings (NEFTune's hook)."""
    B, T = ids.shape
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = hf_head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    qk_norm = cfg["model_type"] == "qwen3"

    h = F.embedding(ids, W["model.embed_tokens.weight"])
    if noise is not None:
        h = h + noise
    pos = torch.arange(T)[None, :].expand(B, T)
    inv_freq, attn_scaling = hf_inv_freq(cfg)
    # LlamaRotaryEmbedding.forward (autocast off, f32)
    freqs = (inv_freq[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attn_scaling).to(h.dtype)[:, None]  # [B, 1, T, D]
    sin = (emb.sin() * attn_scaling).to(h.dtype)[:, None]
    mask = torch.full((T, T), float("-inf")).triu(1)

    def lin(x, name):
        y = F.linear(x, W[name + ".weight"], W.get(name + ".bias"))
        if lora is not None and name in lora:
            A, Bm = lora[name]
            y = y + lora_scale * F.linear(F.linear(x, A), Bm)
        return y

    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = hf_rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(B, T, H, D)
        k = lin(x, p + "self_attn.k_proj").view(B, T, Hkv, D)
        v = lin(x, p + "self_attn.v_proj").view(B, T, Hkv, D)
        if qk_norm:
            q = hf_rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = hf_rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, H // Hkv)
        v = repeat_kv(v, H // Hkv)
        att = torch.matmul(q, k.transpose(2, 3)) * (D ** -0.5) + mask
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, H * D)
        h = h + lin(o, p + "self_attn.o_proj")
        x = hf_rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj")
        h = h + lin(m, p + "mlp.down_proj")
    h = hf_rmsnorm(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return F.linear(h, head).float()


# --------------------------------------------------------------------------
# The configurations

def _base(model_type, arch, **kw):
    c = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "transformers_version": "4.46.0",
    }
    c.update(kw)
    return c


CONFIGS = {
    # Llama 2 style with grouped-query attention (6 query heads on 2 KV heads)
    # and odd sizes: hidden 60, head_dim 10, intermediate 97, vocab 253.
    "llama_gqa": dict(
        cfg=_base("llama", "LlamaForCausalLM", hidden_size=60, intermediate_size=97, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, vocab_size=253, rms_norm_eps=1e-5,
                  attention_bias=False, mlp_bias=False, pretraining_tp=1),
        lengths=(13, 7), seed=1, dtype=torch.float32),
    # Qwen2: q/k/v biases (o_proj has none), tied embeddings, one KV head.
    "qwen2_bias_tied": dict(
        cfg=_base("qwen2", "Qwen2ForCausalLM", hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                  num_attention_heads=5, num_key_value_heads=1, vocab_size=131, rope_theta=1000000.0,
                  tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                  max_window_layers=2, attention_dropout=0.0, bos_token_id=None, eos_token_id=130),
        lengths=(9, 12), seed=2, dtype=torch.float32),
    # Qwen3: q/k RMSNorm over head_dim before RoPE; head_dim 16 != 36/4.
    "qwen3_qknorm": dict(
        cfg=_base("qwen3", "Qwen3ForCausalLM", hidden_size=36, intermediate_size=68, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=113,
                  rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=False,
                  use_sliding_window=False, sliding_window=None, max_window_layers=2,
                  attention_dropout=0.0, bos_token_id=None, eos_token_id=112),
        lengths=(11, 5), seed=3, dtype=torch.float32),
    # Llama 3 rope scaling. original_max_position_embeddings is small so that
    # with head_dim 16 the three frequency bands (kept, smoothed, divided by
    # factor) all occur, and the positions (up to 39) make the difference show.
    "llama3_rope": dict(
        cfg=_base("llama", "LlamaForCausalLM", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=160, rope_theta=500000.0,
                  rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                  rope_scaling={"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64, "rope_type": "llama3"},
                  bos_token_id=128, eos_token_id=129),
        lengths=(40, 23), seed=4, dtype=torch.float32),
    # Weights stored as bf16 (as most published checkpoints are). The expected
    # logits are computed in f32 from the bf16 values (what our loader gives
    # when asked to convert to f32); the bf16 compute path is checked with a
    # looser bound.
    "llama_bf16": dict(
        cfg=_base("llama", "LlamaForCausalLM", hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=97, rms_norm_eps=1e-5,
                  attention_bias=False, mlp_bias=False, pretraining_tp=1, torch_dtype="bfloat16"),
        lengths=(10, 16), seed=5, dtype=torch.bfloat16),
}


def make_weights(cfg, gen):
    """Random weights with HF names. Scales keep activations O(1) so that the
    logits spread out (a std-0.02 init gives nearly uniform logits, which would
    hide errors); norm weights are 1 + noise so that a dropped norm weight is
    seen."""
    Hd = cfg["hidden_size"]
    I = cfg["intermediate_size"]
    V = cfg["vocab_size"]
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = hf_head_dim(cfg)
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    o_bias = cfg["model_type"] != "qwen2" and cfg.get("attention_bias", False)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    def mat(out_f, in_f):
        return randn(out_f, in_f, std=1.0 / math.sqrt(in_f))

    def normw(n):
        return 1.0 + randn(n, std=0.2)

    # A tied table is also the output head: keep its logits in the same range.
    W = {"model.embed_tokens.weight": randn(V, Hd, std=0.4 if cfg.get("tie_word_embeddings") else 1.0)}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        W[p + "input_layernorm.weight"] = normw(Hd)
        W[p + "self_attn.q_proj.weight"] = mat(H * D, Hd)
        W[p + "self_attn.k_proj.weight"] = mat(Hkv * D, Hd)
        W[p + "self_attn.v_proj.weight"] = mat(Hkv * D, Hd)
        W[p + "self_attn.o_proj.weight"] = mat(Hd, H * D)
        if qkv_bias:
            W[p + "self_attn.q_proj.bias"] = randn(H * D, std=0.3)
            W[p + "self_attn.k_proj.bias"] = randn(Hkv * D, std=0.3)
            W[p + "self_attn.v_proj.bias"] = randn(Hkv * D, std=0.3)
        if o_bias:
            W[p + "self_attn.o_proj.bias"] = randn(Hd, std=0.3)
        if cfg["model_type"] == "qwen3":
            W[p + "self_attn.q_norm.weight"] = normw(D)
            W[p + "self_attn.k_norm.weight"] = normw(D)
        W[p + "post_attention_layernorm.weight"] = normw(Hd)
        W[p + "mlp.gate_proj.weight"] = mat(I, Hd)
        W[p + "mlp.up_proj.weight"] = mat(I, Hd)
        W[p + "mlp.down_proj.weight"] = mat(Hd, I)
    W["model.norm.weight"] = normw(Hd)
    if not cfg.get("tie_word_embeddings"):
        W["lm_head.weight"] = mat(V, Hd)
    return W


def batch_forward(forward, lengths, ids_all, V):
    """Runs every sequence alone and packs the results right-padded."""
    B, T = len(lengths), max(lengths)
    logits = torch.zeros(B, T, V, dtype=torch.float32)
    ids = torch.zeros(B, T, dtype=torch.int32)
    for b, n in enumerate(lengths):
        seq = ids_all[b][:n]
        ids[b, :n] = seq.to(torch.int32)
        logits[b, :n] = forward(seq[None, :].long())[0]
    return ids, logits


def pad_rows(rows):
    """(ids, labels) rows right-padded into [B, T] tensors (ids 0, labels -100), and each row's length."""
    T = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.int64)
    labels = torch.full((len(rows), T), -100, dtype=torch.int64)
    lengths = []
    for b, (i, lab) in enumerate(rows):
        ids[b, :len(i)] = i
        labels[b, :len(lab)] = lab
        lengths.append(len(i))
    return ids, labels, lengths


def make_config(root, name, spec):
    cfg = spec["cfg"]
    gen = torch.Generator().manual_seed(spec["seed"])
    W = make_weights(cfg, gen)
    W = {k: v.to(spec["dtype"]) for k, v in W.items()}
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(folder, "model.safetensors"), W)
    # What a reader gets back must equal what we compute with.
    back = read_safetensors(os.path.join(folder, "model.safetensors"))
    assert set(back) == set(W)
    for k in W:
        assert torch.equal(back[k], W[k]), k
    W32 = {k: v.float() for k, v in W.items()}

    V = cfg["vocab_size"]
    lengths = spec["lengths"]
    ids_all = [torch.randint(0, V, (n,), generator=gen) for n in lengths]
    ids, logits = batch_forward(lambda x: hf_forward(cfg, W32, x), lengths, ids_all, V)
    inv_freq, _ = hf_inv_freq(cfg)
    write_safetensors(os.path.join(root, name + ".golden.safetensors"), {
        "input_ids": ids,
        "lengths": torch.tensor(lengths, dtype=torch.int32),
        "logits": logits,
        "inv_freq": inv_freq.float(),
    }, {"format": "pt", "source": "tools/make_goldens.py", "config": name})
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    print("%-16s %7d bytes of weights, lengths %s, |logits| max %.2f" % (name, size, lengths,
                                                                           logits.abs().max().item()))


# --------------------------------------------------------------------------
# Training goldens: loss, LoRA and full fine-tuning gradients, AdamW steps

TRAIN_CONFIGS = ["llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "llama3_rope", "llama_bf16"]
FULL_GRADS = ["llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "llama3_rope"]
LORA_R, LORA_ALPHA = 4, 8
LORA_MODULES = [("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
                ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")]


def peft_name(l, parent, mod, which):
    return "base_model.model.model.layers.%d.%s.%s.%s.weight" % (l, parent, mod, which)


def make_lora(cfg, W, gen):
    """Random PEFT LoRA tensors for every linear module of every layer. A as
    PEFT's Kaiming-uniform would give, B non-zero (a fresh adapter has B = 0,
    which would hide every error in the adapter's forward and dA)."""
    tensors = {}
    for l in range(cfg["num_hidden_layers"]):
        for parent, mod in LORA_MODULES:
            w = W["model.layers.%d.%s.%s.weight" % (l, parent, mod)]
            out_f, in_f = w.shape
            bound = 1.0 / math.sqrt(in_f)
            A = (torch.rand(LORA_R, in_f, generator=gen) * 2 - 1) * bound
            Bm = torch.randn(out_f, LORA_R, generator=gen) * 0.3
            tensors[peft_name(l, parent, mod, "lora_A")] = A
            tensors[peft_name(l, parent, mod, "lora_B")] = Bm
    return tensors


def lora_dict(cfg, T):
    """PEFT tensors -> {HF module prefix: (A, B)} for hf_forward."""
    out = {}
    for l in range(cfg["num_hidden_layers"]):
        for parent, mod in LORA_MODULES:
            out["model.layers.%d.%s.%s" % (l, parent, mod)] = (T[peft_name(l, parent, mod, "lora_A")],
                                                                T[peft_name(l, parent, mod, "lora_B")])
    return out


def train_batch(cfg, lengths, gen):
    """Two rows right-padded with id 0; labels = ids with -100 on a prompt
    span, an inner span and the padding (HF convention, unshifted)."""
    B, T = len(lengths), max(lengths)
    V = cfg["vocab_size"]
    ids = torch.zeros(B, T, dtype=torch.int64)
    labels = torch.full((B, T), -100, dtype=torch.int64)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(0, V, (n,), generator=gen)
        labels[b, :n] = ids[b, :n]
        labels[b, :max(1, n // 4)] = -100          # prompt
        mid = n // 2
        labels[b, mid:mid + 2] = -100              # an inner ignored span
    return ids, labels


def causal_lm_loss(cfg, W, ids, labels, lengths, lora=None, noise=None):
    """Sum over rows of HF's shifted cross-entropy, each row run alone (no
    padding in the reference; noise [B, T, hidden] is cut to the row too).
    Returns (loss_sum, n_targets, row_loss)."""
    total = 0.0
    n = 0
    rows = []
    s = LORA_ALPHA / LORA_R
    for b, L in enumerate(lengths):
        nz = None if noise is None else noise[b:b + 1, :L]
        logits = hf_forward(cfg, W, ids[b:b + 1, :L], lora, s, nz)[0]
        tgt = labels[b, 1:L]
        ls = F.cross_entropy(logits[:-1], tgt, ignore_index=-100, reduction="sum")
        rows.append(ls)
        total = total + ls
        n += int((tgt != -100).sum())
    return total, n, rows


def write_adapter(folder, cfg, T):
    os.makedirs(folder, exist_ok=True)
    acfg = {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": None, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "layers_pattern": None, "layers_to_transform": None, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0,
        "modules_to_save": None, "peft_type": "LORA", "r": LORA_R, "rank_pattern": {}, "revision": None,
        "target_modules": sorted(m for _, m in LORA_MODULES), "task_type": "CAUSAL_LM", "use_dora": False,
        "use_rslora": False,
    }
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(folder, "adapter_model.safetensors"), T)


def make_train(root, name, spec):
    cfg = spec["cfg"]
    folder = os.path.join(root, name)
    W = read_safetensors(os.path.join(folder, "model.safetensors"))
    W32 = {k: v.float() for k, v in W.items()}
    gen = torch.Generator().manual_seed(1000 + spec["seed"])
    lora_T = make_lora(cfg, W32, gen)
    write_adapter(os.path.join(root, name + "_lora"), cfg, lora_T)
    lengths = spec["lengths"]
    ids, labels = train_batch(cfg, lengths, gen)
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "lengths": torch.tensor(lengths, dtype=torch.int32)}

    # LoRA: gradients of the mean loss with respect to every A and B
    P = {k: v.clone().requires_grad_(True) for k, v in lora_T.items()}
    total, n, rows = causal_lm_loss(cfg, W32, ids, labels, lengths, lora_dict(cfg, P))
    loss = total / n
    loss.backward()
    out["loss"] = loss.detach().reshape(1).float()
    out["n_targets"] = torch.tensor([n], dtype=torch.int32)
    out["row_loss"] = torch.stack([r.detach() for r in rows]).float()
    for k, v in P.items():
        out["lora." + k] = v.grad.detach().clone()

    # two AdamW steps on the LoRA parameters, same batch
    P = {k: v.clone().requires_grad_(True) for k, v in lora_T.items()}
    names = sorted(P)
    opt = torch.optim.AdamW([P[k] for k in names], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(2):
        opt.zero_grad()
        total, n, _ = causal_lm_loss(cfg, W32, ids, labels, lengths, lora_dict(cfg, P))
        (total / n).backward()
        opt.step()
    for k in names:
        out["adamw." + k] = P[k].detach().clone()

    # full fine-tuning: every weight's gradient, no adapter
    if name in FULL_GRADS:
        Wg = {k: v.clone().requires_grad_(True) for k, v in W32.items()}
        total, n, _ = causal_lm_loss(cfg, Wg, ids, labels, lengths)
        (total / n).backward()
        for k, v in Wg.items():
            out["full." + k] = v.grad.detach().clone()
    write_safetensors(os.path.join(root, name + ".train.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_goldens.py", "config": name})
    print("%-16s train: loss %.4f over %d targets, %d LoRA tensors%s" % (
        name, out["loss"].item(), n, len(lora_T), ", full grads" if name in FULL_GRADS else ""))


# --------------------------------------------------------------------------
# NEFTune: the counter-based noise of base/rng.c and ops.h at_add_uniform_noise

NEFTUNE_CONFIGS = ["llama_gqa", "qwen2_bias_tied"]
NEFTUNE_ALPHA = 5.0
NEFTUNE_SEED = 20231005
NEFTUNE_STREAM = 0x6e656674756e65        # model/decoder.h AT_NEFTUNE_STREAM ("neftune")
ROW_PITCH = 1 << 24                      # model/layers.h AT_DROPOUT_ROW_PITCH
_M64 = (1 << 64) - 1


def splitmix64_mix(seed, index):
    """base/rng.c at_rng_mix on numpy uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = np.uint64(seed) ^ (np.asarray(index, dtype=np.uint64) * np.uint64(0xd1342543de82ef95))
        z = x + np.uint64(0x9e3779b97f4a7c15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        return z ^ (z >> np.uint64(31))


def neftune_noise(B, T, H, alpha, seed, first_row=0):
    """The noise at_decoder_forward_train adds to embed[ids] of a [B, T] batch
    (f32 [B, T, H]): m = f32(alpha / sqrt(T*H)), n = f32(m * f32(2u - 1))."""
    nseed = int(splitmix64_mix(seed, NEFTUNE_STREAM))
    b = np.arange(B, dtype=np.uint64)[:, None, None] + np.uint64(first_row)
    t = np.arange(T, dtype=np.uint64)[None, :, None]
    c = np.arange(H, dtype=np.uint64)[None, None, :]
    counter = (b * np.uint64(ROW_PITCH) + t) * np.uint64(H) + c
    u = (splitmix64_mix(nseed, counter) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    m = np.float32(alpha / math.sqrt(T * H))
    return torch.from_numpy((m * (np.float32(2) * u - np.float32(1))).astype(np.float32))


def make_neftune(root, name):
    cfg = CONFIGS[name]["cfg"]
    W32 = {k: v.float() for k, v in read_safetensors(os.path.join(root, name, "model.safetensors")).items()}
    lora_T = {k: v.float() for k, v in
              read_safetensors(os.path.join(root, name + "_lora", "adapter_model.safetensors")).items()}
    G = read_safetensors(os.path.join(root, name + ".train.golden.safetensors"))
    ids, labels = G["input_ids"].long(), G["labels"].long()
    lengths = [int(x) for x in G["lengths"]]
    B, T = ids.shape
    noise = neftune_noise(B, T, cfg["hidden_size"], NEFTUNE_ALPHA, NEFTUNE_SEED)
    out = {"alpha": torch.tensor([NEFTUNE_ALPHA], dtype=torch.float32),
           "seed": torch.tensor([NEFTUNE_SEED], dtype=torch.int32), "noise": noise}
    P = {k: v.clone().requires_grad_(True) for k, v in lora_T.items()}
    total, n, rows = causal_lm_loss(cfg, W32, ids, labels, lengths, lora_dict(cfg, P), noise)
    (total / n).backward()
    out["loss"] = (total / n).detach().reshape(1).float()
    out["n_targets"] = torch.tensor([n], dtype=torch.int32)
    out["row_loss"] = torch.stack([r.detach() for r in rows]).float()
    for k, v in P.items():
        out["lora." + k] = v.grad.detach().clone()
    Wg = {k: v.clone().requires_grad_(True) for k, v in W32.items()}
    total, n, _ = causal_lm_loss(cfg, Wg, ids, labels, lengths, None, noise)
    (total / n).backward()
    out["full_loss"] = (total / n).detach().reshape(1).float()
    for k, v in Wg.items():
        out["full." + k] = v.grad.detach().clone()
    write_safetensors(os.path.join(root, name + ".neftune.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_goldens.py", "config": name})
    print("%-16s neftune: alpha %g, |noise| max %.4f, loss %.6f (without noise %.6f)" % (
        name, NEFTUNE_ALPHA, noise.abs().max().item(), out["loss"].item(), float(G["loss"][0])))


# --------------------------------------------------------------------------
# llama2.c (stories260K): an independent reference in the manner of
# karpathy/llama2.c model.py, on the checkpoint's own weight layout.

def read_llama2c(path):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, L, H, Hkv, V, seq_len = struct.unpack("<7i", data[:28])
    shared = V > 0
    V = abs(V)
    a = np.frombuffer(data, dtype="<f4", offset=28)
    head = dim // H
    kv_dim = dim * Hkv // H
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        t = torch.from_numpy(a[off:off + n].copy()).reshape(shape)
        off += n
        return t

    W = {"tok": take(V, dim), "att_norm": take(L, dim), "wq": take(L, dim, dim), "wk": take(L, kv_dim, dim),
         "wv": take(L, kv_dim, dim), "wo": take(L, dim, dim), "ffn_norm": take(L, dim),
         "w1": take(L, hidden, dim), "w2": take(L, dim, hidden), "w3": take(L, hidden, dim),
         "final_norm": take(dim)}
    take(seq_len, head // 2)  # freq_cis_real
    take(seq_len, head // 2)  # freq_cis_imag
    W["cls"] = W["tok"] if shared else take(V, dim)
    cfg = dict(dim=dim, hidden=hidden, L=L, H=H, Hkv=Hkv, V=V, seq_len=seq_len)
    return cfg, W


def llama2c_forward(cfg, W, ids):
    """ids int64 [1, T] -> f32 logits [1, T, V] (llama2.c model.py Transformer)."""
    B, T = ids.shape
    dim, H, Hkv = cfg["dim"], cfg["H"], cfg["Hkv"]
    D = dim // H
    eps = 1e-5

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    freqs = 1.0 / (10000.0 ** (torch.arange(0, D, 2)[: D // 2].float() / D))
    ang = torch.outer(torch.arange(T).float(), freqs)  # [T, D/2]
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rope(x):  # x [B, T, h, D]; pairs (x[2i], x[2i+1]) rotated as complex numbers
        xr, xi = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1).flatten(3)

    h = W["tok"][ids]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["L"]):
        x = norm(h, W["att_norm"][l])
        q = (x @ W["wq"][l].T).view(B, T, H, D)
        k = (x @ W["wk"][l].T).view(B, T, Hkv, D)
        v = (x @ W["wv"][l].T).view(B, T, Hkv, D)
        q, k = rope(q), rope(k)
        k = torch.repeat_interleave(k, H // Hkv, dim=2)
        v = torch.repeat_interleave(v, H // Hkv, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        s = q @ k.transpose(2, 3) / math.sqrt(D) + mask
        o = (F.softmax(s.float(), dim=-1) @ v).transpose(1, 2).reshape(B, T, dim)
        h = h + o @ W["wo"][l].T
        x = norm(h, W["ffn_norm"][l])
        h = h + (F.silu(x @ W["w1"][l].T) * (x @ W["w3"][l].T)) @ W["w2"][l].T
    h = norm(h, W["final_norm"])
    return h @ W["cls"].T


def llama2c_to_hf(cfg, W):
    def permute(w, n_heads):
        d1, d2 = w.shape
        return w.view(n_heads, d1 // n_heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)

    out = {"model.embed_tokens.weight": W["tok"], "model.norm.weight": W["final_norm"]}
    for l in range(cfg["L"]):
        p = "model.layers.%d." % l
        out[p + "input_layernorm.weight"] = W["att_norm"][l]
        out[p + "self_attn.q_proj.weight"] = permute(W["wq"][l], cfg["H"])
        out[p + "self_attn.k_proj.weight"] = permute(W["wk"][l], cfg["Hkv"])
        out[p + "self_attn.v_proj.weight"] = W["wv"][l]
        out[p + "self_attn.o_proj.weight"] = W["wo"][l]
        out[p + "post_attention_layernorm.weight"] = W["ffn_norm"][l]
        out[p + "mlp.gate_proj.weight"] = W["w1"][l]
        out[p + "mlp.down_proj.weight"] = W["w2"][l]
        out[p + "mlp.up_proj.weight"] = W["w3"][l]
    return out


def make_stories(root, path):
    if not os.path.exists(path):
        print("skipping stories260K: %s not found" % path, file=sys.stderr)
        return
    cfg, W = read_llama2c(path)
    # Prompts as token ids of tok512 (1 = BOS); fixed random ids cover the
    # whole vocabulary, one longer prompt reaches position 39.
    gen = torch.Generator().manual_seed(260)
    lengths = (8, 21, 40)
    ids_all = []
    for n in lengths:
        t = torch.randint(3, cfg["V"], (n,), generator=gen)
        t[0] = 1
        ids_all.append(t)
    ids, logits = batch_forward(lambda x: llama2c_forward(cfg, W, x), lengths, ids_all, cfg["V"])
    # Cross-check the two references: the same checkpoint in HF layout (q/k
    # rows permuted as transformers' convert_llama_weights_to_hf.py does) must
    # give the same logits through hf_forward.
    hf_cfg = _base("llama", "LlamaForCausalLM", hidden_size=cfg["dim"], intermediate_size=cfg["hidden"],
                   num_hidden_layers=cfg["L"], num_attention_heads=cfg["H"], num_key_value_heads=cfg["Hkv"],
                   vocab_size=cfg["V"], rms_norm_eps=1e-5, tie_word_embeddings=True)
    hf_W = llama2c_to_hf(cfg, W)
    for b, n in enumerate(lengths):
        ref = hf_forward(hf_cfg, hf_W, ids_all[b][None, :].long())[0]
        err = (ref - logits[b, :n]).abs().max().item() / logits[b, :n].abs().max().item()
        assert err < 1e-5, "llama2.c and HF references disagree: %g" % err
    write_safetensors(os.path.join(root, "stories260K.golden.safetensors"), {
        "input_ids": ids,
        "lengths": torch.tensor(lengths, dtype=torch.int32),
        "logits": logits,
    }, {"format": "pt", "source": "tools/make_goldens.py", "config": "stories260K"})
    print("%-16s lengths %s, |logits| max %.2f" % ("stories260K", lengths, logits.abs().max().item()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/goldens")
    ap.add_argument("--stories", default="tests/data/models/stories260K.bin")
    ap.add_argument("--only-neftune", action="store_true",
                    help="write only the NEFTune goldens (from the training goldens already there)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    if args.only_neftune:
        for name in NEFTUNE_CONFIGS:
            make_neftune(args.out, name)
        return
    for name, spec in CONFIGS.items():
        make_config(args.out, name, spec)
    for name in TRAIN_CONFIGS:
        make_train(args.out, name, CONFIGS[name])
    for name in NEFTUNE_CONFIGS:
        make_neftune(args.out, name)
    make_stories(args.out, args.stories)


if __name__ == "__main__":
    main()
