#!/usr/bin/env python3
"""Instruction counts of the NEON kernels' inner loops, per multiply-add.

Speed on real ARM hardware cannot be measured under qemu, so the kernels are
judged by what their inner loops execute: for each innermost loop (a backward
branch whose body holds no other backward branch) of the named functions, the
instructions, the loads, and the multiply-adds they do (FMLA .4s: 4, BFMMLA:
16, SDOT .4s: 16, SMLAL .8h: 8, BFDOT .4s: 8 ...; in a loop with integer
products only those count: its FMLAs apply the block scales). A loop without
multiply-adds that stores whole q registers (an element-wise kernel: RMSNorm's
scaling, RoPE, SwiGLU, AdamW's tail...) is counted per f32 element written
instead: 4 per q register stored (STR q, STP q: 8).

Usage: tools/neon_loop_counts.py OBJECT FUNCTION... (objdump from binutils-
aarch64-linux-gnu: aarch64-linux-gnu-objdump). Prints one line per loop that
does multiply-adds; the hot one of a kernel is the one with the most.
"""
import re
import subprocess
import sys

OBJDUMP = "aarch64-linux-gnu-objdump"
LINE = re.compile(r"^\s*([0-9a-f]+):\s+[0-9a-f]{8}\s+(\S+)\s*(.*)$")
# multiply-adds per instruction, by mnemonic and the destination's arrangement
MACS = {
    ("fmla", "4s"): 4, ("fmla", "2s"): 2, ("fmla", "2d"): 2, ("fmla", "8h"): 8, ("fmla", "4h"): 4,
    ("fmla", "s"): 1, ("fmadd", ""): 1,
    ("bfmmla", "4s"): 16, ("bfdot", "4s"): 8, ("bfdot", "2s"): 4,
    ("sdot", "4s"): 16, ("udot", "4s"): 16, ("smmla", "4s"): 32,
    ("smlal", "8h"): 8, ("smlal2", "8h"): 8, ("smull", "8h"): 8, ("smull2", "8h"): 8,
    ("smlal", "4s"): 4, ("smlal2", "4s"): 4,
}


def functions(obj):
    out = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", obj], capture_output=True, text=True, check=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return funcs


def macs(mn, ops):
    arr = re.search(r"v\d+\.(\d+[bhsd])", ops)
    key = (mn, arr.group(1) if arr else ("s" if mn == "fmla" else ""))
    return MACS.get(key, 0)


def loops(ins):
    addr = [a for a, _, _ in ins]
    found = []
    for i, (a, mn, ops) in enumerate(ins):
        if not (mn.startswith("b") and mn not in ("bl", "blr", "br", "bic", "bit", "bif", "bsl", "bfmmla", "bfdot",
                                                   "bfcvt", "bfcvtn", "bfcvtn2", "bfi", "bfxil", "bfmlalb", "bfmlalt")
                or mn in ("cbz", "cbnz", "tbz", "tbnz")):
            continue
        m = re.search(r"\b([0-9a-f]+) <", ops)
        if not m:
            continue
        t = int(m.group(1), 16)
        if t <= a and t in addr:
            found.append((addr.index(t), i))
    inner = [(s, e) for s, e in found if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in found)]
    return inner


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    funcs = functions(sys.argv[1])
    for name in sys.argv[2:]:
        if name not in funcs:
            print(f"{name}: not in {sys.argv[1]}")
            continue
        ins = funcs[name]
        rows = []
        for s, e in loops(ins):
            body = ins[s:e + 1]
            n = len(body)
            # an integer kernel's work is its int8 products (its FMLA apply block scales)
            imac = sum(macs(mn, ops) for _, mn, ops in body if mn[0] in "su")
            mac = imac or sum(macs(mn, ops) for _, mn, ops in body)
            fma_ins = sum(1 for _, mn, ops in body if macs(mn, ops) and (not imac or mn[0] in "su"))
            loads = sum(1 for _, mn, _ in body if mn.startswith("ld"))
            stores = sum(1 for _, mn, _ in body if mn.startswith("st"))
            mix = {}
            for _, mn, _ in body:
                mix[mn] = mix.get(mn, 0) + 1
            mix = " ".join(f"{k}:{v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))
            if mac:
                rows.append((mac, n, fma_ins, loads, stores, body[0][0], mix, "multiply-adds", "FMA"))
                continue
            # f32 elements written: 4 per q register stored
            elems = sum((8 if mn == "stp" else 4) for _, mn, ops in body
                        if mn in ("str", "stp", "stur") and re.match(r"q\d+", ops))
            elems += sum(4 * len(re.findall(r"v\d+\.4s", ops.split("[")[0])) for _, mn, ops in body if mn == "st1")
            if elems:
                rows.append((elems, n, 0, loads, stores, body[0][0], mix, "elements", "element"))
        for mac, n, fma_ins, loads, stores, a, mix, unit, per in sorted(rows, reverse=True):
            print(f"{name:24s} loop@{a:#06x}: {n:3d} instructions ({fma_ins} multiply-add, {loads} load, {stores} "
                  f"store) for {mac:4d} {unit}: {n / mac:.3f} instructions per {per}  [{mix}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
