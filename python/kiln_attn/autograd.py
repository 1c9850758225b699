"""Attention's autograd and torch.library custom ops (imports torch).

FlashAttention 2's low-level functions (`_flash_attn_forward`, `_flash_attn_backward` and
their varlen forms), with its names, arguments and meanings, registered as custom ops in the
`kiln_attn` namespace with fake implementations, so `torch.compile(fullgraph=True)` traces
them; `FlashAttnFunc` and `FlashAttnVarlenFunc` are the autograd Functions `flash_attn_func`
and `flash_attn_varlen_func` use. What each returns: `docs/python.md`, "Training".
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native
from .options import check_unsupported, interpreting, statistics_outputs

_F32 = torch.float32


def _no_paging(block_table, leftpad_k):
    for name, t in (("block_table", block_table), ("leftpad_k", leftpad_k)):
        if t is not None:
            raise ValueError(f"{name}: kiln_attn's varlen attention does not take {name}; pass None")


@torch.library.custom_op("kiln_attn::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    return_softmax: bool,
    fa3_window: bool = False,
    attention_chunk: int = 0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    check_unsupported(dropout_p, alibi_slopes)
    out, lse = _native._fwd(
        q,
        k,
        v,
        softmax_scale,
        causal,
        (window_size_left, window_size_right),
        softcap,
        True,
        fa3_window=fa3_window,
        attention_chunk=attention_chunk,
        interpret=interpreting(),
    )
    return out, lse, q.new_empty((0,)), torch.zeros((2,), dtype=torch.int64, device=q.device)


@_flash_attn_forward.register_fake
def _flash_attn_forward_fake(q, k, v, dropout_p, softmax_scale, causal, wl, wr, softcap, alibi_slopes, return_softmax, fa3_window=False, attention_chunk=0):
    b, sq, h, _ = q.shape
    return (
        q.new_empty((b, sq, h, v.shape[-1])),
        q.new_empty((b, h, sq), dtype=_F32),
        q.new_empty((0,)),
        q.new_empty((2,), dtype=torch.int64),
    )


@torch.library.custom_op("kiln_attn::_flash_attn_backward", mutates_args=("dq", "dk", "dv"))
def _flash_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Optional[Tensor],
    dk: Optional[Tensor],
    dv: Optional[Tensor],
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    rng_state: Optional[Tensor] = None,
    fa3_window: bool = False,
    attention_chunk: int = 0,
) -> Tensor:
    check_unsupported(dropout_p, alibi_slopes)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    return _native._bwd(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        softmax_scale,
        causal,
        (window_size_left, window_size_right),
        softcap,
        deterministic,
        fa3_window=fa3_window,
        attention_chunk=attention_chunk,
        interpret=interpreting(),
    )


@_flash_attn_backward.register_fake
def _flash_attn_backward_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, *rest, **kw):
    # softmax_d as FlashAttention 2 pads it: seqlen_q rounded up to 128.
    b, sq, h, _ = q.shape
    return q.new_empty((b, h, -(-sq // 128) * 128), dtype=_F32)


@torch.library.custom_op("kiln_attn::_flash_attn_varlen_forward", mutates_args=())
def _flash_attn_varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    return_softmax: bool = False,
    block_table: Optional[Tensor] = None,
    leftpad_k: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    fa3_window: bool = False,
    seqused_q: Optional[Tensor] = None,
    attention_chunk: int = 0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    check_unsupported(dropout_p, alibi_slopes)
    _no_paging(block_table, leftpad_k)
    seqused_q, seqused_k = _both_used(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    out, lse = _native._varlen_fwd(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        (window_size_left, window_size_right),
        softcap,
        True,
        fa3_window=fa3_window,
        attention_chunk=attention_chunk,
        interpret=interpreting(),
        seqused_q=seqused_q,
        seqused_k=seqused_k,
    )
    return out, lse, q.new_empty((0,)), torch.zeros((2,), dtype=torch.int64, device=q.device)


@_flash_attn_varlen_forward.register_fake
def _flash_attn_varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *rest, **kw):
    total_q, h, _ = q.shape
    return (
        q.new_empty((total_q, h, v.shape[-1])),
        q.new_empty((h, total_q), dtype=_F32),
        q.new_empty((0,)),
        q.new_empty((2,), dtype=torch.int64),
    )


@torch.library.custom_op("kiln_attn::_flash_attn_varlen_backward", mutates_args=("dq", "dk", "dv"))
def _flash_attn_varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Optional[Tensor],
    dk: Optional[Tensor],
    dv: Optional[Tensor],
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    rng_state: Optional[Tensor] = None,
    fa3_window: bool = False,
    attention_chunk: int = 0,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
) -> Tensor:
    check_unsupported(dropout_p, alibi_slopes)
    seqused_q, seqused_k = _both_used(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    return _native._varlen_bwd(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        (window_size_left, window_size_right),
        softcap,
        deterministic,
        fa3_window=fa3_window,
        attention_chunk=attention_chunk,
        interpret=interpreting(),
        seqused_q=seqused_q,
        seqused_k=seqused_k,
    )


@_flash_attn_varlen_backward.register_fake
def _flash_attn_varlen_backward_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, *rest, **kw):
    # softmax_d as FlashAttention 2 pads it: 128 more columns a sequence.
    total_q, h, _ = q.shape
    return q.new_empty((h, total_q + 128 * (cu_seqlens_q.shape[0] - 1)), dtype=_F32)


def _both_used(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    """FlashAttention 3's used lengths as the kernels take them, both or neither: a missing
    one of a pair is the offsets' lengths."""
    if (seqused_q is None) != (seqused_k is None):
        if seqused_q is None:
            seqused_q = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        else:
            seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    return seqused_q, seqused_k


