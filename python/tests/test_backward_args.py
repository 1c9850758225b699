"""The backward's argument checks, and FlashAttention 3's interface (kiln_attn.fa3), without
torch or a GPU: fake tensors (fakes.py) through the native backward, whose checks run before
anything is allocated or launched, so every rejected call raises a ValueError naming the
argument and no kernel ever sees a tensor it would read or write out of bounds."""

import inspect

import pytest

import kiln_attn
from kiln_attn import _native, fa3
from fakes import F16, F32, I32, FakeTensor, bshd, offsets


def grads(b=2, sq=100, sk=70, h=4, hk=2, d=64, **over):
    """A valid backward call's tensors, any replaced through `over`."""
    t = {
        "dout": bshd(b, sq, h, d),
        "q": bshd(b, sq, h, d),
        "k": bshd(b, sk, hk, d),
        "v": bshd(b, sk, hk, d),
        "out": bshd(b, sq, h, d),
        "softmax_lse": FakeTensor((b, h, sq), dtype=F32),
        "dq": bshd(b, sq, h, d),
        "dk": bshd(b, sk, hk, d),
        "dv": bshd(b, sk, hk, d),
    }
    t.update(over)
    return t


def bwd(**over):
    t = grads(**over)
    names = ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv"]
    return _native._bwd(*[t[n] for n in names], 0.125, True)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"dout": bshd(2, 99, 4, 64)}, r"^dout: expected shape \[2, 100, 4, 64\] \(q's in v's head dim\), got \[2, 99, 4, 64\]$"),
        ({"dout": bshd(2, 100, 4, 64, dtype=F16)}, r"^dout: expected dtype torch.bfloat16 \(q's\), got torch.float16$"),
        ({"dout": bshd(2, 100, 4, 64, device="cuda:1")}, r"^dout: expected a tensor on cuda:0 \(q's device\), got a tensor on cuda:1$"),
        ({"dout": bshd(2, 100, 4, 64, device="cpu")}, r"^dout: expected a tensor on cuda:0"),
        ({"out": bshd(2, 100, 4, 32)}, r"^out: expected shape \[2, 100, 4, 64\]"),
        ({"softmax_lse": FakeTensor((2, 4, 128), dtype=F32)}, r"^softmax_lse: expected shape \[2, 4, 100\] \(\[batch, nheads, seqlen_q\], the forward's\), got \[2, 4, 128\]$"),
        ({"softmax_lse": FakeTensor((2, 4, 100))}, r"^softmax_lse: expected dtype torch.float32, got torch.bfloat16$"),
        ({"softmax_lse": FakeTensor((2, 4, 100), dtype=F32, strides=(400, 100, 2))}, r"^softmax_lse: expected non-negative strides and a contiguous last dimension"),
        ({"dq": bshd(2, 100, 4, 64, dtype=F32)}, r"^dq: expected dtype torch.bfloat16 \(q's\), got torch.float32$"),
        ({"dq": FakeTensor((2, 100, 4))}, r"^dq: expected shape \[2, 100, 4, 64\] \(q's\), got \[2, 100, 4\]$"),
        ({"dk": bshd(2, 70, 4, 64)}, r"^dk: expected shape \[2, 70, 2, 64\] \(k's\), got \[2, 70, 4, 64\]$"),
        ({"dv": bshd(2, 70, 2, 64, strides=(70 * 128, 128, 64, 2))}, r"^dv: expected a contiguous last dimension"),
        ({"dv": bshd(2, 71, 2, 64)}, r"^dv: expected shape \[2, 70, 2, 64\] \(v's\)"),
    ],
)
def test_a_bad_gradient_or_buffer_is_a_value_error_naming_it(over, message):
    with pytest.raises(ValueError, match=message):
        bwd(**over)


def test_a_non_tensor_gradient_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"^dout: expected a torch.Tensor, got list$"):
        bwd(dout=[1.0])
    with pytest.raises(TypeError, match=r"^dk: expected a torch.Tensor, got NoneType$"):
        bwd(dk=None)


def test_the_forwards_checks_come_first():
    with pytest.raises(TypeError, match=r"^k: expected dtype torch.bfloat16 \(q's\), got torch.float16$"):
        bwd(k=bshd(2, 70, 2, 64, dtype=F16))
    with pytest.raises(ValueError, match=r"^k: expected headdim 80 \(q's\), got 64$"):
        bwd(q=bshd(2, 100, 4, 80))


