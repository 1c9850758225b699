//! Kernels whose `mma`s sit where the flagship GEMM and attention never put theirs, shared by
//! the CPU tests (`mma_general.rs`: interpreter vs f64, PTX through ptxas) and the GPU tests
//! (`gpu_mma_general.rs`): an mma outside any loop, two mma loops with transposed register
//! operands (attention's backward shape), a register B computed in the kernel, a masked
//! operand, operands loaded masked at a bound along K, a B masked in two dimensions and a
//! gathered B, a persistent loop with a runtime stride, an mma in a runtime `if`, an
//! accumulator of fewer rows than 16 a warp whose rows are summed; and the f64 references
//! they are checked against.

#![allow(dead_code)]

use kiln::prelude::*;
use kiln_ir::HostTensor;

/// `c = a @ b` for `k <= BK`: one tile of K, one mma, no loop.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_once(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let x = a.tile([BM, BK], [mb * BM, 0]).load();
    let y = b.tile([BK, BN], [0, nb * BN]).load();
    c.tile([BM, BN], [mb * BM, nb * BN]).store(mma(&x, &y));
}

/// `c = a @ exp(-|b|)`: B computed in registers before each mma.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_register_b(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 2) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
        acc = mma_acc(&x, &exp(&(abs(&y) * -1.0)), &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `c = tril(a) @ b`: A masked by `select` (row >= column) before the mma; `NW` warps (a
/// comptime value the autotuner may vary; each warp needs 16 of the `BM` rows).
#[kernel(num_warps = NW, grid = [BM, BN, 1])]
pub fn mma_masked(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
    #[comptime(default = 4, tune = [2, 4])] NW: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 3) {
        let rows = iota([BM, BK], 0) + mb * BM;
        let cols = iota([BM, BK], 1) + kb * BK;
        let x = select(
            rows >= cols,
            a.tile([BM, BK], [mb * BM, kb * BK]).load(),
            0.0,
        );
        let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `c = a[:, :klim] @ b[:klim, :]`: both operands masked loads bounded at `klim` along K (A's
/// columns, B's rows), which the lowering copies into shared memory clipped at the bound,
/// never reading `a[:, klim..]` or `b[klim.., :]`.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_bounded(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    klim: i32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 3) {
        let x = a
            .tile([BM, BK], [mb * BM, kb * BK])
            .load_masked(iota([BM, BK], 1) + kb * BK < klim, 0.0);
        let y = b
            .tile([BK, BN], [kb * BK, nb * BN])
            .load_masked(iota([BK, BN], 0) + kb * BK < klim, 0.0);
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `c = a @ (b masked)`: B's elements kept where its row is below `klim` and its column
/// below `nlim`, a mask no copy can bound (two dimensions): B is read into registers and
/// staged from there.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_masked_b(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    klim: i32,
    nlim: i32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 2) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let inside = kiln_ir::dsl::Logic::and(
            iota([BK, BN], 0) + kb * BK < klim,
            iota([BK, BN], 1) + nb * BN < nlim,
        );
        let y = b
            .tile([BK, BN], [kb * BK, nb * BN])
            .load_masked(inside, 0.0);
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `c[i, j] = sum_p a[i, p] b[(7 p) % k, j]`: B's rows gathered through an index tile.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_gathered_b(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 2) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let rows = (iota([BK], 0) + kb * BK) * 7 % k;
        let y = b.rows(&rows, BN, [0, nb * BN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `c = a @ b`, each block walking output tiles `block_id().x, + grid_dim().x, ..` (a
/// persistent loop with a runtime stride), each tile a pipelined K loop.
#[kernel(num_warps = 4)]
pub fn mma_persistent(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let k = a.dim(1);
    let tn = cdiv(b.dim(1), BN);
    let tiles = cdiv(a.dim(0), BM) * tn;
    for t in (block_id().x..tiles).step_by(grid_dim().x) {
        let (mb, nb) = (t / tn, t % tn);
        let mut acc = zeros::<f32>([BM, BN]);
        for kb in pipelined(0..cdiv(k, BK), stages = 3) {
            let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
            let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
            acc = mma_acc(&x, &y, &acc);
        }
        c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
    }
}

/// `c = a @ b` when `flag > 0`, else `-(a @ b)`: the mma in a runtime `if`.
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
pub fn mma_in_if(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    flag: i32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in 0..cdiv(k, BK) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
        acc = if flag > 0 {
            mma_acc(&x, &y, &acc)
        } else {
            acc - mma(&x, &y)
        };
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// Attention's backward shape for one block of `BN` keys: `S = scale * Q K^T` per block of
/// `BM` queries; `dv = P^T Q` with `P = exp(min(S, 0))` in one loop, `dk = S^T Q` in a
/// second: two mma loops, each with a transposed register A (`p.t()`, `s.t()`) and `Q` read
/// as A and as B.
#[kernel(num_warps = 4, grid = [BN, 1, 1])]
pub fn mma_two_loops(
    q: Tensor<bf16, 2>,
    k: Tensor<bf16, 2>,
    dv: TensorMut<f32, 2>,
    dk: TensorMut<f32, 2>,
    scale: f32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] D: usize,
) {
    let nb = block_id().x;
    let sq = q.dim(0);
    let kt = k.tile([BN, D], [nb * BN, 0]).load();
    let mut acc_v = zeros::<f32>([BN, D]);
    for mb in pipelined(0..cdiv(sq, BM), stages = 2) {
        let qt = q.tile([BM, D], [mb * BM, 0]).load();
        let s = mma(&qt, &kt.t()) * scale;
        let p = exp(&min(&s, 0.0)).cast::<bf16>();
        acc_v = mma_acc(&p.t(), &qt, &acc_v);
    }
    let mut acc_k = zeros::<f32>([BN, D]);
    for mb in pipelined(0..cdiv(sq, BM), stages = 2) {
        let qt = q.tile([BM, D], [mb * BM, 0]).load();
        let s = mma(&qt, &kt.t()) * scale;
        acc_k = mma_acc(&s.cast::<bf16>().t(), &qt, &acc_k);
    }
    dv.tile([BN, D], [nb * BN, 0]).store(acc_v);
    dk.tile([BN, D], [nb * BN, 0]).store(acc_k);
}

/// `x` as f64, row-major.
fn f64s(x: &HostTensor) -> Vec<f64> {
    x.to_f64_vec()
}

/// `[m, n] = a[m, k] @ b[k, n]` in f64 of `a` and `f(b)`.
fn gemm_with(a: &HostTensor, b: &HostTensor, f: impl Fn(usize, usize, f64) -> f64) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (f64s(a), f64s(b));
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = av[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * f(p, j, bv[p * n + j]);
            }
        }
    }
    c
}

/// `c = a @ b` less each row's mean over its block of `BN` columns (the columns past `n`
/// count as 0): a row reduction of an accumulator with fewer rows than 16 a warp (`BM = 64`
/// over `NW = 8` warps: two warps a row, so the sums cross warps).
#[kernel(num_warps = NW, grid = [BM, BN, 1])]
pub fn mma_row_centered(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 128)] BN: usize,
    #[comptime(default = 32)] BK: usize,
    #[comptime(default = 8)] NW: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 2) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    let mean = row_sum(&acc) / BN as f32;
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc - mean.col());
}

