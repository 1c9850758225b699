//! Histograms of integer data, counted with atomic adds through an index tile.

use kiln::prelude::*;

/// `hist[b] += 1` for every element `b` of `x: [n]` with `0 <= b < bins`, where `bins` is
/// `hist`'s length; values outside `[0, bins)` are not counted. `hist` accumulates: zero it
/// first for a fresh histogram, or pass an earlier one to add more data to it.
///
/// Each block reads `BLOCK` elements and applies them with one masked atomic add addressed
/// element by element by the values themselves (`hist.elems([bins]).atomic_add_masked(..)`):
/// the atomic skips indices outside `hist`, and the mask skips the elements past `n`.
/// Duplicates within a block and across blocks all land (the adds are atomic), so any data
/// and any grid order give the exact counts.
///
/// Grid: `(cdiv(n, BLOCK), 1, 1)`. Comptime: `BLOCK` (elements per block, a power of two,
/// default 256).
#[kernel(grid = [BLOCK, 1, 1])]
pub fn histogram(
    x: Tensor<i32, 1>,
    hist: TensorMut<i32, 1>,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let i = block_id().x;
    let bins = x.tile([BLOCK], [i * BLOCK]).load();
    let inside = iota([BLOCK], 0) + i * BLOCK < x.dim(0);
    hist.elems([bins]).atomic_add_masked(1, inside);
}
