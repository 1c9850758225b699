"""kiln_attn.kernel(..).launch and kiln_attn.ops against float64 computations in torch, on the
GPU: shapes that are no multiple of any tile, rows that are views of wider tensors, outputs
poisoned with NaN before the launch, inputs of several distributions (uniform, normal at
large magnitude, a large offset with a small spread). Skipped without torch or a GPU.
"""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import kiln_attn  # noqa: E402
from kiln_attn import ops  # noqa: E402

DEV = torch.device("cuda")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Relative Frobenius error against float64: the output's storage rounding plus f32 sums.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
SHAPES = [(1, 1), (3, 7), (37, 1000), (5, 4097), (130, 2051), (17, 8195)]
DISTS = ["uniform", "normal_large", "offset"]


def make(shape, dtype, dist, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    if dist == "uniform":
        x = torch.rand(shape, generator=g, device=DEV) * 2 - 1
    elif dist == "normal_large":
        x = torch.randn(shape, generator=g, device=DEV) * 100
    else:  # a large mean and a small spread: cancellation in a naive variance
        x = 1000 + torch.randn(shape, generator=g, device=DEV) * 0.5
    return x.to(dtype)


def rel(out, ref, floor=1e-30):
    """Relative Frobenius error; `floor` bounds the norm it is relative to from below: a
    gradient that cancels to nearly 0 (a norm's dx over one column) is compared absolutely."""
    out, ref = out.double(), ref.double()
    assert bool(out.isfinite().all()), "non-finite output (a poisoned element left unwritten?)"
    return ((out - ref).norm() / ref.norm().clamp_min(floor)).item()


def tol(dtype, dist):
    # An offset row's f32 mean (about 1000) is stored to its ulp, 6e-5, against a spread of
    # 0.5: the normalised values carry that error (PyTorch's f32 layer norm as well).
    if dist == "offset" and dtype == torch.float32:
        return 5e-4
    return TOL[dtype]


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_generic_softmax_launch_on_strided_rows(m, n, dtype):
    wide = make((m, n + 5), dtype, "normal_large", m * n)
    x = wide[:, 2:2 + n]  # rows of a wider tensor: row stride n + 5, misaligned start
    y = poisoned((m, n), dtype)
    k = kiln_attn.kernel("softmax")
    assert k.comptime_values(x, y)["dtype"] == {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    k.launch(k.grid(m, BM=4), x, y, BM=4, BN=256)
    assert rel(y, torch.softmax(x.double(), -1)) < TOL[dtype]


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dist", DISTS)
def test_softmax(m, n, dtype, dist):
    x = make((m, n), dtype, dist, 7 * m + n)
    assert rel(ops.softmax(x), torch.softmax(x.double(), -1)) < TOL[dtype]


def test_softmax_other_dim_and_rank():
    x = make((6, 33, 5), torch.float32, "uniform", 1)
    assert rel(ops.softmax(x, dim=1), torch.softmax(x.double(), 1)) < 2e-5
    assert rel(ops.softmax(x, dim=0), torch.softmax(x.double(), 0)) < 2e-5


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dist", DISTS)
def test_layer_norm_and_stats(m, n, dtype, dist):
    x = make((m, n), dtype, dist, 11 * m + n)
    w, b = make((n,), dtype, "uniform", 3) + 1, make((n,), dtype, "uniform", 4)
    y, mean, rstd = ops.layer_norm(x, (n,), w, b, 1e-5, return_stats=True)
    xd = x.double()
    assert rel(y, F.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)) < tol(dtype, dist)
    # The mean is an f32 sum's: its error scales with the values, not with the mean.
    assert (mean.double() - xd.mean(-1)).abs().max().item() <= 1e-5 * xd.abs().max().item()
    var = xd.var(-1, unbiased=False)
    assert rel(rstd, (var + 1e-5).rsqrt()) < (1e-4 if dist != "offset" else 1e-2)


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dist", DISTS)
def test_rms_norm(m, n, dtype, dist):
    x = make((m, n), dtype, dist, 13 * m + n)
    w = make((n,), dtype, "uniform", 5) + 1
    y, rstd = ops.rms_norm(x, (n,), w, 1e-6, return_rstd=True)
    xd = x.double()
    assert rel(y, F.rms_norm(xd, (n,), w.double(), 1e-6)) < TOL[dtype]
    assert rel(rstd, ((xd * xd).mean(-1) + 1e-6).rsqrt()) < 1e-5


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward(m, n, dtype):
    y = torch.softmax(make((m, n), torch.float32, "normal_large", m), -1).to(dtype)
    dy = make((m, n), dtype, "uniform", n)
    yd, dyd = y.double(), dy.double()
    ref = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
    assert rel(ops.softmax_backward(dy, y), ref) < TOL[dtype] * 4


def ref_grads(fn, inputs, dy):
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.double())


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_backwards(m, n, dtype):
    x = make((m, n), dtype, "normal_large", 17 * m + n)
    w, b = make((n,), dtype, "uniform", 6) + 1, make((n,), dtype, "uniform", 7)
    dy = make((m, n), dtype, "uniform", 8)
    t = TOL[dtype] * 4
    _, mean, rstd = ops.layer_norm(x, (n,), w, b, 1e-5, return_stats=True)
    got = ops.layer_norm_backward(dy, x, (n,), mean, rstd, w)
    want = ref_grads(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), (x, w, b), dy)
    for g, r in zip(got, want):
        assert rel(g, r, floor=1e-4) < t
    _, rstd = ops.rms_norm(x, (n,), w, 1e-5, return_rstd=True)
    got = ops.rms_norm_backward(dy, x, (n,), rstd, w)
    want = ref_grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-5), (x, w), dy)
    for g, r in zip(got, want):
        assert rel(g, r, floor=1e-4) < t


