"""Ring attention across processes on the CPU: gloo point-to-point between 2 and 3 ranks, kiln's
interpreter for each block, against single-device attention in float64 by FlashAttention's rule
(kiln's error within twice a bf16 reference's: PyTorch's, or for the gradients the same ring's
blocks computed exactly and rounded to bf16 once each, as the ring rounds them, whichever errs
more): `kiln_attn.ring_attention` (outputs,
log-sum-exp and dq, dk, dv; causal with the zigzag and the contiguous split, and not causal;
grouped-query heads), and ring-flash-attention's own `ring_flash_attn_func` and
`zigzag_ring_flash_attn_func` running unchanged on kiln (`kiln_attn.flash_attn_compat`) where
that package is installed. Skipped without torch or torch.distributed's gloo."""

import importlib
import importlib.util
import os
import random
import socket
import sys
import tempfile
import types

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)

import kiln_attn  # noqa: E402

SEED = int(os.environ.get("KILN_SEED", random.randrange(1 << 31)))

# (causal, zigzag, nheads, nheads_k, head dim, chunk length: the sequence is 2 * world chunks)
CONFIGS = [
    (True, True, 4, 2, 32, 9),
    (True, False, 2, 2, 64, 7),
    (False, False, 2, 1, 32, 8),
]


def inputs(world, config, seed):
    causal, zigzag, h, hk, d, chunk = config
    g = torch.Generator().manual_seed(seed)
    s = 2 * world * chunk
    q = torch.randn((2, s, h, d), generator=g, dtype=torch.float64)
    k = torch.randn((2, s, hk, d), generator=g, dtype=torch.float64)
    v = torch.randn((2, s, hk, d), generator=g, dtype=torch.float64)
    dout = torch.randn((2, s, h, d), generator=g, dtype=torch.float64)
    return q, k, v, dout


def shard(x, rank, world, zigzag):
    if zigzag:
        return kiln_attn.ring.zigzag_shard(x, rank, world)
    return x.chunk(world, dim=1)[rank]


def unshard(shards, zigzag):
    return kiln_attn.ring.zigzag_unshard(shards) if zigzag else torch.cat(shards, dim=1)


def ring_flash_attn_modules():
    """ring-flash-attention's `ring_flash_attn` and `zigzag_ring_flash_attn` modules, loaded
    without the package's `__init__` (which imports transformers and triton, neither needed
    here), or None when the package is not installed."""
    if "ring_flash_attn" not in sys.modules:
        spec = importlib.util.find_spec("ring_flash_attn")
        if spec is None:
            return None
        pkg = types.ModuleType("ring_flash_attn")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["ring_flash_attn"] = pkg
    return (
        importlib.import_module("ring_flash_attn.ring_flash_attn"),
        importlib.import_module("ring_flash_attn.zigzag_ring_flash_attn"),
    )


def run_ring(which, q, k, v, causal, zigzag):
    """(out, lse or None) of one ring call: kiln_attn.ring_attention, or ring-flash-attention's
    function on kiln's low-level ops."""
    if which == "kiln":
        return kiln_attn.ring_attention(q, k, v, causal=causal, zigzag=zigzag, return_lse=True)
    from kiln_attn import flash_attn_compat

    flash_attn_compat.install()
    ring, zig = ring_flash_attn_modules()
    fn = zig.zigzag_ring_flash_attn_func if zigzag else ring.ring_flash_attn_func
    return fn(q, k, v, causal=causal), None


