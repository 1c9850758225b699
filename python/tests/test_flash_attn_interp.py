"""flash_attn_func's forward and backward through PyTorch on kiln's CPU interpreter, against
f64 autograd by FlashAttention's rule (kiln's error within twice a same-dtype PyTorch
reference's): fresh inputs of several distributions (KILN_SEED fixes them), odd shapes, fully
masked rows, GQA, windows, chunks, soft-caps; poisoned buffers; the custom ops' fakes and
torch.compile; the deterministic mode bitwise; varlen; FA2's and FA3's window rules."""

import math
import os
import random

import pytest

torch = pytest.importorskip("torch")

import kiln_attn  # noqa: E402
from kiln_attn import fa3  # noqa: E402

SEED = int(os.environ.get("KILN_SEED", random.randrange(1 << 31)))


def gen(salt):
    g = torch.Generator().manual_seed(SEED + salt)
    return g


def draw(shape, dtype, dist, g):
    """A tensor of `shape` from `dist`: normal, uniform, or large magnitudes (scores in the
    hundreds, so each softmax row is nearly one-hot)."""
    if dist == "normal":
        x = torch.randn(shape, generator=g, dtype=torch.float64)
    elif dist == "uniform":
        x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    else:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 6
    return x.to(dtype)


def visible(sq, sk, causal, window, rule="fa2"):
    """FlashAttention's mask, bottom-right aligned: [sq, sk] bool, True where query i sees key
    j. `window` as the caller gave it, normalised by FlashAttention 2's rule or 3's ("none":
    as given)."""
    left, right = window
    if rule == "fa2":
        left = -1 if left >= sk else left
        right = -1 if right >= sk else right
    elif rule == "fa3":
        left = -1 if left >= sk - 1 else left
        right = -1 if right >= sq - 1 else right
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        seen &= j >= diag - left
    if right >= 0:
        seen &= j <= diag + right
    return seen


def attention(q, k, v, scale, seen, softcap=0.0):
    """Attention in q's dtype as PyTorch computes it (f64 for the reference): q [b, sq, h,
    d], k, v [b, sk, hk, d]; rows that see no key output 0. Returns (out, lse)."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    any_key = seen.any(-1)[:, None]
    s = s.masked_fill(~seen, float("-inf"))
    s = torch.where(any_key, s, torch.zeros_like(s))
    lse = torch.logsumexp(s.double(), dim=-1)
    p = torch.softmax(s, dim=-1) * any_key
    lse = torch.where(any_key[:, 0].expand_as(lse), lse, torch.full_like(lse, math.inf))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def grads_of(fn, tensors, dout):
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_rule(what, got, ref, low, exact=None):
    """FlashAttention's test rule: kiln's error (against `ref`) within twice PyTorch's in the
    inputs' dtype (against `exact`, `ref` unless given), plus an atol relative to the exact
    value's magnitude."""
    exact = ref if exact is None else exact
    assert not torch.isnan(got).any(), f"{what}: NaN (seed {SEED})"
    if got.numel() == 0:
        return
    atol = 1e-3 * max(1.0, exact.abs().max().item())
    assert err(got, ref) <= 2 * err(low, exact) + atol, (
        f"{what}: kiln's error {err(got, ref):.3g} > 2 x PyTorch's {err(low, exact):.3g} + {atol:.3g} (seed {SEED})"
    )


def given_out_grads(q, k, v, dout, out, scale, seen, softcap=0.0):
    """The f64 dq, dk, dv that FlashAttention's backward defines for the forward output `out`
    it is handed: every FlashAttention computes `delta = rowsum(dO * out)` from that rounded
    output, where the exact gradient sums `P dP` (PyTorch's softmax backward does). The
    difference is `-(delta' - delta) * d lse / d s` in dS, so this is the gradient of
    `sum(dO * O) - sum((delta' - delta) * lse)` with the shift held fixed. A row that sees
    few keys and has a large delta keeps out's rounding here, undamped by other rows."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o, lse = attention(*leaves, scale, seen, softcap)
    shift = (dout.double() * (out.double() - o.detach())).sum(-1).transpose(1, 2)
    finite = torch.isfinite(lse)
    loss = (dout.double() * o).sum() - (shift * torch.where(finite, lse, torch.zeros_like(lse))).sum()
    return torch.autograd.grad(loss, leaves)


def check_grads(got, given_out, exact, low, where=""):
    """FlashAttention's rule for each gradient: kiln's error against the gradient its backward
    defines given the forward's output (`given_out_grads`) within twice the error PyTorch in
    the inputs' dtype makes on the exact gradient, plus an atol relative to its magnitude."""
    for name, g, r, e, lo in zip(("dq", "dk", "dv"), got, given_out, exact, low):
        check_rule(f"{name}{where}", g, r, lo, exact=e)