def _contiguous_last(t):
    """FlashAttention's rule for a gradient it did not allocate: a copy only when the last
    dimension is not contiguous (a broadcast gradient, say)."""
    return t if t.stride(-1) == 1 else t.contiguous()


class FlashAttnFunc(torch.autograd.Function):
    """flash_attn_func's autograd: returns (out, softmax_lse), the latter not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window, softcap, deterministic, fa3_window):
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, lse, _, _ = torch.ops.kiln_attn._flash_attn_forward(
            q, k, v, 0.0, softmax_scale, causal, window[0], window[1], softcap, None, False, fa3_window, window[2]
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (softmax_scale, causal, window, softcap, deterministic, fa3_window)
        return statistics_outputs(ctx, out, (lse,), True)

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 9
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, window, softcap, deterministic, fa3_window = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.kiln_attn._flash_attn_backward(
            _contiguous_last(dout),
            q,
            k,
            v,
            out,
            lse,
            dq,
            dk,
            dv,
            0.0,
            scale,
            causal,
            window[0],
            window[1],
            softcap,
            None,
            deterministic,
            None,
            fa3_window,
            window[2],
        )
        return dq, dk, dv, None, None, None, None, None, None


class FlashAttnVarlenFunc(torch.autograd.Function):
    """flash_attn_varlen_func's autograd: returns (out, softmax_lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window, softcap, deterministic, fa3_window,
                seqused_q=None, seqused_k=None):
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, lse, _, _ = torch.ops.kiln_attn._flash_attn_varlen_forward(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            0.0,
            softmax_scale,
            causal,
            window[0],
            window[1],
            softcap,
            None,
            False,
            None,
            None,
            seqused_k,
            fa3_window,
            seqused_q,
            window[2],
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_q, seqused_k)
        ctx.args = (max_q, max_k, softmax_scale, causal, window, softcap, deterministic, fa3_window)
        return statistics_outputs(ctx, out, (lse,), True)

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 15
        q, k, v, out, lse, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
        max_q, max_k, scale, causal, window, softcap, deterministic, fa3_window = ctx.args
        # Zeroed: the kernels write the rows of the sequences only, and rows that no sequence
        # owns have gradient 0 (a sequence's rows and keys past its used lengths the kernels
        # write as 0: FlashAttention 3's).
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        torch.ops.kiln_attn._flash_attn_varlen_backward(
            _contiguous_last(dout),
            q,
            k,
            v,
            out,
            lse,
            dq,
            dk,
            dv,
            cu_q,
            cu_k,
            max_q,
            max_k,
            0.0,
            scale,
            causal,
            window[0],
            window[1],
            softcap,
            None,
            deterministic,
            None,
            fa3_window,
            window[2],
            used_q,
            used_k,
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


def _distinct(*tensors):
    """`tensors` with each repeat of an earlier one replaced by a view of it (no copy):
    torch.compile does not trace an autograd.Function given one tensor twice, as
    self-attention's q = k = v or a shared cu_seqlens_q = cu_seqlens_k give it."""
    seen = []
    out = []
    for t in tensors:
        if any(t is s for s in seen):
            t = t.view_as(t)
        seen.append(t)
        out.append(t)
    return out


def _finish(q, o, lse, out, probs, return_lse):
    """What flash_attn_func returns, `o` copied into the caller's `out` when given (only
    without gradients: torch's functions with `out=` do not differentiate either)."""
    if out is not None:
        if torch.is_grad_enabled() and o.requires_grad:
            raise ValueError(
                "out: not supported when q, k or v requires grad (autograd needs the output it "
                "allocates); drop out= or call under torch.no_grad()"
            )
        out.copy_(o)
        o = out
    if probs == "fa2":
        return o, lse, q.new_empty((0,))
    if probs == "fa3" or return_lse:
        return o, lse
    return o


def _padded(q, k, v, softmax_scale):
    """q, k, v with each head dim padded with zeros to a multiple of 8 (FlashAttention 2's
    rule: the kernels read rows of 16-byte units; zero columns change no score and no kept
    output column), the scale the unpadded head dim gives when none is, and v's head dim to
    cut the output back to (None when nothing was padded). Differentiable: the padding's
    gradient is dropped."""
    dv = v.shape[-1]
    # Past 256 nothing is padded: the native check names the head dim as given.
    if (q.shape[-1] % 8 == 0 and dv % 8 == 0) or max(q.shape[-1], dv) > 256:
        return q, k, v, softmax_scale, None
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)

    def pad(t):
        extra = -t.shape[-1] % 8
        return torch.nn.functional.pad(t, (0, extra)) if extra else t

    return pad(q), pad(k), pad(v), softmax_scale, dv


