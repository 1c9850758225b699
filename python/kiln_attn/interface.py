"""FlashAttention 2's `flash_attn_func` and `flash_attn_varlen_func`, argument for argument.

Without gradients (no input requires grad, or under `torch.no_grad()`) a call goes straight
to the native forward; with them, or under `torch.compile`, through the autograd Function and
the custom ops of `kiln_attn.autograd`. This module does not import torch: called with
tensors, torch is already imported. Arguments and extras: `docs/python.md`.
"""

import sys

from . import _native
from .options import _INTERPRET, check_unsupported, interpreter, interpreting, window_pair  # noqa: F401

def _torch_path(q, k, v):
    """Whether the call must go through the autograd Function and custom ops: a torch tensor
    with gradients wanted, a head dim to pad to a multiple of 8 (which that path does), or a
    call being traced by torch.compile."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        return False
    try:
        wants_grad = q.requires_grad or k.requires_grad or v.requires_grad
        dims = (q.shape[-1], v.shape[-1])
    except (AttributeError, IndexError):
        # k or v is no tensor: the native call names it.
        return False
    if any(d % 8 for d in dims) and max(dims) <= 256:
        return True
    if wants_grad and torch.is_grad_enabled():
        return True
    return torch.compiler.is_compiling()


def _empty_probs(q):
    """FlashAttention 2's S_dmask without dropout: an empty tensor of q's dtype and device."""
    return q.new_empty((0,))


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    out=None,
    return_lse=False,
):
    """Attention with FlashAttention 2's interface, computed by kiln's DSL kernels, forward
    and backward.

    q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim); v:
    (batch, seqlen_k, nheads_k, headdim_v) (headdim_v may differ from headdim, as in
    FlashAttention 3: MLA's 192 / 128; the output is headdim_v wide, and such a call has no
    backward yet: a ValueError naming v when one is asked for); all torch.bfloat16 or all
    torch.float16 CUDA tensors on one device, each with a contiguous last dimension (other
    strides free). headdim and headdim_v are at most 256 (a head dim that is no multiple of 8
    is padded with zeros to one, as FlashAttention 2 does: a copy); nheads_k divides
    nheads (grouped-query attention: query head h reads key/value head h // (nheads //
    nheads_k), and dk, dv sum over the query heads of a group).

    dropout_p: must be 0.0 (kiln has no attention dropout: anything else is a ValueError).
    softmax_scale: scores are q.k * softmax_scale; default 1 / sqrt(headdim).
    causal, window_size=(left, right): FlashAttention's masks, aligned bottom-right: query i
    sees key j iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right,
    -1 unbounded, causal meaning right = 0; a bound of at least seqlen_k is unbounded
    (FlashAttention 2's rule, which keeps nothing of a right bound between seqlen_k and
    seqlen_q - 1; `kiln_attn.fa3` follows FlashAttention 3's). window_size is any pair (tuple,
    list, tensor). A query row that sees no key outputs 0, its log-sum-exp is +inf and its
    gradients are 0.
    softcap > 0: scores become softcap * tanh(scores / softcap).
    alibi_slopes: must be None (a ValueError otherwise).
    deterministic: the backward computes dq in a second pass instead of f32 atomics, giving
    the same bits every run.
    return_attn_probs: return (out, softmax_lse, S_dmask) as FlashAttention 2 does; S_dmask
    is its empty tensor (FlashAttention returns probabilities only with dropout).
    out (kiln, keyword-only): a (batch, seqlen_q, nheads, headdim_v) tensor to write instead of
    allocating; not allowed when an input requires grad.
    return_lse (kiln, keyword-only): return (out, softmax_lse).

    Returns out ((batch, seqlen_q, nheads, headdim_v), q's dtype), with softmax_lse (batch,
    nheads, seqlen_q) torch.float32 (natural log) as asked. Differentiable in q, k and v: with an input that
    requires grad, the output does, and backward runs kiln's backward kernels on the saved
    output and log-sum-exp (nothing recomputed in the forward). Runs asynchronously on the
    current CUDA stream; each specialisation compiles on its first call. Traceable by
    torch.compile(fullgraph=True) (torch.ops.kiln_attn custom ops).
    """
    check_unsupported(dropout_p, alibi_slopes)
    window = window_pair(window_size)
    if _torch_path(q, k, v):
        from . import autograd

        return autograd.flash_attn(
            q,
            k,
            v,
            softmax_scale,
            causal,
            window,
            softcap,
            deterministic,
            return_attn_probs,
            return_lse,
            out,
        )
    res = _native._fwd(
        q,
        k,
        v,
        softmax_scale,
        causal,
        window,
        softcap,
        return_lse or return_attn_probs,
        out=out,
        interpret=_INTERPRET[0],
    )
    if return_attn_probs:
        return (*res, _empty_probs(q))
    return res


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    out=None,
    return_lse=False,
):
    """FlashAttention 2's variable-length attention, forward and backward by kiln's kernels.

    q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k,
    headdim_v) (as flash_attn_func, the output headdim_v wide), the sequences of a
    batch packed one after another; cu_seqlens_q, cu_seqlens_k: (batch + 1,) torch.int32
    offsets of each sequence's first row on q's device (read by the kernels, never by the
    host); max_seqlen_q, max_seqlen_k: at least every sequence's length (window bounds of at
    least max_seqlen_k are unbounded, FlashAttention 2's rule). Sequence i's queries attend
    to its own keys only; the other arguments are flash_attn_func's. block_table (a paged KV
    cache) must be None: a ValueError otherwise.

    Returns out (total_q, nheads, headdim_v), with softmax_lse (nheads, total_q) torch.float32
    as asked (return_lse, or return_attn_probs with S_dmask FlashAttention's empty tensor).
    Differentiable in q, k and v; rows that no sequence owns get gradient 0. Rows of q, k, v
    and the output gradient that no sequence owns must hold finite values when gradients are
    computed: the backward kernels read them whole into products that mask them to 0, and a
    NaN or inf there would reach dq, dk or dv.
    """
    check_unsupported(dropout_p, alibi_slopes)
    if block_table is not None:
        raise ValueError(
            "block_table: kiln_attn's flash_attn_varlen_func does not read paged KV caches; "
            "pass block_table=None"
        )
    window = window_pair(window_size)
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
            return_lse,
            out,
        )
    res = _native._varlen_fwd(
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
        return_lse or return_attn_probs,
        out=out,
        interpret=_INTERPRET[0],
    )
    if return_attn_probs:
        return (*res, _empty_probs(q))
    return res
