"""kiln's kernels for PyTorch, on PyTorch's CUDA tensors in place and its current stream:
FlashAttention 2's `flash_attn_func`, `flash_attn_varlen_func` (differentiable, traceable by
`torch.compile`) and low-level `_flash_attn_*` ops, FlashAttention 3's interface in
`kiln_attn.fa3`, `flash_attn_with_kvcache` and `flash_attn_combine` for decoding,
`interpreter()` (the same calls on CPU tensors), `kernels()` and `kernel(name)` for any
registered kernel, and `kiln_attn.ops` (imported on first use: it needs torch; this module
does not). Each is described in `docs/python.md`.
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
    "ring",
    "ring_attention",
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

    if name in ("ops", "autograd", "fa3", "ring"):
        return importlib.import_module(f".{name}", __name__)
    if name == "ring_attention":
        return importlib.import_module(".ring", __name__).ring_attention
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module(".autograd", __name__), name)
    raise AttributeError(f"module 'kiln_attn' has no attribute {name!r}")
