"""flash_attn_with_kvcache's and flash_attn_combine's argument checks, without torch or a GPU
(fake tensors: fakes.py): every bad argument raises TypeError or ValueError naming it before
anything is allocated or launched, and the split heuristic is the kernels' own. A well-formed
call gets past the checks and then needs torch (to allocate), which these tests do not have
or do not reach."""

import inspect

import pytest

import kiln_attn
from fakes import BF16, F16, F32, I32, FakeDType, FakeTensor
from kiln_attn import fa3
from kiln_attn.kvcache import decode_key_block, num_splits_heuristic, value_blocks

B, SQ, H, HK, D = 3, 2, 8, 2, 64


def cache(pages=B, page=40, hk=HK, d=D, **kw):
    return FakeTensor((pages, page, hk, d), **kw)


def q_(b=B, sq=SQ, h=H, d=D, **kw):
    return FakeTensor((b, sq, h, d), **kw)


def call(fn=None, **kw):
    fn = fn or kiln_attn.flash_attn_with_kvcache
    args = {"q": q_(), "k_cache": cache(), "v_cache": cache()}
    args.update(kw)
    return fn(**args)


def test_signatures_are_flash_attentions():
    params = list(inspect.signature(kiln_attn.flash_attn_with_kvcache).parameters)
    assert params[:19] == [
        "q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
        "cache_batch_idx", "cache_leftpad", "page_table", "softmax_scale", "causal",
        "window_size", "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
        "return_softmax_lse",
    ]
    # FlashAttention 2's spelling of the page table, keyword-only.
    p = inspect.signature(kiln_attn.flash_attn_with_kvcache).parameters["block_table"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(fa3.flash_attn_with_kvcache).parameters) == [
        "q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens",
        "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new",
        "max_seqlen_q", "rotary_seqlens", "q_descale", "k_descale", "v_descale",
        "softmax_scale", "causal", "window_size", "attention_chunk", "softcap",
        "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin",
        "return_softmax_lse",
    ]
    assert list(inspect.signature(kiln_attn.flash_attn_combine).parameters) == [
        "out_partial", "lse_partial", "out", "out_dtype"]
    assert fa3.flash_attn_combine is kiln_attn.flash_attn_combine


