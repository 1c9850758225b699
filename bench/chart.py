#!/usr/bin/env python3
"""Draws a benchmark result JSON as a PNG beside it (design.md section 8).

  chart.py RESULT.json [--out RESULT.png]

Accepts bench_gemm's JSON (kiln vs cuBLAS TFLOP/s per shape) and run-attention.sh's merged
JSON (kiln, FlashAttention-2 and cuDNN TFLOP/s over s, one panel per head dim and mask).
Needs matplotlib; without it, prints a note and exits 0 (the JSON is the record).
"""

import argparse
import json
import sys


def gemm_chart(plt, data, title):
    rows = data["rows"]
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5))
    w = 0.4
    ax.bar([i - w / 2 for i in x], [r["kiln_tflops"] for r in rows], w, label="kiln")
    ax.bar([i + w / 2 for i in x], [r["cublas_tflops"] for r in rows], w, label="cuBLAS")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['ratio']:.2f}", (i, max(r["kiln_tflops"], r["cublas_tflops"])),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels, rotation=45, ha="right")
    ax.set_ylabel("TFLOP/s (bf16, 2MNK)")
    ax.set_title(title + " (labels: kiln/cuBLAS)")
    ax.legend()
    return fig


def attention_chart(plt, data, title):
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ai, d in enumerate((64, 128)):
        for ci, causal in enumerate((False, True)):
            ax = axes[ai][ci]
            rows = sorted((r for r in data["rows"] if r["d"] == d and r["causal"] == causal),
                          key=lambda r: r["s"])
            if not rows:
                ax.set_visible(False)
                continue
            s = [r["s"] for r in rows]
            ax.plot(s, [r["kiln_tflops"] for r in rows], "o-", label="kiln")
            for name, label in (("fa2", "FlashAttention-2"), ("cudnn", "cuDNN")):
                pts = [(r["s"], r[name]["tflops"]) for r in rows if r.get(name) and "tflops" in r[name]]
                if pts:
                    ax.plot(*zip(*pts), "s--", label=label)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
            ax.set_ylabel("TFLOP/s")
            ax.set_xlabel("sequence length (b*s = 16384)")
            ax.legend()
    fig.suptitle(title)
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result")
    p.add_argument("--out")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("chart.py: matplotlib is not installed; no PNG drawn", file=sys.stderr)
        return
    with open(args.result) as f:
        data = json.load(f)
    meta = data["meta"]
    if "kiln" in meta:  # merged attention results
        m = meta["kiln"]
        fig = attention_chart(plt, data, f"attention on {m.get('gpu')} ({m.get('commit', '')[:12]}, {m.get('date_utc')})")
    else:
        fig = gemm_chart(plt, data, f"gemm on {meta.get('gpu')} ({meta.get('commit', '')[:12]}, {meta.get('date_utc')})")
    out = args.out or args.result.rsplit(".", 1)[0] + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
