//! Whole-tile f32 atomic adds from many blocks into overlapping rows (`bulk_add_kernels`)
//! on the GPU: sm_80 code (per-element reductions) and, on Hopper, sm_90a code (bulk
//! reductions from shared memory where the tensor is 16-byte aligned, per-element where it
//! is not; TMA-reduced swizzled boxes where the tile's layout splits into a thread's part
//! and a register's, as an mma accumulator's does), against an f64 reference and the
//! interpreter. Tiles start before row 0 and end past the last row and column, columns are
//! no multiple of 4 (the row tail), the accumulator is a padded view (row stride not its
//! width) or contiguous; a split-K GEMM adds its partial products; fresh random inputs of
//! every distribution. Skips itself without a GPU.

mod bulk_add_kernels;
mod gpu_common;

use std::process::ExitCode;

use bulk_add_kernels::*;
use gpu_common::{Needs, devices, upload_padded};
use kiln_ir::DType;
use kiln_ir::interp::{HostArg, run_def};
use kiln_runtime::KernelArg;
use kiln_tests::check::{Case, assert_close, sum_tolerance, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

fn cdiv(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

fn gpu_overlapping_tile_adds_sum() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        // (rows, cols, repeats, pad): pad 0 is contiguous (aligned when cols is a multiple
        // of 4); otherwise a view whose row stride is cols + pad.
        for (rows, cols, repeats, pad) in [
            (70, 45, 3, 3),
            (300, 257, 2, 0),
            (5, 3, 4, 1),
            (129, 64, 2, 0),
            (64, 200, 1, 8),
        ] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[repeats, rows, cols], DType::F32, dist);
                let init = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Uniform);
                let blocks = (rows + SHIFT).div_ceil(STEP);
                let grid = [blocks as u32, cdiv(cols, C), repeats as u32];
                let dx = dev.upload(&x).expect("upload");
                let da = if pad == 0 {
                    dev.upload(&init).expect("upload")
                } else {
                    upload_padded(&dev, &init, pad)
                };
                dev.launch(
                    &overlapping_adds,
                    &(),
                    grid,
                    &[KernelArg::Tensor(&dx), KernelArg::Tensor(&da)],
                )
                .expect("launch");
                let mut ai = init.clone();
                run_def(
                    &overlapping_adds,
                    &(),
                    grid,
                    &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut ai)],
                )
                .expect("interpret");
                let (xv, iv) = (x.to_f64_vec(), init.to_f64_vec());
                let want: Vec<f64> = (0..rows * cols)
                    .map(|e| {
                        let (r, c) = (e / cols, e % cols);
                        let k = covers(r, R, STEP, SHIFT, blocks) as f64;
                        let sum: f64 = (0..repeats).map(|z| xv[(z * rows + r) * cols + c]).sum();
                        iv[e] + 0.5 * k * sum
                    })
                    .collect();
                let case = Case {
                    kernel: format!("{} overlapping_adds x{repeats} pad {pad}", dev.target()),
                    shape: format!("{rows}x{cols}"),
                    dist,
                    seed: rng.seed(),
                };
                let tol = 4.0 * tolerance(DType::F32);
                assert_close(&case, &da.download().expect("download"), &want, tol);
                assert_close(&case, &ai, &want, tol);
            }
        }
    }
}

fn gpu_overlapping_row_adds_sum() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (n, repeats) in [(1000, 3), (130, 2), (7, 5), (4096, 1)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[repeats, n], DType::F32, dist);
                let init = tensor(&mut rng, &[n], DType::F32, Dist::Uniform);
                let blocks = (n + 4).div_ceil(NSTEP);
                let grid = [blocks as u32, 1, repeats as u32];
                let dx = dev.upload(&x).expect("upload");
                let da = dev.upload(&init).expect("upload");
                dev.launch(
                    &overlapping_row_adds,
                    &(),
                    grid,
                    &[KernelArg::Tensor(&dx), KernelArg::Tensor(&da)],
                )
                .expect("launch");
                let mut ai = init.clone();
                run_def(
                    &overlapping_row_adds,
                    &(),
                    grid,
                    &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut ai)],
                )
                .expect("interpret");
                let (xv, iv) = (x.to_f64_vec(), init.to_f64_vec());
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let k = covers(i, N, NSTEP, 4, blocks) as f64;
                        iv[i] + k * (0..repeats).map(|z| xv[z * n + i]).sum::<f64>()
                    })
                    .collect();
                let case = Case {
                    kernel: format!("{} overlapping_row_adds x{repeats}", dev.target()),
                    shape: format!("{n}"),
                    dist,
                    seed: rng.seed(),
                };
                let tol = 4.0 * tolerance(DType::F32);
                assert_close(&case, &da.download().expect("download"), &want, tol);
                assert_close(&case, &ai, &want, tol);
            }
        }
    }
}

/// Split-K GEMM (`split_k_matmul`): each block adds its partial product, an mma
/// accumulator (on sm_90a a warp-specialised ring's, staged as TMA-reduced boxes), into an
/// accumulator that starts random; M, N and K no multiple of any tile, the last split's
/// blocks past K, several splits summing into every element.
fn gpu_split_k_matmul_adds_partial_products() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (m, n, k, splits) in [(100, 70, 300, 3), (64, 128, 1000, 4), (130, 200, 96, 2)] {
            for dist in Dist::ALL {
                let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
                let init = tensor(&mut rng, &[m, n], DType::F32, Dist::Uniform);
                let grid = [cdiv(m, SM), cdiv(n, SN), splits as u32];
                let (da, db) = (
                    dev.upload(&a).expect("upload"),
                    dev.upload(&b).expect("upload"),
                );
                let dc = dev.upload(&init).expect("upload");
                dev.launch(
                    &split_k_matmul,
                    &(),
                    grid,
                    &[
                        KernelArg::Tensor(&da),
                        KernelArg::Tensor(&db),
                        KernelArg::Tensor(&dc),
                    ],
                )
                .expect("launch");
                let ab = reference::gemm(&a, &b);
                let want: Vec<f64> = init
                    .to_f64_vec()
                    .iter()
                    .zip(ab)
                    .map(|(c, x)| c + x)
                    .collect();
                let case = Case {
                    kernel: format!("{} split_k_matmul x{splits}", dev.target()),
                    shape: format!("{m}x{n}x{k}"),
                    dist,
                    seed: rng.seed(),
                };
                // f32 sums of K products, then `splits` adds.
                let tol = 4.0 * sum_tolerance(k + splits);
                assert_close(&case, &dc.download().expect("download"), &want, tol);
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_overlapping_tile_adds_sum",
            Needs::Gpu,
            gpu_overlapping_tile_adds_sum,
        ),
        (
            "gpu_overlapping_row_adds_sum",
            Needs::Gpu,
            gpu_overlapping_row_adds_sum,
        ),
        (
            "gpu_split_k_matmul_adds_partial_products",
            Needs::Gpu,
            gpu_split_k_matmul_adds_partial_products,
        ),
    ])
}
