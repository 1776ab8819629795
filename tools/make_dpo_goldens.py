#!/usr/bin/python3
"""Regenerates the DPO golden tests/data/goldens/qwen2_bias_tied.dpo.golden.safetensors.

Run from the repository root with Debian's Python and torch, after
tools/make_goldens.py (it reads that script's model and PEFT adapter):

    /usr/bin/python3 tools/make_dpo_goldens.py

The model is the golden qwen2_bias_tied (q/k/v biases, tied embeddings) with
its adapter qwen2_bias_tied_lora (r 4, alpha 8, all 7 linear modules, B
non-zero). The batch is two preference pairs, rows interleaved as the trainer
lays them out [chosen0, rejected0, chosen1, rejected1], right-padded with 0:
each pair shares a prompt (labels -100) and has its own chosen and rejected
reply (labels = ids). The reference is the model without the adapter, the
policy the model with it, each row run alone (no padding in the reference).
Log-probs follow TRL's DPOTrainer.get_batch_logps (labels shifted by one, sum
over the reply's tokens; for ipo the mean), and the losses its dpo_loss:

    logits = (pi_c - pi_r) - (ref_c - ref_r)
    sigmoid: -logsigmoid(beta*logits)*(1-ls) - logsigmoid(-beta*logits)*ls
    ipo:     (logits - 1/(2*beta))**2
    rpo:     + rpo_alpha * cross-entropy of the chosen rows (mean over their tokens)
    loss = mean over the pairs

Written tensors:
    input_ids, labels  i32 [4, T]
    lengths            i32 [4]
    ref_logps          f32 [4]   reference log-prob sums of each row's reply
    policy_logps       f32 [4]   the same with the adapter
    CASE.loss          f32 [1]   for CASE in sigmoid, rpo, ipo, smooth (see CASES)
    CASE.lora.<PEFT name>  f32   torch autograd gradient of CASE.loss for every lora_A / lora_B
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (CONFIGS, LORA_ALPHA, LORA_R, hf_forward, lora_dict,  # noqa: E402
                          read_safetensors, write_safetensors)

NAME = "qwen2_bias_tied"
# name -> (beta, loss_type, label_smoothing, rpo_alpha)
CASES = {
    "sigmoid": (0.1, "sigmoid", 0.0, None),
    "rpo": (0.1, "sigmoid", 0.0, 0.5),
    "ipo": (0.1, "ipo", 0.0, None),
    "smooth": (0.5, "sigmoid", 0.2, None),
}


def make_batch(V, gen):
    """Two pairs: prompt lengths 5 and 3, replies of 4/6 and 7/2 tokens."""
    rows = []
    for prompt_len, (lc, lr) in ((5, (4, 6)), (3, (7, 2))):
        prompt = torch.randint(0, V, (prompt_len,), generator=gen)
        for n in (lc, lr):
            reply = torch.randint(0, V, (n,), generator=gen)
            ids = torch.cat([prompt, reply])
            labels = torch.cat([torch.full((prompt_len,), -100), reply])
            rows.append((ids, labels))
    T = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.int64)
    labels = torch.full((len(rows), T), -100, dtype=torch.int64)
    lengths = []
    for b, (i, l) in enumerate(rows):
        ids[b, :len(i)] = i
        labels[b, :len(l)] = l
        lengths.append(len(i))
    return ids, labels, lengths


def row_logps(cfg, W, ids, labels, lengths, lora=None):
    """Per row: (sum of log p over the supervised targets, their count, sum of CE)."""
    out = []
    for b, L in enumerate(lengths):
        logits = hf_forward(cfg, W, ids[b:b + 1, :L], lora, LORA_ALPHA / LORA_R)[0]
        tgt = labels[b, 1:L]
        mask = tgt != -100
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tgt.clamp(min=0)[:, None])[:, 0]
        out.append(((lp * mask).sum(), int(mask.sum())))
    return out


def dpo_loss(case, pol, ref):
    beta, loss_type, ls, rpo = CASES[case]
    losses = []
    for p in range(len(pol) // 2):
        (pc, nc), (pr, nr) = pol[2 * p], pol[2 * p + 1]
        rc, rr = ref[2 * p][0], ref[2 * p + 1][0]
        if loss_type == "ipo":  # TRL: average_log_prob for ipo, policy and reference alike
            pc, pr, rc, rr = pc / nc, pr / nr, rc / nc, rr / nr
        logits = (pc - pr) - (rc - rr)
        if loss_type == "ipo":
            losses.append((logits - 1 / (2 * beta)) ** 2)
        else:
            losses.append(-F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls)
    loss = torch.stack(losses).mean()
    if rpo is not None:
        nll = -sum(pol[2 * p][0] for p in range(len(pol) // 2))
        n = sum(pol[2 * p][1] for p in range(len(pol) // 2))
        loss = loss + rpo * nll / n
    return loss


def main():
    root = "tests/data/goldens"
    torch.set_num_threads(1)
    cfg = CONFIGS[NAME]["cfg"]
    W = {k: v.float() for k, v in read_safetensors(os.path.join(root, NAME, "model.safetensors")).items()}
    lora_T = read_safetensors(os.path.join(root, NAME + "_lora", "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(4242)
    ids, labels, lengths = make_batch(cfg["vocab_size"], gen)
    with torch.no_grad():
        ref = [(lp.detach(), n) for lp, n in row_logps(cfg, W, ids, labels, lengths)]
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "lengths": torch.tensor(lengths, dtype=torch.int32),
           "ref_logps": torch.stack([r[0] for r in ref]).float()}
    for case in CASES:
        P = {k: v.float().clone().requires_grad_(True) for k, v in lora_T.items()}
        pol = row_logps(cfg, W, ids, labels, lengths, lora_dict(cfg, P))
        if "policy_logps" not in out:
            out["policy_logps"] = torch.stack([p[0].detach() for p in pol]).float()
        loss = dpo_loss(case, pol, ref)
        loss.backward()
        out[case + ".loss"] = loss.detach().reshape(1).float()
        for k, v in P.items():
            out[case + ".lora." + k] = v.grad.detach().clone()
        print("%-8s loss %.6f" % (case, loss.item()))
    write_safetensors(os.path.join(root, NAME + ".dpo.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_dpo_goldens.py", "config": NAME})


if __name__ == "__main__":
    main()
