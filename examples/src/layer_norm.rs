//! Layer norm forward over the rows of an `[M, N]` tensor, any `N`: bf16, f16 or f32 data,
//! f32 statistics, and the per-row mean and `1/std` kept for the backward pass.

use kiln::prelude::*;

use crate::softmax::{from_f32, to_f32};

/// `y[r, :] = (x[r, :] - mean_r) * rstd_r * w + b` with `rstd_r = 1/sqrt(var_r + eps)` (the
/// biased variance), for `x, y: [M, N]` and `w, b: [N]` of element type `dtype`, any `M` and
/// `N`; `mean[r]` and `rstd[r]` (f32, `[M]`) receive the statistics.
///
/// Each block owns `BM` rows over `NW` warps. A row that fits one `BN`-wide tile (`N <= BN`)
/// is read once and kept in registers: its mean and variance by the corrected two-pass
/// algorithm, then the output. A longer row takes two runtime loops over `BN`-wide tiles: the first
/// merges each tile's mean and sum of squared deviations into the running ones (Chan et al.'s
/// update), the second normalises. Columns past `N` are left out of every statistic.
///
/// Grid: `(cdiv(M, BM), 1, 1)`. Comptime: `BM` (rows per block, default 4), `BN` (columns
/// per tile, default 1024), `NW` (warps per block, default 4); `BM` a power of two, `BN` a
/// multiple of 16; `dtype` (default f32). [`crate::rows::row_config`] picks them for a row
/// length.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn layer_norm(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 1>,
    b: Tensor<dtype, 1>,
    y: TensorMut<dtype, 2>,
    mean: TensorMut<f32, 1>,
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
        // Columns past `N` load as 0: they add nothing to the first sum.
        let t = to_f32(x.tile([BM, BN], [row0, 0]).load(), dtype);
        let nf = n.cast::<f32>();
        // The corrected two-pass mean and variance (Chan, Golub and LeVeque): deviations
        // from a first estimate of the mean, whose own sum corrects it. A constant row's mean
        // comes out exact (its deviations are then exactly 0), and the variance does not
        // cancel between a large mean and a small spread, as a sum of squares would. The
        // output takes `x - mean` as `dev0 - corr`, so only `dev0` stays in registers.
        let mu0 = row_sum(&t) / nf;
        let dev0 = select(iota([BM, BN], 1) < n, t - mu0.col(), 0.0);
        let corr = row_sum(&dev0) / nf;
        let mu = mu0 + corr;
        let var = max(&(row_sum(&(dev0 * dev0)) / nf - corr * corr), 0.0);
        let r = rsqrt(&(var + eps));
        mean.tile([BM], [row0]).store(mu);
        rstd.tile([BM], [row0]).store(r);
        let wt = to_f32(w.tile([BN], [0]).load(), dtype);
        let bt = to_f32(b.tile([BN], [0]).load(), dtype);
        y.tile([BM, BN], [row0, 0]).store(from_f32(
            (dev0 - corr.col()) * r.col() * wt.row() + bt.row(),
            dtype,
        ));
    } else {
        let mut mu = zeros::<f32>([BM]);
        let mut m2 = zeros::<f32>([BM]);
        for j in (0..n).step_by(BN) {
            let t = to_f32(x.tile([BM, BN], [row0, j]).load(), dtype);
            // Every earlier tile was full, so `j` elements are merged already.
            let seen = j.cast::<f32>();
            let count = min(n - j, BN as i32).cast::<f32>();
            let inside = iota([BM, BN], 1) + j < n;
            // The tile's mean as its maximum plus the mean offset from it: exact for a
            // constant row, whose deviations are then exactly 0.
            let shift = row_max(&select(inside, t, f32::NEG_INFINITY));
            let t_mean = shift + row_sum(&select(inside, t - shift.col(), 0.0)) / count;
            let dev = select(inside, t - t_mean.col(), 0.0);
            let t_m2 = row_sum(&(dev * dev));
            let total = seen + count;
            let delta = t_mean - mu;
            mu = mu + delta * (count / total);
            m2 = m2 + t_m2 + delta * delta * (seen * count / total);
        }
        let r = rsqrt(&(m2 / n.cast::<f32>() + eps));
        mean.tile([BM], [row0]).store(mu);
        rstd.tile([BM], [row0]).store(r);
        // The second pass walks the row backwards: the tiles the first pass read last are the
        // likeliest to be still in L2.
        let last = (n - 1) / BN as i32 * BN as i32;
        for back in (0..n).step_by(BN) {
            let j = last - back;
            let t = to_f32(x.tile([BM, BN], [row0, j]).load(), dtype);
            let wt = to_f32(w.tile([BN], [j]).load(), dtype);
            let bt = to_f32(b.tile([BN], [j]).load(), dtype);
            let out = (t - mu.col()) * r.col() * wt.row() + bt.row();
            y.tile([BM, BN], [row0, j]).store(from_f32(out, dtype));
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;
    use kiln::prelude::DType;

    use super::{LayerNormComptime, layer_norm};
    use kiln::ir::OpKind;

    use crate::testing::{build, loop_count, top_level};

    #[test]
    fn builds_for_defaults_and_variants() {
        for (bm, bn, dtype) in [(4, 1024, DType::F32), (8, 256, DType::Bf16)] {
            let k = build(
                &layer_norm,
                LayerNormComptime {
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
            assert_eq!(loop_count(&k), 2, "statistics, then the output");
            assert!(print_kernel(&k).contains(&format!("rt<f32,{bm}x{bn}>")));
        }
    }
}
