#!/usr/bin/python3
"""Regenerates tests/data/eval/goldens.json, the reference of tests/test_eval.c.

Run from the repository root with Debian's Python (torch, numpy, jinja2):

    /usr/bin/python3 tools/make_eval_goldens.py

Everything here is computed independently of the C code, for the bundled demo
model demo/stories260K (Hugging Face layout, llama2.c tokenizer.bin, and the
question/answer chat template of its tokenizer_config.json):

  csv_counts   questions per copied CSV as Python's csv module reads it
               (records that are not blank, less the header of C-Eval files);
  choice_ids   the ids of "A".."D": tokenizer.encode(letter)[-1] without
               special tokens, as LLaMA-Factory's evaluator takes them;
  mc           single prompts: LLaMA-Factory's eval template
               (src/llamafactory/eval/template.py: question + "\\nA. .." ..
               + "\\nAnswer:", the system line in front of the first user
               turn, shots answered by the letter) rendered with jinja2 as
               transformers' apply_chat_template does (add_generation_prompt),
               the token ids, the logits of the four choice tokens at the last
               position (reference forward of tools/make_goldens.py) and the
               argmax;
  accuracy     every question of the copied MMLU subjects with n_shot and
               max_length as given (earliest shots dropped until the prompt
               fits): predictions per subject, the smallest gap between the
               best and second choice logit, accuracy per subject, category
               and average;
  loss         mean cross-entropy (Hugging Face shift, -100 ignored) and
               perplexity of tests/data/eval/texts.jsonl as pt reads it
               (BOS + text + EOS, all but BOS supervised) and of
               tests/data/eval/chat.jsonl (assistant spans by the rule of
               tools/make_template_goldens.py, tokens inside a span
               supervised), with the ids and labels.

The tokenizer is llama2.c's run.c encoder in Python: special tokens (<unk>,
<s>, </s>) split out first; each other piece gets the dummy-prefix space, is
split into UTF-8 characters (a character missing from the vocabulary becomes
its bytes, id = byte + 3), and the adjacent pair whose merge has the highest
score is merged (leftmost on ties) until none is in the vocabulary.
"""

import csv
import io
import json
import math
import os
import re
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import hf_forward, read_safetensors  # noqa: E402
from make_template_goldens import assistant_spans, make_env  # noqa: E402

MODEL = "demo/stories260K"
DATA = "tests/data/eval"
OUT = os.path.join(DATA, "goldens.json")
N_SHOT = 2
MAX_LENGTH = 400

CHOICES = "ABCD"
SYSTEM = {
    "en": "The following are multiple choice questions (with answers) about {subject}.\n\n",
    "zh": "以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n",
}
ANSWER = {"en": "\nAnswer:", "zh": "\n答案："}


# ---------------------------------------------------------------- tokenizer

class Llama2cTokenizer:
    SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2}

    def __init__(self, path):
        data = open(path, "rb").read()
        off = 4
        self.pieces, self.scores = [], []
        while off < len(data):
            score, n = struct.unpack_from("<fi", data, off)
            self.pieces.append(data[off + 8:off + 8 + n])
            self.scores.append(score)
            off += 8 + n
        self.index = {}
        for i, p in enumerate(self.pieces):
            self.index.setdefault(p, i)

    def _segment(self, text, base):
        """ids and byte offsets (into the whole text) of one piece without
        special tokens; the dummy-prefix space shares the first character's
        offsets (as a Hugging Face Prepend normalizer aligns it)."""
        if not text:
            return []
        toks = []  # [id, bytes, begin, end]
        pos = base
        chars = [" "] + list(text)
        for i, ch in enumerate(chars):
            b = ch.encode("utf-8")
            if i == 0:
                span = (base, base + len(text[0].encode("utf-8")))
            else:
                span = (pos, pos + len(b))
                pos += len(b)
            if b in self.index:
                toks.append([self.index[b], b, span[0], span[1]])
            else:
                for x in b:
                    toks.append([x + 3, None, span[0], span[1]])
        while True:
            best, at = -1e10, -1
            for i in range(len(toks) - 1):
                if toks[i][1] is None or toks[i + 1][1] is None:
                    continue
                m = self.index.get(toks[i][1] + toks[i + 1][1])
                if m is not None and self.scores[m] > best:
                    best, at = self.scores[m], i
            if at < 0:
                break
            a, b = toks[at], toks[at + 1]
            merged = a[1] + b[1]
            toks[at:at + 2] = [[self.index[merged], merged, min(a[2], b[2]), max(a[3], b[3])]]
        return [(t[0], t[2], t[3]) for t in toks]

    def encode(self, text):
        """[(id, byte_begin, byte_end)] with special tokens parsed."""
        out = []
        pos = 0
        for part in re.split(r"(<unk>|<s>|</s>)", text):
            n = len(part.encode("utf-8"))
            if part in self.SPECIAL:
                out.append((self.SPECIAL[part], pos, pos + n))
            else:
                out += self._segment(part, pos)
            pos += n
        return out

    def ids(self, text):
        return [t[0] for t in self.encode(text)]