CASES = [
    # (dtype, b, sq, sk, h, hk, d, causal, window, softcap)
    (torch.bfloat16, 1, 37, 45, 4, 2, 64, True, (-1, -1), 0.0),
    (torch.bfloat16, 2, 65, 33, 2, 2, 64, False, (-1, -1), 0.0),
    (torch.float16, 1, 70, 20, 2, 1, 64, True, (-1, -1), 0.0),
    (torch.bfloat16, 1, 50, 77, 3, 1, 96, False, (9, 4), 0.0),
    (torch.float16, 1, 33, 91, 2, 2, 128, False, (-1, -1), 15.0),
    (torch.bfloat16, 1, 81, 40, 4, 2, 64, False, (5, 30), 0.0),
    (torch.bfloat16, 1, 17, 23, 2, 1, 256, True, (-1, -1), 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1:7]}-causal{c[7]}-w{c[8]}-cap{c[9]}")
@pytest.mark.parametrize("dist", ["normal", "large"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_matches_the_f64_reference(case, dist, deterministic):
    dtype, b, sq, sk, h, hk, d, causal, window, softcap = case
    g = gen(100 + 2 * CASES.index(case) + (dist == "large"))
    q = draw((b, sq, h, d), dtype, dist, g)
    k = draw((b, sk, hk, d), dtype, dist, g)
    v = draw((b, sk, hk, d), dtype, dist, g)
    dout = draw((b, sq, h, d), dtype, "normal", g)
    scale = 0.7 / math.sqrt(d)
    seen = visible(sq, sk, causal, window)

    def kiln(q, k, v):
        return kiln_attn.flash_attn_func(
            q, k, v, 0.0, scale, causal, window, softcap, deterministic=deterministic, return_lse=True
        )

    with kiln_attn.interpreter():
        out, (dq, dk, dv) = grads_of(kiln, (q, k, v), dout)
        with torch.no_grad():
            _, lse = kiln(q, k, v)
    ref, ref_grads = grads_of(
        lambda q, k, v: attention(q, k, v, scale, seen, softcap), [t.double() for t in (q, k, v)], dout.double()
    )
    low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen, softcap), (q, k, v), dout)
    assert out.dtype == dtype and dq.dtype == dtype and dk.shape == k.shape
    check_rule("out", out, ref, low)
    given = given_out_grads(q, k, v, dout, out, scale, seen, softcap)
    check_grads((dq, dk, dv), given, ref_grads, low_grads)
    ref_lse = attention(q.double(), k.double(), v.double(), scale, seen, softcap)[1]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite), f"lse: +inf exactly where a row sees no key (seed {SEED})"
    assert (lse[~finite] == math.inf).all()
    assert err(lse[finite], ref_lse[finite]) < 2e-2 * max(1.0, ref_lse[finite].abs().max().item())


