//! Row-wise softmax of an `[M, N]` f32, bf16 or f16 tensor, any `N`, with an online max/sum
//! pass in f32.

use kiln::prelude::*;

/// `log2(e)`: softmax is computed with `exp2`, so exponents are scaled by it.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `y[r, :] = softmax(x[r, :])` for `x, y: [M, N]` of element type `dtype` (f32, bf16 or f16;
/// arithmetic in f32), any `M` and `N`.
///
/// Each block owns `BM` rows over `NW` warps. A row that fits one `BN`-wide tile (`N <= BN`)
/// is read once and kept in registers: its maximum, then the sum of `exp(x - max)`, then the
/// scaled output. A longer row takes two runtime loops over `BN`-wide column tiles: the first
/// keeps the running maximum `m` and the running sum `l` of `exp(x - m)` (rescaled when `m`
/// grows), the second writes `exp2((x - m) * log2e) * (1 / l)`. Columns past `N` are masked
/// to `-inf` so they add nothing.
///
/// Grid: `(cdiv(M, BM), 1, 1)`. Comptime: `BM` (rows per block, default 4), `BN` (columns
/// per tile, default 512), `NW` (warps per block, default 4); `BM` a power of two, `BN` a
/// multiple of 16; `dtype` (default f32). [`crate::rows::row_config`] picks them for a row
/// length.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn softmax(
    x: Tensor<dtype, 2>,
    y: TensorMut<dtype, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 512)] BN: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let row0 = block_id().x * BM;
    let n = x.dim(1);
    if n <= BN as i32 {
        let t = select(
            iota([BM, BN], 1) < n,
            to_f32(x.tile([BM, BN], [row0, 0]).load(), dtype),
            f32::NEG_INFINITY,
        );
        let m = row_max(&t);
        let p = exp2(&((t - m.col()) * LOG2E));
        let inv = recip(&row_sum(&p));
        y.tile([BM, BN], [row0, 0])
            .store(from_f32(p * inv.col(), dtype));
    } else {
        let mut m = full::<f32>([BM], f32::NEG_INFINITY);
        let mut l = zeros::<f32>([BM]);
        for j in (0..n).step_by(BN) {
            let cols = iota([BM, BN], 1) + j;
            let t = select(
                cols < n,
                to_f32(x.tile([BM, BN], [row0, j]).load(), dtype),
                f32::NEG_INFINITY,
            );
            let m_new = max(&m, &row_max(&t));
            let p = exp2(&((t - m_new.col()) * LOG2E));
            l = l * exp2(&((m - m_new) * LOG2E)) + row_sum(&p);
            m = m_new;
        }
        // One reciprocal per row, not a division per element.
        let inv = recip(&l);
        // The second pass walks the row backwards: the tiles the first pass read last are the
        // likeliest to be still in L2.
        let last = (n - 1) / BN as i32 * BN as i32;
        for back in (0..n).step_by(BN) {
            let j = last - back;
            let t = to_f32(x.tile([BM, BN], [row0, j]).load(), dtype);
            y.tile([BM, BN], [row0, j])
                .store(from_f32(exp2(&((t - m.col()) * LOG2E)) * inv.col(), dtype));
        }
    }
}

/// `x` (of element type `dtype`) in f32: a cast unless it is f32 already. A plain function
/// (a kernel's `==` compares IR values), so the cast keeps the caller's line.
#[track_caller]
pub(crate) fn to_f32(x: Value, dtype: DType) -> Value {
    if matches!(dtype, DType::F32) {
        x
    } else {
        x.cast::<f32>()
    }
}

/// f32 `x` rounded to `dtype`: a cast unless `dtype` is f32.
#[track_caller]
pub(crate) fn from_f32(x: Value, dtype: DType) -> Value {
    if matches!(dtype, DType::F32) {
        x
    } else {
        x.cast_to(dtype)
    }
}

/// Softmax's backward: `dx[r, :] = y[r, :] * (dy[r, :] - sum_c(dy[r, c] * y[r, c]))` for
/// `y` (the forward's output), `dy`, `dx: [M, N]` of element type `dtype`, any `M` and `N`.
///
/// A row that fits one `BN`-wide tile (`N <= BN`) is read once: both inputs are loaded
/// before the row sum and kept in registers for `dx` (three tensors' bytes, where two passes
/// over the row move five). A longer row takes two runtime loops over `BN`-wide tiles.
/// Grid: `(cdiv(M, BM), 1, 1)`. Comptime: `BM` rows per block, `BN` columns per tile, `NW`
/// warps per block (default 4); [`crate::rows::row_config`] suits it as it does the forward.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn softmax_backward(
    y: Tensor<dtype, 2>,
    dy: Tensor<dtype, 2>,
    dx: TensorMut<dtype, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let row0 = block_id().x * BM;
    let n = y.dim(1);
    if n <= BN as i32 {
        // Columns past `N` load as zeros and add nothing.
        let yt = to_f32(y.tile([BM, BN], [row0, 0]).load(), dtype);
        let dt = to_f32(dy.tile([BM, BN], [row0, 0]).load(), dtype);
        let s = row_sum(&(yt * dt));
        dx.tile([BM, BN], [row0, 0])
            .store(from_f32(yt * (dt - s.col()), dtype));
    } else {
        let mut s = zeros::<f32>([BM]);
        for j in (0..n).step_by(BN) {
            let yt = to_f32(y.tile([BM, BN], [row0, j]).load(), dtype);
            let dt = to_f32(dy.tile([BM, BN], [row0, j]).load(), dtype);
            s = s + row_sum(&(yt * dt));
        }
        // Backwards: the tiles the first loop read last are the likeliest to be in L2.
        let last = (n - 1) / BN as i32 * BN as i32;
        for back in (0..n).step_by(BN) {
            let j = last - back;
            let yt = to_f32(y.tile([BM, BN], [row0, j]).load(), dtype);
            let dt = to_f32(dy.tile([BM, BN], [row0, j]).load(), dtype);
            dx.tile([BM, BN], [row0, j])
                .store(from_f32(yt * (dt - s.col()), dtype));
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;

    use kiln::prelude::DType;

    use super::{SoftmaxComptime, softmax};
    use kiln::ir::OpKind;

    use crate::testing::{build, loop_count, top_level};

    #[test]
    fn builds_for_defaults_and_variants() {
        for (bm, bn, dtype) in [
            (4, 512, DType::F32),
            (1, 1024, DType::F32),
            (8, 128, DType::Bf16),
        ] {
            let k = build(
                &softmax,
                SoftmaxComptime {
                    BM: bm,
                    BN: bn,
                    dtype,
                    ..Default::default()
                },
            );
            // A row that fits one tile is read once (the `if`); a longer one in two loops.
            assert_eq!(
                top_level(&k)
                    .iter()
                    .filter(|o| matches!(o, OpKind::If))
                    .count(),
                1
            );
            assert_eq!(loop_count(&k), 2, "two passes over the row");
            let text = print_kernel(&k);
            assert!(text.contains(&format!("rt<f32,{bm}x{bn}>")));
            assert_eq!(text.contains("cast"), dtype != DType::F32);
        }
    }
}
