//! Kernels exercising the integer, bit, transcendental and random-number ops, shared by
//! `interp_ops` (interpreter against references), `ops_ptx` (ptxas) and `gpu_ops` (GPU
//! against the interpreter). Every kernel takes any length: loads read 0 past the end and
//! stores skip it.
#![allow(dead_code)]

use kiln::ir::{DType, HostTensor};
use kiln::prelude::*;
use kiln_tests::inputs::{Dist, Rng, tensor};

/// Rows of [`u32_ops`]'s and [`i32_ops`]'s output.
pub const INT_ROWS: usize = 15;
/// Rows of [`transcendentals`]' output: sin, cos, tanh, erf, sigmoid, log2, log of `|x|`.
pub const MATH_ROWS: usize = 7;

/// The four Philox4x32-10 words of counter `(offs[i], 0, 0, 0)` under the key `(lo, hi)`,
/// into rows 0..4 of `w`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn philox_words(
    offs: Tensor<i32, 1>,
    w: TensorMut<u32, 2>,
    lo: u32,
    hi: i32,
    #[comptime(default = 512)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let o = offs.tile([BLOCK], [start]).load();
    let r = randint4x((lo, hi), o);
    for k in unroll(0..4) {
        w.tile([BLOCK], [k, start]).store(r[k]);
    }
}

/// The four uniforms of `rand4x` of u32 offsets under the key `(lo, hi)`, into rows 0..4 of
/// `u`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn rand4x_draws(
    offs: Tensor<u32, 1>,
    u: TensorMut<f32, 2>,
    lo: u32,
    hi: u32,
    #[comptime(default = 512)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let o = offs.tile([BLOCK], [start]).load();
    let r = rand4x((lo, hi), o);
    for k in unroll(0..4) {
        u.tile([BLOCK], [k, start]).store(r[k]);
    }
}

/// `randint`, `rand` and `randn` of u32 offsets under an i32 seed.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn rand_draws(
    offs: Tensor<u32, 1>,
    ri: TensorMut<u32, 1>,
    ru: TensorMut<f32, 1>,
    rn: TensorMut<f32, 1>,
    seed: i32,
    #[comptime(default = 512)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let o = offs.tile([BLOCK], [start]).load();
    ri.tile([BLOCK], [start]).store(randint(seed, o));
    ru.tile([BLOCK], [start]).store(rand(seed, o));
    rn.tile([BLOCK], [start]).store(randn(seed, o));
}

/// `sin`, `cos`, `tanh`, `erf`, `sigmoid`, `log2` of `x` and `log` of `|x|` into rows 0..7
/// of `y`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn transcendentals(
    x: Tensor<f32, 1>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let v = x.tile([BLOCK], [start]).load();
    y.tile([BLOCK], [0, start]).store(sin(v));
    y.tile([BLOCK], [1, start]).store(cos(v));
    y.tile([BLOCK], [2, start]).store(tanh(v));
    y.tile([BLOCK], [3, start]).store(erf(v));
    y.tile([BLOCK], [4, start]).store(sigmoid(v));
    y.tile([BLOCK], [5, start]).store(log2(v));
    y.tile([BLOCK], [6, start]).store(log(abs(v)));
}

/// The u32 operators, one per row of `y` (see `interp_ops::u32_reference`).
#[kernel(grid = [BLOCK, 1, 1])]
pub fn u32_ops(
    a: Tensor<u32, 1>,
    b: Tensor<u32, 1>,
    y: TensorMut<u32, 2>,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let x = a.tile([BLOCK], [start]).load();
    let z = b.tile([BLOCK], [start]).load();
    let d = z | 1;
    y.tile([BLOCK], [0, start]).store(x & z);
    y.tile([BLOCK], [1, start]).store(x | z);
    y.tile([BLOCK], [2, start]).store(x ^ z);
    y.tile([BLOCK], [3, start]).store(x << z);
    y.tile([BLOCK], [4, start]).store(x >> z);
    y.tile([BLOCK], [5, start]).store(umulhi(x, z));
    y.tile([BLOCK], [6, start]).store(x / d);
    y.tile([BLOCK], [7, start]).store(x % d);
    y.tile([BLOCK], [8, start]).store(min(x, z));
    y.tile([BLOCK], [9, start]).store(max(x, z));
    y.tile([BLOCK], [10, start])
        .store(select(x < z, full::<u32>([BLOCK], 1), 0));
    y.tile([BLOCK], [11, start]).store(!x);
    y.tile([BLOCK], [12, start]).store(x * z);
    y.tile([BLOCK], [13, start]).store(x + z);
    y.tile([BLOCK], [14, start]).store(x - (z >> 3));
}