def test_rows_that_see_no_key_output_zero_with_zero_gradients():
    # Causal with seqlen_q > seqlen_k: bottom-right aligned, the first 50 rows see no key.
    g = gen(1)
    q = draw((1, 70, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    k = draw((1, 20, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    v = draw((1, 20, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    with kiln_attn.interpreter():
        out, lse, s_dmask = kiln_attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        out.backward(torch.randn(out.shape, generator=g).to(out.dtype))
    assert (out[:, :50] == 0).all()
    assert (lse[:, :, :50] == math.inf).all() and torch.isfinite(lse[:, :, 50:]).all()
    assert (q.grad[:, :50] == 0).all()
    assert s_dmask.numel() == 0 and s_dmask.dtype == q.dtype
    assert not torch.isnan(k.grad).any() and not torch.isnan(v.grad).any()


def test_the_low_level_backward_writes_the_callers_buffers_and_returns_softmax_d():
    g = gen(2)
    b, sq, sk, h, hk, d = 1, 41, 29, 4, 2, 64
    q, dout = (draw((b, sq, h, d), torch.float16, "normal", g) for _ in range(2))
    k, v = (draw((b, sk, hk, d), torch.float16, "normal", g) for _ in range(2))
    with kiln_attn.interpreter():
        out, lse, s_dmask, rng_state = kiln_attn._flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, False)
        dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
        softmax_d = kiln_attn._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, 0.125, True, -1, -1, 0.0, None, False)
        _, (gq, gk, gv) = grads_of(
            lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, softmax_scale=0.125, causal=True), (q, k, v), dout
        )
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64 and s_dmask.numel() == 0
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    assert torch.equal(dq, gq) and torch.equal(dk, gk) and torch.equal(dv, gv)
    want = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    # FlashAttention 2's padding: seqlen_q rounded up to 128, zero past it.
    assert softmax_d.shape == (b, h, 128) and softmax_d.dtype == torch.float32
    assert torch.allclose(softmax_d[..., :sq], want, rtol=1e-3, atol=1e-3)
    assert (softmax_d[..., sq:] == 0).all()


def test_the_low_level_varlen_backward_returns_flash_attention_2s_padded_softmax_d():
    g = gen(3)
    lengths_q, lengths_k = [19, 0, 33], [25, 8, 14]
    q, k, v, cu_q, cu_k = varlen_case(g, lengths_q, lengths_k, 2, 1, 64)
    dout = torch.randn_like(q)
    mq, mk = max(lengths_q), max(lengths_k)
    with kiln_attn.interpreter():
        out, lse, _, _ = kiln_attn._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, 0.0, 0.125, True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        softmax_d = kiln_attn._flash_attn_varlen_backward(
            dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, 0.125, True, -1, -1, 0.0, None, False
        )
    total = int(cu_q[-1])
    assert softmax_d.shape == (2, q.shape[0] + 128 * 3) and softmax_d.dtype == torch.float32
    want = (dout.float() * out.float()).sum(-1).transpose(0, 1)[:, :total]
    assert torch.allclose(softmax_d[:, :total], want, rtol=1e-3, atol=1e-3)
    assert (softmax_d[:, q.shape[0]:] == 0).all()


@pytest.mark.parametrize(
    "buffer, shape_or_dtype, message",
    [
        ("dq", torch.float32, r"^dq: expected dtype torch.bfloat16 \(q's\), got torch.float32$"),
        ("dk", (1, 29, 4, 64), r"^dk: expected shape \[1, 29, 2, 64\] \(k's\)"),
        ("dout", (1, 40, 4, 64), r"^dout: expected shape \[1, 41, 4, 64\] \(q's in v's head dim\)"),
        ("dout", torch.float16, r"^dout: expected dtype torch.bfloat16"),
        ("lse", (1, 4, 128), r"^softmax_lse: expected shape \[1, 4, 41\]"),
        ("out", (1, 41, 4, 32), r"^out: expected shape \[1, 41, 4, 64\]"),
    ],
)
def test_bad_gradients_and_buffers_are_value_errors_and_leave_the_buffers_alone(buffer, shape_or_dtype, message):
    g = gen(3)
    q, dout, out = (draw((1, 41, 4, 64), torch.bfloat16, "normal", g) for _ in range(3))
    k, v = (draw((1, 29, 2, 64), torch.bfloat16, "normal", g) for _ in range(2))
    t = {"dout": dout, "out": out, "lse": torch.zeros(1, 4, 41), "dq": torch.full_like(q, 7.0), "dk": torch.full_like(k, 7.0), "dv": torch.full_like(v, 7.0)}
    like = t[buffer]
    if isinstance(shape_or_dtype, torch.dtype):
        t[buffer] = like.to(shape_or_dtype)
    else:
        t[buffer] = torch.zeros(shape_or_dtype, dtype=like.dtype)
    with kiln_attn.interpreter(), pytest.raises(ValueError, match=message):
        kiln_attn._flash_attn_backward(t["dout"], q, k, v, t["out"], t["lse"], t["dq"], t["dk"], t["dv"], 0.0, None, False, -1, -1, 0.0, None, False)
    for name in ("dq", "dk", "dv"):
        if name != buffer:
            assert (t[name] == 7.0).all(), f"{name} written by a rejected call"


def test_the_deterministic_backward_is_bitwise_reproducible():
    g = gen(4)
    q = draw((1, 53, 4, 64), torch.bfloat16, "normal", g)
    k, v = (draw((1, 67, 1, 64), torch.bfloat16, "normal", g) for _ in range(2))
    dout = draw((1, 53, 4, 64), torch.bfloat16, "normal", g)
    with kiln_attn.interpreter():
        runs = [grads_of(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)[1] for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_a_broadcast_output_gradient_is_accepted():
    # out.sum().backward() hands the backward an expanded gradient (stride 0 everywhere).
    g = gen(5)
    q = draw((1, 19, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    with kiln_attn.interpreter():
        kiln_attn.flash_attn_func(q, q, q).float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()


def test_outputs_require_grad_exactly_when_an_input_does():
    g = gen(6)
    q = draw((1, 16, 2, 64), torch.bfloat16, "normal", g)
    with kiln_attn.interpreter():
        assert not kiln_attn.flash_attn_func(q, q, q).requires_grad
        kv = q.clone().requires_grad_()
        assert kiln_attn.flash_attn_func(q, kv, kv).requires_grad
        with torch.no_grad():
            assert not kiln_attn.flash_attn_func(q, kv, kv).requires_grad


def test_out_is_refused_with_autograd():
    g = gen(7)
    q = draw((1, 16, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    with kiln_attn.interpreter(), pytest.raises(ValueError, match=r"^out: not supported when q, k or v requires grad"):
        kiln_attn.flash_attn_func(q, q, q, out=torch.empty_like(q))


def test_window_size_as_a_tensor_or_list_is_the_same_window():
    g = gen(8)
    q = draw((1, 40, 2, 64), torch.bfloat16, "normal", g)
    with kiln_attn.interpreter():
        a = kiln_attn.flash_attn_func(q, q, q, window_size=(7, 3))
        b = kiln_attn.flash_attn_func(q, q, q, window_size=[7, 3])
        c = kiln_attn.flash_attn_func(q, q, q, window_size=torch.tensor([7, 3]))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_flash_attention_2_and_3_read_a_right_bound_past_seqlen_k_differently():
    # seqlen_q = 90 > seqlen_k = 30, right = 40: FlashAttention 2 drops the bound (>= seqlen_k);
    # FlashAttention 3 keeps it (< seqlen_q - 1), so row i sees keys up to i - 60 + 40.
    g = gen(9)
    q = draw((1, 90, 2, 64), torch.bfloat16, "normal", g)
    k, v = (draw((1, 30, 2, 64), torch.bfloat16, "normal", g) for _ in range(2))
    scale = 1 / 8
    with kiln_attn.interpreter():
        two = kiln_attn.flash_attn_func(q, k, v, window_size=(-1, 40))
        three, lse3 = fa3.flash_attn_func(q, k, v, window_size=(-1, 40), return_attn_probs=True)
    for got, rule in ((two, "fa2"), (three, "fa3")):
        seen = visible(90, 30, False, (-1, 40), rule)
        ref = attention(q.double(), k.double(), v.double(), scale, seen)[0]
        low = attention(q, k, v, scale, seen)[0]
        check_rule(f"out ({rule})", got, ref, low)
    assert not torch.equal(two, three)
    assert (lse3[:, :, :20] == math.inf).all()


def varlen_case(g, lengths_q, lengths_k, h, hk, d, pad=3):
    cu_q = torch.tensor([0, *itertools_accumulate(lengths_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools_accumulate(lengths_k)], dtype=torch.int32)
    tq, tk = int(cu_q[-1]) + pad, int(cu_k[-1]) + pad
    q = draw((tq, h, d), torch.bfloat16, "normal", g)
    k = draw((tk, hk, d), torch.bfloat16, "normal", g)
    v = draw((tk, hk, d), torch.bfloat16, "normal", g)
    return q, k, v, cu_q, cu_k


def itertools_accumulate(xs):
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 2))])
def test_varlen_gradients_match_each_sequence_alone(causal, window):
    g = gen(10)
    lengths_q, lengths_k = [23, 1, 40, 9], [31, 12, 0, 17]
    h, hk, d = 4, 2, 64
    q, k, v, cu_q, cu_k = varlen_case(g, lengths_q, lengths_k, h, hk, d)
    dout = draw(q.shape, torch.bfloat16, "normal", g)
    mq, mk = max(lengths_q), max(lengths_k)
    with kiln_attn.interpreter():
        out, (dq, dk, dv) = grads_of(
            lambda q, k, v: kiln_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, window_size=window),
            (q, k, v),
            dout,
        )
    # Rows no sequence owns: gradient 0.
    assert (dq[int(cu_q[-1]):] == 0).all() and (dk[int(cu_k[-1]):] == 0).all()
    for i in range(len(lengths_q)):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if qe == qs:
            continue
        # Windows of at least max_seqlen_k are unbounded: FlashAttention 2's varlen rule.
        w = tuple(-1 if x >= mk else x for x in window)
        seen = visible(qe - qs, ke - ks, causal, w, rule="none")
        parts = [t[None] for t in (q[qs:qe], k[ks:ke], v[ks:ke])]
        ref, ref_grads = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen), [t.double() for t in parts], dout[None, qs:qe].double())
        low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen), parts, dout[None, qs:qe])
        check_rule(f"out[{i}]", out[None, qs:qe], ref, low)
        given = given_out_grads(*parts, dout[None, qs:qe], out[None, qs:qe], d ** -0.5, seen)
        got = (dq[None, qs:qe], dk[None, ks:ke], dv[None, ks:ke])
        check_grads(got, given, ref_grads, low_grads, f"[{i}]")


