#!/usr/bin/env python3
"""Prints a merged benchmark JSON (bench/run-attention.sh, bench/run-gemm.sh, python/bench.py or bench/rows.py)
as the README's markdown table: python3 bench/table.py RESULT.json. With --against BASE.json,
prints instead each point both files measured: kiln's ratio to its peer (cuDNN, cuBLAS) in
each, and the change, so a schedule change is judged by ratios from same-run peers, not by
absolute times. With --kiln SIDE, kiln's column is another kiln path of the same run
(python/bench.py's `kiln_<name>` sides), its ratios against the same peers."""
import argparse
import json


PEERS = (("fa4", "FA4"), ("cudnn", "cuDNN"), ("fa2", "FA2"))


def attention(rows, commit):
    # python/bench.py's rows name no tile (the package picks it) and, with --rust, carry
    # kiln's figure from Rust in the same job. FlashAttention-4's columns appear when it ran.
    tiles = all("comptime" in r for r in rows)
    py = any("python_vs_rust" in r for r in rows)
    peers = [(key, label) for key, label in PEERS if key != "fa4" or any("fa4" in r for r in rows)]
    last = ["block_m, block_n"] * tiles + ["Python/Rust"] * py + ["commit"]
    # FlashAttention-4's ratio under sustained timing too (python/bench.py), the issue's target.
    head = [f"{label} | kiln/{label}" + (" | kiln/FA4 sustained" if key == "fa4" else "") for key, label in peers]
    print("| s | d | causal | kiln | " + " | ".join(head + last) + " |")
    print("|---" * (4 + 2 * len(peers) + any(k == "fa4" for k, _ in peers) + len(last)) + "|")
    for r in rows:
        cells = []
        for key, _ in peers:
            p = r.get(key) or {}
            cells += [f"{p.get('tflops', float('nan')):.0f}", f"{r.get('ratio_vs_' + key, float('nan')):.2f}"]
            if key == "fa4":
                cells.append(f"{r.get('ratio_vs_fa4_sustained', float('nan')):.2f}")
        if tiles:
            ct = dict(kv.split("=") for kv in r["comptime"].split(","))
            cells.append(f"{ct.get('block_m', 128)}, {ct.get('block_n', '?')}")
        if py:
            cells.append(f"{r.get('python_vs_rust', float('nan')):.3f}")
        print(f"| {r['s']} | {r['d']} | {str(r['causal']).lower()} | {r['kiln_tflops']:.0f} "
              f"| {' | '.join(cells + [commit])} |")


def gemm(rows, commit):
    print("| M | N | K | kiln | cuBLAS | kiln/cuBLAS | tile (BM, BN, BK, STAGES, CLUSTER_M) | commit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = dict(kv.split("=") for kv in r["comptime"].split(","))
        print(f"| {r['m']} | {r['n']} | {r['k']} | {r['kiln_tflops']:.0f} | {r['cublas_tflops']:.0f} "
              f"| {r['ratio']:.2f} | {c.get('BM', 128)}, {c.get('BN')}, {c.get('BK')}, {c.get('STAGES')}, "
              f"{c.get('CLUSTER_M', 1)} | {commit} |")


def rows_table(rows, commit):
    """bench/rows.py: GB/s sustained (held) per side, the ratios, the fraction of copy_."""
    print("| kernel | dtype | M x N | kiln GB/s | PyTorch GB/s | kiln/PyTorch | of copy_ | kiln err | commit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape = f"{r['m']} x {r['n']}"
        if r.get("skip"):
            print(f"| {r['kernel']} | {r['dtype']} | {shape} | - | - | - | - | {r['skip']} | {commit} |")
            continue

        def gbs(side):
            s = r.get(side) or {}
            if "error" in s:
                return "error"
            if "sustained_gbs" not in s:
                return "-"
            return f"{s['sustained_gbs']:.0f} ({s['held_gbs']:.0f})"

        ratio = (f"{r['ratio_sustained']:.2f} ({r['ratio_held']:.2f})" if "ratio_sustained" in r else "-")
        frac = f"{r['frac_of_copy']:.2f}" if "frac_of_copy" in r else "-"
        err = (r.get("kiln") or {}).get("rel_err")
        err = "-" if err is None else f"{err:.1e}" + ("" if r.get("correct", True) else " WRONG")
        print(f"| {r['kernel']} | {r['dtype']} | {shape} | {gbs('kiln')} | {gbs('torch')} | {ratio} | {frac} "
              f"| {err} | {commit} |")


def point(r):
    """A row's sweep point: (M, N, K) for gemm, (s, d, causal) for attention."""
    return (r["m"], r["n"], r["k"]) if "m" in r else (r["s"], r["d"], r["causal"])


def peer_ratio(r):
    """kiln's throughput over its same-run peer's: cuBLAS for gemm, cuDNN for attention."""
    return r.get("ratio_vs_cudnn", r.get("ratio", float("nan")))


def against(rows, commit, base_rows, base_commit):
    base = {point(r): r for r in base_rows}
    print(f"| point | {base_commit} | {commit} | change |")
    print("|---|---|---|---|")
    for r in rows:
        b = base.get(point(r))
        if b is None:
            continue
        old, new = peer_ratio(b), peer_ratio(r)
        print(f"| {' '.join(str(x).lower() for x in point(r))} | {old:.3f} | {new:.3f} "
              f"| {new / old - 1:+.1%} |")


def with_kiln_side(rows, side):
    """`rows` with kiln's figures and ratios taken from another kiln side of the same run
    (python/bench.py's `kiln_<name>` entries: a path timed beside the default, such as the
    dQ walk before it became the default), against the same peers."""
    out = []
    for r in rows:
        k = r.get(side) or {}
        if "tflops" not in k:
            continue
        r = dict(r, kiln_tflops=k["tflops"], kiln_tflops_sustained=k["tflops_sustained"])
        for key, _ in PEERS:
            p = r.get(key) or {}
            if "tflops" in p:
                r["ratio_vs_" + key] = k["tflops"] / p["tflops"]
                r[f"ratio_vs_{key}_sustained"] = k["tflops_sustained"] / p["tflops_sustained"]
        out.append(r)
    return out


def load(path):
    d = json.load(open(path))
    meta = d["meta"].get("kiln", d["meta"])
    return d, meta, meta.get("commit", "?")[:7]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result", help="a merged benchmark JSON")
    p.add_argument("--against", metavar="BASE", help="compare each point's ratio with BASE's")
    p.add_argument("--kiln", metavar="SIDE", help="kiln's column from this side of the run (kiln_<name>)")
    args = p.parse_args()
    d, meta, commit = load(args.result)
    if args.kiln:
        d["rows"] = with_kiln_side(d["rows"], args.kiln)
    if args.against:
        base, _, base_commit = load(args.against)
        against(d["rows"], commit, base["rows"], base_commit)
        return
    if meta.get("benchmark") == "rows-py":
        rows_table(d["rows"], commit)
        return
    (gemm if meta.get("benchmark") == "gemm" else attention)(d["rows"], commit)


if __name__ == "__main__":
    main()
