#!/usr/bin/python3
"""Regenerates the GRPO golden tests/data/goldens/qwen2_bias_tied.grpo.golden.safetensors.

Run from the repository root with Debian's Python and torch, after
tools/make_goldens.py (it reads that script's model and PEFT adapter):

    /usr/bin/python3 tools/make_grpo_goldens.py

Written from TRL's GRPOTrainer (trl/trainer/grpo_trainer.py:
_generate_and_score_completions' advantages, _compute_loss). The model is
the golden qwen2_bias_tied with its adapter qwen2_bias_tied_lora: the
policy is the model with the adapter.
Two prompts answered G = 3 times each by fixed completions (6 rows: prompt +
completion, labels -100 on the prompt, right-padded with 0) with fixed
rewards. The old policy's log-probs are the policy's plus a fixed
perturbation in [-0.45, 0.45], so some ratios fall outside the clip range.

    mean, std  = per group of G (std unbiased, torch's); "batch": std over all
    A          = (R - mean) / (std + 1e-4)          ("none": R - mean)
    coef_1     = exp(logp - old)          (old = logp.detach() without old log-probs)
    coef_2     = clamp(coef_1, 1 - eps, 1 + eps_high)
    ptl        = -min(coef_1 * A, coef_2 * A) + beta * (exp(ref - logp) - (ref - logp) - 1)
    grpo       : mean over completions of (sum ptl * mask) / mask.sum()
    bnpo       : (ptl * mask).sum() / mask.sum()
    dr_grpo    : (ptl * mask).sum() / (B * max_completion_length)

Written tensors (per-token arrays [6, T] hold at position t the log-prob of
the token at t + 1, the one position t predicts; 0 where none):
    input_ids, labels  i32 [6, T]
    rewards            f32 [6]
    policy_logps, old_logps   f32 [6, T]
    base_logps         f32 [6, T]  the model's without the adapter (the reference pass)
    ref_logps          f32 [6, T]  the reference of the KL: the policy's plus a perturbation in [-0.6, 0.6]
    CASE.loss, CASE.kl, CASE.clip_low, CASE.clip_high, CASE.clip_region   f32 [1]
    CASE.advantages    f32 [6]
    CASE.lora.<PEFT name>  f32   torch autograd gradient of CASE.loss for every lora_A / lora_B
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (CONFIGS, LORA_ALPHA, LORA_R, hf_forward, lora_dict, pad_rows,  # noqa: E402
                          read_safetensors, write_safetensors)

NAME = "qwen2_bias_tied"
G = 3
MAX_COMPLETION_LENGTH = 8
REWARDS = [1.0, 0.0, 0.5, 0.2, 0.2, 1.4]
# name -> (loss_type, beta, epsilon, epsilon_high, old log-probs kept, scale_rewards)
CASES = {
    "grpo": ("grpo", 0.0, 0.2, 0.2, True, "group"),
    "bnpo": ("bnpo", 0.0, 0.2, 0.2, True, "group"),
    "dr_grpo": ("dr_grpo", 0.0, 0.2, 0.2, True, "none"),
    "grpo_kl": ("grpo", 0.04, 0.2, 0.2, True, "group"),
    "bnpo_kl": ("bnpo", 0.1, 0.2, 0.2, True, "batch"),
    "dr_grpo_kl": ("dr_grpo", 0.04, 0.2, 0.2, True, "group"),
    "clip_higher": ("grpo", 0.04, 0.2, 0.28, True, "group"),
    "on_policy": ("grpo", 0.04, 0.2, 0.2, False, "group"),
    "on_policy_nokl": ("bnpo", 0.0, 0.2, 0.2, False, "group"),
}


def make_batch(V, gen):
    """Prompts of 4 and 3 tokens; completions of 3, 5, 6 and 2, 4, 8 tokens."""
    rows = []
    for plen, clens in ((4, (3, 5, 6)), (3, (2, 4, 8))):
        prompt = torch.randint(0, V, (plen,), generator=gen)
        for clen in clens:
            c = torch.randint(0, V, (clen,), generator=gen)
            rows.append((torch.cat([prompt, c]), torch.cat([torch.full((plen,), -100), c])))
    return pad_rows(rows)


def token_logps(cfg, W, ids, labels, lengths, lora=None):
    """[B, T]: at t the log-prob of labels[t + 1] (0 where it is -100); each row alone, unpadded."""
    B, T = ids.shape
    out = []
    for b, L in enumerate(lengths):
        logits = hf_forward(cfg, W, ids[b:b + 1, :L], lora, LORA_ALPHA / LORA_R)[0]
        tgt = labels[b, 1:L]
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tgt.clamp(min=0)[:, None])[:, 0]
        lp = lp * (tgt != -100)
        out.append(torch.cat([lp, torch.zeros(T - (L - 1))]))
    return torch.stack(out)


def advantages(scale):
    r = torch.tensor(REWARDS, dtype=torch.float64)
    grouped = r.view(-1, G)
    mean = grouped.mean(dim=1).repeat_interleave(G)
    std = grouped.std(dim=1).repeat_interleave(G) if scale != "batch" else r.std().expand_as(r)
    a = r - mean
    if scale != "none":
        a = a / (std + 1e-4)
    return a


def grpo_loss(case, logp, old, ref, mask):
    loss_type, beta, eps, eps_high, keep_old, scale = CASES[case]
    A = advantages(scale).float()[:, None]
    old = old if keep_old else logp.detach()
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps_high)
    ptl = -torch.min(coef_1 * A, coef_2 * A)
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    if beta != 0:
        ptl = ptl + beta * kl
    if loss_type == "grpo":
        loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (ptl * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        loss = (ptl * mask).sum() / (ptl.size(0) * MAX_COMPLETION_LENGTH)
    low = ((coef_1 < 1 - eps) & (A < 0)).float()
    high = ((coef_1 > 1 + eps_high) & (A > 0)).float()
    n = mask.sum()
    stats = {"kl": (kl * mask).sum() / n, "clip_low": (low * mask).sum() / n,
             "clip_high": (high * mask).sum() / n, "clip_region": (((low + high) > 0).float() * mask).sum() / n}
    return loss, stats, A[:, 0]


def main():
    root = "tests/data/goldens"
    torch.set_num_threads(1)
    cfg = CONFIGS[NAME]["cfg"]
    W = {k: v.float() for k, v in read_safetensors(os.path.join(root, NAME, "model.safetensors")).items()}
    lora_T = read_safetensors(os.path.join(root, NAME + "_lora", "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(4717)
    ids, labels, lengths = make_batch(cfg["vocab_size"], gen)
    B, T = ids.shape
    mask = torch.zeros(B, T)
    mask[:, :-1] = (labels[:, 1:] != -100).float()
    with torch.no_grad():
        ref = token_logps(cfg, W, ids, labels, lengths)
        P0 = {k: v.float() for k, v in lora_T.items()}
        pol0 = token_logps(cfg, W, ids, labels, lengths, lora_dict(cfg, P0))
    old = (pol0 + (torch.rand(B, T, generator=gen) * 0.9 - 0.45)) * mask
    # the KL's reference: near the policy (the golden adapter moves the model far from its base, whose
    # log-probs, base_logps, check the reference pass)
    near = (pol0 + (torch.rand(B, T, generator=gen) * 1.2 - 0.6)) * mask
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "rewards": torch.tensor(REWARDS, dtype=torch.float32),
           "policy_logps": pol0.float(), "old_logps": old.float(), "base_logps": ref.float(),
           "ref_logps": near.float()}
    ref = near
    for case in CASES:
        P = {k: v.float().clone().requires_grad_(True) for k, v in lora_T.items()}
        logp = token_logps(cfg, W, ids, labels, lengths, lora_dict(cfg, P))
        loss, stats, A = grpo_loss(case, logp, old, ref, mask)
        loss.backward()
        out[case + ".loss"] = loss.detach().reshape(1).float()
        for k, v in stats.items():
            out[case + "." + k] = v.detach().reshape(1).float()
        out[case + ".advantages"] = A.float()
        for k, v in P.items():
            out[case + ".lora." + k] = v.grad.detach().clone()
        print("%-12s loss %.6f kl %.6f clip low %.3f high %.3f" % (case, loss.item(), stats["kl"].item(),
                                                                  stats["clip_low"].item(),
                                                                  stats["clip_high"].item()))
    write_safetensors(os.path.join(root, NAME + ".grpo.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_grpo_goldens.py", "config": NAME})


if __name__ == "__main__":
    main()
