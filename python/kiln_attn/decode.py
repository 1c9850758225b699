"""The decode path's checks and launches (`kvcache`, `flash_attn_combine`) over kiln's decode
kernels (`kiln_examples::attention_decode`); `kiln_attn.kvcache` holds the public entry.
Every argument is checked from shapes, strides, dtypes and devices alone, before anything is
allocated or launched (no tensor value is read on the host, so a decode step is capturable in
a CUDA graph), and torch is imported only after the checks, so they run on fake tensors. A
head dim that is no multiple of 8 runs on zero-padded copies (`_pad8`), as FlashAttention 2's.
The launches and the caches' views: `docs/python.md`, decoding.
"""

import operator

from . import kernel
from .options import _INTERPRET, window_pair

_HALF = ("torch.float16", "torch.bfloat16")
_I32 = "torch.int32"

# The decode kernels' fixed comptime choices (`DecodeParams`'s defaults, which the grids
# below depend on); the attention kernels' packed query rows per block: `_block_m`.
_BLOCK_ROWS = 16
_ROTARY_HEADS = 4

# The multiprocessors the interpreter plans splits for when `num_splits=0`: an H100's or
# H200's 132, so the interpreter runs the split a GPU of that class would.
_INTERPRETER_SMS = 132

_KERNELS = {}
_SMS = {}
_TARGET = {}


def _k(name):
    k = _KERNELS.get(name)
    if k is None:
        k = _KERNELS[name] = kernel(name)
    return k


