#!/usr/bin/python3
"""Writes tests/data/ops/rope_sections.json: rotary embeddings with several position
components, computed with torch as transformers (4.46) computes them for
Qwen2-VL, written from its definitions:

- the language model's multimodal RoPE: Qwen2VLRotaryEmbedding (inv_freq of
  head_dim, position_ids [3, batch, T] for t, h, w) and
  apply_multimodal_rotary_pos_emb (mrope_section doubled, section j of
  cos/sin taken from component j % 3);
- the vision tower's 2-D RoPE: VisionRotaryEmbedding(head_dim // 2) indexed by
  each patch's (row, column) and flattened, then apply_rotary_pos_emb_vision
  (cos/sin repeated twice along the last dimension).

The C side expresses both as at_rope with at_rope_sections: the language
model with n = 3 and len = mrope_section over the model's inv_freq; the
vision tower with n = 2 and len = [D/4, D/4] over its inv_freq written twice.

Run from the repository root:  /usr/bin/python3 tools/make_rope_sections_goldens.py
"""
import json
import os

import torch


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def mrope_case(gen, T, H, D, theta, mrope_section):
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    pos = torch.randint(0, 40, (3, 1, T), generator=gen)
    x = torch.randn(1, H, T, D, generator=gen)  # [batch, heads, T, D] as the attention holds q
    inv_exp = inv_freq[None, None, :, None].float().expand(3, 1, -1, 1)
    freqs = (inv_exp @ pos[:, :, None, :].float()).transpose(2, 3)  # [3, batch, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    sec = mrope_section * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1).unsqueeze(1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1).unsqueeze(1)
    y = x * cos + rotate_half(x) * sin
    return dict(name=f"mrope T{T} H{H} D{D}", sections=mrope_section, inv_freq=inv_freq.tolist(),
                pos=pos[:, 0, :].T.reshape(-1).tolist(),  # [T, 3]
                x=x[0].transpose(0, 1).reshape(-1).tolist(),  # [T, H, D]
                y=y[0].transpose(0, 1).reshape(-1).tolist())


def vision_case(gen, grid_h, grid_w, H, D, theta, merge=2):
    dim = D // 2
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))  # [D/4]
    # Qwen2VisionTransformer.rot_pos_emb: positions in the 2x2-merge order
    hpos = torch.arange(grid_h).unsqueeze(1).expand(-1, grid_w)
    hpos = hpos.reshape(grid_h // merge, merge, grid_w // merge, merge).permute(0, 2, 1, 3).flatten()
    wpos = torch.arange(grid_w).unsqueeze(0).expand(grid_h, -1)
    wpos = wpos.reshape(grid_h // merge, merge, grid_w // merge, merge).permute(0, 2, 1, 3).flatten()
    pos_ids = torch.stack([hpos, wpos], dim=-1)  # [N, 2]
    seq = torch.arange(max(grid_h, grid_w), dtype=inv.dtype)
    freqs_full = torch.outer(seq, inv)
    freqs = freqs_full[pos_ids].flatten(1)  # [N, D/2]
    N = pos_ids.shape[0]
    x = torch.randn(N, H, D, generator=gen)
    cos = freqs.cos().unsqueeze(1).repeat(1, 1, 2)
    sin = freqs.sin().unsqueeze(1).repeat(1, 1, 2)
    y = x * cos + rotate_half(x) * sin
    return dict(name=f"vision {grid_h}x{grid_w} H{H} D{D}", sections=[D // 4, D // 4],
                inv_freq=torch.cat([inv, inv]).tolist(), pos=pos_ids.reshape(-1).tolist(),
                x=x.reshape(-1).tolist(), y=y.reshape(-1).tolist())


def main():
    gen = torch.Generator().manual_seed(7)
    cases = [mrope_case(gen, 5, 2, 16, 1e6, [2, 3, 3]),        # Qwen2-VL's [16, 24, 24] scaled to D 16
             mrope_case(gen, 3, 1, 128, 1e6, [16, 24, 24]),    # Qwen2-VL's own
             vision_case(gen, 4, 6, 2, 16, 10000.0),
             vision_case(gen, 2, 2, 1, 80, 10000.0)]           # Qwen2-VL's vision head_dim 80
    out = os.path.join("tests", "data", "ops", "rope_sections.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(source="tools/make_rope_sections_goldens.py", cases=cases), f)
    print("wrote", out, len(cases), "cases")


if __name__ == "__main__":
    main()