@pytest.mark.parametrize("kw,exc,msg", [
    ({"q": "q"}, TypeError, r"^q: expected a torch.Tensor, got str"),
    ({"q": q_(device="cpu")}, ValueError, r"^q: expected a CUDA tensor"),
    ({"q": q_(dtype=F32)}, TypeError, r"^q: expected torch.float16 or torch.bfloat16, got torch.float32"),
    ({"q": FakeTensor((B, H, D))}, ValueError, r"^q: expected a 4-D tensor"),
    ({"k_cache": cache(dtype=F16)}, TypeError, r"^k_cache: expected torch.bfloat16 \(as q\), got torch.float16"),
    ({"v_cache": cache(device="cuda:1")}, ValueError, r"^v_cache: expected a tensor on cuda:0 \(as q\)"),
    ({"k_cache": cache(strides=(40 * HK * D, 1, 40, 40 * HK))}, ValueError,
     r"^k_cache: expected a contiguous last dimension .* does not copy it"),
    ({"v_cache": cache(page=41)}, ValueError, r"^v_cache: expected shape \(3, 40, 2, 64\)"),
    ({"k_cache": cache(d=32), "v_cache": cache(d=32)}, ValueError, r"^k_cache: expected headdim 64 \(as q\), got 32"),
    ({"q": q_(d=264), "k_cache": cache(d=264), "v_cache": cache(d=264)}, ValueError,
     r"^q: headdim 264 is not supported \(kiln_attn takes head dims from 1 to 256\)"),
    ({"q": q_(d=0), "k_cache": cache(d=0), "v_cache": cache(d=0)}, ValueError, r"^q: headdim 0 is not supported"),
    ({"v_cache": cache(d=300)}, ValueError, r"^v_cache: headdim_v 300 is not supported"),
    ({"v_cache": cache(d=0)}, ValueError, r"^v_cache: headdim_v 0 is not supported"),
    ({"q": q_(d=257), "k_cache": cache(d=257), "v_cache": cache(d=100)}, ValueError, r"^q: headdim 257 is not supported"),
    ({"k": FakeTensor((B, 1, HK, D)), "v": FakeTensor((B, 1, HK, 32))}, ValueError, r"^v: expected shape \(3, 1, 2, 64\) \(as k but for v_cache's headdim_v\)"),
    ({"k_cache": cache(hk=3), "v_cache": cache(hk=3)}, ValueError, r"^k_cache: nheads_k 3 must divide q's nheads 8"),
    ({"k_cache": cache(pages=2), "v_cache": cache(pages=2)}, ValueError, r"^k_cache: expected at least 3 sequences"),
    ({"alibi_slopes": FakeTensor((H,), dtype=F32)}, ValueError, r"^alibi_slopes: kiln_attn does not implement ALiBi"),
    ({"page_table": FakeTensor((B, 4), dtype=I32), "block_table": FakeTensor((B, 4), dtype=I32)}, ValueError,
     r"^block_table: pass the page table once"),
    ({"page_table": FakeTensor((B, 4), dtype=F32)}, TypeError, r"^page_table: expected torch.int32, got torch.float32"),
    ({"block_table": FakeTensor((B,), dtype=I32)}, ValueError, r"^page_table: expected a 2-D tensor"),
    ({"page_table": FakeTensor((B + 1, 4), dtype=I32)}, ValueError, r"^page_table: expected 3 rows"),
    ({"page_table": FakeTensor((B, 4), dtype=I32, device="cpu")}, ValueError, r"^page_table: expected a CUDA tensor"),
    ({"page_table": FakeTensor((B, 4), dtype=I32), "cache_batch_idx": FakeTensor((B,), dtype=I32)}, ValueError,
     r"^cache_batch_idx: a paged cache \(page_table\) takes no cache_batch_idx"),
    ({"cache_batch_idx": FakeTensor((B,), dtype=FakeDType("torch.int64"))}, TypeError,
     r"^cache_batch_idx: expected torch.int32, got torch.int64"),
    ({"cache_batch_idx": FakeTensor((B, 1), dtype=I32)}, ValueError, r"^cache_batch_idx: expected a 1-D tensor"),
    ({"cache_seqlens": FakeTensor((B + 1,), dtype=I32)}, ValueError, r"^cache_seqlens: expected shape \(3,\)"),
    ({"cache_seqlens": FakeTensor((B,), dtype=FakeDType("torch.int64"))}, TypeError, r"^cache_seqlens: expected torch.int32"),
    ({"cache_seqlens": 3.0}, TypeError, r"^cache_seqlens: expected an int or a torch.int32 tensor, got float"),
    ({"cache_seqlens": True}, TypeError, r"^cache_seqlens: expected an int or a torch.int32 tensor, got bool"),
    ({"cache_seqlens": 41}, ValueError, r"^cache_seqlens: 41 keys plus 0 new ones do not fit the cache's 40"),
    ({"cache_seqlens": -1}, ValueError, r"^cache_seqlens: -1 keys"),
    ({"cache_leftpad": FakeTensor((B,), dtype=F32)}, TypeError, r"^cache_leftpad: expected torch.int32"),
    ({"k": FakeTensor((B, 1, HK, D))}, ValueError, r"^v: k and v are appended together"),
    ({"v": FakeTensor((B, 1, HK, D))}, ValueError, r"^k: k and v are appended together"),
    ({"k": FakeTensor((B, 1, HK, D)), "v": FakeTensor((B, 1, HK, D))}, ValueError,
     r"^cache_seqlens: appending k and v needs each sequence's cache length"),
    ({"k": FakeTensor((B, 1, H, D)), "v": FakeTensor((B, 1, H, D)), "cache_seqlens": 3}, ValueError,
     r"^k: expected shape \(3, 1, 2, 64\)"),
    ({"k": FakeTensor((B, 2, HK, D)), "v": FakeTensor((B, 1, HK, D)), "cache_seqlens": 3}, ValueError, r"^v: expected shape"),
    ({"k": FakeTensor((B, 2, HK, D), dtype=F16), "v": FakeTensor((B, 2, HK, D)), "cache_seqlens": 3}, TypeError, r"^k: expected torch.bfloat16"),
    ({"k": FakeTensor((B, 2, HK, D)), "v": FakeTensor((B, 2, HK, D)), "cache_seqlens": 39}, ValueError,
     r"^cache_seqlens: 39 keys plus 2 new ones do not fit the cache's 40"),
    ({"rotary_cos": FakeTensor((40, 16))}, ValueError, r"^rotary_sin: pass rotary_cos and rotary_sin together"),
    ({"rotary_cos": FakeTensor((40, 16)), "rotary_sin": FakeTensor((40, 16))}, ValueError,
     r"^rotary_cos: the rotary embedding applies to new keys"),
    ({"rotary_cos": FakeTensor((40, 40)), "rotary_sin": FakeTensor((40, 40)), "k": FakeTensor((B, 1, HK, D)),
      "v": FakeTensor((B, 1, HK, D)), "cache_seqlens": 0}, ValueError, r"^rotary_cos: rotary_dim 80 .* headdim 64"),
    ({"rotary_cos": FakeTensor((39, 16)), "rotary_sin": FakeTensor((39, 16)), "k": FakeTensor((B, 1, HK, D)),
      "v": FakeTensor((B, 1, HK, D)), "cache_seqlens": 0}, ValueError, r"^rotary_cos: expected at least 40 rows"),
    ({"rotary_cos": FakeTensor((40, 16)), "rotary_sin": FakeTensor((40, 8)), "k": FakeTensor((B, 1, HK, D)),
      "v": FakeTensor((B, 1, HK, D)), "cache_seqlens": 0}, ValueError, r"^rotary_sin: expected shape \(40, 16\)"),
    ({"rotary_cos": FakeTensor((40, 16), dtype=F32), "rotary_sin": FakeTensor((40, 16)), "k": FakeTensor((B, 1, HK, D)),
      "v": FakeTensor((B, 1, HK, D)), "cache_seqlens": 0}, TypeError, r"^rotary_cos: expected torch.bfloat16 \(as q\)"),
    ({"softmax_scale": "0.1"}, TypeError, r"^softmax_scale: expected a float, got str"),
    ({"softcap": None}, TypeError, r"^softcap: expected a float"),
    ({"causal": 1}, TypeError, r"^causal: expected a bool, got int"),
    ({"rotary_interleaved": "yes"}, TypeError, r"^rotary_interleaved: expected a bool"),
    ({"num_splits": -1}, ValueError, r"^num_splits: expected >= 0"),
    ({"num_splits": 2.0}, TypeError, r"^num_splits: expected an int, got float"),
    ({"window_size": (1, 2, 3)}, ValueError, r"^window_size: expected a pair"),
])
def test_bad_arguments_are_refused_by_name(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        call(**kw)


@pytest.mark.parametrize("kw,msg", [
    ({"qv": FakeTensor((B, SQ, H, D))}, r"^qv: kiln_attn does not implement qv"),
    ({"cu_seqlens_q": FakeTensor((B + 1,), dtype=I32)}, r"^cu_seqlens_q: kiln_attn does not implement"),
    ({"cu_seqlens_k_new": FakeTensor((B + 1,), dtype=I32)}, r"^cu_seqlens_k_new: "),
    ({"max_seqlen_q": 4}, r"^max_seqlen_q: "),
    ({"rotary_seqlens": FakeTensor((B,), dtype=I32)}, r"^rotary_seqlens: "),
    ({"q_descale": FakeTensor((B, HK), dtype=F32)}, r"^q_descale: "),
    ({"scheduler_metadata": FakeTensor((4,), dtype=I32)}, r"^scheduler_metadata: "),
    ({"attention_chunk": -1}, r"^attention_chunk: expected 0 \(off\) or a chunk length"),
    ({"sm_margin": -1}, r"^sm_margin: expected >= 0"),
    ({"page_table": FakeTensor((B, 2), dtype=I32), "cache_batch_idx": FakeTensor((B,), dtype=I32)}, r"^cache_batch_idx: "),
])
def test_fa3s_extras_are_refused_by_name(kw, msg):
    with pytest.raises(ValueError, match=msg):
        call(fa3.flash_attn_with_kvcache, **kw)


# Head dims the kernels take as they are (multiples of 8) and ones padded to the next (FlashAttention
# 2's rule), keys and values alike or apart, up to 256.
HEAD_DIMS = [(D, D), (8, 8), (40, 40), (72, 72), (100, 100), (200, 200), (100, 72), (72, 100), (1, 1), (1, 256),
             (256, 3), (255, 255)]


@pytest.mark.parametrize("d,dv", HEAD_DIMS)
def test_checks_come_before_anything_is_allocated(d, dv):
    # A valid call reaches torch only to allocate; without torch that is the first failure.
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ModuleNotFoundError, match="torch"):
            call(q=q_(d=d), k_cache=cache(d=d), v_cache=cache(d=dv), k=FakeTensor((B, 1, HK, d)),
                 v=FakeTensor((B, 1, HK, dv)), cache_seqlens=FakeTensor((B,), dtype=I32),
                 block_table=FakeTensor((B, 1), dtype=I32),
                 rotary_cos=FakeTensor((40, d // 2 or 1)) if d > 1 else None,
                 rotary_sin=FakeTensor((40, d // 2 or 1)) if d > 1 else None)
        with pytest.raises(ModuleNotFoundError, match="torch"):
            kiln_attn.flash_attn_combine(FakeTensor((3, B, SQ, H, dv), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32))
    else:
        pytest.skip("torch is installed: the interpreter and GPU tests run valid calls")


@pytest.mark.parametrize("args,kw,exc,msg", [
    ((FakeTensor((3, B, SQ, H, D)),), {}, TypeError, r"^out_partial: expected torch.float32, got torch.bfloat16"),
    ((FakeTensor((B, SQ, H, D), dtype=F32),), {}, ValueError, r"^out_partial: expected a 5-D tensor"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32, device="cpu"),), {}, ValueError, r"^out_partial: expected a CUDA tensor"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32), FakeTensor((3, B, H, SQ), dtype=F32)), {}, ValueError,
     r"^lse_partial: expected shape \(3, 3, 2, 8\)"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32), FakeTensor((3, B, SQ, H))), {}, TypeError, r"^lse_partial: expected torch.float32"),
    ((FakeTensor((0, B, SQ, H, D), dtype=F32), FakeTensor((0, B, SQ, H), dtype=F32)), {}, ValueError,
     r"^out_partial: expected at least one split"),
    ((FakeTensor((3, B, SQ, H, 260), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)), {}, ValueError,
     r"^out_partial: headdim 260 is not supported \(kiln_attn takes head dims from 1 to 256\)"),
    ((FakeTensor((3, B, SQ, H, 0), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)), {}, ValueError,
     r"^out_partial: headdim 0 is not supported"),
    ((FakeTensor((3, B, SQ, H, 44), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)), {"out": FakeTensor((B, SQ, H, 48))},
     ValueError, r"^out: expected shape \(3, 2, 8, 44\)"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)), {"out_dtype": I32}, TypeError,
     r"^out_dtype: expected torch.float32, torch.float16 or torch.bfloat16, got torch.int32"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)), {"out": FakeTensor((B, SQ, H, D + 16))},
     ValueError, r"^out: expected shape \(3, 2, 8, 64\)"),
    ((FakeTensor((3, B, SQ, H, D), dtype=F32), FakeTensor((3, B, SQ, H), dtype=F32)),
     {"out": FakeTensor((B, SQ, H, D)), "out_dtype": F16}, TypeError, r"^out: expected out_dtype torch.float16, got torch.bfloat16"),
])
def test_combine_refuses_bad_arguments_by_name(args, kw, exc, msg):
    if len(args) == 1:
        n, b, s, h, _ = args[0].shape if len(args[0].shape) == 5 else (1, B, SQ, H, D)
        args = (args[0], FakeTensor((n, b, s, h), dtype=F32))
    with pytest.raises(exc, match=msg):
        kiln_attn.flash_attn_combine(*args, **kw)


