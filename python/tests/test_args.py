"""kiln_attn's argument checks, without torch or a GPU (fake tensors: fakes.py).

Every bad argument must raise TypeError or ValueError naming the argument and what was
expected; a well-formed call gets past every check and, on a machine without a CUDA driver,
fails only when it opens the device (RuntimeError), never with a crash.
"""

import inspect

import pytest

import kiln_attn
from fakes import F16, F32, I32, FakeTensor, bshd, offsets


def driver_present():
    try:
        kiln_attn._target(0)
        return True
    except RuntimeError:
        return False


# A fake tensor's made-up address must never reach a launch on a real GPU.
without_gpu = pytest.mark.skipif(
    driver_present(), reason="a CUDA driver is present: test_flash_attn_gpu.py covers valid calls"
)


def call(q, k=None, v=None, **kw):
    k = q if k is None else k
    v = k if v is None else v
    return kiln_attn.flash_attn_func(q, k, v, **kw)


def test_signature_is_flash_attention_2s():
    params = inspect.signature(kiln_attn.flash_attn_func).parameters
    assert list(params)[:11] == [
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
        "alibi_slopes", "deterministic", "return_attn_probs",
    ]
    assert params["dropout_p"].default == 0.0
    assert params["softmax_scale"].default is None
    assert params["causal"].default is False
    assert params["window_size"].default == (-1, -1)
    assert params["softcap"].default == 0.0
    assert params["alibi_slopes"].default is None
    assert params["deterministic"].default is False
    assert params["return_attn_probs"].default is False
    # kiln's extras come after FlashAttention's, keyword-only.
    assert params["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY


def test_a_fourth_positional_argument_is_dropout_not_the_scale():
    # FlashAttention 2 code passes dropout_p fourth; kiln once took softmax_scale there, so
    # flash_attn_func(q, k, v, 0.1) meant a scale. Both spellings of a dropout now fail by name.
    q = bshd(1, 64, 2, 64)
    with pytest.raises(ValueError, match=r"^dropout_p: kiln_attn does not implement attention dropout \(got 0.1\)"):
        kiln_attn.flash_attn_func(q, q, q, 0.1)
    with pytest.raises(ValueError, match=r"^dropout_p: "):
        kiln_attn.flash_attn_func(q, q, q, dropout_p=0.5, causal=True)
    with pytest.raises(TypeError, match=r"^dropout_p: expected a float, got NoneType$"):
        kiln_attn.flash_attn_func(q, q, q, None)


@without_gpu
def test_dropout_zero_positionally_gets_past_every_check():
    q = bshd(1, 64, 2, 64)
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        kiln_attn.flash_attn_func(q, q, q, 0.0, 0.125, True)


def test_alibi_slopes_are_refused_by_name():
    q = bshd(1, 64, 2, 64)
    slopes = FakeTensor((2,), dtype=F32)
    with pytest.raises(ValueError, match=r"^alibi_slopes: kiln_attn does not implement ALiBi"):
        kiln_attn.flash_attn_func(q, q, q, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=r"^alibi_slopes: "):
        varlen(alibi_slopes=slopes)


@without_gpu
@pytest.mark.parametrize("window", [(3, 4), [3, 4], (-1, 0)])
def test_window_size_is_any_pair(window):
    q = bshd(1, 64, 2, 64)
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        kiln_attn.flash_attn_func(q, q, q, window_size=window)


@pytest.mark.parametrize(
    "window, error, message",
    [
        ((1, 2, 3), ValueError, r"^window_size: expected a pair \(left, right\), got 3 values$"),
        (5, TypeError, r"^window_size: expected a pair \(left, right\), got int$"),
        ((1.5, 0), TypeError, r"^window_size: expected ints, got float$"),
        ((True, 0), TypeError, r"^window_size: expected ints, got a bool$"),
    ],
)
def test_bad_window_pairs_name_window_size(window, error, message):
    q = bshd(1, 64, 2, 64)
    with pytest.raises(error, match=message):
        kiln_attn.flash_attn_func(q, q, q, window_size=window)


@pytest.mark.parametrize("arg", ["q", "k", "v"])
def test_a_non_tensor_is_a_type_error_naming_it(arg):
    args = {"q": bshd(1, 64, 2, 64), "k": bshd(1, 64, 2, 64), "v": bshd(1, 64, 2, 64)}
    args[arg] = [[1.0, 2.0]]
    with pytest.raises(TypeError, match=f"^{arg}: expected a torch.Tensor, got list$"):
        kiln_attn.flash_attn_func(args["q"], args["k"], args["v"])


def test_rank_is_checked_with_the_expected_layout():
    with pytest.raises(ValueError, match=r"q: expected a 4-D tensor \[batch, seqlen_q, nheads, headdim\], got shape \[64, 2, 64\]"):
        call(FakeTensor((64, 2, 64)))
    with pytest.raises(ValueError, match=r"k: expected a 4-D tensor \[batch, seqlen_k, nheads_k, headdim\]"):
        call(bshd(1, 64, 2, 64), FakeTensor((1, 1, 64, 2, 64)))


def test_shapes_of_k_and_v_must_agree_with_q():
    q = bshd(2, 64, 2, 64)
    with pytest.raises(
        ValueError, match=r"^v: expected shape \[2, 64, 2, headdim_v\] \(k's but for the head dim\), got \[2, 65, 2, 64\]$"
    ):
        call(q, q, bshd(2, 65, 2, 64))
    with pytest.raises(ValueError, match=r"^k: expected batch 2 \(q's\), got 1$"):
        call(q, bshd(1, 64, 2, 64))
    with pytest.raises(ValueError, match=r"^k: expected headdim 64 \(q's\), got 128$"):
        call(q, bshd(2, 64, 2, 128))


def test_dtypes_are_type_errors():
    with pytest.raises(TypeError, match=r"^q: expected dtype torch.bfloat16 or torch.float16, got torch.float32$"):
        call(bshd(1, 64, 2, 64, dtype=F32))
    with pytest.raises(TypeError, match=r"^k: expected dtype torch.bfloat16 \(q's\), got torch.float16$"):
        call(bshd(1, 64, 2, 64), bshd(1, 64, 2, 64, dtype=F16))
    with pytest.raises(TypeError, match=r"^v: expected dtype torch.float16 \(q's\), got torch.bfloat16$"):
        call(bshd(1, 64, 2, 64, dtype=F16), bshd(1, 64, 2, 64, dtype=F16), bshd(1, 64, 2, 64))


@without_gpu
def test_float16_passes_every_check():
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 2, 64, dtype=F16))


