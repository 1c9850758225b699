"""kiln_attn on a GPU against PyTorch f32 references: FlashAttention's forward and backward test
matrices (odd lengths, seqlen_q > seqlen_k, head dims, causal, GQA/MQA, windows, soft-cap,
varlen), decoding, chunks and value head dims; outputs poisoned first; relative norm error
below 1e-2 (bf16) or 2e-3 (fp16), gradients within FlashAttention's rule. Skipped without torch
or a CUDA device."""

import ctypes
import itertools
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kiln_attn  # noqa: E402

# (seqlen_q, seqlen_k): FlashAttention's forward test pairs, and (1000, 1000).
SEQLENS = [
    (1, 239),
    (3, 799),
    (127, 512),
    (127, 513),
    (113, 203),
    (128, 217),
    (113, 211),
    (108, 256),
    (256, 512),
    (512, 256),
    (1024, 1024),
    (1023, 1024),
    (1024, 1023),
    (1000, 1000),
    (239, 1),
    (799, 3),
    (2048, 2048),
]
HEAD_DIMS = [64, 96, 128, 256]
TOLERANCE = 1e-2
NHEADS = 6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# The tolerance on the relative norm error for each input dtype.
TOLERANCES = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
# The pairs the feature matrix (dtype x local x softcap) runs over: odd lengths, sq < sk,
# sq > sk (rows outside every window), several key blocks.
FEATURE_SEQLENS = [(1, 239), (113, 203), (127, 513), (512, 256), (1023, 1024), (799, 3)]


def batch_for(seqlen_q, seqlen_k):
    """FlashAttention's batch of 4, fewer for the longest pairs (the reference is quadratic)."""
    return 4 if seqlen_q * seqlen_k <= 1024 * 1024 else 2


def masked_scores(q, k, scale, causal, window_size=(-1, -1), softcap=0.0):
    """The f32 (batch, nheads, seqlen_q, seqlen_k) scores of BSHD q and k, masked as
    FlashAttention masks: query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right
    (aligned bottom-right; -1 unbounded; causal makes right 0), -inf elsewhere; soft-capped to
    softcap * tanh(s / softcap) when softcap > 0; k's heads repeated for grouped-query heads.
    Windows are given below seqlen_k, where FlashAttention's normalisation changes nothing."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    s = torch.matmul(q.float().transpose(1, 2), k.float().transpose(1, 2).transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    left, right = window_size
    if causal:
        right = 0
    rows = torch.arange(sq, device=q.device)[:, None]
    cols = torch.arange(sk, device=q.device)[None, :]
    diag = rows + (sk - sq)
    if right >= 0:
        s = s.masked_fill(cols > diag + right, float("-inf"))
    if left >= 0:
        s = s.masked_fill(cols < diag - left, float("-inf"))
    return s


def reference(q, k, v, scale, causal, window_size=(-1, -1), softcap=0.0):
    """Attention in f32 from BSHD inputs over masked_scores; a query row that sees no key
    outputs 0; v's heads repeated for grouped-query heads."""
    s = masked_scores(q, k, scale, causal, window_size, softcap)
    vf = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2).float().transpose(1, 2)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.matmul(p, vf).transpose(1, 2)


