"""Ring attention (context parallelism) over `torch.distributed`: each rank holds a shard of
the sequence; the key/value shards travel around the ring (point-to-point sends, started
before each block's attention so the transfer runs under it) and each block's partial output
merges through its log-sum-exp. Causal attention takes the zigzag split, which gives every
rank the same work (`zigzag_shard`). Forward and backward run on kiln's
`_flash_attn_forward` / `_flash_attn_backward` (imports torch).
"""

import math

import torch
import torch.distributed as dist

from . import autograd as _autograd  # noqa: F401  (registers the custom ops)
from .options import statistics_outputs

__all__ = ["ring_attention", "zigzag_shard", "zigzag_unshard"]


def zigzag_shard(x, rank, world, dim=1):
    """Rank `rank`'s zigzag shard of the whole sequence `x` (along `dim`): of `2 world` equal
    chunks, chunks `rank` and `2 world - 1 - rank`, concatenated (so causal work balances)."""
    chunks = x.chunk(2 * world, dim=dim)
    if len(chunks) != 2 * world or chunks[0].shape[dim] != chunks[-1].shape[dim]:
        raise ValueError(
            f"x: the zigzag split needs a sequence length divisible by 2 * world = {2 * world}, "
            f"got {x.shape[dim]}"
        )
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def zigzag_unshard(shards, dim=1):
    """The whole sequence from every rank's zigzag shard, in rank order (`zigzag_shard`'s
    inverse)."""
    world = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)


class _Ring:
    """This rank's place in `group` and the point-to-point exchange with its neighbours: each
    rank sends to the next and receives from the previous. Over gloo, which sends host
    memory only, CUDA tensors go through host copies (so processes sharing one GPU can run a
    ring); NCCL sends them as they are."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = peer((self.rank + 1) % self.world)
        self.prev = peer((self.rank - 1) % self.world)
        self.host_only = dist.get_backend(group) == dist.Backend.GLOO

    def exchange(self, tensors):
        """Starts sending `tensors` to the next rank and receiving their counterparts from
        the previous one; returns `(pending, received)`: `_Pending.wait()` completes it."""
        staged = self.host_only and any(t.is_cuda for t in tensors)
        send = [t.cpu() if staged else t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in send]
        reqs = []
        for tag, (t, r) in enumerate(zip(send, received)):
            reqs.append(dist.isend(t, self.next, group=self.group, tag=tag))
            reqs.append(dist.irecv(r, self.prev, group=self.group, tag=tag))
        if not staged:
            return _Pending(reqs, received, None), received
        out = [torch.empty_like(t) for t in tensors]
        return _Pending(reqs, received, out), out


class _Pending:
    """Point-to-point requests in flight; `wait()` completes them (and copies host-staged
    receptions into `staged`, their device tensors)."""

    def __init__(self, reqs, received, staged):
        self.reqs, self.received, self.staged = reqs, received, staged

    def wait(self):
        for r in self.reqs:
            r.wait()
        if self.staged is not None:
            for o, r in zip(self.staged, self.received):
                o.copy_(r)


def _blocks(ring, step, causal, zigzag, s_q, s_k):
    """Which part of this rank's queries attends to which part of the key/value shard it holds
    at `step` (the shard of rank `rank - step`): `(rows, keys, causal)` slices, or None when
    the causal mask hides the whole block."""
    everything = (slice(0, s_q), slice(0, s_k), False)
    if not causal:
        return everything
    if step == 0:
        # The rank's own shard: causal within it (in zigzag order too, since the local
        # sequence keeps its chunks in order).
        return (slice(0, s_q), slice(0, s_k), True)
    src = (ring.rank - step) % ring.world
    if not zigzag:
        return everything if src < ring.rank else None
    if src < ring.rank:
        # Both query chunks come after the source's first chunk and before its second.
        return (slice(0, s_q), slice(0, s_k // 2), False)
    # Only the second query chunk comes after both of the source's chunks.
    return (slice(s_q // 2, s_q), slice(0, s_k), False)


def _merge(out, lse, rows, o_b, lse_b):
    """Folds a block's output `o_b` and log-sum-exp `lse_b` (+inf: a row that saw no key)
    into the running f32 `out` [b, s, h, dv] and `lse` [b, h, s] (-inf: no key yet) at
    `rows`."""
    lse_b = torch.where(torch.isposinf(lse_b), torch.full_like(lse_b, -math.inf), lse_b)
    old = lse[:, :, rows]
    new = torch.logaddexp(old, lse_b)
    keep = torch.exp(old - new).nan_to_num(0.0).transpose(1, 2).unsqueeze(-1)
    take = torch.exp(lse_b - new).nan_to_num(0.0).transpose(1, 2).unsqueeze(-1)
    out[:, rows] = out[:, rows] * keep + o_b.float() * take
    lse[:, :, rows] = new


def _forward(q, k, v, scale, causal, zigzag, ring):
    b, s_q, h, _ = q.shape
    out = torch.zeros((b, s_q, h, v.shape[-1]), dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, s_q), -math.inf, dtype=torch.float32, device=q.device)
    k_cur, v_cur = k, v
    for step in range(ring.world):
        last = step + 1 == ring.world
        if not last:
            pending, (k_next, v_next) = ring.exchange([k_cur, v_cur])
        block = _blocks(ring, step, causal, zigzag, s_q, k.shape[1])
        if block is not None:
            rows, keys, blk_causal = block
            o_b, lse_b, _, _ = torch.ops.kiln_attn._flash_attn_forward(
                q[:, rows].contiguous(), k_cur[:, keys].contiguous(), v_cur[:, keys].contiguous(),
                0.0, scale, blk_causal, -1, -1, 0.0, None, False,
            )
            _merge(out, lse, rows, o_b, lse_b)
        if not last:
            pending.wait()
            k_cur, v_cur = k_next, v_next
    # FlashAttention's value for a row that saw no key: +inf.
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    return out.to(q.dtype), lse


def _backward(dout, q, k, v, out, lse, scale, causal, zigzag, ring, deterministic):
    s_q, s_k = q.shape[1], k.shape[1]
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = torch.zeros_like(k, dtype=torch.float32)
    dv = torch.zeros_like(v, dtype=torch.float32)
    k_cur, v_cur = k, v
    for step in range(ring.world):
        last = step + 1 == ring.world
        if not last:
            kv_pending, (k_next, v_next) = ring.exchange([k_cur, v_cur])
        block = _blocks(ring, step, causal, zigzag, s_q, s_k)
        if block is not None:
            rows, keys, blk_causal = block
            q_b = q[:, rows].contiguous()
            k_b, v_b = k_cur[:, keys].contiguous(), v_cur[:, keys].contiguous()
            dq_b, dk_b, dv_b = torch.empty_like(q_b), torch.empty_like(k_b), torch.empty_like(v_b)
            torch.ops.kiln_attn._flash_attn_backward(
                dout[:, rows].contiguous(), q_b, k_b, v_b, out[:, rows].contiguous(),
                lse[:, :, rows].contiguous(), dq_b, dk_b, dv_b, 0.0, scale, blk_causal, -1, -1, 0.0,
                None, deterministic, None,
            )
            dq[:, rows] += dq_b
            dk[:, keys] += dk_b
            dv[:, keys] += dv_b
        # dK and dV travel with the keys and values they belong to: after the last exchange
        # each rank holds its own shard's, summed over every rank's queries.
        d_pending, (dk, dv) = ring.exchange([dk, dv])
        d_pending.wait()
        if not last:
            kv_pending.wait()
            k_cur, v_cur = k_next, v_next
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttnFunc(torch.autograd.Function):
    """ring_attention's autograd: returns (out, softmax_lse), the latter not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, zigzag, group, deterministic):
        ring = _Ring(group)
        out, lse = _forward(q, k, v, scale, causal, zigzag, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, zigzag, group, deterministic)
        return statistics_outputs(ctx, out, (lse,), True)

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 8
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, zigzag, group, deterministic = ctx.args
        dq, dk, dv = _backward(
            dout.contiguous(), q, k, v, out, lse, scale, causal, zigzag, _Ring(group), deterministic
        )
        return dq, dk, dv, None, None, None, None, None


