#!/usr/bin/env python3
"""Compares two builds of kiln measured in one job (an A/B of a change).

  ab.py OUT.json --new A1.json [A2.json ..] --base B1.json [B2.json ..]

Each input is a bench_attention or bench_gemm JSON of the same sweep; the new and the base
runs should alternate in the job (new, base, new, base) so that clocks and heat treat both
alike. Writes OUT.json (both builds' commits, the GPU, each point's medians per run, the
base/new time ratio of the mean medians, and each build's run-to-run spread) and a PNG beside
it (with matplotlib), and prints the table.
"""

import argparse
import json
import statistics


def point(row):
    """A sweep point's key: (s, d, causal, b, h) for attention, (m, n, k) for gemm."""
    if "s" in row:
        return (row["s"], row["d"], row["causal"], row["b"], row["h"])
    return (row["m"], row["n"], row["k"])


def medians(paths):
    """Per point, the kiln median (ms) of each run, and the runs' meta."""
    runs = [json.load(open(p)) for p in paths]
    points = [point(r) for r in runs[0]["rows"]]
    table = {k: [] for k in points}
    for run in runs:
        for r in run["rows"]:
            table[point(r)].append(r["kiln_ms_median"])
    return table, [run["meta"] for run in runs]


def spread(xs):
    """Largest minus smallest, over the mean."""
    return (max(xs) - min(xs)) / statistics.mean(xs) if len(xs) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--base", nargs="+", required=True)
    args = ap.parse_args()
    new, new_meta = medians(args.new)
    base, base_meta = medians(args.base)
    rows = []
    for k, n in new.items():
        b = base[k]
        rows.append({
            "point": list(k),
            "new_ms": n,
            "base_ms": b,
            "base_over_new": statistics.mean(b) / statistics.mean(n),
            "spread_new": spread(n),
            "spread_base": spread(b),
        })
    ratios = [r["base_over_new"] for r in rows]
    spreads = [x for r in rows for x in (r["spread_new"], r["spread_base"])]
    summary = {
        "median_base_over_new": statistics.median(ratios),
        "min_base_over_new": min(ratios),
        "max_base_over_new": max(ratios),
        "median_spread": statistics.median(spreads),
        "max_spread": max(spreads),
    }
    result = {"new": new_meta[0], "base": base_meta[0], "runs": [len(args.new), len(args.base)],
              "rows": rows, "summary": summary}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(r["point"], " ".join(f"{x:.4f}" for x in r["new_ms"]), "|",
              " ".join(f"{x:.4f}" for x in r["base_ms"]), f"base/new {r['base_over_new']:.4f}")
    print(json.dumps(summary))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG (the JSON is the record)")
        return
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.7), 4))
    x = range(len(rows))
    ax.bar(x, [r - 1 for r in ratios], bottom=1, color="tab:blue", label="base / new time")
    ax.errorbar(x, [1] * len(rows), yerr=[max(r["spread_new"], r["spread_base"]) for r in rows],
                fmt="none", ecolor="gray", capsize=3, label="run-to-run spread")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xticks(list(x), [":".join(str(v) for v in r["point"]) for r in rows], rotation=45,
                  ha="right", fontsize=7)
    ax.set_ylabel("base time / new time (>1: new faster)")
    ax.set_title(f"{new_meta[0]['benchmark']} A/B on {new_meta[0]['gpu']}: "
                 f"{new_meta[0]['commit'][:7]} vs {base_meta[0]['commit'][:7]}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out.rsplit(".", 1)[0] + ".png", dpi=110)


if __name__ == "__main__":
    main()