@pytest.mark.parametrize("m,v", [(1, 5), (7, 1000), (33, 4097), (9, 50257)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_and_backward(m, v, dtype, reduction):
    x = make((m, v), dtype, "normal_large", m * v) / 10
    g = torch.Generator(device=DEV).manual_seed(v)
    t = torch.randint(0, v, (m,), generator=g, device=DEV)
    t[::3] = -100
    loss, lse = ops.cross_entropy(x, t, reduction=reduction, return_lse=True)
    xd = x.double().requires_grad_()
    want = F.cross_entropy(xd, t, reduction=reduction)
    if reduction == "mean" and bool((t >= 0).any()):
        assert rel(loss, want.detach()) < 1e-5
    elif reduction != "mean":
        assert rel(loss, want.detach()) < 1e-5
    assert rel(lse, torch.logsumexp(xd.detach(), -1)) < 1e-5
    dloss = torch.ones_like(want) if reduction != "none" else torch.rand(m, device=DEV, dtype=torch.float64)
    if reduction == "mean" and not bool((t >= 0).any()):
        return
    (dref,) = torch.autograd.grad(want, xd, dloss)
    dx = ops.cross_entropy_backward(dloss.float(), x, t, lse, reduction=reduction)
    assert rel(dx, dref) < TOL[dtype] * 2


def test_cross_entropy_ignore_index_non_negative():
    x = make((10, 17), torch.float32, "uniform", 2)
    t = torch.arange(10, device=DEV) % 17
    got = ops.cross_entropy(x, t, ignore_index=3, reduction="none")
    want = F.cross_entropy(x.double(), t, ignore_index=3, reduction="none")
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("b,s,h,d,r", [(2, 7, 3, 128, 128), (1, 33, 9, 128, 64), (3, 5, 16, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary(b, s, h, d, r, dtype):
    x = make((b, s, h, d), dtype, "uniform", s * h)
    ang = torch.rand((s + 3, r // 2), device=DEV, dtype=torch.float64) * 6.3
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    y = ops.rotary(x, cos, sin, offset=3)
    c, sn = cos.double()[3:][None, :, None, :], sin.double()[3:][None, :, None, :]
    xd = x.double()
    x1, x2 = xd[..., : r // 2], xd[..., r // 2: r]
    ref = torch.cat((x1 * c - x2 * sn, x2 * c + x1 * sn, xd[..., r:]), -1)
    assert rel(y, ref) < TOL[dtype] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, 4097, 1 << 20])
def test_dropout_statistics_and_determinism(n, dtype):
    x = make((n,), dtype, "uniform", n) + 2  # never 0
    p = 0.3
    y = ops.dropout(x, p, seed=1234)
    assert y.dtype == dtype
    kept = y != 0
    # A kept element is x * (1 / (1 - p)) in f32, rounded once to x's dtype.
    scale = 1 / (1 - torch.tensor(p, dtype=torch.float32))
    assert torch.equal(y[kept], (x.float() * scale).to(dtype)[kept])
    if n >= 1000:
        frac = kept.double().mean().item()
        assert abs(frac - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n) + 1e-9
    assert torch.equal(ops.dropout(x, p, seed=1234), y)
    if n >= 1000:
        assert not torch.equal(ops.dropout(x, p, seed=4321), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_matches_torch(dtype):
    m, n = 37, 1030
    x = make((m, n), dtype, "uniform", 99)
    w, b = make((n,), dtype, "uniform", 1) + 1, make((n,), dtype, "uniform", 2)
    dy = make((m, n), dtype, "uniform", 3)
    t = TOL[dtype] * 4
    for fn, ref, inputs in (
        (lambda x: ops.softmax(x, -1), lambda x: torch.softmax(x, -1), (x,)),
        (lambda x, w, b: ops.layer_norm(x, (n,), w, b), lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b)),
        (lambda x, w: ops.rms_norm(x, (n,), w, 1e-5), lambda x, w: F.rms_norm(x, (n,), w, 1e-5), (x, w)),
    ):
        leaves = [i.detach().requires_grad_() for i in inputs]
        got = torch.autograd.grad(fn(*leaves), leaves, dy)
        for g, r in zip(got, ref_grads(ref, inputs, dy)):
            assert rel(g, r, floor=1e-4) < t
    logits = (make((m, n), dtype, "uniform", 4) * 5).requires_grad_()
    tgt = torch.randint(0, n, (m,), device=DEV)
    loss = ops.cross_entropy(logits, tgt)
    (g,) = torch.autograd.grad(loss, logits)
    xd = logits.detach().double().requires_grad_()
    (r,) = torch.autograd.grad(F.cross_entropy(xd, tgt), xd)
    assert rel(g, r) < t
    xr = (make((m, n), dtype, "uniform", 5) + 2).requires_grad_()
    y = ops.dropout(xr, 0.25, seed=7)
    (gx,) = torch.autograd.grad(y, xr, torch.ones_like(y))
    assert gx.dtype == dtype
    assert torch.equal(gx != 0, y != 0)


def test_empty_inputs_launch_nothing():
    for shape in [(0, 5), (4, 0)]:
        x = torch.empty(shape, device=DEV)
        assert ops.softmax(x).shape == shape
        assert ops.layer_norm(x, (shape[1],)).shape == shape


def test_generic_errors_name_the_argument_on_real_tensors():
    k = kiln_attn.kernel("layer_norm")
    x = torch.zeros((4, 8), device=DEV)
    w = torch.zeros((8,), device=DEV)
    s = torch.zeros((4,), device=DEV)
    with pytest.raises(ValueError, match="^w: expected a 1-D tensor"):
        k.launch(1, x, x, w, x, s, s, 1e-5)
    with pytest.raises(TypeError, match="^b: expected a torch.float32 tensor, got torch.bfloat16"):
        k.launch(1, x, w, w.bfloat16(), x, s, s, 1e-5)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor, got one on cpu"):
        k.launch(1, x.cpu(), w, w, x, s, s, 1e-5)
    with pytest.raises(TypeError, match="^eps: expected a number"):
        k.launch(1, x, w, w, x, s, s, "1e-5")
    with pytest.raises(ValueError, match="^grid: "):
        k.launch(0, x, w, w, x, s, s, 1e-5)


@pytest.mark.parametrize("m,n,k", [(300, 200, 136), (129, 201, 77)])
def test_generic_launch_of_gemm(m, n, k):
    """Any registered kernel launches by name: gemm at its defaults (on sm_90a the TMA +
    wgmma schedule where the tensors are 16-byte aligned, the sm_80 lowering where not)."""
    a, b = make((m, k), torch.bfloat16, "uniform", 1), make((k, n), torch.bfloat16, "uniform", 2)
    c = poisoned((m, n), torch.bfloat16)
    g = kiln_attn.kernel("gemm")
    g.launch(g.grid((m, n)), a, b, c)
    assert rel(c, a.double() @ b.double()) < TOL[torch.bfloat16]
