"""FlashAttention 2's module names over kiln_attn, for code written against them (ring
attention, context parallelism: ring-flash-attention imports `_flash_attn_forward` and
`_flash_attn_backward` from `flash_attn.flash_attn_interface`). `install()` registers
`flash_attn` and `flash_attn.flash_attn_interface` in `sys.modules` (imports torch).
"""

import importlib.util
import sys
import types

__all__ = ["install"]

# The FlashAttention 2 release whose names and signatures kiln_attn follows.
FLASH_ATTN_VERSION = "2.6.3"


def install(force=False):
    """Makes `import flash_attn` and `from flash_attn.flash_attn_interface import ...` give
    kiln_attn's functions (the FA2 names: `flash_attn_func`, `flash_attn_varlen_func`,
    `flash_attn_with_kvcache` and the low-level `_flash_attn_forward`, `_flash_attn_backward`
    and their varlen forms). Refuses (RuntimeError) when a real `flash_attn` package is
    importable or imported, unless `force`; calling it again is a no-op."""
    current = sys.modules.get("flash_attn")
    if current is not None and getattr(current, "__kiln__", False):
        return current
    if not force and (current is not None or importlib.util.find_spec("flash_attn") is not None):
        raise RuntimeError(
            "flash_attn: a FlashAttention package is installed; kiln_attn.flash_attn_compat.install() "
            "would shadow it (pass force=True to do so)"
        )
    from . import autograd, interface, kvcache

    iface = types.ModuleType("flash_attn.flash_attn_interface")
    for name in ("_flash_attn_forward", "_flash_attn_backward", "_flash_attn_varlen_forward", "_flash_attn_varlen_backward"):
        setattr(iface, name, getattr(autograd, name))
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        setattr(iface, name, getattr(interface, name))
    iface.flash_attn_with_kvcache = kvcache.flash_attn_with_kvcache
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    pkg.__version__ = FLASH_ATTN_VERSION
    pkg.__kiln__ = True
    pkg.flash_attn_interface = iface
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        setattr(pkg, name, getattr(iface, name))
    sys.modules["flash_attn"] = pkg
    sys.modules["flash_attn.flash_attn_interface"] = iface
    return pkg