def _cdiv(a, b):
    return -(-a // b)


def value_blocks(d, dv=None):
    """Blocks sharing a head's value columns (the attention grid's y is `heads_k *
    value_blocks(d, dv)`): the kernels' own rule, `kiln_examples::attention_decode::
    value_split`, through the native module (`dv` None: `d`)."""
    from . import _native

    return _native._value_split(d, d if dv is None else dv)


def decode_key_block(d, page_size):
    """Keys per block the decode kernels choose for head dim `d` and pages of `page_size`
    keys (0: a dense cache): 64 up to d = 128 (16 beyond) when a page holds whole blocks,
    else half as many, at least 16."""
    whole = 64 if d <= 128 else 16
    if page_size == 0 or page_size % whole == 0:
        return whole
    return max(whole // 2, 16)


def num_splits_heuristic(batch, heads_k, row_blocks, keys, block_n, sms):
    """How many splits of the keys `attention_decode_split` runs with when `num_splits=0`:
    the kernels' own rule, `kiln_examples::attention_decode::num_splits`, called through the
    native module (1 when the `batch * heads_k * row_blocks` blocks fill 80% of the `sms`
    multiprocessors, else the fewest splits whose last wave keeps 85% of the best count's use
    of the SMs, each split at least two key blocks, at most 128 splits)."""
    from . import _native

    return _native._num_splits(batch, heads_k, row_blocks, keys, block_n, sms)


def _block_m(rows, device):
    """Packed query rows (`seqlen_q * kv_group`) per block of the attention kernels: 128 on
    sm_90a (two warpgroups; the interpreter plans as one) where more than 64 rows would take
    a second block, else 64. Every block reads all the keys and values its rows see, so one
    block of 128 rows reads the cache once where two of 64 read it twice; sm_80's 128-row
    tiles spill (ptxas: 760 bytes at d = 128)."""
    if rows <= 64:
        return 64
    if _INTERPRET[0]:
        return 128
    target = _TARGET.get(device)
    if target is None:
        from . import _native

        index = device.index
        if index is None:
            import torch

            index = torch.cuda.current_device()
        target = _TARGET[device] = _native._target(index)
    return 128 if target == "sm_90a" else 64


def _sms(device):
    n = _SMS.get(device)
    if n is None:
        import torch

        n = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


# Argument checks: shapes, strides, dtypes and devices only (fake tensors pass through).


def _place(name, t):
    """`t` is a tensor where the call runs (CUDA, or the CPU inside `interpreter()`)."""
    if not (hasattr(t, "shape") and hasattr(t, "stride") and hasattr(t, "dtype")):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if _INTERPRET[0]:
        if str(t.device) != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor (the interpreter runs on the host), got one on {t.device}")
    elif not getattr(t, "is_cuda", False):
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    return t


def _same_device(name, t, q):
    if str(t.device) != str(q.device):
        raise ValueError(f"{name}: expected a tensor on {q.device} (as q), got {t.device}")


def _rank(name, t, n, what):
    if len(t.shape) != n:
        raise ValueError(f"{name}: expected a {n}-D tensor {what}, got shape {tuple(t.shape)}")


def _shape(name, t, want, what):
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"{name}: expected shape {tuple(want)} {what}, got {tuple(t.shape)}")


def _half(name, t, q=None):
    dt = str(t.dtype)
    if q is None:
        if dt not in _HALF:
            raise TypeError(f"{name}: expected torch.float16 or torch.bfloat16, got {dt}")
    elif dt != str(q.dtype):
        raise TypeError(f"{name}: expected {q.dtype} (as q), got {dt}")


def _index(name, t, q, shape, what):
    """An int32 index tensor (`cache_seqlens`, `cache_batch_idx`, ...) of `shape`."""
    _place(name, t)
    _same_device(name, t, q)
    if str(t.dtype) != _I32:
        raise TypeError(f"{name}: expected torch.int32, got {t.dtype}")
    _rank(name, t, len(shape), what)
    _shape(name, t, shape, what)
    return t


def _last_contiguous(name, t):
    if t.shape[-1] > 1 and t.stride()[-1] != 1:
        raise ValueError(
            f"{name}: expected a contiguous last dimension (stride 1), got strides "
            f"{tuple(t.stride())}; the cache is written in place, so kiln_attn does not copy it"
        )


def _int(name, x):
    if isinstance(x, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}") from None


def _maybe_contiguous(t):
    """FlashAttention's rule for the tensors only read: a copy when the last dimension is
    strided (the kernels read rows of contiguous elements)."""
    return t.contiguous() if t is not None and t.shape[-1] > 1 and t.stride()[-1] != 1 else t


def _launch(name, grid, *args, **ct):
    k = _k(name)
    if _INTERPRET[0]:
        k.interpret(grid, *args, **ct)
    else:
        k.launch(grid, *args, **ct)


# The tile widths the decode kernels run a head dim in (a tensor narrower than its tile reads
# 0 past its last column and is not written there).
_DECODE_TILES = (16, 32, 64, 96, 128, 192, 256)


def _tile(name, what, d):
    """The narrowest decode tile holding head dim `d` (1 to 256; one that is no multiple of 8
    runs padded to the next, which the same tile holds)."""
    if not 0 < d <= 256:
        raise ValueError(f"{name}: {what} {d} is not supported (kiln_attn takes head dims from 1 to 256)")
    return next(w for w in _DECODE_TILES if w >= d)


def _pad8(t):
    """`t` (or None) with its last dimension padded with zeros to a multiple of 8: the kernels
    read rows of 16-byte units (FlashAttention 2's rule); zero columns add nothing to a score
    and give output columns that are cut off. A copy when padded, else `t` itself."""
    import torch

    extra = 0 if t is None else -t.shape[-1] % 8
    return torch.nn.functional.pad(t, (0, extra)) if extra else t


def _write_back_appended(cache, padded, page_table, cache_seqlens, s_new):
    """Copies the rows `kv_cache_append` wrote into `padded` (the zero-padded copy of the
    caller's `cache`) back into `cache`, cut to its head dim: key `t` of the `s_new` new ones of
    sequence `i` lies at position `cache_seqlens[i] + t`, in page `page_table[i, pos // page]`
    at row `pos % page` (a dense cache: one page per sequence, as the kernels read it).

    Exact without knowing which positions the kernel skipped (past the page table, negative):
    such an index is clamped into the cache, and any row copied back that the kernel did not
    write holds the caller's own values. Device-side index arithmetic only: nothing is read on
    the host."""
    import torch

    if cache.numel() == 0:
        return
    pages, page = cache.shape[0], cache.shape[1]
    pos = cache_seqlens.long()[:, None] + torch.arange(s_new, device=cache.device)
    pos = pos.clamp(min=0)
    slot = (pos // page).clamp(max=page_table.shape[1] - 1)
    at = (page_table.long().gather(1, slot).clamp(0, pages - 1), pos % page)
    cache[at] = padded[at][..., : cache.shape[-1]]


def kvcache(
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
    fa3_window,
    attention_chunk=0,
):
    """`flash_attn_with_kvcache` after the version's own arguments: every check, then the
    launches. `fa3_window`: FlashAttention 3's window rule (else 2's); `attention_chunk`:
    FlashAttention 3's chunks (0 off; checked by the caller), counted from `cache_leftpad`."""
    _place("q", q)
    _half("q", q)
    _rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    b, sq, h, d = q.shape
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _place(name, t)
        _same_device(name, t, q)
        _half(name, t, q)
        _rank(name, t, 4, "(batch_cache or num_blocks, seqlen_cache or page_block_size, nheads_k, headdim)")
        _last_contiguous(name, t)
    pages, page_len, hk, dk = k_cache.shape
    dv = v_cache.shape[-1]
    _shape("v_cache", v_cache, (pages, page_len, hk, dv), "(as k_cache but for headdim_v)")
    if dk != d:
        raise ValueError(f"k_cache: expected headdim {d} (as q), got {dk}")
    d_tile = _tile("q", "headdim", d)
    dv_tile = _tile("v_cache", "headdim_v", dv)
    if hk == 0 or h == 0 or h % hk:
        raise ValueError(f"k_cache: nheads_k {hk} must divide q's nheads {h} (both at least 1)")
    group = h // hk

    # The page table: FlashAttention's paged cache, or a dense cache as one page per sequence.
    if page_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: a paged cache (page_table) takes no cache_batch_idx; pass None")
        _place("page_table", page_table)
        _same_device("page_table", page_table, q)
        if str(page_table.dtype) != _I32:
            raise TypeError(f"page_table: expected torch.int32, got {page_table.dtype}")
        _rank("page_table", page_table, 2, "(batch, max_num_blocks_per_seq)")
        if page_table.shape[0] != b:
            raise ValueError(f"page_table: expected {b} rows (q's batch), got shape {tuple(page_table.shape)}")
        if page_len == 0:
            raise ValueError("k_cache: a paged cache's page_block_size must be at least 1")
        page_size = page_len
        capacity = page_table.shape[1] * page_len
    else:
        if cache_batch_idx is not None:
            _index("cache_batch_idx", cache_batch_idx, q, (b,), "(batch,)")
        elif pages < b:
            raise ValueError(
                f"k_cache: expected at least {b} sequences (q's batch) without cache_batch_idx, got {pages}"
            )
        page_size = 0
        capacity = page_len

    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens: expected an int or a torch.int32 tensor, got bool")
    seqlens_int = None
    if cache_seqlens is None:
        seqlens_int = capacity
    elif isinstance(cache_seqlens, int):
        seqlens_int = cache_seqlens
    else:
        if not hasattr(cache_seqlens, "dtype"):
            raise TypeError(f"cache_seqlens: expected an int or a torch.int32 tensor, got {type(cache_seqlens).__name__}")
        _index("cache_seqlens", cache_seqlens, q, (b,), "(batch,)")
    if cache_leftpad is not None:
        _index("cache_leftpad", cache_leftpad, q, (b,), "(batch,)")

    # New keys and values.
    if (k is None) != (v is None):
        raise ValueError(f"{'v' if k is not None else 'k'}: k and v are appended together; pass both or neither")
    s_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _place(name, t)
            _same_device(name, t, q)
            _half(name, t, q)
            _rank(name, t, 4, "(batch, seqlen_new, nheads_k, headdim)")
        s_new = k.shape[1]
        _shape("k", k, (b, s_new, hk, d), "(batch, seqlen_new, nheads_k, headdim)")
        _shape("v", v, (b, s_new, hk, dv), "(as k but for v_cache's headdim_v)")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens: appending k and v needs each sequence's cache length; pass cache_seqlens")
    if seqlens_int is not None and not 0 <= seqlens_int <= capacity - s_new:
        raise ValueError(
            f"cache_seqlens: {seqlens_int} keys plus {s_new} new ones do not fit the cache's {capacity}"
        )

    # Rotary tables.
    rotary_dim = 0
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{'rotary_sin' if rotary_cos is not None else 'rotary_cos'}: pass rotary_cos and rotary_sin together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos: the rotary embedding applies to new keys; pass k and v with it")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _place(name, t)
            _same_device(name, t, q)
            _half(name, t, q)
            _rank(name, t, 2, "(seqlen_ro, rotary_dim / 2)")
        _shape("rotary_sin", rotary_sin, rotary_cos.shape, "(as rotary_cos)")
        rotary_dim = 2 * rotary_cos.shape[1]
        if not 0 < rotary_dim <= d:
            raise ValueError(f"rotary_cos: rotary_dim {rotary_dim} (twice its columns) must be at least 1 and at most headdim {d}")
        if rotary_cos.shape[0] < capacity:
            raise ValueError(
                f"rotary_cos: expected at least {capacity} rows (the cache's length), got {rotary_cos.shape[0]}"
            )

    # Scalars.
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale: expected a float, got {type(softmax_scale).__name__}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not isinstance(rotary_interleaved, bool):
        raise TypeError(f"rotary_interleaved: expected a bool, got {type(rotary_interleaved).__name__}")
    splits = _int("num_splits", num_splits)
    if splits < 0:
        raise ValueError(f"num_splits: expected >= 0 (0: kiln chooses), got {splits}")
    left, right = window_pair(window_size)
    # A bound that masks nothing is unbounded: FlashAttention 2 against the cache's length,
    # 3 against seqlen_k - 1 and seqlen_q - 1.
    if fa3_window:
        left = -1 if left >= capacity - 1 else left
        right = -1 if right >= sq - 1 else right
    else:
        left = -1 if left >= capacity else left
        right = -1 if right >= capacity else right
    left, right = max(left, -1), max(right, -1)
    if causal:
        right = 0
    softcap = float(softcap) if softcap > 0 else 0.0

    # Past the checks: allocate and launch.
    import torch

    dev = q.device
    q = _maybe_contiguous(q)
    if k is not None:
        k, v = _maybe_contiguous(k), _maybe_contiguous(v)
    # A head dim that is no multiple of 8: the kernels run on zero-padded copies (only of the
    # tensors whose head dim needs it), the output is cut back, the appended rows written back.
    callers_caches = (k_cache, v_cache)
    q, k, v = _pad8(q), _pad8(k), _pad8(v)
    k_cache, v_cache = _pad8(k_cache), _pad8(v_cache)
    if seqlens_int is not None:
        cache_seqlens = torch.full((b,), seqlens_int, dtype=torch.int32, device=dev)
    if cache_leftpad is None:
        cache_leftpad = torch.zeros((b,), dtype=torch.int32, device=dev)
    if page_table is None:
        if cache_batch_idx is not None:
            page_table = cache_batch_idx.reshape(b, 1)
        else:
            page_table = torch.arange(b, dtype=torch.int32, device=dev).reshape(b, 1)
    if rotary_cos is None:
        rotary_cos = rotary_sin = torch.zeros((1, 1), dtype=q.dtype, device=dev)

    ct = {
        "d": d_tile,
        "dv": dv_tile,
        "dtype": q.dtype,
        "kv_group": group,
        "page_size": page_size,
        "causal": causal,
        "window_left": left,
        "window_right": right,
        "attention_chunk": attention_chunk,
        "softcap": softcap,
        "rotary_dim": rotary_dim,
        "rotary_interleaved": rotary_interleaved,
    }
    out = torch.empty((b, sq, h, v_cache.shape[-1]), dtype=q.dtype, device=dev)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=dev)
    # `[pages, page, heads_k, d]` read as `[pages, heads_k, page, d]`.
    k_view, v_view = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    if b and s_new and hk:
        grid = (_cdiv(s_new, _BLOCK_ROWS), hk, b)
        _launch("kv_cache_append", grid, k.transpose(1, 2), v.transpose(1, 2), k_view, v_view, page_table,
                cache_seqlens, rotary_cos, rotary_sin, **ct)
        for mine, padded in zip(callers_caches, (k_cache, v_cache)):
            if padded is not mine:
                _write_back_appended(mine, padded, page_table, cache_seqlens, s_new)
    if not (b and sq and h):
        return _result(out, lse, dv, return_softmax_lse)
    if rotary_dim:
        q_rot = torch.empty_like(q)
        _launch("rotary_q", (sq, b, _cdiv(h, _ROTARY_HEADS)), q, rotary_cos, rotary_sin, cache_seqlens, q_rot, **ct)
        q = q_rot
    block_m = _block_m(sq * group, dev)
    row_blocks = _cdiv(sq * group, block_m)
    if splits == 0:
        sms = _INTERPRETER_SMS if _INTERPRET[0] else _sms(dev)
        key_block = decode_key_block(max(d_tile, dv_tile), page_size)
        splits = num_splits_heuristic(b, hk, row_blocks, capacity, key_block, sms)
    scale = float(softmax_scale)
    cache = (q, k_view, v_view, page_table, cache_seqlens, cache_leftpad)
    grid = (splits * row_blocks, hk * value_blocks(d_tile, dv_tile), b)
    rows_ct = {**ct, "block_m": block_m}
    if splits == 1:
        _launch("attention_decode", grid, *cache, out, lse, scale, s_new, **rows_ct)
    else:
        o_partial = torch.empty((splits * b, sq, h, out.shape[-1]), dtype=torch.float32, device=dev)
        lse_partial = torch.empty((splits * b, sq, h), dtype=torch.float32, device=dev)
        _launch("attention_decode_split", grid, *cache, o_partial, lse_partial, scale, s_new, **rows_ct)
        _launch("attention_decode_combine", (_cdiv(h, _BLOCK_ROWS), sq, b), o_partial, lse_partial, out, lse, **ct)
    return _result(out, lse, dv, return_softmax_lse)


def _result(out, lse, dv, return_softmax_lse):
    """The call's result: `out` cut back to the caller's head dim `dv` when it was padded
    (contiguous, as the unpadded call's and the custom op's fake output)."""
    if out.shape[-1] != dv:
        out = out[..., :dv].contiguous()
    return (out, lse) if return_softmax_lse else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FlashAttention 3's flash_attn_combine: merges split-KV partial results by their
    log-sum-exps.

    out_partial: (num_splits, batch, seqlen, nheads, headdim) torch.float32; lse_partial:
    (num_splits, batch, seqlen, nheads) torch.float32 (natural log, -inf for a split that saw
    no key); headdim up to 256 (one that is no multiple of 8 runs on a zero-padded copy of
    out_partial, as FlashAttention 3 pads it). out: (batch, seqlen, nheads, headdim) to
    write, or None; out_dtype: its dtype (default out's, else torch.float32); float32,
    float16 or bfloat16.

    Returns (out, softmax_lse): out[b, s, h] = sum_i exp(lse_i - lse) out_partial[i, b, s, h]
    with lse = log sum_i exp(lse_i), and softmax_lse (batch, seqlen, nheads) torch.float32
    (a view of a (batch, nheads, seqlen) tensor, as FlashAttention 3's); a row no split saw a
    key for gets out = 0 and lse = +inf.
    """
    _place("out_partial", out_partial)
    if str(out_partial.dtype) != "torch.float32":
        raise TypeError(f"out_partial: expected torch.float32, got {out_partial.dtype}")
    _rank("out_partial", out_partial, 5, "(num_splits, batch, seqlen, nheads, headdim)")
    n, b, s, h, d = out_partial.shape
    _place("lse_partial", lse_partial)
    _same_device("lse_partial", lse_partial, out_partial)
    if str(lse_partial.dtype) != "torch.float32":
        raise TypeError(f"lse_partial: expected torch.float32, got {lse_partial.dtype}")
    _rank("lse_partial", lse_partial, 4, "(num_splits, batch, seqlen, nheads)")
    _shape("lse_partial", lse_partial, (n, b, s, h), "(num_splits, batch, seqlen, nheads)")
    if n == 0:
        raise ValueError("out_partial: expected at least one split, got 0")
    d_tile = _tile("out_partial", "headdim", d)
    allowed = ("torch.float32", "torch.float16", "torch.bfloat16")
    if out_dtype is not None and str(out_dtype) not in allowed:
        raise TypeError(f"out_dtype: expected torch.float32, torch.float16 or torch.bfloat16, got {out_dtype}")
    if out is not None:
        _place("out", out)
        _same_device("out", out, out_partial)
        _shape("out", out, (b, s, h, d), "(batch, seqlen, nheads, headdim)")
        if str(out.dtype) not in allowed:
            raise TypeError(f"out: expected torch.float32, torch.float16 or torch.bfloat16, got {out.dtype}")
        if out_dtype is not None and str(out_dtype) != str(out.dtype):
            raise TypeError(f"out: expected out_dtype {out_dtype}, got {out.dtype}")

    import torch

    dev = out_partial.device
    if out is None:
        out = torch.empty((b, s, h, d), dtype=out_dtype or torch.float32, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if b and s and h:
        # The kernel reads the splits and the batch as one dimension: a view when the strides
        # allow it, else a copy of the inputs (never of `out`, unless its head dim is padded).
        op = _pad8(_maybe_contiguous(out_partial))
        dp = op.shape[-1]
        op = op.reshape(n * b, s, h, dp)
        lp = lse_partial.reshape(n * b, s, h)
        dst = out if dp == d else torch.empty((b, s, h, dp), dtype=out.dtype, device=dev)
        ct = {"d": d_tile, "dtype": out.dtype}
        _launch("attention_decode_combine", (_cdiv(h, _BLOCK_ROWS), s, b), op, lp, dst, lse, **ct)
        if dst is not out:
            out.copy_(dst[..., :d])
    return out, lse.transpose(1, 2)


__all__ = ["flash_attn_with_kvcache", "flash_attn_combine", "num_splits_heuristic"]
