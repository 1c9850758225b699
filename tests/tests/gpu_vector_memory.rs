//! The memory-bound kernels whose global accesses are 16-byte vectors (softmax in f32 and
//! bf16, layer norm, RMS norm, vector_add) on the GPU (sm_80 code) against f64 references and
//! the interpreter: tails of one past a power of two (4097) and shorter than a vector, rows
//! padded by an odd count (not 16-byte aligned: the run-time alignment test, rows alternating
//! between aligned and not) and by a multiple of 16 bytes (the aligned specialisation), views
//! starting one element into their allocation, outputs poisoned with NaN. Without a GPU the
//! tests are reported ignored, with the reason.

mod gpu_common;

use std::process::ExitCode;

use gpu_common::{Needs, device, upload_padded};
use kiln_examples::layer_norm::{LayerNormComptime, layer_norm};
use kiln_examples::rms_norm::{RmsNormComptime, rms_norm};
use kiln_examples::rows::{RowConfig, row_config};
use kiln_examples::softmax::{SoftmaxComptime, softmax};
use kiln_examples::vector_add::vector_add;
use kiln_ir::dsl::KernelDef;
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, KernelArg};
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// `(M, N)`: tails past a power of two, a row shorter than one vector, exact tiles, a row
/// longer than the longest kept whole.
const SHAPES: &[(usize, usize)] = &[(5, 4097), (3, 3), (64, 1024), (17, 1000), (3, 16500)];

/// The row kernels' configurations: each dtype at a fixed `(BM, BN)` on four warps (rows
/// longer than `BN` take the two-loop path) and at `row_config`'s choice for the row length.
fn configs() -> [(Option<(usize, usize)>, DType); 4] {
    [
        (Some((4, 512)), DType::F32),
        (Some((4, 512)), DType::Bf16),
        (None, DType::F32),
        (None, DType::Bf16),
    ]
}

/// The comptime values of `configs`' entry `fixed` for rows of `n`.
fn config(fixed: Option<(usize, usize)>, n: usize) -> RowConfig {
    fixed.map_or(row_config(n), |(bm, bn)| RowConfig { bm, bn, nw: 4 })
}

/// Row paddings, in elements: none, odd (rows not 16-byte aligned), 16 bytes' worth of bf16.
const PADS: &[usize] = &[0, 3, 8];

/// A poisoned output tensor on the device.
fn output(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(dtype, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// `host` on the device with its rows `pad` elements apart beyond contiguous (rank 2), or
/// starting one element into its allocation (rank 1, odd `pad`).
fn upload(dev: &Device, host: &HostTensor, pad: usize) -> DeviceTensor {
    if host.shape.len() > 1 {
        return upload_padded(dev, host, pad);
    }
    if pad.is_multiple_of(2) {
        return dev.upload(host).expect("upload");
    }
    let n = host.shape[0];
    let whole = output(dev, host.dtype(), &[n + 1]);
    let view = whole.narrow(0, 1, n).expect("view");
    view.copy_from_host(host).expect("copy");
    view
}

/// Checks a GPU output against the f64 reference (as stored in `dtype`) and the
/// interpreter's output.
fn check(case: &Case, got: &DeviceTensor, want: &[f64], interp: &HostTensor, dtype: DType) {
    let got = got.download().expect("download");
    assert_close(case, &got, &as_stored(want, dtype), tolerance(dtype));
    let vs = Case {
        kernel: format!("{} (GPU vs interpreter)", case.kernel),
        ..case.clone()
    };
    assert_close(&vs, &got, &interp.to_f64_vec(), tolerance(dtype));
}

/// A row mean near 0 is ill-conditioned (its f32 error is relative to the row's magnitude,
/// not its own): the error in units of each row's RMS.
fn check_mean(case: &Case, got: &DeviceTensor, want: &[f64], x: &HostTensor) {
    let got = got.download().expect("download").to_f64_vec();
    assert!(
        !got.iter().any(|v| v.is_nan()),
        "{case}: a mean is unwritten"
    );
    let v = x.to_f64_vec();
    let err = v
        .chunks(x.shape[1])
        .zip(got.iter().zip(want))
        .map(|(row, (g, w))| {
            let ms = row.iter().map(|a| a * a).sum::<f64>() / row.len() as f64;
            (g - w).abs() / if ms > 0.0 { ms.sqrt() } else { 1.0 }
        })
        .fold(0.0, f64::max);
    assert!(
        err <= tolerance(DType::F32),
        "{case}: mean off by {err:.3e} of the row's RMS"
    );
}

fn gpu_softmax_vectors_match_reference() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for (fixed, dtype) in configs() {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let c = SoftmaxComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            for &pad in PADS {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], dtype, dist);
                    let grid = softmax.grid(&c, [m, 1, 1]);
                    let dx = upload(&dev, &x, pad);
                    let y = output(&dev, dtype, &[m, n]);
                    let args = [KernelArg::Tensor(&dx), KernelArg::Tensor(&y)];
                    dev.launch(&softmax, &c, grid, &args).expect("launch");
                    let mut yi = poisoned(&[m, n], dtype);
                    let mut hargs = [HostArg::Tensor(&x), HostArg::TensorMut(&mut yi)];
                    run_def(&softmax, &c, grid, &mut hargs).expect("interpret");
                    let case = Case {
                        kernel: format!("softmax<BM={bm},BN={bn},NW={nw}> {dtype}"),
                        shape: format!("m={m} n={n}, x rows padded by {pad}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(&case, &y, &reference::softmax_rows(&x), &yi, dtype);
                }
            }
        }
    }
}