/// The i32 operators, one per row of `y` (see `interp_ops::i32_reference`).
#[kernel(grid = [BLOCK, 1, 1])]
pub fn i32_ops(
    a: Tensor<i32, 1>,
    b: Tensor<i32, 1>,
    y: TensorMut<i32, 2>,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let x = a.tile([BLOCK], [start]).load();
    let z = b.tile([BLOCK], [start]).load();
    let d = z | 1;
    y.tile([BLOCK], [0, start]).store(x & z);
    y.tile([BLOCK], [1, start]).store(x | z);
    y.tile([BLOCK], [2, start]).store(x ^ z);
    y.tile([BLOCK], [3, start]).store(x << z);
    y.tile([BLOCK], [4, start]).store(x >> z);
    y.tile([BLOCK], [5, start]).store(mulhi(x, z));
    y.tile([BLOCK], [6, start]).store(x / d);
    y.tile([BLOCK], [7, start]).store(x % d);
    y.tile([BLOCK], [8, start]).store(min(x, z));
    y.tile([BLOCK], [9, start]).store(max(x, z));
    y.tile([BLOCK], [10, start]).store(select(x < z, 1, 0));
    y.tile([BLOCK], [11, start]).store(!x);
    y.tile([BLOCK], [12, start]).store(x * z);
    y.tile([BLOCK], [13, start]).store(x >> 3);
    y.tile([BLOCK], [14, start]).store((x << 31) >> 31);
}

/// Conversions and bit casts (see `interp_ops::casts_reference`).
#[kernel(grid = [BLOCK, 1, 1])]
pub fn casts(
    x: Tensor<f32, 1>,
    a: Tensor<u32, 1>,
    yu: TensorMut<u32, 2>,
    yf: TensorMut<f32, 2>,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let v = x.tile([BLOCK], [start]).load();
    let u = a.tile([BLOCK], [start]).load();
    yu.tile([BLOCK], [0, start]).store(v.cast::<u32>());
    yu.tile([BLOCK], [1, start]).store(v.bitcast::<u32>());
    yu.tile([BLOCK], [2, start])
        .store(u.cast::<i32>().cast::<u32>());
    yu.tile([BLOCK], [3, start])
        .store(bitcast::<u32>(v.cast::<i32>()));
    yf.tile([BLOCK], [0, start]).store(u.cast::<f32>());
    yf.tile([BLOCK], [1, start]).store(u.bitcast::<f32>());
    yf.tile([BLOCK], [2, start])
        .store(u.cast::<bf16>().cast::<f32>());
    yf.tile([BLOCK], [3, start])
        .store(v.cast::<bf16>().bitcast::<f16>().cast::<f32>());
}

/// `take` along both dimensions of a register tile and along a vector. Block `b` loads the
/// tile `t = x[bR.., 0..C]` (zeros past `x`) and writes `y0[bK + k, j] = t[i0[bK + k, j],
/// j]` (-1 where the index is outside `0..R`), `y1[bR + i, k] = t[i, i1[bR + i, k]]` (0
/// outside `0..C`) and `yv[bC + c] = v_b[order[bC + c]]` for the bf16 vector tile `v_b =
/// v[bC..]`: any index tile, in-tile gathers through shared memory.
///
/// Grid: `(blocks, 1, 1)`.
#[kernel(num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn takes(
    x: Tensor<f32, 2>,
    i0: Tensor<i32, 2>,
    i1: Tensor<i32, 2>,
    v: Tensor<bf16, 1>,
    order: Tensor<i32, 1>,
    y0: TensorMut<f32, 2>,
    y1: TensorMut<f32, 2>,
    yv: TensorMut<bf16, 1>,
    #[comptime(default = 32)] R: usize,
    #[comptime(default = 64)] C: usize,
    #[comptime(default = 16)] K: usize,
) {
    let b = block_id().x;
    let t = x.tile([R, C], [b * R, 0]).load();
    let rows = i0.tile([K, C], [b * K, 0]).load();
    y0.tile([K, C], [b * K, 0]).store(t.take_or(0, &rows, -1.0));
    let cols = i1.tile([R, K], [b * R, 0]).load();
    y1.tile([R, K], [b * R, 0]).store(t.take(1, &cols));
    let vb = v.tile([C], [b * C]).load();
    let o = order.tile([C], [b * C]).load();
    yv.tile([C], [b * C]).store(vb.take(0, &o));
}

