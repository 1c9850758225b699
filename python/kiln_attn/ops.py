"""kiln's library kernels as PyTorch-style functions over CUDA tensors.

Each checks its arguments (TypeError / ValueError naming the argument), allocates its outputs
with torch, picks the kernel's comptime values from the shape in one `config_*` function per
kernel (the place to retune), and launches the registered kernel on PyTorch's current stream.
Arithmetic is in f32 whatever the storage type, and statistics are f32 (`docs/python.md`).
"""

import math

import torch

from . import _native, kernel
from .options import statistics_outputs

FLOATS = (torch.float32, torch.bfloat16, torch.float16)

_KERNELS = {}


def _k(name):
    k = _KERNELS.get(name)
    if k is None:
        k = _KERNELS[name] = kernel(name)
    return k


_GRIDS = {}


def _grid(k, extent, ct):
    """The kernel's own grid over `extent` for comptime values `ct`, asked of the kernel once
    per (kernel, extent, values): a wrapper's call then costs one dict lookup for it."""
    key = (k.name, extent, tuple(ct.items()))
    g = _GRIDS.get(key)
    if g is None:
        if len(_GRIDS) > 4096:
            _GRIDS.clear()
        g = _GRIDS[key] = k.grid(extent, **ct)
    return g


def _pow2_at_least(n):
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a, b):
    return -(-a // b)


# One comptime choice per kernel, from the problem's shape.


def config_forward_rows(m, n, dtype):
    """softmax, layer_norm and rms_norm: Rust's choice for the row length
    (`kiln_examples::rows::row_config`: a row up to 16384 columns read once, in one tile)."""
    bm, bn, nw = _native._row_config(n)
    return {"BM": bm, "BN": bn, "NW": nw}


def config_softmax(m, n, dtype):
    return config_forward_rows(m, n, dtype)


def config_softmax_backward(m, n, dtype):
    # Both inputs of a row that fits one tile are read once (Rust's forward choice).
    return config_forward_rows(m, n, dtype)


def config_layer_norm(m, n, dtype):
    return config_forward_rows(m, n, dtype)


def config_rms_norm(m, n, dtype):
    return config_forward_rows(m, n, dtype)


def config_norm_backward(m, n, dtype):
    """layer_norm_backward and rms_norm_backward: Rust's choice
    (`kiln_examples::rows::norm_backward_config`: a row up to 8192 columns read once, each block
    walking RB rows and writing its weight-gradient partials once, two blocks a multiprocessor
    asked for where a thread holds 8 elements of a tile). 16-bit walks read their next tiles
    ahead through shared memory (STAGES 2: on the H100, bf16 layer_norm_backward at 2048 x
    128256 941 -> 1161 GB/s, rms_norm_backward at 16384 x 4096 2137 -> 2531); f32 ones lost
    (layer_norm_backward at 16384 x 4096 2611 -> 2432)."""
    bm, bn, rb, nw, occ = _native._norm_backward_config(m, n)
    stages = 2 if dtype in (torch.bfloat16, torch.float16) else 1
    return {"BM": bm, "BN": bn, "RB": rb, "NW": nw, "OCC": occ, "STAGES": stages}


def config_sum_partials(p, n, dtype):
    """The weight gradients' second stage: 32 columns a block (one 128-byte line of each
    partial row, so many blocks share the columns) by up to 128 partial rows a step, pipelined
    2 deep when there is more than one step (measured on the H100 against 64 x 128 unpipelined:
    layer_norm_backward bf16 16384 x 4096 1886 against 1740 GB/s)."""
    bm = min(128, max(16, _pow2_at_least(p)))
    return {"BM": bm, "BN": 32, "STAGES": 2 if p > bm else 1}


def config_cross_entropy(m, v, dtype):
    """One row per block (a vocabulary row is long), tiles of up to 2048 columns; the loops
    `pipelined` STAGES deep (the forward's and the backward's)."""
    return {"BM": 1, "BN": min(_pow2_at_least(max(v, 32)), 2048), "STAGES": 1}


def config_cross_entropy_reduce(m, mean):
    """The loss's reduction: one block walks every row, so its time is the latency of its
    steps: few wide steps (up to 8192 rows over 16 warps, 512 rows a warp), pipelined 2 deep
    when there is more than one (measured on the H100 against 1024 rows over 4 warps:
    cross_entropy bf16 16384 x 4096 2098 against 1416 GB/s)."""
    bm = min(8192, max(256, _pow2_at_least(m)))
    return {"MEAN": mean, "BM": bm, "NW": min(16, max(1, bm // 512)), "STAGES": 2 if m > bm else 1}


def config_rotary(heads, head_dim, rotary_dim, dtype):
    """Up to 8 heads of one token per block."""
    return {"D": head_dim, "R": rotary_dim, "BH": min(8, _pow2_at_least(heads))}


def config_dropout(n, dtype):
    """1024 elements per block for every dtype (the kernel takes any multiple of one 16-byte
    vector; the mask does not depend on it)."""
    return {"BLOCK": 1024}


# Argument checks.


def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    return t


def _float(name, t, dtypes=FLOATS):
    _tensor(name, t)
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected a tensor of {names}, got {t.dtype}")
    return t


def _like(name, t, ref_name, ref, shape=None):
    _tensor(name, t)
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: expected {ref.dtype} (as {ref_name}), got {t.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: expected a tensor on {ref.device} (as {ref_name}), got {t.device}")
    want = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(t.shape) != want:
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    return t


def _dim(name, dim, ndim):
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name}: expected an int, got {type(dim).__name__}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{name}: {dim} is out of range for a {ndim}-D tensor")
    return dim % max(ndim, 1)


def _rows(x):
    """`x` as `[M, N]` rows of its last dimension (a view when the layout allows, which the
    kernels read with any row stride)."""
    n = x.shape[-1] if x.dim() else 1
    m = x.numel() // n if n else 0
    x2 = x.reshape(m, n)
    if x2.dim() == 2 and n > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2, m, n


def _normalized(x, normalized_shape):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if isinstance(normalized_shape, (str, bytes)):
        raise TypeError(f"normalized_shape: expected an int or a sequence of ints, got {type(normalized_shape).__name__}")
    try:
        shape = tuple(int(s) for s in normalized_shape)
    except TypeError:
        raise TypeError(
            f"normalized_shape: expected an int or a sequence of ints, got {type(normalized_shape).__name__}"
        ) from None
    if not shape or tuple(x.shape[-len(shape):]) != shape or len(shape) > x.dim():
        raise ValueError(f"normalized_shape: {list(shape)} is not the trailing shape of x {list(x.shape)}")
    return shape, math.prod(shape)


def _vector(name, t, n, x, default):
    if t is None:
        return torch.full((n,), default, dtype=x.dtype, device=x.device)
    _like(name, t, "x", x, shape=t.shape)
    if t.numel() != n:
        raise ValueError(f"{name}: expected {n} elements (the normalized shape), got shape {tuple(t.shape)}")
    return t.reshape(n).contiguous()


# Forward functions.


def _softmax_fwd(x, dim):
    dim = _dim("dim", dim, x.dim())
    xt = x.movedim(dim, -1) if x.dim() else x.reshape(1)
    x2, m, n = _rows(xt)
    y2 = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        ct = config_softmax(m, n, x.dtype)
        k = _k("softmax")
        k.launch(_grid(k, m, ct), x2, y2, **ct)
    y = y2.reshape(xt.shape)
    return y.movedim(-1, dim) if x.dim() else y.reshape(())


def softmax(x, dim=-1):
    """`torch.softmax(x, dim)` for f32, bf16 or f16 `x` of any shape (computed in f32)."""
    _float("x", x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Softmax.apply(x, dim)
    return _softmax_fwd(x, dim)


def softmax_backward(dy, y, dim=-1):
    """Softmax's input gradient from the output `y` and its gradient `dy`
    (`torch._softmax_backward_data(dy, y, dim, y.dtype)`)."""
    _float("y", y)
    _like("dy", dy, "y", y)
    dim = _dim("dim", dim, y.dim())
    yt, dyt = (t.movedim(dim, -1) if t.dim() else t.reshape(1) for t in (y, dy))
    y2, m, n = _rows(yt)
    dy2, _, _ = _rows(dyt)
    dx2 = torch.empty((m, n), dtype=y.dtype, device=y.device)
    if m and n:
        ct = config_softmax_backward(m, n, y.dtype)
        k = _k("softmax_backward")
        k.launch(_grid(k, m, ct), y2, dy2, dx2, **ct)
    dx = dx2.reshape(yt.shape)
    return dx.movedim(-1, dim) if y.dim() else dx.reshape(())


def _layer_norm_fwd(x, shape, n, weight, bias, eps):
    w = _vector("weight", weight, n, x, 1.0)
    b = _vector("bias", bias, n, x, 0.0)
    x2, m, _ = _rows(x.reshape(*x.shape[: x.dim() - len(shape)], n))
    y2 = torch.empty((m, n), dtype=x.dtype, device=x.device)
    mean = torch.empty((m,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m and n:
        ct = config_layer_norm(m, n, x.dtype)
        k = _k("layer_norm")
        k.launch(_grid(k, m, ct), x2, w, b, y2, mean, rstd, float(eps), **ct)
    return y2.reshape(x.shape), mean, rstd


def _eps(eps, default):
    if eps is None:
        return default
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps: expected a non-negative number, got {eps!r}")
    return float(eps)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, return_stats=False):
    """`F.layer_norm(x, normalized_shape, weight, bias, eps)` over the trailing
    `normalized_shape` of f32, bf16 or f16 `x`; `weight` and `bias` of x's dtype (None: 1 and
    0). With `return_stats=True`, returns `(y, mean, rstd)`, the f32 per-row mean and
    `1/sqrt(var + eps)` (rows being the leading dimensions flattened)."""
    _float("x", x)
    shape, n = _normalized(x, normalized_shape)
    eps = _eps(eps, 1e-5)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _LayerNorm.apply(x, shape, weight, bias, eps, return_stats)
    y, mean, rstd = _layer_norm_fwd(x, shape, n, weight, bias, eps)
    return (y, mean, rstd) if return_stats else y


def _rms_norm_fwd(x, shape, n, weight, eps):
    w = _vector("weight", weight, n, x, 1.0)
    x2, m, _ = _rows(x.reshape(*x.shape[: x.dim() - len(shape)], n))
    y2 = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m and n:
        ct = config_rms_norm(m, n, x.dtype)
        k = _k("rms_norm")
        k.launch(_grid(k, m, ct), x2, w, y2, rstd, float(eps), **ct)
    return y2.reshape(x.shape), rstd


def rms_norm(x, normalized_shape, weight=None, eps=None, return_rstd=False):
    """`F.rms_norm(x, normalized_shape, weight, eps)`: `eps` None is `torch.finfo(x.dtype).eps`,
    as PyTorch's. With `return_rstd=True`, returns `(y, rstd)`, the f32 per-row
    `1/sqrt(mean(x^2) + eps)`."""
    _float("x", x)
    shape, n = _normalized(x, normalized_shape)
    eps = _eps(eps, torch.finfo(x.dtype).eps)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight)):
        return _RmsNorm.apply(x, shape, weight, eps, return_rstd)
    y, rstd = _rms_norm_fwd(x, shape, n, weight, eps)
    return (y, rstd) if return_rstd else y


def _stat(name, t, m, x):
    _tensor(name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected torch.float32 (the forward's statistics), got {t.dtype}")
    if t.numel() != m:
        raise ValueError(f"{name}: expected {m} elements (one per row), got shape {tuple(t.shape)}")
    return t.reshape(m).contiguous()


def _sum_partials(part, n, dtype):
    out = torch.empty((n,), dtype=dtype, device=part.device)
    ct = config_sum_partials(part.shape[0], n, dtype)
    k = _k("sum_partials")
    k.launch(_grid(k, n, ct), part, out, dtype=dtype, **ct)
    return out


def layer_norm_backward(dy, x, normalized_shape, mean, rstd, weight=None):
    """Layer norm's gradients `(dx, dweight, dbias)` from the forward's `mean` and `rstd`
    (`layer_norm(.., return_stats=True)`); dweight and dbias in x's dtype, summed over rows
    in f32 in two deterministic stages."""
    _float("x", x)
    _like("dy", dy, "x", x)
    shape, n = _normalized(x, normalized_shape)
    w = _vector("weight", weight, n, x, 1.0)
    x2, m, _ = _rows(x.reshape(-1, n) if n else x.reshape(0, 0))
    dy2, _, _ = _rows(dy.reshape(-1, n) if n else dy.reshape(0, 0))
    mean, rstd = _stat("mean", mean, m, x), _stat("rstd", rstd, m, x)
    dx2 = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if not (m and n):
        z = torch.zeros((n,), dtype=x.dtype, device=x.device)
        return dx2.reshape(x.shape), z, z.clone()
    ct = config_norm_backward(m, n, x.dtype)
    k = _k("layer_norm_backward")
    grid = _grid(k, m, ct)
    dw_part = torch.empty((grid[0], n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((grid[0], n), dtype=torch.float32, device=x.device)
    k.launch(grid, x2, w, mean, rstd, dy2, dx2, dw_part, db_part, **ct)
    return dx2.reshape(x.shape), _sum_partials(dw_part, n, x.dtype), _sum_partials(db_part, n, x.dtype)


def rms_norm_backward(dy, x, normalized_shape, rstd, weight=None):
    """RMS norm's gradients `(dx, dweight)` from the forward's `rstd`."""
    _float("x", x)
    _like("dy", dy, "x", x)
    shape, n = _normalized(x, normalized_shape)
    w = _vector("weight", weight, n, x, 1.0)
    x2, m, _ = _rows(x.reshape(-1, n) if n else x.reshape(0, 0))
    dy2, _, _ = _rows(dy.reshape(-1, n) if n else dy.reshape(0, 0))
    rstd = _stat("rstd", rstd, m, x)
    dx2 = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if not (m and n):
        return dx2.reshape(x.shape), torch.zeros((n,), dtype=x.dtype, device=x.device)
    ct = config_norm_backward(m, n, x.dtype)
    k = _k("rms_norm_backward")
    grid = _grid(k, m, ct)
    dw_part = torch.empty((grid[0], n), dtype=torch.float32, device=x.device)
    k.launch(grid, x2, w, rstd, dy2, dx2, dw_part, **ct)
    return dx2.reshape(x.shape), _sum_partials(dw_part, n, x.dtype)


REDUCTIONS = ("none", "mean", "sum")


def _targets(target, m, ignore_index):
    """The class indices as the kernels read them, `[m, words]` int32 words with the class in
    column 0: an int32 tensor viewed `[m, 1]`, an int64 one as its `[m, 2]` little-endian words
    (the low word holds every class an int32 holds): views, no conversion kernel. And
    `ignore_index` as the kernels' int32 (one beyond int32 matches no such class: -1, which
    the kernels ignore as every negative class)."""
    _tensor("target", target)
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target: expected class indices of torch.int64 or torch.int32, got {target.dtype}")
    if tuple(target.shape) != (m,):
        raise ValueError(f"target: expected shape ({m},) (one class per row of logits), got {tuple(target.shape)}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    t = target.contiguous()
    words = 2 if t.dtype == torch.int64 else 1
    t = t.view(torch.int32).view(m, words) if words == 2 else t.view(m, 1)
    return t, (ignore_index if -(2**31) <= ignore_index < 2**31 else -1)


def _reduction(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    return reduction


def _cross_entropy_fwd(logits, targets):
    (t, ignore) = targets
    m, v = logits.shape
    x = logits if v <= 1 or logits.stride(1) == 1 else logits.contiguous()
    loss = torch.empty((m,), dtype=torch.float32, device=x.device)
    lse = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m and v:
        ct = config_cross_entropy(m, v, x.dtype)
        k = _k("cross_entropy")
        k.launch(_grid(k, m, ct), x, t, loss, lse, ignore, **ct)
    return loss, lse


def _reduce(loss, targets, reduction):
    """The loss `reduction` gives, and the `[reduced, counted rows]` statistics the
    backward's mean reads (`None` for "none"): one kernel, a fixed order of sums."""
    if reduction == "none":
        return loss, None
    (t, ignore) = targets
    m = loss.shape[0]
    if not m:
        # As PyTorch's: the sum of nothing is 0, the mean NaN.
        stats = torch.tensor([0.0 if reduction == "sum" else math.nan, 0.0], device=loss.device)
        return stats[0], stats
    stats = torch.empty((2,), dtype=torch.float32, device=loss.device)
    ct = config_cross_entropy_reduce(m, reduction == "mean")
    _k("cross_entropy_reduce").launch((1, 1, 1), loss, t, stats, ignore, **ct)
    return stats[0], stats


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", return_lse=False):
    """`F.cross_entropy(logits, target, ignore_index=.., reduction=..)` for `[M, V]` logits
    (f32, bf16 or f16) and `[M]` class indices (int64 or int32), the loss in f32. Rows whose
    target is ignore_index, or negative, count as ignored (loss 0, left out of the mean).
    Target values are not checked against V (that would synchronise with the GPU): a target
    of V or more gives that row the loss of a class of logit 0, and an int64 target beyond
    int32 is read by its low word (the kernels read int64 targets in place as their words).
    With `return_lse=True`,
    returns `(loss, lse)`, lse the f32 per-row log-sum-exp."""
    _float("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D tensor [M, V], got shape {tuple(logits.shape)}")
    reduction = _reduction(reduction)
    targets = _targets(target, logits.shape[0], ignore_index)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _CrossEntropy.apply(logits, targets, reduction, return_lse)
    loss, lse = _cross_entropy_fwd(logits, targets)
    loss, _ = _reduce(loss, targets, reduction)
    return (loss, lse) if return_lse else loss


def cross_entropy_backward(dloss, logits, target, lse, ignore_index=-100, reduction="mean"):
    """The logits' gradient of `cross_entropy(logits, target, ignore_index, reduction)` given
    the loss's gradient `dloss` (a scalar for "mean" and "sum", `[M]` for "none") and the
    forward's `lse`; in the logits' dtype."""
    _float("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D tensor [M, V], got shape {tuple(logits.shape)}")
    m, v = logits.shape
    reduction = _reduction(reduction)
    targets = _targets(target, m, ignore_index)
    lse = _stat("lse", lse, m, logits)
    _tensor("dloss", dloss)
    # The mean's divisor: the reduction's count of the rows that count (its sum, of lse here,
    # goes unread).
    stats = _reduce(lse, targets, "sum")[1] if reduction == "mean" else None
    return _cross_entropy_bwd(dloss, logits, targets, lse, reduction, stats)


def _cross_entropy_bwd(dloss, logits, targets, lse, reduction, stats):
    (t, ignore) = targets
    m, v = logits.shape
    want = (m,) if reduction == "none" else ()
    if tuple(dloss.shape) != want:
        raise ValueError(f"dloss: expected shape {want} for reduction={reduction!r}, got {tuple(dloss.shape)}")
    g = dloss.reshape(-1)
    g = g if g.dtype == torch.float32 and g.stride(0) == 1 else g.float().contiguous()
    x = logits if v <= 1 or logits.stride(1) == 1 else logits.contiguous()
    dx = torch.empty((m, v), dtype=logits.dtype, device=logits.device)
    if m and v:
        ct = config_cross_entropy(m, v, x.dtype)
        k = _k("cross_entropy_backward")
        # "none" reads no statistics: any f32 vector stands in.
        k.launch(_grid(k, m, ct), x, t, lse, g, g if stats is None else stats, dx, ignore,
                 REDUCED=reduction != "none", MEAN=reduction == "mean", **ct)
    return dx


def rotary(x, cos, sin, offset=0, rotary_dim=None):
    """Rotary position embedding, GPT-NeoX form (FlashAttention's `apply_rotary_emb`,
    interleaved=False) of `x: [batch, seqlen, heads, head_dim]`; `cos, sin: [seqlen_ro,
    rotary_dim / 2]` (converted to x's dtype), position t taking row t + offset. Dimensions
    from rotary_dim on are copied."""
    _float("x", x)
    if x.dim() != 4:
        raise ValueError(f"x: expected a 4-D tensor [batch, seqlen, heads, head_dim], got shape {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        _float(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D tensor [seqlen_ro, rotary_dim / 2], got shape {tuple(t.shape)}")
    if tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(f"sin: expected cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    b, s, h, d = x.shape
    r = 2 * cos.shape[1] if rotary_dim is None else int(rotary_dim)
    if r != 2 * cos.shape[1] or not 0 < r <= d or r % 2:
        raise ValueError(f"cos: rotary_dim {r} must be even, at most head_dim {d}, and twice cos's {cos.shape[1]} columns")
    if not isinstance(offset, int) or offset < 0 or offset + s > cos.shape[0]:
        raise ValueError(f"offset: positions {offset}..{offset + s} must lie within cos's {cos.shape[0]} rows")
    xc = x if x.stride(3) == 1 else x.contiguous()
    cos, sin = (t.to(x.dtype).contiguous() for t in (cos, sin))
    y = torch.empty_like(xc, memory_format=torch.contiguous_format)
    if b and s and h:
        ct = config_rotary(h, d, r, x.dtype)
        k = _k("rotary")
        k.launch((s, b, _cdiv(h, ct["BH"])), xc, cos, sin, y, offset, **ct)
    return y


def dropout(x, p=0.5, training=True, seed=None):
    """`F.dropout(x, p, training)` for f32, bf16 or f16 `x` (the result in x's dtype, computed
    in f32): each element kept with probability 1 - p and scaled by 1 / (1 - p). Flat element
    i is kept when word i % 4 of Philox4x32-10 of counter i // 4 under `seed`, as a uniform in
    [0, 1), exceeds p (one Philox call per four elements): the same `seed` gives the same mask
    (the backward pass regenerates it); None draws a seed from torch's CPU generator."""
    _float("x", x)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p < 1:
        raise ValueError(f"p: expected a probability in [0, 1), got {p!r}")
    if not training or p == 0:
        return x.clone() if not (torch.is_grad_enabled() and x.requires_grad) else x * 1.0
    if seed is None:
        seed = int(torch.randint(0, 2**32, (1,), dtype=torch.int64).item())
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: expected an int in [0, 2^32), got {seed!r}")
    if torch.is_grad_enabled() and x.requires_grad:
        return _Dropout.apply(x, float(p), seed)
    return _dropout_fwd(x, float(p), seed)


def _dropout_fwd(x, p, seed):
    flat = x.reshape(-1).contiguous()
    y = torch.empty_like(flat)
    n = flat.numel()
    if n:
        ct = config_dropout(n, x.dtype)
        k = _k("dropout")
        k.launch(_grid(k, n, ct), flat, y, p, seed, **ct)
    return y.reshape(x.shape)


# Autograd.


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _softmax_fwd(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(dy.to(y.dtype).contiguous(), y, ctx.dim), None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps, return_stats):
        n = math.prod(shape)
        y, mean, rstd = _layer_norm_fwd(x, shape, n, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.shape = shape
        ctx.has_bias = bias is not None
        return statistics_outputs(ctx, y, (mean, rstd), return_stats)

    @staticmethod
    def backward(ctx, dy, *_dstats):
        if dy is None:
            return None, None, None, None, None, None
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy.to(x.dtype).contiguous(), x, ctx.shape, mean, rstd, weight)
        dw = dw.reshape(weight.shape) if weight is not None else None
        db = db.reshape(ctx.shape) if ctx.has_bias else None
        return dx, None, dw, db, None, None


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shape, weight, eps, return_rstd):
        n = math.prod(shape)
        y, rstd = _rms_norm_fwd(x, shape, n, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape = shape
        return statistics_outputs(ctx, y, (rstd,), return_rstd)

    @staticmethod
    def backward(ctx, dy, *_drstd):
        if dy is None:
            return None, None, None, None, None
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy.to(x.dtype).contiguous(), x, ctx.shape, rstd, weight)
        return dx, None, (dw.reshape(weight.shape) if weight is not None else None), None, None


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, reduction, return_lse):
        loss, lse = _cross_entropy_fwd(logits, targets)
        loss, stats = _reduce(loss, targets, reduction)
        (t, ctx.ignore) = targets
        ctx.save_for_backward(logits, t, lse, stats)
        ctx.reduction = reduction
        return statistics_outputs(ctx, loss, (lse,), return_lse)

    @staticmethod
    def backward(ctx, dloss, *_dlse):
        if dloss is None:
            return None, None, None, None
        logits, t, lse, stats = ctx.saved_tensors
        dx = _cross_entropy_bwd(dloss, logits, (t, ctx.ignore), lse, ctx.reduction, stats)
        return dx, None, None, None


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed, ctx.dtype = p, seed, x.dtype
        return _dropout_fwd(x, p, seed)

    @staticmethod
    def backward(ctx, dy):
        # The same mask and scale: dx = dropout(dy) with the forward's seed, in x's dtype.
        return _dropout_fwd(dy.to(ctx.dtype).contiguous(), ctx.p, ctx.seed), None, None


__all__ = [
    "softmax", "softmax_backward", "layer_norm", "layer_norm_backward", "rms_norm",
    "rms_norm_backward", "cross_entropy", "cross_entropy_backward", "rotary", "dropout",
]
