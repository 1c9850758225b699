#!/usr/bin/env python3
"""Draws a benchmark result JSON as a PNG beside it (docs/benchmarking.md).

  chart.py RESULT.json [--out RESULT.png]

Accepts bench_gemm's JSON (kiln vs cuBLAS TFLOP/s per shape), run-attention.sh's merged
JSON (kiln, FlashAttention-2 and cuDNN TFLOP/s over s, one panel per head dim measured and
mask) and
bench/rows.py's (kiln vs PyTorch GB/s per kernel, shape and dtype, sustained and held, the
copy row and the HBM peak as lines).
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
    # One row of panels per head dim the run measured (non-causal, causal), so no measured
    # point is left out of the picture.
    dims = sorted({r["d"] for r in data["rows"]})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 4 * len(dims)), sharex=True, squeeze=False)
    for ai, d in enumerate(dims):
        for ci, causal in enumerate((False, True)):
            ax = axes[ai][ci]
            rows = sorted((r for r in data["rows"] if r["d"] == d and r["causal"] == causal),
                          key=lambda r: r["s"])
            if not rows:
                ax.set_visible(False)
                continue
            s = [r["s"] for r in rows]
            ax.plot(s, [r["kiln_tflops"] for r in rows], "o-", label="kiln")
            for name, label in (("fa4", "FlashAttention-4"), ("fa2", "FlashAttention-2"), ("cudnn", "cuDNN")):
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


def rows_chart(plt, data, title):
    rows = [r for r in data["rows"] if r["kernel"] != "copy" and ("kiln" in r or "torch" in r)]
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    fig, axes = plt.subplots(len(kernels), 1, figsize=(13, 2.6 * len(kernels)), squeeze=False)
    copy = {(r["dtype"], r["m"], r["n"]): r.get("torch", {}).get("sustained_gbs")
            for r in data["rows"] if r["kernel"] == "copy"}
    peak = data["meta"].get("peak_gbs")
    for ax, kernel in zip(axes[:, 0], kernels):
        pts = [r for r in rows if r["kernel"] == kernel]
        labels = [f"{r['dtype']} {r['m']}x{r['n']}" for r in pts]
        x = range(len(pts))
        w = 0.2
        for off, side, timing, hatch in ((-1.5, "kiln", "sustained", None), (-0.5, "kiln", "held", "//"),
                                         (0.5, "torch", "sustained", None), (1.5, "torch", "held", "//")):
            vals = [r.get(side, {}).get(f"{timing}_gbs", 0) or 0 for r in pts]
            ax.bar([i + off * w for i in x], vals, w, label=f"{'kiln' if side == 'kiln' else 'PyTorch'} {timing}",
                   color="C0" if side == "kiln" else "C1", hatch=hatch, alpha=1.0 if timing == "sustained" else 0.6)
        cp = [copy.get((r["dtype"], r["m"], r["n"])) for r in pts]
        ax.plot(list(x), [c or float("nan") for c in cp], "k_", markersize=18, label="copy_ (sustained)")
        if peak:
            ax.axhline(peak, color="grey", lw=0.8, ls="--")
            ax.axhline(0.8 * peak, color="grey", lw=0.8, ls=":")
        for i, r in enumerate(pts):
            if "ratio_sustained" in r:
                ax.annotate(f"{r['ratio_sustained']:.2f}", (i, (r["kiln"]["sustained_gbs"] or 0)), ha="center",
                            va="bottom", fontsize=7)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{kernel} (labels: kiln/PyTorch sustained; dashed: HBM peak, dotted: 80%)", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=5)
    # The run's title above the first panel's (a suptitle would overlap it after tight_layout).
    axes[0, 0].set_title(f"{title}\n{axes[0, 0].get_title()}", fontsize=9)
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
    if meta.get("benchmark") == "rows-py":
        fig = rows_chart(plt, data, f"row kernels on {meta.get('gpu')} ({meta.get('commit', '')[:12]}, {meta.get('date_utc')})")
    elif "kiln" in meta:  # merged attention results
        m = meta["kiln"]
        what = {"attention-backward-python": "attention backward",
                "attention-fwd-bwd-python": "attention forward + backward"}.get(m.get("benchmark"), "attention")
        fig = attention_chart(plt, data, f"{what} on {m.get('gpu')} ({m.get('commit', '')[:12]}, {m.get('date_utc')})")
    else:
        fig = gemm_chart(plt, data, f"gemm on {meta.get('gpu')} ({meta.get('commit', '')[:12]}, {meta.get('date_utc')})")
    out = args.out or args.result.rsplit(".", 1)[0] + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
