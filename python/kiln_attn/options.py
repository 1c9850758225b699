"""What every entry point of the package shares: the interpreter switch (`interpreter()`), the
FlashAttention arguments kiln refuses by name (`check_unsupported`) and `window_size` as a pair
(`window_pair`), and how autograd Functions return statistics (`statistics_outputs`). Imports
neither torch nor another module of the package.
"""

import contextlib
import operator


_INTERPRET = [False]


@contextlib.contextmanager
def interpreter():
    """Inside this context, attention (forward and backward, and the custom ops) runs on
    kiln's CPU interpreter over PyTorch CPU tensors instead of launching on the GPU: the same
    kernels, argument checks and comptime values. Slow (an interpreter): for tests on small
    shapes without a GPU."""
    before = _INTERPRET[0]
    _INTERPRET[0] = True
    try:
        yield
    finally:
        _INTERPRET[0] = before


def interpreting():
    """Whether calls run on the interpreter (inside `interpreter()`)."""
    return _INTERPRET[0]


def check_unsupported(dropout_p, alibi_slopes):
    """FlashAttention's arguments kiln does not compute: a `ValueError` naming each, never
    silently ignored (a dropout probability passed where kiln once took `softmax_scale` fails
    here too)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(
            f"dropout_p: kiln_attn does not implement attention dropout (got {dropout_p}); pass "
            "dropout_p=0.0 (FlashAttention's value for evaluation), or softmax_scale by keyword"
        )
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: kiln_attn does not implement ALiBi; pass alibi_slopes=None")


def window_pair(window_size):
    """`window_size` as two ints: any pair (tuple, list, a 2-element tensor)."""
    # The common spelling, a tuple of two ints, costs no more than this test.
    if window_size.__class__ is tuple and len(window_size) == 2:
        left, right = window_size
        if left.__class__ is int and right.__class__ is int:
            return window_size
    try:
        n = len(window_size)
    except TypeError:
        raise TypeError(
            f"window_size: expected a pair (left, right), got {type(window_size).__name__}"
        ) from None
    if n != 2:
        raise ValueError(f"window_size: expected a pair (left, right), got {n} values")
    out = []
    for x in window_size:
        # operator.index takes ints and integer tensor elements, never a float or a bool's
        # accident.
        if isinstance(x, bool):
            raise TypeError("window_size: expected ints, got a bool")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise TypeError(f"window_size: expected ints, got {type(x).__name__}") from None
    return out[0], out[1]


def statistics_outputs(ctx, main, stats, wanted):
    """What an autograd Function's forward returns: `main`, then, when `wanted`, the statistics
    `stats` (lse, mean, rstd), marked not differentiable with their gradients left
    unmaterialised (None in the backward, not a zero tensor it would first fill). Statistics
    nobody asked for are not outputs at all: autograd wraps and tracks every output, which
    cost cross-entropy's forward + backward about as much host time as its backward's kernel
    launch."""
    if not wanted:
        return main
    ctx.mark_non_differentiable(*stats)
    ctx.set_materialize_grads(False)
    return (main, *stats)
