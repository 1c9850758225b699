#!/usr/bin/env python3
"""kiln's row-kernel library (kiln_attn.ops) beside its PyTorch peers, in one process on one
GPU, in GB/s of what each call must move.

  bench/rows.py [--out RESULT.json] [--quick] [--iters N] [--warmup N] [--only K1,K2]
                [--dtypes f32,bf16] [--shapes MxN,..] [--set CONFIG.KEY=INT|true|false ..] [--dry-run]

Kernels and peers (kiln through kiln_attn.ops, the way a PyTorch user calls it):
  copy                  torch's Tensor.copy_ alone: the attainable-bandwidth reference row
  softmax               torch.softmax(x, -1)
  softmax_backward      torch._softmax_backward_data(dy, y, -1, dtype)
  layer_norm            F.layer_norm(x, (N,), w, b, 1e-5)
  layer_norm_backward   autograd of F.layer_norm: (dx, dw, db) from dy
  rms_norm              F.rms_norm(x, (N,), w, 1e-5)
  rms_norm_backward     autograd of F.rms_norm: (dx, dw) from dy
  cross_entropy         F.cross_entropy(x, target) (mean over rows, 1% of targets -100)
  cross_entropy_fwd_bwd the same loss and its logits gradient through autograd, both sides
  rotary                GPT-NeoX rotary embedding written in torch (x: [1, M, N/128, 128],
                        cos/sin [M, 64]; shapes whose N is no multiple of 128 are skipped)
  dropout               F.dropout(x, 0.1)

Shapes M x N: 4096x8192, 8192x8192, 16384x4096, 4096x4097 (a misaligned tail), and the large
ones where the bandwidth target counts: 32768x8192, 65536x4096, 16384x16384 (--quick:
4096x8192 and 32768x8192); f32 and bf16.

Bytes per call: each input read once and each output written once (layer norm's mean and
rstd and RMS norm's rstd as kiln's kernels write them; intermediates such as the norm
backward's per-block partial sums are not counted), the same count for both sides.

Before timing, each side's output is compared with a float64 computation in torch on the
same inputs (rel_err: relative Frobenius error; dropout: kept elements against x / (1 - p)
and the kept fraction). Two timings per point and side, CUDA events, medians:
  sustained  `iters` calls back to back between one pair of events, rotating over input sets
             that together exceed twice the L2 (so no call finds its inputs in L2), three
             rounds: GPU time per call as a training loop sees it (a launch the host cannot
             issue in time shows as a gap).
  held       each call alone behind a GPU hold (torch.cuda._sleep) over the next input set:
             the kernel's own GPU time, without the launch latency.
GB/s = bytes / time; ratio = kiln's GB/s over PyTorch's; frac_of_copy = kiln's sustained GB/s
over the copy row's at the same shape and dtype; frac_of_peak over the GPU's HBM bandwidth
(bench/peers.py's `hbm_peak`: 4.8 TB/s on the H200, 3.35 on the H100 SXM; none for a GPU it
does not list).

The JSON (commit, GPU, driver, torch, date, every figure, and per row the comptime values
kiln_attn.ops picked for it) goes to --out (default
bench/results/rows-py-<UTC>-<commit>.json); bench/chart.py draws it, bench/table.py prints it.
Exits 1 if a kiln output was wrong (rel_err above the dtype's bound) or a kiln call failed.
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import commit, hbm_peak  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

KERNELS = (
    "copy", "softmax", "softmax_backward", "layer_norm", "layer_norm_backward", "rms_norm",
    "rms_norm_backward", "cross_entropy", "cross_entropy_fwd_bwd", "rotary", "dropout",
)
SHAPES = [(4096, 8192), (8192, 8192), (16384, 4096), (4096, 4097), (32768, 8192), (65536, 4096), (16384, 16384)]
QUICK_SHAPES = [(4096, 8192), (32768, 8192)]
DTYPES = ("f32", "bf16")
ESIZE = {"f32": 4, "bf16": 2}
EPS = 1e-5
DROP_P = 0.1
ROT_D = 128
HOLD_CYCLES = 1_000_000
# rel_err bounds against float64: storage rounding of the output (bf16: 2^-8) plus f32 sums.
BOUND = {"f32": 1e-4, "bf16": 1.6e-2}
L2_DEFAULT = 60 << 20


def nbytes(kernel, m, n, dtype):
    """Bytes one call must move: inputs read once, outputs written once."""
    e = ESIZE[dtype]
    x = m * n * e
    return {
        "copy": 2 * x,
        "softmax": 2 * x,
        "softmax_backward": 3 * x,
        "layer_norm": 2 * x + 2 * n * e + 8 * m,
        "layer_norm_backward": 3 * x + 3 * n * e + 8 * m,
        "rms_norm": 2 * x + n * e + 4 * m,
        "rms_norm_backward": 3 * x + 2 * n * e + 4 * m,
        "cross_entropy": x + 8 * m + 4 * m,
        "cross_entropy_fwd_bwd": 2 * x + 8 * m + 4 * m,
        "rotary": 2 * x + 2 * m * (ROT_D // 2) * e,
        "dropout": 2 * x,
    }[kernel]


def applicable(kernel, m, n, dtype):
    """None, or why the point is not measured."""
    if kernel == "rotary" and n % ROT_D:
        return f"N is no multiple of the head dim {ROT_D}"
    return None


def input_sets(bytes_per_call, l2):
    """Input sets to rotate over so that they exceed twice the L2 together (2 to 16)."""
    return max(2, min(16, math.ceil(2 * l2 / bytes_per_call)))


def plan(args, l2=L2_DEFAULT):
    shapes = parse_shapes(args.shapes) if args.shapes else (QUICK_SHAPES if args.quick else SHAPES)
    kernels = [k for k in KERNELS if not args.only or k in args.only.split(",") or k == "copy"]
    unknown = [k for k in (args.only.split(",") if args.only else []) if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--only: unknown kernel(s) {', '.join(unknown)}; known: {', '.join(KERNELS)}")
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise SystemExit(f"--dtypes: unknown {', '.join(bad)}; known: {', '.join(DTYPES)}")
    points = []
    for m, n in shapes:
        for dtype in dtypes:
            for k in kernels:
                b = nbytes(k, m, n, dtype)
                points.append({"kernel": k, "dtype": dtype, "m": m, "n": n, "bytes": b,
                               "input_sets": input_sets(b, l2), "skip": applicable(k, m, n, dtype)})
    return points


def parse_shapes(text):
    try:
        return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
    except ValueError:
        raise SystemExit(f"--shapes: expected MxN,.. got {text!r}") from None


def driver():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return ""


class Case:
    """One point's inputs (`sets` of them), its two calls and its float64 reference."""

    def __init__(self, torch, F, ops, kernel, m, n, dtype, sets, seed, device="cuda"):
        self.torch, self.F, self.ops = torch, F, ops
        self.kernel, self.m, self.n, self.sets = kernel, m, n, sets
        dev = torch.device(device)
        self.dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        gen = torch.Generator(device=dev).manual_seed(seed)

        def rand(*shape, scale=1.0):
            return ((torch.rand(shape, generator=gen, device=dev) * 2 - 1) * scale).to(self.dt)

        k = kernel
        self.w = rand(n) + 1
        self.b = rand(n)
        if k == "rotary":
            h = n // ROT_D
            self.xs = [rand(1, m, h, ROT_D) for _ in range(sets)]
            ang = torch.rand((m, ROT_D // 2), generator=gen, device=dev) * 6.3
            self.cos, self.sin = ang.cos().to(self.dt), ang.sin().to(self.dt)
        elif k.startswith("cross_entropy"):
            self.xs = [rand(m, n, scale=8.0) for _ in range(sets)]
            self.ts = []
            for _ in range(sets):
                t = torch.randint(0, n, (m,), generator=gen, device=dev)
                t[torch.rand((m,), generator=gen, device=dev) < 0.01] = -100
                self.ts.append(t)
        else:
            self.xs = [rand(m, n, scale=4.0) for _ in range(sets)]
        if k == "copy":
            self.outs = [torch.empty_like(x) for x in self.xs]
        if k in ("softmax_backward", "layer_norm_backward", "rms_norm_backward"):
            self.dys = [rand(m, n) for _ in range(sets)]
        if k == "softmax_backward":
            self.ys = [torch.softmax(x.float(), -1).to(self.dt) for x in self.xs]
        if k == "layer_norm_backward":
            self.stats = [ops.layer_norm(x, (n,), self.w, self.b, EPS, return_stats=True)[1:] for x in self.xs]
            self.graphs = []
            for x in self.xs:
                xr, wr, br = (t.detach().requires_grad_() for t in (x, self.w, self.b))
                self.graphs.append((F.layer_norm(xr, (n,), wr, br, EPS), (xr, wr, br)))
        if k == "rms_norm_backward":
            self.stats = [ops.rms_norm(x, (n,), self.w, EPS, return_rstd=True)[1] for x in self.xs]
            self.graphs = []
            for x in self.xs:
                xr, wr = (t.detach().requires_grad_() for t in (x, self.w))
                self.graphs.append((F.rms_norm(xr, (n,), wr, EPS), (xr, wr)))
        if k == "cross_entropy_fwd_bwd":
            self.xrs = [x.detach().requires_grad_() for x in self.xs]

    # The calls: kiln through kiln_attn.ops, torch's own.

    def kiln(self, i):
        torch, ops, k, j = self.torch, self.ops, self.kernel, i % self.sets
        x = self.xs[j]
        with torch.no_grad():
            if k == "softmax":
                return ops.softmax(x, -1)
            if k == "softmax_backward":
                return ops.softmax_backward(self.dys[j], self.ys[j], -1)
            if k == "layer_norm":
                return ops.layer_norm(x, (self.n,), self.w, self.b, EPS)
            if k == "layer_norm_backward":
                mean, rstd = self.stats[j]
                return ops.layer_norm_backward(self.dys[j], x, (self.n,), mean, rstd, self.w)
            if k == "rms_norm":
                return ops.rms_norm(x, (self.n,), self.w, EPS)
            if k == "rms_norm_backward":
                return ops.rms_norm_backward(self.dys[j], x, (self.n,), self.stats[j], self.w)
            if k == "cross_entropy":
                return ops.cross_entropy(x, self.ts[j])
            if k == "rotary":
                return ops.rotary(x, self.cos, self.sin)
            if k == "dropout":
                return ops.dropout(x, DROP_P, seed=i)
        if k == "cross_entropy_fwd_bwd":
            loss = ops.cross_entropy(self.xrs[j], self.ts[j])
            return loss, torch.autograd.grad(loss, self.xrs[j])[0]
        raise ValueError(k)

    def peer(self, i):
        torch, F, k, j = self.torch, self.F, self.kernel, i % self.sets
        x = self.xs[j]
        if k == "copy":
            return self.outs[j].copy_(x)
        if k == "layer_norm_backward":
            y, inputs = self.graphs[j]
            return torch.autograd.grad(y, inputs, self.dys[j], retain_graph=True)
        if k == "rms_norm_backward":
            y, inputs = self.graphs[j]
            return torch.autograd.grad(y, inputs, self.dys[j], retain_graph=True)
        if k == "cross_entropy_fwd_bwd":
            loss = F.cross_entropy(self.xrs[j], self.ts[j])
            return loss, torch.autograd.grad(loss, self.xrs[j])[0]
        with torch.no_grad():
            if k == "softmax":
                return torch.softmax(x, -1)
            if k == "softmax_backward":
                return torch._softmax_backward_data(self.dys[j], self.ys[j], -1, self.dt)
            if k == "layer_norm":
                return F.layer_norm(x, (self.n,), self.w, self.b, EPS)
            if k == "rms_norm":
                return F.rms_norm(x, (self.n,), self.w, EPS)
            if k == "cross_entropy":
                return F.cross_entropy(x, self.ts[j])
            if k == "rotary":
                return rotary_torch(torch, x, self.cos, self.sin)
            if k == "dropout":
                return F.dropout(x, DROP_P, training=True)
        raise ValueError(k)

    def reference(self):
        """The float64 result for input set 0 (None for dropout: random by design)."""
        torch, F, k, n = self.torch, self.F, self.kernel, self.n
        d = lambda t: t.double()  # noqa: E731
        x = d(self.xs[0])
        if k == "copy":
            return x
        if k == "softmax":
            return torch.softmax(x, -1)
        if k == "softmax_backward":
            y, dy = d(self.ys[0]), d(self.dys[0])
            return y * (dy - (dy * y).sum(-1, keepdim=True))
        if k == "layer_norm":
            return F.layer_norm(x, (n,), d(self.w), d(self.b), EPS)
        if k == "rms_norm":
            return F.rms_norm(x, (n,), d(self.w), EPS)
        if k in ("layer_norm_backward", "rms_norm_backward"):
            xr, wr, br = (t.detach().double().requires_grad_() for t in (self.xs[0], self.w, self.b))
            with torch.enable_grad():
                if k == "layer_norm_backward":
                    y = F.layer_norm(xr, (n,), wr, br, EPS)
                    return torch.autograd.grad(y, (xr, wr, br), d(self.dys[0]))
                y = F.rms_norm(xr, (n,), wr, EPS)
                return torch.autograd.grad(y, (xr, wr), d(self.dys[0]))
        if k == "cross_entropy":
            return F.cross_entropy(x, self.ts[0])
        if k == "cross_entropy_fwd_bwd":
            xr = x.detach().requires_grad_()
            with torch.enable_grad():
                loss = F.cross_entropy(xr, self.ts[0])
                return loss, torch.autograd.grad(loss, xr)[0]
        if k == "rotary":
            return rotary_torch(torch, x, d(self.cos), d(self.sin))
        return None

    def rel_err(self, out, ref):
        torch = self.torch
        if self.kernel == "dropout":
            x = self.xs[0]
            kept = out != 0
            want = x.double() / (1 - DROP_P)
            err = ((out.double() - want) * kept).norm() / (want * kept).norm().clamp_min(1e-30)
            frac = kept.double().mean().item()
            # The kept fraction's standard deviation is sqrt(p (1 - p) / numel); 6 of them.
            slack = 6 * math.sqrt(DROP_P * (1 - DROP_P) / x.numel()) + 1e-6
            return err.item() if abs(frac - (1 - DROP_P)) <= slack else float("inf"), frac
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        worst = 0.0
        for o, r in zip(outs, refs):
            o, r = o.double(), r.double()
            if not bool(o.isfinite().all()):
                return float("nan"), None
            worst = max(worst, ((o - r).norm() / r.norm().clamp_min(1e-30)).item())
        return worst, None


def rotary_torch(torch, x, cos, sin):
    """GPT-NeoX rotary embedding of x [b, s, h, d] with cos/sin [s, r/2], in torch."""
    half = cos.shape[1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]), dim=-1)


