#!/usr/bin/python3
"""Makes the trimmed tokenizer files of tests/data/tokenizers/ from the full
files in ../shared/data (run by hand from the repo root:
/usr/bin/python3 tests/data/tokenizers/trim.py [SHARED_DATA_DIR]).

Why trimming keeps the results exact: BPE can only ever use a token, and a
merge can only ever fire, if the token's text (the merge's result) occurs in
the text being encoded. So a vocabulary cut down to the tokens whose text
(bytes, with "▁" read as a space) occurs somewhere in the test corpus, and
the merges among them, in their original order and with their original ids,
encodes every string of that corpus exactly as the full file does. Byte
tokens (<0xXX> and the 256 byte-level characters) and added tokens are always
kept. Nothing else in the files changes, except where noted (tinyllama).

The corpus is every string the tests encode with these files: the llama.cpp
vector inputs (*.inp here) and the Mistral vectors' texts.
"""
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../../shared/data")
SEP = "\n__ggml_vocab_test__\n"


def read_inp(path):
    text = open(path, encoding="utf-8").read()
    parts = text.split(SEP)
    return parts[:-1] if parts and parts[-1] == "" else parts


def corpus_strings():
    out = []
    for f in sorted(os.listdir(HERE)):
        if f.endswith(".inp"):
            out += read_inp(os.path.join(HERE, f))
    vec = json.load(open(os.path.join(HERE, "mistral-v0.3/vectors.json"), encoding="utf-8"))
    out += [c["text"] for c in vec["cases"] + vec["special_cases"]]
    return out


STRINGS = corpus_strings()
# Raw, NFC and NFKC forms, each also with a leading space (prefix spaces).
CORPUS = "\x00".join(
    v for s in STRINGS for f in (s, unicodedata.normalize("NFC", s), unicodedata.normalize("NFKC", s)) for v in (f, " " + f)
).encode("utf-8")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


U2B = bytes_to_unicode()


def token_bytes(tok, byte_level):
    if byte_level:
        if all(ch in U2B for ch in tok):
            return bytes(U2B[ch] for ch in tok)
        return tok.encode("utf-8")
    return tok.replace("\u2581", " ").encode("utf-8")


def keep_token(tok, byte_level):
    if byte_level and len(tok) == 1 and tok in U2B:
        return True
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        return True
    return token_bytes(tok, byte_level) in CORPUS


def split_merge(m):
    if isinstance(m, list):
        return m
    parts = m.split(" ")
    # A merge with more than one space is ambiguous (HF refuses such a file);
    # it is kept whole so that the loader's error shows in the tests.
    return parts if len(parts) == 2 else (m, "")


def trim_vocab_merges(vocab, merges, byte_level, always=()):
    kept = {t: i for t, i in vocab.items() if keep_token(t, byte_level) or t in always}
    new_merges = []
    for m in merges:
        a, b = split_merge(m)
        if (a in kept and b in kept and (a + b) in kept) or b == "":
            new_merges.append(m)
    return kept, new_merges


def trim_tokenizer_json(src, dst, byte_level, patch=None):
    d = json.load(open(src, encoding="utf-8"))
    always = {a["content"] for a in d.get("added_tokens", [])}
    m = d["model"]
    n0, m0 = len(m["vocab"]), len(m["merges"])
    m["vocab"], m["merges"] = trim_vocab_merges(m["vocab"], m["merges"], byte_level, always)
    if patch:
        patch(d)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{dst}: vocab {n0} -> {len(m['vocab'])}, merges {m0} -> {len(m['merges'])}")


def trim_vocab_files(src_vocab, src_merges, dst_vocab, dst_merges):
    vocab = json.load(open(src_vocab, encoding="utf-8"))
    lines = open(src_merges, encoding="utf-8").read().split("\n")
    header = [l for l in lines[:1] if l.startswith("#version")]
    merges = [l.rstrip("\r") for l in lines[len(header):] if l.strip()]
    kept, new_merges = trim_vocab_merges(vocab, merges, True, {"<|endoftext|>"})
    os.makedirs(os.path.dirname(dst_vocab), exist_ok=True)
    with open(dst_vocab, "w", encoding="utf-8") as f:
        json.dump(kept, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    with open(dst_merges, "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in header + new_merges))
    print(f"{dst_vocab}: vocab {len(vocab)} -> {len(kept)}, merges {len(merges)} -> {len(new_merges)}")


def tinyllama_patch(d):
    # A Llama 2 tokenizer.json as TinyLlama ships it: the Llama 2 vocabulary
    # and merges (taken from the Phi-3 file: the Llama 2 copy in shared/ has
    # its U+00A0 characters turned into plain spaces, which makes 3 merges
    # ambiguous), Llama 2's <unk> <s> </s> matched before normalization
    # (normalized: false) and its BOS template.
    llama2 = json.load(open(os.path.join(SHARED, "tokenizers/llama2/tokenizer.json"), encoding="utf-8"))
    d["added_tokens"] = llama2["added_tokens"]
    for a in d["added_tokens"]:
        a["normalized"] = False
    d["post_processor"] = llama2["post_processor"]


def main():
    T = os.path.join(SHARED, "tokenizers")
    trim_tokenizer_json(f"{T}/qwen3-full/tokenizer.json", f"{HERE}/qwen3/tokenizer.json", True)
    trim_tokenizer_json(f"{T}/llama3-full/tokenizer.json", f"{HERE}/llama3/tokenizer.json", True)
    trim_tokenizer_json(f"{T}/falcon/tokenizer.json", f"{HERE}/falcon/tokenizer.json", True)
    trim_tokenizer_json(f"{T}/llama2/tokenizer.json", f"{HERE}/llama2/tokenizer.json", False)
    trim_tokenizer_json(f"{T}/phi-3-mini/tokenizer.json", f"{HERE}/tinyllama/tokenizer.json", False, tinyllama_patch)
    trim_tokenizer_json(f"{T}/phi-3-mini/tokenizer.json", f"{HERE}/phi-3/tokenizer.json", False)
    trim_tokenizer_json(f"{T}/mistral-7b-instruct-v0.3/tokenizer.json", f"{HERE}/mistral-v0.3/tokenizer.json", False)
    trim_vocab_files(f"{T}/gpt2/vocab.json", f"{T}/gpt2/merges.txt", f"{HERE}/gpt2/vocab.json", f"{HERE}/gpt2/merges.txt")
    trim_vocab_files(f"{T}/qwen2/vocab.json", f"{T}/qwen2/merges.txt", f"{HERE}/qwen2/vocab.json", f"{HERE}/qwen2/merges.txt")
    trim_vocab_files(f"{T}/llama3/encoder.json", f"{T}/llama3/vocab.bpe", f"{HERE}/llama3-bpe/encoder.json",
                     f"{HERE}/llama3-bpe/vocab.bpe")


if __name__ == "__main__":
    main()
