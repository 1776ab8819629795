#!/usr/bin/python3
"""Builds the bundled demo model, demo/stories260K/, from llama2.c's stories260K.

The checkpoint (tests/data/models/stories260K.bin, see its SOURCES.md) becomes
a Hugging Face folder: config.json, model.safetensors (f32, q/k rows permuted
from llama2.c's interleaved rotary pairs to HF's rotate_half order, as
transformers' convert_llama_weights_to_hf.py does), the llama2.c tokenizer as
tokenizer.bin, and a tokenizer_config.json with a small question/answer chat
template, since the base model has none. Run with Debian's python3-torch:

    /usr/bin/python3 tools/make_demo_model.py
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A question/answer template for a base model without a chat template. The
# text after "Answer:" up to and including the end-of-sequence token is what
# training learns; add_generation_prompt is implied by the user turn.
TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}Question: {{ message['content'] }}\nAnswer:"
    "{% elif message['role'] == 'assistant' %} {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}"
)


def main():
    src = os.path.join(ROOT, "tests/data/models/stories260K.bin")
    tok = os.path.join(ROOT, "tests/data/goldens/tok512.bin")
    out = os.path.join(ROOT, "demo/stories260K")
    os.makedirs(out, exist_ok=True)
    cfg, W = mg.read_llama2c(src)
    hf_cfg = mg._base("llama", "LlamaForCausalLM", hidden_size=cfg["dim"], intermediate_size=cfg["hidden"],
                      num_hidden_layers=cfg["L"], num_attention_heads=cfg["H"], num_key_value_heads=cfg["Hkv"],
                      vocab_size=cfg["V"], rms_norm_eps=1e-5, tie_word_embeddings=True,
                      max_position_embeddings=cfg["seq_len"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
        f.write("\n")
    tensors = {k: v.contiguous() for k, v in mg.llama2c_to_hf(cfg, W).items()}
    mg.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    shutil.copyfile(tok, os.path.join(out, "tokenizer.bin"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE,
                   "model_max_length": cfg["seq_len"]}, f, indent=2)
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
