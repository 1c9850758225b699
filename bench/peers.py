#!/usr/bin/env python3
"""Attention peers for kiln's benchmark, and the merge of both into one table.

  peers.py run --out peers.json [--quick] [--iters N] [--warmup N]
      PyTorch SDPA with the FLASH_ATTENTION backend (FlashAttention-2) and the cuDNN backend
      over the standard sweep (docs/benchmarking.md): bf16, b*s = 16384, h = 2048/d,
      s in {1k..16k}, d in {64, 128, 256}, causal and not. Each run is timed alone with
      CUDA events after warm-up, behind a GPU hold so the interval is GPU time without the
      launch latency, rotating over input sets that together exceed twice the L2; the median
      is reported. A backend that refuses a configuration is recorded with its error.

  peers.py merge kiln.json peers.json --out attention.json
      One table (kiln, FA2, cuDNN: ms, TFLOP/s, ratio = kiln / peer throughput) and one JSON
      with both runs' metadata and every figure.

FLOPs: 4*b*h*s*s*d, halved when causal. Causal is top-left = bottom-right here (sq = sk).
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

TOKENS = 16384
WIDTH = 2048


def commit():
    """The commit of the code that runs: KILN_COMMIT where set (the GPU host's copy runs the
    bundle's wheel, whose commit scripts/gpu-check.sh passes; that copy's git may be older),
    else the checkout's."""
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("KILN_COMMIT", "")


def rel_error(out, ref):
    """Relative norm error of tensor `out` against `ref`; NaN if `out` has a non-finite
    element."""
    out, ref = out.float(), ref.float()
    if not bool(out.isfinite().all()):
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# HBM bandwidth by the spec sheets, bytes per second, for the GPU names torch reports.
HBM_PEAKS = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM5, 80 GB HBM3
)


def hbm_peak(gpu_name):
    """The HBM bandwidth (bytes/s) of the GPU named `gpu_name`, or None for one not listed
    (its runs then report no fraction of the peak)."""
    return next((peak for key, peak in HBM_PEAKS if key in gpu_name), None)


def sweep(quick):
    seqs = [1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384]
    return [(s, d, causal) for d in (64, 128, 256) for causal in (False, True) for s in seqs]


# GPU cycles the stream is held before a timed call's start event (about 0.5 ms): longer than
# any host path takes to enqueue the call, so the interval is the call's GPU time alone, as
# kiln's Rust harness measures it (`Device::time`, `kiln_runtime::timing::HOLD_NS`).
HOLD_CYCLES = 1_000_000


def hold(torch):
    """Keeps the current stream busy for HOLD_CYCLES, so what is enqueued next waits for it."""
    torch.cuda._sleep(HOLD_CYCLES)


def parse_only(text):
    """`8192:128:false,...` as (s, d, causal) points."""
    points = []
    for p in text.split(","):
        s, d, c = p.split(":")
        points.append((int(s), int(d), c == "true"))
    return points


def flops(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def run(args):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    backends = [("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    configs = [c for c in sweep(args.quick) if not args.only or c in parse_only(args.only)]
    rows = []
    total = len(configs) * len(backends)
    step = 0
    for s, d, causal in configs:
        b, h = TOKENS // s, WIDTH // d
        set_bytes = 4 * b * h * s * d * 2
        sets = max(2, min(8, math.ceil(2 * l2 / set_bytes)))
        gen = torch.Generator(device=dev).manual_seed(s * 1000 + d * 10 + int(causal))
        inputs = [
            tuple(
                (torch.rand((b, h, s, d), generator=gen, device=dev, dtype=torch.float32) * 2 - 1).to(
                    torch.bfloat16
                )
                for _ in range(3)
            )
            for _ in range(sets)
        ]
        for name, backend in backends:
            step += 1
            print(f"\r\x1b[2K[{step}/{total}] {name} s={s} d={d} causal={causal}", end="", file=sys.stderr, flush=True)
            row = {"s": s, "d": d, "causal": causal, "b": b, "h": h, "backend": name,
                   "flops": flops(b, h, s, d, causal), "input_sets": sets}
            try:
                with sdpa_kernel([backend]):
                    def once(i):
                        q, k, v = inputs[i % sets]
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    for i in range(args.warmup):
                        once(i)
                    torch.cuda.synchronize()
                    times = []
                    for i in range(args.iters):
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        hold(torch)
                        start.record()
                        once(args.warmup + i)
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end))
                med = statistics.median(times)
                row.update(ms_median=med, ms_min=min(times), ms_all=times,
                           tflops=row["flops"] / (med * 1e-3) / 1e12)
            except RuntimeError as e:
                row["error"] = str(e).splitlines()[0] if str(e) else repr(e)
            rows.append(row)
        del inputs
        torch.cuda.empty_cache()
    print(file=sys.stderr)
    meta = {
        "benchmark": "attention-peers",
        "gpu": torch.cuda.get_device_name(dev),
        "compute_capability": "%d.%d" % torch.cuda.get_device_capability(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "iters": args.iters, "warmup": args.warmup, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


def merge(args):
    with open(args.kiln) as f:
        kiln = json.load(f)
    with open(args.peers) as f:
        peers = json.load(f)
    peer_rows = {(r["s"], r["d"], r["causal"], r["backend"]): r for r in peers["rows"]}
    header = ["s", "d", "causal", "kiln ms", "kiln TF/s", "FA2 ms", "FA2 TF/s", "kiln/FA2",
              "cuDNN ms", "cuDNN TF/s", "kiln/cuDNN", "kiln err"]
    table = [header]
    merged = []
    for r in kiln["rows"]:
        key = (r["s"], r["d"], r["causal"])
        out = dict(r)
        cells = [str(r["s"]), str(r["d"]), str(r["causal"]).lower(),
                 f"{r['kiln_ms_median']:.3f}", f"{r['kiln_tflops']:.1f}"]
        for name in ("fa2", "cudnn"):
            p = peer_rows.get(key + (name,))
            if p is None or "error" in p:
                out[name] = p
                cells += ["-", "-", "-"]
                continue
            ratio = r["kiln_tflops"] / p["tflops"]
            out[name] = {k: p[k] for k in ("ms_median", "ms_min", "tflops", "input_sets", "ms_all")}
            out[f"ratio_vs_{name}"] = ratio
            if name == "cudnn":
                # The headline figure: kiln against cuDNN.
                out["ratio"] = ratio
            cells += [f"{p['ms_median']:.3f}", f"{p['tflops']:.1f}", f"{ratio:.3f}"]
        cells.append(f"{r['rel_error_sampled_rows']:.1e}" + ("" if r["correct"] else " WRONG"))
        table.append(cells)
        merged.append(out)
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    if kiln["meta"].get("gpu") != peers["meta"].get("gpu"):
        print(f"warning: kiln ran on {kiln['meta'].get('gpu')}, peers on {peers['meta'].get('gpu')}", file=sys.stderr)
    result = {
        "meta": {"kiln": kiln["meta"], "peers": peers["meta"]},
        "iters": {"kiln": kiln["iters"], "peers": peers["iters"]},
        "compile": kiln.get("compile", []),
        "rows": merged,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--iters", type=int, default=30)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--only", help="run only these S:D:CAUSAL points, comma-separated")
    m = sub.add_parser("merge")
    m.add_argument("kiln")
    m.add_argument("peers")
    m.add_argument("--out", required=True)
    args = p.parse_args()
    run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    main()
