#!/usr/bin/python3
"""Inputs of the vision-language export tests (test_export_vlm.c,
test_export_gguf_js.c), made at test time with numpy only:

    OUT/q2         tools/make_tiny_vlm.py --kind qwen2_vl --dtype f32, the
                   tower's biases random (the split qkv's values are checked),
                   and a chat_template.json as the published folders have
    OUT/q2_lora    a PEFT adapter for it: LoRA on the language model's q_proj
                   and v_proj, LoRA on every linear of the tower's blocks
                   (base_model.model.visual.blocks.N.attn.qkv.lora_A.weight ...)
                   and a trained aligner weight as ms-swift's modules_to_save
                   saves it (base_model.model.visual.merger.mlp.2.weight)
    OUT/q25        --kind qwen2_5_vl --dtype bf16, rewritten in the layout of
                   transformers 4.52 and later (model.language_model.*,
                   model.visual.*; lm_head.* unchanged), its processor's
                   image_mean / image_std set to values of their own
    OUT/q25_lora   LoRA on q_proj and on the tower's blocks under the new
                   layout's PEFT names (base_model.model.model.visual.*)

    /usr/bin/python3 tests/test_export_vlm_inputs.py OUT
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from safetensors_np import write_safetensors  # noqa: E402

RANK, ALPHA = 4, 8


def make(out, kind, dtype):
    subprocess.check_call([sys.executable, os.path.join(ROOT, "tools", "make_tiny_vlm.py"), out, "--kind", kind,
                           "--dtype", dtype], cwd=ROOT, stdout=subprocess.DEVNULL)


def renest(path):
    """Renames the tensors of a safetensors file to the nested layout, bytes unchanged."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    new = {}
    for k, v in header.items():
        if k.startswith("model."):
            k = "model.language_model." + k[6:]
        elif k.startswith("visual."):
            k = "model." + k
        new[k] = v
    h = json.dumps(new, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def random_biases(path, rs):
    """Gives the tower's biases of an f32 file random values (make_tiny_vlm.py's are 0), in place."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        for k, v in header.items():
            if k.startswith("visual.") and k.endswith(".bias"):
                assert v["dtype"] == "F32"
                b, e = v["data_offsets"]
                f.seek(8 + n + b)
                f.write(rs.normal(0, 0.02, (e - b) // 4).astype(np.float32).tobytes())


def adapter(out, cfg, tower_prefix, rs, aligner):
    os.makedirs(out, exist_ok=True)
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = hidden // heads
    t = []
    for layer in range(cfg["num_hidden_layers"]):
        for mod, o in (("q_proj", heads * hd), ("v_proj", kv * hd)):
            b = "base_model.model.model.layers.%d.self_attn.%s." % (layer, mod)
            t += [(b + "lora_A.weight", rs.normal(0, 0.1, (RANK, hidden))),
                  (b + "lora_B.weight", rs.normal(0, 0.05, (o, RANK)))]
    vc = cfg["vision_config"]
    w = vc.get("embed_dim", vc["hidden_size"])
    q25 = cfg["model_type"] == "qwen2_5_vl"
    inter = vc["intermediate_size"] if q25 else w * vc["mlp_ratio"]
    lin = [("attn.qkv", w, 3 * w), ("attn.proj", w, w)]
    lin += ([("mlp.gate_proj", w, inter), ("mlp.up_proj", w, inter), ("mlp.down_proj", inter, w)] if q25 else
            [("mlp.fc1", w, inter), ("mlp.fc2", inter, w)])
    for blk in range(vc["depth"]):
        for name, i, o in lin:
            b = "%svisual.blocks.%d.%s." % (tower_prefix, blk, name)
            t += [(b + "lora_A.weight", rs.normal(0, 0.1, (RANK, i))),
                  (b + "lora_B.weight", rs.normal(0, 0.05, (o, RANK)))]
    if aligner:
        t += [(tower_prefix + "visual.merger.mlp.2.weight", rs.normal(0, 0.02, (hidden, 4 * w)))]
    write_safetensors(os.path.join(out, "adapter_model.safetensors"), [(n, a.astype(np.float32)) for n, a in t],
                      {"format": "pt"})
    conf = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "bias": "none",
            "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM", "use_rslora": False,
            "modules_to_save": ["merger"] if aligner else None, "base_model_name_or_path": None}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(conf, f, indent=1)


def main():
    out = sys.argv[1]
    rs = np.random.RandomState(7)
    q2, q25 = os.path.join(out, "q2"), os.path.join(out, "q25")
    make(q2, "qwen2_vl", "f32")
    make(q25, "qwen2_5_vl", "bf16")
    random_biases(os.path.join(q2, "model.safetensors"), rs)
    # the published Qwen2-VL folders also carry the template as chat_template.json
    with open(os.path.join(q2, "tokenizer_config.json")) as f:
        tmpl = json.load(f)["chat_template"]
    with open(os.path.join(q2, "chat_template.json"), "w") as f:
        json.dump({"chat_template": tmpl}, f, indent=1)
    renest(os.path.join(q25, "model.safetensors"))
    # a processor whose mean / std are not the defaults: the mmproj must take the folder's
    pp = os.path.join(q25, "preprocessor_config.json")
    with open(pp) as f:
        proc = json.load(f)
    proc["image_mean"], proc["image_std"] = [0.5, 0.25, 0.125], [0.75, 0.5, 0.625]
    with open(pp, "w") as f:
        json.dump(proc, f, indent=1)
    with open(os.path.join(q2, "config.json")) as f:
        adapter(os.path.join(out, "q2_lora"), json.load(f), "base_model.model.", rs, True)
    with open(os.path.join(q25, "config.json")) as f:
        adapter(os.path.join(out, "q25_lora"), json.load(f), "base_model.model.model.", rs, False)


if __name__ == "__main__":
    main()
