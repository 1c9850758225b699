"""FlashAttention 3's `flash_attn_func`, `flash_attn_varlen_func`, `flash_attn_with_kvcache` and
`flash_attn_combine` (its `hopper` interface), argument for argument, over kiln's kernels:
code written for FlashAttention 3 imports these instead (`from kiln_attn.fa3 import
flash_attn_func`). How its order, window rule and refused arguments differ from
FlashAttention 2's: `docs/python.md`, `kiln_attn.fa3`.
"""

from . import _native
from .interface import _torch_path
from .options import _INTERPRET, window_pair
from .kvcache import flash_attn_combine, traced_or_direct

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_combine"]


def _unsupported(**given):
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}: kiln_attn does not implement {name}; pass {name}=None")


def _hints(attention_chunk, num_splits, sm_margin):
    """Checks FlashAttention 3's scheduling hints; returns `attention_chunk` as an int."""
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int):
        raise TypeError(f"attention_chunk: expected an int, got {type(attention_chunk).__name__}")
    if not 0 <= attention_chunk <= 2**31 - 1:
        raise ValueError(f"attention_chunk: expected 0 (off) or a chunk length up to 2**31 - 1, got {attention_chunk}")
    if num_splits < 0:
        raise ValueError(f"num_splits: expected >= 0, got {num_splits}")
    if sm_margin < 0:
        raise ValueError(f"sm_margin: expected >= 0, got {sm_margin}")


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FlashAttention 3's flash_attn_func: kiln_attn.flash_attn_func's attention (the same
    tensors, masks, soft-cap, GQA and autograd) with FlashAttention 3's arguments and window
    rule. Returns out, or (out, softmax_lse) with return_attn_probs=True."""
    _unsupported(qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    _hints(attention_chunk, num_splits, sm_margin)
    window = window_pair(window_size)
    if _torch_path(q, k, v):
        from . import autograd

        return autograd.flash_attn(
            q, k, v, softmax_scale, causal, window, softcap, deterministic, return_attn_probs, False, None, True,
            attention_chunk,
        )
    return _native._fwd(
        q,
        k,
        v,
        softmax_scale,
        causal,
        window,
        softcap,
        return_attn_probs,
        fa3_window=True,
        attention_chunk=attention_chunk,
        interpret=_INTERPRET[0],
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FlashAttention 3's flash_attn_varlen_func: kiln_attn.flash_attn_varlen_func's
    attention with FlashAttention 3's arguments and window rule (bounds read against
    max_seqlen_q and max_seqlen_k). seqused_q, seqused_k: (batch,) torch.int32 on q's device
    or None, FlashAttention 3's used lengths: sequence b attends with its first seqused_q[b]
    query rows to its first seqused_k[b] keys (each at most its length in the offsets), its
    masks aligned to those lengths; its output rows past seqused_q[b] are not written (they
    hold what the allocation held, as in FlashAttention 3); in the backward their dq is 0,
    as is the dk and dv of keys past seqused_k[b]. Returns out, or (out, softmax_lse) with
    return_attn_probs=True."""
    _unsupported(
        qv=qv,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )
    _hints(attention_chunk, num_splits, sm_margin)
    window = window_pair(window_size)
    used = _used_lengths(seqused_q, seqused_k, cu_seqlens_q, cu_seqlens_k)
    if _torch_path(q, k, v):
        from . import autograd

        return autograd.flash_attn_varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            causal,
            window,
            softcap,
            deterministic,
            return_attn_probs,
            False,
            None,
            True,
            used,
            attention_chunk,
        )
    return _native._varlen_fwd(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window,
        softcap,
        return_attn_probs,
        fa3_window=True,
        attention_chunk=attention_chunk,
        interpret=_INTERPRET[0],
        seqused_q=used[0] if used else None,
        seqused_k=used[1] if used else None,
    )


def _used_lengths(seqused_q, seqused_k, cu_seqlens_q, cu_seqlens_k):
    """(seqused_q, seqused_k) for the kernel, which takes both or neither: a missing one is
    its offsets' lengths (computed on the device, no synchronisation); None without either."""
    if seqused_q is None and seqused_k is None:
        return None
    return (
        cu_seqlens_q[1:] - cu_seqlens_q[:-1] if seqused_q is None else seqused_q,
        cu_seqlens_k[1:] - cu_seqlens_k[:-1] if seqused_k is None else seqused_k,
    )


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
):
    """FlashAttention 3's flash_attn_with_kvcache: kiln_attn.flash_attn_with_kvcache's decode
    (the same caches, append, rotary, page table, masks, splits) with FlashAttention 3's
    arguments and window rule (a bound is unbounded from seqlen_k - 1 on the left, seqlen_q -
    1 on the right, seqlen_k the cache's length). `num_splits` is honoured (0: kiln
    chooses); `pack_gqa` and `sm_margin` change no result. A head dim that is no multiple of 8
    runs on zero-padded copies of the tensors and caches (FlashAttention 2's way: see
    kiln_attn.flash_attn_with_kvcache). Returns out, or (out, softmax_lse) with
    return_softmax_lse=True."""
    _unsupported(
        qv=qv,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q,
        rotary_seqlens=rotary_seqlens,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        scheduler_metadata=scheduler_metadata,
    )
    _hints(attention_chunk, 0, sm_margin)
    return traced_or_direct(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos,
        rotary_sin,
        cache_seqlens,
        cache_batch_idx,
        cache_leftpad,
        page_table,
        softmax_scale,
        causal,
        window_size,
        softcap,
        rotary_interleaved,
        num_splits,
        return_softmax_lse,
        True,
        attention_chunk,
    )
