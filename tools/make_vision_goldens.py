#!/usr/bin/python3
"""Writes tests/data/vision/{qwen2_vl,qwen2_5_vl,qwen3_vl}/: a tiny random vision tower
(config.json + model.safetensors) and goldens.safetensors with its features
and the gradients of every weight, for test_vision.c.

The towers are written here by hand, in float64, from the model definitions
of transformers' modeling_qwen2_vl.py (Qwen2VisionTransformerPretrainedModel)
and modeling_qwen2_5_vl.py (Qwen2_5_VisionTransformerPretrainedModel):

- PatchEmbed: a Conv3d with kernel = stride = (T, P, P) and no bias over
  each patch viewed as (C, T, P, P);
- rot_pos_emb: each patch's (row, column) in its image, the merge order
  (h/m, m, w/m, m) permuted (0, 2, 1, 3), VisionRotaryEmbedding(D/2) indexed
  by them and flattened, applied as apply_rotary_pos_emb_vision (cos, sin
  repeated twice, rotate_half);
- attention: qkv -> (N, 3, H, D), scale D^-0.5, a block-diagonal mask from
  cu_seqlens (one block per frame of each image; Qwen2.5-VL's window blocks:
  cu_window_seqlens);
- blocks: x + attn(norm1(x)), then + mlp(norm2(x)); Qwen2-VL LayerNorm(eps
  1e-6) and fc2(QuickGELU(fc1)); Qwen2.5-VL RMSNorm(eps 1e-6) and
  down(silu(gate) * up), all linears with bias;
- PatchMerger: ln_q, view (-1, m*m*W), Linear, GELU (erf), Linear;
- Qwen2.5-VL's get_window_index (windows of window_size / m / P merge units
  per side, padded with -100 and the padding dropped), hidden states and
  rotary reordered by window_index per merge unit, the merger's output put
  back with argsort(window_index).
- Qwen3-VL (modeling_qwen3_vl.py, Qwen3VLVisionModel): the Conv3d with a
  bias; fast_pos_embed_interpolate (linspace over the S x S learned grid in
  float32, floor / clipped ceil, four bilinear weights, rows permuted to the
  merge order, repeated per frame) added to it; Qwen2-VL's blocks with
  linear_fc1 / linear_fc2 and gelu(approximate="tanh"); the merger norm
  (LayerNorm over W) -> view (-1, m*m*W) -> linear_fc1 -> GELU -> linear_fc2,
  and after each block of deepstack_visual_indexes its deepstack merger
  (view first, LayerNorm over m*m*W: use_postshuffle_norm). Its "features"
  are the merger's rows and then each deepstack merger's, stacked (the C
  tower's layout).

Cases: two images per sample with odd grids (in merge units: 3x5 and a
two-frame 2x1 for Qwen2-VL; 5x3, 2x4 and 1x1 for Qwen2.5-VL, whose 2x2-unit
windows are cut at the images' edges; 3x5 two frames and 1x2 for Qwen3-VL,
on a 5x5 position grid, deepstack after blocks 0 and 1 of 3). The loss is sum(features * G) for a
fixed random G, so the gradients are those of a random upstream gradient.
Also two bad copies of Qwen2-VL's weights: bad_missing.safetensors (no
visual.blocks.1.attn.qkv.bias) and bad_shape.safetensors
(visual.blocks.1.mlp.fc2.bias stored as [2, 8]); and prefixed.safetensors,
the same weights named model.visual.* as transformers 4.52+ saves them.
The same again with LoRA (rank 2, alpha 4, B non-zero) on every linear of
the blocks: lora.safetensors. Qwen2-VL's weights are stored as bf16 (the loader converts them), Qwen2.5-VL's
as f32; the reference uses the stored values.

Run from the repository root:  /usr/bin/python3 tools/make_vision_goldens.py
"""
import json
import os
import struct

import torch

from make_mrope_goldens import qwen3_shapes

torch.set_default_dtype(torch.float64)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rot_pos_emb(grid, m, head_dim):
    pos_ids = []
    for t, h, w in grid:
        hpos = torch.arange(h).unsqueeze(1).expand(-1, w)
        hpos = hpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
        wpos = torch.arange(w).unsqueeze(0).expand(h, -1)
        wpos = wpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
        pos_ids.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))
    pos_ids = torch.cat(pos_ids)
    dim = head_dim // 2  # VisionRotaryEmbedding(head_dim // 2), inv_freq in float32 as torch makes it
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    seq = torch.arange(int(pos_ids.max()) + 1, dtype=torch.float64)
    freqs = torch.outer(seq, inv_freq.double())
    return freqs[pos_ids].flatten(1)  # [N, D/2]: rows' angles, then columns'