def test_devices_must_be_one_cuda_device():
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a tensor on cpu$"):
        call(bshd(1, 64, 2, 64, device="cpu"))
    with pytest.raises(ValueError, match=r"^v: expected a tensor on cuda:0 \(q's device\), got a tensor on cuda:1$"):
        call(bshd(1, 64, 2, 64), bshd(1, 64, 2, 64), bshd(1, 64, 2, 64, device="cuda:1"))


def test_head_count_ratio():
    with pytest.raises(ValueError, match=r"^k: the number of heads in q \(6\) must be a multiple of the number of heads in k and v \(4\)$"):
        call(bshd(1, 64, 6, 64), bshd(1, 64, 4, 64))
    with pytest.raises(ValueError, match=r"must be a multiple of the number of heads in k and v \(0\)"):
        call(bshd(1, 64, 6, 64), bshd(1, 64, 0, 64))


@without_gpu
@pytest.mark.parametrize("nheads_k", [3, 1], ids=["gqa", "mqa"])
def test_grouped_and_multi_query_heads_pass_every_check(nheads_k):
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 6, 64), bshd(1, 80, nheads_k, 64))


@pytest.mark.parametrize("d", [12, 100, 264, 512])
def test_unsupported_head_dims(d):
    want = rf"^q: headdim {d} is not supported \(kiln_attn takes multiples of 8 up to 256, as FlashAttention 3\)$"
    with pytest.raises(ValueError, match=want):
        call(bshd(1, 64, 2, d))
    with pytest.raises(ValueError, match=rf"^v: headdim_v {d} is not supported"):
        call(bshd(1, 64, 2, 64), bshd(1, 64, 2, 64), bshd(1, 64, 2, d))


@without_gpu
@pytest.mark.parametrize("d, dv", [(192, 128), (64, 128), (128, 64), (256, 128), (40, 72)])
def test_value_head_dims_apart_from_the_key_head_dim_pass_every_check(d, dv):
    # FlashAttention 3's headdim_v: only v's last extent differs from k's.
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 4, d), bshd(1, 80, 2, d), bshd(1, 80, 2, dv))


@without_gpu
def test_head_dim_96_passes_every_check():
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 2, 96))


