"""Type stubs of the kiln_attn._native extension module (the docstrings are the module's own)."""

import torch

__version__: str

def _fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    *,
    out: torch.Tensor | None = None,
    fa3_window: bool = False,
    attention_chunk: int = 0,
    interpret: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def _varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    *,
    out: torch.Tensor | None = None,
    fa3_window: bool = False,
    attention_chunk: int = 0,
    interpret: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def _bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    *,
    fa3_window: bool = False,
    attention_chunk: int = 0,
    interpret: bool = False,
) -> torch.Tensor: ...
def _varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    *,
    fa3_window: bool = False,
    attention_chunk: int = 0,
    interpret: bool = False,
) -> torch.Tensor: ...
def _context_handle(device: int) -> int: ...
def _target(device: int) -> str: ...
def _empty_launch(device: int) -> None: ...
def _num_splits(batch: int, heads_k: int, row_blocks: int, keys: int, block_n: int, sms: int) -> int: ...
def _value_split(d: int, dv: int) -> int: ...
def kernels() -> list[str]: ...
def kernel(name: str) -> Kernel: ...

class Kernel:
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def params(self) -> list[dict[str, object]]: ...
    @property
    def comptime(self) -> list[dict[str, object]]: ...
    def comptime_values(self, *args: object, **comptime: object) -> dict[str, object]: ...
    def grid(self, extents: int | tuple[int, ...], **comptime: object) -> tuple[int, int, int]: ...
    def launch(self, grid: int | tuple[int, ...], *args: object, **comptime: object) -> None: ...
    def interpret(self, grid: int | tuple[int, ...], *args: object, **comptime: object) -> None: ...
