#!/usr/bin/python3
"""Writes the goldens of a Qwen2-VL and a Qwen3-VL language model
(tests/test_vlm_decoder.c): multimodal RoPE and image features placed at the
<|image_pad|> tokens (Qwen3-VL: interleaved M-RoPE, q/k norms, and deepstack
features added at those tokens after its first decoder layers).

Run from the repository root with Debian's Python and torch (no transformers):

    /usr/bin/python3 tools/make_vlm_goldens.py

What it writes:

    tests/data/goldens/qwen2_vl_lm/config.json        a Qwen2-VL config.json (model_type qwen2_vl,
                                                      rope_scaling {type: mrope, mrope_section}, a
                                                      vision_config), tiny and random
    tests/data/goldens/qwen2_vl_lm/model.safetensors  the language model's weights under the
                                                      newer transformers names (model.language_model.*,
                                                      lm_head), and the vision tower's (visual.*,
                                                      random: the loader checks they are there)
    tests/data/goldens/qwen2_vl_lm_lora/              a PEFT LoRA adapter (r 4, alpha 8, all seven
                                                      modules, B non-zero)
    tests/data/goldens/qwen2_vl_lm.train.golden.safetensors
        input_ids  i32 [B, T]   two rows right-padded with 0: row 0 holds two images, row 1 one
        lengths    i32 [B]
        grid_thw   i32 [n_images, 3]   the images' patch grids (t, h, w), in order
        position_ids i32 [B, T, 3]     get_rope_index's (t, h, w) positions (padding: 0)
        features   f32 [n_image_tokens, hidden]   what the merger would give, random
        labels     i32 [B, T]   -100 on the prompt, the image tokens and the padding
        logits     f32 [B, T, V]   with the adapter (0 past each row's length)
        loss       f32 [1]      mean cross-entropy over the supervised targets
        n_targets  i32 [1]
        lora.<PEFT name>        f32 gradient of `loss` for every lora_A / lora_B
        d_features f32 [n_image_tokens, hidden]   gradient of `loss` for the features
        full.<HF name>          f32 gradient of `loss` for every weight without the adapter
                                (full fine-tuning; the embedding gets nothing from the image rows,
                                since masked_scatter replaced their lookup)
        full_d_features f32     d_features of that pass

The reference is transformers' Qwen2VLModel language side written by hand:
inputs_embeds = embed_tokens(ids).masked_scatter(image_mask, features), the
decoder layers of Qwen2 (q/k/v biases), and apply_multimodal_rotary_pos_emb:
cos/sin of each of the three position components, the head_dim split into
mrope_section * 2 chunks, chunk i taking component i % 3. Each row runs alone
(no padding in the reference).

tests/data/goldens/qwen3_vl_lm*: the same for Qwen3-VL (transformers'
Qwen3VLTextModel written by hand): config.json with text_config (rope_scaling
mrope_section [2, 3, 3], mrope_interleaved) and a Qwen3-VL vision_config,
weights of a Qwen3 decoder (q_norm / k_norm, no biases) under
model.language_model.*, Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope
(frequency i takes t, h, w in turn: h at i = 1, 4, ... < 3·sec[1], w at
i = 2, 5, ... < 3·sec[2], t elsewhere), and _deepstack_process: after decoder
layer l < 2, hidden[image tokens] += deepstack[l]. Extra goldens:
        deepstack   f32 [2 · n_image_tokens, hidden]   layer 0's rows, then layer 1's (random)
        d_deepstack, full_d_deepstack   their gradients (LoRA / full runs)
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (LORA_ALPHA, LORA_R, hf_inv_freq, hf_rmsnorm, lora_dict, make_lora, make_weights,  # noqa: E402
                          read_safetensors, repeat_kv, rotate_half, write_adapter, write_safetensors)
import make_mrope_goldens  # noqa: E402


VSTART, VEND, IMAGE, VIDEO = 150, 151, 152, 153
# get_rope_index reads the token ids from its module: this vocabulary's
make_mrope_goldens.VSTART, make_mrope_goldens.IMAGE = VSTART, IMAGE
get_rope_index = make_mrope_goldens.get_rope_index
ROOT = "tests/data/goldens"
NAME = "qwen2_vl_lm"

# hidden 48, 4 heads of 16 (8 frequency pairs: 2 temporal, 3 height, 3 width), 2 KV heads
CFG = {
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_act": "silu",
    "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 3,
    "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 160, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "float32",
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2, "attention_dropout": 0.0,
    "bos_token_id": None, "eos_token_id": 159, "image_token_id": IMAGE, "video_token_id": VIDEO,
    "vision_start_token_id": VSTART, "vision_end_token_id": VEND,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {"depth": 1, "embed_dim": 16, "mlp_ratio": 2, "num_heads": 2, "in_chans": 3,
                      "hidden_size": 48, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "transformers_version": "4.46.0",
}

# (text tokens | (t, h, w) grid) of each row; odd grids, two images in row 0
ROWS = [[4, (1, 4, 6), 3, (1, 2, 4), 6],
        [2, (1, 6, 2), 9]]


# Qwen3-VL: hidden 48, 3 heads of 16 (8 frequency pairs, interleaved), 1 KV head, 3 layers, deepstack after 0 and 1
CFG3 = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VSTART, "vision_end_token_id": VEND,
    "text_config": {
        "model_type": "qwen3_vl_text", "hidden_act": "silu", "hidden_size": 48, "intermediate_size": 80,
        "num_hidden_layers": 3, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 16,
        "vocab_size": 160, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "eos_token_id": 159,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
    "vision_config": {"depth": 2, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 16, "intermediate_size": 24,
                      "num_heads": 2, "in_channels": 3, "out_hidden_size": 48, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16,
                      "deepstack_visual_indexes": [0, 1], "model_type": "qwen3_vl"},
    "torch_dtype": "float32", "transformers_version": "4.57.0",
}
N_DEEPSTACK = 2


def tower_tensors(vc, gen):
    """The Qwen2-VL tower's tensors (vision_config.h), random: the loader's
    gate checks they are there; the language-model goldens do not use them."""
    if "deepstack_visual_indexes" in vc:  # Qwen3-VL's tower
        shapes = make_mrope_goldens.qwen3_shapes(vc)
        return {n: torch.randn(*s, generator=gen) * 0.1 for n, s in sorted(shapes.items())}
    w, f, p, tp = vc["embed_dim"], vc["embed_dim"] * vc["mlp_ratio"], vc["patch_size"], vc["temporal_patch_size"]
    m2 = vc["spatial_merge_size"] ** 2
    shapes = {"visual.patch_embed.proj.weight": (w, vc["in_chans"], tp, p, p),
              "visual.merger.ln_q.weight": (w,), "visual.merger.ln_q.bias": (w,),
              "visual.merger.mlp.0.weight": (w * m2, w * m2), "visual.merger.mlp.0.bias": (w * m2,),
              "visual.merger.mlp.2.weight": (vc["hidden_size"], w * m2), "visual.merger.mlp.2.bias": (vc["hidden_size"],)}
    for i in range(vc["depth"]):
        b = "visual.blocks.%d." % i
        shapes.update({b + "norm1.weight": (w,), b + "norm1.bias": (w,), b + "norm2.weight": (w,),
                       b + "norm2.bias": (w,), b + "attn.qkv.weight": (3 * w, w), b + "attn.qkv.bias": (3 * w,),
                       b + "attn.proj.weight": (w, w), b + "attn.proj.bias": (w,), b + "mlp.fc1.weight": (f, w),
                       b + "mlp.fc1.bias": (f,), b + "mlp.fc2.weight": (w, f), b + "mlp.fc2.bias": (w,)})
    return {n: torch.randn(*s, generator=gen) * 0.1 for n, s in sorted(shapes.items())}


def mrope_cos_sin(cfg, pos):
    """Qwen2VLRotaryEmbedding + apply_multimodal_rotary_pos_emb's mixing.
    pos: [3, T]. Returns cos, sin [1, 1, T, D]."""
    inv_freq, _ = hf_inv_freq(dict(cfg, rope_scaling=None))  # "mrope": the default frequencies
    freqs = pos[:, :, None].float() * inv_freq[None, None, :].float()   # [3, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)                             # [3, T, D]
    cos, sin = emb.cos(), emb.sin()
    if cfg["rope_scaling"].get("mrope_interleaved"):
        # apply_interleaved_mrope on the [3, T, D/2] angles, then cat(freqs, freqs)
        sec = cfg["rope_scaling"]["mrope_section"]
        f = freqs[0].clone()
        for dim, offset in ((1, 1), (2, 2)):
            f[..., offset:sec[dim] * 3:3] = freqs[dim, ..., offset:sec[dim] * 3:3]
        emb = torch.cat((f, f), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]
    sec = cfg["rope_scaling"]["mrope_section"] * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1)
    return cos[None, None], sin[None, None]


def vl_forward(cfg, W, ids, pos, feats, lora=None, lora_scale=1.0, deep=None):
    """One row: ids [T], pos [3, T], feats [n, hidden] for its image tokens;
    deep [k, n, hidden] (Qwen3-VL) added at them after layers 0..k-1.
    Returns f32 logits [T, V]."""
    T = ids.shape[0]
    H, Hkv, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    h = F.embedding(ids, W["model.embed_tokens.weight"])[None]
    mask = (ids == IMAGE)[None, :, None].expand_as(h)
    h = h.masked_scatter(mask, feats)
    cos, sin = mrope_cos_sin(cfg, pos)
    causal = torch.full((T, T), float("-inf")).triu(1)

    def lin(x, name):
        y = F.linear(x, W[name + ".weight"], W.get(name + ".bias"))
        if lora is not None and name in lora:
            A, Bm = lora[name]
            y = y + lora_scale * F.linear(F.linear(x, A), Bm)
        return y

    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = hf_rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(1, T, H, D)
        k = lin(x, p + "self_attn.k_proj").view(1, T, Hkv, D)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3: RMSNorm over each head
            q = hf_rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = hf_rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(x, p + "self_attn.v_proj").view(1, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        att = F.softmax(torch.matmul(q, k.transpose(2, 3)) * (D ** -0.5) + causal, dim=-1, dtype=torch.float32)
        o = torch.matmul(att, v).transpose(1, 2).reshape(1, T, H * D)
        h = h + lin(o, p + "self_attn.o_proj")
        x = hf_rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps)
        h = h + lin(F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
        if deep is not None and l < deep.shape[0]:  # _deepstack_process
            h = h.clone()
            h[mask[..., 0]] = h[mask[..., 0]] + deep[l]
    h = hf_rmsnorm(h, W["model.norm.weight"], eps)
    return F.linear(h, W["lm_head.weight"])[0].float()


def batch(gen):
    rows, grids, labels = [], [], []
    for parts in ROWS:
        ids, lab = [], []
        for p in parts:
            if isinstance(p, int):
                toks = torch.randint(0, VSTART, (p,), generator=gen).tolist()
                ids += toks
                lab += toks
            else:
                grids.append(list(p))
                n = p[0] * p[1] * p[2] // 4
                ids += [VSTART] + [IMAGE] * n + [VEND]
                lab += [-100] * (n + 2)
        lab[:3] = [-100] * 3   # the prompt's first tokens
        rows.append(ids)
        labels.append(lab)
    return rows, grids, labels


def loss_of(cfg, W, rows, pos, feats, labels, lora=None, deep=None):
    """Sum of each row's shifted cross-entropy, and the logits of each row."""
    total, n, logits, off = 0.0, 0, [], 0
    for b, ids in enumerate(rows):
        k = sum(1 for t in ids if t == IMAGE)
        lg = vl_forward(cfg, W, torch.tensor(ids), pos[b], feats[off:off + k], lora, LORA_ALPHA / LORA_R,
                        None if deep is None else deep[:, off:off + k])
        off += k
        tgt = torch.tensor(labels[b][1:])
        total = total + F.cross_entropy(lg[:-1], tgt, ignore_index=-100, reduction="sum")
        n += int((tgt != -100).sum())
        logits.append(lg)
    return total, n, logits


