#!/usr/bin/python3
"""The PyTorch side of bench/train's vision row (bench/train_vision.c):
training tokens/s and images/s of one LoRA step of a Qwen2-VL-shaped model
with images, on the hand-written references of the tests:

  the vision tower   tools/make_vision_goldens.py's qwen2_vl (transformers'
                     Qwen2VisionTransformerPretrainedModel: Conv3d patch
                     embedding as a matmul, 2-D rotary, LayerNorm + QuickGELU
                     blocks, the 2x2 patch merger), frozen, as ms-swift's
                     --freeze_vit and --freeze_aligner leave it
  the language side  tools/make_vlm_goldens.py's vl_forward (Qwen2 decoder
                     with M-RoPE, the merger's features scattered into the
                     <|image_pad|> rows), PEFT's LoRA (dropout 0) on q, k, v,
                     o, gate, up, down

Both references were written to make goldens in float64; here they run in
the mode given (their default dtype set back to float32, the tower's rotary
angles cast to float32), as a Trainer step: forward, HF's shifted causal-LM
loss (mean over the targets), backward, clip_grad_norm_(1.0), AdamW (lr 1e-4,
weight decay 0.01) on the LoRA parameters. The tower runs one image at a
time: the same features as the reference's block-masked batch (attention
stays within an image), without computing the masked-out scores.

Modes (shared BENCHMARKING.md): f32; bf16 = frozen weights stored bf16 and
the step under torch.autocast('cpu', bfloat16). Prints one JSON line
{"tok_s", "images_s", "median_s", "cpu_s", "loss0", "peak_rss_mib", ...},
the median over --steps steps after one warm-up step.

    /usr/bin/python3 tools/bench_vlm_torch.py --mode bf16 --threads 2
(the shape options are bench/train_vision.c's; it passes them)
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_vision_goldens as mvg  # noqa: E402  (sets float64 as the default dtype)
import make_goldens  # noqa: E402
import make_mrope_goldens as mrope  # noqa: E402
import make_vlm_goldens as mvl  # noqa: E402
from make_goldens import make_lora, lora_dict, make_weights  # noqa: E402

torch.set_default_dtype(torch.float32)
_rot = mvg.rot_pos_emb
mvg.rot_pos_emb = lambda grid, m, d: _rot(grid, m, d).float()


def configs(a):
    vision = {"model_type": "qwen2_vl", "hidden_size": a.hidden,
              "vision_config": {"depth": a.v_depth, "embed_dim": a.v_width, "mlp_ratio": a.v_mlp_ratio,
                                "num_heads": a.v_heads, "in_chans": 3, "hidden_size": a.hidden,
                                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}
    lm = {"model_type": "qwen2", "hidden_size": a.hidden, "intermediate_size": a.intermediate,
          "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
          "head_dim": a.hidden // a.heads, "vocab_size": a.vocab, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
          "tie_word_embeddings": False, "rope_scaling": {"type": "mrope", "mrope_section": a.mrope_section}}
    return vision, lm


def tower_weights(vcfg, gen):
    """Random tower weights of make_vision_goldens' shapes (f32)."""
    p = {}
    for nm, shape in mvg.tensor_shapes(vcfg).items():
        if "norm" in nm or "ln_q" in nm:
            v = (1.0 if nm.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=gen)
        elif nm.endswith("bias"):
            v = 0.02 * torch.randn(shape, generator=gen)
        else:
            fan_in = math.prod(shape[1:])
            v = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        p[nm] = v
    return p


def sample(a):
    """One row: a.prompt text tokens, <|vision_start|>, the image's pads,
    <|vision_end|>, a.answer text tokens; labels on the answer only. The ids
    of bench/train_vision.c's (image tokens at the top of the vocabulary)."""
    vstart, vend, image = a.vocab - 4, a.vocab - 3, a.vocab - 2
    n = (a.image // 14) ** 2 // 4
    gen = torch.Generator().manual_seed(5)
    text = torch.randint(0, vstart, (a.prompt + a.answer,), generator=gen).tolist()
    ids = text[:a.prompt] + [vstart] + [image] * n + [vend] + text[a.prompt:]
    labels = [-100] * (a.prompt + n + 2) + text[a.prompt:]
    return ids, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["f32", "bf16"], required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--intermediate", type=int, default=2240)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--mrope-section", type=int, nargs=3, default=[16, 24, 24])
    ap.add_argument("--v-width", type=int, default=320)
    ap.add_argument("--v-depth", type=int, default=8)
    ap.add_argument("--v-heads", type=int, default=4)
    ap.add_argument("--v-mlp-ratio", type=int, default=4)
    ap.add_argument("--image", type=int, default=448, help="side of each square image, pixels")
    ap.add_argument("--batch", type=int, default=2, help="rows, one image each")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--answer", type=int, default=46)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bf16 = a.mode == "bf16"

    gen = torch.Generator().manual_seed(1234)
    vcfg, lcfg = configs(a)
    tower = tower_weights(vcfg, gen)
    W = make_weights(lcfg, gen)
    scale = a.alpha / a.rank
    make_goldens.LORA_R = a.rank  # make_lora draws pairs of its module's rank
    P = make_lora(lcfg, W, gen)
    for k in P:  # a fresh adapter: B zero (PEFT), A as make_lora draws it
        if "lora_B" in k:
            P[k].zero_()
    dt = torch.bfloat16 if bf16 else torch.float32
    tower = {k: v.to(dt) for k, v in tower.items()}
    W = {k: v.to(dt) for k, v in W.items()}
    P = {k: v.float().requires_grad_(True) for k, v in P.items()}
    lora = lora_dict(lcfg, P)
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    ids, labels = sample(a)
    mvl.IMAGE = a.vocab - 2  # vl_forward scatters the features at its module's image id
    grid = [1, a.image // 14, a.image // 14]
    n_patches = grid[1] * grid[2]
    pix_gen = torch.Generator().manual_seed(9)
    pixels = [torch.randn(n_patches, 3 * 2 * 14 * 14, generator=pix_gen) for _ in range(a.batch)]
    mrope.VSTART, mrope.IMAGE = a.vocab - 4, a.vocab - 2
    pos, _ = mrope.get_rope_index(ids, [grid])
    pos = torch.tensor(pos, dtype=torch.int64)
    ids_t, tgt = torch.tensor(ids), torch.tensor(labels[1:])

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            total, n = 0.0, 0
            for b in range(a.batch):
                with torch.no_grad():  # frozen tower and merger
                    feats = mvg.qwen2_vl(tower, vcfg, pixels[b], [grid])
                lg = mvl.vl_forward(lcfg, W, ids_t, pos, feats.to(dt), lora, scale)
                total = total + F.cross_entropy(lg[:-1].float(), tgt, ignore_index=-100, reduction="sum")
                n += int((tgt != -100).sum())
            loss = total / n
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    times, cpu, loss0 = [], [], None
    for i in range(a.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        dt_, dc = time.perf_counter() - t0, time.process_time() - c0
        assert math.isfinite(loss), loss
        if i == 0:
            loss0 = loss
        else:
            times.append(dt_)
            cpu.append(dc)
    times.sort()
    cpu.sort()
    med = times[len(times) // 2]
    print(json.dumps({
        "tok_s": a.batch * len(ids) / med, "images_s": a.batch / med, "median_s": med, "runs": times,
        "cpu_s": cpu[len(cpu) // 2], "loss0": loss0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "threads": torch.get_num_threads(), "mode": a.mode,
        "blas": os.environ.get("LD_PRELOAD") or "system libblas.so.3", "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
