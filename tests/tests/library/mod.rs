//! Inputs and cases of the kernel library's tests (cross-entropy, softmax's backward, layer
//! norm's and RMS norm's backward), shared by the interpreter test (`interp_library`) and the
//! GPU test (`gpu_library`).

#![allow(dead_code)]

use kiln_ir::{DType, HostTensor};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// Class indices for `m` rows of `v` classes: uniform, with every seventh row ignored
/// (PyTorch's `ignore_index = -100`).
pub fn targets(rng: &mut Rng, m: usize, v: usize) -> HostTensor {
    HostTensor::from_fn(&[m], DType::I32, |r| {
        if r % 7 == 3 {
            -100.0
        } else {
            rng.uniform(0.0, v as f64).floor().min(v as f64 - 1.0)
        }
    })
}

/// An f32 tensor holding `values` (rounded to f32, as the kernel reads them).
pub fn f32_tensor(shape: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_fn(shape, DType::F32, |i| values[i])
}

/// The `(x, w, mean, rstd, dy)` of a norm backward case: the statistics computed in f64
/// from the stored `x` and passed as f32.
pub fn norm_inputs(
    rng: &mut Rng,
    m: usize,
    n: usize,
    dtype: DType,
    dist: Dist,
    rms: bool,
) -> [HostTensor; 5] {
    let x = tensor(rng, &[m, n], dtype, dist);
    let w = tensor(rng, &[n], dtype, Dist::Normal);
    let dy = tensor(rng, &[m, n], dtype, Dist::Normal);
    let (mean, rstd) = kiln_tests::reference::norm_stats(&x, 1e-5, rms);
    [x, w, f32_tensor(&[m], &mean), f32_tensor(&[m], &rstd), dy]
}

/// Shapes `(m, n)` the interpreter checks the library kernels on: none a multiple of the
/// tiles, a row longer than the widest tile.
pub const SHAPES: [(usize, usize); 3] = [(1, 1), (5, 1000), (9, 4100)];

/// Shapes the GPU checks them on besides [`SHAPES`]: more rows than blocks of rows, and a
/// multiple of the tiles.
pub const GPU_SHAPES: [(usize, usize); 3] = [(33, 4097), (64, 1024), (1000, 2050)];

/// `(batch, seqlen, heads, offset)` of the rotary checks: heads no multiple of the head
/// blocks, a position offset.
pub const ROTARY_SHAPES: [(usize, usize, usize, usize); 3] =
    [(1, 1, 1, 0), (2, 7, 9, 0), (1, 5, 16, 3)];

/// The `cos, sin: [positions, r / 2]` tables of rotary dim `r` (base 10000), as `dtype`.
pub fn rotary_tables(positions: usize, r: usize, dtype: DType) -> (HostTensor, HostTensor) {
    let half = r / 2;
    let angle = |i: usize| {
        let (t, k) = (i / half, i % half);
        t as f64 * 10000f64.powf(-2.0 * k as f64 / r as f64)
    };
    (
        HostTensor::from_fn(&[positions, half], dtype, |i| angle(i).cos()),
        HostTensor::from_fn(&[positions, half], dtype, |i| angle(i).sin()),
    )
}