def rel_error(out, ref):
    out = out.float()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inputs(batch, sq, sk, nheads, d, seed, nheads_k=None, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda s, h: torch.randn(  # noqa: E731
        (batch, s, h, d), generator=gen, device="cuda", dtype=torch.float32
    ).to(dtype)
    h_k = nheads if nheads_k is None else nheads_k
    return make(sq, nheads), make(sk, h_k), make(sk, h_k)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
def test_output_matches_the_f32_reference(seqlen_q, seqlen_k, d, causal):
    batch = batch_for(seqlen_q, seqlen_k)
    q, k, v = inputs(batch, seqlen_q, seqlen_k, NHEADS, d, seqlen_q * 7919 + seqlen_k * 31 + d)
    out = torch.full_like(q, float("nan"))
    got = kiln_attn.flash_attn_func(q, k, v, causal=causal, out=out)
    assert got is out
    ref = reference(q, k, v, 1.0 / math.sqrt(d), causal)
    err = rel_error(out, ref)
    assert err < TOLERANCE, f"b={batch} sq={seqlen_q} sk={seqlen_k} d={d} causal={causal}: {err:.3e}"


# FlashAttention's mha / gqa / mqa: nheads_k of NHEADS = 6.
@pytest.mark.parametrize("nheads_k", [NHEADS, 3, 2, 1], ids=["mha", "gqa3", "gqa2", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (1024, 1023), (799, 3)])
def test_grouped_query_heads_match_the_reference(seqlen_q, seqlen_k, d, causal, nheads_k):
    q, k, v = inputs(3, seqlen_q, seqlen_k, NHEADS, d, d + nheads_k, nheads_k=nheads_k)
    out = torch.full_like(q, float("nan"))
    kiln_attn.flash_attn_func(q, k, v, causal=causal, out=out)
    err = rel_error(out, reference(q, k, v, 1.0 / math.sqrt(d), causal))
    assert err < TOLERANCE, f"sq={seqlen_q} sk={seqlen_k} d={d} causal={causal} nheads_k={nheads_k}: {err:.3e}"


def window_for(seqlen_q, seqlen_k, seed):
    """A local window as FlashAttention's test draws one: each bound uniform in [0, seqlen_k)."""
    gen = torch.Generator().manual_seed(seed)
    left, right = torch.randint(0, max(seqlen_k, 1), (2,), generator=gen).tolist()
    return left, right


# FlashAttention's forward axes: dtype, local windows, softcap (0 and 50), over head dims
# including 96, causal and not.
@pytest.mark.parametrize("softcap", [0.0, 50.0], ids=["nocap", "softcap50"])
@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("seqlen_q, seqlen_k", FEATURE_SEQLENS)
def test_features_match_the_f32_reference(seqlen_q, seqlen_k, dtype, d, causal, local, softcap):
    seed = seqlen_q * 7919 + seqlen_k * 31 + d
    window = window_for(seqlen_q, seqlen_k, seed) if local else (-1, -1)
    q, k, v = inputs(batch_for(seqlen_q, seqlen_k), seqlen_q, seqlen_k, NHEADS, d, seed, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    kiln_attn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, out=out)
    assert out.dtype == dtype
    ref = reference(q, k, v, 1.0 / math.sqrt(d), causal, window, softcap)
    err = rel_error(out, ref)
    assert err < TOLERANCES[dtype], (
        f"sq={seqlen_q} sk={seqlen_k} {dtype} d={d} causal={causal} window={window} "
        f"softcap={softcap}: {err:.3e}"
    )


@pytest.mark.parametrize("nheads_k", [3, 1], ids=["gqa3", "mqa"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_features_combine_with_grouped_query_heads(dtype, nheads_k):
    q, k, v = inputs(2, 300, 517, NHEADS, 96, nheads_k, nheads_k=nheads_k, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    kiln_attn.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, window_size=(100, -1), softcap=30.0, out=out)
    err = rel_error(out, reference(q, k, v, 0.2, True, (100, -1), 30.0))
    assert err < TOLERANCES[dtype], f"{dtype} nheads_k={nheads_k}: {err:.3e}"


@pytest.mark.parametrize("window", [(10, 5), (-1, 5), (0, 0)])
def test_rows_outside_every_window_output_zero(window):
    # sq = 700 > sk = 200: query i's diagonal key is i - 500, so with right bound 5 the first
    # 495 rows see no key and must output exactly 0.
    q, k, v = inputs(1, 700, 200, 2, 64, 17)
    out = torch.full_like(q, float("nan"))
    kiln_attn.flash_attn_func(q, k, v, window_size=window, out=out)
    blind = 500 - window[1]
    assert torch.all(out[:, :blind] == 0)
    assert rel_error(out, reference(q, k, v, 1.0 / 8, False, window)) < TOLERANCE


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_no_keys_give_zeros(dtype):
    q, _, _ = inputs(2, 100, 1, 4, 64, 31, dtype=dtype)
    k = torch.empty((2, 0, 4, 64), device="cuda", dtype=dtype)
    out = kiln_attn.flash_attn_func(q, k, k, causal=True)
    assert out.shape == q.shape and torch.all(out == 0)
    out, lse = kiln_attn.flash_attn_func(q, k, k, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == float("inf"))


def reference_lse(q, k, scale, causal, window_size=(-1, -1), softcap=0.0):
    """The (batch, nheads, seqlen_q) log-sum-exp of masked_scores, +inf for a row that sees
    no key (FlashAttention-2's value)."""
    lse = torch.logsumexp(masked_scores(q, k, scale, causal, window_size, softcap), dim=-1)
    return lse.masked_fill(lse == float("-inf"), float("inf"))


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal, window, softcap, dtype",
    [
        (113, 203, False, (-1, -1), 0.0, torch.bfloat16),
        (512, 256, True, (-1, -1), 0.0, torch.bfloat16),
        (799, 3, True, (-1, -1), 50.0, torch.float16),
        (1023, 1024, False, (100, 30), 0.0, torch.float16),
        (300, 700, True, (64, -1), 30.0, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_return_lse_gives_flash_attentions_log_sum_exp(seqlen_q, seqlen_k, causal, window, softcap, dtype, d):
    q, k, v = inputs(2, seqlen_q, seqlen_k, NHEADS, d, seqlen_q + d, nheads_k=3, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    got = kiln_attn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True)
    assert isinstance(got, tuple) and len(got) == 2
    out, lse = got
    assert lse.shape == (2, NHEADS, seqlen_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert rel_error(out, reference(q, k, v, scale, causal, window, softcap)) < TOLERANCES[dtype]
    want = reference_lse(q, k, scale, causal, window, softcap)
    assert torch.equal(torch.isinf(lse), torch.isinf(want)), "+inf exactly where a row sees no key"
    finite = torch.isfinite(want)
    assert rel_error(lse[finite], want[finite]) < 1e-5


def test_window_spellings_follow_flash_attention():
    # causal with a window is the window with right = 0; (-1, 0) is causal; a bound of at
    # least seqlen_k is unbounded.
    q, k, v = inputs(1, 300, 400, 2, 128, 23)
    f = lambda **kw: kiln_attn.flash_attn_func(q, k, v, **kw)  # noqa: E731
    assert torch.equal(f(causal=True, window_size=(64, 9)), f(window_size=(64, 0)))
    assert torch.equal(f(window_size=(-1, 0)), f(causal=True))
    assert torch.equal(f(window_size=(400, 10**9)), f())


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_allocated_output_has_qs_shape_dtype_and_device(d):
    q, k, v = inputs(2, 300, 257, 4, d, d)
    out = kiln_attn.flash_attn_func(q, k, v, softmax_scale=0.3)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert out.is_contiguous()
    assert rel_error(out, reference(q, k, v, 0.3, False)) < TOLERANCE


def test_causal_window_spelling_is_causal():
    q, k, v = inputs(1, 200, 300, 2, 64, 5)
    a = kiln_attn.flash_attn_func(q, k, v, causal=True)
    b = kiln_attn.flash_attn_func(q, k, v, causal=True, window_size=(-1, 0))
    assert torch.equal(a, b)


@pytest.mark.parametrize("d", [64, 128])
def test_bhsd_memory_is_read_in_place(d):
    # (b, h, s, d) tensors seen as (b, s, h, d): strides, not a copy.
    b, h, sq, sk = 2, 3, 333, 517
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (
        torch.randn((b, h, s, d), generator=gen, device="cuda").to(torch.bfloat16).transpose(1, 2)
        for s in (sq, sk, sk)
    )
    assert not q.is_contiguous()
    out = kiln_attn.flash_attn_func(q, k, v, causal=True)
    assert rel_error(out, reference(q, k, v, 1.0 / math.sqrt(d), True)) < TOLERANCE


def test_inputs_not_16_byte_aligned_take_the_fallback_and_stay_right():
    # One element in: the base address is 2 bytes past 16-byte alignment, so kiln specialises
    # for unaligned tensors (no TMA) instead of failing.
    b, s, h, d = 1, 200, 2, 64
    n = b * s * h * d
    gen = torch.Generator(device="cuda").manual_seed(3)
    store = torch.randn(3 * n + 1, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = (store[1 + i * n : 1 + (i + 1) * n].view(b, s, h, d) for i in range(3))
    assert q.data_ptr() % 16 != 0
    out = torch.full_like(q, float("nan"))
    kiln_attn.flash_attn_func(q, k, v, out=out)
    assert rel_error(out, reference(q, k, v, 1.0 / math.sqrt(d), False)) < TOLERANCE


def test_runs_on_the_current_stream():
    # The inputs are written on a side stream after a long sleep; had kiln launched anywhere
    # but that stream, it would read the NaNs left there before.
    b, s, h, d = 1, 256, 4, 128
    q, k, v = inputs(b, s, s, h, d, 11)
    qs, ks, vs = (torch.full_like(t, float("nan")) for t in (q, k, v))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for dst, src in ((qs, q), (ks, k), (vs, v)):
            dst.copy_(src)
        out = kiln_attn.flash_attn_func(qs, ks, vs)
    side.synchronize()
    assert rel_error(out, reference(q, k, v, 1.0 / math.sqrt(d), False)) < TOLERANCE


def test_kiln_launches_in_pytorchs_context():
    torch.zeros(1, device="cuda")  # PyTorch's context exists and is current
    libcuda = ctypes.CDLL("libcuda.so.1")
    current = ctypes.c_void_p()
    assert libcuda.cuCtxGetCurrent(ctypes.byref(current)) == 0
    dev = ctypes.c_int()
    assert libcuda.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()) == 0
    primary = ctypes.c_void_p()
    assert libcuda.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev) == 0
    libcuda.cuDevicePrimaryCtxRelease(dev)
    assert current.value == primary.value
    assert kiln_attn._context_handle(torch.cuda.current_device()) == primary.value


def test_a_specialisation_compiles_once():
    import time

    q, k, v = inputs(1, 128, 128, 2, 128, 1)
    kiln_attn.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        kiln_attn.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    assert (time.perf_counter() - start) / 10 < 5e-3, "a cached call took over 5 ms"


def test_a_cpu_tensor_is_a_value_error():
    q = torch.zeros(1, 64, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor, got a tensor on cpu$"):
        kiln_attn.flash_attn_func(q, q, q)


def test_fp32_is_a_type_error():
    q = torch.zeros(1, 64, 2, 64, device="cuda")
    with pytest.raises(TypeError, match="^q: expected dtype torch.bfloat16 or torch.float16, got torch.float32$"):
        kiln_attn.flash_attn_func(q, q, q)


def test_fp16_output_is_fp16():
    q, k, v = inputs(1, 200, 300, 2, 64, 29, dtype=torch.float16)
    out = kiln_attn.flash_attn_func(q, k, v)
    assert out.dtype == torch.float16
    assert rel_error(out, reference(q, k, v, 1.0 / 8, False)) < TOLERANCES[torch.float16]


def test_target_is_hopper_on_an_h200():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not a Hopper GPU")
    assert kiln_attn._target(torch.cuda.current_device()) == "sm_90a"


def packed_batch(lens, nheads, d, seed, dtype=torch.bfloat16, pad=0):
    """Sequences of lengths `lens` drawn from normal(0, 1), packed as FlashAttention's varlen
    tensors `(total + pad, nheads, d)` (the pad rows NaN), and the int32 offsets on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    t = torch.randn((total + pad, nheads, d), generator=gen, device="cuda").to(dtype)
    t[total:] = float("nan")
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    return t, cu


# FlashAttention's varlen forward axes: random lengths per sequence (some empty, some with
# more queries than keys), dtype, head dims, causal, local windows, softcap, GQA.
@pytest.mark.parametrize("softcap", [0.0, 50.0], ids=["nocap", "softcap50"])
@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("max_q, max_k", [(128, 128), (113, 203), (799, 300), (1024, 1023)])
def test_varlen_matches_the_f32_reference_per_sequence(max_q, max_k, dtype, d, causal, local, softcap):
    seed = max_q * 31 + max_k + d
    gen = torch.Generator().manual_seed(seed)
    batch, nheads, nheads_k = 5, 6, 3
    lens_q = torch.randint(0, max_q + 1, (batch,), generator=gen).tolist()
    lens_k = torch.randint(0, max_k + 1, (batch,), generator=gen).tolist()
    lens_q[0], lens_k[-1] = max_q, max_k  # the maxima are reached
    q, cu_q = packed_batch(lens_q, nheads, d, seed, dtype, pad=7)
    k, cu_k = packed_batch(lens_k, nheads_k, d, seed + 1, dtype)
    v, _ = packed_batch(lens_k, nheads_k, d, seed + 2, dtype)
    total_q = sum(lens_q)
    window = window_for(max_q, max_k, seed) if local else (-1, -1)
    # The output is a view of the first total_q rows of a NaN buffer with 7 rows more: a store
    # past the last sequence's end would change them.
    buf = torch.full_like(q, float("nan"))
    out = buf[:total_q]
    kiln_attn.flash_attn_varlen_func(
        q[:total_q], k, v, cu_q, cu_k, max_q, max_k,
        causal=causal, window_size=window, softcap=softcap, out=out,
    )
    assert torch.isnan(buf[total_q:]).all(), "rows past the last sequence were written"
    scale = 1.0 / math.sqrt(d)
    for i in range(batch):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 == q0:
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        # FlashAttention normalises the window by max_seqlen_k; window_for draws below it.
        ref = reference(qs, ks, vs, scale, causal, window, softcap)
        err = rel_error(out[None, q0:q1], ref) if k1 > k0 else float(out[q0:q1].abs().max())
        assert err < TOLERANCES[dtype], (
            f"sequence {i} (sq={q1 - q0} sk={k1 - k0}) {dtype} d={d} causal={causal} "
            f"window={window} softcap={softcap}: {err:.3e}"
        )


# Packed lengths for the varlen log-sum-exp: odd ones, a sequence without queries, one
# without keys, and one with more queries than keys (causal rows that see no key).
VARLEN_LSE_LENS_Q = [113, 0, 45, 300, 1]
VARLEN_LSE_LENS_K = [203, 25, 0, 100, 239]


@pytest.mark.parametrize(
    "causal, window, softcap, dtype",
    [
        (False, (-1, -1), 0.0, torch.bfloat16),
        (True, (-1, -1), 0.0, torch.bfloat16),
        (True, (-1, -1), 50.0, torch.float16),
        (False, (40, 10), 0.0, torch.float16),
    ],
)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_varlen_return_lse_gives_flash_attentions_log_sum_exp(causal, window, softcap, dtype, d):
    nheads, nheads_k = 6, 3
    lens_q, lens_k = VARLEN_LSE_LENS_Q, VARLEN_LSE_LENS_K
    # q keeps 7 pad rows past the last offset: FlashAttention's total_q is q's rows.
    q, cu_q = packed_batch(lens_q, nheads, d, d, dtype, pad=7)
    k, cu_k = packed_batch(lens_k, nheads_k, d, d + 1, dtype)
    v, _ = packed_batch(lens_k, nheads_k, d, d + 2, dtype)
    got = kiln_attn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
        causal=causal, window_size=window, softcap=softcap, return_lse=True,
    )
    assert isinstance(got, tuple) and len(got) == 2
    out, lse = got
    assert lse.shape == (nheads, q.shape[0]) and lse.dtype == torch.float32 and lse.is_contiguous()
    scale = 1.0 / math.sqrt(d)
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 == q0:
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        case = f"sequence {i} (sq={q1 - q0} sk={k1 - k0}) {dtype} d={d} causal={causal} window={window} softcap={softcap}"
        # A sequence without keys: +inf throughout, as flash_attn_func gives a row that sees none.
        want = reference_lse(qs, ks, scale, causal, window, softcap)[0]
        lse_i = lse[:, q0:q1]
        inf = float("inf")
        assert torch.equal(lse_i == inf, want == inf), f"{case}: +inf exactly where a row sees no key"
        finite = torch.isfinite(want)
        if finite.any():
            assert rel_error(lse_i[finite], want[finite]) < 1e-5, case
        if k1 > k0:
            err = rel_error(out[None, q0:q1], reference(qs, ks, vs, scale, causal, window, softcap))
        else:
            err = float(out[q0:q1].abs().max())
        assert err < TOLERANCES[dtype], f"{case}: {err:.3e}"


@pytest.mark.parametrize(
    "cu_q, cu_k",
    [
        ([0, 60, 30, 40], [0, 70, 10, 500]),
        ([0, 60, 2**30, 2**31 - 1], [0, 70, -5, -(2**31)]),
        ([5, -100, 50, 63], [0, 70, 0, 40]),
    ],
    ids=["decreasing", "huge", "negative"],
)
def test_varlen_offsets_of_any_value_never_fault(cu_q, cu_k):
    # The offsets stay on the device, unchecked: whatever they hold, the kernel keeps every
    # load and store inside q, k, v, out and the log-sum-exp (a fault would fail the
    # synchronisation and poison the context), and the buffer rows past out stay NaN.
    q, _ = packed_batch([63], 4, 64, 3)
    k, _ = packed_batch([70], 2, 64, 4)
    buf = torch.full((70, 4, 64), float("nan"), dtype=q.dtype, device="cuda")
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device="cuda") for cu in (cu_q, cu_k))
    kiln_attn.flash_attn_varlen_func(
        q, k, k, cu_q, cu_k, 63, 70, causal=True, return_lse=True, out=buf[:63],
    )
    torch.cuda.synchronize()
    assert torch.isnan(buf[63:]).all(), "rows past out were written"


# ---------------------------------------------------------------------------------------------
# The backward: flash_attn_func as a torch.autograd.Function (kiln's backward kernels).


def attention_in(q, k, v, scale, causal, window_size=(-1, -1), softcap=0.0, chunk=0):
    """Attention computed by PyTorch in q's own dtype: over f32 inputs the reference, over
    bf16 / fp16 ones FlashAttention's `attention_ref` with upcast=False, the low-precision
    reference whose error kiln's must stay within twice of. A row that sees no key outputs 0
    with gradient 0 (no NaN through the softmax of an all -inf row)."""
    group = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vv = v.repeat_interleave(group, dim=2).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2) * scale, kk.transpose(-1, -2))
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    left, right = window_size
    if causal:
        right = 0
    rows = torch.arange(sq, device=q.device)[:, None]
    cols = torch.arange(sk, device=q.device)[None, :]
    diag = rows + (sk - sq)
    seen = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        seen &= cols <= diag + right
    if left >= 0:
        seen &= cols >= diag - left
    if chunk > 0:
        # FlashAttention 3's attention_chunk: only the keys of the diagonal's chunk.
        seen &= torch.div(cols, chunk, rounding_mode="floor") == torch.div(diag, chunk, rounding_mode="floor")
    any_key = seen.any(-1, keepdim=True)
    s = torch.where(any_key, s.masked_fill(~seen, float("-inf")), torch.zeros_like(s))
    p = (torch.softmax(s.float(), dim=-1) * any_key).to(q.dtype)
    return torch.matmul(p, vv).transpose(1, 2)


def gradients(fn, q, k, v, dout):
    """fn's output and the gradients of q, k, v for the output gradient dout."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def assert_within_twice(name, got, ref, low, context):
    """FlashAttention's backward rule: kiln's largest error against the f32 reference within
    twice that of PyTorch computing in the inputs' dtype, plus a small atol."""
    assert not torch.isnan(got).any(), f"{context}: {name} has NaN"
    err = (got.float() - ref).abs().max().item()
    err_pt = (low.float() - ref).abs().max().item()
    atol = 1e-4 + 1e-3 * ref.abs().max().item()
    assert err <= 2 * err_pt + atol, f"{context}: {name} error {err:.3e} > 2 x {err_pt:.3e} + {atol:.1e}"


# FlashAttention 2's backward test lengths (odd ones, seqlen_q > seqlen_k, several blocks).
BWD_SEQLENS = [
    (113, 203),
    (128, 217),
    (113, 211),
    (108, 256),
    (256, 512),
    (512, 256),
    (1024, 1024),
    (1023, 1024),
    (1024, 1023),
    (2048, 2048),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", BWD_SEQLENS)
def test_backward_matches_the_f32_reference(seqlen_q, seqlen_k, d, causal, dtype):
    batch = batch_for(seqlen_q, seqlen_k)
    seed = seqlen_q * 7919 + seqlen_k * 31 + d + 5
    q, k, v = inputs(batch, seqlen_q, seqlen_k, NHEADS, d, seed, dtype=dtype)
    dout = torch.randn_like(q)
    scale = 1.0 / math.sqrt(d)
    got = gradients(lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=causal), q, k, v, dout)
    ref = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), q.float(), k.float(), v.float(), dout.float())
    low = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), q, k, v, dout)
    context = f"b={batch} sq={seqlen_q} sk={seqlen_k} d={d} causal={causal} {dtype}"
    for name, g, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
        assert_within_twice(name, g, r, lo, context)


@pytest.mark.parametrize("nheads_k", [3, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize(
    "causal, window, softcap",
    [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (100, 20), 0.0), (True, (-1, -1), 30.0)],
)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_grouped_heads_windows_and_softcap_backward(nheads_k, causal, window, softcap, d):
    q, k, v = inputs(2, 333, 517, NHEADS, d, d * 13 + nheads_k, nheads_k=nheads_k)
    dout = torch.randn_like(q)
    scale = 0.8 / math.sqrt(d)

    def kiln(q, k, v):
        return kiln_attn.flash_attn_func(q, k, v, 0.0, scale, causal, window, softcap)

    got = gradients(kiln, q, k, v, dout)
    ref = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal, window, softcap), q.float(), k.float(), v.float(), dout.float())
    low = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal, window, softcap), q, k, v, dout)
    context = f"nheads_k={nheads_k} d={d} causal={causal} window={window} softcap={softcap}"
    assert got[2].shape == k.shape
    for name, g, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
        assert_within_twice(name, g, r, lo, context)


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal, window, chunk",
    [(1024, 1024, True, (-1, -1), 256), (333, 517, False, (-1, -1), 100), (700, 450, False, (50, 10), 128)],
)
@pytest.mark.parametrize("d", [64, 128])
def test_fa3_attention_chunk_forward_and_backward(seqlen_q, seqlen_k, causal, window, chunk, d):
    from kiln_attn import fa3

    q, k, v = inputs(2, seqlen_q, seqlen_k, NHEADS, d, seqlen_q + chunk + d, nheads_k=3)
    dout = torch.randn_like(q)
    scale = 0.8 / math.sqrt(d)

    def kiln(q, k, v):
        return fa3.flash_attn_func(q, k, v, scale, causal, window_size=window, attention_chunk=chunk)

    def torch_ref(q, k, v):
        return attention_in(q, k, v, scale, causal, window, 0.0, chunk)

    got = gradients(kiln, q, k, v, dout)
    ref = gradients(torch_ref, q.float(), k.float(), v.float(), dout.float())
    low = gradients(torch_ref, q, k, v, dout)
    context = f"d={d} sq={seqlen_q} sk={seqlen_k} causal={causal} window={window} chunk={chunk}"
    for name, g, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
        assert_within_twice(name, g, r, lo, context)


