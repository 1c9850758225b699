"""kiln's kernels for PyTorch, on PyTorch's CUDA tensors in place and its current stream.

- `flash_attn_func`, `flash_attn_varlen_func`: FlashAttention 2's interface, argument for
  argument (`dropout_p` fourth; `dropout_p` > 0 and `alibi_slopes` raise a ValueError), over
  kiln's DSL attention, forward and backward: differentiable in q, k, v (the backward runs
  kiln's backward kernels on the saved log-sum-exp; `deterministic=True` gives the same bits
  every run), traceable by `torch.compile(fullgraph=True)`.
- `_flash_attn_forward`, `_flash_attn_backward` and their varlen forms: FlashAttention 2's
  low-level functions (the backward writes the caller's dq, dk, dv buffers and returns
  softmax_d), `torch.library` custom ops `torch.ops.kiln_attn.*` with fake implementations
  (`kiln_attn.autograd`; these need torch).
- `kiln_attn.fa3`: FlashAttention 3's `flash_attn_func` / `flash_attn_varlen_func` argument
  order and window rule.
- `flash_attn_with_kvcache`, `flash_attn_combine`: FlashAttention's decoding against a
  key/value cache (dense or paged, new keys appended in place, rotary, split-KV) and its
  split combine (`kiln_attn.kvcache`; FlashAttention 3's argument order in `kiln_attn.fa3`).
- `interpreter()`: a context in which attention runs on kiln's CPU interpreter over CPU
  tensors (tests without a GPU).
- `kernels()`, `kernel(name)`: any registered `#[kernel]` of kiln's library, inspected and
  launched by name (`kernel("layer_norm").launch(grid, x, w, b, y, mean, rstd, 1e-5)`).
- `kiln_attn.ops`: the library kernels as PyTorch-style functions (`ops.softmax(x, dim=-1)`,
  `ops.layer_norm`, `ops.rms_norm`, `ops.cross_entropy`, their backward passes, `ops.rotary`,
  `ops.dropout`), imported on first use since it needs torch (this module does not).
"""

import sys

from ._native import (  # noqa: F401
    Kernel,
    __version__,
    _context_handle,
    _empty_launch,
    _target,
    kernel,
    kernels,
)
from .interface import flash_attn_func, flash_attn_varlen_func, interpreter  # noqa: F401
from .kvcache import flash_attn_combine, flash_attn_with_kvcache  # noqa: F401

__all__ = [
    "Kernel",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "interpreter",
    "kernel",
    "kernels",
    "ops",
    "fa3",
    "autograd",
]

# The custom ops exist once kiln_attn.autograd is imported. With torch already imported it is
# imported now, so a torch.compile trace finds them registered; otherwise on first use.
_TORCH_NAMES = (
    "_flash_attn_forward",
    "_flash_attn_backward",
    "_flash_attn_varlen_forward",
    "_flash_attn_varlen_backward",
)
if "torch" in sys.modules:
    from . import autograd  # noqa: F401


def __getattr__(name):
    # The modules that import torch are loaded on first use, so `import kiln_attn` works
    # without it.
    import importlib

    if name in ("ops", "autograd", "fa3"):
        return importlib.import_module(f".{name}", __name__)
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module(".autograd", __name__), name)
    raise AttributeError(f"module 'kiln_attn' has no attribute {name!r}")
