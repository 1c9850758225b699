//! Kernels of the bulk-reduction tests (`bulk_add_ptx`, `gpu_bulk_add`): whole f32 tiles
//! added atomically by many blocks into overlapping rows, and their f64 reference.

#![allow(dead_code)]

use kiln::prelude::*;

/// Rows of a [`overlapping_adds`] tile.
pub const R: usize = 64;
/// Columns of a [`overlapping_adds`] tile.
pub const C: usize = 64;
/// Rows between the tiles of neighbouring blocks (less than [`R`]: they overlap).
pub const STEP: usize = 24;
/// Rows the first tile starts before row 0.
pub const SHIFT: usize = 10;
/// Elements of a [`overlapping_row_adds`] tile, and the distance between neighbours' tiles.
pub const N: usize = 128;
pub const NSTEP: usize = 40;

/// Block `(x, y, z)` adds the `[R, C]` tile of `x[z]` at rows `x STEP - SHIFT..`, columns
/// `y C..` into the same place of `acc` (elements outside the tensors are skipped): each row
/// receives its `x` value once from every block whose rows cover it.
///
/// Grid: `(cdiv(rows + SHIFT, STEP), cdiv(cols, C), repeats)`.
#[kernel(num_warps = 4)]
pub fn overlapping_adds(x: Tensor<f32, 3>, acc: TensorMut<f32, 2>) {
    let (rb, cb, z) = (block_id().x, block_id().y, block_id().z);
    let r0 = rb * STEP - SHIFT;
    let v = x.tile([1, R, C], [z, r0, cb * C]).load().reshape([R, C]);
    acc.tile([R, C], [r0, cb * C]).atomic_add(v * 0.5);
}

/// The 1-D form: block `(x, 0, z)` adds the `N` elements of `x[z]` from `x NSTEP - 4`.
///
/// Grid: `(cdiv(n + 4, NSTEP), 1, repeats)`.
#[kernel(num_warps = 4)]
pub fn overlapping_row_adds(x: Tensor<f32, 2>, acc: TensorMut<f32, 1>) {
    let (b, z) = (block_id().x, block_id().z);
    let c0 = b * NSTEP - 4;
    let v = x.tile([1, N], [z, c0]).load().reshape([N]);
    acc.tile([N], [c0]).atomic_add(v);
}

/// How many `len`-long windows starting at `b step - shift` (`b < blocks`) cover `i`.
pub fn covers(i: usize, len: usize, step: usize, shift: usize, blocks: usize) -> usize {
    (0..blocks)
        .filter(|&b| {
            let lo = (b * step) as i64 - shift as i64;
            (lo..lo + len as i64).contains(&(i as i64))
        })
        .count()
}

/// Rows, columns and K step of a [`split_k_matmul`] block's product.
pub const SM: usize = 64;
pub const SN: usize = 64;
pub const SK: usize = 32;

/// Split-K GEMM: block `(x, y, z)` multiplies rows `x SM..` of `a: [M, K]` by columns
/// `y SN..` of `b: [K, N]` (bf16) over its share of the K blocks (the grid's `z` blocks
/// take them in turn, a share each) and adds its f32 partial product, an mma accumulator,
/// into `c: [M, N]`.
///
/// Grid: `(cdiv(M, SM), cdiv(N, SN), splits)`.
#[kernel(num_warps = 4)]
pub fn split_k_matmul(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    let (mb, nb, z) = (block_id().x, block_id().y, block_id().z);
    let per = (a.dim(1) + (SK * grid_dim().z - 1)) / (SK * grid_dim().z);
    let mut acc = zeros::<f32>([SM, SN]);
    for kb in pipelined(0..per, stages = 3) {
        let k0 = (z * per + kb) * SK;
        let x = a.tile([SM, SK], [mb * SM, k0]).load();
        let y = b.tile([SK, SN], [k0, nb * SN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([SM, SN], [mb * SM, nb * SN]).atomic_add(acc);
}