fn gpu_layer_norm_matches_reference() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    let eps = 1e-5;
    for (fixed, dtype) in configs() {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let c = LayerNormComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            for &pad in PADS {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], dtype, dist);
                    let w = tensor(&mut rng, &[n], dtype, Dist::Normal);
                    let b = tensor(&mut rng, &[n], dtype, Dist::Uniform);
                    let grid = layer_norm.grid(&c, [m, 1, 1]);
                    let (dx, dw, db) = (
                        upload(&dev, &x, pad),
                        upload(&dev, &w, pad),
                        upload(&dev, &b, 0),
                    );
                    let y = output(&dev, dtype, &[m, n]);
                    let (mean, rstd) = (
                        output(&dev, DType::F32, &[m]),
                        output(&dev, DType::F32, &[m]),
                    );
                    let args = [
                        KernelArg::Tensor(&dx),
                        KernelArg::Tensor(&dw),
                        KernelArg::Tensor(&db),
                        KernelArg::Tensor(&y),
                        KernelArg::Tensor(&mean),
                        KernelArg::Tensor(&rstd),
                        KernelArg::F32(eps),
                    ];
                    dev.launch(&layer_norm, &c, grid, &args).expect("launch");
                    let mut yi = poisoned(&[m, n], dtype);
                    let (mut mi, mut ri) = (poisoned(&[m], DType::F32), poisoned(&[m], DType::F32));
                    let mut hargs = [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&w),
                        HostArg::Tensor(&b),
                        HostArg::TensorMut(&mut yi),
                        HostArg::TensorMut(&mut mi),
                        HostArg::TensorMut(&mut ri),
                        HostArg::F32(eps),
                    ];
                    run_def(&layer_norm, &c, grid, &mut hargs).expect("interpret");
                    let case = Case {
                        kernel: format!("layer_norm<BM={bm},BN={bn},NW={nw}> {dtype}"),
                        shape: format!("m={m} n={n}, x rows padded by {pad}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let (want, want_mean, want_rstd) =
                        reference::layer_norm_rows(&x, &w, &b, f64::from(eps));
                    check(&case, &y, &want, &yi, dtype);
                    check(&case, &rstd, &want_rstd, &ri, DType::F32);
                    check_mean(&case, &mean, &want_mean, &x);
                }
            }
        }
    }
}

fn gpu_rms_norm_matches_reference() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    let eps = 1e-6;
    for (fixed, dtype) in configs() {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let c = RmsNormComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            for &pad in PADS {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], dtype, dist);
                    let w = tensor(&mut rng, &[n], dtype, Dist::Normal);
                    let grid = rms_norm.grid(&c, [m, 1, 1]);
                    let (dx, dw) = (upload(&dev, &x, pad), upload(&dev, &w, pad));
                    let y = output(&dev, dtype, &[m, n]);
                    let rstd = output(&dev, DType::F32, &[m]);
                    let args = [
                        KernelArg::Tensor(&dx),
                        KernelArg::Tensor(&dw),
                        KernelArg::Tensor(&y),
                        KernelArg::Tensor(&rstd),
                        KernelArg::F32(eps),
                    ];
                    dev.launch(&rms_norm, &c, grid, &args).expect("launch");
                    let mut yi = poisoned(&[m, n], dtype);
                    let mut ri = poisoned(&[m], DType::F32);
                    let mut hargs = [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&w),
                        HostArg::TensorMut(&mut yi),
                        HostArg::TensorMut(&mut ri),
                        HostArg::F32(eps),
                    ];
                    run_def(&rms_norm, &c, grid, &mut hargs).expect("interpret");
                    let case = Case {
                        kernel: format!("rms_norm<BM={bm},BN={bn},NW={nw}> {dtype}"),
                        shape: format!("m={m} n={n}, x rows padded by {pad}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let (want, want_rstd) = reference::rms_norm_rows(&x, &w, f64::from(eps));
                    check(&case, &y, &want, &yi, dtype);
                    check(&case, &rstd, &want_rstd, &ri, DType::F32);
                }
            }
        }
    }
}

fn gpu_vector_add_tails_and_offset_views() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for n in [1, 3, 4097, 1027] {
        // Offset views (odd) start 4 bytes into their allocations.
        for pad in [0, 1] {
            for dist in Dist::ALL {
                let a = tensor(&mut rng, &[n], DType::F32, dist);
                let b = tensor(&mut rng, &[n], DType::F32, dist);
                let (da, db) = (upload(&dev, &a, pad), upload(&dev, &b, pad));
                let c = output(&dev, DType::F32, &[n]);
                let grid = [n.div_ceil(1024) as u32, 1, 1];
                vector_add.launch(&dev, grid, &da, &db, &c).expect("launch");
                let case = Case {
                    kernel: "vector_add".into(),
                    shape: format!("n={n}, inputs offset by {pad}"),
                    dist,
                    seed: rng.seed(),
                };
                let got = c.download().expect("download");
                assert_close(
                    &case,
                    &got,
                    &reference::vector_add(&a, &b),
                    tolerance(DType::F32),
                );
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_softmax_vectors_match_reference",
            Needs::Gpu,
            gpu_softmax_vectors_match_reference,
        ),
        (
            "gpu_layer_norm_matches_reference",
            Needs::Gpu,
            gpu_layer_norm_matches_reference,
        ),
        (
            "gpu_rms_norm_matches_reference",
            Needs::Gpu,
            gpu_rms_norm_matches_reference,
        ),
        (
            "gpu_vector_add_tails_and_offset_views",
            Needs::Gpu,
            gpu_vector_add_tails_and_offset_views,
        ),
    ])
}