def main(cfg=CFG, NAME=NAME, seed=1818):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(seed)
    q3 = cfg["model_type"] == "qwen3_vl"
    folder = os.path.join(ROOT, NAME)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    # make_weights' rules of a Qwen2 (q/k/v biases) or a Qwen3 (q/k norms), on the flat language config
    qcfg = dict(cfg["text_config"], model_type="qwen3") if q3 else dict(cfg, model_type="qwen2")
    W = make_weights(qcfg, gen)
    stored = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in W.items()}
    stored.update(tower_tensors(dict(cfg["vision_config"]), gen))
    write_safetensors(os.path.join(folder, "model.safetensors"), stored)
    lora_T = make_lora(qcfg, W, gen)
    write_adapter(os.path.join(ROOT, NAME + "_lora"), qcfg, lora_T)

    rows, grids, labels = batch(gen)
    pos, gi = [], 0
    for ids in rows:
        k = sum(1 for p in ids if p == VSTART)
        p, _ = get_rope_index(ids, grids[gi:gi + k])
        gi += k
        pos.append(torch.tensor(p, dtype=torch.int64))
    n_img = sum(1 for ids in rows for t in ids if t == IMAGE)
    feats = torch.randn(n_img, qcfg["hidden_size"], generator=gen)
    deep = torch.randn(N_DEEPSTACK, n_img, qcfg["hidden_size"], generator=gen) if q3 else None
    B, T, V = len(rows), max(len(r) for r in rows), qcfg["vocab_size"]

    out = {"grid_thw": torch.tensor(grids, dtype=torch.int32), "lengths": torch.tensor([len(r) for r in rows],
                                                                                      dtype=torch.int32)}
    ids_t = torch.zeros(B, T, dtype=torch.int32)
    lab_t = torch.full((B, T), -100, dtype=torch.int32)
    pos_t = torch.zeros(B, T, 3, dtype=torch.int32)
    for b, ids in enumerate(rows):
        ids_t[b, :len(ids)] = torch.tensor(ids)
        lab_t[b, :len(ids)] = torch.tensor(labels[b])
        pos_t[b, :len(ids)] = pos[b].t().to(torch.int32)
    out.update(input_ids=ids_t, labels=lab_t, position_ids=pos_t, features=feats.clone())
    if q3:
        out["deepstack"] = deep.reshape(-1, qcfg["hidden_size"]).clone()

    # LoRA: gradients of the mean loss for A, B and the features
    P = {k: v.clone().requires_grad_(True) for k, v in lora_T.items()}
    fr = feats.clone().requires_grad_(True)
    dr = deep.clone().requires_grad_(True) if q3 else None
    total, n, logits = loss_of(qcfg, W, rows, pos, fr, labels, lora_dict(qcfg, P), dr)
    loss = total / n
    loss.backward()
    lg = torch.zeros(B, T, V)
    for b, l in enumerate(logits):
        lg[b, :l.shape[0]] = l.detach()
    out.update(logits=lg, loss=loss.detach().reshape(1).float(), n_targets=torch.tensor([n], dtype=torch.int32),
               d_features=fr.grad.detach().clone())
    if q3:
        out["d_deepstack"] = dr.grad.detach().reshape(-1, qcfg["hidden_size"]).clone()
    for k, v in P.items():
        out["lora." + k] = v.grad.detach().clone()

    # full fine-tuning: every weight's gradient, no adapter
    Wg = {k: v.clone().requires_grad_(True) for k, v in W.items()}
    fr = feats.clone().requires_grad_(True)
    dr = deep.clone().requires_grad_(True) if q3 else None
    total, n, _ = loss_of(qcfg, Wg, rows, pos, fr, labels, None, dr)
    (total / n).backward()
    if q3:
        out["full_d_deepstack"] = dr.grad.detach().reshape(-1, qcfg["hidden_size"]).clone()
    for k, v in Wg.items():
        out["full." + k] = v.grad.detach().clone()
    out["full_d_features"] = fr.grad.detach().clone()
    write_safetensors(os.path.join(ROOT, NAME + ".train.golden.safetensors"), out)
    back = read_safetensors(os.path.join(ROOT, NAME + ".train.golden.safetensors"))
    assert torch.equal(back["d_features"], out["d_features"])
    print("wrote %s: %d images, %d image tokens, loss %.6f over %d targets" % (NAME, len(grids), n_img,
                                                                               float(loss), n))


if __name__ == "__main__":
    main()
    main(CFG3, "qwen3_vl_lm", 1919)
