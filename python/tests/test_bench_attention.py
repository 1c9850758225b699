"""python/bench.py's kiln-side candidates without a GPU: the backward with the dK/dV kernel
keys-major (`keys_major_attention`), its kernels run on the interpreter over CPU tensors,
gives the gradients of kiln's own backward (itself checked against float64 references in
test_flash_attn_interp.py). The timing needs the GPU."""

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


@pytest.mark.parametrize("sq,sk,h,hk,d,causal", [
    (70, 70, 2, 2, 64, False),
    (90, 60, 2, 1, 64, True),
    (50, 100, 1, 1, 128, True),
])
def test_keys_major_backward_gives_the_librarys_gradients(sq, sk, h, hk, d, causal):
    gen = torch.Generator().manual_seed(sq * 100 + d)
    t = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)
    q, k, v, dout = t(1, sq, h, d), t(1, sk, hk, d), t(1, sk, hk, d), t(1, sq, h, d)
    with interpreter():
        mine = grads(bench.keys_major_attention(torch, kiln_attn, causal, run="interpret"), q, k, v, dout)
        library = grads(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=causal), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), mine, library):
        err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
        assert err < 2e-2, f"{name}: relative error {err}"


def test_key_columns_match_the_kernels_default():
    assert [bench.key_columns(d) for d in (32, 64, 96, 128, 256)] == [32, 64, 32, 64, 64]