def test_fake_implementations_and_registration_pass_opcheck():
    g = gen(11)
    q = draw((1, 21, 2, 64), torch.bfloat16, "normal", g)
    k, v = (draw((1, 18, 1, 64), torch.bfloat16, "normal", g) for _ in range(2))
    with kiln_attn.interpreter():
        out, lse, _, _ = kiln_attn._flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
        fwd_args = (q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
        torch.library.opcheck(torch.ops.kiln_attn._flash_attn_forward.default, fwd_args)
        bwd_args = (q, q, k, v, out, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), 0.0, None, True, -1, -1, 0.0, None, False)
        torch.library.opcheck(torch.ops.kiln_attn._flash_attn_backward.default, bwd_args)


def test_fake_implementations_give_shapes_on_meta_tensors():
    q = torch.empty(2, 100, 8, 128, dtype=torch.float16, device="meta")
    k = torch.empty(2, 70, 2, 128, dtype=torch.float16, device="meta")
    out, lse, s_dmask, rng = torch.ops.kiln_attn._flash_attn_forward(q, k, k, 0.0, None, False, -1, -1, 0.0, None, False)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    d = torch.ops.kiln_attn._flash_attn_backward(q, q, k, k, out, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(k), 0.0, None, False, -1, -1, 0.0, None, False)
    assert d.shape == (2, 8, 128) and d.dtype == torch.float32  # FlashAttention 2 pads seqlen_q to 128
    qv = torch.empty(300, 8, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(500, 2, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse, _, _ = torch.ops.kiln_attn._flash_attn_varlen_forward(qv, kv, kv, cu, cu, 200, 250, 0.0, None, False)
    assert out.shape == qv.shape and lse.shape == (8, 300)


class Block(torch.nn.Module):
    """A small attention block: projections around flash_attn_func."""

    def __init__(self, dim=128, heads=2, kv_heads=1):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim, dtype=torch.bfloat16)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d, dtype=torch.bfloat16)
        self.o = torch.nn.Linear(dim, dim, dtype=torch.bfloat16)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.d).unbind(2)
        y = kiln_attn.flash_attn_func(q, k, v, 0.0, None, True, (16, 0))
        return self.o(y.reshape(b, s, -1))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_torch_compile_traces_a_model_without_a_graph_break(backend):
    torch.manual_seed(SEED)
    model = Block()
    x = torch.randn(1, 24, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with kiln_attn.interpreter():
        y = compiled(x)
        y.float().square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        y_eager = model(x)
        y_eager.float().square().sum().backward()
    # Inductor may fuse the projections differently from eager; the attention is the same.
    torch.testing.assert_close(y, y_eager, rtol=2e-2, atol=1e-2)
    for a, b in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-2)


