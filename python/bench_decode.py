#!/usr/bin/env python3
"""kiln_attn.flash_attn_with_kvcache beside FlashAttention-4's paged decode, in one process.

  python3 -P python/bench_decode.py [--out RESULT.json] [--quick] [--iters N] [--warmup N]
                                    [--max-cache-gib G] [--interpret]

Decode points: batch 1..256, cache 1k..128k keys per sequence (every sequence full), 1 or 4
new query tokens (causal, bottom-right), GQA 32/8 and MQA 32/1, d = 128, bf16, the cache dense
or paged in 128-key pages (a shuffled page table). kiln runs `flash_attn_with_kvcache` with
`num_splits=0` (its own split-KV choice); FlashAttention-4 runs `flash_attn.cute.
flash_attn_varlen_func` with `page_table` (or the dense cache), `seqused_k` and `num_splits=0`
(its heuristic) where it imports. Each call is timed back to back with the L2 flushed between
calls (CUDA-event median); GB/s counts the cache bytes a call must read (K and V of every
sequence's keys) over its time, against the H200's 4.8 TB/s. kiln's output is checked against
FlashAttention-4's (relative norm error below 2e-2; exit 1 otherwise). Points whose caches
exceed --max-cache-gib are skipped. The JSON (meta: commit, GPU, driver, date) and, with
matplotlib, a PNG beside it. `--interpret`: kiln alone on the CPU interpreter, tiny shapes, to
check the harness without a GPU.
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from peers import commit, hbm_peak, rel_error  # noqa: E402

TOLERANCE = 2e-2
D = 128
PAGE = 128
HEADS = [(32, 8), (32, 1)]
BATCHES = [1, 4, 16, 64, 256]
CACHES = [1024, 4096, 16384, 32768, 65536, 131072]
Q_TOKENS = [1, 4]


def points(quick, max_bytes):
    for hq, hk in HEADS:
        for paged in (True, False):
            for b in BATCHES[::2] if quick else BATCHES:
                for n in CACHES[::2] if quick else CACHES:
                    for sq in Q_TOKENS:
                        cache_bytes = 2 * b * n * hk * D * 2
                        if cache_bytes <= max_bytes:
                            yield {"batch": b, "cache_len": n, "q_tokens": sq, "heads_q": hq, "heads_kv": hk,
                                   "paged": paged, "page_size": PAGE if paged else 0, "d": D,
                                   "cache_bytes": cache_bytes}


def inputs(torch, p, dev, gen):
    """q, the caches (dense (b, n, hk, d) or paged (pages, PAGE, hk, d)), the page table
    (None when dense) and the lengths."""
    b, n, hk, sq = p["batch"], p["cache_len"], p["heads_kv"], p["q_tokens"]
    rand = lambda *shape: (torch.rand(shape, generator=gen, device=dev) * 2 - 1).to(torch.bfloat16)  # noqa: E731
    q = rand(b, sq, p["heads_q"], D)
    if p["paged"]:
        per_seq = n // PAGE
        k, v = rand(b * per_seq, PAGE, hk, D), rand(b * per_seq, PAGE, hk, D)
        table = torch.randperm(b * per_seq, generator=gen, device=dev).to(torch.int32).reshape(b, per_seq)
    else:
        k, v = rand(b, n, hk, D), rand(b, n, hk, D)
        table = None
    lens = torch.full((b,), n, dtype=torch.int32, device=dev)
    return q, k, v, table, lens


def fa4_decode():
    """FlashAttention-4's varlen forward (its paged decode path), or None."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # ImportError, and the CuTe DSL's own failures as it loads
        print(f"FlashAttention-4 not timed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return flash_attn_varlen_func


def timed(torch, once, iters, warmup, flush, interpret):
    for _ in range(warmup):
        once()
    if interpret:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            once()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda.synchronize()
    for i in range(iters):
        flush.zero_()
        starts[i].record()
        once()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="every other batch and cache length")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-cache-gib", type=float, default=32.0)
    ap.add_argument("--interpret", action="store_true", help="kiln alone on the CPU interpreter, tiny shapes")
    args = ap.parse_args()

    import torch
    import kiln_attn

    global D, PAGE, BATCHES, CACHES, HEADS
    if args.interpret:
        D, PAGE, BATCHES, CACHES, HEADS = 32, 16, [1, 3], [64, 160], [(4, 2)]
        dev, fa4, flush = torch.device("cpu"), None, None
    else:
        dev = torch.device("cuda")
        fa4 = fa4_decode()
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20)
        flush = torch.empty(2 * l2, dtype=torch.int8, device=dev)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or os.path.join(HERE, "results", f"decode-py-{stamp:%Y%m%dT%H%MZ}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = {"benchmark": "decode-python", "commit": commit(), "date_utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__}
    hbm = None
    if dev.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(dev)
        meta["hbm_bytes_per_s"] = hbm = hbm_peak(meta["gpu"])
        meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.strip().split("\n")[0]
    rows, wrong = [], []
    gen = torch.Generator(device=dev).manual_seed(0)
    ctx = kiln_attn.interpreter() if args.interpret else None
    if ctx is not None:
        ctx.__enter__()
    for p in points(args.quick, args.max_cache_gib * (1 << 30)):
        q, k, v, table, lens = inputs(torch, p, dev, gen)

        def kiln_once():
            return kiln_attn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, causal=True,
                                                     num_splits=0)

        row = dict(p)
        row["kiln_ms"] = ms = timed(torch, kiln_once, args.iters, args.warmup, flush, args.interpret)
        row["kiln_gbps"] = p["cache_bytes"] / (ms * 1e-3) / 1e9
        if hbm:
            row["kiln_hbm_fraction"] = p["cache_bytes"] / (ms * 1e-3) / hbm
        if fa4 is not None:
            try:
                def fa4_once():
                    return fa4(q, k, v, seqused_k=lens, page_table=table, causal=True, num_splits=0)[0]

                fms = timed(torch, fa4_once, args.iters, args.warmup, flush, False)
                row["fa4_ms"], row["fa4_gbps"] = fms, p["cache_bytes"] / (fms * 1e-3) / 1e9
                row["ratio_vs_fa4"] = fms / ms
                row["rel_error"] = rel_error(kiln_once(), fa4_once())
                row["correct"] = row["rel_error"] < TOLERANCE
                if not row["correct"]:
                    wrong.append(row)
            except Exception as e:  # a peer that refuses a point is recorded, not fatal
                row["fa4_error"] = (str(e).splitlines() or [repr(e)])[0]
        rows.append(row)
        print(json.dumps({k: row[k] for k in row if not k.endswith("_bytes")}), file=sys.stderr, flush=True)
        with open(out, "w") as f:  # after each point, so a run cut short keeps what it measured
            json.dump({"meta": meta, "iters": args.iters, "warmup": args.warmup, "rows": rows}, f, indent=1)
        del q, k, v, table, lens
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if ctx is not None:
        ctx.__exit__(None, None, None)
    print(f"wrote {out}", file=sys.stderr)
    draw(out, rows, hbm)
    if wrong:
        print(f"{len(wrong)} points differ from FlashAttention-4 beyond {TOLERANCE}", file=sys.stderr)
        sys.exit(1)


