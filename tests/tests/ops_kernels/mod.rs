//! Kernels exercising the integer, bit, transcendental and random-number ops, shared by
//! `interp_ops` (interpreter against references), `ops_ptx` (ptxas) and `gpu_ops` (GPU
//! against the interpreter). Every kernel takes any length: loads read 0 past the end and
//! stores skip it.
#![allow(dead_code)]

use kiln::prelude::*;

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