def test_fa3_varlen_matches_flash_attention_2s_where_the_rules_agree():
    g = gen(12)
    lengths_q, lengths_k = [19, 0, 33], [25, 8, 14]
    q, k, v, cu_q, cu_k = varlen_case(g, lengths_q, lengths_k, 2, 1, 64)
    mq, mk = max(lengths_q), max(lengths_k)
    with kiln_attn.interpreter():
        two, lse2 = kiln_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, window_size=(5, -1), return_lse=True)
        three, lse3 = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, window_size=(5, -1), return_attn_probs=True)
    total = int(cu_q[-1])
    assert torch.equal(two[:total], three[:total]) and torch.equal(lse2[:, :total], lse3[:, :total])


def chunked(seen, sq, sk, chunk):
    """`seen` narrowed to FlashAttention 3's `attention_chunk`: query i sees key j only in the
    chunk of its diagonal key i + sk - sq (floor division, also below key 0)."""
    diag = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    return seen & (torch.div(j, chunk, rounding_mode="floor") == torch.div(diag, chunk, rounding_mode="floor"))


@pytest.mark.parametrize(
    "sq, sk, causal, window, chunk",
    [(70, 70, True, (-1, -1), 16), (45, 90, False, (-1, -1), 32), (90, 45, False, (20, 5), 24), (64, 100, True, (30, -1), 50)],
)
def test_fa3_attention_chunk_forward_and_backward_match_the_f64_reference(sq, sk, causal, window, chunk):
    g = gen(900 + sq + chunk)
    dtype, d = torch.bfloat16, 64
    q = draw((2, sq, 4, d), dtype, "normal", g)
    k = draw((2, sk, 2, d), dtype, "normal", g)
    v = draw((2, sk, 2, d), dtype, "normal", g)
    dout = draw((2, sq, 4, d), dtype, "normal", g)
    scale = 0.7 / math.sqrt(d)
    seen = chunked(visible(sq, sk, causal, window, "fa3"), sq, sk, chunk)

    def kiln(q, k, v):
        return fa3.flash_attn_func(q, k, v, scale, causal, window_size=window, attention_chunk=chunk)

    with kiln_attn.interpreter():
        out, grads = grads_of(kiln, (q, k, v), dout)
    ref, ref_grads = grads_of(
        lambda q, k, v: attention(q, k, v, scale, seen)[0], [t.double() for t in (q, k, v)], dout.double()
    )
    low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen)[0], (q, k, v), dout)
    check_rule("out", out, ref, low)
    check_grads(grads, given_out_grads(q, k, v, dout, out, scale, seen), ref_grads, low_grads)
    # The chunk matters here: without it the output differs.
    unchunked = attention(q.double(), k.double(), v.double(), scale, visible(sq, sk, causal, window, "fa3"))[0]
    assert err(unchunked, ref) > 10 * (err(out, ref) + 1e-3)