def test_last_dimension_must_be_contiguous():
    q = bshd(1, 64, 2, 64)
    # A (batch, seqlen, headdim, nheads) tensor transposed to the right shape.
    bad = FakeTensor((1, 64, 64, 2)).transpose(2, 3)
    with pytest.raises(ValueError, match=r"^k: expected a contiguous last dimension \(stride 1\), got strides \[8192, 128, 1, 2\]"):
        call(q, bad, q)
    with pytest.raises(ValueError, match=r"^q: expected non-negative strides"):
        call(FakeTensor((1, 64, 2, 64), strides=(-1, 128, 64, 1)), q)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"window_size": (-2, 0)}, r"^window_size: expected \(left, right\) with each -1 \(unbounded\) or >= 0, got \(-2, 0\)$"),
        ({"window_size": (16, -7)}, r"^window_size: expected \(left, right\) .* got \(16, -7\)$"),
        ({"softcap": -1.0}, r"^softcap: expected a finite number >= 0 \(0 is off\), got -1$"),
        ({"softcap": float("nan")}, r"^softcap: expected a finite number >= 0"),
        ({"softcap": float("inf")}, r"^softcap: expected a finite number >= 0"),
        ({"softmax_scale": float("inf")}, r"^softmax_scale: expected a finite number"),
    ],
)
def test_bad_options_are_value_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        call(bshd(1, 64, 2, 64), **kw)


@without_gpu
@pytest.mark.parametrize(
    "kw",
    [
        {"window_size": (128, 0)},
        {"window_size": (-1, 0)},
        {"window_size": (0, 0)},
        {"window_size": (10**12, 10**12)},
        {"window_size": (16, 5), "causal": True},
        {"softcap": 50.0},
        {"softcap": 30.0, "window_size": (32, -1), "causal": True},
        {"return_lse": True},
        {"return_lse": True, "causal": True, "window_size": (8, 8), "softcap": 5.0},
    ],
)
def test_windows_softcaps_and_lse_pass_every_check(kw):
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 2, 64), **kw)


def test_option_types_are_type_errors():
    with pytest.raises(TypeError):
        call(bshd(1, 64, 2, 64), window_size=5)
    with pytest.raises(TypeError):
        call(bshd(1, 64, 2, 64), causal="yes")
    with pytest.raises(TypeError):
        call(bshd(1, 64, 2, 64), window_size=(1.5, 0))
    with pytest.raises(TypeError):
        call(bshd(1, 64, 2, 64), softcap="30")


def test_a_given_output_is_checked_like_an_input():
    q = bshd(2, 100, 4, 64)
    k = bshd(2, 50, 4, 64)
    with pytest.raises(ValueError, match=r"^out: expected shape \[2, 100, 4, 64\] \(q's\), got \[2, 50, 4, 64\]$"):
        call(q, k, out=bshd(2, 50, 4, 64))
    with pytest.raises(TypeError, match=r"^out: expected dtype torch.bfloat16 \(q's\), got torch.float32$"):
        call(q, k, out=bshd(2, 100, 4, 64, dtype=F32))
    with pytest.raises(TypeError, match=r"^out: expected a torch.Tensor, got int$"):
        call(q, k, out=3)


@pytest.mark.parametrize("shape_q, shape_k", [((0, 64, 2, 64), (0, 64, 2, 64)), ((1, 0, 2, 64), (1, 64, 2, 64))])
def test_an_empty_output_launches_nothing(shape_q, shape_k):
    out = call(FakeTensor(shape_q), FakeTensor(shape_k))
    assert isinstance(out, FakeTensor)
    assert out.shape == shape_q


@without_gpu
def test_transposed_bhsd_inputs_pass_every_check():
    # torch.empty(b, h, s, d).transpose(1, 2): a BSHD shape over BHSD memory is read in place;
    # it gets past every check, to opening the device.
    q = FakeTensor((1, 2, 64, 128)).transpose(1, 2)
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(q)


@without_gpu
def test_a_valid_call_without_a_gpu_is_a_runtime_error_not_a_crash():
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        call(bshd(1, 64, 2, 64), causal=True, softmax_scale=0.1)


def varlen(total_q=300, total_k=500, h=4, h_k=2, d=64, cu_q=(0, 100, 300), cu_k=(0, 250, 500), max_q=200, max_k=250, **kw):
    q = FakeTensor((total_q, h, d))
    k = FakeTensor((total_k, h_k, d))
    return kiln_attn.flash_attn_varlen_func(q, k, k, offsets(list(cu_q)), offsets(list(cu_k)), max_q, max_k, **kw)


