"""Objects that look like torch tensors to kiln_attn, for testing its argument checks on a
machine without torch or a GPU (CI installs neither: the CUDA build of torch is gigabytes).

kiln_attn reads a tensor through `shape`, `stride()`, `dtype`, `get_device()`, `device` and
`data_ptr()`, and without torch allocates the output with `q.new_empty(shape)`; a `FakeTensor`
has exactly those. It has no `tolist()`: varlen offsets stay on the device (the kernel reads
them), so a call that read them to the host would fail here.
"""


class FakeDType:
    """A dtype that prints as PyTorch's does (`torch.bfloat16`)."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


BF16 = FakeDType("torch.bfloat16")
F16 = FakeDType("torch.float16")
F32 = FakeDType("torch.float32")
I32 = FakeDType("torch.int32")


def contiguous_strides(shape):
    strides, n = [], 1
    for extent in reversed(shape):
        strides.append(n)
        n *= max(extent, 1)
    return tuple(reversed(strides))


class FakeTensor:
    """A tensor's metadata with no storage: `device` is "cpu" or "cuda:N"."""

    def __init__(self, shape, dtype=BF16, device="cuda:0", strides=None, ptr=0x7F00_0000_0000):
        self.shape = tuple(shape)
        self._strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        self.dtype = dtype
        self.device = device
        self.is_cuda = device.startswith("cuda")
        self._ptr = ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return int(self.device.split(":")[1]) if self.is_cuda else -1

    def data_ptr(self):
        return self._ptr

    def new_empty(self, shape):
        return FakeTensor(shape, self.dtype, self.device)

    def transpose(self, a, b):
        shape, strides = list(self.shape), list(self._strides)
        shape[a], shape[b] = shape[b], shape[a]
        strides[a], strides[b] = strides[b], strides[a]
        return FakeTensor(shape, self.dtype, self.device, strides, self._ptr)


def bshd(b, s, h, d, **kw):
    """A contiguous (batch, seqlen, nheads, headdim) fake."""
    return FakeTensor((b, s, h, d), **kw)


def offsets(values, **kw):
    """A 1-D int32 offsets fake (`cu_seqlens`) of `values`' length (the values themselves are
    the device's: kiln_attn never reads them)."""
    kw.setdefault("dtype", I32)
    return FakeTensor((len(values),), **kw)