# ---------------------------------------------------------------- model

def load_model():
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    W = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    tc = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
    tok = Llama2cTokenizer(os.path.join(MODEL, "tokenizer.bin"))
    tmpl = make_env().from_string(tc["chat_template"])

    def render(messages, add_generation_prompt):
        return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           bos_token=tc["bos_token"], eos_token=tc["eos_token"])
    return cfg, W, tok, render


def last_logits(cfg, W, ids):
    with torch.no_grad():
        return hf_forward(cfg, W, torch.tensor([ids], dtype=torch.long))[0, -1]


# ---------------------------------------------------------------- benchmark files

def read_items(path):
    """Questions of one CSV as dicts question/A/B/C/D/answer (header when the
    first record names question and answer columns, else MMLU's order)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = [r for r in csv.reader(f) if r]
    head = [c.strip().lower() for c in rows[0]]
    if "question" in head and "answer" in head:
        idx = {k: head.index(k.lower()) for k in ["question", "A", "B", "C", "D", "answer"]}
        rows = rows[1:]
    else:
        idx = {k: i for i, k in enumerate(["question", "A", "B", "C", "D", "answer"])}
    return [{k: r[i] for k, i in idx.items()} for r in rows]


def subjects(bench):
    mapping = json.load(open(os.path.join(DATA, bench, "mapping.json")))
    have = {f[:-len("_val.csv")] for f in os.listdir(os.path.join(DATA, bench, "val")) if f.endswith("_val.csv")}
    return [(s, mapping[s]) for s in mapping if s in have]


def format_example(ex, lang):
    return ex["question"] + "".join("\n%s. %s" % (c, ex[c]) for c in CHOICES) + ANSWER[lang]


def messages_for(q, shots, subject, lang):
    msgs = []
    for s in shots:
        msgs.append({"role": "user", "content": format_example(s, lang)})
        msgs.append({"role": "assistant", "content": s["answer"].strip()})
    msgs.append({"role": "user", "content": format_example(q, lang)})
    msgs[0]["content"] = SYSTEM[lang].format(subject=subject) + msgs[0]["content"]
    return msgs


def prompt(render, tok, q, dev, subject, lang, n_shot, max_length):
    """(text, ids, shots used) with the earliest shots dropped until the
    prompt fits; (None, [], 0) when the question alone does not."""
    k_all = min(n_shot, len(dev))
    for k in range(k_all, -1, -1):
        text = render(messages_for(q, dev[k_all - k:k_all], subject, lang), True)
        ids = tok.ids(text)
        if len(ids) <= max_length:
            return text, ids, k
    return None, [], 0


# ---------------------------------------------------------------- loss

def labels_from_spans(toks, spans):
    """data/encode.h's rule: a token [b, e) is inside a span [sb, se) when
    sb <= b and e <= se (zero-width tokens: sb < b <= se)."""
    out = []
    for i, b, e in toks:
        inside = any((sb <= b and e <= se) if b < e else (sb < b <= se) for sb, se in spans)
        out.append(i if inside else -100)
    return out


def loss_of(cfg, W, samples):
    total, n = 0.0, 0
    for ids, labels in samples:
        with torch.no_grad():
            logits = hf_forward(cfg, W, torch.tensor([ids], dtype=torch.long))[0].double()
        tgt = torch.tensor(labels[1:], dtype=torch.long)
        total += F.cross_entropy(logits[:-1], tgt, ignore_index=-100, reduction="sum").item()
        n += int((tgt != -100).sum())
    return {"loss_sum": total, "n_targets": n, "loss": total / n, "perplexity": math.exp(total / n),
            "ids": [s[0] for s in samples], "labels": [s[1] for s in samples]}


def main():
    torch.set_num_threads(1)
    cfg, W, tok, render = load_model()
    g = {"model": MODEL, "n_shot": N_SHOT, "max_length": MAX_LENGTH}

    counts = {}
    for bench in ("mmlu", "ceval"):
        for split in ("dev", "val"):
            folder = os.path.join(DATA, bench, split)
            for f in sorted(os.listdir(folder)):
                counts["%s/%s/%s" % (bench, split, f)] = len(read_items(os.path.join(folder, f)))
    g["csv_counts"] = counts

    choice_ids = [tok.ids(c)[-1] for c in CHOICES]
    g["choice_ids"] = choice_ids

    # single prompts, shown in full
    cases = [("mmlu", "abstract_algebra", 0, 0, "en"), ("mmlu", "abstract_algebra", 1, 2, "en"),
             ("mmlu", "high_school_computer_science", 2, 0, "en"), ("mmlu", "world_religions", 3, 2, "en"),
             ("ceval", "middle_school_geography", 0, 0, "zh"), ("ceval", "computer_network", 1, 1, "zh")]
    mc = []
    for bench, subj, qi, n_shot, lang in cases:
        mapping = json.load(open(os.path.join(DATA, bench, "mapping.json")))
        val = read_items(os.path.join(DATA, bench, "val", subj + "_val.csv"))
        dev = read_items(os.path.join(DATA, bench, "dev", subj + "_dev.csv"))
        text = render(messages_for(val[qi], dev[:n_shot], mapping[subj]["name"], lang), True)
        ids = tok.ids(text)
        case = {"bench": bench, "subject": subj, "question": qi, "n_shot": n_shot, "lang": lang, "prompt": text,
                "ids": ids}
        if len(ids) <= cfg["max_position_embeddings"]:
            lg = last_logits(cfg, W, ids)[choice_ids]
            case["choice_logits"] = lg.tolist()
            case["pred"] = CHOICES[int(torch.argmax(lg))]
        mc.append(case)
    g["mc"] = mc

    # accuracy over the copied MMLU subjects
    acc = {"subjects": {}, "categories": {}}
    total = correct = 0
    min_gap = float("inf")
    for subj, info in subjects("mmlu"):
        val = read_items(os.path.join(DATA, "mmlu", "val", subj + "_val.csv"))
        dev = read_items(os.path.join(DATA, "mmlu", "dev", subj + "_dev.csv"))
        preds, shots, ok = "", [], 0
        for q in val:
            text, ids, k = prompt(render, tok, q, dev, info["name"], "en", N_SHOT, MAX_LENGTH)
            shots.append(k)
            if text is None:
                preds += "-"
                continue
            lg = last_logits(cfg, W, ids)[choice_ids]
            top = torch.sort(lg, descending=True).values
            min_gap = min(min_gap, float(top[0] - top[1]))
            p = CHOICES[int(torch.argmax(lg))]
            preds += p
            ok += p == q["answer"].strip()
        n = sum(c != "-" for c in preds)
        acc["subjects"][subj] = {"predictions": preds, "shots": shots, "correct": ok, "total": n}
        cat = acc["categories"].setdefault(info["category"], {"correct": 0, "total": 0})
        cat["correct"] += ok
        cat["total"] += n
        total += n
        correct += ok
    acc["average"] = {"correct": correct, "total": total, "accuracy": correct / total}
    acc["min_logit_gap"] = min_gap
    g["accuracy"] = acc

    # loss / perplexity
    pt = []
    for line in open(os.path.join(DATA, "texts.jsonl"), encoding="utf-8"):
        body = tok.ids(json.loads(line)["text"])
        pt.append(([1] + body + [2], [-100] + body + [2]))
    chat = []
    for line in open(os.path.join(DATA, "chat.jsonl"), encoding="utf-8"):
        msgs = json.loads(line)["messages"]
        full = render(msgs, False)
        spans = assistant_spans(render, msgs, False)
        toks = tok.encode(full)
        chat.append(([t[0] for t in toks], labels_from_spans(toks, spans)))
    g["loss"] = {"pt": loss_of(cfg, W, pt), "chat": loss_of(cfg, W, chat)}

    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(g, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%s: %d prompts, %d questions (accuracy %.3f, smallest logit gap %.2e), loss pt %.4f chat %.4f" %
          (OUT, len(mc), total, correct / total, min_gap, g["loss"]["pt"]["loss"], g["loss"]["chat"]["loss"]))


if __name__ == "__main__":
    main()
