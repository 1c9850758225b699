"""Host time per call of kiln_attn.ops beside PyTorch's, and where kiln's goes.

  python3 bench/host_profile.py [--calls N] [--shape MxN] [--dtype bf16|f32] [--top K] [OP ...]

OP: softmax, layer_norm, rms_norm, cross_entropy (each forward and backward through
autograd), default all. For each: the host time of N back-to-back calls (issue only: the
clock stops before the synchronise that follows them), kiln's and PyTorch's, then
cProfile's K functions of most own time over kiln's calls. A row kernel at a small shape is
host-bound when its host time exceeds its GPU time (bench/rows.py's held figure).
"""

import argparse
import cProfile
import pstats
import sys
import time


def cases(torch, ops, F, m, n, dtype, dev):
    x = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
    w = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
    b = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    t = torch.randint(0, n, (m,), device=dev)
    return {
        "softmax": (lambda: ops.softmax(x, dim=-1).backward(dy),
                    lambda: torch.softmax(x, dim=-1).backward(dy)),
        "layer_norm": (lambda: ops.layer_norm(x, (n,), w, b).backward(dy),
                       lambda: F.layer_norm(x, (n,), w, b).backward(dy)),
        "rms_norm": (lambda: ops.rms_norm(x, (n,), w).backward(dy),
                     lambda: F.rms_norm(x, (n,), w).backward(dy)),
        "cross_entropy": (lambda: ops.cross_entropy(x, t).backward(),
                          lambda: F.cross_entropy(x, t).backward()),
    }


def host_us(torch, call, calls):
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ops", nargs="*", default=["softmax", "layer_norm", "rms_norm", "cross_entropy"])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--shape", default="4096x4097")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from kiln_attn import ops

    m, n = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    every = cases(torch, ops, F, m, n, dtype, torch.device("cuda"))
    for name in args.ops:
        kiln, peer = every[name]
        k_us, p_us = host_us(torch, kiln, args.calls), host_us(torch, peer, args.calls)
        print(f"{name} {args.dtype} {m}x{n}: host per forward + backward: kiln {k_us:.1f} us, "
              f"PyTorch {p_us:.1f} us")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            kiln()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
