#!/usr/bin/python3
"""Writes a tiny, random, complete Qwen2-VL, Qwen2.5-VL or Qwen3-VL model folder, as a
Hugging Face checkpoint of the real model has it, for end-to-end tests and
demos of the vision-language paths (sft with images, infer --images, serve,
export):

    config.json                 model_type qwen2_vl / qwen2_5_vl, a vision_config,
                                rope_scaling mrope with sections summing to head_dim / 2;
                                qwen3_vl: text_config (a Qwen3 decoder, interleaved
                                M-RoPE), a vision_config with deepstack mergers, the
                                language model under model.language_model.*
    model.safetensors           the language model (model.*, tied lm_head) and the
                                vision tower (visual.*), f32 or bf16, initialised
                                as transformers does (normal, std 0.02; norms 1;
                                biases 0)
    vocab.json, merges.txt      the Qwen2 tokenizer of tests/data/tokenizers/qwen2
                                (trimmed: every text still encodes, through byte
                                tokens where a merge was dropped; ids are the real ones)
    tokenizer_config.json       Qwen2-VL's added tokens (<|vision_start|> 151652 ...
                                <|video_pad|> 151656) and its chat template
    preprocessor_config.json    Qwen2VLImageProcessor's, with a small max_pixels
                                (images of the tests stay a few patches)
    generation_config.json

Only numpy; it finds the tokenizer files from its own location:

    python3 tools/make_tiny_vlm.py OUT_DIR [--kind qwen2_vl|qwen2_5_vl|qwen3_vl]
        [--hidden 64] [--layers 2] [--dtype f32|bf16] [--seed 0] [--vocab qwen2|bytes]

The vocabulary has Qwen2's 151,936 rows (the special tokens' ids are fixed
there), so the embedding is most of the file: 151936 x hidden values; with
--vocab bytes it is 256 byte tokens and the special ones after them (272
rows: a folder of a few hundred kilobytes, the vision demo's).
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

from make_mrope_goldens import qwen3_shapes, vision_tensors
from safetensors_np import write_safetensors

TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests/data/tokenizers/qwen2")
VOCAB = 151936
SPECIAL = [(151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>"),
           (151646, "<|object_ref_start|>"), (151647, "<|object_ref_end|>"), (151648, "<|box_start|>"),
           (151649, "<|box_end|>"), (151650, "<|quad_start|>"), (151651, "<|quad_end|>"),
           (151652, "<|vision_start|>"), (151653, "<|vision_end|>"), (151654, "<|vision_pad|>"),
           (151655, "<|image_pad|>"), (151656, "<|video_pad|>")]

# Qwen2-VL-2B-Instruct's chat_template.json
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def bytes_tokenizer():
    """A byte-level vocabulary of 256 tokens (GPT-2's byte-to-character map, the
    form Qwen2's vocab.json uses), no merges, and Qwen2-VL's special tokens
    right after: every text encodes byte by byte. With it the model is a few
    hundred kilobytes (the bundled vision demo's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    special = [(256 + i, s) for i, (_, s) in enumerate(SPECIAL)]
    return vocab, special


def lm_tensors(prefix, vocab, hidden, heads, kv, head_dim, inter, layers, n, qwen3):
    """The language model's tensors under prefix, as transformers initialises
    them (n: normal matrices; norms 1, biases 0): Qwen2's q/k/v biases, or
    Qwen3's q/k norms (qwen3)."""
    t = [(prefix + "embed_tokens.weight", n(vocab, hidden))]
    for i in range(layers):
        b = prefix + "layers.%d." % i
        t += [(b + "input_layernorm.weight", np.ones(hidden)), (b + "post_attention_layernorm.weight", np.ones(hidden))]
        for proj, rows in (("q", heads), ("k", kv), ("v", kv)):
            t.append((b + "self_attn.%s_proj.weight" % proj, n(rows * head_dim, hidden)))
            if not qwen3:
                t.append((b + "self_attn.%s_proj.bias" % proj, np.zeros(rows * head_dim)))
        t.append((b + "self_attn.o_proj.weight", n(hidden, heads * head_dim)))
        if qwen3:
            t += [(b + "self_attn.q_norm.weight", np.ones(head_dim)), (b + "self_attn.k_norm.weight", np.ones(head_dim))]
        t += [(b + "mlp.gate_proj.weight", n(inter, hidden)), (b + "mlp.up_proj.weight", n(inter, hidden)),
              (b + "mlp.down_proj.weight", n(hidden, inter))]
    return t + [(prefix + "norm.weight", np.ones(hidden))]


def model3(hidden, layers, rs, vocab, ids):
    """Qwen3-VL: its config.json layout (text_config, vision_config) and names."""
    heads, kv = 4, 2
    head_dim = hidden // heads
    half = head_dim // 2
    sec = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]  # Qwen3-VL's 24/20/20 of 64, scaled
    inter = 2 * hidden
    vcfg = {"depth": 2, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "out_hidden_size": hidden, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1],
            "model_type": "qwen3_vl", "initializer_range": 0.02}
    tcfg = {"model_type": "qwen3_vl_text", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_theta": 5000000.0, "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "rope_scaling": {"rope_type": "default", "mrope_section": sec, "mrope_interleaved": True}}
    cfg = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": True,
           "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
           "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
           "text_config": tcfg, "vision_config": vcfg}

    def n(*shape):
        return rs.normal(0.0, 0.02, shape)

    t = lm_tensors("model.language_model.", vocab, hidden, heads, kv, head_dim, inter, layers, n, True)
    for name, shape in qwen3_shapes(vcfg).items():  # as transformers initialises them: norms 1, biases 0
        v = np.ones(shape) if "norm" in name and name.endswith("weight") else \
            np.zeros(shape) if name.endswith("bias") else n(*shape)
        t.append(("model." + name, v))
    return cfg, t


