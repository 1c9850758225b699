//! RMS norm forward over the rows of an `[M, N]` tensor, any `N`: bf16, f16 or f32 data, f32
//! statistics, and the per-row `1/rms` kept for the backward pass.

use kiln::prelude::*;

use crate::softmax::{from_f32, to_f32};

/// `y[r, :] = x[r, :] * rstd_r * w` with `rstd_r = 1/sqrt(mean(x[r, :]^2) + eps)`, for
/// `x, y: [M, N]` and `w: [N]` of element type `dtype`, any `M` and `N`; `rstd[r]` (f32,
/// `[M]`) receives the statistic.
///
/// Each block owns `BM` rows over `NW` warps. A row that fits one `BN`-wide tile (`N <= BN`)
/// is read once and kept in registers; a longer row takes two runtime loops over `BN`-wide
/// tiles, the first summing the squares (columns past `N` load as 0 and add nothing), the
/// second scaling.
///
/// Grid: `(cdiv(M, BM), 1, 1)`. Comptime: `BM` (rows per block, default 4), `BN` (columns
/// per tile, default 1024), `NW` (warps per block, default 4); `BM` a power of two, `BN` a
/// multiple of 16; `dtype` (default f32). [`crate::rows::row_config`] picks them for a row
/// length.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn rms_norm(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 1>,
    y: TensorMut<dtype, 2>,
    rstd: TensorMut<f32, 1>,
    eps: f32,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let row0 = block_id().x * BM;
    let n = x.dim(1);
    if n <= BN as i32 {
        let t = to_f32(x.tile([BM, BN], [row0, 0]).load(), dtype);
        let r = rsqrt(&(row_sum(&(t * t)) / n.cast::<f32>() + eps));
        rstd.tile([BM], [row0]).store(r);
        let wt = to_f32(w.tile([BN], [0]).load(), dtype);
        y.tile([BM, BN], [row0, 0])
            .store(from_f32(t * r.col() * wt.row(), dtype));
    } else {
        let mut ss = zeros::<f32>([BM]);
        for j in (0..n).step_by(BN) {
            let t = to_f32(x.tile([BM, BN], [row0, j]).load(), dtype);
            ss = ss + row_sum(&(t * t));
        }
        let r = rsqrt(&(ss / n.cast::<f32>() + eps));
        rstd.tile([BM], [row0]).store(r);
        // The second pass walks the row backwards: the tiles the first pass read last are the
        // likeliest to be still in L2.
        let last = (n - 1) / BN as i32 * BN as i32;
        for back in (0..n).step_by(BN) {
            let j = last - back;
            let t = to_f32(x.tile([BM, BN], [row0, j]).load(), dtype);
            let wt = to_f32(w.tile([BN], [j]).load(), dtype);
            y.tile([BM, BN], [row0, j])
                .store(from_f32(t * r.col() * wt.row(), dtype));
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;
    use kiln::prelude::DType;

    use super::{RmsNormComptime, rms_norm};
    use kiln::ir::OpKind;

    use crate::testing::{build, loop_count, top_level};

    #[test]
    fn builds_for_defaults_and_variants() {
        for (bm, bn, dtype) in [(4, 1024, DType::F32), (8, 256, DType::Bf16)] {
            let k = build(
                &rms_norm,
                RmsNormComptime {
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
            assert_eq!(loop_count(&k), 2, "sum of squares, then the output");
            assert!(print_kernel(&k).contains(&format!("rt<f32,{bm}x{bn}>")));
        }
    }
}
