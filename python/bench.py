#!/usr/bin/env python3
"""kiln_attn.flash_attn_func beside FlashAttention-4 and PyTorch SDPA, in one process, on the
standard sweep.

  python/bench.py [--out RESULT.json] [--quick] [--iters N] [--warmup N] [--only S:D:CAUSAL,..]
                  [--rust KILN.json] [--overhead-only] [--backward | --fwd-bwd] [--group G]

The sweep is bench/peers.py's (docs/benchmarking.md): bf16, b*s = 16384, h = 2048/d,
s in {1k..16k}, d in {64, 128, 256}, causal and not (`--group G`: k and v hold h / G heads,
grouped-query attention). kiln gets FlashAttention's layout
(b, s, h, d), as does FlashAttention-4 (`flash_attn.cute`, timed when it imports); SDPA
(FLASH_ATTENTION = FlashAttention-2, and cuDNN) gets its own (b, h, s, d).
Each point is timed two ways, rotating over input sets that together exceed twice the L2:
each call alone with CUDA events after warm-up, behind a GPU hold (GPU time without the launch
latency; `tflops`, `ratio_vs_<peer>`), and back-to-back with the L2 flushed between calls, as
triton.testing.do_bench (`tflops_sustained`, `ratio_vs_<peer>_sustained`); medians. Each configuration's kiln output is
checked against the first SDPA backend that ran (FlashAttention-2, else cuDNN: relative norm
error below 2e-2; the script exits 1 otherwise).

With --backward, each library's backward alone is timed instead: one forward per input set
under autograd, then `torch.autograd.grad` of its output (retained graph) per timed call; FLOPs
are 2.5x the forward's (five matmuls to two), and dQ, dK, dV are checked against the first
peer's. With --fwd-bwd each timed call is a forward and its backward (`torch.autograd.grad`),
as training runs them: FLOPs 3.5x the forward's.

The JSON has bench/peers.py merge's shape, so bench/chart.py draws it (the PNG is written
beside it); with --rust, each row also gets kiln's TFLOP/s from a bench_attention JSON (the
Rust benchmark) and python_vs_rust, the ratio.

Also measured: the host time of one flash_attn_func call at batch 1, s = 128 (h = 16,
d = 128, output preallocated and not), beside an empty kernel launched through kiln on the
same stream and an SDPA call, taking turns round by round; overhead_us is the median over
rounds of the call's time less the empty launch's in the same round.
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
BENCH = os.path.join(HERE, "..", "bench")
sys.path.insert(0, BENCH)

from peers import TOKENS, WIDTH, commit, flops, hold, parse_only, rel_error, sweep  # noqa: E402

TOLERANCE = 2e-2


def package_version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def time_calls(torch, once, warmup, iters):
    """Median and min of `iters` timed calls (CUDA events), after `warmup` calls. Each call
    is enqueued behind a GPU hold (peers.hold), so its interval is GPU time alone, not the
    host's launch latency too."""
    for i in range(warmup):
        once(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        hold(torch)
        start.record()
        once(warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times), times


def time_sustained(torch, once, iters, flush):
    """Median of `iters` back-to-back calls (CUDA events), L2 flushed before each by writing
    `flush` (a buffer larger than the L2), as triton.testing.do_bench times: the clocks stay
    where sustained load puts them, unlike a call after a GPU hold."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush.zero_()
        starts[i].record()
        once(i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def fa4_forward():
    """FlashAttention-4's flash_attn_func (CuTe DSL), or None where it does not import."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # ImportError, and the CuTe DSL's own failures as it loads
        print(f"FlashAttention-4 not timed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return flash_attn_func


def sides_of(torch, kiln_attn, fa4, causal, grads=False, candidates=()):
    """(name, layout, forward) for kiln and each peer, peers in the order they are checked
    against: forward(q, k, v) returns the output in the side's layout, (b, s, h, d) or
    (b, h, s, d). With `grads`, last, kiln's other backward paths, launched kernel by kernel
    (`launched_backward`): "kiln_atomics" (dQ by f32 atomics from the dK/dV kernel, the
    default before the dQ walk), and each of `candidates`, (name, dK/dV tiles, dQ tiles) of
    the walk, so that tiles are timed beside the library's before they become its own."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def sdpa(backend):
        def forward(q, k, v):
            with sdpa_kernel([backend]):
                # Grouped heads: k and v hold fewer heads than q.
                gqa = k.shape[1] != q.shape[1]
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return forward

    sides = [("kiln", "bshd", lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=causal))]
    if fa4 is not None:
        sides.append(("fa4", "bshd", lambda q, k, v: fa4(q, k, v, causal=causal)[0]))
    sides += [("fa2", "bhsd", sdpa(SDPBackend.FLASH_ATTENTION)),
              ("cudnn", "bhsd", sdpa(SDPBackend.CUDNN_ATTENTION))]
    if grads:
        sides.append(("kiln_atomics", "bshd", launched_backward(torch, kiln_attn, causal)))
        for name, dkdv, dq in candidates:
            sides.append((name, "bshd", launched_backward(torch, kiln_attn, causal, dkdv, dq)))
    return sides


def key_columns(d):
    """The columns of dK and dV one `attention_bwd_dkdv` block accumulates by default (the
    Rust `key_columns`): all up to 64, else 64, or 32 of a `d` no multiple of 64."""
    return d if d <= 64 else 64 if d % 64 == 0 else 32


def dq_columns(d):
    """The columns of dQ one `attention_bwd_dq` block accumulates (the Rust `dq_columns`): all
    up to 128, else 128, 64 or 32, what divides `d`."""
    return d if d <= 128 else next((c for c in (128, 64, 32) if d % c == 0), d)


def parse_candidate(text):
    """`NAME=DKDV|DQ`, each side of `|` comma-separated `key=value` comptime values of that
    kernel (`d` as a value: the head dim): a candidate of `launched_backward`'s walk; without
    `|` (`NAME=DKDV`), dQ by atomics from that dK/dV kernel (`keys_major=true` among them)."""
    name, _, tiles = text.partition("=")
    dkdv, walk, dq = tiles.partition("|")
    parse = lambda part: dict(kv.split("=") for kv in part.split(",") if kv)
    return name, parse(dkdv), parse(dq) if walk else None


def launched_backward(torch, kiln_attn, causal, dkdv=None, dq=None, run="launch"):
    """forward(q, k, v) for (b, s, h, d) tensors: kiln's flash_attn_func, differentiated by
    kiln's backward kernels launched one by one (`run`: "launch", or "interpret" on CPU
    tensors) with these comptime values. `dq` None: dQ by f32 atomics from the dK/dV kernel
    (`dkdv`'s values; `keys_major` among them on a ring), then converted; else dQ by the walk
    (`deterministic`), `dkdv` the dK/dV kernel's tiles and `dq` the dQ kernel's (`block_m`,
    `block_n`, `num_warps`, `key_cols`; a value `d` is the head dim; unset: the defaults)."""
    walk = dq is not None
    names = ("attention_bwd_preprocess", "attention_bwd_dkdv",
             "attention_bwd_dq" if walk else "attention_bwd_dq_convert")
    pre, dkdv_kernel, last = (getattr(kiln_attn._native.kernel(n), run) for n in names)

    def tiles(values, d):
        out = {}
        for key, value in (values or {}).items():
            if isinstance(value, str) and value in ("true", "false"):
                value = value == "true"
            out[key] = d if value == "d" else value if isinstance(value, bool) else int(value)
        return out

    class Launched(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse, _ = kiln_attn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            (b, sq, h, d), (sk, hk) = q.shape, k.shape[1:3]
            scale = d ** -0.5
            ct = dict(d=d, causal=causal, kv_group=h // hk, dtype=q.dtype, deterministic=walk)
            kt, qt = {**ct, **tiles(dkdv, d)}, {**ct, **tiles(dq, d)}
            heads = lambda t: t.transpose(1, 2)  # (b, h, s, d) views, read through strides
            f32 = dict(dtype=torch.float32, device=q.device)
            delta, dq_accum = torch.empty((b, h, sq), **f32), torch.empty((b, h, sq, d), **f32)
            dq_out, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            dout = dout.contiguous()
            pre(((sq + 63) // 64, h, b), heads(out), heads(dout), delta, dq_accum, **ct)
            keys, cols = kt.get("block_n") or 64, kt.get("key_cols") or key_columns(d)
            dkdv_kernel(((sk + keys - 1) // keys * (d // cols), hk, b), heads(q), heads(k), heads(v),
                        heads(dout), lse, delta, dq_accum, heads(dk), heads(dv), scale, **kt)
            if walk:
                rows = qt.get("block_m") or 64
                last(((sq + rows - 1) // rows * (d // dq_columns(d)), h, b), heads(q), heads(k),
                     heads(v), heads(dout), lse, delta, heads(dq_out), scale, **qt)
            else:
                rows = kt.get("block_m") or 64
                last(((sq + rows - 1) // rows, h, b), dq_accum, heads(dq_out), scale, **kt)
            return dq_out, dk, dv

    return Launched.apply


def backward_calls(torch, forward, inputs, douts):
    """One timed-call function over the input sets: the gradients of one retained forward per
    set, for the output gradient `douts[set]` (the same values for every side)."""
    graphs = []
    for (q, k, v), dout in zip(inputs, douts):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        graphs.append((forward(q, k, v), (q, k, v), dout))

    def once(i):
        out, leaves, dout = graphs[i % len(graphs)]
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return once


def fwd_bwd_calls(torch, forward, inputs, douts):
    """One timed-call function over the input sets: a forward and the gradients of its output
    for `douts[set]`, as a training step runs them."""
    leaves = [tuple(t.detach().clone().requires_grad_() for t in qkv) for qkv in inputs]

    def once(i):
        q, k, v = leaves[i % len(leaves)]
        return torch.autograd.grad(forward(q, k, v), (q, k, v), douts[i % len(douts)])
    return once


def sweep_rows(args, torch, kiln_attn, on_row=lambda rows: None):
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20)
    configs = [c for c in sweep(args.quick) if not args.only or c in parse_only(args.only)]
    fa4 = fa4_forward()
    grads = args.backward or args.fwd_bwd
    work = 2.5 if args.backward else 3.5 if args.fwd_bwd else 1.0
    flush = torch.empty(2 * l2, dtype=torch.int8, device=dev)
    rows = []
    for n, (s, d, causal) in enumerate(configs, 1):
        print(f"\r\x1b[2K[{n}/{len(configs)}] s={s} d={d} causal={causal}", end="", file=sys.stderr, flush=True)
        b, h = TOKENS // s, WIDTH // d
        hk = h // args.group
        # q and the output at h heads, k and v at hk (2 bytes an element), twice with gradients.
        set_bytes = (2 * h + 2 * hk) * b * s * d * 2 * (2 if grads else 1)
        sets = max(2, min(8, math.ceil(2 * l2 / set_bytes)))
        gen = torch.Generator(device=dev).manual_seed(s * 1000 + d * 10 + int(causal))
        # One (b, h, s, d) set per rotation for SDPA, and the same values as (b, s, h, d)
        # contiguous tensors for kiln and FlashAttention-4 (FlashAttention's layout).
        inputs = {"bhsd": [
            tuple((torch.rand((b, heads, s, d), generator=gen, device=dev) * 2 - 1).to(torch.bfloat16)
                  for heads in (h, hk, hk))
            for _ in range(sets)
        ]}
        inputs["bshd"] = [tuple(t.transpose(1, 2).contiguous() for t in qkv) for qkv in inputs["bhsd"]]
        outs = [torch.empty_like(qkv[0]) for qkv in inputs["bshd"]]
        douts = {}
        if grads:
            douts["bshd"] = [(torch.rand(q.shape, generator=gen, device=dev) * 2 - 1).to(q.dtype)
                             for q, _, _ in inputs["bshd"]]
            douts["bhsd"] = [t.transpose(1, 2) for t in douts["bshd"]]
        row = {"s": s, "d": d, "causal": causal, "b": b, "h": h, "h_kv": hk,
               "flops": work * flops(b, h, s, d, causal), "input_sets": sets}
        reference = None  # (peer name, its result in (b, s, h, d) order)
        for name, layout, forward in sides_of(torch, kiln_attn, fa4, causal, grads, args.candidates):
            try:
                if args.backward:
                    once = backward_calls(torch, forward, inputs[layout], douts[layout])
                elif args.fwd_bwd:
                    once = fwd_bwd_calls(torch, forward, inputs[layout], douts[layout])
                elif name == "kiln":
                    def once(i, forward=forward):
                        q, k, v = inputs["bshd"][i % sets]
                        kiln_attn.flash_attn_func(q, k, v, causal=causal, out=outs[i % sets])
                        return outs[i % sets]
                else:
                    def once(i, forward=forward, layout=layout):
                        return forward(*inputs[layout][i % sets])
                med, lo, times = time_calls(torch, once, args.warmup, args.iters)
                sustained = time_sustained(torch, once, args.iters, flush)
                result = once(0)
                result = [t.transpose(1, 2) if layout == "bhsd" else t
                          for t in (result if grads else (result,))]
            except Exception as e:  # a peer that refuses a configuration is recorded, not fatal
                if name == "kiln":
                    raise
                row[name] = {"error": (str(e).splitlines() or [repr(e)])[0]}
                continue
            tflops = row["flops"] / (med * 1e-3) / 1e12
            tflops_sustained = row["flops"] / (sustained * 1e-3) / 1e12
            if name == "kiln":
                row.update(kiln_ms_median=med, kiln_ms_min=lo, kiln_ms_all=times, kiln_tflops=tflops,
                           kiln_ms_sustained=sustained, kiln_tflops_sustained=tflops_sustained)
                mine = [t.clone() for t in result]
                continue
            row[name] = {"ms_median": med, "ms_min": lo, "tflops": tflops, "input_sets": sets, "ms_all": times,
                         "ms_sustained": sustained, "tflops_sustained": tflops_sustained}
            if name.startswith("kiln_"):
                # kiln's other paths: the worst gradient's error against the library's.
                row[name]["rel_error_vs_kiln"] = max(rel_error(a, r) for a, r in zip(result, mine))
                del result
                continue
            row[f"ratio_vs_{name}"] = row["kiln_tflops"] / tflops
            row[f"ratio_vs_{name}_sustained"] = row["kiln_tflops_sustained"] / tflops_sustained
            if reference is None:
                reference = (name, result)
                row["checked_against"] = name
                # Gradients: the worst of dQ, dK, dV.
                row["rel_error"] = max(rel_error(a, r) for a, r in zip(mine, result))
            del result
        # bench/peers.py merge's names, so bench/chart.py and readers of those files work;
        # `correct` is None when no peer ran to check against.
        err = row.get("rel_error", float("nan"))
        row["rel_error_sampled_rows"] = err
        row["correct"] = err < TOLERANCE if "checked_against" in row else None
        rows.append(row)
        on_row(rows)
        inputs = outs = douts = mine = reference = None  # freed before the next configuration allocates
        torch.cuda.empty_cache()
    print(file=sys.stderr)
    return rows


def host_us(torch, calls_by_name, calls=200, rounds=15):
    """Median host time of one call in microseconds, per callable of `calls_by_name`, and
    per callable the median over rounds of its time less the first callable's in the same
    round: rounds of `calls` back-to-back calls, each timed up to its last enqueue (few enough
    that the launch queue never fills), then drained. The callables take turns round by
    round, so a host that speeds up or slows down during the measurement moves them all
    alike and the differences stay put."""
    per_call = {name: [] for name in calls_by_name}
    for call in calls_by_name.values():
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    for _ in range(rounds):
        for name, call in calls_by_name.items():
            start = time.perf_counter()
            for _ in range(calls):
                call()
            per_call[name].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    base = next(iter(per_call.values()))
    medians = {name: statistics.median(t) for name, t in per_call.items()}
    over = {name: statistics.median(a - b for a, b in zip(t, base)) for name, t in per_call.items()}
    return medians, over


def overhead(torch, kiln_attn):
    import torch.nn.functional as F

    b, s, h, d = 1, 128, WIDTH // 128, 128
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = ((torch.rand((b, s, h, d), generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)
               for _ in range(3))
    out = torch.empty_like(q)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    dev = torch.cuda.current_device()
    us, over = host_us(torch, {
        "empty": lambda: kiln_attn._empty_launch(dev),
        "with_out": lambda: kiln_attn.flash_attn_func(q, k, v, out=out),
        "allocating": lambda: kiln_attn.flash_attn_func(q, k, v),
        "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt),
    })
    res = {
        "shape": {"b": b, "s": s, "h": h, "d": d},
        "empty_launch_us": us["empty"],
        "flash_attn_func_out_us": us["with_out"],
        "flash_attn_func_us": us["allocating"],
        "sdpa_us": us["sdpa"],
        "overhead_us": over["with_out"],
        "overhead_allocating_us": over["allocating"],
        "target_us": 15.0,
    }
    print(f"host time per call at b=1 s=128 h={h} d={d}: empty launch {us['empty']:.1f} us, "
          f"flash_attn_func {us['allocating']:.1f} us ({us['with_out']:.1f} us with out=), "
          f"SDPA {us['sdpa']:.1f} us; overhead {over['allocating']:.1f} us "
          f"({over['with_out']:.1f} us with out=; each the median over rounds of the call less "
          f"the empty launch of its round), target < 15 us",
          file=sys.stderr)
    return res


def add_rust(rows, path):
    """Each row's Rust-side kiln TFLOP/s from bench_attention's (or a merged) JSON."""
    with open(path) as f:
        data = json.load(f)
    rust = {(r["s"], r["d"], r["causal"]): r["kiln_tflops"] for r in data["rows"] if "kiln_tflops" in r}
    for r in rows:
        t = rust.get((r["s"], r["d"], r["causal"]))
        if t:
            r["rust_kiln_tflops"] = t
            r["python_vs_rust"] = r["kiln_tflops"] / t


def print_table(rows):
    header = ["s", "d", "causal", "kiln TF/s", "FA4 TF/s", "kiln/FA4", "sustained", "FA2 TF/s", "kiln/FA2",
              "cuDNN TF/s", "kiln/cuDNN", "py/rust", "err"]
    table = [header]
    for r in rows:
        cells = [str(r["s"]), str(r["d"]), str(r["causal"]).lower(), f"{r['kiln_tflops']:.1f}"]
        for name in ("fa4", "fa2", "cudnn"):
            p = r.get(name, {})
            cells += [f"{p['tflops']:.1f}", f"{r[f'ratio_vs_{name}']:.3f}"] if "tflops" in p else ["-", "-"]
            if name == "fa4":
                cells.append(f"{r['ratio_vs_fa4_sustained']:.3f}" if "tflops" in p else "-")
        cells.append(f"{r['python_vs_rust']:.3f}" if "python_vs_rust" in r else "-")
        flag = {True: "", False: " WRONG", None: " unchecked"}[r["correct"]]
        cells.append(f"{r['rel_error_sampled_rows']:.1e}" + flag)
        table.append(cells)
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    # kiln's other backward paths: TFLOP/s (held, sustained) and the error against kiln's.
    for r in rows:
        others = [(k, v) for k, v in r.items() if k.startswith("kiln_") and isinstance(v, dict)]
        if others:
            print(f"{r['s']:>6} {r['d']:>4} {str(r['causal']).lower():>6}  " + "  ".join(
                f"{k} {v['tflops']:.1f}/{v['tflops_sustained']:.1f} err {v['rel_error_vs_kiln']:.1e}"
                if "tflops" in v else f"{k} {v.get('error')}" for k, v in others))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="result JSON (default: python/results/attention-py-<UTC>.json)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--only", help="run only these S:D:CAUSAL points, comma-separated")
    p.add_argument("--group", type=int, default=1,
                   help="query heads per key/value head (GQA; h = 2048 / d divided by it for k, v)")
    p.add_argument("--rust", help="a bench_attention (or merged) JSON to compare kiln's TFLOP/s with")
    p.add_argument("--overhead-only", action="store_true", help="only the call-overhead measurement")
    p.add_argument("--backward", action="store_true", help="time each library's backward instead")
    p.add_argument("--fwd-bwd", action="store_true", help="time each library's forward + backward instead")
    p.add_argument("--bwd-candidate", dest="candidates", action="append", type=parse_candidate, default=[],
                   metavar="NAME=DKDV|DQ", help="with --backward or --fwd-bwd, also time kiln's dQ walk "
                   "with these tiles (e.g. kiln_n128=block_n=128,block_m=64,num_warps=8,key_cols=d|), or "
                   "without '|' dQ by atomics (kiln_keys_major=keys_major=true)")
    args = p.parse_args()
    if args.group < 1 or (WIDTH // 256) % args.group:
        p.error(f"--group must divide every point's heads ({WIDTH // 256} at d = 256)")

    import torch
    import kiln_attn

    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or os.path.join(HERE, "results", f"attention-py-{stamp:%Y%m%dT%H%MZ}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    dev = torch.device("cuda")
    meta = {
        "benchmark": ("attention-backward-python" if args.backward
                      else "attention-fwd-bwd-python" if args.fwd_bwd else "attention-python"),
        "gpu": torch.cuda.get_device_name(dev),
        "compute_capability": "%d.%d" % torch.cuda.get_device_capability(dev),
        "target": kiln_attn._target(torch.cuda.current_device()),
        "kiln_attn": kiln_attn.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "flash_attn_4": package_version("flash-attn-4"),
        "python": sys.version.split()[0],
        "commit": commit(),
        "date_utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kv_group": args.group,
    }
    result = {"meta": {"kiln": meta, "peers": meta}, "iters": {"kiln": args.iters, "peers": args.iters},
              "warmup": args.warmup, "rows": []}
    if args.backward and args.fwd_bwd:
        p.error("--backward and --fwd-bwd time different things: pass one")
    if not (args.backward or args.fwd_bwd):
        result["overhead"] = overhead(torch, kiln_attn)
    if not args.overhead_only:
        def save(rows):  # after each point, so a run cut short keeps what it measured
            with open(out, "w") as f:
                json.dump(dict(result, rows=rows), f, indent=1)

        rows = sweep_rows(args, torch, kiln_attn, save)
        if args.rust:
            add_rust(rows, args.rust)
        print_table(rows)
        result["rows"] = rows
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    if result["rows"]:
        subprocess.run([sys.executable, os.path.join(BENCH, "chart.py"), out], check=False)
    wrong = [r for r in result["rows"] if r["correct"] is False]
    if wrong:
        print(f"{len(wrong)} configuration(s) differ from SDPA by more than {TOLERANCE}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
