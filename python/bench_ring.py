#!/usr/bin/env python3
"""kiln_attn.ring_attention beside PyTorch's context_parallel over SDPA, on the GPUs of one job.

  torchrun --nproc-per-node N python/bench_ring.py [--out RESULT.json] [--seqlens 32768,..]
           [--iters N] [--warmup N] [--quick] [--interpret]

Each point: one sequence of `s` tokens (batch 1, d = 128, h = 16, bf16) split over the N ranks,
causal (kiln: the zigzag split) and not, the forward alone and forward + backward. kiln runs
`ring_attention` on each rank's shard; PyTorch runs `scaled_dot_product_attention` under
`torch.distributed.tensor.experimental.context_parallel` (its load-balanced split when causal)
with the FlashAttention-2 and the cuDNN backends. Times are CUDA-event medians of `iters` calls
after `warmup`, the slowest rank's (an all-reduce of the maximum); TFLOP/s per GPU counts the
attention's FLOPs (4 s^2 h d, halved when causal; x 3.5 for forward + backward) over N. Before
timing, each rank checks its kiln shard against single-GPU `flash_attn_func` on the whole
sequence (for s up to 32k). Scaling efficiency against one GPU: run with N = 1 and N = k and
compare `tflops_per_gpu` (bench/results keeps both JSONs). Rank 0 writes the JSON (commit, GPU,
driver, date, rows) and, with matplotlib, a PNG beside it. `--interpret` runs kiln's side on the
CPU interpreter over gloo, tiny shapes, to check the harness without GPUs.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.distributed as dist

# The installed package, not its sources beside this script (which lack the native module).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from peers import commit  # noqa: E402
import kiln_attn  # noqa: E402
from kiln_attn.ring import zigzag_shard  # noqa: E402

HEADS, HEAD_DIM = 16, 128
SEQLENS = [32768, 65536, 131072, 262144, 524288, 1048576]


def flops(s, causal, backward):
    f = 4 * s * s * HEADS * HEAD_DIM * (0.5 if causal else 1.0)
    return f * (3.5 if backward else 1.0)


def timed(fn, iters, warmup, device):
    """The slowest rank's median time of `fn()` in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = datetime.datetime.now()
            fn()
            times.append((datetime.datetime.now() - t0).total_seconds() * 1e3)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def kiln_step(q, k, v, causal, backward):
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]

    def run():
        out = kiln_attn.ring_attention(*leaves, causal=causal)
        if backward:
            out.backward(torch.ones_like(out))

    return run


def torch_cp_step(q, k, v, causal, backward, backend, mesh):
    """PyTorch's context parallelism over SDPA with `backend`, or None (and why) where it is
    unavailable."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        return None, f"context_parallel unavailable: {e}"
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    # Its own (b, h, s, d) buffers of the whole sequence, which the context shards in place.
    qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_(backward) for t in (q, k, v))

    def run():
        with context_parallel(mesh, buffers=[qt, kt, vt], buffer_seq_dims=[2, 2, 2]):
            with sdpa_kernel(backends[backend]):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                if backward:
                    out.backward(torch.ones_like(out))

    try:
        run()
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        return None, f"{type(e).__name__}: {e}"
    return run, None


def check(q_full, k_full, v_full, q, k, v, causal, rank, world):
    """This rank's kiln shard against single-device flash_attn_func on the whole sequence."""
    want = kiln_attn.flash_attn_func(q_full, k_full, v_full, causal=causal)
    got = kiln_attn.ring_attention(q, k, v, causal=causal)
    want = zigzag_shard(want, rank, world) if causal else want.chunk(world, dim=1)[rank]
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--seqlens", default=None)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the two shortest sequences")
    ap.add_argument("--interpret", action="store_true", help="kiln on the CPU interpreter over gloo")
    args = ap.parse_args()
    dist.init_process_group("gloo" if args.interpret else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.interpret:
        device = torch.device("cpu")
        global HEADS, HEAD_DIM
        HEADS, HEAD_DIM = 2, 32
        seqlens = [8 * world, 16 * world]
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else SEQLENS
        if args.quick:
            seqlens = seqlens[:2]
    mesh = None
    if not args.interpret:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (world,))
    rows = []
    for s in seqlens:
        g = torch.Generator(device=device).manual_seed(s)
        full = [torch.randn((1, s, HEADS, HEAD_DIM), generator=g, device=device).to(torch.bfloat16) for _ in range(3)]
        for causal in (False, True):
            shard = (lambda t: zigzag_shard(t, rank, world)) if causal else (lambda t: t.chunk(world, dim=1)[rank])
            q, k, v = (shard(t).contiguous() for t in full)
            ctx = kiln_attn.interpreter() if args.interpret else _null()
            with ctx:
                err = check(*full, q, k, v, causal, rank, world) if s <= 32768 else None
                for backward in (False, True):
                    row = {"s": s, "d": HEAD_DIM, "h": HEADS, "causal": causal,
                           "pass": "fwd_bwd" if backward else "fwd", "world": world, "kiln_rel_error": err}
                    ms = timed(kiln_step(q, k, v, causal, backward), args.iters, args.warmup, device)
                    row["kiln_ms"] = ms
                    row["kiln_tflops_per_gpu"] = flops(s, causal, backward) / world / (ms * 1e-3) / 1e12
                    if mesh is not None:
                        for backend in ("flash", "cudnn"):
                            step, why = torch_cp_step(*full, causal, backward, backend, mesh)
                            if step is None:
                                row[f"cp_{backend}_error"] = why
                                continue
                            cms = timed(step, args.iters, args.warmup, device)
                            row[f"cp_{backend}_ms"] = cms
                            row[f"cp_{backend}_tflops_per_gpu"] = flops(s, causal, backward) / world / (cms * 1e-3) / 1e12
                            row[f"ratio_vs_cp_{backend}"] = cms / ms
                    rows.append(row)
                    if rank == 0:
                        print(json.dumps(row), flush=True)
    if rank == 0 and args.out:
        meta = {"commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "world": world}
        if device.type == "cuda":
            meta["gpu"] = torch.cuda.get_device_name(device)
            meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True).stdout.strip().split("\n")[0]
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        draw(args.out, rows, world)
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def draw(path, rows, world):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_ring: matplotlib is not installed; no PNG drawn")
        return
    fig, axes = plt.subplots(1, 4, figsize=(18, 4), sharey=True)
    for ax, (causal, pas) in zip(axes, [(c, p) for c in (False, True) for p in ("fwd", "fwd_bwd")]):
        pts = [r for r in rows if r["causal"] == causal and r["pass"] == pas]
        xs = [r["s"] for r in pts]
        ax.plot(xs, [r["kiln_tflops_per_gpu"] for r in pts], "o-", label="kiln ring")
        for backend in ("flash", "cudnn"):
            ys = [r.get(f"cp_{backend}_tflops_per_gpu") for r in pts]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, "s--", label=f"torch context_parallel ({backend})")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{'causal' if causal else 'full'}, {pas}, {world} GPUs")
        ax.set_xlabel("sequence length")
    axes[0].set_ylabel("TFLOP/s per GPU")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.splitext(path)[0] + ".png", dpi=100)


if __name__ == "__main__":
    main()