def varlen_bwd(total_q=300, total_k=500, h=4, hk=2, d=64, **over):
    t = {
        "dout": FakeTensor((total_q, h, d)),
        "q": FakeTensor((total_q, h, d)),
        "k": FakeTensor((total_k, hk, d)),
        "v": FakeTensor((total_k, hk, d)),
        "out": FakeTensor((total_q, h, d)),
        "softmax_lse": FakeTensor((h, total_q), dtype=F32),
        "dq": FakeTensor((total_q, h, d)),
        "dk": FakeTensor((total_k, hk, d)),
        "dv": FakeTensor((total_k, hk, d)),
    }
    t.update(over)
    names = ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv"]
    cu_q, cu_k = offsets([0, 100, 300]), offsets([0, 250, 500])
    return _native._varlen_bwd(*[t[n] for n in names], cu_q, cu_k, 200, 250)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"dout": FakeTensor((299, 4, 64))}, r"^dout: expected shape \[300, 4, 64\] \(q's in v's head dim\), got \[299, 4, 64\]$"),
        ({"dq": FakeTensor((300, 4, 64), dtype=F16)}, r"^dq: expected dtype torch.bfloat16 \(q's\)"),
        ({"dk": FakeTensor((500, 4, 64))}, r"^dk: expected shape \[500, 2, 64\] \(k's\)"),
        ({"softmax_lse": FakeTensor((4, 301), dtype=F32)}, r"^softmax_lse: expected shape \[4, 300\] \(\[nheads, total_q\], the forward's\)"),
        ({"softmax_lse": FakeTensor((2, 4, 300), dtype=F32)}, r"^softmax_lse: expected shape \[4, 300\]"),
        ({"out": FakeTensor((300, 4, 96))}, r"^out: expected shape \[300, 4, 64\] \(q's, v's head dim\)"),
    ],
)
def test_varlen_gradients_are_checked_by_name(over, message):
    with pytest.raises(ValueError, match=message):
        varlen_bwd(**over)


def test_fa3_signatures_are_flash_attention_3s():
    params = list(inspect.signature(fa3.flash_attn_func).parameters)
    assert params == [
        "q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
        "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic",
        "sm_margin", "return_attn_probs",
    ]
    params = list(inspect.signature(fa3.flash_attn_varlen_func).parameters)
    assert params[:11] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
        "seqused_q", "seqused_k", "softmax_scale", "causal",
    ]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"qv": bshd(1, 64, 2, 64)}, r"^qv: kiln_attn does not implement qv"),
        ({"q_descale": FakeTensor((1, 2), dtype=F32)}, r"^q_descale: "),
        ({"k_descale": FakeTensor((1, 2), dtype=F32)}, r"^k_descale: "),
        ({"v_descale": FakeTensor((1, 2), dtype=F32)}, r"^v_descale: "),
        ({"attention_chunk": -1}, r"^attention_chunk: expected 0 \(off\) or a chunk length"),
        ({"attention_chunk": 2**31}, r"^attention_chunk: expected 0 \(off\) or a chunk length"),
        ({"num_splits": -1}, r"^num_splits: expected >= 0"),
        ({"window_size": (1, 2, 3)}, r"^window_size: expected a pair"),
    ],
)
def test_fa3_arguments_kiln_does_not_compute_are_refused_by_name(kw, message):
    q = bshd(1, 64, 2, 64)
    with pytest.raises(ValueError, match=message):
        fa3.flash_attn_func(q, q, q, **kw)


def test_fa3_varlen_checks_seqused_by_name():
    q = FakeTensor((300, 4, 64))
    cu = offsets([0, 100, 300])
    two, three = FakeTensor((2,), dtype=I32), FakeTensor((3,), dtype=I32)
    with pytest.raises(ValueError, match=r"^seqused_k: expected 2 lengths \(one per sequence\), got 3$"):
        fa3.flash_attn_varlen_func(q, q, q, cu, cu, 200, 200, seqused_q=two, seqused_k=three)
    with pytest.raises(ValueError, match=r"^seqused_q: expected a 1-D tensor \[batch\], got shape \[2, 1\]$"):
        fa3.flash_attn_varlen_func(q, q, q, cu, cu, 200, 200, seqused_q=FakeTensor((2, 1), dtype=I32), seqused_k=two)


def test_fa3_takes_the_scale_fourth():
    # FlashAttention 3's order: a fourth positional float is the scale, which must be finite.
    q = bshd(1, 64, 2, 64)
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite number, got inf$"):
        fa3.flash_attn_func(q, q, q, float("inf"))


def test_the_package_exports_flash_attention_2s_names():
    for name in ("flash_attn_func", "flash_attn_varlen_func", "interpreter", "fa3"):
        assert hasattr(kiln_attn, name)