def draw(path, rows, hbm):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_decode: matplotlib is not installed; no PNG drawn", file=sys.stderr)
        return
    panels = sorted({(r["heads_q"], r["heads_kv"], r["paged"], r["q_tokens"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), sharey=True, squeeze=False)
    for ax, (hq, hk, paged, sq) in zip(axes[0], panels):
        pts = [r for r in rows if (r["heads_q"], r["heads_kv"], r["paged"], r["q_tokens"]) == (hq, hk, paged, sq)]
        for b in sorted({r["batch"] for r in pts}):
            mine = sorted((r for r in pts if r["batch"] == b), key=lambda r: r["cache_len"])
            xs = [r["cache_len"] for r in mine]
            line, = ax.plot(xs, [r["kiln_gbps"] for r in mine], "o-", label=f"kiln b={b}")
            if any("fa4_gbps" in r for r in mine):
                ax.plot(xs, [r.get("fa4_gbps", math.nan) for r in mine], "x--", color=line.get_color(),
                        label=f"FA4 b={b}")
        if hbm:
            ax.axhline(hbm / 1e9 * 0.8, color="gray", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{hq}/{hk} heads, {'paged' if paged else 'dense'}, {sq} token(s)")
        ax.set_xlabel("cache length")
    axes[0][0].set_ylabel("GB/s of cache read (dotted: 80% of HBM)")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.splitext(path)[0] + ".png", dpi=100)


if __name__ == "__main__":
    main()
