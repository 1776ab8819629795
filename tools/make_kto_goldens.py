#!/usr/bin/python3
"""Regenerates the KTO golden tests/data/goldens/qwen2_bias_tied.kto.golden.safetensors.

Run from the repository root with Debian's Python and torch, after
tools/make_goldens.py (it reads that script's model and PEFT adapter):

    /usr/bin/python3 tools/make_kto_goldens.py

Written from TRL's KTOTrainer (trl/trainer/kto_trainer.py: get_kl_dataset's
KL completions, _compute_loss, kto_loss with loss_type "kto"). The model is
the golden qwen2_bias_tied with its adapter qwen2_bias_tied_lora; the
reference is the model without the adapter, the policy the model with it.
Four examples (prompt + completion; labels -100 on the prompt) with labels
[True, False, False, True]. The KL rows are TRL's: one chunk of 4 examples,
example i's prompt followed by the completion of example i-1 (the first
takes the last's): KL_completion_ids = [c[-1]] + c[:-1]. The batch is laid
out as the trainer does: rows [x0+y0, x0+y3, x1+y1, x1+y0, ...] (example,
its KL row), right-padded with 0.

    logps    = sum of log p over the completion's tokens (labels shifted by one)
    kl       = clamp(mean(KL_logps - ref_KL_logps), min=0).detach()
    chosen   : 1 - sigmoid(beta * (logps - ref_logps - kl))   * desirable_weight
    rejected : 1 - sigmoid(beta * (kl - (logps - ref_logps))) * undesirable_weight
    loss     = mean over the examples (TRL: losses.nanmean())

Cases differ in beta, the weights and the reference of the KL rows: "shift"
lowers the KL rows' reference log-probs by 3 (as if a reference that finds
mismatched replies unlikely), so kl > 0 and its clamp and its place in the
loss are exercised; the other cases use the base model's as TRL does.

Written tensors:
    input_ids, labels  i32 [8, T]
    lengths            i32 [8]
    desirable          i32 [4]
    ref_logps          f32 [8]   reference log-prob sums of each row (base model)
    policy_logps       f32 [8]   the same with the adapter
    CASE.ref_logps     f32 [8]   the reference the case uses
    CASE.loss, CASE.kl f32 [1]
    CASE.lora.<PEFT name>  f32   torch autograd gradient of CASE.loss for every lora_A / lora_B
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (CONFIGS, LORA_ALPHA, LORA_R, hf_forward, lora_dict, pad_rows,  # noqa: E402
                          read_safetensors, write_safetensors)

NAME = "qwen2_bias_tied"
LABELS = [True, False, False, True]
# name -> (beta, desirable_weight, undesirable_weight, shift of the KL rows' reference)
CASES = {
    "kto": (0.1, 1.0, 1.0, 0.0),
    "weighted": (0.5, 1.0, 1.33, 0.0),
    "shift": (0.5, 0.7, 1.2, 3.0),
}


def make_batch(V, gen):
    """Prompts of 5, 3, 4, 2 tokens; completions of 4, 6, 3, 5."""
    ex = []
    for plen, clen in ((5, 4), (3, 6), (4, 3), (2, 5)):
        ex.append((torch.randint(0, V, (plen,), generator=gen), torch.randint(0, V, (clen,), generator=gen)))
    kl_completion = [ex[-1][1]] + [c for _, c in ex[:-1]]  # TRL: [completions[-1]] + completions[:-1]
    rows = []
    for (prompt, completion), klc in zip(ex, kl_completion):
        for c in (completion, klc):
            rows.append((torch.cat([prompt, c]), torch.cat([torch.full((len(prompt),), -100), c])))
    return pad_rows(rows)


def row_logps(cfg, W, ids, labels, lengths, lora=None):
    """Per row: the sum of log p over the supervised targets (each row alone, unpadded)."""
    out = []
    for b, L in enumerate(lengths):
        logits = hf_forward(cfg, W, ids[b:b + 1, :L], lora, LORA_ALPHA / LORA_R)[0]
        tgt = labels[b, 1:L]
        mask = tgt != -100
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tgt.clamp(min=0)[:, None])[:, 0]
        out.append((lp * mask).sum())
    return out


def kto_loss(case, pol, ref):
    beta, wd, wu, _ = CASES[case]
    n = len(pol) // 2
    logps = torch.stack([pol[2 * i] for i in range(n)])
    kl_logps = torch.stack([pol[2 * i + 1] for i in range(n)])
    ref_logps = torch.stack([ref[2 * i] for i in range(n)])
    ref_kl_logps = torch.stack([ref[2 * i + 1] for i in range(n)])
    kl = (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)
    lab = torch.tensor(LABELS)
    chosen_logratios = (logps - ref_logps)[lab]
    rejected_logratios = (logps - ref_logps)[~lab]
    chosen_losses = 1 - torch.sigmoid(beta * (chosen_logratios - kl))
    rejected_losses = 1 - torch.sigmoid(beta * (kl - rejected_logratios))
    losses = torch.cat((wd * chosen_losses, wu * rejected_losses), 0)
    return losses.nanmean(), kl


def main():
    root = "tests/data/goldens"
    torch.set_num_threads(1)
    cfg = CONFIGS[NAME]["cfg"]
    W = {k: v.float() for k, v in read_safetensors(os.path.join(root, NAME, "model.safetensors")).items()}
    lora_T = read_safetensors(os.path.join(root, NAME + "_lora", "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(4243)
    ids, labels, lengths = make_batch(cfg["vocab_size"], gen)
    with torch.no_grad():
        base = [lp.detach() for lp in row_logps(cfg, W, ids, labels, lengths)]
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "lengths": torch.tensor(lengths, dtype=torch.int32),
           "desirable": torch.tensor([int(x) for x in LABELS], dtype=torch.int32),
           "ref_logps": torch.stack(base).float()}
    for case, (_, _, _, shift) in CASES.items():
        ref = [r - shift if b % 2 else r for b, r in enumerate(base)]
        P = {k: v.float().clone().requires_grad_(True) for k, v in lora_T.items()}
        pol = row_logps(cfg, W, ids, labels, lengths, lora_dict(cfg, P))
        if "policy_logps" not in out:
            out["policy_logps"] = torch.stack([p.detach() for p in pol]).float()
        loss, kl = kto_loss(case, pol, ref)
        loss.backward()
        out[case + ".ref_logps"] = torch.stack(ref).float()
        out[case + ".loss"] = loss.detach().reshape(1).float()
        out[case + ".kl"] = kl.reshape(1).float()
        for k, v in P.items():
            out[case + ".lora." + k] = v.grad.detach().clone()
        print("%-9s loss %.6f kl %.6f" % (case, loss.item(), kl.item()))
    write_safetensors(os.path.join(root, NAME + ".kto.golden.safetensors"), out,
                      {"format": "pt", "source": "tools/make_kto_goldens.py", "config": NAME})


if __name__ == "__main__":
    main()
