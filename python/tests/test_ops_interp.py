"""kiln_attn.ops end to end without a GPU: every wrapper's plumbing (views, comptime choices,
grids, the order of its kernel's arguments, the outputs it allocates, autograd) runs the real
kernels on kiln's CPU interpreter (`Kernel.interpret` in place of `launch`, over PyTorch CPU
tensors), on small shapes that are no multiple of any tile, against float64 torch; and the
wrappers' argument errors. Needs torch (a CPU build will do), not a GPU.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import kiln_attn  # noqa: E402
from kiln_attn import ops  # noqa: E402

TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}


class Interpreted:
    """A registered kernel whose launches run on the interpreter."""

    def __init__(self, k):
        self.k = k
        self.name = k.name

    def grid(self, *args, **comptime):
        return self.k.grid(*args, **comptime)

    def launch(self, grid, *args, **comptime):
        self.k.interpret(grid, *args, **comptime)


@pytest.fixture
def interp(monkeypatch):
    """ops on the interpreter: its kernels interpreted, CPU tensors let through."""
    monkeypatch.setattr(ops, "_k", lambda name: Interpreted(kiln_attn.kernel(name)))
    monkeypatch.setattr(ops, "_GRIDS", {})

    def host_tensor(name, t):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        return t

    monkeypatch.setattr(ops, "_tensor", host_tensor)


def make(shape, dtype, seed, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (offset + (torch.rand(shape, generator=g) * 2 - 1) * scale).to(dtype)


def rel(out, ref, floor=1e-30):
    """Relative Frobenius error; `floor` bounds the norm it is relative to from below: a
    gradient that cancels to nearly 0 (a norm's dx over one column) is compared absolutely."""
    out, ref = out.double(), ref.double()
    assert bool(out.isfinite().all()), "non-finite output"
    return ((out - ref).norm() / ref.norm().clamp_min(floor)).item()


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("m,n", [(1, 1), (5, 37), (3, 300)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_and_backward(interp, m, n, dtype):
    x = make((m, n), dtype, m + n, scale=30)
    y = ops.softmax(x)
    assert rel(y, torch.softmax(x.double(), -1)) < TOL[dtype]
    dy = make((m, n), dtype, 7)
    yd, dyd = y.double(), dy.double()
    assert rel(ops.softmax_backward(dy, y), yd * (dyd - (dyd * yd).sum(-1, keepdim=True))) < 4 * TOL[dtype]


def test_softmax_other_dims(interp):
    x = make((4, 9, 3), torch.float32, 1)
    for dim in (0, 1, -1):
        assert rel(ops.softmax(x, dim=dim), torch.softmax(x.double(), dim)) < 2e-5


@pytest.mark.parametrize("m,n", [(1, 1), (6, 45), (3, 257)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_and_their_backwards(interp, m, n, dtype):
    x = make((m, n), dtype, 3 * n, scale=5, offset=2)
    w, b = make((n,), dtype, 1) + 1, make((n,), dtype, 2)
    dy = make((m, n), dtype, 4)
    xd = x.double()
    y, mean, rstd = ops.layer_norm(x, (n,), w, b, 1e-5, return_stats=True)
    assert rel(y, F.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)) < TOL[dtype]
    assert (mean.double() - xd.mean(-1)).abs().max().item() <= 1e-5 * xd.abs().max().item()
    leaves = [t.double().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5), leaves, dy.double())
    for g, r in zip(ops.layer_norm_backward(dy, x, (n,), mean, rstd, w), want):
        assert rel(g, r, floor=1e-4) < 4 * TOL[dtype]
    y, rstd = ops.rms_norm(x, (n,), w, 1e-5, return_rstd=True)
    assert rel(y, F.rms_norm(xd, (n,), w.double(), 1e-5)) < TOL[dtype]
    leaves = [t.double().requires_grad_() for t in (x, w)]
    want = torch.autograd.grad(F.rms_norm(leaves[0], (n,), leaves[1], 1e-5), leaves, dy.double())
    for g, r in zip(ops.rms_norm_backward(dy, x, (n,), rstd, w), want):
        assert rel(g, r, floor=1e-4) < 4 * TOL[dtype]


def test_norms_over_several_dims_without_affine(interp):
    x = make((2, 3, 4, 5), torch.float32, 9, scale=3)
    assert rel(ops.layer_norm(x, (4, 5)), F.layer_norm(x.double(), (4, 5))) < 2e-5
    assert rel(ops.rms_norm(x, [5]), F.rms_norm(x.double(), [5], eps=torch.finfo(torch.float32).eps)) < 2e-5


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_and_backward(interp, reduction, dtype):
    m, v = 7, 301
    x = make((m, v), dtype, 5, scale=6)
    t = torch.randint(0, v, (m,), generator=torch.Generator().manual_seed(1))
    t[2] = -100
    loss, lse = ops.cross_entropy(x, t, reduction=reduction, return_lse=True)
    xd = x.double().requires_grad_()
    want = F.cross_entropy(xd, t, reduction=reduction)
    assert rel(loss, want.detach()) < 1e-5
    assert rel(lse, torch.logsumexp(xd.detach(), -1)) < 1e-5
    dloss = torch.ones(()) if reduction != "none" else torch.rand(m, generator=torch.Generator().manual_seed(2))
    (dref,) = torch.autograd.grad(want, xd, dloss.double())
    assert rel(ops.cross_entropy_backward(dloss, x, t, lse, reduction=reduction), dref) < 2 * TOL[dtype]


def test_cross_entropy_non_negative_ignore_index(interp):
    x = make((6, 11), torch.float32, 3)
    t = torch.tensor([0, 4, 4, 10, 2, 4])
    got = ops.cross_entropy(x, t, ignore_index=4)
    assert rel(got, F.cross_entropy(x.double(), t, ignore_index=4)) < 1e-5


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("targets", ["int64", "int32", "strided int64"])
def test_cross_entropy_autograd_reads_targets_where_they_lie(interp, reduction, targets):
    # The kernels read int64 targets as their words and int32 ones as they are; every
    # reduction's gradient through autograd (the mean's divisor from the forward's count).
    m, v = 9, 70
    x = make((m, v), torch.float32, 8, scale=4)
    t = torch.randint(0, v, (2 * m,), generator=torch.Generator().manual_seed(4))
    t[[1, 6]] = -100
    t[3] = 7
    t = {"int64": t[:m], "int32": t[:m].to(torch.int32), "strided int64": t[::2]}[targets]
    logits = x.clone().requires_grad_()
    loss = ops.cross_entropy(logits, t, ignore_index=7, reduction=reduction)
    xd = x.double().requires_grad_()
    # PyTorch's ignores only ignore_index (a negative class is out of its bounds): kiln's
    # ignored rows as PyTorch's.
    tr = torch.where(t >= 0, t.long(), 7)
    want = F.cross_entropy(xd, tr, ignore_index=7, reduction=reduction)
    assert rel(loss, want.detach()) < 1e-5
    dloss = torch.rand(loss.shape, generator=torch.Generator().manual_seed(5)) + 0.5
    (g,) = torch.autograd.grad(loss, logits, dloss)
    (r,) = torch.autograd.grad(want, xd, dloss.double())
    assert rel(g, r) < 1e-5


def test_cross_entropy_ignore_index_beyond_int32_matches_no_class(interp):
    x = make((4, 5), torch.float32, 2)
    t = torch.tensor([0, 3, -100, 4])
    got = ops.cross_entropy(x, t, ignore_index=2**40, reduction="sum")
    assert rel(got, F.cross_entropy(x.double(), t, reduction="sum")) < 1e-5


def test_cross_entropy_mean_over_ignored_rows_only_is_nan(interp):
    x = make((3, 5), torch.float32, 2).requires_grad_()
    t = torch.tensor([-100, 2, -100])
    loss = ops.cross_entropy(x, t, ignore_index=2)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x.detach(), torch.full((3,), 2), ignore_index=2))
    (g,) = torch.autograd.grad(loss, x)
    assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("b,s,h,d,r", [(2, 3, 3, 128, 128), (1, 2, 5, 64, 32)])
def test_rotary(interp, b, s, h, d, r):
    x = make((b, s, h, d), torch.float32, s * h)
    ang = torch.rand((s + 2, r // 2), dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 6.3
    y = ops.rotary(x, ang.cos().float(), ang.sin().float(), offset=2)
    c, sn = ang.cos()[2:][None, :, None, :], ang.sin()[2:][None, :, None, :]
    xd = x.double()
    x1, x2 = xd[..., : r // 2], xd[..., r // 2: r]
    assert rel(y, torch.cat((x1 * c - x2 * sn, x2 * c + x1 * sn, xd[..., r:]), -1)) < 1e-5


M32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Philox4x32-10 of counter (counter, 0, 0, 0) under the 64-bit key (Salmon et al.)."""
    c = [counter, 0, 0, 0]
    k0, k1 = key & M32, key >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c


def dropout_uniforms(seed, n):
    """Flat element i's uniform: word i % 4 of Philox of counter i // 4, mapped as Triton's
    `uint_to_uniform_float` (the word as i32, a negative v as -v - 1, times 4.6566127342e-10 in
    f32)."""
    words = [w for i in range((n + 3) // 4) for w in philox4x32_10(i, seed)][:n]
    v = torch.tensor(words, dtype=torch.int64)
    v = torch.where(v >= 2**31, v - 2**32, v)
    v = torch.where(v < 0, -v - 1, v)
    return v.to(torch.int32).to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dropout(interp, dtype):
    n = 3001  # no multiple of 4 or of the block
    x = make((n,), dtype, 8) + 3  # never 0
    for p, seed in ((0.1, 7), (0.5, 42), (0.9, 2**32 - 1)):
        y = ops.dropout(x, p, seed=seed)
        assert y.dtype == dtype and y.shape == x.shape
        p32 = torch.tensor(p, dtype=torch.float32)
        kept = dropout_uniforms(seed, n) > p32
        scale = 1 / (1 - p32)
        want = torch.where(kept, (x.float() * scale).to(dtype), torch.zeros((), dtype=dtype))
        assert torch.equal(y, want)
        assert abs(kept.double().mean().item() - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)
    y = ops.dropout(x, 0.25, seed=42)
    assert torch.equal(ops.dropout(x, 0.25, seed=42), y)
    assert not torch.equal(ops.dropout(x, 0.25, seed=43), y)
    assert torch.equal(ops.dropout(x, 0.25, training=False), x)


def test_autograd_through_the_wrappers(interp):
    m, n = 5, 67
    x = make((m, n), torch.float32, 11, scale=3)
    w, b = make((n,), torch.float32, 12) + 1, make((n,), torch.float32, 13)
    dy = make((m, n), torch.float32, 14)
    for fn, ref, inputs in (
        (lambda x: ops.softmax(x), lambda x: torch.softmax(x, -1), (x,)),
        (lambda x, w, b: ops.layer_norm(x, (n,), w, b), lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b)),
        (lambda x, w: ops.rms_norm(x, (n,), w, 1e-5), lambda x, w: F.rms_norm(x, (n,), w, 1e-5), (x, w)),
    ):
        leaves = [t.clone().requires_grad_() for t in inputs]
        got = torch.autograd.grad(fn(*leaves), leaves, dy)
        dl = [t.double().requires_grad_() for t in inputs]
        want = torch.autograd.grad(ref(*dl), dl, dy.double())
        for g, r in zip(got, want):
            assert rel(g, r) < 1e-4
    logits = x.clone().requires_grad_()
    t = torch.tensor([1, 0, 66, -100, 5])
    (g,) = torch.autograd.grad(ops.cross_entropy(logits, t), logits)
    xd = x.double().requires_grad_()
    (r,) = torch.autograd.grad(F.cross_entropy(xd, t), xd)
    assert rel(g, r) < 1e-5
    # Statistics asked for under autograd: outputs that carry no gradient, the main output's
    # the same as without them.
    leaves = [t_.clone().requires_grad_() for t_ in (x, w, b)]
    y, mean, rstd = ops.layer_norm(leaves[0], (n,), leaves[1], leaves[2], return_stats=True)
    assert not mean.requires_grad and not rstd.requires_grad
    got = torch.autograd.grad(y, leaves, dy)
    plain = torch.autograd.grad(ops.layer_norm(leaves[0], (n,), leaves[1], leaves[2]), leaves, dy)
    assert all(torch.equal(a, c) for a, c in zip(got, plain))
    leaves = [t_.clone().requires_grad_() for t_ in (x, w)]
    y, rstd = ops.rms_norm(leaves[0], (n,), leaves[1], 1e-5, return_rstd=True)
    assert not rstd.requires_grad
    got = torch.autograd.grad(y, leaves, dy)
    plain = torch.autograd.grad(ops.rms_norm(leaves[0], (n,), leaves[1], 1e-5), leaves, dy)
    assert all(torch.equal(a, c) for a, c in zip(got, plain))
    loss, lse = ops.cross_entropy(logits, t, return_lse=True)
    assert not lse.requires_grad
    assert rel(lse, torch.logsumexp(x.double(), -1)) < 1e-6
    (g2,) = torch.autograd.grad(loss, logits)
    assert torch.equal(g2, g)
    for dtype in (torch.float32, torch.bfloat16):
        xr = (make((300,), dtype, 15) + 3).requires_grad_()
        y = ops.dropout(xr, 0.5, seed=3)
        (gx,) = torch.autograd.grad(y, xr, torch.ones_like(y))
        assert gx.dtype == dtype
        assert torch.equal(gx != 0, y != 0)


def test_empty_inputs(interp):
    assert ops.softmax(torch.empty((0, 7))).shape == (0, 7)
    assert ops.layer_norm(torch.empty((0, 7)), (7,)).shape == (0, 7)
    assert ops.cross_entropy(torch.empty((0, 7)), torch.empty((0,), dtype=torch.int64), reduction="sum").item() == 0
    assert torch.isnan(ops.cross_entropy(torch.empty((0, 7)), torch.empty((0,), dtype=torch.int64)))


# The wrappers' argument errors (no interpreter: they come before any kernel).


def test_a_cpu_tensor_is_refused_by_name():
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor, got one on cpu$"):
        ops.softmax(torch.zeros(3, 4))


@pytest.mark.parametrize("call,exc,msg", [
    (lambda: ops.softmax("x"), TypeError, r"^x: expected a torch.Tensor, got str$"),
    (lambda: ops.softmax(torch.zeros(3, 4, dtype=torch.float64)), TypeError, r"^x: expected a tensor of torch.float32, torch.bfloat16, torch.float16, got torch.float64$"),
    (lambda: ops.softmax(torch.zeros(3, 4), dim=2), IndexError, r"^dim: 2 is out of range for a 2-D tensor$"),
    (lambda: ops.layer_norm(torch.zeros(3, 4), (5,)), ValueError, r"^normalized_shape: \[5\] is not the trailing shape of x \[3, 4\]$"),
    (lambda: ops.layer_norm(torch.zeros(3, 4), (4,), torch.ones(5)), ValueError, r"^weight: expected 4 elements"),
    (lambda: ops.layer_norm(torch.zeros(3, 4), (4,), torch.ones(4, dtype=torch.bfloat16)), TypeError, r"^weight: expected torch.float32 \(as x\), got torch.bfloat16$"),
    (lambda: ops.layer_norm(torch.zeros(3, 4), (4,), eps=-1.0), ValueError, r"^eps: expected a non-negative number"),
    (lambda: ops.rms_norm(torch.zeros(3, 4), "4"), TypeError, r"^normalized_shape: expected an int or a sequence of ints, got str$"),
    (lambda: ops.cross_entropy(torch.zeros(3, 4), torch.zeros(3)), TypeError, r"^target: expected class indices of torch.int64 or torch.int32, got torch.float32$"),
    (lambda: ops.cross_entropy(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64)), ValueError, r"^target: expected shape \(3,\)"),
    (lambda: ops.cross_entropy(torch.zeros(3, 4), torch.zeros(3, dtype=torch.int64), reduction="avg"), ValueError, r"^reduction: expected one of none, mean, sum, got 'avg'$"),
    (lambda: ops.cross_entropy(torch.zeros(3, 4, 5), torch.zeros(3, dtype=torch.int64)), ValueError, r"^logits: expected a 2-D tensor"),
    (lambda: ops.dropout(torch.zeros(4), p=1.0), ValueError, r"^p: expected a probability in \[0, 1\), got 1.0$"),
    (lambda: ops.dropout(torch.zeros(4, dtype=torch.float64)), TypeError, r"^x: expected a tensor of torch.float32, torch.bfloat16, torch.float16, got torch.float64$"),
    (lambda: ops.dropout(torch.zeros(4), seed=-3), ValueError, r"^seed: expected an int in \[0, 2\^32\)"),
    (lambda: ops.rotary(torch.zeros(1, 4, 2, 64), torch.zeros(3, 32), torch.zeros(3, 32)), ValueError, r"^offset: positions 0..4 must lie within cos's 3 rows$"),
    (lambda: ops.rotary(torch.zeros(1, 4, 2, 64), torch.zeros(4, 40), torch.zeros(4, 40)), ValueError, r"^cos: rotary_dim 80 must be even, at most head_dim 64"),
    (lambda: ops.rotary(torch.zeros(1, 4, 2, 64), torch.zeros(4, 32), torch.zeros(4, 16)), ValueError, r"^sin: expected cos's shape"),
])
def test_wrapper_argument_errors_name_the_argument(interp, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# Any registered kernel, not only the library's rows: through Kernel.interpret as through launch.


def test_any_registered_kernel_interprets_vector_add_and_gemm():
    a, b = make((1000,), torch.float32, 1), make((1000,), torch.float32, 2)
    c = torch.full((1000,), float("nan"))
    k = kiln_attn.kernel("vector_add")
    assert k.signature == "vector_add(a: Tensor<f32, 1>, b: Tensor<f32, 1>, c: TensorMut<f32, 1>)"
    k.interpret(k.grid(1000), a, b, c)
    assert torch.equal(c, a + b)
    m, n, kk = 70, 50, 40
    x, w = make((m, kk), torch.bfloat16, 3), make((kk, n), torch.bfloat16, 4)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    g = kiln_attn.kernel("gemm")
    ct = {"BM": 64, "BN": 64, "BK": 32}
    g.interpret(g.grid((m, n), **ct), x, w, out, **ct)
    assert rel(out, x.double() @ w.double()) < 1e-2