def test_rows_that_see_no_key_have_zero_gradients_on_the_gpu():
    q, k, v = inputs(1, 300, 100, 4, 128, 77)
    q.requires_grad_()
    out = kiln_attn.flash_attn_func(q, k, v, causal=True)
    out.backward(torch.randn_like(out))
    assert (q.grad[:, :200] == 0).all() and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("d", [64, 128])
def test_the_deterministic_backward_is_bitwise_reproducible_on_the_gpu(d):
    q, k, v = inputs(2, 1023, 1500, NHEADS, d, 3 * d, nheads_k=2)
    dout = torch.randn_like(q)
    fn = lambda q, k, v: kiln_attn.flash_attn_func(q, k, v, causal=True, deterministic=True)  # noqa: E731
    first = gradients(fn, q, k, v, dout)
    for _ in range(3):
        again = gradients(fn, q, k, v, dout)
        for a, b in zip(first[1:], again[1:]):
            assert torch.equal(a, b)


def test_the_low_level_backward_writes_poisoned_buffers():
    q, k, v = inputs(2, 257, 300, 4, 64, 91, nheads_k=2)
    dout = torch.randn_like(q)
    out, lse, _, _ = kiln_attn._flash_attn_forward(q, k, v, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    kiln_attn._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    ref = gradients(lambda q, k, v: attention_in(q, k, v, 0.125, False), q.float(), k.float(), v.float(), dout.float())
    low = gradients(lambda q, k, v: attention_in(q, k, v, 0.125, False), q, k, v, dout)
    for name, g, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:], low[1:]):
        assert_within_twice(name, g, r, lo, "low-level backward")


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward_matches_each_sequence_alone(causal):
    lens_q, lens_k = [113, 0, 45, 300, 1], [203, 25, 0, 100, 239]
    nheads, nheads_k, d = 6, 3, 128
    q, cu_q = packed_batch(lens_q, nheads, d, 5, torch.bfloat16, pad=7)
    # Pad rows finite: the backward kernels read rows no sequence owns whole into their
    # products (masked to 0 there), so a NaN in them would reach dk and dv.
    q = q.nan_to_num(0.25)
    k, cu_k = packed_batch(lens_k, nheads_k, d, 6, torch.bfloat16)
    v, _ = packed_batch(lens_k, nheads_k, d, 7, torch.bfloat16)
    dout = torch.randn_like(q)
    mq, mk = max(lens_q), max(lens_k)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = kiln_attn.flash_attn_varlen_func(*leaves, cu_q, cu_k, mq, mk, causal=causal)
    out.backward(dout)
    dq, dk, dv = (t.grad for t in leaves)
    assert (dq[sum(lens_q):] == 0).all(), "rows past the last sequence have gradient 0"
    scale = 1.0 / math.sqrt(d)
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if q1 == q0 or k1 == k0:
            continue
        parts = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        ref = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), *(t.float() for t in parts), dout[None, q0:q1].float())
        low = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), *parts, dout[None, q0:q1])
        for name, g, r, lo in zip(("dq", "dk", "dv"), (dq[None, q0:q1], dk[None, k0:k1], dv[None, k0:k1]), ref[1:], low[1:]):
            assert_within_twice(name, g, r, lo, f"varlen sequence {i} causal={causal}")