def worker(rank, world, port, out_dir, configs, seed, which):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for i, config in enumerate(configs):
            causal, zigzag = config[0], config[1]
            q, k, v, dout = (shard(t, rank, world, zigzag).to(torch.bfloat16) for t in inputs(world, config, seed + i))
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            with kiln_attn.interpreter():
                out, lse = run_ring(which, *leaves, causal, zigzag)
                out.backward(dout)
            torch.save(
                {"out": out.detach(), "lse": lse, "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad},
                os.path.join(out_dir, f"{i}-{rank}.pt"),
            )
    finally:
        dist.destroy_process_group()


def attention(q, k, v, causal):
    """Attention in q's dtype over whole sequences ([b, s, h, d]); returns (out, lse)."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s.double(), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v), lse


def grads(q, k, v, dout, causal):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention(*leaves, causal)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves], lse


def ring_rounded_grads(q, k, v, dout, causal, zigzag, world):
    """dq, dk, dv of bf16 inputs computed as a ring computes them: each rank's queries against
    each key/value shard in `kiln_attn.ring`'s blocks, every block's gradients exact (from
    the whole attention's output and log-sum-exp) and rounded to bf16 once, summed in f32
    where they belong, then rounded. The yardstick of FlashAttention's rule for a ring,
    whose partial gradients round once per block where one kernel rounds once in all."""
    q, k, v, dout = (t.to(torch.bfloat16).double() for t in (q, k, v, dout))
    out, lse = attention(q, k, v, causal)
    group = q.shape[2] // k.shape[2]
    scale = q.shape[-1] ** -0.5
    delta = (dout * out).sum(-1).transpose(1, 2)

    def part(x, r, dim=1):
        """Rank r's shard of x along `dim` (the sequence's)."""
        if zigzag:
            return kiln_attn.ring.zigzag_shard(x, r, world, dim=dim)
        return x.chunk(world, dim=dim)[r]

    dq = [torch.zeros_like(part(q, r), dtype=torch.float32) for r in range(world)]
    dk = [torch.zeros_like(part(k, r), dtype=torch.float32) for r in range(world)]
    dv = [torch.zeros_like(part(v, r), dtype=torch.float32) for r in range(world)]
    for r in range(world):
        for step in range(world):
            src = (r - step) % world
            s_q, s_k = part(q, r).shape[1], part(k, src).shape[1]
            ring = types.SimpleNamespace(rank=r, world=world)
            block = kiln_attn.ring._blocks(ring, step, causal, zigzag, s_q, s_k)
            if block is None:
                continue
            rows, keys, local_causal = block
            qb, dob = part(q, r)[:, rows], part(dout, r)[:, rows]
            kb = part(k, src)[:, keys].repeat_interleave(group, dim=2)
            vb = part(v, src)[:, keys].repeat_interleave(group, dim=2)
            lb, db = part(lse, r, dim=2)[:, :, rows], part(delta, r, dim=2)[:, :, rows]
            sc = torch.einsum("bqhd,bkhd->bhqk", qb, kb) * scale
            if local_causal:
                n = sc.shape[-1]
                hidden = torch.ones(sc.shape[-2], n, dtype=torch.bool).triu(1)
                sc = sc.masked_fill(hidden, float("-inf"))
            p = torch.exp(sc - lb.unsqueeze(-1))
            ds = p * (torch.einsum("bqhd,bkhd->bhqk", dob, vb) - db.unsqueeze(-1))
            dv_b = torch.einsum("bhqk,bqhd->bkhd", p, dob)
            dk_b = torch.einsum("bhqk,bqhd->bkhd", ds, qb) * scale
            dq_b = torch.einsum("bhqk,bkhd->bqhd", ds, kb) * scale
            # A key/value head's gradients sum over its query heads in the kernel.
            dk_b, dv_b = (g.unflatten(2, (-1, group)).sum(3) for g in (dk_b, dv_b))
            dq[r][:, rows] += dq_b.to(torch.bfloat16).float()
            dk[src][:, keys] += dk_b.to(torch.bfloat16).float()
            dv[src][:, keys] += dv_b.to(torch.bfloat16).float()
    return [unshard([g.to(torch.bfloat16) for g in grads], zigzag) for grads in (dq, dk, dv)]


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_ring(world, which):
    """Runs CONFIGS on `world` spawned ranks through `which` ring and checks every rank's
    shards against single-device attention."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(worker, args=(world, port, out_dir, CONFIGS, SEED, which), nprocs=world, join=True)
        for i, config in enumerate(CONFIGS):
            causal, zigzag = config[0], config[1]
            q, k, v, dout = inputs(world, config, SEED + i)
            ref, ref_lse = grads(q, k, v, dout, causal)
            low, _ = grads(*(t.to(torch.bfloat16) for t in (q, k, v, dout)), causal)
            # The gradients by the ring's rounding too (the larger yardstick of the two).
            ring_low = [low[0]] + ring_rounded_grads(q, k, v, dout, causal, zigzag, world)
            parts = [torch.load(os.path.join(out_dir, f"{i}-{r}.pt")) for r in range(world)]
            what = f"{which} world {world} causal={causal} zigzag={zigzag} {config[2:]} (seed {SEED})"
            for j, name in enumerate(("out", "dq", "dk", "dv")):
                got = unshard([p[name] for p in parts], zigzag)
                assert got.dtype == torch.bfloat16 and got.shape == ref[j].shape, f"{name}: {what}"
                atol = 1e-3 * max(1.0, ref[j].abs().max().item())
                yardstick = max(err(low[j], ref[j]), err(ring_low[j], ref[j]))
                assert err(got, ref[j]) <= 2 * yardstick + atol, (
                    f"{name}: the ring's error {err(got, ref[j]):.3g} > 2 x PyTorch's "
                    f"{yardstick:.3g} + {atol:.3g}: {what}"
                )
            if parts[0]["lse"] is not None:
                lse = [p["lse"] for p in parts]
                lse = kiln_attn.ring.zigzag_unshard(lse, dim=-1) if zigzag else torch.cat(lse, dim=-1)
                assert err(lse, ref_lse) < 1e-2 * max(1.0, ref_lse.abs().max().item()), f"lse: {what}"


@pytest.mark.parametrize("world", [2, 3])
def test_ring_attention_matches_single_device_attention(world):
    check_ring(world, "kiln")


def test_ring_flash_attention_runs_unchanged_on_kiln():
    if importlib.util.find_spec("ring_flash_attn") is None:
        pytest.skip("ring-flash-attn is not installed")
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("a FlashAttention package is installed: kiln's would shadow it")
    check_ring(2, "ring-flash-attn")


def test_the_compat_module_refuses_to_shadow_a_real_flash_attn(monkeypatch):
    from kiln_attn import flash_attn_compat

    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    with pytest.raises(RuntimeError, match="would shadow it"):
        flash_attn_compat.install()


def test_zigzag_shards_round_trip_and_balance_causal_work():
    world = 4
    x = torch.arange(2 * world * 3).reshape(1, -1)
    shards = [kiln_attn.ring.zigzag_shard(x, r, world) for r in range(world)]
    assert torch.equal(kiln_attn.ring.zigzag_unshard(shards), x)
    # Causal work of a shard: the keys each of its positions sees.
    work = [int((s + 1).sum()) for s in shards]
    assert len(set(work)) == 1, work
    with pytest.raises(ValueError, match="divisible by 2 \\* world"):
        kiln_attn.ring.zigzag_shard(torch.zeros(1, 10), 0, 3)