def test_fa3_varlen_attention_chunk_is_each_sequences_own():
    # Chunks count from each sequence's first key: the packed call equals each sequence alone.
    g = gen(950)
    lens = [(40, 70), (65, 33), (1, 90)]
    h, hk, d, chunk = 4, 2, 64, 24
    qs = [draw((1, a, h, d), torch.bfloat16, "normal", g) for a, _ in lens]
    ks = [draw((1, b, hk, d), torch.bfloat16, "normal", g) for _, b in lens]
    vs = [draw((1, b, hk, d), torch.bfloat16, "normal", g) for _, b in lens]
    cu_q = torch.tensor([0] + list(itertools_accumulate([a for a, _ in lens])), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools_accumulate([b for _, b in lens])), dtype=torch.int32)
    with kiln_attn.interpreter():
        packed = fa3.flash_attn_varlen_func(
            torch.cat(qs, 1)[0], torch.cat(ks, 1)[0], torch.cat(vs, 1)[0], cu_q, cu_k, 65, 90,
            causal=True, attention_chunk=chunk,
        )
        for i, (a, _) in enumerate(lens):
            alone = fa3.flash_attn_func(qs[i], ks[i], vs[i], causal=True, attention_chunk=chunk)
            assert torch.equal(packed[cu_q[i] : cu_q[i] + a], alone[0]), f"sequence {i} (seed {SEED})"


def test_the_interpreter_context_nests_and_restores():
    from kiln_attn.interface import interpreting

    assert not interpreting()
    with kiln_attn.interpreter():
        with kiln_attn.interpreter():
            assert interpreting()
        assert interpreting()
    assert not interpreting()


def test_torch_compile_takes_one_tensor_as_q_k_and_v_and_shared_offsets():
    # Self-attention's q = k = v, and varlen's cu_seqlens_q = cu_seqlens_k, hand the autograd
    # Function one tensor twice, which torch.compile would refuse without the views kiln makes.
    g = gen(13)
    x = draw((1, 21, 2, 64), torch.bfloat16, "normal", g).requires_grad_()
    lengths = [9, 12]
    xv, _, _, cu, _ = varlen_case(g, lengths, lengths, 2, 2, 64, pad=0)
    xv.requires_grad_()

    def dense(x):
        return kiln_attn.flash_attn_func(x, x, x, causal=True).float().sum()

    def packed(x):
        return kiln_attn.flash_attn_varlen_func(x, x, x, cu, cu, 12, 12, causal=True).float().sum()

    torch._dynamo.reset()
    with kiln_attn.interpreter():
        for fn, t in ((dense, x), (packed, xv)):
            torch.compile(fn, backend="aot_eager", fullgraph=True)(t).backward()
            want = t.grad.clone()
            t.grad = None
            fn(t).backward()
            assert torch.equal(t.grad, want)