def apply_rope(x, freqs):  # x [N, H, D]
    cos = freqs.cos().unsqueeze(1).repeat(1, 1, 2)
    sin = freqs.sin().unsqueeze(1).repeat(1, 1, 2)
    return x * cos + rotate_half(x) * sin


def block_mask(cu, n):
    mask = torch.full((n, n), float("-inf"))
    for a, b in zip(cu[:-1], cu[1:]):
        mask[a:b, a:b] = 0
    return mask


def attention(p, pre, x, freqs, mask, heads):
    n, w = x.shape
    d = w // heads
    qkv = lin(p, pre + "attn.qkv", x).reshape(n, 3, heads, d).permute(1, 0, 2, 3)
    q, k, v = qkv.unbind(0)
    q, k = apply_rope(q, freqs), apply_rope(k, freqs)
    s = torch.einsum("ihd,jhd->hij", q, k) * d ** -0.5 + mask
    o = torch.einsum("hij,jhd->ihd", s.softmax(-1), v).reshape(n, w)
    return lin(p, pre + "attn.proj", o)


def layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-6)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


LORA = {}  # module name -> (A, B, scale): peft's lora.Linear (no dropout) on that linear


def lin(p, name, x):
    y = x @ p[name + ".weight"].T + p[name + ".bias"]
    if name in LORA:
        a, b, scale = LORA[name]
        y = y + scale * (x @ a.T) @ b.T
    return y


def cu_frames(grid):
    cu = [0]
    for t, h, w in grid:
        for _ in range(t):
            cu.append(cu[-1] + h * w)
    return cu