def test_the_split_heuristic_is_the_kernels():
    # The cases of the kernels' own unit test (`num_splits` in attention_decode.rs).
    assert num_splits_heuristic(64, 8, 1, 32768, 64, 132) == 1
    assert num_splits_heuristic(1, 8, 1, 32768, 64, 132) == 15
    assert num_splits_heuristic(1, 8, 1, 64, 64, 132) == 1
    assert num_splits_heuristic(1, 8, 1, 300, 64, 132) == 2
    for batch, keys in [(1, 1 << 17), (2, 5000), (3, 999), (0, 100)]:
        s = num_splits_heuristic(batch, 4, 2, keys, 64, 132)
        assert 1 <= s <= 128
        assert s == 1 or s <= -(-keys // 64) // 2
    assert num_splits_heuristic(1, 1, 1, 1 << 20, 64, 0) == 1
    # The interpreter's automatic choice (132 SMs) for test_kvcache_interp's head-dim-256 case
    # (3 sequences of one key/value head, a dense cache of 77 keys in blocks of 16): 2 splits.
    assert num_splits_heuristic(3, 1, 1, 77, decode_key_block(256, 0), 132) == 2
    assert [decode_key_block(128, 0), decode_key_block(128, 256), decode_key_block(128, 16),
            decode_key_block(256, 16), decode_key_block(256, 1)] == [64, 64, 32, 16, 16]
    assert [value_blocks(d) for d in (64, 96, 128, 256)] == [1, 1, 1, 4]


def test_fp16_calls_check_against_fp16():
    with pytest.raises(TypeError, match=r"^k_cache: expected torch.float16 \(as q\), got torch.bfloat16"):
        call(q=q_(dtype=F16))
