#!/usr/bin/env python3
"""One attention backward under a profiler, for side-by-side profiles of kiln and its peers:

  ncu --clock-control none --profile-from-start off --set full \
      python3 -P bench/ncu_backward.py SIDE [--d 128] [--s 4096] [--causal]

SIDE: `kiln` (flash_attn_func's own backward), `fa4` (FlashAttention-4's), or a
python/bench.py `--bwd-candidate` spec (`NAME=DKDV|DQ`) launched kernel by kernel. The
tensors are FlashAttention's (b, s, h, d), bf16, b * s = 8192, h = 2048 / d
unless --b and --h say otherwise (a sanitizer's smaller run). The backward
runs once to compile and warm up, then once between cudaProfilerStart and Stop, so that
the profile holds that one backward's kernels and nothing else.
"""
import argparse
import os
import sys

# Appended, not prepended: the installed kiln_attn (with its native module) comes first.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

from bench import fa4_forward, launched_backward, parse_candidate  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--s", type=int, default=4096)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--b", type=int, default=0, help="batch (default: 8192 // s, at least 1)")
    p.add_argument("--h", type=int, default=0, help="heads (default: 2048 // d)")
    args = p.parse_args()
    d, s = args.d, args.s
    b, h = args.b or max(1, 8192 // s), args.h or 2048 // d
    if args.side != "fa4":
        import kiln_attn
    if args.side == "kiln":
        forward = lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=args.causal)
    elif args.side == "fa4":
        fa4 = fa4_forward()
        if fa4 is None:
            sys.exit("ncu_backward: FlashAttention-4 does not import")
        forward = lambda q, k, v: fa4(q, k, v, causal=args.causal)[0]
    else:
        _, dkdv, dq = parse_candidate(args.side)
        forward = launched_backward(torch, kiln_attn, args.causal, dkdv, dq)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    out = forward(q, k, v)
    dout = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"ncu_backward: {args.side} b={b} s={s} h={h} d={d} causal={args.causal}")


if __name__ == "__main__":
    main()
