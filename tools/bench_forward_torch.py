#!/usr/bin/python3
"""The PyTorch side of bench/forward.c: prefill tokens/s of a random
Llama-family decoder, written as Hugging Face's LlamaForCausalLM runs it in
eager mode (RMSNorm in f32, rotate_half RoPE, repeat_kv GQA, softmax in f32,
SiLU MLP, logits for the last position only as generate() asks since
transformers 4.45: num_logits_to_keep=1): tools/bench_train_torch.py's model
with plain nn.Linear projections.

bench/forward runs it as a subprocess with PyTorch set up at its best (see
shared BENCHMARKING.md): 2 threads, OpenBLAS's OpenMP build preloaded and
OPENBLAS_CORETYPE unset for f32, bf16 autocast for bf16. Prints one JSON line:
{"tok_s": ..., "median_s": ..., "runs": [...], "peak_rss_mib": ..., "threads": ...,
 "blas": ...}.

    /usr/bin/python3 tools/bench_forward_torch.py --hidden 512 --intermediate 1408 \
        --layers 8 --heads 8 --kv-heads 4 --vocab 32000 --seq 256 --batch 4 --mode f32
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_torch import Model as TrainModel, add_shape_args  # noqa: E402


class Model(TrainModel):
    """bench_train_torch.py's model with plain nn.Linear projections and eager
    attention; forward returns the last position's logits."""

    def __init__(self, a):
        super().__init__(a, lambda i, o, b: nn.Linear(i, o, bias=b))

    def forward(self, ids):
        x = self.norm(self.hidden(ids)[:, -1:, :])  # num_logits_to_keep=1
        return self.lm_head(x).float()


def main():
    ap = argparse.ArgumentParser()
    add_shape_args(ap)
    ap.add_argument("--mode", choices=["f32", "bf16"], required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        model = Model(a).eval()
        ids = torch.randint(0, a.vocab, (a.batch, a.seq))
        times = []
        for i in range(a.runs + 1):  # the first run warms up
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(a.mode == "bf16")):
                out = model(ids)
            dt = time.perf_counter() - t0
            if i > 0:
                times.append(dt)
            assert out.shape == (a.batch, 1, a.vocab) and torch.isfinite(out).all()
    times.sort()
    med = times[len(times) // 2]
    # Debian's torch calls the generic libblas.so.3; which BLAS that is
    # depends on LD_PRELOAD (bench/forward preloads OpenBLAS's OpenMP build).
    blas = os.environ.get("LD_PRELOAD") or "system libblas.so.3"
    print(json.dumps({
        "tok_s": a.batch * a.seq / med,
        "median_s": med,
        "runs": times,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "threads": torch.get_num_threads(),
        "blas": blas,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