def test_bad_gradients_are_value_errors_on_the_gpu():
    q, k, v = inputs(1, 100, 80, 4, 64, 5)
    out, lse, _, _ = kiln_attn._flash_attn_forward(q, k, v, 0.0, None, False, -1, -1, 0.0, None, False)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with pytest.raises(ValueError, match=r"^dout: expected shape"):
        kiln_attn._flash_attn_backward(q[:, :99], q, k, v, out, lse, dq, dk, dv, 0.0, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match=r"^dk: expected dtype"):
        kiln_attn._flash_attn_backward(q, q, k, v, out, lse, dq, dk.float(), dv, 0.0, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match=r"^softmax_lse: expected a tensor on cuda"):
        kiln_attn._flash_attn_backward(q, q, k, v, out, lse.cpu(), dq, dk, dv, 0.0, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match=r"^dropout_p: "):
        kiln_attn.flash_attn_func(q, k, v, 0.1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_trains_through_flash_attn_func(backend):
    torch.manual_seed(0)
    dim, heads = 256, 2
    proj = torch.nn.Linear(dim, 3 * dim, device="cuda", dtype=torch.bfloat16)

    def step(x):
        q, k, v = proj(x).view(x.shape[0], x.shape[1], 3, heads, dim // heads).unbind(2)
        return kiln_attn.flash_attn_func(q, k, v, causal=True).float().square().mean()

    x = torch.randn(2, 333, dim, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    compiled(x).backward()
    got = proj.weight.grad.clone()
    proj.zero_grad()
    step(x).backward()
    torch.testing.assert_close(got, proj.weight.grad, rtol=2e-2, atol=1e-3)


# flash_attn_with_kvcache and flash_attn_combine: decode against a cache at serving sizes,
# against FlashAttention's semantics computed in f32 (append, rotary, page lookup,
# bottom-right masks, soft-cap, GQA), every cache slot no sequence holds NaN.


def rotate(x, cos, sin, interleaved):
    """x (..., d) rotated in f32 by cos, sin (..., r / 2): FlashAttention's two layouts."""
    r = 2 * cos.shape[-1]
    x = x.float().clone()
    cos, sin = cos.float(), sin.float()
    if interleaved:
        a, b = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., : r // 2].clone(), x[..., r // 2 : r].clone()
        x[..., : r // 2], x[..., r // 2 : r] = a * cos - b * sin, b * cos + a * sin
    return x


def decode_case(seed, b, lens, sq, h, hk, d, s_new, page, rotary, dtype=torch.bfloat16, dv=None):
    """A decode call's tensors: lens (b,) cache lengths before the append; page 0 for a dense
    cache with rows picked by a random cache_batch_idx, else pages of `page` keys through a
    random page table; caches NaN wherever no sequence holds a key; v and v_cache `dv` wide
    (None: d)."""
    dv = d if dv is None else dv
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    longest = int(lens.max()) + s_new
    x = {"q": torch.randn((b, sq, h, d), generator=gen, device=dev).to(dtype)}
    if s_new:
        x["k"] = torch.randn((b, s_new, hk, d), generator=gen, device=dev).to(dtype)
        x["v"] = torch.randn((b, s_new, hk, dv), generator=gen, device=dev).to(dtype)
    if page:
        pps = -(-longest // page) + 1
        pages, page_len = b * pps + 3, page
        table = torch.randperm(pages, generator=gen, device=dev)[: b * pps].reshape(b, pps).to(torch.int32)
        x["page_table"] = table
        cap = pps * page
        j = torch.arange(cap, device=dev)
        slots = (table[:, j // page].long(), (j % page).expand(b, cap))
    else:
        pages, page_len = b + 2, longest + 19
        idx = torch.randperm(pages, generator=gen, device=dev)[:b].to(torch.int32)
        x["cache_batch_idx"] = idx
        cap = page_len
        slots = (idx.long()[:, None].expand(b, cap), torch.arange(cap, device=dev).expand(b, cap))
    held = torch.arange(cap, device=dev)[None, :] < lens[:, None]
    k_cache = torch.full((pages, page_len, hk, d), float("nan"), device=dev, dtype=dtype)
    v_cache = torch.full((pages, page_len, hk, dv), float("nan"), device=dev, dtype=dtype)
    n = int(held.sum())
    k_cache[slots[0][held], slots[1][held]] = torch.randn((n, hk, d), generator=gen, device=dev).to(dtype)
    v_cache[slots[0][held], slots[1][held]] = torch.randn((n, hk, dv), generator=gen, device=dev).to(dtype)
    x.update(k_cache=k_cache, v_cache=v_cache, cache_seqlens=lens.to(torch.int32))
    if rotary:
        angle = torch.rand((cap, rotary[0] // 2), generator=gen, device=dev) * 2 * math.pi
        x["rotary_cos"], x["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
    return x, slots, cap


def decode_reference(x, slots, cap, causal, window, softcap, rotary):
    """FlashAttention's flash_attn_with_kvcache in f32: (k_cache, v_cache after the append,
    out, lse)."""
    q = x["q"]
    b, sq, h, d = q.shape
    hk = x["k_cache"].shape[2]
    lens = x["cache_seqlens"].long()
    k_cache, v_cache = x["k_cache"].clone(), x["v_cache"].clone()
    s_new = x["k"].shape[1] if "k" in x else 0
    left, right = window
    left, right = (-1 if left >= cap else left), (-1 if right >= cap else right)
    if causal:
        right = 0
    local = left >= 0 or right >= 0
    bi = torch.arange(b, device=q.device)[:, None]
    if s_new:
        pos = lens[:, None] + torch.arange(s_new, device=q.device)
        kn = x["k"]
        if rotary:
            kn = rotate(kn, x["rotary_cos"][pos][:, :, None], x["rotary_sin"][pos][:, :, None], rotary[1]).to(q.dtype)
        k_cache[slots[0][bi, pos], slots[1][bi, pos]] = kn
        v_cache[slots[0][bi, pos], slots[1][bi, pos]] = x["v"]
    if rotary:
        pos = lens[:, None] + (torch.arange(sq, device=q.device) if local else torch.zeros(sq, dtype=torch.long, device=q.device))
        q = rotate(q, x["rotary_cos"][pos][:, :, None], x["rotary_sin"][pos][:, :, None], rotary[1]).to(q.dtype)
    keys = k_cache[slots[0], slots[1]].float()  # (b, cap, hk, d)
    vals = v_cache[slots[0], slots[1]].float().nan_to_num(0.0)
    g = h // hk
    keys = keys.repeat_interleave(g, dim=2).transpose(1, 2)  # (b, h, cap, d)
    vals = vals.repeat_interleave(g, dim=2).transpose(1, 2)
    s = torch.matmul(q.float().transpose(1, 2), keys.transpose(-1, -2)) * d ** -0.5  # (b, h, sq, cap)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sk = (lens + s_new)[:, None, None, None]
    t = torch.arange(sq, device=q.device)[None, None, :, None]
    j = torch.arange(cap, device=q.device)[None, None, None, :]
    keep = j < sk
    diag = t + sk - sq
    if left >= 0:
        keep = keep & (j >= diag - left)
    if right >= 0:
        keep = keep & (j <= diag + right)
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = torch.matmul(p, vals).transpose(1, 2)
    return k_cache, v_cache, out, lse.masked_fill(torch.isneginf(lse), math.inf)


DECODE_CASES = [
    # (batch, longest cache, seqlen_q, nheads, nheads_k, d, seqlen_new, page, causal, window, softcap, rotary, splits)
    (4, 1024, 1, 32, 8, 128, 1, 256, False, (-1, -1), 0.0, None, 0),
    (16, 2048, 1, 32, 8, 128, 1, 16, False, (-1, -1), 0.0, (128, False), 0),
    (8, 8192, 1, 32, 8, 128, 0, 256, False, (-1, -1), 0.0, None, 0),
    (4, 4096, 4, 32, 8, 64, 4, 16, True, (-1, -1), 0.0, (64, True), 3),
    (16, 1024, 2, 16, 1, 64, 2, 0, True, (-1, -1), 30.0, None, 1),
    (4, 8000, 1, 16, 16, 128, 1, 0, False, (512, 0), 0.0, (64, True), 0),
    (12, 3000, 3, 32, 4, 128, 3, 256, False, (-1, -1), 0.0, None, 7),
    (4, 2047, 1, 8, 2, 256, 1, 16, False, (-1, -1), 0.0, None, 0),
    # More than 64 packed rows a key/value head: 128-row blocks on sm_90a (one, or two).
    (8, 4096, 4, 32, 1, 128, 4, 128, True, (-1, -1), 0.0, None, 0),
    (4, 3000, 3, 40, 1, 64, 3, 0, False, (-1, -1), 0.0, (64, False), 2),
    (2, 2047, 4, 48, 1, 256, 4, 16, True, (100, 0), 20.0, None, 0),
]


@pytest.mark.parametrize("b, longest, sq, h, hk, d, s_new, page, causal, window, softcap, rotary, splits", DECODE_CASES)
def test_kvcache_matches_flash_attentions_semantics(b, longest, sq, h, hk, d, s_new, page, causal, window, softcap, rotary, splits):
    gen = torch.Generator().manual_seed(longest + b)
    lens = torch.randint(0, longest - s_new + 1, (b,), generator=gen)
    lens[0], lens[-1] = longest - s_new, 1
    x, slots, cap = decode_case(b * 1000 + longest, b, lens.cuda(), sq, h, hk, d, s_new, page, rotary)
    want_k, want_v, want_out, want_lse = decode_reference(x, slots, cap, causal, window, softcap, rotary)
    kw = {k: t for k, t in x.items() if k not in ("q", "k_cache", "v_cache")}
    out, lse = kiln_attn.flash_attn_with_kvcache(
        x["q"], x["k_cache"], x["v_cache"], causal=causal, window_size=window, softcap=softcap,
        rotary_interleaved=rotary[1] if rotary else True, num_splits=splits, return_softmax_lse=True, **kw)
    torch.cuda.synchronize()
    what = f"b={b} longest={longest} sq={sq} h={h}/{hk} d={d} new={s_new} page={page} splits={splits}"
    torch.testing.assert_close(x["k_cache"].float(), want_k.float(), equal_nan=True, atol=2e-2, rtol=1e-2, msg=what)
    torch.testing.assert_close(x["v_cache"], want_v, equal_nan=True, atol=0, rtol=0, msg=what)
    assert rel_error(out, want_out) < TOLERANCE, what
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, msg=what)


def test_kvcache_splits_agree_and_combine_is_flash_attention_3s():
    lens = torch.tensor([4000, 1, 0, 2500], device="cuda")
    x, slots, cap = decode_case(3, 4, lens, 1, 32, 8, 128, 0, 256, None)
    want = decode_reference(x, slots, cap, False, (-1, -1), 0.0, None)[2]
    outs = [kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
                                              page_table=x["page_table"], num_splits=n) for n in (1, 2, 5, 0, 64)]
    for out in outs:
        assert rel_error(out, want) < TOLERANCE
    # flash_attn_combine on partials of FlashAttention 3's layout: each split's share of the keys.
    n, b, s, h, d = 4, 3, 2, 8, 128
    op = torch.randn((n, b, s, h, d), device="cuda")
    lp = torch.randn((n, b, s, h), device="cuda") * 5
    lp[2, 1] = -math.inf
    out, lse = kiln_attn.flash_attn_combine(op, lp, out_dtype=torch.bfloat16)
    w = torch.softmax(lp, dim=0)
    torch.testing.assert_close(out.float(), (op * w[..., None]).sum(0), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse, torch.logsumexp(lp, dim=0), atol=1e-4, rtol=1e-5)


# d = 100: the padded path (copies of q, k, v and the caches, the appended rows written back)
# is captured too: it allocates and indexes on the device, and reads nothing on the host.
@pytest.mark.parametrize("d", [128, 100])
def test_a_decode_step_captures_and_replays_in_a_cuda_graph(d):
    b, h, hk, page, cap_pages = 8, 32, 8, 16, 64
    lens = torch.randint(1, page * (cap_pages - 2), (b,), device="cuda")
    x, slots, cap = decode_case(11, b, lens, 1, h, hk, d, 1, page, (64, True))
    static = {k: t.clone() for k, t in x.items()}

    def step():
        return kiln_attn.flash_attn_with_kvcache(
            static["q"], static["k_cache"], static["v_cache"], static["k"], static["v"], static["rotary_cos"],
            static["rotary_sin"], static["cache_seqlens"], page_table=static["page_table"], num_splits=0)

    # Warm up (each specialisation compiles on its first call) on a side stream, then capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    static["k_cache"].copy_(x["k_cache"])
    static["v_cache"].copy_(x["v_cache"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    # Two decode steps replayed: new q, k, v and lengths copied into the captured tensors.
    gen = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(2):
        for name in ("q", "k", "v"):
            static[name].copy_(torch.randn(static[name].shape, generator=gen, device="cuda"))
        expect = {k: t.clone() for k, t in static.items()}
        want_k, want_v, want_out, _ = decode_reference(expect, slots, cap, False, (-1, -1), 0.0, (64, True))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(static_out, want_out) < TOLERANCE
        torch.testing.assert_close(static["v_cache"], want_v, equal_nan=True, atol=0, rtol=0)
        torch.testing.assert_close(static["k_cache"].float(), want_k.float(), equal_nan=True, atol=2e-2, rtol=1e-2)
        static["cache_seqlens"].add_(1)


def test_kvcache_bad_arguments_are_value_errors_on_the_gpu():
    x, _, _ = decode_case(1, 2, torch.tensor([5, 9], device="cuda"), 1, 8, 2, 64, 1, 16, None)
    with pytest.raises(TypeError, match=r"^page_table: expected torch.int32"):
        kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"],
                                          cache_seqlens=x["cache_seqlens"], page_table=x["page_table"].long())
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected torch.int32"):
        kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"],
                                          cache_seqlens=x["cache_seqlens"].long(), page_table=x["page_table"])
    with pytest.raises(ValueError, match=r"^k_cache: expected a contiguous last dimension"):
        kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"].transpose(2, 3), x["v_cache"].transpose(2, 3),
                                          cache_seqlens=x["cache_seqlens"], page_table=x["page_table"])
    # A page table pointing past the cache and lengths beyond it: no fault (the kernels skip
    # or clamp those accesses); the call's values are then unspecified, as FlashAttention's.
    bad = x["page_table"].clone()
    bad[0, 0] = 1 << 20
    kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"] + 4000,
                                      page_table=bad)
    torch.cuda.synchronize()


# headdim_v != headdim (FlashAttention 3's value head dim; MLA's 192 / 128) and head dims in no
# tile width (40 runs in 64-wide tiles, 72 in 96).
VALUE_HEAD_DIMS = [(192, 128), (128, 64), (64, 128), (256, 128), (40, 72)]


@pytest.mark.parametrize("d, dv", VALUE_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (512, 256), (1023, 1024)])
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dims_match_the_f32_reference(d, dv, seqlen_q, seqlen_k, causal):
    batch = batch_for(seqlen_q, seqlen_k)
    q, k, _ = inputs(batch, seqlen_q, seqlen_k, NHEADS, d, seed=d * 7 + dv, nheads_k=2)
    _, _, v = inputs(batch, seqlen_q, seqlen_k, NHEADS, dv, seed=dv * 11 + d, nheads_k=2)
    out = torch.full((batch, seqlen_q, NHEADS, dv), float("nan"), device="cuda", dtype=q.dtype)
    got, lse = kiln_attn.flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True)
    ref = reference(q, k, v, d ** -0.5, causal)
    what = f"d={d} dv={dv} sq={seqlen_q} sk={seqlen_k} causal={causal}"
    assert got.shape == (batch, seqlen_q, NHEADS, dv), what
    assert rel_error(got, ref) < TOLERANCE, what
    want_lse = torch.logsumexp(masked_scores(q, k, d ** -0.5, causal), dim=-1)
    torch.testing.assert_close(lse, want_lse.masked_fill(torch.isneginf(want_lse), math.inf), atol=1e-3, rtol=1e-3,
                               msg=what)


@pytest.mark.parametrize("d, dv", VALUE_HEAD_DIMS)
def test_varlen_value_head_dims_match_each_sequence(d, dv):
    lens = [(37, 50), (0, 10), (300, 211), (129, 129), (9, 3)]
    gen = torch.Generator(device="cuda").manual_seed(d + dv)
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn((tq, 4, d), generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn((tk, 2, d), generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn((tk, 2, dv), generator=gen, device="cuda").to(torch.bfloat16)
    cu_q = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32, device="cuda")
    out = kiln_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 211, causal=True)
    assert out.shape == (tq, 4, dv)
    for i, (sq, sk) in enumerate(lens):
        if sq == 0:
            continue
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        ref = reference(q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk], d ** -0.5, True)
        assert rel_error(out[None, q0 : q0 + sq], ref) < TOLERANCE, f"d={d} dv={dv} sequence {i}"


# Head dims that are no multiple of 8 run on zero-padded copies (FlashAttention 2's rule).
@pytest.mark.parametrize("d, dv", VALUE_HEAD_DIMS + [(100, 72), (72, 100), (36, 36), (200, 3)])
@pytest.mark.parametrize("page, splits", [(0, 1), (16, 3), (256, 0)])
def test_kvcache_value_head_dims_match_flash_attentions_semantics(d, dv, page, splits):
    b, longest, sq, h, hk, s_new = 4, 1500, 2, 16, 4, 2
    lens = torch.tensor([longest - s_new, 1, 700, 0], device="cuda")
    x, slots, cap = decode_case(d * 3 + dv, b, lens, sq, h, hk, d, s_new, page, None, dv=dv)
    want_k, want_v, want_out, want_lse = decode_reference(x, slots, cap, True, (-1, -1), 0.0, None)
    kw = {k: t for k, t in x.items() if k not in ("q", "k_cache", "v_cache")}
    out, lse = kiln_attn.flash_attn_with_kvcache(
        x["q"], x["k_cache"], x["v_cache"], causal=True, num_splits=splits, return_softmax_lse=True, **kw)
    torch.cuda.synchronize()
    what = f"d={d} dv={dv} page={page} splits={splits}"
    assert out.shape == (b, sq, h, dv), what
    torch.testing.assert_close(x["k_cache"], want_k, equal_nan=True, atol=0, rtol=0, msg=what)
    torch.testing.assert_close(x["v_cache"], want_v, equal_nan=True, atol=0, rtol=0, msg=what)
    assert rel_error(out, want_out) < TOLERANCE, what
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, msg=what)


@pytest.mark.parametrize("d, dv", VALUE_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (512, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_value_head_dims_backward_matches_the_f32_reference(d, dv, seqlen_q, seqlen_k, causal, deterministic):
    # dq, dk of q's and k's head dim, dv of v's, by FlashAttention's backward rule; GQA.
    q, k, _ = inputs(2, seqlen_q, seqlen_k, NHEADS, d, seed=d * 5 + dv, nheads_k=2)
    _, _, v = inputs(2, seqlen_q, seqlen_k, NHEADS, dv, seed=dv * 13 + d, nheads_k=2)
    dout = torch.randn((2, seqlen_q, NHEADS, dv), device="cuda").to(q.dtype)
    scale = d ** -0.5

    def kiln(q, k, v):
        return kiln_attn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)

    got = gradients(kiln, q, k, v, dout)
    ref = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), q.float(), k.float(), v.float(), dout.float())
    low = gradients(lambda q, k, v: attention_in(q, k, v, scale, causal), q, k, v, dout)
    context = f"d={d} dv={dv} sq={seqlen_q} sk={seqlen_k} causal={causal} deterministic={deterministic}"
    assert got[3].shape == v.shape, context
    for name, g, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
        assert_within_twice(name, g, r, lo, context)


@pytest.mark.parametrize("dv", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_seqused_backward_matches_each_sequence_and_zeroes_the_rest(dv, causal, deterministic):
    # FlashAttention 3's semantics: each sequence's gradients are its dense backward's over
    # its used rows and keys; its rows past seqused_q get dq = 0 and its keys past seqused_k
    # dk = dv = 0.
    from kiln_attn import fa3

    lens = [(37, 50), (300, 211), (20, 10), (9, 30), (129, 129)]
    used = [(20, 31), (300, 150), (0, 10), (9, 0), (100, 129)]
    gen = torch.Generator(device="cuda").manual_seed(41 + causal + 2 * deterministic + dv)
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn((tq, 4, 64), generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn((tk, 2, 64), generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn((tk, 2, dv), generator=gen, device="cuda").to(torch.bfloat16)
    dout = torch.randn((tq, 4, dv), generator=gen, device="cuda").to(torch.bfloat16)
    cu_q = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32, device="cuda")
    uq = torch.tensor([a for a, _ in used], dtype=torch.int32, device="cuda")
    uk = torch.tensor([b for _, b in used], dtype=torch.int32, device="cuda")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fa3.flash_attn_varlen_func(*leaves, cu_q, cu_k, 300, 211, seqused_q=uq, seqused_k=uk, causal=causal,
                                     deterministic=deterministic)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)
    dq, dk, dv_ = (t.grad for t in leaves)
    for i, ((sq, sk), (nq, nk)) in enumerate(zip(lens, used)):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        context = f"sequence {i} dv={dv} causal={causal} deterministic={deterministic}"
        assert (dq[q0 + nq : q0 + sq] == 0).all(), f"{context}: dq past seqused_q"
        assert (dk[k0 + nk : k0 + sk] == 0).all(), f"{context}: dk past seqused_k"
        assert (dv_[k0 + nk : k0 + sk] == 0).all(), f"{context}: dv past seqused_k"
        if nq == 0 or nk == 0:
            assert (dq[q0 : q0 + nq] == 0).all() and (dk[k0 : k0 + nk] == 0).all(), context
            continue
        part = [q[None, q0 : q0 + nq], k[None, k0 : k0 + nk], v[None, k0 : k0 + nk]]
        dos = dout[None, q0 : q0 + nq]
        fn = lambda q, k, v: attention_in(q, k, v, 64 ** -0.5, causal)  # noqa: E731
        ref = gradients(fn, *(t.float() for t in part), dos.float())
        low = gradients(fn, *part, dos)
        got = [dq[None, q0 : q0 + nq], dk[None, k0 : k0 + nk], dv_[None, k0 : k0 + nk]]
        for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref[1:], low[1:]):
            assert_within_twice(name, g, r, lo, context)


@pytest.mark.parametrize("causal", [False, True])
def test_seqused_matches_each_sequence_on_its_used_rows_and_keys(causal):
    from kiln_attn import fa3

    lens = [(37, 50), (300, 211), (20, 10), (9, 30), (129, 129)]
    used = [(20, 31), (300, 150), (0, 10), (9, 0), (100, 129)]
    gen = torch.Generator(device="cuda").manual_seed(31 + causal)
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn((tq, 4, 128), generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn((tk, 2, 128), generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn((tk, 2, 128), generator=gen, device="cuda").to(torch.bfloat16)
    cu_q = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32, device="cuda")
    uq = torch.tensor([a for a, _ in used], dtype=torch.int32, device="cuda")
    uk = torch.tensor([b for _, b in used], dtype=torch.int32, device="cuda")
    out = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 211, seqused_q=uq, seqused_k=uk, causal=causal)
    for i, (nq, nk) in enumerate(used):
        if nq == 0:
            continue
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        ref = reference(q[None, q0 : q0 + nq], k[None, k0 : k0 + nk], v[None, k0 : k0 + nk], 128 ** -0.5, causal)
        if nk == 0:
            assert (out[q0 : q0 + nq] == 0).all(), f"sequence {i}"
            continue
        assert rel_error(out[None, q0 : q0 + nq], ref) < TOLERANCE, f"sequence {i} causal={causal}"
