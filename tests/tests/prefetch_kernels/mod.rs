//! Pipelined loops without mma: one whose loads the `prefetch` pass reads ahead (a window of
//! columns that ends before its tensor does) and three whose loads cannot move. Shared by the
//! CPU test (`prefetch`: the plans, PTX, ptxas) and the GPU test (`gpu_prefetch`).

#![allow(dead_code)]

use kiln::prelude::*;

/// `y[r, j..j + BN] = 2 w x[r, j + shift..]` and `s[r]` the sum of what was read, for `j`
/// from `lo` to `hi` (a window of the columns, `BN` at a time): a loop that ends before its
/// tensor does and stores another tensor, reading columns whose alignment only the run knows.
/// `w: [BN]` is read again each iteration (the same tile: not read ahead).
#[kernel(grid = [BM, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn shifted_window(
    x: Tensor<f32, 2>,
    w: Tensor<f32, 1>,
    y: TensorMut<f32, 2>,
    s: TensorMut<f32, 1>,
    lo: i32,
    hi: i32,
    shift: i32,
    #[comptime(default = 2)] BM: usize,
    #[comptime(default = 32)] BN: usize,
    #[comptime(default = 2)] STAGES: usize,
) {
    let r0 = block_id().x * BM;
    let mut acc = zeros::<f32>([BM]);
    for j in pipelined((lo..hi).step_by(BN), stages = STAGES as u32) {
        let t = x.tile([BM, BN], [r0, j + shift]).load() * w.tile([BN], [0]).load().row();
        y.tile([BM, BN], [r0, j]).store(t * 2.0);
        acc = acc + row_sum(&t);
    }
    s.tile([BM], [r0]).store(acc);
}

/// A column offset carried around the loop: the next load's coordinates are known only
/// after this iteration, so nothing is prefetched.
#[kernel(grid = [4, 1, 1])]
pub fn carried_offsets(x: Tensor<f32, 2>, s: TensorMut<f32, 1>) {
    let r0 = block_id().x * 4;
    let mut acc = zeros::<f32>([4]);
    let mut at = block_id().x;
    for _ in pipelined((0..x.dim(1)).step_by(16), stages = 2) {
        let t = x.tile([4, 16], [r0, at]).load();
        acc = acc + row_sum(&t);
        at = at + 16;
    }
    s.tile([4], [r0]).store(acc);
}

/// Each tile doubled in place: a load moved before the previous iteration's store could read
/// what that store writes, so nothing is prefetched.
#[kernel(grid = [4, 1, 1])]
pub fn doubled_in_place(x: TensorMut<f32, 2>) {
    let r0 = block_id().x * 4;
    for j in pipelined((0..x.dim(1)).step_by(8), stages = 2) {
        let t = x.tile([4, 16], [r0, j]).load();
        x.tile([4, 16], [r0, j]).store(t * 2.0);
    }
}

/// A count taken with atomics inside the loop: the loads keep their order against them.
#[kernel(grid = [4, 1, 1])]
pub fn counted_positives(x: Tensor<f32, 2>, count: TensorMut<i32, 1>) {
    let r0 = block_id().x * 4;
    for j in pipelined((0..x.dim(1)).step_by(16), stages = 2) {
        let t = x.tile([4, 16], [r0, j]).load();
        count
            .elems([iota([4, 16], 0) * 0])
            .atomic_add_masked(1, t > 0.0);
    }
}
