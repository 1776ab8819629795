#!/usr/bin/env python3
"""Reference outputs of the logits processors, for tests/test_sampling.c.

The processors are written in PyTorch the way Hugging Face transformers
writes them (generation/logits_process.py: RepetitionPenaltyLogitsProcessor,
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper) and vLLM applies presence/frequency penalties
(model_executor/layers/utils.py apply_penalties), in generate()'s order:
repetition penalty, presence/frequency, temperature, top-k, top-p, min-p.

Writes tests/data/sampling/processors.json: for each case the input logits,
prompt and generated ids, parameters, and the processed logits (null for
-inf). Run: /usr/bin/python3 tools/make_sampling_goldens.py
"""
import json
import math
import os

import torch


def repetition(scores, ids, penalty):
    if penalty == 1.0 or not ids:
        return scores
    idx = torch.tensor([ids])
    score = torch.gather(scores, 1, idx)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(1, idx, score)


def presence_frequency(scores, generated, presence, frequency):
    counts = torch.zeros_like(scores)
    for t in generated:
        counts[0, t] += 1
    scores = scores - frequency * counts
    return scores - presence * (counts > 0).to(scores.dtype)


def top_k(scores, k):
    if k <= 0:
        return scores
    k = min(k, scores.size(-1))
    remove = scores < torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(remove, -float("inf"))


def top_p(scores, p):
    if p >= 1.0:
        return scores
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_remove = cum <= (1 - p)
    sorted_remove[..., -1:] = 0
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    return scores.masked_fill(remove, -float("inf"))


def min_p(scores, mp):
    if mp <= 0:
        return scores
    probs = torch.softmax(scores, dim=-1)
    top = probs.max(dim=-1, keepdim=True)[0]
    remove = probs < mp * top
    sorted_indices = torch.argsort(scores, descending=True, dim=-1)
    sorted_remove = torch.gather(remove, -1, sorted_indices)
    sorted_remove[..., :1] = False
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    return scores.masked_fill(remove, -float("inf"))


def process(logits, prompt, generated, c):
    s = torch.tensor([logits], dtype=torch.float32)
    s = repetition(s, sorted(set(prompt + generated)), c["repetition_penalty"])
    s = presence_frequency(s, generated, c["presence_penalty"], c["frequency_penalty"])
    if c["temperature"] <= 0:
        return s[0]
    s = s / c["temperature"]
    s = top_k(s, c["top_k"])
    s = top_p(s, c["top_p"])
    s = min_p(s, c["min_p"])
    return s[0]


def main():
    g = torch.Generator().manual_seed(1234)
    V = 64
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0)
    variants = [
        {},
        {"temperature": 0.7},
        {"temperature": 1.3, "top_k": 5},
        {"top_k": 1},
        {"top_p": 0.9},
        {"top_p": 0.5, "temperature": 0.8},
        {"min_p": 0.1},
        {"min_p": 0.05, "top_k": 20, "top_p": 0.95, "temperature": 0.9},
        {"repetition_penalty": 1.3},
        {"repetition_penalty": 0.8, "temperature": 0.0},
        {"presence_penalty": 0.5, "frequency_penalty": 0.3},
        {"presence_penalty": -0.4, "frequency_penalty": 1.1, "repetition_penalty": 1.2, "top_p": 0.8},
        {"temperature": 0.0, "repetition_penalty": 1.5, "frequency_penalty": 0.7},
    ]
    cases = []
    for i, v in enumerate(variants):
        c = dict(base, **v)
        logits = (torch.randn(V, generator=g) * 3).tolist()
        prompt = torch.randint(0, V, (6,), generator=g).tolist()
        generated = torch.randint(0, V, (8,), generator=g).tolist()
        generated += generated[:3]  # repeats, for the frequency penalty
        out = process(logits, prompt, generated, c)
        cases.append(dict(params=c, logits=logits, prompt=prompt, generated=generated,
                          expected=[None if math.isinf(x) else x for x in out.tolist()]))
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "sampling", "processors.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"vocab": V, "cases": cases}, f)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