/// Sorts each block's `N` routes by expert, stably, inside the tile (MoE routing within a
/// tile): `rank[i]` counts the routes before route `i` (a smaller key, or an equal key at a
/// smaller index) over an `[N, N]` comparison, its inverse `perm[k]` is the route of rank
/// `k`, and `take` moves route `perm[k]` to place `k`. Past the end of `keys` the key is
/// `i32::MAX`, so those places sort last (and their stores are skipped).
///
/// Grid: `(cdiv(n, N), 1, 1)`.
#[kernel(num_warps = 4)]
pub fn sort_by_key(
    keys: Tensor<i32, 1>,
    vals: Tensor<f32, 1>,
    sorted_keys: TensorMut<i32, 1>,
    sorted_vals: TensorMut<f32, 1>,
    #[comptime(default = 64)] N: usize,
) {
    let b = block_id().x;
    let inside = iota([N], 0) + b * N < keys.dim(0);
    let k = keys.tile([N], [b * N]).load_masked(inside, i32::MAX);
    let v = vals.tile([N], [b * N]).load();
    // Row i, column j: whether route j sorts before route i.
    let (ki, kj) = (k.col(), k.row());
    let (i, j) = (iota([N, N], 0), iota([N, N], 1));
    let before = select(kj < ki, true, select(kj == ki, j < i, false));
    let rank = row_sum(&select(before, 1, 0));
    // Row i, column r: whether route i has rank r; the route of rank r sums down column r.
    let placed = rank.col() == j;
    let perm = col_sum(&select(placed, i, 0));
    sorted_keys.tile([N], [b * N]).store(k.take(0, &perm));
    sorted_vals.tile([N], [b * N]).store(v.take(0, &perm));
}

/// `takes`' inputs for `blocks` blocks of comptime `c`: `x: [m, n]` (`m` rows short of the
/// last block's tile, `n <= C`), indices that reach two past each end of their dimension.
pub fn take_inputs(rng: &mut Rng, c: &TakesComptime, blocks: usize) -> [HostTensor; 5] {
    let (r, cc, k) = (c.R, c.C, c.K);
    let m = blocks * r - r / 2;
    let n = cc - 3;
    let index = |rng: &mut Rng, shape: &[usize], extent: usize| {
        HostTensor::from_fn(shape, DType::I32, |_| {
            rng.uniform(-2.0, extent as f64 + 2.0).floor()
        })
    };
    [
        tensor(rng, &[m, n], DType::F32, Dist::Normal),
        index(rng, &[blocks * k, cc], r),
        index(rng, &[blocks * r, k], cc),
        tensor(rng, &[blocks * cc - 5], DType::Bf16, Dist::Normal),
        index(rng, &[blocks * cc], cc),
    ]
}

/// `takes`' outputs `[y0, y1, yv]` for `inputs`, element by element in f64.
pub fn take_reference(c: &TakesComptime, blocks: usize, inputs: &[HostTensor; 5]) -> [Vec<f64>; 3] {
    let (r, cc, k) = (c.R, c.C, c.K);
    let [x, i0, i1, v, order] = inputs;
    let (m, n) = (x.shape[0], x.shape[1]);
    let (xv, i0v, i1v, vv, ov) = (
        x.to_f64_vec(),
        i0.to_f64_vec(),
        i1.to_f64_vec(),
        v.to_f64_vec(),
        order.to_f64_vec(),
    );
    // Block b's tile of x, zeros past the tensor.
    let t = |b: usize, i: usize, j: usize| {
        let row = b * r + i;
        if row < m && j < n {
            xv[row * n + j]
        } else {
            0.0
        }
    };
    let inside = |ix: f64, extent: usize| (ix >= 0.0 && ix < extent as f64).then_some(ix as usize);
    let mut y0 = vec![0.0; blocks * k * cc];
    let mut y1 = vec![0.0; blocks * r * k];
    let mut yv = vec![0.0; v.shape[0]];
    for b in 0..blocks {
        for kk in 0..k {
            for j in 0..cc {
                let e = (b * k + kk) * cc + j;
                y0[e] = inside(i0v[e], r).map_or(-1.0, |i| t(b, i, j));
            }
        }
        for i in 0..r {
            for kk in 0..k {
                let e = (b * r + i) * k + kk;
                y1[e] = inside(i1v[e], cc).map_or(0.0, |j| t(b, i, j));
            }
        }
        for cix in 0..cc {
            let e = b * cc + cix;
            if e < yv.len() {
                yv[e] = inside(ov[e], cc)
                    .and_then(|j| vv.get(b * cc + j).copied())
                    .unwrap_or(0.0);
            }
        }
    }
    [y0, y1, yv]
}