def qwen2_vl(p, cfg, pixels, grid):
    vc = cfg["vision_config"]
    heads, m = vc["num_heads"], vc["spatial_merge_size"]
    wpe = p["visual.patch_embed.proj.weight"]
    x = pixels @ wpe.reshape(wpe.shape[0], -1).T
    freqs = rot_pos_emb(grid, m, vc["embed_dim"] // heads)
    mask = block_mask(cu_frames(grid), x.shape[0])
    for i in range(vc["depth"]):
        pre = f"visual.blocks.{i}."
        x = x + attention(p, pre, layernorm(x, p[pre + "norm1.weight"], p[pre + "norm1.bias"]), freqs, mask, heads)
        h = lin(p, pre + "mlp.fc1", layernorm(x, p[pre + "norm2.weight"], p[pre + "norm2.bias"]))
        x = x + lin(p, pre + "mlp.fc2", h * torch.sigmoid(1.702 * h))
    y = layernorm(x, p["visual.merger.ln_q.weight"], p["visual.merger.ln_q.bias"]).reshape(-1, m * m * x.shape[1])
    return lin(p, "visual.merger.mlp.2", torch.nn.functional.gelu(lin(p, "visual.merger.mlp.0", y)))


def pos_interpolate(p, vc, grid):
    """fast_pos_embed_interpolate: [N, W] in the merge order of the patches."""
    emb = p["visual.pos_embed.weight"]
    side = int(vc["num_position_embeddings"] ** 0.5)
    m = vc["spatial_merge_size"]
    out = []
    for t, h, w in grid:
        hi = torch.linspace(0, side - 1, h, dtype=torch.float32)
        wi = torch.linspace(0, side - 1, w, dtype=torch.float32)
        hf, wf = hi.int(), wi.int()
        hc, wc = (hf + 1).clip(max=side - 1), (wf + 1).clip(max=side - 1)
        dh, dw = hi - hf, wi - wf
        idx = [(hf[:, None] * side + wf[None]).flatten(), (hf[:, None] * side + wc[None]).flatten(),
               (hc[:, None] * side + wf[None]).flatten(), (hc[:, None] * side + wc[None]).flatten()]
        wts = [((1 - dh)[:, None] * (1 - dw)[None]).flatten(), ((1 - dh)[:, None] * dw[None]).flatten(),
               (dh[:, None] * (1 - dw)[None]).flatten(), (dh[:, None] * dw[None]).flatten()]
        pe = sum(emb[i.long()] * wt.double()[:, None] for i, wt in zip(idx, wts))  # [h*w, W], row-major
        pe = pe.repeat(t, 1).view(t, h // m, m, w // m, m, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4)
        out.append(pe)
    return torch.cat(out)


def qwen3_vl(p, cfg, pixels, grid):
    vc = cfg["vision_config"]
    heads, m, wd = vc["num_heads"], vc["spatial_merge_size"], vc["hidden_size"]
    wpe = p["visual.patch_embed.proj.weight"]
    x = pixels @ wpe.reshape(wpe.shape[0], -1).T + p["visual.patch_embed.proj.bias"]
    x = x + pos_interpolate(p, vc, grid)
    freqs = rot_pos_emb(grid, m, wd // heads)
    mask = block_mask(cu_frames(grid), x.shape[0])

    def merger(pre, x, post):
        if post:
            y = layernorm(x.reshape(-1, m * m * wd), p[pre + "norm.weight"], p[pre + "norm.bias"])
        else:
            y = layernorm(x, p[pre + "norm.weight"], p[pre + "norm.bias"]).reshape(-1, m * m * wd)
        return lin(p, pre + "linear_fc2", torch.nn.functional.gelu(lin(p, pre + "linear_fc1", y)))

    deep = []
    for i in range(vc["depth"]):
        pre = f"visual.blocks.{i}."
        x = x + attention(p, pre, layernorm(x, p[pre + "norm1.weight"], p[pre + "norm1.bias"]), freqs, mask, heads)
        h = lin(p, pre + "mlp.linear_fc1", layernorm(x, p[pre + "norm2.weight"], p[pre + "norm2.bias"]))
        x = x + lin(p, pre + "mlp.linear_fc2", torch.nn.functional.gelu(h, approximate="tanh"))
        if i in vc["deepstack_visual_indexes"]:
            j = vc["deepstack_visual_indexes"].index(i)
            deep.append(merger(f"visual.deepstack_merger_list.{j}.", x, True))
    return torch.cat([merger("visual.merger.", x, False)] + deep)


def get_window_index(vc, grid):
    m = vc["spatial_merge_size"]
    unit = m * m
    vit_merger_window_size = vc["window_size"] // m // vc["patch_size"]
    window_index, cu_window_seqlens, window_index_id = [], [0], 0
    for t, h, w in grid:
        lh, lw = h // m, w // m
        index = torch.arange(t * lh * lw).reshape(t, lh, lw)
        pad_h = vit_merger_window_size - lh % vit_merger_window_size
        pad_w = vit_merger_window_size - lw % vit_merger_window_size
        nwh, nww = (lh + pad_h) // vit_merger_window_size, (lw + pad_w) // vit_merger_window_size
        padded = torch.nn.functional.pad(index, (0, pad_w, 0, pad_h), "constant", -100)
        padded = padded.reshape(t, nwh, vit_merger_window_size, nww, vit_merger_window_size)
        padded = padded.permute(0, 1, 3, 2, 4).reshape(t, nwh * nww, vit_merger_window_size, vit_merger_window_size)
        seqlens = (padded != -100).sum([2, 3]).reshape(-1)
        padded = padded.reshape(-1)
        window_index.append(padded[padded != -100] + window_index_id)
        cu_window_seqlens.extend((seqlens.cumsum(0) * unit + cu_window_seqlens[-1]).tolist())
        window_index_id += t * lh * lw
    cu = torch.unique_consecutive(torch.tensor(cu_window_seqlens)).tolist()
    return torch.cat(window_index), cu


def qwen2_5_vl(p, cfg, pixels, grid):
    vc = cfg["vision_config"]
    heads, m = vc["num_heads"], vc["spatial_merge_size"]
    unit = m * m
    wpe = p["visual.patch_embed.proj.weight"]
    x = pixels @ wpe.reshape(wpe.shape[0], -1).T
    n = x.shape[0]
    freqs = rot_pos_emb(grid, m, vc["hidden_size"] // heads)
    window_index, cu_window = get_window_index(vc, grid)
    x = x.reshape(n // unit, unit, -1)[window_index].reshape(n, -1)
    freqs = freqs.reshape(n // unit, unit, -1)[window_index].reshape(n, -1)
    full, win = block_mask(cu_frames(grid), n), block_mask(cu_window, n)
    for i in range(vc["depth"]):
        pre = f"visual.blocks.{i}."
        mask = full if i in vc["fullatt_block_indexes"] else win
        x = x + attention(p, pre, rmsnorm(x, p[pre + "norm1.weight"]), freqs, mask, heads)
        h = rmsnorm(x, p[pre + "norm2.weight"])
        x = x + lin(p, pre + "mlp.down_proj", torch.nn.functional.silu(lin(p, pre + "mlp.gate_proj", h)) *
                    lin(p, pre + "mlp.up_proj", h))
    y = rmsnorm(x, p["visual.merger.ln_q.weight"]).reshape(-1, unit * x.shape[1])
    y = lin(p, "visual.merger.mlp.2", torch.nn.functional.gelu(lin(p, "visual.merger.mlp.0", y)))
    return y[torch.argsort(window_index)]


def tensor_shapes(cfg):
    """The tower's tensors (names and shapes) as the checkpoints hold them."""
    vc = cfg["vision_config"]
    q25 = cfg["model_type"] == "qwen2_5_vl"
    if cfg["model_type"] == "qwen3_vl":
        return qwen3_shapes(vc)
    w = vc["hidden_size"] if q25 else vc["embed_dim"]
    f = vc["intermediate_size"] if q25 else w * vc["mlp_ratio"]
    out = vc["out_hidden_size"] if q25 else vc["hidden_size"]
    m2 = vc["spatial_merge_size"] ** 2
    t = {"visual.patch_embed.proj.weight": (w, vc["in_chans"], vc["temporal_patch_size"], vc["patch_size"],
                                            vc["patch_size"])}
    for i in range(vc["depth"]):
        pre = f"visual.blocks.{i}."
        for nm in ("norm1", "norm2"):
            t[pre + nm + ".weight"] = (w,)
            if not q25:
                t[pre + nm + ".bias"] = (w,)
        t[pre + "attn.qkv.weight"], t[pre + "attn.qkv.bias"] = (3 * w, w), (3 * w,)
        t[pre + "attn.proj.weight"], t[pre + "attn.proj.bias"] = (w, w), (w,)
        mlp = [("gate_proj", f, w), ("up_proj", f, w), ("down_proj", w, f)] if q25 else [("fc1", f, w), ("fc2", w, f)]
        for nm, o, i_ in mlp:
            t[pre + "mlp." + nm + ".weight"], t[pre + "mlp." + nm + ".bias"] = (o, i_), (o,)
    t["visual.merger.ln_q.weight"] = (w,)
    if not q25:
        t["visual.merger.ln_q.bias"] = (w,)
    t["visual.merger.mlp.0.weight"], t["visual.merger.mlp.0.bias"] = (m2 * w, m2 * w), (m2 * w,)
    t["visual.merger.mlp.2.weight"], t["visual.merger.mlp.2.bias"] = (out, m2 * w), (out,)
    return t


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, bytes)."""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(t):
    return ("F32", tuple(t.shape), t.detach().to(torch.float32).contiguous().numpy().tobytes())


def make_case(name, cfg, grid, store_bf16, seed):
    gen = torch.Generator().manual_seed(seed)
    vc = cfg["vision_config"]
    params, stored = {}, {}
    for nm, shape in tensor_shapes(cfg).items():
        numel = 1
        for s in shape:
            numel *= s
        if "norm" in nm or "ln_q" in nm:
            base = 1.0 if nm.endswith("weight") else 0.0
            v = base + 0.2 * (torch.rand(shape, generator=gen) * 2 - 1)
        elif nm.endswith("bias"):
            v = 0.1 * (torch.rand(shape, generator=gen) * 2 - 1)
        else:
            v = (3.0 / (numel // shape[0])) ** 0.5 * (torch.rand(shape, generator=gen) * 2 - 1)
        v32 = v.to(torch.bfloat16) if store_bf16 else v.to(torch.float32)
        stored[nm] = (("BF16", shape, v32.contiguous().view(torch.int16).numpy().tobytes()) if store_bf16
                      else f32(v32))
        params[nm] = v32.double().requires_grad_(True)
    k = vc.get("in_chans", vc.get("in_channels")) * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    n = sum(t * h * w for t, h, w in grid)
    pixels = torch.randn(n, k, generator=gen).to(torch.float32).double()
    model = {"qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl}[cfg["model_type"]]
    feats = model(params, cfg, pixels, grid)
    g = torch.randn(feats.shape, generator=gen).to(torch.float32).double()
    (feats * g).sum().backward()
    out = os.path.join("tests", "data", "vision", name)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    write_safetensors(os.path.join(out, "model.safetensors"), stored)
    gold = {"pixels": f32(pixels), "grid_thw": ("I32", (len(grid), 3),
                                                 torch.tensor(grid, dtype=torch.int32).numpy().tobytes()),
            "features": f32(feats), "d_features": f32(g)}
    for nm, v in params.items():  # the patch embedding's as the matrix [W, C*T*P*P] (4 dimensions at most)
        gold["grad." + nm] = f32(v.grad.reshape(v.shape[0], -1) if v.dim() == 5 else v.grad)
    write_safetensors(os.path.join(out, "goldens.safetensors"), gold)
    if store_bf16:  # bad weights: a tensor missing, a tensor of another shape
        bad = {k: v for k, v in stored.items() if k != "visual.blocks.1.attn.qkv.bias"}
        write_safetensors(os.path.join(out, "bad_missing.safetensors"), bad)
        dt, shape, data = stored["visual.blocks.1.mlp.fc2.bias"]
        bad = dict(stored)
        bad["visual.blocks.1.mlp.fc2.bias"] = (dt, (2, shape[0] // 2), data)
        write_safetensors(os.path.join(out, "bad_shape.safetensors"), bad)
        # the same weights under transformers' newer names (model.visual.*)
        write_safetensors(os.path.join(out, "prefixed.safetensors"), {"model." + k: v for k, v in stored.items()})
    print(f"{name}: {n} patches, features {tuple(feats.shape)}, |features| max {feats.abs().max():.3g}")

    # LoRA (rank 2, alpha 4: scale 2) on every linear of the blocks, B non-zero; the tower's own
    # weights frozen, the merger trained: lora.safetensors holds A and B (f32, PEFT's names),
    # the features and the gradients of A, B and the merger's weights
    rank, scale = 2, 4.0 / 2
    lora, lora_t = {}, {}
    mods = ["attn.qkv", "attn.proj"] + {"qwen2_5_vl": ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"],
                                        "qwen2_vl": ["mlp.fc1", "mlp.fc2"],
                                        "qwen3_vl": ["mlp.linear_fc1", "mlp.linear_fc2"]}[cfg["model_type"]]
    for i in range(vc["depth"]):
        for mod in mods:
            nm = f"visual.blocks.{i}.{mod}"
            w = params[nm + ".weight"]
            a = ((torch.rand(rank, w.shape[1], generator=gen) * 2 - 1) / w.shape[1] ** 0.5).to(torch.float32)
            b = (0.3 * (torch.rand(w.shape[0], rank, generator=gen) * 2 - 1)).to(torch.float32)
            a, b = a.double().requires_grad_(True), b.double().requires_grad_(True)
            LORA[nm] = (a, b, scale)
            lora["base_model.model." + nm + ".lora_A.weight"] = a
            lora["base_model.model." + nm + ".lora_B.weight"] = b
    for v in params.values():
        v.grad = None
    feats = model(params, cfg, pixels, grid)
    (feats * g).sum().backward()
    LORA.clear()
    for nm, v in lora.items():
        lora_t[nm] = f32(v)
        lora_t["grad." + nm] = f32(v.grad)
    for nm, v in params.items():
        if nm.startswith("visual.merger.") or nm.startswith("visual.deepstack_merger_list."):
            lora_t["grad." + nm] = f32(v.grad)
    lora_t["features"] = f32(feats)
    write_safetensors(os.path.join(out, "lora.safetensors"), lora_t)


QWEN2_VL = {
    "model_type": "qwen2_vl", "hidden_size": 12, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 1]},
    "vision_config": {"depth": 2, "embed_dim": 16, "mlp_ratio": 2, "num_heads": 2, "in_chans": 3,
                      "hidden_size": 12, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2}}
QWEN2_5_VL = {
    "model_type": "qwen2_5_vl", "hidden_size": 12, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 1]},
    "vision_config": {"depth": 3, "hidden_act": "silu", "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
                      "in_chans": 3, "out_hidden_size": 12, "patch_size": 4, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "window_size": 16, "fullatt_block_indexes": [1]}}

QWEN3_VL = {
    "model_type": "qwen3_vl",
    "text_config": {"hidden_size": 12, "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 1],
                                                        "mrope_interleaved": True}},
    "vision_config": {"depth": 3, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 16, "intermediate_size": 24,
                      "num_heads": 2, "in_channels": 3, "out_hidden_size": 12, "patch_size": 4,
                      "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 25,
                      "deepstack_visual_indexes": [0, 1]}}

if __name__ == "__main__":
    make_case("qwen2_vl", QWEN2_VL, [[1, 6, 10], [2, 4, 2]], True, 1)
    make_case("qwen2_5_vl", QWEN2_5_VL, [[1, 10, 6], [1, 4, 8], [1, 2, 2]], False, 2)
    make_case("qwen3_vl", QWEN3_VL, [[2, 6, 10], [1, 2, 4]], False, 3)
