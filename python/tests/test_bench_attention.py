"""python/bench.py's kiln-side candidates without a GPU: the backward launched kernel by kernel
(`launched_backward`: dQ by atomics, keys-major or not, and the dQ walk with the tiles a
candidate names), its kernels run on the interpreter over CPU tensors, gives the gradients of
kiln's own backward (itself checked against float64 references in test_flash_attn_interp.py).
The timing needs the GPU."""

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
import kiln_attn  # noqa: E402
from kiln_attn.options import interpreter  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench", os.path.join(HERE, "..", "bench.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def grads(forward, q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = forward(*leaves)
    return [out] + list(torch.autograd.grad(out, leaves, dout))


# (dK/dV comptime values, dQ's or None for atomics), as `--bwd-candidate` spells them.
PATHS = {
    "atomics": ({}, None),
    "keys_major": ({"keys_major": "true"}, None),
    "walk": ({}, {}),
    "walk_two_consumers": ({"block_n": "128", "block_m": "64", "num_warps": "8", "key_cols": "d"}, {}),
    # gpu-check's kiln_fused128: keys-major with dQ by atomics, two consumer warpgroups.
    "fused_two_consumers": ({"keys_major": "true", "block_n": "128", "block_m": "64", "num_warps": "8",
                             "key_cols": "d"}, None),
    # gpu-check's kiln_qm64: queries-major with dQ by atomics, 128 x 128 tiles in two consumer
    # warpgroups (its dQ conversion on the same 128-row query blocks).
    "queries_major_two_consumers": ({"block_n": "128", "block_m": "128", "num_warps": "8", "key_cols": "d"},
                                    None),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("sq,sk,h,hk,d,causal", [
    (70, 70, 2, 2, 64, False),
    (90, 60, 2, 1, 64, True),
    (50, 100, 1, 1, 128, True),
])
def test_launched_backward_gives_the_librarys_gradients(path, sq, sk, h, hk, d, causal):
    gen = torch.Generator().manual_seed(sq * 100 + d)
    t = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)
    q, k, v, dout = t(1, sq, h, d), t(1, sk, hk, d), t(1, sk, hk, d), t(1, sq, h, d)
    dkdv, dq = PATHS[path]
    with interpreter():
        launched = bench.launched_backward(torch, kiln_attn, causal, dkdv, dq, run="interpret")
        mine = grads(launched, q, k, v, dout)
        library = grads(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=causal), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), mine, library):
        err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
        assert err < 2e-2, f"{name}: relative error {err}"


def test_candidates_parse_as_the_help_spells_them():
    name, dkdv, dq = bench.parse_candidate("kiln_n128=block_n=128,num_warps=8,key_cols=d|block_m=128")
    assert (name, dkdv, dq) == ("kiln_n128", {"block_n": "128", "num_warps": "8", "key_cols": "d"},
                                {"block_m": "128"})
    assert bench.parse_candidate("kiln_walk=|") == ("kiln_walk", {}, {})
    assert bench.parse_candidate("kiln_km=keys_major=true") == ("kiln_km", {"keys_major": "true"}, None)


def test_key_columns_match_the_kernels_default():
    assert [bench.key_columns(d) for d in (32, 64, 96, 128, 256)] == [32, 64, 32, 64, 64]
    assert [bench.dq_columns(d) for d in (32, 64, 96, 128, 256, 192)] == [32, 64, 96, 128, 128, 64]