def ring_attention(
    q,
    k,
    v,
    group=None,
    causal=False,
    softmax_scale=None,
    zigzag=None,
    deterministic=False,
    return_lse=False,
):
    """Attention over a sequence split across the ranks of `group` (a `torch.distributed`
    process group, None: the default one): q (batch, seqlen_q_shard, nheads, headdim), k and v
    (batch, seqlen_k_shard, nheads_k, headdim), this rank's shards, every rank's the same
    shape; the result is this rank's shard of FlashAttention's output (and, with
    return_lse=True, its log-sum-exp (batch, nheads, seqlen_q_shard)). Shards are consecutive
    pieces of the sequence in rank order, or with `zigzag` (the default when causal) the
    shards `zigzag_shard` cuts. Differentiable. Causal is aligned as in training (each
    query sees the keys up to its own position: queries and keys share positions)."""
    if zigzag is None:
        zigzag = causal
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor (batch, seqlen, nheads, headdim)")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(
            f"k: causal ring attention takes shards of one sequence (seqlen {q.shape[1]} as q), "
            f"got seqlen {k.shape[1]}"
        )
    if zigzag and causal and q.shape[1] % 2:
        raise ValueError(f"q: a zigzag shard holds two equal chunks, got an odd seqlen {q.shape[1]}")
    scale = q.shape[-1] ** (-0.5) if softmax_scale is None else float(softmax_scale)
    out, lse = RingAttnFunc.apply(q, k, v, scale, bool(causal), bool(zigzag), group, bool(deterministic))
    return (out, lse) if return_lse else out