/// [`mma_row_centered`]'s reference: `a @ b`, each row less its mean over each block of `bn`
/// columns (the columns past `b`'s count as 0).
pub fn gemm_row_centered(a: &HostTensor, b: &HostTensor, bn: usize) -> Vec<f64> {
    let g = gemm(a, b);
    let n = b.shape[1];
    let mut out = g.clone();
    for (row, o) in g.chunks(n.max(1)).zip(out.chunks_mut(n.max(1))) {
        for (block, ob) in row.chunks(bn).zip(o.chunks_mut(bn)) {
            let mean = block.iter().sum::<f64>() / bn as f64;
            ob.iter_mut().for_each(|x| *x -= mean);
        }
    }
    out
}

/// `a @ b`.
pub fn gemm(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    gemm_with(a, b, |_, _, y| y)
}

/// `a @ exp(-|b|)`, `exp(-|b|)` rounded to bf16 as the kernel's B (a bf16 tile) holds it.
pub fn gemm_exp_b(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    gemm_with(a, b, |_, _, y| {
        f64::from(kiln::ir::rounding::to_bf16((-y.abs()).exp()).to_f32())
    })
}

/// `a[:, :klim] @ b[:klim, :]` with `b`'s columns from `nlim` on zero.
pub fn gemm_bounded(a: &HostTensor, b: &HostTensor, klim: usize, nlim: usize) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (f64s(a), f64s(b));
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k.min(klim) {
            for j in 0..n.min(nlim) {
                c[i * n + j] += av[i * k + p] * bv[p * n + j];
            }
        }
    }
    c
}

/// `c[i, j] = sum_p a[i, p] b[(7 p) % k, j]`.
pub fn gemm_gathered_b(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (f64s(a), f64s(b));
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let r = (7 * p) % k;
            for j in 0..n {
                c[i * n + j] += av[i * k + p] * bv[r * n + j];
            }
        }
    }
    c
}

/// `tril(a) @ b` (`a[i, p]` kept where `i >= p`).
pub fn gemm_tril_a(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    let k = a.shape[1];
    let av = f64s(a);
    let masked = HostTensor::from_fn(&a.shape, a.dtype(), |idx| {
        let (i, p) = (idx / k, idx % k);
        if i >= p { av[idx] } else { 0.0 }
    });
    gemm(&masked, b)
}

/// `(dv, dk)` of [`mma_two_loops`]: `S = scale Q K^T`, `dv = exp(min(S, 0))^T Q`, `dk = S^T Q`.
pub fn two_loops(q: &HostTensor, k: &HostTensor, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let (sq, d, sk) = (q.shape[0], q.shape[1], k.shape[0]);
    let (qv, kv) = (f64s(q), f64s(k));
    let (mut dv, mut dk) = (vec![0.0; sk * d], vec![0.0; sk * d]);
    for i in 0..sq {
        for j in 0..sk {
            let s = scale * (0..d).map(|c| qv[i * d + c] * kv[j * d + c]).sum::<f64>();
            let p = s.min(0.0).exp();
            for c in 0..d {
                dv[j * d + c] += p * qv[i * d + c];
                dk[j * d + c] += s * qv[i * d + c];
            }
        }
    }
    (dv, dk)
}