def flash_attn(q, k, v, softmax_scale, causal, window, softcap, deterministic, return_attn_probs, return_lse, out, fa3_window=False,
               attention_chunk=0):
    """flash_attn_func through the autograd Function (arguments already normalised;
    `attention_chunk`: FlashAttention 3's, 0 off)."""
    window = (window[0], window[1], attention_chunk)
    q0 = q
    q, k, v, softmax_scale, cut = _padded(q, k, v, softmax_scale)
    q, k, v = _distinct(q, k, v)
    o, lse = FlashAttnFunc.apply(q, k, v, softmax_scale, causal, window, softcap, deterministic, fa3_window)
    if cut is not None:
        o = o[..., :cut]
    q = q0
    probs = ("fa3" if fa3_window else "fa2") if return_attn_probs else None
    return _finish(q, o, lse, out, probs, return_lse)


def flash_attn_varlen(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    softmax_scale,
    causal,
    window,
    softcap,
    deterministic,
    return_attn_probs,
    return_lse,
    out,
    fa3_window=False,
    used=None,
    attention_chunk=0,
):
    """flash_attn_varlen_func through the autograd Function; `used`: FlashAttention 3's
    (seqused_q, seqused_k), both given, or None; `attention_chunk`: FlashAttention 3's."""
    window = (window[0], window[1], attention_chunk)
    q0 = q
    q, k, v, softmax_scale, cut = _padded(q, k, v, softmax_scale)
    q, k, v, cu_q, cu_k = _distinct(q, k, v, cu_q, cu_k)
    used_q, used_k = used if used is not None else (None, None)
    if used is not None:
        used_q, used_k = _distinct(q, k, v, cu_q, cu_k, used_q, used_k)[5:]
    o, lse = FlashAttnVarlenFunc.apply(
        q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window, softcap, deterministic, fa3_window,
        used_q, used_k
    )
    if cut is not None:
        o = o[..., :cut]
    q = q0
    probs = ("fa3" if fa3_window else "fa2") if return_attn_probs else None
    return _finish(q, o, lse, out, probs, return_lse)
