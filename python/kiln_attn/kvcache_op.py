"""`flash_attn_with_kvcache` as the torch.library custom op
`torch.ops.kiln_attn._flash_attn_with_kvcache` (imports torch): it runs
`kiln_attn.decode.kvcache`, declares its writes into `k_cache` and `v_cache` (the append) and
has a fake implementation, so `torch.compile(fullgraph=True)` traces a decode step without a
graph break. FlashAttention's int `cache_seqlens` reaches it as `cache_seqlens_int`.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .decode import kvcache


@torch.library.custom_op("kiln_attn::_flash_attn_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_seqlens_int: Optional[int],
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    page_table: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    fa3_window: bool,
    attention_chunk: int = 0,
) -> Tuple[Tensor, Tensor]:
    seqlens = cache_seqlens if cache_seqlens is not None else cache_seqlens_int
    out, lse = kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos,
        rotary_sin,
        seqlens,
        cache_batch_idx,
        cache_leftpad,
        page_table,
        softmax_scale,
        causal,
        (window_size_left, window_size_right),
        softcap,
        rotary_interleaved,
        num_splits,
        True,
        fa3_window,
        attention_chunk,
    )
    return out, lse


@_flash_attn_with_kvcache.register_fake
def _flash_attn_with_kvcache_fake(q, k_cache, v_cache, *rest):
    b, sq, h, _ = q.shape
    out = q.new_empty((b, sq, h, v_cache.shape[-1]))
    return out, q.new_empty((b, h, sq), dtype=torch.float32)