def time_sustained(torch, call, warmup, iters, rounds=3):
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    per_call = []
    for r in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(iters):
            call(warmup + r * iters + i)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    return statistics.median(per_call), per_call


def time_held(torch, call, warmup, iters):
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        start.record()
        call(warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


def measure(torch, case, side, point, args):
    call = case.kiln if side == "kiln" else case.peer
    out = call(0)
    torch.cuda.synchronize()
    ref = case.ref
    err, frac = case.rel_err(out, ref) if (ref is not None or case.kernel == "dropout") else (None, None)
    del out
    sus, sus_all = time_sustained(torch, call, args.warmup, args.iters)
    held, held_all = time_held(torch, call, args.warmup, args.iters)
    b = point["bytes"]
    r = {"rel_err": err, "sustained_ms": sus, "sustained_ms_rounds": sus_all,
         "sustained_gbs": b / (sus * 1e-3) / 1e9, "held_ms": held, "held_ms_all": held_all,
         "held_gbs": b / (held * 1e-3) / 1e9}
    if frac is not None:
        r["kept_fraction"] = frac
    return r


# The ops.config_* function that picks each kernel's comptime values, by kernel.
CONFIG_OF = {
    "softmax": "softmax", "softmax_backward": "softmax_backward", "layer_norm": "layer_norm",
    "layer_norm_backward": "norm_backward", "rms_norm": "rms_norm",
    "rms_norm_backward": "norm_backward", "cross_entropy": "cross_entropy",
    "cross_entropy_fwd_bwd": "cross_entropy",
}


def wrapper_config(torch, ops, p):
    """The comptime values kiln_attn.ops picks for point `p` (what a row was measured with), or
    None where the kernel has no shape-keyed choice or the package lacks the function."""
    name = CONFIG_OF.get(p["kernel"])
    f = getattr(ops, "config_" + name, None) if name else None
    if f is None:
        return None
    dt = torch.float32 if p["dtype"] == "f32" else torch.bfloat16
    try:
        return dict(f(p["m"], p["n"], dt))
    except Exception:  # a package whose config takes other arguments: the row goes without
        return None


def parse_overrides(items):
    """`--set CONFIG.KEY=VALUE` items as {config: {key: int or bool}}: CONFIG names an
    ops.config_* function (norm_backward, cross_entropy, ..); VALUE an integer, true or false."""
    out = {}
    flags = {"true": True, "false": False}
    for item in items or []:
        name, _, kv = item.partition(".")
        key, _, value = kv.partition("=")
        if not (name and key and (value.lstrip("-").isdigit() or value in flags)):
            raise SystemExit(
                f"--set: expected CONFIG.KEY=INT or CONFIG.KEY=true|false (norm_backward.OCC=2), "
                f"got {item!r}")
        out.setdefault(name, {})[key] = flags[value] if value in flags else int(value)
    return out


def apply_overrides(ops, overrides):
    """Makes each ops.config_<name> return its choice with `overrides[name]` on top (the ops
    wrappers call them by name), so one run times comptime candidates beside the defaults."""
    for name, values in overrides.items():
        f = getattr(ops, "config_" + name, None)
        if f is None:
            raise SystemExit(f"--set: kiln_attn.ops has no config_{name}")

        def with_values(*a, _f=f, _v=values):
            return {**_f(*a), **_v}

        setattr(ops, "config_" + name, with_values)


def run(args):
    import torch
    import torch.nn.functional as F

    import kiln_attn
    from kiln_attn import ops

    apply_overrides(ops, parse_overrides(args.set))

    dev = torch.device("cuda")
    peak = hbm_peak(torch.cuda.get_device_name(dev))
    peak_gbs = peak / 1e9 if peak else None
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", L2_DEFAULT)
    points = plan(args, l2)
    rows, failed = [], False
    copy_gbs = {}
    for step, p in enumerate(points, 1):
        label = f"{p['kernel']} {p['dtype']} {p['m']}x{p['n']}"
        print(f"[{step}/{len(points)}] {label}", file=sys.stderr, flush=True)
        row = dict(p)
        if p["skip"]:
            rows.append(row)
            continue
        del row["skip"]
        cfg = wrapper_config(torch, ops, p)
        if cfg is not None:
            row["config"] = cfg
        try:
            case = Case(torch, F, ops, p["kernel"], p["m"], p["n"], p["dtype"], p["input_sets"], step)
            case.ref = case.reference()
        except Exception as e:  # inputs that do not fit, or a kiln call the setup makes
            row["error"] = f"setup: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            failed |= not isinstance(e, torch.cuda.OutOfMemoryError)
            rows.append(row)
            print("   " + row["error"], file=sys.stderr, flush=True)
            case = None
            torch.cuda.empty_cache()
            continue
        sides = ("torch",) if p["kernel"] == "copy" else ("kiln", "torch")
        for side in sides:
            try:
                row[side] = measure(torch, case, side, p, args)
            except Exception as e:  # a failed side is recorded, the sweep goes on
                row[side] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                failed |= side == "kiln"
        if p["kernel"] == "copy":
            copy_gbs[(p["dtype"], p["m"], p["n"])] = row["torch"].get("sustained_gbs")
        k, t = row.get("kiln", {}), row.get("torch", {})
        if "sustained_gbs" in k:
            if "sustained_gbs" in t:
                row["ratio_sustained"] = k["sustained_gbs"] / t["sustained_gbs"]
                row["ratio_held"] = k["held_gbs"] / t["held_gbs"]
            c = copy_gbs.get((p["dtype"], p["m"], p["n"]))
            if c:
                row["frac_of_copy"] = k["sustained_gbs"] / c
            if peak_gbs:
                row["frac_of_peak"] = k["sustained_gbs"] / peak_gbs
            e = k.get("rel_err")
            row["correct"] = e is not None and e == e and e <= BOUND[p["dtype"]]
            failed |= not row["correct"]
        rows.append(row)
        print("   " + summary(row), file=sys.stderr, flush=True)
        del case
        torch.cuda.empty_cache()
    meta = {
        "benchmark": "rows-py",
        "commit": commit(),
        "gpu": torch.cuda.get_device_name(dev),
        "driver": driver(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "kiln_attn": kiln_attn.__version__,
        "target": kiln_attn._target(dev.index or 0),
        "l2_bytes": l2,
        "peak_gbs": peak_gbs,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "iters": args.iters,
        "warmup": args.warmup,
        "timing": "sustained: iters back-to-back calls per event pair over rotating input sets "
                  "(> 2x L2 together), median of 3 rounds; held: each call alone behind "
                  "torch.cuda._sleep, median of iters",
        "configs": {name: getattr(ops, "config_" + name)(4096, 8192, torch.bfloat16)
                    for name in ("softmax", "layer_norm", "rms_norm", "cross_entropy")},
    }
    out = args.out or os.path.join(
        HERE, "results", f"rows-py-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%MZ')}-{meta['commit'][:7]}.json")
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    return 1 if failed else 0


def summary(r):
    def side(name):
        s = r.get(name)
        if not s:
            return f"{name} -"
        if "error" in s:
            return f"{name} ERROR {s['error']}"
        e = s.get("rel_err")
        return (f"{name} {s['sustained_gbs']:.0f}/{s['held_gbs']:.0f} GB/s"
                + (f" err {e:.1e}" if e is not None else ""))
    parts = [side("kiln"), side("torch")]
    if "ratio_sustained" in r:
        parts.append(f"ratio {r['ratio_sustained']:.2f}/{r['ratio_held']:.2f}")
    if r.get("correct") is False:
        parts.append("WRONG")
    return "  ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--only", help="comma-separated kernels (the copy row always runs)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--shapes", help="comma-separated MxN, instead of the sweep")
    p.add_argument("--dry-run", action="store_true", help="print the plan (no torch, no GPU)")
    p.add_argument("--set", action="append", metavar="CONFIG.KEY=VALUE",
                   help="comptime value (an integer, true or false) on top of ops.config_CONFIG's "
                        "choice (repeatable), recorded in each row's config: e.g. norm_backward.OCC=2")
    args = p.parse_args(argv)
    parse_overrides(args.set)
    if args.dry_run:
        points = plan(args)
        for pt in points:
            print(f"{pt['kernel']:22} {pt['dtype']:5} {pt['m']:6}x{pt['n']:<6} {pt['bytes'] / 1e6:10.1f} MB "
                  f"sets {pt['input_sets']:2}" + (f"  skipped: {pt['skip']}" if pt["skip"] else ""))
        print(f"{sum(not pt['skip'] for pt in points)} points measured, {sum(bool(pt['skip']) for pt in points)} skipped")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
