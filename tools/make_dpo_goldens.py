#!/usr/bin/python3
"""Regenerates the preference golden tests/data/goldens/qwen2_bias_tied.dpo.golden.safetensors
(DPO, SimPO, CPO and ORPO).

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
Log-probs follow TRL's get_batch_logps (labels shifted by one, sum over the
reply's tokens; the mean for ipo, simpo and orpo), the losses TRL's
DPOTrainer.dpo_loss, CPOTrainer.cpo_loss and ORPOTrainer.odds_ratio_loss:

    logits = (pi_c - pi_r) - (ref_c - ref_r)        (ref = 0 for cpo/simpo)
    sigmoid: -logsigmoid(beta*logits)*(1-ls) - logsigmoid(-beta*logits)*ls
    simpo:   the same with logits - simpo_gamma/beta
    ipo:     (logits - 1/(2*beta))**2
    orpo:    log_odds = (a_c - a_r) - (log1p(-exp(a_c)) - log1p(-exp(a_r)))
             -beta*logsigmoid(log_odds)
    loss = mean over the pairs
           + alpha * cross-entropy of the chosen rows (mean over their tokens),
           alpha = rpo_alpha (dpo), cpo_alpha (cpo, simpo), 1 (orpo: its SFT term;
           ms-swift passes the labels, so the reply's tokens only)

Written tensors:
    input_ids, labels  i32 [4, T]
    lengths            i32 [4]
    ref_logps          f32 [4]   reference log-prob sums of each row's reply
    policy_logps       f32 [4]   the same with the adapter
    CASE.loss          f32 [1]   for every CASE of CASES
    CASE.log_odds      f32 [2]   orpo cases: each pair's log_odds
    CASE.lora.<PEFT name>  f32   torch autograd gradient of CASE.loss for every lora_A / lora_B
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (CONFIGS, LORA_ALPHA, LORA_R, hf_forward, lora_dict, pad_rows,  # noqa: E402
                          read_safetensors, write_safetensors)

NAME = "qwen2_bias_tied"
# name -> (objective, beta, loss_type, label_smoothing, alpha of the NLL term, simpo_gamma)
CASES = {
    "sigmoid": ("dpo", 0.1, "sigmoid", 0.0, None, 0.0),
    "rpo": ("dpo", 0.1, "sigmoid", 0.0, 0.5, 0.0),
    "ipo": ("dpo", 0.1, "ipo", 0.0, None, 0.0),
    "smooth": ("dpo", 0.5, "sigmoid", 0.2, None, 0.0),
    "simpo": ("cpo", 2.0, "simpo", 0.0, 0.0, 1.0),        # the SimPO paper (cpo_alpha 0)
    "simpo_nll": ("cpo", 2.5, "simpo", 0.1, 1.0, 0.5),    # ms-swift's cpo_alpha 1, with smoothing
    "cpo": ("cpo", 0.1, "sigmoid", 0.0, 1.0, 0.0),
    "cpo_ipo": ("cpo", 0.1, "ipo", 0.0, 0.5, 0.0),
    "orpo": ("orpo", 0.1, None, 0.0, 1.0, 0.0),
    "orpo_b": ("orpo", 0.5, None, 0.0, 1.0, 0.0),
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
    return pad_rows(rows)


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


def pref_loss(case, pol, ref):
    """The case's loss and, for orpo, each pair's log_odds."""
    objective, beta, loss_type, ls, alpha, gamma = CASES[case]
    averaged = objective == "orpo" or loss_type in ("ipo", "simpo")
    losses, log_odds = [], []
    for p in range(len(pol) // 2):
        (pc, nc), (pr, nr) = pol[2 * p], pol[2 * p + 1]
        rc, rr = (ref[2 * p][0], ref[2 * p + 1][0]) if objective == "dpo" else (0.0, 0.0)
        if averaged:  # TRL: average_log_prob, policy and reference alike
            pc, pr, rc, rr = pc / nc, pr / nr, rc / nc, rr / nr
        if objective == "orpo":
            lo = (pc - pr) - (torch.log1p(-torch.exp(pc)) - torch.log1p(-torch.exp(pr)))
            log_odds.append(lo.detach())
            losses.append(-beta * F.logsigmoid(lo))
            continue
        logits = (pc - pr) - (rc - rr)
        if loss_type == "ipo":
            losses.append((logits - 1 / (2 * beta)) ** 2)
        else:
            if loss_type == "simpo":
                logits = logits - gamma / beta
            losses.append(-F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls)
    loss = torch.stack(losses).mean()
    if alpha:
        nll = -sum(pol[2 * p][0] for p in range(len(pol) // 2))
        n = sum(pol[2 * p][1] for p in range(len(pol) // 2))
        loss = loss + alpha * nll / n
    return loss, log_odds


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
        loss, log_odds = pref_loss(case, pol, ref)
        loss.backward()
        out[case + ".loss"] = loss.detach().reshape(1).float()
        if log_odds:
            out[case + ".log_odds"] = torch.stack(log_odds).float()
        for k, v in P.items():
            out[case + ".lora." + k] = v.grad.detach().clone()
        print("%-10s loss %.6f" % (case, loss.item()))
    write_safetensors(os.path.join(root, NAME + ".dpo.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_dpo_goldens.py", "config": NAME})


if __name__ == "__main__":
    main()
