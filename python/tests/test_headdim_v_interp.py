"""headdim_v != headdim (FlashAttention 3's value head dim, MLA's 192 / 128 among the pairs) and
head dims in no tile width, through PyTorch on kiln's CPU interpreter
(`kiln_attn.interpreter()`): flash_attn_func, kiln_attn.fa3's, flash_attn_varlen_func against
f64 references (shapes no multiple of any block, rows that see no key, GQA, windows, large
magnitudes), the backward of a value head dim apart from the key one, of a padded head dim
and of seqused_q / seqused_k against f64 autograd. Skipped without torch.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import kiln_attn  # noqa: E402
from kiln_attn import decode, fa3  # noqa: E402
from test_flash_attn_interp import SEED, attention, check_rule, draw, gen, grads_of, visible  # noqa: E402

FORWARD_CASES = [
    # (dtype, b, sq, sk, h, hk, d, dv, causal, window)
    (torch.bfloat16, 1, 70, 45, 4, 2, 192, 128, True, (-1, -1)),
    (torch.float16, 2, 33, 71, 2, 1, 64, 128, False, (12, 3)),
    (torch.bfloat16, 1, 50, 50, 3, 3, 128, 64, False, (-1, -1)),
    (torch.bfloat16, 1, 17, 29, 2, 2, 256, 128, True, (-1, -1)),
    # Head dims in no tile width: 40 runs in 64, 72 in 96, 136 in 192.
    (torch.float16, 1, 40, 37, 2, 1, 40, 72, True, (-1, -1)),
    (torch.bfloat16, 1, 21, 66, 4, 2, 136, 24, False, (-1, -1)),
]


def _ids(c):
    return f"{str(c[0])[6:]}-{c[1:8]}-causal{c[8]}-w{c[9]}"


@pytest.mark.parametrize("case", FORWARD_CASES, ids=_ids)
@pytest.mark.parametrize("dist", ["normal", "large"])
@pytest.mark.parametrize("entry", ["fa2", "fa3"])
def test_forward_matches_the_f64_reference(case, dist, entry):
    dtype, b, sq, sk, h, hk, d, dv, causal, window = case
    g = gen(500 + 2 * FORWARD_CASES.index(case) + (dist == "large"))
    q = draw((b, sq, h, d), dtype, dist, g)
    k = draw((b, sk, hk, d), dtype, dist, g)
    v = draw((b, sk, hk, dv), dtype, dist, g)
    scale = 0.8 / math.sqrt(d)
    rule = "fa3" if entry == "fa3" else "fa2"
    seen = visible(sq, sk, causal, window, rule)
    with kiln_attn.interpreter():
        if entry == "fa3":
            out, lse = fa3.flash_attn_func(q, k, v, scale, causal, window_size=window, return_attn_probs=True)
        else:
            out, lse = kiln_attn.flash_attn_func(q, k, v, 0.0, scale, causal, window, return_lse=True)
    ref, ref_lse = attention(q.double(), k.double(), v.double(), scale, seen)
    low, _ = attention(q, k, v, scale, seen)
    assert out.shape == (b, sq, h, dv) and out.dtype == dtype
    check_rule("out", out, ref, low)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite), f"lse: +inf exactly where a row sees no key (seed {SEED})"
    got = lse[finite].double()
    assert (got - ref_lse[finite]).abs().max().item() < 2e-2 * max(1.0, ref_lse[finite].abs().max().item())
    if causal and sq > sk:
        # Bottom-right aligned: the first sq - sk rows see no key and output exactly 0.
        assert (out[:, : sq - sk] == 0).all()


@pytest.mark.parametrize("d, dv", [(192, 128), (64, 128), (56, 40)])
def test_varlen_forward_matches_each_sequence_alone(d, dv):
    g = gen(600 + d)
    lens = [(37, 50), (0, 10), (20, 0), (130, 111), (9, 3)]
    h, hk, dtype = 4, 2, torch.bfloat16
    tq, tk = sum(s for s, _ in lens), sum(s for _, s in lens)
    q = draw((tq, h, d), dtype, "normal", g)
    k = draw((tk, hk, d), dtype, "normal", g)
    v = draw((tk, hk, dv), dtype, "normal", g)
    cu_q = torch.tensor([0] + [sum(s for s, _ in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(s for _, s in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    with kiln_attn.interpreter():
        out, lse = kiln_attn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(s for s, _ in lens), max(s for _, s in lens), causal=True, return_lse=True
        )
    assert out.shape == (tq, h, dv) and lse.shape == (h, tq)
    for i, (sq, sk) in enumerate(lens):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qs, ks, vs = q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk]
        seen = visible(sq, sk, True, (-1, -1))
        ref, ref_lse = attention(qs.double(), ks.double(), vs.double(), d ** -0.5, seen)
        low, _ = attention(qs, ks, vs, d ** -0.5, seen)
        check_rule(f"sequence {i}", out[None, q0 : q0 + sq], ref, low)
        got_lse = lse[:, q0 : q0 + sq]
        assert torch.equal(torch.isinf(got_lse), torch.isinf(ref_lse[0])), f"sequence {i} (seed {SEED})"


BACKWARD_CASES = [
    # (dtype, sq, sk, h, hk, d, dv, causal, window)
    (torch.bfloat16, 70, 45, 4, 2, 192, 128, True, (-1, -1)),
    (torch.float16, 33, 71, 2, 1, 64, 128, False, (12, 3)),
    (torch.bfloat16, 50, 50, 2, 2, 128, 64, False, (-1, -1)),
    # Head dims in no tile width: 40 runs in 64 beside 72 in 96.
    (torch.float16, 40, 37, 2, 1, 40, 72, True, (-1, -1)),
]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1:7]}-causal{c[7]}-w{c[8]}")
@pytest.mark.parametrize("deterministic", [False, True])
def test_the_backward_of_a_value_head_dim_apart_matches_the_f64_reference(case, deterministic):
    # FlashAttention 3's headdim_v (MLA's 192 / 128): dq, dk of q's and k's head dim, dv of
    # v's, against f64 autograd by FlashAttention's rule.
    dtype, sq, sk, h, hk, d, dv, causal, window = case
    g = gen(700 + BACKWARD_CASES.index(case))
    q = draw((1, sq, h, d), dtype, "normal", g)
    k = draw((1, sk, hk, d), dtype, "normal", g)
    v = draw((1, sk, hk, dv), dtype, "normal", g)
    dout = draw((1, sq, h, dv), dtype, "normal", g)
    scale = 0.8 / math.sqrt(d)
    seen = visible(sq, sk, causal, window)
    with kiln_attn.interpreter():
        out, grads = grads_of(
            lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, 0.0, scale, causal, window,
                                                      deterministic=deterministic),
            (q, k, v), dout)
    ref, ref_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen)[0], [t.double() for t in (q, k, v)],
                              dout.double())
    low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen)[0], (q, k, v), dout)
    check_rule("out", out, ref, low)
    for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
        assert got.shape == r.shape, name
        check_rule(name, got, r, lo)


def test_the_low_level_backward_takes_a_value_head_dim_apart_and_checks_its_shapes():
    g = gen(710)
    q = draw((1, 20, 2, 192), torch.bfloat16, "normal", g)
    k = draw((1, 30, 2, 192), torch.bfloat16, "normal", g)
    v = draw((1, 30, 2, 128), torch.bfloat16, "normal", g)
    dq, dk, dv = (torch.full_like(t, 7.0) for t in (q, k, v))
    with kiln_attn.interpreter(), torch.no_grad():
        o, lse, _, _ = kiln_attn._flash_attn_forward(q, k, v, 0.0, None, False, -1, -1, 0.0, None, False)
        assert o.shape == (1, 20, 2, 128)
        # dv in k's head dim: refused, named, before anything is written.
        bad = torch.full_like(k, 7.0)
        with pytest.raises(ValueError, match=r"^dv: expected shape \[1, 30, 2, 128\] \(v's\)"):
            kiln_attn._flash_attn_backward(torch.ones_like(o), q, k, v, o, lse, dq, dk, bad, 0.0, None, False,
                                           -1, -1, 0.0, None, False)
        assert (dq == 7.0).all() and (dk == 7.0).all() and (bad == 7.0).all()
        kiln_attn._flash_attn_backward(torch.ones_like(o), q, k, v, o, lse, dq, dk, dv, 0.0, None, False,
                                       -1, -1, 0.0, None, False)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not (t == 7.0).any() and not t.isnan().any(), name


@pytest.mark.parametrize("d", [40, 72])
def test_a_head_dim_in_no_tile_width_differentiates_to_the_reference(d):
    # 40 runs in 64-wide tiles, 72 in 96: the columns past the tensor read 0, none written.
    g = gen(800 + d)
    b, sq, sk, h, hk = 1, 37, 45, 4, 2
    q = draw((b, sq, h, d), torch.bfloat16, "normal", g)
    k = draw((b, sk, hk, d), torch.bfloat16, "normal", g)
    v = draw((b, sk, hk, d), torch.bfloat16, "normal", g)
    dout = draw((b, sq, h, d), torch.bfloat16, "normal", g)
    seen = visible(sq, sk, True, (-1, -1))
    scale = d ** -0.5
    with kiln_attn.interpreter():
        out, (dq, dk, dv) = grads_of(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    ref, ref_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen)[0], [t.double() for t in (q, k, v)],
                              dout.double())
    low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, scale, seen)[0], (q, k, v), dout)
    check_rule("out", out, ref, low)
    for name, got, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_grads, low_grads):
        check_rule(name, got, r, lo)


def test_fake_implementations_give_the_value_head_dim():
    q = torch.empty((2, 9, 4, 192), dtype=torch.bfloat16, device="meta")
    k = torch.empty((2, 11, 2, 192), dtype=torch.bfloat16, device="meta")
    v = torch.empty((2, 11, 2, 128), dtype=torch.bfloat16, device="meta")
    out, lse, _, _ = torch.ops.kiln_attn._flash_attn_forward(q, k, v, 0.0, None, False, -1, -1, 0.0, None, False)
    assert out.shape == (2, 9, 4, 128) and lse.shape == (2, 4, 9)
    cu = torch.empty((3,), dtype=torch.int32, device="meta")
    out, lse, _, _ = torch.ops.kiln_attn._flash_attn_varlen_forward(
        q[0], k[0], v[0], cu, cu, 9, 11, 0.0, None, False
    )
    assert out.shape == (9, 4, 128) and lse.shape == (4, 9)


def test_the_split_count_is_the_kernels_own(monkeypatch):
    # kiln_attn asks the native module, which runs kiln_examples::attention_decode::num_splits.
    from kiln_attn import _native

    calls = []
    real = _native._num_splits

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(_native, "_num_splits", spy)
    assert decode.num_splits_heuristic(1, 8, 1, 32768, 64, 132) == 15
    assert calls == [(1, 8, 1, 32768, 64, 132)]
    # The Rust unit test's values.
    assert [real(64, 8, 1, 32768, 64, 132), real(1, 8, 1, 64, 64, 132), real(1, 8, 1, 300, 64, 132)] == [1, 1, 2]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("which", ["both", "q", "k"])
def test_seqused_uses_the_first_rows_and_keys_and_leaves_the_rest_unwritten(causal, which):
    # FlashAttention 3's seqused_q / seqused_k: sequence b attends with its first seqused_q[b]
    # rows to its first seqused_k[b] keys; a missing one is the whole sequence.
    g = gen(900 + causal)
    lens = [(37, 50), (64, 64), (20, 10), (9, 30), (131, 90)]
    used = [(20, 31), (64, 64), (0, 10), (9, 0), (100, 90)]
    h, hk, d, dv, dtype = 4, 2, 64, 128, torch.bfloat16
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = draw((tq, h, d), dtype, "normal", g)
    k = draw((tk, hk, d), dtype, "normal", g)
    v = draw((tk, hk, dv), dtype, "large", g)
    cu_q = torch.tensor([0] + [sum(a for a, _ in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(b for _, b in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    uq = torch.tensor([a for a, _ in used], dtype=torch.int32) if which in ("both", "q") else None
    uk = torch.tensor([b for _, b in used], dtype=torch.int32) if which in ("both", "k") else None
    with kiln_attn.interpreter():
        out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 131, 90, seqused_q=uq, seqused_k=uk,
                                              causal=causal, return_attn_probs=True)
    # The same call into a NaN output of the caller's: rows past seqused_q must stay NaN.
    poisoned = torch.full((tq, h, dv), float("nan"), dtype=dtype)
    both = fa3._used_lengths(uq, uk, cu_q, cu_k)
    from kiln_attn import _native

    _native._varlen_fwd(q, k, v, cu_q, cu_k, 131, 90, None, causal, out=poisoned, fa3_window=True, interpret=True,
                        seqused_q=both[0], seqused_k=both[1])
    assert torch.equal(poisoned[~poisoned.isnan()], out[~poisoned.isnan()])
    assert out.shape == (tq, h, dv)
    for i, ((sq, sk), (nq, nk)) in enumerate(zip(lens, used)):
        nq = nq if uq is not None else sq
        nk = nk if uk is not None else sk
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qs, ks, vs = q[None, q0 : q0 + nq], k[None, k0 : k0 + nk], v[None, k0 : k0 + nk]
        seen = visible(nq, nk, causal, (-1, -1))
        ref, ref_lse = attention(qs.double(), ks.double(), vs.double(), d ** -0.5, seen)
        low, _ = attention(qs, ks, vs, d ** -0.5, seen)
        check_rule(f"sequence {i}", out[None, q0 : q0 + nq], ref, low)
        got_lse = lse[:, q0 : q0 + nq]
        assert torch.equal(torch.isinf(got_lse), torch.isinf(ref_lse[0])), f"sequence {i} (seed {SEED})"
        assert not poisoned[q0 : q0 + nq].isnan().any(), f"sequence {i}: a used row left unwritten"
        assert poisoned[q0 + nq : q0 + sq].isnan().all(), f"sequence {i}: rows past seqused_q written"


@pytest.mark.parametrize("causal, dv, deterministic", [(False, 64, False), (True, 128, True), (True, 64, False)])
@pytest.mark.parametrize("which", ["both", "k"])
def test_seqused_backward_is_each_sequences_over_its_used_rows_and_zero_past_them(causal, dv, deterministic, which):
    # FlashAttention 3's semantics: sequence b's gradients are its dense backward's over its
    # first seqused_q[b] rows and seqused_k[b] keys; its rows past them get dq = 0 and its keys
    # past them dk = dv = 0 (the forward never read them). A missing one is the whole sequence.
    g = gen(950 + causal + 2 * (dv == 128) + 4 * (which == "k"))
    lens = [(37, 50), (20, 10), (9, 30), (70, 45)]
    used = [(20, 31), (0, 10), (9, 0), (64, 45)]
    h, hk, d, dtype = 4, 2, 64, torch.bfloat16
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = draw((tq, h, d), dtype, "normal", g)
    k = draw((tk, hk, d), dtype, "normal", g)
    v = draw((tk, hk, dv), dtype, "normal", g)
    dout = draw((tq, h, dv), dtype, "normal", g)
    cu_q = torch.tensor([0] + [sum(a for a, _ in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(b for _, b in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    uq = torch.tensor([a for a, _ in used], dtype=torch.int32) if which == "both" else None
    uk = torch.tensor([b for _, b in used], dtype=torch.int32)
    with kiln_attn.interpreter():
        _, (dq, dk, dv_) = grads_of(
            lambda q, k, v: fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 50, seqused_q=uq, seqused_k=uk,
                                                       causal=causal, deterministic=deterministic),
            (q, k, v), dout)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    for i, ((sq, sk), (nq, nk)) in enumerate(zip(lens, used)):
        nq = nq if uq is not None else sq
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qs, ks, vs = q[None, q0 : q0 + nq], k[None, k0 : k0 + nk], v[None, k0 : k0 + nk]
        seen = visible(nq, nk, causal, (-1, -1))
        dos = dout[None, q0 : q0 + nq]
        _, ref = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen)[0], [t.double() for t in (qs, ks, vs)],
                          dos.double())
        _, low = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen)[0], (qs, ks, vs), dos)
        got = (dq[None, q0 : q0 + nq], dk[None, k0 : k0 + nk], dv_[None, k0 : k0 + nk])
        for name, t, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
            check_rule(f"sequence {i} {name}", t, r, lo)
        assert (dq[q0 + nq : q0 + sq] == 0).all(), f"sequence {i}: dq past seqused_q"
        assert (dk[k0 + nk : k0 + sk] == 0).all(), f"sequence {i}: dk past seqused_k"
        assert (dv_[k0 + nk : k0 + sk] == 0).all(), f"sequence {i}: dv past seqused_k"


def test_bad_used_lengths_name_themselves():
    g = gen(960)
    q = draw((30, 2, 64), torch.bfloat16, "normal", g)
    k = draw((40, 2, 64), torch.bfloat16, "normal", g)
    v = draw((40, 2, 64), torch.bfloat16, "normal", g)
    cu_q = torch.tensor([0, 10, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 40], dtype=torch.int32)
    used = torch.tensor([5, 20], dtype=torch.int32)
    with kiln_attn.interpreter():
        with torch.no_grad():
            with pytest.raises(ValueError, match=r"^seqused_q: expected 2 lengths \(one per sequence\), got 3$"):
                fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 25, seqused_q=cu_q)
            with pytest.raises(TypeError, match=r"^seqused_k: expected dtype torch.int32, got torch.int64$"):
                fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 25, seqused_k=used.long())


@pytest.mark.parametrize("d, dv", [(36, 36), (20, 100), (250, 13)])
def test_head_dims_that_are_no_multiple_of_8_are_padded_and_differentiate(d, dv):
    # FlashAttention 2's rule: zero columns to a multiple of 8, the output cut back to dv; the
    # default scale is the unpadded head dim's.
    g = gen(1000 + d)
    b, sq, sk, h, hk = 1, 29, 41, 2, 1
    q = draw((b, sq, h, d), torch.float16, "normal", g)
    k = draw((b, sk, hk, d), torch.float16, "normal", g)
    v = draw((b, sk, hk, dv), torch.float16, "normal", g)
    dout = draw((b, sq, h, dv), torch.float16, "normal", g)
    seen = visible(sq, sk, True, (-1, -1))
    with kiln_attn.interpreter():
        out, grads = grads_of(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    ref, ref_grads = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen)[0], [t.double() for t in (q, k, v)],
                              dout.double())
    low, low_grads = grads_of(lambda q, k, v: attention(q, k, v, d ** -0.5, seen)[0], (q, k, v), dout)
    assert out.shape == (b, sq, h, dv)
    check_rule("out", out, ref, low)
    for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
        assert got.shape == r.shape
        check_rule(name, got, r, lo)
    with kiln_attn.interpreter(), pytest.raises(ValueError, match=r"^q: headdim 260 is not supported"):
        kiln_attn.flash_attn_func(draw((1, 4, 1, 260), torch.float16, "normal", g),
                                  draw((1, 4, 1, 260), torch.float16, "normal", g),
                                  draw((1, 4, 1, 260), torch.float16, "normal", g))
