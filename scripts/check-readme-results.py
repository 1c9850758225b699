#!/usr/bin/env python3
"""Checks that every results table in README.md matches the committed JSON it cites.

A table is cited by an HTML comment on the line before its caption (`kiln=SIDE` after the
file: kiln's column is that side of the run, `bench/table.py --kiln SIDE`):

    <!-- results: bench/results/FILE.json -->
    Caption naming the run's commit (7 hex digits) and UTC date (YYYY-MM-DD).

    | s | d | causal | kiln | ... |

Each row is looked up in the JSON by its point (attention: s, d, causal; GEMM: M, N, K; row
kernels: kernel, dtype, M x N) and every figure is compared with the JSON's, rounded as the
table writes it (bench/table.py's format). The caption must name the JSON's commit and date.
Exits 1, naming the README line, on the first kind of mismatch it finds; python3 stdlib only.

  scripts/check-readme-results.py [README.md]
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*results:\s*(\S+)(?:\s+kiln=(\S+))?\s*-->")
sys.path.insert(0, str(ROOT / "bench"))
from table import with_kiln_side  # noqa: E402  (bench/table.py: stdlib only)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def fmt(x, digits):
    return f"{x:.{digits}f}"


ATTENTION_PEERS = {"FA4": "fa4", "cuDNN": "cudnn", "FA2": "fa2"}


def attention_expected(rows, header):
    """s, d, causal -> the table's cells after the point: kiln, then each peer's column and
    ratio in the order the header names them (FA4 with its sustained ratio, cuDNN, FA2)."""
    cols = []
    for name in header[3:]:
        if name in ATTENTION_PEERS:
            cols.append(("tflops", ATTENTION_PEERS[name]))
        elif name.startswith("kiln/") and name[5:] in ATTENTION_PEERS:
            cols.append(("ratio", "ratio_vs_" + ATTENTION_PEERS[name[5:]]))
        elif name == "kiln/FA4 sustained":
            cols.append(("ratio", "ratio_vs_fa4_sustained"))
    out = {}
    for r in rows:
        want = [fmt(r["kiln_tflops"], 0)]
        for what, key in cols:
            if what == "tflops":
                want.append(fmt((r.get(key) or {}).get("tflops", float("nan")), 0))
            else:
                want.append(fmt(r.get(key, float("nan")), 2))
        out[(str(r["s"]), str(r["d"]), str(r["causal"]).lower())] = want
    return out, 3


def gemm_expected(rows, header):
    """M, N, K -> kiln, cuBLAS, kiln/cuBLAS."""
    out = {}
    for r in rows:
        out[(str(r["m"]), str(r["n"]), str(r["k"]))] = [
            fmt(r["kiln_tflops"], 0),
            fmt(r["cublas_tflops"], 0),
            fmt(r["ratio"], 2),
        ]
    return out, 3


def rows_expected(rows, header):
    """kernel, dtype, M x N -> kiln GB/s, PyTorch GB/s, kiln/PyTorch."""
    out = {}
    for r in rows:
        torch = r.get("torch") or {}
        if "kiln_gbs" not in r or "gbs" not in torch:
            continue
        out[(r["kernel"], r["dtype"], f"{r['m']} x {r['n']}")] = [
            fmt(r["kiln_gbs"], 0),
            fmt(torch["gbs"], 0),
            fmt(r["ratio"], 2),
        ]
    return out, 3


KINDS = {
    "s": ("attention", attention_expected),
    "M": ("gemm", gemm_expected),
    "kernel": ("rows", rows_expected),
}


def check(readme):
    lines = readme.read_text().splitlines()
    errors, tables = [], 0
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if not m:
            continue
        rel = m.group(1)
        path = ROOT / rel
        where = f"{readme.name}:{i + 1}"
        if not path.is_file():
            errors.append(f"{where}: cites {rel}, which is not in the repository")
            continue
        data = json.loads(path.read_text())
        if m.group(2):
            data["rows"] = with_kiln_side(data["rows"], m.group(2))
        meta = data["meta"].get("kiln", data["meta"])
        commit, date = meta.get("commit", "")[:7], meta.get("date_utc", "")[:10]
        # The caption: the text between the marker and the table.
        j = i + 1
        caption = []
        while j < len(lines) and not lines[j].lstrip().startswith("|"):
            caption.append(lines[j])
            j += 1
        caption = " ".join(caption)
        if commit not in caption or date not in caption:
            errors.append(f"{where}: the caption must name {rel}'s commit {commit} and date {date}")
        if j >= len(lines):
            errors.append(f"{where}: no table follows the citation of {rel}")
            continue
        header = cells(lines[j])
        kind = KINDS.get(header[0])
        if kind is None:
            errors.append(f"{readme.name}:{j + 1}: a table whose first column is `{header[0]}` "
                          f"(expected one of {', '.join(KINDS)})")
            continue
        name, expected_of = kind
        expected, key_len = expected_of(data["rows"], header)
        tables += 1
        k = j + 2  # past the header and its |---| line
        count = 0
        while k < len(lines) and lines[k].lstrip().startswith("|"):
            row = cells(lines[k])
            key = tuple(row[:key_len])
            want = expected.get(key)
            if want is None:
                errors.append(f"{readme.name}:{k + 1}: {name} point {' '.join(key)} is not in {rel}")
            else:
                have = row[key_len:key_len + len(want)]
                if have != want:
                    cols = header[key_len:key_len + len(want)]
                    diff = ", ".join(f"{c}: README {h}, JSON {w}"
                                     for c, h, w in zip(cols, have, want) if h != w)
                    errors.append(f"{readme.name}:{k + 1}: {name} point {' '.join(key)} "
                                  f"differs from {rel} ({diff})")
            count += 1
            k += 1
        if count == 0:
            errors.append(f"{where}: the {name} table citing {rel} has no rows")
    return errors, tables


def main():
    readme = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "README.md"
    errors, tables = check(readme)
    if errors:
        print("README results do not match the JSON they cite:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        sys.exit(1)
    if tables == 0:
        print(f"{readme.name}: no results table cites a JSON (`<!-- results: FILE -->`)",
              file=sys.stderr)
        sys.exit(1)
    print(f"{readme.name}: {tables} results tables match their JSON")


if __name__ == "__main__":
    main()
