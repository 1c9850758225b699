"""Decoding against a key/value cache: FlashAttention's `flash_attn_with_kvcache` and
`flash_attn_combine`, over kiln's decode kernels (the checks and launches: `kiln_attn.decode`).
Under `torch.compile` a call goes through the custom op of `kiln_attn.kvcache_op`.
"""

import sys

from .decode import decode_key_block, flash_attn_combine, kvcache, num_splits_heuristic, value_blocks  # noqa: F401
from .options import window_pair

__all__ = ["flash_attn_with_kvcache", "flash_attn_combine"]

def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    block_table=None,
):
    """FlashAttention 2's flash_attn_with_kvcache (decoding against a key/value cache) by
    kiln's decode kernels; no autograd (inference).

    q: (batch, seqlen_q, nheads, headdim), torch.float16 or torch.bfloat16; headdim up to
    256.
    k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim) for a dense cache, or
    (num_blocks, page_block_size, nheads_k, headdim) with a page table (any page size);
    v_cache's last dim may differ (headdim_v, up to 256, as FlashAttention 3; then v and the
    output are headdim_v wide);
    q's dtype and device, a contiguous last dimension (other strides free). Written in place
    when k and v are given. nheads_k divides nheads (GQA: query head i reads key/value head
    i // (nheads // nheads_k)).
    k, v: (batch, seqlen_new, nheads_k, headdim / headdim_v) or None: appended into the cache at positions
    cache_seqlens[i].. of sequence i (k rotated first with rotary tables), before the
    attention, which sees them.
    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2), q's dtype, seqlen_ro at least the
    cache's length, or None. With them (and k, v), keys are rotated at their positions and
    queries at cache_seqlens[i] + t when causal or windowed, else all at cache_seqlens[i];
    rotary_interleaved: pairs (2i, 2i + 1) when True, else (i, i + rotary_dim / 2).
    cache_seqlens: an int or a (batch,) torch.int32 tensor: each sequence's cache length
    before the append (None: the whole cache; not allowed with k, v).
    cache_batch_idx: (batch,) torch.int32: the rows of a dense cache holding the sequences
    (None: 0..batch). Not with a page table.
    cache_leftpad: (batch,) torch.int32: each sequence's first key (None: 0).
    page_table (FlashAttention 2's block_table, either name): (batch, max_num_blocks_per_seq)
    torch.int32: key j of sequence i lies in block page_table[i, j // page_block_size].
    softmax_scale: default 1 / sqrt(headdim). causal, window_size: FlashAttention's masks,
    aligned bottom-right against each sequence's length after the append (a bound of at least
    the cache's length is unbounded, FlashAttention 2's rule). softcap > 0: scores become
    softcap * tanh(scores / softcap).
    alibi_slopes: must be None (a ValueError otherwise).
    num_splits: 1 runs one pass; n > 1 splits each sequence's keys n ways (flash-decoding) and
    combines them; 0 lets kiln choose from the shape and the GPU's multiprocessor count.
    return_softmax_lse: also return the log-sum-exp (batch, nheads, seqlen_q) torch.float32
    (+inf for a query that sees no key, whose output is 0).

    A headdim or headdim_v that is no multiple of 8 runs as FlashAttention 2 runs it, for
    correctness rather than speed: q, k, v and the cache of that head dim are copied with
    zeros padded to the next multiple of 8 (a copy of the whole cache on every call), the
    kernels run on the copies, the output is cut back, and the appended keys and values are
    written back into the caller's k_cache and v_cache (the appended rows: nothing else in the
    caches changes). softmax_scale's default takes the unpadded headdim.

    Returns out (batch, seqlen_q, nheads, headdim_v), with softmax_lse as asked. Runs
    asynchronously on the current CUDA stream without reading any tensor on the host, so it
    can be captured in a CUDA graph.
    """
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: kiln_attn does not implement ALiBi; pass alibi_slopes=None")
    if block_table is not None:
        if page_table is not None:
            raise ValueError("block_table: pass the page table once, as page_table or block_table")
        page_table = block_table
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
        False,
    )


def traced_or_direct(*args):
    """`kvcache(*args)`, through the custom op `torch.ops.kiln_attn._flash_attn_with_kvcache`
    while torch.compile traces the call (`kiln_attn.kvcache_op`), else directly."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.compiler.is_compiling():
        return kvcache(*args)
    from . import kvcache_op

    (q, k_cache, v_cache, k, v, cos, sin, seqlens, batch_idx, leftpad, pages) = args[:11]
    (scale, causal, window, softcap, interleaved, splits, return_lse, fa3_window) = args[11:19]
    chunk = args[19] if len(args) > 19 else 0
    seqlens_t = seqlens if isinstance(seqlens, torch.Tensor) else None
    seqlens_int = None if seqlens_t is not None or seqlens is None else int(seqlens)
    left, right = window_pair(window)
    out, lse = kvcache_op._flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cos, sin, seqlens_t, seqlens_int, batch_idx, leftpad, pages,
        scale, causal, left, right, softcap, interleaved, splits, fa3_window, chunk,
    )
    return (out, lse) if return_lse else out