def test_varlen_signature_is_flash_attention_2s():
    params = inspect.signature(kiln_attn.flash_attn_varlen_func).parameters
    assert list(params)[:16] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
        "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs", "block_table",
    ]
    assert params["window_size"].default == (-1, -1)
    assert params["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY


def test_varlen_refuses_dropout_and_paged_caches_by_name():
    with pytest.raises(ValueError, match=r"^dropout_p: "):
        varlen(dropout_p=0.1)
    with pytest.raises(ValueError, match=r"^block_table: "):
        varlen(block_table=FakeTensor((2, 4), dtype=I32))


@without_gpu
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"causal": True, "window_size": (64, -1), "softcap": 20.0},
        {"return_lse": True},
        {"return_lse": True, "causal": True, "cu_k": (0, 0, 500), "max_k": 500},
    ],
)
def test_a_valid_varlen_call_gets_past_every_check(kw):
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        varlen(**kw)


@without_gpu
@pytest.mark.parametrize(
    "kw",
    [
        {"cu_q": (1, 100, 300)},
        {"cu_q": (0, 200, 100)},
        {"cu_k": (0, 250, 501)},
        {"max_q": 150},
    ],
)
def test_varlen_offset_values_are_the_kernels_to_read(kw):
    # Offsets not from 0, decreasing, past k's rows, or a sequence longer than max_seqlen_q:
    # the values stay on the device, so the call gets past every check (the kernel keeps every
    # access inside the tensors whatever they hold).
    with pytest.raises(RuntimeError, match=r"^kiln_attn: no CUDA driver: "):
        varlen(**kw)


def test_a_varlen_batch_of_empty_query_sequences_launches_nothing():
    out = varlen(total_q=0, cu_q=(0, 0, 0), max_q=0)
    assert isinstance(out, FakeTensor) and out.shape == (0, 4, 64)


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"cu_k": (0, 500)}, ValueError, r"^cu_seqlens_k: expected batch \+ 1 offsets, as many as cu_seqlens_q \(3\)"),
        ({"cu_q": (0,), "cu_k": (0,)}, ValueError, r"^cu_seqlens_k: expected batch \+ 1 offsets, .* at least 2, got 1$"),
        ({"max_k": -1}, ValueError, r"^max_seqlen_k: expected a length"),
        ({"max_q": 2**31}, ValueError, r"^max_seqlen_q: expected a length in 0..=2147483647"),
        ({"h_k": 3}, ValueError, r"must be a multiple of the number of heads in k and v \(3\)"),
        ({"d": 84}, ValueError, r"^q: headdim 84 is not supported \(kiln_attn takes multiples of 8"),
        ({"softcap": -2.0}, ValueError, r"^softcap: expected a finite number >= 0"),
    ],
)
def test_bad_varlen_arguments_name_themselves(kw, error, message):
    with pytest.raises(error, match=message):
        varlen(**kw)


def test_varlen_tensors_are_checked_like_flash_attn_funcs():
    q, k = FakeTensor((300, 4, 64)), FakeTensor((500, 2, 64))
    cu_q, cu_k = offsets([0, 100, 300]), offsets([0, 250, 500])
    f = kiln_attn.flash_attn_varlen_func
    with pytest.raises(ValueError, match=r"^q: expected a 3-D tensor \[total_q, nheads, headdim\], got shape \[1, 300, 4, 64\]$"):
        f(FakeTensor((1, 300, 4, 64)), k, k, cu_q, cu_k, 200, 250)
    with pytest.raises(TypeError, match=r"^cu_seqlens_k: expected dtype torch.int32, got torch.float32$"):
        f(q, k, k, cu_q, offsets([0, 250, 500], dtype=F32), 200, 250)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected a tensor on cuda:0 \(q's device\), got a tensor on cpu$"):
        f(q, k, k, offsets([0, 100, 300], device="cpu"), cu_k, 200, 250)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected a 1-D tensor \[batch \+ 1\]"):
        f(q, k, k, FakeTensor((3, 1), dtype=offsets([0]).dtype), cu_k, 200, 250)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected a contiguous tensor \(stride 1\), got stride 2"):
        f(q, k, k, cu_q, FakeTensor((3,), dtype=offsets([0]).dtype, strides=(2,)), 200, 250)
    with pytest.raises(TypeError, match=r"^cu_seqlens_q: expected a torch.Tensor, got list$"):
        f(q, k, k, [0, 100, 300], cu_k, 200, 250)
    with pytest.raises(ValueError, match=r"^out: expected shape \[300, 4, 64\] \(q's, v's head dim\), got \[500, 2, 64\]$"):
        f(q, k, k, cu_q, cu_k, 200, 250, out=FakeTensor((500, 2, 64)))
    with pytest.raises(TypeError, match=r"^k: expected dtype torch.bfloat16 \(q's\), got torch.float16$"):
        f(q, FakeTensor((500, 2, 64), dtype=F16), k, cu_q, cu_k, 200, 250)
