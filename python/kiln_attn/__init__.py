"""kiln's kernels for PyTorch, on PyTorch's CUDA tensors in place and its current stream.

- `flash_attn_func`, `flash_attn_varlen_func`: FlashAttention's interface over kiln's DSL
  attention.
- `kernels()`, `kernel(name)`: any registered `#[kernel]` of kiln's library, inspected and
  launched by name (`kernel("layer_norm").launch(grid, x, w, b, y, mean, rstd, 1e-5)`).
- `kiln_attn.ops`: the library kernels as PyTorch-style functions (`ops.softmax(x, dim=-1)`,
  `ops.layer_norm`, `ops.rms_norm`, `ops.cross_entropy`, their backward passes, `ops.rotary`,
  `ops.dropout`), imported on first use since it needs torch (this module does not).
"""

from ._native import (  # noqa: F401
    Kernel,
    __version__,
    _context_handle,
    _empty_launch,
    _target,
    flash_attn_func,
    flash_attn_varlen_func,
    kernel,
    kernels,
)

__all__ = ["Kernel", "flash_attn_func", "flash_attn_varlen_func", "kernel", "kernels", "ops"]


def __getattr__(name):
    # `kiln_attn.ops` imports torch: loaded on first use, so `import kiln_attn` works without it.
    if name == "ops":
        import importlib

        return importlib.import_module(".ops", __name__)
    raise AttributeError(f"module 'kiln_attn' has no attribute {name!r}")
