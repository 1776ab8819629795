#!/usr/bin/python3
"""Writes the M-RoPE and vision-config test files (tests/test_vision_config.c):

  tests/data/models/mrope_goldens.json   position ids of token sequences with
      images, from get_rope_index below: transformers' Qwen2VLModel.get_rope_index
      (the image path; Qwen2.5-VL's differs for videos only) for one sequence
      without padding, written again with numpy, statement by statement
  tests/data/models/tiny-qwen2-vl/, tiny-qwen2_5-vl/   config.json with a
      vision_config, and model.safetensors holding the vision tower's tensors
      (random values; names and shapes as transformers' checkpoints have them)

Run from the repository root:  /usr/bin/python3 tools/make_mrope_goldens.py
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import write_safetensors  # noqa: E402

IMAGE, VIDEO, VSTART, VEND = 151655, 151656, 151652, 151653


def get_rope_index(input_ids, image_grid_thw, spatial_merge_size=2):
    """transformers' get_rope_index for one row, attention mask all ones."""
    input_tokens = list(input_ids)
    ids = np.array(input_ids)
    vision_start_indices = np.argwhere(ids == VSTART).squeeze(1)
    vision_tokens = ids[vision_start_indices + 1]
    image_nums = int((vision_tokens == IMAGE).sum())
    llm_pos_ids_list = []
    st = 0
    image_index = 0
    remain_images = image_nums
    for _ in range(image_nums):
        if IMAGE in input_tokens and remain_images > 0:
            ed_image = input_tokens.index(IMAGE, st)
        else:
            ed_image = len(input_tokens) + 1
        t, h, w = image_grid_thw[image_index]
        image_index += 1
        remain_images -= 1
        ed = ed_image
        llm_grid_t, llm_grid_h, llm_grid_w = t, h // spatial_merge_size, w // spatial_merge_size
        text_len = ed - st
        st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
        llm_pos_ids_list.append(np.broadcast_to(np.arange(text_len).reshape(1, -1), (3, text_len)) + st_idx)
        t_index = np.broadcast_to(np.arange(llm_grid_t).reshape(-1, 1), (llm_grid_t, llm_grid_h * llm_grid_w)).flatten()
        h_index = np.broadcast_to(np.arange(llm_grid_h).reshape(1, -1, 1),
                                  (llm_grid_t, llm_grid_h, llm_grid_w)).flatten()
        w_index = np.broadcast_to(np.arange(llm_grid_w).reshape(1, 1, -1),
                                  (llm_grid_t, llm_grid_h, llm_grid_w)).flatten()
        llm_pos_ids_list.append(np.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st = ed + llm_grid_t * llm_grid_h * llm_grid_w
    if st < len(input_tokens):
        st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
        text_len = len(input_tokens) - st
        llm_pos_ids_list.append(np.broadcast_to(np.arange(text_len).reshape(1, -1), (3, text_len)) + st_idx)
    llm_positions = np.concatenate(llm_pos_ids_list, axis=1).reshape(3, -1)
    delta = int(llm_positions.max()) + 1 - len(input_ids)
    return llm_positions, delta


def sequence(rs, parts):
    """parts: ints (that many text tokens) and (t, h, w) image grids."""
    ids, grids = [], []
    for p in parts:
        if isinstance(p, int):
            ids += [int(x) for x in rs.randint(100, 5000, p)]
        else:
            grids.append(list(p))
            ids += [VSTART] + [IMAGE] * (p[0] * p[1] * p[2] // 4) + [VEND]
    return ids, grids


def mrope_cases():
    rs = np.random.RandomState(0)
    shapes = [[5, (1, 4, 4), 7],             # one image in text
              [(1, 4, 6), 3],                 # image first
              [4, (1, 8, 4)],                 # image last (only its end token after it)
              [3, (1, 4, 4), 2, (1, 6, 10), 5],  # two images of other grids
              [2, (1, 16, 2), 1, (1, 2, 2), 1, (1, 4, 8), 9],  # three, one tall and thin
              [12]]                           # no image
    cases = []
    for parts in shapes:
        ids, grids = sequence(rs, parts)
        pos, delta = get_rope_index(ids, grids)
        cases.append({"ids": ids, "grid_thw": grids, "position_ids": pos.tolist(), "delta": delta})
    return cases


def vision_tensors(q25, w, f, out, depth, tp, p, m2, weight, norm, bias):
    """The vision tower's tensors as transformers' checkpoints name and shape
    them (Qwen2-VL; q25: Qwen2.5-VL), in file order: weight, norm and bias
    make a matrix, a norm's scale and a bias of the shape given, called in
    that order (a random generator draws the same values each time)."""
    t = [("visual.patch_embed.proj.weight", weight(w, 3, tp, p, p))]
    for i in range(depth):
        b = "visual.blocks.%d." % i
        t += [(b + "norm1.weight", norm(w))] + ([] if q25 else [(b + "norm1.bias", bias(w))])
        t += [(b + "norm2.weight", norm(w))] + ([] if q25 else [(b + "norm2.bias", bias(w))])
        t += [(b + "attn.qkv.weight", weight(3 * w, w)), (b + "attn.qkv.bias", bias(3 * w)),
              (b + "attn.proj.weight", weight(w, w)), (b + "attn.proj.bias", bias(w))]
        if q25:
            for n_, shp in (("gate_proj", (f, w)), ("up_proj", (f, w)), ("down_proj", (w, f))):
                t += [(b + "mlp.%s.weight" % n_, weight(*shp)), (b + "mlp.%s.bias" % n_, bias(shp[0]))]
        else:
            t += [(b + "mlp.fc1.weight", weight(f, w)), (b + "mlp.fc1.bias", bias(f)),
                  (b + "mlp.fc2.weight", weight(w, f)), (b + "mlp.fc2.bias", bias(w))]
    t += [("visual.merger.ln_q.weight", norm(w))] + ([] if q25 else [("visual.merger.ln_q.bias", bias(w))])
    t += [("visual.merger.mlp.0.weight", weight(w * m2, w * m2)), ("visual.merger.mlp.0.bias", bias(w * m2)),
          ("visual.merger.mlp.2.weight", weight(out, w * m2)), ("visual.merger.mlp.2.bias", bias(out))]
    return t


def qwen3_shapes(vc):
    """Qwen3-VL's tower tensors, name -> shape, from its vision_config."""
    w, f, out, m2 = vc["hidden_size"], vc["intermediate_size"], vc["out_hidden_size"], vc["spatial_merge_size"] ** 2
    t = {"visual.patch_embed.proj.weight": (w, vc["in_channels"], vc["temporal_patch_size"], vc["patch_size"],
                                            vc["patch_size"]),
         "visual.patch_embed.proj.bias": (w,), "visual.pos_embed.weight": (vc["num_position_embeddings"], w)}
    for i in range(vc["depth"]):
        pre = f"visual.blocks.{i}."
        for nm in ("norm1", "norm2"):
            t[pre + nm + ".weight"], t[pre + nm + ".bias"] = (w,), (w,)
        t[pre + "attn.qkv.weight"], t[pre + "attn.qkv.bias"] = (3 * w, w), (3 * w,)
        t[pre + "attn.proj.weight"], t[pre + "attn.proj.bias"] = (w, w), (w,)
        for nm, o, i_ in (("linear_fc1", f, w), ("linear_fc2", w, f)):
            t[pre + "mlp." + nm + ".weight"], t[pre + "mlp." + nm + ".bias"] = (o, i_), (o,)
    mergers = [("visual.merger.", w)] + [(f"visual.deepstack_merger_list.{j}.", m2 * w)
                                         for j in range(len(vc["deepstack_visual_indexes"]))]
    for pre, nw in mergers:
        t[pre + "norm.weight"], t[pre + "norm.bias"] = (nw,), (nw,)
        t[pre + "linear_fc1.weight"], t[pre + "linear_fc1.bias"] = (m2 * w, m2 * w), (m2 * w,)
        t[pre + "linear_fc2.weight"], t[pre + "linear_fc2.bias"] = (out, m2 * w), (out,)
    return t


def tiny_model(kind):
    rs = np.random.RandomState(1)
    w, heads, depth, out, m2, tp, p = 16, 2, 2, 24, 4, 2, 14
    q25 = kind == "qwen2_5_vl"
    f = 40 if q25 else 4 * w
    vcfg = {"depth": depth, "num_heads": heads, "in_chans": 3, "patch_size": p, "spatial_merge_size": 2,
            "temporal_patch_size": tp}
    if q25:
        vcfg.update({"hidden_act": "silu", "hidden_size": w, "intermediate_size": f, "out_hidden_size": out,
                     "window_size": 112, "fullatt_block_indexes": [1], "tokens_per_second": 2})
    else:
        vcfg.update({"embed_dim": w, "mlp_ratio": 4, "hidden_size": out})
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration" if q25 else "Qwen2VLForConditionalGeneration"],
           "model_type": kind, "hidden_size": out, "intermediate_size": 48, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": True,
           "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VSTART,
           "vision_end_token_id": VEND, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]},
           "vision_config": vcfg, "torch_dtype": "float32"}
    t = vision_tensors(q25, w, f, out, depth, tp, p, m2, rs.randn, rs.randn, rs.randn)
    d = "tests/data/models/tiny-%s" % kind.replace("_vl", "-vl")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    write_safetensors(os.path.join(d, "model.safetensors"), [(n_, a.astype(np.float32)) for n_, a in t],
                      {"format": "pt"})
    return d, len(t)


def main():
    cases = mrope_cases()
    with open("tests/data/models/mrope_goldens.json", "w") as fh:
        json.dump({"generator": "tools/make_mrope_goldens.py (numpy %s)" % np.__version__, "spatial_merge_size": 2,
                   "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VSTART,
                   "cases": cases}, fh)
    for kind in ("qwen2_vl", "qwen2_5_vl"):
        d, n = tiny_model(kind)
        print("wrote %s (%d vision tensors)" % (d, n))
    print("wrote %d M-RoPE cases" % len(cases))


if __name__ == "__main__":
    main()
