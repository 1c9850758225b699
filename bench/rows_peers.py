#!/usr/bin/env python3
"""PyTorch peers for kiln's row-kernel benchmark (bench_rows), and the merge into one table.

  rows_peers.py run --out peers.json [--quick] [--iters N] [--warmup N]
      torch.softmax(x, -1), F.layer_norm(x, (N,), w, b, 1e-5) and F.rms_norm(x, (N,), w,
      1e-5) over bench_rows's sweep (4096x8192, 8192x8192, 16384x4096, 4096x4097; --quick:
      4096x8192; f32 and bf16). Each run is timed alone with CUDA events after warm-up,
      behind a GPU hold (GPU time without the launch latency), rotating over input sets that
      together exceed twice the L2; the median is reported, in GB/s of what the call must move
      (x read, y written, weights read, layer norm's mean/rstd and RMS norm's rstd written as
      kiln's kernels write them: the same byte count on both sides).

  rows_peers.py merge kiln.json peers.json --out rows.json
      One table (kiln and PyTorch: ms, GB/s, ratio = kiln / PyTorch throughput) and one JSON.
"""

import argparse
import datetime
import json
import math
import statistics
import sys

EPS = 1e-5
KERNELS = ("softmax", "layer_norm", "rms_norm")
HOLD_CYCLES = 1_000_000


def shapes(quick):
    if quick:
        return [(4096, 8192)]
    return [(4096, 8192), (8192, 8192), (16384, 4096), (4096, 4097), (32768, 8192), (65536, 4096)]


def nbytes(kernel, m, n, esize):
    xy = 2 * m * n * esize
    return {"softmax": xy, "layer_norm": xy + 2 * n * esize + 8 * m, "rms_norm": xy + n * esize + 4 * m}[kernel]


def run(args):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    dtypes = [("f32", torch.float32), ("bf16", torch.bfloat16)]
    configs = [(k, d, s) for s in shapes(args.quick) for d in dtypes for k in KERNELS]
    rows = []
    for step, (kernel, (dname, dtype), (m, n)) in enumerate(configs, 1):
        print(f"\r\x1b[2K[{step}/{len(configs)}] {kernel} {dname} {m}x{n}", end="", file=sys.stderr, flush=True)
        esize = torch.tensor([], dtype=dtype).element_size()
        size = nbytes(kernel, m, n, esize)
        sets = max(2, min(16, math.ceil(2 * l2 / size)))
        gen = torch.Generator(device=dev).manual_seed(step)
        xs = [(torch.rand((m, n), generator=gen, device=dev) * 2 - 1).to(dtype) for _ in range(sets)]
        w = (torch.rand((n,), generator=gen, device=dev) * 2 - 1).to(dtype)
        b = (torch.rand((n,), generator=gen, device=dev) * 2 - 1).to(dtype)

        def once(i):
            x = xs[i % sets]
            if kernel == "softmax":
                return torch.softmax(x, -1)
            if kernel == "layer_norm":
                return F.layer_norm(x, (n,), w, b, EPS)
            return F.rms_norm(x, (n,), w, EPS)

        row = {"kernel": kernel, "dtype": dname, "m": m, "n": n, "bytes": size, "input_sets": sets}
        try:
            for i in range(args.warmup):
                once(i)
            torch.cuda.synchronize()
            times = []
            for i in range(args.iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(HOLD_CYCLES)
                start.record()
                once(args.warmup + i)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            med = statistics.median(times)
            row.update(ms_median=med, ms_min=min(times), ms_all=times, gbs=size / (med * 1e-3) / 1e9)
        except (RuntimeError, AttributeError) as e:
            row["error"] = str(e).splitlines()[0] if str(e) else repr(e)
        rows.append(row)
        del xs
        torch.cuda.empty_cache()
    print(file=sys.stderr)
    meta = {
        "benchmark": "rows-peers",
        "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
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
    key = lambda r: (r["kernel"], r["dtype"], r["m"], r["n"])
    peer_rows = {key(r): r for r in peers["rows"]}
    header = ["kernel", "dtype", "M", "N", "kiln ms", "kiln GB/s", "torch ms", "torch GB/s", "kiln/torch", "kiln err"]
    table = [header]
    merged = []
    for r in kiln["rows"]:
        out = dict(r)
        cells = [r["kernel"], r["dtype"], str(r["m"]), str(r["n"]), f"{r['kiln_ms_median']:.4f}", f"{r['kiln_gbs']:.0f}"]
        p = peer_rows.get(key(r))
        if p is None or "error" in p:
            out["torch"] = p
            cells += ["-", "-", "-"]
        else:
            out["torch"] = {k: p[k] for k in ("ms_median", "ms_min", "gbs", "input_sets", "ms_all")}
            out["ratio"] = r["kiln_gbs"] / p["gbs"]
            cells += [f"{p['ms_median']:.4f}", f"{p['gbs']:.0f}", f"{out['ratio']:.3f}"]
        cells.append(f"{r['rel_error_sampled_rows']:.1e}" + ("" if r["correct"] else " WRONG"))
        table.append(cells)
        merged.append(out)
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    result = {"meta": {"kiln": kiln["meta"], "peers": peers["meta"]}, "rows": merged}
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
    m = sub.add_parser("merge")
    m.add_argument("kiln")
    m.add_argument("peers")
    m.add_argument("--out", required=True)
    args = p.parse_args()
    run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    main()