def model(kind, hidden, layers, rs, vocab=VOCAB, ids=None):
    if kind == "qwen3_vl":
        return model3(hidden, layers, rs, vocab, ids)
    q25 = kind == "qwen2_5_vl"
    heads, kv = 4, 2
    head_dim = hidden // heads
    half = head_dim // 2
    sec = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]  # Qwen2-VL's 16/24/24 of 64, scaled
    inter = 2 * hidden
    w, vheads, depth, p, tp, m2 = 32, 2, 2, 14, 2, 4
    vf = 64 if q25 else 4 * w
    vcfg = {"depth": depth, "num_heads": vheads, "in_chans": 3, "patch_size": p, "spatial_merge_size": 2,
            "temporal_patch_size": tp}
    if q25:
        vcfg.update({"hidden_act": "silu", "hidden_size": w, "intermediate_size": vf, "out_hidden_size": hidden,
                     "window_size": 112, "fullatt_block_indexes": [1], "tokens_per_second": 2})
    else:
        vcfg.update({"embed_dim": w, "mlp_ratio": 4, "hidden_size": hidden, "hidden_act": "quick_gelu"})
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration" if q25 else "Qwen2VLForConditionalGeneration"],
           "model_type": kind, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab, "rms_norm_eps": 1e-6,
           "hidden_act": "silu", "rope_theta": 1000000.0, "max_position_embeddings": 32768,
           "tie_word_embeddings": True, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
           "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
           "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
           "vision_token_id": ids["<|vision_pad|>"],
           "rope_scaling": {"type": "mrope", "mrope_section": sec}, "vision_config": vcfg}

    def n(*shape):
        return rs.normal(0.0, 0.02, shape)

    t = lm_tensors("model.", vocab, hidden, heads, kv, head_dim, inter, layers, n, False)
    t += vision_tensors(q25, w, vf, hidden, depth, tp, p, m2, n, np.ones, np.zeros)
    return cfg, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--kind", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"], default="qwen2_vl")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", choices=["qwen2", "bytes"], default="qwen2",
                    help="qwen2: Qwen2's tokenizer and ids (151,936 rows); bytes: 256 byte tokens + the special ones")
    a = ap.parse_args()
    if a.hidden % 4 or (a.hidden // 4) % 2:
        sys.exit("--hidden must be a multiple of 8 (4 heads of an even head_dim)")
    os.makedirs(a.out, exist_ok=True)
    special = SPECIAL
    if a.vocab == "bytes":
        byte_vocab, special = bytes_tokenizer()
        n_vocab = (256 + len(special) + 7) // 8 * 8
    else:
        n_vocab = VOCAB
    ids = {s: i for i, s in special}
    cfg, tensors = model(a.kind, a.hidden, a.layers, np.random.RandomState(a.seed), n_vocab, ids)
    cfg["torch_dtype"] = "bfloat16" if a.dtype == "bf16" else "float32"
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    write_safetensors(os.path.join(a.out, "model.safetensors"), [(n, t.astype(np.float32)) for n, t in tensors],
                      {"format": "pt"}, bf16=a.dtype == "bf16")
    if a.vocab == "bytes":
        with open(os.path.join(a.out, "vocab.json"), "w") as fh:
            json.dump(byte_vocab, fh, ensure_ascii=False)
        with open(os.path.join(a.out, "merges.txt"), "w") as fh:
            fh.write("#version: 0.2\n")
    else:
        for f in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(TOKENIZER_DIR, f), os.path.join(a.out, f))
    with open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json")) as fh:
        tc = json.load(fh)
    tc["added_tokens_decoder"] = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                           "single_word": False, "special": True} for i, s in special}
    tc["additional_special_tokens"] = [s for _, s in special[1:]]
    tc["eos_token"], tc["pad_token"] = "<|im_end|>", "<|endoftext|>"
    tc["chat_template"] = CHAT_TEMPLATE
    tc["tokenizer_class"] = "Qwen2Tokenizer"
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as fh:
        json.dump(tc, fh, indent=1, ensure_ascii=False)
    with open(os.path.join(a.out, "preprocessor_config.json"), "w") as fh:
        if a.kind == "qwen3_vl":  # Qwen3-VL's: patch 16, mean / std 0.5, the pixel bounds in size
            json.dump({"size": {"shortest_edge": 4096, "longest_edge": 128 * 128}, "patch_size": 16,
                       "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                       "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessorFast",
                       "processor_class": "Qwen3VLProcessor"}, fh, indent=1)
        else:
            json.dump({"min_pixels": 3136, "max_pixels": 112 * 112, "patch_size": 14, "temporal_patch_size": 2,
                       "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                       "image_std": [0.26862954, 0.26130258, 0.27577711],
                       "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}, fh,
                      indent=1)
    with open(os.path.join(a.out, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                   "pad_token_id": ids["<|endoftext|>"]}, fh, indent=1)
    print("wrote %s (%s, hidden %d, %d layers, %d tensors, %s)" % (a.out, a.kind, a.hidden, a.layers, len(tensors),
                                                                    a.dtype))


if __name__ == "__main__":
    main()
