#!/usr/bin/python3
"""Regenerates the reward-model golden tests/data/goldens/qwen2_bias_tied.rm.golden.safetensors.

Run from the repository root with Debian's Python and torch, after
tools/make_goldens.py (it reads that script's model and PEFT adapter):

    /usr/bin/python3 tools/make_rm_goldens.py

The model is the golden qwen2_bias_tied with its adapter qwen2_bias_tied_lora
and a score head as transformers' *ForSequenceClassification with num_labels 1:
score = Linear(hidden, 1, bias=False) on the final-normed hidden states, the
reward of a row read at its last token (transformers pools at the last token
that is not the pad id; the rows here are run alone, unpadded). The loss is
TRL's RewardTrainer.compute_loss on the two pairs of make_dpo_goldens.py's
batch (rows [chosen0, rejected0, chosen1, rejected1]):

    loss = -logsigmoid(r_chosen - r_rejected).mean()
           + center_rewards_coefficient * mean((r_chosen + r_rejected) ** 2)

Written tensors:
    input_ids, labels  i32 [4, T] (make_dpo_goldens.py's batch), lengths i32 [4]
    score.weight       f32 [1, hidden]   the head (random, std 0.3)
    rewards            f32 [4]           each row's reward with the adapter
    CASE.loss          f32 [1]
    CASE.score.weight  f32 [1, hidden]   gradient of CASE.loss w.r.t. the head
    CASE.lora.<PEFT name>  f32           gradient of CASE.loss for every lora_A / lora_B
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (CONFIGS, LORA_ALPHA, LORA_R, hf_forward, lora_dict,  # noqa: E402
                          read_safetensors, write_safetensors)
from make_dpo_goldens import make_batch  # noqa: E402

NAME = "qwen2_bias_tied"
CASES = {"bt": 0.0, "center": 0.5}  # center_rewards_coefficient


def rewards(cfg, W, score, ids, lengths, lora):
    """Each row's reward: the score head on its last token's final hidden state."""
    cfg1 = dict(cfg, tie_word_embeddings=False)  # hf_forward's head becomes the score head
    W1 = dict(W)
    W1["lm_head.weight"] = score
    return torch.stack([hf_forward(cfg1, W1, ids[b:b + 1, :L], lora, LORA_ALPHA / LORA_R)[0, L - 1, 0]
                        for b, L in enumerate(lengths)])


def main():
    root = "tests/data/goldens"
    torch.set_num_threads(1)
    cfg = CONFIGS[NAME]["cfg"]
    W = {k: v.float() for k, v in read_safetensors(os.path.join(root, NAME, "model.safetensors")).items()}
    lora_T = read_safetensors(os.path.join(root, NAME + "_lora", "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(4242)  # make_dpo_goldens.py's batch
    ids, labels, lengths = make_batch(cfg["vocab_size"], gen)
    score0 = torch.randn(1, cfg["hidden_size"], generator=torch.Generator().manual_seed(77)) * 0.3
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "lengths": torch.tensor(lengths, dtype=torch.int32), "score.weight": score0.clone()}
    for case, coef in CASES.items():
        P = {k: v.float().clone().requires_grad_(True) for k, v in lora_T.items()}
        score = score0.clone().requires_grad_(True)
        r = rewards(cfg, W, score, ids, lengths, lora_dict(cfg, P))
        if "rewards" not in out:
            out["rewards"] = r.detach().float()
        rc, rr = r[0::2], r[1::2]
        loss = -F.logsigmoid(rc - rr).mean()
        if coef:
            loss = loss + coef * torch.mean((rc + rr) ** 2)
        loss.backward()
        out[case + ".loss"] = loss.detach().reshape(1).float()
        out[case + ".score.weight"] = score.grad.detach().clone()
        for k, v in P.items():
            out[case + ".lora." + k] = v.grad.detach().clone()
        print("%-7s loss %.6f rewards %s" % (case, loss.item(), [round(x, 5) for x in r.tolist()]))
    write_safetensors(os.path.join(root, NAME + ".rm.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_rm_goldens.py", "config": NAME})


if __name__ == "__main__":
    main()
