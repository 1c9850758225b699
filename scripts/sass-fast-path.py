#!/usr/bin/env python3
"""Counts the SASS instructions a thread executes on a kernel's fast path: from the entry,
following fall-through and unconditional branches and never a conditional one (the guarded
vector accesses branch to their edge paths only when some lane is on a tile's edge), up to
the first unconditional EXIT. Prints the count and the most frequent opcodes.

  kiln ptx softmax --sass --target sm_90a -D dtype=bf16 -D BM=1 -D BN=8192 -D NW=8 > s.sass
  scripts/sass-fast-path.py s.sass

A loop on the path is walked once per unconditional back edge it meets, so read the figure
for straight-line kernels (the row kernels' one-pass branch).
"""

import collections
import re
import sys


def main(path):
    ins, labels = [], {}
    for line in open(path):
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"^\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(m.group(1))
    counts, pc, steps = collections.Counter(), 0, 0
    while pc < len(ins) and steps < 100_000:
        steps += 1
        text = ins[pc]
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
        if op == "EXIT" and not text.startswith("@"):
            break
        counts[op.split(".")[0]] += 1
        jump = re.match(r"^(@!?P\d\s+)?BRA\s+`\((\.L_x_\d+)\)", text)
        pc = labels[jump.group(2)] if jump and jump.group(1) is None else pc + 1
    print(sum(counts.values()), counts.most_common(14))


if __name__ == "__main__":
    main(sys.argv[1])
